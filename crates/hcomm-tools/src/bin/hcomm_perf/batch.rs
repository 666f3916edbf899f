//! Grouped calls against the same calls one by one.

use std::time::Instant;

use anyhow::{ensure, Context};
use hcomm::{Communicator, ReduceOp};

use super::{measure, BatchArgs, Outcome};

/// Median seconds of `iters` runs of `f`, the slowest rank's (max over ranks).
fn median(
    comm: &Communicator,
    iters: usize,
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    measure::median_of(iters as u64, || {
        comm.barrier()?;
        let t0 = Instant::now();
        f()?;
        let mut t = [t0.elapsed().as_secs_f64()];
        comm.allreduce_in_place(&mut t, ReduceOp::Max)?;
        Ok(t[0])
    })
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
