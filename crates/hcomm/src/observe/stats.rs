//! The statistics segment: what a rank has done and is doing, in shared memory that
//! `hcomm_profiler` maps read-only in spirit (it writes only [`StatsHeader::watchers`] and
//! [`StatsHeader::timing`]).
//!
//! One segment per process: an anonymous shared-memory file (`memfd_create`) named
//! `hcomm-<job id>-<rank>-stats`, holding a [`StatsLayout`] (its own magic and version),
//! made with the process's first world and unmapped when its last world closes. It has no
//! name in `/dev/shm`, so nothing is left behind whatever happens to the process (`SIGKILL`
//! included): the kernel frees it with the process. A profiler finds it among the process's
//! open files (`/proc/<pid>/fd/N -> /memfd:hcomm-...-stats`) and maps it through that link,
//! which the kernel allows only to the same user (or root). The job id is the one of the job's
//! first world (`link::job_id(secret, store address, 0)`), so the ranks of a job are found by
//! the names.
//!
//! Writers never wait and never share a cache line with another writer: each thread that
//! runs operations owns a [`Lane`] (claimed at its first operation, given back when it ends)
//! and updates its counters with plain relaxed loads and stores; only threads beyond
//! [`LANES`]` - 1` share the last lane, with atomic additions. Nothing is read by the process
//! itself, so when nobody watches the cost is a few stores to memory of its own; operations
//! are timed (two reads of the TSC) only after a profiler has set [`StatsHeader::timing`].

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use rustix::fd::OwnedFd;
use rustix::mm::{MapFlags, ProtFlags};

use super::clock::{self, TICK_KIND};
use super::{OpKind, OP_KINDS};
use crate::error::{Error, Result};
use crate::sync::lock;
pub use crate::transport::tcp::FailoverCount;

/// `HCSTATS1`: the first eight bytes of a [`StatsLayout`].
pub(crate) const STATS_MAGIC: u64 = u64::from_le_bytes(*b"HCSTATS1");
/// Version of the [`StatsLayout`]; readers refuse others.
pub(crate) const STATS_VERSION: u32 = 4;
/// Lanes of a segment: threads that run operations at the same time, each with counters of
/// its own (the last one is shared by any further threads).
pub const LANES: usize = 32;
/// Slots of the statistics header's `failovers`: the peers and rails that failed over first.
pub const FAILOVER_SLOTS: usize = 16;
/// The last part of the segment's name.
pub(crate) const PURPOSE: &str = "stats";

/// Bits of `KindStats::protocols` and `Flight::protocols`: how an operation's messages
/// travel.
pub mod proto {
    /// Inline through a shared-memory ring.
    pub const SHM_INLINE: u64 = 1;
    /// Pulled by the receiver with cross-memory attach.
    pub const SHM_PULL: u64 = 2;
    /// Pushed by the sender in chunks through a shared-memory ring.
    pub const SHM_PUSH: u64 = 4;
    /// Eager over TCP.
    pub const TCP_EAGER: u64 = 8;
    /// Rendezvous over TCP.
    pub const TCP_RENDEZVOUS: u64 = 16;
    /// Eager through a transport plug-in.
    pub const PLUGIN_EAGER: u64 = 32;
    /// Rendezvous through a transport plug-in.
    pub const PLUGIN_RENDEZVOUS: u64 = 64;
    /// One-sided: the peers' memory read in place (shared memory).
    pub const ONESIDED: u64 = 128;
    /// Pulled by the receiver while the sender wrote pieces too (a split: both ranks copy).
    pub const SHM_SPLIT: u64 = 256;
    /// Names of the bits, lowest first.
    pub const NAMES: [&str; 9] = [
        "shm-inline",
        "shm-pull",
        "shm-push",
        "tcp-eager",
        "tcp-rndv",
        "plugin-eager",
        "plugin-rndv",
        "onesided",
        "shm-split",
    ];
    /// The transport of each bit: `shm`, `tcp` or `plugin`.
    pub const TRANSPORTS: [&str; 9] = [
        "shm", "shm", "shm", "tcp", "tcp", "plugin", "plugin", "shm", "shm",
    ];
}

/// Counters of one kind of operation in one lane.
#[repr(C)]
#[derive(Debug, Default)]
pub struct KindStats {
    /// Operations completed.
    pub count: AtomicU64,
    /// Bytes of their buffers (a collective: this rank's contribution, or what it receives).
    pub bytes: AtomicU64,
    /// Operations that were timed (those after a profiler first attached).
    pub timed: AtomicU64,
    /// Ticks spent in the timed operations.
    pub total_ticks: AtomicU64,
    /// Moving average of the last operations' ticks (weight 1/8 for the newest).
    pub recent_ticks: AtomicU64,
    /// Tick at which the last timed operation ended.
    pub last_end: AtomicU64,
    /// [`proto`] bits of every operation so far.
    pub protocols: AtomicU64,
    /// Name of the last operation's algorithm, ASCII, NUL padded.
    pub algo: [AtomicU64; 3],
}

/// The operation a lane's thread is in, if any.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Flight {
    /// `OpKind as u64 + 1` while an operation runs, 0 otherwise; written last on start
    /// (release) and first on end.
    pub kind: AtomicU64,
    /// Sequence number of a collective on its communicator; the tag of a message.
    pub seq: AtomicU64,
    /// Bytes, as in [`KindStats::bytes`].
    pub bytes: AtomicU64,
    /// Ranks of the communicator.
    pub comm_size: AtomicU64,
    /// Algorithm name, as in [`KindStats::algo`].
    pub algo: [AtomicU64; 3],
    /// [`proto`] bits of the operation.
    pub protocols: AtomicU64,
    /// Tick the operation started (0: not timed).
    pub started: AtomicU64,
    /// Tick the current wait started to block (0: not blocked).
    pub waiting_since: AtomicU64,
    /// Rank (in the communicator) waited for, plus one (0: none).
    pub peer: AtomicU64,
    /// Step of the schedule being waited for, plus one (0: none), and the steps in all.
    pub step: AtomicU64,
    /// Steps of the schedule.
    pub steps: AtomicU64,
}

/// One thread's part of the segment.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct Lane {
    /// 0 when free, else a number of the owning thread.
    pub owner: AtomicU64,
    /// Counters by [`OpKind`].
    pub kinds: [KindStats; OP_KINDS],
    /// The operation in flight.
    pub flight: Flight,
}

/// The start of the segment: who the process is, and process-wide counters.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct StatsHeader {
    /// [`STATS_MAGIC`] once the header is complete (release).
    pub magic: AtomicU64,
    /// [`STATS_VERSION`].
    pub version: u32,
    /// [`TICK_KIND`] of the writer.
    pub tick_kind: u32,
    /// World rank of the process.
    pub rank: u32,
    /// Ranks of the world.
    pub size: u32,
    /// Process id.
    pub pid: u32,
    /// Threads of a profiler mapping the segment (each adds one while it watches).
    pub watchers: AtomicU32,
    /// Set to 1 by the first profiler to attach: from then on operations are timed.
    pub timing: AtomicU64,
    /// [`clock::ticks`] when the segment was made.
    pub created_ticks: u64,
    /// [`clock::monotonic_ns`] when the segment was made.
    pub created_ns: u64,
    /// Job id, ASCII, NUL padded.
    pub job_id: [u8; 32],
    /// Pool allocations served from shared memory (refreshed while watched).
    pub pool_hits: AtomicU64,
    /// Pool allocations that fell back to the heap (refreshed while watched).
    pub pool_misses: AtomicU64,
    /// Messages per protocol of the engine, by bit of [`proto`] (refreshed while watched).
    pub messages: [AtomicU64; 9],
    /// Failovers by peer and rail, and fallbacks from the transport plug-in to TCP by peer,
    /// in the order they first happened (refreshed while watched; the first
    /// [`FAILOVER_SLOTS`]).
    pub failovers: [FailoverSlot; FAILOVER_SLOTS],
    /// The libfabric transport's counts (refreshed while watched; all zero without it).
    pub ofi: OfiStats,
}

/// What the libfabric transport did (the statistics header's `ofi`): messages and bytes of
/// each protocol, and what became of its memory registrations.
#[repr(C)]
#[derive(Debug, Default)]
pub struct OfiStats {
    /// The provider's name (`tcp;ofi_rxm`), ASCII, NUL padded; empty without libfabric.
    pub provider: [AtomicU64; 4],
    /// Frames by protocol: eager, RDMA read, RDMA write, and direct collective steps
    /// (written straight into the receive the peer offered).
    pub messages: [AtomicU64; 4],
    /// Their payload bytes, by protocol as `messages`.
    pub bytes: [AtomicU64; 4],
    /// Registrations found in the registration cache.
    pub mr_hits: AtomicU64,
    /// Registrations made for a transfer (cache misses).
    pub mr_misses: AtomicU64,
    /// Registrations closed because their memory may go.
    pub mr_invalidations: AtomicU64,
    /// Transfers of pool memory through their pool block's registration.
    pub mr_pool: AtomicU64,
    /// Pool blocks registered.
    pub pool_blocks: AtomicU64,
}

/// Names of the protocols of [`OfiStats::messages`], in order.
pub const OFI_PROTOCOLS: [&str; 4] = ["eager", "rdma-read", "rdma-write", "direct"];

/// The values [`OfiStats`] holds, to publish.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OfiCounts {
    /// As [`OfiStats::messages`].
    pub messages: [u64; 4],
    /// As [`OfiStats::bytes`].
    pub bytes: [u64; 4],
    /// As [`OfiStats::mr_hits`].
    pub mr_hits: u64,
    /// As [`OfiStats::mr_misses`].
    pub mr_misses: u64,
    /// As [`OfiStats::mr_invalidations`].
    pub mr_invalidations: u64,
    /// As [`OfiStats::mr_pool`].
    pub mr_pool: u64,
    /// As [`OfiStats::pool_blocks`].
    pub pool_blocks: u64,
}

impl OfiStats {
    /// Stores `c` and the provider's name.
    pub(crate) fn publish(&self, provider: &str, c: &OfiCounts) {
        for (w, v) in self.provider.iter().zip(pack_name::<4>(provider)) {
            w.store(v, Ordering::Relaxed);
        }
        for (w, v) in self.messages.iter().zip(c.messages) {
            w.store(v, Ordering::Relaxed);
        }
        for (w, v) in self.bytes.iter().zip(c.bytes) {
            w.store(v, Ordering::Relaxed);
        }
        let rest = [
            (&self.mr_hits, c.mr_hits),
            (&self.mr_misses, c.mr_misses),
            (&self.mr_invalidations, c.mr_invalidations),
            (&self.mr_pool, c.mr_pool),
            (&self.pool_blocks, c.pool_blocks),
        ];
        for (w, v) in rest {
            w.store(v, Ordering::Relaxed);
        }
    }

    /// The provider's name ("" without libfabric).
    pub fn provider(&self) -> String {
        unpack_name(self.provider.each_ref().map(|w| w.load(Ordering::Relaxed)))
    }
}

/// The failovers of one peer on one rail (the statistics header's `failovers`).
#[repr(C)]
#[derive(Debug, Default)]
pub struct FailoverSlot {
    /// World rank of the peer plus one; 0: the slot is unused.
    pub peer: AtomicU64,
    /// 0: TCP streams that died on this rail and handed their frames to another
    /// (`tcp_failovers`); 1: the transport plug-in fell back to TCP (`plugin_fallbacks`).
    pub kind: AtomicU64,
    /// How many times.
    pub count: AtomicU64,
    /// The rail (`local -> remote` addresses), ASCII, NUL padded.
    pub rail: [AtomicU64; 8],
}

impl FailoverSlot {
    /// Stores `row` (its rail cut at 64 bytes).
    pub(crate) fn store(&self, row: &FailoverCount) {
        for (w, v) in self.rail.iter().zip(pack_name::<8>(&row.rail)) {
            w.store(v, Ordering::Relaxed);
        }
        self.kind.store(u64::from(row.plugin), Ordering::Relaxed);
        self.count.store(row.count, Ordering::Relaxed);
        self.peer.store(row.peer as u64 + 1, Ordering::Relaxed);
    }

    /// What the slot holds, `None` when unused.
    pub fn read(&self) -> Option<FailoverCount> {
        let peer = self.peer.load(Ordering::Relaxed).checked_sub(1)?;
        Some(FailoverCount {
            peer: usize::try_from(peer).ok()?,
            plugin: self.kind.load(Ordering::Relaxed) == 1,
            rail: unpack_name(self.rail.each_ref().map(|w| w.load(Ordering::Relaxed))),
            count: self.count.load(Ordering::Relaxed),
        })
    }
}

impl StatsHeader {
    /// Stores the engine's messages per protocol (by [`proto`] bit) and the pool's hits and
    /// misses.
    pub(crate) fn publish(&self, messages: [u64; 9], pool_hits: u64, pool_misses: u64) {
        for (c, v) in self.messages.iter().zip(messages) {
            c.store(v, Ordering::Relaxed);
        }
        self.pool_hits.store(pool_hits, Ordering::Relaxed);
        self.pool_misses.store(pool_misses, Ordering::Relaxed);
    }

    /// Stores the engine's failovers by peer and rail (the first [`FAILOVER_SLOTS`]).
    pub(crate) fn publish_failovers(&self, rows: &[FailoverCount]) {
        for (slot, row) in self.failovers.iter().zip(rows) {
            slot.store(row);
        }
    }
}

/// The whole segment payload.
#[repr(C)]
#[derive(Debug)]
pub struct StatsLayout {
    /// Identity and process-wide counters.
    pub header: StatsHeader,
    /// Per-thread counters.
    pub lanes: [Lane; LANES],
}

/// Packs a name into `N` words (the three of `KindStats::algo`, say; longer names are cut
/// at `8 * N` bytes).
pub fn pack_name<const N: usize>(name: &str) -> [u64; N] {
    let mut words = [0u64; N];
    for (w, chunk) in words.iter_mut().zip(name.as_bytes().chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_le_bytes(b);
    }
    words
}

/// The name packed by `pack_name`.
pub fn unpack_name<const N: usize>(words: [u64; N]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The process's live segment (null when it has no world).
static CURRENT: AtomicPtr<StatsLayout> = AtomicPtr::new(std::ptr::null_mut());

/// The process's segment and the worlds using it.
struct Registry {
    live: Option<StatsMapping>,
    worlds: usize,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    live: None,
    worlds: 0,
});

/// A world's hold on the process's segment; the last one to go unmaps it and writes the
/// trace.
#[derive(Debug)]
pub(crate) struct Registration(());

/// Joins the process's segment, creating it for the first world. A failure to create it is
/// logged and leaves the process without statistics: profiling is never worth failing a job.
pub(crate) fn register(job_id: &str, rank: usize, size: usize) -> Registration {
    let mut reg = lock(&REGISTRY);
    reg.worlds += 1;
    if reg.live.is_none() {
        match create(job_id, rank, size) {
            Ok(seg) => {
                CURRENT.store(seg.base.as_ptr().cast(), Ordering::Release);
                reg.live = Some(seg);
            }
            Err(e) => tracing::warn!("no statistics for hcomm_profiler: {e}"),
        }
    }
    Registration(())
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut reg = lock(&REGISTRY);
        reg.worlds -= 1;
        if reg.worlds == 0 {
            CURRENT.store(std::ptr::null_mut(), Ordering::Release);
            // Unmapped here: no operation runs without a world, and the lanes that threads
            // still claim are let go under this lock (`LaneSlot::drop`).
            reg.live = None;
            super::trace::finish();
        }
    }
}

/// The name of the statistics of rank `rank` of job `job_id`.
fn segment_name(job_id: &str, rank: usize) -> String {
    format!("hcomm-{job_id}-{rank}-{PURPOSE}")
}

/// A mapping of a statistics segment, and its file.
#[derive(Debug)]
struct StatsMapping {
    base: NonNull<u8>,
    /// The creator's file, kept open: profilers find the segment among the process's files.
    /// (A reader closes its file once mapped, so that it does not look like a rank.)
    _fd: Option<OwnedFd>,
}

// SAFETY: the mapping is shared memory that any thread may use or unmap; its fields are
// atomics or written before the segment is published.
unsafe impl Send for StatsMapping {}
// SAFETY: as for `Send`: `&StatsMapping` gives out only the layout, whose mutable fields are
// atomics.
unsafe impl Sync for StatsMapping {}

impl StatsMapping {
    /// Maps `fd`, a file of `size_of::<StatsLayout>()` bytes, and keeps it open if `keep`;
    /// `what` names it in errors.
    fn map(fd: OwnedFd, keep: bool, what: &str) -> Result<StatsMapping> {
        let len = size_of::<StatsLayout>();
        let stat = rustix::fs::fstat(&fd)
            .map_err(|e| Error::transport(format_args!("cannot stat {what}"), e.into()))?;
        if u64::try_from(stat.st_size).ok() != Some(len as u64) {
            return Err(Error::transport_failed(format!(
                "{what} is {} bytes long, expected {len}: it belongs to another version of hcomm",
                stat.st_size
            )));
        }
        // SAFETY: with a null address and no MAP_FIXED the kernel picks fresh addresses, so
        // the new mapping aliases no memory this process already uses.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| Error::transport(format_args!("cannot map {what}"), e.into()))?;
        let base = NonNull::new(p.cast())
            .ok_or_else(|| Error::internal(format!("mapping {what} gave a null address")))?;
        Ok(StatsMapping {
            base,
            _fd: keep.then_some(fd),
        })
    }

    fn layout(&self) -> &StatsLayout {
        // SAFETY: the mapping is `size_of::<StatsLayout>()` bytes, page aligned (more than
        // `StatsLayout` needs), and every field of the layout is valid for any bytes
        // (integers and atomics).
        unsafe { &*self.base.as_ptr().cast::<StatsLayout>() }
    }
}

impl Drop for StatsMapping {
    fn drop(&mut self) {
        // SAFETY: `base` is a mapping of this length made in `map`, used by nobody any more
        // (see `Registration::drop`; readers unmap their own mappings).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), size_of::<StatsLayout>()) };
    }
}

fn create(job_id: &str, rank: usize, size: usize) -> Result<StatsMapping> {
    let name = segment_name(job_id, rank);
    let fd = rustix::fs::memfd_create(name.as_str(), rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| Error::transport(format_args!("cannot create {name}"), e.into()))?;
    rustix::fs::ftruncate(&fd, size_of::<StatsLayout>() as u64)
        .map_err(|e| Error::transport(format_args!("cannot size {name}"), e.into()))?;
    let seg = StatsMapping::map(fd, true, &name)?;
    let layout = seg.base.as_ptr().cast::<StatsLayout>();
    let mut id = [0u8; 32];
    let n = job_id.len().min(32);
    id[..n].copy_from_slice(&job_id.as_bytes()[..n]);
    // SAFETY: the mapping is `size_of::<StatsLayout>()` zero bytes, page aligned, and
    // all-zero is a valid `StatsLayout`; no other process reads the plain fields before the
    // magic is published (release) below.
    unsafe {
        let h = std::ptr::addr_of_mut!((*layout).header);
        (*h).version = STATS_VERSION;
        (*h).tick_kind = TICK_KIND as u32;
        (*h).rank = rank as u32;
        (*h).size = size as u32;
        (*h).pid = std::process::id();
        (*h).created_ticks = clock::ticks();
        (*h).created_ns = clock::monotonic_ns();
        (*h).job_id = id;
        (*h).magic.store(STATS_MAGIC, Ordering::Release);
    }
    Ok(seg)
}

/// The live segment's layout, if the process has one.
#[inline]
fn current() -> Option<&'static StatsLayout> {
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: a published layout was initialised before it was published, and stays mapped
    // while a world is registered: the callers run inside operations of a live world (or hold
    // the registry's lock), and the segment is unmapped only when the last world goes.
    unsafe { p.as_ref() }
}

/// The process's header, while it has a segment and a profiler watches it.
#[inline]
pub(crate) fn watched() -> Option<&'static StatsHeader> {
    current()
        .map(|l| &l.header)
        .filter(|h| h.watchers.load(Ordering::Relaxed) > 0)
}

/// Stores `v` with a plain load and store on a lane that only this thread writes, or an
/// atomic addition on the shared last lane.
#[inline]
fn add(c: &AtomicU64, v: u64, shared: bool) {
    if shared {
        c.fetch_add(v, Ordering::Relaxed);
    } else {
        c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    }
}

/// This thread's lane (in the layout it belongs to) and its depth of operations.
struct LaneSlot {
    /// The segment of `lane`: its [`StatsHeader::created_ticks`], unique per segment (a new
    /// segment may be mapped where an old one was).
    ident: Cell<u64>,
    /// The lane owned in `layout` (null: the shared last lane).
    lane: Cell<*const Lane>,
    /// Operations of this thread in progress (an operation inside another is not recorded).
    depth: Cell<u32>,
}

impl Drop for LaneSlot {
    fn drop(&mut self) {
        // Under the lock, the live segment stays mapped; a lane of an earlier segment (one
        // that is gone) needs no letting go.
        let _reg = lock(&REGISTRY);
        let Some(layout) = current() else { return };
        if layout.header.created_ticks == self.ident.get() {
            // SAFETY: `lane` points into `layout` (the identities match), mapped (above).
            if let Some(lane) = unsafe { self.lane.get().as_ref() } {
                lane.owner.store(0, Ordering::Release);
            }
        }
    }
}

thread_local! {
    static SLOT: LaneSlot = const {
        LaneSlot {
            ident: Cell::new(0),
            lane: Cell::new(std::ptr::null()),
            depth: Cell::new(0),
        }
    };
}

/// Numbers threads for lane ownership.
static THREADS: AtomicU64 = AtomicU64::new(1);

impl LaneSlot {
    /// Claims this thread's lane of `layout` (its first operation in this segment).
    #[cold]
    fn claim(&self, layout: &'static StatsLayout) {
        self.ident.set(layout.header.created_ticks);
        let me = THREADS.fetch_add(1, Ordering::Relaxed);
        let own = layout.lanes[..LANES - 1].iter().find(|l| {
            l.owner
                .compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        self.lane
            .set(own.map_or(std::ptr::null(), |l| l as *const Lane));
    }

    /// This thread's lane of `layout`, claimed on first use; `(lane, shared)`.
    #[inline]
    fn lane_in(&self, layout: &'static StatsLayout) -> (&'static Lane, bool) {
        if self.ident.get() != layout.header.created_ticks {
            self.claim(layout);
        }
        // SAFETY: `lane` points into `layout` (the identities match), which the caller has
        // from `current()` inside an operation: mapped.
        match unsafe { self.lane.get().as_ref() } {
            Some(l) => (l, false),
            None => (&layout.lanes[LANES - 1], true),
        }
    }
}

/// What an operation records when it starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpInfo {
    /// Which operation.
    pub kind: OpKind,
    /// Collective sequence number, or message tag.
    pub seq: u64,
    /// Bytes of the operation.
    pub bytes: u64,
    /// Ranks of the communicator.
    pub comm_size: usize,
    /// Algorithm name packed by [`pack_name`] (zeros: none).
    pub algo: [u64; 3],
    /// [`proto`] bits.
    pub protocols: u64,
    /// Steps of its schedule (0: none).
    pub steps: usize,
}

/// An operation being recorded in this thread's lane.
pub(crate) struct Recording {
    lane: &'static Lane,
    shared: bool,
    started: u64,
}

/// Starts recording `info` (nothing when the process has no segment, or when this thread is
/// already inside an operation).
#[inline]
pub(crate) fn start(info: &OpInfo) -> Option<Recording> {
    SLOT.try_with(|slot| {
        let depth = slot.depth.get();
        slot.depth.set(depth + 1);
        if depth > 0 {
            return None;
        }
        let layout = current()?;
        let (lane, shared) = slot.lane_in(layout);
        let started = match layout.header.timing.load(Ordering::Relaxed) {
            0 => 0,
            _ => clock::ticks(),
        };
        if !shared {
            let f = &lane.flight;
            describe(f, info);
            f.started.store(started, Ordering::Relaxed);
            f.waiting_since.store(0, Ordering::Relaxed);
            f.peer.store(0, Ordering::Relaxed);
            f.step.store(0, Ordering::Relaxed);
            f.kind.store(info.kind as u64 + 1, Ordering::Release);
        }
        Some(Recording {
            lane,
            shared,
            started,
        })
    })
    .ok()
    .flatten()
}

/// Writes what `info` says of an operation into its flight record.
fn describe(f: &Flight, info: &OpInfo) {
    f.seq.store(info.seq, Ordering::Relaxed);
    f.bytes.store(info.bytes, Ordering::Relaxed);
    f.comm_size.store(info.comm_size as u64, Ordering::Relaxed);
    for (w, v) in f.algo.iter().zip(info.algo) {
        w.store(v, Ordering::Relaxed);
    }
    f.protocols.store(info.protocols, Ordering::Relaxed);
    f.steps.store(info.steps as u64, Ordering::Relaxed);
}

/// The operation being recorded now says `info` (a collective once it is planned).
pub(crate) fn update(rec: Option<&Recording>, info: &OpInfo) {
    if let Some(Recording {
        lane,
        shared: false,
        ..
    }) = rec
    {
        describe(&lane.flight, info);
    }
}

/// Ends the recording of the operation `info` started.
#[inline]
pub(crate) fn finish(rec: Option<Recording>, info: &OpInfo) {
    let _ = SLOT.try_with(|slot| slot.depth.set(slot.depth.get().saturating_sub(1)));
    let Some(rec) = rec else { return };
    let (lane, shared) = (rec.lane, rec.shared);
    if !shared {
        lane.flight.kind.store(0, Ordering::Release);
    }
    let k = &lane.kinds[info.kind as usize];
    add(&k.count, 1, shared);
    add(&k.bytes, info.bytes, shared);
    if k.protocols.load(Ordering::Relaxed) & info.protocols != info.protocols {
        k.protocols.fetch_or(info.protocols, Ordering::Relaxed);
    }
    for (w, v) in k.algo.iter().zip(info.algo) {
        w.store(v, Ordering::Relaxed);
    }
    if rec.started != 0 {
        let end = clock::ticks();
        let d = end.saturating_sub(rec.started);
        add(&k.timed, 1, shared);
        add(&k.total_ticks, d, shared);
        let r = k.recent_ticks.load(Ordering::Relaxed);
        let recent = if r == 0 { d } else { r - r / 8 + d / 8 };
        k.recent_ticks.store(recent, Ordering::Relaxed);
        k.last_end.store(end, Ordering::Relaxed);
    }
}

/// Runs `f` on this thread's flight record, while it is inside a recorded operation.
#[inline]
pub(crate) fn with_flight(f: impl FnOnce(&Flight)) {
    let flight = SLOT.try_with(|slot| {
        if slot.depth.get() == 0 {
            return None;
        }
        match slot.lane_in(current()?) {
            (lane, false) if lane.flight.kind.load(Ordering::Relaxed) != 0 => Some(&lane.flight),
            _ => None,
        }
    });
    if let Ok(Some(flight)) = flight {
        f(flight);
    }
}

/// A copy of the flight record of this thread's operation, for stall messages.
pub(crate) fn current_flight() -> Option<FlightSnapshot> {
    let mut out = None;
    with_flight(|f| out = FlightSnapshot::read(f));
    out
}

/// The statistics segment among the open files of process `pid`: the path of its link in
/// `/proc` and the segment's name. `Ok(None)`: the process has none; an error: there is no
/// such process, or its files are not this user's to see.
fn find(pid: u32) -> Result<Option<(String, String)>> {
    let dir = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| Error::transport(format_args!("cannot list {dir}"), e))?;
    for entry in entries.flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        let Some(name) = target.strip_prefix("/memfd:") else {
            continue;
        };
        let name = name.trim_end_matches(" (deleted)");
        if name.starts_with("hcomm-") && name.ends_with(&format!("-{PURPOSE}")) {
            let link = entry.path().to_string_lossy().into_owned();
            return Ok(Some((link, name.to_owned())));
        }
    }
    Ok(None)
}

/// The processes with statistics of job `job_id` that this user may see.
pub fn find_job(job_id: &str) -> Result<Vec<u32>> {
    let prefix = format!("hcomm-{job_id}-");
    let procs = std::fs::read_dir("/proc")
        .map_err(|e| Error::transport(format_args!("cannot list /proc"), e))?;
    Ok(procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| matches!(find(pid), Ok(Some((_, name))) if name.starts_with(&prefix)))
        .collect())
}

/// A mapped statistics segment of another process, for reading.
#[derive(Debug)]
pub struct StatsReader {
    seg: StatsMapping,
    /// Where it was found, for messages.
    path: String,
    /// This reader counts in [`StatsHeader::watchers`].
    watching: bool,
}

impl StatsReader {
    /// Maps the statistics of process `pid`; `Ok(None)` when it has none (no hcomm world
    /// open). Fails when there is no such process or its files are not this user's.
    pub fn open_pid(pid: u32) -> Result<Option<StatsReader>> {
        let Some((link, name)) = find(pid)? else {
            return Ok(None);
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&link)
            .map_err(|e| Error::transport(format_args!("cannot open {link} ({name})"), e))?;
        let path = format!("{link} ({name})");
        let seg = StatsMapping::map(OwnedFd::from(file), false, &path)?;
        let r = StatsReader {
            seg,
            path,
            watching: false,
        };
        let h = &r.layout().header;
        if h.magic.load(Ordering::Acquire) != STATS_MAGIC || h.version != STATS_VERSION {
            return Err(Error::transport_failed(format!(
                "{} has magic {:#x} version {}, expected {STATS_MAGIC:#x} version \
                 {STATS_VERSION}: it belongs to another version of hcomm",
                r.path,
                h.magic.load(Ordering::Relaxed),
                h.version
            )));
        }
        Ok(Some(r))
    }

    /// Where the segment was found: its link in `/proc` and its name.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The job id in the header.
    pub fn job_id(&self) -> String {
        let id = &self.layout().header.job_id;
        let end = id.iter().position(|&b| b == 0).unwrap_or(id.len());
        String::from_utf8_lossy(&id[..end]).into_owned()
    }

    /// The mapped layout.
    pub fn layout(&self) -> &StatsLayout {
        self.seg.layout()
    }

    /// Starts watching: the process then refreshes its process-wide counters and times its
    /// operations (for the rest of its life: timing stays on), until this reader is dropped.
    pub fn watch(&mut self) {
        if !self.watching {
            let h = &self.layout().header;
            h.timing.store(1, Ordering::Relaxed);
            h.watchers.fetch_add(1, Ordering::Relaxed);
            self.watching = true;
        }
    }
}

impl Drop for StatsReader {
    fn drop(&mut self) {
        if self.watching {
            self.layout()
                .header
                .watchers
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A consistent-enough copy of a flight record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightSnapshot {
    /// The operation.
    pub kind: OpKind,
    /// Sequence number or tag.
    pub seq: u64,
    /// Bytes.
    pub bytes: u64,
    /// Ranks of the communicator.
    pub comm_size: u64,
    /// Algorithm name ("" for point-to-point).
    pub algo: String,
    /// [`proto`] bits.
    pub protocols: u64,
    /// Tick it started (0: not timed).
    pub started: u64,
    /// Tick its current wait started to block (0: not blocked).
    pub waiting_since: u64,
    /// Rank waited for.
    pub peer: Option<u64>,
    /// Step waited for (from 0), if it runs a schedule.
    pub step: Option<u64>,
    /// Steps of its schedule.
    pub steps: u64,
}

impl FlightSnapshot {
    /// Reads `f`; `None` when no operation is in flight (or it ended while being read).
    pub fn read(f: &Flight) -> Option<FlightSnapshot> {
        let kind = f.kind.load(Ordering::Acquire);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let snap = FlightSnapshot {
            kind: OpKind::from_index(kind.checked_sub(1)? as usize)?,
            seq: load(&f.seq),
            bytes: load(&f.bytes),
            comm_size: load(&f.comm_size),
            algo: unpack_name([load(&f.algo[0]), load(&f.algo[1]), load(&f.algo[2])]),
            protocols: load(&f.protocols),
            started: load(&f.started),
            waiting_since: load(&f.waiting_since),
            peer: load(&f.peer).checked_sub(1),
            step: load(&f.step).checked_sub(1),
            steps: load(&f.steps),
        };
        (f.kind.load(Ordering::Acquire) == kind).then_some(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_rows_go_through_their_slots() {
        let slot = FailoverSlot::default();
        assert_eq!(slot.read(), None);
        let mut row = FailoverCount {
            peer: 0,
            plugin: true,
            rail: "[fd00::1]:1 -> [fd00::2]:2".into(),
            count: 3,
        };
        slot.store(&row);
        assert_eq!(slot.read().as_ref(), Some(&row));
        row.rail = "r".repeat(70);
        row.plugin = false;
        slot.store(&row);
        let back = slot.read().unwrap();
        assert_eq!((back.rail.len(), back.plugin, back.count), (64, false, 3));
    }

    #[test]
    fn ofi_counts_reach_their_fields() {
        let o = OfiStats::default();
        assert_eq!(o.provider(), "");
        let s = OfiCounts {
            messages: [1, 2, 3, 4],
            bytes: [5, 6, 7, 8],
            mr_hits: 9,
            mr_misses: 10,
            mr_invalidations: 11,
            mr_pool: 12,
            pool_blocks: 13,
        };
        o.publish("tcp;ofi_rxm", &s);
        assert_eq!(o.provider(), "tcp;ofi_rxm");
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let got: Vec<u64> = o
            .messages
            .iter()
            .chain(&o.bytes)
            .chain([
                &o.mr_hits,
                &o.mr_misses,
                &o.mr_invalidations,
                &o.mr_pool,
                &o.pool_blocks,
            ])
            .map(load)
            .collect();
        assert_eq!(got, (1..=13).collect::<Vec<u64>>());
    }

    #[test]
    fn names_pack_and_unpack() {
        for name in ["", "ring", "recursive_doubling", "onesided"] {
            assert_eq!(unpack_name(pack_name::<3>(name)), name);
        }
        assert_eq!(unpack_name(pack_name::<3>(&"x".repeat(30))), "x".repeat(24));
    }

    /// What a thread records, a reader of the segment finds; the last world closes it (the
    /// reader's mapping stays valid).
    #[test]
    fn operations_reach_a_reader() {
        use crate::observe::{OpKind, OpScope};
        let job = format!("ops{}", std::process::id());
        let reg = register(&job, 3, 4);
        let pid = std::process::id();
        let mut reader = StatsReader::open_pid(pid).unwrap().unwrap();
        assert!(reader
            .path()
            .ends_with(&format!("(hcomm-{job}-3-{PURPOSE})")));
        assert_eq!(reader.job_id(), job);
        assert_eq!(find_job(&job).unwrap(), [pid]);
        reader.watch();
        let mut op = OpScope::start(OpKind::AllReduce, 0, 64, 4, [0; 3], 0, 0, None);
        op.planned(5, pack_name("ring"), proto::SHM_INLINE, 6);
        crate::observe::waiting_for_step(2, Some(1));
        let f = FlightSnapshot::read(&reader.layout().lanes[0].flight).unwrap();
        assert_eq!(
            (f.kind, f.seq, f.bytes, f.algo.as_str()),
            (OpKind::AllReduce, 5, 64, "ring")
        );
        assert_eq!((f.step, f.steps, f.peer), (Some(2), 6, Some(1)));
        drop(op);
        let lane = &reader.layout().lanes[0];
        assert!(FlightSnapshot::read(&lane.flight).is_none());
        let k = &lane.kinds[OpKind::AllReduce as usize];
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!((load(&k.count), load(&k.bytes), load(&k.timed)), (1, 64, 1));
        assert_eq!(load(&k.protocols), proto::SHM_INLINE);
        let h = &reader.layout().header;
        assert_eq!((h.rank, h.size, h.pid), (3, 4, std::process::id()));
        drop(reg);
        assert!(StatsReader::open_pid(pid).unwrap().is_none());
    }

    /// Worlds come and go: each round has a fresh segment, a thread that ended has let its
    /// lane go, and a thread that lives on claims a lane in the new segment.
    #[test]
    fn lanes_are_let_go_and_segments_replaced() {
        use crate::observe::{OpKind, OpScope};
        let barrier = || drop(OpScope::start(OpKind::Barrier, 0, 0, 1, [0; 3], 0, 0, None));
        let job = format!("cycle{}", std::process::id());
        for round in 0..3 {
            let reg = register(&job, 0, 1);
            std::thread::spawn(barrier).join().unwrap();
            barrier();
            let layout = current().unwrap();
            let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
            let owned = layout.lanes.iter().filter(|l| load(&l.owner) != 0).count();
            assert_eq!(owned, 1, "round {round}");
            let kind = OpKind::Barrier as usize;
            let counted: u64 = layout
                .lanes
                .iter()
                .map(|l| load(&l.kinds[kind].count))
                .sum();
            assert_eq!(counted, 2, "round {round}");
            drop(reg);
            assert!(current().is_none());
        }
    }

    #[test]
    fn layout_fits_lanes_on_their_own_lines() {
        assert_eq!(size_of::<Lane>() % 128, 0);
        assert_eq!(std::mem::align_of::<StatsLayout>(), 128);
    }
}
