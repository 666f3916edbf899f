//! Lifetime and communicators: `hcommInit`, `hcommFinalize`, rank and size, split, dup,
//! abort, destroy.

use std::ffi::{c_char, c_int};

use hcomm_core::{Communicator, Error};

use crate::args;
use crate::error::guard;
use crate::state;
use crate::types::{hcommComm_t, HCOMM_COMM_NULL};

/// Joins the job this process was started in: under `hcommrun`, Open MPI's `mpirun`, MPICH's
/// `mpiexec`, Slurm's `srun` or `torchrun` (read from the environment), or alone as a world of
/// one rank. Then `COMM_WORLD` holds every rank. `argc` and `argv` are neither read nor
/// changed and may be NULL. Calling it again while initialized does nothing and succeeds;
/// after `hcommFinalize` it fails with `HCOMM_ERR_INIT`.
#[no_mangle]
pub extern "C" fn hcommInit(argc: *mut c_int, argv: *mut *mut *mut c_char) -> c_int {
    let _ = (argc, argv);
    guard("hcommInit", || state::init(Communicator::init).map(drop))
}

/// Leaves the job: releases every communicator and request, delivers what is still queued
/// (bounded by `HCOMM_TIMEOUT`) and closes the connections. hcomm cannot be used again in this
/// process, except `hcommMalloc`/`hcommFree` and the error functions.
#[no_mangle]
pub extern "C" fn hcommFinalize() -> c_int {
    guard("hcommFinalize", || {
        // Not under the state lock: unfinished point-to-point requests complete in the
        // background until their world closes; nonblocking collectives are waited for
        // (each at most HCOMM_TIMEOUT), as they use the caller's memory; closing waits for
        // queued data.
        let released = state::finalize()?;
        drop(released.requests);
        drop(released.comms);
        Ok(())
    })
}

/// `*out` becomes `value` of the communicator behind `comm`.
///
/// # Safety
/// `out` is NULL (an error) or points to a writable `int`.
unsafe fn store_int(
    function: &str,
    comm: hcommComm_t,
    out: *mut c_int,
    what: &str,
    value: fn(&Communicator) -> usize,
) -> c_int {
    guard(function, || {
        let c = state::comm(comm)?;
        args::out(out, what)?;
        let v = c_int::try_from(value(&c))
            .map_err(|_| Error::internal(format!("the {what} does not fit an int")))?;
        // SAFETY: checked not NULL; the caller's promise.
        unsafe { out.write(v) };
        Ok(())
    })
}

/// `*rank` becomes this process's rank in `comm` (0 .. size - 1).
///
/// # Safety
/// `rank` is NULL or points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn hcommCommRank(comm: hcommComm_t, rank: *mut c_int) -> c_int {
    // SAFETY: the caller passes NULL or the address of an int.
    unsafe { store_int("hcommCommRank", comm, rank, "rank", Communicator::rank) }
}

/// `*size` becomes the number of ranks in `comm`.
///
/// # Safety
/// `size` is NULL or points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn hcommCommSize(comm: hcommComm_t, size: *mut c_int) -> c_int {
    // SAFETY: the caller passes NULL or the address of an int.
    unsafe { store_int("hcommCommSize", comm, size, "size", Communicator::size) }
}

/// Splits `comm`: ranks that pass the same `color` form a new communicator, ordered by `key`
/// (ties by rank in `comm`), which `*newcomm` receives. A negative color joins none:
/// `*newcomm` becomes `HCOMM_COMM_NULL`. Every rank of `comm` must call it (inside a group
/// too, it runs at once). Release the result with `hcommCommDestroy`.
///
/// # Safety
/// `newcomm` is NULL or points to a writable `hcommComm_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommCommSplit(
    comm: hcommComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut hcommComm_t,
) -> c_int {
    guard("hcommCommSplit", || {
        let c = state::comm(comm)?;
        args::out(newcomm, "newcomm")?;
        // SAFETY: checked not NULL; the caller passes the address of an hcommComm_t.
        unsafe { newcomm.write(HCOMM_COMM_NULL) };
        if let Some(split) = c.split(color, key)? {
            let handle = state::with_tables(|t| Ok(t.add_comm(split)))?;
            // SAFETY: as above.
            unsafe { newcomm.write(handle) };
        }
        Ok(())
    })
}

/// A new communicator with the same ranks as `comm`, whose messages and collectives never
/// match those of `comm` (a library can use it without interfering with its caller);
/// `*newcomm` receives it (`HCOMM_COMM_NULL` on failure). Every rank of `comm` must call it
/// (inside a group too, it runs at once). Release it with `hcommCommDestroy`.
///
/// # Safety
/// `newcomm` is NULL or points to a writable `hcommComm_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommCommDup(comm: hcommComm_t, newcomm: *mut hcommComm_t) -> c_int {
    guard("hcommCommDup", || {
        args::out(newcomm, "newcomm")?;
        // SAFETY: checked not NULL; the caller passes the address of an hcommComm_t.
        unsafe { newcomm.write(HCOMM_COMM_NULL) };
        let dup = state::comm(comm)?.dup()?;
        let handle = state::with_tables(|t| Ok(t.add_comm(dup)))?;
        // SAFETY: as above.
        unsafe { newcomm.write(handle) };
        Ok(())
    })
}

/// Aborts `comm` on every rank: each call pending on it — on this rank's other threads and on
/// the other members, which this rank tells at once — returns `HCOMM_ERR_ABORTED`, and so does
/// every later call on it. Returns `HCOMM_SUCCESS` without waiting for the other ranks (a
/// second abort succeeds and does nothing more), `HCOMM_ERR_INVALID_ARGUMENT` for a NULL,
/// destroyed or forged handle, `HCOMM_ERR_INIT` before `hcommInit` or after `hcommFinalize`.
/// The handle stays valid: release it with `hcommCommDestroy` (or `hcommFinalize` for
/// `COMM_WORLD`) as usual.
#[no_mangle]
pub extern "C" fn hcommCommAbort(comm: hcommComm_t) -> c_int {
    guard("hcommCommAbort", || state::comm(comm)?.abort())
}

/// Writes the flight recorder of every communicator of this process (the last
/// `HCOMM_TRACE_BUFFER` collective calls of each) to this rank's dump,
/// `$HCOMM_TRACE_DIR/rank<N>.json` (`/tmp/hcomm-trace` by default), replacing an earlier
/// one; `hcomm_trace DIR` merges a job's dumps. Local: the other ranks are not involved.
/// Returns `HCOMM_SUCCESS`, `HCOMM_ERR_INVALID_ARGUMENT` for a bad handle, with
/// `HCOMM_TRACE_BUFFER=0` or when the file cannot be written, `HCOMM_ERR_INIT` before
/// `hcommInit` or after `hcommFinalize`. (Not in the seed or SPEC: added so that C programs can
/// dump as Rust and Python ones do.)
#[no_mangle]
pub extern "C" fn hcommCommDumpTrace(comm: hcommComm_t) -> c_int {
    guard("hcommCommDumpTrace", || {
        state::comm(comm)?.dump_trace().map(drop)
    })
}

/// Releases a communicator from `hcommCommSplit`; its handle becomes invalid (using it again
/// gives `HCOMM_ERR_INVALID_ARGUMENT`). `COMM_WORLD` is released by `hcommFinalize` instead.
/// Calls still running on it on other threads finish first.
#[no_mangle]
pub extern "C" fn hcommCommDestroy(comm: hcommComm_t) -> c_int {
    guard("hcommCommDestroy", || {
        let c = state::with_tables(|t| t.remove_comm(comm))?;
        drop(c);
        Ok(())
    })
}
