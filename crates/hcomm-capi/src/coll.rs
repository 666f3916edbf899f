//! The collectives: `hcommAllReduce` .. `hcommBarrier`, the v-variants `hcommAllGatherv` and
//! `hcommAlltoAllv`, and the nonblocking forms `hcommIallReduce` .. `hcommIbarrier`.
//!
//! A call is checked against its communicator ([`Call::layout`]: root, count, counts and
//! displacements, NULL buffers, in-place forms), then run on the Rust communicator's untyped
//! entry point ([`Communicator::run_collective`]), or queued until `hcommGroupEnd` inside a
//! group. A nonblocking call is checked the same way, then started on the caller's buffers
//! without a copy ([`Communicator::start_collective_raw`]); its request completes through
//! `hcommWait` or `hcommTest`, and the buffers must stay valid until then.
//!
//! In-place forms follow NCCL and run without a copy: all-reduce, reduce (root) and
//! all-to-all when `sendbuf == recvbuf`; all-gather when `sendbuf == recvbuf + rank *
//! sendcount` and gather when that holds at the root; scatter when `recvbuf == sendbuf +
//! root * recvcount` at the root. Other overlapping buffers work too (reduce-scatter's
//! in-place form among them): the send buffer is copied first, so a `const` send buffer is
//! never written.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use hcomm_core::{CollKind, Shape, VLayout};
use hcomm_core::{Communicator, DataType, Error, Lease, ReduceOp, Request, Result};

use crate::args;
use crate::error::guard;
use crate::group;
use crate::p2p;
use crate::state::{self, Pending};
use crate::types::{hcommComm_t, hcommRequest_t, DataTypeArg, ReduceOpArg};

/// One collective call as the caller made it.
#[derive(Clone)]
pub(crate) struct Call {
    pub(crate) comm: hcommComm_t,
    pub(crate) kind: CollKind,
    pub(crate) dtype: DataType,
    pub(crate) op: ReduceOp,
    /// Elements as the C function takes them (all-gather-v: what this rank sends).
    pub(crate) count: usize,
    pub(crate) root: c_int,
    pub(crate) send: *const c_void,
    pub(crate) recv: *mut c_void,
    /// The counts and displacements of a v-variant, copied from the caller's arrays.
    pub(crate) v: Option<Arc<VLayout>>,
}

/// A checked call: its shape and the caller's buffers it reads and writes.
pub(crate) struct Layout {
    pub(crate) shape: Shape,
    /// The send buffer (none in place, for broadcast and barrier, at a scatter's non-root).
    pub(crate) send: Option<(*const c_void, usize)>,
    /// The receive buffer, or the one buffer of an in-place call or a broadcast.
    pub(crate) recv: (*mut c_void, usize),
}

fn overlap(a: (usize, usize), b: (usize, usize)) -> bool {
    a.1 > 0 && b.1 > 0 && a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

impl Call {
    /// Checks the call against `comm`: root, count, buffers.
    pub(crate) fn layout(&self, comm: &Communicator) -> Result<Layout> {
        let (n, rank) = (comm.size(), comm.rank());
        let root = if self.kind.rooted() {
            args::rank(self.root, n, "root")?
        } else {
            0
        };
        let block = args::byte_size(self.count, self.dtype, 1, "count")?;
        args::byte_size(self.count, self.dtype, n, "count")?;
        let (send, recv) = (self.send.addr(), self.recv.addr());
        let at = |base: usize, r: usize| base.checked_add(r * block);
        let mut count = self.count;
        let in_place = match (self.kind, self.v.as_deref()) {
            (CollKind::AllReduce | CollKind::AllToAll, _) => send == recv,
            (CollKind::Reduce, _) => rank == root && send == recv,
            (CollKind::AllGather, _) => Some(send) == at(recv, rank),
            (CollKind::Gather, _) => rank == root && Some(send) == at(recv, root),
            (CollKind::Scatter, _) => rank == root && Some(recv) == at(send, root),
            (CollKind::ReduceScatter | CollKind::Broadcast | CollKind::Barrier, _) => false,
            (CollKind::AllGatherV, Some(v)) => {
                if self.count != v.recv_counts[rank] {
                    return Err(Error::invalid_argument(format!(
                        "sendcount {} differs from recvcounts[{rank}] = {}: each rank sends \
                         the count the others receive from it",
                        self.count, v.recv_counts[rank]
                    )));
                }
                count = v.recv_counts.iter().sum();
                Some(send) == recv.checked_add(v.recv_displs[rank] * self.dtype.size())
            }
            (CollKind::AllToAllV, Some(_)) => {
                count = 0;
                false
            }
            (other, _) => {
                return Err(Error::internal(format!(
                    "{} has no C entry point",
                    other.name()
                )))
            }
        };
        let shape = Shape {
            in_place,
            v: self.v.clone(),
            ..Shape::new(self.kind, self.dtype, self.op, count, root, n)
        };
        let layout = if in_place {
            // An in-place scatter works in the root's (larger) send buffer, only reading it.
            let (buf, name) = match self.kind {
                CollKind::Scatter => (self.send.cast_mut(), "sendbuf"),
                _ => (self.recv, "recvbuf"),
            };
            let len = shape.recv_bytes(rank);
            args::buffer(buf, len, name)?;
            Layout {
                send: None,
                recv: (buf, len),
                shape,
            }
        } else {
            let recv_name = if self.kind == CollKind::Broadcast {
                "buf"
            } else {
                "recvbuf"
            };
            let recv_len = shape.recv_bytes(rank);
            args::buffer(self.recv, recv_len, recv_name)?;
            let send_len = shape.send_bytes(rank);
            args::buffer(self.send, send_len, "sendbuf")?;
            let has_send = !matches!(self.kind, CollKind::Broadcast | CollKind::Barrier)
                && (self.kind != CollKind::Scatter || rank == root);
            Layout {
                send: has_send.then_some((self.send, send_len)),
                recv: (self.recv, recv_len),
                shape,
            }
        };
        Ok(layout)
    }
}

impl Layout {
    /// Whether the send buffer overlaps the receive buffer (outside the in-place forms).
    pub(crate) fn overlaps(&self) -> bool {
        self.send
            .is_some_and(|(p, l)| overlap((p.addr(), l), (self.recv.0.addr(), self.recv.1)))
    }

    /// Runs the call on `comm`.
    ///
    /// # Safety
    /// The buffers must be what the caller of the C function promised: readable (send) and
    /// writable (receive) for their lengths, and used by nobody else during the call.
    pub(crate) unsafe fn run(self, comm: &Communicator) -> Result<()> {
        let staged;
        let send = match self.send {
            None => None,
            Some((p, l)) => {
                // SAFETY: the caller's promise; the slice is dropped (copied first when it
                // overlaps the receive buffer) before the receive buffer is borrowed.
                let s = unsafe { args::bytes(p, l, "sendbuf")? };
                if self.overlaps() {
                    staged = args::copy_of(s, self.shape.kind.name())?;
                    Some(staged.as_slice())
                } else {
                    Some(s)
                }
            }
        };
        // SAFETY: the caller's promise; it overlaps no live send slice (checked above).
        let recv = unsafe { args::bytes_mut(self.recv.0, self.recv.1, "recvbuf")? };
        comm.run_collective(self.shape, send, recv)
    }

    /// Starts the call on `comm` in the background, on the caller's buffers (a send buffer
    /// that overlaps the receive buffer is copied first, into a lease the request owns).
    ///
    /// # Safety
    /// The buffers must be what the caller of the C function promised: readable (send) and
    /// writable (receive) for their lengths, and used by nobody else, until the request
    /// completes.
    pub(crate) unsafe fn start(self, comm: &Communicator) -> Result<Request> {
        let staged = match self.send {
            Some((p, l)) if self.overlaps() => {
                // SAFETY: the caller's promise; the slice lives only for the copy.
                let s = unsafe { args::bytes(p, l, "sendbuf")? };
                Some(args::copy_of(s, self.shape.kind.name())?)
            }
            _ => None,
        };
        let send = match (self.send, staged) {
            (Some(_), Some(copy)) => Some(Lease::from(copy)),
            // SAFETY: the caller's promise: readable and not written until completion.
            (Some((p, l)), None) => Some(unsafe { Lease::from_raw_parts_const(p.cast(), l) }),
            (None, _) => None,
        };
        // SAFETY: the caller's promise: writable and unused by others until completion; it
        // overlaps no send buffer the call reads (an overlapping one was copied above).
        let recv = unsafe { Lease::from_raw_parts(self.recv.0.cast(), self.recv.1) };
        comm.start_collective_raw(self.shape, send, recv)
    }
}

/// A call: `op` is `None` for collectives without a reduction.
#[allow(clippy::too_many_arguments)]
fn call(
    comm: hcommComm_t,
    kind: CollKind,
    dtype: DataTypeArg,
    op: Option<ReduceOpArg>,
    count: usize,
    root: c_int,
    send: *const c_void,
    recv: *mut c_void,
) -> Result<Call> {
    Ok(Call {
        comm,
        kind,
        dtype: args::data_type(dtype)?,
        op: op.map_or(Ok(ReduceOp::Sum), args::reduce_op)?,
        count,
        root,
        send,
        recv,
        v: None,
    })
}

/// The caller's `n` counts and displacements (elements of `dtype`), each block inside the
/// address space.
///
/// # Safety
/// Each pointer is NULL or points to `n` readable `size_t`.
unsafe fn blocks(
    dtype: DataType,
    n: usize,
    counts: (*const usize, &str),
    displs: (*const usize, &str),
) -> Result<(Vec<usize>, Vec<usize>)> {
    // SAFETY: forwarded from the caller.
    let c = unsafe { args::sizes(counts.0, n, counts.1)? };
    // SAFETY: as above.
    let d = unsafe { args::sizes(displs.0, n, displs.1)? };
    for (p, (&count, &displ)) in c.iter().zip(&d).enumerate() {
        let what = format!("{}[{p}] + {}[{p}]", counts.1, displs.1);
        args::byte_size(count.saturating_add(displ), dtype, 1, &what)?;
    }
    Ok((c, d))
}

/// An all-gather-v call: `sendcount` elements from this rank, `recvcounts[p]` from rank p at
/// `displs[p]`.
///
/// # Safety
/// The arrays are NULL or hold one `size_t` per rank of `comm`.
#[allow(clippy::too_many_arguments)]
unsafe fn allgatherv(
    comm: hcommComm_t,
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    dtype: DataTypeArg,
) -> Result<Call> {
    let n = state::comm(comm)?.size();
    let mut call = call(
        comm,
        CollKind::AllGatherV,
        dtype,
        None,
        sendcount,
        0,
        sendbuf,
        recvbuf,
    )?;
    // SAFETY: forwarded from the caller.
    let (recv_counts, recv_displs) = unsafe {
        blocks(
            call.dtype,
            n,
            (recvcounts, "recvcounts"),
            (displs, "displs"),
        )?
    };
    call.v = Some(Arc::new(VLayout {
        recv_counts,
        recv_displs,
        ..VLayout::default()
    }));
    Ok(call)
}

/// An all-to-all-v call: `sendcounts[p]` elements at `sdispls[p]` to rank p, `recvcounts[p]`
/// from rank p at `rdispls[p]`.
///
/// # Safety
/// The arrays are NULL or hold one `size_t` per rank of `comm`.
#[allow(clippy::too_many_arguments)]
unsafe fn alltoallv(
    comm: hcommComm_t,
    sendbuf: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    dtype: DataTypeArg,
) -> Result<Call> {
    let n = state::comm(comm)?.size();
    let mut call = call(
        comm,
        CollKind::AllToAllV,
        dtype,
        None,
        0,
        0,
        sendbuf,
        recvbuf,
    )?;
    // SAFETY: forwarded from the caller.
    let (send_counts, send_displs) = unsafe {
        blocks(
            call.dtype,
            n,
            (sendcounts, "sendcounts"),
            (sdispls, "sdispls"),
        )?
    };
    // SAFETY: as above.
    let (recv_counts, recv_displs) = unsafe {
        blocks(
            call.dtype,
            n,
            (recvcounts, "recvcounts"),
            (rdispls, "rdispls"),
        )?
    };
    call.v = Some(Arc::new(VLayout {
        send_counts,
        send_displs,
        recv_counts,
        recv_displs,
    }));
    Ok(call)
}

/// Runs the call `make` describes on `comm` now, or queues it inside a group.
fn run(function: &str, comm: hcommComm_t, make: impl FnOnce() -> Result<Call>) -> c_int {
    guard(function, || {
        let c = state::comm(comm)?;
        let call = make()?;
        let layout = call.layout(&c)?;
        if group::active() {
            group::queue(call);
            return Ok(());
        }
        // SAFETY: the C function's contract: the buffers are valid for the call.
        unsafe { layout.run(&c) }
    })
}

/// Starts the call `make` describes on `comm`; `*request` receives its handle (and
/// `HCOMM_REQUEST_NULL` on failure). Refused inside a group, whose queued calls would run
/// after it.
///
/// # Safety
/// `request` is NULL or points to a writable `hcommRequest_t`; the call's buffers are valid
/// until the request completes.
unsafe fn start(
    function: &str,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
    make: impl FnOnce() -> Result<Call>,
) -> c_int {
    guard(function, || {
        let begin = || {
            let c = state::comm(comm)?;
            if group::active() {
                return Err(Error::invalid_argument(format!(
                    "{function} between hcommGroupStart and hcommGroupEnd: the group's calls \
                     would run after it; call the blocking form inside the group, or start \
                     this outside it"
                )));
            }
            let layout = make()?.layout(&c)?;
            // SAFETY: the C function's contract: the buffers stay valid until the request
            // completes.
            let request = unsafe { layout.start(&c)? };
            state::with_tables(|t| {
                Ok(t.add_request(Pending {
                    request,
                    recv_into: None,
                }))
            })
        };
        // SAFETY: the caller passes NULL or the address of an hcommRequest_t.
        unsafe { p2p::store_request(request, begin) }
    })
}

/// Every rank's `recvbuf` (`count` elements) becomes the elementwise `op` of every rank's
/// `sendbuf`. In place: `sendbuf == recvbuf`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them during the call (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
pub unsafe extern "C" fn hcommAllReduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: DataTypeArg,
    op: ReduceOpArg,
    comm: hcommComm_t,
) -> c_int {
    run("hcommAllReduce", comm, || {
        call(
            comm,
            CollKind::AllReduce,
            dtype,
            Some(op),
            count,
            0,
            sendbuf,
            recvbuf,
        )
    })
}

/// The root's `buf` (`count` elements) is copied into every rank's `buf`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them during the call (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
pub unsafe extern "C" fn hcommBroadcast(
    buf: *mut c_void,
    count: usize,
    dtype: DataTypeArg,
    root: c_int,
    comm: hcommComm_t,
) -> c_int {
    run("hcommBroadcast", comm, || {
        call(
            comm,
            CollKind::Broadcast,
            dtype,
            None,
            count,
            root,
            std::ptr::null(),
            buf,
        )
    })
}

/// The root's `recvbuf` (`count` elements) becomes the elementwise `op` of every rank's
/// `sendbuf`; `recvbuf` is not used elsewhere (it may be NULL). In place at the root:
/// `sendbuf == recvbuf`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them during the call (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
pub unsafe extern "C" fn hcommReduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: DataTypeArg,
    op: ReduceOpArg,
    root: c_int,
    comm: hcommComm_t,
) -> c_int {
    run("hcommReduce", comm, || {
        call(
            comm,
            CollKind::Reduce,
            dtype,
            Some(op),
            count,
            root,
            sendbuf,
            recvbuf,
        )
    })
}

/// Every rank's `recvbuf` (size × `sendcount` elements) receives every rank's `sendbuf`
/// (`sendcount` elements), in rank order. In place: `sendbuf == recvbuf + rank * sendcount`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them during the call (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
pub unsafe extern "C" fn hcommAllGather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: DataTypeArg,
    comm: hcommComm_t,
) -> c_int {
    run("hcommAllGather", comm, || {
        call(
            comm,
            CollKind::AllGather,
            dtype,
            None,
            sendcount,
            0,
            sendbuf,
            recvbuf,
        )
    })
}

/// Rank r's `recvbuf` (`recvcount` elements) becomes block r of the elementwise `op` of every
/// rank's `sendbuf` (size × `recvcount` elements). `recvbuf` may lie inside `sendbuf` (NCCL's
/// in-place form is `recvbuf == sendbuf + rank * recvcount`); `sendbuf` is not changed.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them during the call (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
pub unsafe extern "C" fn hcommReduceScatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: DataTypeArg,
    op: ReduceOpArg,
    comm: hcommComm_t,
) -> c_int {
    run("hcommReduceScatter", comm, || {
        call(
            comm,
            CollKind::ReduceScatter,
            dtype,
            Some(op),
            recvcount,
            0,
            sendbuf,
            recvbuf,
        )
    })
}

/// Block p (`count` elements) of every rank's `sendbuf` goes to rank p, which stores it at
/// block (sender) of its `recvbuf`; both buffers hold size × `count` elements. In place:
/// `sendbuf == recvbuf`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them during the call (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
pub unsafe extern "C" fn hcommAlltoAll(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: DataTypeArg,
    comm: hcommComm_t,
) -> c_int {
    run("hcommAlltoAll", comm, || {
        call(
            comm,
            CollKind::AllToAll,
            dtype,
            None,
            count,
            0,
            sendbuf,
            recvbuf,
        )
    })
}

/// The root's `recvbuf` (size × `sendcount` elements) receives every rank's `sendbuf`
/// (`sendcount` elements), in rank order; `recvbuf` is not used elsewhere (it may be NULL).
/// In place at the root: `sendbuf == recvbuf + root * sendcount`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them during the call (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
pub unsafe extern "C" fn hcommGather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: DataTypeArg,
    root: c_int,
    comm: hcommComm_t,
) -> c_int {
    run("hcommGather", comm, || {
        call(
            comm,
            CollKind::Gather,
            dtype,
            None,
            sendcount,
            root,
            sendbuf,
            recvbuf,
        )
    })
}

/// Rank r's `recvbuf` (`recvcount` elements) receives block r of the root's `sendbuf` (size ×
/// `recvcount` elements; not used elsewhere, it may be NULL). In place at the root:
/// `recvbuf == sendbuf + root * recvcount`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them during the call (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
pub unsafe extern "C" fn hcommScatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: DataTypeArg,
    root: c_int,
    comm: hcommComm_t,
) -> c_int {
    run("hcommScatter", comm, || {
        call(
            comm,
            CollKind::Scatter,
            dtype,
            None,
            recvcount,
            root,
            sendbuf,
            recvbuf,
        )
    })
}

/// A barrier call.
fn barrier(comm: hcommComm_t) -> Result<Call> {
    Ok(Call {
        comm,
        kind: CollKind::Barrier,
        dtype: DataType::Uint8,
        op: ReduceOp::Sum,
        count: 0,
        root: 0,
        send: std::ptr::null(),
        recv: std::ptr::null_mut(),
        v: None,
    })
}

/// Returns when every rank of `comm` has called it.
#[no_mangle]
pub extern "C" fn hcommBarrier(comm: hcommComm_t) -> c_int {
    run("hcommBarrier", comm, || barrier(comm))
}

/// All-gather with a count per rank: every rank's `recvbuf` receives rank p's `sendbuf`
/// (`recvcounts[p]` elements; this rank's `sendcount` must equal `recvcounts[rank]`) at
/// element `displs[p]`. `recvcounts` and `displs` hold one entry per rank, in elements, the
/// same on every rank; elements of `recvbuf` outside the blocks are left alone. In place:
/// `sendbuf == recvbuf + displs[rank]` (in elements).
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), the
/// arrays are NULL or hold one `size_t` per rank, and nothing else writes the buffers during
/// the call (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
pub unsafe extern "C" fn hcommAllGatherv(
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    dtype: DataTypeArg,
    comm: hcommComm_t,
) -> c_int {
    run("hcommAllGatherv", comm, || {
        // SAFETY: the caller's promise on the arrays.
        unsafe { allgatherv(comm, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype) }
    })
}

/// All-to-all with counts and displacements per peer, in elements: `sendcounts[p]` elements
/// at `sendbuf + sdispls[p]` go to rank p, which stores them at `recvbuf + rdispls[me]`;
/// `recvcounts[p]` elements arrive from rank p at `recvbuf + rdispls[p]` (each rank's
/// `recvcounts[p]` must equal rank p's `sendcounts[rank]`). Elements of `recvbuf` outside the
/// blocks are left alone. No in-place form: overlapping buffers are copied first.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), the
/// arrays are NULL or hold one `size_t` per rank, and nothing else writes the buffers during
/// the call (inside a group: until `hcommGroupEnd` returns).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hcommAlltoAllv(
    sendbuf: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    dtype: DataTypeArg,
    comm: hcommComm_t,
) -> c_int {
    run("hcommAlltoAllv", comm, || {
        // SAFETY: the caller's promise on the arrays.
        unsafe {
            alltoallv(
                comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype,
            )
        }
    })
}

/// Starts `hcommAllReduce` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it. The buffers
/// are used in place, without a copy, until then. Not between `hcommGroupStart` and
/// `hcommGroupEnd`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them (nor reads the receive buffer) until the request completes;
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommIallReduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: DataTypeArg,
    op: ReduceOpArg,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    // SAFETY: the caller's promise on `request` and the buffers.
    unsafe {
        start("hcommIallReduce", comm, request, || {
            call(
                comm,
                CollKind::AllReduce,
                dtype,
                Some(op),
                count,
                0,
                sendbuf,
                recvbuf,
            )
        })
    }
}

/// Starts `hcommBroadcast` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it. The buffers
/// are used in place, without a copy, until then. Not between `hcommGroupStart` and
/// `hcommGroupEnd`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them (nor reads the receive buffer) until the request completes;
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommIbroadcast(
    buf: *mut c_void,
    count: usize,
    dtype: DataTypeArg,
    root: c_int,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    // SAFETY: the caller's promise on `request` and the buffers.
    unsafe {
        start("hcommIbroadcast", comm, request, || {
            call(
                comm,
                CollKind::Broadcast,
                dtype,
                None,
                count,
                root,
                std::ptr::null(),
                buf,
            )
        })
    }
}

/// Starts `hcommReduce` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it. The buffers
/// are used in place, without a copy, until then. Not between `hcommGroupStart` and
/// `hcommGroupEnd`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them (nor reads the receive buffer) until the request completes;
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hcommIreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: DataTypeArg,
    op: ReduceOpArg,
    root: c_int,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    // SAFETY: the caller's promise on `request` and the buffers.
    unsafe {
        start("hcommIreduce", comm, request, || {
            call(
                comm,
                CollKind::Reduce,
                dtype,
                Some(op),
                count,
                root,
                sendbuf,
                recvbuf,
            )
        })
    }
}

/// Starts `hcommAllGather` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it. The buffers
/// are used in place, without a copy, until then. Not between `hcommGroupStart` and
/// `hcommGroupEnd`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them (nor reads the receive buffer) until the request completes;
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommIallGather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: DataTypeArg,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    // SAFETY: the caller's promise on `request` and the buffers.
    unsafe {
        start("hcommIallGather", comm, request, || {
            call(
                comm,
                CollKind::AllGather,
                dtype,
                None,
                sendcount,
                0,
                sendbuf,
                recvbuf,
            )
        })
    }
}

/// Starts `hcommAllGatherv` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it. The buffers
/// are used in place, without a copy, until then. Not between `hcommGroupStart` and
/// `hcommGroupEnd`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them (nor reads the receive buffer) until the request completes; the
/// arrays are NULL or hold one `size_t` per rank (they are copied: they may go at once);
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hcommIallGatherv(
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    dtype: DataTypeArg,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    let make = || {
        // SAFETY: the caller's promise on the arrays.
        unsafe { allgatherv(comm, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype) }
    };
    // SAFETY: the caller's promise on `request` and the buffers.
    unsafe { start("hcommIallGatherv", comm, request, make) }
}

/// Starts `hcommReduceScatter` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it. The buffers
/// are used in place, without a copy, until then. Not between `hcommGroupStart` and
/// `hcommGroupEnd`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them (nor reads the receive buffer) until the request completes;
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommIreduceScatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: DataTypeArg,
    op: ReduceOpArg,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    // SAFETY: the caller's promise on `request` and the buffers.
    unsafe {
        start("hcommIreduceScatter", comm, request, || {
            call(
                comm,
                CollKind::ReduceScatter,
                dtype,
                Some(op),
                recvcount,
                0,
                sendbuf,
                recvbuf,
            )
        })
    }
}

/// Starts `hcommAlltoAll` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it. The buffers
/// are used in place, without a copy, until then. Not between `hcommGroupStart` and
/// `hcommGroupEnd`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them (nor reads the receive buffer) until the request completes;
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommIalltoAll(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: DataTypeArg,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    // SAFETY: the caller's promise on `request` and the buffers.
    unsafe {
        start("hcommIalltoAll", comm, request, || {
            call(
                comm,
                CollKind::AllToAll,
                dtype,
                None,
                count,
                0,
                sendbuf,
                recvbuf,
            )
        })
    }
}

/// Starts `hcommAlltoAllv` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it. The buffers
/// are used in place, without a copy, until then. Not between `hcommGroupStart` and
/// `hcommGroupEnd`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them (nor reads the receive buffer) until the request completes; the
/// arrays are NULL or hold one `size_t` per rank (they are copied: they may go at once);
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hcommIalltoAllv(
    sendbuf: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    dtype: DataTypeArg,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    let make = || {
        // SAFETY: the caller's promise on the arrays.
        unsafe {
            alltoallv(
                comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype,
            )
        }
    };
    // SAFETY: the caller's promise on `request` and the buffers.
    unsafe { start("hcommIalltoAllv", comm, request, make) }
}

/// Starts `hcommGather` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it. The buffers
/// are used in place, without a copy, until then. Not between `hcommGroupStart` and
/// `hcommGroupEnd`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them (nor reads the receive buffer) until the request completes;
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommIgather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: DataTypeArg,
    root: c_int,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    // SAFETY: the caller's promise on `request` and the buffers.
    unsafe {
        start("hcommIgather", comm, request, || {
            call(
                comm,
                CollKind::Gather,
                dtype,
                None,
                sendcount,
                root,
                sendbuf,
                recvbuf,
            )
        })
    }
}

/// Starts `hcommScatter` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it. The buffers
/// are used in place, without a copy, until then. Not between `hcommGroupStart` and
/// `hcommGroupEnd`.
///
/// # Safety
/// Each buffer is NULL or holds the elements the call reads (send) or writes (receive), and
/// nothing else writes them (nor reads the receive buffer) until the request completes;
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommIscatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: DataTypeArg,
    root: c_int,
    comm: hcommComm_t,
    request: *mut hcommRequest_t,
) -> c_int {
    // SAFETY: the caller's promise on `request` and the buffers.
    unsafe {
        start("hcommIscatter", comm, request, || {
            call(
                comm,
                CollKind::Scatter,
                dtype,
                None,
                recvcount,
                root,
                sendbuf,
                recvbuf,
            )
        })
    }
}

/// Starts `hcommBarrier` in the background; `*request` receives its handle
/// (`HCOMM_REQUEST_NULL` on failure) and `hcommWait` or `hcommTest` completes it once every
/// rank of `comm` has called it. Not between `hcommGroupStart` and `hcommGroupEnd`.
///
/// # Safety
/// `request` is NULL or points to a writable `hcommRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn hcommIbarrier(comm: hcommComm_t, request: *mut hcommRequest_t) -> c_int {
    // SAFETY: the caller's promise on `request`.
    unsafe { start("hcommIbarrier", comm, request, || barrier(comm)) }
}
