//! `hcomm_test`: tests the links of a job one by one and prints a pass/fail matrix.
//!
//! A link is an ordered pair of ranks (sender, receiver). Every rank walks the same list of
//! links; the two ranks of a link test it while every other rank waits at the barrier that
//! ends the link's turn, so one link's numbers are not disturbed by another's traffic and the
//! turns cannot deadlock. At the end one all-reduce brings every link's results to every rank;
//! rank 0 prints them.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, ensure, Context as _};
use clap::{ArgGroup, Parser};
use hcomm::{Communicator, ReduceOp};
use hcomm_tools::{alloc_zeroed as alloc, parse_size, pattern};

/// Test every link of an hcomm job: latency, bandwidth and data integrity, with a pass/fail
/// matrix.
///
/// Start it on every rank of a job with the same arguments, for example
///
///   hcommrun -n 4 hcomm_test --all
///   hcommrun -n 4 hcomm_test --pair 2,3
///
/// A link is an ordered pair of ranks: `--all` tests all n(n-1) of them, one at a time (the
/// other ranks wait at a barrier), `--pair A,B` only the one from rank A to rank B. Per link:
///
///   latency    half the median round trip of --latency-size bytes (--latency-iters timed)
///   bandwidth  --window nonblocking sends of --bw-size bytes and one acknowledgement, the
///              median of --bw-iters windows: window x size / time, GB/s (1 GB = 1e9 B)
///   integrity  one message of each size around the protocol switches (1 B, past the eager
///              limits of shared memory and TCP, past the push threshold, --bw-size), each
///              carrying a checksum of its data; the receiver recomputes it and also compares
///              it with the checksum of the data it expects
///
/// A link passes when every integrity message arrived whole and right. Rank 0 prints one line
/// per link (transport shm or tcp, latency, bandwidth, integrity, PASS/FAIL), then with --all
/// the matrices (row = sender, column = receiver). An hcomm error (a peer lost, a timeout)
/// stops the test on that rank with the error, naming the link.
///
/// Exit status: 0 when every link passed, 1 when a link failed or an hcomm call failed,
/// 2 for bad arguments.
#[derive(Debug, Parser)]
#[command(name = "hcomm_test", version, verbatim_doc_comment)]
#[command(group(ArgGroup::new("links").required(true).args(["all", "pair"])))]
struct Cli {
    /// Test every ordered pair of ranks.
    #[arg(long)]
    all: bool,

    /// Test the one link from rank A to rank B.
    #[arg(long, value_name = "A,B", value_parser = parse_pair)]
    pair: Option<(usize, usize)>,

    /// Message size of the latency test (suffixes K, M, G: powers of 1024).
    #[arg(long = "latency-size", value_name = "SIZE", default_value = "8",
          value_parser = parse_size)]
    latency_size: u64,

    /// Timed round trips per link (after a tenth as many untimed ones, at least one).
    #[arg(long = "latency-iters", value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    latency_iters: u64,

    /// Message size of the bandwidth test, and the largest integrity message.
    #[arg(long = "bw-size", value_name = "SIZE", default_value = "4M",
          value_parser = parse_size)]
    bw_size: u64,

    /// Messages in flight in one bandwidth window.
    #[arg(long = "window", value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=64))]
    window: u64,

    /// Timed bandwidth windows per link (after one untimed).
    #[arg(long = "bw-iters", value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    bw_iters: u64,

    /// Self-test of the checker: rank A flips one byte of every integrity message it sends
    /// to rank B after computing the message's checksum, as a faulty link would. The link
    /// A->B must then FAIL (and the run exit 1); every other link must still PASS.
    #[arg(long, value_name = "A,B", value_parser = parse_pair)]
    corrupt: Option<(usize, usize)>,
}

/// Parses `A,B`: two different ranks.
fn parse_pair(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?} is not A,B (two ranks, e.g. 0,1)"))?;
    let rank = |t: &str| {
        t.trim()
            .parse::<usize>()
            .map_err(|_| format!("{t:?} in {s:?} is not a rank"))
    };
    let (a, b) = (rank(a)?, rank(b)?);
    if a == b {
        return Err(format!("{s:?}: a link joins two different ranks"));
    }
    Ok((a, b))
}

/// Tags of the test's messages (one link at a time, so one tag per kind is enough).
const TAG_PING: u32 = 1;
const TAG_PONG: u32 = 2;
const TAG_BW: u32 = 3;
const TAG_ACK: u32 = 4;
const TAG_CHECK: u32 = 5;

/// Bytes of the checksum after the data of an integrity message.
const SUM_BYTES: usize = 8;

/// Numbers kept per link in the shared results: see [`LinkResult`].
const FIELDS: usize = 6;

/// What the test found on one link.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LinkResult {
    /// Whether the link was tested (false for links `--pair` leaves out).
    tested: bool,
    /// Whether the sender reaches the receiver through shared memory.
    shm: bool,
    /// Half the median round trip, microseconds.
    latency_us: f64,
    /// Bandwidth, GB/s.
    bandwidth: f64,
    /// Integrity messages sent.
    messages: u64,
    /// Integrity messages the receiver found wrong.
    bad: u64,
}

impl LinkResult {
    /// A link passes when every integrity message was right.
    fn passed(&self) -> bool {
        self.tested && self.bad == 0 && self.messages > 0
    }

    /// The sender's part and the receiver's part add up to the whole (every other rank
    /// contributes zeros), so one sum of every rank's numbers gathers them.
    fn to_fields(self) -> [f64; FIELDS] {
        [
            f64::from(u8::from(self.tested)),
            f64::from(u8::from(self.shm)),
            self.latency_us,
            self.bandwidth,
            self.messages as f64,
            self.bad as f64,
        ]
    }

    fn from_fields(f: &[f64]) -> LinkResult {
        LinkResult {
            tested: f[0] > 0.0,
            shm: f[1] > 0.0,
            latency_us: f[2],
            bandwidth: f[3],
            messages: f[4] as u64,
            bad: f[5] as u64,
        }
    }

    fn empty() -> LinkResult {
        LinkResult {
            tested: false,
            shm: false,
            latency_us: 0.0,
            bandwidth: 0.0,
            messages: 0,
            bad: 0,
        }
    }
}

/// The links to test on `n` ranks, in the order every rank walks them.
fn links(cli: &Cli, n: usize) -> anyhow::Result<Vec<(usize, usize)>> {
    for (what, pair) in [("--pair", cli.pair), ("--corrupt", cli.corrupt)] {
        if let Some((a, b)) = pair {
            ensure!(
                a < n && b < n,
                "{what} {a},{b}: the job has ranks 0..{} only",
                n - 1
            );
        }
    }
    Ok(match cli.pair {
        Some(p) => vec![p],
        None => (0..n)
            .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
            .collect(),
    })
}

/// The sizes of the integrity messages: 1 byte, one byte past each protocol switch of the
/// configuration, and the bandwidth size, smallest first.
fn integrity_sizes(comm: &Communicator, bw_size: usize) -> Vec<usize> {
    let cfg = comm.config();
    let mut sizes = vec![
        1,
        cfg.shm_eager_limit + 1,
        cfg.tcp_eager_limit + 1,
        cfg.shm_push_threshold.saturating_add(1),
        bw_size,
    ];
    sizes.retain(|&s| s > 0 && s <= bw_size.max(1));
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The median of `times` (sorted here).
fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(0.0)
}

/// One link's test, run by its two ranks.
struct Link<'a> {
    comm: &'a Communicator,
    cli: &'a Cli,
    from: usize,
    to: usize,
}

impl Link<'_> {
    /// The sender's side; returns its part of the results.
    fn send_side(&self) -> anyhow::Result<LinkResult> {
        let (comm, to) = (self.comm, self.to);
        let lat_size = usize::try_from(self.cli.latency_size)?;
        let ping = alloc(lat_size)?;
        let mut pong = alloc(lat_size)?;
        let warmup = (self.cli.latency_iters / 10).max(1);
        let mut times = Vec::with_capacity(self.cli.latency_iters as usize);
        for i in 0..warmup + self.cli.latency_iters {
            let t = Instant::now();
            comm.send(&ping, to, TAG_PING).context("latency: sending")?;
            comm.recv(&mut pong, to, TAG_PONG)
                .context("latency: receiving the reply")?;
            if i >= warmup {
                times.push(t.elapsed().as_secs_f64() / 2.0);
            }
        }
        let latency_us = median(&mut times) * 1e6;

        let size = usize::try_from(self.cli.bw_size)?;
        let mut bufs = (0..self.cli.window)
            .map(|_| alloc(size))
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut times = Vec::with_capacity(self.cli.bw_iters as usize);
        for i in 0..=self.cli.bw_iters {
            let t = Instant::now();
            let reqs = bufs
                .into_iter()
                .map(|b| comm.isend(b, to, TAG_BW))
                .collect::<hcomm::Result<Vec<_>>>()
                .context("bandwidth: starting a send")?;
            let done = hcomm::wait_all(reqs).context("bandwidth: sending")?;
            bufs = done.into_iter().map(|d| d.buffer).collect();
            comm.recv(&mut [], to, TAG_ACK)
                .context("bandwidth: receiving the acknowledgement")?;
            if i > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        let window_bytes = (size as u64 * self.cli.window) as f64;
        let t = median(&mut times);
        let bandwidth = if t > 0.0 { window_bytes / t / 1e9 } else { 0.0 };
        drop(bufs);

        let corrupt = self.cli.corrupt == Some((self.from, self.to));
        let sizes = integrity_sizes(comm, size);
        for &s in &sizes {
            let mut msg = alloc(s + SUM_BYTES)?;
            let (data, sum) = msg.split_at_mut(s);
            pattern::fill(data, pattern::seed(self.from, s, self.to as u64, 0));
            sum.copy_from_slice(&pattern::checksum(data).to_le_bytes());
            if corrupt {
                // After the checksum: what a link that damages data in flight would deliver.
                data[s / 2] ^= 0x10;
            }
            comm.send(&msg, to, TAG_CHECK)
                .with_context(|| format!("integrity: sending {s} bytes"))?;
        }
        Ok(LinkResult {
            tested: true,
            shm: comm.uses_shm(to),
            latency_us,
            bandwidth,
            messages: sizes.len() as u64,
            bad: 0,
        })
    }

    /// The receiver's side; returns its part of the results (the wrong messages).
    fn recv_side(&self) -> anyhow::Result<LinkResult> {
        let (comm, from) = (self.comm, self.from);
        let lat_size = usize::try_from(self.cli.latency_size)?;
        let mut ping = alloc(lat_size)?;
        let warmup = (self.cli.latency_iters / 10).max(1);
        for _ in 0..warmup + self.cli.latency_iters {
            comm.recv(&mut ping, from, TAG_PING)
                .context("latency: receiving")?;
            comm.send(&ping, from, TAG_PONG)
                .context("latency: replying")?;
        }

        let size = usize::try_from(self.cli.bw_size)?;
        let mut bufs = (0..self.cli.window)
            .map(|_| alloc(size))
            .collect::<std::io::Result<Vec<_>>>()?;
        for _ in 0..=self.cli.bw_iters {
            let reqs = bufs
                .into_iter()
                .map(|b| comm.irecv(b, from, TAG_BW))
                .collect::<hcomm::Result<Vec<_>>>()
                .context("bandwidth: starting a receive")?;
            let done = hcomm::wait_all(reqs).context("bandwidth: receiving")?;
            bufs = done.into_iter().map(|d| d.buffer).collect();
            comm.send(&[], from, TAG_ACK)
                .context("bandwidth: acknowledging")?;
        }
        drop(bufs);

        let mut bad = 0;
        for s in integrity_sizes(comm, size) {
            // One byte of room more than expected, so that a longer message shows as wrong
            // instead of failing the receive.
            let mut msg = alloc(s + SUM_BYTES + 1)?;
            let len = comm
                .recv(&mut msg, from, TAG_CHECK)
                .with_context(|| format!("integrity: receiving {s} bytes"))?;
            if !message_is_right(&msg[..len], s, pattern::seed(from, s, self.to as u64, 0)) {
                bad += 1;
            }
        }
        Ok(LinkResult {
            bad,
            ..LinkResult::empty()
        })
    }
}

/// Whether `msg` holds `size` bytes of the pattern `seed` followed by their checksum.
fn message_is_right(msg: &[u8], size: usize, seed: u64) -> bool {
    if msg.len() != size + SUM_BYTES {
        return false;
    }
    let (data, sum) = msg.split_at(size);
    let got = pattern::checksum(data);
    let sent = sum.try_into().map(u64::from_le_bytes).ok();
    let mut expected = vec![0u8; size];
    pattern::fill(&mut expected, seed);
    sent == Some(got) && got == pattern::checksum(&expected)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            let rank = std::env::var("HCOMM_RANK").unwrap_or_else(|_| "?".into());
            eprintln!("hcomm_test: rank {rank}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Tests the links on this rank; returns whether every tested link passed.
fn run(cli: &Cli) -> anyhow::Result<bool> {
    let comm = Communicator::init().context("cannot join the job")?;
    let (n, rank) = (comm.size(), comm.rank());
    if n < 2 {
        bail!("the job has 1 rank, so no links: start it with `hcommrun -n 2` or more");
    }
    let links = links(cli, n)?;
    if rank == 0 {
        print_header(cli, &comm, links.len());
    }
    let mut mine = vec![0.0f64; n * n * FIELDS];
    for &(from, to) in &links {
        let link = Link {
            comm: &comm,
            cli,
            from,
            to,
        };
        let part = if rank == from {
            Some(link.send_side())
        } else if rank == to {
            Some(link.recv_side())
        } else {
            None
        };
        if let Some(part) = part {
            let part = part.with_context(|| format!("link {from}->{to}"))?;
            let at = (from * n + to) * FIELDS;
            mine[at..at + FIELDS].copy_from_slice(&part.to_fields());
        }
        comm.barrier()
            .with_context(|| format!("the barrier after link {from}->{to}"))?;
    }
    let mut all = vec![0.0f64; mine.len()];
    comm.allreduce(&mine, &mut all, ReduceOp::Sum)
        .context("collecting the results")?;
    let results: Vec<LinkResult> = all.chunks(FIELDS).map(LinkResult::from_fields).collect();
    let failed = links
        .iter()
        .filter(|&&(a, b)| !results[a * n + b].passed())
        .count();
    if rank == 0 {
        print_results(&links, &results, n, cli.all);
    }
    // Every rank leaves with the verdict, but only once rank 0 has printed: a launcher stops
    // the other ranks as soon as one exits with a failure.
    comm.barrier().context("the barrier after the report")?;
    Ok(failed == 0)
}

/// The comment lines before the results.
fn print_header(cli: &Cli, comm: &Communicator, links: usize) {
    let n = comm.size();
    let hosts = comm.topology().num_hosts();
    let which = match cli.pair {
        Some((a, b)) => format!("{a}->{b}"),
        None => "every ordered pair, one at a time".to_string(),
    };
    let bw = usize::try_from(cli.bw_size).unwrap_or(usize::MAX);
    let sizes: Vec<String> = integrity_sizes(comm, bw)
        .iter()
        .map(|s| s.to_string())
        .collect();
    println!(
        "# hcomm_test {}: {n} ranks on {hosts} host{}, {links} link{} ({which})",
        env!("CARGO_PKG_VERSION"),
        if hosts == 1 { "" } else { "s" },
        if links == 1 { "" } else { "s" },
    );
    println!(
        "# latency = half the median round trip of {} B ({} timed); bandwidth = {} x {} B \
         in flight, median of {} windows (1 GB = 1e9 B)",
        cli.latency_size, cli.latency_iters, cli.window, cli.bw_size, cli.bw_iters
    );
    println!(
        "# integrity = messages of {} B, each with a checksum the receiver verifies",
        sizes.join(", ")
    );
    if let Some((a, b)) = cli.corrupt {
        println!(
            "# --corrupt {a},{b}: rank {a} damages what it sends to rank {b} after the \
             checksum (self-test: that link must FAIL)"
        );
    }
}

/// Rank 0's report: one line per link, the matrices (`--all`), the count of failures.
fn print_results(links: &[(usize, usize)], results: &[LinkResult], n: usize, matrices: bool) {
    println!("#");
    println!(
        "# {:>7} {:>9} {:>12} {:>15} {:>9} {:>6}",
        "link", "transport", "latency(us)", "bandwidth(GB/s)", "integrity", "result"
    );
    for &(a, b) in links {
        let r = &results[a * n + b];
        println!(
            "  {:>7} {:>9} {:>12.2} {:>15.3} {:>9} {:>6}",
            format!("{a}->{b}"),
            transport(r),
            r.latency_us,
            r.bandwidth,
            format!("{}/{}", r.messages - r.bad.min(r.messages), r.messages),
            verdict(r)
        );
    }
    if matrices {
        matrix("latency (us)", n, |a, b| {
            format!("{:.2}", results[a * n + b].latency_us)
        });
        matrix("bandwidth (GB/s)", n, |a, b| {
            format!("{:.3}", results[a * n + b].bandwidth)
        });
        matrix("transport and result", n, |a, b| {
            let r = &results[a * n + b];
            format!("{} {}", transport(r), verdict(r))
        });
    }
    let failed: Vec<String> = links
        .iter()
        .filter(|&&(a, b)| !results[a * n + b].passed())
        .map(|(a, b)| format!("{a}->{b}"))
        .collect();
    let total = links.len();
    let noun = if total == 1 { "link" } else { "links" };
    println!("#");
    if failed.is_empty() {
        println!("# {total} {noun}: all PASS");
    } else {
        println!(
            "# {total} {noun}: {} PASS, {} FAIL: {}",
            total - failed.len(),
            failed.len(),
            failed.join(" ")
        );
    }
}

fn transport(r: &LinkResult) -> &'static str {
    if r.shm {
        "shm"
    } else {
        "tcp"
    }
}

fn verdict(r: &LinkResult) -> &'static str {
    if r.passed() {
        "PASS"
    } else {
        "FAIL"
    }
}

/// Prints an n x n matrix of `cell(sender, receiver)`, "-" on the diagonal.
fn matrix(title: &str, n: usize, cell: impl Fn(usize, usize) -> String) {
    let cells: Vec<Vec<String>> = (0..n)
        .map(|a| {
            (0..n)
                .map(|b| if a == b { "-".to_string() } else { cell(a, b) })
                .collect()
        })
        .collect();
    let width = cells
        .iter()
        .flatten()
        .map(String::len)
        .chain([n.to_string().len()])
        .max()
        .unwrap_or(1);
    let label = n.saturating_sub(1).to_string().len().max(4);
    println!("#");
    println!("# {title}: row = sender, column = receiver");
    let head: Vec<String> = (0..n).map(|b| format!("{b:>width$}")).collect();
    println!("# {:>label$} {}", "", head.join(" "));
    for (a, row) in cells.iter().enumerate() {
        let row: Vec<String> = row.iter().map(|c| format!("{c:>width$}")).collect();
        println!("  {a:>label$} {}", row.join(" "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(argv: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from([&["hcomm_test"], argv].concat())
    }

    #[test]
    fn arguments() {
        assert!(cli(&[]).is_err(), "--all or --pair is required");
        assert!(cli(&["--all", "--pair", "0,1"]).is_err());
        let c = cli(&["--pair", "2, 3", "--corrupt", "2,3", "--bw-size", "1M"]).unwrap();
        assert_eq!(
            (c.pair, c.corrupt, c.bw_size),
            (Some((2, 3)), Some((2, 3)), 1 << 20)
        );
        assert!(cli(&["--pair", "1,1"]).is_err());
        assert!(cli(&["--pair", "1"]).is_err());
        assert!(cli(&["--pair", "a,1"]).is_err());
        assert!(cli(&["--all", "--window", "0"]).is_err());
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn every_ordered_pair_once() {
        let all = cli(&["--all"]).unwrap();
        let l = links(&all, 4).unwrap();
        assert_eq!(l.len(), 12);
        let mut sorted = l.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 12);
        assert!(l.iter().all(|&(a, b)| a != b && a < 4 && b < 4));
        let one = cli(&["--pair", "3,1"]).unwrap();
        assert_eq!(links(&one, 4).unwrap(), [(3, 1)]);
        assert!(links(&one, 3).is_err());
        let bad = cli(&["--all", "--corrupt", "0,5"]).unwrap();
        assert!(links(&bad, 4).is_err());
    }

    #[test]
    fn the_checker_finds_damage_after_the_checksum() {
        let seed = pattern::seed(1, 100, 2, 0);
        let mut msg = vec![0u8; 100 + SUM_BYTES];
        let (data, sum) = msg.split_at_mut(100);
        pattern::fill(data, seed);
        sum.copy_from_slice(&pattern::checksum(data).to_le_bytes());
        assert!(message_is_right(&msg, 100, seed));
        // Damage after the checksum was computed.
        msg[50] ^= 0x10;
        assert!(!message_is_right(&msg, 100, seed));
        msg[50] ^= 0x10;
        // A consistent message of the wrong data (stale, misrouted).
        assert!(!message_is_right(&msg, 100, pattern::seed(0, 100, 2, 0)));
        // Too long or too short.
        assert!(!message_is_right(&msg[..msg.len() - 1], 100, seed));
        msg.push(0);
        assert!(!message_is_right(&msg, 100, seed));
    }

    #[test]
    fn results_travel_as_numbers() {
        let r = LinkResult {
            tested: true,
            shm: true,
            latency_us: 3.5,
            bandwidth: 1.25,
            messages: 5,
            bad: 0,
        };
        assert_eq!(LinkResult::from_fields(&r.to_fields()), r);
        assert!(r.passed());
        // The receiver's part adds the wrong messages.
        let recv = LinkResult {
            bad: 2,
            ..LinkResult::empty()
        };
        let sum: Vec<f64> = r
            .to_fields()
            .iter()
            .zip(recv.to_fields())
            .map(|(a, b)| a + b)
            .collect();
        let both = LinkResult::from_fields(&sum);
        assert_eq!(both.bad, 2);
        assert!(!both.passed());
        assert!(!LinkResult::empty().passed());
    }
}
