//! `hcommGroupStart`/`hcommGroupEnd`: calls between them are issued together at the end, as
//! in NCCL.
//!
//! Groups belong to the calling thread and nest (only the outermost end issues the calls).
//! Inside a group, collectives are checked and queued; `hcommGroupEnd` runs them in order,
//! fusing each run of consecutive all-reduces and broadcasts on one communicator into one
//! [`hcomm_core::Batch`] (one call per type and operation, so many small all-reduces cost about
//! one). `hcommSend` and `hcommRecv` are started at once, nonblocking, and `hcommGroupEnd` waits
//! for them after the collectives, so ranks that send to each other inside a group never
//! deadlock. The buffers of queued calls must stay valid until `hcommGroupEnd` returns.
//! `hcommGroupEnd` returns the first error; calls after a failed collective are not run, and
//! point-to-point operations of the group are then abandoned (they finish in the background).

use std::cell::RefCell;
use std::ffi::c_int;

use hcomm_core::CollKind;
use hcomm_core::{Communicator, Error, Result};

use crate::args;
use crate::coll::{Call, Layout};
use crate::error::guard;
use crate::p2p;
use crate::state;
use crate::types::hcommRequest_t;

/// The open groups of this thread and what they queued.
#[derive(Default)]
struct Group {
    depth: usize,
    calls: Vec<Call>,
    requests: Vec<hcommRequest_t>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::default();
}

/// Whether this thread is inside a group.
pub(crate) fn active() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Queues a checked collective until the group ends.
pub(crate) fn queue(call: Call) {
    GROUP.with(|g| g.borrow_mut().calls.push(call));
}

/// Adds a started point-to-point operation that the group's end waits for.
pub(crate) fn add_request(request: hcommRequest_t) -> Result<()> {
    GROUP.with(|g| g.borrow_mut().requests.push(request));
    Ok(())
}

fn fusable(call: &Call) -> bool {
    matches!(call.kind, CollKind::AllReduce | CollKind::Broadcast)
}

/// Whether any two of the (address, length) ranges overlap.
fn any_overlap(mut ranges: Vec<(usize, usize)>) -> bool {
    ranges.retain(|r| r.1 > 0);
    ranges.sort_unstable();
    ranges.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0)
}

/// Runs all-reduces and broadcasts on `comm` as one batch.
fn run_fused(comm: &Communicator, calls: &[Call]) -> Result<()> {
    let layouts = calls
        .iter()
        .map(|c| c.layout(comm))
        .collect::<Result<Vec<Layout>>>()?;
    let ranges = layouts.iter().map(|l| (l.recv.0.addr(), l.recv.1));
    if any_overlap(ranges.collect()) {
        // The batch needs its buffers disjoint: run the calls one by one instead.
        for l in layouts {
            // SAFETY: the buffers of queued calls stay valid until hcommGroupEnd returns
            // (the contract of calls inside a group).
            unsafe { l.run(comm)? };
        }
        return Ok(());
    }
    let mut batch = comm.batch();
    for (call, l) in calls.iter().zip(&layouts) {
        if let Some((send, len)) = l.send {
            // The batch works in place: the input goes to the receive buffer first.
            // SAFETY: both buffers hold `len` bytes (checked by `layout`) and are valid until
            // hcommGroupEnd returns; `copy` allows them to overlap.
            unsafe { std::ptr::copy(send.cast::<u8>(), l.recv.0.cast::<u8>(), len) };
        }
        // SAFETY: as above; the receive buffers of the batch are pairwise disjoint (checked).
        let buf = unsafe { args::bytes_mut(l.recv.0, l.recv.1, "recvbuf")? };
        match call.kind {
            CollKind::AllReduce => {
                batch.allreduce_bytes(buf, call.dtype, call.op)?;
            }
            _ => {
                batch.broadcast_bytes(buf, l.shape.root);
            }
        }
    }
    batch.run()
}

/// Runs queued collectives in order, fusing runs of all-reduces and broadcasts.
fn run_calls(calls: &[Call]) -> Result<()> {
    let mut i = 0;
    while i < calls.len() {
        let comm = state::comm(calls[i].comm)?;
        let fused = calls[i..]
            .iter()
            .take_while(|c| fusable(c) && c.comm == calls[i].comm)
            .count();
        if fused >= 2 {
            run_fused(&comm, &calls[i..i + fused])?;
            i += fused;
        } else {
            let layout = calls[i].layout(&comm)?;
            // SAFETY: the buffers of queued calls stay valid until hcommGroupEnd returns.
            unsafe { layout.run(&comm)? };
            i += 1;
        }
    }
    Ok(())
}

/// Issues what the outermost group queued.
fn issue(group: Group) -> Result<()> {
    let result = run_calls(&group.calls);
    let mut pending = Vec::with_capacity(group.requests.len());
    let mut first_err = result.err();
    for r in group.requests {
        match state::with_tables(|t| t.take_request(r)) {
            Ok(p) => pending.push(p),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        // Dropped requests finish in the background; their buffers are their own.
        return Err(e);
    }
    for p in pending {
        if let Err(e) = p2p::finish(p) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Starts a group (groups nest): until the matching `hcommGroupEnd`, collectives are queued and
/// `hcommSend`/`hcommRecv` only started. Needs `hcommInit`.
#[no_mangle]
pub extern "C" fn hcommGroupStart() -> c_int {
    guard("hcommGroupStart", || {
        state::with_tables(|_| Ok(()))?;
        GROUP.with(|g| g.borrow_mut().depth += 1);
        Ok(())
    })
}

/// Ends a group; the outermost end issues every call queued since its `hcommGroupStart`,
/// waits for them and returns the first error (`HCOMM_ERR_INVALID_ARGUMENT` without an open
/// group).
#[no_mangle]
pub extern "C" fn hcommGroupEnd() -> c_int {
    guard("hcommGroupEnd", || {
        if let Err(e) = state::with_tables(|_| Ok(())) {
            // Not initialized (any more): whatever was queued cannot run.
            GROUP.with(|g| std::mem::take(&mut *g.borrow_mut()));
            return Err(e);
        }
        let ended = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth == 0 {
                return Err(Error::invalid_argument(
                    "hcommGroupEnd without hcommGroupStart",
                ));
            }
            g.depth -= 1;
            Ok((g.depth == 0).then(|| std::mem::take(&mut *g)))
        })?;
        match ended {
            Some(group) => issue(group),
            None => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_of_ranges() {
        assert!(!any_overlap(vec![(0, 4), (4, 4), (100, 0), (8, 1)]));
        assert!(any_overlap(vec![(10, 4), (0, 11)]));
        assert!(!any_overlap(vec![(10, 0), (10, 0), (5, 5)]));
    }
}
