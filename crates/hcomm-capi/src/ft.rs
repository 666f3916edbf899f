//! Fault tolerance: revoke a communicator, the failures known and acknowledged, agreement and
//! shrink (docs/fault-tolerance.md).

use std::ffi::c_int;

use hcomm_core::{Communicator, Error, Result};

use crate::args;
use crate::error::guard;
use crate::state;
use crate::types::{hcommComm_t, HCOMM_COMM_NULL};

/// Revokes `comm` on every member: each call pending on it — on this rank's other threads and
/// on the other members — and every later one returns `HCOMM_ERR_REVOKED`, within moments;
/// the notice is forwarded by every member that gets it, so it reaches every live member even
/// if this rank dies right after. Only `hcommCommAgree`, `hcommCommShrink`,
/// `hcommCommShrinkExcluding`, `hcommCommGetFailed` and `hcommCommAckFailed` still work on
/// it. Revoking twice succeeds and does nothing more.
#[no_mangle]
pub extern "C" fn hcommCommRevoke(comm: hcommComm_t) -> c_int {
    guard("hcommCommRevoke", || state::comm(comm)?.revoke())
}

/// The ranks of `comm` this rank knows to have failed, ascending: `*count` becomes how many
/// there are, and the first `min(count, capacity)` of them are written to `ranks` (which may
/// be NULL when `capacity` is 0, to ask for the count).
///
/// # Safety
/// `ranks` is NULL or points to `capacity` writable `int`s; `count` is NULL or points to a
/// writable `int`.
#[no_mangle]
pub unsafe extern "C" fn hcommCommGetFailed(
    comm: hcommComm_t,
    ranks: *mut c_int,
    capacity: c_int,
    count: *mut c_int,
) -> c_int {
    guard("hcommCommGetFailed", || {
        let c = state::comm(comm)?;
        args::out(count, "count")?;
        let cap = usize::try_from(capacity)
            .map_err(|_| Error::invalid_argument(format!("capacity {capacity} is negative")))?;
        if cap > 0 {
            args::out(ranks, "ranks")?;
        }
        let failed = c.failed();
        for (i, &r) in failed.iter().take(cap).enumerate() {
            // SAFETY: not NULL (checked when cap > 0) and i < capacity: the caller's promise.
            unsafe { ranks.add(i).write(r as c_int) };
        }
        // SAFETY: checked not NULL; the caller's promise.
        unsafe { count.write(failed.len() as c_int) };
        Ok(())
    })
}

/// Acknowledges the failures `hcommCommGetFailed` returns now: a later `hcommCommAgree` no
/// longer reports them with `HCOMM_ERR_PEER_LOST`.
#[no_mangle]
pub extern "C" fn hcommCommAckFailed(comm: hcommComm_t) -> c_int {
    guard("hcommCommAckFailed", || {
        state::comm(comm)?.ack_failed();
        Ok(())
    })
}

/// Fault-tolerant agreement: every surviving member of `comm` calls it with its `*flag`, and
/// each returns with `*flag` set to the AND of the flags of the members that took part (0 or
/// 1), the same at every survivor, also when members die during the call. Works on a revoked
/// communicator. Returns `HCOMM_ERR_PEER_LOST` when the agreed failed set holds ranks this
/// rank has not acknowledged (`hcommCommAckFailed`), with `*flag` agreed all the same.
///
/// # Safety
/// `flag` is NULL or points to a readable and writable `int`.
#[no_mangle]
pub unsafe extern "C" fn hcommCommAgree(comm: hcommComm_t, flag: *mut c_int) -> c_int {
    guard("hcommCommAgree", || {
        let c = state::comm(comm)?;
        args::out(flag, "flag")?;
        // SAFETY: checked not NULL; the caller's promise.
        let mut f = unsafe { flag.read() } != 0;
        let r = c.agree(&mut f);
        if matches!(r, Ok(()) | Err(Error::PeerLost(_))) {
            // SAFETY: as above.
            unsafe { flag.write(c_int::from(f)) };
        }
        r
    })
}

/// Writes the communicator `made` makes into `*newcomm`, `HCOMM_COMM_NULL` on every failure
/// (checks of the other arguments too: `made` does them, after the NULL is written).
///
/// # Safety
/// `newcomm` is NULL (an error) or points to a writable `hcommComm_t`.
unsafe fn new_comm(
    newcomm: *mut hcommComm_t,
    made: impl FnOnce() -> Result<Communicator>,
) -> Result<()> {
    args::out(newcomm, "newcomm")?;
    // SAFETY: checked not NULL; the caller passes the address of an hcommComm_t.
    unsafe { newcomm.write(HCOMM_COMM_NULL) };
    let c = made()?;
    let handle = state::with_tables(|t| Ok(t.add_comm(c)))?;
    // SAFETY: as above.
    unsafe { newcomm.write(handle) };
    Ok(())
}

/// A communicator of the surviving members of `comm`, ranks in the old order, into
/// `*newcomm`: the survivors agree on the failed set (again while members die during it),
/// then each makes it without further messages. Every surviving member calls it; it works on
/// a revoked communicator. `HCOMM_ERR_QUORUM` when the survivors are no strict majority (the
/// smaller side of a partition), `HCOMM_ERR_REVOKED` on a rank the others decided had failed.
/// On every failure `*newcomm` is `HCOMM_COMM_NULL` (when `newcomm` is not NULL). Release the
/// result with `hcommCommDestroy`.
///
/// # Safety
/// `newcomm` is NULL or points to a writable `hcommComm_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommCommShrink(comm: hcommComm_t, newcomm: *mut hcommComm_t) -> c_int {
    guard("hcommCommShrink", || {
        // SAFETY: the caller's promise about newcomm.
        unsafe { new_comm(newcomm, || state::comm(comm)?.shrink()) }
    })
}

/// `hcommCommShrink` that also leaves out the `n` ranks at `ranks` (live members removed on
/// purpose; they do not call it). The majority rule counts only the other members. A rank
/// out of range or this rank's own is `HCOMM_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `ranks` is NULL (with `n` = 0) or points to `n` readable `int`s; `newcomm` is NULL or
/// points to a writable `hcommComm_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommCommShrinkExcluding(
    comm: hcommComm_t,
    ranks: *const c_int,
    n: c_int,
    newcomm: *mut hcommComm_t,
) -> c_int {
    guard("hcommCommShrinkExcluding", || {
        let made = || {
            let c = state::comm(comm)?;
            let n = usize::try_from(n)
                .map_err(|_| Error::invalid_argument(format!("n {n} is negative")))?;
            let excluded: Vec<usize> = if n == 0 {
                Vec::new()
            } else {
                // SAFETY: the caller's promise: NULL or n readable ints (checked by `ints`).
                unsafe { args::ints(ranks, n, "ranks")? }
                    .into_iter()
                    .map(|r| args::rank(r, c.size(), "excluded rank"))
                    .collect::<Result<_>>()?
            };
            c.shrink_excluding(&excluded)
        };
        // SAFETY: the caller's promise about newcomm.
        unsafe { new_comm(newcomm, made) }
    })
}
