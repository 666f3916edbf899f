//! A link through shared memory with a peer on this host: a ring each way for frames, a fast
//! box each way for small messages, the peer's doorbell to wake it, and cross-memory attach
//! for one-sided reads of its memory.
//!
//! Frames are numbered: the next frame to read is in the fast box or at the front of the
//! ring, whichever holds its number (a ring message carries its number as metadata, a fast
//! box message its number plus one as stamp), so that the two stay in order. A frame is
//! written whole or not at all.
//!
//! A pair that needs no connection (see `transport::shm::wake`) says goodbye through the ring
//! (the goodbye is the peer's last frame: the link ends when it is read) when this rank sent
//! the peer anything ([`ShmPeerLink::owes_goodbye`]); to the others a finalizing rank only
//! marks its inbox finalized, which a peer that never heard from it takes for the goodbye
//! (`transport::shm::link`, "Finalizing"). It wakes a peer
//! sleeping in `epoll_wait` with a datagram to the peer's wake socket, and learns of the
//! peer's death from the watcher, which polls a pidfd of the peer's process. Any other pair
//! keeps a TCP connection beside the link for the goodbye and the wake-ups (its end follows
//! the goodbye; a sleeper in `epoll_wait` hears it).

use std::collections::VecDeque;

use super::{Caps, Dests, Kind, Link, Liveness, Ops, Rx};
use crate::p2p::requests::frame_payload;
use crate::p2p::{Dest, OpId, OutFrame};
use crate::transport::shm::link::{Inbox, ShmLink, Watch};
use crate::transport::shm::split::SplitSlot;
use crate::transport::wire::{FrameHeader, FrameKind, FAST_PAYLOAD, HEADER_LEN};

/// Frames read from the ring per turn, so one busy peer cannot starve the others.
const SHM_ROUNDS: usize = 64;

/// Where the frame handed to the engine waits.
#[derive(Debug)]
enum Held {
    /// In the fast box (its payload is copied from there when placed).
    Fast,
    /// At the front of the ring.
    Ring,
}

/// The shared-memory link to one local peer.
#[derive(Debug)]
pub(in crate::p2p) struct ShmPeerLink {
    link: ShmLink,
    /// Frames waiting for room in the ring, in order.
    out: VecDeque<OutFrame>,
    /// Frames written to the peer: the number of the next one.
    out_seq: u64,
    /// Frames read from the peer: the number of the next one.
    in_seq: u64,
    /// Frames read this turn.
    reads: usize,
    /// The frame whose header the engine has, until it is placed.
    held: Option<Held>,
    /// The peer must be woken out of `epoll_wait`.
    wake: bool,
    /// The peer's goodbye came through the ring (a link without a connection beside it).
    ended: bool,
    /// This rank's goodbye went into the ring.
    said_goodbye: bool,
    /// The peer has started sending (`ShmLink::started`, which stays true once it is).
    started: bool,
    /// An operation with the peer was posted ([`Link::want`]).
    wanted: bool,
    closed: bool,
    caps: Caps,
}

impl ShmPeerLink {
    /// Copies the first `out.len()` payload bytes of the next frame, in the fast box (read,
    /// not taken), straight into `out`.
    #[inline]
    fn copy_fast(&self, out: &mut [u8]) {
        if let Some(body) = self.link.fast_in.peek(self.in_seq + 1) {
            FrameHeader::fast_payload_into(&body, out);
        }
    }

    /// The engine's side of `link`.
    pub(in crate::p2p) fn new(link: ShmLink) -> ShmPeerLink {
        // Without a connection beside it, the link carries the goodbye and the wake-ups.
        let alone = link.end.is_some();
        let caps = Caps {
            kind: Kind::Shm,
            read_remote: link.cma.then_some(link.pid),
            max_payload: link.producer.layout().max_payload() - HEADER_LEN,
            ordered_end: alone,
            wakes_epoll: alone,
            polled: true,
            doorbell: true,
            drain_on_loss: true,
            liveness: Liveness::Heartbeat,
        };
        ShmPeerLink {
            link,
            out: VecDeque::new(),
            out_seq: 0,
            in_seq: 0,
            reads: 0,
            held: None,
            wake: false,
            ended: false,
            said_goodbye: false,
            started: false,
            wanted: false,
            closed: false,
            caps,
        }
    }

    /// Whether the pair was used: this rank posted an operation with the peer or sent it a
    /// frame, or the peer sent this rank one. The watcher judges only such peers by their
    /// heartbeat.
    pub(in crate::p2p) fn used(&self) -> bool {
        self.wanted || self.link.is_started() || self.started || self.link.started()
    }

    /// Whether this rank owes the peer a goodbye through the ring: it sent the peer frames,
    /// or has some queued. A peer that never heard from this rank takes the mark of its inbox
    /// instead (`ShmLink::finalized_unheard`), however it used the pair itself.
    pub(in crate::p2p) fn owes_goodbye(&self) -> bool {
        self.link.is_started() || !self.out.is_empty()
    }

    /// Whether the peer finalized without ever sending to this rank: that stands for its
    /// goodbye (see `ShmLink::finalized_unheard`).
    pub(in crate::p2p) fn finalized_unheard(&self) -> bool {
        !self.closed && !self.started && self.link.finalized_unheard()
    }

    /// Answers the peer's goodbye with this rank's, as the link closes (it sends nothing more
    /// to the peer): a peer that finalizes lingers for it, and would otherwise count this rank
    /// as lost once its process ends. Frames still queued are dropped; a full ring leaves the
    /// peer without it.
    fn answer_goodbye(&mut self) {
        let hdr = FrameHeader::new(FrameKind::Close).encode();
        let m = &mut self.link;
        if m.prepare(Some(HEADER_LEN)).is_ok()
            && m.producer.try_push_parts(self.out_seq, [&hdr, &[]]) == Ok(true)
        {
            self.out_seq += 1;
            self.said_goodbye = true;
            if m.peer_bell().ring() {
                if let Some(end) = &m.end {
                    end.wake();
                }
            }
        }
    }

    /// Whether the peer has started sending to this rank (until then its fast box and ring
    /// are not read).
    #[inline]
    fn peer_started(&mut self) -> bool {
        self.started = self.started || self.link.started();
        self.started
    }

    /// The end of a turn of reads: the peer may wait for room in this ring.
    #[inline]
    fn end_turn(&mut self) -> Rx {
        if self.reads > 0 {
            self.reads = 0;
            self.wake |= self.link.peer_bell().ring();
        }
        Rx::Idle
    }
}

impl Link for ShmPeerLink {
    #[inline]
    fn caps(&self) -> &Caps {
        &self.caps
    }

    #[inline]
    fn push(&mut self, frame: OutFrame) -> bool {
        if frame.kind == FrameKind::Wake {
            // A wake-up is a datagram to the peer's wake socket, not a frame.
            if let Some(end) = &self.link.end {
                end.wake();
            }
            return false;
        }
        self.out.push_back(frame);
        self.out.len() == 1
    }

    #[inline]
    fn flush(&mut self, ops: &Ops, sent: &mut Vec<OpId>) -> Result<bool, String> {
        if self.closed {
            return Ok(false);
        }
        let mut failure = None;
        let mut pushed = 0;
        while let Some(f) = self.out.front() {
            let payload = frame_payload(f, ops);
            let m = &mut self.link;
            if let Err(e) = m.prepare(Some(HEADER_LEN + f.len)) {
                failure = Some(format!("its shared-memory ring got no memory: {e}"));
                break;
            }
            // A small eager frame goes through the fast box when it has room.
            let fast = (f.len <= FAST_PAYLOAD)
                .then(|| FrameHeader::decode(&f.hdr).ok())
                .flatten()
                .and_then(|h| h.encode_fast(payload))
                .is_some_and(|body| m.fast_out.try_push(self.out_seq + 1, &body));
            let pushed_one = if fast {
                Ok(true)
            } else {
                m.producer.try_push_parts(self.out_seq, [&f.hdr, payload])
            };
            match pushed_one {
                Ok(true) => {
                    self.said_goodbye |= f.kind == FrameKind::Close;
                    self.out_seq += 1;
                    if let Some(id) = f.op {
                        sent.push(id);
                    }
                    self.out.pop_front();
                    pushed += 1;
                }
                Ok(false) => break,
                Err(e) => {
                    failure = Some(format!("its shared-memory ring failed: {e}"));
                    break;
                }
            }
        }
        // Every frame may be what the peer sleeps for, control frames (CTS, RTS) included.
        if pushed > 0 || failure.is_some() {
            self.wake |= self.link.peer_bell().ring();
        }
        match failure {
            Some(why) => Err(why),
            None => Ok(pushed > 0),
        }
    }

    #[inline]
    fn busy(&self) -> bool {
        !self.out.is_empty()
    }

    #[inline]
    fn want(&mut self) {
        self.wanted = true;
    }

    fn ready(&mut self) -> bool {
        if self.closed {
            return false;
        }
        if self.peer_started() {
            let m = &mut self.link;
            if m.fast_in.ready(self.in_seq + 1) || !m.consumer.is_empty().unwrap_or(true) {
                return true;
            }
        }
        let m = &mut self.link;
        self.out.front().is_some_and(|f| {
            if !m.is_started() {
                return true;
            }
            let need = m.producer.layout().slots_for(HEADER_LEN + f.len);
            let free = m.producer.free_slots().unwrap_or(usize::MAX);
            need.is_none_or(|n| free >= n)
        })
    }

    #[inline]
    fn poll(&mut self, _dests: &mut Dests<'_>) -> Rx {
        if self.closed || self.held.is_some() {
            return Rx::Idle;
        }
        if self.ended {
            return Rx::Closed { goodbye: true };
        }
        if self.reads >= SHM_ROUNDS || !self.peer_started() {
            return self.end_turn();
        }
        let seq = self.in_seq;
        // The next frame is in the fast box or at the front of the ring, whichever holds its
        // number (in neither yet: it is still being written).
        if let Some(body) = self.link.fast_in.peek(seq + 1) {
            return match FrameHeader::decode_fast_header(&body) {
                Ok(hdr) => {
                    self.held = Some(Held::Fast);
                    Rx::Header(hdr)
                }
                Err(e) => Rx::Failed(format!("it sent a malformed frame ({e})")),
            };
        }
        let hdr = match self.link.consumer.peek() {
            Ok(None) => return self.end_turn(),
            Ok(Some(msg)) if msg.meta() != seq => {
                if msg.meta() > seq {
                    // The fast box frame before it is not visible yet.
                    return self.end_turn();
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
                                Err("a frame's length disagrees with its ring message".to_string())
                            }
                        }),
                    Err(e) => Err(format!("its shared-memory ring failed: {e}")),
                }
            }
            Err(e) => Err(format!("its shared-memory ring failed: {e}")),
        };
        match hdr {
            Ok(hdr) => {
                self.held = Some(Held::Ring);
                Rx::Header(hdr)
            }
            Err(why) => Rx::Failed(why),
        }
    }

    #[inline]
    fn place(
        &mut self,
        hdr: &FrameHeader,
        dest: Option<Dest>,
        dests: &mut Dests<'_>,
    ) -> Result<bool, String> {
        let dst = dests.whole(hdr, dest);
        match self.held.take() {
            Some(Held::Fast) => {
                if let Some(dst) = dst {
                    self.copy_fast(dst);
                }
                self.link.fast_in.consume();
            }
            Some(Held::Ring) => {
                let msg = self
                    .link
                    .consumer
                    .peek()
                    .ok()
                    .flatten()
                    .ok_or("a frame vanished from its shared-memory ring")?;
                if let Some(dst) = dst {
                    msg.copy_range(HEADER_LEN, dst);
                }
                msg.consume();
            }
            None => return Err("a frame was placed that was never read".into()),
        }
        self.in_seq += 1;
        self.reads += 1;
        // The goodbye is the last frame of a peer that has no connection to end.
        self.ended |= hdr.kind == FrameKind::Close && self.caps.ordered_end;
        Ok(true)
    }

    fn forget(&mut self, op: OpId, _ops: &Ops) {
        // Ring frames go whole or not at all.
        self.out.retain(|f| f.op != Some(op));
    }

    #[inline]
    fn take_wake(&mut self) -> bool {
        std::mem::take(&mut self.wake)
    }

    fn close(&mut self) {
        if self.ended && !self.said_goodbye && !self.closed {
            self.answer_goodbye();
        }
        self.closed = true;
        self.out.clear();
    }

    fn heartbeat(&self) -> Option<u64> {
        Some(self.link.peer_bell().beats())
    }

    #[inline]
    fn send_inline(&mut self, hdr: &FrameHeader, data: &[u8]) -> Option<bool> {
        if self.closed || !self.out.is_empty() || self.link.prepare(None).is_err() {
            return None;
        }
        let body = hdr.encode_fast(data)?;
        if !self.link.fast_out.try_push(self.out_seq + 1, &body) {
            return None;
        }
        self.out_seq += 1;
        Some(self.link.peer_bell().ring())
    }

    #[inline]
    fn peek_inline(&self) -> Option<FrameHeader> {
        if !self.link.started() {
            return None;
        }
        let body = self.link.fast_in.peek(self.in_seq + 1)?;
        FrameHeader::decode_fast_header(&body).ok()
    }

    #[inline]
    fn take_inline(&mut self, out: &mut [u8]) {
        self.copy_fast(out);
        self.link.fast_in.consume();
        self.in_seq += 1;
    }

    fn watch<'a>(&self, inbox: &'a Inbox) -> Option<Watch<'a>> {
        (!self.closed && self.out.is_empty() && self.link.started())
            .then(|| inbox.watch(&self.link, self.in_seq))
    }

    fn split_slot(&self, incoming: bool) -> Option<&SplitSlot> {
        // Both regions have their memory: a split follows a request to send, which the
        // sender's reservation of its region preceded.
        Some(match incoming {
            true => self.link.fast_in.split(),
            false => self.link.fast_out.split(),
        })
    }
}
