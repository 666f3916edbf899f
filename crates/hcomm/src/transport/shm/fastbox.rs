//! Fast boxes: single-cache-line messages from one rank to another, beside the ring.
//!
//! A [`super::ring`] message costs its reader two cache-line transfers in a row: the ring's
//! `tail`, then the slot it announces. A fast box slot carries its own announcement: a
//! *stamp* in the slot's first word, stored last with release ordering, so a reader polling
//! the next slot sees a whole message with one transfer (the idea of Open MPI's vader
//! "fast boxes" and of NCCL's LL protocol). The layer above gives every message of a pair,
//! through the box or the ring, the next number of one sequence, and stamps a box message with
//! its number plus one; the reader takes from whichever of the two holds the number it expects,
//! so the pair's messages stay in order.
//!
//! # Layout
//!
//! ```text
//!   0  taken   AtomicU64: slots the reader has finished with (written by the reader)
//!  64  split   the pair's split slot (see [`super::split`]), on a line of its own
//! 128  slot 0 | slot 1 | ... | slot SLOTS-1: 64 bytes each, a stamp and seven body words
//! ```
//!
//! Slot `k % SLOTS` holds the writer's `k`-th box message. Stamps only grow, and a slot is
//! only ever written whole by the writer, so a stale stamp (the number of a message `SLOTS`
//! box messages older) never equals the one the reader expects: nothing in a slot can pass
//! for a message that is not there. The writer reuses a slot once `taken` says the reader is
//! done with it; it reloads `taken` only when the box looks full, so the reader's stores to it
//! rarely cost the writer a transfer.
//!
//! The body words are atomics accessed with relaxed ordering: the stamp's release and acquire
//! order them, and a reader that a broken writer races with sees torn words rather than
//! undefined behaviour. Bodies are opaque here; the layer above validates them.

use std::ptr::NonNull;

use sync::{AtomicU64, Ordering};

use super::split::SplitSlot;

/// Slots of a fast box (two in loom models, which explore every interleaving).
pub(crate) const SLOTS: usize = if cfg!(loom) { 2 } else { 16 };
/// Body words of a slot.
pub(crate) const BODY_WORDS: usize = 7;
/// Bytes of a fast box's region (a multiple of 128).
pub(crate) const REGION_LEN: usize = 128 + SLOTS * 64;

const _: () = assert!(REGION_LEN % 128 == 0);

/// Where the atomics come from: `std`, or loom's model checker under `--cfg loom`.
mod sync {
    #[cfg(loom)]
    pub(super) use loom::sync::atomic::{AtomicU64, Ordering};
    #[cfg(not(loom))]
    pub(super) use std::sync::atomic::{AtomicU64, Ordering};
}

/// One slot: the stamp (0: never written) and the body.
#[repr(C, align(64))]
struct Slot {
    stamp: AtomicU64,
    body: [AtomicU64; BODY_WORDS],
}

/// The region: the reader's counter and the split slot on lines of their own, then the
/// slots.
#[repr(C)]
struct Region {
    taken: AtomicU64,
    _pad: [u64; 7],
    split: SplitSlot,
    _pad_split: [u64; 6],
    slots: [Slot; SLOTS],
}

#[cfg(not(loom))]
const _: () = assert!(
    std::mem::size_of::<Region>() == REGION_LEN
        && std::mem::offset_of!(Region, slots) == 128
        && std::mem::offset_of!(Slot, stamp) == 0
        && std::mem::offset_of!(Region, split) == 64
);

/// A fast box in shared memory, before it is split into its two ends.
#[derive(Debug)]
pub(crate) struct FastBox {
    region: NonNull<Region>,
}

// SAFETY: the region is shared memory reached only through atomics; the handle holds no
// thread-bound state.
unsafe impl Send for FastBox {}

impl FastBox {
    /// Initialises an empty fast box at `base` (the tests' boxes: an inbox's memory is zero,
    /// which is an empty box already).
    ///
    /// # Safety
    /// `base` must be valid for [`REGION_LEN`] bytes, aligned to 128, and not in use by
    /// anyone else until the box is published.
    #[cfg(all(test, not(loom)))]
    pub(crate) unsafe fn init(base: *mut u8) -> FastBox {
        let region = base.cast::<Region>();
        // SAFETY: the caller's promise: the memory is ours, large and aligned enough; a
        // region of zeroed atomics is an empty box.
        unsafe {
            std::ptr::addr_of_mut!((*region).taken).write(AtomicU64::new(0));
            std::ptr::addr_of_mut!((*region).split).write(SplitSlot::default());
            for i in 0..SLOTS {
                let slot = std::ptr::addr_of_mut!((*region).slots[i]);
                std::ptr::addr_of_mut!((*slot).stamp).write(AtomicU64::new(0));
                for w in 0..BODY_WORDS {
                    std::ptr::addr_of_mut!((*slot).body[w]).write(AtomicU64::new(0));
                }
            }
        }
        FastBox {
            // SAFETY: the caller promised a valid pointer, so it is not null.
            region: unsafe { NonNull::new_unchecked(region) },
        }
    }

    /// The fast box initialised at `base` by [`FastBox::init`], possibly in another process.
    ///
    /// # Safety
    /// `base` must point to a region that [`FastBox::init`] initialised, mapped and valid for
    /// [`REGION_LEN`] bytes for as long as the box's ends live.
    pub(crate) unsafe fn attach(base: *mut u8) -> FastBox {
        FastBox {
            // SAFETY: the caller promised a valid pointer, so it is not null.
            region: unsafe { NonNull::new_unchecked(base.cast()) },
        }
    }

    /// The writing end; there must be only one.
    pub(crate) fn into_writer(self) -> FastWriter {
        FastWriter {
            region: self.region,
            written: 0,
            taken: 0,
        }
    }

    /// The reading end; there must be only one.
    pub(crate) fn into_reader(self) -> FastReader {
        FastReader {
            region: self.region,
            read: 0,
        }
    }
}

/// The writing end of a fast box.
#[derive(Debug)]
pub(crate) struct FastWriter {
    region: NonNull<Region>,
    /// Messages written.
    written: u64,
    /// The reader's `taken`, as last loaded.
    taken: u64,
}

// SAFETY: as for `FastBox`; the counters are this end's own.
unsafe impl Send for FastWriter {}

impl FastWriter {
    fn region(&self) -> &Region {
        // SAFETY: `attach`/`init` promised the region stays mapped while this end lives; it
        // is made of atomics only.
        unsafe { self.region.as_ref() }
    }

    /// Writes a message stamped `stamp` (not 0) with `body` into the next slot; returns
    /// `false`, writing nothing, when every slot still holds a message the reader has not
    /// finished with.
    pub(crate) fn try_push(&mut self, stamp: u64, body: &[u64; BODY_WORDS]) -> bool {
        let slots = SLOTS as u64;
        if self.written.wrapping_sub(self.taken) >= slots {
            // Acquire: the reader's loads of the slot happened before its store of `taken`.
            self.taken = self.region().taken.load(Ordering::Acquire);
            if self.written.wrapping_sub(self.taken) >= slots {
                return false;
            }
        }
        let slot = &self.region().slots[(self.written % slots) as usize];
        for (word, &value) in slot.body.iter().zip(body) {
            word.store(value, Ordering::Relaxed);
        }
        // Release: a reader that sees the stamp sees the body.
        slot.stamp.store(stamp, Ordering::Release);
        self.written = self.written.wrapping_add(1);
        true
    }

    /// The pair's split slot, in the reader's inbox (the writer is the sender of the splits).
    pub(crate) fn split(&self) -> &SplitSlot {
        &self.region().split
    }
}

/// The reading end of a fast box.
#[derive(Debug)]
pub(crate) struct FastReader {
    region: NonNull<Region>,
    /// Messages read.
    read: u64,
}

// SAFETY: as for `FastBox`; the counter is this end's own.
unsafe impl Send for FastReader {}

impl FastReader {
    fn region(&self) -> &Region {
        // SAFETY: as in `FastWriter::region`.
        unsafe { self.region.as_ref() }
    }

    fn next(&self) -> &Slot {
        &self.region().slots[(self.read % SLOTS as u64) as usize]
    }

    /// Offset in the region of the stamp of the next slot: a waiter may watch it (for the
    /// stamp it expects) without this end, until this end reads again.
    pub(crate) fn next_stamp_offset(&self) -> usize {
        128 + (self.read % SLOTS as u64) as usize * 64
    }

    /// Whether the next slot holds the message stamped `stamp`.
    pub(crate) fn ready(&self, stamp: u64) -> bool {
        self.next().stamp.load(Ordering::Acquire) == stamp
    }

    /// The body of the message stamped `stamp` when it is the next one, without taking it.
    pub(crate) fn peek(&self, stamp: u64) -> Option<[u64; BODY_WORDS]> {
        let slot = self.next();
        // Acquire: pairs with the writer's release store of the stamp.
        if slot.stamp.load(Ordering::Acquire) != stamp {
            return None;
        }
        Some(std::array::from_fn(|w| {
            slot.body[w].load(Ordering::Relaxed)
        }))
    }

    /// Finishes with the next message (after [`FastReader::peek`] returned it): the writer
    /// may reuse its slot.
    pub(crate) fn consume(&mut self) {
        self.read = self.read.wrapping_add(1);
        // Release: this end's loads of the slot happen before the writer's next stores to it.
        self.region().taken.store(self.read, Ordering::Release);
    }

    /// The pair's split slot, in this rank's inbox (this end's rank receives the splits).
    pub(crate) fn split(&self) -> &SplitSlot {
        &self.region().split
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[repr(C, align(128))]
    struct Mem([u8; REGION_LEN]);

    fn pair(mem: &mut Mem) -> (FastWriter, FastReader) {
        let base = mem.0.as_mut_ptr();
        // SAFETY: the memory is ours, aligned and long enough, and outlives both ends here.
        unsafe {
            FastBox::init(base);
            (
                FastBox::attach(base).into_writer(),
                FastBox::attach(base).into_reader(),
            )
        }
    }

    #[test]
    fn messages_arrive_in_order_and_a_full_box_refuses() {
        let mut mem = Mem([0; REGION_LEN]);
        let (mut w, mut r) = pair(&mut mem);
        assert_eq!(r.peek(1), None);
        for k in 1..=SLOTS as u64 {
            assert!(w.try_push(k, &[k; BODY_WORDS]));
        }
        assert!(
            !w.try_push(99, &[0; BODY_WORDS]),
            "wrote into an unread slot"
        );
        for k in 1..=SLOTS as u64 {
            assert!(r.ready(k));
            assert_eq!(r.peek(k + 1), None, "took a stamp it was not looking for");
            assert_eq!(r.peek(k), Some([k; BODY_WORDS]));
            r.consume();
        }
        // The slots are free again; the stale stamp in the next slot does not pass for the
        // message expected there.
        assert_eq!(r.peek(SLOTS as u64 + 1), None);
        assert!(w.try_push(SLOTS as u64 + 1, &[7; BODY_WORDS]));
        assert_eq!(r.peek(SLOTS as u64 + 1), Some([7; BODY_WORDS]));
    }

    #[test]
    fn a_writer_and_a_reader_on_two_threads_lose_nothing() {
        let mut mem = Mem([0; REGION_LEN]);
        let (mut w, mut r) = pair(&mut mem);
        const N: u64 = 200_000;
        std::thread::scope(|s| {
            s.spawn(move || {
                for k in 1..=N {
                    let body = std::array::from_fn(|i| k * 8 + i as u64);
                    while !w.try_push(k, &body) {
                        std::hint::spin_loop();
                    }
                }
            });
            for k in 1..=N {
                let body = loop {
                    if let Some(b) = r.peek(k) {
                        break b;
                    }
                    std::hint::spin_loop();
                };
                assert_eq!(body, std::array::from_fn(|i| k * 8 + i as u64));
                r.consume();
            }
        });
    }
}

/// Loom model checks of the stamp and `taken` handshakes (see `tests/loom.rs`).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// More messages than slots, on two threads: each arrives whole and in order, and no
    /// slot is rewritten while the reader still reads it.
    #[test]
    fn messages_arrive_whole_through_reused_slots() {
        loom::model(|| {
            let region: &'static mut Region = Box::leak(Box::new(Region {
                taken: AtomicU64::new(0),
                _pad: [0; 7],
                split: SplitSlot::default(),
                _pad_split: [0; 6],
                slots: std::array::from_fn(|_| Slot {
                    stamp: AtomicU64::new(0),
                    body: std::array::from_fn(|_| AtomicU64::new(0)),
                }),
            }));
            let base = (region as *mut Region).cast::<u8>();
            // SAFETY: the region is initialised above and leaked, so it outlives both ends.
            let (mut w, mut r) = unsafe {
                (
                    FastBox::attach(base).into_writer(),
                    FastBox::attach(base).into_reader(),
                )
            };
            let total = SLOTS as u64 + 1;
            let writer = thread::spawn(move || {
                for k in 1..=total {
                    while !w.try_push(k, &[k; BODY_WORDS]) {
                        thread::yield_now();
                    }
                }
            });
            for k in 1..=total {
                let body = loop {
                    if let Some(b) = r.peek(k) {
                        break b;
                    }
                    thread::yield_now();
                };
                assert_eq!(body, [k; BODY_WORDS]);
                r.consume();
            }
            writer.join().unwrap();
        });
    }
}
