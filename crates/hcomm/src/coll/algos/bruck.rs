//! Bruck's algorithms: all-gather and all-to-all in `ceil(log2 n)` rounds for any `n`, the
//! latency algorithms for small blocks.
//!
//! - All-gather: in round `k` (distance `d = 2^k`) every rank sends the `min(d, n - d)` blocks
//!   it has, starting at its own, to rank `r - d` and receives as many from rank `r + d`.
//!   Blocks keep their final place in the receive buffer throughout: a run of blocks that
//!   wraps past the last rank travels as two messages, so no rotation is needed at the end.
//! - All-to-all: index blocks by distance, `i = dest - r (mod n)`. In round `k` every block
//!   whose index has bit `k` set moves `2^k` ranks on (packed into one message), so after the
//!   last round each block has travelled exactly its distance. Received blocks stay where
//!   they landed in scratch and are copied to their place once at the end; about
//!   `n / 2 * log2 n` blocks pass through scratch.

use crate::coll::schedule::{Buf, Region, Schedule, ScheduleBuilder};
use crate::coll::{Algorithm, CollKind, CostModel, Shape};
use crate::topology::Topology;

use super::tree::ceil_log2;

/// See the module docs.
pub(crate) struct Bruck;

impl Algorithm for Bruck {
    fn name(&self) -> &'static str {
        "bruck"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(kind, CollKind::AllGather | CollKind::AllToAll)
    }

    fn cost(&self, s: &Shape, topo: &Topology, m: &CostModel) -> Option<f64> {
        let (alpha, beta) = m.worst_link(topo);
        let n = s.size as f64;
        let rounds = ceil_log2(s.size) as f64;
        let block = (s.count * s.elem()) as f64;
        match s.kind {
            CollKind::AllGather => Some(rounds * alpha + (n - 1.0) * block * beta),
            // Half the blocks move every round; packing and the final placement are local
            // passes over memory, charged like reductions.
            CollKind::AllToAll => {
                let moved = rounds * (n / 2.0).ceil() * block;
                Some(rounds * alpha + moved * beta + (moved + n * block) * m.gamma)
            }
            _ => None,
        }
    }

    fn schedule(&self, s: &Shape, rank: usize, _topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        match s.kind {
            CollKind::AllGather => allgather(&mut b, s, rank),
            CollKind::AllToAll => alltoall(&mut b, s, rank),
            _ => {}
        }
        b.build()
    }
}

/// Blocks `from..from + len` (mod `n`) as one or two runs that do not wrap: (first, len).
fn runs(from: usize, len: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
    let first = (n - from).min(len);
    [(from, first), (0, len - first)]
        .into_iter()
        .filter(|&(_, l)| l > 0)
}

fn allgather(b: &mut ScheduleBuilder, s: &Shape, rank: usize) {
    let n = s.size;
    let block = s.count * s.elem();
    let at = |r: usize, len: usize| Region::new(Buf::Recv, r * block, len * block);
    b.copy(at(rank, 1), s.input(rank, 0, block));
    let mut d = 1;
    while d < n {
        let cnt = d.min(n - d);
        let (to, from) = ((rank + n - d) % n, (rank + d) % n);
        // The receive is independent of this round's send (disjoint blocks): post it first.
        // Sender and receiver split the same run of blocks at the same place.
        for (r, len) in runs(from, cnt, n) {
            b.recv(from, at(r, len));
        }
        for (r, len) in runs(rank, cnt, n) {
            b.send(to, at(r, len));
        }
        d *= 2;
    }
}

fn alltoall(b: &mut ScheduleBuilder, s: &Shape, rank: usize) {
    let n = s.size;
    let block = s.count * s.elem();
    // Where the block at distance i (destined for rank + i, then travelling) is now.
    let mut loc: Vec<Region> = (0..n)
        .map(|i| s.input(rank, (rank + i) % n * block, block))
        .collect();
    // Indices moving in each round (distance 1, 2, 4, ...).
    let rounds: Vec<(usize, Vec<usize>)> = std::iter::successors(Some(1usize), |d| Some(d * 2))
        .take_while(|&d| d < n)
        .map(|d| (d, (1..n).filter(|i| i & d != 0).collect()))
        .collect();
    // Scratch: one packing area for the largest round, then every round's landing area.
    let mut free = rounds.iter().map(|(_, m)| m.len()).max().unwrap_or(0) * block;
    for (d, moving) in rounds {
        let len = moving.len() * block;
        let landing = Region::new(Buf::Scratch, free, len);
        free += len;
        b.recv((rank + n - d) % n, landing);
        for (j, &i) in moving.iter().enumerate() {
            b.copy(Region::new(Buf::Scratch, j * block, block), loc[i]);
        }
        b.send((rank + d) % n, Region::new(Buf::Scratch, 0, len));
        for (j, &i) in moving.iter().enumerate() {
            loc[i] = Region::new(Buf::Scratch, landing.off + j * block, block);
        }
    }
    // The block at distance i came from rank - i.
    for (i, src) in loc.into_iter().enumerate() {
        b.copy(
            Region::new(Buf::Recv, (rank + n - i) % n * block, block),
            src,
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
        testing::sweep(&Bruck);
    }

    #[test]
    fn large_communicators() {
        for kind in [CollKind::AllGather, CollKind::AllToAll] {
            for (n, count) in [(31, 0), (31, 3), (64, 2), (33, 1), (17, 5)] {
                for in_place in [false, true] {
                    let r = testing::check(
                        &Bruck,
                        kind,
                        n,
                        count,
                        0,
                        DataType::Float64,
                        ReduceOp::Sum,
                        in_place,
                        2,
                        n as u64,
                    );
                    if let Err(e) = r {
                        panic!("{e}");
                    }
                }
            }
        }
    }
}
