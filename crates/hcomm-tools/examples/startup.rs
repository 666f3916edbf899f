//! Start-up and shut-down of a job, for measuring them: each rank inits, all-reduces one
//! value, passes a barrier and finalizes, then prints how long its init and its finalize took.
//!
//! `hcommrun -n 128 -- target/release/examples/startup` (see `bench/startup.sh`).

use std::time::Instant;

use hcomm::{Communicator, ReduceOp};

fn main() -> hcomm::Result<()> {
    let start = Instant::now();
    let comm = Communicator::init()?;
    let init = start.elapsed();
    let mut one = [1.0f64];
    comm.allreduce_in_place(&mut one, ReduceOp::Sum)?;
    if one[0] != comm.size() as f64 {
        return Err(hcomm::Error::internal(format!(
            "the all-reduce of ones gave {} on {} ranks",
            one[0],
            comm.size()
        )));
    }
    comm.barrier()?;
    let rank = comm.rank();
    let finalizing = Instant::now();
    comm.destroy()?;
    let finalize = finalizing.elapsed();
    println!(
        "rank {rank} init_ms {:.1} finalize_ms {:.1}",
        init.as_secs_f64() * 1e3,
        finalize.as_secs_f64() * 1e3
    );
    Ok(())
}
