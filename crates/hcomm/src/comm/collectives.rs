//! The collective operations of a communicator: argument checks, planning (algorithm choice
//! and schedule, cached per call shape), execution, nonblocking and batched forms.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use super::{Communicator, Completion, Head, Plan, Plans, Request, RequestInner, COLL};
use crate::coll::algos::hier::tiered::Tiers;
use crate::coll::algos::onesided::OneSided as OneSidedAlgo;
use crate::coll::onesided::{OneSided, Outcome};
use crate::coll::schedule::{Schedule, Step};
use crate::coll::{exec, Algorithm, CollKind, Shape, VLayout};
use crate::dtype::{DataType, Element, ReduceOp};
use crate::error::{Error, NotEntered, Operation, PeerRank, Result};
use crate::observe::flight::{self, Call as FlightCall, Mark, Recorder};
use crate::observe::stats::{self, proto};
use crate::observe::{OpKind, OpScope};
use crate::p2p::lease::Lease;
use crate::reduce;
use crate::sync::lock;

/// The statistics' kind of a collective.
fn observe_kind(kind: CollKind) -> OpKind {
    match kind {
        CollKind::AllReduce => OpKind::AllReduce,
        CollKind::Broadcast => OpKind::Broadcast,
        CollKind::Reduce => OpKind::Reduce,
        CollKind::AllGather => OpKind::AllGather,
        CollKind::AllGatherV => OpKind::AllGatherV,
        CollKind::ReduceScatter => OpKind::ReduceScatter,
        CollKind::AllToAll => OpKind::AllToAll,
        CollKind::AllToAllV => OpKind::AllToAllV,
        CollKind::Gather => OpKind::Gather,
        CollKind::Scatter => OpKind::Scatter,
        CollKind::Barrier => OpKind::Barrier,
    }
}

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    T::as_bytes(s)
}

impl Plan {
    /// The schedule when a blocking call runs it (`None`: it runs one-sided or tiered).
    fn blocking_sched(&self) -> Option<Arc<Schedule>> {
        (!self.head.onesided && !self.head.tiered).then(|| Arc::clone(&self.sched))
    }
}

impl Plans {
    /// The plan of `shape`, made before: the last one used first, which it then is.
    fn find(&mut self, shape: &Shape) -> Option<&Arc<Plan>> {
        if !self.last.as_ref().is_some_and(|(last, _)| last == shape) {
            let plan = Arc::clone(self.by_shape.get(shape)?);
            self.last = Some((shape.clone(), plan));
        }
        self.last.as_ref().map(|(_, plan)| plan)
    }
}

impl Communicator {
    /// Another handle on this communicator (nonblocking collectives run on one).
    fn handle(&self) -> Communicator {
        Communicator {
            world: Arc::clone(&self.world),
            id: self.id,
            rank: self.rank,
            members: Arc::clone(&self.members),
            topology: Arc::clone(&self.topology),
            state: Arc::clone(&self.state),
            epoch: self.epoch,
        }
    }

    /// The cached plan for `shape`, made on first use.
    fn plan(&self, shape: &Shape) -> Result<Arc<Plan>> {
        self.plan_for(shape, true)
    }

    /// The head of the cached plan of `shape`, its schedule when the call runs it, and the
    /// call's sequence number, taken under the same lock (`None`: no plan yet): a repeated
    /// call touches no reference count when it runs one-sided.
    #[inline]
    fn cached(&self, shape: &Shape) -> Option<(Head, Option<Arc<Schedule>>, u32)> {
        let mut plans = lock(&self.state.plans);
        let plan = plans.find(shape)?;
        let (head, sched) = (plan.head, plan.blocking_sched());
        Some((head, sched, self.take_seq(&plans)))
    }

    /// The next collective's sequence number.
    fn next_seq(&self) -> u32 {
        let plans = lock(&self.state.plans);
        self.take_seq(&plans)
    }

    /// The next collective's sequence number, taken while `_plans` is held (its writers'
    /// lock: a load and a store instead of a locked addition).
    fn take_seq(&self, _plans: &MutexGuard<'_, Plans>) -> u32 {
        let seq = self.state.coll_seq.load(Ordering::Relaxed);
        self.state
            .coll_seq
            .store(seq.wrapping_add(1), Ordering::Relaxed);
        seq
    }

    /// The plan for `shape`; `make`: whether this call may set up the communicator's
    /// one-sided state (collective: every member waits for the others). A nonblocking start
    /// may not: two communicators whose first calls are nonblocking, started in opposite
    /// orders on two ranks, would each wait for the other's set-up. Its plan then takes the
    /// message algorithms and is not cached, so that the first blocking call sets the state up.
    fn plan_for(&self, shape: &Shape, make: bool) -> Result<Arc<Plan>> {
        // An aborted communicator fails before planning, which may talk to the peers.
        self.world.engine.check_aborted(self.id | COLL)?;
        let mut plans = lock(&self.state.plans);
        if let Some(p) = plans.find(shape) {
            return Ok(Arc::clone(p));
        }
        let selector = &self.world.selector;
        let forced = selector.forced(shape.kind);
        let mut algo = selector.choose(shape, &self.topology);
        let mut onesided = None;
        let mut unsettled = false;
        if shape.v.is_none() && forced.is_none_or(|a| a.name() == OneSidedAlgo.name()) {
            let state = if make {
                self.onesided()?
            } else {
                let slot = self.state.onesided.get();
                unsettled = slot.is_none();
                slot.cloned().flatten()
            };
            if let Some(os) = state.filter(|os| os.fits(shape)) {
                algo = &OneSidedAlgo;
                onesided = Some(os);
            }
        }
        // The hierarchical all-reduce of ranks on several hosts, some sharing one, with shared
        // memory inside them: its host stages run one-sided. Decided from what every rank sees
        // alike (the topology and the settings). Not in deterministic mode (it adds in host
        // order, not rank order).
        let tiered = shape.kind == CollKind::AllReduce
            && algo.name() == "hier"
            && !self.world.config.deterministic
            && self.topology.num_hosts() > 1
            && self.topology.num_hosts() < self.size()
            && self.world.config.transport.as_deref() != Some("tcp");
        let sched = Arc::new(algo.schedule(shape, self.rank, &self.topology));
        let slot = selector.slot(shape.kind, algo);
        let protocols = match (&onesided, tiered) {
            (Some(_), _) => proto::ONESIDED,
            (None, true) => proto::ONESIDED | self.schedule_protocols(&sched),
            (None, false) => self.schedule_protocols(&sched),
        };
        let plan = Arc::new(Plan {
            head: Head {
                algo,
                slot,
                onesided: onesided.is_some(),
                tiered,
                algo_name: stats::pack_name(algo.name()),
                protocols,
            },
            sched,
        });
        if unsettled {
            return Ok(plan);
        }
        // Bound the cache: a program sweeping sizes must not grow it forever.
        if plans.by_shape.len() >= 1024 {
            plans.by_shape.clear();
        }
        plans.by_shape.insert(shape.clone(), Arc::clone(&plan));
        plans.last = Some((shape.clone(), Arc::clone(&plan)));
        Ok(plan)
    }

    /// How the messages of a schedule travel (`proto` bits).
    fn schedule_protocols(&self, sched: &Schedule) -> u64 {
        sched
            .steps
            .iter()
            .filter_map(|s| match *s {
                Step::Send { peer, src: r } | Step::Recv { peer, dst: r } => {
                    let world = *self.members.get(peer)?;
                    Some(self.world.protocol(world, r.len))
                }
                _ => None,
            })
            .fold(0, |m, p| m | p)
    }

    /// The one-sided state of this communicator, made by its first caller (every member
    /// makes it at the same call).
    fn onesided(&self) -> Result<Option<Arc<OneSided>>> {
        if let Some(made) = self.state.onesided.get() {
            return Ok(made.clone());
        }
        let _making = lock(&self.state.onesided_making);
        if let Some(made) = self.state.onesided.get() {
            return Ok(made.clone());
        }
        let made = OneSided::create(self)?.map(Arc::new);
        // Set only here, under `onesided_making`: the slot is empty.
        let _ = self.state.onesided.set(made.clone());
        Ok(made)
    }

    /// The sub-communicators of the tiered all-reduce, made by the first call that needs them
    /// (every member makes them at the same call).
    fn tiers(&self) -> Result<Arc<Tiers<Communicator>>> {
        let mut slot = lock(&self.state.tiers);
        if let Some(t) = &*slot {
            return Ok(Arc::clone(t));
        }
        let made = Arc::new(Tiers::create(self)?);
        // They run parts of this communicator's calls: revoking it revokes them.
        for tier in made.each() {
            self.world
                .engine
                .add_part(self.id, tier.channel_ids(), tier.epoch);
        }
        *slot = Some(Arc::clone(&made));
        Ok(made)
    }

    /// The algorithm the selector picks for a call (what `HCOMM_ALGO` and the cost model
    /// decide), without running it.
    pub fn algorithm_for(
        &self,
        kind: CollKind,
        dtype: DataType,
        op: ReduceOp,
        count: usize,
        root: usize,
    ) -> &'static str {
        let shape = Shape::new(kind, dtype, op, count, root, self.size());
        self.plan(&shape).map_or("none", |p| p.head.algo.name())
    }

    /// Calls per (collective, algorithm) in this world so far.
    pub fn collective_counts(&self) -> Vec<(CollKind, &'static str, u64)> {
        self.world.selector.counts()
    }

    /// Runs any collective on byte buffers: the untyped form of the methods below (the C
    /// API and tools use it). `send` is `None` for in-place calls and for collectives without
    /// a send buffer; the buffers must hold at least what `shape` says
    /// ([`Shape::send_bytes`], [`Shape::recv_bytes`]), and `shape.size` must be this
    /// communicator's size.
    pub fn run_collective(&self, shape: Shape, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        self.check_buffers(&shape, send.map(<[u8]>::len), recv.len())?;
        self.run(
            &shape,
            send.map(Lease::from).as_ref(),
            &mut Lease::from(recv),
        )
    }

    /// Starts any collective in the background on owned buffers: the nonblocking form of
    /// [`Communicator::run_collective`]. [`Request::wait`] gives `recv` back with the result.
    /// Calls are matched in the order they are started.
    pub fn start_collective(
        &self,
        shape: Shape,
        send: Option<Vec<u8>>,
        recv: Vec<u8>,
    ) -> Result<Request> {
        self.start(shape, send.map(Lease::from), Lease::from(recv))
    }

    /// Starts a collective on its own thread, on owned or lent buffers.
    pub(super) fn start(
        &self,
        shape: Shape,
        send: Option<Lease<'static>>,
        mut recv: Lease<'static>,
    ) -> Result<Request> {
        let (_, recv_len) =
            self.check_buffers(&shape, send.as_ref().map(Lease::len), recv.len())?;
        let lent = !recv.is_owned() || send.as_ref().is_some_and(|s| !s.is_owned());
        // Plan and take the sequence number now: calls are matched in the order they are
        // made, whenever their threads run. They run the plan's schedule: one-sided calls
        // must run in call order on every rank.
        let planned = self.plan_for(&shape, false)?;
        let head = Head {
            onesided: false,
            tiered: false,
            protocols: self.schedule_protocols(&planned.sched),
            ..planned.head
        };
        let sched = Arc::clone(&planned.sched);
        let seq = self.next_seq();
        let mark = self.flight_post(&shape, self.call_bytes(&shape), Some(seq), true);
        let comm = self.handle();
        let name = shape.kind.name();
        let task = std::thread::Builder::new()
            .name(format!("hcomm-{name}"))
            .spawn(move || {
                let mut op = comm.record(&shape, comm.call_bytes(&shape));
                let result = comm.run_planned(
                    &mut op,
                    &shape,
                    (&head, Some(&sched)),
                    (seq, mark, true),
                    send.as_ref(),
                    &mut recv,
                );
                drop(op);
                comm.world.publish_counters();
                result.map(|()| Completion {
                    len: recv_len,
                    buffer: recv.into_vec(),
                    source: None,
                })
            })
            .map_err(|e| {
                Error::no_mem(format!(
                    "cannot start a thread for a nonblocking {name}: {e}"
                ))
                .with_source(e)
            })?;
        Ok(Request {
            inner: RequestInner::Task {
                handle: Some(task),
                lent,
            },
        })
    }

    /// Checks a call's shape and buffer lengths; returns the bytes of the send and receive
    /// buffers the call uses.
    fn check_buffers(
        &self,
        shape: &Shape,
        send: Option<usize>,
        recv: usize,
    ) -> Result<(usize, usize)> {
        let name = shape.kind.name();
        if shape.size != self.size() {
            return Err(Error::invalid_argument(format!(
                "{name}: the shape is for {} ranks but the communicator has {}",
                shape.size,
                self.size()
            )));
        }
        if shape.kind.rooted() && shape.root >= self.size() {
            return Err(Error::invalid_argument(format!(
                "{name}: root {} does not exist in a communicator of {} ranks",
                shape.root,
                self.size()
            )));
        }
        if shape.kind.reduces() && !shape.op.supports(shape.dtype) {
            return Err(Error::invalid_argument(format!(
                "{name}: {} is not defined on {} (the bitwise operations take integers and \
                 bool; avg takes numbers)",
                shape.op, shape.dtype
            )));
        }
        let total = shape
            .count
            .checked_mul(shape.elem())
            .and_then(|b| b.checked_mul(self.size()));
        if total.is_none_or(|t| t > isize::MAX as usize) {
            return Err(Error::invalid_argument(format!(
                "{name}: count {} is out of range",
                shape.count
            )));
        }
        if matches!(shape.kind, CollKind::AllGatherV | CollKind::AllToAllV) {
            let n = self.size();
            let v = shape.v.as_deref().ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{name}: the shape has no counts and displacements"
                ))
            })?;
            let lists = [&v.recv_counts, &v.recv_displs];
            let send_lists = [&v.send_counts, &v.send_displs];
            let needed: &[&Vec<usize>] = if shape.kind == CollKind::AllToAllV {
                &[lists[0], lists[1], send_lists[0], send_lists[1]]
            } else {
                &lists
            };
            if needed.iter().any(|l| l.len() != n) {
                return Err(Error::invalid_argument(format!(
                    "{name}: counts and displacements need {n} entries each"
                )));
            }
            // Every block must end inside the address space, so the byte arithmetic of the
            // schedules cannot overflow.
            let limit = (isize::MAX as usize) / shape.elem();
            let too_big = |c: &Vec<usize>, d: &Vec<usize>| {
                c.iter()
                    .zip(d)
                    .any(|(&c, &d)| c.checked_add(d).is_none_or(|e| e > limit))
            };
            if too_big(&v.recv_counts, &v.recv_displs)
                || (shape.kind == CollKind::AllToAllV && too_big(&v.send_counts, &v.send_displs))
            {
                return Err(Error::invalid_argument(format!(
                    "{name}: a count plus its displacement is out of range"
                )));
            }
        }
        let need_recv = shape.recv_bytes(self.rank);
        if recv < need_recv {
            return Err(Error::invalid_argument(format!(
                "{name}: the receive buffer holds {recv} bytes but the call needs {need_recv}"
            )));
        }
        let need_send = match send {
            Some(len) if !shape.in_place_at(self.rank) => {
                let need = shape.send_bytes(self.rank);
                if len < need {
                    return Err(Error::invalid_argument(format!(
                        "{name}: the send buffer holds {len} bytes but the call needs {need}"
                    )));
                }
                need
            }
            _ => 0,
        };
        Ok((need_send, need_recv))
    }

    /// Runs one call on checked buffers.
    fn run(&self, shape: &Shape, send: Option<&Lease<'_>>, recv: &mut Lease<'_>) -> Result<()> {
        // Recorded from before planning: the first call of a shape may wait for the peers
        // while it sets up (the one-sided segments).
        let bytes = self.call_bytes(shape);
        let mut op = self.record(shape, bytes);
        let mark = self.flight_post(shape, bytes, None, false);
        let planned = self
            .world
            .engine
            .check_aborted(self.id | COLL)
            .and_then(|()| {
                self.cached(shape).map_or_else(
                    || {
                        let plan = self.plan(shape)?;
                        Ok((plan.head, plan.blocking_sched(), self.next_seq()))
                    },
                    Ok,
                )
            });
        let (head, sched, seq) = match planned {
            Ok(p) => p,
            Err(e) => {
                if let (Some(r), Some(m)) = (&self.state.flight, mark) {
                    r.failed(m, &e, None);
                }
                return Err(e);
            }
        };
        let plan = (&head, sched.as_ref());
        let result = self.run_planned(&mut op, shape, plan, (seq, mark, false), send, recv);
        drop(op);
        self.world.publish_counters();
        result
    }

    /// Starts recording a call of `shape` moving `bytes` for the profiler, the stall warnings and
    /// the trace (sequence number and algorithm come with [`Communicator::run_planned`]).
    fn record(&self, shape: &Shape, bytes: u64) -> OpScope {
        let next = self.state.coll_seq.load(Ordering::Relaxed);
        OpScope::start(
            observe_kind(shape.kind),
            u64::from(next),
            bytes,
            self.size(),
            [0; 3],
            0,
            0,
            None,
        )
    }

    /// The bytes this rank sends or receives in a call of `shape`, the larger.
    fn call_bytes(&self, shape: &Shape) -> u64 {
        shape.send_bytes(self.rank).max(shape.recv_bytes(self.rank)) as u64
    }

    /// Records a call of `shape` moving `bytes` ([`Communicator::call_bytes`]) in the flight
    /// recorder (`seq`: its sequence number, when taken already; `nonblocking`: it runs in
    /// the background).
    #[inline]
    fn flight_post(
        &self,
        shape: &Shape,
        bytes: u64,
        seq: Option<u32>,
        nonblocking: bool,
    ) -> Option<Mark> {
        let r = self.state.flight.as_ref()?;
        let call = FlightCall {
            kind: observe_kind(shape.kind),
            dtype: shape.dtype,
            count: shape.count as u64,
            root: shape.kind.rooted().then_some(shape.root),
            bytes,
            nonblocking,
        };
        Some(r.post(&call, seq.map(u64::from)))
    }

    /// Runs a planned call (its plan's head and its schedule, `None` when the plan runs
    /// one-sided or tiered) with sequence number `seq` (flight recorder entry `mark`, of a
    /// call that is `nonblocking`), recorded by `op`, on buffers checked against `shape`. A call that times out or is
    /// abandoned names the members that never entered it, and dumps the flight recorder.
    fn run_planned(
        &self,
        op: &mut OpScope,
        shape: &Shape,
        plan: (&Head, Option<&Arc<Schedule>>),
        (seq, mark, nonblocking): (u32, Option<Mark>, bool),
        send: Option<&Lease<'_>>,
        recv: &mut Lease<'_>,
    ) -> Result<()> {
        let flight = self.state.flight.as_ref().zip(mark);
        if let Some((r, m)) = flight {
            r.started(m, u64::from(seq), nonblocking);
        }
        let result = self
            .run_schedule(op, shape, plan, seq, send, recv)
            .map_err(|e| self.diagnose(shape, seq, e));
        match &result {
            Ok(()) => {
                if let Some((r, m)) = flight {
                    r.completed(m);
                }
            }
            Err(e) => Self::flight_failed(flight, e),
        }
        result
    }

    /// Records the failure `e` of a call (in `flight`, its recorder and entry, when it has
    /// one) and dumps the flight recorder when the call timed out or was aborted.
    #[cold]
    fn flight_failed(flight: Option<(&Arc<Recorder>, Mark)>, e: &Error) {
        if let Some((r, m)) = flight {
            // The member waited for matters to a failed call (and costs a look-up).
            r.failed(m, e, crate::observe::waited_for());
        }
        match e {
            Error::Timeout(_) => flight::dump_on(flight::Reason::Timeout),
            Error::Aborted(_) => flight::dump_on(flight::Reason::Abort),
            _ => {}
        }
    }

    /// A call `seq` of `shape` failed with `e`: when it timed out or was abandoned (not when
    /// its communicator was aborted), asks every
    /// member how many collectives of this communicator it entered (a live member answers
    /// within a few heartbeat intervals: `Engine::ask_entered`) and names those that never
    /// entered it.
    fn diagnose(&self, shape: &Shape, seq: u32, e: Error) -> Error {
        // An aborted communicator (here or by a peer) is not a stuck rank: no question.
        let aborted = || self.world.engine.check_aborted(self.id | COLL).is_err();
        if !matches!(e, Error::Timeout(_) | Error::Aborted(_)) || aborted() {
            return e;
        }
        let entered = self.world.engine.ask_entered(self.id | COLL, &self.members);
        let ranks: Vec<PeerRank> = entered
            .iter()
            .enumerate()
            .filter(|(_, n)| n.is_some_and(|n| n <= u64::from(seq)))
            .map(|(r, _)| PeerRank::ranks(r, self.members[r]))
            .collect();
        if ranks.is_empty() {
            return e;
        }
        e.with_not_entered(NotEntered {
            comm: self.id,
            operation: Operation::seq(shape.kind.name(), u64::from(seq)),
            ranks,
            entered,
        })
    }

    /// Runs the schedule (or one-sided or tiered form) of a planned call `seq`: its plan's
    /// head and its schedule (`None`: the plan's, looked up when the call needs it).
    fn run_schedule(
        &self,
        op: &mut OpScope,
        shape: &Shape,
        (head, sched): (&Head, Option<&Arc<Schedule>>),
        seq: u32,
        send: Option<&Lease<'_>>,
        recv: &mut Lease<'_>,
    ) -> Result<()> {
        self.world.selector.count(head.slot);
        let steps = match (head.onesided, head.tiered, sched) {
            (false, false, Some(s)) => s.steps.len(),
            _ => 0,
        };
        op.planned(u64::from(seq), head.algo_name, head.protocols, steps);
        let sig = if self.world.config.mismatch_check {
            shape.signature_with(head.slot % crate::coll::algos::all().len())
        } else {
            [0; 2]
        };
        if head.onesided {
            let os = self
                .state
                .onesided
                .get()
                .and_then(Option::as_deref)
                .ok_or_else(|| Error::internal("a one-sided plan without one-sided state"))?;
            let outcome = os
                .run(self, shape, seq, sig, send, recv)
                .map_err(|e| self.explain(shape, seq, e))?;
            if outcome == Outcome::Done {
                return Ok(());
            }
            // Cross-memory attach may be refused on some member's buffers now: every member
            // runs the schedule below instead.
        }
        if head.tiered {
            let tiers = self.tiers()?;
            let send = send.filter(|_| !shape.in_place).map(Lease::as_slice);
            return tiers
                .allreduce(shape, send, recv.as_mut_slice()?)
                .and_then(|()| self.onesided_late())
                .map_err(|e| self.explain(shape, seq, e));
        }
        let planned;
        let sched = match sched {
            Some(s) => s,
            None => {
                planned = self.plan(shape)?;
                &planned.sched
            }
        };
        let deadline = Instant::now() + self.world.config.timeout;
        let call = exec::Call {
            sched,
            comm: self.id | COLL,
            tag: seq,
            sig,
            epoch: self.epoch,
            members: &self.members,
            dtype: shape.dtype,
            op: shape.op,
            in_place: shape.in_place_at(self.rank),
        };
        let need = sched.scratch;
        // Reuse the communicator's scratch unless another thread holds it.
        let mut scratch = match self.state.scratch.try_lock() {
            Ok(mut s) => std::mem::take(&mut *s),
            Err(_) => Vec::new(),
        };
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let result = exec::execute(
            &self.world.engine,
            &call,
            send,
            recv,
            &mut scratch[..need],
            deadline,
        );
        if let Ok(mut s) = self.state.scratch.try_lock() {
            if s.len() < scratch.len() {
                *s = scratch;
            }
        }
        result
            .and_then(|()| self.onesided_late())
            .map_err(|e| self.explain(shape, seq, e))?;
        let has_result = shape.kind != CollKind::Reduce || self.rank == shape.root;
        if shape.kind.reduces() && shape.op == ReduceOp::Avg && has_result {
            let region = shape.output(self.rank, 0, shape.count * shape.elem());
            let out = recv
                .as_mut_slice()?
                .get_mut(region.range())
                .ok_or_else(|| Error::internal("the output lies outside the receive buffer"))?;
            reduce::finish_avg(shape.dtype, out, self.size())?;
        }
        Ok(())
    }

    /// The mismatch of a one-sided call that this rank returned from before its peers had
    /// called (the root of a small broadcast), found after a call that ran its schedule
    /// ([`OneSided::check_late`]).
    fn onesided_late(&self) -> Result<()> {
        match self.state.onesided.get() {
            Some(Some(os)) => os.check_late(),
            _ => Ok(()),
        }
    }

    /// Prefixes an error with the call it interrupted (sequence number `seq`), which it
    /// names as its operation.
    fn explain(&self, shape: &Shape, seq: u32, e: Error) -> Error {
        let what = format!(
            "{} on rank {}",
            Shape::describe_signature(shape.signature()),
            self.rank
        );
        let e = e.with_operation(Operation::seq(shape.kind.name(), u64::from(seq)));
        match e {
            Error::Timeout(_) | Error::PeerLost(_) | Error::Transport(_) => e.prefixed(what),
            other => other,
        }
    }

    fn shape(
        &self,
        kind: CollKind,
        dtype: DataType,
        op: ReduceOp,
        count: usize,
        root: usize,
    ) -> Shape {
        Shape::new(kind, dtype, op, count, root, self.size())
    }

    fn blocks(&self, total: usize, what: &str) -> Result<usize> {
        if total % self.size() != 0 {
            return Err(Error::invalid_argument(format!(
                "{what}: a buffer of {total} elements cannot be cut into {} equal blocks",
                self.size()
            )));
        }
        Ok(total / self.size())
    }

    /// Every rank's `recv` becomes the elementwise `op` of every rank's `send`.
    pub fn allreduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let shape = self.shape(CollKind::AllReduce, T::DTYPE, op, send.len(), 0);
        T::with_bytes_mut(recv, |r| self.run_collective(shape, Some(bytes(send)), r))
    }

    /// [`Communicator::allreduce`] with the input in `buf`, replaced by the result.
    pub fn allreduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let shape = Shape {
            in_place: true,
            ..self.shape(CollKind::AllReduce, T::DTYPE, op, buf.len(), 0)
        };
        T::with_bytes_mut(buf, |r| self.run_collective(shape, None, r))
    }

    /// The root's `buf` is copied into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let shape = self.shape(
            CollKind::Broadcast,
            T::DTYPE,
            ReduceOp::Sum,
            buf.len(),
            root,
        );
        T::with_bytes_mut(buf, |r| self.run_collective(shape, None, r))
    }

    /// The root's `recv` becomes the elementwise `op` of every rank's `send`; `recv` is unused
    /// on the other ranks (it may be empty).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let shape = self.shape(CollKind::Reduce, T::DTYPE, op, send.len(), root);
        T::with_bytes_mut(recv, |r| self.run_collective(shape, Some(bytes(send)), r))
    }

    /// [`Communicator::reduce`] with each rank's input in `buf`; the root's `buf` receives
    /// the result.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let shape = Shape {
            in_place: true,
            ..self.shape(CollKind::Reduce, T::DTYPE, op, buf.len(), root)
        };
        if self.rank == root {
            T::with_bytes_mut(buf, |r| self.run_collective(shape, None, r))
        } else {
            self.run_collective(shape, Some(bytes(buf)), &mut [])
        }
    }

    /// Every rank's `recv` (size × `send.len()` elements) receives every rank's `send`, in
    /// rank order.
    pub fn allgather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let shape = self.shape(CollKind::AllGather, T::DTYPE, ReduceOp::Sum, send.len(), 0);
        T::with_bytes_mut(recv, |r| self.run_collective(shape, Some(bytes(send)), r))
    }

    /// [`Communicator::allgather`] where each rank's contribution already sits at its block
    /// of `buf`.
    pub fn allgather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.blocks(buf.len(), "allgather")?;
        let shape = Shape {
            in_place: true,
            ..self.shape(CollKind::AllGather, T::DTYPE, ReduceOp::Sum, count, 0)
        };
        T::with_bytes_mut(buf, |r| self.run_collective(shape, None, r))
    }

    /// All-gather with a count per rank: rank p's `send` (`counts[p]` elements) lands at
    /// `recv[displs[p]..]` on every rank.
    pub fn allgatherv<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<()> {
        let n = self.size();
        if counts.len() != n || displs.len() != n {
            return Err(Error::invalid_argument(format!(
                "allgatherv: counts and displs need {n} entries, got {} and {}",
                counts.len(),
                displs.len()
            )));
        }
        if send.len() != counts[self.rank] {
            return Err(Error::invalid_argument(format!(
                "allgatherv: rank {} sends {} elements but counts says {}",
                self.rank,
                send.len(),
                counts[self.rank]
            )));
        }
        let v = VLayout {
            recv_counts: counts.to_vec(),
            recv_displs: displs.to_vec(),
            ..VLayout::default()
        };
        let total: usize = counts.iter().sum();
        let shape = Shape {
            v: Some(Arc::new(v)),
            ..self.shape(CollKind::AllGatherV, T::DTYPE, ReduceOp::Sum, total, 0)
        };
        T::with_bytes_mut(recv, |r| self.run_collective(shape, Some(bytes(send)), r))
    }

    /// Rank r's `recv` becomes block r of the elementwise `op` of every rank's `send`
    /// (size × `recv.len()` elements).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let shape = self.shape(CollKind::ReduceScatter, T::DTYPE, op, recv.len(), 0);
        T::with_bytes_mut(recv, |r| self.run_collective(shape, Some(bytes(send)), r))
    }

    /// [`Communicator::reduce_scatter`] with the input in `buf` (size blocks); rank r's result
    /// replaces block r of `buf` (the other blocks are left undefined).
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.blocks(buf.len(), "reduce_scatter")?;
        let shape = Shape {
            in_place: true,
            ..self.shape(CollKind::ReduceScatter, T::DTYPE, op, count, 0)
        };
        T::with_bytes_mut(buf, |r| self.run_collective(shape, None, r))
    }

    /// Block p of every rank's `send` goes to rank p, which stores it at block (sender) of
    /// its `recv`.
    pub fn alltoall<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = self.blocks(send.len(), "alltoall")?;
        let shape = self.shape(CollKind::AllToAll, T::DTYPE, ReduceOp::Sum, count, 0);
        T::with_bytes_mut(recv, |r| self.run_collective(shape, Some(bytes(send)), r))
    }

    /// [`Communicator::alltoall`] with the input in `buf`, replaced by the result.
    pub fn alltoall_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.blocks(buf.len(), "alltoall")?;
        let shape = Shape {
            in_place: true,
            ..self.shape(CollKind::AllToAll, T::DTYPE, ReduceOp::Sum, count, 0)
        };
        T::with_bytes_mut(buf, |r| self.run_collective(shape, None, r))
    }

    /// All-to-all with counts and displacements (in elements) per peer.
    #[allow(clippy::too_many_arguments)]
    pub fn alltoallv<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let n = self.size();
        if [
            send_counts.len(),
            send_displs.len(),
            recv_counts.len(),
            recv_displs.len(),
        ]
        .iter()
        .any(|&l| l != n)
        {
            return Err(Error::invalid_argument(format!(
                "alltoallv: counts and displacements need {n} entries each"
            )));
        }
        let v = VLayout {
            send_counts: send_counts.to_vec(),
            send_displs: send_displs.to_vec(),
            recv_counts: recv_counts.to_vec(),
            recv_displs: recv_displs.to_vec(),
        };
        let shape = Shape {
            v: Some(Arc::new(v)),
            ..self.shape(CollKind::AllToAllV, T::DTYPE, ReduceOp::Sum, 0, 0)
        };
        T::with_bytes_mut(recv, |r| self.run_collective(shape, Some(bytes(send)), r))
    }

    /// The root's `recv` (size × `send.len()` elements) receives every rank's `send`, in rank
    /// order; `recv` is unused elsewhere (it may be empty).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let shape = self.shape(CollKind::Gather, T::DTYPE, ReduceOp::Sum, send.len(), root);
        T::with_bytes_mut(recv, |r| self.run_collective(shape, Some(bytes(send)), r))
    }

    /// Rank r's `recv` receives block r of the root's `send` (size × `recv.len()` elements;
    /// `send` is unused elsewhere and may be empty).
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let shape = self.shape(CollKind::Scatter, T::DTYPE, ReduceOp::Sum, recv.len(), root);
        let send = if self.rank == root {
            Some(bytes(send))
        } else {
            None
        };
        T::with_bytes_mut(recv, |r| self.run_collective(shape, send, r))
    }

    /// Starts an in-place all-reduce of `buf` (elements of `dtype`) in the background;
    /// [`Request::wait`] gives the buffer back with the result.
    pub fn iallreduce(&self, buf: Vec<u8>, dtype: DataType, op: ReduceOp) -> Result<Request> {
        self.nonblocking(CollKind::AllReduce, buf, dtype, op, 0)
    }

    /// Starts a broadcast of the root's `buf` (elements of `dtype`) in the background.
    pub fn ibroadcast(&self, buf: Vec<u8>, dtype: DataType, root: usize) -> Result<Request> {
        self.nonblocking(CollKind::Broadcast, buf, dtype, ReduceOp::Sum, root)
    }

    /// Starts a barrier in the background.
    pub fn ibarrier(&self) -> Result<Request> {
        self.nonblocking(
            CollKind::Barrier,
            Vec::new(),
            DataType::Uint8,
            ReduceOp::Sum,
            0,
        )
    }

    fn nonblocking(
        &self,
        kind: CollKind,
        buf: Vec<u8>,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<Request> {
        if buf.len() % dtype.size() != 0 {
            return Err(Error::invalid_argument(format!(
                "{}: {} bytes are not a whole number of {} elements",
                kind.name(),
                buf.len(),
                dtype.name()
            )));
        }
        let count = buf.len() / dtype.size();
        let shape = Shape {
            in_place: kind == CollKind::AllReduce,
            ..self.shape(kind, dtype, op, count, root)
        };
        self.start_collective(shape, None, buf)
    }

    /// A batch of small collectives run together: all-reduces with the same type and op are
    /// fused into one call, so a thousand small all-reduces cost about one.
    pub fn batch(&self) -> Batch<'_, '_> {
        Batch {
            comm: self,
            ops: Vec::new(),
        }
    }
}

/// Collectives collected by [`Communicator::batch`] and run by [`Batch::run`]. Every rank
/// must add the same operations in the same order.
pub struct Batch<'c, 'b> {
    comm: &'c Communicator,
    ops: Vec<BatchOp<'b>>,
}

enum BatchOp<'b> {
    AllReduce {
        buf: &'b mut [u8],
        dtype: DataType,
        op: ReduceOp,
    },
    Broadcast {
        buf: &'b mut [u8],
        root: usize,
    },
}

impl<'b> Batch<'_, 'b> {
    /// Adds an in-place all-reduce of `buf` (`bool` buffers: [`Batch::allreduce_bytes`]).
    pub fn allreduce<T: Element + bytemuck::Pod>(
        &mut self,
        buf: &'b mut [T],
        op: ReduceOp,
    ) -> &mut Self {
        self.ops.push(BatchOp::AllReduce {
            buf: bytemuck::cast_slice_mut(buf),
            dtype: T::DTYPE,
            op,
        });
        self
    }

    /// Adds a broadcast of the root's `buf` (`bool` buffers: [`Batch::broadcast_bytes`]).
    pub fn broadcast<T: Element + bytemuck::Pod>(
        &mut self,
        buf: &'b mut [T],
        root: usize,
    ) -> &mut Self {
        self.ops.push(BatchOp::Broadcast {
            buf: bytemuck::cast_slice_mut(buf),
            root,
        });
        self
    }

    /// Adds an in-place all-reduce of `buf`, elements of `dtype`: the untyped form of
    /// [`Batch::allreduce`] (the C API's grouped calls use it). Fails unless `buf` holds a
    /// whole number of elements.
    pub fn allreduce_bytes(
        &mut self,
        buf: &'b mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<&mut Self> {
        if buf.len() % dtype.size() != 0 {
            return Err(Error::invalid_argument(format!(
                "allreduce: {} bytes are not a whole number of {dtype} elements",
                buf.len()
            )));
        }
        self.ops.push(BatchOp::AllReduce { buf, dtype, op });
        Ok(self)
    }

    /// Adds a broadcast of the root's `buf`: the untyped form of [`Batch::broadcast`].
    pub fn broadcast_bytes(&mut self, buf: &'b mut [u8], root: usize) -> &mut Self {
        self.ops.push(BatchOp::Broadcast { buf, root });
        self
    }

    /// Runs the batch: one fused call per (all-reduce type and op) and per broadcast root,
    /// in order of first appearance.
    pub fn run(mut self) -> Result<()> {
        // Group keys in order of first appearance, identical on every rank.
        let mut keys: Vec<(u8, DataType, ReduceOp, usize)> = Vec::new();
        let key_of = |op: &BatchOp<'_>| match op {
            BatchOp::AllReduce { dtype, op, .. } => (0u8, *dtype, *op, 0usize),
            BatchOp::Broadcast { root, .. } => (1u8, DataType::Uint8, ReduceOp::Sum, *root),
        };
        for op in &self.ops {
            let k = key_of(op);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        for key in keys {
            let members: Vec<&mut BatchOp<'b>> =
                self.ops.iter_mut().filter(|o| key_of(o) == key).collect();
            let total: usize = members.iter().map(|o| o.buf().len()).sum();
            let mut packed = Vec::with_capacity(total);
            for m in &members {
                packed.extend_from_slice(m.buf());
            }
            let (kind, dtype, op, root) = key;
            let count = total / dtype.size();
            let kind = if kind == 0 {
                CollKind::AllReduce
            } else {
                CollKind::Broadcast
            };
            let shape = Shape {
                in_place: kind == CollKind::AllReduce,
                ..self.comm.shape(kind, dtype, op, count, root)
            };
            self.comm.run_collective(shape, None, &mut packed)?;
            let mut at = 0;
            for m in members {
                let b = m.buf_mut();
                b.copy_from_slice(&packed[at..at + b.len()]);
                at += b.len();
            }
        }
        Ok(())
    }
}

impl BatchOp<'_> {
    fn buf(&self) -> &[u8] {
        match self {
            BatchOp::AllReduce { buf, .. } | BatchOp::Broadcast { buf, .. } => buf,
        }
    }

    fn buf_mut(&mut self) -> &mut [u8] {
        match self {
            BatchOp::AllReduce { buf, .. } | BatchOp::Broadcast { buf, .. } => buf,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn calls_from_several_threads_take_every_sequence_number_once() {
        // The plan cache's lock guards the sequence number (a load and a store): calls of
        // three shapes in turn (the last plan, or one found by its shape), blocking and
        // nonblocking, from four threads at once must each take a number of their own.
        let comm = Communicator::init_with(Config::from_lookup(|_| None).unwrap()).unwrap();
        let (threads, calls) = (4, 200);
        std::thread::scope(|s| {
            for t in 0..threads {
                let comm = &comm;
                s.spawn(move || {
                    let mut a = [1u32; 4];
                    let mut b = [2u64; 16];
                    for i in 0..calls {
                        match (i + t) % 3 {
                            0 => comm.allreduce_in_place(&mut a, ReduceOp::Sum).unwrap(),
                            1 => comm.broadcast(&mut b, 0).unwrap(),
                            _ => {
                                let shape = Shape::new(
                                    CollKind::AllReduce,
                                    DataType::Uint32,
                                    ReduceOp::Max,
                                    4,
                                    0,
                                    1,
                                );
                                let done = comm
                                    .start_collective(shape, Some(vec![3; 16]), vec![0; 16])
                                    .unwrap()
                                    .wait()
                                    .unwrap();
                                assert_eq!(done.buffer, vec![3; 16]);
                            }
                        }
                    }
                    assert_eq!((a, b), ([1; 4], [2; 16]));
                });
            }
        });
        let taken = comm.state.coll_seq.load(Ordering::Relaxed);
        assert_eq!(taken, threads * calls);
    }
}
