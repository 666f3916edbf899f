//! The shared-memory pool behind `hcommMalloc` / `hcommFree`.
//!
//! A rank's pool is a set of *blocks*, each one [`ShmSegment`] named
//! `hcomm-<job id>-<rank>-pool<k>` ([`segment_name`]), created lazily when an allocation needs
//! room, up to a configured total. *Ordinary* blocks hold [`ShmPool::block_size`] bytes
//! (`HCOMM_POOL_BLOCK`, 64 MiB by default) and serve every request up to that size; a larger
//! request gets a *grown* block of its own size (rounded up to [`GROWN_ALIGN`], 2 MiB), so
//! 256 MiB and 1 GiB tensors are pool memory without tuning. The other ranks of the host map
//! a block by its name alone ([`ShmSegment::open_any`]: the length comes from the segment),
//! on first use, so a collective on pool memory can read a peer's buffer in place:
//! [`ShmPool::locate`] turns a pointer range into *(block, offset)*, which is all a peer needs.
//! Block indices are never reused, so a peer's mapping of block *k* stays valid.
//!
//! ```text
//! block k (payload of the segment, 128-byte aligned)
//! | slab (64 KiB, one size class) | large allocation | free | slab | free ...        |
//!   | 192 | 192 | 192 | ... |
//! ```
//!
//! # Allocator
//!
//! All allocator metadata lives in this process, never in the shared memory, so a peer that
//! scribbles over a block cannot corrupt it. One mutex guards it; allocation and free are
//! rare next to the collectives that use the memory.
//!
//! * Every size is rounded up to a multiple of [`POOL_ALIGN`] (64) bytes and every offset is a
//!   multiple of it, so with the 128-byte aligned payload every address is 64-byte aligned.
//! * **Large** requests (over [`SMALL_MAX`] bytes) are carved first-fit from a free list per
//!   block, a map from offset to length kept in address order. A free puts the range back and
//!   merges it with free neighbours on both sides, so freed space always forms maximal extents
//!   and a large request fits again once its neighbours are free.
//! * **Small** requests use size classes (64 B .. 4 KiB in steps of about 1.5x). A class is
//!   served from *slabs* of 64 KiB carved from the large allocator; a slab hands out equal
//!   chunks from a stack of free chunk indices. A slab whose last chunk is freed goes back to
//!   the large allocator at once, so small allocations do not pin fragments forever. When no
//!   slab can be carved, a small request takes its class size straight from the large
//!   allocator.
//! * Every live allocation is recorded by address. [`ShmPool::free`] of a pointer that is not
//!   the start of a live allocation (a double free, an interior pointer, heap memory) is an
//!   [`Error::InvalidArgument`] that changes nothing.
//!
//! * A request is placed first-fit in the blocks of its kind (ordinary blocks for requests
//!   up to `block_size`, grown blocks for larger ones), else in a new block of its kind,
//!   else in any block with room; so small allocations do not fragment the grown blocks
//!   while ordinary ones can be made.
//!
//! # Memory: what the pool takes and gives back
//!
//! [`PoolConfig::max_total`] bounds the bytes of `/dev/shm` the blocks of one rank hold
//! (`HCOMM_POOL_MAX`; by default [`default_max_total`]: half of the smallest of `/dev/shm`'s
//! free space, the physical memory and the control group's memory limit, shared evenly by
//! the local ranks, at least one block).
//! A block's memory is reserved in full when it is created (`fallocate` in
//! [`ShmSegment::create`]), so a full `/dev/shm` fails there, never with SIGBUS on first
//! touch. Ordinary blocks keep their memory while the pool lives, as a cache for the next
//! allocations. Grown blocks give freed memory back at once: the whole pages of a free
//! extent are punched out of the segment's file (`FALLOC_FL_PUNCH_HOLE`, which frees them
//! for the peers' mappings too) and no longer count against the limit; an allocation that
//! lands on such pages reserves them again with `fallocate` first, within the limit.
//!
//! # Misses
//!
//! [`ShmPool::alloc`] returns `None` when the request is larger than the limit, when no block
//! has room and a new one would pass the limit or the most blocks ([`MAX_BLOCKS`]), or when
//! `/dev/shm` has no room for a new block or for reserving given-back pages again (checked
//! with `statvfs` before creating, and by `fallocate` itself); the caller then uses ordinary
//! heap memory, which the collectives still handle through their staging paths. Want of room
//! is logged once and tried again by later requests (memory may have been freed); another
//! failure to create a block (a leftover name) is logged and not retried, so later misses
//! cost no system calls. [`ShmPool::stats`] counts hits and misses for the profiler.
//!
//! # Names
//!
//! A block's name must exist until every local rank has mapped it. With
//! [`PoolConfig::mappers`] local ranks (this one included), the last of them to map a block
//! removes the name ([`ShmSegment::unlink_if_last`]); with one local rank the creator removes
//! it at once. Dropping the pool removes whatever names are left and unmaps its blocks. A
//! rank killed before every local rank mapped its block leaves the name for the launcher to
//! sweep (hcommrun removes the job's names when the job ends).
//!
//! # Blocks registered with a NIC
//!
//! A transport that registers memory with its NIC (libfabric: `p2p::link::ofi`) registers
//! each block once, whole, rather than every buffer on its first use: it hands the pool a
//! [`BlockWatcher`] ([`ShmPool::watch`]), which is told of every block that is *backed* (all
//! its pages in place: from its creation, and again once every page given back is reserved
//! anew) and of every backed block whose memory is about to go (a grown block's freed pages
//! given back, or the pool dropped). The calls come under the allocator's lock, so a block is
//! never given back while its registration is being made; the pool holds the watcher weakly
//! and knows nothing of what it does.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use rustc_hash::FxHashMap;
use rustix::fd::OwnedFd;

use super::segment::{segment_name, ShmSegment, PAYLOAD_OFFSET};
use crate::error::{Error, Result};

/// Alignment of every pool allocation, in bytes.
pub(crate) const POOL_ALIGN: usize = 64;
/// Default size of one block: 64 MiB.
pub(crate) const DEFAULT_BLOCK_SIZE: usize = 64 << 20;
/// Limit on the blocks of one rank together where the system's memory cannot be read: 1 GiB.
pub(crate) const DEFAULT_MAX_TOTAL: usize = 1 << 30;
/// A grown block (for an allocation larger than an ordinary block) is the allocation's size
/// rounded up to a multiple of this: 2 MiB, a huge page.
pub(crate) const GROWN_ALIGN: usize = 2 << 20;
/// Largest request served from the size classes; larger ones use the first-fit free list.
pub(crate) const SMALL_MAX: usize = 4096;
/// Size of a slab, the unit the size classes take from the large allocator; also the smallest
/// block size accepted.
pub(crate) const SLAB_SIZE: usize = 64 << 10;
/// Most blocks one pool may have (`max_total / block_size`).
pub(crate) const MAX_BLOCKS: usize = 4096;

/// Chunk sizes of the small size classes, all multiples of [`POOL_ALIGN`].
const CLASSES: [usize; 12] = [
    64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
];

const _: () = assert!(CLASSES[CLASSES.len() - 1] == SMALL_MAX);
const _: () = assert!(SLAB_SIZE % POOL_ALIGN == 0 && SLAB_SIZE / SMALL_MAX >= 2);

/// The size class for a rounded size of at most [`SMALL_MAX`] bytes.
fn class_of(size: usize) -> usize {
    CLASSES.partition_point(|&c| c < size)
}

/// How a pool is sized and who maps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PoolConfig {
    /// Payload bytes of each ordinary block: a multiple of [`POOL_ALIGN`], at least
    /// [`SLAB_SIZE`]. A larger allocation gets a grown block of its own size.
    pub block_size: usize,
    /// Most bytes of `/dev/shm` the blocks of this rank hold together (less what grown blocks
    /// gave back); at least `block_size`. The number of blocks is at most
    /// `max_total / block_size` and [`MAX_BLOCKS`].
    pub max_total: usize,
    /// How many processes map each block, this one included: the local ranks. The last of
    /// them to map a block removes its name.
    pub mappers: u32,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            block_size: DEFAULT_BLOCK_SIZE,
            max_total: DEFAULT_MAX_TOTAL,
            mappers: 1,
        }
    }
}

/// One allocation from a [`ShmPool`]: where it is in this process and in the pool.
///
/// A plain handle: copying it does not copy the memory, and the memory is valid from
/// [`ShmPool::alloc`] until [`ShmPool::free`] of [`PoolPtr::as_ptr`] or the drop of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PoolPtr {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
    block: usize,
    offset: usize,
}

// SAFETY: a `PoolPtr` only carries an address and numbers; it never dereferences the pointer,
// and whoever does so through `as_ptr` synchronises as for any raw pointer.
unsafe impl Send for PoolPtr {}
// SAFETY: as for `Send`: `&PoolPtr` gives out nothing but copies of those values.
unsafe impl Sync for PoolPtr {}

impl PoolPtr {
    /// Start of the memory: 64-byte aligned, `capacity()` bytes, shared with the peers that
    /// map the block.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The number of bytes asked for.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The number of bytes reserved: `len()` rounded up to the allocation's size, at least 64.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Index of the block that holds the memory (its name is [`ShmPool::block_name`]).
    #[cfg(test)]
    pub(crate) fn block(&self) -> usize {
        self.block
    }

    /// Offset of the memory from the start of the block's payload.
    #[cfg(test)]
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }
}

/// Zeroed, 64-byte aligned bytes owned exclusively: a pool allocation when the pool has room,
/// heap memory otherwise (a miss, or no pool). Freed when dropped. The safe owner behind
/// `PoolBuf` and `hcommMalloc`: nothing else can free its memory while it lives.
#[derive(Debug)]
pub(crate) struct PoolMem {
    ptr: NonNull<u8>,
    len: usize,
    /// The pool it came from; `None` for heap memory of this layout.
    from: Result<Arc<ShmPool>, Layout>,
}

// SAFETY: the memory is owned exclusively, like a `Box<[u8]>`; the pool handle is Send.
unsafe impl Send for PoolMem {}
// SAFETY: as for Send: shared access gives out only `&[u8]`.
unsafe impl Sync for PoolMem {}

impl PoolMem {
    /// `len` zeroed bytes from `pool` (when it can serve them) or the heap.
    pub(crate) fn alloc(pool: Option<&Arc<ShmPool>>, len: usize) -> Result<PoolMem> {
        if let Some(mem) = pool.and_then(|p| PoolMem::alloc_in(p, len)) {
            return Ok(mem);
        }
        let layout = Layout::from_size_align(len.max(1), POOL_ALIGN).map_err(|_| {
            Error::invalid_argument(format!(
                "{len} bytes cannot be allocated: more than the address space allows"
            ))
        })?;
        // SAFETY: the layout's size is not zero.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw)
            .ok_or_else(|| Error::no_mem(format!("cannot allocate {len} bytes")))?;
        Ok(PoolMem {
            ptr,
            len,
            from: Err(layout),
        })
    }

    /// `len` zeroed bytes from `pool`; `None` when it cannot serve them.
    pub(crate) fn alloc_in(pool: &Arc<ShmPool>, len: usize) -> Option<PoolMem> {
        let got = pool.alloc(len)?;
        // SAFETY: the allocation holds at least `len` writable bytes, 64-byte aligned, owned
        // by nobody else until it is freed.
        unsafe { got.as_ptr().write_bytes(0, len) };
        Some(PoolMem {
            ptr: got.ptr,
            len,
            from: Ok(Arc::clone(pool)),
        })
    }

    /// Whether the memory came from the shared-memory pool.
    pub(crate) fn in_pool(&self) -> bool {
        self.from.is_ok()
    }

    /// The bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised bytes (zeroed at allocation) owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to write.
    pub(crate) fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PoolMem {
    fn drop(&mut self) {
        match &self.from {
            Ok(pool) => {
                // SAFETY: the allocation is this one's alone, and nothing uses it after the
                // drop.
                if let Err(e) = unsafe { pool.free(self.ptr.as_ptr()) } {
                    tracing::warn!("freeing pool memory failed: {e}");
                }
            }
            // SAFETY: allocated in `alloc` with this very layout.
            Err(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), *layout) },
        }
    }
}

/// Told when the memory of a pool's blocks comes and goes (see the [module
/// documentation](self)): a transport registers backed blocks with its NIC and lets the
/// registration go when told the memory goes. Called under the pool's allocator lock: an
/// implementation must not call back into the pool.
pub(crate) trait BlockWatcher: Send + Sync + std::fmt::Debug {
    /// The `len` payload bytes of block `block` at `base` are all backed; they stay mapped
    /// until [`BlockWatcher::going`] is called for the block.
    fn backed(&self, block: usize, base: *mut u8, len: usize);
    /// Memory of block `block` (told backed before) is about to be given back or unmapped.
    fn going(&self, block: usize);
}

/// A snapshot of a pool's counters, for the profiler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Allocations served from the pool.
    pub hits: u64,
    /// Allocations the pool could not serve (the caller fell back to the heap).
    pub misses: u64,
    /// Bytes reserved by live allocations (sizes after rounding).
    pub bytes_in_use: u64,
    /// Blocks created so far.
    pub blocks: u64,
    /// The highest `bytes_in_use` seen.
    pub high_water: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_in_use: AtomicU64,
    blocks: AtomicU64,
    high_water: AtomicU64,
}

/// A live allocation, keyed by its address.
#[derive(Debug, Clone, Copy)]
struct Live {
    block: usize,
    offset: usize,
    size: usize,
    /// The slab it is a chunk of; `None` for memory taken straight from the free list.
    slab: Option<usize>,
}

/// A slab: `SLAB_SIZE` bytes of one block cut into chunks of one size class.
#[derive(Debug)]
struct Slab {
    block: usize,
    offset: usize,
    class: usize,
    /// Indices of the free chunks; the next allocation takes the last.
    free: Vec<u32>,
    /// Chunks handed out.
    live: u32,
    /// Whether the slab holds memory; a released slab's slot waits in `spare_slabs`.
    active: bool,
}

impl Slab {
    fn chunks(class: usize) -> u32 {
        (SLAB_SIZE / CLASSES[class]) as u32
    }
}

/// Everything the allocator knows, behind the pool's mutex.
#[derive(Debug, Default)]
struct State {
    /// Per created block: free extents, offset to length, maximal (never two adjacent).
    free: Vec<BTreeMap<usize, usize>>,
    /// Per created block: payload bytes.
    lens: Vec<usize>,
    /// Per created block: the ranges of the segment's file whose memory was given back
    /// (punched), file offset to length, page aligned, disjoint and never adjacent.
    holes: Vec<BTreeMap<usize, usize>>,
    /// Bytes of `/dev/shm` the blocks hold: their sizes less their holes.
    backed: usize,
    /// Slabs, active or spare.
    slabs: Vec<Slab>,
    /// Indices of released slabs, for reuse.
    spare_slabs: Vec<usize>,
    /// Per class: active slabs with at least one free chunk.
    partial: [Vec<usize>; CLASSES.len()],
    /// Live allocations by address.
    live: FxHashMap<usize, Live>,
    /// Sum of the sizes of the live allocations.
    in_use: usize,
    /// A block creation failed for a reason that will not go away: do not try again.
    grow_failed: bool,
    /// A block creation was refused for want of room in `/dev/shm` (logged once).
    found_full: bool,
    /// Told of the blocks' memory ([`ShmPool::watch`]).
    watcher: Option<Weak<dyn BlockWatcher>>,
    /// Per created block: the watcher was told it is backed (and not told since that it goes).
    told: Vec<bool>,
}

impl State {
    /// Takes `size` bytes first-fit from the free extents of `block`.
    fn carve_in(&mut self, block: usize, size: usize) -> Option<usize> {
        let free = &mut self.free[block];
        let (&offset, &len) = free.iter().find(|&(_, &len)| len >= size)?;
        free.remove(&offset);
        if len > size {
            free.insert(offset + size, len - size);
        }
        Some(offset)
    }

    /// Takes `size` bytes first-fit from the existing blocks whose length `fits`, in block
    /// order.
    fn carve(&mut self, size: usize, fits: impl Fn(usize) -> bool) -> Option<(usize, usize)> {
        (0..self.free.len()).find_map(|block| {
            if !fits(self.lens[block]) {
                return None;
            }
            Some((block, self.carve_in(block, size)?))
        })
    }

    /// The free extent of `block` that holds `offset`, if it is free.
    fn free_extent_at(&self, block: usize, offset: usize) -> Option<(usize, usize)> {
        let (&start, &len) = self.free[block].range(..=offset).next_back()?;
        (start + len > offset).then_some((start, len))
    }

    /// Gives `[offset, offset + size)` of `block` back, merged with free neighbours.
    fn release(&mut self, block: usize, offset: usize, size: usize) {
        let free = &mut self.free[block];
        let mut start = offset;
        let mut len = size;
        if let Some((&prev, &prev_len)) = free.range(..offset).next_back() {
            if prev + prev_len == offset {
                free.remove(&prev);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(next_len) = free.remove(&(offset + size)) {
            len += next_len;
        }
        free.insert(start, len);
    }

    /// Makes a slab of `class` at `block`, `offset` and returns its index.
    fn new_slab(&mut self, class: usize, block: usize, offset: usize) -> usize {
        let chunks = Slab::chunks(class);
        let slab = Slab {
            block,
            offset,
            class,
            // Reversed, so chunks go out in address order.
            free: (0..chunks).rev().collect(),
            live: 0,
            active: true,
        };
        let id = match self.spare_slabs.pop() {
            Some(id) => {
                self.slabs[id] = slab;
                id
            }
            None => {
                self.slabs.push(slab);
                self.slabs.len() - 1
            }
        };
        self.partial[class].push(id);
        id
    }

    /// Takes a chunk from a partial slab of `class`, if there is one.
    fn take_chunk(&mut self, class: usize) -> Option<Live> {
        let &id = self.partial[class].last()?;
        let slab = &mut self.slabs[id];
        let chunk = slab.free.pop()?;
        slab.live += 1;
        let live = Live {
            block: slab.block,
            offset: slab.offset + chunk as usize * CLASSES[class],
            size: CLASSES[class],
            slab: Some(id),
        };
        if slab.free.is_empty() {
            self.partial[class].pop();
        }
        Some(live)
    }

    /// Returns a chunk to its slab, and the slab to the free list once it is empty.
    fn put_chunk(&mut self, id: usize, live: &Live) {
        let slab = &mut self.slabs[id];
        let class = slab.class;
        let chunk = ((live.offset - slab.offset) / CLASSES[class]) as u32;
        slab.free.push(chunk);
        slab.live -= 1;
        if slab.free.len() == 1 {
            self.partial[class].push(id);
        }
        let slab = &mut self.slabs[id];
        if slab.live == 0 {
            slab.active = false;
            slab.free = Vec::new();
            let (block, offset) = (slab.block, slab.offset);
            if let Some(pos) = self.partial[class].iter().position(|&s| s == id) {
                self.partial[class].swap_remove(pos);
            }
            self.spare_slabs.push(id);
            self.release(block, offset, SLAB_SIZE);
        }
    }
}

/// One block: its mapping and the open file behind it (to give memory back and reserve it
/// again).
#[derive(Debug)]
struct Block {
    seg: ShmSegment,
    fd: OwnedFd,
}

/// The parts of `[a, b)` inside the `ranges` (start to length, disjoint), in order.
fn covered(ranges: &BTreeMap<usize, usize>, a: usize, b: usize) -> Vec<(usize, usize)> {
    let before = ranges.range(..a).next_back();
    before
        .into_iter()
        .chain(ranges.range(a..b))
        .map(|(&start, &len)| (start.max(a), (start + len).min(b)))
        .filter(|(s, e)| s < e)
        .collect()
}

/// The parts of `[a, b)` outside the `ranges`, in order.
fn uncovered(ranges: &BTreeMap<usize, usize>, a: usize, b: usize) -> Vec<(usize, usize)> {
    let mut gaps = Vec::new();
    let mut at = a;
    for (s, e) in covered(ranges, a, b) {
        if at < s {
            gaps.push((at, s));
        }
        at = e;
    }
    if at < b {
        gaps.push((at, b));
    }
    gaps
}

/// Adds `[a, b)` to the `ranges`, merged with those it overlaps or touches.
fn add_range(ranges: &mut BTreeMap<usize, usize>, a: usize, b: usize) {
    let touching: Vec<(usize, usize)> = ranges
        .range(..=b)
        .rev()
        .take_while(|&(&start, &len)| start + len >= a)
        .map(|(&start, &len)| (start, len))
        .collect();
    let (mut lo, mut hi) = (a, b);
    for (start, len) in touching {
        ranges.remove(&start);
        lo = lo.min(start);
        hi = hi.max(start + len);
    }
    ranges.insert(lo, hi - lo);
}

/// Removes `[a, b)` from the `ranges`.
fn remove_range(ranges: &mut BTreeMap<usize, usize>, a: usize, b: usize) {
    let overlapping: Vec<(usize, usize)> = ranges
        .range(..b)
        .rev()
        .take_while(|&(&start, &len)| start + len > a)
        .map(|(&start, &len)| (start, len))
        .collect();
    for (start, len) in overlapping {
        ranges.remove(&start);
        if start < a {
            ranges.insert(start, a - start);
        }
        if start + len > b {
            ranges.insert(b, start + len - b);
        }
    }
}

/// Bytes of a page of memory.
fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the system; it has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(page).unwrap_or(4096).max(1)
    })
}

/// Bytes free in `/dev/shm` for this user; `None` when unknown or unlimited.
fn dev_shm_room() -> Option<usize> {
    let fs = rustix::fs::statvfs("/dev/shm").ok()?;
    (fs.f_blocks > 0)
        .then(|| usize::try_from(fs.f_bavail.saturating_mul(fs.f_frsize)).unwrap_or(usize::MAX))
}

/// The memory limit of this process's control group (shared memory is charged to it), if
/// one is set: cgroup v2's `memory.max` or v1's `memory.limit_in_bytes`, as seen from inside
/// a container.
fn cgroup_memory_limit() -> Option<usize> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|path| {
        std::fs::read_to_string(path)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    })
    .filter_map(|limit| usize::try_from(limit).ok())
    .min()
}

/// The default limit on one rank's pool when `local_ranks` ranks share this host: half of
/// the smallest of `/dev/shm`'s free space, the physical memory and the control group's
/// memory limit, shared evenly by the local ranks, and at least one block of `block_size`
/// bytes. [`DEFAULT_MAX_TOTAL`] stands in for what cannot be read.
pub(crate) fn default_max_total(local_ranks: usize, block_size: usize) -> usize {
    let memory = rustix::system::sysinfo();
    let physical =
        usize::try_from(u64::from(memory.mem_unit).saturating_mul(memory.totalram as u64))
            .ok()
            .filter(|&m| m > 0)
            .map(|m| cgroup_memory_limit().map_or(m, |limit| limit.min(m)));
    max_total_of(dev_shm_room(), physical, local_ranks, block_size)
}

/// [`default_max_total`] for /dev/shm's free space `shm` and the memory `physical` (either
/// unknown: `None`).
fn max_total_of(
    shm: Option<usize>,
    physical: Option<usize>,
    local_ranks: usize,
    block_size: usize,
) -> usize {
    let room = match (shm, physical) {
        (Some(shm), Some(mem)) => shm.min(mem),
        (one, other) => one
            .or(other)
            .unwrap_or(DEFAULT_MAX_TOTAL * 2 * local_ranks.max(1)),
    };
    (room / 2 / local_ranks.max(1)).max(block_size)
}

/// A rank's pool of shared memory: lazily created blocks and a thread-safe allocator in them.
///
/// See the [module documentation](self) for the design.
#[derive(Debug)]
pub(crate) struct ShmPool {
    job_id: String,
    rank: u32,
    block_size: usize,
    max_total: usize,
    mappers: u32,
    /// One slot per block the pool may create, filled in order under the `state` lock and
    /// read without it.
    blocks: Box<[OnceLock<Block>]>,
    state: Mutex<State>,
    counters: Counters,
}

impl ShmPool {
    /// A pool of rank `rank` of job `job_id`; creates no block yet.
    ///
    /// Fails with [`Error::InvalidArgument`] if the job id cannot be part of a segment name
    /// or the configuration is out of range (see [`PoolConfig`]).
    pub(crate) fn new(job_id: &str, rank: u32, config: PoolConfig) -> Result<ShmPool> {
        let PoolConfig {
            block_size,
            max_total,
            mappers,
        } = config;
        if block_size < SLAB_SIZE || block_size % POOL_ALIGN != 0 {
            return Err(Error::invalid_argument(format!(
                "shared-memory pool block size {block_size}: must be a multiple of \
                 {POOL_ALIGN} bytes and at least {SLAB_SIZE}"
            )));
        }
        // Every block holds at least `block_size` bytes.
        let max_blocks = (max_total / block_size).min(MAX_BLOCKS);
        if max_blocks == 0 {
            return Err(Error::invalid_argument(format!(
                "shared-memory pool limit {max_total} bytes: must hold at least one block of \
                 {block_size} bytes"
            )));
        }
        if mappers == 0 {
            return Err(Error::invalid_argument(
                "shared-memory pool: at least one process (this one) maps each block",
            ));
        }
        // Checks the job id and that the longest block name fits.
        segment_name(job_id, rank, &format!("pool{}", max_blocks - 1))?;
        Ok(ShmPool {
            job_id: job_id.to_owned(),
            rank,
            block_size,
            max_total,
            mappers,
            blocks: (0..max_blocks).map(|_| OnceLock::new()).collect(),
            state: Mutex::new(State::default()),
            counters: Counters::default(),
        })
    }

    /// Allocates `bytes` bytes of pool memory, 64-byte aligned, or returns `None` (a miss) if
    /// the pool cannot serve them; the caller then uses heap memory. Zero bytes get a unique
    /// 64-byte allocation. The memory's contents are unspecified.
    pub(crate) fn alloc(&self, bytes: usize) -> Option<PoolPtr> {
        let got = self.try_alloc(bytes);
        let counter = match got {
            Some(_) => &self.counters.hits,
            None => &self.counters.misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        got
    }

    fn try_alloc(&self, bytes: usize) -> Option<PoolPtr> {
        let size = bytes.max(1).checked_next_multiple_of(POOL_ALIGN)?;
        if size > self.max_total {
            return None;
        }
        let mut st = self.lock().ok()?;
        let live = if size <= SMALL_MAX {
            self.alloc_small(&mut st, class_of(size))?
        } else {
            self.alloc_large(&mut st, size)?
        };
        let at = |b: &Block| NonNull::new(b.seg.as_ptr().wrapping_add(live.offset));
        let Some(ptr) = self.blocks[live.block].get().and_then(at) else {
            // Unreachable: a block has free extents only once its segment is in place. Undo
            // rather than hand out memory that is not mapped.
            tracing::error!(
                block = live.block,
                "shared-memory pool: block is not mapped"
            );
            self.undo(&mut st, &live);
            return None;
        };
        st.live.insert(ptr.as_ptr() as usize, live);
        st.in_use += live.size;
        self.publish_in_use(&st);
        Some(PoolPtr {
            ptr,
            len: bytes,
            capacity: live.size,
            block: live.block,
            offset: live.offset,
        })
    }

    fn alloc_small(&self, st: &mut State, class: usize) -> Option<Live> {
        if let Some(live) = st.take_chunk(class) {
            return Some(live);
        }
        if let Some((block, offset)) = self.place(st, SLAB_SIZE) {
            st.new_slab(class, block, offset);
            return st.take_chunk(class);
        }
        self.alloc_large(st, CLASSES[class])
    }

    fn alloc_large(&self, st: &mut State, size: usize) -> Option<Live> {
        let (block, offset) = self.place(st, size)?;
        Some(Live {
            block,
            offset,
            size,
            slab: None,
        })
    }

    /// Finds `size` bytes: first-fit in the blocks of its kind (the ordinary blocks for a
    /// request that fits one, the grown blocks for a larger one), else in a new block, else
    /// in any block; the memory is reserved in `/dev/shm` where it had been given back.
    fn place(&self, st: &mut State, size: usize) -> Option<(usize, usize)> {
        let ordinary = size <= self.block_size;
        let own_kind = |len: usize| (len == self.block_size) == ordinary;
        let (block, offset) = st
            .carve(size, own_kind)
            .or_else(|| {
                let len = if ordinary {
                    self.block_size
                } else {
                    size.checked_next_multiple_of(GROWN_ALIGN)?
                };
                let block = self.grow(st, len)?;
                Some((block, st.carve_in(block, size)?))
            })
            .or_else(|| st.carve(size, |_| true))?;
        if self.reserve(st, block, offset, size) {
            Some((block, offset))
        } else {
            st.release(block, offset, size);
            None
        }
    }

    /// Creates the next block, of `len` payload bytes, if the limit and `/dev/shm` allow;
    /// returns its index.
    fn grow(&self, st: &mut State, len: usize) -> Option<usize> {
        let index = st.free.len();
        if st.grow_failed
            || index >= self.blocks.len()
            || st.backed.checked_add(len)? > self.max_total
        {
            return None;
        }
        if dev_shm_room().is_some_and(|room| room < len.saturating_add(PAYLOAD_OFFSET)) {
            self.note_full(st, index, len, "/dev/shm has too little room left");
            return None;
        }
        let created = segment_name(&self.job_id, self.rank, &format!("pool{index}"))
            .and_then(|name| ShmSegment::create_keeping_fd(&name, len));
        let (seg, fd) = match created {
            Ok(created) => created,
            Err(err @ Error::NoMem(_)) => {
                self.note_full(st, index, len, &err.to_string());
                return None;
            }
            Err(err) => {
                tracing::warn!(
                    %err,
                    "shared-memory pool: cannot create block {index}; pool misses fall back \
                     to heap memory from now on"
                );
                st.grow_failed = true;
                return None;
            }
        };
        if let Err(err) = seg.unlink_if_last(self.mappers) {
            tracing::warn!(segment = %seg.name(), %err, "shared-memory pool: cannot unlink");
        }
        if self.blocks[index].set(Block { seg, fd }).is_err() {
            // Unreachable: slots are filled in order under the lock.
            tracing::error!(
                block = index,
                "shared-memory pool: block slot already filled"
            );
            st.grow_failed = true;
            return None;
        }
        st.free.push(BTreeMap::from([(0, len)]));
        st.lens.push(len);
        st.holes.push(BTreeMap::new());
        st.told.push(false);
        st.backed += len;
        self.tell_backed(st, index);
        self.counters
            .blocks
            .store(st.free.len() as u64, Ordering::Relaxed);
        Some(index)
    }

    /// A block of `len` bytes could not be had for want of room: a miss, logged once; later
    /// requests try again (memory may have been freed meanwhile).
    fn note_full(&self, st: &mut State, index: usize, len: usize, why: &str) {
        if std::mem::replace(&mut st.found_full, true) {
            tracing::debug!(block = index, len, "shared-memory pool: no room: {why}");
        } else {
            tracing::warn!(
                "shared-memory pool: no room for block {index} of {len} bytes ({why}); \
                 allocations that do not fit the existing blocks use heap memory"
            );
        }
    }

    /// Makes sure the memory of `[offset, offset + size)` of `block` is in place where it
    /// had been given back: reserved again with `fallocate`, so that touching it cannot
    /// fail (no SIGBUS on a full `/dev/shm`), within the pool's limit. Returns false when it
    /// cannot (the caller then misses); what was reserved stays reserved.
    fn reserve(&self, st: &mut State, block: usize, offset: usize, size: usize) -> bool {
        // Holes are whole pages: the pages the range touches.
        let page = page_size();
        let start = (PAYLOAD_OFFSET + offset) / page * page;
        let end = (PAYLOAD_OFFSET + offset + size).next_multiple_of(page);
        let needed = covered(&st.holes[block], start, end);
        if needed.is_empty() {
            return true;
        }
        let bytes: usize = needed.iter().map(|(a, b)| b - a).sum();
        let Some(blk) = self.blocks[block].get() else {
            return false;
        };
        if st.backed + bytes > self.max_total {
            return false;
        }
        for (a, b) in needed {
            let reserved = rustix::fs::fallocate(
                &blk.fd,
                rustix::fs::FallocateFlags::empty(),
                a as u64,
                (b - a) as u64,
            );
            if let Err(err) = reserved {
                let why = format!("cannot reserve {} bytes again: {err}", b - a);
                self.note_full(st, block, self.block_len(st, block), &why);
                return false;
            }
            remove_range(&mut st.holes[block], a, b);
            st.backed += b - a;
        }
        self.tell_backed(st, block);
        true
    }

    /// Gives the memory of the free extent `[start, start + len)` of a grown `block` back to
    /// the system (punching it out of the segment's file), except the pages it shares with
    /// allocations. Ordinary blocks keep their memory while the pool lives.
    fn give_back(&self, st: &mut State, block: usize, start: usize, len: usize) {
        if st.lens[block] == self.block_size {
            return;
        }
        let Some(blk) = self.blocks[block].get() else {
            return;
        };
        let page = page_size();
        let a = (PAYLOAD_OFFSET + start).next_multiple_of(page);
        let b = (PAYLOAD_OFFSET + start + len) / page * page;
        if a >= b {
            return;
        }
        self.tell_going(st, block);
        for (a, b) in uncovered(&st.holes[block], a, b) {
            let punched = rustix::fs::fallocate(
                &blk.fd,
                rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                a as u64,
                (b - a) as u64,
            );
            if let Err(err) = punched {
                tracing::warn!(
                    segment = %blk.seg.name(),
                    %err,
                    "shared-memory pool: cannot give freed memory back"
                );
                return;
            }
            add_range(&mut st.holes[block], a, b);
            st.backed -= b - a;
        }
    }

    /// Tells the watcher that `block` is backed, if it is (no holes) and was not told yet.
    fn tell_backed(&self, st: &mut State, block: usize) {
        let Some(w) = st.watcher.as_ref().and_then(Weak::upgrade) else {
            return;
        };
        if st.told[block] || !st.holes[block].is_empty() {
            return;
        }
        if let Some(b) = self.blocks[block].get() {
            w.backed(block, b.seg.as_ptr(), b.seg.len());
            st.told[block] = true;
        }
    }

    /// Tells the watcher that memory of `block` goes, if it was told the block is backed.
    fn tell_going(&self, st: &mut State, block: usize) {
        if !std::mem::replace(&mut st.told[block], false) {
            return;
        }
        if let Some(w) = st.watcher.as_ref().and_then(Weak::upgrade) {
            w.going(block);
        }
    }

    /// Hands the pool `watcher` (replacing any before): it is told at once of every block
    /// that is backed now, and from then on as blocks come and go (see the [module
    /// documentation](self)). The pool keeps it weakly: once it is dropped, nobody is told.
    pub(crate) fn watch(&self, watcher: Weak<dyn BlockWatcher>) -> Result<()> {
        let mut st = self.lock()?;
        for block in 0..st.told.len() {
            self.tell_going(&mut st, block);
        }
        st.watcher = Some(watcher);
        for block in 0..st.told.len() {
            self.tell_backed(&mut st, block);
        }
        Ok(())
    }

    fn block_len(&self, st: &State, block: usize) -> usize {
        st.lens.get(block).copied().unwrap_or(self.block_size)
    }

    /// Gives back the memory of an allocation that is not (or no longer) in `st.live`.
    fn undo(&self, st: &mut State, live: &Live) {
        match live.slab {
            Some(id) => st.put_chunk(id, live),
            None => st.release(live.block, live.offset, live.size),
        }
        if let Some((start, len)) = st.free_extent_at(live.block, live.offset) {
            self.give_back(st, live.block, start, len);
        }
    }

    /// Frees the allocation that starts at `ptr`.
    ///
    /// Fails with [`Error::InvalidArgument`], changing nothing, if `ptr` is not the start of a
    /// live allocation of this pool: freed already, inside an allocation, or not pool memory
    /// (heap memory from a miss goes back to the heap, not here; [`ShmPool::locate`] tells
    /// the two apart).
    ///
    /// # Safety
    /// Nothing may use the allocation after this call (its memory goes to the next
    /// allocation). [`PoolMem`] frees its memory safely.
    pub(crate) unsafe fn free(&self, ptr: *const u8) -> Result<()> {
        let mut st = self.lock()?;
        let Some(live) = st.live.remove(&(ptr as usize)) else {
            drop(st);
            return Err(match self.locate(ptr, 0) {
                Some((block, offset)) => Error::invalid_argument(format!(
                    "shared-memory pool: {ptr:p} (block {block}, offset {offset}) is not the \
                     start of a live pool allocation: it was freed already or is inside one"
                )),
                None => Error::invalid_argument(format!(
                    "shared-memory pool: {ptr:p} is not pool memory"
                )),
            });
        };
        self.undo(&mut st, &live);
        st.in_use -= live.size;
        self.publish_in_use(&st);
        Ok(())
    }

    /// Where the `len` bytes at `ptr` lie in the pool: `Some((block, offset))` if they are all
    /// inside one block (allocated or not), `None` if any of them is outside the pool's blocks.
    /// A peer that maps block `block` finds the bytes at `offset` from its payload. Takes no
    /// lock.
    pub(crate) fn locate(&self, ptr: *const u8, len: usize) -> Option<(usize, usize)> {
        let addr = ptr as usize;
        for (block, slot) in self.blocks.iter().enumerate() {
            let seg = &slot.get()?.seg;
            let base = seg.as_ptr() as usize;
            let offset = addr.wrapping_sub(base);
            if addr >= base && offset < seg.len() {
                return (len <= seg.len() - offset).then_some((block, offset));
            }
        }
        None
    }

    /// The counters, for the profiler. Each counter is read atomically; a snapshot taken while
    /// other threads allocate may mix moments.
    pub(crate) fn stats(&self) -> PoolStats {
        let c = &self.counters;
        PoolStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            bytes_in_use: c.bytes_in_use.load(Ordering::Relaxed),
            blocks: c.blocks.load(Ordering::Relaxed),
            high_water: c.high_water.load(Ordering::Relaxed),
        }
    }

    /// Payload bytes of an ordinary block; an allocation larger than this gets a grown
    /// block of its own size.
    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    /// The most bytes of `/dev/shm` the pool's blocks may hold together.
    pub(crate) fn max_total(&self) -> usize {
        self.max_total
    }

    /// The most blocks this pool creates.
    #[cfg(test)]
    pub(crate) fn max_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The number of blocks created so far.
    #[cfg(test)]
    pub(crate) fn block_count(&self) -> usize {
        self.blocks.iter().take_while(|b| b.get().is_some()).count()
    }

    /// The segment name of block `block`, if it has been created; the name may already be
    /// unlinked (see the [module documentation](self)).
    #[cfg(test)]
    pub(crate) fn block_name(&self, block: usize) -> Option<&str> {
        Some(self.blocks.get(block)?.get()?.seg.name())
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.state.lock().map_err(|_| {
            Error::internal(
                "shared-memory pool: a thread panicked inside the allocator; the pool is \
                 unusable",
            )
        })
    }

    fn publish_in_use(&self, st: &State) {
        let in_use = st.in_use as u64;
        self.counters.bytes_in_use.store(in_use, Ordering::Relaxed);
        self.counters
            .high_water
            .fetch_max(in_use, Ordering::Relaxed);
    }
}

impl Drop for ShmPool {
    fn drop(&mut self) {
        // The watcher lets its registrations go first; the segments unmap themselves when
        // `blocks` drops, after this.
        if let Ok(mut st) = self.lock() {
            for block in 0..st.told.len() {
                self.tell_going(&mut st, block);
            }
        }
        for seg in self.blocks.iter().map_while(OnceLock::get).map(|b| &b.seg) {
            if let Err(err) = ShmSegment::unlink(seg.name()) {
                tracing::warn!(segment = %seg.name(), %err, "shared-memory pool: cannot unlink");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::segment::tests::dev_shm;
    use proptest::prelude::*;
    use std::sync::atomic::AtomicU32;

    const KIB: usize = 1 << 10;

    /// A job id no other test or process uses.
    fn unique_job() -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        format!(
            "pooltest{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn pool(block_size: usize, blocks: usize, mappers: u32) -> ShmPool {
        let config = PoolConfig {
            block_size,
            max_total: block_size * blocks,
            mappers,
        };
        ShmPool::new(&unique_job(), 0, config).unwrap()
    }

    /// Names of `job`'s segments in `/dev/shm`.
    fn names_of(pool: &ShmPool) -> Vec<String> {
        let prefix = format!("hcomm-{}-", pool.job_id);
        std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect()
    }

    fn fill(p: &PoolPtr, byte: u8) {
        // SAFETY: `p` is a live allocation of `capacity()` bytes that only this test touches.
        unsafe { p.as_ptr().write_bytes(byte, p.capacity()) };
    }

    fn holds(p: &PoolPtr, byte: u8) -> bool {
        // SAFETY: as in `fill`; the bytes were written by `fill`.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), p.capacity()) };
        bytes.iter().all(|&b| b == byte)
    }

    /// Frees `ptr` in `pool`.
    fn free(pool: &ShmPool, ptr: *const u8) -> Result<()> {
        // SAFETY: the tests never use an allocation after freeing it.
        unsafe { pool.free(ptr) }
    }

    fn invalid_message(result: Result<()>) -> String {
        match result {
            Err(Error::InvalidArgument(info)) => info.message,
            other => panic!("expected an invalid-argument error, got {other:?}"),
        }
    }

    impl ShmPool {
        /// Checks every invariant of the allocator; panics on the first broken one.
        fn check(&self) {
            let st = self.state.lock().unwrap();
            assert_eq!(st.free.len(), self.block_count());
            // Each block is tiled exactly by free extents, slabs and direct allocations.
            let mut pieces: Vec<Vec<(usize, usize, &str)>> = vec![Vec::new(); st.free.len()];
            for (block, free) in st.free.iter().enumerate() {
                pieces[block].extend(free.iter().map(|(&o, &l)| (o, l, "free")));
            }
            let mut in_use = 0;
            let mut per_slab = vec![0u32; st.slabs.len()];
            for (&addr, live) in &st.live {
                let base = self.blocks[live.block].get().unwrap().seg.as_ptr() as usize;
                assert_eq!(addr, base + live.offset);
                assert_eq!(addr % POOL_ALIGN, 0);
                in_use += live.size;
                match live.slab {
                    Some(id) => per_slab[id] += 1,
                    None => pieces[live.block].push((live.offset, live.size, "direct")),
                }
            }
            assert_eq!(in_use, st.in_use);
            let holes: usize = st.holes.iter().flat_map(|h| h.values()).sum();
            assert_eq!(st.backed + holes, st.lens.iter().sum::<usize>());
            for (block, holes) in st.holes.iter().enumerate() {
                // Only free memory of grown blocks is given back.
                for (&a, &len) in holes {
                    assert!(st.lens[block] != self.block_size);
                    let (start, end) = (a - PAYLOAD_OFFSET, a + len - PAYLOAD_OFFSET);
                    let free = st.free_extent_at(block, start);
                    assert!(free.is_some_and(|(s, l)| s + l >= end), "hole {a} not free");
                }
            }
            for (id, slab) in st.slabs.iter().enumerate() {
                let listed = st.partial[slab.class].iter().filter(|&&s| s == id).count();
                if !slab.active {
                    assert!(st.spare_slabs.contains(&id) && per_slab[id] == 0 && listed == 0);
                    continue;
                }
                assert_eq!(slab.live, per_slab[id]);
                assert!(slab.live > 0, "an empty slab was kept");
                assert_eq!(slab.live + slab.free.len() as u32, Slab::chunks(slab.class));
                assert_eq!(listed, usize::from(!slab.free.is_empty()));
                pieces[slab.block].push((slab.offset, SLAB_SIZE, "slab"));
            }
            for (block, mut pieces) in pieces.into_iter().enumerate() {
                pieces.sort_unstable();
                let mut end = 0;
                let mut last_free = false;
                for (offset, len, what) in pieces {
                    assert_eq!(offset, end, "block {block}: gap or overlap at {offset}");
                    assert!(!(last_free && what == "free"), "uncoalesced at {offset}");
                    assert_eq!(offset % POOL_ALIGN, 0);
                    end = offset + len;
                    last_free = what == "free";
                }
                assert_eq!(end, st.lens[block], "block {block}");
            }
        }

        /// Whether every block is one free extent.
        fn all_free(&self) -> bool {
            let st = self.state.lock().unwrap();
            st.free
                .iter()
                .zip(&st.lens)
                .all(|(f, len)| f.len() == 1 && f.get(&0) == Some(len))
        }
    }

    #[test]
    fn size_classes() {
        assert_eq!(class_of(64), 0);
        assert_eq!(class_of(128), 1);
        assert_eq!(class_of(192), 2);
        assert_eq!(class_of(320), 4);
        assert_eq!(class_of(4096), CLASSES.len() - 1);
        assert!(CLASSES.windows(2).all(|w| w[0] < w[1]));
        assert!(CLASSES.iter().all(|c| c % POOL_ALIGN == 0));
    }

    #[test]
    fn the_configuration_is_checked() {
        let bad = |block_size, max_total, mappers| {
            let config = PoolConfig {
                block_size,
                max_total,
                mappers,
            };
            matches!(
                ShmPool::new("job", 0, config),
                Err(Error::InvalidArgument(_))
            )
        };
        assert!(bad(SLAB_SIZE - 64, SLAB_SIZE * 4, 1));
        assert!(bad(SLAB_SIZE + 1, SLAB_SIZE * 4, 1));
        assert!(bad(SLAB_SIZE, SLAB_SIZE - 1, 1));
        // A limit beyond MAX_BLOCKS ordinary blocks is fine: the number of blocks is capped.
        assert!(!bad(SLAB_SIZE, SLAB_SIZE * (MAX_BLOCKS + 1), 1));
        assert!(bad(SLAB_SIZE, SLAB_SIZE, 0));
        assert!(!bad(SLAB_SIZE, SLAB_SIZE * MAX_BLOCKS, 1));
        assert!(matches!(
            ShmPool::new("a-b", 0, PoolConfig::default()),
            Err(Error::InvalidArgument(_))
        ));
        let pool = ShmPool::new("job", 1, PoolConfig::default()).unwrap();
        assert_eq!(pool.block_size(), DEFAULT_BLOCK_SIZE);
        assert_eq!(pool.max_blocks(), DEFAULT_MAX_TOTAL / DEFAULT_BLOCK_SIZE);
        // Blocks are created lazily.
        assert_eq!(
            (pool.block_count(), pool.stats()),
            (0, PoolStats::default())
        );
        assert_eq!(pool.block_name(0), None);
    }

    #[test]
    fn every_allocation_is_aligned_and_located() {
        let pool = pool(256 * KIB, 4, 1);
        let sizes = [
            0, 1, 63, 64, 65, 100, 191, 192, 200, 1000, 4095, 4096, 4097, 10_000, 65_536, 65_537,
        ];
        let mut live = Vec::new();
        for (i, &size) in sizes.iter().cycle().take(200).enumerate() {
            let Some(p) = pool.alloc(size) else { break };
            assert_eq!(p.as_ptr() as usize % POOL_ALIGN, 0, "size {size}");
            assert_eq!(p.len(), size);
            assert!(p.capacity() >= size.max(1) && p.capacity() % POOL_ALIGN == 0);
            assert_eq!(
                pool.locate(p.as_ptr(), p.capacity()),
                Some((p.block(), p.offset()))
            );
            fill(&p, i as u8);
            live.push((p, i as u8));
        }
        pool.check();
        for (p, byte) in &live {
            assert!(holds(p, *byte), "allocation {p:?} was overwritten");
        }
        let stats = pool.stats();
        assert_eq!(stats.hits, live.len() as u64);
        let in_use: usize = live.iter().map(|(p, _)| p.capacity()).sum();
        assert_eq!(stats.bytes_in_use, in_use as u64);
        for (p, _) in live {
            free(&pool, p.as_ptr()).unwrap();
        }
        pool.check();
        assert!(pool.all_free());
        assert_eq!(pool.stats().bytes_in_use, 0);
        assert_eq!(pool.stats().high_water, in_use as u64);
    }

    #[test]
    fn coalescing_lets_a_large_allocation_fit_again() {
        let pool = pool(256 * KIB, 1, 1);
        // Fill the block with 8 KiB pieces, then free them in an interleaved order so that
        // every free has to merge with a neighbour on one side or both.
        let pieces: Vec<PoolPtr> = (0..32).map(|_| pool.alloc(8 * KIB).unwrap()).collect();
        assert!(pool.alloc(8 * KIB).is_none(), "the block should be full");
        for p in pieces.iter().step_by(2) {
            free(&pool, p.as_ptr()).unwrap();
        }
        pool.check();
        // 128 KiB is free in total, but only in 8 KiB holes.
        assert!(pool.alloc(16 * KIB).is_none());
        for p in pieces.iter().skip(1).step_by(2) {
            free(&pool, p.as_ptr()).unwrap();
        }
        pool.check();
        let whole = pool
            .alloc(256 * KIB)
            .expect("the freed pieces should coalesce");
        assert_eq!((whole.block(), whole.offset()), (0, 0));
        free(&pool, whole.as_ptr()).unwrap();

        // Small allocations release their slab once empty, so the block coalesces again.
        let small: Vec<PoolPtr> = (0..1000)
            .map(|i| pool.alloc(1 + i % 200).unwrap())
            .collect();
        pool.check();
        for p in small.iter().rev() {
            free(&pool, p.as_ptr()).unwrap();
        }
        assert!(pool.all_free());
        assert!(pool.alloc(256 * KIB).is_some());
    }

    #[test]
    fn exhaustion_misses_and_counts() {
        let pool = pool(128 * KIB, 2, 1);
        // Larger than a block: a miss without creating anything.
        assert!(pool.alloc(128 * KIB + 1).is_none());
        assert!(pool.alloc(usize::MAX).is_none());
        assert_eq!(pool.stats().blocks, 0);

        let a = pool.alloc(128 * KIB).unwrap();
        let b = pool.alloc(100 * KIB).unwrap();
        assert_eq!((a.block(), b.block()), (0, 1));
        // The rest of block 1 (28 KiB) is too small for a slab but takes small requests
        // directly, then nothing more fits.
        let mut small = Vec::new();
        while let Some(p) = pool.alloc(4096) {
            small.push(p);
        }
        assert_eq!(small.len(), 7);
        assert!(pool.alloc(1).is_none());
        pool.check();
        assert_eq!(
            pool.stats(),
            PoolStats {
                hits: 9,
                misses: 4,
                bytes_in_use: (256 * KIB) as u64,
                blocks: 2,
                high_water: (256 * KIB) as u64,
            }
        );
        // Freeing makes room again without a new block.
        free(&pool, b.as_ptr()).unwrap();
        assert_eq!(pool.alloc(64 * KIB).unwrap().block(), 1);
        assert_eq!(pool.stats().blocks, 2);
    }

    #[test]
    fn locate_inside_outside_and_straddling() {
        let pool = pool(64 * KIB, 2, 1);
        let heap = [0u8; 64];
        assert_eq!(pool.locate(heap.as_ptr(), 1), None, "no block yet");

        let p = pool.alloc(16 * KIB).unwrap();
        let q = pool.alloc(64 * KIB).unwrap();
        assert_eq!((p.block(), q.block()), (0, 1));
        let size = pool.block_size();
        let base = p.as_ptr().wrapping_sub(p.offset());
        let at = |offset: usize| base.wrapping_add(offset).cast_const();

        assert_eq!(pool.locate(p.as_ptr(), p.len()), Some((0, p.offset())));
        assert_eq!(pool.locate(at(100), 50), Some((0, 100)));
        assert_eq!(pool.locate(at(0), size), Some((0, 0)));
        assert_eq!(pool.locate(at(size - 1), 1), Some((0, size - 1)));
        assert_eq!(pool.locate(at(size - 1), 0), Some((0, size - 1)));
        // Free memory inside a block is still pool memory.
        assert_eq!(pool.locate(at(size - 8), 8), Some((0, size - 8)));
        assert_eq!(pool.locate(q.as_ptr().wrapping_add(10), 10), Some((1, 10)));

        // Straddling the end of a block, or outside every block.
        assert_eq!(pool.locate(at(size - 8), 9), None);
        assert_eq!(pool.locate(at(0), size + 1), None);
        assert_eq!(pool.locate(at(1), usize::MAX), None);
        assert_eq!(pool.locate(at(size), 1), None);
        assert_eq!(pool.locate(base.wrapping_sub(1), 1), None);
        assert_eq!(pool.locate(base.wrapping_sub(1), 2), None);
        assert_eq!(pool.locate(heap.as_ptr(), heap.len()), None);
        assert_eq!(pool.locate(std::ptr::null(), 1), None);
    }

    #[test]
    fn double_and_foreign_frees_are_errors() {
        let pool = pool(128 * KIB, 1, 1);
        let heap = [0u8; 64];
        let msg = invalid_message(free(&pool, heap.as_ptr()));
        assert!(msg.contains("not pool memory"), "{msg}");

        let small = pool.alloc(100).unwrap();
        let large = pool.alloc(8 * KIB).unwrap();
        let before = pool.stats();
        for bad in [
            small.as_ptr().wrapping_add(1),
            large.as_ptr().wrapping_add(64),
        ] {
            let msg = invalid_message(free(&pool, bad));
            assert!(msg.contains("not the start of a live"), "{msg}");
        }
        assert!(free(&pool, std::ptr::null()).is_err());
        free(&pool, small.as_ptr()).unwrap();
        free(&pool, large.as_ptr()).unwrap();
        for p in [small, large] {
            let msg = invalid_message(free(&pool, p.as_ptr()));
            assert!(msg.contains("freed already"), "{msg}");
        }
        pool.check();
        assert!(pool.all_free());
        let after = pool.stats();
        assert_eq!((after.hits, after.misses), (before.hits, before.misses));
        assert_eq!(after.bytes_in_use, 0);
    }

    #[test]
    fn a_peer_mapping_sees_the_data() {
        let pool = pool(128 * KIB, 2, 2);
        let small = pool.alloc(200).unwrap();
        let large = pool.alloc(100 * KIB).unwrap();
        assert_eq!((small.block(), large.block()), (0, 1));
        for (i, p) in [small, large].iter().enumerate() {
            let name = pool.block_name(p.block()).unwrap();
            assert!(
                dev_shm(name).exists(),
                "{name} is unlinked before its peer mapped it"
            );
            let peer = ShmSegment::open(name, pool.block_size()).unwrap();
            // SAFETY: `p` is a live allocation of `capacity()` bytes at `offset()` in the
            // block that `peer` maps too; this thread alone reads and writes it, in order.
            unsafe {
                for k in 0..p.capacity() {
                    p.as_ptr().add(k).write((k * 7 + i) as u8);
                }
                let there = peer.as_ptr().add(p.offset());
                assert_ne!(there, p.as_ptr());
                for k in 0..p.capacity() {
                    assert_eq!(there.add(k).read(), (k * 7 + i) as u8);
                }
                there.write(0xee);
                assert_eq!(p.as_ptr().read(), 0xee);
            }
            // The peer completes the count of two mappers and removes the name.
            assert!(peer.unlink_if_last(2).unwrap());
            assert!(!dev_shm(name).exists());
        }
        free(&pool, small.as_ptr()).unwrap();
        free(&pool, large.as_ptr()).unwrap();
    }

    #[test]
    fn a_single_rank_unlinks_at_once_and_drop_leaves_nothing() {
        let alone = pool(64 * KIB, 2, 1);
        alone.alloc(10).unwrap();
        assert!(alone.block_name(0).is_some());
        assert!(names_of(&alone).is_empty());

        // With peers that never map the blocks, the names stay until the pool drops.
        let pool = pool(64 * KIB, 3, 4);
        let live: Vec<PoolPtr> = (0..3).map(|_| pool.alloc(64 * KIB).unwrap()).collect();
        assert_eq!(names_of(&pool).len(), 3);
        let job = pool.job_id.clone();
        drop(pool);
        drop(live);
        let prefix = format!("hcomm-{job}-");
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "left in /dev/shm: {left:?}");
    }

    #[test]
    fn threads_share_a_pool() {
        let pool = pool(256 * KIB, 4, 1);
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let pool = &pool;
                s.spawn(move || {
                    let mut mine: Vec<PoolPtr> = Vec::new();
                    for i in 0..2000usize {
                        if i % 3 == 2 && !mine.is_empty() {
                            let p = mine.swap_remove(i % mine.len());
                            assert!(holds(&p, p.len() as u8));
                            free(pool, p.as_ptr()).unwrap();
                        } else if let Some(p) = pool.alloc((i * 37 + t as usize * 11) % 9000) {
                            fill(&p, p.len() as u8);
                            mine.push(p);
                        }
                    }
                    for p in mine {
                        assert!(holds(&p, p.len() as u8));
                        free(pool, p.as_ptr()).unwrap();
                    }
                });
            }
        });
        pool.check();
        assert!(pool.all_free());
        assert_eq!(pool.stats().bytes_in_use, 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0usize..=SMALL_MAX).prop_map(Op::Alloc),
            1 => (SMALL_MAX..=96 * KIB).prop_map(Op::Alloc),
            3 => any::<usize>().prop_map(Op::Free),
        ]
    }

    /// Runs `ops` on `pool` against a model: every allocation aligned, inside its block,
    /// disjoint from every other live one and left intact until freed; the counters follow;
    /// the allocator's invariants hold after every step (given-back memory only in free
    /// extents); after freeing everything each block is one free extent again.
    fn run_model(pool: &ShmPool, ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
        let mut model: Vec<(PoolPtr, u8)> = Vec::new();
        let (mut hits, mut misses) = (0, 0);
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Alloc(size) => {
                    let Some(p) = pool.alloc(size) else {
                        misses += 1;
                        continue;
                    };
                    hits += 1;
                    let start = p.as_ptr() as usize;
                    let end = start + p.capacity();
                    prop_assert_eq!(start % POOL_ALIGN, 0);
                    let rounded = size.max(1).next_multiple_of(POOL_ALIGN);
                    prop_assert!(p.capacity() >= rounded && p.capacity() <= rounded * 3 / 2);
                    let located = pool.locate(p.as_ptr(), p.capacity());
                    prop_assert_eq!(located, Some((p.block(), p.offset())));
                    for (q, _) in &model {
                        let (s, e) = (q.as_ptr() as usize, q.as_ptr() as usize + q.capacity());
                        prop_assert!(end <= s || e <= start, "{:?} overlaps {:?}", p, q);
                    }
                    fill(&p, step as u8);
                    model.push((p, step as u8));
                }
                Op::Free(pick) => {
                    if model.is_empty() {
                        continue;
                    }
                    let (p, byte) = model.swap_remove(pick % model.len());
                    prop_assert!(holds(&p, byte), "{:?} was overwritten", p);
                    free(pool, p.as_ptr()).unwrap();
                    prop_assert!(free(pool, p.as_ptr()).is_err());
                }
            }
            pool.check();
            let stats = pool.stats();
            let in_use: usize = model.iter().map(|(p, _)| p.capacity()).sum();
            prop_assert_eq!((stats.hits, stats.misses), (hits, misses));
            prop_assert_eq!(stats.bytes_in_use, in_use as u64);
            prop_assert!(stats.high_water >= stats.bytes_in_use);
        }
        for (p, byte) in model.drain(..) {
            prop_assert!(holds(&p, byte));
            free(pool, p.as_ptr()).unwrap();
        }
        pool.check();
        prop_assert!(pool.all_free());
        prop_assert_eq!(pool.stats().bytes_in_use, 0);
        Ok(())
    }

    /// Sizes that need grown blocks too (ordinary blocks of 64 KiB; up to 3 MiB).
    fn op_grown() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0usize..=SMALL_MAX).prop_map(Op::Alloc),
            1 => (SMALL_MAX..=64 * KIB).prop_map(Op::Alloc),
            2 => (64 * KIB..=3 << 20).prop_map(Op::Alloc),
            3 => any::<usize>().prop_map(Op::Free),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Random allocations and frees in ordinary blocks against a model.
        #[test]
        fn random_sequences_match_a_model(ops in proptest::collection::vec(op(), 1..300)) {
            run_model(&pool(128 * KIB, 3, 1), ops)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// The same with grown blocks, whose freed memory is given back and reserved again,
        /// within a limit of 12 MiB.
        #[test]
        fn random_sequences_with_grown_blocks_match_a_model(
            ops in proptest::collection::vec(op_grown(), 1..200)
        ) {
            run_model(&pool(64 * KIB, 192, 1), ops)?;
        }
    }

    /// Bytes of memory the file of `block` holds (st_blocks is in 512-byte units).
    fn resident(pool: &ShmPool, block: usize) -> u64 {
        let fd = &pool.blocks[block].get().unwrap().fd;
        rustix::fs::fstat(fd).unwrap().st_blocks as u64 * 512
    }

    #[test]
    fn ranges_cover_merge_and_split() {
        let mut r = BTreeMap::new();
        add_range(&mut r, 10, 20);
        add_range(&mut r, 30, 40);
        assert_eq!(covered(&r, 0, 100), [(10, 20), (30, 40)]);
        assert_eq!(covered(&r, 15, 35), [(15, 20), (30, 35)]);
        assert_eq!(uncovered(&r, 5, 45), [(5, 10), (20, 30), (40, 45)]);
        assert_eq!(uncovered(&r, 12, 18), []);
        add_range(&mut r, 20, 30);
        assert_eq!(r, BTreeMap::from([(10, 30)]));
        remove_range(&mut r, 15, 25);
        assert_eq!(r, BTreeMap::from([(10, 5), (25, 15)]));
        remove_range(&mut r, 0, 100);
        assert!(r.is_empty());
    }

    #[test]
    fn a_large_allocation_gets_a_grown_block_that_gives_its_memory_back() {
        let mib = 1 << 20;
        // Ordinary blocks of 64 KiB; room for 40 MiB in all.
        let pool = ShmPool::new(
            &unique_job(),
            0,
            PoolConfig {
                block_size: 64 * KIB,
                max_total: 40 * mib,
                mappers: 2,
            },
        )
        .unwrap();
        let small = pool.alloc(100).unwrap();
        let big = pool.alloc(5 * mib + 1).unwrap();
        assert_eq!((small.block(), big.block(), big.offset()), (0, 1, 0));
        let name = pool.block_name(1).unwrap().to_owned();
        // Rounded up to GROWN_ALIGN; reserved in full at creation.
        assert_eq!(pool.blocks[1].get().unwrap().seg.len(), 6 * mib);
        assert!(resident(&pool, 1) >= 6 * mib as u64);
        fill(&big, 0x3c);
        assert_eq!(pool.locate(big.as_ptr(), big.len()), Some((1, 0)));
        // A peer maps it by name alone and sees the data.
        let peer = ShmSegment::open_any(&name).unwrap();
        assert_eq!(peer.len(), 6 * mib);
        // SAFETY: the peer's mapping holds the block's 6 MiB; nothing writes it meanwhile.
        assert_eq!(unsafe { peer.as_ptr().add(5 * mib).read() }, 0x3c);
        assert!(peer.unlink_if_last(2).unwrap());
        pool.check();

        // Freeing gives the memory back, but for the first page (with the header) and the
        // last (partly beyond the payload's last whole page).
        free(&pool, big.as_ptr()).unwrap();
        pool.check();
        assert!(resident(&pool, 1) <= 2 * 4096, "{}", resident(&pool, 1));

        // The same size again reuses the grown block, reserved anew and writable.
        let again = pool.alloc(5 * mib).unwrap();
        assert_eq!((again.block(), again.offset()), (1, 0));
        assert!(resident(&pool, 1) >= 5 * mib as u64);
        fill(&again, 0x5d);
        assert!(holds(&again, 0x5d));
        // A larger one needs a block of its own, within the 40 MiB limit on what the blocks
        // hold (about 5 MiB now).
        assert!(pool.alloc(36 * mib).is_none());
        let third = pool.alloc(20 * mib).unwrap();
        assert_eq!(third.block(), 2);
        pool.check();
        for p in [small, again, third] {
            free(&pool, p.as_ptr()).unwrap();
        }
        pool.check();
        assert!(pool.all_free());
        let st = pool.state.lock().unwrap();
        // Only the ordinary block (64 KiB) and two pages of each grown block are still held.
        assert!(st.backed <= 64 * KIB + 4 * 4096, "{}", st.backed);
    }

    /// What a watcher was told, in order: (block, backed) and the block's address and length.
    #[derive(Debug, Default)]
    struct Told(Mutex<Vec<(usize, bool, usize, usize)>>);

    impl BlockWatcher for Told {
        fn backed(&self, block: usize, base: *mut u8, len: usize) {
            self.0
                .lock()
                .unwrap()
                .push((block, true, base as usize, len));
        }
        fn going(&self, block: usize) {
            self.0.lock().unwrap().push((block, false, 0, 0));
        }
    }

    impl Told {
        fn take(&self) -> Vec<(usize, bool)> {
            let mut v = self.0.lock().unwrap();
            v.drain(..).map(|(b, backed, _, _)| (b, backed)).collect()
        }
    }

    /// The watcher hears of the blocks made before it came, of each new block, of a grown
    /// block's memory given back and reserved again in full, and of every block at the end;
    /// once it is gone, the pool goes on without it.
    #[test]
    fn a_watcher_hears_of_blocks_as_their_memory_comes_and_goes() {
        let mib = 1 << 20;
        let pool = ShmPool::new(
            &unique_job(),
            0,
            PoolConfig {
                block_size: 64 * KIB,
                max_total: 40 * mib,
                mappers: 1,
            },
        )
        .unwrap();
        let small = pool.alloc(100).unwrap();
        let told = Arc::new(Told::default());
        let weak: Weak<dyn BlockWatcher> = Arc::downgrade(&told) as _;
        pool.watch(weak).unwrap();
        {
            let v = told.0.lock().unwrap();
            let b = pool.blocks[0].get().unwrap();
            assert_eq!(*v, [(0, true, b.seg.as_ptr() as usize, 64 * KIB)]);
        }
        told.take();
        // A grown block of exactly GROWN_ALIGN: backed at creation, going when freed (its
        // pages given back), backed again when the same size reserves every page anew.
        let big = pool.alloc(2 * mib).unwrap();
        assert_eq!(told.take(), [(1, true)]);
        let at = big.as_ptr();
        free(&pool, at).unwrap();
        assert_eq!(told.take(), [(1, false)]);
        let again = pool.alloc(2 * mib).unwrap();
        assert_eq!((again.block(), told.take()), (1, [(1, true)].to_vec()));
        // Ordinary blocks keep their memory: nothing to hear when their allocations go.
        free(&pool, small.as_ptr()).unwrap();
        assert_eq!(told.take(), []);
        drop(told);
        free(&pool, again.as_ptr()).unwrap();
        assert!(
            pool.alloc(3 * mib).is_some(),
            "the pool works on without its watcher"
        );
        let told = Arc::new(Told::default());
        let weak: Weak<dyn BlockWatcher> = Arc::downgrade(&told) as _;
        pool.watch(weak).unwrap();
        // Block 1 has holes (freed above); blocks 0 and 2 are backed whole.
        assert_eq!(told.take(), [(0, true), (2, true)]);
        drop(pool);
        assert_eq!(told.take(), [(0, false), (2, false)]);
    }

    #[test]
    fn small_allocations_in_a_grown_block_are_reserved_before_use() {
        let mib = 1 << 20;
        let pool = pool(64 * KIB, 40, 1);
        let big = pool.alloc(2 * mib).unwrap();
        assert_eq!(big.block(), 0);
        free(&pool, big.as_ptr()).unwrap();
        // The only block is a grown one, given back; requests larger than an ordinary block
        // go there, and the pages they take are reserved again.
        let pieces: Vec<PoolPtr> = (0..10)
            .map(|i| pool.alloc(65 * KIB + i * 10_000).unwrap())
            .collect();
        assert!(pieces.iter().all(|p| p.block() == 0));
        for (i, p) in pieces.iter().enumerate() {
            fill(p, i as u8);
        }
        pool.check();
        for (i, p) in pieces.iter().enumerate() {
            assert!(holds(p, i as u8));
            free(&pool, p.as_ptr()).unwrap();
        }
        pool.check();
        assert!(pool.all_free());
    }

    #[test]
    fn a_full_dev_shm_is_a_miss_not_a_crash() {
        let Some(room) = dev_shm_room() else {
            return; // an unlimited /dev/shm cannot be filled
        };
        // More than /dev/shm holds, within the limit: refused before anything is created.
        let pool = ShmPool::new(
            &unique_job(),
            0,
            PoolConfig {
                block_size: 64 << 20,
                max_total: usize::MAX / 2,
                mappers: 1,
            },
        )
        .unwrap();
        let too_big = room + (1 << 30);
        assert!(pool.alloc(too_big).is_none());
        assert_eq!(pool.stats().blocks, 0);
        assert!(names_of(&pool).is_empty());
        assert_eq!(pool.stats().misses, 1);
        // The miss is not final: what fits is served.
        let p = pool.alloc(1 << 20).unwrap();
        assert_eq!(pool.stats().blocks, 1);
        free(&pool, p.as_ptr()).unwrap();
    }

    #[test]
    fn the_default_limit_follows_memory_and_ranks() {
        assert!(default_max_total(1, DEFAULT_BLOCK_SIZE) >= DEFAULT_BLOCK_SIZE);
        // One reading of /dev/shm for every figure: other tests fill and empty it meanwhile.
        let shm = dev_shm_room();
        let physical = Some(24 << 30);
        let one = max_total_of(shm, physical, 1, DEFAULT_BLOCK_SIZE);
        let eight = max_total_of(shm, physical, 8, DEFAULT_BLOCK_SIZE);
        assert!(one >= DEFAULT_BLOCK_SIZE && eight >= DEFAULT_BLOCK_SIZE);
        assert!(eight <= one / 8 + DEFAULT_BLOCK_SIZE);
        if let Some(room) = shm {
            assert!(one <= (room / 2).max(DEFAULT_BLOCK_SIZE));
        }
        assert_eq!(default_max_total(1 << 40, 1 << 20), 1 << 20);
    }
}
