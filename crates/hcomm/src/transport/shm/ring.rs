//! Lock-free single-producer/single-consumer message ring in shared memory.
//!
//! One [`ShmRing`] carries messages one way between one pair of ranks: the sender holds the
//! [`Producer`], the receiver the [`Consumer`]. The ring lives in a caller-provided region of a
//! shared-memory segment that the two processes map at different addresses, so the region holds
//! no pointers, only counters and offsets, and everything in it is `#[repr(C)]`.
//!
//! # Layout
//!
//! The region must be aligned to [`RING_ALIGN`] (128) bytes; offsets are from its start:
//!
//! ```text
//!   0  header   magic "HCOMRING", version, slot_size, slot_count     (128 bytes, read-only;
//!               written by `init` and checked by `attach`, in the tests; the rings of the
//!               inboxes are `zeroed`: both ends know the layout, and the header stays zero)
//! 128  tail     AtomicU64: slots published, written by the producer  (128 bytes of its own)
//! 256  head     AtomicU64: slots released, written by the consumer   (128 bytes of its own)
//! 384  slot 0 | slot 1 | ... | slot slot_count-1                     (slot_size bytes each)
//! ```
//!
//! `slot_size` is a multiple of [`SLOT_ALIGN`] (one cache line) and `slot_count` a power of two,
//! so a counter maps to its slot with a mask. Head and tail each get 128 bytes rather than 64
//! because x86's adjacent-line prefetcher pulls cache lines in pairs (crossbeam's `CachePadded`
//! pads to 128 on x86_64 and aarch64 for the same reason). The counters only grow; they count
//! slots, and `tail - head` (wrapping) is the number of slots in use.
//!
//! # Messages
//!
//! A message is a [`MESSAGE_HEADER_LEN`]-byte header (payload length, one metadata word for the
//! layer above: tag, source, sequence) followed by the payload. It starts at the beginning of a
//! slot and occupies as many consecutive slots as header and payload need; the bytes run on
//! across slot boundaries and, at the end of the ring, wrap to slot 0, so no slot is wasted and
//! a payload is at most two contiguous pieces ([`Message::as_slices`]). The largest payload is
//! the whole ring less one header ([`RingLayout::max_payload`]); [`Producer::try_push`] refuses
//! longer ones with an error rather than waiting forever.
//!
//! # Memory ordering
//!
//! The producer writes a message's slots, then stores the new tail with `Release`; the consumer
//! loads tail with `Acquire`, so every slot below that tail is visible to it. The consumer reads
//! (or copies out) the message, then stores the new head with `Release`; the producer loads head
//! with `Acquire` before reusing slots, so the consumer's reads of a slot happen before the
//! producer's next write to it. Each side keeps a private copy of the other side's counter and
//! reloads it only when the ring looks full (producer) or empty (consumer), so in the steady
//! state each message costs one shared store on each side. The loom tests at the bottom check
//! this with `RUSTFLAGS="--cfg loom"`.
//!
//! # Trust
//!
//! The peer is another rank of the same job, but a bug or crash there must not become memory
//! unsafety here: every index is masked into the ring and every length read from shared memory
//! is checked before use; a ring whose counters or headers break the protocol yields
//! [`Error::Transport`].

use std::fmt;
use std::mem::size_of;
use std::ops::Range;
use std::ptr::NonNull;

use crate::{Error, Result};
use sync::{AtomicU64, Ordering};

/// Slot sizes are multiples of this many bytes: one cache line.
pub(crate) const SLOT_ALIGN: usize = 64;
/// The largest slot size a ring accepts.
pub(crate) const MAX_SLOT_SIZE: usize = 64 * 1024;
/// The alignment the ring's region must have.
pub(crate) const RING_ALIGN: usize = 128;
/// Bytes in front of every payload: its length and its metadata word.
pub(crate) const MESSAGE_HEADER_LEN: usize = size_of::<MessageHeader>();
/// Offset of the tail counter in a ring's region (see the layout above).
pub(crate) const TAIL_OFFSET: usize = 128;

// The header that `init` writes and `attach` checks (the tests' rings; the inboxes' rings
// are `zeroed`).
#[cfg(test)]
const MAGIC: u64 = u64::from_le_bytes(*b"HCOMRING");
#[cfg(test)]
const VERSION: u32 = 1;

/// Where the ring's atomics come from: `std`, or loom's model checker under `--cfg loom`.
mod sync {
    #[cfg(loom)]
    pub(super) use loom::sync::atomic::{AtomicU64, Ordering};
    #[cfg(not(loom))]
    pub(super) use std::sync::atomic::{AtomicU64, Ordering};
}

/// A field on a 128-byte boundary, padded to a multiple of 128 bytes.
#[repr(C, align(128))]
struct CacheAligned<T>(T);

/// What [`ShmRing::attach`] validates. Written once by [`ShmRing::init`], then only read.
#[repr(C)]
struct RingHeader {
    magic: u64,
    version: u32,
    slot_size: u32,
    slot_count: u64,
}

/// The fixed part of the region, in front of the slots.
#[repr(C)]
struct RingControl {
    header: CacheAligned<RingHeader>,
    /// Slots published so far; stored only by the producer.
    tail: CacheAligned<AtomicU64>,
    /// Slots released so far; stored only by the consumer.
    head: CacheAligned<AtomicU64>,
}

const CONTROL_LEN: usize = size_of::<RingControl>();

// The shared layout is an ABI between processes: keep it where the module docs say it is.
#[cfg(not(loom))]
const _: () = assert!(
    CONTROL_LEN == 3 * RING_ALIGN
        && MESSAGE_HEADER_LEN == 16
        && std::mem::offset_of!(RingControl, tail) == TAIL_OFFSET
);

/// The header at the start of each message's first slot.
#[repr(C)]
#[derive(Clone, Copy)]
struct MessageHeader {
    len: u64,
    meta: u64,
}

/// The shape of a ring: its slot size and slot count, and what follows from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingLayout {
    slot_size: usize,
    slot_count: usize,
}

impl RingLayout {
    /// The layout with `slot_count` slots of `slot_size` bytes.
    ///
    /// `slot_size` must be a multiple of [`SLOT_ALIGN`] no larger than [`MAX_SLOT_SIZE`], and
    /// `slot_count` a power of two.
    pub(crate) fn new(slot_size: usize, slot_count: usize) -> Result<RingLayout> {
        check_slot_size(slot_size)?;
        if !slot_count.is_power_of_two() {
            return Err(Error::invalid_argument(format!(
                "shared-memory ring slot count {slot_count} is not a power of two"
            )));
        }
        let layout = RingLayout {
            slot_size,
            slot_count,
        };
        if layout.checked_region_len().is_none() {
            return Err(Error::invalid_argument(format!(
                "a shared-memory ring of {slot_count} slots of {slot_size} bytes is too large"
            )));
        }
        Ok(layout)
    }

    /// The layout with slots of `slot_size` bytes and as many of them (a power of two) as fit in
    /// `len` bytes.
    pub(crate) fn fit(len: usize, slot_size: usize) -> Result<RingLayout> {
        check_slot_size(slot_size)?;
        let fits = len.saturating_sub(CONTROL_LEN) / (slot_size + tracking::BYTES_PER_SLOT);
        if fits == 0 {
            return Err(Error::invalid_argument(format!(
                "a {len}-byte region cannot hold a shared-memory ring of {slot_size}-byte slots: \
                 it needs at least {} bytes",
                CONTROL_LEN + slot_size + tracking::BYTES_PER_SLOT
            )));
        }
        RingLayout::new(slot_size, 1 << fits.ilog2())
    }

    /// Slots in the ring.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn slot_count(&self) -> usize {
        self.slot_count
    }

    /// Bytes of the region the ring occupies, from its start.
    #[cfg(test)]
    pub(crate) fn region_len(&self) -> usize {
        // `new` checked that this does not overflow.
        CONTROL_LEN + self.slot_count * (self.slot_size + tracking::BYTES_PER_SLOT)
    }

    /// The longest payload one message can carry: the whole ring less one header.
    pub(crate) fn max_payload(&self) -> usize {
        self.data_len() - MESSAGE_HEADER_LEN
    }

    /// The slots a message with a `payload_len`-byte payload occupies, or `None` when it is
    /// longer than [`max_payload`](Self::max_payload).
    pub(crate) fn slots_for(&self, payload_len: usize) -> Option<usize> {
        (payload_len <= self.max_payload())
            .then(|| (MESSAGE_HEADER_LEN + payload_len).div_ceil(self.slot_size))
    }

    fn checked_region_len(&self) -> Option<usize> {
        let per_slot = self.slot_size.checked_add(tracking::BYTES_PER_SLOT)?;
        let len = self
            .slot_count
            .checked_mul(per_slot)?
            .checked_add(CONTROL_LEN)?;
        // Counters are u64 and the message header's length too.
        u64::try_from(len).ok().map(|_| len)
    }

    /// Bytes of slot memory.
    fn data_len(&self) -> usize {
        self.slot_count * self.slot_size
    }

    fn mask(&self) -> u64 {
        self.slot_count as u64 - 1
    }
}

fn check_slot_size(slot_size: usize) -> Result<()> {
    if slot_size == 0 || slot_size % SLOT_ALIGN != 0 || slot_size > MAX_SLOT_SIZE {
        return Err(Error::invalid_argument(format!(
            "shared-memory ring slot size {slot_size} is not a multiple of {SLOT_ALIGN} \
             between {SLOT_ALIGN} and {MAX_SLOT_SIZE}"
        )));
    }
    Ok(())
}

fn check_region(mem: *mut u8) -> Result<NonNull<u8>> {
    let base = NonNull::new(mem).ok_or_else(|| {
        Error::invalid_argument("shared-memory ring region is a null pointer".to_string())
    })?;
    if (mem as usize) % RING_ALIGN != 0 {
        return Err(Error::invalid_argument(format!(
            "shared-memory ring region at {mem:p} is not aligned to {RING_ALIGN} bytes"
        )));
    }
    Ok(base)
}

fn corrupt(what: fmt::Arguments<'_>) -> Error {
    Error::transport_failed(format!(
        "shared-memory ring corrupted: {what}; the peer process broke the ring protocol"
    ))
}

/// A validated view of a ring in a shared-memory region; [`into_producer`](Self::into_producer)
/// and [`into_consumer`](Self::into_consumer) turn it into the handle of one side.
#[derive(Debug)]
pub(crate) struct ShmRing {
    base: NonNull<u8>,
    layout: RingLayout,
}

// SAFETY: a `ShmRing` is an address plus a layout. The region it points into is shared memory
// that `attach`'s contract keeps valid for as long as the ring is used, from any thread; the
// shared state in it is only touched through atomics or through slots the ring protocol hands
// to exactly one side, which does not depend on which thread that side runs on.
unsafe impl Send for ShmRing {}

impl ShmRing {
    /// Lays out an empty ring with `slot_size`-byte slots in the `len` bytes at `mem`, with as
    /// many slots (a power of two) as fit, and returns its layout.
    ///
    /// # Safety
    ///
    /// `mem` must be valid for reads and writes of `len` bytes, and nothing else may access those
    /// bytes while `init` runs. Handles attached to a ring previously in that memory must no
    /// longer be used. The peer must learn that the ring is ready through something that
    /// synchronises (the bootstrap handshake, a flag stored with `Release` and loaded with
    /// `Acquire`), so that `init` happens before its [`attach`](Self::attach).
    #[cfg(test)]
    pub(crate) unsafe fn init(mem: *mut u8, len: usize, slot_size: usize) -> Result<RingLayout> {
        let base = check_region(mem)?;
        let layout = RingLayout::fit(len, slot_size)?;
        let control = RingControl {
            header: CacheAligned(RingHeader {
                magic: MAGIC,
                version: VERSION,
                // `check_slot_size` bounds it by `MAX_SLOT_SIZE`.
                slot_size: layout.slot_size as u32,
                slot_count: layout.slot_count as u64,
            }),
            tail: CacheAligned(AtomicU64::new(0)),
            head: CacheAligned(AtomicU64::new(0)),
        };
        // SAFETY: the region is valid for writes of `len >= layout.region_len()` bytes (`fit`)
        // and aligned to `RING_ALIGN`, the alignment of `RingControl`; the caller guarantees
        // nothing else accesses it now.
        unsafe { base.cast::<RingControl>().write(control) };
        let ring = ShmRing { base, layout };
        tracking::init(&ring);
        Ok(layout)
    }

    /// The empty ring that [`init`](Self::init) would lay out for `slot_size` in the `len`
    /// bytes at `mem`, in memory nobody has written: its header is neither written nor read
    /// (the counters start at zero), so a ring that no message went through leaves its pages
    /// untouched. Both ends must be given the same `len` and `slot_size`.
    ///
    /// # Safety
    ///
    /// `mem` must be valid for reads and writes of `len` bytes for as long as the returned ring
    /// or a handle made from it is used, those bytes must be accessed only through ring
    /// handles, and they must be zero before the first handle uses them (a new segment's are).
    pub(crate) unsafe fn zeroed(mem: *mut u8, len: usize, slot_size: usize) -> Result<ShmRing> {
        let base = check_region(mem)?;
        let layout = RingLayout::fit(len, slot_size)?;
        let ring = ShmRing { base, layout };
        tracking::init(&ring);
        Ok(ring)
    }

    /// Validates the ring that [`init`](Self::init) laid out in the `len` bytes at `mem`.
    ///
    /// Fails with [`Error::Transport`] when the header's magic, version, slot size or slot count
    /// is wrong or does not fit in `len` bytes.
    ///
    /// # Safety
    ///
    /// `mem` must be valid for reads and writes of `len` bytes for as long as the returned ring
    /// or a handle made from it is used, and those bytes must be accessed only through ring
    /// handles. If the memory holds a ring, its `init` must happen before this call (see
    /// [`init`](Self::init)); otherwise no other thread or process may write it concurrently.
    #[cfg(test)]
    pub(crate) unsafe fn attach(mem: *mut u8, len: usize) -> Result<ShmRing> {
        let base = check_region(mem)?;
        if len < CONTROL_LEN {
            return Err(Error::transport_failed(format!(
                "a {len}-byte region is too short to hold a shared-memory ring"
            )));
        }
        // SAFETY: the region is aligned for `RingHeader`, at least `CONTROL_LEN` bytes long and
        // valid for reads; `init` wrote the header before this call, or nothing writes it.
        let header = unsafe { base.cast::<RingHeader>().read() };
        if header.magic != MAGIC {
            return Err(Error::transport_failed(format!(
                "no shared-memory ring at {mem:p}: magic {:#018x}, expected {MAGIC:#018x}",
                header.magic
            )));
        }
        if header.version != VERSION {
            return Err(Error::transport_failed(format!(
                "shared-memory ring version {} where this build speaks version {VERSION}: \
                 every rank of a job must run the same hcomm",
                header.version
            )));
        }
        let layout = usize::try_from(header.slot_count)
            .ok()
            .and_then(|count| RingLayout::new(header.slot_size as usize, count).ok())
            .filter(|layout| layout.region_len() <= len)
            .ok_or_else(|| {
                Error::transport_failed(format!(
                    "shared-memory ring header says {} slots of {} bytes, which is no valid ring \
                     in a {len}-byte region",
                    header.slot_count, header.slot_size
                ))
            })?;
        Ok(ShmRing { base, layout })
    }

    /// The ring's shape.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn layout(&self) -> RingLayout {
        self.layout
    }

    /// The sending side of the ring.
    ///
    /// # Safety
    ///
    /// No other [`Producer`] of this ring, in this or any other process, may be used for as long
    /// as the returned one is.
    pub(crate) unsafe fn into_producer(self) -> Producer {
        let tail = self.control().tail.0.load(Ordering::Acquire);
        let head = self.control().head.0.load(Ordering::Acquire);
        Producer {
            ring: self,
            tail,
            head_cache: head,
        }
    }

    /// The receiving side of the ring.
    ///
    /// # Safety
    ///
    /// No other [`Consumer`] of this ring, in this or any other process, may be used for as long
    /// as the returned one is.
    pub(crate) unsafe fn into_consumer(self) -> Consumer {
        let head = self.control().head.0.load(Ordering::Acquire);
        Consumer {
            ring: self,
            head,
            tail_cache: head,
        }
    }

    fn control(&self) -> &RingControl {
        // SAFETY: `init` and `attach` checked that the region is aligned for `RingControl` and
        // longer than it, and `init` wrote it; `attach`'s contract keeps the region valid while
        // `self` lives. The header is never written after `init`, and head and tail are atomics.
        unsafe { self.base.cast::<RingControl>().as_ref() }
    }

    /// The first byte of slot 0.
    fn data(&self) -> *mut u8 {
        // SAFETY: `CONTROL_LEN < region_len() <= len`, so the result stays inside the region.
        unsafe { self.base.as_ptr().add(CONTROL_LEN) }
    }

    /// The byte offset, within the slots, of the slot that `counter` maps to.
    fn slot_offset(&self, counter: u64) -> usize {
        // The mask keeps it below `slot_count`, which is a `usize`.
        (counter & self.layout.mask()) as usize * self.layout.slot_size
    }

    /// The payload of the message that starts at slot `counter` and carries `len` payload bytes,
    /// as a range up to the end of the slots and a range from their start.
    fn payload_ranges(&self, counter: u64, len: usize) -> (Range<usize>, Range<usize>) {
        let start = self.slot_offset(counter) + MESSAGE_HEADER_LEN;
        let data_len = self.layout.data_len();
        // A slot is longer than a header, so `start < data_len`.
        let first = len.min(data_len - start);
        (start..start + first, 0..len - first)
    }

    /// Writes a message into the slots from `counter` on.
    ///
    /// # Safety
    ///
    /// The producer must own those slots: `payload.len() <= max_payload()` and the slots the
    /// message occupies lie between tail and head plus `slot_count`, as the producer has seen
    /// them.
    unsafe fn write_message(&self, counter: u64, meta: u64, parts: [&[u8]; 2]) {
        let len = parts[0].len() + parts[1].len();
        let header = MessageHeader {
            len: len as u64,
            meta,
        };
        let data = self.data();
        // SAFETY: a slot starts at a multiple of 64 bytes from the 128-aligned region and is at
        // least 64 bytes long, so the header fits, aligned, inside the region; the caller owns it.
        unsafe {
            data.add(self.slot_offset(counter))
                .cast::<MessageHeader>()
                .write(header)
        };
        let (first, second) = self.payload_ranges(counter, len);
        // The payload's bytes in order, spread over the ring's (up to) two pieces.
        let mut dst = [first, second].into_iter();
        let mut piece = dst.next().unwrap_or(0..0);
        for mut part in parts {
            while !part.is_empty() {
                if piece.is_empty() {
                    piece = dst.next().unwrap_or(0..0);
                }
                let n = part.len().min(piece.len());
                // SAFETY: `piece` lies within the slots (`payload_ranges`), belongs to the
                // message the caller owns, and cannot overlap `part`, which the producer's
                // process owns; the two pieces together are exactly `len` bytes long.
                unsafe {
                    data.add(piece.start)
                        .copy_from_nonoverlapping(part.as_ptr(), n)
                };
                piece.start += n;
                part = &part[n..];
            }
        }
    }

    /// Reads the header of the message at slot `counter`.
    ///
    /// # Safety
    ///
    /// The consumer must own the slot: it lies between head and the tail the consumer loaded.
    unsafe fn read_header(&self, counter: u64) -> MessageHeader {
        // SAFETY: as in `write_message`, the header lies aligned inside the region; the caller
        // owns the slot, so the producer does not write it now.
        unsafe {
            self.data()
                .add(self.slot_offset(counter))
                .cast::<MessageHeader>()
                .read()
        }
    }
}

/// The sending side of a ring: pushes messages for the [`Consumer`] to pop.
#[derive(Debug)]
pub(crate) struct Producer {
    ring: ShmRing,
    /// The producer's own tail: slots it has published.
    tail: u64,
    /// The head it last loaded; the true head is at least this.
    head_cache: u64,
}

impl Producer {
    /// Pushes a message with metadata word `meta` and payload `payload`.
    ///
    /// Returns `Ok(false)`, and pushes nothing, when the ring has no room for it now; `Ok(true)`
    /// once the consumer can see it. Fails with [`Error::InvalidArgument`] when the payload is
    /// longer than [`RingLayout::max_payload`] (it would never fit), or [`Error::Transport`] when
    /// the consumer broke the ring protocol.
    #[cfg(test)]
    pub(crate) fn try_push(&mut self, meta: u64, payload: &[u8]) -> Result<bool> {
        self.try_push_parts(meta, [payload, &[]])
    }

    /// Like [`Producer::try_push`], with the payload given as two parts that follow each other
    /// (a header and a body, say), so the caller need not join them first.
    pub(crate) fn try_push_parts(&mut self, meta: u64, parts: [&[u8]; 2]) -> Result<bool> {
        let len = parts[0].len() + parts[1].len();
        let Some(slots) = self.ring.layout.slots_for(len) else {
            return Err(Error::invalid_argument(format!(
                "a {len}-byte message does not fit a shared-memory ring that carries at most {} \
                 bytes",
                self.ring.layout.max_payload()
            )));
        };
        if self.free_slots_cached()? < slots {
            self.head_cache = self.ring.control().head.0.load(Ordering::Acquire);
            if self.free_slots_cached()? < slots {
                return Ok(false);
            }
        }
        tracking::write(&self.ring, self.tail, slots);
        // SAFETY: the payload is at most `max_payload` bytes (`slots_for`), and its `slots` slots
        // from tail on are free: the head loaded with `Acquire` says the consumer is done with
        // them, and the consumer does not read past the tail, which still excludes them.
        unsafe { self.ring.write_message(self.tail, meta, parts) };
        self.tail = self.tail.wrapping_add(slots as u64);
        self.ring
            .control()
            .tail
            .0
            .store(self.tail, Ordering::Release);
        Ok(true)
    }

    /// How far from the start of the ring's region the next push of a `payload_len`-byte
    /// message may write: the end of its slots while the ring has not wrapped yet, else the
    /// end of the region (so that its pages can be given memory just before they are first
    /// written).
    pub(crate) fn reach(&self, payload_len: usize) -> usize {
        let layout = self.ring.layout;
        let end = CONTROL_LEN + layout.data_len();
        match layout.slots_for(payload_len).map(|n| self.tail + n as u64) {
            Some(upto) if upto <= layout.slot_count as u64 => {
                CONTROL_LEN + upto as usize * layout.slot_size
            }
            _ => end,
        }
    }

    /// The slots free now; a message of `n` payload bytes needs [`RingLayout::slots_for`]`(n)`.
    pub(crate) fn free_slots(&mut self) -> Result<usize> {
        self.head_cache = self.ring.control().head.0.load(Ordering::Acquire);
        self.free_slots_cached()
    }

    /// The ring's shape.
    pub(crate) fn layout(&self) -> RingLayout {
        self.ring.layout
    }

    fn free_slots_cached(&self) -> Result<usize> {
        let used = self.tail.wrapping_sub(self.head_cache);
        let count = self.ring.layout.slot_count;
        match usize::try_from(used) {
            Ok(used) if used <= count => Ok(count - used),
            _ => Err(corrupt(format_args!(
                "head {} is not within {count} slots below tail {}",
                self.head_cache, self.tail
            ))),
        }
    }
}

/// The receiving side of a ring: pops the messages the [`Producer`] pushed, in order.
#[derive(Debug)]
pub(crate) struct Consumer {
    ring: ShmRing,
    /// The consumer's own head: slots it has released.
    head: u64,
    /// The tail it last loaded; the true tail is at least this.
    tail_cache: u64,
}

impl Consumer {
    /// Pops the next message into `buf`, returning its metadata word and payload length, or
    /// `None` when the ring is empty.
    ///
    /// Fails with [`Error::Truncated`], leaving the message in the ring, when `buf` is shorter
    /// than the payload ([`peek`](Self::peek) tells the length first), or with
    /// [`Error::Transport`] when the producer broke the ring protocol.
    #[cfg(test)]
    pub(crate) fn try_pop(&mut self, buf: &mut [u8]) -> Result<Option<(u64, usize)>> {
        let Some(message) = self.peek()? else {
            return Ok(None);
        };
        let len = message.copy_to(buf)?;
        let meta = message.meta();
        message.consume();
        Ok(Some((meta, len)))
    }

    /// The next message, left in the ring until [`Message::consume`], or `None` when the ring is
    /// empty.
    ///
    /// Fails with [`Error::Transport`] when the producer broke the ring protocol.
    pub(crate) fn peek(&mut self) -> Result<Option<Message<'_>>> {
        let available = self.available()?;
        if available == 0 {
            return Ok(None);
        }
        tracking::read(&self.ring, self.head, 1);
        // SAFETY: `available > 0`, so the slot at head lies below the tail loaded with `Acquire`:
        // the producer wrote it before publishing that tail and leaves it alone until head
        // passes it.
        let header = unsafe { self.ring.read_header(self.head) };
        let slots = usize::try_from(header.len)
            .ok()
            .and_then(|len| self.ring.layout.slots_for(len).map(|slots| (len, slots)))
            .filter(|&(_, slots)| slots <= available);
        let Some((len, slots)) = slots else {
            return Err(corrupt(format_args!(
                "message at slot counter {} claims {} bytes but {available} slots are published",
                self.head, header.len
            )));
        };
        tracking::read(&self.ring, self.head, slots);
        Ok(Some(Message {
            consumer: self,
            meta: header.meta,
            len,
            slots,
        }))
    }

    /// The tail this consumer last loaded: a message beyond it has arrived once the ring's
    /// tail (at [`TAIL_OFFSET`] of its region) differs.
    pub(crate) fn seen_tail(&self) -> u64 {
        self.tail_cache
    }

    /// Whether no message is waiting.
    ///
    /// Fails with [`Error::Transport`] when the producer broke the ring protocol.
    pub(crate) fn is_empty(&mut self) -> Result<bool> {
        Ok(self.available()? == 0)
    }

    /// The ring's shape.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn layout(&self) -> RingLayout {
        self.ring.layout
    }

    /// The slots published and not yet released, reloading tail when none are known.
    fn available(&mut self) -> Result<usize> {
        if self.tail_cache == self.head {
            self.tail_cache = self.ring.control().tail.0.load(Ordering::Acquire);
        }
        let available = self.tail_cache.wrapping_sub(self.head);
        let count = self.ring.layout.slot_count;
        match usize::try_from(available) {
            Ok(available) if available <= count => Ok(available),
            _ => Err(corrupt(format_args!(
                "tail {} is not within {count} slots above head {}",
                self.tail_cache, self.head
            ))),
        }
    }
}

/// A message at the front of a ring, borrowed from its [`Consumer`] until it is consumed or
/// dropped (which leaves it in the ring).
#[derive(Debug)]
pub(crate) struct Message<'a> {
    consumer: &'a mut Consumer,
    meta: u64,
    len: usize,
    slots: usize,
}

impl Message<'_> {
    /// The metadata word the producer pushed with the payload.
    pub(crate) fn meta(&self) -> u64 {
        self.meta
    }

    /// Payload bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The payload in place, as the part up to the end of the ring and the part that wrapped to
    /// its start (empty unless the message wrapped).
    pub(crate) fn as_slices(&self) -> (&[u8], &[u8]) {
        let ring = &self.consumer.ring;
        let (first, second) = ring.payload_ranges(self.consumer.head, self.len);
        let data = ring.data();
        // SAFETY: both ranges lie within the slots of this message (`payload_ranges`), which
        // `peek` checked are published; the producer leaves them alone until `consume` stores
        // the new head, which needs this borrow to end first.
        unsafe {
            (
                std::slice::from_raw_parts(data.add(first.start), first.len()),
                std::slice::from_raw_parts(data.add(second.start), second.len()),
            )
        }
    }

    /// Copies the first `buf.len()` payload bytes into `buf`; fails with
    /// [`Error::Transport`] when the payload is shorter.
    pub(crate) fn copy_prefix(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() > self.len {
            return Err(corrupt(format_args!(
                "a {}-byte message is shorter than its {}-byte header",
                self.len,
                buf.len()
            )));
        }
        self.copy_range(0, buf);
        Ok(())
    }

    /// Copies `buf.len()` payload bytes from `offset` on into `buf`; bytes beyond the
    /// payload's end are left alone.
    pub(crate) fn copy_range(&self, offset: usize, buf: &mut [u8]) {
        let (first, second) = self.as_slices();
        let mut at = offset;
        let mut out = 0;
        for piece in [first, second] {
            if out == buf.len() {
                break;
            }
            if at >= piece.len() {
                at -= piece.len();
                continue;
            }
            let n = (piece.len() - at).min(buf.len() - out);
            buf[out..out + n].copy_from_slice(&piece[at..at + n]);
            out += n;
            at = 0;
        }
    }

    /// Copies the payload to the front of `buf` and returns its length.
    ///
    /// Fails with [`Error::Truncated`] when `buf` is shorter than the payload.
    #[cfg(test)]
    pub(crate) fn copy_to(&self, buf: &mut [u8]) -> Result<usize> {
        let Some(dst) = buf.get_mut(..self.len) else {
            return Err(Error::truncated(format!(
                "a {}-byte shared-memory message does not fit a {}-byte buffer",
                self.len,
                buf.len()
            )));
        };
        let (first, second) = self.as_slices();
        let (dst_first, dst_second) = dst.split_at_mut(first.len());
        dst_first.copy_from_slice(first);
        dst_second.copy_from_slice(second);
        Ok(self.len)
    }

    /// Removes the message from the ring, handing its slots back to the producer.
    pub(crate) fn consume(self) {
        let consumer = self.consumer;
        consumer.head = consumer.head.wrapping_add(self.slots as u64);
        consumer
            .ring
            .control()
            .head
            .0
            .store(consumer.head, Ordering::Release);
    }
}

/// Tells loom's race detector which slots each side touches, so that a missing
/// `Release`/`Acquire` pair shows up as a data race on slot memory. Under `--cfg loom` the region
/// has one `loom::cell::UnsafeCell<()>` per slot after the slots; otherwise nothing.
#[cfg(not(loom))]
mod tracking {
    use super::ShmRing;

    pub(super) const BYTES_PER_SLOT: usize = 0;

    pub(super) fn init(_: &ShmRing) {}

    pub(super) fn write(_: &ShmRing, _: u64, _: usize) {}

    pub(super) fn read(_: &ShmRing, _: u64, _: usize) {}
}

#[cfg(loom)]
mod tracking {
    use super::{ShmRing, CONTROL_LEN};
    use loom::cell::UnsafeCell;
    use std::mem::{align_of, size_of};

    pub(super) const BYTES_PER_SLOT: usize = size_of::<UnsafeCell<()>>();

    const _: () = assert!(align_of::<UnsafeCell<()>>() <= super::SLOT_ALIGN);

    fn cell(ring: &ShmRing, counter: u64) -> *mut UnsafeCell<()> {
        let index = (counter & ring.layout.mask()) as usize;
        let offset = CONTROL_LEN + ring.layout.data_len() + index * BYTES_PER_SLOT;
        // SAFETY: the cells follow the slots inside `region_len()`, which counts them.
        unsafe { ring.base.as_ptr().add(offset).cast() }
    }

    pub(super) fn init(ring: &ShmRing) {
        for counter in 0..ring.layout.slot_count as u64 {
            // SAFETY: `cell` is inside the region, aligned (the slots end on a 64-byte boundary),
            // and `init`'s caller owns the region.
            unsafe { cell(ring, counter).write(UnsafeCell::new(())) };
        }
    }

    pub(super) fn write(ring: &ShmRing, first: u64, slots: usize) {
        for k in 0..slots as u64 {
            // SAFETY: `init` wrote the cell and nothing replaces it.
            unsafe { &*cell(ring, first.wrapping_add(k)) }.with_mut(|_| ());
        }
    }

    pub(super) fn read(ring: &ShmRing, first: u64, slots: usize) {
        for k in 0..slots as u64 {
            // SAFETY: as in `write`.
            unsafe { &*cell(ring, first.wrapping_add(k)) }.with(|_| ());
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;
    use std::time::{Duration, Instant};

    /// Ring memory aligned as a segment would be.
    #[repr(C, align(128))]
    #[derive(Clone, Copy)]
    struct Line([u8; 128]);

    struct Region {
        lines: Vec<Line>,
        len: usize,
    }

    impl Region {
        fn new(len: usize) -> Region {
            Region {
                lines: vec![Line([0; 128]); len.div_ceil(128)],
                len,
            }
        }

        fn for_layout(slot_size: usize, slot_count: usize) -> Region {
            Region::new(RingLayout::new(slot_size, slot_count).unwrap().region_len())
        }

        fn ptr(&mut self) -> *mut u8 {
            self.lines.as_mut_ptr().cast()
        }

        fn len(&self) -> usize {
            self.len
        }

        /// Lays out a ring in the whole region and attaches both sides.
        fn ring(&mut self, slot_size: usize) -> (Producer, Consumer) {
            let (ptr, len) = (self.ptr(), self.len());
            // SAFETY: the region is ours, valid for `len` bytes and outlives the handles (every
            // test drops the handles before the region).
            unsafe {
                ShmRing::init(ptr, len, slot_size).unwrap();
                let producer = ShmRing::attach(ptr, len).unwrap().into_producer();
                let consumer = ShmRing::attach(ptr, len).unwrap().into_consumer();
                (producer, consumer)
            }
        }

        fn attach(&mut self) -> Result<ShmRing> {
            let (ptr, len) = (self.ptr(), self.len());
            // SAFETY: as in `ring`.
            unsafe { ShmRing::attach(ptr, len) }
        }

        fn header(&mut self) -> &mut RingHeader {
            // SAFETY: the region is aligned and long enough for a header, and borrowed mutably.
            unsafe { &mut *self.ptr().cast::<RingHeader>() }
        }

        fn control(&mut self) -> &RingControl {
            // SAFETY: as in `header`; the tests call it only after `init`.
            unsafe { &*self.ptr().cast::<RingControl>() }
        }
    }

    /// A payload that differs with the message's sequence number and length.
    fn payload(seq: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (seq as usize * 31 + i * 7 + len) as u8)
            .collect()
    }

    fn pop(consumer: &mut Consumer) -> Option<(u64, Vec<u8>)> {
        let mut buf = vec![0; consumer.layout().max_payload()];
        let (meta, len) = consumer.try_pop(&mut buf).unwrap()?;
        buf.truncate(len);
        Some((meta, buf))
    }

    #[test]
    fn layout_is_validated() {
        for bad in [0, 32, 65, 100, MAX_SLOT_SIZE + 64] {
            assert!(
                matches!(RingLayout::new(bad, 8), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
        for bad in [0, 3, 12] {
            assert!(
                matches!(RingLayout::new(64, bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
        assert!(RingLayout::new(MAX_SLOT_SIZE, 1 << 62).is_err());
        let layout = RingLayout::new(128, 16).unwrap();
        assert_eq!(layout.region_len(), 384 + 16 * 128);
        assert_eq!(layout.max_payload(), 16 * 128 - 16);
        assert_eq!(layout.slots_for(0), Some(1));
        assert_eq!(layout.slots_for(112), Some(1));
        assert_eq!(layout.slots_for(113), Some(2));
        assert_eq!(layout.slots_for(layout.max_payload()), Some(16));
        assert_eq!(layout.slots_for(layout.max_payload() + 1), None);
    }

    #[test]
    fn fit_takes_the_largest_power_of_two() {
        assert_eq!(
            RingLayout::fit(384 + 64, 64).unwrap(),
            RingLayout::new(64, 1).unwrap()
        );
        assert_eq!(
            RingLayout::fit(384 + 7 * 64 + 63, 64).unwrap().slot_count(),
            4
        );
        assert_eq!(RingLayout::fit(384 + 8 * 256, 256).unwrap().slot_count(), 8);
        assert!(matches!(
            RingLayout::fit(384 + 63, 64),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            RingLayout::fit(0, 64),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            RingLayout::fit(1 << 20, 96),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn init_refuses_bad_regions() {
        let mut region = Region::new(4096);
        // SAFETY: every call fails before touching the memory, which is ours anyway.
        unsafe {
            assert!(ShmRing::init(std::ptr::null_mut(), 4096, 64).is_err());
            assert!(ShmRing::init(region.ptr().add(64), 4096 - 64, 64).is_err());
            assert!(ShmRing::init(region.ptr(), 300, 64).is_err());
            assert!(ShmRing::attach(std::ptr::null_mut(), 4096).is_err());
            assert!(ShmRing::attach(region.ptr().add(8), 4000).is_err());
        }
    }

    #[test]
    fn attach_refuses_bad_headers() {
        let mut region = Region::for_layout(64, 8);
        let len = region.len();
        assert!(
            matches!(region.attach(), Err(Error::Transport(_))),
            "all zeroes"
        );
        region.ring(64);
        assert_eq!(
            region.attach().unwrap().layout(),
            RingLayout::new(64, 8).unwrap()
        );
        // SAFETY: the region is ours.
        let tiny = unsafe { ShmRing::attach(region.ptr(), 100) };
        assert!(matches!(tiny, Err(Error::Transport(_))), "header only");
        // SAFETY: as above.
        let short = unsafe { ShmRing::attach(region.ptr(), len - 64) };
        assert!(
            matches!(short, Err(Error::Transport(_))),
            "slots beyond the region"
        );

        let corruptions: [fn(&mut RingHeader); 6] = [
            |h| h.magic ^= 1,
            |h| h.version = VERSION + 1,
            |h| h.slot_size = 96,
            |h| h.slot_size = 0,
            |h| h.slot_count = 6,
            |h| h.slot_count = 1 << 40,
        ];
        for break_header in corruptions {
            region.ring(64);
            break_header(region.header());
            assert!(matches!(region.attach(), Err(Error::Transport(_))));
        }
    }

    #[test]
    fn empty_and_full() {
        let mut region = Region::for_layout(64, 4);
        let (mut producer, mut consumer) = region.ring(64);
        assert!(consumer.is_empty().unwrap());
        assert_eq!(pop(&mut consumer), None);
        assert_eq!(producer.free_slots().unwrap(), 4);
        for seq in 0..4 {
            assert!(producer.try_push(seq, &payload(seq, 48)).unwrap());
        }
        assert_eq!(producer.free_slots().unwrap(), 0);
        assert!(!producer.try_push(9, &[]).unwrap(), "full");
        assert_eq!(pop(&mut consumer), Some((0, payload(0, 48))));
        // One slot free: a two-slot message still waits, a one-slot one goes.
        assert!(!producer.try_push(4, &payload(4, 49)).unwrap());
        assert!(producer.try_push(4, &payload(4, 48)).unwrap());
        for seq in 1..5 {
            assert_eq!(pop(&mut consumer), Some((seq, payload(seq, 48))));
        }
        assert!(consumer.is_empty().unwrap());
        assert_eq!(producer.free_slots().unwrap(), 4);
    }

    #[test]
    fn messages_wrap_around_the_end() {
        let mut region = Region::for_layout(64, 4);
        let (mut producer, mut consumer) = region.ring(64);
        // Three-slot messages start at every slot in turn, so most of them wrap.
        for seq in 0..64 {
            let data = payload(seq, 150);
            assert!(producer.try_push(seq, &data).unwrap());
            assert!(!producer.try_push(seq, &data).unwrap());
            let message = consumer.peek().unwrap().unwrap();
            let (first, second) = message.as_slices();
            let slot = seq * 3 % 4;
            assert_eq!(
                second.is_empty(),
                slot < 2,
                "message {seq} from slot {slot}"
            );
            assert_eq!([first, second].concat(), data);
            message.consume();
        }
    }

    #[test]
    fn every_size_from_every_slot() {
        for slot_size in [64, 192] {
            let mut region = Region::for_layout(slot_size, 8);
            let (mut producer, mut consumer) = region.ring(slot_size);
            let max = producer.layout().max_payload();
            let mut seq = 0;
            for len in 0..=max {
                for start in 0..8 {
                    // Empty one-slot messages move the next message's first slot to `start`.
                    while producer.tail % 8 != start {
                        assert!(producer.try_push(u64::MAX, &[]).unwrap());
                        assert_eq!(pop(&mut consumer), Some((u64::MAX, vec![])));
                    }
                    let data = payload(seq, len);
                    assert!(
                        producer.try_push(seq, &data).unwrap(),
                        "{slot_size} {start} {len}"
                    );
                    assert_eq!(pop(&mut consumer), Some((seq, data)));
                    seq += 1;
                }
            }
            let too_long = vec![0; max + 1];
            assert!(matches!(
                producer.try_push(0, &too_long),
                Err(Error::InvalidArgument(_))
            ));
            assert!(consumer.is_empty().unwrap());
        }
    }

    #[test]
    fn a_short_buffer_leaves_the_message() {
        let mut region = Region::for_layout(64, 4);
        let (mut producer, mut consumer) = region.ring(64);
        assert!(producer.try_push(7, b"hello, ring").unwrap());
        let mut small = [0; 4];
        assert!(matches!(
            consumer.try_pop(&mut small),
            Err(Error::Truncated(_))
        ));
        // A peeked message that is not consumed stays at the front.
        assert_eq!(consumer.peek().unwrap().unwrap().len(), 11);
        let message = consumer.peek().unwrap().unwrap();
        assert_eq!((message.meta(), message.len()), (7, 11));
        let mut exact = [0; 11];
        assert_eq!(message.copy_to(&mut exact).unwrap(), 11);
        assert_eq!(&exact, b"hello, ring");
        message.consume();
        assert_eq!(pop(&mut consumer), None);
    }

    #[test]
    fn handles_attached_later_resume_the_counters() {
        let mut region = Region::for_layout(64, 4);
        {
            let (mut producer, mut consumer) = region.ring(64);
            for seq in 0..6 {
                assert!(producer.try_push(seq, &payload(seq, 10)).unwrap());
                assert_eq!(pop(&mut consumer), Some((seq, payload(seq, 10))));
            }
            assert!(producer.try_push(6, &payload(6, 10)).unwrap());
        }
        // SAFETY: the previous handles are gone.
        let (mut producer, mut consumer) = unsafe {
            (
                region.attach().unwrap().into_producer(),
                region.attach().unwrap().into_consumer(),
            )
        };
        assert_eq!(producer.free_slots().unwrap(), 3);
        assert_eq!(pop(&mut consumer), Some((6, payload(6, 10))));
        assert!(producer.try_push(7, &payload(7, 10)).unwrap());
        assert_eq!(pop(&mut consumer), Some((7, payload(7, 10))));
    }

    #[test]
    fn a_broken_peer_is_an_error_not_a_crash() {
        let mut region = Region::for_layout(64, 4);
        let (mut producer, mut consumer) = region.ring(64);
        // The consumer's view: a tail beyond the ring.
        region.control().tail.0.store(5, Ordering::Release);
        assert!(matches!(consumer.peek(), Err(Error::Transport(_))));
        // A header claiming more bytes than were published, or than the ring holds.
        for claimed in [64, 1 << 40, u64::MAX] {
            let mut region = Region::for_layout(64, 4);
            let (mut producer, mut consumer) = region.ring(64);
            assert!(producer.try_push(1, b"x").unwrap());
            // SAFETY: slot 0 holds the message's header; nobody else touches the region now.
            unsafe { region.ptr().add(CONTROL_LEN).cast::<u64>().write(claimed) };
            assert!(
                matches!(consumer.peek(), Err(Error::Transport(_))),
                "{claimed}"
            );
        }
        // The producer's view: a head beyond the tail.
        region.control().head.0.store(3, Ordering::Release);
        assert!(matches!(producer.free_slots(), Err(Error::Transport(_))));
        assert!(matches!(
            producer.try_push(0, &[0; 200]),
            Err(Error::Transport(_))
        ));
    }

    #[test]
    fn two_threads_move_a_million_messages_in_order() {
        const MESSAGES: u64 = 1_000_000;
        const STALL: Duration = Duration::from_secs(30);
        let mut region = Region::for_layout(64, 64);
        let (mut producer, mut consumer) = region.ring(64);
        let len_of = |seq: u64| (seq * 37 % 300) as usize;
        let byte = |seq: u64, i: usize| (seq as usize ^ i.wrapping_mul(131)) as u8;
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut data = Vec::new();
                for seq in 0..MESSAGES {
                    data.clear();
                    data.extend((0..len_of(seq)).map(|i| byte(seq, i)));
                    let waiting = Instant::now();
                    while !producer.try_push(seq, &data).unwrap() {
                        assert!(waiting.elapsed() < STALL, "consumer stalled at {seq}");
                        std::thread::yield_now();
                    }
                }
            });
            let mut buf = [0; 300];
            for seq in 0..MESSAGES {
                let waiting = Instant::now();
                let (meta, len) = loop {
                    if let Some(got) = consumer.try_pop(&mut buf).unwrap() {
                        break got;
                    }
                    assert!(waiting.elapsed() < STALL, "producer stalled at {seq}");
                    std::thread::yield_now();
                };
                assert_eq!((meta, len), (seq, len_of(seq)));
                assert!(
                    buf[..len]
                        .iter()
                        .enumerate()
                        .all(|(i, &b)| b == byte(seq, i)),
                    "{seq}"
                );
            }
            assert!(consumer.is_empty().unwrap());
        });
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{:?}",
            started.elapsed()
        );
    }

    /// Bytes of a ring image in a fuzz input: header, tail and head, then the slots.
    const IMAGE_CONTROL: usize = size_of::<RingHeader>() + 16;
    /// Byte written after the end of a fuzzed region, checked afterwards.
    const CANARY: u8 = 0xa5;

    /// A compact image of a ring in use: `slot_count` slots of `slot_size` bytes after
    /// `rounds` messages of random lengths, some of them still queued.
    fn ring_image(slot_size: usize, slot_count: usize, rng: &mut crate::fuzz::Rng) -> Vec<u8> {
        let mut region = Region::for_layout(slot_size, slot_count);
        {
            let (mut producer, mut consumer) = region.ring(slot_size);
            let max = producer.layout().max_payload();
            for seq in 0..rng.below(3 * slot_count) as u64 {
                let data = payload(seq, rng.len(max));
                if !producer.try_push(seq, &data).unwrap() {
                    pop(&mut consumer);
                }
            }
        }
        let bytes = region.len();
        // SAFETY: the region is ours and `bytes` long; the handles are gone.
        let mem = unsafe { std::slice::from_raw_parts(region.ptr(), bytes) };
        let mut image = mem[..size_of::<RingHeader>()].to_vec();
        image.extend_from_slice(&mem[RING_ALIGN..RING_ALIGN + 8]);
        image.extend_from_slice(&mem[2 * RING_ALIGN..2 * RING_ALIGN + 8]);
        image.extend_from_slice(&mem[CONTROL_LEN..]);
        image
    }

    /// Whatever a broken or hostile peer leaves in a ring's memory (header, counters and
    /// slots, in a region of any length): attaching refuses what is no valid ring for the
    /// region; a consumer peeks and copies only messages that fit the ring and were
    /// published, from memory inside the region, without allocating; a producer pushes
    /// only inside the region; everything else is a transport error, never a panic.
    #[test]
    fn fuzz_ring_attach_and_peek() {
        let mut rng = crate::fuzz::Rng::new(3);
        let seeds = [(64, 1), (64, 4), (128, 8), (192, 2), (64, 16)]
            .into_iter()
            .map(|(size, count)| ring_image(size, count, &mut rng))
            .collect();
        let target = crate::fuzz::Target {
            name: "shm ring attach and peek",
            default_cases: 50_000,
            seeds,
            max_len: IMAGE_CONTROL + 16 * 192,
            dict: vec![
                MAGIC,
                VERSION as u64,
                64,
                128,
                16,
                MESSAGE_HEADER_LEN as u64,
            ],
        };
        crate::fuzz::run(&target, |input, rng| {
            let (control, slots) = input.split_at(input.len().min(IMAGE_CONTROL));
            let len = match rng.below(8) {
                0 => rng.len(CONTROL_LEN + 4096),
                1 => CONTROL_LEN + slots.len() - rng.below(slots.len() + 1),
                _ => CONTROL_LEN + slots.len(),
            };
            // One line more than the region needs, for the canary.
            let mut region = Region {
                lines: vec![Line([0; 128]); len.div_ceil(128) + 1],
                len,
            };
            let base = region.ptr();
            let total = region.lines.len() * 128;
            // SAFETY: the buffer is ours, `total` bytes long, and no handle exists yet.
            let mem = unsafe { std::slice::from_raw_parts_mut(base, total) };
            mem[len..].fill(CANARY);
            let header = size_of::<RingHeader>();
            let put = |mem: &mut [u8], at: usize, bytes: &[u8]| {
                if at < len {
                    let n = bytes.len().min(len - at);
                    mem[at..at + n].copy_from_slice(&bytes[..n]);
                }
            };
            put(mem, 0, &control[..control.len().min(header)]);
            put(
                mem,
                RING_ALIGN,
                control.get(header..header + 8).unwrap_or(&[]),
            );
            put(
                mem,
                2 * RING_ALIGN,
                control.get(header + 8..).unwrap_or(&[]),
            );
            put(mem, CONTROL_LEN, slots);
            let inside = |p: *const u8, n: usize| {
                let (start, end) = (base as usize + CONTROL_LEN, base as usize + len);
                n == 0 || (p as usize >= start && p as usize + n <= end)
            };
            let ring = match region.attach() {
                Ok(ring) => ring,
                Err(Error::Transport(_)) => return,
                Err(e) => panic!("attach: {e}"),
            };
            let layout = ring.layout();
            assert!(layout.region_len() <= len);
            {
                // SAFETY: the only consumer of the region, used on this thread.
                let mut consumer = unsafe { ring.into_consumer() };
                for _ in 0..8 {
                    let (peeked, usage) =
                        crate::fuzz::measure(|| consumer.peek().map(|m| m.is_some()));
                    match peeked {
                        Ok(false) => break,
                        Err(Error::Transport(_)) => break,
                        Err(e) => panic!("peek: {e}"),
                        Ok(true) => assert_eq!(usage.largest, 0, "peek allocated"),
                    }
                    let message = consumer.peek().unwrap().unwrap();
                    assert!(message.len() <= layout.max_payload());
                    let (first, second) = message.as_slices();
                    assert_eq!(first.len() + second.len(), message.len());
                    assert!(inside(first.as_ptr(), first.len()), "first piece outside");
                    assert!(
                        inside(second.as_ptr(), second.len()),
                        "second piece outside"
                    );
                    let mut buf = vec![0u8; rng.len(message.len() + 64)];
                    match message.copy_to(&mut buf) {
                        Ok(n) => assert_eq!(n, message.len()),
                        Err(Error::Truncated(_)) => assert!(buf.len() < message.len()),
                        Err(e) => panic!("copy_to: {e}"),
                    }
                    message.copy_range(rng.len(message.len()), &mut buf);
                    message.consume();
                }
            }
            {
                // SAFETY: the consumer is gone; this is the region's only handle now.
                let mut producer = unsafe { region.attach().unwrap().into_producer() };
                let data = payload(7, rng.len(layout.max_payload() + 64));
                match producer.try_push(7, &data) {
                    Ok(_) | Err(Error::Transport(_)) => {}
                    Err(Error::InvalidArgument(_)) => assert!(data.len() > layout.max_payload()),
                    Err(e) => panic!("try_push: {e}"),
                }
            }
            // SAFETY: as above; no handle is left.
            let mem = unsafe { std::slice::from_raw_parts(base, total) };
            assert!(
                mem[len..].iter().all(|&b| b == CANARY),
                "wrote past the region"
            );
        });
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(usize),
        Pop,
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Any interleaving of pushes and pops on one thread behaves like a bounded queue that
        /// counts slots.
        #[test]
        fn behaves_like_a_queue(
            slot_size in prop::sample::select(vec![64usize, 128]),
            slot_count in prop::sample::select(vec![1usize, 2, 4, 8]),
            ops in prop::collection::vec(
                prop_oneof![(0usize..1100).prop_map(Op::Push), Just(Op::Pop)],
                0..200,
            ),
        ) {
            let mut region = Region::for_layout(slot_size, slot_count);
            let (mut producer, mut consumer) = region.ring(slot_size);
            let layout = producer.layout();
            let mut model = VecDeque::new();
            let mut used = 0;
            for (seq, op) in (0u64..).zip(ops) {
                match op {
                    Op::Push(len) => {
                        let data = payload(seq, len);
                        match layout.slots_for(len) {
                            None => prop_assert!(producer.try_push(seq, &data).is_err()),
                            Some(slots) => {
                                let fits = used + slots <= slot_count;
                                prop_assert_eq!(producer.try_push(seq, &data).unwrap(), fits);
                                if fits {
                                    used += slots;
                                    model.push_back((seq, data));
                                }
                            }
                        }
                    }
                    Op::Pop => {
                        let expected = model.pop_front();
                        if let Some((_, data)) = &expected {
                            used -= layout.slots_for(data.len()).unwrap();
                        }
                        prop_assert_eq!(pop(&mut consumer), expected);
                    }
                }
                prop_assert_eq!(producer.free_slots().unwrap(), slot_count - used);
            }
        }
    }
}

/// Model checks of the ring's memory ordering. Run them with (their own target directory keeps
/// the `--cfg loom` build from evicting the normal one):
///
/// ```text
/// RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
///     cargo test -p hcomm --profile loom --lib -- transport::shm::ring::loom_tests
/// ```
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// Aligned memory for a ring; loom's objects live in it, so it outlives every thread.
    #[repr(C, align(128))]
    #[derive(Clone, Copy)]
    struct Line([u8; 128]);

    /// Runs `produce` and `consume` on two threads over a fresh ring of `slot_count` 64-byte
    /// slots.
    fn model(slot_count: usize, produce: fn(&mut Producer), consume: fn(&mut Consumer)) {
        loom::model(move || {
            let len = RingLayout::new(64, slot_count).unwrap().region_len();
            let mut region = vec![Line([0; 128]); len.div_ceil(128)];
            let (ptr, len) = (region.as_mut_ptr().cast::<u8>(), region.len() * 128);
            // SAFETY: the region is ours, nothing else touches it, and both threads are joined
            // before it is dropped.
            let (mut producer, mut consumer) = unsafe {
                ShmRing::init(ptr, len, 64).unwrap();
                (
                    ShmRing::attach(ptr, len).unwrap().into_producer(),
                    ShmRing::attach(ptr, len).unwrap().into_consumer(),
                )
            };
            let sender = thread::spawn(move || produce(&mut producer));
            consume(&mut consumer);
            sender.join().unwrap();
            drop(region);
        });
    }

    fn push(producer: &mut Producer, meta: u64, payload: &[u8]) {
        while !producer.try_push(meta, payload).unwrap() {
            thread::yield_now();
        }
    }

    fn pop(consumer: &mut Consumer, buf: &mut [u8]) -> (u64, usize) {
        loop {
            if let Some(got) = consumer.try_pop(buf).unwrap() {
                return got;
            }
            thread::yield_now();
        }
    }

    /// Three one-slot messages through two slots: the third reuses the first one's slot.
    #[test]
    fn messages_arrive_whole_and_slots_are_reused_safely() {
        model(
            2,
            |p| {
                for seq in 0..3u8 {
                    push(p, u64::from(seq), &[seq; 40]);
                }
            },
            |c| {
                let mut buf = [0; 64];
                for seq in 0..3u8 {
                    assert_eq!(pop(c, &mut buf), (u64::from(seq), 40));
                    assert_eq!(buf[..40], [seq; 40]);
                }
            },
        );
    }

    /// A two-slot message that wraps from the last slot to the first.
    #[test]
    fn a_wrapping_message_arrives_whole() {
        model(
            2,
            |p| {
                push(p, 1, &[1; 10]);
                push(p, 2, &[2; 100]);
            },
            |c| {
                let mut buf = [0; 128];
                assert_eq!(pop(c, &mut buf), (1, 10));
                assert_eq!(buf[..10], [1; 10]);
                let message = loop {
                    if let Some(message) = c.peek().unwrap() {
                        break message;
                    }
                    thread::yield_now();
                };
                let (first, second) = message.as_slices();
                assert_eq!((first.len(), second.len()), (48, 52));
                assert!(first.iter().chain(second).all(|&b| b == 2));
                message.consume();
            },
        );
    }
}
