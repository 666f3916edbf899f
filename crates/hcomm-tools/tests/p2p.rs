//! Multi-process point-to-point tests: real processes, real sockets, launched by hcommrun,
//! Open MPI's mpirun and MPICH's mpiexec, or by hand.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hcomm_testkit::{collect_outputs, free_port, run_bounded, spawn_ranks, text, Rng};

const HCOMMRUN: &str = env!("CARGO_BIN_EXE_hcommrun");
const CHECK: &str = env!("CARGO_BIN_EXE_hcomm_check");

fn assert_all_ok(o: &Output, n: usize, scenario: &str) {
    let t = text(o);
    assert!(o.status.success(), "{scenario} on {n} ranks failed:\n{t}");
    for r in 0..n {
        assert!(
            t.contains(&format!("[{r}] OK {scenario}")),
            "rank {r} did not finish {scenario}:\n{t}"
        );
    }
}

fn hcommrun(n: usize, args: &[&str]) -> Command {
    let mut c = Command::new(HCOMMRUN);
    c.arg("-n")
        .arg(n.to_string())
        .arg("--timeout")
        .arg("120")
        .arg("--")
        .arg(CHECK)
        .args(args);
    c.env("HCOMM_TIMEOUT", "60");
    c
}

fn check(n: usize, args: &[&str]) {
    let (o, _) = run_bounded(&mut hcommrun(n, args), Duration::from_secs(150));
    let name = if args[0] == "all-pairs" {
        "all-pairs"
    } else {
        args[0]
    };
    assert_all_ok(&o, n, name);
}

#[test]
fn hello_on_1_2_3_5_8_ranks() {
    for n in [1, 2, 3, 5, 8] {
        check(n, &["hello"]);
    }
}

#[test]
fn ring_0b_to_64mib_on_2_ranks() {
    check(2, &["ring"]);
}

#[test]
fn ring_0b_to_64mib_on_3_ranks() {
    check(3, &["ring"]);
}

#[test]
fn ring_0b_to_16mib_on_5_ranks() {
    check(5, &["ring", "--max-size", "16777216"]);
}

#[test]
fn ring_0b_to_16mib_on_8_ranks() {
    check(8, &["ring", "--max-size", "16777216"]);
}

#[test]
fn ring_on_one_rank_talks_to_itself() {
    check(1, &["ring", "--max-size", "1048576"]);
}

#[test]
fn all_pairs_on_2_3_5_8_ranks() {
    for n in [2, 3, 5, 8] {
        check(n, &["all-pairs"]);
    }
}

#[test]
fn all_pairs_with_one_stream_and_tiny_chunks() {
    let mut c = hcommrun(4, &["all-pairs", "--max-size", "1048576"]);
    c.env("HCOMM_TCP_STREAMS", "1")
        .env("HCOMM_TCP_CHUNK", "4096")
        .env("HCOMM_TCP_EAGER_LIMIT", "0");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    assert_all_ok(&o, 4, "all-pairs");
}

/// Links are made on a pair's first use: in a ring over TCP of 8 ranks (more ranks than this
/// box has cores), whose ranks all send to their right and receive from their left at once,
/// each rank connects to its two neighbours only (two streams each), one connection per pair
/// whichever side dialed first or both.
#[test]
fn a_ring_over_tcp_connects_each_rank_to_its_two_neighbours_only() {
    let n = 8;
    let (o, _) = run_bounded(
        hcommrun(n, &["protocols"]).env("HCOMM_TRANSPORT", "tcp"),
        Duration::from_secs(150),
    );
    assert_all_ok(&o, n, "protocols");
    let t = text(&o);
    let mut opened = 0;
    for r in 0..n {
        let prefix = format!("[{r}] links ");
        let line = t
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("rank {r} printed no links:\n{t}"));
        let count = |key: &str| -> u64 {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("rank {r}: no {key} in {line:?}"))
        };
        let (o, a) = (count("tcp_opened="), count("tcp_accepted="));
        assert_eq!(
            o + a,
            4,
            "rank {r}: two neighbours, two streams each: {line}"
        );
        opened += o;
    }
    assert_eq!(opened, 2 * n as u64, "one connection per pair:\n{t}");
}

#[test]
fn small_messages_of_every_length_arrive_whole() {
    check(2, &["small"]);
    let mut c = hcommrun(2, &["small"]);
    c.env("HCOMM_TRANSPORT", "tcp");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(150));
    assert_all_ok(&o, 2, "small");
}

#[test]
fn tags_keep_order_per_source_and_tag() {
    check(2, &["tags"]);
    check(3, &["tags"]);
}

#[test]
fn truncation_is_an_error_and_loses_nothing_else() {
    check(2, &["truncate"]);
}

#[test]
fn split_and_dup() {
    for n in [1, 2, 3, 5, 8] {
        check(n, &["split"]);
    }
}

#[test]
fn a_silent_peer_gives_a_timeout_naming_it() {
    let mut c = hcommrun(2, &["timeout"]);
    c.env("HCOMM_TIMEOUT", "2");
    let (o, took) = run_bounded(&mut c, Duration::from_secs(60));
    assert_all_ok(&o, 2, "timeout");
    let t = text(&o);
    assert!(t.contains("[1] timed out after 2."), "{t}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[test]
fn a_failing_rank_stops_the_job_quickly() {
    let (o, took) = run_bounded(&mut hcommrun(3, &["exit"]), Duration::from_secs(60));
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("rank 1 exited with status 3"), "{t}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn a_killed_rank_stops_the_job_quickly() {
    let script = format!("if [ \"$HCOMM_RANK\" = 2 ]; then kill -9 $$; fi; exec {CHECK} ring");
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", "4", "--", "sh", "-c", &script]);
    let (o, took) = run_bounded(&mut c, Duration::from_secs(60));
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("rank 2 was killed by signal SIGKILL"), "{t}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// Starts `n` ranks of `hcomm_check args` by hand (store on 127.0.0.1:`port`) with
/// `HCOMM_TIMEOUT` = `timeout` and the variables `env`.
fn spawn_by_hand_with(
    n: usize,
    port: u16,
    args: &[&str],
    timeout: &str,
    env: &[(&str, &str)],
) -> Vec<Child> {
    spawn_ranks(n, &format!("127.0.0.1:{port}"), |_| {
        let mut c = Command::new(CHECK);
        c.args(args)
            .envs(env.iter().copied())
            .env("HCOMM_TIMEOUT", timeout);
        c
    })
}

#[test]
fn peers_of_a_dead_rank_fail_fast_naming_it() {
    // No hcommrun here: the survivors must notice by themselves, well before HCOMM_TIMEOUT.
    // They also tell the launcher's pipe (HCOMM_RUN_FD) whom they lost, so that a launcher
    // can name rank 1 however the exits are ordered.
    let (pipe, write_end, env) = report_pipe();
    let t0 = Instant::now();
    let children = spawn_by_hand_with(3, free_port(), &["exit"], "100", &[("HCOMM_RUN_FD", &env)]);
    drop(write_end);
    let outputs = collect_outputs(children, Duration::from_secs(60));
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(outputs[1].status.code(), Some(3));
    for r in [0, 2] {
        let t = text(&outputs[r]);
        assert!(!outputs[r].status.success(), "rank {r} should fail: {t}");
        assert!(
            t.contains("peer lost") && t.contains("rank 1"),
            "rank {r}: {t}"
        );
    }
    let mut reports = String::new();
    pipe.take(1 << 16).read_to_string(&mut reports).unwrap();
    let mut lines: Vec<&str> = reports.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["lost 0 1", "lost 2 1"], "{reports:?}");
}

/// A pipe like hcommrun's report pipe: the read end, the write end (inherited by ranks
/// spawned while it is open; drop it once they are, so that reading ends when they exit),
/// and `HCOMM_RUN_FD` (`FD:INODE` of the write end) for the ranks.
fn report_pipe() -> (std::fs::File, OwnedFd, String) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, which has room for them.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), 0) }, 0);
    // SAFETY: pipe2 made both descriptors, owned here alone.
    let (read, write) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            OwnedFd::from_raw_fd(fds[1]),
        )
    };
    // SAFETY: fcntl on a descriptor owned here: only the write end goes to the ranks.
    unsafe { libc::fcntl(fds[0], libc::F_SETFD, libc::FD_CLOEXEC) };
    let ino = std::fs::File::from(write.try_clone().unwrap())
        .metadata()
        .unwrap()
        .ino();
    (read, write, format!("{}:{ino}", fds[1]))
}

#[test]
fn launched_by_open_mpi() {
    let port = free_port();
    let mut c = Command::new("mpirun.openmpi");
    c.args(["--allow-run-as-root", "--oversubscribe", "-n", "4"])
        .args([
            "-x",
            &format!("HCOMM_ROOT_ADDR=127.0.0.1:{port}"),
            "-x",
            "HCOMM_JOB_SECRET=ompi-test",
        ])
        .args([
            "-x",
            "HCOMM_TIMEOUT=60",
            CHECK,
            "all-pairs",
            "--max-size",
            "1048576",
        ])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert_eq!(t.matches("OK all-pairs").count(), 4, "{t}");
}

#[test]
fn launched_by_mpich() {
    let port = free_port();
    let mut c = Command::new("mpiexec.mpich");
    c.args([
        "-n",
        "4",
        "-genv",
        "HCOMM_ROOT_ADDR",
        &format!("127.0.0.1:{port}"),
    ])
    .args([
        "-genv",
        "HCOMM_JOB_SECRET",
        "mpich-test",
        "-genv",
        "HCOMM_TIMEOUT",
        "60",
    ])
    .args([CHECK, "ring", "--max-size", "1048576"]);
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert_eq!(t.matches("OK ring").count(), 4, "{t}");
}

/// Sends hostile traffic to `addr` (the store, or a rank's listener) until `stop`: random
/// bytes, absurd lengths, silent connections, handshakes with a wrong secret, and replayed
/// handshakes (what the server sent one connection, sent back to it on another). Returns the
/// connections made.
fn attack(addr: String, stop: Arc<AtomicBool>) -> thread::JoinHandle<usize> {
    thread::spawn(move || {
        let mut attempts = 0;
        let mut silent = Vec::new();
        let mut rng = Rng::new(0x1234_5678_9abc_def0);
        while !stop.load(Ordering::SeqCst) {
            let Ok(mut s) = TcpStream::connect(&addr) else {
                thread::sleep(Duration::from_millis(5));
                continue;
            };
            let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            attempts += 1;
            match attempts % 5 {
                0 => {
                    let mut junk = vec![0u8; 4096];
                    rng.fill(&mut junk);
                    let _ = s.write_all(&junk);
                }
                1 => {
                    let _ = s.write_all(&[0xff; 64]);
                    let _ = s.write_all(&u64::MAX.to_le_bytes());
                }
                2 => {
                    if silent.len() < 40 {
                        silent.push(s);
                    }
                }
                3 => {
                    let _ = hcomm::internal::bootstrap::auth::client_handshake(
                        &mut s,
                        b"not-the-secret",
                        b"hello",
                        Instant::now() + Duration::from_millis(500),
                    );
                }
                _ => {
                    let mut heard = vec![0u8; 4096];
                    let n = s.read(&mut heard).unwrap_or(0);
                    if let Ok(mut again) = TcpStream::connect(&addr) {
                        let _ = again.set_write_timeout(Some(Duration::from_millis(200)));
                        let _ = again.write_all(&heard[..n]);
                        let _ = s.write_all(&heard[..n]);
                    }
                }
            }
            thread::sleep(Duration::from_millis(2));
        }
        attempts
    })
}

#[test]
fn hostile_traffic_to_the_store_leaves_the_job_correct() {
    let port = free_port();
    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = (0..2)
        .map(|_| attack(format!("127.0.0.1:{port}"), Arc::clone(&stop)))
        .collect();
    // Several jobs in a row on the same store address, each under attack from its start.
    for _ in 0..3 {
        let mut c = hcommrun(4, &["all-pairs", "--max-size", "1048576"]);
        c.env("HCOMM_ROOT_ADDR", format!("127.0.0.1:{port}"));
        let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
        assert_all_ok(&o, 4, "all-pairs");
    }
    stop.store(true, Ordering::SeqCst);
    let attempts: usize = attackers.into_iter().map(|a| a.join().unwrap()).sum();
    assert!(
        attempts >= 8,
        "the attack barely reached the store ({attempts} connections)"
    );
}

/// A rank's only port is its listener, open for the whole job (peers connect on their first
/// use of each other). Three ranks of four start and open theirs; hostile traffic hits all
/// three while they wait for the fourth and all through the job, whose links are made on
/// demand meanwhile. The job must be right and on time, every rank must report exactly its
/// own listener once init is done (rank 0 also the store it hosts), and the attack must have
/// reached the listeners.
#[test]
fn hostile_traffic_to_the_ranks_listeners_during_setup_leaves_the_job_correct() {
    let port = free_port();
    let root = format!("127.0.0.1:{port}");
    let secret = "listener-attack";
    let rank = |r: usize| {
        Command::new(CHECK)
            .args(["all-pairs", "--max-size", "1048576"])
            .env("HCOMM_RANK", r.to_string())
            .env("HCOMM_SIZE", "4")
            .env("HCOMM_ROOT_ADDR", &root)
            .env("HCOMM_JOB_SECRET", secret)
            .env("HCOMM_TIMEOUT", "60")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut children: Vec<Child> = (0..3).map(rank).collect();
    let t0 = Instant::now();
    let mut store = loop {
        let timeout = Duration::from_millis(500);
        match hcomm::internal::bootstrap::StoreClient::connect(&root, secret.as_bytes(), timeout) {
            Ok(c) => break c,
            Err(_) if t0.elapsed() < Duration::from_secs(30) => {
                thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("no store at {root}: {e}"),
        }
    };
    let listeners: Vec<String> = (0..3)
        .map(|r| {
            let a = store
                .wait(&format!("hcomm/0/addr/{r}"), Duration::from_secs(30))
                .unwrap();
            String::from_utf8(a).unwrap()
        })
        .collect();
    drop(store);
    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = listeners
        .iter()
        .map(|a| attack(a.clone(), Arc::clone(&stop)))
        .collect();
    thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    children.push(rank(3));
    let outputs = collect_outputs(children, Duration::from_secs(120));
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let attempts: usize = attackers.into_iter().map(|a| a.join().unwrap()).sum();
    for (r, o) in outputs.iter().enumerate() {
        let t = text(o);
        assert!(
            o.status.success() && t.contains("OK all-pairs"),
            "rank {r}: {t}"
        );
        let listening = if r == 0 {
            "listening 2 "
        } else {
            "listening 1 "
        };
        assert!(t.contains(listening), "rank {r}: {t}");
    }
    println!("the job took {took:?} from its last rank's start; {attempts} hostile connections");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(
        attempts >= 10,
        "the attack barely reached the listeners ({attempts} connections)"
    );
}

#[test]
fn nonblocking_sends_progress_without_polling() {
    check(2, &["progress"]);
}

#[test]
fn destroy_releases_sockets_and_threads() {
    check(3, &["lifecycle"]);
}

#[test]
fn debug_prints_the_topology_once_and_logging_is_opt_in() {
    let mut c = hcommrun(3, &["hello"]);
    c.env("HCOMM_DEBUG", "1");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(60));
    assert_all_ok(&o, 3, "hello");
    let t = text(&o);
    assert_eq!(
        t.matches("hcomm topology: 3 ranks on 1 hosts").count(),
        1,
        "{t}"
    );
    assert!(t.contains("[0] ") && t.contains(" numa "), "{t}");
    for r in 0..3 {
        assert!(
            t.contains(&format!(
                "[{r}] hcomm: rank {r}: shared-memory pool: blocks of"
            )),
            "{t}"
        );
    }

    let (o, _) = run_bounded(&mut hcommrun(2, &["hello"]), Duration::from_secs(60));
    assert!(
        o.stderr.is_empty(),
        "the library printed without being asked: {}",
        text(&o)
    );

    let mut c = hcommrun(2, &["hello"]);
    c.env("HCOMM_LOG_LEVEL", "3");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(60));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("world ready"),
        "{}",
        text(&o)
    );
}

#[test]
fn bad_environment_is_a_clear_error() {
    let mut c = hcommrun(2, &["hello"]);
    c.env("HCOMM_TIMEOUT", "soon");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(60));
    assert!(!o.status.success());
    assert!(text(&o).contains("HCOMM_TIMEOUT"), "{}", text(&o));
    let mut c = Command::new(CHECK);
    c.arg("hello")
        .env("HCOMM_RANK", "0")
        .env("HCOMM_SIZE", "2")
        .env_remove("HCOMM_ROOT_ADDR");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(60));
    assert!(!o.status.success());
    assert!(text(&o).contains("HCOMM_ROOT_ADDR"), "{}", text(&o));
}

/// Rank 0 hosts the rendezvous store at `HCOMM_ROOT_ADDR` even when another socket held that
/// port as it started (another job's listener took it between the launcher's choice and rank
/// 0's bind, and never answers as a store): rank 0 tries again and hosts the store once the
/// port is free, instead of failing at `HCOMM_TIMEOUT` for want of a store nobody runs.
#[test]
fn rank_0_hosts_the_store_once_a_socket_holding_its_port_is_gone() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let root = holder.local_addr().unwrap().to_string();
    let ranks = spawn_ranks(2, &root, |_| {
        let mut c = Command::new(CHECK);
        c.arg("hello").env("HCOMM_TIMEOUT", "20");
        c
    });
    std::thread::sleep(Duration::from_millis(1500));
    drop(holder);
    for (r, o) in collect_outputs(ranks, Duration::from_secs(60))
        .iter()
        .enumerate()
    {
        assert!(o.status.success(), "rank {r}: {}", text(o));
    }
}

#[test]
fn a_wrong_secret_cannot_join() {
    let root = format!("127.0.0.1:{}", free_port());
    let secret = format!("the-job-{}", std::process::id());
    let good = |r: usize| {
        spawn_ranks(1, &root, |_| {
            let mut c = Command::new(CHECK);
            c.arg("hello")
                .env("HCOMM_RANK", r.to_string())
                .env("HCOMM_SIZE", "2")
                .env("HCOMM_JOB_SECRET", &secret)
                .env("HCOMM_TIMEOUT", "60");
            c
        })
        .remove(0)
    };
    // Rank 0 hosts the store and waits in init for rank 1 while the intruder tries (started
    // together, the job could end before the intruder knocks).
    let rank0 = good(0);
    let intruder = Command::new(CHECK)
        .arg("hello")
        .env("HCOMM_RANK", "1")
        .env("HCOMM_SIZE", "2")
        .env("HCOMM_ROOT_ADDR", &root)
        .env("HCOMM_JOB_SECRET", "guessed")
        .env("HCOMM_TIMEOUT", "5")
        .output()
        .unwrap();
    let rank1 = good(1);
    assert!(!intruder.status.success());
    assert!(
        text(&intruder).contains("HCOMM_JOB_SECRET"),
        "{}",
        text(&intruder)
    );
    let [rank0, rank1]: [_; 2] = collect_outputs(vec![rank0, rank1], Duration::from_secs(60))
        .try_into()
        .unwrap();
    assert!(
        rank0.status.success() && rank1.status.success(),
        "{}{}",
        text(&rank0),
        text(&rank1)
    );
}
