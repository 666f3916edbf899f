//! Tree algorithms: binomial trees (`tree`) and double binary trees (`dbtree`), and the
//! pipelined tree engine the hierarchical algorithm builds on.
//!
//! - `tree`: a binomial tree relative to the root. Broadcast and reduce take `ceil(log2 n)`
//!   rounds; gather and scatter move every block once along the tree (the root receives or
//!   sends `n - 1` blocks in `ceil(log2 n)` messages); all-reduce is a reduce to rank 0
//!   followed by a broadcast from it. The latency algorithm for small buffers.
//! - `dbtree`: two complementary binary trees (as in NCCL) below the root, each carrying half
//!   of the buffer. A rank is interior in at most one of them, so no rank sends or receives
//!   much more than the buffer per direction, while the depth stays `log2 n`: the algorithm
//!   for medium buffers and many ranks.
//!
//! Large buffers are cut into chunks that flow through the tree one after another
//! (`run_stages`): a rank forwards chunk `c` as soon as it has it while chunk `c + 1` is
//! still arriving, and in all-reduce the reduction of later chunks travelling up overlaps the
//! broadcast of earlier ones travelling down (the two directions of each link).

use crate::coll::schedule::{Buf, Region, Schedule, ScheduleBuilder};
use crate::coll::{Algorithm, CollKind, CostModel, Shape};
use crate::topology::Topology;

/// Largest chunk of a pipelined tree: big enough that per-message overhead stays small.
const MAX_CHUNK: usize = 256 * 1024;
/// Smallest chunk: below this, per-message latency dominates whatever the pipeline gains.
const MIN_CHUNK: usize = 16 * 1024;
/// Bytes one message latency is worth (α/β of the links the chunking aims at), for picking
/// the chunk size that balances pipeline fill against per-chunk latency.
const LATENCY_BYTES: f64 = 32.0 * 1024.0;
/// Iterations by which a receive is posted ahead of the iteration its sender sends in (so a
/// fast sender rarely waits for its receiver to post).
pub(crate) const AHEAD: usize = 2;
/// Iterations by which a leaf sends its chunks up ahead of its parent's reduction of them.
/// A leaf's sends wait for nothing, so sending them early keeps a rank that reduces in one
/// tree from holding back the chunks it owes the other tree as a leaf.
const LEAD: usize = 2;
/// Landing slots per child: a chunk is received up to `LEAD + AHEAD` iterations before it
/// is reduced.
const SLOTS: usize = AHEAD + LEAD + 1;

/// A byte position in one of the call's buffers that a stage's chunk offsets are added to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    /// The buffer.
    pub buf: Buf,
    /// Byte offset of chunk offset 0.
    pub off: usize,
}

impl Loc {
    /// Where `region` starts.
    pub(crate) fn of(region: Region) -> Loc {
        Loc {
            buf: region.buf,
            off: region.off,
        }
    }

    fn at(self, off: usize, len: usize) -> Region {
        Region::new(self.buf, self.off + off, len)
    }
}

/// This rank's place in one tree: real ranks of its parent and children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TreeNode {
    /// The parent; `None` at the root.
    pub parent: Option<usize>,
    /// The children, in the order a broadcast serves them (largest subtree first).
    pub children: Vec<usize>,
    /// Whether each of `children` is a leaf (its chunks come ahead: see [`LEAD`]).
    pub leaf: Vec<bool>,
    /// Edges between this rank and the root.
    pub depth: usize,
}

/// Which way data moves through a stage's tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Reduce towards the root.
    Up,
    /// Broadcast from the root.
    Down,
    /// Reduce towards the root, then broadcast the result back down.
    UpDown,
}

/// Which part of every chunk a stage carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece {
    /// The whole chunk.
    Whole,
    /// The first half (rounded up, in elements).
    First,
    /// The rest.
    Second,
}

/// One tree pass over the chunks of a buffer, as seen by one rank.
#[derive(Debug, Clone)]
pub(crate) struct Stage {
    /// This rank's place in the tree.
    pub node: TreeNode,
    /// Direction.
    pub flow: Flow,
    /// Part of each chunk carried.
    pub piece: Piece,
    /// This rank's contribution to a reduction (up flows).
    pub input: Loc,
    /// Where the partial reduction accumulates and the result of a broadcast lands. When it
    /// differs from `input`, this stage must be the first to touch it (the first child's
    /// chunk is received straight into it, ahead of the chunk's turn).
    pub acc: Loc,
    /// Iteration at which the stage reduces chunk 0; the same on every rank of the tree.
    pub lag_up: usize,
    /// Iterations by which leaves send ahead (at most [`LEAD`], the same on every rank of
    /// the tree): 0 when a leaf's input comes from an earlier stage of the same iteration.
    pub lead: usize,
    /// Iteration at which this rank forwards chunk 0 down: never below the parent's.
    pub lag_down: usize,
    /// The parent's `lag_down`. Receives of an up-down stage's result land where this rank
    /// reduced, so they are posted only after: `parent_lag_down > lag_up + AHEAD`.
    pub parent_lag_down: usize,
}

impl Stage {
    /// A stage with its lags: `up` for the whole tree and `down(depth)` for the rank at
    /// `depth`, which must not decrease with depth.
    pub(crate) fn new(
        node: TreeNode,
        flow: Flow,
        piece: Piece,
        input: Loc,
        acc: Loc,
        up: usize,
        down: impl Fn(usize) -> usize,
    ) -> Stage {
        let (lag_down, parent_lag_down) = (down(node.depth), down(node.depth.saturating_sub(1)));
        Stage {
            node,
            flow,
            piece,
            input,
            acc,
            lag_up: up,
            lead: LEAD,
            lag_down,
            parent_lag_down,
        }
    }
}

/// Down lag of a rank at `depth` of an up-down stage whose up lag is `up`: late enough that
/// the result is received only after the rank passed its partial sum up, growing with depth
/// by the two hops a chunk travels up and back down.
pub(crate) fn updown_lag(up: usize, depth: usize) -> usize {
    up + AHEAD + 1 + 2 * depth
}

/// Splits `count` elements of `elem` bytes into pipeline chunks for a tree whose critical
/// path has `hops` messages: (byte offset, byte length) of each, none when `count` is 0.
pub(crate) fn chunks(count: usize, elem: usize, hops: usize) -> Vec<(usize, usize)> {
    let per = chunk_elems(count, elem, hops);
    (0..count)
        .step_by(per)
        .map(|at| (at * elem, per.min(count - at) * elem))
        .collect()
}

/// Elements per chunk: the chunk size minimising `(chunks + hops) * (alpha + chunk * beta)`
/// is `sqrt(bytes * alpha / beta / hops)`, kept within [`MIN_CHUNK`, `MAX_CHUNK`].
fn chunk_elems(count: usize, elem: usize, hops: usize) -> usize {
    let bytes = (count * elem) as f64;
    let best = (bytes * LATENCY_BYTES / hops.max(1) as f64).sqrt() as usize;
    (best.clamp(MIN_CHUNK, MAX_CHUNK) / elem.max(1)).max(1)
}

/// Number of chunks and bytes of the largest, as [`chunks`] cuts them (for costs).
pub(crate) fn chunking(count: usize, elem: usize, hops: usize) -> (f64, f64) {
    let per = chunk_elems(count, elem, hops);
    (count.div_ceil(per) as f64, (per.min(count) * elem) as f64)
}

/// `ceil(log2 n)`: rounds of a binomial tree over `n` ranks.
pub(crate) fn ceil_log2(n: usize) -> usize {
    n.max(1).next_power_of_two().trailing_zeros() as usize
}

fn lowbit(x: usize) -> usize {
    x & x.wrapping_neg()
}

/// Position of `members[me]` in the binomial tree over `members` rooted at `members[root]`.
///
/// With virtual ranks `v = me - root (mod m)`, the parent of `v` is `v` without its lowest
/// set bit and its children are `v + 2^k` for `2^k` below that bit: every subtree is a
/// contiguous run of virtual ranks.
pub(crate) fn binomial(members: &[usize], root: usize, me: usize) -> TreeNode {
    let m = members.len();
    let v = (me + m - root) % m;
    let real = |x: usize| members[(x + root) % m];
    let limit = if v == 0 {
        m.next_power_of_two()
    } else {
        lowbit(v)
    };
    let dists: Vec<usize> = (0..usize::BITS)
        .map(|k| 1usize << k)
        .take_while(|&d| d < limit && v + d < m)
        .collect();
    TreeNode {
        parent: (v != 0).then(|| real(v & (v - 1))),
        children: dists.iter().rev().map(|&d| real(v + d)).collect(),
        // The child at distance d has children at distances below d.
        leaf: dists
            .iter()
            .rev()
            .map(|&d| d == 1 || v + d + 1 >= m)
            .collect(),
        depth: v.count_ones() as usize,
    }
}

/// Largest power of two not above `m` (`m >= 1`).
fn top_of(m: usize) -> usize {
    1 << (usize::BITS - 1 - m.leading_zeros())
}

/// Children of label `q` in the in-order binary tree over labels `1..=m`: a label whose
/// lowest set bit is `2^k` has `q - 2^(k-1)` on the left and on the right the first of
/// `q + 2^(k-1)`, `q + 2^(k-2)`, ... that exists (the right subtree pruned at `m`).
fn btree_children(q: usize, m: usize) -> Vec<usize> {
    let half = lowbit(q) / 2;
    if half == 0 {
        return Vec::new();
    }
    let mut out = vec![q - half];
    let mut h = half;
    while h > 0 && q + h > m {
        h /= 2;
    }
    if h > 0 {
        out.push(q + h);
    }
    out
}

/// Parent of label `q` in the tree of [`btree_children`]; `None` for the top.
fn btree_parent(q: usize, m: usize) -> Option<usize> {
    let top = top_of(m);
    let mut cur = q;
    while cur != top {
        let low = lowbit(cur);
        if low > m {
            return None;
        }
        // In the unpruned tree the parent has the next bit; a missing parent (beyond `m`)
        // hands its place to its left child, so keep climbing.
        let up = if cur & (2 * low) != 0 {
            cur - low
        } else {
            cur + low
        };
        if up <= m {
            return Some(up);
        }
        cur = up;
    }
    None
}

/// Positions of `members[me]` in the two trees of a double binary tree rooted at
/// `members[root]`, and the height of the trees.
///
/// The root sits above two binary trees over the other `m = members - 1` ranks (labels
/// `1..=m` in virtual order). The first is the in-order tree of [`btree_children`]; the
/// second is the same shape with the labels mirrored (`q -> m + 1 - q`) when `m` is even, or
/// shifted by one when it is odd. Leaves of the in-order tree have odd labels and interior
/// nodes even ones, and both maps turn odd into even (but for one label when `m` is odd), so
/// a rank that is interior in one tree is a leaf in the other.
pub(crate) fn double_binary(members: &[usize], root: usize, me: usize) -> [TreeNode; 2] {
    let n = members.len();
    let v = (me + n - root) % n;
    let real = |x: usize| members[(x + root) % n];
    let m = n - 1;
    if m == 0 {
        return [TreeNode::default(), TreeNode::default()];
    }
    let top = top_of(m);
    // to_shape maps a label to its place in the tree's shape; from_shape back.
    let to_shape = |t: usize, q: usize| match t {
        0 => q,
        _ if m % 2 == 0 => m + 1 - q,
        _ => q % m + 1,
    };
    let from_shape = |t: usize, s: usize| match t {
        0 => s,
        _ if m % 2 == 0 => m + 1 - s,
        _ if s == 1 => m,
        _ => s - 1,
    };
    let node = |t: usize| {
        if v == 0 {
            return TreeNode {
                parent: None,
                children: vec![real(from_shape(t, top))],
                leaf: vec![m == 1],
                depth: 0,
            };
        }
        let s = to_shape(t, v);
        let mut depth = 1;
        let mut up = s;
        while let Some(p) = btree_parent(up, m) {
            depth += 1;
            up = p;
        }
        TreeNode {
            parent: Some(btree_parent(s, m).map_or(real(0), |p| real(from_shape(t, p)))),
            children: btree_children(s, m)
                .into_iter()
                .map(|c| real(from_shape(t, c)))
                .collect(),
            leaf: btree_children(s, m)
                .into_iter()
                .map(|c| btree_children(c, m).is_empty())
                .collect(),
            depth,
        }
    };
    [node(0), node(1)]
}

/// Edges from the root to the deepest leaf of a double binary tree over `n` ranks.
pub(crate) fn double_binary_height(n: usize) -> usize {
    if n <= 1 {
        0
    } else {
        (usize::BITS - (n - 1).leading_zeros()) as usize
    }
}

/// Appends this rank's steps of `stages` over `chunks` to `b`, interleaved chunk by chunk:
/// at iteration `t` each stage (in order) reduces chunk `t - lag_up` and passes it up, then
/// forwards chunk `t - lag_down` down; leaves pass chunk `t - lag_up + LEAD` up first.
/// Scratch from `scratch_base` holds landing slots for children's chunks.
///
/// Steps of one rank are issued in program order and a step waiting for data holds back the
/// rest, so the order is what keeps the pipeline full and free of deadlock:
///
/// - Every message has a key: the iteration its sender sends it in, then leaves' sends
///   before the rest, then stage order, then up before down. Receives are posted [`AHEAD`]
///   iterations ahead, in key order, which is the order the sender sends in. (Two ranks may
///   be linked in several stages, as in the two trees of a double binary tree, and messages
///   between a pair match in order.)
/// - A message is sent no later (in iterations) than its receiver waits for it: the up lag
///   is the same on every rank of a stage, and down lags do not shrink from parent to
///   child.
/// - The lags stagger a stage's phases so that a rank waits for a chunk about when it
///   arrives: the result of chunk `c` comes back down well after the rank passed it up.
pub(crate) fn run_stages(
    b: &mut ScheduleBuilder,
    stages: &[Stage],
    chunks: &[(usize, usize)],
    elem: usize,
    scratch_base: usize,
) {
    let n_chunks = chunks.len();
    let max_len = chunks.iter().map(|c| c.1).max().unwrap_or(0);
    let mut next = scratch_base;
    let slot_bases: Vec<usize> = stages
        .iter()
        .map(|st| {
            debug_assert!(st.lead <= LEAD);
            debug_assert!(
                st.flow != Flow::UpDown
                    || st.node.parent.is_none()
                    || st.parent_lag_down > st.lag_up + AHEAD
            );
            let base = next;
            if st.flow != Flow::Down {
                next += st.node.children.len() * SLOTS * max_len;
            }
            base
        })
        .collect();
    let at = |st: &Stage, c: usize| piece(st.piece, chunks[c], elem);
    let slot_bases = &slot_bases;
    let slots = |k: usize, c: usize| {
        move |i: usize, len: usize| {
            Region::new(
                Buf::Scratch,
                slot_bases[k] + (i * SLOTS + c % SLOTS) * max_len,
                len,
            )
        }
    };
    let chunk_at = |t: usize, lag: usize| t.checked_sub(lag).filter(|&c| c < n_chunks);
    // Chunks a leaf sends at iteration t: those with (c + lag).saturating_sub(lead) == t.
    let leaf_chunks = |t: usize, st: &Stage| {
        let r = match (t, (t + st.lead).checked_sub(st.lag_up)) {
            (0, _) => 0..(st.lead + 1).saturating_sub(st.lag_up),
            (_, Some(c)) => c..c + 1,
            (_, None) => 0..0,
        };
        r.start.min(n_chunks)..r.end.min(n_chunks)
    };
    let last = stages
        .iter()
        .map(|st| st.lag_up.max(st.lag_down))
        .max()
        .unwrap_or(0)
        + n_chunks;
    for t in 0..last {
        let first = if t == 0 { 0 } else { t + AHEAD };
        for sent in first..=t + AHEAD {
            for leaves in [true, false] {
                for (k, st) in stages.iter().enumerate() {
                    if st.flow != Flow::Down {
                        let up: Vec<usize> = if leaves {
                            leaf_chunks(sent, st).collect()
                        } else {
                            chunk_at(sent, st.lag_up).into_iter().collect()
                        };
                        for c in up {
                            post_up(b, st, at(st, c), leaves, slots(k, c));
                        }
                    }
                    if let (false, true, Some(c)) = (
                        leaves,
                        st.flow != Flow::Up,
                        chunk_at(sent, st.parent_lag_down),
                    ) {
                        recv_down(b, st, at(st, c));
                    }
                }
            }
        }
        for st in stages
            .iter()
            .filter(|st| st.flow != Flow::Down && st.node.children.is_empty())
        {
            if let Some(parent) = st.node.parent {
                for c in leaf_chunks(t, st) {
                    let (off, len) = at(st, c);
                    if len > 0 {
                        b.send(parent, st.input.at(off, len));
                    }
                }
            }
        }
        for (k, st) in stages.iter().enumerate() {
            if st.flow != Flow::Down {
                if let Some(c) = chunk_at(t, st.lag_up) {
                    reduce_up(b, st, at(st, c), slots(k, c));
                }
            }
            if st.flow != Flow::Up {
                if let Some(c) = chunk_at(t, st.lag_down) {
                    let (off, len) = at(st, c);
                    if len > 0 {
                        for &child in &st.node.children {
                            b.send(child, st.acc.at(off, len));
                        }
                    }
                }
            }
        }
    }
}

/// Posts the receive of one chunk from the parent.
fn recv_down(b: &mut ScheduleBuilder, st: &Stage, (off, len): (usize, usize)) {
    if let (Some(parent), true) = (st.node.parent, len > 0) {
        b.recv(parent, st.acc.at(off, len));
    }
}

/// The part `p` of chunk `(off, len)`.
fn piece(p: Piece, (off, len): (usize, usize), elem: usize) -> (usize, usize) {
    let first = len.div_ceil(2 * elem) * elem;
    match p {
        Piece::Whole => (off, len),
        Piece::First => (off, first),
        Piece::Second => (off + first, len - first),
    }
}

/// Posts the receives of one chunk from the children that are leaves (`leaves`) or from
/// the others. Children are numbered smallest subtree first (it arrives first); unless the
/// stage reduces in place, the first lands in the accumulator itself.
fn post_up(
    b: &mut ScheduleBuilder,
    st: &Stage,
    (off, len): (usize, usize),
    leaves: bool,
    slot: impl Fn(usize, usize) -> Region,
) {
    if len == 0 {
        return;
    }
    let children = st.node.children.iter().rev().zip(st.node.leaf.iter().rev());
    for (i, (&child, _)) in children
        .enumerate()
        .filter(|(_, (_, &leaf))| leaf == leaves)
    {
        let dst = if i == 0 && st.input != st.acc {
            st.acc.at(off, len)
        } else {
            slot(i, len)
        };
        b.recv(child, dst);
    }
}

/// Reduces one chunk from the children into the accumulator and passes it to the parent.
fn reduce_up(
    b: &mut ScheduleBuilder,
    st: &Stage,
    (off, len): (usize, usize),
    slot: impl Fn(usize, usize) -> Region,
) {
    if len == 0 {
        return;
    }
    let (acc, input) = (st.acc.at(off, len), st.input.at(off, len));
    let kids = st.node.children.len();
    if kids == 0 {
        // A leaf sends its input from `run_stages`; a lone root just keeps it.
        if st.node.parent.is_none() {
            b.copy(acc, input);
        }
        return;
    }
    if st.input != st.acc {
        b.reduce(acc, input);
        for i in 1..kids {
            b.reduce(acc, slot(i, len));
        }
    } else {
        for i in 0..kids {
            b.reduce(acc, slot(i, len));
        }
    }
    if let Some(parent) = st.node.parent {
        b.send(parent, acc);
    }
}

/// Binomial trees; see the module docs.
pub(crate) struct Tree;

impl Algorithm for Tree {
    fn name(&self) -> &'static str {
        "tree"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllReduce
                | CollKind::Broadcast
                | CollKind::Reduce
                | CollKind::Gather
                | CollKind::Scatter
        )
    }

    fn cost(&self, s: &Shape, topo: &Topology, m: &CostModel) -> Option<f64> {
        if !self.supports(s.kind) {
            return None;
        }
        let (alpha, beta) = m.worst_link(topo);
        let h = ceil_log2(s.size) as f64;
        let (c, ch) = chunking(s.count, s.elem(), ceil_log2(s.size));
        // The root handles every chunk once per child: h messages per chunk, the bottleneck.
        let down = c * h * (alpha + ch * beta);
        let up = c * h * (alpha + ch * (beta + m.gamma));
        let block = (s.count * s.elem()) as f64;
        Some(match s.kind {
            CollKind::Broadcast => down,
            CollKind::Reduce => up,
            // The broadcast of earlier chunks overlaps the reduction of later ones; only the
            // last chunk's way down adds.
            CollKind::AllReduce => up + h * (alpha + ch * beta),
            _ => h * alpha + (s.size as f64 - 1.0) * block * beta,
        })
    }

    fn schedule(&self, s: &Shape, rank: usize, _topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        let all: Vec<usize> = (0..s.size).collect();
        let e = s.elem();
        let stage = |root: usize, flow: Flow, acc: Loc| {
            let down = |depth| {
                if flow == Flow::UpDown {
                    updown_lag(0, depth)
                } else {
                    0
                }
            };
            Stage::new(
                binomial(&all, root, rank),
                flow,
                Piece::Whole,
                Loc::of(s.input(rank, 0, 0)),
                acc,
                0,
                down,
            )
        };
        let chunks = chunks(s.count, e, ceil_log2(s.size));
        let recv = Loc::of(s.output(rank, 0, 0));
        match s.kind {
            CollKind::AllReduce => {
                run_stages(&mut b, &[stage(0, Flow::UpDown, recv)], &chunks, e, 0)
            }
            CollKind::Broadcast => {
                run_stages(&mut b, &[stage(s.root, Flow::Down, recv)], &chunks, e, 0)
            }
            CollKind::Reduce => {
                // Non-roots have no receive buffer: partial sums accumulate in scratch.
                let acc = if rank == s.root {
                    recv
                } else {
                    Loc {
                        buf: Buf::Scratch,
                        off: 0,
                    }
                };
                let base = if rank == s.root { 0 } else { s.count * e };
                run_stages(&mut b, &[stage(s.root, Flow::Up, acc)], &chunks, e, base);
            }
            CollKind::Gather => gather(&mut b, s, rank),
            CollKind::Scatter => scatter(&mut b, s, rank),
            _ => {}
        }
        b.build()
    }
}

/// The blocks of virtual ranks `from..from + len` as runs of real ranks (real = virtual +
/// root mod n): one run, or two when they wrap past rank `n - 1`. Each is (first virtual
/// rank, first real rank, blocks).
fn real_runs(from: usize, len: usize, root: usize, n: usize) -> Vec<(usize, usize, usize)> {
    let start = (from + root) % n;
    if start + len <= n {
        vec![(from, start, len)]
    } else {
        let a = n - start;
        vec![(from, start, a), (from + a, 0, len - a)]
    }
}

/// Blocks of virtual ranks in the binomial subtree of `v`: `v..v + size`.
fn subtree(v: usize, n: usize) -> usize {
    if v == 0 {
        n
    } else {
        lowbit(v).min(n - v)
    }
}

/// Binomial gather: every rank collects its subtree's blocks (contiguous in virtual order)
/// in scratch and passes them up in one message; the children of the root send theirs in
/// real order (split where it wraps) so that they land in place in the root's buffer.
fn gather(b: &mut ScheduleBuilder, s: &Shape, rank: usize) {
    let (n, e) = (s.size, s.elem());
    let block = s.count * e;
    let v = (rank + n - s.root) % n;
    let kids: Vec<usize> = (0..usize::BITS)
        .map(|k| 1usize << k)
        .take_while(|&d| v == 0 || d < lowbit(v))
        .take_while(|&d| v + d < n)
        .collect();
    let real = |x: usize| (x + s.root) % n;
    if v == 0 {
        b.copy(
            Region::new(Buf::Recv, rank * block, block),
            s.input(rank, 0, block),
        );
        for &d in &kids {
            for (_, at, len) in real_runs(d, subtree(d, n), s.root, n) {
                b.recv(real(d), Region::new(Buf::Recv, at * block, len * block));
            }
        }
        return;
    }
    let parent = real(v & (v - 1));
    let size = subtree(v, n);
    if size == 1 {
        b.send(parent, s.input(rank, 0, block));
        return;
    }
    b.copy(Region::new(Buf::Scratch, 0, block), s.input(rank, 0, block));
    for &d in &kids {
        b.recv(
            real(v + d),
            Region::new(Buf::Scratch, d * block, subtree(v + d, n) * block),
        );
    }
    if lowbit(v) == v {
        for (from, _, len) in real_runs(v, size, s.root, n) {
            b.send(
                parent,
                Region::new(Buf::Scratch, (from - v) * block, len * block),
            );
        }
    } else {
        b.send(parent, Region::new(Buf::Scratch, 0, size * block));
    }
}

/// Binomial scatter: the reverse of [`gather`], largest subtree first.
fn scatter(b: &mut ScheduleBuilder, s: &Shape, rank: usize) {
    let (n, e) = (s.size, s.elem());
    let block = s.count * e;
    let v = (rank + n - s.root) % n;
    let kids: Vec<usize> = (0..usize::BITS)
        .map(|k| 1usize << k)
        .take_while(|&d| v == 0 || d < lowbit(v))
        .take_while(|&d| v + d < n)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let real = |x: usize| (x + s.root) % n;
    if v == 0 {
        let src = if s.in_place_at(rank) {
            Buf::Recv
        } else {
            Buf::Send
        };
        for &d in &kids {
            for (_, at, len) in real_runs(d, subtree(d, n), s.root, n) {
                b.send(real(d), Region::new(src, at * block, len * block));
            }
        }
        if src == Buf::Send {
            b.copy(
                Region::new(Buf::Recv, 0, block),
                Region::new(Buf::Send, rank * block, block),
            );
        }
        return;
    }
    let parent = real(v & (v - 1));
    let size = subtree(v, n);
    if size == 1 {
        b.recv(parent, Region::new(Buf::Recv, 0, block));
        return;
    }
    if lowbit(v) == v {
        for (from, _, len) in real_runs(v, size, s.root, n) {
            b.recv(
                parent,
                Region::new(Buf::Scratch, (from - v) * block, len * block),
            );
        }
    } else {
        b.recv(parent, Region::new(Buf::Scratch, 0, size * block));
    }
    for &d in &kids {
        b.send(
            real(v + d),
            Region::new(Buf::Scratch, d * block, subtree(v + d, n) * block),
        );
    }
    b.copy(
        Region::new(Buf::Recv, 0, block),
        Region::new(Buf::Scratch, 0, block),
    );
}

/// Double binary trees; see the module docs.
pub(crate) struct DoubleBinaryTree;

impl Algorithm for DoubleBinaryTree {
    fn name(&self) -> &'static str {
        "dbtree"
    }

    fn supports(&self, kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce
        )
    }

    fn cost(&self, s: &Shape, topo: &Topology, m: &CostModel) -> Option<f64> {
        if !self.supports(s.kind) {
            return None;
        }
        let (alpha, beta) = m.worst_link(topo);
        let h = double_binary_height(s.size);
        let hops = if s.kind == CollKind::AllReduce {
            2 * h
        } else {
            h
        };
        let (c, ch) = chunking(s.count, s.elem(), hops);
        let hf = h as f64;
        // The first chunk crosses the trees' height in half-chunk messages; after it, each
        // chunk costs an interior rank two half-chunk messages per direction it carries.
        let fill = |g: f64| alpha + ch / 2.0 * (beta + g);
        let rest = (c - 1.0).max(0.0);
        Some(match s.kind {
            CollKind::Broadcast => hf * fill(0.0) + rest * (2.0 * alpha + ch * beta),
            CollKind::Reduce => hf * fill(m.gamma) + rest * (2.0 * alpha + ch * (beta + m.gamma)),
            _ => 2.0 * hf * fill(m.gamma) + rest * (4.0 * alpha + ch * (2.0 * beta + m.gamma)),
        })
    }

    fn schedule(&self, s: &Shape, rank: usize, _topo: &Topology) -> Schedule {
        let mut b = ScheduleBuilder::new();
        let all: Vec<usize> = (0..s.size).collect();
        let e = s.elem();
        let (flow, root) = match s.kind {
            CollKind::AllReduce => (Flow::UpDown, 0),
            CollKind::Broadcast => (Flow::Down, s.root),
            _ => (Flow::Up, s.root),
        };
        let recv = Loc::of(s.output(rank, 0, 0));
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
        let h = double_binary_height(s.size);
        let chunks = chunks(s.count, e, if flow == Flow::UpDown { 2 * h } else { h });
        let stages: Vec<Stage> = double_binary(&all, root, rank)
            .into_iter()
            .zip([Piece::First, Piece::Second])
            .map(|(node, piece)| {
                let down = |depth| {
                    if flow == Flow::UpDown {
                        updown_lag(0, depth)
                    } else {
                        0
                    }
                };
                Stage::new(
                    node,
                    flow,
                    piece,
                    Loc::of(s.input(rank, 0, 0)),
                    acc,
                    0,
                    down,
                )
            })
            .collect();
        run_stages(&mut b, &stages, &chunks, e, base);
        b.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DataType, ReduceOp};

    #[test]
    fn binary_trees_are_consistent_and_complementary() {
        for n in 1..80 {
            let all: Vec<usize> = (0..n).collect();
            for root in [0, n / 2, n - 1] {
                let nodes: Vec<[TreeNode; 2]> =
                    (0..n).map(|r| double_binary(&all, root, r)).collect();
                for t in 0..2 {
                    let mut reached = 0;
                    for (r, node) in nodes.iter().enumerate() {
                        let node = &node[t];
                        assert!(node.depth <= double_binary_height(n), "n={n} r={r}");
                        for &c in &node.children {
                            assert_eq!(nodes[c][t].parent, Some(r), "n={n} tree {t}");
                            assert_eq!(nodes[c][t].depth, node.depth + 1);
                        }
                        reached += node.children.len();
                        assert_eq!(node.parent.is_none(), r == root);
                    }
                    assert_eq!(reached, n - 1, "every rank but the root has a parent");
                }
                let both = (0..n)
                    .filter(|&r| r != root && nodes[r].iter().all(|x| !x.children.is_empty()))
                    .count();
                assert_eq!(both, 0, "n={n}: a rank is interior in both trees");
            }
        }
    }

    #[test]
    fn binomial_tree_is_consistent() {
        for n in 1..70 {
            let all: Vec<usize> = (0..n).collect();
            let nodes: Vec<TreeNode> = (0..n).map(|r| binomial(&all, 3 % n, r)).collect();
            for (r, node) in nodes.iter().enumerate() {
                for &c in &node.children {
                    assert_eq!(nodes[c].parent, Some(r));
                }
            }
            assert_eq!(nodes.iter().map(|x| x.children.len()).sum::<usize>(), n - 1);
        }
    }

    #[test]
    fn sweep() {
        super::super::testing::sweep(&Tree);
        super::super::testing::sweep(&DoubleBinaryTree);
    }

    #[test]
    fn large_communicators_and_pipelined_buffers() {
        for algo in [&Tree as &dyn Algorithm, &DoubleBinaryTree] {
            for kind in [
                CollKind::AllReduce,
                CollKind::Broadcast,
                CollKind::Reduce,
                CollKind::Gather,
                CollKind::Scatter,
            ] {
                if !algo.supports(kind) {
                    continue;
                }
                for (n, count) in [
                    (31, 0),
                    (31, 1),
                    (31, 100),
                    (64, 65),
                    (37, 7),
                    (5, 200_001),
                    (12, 150_000),
                ] {
                    for in_place in [false, true] {
                        let in_place = in_place && super::super::testing::has_in_place(kind);
                        let root = (n / 3) % n;
                        let r = super::super::testing::check(
                            algo,
                            kind,
                            n,
                            count,
                            root,
                            DataType::Int32,
                            ReduceOp::Sum,
                            in_place,
                            1 + n % 3,
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
}
