//! The communicator as the collectives that run outside schedules see it: a [`Group`] and a
//! [`Tier`].

use std::time::Duration;

use super::{Communicator, COLL};
use crate::coll::algos::hier::tiered::Tier;
use crate::coll::{Group, Shape};
use crate::error::Result;
use crate::p2p::Engine;
use crate::topology::Topology;
use crate::transport::shm::pool::{PoolMem, ShmPool};

impl Group for Communicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn members(&self) -> &[usize] {
        &self.members
    }

    fn id(&self) -> u64 {
        self.id
    }

    fn coll_id(&self) -> u64 {
        self.id | COLL
    }

    fn engine(&self) -> &Engine {
        &self.world.engine
    }

    fn pool(&self) -> Option<&ShmPool> {
        self.world.pool.as_deref()
    }

    fn pool_mem(&self, len: usize) -> Option<PoolMem> {
        PoolMem::alloc_in(self.world.pool.as_ref()?, len)
    }

    fn spin(&self) -> bool {
        self.world.spin
    }

    fn cores(&self) -> usize {
        self.topology.local_cores(self.rank)
    }

    fn timeout(&self) -> Duration {
        self.world.config.timeout
    }

    fn all_agree(&self, ok: bool) -> Result<bool> {
        Communicator::all_agree(self, ok)
    }
}

impl Tier for Communicator {
    fn topology(&self) -> &Topology {
        &self.topology
    }

    fn split(&self, color: i32, key: i32) -> Result<Option<Self>> {
        Communicator::split(self, color, key)
    }

    fn run_collective(&self, shape: Shape, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        Communicator::run_collective(self, shape, send, recv)
    }

    fn abort(&self) -> Result<()> {
        Communicator::abort(self)
    }
}
