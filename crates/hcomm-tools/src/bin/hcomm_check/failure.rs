//! Failures: survivors of a lost peer and of an aborted world, and when they learn of it.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use hcomm::{Communicator, Error, ReduceOp};

use super::resources::nothing_left;

/// The operation survivors of `peer-loss` wait in.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(super) enum Pending {
    /// A blocking receive from the first victim (the waiter sleeps).
    Recv,
    /// All-reduces of 256 KiB in a loop (the waiter is busy).
    Allreduce,
}

/// Unix time in nanoseconds, to compare events of different processes of one machine.
fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

pub(super) fn peer_loss(
    comm: Communicator,
    victims: &[usize],
    kill_after_ms: Option<u64>,
    pending: Pending,
    before: (usize, usize),
) -> Result<()> {
    let r = comm.rank();
    ensure!(
        victims.iter().all(|&v| v < comm.size()) && !victims.is_empty(),
        "--victims must name ranks below {}",
        comm.size()
    );
    ensure!(
        victims.len() < comm.size(),
        "somebody must survive to notice"
    );
    comm.barrier()?;
    println!("ready {}", unix_ns());
    let mut buf = vec![1.0f32; 1 << 16];
    if victims.contains(&r) {
        let Some(ms) = kill_after_ms else {
            // Wait to be killed from outside, taking part meanwhile.
            let until = Instant::now() + comm.config().timeout;
            while Instant::now() < until {
                match pending {
                    Pending::Allreduce => comm.allreduce_in_place(&mut buf, ReduceOp::Max)?,
                    Pending::Recv => std::thread::sleep(Duration::from_millis(50)),
                }
            }
            bail!("rank {r} of --victims was not killed");
        };
        std::thread::sleep(Duration::from_millis(ms));
        println!("killing {}", unix_ns());
        // SAFETY: kill has no memory-safety preconditions; it ends this process at once.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        bail!("SIGKILL did not arrive");
    }
    let err = match pending {
        Pending::Recv => {
            let mut byte = [0u8; 1];
            match comm.recv(&mut byte, victims[0], 99) {
                Ok(_) => bail!(
                    "received a message from rank {} that never sends",
                    victims[0]
                ),
                Err(e) => e,
            }
        }
        Pending::Allreduce => loop {
            if let Err(e) = comm.allreduce_in_place(&mut buf, ReduceOp::Max) {
                break e;
            }
        },
    };
    let at = unix_ns();
    match err {
        Error::PeerLost(_) | Error::Aborted(_) => {
            let peer = err.peer().and_then(|p| p.world);
            let peer = peer.map_or_else(|| "unknown".to_string(), |w| w.to_string());
            println!("lost {at} {:?} world rank {peer}: {err}", err.code());
        }
        e => bail!("expected PeerLost or Aborted, got {e}"),
    }
    // The world has lost a rank: release it without the goodbye of destroy.
    nothing_left(comm, before)
}

/// One checked all-reduce of exact integers: element i of rank r is (i + 1)(r + 1) + k.
fn exact_allreduce(comm: &Communicator, k: i64) -> hcomm::Result<()> {
    let (n, r) = (comm.size() as i64, comm.rank() as i64);
    let send: Vec<i64> = (0..1024).map(|i| (i + 1) * (r + 1) + k).collect();
    let mut recv = vec![0i64; send.len()];
    comm.allreduce(&send, &mut recv, ReduceOp::Sum)?;
    for (i, &got) in recv.iter().enumerate() {
        let want = (i as i64 + 1) * n * (n + 1) / 2 + n * k;
        if got != want {
            return Err(Error::internal(format!(
                "element {i} of all-reduce {k} is {got}, not {want}"
            )));
        }
    }
    Ok(())
}

/// The `shrink` scenario (see its description in main.rs).
pub(super) fn shrink(world: &Communicator) -> Result<()> {
    world.barrier()?;
    println!("ready {}", unix_ns());
    let until = Instant::now() + world.config().timeout * 4;
    let mut k = 0;
    let err = loop {
        match exact_allreduce(world, k) {
            Ok(()) => k += 1,
            Err(e @ Error::Internal(_)) => bail!("{e}"),
            Err(e) => break e,
        }
        ensure!(
            Instant::now() < until,
            "no failure came after {k} all-reduces"
        );
    };
    println!("failed {} {:?}: {err}", unix_ns(), err.code());
    world.revoke()?;
    match world.shrink() {
        Ok(comm) => {
            println!("shrunk {} failed {:?}", comm.size(), world.failed());
            for k in 0..10 {
                exact_allreduce(&comm, k).context("an all-reduce after the shrink")?;
            }
            println!("OK shrink");
        }
        Err(e @ Error::Quorum(_)) => {
            println!("quorum {e}");
            println!("OK quorum");
        }
        Err(e) => return Err(e).context("shrink"),
    }
    Ok(())
}

pub(super) fn abort(
    comm: Communicator,
    aborter: usize,
    pending: Pending,
    before: (usize, usize),
) -> Result<()> {
    let r = comm.rank();
    ensure!(
        aborter < comm.size() && comm.size() > 1,
        "--aborter must name a rank below {}, and somebody must wait",
        comm.size()
    );
    // Derived before the abort: not aborted with it.
    let spare = comm.dup()?;
    comm.barrier()?;
    println!("ready {}", unix_ns());
    let mut buf = vec![1.0f32; 1 << 16];
    let later = |comm: &Communicator| -> Result<()> {
        match comm.barrier() {
            Err(Error::Aborted(_)) => {}
            other => bail!("a call after the abort gave {other:?}, not Aborted"),
        }
        spare
            .barrier()
            .context("a communicator duplicated before the abort")
    };
    if r == aborter {
        // Another thread of the aborter waits on the communicator too: the abort ends it.
        let peer = (r + 1) % comm.size();
        std::thread::scope(|s| -> Result<()> {
            let waiter = s.spawn(|| {
                let mut byte = [0u8; 1];
                comm.recv(&mut byte, peer, 98)
            });
            std::thread::sleep(Duration::from_millis(300));
            println!("aborting {}", unix_ns());
            comm.abort()?;
            comm.abort()?;
            match waiter.join() {
                Ok(Err(Error::Aborted(m))) if m.message.contains("this rank aborted") => Ok(()),
                Ok(other) => bail!("the aborter's other thread got {other:?}, not Aborted"),
                Err(_) => bail!("the aborter's other thread panicked"),
            }
        })?;
        later(&comm)?;
        drop(spare);
        std::thread::sleep(Duration::from_secs(1));
        nothing_left(comm, before)?;
        bail!("rank {r} aborted the world on purpose");
    }
    let err = match pending {
        Pending::Recv => {
            let mut byte = [0u8; 1];
            match comm.recv(&mut byte, aborter, 99) {
                Ok(_) => bail!("received a message from rank {aborter} that never sends"),
                Err(e) => e,
            }
        }
        Pending::Allreduce => loop {
            if let Err(e) = comm.allreduce_in_place(&mut buf, ReduceOp::Max) {
                break e;
            }
        },
    };
    let at = unix_ns();
    match &err {
        Error::Aborted(m) if m.peer.and_then(|p| p.world) == Some(aborter) => {
            println!("aborted {at} {:?}: {err}", err.code())
        }
        e => bail!("expected Aborted naming rank {aborter}, got {e}"),
    }
    later(&comm)?;
    drop(spare);
    nothing_left(comm, before)
}
