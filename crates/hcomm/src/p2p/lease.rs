//! Memory lent to the engine's operations: the one way a buffer reaches a send or a receive.
//!
//! A [`Lease`] is made safely from a slice (borrowed for the lease's lifetime) or a `Vec`
//! (owned by the lease), or unsafely from raw parts by the front ends that hold foreign
//! memory (the C API, the Python extension), whose contract keeps it valid. The layers above
//! never see a pointer: they hand leases to the engine through three safe doors, each of
//! which ends every operation before the memory can be touched or freed again:
//!
//! * [`Engine::transfer`] (and [`Engine::transfer_any`]): one blocking send or receive on a
//!   borrowed lease;
//! * [`Engine::lend`] (and [`Engine::lend_any`]): a nonblocking operation on a `'static` lease (owned, or raw), held in
//!   a [`Loan`] that must be given back with [`Engine::release`] (a loan dropped otherwise
//!   leaks its memory rather than free it under a live operation);
//! * [`Engine::scope`]: many operations on regions of a few borrowed leases at once (the
//!   collective executor); the scope checks that no two live operations, nor a copy or a
//!   reduction on the calling thread, touch the same bytes when one of them writes, and
//!   cancels whatever is still live when it ends, also when it unwinds.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::{Blocking, Engine, OpId, Target};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::reduce;

/// Memory lent to hcomm for the operations of one call: `len` bytes, readable, and writable
/// unless the lease was made from a shared slice or from a `*const` pointer.
///
/// Made from `&[u8]` (read-only), `&mut [u8]`, `Vec<u8>` (the lease owns it and gives it back
/// with [`Lease::into_vec`]), or from raw parts with [`Lease::from_raw_parts`] and
/// [`Lease::from_raw_parts_const`]. A read-only lease given as a receive buffer fails the call
/// with `InvalidArgument`; nothing is written to it.
#[derive(Debug)]
pub struct Lease<'a> {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
    /// The vector that holds the bytes, when the lease owns them.
    owned: Option<Vec<u8>>,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: a lease is a borrowed or owned byte slice (`&[u8]`, `&mut [u8]` and `Vec<u8>` are
// all Send); one made from raw parts is Send by its constructor's contract.
unsafe impl Send for Lease<'_> {}
// SAFETY: a shared lease gives out only reads of its bytes (as `&[u8]` does); writes take
// `&mut`.
unsafe impl Sync for Lease<'_> {}

impl<'a> From<&'a [u8]> for Lease<'a> {
    fn from(buf: &'a [u8]) -> Lease<'a> {
        Lease {
            ptr: NonNull::from(buf).cast(),
            len: buf.len(),
            writable: false,
            owned: None,
            _borrow: PhantomData,
        }
    }
}

impl<'a> From<&'a mut [u8]> for Lease<'a> {
    fn from(buf: &'a mut [u8]) -> Lease<'a> {
        Lease {
            len: buf.len(),
            ptr: NonNull::from(buf).cast(),
            writable: true,
            owned: None,
            _borrow: PhantomData,
        }
    }
}

impl From<Vec<u8>> for Lease<'static> {
    fn from(mut buf: Vec<u8>) -> Lease<'static> {
        Lease {
            // The heap block does not move when the vector does, and the lease never
            // resizes it.
            ptr: NonNull::from(buf.as_mut_slice()).cast(),
            len: buf.len(),
            writable: true,
            owned: Some(buf),
            _borrow: PhantomData,
        }
    }
}

impl Lease<'static> {
    /// Lends `len` bytes at `ptr`, which hcomm may write when they are given as a receive
    /// buffer. A null `ptr` is allowed when `len` is 0.
    ///
    /// # Safety
    /// From this call until the operation the lease is given to completes (its
    /// [`Request::wait`](crate::Request::wait) returns, its
    /// [`Request::test`](crate::Request::test) returns `Ok(true)`, or the request is dropped;
    /// forever if the request is leaked, or if the lease is never given to an operation and
    /// leaked itself), `ptr..ptr+len` must be one allocation of initialised bytes that stays
    /// valid for reads and writes and may be used from any thread; nothing else may write
    /// to it, and nothing else may read it while hcomm writes it (a receive buffer, an
    /// in-place collective). The buffers of one call must not overlap each other.
    pub unsafe fn from_raw_parts(ptr: *mut u8, len: usize) -> Lease<'static> {
        Lease::raw(ptr, len, true)
    }

    /// Lends `len` read-only bytes at `ptr`: for send buffers (given as a receive buffer, or
    /// to an in-place call, the lease fails the call instead of being written).
    ///
    /// # Safety
    /// As for [`Lease::from_raw_parts`], for reads only: nothing may write to the bytes
    /// until the operation completes.
    pub unsafe fn from_raw_parts_const(ptr: *const u8, len: usize) -> Lease<'static> {
        Lease::raw(ptr.cast_mut(), len, false)
    }

    fn raw(ptr: *mut u8, len: usize, writable: bool) -> Lease<'static> {
        let (ptr, len) = match NonNull::new(ptr) {
            Some(p) if len > 0 => (p, len),
            _ => (NonNull::dangling(), 0),
        };
        Lease {
            ptr,
            len,
            writable,
            owned: None,
            _borrow: PhantomData,
        }
    }

    /// An empty lease (for ranks that have no buffer in a call, such as the non-roots'
    /// receive buffer of a reduce).
    pub fn empty() -> Lease<'static> {
        Lease::raw(std::ptr::null_mut(), 0, true)
    }
}

impl<'a> Lease<'a> {
    /// Bytes lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are lent.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether hcomm may write the bytes (a receive buffer).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Whether the lease owns its bytes (it was made from a `Vec`).
    pub(crate) fn is_owned(&self) -> bool {
        self.owned.is_some()
    }

    /// The vector the lease was made from; empty for borrowed or raw memory, whose bytes
    /// are where they were.
    pub fn into_vec(mut self) -> Vec<u8> {
        self.owned.take().unwrap_or_default()
    }

    /// The bytes, to read.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is a live, initialised allocation for the lease's lifetime
        // (a borrowed slice, the owned vector, or raw parts by their contract); while `self`
        // is borrowed no operation of the engine holds it (every door of the module docs
        // borrows or owns the lease for as long as its operations live).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to write: an `InvalidArgument` error for a read-only lease.
    pub(crate) fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        if !self.writable {
            return Err(read_only(self.len));
        }
        // SAFETY: as in `as_slice`, and the lease is writable and borrowed mutably.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// A lease of the same bytes for a shorter borrow (not owning them).
    pub(crate) fn reborrow(&mut self) -> Lease<'_> {
        Lease {
            ptr: self.ptr,
            len: self.len,
            writable: self.writable,
            owned: None,
            _borrow: PhantomData,
        }
    }

    /// A read-only lease of the same bytes for a shorter borrow.
    pub(crate) fn share(&self) -> Lease<'_> {
        Lease {
            ptr: self.ptr,
            len: self.len,
            writable: false,
            owned: None,
            _borrow: PhantomData,
        }
    }

    /// The engine's pointer for an operation of `kind` on the whole lease.
    fn buf_for(&self, kind: Blocking) -> Result<BufPtr> {
        if kind == Blocking::Recv && !self.writable {
            return Err(read_only(self.len));
        }
        Ok(BufPtr(self.ptr.as_ptr()))
    }
}

fn read_only(len: usize) -> Error {
    Error::invalid_argument(format!(
        "a read-only buffer of {len} bytes was given where hcomm writes (a receive buffer, \
         or an in-place call)"
    ))
}

/// A user buffer, valid while its operation is live: the engine's handle of a lease.
#[derive(Debug, Clone, Copy)]
pub(super) struct BufPtr(pub(super) *mut u8);

// SAFETY: the pointer is only dereferenced under the engine lock while the operation that owns
// it is live, and the doors of this module keep the lease alive and unaliased for that time.
unsafe impl Send for BufPtr {}

impl Engine {
    /// A blocking send or receive of the whole `buf`: the operation is removed (done, failed
    /// or timed out) before this returns.
    pub(crate) fn transfer(
        &self,
        kind: Blocking,
        t: Target,
        buf: &mut Lease<'_>,
        timeout: Duration,
    ) -> Result<usize> {
        let p = buf.buf_for(kind)?;
        // SAFETY: the lease is borrowed mutably for this call (valid for reads, and for
        // writes when a receive, checked above); `blocking` removes the operation first.
        unsafe { self.blocking(kind, t, p.0, buf.len(), timeout) }
    }

    /// A blocking receive from any of `members` (world ranks) into the whole `buf`, by
    /// `deadline`: its length, and its sender once matched. The operation is removed before
    /// this returns.
    pub(crate) fn transfer_any(
        &self,
        t: Target,
        members: Arc<[usize]>,
        buf: &mut Lease<'_>,
        deadline: Instant,
    ) -> (Result<usize>, Option<usize>) {
        let p = match buf.buf_for(Blocking::Recv) {
            Ok(p) => p,
            Err(e) => return (Err(e), None),
        };
        // SAFETY: the lease is borrowed mutably for this call and writable (checked above);
        // `wait` removes the operation (on success, error or timeout) before this returns.
        let id = match unsafe { self.post_recv_any(t, members, p.0, buf.len(), false) } {
            Ok(id) => id,
            Err(e) => return (Err(e), None),
        };
        let len = self.wait(id, deadline);
        (len, self.take_source(id))
    }

    /// Starts a nonblocking receive from any of `members` (world ranks) into the whole
    /// `lease`, as [`Engine::lend`].
    pub(crate) fn lend_any(
        &self,
        t: Target,
        members: Arc<[usize]>,
        lease: Lease<'static>,
    ) -> Result<Loan> {
        let p = lease.buf_for(Blocking::Recv)?;
        // SAFETY: as in `lend`; the lease is writable (checked by `buf_for`).
        let id = unsafe { self.post_recv_any(t, members, p.0, lease.len(), true)? };
        Ok(Loan {
            id,
            lease: Some(lease),
            live: true,
        })
    }

    /// Starts a nonblocking send or receive of the whole `lease`, which the returned loan
    /// holds until the operation is collected.
    pub(crate) fn lend(&self, kind: Blocking, t: Target, lease: Lease<'static>) -> Result<Loan> {
        let p = lease.buf_for(kind)?;
        let id = match kind {
            // SAFETY: the loan holds the lease (owned memory, or raw memory whose contract
            // keeps it valid) until the operation is removed: by `wait_loan`, `test_loan`,
            // or `release`; a loan dropped otherwise leaks the memory (see `Loan`'s drop).
            Blocking::Send => unsafe { self.post_send(t, p.0, lease.len(), true)? },
            // SAFETY: as above; the lease is writable (checked by `buf_for`).
            Blocking::Recv => unsafe { self.post_recv(t, p.0, lease.len(), true)? },
        };
        Ok(Loan {
            id,
            lease: Some(lease),
            live: true,
        })
    }

    /// Progresses and returns the loan's result once its operation has completed (the
    /// operation is then removed).
    pub(crate) fn test_loan(&self, loan: &mut Loan) -> Option<Result<usize>> {
        if !loan.live {
            return None;
        }
        let r = self.test(loan.id);
        loan.live = r.is_none();
        r
    }

    /// Waits until the loan's operation completes or `deadline` passes; the operation is
    /// removed either way.
    pub(crate) fn wait_loan(&self, loan: &mut Loan, deadline: Instant) -> Result<usize> {
        if !loan.live {
            return Err(Error::internal("the operation was already collected"));
        }
        let r = self.wait(loan.id, deadline);
        loan.live = false;
        r
    }

    /// Gives back a loan that will not be waited for: an owned buffer goes to the engine,
    /// which finishes the operation in the background and then frees it; raw memory cannot
    /// be handed over, so the operation is finished here (or, past `timeout`, cancelled).
    pub(crate) fn release(&self, mut loan: Loan, timeout: Duration) {
        if !loan.live {
            return;
        }
        loan.live = false;
        match loan.lease.as_mut().and_then(|l| l.owned.take()) {
            Some(buffer) => self.detach(loan.id, buffer),
            None => {
                let _ = self.wait(loan.id, Instant::now() + timeout);
            }
        }
    }

    /// Runs `f` with a scope in which operations on regions of `bufs` may be posted, waited
    /// for, and interleaved with copies and reductions on the calling thread. Every
    /// operation still live when `f` returns (or unwinds) is cancelled before this returns.
    pub(crate) fn scope<'b, R>(
        &'b self,
        bufs: &'b mut [Lease<'_>],
        f: impl FnOnce(&mut Ops<'b>) -> R,
    ) -> R {
        let mut ops = Ops {
            engine: self,
            bufs: bufs
                .iter()
                .map(|b| Span {
                    base: b.ptr.as_ptr(),
                    len: b.len,
                    writable: b.writable,
                })
                .collect(),
            live: SmallVec::new(),
            _bufs: PhantomData,
        };
        f(&mut ops)
    }
}

/// A nonblocking operation on a lease, not yet collected. Give it back with
/// [`Engine::release`] when it will not be waited for; dropped while its operation is live,
/// it leaks the memory it holds (the engine may still use it).
#[derive(Debug)]
pub(crate) struct Loan {
    id: OpId,
    lease: Option<Lease<'static>>,
    /// The operation is still in the engine.
    live: bool,
}

impl Loan {
    /// The operation.
    pub(crate) fn id(&self) -> OpId {
        self.id
    }

    /// The lease's vector (see [`Lease::into_vec`]), once the operation was collected.
    pub(crate) fn into_vec(mut self) -> Vec<u8> {
        match self.live {
            true => Vec::new(),
            false => self.lease.take().map(Lease::into_vec).unwrap_or_default(),
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        if self.live {
            // The engine may still read or write the memory: never free it under it.
            std::mem::forget(self.lease.take());
        }
    }
}

/// `len` bytes at `off` of the scope's buffer number `buf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    /// Index of the buffer in the slice given to [`Engine::scope`].
    pub buf: usize,
    /// Offset in the buffer.
    pub off: usize,
    /// Bytes.
    pub len: usize,
}

/// A buffer of a scope.
#[derive(Debug, Clone, Copy)]
struct Span {
    base: *mut u8,
    len: usize,
    writable: bool,
}

/// Addresses `start..end` held by a live operation.
#[derive(Debug, Clone, Copy)]
struct Held {
    id: OpId,
    start: usize,
    end: usize,
    writes: bool,
}

impl Held {
    fn clashes(&self, start: usize, end: usize, writes: bool) -> bool {
        (writes || self.writes) && start < self.end && self.start < end
    }
}

/// Operations on the buffers of one [`Engine::scope`].
pub(crate) struct Ops<'s> {
    engine: &'s Engine,
    /// A collective's send, receive and scratch buffers, or a call's own.
    bufs: SmallVec<[Span; 3]>,
    /// The operations in flight: a schedule's few steps at a time, without an allocation.
    live: SmallVec<[Held; 8]>,
    /// The buffers are borrowed for the scope.
    _bufs: PhantomData<&'s mut [u8]>,
}

impl Ops<'_> {
    /// The address range of `p`, checked against its buffer and, for writes, that the
    /// buffer is writable; and that no live operation holds any of it in a way that clashes.
    fn range(&self, p: Part, writes: bool) -> Result<(*mut u8, usize, usize)> {
        let span = self.bufs.get(p.buf).ok_or_else(|| {
            Error::internal(format!(
                "a collective names buffer {} of {}",
                p.buf,
                self.bufs.len()
            ))
        })?;
        if p.off.checked_add(p.len).is_none_or(|end| end > span.len) {
            return Err(Error::internal(format!(
                "a collective names bytes {}..{} of a {}-byte buffer",
                p.off,
                p.off.saturating_add(p.len),
                span.len
            )));
        }
        if writes && p.len > 0 && !span.writable {
            return Err(read_only(span.len));
        }
        let start = span.base as usize + p.off;
        let end = start + p.len;
        if p.len > 0 && self.live.iter().any(|h| h.clashes(start, end, writes)) {
            return Err(Error::internal(
                "a collective step touches bytes that an unfinished transfer holds",
            ));
        }
        Ok((span.base.wrapping_add(p.off), start, end))
    }

    /// Posts a nonblocking send of `p` (`Blocking::Send`) or a receive into it.
    pub(crate) fn post(&mut self, kind: Blocking, t: Target, p: Part) -> Result<OpId> {
        let writes = kind == Blocking::Recv;
        let (ptr, start, end) = self.range(p, writes)?;
        let id = match kind {
            // SAFETY: `start..end` lies in a buffer borrowed for the scope, which cancels the
            // operation before it ends unless it was collected through `wait_any`; no other
            // live operation writes those bytes (checked by `range`).
            Blocking::Send => unsafe { self.engine.post_send(t, ptr, p.len, false)? },
            // SAFETY: as above; the buffer is writable and no live operation touches the
            // bytes (checked by `range`).
            Blocking::Recv => unsafe { self.engine.post_recv(t, ptr, p.len, false)? },
        };
        Ok(self.hold(id, start, end, writes))
    }

    /// [`Ops::post`], but an operation that completed while it was posted (a small send its
    /// link took at once, a receive whose message was here) is not held: `None`, its result
    /// checked (an error is the operation's). The collectives' steps start so: a step over
    /// at once costs no wait.
    pub(crate) fn start(&mut self, kind: Blocking, t: Target, p: Part) -> Result<Option<OpId>> {
        let writes = kind == Blocking::Recv;
        let (ptr, start, end) = self.range(p, writes)?;
        // SAFETY: as in `post` (a receive's buffer writable, checked by `range`).
        let id = unsafe { self.engine.post_or_done(kind, t, ptr, p.len)? };
        Ok(id.map(|id| self.hold(id, start, end, writes)))
    }

    /// Records that live operation `id` holds `start..end` (and writes it).
    fn hold(&mut self, id: OpId, start: usize, end: usize, writes: bool) -> OpId {
        self.live.push(Held {
            id,
            start,
            end,
            writes,
        });
        id
    }

    /// Posts a send of `p` or a receive into it as the `ordinal`-th direct step of a
    /// collective between this rank and `t.peer` (see [`Engine::direct_sizes`]): the receive
    /// is offered to the peer, whose link writes the message straight into it.
    pub(crate) fn post_direct(
        &mut self,
        kind: Blocking,
        t: Target,
        p: Part,
        ordinal: u32,
    ) -> Result<OpId> {
        let writes = kind == Blocking::Recv;
        let (ptr, start, end) = self.range(p, writes)?;
        let span = self.bufs[p.buf];
        // SAFETY: as in `post`: `start..end` lies in a buffer borrowed for the scope, which
        // cancels the operation before it ends; no live operation clashes with it (checked by
        // `range`), and a receive's buffer is writable. The peer writes only into the
        // receive's own bytes, and not after the operation is cancelled (the link withdraws
        // its offer first).
        let id = unsafe {
            self.engine
                .post_direct(kind, t, (ptr, p.len), (span.base, span.len), ordinal)?
        };
        Ok(self.hold(id, start, end, writes))
    }

    /// Whether any link may take direct steps (see [`Engine::any_direct`]).
    pub(crate) fn any_direct(&self) -> bool {
        self.engine.any_direct()
    }

    /// The sizes of messages to world rank `peer` that go as direct steps (see
    /// [`Engine::direct_sizes`]).
    pub(crate) fn direct_sizes(&self, peer: usize) -> Option<(usize, usize)> {
        self.engine.direct_sizes(peer)
    }

    /// Waits until one of `ids` completes or `deadline` passes, as
    /// [`Engine::wait_any`]; the operation it returns is no longer live.
    pub(crate) fn wait_any(
        &mut self,
        ids: &[OpId],
        deadline: Instant,
    ) -> Result<(usize, Result<usize>)> {
        let (k, r) = self.engine.wait_any(ids, deadline)?;
        if let Some(id) = ids.get(k) {
            self.live.retain(|h| h.id != *id);
        }
        Ok((k, r))
    }

    /// Cancels every live operation (see [`Engine::cancel`]).
    pub(crate) fn cancel_all(&mut self) {
        let ids: Vec<OpId> = self.live.drain(..).map(|h| h.id).collect();
        if !ids.is_empty() {
            self.engine.cancel(&ids);
        }
    }

    /// Copies `src` to `dst` (they may overlap).
    pub(crate) fn copy(&mut self, dst: Part, src: Part) -> Result<()> {
        if dst.len != src.len {
            return Err(Error::internal(
                "a collective copies between regions of different sizes",
            ));
        }
        let (d, _, _) = self.range(dst, true)?;
        let (s, _, _) = self.range(src, false)?;
        if dst.len > 0 {
            // SAFETY: both ranges lie in the scope's buffers, `dst`'s writable, and no live
            // operation holds either in a clashing way (checked by `range`); `copy` allows
            // overlap.
            unsafe { std::ptr::copy(s.cast_const(), d, dst.len) };
        }
        Ok(())
    }

    /// Reduces `src` into `dst` element by element.
    pub(crate) fn reduce(
        &mut self,
        dtype: DataType,
        op: ReduceOp,
        dst: Part,
        src: Part,
    ) -> Result<()> {
        let (d, d0, d1) = self.range(dst, true)?;
        let (s, s0, s1) = self.range(src, false)?;
        if dst.len > 0 && src.len > 0 && d0 < s1 && s0 < d1 {
            return Err(Error::internal("a collective reduces a region into itself"));
        }
        if dst.len == 0 && src.len == 0 {
            return reduce::reduce_into(dtype, op, &mut [], &[]);
        }
        // SAFETY: both ranges lie in the scope's buffers, `dst`'s writable, they do not
        // overlap (checked above), and no live operation holds either in a clashing way
        // (checked by `range`); the slices end with this call.
        let (dst_bytes, src_bytes) = unsafe {
            (
                std::slice::from_raw_parts_mut(d, dst.len),
                std::slice::from_raw_parts(s.cast_const(), src.len),
            )
        };
        reduce::reduce_into(dtype, op, dst_bytes, src_bytes)
    }
}

impl Drop for Ops<'_> {
    fn drop(&mut self) {
        self.cancel_all();
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{pair, shm_pair, target, WAIT};
    use super::*;
    use crate::transport::wire::FAST_PAYLOAD;

    fn part(buf: usize, off: usize, len: usize) -> Part {
        Part { buf, off, len }
    }

    #[test]
    fn raw_parts_without_memory_lend_nothing_and_read_only_leases_are_never_written() {
        // SAFETY: a null pointer lends no bytes, whatever the length says.
        let lease = unsafe { Lease::from_raw_parts(std::ptr::null_mut(), 5) };
        assert!(lease.is_empty());
        let data = [7u8; 4];
        let mut ro = Lease::from(&data[..]);
        assert!(!ro.is_writable());
        assert!(matches!(ro.as_mut_slice(), Err(Error::InvalidArgument(_))));
        let (e0, _e1) = pair();
        let got = e0.transfer(Blocking::Recv, target(1, 1, [0; 2]), &mut ro, WAIT);
        assert!(matches!(got, Err(Error::InvalidArgument(_))), "{got:?}");
        let owned = Lease::from(vec![1u8, 2, 3]);
        assert!(owned.is_owned());
        assert_eq!(owned.into_vec(), vec![1, 2, 3]);
    }

    #[test]
    fn a_scope_refuses_to_touch_bytes_a_live_transfer_holds_until_it_completes() {
        let (e0, e1) = pair();
        let mut buf = [0u8; 16];
        let mut other = [9u8; 16];
        let mut bufs = [Lease::from(&mut buf[..]), Lease::from(&mut other[..])];
        e1.scope(&mut bufs, |ops| {
            let r = ops
                .post(Blocking::Recv, target(0, 2, [0; 2]), part(0, 0, 8))
                .expect("post a receive");
            // Bytes the receive writes: no copy into them, no copy or send out of them.
            let clash = |e: Result<()>| matches!(e, Err(Error::Internal(_)));
            assert!(clash(ops.copy(part(0, 4, 8), part(1, 0, 8))));
            assert!(clash(ops.copy(part(1, 0, 8), part(0, 7, 8))));
            let send = ops.post(Blocking::Send, target(0, 3, [0; 2]), part(0, 0, 1));
            assert!(matches!(send, Err(Error::Internal(_))), "{send:?}");
            assert!(clash(ops.reduce(
                DataType::Uint8,
                ReduceOp::Sum,
                part(0, 0, 4),
                part(1, 0, 4)
            )));
            // Bytes beside it are free.
            ops.copy(part(0, 8, 8), part(1, 8, 8))
                .expect("a copy beside it");
            let data = [5u8; 8];
            e0.transfer(
                Blocking::Send,
                target(1, 2, [0; 2]),
                &mut Lease::from(&data[..]),
                WAIT,
            )
            .expect("the peer sends");
            let (k, got) = ops.wait_any(&[r], Instant::now() + WAIT).expect("wait");
            assert_eq!((k, got.expect("the receive")), (0, 8));
            ops.reduce(DataType::Uint8, ReduceOp::Sum, part(0, 0, 8), part(1, 0, 8))
                .expect("a reduction once the receive is done");
            assert!(clash(ops.reduce(
                DataType::Uint8,
                ReduceOp::Sum,
                part(0, 0, 8),
                part(0, 4, 8)
            )));
        });
        assert_eq!(buf[..8], [14u8; 8]);
        assert_eq!(buf[8..], [9u8; 8]);
    }

    /// A step that completes while it starts (its message is here already) is not held: its
    /// bytes are in place and free at once; one that must wait is held until collected.
    #[test]
    fn a_step_over_at_its_start_is_not_held() {
        let (e0, e1) = pair();
        let (early, later) = ([5u8; 8], [6u8; 8]);
        for (tag, data) in [(6, &early), (7, &later)] {
            e0.transfer(
                Blocking::Send,
                target(1, tag, [0; 2]),
                &mut Lease::from(&data[..]),
                WAIT,
            )
            .expect("send");
        }
        // Receiving the later message reads the early one too, which then waits unmatched.
        let mut got = [0u8; 8];
        e1.transfer(
            Blocking::Recv,
            target(0, 7, [0; 2]),
            &mut Lease::from(&mut got[..]),
            WAIT,
        )
        .expect("the later message");
        let mut buf = [0u8; 16];
        let mut other = [1u8; 8];
        let mut bufs = [Lease::from(&mut buf[..]), Lease::from(&mut other[..])];
        e1.scope(&mut bufs, |ops| {
            let started = ops.start(Blocking::Recv, target(0, 6, [0; 2]), part(0, 0, 8));
            assert!(matches!(started, Ok(None)), "{started:?}");
            ops.copy(part(1, 0, 8), part(0, 0, 8))
                .expect("its bytes are free");
            let waiting = ops.start(Blocking::Recv, target(0, 8, [0; 2]), part(0, 8, 8));
            let Ok(Some(id)) = waiting else {
                panic!("{waiting:?}");
            };
            let copy = ops.copy(part(0, 8, 8), part(1, 0, 8));
            assert!(matches!(copy, Err(Error::Internal(_))), "{copy:?}");
            e0.transfer(
                Blocking::Send,
                target(1, 8, [0; 2]),
                &mut Lease::from(&later[..]),
                WAIT,
            )
            .expect("send the awaited message");
            let (_, got) = ops.wait_any(&[id], Instant::now() + WAIT).expect("wait");
            assert_eq!(got.expect("the receive"), 8);
        });
        assert_eq!((other, &buf[8..]), (early, &later[..]));
    }

    /// A small send of a step to a local peer goes into the peer's inline slot at its start
    /// and is not held (no operation); a larger one is posted and held until collected. Both
    /// arrive, in their order.
    #[test]
    fn a_small_step_send_to_a_local_peer_goes_inline_unposted() {
        let (e0, e1) = shm_pair(WAIT);
        let small = [4u8; 8];
        let large = vec![9u8; FAST_PAYLOAD + 1];
        let (mut got_small, mut got_large) = ([0u8; 8], vec![0u8; large.len()]);
        std::thread::scope(|s| {
            s.spawn(|| {
                for (tag, buf) in [(2, &mut got_small[..]), (3, &mut got_large[..])] {
                    let mut lease = Lease::from(buf);
                    e1.transfer(Blocking::Recv, target(0, tag, [0; 2]), &mut lease, WAIT)
                        .expect("receive");
                }
            });
            let mut bufs = [Lease::from(&small[..]), Lease::from(&large[..])];
            e0.scope(&mut bufs, |ops| {
                let inline = ops.start(Blocking::Send, target(1, 2, [0; 2]), part(0, 0, 8));
                assert!(matches!(inline, Ok(None)), "{inline:?}");
                let to = target(1, 3, [0; 2]);
                let posted = ops.start(Blocking::Send, to, part(1, 0, large.len()));
                let Ok(Some(id)) = posted else {
                    panic!("{posted:?}");
                };
                let (_, sent) = ops.wait_any(&[id], Instant::now() + WAIT).expect("wait");
                assert_eq!(sent.expect("the larger send"), large.len());
            });
        });
        assert_eq!((got_small, got_large), (small, large));
    }

    #[test]
    fn a_scope_cancels_what_is_still_live_so_later_messages_miss_its_memory() {
        let (e0, e1) = pair();
        let mut buf = [0u8; 8];
        let mut bufs = [Lease::from(&mut buf[..])];
        e1.scope(&mut bufs, |ops| {
            ops.post(Blocking::Recv, target(0, 4, [0; 2]), part(0, 0, 8))
                .expect("post a receive")
        });
        let data = [3u8; 8];
        let mut lease = Lease::from(&data[..]);
        e0.transfer(Blocking::Send, target(1, 4, [0; 2]), &mut lease, WAIT)
            .expect("send");
        let mut again = Lease::from(vec![0u8; 8]);
        let n = e1
            .transfer(Blocking::Recv, target(0, 4, [0; 2]), &mut again, WAIT)
            .expect("the next receive gets the message");
        assert_eq!((n, again.into_vec()), (8, data.to_vec()));
        assert_eq!(buf, [0u8; 8]);
    }

    #[test]
    fn a_loan_gives_its_vector_back_once_collected_and_a_released_one_finishes_alone() {
        let (e0, e1) = pair();
        let mut loan = e1
            .lend(
                Blocking::Recv,
                target(0, 5, [0; 2]),
                Lease::from(vec![0u8; 6]),
            )
            .expect("lend a receive");
        let dropped = e1
            .lend(
                Blocking::Recv,
                target(0, 6, [0; 2]),
                Lease::from(vec![0u8; 6]),
            )
            .expect("lend another");
        e1.release(dropped, WAIT);
        for tag in [5, 6] {
            let mut data = Lease::from(&b"leased"[..]);
            e0.transfer(Blocking::Send, target(1, tag, [0; 2]), &mut data, WAIT)
                .expect("send");
        }
        let n = e1
            .wait_loan(&mut loan, Instant::now() + WAIT)
            .expect("the receive");
        assert_eq!((n, loan.into_vec()), (6, b"leased".to_vec()));
    }
}
