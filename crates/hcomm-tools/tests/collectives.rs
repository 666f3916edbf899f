//! Multi-process collective tests over TCP: every collective, data type and op against the
//! sequential reference on 1..8 ranks, forced algorithms, mismatches, nonblocking overlap.

use std::process::Command;
use std::time::Duration;

use hcomm_testkit::{collect_outputs, local_root, run_bounded, spawn_ranks};

const HCOMMRUN: &str = env!("CARGO_BIN_EXE_hcommrun");
const CHECK: &str = env!("CARGO_BIN_EXE_hcomm_check");

/// Runs `prog` under hcommrun on `n` ranks with `env`; returns the output, asserting success.
fn run_job(n: usize, env: &[(&str, &str)], prog: &[&str]) -> String {
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", &n.to_string(), "--timeout", "200", "--"])
        .args(prog)
        .env("HCOMM_TIMEOUT", "60");
    for (k, v) in env {
        c.env(k, v);
    }
    let (o, _) = run_bounded(&mut c, Duration::from_secs(240));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success(),
        "{prog:?} with {env:?} on {n} ranks failed:\n{text}"
    );
    text
}

/// Runs hcomm_check `args` on `n` ranks; every rank must report OK.
fn job(n: usize, env: &[(&str, &str)], args: &[&str]) {
    let text = run_job(n, env, &[&[CHECK], args].concat());
    for r in 0..n {
        assert!(
            text.contains(&format!("[{r}] OK {}", args[0])),
            "rank {r} did not finish:\n{text}"
        );
    }
}

#[test]
fn every_collective_type_and_op_on_1_2_3_ranks() {
    for n in [1, 2, 3] {
        job(n, &[], &["collectives"]);
    }
}

#[test]
fn every_collective_type_and_op_on_5_and_8_ranks() {
    for n in [5, 8] {
        job(n, &[], &["collectives", "--max-count", "5000"]);
    }
}

#[test]
fn forced_algorithms_give_the_same_results() {
    for algo in ["direct", "ring", "rabenseifner", "recursive_doubling"] {
        let spec = format!("allreduce:{algo}");
        job(
            4,
            &[("HCOMM_ALGO", &spec)],
            &["collectives", "--only", "allreduce", "--max-count", "70000"],
        );
        job(
            3,
            &[("HCOMM_ALGO", &spec)],
            &["collectives", "--only", "allreduce", "--max-count", "5000"],
        );
    }
    for spec in [
        "broadcast:ring",
        "reduce_scatter:rabenseifner",
        "allgather:ring",
        "reduce:ring",
        "allreduce:tree",
        "allreduce:dbtree",
        "allreduce:hier",
        "broadcast:tree",
        "broadcast:dbtree",
        "reduce:dbtree",
        "gather:tree",
        "scatter:tree",
        "allgather:bruck",
        "allgather:hier",
        "alltoall:bruck",
        "alltoall:pairwise",
        "alltoallv:pairwise",
        "barrier:dissemination",
    ] {
        let only = spec.split(':').next().unwrap();
        job(
            5,
            &[("HCOMM_ALGO", spec)],
            &["collectives", "--only", only, "--max-count", "70000"],
        );
    }
}

#[test]
fn an_unknown_algorithm_is_an_error_listing_the_valid_ones() {
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", "2", "--", CHECK, "hello"])
        .env("HCOMM_ALGO", "allreduce:warp");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        text.contains("warp") && text.contains("ring") && text.contains("direct"),
        "{text}"
    );
}

#[test]
fn mismatched_calls_fail_on_every_rank() {
    for n in [2, 3, 5] {
        job(
            n,
            &[("HCOMM_ALGO", "barrier:direct"), ("HCOMM_TIMEOUT", "20")],
            &["mismatch"],
        );
    }
}

#[test]
fn nonblocking_collectives_overlap_and_batches_fuse() {
    for n in [2, 4] {
        job(n, &[], &["overlap"]);
    }
}

#[test]
fn deterministic_mode_is_bitwise_reproducible_across_algorithms() {
    for algo in [
        "allreduce:ring",
        "allreduce:rabenseifner",
        "allreduce:recursive_doubling,reduce:ring",
    ] {
        job(
            4,
            &[("HCOMM_DETERMINISTIC", "1"), ("HCOMM_ALGO", algo)],
            &["deterministic"],
        );
    }
    job(3, &[("HCOMM_DETERMINISTIC", "1")], &["deterministic"]);
    // Two ranks keep their fastest algorithm: the result is still the rank-order one.
    job(2, &[("HCOMM_DETERMINISTIC", "1")], &["deterministic"]);
}

#[test]
fn ranks_spanning_hosts_use_the_hierarchical_algorithms() {
    // Three "hosts" of 2, 2 and 1 ranks, laid out by HCOMM_HOST_ID; ranks of a host are not
    // contiguous (rank r on host r % 3).
    let script =
        format!("HCOMM_HOST_ID=host$((HCOMM_RANK % 3)) exec {CHECK} collectives --max-count 70000");
    let text = run_job(5, &[], &["sh", "-c", &script]);
    assert_eq!(text.matches("OK collectives").count(), 5, "{text}");
    // Forced hier on 4 ranks (hosts of 2, 1, 1): all-reduce runs tiered, its host stage
    // one-sided through shared memory.
    run_job(
        4,
        &[("HCOMM_ALGO", "allreduce:hier,allgather:hier")],
        &["sh", "-c", &script],
    );
}

#[test]
fn a_rank_dying_mid_collective_fails_the_others_fast() {
    // Started by hand, without a launcher that would stop the job: the survivors must
    // notice by themselves, long before HCOMM_TIMEOUT (100 s here).
    let t0 = std::time::Instant::now();
    let children = spawn_ranks(4, &local_root(), |_| {
        let mut c = Command::new(CHECK);
        c.arg("coll-exit").env("HCOMM_TIMEOUT", "100");
        c
    });
    let outputs = collect_outputs(children, Duration::from_secs(60));
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(outputs[1].status.code(), Some(3));
    for r in [0, 2, 3] {
        let text = String::from_utf8_lossy(&outputs[r].stderr);
        assert!(!outputs[r].status.success(), "rank {r} should fail");
        assert!(
            text.contains("peer lost") || text.contains("aborted"),
            "rank {r}: {text}"
        );
    }
}

#[test]
fn ranks_with_different_algorithms_get_a_mismatch() {
    let script = format!(
        "if [ \"$HCOMM_RANK\" = 1 ]; then A=ring; else A=rabenseifner; fi; \
         HCOMM_ALGO=allreduce:$A,barrier:direct exec {CHECK} algo-mismatch"
    );
    let text = run_job(3, &[("HCOMM_TIMEOUT", "20")], &["sh", "-c", &script]);
    assert!(
        text.contains("via ring") && text.contains("via rabenseifner"),
        "{text}"
    );
}

#[test]
fn every_collective_with_tcp_forced_and_without_cross_memory_attach() {
    // The default run above goes through shared memory; these cover the other two paths.
    job(3, &[("HCOMM_TRANSPORT", "tcp")], &["collectives"]);
    job(3, &[("HCOMM_CMA", "off")], &["collectives"]);
}

#[test]
fn every_collective_with_tiny_shared_memory_thresholds() {
    // Every protocol inside the collectives: inline <= 64 B, pull <= 8 KiB, pushes in 4 KiB
    // chunks through 128 KiB rings, with heap memory of every size.
    let small = [
        ("HCOMM_SHM_EAGER_LIMIT", "64"),
        ("HCOMM_SHM_PUSH_THRESHOLD", "8192"),
        ("HCOMM_SHM_CHUNK", "4096"),
        ("HCOMM_SHM_RING", "131072"),
    ];
    for n in [2, 4] {
        job(n, &small, &["collectives", "--max-count", "20000"]);
    }
}

#[test]
fn every_collective_with_pulls_in_small_pieces_on_2_4_8_ranks() {
    // Every message above 64 B pulled out of the sender's heap buffer in 4 KiB pieces (the
    // sizes straddle the piece), and the large one-sided calls writing their results into the
    // peers' heap buffers; 8 ranks outnumber the cores.
    let small = [("HCOMM_SHM_EAGER_LIMIT", "64"), ("HCOMM_SHM_CHUNK", "4096")];
    for n in [2, 4] {
        job(n, &small, &["collectives", "--max-count", "20000"]);
    }
    job(8, &small, &["collectives", "--max-count", "3000"]);
}

#[test]
fn every_collective_on_pool_memory_on_1_2_3_5_8_ranks() {
    // Buffers from the shared-memory pool: peers read them in place where they can.
    for n in [1, 2, 3] {
        job(n, &[], &["collectives", "--pool"]);
    }
    for n in [5, 8] {
        job(n, &[], &["collectives", "--pool", "--max-count", "5000"]);
    }
}
