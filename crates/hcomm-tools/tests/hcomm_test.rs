//! `hcomm_test` under hcommrun: every link passes on a healthy job, a link that damages data
//! fails with a non-zero exit, the transport column follows the hosts.

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::Duration;

use hcomm_testkit::run_bounded;

const HCOMMRUN: &str = env!("CARGO_BIN_EXE_hcommrun");
const TEST: &str = env!("CARGO_BIN_EXE_hcomm_test");

/// Runs `hcomm_test args` on `n` ranks (through `sh -c` when `host_ids` lays the ranks out
/// on two "hosts"); returns the output and its text.
fn run(n: usize, args: &[&str], env: &[(&str, &str)], host_ids: bool) -> (Output, String) {
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", &n.to_string(), "--timeout", "100", "--"])
        .env("HCOMM_TIMEOUT", "60");
    if host_ids {
        let script = format!(
            "HCOMM_HOST_ID=host$((HCOMM_RANK % 2)) exec {TEST} {}",
            args.join(" ")
        );
        c.args(["sh", "-c", &script]);
    } else {
        c.arg(TEST).args(args);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let (o, _) = run_bounded(&mut c, Duration::from_secs(150));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o, text)
}

/// Rank 0's link lines: "A->B" to (transport, result).
fn links(text: &str) -> BTreeMap<(usize, usize), (String, String)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("[0] ") else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let Some((a, b)) = f.first().and_then(|l| l.split_once("->")) else {
            continue;
        };
        assert_eq!(f.len(), 6, "a link line has 6 columns: {line}");
        let key = (a.parse().unwrap(), b.parse().unwrap());
        let prev = out.insert(key, (f[1].to_string(), f[5].to_string()));
        assert!(prev.is_none(), "link {key:?} reported twice:\n{text}");
    }
    out
}

/// Small sizes keep the test quick on 2 shared cores; the integrity messages still cross
/// every protocol switch below 1 MiB + 1.
const QUICK: [&str; 4] = ["--bw-size", "2M", "--latency-iters", "20"];

#[test]
fn hcomm_test_passes_every_link_of_4_ranks() {
    let (o, text) = run(4, &[&["--all"], &QUICK[..]].concat(), &[], false);
    assert!(o.status.success(), "{text}");
    let l = links(&text);
    assert_eq!(l.len(), 12, "every ordered pair of 4 ranks:\n{text}");
    for ((a, b), (transport, result)) in &l {
        assert_ne!(a, b);
        assert_eq!(result, "PASS", "{a}->{b}:\n{text}");
        assert_eq!(transport, "shm", "one host: {a}->{b}:\n{text}");
    }
    assert!(text.contains("[0] # 12 links: all PASS"), "{text}");
    // The matrices: a row per sender.
    assert!(text.contains("row = sender, column = receiver"), "{text}");
}

#[test]
fn a_link_that_corrupts_data_fails_and_the_exit_status_says_so() {
    let args = [&["--all", "--corrupt", "2,1"], &QUICK[..]].concat();
    let (o, text) = run(4, &args, &[], false);
    assert!(
        !o.status.success(),
        "a failed link must fail the run:\n{text}"
    );
    let l = links(&text);
    assert_eq!(l.len(), 12, "{text}");
    for ((a, b), (_, result)) in &l {
        let want = if (*a, *b) == (2, 1) { "FAIL" } else { "PASS" };
        assert_eq!(result, want, "{a}->{b}:\n{text}");
    }
    assert!(text.contains("11 PASS, 1 FAIL: 2->1"), "{text}");
}

#[test]
fn the_transport_column_follows_the_hosts_and_pair_tests_one_link() {
    // Two "hosts": even and odd ranks. Links within a host use shared memory, others TCP.
    let (o, text) = run(4, &[&["--all"], &QUICK[..]].concat(), &[], true);
    assert!(o.status.success(), "{text}");
    let l = links(&text);
    assert_eq!(l.len(), 12, "{text}");
    for ((a, b), (transport, result)) in &l {
        let want = if a % 2 == b % 2 { "shm" } else { "tcp" };
        assert_eq!(transport, want, "{a}->{b}:\n{text}");
        assert_eq!(result, "PASS", "{a}->{b}:\n{text}");
    }
    let args = [&["--pair", "3,0"], &QUICK[..]].concat();
    let (o, text) = run(4, &args, &[("HCOMM_TRANSPORT", "tcp")], false);
    assert!(o.status.success(), "{text}");
    let l = links(&text);
    assert_eq!(
        l.into_iter().collect::<Vec<_>>(),
        [((3, 0), ("tcp".to_string(), "PASS".to_string()))],
        "{text}"
    );
}

#[test]
fn one_rank_has_no_links() {
    let (o, text) = run(1, &["--all"], &[], false);
    assert!(!o.status.success(), "{text}");
    assert!(text.contains("no links"), "{text}");
}
