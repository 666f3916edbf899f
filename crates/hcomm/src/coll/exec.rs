//! The executor: runs one rank's schedule of a collective over the progress engine.
//!
//! Steps are issued in program order as soon as the steps they depend on have finished:
//! transfers go to the engine as nonblocking operations (several in flight at once), local
//! copies and reductions run at once on the calling thread. When a step fails (a mismatch
//! detected by the engine, a lost peer, a timeout) the remaining operations are cancelled and
//! every peer of the schedule is told that this rank abandoned the collective, so that they
//! fail at once too instead of waiting out their timeout.

use std::time::Instant;

use smallvec::SmallVec;

use crate::coll::schedule::{Buf, Region, Schedule, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, PeerRank, Result};
use crate::p2p::lease::{Lease, Ops, Part};
use crate::p2p::{Blocking, Engine, OpId, Target};

/// Steps a schedule may have, and operations it may have in flight, before its bookkeeping
/// leaves the stack (a small call's schedule takes a few steps).
const SMALL_SCHEDULE: usize = 16;
/// The operations of a schedule in flight: step and operation.
type Pending = SmallVec<[(usize, OpId); SMALL_SCHEDULE]>;
/// The sizes of the transfers a link to a peer takes as direct steps (smallest, largest).
type DirectSizes = Option<(usize, usize)>;

/// The buffers of a call in the engine's scope, by index.
const SEND: usize = 0;
const RECV: usize = 1;
const SCRATCH: usize = 2;

/// One collective call of one rank, ready to run.
pub(crate) struct Call<'a> {
    /// The schedule.
    pub sched: &'a Schedule,
    /// Communicator id of the collective channel.
    pub comm: u64,
    /// Sequence number of the call on its communicator (the tag of its messages).
    pub tag: u32,
    /// The call's signature (for mismatch detection).
    pub sig: [u64; 2],
    /// The communicator's epoch.
    pub epoch: u32,
    /// World rank of each communicator rank.
    pub members: &'a [usize],
    /// Element type of reductions.
    pub dtype: DataType,
    /// Reduction.
    pub op: ReduceOp,
    /// The send buffer is the receive buffer.
    pub in_place: bool,
}

impl Call<'_> {
    fn target(&self, peer: usize) -> Result<Target> {
        let world = *self.members.get(peer).ok_or_else(|| {
            Error::internal(format!(
                "a schedule names rank {peer} of {}",
                self.members.len()
            ))
            .with_peer(PeerRank::comm(peer))
        })?;
        Ok(Target {
            comm: self.comm,
            peer: world,
            comm_rank: peer,
            tag: self.tag,
            sig: self.sig,
            seq: 0,
            epoch: self.epoch,
        })
    }

    /// The bytes of a region in the scope's buffers, after in-place aliasing.
    fn part(&self, r: Region) -> Result<Part> {
        let buf = match r.buf {
            Buf::Send if !self.in_place => SEND,
            Buf::Send | Buf::Recv => RECV,
            Buf::Scratch => SCRATCH,
            // Tokens move no data.
            Buf::Token if r.len == 0 => SCRATCH,
            Buf::Token => return Err(Error::internal("a schedule gives a token region bytes")),
        };
        Ok(Part {
            buf,
            off: if r.buf == Buf::Token { 0 } else { r.off },
            len: r.len,
        })
    }
}

/// Runs `call` to completion (or failure), by `deadline`, on `send` (ignored when in place),
/// `recv`, and `scratch` (at least `call.sched.scratch` bytes).
pub(crate) fn execute(
    engine: &Engine,
    call: &Call<'_>,
    send: Option<&Lease<'_>>,
    recv: &mut Lease<'_>,
    scratch: &mut [u8],
    deadline: Instant,
) -> Result<()> {
    let steps = &call.sched.steps;
    let mut bufs = [
        send.map_or_else(|| Lease::from(&[][..]), Lease::share),
        recv.reborrow(),
        Lease::from(scratch),
    ];
    engine.scope(&mut bufs, |ops| {
        let mut pending = Pending::new();
        let result = match engine.begin_call(call.comm, call.tag, call.sig) {
            Err(e) => Err(e),
            Ok(()) => run_steps(ops, call, deadline, &mut pending),
        };
        if let Err(e) = &result {
            ops.cancel_all();
            // Tell every peer of the schedule, so that nobody waits for this rank.
            let targets: Vec<Target> = steps
                .iter()
                .filter_map(|s| match *s {
                    Step::Send { peer, .. } | Step::Recv { peer, .. } => call.target(peer).ok(),
                    _ => None,
                })
                .collect();
            engine.abort(&targets, e);
            tracing::debug!("collective {:?} failed: {e}", call.sig);
        }
        result
    })
}

/// Issues and completes the steps; on error, `pending` holds the operations still posted.
fn run_steps(
    ops: &mut Ops<'_>,
    call: &Call<'_>,
    deadline: Instant,
    pending: &mut Pending,
) -> Result<()> {
    let steps = &call.sched.steps;
    let mut done: SmallVec<[bool; SMALL_SCHEDULE]> = smallvec::smallvec![false; steps.len()];
    let direct = direct_steps(ops, call);
    let mut next = 0;
    let mut ids: SmallVec<[OpId; SMALL_SCHEDULE]> = SmallVec::new();
    loop {
        // Issue, in order, every step whose dependencies are done.
        while next < steps.len() && call.sched.deps(next).iter().all(|&d| done[d as usize]) {
            if let Some(id) = issue(ops, call, steps[next], direct.get(next).copied().flatten())? {
                pending.push((next, id));
            } else {
                done[next] = true;
            }
            next += 1;
        }
        if pending.is_empty() {
            if next == steps.len() {
                return Ok(());
            }
            return Err(Error::internal(
                "a schedule step waits for nothing that can finish",
            ));
        }
        ids.clear();
        ids.extend(pending.iter().map(|&(_, id)| id));
        if let Some(&(first, _)) = pending.iter().min_by_key(|&&(step, _)| step) {
            let peer = match steps[first] {
                Step::Send { peer, .. } | Step::Recv { peer, .. } => Some(peer),
                _ => None,
            };
            crate::observe::waiting_for_step(first, peer);
        }
        let (k, result) = ops.wait_any(&ids, deadline)?;
        let (step, _) = pending.swap_remove(k);
        result?;
        done[step] = true;
    }
}

/// The number of each transfer that goes as a direct step (see [`Ops::post_direct`]) among
/// the call's direct steps with its peer in the same direction, in program order: the
/// transfers whose size the link to the peer writes straight into the receive. The peer
/// numbers its side alike (the n-th send to a rank matches the rank's n-th receive from it,
/// of the same size), which pairs each receive the peer offers with its send here. Empty
/// (no step is direct) where no link has direct steps.
fn direct_steps(ops: &Ops<'_>, call: &Call<'_>) -> SmallVec<[Option<u32>; SMALL_SCHEDULE]> {
    if !ops.any_direct() {
        return SmallVec::new();
    }
    // A schedule talks to a few peers: small maps searched in order.
    let mut sizes: SmallVec<[(usize, DirectSizes); 4]> = SmallVec::new();
    let mut next: SmallVec<[((usize, bool), u32); 4]> = SmallVec::new();
    let mut number = |step: &Step| {
        let (peer, len, send) = match *step {
            Step::Send { peer, src } => (peer, src.len, true),
            Step::Recv { peer, dst } => (peer, dst.len, false),
            _ => return None,
        };
        if len == 0 {
            return None;
        }
        let world = *call.members.get(peer)?;
        let range = match sizes.iter().find(|(w, _)| *w == world) {
            Some(&(_, r)) => r,
            None => {
                let r = ops.direct_sizes(world);
                sizes.push((world, r));
                r
            }
        };
        let (min, max) = range?;
        if !(min..=max).contains(&len) {
            return None;
        }
        let n = match next.iter_mut().find(|(k, _)| *k == (peer, send)) {
            Some((_, n)) => n,
            None => {
                next.push(((peer, send), 0));
                &mut next.last_mut()?.1
            }
        };
        *n += 1;
        Some(*n - 1)
    };
    call.sched.steps.iter().map(&mut number).collect()
}

/// Starts a transfer (returning its operation), as the direct step `direct` when it is one,
/// or runs a local step to completion.
fn issue(
    ops: &mut Ops<'_>,
    call: &Call<'_>,
    step: Step,
    direct: Option<u32>,
) -> Result<Option<OpId>> {
    match step {
        Step::Send { peer, src } => {
            let (t, p) = (call.target(peer)?, call.part(src)?);
            match direct {
                Some(k) => ops.post_direct(Blocking::Send, t, p, k).map(Some),
                None => ops.start(Blocking::Send, t, p),
            }
        }
        Step::Recv { peer, dst } => {
            let (t, p) = (call.target(peer)?, call.part(dst)?);
            match direct {
                Some(k) => ops.post_direct(Blocking::Recv, t, p, k).map(Some),
                None => ops.start(Blocking::Recv, t, p),
            }
        }
        Step::Copy { dst, src } => {
            ops.copy(call.part(dst)?, call.part(src)?)?;
            Ok(None)
        }
        Step::Reduce { dst, src } => {
            ops.reduce(call.dtype, call.op, call.part(dst)?, call.part(src)?)?;
            Ok(None)
        }
    }
}
