//! The `direct` scenario: collective steps written straight into the peer's receive.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use hcomm::{CollKind, Communicator, DataType, Error, ReduceOp, Shape};

use super::coll::{check_call, int32_shapes};

/// Int32 counts: a contribution just under and over the eager limit (4 KiB) and just under
/// and over the RDMA write threshold (1 MiB), so that the steps of every algorithm (whole
/// contributions, or pieces of them) fall on both sides of both.
const COUNTS: [usize; 4] = [1023, 1025, 262_143, 262_145];

pub(super) fn direct(comm: &Communicator) -> Result<()> {
    let n = comm.size();
    let mut seed = 5000;
    for kind in CollKind::ALL {
        if kind == CollKind::Barrier {
            continue;
        }
        let before = comm.protocol_stats().ofi_direct;
        for count in COUNTS {
            for in_place in [false, true] {
                if in_place && matches!(kind, CollKind::AllToAllV | CollKind::Broadcast) {
                    continue;
                }
                seed += 1;
                let shapes = int32_shapes(kind, n, count, in_place, seed);
                check_call(comm, &shapes, seed, seed % 3 == 0)?;
            }
        }
        let moved = comm.protocol_stats().ofi_direct - before;
        println!("direct {} {moved}", kind.name());
    }
    let s = comm.protocol_stats();
    println!(
        "ofi eager={} read={} write={} direct={} mr_hits={} mr_misses={}",
        s.ofi_eager, s.ofi_read, s.ofi_write, s.ofi_direct, s.ofi_mr_hits, s.ofi_mr_misses
    );
    Ok(())
}

/// Int32 counts of the overlapped all-reduces: above the eager limit (so that their steps go
/// direct through libfabric), small and large.
const OVERLAP_COUNTS: [usize; 2] = [5000, 100_000];

/// `rounds` rounds of collectives in flight at once on the world and a dup of it (as the C
/// test's `dup_and_overlap`): a nonblocking all-reduce on each, whose steps go direct, a
/// nonblocking barrier on the dup and a nonblocking all-gather on the world, then a blocking
/// all-reduce on the dup; every result checked. Prints the messages this rank wrote straight
/// into a peer's receive (`direct overlap N`).
pub(super) fn direct_overlap(comm: &Communicator, rounds: usize) -> Result<()> {
    let (n, me) = (comm.size(), comm.rank());
    let dup = comm.dup()?;
    let before = comm.protocol_stats().ofi_direct;
    let ints = |v: &[i32]| -> Vec<u8> { bytemuck::cast_slice(v).to_vec() };
    for round in 0..rounds {
        let count = OVERLAP_COUNTS[round % OVERLAP_COUNTS.len()];
        let a: Vec<i32> = (0..count).map(|i| (me + i) as i32).collect();
        let b: Vec<i32> = (0..count).map(|i| (me * 3) as i32 - i as i32).collect();
        let ra = comm.iallreduce(ints(&a), DataType::Int32, ReduceOp::Sum)?;
        let rb = dup.iallreduce(ints(&b), DataType::Int32, ReduceOp::Max)?;
        let rbar = dup.ibarrier()?;
        let g = Shape::new(CollKind::AllGather, DataType::Int64, ReduceOp::Sum, 2, 0, n);
        let mine: Vec<u8> = bytemuck::cast_slice(&[me as i64, -(me as i64)]).to_vec();
        let rg = comm.start_collective(g.clone(), Some(mine), vec![0u8; g.recv_bytes(me)])?;
        let mut ranks = [0i32];
        dup.allreduce(&[1i32], &mut ranks, ReduceOp::Sum)?;
        ensure!(
            ranks[0] == n as i32,
            "round {round}: the blocking all-reduce is wrong"
        );
        let got = rg.wait()?;
        rbar.wait()?;
        let (rb, ra) = (rb.wait()?, ra.wait()?);
        let all: &[i64] = bytemuck::cast_slice(&got.buffer);
        ensure!(
            all.chunks(2)
                .enumerate()
                .all(|(p, c)| c == [p as i64, -(p as i64)]),
            "round {round}: the all-gather is wrong"
        );
        let sum: &[i32] = bytemuck::cast_slice(&ra.buffer);
        let max: &[i32] = bytemuck::cast_slice(&rb.buffer);
        let rank_sum = (n * (n - 1) / 2) as i32;
        ensure!(
            sum.iter()
                .enumerate()
                .all(|(i, &x)| x == rank_sum + (n * i) as i32),
            "round {round}: the all-reduce on the world is wrong"
        );
        ensure!(
            max.iter()
                .enumerate()
                .all(|(i, &x)| x == ((n - 1) * 3) as i32 - i as i32),
            "round {round}: the all-reduce on the dup is wrong"
        );
    }
    println!(
        "direct overlap {}",
        comm.protocol_stats().ofi_direct - before
    );
    Ok(())
}

/// Int32 elements of the all-reduces of [`direct_revoke`]: steps above the eager limit, so
/// that they go direct through libfabric.
const REVOKE_COUNT: usize = 100_000;

/// Checks a sum all-reduce of [`REVOKE_COUNT`] elements on `comm`, each rank contributing
/// its communicator rank plus the element's index.
pub(super) fn checked_sum(comm: &Communicator) -> Result<()> {
    let (n, me) = (comm.size(), comm.rank());
    let mut v: Vec<i32> = (0..REVOKE_COUNT).map(|i| (me + i) as i32).collect();
    comm.allreduce_in_place(&mut v, ReduceOp::Sum)?;
    let ranks = (n * (n - 1) / 2) as i32;
    ensure!(
        v.iter()
            .enumerate()
            .all(|(i, &x)| x == ranks + (n * i) as i32),
        "the all-reduce is wrong"
    );
    Ok(())
}

/// A receive offered to a peer and given up while the peer does not answer (two hosts of two
/// ranks: world ranks 0 and 1 on the first, 2 and 3 on the second). The ranks of the first
/// host start a nonblocking all-reduce with their partner on the second (0 with 2, 1 with 3),
/// whose direct receives they offer, while the partners stop themselves (`SIGSTOP`, resumed
/// by a child after `stop_ms`) before calling it; after `abort_ms` the first host's ranks
/// abort that communicator: the call fails at once, revoking its offers without waiting for
/// the stopped peer (printed: `revoked in N ms`). Then every rank runs a checked all-reduce
/// with its other partner on the other host (0 with 3, 1 with 2) through the same endpoint;
/// the partners, resumed, find their first call aborted.
pub(super) fn direct_revoke(comm: &Communicator, stop_ms: u64, abort_ms: u64) -> Result<()> {
    ensure!(
        comm.size() == 4,
        "direct-revoke needs 4 ranks (two hosts of two)"
    );
    let me = comm.rank();
    let first = me < 2;
    // 0 with 2 and 1 with 3, then 0 with 3 and 1 with 2.
    let straight = comm.split((me % 2) as i32, me as i32)?.context("no pair")?;
    let crossed = comm
        .split(i32::from(me == 0 || me == 3), me as i32)?
        .context("no pair")?;
    comm.barrier()?;
    if first {
        let v: Vec<i32> = (0..REVOKE_COUNT).map(|i| i as i32).collect();
        let req = straight.iallreduce(
            bytemuck::cast_slice(&v).to_vec(),
            DataType::Int32,
            ReduceOp::Sum,
        )?;
        std::thread::sleep(Duration::from_millis(abort_ms));
        abort_timed(&straight, req, "all-reduce")?;
    } else {
        stop_self(stop_ms)?;
        let mut v = vec![0i32; REVOKE_COUNT];
        match straight.allreduce_in_place(&mut v, ReduceOp::Sum) {
            Err(Error::Aborted(_)) => {}
            other => bail!("the all-reduce its partner aborted gave {other:?}"),
        }
    }
    checked_sum(&crossed)?;
    comm.barrier()?;
    Ok(())
}

/// Bytes of the messages of [`write_revoke`]: above the RDMA write threshold (1 MiB), so that
/// they go by RDMA write through libfabric.
const WRITE_BYTES: usize = 2 << 20;

/// The margin of [`write_revoke`]'s steps: how long a rank waits for its peer to have stopped
/// itself (a few milliseconds, unless the machine is loaded).
const SETTLE: Duration = Duration::from_millis(500);

/// The destination of an RDMA write given up while its writer does not answer (two hosts of
/// two ranks, as [`direct_revoke`]: 2 sends [`WRITE_BYTES`] to 0, 3 to 1), its steps ordered
/// by stops (`SIGSTOP`, each resumed by a child) so that the writer is stopped from the moment
/// it announced the write until well after the receiver gave it up:
///
/// 1. the sender starts its send (its request to send goes out; no receive matches it yet)
///    and stops itself for `stop_ms / 3`;
/// 2. the receiver posts its receive after [`SETTLE`] (the sender is stopped by then), which
///    answers the request, and after [`SETTLE`] / 4 stops itself for `stop_ms / 3`;
/// 3. the sender, resumed, announces the write (its `ofi_write` count grows) and stops
///    itself for `stop_ms`, before the stopped receiver could tell it where to write;
/// 4. the receiver, resumed, names the destination, and `abort_ms` later aborts the
///    communicator: the receive fails within the short wait for the stopped writer's answer
///    (printed: `revoked in N ms`), without closing the endpoint;
/// 5. the sender, resumed, finds its send dropped by the receiver (it counts as sent) or
///    aborted, not written into the revoked destination.
///
/// Then every rank runs a checked all-reduce with its other partner on the other host, and
/// each pair exchanges [`WRITE_BYTES`] on the world, checked: the same peer, by RDMA write.
pub(super) fn write_revoke(comm: &Communicator, stop_ms: u64, abort_ms: u64) -> Result<()> {
    ensure!(
        comm.size() == 4,
        "write-revoke needs 4 ranks (two hosts of two)"
    );
    ensure!(
        stop_ms / 3 > 2 * SETTLE.as_millis() as u64,
        "write-revoke needs --stop-ms above {} ms",
        6 * SETTLE.as_millis()
    );
    let me = comm.rank();
    // 0 with 2 and 1 with 3 (the first host's rank first), then 0 with 3 and 1 with 2.
    let straight = comm.split((me % 2) as i32, me as i32)?.context("no pair")?;
    let crossed = comm
        .split(i32::from(me == 0 || me == 3), me as i32)?
        .context("no pair")?;
    comm.barrier()?;
    let pending = |req: &mut hcomm::Request, ms: u64| -> Result<()> {
        let until = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < until {
            ensure!(
                !req.test()?,
                "the transfer ended although its peer was stopped"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    };
    if me < 2 {
        std::thread::sleep(SETTLE);
        let mut req = straight.irecv(vec![0u8; WRITE_BYTES], 1, 7)?;
        pending(&mut req, SETTLE.as_millis() as u64 / 4)?;
        stop_self(stop_ms / 3)?;
        pending(&mut req, abort_ms)?;
        abort_timed(&straight, req, "receive")?;
    } else {
        let before = comm.protocol_stats().ofi_write;
        let mut req = straight.isend(vec![0x5a; WRITE_BYTES], 0, 7)?;
        stop_self(stop_ms / 3)?;
        let until = Instant::now() + Duration::from_secs(20);
        while comm.protocol_stats().ofi_write == before {
            ensure!(
                !req.test()?,
                "the send ended before its write was announced"
            );
            ensure!(Instant::now() < until, "the write was never announced");
        }
        stop_self(stop_ms)?;
        match req.wait() {
            Ok(_) => println!("send dropped"),
            Err(Error::Aborted(_)) => println!("send aborted"),
            Err(e) => bail!("the send its partner gave up gave {e}"),
        }
    }
    checked_sum(&crossed)?;
    let partner = (me + 2) % 4;
    let mine: Vec<u8> = (0..WRITE_BYTES).map(|i| (i + me) as u8).collect();
    let mut got = vec![0u8; WRITE_BYTES];
    comm.sendrecv(&mine, partner, 9, &mut got, partner, 9)?;
    ensure!(
        got.iter()
            .enumerate()
            .all(|(i, &x)| x == (i + partner) as u8),
        "the exchange with the same peer is wrong"
    );
    comm.barrier()?;
    Ok(())
}

/// Aborts `comm` and waits for `req`, its `what`, which must fail as aborted; prints how long
/// that took (`revoked in N ms`, which the netns tests read).
fn abort_timed(comm: &Communicator, req: hcomm::Request, what: &str) -> Result<()> {
    let t0 = Instant::now();
    comm.abort()?;
    match req.wait() {
        Err(Error::Aborted(_)) => {}
        Err(e) => bail!("the aborted {what} gave {e}"),
        Ok(_) => bail!("the aborted {what} succeeded"),
    }
    println!("revoked in {} ms", t0.elapsed().as_millis());
    Ok(())
}

/// Stops this process (`SIGSTOP`: none of its threads runs) for `ms`, resumed by a child.
fn stop_self(ms: u64) -> Result<()> {
    let pid = std::process::id();
    let mut waker = std::process::Command::new("sh")
        .args([
            "-c",
            &format!("sleep {}; kill -CONT {pid}", ms as f64 / 1000.0),
        ])
        .spawn()
        .context("starting the waker")?;
    // The signal itself, not a `kill` program (procps, which a minimal system lacks).
    rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::STOP)
        .context("stopping")?;
    let woke = waker.wait().context("the waker")?;
    ensure!(woke.success(), "the waker failed");
    Ok(())
}
