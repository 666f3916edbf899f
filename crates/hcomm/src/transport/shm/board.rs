//! The board of the one-sided collectives: every member of a communicator on this host maps
//! every member's small segment, laid out as [`Segment`], and reads its peers' published
//! buffers in place (their mapped pool blocks) or with cross-memory attach.
//!
//! This module owns that memory. Every access to it goes through the safe calls here, which
//! check bounds and the layout: the counters and call numbers are atomics ([`Signals`]); a
//! rank writes only its own segment ([`Board::publish_header`], [`Board::publish_data`],
//! [`Board::publish_tiny`]) and reads its peers' (headers by value, contributions lent to a
//! closure); a peer's buffer is read into this rank's memory, lent to a closure from its
//! mapped pool block, or written only where the peer published its receive buffer for the
//! call under way ([`Board::write_peer_output`]). Who writes what when is the protocol of
//! `coll::onesided`, which runs on these calls with no unsafe code of its own.
//!
//! Bytes shared with other processes may change under a reader when a peer breaks the
//! protocol (a bug there, or memory corruption); the reader then sees wrong values, never
//! memory outside the mappings: every range is checked against the mapping it lies in.

use std::mem::offset_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap as HashMap;

use super::cma;
use super::segment::{segment_name, ShmSegment};
use crate::error::{Error, Result};
use crate::reduce;
use crate::sync::lock;

/// Bytes of each slot's data: the largest contribution that goes inline.
pub(crate) const SLOT: usize = 32 << 10;
/// Largest contribution of a tiny call: it travels in one cache line with its call number.
pub(crate) const TINY_MAX: usize = 32;
/// Bytes of each staging area: a large call's pieces passed through shared memory (the two
/// slots' data, which no large call uses otherwise, split in [`STAGES`] areas).
pub(crate) const STAGE: usize = SLOT / 2;
/// Staging areas of a segment.
pub(crate) const STAGES: usize = 4;

/// What a rank tells its peers about one call, in the slot's header.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Header {
    pub sig: [u64; 2],
    /// Bytes of the contribution.
    pub len: u64,
    /// Address of the contribution in the rank's memory.
    pub input: u64,
    /// Address of the receive buffer in the rank's memory.
    pub output: u64,
    /// Where the contribution lies in the rank's shared-memory pool (see [`pool_loc`]).
    pub input_loc: u64,
    /// Where the receive buffer lies in the rank's shared-memory pool.
    pub output_loc: u64,
    /// Bytes of the receive buffer.
    pub output_len: u64,
}

const _: () = assert!(size_of::<Header>() <= 64);

/// A pool location in a header: `(block + 1) << 40 | offset`, 0 for heap memory; `located`
/// is what [`ShmPool::locate`](super::pool::ShmPool::locate) found.
pub(crate) fn pool_loc(located: Option<(usize, usize)>) -> u64 {
    located
        .filter(|&(block, offset)| block < 1 << 23 && offset < 1 << 40)
        .map_or(0, |(block, offset)| {
            ((block as u64 + 1) << 40) | offset as u64
        })
}

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

/// A rank's segment, which every member maps:
///
/// ```text
/// 0    seq    (AtomicU64): number of the last one-sided call this rank started
/// 64   failed (AtomicU64): last call this rank abandoned after starting it
/// 128  cause  (AtomicU64): 1 + the world rank whose loss made it abandon that call, else 0
/// 192  no_cma (AtomicU64): first call from which cross-memory attach on this rank's buffers
///      may be refused (it turned non-dumpable, or a transfer of its was refused), else 0
/// 256  done   (AtomicU64): last call whose peers' buffers this rank has finished reading
/// 320  stage  (AtomicU64): progress of a staged call (see `Ctr::Stage`)
/// 384  header of slot 0 | 448 header of slot 1: signature, lengths, buffer addresses
/// 512  data of slot 0 (SLOT bytes) | data of slot 1 (SLOT bytes); a large call may use both
///      as STAGES staging areas of STAGE bytes instead
/// then tiny slot 0 | tiny slot 1: one cache line each (call number, signature, length and
///      up to 32 bytes of contribution)
/// ```
///
/// Never referenced as a whole: the peers write parts of it meanwhile; its fields are
/// reached through pointers.
#[repr(C)]
struct Segment {
    seq: Counter,
    failed: Counter,
    cause: Counter,
    no_cma: Counter,
    done: Counter,
    stage: Counter,
    headers: [HeaderLine; 2],
    data: [[u8; SLOT]; 2],
    tiny: [Tiny; 2],
}

/// Bytes of a board segment.
pub(crate) const SEG_LEN: usize = size_of::<Segment>();
const _: () = {
    assert!(offset_of!(Segment, done) == 256);
    assert!(offset_of!(Segment, headers) == 384);
    assert!(offset_of!(Segment, data) == 512);
    assert!(SEG_LEN == 512 + 2 * SLOT + 2 * 64);
};

/// The counters of a segment.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ctr {
    /// The last call the rank started.
    Seq,
    /// The last call the rank abandoned after starting it (its peers must not wait for it).
    Failed,
    /// Why it abandoned that call: 1 + the world rank whose loss made it, else 0 (written
    /// before `Failed`).
    Cause,
    /// The first call from which cross-memory attach to or from the rank may be refused
    /// (written once, before that call's `Seq`), else 0.
    NoCma,
    /// The last call whose peers' buffers the rank has finished reading.
    Done,
    /// Progress of the rank in a staged call (pieces passed through the staging areas), set
    /// anew before the rank publishes such a call: what the protocol of `coll::onesided`
    /// puts there.
    Stage,
}

/// Which of a peer's published buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The contribution (`Header::input`).
    Input,
    /// The receive buffer (`Header::output`).
    Output,
}

/// The field at `offset` of a segment (checked at creation to hold a whole `Segment`).
fn field<T>(seg: &ShmSegment, offset: usize) -> *mut T {
    seg.as_ptr().wrapping_add(offset).cast()
}

/// The counters and call numbers of every member's segment: what waiting ranks watch.
pub(crate) struct Signals {
    segs: Arc<[ShmSegment]>,
}

impl Signals {
    /// Rank `rank`'s counter `which`.
    pub(crate) fn counter(&self, rank: usize, which: Ctr) -> &AtomicU64 {
        let offset = match which {
            Ctr::Seq => offset_of!(Segment, seq),
            Ctr::Failed => offset_of!(Segment, failed),
            Ctr::Cause => offset_of!(Segment, cause),
            Ctr::NoCma => offset_of!(Segment, no_cma),
            Ctr::Done => offset_of!(Segment, done),
            Ctr::Stage => offset_of!(Segment, stage),
        };
        let ctr = field::<Counter>(&self.segs[rank], offset);
        // SAFETY: every segment holds a `Segment` (checked in `Board::new`; the mapping is
        // 128-byte aligned) and lives as long as `self`; a counter is an atomic, any bit
        // pattern of which is valid, shared between processes.
        unsafe { &(*ctr).0 }
    }

    /// The call number of rank `rank`'s tiny slot `slot`.
    pub(crate) fn tiny_seq(&self, rank: usize, slot: usize) -> &AtomicU64 {
        let line = tiny_line(&self.segs[rank], slot);
        // SAFETY: as in `counter`: `seq` is an atomic of a tiny line inside the segment.
        unsafe { &(*line).seq }
    }

    /// Members of the board.
    pub(crate) fn len(&self) -> usize {
        self.segs.len()
    }
}

fn tiny_line(seg: &ShmSegment, slot: usize) -> *mut Tiny {
    field(
        seg,
        offset_of!(Segment, tiny) + size_of::<Tiny>() * (slot % 2),
    )
}

fn header_ptr(seg: &ShmSegment, slot: usize) -> *mut Header {
    field(
        seg,
        offset_of!(Segment, headers) + size_of::<HeaderLine>() * (slot % 2),
    )
}

fn data_ptr(seg: &ShmSegment, slot: usize) -> *mut u8 {
    field(seg, offset_of!(Segment, data) + SLOT * (slot % 2))
}

fn stage_ptr(seg: &ShmSegment, area: usize) -> *mut u8 {
    field(seg, offset_of!(Segment, data) + STAGE * (area % STAGES))
}
const _: () = assert!(STAGE * STAGES == size_of::<[[u8; SLOT]; 2]>());

/// Where the members of one communicator publish their calls, and the way to their buffers.
pub(crate) struct Board {
    me: usize,
    segs: Arc<[ShmSegment]>,
    /// World rank of each member.
    world: Vec<usize>,
    /// Process id of each member (the peers' are other processes: checked in `new`).
    pids: Vec<u32>,
    /// The job id of the segment names.
    job: String,
    /// Ranks of the world on this host: the processes that map each pool block.
    local_ranks: u32,
    /// The peers' pool blocks mapped so far, by (rank, block); `None`: it cannot be mapped.
    /// Entries are never removed, so a mapping lives as long as the board.
    blocks: Mutex<HashMap<(usize, usize), Option<ShmSegment>>>,
}

/// What a [`Board`] is made of.
pub(crate) struct BoardSetup {
    /// This rank in the communicator.
    pub me: usize,
    /// Every member's segment (of [`SEG_LEN`] bytes), this rank's included, by rank.
    pub segs: Vec<ShmSegment>,
    /// World rank of each member.
    pub world: Vec<usize>,
    /// Process id of each member.
    pub pids: Vec<u32>,
    /// The job id of the segment names.
    pub job: String,
    /// Ranks of the world on this host.
    pub local_ranks: u32,
}

impl Board {
    /// The board over `setup`'s segments, and the signals of the same segments.
    pub(crate) fn new(setup: BoardSetup) -> Result<(Board, Signals)> {
        let n = setup.segs.len();
        if setup.me >= n || setup.world.len() != n || setup.pids.len() != n {
            return Err(Error::internal("a one-sided board of inconsistent sizes"));
        }
        if let Some(seg) = setup.segs.iter().find(|s| s.len() < SEG_LEN) {
            return Err(Error::internal(format!(
                "one-sided segment {} holds {} bytes, not {SEG_LEN}",
                seg.name(),
                seg.len()
            )));
        }
        let own = std::process::id();
        if (0..n).any(|p| p != setup.me && setup.pids[p] == own) {
            return Err(Error::internal("a one-sided peer has this process's id"));
        }
        let segs: Arc<[ShmSegment]> = setup.segs.into();
        let signals = Signals {
            segs: Arc::clone(&segs),
        };
        let board = Board {
            me: setup.me,
            segs,
            world: setup.world,
            pids: setup.pids,
            job: setup.job,
            local_ranks: setup.local_ranks,
            blocks: Mutex::new(HashMap::default()),
        };
        Ok((board, signals))
    }

    /// Writes this rank's header of slot `slot` (before it publishes the call).
    pub(crate) fn publish_header(&mut self, slot: usize, header: Header) {
        let at = header_ptr(&self.segs[self.me], slot);
        // SAFETY: the header lies in this rank's own segment (checked length), which only this
        // rank writes; `&mut self` rules out another writer in this process; peers read it
        // only after the call's number is published.
        unsafe { at.write_volatile(header) };
    }

    /// Writes this rank's contribution into the data of slot `slot` (at most [`SLOT`] bytes).
    pub(crate) fn publish_data(&mut self, slot: usize, src: &[u8]) -> Result<()> {
        if src.len() > SLOT {
            return Err(Error::internal(format!(
                "a one-sided contribution of {} bytes does not fit a slot",
                src.len()
            )));
        }
        let at = data_ptr(&self.segs[self.me], slot);
        // SAFETY: `src.len() <= SLOT` bytes of this rank's own slot data, as in
        // `publish_header`; `src` is this process's memory outside the segment (the board
        // lends none of its own segment's bytes while borrowed mutably).
        unsafe { at.copy_from_nonoverlapping(src.as_ptr(), src.len()) };
        Ok(())
    }

    /// Writes this rank's tiny line of slot `slot` (signature, contribution of at most
    /// [`TINY_MAX`] bytes), then its call number `call` with release ordering.
    pub(crate) fn publish_tiny(
        &mut self,
        slot: usize,
        sig: [u64; 2],
        src: &[u8],
        call: u64,
    ) -> Result<()> {
        if src.len() > TINY_MAX {
            return Err(Error::internal(format!(
                "a tiny one-sided contribution of {} bytes",
                src.len()
            )));
        }
        let line = tiny_line(&self.segs[self.me], slot);
        // SAFETY: the line lies in this rank's own segment, as in `publish_header`; peers read
        // it only after `seq` says `call` (stored last, with release ordering).
        unsafe {
            std::ptr::addr_of_mut!((*line).sig).write_volatile(sig);
            std::ptr::addr_of_mut!((*line).len).write_volatile(src.len() as u64);
            std::ptr::addr_of_mut!((*line).data)
                .cast::<u8>()
                .copy_from_nonoverlapping(src.as_ptr(), src.len());
            (*line).seq.store(call, Ordering::Release);
        }
        Ok(())
    }

    /// Copies `src` (at most [`STAGE`] bytes) into this rank's staging area `area`, for a
    /// peer to read once told.
    pub(crate) fn stage_in(&mut self, area: usize, src: &[u8]) -> Result<()> {
        if src.len() > STAGE {
            return Err(beyond_slot(self.me, src.len()));
        }
        let at = stage_ptr(&self.segs[self.me], area);
        // SAFETY: `src.len() <= STAGE` bytes of this rank's own staging area, as in
        // `publish_data`: only this rank writes its segment, `&mut self` rules out another
        // writer (or a lent slice of the segment) in this process, and `src` is not one.
        unsafe { at.copy_from_nonoverlapping(src.as_ptr(), src.len()) };
        Ok(())
    }

    /// Runs `f` on this rank's staging area `own` (to write) and peer `p`'s area `theirs`
    /// (to read), [`STAGE`] bytes each.
    pub(crate) fn with_stages<R>(
        &mut self,
        own: usize,
        p: usize,
        theirs: usize,
        f: impl FnOnce(&mut [u8], &[u8]) -> R,
    ) -> Result<R> {
        if p == self.me || p >= self.segs.len() {
            return Err(Error::internal(format!("no staging area of peer {p}")));
        }
        let mine = stage_ptr(&self.segs[self.me], own);
        let peer = stage_ptr(&self.segs[p], theirs).cast_const();
        // SAFETY: `STAGE` bytes of two different mapped segments (checked length), which live
        // as long as `self`; this rank's own area is written only by this rank, and
        // `&mut self` rules out any other slice of it in this process; the peer's area is
        // written only by the peer, which the protocol keeps off it until this rank is done.
        let (mine, peer) = unsafe {
            (
                std::slice::from_raw_parts_mut(mine, STAGE),
                std::slice::from_raw_parts(peer, STAGE),
            )
        };
        Ok(f(mine, peer))
    }

    /// Peer `p`'s staging area `area` ([`STAGE`] bytes), lent while the board is borrowed.
    pub(crate) fn peer_stage(&self, p: usize, area: usize) -> Result<&[u8]> {
        if p == self.me || p >= self.segs.len() {
            return Err(Error::internal(format!("no staging area of peer {p}")));
        }
        let at = stage_ptr(&self.segs[p], area).cast_const();
        // SAFETY: as in `with_stages`: a peer's area inside its mapped segment.
        Ok(unsafe { std::slice::from_raw_parts(at, STAGE) })
    }

    /// Rank `rank`'s header of slot `slot`.
    pub(crate) fn header(&self, rank: usize, slot: usize) -> Header {
        let at = header_ptr(&self.segs[rank], slot);
        // SAFETY: the header lies in a mapped segment (checked length); every bit pattern is a
        // valid `Header`; the volatile read copies whatever is there.
        unsafe { at.read_volatile() }
    }

    /// Rank `rank`'s tiny line of slot `slot`: its signature and length.
    pub(crate) fn tiny_header(&self, rank: usize, slot: usize) -> ([u64; 2], u64) {
        let line = tiny_line(&self.segs[rank], slot);
        // SAFETY: as in `header`: plain integers of a line inside a mapped segment.
        unsafe {
            (
                std::ptr::addr_of!((*line).sig).read_volatile(),
                std::ptr::addr_of!((*line).len).read_volatile(),
            )
        }
    }

    /// Rank `rank`'s contribution of `len` bytes in slot `slot`: its tiny line (`tiny`) or
    /// its slot data. Lent while the board is borrowed; the caller looks each rank up once per
    /// call, with no allocation.
    #[inline]
    pub(crate) fn contribution(
        &self,
        tiny: bool,
        slot: usize,
        rank: usize,
        len: usize,
    ) -> Result<&[u8]> {
        let cap = if tiny { TINY_MAX } else { SLOT };
        let Some(seg) = self.segs.get(rank).filter(|_| len <= cap) else {
            return Err(beyond_slot(rank, len));
        };
        let at = match tiny {
            true => tiny_line(seg, slot)
                .cast::<u8>()
                .wrapping_add(offset_of!(Tiny, data))
                .cast_const(),
            false => data_ptr(seg, slot).cast_const(),
        };
        // SAFETY: `len <= cap` bytes of a slot inside a mapped segment (checked length), which
        // lives as long as `self`; this process writes slots only through `&mut self`, which
        // this borrow rules out.
        Ok(unsafe { std::slice::from_raw_parts(at, len) })
    }

    /// Where `len` bytes at `pos` of peer `p`'s buffer `side`, published in slot `slot`, are
    /// mapped here: in a pool block of the peer, mapped on first use; `None` for heap
    /// memory, bytes past the published length, or a block that cannot be mapped.
    fn peer_mem(
        &self,
        p: usize,
        side: Side,
        slot: usize,
        pos: usize,
        len: usize,
    ) -> Option<*mut u8> {
        let h = self.header(p, slot);
        let (loc, published) = match side {
            Side::Input => (h.input_loc, h.len),
            Side::Output => (h.output_loc, h.output_len),
        };
        if loc == 0 || p == self.me || pos.checked_add(len)? as u64 > published {
            return None;
        }
        let block = (loc >> 40) as usize - 1;
        let start = (loc & ((1 << 40) - 1)) as usize + pos;
        let end = start.checked_add(len)?;
        let mut blocks = lock(&self.blocks);
        let seg = blocks.entry((p, block)).or_insert_with(|| {
            let opened = segment_name(&self.job, self.world[p] as u32, &format!("pool{block}"))
                .and_then(|name| ShmSegment::open_any(&name));
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
            .filter(|s| end <= s.len())
            .map(|s| s.as_ptr().wrapping_add(start))
    }

    /// Runs `f` on `len` bytes at `pos` of peer `p`'s buffer `side` of slot `slot`, read in
    /// place from its mapped pool block; `None` when they are not in one (see `peer_mem`).
    pub(crate) fn with_peer<R>(
        &self,
        p: usize,
        side: Side,
        slot: usize,
        pos: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let src = self.peer_mem(p, side, slot, pos, len)?;
        // SAFETY: `peer_mem` checked that the bytes lie in a peer's pool block mapped here,
        // which stays mapped while `self` lives; this process writes peers' blocks only
        // through `&mut self`, which this borrow rules out.
        Some(f(unsafe { std::slice::from_raw_parts(src, len) }))
    }

    /// Runs `f` on `len` bytes at `pos` of every rank's contribution (`Side::Input`) in
    /// slot `slot`, read in place: `own` stands for this rank's, the peers' are read from
    /// their mapped pool blocks; `None` unless every peer's are in one.
    pub(crate) fn with_inputs<R>(
        &self,
        slot: usize,
        pos: usize,
        len: usize,
        own: &[u8],
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Option<R> {
        let mut slices: Vec<&[u8]> = Vec::with_capacity(self.segs.len());
        for p in 0..self.segs.len() {
            if p == self.me {
                slices.push(own);
                continue;
            }
            let src = self.peer_mem(p, Side::Input, slot, pos, len)?;
            // SAFETY: as in `with_peer`.
            slices.push(unsafe { std::slice::from_raw_parts(src, len) });
        }
        Some(f(&slices))
    }

    /// Copies `dst.len()` bytes at `pos` of peer `p`'s buffer `side` of slot `slot` into
    /// `dst`: from its mapped pool block, else with cross-memory attach; with non-temporal
    /// stores when `stream`.
    pub(crate) fn read_peer(
        &self,
        p: usize,
        side: Side,
        slot: usize,
        pos: usize,
        dst: &mut [u8],
        stream: bool,
    ) -> Result<()> {
        if let Some(r) = self.with_peer(p, side, slot, pos, dst.len(), |src| put(dst, src, stream))
        {
            return r;
        }
        let h = self.header(p, slot);
        let (addr, published) = match side {
            Side::Input => (h.input, h.len),
            Side::Output => (h.output, h.output_len),
        };
        check_range(p, pos, dst.len(), published)?;
        let at = (addr as usize)
            .checked_add(pos)
            .ok_or_else(|| bad_range(p))?;
        // SAFETY: `pids[p]` is another process (checked in `new`), so the read cannot touch
        // memory of this one; it writes only `dst`, this process's own exclusive slice. What
        // it reads there is the peer's business: an address the peer did not publish gives
        // `EFAULT`, or bytes the peer does not expect to be read.
        unsafe { cma::read_remote(self.pids[p], at, dst) }
    }

    /// Writes `src`, this rank's bytes at `pos` of the result of call `call`, into peer
    /// `p`'s receive buffer: through its mapped pool block, else with cross-memory attach;
    /// with non-temporal stores when `stream`. Refused unless this rank is in call `call`,
    /// the peer has published it, and the bytes lie in the receive buffer it published.
    pub(crate) fn write_peer_output(
        &mut self,
        signals: &Signals,
        call: u64,
        p: usize,
        pos: usize,
        src: &[u8],
        stream: bool,
    ) -> Result<()> {
        let current = signals.counter(self.me, Ctr::Seq).load(Ordering::Acquire) == call
            && signals.counter(p, Ctr::Seq).load(Ordering::Acquire) >= call;
        if !current || p == self.me {
            return Err(Error::internal(format!(
                "a one-sided write into rank {p} outside the call it published"
            )));
        }
        let slot = (call % 2) as usize;
        let h = self.header(p, slot);
        check_range(p, pos, src.len(), h.output_len)?;
        if let Some(dst) = self.peer_mem(p, Side::Output, slot, pos, src.len()) {
            // SAFETY: `peer_mem` checked that the bytes lie in the receive buffer the peer
            // published for call `call` (checked current above), in its pool block mapped
            // here (writable, staying mapped while `self` lives); the peer reserved them for
            // its peers' results until it sees their `done`; `&mut self` rules out any slice
            // of the board lent in this process meanwhile, and `src` is not one.
            let dst = unsafe { std::slice::from_raw_parts_mut(dst, src.len()) };
            return put(dst, src, stream);
        }
        let at = (h.output as usize)
            .checked_add(pos)
            .ok_or_else(|| bad_range(p))?;
        // SAFETY: another process (checked in `new`), into the receive buffer it published
        // for call `call` (checked current above, and the bytes inside it), which it keeps
        // for its peers' results until it sees their `done`.
        unsafe { cma::write_remote(self.pids[p], at, src) }
    }
}

/// Copies `src` into `dst`, with non-temporal stores when `stream`.
fn put(dst: &mut [u8], src: &[u8], stream: bool) -> Result<()> {
    if stream {
        reduce::copy_streaming(dst, src)
    } else if dst.len() == src.len() {
        dst.copy_from_slice(src);
        Ok(())
    } else {
        Err(Error::internal("a one-sided copy between different sizes"))
    }
}

#[cold]
#[inline(never)]
fn beyond_slot(rank: usize, len: usize) -> Error {
    Error::internal(format!(
        "a one-sided contribution of {len} bytes of rank {rank} beyond its slot or the board"
    ))
}

#[cold]
#[inline(never)]
fn bad_range(p: usize) -> Error {
    Error::internal(format!(
        "a one-sided access beyond the buffer rank {p} published"
    ))
}

fn check_range(p: usize, pos: usize, len: usize, published: u64) -> Result<()> {
    match pos.checked_add(len) {
        Some(end) if end as u64 <= published => Ok(()),
        _ => Err(bad_range(p)),
    }
}
