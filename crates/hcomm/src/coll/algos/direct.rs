//! Direct algorithms: every rank talks to every peer it needs in one step.
//!
//! Reductions are done per segment in rank order (rank 0's contribution, then rank 1's, ...)
//! by the segment's owner, so the result is bitwise the same whatever the timing: this is the
//! algorithm of deterministic mode (`HCOMM_DETERMINISTIC=1`). Traffic per rank is the same as
//! a ring's ((n-1)/n of the buffer each way for reduce-scatter), in n-1 concurrent messages.

use super::segments;
use crate::coll::schedule::{Buf, Region, Schedule, ScheduleBuilder};
use crate::coll::{Algorithm, CollKind, CostModel, Shape};
use crate::topology::Topology;

/// See the module docs.
pub(crate) struct Direct;

impl Algorithm for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn supports(&self, _kind: CollKind) -> bool {
        true
    }

    fn cost(&self, s: &Shape, topo: &Topology, m: &CostModel) -> Option<f64> {
        let (alpha, beta) = m.worst_link(topo);
        let n = s.size as f64;
        let bytes = (s.count * s.elem()) as f64;
        // n-1 messages at once: their latencies overlap but their bytes share the link.
        let per_rank = match s.kind {
            CollKind::AllReduce => {
                2.0 * (n - 1.0) / n * bytes + (n - 1.0) / n * bytes * m.gamma / beta
            }
            CollKind::ReduceScatter => (n - 1.0) * bytes + (n - 1.0) * bytes * m.gamma / beta,
            CollKind::Reduce => (n - 1.0) / n * bytes * 2.0,
            CollKind::Broadcast => (n - 1.0) * bytes,
            CollKind::AllGather | CollKind::Gather | CollKind::Scatter | CollKind::AllToAll => {
                (n - 1.0) * bytes
            }
            CollKind::AllGatherV | CollKind::AllToAllV | CollKind::Barrier => (n - 1.0) * bytes,
        };
        let rounds = if s.kind == CollKind::AllReduce {
            2.0
        } else {
            1.0
        };
        Some(rounds * alpha + (n - 1.0) * alpha * 0.1 + per_rank * beta)
    }

    fn schedule(&self, s: &Shape, rank: usize, _topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        let (n, e) = (s.size, s.elem());
        let block = s.count * e;
        let others = |r: usize| (1..n).map(move |d| (r + d) % n);
        match s.kind {
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce => {
                // Segment owners: reduce-scatter blocks; for all-reduce and reduce the buffer
                // is cut into n nearly equal segments.
                let segs = if s.kind == CollKind::ReduceScatter {
                    (0..n).map(|p| (p * block, block)).collect::<Vec<_>>()
                } else {
                    segments(s.count, n, e)
                };
                reduce_segments_in_order(&mut b, s, rank, &segs);
                match s.kind {
                    CollKind::AllReduce => {
                        for p in others(rank) {
                            let (o, l) = segs[rank];
                            b.send(p, s.output(rank, o, l));
                        }
                        for p in others(rank) {
                            let (o, l) = segs[p];
                            b.recv(p, s.output(rank, o, l));
                        }
                    }
                    CollKind::Reduce => {
                        let (o, l) = segs[rank];
                        if rank == s.root {
                            for p in others(rank) {
                                let (o, l) = segs[p];
                                b.recv(p, Region::new(Buf::Recv, o, l));
                            }
                        } else {
                            b.send(s.root, Region::new(Buf::Scratch, o, l));
                        }
                    }
                    _ => {}
                }
            }
            CollKind::Broadcast => {
                if rank == s.root {
                    for p in others(rank) {
                        b.send(p, Region::new(Buf::Recv, 0, block));
                    }
                } else {
                    b.recv(s.root, Region::new(Buf::Recv, 0, block));
                }
            }
            CollKind::AllGather | CollKind::AllGatherV => {
                let part = |p: usize| match &s.v {
                    Some(v) => (v.recv_displs[p] * e, v.recv_counts[p] * e),
                    None => (p * block, block),
                };
                let (o, l) = part(rank);
                b.copy(Region::new(Buf::Recv, o, l), s.input(rank, 0, l));
                for p in others(rank) {
                    b.send(p, s.input(rank, 0, l));
                }
                for p in others(rank) {
                    let (o, l) = part(p);
                    b.recv(p, Region::new(Buf::Recv, o, l));
                }
            }
            CollKind::Gather => {
                if rank == s.root {
                    b.copy(
                        Region::new(Buf::Recv, rank * block, block),
                        s.input(rank, 0, block),
                    );
                    for p in others(rank) {
                        b.recv(p, Region::new(Buf::Recv, p * block, block));
                    }
                } else {
                    b.send(s.root, s.input(rank, 0, block));
                }
            }
            CollKind::Scatter => {
                if rank == s.root {
                    let src = if s.in_place { Buf::Recv } else { Buf::Send };
                    for p in others(rank) {
                        b.send(p, Region::new(src, p * block, block));
                    }
                    if !s.in_place {
                        b.copy(
                            Region::new(Buf::Recv, 0, block),
                            Region::new(Buf::Send, rank * block, block),
                        );
                    }
                } else {
                    b.recv(s.root, Region::new(Buf::Recv, 0, block));
                }
            }
            CollKind::AllToAll | CollKind::AllToAllV => {
                let (sc, sd, rc, rd) = match &s.v {
                    Some(v) => (
                        v.send_counts.iter().map(|c| c * e).collect::<Vec<_>>(),
                        v.send_displs.iter().map(|d| d * e).collect::<Vec<_>>(),
                        v.recv_counts.iter().map(|c| c * e).collect::<Vec<_>>(),
                        v.recv_displs.iter().map(|d| d * e).collect::<Vec<_>>(),
                    ),
                    None => {
                        let offs: Vec<usize> = (0..n).map(|p| p * block).collect();
                        (vec![block; n], offs.clone(), vec![block; n], offs)
                    }
                };
                // In place, the input must be saved before blocks arrive over it.
                let input = |o: usize, l: usize| {
                    if s.in_place {
                        Region::new(Buf::Scratch, o, l)
                    } else {
                        Region::new(Buf::Send, o, l)
                    }
                };
                if s.in_place {
                    let len = s.recv_bytes(rank);
                    b.copy(
                        Region::new(Buf::Scratch, 0, len),
                        Region::new(Buf::Recv, 0, len),
                    );
                }
                for p in others(rank) {
                    b.send(p, input(sd[p], sc[p]));
                }
                b.copy(
                    Region::new(Buf::Recv, rd[rank], rc[rank]),
                    input(sd[rank], sc[rank]),
                );
                for p in others(rank) {
                    b.recv(p, Region::new(Buf::Recv, rd[p], rc[p]));
                }
            }
            CollKind::Barrier => {
                for p in others(rank) {
                    b.send(p, Region::new(Buf::Send, 0, 0));
                }
                for p in others(rank) {
                    b.recv(p, Region::new(Buf::Scratch, 0, 0));
                }
            }
        }
        b.build()
    }
}

/// Each rank reduces its own segment of every rank's input, in rank order, into the output
/// (all-reduce, reduce-scatter) or scratch (reduce, then sent to the root).
fn reduce_segments_in_order(
    b: &mut ScheduleBuilder,
    s: &Shape,
    rank: usize,
    segs: &[(usize, usize)],
) {
    let n = s.size;
    let (mine_off, mine_len) = segs[rank];
    // Where the reduced segment accumulates, and where peers' contributions land.
    let acc = match s.kind {
        CollKind::Reduce if rank != s.root => Region::new(Buf::Scratch, mine_off, mine_len),
        CollKind::Reduce => Region::new(Buf::Recv, mine_off, mine_len),
        CollKind::ReduceScatter => s.output(rank, 0, mine_len),
        _ => s.output(rank, mine_off, mine_len),
    };
    // Scratch: accumulators of a non-root reduce first, then one landing slot per rank.
    let staging = segs.iter().map(|(o, l)| o + l).max().unwrap_or(0);
    let landing = |p: usize| Region::new(Buf::Scratch, staging + p * mine_len, mine_len);
    // In place, the accumulator may cover this rank's own input: keep a copy.
    let own = if s.in_place {
        b.copy(landing(rank), s.input(rank, mine_off, mine_len));
        landing(rank)
    } else {
        s.input(rank, mine_off, mine_len)
    };
    for d in 1..n {
        let p = (rank + d) % n;
        let (o, l) = segs[p];
        b.send(p, s.input(rank, o, l));
    }
    for d in 1..n {
        let p = (rank + n - d) % n;
        b.recv(p, landing(p));
    }
    for p in 0..n {
        let src = if p == rank { own } else { landing(p) };
        if p == 0 {
            b.copy(acc, src);
        } else {
            b.reduce(acc, src);
        }
    }
}
