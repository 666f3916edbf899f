//! The `direct` scenario: collective steps written straight into the peer's receive.

use anyhow::Result;
use hcomm::internal::coll::random::shapes;
use hcomm::{CollKind, Communicator, DataType, ReduceOp};

use super::coll::check_call;

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
                let root = if kind.rooted() { seed as usize % n } else { 0 };
                let shapes = shapes(
                    kind,
                    n,
                    count,
                    root,
                    DataType::Int32,
                    ReduceOp::Sum,
                    in_place,
                    seed,
                );
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
