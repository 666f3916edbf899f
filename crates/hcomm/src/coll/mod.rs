//! Collectives as schedules: the shapes of collective calls, the algorithms that turn a shape
//! into each rank's [`Schedule`], and a sequential reference.
//!
//! Algorithms touch no socket: the executor (`exec`) runs schedules over the progress engine,
//! the simulator ([`sim`]) runs them in one process for tests.
//!
//! No unsafe code here: buffers reach the engine as `p2p::lease::Lease`s, and the one-sided
//! collectives reach shared memory through `transport::shm::board`.

#![forbid(unsafe_code)]

pub(crate) mod algos;
pub(crate) mod exec;
mod group;
pub(crate) mod onesided;
pub(crate) mod random;
pub(crate) mod reference;
pub(crate) mod schedule;
pub(crate) mod select;
#[cfg(test)]
pub(crate) mod sim;

use std::sync::Arc;

use crate::dtype::{DataType, ReduceOp};
use crate::topology::Topology;
pub(crate) use group::Group;
use schedule::{Buf, Region, Schedule};

/// Bits of a signature's second word that hold the count (the top byte names the algorithm).
const COUNT_MASK: u64 = (1 << 56) - 1;

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CollKind {
    /// Every rank gets the reduction of every rank's buffer.
    AllReduce = 1,
    /// The root's buffer is copied to every rank.
    Broadcast = 2,
    /// The root gets the reduction of every rank's buffer.
    Reduce = 3,
    /// Every rank gets every rank's buffer, concatenated in rank order.
    AllGather = 4,
    /// All-gather with a count per rank.
    AllGatherV = 5,
    /// Rank r gets block r of the reduction of every rank's buffer.
    ReduceScatter = 6,
    /// Rank r sends block p of its buffer to rank p, and receives block p from rank p.
    AllToAll = 7,
    /// All-to-all with counts and displacements per peer.
    AllToAllV = 8,
    /// The root gets every rank's buffer, concatenated in rank order.
    Gather = 9,
    /// Rank r gets block r of the root's buffer.
    Scatter = 10,
    /// No rank leaves before every rank has entered.
    Barrier = 11,
}

impl CollKind {
    /// Every collective.
    pub const ALL: [CollKind; 11] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::AllGatherV,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::AllToAllV,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Barrier,
    ];

    /// The name used by `HCOMM_ALGO`, hcomm_perf and messages.
    pub fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "allreduce",
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::AllGather => "allgather",
            CollKind::AllGatherV => "allgatherv",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "alltoall",
            CollKind::AllToAllV => "alltoallv",
            CollKind::Gather => "gather",
            CollKind::Scatter => "scatter",
            CollKind::Barrier => "barrier",
        }
    }

    /// The collective called `name`.
    pub fn from_name(name: &str) -> Option<CollKind> {
        CollKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the collective reduces (uses the data type's arithmetic and the op).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
        )
    }

    /// Whether the collective has a root.
    pub fn rooted(self) -> bool {
        matches!(
            self,
            CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
        )
    }
}

/// Per-peer counts and displacements (in elements) of a v-collective, as this rank sees
/// them. For all-gather-v, `recv` is the same on every rank and `send` is unused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct VLayout {
    /// Elements sent to each peer, and where they start in the send buffer.
    pub send_counts: Vec<usize>,
    /// Displacements of `send_counts`.
    pub send_displs: Vec<usize>,
    /// Elements received from each peer, and where they go in the receive buffer.
    pub recv_counts: Vec<usize>,
    /// Displacements of `recv_counts`.
    pub recv_displs: Vec<usize>,
}

/// Everything that determines one rank's schedule of a collective call: the cache key.
///
/// In-place calls (`in_place`) have one buffer, the receive buffer: all-reduce, reduce and
/// all-to-all read their input from it; all-gather and gather from the rank's own block of
/// it; reduce-scatter reads all blocks and leaves the result in block `rank`; scatter's root
/// keeps its block in place. Only the root of reduce, gather and scatter works in place
/// ([`Shape::in_place_at`]). `Shape::input` and `Shape::output` give the regions.
///
/// `count` is in elements: the buffer of all-reduce, broadcast and reduce; what each rank
/// contributes to all-gather and gather; what each rank receives from reduce-scatter and
/// scatter; the block per peer of all-to-all.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Which collective.
    pub kind: CollKind,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (meaningful only for reducing collectives).
    pub op: ReduceOp,
    /// Elements, as above.
    pub count: usize,
    /// Root rank of rooted collectives, 0 otherwise.
    pub root: usize,
    /// Ranks in the communicator.
    pub size: usize,
    /// Counts of v-collectives.
    pub v: Option<Arc<VLayout>>,
    /// The send buffer is the receive buffer.
    pub in_place: bool,
}

impl Shape {
    /// A shape without v-layout, not in place.
    pub fn new(
        kind: CollKind,
        dtype: DataType,
        op: ReduceOp,
        count: usize,
        root: usize,
        size: usize,
    ) -> Shape {
        Shape {
            kind,
            dtype,
            op,
            count,
            root,
            size,
            v: None,
            in_place: false,
        }
    }

    /// Bytes of one element.
    pub fn elem(&self) -> usize {
        self.dtype.size()
    }

    /// Bytes of the send buffer of `rank` (0 when it has none).
    #[inline]
    pub fn send_bytes(&self, rank: usize) -> usize {
        let (n, c, e) = (self.size, self.count, self.elem());
        match self.kind {
            CollKind::AllReduce | CollKind::Reduce | CollKind::AllGather | CollKind::Gather => {
                c * e
            }
            CollKind::ReduceScatter | CollKind::AllToAll => n * c * e,
            CollKind::Scatter if rank == self.root => n * c * e,
            CollKind::AllGatherV => self.v.as_ref().map_or(0, |v| v.recv_counts[rank] * e),
            CollKind::AllToAllV => self
                .v
                .as_ref()
                .map_or(0, |v| span(&v.send_counts, &v.send_displs) * e),
            CollKind::Broadcast | CollKind::Scatter | CollKind::Barrier => 0,
        }
    }

    /// Bytes of the receive buffer of `rank` (0 when it has none).
    #[inline]
    pub fn recv_bytes(&self, rank: usize) -> usize {
        let (n, c, e) = (self.size, self.count, self.elem());
        match self.kind {
            CollKind::ReduceScatter if self.in_place => n * c * e,
            CollKind::Scatter if self.in_place && rank == self.root => n * c * e,
            CollKind::AllReduce
            | CollKind::Broadcast
            | CollKind::ReduceScatter
            | CollKind::Scatter => c * e,
            CollKind::Reduce if rank == self.root => c * e,
            CollKind::AllGather | CollKind::AllToAll => n * c * e,
            CollKind::Gather if rank == self.root => n * c * e,
            CollKind::AllGatherV | CollKind::AllToAllV => self
                .v
                .as_ref()
                .map_or(0, |v| span(&v.recv_counts, &v.recv_displs) * e),
            CollKind::Reduce | CollKind::Gather | CollKind::Barrier => 0,
        }
    }

    /// Whether `rank` works in place: every rank of an in-place call, except that only the
    /// root of reduce, gather and scatter does (the others have a normal send buffer).
    pub fn in_place_at(&self, rank: usize) -> bool {
        let root_only = matches!(
            self.kind,
            CollKind::Reduce | CollKind::Gather | CollKind::Scatter
        );
        self.in_place && (!root_only || rank == self.root)
    }

    /// Bytes `off..off + len` of `rank`'s contribution: its send buffer, or where an in-place
    /// call keeps the input in the receive buffer (all-gather and gather: at the rank's
    /// block; the rest: from the start).
    pub(crate) fn input(&self, rank: usize, off: usize, len: usize) -> Region {
        if !self.in_place_at(rank) {
            return Region::new(Buf::Send, off, len);
        }
        let at = match self.kind {
            CollKind::AllGather | CollKind::Gather => rank * self.count * self.elem(),
            CollKind::AllGatherV => self
                .v
                .as_ref()
                .map_or(0, |v| v.recv_displs[rank] * self.elem()),
            _ => 0,
        };
        Region::new(Buf::Recv, at + off, len)
    }

    /// Bytes `off..off + len` of `rank`'s result of reduce-scatter: its receive buffer, or
    /// block `rank` of the buffer of an in-place call. For every other collective the
    /// receive buffer itself.
    pub(crate) fn output(&self, rank: usize, off: usize, len: usize) -> Region {
        let at = match self.kind {
            CollKind::ReduceScatter if self.in_place => rank * self.count * self.elem(),
            _ => 0,
        };
        Region::new(Buf::Recv, at + off, len)
    }

    /// The compact signature every message of the call carries, so that ranks calling
    /// different collectives, types, ops, counts or roots are told apart.
    pub(crate) fn signature(&self) -> [u64; 2] {
        let total = match &self.v {
            Some(v) => v.recv_counts.iter().sum::<usize>() as u64,
            None => self.count as u64,
        };
        let count = if self.kind == CollKind::AllToAllV {
            0
        } else {
            total & COUNT_MASK
        };
        let op = if self.kind.reduces() {
            self.op as u64
        } else {
            0xff
        };
        [
            (self.kind as u64) << 56
                | (self.dtype as u64) << 48
                | op << 40
                | (self.root as u64 & 0xff_ffff_ffff),
            count,
        ]
    }

    /// [`Shape::signature`] with the algorithm that runs the call (its index in
    /// [`algos::all`]), so that ranks configured with different `HCOMM_ALGO` are told apart
    /// too.
    pub(crate) fn signature_with(&self, algorithm: usize) -> [u64; 2] {
        let [a, b] = self.signature();
        [a, b | ((algorithm as u64 + 1) & 0xff) << 56]
    }

    /// Describes a signature for error messages.
    pub(crate) fn describe_signature(sig: [u64; 2]) -> String {
        let kind = CollKind::ALL
            .into_iter()
            .find(|k| *k as u64 == sig[0] >> 56);
        let dtype = DataType::ALL
            .into_iter()
            .find(|d| *d as u64 == (sig[0] >> 48) & 0xff);
        let op = ReduceOp::ALL
            .into_iter()
            .find(|o| *o as u64 == (sig[0] >> 40) & 0xff);
        let root = sig[0] & 0xff_ffff_ffff;
        match (kind, dtype) {
            (Some(k), Some(d)) => {
                let op = match op {
                    Some(o) if k.reduces() => format!(" {}", o.name()),
                    _ => String::new(),
                };
                let root = if k.rooted() {
                    format!(" root {root}")
                } else {
                    String::new()
                };
                let algo = match (sig[1] >> 56) as usize {
                    0 => String::new(),
                    i => algos::all()
                        .get(i - 1)
                        .map_or_else(String::new, |a| format!(" via {}", a.name())),
                };
                format!(
                    "{}({} x {}{op}{root}{algo})",
                    k.name(),
                    sig[1] & COUNT_MASK,
                    d.name()
                )
            }
            _ => format!("an unknown operation {sig:x?}"),
        }
    }
}

/// Elements spanned by blocks at `displs` of `counts`.
fn span(counts: &[usize], displs: &[usize]) -> usize {
    counts
        .iter()
        .zip(displs)
        .map(|(c, d)| c + d)
        .max()
        .unwrap_or(0)
}

/// The α–β–γ cost model the selector compares algorithms with: a message of `b` bytes costs
/// `alpha + b * beta` seconds, reducing `b` bytes costs `b * gamma`. Between hosts the inter
/// values apply.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Latency of one message between ranks of one host, seconds.
    pub alpha_intra: f64,
    /// Seconds per byte between ranks of one host.
    pub beta_intra: f64,
    /// Latency of one message between hosts, seconds.
    pub alpha_inter: f64,
    /// Seconds per byte between hosts.
    pub beta_inter: f64,
    /// Seconds per byte reduced.
    pub gamma: f64,
}

impl CostModel {
    /// TCP: within a host over loopback (measured here: about 4 µs and 5 GB/s one way),
    /// between hosts over a network (assumed: 10 µs and 2.5 GB/s, a 25 GbE link); the
    /// reduction speed is that of the AVX2 kernels on DRAM-resident data.
    pub const TCP: CostModel = CostModel {
        alpha_intra: 4e-6,
        beta_intra: 1.0 / 5.0e9,
        alpha_inter: 10e-6,
        beta_inter: 1.0 / 2.5e9,
        gamma: 1.0 / 8.0e9,
    };

    /// Latency and per-byte time of a message over the slowest link the communicator has.
    pub fn worst_link(&self, topo: &Topology) -> (f64, f64) {
        if topo.num_hosts() > 1 {
            (self.alpha_inter, self.beta_inter)
        } else {
            (self.alpha_intra, self.beta_intra)
        }
    }
}

/// An algorithm: turns a shape into one rank's schedule.
pub trait Algorithm: Send + Sync {
    /// The name used by `HCOMM_ALGO`.
    fn name(&self) -> &'static str;
    /// Whether it implements `kind` (on any communicator; `cost` may still refuse a shape).
    fn supports(&self, kind: CollKind) -> bool;
    /// The schedule of `rank` for `shape` on a communicator laid out as `topo`.
    fn schedule(&self, shape: &Shape, rank: usize, topo: &Topology) -> Schedule;
    /// Estimated time of the whole call in seconds under `model`, or `None` when the
    /// algorithm does not suit this shape or topology (the selector then skips it; an
    /// explicit `HCOMM_ALGO` choice still runs it when `supports` says yes).
    fn cost(&self, shape: &Shape, topo: &Topology, model: &CostModel) -> Option<f64>;
}
