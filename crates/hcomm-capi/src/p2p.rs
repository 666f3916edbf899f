//! Point-to-point messages: blocking `hcommSend`/`hcommRecv`, nonblocking `hcommIsend`/
//! `hcommIrecv` with `hcommWait`/`hcommTest`.
//!
//! Nonblocking operations stage the data in a buffer the request owns (the Rust requests own
//! their buffers), so the caller's send buffer may be reused as soon as `hcommIsend` returns,
//! and a receive's data is copied into the caller's buffer when `hcommWait` or `hcommTest`
//! completes it.

use std::ffi::{c_int, c_void};

use hcomm_core::{Error, Result};

use crate::args;
use crate::error::guard;
use crate::group;
use crate::state::{self, Pending, RecvTarget};
use crate::types::{hcommComm_t, hcommRequest_t, HCOMM_REQUEST_NULL};

/// Starts sending `bytes` bytes at `buf` (a copy of them); returns the request's handle.
fn start_send(
    buf: *const c_void,
    bytes: usize,
    dest: c_int,
    tag: c_int,
    comm: hcommComm_t,
) -> Result<hcommRequest_t> {
    let c = state::comm(comm)?;
    let dest = args::rank(dest, c.size(), "dest")?;
    let tag = args::tag(tag)?;
    // SAFETY: the caller's buffer holds `bytes` readable bytes for this call (hcommIsend's
    // contract); it is copied before the call returns.
    let data = unsafe { args::bytes(buf, bytes, "buf")? };
    let request = c.isend(args::copy_of(data, "hcommIsend")?, dest, tag)?;
    state::with_tables(|t| {
        Ok(t.add_request(Pending {
            request,
            recv_into: None,
        }))
    })
}

/// Starts receiving into `bytes` bytes at `buf`; returns the request's handle.
fn start_recv(
    buf: *mut c_void,
    bytes: usize,
    src: c_int,
    tag: c_int,
    comm: hcommComm_t,
) -> Result<hcommRequest_t> {
    let c = state::comm(comm)?;
    let src = args::rank(src, c.size(), "src")?;
    let tag = args::tag(tag)?;
    args::buffer(buf, bytes, "buf")?;
    let request = c.irecv(args::staging(bytes, "hcommIrecv")?, src, tag)?;
    state::with_tables(|t| {
        Ok(t.add_request(Pending {
            request,
            recv_into: Some(RecvTarget {
                addr: buf.expose_provenance(),
                len: bytes,
            }),
        }))
    })
}

/// Waits for a request taken out of the table; a receive's data goes to the caller's buffer.
pub(crate) fn finish(pending: Pending) -> Result<()> {
    let done = pending.request.wait()?;
    if let Some(target) = pending.recv_into {
        let data = done.buffer.get(..done.len).ok_or_else(|| {
            Error::Internal("a receive reported more bytes than its buffer".into())
        })?;
        if data.len() > target.len {
            return Err(Error::Internal(
                "a receive got more bytes than the caller's buffer".into(),
            ));
        }
        // SAFETY: hcommIrecv's contract: the caller's buffer holds `target.len` writable
        // bytes until the request completes, which is now; `data` is the request's own
        // staging buffer, so the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                std::ptr::with_exposed_provenance_mut::<u8>(target.addr),
                data.len(),
            )
        };
    }
    Ok(())
}

/// `*request` becomes the handle `start` returns, or `HCOMM_REQUEST_NULL` when it fails.
///
/// # Safety
/// `request` is NULL (an error) or points to a writable `hcommRequest_t`.
pub(crate) unsafe fn store_request(
    request: *mut hcommRequest_t,
    start: impl FnOnce() -> Result<hcommRequest_t>,
) -> Result<()> {
    args::out(request, "request")?;
    // SAFETY: checked not NULL; the caller's promise.
    unsafe { request.write(HCOMM_REQUEST_NULL) };
    let handle = start()?;
    // SAFETY: as above.
    unsafe { request.write(handle) };
    Ok(())
}

/// Sends `bytes` bytes at `buf` to rank `dest` of `comm` with `tag` (0 .. INT_MAX); returns
/// when `buf` may be reused. Between `hcommGroupStart` and `hcommGroupEnd` the send is started
/// at once and completed by `hcommGroupEnd`.
///
/// # Safety
/// `buf` is NULL or points to `bytes` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn hcommSend(
    buf: *const c_void,
    bytes: usize,
    dest: c_int,
    tag: c_int,
    comm: hcommComm_t,
) -> c_int {
    guard("hcommSend", || {
        if group::active() {
            return group::add_request(start_send(buf, bytes, dest, tag, comm)?);
        }
        let c = state::comm(comm)?;
        let dest = args::rank(dest, c.size(), "dest")?;
        let tag = args::tag(tag)?;
        // SAFETY: the caller's buffer holds `bytes` readable bytes during this call.
        let data = unsafe { args::bytes(buf, bytes, "buf")? };
        c.send(data, dest, tag)
    })
}

/// Receives a message from rank `src` of `comm` with `tag` into `bytes` bytes at `buf`. A
/// shorter message fills the front of `buf`; a longer one fails with `HCOMM_ERR_TRUNCATED`
/// (and is consumed). Between `hcommGroupStart` and `hcommGroupEnd` the receive is started at
/// once and `buf` is filled by `hcommGroupEnd`.
///
/// # Safety
/// `buf` is NULL or points to `bytes` writable bytes that nothing else uses during the call
/// (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
pub unsafe extern "C" fn hcommRecv(
    buf: *mut c_void,
    bytes: usize,
    src: c_int,
    tag: c_int,
    comm: hcommComm_t,
) -> c_int {
    guard("hcommRecv", || {
        if group::active() {
            return group::add_request(start_recv(buf, bytes, src, tag, comm)?);
        }
        let c = state::comm(comm)?;
        let src = args::rank(src, c.size(), "src")?;
        let tag = args::tag(tag)?;
        // SAFETY: the caller's buffer holds `bytes` writable bytes during this call, used by
        // nobody else.
        let data = unsafe { args::bytes_mut(buf, bytes, "buf")? };
        c.recv(data, src, tag).map(drop)
    })
}

/// Starts `hcommSend` in the background; `*request` receives its handle (and
/// `HCOMM_REQUEST_NULL` on failure). The data is copied: `buf` may be reused at once.
///
/// # Safety
/// `buf` is NULL or points to `bytes` readable bytes; `request` is NULL or points to a writable
/// `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommIsend(
    buf: *const c_void,
    bytes: usize,
    dest: c_int,
    tag: c_int,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    guard("hcommIsend", || {
        // SAFETY: the caller passes NULL or the address of an hcommRequest_t.
        unsafe { store_request(request, || start_send(buf, bytes, dest, tag, comm)) }
    })
}

/// Starts `hcommRecv` in the background; `*request` receives its handle (and
/// `HCOMM_REQUEST_NULL` on failure). `buf` must stay valid, and is filled, when `hcommWait` or
/// `hcommTest` completes the request.
///
/// # Safety
/// `buf` is NULL or points to `bytes` writable bytes that nothing else uses until the request
/// completes; `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommIrecv(
    buf: *mut c_void,
    bytes: usize,
    src: c_int,
    tag: c_int,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    guard("hcommIrecv", || {
        // SAFETY: the caller passes NULL or the address of an hcommRequest_t.
        unsafe { store_request(request, || start_recv(buf, bytes, src, tag, comm)) }
    })
}

/// Waits (at most `HCOMM_TIMEOUT`) for `*request` to complete and returns its result; the
/// request is released and `*request` set to `HCOMM_REQUEST_NULL`, also when it failed.
/// `*request == HCOMM_REQUEST_NULL` returns `HCOMM_SUCCESS` at once.
///
/// # Safety
/// `request` is NULL or points to a readable and writable `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommWait(request: *mut hcommRequest_t) -> c_int {
    guard("hcommWait", || {
        state::with_tables(|_| Ok(()))?;
        args::out(request, "request")?;
        // SAFETY: checked not NULL; the caller passes the address of an hcommRequest_t.
        let handle = unsafe { request.read() };
        if handle.is_null() {
            return Ok(());
        }
        let pending = state::with_tables(|t| t.take_request(handle))?;
        // SAFETY: as above.
        unsafe { request.write(HCOMM_REQUEST_NULL) };
        finish(pending)
    })
}

/// Tells without waiting whether `*request` has completed: `*done` becomes 1 (the request is
/// released, `*request` set to `HCOMM_REQUEST_NULL`, and its result returned) or 0 (it is
/// still running; `HCOMM_SUCCESS`). `*request == HCOMM_REQUEST_NULL` gives `*done = 1`.
///
/// # Safety
/// `request` and `done` are NULL or point to a readable and writable `hcommRequest_t` and a
/// writable `int`.
#[no_mangle]
pub unsafe extern "C" fn hcommTest(request: *mut hcommRequest_t, done: *mut c_int) -> c_int {
    guard("hcommTest", || {
        state::with_tables(|_| Ok(()))?;
        args::out(request, "request")?;
        args::out(done, "done")?;
        // SAFETY: both checked not NULL; the caller passes the addresses of an
        // hcommRequest_t and an int.
        unsafe { done.write(0) };
        // SAFETY: as above.
        let handle = unsafe { request.read() };
        if !handle.is_null() {
            let finished = state::with_tables(|t| {
                if t.request(handle)?.request.test()? {
                    t.take_request(handle).map(Some)
                } else {
                    Ok(None)
                }
            })?;
            let Some(pending) = finished else {
                return Ok(());
            };
            // SAFETY: as above.
            unsafe { request.write(HCOMM_REQUEST_NULL) };
            // SAFETY: as above.
            unsafe { done.write(1) };
            return finish(pending);
        }
        // SAFETY: as above.
        unsafe { done.write(1) };
        Ok(())
    })
}
