//! The hierarchical all-reduce of communicators spanning hosts, with one-sided host stages.
//!
//! The members of each host reduce into their host's first member (one-sided, through shared
//! memory: see `coll::onesided`), the first members all-reduce among themselves over the
//! network (the message-based algorithms), and each host's first member broadcasts the result
//! to its host (one-sided again). The two sub-communicators, one per host and one of the
//! hosts' first members, are split off at the first such call (every member makes it at the
//! same call).
//!
//! The schedule-based hierarchical algorithms of the parent module serve every other case
//! (no shared memory, deterministic mode, nonblocking calls).

use crate::coll::{CollKind, Group, Shape};
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::reduce;
use crate::topology::Topology;

/// A communicator as the tiered all-reduce uses it: it splits, runs collectives and aborts.
pub(crate) trait Tier: Group + Sized {
    /// Where the ranks of the communicator live.
    fn topology(&self) -> &Topology;
    /// The sub-communicator of the ranks with this `color`, ordered by `key` (collective);
    /// `None` for a negative color.
    fn split(&self, color: i32, key: i32) -> Result<Option<Self>>;
    /// Runs one blocking collective of `shape` on byte buffers.
    fn run_collective(&self, shape: Shape, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()>;
    /// Aborts the communicator.
    fn abort(&self) -> Result<()>;
}

/// The sub-communicators of a communicator spanning hosts.
pub(crate) struct Tiers<C> {
    /// The members on this host.
    host: C,
    /// The first member of every host; `None` on the others.
    leaders: Option<C>,
}

impl<C: Tier> Tiers<C> {
    /// Splits `comm` into its hosts and its hosts' first members (collective over `comm`).
    pub(crate) fn create(comm: &C) -> Result<Tiers<C>> {
        let topo = comm.topology();
        let me = comm.rank();
        let host = comm
            .split(topo.host_of(me) as i32, me as i32)?
            .ok_or_else(|| Error::internal("no host communicator"))?;
        let first = topo.local_rank(me) == 0;
        let leaders = comm.split(if first { 0 } else { -1 }, me as i32)?;
        Ok(Tiers { host, leaders })
    }

    /// Each sub-communicator this rank belongs to.
    pub(crate) fn each(&self) -> impl Iterator<Item = &C> {
        std::iter::once(&self.host).chain(self.leaders.as_ref())
    }

    /// Aborts the sub-communicators (see [`Communicator::abort`]).
    pub(crate) fn abort(&self) -> Result<()> {
        self.host.abort()?;
        match &self.leaders {
            Some(leaders) => leaders.abort(),
            None => Ok(()),
        }
    }

    /// Runs the all-reduce of `shape` on `comm` through the tiers: from `send` (`None` when
    /// the call is in place) into `recv`, each holding the shape's bytes.
    pub(crate) fn allreduce(
        &self,
        shape: &Shape,
        send: Option<&[u8]>,
        recv: &mut [u8],
    ) -> Result<()> {
        let bytes = shape.count * shape.elem();
        // Partial results are sums: an average divides once, at the end.
        let op = match shape.op {
            ReduceOp::Avg => ReduceOp::Sum,
            other => other,
        };
        let out = recv
            .get_mut(..bytes)
            .ok_or_else(|| Error::internal("the receive buffer is shorter than the call"))?;
        let input = match send.filter(|_| !shape.in_place) {
            Some(s) => Some(
                s.get(..bytes)
                    .ok_or_else(|| Error::internal("the send buffer is shorter than the call"))?,
            ),
            None => None,
        };
        let host_size = self.host.size();
        let first = self.host.rank() == 0;
        // 1. Reduce into the host's first member. There, in place when the call is (or its
        //    input is copied in first); elsewhere the input is wherever the caller has it.
        let reduce = Shape {
            in_place: first,
            ..Shape::new(CollKind::Reduce, shape.dtype, op, shape.count, 0, host_size)
        };
        if first {
            if let Some(input) = input {
                out.copy_from_slice(input);
            }
            self.host.run_collective(reduce, None, out)?;
        } else {
            let mine: &[u8] = match input {
                Some(input) => input,
                None => out,
            };
            self.host.run_collective(reduce, Some(mine), &mut [])?;
        }
        // 2. The hosts' first members combine their hosts' results.
        if let Some(leaders) = &self.leaders {
            let all = Shape {
                in_place: true,
                ..Shape::new(
                    CollKind::AllReduce,
                    shape.dtype,
                    op,
                    shape.count,
                    0,
                    leaders.size(),
                )
            };
            leaders.run_collective(all, None, out)?;
            if shape.op == ReduceOp::Avg {
                reduce::finish_avg(shape.dtype, out, shape.size)?;
            }
        }
        // 3. Each host's first member hands the result to its host.
        let bcast = Shape::new(
            CollKind::Broadcast,
            shape.dtype,
            shape.op,
            shape.count,
            0,
            host_size,
        );
        self.host.run_collective(bcast, None, out)
    }
}
