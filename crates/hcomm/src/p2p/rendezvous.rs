//! How a message travels, sans I/O: eagerly in one frame, or by rendezvous (RTS, CTS, then
//! data frames, or a pull of the sender's buffer with cross-memory attach).
//!
//! [`Rendezvous`] owns the message ids and the state of every rendezvous in flight, and
//! touches no link or buffer: it chooses the protocol of a send and writes its first frame,
//! answers requests to send, and says where each data frame's payload goes (an operation's
//! buffer at an offset, or nowhere); the engine moves the bytes. Its unit tests run two of
//! them against each other through in-memory queues.

use crate::error::{Error, PeerRank, Result};
use crate::transport::wire::{
    FrameHeader, FrameKind, FLAG_CAN_PULL, FLAG_DISCARD, FLAG_PULLED, FLAG_SPLIT,
};
use rustc_hash::{FxHashMap as HashMap, FxHashSet};

use super::link::{Kind, Link};
use super::requests::truncated;
use super::{BufPtr, OpId, OpKind, OutFrame, ProtocolCounts, State, Target};

/// The size limits that choose a message's protocol.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Messages up to this size go eagerly over TCP and plug-ins.
    pub eager: usize,
    /// Messages up to this size go eagerly through shared memory.
    pub shm_eager: usize,
    /// Larger shared-memory messages up to this size may be pulled by the receiver.
    pub shm_pull: usize,
    /// Messages up to this size go as one frame through libfabric (which sends the payload
    /// inline or lets the receiver read it).
    pub rma_eager: usize,
}

/// What carries a send's frames to its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// TCP streams or a transport plug-in.
    Stream,
    /// Shared memory; `cma`: cross-memory attach reaches the peer.
    Shm { cma: bool },
    /// A libfabric endpoint.
    Rma,
    /// A libfabric endpoint, written straight into the receive the peer offered (a direct
    /// step of a collective, whose size the link takes whole): always one frame.
    Put,
}

/// What a CTS means for its send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cleared {
    /// Send the `len` bytes of send `id` as data frames of message `msg_id`.
    Send { id: OpId, len: usize },
    /// Send `id` is complete (the receiver pulled the data, or refused it): `len` bytes.
    Done { id: OpId, len: usize },
    /// The receiver of send `id` (`len` bytes) pulls it and asks this rank to write pieces of
    /// it into its buffer (`p2p/split.rs`); the send stays in flight until a later CTS.
    Split { id: OpId, len: usize },
    /// The send was abandoned: nothing to do.
    Ignored,
}

/// How a receive takes a rendezvous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Accepted {
    /// The message is longer than the buffer: the receive fails, and the CTS refuses it.
    Truncated { cts: FrameHeader },
    /// The receiver copies the data out of the sender's buffer at `addr`, then answers with
    /// [`Rendezvous::pulled`].
    Pull { addr: u64 },
    /// The data comes in frames: send `cts`.
    Data { cts: FrameHeader },
}

/// Where a data frame's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Landing {
    /// Into receive `id`'s buffer at `offset`.
    Into { id: OpId, offset: usize },
    /// Read and dropped (the receive was abandoned).
    Discard,
    /// Nowhere: the frame has no payload.
    Nothing,
}

/// A rendezvous receive waiting for its data.
#[derive(Debug, Clone, Copy)]
struct Incoming {
    id: OpId,
    len: usize,
    remaining: usize,
}

/// Message ids and the rendezvous in flight of one engine.
#[derive(Debug)]
pub(super) struct Rendezvous {
    limits: Limits,
    /// The next message id per world rank.
    next_msg_id: Vec<u64>,
    /// Sends waiting for their CTS by (peer, message id): the operation and its length.
    sends: HashMap<(usize, u64), (OpId, usize)>,
    /// Matched rendezvous receives by (peer, sender's message id).
    recvs: HashMap<(usize, u64), Incoming>,
    /// Abandoned rendezvous receives whose data still arrives: bytes still due.
    discarding: HashMap<(usize, u64), u64>,
    /// Abandoned rendezvous sends whose CTS may still arrive.
    abandoned_sends: FxHashSet<(usize, u64)>,
}

/// A CTS for message `msg_id`.
pub(super) fn cts(msg_id: u64, flags: u16) -> FrameHeader {
    let mut h = FrameHeader::new(FrameKind::Cts);
    h.msg_id = msg_id;
    h.flags = flags;
    h
}

impl Rendezvous {
    /// A world of `peers` ranks.
    pub(super) fn new(limits: Limits, peers: usize) -> Rendezvous {
        Rendezvous {
            limits,
            next_msg_id: vec![0; peers],
            sends: HashMap::default(),
            recvs: HashMap::default(),
            discarding: HashMap::default(),
            abandoned_sends: FxHashSet::default(),
        }
    }

    /// The id the next message to `peer` gets.
    pub(super) fn peek_msg_id(&self, peer: usize) -> u64 {
        self.next_msg_id.get(peer).copied().unwrap_or(0)
    }

    /// Takes the id of the next message to `peer`.
    pub(super) fn take_msg_id(&mut self, peer: usize) -> u64 {
        match self.next_msg_id.get_mut(peer) {
            Some(n) => {
                *n += 1;
                *n - 1
            }
            None => 0,
        }
    }

    /// Whether a message of `len` bytes over `route` goes eagerly.
    pub(super) fn eager(&self, len: usize, route: Route) -> bool {
        match route {
            Route::Shm { .. } => len <= self.limits.shm_eager,
            Route::Stream => len <= self.limits.eager,
            Route::Rma => len <= self.limits.rma_eager,
            Route::Put => true,
        }
    }

    /// Send `id` of `len` bytes from the buffer at `addr` to `t`: its first frame (an eager
    /// frame, whose payload is the whole buffer, or a request to send), and whether it is
    /// eager.
    pub(super) fn send(
        &mut self,
        id: OpId,
        t: &Target,
        len: usize,
        addr: u64,
        route: Route,
    ) -> (FrameHeader, bool) {
        let msg_id = self.take_msg_id(t.peer);
        let mut hdr = FrameHeader::new(FrameKind::Eager);
        hdr.comm = t.comm;
        hdr.tag = t.tag;
        hdr.msg_id = msg_id;
        hdr.len = len as u64;
        hdr.sig = t.sig;
        hdr.epoch = t.epoch;
        let eager = self.eager(len, route);
        if !eager {
            hdr.kind = FrameKind::Rts;
            if route == (Route::Shm { cma: true }) && len <= self.limits.shm_pull {
                // The receiver may pull the data straight out of this buffer.
                hdr.flags = FLAG_CAN_PULL;
                hdr.offset = addr;
            }
            self.sends.insert((t.peer, msg_id), (id, len));
        }
        (hdr, eager)
    }

    /// A CTS arrived from `peer`. An error says why the peer must be dropped.
    pub(super) fn on_cts(
        &mut self,
        peer: usize,
        hdr: &FrameHeader,
    ) -> std::result::Result<Cleared, String> {
        if hdr.flags & FLAG_SPLIT != 0 {
            // The send stays: its message ends with the receiver's next CTS. A split offered
            // for an abandoned send is ignored (that CTS ends it as well).
            if let Some(&(id, len)) = self.sends.get(&(peer, hdr.msg_id)) {
                return Ok(Cleared::Split { id, len });
            }
            if self.abandoned_sends.contains(&(peer, hdr.msg_id)) {
                return Ok(Cleared::Ignored);
            }
            return Err(format!(
                "it offered to split message {} that was never announced",
                hdr.msg_id
            ));
        }
        let Some((id, len)) = self.sends.remove(&(peer, hdr.msg_id)) else {
            if self.abandoned_sends.remove(&(peer, hdr.msg_id)) {
                return Ok(Cleared::Ignored);
            }
            return Err(format!(
                "it cleared message {} that was never announced",
                hdr.msg_id
            ));
        };
        if hdr.flags & (FLAG_DISCARD | FLAG_PULLED) != 0 {
            Ok(Cleared::Done { id, len })
        } else {
            Ok(Cleared::Send { id, len })
        }
    }

    /// Receive `id` (buffer of `cap` bytes) takes rendezvous `msg_id` of `len` bytes from
    /// `peer`; `pull`: the sender's buffer address when this rank can copy it itself.
    pub(super) fn accept(
        &mut self,
        peer: usize,
        msg_id: u64,
        id: OpId,
        (cap, len): (usize, usize),
        pull: Option<u64>,
    ) -> Accepted {
        if len > cap {
            return Accepted::Truncated {
                cts: cts(msg_id, FLAG_DISCARD),
            };
        }
        if let Some(addr) = pull {
            return Accepted::Pull { addr };
        }
        self.recvs.insert(
            (peer, msg_id),
            Incoming {
                id,
                len,
                remaining: len,
            },
        );
        Accepted::Data {
            cts: cts(msg_id, 0),
        }
    }

    /// The CTS after a pull: whether it worked.
    pub(super) fn pulled(msg_id: u64, ok: bool) -> FrameHeader {
        cts(msg_id, if ok { FLAG_PULLED } else { FLAG_DISCARD })
    }

    /// The CTS that asks the sender of rendezvous `msg_id` to write pieces of `piece` bytes
    /// into the buffer at `addr`, claimed under generation `gen` of the pair's split slot.
    pub(super) fn split(msg_id: u64, gen: u32, addr: u64, piece: usize) -> FrameHeader {
        let mut h = cts(msg_id, FLAG_SPLIT);
        h.tag = gen;
        h.offset = addr;
        h.comm = piece as u64;
        h
    }

    /// The CTS that tells the sender of rendezvous `msg_id` not to send its data.
    pub(super) fn refuse(msg_id: u64) -> FrameHeader {
        cts(msg_id, FLAG_DISCARD)
    }

    /// A data frame arrived from `peer`: where its payload goes. An error says why the peer
    /// must be dropped.
    pub(super) fn on_data(
        &mut self,
        peer: usize,
        hdr: &FrameHeader,
    ) -> std::result::Result<Landing, String> {
        let key = (peer, hdr.msg_id);
        let Some(r) = self.recvs.get(&key) else {
            let due = self.discarding.get_mut(&key).ok_or_else(|| {
                format!(
                    "it sent data of message {} that was never cleared",
                    hdr.msg_id
                )
            })?;
            *due = due.saturating_sub(hdr.len);
            if *due == 0 {
                self.discarding.remove(&key);
            }
            return Ok(if hdr.len > 0 {
                Landing::Discard
            } else {
                Landing::Nothing
            });
        };
        if hdr.offset.saturating_add(hdr.len) > r.len as u64 {
            return Err(format!(
                "it sent data beyond the end of message {}",
                hdr.msg_id
            ));
        }
        Ok(Landing::Into {
            id: r.id,
            offset: hdr.offset as usize,
        })
    }

    /// `n` payload bytes of data of message `msg_id` from `peer` landed: the receive and
    /// its length once all did.
    pub(super) fn landed(&mut self, peer: usize, msg_id: u64, n: usize) -> Option<(OpId, usize)> {
        let key = (peer, msg_id);
        let r = self.recvs.get_mut(&key)?;
        r.remaining = r.remaining.saturating_sub(n);
        if r.remaining > 0 {
            return None;
        }
        let done = (r.id, r.len);
        self.recvs.remove(&key);
        Some(done)
    }

    /// Receive `id` is abandoned: data still due for it is read and dropped.
    pub(super) fn abandon_recv(&mut self, id: OpId) {
        if let Some((&k, r)) = self.recvs.iter().find(|(_, r)| r.id == id) {
            let due = r.remaining as u64;
            self.recvs.remove(&k);
            self.discarding.insert(k, due);
        }
    }

    /// Send `id` is abandoned: a CTS for it is ignored.
    pub(super) fn abandon_send(&mut self, id: OpId) {
        if let Some((&k, _)) = self.sends.iter().find(|(_, s)| s.0 == id) {
            self.sends.remove(&k);
            self.abandoned_sends.insert(k);
        }
    }

    /// World rank `peer` is lost: its rendezvous are forgotten (the engine fails their
    /// operations).
    pub(super) fn peer_lost(&mut self, peer: usize) {
        self.recvs.retain(|(q, _), _| *q != peer);
        self.sends.retain(|(q, _), _| *q != peer);
        self.discarding.retain(|(q, _), _| *q != peer);
        self.abandoned_sends.retain(|(q, _)| *q != peer);
    }
}

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
        self.post_send_as(t, buf, len, asynchronous, None)
    }

    /// [`State::post_send`]; `direct`: the number of a direct step of a collective (see
    /// `link::Exposure`), which goes as one frame the link writes into the peer's receive
    /// when the peer's link takes messages of its size that way.
    pub(super) fn post_send_as(
        &mut self,
        t: Target,
        buf: BufPtr,
        len: usize,
        asynchronous: bool,
        direct: Option<u32>,
    ) -> Result<OpId> {
        self.live_peer(&t, OpKind::Send)?;
        let id = self.new_op(OpKind::Send, t, buf, len, asynchronous);
        if t.peer == self.cfg.rank {
            self.send_to_self(id, t, buf, len);
            return Ok(id);
        }
        let Some(caps) = self.links.caps(t.peer) else {
            return Err(Error::internal(format!("no link to world rank {}", t.peer))
                .with_peer(PeerRank::world(t.peer)));
        };
        let shm = (caps.kind == Kind::Shm).then_some(caps.read_remote.is_some());
        let plugin = caps.kind == Kind::Plugin;
        let ofi = caps.kind == Kind::Ofi;
        let direct = direct.filter(|_| {
            self.links
                .primary(t.peer)
                .and_then(Link::puts)
                .is_some_and(|(min, max)| (min..=max).contains(&len))
        });
        let route = match shm {
            Some(cma) => Route::Shm { cma },
            None if ofi && direct.is_some() => Route::Put,
            None if ofi => Route::Rma,
            None => Route::Stream,
        };
        let (hdr, eager) = self.rndv.send(id, &t, len, buf.0 as u64, route);
        let frame = if eager {
            self.ops.get_mut(&id).expect("just inserted").remaining = 1;
            OutFrame {
                op: Some(id),
                len,
                direct,
                ..OutFrame::control(hdr)
            }
        } else {
            OutFrame::control(hdr)
        };
        // A shared-memory rendezvous is counted where its protocol is decided.
        let c = &self.counts;
        // A libfabric link counts its frames by the protocol it picks for each.
        let counter = match (shm.is_some(), plugin, eager) {
            _ if ofi => None,
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
        // A small message over libfabric goes to the provider now when the link takes it.
        if route == Route::Rma && eager && self.send_at_once(t.peer, &hdr, &frame) {
            self.complete(id, Ok(len));
            return Ok(id);
        }
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
        let refused = self.pull_refused.get(peer).copied().unwrap_or(true);
        let pid = self
            .links
            .caps(peer)
            .and_then(|c| c.read_remote)
            .filter(|_| !refused);
        let pull = pull.filter(|_| pid.is_some());
        let cts = match self.rndv.accept(peer, msg_id, id, (op.cap, len), pull) {
            Accepted::Truncated { cts } => {
                let err = truncated(op, len);
                self.complete(id, Err(err));
                cts
            }
            Accepted::Data { cts } => cts,
            Accepted::Pull { addr } => {
                // Receiver pull: one copy, straight from the sender's buffer into this one, a
                // piece per turn; the CTS goes when it is over.
                match (pid, len) {
                    (Some(pid), 1..) => self.start_pull(id, (peer, pid), (msg_id, addr, len)),
                    _ => {
                        self.complete(id, Ok(0));
                        self.queue(peer, OutFrame::control(Rendezvous::pulled(msg_id, true)));
                    }
                }
                return;
            }
        };
        self.queue(peer, OutFrame::control(cts));
    }

    /// Tells the sender of rendezvous `msg_id` not to send its data.
    pub(super) fn refuse_rts(&mut self, peer: usize, msg_id: u64) {
        self.queue(peer, OutFrame::control(Rendezvous::refuse(msg_id)));
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
        let chunk = match caps.kind {
            Kind::Shm => self.cfg.shm_chunk,
            // One frame per chunk the wire allows: the sender writes each into place.
            Kind::Ofi => crate::transport::wire::MAX_CHUNK as usize,
            _ => self.cfg.chunk,
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
