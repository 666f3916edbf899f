//! Progress: one turn over the links (read what arrived, write what waits, dispatch frames),
//! the background thread, and what a peer's loss does.

use crate::error::{Error, PeerRank, Result};
use crate::sync::lock;
use crate::transport::wire::{FrameHeader, FrameKind};
use rustix::event::epoll;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::dispatch::{entered_frame, Landed, Protocol, Step};
use super::link::{untoken, AnyLink, Dests, FellBack, Link, Rx};
use super::rendezvous::Cleared;
use super::wait::poll;
use super::{
    Dest, Engine, OpId, OutFrame, Shared, State, GRACE, LISTEN_TOKEN, SHM_WAKE_TOKEN, WAKE_TOKEN,
};
use crate::transport::shm::link::Inbox;
use crate::transport::tcp::Ready;

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
        // Links that cannot wake a sleeper are polled at least every nap of theirs.
        let nap = lock(&sh.state)
            .nap()
            .map_or(Duration::from_millis(50), |n| {
                n.min(Duration::from_millis(50))
            });
        let polled = match sh.io.bell() {
            Some(bell) => {
                bell.enter_epoll();
                let sleep = if lock(&sh.state).shm_ready() {
                    Duration::ZERO
                } else {
                    nap
                };
                let polled = poll(&sh.io, &mut events, sleep);
                bell.leave_epoll();
                polled
            }
            None => poll(&sh.io, &mut events, nap),
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
        // A wait on the peer needs its connection, whose end tells that it died.
        st.want(peer);
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

    /// Drives progress until `left` of the state is empty or `deadline` passes, looking again
    /// at least every `nap`; returns what is left.
    pub(super) fn progress_until(
        &self,
        deadline: Instant,
        nap: Duration,
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
            if poll(&sh.io, &mut events, (deadline - now).min(nap)).is_err() {
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

    /// Peers whose links are still open (peers never talked to have none).
    pub(super) fn open_peers(&self) -> Vec<usize> {
        (0..self.peers.len())
            .filter(|&p| {
                self.peers[p].as_ref().is_some_and(|p| p.lost.is_none()) && self.links.used(p)
            })
            .collect()
    }

    /// Takes over the TCP connections that came up (or failed) since the last turn: a link
    /// that came up writes the frames that waited for it; a failed one loses its peer.
    fn adopt_connections(&mut self) -> bool {
        let Some(mesh) = self.mesh.clone() else {
            return false;
        };
        let mut moved = false;
        for ready in mesh.take_ready() {
            moved = true;
            match ready {
                Ready::Up {
                    peer,
                    socks,
                    dialed,
                } => {
                    if self.peers[peer].as_ref().is_none_or(|p| p.lost.is_some()) {
                        continue;
                    }
                    let rails: Vec<String> = socks
                        .iter()
                        .map(|s| match (s.local_addr(), s.peer_addr()) {
                            (Ok(l), Ok(p)) => format!("{} -> {}", l.ip(), p.ip()),
                            _ => "?".to_string(),
                        })
                        .collect();
                    let Some(link) = self.links.tcp_mut(peer) else {
                        continue;
                    };
                    let attached = link.attach(socks).and_then(|()| {
                        if self.io.peer_inboxes.contains_key(&peer) {
                            self.io.watch_end(peer, link.end_watch()?);
                        }
                        Ok(())
                    });
                    if let Err(e) = attached {
                        self.fail_peer(peer, e.detail().to_string());
                        continue;
                    }
                    let how = if dialed { "opened" } else { "accepted" };
                    let line = format!(
                        "hcomm: rank {}: TCP link to world rank {peer} up ({how}, {} streams: \
                         {})",
                        self.cfg.rank,
                        rails.len(),
                        rails.join(", ")
                    );
                    if self.cfg.debug {
                        // HCOMM_DEBUG=1 asks for exactly this on the terminal.
                        eprintln!("{line}");
                    }
                    tracing::debug!("{line}");
                    // A peer that dialed this rank is about to send through the plug-in.
                    if self.plugin.as_ref().is_some_and(|c| !c.is_open(peer)) {
                        self.want_plugin(peer);
                    }
                    self.flush_link(peer, 0);
                    self.drive(peer, 0);
                }
                Ready::Rail { peer, stream, sock } => {
                    if self.peers[peer].as_ref().is_none_or(|p| p.lost.is_some()) {
                        continue;
                    }
                    let Some(link) = self.links.tcp_mut(peer) else {
                        continue;
                    };
                    if let Err(why) = link.replace(stream, sock) {
                        self.fail_peer(peer, why);
                        continue;
                    }
                    self.flush_link(peer, 0);
                    self.drive(peer, 0);
                }
                Ready::Failed { peer, error } => {
                    if self.links.plugin_of(peer).is_some() {
                        // What the peer sent through its plug-in before it went may still be
                        // on the way: judged as a connection that ended (a goodbye awaited a
                        // grace period), the plug-in's end telling the rest.
                        tracing::debug!(peer, "TCP link behind the plug-in failed: {error}");
                        self.links.mark_gone(peer);
                    } else {
                        self.fail_peer(peer, error.detail().to_string());
                    }
                }
            }
        }
        moved
    }

    /// Peers still open with a link that must be read a while before it is closed
    /// ([`Link::lingers`](super::link::Link::lingers)).
    pub(super) fn lingering_peers(&self) -> Vec<usize> {
        (0..self.peers.len())
            .filter(|&p| {
                self.peers[p].as_ref().is_some_and(|q| q.lost.is_none()) && self.links.lingers(p)
            })
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
                Rx::FallBack(why) => {
                    moved = true;
                    self.fall_back(peer, why);
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
        let mut moved = self.advance_pulls();
        if self.mesh.as_ref().is_some_and(|m| m.has_ready()) {
            moved |= self.adopt_connections();
        }
        for i in 0..self.links.polled.len() {
            let (p, l) = self.links.polled[i];
            if self.links.get_mut(p, l).is_some_and(|link| link.busy()) {
                moved |= self.flush_link(p, l);
            }
            moved |= self.drive(p, l);
            // Data a transport moves only while polled keeps the waiter polling.
            moved |= self
                .links
                .get_mut(p, l)
                .is_some_and(|link| link.streaming());
        }
        if !self.links.gone.is_empty() {
            moved |= self.judge_gone();
        }
        for ev in events {
            let tok = ev.data.u64();
            if tok == WAKE_TOKEN || tok == SHM_WAKE_TOKEN {
                continue;
            }
            if tok == LISTEN_TOKEN {
                if let Some(mesh) = &self.mesh {
                    mesh.accept();
                }
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
                moved |= self.flush_link(peer, l);
            }
            if flags
                .intersects(epoll::EventFlags::IN | epoll::EventFlags::ERR | epoll::EventFlags::HUP)
            {
                moved |= self.drive(peer, l);
                // A piece of a large frame came (the frame is not whole yet): data moved.
                moved |= self
                    .links
                    .get_mut(peer, l)
                    .is_some_and(|link| link.streaming());
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

    /// The protocol state a frame acts on (see `dispatch.rs`).
    #[inline]
    fn protocol(&mut self) -> Protocol<'_> {
        Protocol {
            matching: &mut self.matching,
            rndv: &mut self.rndv,
            calls: &self.calls,
            me: self.cfg.rank,
            size: self.peers.len(),
        }
    }

    /// Dispatches a frame header (the decision is `Protocol::on_header`'s) and carries out
    /// its step; returns where the frame's payload goes (`None`: the frame is handled), or
    /// why the peer must be dropped.
    pub(super) fn on_header(
        &mut self,
        peer: usize,
        hdr: FrameHeader,
    ) -> std::result::Result<Option<Dest>, String> {
        if let Some(p) = self.peers[peer].as_mut() {
            p.heard = p.heard.wrapping_add(1);
        }
        let step = self.protocol().on_header(peer, &hdr)?;
        let dest = step.dest();
        match step {
            Step::Message {
                matched,
                bound,
                foreign,
                refuse,
                ..
            } => {
                if let Some((id, sender)) = bound {
                    self.bind(id, sender);
                }
                if let Some(msg_id) = refuse {
                    self.refuse_rts(peer, msg_id);
                }
                if foreign {
                    self.reject_message(peer, &hdr);
                }
                self.matched(matched);
            }
            Step::Cleared(Cleared::Ignored) | Step::Data(_) | Step::Woken => {}
            Step::Stale { .. } => super::ProtocolCounts::bump(&self.counts.stale_frames),
            Step::Revoked {
                comms,
                epoch,
                origin,
            } => self.on_revoke(comms, epoch, origin, Some(peer)),
            Step::Cleared(Cleared::Done { id, len }) => self.complete(id, Ok(len)),
            Step::Cleared(Cleared::Send { id, .. }) => self.send_data(peer, id, hdr.msg_id),
            Step::Cleared(Cleared::Split { id, len }) => self.start_write(peer, id, len, &hdr),
            Step::Goodbye => {
                if let Some(p) = self.peers[peer].as_mut() {
                    p.closed = true;
                }
            }
            Step::CommAborted(comms, origin) => {
                let origin = origin.unwrap_or(peer);
                let err = Error::aborted(format!(
                    "world rank {origin} aborted the communicator (Communicator::abort, \
                     hcommCommAbort); see that rank's output for why"
                ))
                .with_peer(PeerRank::world(origin));
                for comm in comms {
                    self.abort_comm(comm, err.clone());
                }
                self.comm_aborts.push((comms, origin));
            }
            Step::Abandoned {
                comm,
                tag,
                abandoned,
            } => self.on_abort(comm, tag, abandoned),
            Step::Asked { comm } => {
                let n = self.calls.entered(comm);
                self.queue(peer, OutFrame::control(entered_frame(comm, false, n)));
            }
            Step::Entered { comm, count } => self.calls.on_entered(comm, peer, count),
        }
        Ok(dest)
    }

    /// A frame's payload has fully arrived (what it completes is `Protocol::on_payload`'s
    /// answer).
    pub(super) fn on_payload(&mut self, peer: usize, hdr: FrameHeader, dest: Dest) {
        match self.protocol().on_payload(peer, &hdr, dest) {
            Landed::Nothing => {}
            Landed::Matched(m) => self.matched(m),
            Landed::Done { id, len } => self.complete(id, Ok(len)),
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

    /// The traffic to `peer` falls back from its transport plug-in to the TCP link behind it
    /// (see `link/plugin.rs`; `why`: the plug-in's failure, empty when it is the peer's
    /// notice or the sender stopped as asked); without a TCP link behind, the peer is lost.
    /// What the plug-in delivered before is read first: it precedes what the peer sends
    /// again on TCP.
    pub(super) fn fall_back(&mut self, peer: usize, why: String) {
        let Some(pl) = self.links.plugin_of(peer) else {
            return self.fail_peer(peer, why);
        };
        // After its goodbye the peer sends nothing more, and its plug-in may end: it is done.
        if self.peers[peer].as_ref().is_some_and(|p| p.closed) && !why.is_empty() {
            return self.fail_peer(peer, why);
        }
        if let FellBack::Unable(why) = self.links.fall_back(peer, why) {
            return self.fail_peer(peer, why);
        }
        self.flush_link(peer, 0);
        if let Some(AnyLink::Plugin(p)) = self.links.get_mut(peer, pl) {
            p.catch_up();
        }
        self.drive(peer, pl);
    }

    /// Ends a local peer that finalized without ever sending to this rank as if its goodbye
    /// had come (its inbox's mark stands for it: see `Links::finalized_unheard`); returns
    /// whether it did.
    pub(super) fn notice_finalized(&mut self, peer: usize) -> bool {
        if !self.links.finalized_unheard(peer) {
            return false;
        }
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return false;
        };
        if p.lost.is_some() {
            return false;
        }
        p.closed = true;
        self.fail_peer(peer, "it finalized".into());
        true
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
        // Before its receives fail and their buffers go: the peer writes nothing more there.
        self.end_splits_with(peer);
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
