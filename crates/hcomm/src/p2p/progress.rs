//! Progress: one turn over the links (read what arrived, write what waits, dispatch frames),
//! the background thread, and what a peer's loss does.

use crate::config::Backoff;
use crate::error::{Error, PeerRank, Result};
use crate::sync::lock;
use crate::transport::wire::{
    FrameHeader, FrameKind, FLAG_CAN_PULL, FLAG_COMM_ABORT, FLAG_MISMATCH,
};
use rustix::event::epoll;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::calls::Abandoned;
use super::link::{untoken, AnyLink, Dests, Link, Rx};
use super::matching::{Arrival, Matched};
use super::rendezvous::{Cleared, Landing};
use super::wait::poll;
use super::{Dest, Engine, MatchKey, OpId, Shared, State, GRACE, SHM_WAKE_TOKEN, WAKE_TOKEN};
use crate::transport::shm::link::Inbox;

/// Tells the launcher on its pipe (`HCOMM_RUN_FD`: descriptor and inode) that world rank
/// `rank` lost world rank `peer`: one line `lost RANK PEER`, in one write (atomic on a
/// pipe), never blocking (the launcher made the pipe nonblocking). Nothing is written unless
/// the descriptor is that pipe; news that cannot be written is dropped (it only helps the
/// launcher name the rank that failed first).
pub(super) fn tell_launcher((fd, ino): (i32, u64), rank: usize, peer: usize) {
    // SAFETY: the launcher's pipe stays open for the life of the process (inherited, and
    // nothing in hcomm closes it); a stale variable naming a closed descriptor only makes
    // `fstat` fail, and a foreign one fails the checks below, so nothing is written to it.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let Ok(st) = rustix::fs::fstat(fd) else {
        return;
    };
    let fifo = rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo;
    if !fifo || st.st_ino != ino {
        return;
    }
    let _ = rustix::io::write(fd, format!("lost {rank} {peer}\n").as_bytes());
}

pub(super) fn progress_thread(sh: &Shared) {
    let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
    while !sh.shutdown.load(Ordering::SeqCst) {
        // Announce polling before looking at the waiters: a thread that starts waiting
        // meanwhile sees the flag and wakes this one out of epoll_wait.
        sh.io.polling.store(true, Ordering::SeqCst);
        if sh.io.pending_async.load(Ordering::SeqCst) == 0
            || sh.io.waiters.load(Ordering::SeqCst) > 0
        {
            sh.io.polling.store(false, Ordering::SeqCst);
            // Nothing outstanding, or a waiting thread drives progress itself.
            let guard = lock(&sh.idle);
            let _ = sh.idle_cv.wait_timeout(guard, Duration::from_millis(50));
            continue;
        }
        let polled = match sh.io.bell() {
            Some(bell) => {
                bell.enter_epoll();
                let sleep = if lock(&sh.state).shm_ready() {
                    Duration::ZERO
                } else {
                    Duration::from_millis(50)
                };
                let polled = poll(&sh.io, &mut events, sleep);
                bell.leave_epoll();
                polled
            }
            None => poll(&sh.io, &mut events, Duration::from_millis(50)),
        };
        sh.io.polling.store(false, Ordering::SeqCst);
        if polled.is_ok() {
            lock(&sh.state).handle(&events, false);
        }
    }
}

impl Engine {
    /// Progresses once without blocking, then tells whether world rank `peer` is still
    /// reachable (for waits that do not go through the engine).
    pub(crate) fn check_peer(&self, peer: usize) -> Result<()> {
        let sh = &*self.shared;
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        poll(&sh.io, &mut events, Duration::ZERO)?;
        let mut st = lock(&sh.state);
        st.handle(&events, false);
        match st.peers.get(peer).and_then(Option::as_ref) {
            Some(p) => match &p.lost {
                Some(why) => Err(Error::peer_lost(PeerRank::world(peer), why.clone())),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// Progresses once without blocking; returns the result of `id` if it is complete (and
    /// removes it).
    pub(crate) fn test(&self, id: OpId) -> Option<Result<usize>> {
        let sh = &*self.shared;
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        if poll(&sh.io, &mut events, Duration::ZERO).is_err() {
            events.clear();
        }
        let mut st = lock(&sh.state);
        st.handle(&events, false);
        st.take(id)
    }

    /// Drives progress until `left` of the state is empty or `deadline` passes; returns what
    /// is left.
    pub(super) fn progress_until(
        &self,
        deadline: Instant,
        left: fn(&State) -> Vec<usize>,
    ) -> Vec<usize> {
        let sh = &*self.shared;
        self.enter_wait();
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        let rest = loop {
            let rest = {
                let mut st = lock(&sh.state);
                st.handle(&events, true);
                left(&st)
            };
            let now = Instant::now();
            if rest.is_empty() || now >= deadline {
                break rest;
            }
            if poll(
                &sh.io,
                &mut events,
                (deadline - now).min(Backoff::DEFAULT.max_sleep),
            )
            .is_err()
            {
                events.clear();
            }
        };
        self.leave_wait();
        rest
    }
}

impl State {
    /// Reachable peers with frames not yet handed to the kernel, the ring or the plug-in.
    pub(super) fn unflushed_peers(&self) -> Vec<usize> {
        (0..self.peers.len())
            .filter(|&p| {
                self.peers[p].as_ref().is_some_and(|q| q.lost.is_none()) && self.links.busy(p)
            })
            .collect()
    }

    /// Peers whose links are still open.
    pub(super) fn open_peers(&self) -> Vec<usize> {
        (0..self.peers.len())
            .filter(|&p| self.peers[p].as_ref().is_some_and(|p| p.lost.is_none()))
            .collect()
    }

    /// Writes what link `l` of `peer` takes now; returns whether any frame left.
    #[inline]
    pub(super) fn flush_link(&mut self, peer: usize, l: usize) -> bool {
        let Some(link) = self.links.get_mut(peer, l) else {
            return false;
        };
        let flushed = link.flush(&self.ops, &mut self.sent);
        self.after_link(peer, l, flushed)
    }

    /// After a link wrote: completes the sends whose frames all left, wakes the peer if the
    /// link asks, and fails the peer if the link failed.
    #[inline]
    fn after_link(&mut self, peer: usize, l: usize, outcome: Result<bool, String>) -> bool {
        if !self.sent.is_empty() {
            let mut sent = std::mem::take(&mut self.sent);
            self.frames_sent(sent.drain(..));
            self.sent = sent;
        }
        if self
            .links
            .get_mut(peer, l)
            .is_some_and(|link| link.take_wake())
        {
            self.queue_wake(peer);
        }
        match outcome {
            Ok(moved) => moved,
            Err(why) => {
                self.fail_peer(peer, why);
                true
            }
        }
    }

    /// Link `l` of `peer` while the peer is not lost, with the destinations it may copy
    /// payloads into (fields of the state apart from the links).
    #[inline]
    fn live_link(&mut self, peer: usize, l: usize) -> Option<(&mut AnyLink, Dests<'_>)> {
        if self.peers[peer].as_ref().is_none_or(|p| p.lost.is_some()) {
            return None;
        }
        let link = self.links.get_mut(peer, l)?;
        let dests = Dests {
            ops: &mut self.ops,
            matching: &mut self.matching,
        };
        Some((link, dests))
    }

    /// Reads what link `l` of `peer` received this turn and dispatches it: each header with
    /// the whole engine state (the link is not borrowed meanwhile), each payload straight
    /// into where the header said; returns whether anything came.
    pub(super) fn drive(&mut self, peer: usize, l: usize) -> bool {
        let mut moved = false;
        while let Some((link, mut dests)) = self.live_link(peer, l) {
            match link.poll(&mut dests) {
                Rx::Idle => break,
                Rx::Header(hdr) => {
                    moved = true;
                    let dest = match self.on_header(peer, hdr) {
                        Ok(dest) => dest,
                        Err(why) => {
                            self.fail_peer(peer, why);
                            break;
                        }
                    };
                    let Some((link, mut dests)) = self.live_link(peer, l) else {
                        break;
                    };
                    match link.place(&hdr, dest, &mut dests) {
                        Ok(true) => {
                            if let Some(dest) = dest {
                                self.on_payload(peer, hdr, dest);
                            }
                        }
                        Ok(false) => {}
                        Err(why) => {
                            self.fail_peer(peer, why);
                            break;
                        }
                    }
                }
                Rx::Payload(hdr, dest) => {
                    moved = true;
                    self.on_payload(peer, hdr, dest);
                }
                Rx::Sent(id) => {
                    moved = true;
                    self.frames_sent([id]);
                }
                Rx::Closed { goodbye } => {
                    self.link_closed(peer, l, goodbye);
                    break;
                }
                Rx::Failed(why) => {
                    self.fail_peer(peer, why);
                    break;
                }
            }
        }
        // A link asks for a wake-up only after it read something.
        if moved
            && self
                .links
                .get_mut(peer, l)
                .is_some_and(|link| link.take_wake())
        {
            self.queue_wake(peer);
        }
        moved
    }

    /// Handles the events of one `epoll_wait`, and polls the links that have no descriptor.
    /// `by_waiter`: the caller is itself one of the waiting threads.
    pub(super) fn handle(&mut self, events: &[epoll::Event], by_waiter: bool) -> bool {
        // The wake-up first: one that comes while the links are read below stays pending.
        for ev in events {
            match ev.data.u64() {
                WAKE_TOKEN => {
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(&self.io.wake, &mut b);
                }
                SHM_WAKE_TOKEN => {
                    if let Some(w) = self.io.inbox.as_ref().and_then(Inbox::wake_socket) {
                        w.drain();
                    }
                }
                _ => {}
            }
        }
        let mut moved = false;
        for i in 0..self.links.polled.len() {
            let (p, l) = self.links.polled[i];
            if self.links.get_mut(p, l).is_some_and(|link| link.busy()) {
                moved |= self.flush_link(p, l);
            }
            moved |= self.drive(p, l);
        }
        if !self.links.gone.is_empty() {
            moved |= self.judge_gone();
        }
        for ev in events {
            let tok = ev.data.u64();
            if tok == WAKE_TOKEN || tok == SHM_WAKE_TOKEN {
                continue;
            }
            let (peer, l, lane) = untoken(tok);
            let flags = ev.flags;
            let Some(link) = self.links.get_mut(peer, l) else {
                continue;
            };
            link.event(lane, flags);
            if flags.intersects(
                epoll::EventFlags::OUT | epoll::EventFlags::ERR | epoll::EventFlags::HUP,
            ) {
                self.flush_link(peer, l);
            }
            if flags
                .intersects(epoll::EventFlags::IN | epoll::EventFlags::ERR | epoll::EventFlags::HUP)
            {
                self.drive(peer, l);
            }
        }
        // Wake other sleeping waiters whose operations may have completed here.
        if self.completions > 0 && self.io.waiters.load(Ordering::SeqCst) > usize::from(by_waiter) {
            self.io.wake_all();
        }
        self.completions = 0;
        moved
    }

    /// Ends the peers whose connection ended while their goodbye travels on another link:
    /// once their goodbye came and this rank's frames to them are all sent (like the end of
    /// a TCP stream, after the data), or as lost when no goodbye came within the grace
    /// period. Returns whether anything moved.
    fn judge_gone(&mut self) -> bool {
        let mut moved = false;
        for (p, since) in self.links.gone.clone() {
            let closed = self.peers[p].as_ref().is_some_and(|q| q.closed);
            if closed && !self.links.busy(p) {
                // The link queued the completions of everything it sent before it went idle:
                // take them before letting the peer go.
                for l in 0..self.links.count(p) {
                    self.drive(p, l);
                }
                self.fail_peer(p, "it finalized".into());
                moved = true;
            } else if !closed && since.elapsed() >= GRACE {
                let kind = self.links.caps(p).map_or("link", |c| c.kind.name());
                self.fail_peer(
                    p,
                    format!("its connection closed and no goodbye came through the {kind}"),
                );
                moved = true;
            }
        }
        moved
    }

    /// One frame of each of `ops` (sends) left this rank: a send whose frames all did is
    /// complete.
    pub(super) fn frames_sent(&mut self, ops: impl IntoIterator<Item = OpId>) {
        for id in ops {
            if let Some(op) = self.ops.get_mut(&id) {
                op.remaining = op.remaining.saturating_sub(1);
                if op.remaining == 0 {
                    let len = op.cap;
                    self.complete(id, Ok(len));
                }
            }
        }
    }

    /// Dispatches a frame header; returns where the frame's payload goes (`None`: the frame
    /// is handled), or why the peer must be dropped.
    pub(super) fn on_header(
        &mut self,
        peer: usize,
        hdr: FrameHeader,
    ) -> std::result::Result<Option<Dest>, String> {
        if let Some(p) = self.peers[peer].as_mut() {
            p.heard = p.heard.wrapping_add(1);
        }
        let key = MatchKey {
            comm: hdr.comm,
            peer,
            tag: hdr.tag,
        };
        match hdr.kind {
            FrameKind::Eager | FrameKind::Rts => {
                let what = if hdr.kind == FrameKind::Eager {
                    Arrival::Eager {
                        len: hdr.len as usize,
                    }
                } else {
                    Arrival::Rts {
                        msg_id: hdr.msg_id,
                        len: usize::try_from(hdr.len)
                            .map_err(|_| "it announced a message too large for this host")?,
                        pull: (hdr.flags & FLAG_CAN_PULL != 0).then_some(hdr.offset),
                    }
                };
                let calls = &self.calls;
                let matched = self
                    .matching
                    .arrive(key, hdr.sig, what, || calls.foreign(&hdr));
                self.bind_matched();
                if matched == Matched::Foreign {
                    if hdr.kind == FrameKind::Rts {
                        self.refuse_rts(peer, hdr.msg_id);
                    }
                    self.reject_message(peer, &hdr);
                }
                let dest = self.matched(matched);
                Ok(dest.filter(|_| hdr.kind == FrameKind::Eager))
            }
            FrameKind::Cts => {
                match self.rndv.on_cts(peer, &hdr)? {
                    Cleared::Ignored => {}
                    Cleared::Done { id, len } => self.complete(id, Ok(len)),
                    Cleared::Send { id, .. } => self.send_data(peer, id, hdr.msg_id),
                }
                Ok(None)
            }
            FrameKind::Data => Ok(match self.rndv.on_data(peer, &hdr)? {
                Landing::Into { id, offset } => Some(Dest::Op {
                    op: id,
                    base: offset,
                }),
                Landing::Discard => Some(Dest::Discard),
                Landing::Nothing => None,
            }),
            FrameKind::Close => {
                if let Some(p) = self.peers[peer].as_mut() {
                    p.closed = true;
                }
                Ok(None)
            }
            // It only had to wake this rank up.
            FrameKind::Wake => Ok(None),
            FrameKind::Abort if hdr.flags & FLAG_COMM_ABORT != 0 => {
                let err = Error::aborted(format!(
                    "world rank {peer} aborted the communicator (Communicator::abort, \
                     hcommCommAbort); see that rank's output for why"
                ))
                .with_peer(PeerRank::world(peer));
                for comm in [hdr.comm, hdr.sig[0], hdr.sig[1]] {
                    self.abort_comm(comm, err.clone());
                }
                Ok(None)
            }
            FrameKind::Abort => {
                let lost = hdr
                    .msg_id
                    .checked_sub(1)
                    .and_then(|l| usize::try_from(l).ok())
                    .filter(|&l| l < self.peers.len() && l != self.cfg.rank);
                let a = Abandoned {
                    peer,
                    sig: hdr.sig,
                    mismatch: hdr.flags & FLAG_MISMATCH != 0,
                    lost,
                };
                self.on_abort(hdr.comm, hdr.tag, a);
                Ok(None)
            }
        }
    }

    /// A frame's payload has fully arrived.
    pub(super) fn on_payload(&mut self, peer: usize, hdr: FrameHeader, dest: Dest) {
        match dest {
            Dest::Discard => {}
            Dest::Unexpected(uid) => {
                if let Some(m) = self.matching.payload_done(uid) {
                    self.matched(m);
                }
            }
            Dest::Op { op: id, .. } => match hdr.kind {
                FrameKind::Data => {
                    if let Some((id, len)) = self.rndv.landed(peer, hdr.msg_id, hdr.len as usize) {
                        self.complete(id, Ok(len));
                    }
                }
                _ => self.complete(id, Ok(hdr.len as usize)),
            },
        }
    }

    /// Link `l` of `peer` reached its end (`goodbye`: after the peer's goodbye came through
    /// it). That ends the peer when its goodbye came, or was to come, through that link: in
    /// order after a goodbye, as a loss without one. Otherwise (the goodbye travels on the
    /// link that carries the traffic, a plug-in) the peer gets a grace period for it to come
    /// (see `State::judge_gone`).
    pub(super) fn link_closed(&mut self, peer: usize, l: usize, goodbye: bool) {
        if goodbye || self.links.route(peer, FrameKind::Close) == Some(l) {
            self.fail_peer(peer, "it closed the connection".into());
        } else {
            self.links.mark_gone(peer);
        }
    }

    /// Marks a peer unreachable: closes its links and fails every operation with it.
    pub(super) fn fail_peer(&mut self, peer: usize, why: String) {
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return;
        };
        if p.lost.is_some() {
            return;
        }
        if !self.draining {
            // What the peer wrote to its shared memory before its connection ended is still
            // due: read it first (its frames may fail the peer themselves).
            self.draining = true;
            for l in 0..self.links.count(peer) {
                if self
                    .links
                    .get_mut(peer, l)
                    .is_some_and(|k| k.caps().drain_on_loss)
                {
                    while self.drive(peer, l) {}
                }
            }
            self.draining = false;
        }
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return;
        };
        if p.lost.is_some() {
            return;
        }
        let msg = if p.closed {
            format!("world rank {peer} has finalized and closed its connections")
        } else {
            format!("world rank {peer} is unreachable: {why}; look at that rank's output (did it exit or crash?)")
        };
        if p.closed {
            tracing::debug!("{msg}");
        } else {
            self.calls.peer_lost(peer);
            tracing::warn!("{msg}");
            if let Some(pipe) = self.cfg.run_fd {
                tell_launcher(pipe, self.cfg.rank, peer);
            }
        }
        p.lost = Some(msg.clone());
        self.links.close(peer);
        self.rndv.peer_lost(peer);
        self.matching.peer_lost(peer);
        let failed: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, op)| op.target.peer == peer && op.result.is_none())
            .map(|(&id, _)| id)
            .collect();
        for id in failed {
            let Some(op) = self.ops.get(&id) else {
                continue;
            };
            let err = Error::peer_lost(
                PeerRank::ranks(op.target.comm_rank, peer),
                format!("{} failed: {msg}", op.describe()),
            )
            .with_operation(op.operation());
            self.complete(id, Err(err));
        }
        self.fail_wildcards(peer);
    }
}
