//! The name of the one-sided collectives of single-host communicators.
//!
//! They are not schedules of messages: the communicator runs them itself, reading and
//! reducing its peers' buffers in shared memory (see `coll::onesided`), whenever every member
//! is on this host with shared memory and the call fits. This entry lets `HCOMM_ALGO` ask for
//! them (`allreduce:onesided`) and lets counts and messages name them. Where they cannot run
//! (ranks on several hosts, `HCOMM_TRANSPORT=tcp`, a nonblocking call) the call runs the
//! direct algorithm's schedule instead; the cost model never picks this entry itself.

use super::direct::Direct;
use crate::coll::schedule::Schedule;
use crate::coll::{Algorithm, CollKind, CostModel, Shape};
use crate::topology::Topology;

/// See the module docs.
pub struct OneSided;

impl Algorithm for OneSided {
    fn name(&self) -> &'static str {
        "onesided"
    }

    fn supports(&self, kind: CollKind) -> bool {
        !matches!(kind, CollKind::AllGatherV | CollKind::AllToAllV)
    }

    fn schedule(&self, shape: &Shape, rank: usize, topo: &Topology) -> Schedule {
        Direct.schedule(shape, rank, topo)
    }

    fn cost(&self, _shape: &Shape, _topo: &Topology, _model: &CostModel) -> Option<f64> {
        None
    }
}
