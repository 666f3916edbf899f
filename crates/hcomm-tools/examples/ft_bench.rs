//! What surviving a lost rank costs, against starting the job again: one job of `bench/ft.sh`.
//!
//! `FT_MODE=ft` (under `hcommrun --keep-going`, or ranks started by hand): every rank inits and
//! all-reduces 8 bytes for a while; the last rank then kills itself (SIGKILL) and the others,
//! blocked in their next all-reduce, go through the recovery one phase at a time, each phase
//! entered by every survivor before it is timed:
//!
//! * detection: the survivors' all-reduce fails, and then `failed()` names the victim (a
//!   survivor that had no link to it may learn of it later than its all-reduce failed);
//! * revoke: once every survivor knows the loss, rank 0 revokes while the others wait in a
//!   receive from it that nothing answers;
//! * agree: `ack_failed`, then `agree`;
//! * shrink, then the first all-reduce on the shrunk communicator.
//!
//! `FT_MODE=fresh`: the other side, a fresh job of the survivors: init and one all-reduce
//! (each rank says when it started and when its init returned).
//!
//! Each rank prints `name unix_ns` pairs (wall clock: the ranks share the host's clock, also
//! in network namespaces); `bench/ft.sh` turns them into latencies. All waits are bounded
//! (`HCOMM_TIMEOUT`, and `LIMIT` for the loops here).

use std::time::{Duration, Instant};

use hcomm::{Communicator, Error, ReduceOp};
use hcomm_testkit::unix_ns;

/// A loop that never meets its failure gives up after this long.
const LIMIT: Duration = Duration::from_secs(60);
/// All-reduces before the last rank dies.
const WARMUP: usize = 50;

/// One all-reduce of 8 bytes, checked.
fn allreduce(comm: &Communicator) -> hcomm::Result<()> {
    let mut v = [1u64];
    comm.allreduce_in_place(&mut v, ReduceOp::Sum)?;
    if v[0] != comm.size() as u64 {
        return Err(Error::internal(format!("the sum of ones gave {}", v[0])));
    }
    Ok(())
}

/// Fails with `what` once `LIMIT` has passed since `start`.
fn bounded(start: Instant, what: &str) -> hcomm::Result<()> {
    if start.elapsed() > LIMIT {
        return Err(Error::internal(format!("{what}: nothing after {LIMIT:?}")));
    }
    Ok(())
}

fn fresh() -> hcomm::Result<()> {
    println!("start {}", unix_ns());
    let comm = Communicator::init()?;
    println!("init {}", unix_ns());
    allreduce(&comm)?;
    println!("first {}", unix_ns());
    comm.destroy()
}

fn ft() -> hcomm::Result<()> {
    let world = Communicator::init()?;
    let (me, victim) = (world.rank(), world.size() - 1);
    for _ in 0..WARMUP {
        allreduce(&world)?;
    }
    world.barrier()?;
    if me == victim {
        println!("kill {}", unix_ns());
        // SAFETY: kill(2) on this process has no memory preconditions; SIGKILL ends it here.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        return Err(Error::internal("SIGKILL returned"));
    }
    let start = Instant::now();
    let err = loop {
        if let Err(e) = allreduce(&world) {
            break e;
        }
        bounded(start, "the victim's loss")?;
    };
    println!("error {} {:?}", unix_ns(), err.code());
    while world.failed() != [victim] {
        bounded(start, "the victim in failed()")?;
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("known {}", unix_ns());
    let mut word = [0u8; 1];
    if me == 0 {
        for peer in 1..victim {
            world.recv(&mut word, peer, 11)?;
        }
        println!("revoke {}", unix_ns());
        world.revoke()?;
        println!("revoke_returned {}", unix_ns());
    } else {
        world.send(&word, 0, 11)?;
        match world.recv(&mut word, 0, 12) {
            Err(Error::Revoked(_)) => println!("revoked {}", unix_ns()),
            other => {
                return Err(Error::internal(format!(
                    "a receive on the revoked communicator gave {other:?}"
                )))
            }
        }
    }
    world.ack_failed();
    let mut flag = true;
    println!("agree_in {}", unix_ns());
    world.agree(&mut flag)?;
    println!("agree_out {}", unix_ns());
    println!("shrink_in {}", unix_ns());
    let comm = world.shrink()?;
    println!("shrink_out {}", unix_ns());
    allreduce(&comm)?;
    println!("first {}", unix_ns());
    if comm.size() != victim {
        return Err(Error::internal(format!("shrunk to {} ranks", comm.size())));
    }
    comm.destroy()?;
    world.destroy()
}

fn main() -> hcomm::Result<()> {
    match std::env::var("FT_MODE").as_deref() {
        Ok("fresh") => fresh(),
        Ok("ft") => ft(),
        other => Err(Error::invalid_argument(format!(
            "FT_MODE={other:?}: use ft or fresh"
        ))),
    }
}
