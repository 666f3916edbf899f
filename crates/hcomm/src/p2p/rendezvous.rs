//! How a message travels: eagerly in one frame, or by rendezvous (RTS, CTS, then data frames,
//! or a pull of the sender's buffer with cross-memory attach).

use crate::error::{Error, PeerRank, Result};
use crate::transport::shm::cma;
use crate::transport::wire::{FrameHeader, FrameKind, FLAG_CAN_PULL, FLAG_DISCARD, FLAG_PULLED};

use super::link::{Kind, Link};
use super::requests::{op_slice, truncated};
use super::{BufPtr, OpId, OpKind, OutFrame, ProtocolCounts, State, Target};

/// The data frames of rendezvous message `msg_id` of send `id`: `len` bytes in chunks of
/// `chunk`.
pub(super) fn data_frames(
    id: OpId,
    msg_id: u64,
    len: usize,
    chunk: usize,
) -> impl Iterator<Item = OutFrame> {
    (0..len).step_by(chunk).map(move |off| {
        let n = chunk.min(len - off);
        let mut hdr = FrameHeader::new(FrameKind::Data);
        hdr.msg_id = msg_id;
        hdr.len = n as u64;
        hdr.offset = off as u64;
        OutFrame {
            op: Some(id),
            off,
            len: n,
            ..OutFrame::control(hdr)
        }
    })
}

impl State {
    pub(super) fn post_send(
        &mut self,
        t: Target,
        buf: BufPtr,
        len: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        self.live_peer(&t)?;
        let id = self.new_op(OpKind::Send, t, buf, len, asynchronous);
        if t.peer == self.cfg.rank {
            self.send_to_self(id, t, buf, len);
            return Ok(id);
        }
        let peer = self.peers[t.peer].as_mut().expect("checked by live_peer");
        let msg_id = peer.next_msg_id;
        peer.next_msg_id += 1;
        let Some(caps) = self.links.caps(t.peer) else {
            return Err(Error::internal(format!("no link to world rank {}", t.peer))
                .with_peer(PeerRank::world(t.peer)));
        };
        let mut hdr = FrameHeader::new(FrameKind::Eager);
        hdr.comm = t.comm;
        hdr.tag = t.tag;
        hdr.msg_id = msg_id;
        hdr.len = len as u64;
        hdr.sig = t.sig;
        let shm = (caps.kind == Kind::Shm).then_some(caps.read_remote.is_some());
        let plugin = caps.kind == Kind::Plugin;
        let limit = match shm {
            Some(_) => self.cfg.shm_eager_limit,
            None => self.cfg.eager_limit,
        };
        let eager = len <= limit;
        let frame = if eager {
            self.ops.get_mut(&id).expect("just inserted").remaining = 1;
            OutFrame {
                op: Some(id),
                len,
                ..OutFrame::control(hdr)
            }
        } else {
            hdr.kind = FrameKind::Rts;
            if shm == Some(true) && len <= self.cfg.shm_push_threshold {
                // The receiver may pull the data straight out of this buffer.
                hdr.flags = FLAG_CAN_PULL;
                hdr.offset = buf.0 as u64;
            }
            self.rndv_send.insert((t.peer, msg_id), id);
            OutFrame::control(hdr)
        };
        // A shared-memory rendezvous is counted where its protocol is decided.
        let c = &self.counts;
        let counter = match (shm.is_some(), plugin, eager) {
            (true, _, true) => Some(&c.shm_eager),
            (true, _, false) => None,
            (false, true, true) => Some(&c.plugin_eager),
            (false, true, false) => Some(&c.plugin_rendezvous),
            (false, false, true) => Some(&c.tcp_eager),
            (false, false, false) => Some(&c.tcp_rendezvous),
        };
        counter.map(ProtocolCounts::bump);
        tracing::trace!(
            peer = t.peer,
            tag = t.tag,
            len,
            eager,
            shm = shm.is_some(),
            plugin,
            "send posted"
        );
        self.queue(t.peer, frame);
        Ok(id)
    }

    /// Answers the rendezvous of message `msg_id` (`len` bytes) for receive `id`; `pull` is
    /// the address of the sender's buffer when this rank may copy the data out of it itself
    /// (a local peer, with cross-memory attach).
    pub(super) fn match_rts(&mut self, id: OpId, msg_id: u64, len: usize, pull: Option<u64>) {
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        let peer = op.target.peer;
        let mut cts = FrameHeader::new(FrameKind::Cts);
        cts.msg_id = msg_id;
        let pid = self.links.caps(peer).and_then(|c| c.read_remote);
        if len > op.cap {
            cts.flags = FLAG_DISCARD;
            let err = truncated(op, len);
            self.complete(id, Err(err));
        } else if let (Some(addr), Some(pid)) = (pull, pid) {
            // Receiver pull: one copy, straight from the sender's buffer into this one.
            cts.flags = FLAG_PULLED;
            let result = match op_slice(op, 0, len) {
                // SAFETY: the sender offered this buffer to be pulled (`FLAG_CAN_PULL`) and keeps
                // it unchanged until this rank's CTS says it was pulled.
                Some(dst) => unsafe { cma::read_remote(pid, addr as usize, dst) }.map(|()| len),
                None => Ok(0),
            };
            if result.is_err() {
                cts.flags = FLAG_DISCARD;
            }
            ProtocolCounts::bump(&self.counts.shm_pull);
            tracing::debug!(
                peer,
                len,
                "shared-memory receive: pulled with cross-memory attach"
            );
            if let Err(Error::PeerLost(why)) = result {
                // The sender's process is gone: the peer is lost, for every operation with it
                // (this one included), not only for this receive; and the call's peers are
                // told whom this rank lost when it abandons the call.
                self.fail_peer(peer, why.message);
                return;
            }
            self.complete(id, result);
        } else {
            op.msg_len = len;
            op.remaining = len;
            self.rndv_recv.insert((peer, msg_id), id);
        }
        self.queue(peer, OutFrame::control(cts));
    }

    /// Tells the sender of rendezvous `msg_id` not to send its data.
    pub(super) fn refuse_rts(&mut self, peer: usize, msg_id: u64) {
        let mut cts = FrameHeader::new(FrameKind::Cts);
        cts.msg_id = msg_id;
        cts.flags = FLAG_DISCARD;
        self.queue(peer, OutFrame::control(cts));
    }

    /// Queues the data of a cleared rendezvous send in chunks on the peer's link (a TCP link
    /// spreads them over its streams; shared memory pushes them through the ring, copied
    /// out by the receiver while the next ones are copied in).
    pub(super) fn send_data(&mut self, peer: usize, id: OpId, msg_id: u64) {
        let Some(caps) = self.links.caps(peer) else {
            return;
        };
        let Some(l) = self.links.route(peer, FrameKind::Data) else {
            return;
        };
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        let shm = caps.kind == Kind::Shm;
        let chunk = if shm {
            self.cfg.shm_chunk
        } else {
            self.cfg.chunk
        };
        let (len, chunk) = (op.cap, chunk.min(caps.max_payload).max(1));
        // Counted before any frame leaves: a frame may be written at once.
        let frames = len.div_ceil(chunk);
        op.remaining = frames;
        if shm {
            ProtocolCounts::bump(&self.counts.shm_push);
            tracing::debug!(peer, len, frames, "shared-memory send: pushed in chunks");
        } else {
            tracing::trace!(peer, len, frames, "rendezvous data queued");
        }
        let Some(link) = self.links.get_mut(peer, l) else {
            return;
        };
        let mut now = false;
        for frame in data_frames(id, msg_id, len, chunk) {
            now |= link.push(frame);
        }
        if now {
            self.flush_link(peer, l);
        }
    }
}
