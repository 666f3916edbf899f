//! What the collectives that run outside schedules (the one-sided ones, the tiered
//! all-reduce) need of their communicator, so that they live here, under the communicator.

use std::time::Duration;

use crate::error::Result;
use crate::p2p::Engine;
use crate::transport::shm::pool::{PoolMem, ShmPool};

/// The ranks of a communicator as the one-sided collectives see them.
pub(crate) trait Group {
    /// This rank in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// World rank of each member, by rank.
    fn members(&self) -> &[usize];
    /// The communicator's id (it names the one-sided segments).
    fn id(&self) -> u64;
    /// The id the frames of the communicator's collective calls carry.
    fn coll_id(&self) -> u64;
    /// The progress engine of the group's world.
    fn engine(&self) -> &Engine;
    /// This rank's shared-memory pool, if it has one.
    fn pool(&self) -> Option<&ShmPool>;
    /// `len` zeroed bytes of this rank's pool, if it has one with room.
    fn pool_mem(&self, len: usize) -> Option<PoolMem>;
    /// Whether waiting ranks may spin (the host has a core per local rank).
    fn spin(&self) -> bool;
    /// The cores this rank's host offers its local ranks
    /// ([`Topology::local_cores`](crate::topology::Topology::local_cores)).
    fn cores(&self) -> usize;
    /// `HCOMM_TIMEOUT`.
    fn timeout(&self) -> Duration;
    /// Whether every member says `ok` (collective over the group; each rank talks to about
    /// log2 of the members, not to all).
    fn all_agree(&self, ok: bool) -> Result<bool>;
}
