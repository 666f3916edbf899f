//! The command line: options of the sweeps, the collectives and the batch comparison.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use hcomm::{DataType, ReduceOp};
use hcomm_tools::parse_size;

/// Options every operation takes.
#[derive(Debug, Clone, Args)]
pub(super) struct SweepArgs {
    /// Smallest message size in bytes; suffixes K, M, G (powers of 1024), e.g. 8, 64K, 16M.
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", default_value = "8",
          value_parser = parse_size)]
    pub(super) min_bytes: u64,

    /// Largest message size in bytes (suffixes as for -b).
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", default_value = "128M",
          value_parser = parse_size)]
    pub(super) max_bytes: u64,

    /// Multiply the size by this factor from one step to the next (at least 2).
    #[arg(short = 'f', long = "stepfactor", value_name = "FACTOR", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(2..=1024), conflicts_with = "step_bytes")]
    pub(super) step_factor: u64,

    /// Add this many bytes from one step to the next instead of multiplying (suffixes as -b).
    #[arg(short = 'i', long = "stepbytes", value_name = "SIZE", value_parser = parse_size)]
    pub(super) step_bytes: Option<u64>,

    /// Timed iterations per size; without it, enough for about --time-target seconds per
    /// size (at least 5, at most --max-iters), estimated from the warm-up.
    #[arg(short = 'n', long = "iters", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=MAX_ITERS))]
    pub(super) iters: Option<u64>,

    /// Untimed warm-up iterations per size [default: 20 up to 1 MiB, 5 up to 16 MiB, else 2;
    /// at least 2 when the iteration count is estimated].
    #[arg(short = 'w', long = "warmup-iters", visible_alias = "warmup_iters", value_name = "N",
          value_parser = clap::value_parser!(u64).range(0..=MAX_ITERS))]
    pub(super) warmup: Option<u64>,

    /// Checked iterations per size after the timed ones (0 = no check). Each fills the
    /// buffers with a pattern that depends on the sending rank, the size and the iteration,
    /// and counts every wrong received byte into #wrong.
    #[arg(short = 'c', long = "check", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub(super) check: u64,

    /// Also write the rows as JSON to FILE (rank 0): a list of objects with the keys
    /// collective, size, count, type, redop, root, time_us, algbw, busbw, wrong, algo (what
    /// ran at that size) and curve (the row's curve in plots: the algorithm forced by
    /// --algo, -a or HCOMM_ALGO, or "auto"); redop, root, algo and curve are null for
    /// point-to-point.
    #[arg(short = 'J', long = "json", value_name = "FILE")]
    pub(super) json: Option<PathBuf>,

    /// Also draw busbw against size on log-log axes to FILE as SVG (rank 0): a panel per
    /// operation, a curve per (operation, algorithm) measured, and the peers' curves.
    #[arg(long = "plot", value_name = "FILE.svg")]
    pub(super) plot: Option<PathBuf>,

    /// Draw a peer's results too (with --plot), as NAME=FILE: hcomm_perf's -J JSON or the
    /// text output of bench/mpi_bench.c (the bench/results/*_summary.txt files hold it).
    /// Only the operations this run measures are drawn. Repeat for more peers.
    #[arg(long = "peer", value_name = "NAME=FILE", value_parser = parse_peer,
          requires = "plot")]
    pub(super) peers: Vec<(String, PathBuf)>,

    /// Seconds of timed iterations to aim for per size when -n is not given.
    #[arg(long = "time-target", value_name = "SECS", default_value = "0.2",
          value_parser = parse_seconds)]
    pub(super) time_target: f64,

    /// Most timed iterations per size when the count is estimated.
    #[arg(long = "max-iters", value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(5..=MAX_ITERS))]
    pub(super) max_iters: u64,
}

/// Options of `stream`.
#[derive(Debug, Clone, Args)]
pub(super) struct StreamArgs {
    #[command(flatten)]
    pub(super) sweep: SweepArgs,

    /// Most messages in flight in one window.
    #[arg(long = "window", value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub(super) window: u64,

    /// Fewer messages per window for large sizes: window x size stays at most this many
    /// bytes (but the window has at least one message).
    #[arg(long = "window-bytes", value_name = "SIZE", default_value = "8M",
          value_parser = parse_size)]
    pub(super) window_bytes: u64,
}

/// Options of the collectives.
#[derive(Debug, Clone, Args)]
pub(super) struct CollArgs {
    #[command(flatten)]
    pub(super) sweep: SweepArgs,

    /// Element type: bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16,
    /// bfloat16, float32, float64 (nccl-tests' half, float, double also work).
    #[arg(short = 'd', long = "datatype", value_name = "TYPE", default_value = "float32",
          value_parser = parse_dtype)]
    pub(super) dtype: DataType,

    /// Reduction of allreduce, reduce and reduce_scatter: sum, prod, max, min, avg, and on
    /// integers and bool band, bor, bxor (ignored by the other collectives).
    #[arg(short = 'o', long = "op", value_name = "OP", default_value = "sum",
          value_parser = parse_op)]
    pub(super) op: ReduceOp,

    /// Root rank of broadcast, reduce, gather and scatter (ignored by the others).
    #[arg(short = 'r', long = "root", value_name = "RANK", default_value_t = 0)]
    pub(super) root: usize,

    /// Run the collectives in place (one buffer; broadcast always is). nccl-tests prints
    /// out-of-place and in-place columns; hcomm_perf measures one of them per run.
    #[arg(long = "in-place", visible_alias = "inplace")]
    pub(super) in_place: bool,

    /// Force an algorithm (as HCOMM_ALGO would): NAME applies to every collective of the run
    /// that has an algorithm of that name (e.g. ring, tree, direct); a full HCOMM_ALGO value
    /// with ':' (e.g. allreduce:ring,broadcast:tree) is taken as written.
    #[arg(long = "algo", value_name = "NAME")]
    pub(super) algo: Option<String>,

    /// Sweep every algorithm of each collective in turn (the names HCOMM_ALGO takes), one
    /// table and one plot curve each. `onesided` runs only where every rank is on one host
    /// with shared memory (elsewhere it is skipped); where a call does not fit it, it runs
    /// the direct schedule under its name.
    #[arg(short = 'a', long = "all-algos", conflicts_with = "algo")]
    pub(super) all_algos: bool,

    /// Where the buffers live: `heap` (plain memory, reached through cross-memory attach or
    /// copies) or `pool` (hcomm's shared-memory pool, which local peers read in place).
    #[arg(long = "mem", value_name = "KIND", default_value = "heap",
          value_parser = ["heap", "pool"])]
    pub(super) mem: String,
}

/// Parses a data type name (hcomm's names, or nccl-tests' half/float/double).
pub(super) fn parse_dtype(s: &str) -> Result<DataType, String> {
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
pub(super) fn parse_op(s: &str) -> Result<ReduceOp, String> {
    ReduceOp::from_name(s.trim()).ok_or_else(|| {
        let valid: Vec<&str> = ReduceOp::ALL.iter().map(|o| o.name()).collect();
        format!("{s:?} is not a reduction; valid: {}", valid.join(", "))
    })
}

/// Upper bound of -n and -w, far beyond any sensible run.
pub(super) const MAX_ITERS: u64 = 100_000_000;
/// Fewest timed iterations when the count is estimated (the median needs a few).
pub(super) const MIN_ITERS: u64 = 5;
/// Most sizes in one sweep.
pub(super) const MAX_SIZES: usize = 4096;

/// Parses `NAME=FILE` of --peer.
pub(super) fn parse_peer(s: &str) -> Result<(String, PathBuf), String> {
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
pub(super) fn parse_seconds(s: &str) -> Result<f64, String> {
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
    pub(super) fn sizes(&self) -> anyhow::Result<Vec<u64>> {
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
    pub(super) fn warmup_for(&self, size: u64) -> u64 {
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
    pub(super) fn iters_for(&self, per_iter_secs: f64) -> u64 {
        if let Some(n) = self.iters {
            return n;
        }
        let est = per_iter_secs.max(1e-9);
        // `as` saturates for huge quotients; the clamp does the rest.
        ((self.time_target / est) as u64).clamp(MIN_ITERS, self.max_iters)
    }
}

/// Arguments of `hcomm_perf batch`.
#[derive(Debug, Args)]
pub(super) struct BatchArgs {
    /// Number of all-reduces.
    #[arg(long, default_value_t = 1000)]
    pub(super) ops: usize,
    /// Elements (float32) of each all-reduce.
    #[arg(long, default_value_t = 8)]
    pub(super) count: usize,
    /// Repetitions of each way (the median is reported).
    #[arg(short = 'n', long, default_value_t = 9)]
    pub(super) iters: usize,
}
