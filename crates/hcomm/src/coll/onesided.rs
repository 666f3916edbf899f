//! One-sided collectives for communicators whose ranks all share this host.
//!
//! Every member maps a small segment of every other member, `hcomm-<job>-<rank>-c<comm id>`,
//! created at the communicator's first one-sided call, laid out as [`Segment`]:
//!
//! ```text
//! 0    seq    (AtomicU64): number of the last one-sided call this rank started
//! 64   failed (AtomicU64): last call this rank abandoned after starting it
//! 128  ready  (AtomicU64): last call whose reduced slice this rank has finished
//! 256  done   (AtomicU64): last call whose peers' buffers this rank has finished reading
//! 384  header of slot 0 | 448 header of slot 1: signature, length, buffer addresses
//! 512  data of slot 0 (SLOT bytes) | data of slot 1 (SLOT bytes)
//! then tiny slot 0 | tiny slot 1: one cache line each (call number, signature, length and
//!      up to 32 bytes of contribution)
//! ```
//!
//! Call `j` (numbered per communicator, the same on every rank) uses slot `j % 2`. A rank
//! writes the slot's header (and, for small calls, its whole contribution into the data),
//! then publishes `seq = j` with release ordering and rings its peers' doorbells; peers wait
//! for `seq >= j` with acquire ordering, check the signature (a mismatch fails every rank of
//! the call), and read what they need in place.
//!
//! * **Tiny** (every contribution up to 32 bytes): the contribution travels in one cache line
//!   with the call number (stored last), so a peer sees both with one transfer.
//! * **Inline** (every rank's contribution fits a slot): each rank computes its result
//!   straight from the peers' slots, reductions folded in rank order, so every rank gets the
//!   same bits as the rank-order reference. One round of cache-line transfers, no message.
//!   Contributions beyond 1 KiB whose buffers all lie in pools, and all-gather and broadcast
//!   contributions beyond 8 KiB, go the large way instead (decided from the published
//!   headers, alike on every rank): slots rewritten by every call cross between cores on
//!   every read, buffers read in place much less.
//! * **Large** all-reduce: each rank reduces its slice straight out of the peers' buffers
//!   (mapped pool blocks, else cross-memory attach in chunks that stay in cache), publishes
//!   `ready`, then copies the
//!   other slices from the peers' results; large all-gather and broadcast read the sources
//!   directly. When every rank's receive buffer lies in a pool, results are pushed instead:
//!   each rank writes its reduced slice (all-reduce) or its block (all-gather) into every
//!   rank's receive buffer, and a broadcast's root writes the last n-th of the buffer into
//!   the non-roots while they copy the rest; nobody copies results out of a peer afterwards.
//!   Each rank then publishes `done` and waits for its peers' before returning, so no buffer
//!   is released while a peer still reads or writes it.
//!
//! A rank overwrites slot `j % 2` only once every peer has started call `j - 1`, which it does
//! only after finishing call `j - 2`, the slot's previous user (a rank that saw its peers
//! start `j - 1` during that call does not look again). Waits spin (when the host has a core
//! per rank), yield, then sleep on the rank's doorbell futex; every wait is bounded by
//! `HCOMM_TIMEOUT` and checks that the peer is still alive and has not abandoned the call.

use rustc_hash::FxHashMap as HashMap;
use std::cell::OnceCell;
use std::mem::offset_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::coll::{algos, CollKind, Group, Shape};
use crate::config::Backoff;
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::observe::stall::StallWatch;
use crate::p2p::lease::Lease;
use crate::p2p::wait::{Pause, Waiting};
use crate::p2p::Engine;
use crate::reduce;
use crate::sync::lock;
use crate::transport::shm::cma;
use crate::transport::shm::pool::ShmPool;
use crate::transport::shm::segment::{segment_name, ShmSegment};

/// Bytes of each slot's data: the largest contribution that goes inline.
pub(crate) const SLOT: usize = 32 << 10;
/// Largest contribution of a tiny call: it travels in one cache line with its call number.
const TINY_MAX: usize = 32;
/// Calls whose buffers all lie in pools read larger contributions than this in place, even
/// when they fit a slot.
const DIRECT_FROM: usize = 1024;
/// All-gathers and broadcasts read larger contributions than this in place even from heap
/// buffers, with cross-memory attach.
const DIRECT_CMA_FROM: usize = 8 << 10;
/// Bytes reduced at a time by the large all-reduce (they stay in the core's cache).
const CHUNK: usize = 128 << 10;
/// Calls on at least this many bytes write their results with non-temporal stores: their
/// buffers do not fit the caches, and the stores then skip reading the destination first.
const STREAM_FROM: usize = 64 << 20;

/// What a rank tells its peers about one call, in the slot's header.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Header {
    sig: [u64; 2],
    /// Bytes of the contribution.
    len: u64,
    /// Address of the contribution in the rank's memory.
    input: u64,
    /// Address of the receive buffer in the rank's memory.
    output: u64,
    /// Where the contribution lies in the rank's shared-memory pool (see [`pool_loc`]).
    input_loc: u64,
    /// Where the receive buffer lies in the rank's shared-memory pool.
    output_loc: u64,
}

/// A pool location in a header: `(block + 1) << 40 | offset`, 0 for heap memory.
fn pool_loc(pool: Option<&ShmPool>, ptr: *const u8, len: usize) -> u64 {
    pool.and_then(|p| p.locate(ptr, len))
        .filter(|&(block, offset)| block < 1 << 23 && offset < 1 << 40)
        .map_or(0, |(block, offset)| {
            ((block as u64 + 1) << 40) | offset as u64
        })
}

const _: () = assert!(size_of::<Header>() <= 64);

/// A tiny call's whole slot: one cache line, so that a peer sees the call number and the data
/// with a single transfer.
#[repr(C, align(64))]
struct Tiny {
    /// The call; stored last, with release ordering.
    seq: AtomicU64,
    sig: [u64; 2],
    len: u64,
    data: [u8; TINY_MAX],
}

const _: () = assert!(size_of::<Tiny>() == 64);

/// A counter on a cache line of its own.
#[repr(C, align(64))]
struct Counter(AtomicU64);

/// A slot's header on a cache line of its own.
#[repr(C, align(64))]
struct HeaderLine(Header);

/// A rank's segment, which every member maps (see the module docs). Never referenced as a
/// whole: the peers write parts of it meanwhile; its fields are reached through pointers.
#[repr(C)]
struct Segment {
    /// Number of the last one-sided call this rank started.
    seq: Counter,
    /// Last call this rank abandoned after publishing it (its peers must not wait for it).
    failed: Counter,
    /// Last call whose reduced slice this rank has finished.
    ready: Counter,
    /// Unused: keeps `done` a pair of lines apart from `ready`, at the offsets the calls were
    /// tuned with.
    _gap_ready: Counter,
    /// Last call whose peers' buffers this rank has finished reading.
    done: Counter,
    /// Unused: keeps the headers at the offsets the calls were tuned with.
    _gap_done: Counter,
    /// Each slot's header: signature, length, buffer addresses.
    headers: [HeaderLine; 2],
    /// Each slot's data (inline contributions).
    data: [[u8; SLOT]; 2],
    /// The tiny slots, one cache line each.
    tiny: [Tiny; 2],
}

const SEG_LEN: usize = size_of::<Segment>();
const _: () = {
    assert!(offset_of!(Segment, done) == 256);
    assert!(offset_of!(Segment, headers) == 384);
    assert!(offset_of!(Segment, data) == 512);
    assert!(SEG_LEN == 512 + 2 * SLOT + 2 * 64);
};

/// The counters of a segment.
#[derive(Debug, Clone, Copy)]
enum Ctr {
    /// [`Segment::seq`].
    Seq,
    /// [`Segment::failed`].
    Failed,
    /// [`Segment::ready`].
    Ready,
    /// [`Segment::done`].
    Done,
}

/// The call counter of a communicator and what this rank knows of its peers.
struct Calls {
    /// Calls this rank started.
    last: u64,
    /// The latest call each peer is known to have started.
    known: Vec<u64>,
}

/// The one-sided state of a communicator.
pub(crate) struct OneSided {
    me: usize,
    /// World rank of each member.
    world: Vec<usize>,
    /// Process id of each member.
    pids: Vec<u32>,
    /// Every member's segment, this rank's included, by rank.
    segs: Vec<ShmSegment>,
    /// Whether waiters may spin (a core per local rank).
    spin: bool,
    /// Whether cross-memory attach reaches every peer.
    cma: bool,
    /// Calls so far; held for the length of a call.
    calls: Mutex<Calls>,
    /// The job id of the segment names.
    job: String,
    /// Bytes of a pool block (the same on every rank).
    block_size: usize,
    /// Ranks of the world on this host: the processes that map each pool block.
    local_ranks: u32,
    /// The peers' pool blocks mapped so far, by (rank, block); `None`: it cannot be mapped.
    blocks: Mutex<HashMap<(usize, usize), Option<ShmSegment>>>,
}

/// Pointers and lengths of one call's buffers.
struct Buffers {
    /// The send buffer (null when there is none or the call is in place).
    send: *const u8,
    /// The receive buffer and its length.
    recv: *mut u8,
    recv_len: usize,
}

impl OneSided {
    /// Sets up the one-sided state of `comm`: collective over its members. `None` when
    /// they are not all on this host with shared memory, or when a segment could not be made
    /// on some rank (the communicator then uses its message-based algorithms).
    pub(crate) fn create(comm: &dyn Group) -> Result<Option<OneSided>> {
        let engine = comm.engine();
        let n = comm.size();
        let me = comm.rank();
        let members = comm.members();
        let all_local = (0..n).all(|r| r == me || engine.is_shm_peer(members[r]));
        let Some(job) = engine.shm_job_id().filter(|_| all_local && n > 1) else {
            return Ok(None);
        };
        let name_of =
            |r: usize| segment_name(job, members[r] as u32, &format!("c{:016x}", comm.id()));
        let own = name_of(me).and_then(|name| ShmSegment::create(&name, SEG_LEN));
        if let Err(e) = &own {
            tracing::info!(
                "one-sided collectives off for communicator {:#x}: {e}",
                comm.id()
            );
        }
        if !agree(comm, own.is_ok())? {
            if let Ok(seg) = own {
                let _ = ShmSegment::unlink(seg.name());
            }
            return Ok(None);
        }
        let own = own?;
        let mut segs = Vec::with_capacity(n);
        let mut pids = Vec::with_capacity(n);
        let mut failed = None;
        let mut cma = true;
        for r in 0..n {
            if r == me {
                pids.push(std::process::id());
                continue;
            }
            let seg = name_of(r).and_then(|name| ShmSegment::open(&name, SEG_LEN));
            match (seg, engine.shm_peer_pid(comm.members()[r])) {
                (Ok(seg), Some((pid, reach))) => {
                    let _ = seg.unlink_if_last(n as u32);
                    segs.push(seg);
                    pids.push(pid);
                    cma &= reach;
                }
                (Err(e), _) => failed = Some(e),
                (_, None) => failed = Some(Error::Internal(format!("no link to rank {r}"))),
            }
        }
        let ok = agree(comm, failed.is_none())?;
        let _ = ShmSegment::unlink(own.name());
        if !ok {
            if let Some(e) = failed {
                tracing::info!(
                    "one-sided collectives off for communicator {:#x}: {e}",
                    comm.id()
                );
            }
            return Ok(None);
        }
        segs.insert(me, own);
        Ok(Some(OneSided {
            me,
            world: members.to_vec(),
            pids,
            segs,
            spin: comm.spin(),
            cma,
            calls: Mutex::new(Calls {
                last: 0,
                known: vec![0; n],
            }),
            job: job.to_owned(),
            block_size: comm.pool().map_or(0, ShmPool::block_size),
            local_ranks: engine.shm_peer_count() as u32 + 1,
            blocks: Mutex::new(HashMap::default()),
        }))
    }

    /// Whether a call of `shape` runs one-sided: inline when every contribution fits a slot;
    /// otherwise only large all-reduce, all-gather and broadcast, with cross-memory attach.
    pub(crate) fn fits(&self, shape: &Shape) -> bool {
        if shape.v.is_some() || shape.size != self.segs.len() {
            return false;
        }
        max_contribution(shape) <= SLOT
            || (self.cma
                && matches!(
                    shape.kind,
                    CollKind::AllReduce | CollKind::AllGather | CollKind::Broadcast
                ))
    }

    /// Runs call `tag` of `shape` with signature `sig`, from `send` (`None` in place and for
    /// calls without one) into `recv`, both checked against `shape`.
    pub(crate) fn run(
        &self,
        comm: &dyn Group,
        shape: &Shape,
        tag: u32,
        sig: [u64; 2],
        send: Option<&Lease<'_>>,
        recv: &mut Lease<'_>,
    ) -> Result<()> {
        let bufs = Buffers {
            send: send.map_or(std::ptr::null(), Lease::as_ptr),
            recv_len: recv.len(),
            recv: recv.as_mut_ptr()?,
        };
        // SAFETY: both leases are borrowed for this whole call, so their bytes stay valid
        // (`recv` writable) and unused by anything else until it returns; the caller checked
        // them against `shape`.
        unsafe { self.run_on(comm, shape, tag, sig, &bufs) }
    }

    /// [`OneSided::run`] on the leases' addresses.
    ///
    /// # Safety
    /// The buffers must be valid (send for reads unless null, recv for reads and writes and
    /// otherwise unused) for the whole call, holding what `shape` says.
    unsafe fn run_on(
        &self,
        comm: &dyn Group,
        shape: &Shape,
        tag: u32,
        sig: [u64; 2],
        bufs: &Buffers,
    ) -> Result<()> {
        let mut calls = lock(&self.calls);
        let j = calls.last + 1;
        calls.last = j;
        let engine = comm.engine();
        let waiter = Waiter {
            os: self,
            engine,
            coll_id: comm.coll_id(),
            timeout: comm.timeout(),
            tag,
            call: j,
            sig,
            deadline: OnceCell::new(),
        };
        // The call is registered with the engine (for messages of a peer that runs it with
        // another algorithm) only once it has to wait (`Waiter::wait_on`); an earlier call's
        // mismatch found after it returned is reported now.
        engine.late_error(waiter.coll_id)?;
        let n = self.segs.len();
        // Slot j % 2 was last used by call j - 2: every peer has finished it once it started
        // call j - 1 (which this rank usually saw during call j - 1).
        for p in (0..n).filter(|&p| p != self.me) {
            if calls.known[p] < j - 1 {
                waiter.wait(p, Ctr::Seq, j - 1)?;
            }
        }
        let (input, len) = contribution(shape, self.me, bufs);
        let slot = (j % 2) as usize;
        if max_contribution(shape) <= TINY_MAX {
            // SAFETY: forwarded from the caller.
            return unsafe {
                self.tiny(
                    &waiter,
                    shape,
                    sig,
                    (j, slot),
                    (input, len),
                    bufs,
                    &mut calls.known,
                )
            };
        }
        let inline = max_contribution(shape) <= SLOT;
        let pool = comm.pool();
        let header = Header {
            sig,
            len: len as u64,
            input: input as u64,
            output: bufs.recv as u64,
            input_loc: pool_loc(pool, input, len),
            output_loc: pool_loc(pool, bufs.recv, bufs.recv_len),
        };
        // SAFETY: the header and data of slot `slot` are this rank's to write (no peer reads
        // them before seq says j); the contribution is `len` readable bytes (the caller's
        // contract), at most SLOT when inline.
        unsafe {
            self.header_ptr(self.me, slot).write(header);
            if inline && len > 0 {
                self.data_ptr(self.me, slot)
                    .copy_from_nonoverlapping(input, len);
            }
        }
        self.publish(engine, Ctr::Seq, j);
        // SAFETY: forwarded from the caller.
        let result = unsafe {
            self.complete(
                &waiter,
                shape,
                sig,
                (j, slot),
                inline,
                bufs,
                &mut calls.known,
            )
        };
        if result.is_err() {
            // Peers may wait for this rank's part of the call: tell them it will not come.
            self.publish(engine, Ctr::Failed, j);
        }
        result
    }

    /// A call whose every contribution fits a cache line: it goes with the call number in
    /// one line of the tiny slot, and each rank computes its result from the peers' lines.
    ///
    /// # Safety
    /// As for [`OneSided::run`]; `input` is this rank's contribution.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tiny(
        &self,
        waiter: &Waiter<'_>,
        shape: &Shape,
        sig: [u64; 2],
        (j, slot): (u64, usize),
        input: (*const u8, usize),
        bufs: &Buffers,
        known: &mut [u64],
    ) -> Result<()> {
        let mine = self.tiny_ptr(self.me, slot);
        // SAFETY: the line is this rank's to write until it publishes `seq` (no peer reads it
        // before); the contribution is `input.1 <= TINY_MAX` readable bytes.
        unsafe {
            std::ptr::addr_of_mut!((*mine).sig).write(sig);
            std::ptr::addr_of_mut!((*mine).len).write(input.1 as u64);
            std::ptr::addr_of_mut!((*mine).data)
                .cast::<u8>()
                .copy_from_nonoverlapping(input.0, input.1);
            (*mine).seq.store(j, Ordering::Release);
        }
        // The call counter too (after the line, which is what the peers watch now): a later
        // call's peers may not have seen this one.
        self.counter(self.me, Ctr::Seq).store(j, Ordering::Release);
        // The peers' doorbells ring after the waits below: ringing fences, which would hold
        // this rank until its line reached the peers' caches, and a peer asleep on this call
        // has published its own line already, so the waits end without it. (The last rank to
        // publish finds every line there and rings everyone.)
        for p in (0..self.segs.len()).filter(|&p| p != self.me) {
            // SAFETY: the line lies in the peer's mapped segment; `seq` is an atomic.
            let seq = unsafe { &(*self.tiny_ptr(p, slot)).seq };
            waiter.wait_on(p, seq, j)?;
            known[p] = j;
            // SAFETY: the peer published call j in this line (acquire above) and does not
            // rewrite it before this rank starts call j + 1.
            let (theirs, len) = unsafe {
                let line = self.tiny_ptr(p, slot);
                (
                    std::ptr::addr_of!((*line).sig).read(),
                    std::ptr::addr_of!((*line).len).read(),
                )
            };
            check_peer_call(shape, sig, p, theirs, len)?;
        }
        for p in (0..self.segs.len()).filter(|&p| p != self.me) {
            waiter.engine.ring_peer(self.world[p]);
        }
        // This rank's own contribution comes from its buffer, which stays in its cache, rather
        // than from its line, which the peers are fetching; not when it lies in the receive
        // buffer (in place).
        let own = (!bufs.send.is_null() && input.0 == bufs.send).then_some(input.0);
        // SAFETY: every line holds its rank's contribution (checked above), and so does `own`,
        // a buffer apart from the receive buffer; forwarded from the caller for the buffers.
        unsafe {
            self.compute(shape, bufs, |p| match own {
                Some(own) if p == self.me => own,
                _ => std::ptr::addr_of!((*self.tiny_ptr(p, slot)).data).cast::<u8>(),
            })
        }
    }

    fn tiny_ptr(&self, rank: usize, slot: usize) -> *mut Tiny {
        self.field(rank, offset_of!(Segment, tiny) + size_of::<Tiny>() * slot)
    }

    /// The field at `offset` of rank `rank`'s segment.
    fn field<T>(&self, rank: usize, offset: usize) -> *mut T {
        self.segs[rank].as_ptr().wrapping_add(offset).cast()
    }

    /// The rest of call `j` once this rank published it: check the peers' signatures, then
    /// compute the result.
    ///
    /// # Safety
    /// As for [`OneSided::run`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn complete(
        &self,
        waiter: &Waiter<'_>,
        shape: &Shape,
        sig: [u64; 2],
        (j, slot): (u64, usize),
        inline: bool,
        bufs: &Buffers,
        known: &mut [u64],
    ) -> Result<()> {
        let n = self.segs.len();
        for p in (0..n).filter(|&p| p != self.me) {
            waiter.wait(p, Ctr::Seq, j)?;
            known[p] = j;
        }
        // Every rank checks every signature, so a mismatch fails every rank of the call.
        for p in (0..n).filter(|&p| p != self.me) {
            // SAFETY: the peer published call j, so its header is written, and it is not
            // rewritten before this rank starts call j + 1.
            let theirs = unsafe { self.header_ptr(p, slot).read() };
            check_peer_call(shape, sig, p, theirs.sig, theirs.len)?;
        }
        // Contributions beyond a kilobyte in every rank's pool are read in place rather than
        // through the slots, which every call rewrites (so every read of them crosses between
        // cores): several times faster from 2 KiB on. So are all-gather and broadcast
        // contributions beyond 8 KiB on the heap, with cross-memory attach. Every rank sees the
        // same headers, so all decide alike.
        let in_pools = || {
            (0..n).all(|p| {
                // SAFETY: as above: every peer's header of this call is published.
                let h = unsafe { self.header_ptr(p, slot).read() };
                h.input_loc != 0 && h.output_loc != 0
            })
        };
        let most = max_contribution(shape);
        let direct = self.cma
            && match shape.kind {
                CollKind::AllReduce => most > DIRECT_FROM && in_pools(),
                CollKind::AllGather | CollKind::Broadcast => {
                    most > DIRECT_CMA_FROM || (most > DIRECT_FROM && in_pools())
                }
                _ => false,
            };
        if inline && !direct {
            // SAFETY: forwarded from the caller; the peers' slots hold call j.
            unsafe { self.inline(shape, slot, bufs) }
        } else {
            // SAFETY: forwarded from the caller.
            unsafe { self.large(waiter, shape, j, slot, bufs) }
        }
    }

    /// Computes this rank's result of an inline call from the slots.
    ///
    /// # Safety
    /// As for [`OneSided::run`], with every peer's slot `slot` published for this call.
    unsafe fn inline(&self, shape: &Shape, slot: usize, bufs: &Buffers) -> Result<()> {
        // SAFETY: forwarded from the caller: every slot holds its rank's contribution.
        unsafe { self.compute(shape, bufs, |p| self.data_ptr(p, slot).cast_const()) }
    }

    /// This rank's result from every rank's contribution, at `at(rank)`.
    ///
    /// # Safety
    /// `at(p)` must point to rank `p`'s contribution of `contribution_len(shape, p)` bytes,
    /// not changing during the call; the buffers as for [`OneSided::run`].
    unsafe fn compute(
        &self,
        shape: &Shape,
        bufs: &Buffers,
        at: impl Fn(usize) -> *const u8,
    ) -> Result<()> {
        let n = self.segs.len();
        let me = self.me;
        let e = shape.elem();
        let block = shape.count * e;
        // SAFETY: the caller's promise on `at`.
        let c = |p: usize| unsafe { std::slice::from_raw_parts(at(p), contribution_len(shape, p)) };
        // SAFETY: the caller's receive buffer, valid for `recv_len` bytes for this call and
        // used by nothing else.
        let out = unsafe { std::slice::from_raw_parts_mut(bufs.recv, bufs.recv_len) };
        let fold = |dst: &mut [u8], at: usize| -> Result<()> {
            dst.copy_from_slice(&c(0)[at..at + dst.len()]);
            for p in 1..n {
                reduce::reduce_into(shape.dtype, shape.op, dst, &c(p)[at..at + dst.len()])?;
            }
            if shape.op == ReduceOp::Avg {
                reduce::finish_avg(shape.dtype, dst, n)?;
            }
            Ok(())
        };
        match shape.kind {
            CollKind::AllReduce => fold(&mut out[..block], 0)?,
            CollKind::Reduce if me == shape.root => fold(&mut out[..block], 0)?,
            CollKind::ReduceScatter => {
                let at = if shape.in_place { me * block } else { 0 };
                fold(&mut out[at..at + block], me * block)?;
            }
            CollKind::Broadcast if me != shape.root => out[..block].copy_from_slice(c(shape.root)),
            CollKind::AllGather => {
                for p in 0..n {
                    out[p * block..(p + 1) * block].copy_from_slice(c(p));
                }
            }
            CollKind::Gather if me == shape.root => {
                for p in 0..n {
                    out[p * block..(p + 1) * block].copy_from_slice(c(p));
                }
            }
            CollKind::Scatter if !(me == shape.root && shape.in_place) => {
                out[..block].copy_from_slice(&c(shape.root)[me * block..(me + 1) * block]);
            }
            CollKind::AllToAll => {
                for p in 0..n {
                    out[p * block..(p + 1) * block]
                        .copy_from_slice(&c(p)[me * block..(me + 1) * block]);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The large all-reduce, all-gather and broadcast: data read straight from the peers'
    /// buffers with cross-memory attach.
    ///
    /// # Safety
    /// As for [`OneSided::run`].
    unsafe fn large(
        &self,
        waiter: &Waiter<'_>,
        shape: &Shape,
        j: u64,
        slot: usize,
        bufs: &Buffers,
    ) -> Result<()> {
        let n = self.segs.len();
        let me = self.me;
        let peers = || (0..n).filter(move |&p| p != me);
        // SAFETY: every peer's header of this slot is published for call j.
        let hdr = |p: usize| unsafe { self.header_ptr(p, slot).read() };
        // SAFETY: the caller's receive buffer, valid for `recv_len` bytes for this call.
        let out = unsafe { std::slice::from_raw_parts_mut(bufs.recv, bufs.recv_len) };
        let block = shape.count * shape.elem();
        let stream = block >= STREAM_FROM;
        let put = |dst: &mut [u8], src: &[u8]| -> Result<()> {
            if stream {
                reduce::copy_streaming(dst, src)
            } else {
                dst.copy_from_slice(src);
                Ok(())
            }
        };
        // Every receive buffer in a pool: each rank writes its results into its peers'
        // receive buffers itself (through their mapped blocks, else cross-memory attach), so
        // nobody copies them out of the peers' memory afterwards. Every rank sees the same
        // headers, so all decide alike.
        let push = (0..n).all(|p| hdr(p).output_loc != 0);
        // Writes `src`, this rank's bytes at `pos` of the result, into peer `p`'s receive
        // buffer.
        let deliver = |p: usize, pos: usize, src: &[u8]| -> Result<()> {
            let h = hdr(p);
            match self.peer_mem(p, h.output_loc, pos, src.len()) {
                Some(dst) => {
                    // SAFETY: `peer_mem` checked that the bytes lie in the peer's mapped pool
                    // block (mapped writable, and staying mapped); the peer reserved its
                    // receive buffer for this call, in which only this rank writes these bytes.
                    let dst = unsafe { std::slice::from_raw_parts_mut(dst.cast_mut(), src.len()) };
                    put(dst, src)
                }
                // SAFETY: the peer published its receive buffer for this call, in which only
                // this rank writes these bytes, and keeps it until this rank publishes `done`.
                None => unsafe { cma::write_remote(self.pids[p], h.output as usize + pos, src) },
            }
            .map_err(|e| waiter.read_failed(p, e))
        };
        // Writes `src`, this rank's bytes at `pos` of the result, into every peer's receive
        // buffer, a cache-sized chunk to all peers at a time.
        let fan_out = |pos: usize, src: &[u8]| -> Result<()> {
            for (i, chunk) in src.chunks(CHUNK).enumerate() {
                for p in peers() {
                    deliver(p, pos + i * CHUNK, chunk)?;
                }
            }
            Ok(())
        };
        match shape.kind {
            CollKind::AllReduce => {
                let segs = algos::segments(shape.count, n, shape.elem());
                let (off, len) = segs[me];
                let (input, _) = contribution(shape, me, bufs);
                // Staging for operands that are not readable in place, made on first need.
                let (mut acc, mut tmp) = (Vec::new(), Vec::new());
                let mut at = 0;
                while at < len {
                    let m = CHUNK.min(len - at);
                    let pos = off + at;
                    // Every operand readable in place (this rank's own input apart from its
                    // receive buffer, the peers' in mapped pool blocks), and a result that
                    // stays in the caches: reduce straight into the receive buffer.
                    let in_place = input == bufs.recv.cast_const();
                    let operands: Option<Vec<&[u8]>> = (!in_place)
                        .then(|| {
                            (0..n)
                                .map(|p| {
                                    if p == me {
                                        // SAFETY: not in place, so the contribution is a
                                        // separate buffer of `block` readable bytes.
                                        Some(unsafe {
                                            std::slice::from_raw_parts(input.add(pos), m)
                                        })
                                    } else {
                                        let h = hdr(p);
                                        self.peer_mem(p, h.input_loc, pos, m).map(|src| {
                                            // SAFETY: `peer_mem` checked that the bytes lie in
                                            // the peer's mapped pool block, which stays mapped.
                                            unsafe { std::slice::from_raw_parts(src, m) }
                                        })
                                    }
                                })
                                .collect()
                        })
                        .flatten();
                    if let Some(ops) = operands {
                        let fold = |dst: &mut [u8]| -> Result<()> {
                            if n == 1 {
                                dst.copy_from_slice(ops[0]);
                            } else {
                                reduce::reduce_to(shape.dtype, shape.op, dst, ops[0], ops[1])?;
                            }
                            for src in &ops[2.min(n)..] {
                                reduce::reduce_into(shape.dtype, shape.op, dst, src)?;
                            }
                            if shape.op == ReduceOp::Avg {
                                reduce::finish_avg(shape.dtype, dst, n)?;
                            }
                            Ok(())
                        };
                        // Results that do not fit the caches are made in a cache-sized staging
                        // buffer and streamed out from there.
                        let dst = if stream {
                            if acc.is_empty() {
                                acc = vec![0u8; CHUNK.min(len)];
                            }
                            fold(&mut acc[..m])?;
                            put(&mut out[pos..pos + m], &acc[..m])?;
                            &acc[..m]
                        } else {
                            fold(&mut out[pos..pos + m])?;
                            &out[pos..pos + m]
                        };
                        if push {
                            for p in peers() {
                                deliver(p, pos, dst)?;
                            }
                        }
                        at += m;
                        continue;
                    }
                    if acc.is_empty() {
                        acc = vec![0u8; CHUNK.min(len)];
                    }
                    if tmp.is_empty() {
                        tmp = vec![0u8; CHUNK.min(len)];
                    }
                    let (acc, tmp) = (&mut acc[..m], &mut tmp[..m]);
                    for p in 0..n {
                        let h = hdr(p);
                        if p != me {
                            if let Some(src) = self.peer_mem(p, h.input_loc, pos, m) {
                                // SAFETY: `peer_mem` checked that the bytes lie in the
                                // peer's mapped pool block, which stays mapped.
                                let src = unsafe { std::slice::from_raw_parts(src, m) };
                                if p == 0 {
                                    acc.copy_from_slice(src);
                                } else {
                                    reduce::reduce_into(shape.dtype, shape.op, acc, src)?;
                                }
                                continue;
                            }
                        }
                        let dst: &mut [u8] = if p == 0 { acc } else { tmp };
                        if p == me {
                            // SAFETY: the contribution is `block` readable bytes; in place it
                            // is the receive buffer, whose bytes `pos..pos + m` this rank
                            // overwrites only after this read.
                            unsafe { dst.as_mut_ptr().copy_from_nonoverlapping(input.add(pos), m) };
                        } else {
                            // SAFETY: the peer published its contribution for this call and
                            // keeps it unchanged until this rank publishes `done`.
                            unsafe { cma::read_remote(self.pids[p], h.input as usize + pos, dst) }
                                .map_err(|e| waiter.read_failed(p, e))?;
                        }
                        if p > 0 {
                            reduce::reduce_into(shape.dtype, shape.op, acc, tmp)?;
                        }
                    }
                    if shape.op == ReduceOp::Avg {
                        reduce::finish_avg(shape.dtype, acc, n)?;
                    }
                    put(&mut out[pos..pos + m], acc)?;
                    if push {
                        for p in peers() {
                            deliver(p, pos, acc)?;
                        }
                    }
                    at += m;
                }
                if !push {
                    self.publish(waiter.engine, Ctr::Ready, j);
                }
                for p in peers().filter(|_| !push) {
                    waiter.wait(p, Ctr::Ready, j)?;
                    let (off, len) = segs[p];
                    let h = hdr(p);
                    self.read_peer(
                        p,
                        h.output,
                        h.output_loc,
                        off,
                        &mut out[off..off + len],
                        put,
                    )
                    .map_err(|e| waiter.read_failed(p, e))?;
                }
            }
            CollKind::AllGather if push => {
                let pos = me * block;
                let own: &[u8] = if shape.in_place {
                    &out[pos..pos + block]
                } else {
                    // SAFETY: the send buffer holds `block` readable bytes.
                    let own = unsafe { std::slice::from_raw_parts(bufs.send, block) };
                    put(&mut out[pos..pos + block], own)?;
                    own
                };
                fan_out(pos, own)?;
            }
            CollKind::AllGather => {
                if !shape.in_place {
                    // SAFETY: the send buffer holds `block` readable bytes.
                    let own = unsafe { std::slice::from_raw_parts(bufs.send, block) };
                    put(&mut out[me * block..(me + 1) * block], own)?;
                }
                for p in peers() {
                    let h = hdr(p);
                    let dst = &mut out[p * block..(p + 1) * block];
                    self.read_peer(p, h.input, h.input_loc, 0, dst, put)
                        .map_err(|e| waiter.read_failed(p, e))?;
                }
            }
            CollKind::Broadcast => {
                // With every receive buffer in a pool, the root does not idle: it writes the
                // last n-th of the buffer into every non-root while they copy the rest.
                let e = shape.elem();
                let cut = if push {
                    block - block / n / e * e
                } else {
                    block
                };
                if me == shape.root {
                    fan_out(cut, &out[cut..block])?;
                } else {
                    let h = hdr(shape.root);
                    self.read_peer(shape.root, h.output, h.output_loc, 0, &mut out[..cut], put)
                        .map_err(|e| waiter.read_failed(shape.root, e))?;
                }
            }
            _ => {
                return Err(Error::Internal(format!(
                    "{} has no large one-sided algorithm",
                    shape.kind.name()
                )))
            }
        }
        self.publish(waiter.engine, Ctr::Done, j);
        // Nobody returns (and releases its buffers) while a peer may still read them or write
        // its results into them; a broadcast's non-roots have nothing anyone reads, and only
        // the root writes into them.
        let bcast_leaf = shape.kind == CollKind::Broadcast && me != shape.root;
        for p in peers().filter(|&p| !bcast_leaf || (push && p == shape.root)) {
            waiter.wait(p, Ctr::Done, j)?;
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes at `pos` of peer `p`'s buffer (address `addr`, pool location
    /// `loc`) into `dst`: straight from its pool block when mapped, else with cross-memory
    /// attach.
    fn read_peer(
        &self,
        p: usize,
        addr: u64,
        loc: u64,
        pos: usize,
        dst: &mut [u8],
        put: impl Fn(&mut [u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        match self.peer_mem(p, loc, pos, dst.len()) {
            Some(src) => {
                // SAFETY: `peer_mem` checked that the bytes lie in the peer's mapped pool
                // block, which stays mapped while `self` lives; `dst` is this rank's own.
                let src = unsafe { std::slice::from_raw_parts(src, dst.len()) };
                put(dst, src)
            }
            // SAFETY: the peer published the buffer at `addr` for this call and keeps it until
            // this rank publishes `done`.
            None => unsafe { cma::read_remote(self.pids[p], addr as usize + pos, dst) },
        }
    }

    /// Where `len` bytes at `pos` of peer `p`'s pool memory at `loc` are mapped here, mapping
    /// its block on first use; `None` for heap memory or a block that cannot be mapped.
    fn peer_mem(&self, p: usize, loc: u64, pos: usize, len: usize) -> Option<*const u8> {
        if loc == 0 {
            return None;
        }
        let block = (loc >> 40) as usize - 1;
        let start = (loc & ((1 << 40) - 1)) as usize + pos;
        if start.checked_add(len)? > self.block_size {
            return None;
        }
        let mut blocks = lock(&self.blocks);
        let seg = blocks.entry((p, block)).or_insert_with(|| {
            let opened = segment_name(&self.job, self.world[p] as u32, &format!("pool{block}"))
                .and_then(|name| ShmSegment::open(&name, self.block_size));
            match opened {
                Ok(seg) => {
                    let _ = seg.unlink_if_last(self.local_ranks);
                    Some(seg)
                }
                Err(e) => {
                    tracing::info!("pool block {block} of rank {p} read through CMA: {e}");
                    None
                }
            }
        });
        seg.as_ref()
            .map(|s| s.as_ptr().wrapping_add(start).cast_const())
    }

    fn counter(&self, rank: usize, which: Ctr) -> &AtomicU64 {
        let offset = match which {
            Ctr::Seq => offset_of!(Segment, seq),
            Ctr::Failed => offset_of!(Segment, failed),
            Ctr::Ready => offset_of!(Segment, ready),
            Ctr::Done => offset_of!(Segment, done),
        };
        let ctr = self.field::<Counter>(rank, offset);
        // SAFETY: every segment holds a `Segment` (SEG_LEN bytes, 128-byte aligned) and lives
        // as long as `self`; a counter is an atomic, any bit pattern of which is valid, shared
        // between processes.
        unsafe { &(*ctr).0 }
    }

    fn header_ptr(&self, rank: usize, slot: usize) -> *mut Header {
        self.field(
            rank,
            offset_of!(Segment, headers) + size_of::<HeaderLine>() * slot,
        )
    }

    fn data_ptr(&self, rank: usize, slot: usize) -> *mut u8 {
        self.field(rank, offset_of!(Segment, data) + SLOT * slot)
    }

    /// Stores `value` in this rank's counter `which` and rings every peer.
    fn publish(&self, engine: &Engine, which: Ctr, value: u64) {
        self.counter(self.me, which).store(value, Ordering::Release);
        for p in (0..self.segs.len()).filter(|&p| p != self.me) {
            engine.ring_peer(self.world[p]);
        }
    }
}

/// How one call waits for its peers' counters.
struct Waiter<'a> {
    os: &'a OneSided,
    engine: &'a Engine,
    /// The id the communicator's collective frames carry.
    coll_id: u64,
    /// `HCOMM_TIMEOUT`.
    timeout: Duration,
    tag: u32,
    /// The call's number.
    call: u64,
    /// The call's signature.
    sig: [u64; 2],
    /// `HCOMM_TIMEOUT` from the first wait that had to sleep (reading the clock costs as
    /// much as a whole small call); set once the call is registered with the engine.
    deadline: OnceCell<Instant>,
}

impl Waiter<'_> {
    /// What a failed read of rank `p`'s memory means: `p` abandoned the call, and may have
    /// freed the buffers once it said so (found by the kill-to-error test: a survivor read a
    /// buffer that another survivor had freed on its way out, and reported `EFAULT`); `p`
    /// died; or, when neither, the read's own error.
    fn read_failed(&self, p: usize, err: Error) -> Error {
        if matches!(err, Error::PeerLost(_)) {
            return err;
        }
        if self.os.counter(p, Ctr::Failed).load(Ordering::Acquire) >= self.call {
            return Error::Aborted(format!(
                "rank {p} abandoned this collective after an error while this rank read its \
                 buffers; see that rank's error"
            ));
        }
        match self.engine.check_peer(self.os.world[p]) {
            Err(lost) => lost,
            Ok(()) => err,
        }
    }

    /// Waits until rank `p`'s counter `which` reaches `target`.
    fn wait(&self, p: usize, which: Ctr, target: u64) -> Result<()> {
        self.wait_on(p, self.os.counter(p, which), target)
    }

    /// Waits until `ctr`, a counter of rank `p`, reaches `target`.
    fn wait_on(&self, p: usize, ctr: &AtomicU64, target: u64) -> Result<()> {
        let ready = || ctr.load(Ordering::Acquire) >= target;
        if ready() {
            return Ok(());
        }
        // Spinning (when this rank has a core to itself), then yielding: most small calls find
        // their peers' lines within a few looks.
        let mut waiting = Waiting::new(Backoff::DEFAULT, self.os.spin);
        while waiting.pause() != Pause::Sleep {
            if ready() {
                return Ok(());
            }
        }
        let engine = self.engine;
        if self.deadline.get().is_none() {
            // Messages of this call that a peer running another algorithm sent now fail it
            // with a mismatch, and so will later ones.
            engine.begin_call(self.coll_id, self.tag, self.sig)?;
        }
        let deadline = *self.deadline.get_or_init(|| Instant::now() + self.timeout);
        let mut stall = StallWatch::new(Instant::now());
        crate::observe::blocked_on(p);
        loop {
            let now = Instant::now();
            stall.check(now, || {
                format!(
                    "rank {p} (world rank {}) [one-sided call {target}]",
                    self.os.world[p]
                )
            });
            if now >= deadline {
                return Err(Error::Timeout(format!(
                    "rank {p} has not reached this collective (one-sided call {target}) within \
                     HCOMM_TIMEOUT; it may be stuck, slow, or calling something else"
                )));
            }
            // Look at the peer before each sleep, and do not sleep once the watcher has news
            // from after that look (a peer's connection ended: the peer may be dead).
            let alarms = engine.alarms();
            let peer = engine.check_peer(self.os.world[p]);
            // Before the peer's loss or abandonment: an aborted communicator fails every
            // member's wait, and its error names the rank that aborted it (the peer may have
            // learnt of it first and left already).
            if let Some(e) = engine.call_failed(self.coll_id, self.tag) {
                return Err(e);
            }
            peer?;
            if self.os.counter(p, Ctr::Failed).load(Ordering::Acquire) >= self.call {
                return Err(Error::Aborted(format!(
                    "rank {p} abandoned this collective after an error; see that rank's error"
                )));
            }
            if ready() {
                return Ok(());
            }
            let left = (deadline - now).min(waiting.max_sleep());
            if let Some(bell) = engine.own_bell() {
                let mut woken = || ready() || engine.alarms() != alarms;
                bell.sleep_unless(&mut woken, left);
            }
            if ready() {
                return Ok(());
            }
        }
    }
}

/// Fails unless peer `p`'s call (signature `theirs`, contribution of `len` bytes) is this
/// rank's (`sig`): every rank checks every other, so a mismatch fails every rank of the call.
fn check_peer_call(
    shape: &Shape,
    sig: [u64; 2],
    p: usize,
    theirs: [u64; 2],
    len: u64,
) -> Result<()> {
    if theirs != sig {
        return Err(Error::Mismatch(format!(
            "this rank called {} but rank {p} called {}: every rank must call the same \
             collectives in the same order with the same type, op, count and root",
            Shape::describe_signature(sig),
            Shape::describe_signature(theirs)
        )));
    }
    let want = contribution_len(shape, p);
    if len != want as u64 {
        return Err(Error::Mismatch(format!(
            "rank {p} contributes {len} bytes to {} where {want} were expected",
            Shape::describe_signature(sig)
        )));
    }
    Ok(())
}

/// Whether the ranks of `comm` all say `ok` (collective).
fn agree(comm: &dyn Group, ok: bool) -> Result<bool> {
    let mut mine = [0u8; 16];
    mine[0] = u8::from(ok);
    Ok(comm.exchange_all(&mine)?.iter().all(|b| b[0] == 1))
}

/// Bytes rank `rank` contributes to a call of `shape`.
fn contribution_len(shape: &Shape, rank: usize) -> usize {
    let (n, block) = (shape.size, shape.count * shape.elem());
    match shape.kind {
        CollKind::AllReduce | CollKind::Reduce | CollKind::AllGather | CollKind::Gather => block,
        CollKind::ReduceScatter | CollKind::AllToAll => n * block,
        CollKind::Broadcast if rank == shape.root => block,
        CollKind::Scatter if rank == shape.root => n * block,
        _ => 0,
    }
}

/// The largest contribution of any rank.
fn max_contribution(shape: &Shape) -> usize {
    (0..shape.size)
        .map(|r| contribution_len(shape, r))
        .max()
        .unwrap_or(0)
}

/// Where this rank's contribution starts, and its length.
fn contribution(shape: &Shape, rank: usize, bufs: &Buffers) -> (*const u8, usize) {
    let len = contribution_len(shape, rank);
    let from_recv =
        shape.kind == CollKind::Broadcast || shape.in_place_at(rank) || bufs.send.is_null();
    if !from_recv {
        return (bufs.send, len);
    }
    let at = match shape.kind {
        CollKind::AllGather | CollKind::Gather if shape.in_place_at(rank) => {
            rank * shape.count * shape.elem()
        }
        _ => 0,
    };
    (bufs.recv.cast_const().wrapping_add(at), len)
}
