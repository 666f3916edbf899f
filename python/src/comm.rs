//! `hcomm.Communicator`, `hcomm.Request` and `hcomm.Batch`.

use std::sync::{Arc, Mutex, OnceLock, RwLock};

use hcomm::{CollKind, Shape, VLayout};
use hcomm::{DataType, Lease, ReduceOp};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::buffer::Buffer;
use crate::dtype::{moving, op_from, reducing, Dtype};
use crate::errors::{invalid, to_py};
use crate::interrupt;
use crate::pool::PoolMemory;

type Core = hcomm::Communicator;

/// Runs `f` on `comm` with the GIL released, interruptible by Ctrl-C on the main thread.
fn call<R: Send>(
    py: Python<'_>,
    comm: &Arc<Core>,
    f: impl FnOnce(&Core) -> hcomm::Result<R> + Send,
) -> PyResult<R> {
    let guard = interrupt::enter(py, comm)?;
    let r = py.detach(move || {
        let _guard = guard;
        f(comm)
    });
    r.map_err(|e| interrupt::error(py, e))
}

/// A rank, root or count argument: a non-negative integer.
fn index(v: i64, what: &str) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| invalid(format!("{what} must not be negative (got {v})")))
}

/// The source of a receive: a rank, or `ANY_SOURCE` (-1).
fn source_arg(v: i64) -> PyResult<usize> {
    if v == ANY_SOURCE {
        return Ok(hcomm::ANY_SOURCE);
    }
    index(v, "source")
}

/// `hcomm.ANY_SOURCE`: the `source` of a receive that takes a message from any rank.
pub const ANY_SOURCE: i64 = -1;

/// A message tag: 0 ..= 2^32-1.
fn tag(v: i64, what: &str) -> PyResult<u32> {
    u32::try_from(v).map_err(|_| invalid(format!("{what} must be in 0 ..= 4294967295 (got {v})")))
}

/// The reduction of an optional `op` argument (sum when left out).
fn op_arg(op: Option<&Bound<'_, PyAny>>) -> PyResult<ReduceOp> {
    op.map_or(Ok(ReduceOp::Sum), op_from)
}

/// Refuses an output whose element type differs from the input's.
fn same_dtype(what: &str, send: &Buffer, recv: &Buffer) -> PyResult<()> {
    if send.dtype != recv.dtype {
        let name = |d: Option<Dtype>| d.map_or("bytes", Dtype::name);
        return Err(invalid(format!(
            "{what}: recvbuf holds {} but sendbuf {}",
            name(recv.dtype),
            name(send.dtype)
        )));
    }
    Ok(())
}

/// Refuses an output of the wrong number of elements.
fn expect_count(what: &str, buf: &Buffer, want: usize, why: &str) -> PyResult<()> {
    if buf.count() != want {
        return Err(invalid(format!(
            "{what}: {why} must hold {want} elements, not {}",
            buf.count()
        )));
    }
    Ok(())
}

/// Elements per rank of a buffer cut into `size` equal blocks.
fn blocks(what: &str, buf: &Buffer, size: usize) -> PyResult<usize> {
    if buf.count() % size != 0 {
        return Err(invalid(format!(
            "{what}: a buffer of {} elements cannot be cut into {size} equal blocks",
            buf.count()
        )));
    }
    Ok(buf.count() / size)
}

/// The output of a call with an input: `None` (or the input itself) means in place.
fn output(what: &str, send: &Buffer, recv: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Buffer>> {
    let Some(r) = recv else { return Ok(None) };
    let r = Buffer::get_mut(r, &format!("{what}: recvbuf"))?;
    if r.same_memory(send) {
        return Ok(None);
    }
    if r.overlaps(send) {
        return Err(invalid(format!(
            "{what}: sendbuf and recvbuf overlap; pass recvbuf=None to work in place"
        )));
    }
    same_dtype(what, send, &r)?;
    Ok(Some(r))
}

/// Counts and displacements of a v-collective, in elements; displacements default to the
/// packed layout.
fn layout(
    what: &str,
    size: usize,
    counts: Vec<i64>,
    displs: Option<Vec<i64>>,
) -> PyResult<(Vec<usize>, Vec<usize>)> {
    if counts.len() != size {
        return Err(invalid(format!(
            "{what}: {} counts for {size} ranks",
            counts.len()
        )));
    }
    let counts = counts
        .into_iter()
        .map(|c| index(c, &format!("{what}: a count")))
        .collect::<PyResult<Vec<_>>>()?;
    let displs = match displs {
        Some(d) => {
            if d.len() != size {
                return Err(invalid(format!(
                    "{what}: {} displacements for {size} ranks",
                    d.len()
                )));
            }
            d.into_iter()
                .map(|x| index(x, &format!("{what}: a displacement")))
                .collect::<PyResult<Vec<_>>>()?
        }
        None => counts
            .iter()
            .scan(0usize, |at, &c| {
                let d = *at;
                *at += c;
                Some(d)
            })
            .collect(),
    };
    Ok((counts, displs))
}

/// Elements a buffer needs to hold every block of a layout.
fn span(counts: &[usize], displs: &[usize]) -> usize {
    counts
        .iter()
        .zip(displs)
        .map(|(&c, &d)| if c == 0 { 0 } else { c + d })
        .max()
        .unwrap_or(0)
}

/// One collective call, checked: its shape and buffers.
struct Call {
    shape: Shape,
    send: Option<Buffer>,
    /// The receive buffer (`None` where this rank has none).
    recv: Option<Buffer>,
}

/// A shape on `comm`, rooted at 0, not in place.
fn shape_of(comm: &Core, kind: CollKind, dtype: DataType, op: ReduceOp, count: usize) -> Shape {
    Shape::new(kind, dtype, op, count, 0, comm.size())
}

impl Call {
    /// Runs the call, blocking.
    fn run(self, py: Python<'_>, comm: &Arc<Core>) -> PyResult<()> {
        let Call { shape, send, recv } = self;
        // SAFETY: the buffers stay alive (and their views held) for this whole call; they do
        // not overlap (checked when the call was made, else it is in place with no send).
        let (s, r) = unsafe {
            (
                send.as_ref().map(|b| b.bytes()),
                recv.as_ref().map_or(&mut [][..], |b| b.bytes_mut()),
            )
        };
        call(py, comm, move |c| c.run_collective(shape, s, r))
    }

    /// Starts the call in the background, on the buffers themselves (the request keeps
    /// them until the call is done).
    fn start(self, py: Python<'_>, comm: &Arc<Core>) -> PyResult<Request> {
        let Call { shape, send, recv } = self;
        // SAFETY: the request keeps both buffers (and so their memory) until the core is done
        // with them: its wait, a test that says done, or its drop, which waits. They do not
        // overlap (checked when the call was made), and only the receive buffer, writable,
        // is written.
        let (s, r) = unsafe {
            (
                send.as_ref().map(|b| b.lend()),
                recv.as_ref().map_or_else(Lease::empty, |b| b.lend()),
            )
        };
        let req = py
            .detach(|| comm.start_collective_raw(shape, s, r))
            .map_err(to_py)?;
        Ok(Request::pending(req, comm, [send, recv], false))
    }
}

/// A group of ranks: made by `hcomm.init()`, `split` or `dup`.
#[pyclass(frozen, weakref, module = "hcomm._hcomm", name = "Communicator")]
pub struct Communicator {
    inner: RwLock<Option<Arc<Core>>>,
    /// This rank in the communicator.
    #[pyo3(get)]
    rank: usize,
    /// Ranks in the communicator.
    #[pyo3(get)]
    size: usize,
    /// This rank among the communicator's ranks on its host.
    #[pyo3(get)]
    local_rank: usize,
    /// The communicator's ranks on this host.
    #[pyo3(get)]
    local_size: usize,
}

impl Communicator {
    /// Wraps a core communicator.
    pub fn wrap(c: Core) -> Communicator {
        interrupt::install();
        Communicator {
            rank: c.rank(),
            size: c.size(),
            local_rank: c.local_rank(),
            local_size: c.local_size(),
            inner: RwLock::new(Some(Arc::new(c))),
        }
    }

    pub(crate) fn core(&self) -> PyResult<Arc<Core>> {
        match self.inner.read() {
            Ok(g) => g.as_ref().map(Arc::clone).ok_or_else(|| {
                invalid("the communicator was destroyed (Communicator.destroy)".into())
            }),
            Err(_) => Err(invalid("the communicator is unusable".into())),
        }
    }

    fn root(&self, root: i64) -> PyResult<usize> {
        let r = index(root, "root")?;
        if r >= self.size {
            return Err(invalid(format!(
                "root {r} does not exist in a communicator of {} ranks",
                self.size
            )));
        }
        Ok(r)
    }

    fn allreduce_call(
        &self,
        c: &Core,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Call> {
        let w = "allreduce";
        let op = op_arg(op)?;
        let send = Buffer::get(sendbuf, "allreduce: sendbuf")?;
        match output(w, &send, recvbuf)? {
            None => {
                let buf = Buffer::get_mut(sendbuf, "allreduce: the buffer (in place)")?;
                let dt = reducing(buf.dtype, w)?;
                let shape = Shape {
                    in_place: true,
                    ..shape_of(c, CollKind::AllReduce, dt, op, buf.count())
                };
                Ok(Call {
                    shape,
                    send: None,
                    recv: Some(buf),
                })
            }
            Some(recv) => {
                expect_count(w, &recv, send.count(), "recvbuf")?;
                let dt = reducing(send.dtype, w)?;
                Ok(Call {
                    shape: shape_of(c, CollKind::AllReduce, dt, op, send.count()),
                    send: Some(send),
                    recv: Some(recv),
                })
            }
        }
    }

    fn broadcast_call(&self, c: &Core, buf: &Bound<'_, PyAny>, root: i64) -> PyResult<Call> {
        let root = self.root(root)?;
        let buf = Buffer::get_mut(buf, "broadcast: buf")?;
        let (dt, count) = moving(buf.dtype, buf.count());
        Ok(Call {
            shape: Shape {
                root,
                ..shape_of(c, CollKind::Broadcast, dt, ReduceOp::Sum, count)
            },
            send: None,
            recv: Some(buf),
        })
    }

    fn reduce_call(
        &self,
        c: &Core,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        root: i64,
    ) -> PyResult<Call> {
        let w = "reduce";
        let root = self.root(root)?;
        let op = op_arg(op)?;
        let send = Buffer::get(sendbuf, "reduce: sendbuf")?;
        let dt = reducing(send.dtype, w)?;
        let shape = |count, in_place| Shape {
            root,
            in_place,
            ..shape_of(c, CollKind::Reduce, dt, op, count)
        };
        if self.rank != root {
            return Ok(Call {
                shape: shape(send.count(), recvbuf.is_none()),
                send: Some(send),
                recv: None,
            });
        }
        match output(w, &send, recvbuf)? {
            None => {
                let buf = Buffer::get_mut(sendbuf, "reduce: the buffer (in place)")?;
                Ok(Call {
                    shape: shape(buf.count(), true),
                    send: None,
                    recv: Some(buf),
                })
            }
            Some(recv) => {
                expect_count(w, &recv, send.count(), "recvbuf")?;
                Ok(Call {
                    shape: shape(send.count(), false),
                    send: Some(send),
                    recv: Some(recv),
                })
            }
        }
    }

    /// All-gather and gather (`root` for gather).
    fn gather_call(
        &self,
        c: &Core,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: Option<usize>,
    ) -> PyResult<Call> {
        let (kind, w) = match root {
            Some(_) => (CollKind::Gather, "gather"),
            None => (CollKind::AllGather, "allgather"),
        };
        let send = Buffer::get(sendbuf, &format!("{w}: sendbuf"))?;
        let shape = |dtype, count, in_place| {
            let (dt, count) = moving(dtype, count);
            Shape {
                root: root.unwrap_or(0),
                in_place,
                ..shape_of(c, kind, dt, ReduceOp::Sum, count)
            }
        };
        if root.is_some_and(|r| r != self.rank) {
            return Ok(Call {
                shape: shape(send.dtype, send.count(), recvbuf.is_none()),
                send: Some(send),
                recv: None,
            });
        }
        match output(w, &send, recvbuf)? {
            None => {
                let buf = Buffer::get_mut(sendbuf, &format!("{w}: the buffer (in place)"))?;
                let count = blocks(w, &buf, self.size)?;
                Ok(Call {
                    shape: shape(buf.dtype, count, true),
                    send: None,
                    recv: Some(buf),
                })
            }
            Some(recv) => {
                expect_count(
                    w,
                    &recv,
                    send.count() * self.size,
                    "recvbuf (size × sendbuf)",
                )?;
                Ok(Call {
                    shape: shape(send.dtype, send.count(), false),
                    send: Some(send),
                    recv: Some(recv),
                })
            }
        }
    }

    fn allgatherv_call(
        &self,
        c: &Core,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
        counts: Vec<i64>,
        displs: Option<Vec<i64>>,
    ) -> PyResult<Call> {
        let w = "allgatherv";
        let (counts, displs) = layout(w, self.size, counts, displs)?;
        let send = Buffer::get(sendbuf, "allgatherv: sendbuf")?;
        let recv = Buffer::get_mut(recvbuf, "allgatherv: recvbuf")?;
        if recv.overlaps(&send) {
            return Err(invalid(format!("{w}: sendbuf and recvbuf overlap")));
        }
        same_dtype(w, &send, &recv)?;
        expect_count(w, &send, counts[self.rank], "sendbuf (counts[rank])")?;
        let need = span(&counts, &displs);
        if recv.count() < need {
            return Err(invalid(format!(
                "{w}: recvbuf holds {} elements but the counts and displacements need {need}",
                recv.count()
            )));
        }
        let (dt, scale) = moving(send.dtype, 1);
        let v = VLayout {
            recv_counts: counts.iter().map(|c| c * scale).collect(),
            recv_displs: displs.iter().map(|d| d * scale).collect(),
            ..VLayout::default()
        };
        let total = v.recv_counts.iter().sum();
        Ok(Call {
            shape: Shape {
                v: Some(Arc::new(v)),
                ..shape_of(c, CollKind::AllGatherV, dt, ReduceOp::Sum, total)
            },
            send: Some(send),
            recv: Some(recv),
        })
    }

    fn reduce_scatter_call(
        &self,
        c: &Core,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Call> {
        let w = "reduce_scatter";
        let op = op_arg(op)?;
        let send = Buffer::get(sendbuf, "reduce_scatter: sendbuf")?;
        let dt = reducing(send.dtype, w)?;
        match output(w, &send, recvbuf)? {
            None => {
                let buf = Buffer::get_mut(sendbuf, "reduce_scatter: the buffer (in place)")?;
                let count = blocks(w, &buf, self.size)?;
                Ok(Call {
                    shape: Shape {
                        in_place: true,
                        ..shape_of(c, CollKind::ReduceScatter, dt, op, count)
                    },
                    send: None,
                    recv: Some(buf),
                })
            }
            Some(recv) => {
                expect_count(
                    w,
                    &send,
                    recv.count() * self.size,
                    "sendbuf (size × recvbuf)",
                )?;
                Ok(Call {
                    shape: shape_of(c, CollKind::ReduceScatter, dt, op, recv.count()),
                    send: Some(send),
                    recv: Some(recv),
                })
            }
        }
    }

    fn alltoall_call(
        &self,
        c: &Core,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Call> {
        let w = "alltoall";
        let send = Buffer::get(sendbuf, "alltoall: sendbuf")?;
        let (send, recv) = match output(w, &send, recvbuf)? {
            None => (
                None,
                Buffer::get_mut(sendbuf, "alltoall: the buffer (in place)")?,
            ),
            Some(recv) => {
                expect_count(w, &recv, send.count(), "recvbuf")?;
                (Some(send), recv)
            }
        };
        let count = blocks(w, &recv, self.size)?;
        let (dt, count) = moving(recv.dtype, count);
        Ok(Call {
            shape: Shape {
                in_place: send.is_none(),
                ..shape_of(c, CollKind::AllToAll, dt, ReduceOp::Sum, count)
            },
            send,
            recv: Some(recv),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn alltoallv_call(
        &self,
        c: &Core,
        sendbuf: &Bound<'_, PyAny>,
        scounts: Vec<i64>,
        sdispls: Option<Vec<i64>>,
        recvbuf: &Bound<'_, PyAny>,
        rcounts: Vec<i64>,
        rdispls: Option<Vec<i64>>,
    ) -> PyResult<Call> {
        let w = "alltoallv";
        let (sc, sd) = layout(w, self.size, scounts, sdispls)?;
        let (rc, rd) = layout(w, self.size, rcounts, rdispls)?;
        let send = Buffer::get(sendbuf, "alltoallv: sendbuf")?;
        let recv = Buffer::get_mut(recvbuf, "alltoallv: recvbuf")?;
        if recv.overlaps(&send) {
            return Err(invalid(format!("{w}: sendbuf and recvbuf overlap")));
        }
        same_dtype(w, &send, &recv)?;
        for (buf, c, d, name) in [(&send, &sc, &sd, "sendbuf"), (&recv, &rc, &rd, "recvbuf")] {
            let need = span(c, d);
            if buf.count() < need {
                return Err(invalid(format!(
                    "{w}: {name} holds {} elements but its counts and displacements need {need}",
                    buf.count()
                )));
            }
        }
        let (dt, k) = moving(send.dtype, 1);
        let scale = |v: Vec<usize>| v.into_iter().map(|x| x * k).collect();
        let v = VLayout {
            send_counts: scale(sc),
            send_displs: scale(sd),
            recv_counts: scale(rc),
            recv_displs: scale(rd),
        };
        Ok(Call {
            shape: Shape {
                v: Some(Arc::new(v)),
                ..shape_of(c, CollKind::AllToAllV, dt, ReduceOp::Sum, 0)
            },
            send: Some(send),
            recv: Some(recv),
        })
    }

    fn scatter_call(
        &self,
        c: &Core,
        sendbuf: Option<&Bound<'_, PyAny>>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: i64,
    ) -> PyResult<Call> {
        let w = "scatter";
        let root = self.root(root)?;
        let shape = |dtype, count, in_place| {
            let (dt, count) = moving(dtype, count);
            Shape {
                root,
                in_place,
                ..shape_of(c, CollKind::Scatter, dt, ReduceOp::Sum, count)
            }
        };
        if self.rank != root {
            let recv =
                recvbuf.ok_or_else(|| invalid(format!("{w}: recvbuf is needed off the root")))?;
            let recv = Buffer::get_mut(recv, "scatter: recvbuf")?;
            return Ok(Call {
                shape: shape(recv.dtype, recv.count(), false),
                send: None,
                recv: Some(recv),
            });
        }
        let sendbuf = sendbuf.ok_or_else(|| invalid(format!("{w}: the root needs a sendbuf")))?;
        let send = Buffer::get(sendbuf, "scatter: sendbuf")?;
        match output(w, &send, recvbuf)? {
            None => {
                let buf = Buffer::get_mut(sendbuf, "scatter: the buffer (in place)")?;
                let count = blocks(w, &buf, self.size)?;
                Ok(Call {
                    shape: shape(buf.dtype, count, true),
                    send: None,
                    recv: Some(buf),
                })
            }
            Some(recv) => {
                expect_count(
                    w,
                    &send,
                    recv.count() * self.size,
                    "sendbuf (size × recvbuf)",
                )?;
                Ok(Call {
                    shape: shape(recv.dtype, recv.count(), false),
                    send: Some(send),
                    recv: Some(recv),
                })
            }
        }
    }
}

#[pymethods]
impl Communicator {
    fn __repr__(&self) -> String {
        let state = if self.core().is_ok() {
            ""
        } else {
            ", destroyed"
        };
        format!(
            "<hcomm.Communicator rank {} of {} (local {} of {}){state}>",
            self.rank, self.size, self.local_rank, self.local_size
        )
    }

    /// Seconds every wait is bounded by (`HCOMM_TIMEOUT`, or `init(timeout=)`).
    #[getter]
    fn timeout(&self) -> PyResult<f64> {
        Ok(self.core()?.config().timeout.as_secs_f64())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.destroy(py)
    }

    /// Sends the bytes of `buf` to rank `dest` with `tag`; returns when `buf` may be reused.
    #[pyo3(signature = (buf, dest, tag=0))]
    fn send(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, dest: i64, tag: i64) -> PyResult<()> {
        let c = self.core()?;
        let (dest, tag) = (index(dest, "dest")?, self::tag(tag, "tag")?);
        let b = Buffer::get(buf, "send: buf")?;
        // SAFETY: `b` stays alive for the call.
        let s = unsafe { b.bytes() };
        call(py, &c, |c| c.send(s, dest, tag))
    }

    /// Receives a message from rank `source` (or any rank: `ANY_SOURCE`) with `tag` into
    /// `buf`; returns the bytes received (a longer message raises `Truncated`).
    #[pyo3(signature = (buf, source, tag=0))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        source: i64,
        tag: i64,
    ) -> PyResult<usize> {
        let c = self.core()?;
        let (source, tag) = (source_arg(source)?, self::tag(tag, "tag")?);
        let b = Buffer::get_mut(buf, "recv: buf")?;
        // SAFETY: `b` stays alive for the call and nothing else uses it.
        let r = unsafe { b.bytes_mut() };
        call(py, &c, |c| c.recv(r, source, tag))
    }

    /// Receives a message with `tag` from any rank into `buf`; returns `(bytes, source)`.
    /// One sender's messages arrive in order; receives match in the order they were posted.
    /// A lost member of the communicator fails a pending one with `PeerLost`.
    #[pyo3(signature = (buf, tag=0))]
    fn recv_any(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        tag: i64,
    ) -> PyResult<(usize, usize)> {
        let c = self.core()?;
        let tag = self::tag(tag, "tag")?;
        let b = Buffer::get_mut(buf, "recv_any: buf")?;
        // SAFETY: `b` stays alive for the call and nothing else uses it.
        let r = unsafe { b.bytes_mut() };
        call(py, &c, |c| c.recv_any(r, tag).map(|s| (s.len, s.source)))
    }

    /// Sends `sendbuf` to `dest` and receives from `source` into `recvbuf` at once; returns
    /// the bytes received.
    #[pyo3(signature = (sendbuf, dest, recvbuf, source, sendtag=0, recvtag=0))]
    #[allow(clippy::too_many_arguments)]
    fn sendrecv(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        dest: i64,
        recvbuf: &Bound<'_, PyAny>,
        source: i64,
        sendtag: i64,
        recvtag: i64,
    ) -> PyResult<usize> {
        let c = self.core()?;
        let (dest, source) = (index(dest, "dest")?, index(source, "source")?);
        let (st, rt) = (tag(sendtag, "sendtag")?, tag(recvtag, "recvtag")?);
        let s = Buffer::get(sendbuf, "sendrecv: sendbuf")?;
        let r = Buffer::get_mut(recvbuf, "sendrecv: recvbuf")?;
        if s.overlaps(&r) {
            return Err(invalid("sendrecv: sendbuf and recvbuf overlap".into()));
        }
        // SAFETY: both stay alive for the call and do not overlap.
        let (sb, rb) = unsafe { (s.bytes(), r.bytes_mut()) };
        call(py, &c, |c| c.sendrecv(sb, dest, st, rb, source, rt))
    }

    /// Starts sending `buf` to `dest`; `Request.wait()` returns the bytes sent.
    #[pyo3(signature = (buf, dest, tag=0))]
    fn isend(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dest: i64,
        tag: i64,
    ) -> PyResult<Request> {
        let c = self.core()?;
        let (dest, tag) = (index(dest, "dest")?, self::tag(tag, "tag")?);
        let b = Buffer::get(buf, "isend: buf")?;
        // SAFETY: the request keeps `b` until the send is done; the send only reads it.
        let raw = unsafe { b.lend() };
        let req = py.detach(|| c.isend_raw(raw, dest, tag)).map_err(to_py)?;
        Ok(Request::pending(req, &c, [Some(b), None], true))
    }

    /// Starts receiving into `buf` from `source` (or any rank: `ANY_SOURCE`);
    /// `Request.wait()` returns the bytes received, and `Request.source` the sender.
    #[pyo3(signature = (buf, source, tag=0))]
    fn irecv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        source: i64,
        tag: i64,
    ) -> PyResult<Request> {
        let c = self.core()?;
        let (source, tag) = (source_arg(source)?, self::tag(tag, "tag")?);
        let b = Buffer::get_mut(buf, "irecv: buf")?;
        // SAFETY: the request keeps `b`, writable, until the receive is done.
        let raw = unsafe { b.lend() };
        let req = py.detach(|| c.irecv_raw(raw, source, tag)).map_err(to_py)?;
        let req = Request::pending(req, &c, [None, Some(b)], true);
        if source != hcomm::ANY_SOURCE {
            let _ = req.sender.set(source);
        }
        Ok(req)
    }

    /// Every rank's `recvbuf` becomes the elementwise `op` of every rank's `sendbuf`
    /// (in place on `sendbuf` when `recvbuf` is None).
    #[pyo3(signature = (sendbuf, recvbuf=None, op=None))]
    fn allreduce(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let c = self.core()?;
        self.allreduce_call(&c, sendbuf, recvbuf, op)?.run(py, &c)
    }

    /// Nonblocking `allreduce`.
    #[pyo3(signature = (sendbuf, recvbuf=None, op=None))]
    fn iallreduce(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Request> {
        let c = self.core()?;
        self.allreduce_call(&c, sendbuf, recvbuf, op)?.start(py, &c)
    }

    /// The root's `buf` is copied into every rank's `buf`.
    #[pyo3(signature = (buf, root=0))]
    fn broadcast(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, root: i64) -> PyResult<()> {
        let c = self.core()?;
        self.broadcast_call(&c, buf, root)?.run(py, &c)
    }

    /// Nonblocking `broadcast`.
    #[pyo3(signature = (buf, root=0))]
    fn ibroadcast(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, root: i64) -> PyResult<Request> {
        let c = self.core()?;
        self.broadcast_call(&c, buf, root)?.start(py, &c)
    }

    /// The root's `recvbuf` becomes the elementwise `op` of every rank's `sendbuf` (in place
    /// on the root's `sendbuf` when its `recvbuf` is None; other ranks need no `recvbuf`).
    #[pyo3(signature = (sendbuf, recvbuf=None, op=None, root=0))]
    fn reduce(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        root: i64,
    ) -> PyResult<()> {
        let c = self.core()?;
        self.reduce_call(&c, sendbuf, recvbuf, op, root)?
            .run(py, &c)
    }

    /// Nonblocking `reduce`.
    #[pyo3(signature = (sendbuf, recvbuf=None, op=None, root=0))]
    fn ireduce(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        root: i64,
    ) -> PyResult<Request> {
        let c = self.core()?;
        self.reduce_call(&c, sendbuf, recvbuf, op, root)?
            .start(py, &c)
    }

    /// Every rank's `recvbuf` (size × `sendbuf`) receives every rank's `sendbuf` in rank
    /// order; with `recvbuf` None, `sendbuf` is the whole buffer and each rank's block
    /// already holds its contribution.
    #[pyo3(signature = (sendbuf, recvbuf=None))]
    fn allgather(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let c = self.core()?;
        self.gather_call(&c, sendbuf, recvbuf, None)?.run(py, &c)
    }

    /// Nonblocking `allgather`.
    #[pyo3(signature = (sendbuf, recvbuf=None))]
    fn iallgather(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Request> {
        let c = self.core()?;
        self.gather_call(&c, sendbuf, recvbuf, None)?.start(py, &c)
    }

    /// All-gather with a count per rank: rank p's `sendbuf` (`counts[p]` elements) lands at
    /// element `displs[p]` of every `recvbuf` (packed when `displs` is None).
    #[pyo3(signature = (sendbuf, recvbuf, counts, displs=None))]
    fn allgatherv(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
        counts: Vec<i64>,
        displs: Option<Vec<i64>>,
    ) -> PyResult<()> {
        let c = self.core()?;
        self.allgatherv_call(&c, sendbuf, recvbuf, counts, displs)?
            .run(py, &c)
    }

    /// Nonblocking `allgatherv`.
    #[pyo3(signature = (sendbuf, recvbuf, counts, displs=None))]
    fn iallgatherv(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
        counts: Vec<i64>,
        displs: Option<Vec<i64>>,
    ) -> PyResult<Request> {
        let c = self.core()?;
        self.allgatherv_call(&c, sendbuf, recvbuf, counts, displs)?
            .start(py, &c)
    }

    /// Rank r's `recvbuf` becomes block r of the elementwise `op` of every rank's `sendbuf`
    /// (size × `recvbuf`); with `recvbuf` None, the result replaces block r of `sendbuf`.
    #[pyo3(signature = (sendbuf, recvbuf=None, op=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let c = self.core()?;
        self.reduce_scatter_call(&c, sendbuf, recvbuf, op)?
            .run(py, &c)
    }

    /// Nonblocking `reduce_scatter`.
    #[pyo3(signature = (sendbuf, recvbuf=None, op=None))]
    fn ireduce_scatter(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Request> {
        let c = self.core()?;
        self.reduce_scatter_call(&c, sendbuf, recvbuf, op)?
            .start(py, &c)
    }

    /// Block p of every rank's `sendbuf` goes to rank p, which stores it at block (sender)
    /// of its `recvbuf` (in place when `recvbuf` is None).
    #[pyo3(signature = (sendbuf, recvbuf=None))]
    fn alltoall(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let c = self.core()?;
        self.alltoall_call(&c, sendbuf, recvbuf)?.run(py, &c)
    }

    /// Nonblocking `alltoall`.
    #[pyo3(signature = (sendbuf, recvbuf=None))]
    fn ialltoall(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Request> {
        let c = self.core()?;
        self.alltoall_call(&c, sendbuf, recvbuf)?.start(py, &c)
    }

    /// All-to-all with counts and displacements (in elements) per peer; displacements left
    /// out (None) mean packed blocks.
    #[pyo3(signature = (sendbuf, scounts, sdispls, recvbuf, rcounts, rdispls))]
    #[allow(clippy::too_many_arguments)]
    fn alltoallv(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        scounts: Vec<i64>,
        sdispls: Option<Vec<i64>>,
        recvbuf: &Bound<'_, PyAny>,
        rcounts: Vec<i64>,
        rdispls: Option<Vec<i64>>,
    ) -> PyResult<()> {
        let c = self.core()?;
        self.alltoallv_call(&c, sendbuf, scounts, sdispls, recvbuf, rcounts, rdispls)?
            .run(py, &c)
    }

    /// Nonblocking `alltoallv`.
    #[pyo3(signature = (sendbuf, scounts, sdispls, recvbuf, rcounts, rdispls))]
    #[allow(clippy::too_many_arguments)]
    fn ialltoallv(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        scounts: Vec<i64>,
        sdispls: Option<Vec<i64>>,
        recvbuf: &Bound<'_, PyAny>,
        rcounts: Vec<i64>,
        rdispls: Option<Vec<i64>>,
    ) -> PyResult<Request> {
        let c = self.core()?;
        self.alltoallv_call(&c, sendbuf, scounts, sdispls, recvbuf, rcounts, rdispls)?
            .start(py, &c)
    }

    /// The root's `recvbuf` (size × `sendbuf`) receives every rank's `sendbuf` in rank
    /// order (in place on the root's `sendbuf` when its `recvbuf` is None).
    #[pyo3(signature = (sendbuf, recvbuf=None, root=0))]
    fn gather(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: i64,
    ) -> PyResult<()> {
        let c = self.core()?;
        let root = self.root(root)?;
        self.gather_call(&c, sendbuf, recvbuf, Some(root))?
            .run(py, &c)
    }

    /// Nonblocking `gather`.
    #[pyo3(signature = (sendbuf, recvbuf=None, root=0))]
    fn igather(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: i64,
    ) -> PyResult<Request> {
        let c = self.core()?;
        let root = self.root(root)?;
        self.gather_call(&c, sendbuf, recvbuf, Some(root))?
            .start(py, &c)
    }

    /// Rank r's `recvbuf` receives block r of the root's `sendbuf` (size × `recvbuf`; other
    /// ranks pass None as `sendbuf`); with the root's `recvbuf` None it keeps its block in
    /// place.
    #[pyo3(signature = (sendbuf, recvbuf=None, root=0))]
    fn scatter(
        &self,
        py: Python<'_>,
        sendbuf: Option<&Bound<'_, PyAny>>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: i64,
    ) -> PyResult<()> {
        let c = self.core()?;
        self.scatter_call(&c, sendbuf, recvbuf, root)?.run(py, &c)
    }

    /// Nonblocking `scatter`.
    #[pyo3(signature = (sendbuf, recvbuf=None, root=0))]
    fn iscatter(
        &self,
        py: Python<'_>,
        sendbuf: Option<&Bound<'_, PyAny>>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: i64,
    ) -> PyResult<Request> {
        let c = self.core()?;
        self.scatter_call(&c, sendbuf, recvbuf, root)?.start(py, &c)
    }

    /// Returns once every rank has entered.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.core()?;
        call(py, &c, |c| c.barrier())
    }

    /// Nonblocking `barrier`.
    fn ibarrier(&self, py: Python<'_>) -> PyResult<Request> {
        let c = self.core()?;
        let req = py.detach(|| c.ibarrier()).map_err(to_py)?;
        Ok(Request::pending(req, &c, [None, None], false))
    }

    /// A batch of in-place all-reduces and broadcasts run together (all-reduces of one type
    /// and op fused into one call); every rank adds the same operations in the same order.
    fn batch(&self) -> PyResult<Batch> {
        Ok(Batch {
            comm: self.core()?,
            ops: Mutex::new(Some(Vec::new())),
        })
    }

    /// Splits the communicator: ranks passing the same `color` form a new one, ordered by
    /// `key` then rank; a negative `color` gives None.
    #[pyo3(signature = (color, key=0))]
    fn split(&self, py: Python<'_>, color: i32, key: i32) -> PyResult<Option<Communicator>> {
        let c = self.core()?;
        Ok(call(py, &c, |c| c.split(color, key))?.map(Communicator::wrap))
    }

    /// A new communicator of the same ranks, whose traffic never matches this one's.
    fn dup(&self, py: Python<'_>) -> PyResult<Communicator> {
        let c = self.core()?;
        Ok(Communicator::wrap(call(py, &c, |c| c.dup())?))
    }

    /// Aborts the communicator on every rank: pending and later calls on it raise
    /// `hcomm.Aborted`. Returns without waiting for the other ranks.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.core()?;
        py.detach(|| c.abort()).map_err(to_py)
    }

    /// Revokes the communicator on every member: pending and later calls on it raise
    /// `hcomm.Revoked`, except `agree`, `shrink`, `failed` and `ack_failed`.
    fn revoke(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.core()?;
        py.detach(|| c.revoke()).map_err(to_py)
    }

    /// Whether the communicator was revoked (here, or by a member whose notice came).
    #[getter]
    fn revoked(&self) -> PyResult<bool> {
        Ok(self.core()?.is_revoked())
    }

    /// Shrinks that led to this communicator (0 for one no shrink made).
    #[getter]
    fn epoch(&self) -> PyResult<u32> {
        Ok(self.core()?.epoch())
    }

    /// The ranks this rank knows to have failed, ascending.
    fn failed(&self) -> PyResult<Vec<usize>> {
        Ok(self.core()?.failed())
    }

    /// Acknowledges the failures `failed()` returns now; returns how many are acknowledged.
    fn ack_failed(&self) -> PyResult<usize> {
        Ok(self.core()?.ack_failed())
    }

    /// Fault-tolerant agreement: the AND of the surviving members' flags, the same at every
    /// survivor. Raises `hcomm.PeerLost` while the agreed failed set holds ranks not
    /// acknowledged (`ack_failed`); the exception's `flag` is the agreed flag all the same.
    fn agree(&self, py: Python<'_>, flag: bool) -> PyResult<bool> {
        let c = self.core()?;
        let mut f = flag;
        match call(py, &c, |c| c.agree(&mut f)) {
            Ok(()) => Ok(f),
            Err(e) => {
                e.value(py).setattr("flag", f)?;
                Err(e)
            }
        }
    }

    /// A communicator of the surviving members, in their old order, at the next epoch.
    /// Raises `hcomm.Quorum` on the smaller side of a partition, `hcomm.Revoked` on a rank
    /// the others found failed.
    fn shrink(&self, py: Python<'_>) -> PyResult<Communicator> {
        let c = self.core()?;
        Ok(Communicator::wrap(call(py, &c, |c| c.shrink())?))
    }

    /// `shrink` that also leaves out `ranks` (live members removed on purpose; they do not
    /// call it).
    fn shrink_excluding(&self, py: Python<'_>, ranks: Vec<i64>) -> PyResult<Communicator> {
        let c = self.core()?;
        let ranks = ranks
            .into_iter()
            .map(|r| index(r, "rank"))
            .collect::<PyResult<Vec<usize>>>()?;
        Ok(Communicator::wrap(call(py, &c, |c| {
            c.shrink_excluding(&ranks)
        })?))
    }

    /// A single-use join token (str): the members grow the communicator with it (`grow`)
    /// and each new process joins with it (`hcomm.join`). Local: only this rank makes it;
    /// hand it to the other members and the new processes. Whoever holds it can join without
    /// the job secret: keep it as secret as that.
    fn join_token(&self, py: Python<'_>) -> PyResult<String> {
        let c = self.core()?;
        py.detach(|| c.join_token()).map_err(to_py)
    }

    /// Grows the communicator by `nnew` new processes that call `hcomm.join(token)`: a
    /// communicator of the members (ranks in the old order) and the new processes (the next
    /// ranks), at the next epoch. Every member calls it with the same token and count. Raises
    /// `hcomm.InvalidArgument` for a token of another communicator, one not made in this job
    /// and one already used.
    fn grow(&self, py: Python<'_>, token: String, nnew: i64) -> PyResult<Communicator> {
        let c = self.core()?;
        let nnew = index(nnew, "nnew")?;
        Ok(Communicator::wrap(call(py, &c, |c| c.grow(&token, nnew))?))
    }

    /// Writes the flight recorder of every communicator of this process (its last
    /// `HCOMM_TRACE_BUFFER` collective calls) to this rank's dump in `HCOMM_TRACE_DIR` and
    /// returns the file's path; `hcomm_trace DIR` merges a job's dumps.
    fn dump_trace(&self, py: Python<'_>) -> PyResult<String> {
        let c = self.core()?;
        py.detach(|| c.dump_trace())
            .map(|p| p.display().to_string())
            .map_err(to_py)
    }

    /// Releases the communicator (the world's last one closes the connections once what is
    /// queued is delivered); later calls raise `hcomm.InvalidArgument`. Idempotent.
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        let taken = match self.inner.write() {
            Ok(mut g) => g.take(),
            Err(_) => None,
        };
        if let Some(c) = taken {
            py.detach(move || drop(c));
        }
        Ok(())
    }

    /// `nbytes` zeroed bytes, 64-byte aligned, from this rank's shared-memory pool (the heap
    /// when the pool cannot serve them): what `hcomm.empty` builds arrays on.
    fn _alloc(&self, nbytes: i64) -> PyResult<PoolMemory> {
        let n = index(nbytes, "nbytes")?;
        Ok(PoolMemory::new(self.core()?.alloc::<u8>(n).map_err(to_py)?))
    }

    /// What `python -m hcomm.info` prints: launcher, transports, topology and pool.
    fn _info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.core()?;
        let d = PyDict::new(py);
        let cfg = c.config();
        d.set_item("launcher", format!("{:?}", cfg.launch.launcher))?;
        d.set_item("timeout", cfg.timeout.as_secs_f64())?;
        let shm: Vec<usize> = (0..c.size())
            .filter(|&r| r != c.rank() && c.uses_shm(r))
            .collect();
        d.set_item("shm_peers", shm)?;
        d.set_item("hosts", c.topology().num_hosts())?;
        d.set_item("topology", c.topology().table())?;
        let p = c.pool_stats();
        let pool = PyDict::new(py);
        pool.set_item("hits", p.hits)?;
        pool.set_item("misses", p.misses)?;
        pool.set_item("bytes_in_use", p.bytes_in_use)?;
        pool.set_item("blocks", p.blocks)?;
        pool.set_item("high_water", p.high_water)?;
        d.set_item("pool", pool)?;
        Ok(d)
    }
}

/// What a request holds until it is collected.
enum ReqState {
    Pending {
        /// First, so that it drops (finishing the operation) before the buffers go.
        req: hcomm::Request,
        comm: Arc<Core>,
        /// The send and receive buffers lent to the operation.
        bufs: [Option<Buffer>; 2],
        /// Point-to-point (the result is a byte count) or collective (None).
        p2p: bool,
    },
    /// Another thread is waiting for it.
    Waiting,
    Done(Result<Option<usize>, hcomm::Error>),
}

/// A nonblocking operation in flight: `wait()` collects it, `test()` tells
/// whether it has completed. It keeps its buffers alive until then; dropping it unwaited
/// waits for the operation (at most the timeout).
#[pyclass(frozen, module = "hcomm._hcomm", name = "Request")]
pub struct Request {
    state: Mutex<ReqState>,
    /// A receive's sender, once known (at once for a named source).
    sender: OnceLock<usize>,
}

impl Request {
    fn pending(
        req: hcomm::Request,
        comm: &Arc<Core>,
        bufs: [Option<Buffer>; 2],
        p2p: bool,
    ) -> Request {
        Request {
            state: Mutex::new(ReqState::Pending {
                req,
                comm: Arc::clone(comm),
                bufs,
                p2p,
            }),
            sender: OnceLock::new(),
        }
    }

    fn take(&self) -> PyResult<ReqState> {
        let mut g = self
            .state
            .lock()
            .map_err(|_| invalid("the request is unusable".into()))?;
        Ok(std::mem::replace(&mut *g, ReqState::Waiting))
    }

    fn put(&self, s: ReqState) {
        if let Ok(mut g) = self.state.lock() {
            *g = s;
        }
    }

    /// Records and returns the result of a finished operation.
    fn finish(
        &self,
        py: Python<'_>,
        r: hcomm::Result<hcomm::Completion>,
        p2p: bool,
    ) -> PyResult<Option<usize>> {
        let r = r.map(|done| {
            if let Some(source) = done.source {
                let _ = self.sender.set(source);
            }
            p2p.then_some(done.len)
        });
        self.put(ReqState::Done(r.clone()));
        r.map_err(|e| interrupt::error(py, e))
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        let state = match self.state.get_mut() {
            Ok(s) => std::mem::replace(s, ReqState::Waiting),
            Err(_) => return,
        };
        if let ReqState::Pending { req, bufs, .. } = state {
            // The core's drop waits for the operation: without the GIL, then the buffers go.
            Python::attach(|py| py.detach(move || drop(req)));
            drop(bufs);
        }
    }
}

#[pymethods]
impl Request {
    /// Waits (at most the timeout) for the operation: the bytes sent or received for
    /// point-to-point operations, None for collectives. Waiting again returns the same.
    fn wait(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        match self.take()? {
            ReqState::Pending {
                req,
                comm,
                bufs,
                p2p,
            } => {
                let guard = match interrupt::enter(py, &comm) {
                    Ok(g) => g,
                    Err(e) => {
                        // Not waited for: the request stays pending (its communicator aborted).
                        self.put(ReqState::Pending {
                            req,
                            comm,
                            bufs,
                            p2p,
                        });
                        return Err(e);
                    }
                };
                let r = py.detach(move || {
                    let _guard = guard;
                    req.wait()
                });
                drop(bufs);
                self.finish(py, r, p2p)
            }
            ReqState::Waiting => Err(invalid("another thread is waiting for this request".into())),
            ReqState::Done(r) => {
                self.put(ReqState::Done(r.clone()));
                r.map_err(to_py)
            }
        }
    }

    /// The rank a receive got its message from (for one from `ANY_SOURCE`: once it has
    /// completed); None for sends, collectives, and a receive from any source still pending.
    #[getter]
    fn source(&self) -> Option<usize> {
        self.sender.get().copied()
    }

    /// Whether the operation has completed (then `wait()` returns at once); progresses it.
    fn test(&self, py: Python<'_>) -> PyResult<bool> {
        match self.take()? {
            ReqState::Pending {
                mut req,
                comm,
                bufs,
                p2p,
            } => match py.detach(|| req.test().map(|t| (t, req))) {
                Ok((true, req)) => {
                    let r = py.detach(|| req.wait());
                    drop(bufs);
                    // An error is raised by the wait that collects it.
                    let _ = self.finish(py, r, p2p);
                    Ok(true)
                }
                Ok((false, req)) => {
                    self.put(ReqState::Pending {
                        req,
                        comm,
                        bufs,
                        p2p,
                    });
                    Ok(false)
                }
                Err(e) => {
                    drop(bufs);
                    self.put(ReqState::Done(Err(e)));
                    Ok(true)
                }
            },
            ReqState::Waiting => Ok(false),
            s @ ReqState::Done(_) => {
                self.put(s);
                Ok(true)
            }
        }
    }
}

/// One operation of a batch.
enum BatchOp {
    AllReduce(DataType, ReduceOp),
    Broadcast(usize),
}

/// In-place all-reduces and broadcasts collected by `Communicator.batch()` and run together
/// by `run()` (or at the end of a `with` block).
#[pyclass(frozen, module = "hcomm._hcomm", name = "Batch")]
pub struct Batch {
    comm: Arc<Core>,
    ops: Mutex<Option<Vec<(Buffer, BatchOp)>>>,
}

impl Batch {
    fn push(&self, buf: Buffer, op: BatchOp) -> PyResult<()> {
        match self.ops.lock().as_deref_mut() {
            Ok(Some(ops)) => {
                if ops.iter().any(|(b, _)| b.overlaps(&buf)) {
                    return Err(invalid(
                        "batch: the buffer overlaps one already in the batch".into(),
                    ));
                }
                ops.push((buf, op));
                Ok(())
            }
            _ => Err(invalid("batch: the batch has already run".into())),
        }
    }
}

#[pymethods]
impl Batch {
    /// Adds an in-place all-reduce of `buf`.
    #[pyo3(signature = (buf, op=None))]
    fn allreduce(&self, buf: &Bound<'_, PyAny>, op: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let op = op_arg(op)?;
        let b = Buffer::get_mut(buf, "batch allreduce: buf")?;
        let dt = reducing(b.dtype, "batch allreduce")?;
        self.push(b, BatchOp::AllReduce(dt, op))
    }

    /// Adds a broadcast of the root's `buf`.
    #[pyo3(signature = (buf, root=0))]
    fn broadcast(&self, buf: &Bound<'_, PyAny>, root: i64) -> PyResult<()> {
        let root = index(root, "root")?;
        if root >= self.comm.size() {
            return Err(invalid(format!(
                "root {root} does not exist in a communicator of {} ranks",
                self.comm.size()
            )));
        }
        let b = Buffer::get_mut(buf, "batch broadcast: buf")?;
        self.push(b, BatchOp::Broadcast(root))
    }

    /// Runs the batch (once).
    fn run(&self, py: Python<'_>) -> PyResult<()> {
        let ops = match self.ops.lock() {
            Ok(mut g) => g.take(),
            Err(_) => None,
        }
        .ok_or_else(|| invalid("batch: the batch has already run".into()))?;
        let ops_ref = &ops;
        call(py, &self.comm, move |c| {
            let mut b = c.batch();
            for (buf, op) in ops_ref {
                // SAFETY: the buffers stay alive until the batch ran, are writable and do not
                // overlap (checked when added).
                let bytes = unsafe { buf.bytes_mut() };
                match *op {
                    BatchOp::AllReduce(dt, op) => {
                        b.allreduce_bytes(bytes, dt, op)?;
                    }
                    BatchOp::Broadcast(root) => {
                        b.broadcast_bytes(bytes, root);
                    }
                }
            }
            b.run()
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if exc_type.is_some_and(|t| !t.is_none()) {
            return Ok(());
        }
        self.run(py)
    }
}
