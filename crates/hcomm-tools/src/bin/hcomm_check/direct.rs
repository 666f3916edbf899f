//! The `direct` scenario: collective steps written straight into the peer's receive.

use anyhow::{ensure, Result};
use hcomm::{CollKind, Communicator, DataType, ReduceOp, Shape};

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
