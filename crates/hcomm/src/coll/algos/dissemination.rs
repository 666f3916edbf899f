//! The dissemination barrier: `ceil(log2 n)` rounds of empty messages; in round `k` rank `r`
//! notifies rank `r + 2^k` and waits for rank `r - 2^k` (mod `n`). A rank may send in round
//! `k + 1` only once its round-`k` message has arrived; then after the last round it has
//! heard, directly or through others, from every rank: `ceil(log2 n)` latencies instead of
//! the `n - 1` messages per rank of the direct barrier.
//!
//! Round `k` receives into, and round `k + 1` sends from, the same token region
//! ([`Buf::Token`]): that is how the schedule states the order of the rounds.

use crate::coll::schedule::{Buf, Region, Schedule, ScheduleBuilder};
use crate::coll::{Algorithm, CollKind, CostModel, Shape};
use crate::topology::Topology;

/// See the module docs.
pub(crate) struct Dissemination;

impl Algorithm for Dissemination {
    fn name(&self) -> &'static str {
        "dissemination"
    }

    fn supports(&self, kind: CollKind) -> bool {
        kind == CollKind::Barrier
    }

    fn cost(&self, s: &Shape, topo: &Topology, m: &CostModel) -> Option<f64> {
        let (alpha, _) = m.worst_link(topo);
        let rounds = usize::BITS - s.size.saturating_sub(1).leading_zeros();
        Some(f64::from(rounds) * alpha)
    }

    fn schedule(&self, s: &Shape, rank: usize, _topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        let n = s.size;
        let token = |k: usize| Region::new(Buf::Token, k, 0);
        let (mut d, mut k) = (1, 0);
        while d < n {
            b.send((rank + d) % n, token(k));
            b.recv((rank + n - d) % n, token(k + 1));
            d *= 2;
            k += 1;
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

    #[test]
    fn each_round_waits_for_the_previous_one() {
        let s = Shape::new(CollKind::Barrier, DataType::Uint8, ReduceOp::Sum, 0, 0, 13);
        let sched = Dissemination.schedule(&s, 5, &testing::topology(13, 1));
        // Steps alternate send, receive; every send after the first waits for the receive
        // of the round before.
        for i in (2..sched.steps.len()).step_by(2) {
            assert_eq!(sched.deps(i), &[i as u32 - 1], "step {i}");
        }
        assert_eq!(sched.deps(0), &[] as &[u32]);
    }
}
