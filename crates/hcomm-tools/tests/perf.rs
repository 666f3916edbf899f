//! `hcomm_perf` under hcommrun: `-a` sweeps every algorithm, `--plot` draws a curve per
//! (collective, algorithm) and per peer, `-J` rows say their algorithm and curve.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hcomm::internal::coll::algos;
use hcomm::CollKind;

use hcomm_testkit::run_bounded;

const HCOMMRUN: &str = env!("CARGO_BIN_EXE_hcommrun");
const PERF: &str = env!("CARGO_BIN_EXE_hcomm_perf");

/// A fresh path for this test's `name`.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs `hcomm_perf args` on `n` ranks; returns the output text, asserting success.
fn perf(n: usize, args: &[&str]) -> String {
    perf_with(n, args, &[])
}

/// [`perf`] with the variables `env` added to every rank's environment.
fn perf_with(n: usize, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", &n.to_string(), "--timeout", "150", "--", PERF])
        .args(args)
        .env("HCOMM_TIMEOUT", "60")
        .envs(env.iter().copied());
    let (o, _) = run_bounded(&mut c, Duration::from_secs(200));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "hcomm_perf {args:?} failed:\n{text}");
    text
}

/// The curves of an SVG picture: (collective, source, algorithm), after checking that it is
/// well-formed SVG.
fn curves(svg: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the picture is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    root.descendants()
        .filter(|n| n.attribute("class") == Some("curve"))
        .map(|n| {
            let a = |k| n.attribute(k).expect("curve attributes").to_string();
            (a("data-collective"), a("data-source"), a("data-algo"))
        })
        .collect()
}

fn owned(c: &str, s: &str, a: &str) -> (String, String, String) {
    (c.to_string(), s.to_string(), a.to_string())
}

/// Quick sweeps: two sizes, a fixed number of iterations.
const QUICK: [&str; 10] = ["-b", "8", "-e", "4K", "-f", "64", "-n", "5", "-w", "1"];

#[test]
fn all_algos_plot_has_a_curve_per_collective_algorithm_and_peer() {
    // A peer in hcomm_perf's own JSON: an earlier run with hcomm's choice.
    let base = scratch("base.json");
    perf(
        2,
        &[&["allreduce", "-J", base.to_str().unwrap()], &QUICK[..]].concat(),
    );
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&base).unwrap()).unwrap();
    for r in rows.as_array().unwrap() {
        assert_eq!(r["curve"], "auto", "{r}");
        assert!(r["algo"].is_string(), "{r}");
    }
    // A peer in mpi_bench's text: the Open MPI run of the committed benchmark summary.
    let ompi = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/results/coll_tcp_summary.txt"
    );
    let svg = scratch("all.svg");
    let json = scratch("all.json");
    let ompi_peer = format!("ompi={ompi}");
    let base_peer = format!("base={}", base.display());
    let args = [
        &["all", "-a", "--plot", svg.to_str().unwrap()][..],
        &["-J", json.to_str().unwrap()],
        &["--peer", &ompi_peer],
        &["--peer", &base_peer],
        &QUICK[..],
    ]
    .concat();
    let text = perf(3, &args);

    // One host with shared memory: every algorithm runs, onesided too.
    let mut want = Vec::new();
    let measured = CollKind::ALL.into_iter().filter(|k| {
        !matches!(
            k,
            CollKind::AllGatherV | CollKind::AllToAllV | CollKind::Barrier
        )
    });
    for k in measured {
        for a in algos::names_for(k) {
            want.push(owned(k.name(), "hcomm", a));
        }
    }
    // The peers' curves of the collectives measured: mpi_bench's allreduce, bcast and
    // allgather, and the base run's allreduce.
    want.push(owned("allreduce", "ompi", ""));
    want.push(owned("broadcast", "ompi", ""));
    want.push(owned("allgather", "ompi", ""));
    want.push(owned("allreduce", "base", "auto"));
    let got = curves(&svg);
    let got_set: BTreeSet<_> = got.iter().cloned().collect();
    assert_eq!(got_set.len(), got.len(), "a curve drawn twice: {got:?}");
    assert_eq!(got_set, want.into_iter().collect(), "{text}");

    // The JSON's rows name the curve they belong to, and it is what ran.
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for r in rows.as_array().unwrap() {
        assert_eq!(r["curve"], r["algo"], "{r}");
    }
}

#[test]
fn a_point_to_point_plot_and_a_peer_without_matching_results() {
    let svg = scratch("pingpong.svg");
    let ompi = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/results/coll_tcp_summary.txt"
    );
    let ompi_peer = format!("ompi={ompi}");
    let args = [
        &["pingpong", "--plot", svg.to_str().unwrap()][..],
        &["--peer", &ompi_peer],
        &QUICK[..],
    ]
    .concat();
    let text = perf(2, &args);
    assert_eq!(curves(&svg), [owned("pingpong", "hcomm", "")]);
    assert!(
        text.contains("--peer ompi: no results of the operations measured here"),
        "{text}"
    );
}

#[test]
fn an_unreadable_peer_fails_before_the_sweep() {
    let svg = scratch("bad.svg");
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", "2", "--", PERF, "allreduce", "--plot"])
        .arg(&svg)
        .args(["--peer", "x=/nonexistent/results.txt"])
        .env("HCOMM_TIMEOUT", "30");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        text.contains("--peer x: cannot read /nonexistent/results.txt"),
        "{text}"
    );
}

/// Collectives on pool buffers of 64 MiB and more (default pool settings: the 128 MiB
/// all-gather output gets a block of its own): results are pushed into the peers' receive
/// buffers with non-temporal stores, from a staging buffer; every byte is checked.
#[test]
fn large_pool_collectives_stream_correct_results() {
    let calls = [
        (2, "allreduce", "64M"),
        (2, "broadcast", "64M"),
        (2, "allgather", "128M"),
        (3, "allreduce", "64M"),
    ];
    for (n, op, size) in calls {
        let mut c = Command::new(HCOMMRUN);
        c.args(["-n", &n.to_string(), "--timeout", "150", "--", PERF, op])
            .args(["-b", size, "-e", size, "-n", "1", "-w", "1", "-c", "2"])
            .args(["--mem", "pool"])
            .env("HCOMM_TIMEOUT", "60")
            .env_remove("HCOMM_POOL_BLOCK")
            .env_remove("HCOMM_POOL_MAX");
        let (o, _) = run_bounded(&mut c, Duration::from_secs(200));
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{op} {size} on {n} ranks failed:\n{text}"
        );
        assert!(
            text.contains("Out of bounds values : 0 OK"),
            "{op} {size} on {n} ranks got wrong results:\n{text}"
        );
    }
}

/// The numbers of rank 0's transport line: peers through shared memory, peers with a TCP
/// connection, peers, then messages through shared memory, TCP, plug-in or libfabric.
fn transport(text: &str) -> [u64; 6] {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("[0] # transport of rank 0:"))
        .unwrap_or_else(|| panic!("no transport line:\n{text}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    numbers
        .try_into()
        .unwrap_or_else(|n| panic!("{n:?} in {line}"))
}

/// Rank 0 says how its peers were reached and what carried the messages (the TCP
/// benchmarks between simulated hosts check it): shared memory on one host, TCP when told.
#[test]
fn the_transport_line_says_what_carried_the_messages() {
    let quick = [&["pingpong"], &QUICK[..]].concat();
    let [shm_peers, tcp_peers, peers, shm, tcp, other] = transport(&perf(2, &quick));
    assert_eq!((shm_peers, tcp_peers, peers, tcp, other), (1, 0, 1, 0, 0));
    assert!(shm > 0);
    let tcp_only = [("HCOMM_TRANSPORT", "tcp")];
    for op in ["pingpong", "allreduce"] {
        let args = [&[op], &QUICK[..]].concat();
        let [shm_peers, tcp_peers, peers, shm, tcp, other] =
            transport(&perf_with(2, &args, &tcp_only));
        assert_eq!(
            (shm_peers, tcp_peers, peers, shm, other),
            (0, 1, 1, 0, 0),
            "{op}"
        );
        assert!(tcp > 0, "{op}");
    }
}
