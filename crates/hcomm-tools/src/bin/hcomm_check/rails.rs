//! Traffic for the failover tests: checked all-reduces or ordered messages in a loop, with
//! progress lines the test paces its link changes by, and the failovers counted at the end.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use hcomm::{Communicator, ReduceOp};

/// What the ranks exchange.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum Traffic {
    /// All-reduces (i32 sum) of --bytes each, every element checked.
    Allreduce,
    /// Rank 0 sends numbered messages to rank 1, one tag: every fourth of --bytes, the
    /// others of 8 bytes; rank 1 checks that each is the next and whole.
    Ordered,
}

/// For `linger` (nothing when zero): prints `pid P` (flushed), then runs a barrier every
/// 20 ms, so that a profiler attached meanwhile sees the rank's counters (published at each
/// operation while it watches).
pub(crate) fn linger_for_a_profiler(comm: &Communicator, linger: Duration) -> Result<()> {
    if linger.is_zero() {
        return Ok(());
    }
    println!("pid {}", std::process::id());
    let _ = std::io::stdout().flush();
    const EVERY: Duration = Duration::from_millis(20);
    for _ in 0..linger.as_millis() / EVERY.as_millis() {
        comm.barrier().context("a barrier while lingering")?;
        std::thread::sleep(EVERY);
    }
    Ok(())
}

/// Runs `count` exchanges of `traffic`, `pause` apart, printing `step K US` (microseconds
/// since the start) every `every` steps (flushed), then `failovers N` (this rank's
/// `tcp_failovers`); then, for `linger`, `pid P` and a barrier every 20 ms (a profiler may
/// read the rank meanwhile); and `took MS`.
pub(crate) fn rails(
    comm: &Communicator,
    traffic: Traffic,
    count: usize,
    bytes: usize,
    every: usize,
    pause: Duration,
    linger: Duration,
) -> Result<()> {
    let (rank, size) = (comm.rank(), comm.size());
    let t0 = Instant::now();
    let step = |k: usize| {
        if k % every.max(1) == 0 {
            println!("step {k} {}", t0.elapsed().as_micros());
            let _ = std::io::stdout().flush();
        }
        std::thread::sleep(pause);
    };
    match traffic {
        Traffic::Allreduce => {
            let n = bytes / 4;
            let mut buf = vec![0i32; n];
            let ranks = i32::try_from(size)?;
            for k in 0..count {
                let base = i32::try_from(k)? + 1;
                for (j, x) in buf.iter_mut().enumerate() {
                    *x = (i32::try_from(rank)? + 1) * base + (j % 7) as i32;
                }
                comm.allreduce_in_place(&mut buf, ReduceOp::Sum)
                    .with_context(|| format!("all-reduce {k}"))?;
                let sum_ranks = ranks * (ranks + 1) / 2;
                for (j, x) in buf.iter().enumerate() {
                    let want = sum_ranks * base + ranks * (j % 7) as i32;
                    ensure!(*x == want, "all-reduce {k}: element {j} is {x}, not {want}");
                }
                step(k);
            }
        }
        Traffic::Ordered => {
            ensure!(size >= 2, "ordered traffic needs two ranks");
            let large = bytes.max(8);
            let mut buf = vec![0u8; large];
            for k in 0..count {
                let len = if k % 4 == 3 { large } else { 8 };
                let seq = (k as u64).to_le_bytes();
                if rank == 0 {
                    for (j, b) in buf[..len].iter_mut().enumerate() {
                        *b = seq[j % 8] ^ (j / 8) as u8;
                    }
                    comm.send(&buf[..len], 1, 3)
                        .with_context(|| format!("sending message {k}"))?;
                } else if rank == 1 {
                    let got = comm
                        .recv(&mut buf, 0, 3)
                        .with_context(|| format!("receiving message {k}"))?;
                    ensure!(got == len, "message {k}: {got} bytes, not {len}");
                    for (j, b) in buf[..len].iter().enumerate() {
                        let want = seq[j % 8] ^ (j / 8) as u8;
                        ensure!(*b == want, "message {k}: byte {j} is {b}, not {want}");
                    }
                }
                step(k);
            }
            comm.barrier().context("the closing barrier")?;
        }
    }
    println!("failovers {}", comm.protocol_stats().tcp_failovers);
    linger_for_a_profiler(comm, linger)?;
    println!("took {}", t0.elapsed().as_millis());
    Ok(())
}
