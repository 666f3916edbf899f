//! Nonblocking operations on memory that hcomm does not own: front ends that hold foreign
//! buffers (Python objects with the buffer protocol, C pointers) lend them for the time of
//! one operation instead of copying them into a `Vec`.
//!
//! The only unsafe step is making a [`RawBuf`]: its constructor's contract is what keeps the
//! memory valid. Everything built on it is safe: a [`Request`] that uses lent memory
//! finishes the operation before it goes, even when dropped unwaited, so the memory is never
//! touched after [`Request::wait`], a [`Request::test`] that says done, or the drop returns.

use std::ptr::NonNull;

use super::{Communicator, Request};
use crate::coll::Shape;
use crate::error::Result;
use crate::p2p::Blocking;

/// Memory lent to hcomm for one nonblocking operation: `len` bytes at a pointer.
///
/// Made unsafely by [`RawBuf::new`] or [`RawBuf::new_const`], then given to
/// [`Communicator::isend_raw`], [`Communicator::irecv_raw`] or
/// [`Communicator::start_collective_raw`]. hcomm reads a buffer given as a send buffer and
/// writes (and reads) one given as a receive buffer; the [`Request`] of the call tells when
/// it is done with both.
#[derive(Debug)]
pub struct RawBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a RawBuf is an address and a length; the contract of its constructors makes the
// memory usable from any thread (the operation may run on hcomm's threads) until the
// operation that holds it completes.
unsafe impl Send for RawBuf {}

impl RawBuf {
    /// Lends `len` bytes at `ptr`, which hcomm may write when they are given as a receive
    /// buffer. A null `ptr` is allowed when `len` is 0.
    ///
    /// # Safety
    /// From this call until the operation the buffer is given to completes (its
    /// [`Request::wait`] returns, its [`Request::test`] returns `Ok(true)`, or the request is
    /// dropped; forever if the request is leaked, or if it is never given to an operation and
    /// leaked itself), `ptr..ptr+len` must be one allocation that stays valid for reads and,
    /// if the buffer is given as a receive buffer, for writes; nothing else may write to it,
    /// and nothing else may read it while hcomm writes it (a receive buffer, an in-place
    /// collective). The buffers of one call must not overlap each other.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> RawBuf {
        let ptr = match NonNull::new(ptr) {
            Some(p) if len > 0 => p,
            _ => NonNull::dangling(),
        };
        RawBuf { ptr, len }
    }

    /// Lends `len` read-only bytes at `ptr`: for send buffers only (a receive buffer made
    /// from it would be written).
    ///
    /// # Safety
    /// As for [`RawBuf::new`]; and when the memory may not be written, the buffer must be
    /// given only as the send buffer of a call that is not in place.
    pub unsafe fn new_const(ptr: *const u8, len: usize) -> RawBuf {
        // SAFETY: forwarded from the caller; hcomm writes only receive buffers.
        unsafe { RawBuf::new(ptr.cast_mut(), len) }
    }

    /// An empty buffer (for ranks that have no buffer in a call, such as the non-roots' receive
    /// buffer of a reduce).
    pub fn empty() -> RawBuf {
        RawBuf {
            ptr: NonNull::dangling(),
            len: 0,
        }
    }

    /// Bytes lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are lent.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the bytes.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

/// The memory of a nonblocking collective: owned by the request, or lent to it.
pub(super) enum Held {
    Owned(Vec<u8>),
    Lent(RawBuf),
}

impl Held {
    pub(super) fn len(&self) -> usize {
        match self {
            Held::Owned(v) => v.len(),
            Held::Lent(r) => r.len(),
        }
    }

    /// The address of the bytes (writable: the holder has them to itself).
    pub(super) fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            Held::Owned(v) => v.as_mut_ptr(),
            Held::Lent(r) => r.as_ptr(),
        }
    }

    /// The buffer a completion gives back: the owned one, or nothing for lent memory.
    pub(super) fn into_vec(self) -> Vec<u8> {
        match self {
            Held::Owned(v) => v,
            Held::Lent(_) => Vec::new(),
        }
    }

    pub(super) fn is_lent(&self) -> bool {
        matches!(self, Held::Lent(_))
    }
}

impl Communicator {
    /// Starts sending the lent `buf` to `dest` with `tag`: [`Communicator::isend`] without
    /// the copy into a `Vec`. The operation progresses in the background;
    /// [`Request::wait`] returns a [`super::Completion`] with an empty `buffer` and the bytes
    /// sent. Dropping the request unwaited waits for the send (at most `HCOMM_TIMEOUT`).
    pub fn isend_raw(&self, buf: RawBuf, dest: usize, tag: u32) -> Result<Request> {
        // SAFETY: RawBuf's contract keeps the bytes readable until the operation completes;
        // the request removes the operation (wait, test, or its drop) before it goes.
        let id = unsafe { self.post_async(Blocking::Send, dest, tag, buf.as_ptr(), buf.len())? };
        Ok(Request::p2p(&self.world, id, None))
    }

    /// Starts receiving from `src` with `tag` into the lent `buf` (its length is the
    /// capacity): [`Communicator::irecv`] without a `Vec` (`src` may be
    /// [`super::ANY_SOURCE`]; [`Request::source`] and the completion then name the sender). [`Request::wait`] returns the
    /// received length; dropping the request unwaited waits for the receive (at most
    /// `HCOMM_TIMEOUT`).
    pub fn irecv_raw(&self, buf: RawBuf, src: usize, tag: u32) -> Result<Request> {
        // SAFETY: RawBuf's contract keeps the bytes writable and unused by others until the
        // operation completes; the request removes the operation before it goes.
        let id = unsafe { self.post_async(Blocking::Recv, src, tag, buf.as_ptr(), buf.len())? };
        Ok(Request::p2p(&self.world, id, None))
    }

    /// Starts any collective in the background on lent buffers:
    /// [`Communicator::start_collective`] without copies, for every shape (v-variants and
    /// in-place ones too: `send` is `None` for in-place calls and collectives without a send
    /// buffer). The arguments are checked before anything is sent. [`Request::wait`] returns
    /// a [`super::Completion`] with an empty `buffer` and the receive bytes used; dropping the
    /// request unwaited waits for the call (each call is bounded by `HCOMM_TIMEOUT`). Calls
    /// are matched in the order they are started.
    pub fn start_collective_raw(
        &self,
        shape: Shape,
        send: Option<RawBuf>,
        recv: RawBuf,
    ) -> Result<Request> {
        self.start(shape, send.map(Held::Lent), Held::Lent(recv))
    }
}
