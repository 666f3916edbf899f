//! Stall warnings (`HCOMM_STALL_WARN`): a wait that has blocked that long is logged with the
//! operation it belongs to and the peers it still waits for, again after twice as long, and so
//! on, so that a stuck job says where it is stuck without flooding the log.
//!
//! The warnings must be seen by default, when `HCOMM_LOG_LEVEL` is unset and hcomm installs
//! no logger: they then go to stderr directly. With `HCOMM_LOG_LEVEL` set they are `warn`
//! events (shown from level 1 up; level 0 asks for errors only).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::stats::{self, FlightSnapshot};

/// Nanoseconds of `HCOMM_STALL_WARN` (0: off).
static AFTER_NS: AtomicU64 = AtomicU64::new(0);
/// Print to stderr (no logger installed by hcomm).
static TO_STDERR: AtomicBool = AtomicBool::new(false);
/// World rank of the process, for the messages.
static RANK: AtomicUsize = AtomicUsize::new(0);

/// Sets the policy of the process (from the configuration of its latest world).
pub(crate) fn configure(after: Option<Duration>, to_stderr: bool, rank: usize) {
    let ns = after.map_or(0, |d| {
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
    });
    AFTER_NS.store(ns, Ordering::Relaxed);
    TO_STDERR.store(to_stderr, Ordering::Relaxed);
    RANK.store(rank, Ordering::Relaxed);
}

/// The stall clock of one blocking wait.
#[derive(Debug)]
pub(crate) struct StallWatch {
    start: Instant,
    /// When to warn next (`None`: never).
    next: Option<Instant>,
    interval: Duration,
    /// When to ask the members of a stalled collective which calls they entered, half an
    /// interval before the next warning (so that it can name the members that never entered
    /// the call); `None`: asked already.
    ask: Option<Instant>,
}

impl StallWatch {
    /// A wait that started (or started to block) at `start`.
    pub(crate) fn new(start: Instant) -> StallWatch {
        let ns = AFTER_NS.load(Ordering::Relaxed);
        let interval = Duration::from_nanos(ns);
        StallWatch {
            start,
            next: (ns != 0).then(|| start + interval),
            interval,
            ask: (ns != 0).then(|| start + interval / 2),
        }
    }

    /// Whether it is time to ask the members of a stalled collective which calls they
    /// entered (once before each warning).
    #[inline]
    pub(crate) fn ask_due(&mut self, now: Instant) -> bool {
        match self.ask {
            Some(at) if now >= at => {
                self.ask = None;
                true
            }
            _ => false,
        }
    }

    /// Warns if the wait has blocked past the next warning time; `waiting` describes what
    /// the wait waits for (the peers, with their ranks in the communicator).
    #[inline]
    pub(crate) fn check(&mut self, now: Instant, waiting: impl FnOnce() -> String) {
        let Some(next) = self.next else { return };
        if now < next {
            return;
        }
        self.interval = self.interval.saturating_mul(2);
        self.next = now.checked_add(self.interval);
        self.ask = now.checked_add(self.interval / 2);
        let msg = message(
            RANK.load(Ordering::Relaxed),
            now - self.start,
            stats::current_flight().as_ref(),
            &waiting(),
            self.interval,
        );
        if TO_STDERR.load(Ordering::Relaxed) {
            // Nobody installed a logger: a stuck job must still say where it is stuck.
            eprintln!("{msg}");
        } else {
            tracing::warn!("{msg}");
        }
    }
}

/// The warning: who waits, in which operation, for whom, and when the next one comes.
fn message(
    rank: usize,
    waited: Duration,
    op: Option<&FlightSnapshot>,
    waiting: &str,
    next: Duration,
) -> String {
    let what = match op {
        Some(f) if f.kind.is_collective() => {
            let step = match f.step {
                Some(s) if f.steps > 0 => format!(", step {}/{}", s + 1, f.steps),
                _ => String::new(),
            };
            let algo = match f.algo.as_str() {
                "" => "not chosen yet: setting up the call's shape".into(),
                a => format!("algorithm {a}"),
            };
            format!(
                "{} #{} ({} B, {} ranks, {algo}{step})",
                f.kind.name(),
                f.seq,
                f.bytes,
                f.comm_size,
            )
        }
        Some(f) => format!("{} (tag {}, {} B)", f.kind.name(), f.seq, f.bytes),
        None => "an hcomm operation".into(),
    };
    format!(
        "hcomm: rank {rank}: stall: {what} has waited {:.1} s for {waiting} (HCOMM_STALL_WARN; \
         next warning in {:.0} s)",
        waited.as_secs_f64(),
        next.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::OpKind;

    #[test]
    fn the_message_names_the_operation_and_the_peers() {
        let f = FlightSnapshot {
            kind: OpKind::AllReduce,
            seq: 7,
            bytes: 4096,
            comm_size: 4,
            algo: "ring".into(),
            protocols: 0,
            started: 0,
            waiting_since: 0,
            peer: Some(2),
            step: Some(2),
            steps: 6,
        };
        let m = message(
            1,
            Duration::from_secs(10),
            Some(&f),
            "rank 2 (world rank 2)",
            Duration::from_secs(20),
        );
        assert_eq!(
            m,
            "hcomm: rank 1: stall: allreduce #7 (4096 B, 4 ranks, algorithm ring, step 3/6) \
             has waited 10.0 s for rank 2 (world rank 2) (HCOMM_STALL_WARN; next warning in \
             20 s)"
        );
    }

    #[test]
    fn warnings_come_at_doubling_intervals() {
        let t0 = Instant::now();
        let mut w = StallWatch {
            start: t0,
            next: Some(t0 + Duration::from_secs(1)),
            interval: Duration::from_secs(1),
            ask: Some(t0 + Duration::from_millis(500)),
        };
        let mut asked = Vec::new();
        let mut fired = Vec::new();
        for ms in (0..20_000).step_by(100) {
            let now = t0 + Duration::from_millis(ms);
            if w.ask_due(now) {
                asked.push(ms);
            }
            w.check(now, || {
                fired.push(ms);
                String::new()
            });
        }
        assert_eq!(fired, [1000, 3000, 7000, 15000]);
        // Half an interval before each warning.
        assert_eq!(asked, [500, 2000, 5000, 11000]);
    }
}
