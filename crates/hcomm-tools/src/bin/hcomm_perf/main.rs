//! `hcomm_perf`: nccl-tests-style performance sweeps over message sizes.
//!
//! Every operation is a subcommand sharing the sweep options ([`SweepArgs`]). The
//! point-to-point operations live in [`p2p`], the collectives in [`collective`]; both report
//! through the same [`Row`] and [`Report`].
//!
//! Conventions (as nccl-tests and `bench/mpi_bench.c`): time = median of individually
//! timed back-to-back iterations; point-to-point measures it on rank 0, collectives on every
//! rank and report the slowest rank's median (the maximum over the ranks, found with an
//! all-reduce after the timed iterations, like `mpi_bench`); algbw = size / time in GB/s
//! (1 GB = 1e9 bytes); busbw = algbw x nccl-tests' factor of the collective (1 for
//! point-to-point). Checking (`-c N`) happens after the timed iterations, on N extra
//! iterations with fresh data, so it never slows the timing.

mod args;
mod batch;
mod collective;
mod measure;
mod p2p;
mod report;
#[cfg(test)]
mod tests;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hcomm::CollKind;

use args::{BatchArgs, CollArgs, StreamArgs, SweepArgs};
use report::{Report, Row, Traffic};

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
