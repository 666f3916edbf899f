//! Deadlines, sans I/O: when each waited-for operation gives up, and which have given up at
//! a given instant.
//!
//! A wait arms its operations' deadline once they did not complete at the first look (a small
//! operation that completes at once never reads the clock), reads the clock itself and asks
//! at each look what expired at that `now`; the operations named fail with a timeout and are
//! taken back from matching and the rendezvous (`State::time_out`). An operation leaves the
//! timers when it leaves the engine. [`Timers`] reads no clock: its unit tests, and the test
//! `Pair` of `sansio_tests.rs`, pass instants of their own.

use rustc_hash::FxHashMap as HashMap;
use std::time::Instant;

use super::OpId;

/// The armed deadlines of operations.
#[derive(Debug, Default)]
pub(super) struct Timers {
    /// Each armed operation's deadline (the operations of the waits under way: a collective's
    /// wait arms every operation of its schedule).
    due: HashMap<OpId, Instant>,
    /// No deadline is earlier: a look before it costs one comparison. It may be earlier than
    /// every deadline left (after a disarm or a later re-arm); the next look past it finds
    /// none expired and moves it up.
    next: Option<Instant>,
}

impl Timers {
    /// Operation `id` gives up at `at` (replacing a deadline it had).
    #[inline]
    pub(super) fn arm(&mut self, id: OpId, at: Instant) {
        self.due.insert(id, at);
        self.next = Some(self.next.map_or(at, |n| n.min(at)));
    }

    /// Operation `id` waits no more (it completed, was taken back, or left the engine).
    #[inline]
    pub(super) fn disarm(&mut self, id: OpId) {
        if !self.due.is_empty() && self.due.remove(&id).is_some() && self.due.is_empty() {
            self.next = None;
        }
    }

    /// The first of `ids` whose deadline passed at `now`.
    #[inline]
    pub(super) fn expired(&mut self, now: Instant, ids: &[OpId]) -> Option<OpId> {
        if self.next.is_none_or(|next| now < next) {
            return None;
        }
        let late = ids
            .iter()
            .copied()
            .find(|id| self.due.get(id).is_some_and(|&at| now >= at));
        if late.is_none() && self.due.values().all(|&at| now < at) {
            // Only deadlines still to come: the next look past the earliest of them.
            self.next = self.due.values().copied().min();
        }
        late
    }

    /// Every armed operation whose deadline passed at `now`, earliest deadline first (for
    /// the test `Pair`, whose ranks wait for all their operations at once).
    #[cfg(test)]
    pub(super) fn all_expired(&self, now: Instant) -> Vec<OpId> {
        let mut due: Vec<(OpId, Instant)> = self
            .due
            .iter()
            .map(|(&o, &at)| (o, at))
            .filter(|&(_, at)| now >= at)
            .collect();
        due.sort_by_key(|&(o, at)| (at, o));
        due.into_iter().map(|(o, _)| o).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn deadlines_expire_at_their_instant_by_the_clock_passed_in() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut timers = Timers::default();
        assert_eq!(timers.expired(t0 + ms(1000), &[1]), None, "nothing armed");
        timers.arm(1, t0 + ms(10));
        timers.arm(2, t0 + ms(5));
        timers.arm(3, t0 + ms(20));
        // Just before the earliest: nothing, whichever operations are asked about.
        assert_eq!(timers.expired(t0 + ms(4), &[1, 2, 3]), None);
        assert!(timers.all_expired(t0 + ms(4)).is_empty());
        // At its instant the earliest expires; only among the operations asked about.
        assert_eq!(timers.expired(t0 + ms(5), &[1, 2]), Some(2));
        assert_eq!(timers.expired(t0 + ms(5), &[1, 3]), None);
        assert_eq!(timers.all_expired(t0 + ms(10)), [2, 1]);
        // Re-arming moves a deadline; a disarmed operation never expires.
        timers.arm(2, t0 + ms(30));
        assert_eq!(timers.all_expired(t0 + ms(10)), [1]);
        timers.disarm(1);
        assert_eq!(timers.expired(t0 + ms(25), &[1, 2, 3]), Some(3));
        assert_eq!(timers.all_expired(t0 + ms(25)), [3]);
        timers.disarm(3);
        assert_eq!(timers.expired(t0 + ms(29), &[2]), None);
        assert_eq!(timers.expired(t0 + ms(30), &[2]), Some(2));
        timers.disarm(2);
        assert!(timers.all_expired(t0 + ms(1000)).is_empty());
        assert_eq!(timers.expired(t0 + ms(1000), &[1, 2, 3]), None);
    }
}
