//! Ring algorithms: the bandwidth algorithms for large buffers.
//!
//! The ranks form a ring (ranks of one host next to each other, so that only the links at host
//! boundaries cross hosts). Every step each rank sends one segment to the next rank and
//! receives one from the previous, so every link carries the same load and no rank moves more
//! than `(n - 1) / n` of the buffer per phase:
//!
//! - reduce-scatter: `n - 1` steps; at step `s` the rank at position `j` passes its partial
//!   sum of segment `j - s - 1` on and adds its input to segment `j - s - 2`, which it then
//!   passes on at step `s + 1`. After the last step position `j` holds segment `j` reduced.
//! - all-gather: `n - 1` steps passing finished segments along.
//! - all-reduce: reduce-scatter then all-gather; reduce: reduce-scatter, then every rank sends
//!   its finished segment to the root.
//! - broadcast: a pipelined chain from the root along the ring.
//!
//! Segments are cut into chunks of at most [`CHUNK_BYTES`], and each chunk's receive and send
//! are issued before the previous chunk is reduced (`emit_pipelined`), so reductions overlap
//! transfers and a segment starts moving on before all of it has arrived.

use super::segments;
use crate::coll::schedule::{Buf, Region, Schedule, ScheduleBuilder, Step};
use crate::coll::{Algorithm, CollKind, CostModel, Shape};
use crate::topology::Topology;

/// Largest message the pipelined algorithms send: small enough that the reduction of one
/// chunk overlaps the transfer of the next, large enough that per-message overhead stays a
/// few percent of the transfer time.
pub(crate) const CHUNK_BYTES: usize = 256 * 1024;

/// See the module docs.
pub(crate) struct Ring;

impl Algorithm for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllReduce
                | CollKind::ReduceScatter
                | CollKind::AllGather
                | CollKind::AllGatherV
                | CollKind::Reduce
                | CollKind::Broadcast
        )
    }

    fn cost(&self, s: &Shape, topo: &Topology, m: &CostModel) -> Option<f64> {
        if !self.supports(s.kind) {
            return None;
        }
        let (alpha, beta) = m.worst_link(topo);
        let n = s.size as f64;
        let steps = n - 1.0;
        let e = s.elem();
        let bytes = (s.count * e) as f64;
        let seg = bytes / n;
        let cost = match s.kind {
            // n - 1 steps of one segment each way per phase; the reduction of each chunk
            // overlaps the transfer of the next.
            CollKind::AllReduce => {
                2.0 * steps * alpha + steps * pipelined(seg, beta, m.gamma) + steps * seg * beta
            }
            CollKind::ReduceScatter => steps * (alpha + pipelined(bytes, beta, m.gamma)),
            CollKind::Reduce => {
                // Reduce-scatter, then the root takes n - 1 segments through its one link.
                (steps + 1.0) * alpha + steps * pipelined(seg, beta, m.gamma) + steps * seg * beta
            }
            CollKind::AllGather => steps * (alpha + bytes * beta),
            CollKind::AllGatherV => {
                // Steps go at the pace of the largest block.
                let largest =
                    s.v.as_ref()
                        .and_then(|v| v.recv_counts.iter().max().copied())
                        .unwrap_or(0);
                steps * (alpha + (largest * e) as f64 * beta)
            }
            CollKind::Broadcast => {
                // A chain of n - 1 links, k chunks deep: the last chunk leaves the root after
                // k - 1 chunk times and then crosses n - 1 links.
                let k = (s.count * e).div_ceil(CHUNK_BYTES).max(1) as f64;
                let chunk = bytes / k;
                (steps + k - 1.0) * (alpha + chunk * beta)
            }
            _ => return None,
        };
        Some(cost)
    }

    fn schedule(&self, s: &Shape, rank: usize, topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        let ring = RingOrder::new(s.size, rank, topo);
        match s.kind {
            CollKind::AllReduce => all_reduce(&mut b, s, rank, &ring),
            CollKind::ReduceScatter => reduce_scatter(&mut b, s, rank, &ring),
            CollKind::Reduce => reduce(&mut b, s, rank, &ring),
            CollKind::AllGather | CollKind::AllGatherV => all_gather(&mut b, s, rank, &ring),
            CollKind::Broadcast => broadcast(&mut b, s, &ring),
            _ => debug_assert!(false, "ring does not implement {}", s.kind.name()),
        }
        b.build()
    }
}

/// Seconds to move `bytes` and reduce them, in chunks whose reduction overlaps the transfer
/// of the next chunk: the slower of the two for all but one chunk, plus the faster for it.
pub(super) fn pipelined(bytes: f64, beta: f64, gamma: f64) -> f64 {
    bytes * beta.max(gamma) + bytes.min(CHUNK_BYTES as f64) * beta.min(gamma)
}

/// The ring: ranks ordered by host, then by rank, so that ranks of a host are neighbours.
/// Every rank derives the same order from the same topology.
struct RingOrder {
    /// Rank at each position.
    order: Vec<usize>,
    /// Position of the calling rank.
    me: usize,
}

impl RingOrder {
    fn new(n: usize, rank: usize, topo: &Topology) -> RingOrder {
        let mut order: Vec<usize> = (0..n).collect();
        if topo.size() == n {
            order.sort_by_key(|&r| (topo.host_of(r), r));
        }
        let me = order.iter().position(|&r| r == rank).unwrap_or(0);
        RingOrder { order, me }
    }

    fn n(&self) -> usize {
        self.order.len()
    }

    /// The position `back` places before this rank's (modulo n).
    fn before(&self, back: usize) -> usize {
        let n = self.n();
        (self.me + n - back % n) % n
    }

    fn next(&self) -> usize {
        self.order[(self.me + 1) % self.n()]
    }

    fn prev(&self) -> usize {
        self.order[self.before(1)]
    }

    /// Position of `rank`.
    fn position(&self, rank: usize) -> usize {
        self.order.iter().position(|&r| r == rank).unwrap_or(0)
    }
}

/// One step of a pipelined schedule: transfers, then the local work (reductions, forwarding
/// sends) that needs them.
#[derive(Debug, Default)]
pub(super) struct Stage {
    /// Receives and sends, issued before the previous stage's local steps where the data allow.
    pub comm: Vec<Step>,
    /// Steps that wait for this stage's transfers.
    pub local: Vec<Step>,
}

/// Appends `stages` to `b` so that transfers overlap local work: the transfers of stage
/// `i + 1` go before the local steps of stage `i` unless they touch the same bytes (program
/// order stays a valid sequential program; the executor issues steps in order, so a receive
/// placed before a reduction is posted while the reduction runs). Transfers keep their order,
/// so sends and receives still match in order between every pair.
pub(super) fn emit_pipelined(b: &mut ScheduleBuilder, stages: &[Stage]) {
    if let Some(first) = stages.first() {
        for &step in &first.comm {
            b.push(step);
        }
    }
    for (i, stage) in stages.iter().enumerate() {
        let mut late: &[Step] = &[];
        if let Some(next) = stages.get(i + 1) {
            let split = next
                .comm
                .iter()
                .position(|c| stage.local.iter().any(|l| conflicts(c, l)))
                .unwrap_or(next.comm.len());
            for &step in &next.comm[..split] {
                b.push(step);
            }
            late = &next.comm[split..];
        }
        for &step in stage.local.iter().chain(late) {
            b.push(step);
        }
    }
}

/// Whether two steps touch a common byte with at least one of them writing it.
fn conflicts(a: &Step, b: &Step) -> bool {
    let hits = |w: Option<Region>, other: &Step| {
        w.is_some_and(|w| {
            other
                .reads()
                .iter()
                .flatten()
                .chain(other.writes().iter())
                .any(|r| r.overlaps(&w))
        })
    };
    hits(a.writes(), b) || hits(b.writes(), a)
}

/// Cuts `len` bytes of `elem`-byte elements into nearly equal chunks of at most about
/// [`CHUNK_BYTES`] on element boundaries: (offset, length) relative to the start. None for
/// an empty range, so empty transfers are left out on both sides alike.
pub(super) fn chunks(len: usize, elem: usize) -> Vec<(usize, usize)> {
    if len == 0 {
        return Vec::new();
    }
    segments(len / elem, len.div_ceil(CHUNK_BYTES), elem)
}

/// Scratch slots for received chunks that are then reduced into data already in place: two,
/// used alternately, so the next chunk can land while the previous one is reduced.
pub(super) struct Landing {
    base: usize,
    slot: usize,
    next: usize,
}

impl Landing {
    /// Slots at scratch offset `base` for chunks of `elem`-byte elements cut from ranges of
    /// at most `largest` bytes (small calls need only small slots).
    pub(super) fn new(base: usize, elem: usize, largest: usize) -> Landing {
        // A chunk rounds up to whole elements, so it may exceed CHUNK_BYTES by one element.
        Landing {
            base,
            slot: largest.min(CHUNK_BYTES + elem),
            next: 0,
        }
    }

    /// The next slot, `len` bytes of it.
    pub(super) fn take(&mut self, len: usize) -> Region {
        debug_assert!(
            len <= self.slot,
            "chunk of {len} bytes exceeds the landing slot"
        );
        let r = Region::new(Buf::Scratch, self.base + self.next * self.slot, len);
        self.next ^= 1;
        r
    }
}

/// Adds to `stage` the receive of one chunk from `peer` and its reduction into `acc`, where
/// this rank's own partial sum of the chunk is `current`: received straight into `acc` and
/// `current` added when they differ (no copy of the input needed), or received into a landing
/// slot and added to `acc` when `acc` already holds it.
pub(super) fn recv_reduce(
    stage: &mut Stage,
    peer: usize,
    acc: Region,
    current: Region,
    landing: &mut Landing,
) {
    if acc == current {
        let slot = landing.take(acc.len);
        stage.comm.push(Step::Recv { peer, dst: slot });
        stage.local.push(Step::Reduce {
            dst: acc,
            src: slot,
        });
    } else {
        stage.comm.push(Step::Recv { peer, dst: acc });
        stage.local.push(Step::Reduce {
            dst: acc,
            src: current,
        });
    }
}

/// Pairs the i-th send chunk with the i-th receive chunk into one stage each.
fn zip_stages(
    stages: &mut Vec<Stage>,
    sends: usize,
    recvs: usize,
    mut each: impl FnMut(&mut Stage, usize),
) {
    for c in 0..sends.max(recvs) {
        let mut stage = Stage::default();
        each(&mut stage, c);
        stages.push(stage);
    }
}

/// The reduce-scatter phase: `seg[j]` is the byte range (in input coordinates) position `j`
/// ends with; `acc(step, range)` is where this rank keeps the partial sum of a segment
/// received at `step`, which it sends on at the next step; landing slots (needed where `acc`
/// is the input itself) start at scratch offset `landing_at`.
fn ring_reduce_scatter(
    stages: &mut Vec<Stage>,
    s: &Shape,
    rank: usize,
    ring: &RingOrder,
    seg: &[(usize, usize)],
    acc: &dyn Fn(usize, usize, usize) -> Region,
    landing_at: usize,
) {
    let n = ring.n();
    let e = s.elem();
    let largest = seg.iter().map(|&(_, l)| l).max().unwrap_or(0);
    let mut landing = Landing::new(landing_at, e, largest);
    for step in 0..n - 1 {
        let (so, sl) = seg[ring.before(step + 1)];
        let (ro, rl) = seg[ring.before(step + 2)];
        let (sc, rc) = (chunks(sl, e), chunks(rl, e));
        zip_stages(stages, sc.len(), rc.len(), |stage, c| {
            if let Some(&(o, l)) = rc.get(c) {
                recv_reduce(
                    stage,
                    ring.prev(),
                    acc(step, ro + o, l),
                    s.input(rank, ro + o, l),
                    &mut landing,
                );
            }
            if let Some(&(o, l)) = sc.get(c) {
                let src = if step == 0 {
                    s.input(rank, so + o, l)
                } else {
                    acc(step - 1, so + o, l)
                };
                stage.comm.push(Step::Send {
                    peer: ring.next(),
                    src,
                });
            }
        });
    }
}

/// The all-gather phase: `part[j]` is the byte range of the receive buffer position `j`
/// contributes; `own(off, len)` where this rank's contribution is read at the first step.
fn ring_all_gather(
    stages: &mut Vec<Stage>,
    e: usize,
    ring: &RingOrder,
    part: &[(usize, usize)],
    own: &dyn Fn(usize, usize) -> Region,
) {
    for step in 0..ring.n() - 1 {
        let (so, sl) = part[ring.before(step)];
        let (ro, rl) = part[ring.before(step + 1)];
        let (sc, rc) = (chunks(sl, e), chunks(rl, e));
        zip_stages(stages, sc.len(), rc.len(), |stage, c| {
            if let Some(&(o, l)) = rc.get(c) {
                stage.comm.push(Step::Recv {
                    peer: ring.prev(),
                    dst: Region::new(Buf::Recv, ro + o, l),
                });
            }
            if let Some(&(o, l)) = sc.get(c) {
                let src = if step == 0 {
                    own(o, l)
                } else {
                    Region::new(Buf::Recv, so + o, l)
                };
                stage.comm.push(Step::Send {
                    peer: ring.next(),
                    src,
                });
            }
        });
    }
}

fn all_reduce(b: &mut ScheduleBuilder, s: &Shape, rank: usize, ring: &RingOrder) {
    let (n, e) = (ring.n(), s.elem());
    let bytes = s.count * e;
    if n == 1 {
        b.copy(s.output(rank, 0, bytes), s.input(rank, 0, bytes));
        return;
    }
    let seg = segments(s.count, n, e);
    let mut stages = Vec::new();
    // Partial sums accumulate where the result goes.
    let acc = |_step: usize, off: usize, len: usize| s.output(rank, off, len);
    ring_reduce_scatter(&mut stages, s, rank, ring, &seg, &acc, 0);
    ring_all_gather(&mut stages, e, ring, &seg, &|o, l| {
        s.output(rank, seg[ring.me].0 + o, l)
    });
    emit_pipelined(b, &stages);
}

fn reduce_scatter(b: &mut ScheduleBuilder, s: &Shape, rank: usize, ring: &RingOrder) {
    let (n, e) = (ring.n(), s.elem());
    let block = s.count * e;
    if n == 1 {
        b.copy(s.output(rank, 0, block), s.input(rank, 0, block));
        return;
    }
    // Position j ends with the block of the rank there.
    let seg: Vec<(usize, usize)> = ring.order.iter().map(|&r| (r * block, block)).collect();
    // Partial sums never go to the other blocks of an in-place buffer: they keep their values.
    let acc = |step: usize, off: usize, len: usize| {
        let within = off % block.max(1);
        if step == n - 2 {
            // The last step's segment is this rank's block: straight into the output.
            s.output(rank, within, len)
        } else {
            // Two block-sized slots, alternating: a slot is sent on at the next step and
            // refilled the step after.
            Region::new(Buf::Scratch, (step % 2) * block + within, len)
        }
    };
    let mut stages = Vec::new();
    ring_reduce_scatter(&mut stages, s, rank, ring, &seg, &acc, 2 * block);
    emit_pipelined(b, &stages);
}

fn reduce(b: &mut ScheduleBuilder, s: &Shape, rank: usize, ring: &RingOrder) {
    let (n, e) = (ring.n(), s.elem());
    let bytes = s.count * e;
    if n == 1 {
        b.copy(Region::new(Buf::Recv, 0, bytes), s.input(rank, 0, bytes));
        return;
    }
    let seg = segments(s.count, n, e);
    let is_root = rank == s.root;
    // The root accumulates in its receive buffer, the others in scratch of the buffer's shape.
    let acc = |_step: usize, off: usize, len: usize| {
        Region::new(if is_root { Buf::Recv } else { Buf::Scratch }, off, len)
    };
    let mut stages = Vec::new();
    // Non-roots use no landing slots (their accumulator is never their input).
    ring_reduce_scatter(&mut stages, s, rank, ring, &seg, &acc, 0);
    if is_root {
        for (j, &(o, l)) in seg.iter().enumerate().filter(|&(j, _)| j != ring.me) {
            for (co, cl) in chunks(l, e) {
                let dst = Region::new(Buf::Recv, o + co, cl);
                stages.push(Stage {
                    comm: vec![Step::Recv {
                        peer: ring.order[j],
                        dst,
                    }],
                    local: Vec::new(),
                });
            }
        }
    } else {
        let (o, l) = seg[ring.me];
        for (co, cl) in chunks(l, e) {
            let src = acc(n - 2, o + co, cl);
            stages.push(Stage {
                comm: vec![Step::Send { peer: s.root, src }],
                local: Vec::new(),
            });
        }
    }
    emit_pipelined(b, &stages);
}

fn all_gather(b: &mut ScheduleBuilder, s: &Shape, rank: usize, ring: &RingOrder) {
    let e = s.elem();
    let part_of = |r: usize| match &s.v {
        Some(v) => (v.recv_displs[r] * e, v.recv_counts[r] * e),
        None => (r * s.count * e, s.count * e),
    };
    let part: Vec<(usize, usize)> = ring.order.iter().map(|&r| part_of(r)).collect();
    let (mine, len) = part_of(rank);
    // Own block: the first step sends it from the input, the copy into place overlaps that.
    let copy = Step::Copy {
        dst: Region::new(Buf::Recv, mine, len),
        src: s.input(rank, 0, len),
    };
    let mut stages = Vec::new();
    ring_all_gather(&mut stages, e, ring, &part, &|o, l| s.input(rank, o, l));
    match stages.first_mut() {
        Some(first) => first.local.push(copy),
        None => {
            b.push(copy);
        }
    }
    emit_pipelined(b, &stages);
}

fn broadcast(b: &mut ScheduleBuilder, s: &Shape, ring: &RingOrder) {
    let n = ring.n();
    // Chain position: 0 at the root, then along the ring.
    let at = (ring.me + n - ring.position(s.root)) % n;
    let stages: Vec<Stage> = chunks(s.count * s.elem(), s.elem())
        .into_iter()
        .map(|(o, l)| {
            let data = Region::new(Buf::Recv, o, l);
            let mut stage = Stage::default();
            if at > 0 {
                stage.comm.push(Step::Recv {
                    peer: ring.prev(),
                    dst: data,
                });
            }
            // Forwarding waits for the chunk, so it goes after the next chunk's receive.
            if at + 1 < n {
                let send = Step::Send {
                    peer: ring.next(),
                    src: data,
                };
                if at == 0 {
                    stage.comm.push(send);
                } else {
                    stage.local.push(send);
                }
            }
            stage
        })
        .collect();
    emit_pipelined(b, &stages);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, sweep, topology};
    use super::*;
    use crate::dtype::{DataType, ReduceOp};

    #[test]
    fn sweep_ring() {
        sweep(&Ring);
    }

    #[test]
    fn many_ranks() {
        for n in [31, 64] {
            for count in [0, 1, n - 1, 3 * n + 5] {
                for kind in CollKind::ALL.into_iter().filter(|k| Ring.supports(*k)) {
                    for in_place in [false, true] {
                        if in_place && !super::super::testing::has_in_place(kind) {
                            continue;
                        }
                        let root = if kind.rooted() { n / 3 } else { 0 };
                        for hosts in [1, 3] {
                            check(
                                &Ring,
                                kind,
                                n,
                                count,
                                root,
                                DataType::Float32,
                                ReduceOp::Sum,
                                in_place,
                                hosts,
                                7,
                            )
                            .unwrap();
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn chunked_buffers_pipeline() {
        // Several chunks per segment, with element sizes that do not divide the chunk size.
        let count = 3 * CHUNK_BYTES / 4 + 3;
        for kind in [
            CollKind::AllReduce,
            CollKind::ReduceScatter,
            CollKind::Reduce,
            CollKind::Broadcast,
        ] {
            for in_place in [false, true] {
                if in_place && !super::super::testing::has_in_place(kind) {
                    continue;
                }
                check(
                    &Ring,
                    kind,
                    3,
                    count,
                    1,
                    DataType::Float64,
                    ReduceOp::Max,
                    in_place,
                    2,
                    3,
                )
                .unwrap();
            }
        }
        check(
            &Ring,
            CollKind::AllGather,
            2,
            CHUNK_BYTES / 2 + 1,
            0,
            DataType::Int64,
            ReduceOp::Sum,
            true,
            1,
            5,
        )
        .unwrap();
    }

    #[test]
    fn receives_are_posted_before_reductions() {
        // Two ranks, Int8: segments of 2 * CHUNK_BYTES bytes, two chunks each. The second
        // chunk's receive must precede the first reduction.
        let count = 2 * CHUNK_BYTES;
        let s = Shape::new(
            CollKind::AllReduce,
            DataType::Int8,
            ReduceOp::Sum,
            2 * count,
            0,
            2,
        );
        let sched = Ring.schedule(&s, 0, &topology(2, 1));
        let first_reduce = sched
            .steps
            .iter()
            .position(|st| matches!(st, Step::Reduce { .. }))
            .unwrap();
        let recvs_before = sched.steps[..first_reduce]
            .iter()
            .filter(|st| matches!(st, Step::Recv { .. }))
            .count();
        assert!(recvs_before >= 2, "{:?}", &sched.steps[..first_reduce]);
    }

    #[test]
    fn ring_keeps_hosts_together() {
        // Ranks alternate between two hosts; the ring visits each host's ranks in a row.
        let topo = topology(6, 2);
        let ring = RingOrder::new(6, 0, &topo);
        assert_eq!(ring.order, vec![0, 2, 4, 1, 3, 5]);
    }
}
