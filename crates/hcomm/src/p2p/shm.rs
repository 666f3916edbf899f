//! The engine's side of shared-memory links: the rings, the fast boxes and doorbells.

use crate::error::Result;
use crate::transport::shm::link::{Inbox, Watch};
use crate::transport::wire::{FrameHeader, FrameKind, FAST_PAYLOAD, HEADER_LEN};

use super::requests::frame_payload;
use super::{OpId, OpKind, OutFrame, ProtocolCounts, State, Target, SHM_ROUNDS};

impl State {
    /// Writes a small message straight into a local peer's fast box, without an operation,
    /// when nothing is queued before it; returns whether it did (then the send is complete:
    /// the message is in the peer's memory). An error when the peer cannot be reached.
    pub(super) fn send_fast(&mut self, t: &Target, data: &[u8]) -> Result<bool> {
        self.live_peer(t)?;
        let Some(peer) = self.peers.get_mut(t.peer).and_then(Option::as_mut) else {
            return Ok(false);
        };
        let Some(m) = peer.shm.as_mut().filter(|m| m.out.is_empty()) else {
            return Ok(false);
        };
        let mut hdr = FrameHeader::new(FrameKind::Eager);
        hdr.comm = t.comm;
        hdr.tag = t.tag;
        hdr.msg_id = self.rndv.peek_msg_id(t.peer);
        hdr.len = data.len() as u64;
        hdr.sig = t.sig;
        let Some(body) = hdr.encode_fast(data) else {
            return Ok(false);
        };
        if !m.link.fast_out.try_push(m.out_seq + 1, &body) {
            return Ok(false);
        }
        m.out_seq += 1;
        self.rndv.take_msg_id(t.peer);
        let wake = m.link.peer_bell().ring();
        ProtocolCounts::bump(&self.counts.shm_eager);
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

    /// Receives the next frame of local peer `t.peer` straight into `buf` (`cap` bytes) when
    /// it is a small message in the fast box that this receive matches and nothing else
    /// could (no receive posted before it, specific or from any source, no message held for
    /// it); returns its length.
    /// Anything else (errors included) is left to the general path.
    ///
    /// # Safety
    /// `buf..buf+cap` must be valid for writes.
    pub(super) unsafe fn recv_fast(
        &mut self,
        t: &Target,
        buf: *mut u8,
        cap: usize,
    ) -> Option<usize> {
        // The fast box first: most calls (other transports, nothing arrived yet) end there
        // without a map lookup.
        let m = self.peers.get(t.peer)?.as_ref()?.shm.as_ref()?;
        let body = m.link.fast_in.peek(m.in_seq + 1)?;
        let (hdr, payload) = FrameHeader::decode_fast(&body).ok()?;
        let len = hdr.len as usize;
        if hdr.comm != t.comm || hdr.tag != t.tag || hdr.sig != t.sig || len > cap {
            return None;
        }
        if self.live_peer(t).is_err() || !self.matching.idle(&t.key()) {
            return None;
        }
        let peer = self.peers.get_mut(t.peer)?.as_mut()?;
        let m = peer.shm.as_mut()?;
        // SAFETY: the caller's promise; `len <= cap`.
        unsafe { buf.copy_from_nonoverlapping(payload.as_ptr(), len) };
        m.link.fast_in.consume();
        m.in_seq += 1;
        peer.heard = peer.heard.wrapping_add(1);
        Some(len)
    }

    /// A watch on the next frame of local peer `t.peer`, for a receive that
    /// [`State::recv_fast`] may complete once it comes.
    pub(super) fn recv_watch<'a>(&self, inbox: &'a Inbox, t: &Target) -> Option<Watch<'a>> {
        let peer = self.peers.get(t.peer)?.as_ref()?;
        let m = peer.shm.as_ref().filter(|m| m.out.is_empty())?;
        peer.lost.is_none().then(|| inbox.watch(&m.link, m.in_seq))
    }

    /// A watch on the next frame of the local peer that `id`, a receive, waits for, when
    /// nothing else is to be done for that peer.
    pub(super) fn watch<'a>(&self, inbox: &'a Inbox, id: OpId) -> Option<Watch<'a>> {
        let op = self.ops.get(&id).filter(|op| op.kind == OpKind::Recv)?;
        self.recv_watch(inbox, &op.target)
    }

    /// Sends `peer` a frame that only wakes it (it sleeps in `epoll_wait` while this rank
    /// wrote to its shared memory).
    pub(super) fn queue_wake(&mut self, peer: usize) {
        self.queue_tcp(
            peer,
            0,
            OutFrame::control(FrameHeader::new(FrameKind::Wake)),
        );
    }

    /// Whether every other rank is reached through shared memory (then waiters sleep on the
    /// doorbell's futex rather than in `epoll_wait`).
    pub(super) fn all_shm(&self) -> bool {
        !self.shm_peers.is_empty() && self.shm_peers.len() + 1 == self.peers.len()
    }

    /// Whether shared memory has something for this rank to do: a frame to read, or room
    /// for a frame waiting to be written.
    pub(super) fn shm_ready(&mut self) -> bool {
        for &p in &self.shm_peers {
            let Some(peer) = self.peers[p].as_mut() else {
                continue;
            };
            let (Some(m), None) = (peer.shm.as_mut(), &peer.lost) else {
                continue;
            };
            if m.link.fast_in.ready(m.in_seq + 1) || !m.link.consumer.is_empty().unwrap_or(true) {
                return true;
            }
            if let Some(f) = m.out.front() {
                let need = m.link.producer.layout().slots_for(HEADER_LEN + f.len);
                let free = m.link.producer.free_slots().unwrap_or(usize::MAX);
                if need.is_none_or(|n| free >= n) {
                    return true;
                }
            }
        }
        false
    }

    /// Reads what the rings of the shared-memory peers hold and writes frames waiting for
    /// room; returns whether anything moved.
    pub(super) fn poll_shm(&mut self) -> bool {
        let mut moved = false;
        for i in 0..self.shm_peers.len() {
            let p = self.shm_peers[i];
            if self.peers[p]
                .as_ref()
                .is_some_and(|peer| peer.shm.as_ref().is_some_and(|m| !m.out.is_empty()))
            {
                moved |= self.flush_shm(p);
            }
            moved |= self.read_ring(p);
        }
        moved
    }

    /// Writes the frames queued for a shared-memory peer until its ring is full; returns
    /// whether any was written.
    pub(super) fn flush_shm(&mut self, peer: usize) -> bool {
        let mut done_ops = std::mem::take(&mut self.sent);
        let mut failure = None;
        let mut wake = false;
        let mut pushed = 0;
        {
            let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
                return false;
            };
            let (Some(m), None) = (p.shm.as_mut(), &p.lost) else {
                return false;
            };
            while let Some(f) = m.out.front() {
                let payload = frame_payload(f, &self.ops);
                // A small eager frame goes through the fast box when it has room.
                let fast = (f.len <= FAST_PAYLOAD)
                    .then(|| FrameHeader::decode(&f.hdr).ok())
                    .flatten()
                    .and_then(|h| h.encode_fast(payload))
                    .is_some_and(|body| m.link.fast_out.try_push(m.out_seq + 1, &body));
                let pushed_one = if fast {
                    Ok(true)
                } else {
                    m.link.producer.try_push_parts(m.out_seq, [&f.hdr, payload])
                };
                match pushed_one {
                    Ok(true) => {
                        m.out_seq += 1;
                        if let Some(id) = f.op {
                            done_ops.push(id);
                        }
                        m.out.pop_front();
                        pushed += 1;
                    }
                    Ok(false) => break,
                    Err(e) => {
                        failure = Some(format!("its shared-memory ring failed: {e}"));
                        break;
                    }
                }
            }
            // Every frame may be what the peer sleeps for, control frames (CTS, RTS)
            // included.
            if pushed > 0 || failure.is_some() {
                wake = m.link.peer_bell().ring();
            }
        }
        let moved = pushed > 0;
        self.frames_sent(done_ops.drain(..));
        self.sent = done_ops;
        if wake {
            self.queue_wake(peer);
        }
        if let Some(why) = failure {
            self.fail_peer(peer, why);
        }
        moved
    }

    /// Reads and dispatches the frames a shared-memory peer's ring holds, within a bounded
    /// number; returns whether it read any.
    pub(super) fn read_ring(&mut self, peer: usize) -> bool {
        let mut read = 0;
        let mut failure = None;
        while read < SHM_ROUNDS {
            let Some(m) = self.peers[peer].as_mut().and_then(|p| p.shm.as_mut()) else {
                break;
            };
            let seq = m.in_seq;
            // The next frame is in the fast box or at the front of the ring, whichever holds
            // its number (in neither yet: it is still being written).
            if let Some(body) = m.link.fast_in.peek(seq + 1) {
                let (hdr, payload) = match FrameHeader::decode_fast(&body) {
                    Ok(frame) => frame,
                    Err(e) => {
                        failure = Some(format!("it sent a malformed frame ({e})"));
                        break;
                    }
                };
                read += 1;
                let landed = self.dispatch_whole(peer, hdr, |peers, dst| {
                    let m = peers[peer]
                        .as_mut()
                        .and_then(|p| p.shm.as_mut())
                        .ok_or("a frame vanished from its fast box")?;
                    if let Some(dst) = dst {
                        dst.copy_from_slice(&payload[..dst.len()]);
                    }
                    m.link.fast_in.consume();
                    m.in_seq += 1;
                    Ok(())
                });
                if let Err(why) = landed {
                    failure = Some(why);
                    break;
                }
                continue;
            }
            let hdr = match m.link.consumer.peek() {
                Ok(None) => break,
                Ok(Some(msg)) if msg.meta() != seq => {
                    if msg.meta() > seq {
                        // The fast box frame before it is not visible yet.
                        break;
                    }
                    Err(format!(
                        "its shared-memory ring holds frame {} where {seq} was next",
                        msg.meta()
                    ))
                }
                Ok(Some(msg)) => {
                    let mut raw = [0u8; HEADER_LEN];
                    match msg.copy_prefix(&mut raw) {
                        Ok(()) => FrameHeader::decode(&raw)
                            .map_err(|e| format!("it sent a malformed frame ({e})"))
                            .and_then(|h| {
                                if HEADER_LEN as u64 + h.payload_len() == msg.len() as u64 {
                                    Ok(h)
                                } else {
                                    Err("a frame's length disagrees with its ring message"
                                        .to_string())
                                }
                            }),
                        Err(e) => Err(format!("its shared-memory ring failed: {e}")),
                    }
                }
                Err(e) => Err(format!("its shared-memory ring failed: {e}")),
            };
            let hdr = match hdr {
                Ok(h) => h,
                Err(why) => {
                    failure = Some(why);
                    break;
                }
            };
            read += 1;
            let landed = self.dispatch_whole(peer, hdr, |peers, dst| {
                let msg = peers[peer]
                    .as_mut()
                    .and_then(|p| p.shm.as_mut())
                    .and_then(|m| m.link.consumer.peek().ok().flatten())
                    .ok_or("a frame vanished from its shared-memory ring")?;
                if let Some(dst) = dst {
                    msg.copy_range(HEADER_LEN, dst);
                }
                msg.consume();
                if let Some(m) = peers[peer].as_mut().and_then(|p| p.shm.as_mut()) {
                    m.in_seq += 1;
                }
                Ok(())
            });
            if let Err(why) = landed {
                failure = Some(why);
                break;
            }
        }
        if read > 0 {
            if let Some(m) = self.peers[peer].as_ref().and_then(|p| p.shm.as_ref()) {
                // The peer may wait for room in this ring.
                if m.link.peer_bell().ring() {
                    self.queue_wake(peer);
                }
            }
        }
        if let Some(why) = failure {
            self.fail_peer(peer, why);
        }
        read > 0
    }
}
