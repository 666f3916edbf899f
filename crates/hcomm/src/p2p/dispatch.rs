//! Frame dispatch, sans I/O: what each arriving frame means for the protocol.
//!
//! Told a frame's header, [`Protocol::on_header`] updates [`Matching`] and [`Rendezvous`],
//! asks [`Calls`], and answers with a [`Step`]: what the engine must carry out (complete or
//! fail operations, queue frames, end a peer) and where the frame's payload goes
//! ([`Step::dest`]). Told that a payload has fully arrived, [`Protocol::on_payload`] says what
//! it completes ([`Landed`]). Nothing here touches a link, a buffer, a lock or the clock: the
//! engine's `State::on_header` and `State::on_payload` carry the answers out (payload bytes
//! still go straight from the link into the receive buffer), and the test `Pair` of
//! `sansio_tests.rs` carries them out for two ranks over in-memory queues.

use crate::transport::wire::{
    FrameHeader, FrameKind, FLAG_CAN_PULL, FLAG_COMM_ABORT, FLAG_MISMATCH, FLAG_REVOKE,
};

use super::calls::{Abandoned, Calls};
use super::matching::{Arrival, Matched, Matching};
use super::rendezvous::{Cleared, Landing, Rendezvous};
use super::{Dest, MatchKey, OpId};

/// The protocol state one rank's frames act on, borrowed from its engine (or a test's rank).
pub(super) struct Protocol<'a> {
    /// Posted receives and unexpected messages.
    pub matching: &'a mut Matching,
    /// Message ids and rendezvous in flight.
    pub rndv: &'a mut Rendezvous,
    /// Collective calls, mismatches and aborts (judged, not changed, by a frame).
    pub calls: &'a Calls,
    /// This rank's world rank.
    pub me: usize,
    /// How many ranks the world has.
    pub size: usize,
}

/// What one arriving frame asks of the engine.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// An eager message (`eager`) or a request to send met matching: the engine binds
    /// `bound` (a receive from any source, to its sender), carries out `matched`, and when
    /// the message belongs to a call this rank made differently (`foreign`) fails that call
    /// and refuses the rendezvous `refuse`.
    Message {
        matched: Matched,
        bound: Option<(OpId, usize)>,
        eager: bool,
        foreign: bool,
        refuse: Option<u64>,
    },
    /// A clear to send for one of this rank's rendezvous sends.
    Cleared(Cleared),
    /// A data frame of a rendezvous: where its payload lands.
    Data(Landing),
    /// The peer said goodbye: it is finalizing.
    Goodbye,
    /// A wake-up: nothing to do.
    Woken,
    /// World rank `origin` (`None`: the peer) aborted the communicators these ids name
    /// (`Communicator::abort`); a rank that knew of it forwards it before its goodbye.
    CommAborted([u64; 3], Option<usize>),
    /// World rank `origin` revoked the communicator these ids name at `epoch`
    /// (`Communicator::revoke`); the notice came from the peer, which may be another.
    Revoked {
        comms: [u64; 3],
        epoch: u32,
        origin: usize,
    },
    /// A message of a revoked communicator's epoch: dropped (its payload, `eager`, too).
    Stale { eager: bool },
    /// The peer asks how many collectives of `comm` this rank entered.
    Asked { comm: u64 },
    /// The peer had entered `count` collectives of `comm` (the answer to this rank's ask).
    Entered { comm: u64, count: u64 },
    /// The peer abandoned the call `(comm, tag)`.
    Abandoned {
        comm: u64,
        tag: u32,
        abandoned: Abandoned,
    },
}

impl Step {
    /// Where the frame's payload goes: `None` when it has none.
    pub(super) fn dest(&self) -> Option<Dest> {
        match self {
            Step::Message {
                matched,
                eager: true,
                ..
            } => payload_dest(matched),
            Step::Data(Landing::Into { id, offset }) => Some(Dest::Op {
                op: *id,
                base: *offset,
            }),
            Step::Data(Landing::Discard) | Step::Stale { eager: true } => Some(Dest::Discard),
            _ => None,
        }
    }
}

/// Where the payload of an eager message goes once matching decided `m`.
pub(super) fn payload_dest(m: &Matched) -> Option<Dest> {
    match m {
        Matched::Queued | Matched::Claimed { .. } | Matched::Rts { .. } => None,
        Matched::Deliver { .. } => None,
        Matched::Held { uid } => Some(Dest::Unexpected(*uid)),
        Matched::Eager { id, .. } => Some(Dest::Op { op: *id, base: 0 }),
        Matched::Foreign | Matched::Truncated { .. } | Matched::Mismatch { .. } => {
            Some(Dest::Discard)
        }
    }
}

/// What a payload that has fully arrived completes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Landed {
    /// Nothing (dropped bytes, or more of the message is due).
    Nothing,
    /// A held message is in: matching decided what becomes of it.
    Matched(Matched),
    /// Operation `id` is complete with `len` bytes.
    Done { id: OpId, len: usize },
}

/// The frame that tells a peer this rank abandoned the call `(comm, tag)` whose signature
/// is `sig` (`mismatch`: over a mismatch), naming the world rank it lost if that was why.
pub(super) fn abort_frame(
    comm: u64,
    tag: u32,
    sig: [u64; 2],
    mismatch: bool,
    lost: Option<usize>,
) -> FrameHeader {
    let mut hdr = FrameHeader::new(FrameKind::Abort);
    if mismatch {
        hdr.flags = FLAG_MISMATCH;
    }
    // The lost rank + 1: 0 names none.
    hdr.msg_id = lost.map_or(0, |l| l as u64 + 1);
    hdr.comm = comm;
    hdr.tag = tag;
    hdr.sig = sig;
    hdr
}

/// The frame that asks a peer how many collectives of `comm` it entered (`ask`), or answers
/// that this rank entered `count` of them.
pub(super) fn entered_frame(comm: u64, ask: bool, count: u64) -> FrameHeader {
    let mut hdr = FrameHeader::new(if ask {
        FrameKind::Ask
    } else {
        FrameKind::Entered
    });
    hdr.comm = comm;
    hdr.msg_id = count;
    hdr
}

/// The frame that tells a peer world rank `origin` (`None`: this rank) aborted the
/// communicators `comms` (an id and the ids of its host and leader tiers, 0 for none).
pub(super) fn comm_abort_frame(comms: [u64; 3], origin: Option<usize>) -> FrameHeader {
    let mut hdr = FrameHeader::new(FrameKind::Abort);
    hdr.flags = FLAG_COMM_ABORT;
    hdr.msg_id = origin.map_or(0, |o| o as u64 + 1);
    hdr.comm = comms[0];
    hdr.sig = [comms[1], comms[2]];
    hdr
}

impl Protocol<'_> {
    /// Dispatches the header of a frame from world rank `peer`; an error when the peer broke
    /// the protocol (the engine then drops it).
    #[inline]
    pub(super) fn on_header(
        &mut self,
        peer: usize,
        hdr: &FrameHeader,
    ) -> std::result::Result<Step, String> {
        Ok(match hdr.kind {
            FrameKind::Eager | FrameKind::Rts
                if self.calls.revocations.stale(hdr.comm, hdr.epoch) =>
            {
                Step::Stale {
                    eager: hdr.kind == FrameKind::Eager,
                }
            }
            FrameKind::Eager | FrameKind::Rts => {
                let eager = hdr.kind == FrameKind::Eager;
                let what = if eager {
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
                let key = MatchKey {
                    comm: hdr.comm,
                    peer,
                    tag: hdr.tag,
                };
                let calls = self.calls;
                let matched = self
                    .matching
                    .arrive(key, hdr.sig, what, || calls.foreign(hdr));
                let foreign = matched == Matched::Foreign;
                Step::Message {
                    matched,
                    bound: self.matching.take_bound(),
                    eager,
                    foreign,
                    refuse: (foreign && !eager).then_some(hdr.msg_id),
                }
            }
            FrameKind::Cts => Step::Cleared(self.rndv.on_cts(peer, hdr)?),
            FrameKind::Data => Step::Data(self.rndv.on_data(peer, hdr)?),
            FrameKind::Close => Step::Goodbye,
            FrameKind::Wake => Step::Woken,
            FrameKind::Ask => Step::Asked { comm: hdr.comm },
            FrameKind::Entered => Step::Entered {
                comm: hdr.comm,
                count: hdr.msg_id,
            },
            FrameKind::Abort if hdr.flags & FLAG_COMM_ABORT != 0 => {
                let origin = hdr.msg_id.checked_sub(1).map(|o| o as usize);
                Step::CommAborted([hdr.comm, hdr.sig[0], hdr.sig[1]], origin)
            }
            FrameKind::Abort if hdr.flags & FLAG_REVOKE != 0 => Step::Revoked {
                comms: [hdr.comm, hdr.sig[0], hdr.sig[1]],
                epoch: hdr.epoch,
                origin: hdr
                    .msg_id
                    .checked_sub(1)
                    .and_then(|o| usize::try_from(o).ok())
                    .filter(|&o| o < self.size)
                    .ok_or("it sent a revoke naming no rank of the world")?,
            },
            FrameKind::Abort => {
                let lost = hdr
                    .msg_id
                    .checked_sub(1)
                    .and_then(|l| usize::try_from(l).ok())
                    .filter(|&l| l < self.size && l != self.me);
                Step::Abandoned {
                    comm: hdr.comm,
                    tag: hdr.tag,
                    abandoned: Abandoned {
                        peer,
                        sig: hdr.sig,
                        mismatch: hdr.flags & FLAG_MISMATCH != 0,
                        lost,
                    },
                }
            }
        })
    }

    /// The payload of a frame from `peer` has fully arrived at `dest`.
    #[inline]
    pub(super) fn on_payload(&mut self, peer: usize, hdr: &FrameHeader, dest: Dest) -> Landed {
        match dest {
            Dest::Discard => Landed::Nothing,
            Dest::Unexpected(uid) => match self.matching.payload_done(uid) {
                Some(m) => Landed::Matched(m),
                None => Landed::Nothing,
            },
            Dest::Op { op: id, .. } => match hdr.kind {
                FrameKind::Data => match self.rndv.landed(peer, hdr.msg_id, hdr.len as usize) {
                    Some((id, len)) => Landed::Done { id, len },
                    None => Landed::Nothing,
                },
                _ => Landed::Done {
                    id,
                    len: hdr.len as usize,
                },
            },
        }
    }
}
