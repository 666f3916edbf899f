//! Unit tests of the engine's protocol state machines without I/O: [`Matching`],
//! [`Rendezvous`] and [`Calls`], driven alone, and two ranks' machines wired together by
//! in-memory queues of frames (a test [`Pair`], in the manner of quinn-proto's), with time
//! passed in rather than slept. The frames' payload bytes move between plain vectors where the
//! engine would move them between user buffers and a link.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::calls::{Abandoned, Calls};
use super::dispatch::{abort_frame, comm_abort_frame, entered_frame, Landed, Protocol, Step};
use super::matching::{Arrival, Matched, Matching, Recv};
use super::rendezvous::{data_frames, Accepted, Cleared, Limits, Rendezvous, Route};
use super::tests::target;
use super::timers::Timers;
use super::{Dest, MatchKey, OpId, Target};
use crate::error::Error;
use crate::transport::wire::{FrameHeader, FrameKind, FLAG_CAN_PULL, FLAG_DISCARD};

const COMM: u64 = 7;
const LIMITS: Limits = Limits {
    eager: 32,
    shm_eager: 16,
    shm_pull: 256,
    rma_eager: 64,
};
/// Data chunk of the rendezvous transfers.
const CHUNK: usize = 10;

fn key(peer: usize, tag: u32) -> MatchKey {
    MatchKey {
        comm: COMM,
        peer,
        tag,
    }
}

fn recv(id: OpId, cap: usize) -> Recv {
    Recv {
        id,
        sig: [0; 2],
        cap,
    }
}

fn eager(len: usize) -> Arrival {
    Arrival::Eager { len }
}

fn never() -> bool {
    false
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Lands a held eager message's whole payload, as a link would, and says it is in.
fn land(m: &mut Matching, uid: u64, data: &[u8]) -> Option<Matched> {
    if let Some(dst) = m.payload(uid, 0, data.len()) {
        dst.copy_from_slice(data);
    }
    m.payload_done(uid)
}

#[test]
fn messages_of_one_key_match_receives_in_order_and_keys_do_not_block_each_other() {
    let mut m = Matching::default();
    assert_eq!(m.post(key(1, 5), recv(1, 8)), Matched::Queued);
    assert_eq!(m.post(key(1, 5), recv(2, 8)), Matched::Queued);
    assert_eq!(m.post(key(1, 6), recv(3, 8)), Matched::Queued);
    // Tag 6's message is not held up by tag 5's receives, nor tag 5's by another peer's.
    assert_eq!(
        m.arrive(key(1, 6), [0; 2], eager(4), never),
        Matched::Eager { id: 3, len: 4 }
    );
    assert!(matches!(
        m.arrive(key(2, 5), [0; 2], eager(4), never),
        Matched::Held { .. }
    ));
    assert_eq!(
        m.arrive(key(1, 5), [0; 2], eager(1), never),
        Matched::Eager { id: 1, len: 1 }
    );
    assert_eq!(
        m.arrive(key(1, 5), [0; 2], eager(2), never),
        Matched::Eager { id: 2, len: 2 }
    );
    assert!(m.idle(&key(1, 5)));
    assert!(!m.idle(&key(2, 5)));
}

#[test]
fn unexpected_messages_wait_in_arrival_order_and_go_whole_or_when_complete() {
    let mut m = Matching::default();
    let first = bytes(6, 1);
    let Matched::Held { uid: a } = m.arrive(key(0, 1), [0; 2], eager(6), never) else {
        panic!("nobody receives yet: held");
    };
    let Matched::Held { uid: b } = m.arrive(key(0, 1), [0; 2], eager(3), never) else {
        panic!("held");
    };
    assert!(m.has_unexpected(&key(0, 1)));
    // The first message arrived whole: a receive gets its bytes at once.
    assert_eq!(land(&mut m, a, &first), None);
    assert_eq!(
        m.post(key(0, 1), recv(10, 6)),
        Matched::Deliver {
            id: 10,
            data: first
        }
    );
    // The second is still arriving: the receive claims it and completes when it is in.
    assert_eq!(m.post(key(0, 1), recv(11, 3)), Matched::Claimed { id: 11 });
    assert!(!m.has_unexpected(&key(0, 1)));
    let second = bytes(3, 2);
    assert_eq!(
        land(&mut m, b, &second),
        Some(Matched::Deliver {
            id: 11,
            data: second
        })
    );
    assert!(m.idle(&key(0, 1)));
}

#[test]
fn a_message_longer_than_the_receive_truncates_it_posted_or_held() {
    let mut m = Matching::default();
    m.post(key(0, 1), recv(1, 4));
    assert_eq!(
        m.arrive(key(0, 1), [0; 2], eager(5), never),
        Matched::Truncated { id: 1, len: 5 }
    );
    // Held whole, then claimed by a receive too small.
    let Matched::Held { uid } = m.arrive(key(0, 1), [0; 2], eager(5), never) else {
        panic!("held");
    };
    land(&mut m, uid, &bytes(5, 0));
    assert_eq!(
        m.post(key(0, 1), recv(2, 4)),
        Matched::Truncated { id: 2, len: 5 }
    );
    // Claimed while arriving: truncated once it is in.
    let Matched::Held { uid } = m.arrive(key(0, 1), [0; 2], eager(9), never) else {
        panic!("held");
    };
    assert_eq!(m.post(key(0, 1), recv(3, 8)), Matched::Claimed { id: 3 });
    assert_eq!(
        land(&mut m, uid, &bytes(9, 0)),
        Some(Matched::Truncated { id: 3, len: 9 })
    );
    // A rendezvous is matched whatever its length: the rendezvous refuses what is too long.
    m.post(key(0, 1), recv(4, 8));
    let rts = Arrival::Rts {
        msg_id: 3,
        len: 100,
        pull: None,
    };
    assert_eq!(
        m.arrive(key(0, 1), [0; 2], rts, never),
        Matched::Rts {
            id: 4,
            msg_id: 3,
            len: 100,
            pull: None
        }
    );
    let mut r = Rendezvous::new(LIMITS, 2);
    assert_eq!(
        r.accept(0, 3, 4, (8, 100), None),
        Accepted::Truncated {
            cts: Rendezvous::refuse(3)
        }
    );
}

#[test]
fn a_message_of_another_call_fails_the_receive_and_refuses_its_rendezvous() {
    let (ours, theirs) = ([1, 2], [1, 3]);
    let mut m = Matching::default();
    let r = |id| Recv {
        id,
        sig: ours,
        cap: 64,
    };
    m.post(key(0, 4), r(1));
    assert_eq!(
        m.arrive(key(0, 4), theirs, eager(8), never),
        Matched::Mismatch {
            id: 1,
            theirs,
            refuse: None
        }
    );
    let rts = Arrival::Rts {
        msg_id: 9,
        len: 100,
        pull: None,
    };
    assert!(matches!(
        m.arrive(key(0, 4), theirs, rts, never),
        Matched::Held { .. }
    ));
    assert_eq!(
        m.post(key(0, 4), r(2)),
        Matched::Mismatch {
            id: 2,
            theirs,
            refuse: Some(9)
        }
    );
    // An eager one still arriving is dropped as it comes.
    let Matched::Held { uid } = m.arrive(key(0, 4), theirs, eager(8), never) else {
        panic!("held");
    };
    assert!(matches!(m.post(key(0, 4), r(3)), Matched::Mismatch { .. }));
    assert_eq!(land(&mut m, uid, &bytes(8, 0)), None);
    assert!(m.idle(&key(0, 4)));
    // With no receive posted, the caller judges: a foreign message is not kept.
    assert_eq!(
        m.arrive(key(0, 4), theirs, eager(8), || true),
        Matched::Foreign
    );
    assert!(m.idle(&key(0, 4)));
}

#[test]
fn a_call_refuses_the_messages_of_another_call_that_came_before_it() {
    let (ours, theirs) = ([1, 2], [1, 3]);
    let mut m = Matching::default();
    let mut calls = Calls::new(|sig| format!("call {sig:?}"), Arc::default());
    m.arrive(key(1, 4), ours, eager(8), never);
    m.arrive(
        key(2, 4),
        theirs,
        Arrival::Rts {
            msg_id: 5,
            len: 100,
            pull: None,
        },
        never,
    );
    calls.begin(COMM, 4, ours).expect("a first call");
    let found = m.strangers(COMM, 4, ours, 3);
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].peer, found[0].sig, found[0].rts),
        (2, theirs, Some(5))
    );
    let err = calls.refuted(ours, &found[0]);
    assert!(matches!(err, Error::Mismatch(_)), "{err:?}");
    // The message of this call stays; the stranger is gone.
    assert!(m.has_unexpected(&key(1, 4)));
    assert!(m.idle(&key(2, 4)));
    // Later messages of the call are judged by its signature.
    let mut hdr = FrameHeader::new(FrameKind::Eager);
    (hdr.comm, hdr.tag, hdr.sig) = (COMM, 4, theirs);
    assert!(calls.foreign(&hdr));
    hdr.sig = ours;
    assert!(!calls.foreign(&hdr));
}

#[test]
fn a_call_finds_the_strangers_among_few_held_messages_of_a_large_job_in_rank_order() {
    let (ours, theirs) = ([1, 2], [1, 3]);
    let found = |m: &mut Matching, peers| -> Vec<usize> {
        let s = m.strangers(COMM, 4, ours, peers);
        assert!(s.iter().all(|s| s.sig == theirs && s.rts.is_none()));
        s.iter().map(|s| s.peer).collect()
    };
    // Fewer held keys than ranks: the held keys are looked at, not every rank's.
    let mut m = Matching::default();
    for (k, sig) in [
        (key(900, 4), theirs),
        (key(5, 4), theirs),
        (key(2, 4), ours),
        (key(7, 9), theirs),
        (
            MatchKey {
                comm: COMM + 1,
                peer: 3,
                tag: 4,
            },
            theirs,
        ),
    ] {
        m.arrive(k, sig, eager(8), never);
    }
    assert_eq!(found(&mut m, 1000), [5, 900]);
    assert!(m.has_unexpected(&key(2, 4)) && m.has_unexpected(&key(7, 9)));
    assert!(m.idle(&key(5, 4)) && m.idle(&key(900, 4)));
    // As many held keys as ranks: every rank's key is looked up.
    let mut m = Matching::default();
    for (k, sig) in [(key(2, 4), theirs), (key(0, 4), theirs), (key(1, 4), ours)] {
        m.arrive(k, sig, eager(8), never);
    }
    assert_eq!(found(&mut m, 3), [0, 2]);
    assert!(m.has_unexpected(&key(1, 4)));
}

#[test]
fn a_mismatch_found_after_the_call_is_reported_once_by_the_next_call() {
    let late = Arc::new(AtomicBool::new(false));
    let mut calls = Calls::new(|sig| format!("call {sig:?}"), Arc::clone(&late));
    calls.begin(COMM, 1, [1, 1]).expect("call 1");
    // The call is over (nothing pending): the engine forgets it and keeps the error.
    assert!(calls.forget(COMM, 1));
    assert!(!calls.forget(COMM, 1), "reported once however many tell");
    calls.report_late(COMM, Error::mismatch("call 1"));
    assert!(late.load(std::sync::atomic::Ordering::Acquire));
    assert!(matches!(
        calls.begin(COMM, 2, [1, 1]),
        Err(Error::Mismatch(_))
    ));
    assert!(!late.load(std::sync::atomic::Ordering::Acquire));
    calls.begin(COMM, 3, [1, 1]).expect("reported once");
    // Another communicator never saw it.
    calls
        .begin(COMM + 1, 1, [1, 1])
        .expect("another communicator");
}

#[test]
fn a_peers_abort_fails_the_call_with_the_cause_it_names() {
    let mut calls = Calls::new(|sig| format!("call {sig:?}"), Arc::default());
    let sig = [4, 4];
    calls.begin(COMM, 1, sig).expect("begin");
    let t = target(2, 1, sig);
    let abort = |mismatch, lost| Abandoned {
        peer: 2,
        sig,
        mismatch,
        lost,
    };
    // The peer lost world rank 3: the call fails naming that rank.
    let e = calls.on_abort(COMM, 1, abort(false, Some(3)));
    assert!(matches!(&e, Some(Error::PeerLost(_))), "{e:?}");
    assert_eq!(
        e.as_ref().and_then(Error::peer).and_then(|p| p.world),
        Some(3)
    );
    assert_eq!(calls.last_lost(), Some(3));
    // Later operations of the call fail the same way, before they start.
    assert!(matches!(calls.check(&t), Err(Error::PeerLost(_))));
    assert!(calls.is_aborted(COMM, 1));
    assert!(calls.check(&target(2, 2, sig)).is_ok());
    // Over a mismatch, after another error, or a call it made differently.
    let mismatch = calls.abandoned(sig, &abort(true, None));
    assert!(matches!(mismatch, Error::Mismatch(_)), "{mismatch:?}");
    assert_eq!(mismatch.peer().and_then(|p| p.world), Some(2));
    let other = calls.abandoned(sig, &abort(false, None));
    assert!(matches!(other, Error::Aborted(_)), "{other:?}");
    let differently = calls.abandoned([5, 5], &abort(false, Some(3)));
    assert!(matches!(differently, Error::Mismatch(_)), "{differently:?}");
    // News about a call this rank does not make fails nothing now.
    assert!(calls.on_abort(COMM, 9, abort(false, None)).is_none());
    // It fails the call once this rank makes it.
    calls.begin(COMM, 9, sig).expect("begin");
    assert!(matches!(
        calls.abandoned_call(COMM, 9),
        Some(Error::Aborted(_))
    ));
    assert!(calls.abandoned_call(COMM, 8).is_none());
}

#[test]
fn an_aborted_communicator_fails_every_call_on_it_with_its_first_error() {
    let mut calls = Calls::new(|sig| format!("call {sig:?}"), Arc::default());
    assert!(calls.aborted_comm(COMM).is_none());
    let first = calls.abort_comm(COMM, Error::aborted("first"));
    let again = calls.abort_comm(COMM, Error::aborted("second"));
    assert_eq!(first, again);
    assert!(matches!(calls.begin(COMM, 1, [0; 2]), Err(Error::Aborted(m)) if m.message == "first"));
    assert!(matches!(
        calls.check(&target(1, 0, [0; 2])),
        Err(Error::Aborted(_))
    ));
    calls
        .begin(COMM + 1, 1, [0; 2])
        .expect("another communicator");
}

#[test]
fn the_protocol_follows_the_size_limits_of_each_route() {
    let mut r = Rendezvous::new(LIMITS, 2);
    let t = target(1, 0, [0; 2]);
    let kind = |r: &mut Rendezvous, len, route| {
        let (hdr, eager) = r.send(1, &t, len, 0x1000, route);
        assert_eq!(eager, hdr.kind == FrameKind::Eager);
        (hdr.kind, hdr.flags & FLAG_CAN_PULL != 0)
    };
    assert_eq!(kind(&mut r, 32, Route::Stream), (FrameKind::Eager, false));
    assert_eq!(kind(&mut r, 33, Route::Stream), (FrameKind::Rts, false));
    assert_eq!(
        kind(&mut r, 16, Route::Shm { cma: true }),
        (FrameKind::Eager, false)
    );
    assert_eq!(
        kind(&mut r, 17, Route::Shm { cma: true }),
        (FrameKind::Rts, true)
    );
    assert_eq!(
        kind(&mut r, 256, Route::Shm { cma: true }),
        (FrameKind::Rts, true)
    );
    // Above the pull threshold, or without cross-memory attach: pushed.
    assert_eq!(
        kind(&mut r, 257, Route::Shm { cma: true }),
        (FrameKind::Rts, false)
    );
    assert_eq!(
        kind(&mut r, 17, Route::Shm { cma: false }),
        (FrameKind::Rts, false)
    );
    // Every message to a peer has its own id.
    assert_eq!(r.peek_msg_id(1), 7);
    assert_eq!(r.peek_msg_id(0), 0);
}

/// What a rank's operation ended with.
type Outcome = std::result::Result<usize, &'static str>;

/// One rank's protocol machines, with the buffers of its operations.
struct Node {
    matching: Matching,
    rndv: Rendezvous,
    calls: Calls,
    /// Deadlines of its receives.
    timers: Timers,
    /// Send buffers by operation.
    sends: Vec<(OpId, Vec<u8>)>,
    /// Receive buffers by operation, with the target each came from.
    recvs: Vec<(OpId, Target, Vec<u8>)>,
    /// Completed operations.
    done: Vec<(OpId, Outcome)>,
    /// The id of the next operation.
    next_op: OpId,
    /// The peer said goodbye.
    peer_closed: bool,
    /// Message frames dropped as stale (of a revoked communicator's epoch).
    stale: usize,
    /// The calls this rank failed over a peer's message or abort, with the error.
    failed_calls: Vec<((u64, u32), Error)>,
}

/// Two ranks whose frames travel through in-memory queues, in order, as on one link.
struct Pair {
    nodes: [Node; 2],
    /// Frames in flight to each rank: from the other, header and payload.
    wire: [VecDeque<(FrameHeader, Vec<u8>)>; 2],
    /// Injected time.
    now: Instant,
}

impl Node {
    fn new() -> Node {
        Node {
            matching: Matching::default(),
            rndv: Rendezvous::new(LIMITS, 2),
            calls: Calls::new(|sig| format!("call {sig:?}"), Arc::default()),
            timers: Timers::default(),
            sends: Vec::new(),
            recvs: Vec::new(),
            done: Vec::new(),
            next_op: 1,
            peer_closed: false,
            stale: 0,
            failed_calls: Vec::new(),
        }
    }

    /// The machines a frame acts on, as the engine lends them (`State::protocol`).
    fn protocol(&mut self, me: usize) -> Protocol<'_> {
        Protocol {
            matching: &mut self.matching,
            rndv: &mut self.rndv,
            calls: &self.calls,
            me,
            size: 2,
        }
    }

    fn outcome(&self, id: OpId) -> Option<Outcome> {
        self.done.iter().find(|(o, _)| *o == id).map(|(_, r)| *r)
    }

    /// Operation `id` is over: it waits no more.
    fn finish(&mut self, id: OpId, outcome: Outcome) {
        self.timers.disarm(id);
        self.done.push((id, outcome));
    }

    fn recv_buf(&mut self, id: OpId) -> Option<&mut Vec<u8>> {
        self.recvs
            .iter_mut()
            .find(|(o, _, _)| *o == id)
            .map(|r| &mut r.2)
    }

    fn send_buf(&self, id: OpId) -> &[u8] {
        &self.sends.iter().find(|(o, _)| *o == id).expect("a send").1
    }

    /// Fails call `(comm, tag)` with `err`: its receives not complete yet fail (as
    /// `State::fail_call`).
    fn fail_call(&mut self, comm: u64, tag: u32, err: Error) {
        let pending: Vec<(OpId, Target)> = self
            .recvs
            .iter()
            .filter(|(id, t, _)| t.comm == comm && t.tag == tag && self.outcome(*id).is_none())
            .map(|(id, t, _)| (*id, *t))
            .collect();
        for (id, t) in pending {
            self.matching.withdraw(&t.key(), id);
            self.rndv.abandon_recv(id);
            self.finish(id, Err("aborted"));
        }
        self.failed_calls.push(((comm, tag), err));
    }
}

impl Pair {
    fn new() -> Pair {
        Pair {
            nodes: [Node::new(), Node::new()],
            wire: [VecDeque::new(), VecDeque::new()],
            now: Instant::now(),
        }
    }

    /// Rank `from` sends `data` with tag `tag`; returns the operation.
    fn send(&mut self, from: usize, tag: u32, data: Vec<u8>, route: Route) -> OpId {
        self.send_sig(from, tag, [0; 2], data, route)
    }

    /// Rank `from` sends `data` with tag `tag` and signature `sig`; returns the operation.
    fn send_sig(
        &mut self,
        from: usize,
        tag: u32,
        sig: [u64; 2],
        data: Vec<u8>,
        route: Route,
    ) -> OpId {
        let n = &mut self.nodes[from];
        let id = n.next_op;
        n.next_op += 1;
        let t = target(1 - from, tag, sig);
        let (hdr, eager) = n.rndv.send(id, &t, data.len(), 0, route);
        let payload = if eager { data.clone() } else { Vec::new() };
        if eager {
            n.done.push((id, Ok(data.len())));
        }
        n.sends.push((id, data));
        self.wire[1 - from].push_back((hdr, payload));
        id
    }

    /// Rank `at` posts a receive of `cap` bytes for tag `tag`, due by `deadline` from now.
    fn recv(&mut self, at: usize, tag: u32, cap: usize, deadline: Option<Duration>) -> OpId {
        self.recv_sig(at, tag, [0; 2], cap, deadline)
    }

    /// Rank `at` posts a receive of `cap` bytes for tag `tag` and signature `sig`, due by
    /// `deadline` from now.
    fn recv_sig(
        &mut self,
        at: usize,
        tag: u32,
        sig: [u64; 2],
        cap: usize,
        deadline: Option<Duration>,
    ) -> OpId {
        let now = self.now;
        let n = &mut self.nodes[at];
        let id = n.next_op;
        n.next_op += 1;
        let t = target(1 - at, tag, sig);
        n.recvs.push((id, t, vec![0; cap]));
        let m = n.matching.post(t.key(), Recv { id, sig, cap });
        if let Some(d) = deadline {
            n.timers.arm(id, now + d);
        }
        self.matched(at, m, None);
        id
    }

    /// Carries out a matching decision at rank `at`; an arriving eager payload comes along.
    fn matched(&mut self, at: usize, m: Matched, payload: Option<&[u8]>) {
        let peer = 1 - at;
        let n = &mut self.nodes[at];
        match m {
            Matched::Queued | Matched::Claimed { .. } | Matched::Foreign => {}
            Matched::Held { uid } => {
                if let Some(data) = payload {
                    if let Some(dst) = n.matching.payload(uid, 0, data.len()) {
                        dst.copy_from_slice(data);
                    }
                    let hdr = FrameHeader::new(FrameKind::Eager);
                    if let Landed::Matched(m) =
                        n.protocol(at).on_payload(peer, &hdr, Dest::Unexpected(uid))
                    {
                        self.matched(at, m, None);
                    }
                }
            }
            Matched::Eager { id, len } => {
                let data = payload.expect("an eager payload");
                n.recv_buf(id).expect("a receive")[..len].copy_from_slice(data);
                n.finish(id, Ok(len));
            }
            Matched::Deliver { id, data } => {
                n.recv_buf(id).expect("a receive")[..data.len()].copy_from_slice(&data);
                n.finish(id, Ok(data.len()));
            }
            Matched::Truncated { id, .. } => n.finish(id, Err("truncated")),
            Matched::Mismatch { id, refuse, .. } => {
                n.finish(id, Err("mismatch"));
                if let Some(msg_id) = refuse {
                    self.wire[peer].push_back((Rendezvous::refuse(msg_id), Vec::new()));
                }
            }
            Matched::Rts {
                id,
                msg_id,
                len,
                pull,
            } => {
                let cap = n.recv_buf(id).expect("a receive").len();
                match n.rndv.accept(peer, msg_id, id, (cap, len), pull) {
                    Accepted::Truncated { cts } => {
                        n.finish(id, Err("truncated"));
                        self.wire[peer].push_back((cts, Vec::new()));
                    }
                    Accepted::Data { cts } => self.wire[peer].push_back((cts, Vec::new())),
                    Accepted::Pull { .. } => unreachable!("these tests offer no pull"),
                }
            }
        }
    }

    /// Delivers the next frame in flight to rank `at` through its protocol's dispatch
    /// (`Protocol::on_header`), carrying out the step as the engine does; whether there was
    /// one.
    fn step(&mut self, at: usize) -> std::result::Result<bool, String> {
        let Some((hdr, payload)) = self.wire[at].pop_front() else {
            return Ok(false);
        };
        let peer = 1 - at;
        let n = &mut self.nodes[at];
        let step = n.protocol(at).on_header(peer, &hdr)?;
        let dest = step.dest();
        match step {
            Step::Message {
                matched,
                foreign,
                refuse,
                ..
            } => {
                if let Some(msg_id) = refuse {
                    self.wire[peer].push_back((Rendezvous::refuse(msg_id), Vec::new()));
                }
                if foreign {
                    let n = &mut self.nodes[at];
                    let ours = n.calls.ours(hdr.comm, hdr.tag).expect("a call of ours");
                    let err = n.calls.mismatch(ours, "the peer", hdr.sig);
                    n.fail_call(hdr.comm, hdr.tag, err);
                    let abort = abort_frame(hdr.comm, hdr.tag, ours, true, None);
                    self.wire[peer].push_back((abort, Vec::new()));
                }
                let carried = dest.map(|_| &payload[..]);
                self.matched(at, matched, carried);
            }
            Step::Cleared(Cleared::Ignored) | Step::Woken => {}
            Step::Cleared(Cleared::Split { .. }) => unreachable!("these tests offer no split"),
            Step::Cleared(Cleared::Done { id, len }) => n.finish(id, Ok(len)),
            Step::Cleared(Cleared::Send { id, len }) => {
                for f in data_frames(id, hdr.msg_id, len, CHUNK) {
                    let h = FrameHeader::decode(&f.hdr).expect("a data header");
                    let bytes = n.send_buf(id)[f.off..f.off + f.len].to_vec();
                    self.wire[peer].push_back((h, bytes));
                }
                // The frames are handed over: the send is done.
                n.finish(id, Ok(len));
            }
            Step::Data(_) => {
                if let Some(Dest::Op { op, base }) = dest {
                    let buf = n.recv_buf(op).expect("a receive");
                    buf[base..base + payload.len()].copy_from_slice(&payload);
                }
                if let Some(dest) = dest {
                    if let Landed::Done { id, len } = n.protocol(at).on_payload(peer, &hdr, dest) {
                        n.finish(id, Ok(len));
                    }
                }
            }
            Step::Goodbye => n.peer_closed = true,
            Step::Stale { .. } => n.stale += 1,
            Step::Revoked { comms, epoch, .. } => {
                for comm in comms {
                    n.calls.revocations.revoke(comm, epoch);
                    n.calls.abort_comm(comm, Error::revoked("the peer revoked"));
                }
            }
            Step::CommAborted(comms, _) => {
                for comm in comms {
                    n.calls.abort_comm(comm, Error::aborted("the peer aborted"));
                }
            }
            Step::Abandoned {
                comm,
                tag,
                abandoned,
            } => {
                if let Some(err) = n.calls.on_abort(comm, tag, abandoned) {
                    n.fail_call(comm, tag, err);
                }
            }
            Step::Asked { comm } => {
                let answer = entered_frame(comm, false, n.calls.entered(comm));
                self.wire[peer].push_back((answer, Vec::new()));
            }
            Step::Entered { comm, count } => n.calls.on_entered(comm, peer, count),
        }
        Ok(true)
    }

    /// Time passes: receives past their deadline are taken back, as the engine's wait does
    /// when its timers say they expired.
    fn advance(&mut self, by: Duration) {
        self.now += by;
        let now = self.now;
        for n in &mut self.nodes {
            for id in n.timers.all_expired(now) {
                let t = n.recvs.iter().find(|r| r.0 == id).expect("a receive").1;
                n.matching.withdraw(&t.key(), id);
                n.rndv.abandon_recv(id);
                n.finish(id, Err("timeout"));
            }
        }
    }

    /// Delivers frames both ways until none is in flight.
    fn run(&mut self) {
        while self.step(0).expect("rank 0") | self.step(1).expect("rank 1") {}
    }
}

#[test]
fn a_rendezvous_completes_across_two_machines_straight_into_the_receive_buffer() {
    let mut p = Pair::new();
    let big = bytes(3 * CHUNK + 7, 3);
    let small = bytes(5, 4);
    // The large message first, sent before its receive is posted; the small one after it.
    let s1 = p.send(0, 1, big.clone(), Route::Stream);
    let s2 = p.send(0, 1, small.clone(), Route::Stream);
    p.run();
    assert_eq!(p.nodes[0].outcome(s1), None, "the RTS waits for a receive");
    let r1 = p.recv(1, 1, 100, None);
    let r2 = p.recv(1, 1, 8, None);
    assert_eq!(p.nodes[1].outcome(r2), Some(Ok(5)), "held eager message");
    p.run();
    assert_eq!(p.nodes[1].outcome(r1), Some(Ok(big.len())));
    assert_eq!(p.nodes[0].outcome(s1), Some(Ok(big.len())));
    assert_eq!(p.nodes[0].outcome(s2), Some(Ok(5)));
    assert_eq!(&p.nodes[1].recv_buf(r1).expect("r1")[..big.len()], &big[..]);
    assert_eq!(&p.nodes[1].recv_buf(r2).expect("r2")[..5], &small[..]);
    // Both ways at once.
    let a = p.send(0, 2, bytes(100, 5), Route::Stream);
    let b = p.send(1, 2, bytes(90, 6), Route::Stream);
    let ra = p.recv(1, 2, 100, None);
    let rb = p.recv(0, 2, 100, None);
    p.run();
    assert_eq!(p.nodes[1].outcome(ra), Some(Ok(100)));
    assert_eq!(p.nodes[0].outcome(rb), Some(Ok(90)));
    assert_eq!(p.nodes[0].outcome(a), Some(Ok(100)));
    assert_eq!(p.nodes[1].outcome(b), Some(Ok(90)));
    assert_eq!(p.nodes[0].recv_buf(rb).expect("rb")[..90], bytes(90, 6)[..]);
}

#[test]
fn a_rendezvous_longer_than_the_receive_is_refused_and_both_sides_complete() {
    let mut p = Pair::new();
    let s = p.send(0, 1, bytes(100, 1), Route::Stream);
    let r = p.recv(1, 1, 99, None);
    p.run();
    assert_eq!(p.nodes[1].outcome(r), Some(Err("truncated")));
    // The sender sent no data: the refusal completes it.
    assert_eq!(p.nodes[0].outcome(s), Some(Ok(100)));
    assert!(p.wire.iter().all(VecDeque::is_empty));
}

#[test]
fn a_receive_past_its_deadline_is_taken_back_and_the_message_goes_to_the_next() {
    let mut p = Pair::new();
    let r1 = p.recv(1, 1, 8, Some(Duration::from_millis(10)));
    p.advance(Duration::from_millis(9));
    assert_eq!(p.nodes[1].outcome(r1), None);
    p.advance(Duration::from_millis(1));
    assert_eq!(p.nodes[1].outcome(r1), Some(Err("timeout")));
    let s = p.send(0, 1, bytes(8, 2), Route::Stream);
    p.run();
    let r2 = p.recv(1, 1, 8, None);
    assert_eq!(p.nodes[1].outcome(r2), Some(Ok(8)));
    assert_eq!(p.nodes[0].outcome(s), Some(Ok(8)));
}

#[test]
fn a_rendezvous_receive_that_times_out_mid_transfer_drops_the_rest_of_its_data() {
    let mut p = Pair::new();
    let len = 5 * CHUNK;
    let s = p.send(0, 1, bytes(len, 1), Route::Stream);
    let r = p.recv(1, 1, len, Some(Duration::from_millis(5)));
    // RTS to rank 1, CTS to rank 0, the data frames to rank 1; two of them land.
    p.step(1).expect("RTS");
    p.step(0).expect("CTS");
    p.step(1).expect("data");
    p.step(1).expect("data");
    p.advance(Duration::from_millis(5));
    assert_eq!(p.nodes[1].outcome(r), Some(Err("timeout")));
    // The rest arrives and is dropped: the stream stays framed, no error.
    p.run();
    assert_eq!(p.nodes[0].outcome(s), Some(Ok(len)));
    // The next message of the tag goes to the next receive.
    let s2 = p.send(0, 1, bytes(len, 2), Route::Stream);
    let r2 = p.recv(1, 1, len, None);
    p.run();
    assert_eq!(p.nodes[1].outcome(r2), Some(Ok(len)));
    assert_eq!(p.nodes[1].recv_buf(r2).expect("r2")[..], bytes(len, 2)[..]);
    assert_eq!(p.nodes[0].outcome(s2), Some(Ok(len)));
}

#[test]
fn a_peer_lost_mid_rendezvous_leaves_nothing_of_it_behind() {
    let mut p = Pair::new();
    let len = 4 * CHUNK;
    p.send(0, 1, bytes(len, 1), Route::Stream);
    let whole = p.send(0, 2, bytes(4, 2), Route::Stream);
    let r = p.recv(1, 1, len, None);
    p.step(1).expect("RTS");
    p.step(1).expect("the eager message of tag 2");
    p.step(0).expect("CTS");
    p.step(1).expect("first data frame");
    assert_eq!(p.nodes[0].outcome(whole), Some(Ok(4)));
    // Rank 0 is lost: rank 1 forgets its rendezvous (the engine fails the receive).
    let n = &mut p.nodes[1];
    n.rndv.peer_lost(0);
    n.matching.peer_lost(0);
    let frame = p.wire[1].pop_front().expect("more data in flight").0;
    let late = p.nodes[1].rndv.on_data(0, &frame);
    assert!(late.is_err(), "data of a forgotten rendezvous: {late:?}");
    assert_eq!(p.nodes[1].rndv.landed(0, frame.msg_id, CHUNK), None);
    assert_eq!(p.nodes[1].outcome(r), None);
    // A message that arrived whole before stays receivable.
    let r2 = p.recv(1, 2, 4, None);
    assert_eq!(p.nodes[1].outcome(r2), Some(Ok(4)));
    // The sender forgets its side: a late CTS is a protocol error, not a completion.
    let s = p.send(0, 3, bytes(len, 3), Route::Stream);
    p.nodes[0].rndv.peer_lost(1);
    let cts = super::rendezvous::cts(p.nodes[0].rndv.peek_msg_id(1) - 1, 0);
    assert!(p.nodes[0].rndv.on_cts(1, &cts).is_err());
    assert_eq!(p.nodes[0].outcome(s), None);
}

#[test]
fn a_lost_peers_partial_messages_are_forgotten_and_its_receives_leave_the_queues() {
    let mut m = Matching::default();
    m.post(key(0, 1), recv(1, 8));
    let Matched::Held { uid: partial } = m.arrive(key(0, 2), [0; 2], eager(8), never) else {
        panic!("held");
    };
    let Matched::Held { uid: whole } = m.arrive(key(0, 3), [0; 2], eager(2), never) else {
        panic!("held");
    };
    land(&mut m, whole, &[1, 2]);
    m.arrive(
        key(0, 4),
        [0; 2],
        Arrival::Rts {
            msg_id: 1,
            len: 100,
            pull: None,
        },
        never,
    );
    m.peer_lost(0);
    assert!(m.idle(&key(0, 1)));
    assert!(m.idle(&key(0, 2)));
    assert!(m.idle(&key(0, 4)));
    assert!(m.payload(partial, 0, 8).is_none());
    assert_eq!(
        m.post(key(0, 3), recv(2, 8)),
        Matched::Deliver {
            id: 2,
            data: vec![1, 2]
        }
    );
}

#[test]
fn an_abandoned_send_ignores_its_late_cts_and_an_unknown_one_is_an_error() {
    let mut r = Rendezvous::new(LIMITS, 2);
    let t = target(1, 0, [0; 2]);
    let (hdr, eager) = r.send(5, &t, 1000, 0, Route::Stream);
    assert!(!eager);
    r.abandon_send(5);
    let cts = super::rendezvous::cts(hdr.msg_id, 0);
    assert_eq!(r.on_cts(1, &cts), Ok(Cleared::Ignored));
    assert!(r.on_cts(1, &cts).is_err(), "ignored once");
    let (hdr, _) = r.send(6, &t, 1000, 0, Route::Stream);
    assert_eq!(
        r.on_cts(1, &super::rendezvous::cts(hdr.msg_id, FLAG_DISCARD)),
        Ok(Cleared::Done { id: 6, len: 1000 })
    );
}

#[test]
fn wildcard_and_specific_receives_match_in_posting_order_and_a_wildcard_binds_to_its_sender() {
    let mut m = Matching::default();
    let members = [0, 1, 2];
    assert_eq!(m.post(key(1, 5), recv(1, 8)), Matched::Queued);
    assert_eq!(m.post_any(COMM, 5, &members, recv(2, 8)), Matched::Queued);
    assert_eq!(m.post(key(2, 5), recv(3, 8)), Matched::Queued);
    // A pending wildcard concerns every sender of its communicator and tag.
    assert!(!m.idle(&key(0, 5)));
    assert!(m.idle(&key(0, 6)));
    // From rank 2: the wildcard was posted before rank 2's own receive.
    assert_eq!(
        m.arrive(key(2, 5), [0; 2], eager(4), never),
        Matched::Eager { id: 2, len: 4 }
    );
    assert_eq!(m.take_bound(), Some((2, 2)));
    assert_eq!(m.take_bound(), None, "told once");
    // From rank 1: its own receive was posted first.
    assert_eq!(
        m.arrive(key(1, 5), [0; 2], eager(4), never),
        Matched::Eager { id: 1, len: 4 }
    );
    assert_eq!(m.take_bound(), None);
    assert_eq!(
        m.arrive(key(2, 5), [0; 2], eager(4), never),
        Matched::Eager { id: 3, len: 4 }
    );
    assert!(m.idle(&key(0, 5)));
    // A rendezvous binds it too, and a message of another call fails it.
    m.post_any(COMM, 5, &members, recv(4, 8));
    let rts = Arrival::Rts {
        msg_id: 1,
        len: 100,
        pull: None,
    };
    assert!(matches!(
        m.arrive(key(0, 5), [9; 2], rts, never),
        Matched::Mismatch {
            id: 4,
            refuse: Some(1),
            ..
        }
    ));
    assert_eq!(m.take_bound(), Some((4, 0)));
}

#[test]
fn a_wildcard_takes_the_held_message_of_its_members_that_arrived_first() {
    let mut m = Matching::default();
    let Matched::Held { uid: from2 } = m.arrive(key(2, 5), [0; 2], eager(2), never) else {
        panic!("held");
    };
    let Matched::Held { uid: from1 } = m.arrive(key(1, 5), [0; 2], eager(1), never) else {
        panic!("held");
    };
    land(&mut m, from1, &[1]);
    assert!(m.has_unexpected_any(COMM, 5, &[0, 1]));
    assert!(!m.has_unexpected_any(COMM, 5, &[0]));
    // Rank 2 is no member of this one's communicator: it takes rank 1's message.
    assert_eq!(
        m.post_any(COMM, 5, &[0, 1], recv(1, 8)),
        Matched::Deliver {
            id: 1,
            data: vec![1]
        }
    );
    assert_eq!(m.take_bound(), Some((1, 1)));
    // Rank 2's is still arriving: claimed, bound, and delivered once in.
    assert_eq!(
        m.post_any(COMM, 5, &[0, 1, 2], recv(2, 8)),
        Matched::Claimed { id: 2 }
    );
    assert_eq!(m.take_bound(), Some((2, 2)));
    assert_eq!(
        land(&mut m, from2, &[2, 2]),
        Some(Matched::Deliver {
            id: 2,
            data: vec![2, 2]
        })
    );
    // A wildcard taken back (timed out) leaves its queue.
    m.post_any(COMM, 5, &[0, 1, 2], recv(3, 8));
    assert_eq!(m.waiting_any(), vec![3]);
    m.withdraw(&key(usize::MAX, 5), 3);
    assert!(m.waiting_any().is_empty());
    assert!(m.idle(&key(0, 5)));
}

/// One step of a random interleaving at one rank: a receive posted (from one peer, or from
/// any), a message's header arriving, or the rest of an eager message's payload arriving.
#[derive(Debug, Clone)]
enum Event {
    Post {
        peer: usize,
        tag: u32,
        cap: usize,
    },
    PostAny {
        tag: u32,
        cap: usize,
    },
    Arrive {
        peer: usize,
        tag: u32,
        len: usize,
        rts: bool,
    },
    Land(usize),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (0..2usize, 0..2u32, 0..40usize).prop_map(|(peer, tag, cap)| Event::Post {
            peer,
            tag,
            cap
        }),
        (0..2u32, 0..40usize).prop_map(|(tag, cap)| Event::PostAny { tag, cap }),
        (0..2usize, 0..2u32, 0..40usize, any::<bool>()).prop_map(|(peer, tag, len, rts)| {
            Event::Arrive {
                peer,
                tag,
                len,
                rts,
            }
        }),
        (0..8usize).prop_map(Event::Land),
    ]
}

/// What a receive got: the bytes of its message, or the length that truncated it.
type Got = (OpId, std::result::Result<Vec<u8>, usize>);

/// The simple model of MPI matching: posted receives in posting order, held messages in
/// arrival order; a message goes to the first posted receive that accepts it, a receive takes
/// the first held message it accepts. Returns `(receive, message)` pairs.
fn model(events: &[Event]) -> Vec<(OpId, usize)> {
    // (receive, peer or any, tag) and (message, peer, tag).
    let mut posted: Vec<(OpId, Option<usize>, u32)> = Vec::new();
    let mut held: Vec<(usize, usize, u32)> = Vec::new();
    let mut pairs = Vec::new();
    let (mut next_id, mut next_msg) = (1, 0);
    for e in events {
        match *e {
            Event::Post { tag, .. } | Event::PostAny { tag, .. } => {
                let from = match *e {
                    Event::Post { peer, .. } => Some(peer),
                    _ => None,
                };
                match held
                    .iter()
                    .position(|&(_, p, t)| t == tag && from.is_none_or(|f| f == p))
                {
                    Some(j) => pairs.push((next_id, held.remove(j).0)),
                    None => posted.push((next_id, from, tag)),
                }
                next_id += 1;
            }
            Event::Arrive { peer, tag, .. } => {
                match posted
                    .iter()
                    .position(|&(_, f, t)| t == tag && f.is_none_or(|f| f == peer))
                {
                    Some(j) => pairs.push((posted.remove(j).0, next_msg)),
                    None => held.push((next_msg, peer, tag)),
                }
                next_msg += 1;
            }
            Event::Land(_) => {}
        }
    }
    pairs
}

proptest! {
    /// Random interleavings of specific and wildcard receives, eager and rendezvous arrivals
    /// and payloads against the model: each receive gets the message the model pairs it
    /// with, with its bytes, truncated when an eager message is longer than the receive; a
    /// wildcard is bound to its message's sender; the rest wait.
    #[test]
    fn matching_follows_the_model_for_any_interleaving(
        events in proptest::collection::vec(event(), 0..60)
    ) {
        let mut m = Matching::default();
        // Messages in arrival order: (peer, len, rendezvous); receives: (id, cap).
        let mut msgs: Vec<(usize, usize, bool)> = Vec::new();
        let mut caps: Vec<(OpId, usize)> = Vec::new();
        // Eager payloads still arriving: (uid, message index).
        let mut arriving: Vec<(u64, usize)> = Vec::new();
        let mut got: Vec<Got> = Vec::new();
        let mut bound: Vec<(OpId, usize)> = Vec::new();
        let payload = |i: usize, len: usize| bytes(len, i as u8);
        // Rendezvous message ids are message indices.
        let record = |r: Matched, got: &mut Vec<Got>, arrival: Option<usize>| match r {
            Matched::Eager { id, len } => {
                got.push((id, Ok(payload(arrival.expect("an arrival"), len))));
            }
            Matched::Deliver { id, data } => got.push((id, Ok(data))),
            Matched::Truncated { id, len } => got.push((id, Err(len))),
            Matched::Rts { id, msg_id, len, .. } => {
                got.push((id, Ok(payload(msg_id as usize, len))));
            }
            Matched::Held { .. } | Matched::Claimed { .. } | Matched::Queued => {}
            other => panic!("unexpected {other:?}"),
        };
        let mut next_id: OpId = 1;
        for e in &events {
            match *e {
                Event::Post { peer, tag, cap } => {
                    caps.push((next_id, cap));
                    let r = m.post(key(peer, tag), recv(next_id, cap));
                    next_id += 1;
                    record(r, &mut got, None);
                }
                Event::PostAny { tag, cap } => {
                    caps.push((next_id, cap));
                    let r = m.post_any(COMM, tag, &[0, 1], recv(next_id, cap));
                    next_id += 1;
                    record(r, &mut got, None);
                }
                Event::Arrive { peer, tag, len, rts } => {
                    let i = msgs.len();
                    msgs.push((peer, len, rts));
                    let what = if rts {
                        Arrival::Rts { msg_id: i as u64, len, pull: None }
                    } else {
                        eager(len)
                    };
                    let r = m.arrive(key(peer, tag), [0; 2], what, never);
                    if let (Matched::Held { uid }, false) = (&r, rts) {
                        arriving.push((*uid, i));
                    }
                    record(r, &mut got, Some(i));
                }
                Event::Land(j) if !arriving.is_empty() => {
                    let (uid, i) = arriving.remove(j % arriving.len());
                    if let Some(r) = land(&mut m, uid, &payload(i, msgs[i].1)) {
                        record(r, &mut got, None);
                    }
                }
                Event::Land(_) => {}
            }
            bound.extend(m.take_bound());
        }
        for (uid, i) in arriving.drain(..) {
            if let Some(r) = land(&mut m, uid, &payload(i, msgs[i].1)) {
                record(r, &mut got, None);
            }
        }
        let pairs = model(&events);
        let mut expected: Vec<Got> = pairs
            .iter()
            .map(|&(id, i)| {
                let (_, len, rts) = msgs[i];
                let cap = caps.iter().find(|c| c.0 == id).expect("a receive").1;
                // A rendezvous is matched whatever its length: truncation is its own.
                (id, if len > cap && !rts { Err(len) } else { Ok(payload(i, len)) })
            })
            .collect();
        got.sort_by_key(|g| g.0);
        expected.sort_by_key(|e| e.0);
        prop_assert_eq!(got, expected);
        // Every wildcard that matched was bound to its message's sender, and no other.
        let wild: Vec<OpId> = {
            let mut id = 0;
            events
                .iter()
                .filter_map(|e| match e {
                    Event::Post { .. } => { id += 1; None }
                    Event::PostAny { .. } => { id += 1; Some(id) }
                    _ => None,
                })
                .collect()
        };
        let mut want: Vec<(OpId, usize)> = pairs
            .iter()
            .filter(|(id, _)| wild.contains(id))
            .map(|&(id, i)| (id, msgs[i].0))
            .collect();
        want.sort_unstable();
        bound.sort_unstable();
        prop_assert_eq!(bound, want);
    }
}

#[test]
fn a_rendezvous_of_another_call_is_refused_and_fails_the_receive_on_the_other_machine() {
    let mut p = Pair::new();
    let s = p.send(0, 1, bytes(100, 1), Route::Stream);
    // Rank 1 calls something else with this tag.
    let n = &mut p.nodes[1];
    let t = target(0, 1, [7; 2]);
    n.recvs.push((50, t, vec![0; 100]));
    let m = n.matching.post(
        t.key(),
        Recv {
            id: 50,
            sig: [7; 2],
            cap: 100,
        },
    );
    assert_eq!(m, Matched::Queued);
    p.run();
    assert_eq!(p.nodes[1].outcome(50), Some(Err("mismatch")));
    // The refusal completes the sender without any data sent.
    assert_eq!(p.nodes[0].outcome(s), Some(Ok(100)));
    assert!(p.wire.iter().all(VecDeque::is_empty));
}

#[test]
fn a_message_of_another_call_fails_both_machines_calls_through_the_abort_it_draws() {
    let (a, b) = ([1, 1], [2, 2]);
    let mut p = Pair::new();
    // The two ranks make different calls with tag 4; rank 0 waits for a message of its own.
    p.nodes[0].calls.begin(COMM, 4, a).expect("rank 0's call");
    p.nodes[1].calls.begin(COMM, 4, b).expect("rank 1's call");
    let r0 = p.recv_sig(0, 4, a, 64, None);
    // Its message reaches rank 1 before rank 1 posts anything: foreign, not kept.
    let eager = p.send_sig(0, 4, a, bytes(8, 1), Route::Stream);
    let rndv = p.send_sig(0, 4, a, bytes(100, 2), Route::Stream);
    p.run();
    let n1 = &p.nodes[1];
    assert!(
        n1.matching.idle(&key(0, 4)),
        "nothing of the other call is held"
    );
    assert_eq!(n1.failed_calls.len(), 2, "each message fails the call");
    assert!(matches!(
        n1.failed_calls[0],
        ((COMM, 4), Error::Mismatch(_))
    ));
    // The rendezvous was refused: the sender completes without sending data.
    assert_eq!(p.nodes[0].outcome(eager), Some(Ok(8)));
    assert_eq!(p.nodes[0].outcome(rndv), Some(Ok(100)));
    // Rank 1's aborts reached rank 0: its call fails too, as a mismatch naming rank 1.
    assert_eq!(p.nodes[0].outcome(r0), Some(Err("aborted")));
    let (call, err) = &p.nodes[0].failed_calls[0];
    assert_eq!(*call, (COMM, 4));
    assert!(matches!(err, Error::Mismatch(_)), "{err:?}");
    assert_eq!(err.peer().and_then(|r| r.world), Some(1));
    assert!(p.nodes[0].calls.is_aborted(COMM, 4));
    assert!(p.wire.iter().all(VecDeque::is_empty));
}

#[test]
fn an_ask_is_answered_with_the_number_of_calls_entered() {
    let mut p = Pair::new();
    // Rank 0 entered calls 0..=4 of COMM (4 last), and none of another communicator.
    let counter = Arc::new(std::sync::atomic::AtomicU32::new(5));
    p.nodes[0]
        .calls
        .track_entered(COMM, &counter, vec![0, 1].into());
    p.wire[0].push_back((entered_frame(COMM, true, 0), Vec::new()));
    p.wire[0].push_back((entered_frame(COMM + 1, true, 0), Vec::new()));
    p.run();
    assert_eq!(p.nodes[1].calls.take_answer(COMM, 0), Some(5));
    assert_eq!(p.nodes[1].calls.take_answer(COMM + 1, 0), Some(0));
    // Taken once.
    assert_eq!(p.nodes[1].calls.take_answer(COMM, 0), None);
    assert!(p.wire.iter().all(VecDeque::is_empty));
    // A communicator that is gone counts nothing.
    drop(counter);
    assert_eq!(p.nodes[0].calls.entered(COMM), 0);
}

#[test]
fn an_abort_naming_a_lost_rank_fails_the_call_there_and_a_communicator_abort_every_call() {
    let sig = [3, 3];
    let mut p = Pair::new();
    p.nodes[1].calls.begin(COMM, 9, sig).expect("rank 1's call");
    let r = p.recv_sig(1, 9, sig, 16, None);
    // Rank 0 abandons the call saying it lost world rank 1, the receiver itself, which it
    // cannot have lost: the call fails as aborted, with no rank named lost.
    p.wire[1].push_back((abort_frame(COMM, 9, sig, false, Some(1)), Vec::new()));
    p.run();
    assert_eq!(p.nodes[1].outcome(r), Some(Err("aborted")));
    let (_, err) = &p.nodes[1].failed_calls[0];
    assert!(matches!(err, Error::Aborted(_)), "{err:?}");
    assert_eq!(p.nodes[1].calls.last_lost(), None);
    // A communicator abort fails later calls on that communicator before they start.
    p.wire[1].push_back((comm_abort_frame([COMM, 0, 0], None), Vec::new()));
    p.run();
    assert!(matches!(
        p.nodes[1].calls.begin(COMM, 10, sig),
        Err(Error::Aborted(_))
    ));
    p.nodes[1]
        .calls
        .begin(COMM + 1, 1, sig)
        .expect("another communicator");
}

#[test]
fn a_goodbye_comes_after_the_data_sent_before_it_and_a_wake_up_does_nothing() {
    let mut p = Pair::new();
    let data = bytes(6, 9);
    p.send(0, 1, data.clone(), Route::Stream);
    p.wire[1].push_back((FrameHeader::new(FrameKind::Wake), Vec::new()));
    p.wire[1].push_back((FrameHeader::new(FrameKind::Close), Vec::new()));
    p.step(1).expect("the message");
    p.step(1).expect("the wake-up");
    assert!(!p.nodes[1].peer_closed, "the goodbye is still in flight");
    assert!(p.nodes[1].matching.has_unexpected(&key(0, 1)));
    p.step(1).expect("the goodbye");
    assert!(p.nodes[1].peer_closed);
    // What came before the goodbye is still received.
    let r = p.recv(1, 1, 8, None);
    assert_eq!(p.nodes[1].outcome(r), Some(Ok(6)));
    assert_eq!(p.nodes[1].recv_buf(r).expect("r")[..6], data[..]);
}

#[test]
fn after_a_revoke_the_communicators_messages_of_its_epoch_are_dropped_and_counted() {
    let mut p = Pair::new();
    let r = p.recv(1, 1, 8, None);
    p.wire[1].push_back((
        super::revoke::revoke_frame([COMM, COMM + 1, COMM + 2], 0, 0),
        Vec::new(),
    ));
    p.step(1).expect("the revoke");
    assert!(matches!(
        p.nodes[1].calls.aborted_comm(COMM),
        Some(Error::Revoked(_))
    ));
    // The receive posted before was failed by the engine's abort of the communicator; a
    // message sent after (a rank that was stopped) goes nowhere and is counted.
    p.send(0, 1, bytes(8, 1), Route::Stream);
    p.step(1).expect("the late message");
    assert_eq!(p.nodes[1].stale, 1);
    assert!(!p.nodes[1].matching.has_unexpected(&key(0, 1)));
    assert_eq!(p.nodes[1].outcome(r), None, "dropped, not delivered");
}

#[test]
fn dispatch_answers_each_frame_kind_with_its_step_and_its_payloads_destination() {
    let mut m = Matching::default();
    let mut r = Rendezvous::new(LIMITS, 4);
    let calls = Calls::new(|sig| format!("call {sig:?}"), Arc::default());
    let mut proto = Protocol {
        matching: &mut m,
        rndv: &mut r,
        calls: &calls,
        me: 0,
        size: 4,
    };
    let frame = |kind, tag, len| {
        let mut h = FrameHeader::new(kind);
        (h.comm, h.tag, h.len) = (COMM, tag, len);
        h
    };
    // An eager message nobody waits for is held, its payload into the held message.
    let step = proto
        .on_header(1, &frame(FrameKind::Eager, 1, 5))
        .expect("eager");
    let Step::Message {
        matched: Matched::Held { uid },
        eager: true,
        foreign: false,
        refuse: None,
        bound: None,
    } = step
    else {
        panic!("held: {step:?}");
    };
    assert!(matches!(step.dest(), Some(Dest::Unexpected(u)) if u == uid));
    // A request to send has no payload.
    let mut rts = frame(FrameKind::Rts, 2, 500);
    rts.msg_id = 3;
    let step = proto.on_header(1, &rts).expect("rts");
    assert!(matches!(step, Step::Message { eager: false, .. }));
    assert!(step.dest().is_none());
    // An abort names the lost rank only if it is another rank of the world.
    for (lost, named) in [
        (Some(2), Some(2)),
        (Some(0), None),
        (Some(4), None),
        (None, None),
    ] {
        let step = proto
            .on_header(1, &abort_frame(COMM, 1, [0; 2], true, lost))
            .expect("abort");
        let Step::Abandoned { abandoned, .. } = step else {
            panic!("abandoned: {step:?}");
        };
        assert_eq!(
            (abandoned.peer, abandoned.lost, abandoned.mismatch),
            (1, named, true)
        );
    }
    assert_eq!(
        proto.on_header(1, &comm_abort_frame([COMM, 5, 6], None)),
        Ok(Step::CommAborted([COMM, 5, 6], None))
    );
    assert_eq!(
        proto.on_header(1, &comm_abort_frame([COMM, 5, 6], Some(0))),
        Ok(Step::CommAborted([COMM, 5, 6], Some(0)))
    );
    // Data of no rendezvous, or a CTS of no send, break the protocol.
    assert!(proto.on_header(1, &frame(FrameKind::Data, 0, 4)).is_err());
    assert!(proto.on_header(1, &frame(FrameKind::Cts, 0, 0)).is_err());
}

proptest! {
    /// Two machines: rank 0 sends messages of any size (eager or rendezvous) on two tags
    /// while rank 1 posts receives and frames travel, in any interleaving; in the end every
    /// receive holds the bytes of the message its tag's order gives it, and every operation
    /// completed.
    #[test]
    fn every_message_reaches_its_receive_through_the_pair_in_any_interleaving(
        steps in proptest::collection::vec((0..4u8, 0..2u32, 0..100usize), 0..40)
    ) {
        let mut p = Pair::new();
        let mut sent: Vec<(u32, Vec<u8>, OpId)> = Vec::new();
        let mut posted: Vec<(u32, OpId)> = Vec::new();
        for (i, &(what, tag, len)) in steps.iter().enumerate() {
            match what {
                0 => {
                    let data = bytes(len, i as u8);
                    let id = p.send(0, tag, data.clone(), Route::Stream);
                    sent.push((tag, data, id));
                }
                1 => posted.push((tag, p.recv(1, tag, 100, None))),
                2 => { p.step(1).expect("rank 1 reads"); }
                _ => { p.step(0).expect("rank 0 reads"); }
            }
        }
        // Every message gets a receive, then everything in flight is delivered.
        for tag in 0..2 {
            let n_sent = sent.iter().filter(|s| s.0 == tag).count();
            let n_posted = posted.iter().filter(|r| r.0 == tag).count();
            for _ in n_posted..n_sent {
                posted.push((tag, p.recv(1, tag, 100, None)));
            }
        }
        p.run();
        for tag in 0..2 {
            let msgs = sent.iter().filter(|s| s.0 == tag);
            let recvs = posted.iter().filter(|r| r.0 == tag);
            for ((_, data, sid), &(_, rid)) in msgs.zip(recvs) {
                prop_assert_eq!(p.nodes[0].outcome(*sid), Some(Ok(data.len())));
                prop_assert_eq!(p.nodes[1].outcome(rid), Some(Ok(data.len())));
                let buf = p.nodes[1].recv_buf(rid).expect("a receive");
                prop_assert_eq!(&buf[..data.len()], &data[..]);
            }
        }
    }
}
