//! The collectives: `hcommAllReduce` .. `hcommBarrier`.
//!
//! A call is checked against its communicator ([`Call::layout`]: root, count, NULL buffers,
//! in-place forms), then run on the Rust communicator's untyped entry point
//! ([`Communicator::run_collective`]), or queued until `hcommGroupEnd` inside a group.
//!
//! In-place forms follow NCCL and run without a copy: all-reduce, reduce (root) and
//! all-to-all when `sendbuf == recvbuf`; all-gather when `sendbuf == recvbuf + rank *
//! sendcount` and gather when that holds at the root; scatter when `recvbuf == sendbuf +
//! root * recvcount` at the root. Other overlapping buffers work too (reduce-scatter's
//! in-place form among them): the send buffer is copied first, so a `const` send buffer is
//! never written.

use std::ffi::{c_int, c_void};

use hcomm_core::coll::{CollKind, Shape};
use hcomm_core::{Communicator, DataType, Error, ReduceOp, Result};

use crate::args;
use crate::error::guard;
use crate::group;
use crate::state;
use crate::types::{hcommComm_t, DataTypeArg, ReduceOpArg};

/// One collective call as the caller made it.
#[derive(Clone, Copy)]
pub(crate) struct Call {
    pub(crate) comm: hcommComm_t,
    pub(crate) kind: CollKind,
    pub(crate) dtype: DataType,
    pub(crate) op: ReduceOp,
    pub(crate) count: usize,
    pub(crate) root: c_int,
    pub(crate) send: *const c_void,
    pub(crate) recv: *mut c_void,
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
        let in_place = match self.kind {
            CollKind::AllReduce | CollKind::AllToAll => send == recv,
            CollKind::Reduce => rank == root && send == recv,
            CollKind::AllGather => Some(send) == at(recv, rank),
            CollKind::Gather => rank == root && Some(send) == at(recv, root),
            CollKind::Scatter => rank == root && Some(recv) == at(send, root),
            CollKind::ReduceScatter | CollKind::Broadcast | CollKind::Barrier => false,
            other => {
                return Err(Error::Internal(format!(
                    "{} has no C entry point",
                    other.name()
                )))
            }
        };
        let shape = Shape {
            in_place,
            ..Shape::new(self.kind, self.dtype, self.op, self.count, root, n)
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
    })
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

/// Returns when every rank of `comm` has called it.
#[no_mangle]
pub extern "C" fn hcommBarrier(comm: hcommComm_t) -> c_int {
    run("hcommBarrier", comm, || {
        Ok(Call {
            comm,
            kind: CollKind::Barrier,
            dtype: DataType::Uint8,
            op: ReduceOp::Sum,
            count: 0,
            root: 0,
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
        })
    })
}
