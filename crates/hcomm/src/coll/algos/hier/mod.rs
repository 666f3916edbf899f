//! Hierarchical collectives for communicators spanning hosts: the ranks of each host work
//! through one head rank, and only the heads talk across hosts.
//!
//! A host's head is its lowest rank, except that the root's host is headed by the root. With
//! `L` ranks per host and `H` hosts:
//!
//! - all-reduce: binomial reduce to the head on every host, all-reduce among the heads over
//!   a double binary tree, binomial broadcast from the head; all three pipelined chunk by
//!   chunk (`tree::run_stages`), so the stages overlap.
//! - reduce: binomial reduce to the heads, then a double-binary-tree reduce among the heads
//!   to the root.
//! - broadcast: double-binary-tree broadcast among the heads from the root, then binomial
//!   broadcast on every host.
//! - all-gather: the head of each host collects its ranks' blocks, heads exchange their
//!   hosts' blocks directly (packed into one message when a host's ranks are not
//!   contiguous), then each head broadcasts the whole result on its host.
//!
//! Across hosts every head sends about the buffer per direction, once per host rather than
//! once per rank. On one host the schedules degenerate to the intra-host stages.
//!
//! The blocking all-reduce of ranks on several hosts sharing some, with shared memory inside
//! them, runs through sub-communicators instead ([`tiered`]).

pub(crate) mod tiered;

use crate::coll::schedule::{Buf, Region, Schedule, ScheduleBuilder};
use crate::coll::{Algorithm, CollKind, CostModel, Shape};
use crate::topology::Topology;

use super::tree::{
    binomial, ceil_log2, chunking, chunks, double_binary, double_binary_height, run_stages,
    updown_lag, Flow, Loc, Piece, Stage,
};

/// See the module docs.
pub(crate) struct Hierarchical;

/// The hosts of a communicator as this algorithm uses them.
struct Layout {
    /// Ranks of each host, in rank order.
    hosts: Vec<Vec<usize>>,
    /// Host of each rank.
    host_of: Vec<usize>,
    /// Head of each host.
    heads: Vec<usize>,
}

impl Layout {
    /// Hosts from `topo`, with the root heading its host. A topology that does not describe
    /// this communicator (it always should) is treated as a single host.
    fn new(topo: &Topology, n: usize, root: usize) -> Layout {
        let host_of: Vec<usize> = if topo.size() == n {
            (0..n).map(|r| topo.host_of(r)).collect()
        } else {
            vec![0; n]
        };
        let mut hosts: Vec<Vec<usize>> =
            vec![Vec::new(); host_of.iter().max().map_or(0, |h| h + 1)];
        for (r, &h) in host_of.iter().enumerate() {
            hosts[h].push(r);
        }
        hosts.retain(|h| !h.is_empty());
        let host_of = {
            let mut out = vec![0; n];
            for (h, ranks) in hosts.iter().enumerate() {
                ranks.iter().for_each(|&r| out[r] = h);
            }
            out
        };
        let heads = hosts
            .iter()
            .map(|ranks| {
                if ranks.contains(&root) {
                    root
                } else {
                    ranks[0]
                }
            })
            .collect();
        Layout {
            hosts,
            host_of,
            heads,
        }
    }

    /// This rank's host's ranks and the positions of the head and of `rank` among them.
    fn local(&self, rank: usize) -> (&[usize], usize, usize) {
        let h = self.host_of[rank];
        let ranks = &self.hosts[h];
        let pos = |r: usize| ranks.iter().position(|&x| x == r).unwrap_or(0);
        (ranks, pos(self.heads[h]), pos(rank))
    }

    /// Rounds of the deepest host tree: by then a chunk is reduced (or broadcast) on every
    /// host.
    fn local_height(&self) -> usize {
        self.hosts
            .iter()
            .map(|h| ceil_log2(h.len()))
            .max()
            .unwrap_or(0)
    }
}

impl Algorithm for Hierarchical {
    fn name(&self) -> &'static str {
        "hier"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce | CollKind::AllGather
        )
    }

    fn cost(&self, s: &Shape, topo: &Topology, m: &CostModel) -> Option<f64> {
        if !self.supports(s.kind) || topo.num_hosts() <= 1 || topo.size() != s.size {
            return None;
        }
        let layout = Layout::new(topo, s.size, s.root);
        let hl = layout.local_height() as f64;
        let hosts = layout.hosts.len();
        let h2 = double_binary_height(hosts) as f64;
        let (ai, bi, ae, be, g) = (
            m.alpha_intra,
            m.beta_intra,
            m.alpha_inter,
            m.beta_inter,
            m.gamma,
        );
        if s.kind == CollKind::AllGather {
            let block = (s.count * s.elem()) as f64;
            let (n, most) = (
                s.size as f64,
                layout.hosts.iter().map(Vec::len).max().unwrap_or(1) as f64,
            );
            let (c, ch) = chunking(s.count * s.size, s.elem(), hl as usize);
            // Gather to the head, then the heads' exchange (a head sends its host's blocks to
            // every other head and receives the rest), then the host broadcast of everything.
            let gather = ai + (most - 1.0) * block * bi;
            let exchange = ae + ((hosts as f64 - 1.0) * most).max(n - most) * block * be;
            return Some(gather + exchange + c * hl * (ai + ch * bi));
        }
        let hops = 2 * (layout.local_height() + double_binary_height(hosts));
        let (c, ch) = chunking(s.count, s.elem(), hops);
        let rest = (c - 1.0).max(0.0);
        // Each stage fills once; then the slowest stage sets the pace per chunk. A head
        // handles one chunk message per child of its host tree per direction.
        let local_up = hl * (ai + ch * (bi + g));
        let local_down = hl * (ai + ch * bi);
        let inter = |k: f64, gg: f64| {
            (
                h2 * k * (ae + ch / 2.0 * (be + gg)),
                k * 2.0 * ae + ch * (k * be + gg),
            )
        };
        Some(match s.kind {
            CollKind::AllReduce => {
                let (fill, pace) = inter(2.0, g);
                local_up + fill + local_down + rest * pace.max(local_up).max(local_down)
            }
            CollKind::Reduce => {
                let (fill, pace) = inter(1.0, g);
                local_up + fill + rest * pace.max(local_up)
            }
            _ => {
                let (fill, pace) = inter(1.0, 0.0);
                fill + local_down + rest * pace.max(local_down)
            }
        })
    }

    fn schedule(&self, s: &Shape, rank: usize, topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        let root = if s.kind.rooted() { s.root } else { 0 };
        let layout = Layout::new(topo, s.size, root);
        match s.kind {
            CollKind::AllGather => allgather(&mut b, s, rank, &layout),
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => {
                trees(&mut b, s, rank, &layout)
            }
            _ => {}
        }
        b.build()
    }
}

/// All-reduce, reduce and broadcast: host trees and the heads' double binary tree, as
/// stages of one pipeline.
fn trees(b: &mut ScheduleBuilder, s: &Shape, rank: usize, layout: &Layout) {
    let e = s.elem();
    let (local, head, me) = layout.local(rank);
    let host = binomial(local, head, me);
    let is_head = local[head] == rank;
    let hosts = layout.hosts.len();
    let my_host = layout.host_of[rank];
    let root_host = layout.host_of[if s.kind.rooted() { s.root } else { 0 }];
    let recv = Loc::of(s.output(rank, 0, 0));
    let input = Loc::of(s.input(rank, 0, 0));
    // Reduce accumulates in scratch except at the root (others have no receive buffer).
    let (acc, base) = if s.kind == CollKind::Reduce && rank != s.root {
        (
            Loc {
                buf: Buf::Scratch,
                off: 0,
            },
            s.count * e,
        )
    } else {
        (recv, 0)
    };
    // The heads reduce a chunk once their hosts have (and never in the iteration their
    // host stage produces it, since leaves send first in an iteration).
    let up = layout.local_height() + 1;
    let heads_tree = |flow: Flow, lag: &dyn Fn(usize) -> usize| -> Vec<Stage> {
        if !is_head || hosts == 1 {
            return Vec::new();
        }
        double_binary(&layout.heads, root_host, my_host)
            .into_iter()
            .zip([Piece::First, Piece::Second])
            .map(|(node, piece)| Stage {
                // A head's input is its host's result: no sending ahead of it.
                lead: 0,
                ..Stage::new(node, flow, piece, acc, acc, up, lag)
            })
            .collect()
    };
    let mut stages = Vec::new();
    match s.kind {
        CollKind::AllReduce => {
            stages.push(Stage::new(
                host.clone(),
                Flow::Up,
                Piece::Whole,
                input,
                acc,
                0,
                |_| 0,
            ));
            stages.extend(heads_tree(Flow::UpDown, &|d| updown_lag(up, d)));
            // Hosts broadcast after the heads' last down lag.
            let start = updown_lag(up, double_binary_height(hosts)) + 1;
            stages.push(Stage::new(
                host,
                Flow::Down,
                Piece::Whole,
                acc,
                acc,
                0,
                |d| start + d,
            ));
        }
        CollKind::Reduce => {
            stages.push(Stage::new(
                host,
                Flow::Up,
                Piece::Whole,
                input,
                acc,
                0,
                |_| 0,
            ));
            stages.extend(heads_tree(Flow::Up, &|_| 0));
        }
        _ => {
            stages.extend(heads_tree(Flow::Down, &|_| 0));
            stages.push(Stage::new(
                host,
                Flow::Down,
                Piece::Whole,
                acc,
                acc,
                0,
                |_| 0,
            ));
        }
    }
    let hops = 2 * (layout.local_height() + double_binary_height(hosts));
    run_stages(b, &stages, &chunks(s.count, e, hops), e, base);
}

/// All-gather: gather to the heads, exchange among heads, broadcast on each host.
fn allgather(b: &mut ScheduleBuilder, s: &Shape, rank: usize, layout: &Layout) {
    let e = s.elem();
    let block = s.count * e;
    let (local, head, me) = layout.local(rank);
    let at = |r: usize| Region::new(Buf::Recv, r * block, block);
    if me != head {
        b.send(local[head], s.input(rank, 0, block));
    } else {
        b.copy(at(rank), s.input(rank, 0, block));
        for &r in local.iter().filter(|&&r| r != rank) {
            b.recv(r, at(r));
        }
        exchange(b, rank, layout, block);
    }
    // The whole result goes down the host tree, chunked like any broadcast.
    let n = s.size;
    let host = binomial(local, head, me);
    let hops = ceil_log2(local.len());
    let recv = Loc::of(s.output(rank, 0, 0));
    let stage = Stage::new(host, Flow::Down, Piece::Whole, recv, recv, 0, |_| 0);
    run_stages(b, &[stage], &chunks(s.count * n, e, hops), e, 0);
}

/// The heads' exchange of their hosts' blocks: one message per pair of heads. A host whose
/// ranks are contiguous sends and receives its blocks in place; otherwise they are packed
/// in scratch.
fn exchange(b: &mut ScheduleBuilder, rank: usize, layout: &Layout, block: usize) {
    let hosts = layout.hosts.len();
    let me = layout.host_of[rank];
    let contiguous = |h: usize| layout.hosts[h].windows(2).all(|w| w[1] == w[0] + 1);
    let whole = |h: usize| {
        Region::new(
            Buf::Recv,
            layout.hosts[h][0] * block,
            layout.hosts[h].len() * block,
        )
    };
    let mut scratch = 0;
    let mut area = |h: usize| {
        let r = Region::new(Buf::Scratch, scratch, layout.hosts[h].len() * block);
        scratch += r.len;
        r
    };
    let mine = if contiguous(me) {
        whole(me)
    } else {
        let packed = area(me);
        for (i, &r) in layout.hosts[me].iter().enumerate() {
            b.copy(
                Region::new(Buf::Scratch, packed.off + i * block, block),
                Region::new(Buf::Recv, r * block, block),
            );
        }
        packed
    };
    let mut unpack = Vec::new();
    for k in 1..hosts {
        let from = (me + hosts - k) % hosts;
        if contiguous(from) {
            b.recv(layout.heads[from], whole(from));
        } else {
            let landing = area(from);
            b.recv(layout.heads[from], landing);
            unpack.push((from, landing));
        }
    }
    for k in 1..hosts {
        b.send(layout.heads[(me + k) % hosts], mine);
    }
    for (h, landing) in unpack {
        for (i, &r) in layout.hosts[h].iter().enumerate() {
            b.copy(
                Region::new(Buf::Recv, r * block, block),
                Region::new(Buf::Scratch, landing.off + i * block, block),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;
    use crate::dtype::{DataType, ReduceOp};

    #[test]
    fn sweep() {
        testing::sweep(&Hierarchical);
    }

    #[test]
    fn more_hosts_and_large_buffers() {
        // Uneven hosts (3, 4 and 5 hosts of round-robin ranks), large communicators, and
        // buffers long enough to pipeline in many chunks.
        let cases = [
            (1, 5),
            (4, 3),
            (7, 9),
            (12, 1),
            (13, 0),
            (31, 33),
            (64, 7),
            (9, 100_001),
        ];
        for kind in [
            CollKind::AllReduce,
            CollKind::Broadcast,
            CollKind::Reduce,
            CollKind::AllGather,
        ] {
            for hosts in [1, 2, 3, 4, 5] {
                for (n, count) in cases {
                    let long = count > 1000;
                    if long && hosts % 2 == 0 {
                        continue;
                    }
                    let count = if kind == CollKind::AllGather {
                        count / 10
                    } else {
                        count
                    };
                    let roots = if long {
                        vec![n - 1]
                    } else {
                        vec![0, n / 2, n - 1]
                    };
                    for root in roots {
                        for in_place in [false, true] {
                            let in_place = in_place && testing::has_in_place(kind);
                            let seed = (n * 100 + hosts) as u64;
                            let r = testing::check(
                                &Hierarchical,
                                kind,
                                n,
                                count,
                                root,
                                DataType::Int64,
                                ReduceOp::Sum,
                                in_place,
                                hosts,
                                seed,
                            );
                            if let Err(e) = r {
                                panic!("{e}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn only_multi_host_communicators() {
        let s = Shape::new(
            CollKind::AllReduce,
            DataType::Float32,
            ReduceOp::Sum,
            1 << 20,
            0,
            8,
        );
        assert!(Hierarchical
            .cost(&s, &testing::topology(8, 1), &CostModel::TCP)
            .is_none());
        assert!(Hierarchical
            .cost(&s, &testing::topology(8, 2), &CostModel::TCP)
            .is_some());
    }
}
