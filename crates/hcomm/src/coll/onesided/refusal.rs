//! A refusal of cross-memory attach in the middle of a one-sided call, with no warning before
//! (a member's ptrace rules tightened mid-job: `EPERM` from `process_vm_readv`/`writev`): the
//! call is done again through its message schedule, on every member, when that is correct.
//!
//! The member that was refused says so (`NoCma` = the next call, written before it gives the
//! call up), and every member gives the call up (its `Failed`). Once every peer has given it
//! up, nobody reads or writes anybody's buffers any more, and every member sees every other's
//! `NoCma` and header alike. When some member was refused in this call and every
//! contribution is still as the caller passed it, the results written so far are only partly
//! there and the schedule writes all of them again, so every member runs the schedule
//! ([`Outcome::Schedule`]) and the call completes correctly. The contributions are intact
//! when no member's contribution shares memory with its result (no call in place), and in
//! every call of the collectives whose one-sided form never writes a contribution: broadcast
//! (the root's buffer is only read), all-gather and gather (in place, a rank's own block is
//! left where it is and the others' blocks are written around it) and scatter (the root's
//! buffer is only read). All-reduce, reduce, reduce-scatter and all-to-all in place are not
//! redone: some results may already have overwritten the contributions they came from, which
//! nobody has kept; such a call fails on every member with an error saying so (the later
//! calls run their schedules). A call that failed for another reason fails as before.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Outcome, Waiter};
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::transport::shm::board::{Board, Ctr};

/// How long a member waits between looks at its peers' `Failed` while it waits for all of
/// them to give the call up.
const LOOK_EVERY: Duration = Duration::from_micros(50);

/// Whether a call of `kind` refused in the middle is always done again by its schedule: its
/// one-sided form never writes a contribution (broadcast, all-gather, gather, scatter), in
/// place or not.
pub(super) fn redone(kind: CollKind) -> bool {
    matches!(
        kind,
        CollKind::Broadcast | CollKind::AllGather | CollKind::Gather | CollKind::Scatter
    )
}

/// After call `j` of `kind` (slot `slot` of `board`) failed on this rank with `err`, having
/// told its peers: [`Outcome::Schedule`] when a member was refused cross-memory attach in
/// this call and the call can be done again by its schedule, else the error (for a refused
/// call in place, one that says why it is not redone).
pub(super) fn after_failure(
    waiter: &Waiter<'_>,
    kind: CollKind,
    board: &Board,
    slot: usize,
    j: u64,
    err: Error,
) -> Result<Outcome> {
    let os = waiter.os;
    let n = os.signals.len();
    let refused_here =
        |p: usize| os.signals.counter(p, Ctr::NoCma).load(Ordering::Acquire) == j + 1;
    // A failure that no refusal in this call caused fails as it always did, at once. One
    // that a refusal caused shows it: the refused member wrote its `NoCma` before its
    // `Failed`, which this rank (or the peer whose `Failed` it saw) read.
    if !(0..n).any(refused_here) {
        return Err(err);
    }
    let peers = || (0..n).filter(|&p| p != os.me);
    // Every peer gives the call up (it saw this rank's, or another's, `Failed`), bounded by
    // HCOMM_TIMEOUT and by the peers' lives.
    let until = Instant::now() + waiter.comm.timeout();
    for p in peers() {
        while !waiter.abandoned(p) {
            if Instant::now() >= until || waiter.engine.check_peer(os.world[p]).is_err() {
                return Err(err);
            }
            std::thread::sleep(LOOK_EVERY);
        }
    }
    let read_only = redone(kind);
    let in_place = (0..n).filter(|_| !read_only).find(|&p| {
        let h = board.header(p, slot);
        h.len > 0
            && h.output_len > 0
            && h.input < h.output.saturating_add(h.output_len)
            && h.output < h.input.saturating_add(h.len)
    });
    match in_place {
        None => {
            tracing::info!(
                "one-sided call {j}: cross-memory attach was refused in the middle of the call; \
                 it runs its message schedule instead"
            );
            Ok(Outcome::Schedule)
        }
        Some(p) => Err(Error::transport_failed(format!(
            "cross-memory attach was refused in the middle of this collective (a member turned \
             non-dumpable or its ptrace rules changed, with no warning before), and rank {p} \
             called it in place: results already written may have overwritten the \
             contributions they came from, so the call cannot be done again; the later calls \
             run their message schedules"
        ))
        .with_cause(err)),
    }
}
