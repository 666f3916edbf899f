//! The executor: runs one rank's schedule of a collective over the progress engine.
//!
//! Steps are issued in program order as soon as the steps they depend on have finished:
//! transfers go to the engine as nonblocking operations (several in flight at once), local
//! copies and reductions run at once on the calling thread. When a step fails (a mismatch
//! detected by the engine, a lost peer, a timeout) the remaining operations are cancelled and
//! every peer of the schedule is told that this rank abandoned the collective, so that they
//! fail at once too instead of waiting out their timeout.

use std::time::Instant;

use crate::coll::schedule::{Buf, Region, Schedule, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, PeerRank, Result};
use crate::p2p::{Engine, OpId, Target};
use crate::reduce;

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
    /// World rank of each communicator rank.
    pub members: &'a [usize],
    /// Element type of reductions.
    pub dtype: DataType,
    /// Reduction.
    pub op: ReduceOp,
    /// The send buffer (ignored when `in_place`).
    pub send: (*const u8, usize),
    /// The receive buffer.
    pub recv: (*mut u8, usize),
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
        })
    }

    /// Start and length of the memory a region lies in, after in-place aliasing.
    fn base(&self, buf: Buf, scratch: &mut [u8]) -> (*mut u8, usize, Buf) {
        match buf {
            Buf::Send if !self.in_place => (self.send.0.cast_mut(), self.send.1, Buf::Send),
            Buf::Send | Buf::Recv => (self.recv.0, self.recv.1, Buf::Recv),
            Buf::Scratch => (scratch.as_mut_ptr(), scratch.len(), Buf::Scratch),
            Buf::Token => (std::ptr::NonNull::dangling().as_ptr(), 0, Buf::Token),
        }
    }

    /// The address of a region, checked against its buffer.
    fn ptr(&self, r: Region, scratch: &mut [u8]) -> Result<*mut u8> {
        if r.buf == Buf::Token {
            // Tokens move no data: any non-null pointer will do for zero bytes.
            return match r.len {
                0 => Ok(std::ptr::NonNull::dangling().as_ptr()),
                _ => Err(Error::internal("a schedule gives a token region bytes")),
            };
        }
        let (base, len, _) = self.base(r.buf, scratch);
        if r.off.checked_add(r.len).is_none_or(|end| end > len) {
            return Err(Error::internal(format!(
                "a schedule step names bytes {:?} of a {len}-byte {:?} buffer",
                r.range(),
                r.buf
            )));
        }
        // SAFETY: `r.off + r.len <= len`, so the offset stays inside the buffer.
        Ok(unsafe { base.add(r.off) })
    }

    /// Whether two regions share memory once aliasing is applied.
    fn alias(&self, a: Region, b: Region, scratch: &mut [u8]) -> bool {
        let (_, _, ba) = self.base(a.buf, scratch);
        let (_, _, bb) = self.base(b.buf, scratch);
        ba == bb && a.len > 0 && b.len > 0 && a.off < b.off + b.len && b.off < a.off + a.len
    }
}

/// Runs `call` to completion (or failure), by `deadline`.
///
/// # Safety
/// `call.send` must be valid for reads and `call.recv` for writes (and not otherwise accessed)
/// for the whole call; `scratch` must hold at least `call.sched.scratch` bytes.
pub(crate) unsafe fn execute(
    engine: &Engine,
    call: &Call<'_>,
    scratch: &mut [u8],
    deadline: Instant,
) -> Result<()> {
    let steps = &call.sched.steps;
    let mut pending: Vec<(usize, OpId)> = Vec::new();
    let result = match engine.begin_call(call.comm, call.tag, call.sig) {
        Err(e) => Err(e),
        Ok(()) => run_steps(engine, call, scratch, deadline, &mut pending),
    };
    if let Err(e) = &result {
        let left: Vec<OpId> = pending.iter().map(|&(_, id)| id).collect();
        engine.cancel(&left);
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
}

/// Issues and completes the steps; on error, `pending` holds the operations still posted.
fn run_steps(
    engine: &Engine,
    call: &Call<'_>,
    scratch: &mut [u8],
    deadline: Instant,
    pending: &mut Vec<(usize, OpId)>,
) -> Result<()> {
    let steps = &call.sched.steps;
    let mut done = vec![false; steps.len()];
    let mut next = 0;
    let mut ids: Vec<OpId> = Vec::new();
    loop {
        // Issue, in order, every step whose dependencies are done.
        while next < steps.len() && call.sched.deps(next).iter().all(|&d| done[d as usize]) {
            if let Some(id) = issue(engine, call, steps[next], scratch)? {
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
        let (k, result) = engine.wait_any(&ids, deadline)?;
        let (step, _) = pending.swap_remove(k);
        result?;
        done[step] = true;
    }
}

/// Starts a transfer (returning its operation) or runs a local step to completion.
fn issue(engine: &Engine, call: &Call<'_>, step: Step, scratch: &mut [u8]) -> Result<Option<OpId>> {
    match step {
        Step::Send { peer, src } => {
            let p = call.ptr(src, scratch)?;
            // SAFETY: `p..p + src.len` lies in a buffer the caller of `execute` keeps valid
            // until it returns, and every posted operation is waited for or cancelled first.
            Ok(Some(unsafe {
                engine.post_send(call.target(peer)?, p, src.len, false)?
            }))
        }
        Step::Recv { peer, dst } => {
            let p = call.ptr(dst, scratch)?;
            // SAFETY: as for sends; dependencies keep every other step off `dst` until the
            // receive completes.
            Ok(Some(unsafe {
                engine.post_recv(call.target(peer)?, p, dst.len, false)?
            }))
        }
        Step::Copy { dst, src } => {
            let (d, s) = (call.ptr(dst, scratch)?, call.ptr(src, scratch)?);
            if dst.len != src.len {
                return Err(Error::internal(
                    "a schedule copies between regions of different sizes",
                ));
            }
            // SAFETY: both ranges were checked against their buffers; `copy` allows overlap.
            unsafe { std::ptr::copy(s, d, dst.len) };
            Ok(None)
        }
        Step::Reduce { dst, src } => {
            if call.alias(dst, src, scratch) {
                return Err(Error::internal("a schedule reduces a region into itself"));
            }
            let (d, s) = (call.ptr(dst, scratch)?, call.ptr(src, scratch)?);
            // SAFETY: both ranges were checked against their buffers and do not overlap; no
            // transfer touches them now (dependencies).
            let (dst_bytes, src_bytes) = unsafe {
                (
                    std::slice::from_raw_parts_mut(d, dst.len),
                    std::slice::from_raw_parts(s, src.len),
                )
            };
            reduce::reduce_into(call.dtype, call.op, dst_bytes, src_bytes)?;
            Ok(None)
        }
    }
}
