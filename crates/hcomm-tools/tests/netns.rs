//! Several hosts on one machine: network namespaces joined by veth pairs to a bridge, two
//! ranks in each "host" (told apart by `HCOMM_HOST_ID`, since namespaces share the hostname
//! and boot id; `/dev/shm` stays shared, as between the ranks of one real host). The ranks
//! must use shared memory inside a host and TCP between hosts, get every collective right,
//! run the hierarchical all-reduce, and fail fast when one host's ranks are killed.
//!
//! Namespaces need root and `ip`; without them each test says it is skipped and passes. The
//! names hold this process's id and a counter, so concurrent tests and runs do not collide,
//! and the namespaces (with their links) are removed when a test ends, failed or not.

use std::process::Command;
use std::time::{Duration, Instant};

use hcomm_testkit::netns::{ip, Hosts, PER_HOST};
use hcomm_testkit::{unix_ns, Ranks};

const CHECK: &str = env!("CARGO_BIN_EXE_hcomm_check");
const PERF: &str = env!("CARGO_BIN_EXE_hcomm_perf");
const PROFILER: &str = env!("CARGO_BIN_EXE_hcomm_profiler");
/// Waits for a job that must succeed; returns its output.
fn succeed(job: &mut Ranks, limit: Duration) -> String {
    let status = job.finish(limit);
    let text = job.text();
    for (r, s) in status.iter().enumerate() {
        assert!(s.success(), "rank {r}: {s}\n{text}");
    }
    text
}

#[test]
fn shared_memory_inside_hosts_and_tcp_between_with_every_collective_right() {
    let Some(hosts) = Hosts::create("netns collectives", 3) else {
        return;
    };
    let before = hosts.rx_bytes(1);
    let mut job = hosts.start(CHECK, &["collectives"], &[("HCOMM_DEBUG", "1")]);
    let text = succeed(&mut job, Duration::from_secs(200));
    for r in 0..3 * PER_HOST {
        assert!(
            text.contains(&format!("[{r}] OK collectives")),
            "rank {r}:\n{text}"
        );
        // The other rank of its host, and no one else.
        let mate = r ^ 1;
        let line = format!("[{r}] hcomm: rank {r}: shared memory with world ranks [{mate}]");
        assert!(
            text.contains(&line),
            "rank {r} does not share memory with {mate}:\n{text}"
        );
    }
    let crossed = hosts.rx_bytes(1) - before;
    assert!(
        crossed > 1 << 20,
        "only {crossed} bytes crossed the link of host 1"
    );
}

#[test]
fn hierarchical_allreduce_across_hosts() {
    let Some(hosts) = Hosts::create("netns hier", 2) else {
        return;
    };
    let algo = [("HCOMM_ALGO", "allreduce:hier")];
    let args = ["collectives", "--only", "allreduce", "--max-count", "70000"];
    let mut job = hosts.start(CHECK, &args, &algo);
    succeed(&mut job, Duration::from_secs(200));
    // hcomm_perf names the algorithm of every size and checks the results: forced, and as
    // the cost model chooses.
    for forced in [true, false] {
        let args = [
            "allreduce",
            "-b",
            "4K",
            "-e",
            "16M",
            "-f",
            "64",
            "-n",
            "3",
            "-w",
            "1",
        ];
        let env: &[(&str, &str)] = if forced { &algo } else { &[] };
        let mut job = hosts.start(PERF, &args, env);
        let text = succeed(&mut job, Duration::from_secs(200));
        let rows: Vec<Vec<&str>> = job.output[0]
            .iter()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 3, "{text}");
        for row in &rows {
            assert_eq!(row[8], "0", "wrong elements: {row:?}");
        }
        let algos: Vec<&str> = rows.iter().map(|row| row[9]).collect();
        println!("allreduce on 2 hosts x {PER_HOST}, forced {forced}: {algos:?}");
        // Unforced, the cost model prefers a flat algorithm at these sizes (printed above).
        if forced {
            assert!(algos.iter().all(|a| *a == "hier"), "{text}");
        }
    }
}

#[test]
fn the_others_fail_fast_when_one_hosts_ranks_are_killed() {
    let Some(hosts) = Hosts::create("netns host failure", 3) else {
        return;
    };
    let args = ["peer-loss", "--victims", "2,3", "--pending", "allreduce"];
    let mut job = hosts.start(CHECK, &args, &[]);
    job.wait_for_lines(&[0, 1, 2, 3, 4, 5], "ready ", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let killed = unix_ns();
    job.kill(2);
    job.kill(3);
    let status = job.finish(Duration::from_secs(30));
    let elapsed = t0.elapsed();
    let text = job.text();
    let mut named = 0;
    for r in [0, 1, 4, 5] {
        assert!(status[r].success(), "rank {r}: {}\n{text}", status[r]);
        let lost = job.output[r]
            .iter()
            .find_map(|l| l.strip_prefix("lost "))
            .unwrap_or_else(|| panic!("rank {r} did not notice:\n{text}"));
        let at: u128 = lost.split(' ').next().unwrap().parse().unwrap();
        let latency = Duration::from_nanos(at.saturating_sub(killed) as u64);
        println!("rank {r} failed {latency:.2?} after the kill: {lost}");
        // The error's peer field (hcomm_check prints it after the code), not its message.
        if lost.contains("PeerLost world rank 2:") || lost.contains("PeerLost world rank 3:") {
            named += 1;
        }
    }
    // Rank 3 may notice rank 2's death (shared memory, same host) and abandon the
    // all-reduce before it is killed itself: its notice names rank 2, so every survivor names
    // a killed rank, however the kills and the notices interleave.
    assert_eq!(named, 4, "a survivor did not name a killed rank:\n{text}");
    assert!(
        elapsed < Duration::from_secs(10),
        "took {elapsed:?}:\n{text}"
    );
}

#[test]
fn a_partition_leaves_the_majority_to_shrink_and_the_minority_without_quorum() {
    let Some(hosts) = Hosts::create("netns partition", 3) else {
        return;
    };
    // Heartbeats lose the other side after HCOMM_TIMEOUT / 2.
    let mut job = hosts.start(CHECK, &["shrink"], &[("HCOMM_TIMEOUT", "4")]);
    let all = [0, 1, 2, 3, 4, 5];
    job.wait_for_lines(&all, "ready ", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300));
    // Cut host 2 (ranks 4 and 5) off the bridge; both sides stay alive.
    let first = hosts.names[0].clone();
    ip(&["-n", &first, "link", "set", "h2", "down"]).unwrap_or_else(|e| panic!("{e}"));
    let status = job.finish(Duration::from_secs(60));
    let text = job.text();
    for r in all {
        assert!(status[r].success(), "rank {r}: {}\n{text}", status[r]);
    }
    for r in [0, 1, 2, 3] {
        let shrunk = job.output[r]
            .iter()
            .find_map(|l| l.strip_prefix("shrunk "))
            .unwrap_or_else(|| panic!("rank {r} of the majority did not shrink:\n{text}"));
        assert_eq!(shrunk, "4 failed [4, 5]", "rank {r}:\n{text}");
    }
    for r in [4, 5] {
        assert!(
            job.output[r].iter().any(|l| l == "OK quorum"),
            "rank {r} of the minority did not get Quorum:\n{text}"
        );
    }
}

/// libfabric's tcp provider between the hosts, forced (`HCOMM_TRANSPORT=ofi`).
const OFI: [(&str, &str); 2] = [("HCOMM_TRANSPORT", "ofi"), ("FI_PROVIDER", "tcp")];
/// [`OFI`] with direct collective steps on (`HCOMM_OFI_DIRECT=1`, the default, said outright).
const DIRECT: [(&str, &str); 3] = [OFI[0], OFI[1], ("HCOMM_OFI_DIRECT", "1")];

/// Every collective, and point-to-point sizes on both sides of the eager (64 KiB) and RDMA
/// write (1 MiB) thresholds, right through libfabric between hosts, each rank's endpoint on its
/// host's interface; every protocol taken.
#[test]
fn libfabric_between_hosts_every_collective_and_protocol_right() {
    let Some(hosts) = Hosts::create("netns ofi", 2) else {
        return;
    };
    let env = [OFI[0], OFI[1], ("HCOMM_DEBUG", "1")];
    let mut job = hosts.start(CHECK, &["collectives"], &env);
    let text = succeed(&mut job, Duration::from_secs(300));
    for r in 0..2 * PER_HOST {
        let host = hosts.addr(r / PER_HOST);
        let line = format!("[{r}] hcomm: rank {r}: libfabric: provider tcp;ofi_rxm, fabric ");
        let fabric = text
            .lines()
            .find(|l| l.starts_with(&line))
            .unwrap_or_else(|| panic!("rank {r} did not use libfabric:\n{text}"));
        // The endpoint sits on the host's interface (10.77.0.0/24), not on loopback.
        assert!(fabric.contains("10.77.0."), "rank {r} ({host}): {fabric}");
        assert!(text.contains(&format!("[{r}] OK collectives")), "{text}");
    }
    for args in [&["ring"][..], &["protocols"]] {
        let mut job = hosts.start(CHECK, args, &OFI);
        let text = succeed(&mut job, Duration::from_secs(300));
        for r in 0..2 * PER_HOST {
            assert!(text.contains(&format!("[{r}] OK {}", args[0])), "{text}");
        }
        if args[0] == "protocols" {
            every_ofi_protocol_taken(&job, &text, &["eager=", "read=", "write="]);
        }
    }
}

/// A libfabric of major version 2 to test against: `HCOMM_TEST_OFI_LIB2` when set (empty: no
/// such test), else Intel's 2.4 where `bench/intel/setup.sh` put it.
fn libfabric_2() -> Option<String> {
    let lib = std::env::var("HCOMM_TEST_OFI_LIB2")
        .unwrap_or_else(|_| "/opt/hcomm-peers/intel/lib/libfabric.so.1".into());
    (!lib.is_empty() && std::path::Path::new(&lib).exists()).then_some(lib)
}

/// hcomm on a libfabric 2.x (`HCOMM_OFI_LIB`, here Intel's 2.4, whose tcp provider offers a
/// native reliable-datagram endpoint rather than Debian 1.17's `tcp;ofi_rxm`): every
/// collective and point-to-point sizes across the eager and RDMA write thresholds right
/// between hosts, every protocol taken.
#[test]
fn libfabric_2_between_hosts_every_collective_and_protocol_right() {
    let Some(lib) = libfabric_2() else {
        eprintln!("no libfabric 2.x (HCOMM_TEST_OFI_LIB2, or bench/intel/setup.sh): skipped");
        return;
    };
    let Some(hosts) = Hosts::create("netns ofi 2.x", 2) else {
        return;
    };
    // Intel's build keeps its providers (libtcp-fi.so) beside the library, where it finds
    // them only when told.
    let dir = std::path::Path::new(&lib)
        .parent()
        .map(|d| d.display().to_string());
    let env = [
        OFI[0],
        OFI[1],
        ("HCOMM_OFI_LIB", lib.as_str()),
        ("FI_PROVIDER_PATH", dir.as_deref().unwrap_or(".")),
        ("HCOMM_DEBUG", "1"),
    ];
    let mut job = hosts.start(CHECK, &["collectives"], &env);
    let text = succeed(&mut job, Duration::from_secs(300));
    for r in 0..2 * PER_HOST {
        let line = format!("[{r}] hcomm: rank {r}: libfabric: provider tcp, fabric ");
        assert!(
            text.contains(&line),
            "rank {r} did not use {lib}'s tcp:\n{text}"
        );
        assert!(text.contains(&format!("[{r}] OK collectives")), "{text}");
    }
    let mut job = hosts.start(CHECK, &["protocols"], &env[..4]);
    let text = succeed(&mut job, Duration::from_secs(300));
    for r in 0..2 * PER_HOST {
        assert!(text.contains(&format!("[{r}] OK protocols")), "{text}");
    }
    every_ofi_protocol_taken(&job, &text, &["eager=", "read=", "write="]);
}

/// Every rank of `job` printed its libfabric counts (`ofi eager= read= write= ...`), each of
/// `protocols` nonzero.
fn every_ofi_protocol_taken(job: &Ranks, text: &str, protocols: &[&str]) {
    for (r, out) in job.output.iter().enumerate() {
        let line = out
            .iter()
            .find(|l| l.starts_with("ofi "))
            .unwrap_or_else(|| panic!("rank {r} printed no ofi counts:\n{text}"));
        let count = |k: &str| -> u64 {
            let w = line.split(' ').find_map(|w| w.strip_prefix(k)).unwrap();
            w.parse().unwrap()
        };
        for k in protocols {
            assert!(count(k) > 0, "rank {r} took no {k} frame: {line}");
        }
    }
}

/// `hcomm_profiler --job`, attached to a job over libfabric between two hosts once its ranks
/// ran messages of every size and an all-reduce, shows each rank's provider and nonzero frames
/// of each protocol (eager, RDMA read, RDMA write, and direct collective steps, on by
/// default).
#[test]
fn the_profiler_shows_every_libfabric_protocol_of_a_job_between_hosts() {
    let Some(hosts) = Hosts::create("netns ofi profiler", 2) else {
        return;
    };
    let n = 2 * PER_HOST;
    let mut job = hosts.start(CHECK, &["protocols", "--linger-ms", "5000"], &OFI);
    let all: Vec<usize> = (0..n).collect();
    job.wait_for_lines(&all, "pid ", Duration::from_secs(120));
    let pid = job.output[0]
        .iter()
        .find_map(|l| l.strip_prefix("pid "))
        .unwrap_or_default()
        .to_owned();
    let (o, _) = hcomm_testkit::run_bounded(
        Command::new(PROFILER).args(["--pid", &pid, "--once", "--job", "--interval", "500"]),
        Duration::from_secs(30),
    );
    let out = hcomm_testkit::text(&o);
    assert!(o.status.success(), "{out}");
    succeed(&mut job, Duration::from_secs(120));
    for r in 0..n {
        let line = out
            .lines()
            .skip_while(|l| !l.starts_with(&format!("rank {r} of {n},")))
            .find_map(|l| l.trim_start().strip_prefix("libfabric "))
            .unwrap_or_else(|| panic!("no libfabric line for rank {r}:\n{out}"));
        assert!(line.starts_with("tcp;ofi_rxm: "), "rank {r}: {line}");
        for p in ["eager ", "rdma-read ", "rdma-write ", "direct "] {
            let count: u64 = line
                .split(p)
                .nth(1)
                .and_then(|rest| rest.split(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("rank {r}: no {p}count: {line}"));
            assert!(count > 0, "rank {r} shows no {p}frame: {line}");
        }
        println!("rank {r}: libfabric {line}");
    }
}

/// Through libfabric, a host whose ranks are killed (SIGKILL) in the middle of all-reduces of
/// 256 KiB (their steps of 64 KiB or more written straight into the peers' receives: direct
/// steps): the others fail with PeerLost naming one of them, fast; on two hosts, and on three,
/// where the survivors of two hosts also withdraw the receives they offered each other.
#[test]
fn libfabric_peers_killed_mid_transfer_are_lost_fast() {
    for hosts in [2, 3] {
        let Some(hosts) = Hosts::create("netns ofi kill", hosts) else {
            return;
        };
        let ranks = hosts.names.len() * PER_HOST;
        let args = ["peer-loss", "--victims", "2,3", "--pending", "allreduce"];
        let mut job = hosts.start(CHECK, &args, &DIRECT);
        let all: Vec<usize> = (0..ranks).collect();
        job.wait_for_lines(&all, "ready ", Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        job.kill(2);
        job.kill(3);
        let status = job.finish(Duration::from_secs(30));
        let elapsed = t0.elapsed();
        let text = job.text();
        for r in all.into_iter().filter(|r| ![2, 3].contains(r)) {
            assert!(status[r].success(), "rank {r}: {}\n{text}", status[r]);
            let lost = job.output[r]
                .iter()
                .find_map(|l| l.strip_prefix("lost "))
                .unwrap_or_else(|| panic!("rank {r} did not notice:\n{text}"));
            assert!(
                lost.contains("PeerLost world rank 2:") || lost.contains("PeerLost world rank 3:"),
                "rank {r}: {lost}\n{text}"
            );
        }
        assert!(
            elapsed < Duration::from_secs(10),
            "took {elapsed:?}:\n{text}"
        );
    }
}

/// Three hosts (six ranks) over libfabric's tcp provider, the eager limit at 15 KiB and the
/// RDMA write threshold lowered to 64 KiB so that the collectives' pieces fall on all three
/// sides of the thresholds: every
/// collective, type and op at counts from 0 to 70 000 (up to 560 kB per buffer), then a soak of
/// random collectives (world, split and dup communicators, heap and pool memory), each against
/// the sequential reference, once with direct steps (every rank takes the eager protocol and
/// writes steps straight into its peers' receives) and once with `HCOMM_OFI_DIRECT=0` (every
/// rank takes the eager, RDMA read and RDMA write protocols, and no direct step).
#[test]
fn libfabric_three_hosts_every_collective_across_the_thresholds_and_a_soak() {
    let Some(hosts) = Hosts::create("netns ofi 3 hosts", 3) else {
        return;
    };
    let env = [
        OFI[0],
        OFI[1],
        ("HCOMM_OFI_EAGER_LIMIT", "15360"),
        ("HCOMM_OFI_WRITE_THRESHOLD", "65536"),
    ];
    let mut job = hosts.start(CHECK, &["collectives"], &env);
    let text = succeed(&mut job, Duration::from_secs(200));
    for r in 0..3 * PER_HOST {
        assert!(text.contains(&format!("[{r}] OK collectives")), "{text}");
    }
    let soak = ["soak", "--calls", "120", "--seed", "17"];
    for direct in ["1", "0"] {
        let env = [env[0], env[1], env[2], env[3], ("HCOMM_OFI_DIRECT", direct)];
        let mut job = hosts.start(CHECK, &soak, &env);
        let text = succeed(&mut job, Duration::from_secs(200));
        for r in 0..3 * PER_HOST {
            assert!(text.contains(&format!("[{r}] OK soak")), "{text}");
        }
        let protocols: &[&str] = match direct {
            "1" => &["eager=", "direct="],
            _ => &["eager=", "read=", "write="],
        };
        every_ofi_protocol_taken(&job, &text, protocols);
        if direct == "0" {
            for (r, out) in job.output.iter().enumerate() {
                let line = out.iter().find(|l| l.starts_with("ofi ")).unwrap();
                assert!(line.contains(" direct=0 "), "rank {r}: {line}");
            }
        }
        println!(
            "{}",
            text.lines()
                .find(|l| l.starts_with("[0] soak: "))
                .unwrap_or("no summary")
        );
    }
}

/// The `direct KIND N` lines of every rank of `job` (`hcomm_check direct`): per collective,
/// the messages all ranks wrote straight into a peer's receive, each nonzero.
fn every_collective_direct(job: &Ranks, text: &str) {
    let mut per_kind: Vec<(String, u64)> = Vec::new();
    for out in &job.output {
        for l in out.iter().filter_map(|l| l.strip_prefix("direct ")) {
            let (kind, n) = l.split_once(' ').unwrap();
            let n: u64 = n.parse().unwrap();
            match per_kind.iter_mut().find(|(k, _)| k == kind) {
                Some((_, m)) => *m += n,
                None => per_kind.push((kind.to_owned(), n)),
            }
        }
    }
    assert_eq!(per_kind.len(), 10, "{text}");
    for (kind, n) in per_kind {
        assert!(n > 0, "no {kind} step went direct:\n{text}");
    }
}

/// Collective steps through libfabric written straight into the receive the peer offered
/// (no rendezvous) on `hosts` hosts: every collective but the barrier, in place and not, heap
/// and pool memory, contributions straddling the eager (4 KiB) and RDMA write (1 MiB)
/// thresholds, each result against the reference; every collective's steps went direct
/// (counted).
fn direct_steps_on(hosts: usize) {
    let Some(hosts) = Hosts::create("netns ofi direct", hosts) else {
        return;
    };
    let ranks = hosts.names.len() * PER_HOST;
    // Eager up to 4 KiB: the steps of every collective (a broadcast's pieces, too) are above.
    let env = [
        DIRECT[0],
        DIRECT[1],
        DIRECT[2],
        ("HCOMM_OFI_EAGER_LIMIT", "4096"),
    ];
    let mut job = hosts.start(CHECK, &["direct"], &env);
    let text = succeed(&mut job, Duration::from_secs(200));
    for r in 0..ranks {
        assert!(text.contains(&format!("[{r}] OK direct")), "{text}");
    }
    every_collective_direct(&job, &text);
}

/// [`direct_steps_on`] two hosts.
#[test]
fn libfabric_collective_steps_write_straight_into_the_peers_receive() {
    direct_steps_on(2);
}

/// [`direct_steps_on`] three hosts.
#[test]
fn libfabric_collective_steps_write_straight_into_the_peers_receive_on_three_hosts() {
    direct_steps_on(3);
}

/// Collectives in flight at once on the world and a dup of it between two hosts through
/// libfabric, their steps written straight into the peer's receive (`hcomm_check
/// direct-overlap`: two nonblocking all-reduces, a nonblocking barrier and all-gather, a
/// blocking all-reduce, round after round): each result right, none stalls, and steps went
/// direct.
#[test]
fn libfabric_direct_steps_of_overlapping_collectives_on_two_communicators() {
    let Some(hosts) = Hosts::create("netns ofi overlap", 2) else {
        return;
    };
    let env = [DIRECT[0], DIRECT[1], DIRECT[2], ("HCOMM_TIMEOUT", "60")];
    let mut job = hosts.start(CHECK, &["direct-overlap", "--rounds", "40"], &env);
    let text = succeed(&mut job, Duration::from_secs(200));
    for r in 0..2 * PER_HOST {
        assert!(text.contains(&format!("[{r}] OK direct-overlap")), "{text}");
    }
    let direct: u64 = job
        .output
        .iter()
        .flatten()
        .filter_map(|l| l.strip_prefix("direct overlap "))
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    assert!(direct > 0, "no step went direct:\n{text}");
}

/// Ranks calling different collectives with direct steps through libfabric (`hcomm_check
/// mismatch`: counts, collectives, types, roots, and all-reduces of 1 MiB with other ops,
/// whose steps between the hosts go direct): an offer whose signature does not fit the step
/// is not used, the step goes as a plain message, and every rank learns of each mismatch at
/// once instead of waiting until `HCOMM_TIMEOUT` (30 s here) for an offer that fits.
#[test]
fn libfabric_direct_steps_of_mismatched_calls_fail_at_once() {
    let Some(hosts) = Hosts::create("netns ofi mismatch", 2) else {
        return;
    };
    let env = [
        DIRECT[0],
        DIRECT[1],
        DIRECT[2],
        ("HCOMM_ALGO", "barrier:direct"),
        ("HCOMM_TIMEOUT", "30"),
    ];
    let t0 = Instant::now();
    let mut job = hosts.start(CHECK, &["mismatch"], &env);
    let text = succeed(&mut job, Duration::from_secs(120));
    let elapsed = t0.elapsed();
    for r in 0..2 * PER_HOST {
        assert!(text.contains(&format!("[{r}] OK mismatch")), "{text}");
        assert!(
            text.contains(&format!("[{r}] op (large)")),
            "rank {r} saw no mismatch of the large all-reduce:\n{text}"
        );
    }
    assert!(
        elapsed < Duration::from_secs(20),
        "took {elapsed:?}:\n{text}"
    );
}

/// How long each rank of the first host took to give up its call (`revoked in N ms`, printed
/// by `hcomm_check direct-revoke` and `write-revoke`); `text`: the job's output, for failures.
fn revocations(job: &Ranks, text: &str) -> Vec<(usize, u64)> {
    (0..PER_HOST)
        .map(|r| {
            let ms = job.output[r]
                .iter()
                .find_map(|l| l.strip_prefix("revoked in ")?.strip_suffix(" ms"))
                .unwrap_or_else(|| panic!("rank {r} printed no revocation:\n{text}"))
                .parse()
                .unwrap();
            (r, ms)
        })
        .collect()
}

/// Runs `hcomm_check SCENARIO --stop-ms 4000` on two hosts of two ranks (`None` where the
/// namespaces cannot be made), checks that every rank passed, and returns the first host's
/// revocation times ([`revocations`]) with the job's output.
fn revoking(
    name: &str,
    scenario: &str,
    env: &[(&str, &str)],
) -> Option<(Vec<(usize, u64)>, String)> {
    let hosts = Hosts::create(name, 2)?;
    let mut job = hosts.start(CHECK, &[scenario, "--stop-ms", "4000"], env);
    let text = succeed(&mut job, Duration::from_secs(120));
    for r in 0..2 * PER_HOST {
        assert!(text.contains(&format!("[{r}] OK {scenario}")), "{text}");
    }
    Some((revocations(&job, &text), text))
}

/// A receive offered to a peer and given up while the peer does not answer (`hcomm_check
/// direct-revoke`: the first host's ranks abort a direct all-reduce with their partners on
/// the second host while those are stopped): the receiver revokes its offer at once, without
/// waiting for the stopped peer or closing its endpoint, so the call fails fast and the
/// endpoint still carries a checked all-reduce with the other rank of the second host; the
/// stopped ranks, resumed, find their call aborted and run theirs too.
#[test]
fn libfabric_a_receive_given_up_revokes_its_offer_without_waiting_for_the_peer() {
    let env = [DIRECT[0], DIRECT[1], DIRECT[2], ("HCOMM_TIMEOUT", "30")];
    let Some((times, text)) = revoking("netns ofi revoke", "direct-revoke", &env) else {
        return;
    };
    for (r, ms) in times {
        // At most 200 ms per receive offered to the stopped peer (one or two here); waiting
        // for its answer took the 2 s of `DRAIN` per receive before.
        assert!(
            ms < 1500,
            "rank {r} took {ms} ms to give up its call:\n{text}"
        );
    }
}

/// The destination of an RDMA write given up while its writer does not answer (`hcomm_check
/// write-revoke`: the second host's ranks are stopped from announcing their 2 MiB send until
/// after the first host's ranks aborted the receive that named its destination):
/// the receiver withdraws and revokes the destination within the short wait for the writer's
/// answer, instead of waiting 2 s and then closing its endpoint; the endpoint still carries a
/// checked all-reduce with the other rank of the second host, and, once the writers resume, a
/// checked exchange of 2 MiB by RDMA write with the same peer.
#[test]
fn libfabric_a_receive_given_up_revokes_the_destination_of_a_write_without_closing_the_endpoint() {
    let env = [OFI[0], OFI[1], ("HCOMM_TIMEOUT", "30")];
    let Some((times, text)) = revoking("netns ofi write revoke", "write-revoke", &env) else {
        return;
    };
    for (r, ms) in times {
        // The receive waited for the stopped writer's answer (200 ms), so its destination
        // was announced; then gave up well before the 2 s of `DRAIN`.
        assert!(
            (150..1500).contains(&ms),
            "rank {r} took {ms} ms to give up its receive:\n{text}"
        );
    }
}
