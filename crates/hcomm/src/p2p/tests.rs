//! Tests of the engine in one process: two engines of a world of two ranks, linked by a real
//! TCP connection over loopback, made on demand, or by real shared-memory inboxes.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{Deadline, Engine, EngineConfig, OpId, ShmSetup, Target};
use crate::bootstrap::auth::Secret;
use crate::error::{Error, Operation, PeerRank};
use crate::transport::shm::cma::CmaMode;
use crate::transport::shm::link::{Inbox, LinkConfig};
use crate::transport::tcp::MeshConfig;

/// Largest eager message of these engines: larger ones take the rendezvous.
const EAGER: usize = 1024;
/// Bound of every wait of these tests.
pub(super) const WAIT: Duration = Duration::from_secs(20);
/// The communicator id of these tests' messages.
const COMM: u64 = 7;

fn config(rank: usize) -> EngineConfig {
    EngineConfig {
        rank,
        run_fd: None,
        eager_limit: EAGER,
        chunk: 4096,
        spin: Duration::ZERO,
        shm_eager_limit: 0,
        shm_push_threshold: 0,
        shm_chunk: 1,
        shm_split_threshold: usize::MAX,
        describe: |sig| format!("call {sig:?}"),
        timeout: WAIT,
        debug: false,
    }
}

/// The engines of a world of `n` ranks in this process, each listening on loopback, with
/// `streams` connections per pair once a pair is used.
pub(super) fn world(n: usize, streams: usize) -> Vec<Engine> {
    world_with(n, streams, None)
}

/// [`world`] with `HCOMM_FAILOVER` set to `failover`.
fn world_with(n: usize, streams: usize, failover: Option<bool>) -> Vec<Engine> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("listen on loopback"))
        .collect();
    let addrs: Vec<_> = listeners
        .iter()
        .map(|l| vec![l.local_addr().expect("listener address")])
        .collect();
    listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let mesh = MeshConfig {
                listener,
                rank,
                addrs: addrs.clone(),
                streams,
                secret: Secret::new(b"engine tests".to_vec()),
                timeout: WAIT,
                failover,
                link_timeout: WAIT,
                congestion: None,
            };
            Engine::new(n, Some(mesh), None, None, config(rank)).expect("an engine")
        })
        .collect()
}

/// Ranks 0 and 1 of a world of two, one stream between them.
pub(super) fn pair() -> (Engine, Engine) {
    let mut w = world(2, 1);
    let e1 = w.pop().expect("two engines");
    let e0 = w.pop().expect("two engines");
    (e0, e1)
}

pub(super) fn target(peer: usize, tag: u32, sig: [u64; 2]) -> Target {
    Target {
        comm: COMM,
        peer,
        comm_rank: peer,
        tag,
        sig,
        seq: 0,
        epoch: 0,
    }
}

/// A nonblocking send: the engine's background thread progresses it while the test waits for
/// the other engine.
fn send(e: &Engine, t: Target, data: &[u8]) -> OpId {
    // SAFETY: every test keeps `data` alive and unchanged until it has waited for the send.
    unsafe { e.post_send(t, data.as_ptr(), data.len(), true) }.expect("post a send")
}

fn recv(e: &Engine, t: Target, buf: &mut [u8]) -> OpId {
    // SAFETY: every test keeps `buf` alive and untouched until it has waited for the receive.
    unsafe { e.post_recv(t, buf.as_mut_ptr(), buf.len(), false) }.expect("post a receive")
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn messages_of_one_tag_match_in_order_and_tags_do_not_block_each_other() {
    let (e0, e1) = pair();
    let msgs = [bytes(10, 1), bytes(3 * EAGER, 2), bytes(EAGER, 3)];
    let other = bytes(5 * EAGER, 4);
    let sends: Vec<OpId> = msgs
        .iter()
        .map(|m| send(&e0, target(1, 5, [0; 2]), m))
        .chain([send(&e0, target(1, 6, [0; 2]), &other)])
        .collect();
    // Tag 6 first: it was sent last, behind a rendezvous of tag 5 that nobody receives yet.
    let mut got_other = vec![0u8; other.len()];
    let id = recv(&e1, target(0, 6, [0; 2]), &mut got_other);
    assert_eq!(
        e1.wait(id, Deadline::After(WAIT)).expect("tag 6"),
        other.len()
    );
    assert_eq!(got_other, other);
    let mut bufs: Vec<Vec<u8>> = msgs.iter().map(|m| vec![0u8; m.len() + 7]).collect();
    let ids: Vec<OpId> = bufs
        .iter_mut()
        .map(|b| recv(&e1, target(0, 5, [0; 2]), b))
        .collect();
    for ((id, buf), m) in ids.into_iter().zip(&bufs).zip(&msgs) {
        assert_eq!(e1.wait(id, Deadline::After(WAIT)).expect("tag 5"), m.len());
        assert_eq!(&buf[..m.len()], &m[..]);
    }
    for id in sends {
        e0.wait(id, Deadline::After(WAIT)).expect("send");
    }
}

/// A pair that can fail over (records, acknowledgements, frames kept until acknowledged)
/// delivers messages of every protocol both ways, in order per tag, and every send
/// completes: data sends only once acknowledged, so a window of them finishing proves the
/// acknowledgements flow.
#[test]
fn a_pair_ready_to_fail_over_delivers_everything_in_order_both_ways() {
    let mut w = world_with(2, 3, Some(true));
    let e1 = w.pop().expect("two engines");
    let e0 = w.pop().expect("two engines");
    let sizes = [0, 1, 100, EAGER, EAGER + 1, 3 * EAGER + 17, 1 << 20, 5];
    for round in 0..3u8 {
        let msgs: Vec<Vec<u8>> = sizes.iter().map(|&n| bytes(n, round)).collect();
        let mut sends = Vec::new();
        for m in &msgs {
            sends.push((&e0, send(&e0, target(1, 7, [0; 2]), m)));
            sends.push((&e1, send(&e1, target(0, 7, [0; 2]), m)));
        }
        for (e, peer) in [(&e1, 0), (&e0, 1)] {
            let mut bufs: Vec<Vec<u8>> = msgs.iter().map(|m| vec![0u8; m.len()]).collect();
            let ids: Vec<OpId> = bufs
                .iter_mut()
                .map(|b| recv(e, target(peer, 7, [0; 2]), b))
                .collect();
            for (id, m) in ids.into_iter().zip(&msgs) {
                assert_eq!(e.wait(id, Deadline::After(WAIT)).expect("receive"), m.len());
            }
            assert_eq!(bufs, msgs, "round {round}");
        }
        for (e, id) in sends {
            e.wait(id, Deadline::After(WAIT)).expect("send");
        }
    }
    for e in [&e0, &e1] {
        assert_eq!(e.protocol_stats().tcp_failovers, 0);
    }
}

#[test]
fn a_message_longer_than_the_receive_fails_it_eager_or_rendezvous() {
    let (e0, e1) = pair();
    for (seq, len) in [(3, EAGER), (4, 4 * EAGER)] {
        let data = bytes(len, 9);
        let s = send(&e0, target(1, 1, [0; 2]), &data);
        let mut small = vec![0u8; len - 1];
        // The receive is its communicator's receive number `seq`: its error says so.
        let t = Target {
            seq,
            ..target(0, 1, [0; 2])
        };
        let r = recv(&e1, t, &mut small);
        let got = e1.wait(r, Deadline::After(WAIT));
        assert!(
            matches!(got, Err(Error::Truncated(_))),
            "{len} bytes: {got:?}"
        );
        let op = got.err().and_then(|e| e.operation());
        assert_eq!(op, Some(Operation::seq("recv", seq)), "{len} bytes");
        e0.wait(s, Deadline::After(WAIT))
            .expect("the sender completes");
    }
}

#[test]
fn a_receive_of_another_call_fails_with_a_mismatch_on_both_ranks() {
    let (e0, e1) = pair();
    let (ours, theirs) = ([1, 2], [1, 3]);
    e0.begin_call(COMM, 4, theirs).expect("rank 0 begins");
    e1.begin_call(COMM, 4, ours).expect("rank 1 begins");
    let data = bytes(8, 0);
    let s = send(&e0, target(1, 4, theirs), &data);
    e0.wait(s, Deadline::After(WAIT))
        .expect("an eager send completes");
    let mut buf = [0u8; 8];
    let r = recv(&e1, target(0, 4, ours), &mut buf);
    let got = e1.wait(r, Deadline::After(WAIT));
    assert!(matches!(got, Err(Error::Mismatch(_))), "{got:?}");
    let world = |r: &Result<usize, Error>| r.as_ref().err().and_then(Error::peer)?.world;
    assert_eq!(world(&got), Some(0), "{got:?}");
    // Rank 0's call was over when the abort came: its next call on the communicator reports
    // it, once.
    let until = Instant::now() + WAIT;
    let late = loop {
        e0.check_peer(1).expect("the peer is there");
        if let Err(e) = e0.late_error(COMM) {
            break e;
        }
        assert!(
            Instant::now() < until,
            "rank 0 never learnt of the mismatch"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(matches!(late, Error::Mismatch(_)), "{late:?}");
    assert_eq!(late.peer().and_then(|p| p.world), Some(1), "{late:?}");
    assert!(e0.late_error(COMM).is_ok());
}

#[test]
fn a_wait_for_a_message_nobody_sends_times_out_and_leaves_nothing_behind() {
    let (e0, e1) = pair();
    let mut buf = [0u8; 4];
    let t = Target {
        seq: 3,
        ..target(0, 2, [0; 2])
    };
    let r = recv(&e1, t, &mut buf);
    let got = e1.wait(r, Deadline::After(Duration::from_millis(20)));
    let Err(e) = got else {
        panic!("the receive completed: {got:?}")
    };
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    assert_eq!(e.peer(), Some(PeerRank::ranks(0, 0)), "{e:?}");
    assert_eq!(e.operation(), Some(Operation::seq("recv", 3)), "{e:?}");
    // The timed-out receive is gone: a later message goes to the next receive.
    let data = bytes(4, 5);
    let s = send(&e0, target(1, 2, [0; 2]), &data);
    let mut again = [0u8; 4];
    let r = recv(&e1, target(0, 2, [0; 2]), &mut again);
    assert_eq!(
        e1.wait(r, Deadline::After(WAIT)).expect("the next receive"),
        4
    );
    assert_eq!(&again[..], &data[..]);
    e0.wait(s, Deadline::After(WAIT)).expect("send");
}

#[test]
fn a_peer_that_goes_away_fails_the_operations_waiting_for_it() {
    let (e0, e1) = pair();
    let mut buf = [0u8; 4];
    let r = recv(&e0, target(1, 3, [0; 2]), &mut buf);
    drop(e1);
    let got = e0.wait(r, Deadline::After(WAIT));
    let Err(e) = got else {
        panic!("the receive completed: {got:?}")
    };
    assert!(matches!(e, Error::PeerLost(_)), "{e:?}");
    assert_eq!(e.peer(), Some(PeerRank::ranks(1, 1)), "{e:?}");
    assert_eq!(e.operation().map(|o| o.name), Some("recv"), "{e:?}");
    let lost = e0.check_peer(1).unwrap_err();
    assert!(matches!(lost, Error::PeerLost(_)), "{lost:?}");
    assert_eq!(lost.peer(), Some(PeerRank::world(1)), "{lost:?}");
}

/// A finalizing rank does not wait for a peer that is still busy: its TCP link lingers only
/// until the peer's kernel has taken what was sent (the end included). What it sent before
/// is still received after it is gone, and the peer's own finalize is as quick.
#[test]
fn closing_does_not_wait_for_a_busy_peer_and_what_was_sent_still_arrives() {
    let (e0, e1) = pair();
    let data = bytes(EAGER, 9);
    let s = send(&e0, target(1, 4, [0; 2]), &data);
    e0.wait(s, Deadline::After(WAIT))
        .expect("an eager send completes at once");
    let start = Instant::now();
    let undelivered = e0.close(Instant::now() + WAIT);
    let took = start.elapsed();
    assert!(undelivered.is_empty(), "{undelivered:?}");
    // Waiting for the peer to close its side would take the whole linger (it never does here).
    assert!(took < super::LINGER, "closing took {took:?}");
    drop(e0);
    let mut buf = vec![0u8; EAGER];
    let r = recv(&e1, target(0, 4, [0; 2]), &mut buf);
    assert_eq!(e1.wait(r, Deadline::After(WAIT)).expect("receive"), EAGER);
    assert_eq!(buf, data);
    let start = Instant::now();
    assert!(e1.close(Instant::now() + WAIT).is_empty());
    assert!(start.elapsed() < super::LINGER, "{:?}", start.elapsed());
}

/// A receive from any member of the world of two.
fn recv_any(e: &Engine, tag: u32, buf: &mut [u8]) -> OpId {
    let members: std::sync::Arc<[usize]> = vec![0, 1].into();
    // SAFETY: every test keeps `buf` alive and untouched until it has waited for the receive.
    unsafe {
        e.post_recv_any(
            target(0, tag, [0; 2]),
            members,
            buf.as_mut_ptr(),
            buf.len(),
            false,
        )
    }
    .expect("post a receive from any source")
}

/// Waits for receive `id` and returns its length and sender.
fn got(e: &Engine, id: OpId) -> (usize, Option<usize>) {
    let len = e.wait(id, Deadline::After(WAIT)).expect("a receive");
    (len, e.take_source(id))
}

#[test]
fn wildcard_and_specific_receives_match_in_the_order_they_were_posted() {
    let (e0, e1) = pair();
    let msgs = [
        bytes(3 * EAGER, 1),
        bytes(20, 2),
        bytes(2 * EAGER, 3),
        bytes(5, 4),
    ];
    let mut bufs: Vec<Vec<u8>> = msgs.iter().map(|m| vec![0u8; m.len()]).collect();
    let mut it = bufs.iter_mut();
    // Posted: any, from 0, any, from 0 (all before anything arrives).
    let mut next = || it.next().expect("a buffer");
    let ids = [
        recv_any(&e1, 5, next()),
        recv(&e1, target(0, 5, [0; 2]), next()),
        recv_any(&e1, 5, next()),
        recv(&e1, target(0, 5, [0; 2]), next()),
    ];
    let sends: Vec<OpId> = msgs
        .iter()
        .map(|m| send(&e0, target(1, 5, [0; 2]), m))
        .collect();
    for (i, id) in ids.into_iter().enumerate() {
        let (len, source) = got(&e1, id);
        assert_eq!(len, msgs[i].len(), "receive {i}");
        // Only the wildcards tell a sender.
        assert_eq!(source, (i % 2 == 0).then_some(0), "receive {i}");
    }
    assert_eq!(bufs, msgs);
    for id in sends {
        e0.wait(id, Deadline::After(WAIT)).expect("send");
    }
}

#[test]
fn a_wildcard_takes_the_held_messages_in_the_order_they_arrived_from_every_peer() {
    let (e0, e1) = pair();
    let own_first = bytes(6, 1);
    let theirs = bytes(2 * EAGER, 2);
    let marker = bytes(1, 3);
    let own_last = bytes(9, 4);
    let s1 = send(&e1, target(1, 3, [0; 2]), &own_first);
    let s0 = send(&e0, target(1, 3, [0; 2]), &theirs);
    let m = send(&e0, target(1, 9, [0; 2]), &marker);
    // The marker came after rank 0's message on the same link: that one is held now.
    let mut mbuf = [0u8; 1];
    let r = recv(&e1, target(0, 9, [0; 2]), &mut mbuf);
    e1.wait(r, Deadline::After(WAIT)).expect("marker");
    let s2 = send(&e1, target(1, 3, [0; 2]), &own_last);
    let mut bufs = [
        vec![0u8; 2 * EAGER],
        vec![0u8; 2 * EAGER],
        vec![0u8; 2 * EAGER],
    ];
    let mut seen = Vec::new();
    for buf in &mut bufs {
        let id = recv_any(&e1, 3, buf);
        seen.push(got(&e1, id));
    }
    assert_eq!(
        seen,
        [
            (own_first.len(), Some(1)),
            (theirs.len(), Some(0)),
            (own_last.len(), Some(1))
        ]
    );
    assert_eq!(&bufs[1][..theirs.len()], &theirs[..]);
    for (s, e) in [(s1, &e1), (s0, &e0), (m, &e0), (s2, &e1)] {
        e.wait(s, Deadline::After(WAIT)).expect("send");
    }
}

#[test]
fn a_wildcard_times_out_naming_no_rank_and_a_longer_message_truncates_it() {
    let (e0, e1) = pair();
    let mut buf = [0u8; 4];
    let r = recv_any(&e1, 2, &mut buf);
    let late = e1.wait(r, Deadline::After(Duration::from_millis(20)));
    match late {
        Err(Error::Timeout(info)) => {
            assert_eq!(info.peer, None, "a wildcard names no peer: {info:?}");
            assert!(info.message.contains("any rank"), "{info:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(e1.take_source(r), None);
    // The timed-out receive is gone; a message longer than the next one truncates it, and
    // the sender is still known.
    let data = bytes(5, 5);
    let s = send(&e0, target(1, 2, [0; 2]), &data);
    let r = recv_any(&e1, 2, &mut buf);
    let res = e1.wait(r, Deadline::After(WAIT));
    assert!(matches!(res, Err(Error::Truncated(_))), "{res:?}");
    assert_eq!(e1.take_source(r), Some(0));
    e0.wait(s, Deadline::After(WAIT)).expect("send");
}

#[test]
fn a_lost_member_fails_a_pending_wildcard_but_its_held_message_is_still_received() {
    let (e0, e1) = pair();
    let data = bytes(7, 6);
    let s = send(&e1, target(0, 4, [0; 2]), &data);
    e1.wait(s, Deadline::After(WAIT))
        .expect("an eager send completes");
    // The message is in before rank 1 goes: the marker proves it.
    let marker = bytes(1, 0);
    let m = send(&e1, target(0, 8, [0; 2]), &marker);
    let mut mbuf = [0u8; 1];
    let r = recv(&e0, target(1, 8, [0; 2]), &mut mbuf);
    e0.wait(r, Deadline::After(WAIT)).expect("marker");
    e1.wait(m, Deadline::After(WAIT)).expect("marker sent");
    let mut pending = [0u8; 8];
    let p = recv_any(&e0, 5, &mut pending);
    drop(e1);
    let res = e0.wait(p, Deadline::After(WAIT));
    assert!(matches!(res, Err(Error::PeerLost(_))), "{res:?}");
    let mut buf = [0u8; 8];
    let r = recv_any(&e0, 4, &mut buf);
    assert_eq!(got(&e0, r), (data.len(), Some(1)));
    // SAFETY: nothing is posted: the call fails before it takes the buffer.
    let again = unsafe {
        e0.post_recv_any(
            target(0, 4, [0; 2]),
            vec![0, 1].into(),
            buf.as_mut_ptr(),
            8,
            false,
        )
    };
    assert!(matches!(again, Err(Error::PeerLost(_))), "{again:?}");
}

/// Both ranks send to each other first, at once, before either posts a receive: both dial,
/// the tie rule keeps one connection (two streams), and every message arrives, in order.
#[test]
fn two_ranks_sending_to_each_other_first_at_once_connect_once() {
    for round in 0..5 {
        let mut w = world(2, 2);
        let e1 = w.pop().expect("two engines");
        let e0 = w.pop().expect("two engines");
        let msgs: Vec<Vec<u8>> = (0..6)
            .map(|i| bytes(if i % 2 == 0 { 7 } else { 3 * EAGER }, i as u8))
            .collect();
        let (s0, s1): (Vec<OpId>, Vec<OpId>) = std::thread::scope(|s| {
            let a = s.spawn(|| {
                msgs.iter()
                    .map(|m| send(&e0, target(1, 1, [0; 2]), m))
                    .collect()
            });
            let b = s.spawn(|| {
                msgs.iter()
                    .map(|m| send(&e1, target(0, 1, [0; 2]), m))
                    .collect()
            });
            (a.join().expect("rank 0"), b.join().expect("rank 1"))
        });
        for (e, from) in [(&e0, 1), (&e1, 0)] {
            for (i, m) in msgs.iter().enumerate() {
                let mut buf = vec![0u8; m.len()];
                let r = recv(e, target(from, 1, [0; 2]), &mut buf);
                e.wait(r, Deadline::After(WAIT)).expect("a receive");
                assert_eq!(&buf, m, "round {round}: message {i} from rank {from}");
            }
        }
        for id in s0 {
            e0.wait(id, Deadline::After(WAIT)).expect("send of rank 0");
        }
        for id in s1 {
            e1.wait(id, Deadline::After(WAIT)).expect("send of rank 1");
        }
        let (a, b) = (e0.protocol_stats(), e1.protocol_stats());
        assert_eq!(
            (a.tcp_opened + b.tcp_opened, a.tcp_accepted + b.tcp_accepted),
            (2, 2),
            "round {round}: one pair of two streams, opened by one side: {a:?} {b:?}"
        );
        assert_eq!(a.tcp_opened, b.tcp_accepted, "round {round}");
    }
}

/// Eight ranks all send to all at once, each from its own thread: every pair connects once
/// (whichever side dials first, or both) and every message arrives.
#[test]
fn many_ranks_all_to_all_at_once_connect_every_pair_once() {
    const N: usize = 8;
    let w = world(N, 2);
    let payload = |from: usize, to: usize| {
        bytes(
            if (from + to) % 2 == 0 { 5 } else { 2 * EAGER },
            (from * N + to) as u8,
        )
    };
    std::thread::scope(|s| {
        for (rank, e) in w.iter().enumerate() {
            s.spawn(move || {
                let out: Vec<Vec<u8>> = (0..N).map(|to| payload(rank, to)).collect();
                let mut bufs: Vec<Vec<u8>> = (0..N)
                    .map(|from| vec![0u8; payload(from, rank).len()])
                    .collect();
                let sends: Vec<OpId> = (0..N)
                    .filter(|&to| to != rank)
                    .map(|to| send(e, target(to, 2, [0; 2]), &out[to]))
                    .collect();
                let recvs: Vec<OpId> = bufs
                    .iter_mut()
                    .enumerate()
                    .filter(|&(from, _)| from != rank)
                    .map(|(from, buf)| recv(e, target(from, 2, [0; 2]), buf))
                    .collect();
                for id in recvs.into_iter().chain(sends) {
                    e.wait(id, Deadline::After(WAIT))
                        .expect("an all-to-all message");
                }
                for (from, buf) in bufs.iter().enumerate().filter(|&(f, _)| f != rank) {
                    assert_eq!(buf, &payload(from, rank), "rank {rank} from {from}");
                }
            });
        }
    });
    let stats: Vec<_> = w.iter().map(Engine::protocol_stats).collect();
    for (rank, s) in stats.iter().enumerate() {
        assert_eq!(
            s.tcp_opened + s.tcp_accepted,
            2 * (N as u64 - 1),
            "rank {rank}: two streams with each peer: {s:?}"
        );
    }
    let opened: u64 = stats.iter().map(|s| s.tcp_opened).sum();
    assert_eq!(
        opened,
        (N * (N - 1)) as u64,
        "one pair of two streams each: {stats:?}"
    );
}

/// Ranks talk only to their ring neighbours: nobody connects to anyone else, and a rank
/// finalizes without waiting for the peers it never talked to.
#[test]
fn peers_never_talked_to_cost_no_connection_and_no_finalize_time() {
    const N: usize = 6;
    let w = world(N, 1);
    std::thread::scope(|s| {
        for (rank, e) in w.iter().enumerate() {
            s.spawn(move || {
                let data = bytes(16, rank as u8);
                let mut buf = [0u8; 16];
                let next = (rank + 1) % N;
                let prev = (rank + N - 1) % N;
                let sid = send(e, target(next, 3, [0; 2]), &data);
                let rid = recv(e, target(prev, 3, [0; 2]), &mut buf);
                e.wait(rid, Deadline::After(WAIT))
                    .expect("from the previous rank");
                e.wait(sid, Deadline::After(WAIT))
                    .expect("to the next rank");
                assert_eq!(&buf[..], &bytes(16, prev as u8)[..]);
            });
        }
    });
    for (rank, e) in w.iter().enumerate() {
        let s = e.protocol_stats();
        assert_eq!(
            s.tcp_opened + s.tcp_accepted,
            2,
            "rank {rank}: its two neighbours: {s:?}"
        );
    }
    // Everyone finalizes at once: each waits only for its two neighbours.
    let started = Instant::now();
    std::thread::scope(|s| {
        for e in &w {
            s.spawn(move || assert_eq!(e.close(Instant::now() + WAIT), Vec::<usize>::new()));
        }
    });
    assert!(started.elapsed() < WAIT / 2, "{:?}", started.elapsed());
}

/// A receive from a peer this rank never talked to, whose process is gone: connecting fails
/// at once (nothing listens there) and the receive fails naming the peer.
#[test]
fn a_wait_on_a_dead_peer_never_talked_to_fails_naming_it() {
    let (e0, e1) = pair();
    drop(e1);
    let mut buf = [0u8; 4];
    let started = Instant::now();
    let r = recv(&e0, target(1, 3, [0; 2]), &mut buf);
    let got = e0.wait(r, Deadline::After(WAIT));
    let Err(e) = got else {
        panic!("the receive completed: {got:?}")
    };
    assert!(matches!(e, Error::PeerLost(_)), "{e:?}");
    assert_eq!(e.peer(), Some(PeerRank::ranks(1, 1)), "{e:?}");
    assert!(e.to_string().contains("connecting to rank 1"), "{e}");
    assert!(started.elapsed() < WAIT / 4, "{:?}", started.elapsed());
}

/// Ranks 0 and 1 of a world of two on one host, linked by shared memory alone (the pair needs
/// no TCP connection: one process, so one pid and network namespace), with `HCOMM_TIMEOUT`
/// = `timeout` (it sets the watcher's heartbeats).
pub(super) fn shm_pair(timeout: Duration) -> (Engine, Engine) {
    static JOBS: AtomicUsize = AtomicUsize::new(0);
    let cfg = LinkConfig {
        job_id: format!(
            "t{}x{}",
            std::process::id(),
            JOBS.fetch_add(1, Ordering::Relaxed)
        ),
        ring_bytes: 1 << 16,
        cma: CmaMode::Off,
    };
    let inboxes: Vec<Inbox> = (0..2)
        .map(|r| Inbox::create(&cfg, r, 2, r).expect("an inbox"))
        .collect();
    let published: Vec<_> = inboxes.iter().map(Inbox::published).collect();
    let mut engines = inboxes.into_iter().enumerate().map(|(rank, inbox)| {
        let peer = 1 - rank;
        let link = inbox
            .link(peer, peer, &published[peer])
            .expect("a shared-memory link");
        assert!(link.end.is_some(), "one process: no TCP connection needed");
        let shm = ShmSetup {
            inbox,
            links: vec![(peer, link)],
        };
        let cfg = EngineConfig {
            timeout,
            ..config(rank)
        };
        Engine::new(2, None, Some(shm), None, cfg).expect("an engine")
    });
    let e0 = engines.next().expect("two engines");
    let e1 = engines.next().expect("two engines");
    (e0, e1)
}

/// A local peer that never sent to this rank finalizes without a goodbye through its ring: it
/// marks its inbox, and a receive waiting for it fails as a finalize (not a loss) once the
/// watcher looks; one that sent says goodbye through the ring, after its data.
#[test]
fn a_local_peer_finalizes_by_its_mark_or_by_a_goodbye_after_its_data() {
    for sends_first in [false, true] {
        let (e0, e1) = shm_pair(WAIT);
        let data = bytes(16, 9);
        let mut buf = [0u8; 16];
        if sends_first {
            let sid = send(&e1, target(0, 2, [0; 2]), &data);
            let rid = recv(&e0, target(1, 2, [0; 2]), &mut buf);
            e0.wait(rid, Deadline::After(WAIT)).expect("the message");
            e1.wait(sid, Deadline::After(WAIT)).expect("the send");
            assert_eq!(buf, data[..]);
        }
        let rid = recv(&e0, target(1, 3, [0; 2]), &mut buf);
        assert_eq!(e1.close(Instant::now() + WAIT), Vec::<usize>::new());
        {
            let st = super::lock(&e1.shared.state);
            assert_eq!(st.links.owes_goodbye(0), sends_first, "{sends_first}");
        }
        let got = e0.wait(rid, Deadline::After(WAIT));
        let Err(e) = got else {
            panic!("the receive completed: {got:?}")
        };
        assert!(matches!(e, Error::PeerLost(_)), "{sends_first}: {e:?}");
        assert!(
            e.to_string().contains("has finalized"),
            "{sends_first}: {e}"
        );
        let st = super::lock(&e0.shared.state);
        let peer = st.peers[1].as_ref().expect("peer 1");
        assert!(peer.closed, "{sends_first}: let go as finalized, not lost");
    }
}

/// A local peer that stops without finalizing (its engine gone, its watcher with it) set no
/// mark: a receive waiting for it fails as a loss, for want of heartbeats.
#[test]
fn a_local_peer_that_stops_without_finalizing_is_lost() {
    let (e0, e1) = shm_pair(Duration::from_millis(400));
    drop(e1);
    let mut buf = [0u8; 4];
    let rid = recv(&e0, target(1, 3, [0; 2]), &mut buf);
    let got = e0.wait(rid, Deadline::After(WAIT));
    let Err(e) = got else {
        panic!("the receive completed: {got:?}")
    };
    assert!(matches!(e, Error::PeerLost(_)), "{e:?}");
    assert!(e.to_string().contains("no heartbeat"), "{e}");
    let st = super::lock(&e0.shared.state);
    assert!(!st.peers[1].as_ref().expect("peer 1").closed);
}
