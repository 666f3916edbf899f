//! The flight recorder and stuck-rank diagnosis: a rank alive but absent from a collective is
//! named by the others' errors and by `hcomm_trace`; dumps on timeout, abort, SIGUSR1 and
//! through the API, in the versioned format; the ring keeps the last `HCOMM_TRACE_BUFFER`
//! calls; mismatched calls.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hcomm_testkit::{run_bounded, text, Ranks};
use serde_json::Value;

const HCOMMRUN: &str = env!("CARGO_BIN_EXE_hcommrun");
const CHECK: &str = env!("CARGO_BIN_EXE_hcomm_check");
const TRACE: &str = env!("CARGO_BIN_EXE_hcomm_trace");

/// A fresh dump directory of this test.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hcomm-flight-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Rank `r`'s dump in `dir`, parsed.
fn dump(dir: &Path, r: usize) -> Value {
    let path = dir.join(format!("rank{r}.json"));
    let s = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no dump {}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}\n{s}", path.display()))
}

/// The world communicator's part of a dump.
fn world(d: &Value) -> &Value {
    d["communicators"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["comm"] == "0x1"))
        .unwrap_or_else(|| panic!("no world communicator in {d}"))
}

/// `hcomm_trace DIR`'s output (it must succeed).
fn trace(dir: &Path) -> String {
    let (o, _) = run_bounded(Command::new(TRACE).arg(dir), Duration::from_secs(30));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    t
}

/// `n` ranks of `hcomm_check stuck` under hcommrun with `HCOMM_TIMEOUT=2`, dumps into `dir`.
fn stuck_job(n: usize, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> String {
    let mut c = Command::new(HCOMMRUN);
    c.args([
        "-n",
        &n.to_string(),
        "--timeout",
        "60",
        "--",
        CHECK,
        "stuck",
    ])
    .args(args)
    .env("HCOMM_TIMEOUT", "2")
    .env("HCOMM_TRACE_DIR", dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let (o, _) = run_bounded(&mut c, Duration::from_secs(90));
    let t = text(&o);
    assert!(o.status.success(), "{env:?} {args:?}:\n{t}");
    t
}

/// One rank skips collective 5 (3 ranks, shared memory: one-sided calls) or 3 (4 ranks over
/// TCP) while its watcher keeps it alive: every other rank's stall warning (at 1 s, then 3 s)
/// names it, and its error at `HCOMM_TIMEOUT` (4 s) names exactly it, with the call, and so
/// does `hcomm_trace` from the dumps (the others' written at their failure, the skipper's
/// through the API), with the skipper's last completed call.
#[test]
fn a_rank_that_skips_a_collective_is_named_by_the_errors_and_by_hcomm_trace() {
    // Both jobs at once: each mostly waits for its stall warnings and its timeout.
    std::thread::scope(|s| {
        for case in [(3, 1, 5, "shm"), (4, 2, 3, "tcp")] {
            s.spawn(move || skipped_collective_is_named(case));
        }
    });
}

/// [`a_rank_that_skips_a_collective_is_named_by_the_errors_and_by_hcomm_trace`] on `n` ranks
/// over `transport`, rank `skip` skipping collective `at`.
fn skipped_collective_is_named((n, skip, at, transport): (usize, usize, usize, &str)) {
    let dir = fresh_dir(&format!("stuck-{transport}"));
    let (skip_s, at_s) = (skip.to_string(), at.to_string());
    let out = stuck_job(
        n,
        &dir,
        &[
            ("HCOMM_TRANSPORT", transport),
            ("HCOMM_TIMEOUT", "4"),
            ("HCOMM_STALL_WARN", "1"),
        ],
        &["--skip", &skip_s, "--at", &at_s, "--hold-ms", "6500"],
    );
    for r in (0..n).filter(|&r| r != skip) {
        // The members are asked half an interval before each warning; the second
        // warning has their answers whatever the load.
        let stall = format!("[{r}] hcomm: rank {r}: stall: allreduce #{at} (");
        let named = format!(
            "; not entered #{at} yet: rank {skip} (world rank {skip}; its last entered: #{})",
            at - 1
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with(&stall) && l.contains(&named)),
            "{transport}: rank {r} warned of no {named:?}:\n{out}"
        );
        let line = format!("[{r}] not-entered allreduce {at} [{skip}] ");
        assert!(out.contains(&line), "{transport}: no {line:?}:\n{out}");
        let d = dump(&dir, r);
        assert!(
            d["reason"] == "timeout" || d["reason"] == "abort",
            "{transport}: rank {r}: {}",
            d["reason"]
        );
        let w = world(&d);
        assert_eq!(w["entered"], at as u64 + 1, "{transport}: rank {r}");
        let last = w["ops"].as_array().and_then(|o| o.last()).expect("ops");
        assert_eq!(last["seq"], at as u64);
        assert_eq!(last["state"], "failed");
        assert_eq!(last["op"], "allreduce");
        assert_eq!(last["dtype"], "int64");
        assert_eq!(last["count"], 16);
    }
    let d = dump(&dir, skip);
    assert_eq!(d["reason"], "api");
    assert_eq!(world(&d)["entered"], at as u64);
    let t = trace(&dir);
    let want = format!(
        "comm 0x1, seq {at}, allreduce: rank {skip} never entered; its last completed seq \
         is {}",
        at - 1
    );
    assert!(t.contains(&want), "{transport}: no {want:?}:\n{t}");
    // Exactly that rank.
    assert_eq!(
        t.matches(" never entered; ").count(),
        1,
        "{transport}:\n{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rank 1 calls a broadcast where the others call an all-reduce: `hcomm_trace` reports the
/// mismatched call with both forms; with `HCOMM_TRACE_BUFFER=4` each dump keeps the last 4
/// calls of the 9 made, and says it is version 1 of the format.
#[test]
fn hcomm_trace_reports_mismatched_calls_and_the_ring_keeps_the_last_n() {
    let dir = fresh_dir("mismatch");
    stuck_job(
        3,
        &dir,
        &[("HCOMM_TRACE_BUFFER", "4")],
        &["--skip", "1", "--at", "8", "--mismatch"],
    );
    for r in 0..3 {
        let d = dump(&dir, r);
        assert_eq!(d["format"], "hcomm-flight-recorder");
        assert_eq!(d["version"], 1);
        assert_eq!(d["rank"], r);
        let w = world(&d);
        assert_eq!(w["capacity"], 4);
        assert_eq!(w["recorded"], 9);
        let seqs: Vec<u64> = w["ops"]
            .as_array()
            .expect("ops")
            .iter()
            .map(|o| o["seq"].as_u64().expect("a numbered call"))
            .collect();
        assert_eq!(seqs, [5, 6, 7, 8], "rank {r}");
    }
    let t = trace(&dir);
    assert!(
        t.contains(
            "comm 0x1, seq 8: mismatched calls: allreduce int64 x16 on ranks [0, 2]; broadcast \
             int64 x16 root 0 on ranks [1]"
        ),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGUSR1 makes a rank busy in its own code (between two all-reduces) write its dump, and
/// does not kill it.
#[test]
fn sigusr1_dumps_the_flight_recorder_of_a_running_rank() {
    let dir = fresh_dir("signal");
    let mut ranks = Ranks::start(
        2,
        None,
        &[
            "observe",
            "--calls",
            "2",
            "--count",
            "8",
            "--pause-ms",
            "3000",
        ],
        |_| {
            let mut c = Command::new(CHECK);
            c.env("HCOMM_TRACE_DIR", &dir);
            c
        },
    );
    ranks.wait_for_lines(&[0, 1], "pid ", Duration::from_secs(30));
    // The first all-reduce is over well before the pause ends.
    std::thread::sleep(Duration::from_millis(800));
    ranks.signal(1, libc::SIGUSR1);
    let path = dir.join("rank1.json");
    let since = Instant::now();
    while !path.exists() && since.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let d = dump(&dir, 1);
    assert_eq!(d["reason"], "signal");
    let ops = world(&d)["ops"].as_array().expect("ops").clone();
    assert!(
        ops.first()
            .is_some_and(|o| o["op"] == "allreduce" && o["seq"] == 0 && o["state"] == "completed"),
        "{ops:?}"
    );
    assert!(!dir.join("rank0.json").exists(), "rank 0 got no signal");
    let status = ranks.finish(Duration::from_secs(30));
    assert!(status.iter().all(|s| s.success()), "{}", ranks.text());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank that aborts the world dumps its flight recorder.
#[test]
fn an_abort_dumps_the_flight_recorder() {
    let dir = fresh_dir("abort");
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", "3", "--timeout", "60", "--", CHECK, "abort"])
        .args(["--aborter", "1", "--pending", "allreduce"])
        .env("HCOMM_TRACE_DIR", &dir);
    let (o, _) = run_bounded(&mut c, Duration::from_secs(90));
    let t = text(&o);
    assert!(
        t.contains("[0] OK abort") && t.contains("[2] OK abort"),
        "{t}"
    );
    let d = dump(&dir, 1);
    assert_eq!(d["reason"], "abort", "{t}");
    let _ = std::fs::remove_dir_all(&dir);
}
