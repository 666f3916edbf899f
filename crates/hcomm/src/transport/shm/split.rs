//! The split slot: two words in a pair's fast-box region through which a receiver and its
//! local sender share the copy of one large message between both processes.
//!
//! The receiver of a large message pulls it out of the sender's buffer with cross-memory
//! attach; with a split, the sender writes part of it into the receiver's buffer at the same
//! time (`process_vm_writev`), so both cores copy. The message is cut into `pieces` pieces;
//! the receiver takes pieces from the front, the sender from the back, each claiming one
//! piece at a time in the `claim` word, so that whoever has time copies more, and a sender
//! that does not run (busy elsewhere, not in a call) leaves every piece to the receiver. The
//! sender reports each piece it wrote in the `sent` word.
//!
//! ```text
//! claim: generation (32 bits) | front: next piece of the receiver (16) | back: the sender's (16)
//! sent:  generation (32 bits) | failed (1) | pieces the sender wrote (31)
//! ```
//!
//! The receiver owns the slot (it lies in its inbox, in the region of the sender's frames):
//! it [`opens`](SplitSlot::open) it for a message with a new generation, which the frame that
//! offers the split carries, and only once the sender's claims of the previous message are
//! all reported; a claim is a compare-and-swap that checks the generation, so a sender that
//! comes late (after the receiver took every piece, or for an older message) claims nothing.
//! When the receiver is done with its pieces, or gives the receive up, it
//! [`closes`](SplitSlot::close) the slot (takes every piece left) and waits for the pieces the
//! sender claimed to be reported: from then on the sender writes nothing into that buffer.
//! A receiver that waited `HCOMM_TIMEOUT` for a claimed piece [`revokes`](SplitSlot::revoke)
//! the slot instead (the pair is then failed), and the sender checks that the slot still
//! [`holds`](SplitSlot::holds) its generation immediately before each write.
//! Nothing here is trusted beyond this pair: a broken peer that scribbles on the words makes
//! the split fail or wait for its own reports, and the receiver's waits are bounded.

use std::sync::atomic::{AtomicU64, Ordering};

/// The most pieces of one split (the width of a claim's counters).
pub(crate) const MAX_PIECES: usize = u16::MAX as usize;

/// Bit of the `sent` word: the sender failed to write its last claimed piece and stopped.
const FAILED: u64 = 1 << 31;

/// The two words of a pair's split slot (zero: never opened).
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct SplitSlot {
    claim: AtomicU64,
    sent: AtomicU64,
}

/// What the sender reported of its part of a split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Pieces it wrote (the last ones of the message, counted from the back).
    pub pieces: usize,
    /// It failed to write the piece after those and stopped.
    pub failed: bool,
}

fn claim_word(gen: u32, front: usize, back: usize) -> u64 {
    (u64::from(gen) << 32) | ((front as u64 & 0xffff) << 16) | (back as u64 & 0xffff)
}

fn parts(word: u64) -> (u32, usize, usize) {
    (
        (word >> 32) as u32,
        ((word >> 16) & 0xffff) as usize,
        (word & 0xffff) as usize,
    )
}

impl SplitSlot {
    /// The receiver opens the slot for a message of `pieces` pieces (at most [`MAX_PIECES`])
    /// under generation `gen` (new for every split of the pair, never 0). The previous split
    /// must be closed, with every piece the sender claimed reported.
    pub(crate) fn open(&self, gen: u32, pieces: usize) {
        self.sent.store(u64::from(gen) << 32, Ordering::Relaxed);
        // Release: a sender that claims under `gen` sees `sent` reset first.
        self.claim.store(
            claim_word(gen, 0, pieces.min(MAX_PIECES)),
            Ordering::Release,
        );
    }

    /// Claims the next piece from the front (the receiver) or the back (the sender) under
    /// generation `gen`: its index, or `None` when no piece is left or the slot was opened
    /// for another message.
    pub(crate) fn claim(&self, gen: u32, from_back: bool) -> Option<usize> {
        let mut word = self.claim.load(Ordering::Acquire);
        loop {
            let (g, front, back) = parts(word);
            if g != gen || front >= back {
                return None;
            }
            let (next, piece) = match from_back {
                true => (claim_word(gen, front, back - 1), back - 1),
                false => (claim_word(gen, front + 1, back), front),
            };
            match self
                .claim
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(piece),
                Err(now) => word = now,
            }
        }
    }

    /// The receiver takes every piece left of generation `gen`; returns the first piece the
    /// sender claimed (the pieces from there to the end are the sender's), or `None` when the
    /// slot holds another generation (a peer that broke the protocol).
    pub(crate) fn close(&self, gen: u32) -> Option<usize> {
        let mut word = self.claim.load(Ordering::Acquire);
        loop {
            let (g, front, back) = parts(word);
            if g != gen {
                return None;
            }
            if front >= back {
                return Some(back);
            }
            match self.claim.compare_exchange_weak(
                word,
                claim_word(gen, back, back),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(back),
                Err(now) => word = now,
            }
        }
    }

    /// The receiver gives up the split of generation `gen` while the sender still holds
    /// claimed pieces (it did not report them within `HCOMM_TIMEOUT`): the slot then holds no
    /// generation (0, which no message uses), so the sender claims nothing more and its check
    /// before each write ([`SplitSlot::holds`]) fails. Returns whether the slot held `gen`.
    pub(crate) fn revoke(&self, gen: u32) -> bool {
        self.claim
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
                (parts(word).0 == gen).then_some(0)
            })
            .is_ok()
    }

    /// Whether the slot still holds generation `gen`: the sender checks it immediately before
    /// each write of a piece it claimed, so that it never starts one after the receiver
    /// [revoked](SplitSlot::revoke) the split.
    pub(crate) fn holds(&self, gen: u32) -> bool {
        parts(self.claim.load(Ordering::SeqCst)).0 == gen
    }

    /// The sender reports, under generation `gen`, that it wrote `pieces` pieces and whether
    /// it failed the one after them (then it claims nothing more). A report for a generation
    /// the slot no longer holds (the receiver finished that message and opened the slot for
    /// the next) changes nothing.
    pub(crate) fn report(&self, gen: u32, pieces: usize, failed: bool) {
        let word = (u64::from(gen) << 32)
            | (pieces as u64 & (FAILED - 1))
            | if failed { FAILED } else { 0 };
        let mut now = self.sent.load(Ordering::Relaxed);
        while (now >> 32) as u32 == gen {
            // Release: the receiver that sees the report sees the bytes the sender's writes
            // put into its buffer (the kernel wrote them before the call returned).
            match self
                .sent
                .compare_exchange_weak(now, word, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(seen) => now = seen,
            }
        }
    }

    /// What the sender reported under generation `gen` (nothing yet: 0 pieces; a report of
    /// another generation reads as a failure, which makes the receiver copy the rest itself).
    pub(crate) fn sent(&self, gen: u32) -> Sent {
        let word = self.sent.load(Ordering::Acquire);
        if (word >> 32) as u32 != gen {
            return Sent {
                pieces: 0,
                failed: true,
            };
        }
        Sent {
            pieces: (word & (FAILED - 1)) as usize,
            failed: word & FAILED != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ends_claim_every_piece_once_and_a_late_sender_claims_nothing() {
        let s = SplitSlot::default();
        s.open(7, 5);
        assert_eq!(s.claim(7, false), Some(0));
        assert_eq!(s.claim(7, true), Some(4));
        assert_eq!(s.claim(6, true), None, "another generation claims nothing");
        assert_eq!(s.claim(7, true), Some(3));
        assert_eq!(s.claim(7, false), Some(1));
        assert_eq!(s.claim(7, false), Some(2));
        assert_eq!(s.claim(7, false), None);
        assert_eq!(s.claim(7, true), None);
        assert_eq!(s.close(7), Some(3), "the sender's pieces are 3 and 4");
        s.report(7, 2, false);
        assert_eq!(
            s.sent(7),
            Sent {
                pieces: 2,
                failed: false
            }
        );
        assert!(
            s.sent(8).failed,
            "a report of another generation is no report"
        );
        s.open(8, 2);
        s.report(7, 1, true);
        assert_eq!(
            s.sent(8),
            Sent {
                pieces: 0,
                failed: false
            },
            "a late report of the previous message changes nothing"
        );
    }

    #[test]
    fn closing_takes_what_is_left_and_a_failure_is_reported() {
        let s = SplitSlot::default();
        s.open(1, 10);
        assert_eq!(s.claim(1, true), Some(9));
        assert_eq!(s.claim(1, false), Some(0));
        assert_eq!(s.close(1), Some(9));
        assert_eq!(s.claim(1, true), None, "nothing is left after the close");
        assert_eq!(s.close(2), None);
        s.report(1, 0, true);
        assert_eq!(
            s.sent(1),
            Sent {
                pieces: 0,
                failed: true
            }
        );
        s.open(2, MAX_PIECES + 3);
        assert_eq!(s.claim(2, true), Some(MAX_PIECES - 1), "pieces are capped");
        assert_eq!(
            s.sent(2),
            Sent {
                pieces: 0,
                failed: false
            }
        );
    }

    #[test]
    fn a_revoked_split_is_held_no_more_and_claims_nothing() {
        let s = SplitSlot::default();
        s.open(5, 4);
        assert_eq!(s.claim(5, true), Some(3));
        assert!(s.holds(5));
        assert!(!s.revoke(6), "another generation is not revoked");
        assert!(s.holds(5));
        assert!(s.revoke(5));
        assert!(!s.holds(5), "the sender's check before its write fails");
        assert_eq!(s.claim(5, true), None);
        assert_eq!(s.claim(5, false), None);
        assert_eq!(s.close(5), None, "nothing is left to wait for");
        s.open(6, 2);
        assert!(s.holds(6) && !s.holds(5));
    }

    #[test]
    fn two_threads_claim_disjoint_pieces() {
        let s = SplitSlot::default();
        s.open(3, 1000);
        let (a, b) = std::thread::scope(|sc| {
            let take = |back| {
                let s = &s;
                move || std::iter::from_fn(|| s.claim(3, back)).collect::<Vec<_>>()
            };
            let a = sc.spawn(take(false));
            let b = sc.spawn(take(true));
            (a.join().unwrap(), b.join().unwrap())
        });
        let mut all: Vec<usize> = a.iter().chain(&b).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        assert!(a.windows(2).all(|w| w[0] + 1 == w[1]));
        assert!(b.windows(2).all(|w| w[0] == w[1] + 1));
    }
}
