//! Fault tolerance: revoke a communicator, the failures known and acknowledged, agreement,
//! shrink and grow (docs/fault-tolerance.md).

use std::ffi::{c_char, c_int, CStr};

use hcomm_core::{Communicator, Error, Result};

use crate::args;
use crate::error::guard;
use crate::state;
use crate::types::{hcommComm_t, COMM_WORLD, HCOMM_COMM_NULL};

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

/// Writes `HCOMM_COMM_NULL` into `*newcomm`, then the communicator `made` makes: a failure of
/// `made` (the argument checks it does included) leaves the NULL there.
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

/// Bytes a buffer needs for any join token of `hcommCommJoinToken`, its NUL included.
pub const HCOMM_JOIN_TOKEN_MAX: usize = 256;

/// The NUL-terminated token at `token`, checked: not NULL, at most `HCOMM_JOIN_TOKEN_MAX`
/// bytes with its NUL, UTF-8.
///
/// # Safety
/// `token` is NULL or a NUL-terminated string.
unsafe fn token_arg<'a>(token: *const c_char) -> Result<&'a str> {
    if token.is_null() {
        return Err(Error::invalid_argument(
            "token is NULL: pass the string hcommCommJoinToken wrote",
        ));
    }
    // SAFETY: not NULL, so NUL-terminated (the caller's promise); at most
    // HCOMM_JOIN_TOKEN_MAX bytes are read.
    let len = unsafe { libc::strnlen(token, HCOMM_JOIN_TOKEN_MAX) };
    if len >= HCOMM_JOIN_TOKEN_MAX {
        return Err(Error::invalid_argument(format!(
            "token is longer than a join token ({} bytes at most)",
            HCOMM_JOIN_TOKEN_MAX - 1
        )));
    }
    // SAFETY: NUL-terminated within the `len + 1` bytes just checked.
    let token = unsafe { CStr::from_ptr(token) };
    token
        .to_str()
        .map_err(|_| Error::invalid_argument("token is not a join token (not ASCII)"))
}

/// Writes a single-use join token of `comm` into `buf` (`len` bytes; `HCOMM_JOIN_TOKEN_MAX`
/// is always enough), NUL-terminated: the members grow `comm` with it (`hcommCommGrow`) and
/// each new process joins with it (`hcommJoin`). Local: only this rank makes it; hand it to
/// the other members and to the new processes. The token carries a key derived from the job
/// secret: whoever holds it can join without `HCOMM_JOB_SECRET`, so keep it as secret as the
/// job secret. This rank hosts the store the new processes reach until a grow uses the token;
/// a token that no grow on this rank takes within `HCOMM_TIMEOUT` expires (its store closes,
/// and a grow with it fails with `HCOMM_ERR_INVALID_ARGUMENT`), and destroying `comm` closes
/// the stores of its tokens. `HCOMM_ERR_INVALID_ARGUMENT` when `buf` is NULL or too small for
/// the longest token this rank can make (checked before anything starts; the message says
/// how many bytes it needs).
///
/// # Safety
/// `buf` is NULL or points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn hcommCommJoinToken(
    comm: hcommComm_t,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard("hcommCommJoinToken", || {
        let c = state::comm(comm)?;
        args::out(buf, "buf")?;
        // Checked before the token's store starts: room for the longest token and its NUL.
        let token = c.join_token_within(len.saturating_sub(1))?;
        if token.len() >= len {
            // join_token_within keeps its promise; the copy below relies on it.
            return Err(Error::internal("join token longer than its bound"));
        }
        // SAFETY: `buf` is not NULL and holds `len` > token.len() bytes: the caller's promise.
        unsafe {
            buf.copy_from_nonoverlapping(token.as_ptr().cast(), token.len());
            buf.add(token.len()).write(0);
        }
        Ok(())
    })
}

/// Grows `comm` by `nnew` new processes, each of which calls `hcommJoin` with `token`: into
/// `*newcomm` a communicator of the members, ranks 0 to size - 1 in their old order, and the
/// new processes, ranks size to size + nnew - 1, at the next epoch. Collective: every member
/// calls it with the same token (made by one of them with `hcommCommJoinToken`) and count.
/// `HCOMM_ERR_INVALID_ARGUMENT` for a malformed token, one made for another communicator, one
/// not made in this job, one already used to grow `comm`, one that expired, `nnew` < 1, and a
/// `comm` whose traffic goes through a transport plug-in (it serves one world at a time, and
/// the grown communicator is a world of its own: neither a token nor a grow is made);
/// `HCOMM_ERR_MISMATCH` when members pass other tokens or counts; `HCOMM_ERR_TIMEOUT` when the
/// new processes do not join within `HCOMM_TIMEOUT`. On every failure `*newcomm` is
/// `HCOMM_COMM_NULL` (when `newcomm` is not NULL). Release the result with
/// `hcommCommDestroy`.
///
/// # Safety
/// `token` is NULL or a NUL-terminated string; `newcomm` is NULL or points to a writable
/// `hcommComm_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommCommGrow(
    comm: hcommComm_t,
    token: *const c_char,
    nnew: c_int,
    newcomm: *mut hcommComm_t,
) -> c_int {
    guard("hcommCommGrow", || {
        // SAFETY: the caller's promise about newcomm.
        unsafe {
            new_comm(newcomm, || {
                let c = state::comm(comm)?;
                // SAFETY: the caller's promise about token.
                let token = token_arg(token)?;
                let nnew = usize::try_from(nnew)
                    .map_err(|_| Error::invalid_argument(format!("nnew {nnew} is negative")))?;
                c.grow(token, nnew)
            })
        }
    })
}

/// Joins the communicator its members grow with `token` (`hcommCommGrow`), in a new process:
/// `*newcomm` becomes the grown communicator, in which this process has the next free rank.
/// Needs no launcher and no `HCOMM_JOB_SECRET` (the token authenticates the process). Called
/// before `hcommInit`, it initializes hcomm and the grown communicator becomes `COMM_WORLD`
/// (`*newcomm` is `COMM_WORLD`; `hcommFinalize` releases it); called after, `*newcomm` is a
/// communicator of its own, released with `hcommCommDestroy`. `HCOMM_ERR_INVALID_ARGUMENT` for
/// a malformed token and for one already used (every rank its grow adds is taken);
/// `HCOMM_ERR_TIMEOUT` when the token's store cannot be reached (its maker is gone) or the
/// members do not grow within `HCOMM_TIMEOUT`; `HCOMM_ERR_INIT` when the store refuses the
/// token's key (a forged token) and after `hcommFinalize`. On every failure `*newcomm` is
/// `HCOMM_COMM_NULL` (when `newcomm` is not NULL).
///
/// # Safety
/// `token` is NULL or a NUL-terminated string; `newcomm` is NULL or points to a writable
/// `hcommComm_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommJoin(token: *const c_char, newcomm: *mut hcommComm_t) -> c_int {
    guard("hcommJoin", || {
        args::out(newcomm, "newcomm")?;
        // SAFETY: checked not NULL; the caller passes the address of an hcommComm_t.
        unsafe { newcomm.write(HCOMM_COMM_NULL) };
        // SAFETY: the caller's promise about token.
        let token = unsafe { token_arg(token)? };
        if state::init(|| Communicator::join(token))? {
            // SAFETY: as above.
            unsafe { newcomm.write(COMM_WORLD) };
            return Ok(());
        }
        // SAFETY: the caller's promise about newcomm.
        unsafe { new_comm(newcomm, || Communicator::join(token)) }
    })
}
