//! Observing running jobs: hcomm_profiler attached to a job, stall warnings that name the
//! rank everyone waits for, and Chrome traces.

use std::process::Command;
use std::time::Duration;

use hcomm_testkit::{run_bounded, text, Ranks};

const HCOMMRUN: &str = env!("CARGO_BIN_EXE_hcommrun");
const CHECK: &str = env!("CARGO_BIN_EXE_hcomm_check");
const PROFILER: &str = env!("CARGO_BIN_EXE_hcomm_profiler");

/// The pid a rank of `hcomm_check observe` printed.
fn pid_of(ranks: &Ranks, r: usize) -> String {
    ranks.output[r]
        .iter()
        .find_map(|l| l.strip_prefix("pid "))
        .unwrap_or_else(|| panic!("rank {r} printed no pid:\n{}", ranks.text()))
        .to_owned()
}

/// The columns of the profiler's `allreduce` row after `header` (a `rank N of M` line).
fn allreduce_row<'a>(out: &'a str, header: &str) -> Vec<&'a str> {
    out.lines()
        .skip_while(|l| !l.starts_with(header))
        .find(|l| l.trim_start().starts_with("allreduce "))
        .unwrap_or_else(|| panic!("no allreduce row after {header:?}:\n{out}"))
        .split_whitespace()
        .collect()
}

#[test]
fn profiler_attaches_to_a_running_job_and_reads_its_allreduces() {
    let mut ranks = Ranks::start(
        2,
        None,
        &["observe", "--calls", "400", "--pause-ms", "5"],
        |_| Command::new(CHECK),
    );
    ranks.wait_for_lines(&[0, 1], "pid ", Duration::from_secs(60));
    let pid = pid_of(&ranks, 1);

    let (o, _) = run_bounded(
        Command::new(PROFILER).args(["--pid", &pid, "--once", "--job", "--interval", "500"]),
        Duration::from_secs(30),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for r in 0..2 {
        let header = format!("rank {r} of 2, pid {}", pid_of(&ranks, r));
        let row = allreduce_row(&out, &header);
        // operation count rate/s bytes(2 words) time(s) avg(us) recent(us) algorithm ...
        let count: u64 = row[1].parse().unwrap_or_else(|_| panic!("{row:?}\n{out}"));
        assert!(count > 0, "{out}");
        let avg: f64 = row[6]
            .parse()
            .unwrap_or_else(|_| panic!("untimed: {row:?}\n{out}"));
        assert!(avg > 0.0, "{out}");
        assert_ne!(row[8], "-", "no algorithm: {out}");
    }

    // The job runs on, unharmed by the profiler.
    let status = ranks.finish(Duration::from_secs(100));
    assert!(status.iter().all(|s| s.success()), "{}", ranks.text());

    let (o, _) = run_bounded(
        Command::new(PROFILER).args(["--pid", &std::process::id().to_string(), "--once"]),
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("is not an hcomm rank"), "{}", text(&o));
}

/// Runs 3 ranks of `hcomm_check observe` in which rank 2 comes 1.5 s late to the second
/// all-reduce, with `env`; returns what each rank printed.
fn late_rank(env: &[(&str, &str)]) -> Vec<String> {
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", "3", "--timeout", "100", "--", CHECK, "observe"])
        .args(["--calls", "3", "--count", "50000", "--late", "2"])
        .args(["--late-ms", "1500", "--late-call", "1"])
        .env("HCOMM_TIMEOUT", "60")
        .env_remove("HCOMM_LOG_LEVEL");
    for (k, v) in env {
        c.env(k, v);
    }
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let t = text(&o);
    assert!(o.status.success(), "{env:?}:\n{t}");
    (0..3)
        .map(|r| {
            let prefix = format!("[{r}] ");
            t.lines()
                .filter_map(|l| l.strip_prefix(&prefix))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

/// The stall warnings of a rank's output.
fn stalls(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.contains(": stall: ")).collect()
}

#[test]
fn ranks_that_wait_for_a_late_rank_log_the_stall_naming_it() {
    for transport in ["shm", "tcp"] {
        let out = late_rank(&[("HCOMM_STALL_WARN", "0.3"), ("HCOMM_TRANSPORT", transport)]);
        for (r, o) in out.iter().enumerate().take(2) {
            let s = stalls(o);
            // At 0.3, 0.9 and 2.1 s at most: the interval doubles.
            assert!((1..=3).contains(&s.len()), "{transport}: rank {r}:\n{o}");
            for line in s {
                assert!(line.contains("stall: allreduce #1 (200000 B, 3 ranks, algorithm "));
                assert!(line.contains("for rank 2 (world rank 2)"), "{line}");
            }
        }
        assert!(
            stalls(&out[2]).is_empty(),
            "{transport}: the late rank:\n{}",
            out[2]
        );
    }
    let out = late_rank(&[("HCOMM_STALL_WARN", "0")]);
    assert!(out.iter().all(|o| stalls(o).is_empty()), "{out:?}");
}

#[test]
fn a_trace_holds_one_complete_event_per_operation() {
    let dir = std::env::temp_dir().join(format!("hcomm-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t-%r.json");
    let (o, _) = run_bounded(
        Command::new(HCOMMRUN)
            .args([
                "-n",
                "2",
                "--timeout",
                "100",
                "--",
                CHECK,
                "observe",
                "--calls",
                "7",
            ])
            .env("HCOMM_TRACE", &path),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", text(&o));
    let mut spans = Vec::new();
    for r in 0..2 {
        let file = dir.join(format!("t-{r}.json"));
        let json = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let events: Vec<&serde_json::Value> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        assert_eq!(events.len(), 7, "{json}");
        for (seq, e) in events.iter().enumerate() {
            assert_eq!(e["name"], "allreduce");
            assert_eq!(e["pid"], r);
            assert_eq!(e["args"]["seq"], seq);
            assert_eq!(e["args"]["bytes"], 4096);
            assert!(e["ts"].as_f64().is_some() && e["dur"].as_f64().unwrap() >= 0.0);
        }
        let (ts, dur) = (events[3]["ts"].as_f64(), events[3]["dur"].as_f64());
        spans.push((ts.unwrap(), ts.unwrap() + dur.unwrap()));
    }
    // Both ranks read the host's monotonic clock, and neither part of an all-reduce can end
    // before the other has begun (each needs the other's contribution): the parts overlap.
    let ((a0, a1), (b0, b1)) = (spans[0], spans[1]);
    assert!(a0 <= b1 && b0 <= a1, "{spans:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
