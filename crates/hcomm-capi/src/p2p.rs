//! Point-to-point messages: blocking `hcommSend`/`hcommRecv`, nonblocking `hcommIsend`/
//! `hcommIrecv` with `hcommWait`/`hcommTest`. A receive's `src` may be `HCOMM_ANY_SOURCE`;
//! `hcommRecvStatus` and `hcommWaitStatus` tell who sent and how many bytes.
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

/// The `src` of `hcommRecv`, `hcommIrecv` and `hcommRecvStatus` that receives a message from
/// any rank of the communicator (MPI's rules: one sender's messages in order, receives
/// matched in the order they were posted, held messages in arrival order). A pending one
/// fails with `HCOMM_ERR_PEER_LOST` when a member of the communicator is lost.
pub const HCOMM_ANY_SOURCE: c_int = -1;

/// A receive's `src`: a rank of the communicator, or `HCOMM_ANY_SOURCE`.
fn source(src: c_int, size: usize) -> Result<usize> {
    if src == HCOMM_ANY_SOURCE {
        return Ok(hcomm_core::ANY_SOURCE);
    }
    args::rank(src, size, "src")
}

/// Writes a receive's sender and length where the caller asked for them.
///
/// # Safety
/// `source` and `count` are NULL or point to a writable `int` and `size_t`.
unsafe fn report(source: *mut c_int, count: *mut usize, (len, src): (usize, Option<usize>)) {
    let src = src.and_then(|s| c_int::try_from(s).ok()).unwrap_or(-1);
    if !source.is_null() {
        // SAFETY: the caller's promise.
        unsafe { source.write(src) };
    }
    if !count.is_null() {
        // SAFETY: the caller's promise.
        unsafe { count.write(len) };
    }
}

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
    let src = source(src, c.size())?;
    let tag = args::tag(tag)?;
    args::buffer(buf, bytes, "buf")?;
    let request = c.irecv(args::staging(bytes, "hcommIrecv")?, src, tag)?;
    state::with_tables(|t| {
        Ok(t.add_request(Pending {
            request,
            recv_into: Some(RecvTarget {
                addr: buf.expose_provenance(),
                len: bytes,
                src: (src != hcomm_core::ANY_SOURCE).then_some(src),
            }),
        }))
    })
}

/// Waits for a request taken out of the table; a receive's data goes to the caller's buffer.
/// Returns the bytes sent or received and, for a receive, the sender.
pub(crate) fn finish(pending: Pending) -> Result<(usize, Option<usize>)> {
    let done = pending.request.wait()?;
    let mut sender = None;
    if let Some(target) = pending.recv_into {
        sender = done.source.or(target.src);
        let data = done
            .buffer
            .get(..done.len)
            .ok_or_else(|| Error::internal("a receive reported more bytes than its buffer"))?;
        if data.len() > target.len {
            return Err(Error::internal(
                "a receive got more bytes than the caller's buffer",
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
    Ok((done.len, sender))
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

/// Receives a message from rank `src` of `comm` (or any rank: `HCOMM_ANY_SOURCE`) with `tag`
/// into `bytes` bytes at `buf`. A
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
        let src = source(src, c.size())?;
        let tag = args::tag(tag)?;
        // SAFETY: the caller's buffer holds `bytes` writable bytes during this call, used by
        // nobody else.
        let data = unsafe { args::bytes_mut(buf, bytes, "buf")? };
        c.recv(data, src, tag).map(drop)
    })
}

/// `hcommRecv` that also tells who sent the message and how long it is: `*source` becomes
/// the sender's rank in `comm` (useful with `src = HCOMM_ANY_SOURCE`) and `*count` the bytes
/// received. Either pointer may be NULL. Not inside `hcommGroupStart`/`hcommGroupEnd`.
///
/// # Safety
/// `buf` is NULL or points to `bytes` writable bytes that nothing else uses during the call;
/// `source` and `count` are NULL or point to a writable `int` and `size_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommRecvStatus(
    buf: *mut c_void,
    bytes: usize,
    src: c_int,
    tag: c_int,
    comm: hcommComm_t,
    source_out: *mut c_int,
    count: *mut usize,
) -> c_int {
    guard("hcommRecvStatus", || {
        if group::active() {
            return Err(Error::invalid_argument(
                "hcommRecvStatus cannot be called between hcommGroupStart and hcommGroupEnd: \
                 use hcommIrecv and hcommWaitStatus",
            ));
        }
        let c = state::comm(comm)?;
        let src = source(src, c.size())?;
        let tag = args::tag(tag)?;
        // SAFETY: the caller's buffer holds `bytes` writable bytes during this call, used by
        // nobody else.
        let data = unsafe { args::bytes_mut(buf, bytes, "buf")? };
        let got = if src == hcomm_core::ANY_SOURCE {
            let s = c.recv_any(data, tag)?;
            (s.len, Some(s.source))
        } else {
            (c.recv(data, src, tag)?, Some(src))
        };
        // SAFETY: the caller's promise.
        unsafe { report(source_out, count, got) };
        Ok(())
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
        finish(pending).map(drop)
    })
}

/// `hcommWait` that also tells what the request did: for a receive, `*source` becomes the
/// sender's rank in its communicator (useful after `hcommIrecv` with `HCOMM_ANY_SOURCE`) and
/// `*count` the bytes received; for a send, `*source` is -1 and `*count` the bytes sent; for
/// a collective, -1 and the receive bytes used. `*request == HCOMM_REQUEST_NULL` gives -1
/// and 0. Either output pointer may be NULL.
///
/// # Safety
/// `request` is NULL or points to a readable and writable `hcommRequest_t`; `source` and
/// `count` are NULL or point to a writable `int` and `size_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommWaitStatus(
    request: *mut hcommRequest_t,
    source: *mut c_int,
    count: *mut usize,
) -> c_int {
    guard("hcommWaitStatus", || {
        state::with_tables(|_| Ok(()))?;
        args::out(request, "request")?;
        // SAFETY: checked not NULL; the caller passes the address of an hcommRequest_t.
        let handle = unsafe { request.read() };
        let got = if handle.is_null() {
            (0, None)
        } else {
            let pending = state::with_tables(|t| t.take_request(handle))?;
            // SAFETY: as above.
            unsafe { request.write(HCOMM_REQUEST_NULL) };
            finish(pending)?
        };
        // SAFETY: the caller's promise.
        unsafe { report(source, count, got) };
        Ok(())
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
            return finish(pending).map(drop);
        }
        // SAFETY: as above.
        unsafe { done.write(1) };
        Ok(())
    })
}
