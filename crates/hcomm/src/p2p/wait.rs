//! Waiting: the one backoff every wait follows (spin, yield, then sleep; the policy is
//! [`Backoff`]), and the engine's waits for operations, which sleep in `epoll_wait` or on the
//! doorbell.

use crate::config::Backoff;
use crate::error::{Error, PeerRank, Result};
use crate::observe::clock::{self, ticks};
use crate::observe::stall::StallWatch;
use crate::sync::lock;
use rustix::buffer::spare_capacity;
use rustix::event::{epoll, Timespec};
use std::cell::Cell;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{
    Deadline, Engine, Io, Op, OpId, OpKind, ProtocolCounts, ANY_PEER, CLOCK_ROUNDS, DIRECT_READS,
    MAX_DIRECT_PEERS, SHM_POLLS_PER_EPOLL,
};

/// Looks of a spinning wait that teach the thread's next waits nothing when they serve it:
/// the first few of a wait, which its caller may take without a [`Waiting`].
pub(crate) const QUIET_LOOKS: u32 = 64;

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

thread_local! {
    /// How many times this thread's waits currently halve their spinning and yielding
    /// (see [`Backoff::max_halvings`]): one more after a wait that slept longer than
    /// [`Backoff::short_sleep`], one fewer after a wait that ended while it spun or yielded
    /// or after a short sleep.
    static HALVINGS: Cell<u32> = const { Cell::new(0) };
    /// Looks between two yields of this thread's spinning waits (see
    /// [`Backoff::idle_yield_every`]); 0 until its first such yield.
    static YIELD_EVERY: Cell<u32> = const { Cell::new(0) };
    /// The event buffer of this thread's waits, kept between them (a wait inside a wait takes
    /// a new one).
    static EVENTS: Cell<Vec<epoll::Event>> = const { Cell::new(Vec::new()) };
}

/// This thread's event buffer for one wait, empty, with room for [`EVENT_ROOM`] events; it
/// goes back to the thread when dropped, so that waits allocate none.
struct Events(Vec<epoll::Event>);

/// Events one `epoll_wait` of a wait takes at most.
const EVENT_ROOM: usize = 64;

impl Events {
    fn take() -> Events {
        let mut v = EVENTS.take();
        v.clear();
        v.reserve(EVENT_ROOM);
        Events(v)
    }
}

impl std::ops::Deref for Events {
    type Target = Vec<epoll::Event>;

    fn deref(&self) -> &Vec<epoll::Event> {
        &self.0
    }
}

impl std::ops::DerefMut for Events {
    fn deref_mut(&mut self) -> &mut Vec<epoll::Event> {
        &mut self.0
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        EVENTS.set(std::mem::take(&mut self.0));
    }
}

/// How one wait ended, for what it teaches the thread's next waits ([`next_halvings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// It ended while it spun or yielded.
    Served,
    /// It slept this long (from its first sleep to its end).
    Slept(Duration),
    /// A yield of it kept the core away for a time slice ([`Backoff::slow_yield`]): what a
    /// long sleep teaches, however it ended.
    Contended,
}

/// One wait's place in the [`Backoff`] policy.
#[derive(Debug)]
pub(crate) struct Waiting {
    policy: Backoff,
    /// Halvings of this thread when the wait started.
    halvings: u32,
    /// Looks to spin (none for a wait that spins by the clock, or must not spin).
    spins: u32,
    /// Yields before sleeping.
    max_yields: u32,
    polls: u32,
    yields: u32,
    /// It spun or yielded at least once.
    paused: bool,
    /// When it first had to sleep (spinning and yielding did not suffice).
    asleep_since: Option<Instant>,
    /// It handed the rest of the wait to another [`Waiting`], which teaches the thread.
    handed_on: bool,
    /// Its lesson was taught already ([`Waiting::finish`]).
    finished: bool,
    /// One of its yields was slow ([`Backoff::slow_yield`]): it yields no more.
    contended: bool,
    /// Looks between two yields while spinning (0: never).
    yield_every: u32,
    /// Looks left before the next yield while spinning.
    until_yield: u32,
}

impl Waiting {
    /// A wait that spins for `policy.polls` looks (fewer after this thread's recent waits
    /// had to sleep: [`Backoff::max_halvings`]), then yields, then sleeps; unless `spin` is
    /// false (more local ranks than cores, or `HCOMM_SPIN_US=0`): then it never spins, and
    /// yields only [`Backoff::oversubscribed_yields`] times (never halved) before it sleeps,
    /// leaving the core to the ranks that have work.
    pub(crate) fn new(policy: Backoff, spin: bool) -> Waiting {
        let mut waiting = Waiting::by_clock(policy, spin);
        if spin {
            waiting.spins =
                (policy.polls >> waiting.halvings).max(policy.eager_polls.min(policy.polls));
        }
        waiting
    }

    /// A wait whose caller spins by the clock (for [`Waiting::spin_time`]), then yields as
    /// the policy says, then sleeps; a wait that must not spin (`spin` false) does not spin,
    /// and yields [`Backoff::oversubscribed_yields`] times at most.
    pub(crate) fn by_clock(policy: Backoff, spin: bool) -> Waiting {
        let halvings = HALVINGS.with(Cell::get).min(policy.max_halvings);
        // Only a thread whose waits spinning serves yields less often: one whose waits end
        // asleep (a loaded host) yields every `yield_every` looks, and a yield is what lets
        // its short waits be served again (a pinned 2-rank 512 B ping-pong whose waits had
        // ended asleep for a while stayed at 24 µs instead of 0.9 µs without it).
        let yield_every = match (policy.yield_every, YIELD_EVERY.with(Cell::get)) {
            (0, _) | (_, 0) => policy.yield_every,
            (least, _) if halvings > 0 => least,
            (least, every) => every.clamp(least, policy.idle_yield_every.max(least)),
        };
        Waiting {
            policy,
            halvings,
            spins: 0,
            // The yields of a wait that must not spin are not halved: halvings learnt from
            // long sleeps (start-up, large calls, slow wake-ups) took them to none, and then
            // every wait slept at once, where sleeps that ran long kept them there (8 ranks on
            // 2 cores, 1 KiB all-reduce at load 10-12: 33-35 µs with the halvings held at 4,
            // 19-20 µs yielding).
            max_yields: match spin {
                true => policy.yields >> halvings,
                false => policy.oversubscribed_yields,
            },
            polls: 0,
            yields: 0,
            paused: false,
            asleep_since: None,
            handed_on: false,
            finished: false,
            contended: false,
            yield_every,
            until_yield: yield_every,
        }
    }

    /// Pauses before the next look, as the policy says for a wait this far along.
    pub(crate) fn pause(&mut self) -> Pause {
        if self.polls < self.spins {
            if self.polls >= self.policy.eager_polls {
                std::hint::spin_loop();
            }
            self.polls += 1;
            self.spun();
            return Pause::Spin;
        }
        match self.try_yield() {
            Some(n) => Pause::Yield(n),
            None => Pause::Sleep,
        }
    }

    /// The caller looked `looks` times without pausing before this wait began (its first
    /// looks, which keep no counters): they count as the first looks of the spin, so that the
    /// wait spins, pauses and yields as often in all as [`Waiting::pause`] would have made it
    /// (the yield due among them comes at the next look).
    pub(crate) fn looked(&mut self, looks: u32) {
        let looks = looks.min(self.spins.saturating_sub(self.polls));
        if looks == 0 {
            return;
        }
        self.polls += looks;
        self.paused = true;
        if self.yield_every != 0 {
            self.until_yield = self.until_yield.saturating_sub(looks).max(1);
        }
    }

    /// A wait that its caller's own looks served before any `Waiting` began, after
    /// [`QUIET_LOOKS`] of them or more: it teaches the thread's next waits what a wait that
    /// spinning served teaches (one halving fewer), as it would have through [`Waiting`].
    pub(crate) fn served_by_looks(policy: Backoff) {
        HALVINGS.with(|h| {
            let halvings = h.get();
            if halvings > 0 {
                h.set(next_halvings(policy, halvings, Outcome::Served));
            }
        });
    }

    /// Spins as [`Waiting::pause`] does while it says [`Pause::Spin`], looking at `ready`
    /// after each pause, until `ready` holds (`true`) or the spin is over (`false`; the wait
    /// then goes on with [`Waiting::pause`], which yields next). The same looks, pauses and
    /// yields, but the counters stay in registers while it spins: through `pause` every look
    /// also stored three words of the wait, and an 8-byte one-sided broadcast of two ranks
    /// spinning on each other stored 670 words a call against 346 before the policy existed
    /// (callgrind), and took 0.247 against 0.239 µs.
    #[inline]
    pub(crate) fn spin_until(&mut self, mut ready: impl FnMut() -> bool) -> bool {
        let (spins, eager) = (self.spins, self.policy.eager_polls);
        let yielding = self.yield_every != 0;
        let (mut polls, mut until_yield) = (self.polls, self.until_yield);
        let mut found = false;
        while polls < spins {
            if polls >= eager {
                std::hint::spin_loop();
            }
            polls += 1;
            if yielding {
                until_yield -= 1;
                if until_yield == 0 {
                    self.yield_spinning();
                    until_yield = self.until_yield;
                    if self.contended {
                        // A slow yield: the spin ends at this look.
                        polls = spins;
                    }
                }
            }
            if ready() {
                found = true;
                break;
            }
        }
        if polls != self.polls {
            self.paused = true;
        }
        self.polls = polls;
        self.until_yield = until_yield;
        found
    }

    /// Yields the CPU if the policy has yields left (spinning aside); returns how many times
    /// this wait yielded so far. `None` means the wait must sleep now.
    pub(crate) fn try_yield(&mut self) -> Option<u32> {
        if self.yields >= self.max_yields {
            self.sleeps();
            return None;
        }
        if self.yields == 0 {
            // The flight recorder's clock (a yield costs far more than its reading).
            clock::pausing();
        }
        self.yields += 1;
        self.paused = true;
        self.timed_yield();
        Some(self.yields)
    }

    /// Yields the CPU and returns how many ticks of the statistics clock that took. A slow
    /// yield ([`yield_was_slow`]) ends the wait's spin by count and its yields (its next pause
    /// sleeps; a [`Waiting::reset`] brings no yields back), and its lesson is a long sleep's.
    fn timed_yield(&mut self) -> u64 {
        let start = ticks();
        std::thread::yield_now();
        let took = ticks().wrapping_sub(start);
        if yield_was_slow(self.policy, took) {
            self.contended();
        }
        took
    }

    /// A yield of this wait was slow: it spins (by count) and yields no more.
    #[cold]
    fn contended(&mut self) {
        self.contended = true;
        self.spins = self.polls;
        self.max_yields = 0;
    }

    /// How long a wait that spins by the clock spins: `spin`, halved as this thread's recent
    /// waits say.
    pub(crate) fn spin_time(&self, spin: Duration) -> Duration {
        spin / (1u32 << self.halvings)
    }

    /// The wait spun once more (a look, or a round of a wait that spins by the clock): it
    /// yields the CPU once every `yield_every` of these, so that a thread waiting for this
    /// core runs.
    #[inline]
    pub(crate) fn spun(&mut self) {
        self.paused = true;
        if self.yield_every != 0 {
            self.until_yield -= 1;
            if self.until_yield == 0 {
                self.yield_spinning();
            }
        }
    }

    /// Yields while spinning, and learns from how long the yield took how often this
    /// thread's spinning waits yield ([`Backoff::idle_yield_every`]); a slow yield ends the
    /// spin by count and the yields ([`Waiting::timed_yield`]).
    #[cold]
    #[inline(never)]
    fn yield_spinning(&mut self) {
        clock::pausing();
        let others_ran = self.timed_yield() >= self.policy.yield_turn;
        self.yield_every = next_yield_every(self.policy, self.yield_every, others_ran);
        self.until_yield = self.yield_every;
        YIELD_EVERY.with(|e| e.set(self.yield_every));
    }

    /// The wait sleeps now (the first time: the clock starts for what it teaches).
    #[cold]
    pub(crate) fn sleeps(&mut self) {
        if self.asleep_since.is_none() {
            clock::pausing();
            self.asleep_since = Some(Instant::now());
        }
    }

    /// The wait stops spinning without what it waited for, and another wait takes over: the
    /// lesson is that one's.
    pub(crate) fn hand_on(&mut self) {
        self.handed_on = true;
    }

    /// Something moved: start over with spinning and yielding.
    pub(crate) fn reset(&mut self) {
        self.polls = 0;
        self.yields = 0;
    }

    /// Data moved for the wait, which goes on: a sleep before it was the peer's turn (the
    /// first piece of a large transfer comes after the peer's own work), and the rest of the
    /// wait is what it teaches the thread's next waits.
    pub(crate) fn restart(&mut self) {
        self.asleep_since = None;
    }

    /// The longest sleep between looks.
    pub(crate) fn max_sleep(&self) -> Duration {
        self.policy.max_sleep
    }

    /// Ends the wait, having slept for `asleep` if it slept: teaches this thread's next waits
    /// (once; [`Drop`] does it with the clock for a wait not finished by hand).
    fn finish(&mut self, asleep: Option<Duration>) {
        if std::mem::replace(&mut self.finished, true) || self.handed_on {
            return;
        }
        let outcome = match asleep {
            _ if self.contended => Outcome::Contended,
            Some(d) => Outcome::Slept(d),
            // A wait that never paused teaches nothing.
            None if !self.paused => return,
            None => Outcome::Served,
        };
        let policy = self.policy;
        HALVINGS.with(|h| h.set(next_halvings(policy, h.get(), outcome)));
    }
}

impl Drop for Waiting {
    /// Teaches this thread's next waits: spin and yield less after a wait that slept longer
    /// than [`Backoff::short_sleep`], more after one that spinning or yielding or a short
    /// sleep served (waits that never paused teach nothing).
    fn drop(&mut self) {
        let asleep = self.asleep_since.map(|since| since.elapsed());
        self.finish(asleep);
    }
}

/// A thread's halvings after a wait that ended as `outcome`, when they were `halvings`.
/// A short sleep counts as served: the full spin would have caught what it waited for, and
/// only a wait that shows this can bring the spin back up once it is halved to nothing (a
/// spin of a fraction of a microsecond serves no wait, so without it every later wait ended
/// asleep and the spin stayed at that fraction).
fn next_halvings(policy: Backoff, halvings: u32, outcome: Outcome) -> u32 {
    match outcome {
        Outcome::Slept(d) if d > policy.short_sleep => (halvings + 1).min(policy.max_halvings),
        Outcome::Contended => (halvings + 1).min(policy.max_halvings),
        Outcome::Served | Outcome::Slept(_) => halvings.saturating_sub(1),
    }
}

/// Whether a yield that took `took` ticks of the statistics clock was slow: the kernel gave
/// the core to threads that kept it for a time slice, and every further yield would cost as
/// much (16 busy loops on the 2-core host: 12 ms a `sched_yield`, median, against 0.3 µs
/// without them), where a sleep is ended by the peer's wake-up.
fn yield_was_slow(policy: Backoff, took: u64) -> bool {
    took >= policy.slow_yield
}

/// Looks between a spinning wait's yields after one that let another thread run
/// (`others_ran`) or came back at once, when they were `every` before it.
fn next_yield_every(policy: Backoff, every: u32, others_ran: bool) -> u32 {
    if others_ran {
        policy.yield_every
    } else {
        every
            .saturating_mul(2)
            .min(policy.idle_yield_every.max(policy.yield_every))
    }
}

/// Looks with `ready` while the policy spins, without the engine's lock and without the clock;
/// returns whether it fired.
pub(super) fn spin_on(ready: impl Fn() -> bool, policy: Backoff) -> bool {
    // The policy's looks without a pause come first, without its bookkeeping (as the
    // one-sided collectives' waits do): a wait they serve teaches the thread's next waits as
    // a `Waiting` would, unless within the first `QUIET_LOOKS`. 8-byte ping-pong of 2 pinned
    // ranks, 15 interleaved rounds: 0.2135 us against 0.2175 with a `Waiting` from the first
    // look (a27d6a5, which had no policy here: 0.198).
    let eager = policy.eager_polls.min(policy.polls);
    if let Some(look) = (0..eager).position(|_| ready()) {
        if look >= QUIET_LOOKS as usize {
            Waiting::served_by_looks(policy);
        }
        return true;
    }
    let mut waiting = Waiting::new(policy, true);
    waiting.looked(eager);
    if waiting.spin_until(&ready) {
        return true;
    }
    // The caller's wait goes on, and its end is the lesson.
    waiting.hand_on();
    false
}

/// The backoff of a watch on a libfabric link, whose looks read the completion queue (a
/// system call each): a tenth of a shared-memory watch's looks.
pub(super) const CQ_WATCH: Backoff = Backoff {
    polls: Backoff::DEFAULT.polls / 10,
    ..Backoff::DEFAULT
};

pub(super) fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    }
}

/// Collects the ready events of the engine's epoll set into `events`, sleeping up to `sleep`
/// for the first.
pub(super) fn poll(io: &Io, events: &mut Vec<epoll::Event>, sleep: Duration) -> Result<()> {
    wait_epoll(io.epoll.as_fd(), events, sleep)
}

/// [`poll`] on the epoll set `epoll`. `epoll_pwait` counts its timeout in whole milliseconds,
/// rounded up (and `epoll_pwait2`, which does not, needs Linux 5.11): a shorter sleep (a
/// libfabric link's nap) waits in `ppoll` on the epoll descriptor instead, which keeps
/// nanoseconds. A 100 us nap otherwise lasted 1.08 ms, and a waiter whose naps ran long came
/// to nap through whole spells of a ping-pong (8 B over libfabric between two namespaces:
/// 580 us a message in about one 0.3 s window of five, against 3.9 us).
fn wait_epoll(
    epoll: BorrowedFd<'_>,
    events: &mut Vec<epoll::Event>,
    sleep: Duration,
) -> Result<()> {
    events.clear();
    let mut timeout = sleep;
    if !sleep.is_zero() && sleep < Duration::from_millis(1) {
        let mut fds = [rustix::event::PollFd::new(
            &epoll,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut fds, Some(&timespec(sleep))) {
            Ok(_) | Err(rustix::io::Errno::INTR) => timeout = Duration::ZERO,
            Err(e) => {
                return Err(Error::internal(format!("ppoll failed: {e}")).with_source(e.into()))
            }
        }
    }
    match epoll::wait(epoll, spare_capacity(events), Some(&timespec(timeout))) {
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
        // A look before reading the clock: a small send is usually complete already. The
        // first look takes an operation already over before it runs a progress turn: a turn
        // polls every link, and a libfabric link's poll reads its completion queue (a system
        // call or more in the provider), which a collective whose eager send is over (the
        // transport took it) would pay for the send alone (2-rank 8 B all-reduce over
        // libfabric 1.17: 8.4 against 7.4 us, 2.3 against 1.0 completion-queue reads a call).
        let mut first = true;
        let mut look = || {
            let mut st = lock(&sh.state);
            let take = |st: &mut super::State| {
                ids.iter()
                    .enumerate()
                    .find_map(|(i, &id)| st.take(id).map(|r| (i, r)))
            };
            if std::mem::take(&mut first) {
                if let Some(done) = take(&mut st) {
                    return ControlFlow::Break(done);
                }
            }
            st.handle(&[], true);
            if let Some(done) = take(&mut st) {
                return ControlFlow::Break(done);
            }
            ControlFlow::Continue(match (sh.io.inbox.as_ref(), ids) {
                (Some(inbox), &[id]) if !sh.spin.is_zero() => st.watch(inbox, id),
                _ => None,
            })
        };
        // A receive from a local peer: watch for its next frame without the lock and without
        // the clock for a while (a small message then lands a cache-line transfer after it
        // was written), then look again; the loop below does the rest.
        match look() {
            ControlFlow::Break(done) => return Ok(done),
            ControlFlow::Continue(Some(watch)) => {
                if spin_on(|| watch.ready(), Backoff::DEFAULT) {
                    if let ControlFlow::Break(done) = look() {
                        return Ok(done);
                    }
                }
            }
            ControlFlow::Continue(None) => {}
        }
        let deadline = deadline.resolve();
        let mut now = Instant::now();
        // Spinning goes by the clock here (`spin_until`, for `sh.spin` as halved by this
        // thread's recent waits): only the yields and sleeps follow the count.
        let mut waiting = Waiting::by_clock(Backoff::DEFAULT, !sh.spin.is_zero());
        let spin = waiting.spin_time(sh.spin);
        let mut spin_until = now + spin;
        // The end of the extra spin for sends that local peers pull (set once armed).
        let mut pulled_until = now;
        let mut events = Events::take();
        // Whether `events` came from epoll (rather than being direct reads of awaited peers).
        let mut polled = false;
        let mut rounds: u32 = 0;
        // The awaited peers whose link may be read directly, with the epoll token to read.
        let mut hot: smallvec::SmallVec<[(usize, u64); MAX_DIRECT_PEERS]> = Default::default();
        let mut all_shm;
        // The longest a sleep may last before the links that cannot wake it are polled.
        let mut nap: Option<Duration>;
        let mut stall = StallWatch::new(now);
        let mut blocked = false;
        let mut armed = false;
        loop {
            {
                let mut st = lock(&sh.state);
                if !armed {
                    // The operations give up at the deadline: the timers say when (below).
                    for &id in ids {
                        st.timers.arm(id, deadline);
                    }
                    armed = true;
                    // A send that a local peer pulls completes when the copy is done.
                    if !sh.spin.is_zero() {
                        pulled_until = now + st.pull_spin(ids);
                        spin_until = spin_until.max(pulled_until);
                    }
                }
                let moved = st.handle(&events, true);
                for (i, &id) in ids.iter().enumerate() {
                    if let Some(r) = st.take(id) {
                        return Ok((i, r));
                    }
                }
                // Keep polling while data moves: sleeping between the bursts of a large
                // transfer costs a wake-up each time.
                // Reading the clock costs as much as a look at the rings: while spinning, read
                // it every few rounds only (and not before an operation that completed returns).
                if moved || polled || rounds % CLOCK_ROUNDS == 0 {
                    now = Instant::now();
                }
                if moved || (polled && !events.is_empty()) {
                    // Data that moved is this rank's own work too (a large transfer goes out a
                    // piece per turn): the whole spin then, however recent waits ended, or the
                    // rank would sleep between its own pieces with nobody to wake it.
                    spin_until = (now + if moved { sh.spin } else { spin }).max(pulled_until);
                    waiting.reset();
                    if moved {
                        waiting.restart();
                    }
                }
                if let Some(late) = st.timers.expired(now, ids) {
                    let op = st.ops.get(&late);
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
                // A collective call that stalls: its members are asked which calls they
                // entered, so that the warning can name those that never entered it.
                let call = ids
                    .first()
                    .and_then(|id| st.ops.get(id))
                    .map(|op| (op.target.comm, op.target.tag));
                if let Some((comm, _)) = call.filter(|_| stall.ask_due(now)) {
                    st.ask_members(comm);
                }
                stall.check(now, || {
                    let report =
                        call.and_then(|(comm, seq)| st.calls.not_entered_report(comm, seq));
                    st.awaited(ids) + report.as_deref().unwrap_or_default()
                });
                if !blocked && now >= spin_until {
                    blocked = true;
                    let first = ids.first().and_then(|id| st.ops.get(id));
                    if let Some(op) = first.filter(|op| op.target.comm_rank != ANY_PEER) {
                        crate::observe::blocked_on(op.target.comm_rank);
                    }
                }
                all_shm = st.all_shm();
                nap = st.nap();
                // Only small receives: large transfers use every stream and need writes
                // progressed, which epoll tracks.
                hot.clear();
                let small = |op: &Op| op.kind == OpKind::Recv && op.cap <= st.cfg.eager_limit;
                if !all_shm && ids.iter().filter_map(|id| st.ops.get(id)).all(small) {
                    for op in ids.iter().filter_map(|id| st.ops.get(id)) {
                        let p = op.target.peer;
                        if !hot.iter().any(|&(q, _)| q == p) {
                            if let Some(tok) = st.direct_token(p) {
                                hot.push((p, tok));
                            }
                        }
                    }
                }
            }
            events.clear();
            polled = false;
            if now < spin_until {
                rounds = rounds.wrapping_add(1);
                waiting.spun();
                // Only shared memory to watch: the sockets (which carry nothing but the
                // peers' goodbyes) are looked at now and then.
                if all_shm && rounds % SHM_POLLS_PER_EPOLL != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                // Between epoll checks, read the first stream of the awaited peers directly:
                // a small message that arrives is then read without a readiness call first.
                if rounds % DIRECT_READS != 0 && !hot.is_empty() && hot.len() <= MAX_DIRECT_PEERS {
                    let direct = hot.iter().map(|&(_, tok)| epoll::Event {
                        flags: epoll::EventFlags::IN,
                        data: epoll::EventData::new_u64(tok),
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
                waiting.sleeps();
                let sleep = (deadline - now).min(waiting.max_sleep());
                self.sleep(all_shm, &mut events, nap.map_or(sleep, |n| sleep.min(n)))?;
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
            let start = Instant::now();
            let result = poll(&sh.io, events, sleep);
            ProtocolCounts::bump(&sh.counts.naps);
            if events.is_empty() && start.elapsed() >= sleep {
                ProtocolCounts::bump(&sh.counts.full_naps);
            }
            result
        };
        bell.leave_epoll();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naps_shorter_than_a_millisecond_keep_their_length() {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
        let mut events = Vec::with_capacity(4);
        // Through epoll_pwait alone every nap lasts a millisecond or more; the shortest of
        // 20 is below one unless the scheduler delayed every wake-up.
        let shortest = (0..20)
            .map(|_| {
                let start = Instant::now();
                wait_epoll(ep.as_fd(), &mut events, Duration::from_micros(50)).unwrap();
                assert!(events.is_empty());
                start.elapsed()
            })
            .min()
            .unwrap();
        assert!(shortest >= Duration::from_micros(50), "{shortest:?}");
        assert!(shortest < Duration::from_millis(1), "{shortest:?}");
    }

    #[test]
    fn a_wait_spins_then_yields_then_sleeps_and_starts_over_when_reset() {
        let policy = Backoff {
            slow_yield: u64::MAX,
            polls: 5,
            eager_polls: 2,
            yield_every: 2,
            idle_yield_every: 2,
            yield_turn: 0,
            max_halvings: 3,
            short_sleep: Duration::from_micros(50),
            yields: 3,
            oversubscribed_yields: 0,
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
        // A wait that spins by the clock only yields, then sleeps.
        let mut clocked = Waiting::by_clock(policy, true);
        assert_eq!(clocked.pause(), Pause::Yield(1));
        assert_eq!(clocked.try_yield(), Some(2));
    }

    #[test]
    fn spinning_until_ready_keeps_the_policy_of_pause() {
        let policy = Backoff {
            slow_yield: u64::MAX,
            polls: 6,
            eager_polls: 2,
            yield_every: 4,
            idle_yield_every: 4,
            yield_turn: u64::MAX,
            yields: 2,
            ..Backoff::DEFAULT
        };
        std::thread::spawn(move || {
            // Served at the third look: three spins counted, the fourth look yields (the same
            // count as through `pause`), and the spin goes on from there.
            let mut waiting = Waiting::new(policy, true);
            let mut looks = 0;
            assert!(waiting.spin_until(|| {
                looks += 1;
                looks == 3
            }));
            assert_eq!((looks, waiting.polls, waiting.until_yield), (3, 3, 1));
            assert!(waiting.paused);
            // Never ready: the rest of the spin (a yield at look 4), then `pause` yields.
            looks = 0;
            assert!(!waiting.spin_until(|| {
                looks += 1;
                false
            }));
            assert_eq!((looks, waiting.polls, waiting.until_yield), (3, 6, 2));
            assert_eq!(waiting.pause(), Pause::Yield(1));
            // A spin that is over looks no more.
            let mut spent = Waiting::new(policy, true);
            while spent.pause() == Pause::Spin {}
            assert!(!spent.spin_until(|| unreachable!("looked after the spin")));
            // A wait that must not spin does not look either, and teaches nothing.
            let mut idle = Waiting::new(policy, false);
            assert!(!idle.spin_until(|| unreachable!("looked without spinning")));
            assert!(!idle.paused);
        })
        .join()
        .expect("the waits' thread");
    }

    #[test]
    fn looks_taken_before_a_wait_count_as_its_first_spins() {
        let policy = Backoff {
            slow_yield: u64::MAX,
            polls: 10,
            eager_polls: 4,
            yield_every: 6,
            idle_yield_every: 6,
            yield_turn: u64::MAX,
            yields: 2,
            ..Backoff::DEFAULT
        };
        std::thread::spawn(move || {
            // Through `pause` alone: ten spins, a yield at the sixth.
            let mut paused = Waiting::new(policy, true);
            let mut spins = 0;
            while paused.pause() == Pause::Spin {
                spins += 1;
            }
            assert_eq!((spins, paused.polls, paused.until_yield), (10, 10, 2));
            // Four looks by the caller first: six more, the yield at the second of them, and
            // the wait ends where `pause` left it.
            let mut waiting = Waiting::new(policy, true);
            waiting.looked(4);
            assert_eq!((waiting.polls, waiting.until_yield), (4, 2));
            assert!(waiting.paused);
            let mut looks = 0;
            assert!(!waiting.spin_until(|| {
                looks += 1;
                false
            }));
            assert_eq!((looks, waiting.polls, waiting.until_yield), (6, 10, 2));
            assert_eq!(waiting.pause(), Pause::Yield(1));
            // More looks than the spin: it is over, and the yield it owes comes first.
            let mut spent = Waiting::new(policy, true);
            spent.looked(100);
            assert_eq!((spent.polls, spent.until_yield), (10, 1));
            assert!(!spent.spin_until(|| unreachable!("looked after the spin")));
            // A wait that must not spin counts none.
            let mut idle = Waiting::new(policy, false);
            idle.looked(4);
            assert_eq!(idle.polls, 0);
            assert!(!idle.paused);
            // A wait its caller's looks served teaches what one that spinning served does.
            HALVINGS.with(|h| h.set(2));
            Waiting::served_by_looks(policy);
            assert_eq!(HALVINGS.with(Cell::get), 1);
            let mut served = Waiting::new(policy, true);
            served.looked(4);
            drop(served);
            assert_eq!(HALVINGS.with(Cell::get), 0);
            Waiting::served_by_looks(policy);
            assert_eq!(HALVINGS.with(Cell::get), 0);
        })
        .join()
        .expect("the waits' thread");
    }

    #[test]
    fn an_oversubscribed_wait_never_spins_and_yields_a_few_times_before_it_sleeps() {
        let policy = Backoff {
            slow_yield: u64::MAX,
            yield_every: 1,
            oversubscribed_yields: 2,
            ..Backoff::DEFAULT
        };
        std::thread::spawn(move || {
            // On a fresh thread (no halvings), however often it is reset, a wait that must not
            // spin yields its few times, then sleeps.
            for mut waiting in [
                Waiting::new(policy, false),
                Waiting::by_clock(policy, false),
            ] {
                for _ in 0..3 {
                    assert_eq!(waiting.pause(), Pause::Yield(1));
                    assert_eq!(waiting.pause(), Pause::Yield(2));
                    assert_eq!(waiting.pause(), Pause::Sleep);
                    assert_eq!(waiting.try_yield(), None);
                    waiting.reset();
                }
                assert_eq!((waiting.polls, waiting.yields), (0, 0));
            }
            // Without yields (the default) it sleeps at once, never having paused.
            let none = Backoff {
                slow_yield: u64::MAX,
                yield_every: 1,
                ..Backoff::DEFAULT
            };
            let mut waiting = Waiting::new(none, false);
            assert_eq!(waiting.pause(), Pause::Sleep);
            assert!(!waiting.paused);
            // Spinning waits of the same thread still spin.
            assert_eq!(Waiting::new(policy, true).pause(), Pause::Spin);
        })
        .join()
        .expect("the waits' thread");
    }

    /// The bimodal 8-rank launches: halvings learnt from long sleeps (start-up, large calls)
    /// must not take the yields of waits that must not spin to none, or every wait sleeps.
    #[test]
    fn long_sleeps_do_not_halve_an_oversubscribed_waits_yields() {
        let policy = Backoff {
            oversubscribed_yields: 8,
            ..TEST_POLICY
        };
        std::thread::spawn(move || {
            for _ in 0..policy.max_halvings {
                phases(policy, LONG_SLEEP);
            }
            // A spinning wait's yields are halved to the least...
            assert_eq!(phases(policy, LONG_SLEEP), (8, 1));
            // ...but a wait that must not spin still yields all its times, then sleeps.
            let mut waiting = Waiting::new(policy, false);
            assert_eq!(waiting.halvings, policy.max_halvings);
            let pauses: Vec<Pause> = (0..10).map(|_| waiting.pause()).collect();
            let mut want: Vec<Pause> = (1..=8).map(Pause::Yield).collect();
            want.extend([Pause::Sleep; 2]);
            assert_eq!(pauses, want);
            waiting.finish(Some(LONG_SLEEP));
            assert_eq!(Waiting::by_clock(policy, false).max_yields, 8);
        })
        .join()
        .expect("the waits' thread");
    }

    #[test]
    fn yields_that_find_the_core_idle_make_spinning_yield_less_often() {
        let policy = Backoff {
            slow_yield: u64::MAX,
            yield_every: 4,
            idle_yield_every: 32,
            ..Backoff::DEFAULT
        };
        let steps: Vec<u32> = [false, false, false, false, true, false]
            .iter()
            .scan(policy.yield_every, |every, &ran| {
                *every = next_yield_every(policy, *every, ran);
                Some(*every)
            })
            .collect();
        assert_eq!(steps, [8, 16, 32, 32, 4, 8]);
        // On a thread of its own: every yield of this one counts as letting no thread run (the
        // threshold is out of reach), so the spinning waits that follow yield less often.
        std::thread::spawn(move || {
            let idle = Backoff {
                yield_turn: u64::MAX,
                ..policy
            };
            let mut waiting = Waiting::new(idle, true);
            for _ in 0..4 + 8 + 16 {
                assert_eq!(waiting.pause(), Pause::Spin);
            }
            assert_eq!(waiting.yield_every, 32);
            drop(waiting);
            assert_eq!(Waiting::new(idle, true).yield_every, 32);
            // A yield that let another thread run (any yield, at a threshold of 0) brings
            // the interval back to `yield_every`.
            let busy = Backoff {
                yield_turn: 0,
                ..policy
            };
            let mut waiting = Waiting::new(busy, true);
            for _ in 0..32 {
                waiting.pause();
            }
            assert_eq!(waiting.yield_every, 4);
            assert_eq!(Waiting::new(busy, true).yield_every, 4);
        })
        .join()
        .expect("the waits' thread");
    }

    /// The phases of one wait of `policy` on this thread until it must sleep, after which it
    /// sleeps for `asleep` (injected).
    fn phases(policy: Backoff, asleep: Duration) -> (usize, usize) {
        let mut waiting = Waiting::new(policy, true);
        let (mut spins, mut yields) = (0, 0);
        loop {
            match waiting.pause() {
                Pause::Spin => spins += 1,
                Pause::Yield(_) => yields += 1,
                Pause::Sleep => {
                    waiting.finish(Some(asleep));
                    return (spins, yields);
                }
            }
        }
    }

    const TEST_POLICY: Backoff = Backoff {
        slow_yield: u64::MAX,
        polls: 64,
        eager_polls: 4,
        yield_every: 0,
        idle_yield_every: 0,
        yield_turn: 0,
        max_halvings: 3,
        short_sleep: Duration::from_micros(50),
        yields: 8,
        oversubscribed_yields: 0,
        max_sleep: Duration::from_millis(1),
    };
    const LONG_SLEEP: Duration = Duration::from_millis(2);
    const SHORT_SLEEP: Duration = Duration::from_micros(5);

    #[test]
    fn waits_that_sleep_long_make_the_threads_next_waits_spin_less_and_served_ones_more() {
        let policy = TEST_POLICY;
        std::thread::spawn(move || {
            // Each wait that slept long halves the next one's spinning and yielding, down to
            // `max_halvings` halvings.
            let seen: Vec<_> = (0..5).map(|_| phases(policy, LONG_SLEEP)).collect();
            assert_eq!(seen, [(64, 8), (32, 4), (16, 2), (8, 1), (8, 1)]);
            // A wait that spinning served spins more next time.
            let mut served = Waiting::new(policy, true);
            assert_eq!(served.pause(), Pause::Spin);
            drop(served);
            assert_eq!(phases(policy, LONG_SLEEP), (16, 2));
            // A wait that did not pause at all teaches nothing, nor one that handed the rest
            // of the wait on (its successor teaches).
            drop(Waiting::new(policy, true));
            let mut handed = Waiting::new(policy, true);
            while handed.pause() == Pause::Spin {}
            handed.hand_on();
            drop(handed);
            let mut served = Waiting::new(policy, true);
            assert_eq!(served.pause(), Pause::Spin);
            drop(served);
            drop(Waiting::new(policy, true));
            assert_eq!(phases(policy, LONG_SLEEP), (16, 2));
        })
        .join()
        .expect("the waits' thread");
    }

    /// The "bistable" spin: once halved to its least (a fraction of a microsecond with the
    /// default policy), spinning serves no wait; waits that then sleep only briefly (their
    /// peer answered soon after the spin ended) must bring the spin back, as served ones do.
    #[test]
    fn short_sleeps_bring_a_halved_spin_back_to_full() {
        let policy = TEST_POLICY;
        std::thread::spawn(move || {
            for _ in 0..policy.max_halvings {
                phases(policy, LONG_SLEEP);
            }
            assert_eq!(phases(policy, LONG_SLEEP), (8, 1));
            // Waits that sleep at most `short_sleep` each take one halving back.
            let seen: Vec<_> = (0..5).map(|_| phases(policy, SHORT_SLEEP)).collect();
            assert_eq!(seen, [(8, 1), (16, 2), (32, 4), (64, 8), (64, 8)]);
            assert_eq!(phases(policy, policy.short_sleep), (64, 8));
            // A sleep just longer than that halves again.
            let just_over = policy.short_sleep + Duration::from_nanos(1);
            assert_eq!(phases(policy, just_over), (64, 8));
            assert_eq!(phases(policy, SHORT_SLEEP), (32, 4));
        })
        .join()
        .expect("the waits' thread");
    }

    /// A wait that slept until data moved for it (the first piece of a large transfer, which
    /// comes after the peer's own work) and that spinning then served teaches what a served
    /// wait does, not what its sleep would: a 1 MiB TCP ping-pong's waits all slept that
    /// long, halved the spin to nothing and slept between the pieces (226 against 119 µs).
    #[test]
    fn a_wait_that_data_woke_teaches_what_its_end_does() {
        let policy = TEST_POLICY;
        std::thread::spawn(move || {
            phases(policy, LONG_SLEEP);
            phases(policy, LONG_SLEEP);
            assert_eq!(phases(policy, LONG_SLEEP), (16, 2));
            let mut woken = Waiting::new(policy, true);
            while woken.pause() != Pause::Sleep {}
            std::thread::sleep(policy.short_sleep * 2);
            woken.reset();
            woken.restart();
            assert_eq!(woken.pause(), Pause::Spin);
            drop(woken);
            assert_eq!(phases(policy, LONG_SLEEP), (16, 2));
            // Without the restart, the same wait teaches its long sleep.
            let mut slept = Waiting::new(policy, true);
            while slept.pause() != Pause::Sleep {}
            std::thread::sleep(policy.short_sleep * 2);
            slept.reset();
            assert_eq!(slept.pause(), Pause::Spin);
            drop(slept);
            assert_eq!(phases(policy, LONG_SLEEP), (8, 1));
        })
        .join()
        .expect("the waits' thread");
    }

    #[test]
    fn the_halvings_follow_the_outcomes_within_their_bounds() {
        let p = Backoff::DEFAULT;
        let slept = |us| Outcome::Slept(Duration::from_micros(us));
        assert_eq!(next_halvings(p, 0, Outcome::Served), 0);
        assert_eq!(next_halvings(p, 3, Outcome::Served), 2);
        assert_eq!(next_halvings(p, 3, slept(10)), 2);
        let edge = u64::try_from(p.short_sleep.as_micros()).unwrap();
        assert_eq!(next_halvings(p, 3, slept(edge)), 2);
        assert_eq!(next_halvings(p, 3, slept(edge + 1)), 4);
        assert_eq!(
            next_halvings(p, p.max_halvings, slept(100_000)),
            p.max_halvings
        );
        // At the most halvings, the default spin by the clock is a fraction of a microsecond:
        // the state short sleeps lead out of.
        let mut least = Waiting::by_clock(p, true);
        least.halvings = p.max_halvings;
        assert!(least.spin_time(Duration::from_micros(50)) < Duration::from_micros(1));
        least.hand_on();
    }

    /// A yield that took a time slice (a host with more busy threads than cores) ends the
    /// wait's yielding and spinning at once, and teaches what a long sleep does, however the
    /// wait ends. The threshold is injected: at 0 every yield is slow.
    #[test]
    fn a_slow_yield_makes_the_wait_sleep_next_and_the_threads_next_waits_spin_less() {
        let p = Backoff::DEFAULT;
        assert!(!yield_was_slow(p, p.slow_yield - 1));
        assert!(yield_was_slow(p, p.slow_yield));
        assert_eq!(next_halvings(p, 2, Outcome::Contended), 3);
        assert_eq!(
            next_halvings(p, p.max_halvings, Outcome::Contended),
            p.max_halvings
        );
        let slow = Backoff {
            slow_yield: 0,
            ..TEST_POLICY
        };
        std::thread::spawn(move || {
            // After the spin, one yield, then it sleeps (of TEST_POLICY's 8 yields); the
            // wait ended without sleeping, and the next one spins and yields half as much.
            let mut waiting = Waiting::new(slow, true);
            let pauses: Vec<Pause> = (0..66).map(|_| waiting.pause()).collect();
            let mut want = vec![Pause::Spin; 64];
            want.extend([Pause::Yield(1), Pause::Sleep]);
            assert_eq!(pauses, want);
            // A reset (something moved) brings no yields back.
            waiting.reset();
            while waiting.pause() == Pause::Spin {}
            assert_eq!(waiting.try_yield(), None);
            waiting.finish(None);
            assert_eq!(HALVINGS.with(Cell::get), 1);
            // The same wait whose yields come back at once yields all its (halved) times.
            assert_eq!(phases(TEST_POLICY, SHORT_SLEEP), (32, 4));
            assert_eq!(HALVINGS.with(Cell::get), 0);
            // A wait that must not spin yields once of its `oversubscribed_yields`.
            let idle = Backoff {
                oversubscribed_yields: 8,
                ..slow
            };
            let mut waiting = Waiting::new(idle, false);
            assert_eq!(waiting.pause(), Pause::Yield(1));
            assert_eq!(waiting.pause(), Pause::Sleep);
        })
        .join()
        .expect("the waits' thread");
    }

    /// A slow yield while spinning ends the spin at the look after it, through
    /// [`Waiting::pause`] and [`Waiting::spin_until`] alike, and the wait sleeps next.
    #[test]
    fn a_slow_yield_while_spinning_ends_the_spin() {
        let slow = Backoff {
            polls: 10,
            eager_polls: 2,
            yield_every: 4,
            idle_yield_every: 4,
            yield_turn: u64::MAX,
            slow_yield: 0,
            yields: 3,
            ..Backoff::DEFAULT
        };
        std::thread::spawn(move || {
            let mut paused = Waiting::new(slow, true);
            let pauses: Vec<Pause> = (0..6).map(|_| paused.pause()).collect();
            let mut want = vec![Pause::Spin; 4];
            want.extend([Pause::Sleep; 2]);
            assert_eq!(pauses, want);
            drop(paused);
            assert_eq!(HALVINGS.with(Cell::get), 1);
            HALVINGS.with(|h| h.set(0));
            let mut spinning = Waiting::new(slow, true);
            let mut looks = 0;
            assert!(!spinning.spin_until(|| {
                looks += 1;
                false
            }));
            assert_eq!(looks, 4);
            assert_eq!(spinning.pause(), Pause::Sleep);
            // Served at the look after the slow yield: still a long sleep's lesson.
            drop(spinning);
            assert_eq!(HALVINGS.with(Cell::get), 1);
        })
        .join()
        .expect("the waits' thread");
    }
}
