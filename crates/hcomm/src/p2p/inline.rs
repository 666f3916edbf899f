//! The short cuts of small messages: a send written straight into the peer's memory (the
//! shared-memory fast box) without an operation, a receive taken straight from it, and
//! watches on a peer's next frame, through the links that have inline slots
//! ([`Link::send_inline`](super::link::Link::send_inline)).

use std::time::Duration;

use crate::error::Result;
use crate::transport::shm::link::{Inbox, Watch};
use crate::transport::wire::{FrameHeader, FrameKind};

use super::link::ofi::OfiWatch;
use super::link::{AnyLink, Kind, Link};
use super::{OpId, OpKind, OutFrame, ProtocolCounts, State, Target};

impl State {
    /// Writes a small message straight into the peer's memory, without an operation, when
    /// its link has an inline slot with room and nothing is queued before it; returns
    /// whether it did (then the send is complete). An error when the peer cannot be reached.
    pub(super) fn send_fast(&mut self, t: &Target, data: &[u8]) -> Result<bool> {
        self.live_peer(t, OpKind::Send)?;
        let Some(link) = self.links.primary_mut(t.peer) else {
            return Ok(false);
        };
        let mut hdr = FrameHeader::new(FrameKind::Eager);
        hdr.comm = t.comm;
        hdr.tag = t.tag;
        hdr.msg_id = self.rndv.peek_msg_id(t.peer);
        hdr.len = data.len() as u64;
        hdr.sig = t.sig;
        hdr.epoch = t.epoch;
        let Some(wake) = link.send_inline(&hdr, data) else {
            return Ok(false);
        };
        self.rndv.take_msg_id(t.peer);
        if link.caps().kind == Kind::Shm {
            ProtocolCounts::bump(&self.counts.shm_eager);
        }
        tracing::trace!(
            peer = t.peer,
            tag = t.tag,
            len = data.len(),
            "sent through the fast box"
        );
        if wake {
            self.queue_wake(t.peer);
        }
        Ok(true)
    }

    /// Receives the next frame of peer `t.peer` straight into `buf` (`cap` bytes) when it is
    /// a small message in an inline slot (shared memory: the fast box; libfabric: an eager
    /// frame in its receive slot) that this receive matches and nothing else could (no
    /// receive posted before it, specific or from any source, no message held for it);
    /// returns its length. Anything else (errors included) is left to the general path.
    ///
    /// Inlined into its callers: called as a function (once the libfabric link's take made
    /// the link's dispatch larger), the 8 B shared-memory ping-pong took 0.2046 against
    /// 0.1970 us (7 interleaved rounds).
    ///
    /// # Safety
    /// `buf..buf+cap` must be valid for writes.
    #[inline(always)]
    pub(super) unsafe fn recv_fast(
        &mut self,
        t: &Target,
        buf: *mut u8,
        cap: usize,
    ) -> Option<usize> {
        // The inline slot first: most calls (other transports, nothing arrived yet) end there
        // without a map lookup.
        let hdr = self.links.primary(t.peer)?.peek_inline()?;
        let len = hdr.len as usize;
        if hdr.comm != t.comm
            || hdr.epoch != t.epoch
            || hdr.tag != t.tag
            || hdr.sig != t.sig
            || len > cap
        {
            return None;
        }
        if self.live_peer(t, OpKind::Recv).is_err() || !self.matching.idle(&t.key()) {
            return None;
        }
        let peer = self.peers.get_mut(t.peer)?.as_mut()?;
        // SAFETY: the caller's promise; `len <= cap`.
        let out = unsafe { std::slice::from_raw_parts_mut(buf, len) };
        self.links.primary_mut(t.peer)?.take_inline(out);
        peer.heard = peer.heard.wrapping_add(1);
        Some(len)
    }

    /// A watch on the next frame of peer `t.peer`, for a receive that [`State::recv_fast`]
    /// may complete once it comes.
    pub(super) fn recv_watch<'a>(&self, inbox: &'a Inbox, t: &Target) -> Option<Watch<'a>> {
        self.live_primary(t.peer)?.watch(inbox)
    }

    /// A libfabric link's watch on the next frame of peer `t.peer`, for a receive that
    /// [`State::recv_fast`] may complete once it comes.
    pub(super) fn recv_cq_watch(&self, t: &Target) -> Option<OfiWatch> {
        self.live_primary(t.peer)?.cq_watch()
    }

    /// The link carrying `peer`'s messages, unless the peer is lost.
    fn live_primary(&self, peer: usize) -> Option<&AnyLink> {
        let p = self.peers.get(peer)?.as_ref()?;
        if p.lost.is_some() {
            return None;
        }
        self.links.primary(peer)
    }

    /// A watch on the next frame of the peer that `id`, a receive, waits for, when nothing
    /// else is to be done for that peer: none while a pull is in flight, which moves a piece
    /// per turn of the engine and not while the waiter watches (a 1 MiB receive pulled its
    /// first piece, then watched for a frame its sender sends only after the pull).
    pub(super) fn watch<'a>(&self, inbox: &'a Inbox, id: OpId) -> Option<Watch<'a>> {
        if self.pulling() {
            return None;
        }
        let op = self.ops.get(&id).filter(|op| op.kind == OpKind::Recv)?;
        self.recv_watch(inbox, &op.target)
    }

    /// Sends `peer` a frame that only wakes it (it sleeps in `epoll_wait` while this rank
    /// wrote to its memory).
    pub(super) fn queue_wake(&mut self, peer: usize) {
        self.queue(peer, OutFrame::control(FrameHeader::new(FrameKind::Wake)));
    }

    /// Whether every other rank is reached through links that ring the doorbell (then
    /// waiters sleep on its futex rather than in `epoll_wait`).
    pub(super) fn all_shm(&self) -> bool {
        self.links.doorbell_only(self.peers.len().saturating_sub(1))
    }

    /// The longest a sleeper may sleep before it polls the links that cannot wake it (see
    /// [`Link::nap`]); `None` when every link can.
    pub(super) fn nap(&mut self) -> Option<Duration> {
        let mut nap: Option<Duration> = None;
        for i in 0..self.links.polled.len() {
            let (p, l) = self.links.polled[i];
            if let Some(n) = self.links.get_mut(p, l).and_then(|link| link.nap()) {
                nap = Some(nap.map_or(n, |m| m.min(n)));
            }
        }
        nap
    }

    /// Whether this rank has something to do now: a pull in flight, or a polled link with a
    /// frame to read or room for a frame waiting to be written.
    pub(super) fn shm_ready(&mut self) -> bool {
        if self.pulling() {
            return true;
        }
        for i in 0..self.links.polled.len() {
            let (p, l) = self.links.polled[i];
            if self.peers[p].as_ref().is_some_and(|q| q.lost.is_none())
                && self.links.get_mut(p, l).is_some_and(|link| link.ready())
            {
                return true;
            }
        }
        false
    }

    /// The epoll token under which a waiter may read `peer`'s link directly, before a
    /// readiness event, for a small message it expects (a TCP peer whose first stream is
    /// open).
    pub(super) fn direct_token(&self, peer: usize) -> Option<u64> {
        if peer == self.cfg.rank || self.peers.get(peer)?.as_ref()?.lost.is_some() {
            return None;
        }
        self.links.primary(peer)?.direct_token()
    }
}
