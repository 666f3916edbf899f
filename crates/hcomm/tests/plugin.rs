//! Transport plug-ins from Rust: a plug-in over Unix domain sockets carries all traffic of
//! jobs of real processes (this test binary started again as each rank) through links opened
//! on each pair's first use, and the failures a plug-in can meet (an unknown name, a failing
//! init, a dead peer, a send that blocks) end in clear errors within `HCOMM_TIMEOUT`, with
//! every thread of the plug-in gone afterwards. A plug-in that starts failing mid-run (its
//! sends fail, or its links die) falls back to TCP: the job goes on with exact results,
//! nothing lost, duplicated or reordered.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use hcomm::plugin::{self, Plugin};
use hcomm::{Communicator, Config, Error, ReduceOp, Result};
use hcomm_testkit::{free_port, self_job};

/// Environment of a rank started by [`job`]: the scenario it runs.
const SCENARIO: &str = "HCOMM_PLUGIN_TEST_SCENARIO";
/// Environment of a rank started by [`job`]: the directory of its sockets.
const DIR: &str = "HCOMM_PLUGIN_TEST_DIR";

fn err(what: impl std::fmt::Display) -> Error {
    Error::transport_failed(what.to_string())
}

/// A plug-in over Unix domain sockets in a directory: rank r listens at `dir/r`, connects to
/// every lower rank and accepts every higher one. It counts its calls and can be told to
/// block every send to one peer until it is finalized.
#[derive(Default)]
struct UnixSockets {
    dir: PathBuf,
    links: RwLock<Vec<Option<Arc<UnixStream>>>>,
    /// Sends to this peer block until `finalize`.
    stall_to: Option<usize>,
    /// A failed `recv` blocks until `finalize` (the plug-in does not notice dead peers).
    deaf: bool,
    /// Sends fail once this many went through (the plug-in's network went away); `cut`: a
    /// failing send also shuts its link down, so that the peer's receives fail too.
    fail_after: Option<usize>,
    cut: bool,
    finalized: Mutex<bool>,
    finalized_cv: Condvar,
    sends: AtomicUsize,
    recvs: AtomicUsize,
    active: AtomicUsize,
    finalizes: AtomicUsize,
}

impl UnixSockets {
    fn link(&self, peer: usize) -> Result<Arc<UnixStream>> {
        if *self.finalized.lock().unwrap() {
            return Err(err("finalized"));
        }
        self.links.read().unwrap()[peer]
            .clone()
            .ok_or_else(|| err(format!("no link to {peer}")))
    }

    fn until_finalized(&self) {
        let mut done = self.finalized.lock().unwrap();
        while !*done {
            done = self.finalized_cv.wait(done).unwrap();
        }
    }

    fn counted(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        self.active.fetch_add(1, Ordering::SeqCst);
        let r = f();
        self.active.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

impl Plugin for UnixSockets {
    fn init(&self, rank: usize, size: usize) -> Result<()> {
        let listener = UnixListener::bind(self.dir.join(rank.to_string())).map_err(err)?;
        let mut links = vec![None; size];
        let deadline = Instant::now() + Duration::from_secs(20);
        for (peer, link) in links.iter_mut().enumerate().take(rank) {
            let stream = loop {
                match UnixStream::connect(self.dir.join(peer.to_string())) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => return Err(err(format!("connecting to {peer}: {e}"))),
                }
            };
            (&stream)
                .write_all(&(rank as u32).to_le_bytes())
                .map_err(err)?;
            *link = Some(Arc::new(stream));
        }
        for _ in rank + 1..size {
            let (stream, _) = listener.accept().map_err(err)?;
            let mut who = [0u8; 4];
            (&stream).read_exact(&mut who).map_err(err)?;
            let peer = u32::from_le_bytes(who) as usize;
            links[peer] = Some(Arc::new(stream));
        }
        *self.links.write().unwrap() = links;
        Ok(())
    }

    fn send(&self, buf: &[u8], dest: usize) -> Result<()> {
        self.counted(|| {
            let link = self.link(dest)?;
            if self.stall_to == Some(dest) {
                self.until_finalized();
                return Err(err("finalized while stalled"));
            }
            let n = self.sends.fetch_add(1, Ordering::SeqCst);
            if self.fail_after.is_some_and(|limit| n >= limit) {
                if self.cut {
                    let _ = link.shutdown(std::net::Shutdown::Both);
                }
                return Err(err("the test network went away"));
            }
            (&*link).write_all(buf).map_err(err)
        })
    }

    fn recv(&self, buf: &mut [u8], src: usize) -> Result<()> {
        self.counted(|| {
            let link = self.link(src)?;
            self.recvs.fetch_add(1, Ordering::SeqCst);
            let got = (&*link).read_exact(buf).map_err(err);
            if got.is_err() && self.deaf {
                self.until_finalized();
            }
            got
        })
    }

    fn finalize(&self) -> Result<()> {
        self.finalizes.fetch_add(1, Ordering::SeqCst);
        *self.finalized.lock().unwrap() = true;
        self.finalized_cv.notify_all();
        for link in self.links.write().unwrap().drain(..).flatten() {
            let _ = link.shutdown(std::net::Shutdown::Both);
        }
        Ok(())
    }
}

/// Names of this process's threads that belong to plug-in links.
fn link_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| n.starts_with("hcomm-tx-") || n.starts_with("hcomm-rx-"))
        .collect()
}

/// Registers this rank's plug-in as "unix" and joins the job through it.
fn join(stall_to: Option<usize>, deaf: bool) -> (Arc<UnixSockets>, Communicator) {
    join_with(UnixSockets {
        stall_to,
        deaf,
        ..UnixSockets::default()
    })
}

/// Registers `sockets` (in the job's directory) as "unix" and joins the job through it.
fn join_with(sockets: UnixSockets) -> (Arc<UnixSockets>, Communicator) {
    let sockets = Arc::new(UnixSockets {
        dir: PathBuf::from(std::env::var(DIR).unwrap()),
        ..sockets
    });
    plugin::register("unix", sockets.clone()).unwrap();
    let comm = Communicator::init().unwrap();
    (sockets, comm)
}

/// After the world closed: the plug-in was finalized once, no call runs or came after, and
/// no thread of a link is left.
fn assert_wound_down(sockets: &UnixSockets) {
    assert_eq!(sockets.finalizes.load(Ordering::SeqCst), 1);
    assert_eq!(sockets.active.load(Ordering::SeqCst), 0);
    let threads = link_threads();
    assert!(threads.is_empty(), "threads left: {threads:?}");
}

/// Point-to-point of every protocol, collectives, split and nonblocking calls: everything
/// goes through the plug-in, nothing over TCP.
fn traffic() {
    let (sockets, comm) = join(None, false);
    let (rank, size) = (comm.rank(), comm.size());
    let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
    for len in [0, 1, 64 << 10, (64 << 10) + 1, 3 << 20] {
        let out: Vec<u8> = (0..len).map(|i| (i * 7 + rank) as u8).collect();
        let mut got = vec![0u8; len];
        let n = comm.sendrecv(&out, right, 5, &mut got, left, 5).unwrap();
        assert_eq!(n, len);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i * 7 + left) as u8));
    }
    let send: Vec<f32> = (0..300_000).map(|i| (i % 13 + rank) as f32).collect();
    let mut sum = vec![0f32; send.len()];
    comm.allreduce(&send, &mut sum, ReduceOp::Sum).unwrap();
    let ranks: usize = (0..size).sum();
    assert!(sum
        .iter()
        .enumerate()
        .all(|(i, &v)| v == ((i % 13) * size + ranks) as f32));
    let half = comm.split((rank % 2) as i32, rank as i32).unwrap().unwrap();
    let mut b = [rank as u64];
    half.broadcast(&mut b, 0).unwrap();
    assert_eq!(b[0], (rank % 2) as u64);
    let req = comm.irecv(vec![0u8; 100], left, 9).unwrap();
    comm.send(b"nonblocking", right, 9).unwrap();
    assert_eq!(req.wait().unwrap().len, 11);
    // Nobody has left yet: every link has its two threads.
    assert_eq!(link_threads().len(), 2 * (size - 1));
    comm.barrier().unwrap();
    let s = comm.protocol_stats();
    assert!(s.plugin_eager > 0 && s.plugin_rendezvous > 0, "{s:?}");
    assert_eq!(
        (
            s.tcp_eager,
            s.tcp_rendezvous,
            s.shm_eager,
            s.shm_pull,
            s.shm_push
        ),
        (0, 0, 0, 0, 0),
        "{s:?}"
    );
    assert!(sockets.sends.load(Ordering::SeqCst) > 0 && sockets.recvs.load(Ordering::SeqCst) > 0);
    drop((half, comm));
    assert_wound_down(&sockets);
    println!("OK traffic on rank {rank}");
}

/// Rank 1 dies; rank 0, waiting for it, learns at once: from its plug-in, which sees the
/// socket end, or (`deaf`: a plug-in that does not) from the end of the TCP connection, a
/// grace period later; or, when the pair's TCP connection (made on its first use, the
/// barrier, while the barrier's frames go through the plug-in) was not up yet, from the dial:
/// it finds nothing listening there any more, or the connection ends in its handshake; or
/// from the end of the TCP link the plug-in fell back to.
fn lost(deaf: bool) {
    let (sockets, comm) = join(None, deaf);
    comm.barrier().unwrap();
    if comm.rank() == 1 {
        std::process::exit(3);
    }
    let started = Instant::now();
    let e = comm.recv(&mut [0u8; 4], 1, 1).unwrap_err();
    assert!(
        matches!(e, Error::PeerLost(_)) && e.peer().and_then(|p| p.world) == Some(1),
        "{e}"
    );
    let why = match deaf {
        true => "no goodbye came",
        false => "failed receiving from world rank 1",
    };
    let dial = "rank 0 connecting to rank 1";
    // With the TCP link behind the plug-in, a failed plug-in moves the traffic to TCP, whose
    // end then loses the peer.
    let behind = "no goodbye came through the TCP connection";
    assert!(
        [why, dial, behind]
            .iter()
            .any(|w| e.to_string().contains(w)),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{e}");
    drop(comm);
    assert_wound_down(&sockets);
    println!("OK lost: {e}");
}

/// Rank 0's plug-in blocks every send to rank 1: rank 0's send and rank 1's receive time out,
/// and closing (whose finalize unblocks the send) still ends every thread.
fn stuck() {
    let rank: usize = std::env::var("HCOMM_RANK").unwrap().parse().unwrap();
    let (sockets, comm) = join((rank == 0).then_some(1), false);
    let e = if rank == 0 {
        // Complete only once the plug-in took it.
        comm.send(b"hello", 1, 2).unwrap_err()
    } else {
        comm.recv(&mut [0u8; 5], 0, 2).unwrap_err()
    };
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    drop(comm);
    assert_wound_down(&sockets);
    println!("OK stuck on rank {rank}");
}

/// Rank 0's plug-in fails after some hundred sends (`cut`: its links die with it), in the
/// middle of a loop of checked all-reduces, ring exchanges of every protocol, and numbered
/// messages from rank 0 to rank 1: the loop finishes with exact results, rank 0 fell back to
/// TCP once per peer and each peer once with it, and nobody was lost.
fn fallback(cut: bool) {
    let rank: usize = std::env::var("HCOMM_RANK").unwrap().parse().unwrap();
    let (sockets, comm) = join_with(UnixSockets {
        fail_after: (rank == 0).then_some(300),
        cut,
        ..UnixSockets::default()
    });
    let size = comm.size();
    let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
    let ranks: usize = (0..size).sum();
    let mut next = 0u64;
    for round in 0..40usize {
        let send: Vec<f32> = (0..100_000)
            .map(|i| ((i + round) % 13 + rank) as f32)
            .collect();
        let mut sum = vec![0f32; send.len()];
        comm.allreduce(&send, &mut sum, ReduceOp::Sum).unwrap();
        for (i, &v) in sum.iter().enumerate() {
            assert_eq!(
                v,
                (((i + round) % 13) * size + ranks) as f32,
                "round {round}"
            );
        }
        for len in [0, 1, 64 << 10, 3 << 20] {
            let out: Vec<u8> = (0..len).map(|i| (i * 7 + rank + round) as u8).collect();
            let mut got = vec![0u8; len];
            let n = comm.sendrecv(&out, right, 5, &mut got, left, 5).unwrap();
            assert_eq!(n, len);
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, &b)| b == (i * 7 + left + round) as u8),
                "round {round}, {len} bytes"
            );
        }
        // Numbered messages, small and large, each the next one.
        for _ in 0..8 {
            let len = if next % 4 == 3 { 300_000 } else { 8 };
            if rank == 0 {
                let msg: Vec<u8> = (0..len).map(|i| (next as usize + i) as u8).collect();
                comm.send(&msg, 1, 7).unwrap();
            } else if rank == 1 {
                let mut msg = vec![0u8; len];
                assert_eq!(comm.recv(&mut msg, 0, 7).unwrap(), len);
                assert!(
                    msg.iter()
                        .enumerate()
                        .all(|(i, &b)| b == (next as usize + i) as u8),
                    "message {next}"
                );
            }
            next += 1;
        }
    }
    comm.barrier().unwrap();
    let s = comm.protocol_stats();
    let expected = if rank == 0 { size - 1 } else { 1 };
    assert_eq!(s.plugin_fallbacks, expected as u64, "{s:?}");
    assert!(
        s.plugin_eager > 0 && s.tcp_eager + s.tcp_rendezvous > 0,
        "{s:?}"
    );
    drop(comm);
    assert_wound_down(&sockets);
    println!("OK fallback on rank {rank}: {s:?}");
}

/// The names of the link threads of `peers`, sorted.
fn threads_of(peers: &[usize]) -> Vec<String> {
    let mut names: Vec<String> = peers
        .iter()
        .flat_map(|p| [format!("hcomm-rx-{p}"), format!("hcomm-tx-{p}")])
        .collect();
    names.sort();
    names
}

/// The link threads once there are `n` (a new thread names itself when it first runs),
/// sorted; fails after 20 s.
fn link_threads_when(n: usize) -> Vec<String> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let mut threads = link_threads();
        if threads.len() >= n {
            threads.sort();
            return threads;
        }
        assert!(
            Instant::now() < until,
            "{} link threads: {threads:?}",
            threads.len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Ranks talk only to their ring neighbours: each has the channels (two threads each) of
/// those two, not of every rank (channels open on a pair's first use, as TCP links do).
fn neighbours() {
    let (sockets, comm) = join(None, false);
    let (rank, size) = (comm.rank(), comm.size());
    let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
    let mut got = [0u8; 8];
    comm.sendrecv(&[rank as u8; 8], right, 4, &mut got, left, 4)
        .unwrap();
    assert_eq!(got, [left as u8; 8]);
    assert_eq!(
        link_threads_when(4),
        threads_of(&[left.min(right), left.max(right)])
    );
    // Nobody leaves (ending its receivers here) or talks to another rank (opening a channel
    // there) before every rank has counted: a token goes round twice, from neighbour to
    // neighbour (round 1: everyone counted; round 2: everyone knows).
    for round in 0..2 {
        let mut token = [0u8; 1];
        if rank == 0 {
            comm.send(&[1], right, 7 + round).unwrap();
            comm.recv(&mut token, left, 7 + round).unwrap();
        } else {
            comm.recv(&mut token, left, 7 + round).unwrap();
            comm.send(&[1], right, 7 + round).unwrap();
        }
    }
    drop(comm);
    assert_wound_down(&sockets);
    println!("OK neighbours on rank {rank}");
}

/// Rank 0 sends to rank 1, which makes no call meanwhile: rank 1 opens its channel of rank 0
/// when rank 0's TCP connection comes up (its watcher reads it: nobody else does), then
/// receives the message.
fn first_contact() {
    let (sockets, comm) = join(None, false);
    let rank = comm.rank();
    if rank == 0 {
        comm.send(b"first", 1, 6).unwrap();
    } else {
        assert_eq!(link_threads_when(2), threads_of(&[0]));
        let mut got = [0u8; 5];
        assert_eq!(comm.recv(&mut got, 0, 6).unwrap(), 5);
        assert_eq!(&got, b"first");
    }
    comm.barrier().unwrap();
    drop(comm);
    assert_wound_down(&sockets);
    println!("OK first contact on rank {rank}");
}

/// The entry of a rank started by [`job`] (ignored in normal runs).
#[test]
#[ignore = "a rank of the jobs the other tests start"]
fn rank_of_a_job() {
    match std::env::var(SCENARIO).as_deref() {
        Ok("traffic") => traffic(),
        Ok("lost") => lost(false),
        Ok("deaf") => lost(true),
        Ok("stuck") => stuck(),
        Ok("fails") => fallback(false),
        Ok("dies") => fallback(true),
        Ok("neighbours") => neighbours(),
        Ok("first-contact") => first_contact(),
        other => panic!("no scenario {other:?}"),
    }
}

/// Runs `scenario` on `n` ranks (this binary, each its own process, with HCOMM_TRANSPORT
/// naming the plug-in); returns each rank's exit success and output.
fn job(scenario: &str, n: usize, timeout: &str) -> Vec<(bool, String)> {
    let dir = std::env::temp_dir().join(format!(
        "hcomm-plugin-{scenario}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_text = dir.to_string_lossy().into_owned();
    let env = [
        (SCENARIO, scenario),
        (DIR, dir_text.as_str()),
        ("HCOMM_TRANSPORT", "unix"),
        ("HCOMM_TIMEOUT", timeout),
    ];
    let results = self_job(n, &env);
    let _ = std::fs::remove_dir_all(&dir);
    results
}

/// Every rank succeeded and said `expected`; else fails with the output of every rank that
/// did not (the first to fail is not always the first rank).
fn assert_ok(results: &[(bool, String)], expected: &str) {
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter(|(_, (ok, out))| !*ok || !out.contains(expected))
        .map(|(r, (_, out))| format!("rank {r}:\n{out}"))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn a_unix_socket_plugin_carries_all_traffic_of_2_and_3_ranks() {
    for n in [2, 3] {
        assert_ok(&job("traffic", n, "30"), "OK traffic on rank");
    }
}

#[test]
fn a_plugin_link_is_opened_on_a_pairs_first_use_by_either_side() {
    assert_ok(&job("neighbours", 4, "30"), "OK neighbours on rank");
    assert_ok(&job("first-contact", 2, "30"), "OK first contact on rank");
}

#[test]
fn a_dead_peer_is_lost_at_once_whether_or_not_the_plugin_notices() {
    for scenario in ["lost", "deaf"] {
        let results = job(scenario, 2, "30");
        assert!(!results[1].0, "rank 1 was to die:\n{}", results[1].1);
        assert_ok(&results[..1], "OK lost");
    }
}

#[test]
fn a_blocking_plugin_send_ends_in_timeouts_and_a_clean_close() {
    let started = Instant::now();
    assert_ok(&job("stuck", 2, "2"), "OK stuck on rank");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_plugin_that_starts_failing_falls_back_to_tcp_without_loss() {
    for scenario in ["fails", "dies"] {
        for n in [2, 3] {
            assert_ok(&job(scenario, n, "30"), "OK fallback on rank");
        }
    }
}

/// A plug-in that refuses to start.
struct Refuses;

impl Plugin for Refuses {
    fn init(&self, _: usize, _: usize) -> Result<()> {
        Err(err("no network today"))
    }
    fn send(&self, _: &[u8], _: usize) -> Result<()> {
        Ok(())
    }
    fn recv(&self, _: &mut [u8], _: usize) -> Result<()> {
        Ok(())
    }
}

/// A world of one rank with `HCOMM_TRANSPORT=transport`.
fn alone(transport: &str) -> Result<Communicator> {
    let config = Config::from_lookup(|k| (k == "HCOMM_TRANSPORT").then(|| transport.into()))?;
    Communicator::init_with(config)
}

#[test]
fn unknown_and_failing_plugins_are_clear_errors() {
    plugin::register("refuses", Arc::new(Refuses)).unwrap();
    let e = alone("nowhere").err().unwrap();
    let m = e.to_string();
    assert!(matches!(e, Error::InvalidArgument(_)), "{m}");
    assert!(
        m.contains("nowhere") && m.contains("tcp, shm, ofi, refuses"),
        "{m}"
    );
    let e = alone("refuses").err().unwrap();
    assert!(
        matches!(e, Error::Init(ref m) if m.message.contains("no network today") && m.message.contains("refuses")),
        "{e}"
    );
}

/// Counts its init and finalize calls.
#[derive(Default)]
struct Counts {
    init: AtomicUsize,
    finalize: AtomicBool,
}

impl Plugin for Counts {
    fn init(&self, rank: usize, size: usize) -> Result<()> {
        assert_eq!((rank, size), (0, 1));
        self.init.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn send(&self, _: &[u8], _: usize) -> Result<()> {
        Err(err("a world of one sends nothing"))
    }
    fn recv(&self, _: &mut [u8], _: usize) -> Result<()> {
        Err(err("a world of one receives nothing"))
    }
    fn finalize(&self) -> Result<()> {
        self.finalize.store(true, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn a_plugin_serves_one_world_at_a_time_from_init_to_finalize() {
    let counts = Arc::new(Counts::default());
    plugin::register("counts", counts.clone()).unwrap();
    let comm = alone("counts").unwrap();
    assert_eq!(counts.init.load(Ordering::SeqCst), 1);
    let e = alone("counts").err().unwrap();
    assert!(e.to_string().contains("one world at a time"), "{e}");
    let mut v = [1.5f64; 4];
    comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    comm.send(b"self", 0, 1).unwrap();
    assert_eq!(comm.recv(&mut [0u8; 4], 0, 1).unwrap(), 4);
    assert!(!counts.finalize.load(Ordering::SeqCst));
    drop(comm);
    assert!(counts.finalize.load(Ordering::SeqCst));
    drop(alone("counts").unwrap());
    assert_eq!(counts.init.load(Ordering::SeqCst), 2);
}

/// A communicator whose traffic goes through a plug-in cannot grow (the grown communicator
/// is a world of its own, and the plug-in serves one world at a time): making a token and
/// growing both fail at once, naming the plug-in and the way out, and start nothing; the
/// communicator works on.
#[test]
fn a_communicator_on_a_plugin_refuses_to_grow_at_once_naming_the_plugin() {
    plugin::register("no-grow", Arc::new(Counts::default())).unwrap();
    let comm = alone("no-grow").unwrap();
    let threads = || std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count);
    let before = threads();
    let token_err = comm.join_token().expect_err("a token on a plug-in");
    let grow_err = comm
        .grow("hcomm-join/1/0/00/00/127.0.0.1:1", 1)
        .err()
        .expect("a grow on a plug-in");
    for (e, what) in [(token_err, "join_token"), (grow_err, "grow")] {
        let m = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{m}");
        assert!(
            m.contains(what) && m.contains("\"no-grow\"") && m.contains("built-in transports"),
            "{m}"
        );
    }
    assert_eq!(threads(), before);
    let mut v = [2i64; 3];
    comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v, [2; 3]);
}
