//! `hcomm_perf`: nccl-tests-style performance sweeps over message sizes.
//!
//! Every operation is a subcommand sharing the sweep options ([`SweepArgs`]). The
//! point-to-point operations live in [`p2p`], the collectives in [`collective`]; both report
//! through the same [`Row`] and [`Report`].
//!
//! Conventions (as nccl-tests and the shared `mpi_bench.c`): time = median of individually
//! timed back-to-back iterations; point-to-point measures it on rank 0, collectives on every
//! rank and report the slowest rank's median (the maximum over the ranks, found with an
//! all-reduce after the timed iterations, like `mpi_bench`); algbw = size / time in GB/s
//! (1 GB = 1e9 bytes); busbw = algbw x nccl-tests' factor of the collective (1 for
//! point-to-point). Checking (`-c N`) happens after the timed iterations, on N extra
//! iterations with fresh data, so it never slows the timing.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use hcomm::coll::CollKind;
use hcomm::{DataType, ReduceOp};
use hcomm_tools::parse_size;
use hcomm_tools::plot::{self, Curve};
use serde::Serialize;

/// Measure hcomm's bandwidth and latency over a sweep of message sizes (like nccl-tests).
///
/// Start it on every rank of a job, for example
///
///   hcommrun -n 2 hcomm_perf pingpong -b 8 -e 128M -f 2
///   hcommrun -n 4 hcomm_perf allreduce -b 8 -e 128M -f 2 -d float32 -o sum
///   hcommrun -n 4 hcomm_perf all -a --plot busbw.svg --peer ompi=mpi_bench.txt
///
/// or start the ranks by hand with HCOMM_RANK, HCOMM_SIZE, HCOMM_ROOT_ADDR (rank 0 hosts the
/// rendezvous store there) and the same HCOMM_JOB_SECRET on every rank. Every rank must get
/// the same arguments; the iteration counts are agreed between the ranks, and only rank 0
/// prints the table:
///
///   size count type redop root time(us) algbw busbw #wrong [algo]
///
/// size = bytes as nccl-tests counts them (point-to-point: the message; allreduce,
/// broadcast, reduce: the buffer of each rank; alltoall: each rank's send buffer; allgather
/// and gather: the whole output; reduce_scatter and scatter: the whole input); count =
/// elements of `type` in that size; time = median of individually timed iterations
/// (pingpong: half the round trip; stream: per message; collectives: the slowest rank's
/// median); algbw = size/time in GB/s (1 GB = 1e9 bytes); busbw = algbw x 2(n-1)/n
/// (allreduce), x (n-1)/n (allgather, reduce_scatter, alltoall, gather, scatter), x 1
/// (broadcast, reduce, point-to-point); #wrong = wrong bytes (point-to-point) or elements
/// (collectives) found by the checked iterations (-c); algo = the algorithm hcomm chose
/// (collectives). Lines starting with '#' are comments.
///
/// Exit status: 0 on success, 1 when an hcomm call failed or any received value was wrong,
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
    /// All-reduce: size = each rank's buffer; busbw = algbw x 2(n-1)/n.
    #[command(visible_alias = "all_reduce")]
    Allreduce(CollArgs),
    /// Broadcast from the root (-r), in place: size = the buffer; busbw = algbw.
    #[command(visible_alias = "bcast")]
    Broadcast(CollArgs),
    /// Reduce to the root (-r): size = each rank's buffer; busbw = algbw.
    Reduce(CollArgs),
    /// All-gather: size = the whole output (n blocks); busbw = algbw x (n-1)/n.
    #[command(visible_alias = "all_gather")]
    Allgather(CollArgs),
    /// Reduce-scatter: size = the whole input (n blocks); busbw = algbw x (n-1)/n.
    #[command(name = "reduce_scatter", visible_alias = "reduce-scatter")]
    ReduceScatter(CollArgs),
    /// All-to-all: size = each rank's send buffer (n blocks); busbw = algbw x (n-1)/n.
    #[command(visible_alias = "all_to_all")]
    Alltoall(CollArgs),
    /// Gather to the root (-r): size = the root's whole output (n blocks);
    /// busbw = algbw x (n-1)/n.
    Gather(CollArgs),
    /// Scatter from the root (-r): size = the root's whole input (n blocks);
    /// busbw = algbw x (n-1)/n.
    Scatter(CollArgs),
    /// Every collective in turn: allreduce, broadcast, reduce, allgather, reduce_scatter,
    /// alltoall, gather, scatter (one table each, one JSON file for all).
    All(CollArgs),
    /// Grouped calls: many small all-reduces one by one, then the same in one batch.
    ///
    /// Times `--ops` separate float32 sum all-reduces of `--count` elements, then one
    /// `Communicator::batch` holding the same calls (fused into one all-reduce), and prints
    /// both times and their ratio. Results of both are checked.
    Batch(BatchArgs),
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
    /// collective, size, count, type, redop, root, time_us, algbw, busbw, wrong, algo (what
    /// ran at that size) and curve (the row's curve in plots: the algorithm forced by
    /// --algo, -a or HCOMM_ALGO, or "auto"); redop, root, algo and curve are null for
    /// point-to-point.
    #[arg(short = 'J', long = "json", value_name = "FILE")]
    json: Option<PathBuf>,

    /// Also draw busbw against size on log-log axes to FILE as SVG (rank 0): a panel per
    /// operation, a curve per (operation, algorithm) measured, and the peers' curves.
    #[arg(long = "plot", value_name = "FILE.svg")]
    plot: Option<PathBuf>,

    /// Draw a peer's results too (with --plot), as NAME=FILE: hcomm_perf's -J JSON or the
    /// text output of bench/mpi_bench.c (the bench/results/*_summary.txt files hold it).
    /// Only the operations this run measures are drawn. Repeat for more peers.
    #[arg(long = "peer", value_name = "NAME=FILE", value_parser = parse_peer,
          requires = "plot")]
    peers: Vec<(String, PathBuf)>,

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

/// Options of the collectives.
#[derive(Debug, Clone, Args)]
struct CollArgs {
    #[command(flatten)]
    sweep: SweepArgs,

    /// Element type: bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16,
    /// bfloat16, float32, float64 (nccl-tests' half, float, double also work).
    #[arg(short = 'd', long = "datatype", value_name = "TYPE", default_value = "float32",
          value_parser = parse_dtype)]
    dtype: DataType,

    /// Reduction of allreduce, reduce and reduce_scatter: sum, prod, max, min, avg, and on
    /// integers and bool band, bor, bxor (ignored by the other collectives).
    #[arg(short = 'o', long = "op", value_name = "OP", default_value = "sum",
          value_parser = parse_op)]
    op: ReduceOp,

    /// Root rank of broadcast, reduce, gather and scatter (ignored by the others).
    #[arg(short = 'r', long = "root", value_name = "RANK", default_value_t = 0)]
    root: usize,

    /// Run the collectives in place (one buffer; broadcast always is). nccl-tests prints
    /// out-of-place and in-place columns; hcomm_perf measures one of them per run.
    #[arg(long = "in-place", visible_alias = "inplace")]
    in_place: bool,

    /// Force an algorithm (as HCOMM_ALGO would): NAME applies to every collective of the run
    /// that has an algorithm of that name (e.g. ring, tree, direct); a full HCOMM_ALGO value
    /// with ':' (e.g. allreduce:ring,broadcast:tree) is taken as written.
    #[arg(long = "algo", value_name = "NAME")]
    algo: Option<String>,

    /// Sweep every algorithm of each collective in turn (the names HCOMM_ALGO takes), one
    /// table and one plot curve each. `onesided` runs only where every rank is on one host
    /// with shared memory (elsewhere it is skipped); where a call does not fit it, it runs
    /// the direct schedule under its name.
    #[arg(short = 'a', long = "all-algos", conflicts_with = "algo")]
    all_algos: bool,

    /// Where the buffers live: `heap` (plain memory, reached through cross-memory attach or
    /// copies) or `pool` (hcomm's shared-memory pool, which local peers read in place).
    #[arg(long = "mem", value_name = "KIND", default_value = "heap",
          value_parser = ["heap", "pool"])]
    mem: String,
}

/// Parses a data type name (hcomm's names, or nccl-tests' half/float/double).
fn parse_dtype(s: &str) -> Result<DataType, String> {
    let t = s.trim();
    let alias = match t.to_ascii_lowercase().as_str() {
        "half" | "fp16" => Some(DataType::Float16),
        "float" | "fp32" => Some(DataType::Float32),
        "double" | "fp64" => Some(DataType::Float64),
        "bf16" => Some(DataType::Bfloat16),
        "char" => Some(DataType::Int8),
        "int" => Some(DataType::Int32),
        _ => None,
    };
    alias.or_else(|| DataType::from_name(t)).ok_or_else(|| {
        let valid: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
        format!("{s:?} is not a data type; valid: {}", valid.join(", "))
    })
}

/// Parses a reduction operation name.
fn parse_op(s: &str) -> Result<ReduceOp, String> {
    ReduceOp::from_name(s.trim()).ok_or_else(|| {
        let valid: Vec<&str> = ReduceOp::ALL.iter().map(|o| o.name()).collect();
        format!("{s:?} is not a reduction; valid: {}", valid.join(", "))
    })
}

/// Upper bound of -n and -w, far beyond any sensible run.
const MAX_ITERS: u64 = 100_000_000;
/// Fewest timed iterations when the count is estimated (the median needs a few).
const MIN_ITERS: u64 = 5;
/// Most sizes in one sweep.
const MAX_SIZES: usize = 4096;

/// Parses `NAME=FILE` of --peer.
fn parse_peer(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, file)) if !name.trim().is_empty() && !file.is_empty() => {
            Ok((name.trim().to_string(), PathBuf::from(file)))
        }
        _ => Err(format!(
            "{s:?} is not NAME=FILE (e.g. ompi=bench/results/coll_tcp_summary.txt)"
        )),
    }
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
    /// Operation name (`pingpong`, `stream`, or the collective as `CollKind::name` says).
    collective: &'static str,
    /// Message size in bytes (nccl-tests convention for collectives).
    size: u64,
    /// Elements of `type` in `size`.
    count: u64,
    /// Element type.
    #[serde(rename = "type")]
    dtype: &'static str,
    /// Reduction operation; `None` (printed "-", JSON null) where there is none.
    redop: Option<&'static str>,
    /// Root rank; `None` (printed "-", JSON null) where there is none.
    root: Option<usize>,
    /// Median time per operation (collectives: of the slowest rank), microseconds.
    time_us: f64,
    /// size / time, GB/s.
    algbw: f64,
    /// Bus bandwidth, GB/s (nccl-tests' per-collective factor x algbw).
    busbw: f64,
    /// Wrong bytes (point-to-point) or elements (collectives) found by the checked
    /// iterations, summed over all ranks.
    wrong: u64,
    /// The algorithm that ran (collectives), printed as the last column.
    algo: Option<&'static str>,
    /// The row's curve in plots (collectives): the forced algorithm, or "auto".
    curve: Option<&'static str>,
}

/// Rank 0's output: the table on stdout as rows arrive, the JSON file and the picture at the
/// end.
struct Report {
    rows: Vec<Row>,
    out: io::Stdout,
    /// The JSON file (-J), created before the sweep so that a bad path fails at once.
    json: Option<(PathBuf, BufWriter<File>)>,
    /// The picture (--plot), created before the sweep, and the peers' curves (--peer).
    plot: Option<(PathBuf, File, Vec<Curve>)>,
}

/// Creates `path` for writing, or says which file could not be.
fn create(path: &Path) -> anyhow::Result<File> {
    File::create(path).with_context(|| format!("cannot create {}", path.display()))
}

impl Report {
    fn new(sweep: &SweepArgs) -> anyhow::Result<Report> {
        let json = match &sweep.json {
            Some(path) => Some((path.clone(), BufWriter::new(create(path)?))),
            None => None,
        };
        let plot = match &sweep.plot {
            Some(path) => {
                let mut peers = Vec::new();
                for (name, file) in &sweep.peers {
                    let text = std::fs::read_to_string(file).with_context(|| {
                        format!("--peer {name}: cannot read {}", file.display())
                    })?;
                    let curves = plot::read_peer(name, &text)
                        .map_err(|e| anyhow::anyhow!("--peer {name}: {}: {e}", file.display()))?;
                    peers.extend(curves);
                }
                Some((path.clone(), create(path)?, peers))
            }
            None => None,
        };
        Ok(Report {
            rows: Vec::new(),
            out: io::stdout(),
            json,
            plot,
        })
    }

    /// The footer, the JSON file and the picture; `what` describes the run in the picture's
    /// title.
    fn finish(&mut self, what: &str) -> anyhow::Result<()> {
        self.footer()?;
        self.write_json()?;
        self.write_plot(what)
    }

    /// Draws the rows, and the peers' curves of the operations measured, into the picture.
    fn write_plot(&mut self, what: &str) -> anyhow::Result<()> {
        let Some((path, file, peers)) = &mut self.plot else {
            return Ok(());
        };
        let points = self
            .rows
            .iter()
            .map(|r| (r.collective, r.curve, r.size as f64, r.busbw));
        let mut curves = plot::curves(points, plot::THIS_RUN, false);
        let mut names: Vec<&str> = peers.iter().map(|c| c.source.as_str()).collect();
        names.dedup();
        for name in names {
            let theirs: Vec<&Curve> = peers
                .iter()
                .filter(|c| c.source == name && curves.iter().any(|m| m.collective == c.collective))
                .collect();
            if theirs.is_empty() {
                let has: Vec<&str> = peers
                    .iter()
                    .filter(|c| c.source == name)
                    .map(|c| c.collective.as_str())
                    .collect();
                eprintln!(
                    "hcomm_perf: --peer {name}: no results of the operations measured here \
                     (it has {})",
                    has.join(", ")
                );
            }
            curves.extend(theirs.into_iter().cloned());
        }
        let title = format!("hcomm_perf: bus bandwidth against message size, {what}");
        file.write_all(plot::svg(&title, &curves).as_bytes())
            .and_then(|()| file.flush())
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// Prints comment lines (each gets a leading "# ").
    fn comment(&mut self, text: &str) -> io::Result<()> {
        let mut out = self.out.lock();
        for line in text.lines() {
            writeln!(out, "# {line}")?;
        }
        out.flush()
    }

    /// The column titles; `algo` adds the algorithm column of the collectives.
    fn header(&mut self, algo: bool) -> io::Result<()> {
        let mut out = self.out.lock();
        writeln!(out, "#")?;
        let titles = format!(
            "# {:>10} {:>12} {:>7} {:>6} {:>5} {:>11} {:>9} {:>9} {:>7} {}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            if algo { "algo" } else { "" }
        );
        writeln!(out, "{}", titles.trim_end())?;
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
            let line = format!(
                "  {:>10} {:>12} {:>7} {:>6} {:>5} {:>11.2} {:>9.3} {:>9.3} {:>7} {}",
                row.size,
                row.count,
                row.dtype,
                row.redop.unwrap_or("-"),
                row.root.map_or_else(|| "-".to_string(), |r| r.to_string()),
                row.time_us,
                row.algbw,
                row.busbw,
                row.wrong,
                row.algo.unwrap_or("")
            );
            writeln!(out, "{}", line.trim_end())?;
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
    match &cli.op {
        Operation::Pingpong(a) => run_p2p(a, p2p::Kind::PingPong),
        Operation::Stream(a) => run_p2p(
            &a.sweep,
            p2p::Kind::Stream {
                window: a.window,
                window_bytes: a.window_bytes,
            },
        ),
        Operation::Allreduce(a) => run_coll(a, &[CollKind::AllReduce]),
        Operation::Broadcast(a) => run_coll(a, &[CollKind::Broadcast]),
        Operation::Reduce(a) => run_coll(a, &[CollKind::Reduce]),
        Operation::Allgather(a) => run_coll(a, &[CollKind::AllGather]),
        Operation::ReduceScatter(a) => run_coll(a, &[CollKind::ReduceScatter]),
        Operation::Alltoall(a) => run_coll(a, &[CollKind::AllToAll]),
        Operation::Gather(a) => run_coll(a, &[CollKind::Gather]),
        Operation::Scatter(a) => run_coll(a, &[CollKind::Scatter]),
        Operation::All(a) => run_coll(a, &collective::KINDS),
        Operation::Batch(a) => {
            let rank = launcher_rank();
            finish(&rank, batch::run(a))
        }
    }
}

/// Arguments of `hcomm_perf batch`.
#[derive(Debug, Args)]
struct BatchArgs {
    /// Number of all-reduces.
    #[arg(long, default_value_t = 1000)]
    ops: usize,
    /// Elements (float32) of each all-reduce.
    #[arg(long, default_value_t = 8)]
    count: usize,
    /// Repetitions of each way (the median is reported).
    #[arg(short = 'n', long, default_value_t = 9)]
    iters: usize,
}

/// Grouped calls against the same calls one by one.
mod batch {
    use std::time::Instant;

    use anyhow::{ensure, Context};
    use hcomm::{Communicator, ReduceOp};

    use super::{BatchArgs, Outcome};

    /// Median seconds of `iters` runs of `f`, the slowest rank's (max over ranks).
    fn median(
        comm: &Communicator,
        iters: usize,
        mut f: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<f64> {
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            comm.barrier()?;
            let t0 = Instant::now();
            f()?;
            let mut t = [t0.elapsed().as_secs_f64()];
            comm.allreduce_in_place(&mut t, ReduceOp::Max)?;
            times.push(t[0]);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    pub(super) fn run(a: &BatchArgs) -> anyhow::Result<Outcome> {
        ensure!(a.ops > 0 && a.iters > 0, "--ops and -n must be positive");
        let comm = Communicator::init().context("cannot join the job")?;
        let (n, r) = (comm.size(), comm.rank());
        let fresh = |i: usize| vec![(r + i) as f32; a.count];
        let want = |i: usize| (0..n).map(|q| (q + i) as f32).sum::<f32>();
        let mut bufs: Vec<Vec<f32>> = (0..a.ops).map(fresh).collect();
        let separate = median(&comm, a.iters, || {
            for (i, b) in bufs.iter_mut().enumerate() {
                b.fill((r + i) as f32);
                comm.allreduce_in_place(b, ReduceOp::Sum)?;
            }
            Ok(())
        })?;
        ensure!(
            bufs.iter()
                .enumerate()
                .all(|(i, b)| b.iter().all(|&x| x == want(i))),
            "separate results are wrong"
        );
        let batched = median(&comm, a.iters, || {
            for (i, b) in bufs.iter_mut().enumerate() {
                b.fill((r + i) as f32);
            }
            let mut batch = comm.batch();
            for b in bufs.iter_mut() {
                batch.allreduce(b, ReduceOp::Sum);
            }
            batch.run()?;
            Ok(())
        })?;
        ensure!(
            bufs.iter()
                .enumerate()
                .all(|(i, b)| b.iter().all(|&x| x == want(i))),
            "batched results are wrong"
        );
        if r == 0 {
            println!(
                "# hcomm_perf batch: {} all-reduces of {} float32 on {n} ranks (median of {})",
                a.ops, a.count, a.iters
            );
            println!("separate_us {:.1}", separate * 1e6);
            println!("batched_us {:.1}", batched * 1e6);
            println!("ratio separate/batched {:.1}", separate / batched);
        }
        Ok(Outcome::Passed)
    }
}

/// Until the job is joined, the launcher's word for the rank.
fn launcher_rank() -> String {
    std::env::var("HCOMM_RANK").unwrap_or_else(|_| "?".to_string())
}

/// Runs a point-to-point sweep on this rank.
fn run_p2p(sweep: &SweepArgs, kind: p2p::Kind) -> ExitCode {
    let launcher_rank = launcher_rank();
    // Check the arguments before joining the job, so that a typo fails fast on every rank.
    let sizes = match sweep.sizes() {
        Ok(s) => s,
        Err(e) => return finish(&launcher_rank, Err(e)),
    };
    let config = hcomm::Config::from_env();
    run_joined(&launcher_rank, config, |comm| {
        p2p::run(comm, kind, sweep, &sizes)
    })
}

/// Joins the job with `config`, runs `body` and reports how it ended.
fn run_joined(
    launcher_rank: &str,
    config: hcomm::Result<hcomm::Config>,
    body: impl FnOnce(&hcomm::Communicator) -> anyhow::Result<Outcome>,
) -> ExitCode {
    let comm = match config.and_then(hcomm::Communicator::init_with) {
        Ok(c) => c,
        Err(e) => {
            let e = anyhow::Error::new(e).context("cannot join the job");
            return finish(launcher_rank, Err(e));
        }
    };
    let outcome = body(&comm);
    // Report before the communicator goes: closing it delivers what is still queued, and a
    // launcher may stop this rank meanwhile (when another rank failed first).
    let code = finish(&comm.rank().to_string(), outcome);
    drop(comm);
    code
}

/// Runs the sweep of one or more collectives on this rank.
fn run_coll(args: &CollArgs, kinds: &[CollKind]) -> ExitCode {
    let launcher_rank = launcher_rank();
    let sizes = match args.sweep.sizes() {
        Ok(s) => s,
        Err(e) => return finish(&launcher_rank, Err(e)),
    };
    // --algo becomes HCOMM_ALGO of this process's configuration (the environment itself
    // stays untouched), checked before joining so that a typo fails fast on every rank.
    let env_algo = std::env::var("HCOMM_ALGO").ok();
    let algo = match &args.algo {
        Some(name) => match collective::algo_spec(kinds, name, env_algo.as_deref()) {
            Ok(spec) => Some(spec),
            Err(e) => return finish(&launcher_rank, Err(anyhow::anyhow!(e))),
        },
        None => None,
    };
    run_joined(&launcher_rank, config_with_algo(algo), |comm| {
        collective::run(comm, kinds, args, &sizes)
    })
}

/// This process's configuration, with `algo` (when given) as its HCOMM_ALGO; the environment
/// itself stays untouched.
fn config_with_algo(algo: Option<String>) -> hcomm::Result<hcomm::Config> {
    hcomm::Config::from_lookup(|name| {
        if name == "HCOMM_ALGO" && algo.is_some() {
            algo.clone()
        } else {
            std::env::var(name).ok()
        }
    })
}

/// Prints how this rank's run ended and turns it into the exit status.
fn finish(rank: &str, outcome: anyhow::Result<Outcome>) -> ExitCode {
    match outcome {
        Ok(Outcome::Passed) => ExitCode::SUCCESS,
        Ok(Outcome::Wrong(n)) => {
            eprintln!("hcomm_perf: rank {rank}: {n} received bytes or elements were wrong");
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

    use hcomm_tools::{alloc_zeroed as alloc, pattern};

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
        let mut report = Report::new(args)?;
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
        report.header(false)?;
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
                algo: None,
                curve: None,
            })?;
        }
        report.finish(&format!("{}, ranks 0 and 1", kind.name()))?;
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
}

/// Collectives: every rank takes part, rank 0 prints.
///
/// Every rank runs the same sweep. Before it starts, the ranks compare a fingerprint of their
/// arguments and settings (one all-reduce), so that ranks started differently fail with a
/// clear message instead of a mismatch or a hang. Per size: the buffers are allocated and
/// the ranks agree that every allocation worked (all-reduce), the warm-up runs, the ranks
/// agree on the number of timed iterations from the slowest rank's warm-up (all-reduce,
/// max), a barrier, the timed iterations (each timed on its own, back to back), the checked
/// iterations, then an all-reduce (max) of the ranks' medians and one (sum) of their wrong
/// elements. None of these extra calls is timed.
mod collective {
    use std::time::Instant;

    use anyhow::{anyhow, bail, Context as _};
    use hcomm::coll::algos::onesided::OneSided;
    use hcomm::coll::select::Selector;
    use hcomm::coll::{algos, reference, Algorithm, CollKind, Shape};
    use hcomm::{Communicator, DataType, ReduceOp};

    use super::{CollArgs, Outcome, Report, Row};

    /// The collectives hcomm_perf measures, in the order `all` runs them.
    pub(super) const KINDS: [CollKind; 8] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
    ];

    /// Salts of the generated send and receive buffers (the receive buffer is the input of
    /// in-place calls, and what bytes a call does not write keep).
    const SALT_SEND: u64 = 1;
    const SALT_RECV: u64 = 2;
    /// Seed of the timed iterations' data; the checked iterations use 0, 1, ...
    const SEED_TIMING: u64 = 0x7469_6d65;
    /// About this many bytes per rank and buffer go into one piece of the reference
    /// computation, so checking needs little memory beyond the buffers themselves.
    const CHECK_PIECE_BYTES: usize = 1 << 20;

    /// nccl-tests' bus bandwidth factor of `kind` on `n` ranks.
    pub(super) fn bus_factor(kind: CollKind, n: usize) -> f64 {
        let n = n as f64;
        match kind {
            CollKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter => (n - 1.0) / n,
            _ => 1.0,
        }
    }

    /// How the factor is written in the header.
    fn bus_factor_text(kind: CollKind) -> &'static str {
        match kind {
            CollKind::AllReduce => "2(n-1)/n",
            CollKind::Broadcast | CollKind::Reduce => "1",
            _ => "(n-1)/n",
        }
    }

    /// Whether nccl-tests' size of `kind` covers n blocks (so it is rounded to n elements).
    fn blocked(kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllGather
                | CollKind::ReduceScatter
                | CollKind::AllToAll
                | CollKind::Gather
                | CollKind::Scatter
        )
    }

    /// What the size column means for `kind`.
    fn size_meaning(kind: CollKind) -> &'static str {
        match kind {
            CollKind::AllReduce | CollKind::Reduce => "each rank's buffer",
            CollKind::Broadcast => "the buffer",
            CollKind::AllToAll => "each rank's send buffer (n blocks)",
            CollKind::AllGather => "each rank's whole output (n blocks)",
            CollKind::Gather => "the root's whole output (n blocks)",
            CollKind::ReduceScatter => "each rank's whole input (n blocks)",
            CollKind::Scatter => "the root's whole input (n blocks)",
            _ => "the buffer",
        }
    }

    /// One size of the sweep as nccl-tests counts it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) struct Layout {
        /// The size column: bytes, rounded down to whole elements (and blocks).
        pub size: u64,
        /// The count column: elements in `size`.
        pub count: u64,
        /// `Shape::count`: elements per buffer, or per block of blocked collectives.
        pub shape_count: usize,
    }

    /// The layout of `size` requested bytes of `kind` on `n` ranks; `None` when it holds no
    /// element (or no element per block), a row nccl-tests skips too.
    pub(super) fn layout(kind: CollKind, dtype: DataType, n: usize, size: u64) -> Option<Layout> {
        let elem = dtype.size() as u64;
        let total = size / elem;
        let (count, per) = if blocked(kind) {
            let n = n.max(1) as u64;
            let c = total - total % n;
            (c, c / n)
        } else {
            (total, total)
        };
        if count == 0 {
            return None;
        }
        Some(Layout {
            size: count * elem,
            count,
            shape_count: usize::try_from(per).ok()?,
        })
    }

    /// The `HCOMM_ALGO` value for `--algo name` on `kinds`, after the environment's own
    /// value `env` (later entries win). A bare name applies to every collective of the run
    /// that has an algorithm of that name; a value with ':' is taken as written.
    pub(super) fn algo_spec(
        kinds: &[CollKind],
        name: &str,
        env: Option<&str>,
    ) -> Result<String, String> {
        let name = name.trim();
        let ours = if name.contains(':') {
            name.to_string()
        } else {
            let entries: Vec<String> = kinds
                .iter()
                .filter(|k| algos::names_for(**k).contains(&name))
                .map(|k| format!("{}:{name}", k.name()))
                .collect();
            if entries.is_empty() {
                let mut valid: Vec<&str> =
                    kinds.iter().flat_map(|k| algos::names_for(*k)).collect();
                valid.sort_unstable();
                valid.dedup();
                let which: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
                return Err(format!(
                    "--algo {name:?}: no algorithm of that name implements {}; valid: {}",
                    which.join(", "),
                    valid.join(", ")
                ));
            }
            entries.join(",")
        };
        Ok(match env.map(str::trim).filter(|e| !e.is_empty()) {
            Some(e) => format!("{e},{ours}"),
            None => ours,
        })
    }

    /// A fingerprint of everything that must be equal on every rank for the sweeps to match.
    pub(super) fn fingerprint(
        kinds: &[CollKind],
        args: &CollArgs,
        sizes: &[u64],
        algo: Option<&str>,
        deterministic: bool,
    ) -> u64 {
        let s = &args.sweep;
        let mut words: Vec<u64> = kinds.iter().map(|k| *k as u64).collect();
        words.extend([
            args.dtype as u64,
            args.op as u64,
            args.root as u64,
            u64::from(args.in_place),
            u64::from(args.all_algos),
            u64::from(deterministic),
            s.check,
            s.iters.unwrap_or(0),
            s.warmup.unwrap_or(u64::MAX),
            s.time_target.to_bits(),
            s.max_iters,
            sizes.len() as u64,
        ]);
        words.extend_from_slice(sizes);
        words.extend(algo.unwrap_or("").bytes().map(u64::from));
        words.iter().fold(0x6863_6f6d_6d5f_636f, |h, &w| {
            hcomm_tools::pattern::mix(h ^ w)
        })
    }

    /// Compares this rank's fingerprint with every other rank's, and tells whether every rank
    /// is `ok`. Every rank reaches the same verdict, so none is left waiting.
    fn agree(comm: &Communicator, ok: bool, fp: u64) -> anyhow::Result<bool> {
        let mine = [u64::from(ok), fp, !fp];
        let mut all = [0u64; 3];
        comm.allreduce(&mine, &mut all, ReduceOp::Min)
            .context("comparing the ranks' arguments")?;
        // The minimum of !fp is !(the maximum of fp).
        if all[1] != fp || !all[2] != fp {
            bail!(
                "the ranks were started with different arguments or settings (type, op, root, \
                 sizes, iterations, checks, --in-place, --algo/HCOMM_ALGO, \
                 HCOMM_DETERMINISTIC): start every rank with the same ones"
            );
        }
        Ok(all[0] == 1)
    }

    /// Whether every rank is `ok` (one all-reduce).
    fn all_ok(comm: &Communicator, ok: bool) -> anyhow::Result<bool> {
        let mut all = [0u64];
        comm.allreduce(&[u64::from(ok)], &mut all, ReduceOp::Min)
            .context("synchronizing with the other ranks")?;
        Ok(all[0] == 1)
    }

    /// Rank 0's report, and this rank's first error, which the other ranks learn of at the
    /// next agreement (so that none is left waiting).
    struct Sink {
        report: Option<Report>,
        pending: Option<anyhow::Error>,
    }

    impl Sink {
        /// Runs `f` on the report (rank 0); an error becomes pending.
        fn with_report(&mut self, f: impl FnOnce(&mut Report) -> anyhow::Result<()>) {
            if let Some(rep) = &mut self.report {
                if let Err(e) = f(rep) {
                    self.pending.get_or_insert(e);
                }
            }
        }
    }

    /// Runs the sweep of every collective of `kinds` on this rank: with the algorithms
    /// `comm`'s settings choose, or (`-a`) once with each algorithm of each collective.
    pub(super) fn run(
        comm: &Communicator,
        kinds: &[CollKind],
        args: &CollArgs,
        sizes: &[u64],
    ) -> anyhow::Result<Outcome> {
        let n = comm.size();
        let rank = comm.rank();
        if kinds.iter().any(|k| k.rooted()) && args.root >= n {
            // Every rank sees the same, so every rank stops here.
            bail!(
                "-r {}: the root must be a rank of the job (0..{})",
                args.root,
                n - 1
            );
        }
        // Rank 0's report; an error (a bad -J path) stops every rank at the agreement.
        let mut sink = Sink {
            report: None,
            pending: None,
        };
        if rank == 0 {
            match Report::new(&args.sweep) {
                Ok(r) => sink.report = Some(r),
                Err(e) => sink.pending = Some(e),
            }
        }
        let cfg = comm.config();
        let fp = fingerprint(kinds, args, sizes, cfg.algo.as_deref(), cfg.deterministic);
        if !agree(comm, sink.pending.is_none(), fp)? {
            return Err(sink
                .pending
                .unwrap_or_else(|| anyhow!("rank 0 stopped on an error (see its output)")));
        }
        let mut total_wrong = 0u64;
        if args.all_algos {
            // One-sided collectives run only where every member is on this host with shared
            // memory; elsewhere "onesided" would measure the direct algorithm under its name.
            let single_host = all_ok(comm, (0..n).all(|p| p == rank || comm.uses_shm(p)))?;
            let env_algo = std::env::var("HCOMM_ALGO").ok();
            for &kind in kinds {
                for name in algos::names_for(kind) {
                    if name == OneSided.name() && !single_host {
                        sink.with_report(|rep| {
                            Ok(rep.comment(&format!(
                                "{} {name}: skipped, the ranks are not all on one host with \
                                 shared memory",
                                kind.name()
                            ))?)
                        });
                        continue;
                    }
                    let spec =
                        algo_spec(&[kind], name, env_algo.as_deref()).map_err(|e| anyhow!(e))?;
                    // A world of its own per algorithm: the algorithm is a setting of the
                    // world. `comm`'s world lives on, holding the store of launchers whose
                    // rank 0 hosts it.
                    let world = super::config_with_algo(Some(spec))
                        .and_then(Communicator::init_with)
                        .with_context(|| {
                            format!("joining the job again for {} {name}", kind.name())
                        })?;
                    total_wrong += sweep(&world, kind, args, sizes, &mut sink)?;
                }
            }
        } else {
            for &kind in kinds {
                total_wrong += sweep(comm, kind, args, sizes, &mut sink)?;
            }
        }
        if let Some(e) = sink.pending {
            return Err(e);
        }
        if let Some(rep) = &mut sink.report {
            let op = if kinds.iter().any(|k| k.reduces()) {
                format!(" {}", args.op.name())
            } else {
                String::new()
            };
            rep.finish(&format!("{n} ranks, {}{op}", args.dtype.name()))?;
        }
        Ok(if total_wrong == 0 {
            Outcome::Passed
        } else {
            Outcome::Wrong(total_wrong)
        })
    }

    /// The curve of `kind`'s rows on `comm`: the algorithm its settings force, or "auto".
    fn curve(comm: &Communicator, kind: CollKind) -> &'static str {
        comm.config()
            .algo
            .as_deref()
            .and_then(|a| Selector::new(Some(a), false).ok())
            .and_then(|s| s.forced(kind))
            .map_or("auto", |a| a.name())
    }

    /// The sweep of one collective on `comm`; returns the wrong elements of all ranks.
    fn sweep(
        comm: &Communicator,
        kind: CollKind,
        args: &CollArgs,
        sizes: &[u64],
        sink: &mut Sink,
    ) -> anyhow::Result<u64> {
        let n = comm.size();
        let sweep = &args.sweep;
        let op = if kind.reduces() {
            args.op
        } else {
            ReduceOp::Sum
        };
        let root = if kind.rooted() { args.root } else { 0 };
        let curve = curve(comm, kind);
        sink.with_report(|rep| Ok(header(rep, comm, kind, args, op, sizes)?));
        let mut total_wrong = 0;
        for &requested in sizes {
            let Some(lay) = layout(kind, args.dtype, n, requested) else {
                continue;
            };
            let shape = Shape {
                // Broadcast has one buffer anyway; the typed API never marks it.
                in_place: args.in_place && kind != CollKind::Broadcast,
                ..Shape::new(kind, args.dtype, op, lay.shape_count, root, n)
            };
            let algo = comm.algorithm_for(kind, args.dtype, op, lay.shape_count, root);
            let mut bench = match Bench::new(comm, shape, args.mem == "pool") {
                Ok(b) => Some(b),
                Err(e) => {
                    sink.pending.get_or_insert(e);
                    None
                }
            };
            if !all_ok(comm, sink.pending.is_none())? {
                return Err(sink.pending.take().unwrap_or_else(|| {
                    anyhow!("another rank stopped on an error (see its output)")
                }));
            }
            let Some(b) = bench.as_mut() else {
                unreachable!("every rank has its buffers")
            };
            let (wrong, time) = b.measure(sweep.warmup_for(lay.size), sweep)?;
            total_wrong += wrong;
            let algbw = if time > 0.0 {
                lay.size as f64 / time / 1e9
            } else {
                0.0
            };
            let row = Row {
                collective: kind.name(),
                size: lay.size,
                count: lay.count,
                dtype: args.dtype.name(),
                redop: kind.reduces().then(|| op.name()),
                root: kind.rooted().then_some(root),
                time_us: time * 1e6,
                algbw,
                busbw: algbw * bus_factor(kind, n),
                wrong,
                algo: Some(algo),
                curve: Some(curve),
            };
            sink.with_report(|rep| Ok(rep.row(row)?));
        }
        Ok(total_wrong)
    }

    /// The comment lines and column titles before a collective's rows.
    fn header(
        rep: &mut Report,
        comm: &Communicator,
        kind: CollKind,
        args: &CollArgs,
        op: ReduceOp,
        sizes: &[u64],
    ) -> std::io::Result<()> {
        let cfg = comm.config();
        let sweep = &args.sweep;
        let iters = match sweep.iters {
            Some(n) => format!("{n} iterations"),
            None => format!("~{} s per size", sweep.time_target),
        };
        let n = comm.size();
        let place = if kind == CollKind::Broadcast {
            "in place (always)"
        } else if args.in_place {
            "in place"
        } else {
            "out of place"
        };
        rep.comment(&format!(
            "hcomm_perf {} {}\n\
             ranks: {n}, type {}, op {}, root {}, {place}, sizes {}..{} B requested, {iters}, \
             checked iterations: {}\n\
             hcomm: tcp streams {}, eager limit {} B, chunk {} B, timeout {:.0} s, \
             HCOMM_ALGO {}, deterministic {}, mismatch check {}\n\
             size = {} (nccl-tests; rounded down to whole elements{}); count = elements in size\n\
             time = median of individually timed iterations of the slowest rank; \
             algbw = size/time (1 GB = 1e9 B); busbw = algbw x {}\n\
             #wrong = wrong elements of the checked iterations, all ranks; \
             algo = hcomm's choice for the size",
            kind.name(),
            env!("CARGO_PKG_VERSION"),
            args.dtype.name(),
            if kind.reduces() { op.name() } else { "-" },
            if kind.rooted() {
                args.root.to_string()
            } else {
                "-".to_string()
            },
            sizes.first().copied().unwrap_or(0),
            sizes.last().copied().unwrap_or(0),
            sweep.check,
            cfg.tcp_streams,
            cfg.tcp_eager_limit,
            cfg.tcp_chunk,
            cfg.timeout.as_secs_f64(),
            cfg.algo.as_deref().unwrap_or("-"),
            if cfg.deterministic { "on" } else { "off" },
            if cfg.mismatch_check { "on" } else { "off" },
            size_meaning(kind),
            if blocked(kind) { " and blocks" } else { "" },
            bus_factor_text(kind),
        ))?;
        rep.header(true)
    }

    /// A benchmark buffer: heap or shared-memory pool memory.
    enum Mem {
        Heap(Vec<u8>),
        Pool(hcomm::PoolBuf<u8>),
    }

    impl Mem {
        /// `data` in memory of the chosen kind.
        fn place(comm: &Communicator, pool: bool, data: Vec<u8>) -> anyhow::Result<Mem> {
            if !pool {
                return Ok(Mem::Heap(data));
            }
            let mut b = comm.alloc::<u8>(data.len())?;
            b.copy_from_slice(&data);
            Ok(Mem::Pool(b))
        }
    }

    impl std::ops::Deref for Mem {
        type Target = [u8];
        fn deref(&self) -> &[u8] {
            match self {
                Mem::Heap(v) => v,
                Mem::Pool(b) => b,
            }
        }
    }

    impl std::ops::DerefMut for Mem {
        fn deref_mut(&mut self) -> &mut [u8] {
            match self {
                Mem::Heap(v) => v,
                Mem::Pool(b) => b,
            }
        }
    }

    /// One rank's buffers for one size of one collective.
    struct Bench<'a> {
        comm: &'a Communicator,
        shape: Shape,
        /// `None` where this rank passes no send buffer (in place, broadcast).
        send: Option<Mem>,
        recv: Mem,
    }

    impl<'a> Bench<'a> {
        fn new(comm: &'a Communicator, shape: Shape, pool: bool) -> anyhow::Result<Bench<'a>> {
            let r = comm.rank();
            let full = shape.count;
            let send = if shape.in_place_at(r) || shape.kind == CollKind::Broadcast {
                None
            } else {
                Some(generate(
                    &shape,
                    r,
                    shape.send_bytes(r),
                    0..full,
                    SALT_SEND,
                    SEED_TIMING,
                )?)
            };
            let recv = generate(
                &shape,
                r,
                shape.recv_bytes(r),
                0..full,
                SALT_RECV,
                SEED_TIMING,
            )?;
            let send = send.map(|d| Mem::place(comm, pool, d)).transpose()?;
            let recv = Mem::place(comm, pool, recv)?;
            Ok(Bench {
                comm,
                shape,
                send,
                recv,
            })
        }

        fn iteration(&mut self) -> anyhow::Result<()> {
            let s = &self.shape;
            self.comm
                .run_collective(s.clone(), self.send.as_deref(), &mut self.recv)
                .with_context(|| format!("{} of {} x {}", s.kind.name(), s.count, s.dtype.name()))
        }

        /// Warm-up, timed and checked iterations; returns the wrong elements of all ranks
        /// and the slowest rank's median time in seconds.
        fn measure(&mut self, warmup: u64, sweep: &super::SweepArgs) -> anyhow::Result<(u64, f64)> {
            let mut since_first = None;
            for i in 0..warmup {
                if i == 1 {
                    since_first = Some(Instant::now());
                }
                self.iteration()?;
            }
            let per_iter = match since_first {
                Some(t) => t.elapsed().as_secs_f64() / (warmup - 1) as f64,
                None => 0.0,
            };
            let mut slowest = [0.0f64];
            self.comm
                .allreduce(&[per_iter], &mut slowest, ReduceOp::Max)
                .context("agreeing on the iteration count")?;
            let iters = sweep.iters_for(slowest[0]);
            self.comm
                .barrier()
                .context("the barrier before the timed iterations")?;
            let mut times = Vec::with_capacity(usize::try_from(iters.min(1 << 20)).unwrap_or(0));
            for _ in 0..iters {
                let t = Instant::now();
                self.iteration()?;
                times.push(t.elapsed().as_secs_f64());
            }
            let mut wrong = 0u64;
            for k in 0..sweep.check {
                wrong += self.checked_iteration(k)?;
            }
            times.sort_by(f64::total_cmp);
            let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
            let mut time = [0.0f64];
            self.comm
                .allreduce(&[median], &mut time, ReduceOp::Max)
                .context("collecting the times")?;
            let mut all_wrong = [0u64];
            self.comm
                .allreduce(&[wrong], &mut all_wrong, ReduceOp::Sum)
                .context("collecting the wrong-element counts")?;
            Ok((all_wrong[0], time[0]))
        }

        /// One call on fresh inputs (seed `k`) checked against the sequential reference;
        /// returns this rank's wrong elements. Every rank generates every rank's inputs, a
        /// piece of each block at a time.
        fn checked_iteration(&mut self, k: u64) -> anyhow::Result<u64> {
            let shape = self.shape.clone();
            let (r, n, e, c) = (self.comm.rank(), shape.size, shape.elem(), shape.count);
            if let Some(send) = &mut self.send {
                send.copy_from_slice(&generate(
                    &shape,
                    r,
                    shape.send_bytes(r),
                    0..c,
                    SALT_SEND,
                    k,
                )?);
            }
            let fresh = generate(&shape, r, shape.recv_bytes(r), 0..c, SALT_RECV, k)?;
            self.recv.copy_from_slice(&fresh);
            self.iteration()?;
            let blocks = if blocked(shape.kind) { n } else { 1 };
            let step = (CHECK_PIECE_BYTES / e / blocks).max(1);
            let mut wrong = 0u64;
            let mut a = 0;
            while a < c {
                let b = (a + step).min(c);
                let piece = Shape {
                    count: b - a,
                    ..shape.clone()
                };
                let shapes = vec![piece.clone(); n];
                let mut sends = Vec::with_capacity(n);
                let mut recvs = Vec::with_capacity(n);
                for p in 0..n {
                    sends.push(generate(
                        &shape,
                        p,
                        shape.send_bytes(p),
                        a..b,
                        SALT_SEND,
                        k,
                    )?);
                    recvs.push(generate(
                        &shape,
                        p,
                        shape.recv_bytes(p),
                        a..b,
                        SALT_RECV,
                        k,
                    )?);
                }
                let want = reference::expected(&shapes, &sends, &recvs);
                let got = extract(&self.recv, c * e, a * e..b * e);
                wrong += count_wrong(&piece, r, &got, &want[r]);
                a = b;
            }
            Ok(wrong)
        }
    }

    /// Bytes `range` of every `block`-byte block of `buf`, concatenated.
    fn extract(buf: &[u8], block: usize, range: std::ops::Range<usize>) -> Vec<u8> {
        let mut out = Vec::new();
        if block == 0 {
            return out;
        }
        for blk in buf.chunks_exact(block) {
            out.extend_from_slice(&blk[range.clone()]);
        }
        out
    }

    /// Elements of `got` that differ from `want` where the call defines the result (in-place
    /// reduce-scatter: block `rank` only).
    fn count_wrong(piece: &Shape, rank: usize, got: &[u8], want: &[u8]) -> u64 {
        let e = piece.elem();
        let (got, want) = if piece.kind == CollKind::ReduceScatter && piece.in_place {
            let blk = piece.count * e;
            let at = rank * blk..(rank + 1) * blk;
            (
                got.get(at.clone()).unwrap_or(&[]),
                want.get(at).unwrap_or(&[]),
            )
        } else {
            (got, want)
        };
        let differ = got
            .chunks(e)
            .zip(want.chunks(e))
            .filter(|(g, w)| g != w)
            .count() as u64;
        differ + (got.len().abs_diff(want.len()) / e) as u64
    }

    /// Elements `range` of every block (of `shape.count` elements) of the `len`-byte buffer of
    /// `rank`, concatenated: the whole buffer when `range` is `0..shape.count`. Element `i` of
    /// the whole buffer is a small integer that depends on the rank, `i`, `salt` and `seed`
    /// (as in hcomm_check), so float sums are exact in any order; for `prod` it is ±1.
    fn generate(
        shape: &Shape,
        rank: usize,
        len: usize,
        range: std::ops::Range<usize>,
        salt: u64,
        seed: u64,
    ) -> anyhow::Result<Vec<u8>> {
        let e = shape.elem();
        let block = shape.count;
        let blocks = if block == 0 { 0 } else { len / (block * e) };
        let bytes = blocks * range.len() * e;
        let mut out = Vec::new();
        out.try_reserve_exact(bytes)
            .with_context(|| format!("cannot allocate a {bytes}-byte buffer"))?;
        for blk in 0..blocks {
            for j in range.clone() {
                let i = (blk * block + j) as u64;
                let x = (rank as u64)
                    .wrapping_mul(7919)
                    .wrapping_add(i.wrapping_mul(104_729))
                    .wrapping_add(salt * 31)
                    .wrapping_add(seed)
                    % 7;
                hcomm_tools::push_test_value(shape.dtype, shape.op, x, &mut out);
            }
        }
        Ok(out)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn generated_pieces_match_the_whole_buffer() {
            for kind in KINDS {
                let shape = Shape {
                    in_place: kind == CollKind::ReduceScatter,
                    ..Shape::new(kind, DataType::Float32, ReduceOp::Sum, 5, 1, 3)
                };
                for r in 0..3 {
                    for len in [shape.send_bytes(r), shape.recv_bytes(r)] {
                        let whole = generate(&shape, r, len, 0..5, 2, 9).unwrap();
                        assert_eq!(whole.len(), len);
                        let mut joined = vec![Vec::new(); len / 20];
                        for (a, b) in [(0, 2), (2, 5)] {
                            let piece = generate(&shape, r, len, a..b, 2, 9).unwrap();
                            assert_eq!(piece, extract(&whole, 20, a * 4..b * 4));
                            for (blk, chunk) in piece.chunks((b - a) * 4).enumerate() {
                                joined[blk].extend_from_slice(chunk);
                            }
                        }
                        assert_eq!(joined.concat(), whole);
                    }
                }
            }
        }

        #[test]
        fn wrong_elements_are_counted() {
            let s = Shape::new(
                CollKind::AllReduce,
                DataType::Float32,
                ReduceOp::Sum,
                4,
                0,
                2,
            );
            let want = generate(&s, 0, 16, 0..4, 1, 0).unwrap();
            let mut got = want.clone();
            assert_eq!(count_wrong(&s, 0, &got, &want), 0);
            got[0] ^= 1;
            got[3] ^= 1;
            got[15] ^= 1;
            assert_eq!(count_wrong(&s, 0, &got, &want), 2);
            // In-place reduce-scatter: only the rank's block counts.
            let rs = Shape {
                in_place: true,
                ..Shape::new(
                    CollKind::ReduceScatter,
                    DataType::Float32,
                    ReduceOp::Sum,
                    2,
                    0,
                    2,
                )
            };
            let want = vec![0u8; 16];
            let mut got = want.clone();
            got[0] = 1;
            assert_eq!(count_wrong(&rs, 1, &got, &want), 0);
            assert_eq!(count_wrong(&rs, 0, &got, &want), 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(extra: &[&str]) -> SweepArgs {
        let mut argv = vec!["hcomm_perf", "pingpong"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).expect("valid arguments").op {
            Operation::Pingpong(a) => a,
            Operation::Stream(a) => a.sweep,
            other => panic!("not a point-to-point operation: {other:?}"),
        }
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
            algo: Some("ring"),
            curve: Some("auto"),
        };
        let v = serde_json::to_value([row]).unwrap();
        let obj = v[0].as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "algbw",
                "algo",
                "busbw",
                "collective",
                "count",
                "curve",
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

    fn coll(argv: &[&str]) -> (String, CollArgs) {
        let mut full = vec!["hcomm_perf"];
        full.extend_from_slice(argv);
        let op = Cli::try_parse_from(full).expect("valid arguments").op;
        let name = format!("{op:?}");
        let name = name[..name.find('(').unwrap_or(name.len())].to_string();
        match op {
            Operation::Allreduce(a)
            | Operation::Broadcast(a)
            | Operation::Reduce(a)
            | Operation::Allgather(a)
            | Operation::ReduceScatter(a)
            | Operation::Alltoall(a)
            | Operation::Gather(a)
            | Operation::Scatter(a)
            | Operation::All(a) => (name, a),
            other => panic!("not a collective: {other:?}"),
        }
    }

    #[test]
    fn collective_names_and_nccl_aliases() {
        for (argv, want) in [
            ("allreduce", "Allreduce"),
            ("all_reduce", "Allreduce"),
            ("broadcast", "Broadcast"),
            ("bcast", "Broadcast"),
            ("reduce", "Reduce"),
            ("allgather", "Allgather"),
            ("all_gather", "Allgather"),
            ("reduce_scatter", "ReduceScatter"),
            ("reduce-scatter", "ReduceScatter"),
            ("alltoall", "Alltoall"),
            ("all_to_all", "Alltoall"),
            ("gather", "Gather"),
            ("scatter", "Scatter"),
            ("all", "All"),
        ] {
            assert_eq!(coll(&[argv]).0, want, "{argv}");
        }
        // Every measured collective's CollKind name is a subcommand.
        for k in collective::KINDS {
            assert!(
                Cli::try_parse_from(["hcomm_perf", k.name()]).is_ok(),
                "{}",
                k.name()
            );
        }
    }

    #[test]
    fn collective_options() {
        let (_, a) = coll(&["allreduce"]);
        assert_eq!(
            (a.dtype, a.op, a.root, a.in_place),
            (DataType::Float32, ReduceOp::Sum, 0, false)
        );
        assert_eq!(a.sweep.check, 1);
        assert!(a.algo.is_none());
        let (_, a) = coll(&[
            "reduce",
            "-b",
            "1K",
            "-e",
            "1M",
            "-d",
            "bfloat16",
            "-o",
            "max",
            "-r",
            "3",
            "-n",
            "10",
            "-w",
            "2",
            "-c",
            "0",
            "--in-place",
            "--algo",
            "tree",
            "-J",
            "x.json",
        ]);
        assert_eq!(
            (a.dtype, a.op, a.root, a.in_place),
            (DataType::Bfloat16, ReduceOp::Max, 3, true)
        );
        assert_eq!(a.sweep.sizes().unwrap().len(), 11);
        assert_eq!(
            (a.sweep.iters, a.sweep.warmup, a.sweep.check),
            (Some(10), Some(2), 0)
        );
        assert_eq!(a.algo.as_deref(), Some("tree"));
        assert_eq!(a.sweep.json.as_deref(), Some(Path::new("x.json")));
        for t in DataType::ALL {
            assert_eq!(parse_dtype(t.name()), Ok(t));
        }
        assert_eq!(parse_dtype("float"), Ok(DataType::Float32));
        assert_eq!(parse_dtype("half"), Ok(DataType::Float16));
        assert_eq!(parse_dtype("double"), Ok(DataType::Float64));
        assert_eq!(parse_dtype("FLOAT32"), Ok(DataType::Float32));
        assert!(parse_dtype("float128").is_err());
        for op in ReduceOp::ALL {
            assert_eq!(parse_op(op.name()), Ok(op));
        }
        assert!(parse_op("mean").is_err());
        assert!(Cli::try_parse_from(["hcomm_perf", "allreduce", "-d", "x"]).is_err());
        assert!(Cli::try_parse_from(["hcomm_perf", "allreduce", "-o", "x"]).is_err());
        assert!(Cli::try_parse_from(["hcomm_perf", "allreduce", "-r", "-1"]).is_err());
        let (_, a) = coll(&["all", "-a", "--plot", "p.svg", "--peer", "ompi=x.txt"]);
        assert!(a.all_algos);
        assert_eq!(a.sweep.plot.as_deref(), Some(Path::new("p.svg")));
        assert_eq!(
            a.sweep.peers,
            [("ompi".to_string(), PathBuf::from("x.txt"))]
        );
        for bad in [
            &["allreduce", "-a", "--algo", "ring"][..],
            &["allreduce", "--peer", "ompi=x.txt"],
            &["allreduce", "--plot", "p.svg", "--peer", "x.txt"],
            &["allreduce", "--plot", "p.svg", "--peer", "=x.txt"],
        ] {
            let argv = [&["hcomm_perf"], bad].concat();
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bus_bandwidth_factors_are_nccl_tests() {
        use collective::bus_factor;
        let f = |k| bus_factor(k, 4);
        assert_eq!(f(CollKind::AllReduce), 1.5);
        assert_eq!(f(CollKind::Broadcast), 1.0);
        assert_eq!(f(CollKind::Reduce), 1.0);
        for k in [
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::AllToAll,
            CollKind::Gather,
            CollKind::Scatter,
        ] {
            assert_eq!(f(k), 0.75);
        }
        assert_eq!(bus_factor(CollKind::AllReduce, 2), 1.0);
        assert_eq!(bus_factor(CollKind::AllGather, 1), 0.0);
    }

    #[test]
    fn sizes_follow_nccl_tests() {
        use collective::{layout, Layout};
        let l = |k, t, n, s| layout(k, t, n, s);
        let f32 = DataType::Float32;
        // Per-rank buffer: whole elements.
        assert_eq!(
            l(CollKind::AllReduce, f32, 3, 10),
            Some(Layout {
                size: 8,
                count: 2,
                shape_count: 2
            })
        );
        assert_eq!(l(CollKind::Broadcast, f32, 3, 3), None);
        assert_eq!(
            l(CollKind::Reduce, DataType::Uint8, 3, 7),
            Some(Layout {
                size: 7,
                count: 7,
                shape_count: 7
            })
        );
        // n blocks: whole blocks of whole elements; the shape counts one block.
        assert_eq!(
            l(CollKind::AllGather, f32, 3, 64),
            Some(Layout {
                size: 60,
                count: 15,
                shape_count: 5
            })
        );
        assert_eq!(
            l(CollKind::AllToAll, f32, 2, 1 << 20),
            Some(Layout {
                size: 1 << 20,
                count: 1 << 18,
                shape_count: 1 << 17
            })
        );
        for k in [CollKind::ReduceScatter, CollKind::Gather, CollKind::Scatter] {
            assert_eq!(
                l(k, DataType::Float64, 4, 100),
                Some(Layout {
                    size: 96,
                    count: 12,
                    shape_count: 3
                })
            );
        }
        assert_eq!(l(CollKind::AllGather, f32, 3, 8), None);
        assert_eq!(l(CollKind::AllGather, f32, 3, 12).map(|x| x.size), Some(12));
    }

    #[test]
    fn algo_names_become_hcomm_algo() {
        use collective::algo_spec;
        let ar = [CollKind::AllReduce];
        assert_eq!(algo_spec(&ar, "ring", None).unwrap(), "allreduce:ring");
        assert_eq!(
            algo_spec(&ar, "ring", Some("broadcast:tree")).unwrap(),
            "broadcast:tree,allreduce:ring"
        );
        assert_eq!(
            algo_spec(&ar, "allreduce:direct,gather:direct", Some(" ")).unwrap(),
            "allreduce:direct,gather:direct"
        );
        let e = algo_spec(&ar, "nonesuch", None).unwrap_err();
        assert!(e.contains("ring") && e.contains("nonesuch"), "{e}");
        // `all`: only the collectives that have the algorithm get it.
        let all = algo_spec(&collective::KINDS, "direct", None).unwrap();
        assert_eq!(all.split(',').count(), collective::KINDS.len(), "{all}");
        let ring = algo_spec(&collective::KINDS, "ring", None).unwrap();
        assert!(ring.starts_with("allreduce:ring"), "{ring}");
        assert!(ring.split(',').count() < collective::KINDS.len(), "{ring}");
        // Whatever it builds, the library accepts.
        for spec in [all, ring] {
            let cfg =
                hcomm::Config::from_lookup(|n| (n == "HCOMM_ALGO").then(|| spec.clone())).unwrap();
            assert_eq!(cfg.algo.as_deref(), Some(spec.as_str()));
        }
    }

    #[test]
    fn fingerprint_covers_the_arguments() {
        use collective::fingerprint;
        let sizes = [8, 16];
        let fp = |argv: &[&str], algo: Option<&str>| {
            let (_, a) = coll(argv);
            fingerprint(&[CollKind::AllReduce], &a, &sizes, algo, false)
        };
        let base = fp(&["allreduce"], None);
        assert_eq!(base, fp(&["allreduce"], None));
        for other in [
            fp(&["allreduce", "-d", "float64"], None),
            fp(&["allreduce", "-o", "max"], None),
            fp(&["allreduce", "-r", "1"], None),
            fp(&["allreduce", "--in-place"], None),
            fp(&["allreduce", "-a"], None),
            fp(&["allreduce", "-c", "2"], None),
            fp(&["allreduce", "-n", "5"], None),
            fp(&["allreduce"], Some("allreduce:ring")),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn help_renders() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
