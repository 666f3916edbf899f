//! How a message travels: eagerly in one frame, or by rendezvous (RTS, CTS, then data frames,
//! or a pull of the sender's buffer with cross-memory attach).

use crate::error::{Error, Result};
use crate::transport::shm::cma;
use crate::transport::wire::{
    FrameHeader, FrameKind, FLAG_CAN_PULL, FLAG_DISCARD, FLAG_PULLED, HEADER_LEN,
};

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
        let mut hdr = FrameHeader::new(FrameKind::Eager);
        hdr.comm = t.comm;
        hdr.tag = t.tag;
        hdr.msg_id = msg_id;
        hdr.len = len as u64;
        hdr.sig = t.sig;
        let shm = peer.shm.as_ref().map(|m| m.link.cma);
        let plugin = peer.plugin.is_some();
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
        self.queue(t.peer, 0, frame);
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
        let pid = self.peers[peer]
            .as_ref()
            .and_then(|p| p.shm.as_ref())
            .filter(|m| m.link.cma)
            .map(|m| m.link.pid);
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
        self.queue(peer, 0, OutFrame::control(cts));
    }

    /// Tells the sender of rendezvous `msg_id` not to send its data.
    pub(super) fn refuse_rts(&mut self, peer: usize, msg_id: u64) {
        let mut cts = FrameHeader::new(FrameKind::Cts);
        cts.msg_id = msg_id;
        cts.flags = FLAG_DISCARD;
        self.queue(peer, 0, OutFrame::control(cts));
    }

    /// Queues the data of a cleared rendezvous send, in chunks over all streams of the peer.
    pub(super) fn send_data(&mut self, peer: usize, id: OpId, msg_id: u64) {
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        let Some(p) = self.peers[peer].as_mut() else {
            return;
        };
        if let Some(m) = p.shm.as_mut() {
            // Sender push: chunks through the ring, copied out by the receiver while the
            // next ones are copied in.
            let len = op.cap;
            let chunk = self
                .cfg
                .shm_chunk
                .min(m.link.producer.layout().max_payload() - HEADER_LEN)
                .max(1);
            let before = m.out.len();
            m.out.extend(data_frames(id, msg_id, len, chunk));
            op.remaining = m.out.len() - before;
            ProtocolCounts::bump(&self.counts.shm_push);
            let frames = op.remaining;
            tracing::debug!(peer, len, frames, "shared-memory send: pushed in chunks");
            self.flush_shm(peer);
            return;
        }
        if let Some(pp) = p.plugin.as_mut() {
            let before = pp.out.len();
            pp.out
                .extend(data_frames(id, msg_id, op.cap, self.cfg.chunk));
            op.remaining = pp.out.len() - before;
            self.flush_plugin(peer);
            return;
        }
        let (len, chunk) = (op.cap, self.cfg.chunk);
        let nstreams = p.streams.len();
        let mut frames = 0;
        let mut touched = vec![false; nstreams];
        for frame in data_frames(id, msg_id, len, chunk) {
            let s = p.next_data_stream % nstreams;
            p.next_data_stream += 1;
            p.streams[s].out.push_back(frame);
            touched[s] = true;
            frames += 1;
        }
        op.remaining = frames;
        tracing::trace!(peer, len, frames, "rendezvous data queued");
        for (s, t) in touched.into_iter().enumerate() {
            if t {
                self.flush(peer, s);
            }
        }
    }
}
