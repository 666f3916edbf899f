//! Recursive halving and doubling: collectives in `log2 n` rounds of pairwise exchanges.
//!
//! - [`Rabenseifner`]: reduce-scatter by recursive halving (each round a rank hands half of
//!   what it still reduces to its partner at distance `p / 2, p / 4, ..., 1` and reduces the
//!   half it keeps), all-gather by recursive doubling (the reverse), all-reduce as the two in
//!   a row. `2 log2 p` rounds and the bandwidth of a ring: the algorithm for medium buffers.
//! - [`RecursiveDoubling`]: all-reduce exchanging the whole buffer with the partner at
//!   distance `1, 2, ..., p / 2`: `log2 p` rounds, the latency algorithm for tiny buffers.
//!
//! Both handle any number of ranks `n` with the usual fold to `p`, the largest power of two
//! not above `n`: of the first `2 (n - p)` ranks, the odd ones hand their data to their even
//! neighbour and sit out; the `p` others run the power-of-two algorithm as "new ranks" (the
//! even ones of the pairs first, then the rest, in rank order) and finally return the results
//! to the ranks that sat out. Because new ranks keep rank order, new rank `i` stands for a
//! contiguous run of one or two blocks, so reduce-scatter still leaves block `r` at rank `r`.

use super::ring::{chunks, emit_pipelined, pipelined, recv_reduce, Landing, Stage};
use crate::coll::schedule::{Buf, Region, Schedule, ScheduleBuilder, Step};
use crate::coll::{Algorithm, CollKind, CostModel, Shape};
use crate::topology::Topology;

/// See the module docs.
pub(crate) struct Rabenseifner;

/// See the module docs.
pub(crate) struct RecursiveDoubling;

impl Algorithm for Rabenseifner {
    fn name(&self) -> &'static str {
        "rabenseifner"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllReduce
                | CollKind::ReduceScatter
                | CollKind::AllGather
                | CollKind::AllGatherV
        )
    }

    fn cost(&self, s: &Shape, topo: &Topology, m: &CostModel) -> Option<f64> {
        let (alpha, beta) = m.worst_link(topo);
        let fold = Fold::new(s.size);
        let rounds = fold.p.trailing_zeros() as f64;
        let folded = fold.rem > 0;
        let share = (fold.p - 1) as f64 / fold.p as f64;
        let e = s.elem();
        // Halving rounds move and reduce half, a quarter, ... of `bytes`, each round
        // pipelined in itself.
        let halving = |bytes: f64| -> f64 {
            (1..=fold.p.trailing_zeros())
                .map(|k| pipelined(bytes / f64::from(1u32 << k), beta, m.gamma))
                .sum()
        };
        let cost = match s.kind {
            CollKind::AllReduce => {
                let bytes = (s.count * e) as f64;
                // Fold: the whole buffer in, reduced; unfold: the result back.
                let edge = if folded {
                    2.0 * alpha + pipelined(bytes, beta, m.gamma) + bytes * beta
                } else {
                    0.0
                };
                edge + 2.0 * rounds * alpha + halving(bytes) + share * bytes * beta
            }
            CollKind::ReduceScatter => {
                let block = (s.count * e) as f64;
                let total = block * s.size as f64;
                let edge = if folded {
                    2.0 * alpha + pipelined(total, beta, m.gamma) + block * beta
                } else {
                    0.0
                };
                edge + rounds * alpha + halving(total)
            }
            CollKind::AllGather | CollKind::AllGatherV => {
                let total = match &s.v {
                    Some(v) => v.recv_counts.iter().sum::<usize>(),
                    None => s.count * s.size,
                };
                let total = (total * e) as f64;
                let block = total / s.size as f64;
                let edge = if folded {
                    2.0 * alpha + (block + total) * beta
                } else {
                    0.0
                };
                edge + rounds * alpha + share * total * beta
            }
            _ => return None,
        };
        Some(cost)
    }

    fn schedule(&self, s: &Shape, rank: usize, _topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        match s.kind {
            CollKind::AllReduce => halving_all_reduce(&mut b, s, rank),
            CollKind::ReduceScatter => halving_reduce_scatter(&mut b, s, rank),
            CollKind::AllGather | CollKind::AllGatherV => doubling_all_gather(&mut b, s, rank),
            _ => debug_assert!(false, "rabenseifner does not implement {}", s.kind.name()),
        }
        b.build()
    }
}

impl Algorithm for RecursiveDoubling {
    fn name(&self) -> &'static str {
        "recursive_doubling"
    }

    fn supports(&self, kind: CollKind) -> bool {
        kind == CollKind::AllReduce
    }

    fn cost(&self, s: &Shape, topo: &Topology, m: &CostModel) -> Option<f64> {
        if s.kind != CollKind::AllReduce {
            return None;
        }
        let (alpha, beta) = m.worst_link(topo);
        let fold = Fold::new(s.size);
        let bytes = (s.count * s.elem()) as f64;
        let edge = if fold.rem > 0 {
            2.0 * alpha + pipelined(bytes, beta, m.gamma) + bytes * beta
        } else {
            0.0
        };
        Some(edge + fold.p.trailing_zeros() as f64 * (alpha + pipelined(bytes, beta, m.gamma)))
    }

    fn schedule(&self, s: &Shape, rank: usize, _topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        if s.kind == CollKind::AllReduce {
            doubling_all_reduce(&mut b, s, rank);
        } else {
            debug_assert!(
                false,
                "recursive_doubling does not implement {}",
                s.kind.name()
            );
        }
        b.build()
    }
}

/// The fold of `n` ranks to a power of two.
#[derive(Debug, Clone, Copy)]
struct Fold {
    /// The largest power of two not above n.
    p: usize,
    /// n - p: the number of pairs folded into one.
    rem: usize,
}

/// A rank's part in the fold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Takes part as new rank `new`; `partner` is the rank that sat out for it, if any.
    Active { new: usize, partner: Option<usize> },
    /// Sits out, handing its data to `partner`.
    Idle { partner: usize },
}

impl Fold {
    fn new(n: usize) -> Fold {
        let p = if n == 0 { 1 } else { 1 << n.ilog2() };
        Fold {
            p,
            rem: n.saturating_sub(p),
        }
    }

    fn role(&self, rank: usize) -> Role {
        if rank >= 2 * self.rem {
            Role::Active {
                new: rank - self.rem,
                partner: None,
            }
        } else if rank % 2 == 0 {
            Role::Active {
                new: rank / 2,
                partner: Some(rank + 1),
            }
        } else {
            Role::Idle { partner: rank - 1 }
        }
    }

    /// The rank that plays new rank `new`.
    fn rank_of(&self, new: usize) -> usize {
        if new < self.rem {
            2 * new
        } else {
            new + self.rem
        }
    }

    /// The ranks (blocks) new ranks `lo..hi` stand for: a contiguous run.
    fn ranks(&self, lo: usize, hi: usize) -> (usize, usize) {
        let first = self.rank_of(lo);
        let last = self.rank_of(hi - 1);
        (
            first,
            if hi - 1 < self.rem {
                last + 2
            } else {
                last + 1
            },
        )
    }
}

/// Where a rank's partial sums live while it reduces: its input until the first reduction,
/// then `work`.
struct Partial<'a> {
    s: &'a Shape,
    rank: usize,
    work: &'a dyn Fn(usize, usize) -> Region,
    in_work: bool,
    landing: Landing,
}

impl Partial<'_> {
    /// This rank's partial sum of bytes `off..off + len`.
    fn current(&self, off: usize, len: usize) -> Region {
        if self.in_work {
            (self.work)(off, len)
        } else {
            self.s.input(self.rank, off, len)
        }
    }

    /// Stages that send `give` (byte ranges) to `peer` and receive `keep` from it, adding it
    /// to this rank's partial sums; `target` may name a different home for a kept range (a
    /// final block going straight to the output). Ranges are chunked for pipelining.
    fn exchange(
        &mut self,
        stages: &mut Vec<Stage>,
        peer: usize,
        give: &[(usize, usize)],
        keep: &[(usize, usize)],
        target: &dyn Fn(usize, usize) -> Option<Region>,
    ) {
        let e = self.s.elem();
        let sends: Vec<Region> = pieces(give, e).map(|(o, l)| self.current(o, l)).collect();
        let recvs: Vec<(usize, usize)> = pieces(keep, e).collect();
        for c in 0..sends.len().max(recvs.len()) {
            let mut stage = Stage::default();
            if let Some(&(o, l)) = recvs.get(c) {
                let acc = target(o, l).unwrap_or_else(|| (self.work)(o, l));
                let current = self.current(o, l);
                recv_reduce(&mut stage, peer, acc, current, &mut self.landing);
            }
            if let Some(&src) = sends.get(c) {
                stage.comm.push(Step::Send { peer, src });
            }
            stages.push(stage);
        }
        self.in_work = true;
    }
}

/// The chunks of byte ranges, in order, empty ones left out.
fn pieces(ranges: &[(usize, usize)], e: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    ranges
        .iter()
        .flat_map(move |&(off, len)| chunks(len, e).into_iter().map(move |(o, l)| (off + o, l)))
}

/// Stages one transfer step per chunk of `ranges`.
fn transfer_stages(
    stages: &mut Vec<Stage>,
    ranges: &[(usize, usize)],
    e: usize,
    step: impl Fn(usize, usize) -> Step,
) {
    for (o, l) in pieces(ranges, e) {
        stages.push(Stage {
            comm: vec![step(o, l)],
            local: Vec::new(),
        });
    }
}

/// Stages sending `ranges` of `src` to `peer`.
fn send_stages(
    stages: &mut Vec<Stage>,
    peer: usize,
    ranges: &[(usize, usize)],
    e: usize,
    src: impl Fn(usize, usize) -> Region,
) {
    transfer_stages(stages, ranges, e, |o, l| Step::Send {
        peer,
        src: src(o, l),
    });
}

/// Stages receiving `ranges` from `peer` into `dst`.
fn recv_stages(
    stages: &mut Vec<Stage>,
    peer: usize,
    ranges: &[(usize, usize)],
    e: usize,
    dst: impl Fn(usize, usize) -> Region,
) {
    transfer_stages(stages, ranges, e, |o, l| Step::Recv {
        peer,
        dst: dst(o, l),
    });
}

/// Stages exchanging `give` for `take`, both of the receive buffer, with `peer`.
fn swap_stages(
    stages: &mut Vec<Stage>,
    peer: usize,
    give: &[(usize, usize)],
    take: &[(usize, usize)],
    e: usize,
) {
    let sends: Vec<(usize, usize)> = pieces(give, e).collect();
    let recvs: Vec<(usize, usize)> = pieces(take, e).collect();
    for c in 0..sends.len().max(recvs.len()) {
        let mut stage = Stage::default();
        if let Some(&(o, l)) = recvs.get(c) {
            stage.comm.push(Step::Recv {
                peer,
                dst: Region::new(Buf::Recv, o, l),
            });
        }
        if let Some(&(o, l)) = sends.get(c) {
            stage.comm.push(Step::Send {
                peer,
                src: Region::new(Buf::Recv, o, l),
            });
        }
        stages.push(stage);
    }
}

/// Recursive halving over new ranks: `seg(lo, hi)` is the byte range new ranks `lo..hi` end
/// up with; at the last round `split` cuts the kept and given ranges and `target` names a
/// different home for some of them (so that a final block goes straight to its place).
fn halve(
    stages: &mut Vec<Stage>,
    part: &mut Partial<'_>,
    fold: &Fold,
    new: usize,
    seg: &dyn Fn(usize, usize) -> (usize, usize),
    split: &dyn Fn((usize, usize)) -> Vec<(usize, usize)>,
    target: &dyn Fn(usize, usize) -> Option<Region>,
) {
    let mut mask = fold.p / 2;
    while mask > 0 {
        let lo = new & !(2 * mask - 1);
        let (keep, give) = if new & mask == 0 {
            (seg(lo, lo + mask), seg(lo + mask, lo + 2 * mask))
        } else {
            (seg(lo + mask, lo + 2 * mask), seg(lo, lo + mask))
        };
        let peer = fold.rank_of(new ^ mask);
        if mask == 1 {
            part.exchange(stages, peer, &split(give), &split(keep), target);
        } else {
            part.exchange(stages, peer, &[give], &[keep], &|_, _| None);
        }
        mask /= 2;
    }
}

/// All-reduce: fold, reduce-scatter by halving, all-gather by doubling, unfold.
fn halving_all_reduce(b: &mut ScheduleBuilder, s: &Shape, rank: usize) {
    let (n, e) = (s.size, s.elem());
    let bytes = s.count * e;
    if n == 1 {
        b.copy(s.output(rank, 0, bytes), s.input(rank, 0, bytes));
        return;
    }
    let fold = Fold::new(n);
    let whole = [(0, bytes)];
    let mut stages = Vec::new();
    match fold.role(rank) {
        Role::Idle { partner } => {
            send_stages(&mut stages, partner, &whole, e, |o, l| s.input(rank, o, l));
            recv_stages(&mut stages, partner, &whole, e, |o, l| s.output(rank, o, l));
        }
        Role::Active { new, partner } => {
            // The p segments of the buffer, one per new rank.
            let segs = super::segments(s.count, fold.p, e);
            let seg =
                |lo: usize, hi: usize| (segs[lo].0, segs[hi - 1].0 + segs[hi - 1].1 - segs[lo].0);
            let work = |o: usize, l: usize| s.output(rank, o, l);
            let mut part = Partial {
                s,
                rank,
                work: &work,
                in_work: false,
                landing: Landing::new(0, e, bytes),
            };
            if let Some(partner) = partner {
                part.exchange(&mut stages, partner, &[], &whole, &|_, _| None);
            }
            halve(
                &mut stages,
                &mut part,
                &fold,
                new,
                &seg,
                &|r| vec![r],
                &|_, _| None,
            );
            let mut mask = 1;
            while mask < fold.p {
                let lo = new & !(mask - 1);
                let theirs = lo ^ mask;
                let peer = fold.rank_of(new ^ mask);
                swap_stages(
                    &mut stages,
                    peer,
                    &[seg(lo, lo + mask)],
                    &[seg(theirs, theirs + mask)],
                    e,
                );
                mask *= 2;
            }
            if let Some(partner) = partner {
                send_stages(&mut stages, partner, &whole, e, |o, l| s.output(rank, o, l));
            }
        }
    }
    emit_pipelined(b, &stages);
}

/// Reduce-scatter: fold (the idle rank's whole input), halving over runs of blocks, then the
/// idle rank's block back.
fn halving_reduce_scatter(b: &mut ScheduleBuilder, s: &Shape, rank: usize) {
    let (n, e) = (s.size, s.elem());
    let block = s.count * e;
    if n == 1 {
        b.copy(s.output(rank, 0, block), s.input(rank, 0, block));
        return;
    }
    let fold = Fold::new(n);
    let total = n * block;
    let mut stages = Vec::new();
    match fold.role(rank) {
        Role::Idle { partner } => {
            send_stages(&mut stages, partner, &[(0, total)], e, |o, l| {
                s.input(rank, o, l)
            });
            recv_stages(&mut stages, partner, &[(0, block)], e, |o, l| {
                s.output(rank, o, l)
            });
        }
        Role::Active { new, partner } => {
            // Partial sums go to scratch shaped like the input, landing slots after it: the
            // other blocks of an in-place buffer keep their values.
            let work = |o: usize, l: usize| Region::new(Buf::Scratch, o, l);
            let landing = Landing::new(total, e, total);
            let mut part = Partial {
                s,
                rank,
                work: &work,
                in_work: false,
                landing,
            };
            if let Some(partner) = partner {
                part.exchange(&mut stages, partner, &[], &[(0, total)], &|_, _| None);
            }
            let seg = |lo: usize, hi: usize| {
                let (first, end) = fold.ranks(lo, hi);
                (first * block, (end - first) * block)
            };
            // The last round's ranges are one or two blocks: cut them at block boundaries so
            // that this rank's block is received straight into the output.
            let split = |(off, len): (usize, usize)| -> Vec<(usize, usize)> {
                (off / block.max(1)..(off + len) / block.max(1))
                    .map(|r| (r * block, block))
                    .collect()
            };
            let own = rank * block;
            let target = |o: usize, l: usize| {
                (o >= own && o < own + block).then(|| s.output(rank, o - own, l))
            };
            halve(&mut stages, &mut part, &fold, new, &seg, &split, &target);
            if let Some(partner) = partner {
                let theirs = partner * block;
                send_stages(&mut stages, partner, &[(theirs, block)], e, |o, l| {
                    work(o, l)
                });
            }
        }
    }
    emit_pipelined(b, &stages);
}

/// All-gather (and -v): fold (the idle rank's block), doubling over runs of blocks, then
/// everything else back to the idle rank.
fn doubling_all_gather(b: &mut ScheduleBuilder, s: &Shape, rank: usize) {
    let (n, e) = (s.size, s.elem());
    let part = |r: usize| match &s.v {
        Some(v) => (v.recv_displs[r] * e, v.recv_counts[r] * e),
        None => (r * s.count * e, s.count * e),
    };
    // Blocks of ranks `first..end` as contiguous byte runs of the receive buffer (v-layouts
    // may leave gaps, which must keep their contents), `skip` left out.
    let runs = |first: usize, end: usize, skip: Option<usize>| {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for r in (first..end).filter(|&r| Some(r) != skip) {
            let (o, l) = part(r);
            match out.last_mut() {
                _ if l == 0 => {}
                Some(last) if last.0 + last.1 == o => last.1 += l,
                _ => out.push((o, l)),
            }
        }
        out
    };
    let (mine, len) = part(rank);
    let own = Step::Copy {
        dst: Region::new(Buf::Recv, mine, len),
        src: s.input(rank, 0, len),
    };
    let fold = Fold::new(n);
    let mut stages = Vec::new();
    match fold.role(rank) {
        Role::Idle { partner } => {
            send_stages(&mut stages, partner, &[(0, len)], e, |o, l| {
                s.input(rank, o, l)
            });
            recv_stages(&mut stages, partner, &runs(0, n, Some(rank)), e, |o, l| {
                Region::new(Buf::Recv, o, l)
            });
            b.push(own);
        }
        Role::Active { new, partner } => {
            b.push(own);
            if let Some(partner) = partner {
                recv_stages(
                    &mut stages,
                    partner,
                    &runs(partner, partner + 1, None),
                    e,
                    |o, l| Region::new(Buf::Recv, o, l),
                );
            }
            let mut mask = 1;
            while mask < fold.p {
                let lo = new & !(mask - 1);
                let theirs = lo ^ mask;
                let (a, z) = fold.ranks(lo, lo + mask);
                let (ta, tz) = fold.ranks(theirs, theirs + mask);
                let peer = fold.rank_of(new ^ mask);
                swap_stages(&mut stages, peer, &runs(a, z, None), &runs(ta, tz, None), e);
                mask *= 2;
            }
            if let Some(partner) = partner {
                send_stages(
                    &mut stages,
                    partner,
                    &runs(0, n, Some(partner)),
                    e,
                    |o, l| Region::new(Buf::Recv, o, l),
                );
            }
        }
    }
    emit_pipelined(b, &stages);
}

/// Recursive doubling all-reduce: fold, whole-buffer exchanges at distance 1, 2, ..., p / 2,
/// unfold. For two ranks: one send, one receive, one reduction.
fn doubling_all_reduce(b: &mut ScheduleBuilder, s: &Shape, rank: usize) {
    let (n, e) = (s.size, s.elem());
    let bytes = s.count * e;
    if n == 1 {
        b.copy(s.output(rank, 0, bytes), s.input(rank, 0, bytes));
        return;
    }
    let fold = Fold::new(n);
    let whole = [(0, bytes)];
    let mut stages = Vec::new();
    match fold.role(rank) {
        Role::Idle { partner } => {
            send_stages(&mut stages, partner, &whole, e, |o, l| s.input(rank, o, l));
            recv_stages(&mut stages, partner, &whole, e, |o, l| s.output(rank, o, l));
        }
        Role::Active { new, partner } => {
            let work = |o: usize, l: usize| s.output(rank, o, l);
            let mut part = Partial {
                s,
                rank,
                work: &work,
                in_work: false,
                landing: Landing::new(0, e, bytes),
            };
            if let Some(partner) = partner {
                part.exchange(&mut stages, partner, &[], &whole, &|_, _| None);
            }
            let mut mask = 1;
            while mask < fold.p {
                part.exchange(
                    &mut stages,
                    fold.rank_of(new ^ mask),
                    &whole,
                    &whole,
                    &|_, _| None,
                );
                mask *= 2;
            }
            if let Some(partner) = partner {
                send_stages(&mut stages, partner, &whole, e, |o, l| s.output(rank, o, l));
            }
        }
    }
    emit_pipelined(b, &stages);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, has_in_place, sweep, topology};
    use super::*;
    use crate::dtype::{DataType, ReduceOp};

    #[test]
    fn sweep_rabenseifner() {
        sweep(&Rabenseifner);
    }

    #[test]
    fn sweep_recursive_doubling() {
        sweep(&RecursiveDoubling);
    }

    #[test]
    fn many_ranks() {
        let algos: [&dyn Algorithm; 2] = [&Rabenseifner, &RecursiveDoubling];
        for algo in algos {
            for n in [31, 33, 64] {
                for count in [0, 1, n - 1, 2 * n + 3] {
                    for kind in CollKind::ALL.into_iter().filter(|k| algo.supports(*k)) {
                        for in_place in [false, true] {
                            if in_place && !has_in_place(kind) {
                                continue;
                            }
                            for hosts in [1, 2] {
                                check(
                                    algo,
                                    kind,
                                    n,
                                    count,
                                    0,
                                    DataType::Int64,
                                    ReduceOp::Sum,
                                    in_place,
                                    hosts,
                                    11,
                                )
                                .unwrap();
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn chunked_buffers() {
        let count = CHUNK_ELEMS + 5;
        for n in [2, 3, 6] {
            for in_place in [false, true] {
                for kind in [
                    CollKind::AllReduce,
                    CollKind::ReduceScatter,
                    CollKind::AllGather,
                ] {
                    check(
                        &Rabenseifner,
                        kind,
                        n,
                        count,
                        0,
                        DataType::Float32,
                        ReduceOp::Sum,
                        in_place,
                        1,
                        2,
                    )
                    .unwrap();
                }
                check(
                    &RecursiveDoubling,
                    CollKind::AllReduce,
                    n,
                    count,
                    0,
                    DataType::Float32,
                    ReduceOp::Min,
                    in_place,
                    1,
                    2,
                )
                .unwrap();
            }
        }
    }

    /// Elements of Float32 in a little over two chunks.
    const CHUNK_ELEMS: usize = super::super::ring::CHUNK_BYTES / 2;

    #[test]
    fn two_rank_doubling_is_one_exchange() {
        for in_place in [false, true] {
            let s = Shape {
                in_place,
                ..Shape::new(
                    CollKind::AllReduce,
                    DataType::Float64,
                    ReduceOp::Sum,
                    1,
                    0,
                    2,
                )
            };
            for rank in 0..2 {
                let sched = RecursiveDoubling.schedule(&s, rank, &topology(2, 1));
                let kinds: Vec<&str> = sched
                    .steps
                    .iter()
                    .map(|st| match st {
                        Step::Send { .. } => "send",
                        Step::Recv { .. } => "recv",
                        Step::Reduce { .. } => "reduce",
                        Step::Copy { .. } => "copy",
                    })
                    .collect();
                assert_eq!(kinds, ["recv", "send", "reduce"], "in_place={in_place}");
            }
        }
    }

    #[test]
    fn fold_maps_new_ranks_to_runs_of_blocks() {
        let f = Fold::new(7); // p = 4, rem = 3: ranks 1, 3, 5 sit out
        assert_eq!((f.p, f.rem), (4, 3));
        assert_eq!(f.role(1), Role::Idle { partner: 0 });
        assert_eq!(
            f.role(4),
            Role::Active {
                new: 2,
                partner: Some(5)
            }
        );
        assert_eq!(
            f.role(6),
            Role::Active {
                new: 3,
                partner: None
            }
        );
        assert_eq!(f.ranks(0, 4), (0, 7));
        assert_eq!(f.ranks(2, 3), (4, 6));
        assert_eq!(f.ranks(3, 4), (6, 7));
    }
}
