//! Waiting: the one backoff every wait follows (spin, yield, then sleep; the policy is
//! [`Backoff`]), and the engine's waits for operations, which sleep in `epoll_wait` or on the
//! doorbell.

use crate::config::Backoff;
use crate::error::{Error, PeerRank, Result};
use crate::observe::stall::StallWatch;
use crate::sync::lock;
use crate::transport::shm::link::Watch;
use rustix::buffer::spare_capacity;
use rustix::event::{epoll, Timespec};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::tcp::token;
use super::{
    Deadline, Engine, Io, Op, OpId, OpKind, ProtocolCounts, ANY_PEER, CLOCK_ROUNDS, DIRECT_READS,
    MAX_DIRECT_PEERS, SHM_POLLS_PER_EPOLL,
};

/// What a waiter that found nothing did before its next look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pause {
    /// It spun (or looked again at once, among the first looks).
    Spin,
    /// It yielded the CPU, the `n`th time since it started or was reset.
    Yield(u32),
    /// Spinning and yielding are over: it must sleep (at most [`Waiting::max_sleep`]).
    Sleep,
}

/// One wait's place in the [`Backoff`] policy.
#[derive(Debug, Clone)]
pub(crate) struct Waiting {
    policy: Backoff,
    /// Looks left to spin (none for a wait that spins by the clock, or must not spin).
    spins: u32,
    polls: u32,
    yields: u32,
}

impl Waiting {
    /// A wait that spins for `policy.polls` looks, or not at all unless `spin`.
    pub(crate) fn new(policy: Backoff, spin: bool) -> Waiting {
        Waiting {
            policy,
            spins: if spin { policy.polls } else { 0 },
            polls: 0,
            yields: 0,
        }
    }

    /// Pauses before the next look, as the policy says for a wait this far along.
    pub(crate) fn pause(&mut self) -> Pause {
        if self.polls < self.spins {
            if self.polls >= self.policy.eager_polls {
                std::hint::spin_loop();
            }
            self.polls += 1;
            return Pause::Spin;
        }
        match self.try_yield() {
            Some(n) => Pause::Yield(n),
            None => Pause::Sleep,
        }
    }

    /// Yields the CPU if the policy has yields left (spinning aside); returns how many times
    /// this wait yielded so far.
    pub(crate) fn try_yield(&mut self) -> Option<u32> {
        if self.yields >= self.policy.yields {
            return None;
        }
        self.yields += 1;
        std::thread::yield_now();
        Some(self.yields)
    }

    /// Something moved: start over with spinning and yielding.
    pub(crate) fn reset(&mut self) {
        self.polls = 0;
        self.yields = 0;
    }

    /// The longest sleep between looks.
    pub(crate) fn max_sleep(&self) -> Duration {
        self.policy.max_sleep
    }
}

/// Polls `watch` while the policy spins, without the engine's lock and without the clock;
/// returns whether it fired.
pub(super) fn spin_on(watch: &Watch<'_>, policy: Backoff) -> bool {
    let mut waiting = Waiting::new(policy, true);
    while waiting.pause() == Pause::Spin {
        if watch.ready() {
            return true;
        }
    }
    false
}

pub(super) fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    }
}

pub(super) fn poll(io: &Io, events: &mut Vec<epoll::Event>, sleep: Duration) -> Result<()> {
    events.clear();
    match epoll::wait(&io.epoll, spare_capacity(events), Some(&timespec(sleep))) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(Error::internal(format!("epoll_wait failed: {e}")).with_source(e.into())),
    }
}

impl Engine {
    /// Waits until `id` completes or `deadline` passes, and removes it.
    pub(crate) fn wait(&self, id: OpId, deadline: impl Into<Deadline>) -> Result<usize> {
        match self.wait_any(&[id], deadline) {
            Ok((_, r)) => r,
            Err(Error::Timeout(_)) => Err(lock(&self.shared.state).time_out(id)),
            Err(e) => {
                self.cancel(&[id]);
                Err(e)
            }
        }
    }

    /// A thread starts driving progress: the background thread steps aside (it is woken
    /// out of `epoll_wait` if it is in there, so the two do not compete for events).
    pub(super) fn enter_wait(&self) {
        let io = &self.shared.io;
        if io.waiters.fetch_add(1, Ordering::SeqCst) == 0 && io.polling.load(Ordering::SeqCst) {
            io.wake_all();
        }
    }

    /// A thread stops driving progress: the background thread resumes if needed.
    pub(super) fn leave_wait(&self) {
        let io = &self.shared.io;
        if io.waiters.fetch_sub(1, Ordering::SeqCst) == 1
            && io.pending_async.load(Ordering::SeqCst) > 0
        {
            self.shared.idle_cv.notify_one();
        }
    }

    /// Waits until one of `ids` completes or `deadline` passes; removes it and returns its
    /// index in `ids` with its result. On timeout the error names the first of `ids`, all of
    /// which stay posted (cancel them with [`Engine::cancel`]).
    pub(crate) fn wait_any(
        &self,
        ids: &[OpId],
        deadline: impl Into<Deadline>,
    ) -> Result<(usize, Result<usize>)> {
        self.enter_wait();
        let result = self.wait_any_inner(ids, deadline.into());
        self.leave_wait();
        result
    }

    pub(super) fn wait_any_inner(
        &self,
        ids: &[OpId],
        deadline: Deadline,
    ) -> Result<(usize, Result<usize>)> {
        let sh = &*self.shared;
        // A look before reading the clock: a small send is usually complete already.
        let look = || {
            let mut st = lock(&sh.state);
            st.handle(&[], true);
            for (i, &id) in ids.iter().enumerate() {
                if let Some(r) = st.take(id) {
                    return Err((i, r));
                }
            }
            Ok(match (sh.io.inbox.as_ref(), ids) {
                (Some(inbox), &[id]) if !sh.spin.is_zero() => st.watch(inbox, id),
                _ => None,
            })
        };
        // A receive from a local peer: watch for its next frame without the lock and without
        // the clock for a while (a small message then lands a cache-line transfer after it
        // was written), then look again; the loop below does the rest.
        match look() {
            Err(done) => return Ok(done),
            Ok(Some(watch)) => {
                if spin_on(&watch, Backoff::DEFAULT) {
                    if let Err(done) = look().map(drop) {
                        return Ok(done);
                    }
                }
            }
            Ok(None) => {}
        }
        let deadline = deadline.resolve();
        let mut now = Instant::now();
        let mut spin_until = now + sh.spin;
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        // Whether `events` came from epoll (rather than being direct reads of awaited peers).
        let mut polled = false;
        let mut rounds: u32 = 0;
        // Spinning goes by the clock here (`spin_until`): only the yields and sleeps follow the
        // count.
        let mut waiting = Waiting::new(Backoff::DEFAULT, false);
        let mut hot: Vec<usize> = Vec::new();
        let mut all_shm;
        let mut stall = StallWatch::new(now);
        let mut blocked = false;
        loop {
            {
                let mut st = lock(&sh.state);
                let moved = st.handle(&events, true);
                // Keep polling while data moves: sleeping between the bursts of a large
                // transfer costs a wake-up each time.
                // Reading the clock costs as much as a look at the rings: while spinning, read
                // it every few rounds only.
                if moved || polled || rounds % CLOCK_ROUNDS == 0 {
                    now = Instant::now();
                }
                if moved || (polled && !events.is_empty()) {
                    spin_until = now + sh.spin;
                    waiting.reset();
                }
                for (i, &id) in ids.iter().enumerate() {
                    if let Some(r) = st.take(id) {
                        return Ok((i, r));
                    }
                }
                if now >= deadline {
                    let op = ids.first().and_then(|id| st.ops.get(id));
                    let what = op.map(Op::describe).unwrap_or_default();
                    let err = Error::timeout(format!(
                        "{what} did not complete within HCOMM_TIMEOUT; the peer may be stuck, slow, \
                         or calling something else"
                    ));
                    return Err(match op {
                        Some(op) => err
                            .with_peer(PeerRank::ranks(op.target.comm_rank, op.target.peer))
                            .with_operation(op.operation()),
                        None => err,
                    });
                }
                stall.check(now, || st.awaited(ids));
                if !blocked && now >= spin_until {
                    blocked = true;
                    let first = ids.first().and_then(|id| st.ops.get(id));
                    if let Some(op) = first.filter(|op| op.target.comm_rank != ANY_PEER) {
                        crate::observe::blocked_on(op.target.comm_rank);
                    }
                }
                all_shm = st.all_shm();
                // Only small receives: large transfers use every stream and need writes
                // progressed, which epoll tracks.
                hot.clear();
                let small = |op: &Op| op.kind == OpKind::Recv && op.cap <= st.cfg.eager_limit;
                if !all_shm && ids.iter().filter_map(|id| st.ops.get(id)).all(small) {
                    for op in ids.iter().filter_map(|id| st.ops.get(id)) {
                        let p = op.target.peer;
                        if !hot.contains(&p) && st.readable(p) {
                            hot.push(p);
                        }
                    }
                }
            }
            events.clear();
            polled = false;
            if now < spin_until {
                rounds = rounds.wrapping_add(1);
                // Only shared memory to watch: the sockets (which carry nothing but the
                // peers' goodbyes) are looked at now and then.
                if all_shm && rounds % SHM_POLLS_PER_EPOLL != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                // Between epoll checks, read the first stream of the awaited peers directly:
                // a small message that arrives is then read without a readiness call first.
                if rounds % DIRECT_READS != 0 && !hot.is_empty() && hot.len() <= MAX_DIRECT_PEERS {
                    let direct = hot.iter().map(|&p| epoll::Event {
                        flags: epoll::EventFlags::IN,
                        data: epoll::EventData::new_u64(token(p, 0)),
                    });
                    events.extend(direct);
                    continue;
                }
                poll(&sh.io, &mut events, Duration::ZERO)?;
            } else if let Some(yields) = sh.io.inbox.as_ref().and_then(|_| waiting.try_yield()) {
                // More ranks than cores: let the rank being waited for run.
                if yields % SHM_POLLS_PER_EPOLL == 0 {
                    poll(&sh.io, &mut events, Duration::ZERO)?;
                }
                continue;
            } else {
                let sleep = (deadline - now).min(waiting.max_sleep());
                self.sleep(all_shm, &mut events, sleep)?;
            }
            polled = true;
        }
    }

    /// Sleeps until something may have happened: on the futex of this rank's doorbell when
    /// only shared-memory peers are left (then the sockets are looked at once on waking),
    /// otherwise in `epoll_wait`, flagged on the doorbell (if any) so that local peers send a
    /// wake-up frame.
    pub(super) fn sleep(
        &self,
        all_shm: bool,
        events: &mut Vec<epoll::Event>,
        sleep: Duration,
    ) -> Result<()> {
        let sh = &*self.shared;
        let Some(bell) = sh.io.bell() else {
            return poll(&sh.io, events, sleep);
        };
        if all_shm {
            // The sockets first, and no sleep once the watcher saw a connection end since:
            // the peer's end may have come after the sockets were last looked at.
            let alarms = sh.io.alarms.load(Ordering::SeqCst);
            poll(&sh.io, events, Duration::ZERO)?;
            if !events.is_empty() {
                return Ok(());
            }
            let mut ready =
                || sh.io.alarms.load(Ordering::SeqCst) != alarms || lock(&sh.state).shm_ready();
            let start = Instant::now();
            if !bell.sleep_unless(&mut ready, sleep) {
                ProtocolCounts::bump(&sh.counts.naps);
                if start.elapsed() >= sleep {
                    ProtocolCounts::bump(&sh.counts.full_naps);
                }
            }
            return poll(&sh.io, events, Duration::ZERO);
        }
        bell.enter_epoll();
        let result = if lock(&sh.state).shm_ready() {
            poll(&sh.io, events, Duration::ZERO)
        } else {
            poll(&sh.io, events, sleep)
        };
        bell.leave_epoll();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_spins_then_yields_then_sleeps_and_starts_over_when_reset() {
        let policy = Backoff {
            polls: 5,
            eager_polls: 2,
            yields: 3,
            max_sleep: Duration::from_millis(7),
        };
        let mut waiting = Waiting::new(policy, true);
        let phases: Vec<Pause> = (0..10).map(|_| waiting.pause()).collect();
        let mut want = vec![Pause::Spin; 5];
        want.extend([Pause::Yield(1), Pause::Yield(2), Pause::Yield(3)]);
        want.extend([Pause::Sleep; 2]);
        assert_eq!(phases, want);
        assert_eq!(waiting.max_sleep(), Duration::from_millis(7));
        waiting.reset();
        assert_eq!(waiting.pause(), Pause::Spin);
        // A wait that must not spin yields at once.
        let mut still = Waiting::new(policy, false);
        assert_eq!(still.pause(), Pause::Yield(1));
        assert_eq!(still.try_yield(), Some(2));
    }
}
