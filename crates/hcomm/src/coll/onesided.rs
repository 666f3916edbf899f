//! One-sided collectives for communicators whose ranks all share this host.
//!
//! Every member maps a small segment of every other member, `hcomm-<job>-<rank>-c<comm id>`,
//! created at the communicator's first one-sided call: the board of `transport::shm::board`
//! (its layout a `#[repr(C)]` struct there: counters, two slots of header and data, two tiny
//! lines), which owns every access to that memory and to the peers' buffers. This module is
//! the protocol, with no unsafe code.
//!
//! Call `j` (numbered per communicator, the same on every rank) uses slot `j % 2`. A rank
//! writes the slot's header (and, for small calls, its whole contribution into the data),
//! then publishes `seq = j` with release ordering and rings its peers' doorbells (with more
//! ranks than cores, in calls whose contributions fit a slot, only the last rank to publish
//! rings, once: `OneSided::last_to_publish`);
//! peers wait for `seq >= j` with acquire ordering, check the signature (a mismatch fails
//! every rank of the call), and read what they need in place.
//!
//! * **Tiny** (every contribution up to 32 bytes): the contribution travels in one cache line
//!   with the call number (stored last), so a peer sees both with one transfer. A rank whose
//!   result needs nothing of its peers' (a broadcast's or scatter's root, a gather's or
//!   reduce's other ranks) returns once its line is out when it has a core to itself, as an
//!   MPI root returns once its eager message is queued: a stream of small broadcasts runs its
//!   root a call ahead. The peers check its call against theirs as usual; it checks theirs at
//!   its next call on the communicator (before it publishes a one-sided one, after one that
//!   ran its schedule), which then reports a mismatch (having run).
//! * **Inline** (every rank's contribution fits a slot): each rank computes its result
//!   straight from the peers' slots, reductions folded in rank order, so every rank gets the
//!   same bits as the rank-order reference. One round of cache-line transfers, no message.
//!   Contributions beyond 1 KiB whose buffers all lie in pools, and all-gather and broadcast
//!   contributions beyond 8 KiB, go the large way instead (decided from the published
//!   headers, alike on every rank): slots rewritten by every call cross between cores on
//!   every read, buffers read in place much less.
//! * **Large** all-reduce, reduce and reduce-scatter: each rank reduces its slice (its n-th
//!   of the block; its own block for reduce-scatter) straight out of the peers' buffers
//!   (mapped pool blocks, else cross-memory attach in chunks that stay in cache) and writes
//!   each reduced chunk into its own result and into the peers' that need it (every peer for
//!   all-reduce, the root for reduce; through mapped blocks, else `process_vm_writev`).
//!   Large all-gather: each rank writes its block into every peer's result (gather: into the
//!   root's, and the non-roots wait for nobody); broadcast: the root writes the last n-th of
//!   the buffer into the non-roots while they read the rest from it; scatter: each non-root
//!   reads its block while the root copies its own (in place, the root writes the last n-th
//!   of each non-root's block into it while it reads the rest); all-to-all: each pair of
//!   ranks splits the two blocks it exchanges, the lower rank moving the first half of both
//!   (reading one, writing the other), the higher rank the second half (out of place, blocks
//!   up to 128 KiB go whole: each rank writes its block into the peer's result, one transfer
//!   per peer). Contributions read in place are not copied into the slot, even when they
//!   fit it. Nobody copies
//!   results out of a peer afterwards, and the copying is shared by all ranks. Each rank
//!   then publishes `done` and waits for its peers' before returning, so no buffer is
//!   released while a peer still reads or writes it: a rank touches a peer's buffers only
//!   between the peer's publishing the call (its `seq`, with the buffers' addresses in its
//!   header) and its own `done`, and the peer waits for that.
//!
//! A call that would reach heap buffers with cross-memory attach does not run when some
//! member says the kernel may refuse it now (`NoCma` in its segment: it turned
//! non-dumpable since the start-up probe, which it checks before publishing such a call of
//! the collectives that may write a contribution, or a transfer of its was refused in an
//! earlier call): every member sees that alike once all
//! published the call, touches no peer's buffer, and runs the call's schedule instead
//! ([`Outcome::Schedule`]). A refusal in the middle of a call, with no such warning, makes
//! every member give the call up and run its schedule instead, unless the call is in place
//! (then it fails on every member: see `refusal`); the later ones take the schedule. The
//! collectives that never write a contribution (broadcast, all-gather, gather, scatter) skip
//! the check: a refusal in their middle is always done again by the schedule.
//!
//! A rank overwrites slot `j % 2` only once every peer has started call `j - 1`, which it does
//! only after finishing call `j - 2`, the slot's previous user (a rank that saw its peers
//! start `j - 1` during that call does not look again). Waits spin (when the host has a core
//! per rank), yield, then sleep on the rank's doorbell futex; every wait is bounded by
//! `HCOMM_TIMEOUT` and checks that the peer is still alive and has not abandoned the call.

mod refusal;

use std::cell::OnceCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::coll::{algos, CollKind, Group, Shape};
use crate::config::Backoff;
use crate::dtype::ReduceOp;
use crate::error::{Error, PeerRank, Result};
use crate::observe::stall::StallWatch;
use crate::p2p::lease::Lease;
use crate::p2p::wait::{Pause, Waiting, QUIET_LOOKS};
use crate::p2p::Engine;
use crate::reduce;
use crate::sync::lock;
pub(crate) use crate::transport::shm::board::SLOT;
use crate::transport::shm::board::{
    pool_loc, Board, BoardSetup, Ctr, Header, Side, Signals, SEG_LEN, TINY_MAX,
};
use crate::transport::shm::cma;
use crate::transport::shm::pool::PoolMem;
use crate::transport::shm::segment::{segment_name, ShmSegment};

/// Calls whose buffers all lie in pools read larger contributions than this in place, even
/// when they fit a slot.
const DIRECT_FROM: usize = 1024;
/// All-gathers and broadcasts read larger contributions than this in place even from heap
/// buffers, with cross-memory attach.
const DIRECT_CMA_FROM: usize = 8 << 10;
/// All-to-alls out of place with blocks up to this size write each block whole into its
/// peer's result (one transfer per peer); larger blocks are split between each pair. 2 ranks
/// pinned, heap buffers, three interleaved rounds at load 11-16: 3.2 against 3.8-3.9 µs with
/// 32 KiB blocks, 7.8-7.9 against 8.6 µs with 128 KiB blocks; with 512 KiB blocks either
/// way took 43-48 µs.
const ALLTOALL_WHOLE: usize = 128 << 10;
/// Bytes reduced at a time by the large all-reduce (they stay in the core's cache).
const CHUNK: usize = 128 << 10;
/// Bytes copied at a time by the large calls that only copy (all-gather, gather, scatter,
/// all-to-all): a piece goes on to the peers while it is in the core's cache, and each piece
/// of a heap buffer costs a system call.
const COPY_CHUNK: usize = 512 << 10;
/// Heap all-reduces of at least this many bytes (and at most `STAGE_MAX`) go through pool
/// memory when the members outnumber the host's cores by more than `STAGE_PER_CORE` times
/// ([`OneSided::staged`]).
const STAGE_FROM: usize = 256 << 10;
/// Members per core beyond which large heap all-reduces are staged in pool memory. 2 cores,
/// 5 interleaved rounds, staged against the heap: 8 ranks 1 MiB 1.22x and 256 KiB 1.24x
/// (the copies cost more than the kernel's), 16 ranks 1 MiB 1.00x, 32 ranks 1 MiB 0.72x and
/// 256 KiB 0.62x.
const STAGE_PER_CORE: usize = 8;
/// The largest heap all-reduce staged in pool memory: the memory stays with the
/// communicator.
const STAGE_MAX: usize = 16 << 20;
/// Calls on at least this many bytes write their results with non-temporal stores: their
/// buffers do not fit the caches, and the stores then skip reading the destination first.
const STREAM_FROM: usize = 64 << 20;
/// The backoff of calls whose contributions fit a slot: with more ranks than cores their
/// waits yield the core a few times before they sleep. A yield hands the core to another
/// runnable rank, maybe the one that must publish next, for a system call; a sleep costs the
/// waiter a futex wait, the waker a futex wake and the scheduler two switches. Measured on the
/// 2-core host at load 14-17, 1 KiB all-reduce: 8 ranks 18 µs with 8 yields against 34 µs
/// sleeping at once, 32 ranks 143 against 362 µs.
const SMALL_CALLS: Backoff = Backoff {
    oversubscribed_yields: 8,
    ..Backoff::DEFAULT
};
/// The backoff of larger calls: with more ranks than cores, 64 yields before a sleep, as
/// a27d6a5's waits did. On the quiet 2-core host, 1 MiB all-reduce, interleaved runs:
/// 8 ranks 351 µs (a27d6a5 378 µs) against 477 µs sleeping at once, 32 ranks 2.08 ms
/// (a27d6a5 2.09 ms) against 4.6 ms. Another rank that takes the core at such a yield works
/// for up to milliseconds (32 ranks: 5.3-6.0 ms where a yield of 50 or 500 µs counted as
/// slow and ended the yields), so only a yield of a whole time slice under load (5 ms at
/// 2.6 GHz; busy loops keep the cores that long) ends them: each wait then pays one such
/// yield (8 ranks beside 8 busy loops: 16 ms against 8 ms sleeping at once), not 64.
const LARGE_CALLS: Backoff = Backoff {
    oversubscribed_yields: 64,
    slow_yield: 100 * Backoff::DEFAULT.slow_yield,
    ..Backoff::DEFAULT
};

/// How a one-sided call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It ran: the result is in the receive buffer.
    Done,
    /// It did not run (no rank touched another's buffers): every member runs the call's
    /// schedule instead.
    Schedule,
}

/// The call counter of a communicator, what this rank knows of its peers, and the board.
struct Calls {
    /// Calls this rank started.
    last: u64,
    /// The latest call each peer is known to have started.
    known: Vec<u64>,
    /// The previous call, when this rank returned from it without the peers' calls (its
    /// result needed nothing of theirs): checked against theirs at the start of the next.
    unchecked: Option<Unchecked>,
    /// The mismatch of such a call, found at the start of a call that then ran its schedule
    /// instead ([`Outcome::Schedule`]): reported once that schedule is done. Boxed: with the
    /// error inline the one-sided call compiled to a 2-rank 16 MiB pool all-reduce 14 % slower
    /// (1421 against 1238 us, 5 interleaved rounds; 1217 against 1205 us boxed).
    late: Option<Box<Error>>,
    /// The segments and the way to the peers' buffers.
    board: Board,
}

/// A tiny call this rank returned from before its peers had published theirs (a broadcast
/// or scatter from this rank, a gather or reduce to another): the root of a stream of small
/// broadcasts runs ahead of the others, as an MPI root's eager messages do.
#[derive(Debug, Clone, Copy)]
struct Unchecked {
    /// Its number.
    call: u64,
    /// Its signature.
    sig: [u64; 2],
    /// Bytes every peer contributes to it.
    peer_len: u64,
}

/// The one-sided state of a communicator.
pub(crate) struct OneSided {
    me: usize,
    /// World rank of each member.
    world: Vec<usize>,
    /// Every member's counters.
    signals: Signals,
    /// Whether waiters may spin (a core per local rank).
    spin: bool,
    /// Whether cross-memory attach reaches every peer.
    cma: bool,
    /// Calls so far; held for the length of a call.
    calls: Mutex<Calls>,
    /// Whether `calls` holds a call to check or a mismatch to report
    /// ([`OneSided::check_late`]), for a look without the lock.
    late_pending: AtomicBool,
    /// Whether large heap all-reduces go through pool memory ([`OneSided::staged`]): more
    /// than [`STAGE_PER_CORE`] members per core of the host.
    stages: bool,
    /// The pool memory they go through, kept from call to call.
    stage: Mutex<Option<PoolMem>>,
}

/// One call's buffers: the send buffer (`None` when there is none or the call is in place)
/// and the receive buffer.
struct Buffers<'a> {
    send: Option<&'a [u8]>,
    out: &'a mut [u8],
}

/// Where this rank's contribution lies.
#[derive(Debug, Clone, Copy)]
enum Own {
    /// At the start of the send buffer.
    Send,
    /// At this offset of the receive buffer.
    Recv(usize),
}

impl Buffers<'_> {
    /// This rank's contribution of `len` bytes.
    fn own(&self, at: Own, len: usize) -> Result<&[u8]> {
        let got = match at {
            Own::Send => self.send.and_then(|s| s.get(..len)),
            Own::Recv(off) => self.out.get(off..off + len),
        };
        got.ok_or_else(|| Error::internal("a one-sided contribution outside its buffer"))
    }
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
        if !comm.all_agree(own.is_ok())? {
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
                (_, Some((pid, _))) if pid == std::process::id() => {
                    failed = Some(Error::internal(format!("rank {r} runs in this process")));
                }
                (Ok(seg), Some((pid, reach))) => {
                    let _ = seg.unlink_if_last(n as u32);
                    segs.push(seg);
                    pids.push(pid);
                    cma &= reach;
                }
                (Err(e), _) => failed = Some(e),
                (_, None) => {
                    failed = Some(
                        Error::internal(format!("no link to rank {r}"))
                            .with_peer(PeerRank::ranks(r, comm.members()[r])),
                    )
                }
            }
        }
        let ok = comm.all_agree(failed.is_none())?;
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
        let (board, signals) = Board::new(BoardSetup {
            me,
            segs,
            world: members.to_vec(),
            pids,
            job: job.to_owned(),
            local_ranks: engine.shm_peer_count() as u32 + 1,
        })?;
        Ok(Some(OneSided {
            me,
            world: members.to_vec(),
            signals,
            spin: comm.spin(),
            stages: n > STAGE_PER_CORE * comm.cores(),
            cma,
            calls: Mutex::new(Calls {
                last: 0,
                known: vec![0; n],
                unchecked: None,
                late: None,
                board,
            }),
            late_pending: AtomicBool::new(false),
            stage: Mutex::new(None),
        }))
    }

    /// Whether a call of `shape` runs one-sided: inline when every contribution fits a slot;
    /// otherwise every collective but the barrier and the vector ones, with cross-memory
    /// attach.
    pub(crate) fn fits(&self, shape: &Shape) -> bool {
        if shape.v.is_some() || shape.size != self.signals.len() {
            return false;
        }
        max_contribution(shape) <= SLOT || (self.cma && has_large(shape.kind))
    }

    /// Runs call `tag` of `shape` with signature `sig`, from `send` (`None` in place and for
    /// calls without one) into `recv`, both checked against `shape`. [`Outcome::Schedule`]:
    /// the call needs cross-memory attach, which the kernel may refuse on some member's
    /// buffers now; every member then says so, having touched no peer's buffer, and runs the
    /// call's schedule instead.
    pub(crate) fn run(
        &self,
        comm: &dyn Group,
        shape: &Shape,
        tag: u32,
        sig: [u64; 2],
        send: Option<&Lease<'_>>,
        recv: &mut Lease<'_>,
    ) -> Result<Outcome> {
        if self.stages {
            if let Some(outcome) = self.staged(comm, shape, tag, sig, send, recv)? {
                return Ok(outcome);
            }
        }
        self.run_on(comm, shape, tag, sig, send, recv)
    }

    /// A large all-reduce of heap buffers with many more ranks than cores (`stages`): the
    /// input is copied into pool memory, reduced there in place, and the result copied out
    /// (`None`: not such a call, or the pool has no room). Read in place from the peers'
    /// mapped pool blocks, its contributions cost no system call; on the heap each rank's reads
    /// and writes of its peers' buffers are cross-memory attach calls of a chunk each, whose
    /// kernel copies took most of the time (32 ranks on 2 cores, 1 MiB: 7.1-8.9 ms on the heap, 2.1-2.9 ms
    /// in the pool, with 2 MiB of copies per rank besides: 5.8-7.4 ms staged).
    fn staged(
        &self,
        comm: &dyn Group,
        shape: &Shape,
        tag: u32,
        sig: [u64; 2],
        send: Option<&Lease<'_>>,
        recv: &mut Lease<'_>,
    ) -> Result<Option<Outcome>> {
        let len = shape.recv_bytes(self.me);
        if shape.kind != CollKind::AllReduce || !(STAGE_FROM..=STAGE_MAX).contains(&len) {
            return Ok(None);
        }
        let Some(pool) = comm.pool() else {
            return Ok(None);
        };
        let pooled = |b: &[u8]| pool.locate(b.as_ptr(), b.len()).is_some();
        if pooled(recv.as_slice()) && send.is_none_or(|s| pooled(s.as_slice())) {
            return Ok(None);
        }
        let mut stage = lock(&self.stage);
        if stage.as_ref().is_none_or(|m| m.as_bytes().len() < len) {
            *stage = None;
            *stage = comm.pool_mem(len);
        }
        let Some(mem) = stage.as_mut() else {
            return Ok(None);
        };
        let short = || Error::internal("a staged all-reduce's buffer is shorter than its call");
        let input = send.map_or(recv.as_slice(), Lease::as_slice);
        let staged = &mut mem.as_bytes_mut()[..len];
        staged.copy_from_slice(input.get(..len).ok_or_else(short)?);
        let mut staged_recv = Lease::from(&mut *staged);
        let outcome = self.run_on(comm, shape, tag, sig, None, &mut staged_recv)?;
        if let Outcome::Done = outcome {
            let out = recv.as_mut_slice()?.get_mut(..len).ok_or_else(short)?;
            out.copy_from_slice(staged);
            comm.engine().count_staged();
        }
        Ok(Some(outcome))
    }

    /// [`OneSided::run`] on the buffers as they are.
    fn run_on(
        &self,
        comm: &dyn Group,
        shape: &Shape,
        tag: u32,
        sig: [u64; 2],
        send: Option<&Lease<'_>>,
        recv: &mut Lease<'_>,
    ) -> Result<Outcome> {
        let mut bufs = Buffers {
            send: send.map(Lease::as_slice),
            out: recv.as_mut_slice()?,
        };
        let mut guard = lock(&self.calls);
        let calls = &mut *guard;
        let j = calls.last + 1;
        calls.last = j;
        let engine = comm.engine();
        // The largest contribution decides the way of the call (looked up once: it visits
        // every rank).
        let most = max_contribution(shape);
        let waiter = Waiter {
            os: self,
            comm,
            engine,
            coll_id: comm.coll_id(),
            tag,
            call: j,
            sig,
            policy: if most <= SLOT {
                &SMALL_CALLS
            } else {
                &LARGE_CALLS
            },
            deadline: OnceCell::new(),
        };
        // The call is registered with the engine (for messages of a peer that runs it with
        // another algorithm) only once it has to wait (`Waiter::wait_on`); an earlier call's
        // mismatch found after it returned is reported now.
        engine.late_error(waiter.coll_id)?;
        let n = self.signals.len();
        // Slot j % 2 was last used by call j - 2: every peer has finished it once it started
        // call j - 1 (which this rank usually saw during call j - 1).
        for p in (0..n).filter(|&p| p != self.me) {
            if calls.known[p] < j - 1 {
                waiter.wait(p, Ctr::Seq, j - 1)?;
            }
        }
        // Every peer has published call j - 1 now, and overwrites its slot only after this
        // rank publishes call j: a mismatch of the call this rank returned from early is
        // found here, and reported once this call is done (so that no peer waits for this
        // rank's part of it in vain), as the next call's error.
        let late = match calls.unchecked.take() {
            Some(u) => self.check_unchecked(&calls.board, u),
            None => Ok(()),
        };
        let (own, len) = contribution(shape, self.me, &bufs);
        let slot = (j % 2) as usize;
        let board = &mut calls.board;
        if most <= TINY_MAX {
            // Only with a core per rank: with more ranks than cores the early ranks of a
            // gather or reduce took the cores from the root in their waits for the next call's
            // slot (8 ranks on 2 cores, 8-byte reduce, 11 interleaved rounds: 9.5 us against
            // 5.0 us waiting as before; bimodal, 8 of 11 rounds in the slow mode against 4),
            // and a broadcast's early root showed no gain there (8 of 14 rounds slow against
            // 7 of 14).
            let eager = self.spin && needs_no_peer(shape, self.me);
            self.tiny(
                &waiter,
                board,
                shape,
                (j, slot),
                (own, len),
                &mut bufs,
                (&mut calls.known, eager),
            )?;
            if eager {
                calls.unchecked = Some(Unchecked {
                    call: j,
                    sig,
                    peer_len: contribution_len(shape, (self.me + 1) % n) as u64,
                });
            }
            self.note_late(calls);
            return late.map(|()| Outcome::Done);
        }
        // A call that may read or write heap buffers with cross-memory attach: a rank that
        // turned non-dumpable since the start-up probe says so before it publishes the call
        // (its peers would be refused), and every rank then takes the schedule. Not the
        // collectives that never write a contribution (`refusal::redone`): a refusal in the
        // middle of one of those is done again by the schedule, so they skip the check (one
        // `prctl`, 0.3 µs on the 2-core VM, a tenth of a 64 KiB all-gather), nor a rank whose
        // buffers are both in its pool, which its peers map rather than attach to (2-rank
        // 64 KiB pool all-reduce: 2.39 µs with the check, 2.23 without, a27d6a5 2.14; a peer
        // that cannot map the pool's segment attaches instead, and a refusal then is one in
        // the middle of a call, handled below).
        let pool = comm.pool();
        let input = bufs.own(own, len)?;
        let out_at = bufs.out.as_ptr();
        let input_loc = pool_loc(pool.and_then(|p| p.locate(input.as_ptr(), len)));
        let output_loc = pool_loc(pool.and_then(|p| p.locate(out_at, bufs.out.len())));
        let pooled = input_loc != 0 && output_loc != 0;
        if self.cma && most > DIRECT_CMA_FROM && !pooled {
            if refusal::redone(shape.kind) || cma::attachable() {
                // Tests: the rank turns non-dumpable here, after its check and with no
                // warning, when armed to (`cma::arm_nondumpable`).
                cma::nondumpable_if_armed();
            } else {
                self.refuse_cma_from(j);
            }
        }
        let inline = most <= SLOT;
        let header = Header {
            sig,
            len: len as u64,
            input: input.as_ptr() as u64,
            output: out_at as u64,
            input_loc,
            output_loc,
            output_len: bufs.out.len() as u64,
        };
        board.publish_header(slot, header);
        // Contributions that the peers read in place whatever the buffers (`direct_on_heap`)
        // are not copied into the slot: nobody would read them there.
        if inline && len > 0 && !self.direct_on_heap(shape.kind, most) {
            board.publish_data(slot, input)?;
        }
        self.signals
            .counter(self.me, Ctr::Seq)
            .store(j, Ordering::Release);
        // Large calls ring every peer, also with more ranks than cores: with only the last
        // rank ringing, a 1 MiB all-reduce of 8 ranks on 2 cores took 7.0 and 10.5 ms in two
        // runs of five, against 1.5-1.8 ms in all five ringing every peer.
        if self.spin || !inline || self.last_to_publish(|p| self.signals.counter(p, Ctr::Seq), j) {
            self.ring_all(engine);
        }
        let outcome = self
            .complete(
                &waiter,
                board,
                shape,
                (j, slot),
                most,
                &mut bufs,
                &mut calls.known,
            )
            .and_then(|outcome| waiter.none_abandoned(n).map(|()| outcome));
        if let Err(e) = &outcome {
            if cma::refused(e) {
                // Refused in the middle of a call, with no warning beforehand: the later
                // calls take the schedule, and this one too where it can (`refusal`).
                self.refuse_cma_from(j + 1);
            }
            // Peers may wait for this rank's part of the call: tell them it will not come,
            // and why when a lost rank is the cause (they may see this rank leave before they
            // learn of that loss themselves).
            let cause = match e {
                Error::PeerLost(_) => e.peer().and_then(|p| p.world).map_or(0, |w| w as u64 + 1),
                _ => 0,
            };
            self.signals
                .counter(self.me, Ctr::Cause)
                .store(cause, Ordering::Relaxed);
            self.publish(engine, Ctr::Failed, j);
        }
        match outcome {
            Err(e) => refusal::after_failure(&waiter, shape.kind, board, slot, j, e),
            // Every member runs the call's schedule now: the mismatch waits for its end.
            Ok(Outcome::Schedule) => {
                calls.late = late.err().map(Box::new);
                self.note_late(calls);
                Ok(Outcome::Schedule)
            }
            Ok(Outcome::Done) => {
                self.note_late(calls);
                late.map(|()| Outcome::Done)
            }
        }
    }

    /// After a call of the communicator that did not run here (its message schedule): the
    /// mismatch found at its start when it was to run here ([`Outcome::Schedule`]); else
    /// checks the one-sided call before it, when this rank returned from that one early, against
    /// every peer's, if each has published it (each has once it took part in a call after
    /// it: the check is exact after a call that waited for every peer, such as a barrier).
    /// No peer overwrites its part of that call before this rank starts its next one-sided
    /// call, so a check left for later stays exact. Skipped while another thread runs a
    /// one-sided call of the communicator, which makes the check itself.
    pub(crate) fn check_late(&self) -> Result<()> {
        if !self.late_pending.load(Ordering::Acquire) {
            return Ok(());
        }
        let Ok(mut guard) = self.calls.try_lock() else {
            return Ok(());
        };
        let calls = &mut *guard;
        if let Some(e) = calls.late.take() {
            self.note_late(calls);
            return Err(*e);
        }
        let Some(u) = calls.unchecked else {
            return Ok(());
        };
        let published = (0..self.signals.len())
            .filter(|&p| p != self.me)
            .all(|p| self.signals.counter(p, Ctr::Seq).load(Ordering::Acquire) >= u.call);
        if !published {
            return Ok(());
        }
        calls.unchecked = None;
        self.note_late(calls);
        self.check_unchecked(&calls.board, u)
    }

    /// Says in `late_pending` whether `calls` holds something for [`OneSided::check_late`]
    /// (a store only when that changes).
    fn note_late(&self, calls: &Calls) {
        let pending = calls.unchecked.is_some() || calls.late.is_some();
        if self.late_pending.load(Ordering::Relaxed) != pending {
            self.late_pending.store(pending, Ordering::Release);
        }
    }

    /// Checks the peers' calls against `u`, a tiny call this rank returned from early, once
    /// each has published the call after it. A peer whose tiny line holds `u`'s number shows
    /// its signature there; one whose line holds an older call made another call than a tiny
    /// one (its slot's header says which); one whose line holds a newer call has moved on (a
    /// call of this rank ended before it published), which leaves nothing to check.
    fn check_unchecked(&self, board: &Board, u: Unchecked) -> Result<()> {
        let slot = (u.call % 2) as usize;
        for p in (0..self.signals.len()).filter(|&p| p != self.me) {
            let at = self.signals.tiny_seq(p, slot).load(Ordering::Acquire);
            let (theirs, len) = match at.cmp(&u.call) {
                std::cmp::Ordering::Equal => board.tiny_header(p, slot),
                std::cmp::Ordering::Less => {
                    let h = board.header(p, slot);
                    (h.sig, h.len)
                }
                std::cmp::Ordering::Greater => continue,
            };
            if theirs != u.sig || len != u.peer_len {
                return Err(late_mismatch(peer_mismatch(
                    u.sig,
                    p,
                    theirs,
                    len,
                    u.peer_len as usize,
                )));
            }
        }
        Ok(())
    }

    /// Tells the peers (and this rank) that cross-memory attach on this rank may be refused
    /// from call `j` on (unless said before): the calls that need it run their schedules.
    fn refuse_cma_from(&self, j: u64) {
        let no_cma = self.signals.counter(self.me, Ctr::NoCma);
        if no_cma.load(Ordering::Relaxed) == 0 {
            tracing::info!(
                "cross-memory attach may be refused on rank {} from one-sided call {j} on: \
                 the collectives that would use it run their message schedules",
                self.me
            );
            // Published by the release store of call `j`'s number, which comes after.
            no_cma.store(j, Ordering::Relaxed);
        }
    }

    /// Whether some member said that cross-memory attach may be refused in call `j` (read
    /// once every peer has published `j`: every rank answers alike).
    fn cma_refused(&self, j: u64) -> bool {
        (0..self.signals.len()).any(|p| {
            let from = self.signals.counter(p, Ctr::NoCma).load(Ordering::Relaxed);
            from != 0 && from <= j
        })
    }

    /// A call whose every contribution fits a cache line: it goes with the call number in
    /// one line of the tiny slot, and each rank computes its result from the peers' lines.
    /// An `eager` rank, whose result needs nothing of the peers', returns once its line is
    /// out: its peers check its call against theirs, and it checks theirs at its next call.
    #[allow(clippy::too_many_arguments)]
    fn tiny(
        &self,
        waiter: &Waiter<'_>,
        board: &mut Board,
        shape: &Shape,
        (j, slot): (u64, usize),
        (own, len): (Own, usize),
        bufs: &mut Buffers<'_>,
        (known, eager): (&mut [u64], bool),
    ) -> Result<()> {
        board.publish_tiny(slot, waiter.sig, bufs.own(own, len)?, j)?;
        // The call counter too (after the line, which is what the peers watch now): a later
        // call's peers may not have seen this one.
        self.signals
            .counter(self.me, Ctr::Seq)
            .store(j, Ordering::Release);
        if eager {
            // Peers may sleep on this line, and this rank will not wait for theirs: it rings
            // at once (only a spinning rank returns early).
            self.ring_all(waiter.engine);
        } else {
            // Spinning ranks ring the peers' doorbells after the waits below: ringing fences,
            // which would hold this rank until its line reached the peers' caches, and a peer
            // asleep on this call has published its own line already, so the waits end
            // without it. (The last rank to publish finds every line there and rings
            // everyone.) With more ranks than cores only that last rank rings, once
            // (`last_to_publish`).
            if !self.spin && self.last_to_publish(|p| self.signals.tiny_seq(p, slot), j) {
                self.ring_all(waiter.engine);
            }
            let n = self.signals.len();
            for p in (0..n).filter(|&p| p != self.me) {
                waiter.wait_on(p, self.signals.tiny_seq(p, slot), j)?;
                known[p] = j;
                let (theirs, len) = board.tiny_header(p, slot);
                check_peer_call(shape, waiter.sig, p, theirs, len)?;
            }
            if self.spin {
                self.ring_all(waiter.engine);
            }
        }
        // This rank's own contribution comes from its buffer, which stays in its cache, rather
        // than from its line, which the peers are fetching; not when it lies in the receive
        // buffer (in place).
        let Buffers { send, out } = bufs;
        let own = match own {
            Own::Send => send.and_then(|s| s.get(..len)),
            Own::Recv(_) => None,
        };
        let me = self.me;
        compute(shape, me, out, |p| match own {
            Some(own) if p == me => Ok(own),
            _ => board.contribution(true, slot, p, contribution_len(shape, p)),
        })
    }

    /// Publishes `value` in this rank's counter `which` and rings every peer.
    fn publish(&self, engine: &Engine, which: Ctr, value: u64) {
        self.signals
            .counter(self.me, which)
            .store(value, Ordering::Release);
        self.ring_all(engine);
    }

    /// Rings every peer's doorbell.
    fn ring_all(&self, engine: &Engine) {
        for p in (0..self.signals.len()).filter(|&p| p != self.me) {
            engine.ring_peer(self.world[p]);
        }
    }

    /// Whether this rank, which has just published call `j` in its counter of `counter`, was
    /// the last to publish it: every peer's counter says `j` already. Only that rank then
    /// rings the peers, which wait for every counter to say `j` (with more ranks than cores:
    /// a sleeping rank is woken once per call, when all it waits for is there, instead of by
    /// each peer that publishes while it sleeps, n² wake-ups a call).
    ///
    /// No wake-up is lost. The sequentially consistent fence after this rank's store orders
    /// the fences of all publishers: the one whose fence comes last sees every peer's store,
    /// so some rank finds itself last (two finishing at once may both). A waiter counts itself
    /// as a sleeper and fences before it looks at the counters ([`EventCount`]'s protocol):
    /// either it sees every store, or the last rank's look at its sleepers (inside
    /// [`Engine::ring_peer`], after that rank's fence) sees it and wakes it.
    ///
    /// [`EventCount`]: crate::transport::shm::futex
    fn last_to_publish<'s>(&'s self, counter: impl Fn(usize) -> &'s AtomicU64, j: u64) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        (0..self.signals.len())
            .filter(|&p| p != self.me)
            .all(|p| counter(p).load(Ordering::Acquire) >= j)
    }

    /// The rest of call `j` (whose largest contribution is `most` bytes) once this rank
    /// published it: check the peers' signatures, then compute the result.
    #[allow(clippy::too_many_arguments)]
    fn complete(
        &self,
        waiter: &Waiter<'_>,
        board: &mut Board,
        shape: &Shape,
        (j, slot): (u64, usize),
        most: usize,
        bufs: &mut Buffers<'_>,
        known: &mut [u64],
    ) -> Result<Outcome> {
        let n = self.signals.len();
        for p in (0..n).filter(|&p| p != self.me) {
            waiter.wait(p, Ctr::Seq, j)?;
            known[p] = j;
        }
        // Every rank checks every signature, so a mismatch fails every rank of the call.
        for p in (0..n).filter(|&p| p != self.me) {
            let theirs = board.header(p, slot);
            check_peer_call(shape, waiter.sig, p, theirs.sig, theirs.len)?;
        }
        // Contributions beyond a kilobyte in every rank's pool are read in place rather than
        // through the slots, which every call rewrites (so every read of them crosses between
        // cores): several times faster from 2 KiB on. So are all-gather and broadcast
        // contributions beyond 8 KiB on the heap, with cross-memory attach. Every rank sees the
        // same headers, so all decide alike.
        let in_pools = || {
            (0..n).all(|p| {
                let h = board.header(p, slot);
                h.input_loc != 0 && h.output_loc != 0
            })
        };
        let inline = most <= SLOT;
        let direct = self.direct_on_heap(shape.kind, most)
            || (self.cma && has_large(shape.kind) && most > DIRECT_FROM && in_pools());
        if inline && !direct {
            compute(shape, self.me, bufs.out, |p| {
                board.contribution(false, slot, p, contribution_len(shape, p))
            })?;
            return Ok(Outcome::Done);
        }
        // Heap buffers are reached with cross-memory attach, which the kernel may refuse now.
        if self.cma_refused(j) && !in_pools() {
            return Ok(Outcome::Schedule);
        }
        self.large(waiter, board, shape, j, bufs)?;
        Ok(Outcome::Done)
    }

    /// Whether a call of `kind` whose largest contribution is `most` bytes reads the
    /// contributions in place even from heap buffers (with cross-memory attach), whatever
    /// the members' buffers: all-gathers, broadcasts, gathers, scatters and all-to-alls beyond
    /// 8 KiB.
    fn direct_on_heap(&self, kind: CollKind, most: usize) -> bool {
        self.cma
            && most > DIRECT_CMA_FROM
            && matches!(
                kind,
                CollKind::AllGather
                    | CollKind::Broadcast
                    | CollKind::Gather
                    | CollKind::Scatter
                    | CollKind::AllToAll
            )
    }

    /// The large calls: data read straight from the peers' buffers and written straight into
    /// their results (mapped pool blocks, else cross-memory attach).
    fn large(
        &self,
        waiter: &Waiter<'_>,
        board: &mut Board,
        shape: &Shape,
        j: u64,
        bufs: &mut Buffers<'_>,
    ) -> Result<()> {
        let n = self.signals.len();
        let me = self.me;
        let slot = (j % 2) as usize;
        let peers = || (0..n).filter(move |&p| p != me);
        let block = shape.count * shape.elem();
        let stream = block >= STREAM_FROM;
        let signals = &self.signals;
        // Each rank writes its results into its peers' receive buffers itself (through their
        // mapped pool blocks, else cross-memory attach: `process_vm_writev` into heap
        // buffers; a large call runs only where cross-memory attach reaches every peer), so
        // nobody copies them out of the peers' memory afterwards, and a broadcast's copying
        // is split between the root and the others. A heap all-reduce of 2 ranks then moves
        // what the pool path moves: each reads its own half and the peer's, reduces them in
        // cache-sized chunks and writes each reduced chunk into its own result and the peer's.
        // Writes `src`, this rank's bytes at `pos` of the result, into every peer's receive
        // buffer, a cache-sized chunk to all peers at a time.
        let fan_out = |board: &mut Board, pos: usize, src: &[u8]| -> Result<()> {
            for (i, chunk) in src.chunks(COPY_CHUNK).enumerate() {
                for p in peers() {
                    board
                        .write_peer_output(signals, j, p, pos + i * COPY_CHUNK, chunk, stream)
                        .map_err(|e| waiter.read_failed(p, e))?;
                }
            }
            Ok(())
        };
        let own_at = contribution(shape, me, bufs).0;
        let Buffers { send, out } = bufs;
        match shape.kind {
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce => {
                // This rank reduces bytes `off..off + len` of the contributions (all-reduce
                // and reduce: its n-th of the block; reduce-scatter: its own block), keeps
                // the result at `res + (pos - off)` of its receive buffer (`None`: a reduce's
                // non-root keeps nothing) and writes it at `pos` into `to_peer` peers'.
                let (off, len) = match shape.kind {
                    CollKind::ReduceScatter => (me * block, block),
                    _ => algos::segments(shape.count, n, shape.elem())[me],
                };
                let res = match shape.kind {
                    CollKind::ReduceScatter if shape.in_place => Some(off),
                    CollKind::ReduceScatter => Some(0),
                    CollKind::Reduce if me != shape.root => None,
                    _ => Some(off),
                };
                let to_peer = |p: usize| match shape.kind {
                    CollKind::AllReduce => true,
                    CollKind::Reduce => p == shape.root,
                    _ => false,
                };
                // The contribution: the send buffer (apart from `out`), else the receive
                // buffer (in place).
                let input = match own_at {
                    Own::Send => *send,
                    Own::Recv(_) => None,
                };
                // Staging for operands that are not readable in place, made on first need.
                let (mut acc, mut tmp) = (Vec::new(), Vec::new());
                let mut at = 0;
                while at < len {
                    let m = CHUNK.min(len - at);
                    let pos = off + at;
                    // Where the result stays here: the receive buffer, or the staging buffer.
                    let here = res.map(|r| r + at);
                    let fold = |dst: &mut [u8], ops: &[&[u8]]| -> Result<()> {
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
                    // Every operand readable in place (this rank's own input apart from its
                    // receive buffer, the peers' in mapped pool blocks), and a result that
                    // stays in the caches: reduce straight into the receive buffer.
                    let own = match input {
                        Some(s) => Some(s.get(pos..pos + m).ok_or_else(|| {
                            Error::internal("a one-sided contribution outside its buffer")
                        })?),
                        None => None,
                    };
                    if (stream || here.is_none()) && acc.is_empty() {
                        acc = vec![0u8; CHUNK.min(len)];
                    }
                    let direct = own.and_then(|own| {
                        board.with_inputs(slot, pos, m, own, |ops| match here {
                            Some(h) if !stream => fold(&mut out[h..h + m], ops),
                            _ => fold(&mut acc[..m], ops),
                        })
                    });
                    if let Some(folded) = direct {
                        folded?;
                        // Results that do not fit the caches are made in a cache-sized staging
                        // buffer and streamed out from there.
                        let dst: &[u8] = match here {
                            Some(h) if stream => {
                                reduce::copy_streaming(&mut out[h..h + m], &acc[..m])?;
                                &acc[..m]
                            }
                            Some(h) => &out[h..h + m],
                            None => &acc[..m],
                        };
                        for p in peers().filter(|&p| to_peer(p)) {
                            board
                                .write_peer_output(signals, j, p, pos, dst, stream)
                                .map_err(|e| waiter.read_failed(p, e))?;
                        }
                        at += m;
                        continue;
                    }
                    // Two ranks, the peer's contribution on the heap: its chunk comes in with
                    // cross-memory attach and is reduced with this rank's own where that lies,
                    // straight into the result when it stays in the caches (no copy of this
                    // rank's chunk into the staging buffer first, and none out of it).
                    // Passing the pieces through the board's slot data instead (16 KiB pieces,
                    // a counter handshake per piece, no attach) was faster on a pair of cores
                    // of its own: 16.2-16.9 against 21.3-21.7 ms at 64 MiB, 64.7-65.5 against
                    // 82.6-84.4 ms at 256 MiB (pinned, `chrt -f 10`, load 18); but every piece
                    // waits for the peer, and a rank that loses its core stalls it once per
                    // piece: a checked 64 MiB test ran past 240 s at load 37.
                    if n == 2 && board.header(1 - me, slot).input_loc == 0 {
                        let p = 1 - me;
                        if tmp.is_empty() {
                            tmp = vec![0u8; CHUNK.min(len)];
                        }
                        board
                            .read_peer(p, Side::Input, slot, pos, &mut tmp[..m], false)
                            .map_err(|e| waiter.read_failed(p, e))?;
                        let theirs = &tmp[..m];
                        // Rank order, as everywhere.
                        let ops = |mine| {
                            if me == 0 {
                                [mine, theirs]
                            } else {
                                [theirs, mine]
                            }
                        };
                        let dst: &[u8] = match (own, here) {
                            (Some(mine), Some(h)) if !stream => {
                                fold(&mut out[h..h + m], &ops(mine))?;
                                &out[h..h + m]
                            }
                            _ => {
                                if acc.is_empty() {
                                    acc = vec![0u8; CHUNK.min(len)];
                                }
                                // In place the contribution is the receive buffer, whose
                                // bytes `pos..pos + m` this rank overwrites only after this.
                                let mine = match own {
                                    Some(own) => own,
                                    None => &out[pos..pos + m],
                                };
                                fold(&mut acc[..m], &ops(mine))?;
                                if let Some(h) = here {
                                    put(&mut out[h..h + m], &acc[..m], stream)?;
                                }
                                &acc[..m]
                            }
                        };
                        if to_peer(p) {
                            board
                                .write_peer_output(signals, j, p, pos, dst, stream)
                                .map_err(|e| waiter.read_failed(p, e))?;
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
                        if p != me {
                            let mapped =
                                board.with_peer(p, Side::Input, slot, pos, m, |src| match p {
                                    0 => {
                                        acc.copy_from_slice(src);
                                        Ok(())
                                    }
                                    _ => reduce::reduce_into(shape.dtype, shape.op, acc, src),
                                });
                            if let Some(r) = mapped {
                                r?;
                                continue;
                            }
                        }
                        let dst: &mut [u8] = if p == 0 { acc } else { tmp };
                        if p == me {
                            // In place the contribution is the receive buffer, whose bytes
                            // `pos..pos + m` this rank overwrites only after this read.
                            let src = match own {
                                Some(own) => own,
                                None => &out[pos..pos + m],
                            };
                            dst.copy_from_slice(src);
                        } else {
                            board
                                .read_peer(p, Side::Input, slot, pos, dst, false)
                                .map_err(|e| waiter.read_failed(p, e))?;
                        }
                        if p > 0 {
                            reduce::reduce_into(shape.dtype, shape.op, acc, tmp)?;
                        }
                    }
                    if shape.op == ReduceOp::Avg {
                        reduce::finish_avg(shape.dtype, acc, n)?;
                    }
                    match here {
                        Some(h) if stream => reduce::copy_streaming(&mut out[h..h + m], acc)?,
                        Some(h) => out[h..h + m].copy_from_slice(acc),
                        None => {}
                    }
                    for p in peers().filter(|&p| to_peer(p)) {
                        board
                            .write_peer_output(signals, j, p, pos, acc, stream)
                            .map_err(|e| waiter.read_failed(p, e))?;
                    }
                    at += m;
                }
            }
            CollKind::AllGather => {
                let pos = me * block;
                if shape.in_place {
                    fan_out(board, pos, &out[pos..pos + block])?;
                } else {
                    let own = send.and_then(|s| s.get(..block)).ok_or_else(|| {
                        Error::internal("a one-sided contribution outside its buffer")
                    })?;
                    // Each piece goes to the peers right after this rank copied it, while it
                    // is still in the cache.
                    for (i, chunk) in own.chunks(COPY_CHUNK).enumerate() {
                        let at = pos + i * COPY_CHUNK;
                        put(&mut out[at..at + chunk.len()], chunk, stream)?;
                        fan_out(board, at, chunk)?;
                    }
                }
            }
            CollKind::Gather => {
                // Each non-root writes its block into the root's result: the copying is
                // shared by the non-roots instead of done by the root alone.
                let pos = me * block;
                let outside = || Error::internal("a one-sided contribution outside its buffer");
                if me == shape.root {
                    // In place the root's block is in its result already.
                    if let Own::Send = own_at {
                        let own = send.and_then(|s| s.get(..block)).ok_or_else(outside)?;
                        put(&mut out[pos..pos + block], own, stream)?;
                    }
                } else {
                    let own = match own_at {
                        Own::Send => send.and_then(|s| s.get(..block)),
                        Own::Recv(at) => out.get(at..at + block),
                    }
                    .ok_or_else(outside)?;
                    for (i, chunk) in own.chunks(COPY_CHUNK).enumerate() {
                        board
                            .write_peer_output(
                                signals,
                                j,
                                shape.root,
                                pos + i * COPY_CHUNK,
                                chunk,
                                stream,
                            )
                            .map_err(|e| waiter.read_failed(shape.root, e))?;
                    }
                }
            }
            CollKind::Broadcast => {
                // The root does not idle: it writes the last n-th of the buffer into every
                // non-root while they copy the rest.
                let e = shape.elem();
                let cut = block - block / n / e * e;
                if me == shape.root && n == 2 {
                    // One peer: nothing to gain from cache-sized chunks (each is written once),
                    // and each costs a system call on the heap.
                    board
                        .write_peer_output(signals, j, 1 - me, cut, &out[cut..block], stream)
                        .map_err(|e| waiter.read_failed(1 - me, e))?;
                } else if me == shape.root {
                    fan_out(board, cut, &out[cut..block])?;
                } else {
                    board
                        .read_peer(shape.root, Side::Output, slot, 0, &mut out[..cut], stream)
                        .map_err(|e| waiter.read_failed(shape.root, e))?;
                }
            }
            CollKind::Scatter => {
                // The non-roots read their blocks while the root copies its own into its
                // result; in place (the root's block is there already) the root writes the
                // last n-th of every non-root's block into it instead, as the broadcast does,
                // so that each rank copies about as much as the others.
                let e = shape.elem();
                let cut = if shape.in_place {
                    block - block / n / e * e
                } else {
                    block
                };
                if me == shape.root {
                    let outside = || Error::internal("a one-sided contribution outside its buffer");
                    let all: &[u8] = match own_at {
                        Own::Send => send.and_then(|s| s.get(..n * block)).ok_or_else(outside)?,
                        Own::Recv(_) => &out[..n * block],
                    };
                    for p in peers() {
                        let src = &all[p * block + cut..(p + 1) * block];
                        for (i, chunk) in src.chunks(COPY_CHUNK).enumerate() {
                            board
                                .write_peer_output(
                                    signals,
                                    j,
                                    p,
                                    cut + i * COPY_CHUNK,
                                    chunk,
                                    stream,
                                )
                                .map_err(|e| waiter.read_failed(p, e))?;
                        }
                    }
                    // In place the root's block is in its result already.
                    if let Own::Send = own_at {
                        let own = send
                            .and_then(|s| s.get(me * block..(me + 1) * block))
                            .ok_or_else(outside)?;
                        put(&mut out[..block], own, stream)?;
                    }
                } else {
                    board
                        .read_peer(
                            shape.root,
                            Side::Input,
                            slot,
                            me * block,
                            &mut out[..cut],
                            stream,
                        )
                        .map_err(|e| waiter.read_failed(shape.root, e))?;
                }
            }
            CollKind::AllToAll => {
                // Each pair of ranks splits the two blocks it exchanges: the lower rank moves
                // the first half of both (reading the peer's block for it, writing its own
                // into the peer's result), the higher rank the second half. No byte is
                // touched by two ranks, and in place a rank reads each piece of the peer's
                // block before it writes its own there.
                let e = shape.elem();
                let half = block / e / 2 * e;
                let outside = || Error::internal("a one-sided contribution outside its buffer");
                let input = match own_at {
                    Own::Send => Some(send.and_then(|s| s.get(..n * block)).ok_or_else(outside)?),
                    Own::Recv(_) => None,
                };
                if let Some(input) = input {
                    put(
                        &mut out[me * block..(me + 1) * block],
                        &input[me * block..(me + 1) * block],
                        stream,
                    )?;
                }
                // Small blocks out of place: each rank writes its whole block for each peer
                // into the peer's result, one transfer per peer instead of two (a read and a
                // write of half a block).
                let whole = input.filter(|_| block <= ALLTOALL_WHOLE);
                if let Some(input) = whole {
                    for p in peers() {
                        board
                            .write_peer_output(
                                signals,
                                j,
                                p,
                                me * block,
                                &input[p * block..(p + 1) * block],
                                stream,
                            )
                            .map_err(|e| waiter.read_failed(p, e))?;
                    }
                }
                let mut tmp = Vec::new();
                for p in peers().filter(|_| whole.is_none()) {
                    let (lo, hi) = if me < p { (0, half) } else { (half, block) };
                    let mut at = lo;
                    while at < hi {
                        let m = COPY_CHUNK.min(hi - at);
                        let mine = p * block + at;
                        let theirs = me * block + at;
                        match input {
                            Some(input) => {
                                board
                                    .read_peer(
                                        p,
                                        Side::Input,
                                        slot,
                                        theirs,
                                        &mut out[mine..mine + m],
                                        stream,
                                    )
                                    .map_err(|e| waiter.read_failed(p, e))?;
                                board
                                    .write_peer_output(
                                        signals,
                                        j,
                                        p,
                                        theirs,
                                        &input[mine..mine + m],
                                        stream,
                                    )
                                    .map_err(|e| waiter.read_failed(p, e))?;
                            }
                            None => {
                                if tmp.is_empty() {
                                    tmp = vec![0u8; COPY_CHUNK.min(block)];
                                }
                                let got = &mut tmp[..m];
                                board
                                    .read_peer(p, Side::Input, slot, theirs, got, false)
                                    .map_err(|e| waiter.read_failed(p, e))?;
                                board
                                    .write_peer_output(
                                        signals,
                                        j,
                                        p,
                                        theirs,
                                        &out[mine..mine + m],
                                        stream,
                                    )
                                    .map_err(|e| waiter.read_failed(p, e))?;
                                put(&mut out[mine..mine + m], got, stream)?;
                            }
                        }
                        at += m;
                    }
                }
            }
            _ => {
                return Err(Error::internal(format!(
                    "{} has no large one-sided algorithm",
                    shape.kind.name()
                )))
            }
        }
        self.publish(waiter.engine, Ctr::Done, j);
        // Nobody returns (and releases its buffers) while a peer may still read them or write
        // its results into them. A broadcast's and a scatter's non-roots have nothing anyone
        // reads, and only the root writes into them; a gather's non-roots have nothing anyone
        // reads or writes.
        let waits_for = |p: usize| match shape.kind {
            CollKind::Broadcast | CollKind::Scatter if me != shape.root => p == shape.root,
            CollKind::Gather => me == shape.root,
            _ => true,
        };
        for p in peers().filter(|&p| waits_for(p)) {
            waiter.wait(p, Ctr::Done, j)?;
        }
        Ok(())
    }
}

/// Copies `src` into `dst`, with non-temporal stores when `stream`.
fn put(dst: &mut [u8], src: &[u8], stream: bool) -> Result<()> {
    if stream {
        reduce::copy_streaming(dst, src)
    } else {
        dst.copy_from_slice(src);
        Ok(())
    }
}

/// This rank's result of a call of `shape` from every rank's contribution `c(p)` (of
/// `contribution_len(shape, p)` bytes), into `out`.
fn compute<'c>(
    shape: &Shape,
    me: usize,
    out: &mut [u8],
    c: impl Fn(usize) -> Result<&'c [u8]>,
) -> Result<()> {
    let n = shape.size;
    let block = shape.count * shape.elem();
    let fold = |dst: &mut [u8], at: usize| -> Result<()> {
        dst.copy_from_slice(&c(0)?[at..at + dst.len()]);
        for p in 1..n {
            reduce::reduce_into(shape.dtype, shape.op, dst, &c(p)?[at..at + dst.len()])?;
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
        CollKind::Broadcast if me != shape.root => out[..block].copy_from_slice(c(shape.root)?),
        CollKind::AllGather => {
            for p in 0..n {
                out[p * block..(p + 1) * block].copy_from_slice(c(p)?);
            }
        }
        CollKind::Gather if me == shape.root => {
            for p in 0..n {
                out[p * block..(p + 1) * block].copy_from_slice(c(p)?);
            }
        }
        CollKind::Scatter if !(me == shape.root && shape.in_place) => {
            out[..block].copy_from_slice(&c(shape.root)?[me * block..(me + 1) * block]);
        }
        CollKind::AllToAll => {
            for p in 0..n {
                out[p * block..(p + 1) * block]
                    .copy_from_slice(&c(p)?[me * block..(me + 1) * block]);
            }
        }
        _ => {}
    }
    Ok(())
}

/// How one call waits for its peers' counters.
struct Waiter<'a> {
    os: &'a OneSided,
    /// The communicator (its `HCOMM_TIMEOUT` is looked up once a wait must sleep).
    comm: &'a dyn Group,
    engine: &'a Engine,
    /// The id the communicator's collective frames carry.
    coll_id: u64,
    tag: u32,
    /// The call's number.
    call: u64,
    /// The call's signature.
    sig: [u64; 2],
    /// How its waits back off.
    policy: &'static Backoff,
    /// `HCOMM_TIMEOUT` from the first wait that had to sleep (reading the clock costs as
    /// much as a whole small call); set once the call is registered with the engine.
    deadline: OnceCell<Instant>,
}

impl Waiter<'_> {
    /// What a failed read of rank `p`'s memory means: `p` abandoned the call, and may have
    /// freed the buffers once it said so (found by the kill-to-error test: a survivor read a
    /// buffer that another survivor had freed on its way out, and reported `EFAULT`); `p`
    /// died; or, when neither, the read's own error. Each names `p` as its peer.
    fn read_failed(&self, p: usize, err: Error) -> Error {
        let who = PeerRank::ranks(p, self.os.world[p]);
        if matches!(err, Error::PeerLost(_)) {
            return err.with_peer(who);
        }
        if self.abandoned(p) {
            return Error::aborted(format!(
                "rank {p} abandoned this collective after an error while this rank read its \
                 buffers; see that rank's error"
            ))
            .with_peer(who)
            .with_cause(err);
        }
        match self.engine.check_peer(self.os.world[p]) {
            Err(lost) => lost.with_peer(who),
            Ok(()) => err.with_peer(who),
        }
    }

    /// Fails if a peer abandoned this call, which it may have done before this rank read its
    /// buffers (a rank stopped, then resumed after the others gave the call up and freed
    /// them): the data read may not be the peer's. A peer says so before it frees anything,
    /// so a call that finds none has read only live buffers.
    fn none_abandoned(&self, n: usize) -> Result<()> {
        match (0..n).find(|&p| p != self.os.me && self.abandoned(p)) {
            None => Ok(()),
            Some(p) => Err(self.abandonment(p)),
        }
    }

    /// The error of this call, which rank `p` abandoned: the loss of the rank that made it
    /// (a peer's abandonment is its consequence), else the abandonment.
    fn abandonment(&self, p: usize) -> Error {
        let cause = self
            .os
            .signals
            .counter(p, Ctr::Cause)
            .load(Ordering::Relaxed);
        match cause.checked_sub(1).map(|w| w as usize) {
            Some(w) => Error::peer_lost(
                match self.os.world.iter().position(|&x| x == w) {
                    Some(r) => PeerRank::ranks(r, w),
                    None => PeerRank::world(w),
                },
                format!(
                    "world rank {w} is unreachable: world rank {} abandoned this collective on \
                     losing it; look at the output of world rank {w} (did it exit or crash?)",
                    self.os.world[p]
                ),
            ),
            None => Error::aborted(format!(
                "rank {p} abandoned this collective after an error; see that rank's error"
            ))
            .with_peer(PeerRank::ranks(p, self.os.world[p])),
        }
    }

    /// Whether rank `p` abandoned this call after starting it.
    fn abandoned(&self, p: usize) -> bool {
        self.os
            .signals
            .counter(p, Ctr::Failed)
            .load(Ordering::Acquire)
            >= self.call
    }

    /// Waits until rank `p`'s counter `which` reaches `target`.
    fn wait(&self, p: usize, which: Ctr, target: u64) -> Result<()> {
        self.wait_on(p, self.os.signals.counter(p, which), target)
    }
    /// Waits until `ctr`, a counter of rank `p`, reaches `target`.
    fn wait_on(&self, p: usize, ctr: &AtomicU64, target: u64) -> Result<()> {
        let ready = || ctr.load(Ordering::Acquire) >= target;
        if ready() {
            return Ok(());
        }
        // Spinning (when this rank has a core to itself), then yielding. The policy's looks
        // without a pause come first, without its bookkeeping (a wait they serve teaches the
        // thread's next waits as a `Waiting` would, unless within the first `QUIET_LOOKS`),
        // then the rest of its spin, counted from there. In an 8-byte broadcast of 2 ranks
        // pinned one per core, half the waits see the line at the first look; of the others
        // 1 in 100 end within 64 looks, 12 (one rank) and 42 (the other) within 256, the rest
        // mostly by 1024. With 64 looks outside the policy, every wait past them also set up
        // and ended a `Waiting` (30 interleaved rounds, medians: 0.2460 µs with 64, 0.2380
        // with these, 0.2335 at a27d6a5).
        let eager = self.policy.eager_polls.min(self.policy.polls);
        if self.os.spin {
            if let Some(look) = (0..eager).position(|_| ready()) {
                if look >= QUIET_LOOKS as usize {
                    Waiting::served_by_looks(*self.policy);
                }
                return Ok(());
            }
        }
        let mut waiting = Waiting::new(*self.policy, self.os.spin);
        if self.os.spin {
            waiting.looked(eager);
        }
        if waiting.spin_until(ready) {
            return Ok(());
        }
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
        let deadline = *self
            .deadline
            .get_or_init(|| Instant::now() + self.comm.timeout());
        let mut stall = StallWatch::new(Instant::now());
        crate::observe::blocked_on(p);
        loop {
            let now = Instant::now();
            if stall.ask_due(now) {
                engine.ask_members(self.coll_id);
            }
            stall.check(now, || {
                let report = engine.not_entered_report(self.coll_id, self.tag);
                format!(
                    "rank {p} (world rank {}) [one-sided call {target}]{}",
                    self.os.world[p],
                    report.as_deref().unwrap_or_default()
                )
            });
            if now >= deadline {
                return Err(Error::timeout(format!(
                    "rank {p} has not reached this collective (one-sided call {target}) within \
                     HCOMM_TIMEOUT; it may be stuck, slow, or calling something else"
                ))
                .with_peer(PeerRank::ranks(p, self.os.world[p])));
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
            // Before the peer's loss too: a peer that abandoned the call and left says why.
            if !ready() && self.abandoned(p) {
                return Err(self.abandonment(p));
            }
            if let Err(e) = peer {
                // The peer may have reached the line and then finalized (its goodbye comes
                // through its ring within microseconds): what it wrote before it left counts.
                return if ready() { Ok(()) } else { Err(e) };
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
#[inline]
fn check_peer_call(
    shape: &Shape,
    sig: [u64; 2],
    p: usize,
    theirs: [u64; 2],
    len: u64,
) -> Result<()> {
    let want = contribution_len(shape, p);
    if theirs != sig || len != want as u64 {
        return Err(peer_mismatch(sig, p, theirs, len, want));
    }
    Ok(())
}

/// The error of a peer `p` whose call (signature `theirs`, contributing `len` bytes) is not
/// this rank's (`sig`, `want` bytes from `p`).
#[cold]
fn peer_mismatch(sig: [u64; 2], p: usize, theirs: [u64; 2], len: u64, want: usize) -> Error {
    let what = if theirs != sig {
        format!(
            "this rank called {} but rank {p} called {}: every rank must call the same \
             collectives in the same order with the same type, op, count and root",
            Shape::describe_signature(sig),
            Shape::describe_signature(theirs)
        )
    } else {
        format!(
            "rank {p} contributes {len} bytes to {} where {want} were expected",
            Shape::describe_signature(sig)
        )
    };
    Error::mismatch(what).with_peer(PeerRank::comm(p))
}

/// The error of a mismatch found at the call after the mismatched one, which this rank had
/// returned from early.
#[cold]
fn late_mismatch(e: Error) -> Error {
    match e {
        Error::Mismatch(mut info) => {
            info.message = format!(
                "the previous collective on this communicator: {} (this rank's part of it \
                 needed nothing from its peers, so it returned before they called; found at \
                 this call, which ran)",
                info.message
            );
            Error::Mismatch(info)
        }
        other => other,
    }
}

/// Whether rank `me`'s result of a call of `shape` needs nothing of its peers' contributions:
/// a broadcast's or scatter's root, a gather's or reduce's other ranks.
#[inline]
fn needs_no_peer(shape: &Shape, me: usize) -> bool {
    match shape.kind {
        CollKind::Broadcast | CollKind::Scatter => me == shape.root,
        CollKind::Gather | CollKind::Reduce => me != shape.root,
        _ => false,
    }
}

/// Whether collective `kind` has a large one-sided algorithm (contributions beyond a slot).
fn has_large(kind: CollKind) -> bool {
    matches!(
        kind,
        CollKind::AllReduce
            | CollKind::ReduceScatter
            | CollKind::Reduce
            | CollKind::AllGather
            | CollKind::Gather
            | CollKind::Broadcast
            | CollKind::Scatter
            | CollKind::AllToAll
    )
}

/// Bytes rank `rank` contributes to a call of `shape`.
#[inline]
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

/// The largest contribution of any rank: the root's in broadcast and scatter (the others
/// contribute nothing), any rank's in the others (all contribute alike).
#[inline]
fn max_contribution(shape: &Shape) -> usize {
    match shape.kind {
        CollKind::Broadcast | CollKind::Scatter => contribution_len(shape, shape.root),
        _ => contribution_len(shape, 0),
    }
}

/// Where this rank's contribution lies, and its length.
#[inline]
fn contribution(shape: &Shape, rank: usize, bufs: &Buffers<'_>) -> (Own, usize) {
    let len = contribution_len(shape, rank);
    let from_recv =
        shape.kind == CollKind::Broadcast || shape.in_place_at(rank) || bufs.send.is_none();
    if !from_recv {
        return (Own::Send, len);
    }
    let at = match shape.kind {
        CollKind::AllGather | CollKind::Gather if shape.in_place_at(rank) => {
            rank * shape.count * shape.elem()
        }
        _ => 0,
    };
    (Own::Recv(at), len)
}
