//! Pairwise exchange for all-to-all and all-to-all-v: `n - 1` rounds; in round `k` rank `r`
//! sends its block for rank `r + k` and receives the block of rank `r - k` (mod `n`).
//!
//! Unlike the direct algorithm, which starts all `2 (n - 1)` transfers at once, only
//! `WINDOW` rounds are in flight: every rank sends to one peer and receives from one other
//! at a time, so no rank is flooded by all of its peers at once (incast) and large blocks
//! stream at link speed.
//!
//! In place, the block received from `r - k` lands over the block this rank sends to that
//! rank in round `n - k`: unless that round came earlier, the received block waits in
//! scratch until then (about half the blocks); otherwise it lands directly.

use crate::coll::schedule::{Buf, Region, Schedule, ScheduleBuilder};
use crate::coll::{Algorithm, CollKind, CostModel, Shape};
use crate::topology::Topology;

/// Rounds in flight at once.
const WINDOW: usize = 4;

/// See the module docs.
pub(crate) struct Pairwise;

impl Algorithm for Pairwise {
    fn name(&self) -> &'static str {
        "pairwise"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(kind, CollKind::AllToAll | CollKind::AllToAllV)
    }

    fn cost(&self, s: &Shape, topo: &Topology, m: &CostModel) -> Option<f64> {
        if !self.supports(s.kind) {
            return None;
        }
        let (alpha, beta) = m.worst_link(topo);
        // Bytes each rank sends. Not from a v-layout: every rank has its own counts, and all
        // of them must come to the same choice (`count` is the same everywhere).
        let bytes = ((s.size - 1) * s.count * s.elem()) as f64;
        // Latencies overlap within the window; the bytes all cross this rank's link.
        let waves = (s.size - 1).div_ceil(WINDOW) as f64;
        Some(waves * alpha + bytes * beta)
    }

    fn schedule(&self, s: &Shape, rank: usize, _topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        let n = s.size;
        let e = s.elem();
        // (offset, length) in bytes of each peer's block, to send and to receive.
        let bytes = |displs: &[usize], counts: &[usize]| -> Vec<(usize, usize)> {
            displs
                .iter()
                .zip(counts)
                .map(|(d, c)| (d * e, c * e))
                .collect()
        };
        let (send, recv) = match &s.v {
            Some(v) => (
                bytes(&v.send_displs, &v.send_counts),
                bytes(&v.recv_displs, &v.recv_counts),
            ),
            None => {
                let blocks: Vec<(usize, usize)> =
                    (0..n).map(|p| (p * s.count * e, s.count * e)).collect();
                (blocks.clone(), blocks)
            }
        };
        let in_place = s.in_place_at(rank);
        // Uniform blocks in place keep what they can in the buffer; a v-layout in place may
        // overlap arbitrarily, so its input is saved whole first.
        let staged = in_place && s.v.is_some();
        let input = |(off, len): (usize, usize)| {
            if staged {
                Region::new(Buf::Scratch, off, len)
            } else {
                s.input(rank, off, len)
            }
        };
        let mut scratch = 0;
        if staged {
            let len = s.recv_bytes(rank);
            b.copy(
                Region::new(Buf::Scratch, 0, len),
                Region::new(Buf::Recv, 0, len),
            );
            scratch = len;
        }
        let place = |p: usize| Region::new(Buf::Recv, recv[p].0, recv[p].1);
        b.copy(place(rank), input(send[rank]));
        // Where round k's block lands: its place, or (in place, when this rank still has to
        // send the block there in this round or a later one) a scratch slot. Landing in
        // place in the same round would make the receive wait for the send, and a large
        // send completes only once the peer's receive is posted: both would wait.
        let parked = |k: usize| in_place && !staged && k <= n - k;
        let landing: Vec<Region> = (0..n)
            .map(|k| {
                let q = (rank + n - k) % n;
                if k > 0 && parked(k) {
                    let r = Region::new(Buf::Scratch, scratch, recv[q].1);
                    scratch += recv[q].1;
                    r
                } else {
                    place(q)
                }
            })
            .collect();
        // One scratch byte per round that waits: see `fence`.
        let tokens = scratch;
        for k in 1..n {
            let (p, q) = ((rank + k) % n, (rank + n - k) % n);
            if k > WINDOW {
                fence(&mut b, landing[k - WINDOW], tokens + k);
            }
            b.send(p, input(send[p]));
            b.recv(q, landing[k]);
            // Round k sent the block whose place round n - k's parked block takes.
            if parked(n - k) {
                b.copy(place(p), landing[n - k]);
            }
        }
        b.build()
    }
}

/// Holds back the steps after it until the receive into `landed` has finished.
///
/// Steps are issued in program order and one whose inputs are not ready blocks the rest, so
/// a copy of one byte of the received block (to a scratch byte nobody reads) keeps the
/// later rounds from starting: at most `WINDOW` rounds are in flight. An empty block gives
/// nothing to wait for; its round then overlaps one more.
fn fence(b: &mut ScheduleBuilder, landed: Region, token: usize) {
    if landed.len > 0 {
        b.copy(
            Region::new(Buf::Scratch, token, 1),
            Region::new(landed.buf, landed.off, 1),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;
    use crate::dtype::{DataType, ReduceOp};

    #[test]
    fn sweep() {
        testing::sweep(&Pairwise);
    }

    #[test]
    fn large_communicators() {
        for kind in [CollKind::AllToAll, CollKind::AllToAllV] {
            for (n, count) in [(31, 0), (31, 3), (64, 2), (33, 1), (17, 5)] {
                for in_place in [false, true] {
                    let in_place = in_place && testing::has_in_place(kind);
                    let r = testing::check(
                        &Pairwise,
                        kind,
                        n,
                        count,
                        0,
                        DataType::Uint32,
                        ReduceOp::Sum,
                        in_place,
                        3,
                        n as u64,
                    );
                    if let Err(e) = r {
                        panic!("{e}");
                    }
                }
            }
        }
    }

    #[test]
    fn at_most_a_window_of_rounds_is_in_flight() {
        use crate::coll::schedule::Step;
        let s = Shape::new(CollKind::AllToAll, DataType::Int32, ReduceOp::Sum, 4, 0, 16);
        let sched = Pairwise.schedule(&s, 3, &testing::topology(16, 1));
        let at = |f: &dyn Fn(&Step) -> bool| {
            (0..sched.steps.len())
                .filter(|&i| f(&sched.steps[i]))
                .collect::<Vec<_>>()
        };
        let recvs = at(&|s| matches!(s, Step::Recv { .. }));
        let fences = at(&|s| matches!(s, Step::Copy { dst, .. } if dst.len == 1));
        assert_eq!(fences.len(), 15 - WINDOW);
        // Round WINDOW + 1 starts once round 1's block is in.
        assert_eq!(sched.deps(fences[0]), &[recvs[0] as u32]);
        assert!(fences[0] < recvs[WINDOW]);
    }
}
