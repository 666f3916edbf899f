//! Receives from any source ([`Communicator::recv_any`], `irecv` with [`ANY_SOURCE`]) in jobs
//! of real processes (this test binary started again as each rank), over shared memory and
//! over TCP: several senders, interleaved tags, eager and rendezvous sizes, one sender's
//! messages in order, specific and wildcard receives matched in posting order, truncation,
//! a timeout, and a lost member.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hcomm::{Communicator, Error, Request, ANY_SOURCE};

/// Environment of a rank started by [`job`]: the scenario it runs.
const SCENARIO: &str = "HCOMM_ANY_SOURCE_TEST_SCENARIO";

/// Message sizes: eager on every transport, then rendezvous on every transport.
const SIZES: [usize; 4] = [24, 700, 300 << 10, 3 << 20];
/// Messages each rank sends per tag in [`many`].
const PER_TAG: usize = 6;

/// Message `seq` of rank `from` with `tag`, `len` bytes (at least 24): it names all three
/// in its first 24 bytes, then a pattern of them.
fn message(from: usize, tag: u32, seq: usize, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len)
        .map(|i| (i.wrapping_mul(13) ^ from.wrapping_mul(101) ^ seq ^ tag as usize) as u8)
        .collect();
    m[..8].copy_from_slice(&(from as u64).to_le_bytes());
    m[8..16].copy_from_slice(&u64::from(tag).to_le_bytes());
    m[16..24].copy_from_slice(&(seq as u64).to_le_bytes());
    m
}

/// The (sender, tag, sequence number) a message names, after checking all its bytes.
fn check(got: &[u8]) -> (usize, u32, usize) {
    let word =
        |i: usize| u64::from_le_bytes(got[i * 8..i * 8 + 8].try_into().expect("8 bytes")) as usize;
    let (from, tag, seq) = (word(0), word(1) as u32, word(2));
    assert_eq!(
        got,
        &message(from, tag, seq, got.len())[..],
        "message {from}/{tag}/{seq}"
    );
    (from, tag, seq)
}

fn size_of(seq: usize) -> usize {
    SIZES[seq % SIZES.len()]
}

/// Every rank (rank 0 too) sends `PER_TAG` messages to rank 0 on tags 1 and 2 alternately,
/// of every size; rank 0 receives tag 2 with blocking wildcards, then tag 1 with nonblocking
/// ones, and checks every sender's messages come whole and in order.
fn many(comm: &Communicator) {
    let n = comm.size();
    let mut sends: Vec<Request> = Vec::new();
    for seq in 0..PER_TAG {
        for tag in [1, 2] {
            let m = message(comm.rank(), tag, seq, size_of(seq));
            sends.push(comm.isend(m, 0, tag).expect("isend"));
        }
    }
    if comm.rank() == 0 {
        let mut next: HashMap<(usize, u32), usize> = HashMap::new();
        let mut note = |src: usize, got: &[u8], want_tag: u32| {
            let (from, tag, seq) = check(got);
            assert_eq!((from, tag), (src, want_tag), "the status names the sender");
            let expected = next.entry((from, tag)).or_insert(0);
            assert_eq!(
                seq, *expected,
                "rank {from}'s messages of tag {tag} in order"
            );
            *expected += 1;
        };
        let mut buf = vec![0u8; SIZES[3]];
        for _ in 0..n * PER_TAG {
            let s = comm.recv_any(&mut buf, 2).expect("recv_any");
            note(s.source, &buf[..s.len], 2);
        }
        let reqs: Vec<Request> = (0..n * PER_TAG)
            .map(|_| {
                comm.irecv(vec![0u8; SIZES[3]], ANY_SOURCE, 1)
                    .expect("irecv")
            })
            .collect();
        for done in hcomm::wait_all(reqs).expect("wildcard irecvs") {
            let src = done
                .source
                .expect("a wildcard's completion names the sender");
            note(src, &done.buffer[..done.len], 1);
        }
        assert_eq!(next.len(), 2 * n, "every sender, both tags");
        assert!(next.values().all(|&c| c == PER_TAG));
    }
    hcomm::wait_all(sends).expect("sends");
}

/// Rank 0 posts, before anything is sent: any, from rank 1, any, from rank 1 (tag 5); rank
/// 1 then sends four messages, which go to the receives in that order. Then a held message
/// longer than the wildcard's buffer truncates it (and is consumed).
fn ordered(comm: &Communicator) {
    if comm.rank() == 0 {
        let specific = || comm.irecv(vec![0u8; SIZES[3]], 1, 5).expect("irecv");
        let any = || {
            comm.irecv(vec![0u8; SIZES[3]], ANY_SOURCE, 5)
                .expect("irecv any")
        };
        let reqs = vec![any(), specific(), any(), specific()];
        comm.barrier().expect("barrier");
        for (seq, r) in reqs.into_iter().enumerate() {
            let done = r.wait().expect("receive");
            assert_eq!(
                check(&done.buffer[..done.len]),
                (1, 5, seq),
                "receive {seq}"
            );
            let want = (seq % 2 == 0).then_some(1);
            assert_eq!(done.source, want, "only wildcards report a sender");
        }
        comm.barrier().expect("barrier");
        let mut small = [0u8; 30];
        let e = comm.recv_any(&mut small, 6).expect_err("a longer message");
        assert!(matches!(e, Error::Truncated(_)), "{e}");
        let s = comm.recv_any(&mut small, 6).expect("the next one");
        assert_eq!((s.source, check(&small[..s.len])), (1, (1, 6, 1)));
    } else {
        comm.barrier().expect("barrier");
        if comm.rank() == 1 {
            for seq in 0..4 {
                comm.send(&message(1, 5, seq, size_of(3 - seq)), 0, 5)
                    .expect("send");
            }
            comm.send(&message(1, 6, 0, 4000), 0, 6).expect("send");
            comm.send(&message(1, 6, 1, 30), 0, 6).expect("send");
        }
        comm.barrier().expect("barrier");
    }
}

/// A wildcard nobody sends to times out within HCOMM_TIMEOUT (set to 2 s) while rank 1 is
/// alive (busy for 3 s; a member that finalized would fail the wildcard at once instead).
fn timeout(comm: &Communicator) {
    let mut buf = [0u8; 8];
    if comm.rank() == 0 {
        let start = Instant::now();
        let e = comm.recv_any(&mut buf, 9).expect_err("nobody sends");
        let took = start.elapsed();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
        assert!(e.to_string().contains("any rank"), "{e}");
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(20),
            "{took:?}"
        );
        comm.send(&buf, 1, 10).expect("done");
    } else {
        std::thread::sleep(Duration::from_secs(3));
        comm.recv(&mut buf, 0, 10).expect("done");
    }
}

/// Rank 2 of 3 dies (exits without finalizing) while rank 0 waits for a wildcard: the wait
/// fails with PeerLost naming it, well before the timeout; a specific receive from rank 1
/// still works, and a later wildcard on the communicator fails at once.
fn lost(comm: &Communicator) {
    comm.barrier().expect("barrier");
    match comm.rank() {
        0 => {
            let start = Instant::now();
            let mut buf = [0u8; 8];
            let e = comm.recv_any(&mut buf, 7).expect_err("a member is lost");
            assert!(matches!(e, Error::PeerLost(_)), "{e}");
            assert!(e.to_string().contains("rank 2"), "{e}");
            assert!(start.elapsed() < Duration::from_secs(20));
            comm.recv(&mut buf, 1, 8)
                .expect("a specific receive from a live rank");
            let e = comm.recv_any(&mut buf, 8).expect_err("a member is lost");
            assert!(matches!(e, Error::PeerLost(_)), "{e}");
            comm.send(&[1], 1, 9).expect("done");
        }
        1 => {
            std::thread::sleep(Duration::from_millis(500));
            comm.send(&[0u8; 8], 0, 8).expect("send");
            comm.recv(&mut [0u8; 1], 0, 9).expect("done");
        }
        _ => {
            println!("OK rank 2 leaves");
            std::thread::sleep(Duration::from_millis(200));
            // SAFETY: `_exit` ends the process at once, like a crash, without finalizing.
            unsafe { libc::_exit(0) };
        }
    }
}

/// The entry of a rank started by [`job`] (ignored in normal runs).
#[test]
#[ignore = "a rank of the jobs the other tests start"]
fn rank_of_a_job() {
    let comm = Communicator::init().expect("init");
    match std::env::var(SCENARIO).as_deref() {
        Ok("many") => many(&comm),
        Ok("ordered") => ordered(&comm),
        Ok("timeout") => timeout(&comm),
        Ok("lost") => lost(&comm),
        other => panic!("no scenario {other:?}"),
    }
    println!("OK {} on rank {}", comm.size(), comm.rank());
}

fn job(scenario: &str, n: usize, env: &[(&str, &str)]) {
    hcomm_testkit::job_ok(SCENARIO, scenario, n, env);
}

const TCP: &[(&str, &str)] = &[("HCOMM_TRANSPORT", "tcp")];

#[test]
fn wildcards_take_every_senders_messages_in_order_shm() {
    for n in [1, 4] {
        job("many", n, &[]);
    }
}

#[test]
fn wildcards_take_every_senders_messages_in_order_tcp() {
    job("many", 3, TCP);
}

#[test]
fn wildcard_and_specific_receives_match_in_posting_order() {
    job("ordered", 2, &[]);
    job("ordered", 3, TCP);
}

#[test]
fn a_wildcard_nobody_sends_to_times_out() {
    job("timeout", 2, &[("HCOMM_TIMEOUT", "2")]);
}

#[test]
fn a_lost_member_fails_a_pending_wildcard() {
    job("lost", 3, &[]);
    job("lost", 3, TCP);
}
