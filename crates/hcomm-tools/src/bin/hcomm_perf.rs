//! `hcomm_perf`: nccl-tests-style performance sweeps over message sizes.
//!
//! Every operation is a subcommand sharing the sweep options ([`SweepArgs`]). The
//! point-to-point operations live in [`p2p`]; collectives will be further subcommands with
//! their own module next to it, reporting through the same [`Row`] and [`Report`].
//!
//! Conventions (as nccl-tests and the shared `mpi_bench.c`): time = median of individually
//! timed back-to-back iterations, measured on rank 0; algbw = size / time in GB/s
//! (1 GB = 1e9 bytes); busbw = algbw for point-to-point. Checking (`-c N`) happens after the
//! timed iterations, on N extra iterations with fresh data, so it never slows the timing.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

/// Measure hcomm's bandwidth and latency over a sweep of message sizes (like nccl-tests).
///
/// Start it on every rank of a job, for example
///
///   hcommrun -n 2 hcomm_perf pingpong -b 8 -e 128M -f 2
///
/// or start the ranks by hand with HCOMM_RANK, HCOMM_SIZE, HCOMM_ROOT_ADDR (rank 0 hosts the
/// rendezvous store there) and the same HCOMM_JOB_SECRET on every rank. Rank 0 decides the
/// sizes and iteration counts and tells the other ranks, and only rank 0 prints the table:
///
///   size count type redop root time(us) algbw busbw #wrong
///
/// size = message bytes; count = elements of `type`; time = median of individually timed
/// iterations (pingpong: half the round trip; stream: per message); algbw = size/time in
/// GB/s (1 GB = 1e9 bytes); busbw = algbw for point-to-point; #wrong = wrong bytes found by
/// the checked iterations (-c). Lines starting with '#' are comments.
///
/// Exit status: 0 on success, 1 when an hcomm call failed or any received byte was wrong,
/// 2 for bad arguments.
#[derive(Debug, Parser)]
#[command(name = "hcomm_perf", version, verbatim_doc_comment)]
struct Cli {
    /// The operation to measure.
    #[command(subcommand)]
    op: Operation,
}

/// The operations hcomm_perf measures, one subcommand each.
#[derive(Debug, Subcommand)]
enum Operation {
    /// Ranks 0 and 1 bounce a message: time = half the round trip (latency).
    ///
    /// Rank 0 sends `size` bytes to rank 1, which sends `size` bytes back. Other ranks idle.
    Pingpong(SweepArgs),
    /// Rank 0 streams a window of nonblocking sends to rank 1 (bandwidth).
    ///
    /// Rank 0 starts a window of isends to rank 1, which has posted as many irecvs into
    /// separate buffers; when all have arrived rank 1 sends one empty acknowledgement.
    /// time = (window time) / (messages in the window). Other ranks idle.
    Stream(StreamArgs),
}

/// Options every operation takes.
#[derive(Debug, Clone, Args)]
struct SweepArgs {
    /// Smallest message size in bytes; suffixes K, M, G (powers of 1024), e.g. 8, 64K, 16M.
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", default_value = "8",
          value_parser = parse_size)]
    min_bytes: u64,

    /// Largest message size in bytes (suffixes as for -b).
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", default_value = "128M",
          value_parser = parse_size)]
    max_bytes: u64,

    /// Multiply the size by this factor from one step to the next (at least 2).
    #[arg(short = 'f', long = "stepfactor", value_name = "FACTOR", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(2..=1024), conflicts_with = "step_bytes")]
    step_factor: u64,

    /// Add this many bytes from one step to the next instead of multiplying (suffixes as -b).
    #[arg(short = 'i', long = "stepbytes", value_name = "SIZE", value_parser = parse_size)]
    step_bytes: Option<u64>,

    /// Timed iterations per size; without it, enough for about --time-target seconds per
    /// size (at least 5, at most --max-iters), estimated from the warm-up.
    #[arg(short = 'n', long = "iters", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=MAX_ITERS))]
    iters: Option<u64>,

    /// Untimed warm-up iterations per size [default: 20 up to 1 MiB, 5 up to 16 MiB, else 2;
    /// at least 2 when the iteration count is estimated].
    #[arg(short = 'w', long = "warmup-iters", visible_alias = "warmup_iters", value_name = "N",
          value_parser = clap::value_parser!(u64).range(0..=MAX_ITERS))]
    warmup: Option<u64>,

    /// Checked iterations per size after the timed ones (0 = no check). Each fills the
    /// buffers with a pattern that depends on the sending rank, the size and the iteration,
    /// and counts every wrong received byte into #wrong.
    #[arg(short = 'c', long = "check", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    check: u64,

    /// Also write the rows as JSON to FILE (rank 0): a list of objects with the keys
    /// collective, size, count, type, redop, root, time_us, algbw, busbw, wrong
    /// (redop and root are null for point-to-point).
    #[arg(short = 'J', long = "json", value_name = "FILE")]
    json: Option<PathBuf>,

    /// Seconds of timed iterations to aim for per size when -n is not given.
    #[arg(long = "time-target", value_name = "SECS", default_value = "0.2",
          value_parser = parse_seconds)]
    time_target: f64,

    /// Most timed iterations per size when the count is estimated.
    #[arg(long = "max-iters", value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(5..=MAX_ITERS))]
    max_iters: u64,
}

/// Options of `stream`.
#[derive(Debug, Clone, Args)]
struct StreamArgs {
    #[command(flatten)]
    sweep: SweepArgs,

    /// Most messages in flight in one window.
    #[arg(long = "window", value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    window: u64,

    /// Fewer messages per window for large sizes: window x size stays at most this many
    /// bytes (but the window has at least one message).
    #[arg(long = "window-bytes", value_name = "SIZE", default_value = "8M",
          value_parser = parse_size)]
    window_bytes: u64,
}

/// Upper bound of -n and -w, far beyond any sensible run.
const MAX_ITERS: u64 = 100_000_000;
/// Fewest timed iterations when the count is estimated (the median needs a few).
const MIN_ITERS: u64 = 5;
/// Most sizes in one sweep.
const MAX_SIZES: usize = 4096;

/// Parses a byte count: digits with an optional K, M, G or T suffix (powers of 1024),
/// optionally followed by `B` or `iB` (`64K`, `16MiB`, `128m`).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size: expected digits, e.g. 8, 64K, 16M"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is too large for a size"))?;
    let upper = suffix.to_ascii_uppercase();
    let unit = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => {
            return Err(format!(
                "{s:?} has an unknown unit: use K, M, G or T (powers of 1024)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large for a size"))
}

/// Parses a positive number of seconds (at most one hour).
fn parse_seconds(s: &str) -> Result<f64, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    // Also rejects NaN, which compares false to everything.
    if !(secs.is_finite() && secs > 0.0 && secs <= 3600.0) {
        return Err(format!("{s:?} must be above 0 and at most 3600 seconds"));
    }
    Ok(secs)
}

impl SweepArgs {
    /// The message sizes of the sweep, smallest first.
    fn sizes(&self) -> anyhow::Result<Vec<u64>> {
        if self.min_bytes > self.max_bytes {
            bail!(
                "-b {} is larger than -e {}: the sweep would be empty",
                self.min_bytes,
                self.max_bytes
            );
        }
        let mut sizes = Vec::new();
        let mut size = self.min_bytes;
        loop {
            if sizes.len() == MAX_SIZES {
                bail!("the sweep has more than {MAX_SIZES} sizes: raise -f or -i");
            }
            sizes.push(size);
            let next = match self.step_bytes {
                Some(0) => bail!("-i 0 would repeat one size forever"),
                Some(step) => size.checked_add(step),
                // 0 x factor stays 0: continue the sweep with 1 byte.
                None => Some(size.saturating_mul(self.step_factor).max(1)),
            };
            match next {
                Some(n) if n <= self.max_bytes && n > size => size = n,
                _ => break,
            }
        }
        Ok(sizes)
    }

    /// Untimed warm-up iterations for `size` bytes.
    fn warmup_for(&self, size: u64) -> u64 {
        let default = match size {
            0..=0x10_0000 => 20,
            0x10_0001..=0x100_0000 => 5,
            _ => 2,
        };
        let w = self.warmup.unwrap_or(default);
        // The estimate of the iteration count times iterations 2..w.
        if self.iters.is_none() {
            w.max(2)
        } else {
            w
        }
    }

    /// Timed iterations, from the warm-up's time per iteration.
    fn iters_for(&self, per_iter_secs: f64) -> u64 {
        if let Some(n) = self.iters {
            return n;
        }
        let est = per_iter_secs.max(1e-9);
        // `as` saturates for huge quotients; the clamp does the rest.
        ((self.time_target / est) as u64).clamp(MIN_ITERS, self.max_iters)
    }
}

/// One line of the results table (and one object of the JSON output).
#[derive(Debug, Clone, Serialize)]
struct Row {
    /// Operation name (`pingpong`, `stream`, later the collectives).
    collective: &'static str,
    /// Message size in bytes (nccl-tests convention for collectives).
    size: u64,
    /// Elements of `type`.
    count: u64,
    /// Element type.
    #[serde(rename = "type")]
    dtype: &'static str,
    /// Reduction operation; `None` (printed "-", JSON null) where there is none.
    redop: Option<&'static str>,
    /// Root rank; `None` (printed "-", JSON null) where there is none.
    root: Option<usize>,
    /// Median time per operation, microseconds.
    time_us: f64,
    /// size / time, GB/s.
    algbw: f64,
    /// Bus bandwidth, GB/s (nccl-tests' per-collective factor x algbw).
    busbw: f64,
    /// Wrong bytes found by the checked iterations, summed over all ranks.
    wrong: u64,
}

/// Rank 0's output: the table on stdout as rows arrive, the JSON file at the end.
struct Report {
    rows: Vec<Row>,
    out: io::Stdout,
    /// The JSON file (-J), created before the sweep so that a bad path fails at once.
    json: Option<(PathBuf, BufWriter<File>)>,
}

impl Report {
    fn new(json: Option<&Path>) -> anyhow::Result<Report> {
        let json = match json {
            Some(path) => {
                let file = File::create(path)
                    .with_context(|| format!("cannot create {}", path.display()))?;
                Some((path.to_path_buf(), BufWriter::new(file)))
            }
            None => None,
        };
        Ok(Report {
            rows: Vec::new(),
            out: io::stdout(),
            json,
        })
    }

    /// Prints comment lines (each gets a leading "# ").
    fn comment(&mut self, text: &str) -> io::Result<()> {
        let mut out = self.out.lock();
        for line in text.lines() {
            writeln!(out, "# {line}")?;
        }
        out.flush()
    }

    fn header(&mut self) -> io::Result<()> {
        let mut out = self.out.lock();
        writeln!(out, "#")?;
        writeln!(
            out,
            "# {:>10} {:>12} {:>7} {:>6} {:>5} {:>11} {:>9} {:>9} {:>7}",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"
        )?;
        let units = format!(
            "# {:>10} {:>12} {:>7} {:>6} {:>5} {:>11} {:>9} {:>9}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)"
        );
        writeln!(out, "{}", units.trim_end())?;
        out.flush()
    }

    fn row(&mut self, row: Row) -> io::Result<()> {
        {
            let mut out = self.out.lock();
            writeln!(
                out,
                "  {:>10} {:>12} {:>7} {:>6} {:>5} {:>11.2} {:>9.3} {:>9.3} {:>7}",
                row.size,
                row.count,
                row.dtype,
                row.redop.unwrap_or("-"),
                row.root.map_or_else(|| "-".to_string(), |r| r.to_string()),
                row.time_us,
                row.algbw,
                row.busbw,
                row.wrong
            )?;
            out.flush()?;
        }
        self.rows.push(row);
        Ok(())
    }

    /// The closing lines, as nccl-tests prints them.
    fn footer(&mut self) -> io::Result<()> {
        let wrong: u64 = self.rows.iter().map(|r| r.wrong).sum();
        let avg = if self.rows.is_empty() {
            0.0
        } else {
            self.rows.iter().map(|r| r.busbw).sum::<f64>() / self.rows.len() as f64
        };
        let verdict = if wrong == 0 { "OK" } else { "FAILED" };
        self.comment(&format!(
            "Out of bounds values : {wrong} {verdict}\nAvg bus bandwidth    : {avg:.3}\n"
        ))
    }

    /// Writes the rows to the JSON file, if there is one.
    fn write_json(&mut self) -> anyhow::Result<()> {
        let Some((path, w)) = &mut self.json else {
            return Ok(());
        };
        serde_json::to_writer_pretty(&mut *w, &self.rows)
            .with_context(|| format!("cannot write {}", path.display()))?;
        writeln!(w)
            .and_then(|()| w.flush())
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

/// How a run ended when no error stopped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Every checked byte was right.
    Passed,
    /// Some received bytes were wrong (all ranks learn the total).
    Wrong(u64),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    run(&cli)
}

/// Runs the measurement on this rank and prints its errors; returns the exit status.
fn run(cli: &Cli) -> ExitCode {
    // Until the job is joined, the launcher's word for the rank.
    let launcher_rank = std::env::var("HCOMM_RANK").unwrap_or_else(|_| "?".to_string());
    let (sweep, kind) = match &cli.op {
        Operation::Pingpong(a) => (a, p2p::Kind::PingPong),
        Operation::Stream(a) => (
            &a.sweep,
            p2p::Kind::Stream {
                window: a.window,
                window_bytes: a.window_bytes,
            },
        ),
    };
    // Check the arguments before joining the job, so that a typo fails fast on every rank.
    let sizes = match sweep.sizes() {
        Ok(s) => s,
        Err(e) => return finish(&launcher_rank, Err(e)),
    };
    let comm = match hcomm::Communicator::init() {
        Ok(c) => c,
        Err(e) => {
            let e = anyhow::Error::new(e).context("cannot join the job");
            return finish(&launcher_rank, Err(e));
        }
    };
    let outcome = p2p::run(&comm, kind, sweep, &sizes);
    // Report before the communicator goes: dropping it waits for the other ranks to finish,
    // and a launcher may stop this rank meanwhile (when another rank failed first).
    let code = finish(&comm.rank().to_string(), outcome);
    drop(comm);
    code
}

/// Prints how this rank's run ended and turns it into the exit status.
fn finish(rank: &str, outcome: anyhow::Result<Outcome>) -> ExitCode {
    match outcome {
        Ok(Outcome::Passed) => ExitCode::SUCCESS,
        Ok(Outcome::Wrong(n)) => {
            eprintln!("hcomm_perf: rank {rank}: {n} received bytes were wrong");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("hcomm_perf: rank {rank}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Point-to-point operations between ranks 0 and 1.
///
/// Rank 0 drives: before each size it sends rank 1 a plan (operation, size, warm-up,
/// window, checks), after the warm-up the number of timed iterations, and at the end a
/// "done" message with the total of wrong bytes. Rank 1 checks the plan against its own
/// arguments, so ranks started with different options fail with a clear message instead of
/// hanging.
mod p2p {
    use std::time::Instant;

    use anyhow::{bail, Context as _};
    use hcomm::Communicator;

    use super::{Outcome, Report, Row, SweepArgs};

    /// Tag of rank 0's data messages.
    const TAG_DATA: u32 = 1;
    /// Tag of rank 1's replies (pingpong) and acknowledgements (stream).
    const TAG_REPLY: u32 = 2;
    /// Tag of the control messages (plan, iteration count, wrong counts, done).
    const TAG_CONTROL: u32 = 0x7065_7266;
    /// First word of a plan message.
    const MSG_PLAN: u64 = 0x504c_414e;
    /// First word of the final message.
    const MSG_DONE: u64 = 0x444f_4e45;
    /// First word of the message rank 0 sends when it stops on an error.
    const MSG_ABORT: u64 = 0x4142_5254;
    /// Words in a plan or done message.
    const CONTROL_WORDS: usize = 6;

    /// Which point-to-point pattern to time.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Kind {
        /// Send and reply; half the round trip.
        PingPong,
        /// A window of nonblocking sends and one acknowledgement.
        Stream {
            /// Most messages in a window.
            window: u64,
            /// Largest window x size.
            window_bytes: u64,
        },
    }

    impl Kind {
        fn name(self) -> &'static str {
            match self {
                Kind::PingPong => "pingpong",
                Kind::Stream { .. } => "stream",
            }
        }

        fn code(self) -> u64 {
            match self {
                Kind::PingPong => 1,
                Kind::Stream { .. } => 2,
            }
        }

        /// Messages per iteration for `size` bytes.
        fn window(self, size: u64) -> u64 {
            match self {
                Kind::PingPong => 1,
                Kind::Stream {
                    window,
                    window_bytes,
                } => (window_bytes / size.max(1)).clamp(1, window),
            }
        }

        /// The part of one iteration's time that counts as one operation.
        fn time_fraction(self, size: u64) -> f64 {
            match self {
                Kind::PingPong => 0.5,
                Kind::Stream { .. } => 1.0 / self.window(size) as f64,
            }
        }
    }

    /// Runs the sweep on this rank. Ranks other than 0 and 1 only join and leave.
    pub(super) fn run(
        comm: &Communicator,
        kind: Kind,
        args: &SweepArgs,
        sizes: &[u64],
    ) -> anyhow::Result<Outcome> {
        if comm.size() < 2 {
            bail!(
                "{} needs at least 2 ranks, the job has {}: start it with `hcommrun -n 2`",
                kind.name(),
                comm.size()
            );
        }
        match comm.rank() {
            0 => lead(comm, kind, args, sizes),
            1 => follow(comm, kind, args, sizes),
            _ => Ok(Outcome::Passed),
        }
    }

    /// Rank 0: runs [`lead_sweep`]; when it fails, tells rank 1 (if it is listening) so
    /// that it stops at once instead of waiting for `HCOMM_TIMEOUT`.
    fn lead(
        comm: &Communicator,
        kind: Kind,
        args: &SweepArgs,
        sizes: &[u64],
    ) -> anyhow::Result<Outcome> {
        let result = lead_sweep(comm, kind, args, sizes);
        if result.is_err() {
            // Best effort: the original error is what matters.
            let _ = send_words(comm, &[MSG_ABORT, kind.code(), 0, 0, 0, 0]);
        }
        result
    }

    /// Rank 0: times every size, collects the checks, prints and writes the report.
    fn lead_sweep(
        comm: &Communicator,
        kind: Kind,
        args: &SweepArgs,
        sizes: &[u64],
    ) -> anyhow::Result<Outcome> {
        let mut report = Report::new(args.json.as_deref())?;
        let cfg = comm.config();
        let iters = match args.iters {
            Some(n) => format!("{n} iterations"),
            None => format!("~{} s per size", args.time_target),
        };
        report.comment(&format!(
            "hcomm_perf {} {}\n\
             ranks: {} (0 and 1 take part), sizes {}..{} B, {iters}, checked iterations: {}\n\
             hcomm: tcp streams {}, eager limit {} B, chunk {} B, timeout {:.0} s\n\
             time = median per {}; algbw = size/time (1 GB = 1e9 B); busbw = algbw",
            kind.name(),
            env!("CARGO_PKG_VERSION"),
            comm.size(),
            sizes.first().copied().unwrap_or(0),
            sizes.last().copied().unwrap_or(0),
            args.check,
            cfg.tcp_streams,
            cfg.tcp_eager_limit,
            cfg.tcp_chunk,
            cfg.timeout.as_secs_f64(),
            match kind {
                Kind::PingPong => "half round trip",
                Kind::Stream { .. } => "message in a window of nonblocking sends",
            },
        ))?;
        report.header()?;
        let mut total_wrong = 0u64;
        for &size in sizes {
            let mut bench = Bench::new(comm, kind, size)?;
            let warmup = args.warmup_for(size);
            send_words(
                comm,
                &[
                    MSG_PLAN,
                    kind.code(),
                    size,
                    warmup,
                    bench.window as u64,
                    args.check,
                ],
            )?;
            let mut since_first = None;
            for i in 0..warmup {
                if i == 1 {
                    since_first = Some(Instant::now());
                }
                bench.iteration()?;
            }
            let per_iter = match since_first {
                Some(t) => t.elapsed().as_secs_f64() / (warmup - 1) as f64,
                None => 0.0,
            };
            let iters = args.iters_for(per_iter);
            send_words(comm, &[iters])?;
            let mut times = Vec::with_capacity(usize::try_from(iters.min(1 << 20)).unwrap_or(0));
            for _ in 0..iters {
                let t = Instant::now();
                bench.iteration()?;
                times.push(t.elapsed().as_secs_f64());
            }
            let mut wrong = bench.length_errors;
            for k in 0..args.check {
                wrong += bench.checked_iteration(k)?;
            }
            let [theirs] = recv_words::<1>(comm, "the wrong-byte count")?;
            wrong += theirs;
            total_wrong += wrong;
            times.sort_by(f64::total_cmp);
            let median =
                times.get(times.len() / 2).copied().unwrap_or(0.0) * kind.time_fraction(size);
            let algbw = if median > 0.0 {
                size as f64 / median / 1e9
            } else {
                0.0
            };
            report.row(Row {
                collective: kind.name(),
                size,
                count: size,
                dtype: "uint8",
                redop: None,
                root: None,
                time_us: median * 1e6,
                algbw,
                busbw: algbw,
                wrong,
            })?;
        }
        report.footer()?;
        report.write_json()?;
        send_words(comm, &[MSG_DONE, kind.code(), total_wrong, 0, 0, 0])?;
        Ok(if total_wrong == 0 {
            Outcome::Passed
        } else {
            Outcome::Wrong(total_wrong)
        })
    }

    /// Rank 1: follows rank 0's plan.
    fn follow(
        comm: &Communicator,
        kind: Kind,
        args: &SweepArgs,
        sizes: &[u64],
    ) -> anyhow::Result<Outcome> {
        let mut expected = sizes.iter();
        loop {
            let [what, code, a, b, c, d] = recv_words::<CONTROL_WORDS>(comm, "rank 0's plan")?;
            if code != kind.code() {
                bail!(
                    "rank 0 runs a different operation than this rank ({}): start every rank \
                     with the same arguments",
                    kind.name()
                );
            }
            if what == MSG_DONE {
                return Ok(if a == 0 {
                    Outcome::Passed
                } else {
                    Outcome::Wrong(a)
                });
            }
            if what != MSG_PLAN {
                bail!("rank 0 sent an unknown control message ({what:#x})");
            }
            let (size, warmup, window, checks) = (a, b, c, d);
            if expected.next() != Some(&size) {
                bail!(
                    "rank 0 wants size {size}, which is not next in this rank's sweep: start \
                     every rank with the same -b/-e/-f/-i"
                );
            }
            let mut bench = Bench::new(comm, kind, size)?;
            if bench.window as u64 != window || checks != args.check {
                bail!(
                    "rank 0 uses a window of {window} and {checks} checked iterations, this rank \
                     {} and {}: start every rank with the same arguments",
                    bench.window,
                    args.check
                );
            }
            for _ in 0..warmup {
                bench.iteration()?;
            }
            let [iters] = recv_words::<1>(comm, "the iteration count")?;
            for _ in 0..iters {
                bench.iteration()?;
            }
            let mut wrong = bench.length_errors;
            for k in 0..checks {
                wrong += bench.checked_iteration(k)?;
            }
            send_words(comm, &[wrong])?;
        }
    }

    /// Sends little-endian words to the other rank of the pair on the control tag.
    fn send_words(comm: &Communicator, words: &[u64]) -> anyhow::Result<()> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let peer = 1 - comm.rank();
        comm.send(&bytes, peer, TAG_CONTROL)
            .with_context(|| format!("sending a control message to rank {peer}"))
    }

    /// Receives exactly `N` little-endian words from the other rank of the pair.
    fn recv_words<const N: usize>(comm: &Communicator, what: &str) -> anyhow::Result<[u64; N]> {
        let peer = 1 - comm.rank();
        // Room for more than expected, so that a longer message (rank 0's abort, or another
        // version's) is reported, not truncated.
        let mut bytes = vec![0u8; (N.max(CONTROL_WORDS) + 1) * 8];
        let len = comm
            .recv(&mut bytes, peer, TAG_CONTROL)
            .with_context(|| format!("receiving {what} from rank {peer}"))?;
        if len == CONTROL_WORDS * 8 && bytes[..8] == MSG_ABORT.to_le_bytes() {
            bail!("rank {peer} stopped on an error (see its output)");
        }
        if len != N * 8 {
            bail!(
                "rank {peer} sent {len} bytes for {what}, expected {}: are both ranks the same \
                 hcomm_perf version?",
                N * 8
            );
        }
        let mut words = [0u64; N];
        for (w, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *w = u64::from_le_bytes(b);
        }
        Ok(words)
    }

    /// One rank's buffers for one size.
    struct Bench<'a> {
        comm: &'a Communicator,
        kind: Kind,
        rank: usize,
        size: usize,
        /// Messages per iteration.
        window: usize,
        /// Rank 0: the messages to send. Rank 1: the receive buffers (stream) or the reply
        /// (pingpong). Empty while lent to nonblocking requests.
        bufs: Vec<Vec<u8>>,
        /// Rank 0: the reply buffer (pingpong). Rank 1: the receive buffer (pingpong).
        other: Vec<u8>,
        /// Bytes missing or extra in received messages, over all iterations.
        length_errors: u64,
    }

    impl<'a> Bench<'a> {
        fn new(comm: &'a Communicator, kind: Kind, size: u64) -> anyhow::Result<Bench<'a>> {
            let size = usize::try_from(size)
                .with_context(|| format!("{size} bytes do not fit in this machine's memory"))?;
            let window = usize::try_from(kind.window(size as u64)).unwrap_or(1);
            let rank = comm.rank();
            let mut bufs = Vec::with_capacity(window);
            for j in 0..window {
                let mut b = alloc(size)?;
                pattern::fill(&mut b, pattern::seed(rank, size, u64::MAX, j));
                bufs.push(b);
            }
            let other = match kind {
                Kind::PingPong => alloc(size)?,
                Kind::Stream { .. } => Vec::new(),
            };
            Ok(Bench {
                comm,
                kind,
                rank,
                size,
                window,
                bufs,
                other,
                length_errors: 0,
            })
        }

        /// One unchecked iteration (its time is what rank 0 measures).
        fn iteration(&mut self) -> anyhow::Result<()> {
            match self.kind {
                Kind::PingPong => self.pingpong(),
                Kind::Stream { .. } => self.stream(),
            }
        }

        fn pingpong(&mut self) -> anyhow::Result<()> {
            let c = self.comm;
            if self.rank == 0 {
                c.send(&self.bufs[0], 1, TAG_DATA)
                    .context("pingpong: sending to rank 1")?;
                let n = c
                    .recv(&mut self.other, 1, TAG_REPLY)
                    .context("pingpong: receiving from rank 1")?;
                self.note_length(n);
            } else {
                let n = c
                    .recv(&mut self.other, 0, TAG_DATA)
                    .context("pingpong: receiving from rank 0")?;
                self.note_length(n);
                c.send(&self.bufs[0], 0, TAG_REPLY)
                    .context("pingpong: replying to rank 0")?;
            }
            Ok(())
        }

        fn stream(&mut self) -> anyhow::Result<()> {
            let c = self.comm;
            let bufs = std::mem::take(&mut self.bufs);
            if self.rank == 0 {
                let reqs = bufs
                    .into_iter()
                    .map(|b| c.isend(b, 1, TAG_DATA))
                    .collect::<hcomm::Result<Vec<_>>>()
                    .context("stream: starting a send to rank 1")?;
                let done = hcomm::wait_all(reqs).context("stream: sending to rank 1")?;
                self.bufs = done.into_iter().map(|d| d.buffer).collect();
                c.recv(&mut [], 1, TAG_REPLY)
                    .context("stream: receiving the acknowledgement of rank 1")?;
            } else {
                let reqs = bufs
                    .into_iter()
                    .map(|b| c.irecv(b, 0, TAG_DATA))
                    .collect::<hcomm::Result<Vec<_>>>()
                    .context("stream: starting a receive from rank 0")?;
                let done = hcomm::wait_all(reqs).context("stream: receiving from rank 0")?;
                let mut bufs = Vec::with_capacity(done.len());
                for d in done {
                    self.note_length(d.len);
                    bufs.push(d.buffer);
                }
                self.bufs = bufs;
                c.send(&[], 0, TAG_REPLY)
                    .context("stream: acknowledging to rank 0")?;
            }
            Ok(())
        }

        /// Counts a received length other than the size as that many wrong bytes.
        fn note_length(&mut self, len: usize) {
            self.length_errors += len.abs_diff(self.size) as u64;
        }

        /// One iteration on fresh data (pattern `k`); returns this rank's wrong bytes.
        fn checked_iteration(&mut self, k: u64) -> anyhow::Result<u64> {
            let size = self.size;
            // The sender fills its messages; the receiver fills its buffers with the
            // complement of what it expects, so every byte not written counts as wrong.
            let (sender, receiver) = match self.kind {
                Kind::PingPong => (self.rank, 1 - self.rank),
                Kind::Stream { .. } => (0, 1),
            };
            let mine = pattern::seed(self.rank, size, k, 0);
            match self.kind {
                Kind::PingPong => {
                    pattern::fill(&mut self.bufs[0], mine);
                    let theirs = pattern::seed(1 - self.rank, size, k, 0);
                    pattern::fill_complement(&mut self.other, theirs);
                }
                Kind::Stream { .. } => {
                    for (j, b) in self.bufs.iter_mut().enumerate() {
                        let s = pattern::seed(sender, size, k, j);
                        if self.rank == receiver {
                            pattern::fill_complement(b, s);
                        } else {
                            pattern::fill(b, s);
                        }
                    }
                }
            }
            let before = self.length_errors;
            self.iteration()?;
            let mut wrong = self.length_errors - before;
            match self.kind {
                Kind::PingPong => {
                    let theirs = pattern::seed(1 - self.rank, size, k, 0);
                    wrong += pattern::count_wrong(&self.other, theirs);
                }
                Kind::Stream { .. } if self.rank == receiver => {
                    for (j, b) in self.bufs.iter().enumerate() {
                        wrong += pattern::count_wrong(b, pattern::seed(sender, size, k, j));
                    }
                }
                Kind::Stream { .. } => {}
            }
            // Length errors of a checked iteration are already in `wrong`.
            self.length_errors = before;
            Ok(wrong)
        }
    }

    /// A zeroed buffer of `size` bytes, or an error instead of an abort when memory is short.
    fn alloc(size: usize) -> anyhow::Result<Vec<u8>> {
        let mut v = Vec::new();
        v.try_reserve_exact(size)
            .with_context(|| format!("cannot allocate a {size}-byte buffer"))?;
        v.resize(size, 0);
        Ok(v)
    }

    /// The check pattern: a pseudo-random byte stream per (sending rank, size, iteration,
    /// message), so that misplaced, stale, duplicated or foreign data all show up.
    pub(super) mod pattern {
        fn mix(mut x: u64) -> u64 {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        }

        /// The seed of the message `msg` that `rank` sends at checked iteration `iter`.
        pub fn seed(rank: usize, size: usize, iter: u64, msg: usize) -> u64 {
            [rank as u64, size as u64, iter, msg as u64]
                .iter()
                .fold(0x6863_6f6d_6d5f_7066, |s, &v| mix(s ^ v))
        }

        /// The 8 pattern bytes at word `w` of the stream `seed`.
        fn word(seed: u64, w: usize) -> [u8; 8] {
            mix(seed ^ (w as u64).wrapping_mul(0xd134_2543_de82_ef95)).to_le_bytes()
        }

        /// Fills `buf` with the pattern `seed`.
        pub fn fill(buf: &mut [u8], seed: u64) {
            fill_with(buf, seed, 0);
        }

        /// Fills `buf` with the bitwise complement of the pattern `seed`.
        pub fn fill_complement(buf: &mut [u8], seed: u64) {
            fill_with(buf, seed, 0xff);
        }

        fn fill_with(buf: &mut [u8], seed: u64, xor: u8) {
            for (w, chunk) in buf.chunks_mut(8).enumerate() {
                let expect = word(seed, w);
                for (b, e) in chunk.iter_mut().zip(expect) {
                    *b = e ^ xor;
                }
            }
        }

        /// Number of bytes of `buf` that differ from the pattern `seed`.
        pub fn count_wrong(buf: &[u8], seed: u64) -> u64 {
            let mut wrong = 0u64;
            for (w, chunk) in buf.chunks(8).enumerate() {
                let expect = word(seed, w);
                if chunk != &expect[..chunk.len()] {
                    wrong += chunk.iter().zip(expect).filter(|(b, e)| *b != e).count() as u64;
                }
            }
            wrong
        }
    }
}

#[cfg(test)]
mod tests {
    use super::p2p::pattern;
    use super::*;

    fn sweep(extra: &[&str]) -> SweepArgs {
        let mut argv = vec!["hcomm_perf", "pingpong"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).expect("valid arguments").op {
            Operation::Pingpong(a) => a,
            Operation::Stream(a) => a.sweep,
        }
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("128m"), Ok(128 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("2MB"), Ok(2 << 20));
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn seconds_must_be_positive_and_finite() {
        assert_eq!(parse_seconds("0.2"), Ok(0.2));
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("NaN").is_err());
        assert!(parse_seconds("inf").is_err());
        assert!(parse_seconds("x").is_err());
    }

    #[test]
    fn doubling_sweep() {
        let s = sweep(&["-b", "8", "-e", "64"]).sizes().unwrap();
        assert_eq!(s, vec![8, 16, 32, 64]);
        let s = sweep(&["-b", "8", "-e", "100", "-f", "4"]).sizes().unwrap();
        assert_eq!(s, vec![8, 32]);
        let s = sweep(&["-b", "0", "-e", "4"]).sizes().unwrap();
        assert_eq!(s, vec![0, 1, 2, 4]);
        let s = sweep(&["-b", "1M", "-e", "1M"]).sizes().unwrap();
        assert_eq!(s, vec![1 << 20]);
    }

    #[test]
    fn additive_sweep_and_bad_ranges() {
        let s = sweep(&["-b", "1K", "-e", "4K", "-i", "1K"])
            .sizes()
            .unwrap();
        assert_eq!(s, vec![1024, 2048, 3072, 4096]);
        assert!(sweep(&["-b", "8", "-e", "4"]).sizes().is_err());
        assert!(sweep(&["-b", "0", "-e", "1M", "-i", "0"]).sizes().is_err());
        assert!(sweep(&["-b", "1", "-e", "1G", "-i", "1"]).sizes().is_err());
        assert!(Cli::try_parse_from(["hcomm_perf", "pingpong", "-f", "1"]).is_err());
        assert!(Cli::try_parse_from(["hcomm_perf", "pingpong", "-f", "2", "-i", "8"]).is_err());
    }

    #[test]
    fn huge_sizes_do_not_overflow() {
        let s = sweep(&["-b", "8", "-e", "16777215T"]).sizes().unwrap();
        assert_eq!(s.first(), Some(&8));
        assert!(s.windows(2).all(|w| w[1] == w[0] * 2));
    }

    #[test]
    fn iteration_count_follows_the_time_target() {
        let s = sweep(&[]);
        assert_eq!(s.iters_for(0.001), 200);
        assert_eq!(s.iters_for(10.0), MIN_ITERS);
        assert_eq!(s.iters_for(0.0), 100_000);
        assert_eq!(sweep(&["-n", "7"]).iters_for(1e-6), 7);
        assert_eq!(s.warmup_for(8), 20);
        assert_eq!(s.warmup_for(16 << 20), 5);
        assert_eq!(s.warmup_for(128 << 20), 2);
        assert_eq!(sweep(&["-w", "0"]).warmup_for(8), 2);
        assert_eq!(sweep(&["-w", "0", "-n", "3"]).warmup_for(8), 0);
    }

    #[test]
    fn pattern_detects_every_wrong_byte() {
        let seed = pattern::seed(0, 13, 0, 0);
        let mut buf = vec![0u8; 13];
        pattern::fill(&mut buf, seed);
        assert_eq!(pattern::count_wrong(&buf, seed), 0);
        buf[3] ^= 1;
        buf[12] ^= 0x80;
        assert_eq!(pattern::count_wrong(&buf, seed), 2);
        pattern::fill_complement(&mut buf, seed);
        assert_eq!(pattern::count_wrong(&buf, seed), 13);
        // Different rank, size, iteration or message give different data.
        let other = [
            pattern::seed(1, 13, 0, 0),
            pattern::seed(0, 14, 0, 0),
            pattern::seed(0, 13, 1, 0),
            pattern::seed(0, 13, 0, 1),
        ];
        pattern::fill(&mut buf, seed);
        for s in other {
            assert!(pattern::count_wrong(&buf, s) > 0);
        }
    }

    #[test]
    fn json_rows_have_the_documented_keys() {
        let row = Row {
            collective: "pingpong",
            size: 8,
            count: 8,
            dtype: "uint8",
            redop: None,
            root: None,
            time_us: 1.5,
            algbw: 0.005,
            busbw: 0.005,
            wrong: 0,
        };
        let v = serde_json::to_value([row]).unwrap();
        let obj = v[0].as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "algbw",
                "busbw",
                "collective",
                "count",
                "redop",
                "root",
                "size",
                "time_us",
                "type",
                "wrong"
            ]
        );
        assert_eq!(obj["type"], "uint8");
        assert!(obj["redop"].is_null());
    }

    #[test]
    fn help_renders() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
