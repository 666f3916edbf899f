//! What operators see of a running rank: the statistics segment `hcomm_profiler` reads
//! ([`stats`]), warnings about operations that wait too long (`stall`) and Chrome traces
//! (`trace`, `HCOMM_TRACE`) and the flight recorder of each communicator's last calls
//! ([`flight`], `HCOMM_TRACE_BUFFER`).
//!
//! The communicator brackets every operation with an [`OpScope`]; the executor and the wait
//! loops say which step and which peer they wait for. Everything here is below the engine
//! and the communicator and knows nothing of them.

pub(crate) mod clock;
pub(crate) mod flight;
pub(crate) mod stall;
pub(crate) mod stats;
pub(crate) mod trace;

use crate::config::{Config, Secret};
use stats::{OpInfo, Recording};

/// Starts observing a new world of this process (rank `rank` of `size`): stall warnings as
/// `config` says, the trace of `HCOMM_TRACE`, and the statistics segment, which lives until
/// the last world's registration is dropped (then the trace is written too).
pub(crate) fn attach(config: &Config, rank: usize, size: usize) -> stats::Registration {
    stall::configure(config.stall_warn, config.log_level.is_none(), rank);
    if let Some(path) = &config.trace {
        trace::start(path, rank);
    }
    let job_id = crate::transport::shm::link::job_id(
        config
            .job_secret
            .as_ref()
            .map(Secret::expose)
            .unwrap_or_default(),
        config.launch.root_addr.as_deref().unwrap_or_default(),
        0,
    );
    flight::configure(config.trace_buffer, &config.trace_dir, &job_id, rank, size);
    stats::register(&job_id, rank, size)
}

/// Kinds of operations counted apart: the collectives, in [`crate::coll::CollKind`] order,
/// then point-to-point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum OpKind {
    /// All-reduce.
    AllReduce,
    /// Broadcast.
    Broadcast,
    /// Reduce.
    Reduce,
    /// All-gather.
    AllGather,
    /// All-gather with counts per rank.
    AllGatherV,
    /// Reduce-scatter.
    ReduceScatter,
    /// All-to-all.
    AllToAll,
    /// All-to-all with counts per rank.
    AllToAllV,
    /// Gather.
    Gather,
    /// Scatter.
    Scatter,
    /// Barrier.
    Barrier,
    /// Blocking send.
    Send,
    /// Blocking receive.
    Recv,
    /// Send and receive at once.
    SendRecv,
    /// Nonblocking send (counted when started; not timed).
    Isend,
    /// Nonblocking receive (counted when started; not timed).
    Irecv,
}

/// Number of [`OpKind`]s.
pub const OP_KINDS: usize = 16;

impl OpKind {
    /// Every kind, by index.
    pub(crate) const ALL: [OpKind; OP_KINDS] = [
        OpKind::AllReduce,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::AllGather,
        OpKind::AllGatherV,
        OpKind::ReduceScatter,
        OpKind::AllToAll,
        OpKind::AllToAllV,
        OpKind::Gather,
        OpKind::Scatter,
        OpKind::Barrier,
        OpKind::Send,
        OpKind::Recv,
        OpKind::SendRecv,
        OpKind::Isend,
        OpKind::Irecv,
    ];

    /// The kind with index `i`.
    pub fn from_index(i: usize) -> Option<OpKind> {
        OpKind::ALL.get(i).copied()
    }

    /// The name in tables, logs and traces (the collectives' names are `HCOMM_ALGO`'s).
    pub fn name(self) -> &'static str {
        [
            "allreduce",
            "broadcast",
            "reduce",
            "allgather",
            "allgatherv",
            "reduce_scatter",
            "alltoall",
            "alltoallv",
            "gather",
            "scatter",
            "barrier",
            "send",
            "recv",
            "sendrecv",
            "isend",
            "irecv",
        ][self as usize]
    }

    /// Whether the kind is a collective.
    pub fn is_collective(self) -> bool {
        (self as usize) <= OpKind::Barrier as usize
    }
}

/// One operation, from its start to the end of this value's life: recorded in the
/// statistics segment and, with `HCOMM_TRACE`, in the trace.
pub(crate) struct OpScope {
    info: OpInfo,
    rec: Option<Recording>,
    /// Start of the trace event ([`clock::monotonic_ns`]), when tracing.
    traced: Option<u64>,
    /// The peer of a point-to-point operation (trace argument).
    peer: Option<usize>,
}

impl OpScope {
    /// Starts an operation: `kind` with sequence number (or tag) `seq` over `bytes` bytes on
    /// a communicator of `comm_size` ranks, running `algo` (packed with
    /// [`stats::pack_name`]) over the transports of `protocols` ([`stats::proto`] bits),
    /// a schedule of `steps` steps, talking to `peer` (point-to-point).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        kind: OpKind,
        seq: u64,
        bytes: u64,
        comm_size: usize,
        algo: [u64; 3],
        protocols: u64,
        steps: usize,
        peer: Option<usize>,
    ) -> OpScope {
        let info = OpInfo {
            kind,
            seq,
            bytes,
            comm_size,
            algo,
            protocols,
            steps,
        };
        let rec = stats::start(&info);
        OpScope {
            info,
            rec,
            traced: trace::enabled().then(clock::monotonic_ns),
            peer,
        }
    }

    /// The operation is now known better: its sequence number, algorithm, protocols and
    /// steps (a collective, once planned).
    pub(crate) fn planned(&mut self, seq: u64, algo: [u64; 3], protocols: u64, steps: usize) {
        self.info.seq = seq;
        self.info.algo = algo;
        self.info.protocols = protocols;
        self.info.steps = steps;
        stats::update(self.rec.as_ref(), &self.info);
    }
}

impl Drop for OpScope {
    #[inline]
    fn drop(&mut self) {
        stats::finish(self.rec.take(), &self.info);
        if let Some(start) = self.traced {
            trace::record(start, &self.info, self.peer);
        }
    }
}

/// The executor waits for step `step` (from 0) of its schedule, a transfer with rank `peer`
/// of the communicator (and no longer blocks in an earlier wait).
#[inline]
pub(crate) fn waiting_for_step(step: usize, peer: Option<usize>) {
    stats::with_flight(|f| {
        use std::sync::atomic::Ordering::Relaxed;
        f.step.store(step as u64 + 1, Relaxed);
        f.waiting_since.store(0, Relaxed);
        if let Some(p) = peer {
            f.peer.store(p as u64 + 1, Relaxed);
        }
    });
}

/// The member (rank in the communicator) the current operation of this thread last waited
/// for, as the statistics segment has it (`None` without one).
#[inline]
pub(crate) fn waited_for() -> Option<usize> {
    let mut peer = None;
    stats::with_flight(|f| {
        let p = f.peer.load(std::sync::atomic::Ordering::Relaxed);
        peer = p.checked_sub(1).and_then(|p| usize::try_from(p).ok());
    });
    peer
}

/// A wait of the current operation starts to block on rank `peer` of the communicator (the
/// slow path: called once per blocking wait, never for operations that finish at once).
pub(crate) fn blocked_on(peer: usize) {
    stats::with_flight(|f| {
        use std::sync::atomic::Ordering::Relaxed;
        f.peer.store(peer as u64 + 1, Relaxed);
        f.waiting_since.store(clock::ticks(), Relaxed);
    });
}
