//! Rails: two hosts (network namespaces) joined by two veth pairs, `r0` (10.91.0.0/24) and
//! `r1` (10.91.1.0/24), one rank in each. By default a rank listens on both rails and
//! announces both addresses, and a pair's streams go round them, so a large all-reduce
//! crosses both; `HCOMM_SOCKET_IFNAME` narrows the choice (NCCL's syntax), and a choice that
//! matches nothing fails init with a message naming what is up.
//!
//! Failover: rail 0 taken down (`ip link set down`) or turned into a black hole (a blackhole
//! route to the peer's address: everything sent there vanishes) in the middle of a loop of
//! checked all-reduces; the loop finishes with exact results, a failover counted, no peer
//! lost. Both rails down: the peer is lost, "all links lost", within the link timeout.
//!
//! A slow rail (50 ms each way on rail 1) is not failed over. The kernel may lack `netem`,
//! so the delay is a third namespace on rail 1 between the hosts, whose thread forwards every
//! frame 50 ms late ([`netns::Delay`]).
//!
//! Namespaces need root and `ip`; without them each test says it is skipped and passes.

use std::process::Command;
use std::time::{Duration, Instant};

use hcomm_testkit::netns::{self, ip};
use hcomm_testkit::Ranks;

const PERF: &str = env!("CARGO_BIN_EXE_hcomm_perf");
const CHECK: &str = env!("CARGO_BIN_EXE_hcomm_check");
const TEST: &str = env!("CARGO_BIN_EXE_hcomm_test");
const PROFILER: &str = env!("CARGO_BIN_EXE_hcomm_profiler");
/// Where rank 0, in host 0, serves the rendezvous store (on rail 0).
const STORE_PORT: u16 = 29410;
/// The rails between the two hosts.
const RAILS: [&str; 2] = ["r0", "r1"];

/// Two namespaces joined by one veth pair per rail, removed on drop; rail 0 may go through
/// a delay line in a third namespace.
struct TwoHosts {
    names: [String; 2],
    /// The delay line on rail [`SLOW_RAIL`] and its namespace (dropped first: its thread
    /// stops before the namespaces go).
    delay: Option<(netns::Delay, String)>,
}

/// The rail [`TwoHosts::create_with`] delays: rail 1, whose streams carry data frames only
/// (the ordered frames take rail 0's stream, the lane).
const SLOW_RAIL: usize = 1;
/// The MTU of a delayed rail: large, so that the delay line forwards few frames.
const DELAYED_MTU: &str = "65000";

impl TwoHosts {
    /// `None`, after saying why, where this process cannot make namespaces.
    fn create(test: &str) -> Option<TwoHosts> {
        Self::create_with(test, None)
    }

    /// [`TwoHosts::create`], rail [`SLOW_RAIL`] delayed by `delay` each way when given.
    fn create_with(test: &str, delay: Option<Duration>) -> Option<TwoHosts> {
        if !netns::can_make_namespaces(test) {
            return None;
        }
        let job = netns::unique_prefix();
        let names = [format!("{job}-a"), format!("{job}-b")];
        let mut hosts = TwoHosts { names, delay: None };
        hosts
            .wire(delay.map(|d| (d, format!("{job}-m"))))
            .unwrap_or_else(|e| panic!("{e}"));
        Some(hosts)
    }

    fn wire(&mut self, delay: Option<(Duration, String)>) -> Result<(), String> {
        let [a, b] = self.names.clone();
        for ns in [&a, &b] {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        for (i, rail) in RAILS.iter().enumerate() {
            match &delay {
                Some((by, mid)) if i == SLOW_RAIL => self.wire_delayed(rail, *by, mid)?,
                _ => ip(&[
                    "-n", &a, "link", "add", rail, "type", "veth", "peer", "name", rail, "netns",
                    &b,
                ])?,
            }
            for (h, ns) in [&a, &b].into_iter().enumerate() {
                let addr = format!("{}/24", Self::addr(h, i));
                ip(&["-n", ns, "addr", "add", &addr, "dev", rail])?;
                ip(&["-n", ns, "link", "set", "dev", rail, "up"])?;
            }
        }
        Ok(())
    }

    /// Rail `rail` through namespace `mid`: each host's end is paired with one there (`ma`
    /// and `mb`), and a delay line forwards between them, `by` late.
    fn wire_delayed(&mut self, rail: &str, by: Duration, mid: &str) -> Result<(), String> {
        ip(&["netns", "add", mid])?;
        for (h, end) in ["ma", "mb"].into_iter().enumerate() {
            let host = self.names[h].as_str();
            ip(&[
                "-n", host, "link", "add", rail, "type", "veth", "peer", "name", end, "netns", mid,
            ])?;
            ip(&["-n", host, "link", "set", "dev", rail, "mtu", DELAYED_MTU])?;
            // A host's segments stay within the MTU (the delay line forwards frames whole).
            ip(&[
                "-n",
                host,
                "link",
                "set",
                "dev",
                rail,
                "gso_max_size",
                "60000",
            ])?;
            ip(&["-n", mid, "link", "set", "dev", end, "mtu", DELAYED_MTU])?;
            ip(&["-n", mid, "link", "set", "dev", end, "up"])?;
        }
        let line = netns::Delay::start(mid, ["ma", "mb"], by)?;
        self.delay = Some((line, mid.to_string()));
        Ok(())
    }

    /// The address of host `h` on rail `i`.
    fn addr(h: usize, i: usize) -> String {
        format!("10.91.{i}.{}", h + 1)
    }

    /// Runs `ip args` in host `h`.
    fn ip_in(&self, h: usize, args: &[&str]) {
        let mut all = vec!["-n", self.names[h].as_str()];
        all.extend_from_slice(args);
        ip(&all).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Bytes host 0 sent on rail `i` so far.
    fn tx_bytes(&self, i: usize) -> u64 {
        netns::counter(&self.names[0], RAILS[i], "tx_bytes")
    }

    /// `program args` with one rank in each host, the store on host 0's rail 0.
    fn start(&self, program: &str, args: &[&str], env: &[(&str, &str)]) -> Ranks {
        let root = format!("{}:{STORE_PORT}", Self::addr(0, 0));
        Ranks::start(2, Some(&root), args, |r| {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &self.names[r], program])
                .env("HCOMM_HOST_ID", &self.names[r])
                .env("HCOMM_TIMEOUT", "60")
                .env("HCOMM_DEBUG", "1");
            for (k, v) in env {
                c.env(k, v);
            }
            c
        })
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        let mid = self.delay.take().map(|(line, mid)| {
            drop(line);
            mid
        });
        // Deleting a namespace removes its ends of the veth pairs, and so the pairs.
        for name in self.names.iter().chain(&mid) {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// A 16 MiB all-reduce, checked by hcomm_perf (its wrong-element column must be 0).
const ALLREDUCE: [&str; 11] = [
    "allreduce",
    "-b",
    "16M",
    "-e",
    "16M",
    "-n",
    "4",
    "-w",
    "1",
    "-f",
    "2",
];

/// Runs the all-reduce between the hosts; the bytes host 0 sent on each rail meanwhile, and
/// the job's output.
fn allreduce(hosts: &TwoHosts, env: &[(&str, &str)]) -> ([u64; 2], String) {
    let before = [hosts.tx_bytes(0), hosts.tx_bytes(1)];
    let mut job = hosts.start(PERF, &ALLREDUCE, env);
    let status = job.finish(Duration::from_secs(120));
    let text = job.text();
    for (r, s) in status.iter().enumerate() {
        assert!(s.success(), "rank {r}: {s}\n{text}");
    }
    let rows: Vec<Vec<&str>> = job.output[0]
        .iter()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        // The table's rows (HCOMM_DEBUG's topology has rows of numbers too, fewer columns).
        .filter(|cols| cols.len() == 10)
        .collect();
    assert_eq!(rows.len(), 1, "{text}");
    assert_eq!(rows[0][8], "0", "wrong elements: {text}");
    let sent = [0, 1].map(|i| hosts.tx_bytes(i) - before[i]);
    (sent, text)
}

#[test]
fn by_default_every_rail_carries_the_traffic() {
    let Some(hosts) = TwoHosts::create("rails default") else {
        return;
    };
    let (sent, text) = allreduce(&hosts, &[]);
    println!("default: host 0 sent {sent:?} bytes on {RAILS:?}");
    // Each rank's rails, the store's first, and both streams of the link, one per rail.
    assert!(text.contains("rails r0 10.91.0.1, r1 10.91.1.1"), "{text}");
    assert!(text.contains("10.91.0.1 -> 10.91.0.2"), "{text}");
    assert!(text.contains("10.91.1.1 -> 10.91.1.2"), "{text}");
    // 5 all-reduces of 16 MiB: each sends about 16 MiB from host 0; half of it per rail.
    for (i, bytes) in sent.iter().enumerate() {
        assert!(*bytes > 16 << 20, "rail {i} carried {bytes} bytes:\n{text}");
    }
}

#[test]
fn hcomm_test_shows_every_rail_of_every_link() {
    let Some(hosts) = TwoHosts::create("rails hcomm_test") else {
        return;
    };
    let mut job = hosts.start(TEST, &["--all"], &[]);
    let status = job.finish(Duration::from_secs(120));
    let text = job.text();
    assert!(status.iter().all(|s| s.success()), "{text}");
    for line in [
        "rails 0->1: 10.91.0.1 -> 10.91.0.2, 10.91.1.1 -> 10.91.1.2",
        "rails 1->0: 10.91.0.2 -> 10.91.0.1, 10.91.1.2 -> 10.91.1.1",
    ] {
        assert!(text.contains(line), "{line}:\n{text}");
    }
}

#[test]
fn socket_ifname_selects_the_rails() {
    let Some(hosts) = TwoHosts::create("rails ifname") else {
        return;
    };
    // `=r1`: only rail 1 carries data (rail 0 only the store's few bytes).
    let (sent, text) = allreduce(&hosts, &[("HCOMM_SOCKET_IFNAME", "=r1")]);
    println!("=r1: host 0 sent {sent:?} bytes on {RAILS:?}");
    assert!(text.contains("rails r1 10.91.1.1\n"), "{text}");
    assert!(
        sent[1] > 64 << 20,
        "rail 1 carried {} bytes:\n{text}",
        sent[1]
    );
    assert!(
        sent[0] < 1 << 20,
        "rail 0 carried {} bytes:\n{text}",
        sent[0]
    );
    // `^lo,r1`: everything but loopback and rail 1, so rail 0 alone.
    let (_, text) = allreduce(&hosts, &[("HCOMM_SOCKET_IFNAME", "^lo,r1")]);
    assert!(text.contains("rails r0 10.91.0.1\n"), "{text}");
    // No match: init fails, naming the interfaces that are up.
    let mut job = hosts.start(PERF, &ALLREDUCE, &[("HCOMM_SOCKET_IFNAME", "eth")]);
    let status = job.finish(Duration::from_secs(60));
    let text = job.text();
    assert!(status.iter().all(|s| !s.success()), "{text}");
    assert!(
        text.contains("HCOMM_SOCKET_IFNAME matches no interface")
            && text.contains("r0 (10.91.0.1)")
            && text.contains("r1 (10.91.1.1)"),
        "{text}"
    );
}

/// The link timeout of the failover tests: a dead rail is given up after this long.
const LINK_TIMEOUT: &str = "1";

/// A loop of checked 64 MiB all-reduces; `cut` breaks rail 0 once the ranks report step 2.
/// Returns the job's output and each rank's failover count.
fn allreduce_loop_with(hosts: &TwoHosts, cut: impl FnOnce(&TwoHosts)) -> (String, Vec<u64>) {
    let (text, failovers, _) = allreduce_loop_of(hosts, 8, 64 << 20, false, cut);
    (text, failovers)
}

/// [`allreduce_loop_with`], `count` all-reduces of `bytes`; `profile`: the ranks linger at
/// the end, and what `hcomm_profiler --once` shows of rank 0 meanwhile comes third.
fn allreduce_loop_of(
    hosts: &TwoHosts,
    count: usize,
    bytes: usize,
    profile: bool,
    cut: impl FnOnce(&TwoHosts),
) -> (String, Vec<u64>, String) {
    let (count, bytes) = (count.to_string(), bytes.to_string());
    let linger = if profile { "3000" } else { "0" };
    let args = [
        "rails",
        "--traffic",
        "allreduce",
        "--count",
        &count,
        "--bytes",
        &bytes,
        "--linger-ms",
        linger,
    ];
    let env = [
        ("HCOMM_LINK_TIMEOUT", LINK_TIMEOUT),
        ("HCOMM_TIMEOUT", "30"),
    ];
    let mut job = hosts.start(CHECK, &args, &env);
    job.wait_for_lines(&[0, 1], "step 2 ", Duration::from_secs(60));
    cut(hosts);
    let mut profile_text = String::new();
    if profile {
        job.wait_for_lines(&[0], "pid ", Duration::from_secs(90));
        let pid = job.output[0]
            .iter()
            .find_map(|l| l.strip_prefix("pid "))
            .unwrap_or_default()
            .to_string();
        let (o, _) = hcomm_testkit::run_bounded(
            Command::new(PROFILER).args(["--pid", &pid, "--once", "--interval", "500"]),
            Duration::from_secs(30),
        );
        profile_text = hcomm_testkit::text(&o);
        assert!(o.status.success(), "{profile_text}");
    }
    let status = job.finish(Duration::from_secs(90));
    let text = job.text();
    for (r, s) in status.iter().enumerate() {
        assert!(s.success(), "rank {r}: {s}\n{text}");
    }
    let failovers = (0..2)
        .map(|r| {
            job.output[r]
                .iter()
                .find_map(|l| l.strip_prefix("failovers "))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("rank {r} printed no failover count:\n{text}"))
        })
        .collect();
    (text, failovers, profile_text)
}

/// Each rank counted at most one failover (its own side of rail 0's stream), and some rank
/// did; the warning names the rail.
fn one_failover(text: &str, failovers: &[u64]) {
    assert!(failovers.iter().all(|&n| n <= 1), "{failovers:?}\n{text}");
    assert!(failovers.contains(&1), "{failovers:?}\n{text}");
    assert!(text.contains("on rail 10.91.0."), "{text}");
}

#[test]
fn a_rail_taken_down_mid_run_fails_over_without_loss() {
    let Some(hosts) = TwoHosts::create("rails link down") else {
        return;
    };
    let (text, failovers, profile) = allreduce_loop_of(&hosts, 8, 64 << 20, true, |h| {
        h.ip_in(0, &["link", "set", "r0", "down"]);
    });
    println!("link down: failovers {failovers:?}\n{profile}");
    one_failover(&text, &failovers);
    // The profiler shows rank 0's failover by peer and rail, when it counted one.
    let shown = "failover: world rank 1: rail 10.91.0.1 -> 10.91.0.2 given up: 1";
    match failovers[0] {
        0 => assert!(profile.contains("failovers: none"), "{profile}"),
        _ => assert!(profile.contains(shown), "{profile}"),
    }
}

#[test]
fn a_black_hole_on_a_rail_fails_over_without_loss() {
    let Some(hosts) = TwoHosts::create("rails black hole") else {
        return;
    };
    let (text, failovers) = allreduce_loop_with(&hosts, |h| {
        // Everything host 0 sends on rail 0 vanishes, its acknowledgements included.
        h.ip_in(0, &["route", "add", "blackhole", &TwoHosts::addr(1, 0)]);
    });
    println!("black hole: failovers {failovers:?}");
    one_failover(&text, &failovers);
}

#[test]
fn both_rails_down_lose_the_peer_within_the_link_timeout() {
    let Some(hosts) = TwoHosts::create("rails all down") else {
        return;
    };
    let args = [
        "rails",
        "--traffic",
        "allreduce",
        "--count",
        "1000",
        "--bytes",
        "4194304",
    ];
    let env = [
        ("HCOMM_LINK_TIMEOUT", LINK_TIMEOUT),
        ("HCOMM_TIMEOUT", "60"),
    ];
    let mut job = hosts.start(CHECK, &args, &env);
    job.wait_for_lines(&[0, 1], "step 2 ", Duration::from_secs(60));
    let t0 = Instant::now();
    for rail in RAILS {
        hosts.ip_in(0, &["link", "set", rail, "down"]);
    }
    let status = job.finish(Duration::from_secs(30));
    let took = t0.elapsed();
    let text = job.text();
    println!("both rails down: the ranks ended {took:?} later");
    for (r, s) in status.iter().enumerate() {
        assert!(!s.success(), "rank {r} did not fail:\n{text}");
    }
    assert!(text.contains("all links lost"), "{text}");
    assert!(text.contains("peer lost"), "{text}");
    // The link timeout (1 s) per stream, the second stream's after the first's: far below
    // HCOMM_TIMEOUT (60 s).
    assert!(took < Duration::from_secs(15), "{took:?}\n{text}");
}

#[test]
fn a_flapping_rail_loses_reorders_and_duplicates_nothing_and_is_used_again() {
    let Some(hosts) = TwoHosts::create("rails flapping") else {
        return;
    };
    // 10,000 numbered messages (every fourth of 256 KiB, striped), each checked in order;
    // a link timeout below the flaps' half period, so that each flap fails the stream over
    // and its return is probed and taken back.
    let args = [
        "rails",
        "--traffic",
        "ordered",
        "--count",
        "10000",
        "--bytes",
        "262144",
        "--every",
        "100",
        "--pause-us",
        "800",
    ];
    let env = [("HCOMM_LINK_TIMEOUT", "0.25"), ("HCOMM_TIMEOUT", "60")];
    let mut job = hosts.start(CHECK, &args, &env);
    job.wait_for_lines(&[0, 1], "step 100 ", Duration::from_secs(60));
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        hosts.ip_in(0, &["link", "set", "r0", "down"]);
        std::thread::sleep(Duration::from_millis(500));
        hosts.ip_in(0, &["link", "set", "r0", "up"]);
        std::thread::sleep(Duration::from_millis(500));
    }
    // Rail 0 stays up now: its stream comes back within a probe (the link timeout) and
    // carries its share of the large messages again.
    std::thread::sleep(Duration::from_secs(1));
    let before = hosts.tx_bytes(0);
    std::thread::sleep(Duration::from_secs(2));
    let after_flaps = hosts.tx_bytes(0) - before;
    let status = job.finish(Duration::from_secs(120));
    let text = job.text();
    for (r, s) in status.iter().enumerate() {
        assert!(s.success(), "rank {r}: {s}\n{text}");
    }
    let failovers: u64 = job.output[0]
        .iter()
        .find_map(|l| l.strip_prefix("failovers "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no failover count:\n{text}"));
    println!(
        "flapping: rank 0 counted {failovers} failovers; rail 0 sent {after_flaps} B in 2 s after"
    );
    assert!(failovers >= 1, "{text}");
    assert!(text.contains("has its stream 0 back"), "{text}");
    assert!(
        after_flaps > 1 << 20,
        "rail 0 sent {after_flaps} bytes after the flaps:\n{text}"
    );
}

#[test]
fn a_slow_rail_is_not_failed_over() {
    // 50 ms each way on rail 1: a round trip of 100 ms, a tenth of the link timeout. Rail 1
    // carries half of the data frames; the ordered frames take rail 0 (a lane 100 ms away
    // would add a round trip to every rendezvous: 29 s per all-reduce of 64 MiB). Data
    // frames complete when acknowledged, so the slow rail costs round trips too: 16 s per
    // all-reduce of 64 MiB on this 2-core machine; 8 of 4 MiB keep the test short.
    let Some(hosts) = TwoHosts::create_with("rails delay", Some(Duration::from_millis(50))) else {
        return;
    };
    // The round trip of a connection attempt (refused by host 1) on each rail.
    let rtt = |rail: usize| {
        let to: std::net::SocketAddr = format!("{}:9", TwoHosts::addr(1, rail)).parse().unwrap();
        netns::run_in(&hosts.names[0], || {
            let t = Instant::now();
            let refused = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5));
            (t.elapsed(), refused.is_err())
        })
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let (fast, slow) = (rtt(0), rtt(SLOW_RAIL));
    println!("slow rail: round trips {fast:?} on rail 0, {slow:?} on rail {SLOW_RAIL}");
    assert!(slow.1 && fast.1, "{slow:?} {fast:?}");
    assert!(slow.0 >= Duration::from_millis(100), "{slow:?}");
    assert!(fast.0 < Duration::from_millis(100), "{fast:?}");
    let t0 = Instant::now();
    let before = hosts.tx_bytes(SLOW_RAIL);
    let (text, failovers, _) = allreduce_loop_of(&hosts, 8, 4 << 20, false, |_| {});
    let sent = hosts.tx_bytes(SLOW_RAIL) - before;
    println!(
        "slow rail: {:?}, failovers {failovers:?}, {sent} B on rail {SLOW_RAIL}",
        t0.elapsed()
    );
    assert_eq!(failovers, [0, 0], "{text}");
    // The slow rail carried its share of the 8 all-reduces of 4 MiB (half of 32 MiB).
    assert!(
        sent > 8 << 20,
        "rail {SLOW_RAIL} carried {sent} bytes:\n{text}"
    );
}
