//! Nonblocking operations on leased memory: front ends that hold foreign buffers (Python
//! objects with the buffer protocol, C pointers) lend them for the time of one operation as a
//! [`Lease`] made from raw parts, instead of copying them into a `Vec`.
//!
//! The only unsafe step is making the lease ([`Lease::from_raw_parts`]): its contract is
//! what keeps the memory valid. Everything built on it is safe: a [`Request`] that uses lent
//! memory finishes the operation before it goes, even when dropped unwaited, so the memory is
//! never touched after [`Request::wait`], a [`Request::test`] that says done, or the drop
//! returns.

use super::{Communicator, Request};
use crate::coll::Shape;
use crate::error::Result;
use crate::p2p::lease::Lease;
use crate::p2p::Blocking;

impl Communicator {
    /// Starts sending the lent `buf` to `dest` with `tag`: [`Communicator::isend`] without
    /// the copy into a `Vec`. The operation progresses in the background;
    /// [`Request::wait`] returns a [`super::Completion`] with an empty `buffer` and the bytes
    /// sent. Dropping the request unwaited waits for the send (at most `HCOMM_TIMEOUT`).
    pub fn isend_raw(&self, buf: Lease<'static>, dest: usize, tag: u32) -> Result<Request> {
        self.post_async(Blocking::Send, dest, tag, buf)
    }

    /// Starts receiving from `src` with `tag` into the lent `buf` (its length is the
    /// capacity): [`Communicator::irecv`] without a `Vec` (`src` may be
    /// [`super::ANY_SOURCE`]; [`Request::source`] and the completion then name the sender).
    /// [`Request::wait`] returns the received length; dropping the request unwaited waits for
    /// the receive (at most `HCOMM_TIMEOUT`).
    pub fn irecv_raw(&self, buf: Lease<'static>, src: usize, tag: u32) -> Result<Request> {
        self.post_async(Blocking::Recv, src, tag, buf)
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
        send: Option<Lease<'static>>,
        recv: Lease<'static>,
    ) -> Result<Request> {
        self.start(shape, send, recv)
    }
}
