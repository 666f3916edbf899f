//! Waiting for another process through shared memory: spin, then yield, then sleep on a futex.
//!
//! [`ShmFutex`] is a 32-bit futex word that lives in a shared segment. It uses the *shared*
//! futex operations (`FUTEX_WAIT` / `FUTEX_WAKE` without `FUTEX_PRIVATE_FLAG`): the kernel
//! keys them by the page and offset of the word rather than by the address in one process, so
//! a wake in one process reaches a sleeper in another, whatever address each has mapped the
//! segment at. (A private futex would never match across processes, nor across two mappings
//! of one segment in a single process.)
//!
//! [`EventCount`] pairs a futex word with a count of sleepers, so that a writer pays for the
//! wake system call only when someone actually sleeps, and [`Waiter`] is the reader's policy:
//! check the condition while spinning a bounded number of times, then while yielding the CPU
//! a bounded number of times, then sleep on the event until woken or out of time. With more
//! ranks than cores spinning only steals time from the rank being waited for, so callers then
//! use a `Waiter` that spins little or not at all.
//!
//! # The wake protocol
//!
//! The condition is whatever shared state the reader waits for (a ring's tail moving, a flag
//! set); the event has two words, `seq` (the futex word) and `sleepers`.
//!
//! ```text
//! reader (Waiter::wait_until, sleep phase)        writer (after making the condition true)
//!   r1  sleepers += 1                               w1  store the condition's data (release)
//!   r2  fence(SeqCst)                               w2  fence(SeqCst)      [EventCount::notify]
//!   r3  seen = seq                                  w3  if sleepers != 0:
//!   r4  if condition: sleepers -= 1; done               w4  seq += 1
//!   r5  futex_wait(seq, seen, timeout)                  w5  futex_wake(seq, all)
//!   r6  sleepers -= 1; go back to r4's check, then r1
//! ```
//!
//! No wake-up is lost. r1–r2–r4 and w1–w2–w3 are the two halves of a store-buffering
//! (Dekker) pattern, and with sequentially consistent fences on both sides at least one of
//! them sees the other's store: either the reader's check at r4 sees the data (and it does
//! not sleep), or the writer sees the reader counted at w3 (and wakes it). In the second case
//! the reader read `seq` at r3 either after the increment w4, and then it also sees the data
//! at r4, because w4 is a release that the acquire at r3 synchronises with; or before it, and
//! then `futex_wait` at r5 either finds `seq` no longer equal to `seen` and returns at once,
//! or is already queued when w5 wakes it: the kernel compares the word and queues the sleeper
//! atomically with respect to wakes. A reader that leaves early (timeout, signal, spurious
//! wake) decrements `sleepers` and re-checks before it counts itself again, so a writer that
//! saw the count drop to zero is ordered before the next r2 and its data is seen at the next
//! r4. Several readers may wait on one event: the writer wakes them all.
//!
//! The cost for the writer when nobody sleeps is the fence and one load (w2, w3); the reader
//! pays for its fence only once it has given up spinning and yielding.

#[cfg(test)]
use std::hint;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::thread;
use std::time::Duration;
#[cfg(test)]
use std::time::Instant;

use rustix::io::Errno;
use rustix::thread::futex;

/// A futex word in shared memory, woken and waited on with the shared (not process-private)
/// futex operations.
///
/// All-zero bytes are a valid `ShmFutex` holding 0, so a freshly created segment needs no
/// initialisation.
#[repr(transparent)]
#[derive(Debug, Default)]
pub(crate) struct ShmFutex(AtomicU32);

impl ShmFutex {
    /// A futex word holding `value`, for building shared structures in place.
    #[cfg(test)]
    pub(crate) const fn new(value: u32) -> ShmFutex {
        ShmFutex(AtomicU32::new(value))
    }

    /// The futex word at `ptr`, typically inside a mapped segment.
    ///
    /// # Safety
    ///
    /// `ptr` must be 4-byte aligned and point to 4 bytes of memory that stay mapped and
    /// writable for `'a` and that every thread and process accesses only atomically.
    #[cfg(test)]
    pub(crate) unsafe fn from_ptr<'a>(ptr: *mut u32) -> &'a ShmFutex {
        // SAFETY: the caller guarantees alignment, validity for 'a and atomic-only access;
        // `ShmFutex` is a transparent `AtomicU32`, which has the layout of a `u32`.
        unsafe { &*ptr.cast::<ShmFutex>() }
    }

    /// The word itself, for loads, stores and read-modify-writes.
    pub(crate) fn word(&self) -> &AtomicU32 {
        &self.0
    }

    /// Sleeps while the word holds `expected`, for at most `timeout`.
    ///
    /// Returns `false` if the timeout ran out and `true` otherwise: the thread was woken, the
    /// word did not hold `expected` when the kernel looked, or a signal interrupted the sleep.
    /// Returns may be spurious; callers re-check what they wait for.
    pub(crate) fn wait(&self, expected: u32, timeout: Duration) -> bool {
        let timeout = futex::Timespec::try_from(timeout).unwrap_or(futex::Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        match futex::wait(&self.0, futex::Flags::empty(), expected, Some(&timeout)) {
            Ok(()) | Err(Errno::AGAIN) | Err(Errno::INTR) => true,
            Err(Errno::TIMEDOUT) => false,
            // The word is a valid, aligned reference, so no other error is expected; treat one
            // as a spurious wake-up rather than failing the caller's wait.
            Err(_) => {
                thread::yield_now();
                true
            }
        }
    }

    /// Wakes at most `n` threads sleeping on this word, in any process; returns how many were
    /// woken.
    pub(crate) fn wake(&self, n: u32) -> usize {
        let n = n.min(i32::MAX as u32);
        futex::wake(&self.0, futex::Flags::empty(), n).unwrap_or(0)
    }

    /// Wakes every thread sleeping on this word; returns how many were woken.
    pub(crate) fn wake_all(&self) -> usize {
        self.wake(u32::MAX)
    }
}

/// A futex word with a count of sleepers, in shared memory: readers sleep on it through a
/// [`Waiter`], writers call [`EventCount::notify`] after making the condition true, and only
/// issue the wake system call when a reader has flagged itself as sleeping. See the module
/// documentation for the protocol.
///
/// All-zero bytes are a valid, idle `EventCount`, so a freshly created segment needs no
/// initialisation.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct EventCount {
    /// Bumped by writers that found a sleeper; sleepers wait for it to change.
    seq: ShmFutex,
    /// How many readers are between flagging themselves (r1) and leaving the sleep (r6).
    sleepers: AtomicU32,
}

impl EventCount {
    /// An idle event, for building shared structures in place.
    #[cfg(test)]
    pub(crate) const fn new() -> EventCount {
        EventCount {
            seq: ShmFutex::new(0),
            sleepers: AtomicU32::new(0),
        }
    }

    /// Wakes every reader sleeping on the event, if there is one; call it after the store
    /// that makes the readers' condition true. Returns whether it issued the wake system call,
    /// which it does only when a reader had flagged itself as sleeping.
    pub(crate) fn notify(&self) -> bool {
        // w2: orders the caller's store of the condition before the load of `sleepers`
        // (the writer's half of the store-buffering pattern).
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Relaxed) == 0 {
            return false;
        }
        // w4: release, so a reader that reads the new value at r3 also sees the condition.
        self.seq.word().fetch_add(1, Ordering::Release);
        self.seq.wake_all();
        true
    }

    /// How many readers are flagged as sleeping (or about to sleep) right now.
    #[cfg(test)]
    pub(crate) fn sleepers(&self) -> u32 {
        self.sleepers.load(Ordering::Relaxed)
    }

    /// One round of the reader's sleep phase, r1 to r6: returns whether `ready` held at r4;
    /// if not, it has slept until woken, interrupted or `timeout`.
    pub(crate) fn sleep_unless(&self, ready: &mut impl FnMut() -> bool, timeout: Duration) -> bool {
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        // r2: orders the flag before the loads of `seq` and of the condition (the reader's
        // half of the store-buffering pattern).
        fence(Ordering::SeqCst);
        let seen = self.seq.word().load(Ordering::Acquire);
        let done = ready();
        if !done {
            self.seq.wait(seen, timeout);
        }
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        done
    }
}

/// How a reader waits on an [`EventCount`]: a bounded number of spins, then of yields, then
/// sleeps on the futex.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiter {
    spins: u32,
    yields: u32,
}

#[cfg(test)]
impl Waiter {
    /// Spins of the default waiter: a few microseconds, enough to catch a peer running on
    /// another core without sleeping.
    pub(crate) const DEFAULT_SPINS: u32 = 1000;
    /// Yields of the default waiter: lets a peer that shares this core run before sleeping.
    pub(crate) const DEFAULT_YIELDS: u32 = 20;

    /// A waiter that checks the condition `spins` times while spinning, then `yields` times
    /// while yielding the CPU, before it sleeps. `Waiter::new(0, 0)` sleeps at once, which
    /// suits more ranks than cores.
    pub(crate) const fn new(spins: u32, yields: u32) -> Waiter {
        Waiter { spins, yields }
    }

    /// Waits until `ready` returns `true` or `timeout` has passed; returns the last answer
    /// of `ready`, so `false` means the time ran out.
    ///
    /// `ready` must read the shared state with acquire ordering (or stronger), and whoever
    /// makes it true must call [`EventCount::notify`] on `event` afterwards. `ready` may be
    /// called many times, from this thread only.
    pub(crate) fn wait_until(
        &self,
        event: &EventCount,
        mut ready: impl FnMut() -> bool,
        timeout: Duration,
    ) -> bool {
        if ready() {
            return true;
        }
        let deadline = Instant::now().checked_add(timeout);
        for _ in 0..self.spins {
            hint::spin_loop();
            if ready() {
                return true;
            }
        }
        for _ in 0..self.yields {
            thread::yield_now();
            if ready() {
                return true;
            }
        }
        loop {
            let left = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return ready();
            }
            if event.sleep_unless(&mut ready, left) {
                return true;
            }
            if ready() {
                return true;
            }
        }
    }
}

#[cfg(test)]
impl Default for Waiter {
    /// [`Waiter::DEFAULT_SPINS`] spins and [`Waiter::DEFAULT_YIELDS`] yields.
    fn default() -> Waiter {
        Waiter::new(Waiter::DEFAULT_SPINS, Waiter::DEFAULT_YIELDS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::segment::tests::{dev_shm, unique_name};
    use crate::transport::shm::segment::ShmSegment;
    use std::ops::RangeInclusive;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command, Stdio};

    const LONG: Duration = Duration::from_secs(20);

    /// One direction of a handoff, on its own cache lines.
    #[repr(C, align(128))]
    struct Side {
        event: EventCount,
        value: AtomicU32,
    }

    /// Two sides: the pinger publishes round `i` on `ping`, the ponger acknowledges it on
    /// `pong`.
    #[repr(C)]
    struct Handoff {
        ping: Side,
        pong: Side,
    }

    fn handoff(seg: &ShmSegment) -> &Handoff {
        assert!(seg.len() >= size_of::<Handoff>());
        // SAFETY: the payload is 128-byte aligned, large enough, lives as long as `seg`, and
        // all-zero bytes (a fresh segment) are a valid `Handoff` made of atomics only.
        unsafe { &*seg.as_ptr().cast::<Handoff>() }
    }

    fn futex_in(seg: &ShmSegment) -> &ShmFutex {
        // SAFETY: the payload is aligned, at least 4 bytes, lives as long as `seg`, and the
        // tests access it only atomically.
        unsafe { ShmFutex::from_ptr(seg.as_ptr().cast()) }
    }

    /// Publishes each round and waits for it to be acknowledged; returns how many
    /// notifications issued a wake.
    fn ping(h: &Handoff, waiter: Waiter, rounds: RangeInclusive<u32>) -> usize {
        let mut woke = 0;
        for i in rounds {
            h.ping.value.store(i, Ordering::Release);
            woke += usize::from(h.ping.event.notify());
            let acked = waiter.wait_until(
                &h.pong.event,
                || h.pong.value.load(Ordering::Acquire) == i,
                LONG,
            );
            assert!(acked, "lost wake-up: round {i} never acknowledged");
        }
        woke
    }

    /// Acknowledges each round as it comes; returns how many notifications issued a wake.
    fn pong(h: &Handoff, waiter: Waiter, rounds: RangeInclusive<u32>) -> usize {
        let mut woke = 0;
        for i in rounds {
            let got = waiter.wait_until(
                &h.ping.event,
                || h.ping.value.load(Ordering::Acquire) == i,
                LONG,
            );
            assert!(got, "lost wake-up: round {i} never arrived");
            h.pong.value.store(i, Ordering::Release);
            woke += usize::from(h.pong.event.notify());
        }
        woke
    }

    #[test]
    fn wait_times_out_when_nobody_wakes() {
        let name = unique_name("timeout");
        let seg = ShmSegment::create(&name, 64).unwrap();
        ShmSegment::unlink(&name).unwrap();
        let start = Instant::now();
        assert!(!futex_in(&seg).wait(0, Duration::from_millis(50)));
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(50) && waited < LONG,
            "{waited:?}"
        );

        let event = EventCount::new();
        let start = Instant::now();
        assert!(!Waiter::new(10, 2).wait_until(&event, || false, Duration::from_millis(50)));
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(event.sleepers(), 0);
    }

    #[test]
    fn wait_returns_at_once_when_the_word_differs() {
        let futex = ShmFutex::new(1);
        let start = Instant::now();
        assert!(futex.wait(0, LONG));
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(futex.wake_all(), 0);
    }

    /// A thread sleeping on the futex through one mapping is woken through another mapping
    /// of the same segment, at another address: only the shared futex matches these.
    #[test]
    fn wake_reaches_a_sleeper_through_another_mapping() {
        let name = unique_name("wake");
        let a = ShmSegment::create(&name, 64).unwrap();
        let b = ShmSegment::open(&name, 64).unwrap();
        assert!(b.unlink_if_last(2).unwrap());
        assert_ne!(a.as_ptr(), b.as_ptr());
        thread::scope(|s| {
            let sleeper = s.spawn(|| {
                let futex = futex_in(&b);
                let deadline = Instant::now() + LONG;
                while futex.word().load(Ordering::Acquire) == 0 && Instant::now() < deadline {
                    futex.wait(0, LONG);
                }
                futex.word().load(Ordering::Acquire)
            });
            let futex = futex_in(&a);
            // Wake with the word still 0 until a wake finds the sleeper: proof that both
            // mappings name the same futex.
            let deadline = Instant::now() + LONG;
            while futex.wake(1) == 0 {
                assert!(Instant::now() < deadline, "the sleeper was never found");
                thread::sleep(Duration::from_millis(1));
            }
            futex.word().store(7, Ordering::Release);
            futex.wake_all();
            assert_eq!(sleeper.join().unwrap(), 7);
        });
    }

    #[test]
    fn notify_wakes_only_flagged_sleepers() {
        let name = unique_name("notify");
        let seg = ShmSegment::create(&name, 4096).unwrap();
        ShmSegment::unlink(&name).unwrap();
        let h = handoff(&seg);
        assert!(!h.ping.event.notify(), "woke with nobody asleep");

        thread::scope(|s| {
            let reader = s.spawn(|| {
                Waiter::new(0, 0).wait_until(
                    &h.ping.event,
                    || h.ping.value.load(Ordering::Acquire) == 1,
                    LONG,
                )
            });
            let deadline = Instant::now() + LONG;
            while h.ping.event.sleepers() == 0 {
                assert!(Instant::now() < deadline, "the reader never slept");
                thread::sleep(Duration::from_millis(1));
            }
            h.ping.value.store(1, Ordering::Release);
            assert!(h.ping.event.notify(), "a flagged sleeper was not woken");
            assert!(reader.join().unwrap());
        });
        assert_eq!(h.ping.event.sleepers(), 0);
        assert!(!h.ping.event.notify());
    }

    /// 100,000 handoffs each way between two threads, each with its own mapping of the
    /// segment, for several waiting policies; a lost wake-up shows as a wait that times out.
    #[test]
    fn waiter_never_loses_a_wakeup() {
        const ROUNDS: u32 = 100_000;
        let sleepy = Waiter::new(0, 0);
        let policies = [
            (sleepy, sleepy),
            (sleepy, Waiter::new(64, 1)),
            (Waiter::default(), Waiter::default()),
        ];
        for (ping_waiter, pong_waiter) in policies {
            let name = unique_name("stress");
            let a = ShmSegment::create(&name, 4096).unwrap();
            let b = ShmSegment::open(&name, 4096).unwrap();
            assert!(b.unlink_if_last(2).unwrap());
            let start = Instant::now();
            let (pings, pongs) = thread::scope(|s| {
                let ponger = s.spawn(|| pong(handoff(&b), pong_waiter, 1..=ROUNDS));
                let pings = ping(handoff(&a), ping_waiter, 1..=ROUNDS);
                (pings, ponger.join().unwrap())
            });
            let h = handoff(&a);
            assert_eq!(h.ping.value.load(Ordering::Relaxed), ROUNDS);
            assert_eq!(h.pong.value.load(Ordering::Relaxed), ROUNDS);
            assert_eq!((h.ping.event.sleepers(), h.pong.event.sleepers()), (0, 0));
            eprintln!(
                "{ping_waiter:?} / {pong_waiter:?}: {ROUNDS} round trips in {:?}, {pings} + \
                 {pongs} wake calls",
                start.elapsed()
            );
            if (ping_waiter, pong_waiter) == (sleepy, sleepy) {
                assert!(pings + pongs > 0, "the sleep path was never taken");
            }
        }
    }

    const CHILD_SEGMENT: &str = "HCOMM_TEST_SHM_CHILD_SEGMENT";
    const CHILD_ROUNDS: u32 = 10_000;

    /// Kills the child and removes the segment's name on the way out, whatever happened.
    struct Cleanup {
        child: Child,
        name: String,
    }

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = ShmSegment::unlink(&self.name);
        }
    }

    /// The other process of `handoff_across_processes`: maps the segment, which removes its
    /// name, answers every round, then sleeps until it is killed.
    #[test]
    #[ignore = "run by handoff_across_processes in a child process"]
    fn handoff_child() {
        let Ok(name) = std::env::var(CHILD_SEGMENT) else {
            return;
        };
        let seg = ShmSegment::open(&name, 4096).unwrap();
        assert!(seg.unlink_if_last(2).unwrap());
        let h = handoff(&seg);
        pong(h, Waiter::new(0, 0), 1..=CHILD_ROUNDS);
        Waiter::new(0, 0).wait_until(&h.ping.event, || false, LONG);
    }

    /// Handoffs with a child process through the shared futex; then the child is killed with
    /// SIGKILL and nothing is left in /dev/shm, while this side's mapping stays usable.
    #[test]
    fn handoff_across_processes() {
        let name = unique_name("child");
        let seg = ShmSegment::create(&name, 4096).unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "transport::shm::futex::tests::handoff_child",
                "--ignored",
                "--test-threads=1",
            ])
            .env(CHILD_SEGMENT, &name)
            .stdout(Stdio::null())
            .spawn();
        let mut cleanup = match child {
            Ok(child) => Cleanup {
                child,
                name: name.clone(),
            },
            Err(err) => {
                ShmSegment::unlink(&name).unwrap();
                panic!("cannot start the child: {err}");
            }
        };
        let h = handoff(&seg);
        ping(h, Waiter::new(0, 0), 1..=1);
        // The child mapped the segment before it answered, and removed the name.
        assert!(
            !dev_shm(&name).exists(),
            "the name outlived the second mapping"
        );
        let woke = ping(h, Waiter::new(0, 0), 2..=CHILD_ROUNDS);

        cleanup.child.kill().unwrap();
        let status = cleanup.child.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(9),
            "the child ended before SIGKILL: {status}"
        );
        assert!(!dev_shm(&name).exists());
        // SAFETY: the payload is valid while `seg` lives and nothing else uses it now.
        unsafe { seg.as_ptr().add(4095).write(1) };
        assert_eq!(h.pong.value.load(Ordering::Acquire), CHILD_ROUNDS);
        eprintln!("{CHILD_ROUNDS} round trips with a child process, {woke} wake calls");
    }
}
