//! The watcher: a thread per engine that notices peers that died or hang while nobody looks
//! at their sockets.
//!
//! * **Dead local peers.** A waiter whose peers all share the host sleeps on its doorbell's
//!   futex, which a dying process cannot ring. So the watcher polls, for each local peer, a
//!   pidfd of its process (`pidfd_open`; readable once the process ended, SIGKILL included):
//!   it then fails the peer itself (after reading what the peer left in shared memory, its
//!   goodbye included: a peer that said goodbye is let go in order) and wakes the engine's
//!   sleepers. A pair that cannot use a pidfd (another pid or network namespace, a kernel
//!   without `pidfd_open`: see `transport::shm::wake`) keeps a TCP connection beside its
//!   shared memory (made on the pair's first use, like every TCP link), which ends when the
//!   process does (the kernel closes a dead process's sockets); the watcher polls a duplicate
//!   of its stream 0, from when it comes up (`Io::watch_end`), for its end only (`POLLRDHUP`,
//!   not for data, which the engine reads) and wakes the sleepers, which read the end and
//!   fail the peer as usual.
//! * **Hung or stopped peers.** A process that hangs (stopped by a signal, frozen, a host that
//!   vanished without closing its connections) keeps its sockets open. Every `interval` each
//!   watcher shows that its process runs: it bumps the heartbeat in its inbox's doorbell, which
//!   local peers read, and sends each TCP peer a `Wake` frame, which does nothing else. A peer
//!   from which nothing came for `limit` (no heartbeat, no frame) is lost. A peer that is only
//!   busy (computing, blocked in a long call, oversubscribed) keeps beating: the beats come from
//!   this thread, which needs a few microseconds of CPU per interval. Silence is counted in
//!   the watcher's own time: a turn that came late (more than an interval after the last: the
//!   watcher was starved or stopped, and its peers likely too) does not count the lateness
//!   against anyone. (Restarting every clock at each late turn instead, as this did before,
//!   never judged anyone on a host so loaded that most turns came late, and the operations
//!   waiting for a stopped peer then timed out instead of losing it.)
//!
//! The timing follows `HCOMM_TIMEOUT` (`T`): `interval = T / 8` (between 10 ms and 1 s) and
//! `limit = T / 2` (at least 4 intervals), so a hung peer is lost within `T / 2 + 2 interval`,
//! before the operations waiting for it time out. Peers behind a transport plug-in are left to
//! the plug-in and their TCP connection. Only peers this rank talks to (whose TCP connection
//! is up or being made; a local pair without one: that either side used) are judged: a peer
//! never talked to is not watched. A local peer that finalized without ever sending to this
//! rank marks its inbox instead of saying goodbye: each turn lets such peers go in order, and
//! so does the end of their process. A connection still
//! being made counts as silence, so a wait on a hung peer never talked to ends the same way
//! (a live process accepts within one interval of its own watcher).

use std::net::TcpStream;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;
use rustix::event::{eventfd, poll as poll_fds, EventfdFlags, PollFd, PollFlags};

use super::link::{Link, Liveness};
use super::{poll, timespec, FrameHeader, FrameKind, OutFrame, Shared, State};
use crate::error::{Error, Result};
use crate::sync::lock;

/// Shortest heartbeat interval.
const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// Longest heartbeat interval.
const MAX_INTERVAL: Duration = Duration::from_secs(1);

/// How often the watcher beats and judges, and how long a silent peer has.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    interval: Duration,
    limit: Duration,
}

impl Timing {
    /// How long a live peer may take to answer a control frame when nothing but its watcher
    /// reads its links: a turn to accept the connection (when the pair had none), one to read
    /// the frame, one more for luck, and the handshake.
    pub(super) fn answer_within(&self) -> Duration {
        3 * self.interval + Duration::from_millis(250)
    }

    /// The timing for `HCOMM_TIMEOUT` = `timeout` (see the module docs).
    pub(super) fn for_timeout(timeout: Duration) -> Timing {
        let interval = (timeout / 8).clamp(MIN_INTERVAL, MAX_INTERVAL);
        Timing {
            interval,
            limit: (timeout / 2).max(4 * interval),
        }
    }
}

/// What the watcher waits on for the end of a local peer.
#[derive(Debug)]
pub(super) enum End {
    /// A pidfd of its process: readable once the process ended.
    Process(OwnedFd),
    /// A duplicate of stream 0 of its TCP connection: hung up once the process ended.
    Stream(TcpStream),
}

impl End {
    fn poll_fd(&self) -> PollFd<'_> {
        match self {
            End::Process(fd) => PollFd::new(fd, PollFlags::IN),
            End::Stream(s) => PollFd::new(s, PollFlags::RDHUP),
        }
    }
}

/// The running watcher; dropping it stops the thread.
pub(super) struct Watcher {
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching: `ends` say when each local peer ended, by world rank (more come
    /// through `Io::watch_end` as connections come up).
    pub(super) fn start(
        shared: Arc<Shared>,
        ends: Vec<(usize, End)>,
        timing: Timing,
    ) -> Result<Watcher> {
        let stop = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| Error::init(format!("eventfd: {e}")).with_source(e.into()))?;
        let stop = Arc::new(stop);
        let told = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("hcomm-watch".into())
            .spawn(move || watch(&shared, &told, ends, timing))
            .map_err(|e| {
                Error::init(format!("cannot start the watcher thread: {e}")).with_source(e)
            })?;
        Ok(Watcher {
            stop,
            thread: Some(thread),
        })
    }
}

impl Watcher {
    /// Tells the thread to stop, without waiting for it (dropping the watcher waits): it can
    /// wind down while the caller stops other threads.
    pub(super) fn tell_stop(&self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.tell_stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// When the watcher last saw a sign of life of a peer.
#[derive(Debug)]
struct Seen {
    /// The peer's heartbeat count (local peers) or frames received (TCP peers).
    mark: u64,
    /// When the mark last moved.
    moved: Instant,
    /// The same, moved later by the watcher's lateness since then: `now - since` is how long
    /// the peer was silent in the watcher's own time.
    since: Instant,
}

impl Seen {
    fn new(mark: u64, now: Instant) -> Seen {
        Seen {
            mark,
            moved: now,
            since: now,
        }
    }

    /// Looks at the peer's `mark` at `now`, in a turn that came `gap` after the watcher's
    /// previous one: how long the peer has been silent (wall time) once that is `limit` or
    /// more of the watcher's own time.
    fn look(&mut self, mark: u64, now: Instant, gap: Duration, timing: Timing) -> Option<Duration> {
        if mark != self.mark {
            *self = Seen::new(mark, now);
            return None;
        }
        self.since = (self.since + gap.saturating_sub(timing.interval)).min(now);
        (now - self.since >= timing.limit).then(|| now - self.moved)
    }
}

fn watch(sh: &Shared, stop: &OwnedFd, mut ends: Vec<(usize, End)>, timing: Timing) {
    let mut seen: HashMap<usize, Seen> = HashMap::default();
    let mut last_turn = Instant::now();
    let mut next_turn = last_turn;
    loop {
        let now = Instant::now();
        if now >= next_turn {
            turn(sh, &mut seen, now, now - last_turn, timing);
            last_turn = now;
            next_turn = now + timing.interval;
        }
        let wait = next_turn.saturating_duration_since(Instant::now());
        let mut fds: Vec<PollFd<'_>> = [
            PollFd::new(stop, PollFlags::IN),
            PollFd::new(&sh.io.ends_kick, PollFlags::IN),
        ]
        .into_iter()
        .chain(ends.iter().map(|(_, e)| e.poll_fd()))
        .collect();
        match poll_fds(&mut fds, Some(&timespec(wait))) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                tracing::warn!("the watcher's poll failed: {e}");
                std::thread::sleep(wait);
            }
        }
        if !fds[0].revents().is_empty() {
            return;
        }
        let kicked = !fds[1].revents().is_empty();
        // Ended, reset or failed: the connection has nothing more to say to the watcher.
        let ended: Vec<usize> = (2..fds.len())
            .filter(|&i| !fds[i].revents().is_empty())
            .map(|i| i - 2)
            .collect();
        drop(fds);
        if !ended.is_empty() {
            for &i in ended.iter().rev() {
                match ends.swap_remove(i) {
                    (peer, End::Stream(_)) => {
                        tracing::debug!("the connection of local world rank {peer} ended");
                    }
                    // Nobody reads the end of a process: fail the peer here (let it go as
                    // finalized when it marked its inbox so, never having sent to this rank).
                    (peer, End::Process(_)) => {
                        tracing::debug!("the process of local world rank {peer} ended");
                        let mut st = lock(&sh.state);
                        if !st.notice_finalized(peer) {
                            st.fail_peer(peer, "its process ended".into());
                        }
                    }
                }
            }
            sh.io.alarm();
        }
        if kicked {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&sh.io.ends_kick, &mut b);
            ends.append(&mut lock(&sh.io.new_ends));
        }
    }
}

/// Reads what arrived when no thread of this rank does (a waiting thread or the polling
/// progress thread reads the sockets itself, and must not have its wake-up taken from under
/// it), and returns the locked state.
pub(super) fn pump<'a>(
    sh: &'a Shared,
    events: &mut Vec<rustix::event::epoll::Event>,
) -> MutexGuard<'a, State> {
    let idle = sh.io.waiters.load(Ordering::SeqCst) == 0 && !sh.io.polling.load(Ordering::SeqCst);
    if idle && poll(&sh.io, events, Duration::ZERO).is_err() {
        events.clear();
    }
    let mut st = lock(&sh.state);
    if idle {
        st.handle(events, false);
    }
    st
}

/// One turn, `gap` after the last: beat, send the TCP peers theirs, read what came, and fail
/// the peers silent for too long.
fn turn(sh: &Shared, seen: &mut HashMap<usize, Seen>, now: Instant, gap: Duration, timing: Timing) {
    // A dump of the flight recorder asked for by SIGUSR1 (whose handler only raised a flag).
    crate::observe::flight::service();
    if let Some(bell) = sh.io.bell() {
        bell.beat();
    }
    if sh.closing.load(Ordering::SeqCst) {
        return;
    }
    // Read what arrived, heartbeats among it, when no thread of this rank does.
    let mut events = Vec::with_capacity(64);
    let mut st = pump(sh, &mut events);
    let mut lost = false;
    for p in 0..st.peers.len() {
        // A local peer that finalized without sending to this rank is let go in order, used
        // or not (it stopped beating, and sent no goodbye).
        if st.notice_finalized(p) {
            seen.remove(&p);
            lost = true;
            continue;
        }
        let Some(peer) = st.peers[p].as_ref() else {
            continue;
        };
        // A peer never talked to is not watched (nor beaten for); one whose connection is
        // still being made is judged like the others: a live process accepts within one
        // interval of its watcher, so a connection pending for `limit` is a hung peer's.
        if !st.links.used(p) {
            seen.remove(&p);
            continue;
        }
        let link = st.links.primary(p);
        let liveness = link.map(|l| l.caps().liveness);
        if peer.lost.is_some() || peer.closed || liveness == Some(Liveness::Connection) {
            seen.remove(&p);
            continue;
        }
        let (mark, beat) = match (liveness, link.and_then(|l| l.heartbeat())) {
            (Some(Liveness::Heartbeat), Some(beats)) => (beats, false),
            // A link with frames queued is busy (or stuck): the beat would only wait behind.
            _ => (peer.heard, !st.links.busy(p) && st.links.connected(p)),
        };
        if beat {
            st.queue(p, OutFrame::control(FrameHeader::new(FrameKind::Wake)));
        }
        let last = seen.entry(p).or_insert_with(|| Seen::new(mark, now));
        if let Some(silence) = last.look(mark, now, gap, timing) {
            let why = format!(
                "nothing came from it for {silence:.1?} (no heartbeat: its process is hung or \
                 stopped, or its host is gone)"
            );
            seen.remove(&p);
            st.fail_peer(p, why);
            lost = true;
        }
    }
    drop(st);
    if lost {
        sh.io.alarm();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Silence counts the watcher's own time: turns that come late (a starved watcher) do not
    /// count their lateness, however many there are, and a mark that moves restarts it.
    #[test]
    fn silence_is_counted_in_the_watchers_own_time() {
        let t = Timing::for_timeout(Duration::from_secs(8));
        assert_eq!(
            (t.interval, t.limit),
            (Duration::from_secs(1), Duration::from_secs(4))
        );
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut seen = Seen::new(7, t0);
        // Turns every 3 s (2 s late each): 1 s of own time per turn.
        let gap = Duration::from_secs(3);
        for s in [3, 6, 9] {
            assert_eq!(seen.look(7, at(s), gap, t), None, "{s}: {seen:?}");
        }
        assert_eq!(seen.look(7, at(12), gap, t), Some(Duration::from_secs(12)));
        // A mark that moved restarts the count; turns on time count in full.
        let mut seen = Seen::new(7, t0);
        assert_eq!(seen.look(8, at(1), Duration::from_secs(1), t), None);
        let second = Duration::from_secs(1);
        for s in 2..5 {
            assert_eq!(seen.look(8, at(s), second, t), None, "{s}: {seen:?}");
        }
        assert_eq!(seen.look(8, at(5), second, t), Some(Duration::from_secs(4)));
    }

    /// A hung peer is lost within 2 x HCOMM_TIMEOUT at most (by `limit` + two intervals: the
    /// last beat seen, then the turn that judges) for every timeout, and a peer gets several
    /// intervals to beat before it is judged.
    #[test]
    fn heartbeat_timing_loses_a_hung_peer_within_twice_the_timeout() {
        for secs in [1e-9, 0.01, 0.1, 1.0, 2.0, 4.0, 60.0, 300.0, 1e7] {
            let timeout = Duration::from_secs_f64(secs);
            let t = Timing::for_timeout(timeout);
            assert!(
                t.interval >= MIN_INTERVAL && t.interval <= MAX_INTERVAL,
                "{t:?}"
            );
            assert!(t.limit >= 4 * t.interval, "{t:?}");
            if timeout >= 8 * MIN_INTERVAL {
                assert!(
                    t.limit + 2 * t.interval <= 2 * timeout,
                    "{timeout:?}: {t:?}"
                );
                assert!(t.limit >= timeout / 2, "{timeout:?}: {t:?}");
            }
        }
    }
}
