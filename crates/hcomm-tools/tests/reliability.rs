//! Reliability: a soak of random collectives on 4 ranks over both transports; how fast the
//! survivors of a SIGKILLed or hung rank fail (kill-to-error latency), and of an aborted
//! world; and that nothing of a failed or aborted job is left behind.

use std::process::Command;
use std::time::Duration;

use hcomm_testkit::{left_in_dev_shm, run_bounded, unix_ns, Ranks};

const HCOMMRUN: &str = env!("CARGO_BIN_EXE_hcommrun");
const CHECK: &str = env!("CARGO_BIN_EXE_hcomm_check");

/// Runs `hcomm_check soak` on 4 ranks with `env`; every rank must finish and report.
fn soak(calls: usize, seed: u64, env: &[(&str, &str)]) {
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", "4", "--timeout", "150", "--", CHECK, "soak"])
        .args(["--calls", &calls.to_string(), "--seed", &seed.to_string()])
        .env("HCOMM_TIMEOUT", "60");
    for (k, v) in env {
        c.env(k, v);
    }
    let (o, took) = run_bounded(&mut c, Duration::from_secs(180));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "soak with {env:?} failed:\n{text}");
    for r in 0..4 {
        assert!(
            text.contains(&format!("[{r}] OK soak")),
            "rank {r}:\n{text}"
        );
    }
    let summary = text.lines().find(|l| l.starts_with("[0] soak: "));
    println!("{} in {took:.1?}", summary.unwrap_or("no summary"));
}

#[test]
fn soak_of_random_collectives_over_shared_memory() {
    soak(2000, 11, &[]);
}

#[test]
fn soak_of_random_collectives_over_tcp() {
    soak(2000, 12, &[("HCOMM_TRANSPORT", "tcp")]);
}

/// Starts `hcomm_check peer-loss` on 3 ranks, kills rank 1 from outside once all are ready,
/// and returns each survivor's kill-to-error latency, and its latency from the moment the
/// killed rank was reaped (it had died: the time a loaded machine takes to end the process
/// left out).
fn kill_to_error(transport: &str, pending: &str) -> (Vec<Duration>, Vec<Duration>) {
    let fault = fault_to_error(transport, pending, "60", libc::SIGKILL);
    assert!(!fault.text.contains("no heartbeat"), "{}", fault.text);
    for r in [0, 2] {
        let clean = format!("[{r}] left threads=0 sockets=0");
        assert!(fault.text.contains(&clean), "{}", fault.text);
    }
    (fault.since_signal, fault.since_reaped)
}

/// What the survivors of a faulty rank reported.
struct Fault {
    /// Each survivor's latency from the signal to its error.
    since_signal: Vec<Duration>,
    /// Each survivor's latency from the moment the faulty rank was reaped to its error (zero
    /// when it came first).
    since_reaped: Vec<Duration>,
    /// Every rank's output.
    text: String,
}

/// Starts `hcomm_check peer-loss` on 3 ranks with `HCOMM_TIMEOUT` = `timeout` and sends rank 1
/// `sig` once all are ready (SIGKILL: it dies; SIGSTOP: it hangs, then is killed once the
/// survivors have reported).
fn fault_to_error(transport: &str, pending: &str, timeout: &str, sig: libc::c_int) -> Fault {
    let args = ["peer-loss", "--victims", "1", "--pending", pending];
    let mut job = Ranks::start(3, None, &args, |_| {
        let mut c = Command::new(CHECK);
        c.env("HCOMM_TRANSPORT", transport)
            .env("HCOMM_TIMEOUT", timeout);
        c
    });
    job.wait_for_lines(&[0, 1, 2], "ready ", Duration::from_secs(60));
    // Let the survivors settle into their wait (a sleeping receiver, a running loop), for a
    // time of random phase: a sleeping waiter wakes every 100 ms.
    let jitter = (unix_ns() % 100_000_000) as u64;
    std::thread::sleep(Duration::from_millis(250) + Duration::from_nanos(jitter));
    let killed = unix_ns();
    job.signal(1, sig);
    if sig != libc::SIGKILL {
        job.wait_for_lines(&[0, 2], "lost ", Duration::from_secs(60));
    }
    job.kill(1);
    let reaped = unix_ns();
    let status = job.finish(Duration::from_secs(30));
    let text = job.text();
    let lost: Vec<u128> = [0, 2]
        .into_iter()
        .map(|r| {
            assert!(
                status[r].success(),
                "rank {r} ({transport}, {pending}):\n{text}"
            );
            let line = job.output[r]
                .iter()
                .find_map(|l| l.strip_prefix("lost "))
                .unwrap_or_else(|| panic!("rank {r} printed no loss:\n{text}"));
            // A lost peer is named in the error's peer field: the killed rank.
            assert!(
                !line.contains("PeerLost") || line.contains("PeerLost world rank 1: "),
                "rank {r}: {line}"
            );
            line.split(' ')
                .next()
                .and_then(|at| at.parse().ok())
                .unwrap_or_else(|| panic!("rank {r}: no time in {line:?}"))
        })
        .collect();
    let since = |t: u128| -> Vec<Duration> {
        lost.iter()
            .map(|&l| Duration::from_nanos(l.saturating_sub(t) as u64))
            .collect()
    };
    Fault {
        since_signal: since(killed),
        since_reaped: since(reaped),
        text,
    }
}

/// The survivors of a SIGKILLed shared-memory or TCP peer fail within a bound far below
/// HCOMM_TIMEOUT, whether they wait in a receive from it or run collectives with it; the
/// latencies are printed (`--nocapture`).
#[test]
fn survivors_of_a_killed_rank_fail_fast() {
    for transport in ["shm", "tcp"] {
        for pending in ["recv", "allreduce"] {
            let (latencies, _) = kill_to_error(transport, pending);
            println!("kill-to-error latency, {transport}, pending {pending}: {latencies:.2?}");
            for l in latencies {
                assert!(l < Duration::from_secs(5), "{transport} {pending}: {l:?}");
            }
        }
    }
}

/// A receiver asleep on its doorbell's futex learns of a killed shared-memory peer from the
/// watcher, which sees the pidfd of the peer's process become readable (the ranks of one host
/// have no TCP connection between them: `tests/shm.rs`), rather than when its nap of up to
/// 100 ms ends. Counted from the killed rank's death (a loaded machine may take long to end it),
/// 4 of 6 latencies must be below 30 ms (about 1 ms when the cores are not taken by other
/// work: nextest runs this test alone); with naps of random phase that would happen in
/// about one run of fourteen.
#[test]
fn a_sleeping_receiver_learns_of_a_killed_shared_memory_peer_at_once() {
    let mut all = Vec::new();
    for _ in 0..3 {
        all.extend(kill_to_error("shm", "recv").1);
    }
    println!("death-to-error latency, shm, pending recv: {all:.2?}");
    let fast = all
        .iter()
        .filter(|&&l| l < Duration::from_millis(30))
        .count();
    assert!(fast >= 4, "{all:?}");
}

/// A rank that hangs (SIGSTOP: alive, its sockets open, its shared memory silent) is lost by
/// its shared-memory and TCP peers through the missing heartbeats, with `PeerLost` naming it,
/// within 2 x HCOMM_TIMEOUT (about HCOMM_TIMEOUT / 2 here), not a timeout. The four jobs run
/// at once: each mostly waits for the heartbeats to go missing.
#[test]
fn survivors_of_a_hung_rank_lose_it_through_missing_heartbeats() {
    let timeout = Duration::from_secs(6);
    let cases: Vec<(&str, &str)> = ["shm", "tcp"]
        .into_iter()
        .flat_map(|t| ["recv", "allreduce"].map(|p| (t, p)))
        .collect();
    let faults: Vec<Fault> = std::thread::scope(|s| {
        let jobs: Vec<_> = cases
            .iter()
            .map(|&(t, p)| s.spawn(move || fault_to_error(t, p, "6", libc::SIGSTOP)))
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for ((transport, pending), fault) in cases.into_iter().zip(faults) {
        let (latencies, text) = (fault.since_signal, fault.text);
        println!("stop-to-error latency, {transport}, pending {pending}: {latencies:.2?}");
        assert!(text.contains("no heartbeat"), "{text}");
        for l in latencies {
            assert!(l < 2 * timeout, "{transport} {pending}: {l:?}\n{text}");
        }
    }
}

/// Runs `hcomm_check args` on `n` ranks under hcommrun with `HCOMM_TRANSPORT` = `transport`;
/// once hcommrun is done, checks that nothing of the job is left: no process (each rank's
/// environment carries a mark), and no name of the job in /dev/shm. Returns the output.
fn job_leaving_nothing(n: usize, transport: &str, args: &[&str]) -> (bool, String) {
    let mark = format!("{}-{}", std::process::id(), unix_ns());
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", &n.to_string(), "--timeout", "120", "--", CHECK])
        .args(args)
        .env("HCOMM_TRANSPORT", transport)
        .env("HCOMM_TIMEOUT", "60")
        .env("HCOMM_DEBUG", "1")
        .env("RELIABILITY_TEST_MARK", &mark);
    let (o, _) = run_bounded(&mut c, Duration::from_secs(150));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let needle = format!("RELIABILITY_TEST_MARK={mark}");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .map(|env| env.split(|&b| b == 0).any(|v| v == needle.as_bytes()))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.is_empty(),
        "processes of the job left: {left:?}\n{text}"
    );
    if transport == "shm" {
        let left = left_in_dev_shm(&text);
        assert!(left.is_empty(), "left in /dev/shm: {left:?}\n{text}");
    }
    (o.status.success(), text)
}

/// The nanoseconds a rank printed after `prefix` (`hcomm_check`'s time stamps).
fn stamp(text: &str, rank: usize, prefix: &str) -> u128 {
    let start = format!("[{rank}] {prefix} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&start)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("rank {rank} printed no {prefix:?}:\n{text}"))
}

/// A rank aborts the world while the others wait in a receive from it or in all-reduces it
/// never joins: every other rank fails with Aborted naming it within a second (not
/// HCOMM_TIMEOUT), later calls fail the same way, every rank is back to the threads and
/// sockets it had before init, hcommrun exits non-zero naming the aborter, and no process or
/// shared memory of the job is left.
#[test]
fn an_aborted_world_fails_every_rank_promptly_and_leaves_nothing_behind() {
    for transport in ["shm", "tcp"] {
        for pending in ["recv", "allreduce"] {
            let args = ["abort", "--aborter", "2", "--pending", pending];
            let (success, text) = job_leaving_nothing(4, transport, &args);
            assert!(!success, "{text}");
            assert!(
                text.contains("hcommrun: rank 2 exited with status 1"),
                "{text}"
            );
            let aborting = stamp(&text, 2, "aborting");
            let mut latencies = Vec::new();
            for r in [0, 1, 3] {
                assert!(text.contains(&format!("[{r}] OK abort")), "{text}");
                let at = stamp(&text, r, "aborted");
                latencies.push(Duration::from_nanos(at.saturating_sub(aborting) as u64));
            }
            assert!(text.contains("[2] left threads=0 sockets=0"), "{text}");
            println!("abort-to-error latency, {transport}, pending {pending}: {latencies:.2?}");
            for l in latencies {
                assert!(
                    l < Duration::from_secs(1),
                    "{transport} {pending}: {l:?}\n{text}"
                );
            }
        }
    }
}

/// A rank SIGKILLed under hcommrun: hcommrun exits non-zero naming it, and no process or
/// shared memory of the job is left (the survivors' own threads and sockets are checked by
/// `peer-loss` itself, see `survivors_of_a_killed_rank_fail_fast`).
#[test]
fn a_killed_rank_leaves_no_process_or_shared_memory_behind() {
    for transport in ["shm", "tcp"] {
        let args = [
            "peer-loss",
            "--victims",
            "1",
            "--kill-after-ms",
            "200",
            "--pending",
            "allreduce",
        ];
        let (success, text) = job_leaving_nothing(3, transport, &args);
        assert!(!success, "{text}");
        assert!(
            text.contains("hcommrun: rank 1 was killed by signal SIGKILL"),
            "{text}"
        );
    }
}
