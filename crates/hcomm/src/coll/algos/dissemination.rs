//! The dissemination barrier: `ceil(log2 n)` rounds of empty messages; in round `k` rank `r`
//! notifies rank `r + 2^k` and waits for rank `r - 2^k` (mod `n`). A rank may send in round
//! `k + 1` only once its round-`k` message has arrived; then after the last round it has
//! heard, directly or through others, from every rank: `ceil(log2 n)` latencies instead of
//! the `n - 1` messages per rank of the direct barrier.
//!
//! Each round receives into, and the next round sends from, the same empty scratch region,
//! which is how the schedule states that order. [`ScheduleBuilder`] derives dependencies
//! only from regions that share a byte, so it does not yet order these steps, and without
//! that order the rounds all start at once and a rank may leave before every rank entered.
//! Until empty regions (or an explicit dependency) order steps, `cost` keeps the selector
//! away from this barrier; `HCOMM_ALGO=barrier:dissemination` still runs it.

use crate::coll::schedule::{Buf, Region, Schedule, ScheduleBuilder};
use crate::coll::{Algorithm, CollKind, CostModel, Shape};
use crate::topology::Topology;

/// See the module docs.
pub struct Dissemination;

impl Algorithm for Dissemination {
    fn name(&self) -> &'static str {
        "dissemination"
    }

    fn supports(&self, kind: CollKind) -> bool {
        kind == CollKind::Barrier
    }

    fn cost(&self, _s: &Shape, _topo: &Topology, _m: &CostModel) -> Option<f64> {
        // ceil(log2 n) * alpha once the rounds are ordered (see the module docs).
        None
    }

    fn schedule(&self, s: &Shape, rank: usize, _topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        let n = s.size;
        let token = Region::new(Buf::Scratch, 0, 0);
        let mut d = 1;
        while d < n {
            b.send((rank + d) % n, token);
            b.recv((rank + n - d) % n, token);
            d *= 2;
        }
        b.build()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;
    use crate::coll::schedule::Step;
    use crate::dtype::{DataType, ReduceOp};

    #[test]
    fn sweep() {
        testing::sweep(&Dissemination);
        for n in [31, 33, 64] {
            let r = testing::check(
                &Dissemination,
                CollKind::Barrier,
                n,
                0,
                0,
                DataType::Uint8,
                ReduceOp::Sum,
                false,
                2,
                1,
            );
            assert!(r.is_ok(), "{r:?}");
        }
    }

    #[test]
    fn rounds_and_peers() {
        let s = Shape::new(CollKind::Barrier, DataType::Uint8, ReduceOp::Sum, 0, 0, 13);
        let sched = Dissemination.schedule(&s, 5, &testing::topology(13, 1));
        let peers: Vec<(bool, usize)> = sched
            .steps
            .iter()
            .map(|st| match *st {
                Step::Send { peer, .. } => (true, peer),
                Step::Recv { peer, .. } => (false, peer),
                _ => unreachable!("a barrier only exchanges messages"),
            })
            .collect();
        assert_eq!(
            peers,
            [
                (true, 6),
                (false, 4),
                (true, 7),
                (false, 3),
                (true, 9),
                (false, 1),
                (true, 0),
                (false, 10)
            ]
        );
    }
}
