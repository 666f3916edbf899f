"""The backend class, its Work, and how a group's hcomm communicator is made."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import queue
import secrets
import socket
import threading
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch.futures import Future

import hcomm
from hcomm import _hcomm

NAME = "hcomm"

# Collectives of at most this many bytes run on the calling thread when nothing of the group
# is queued (no thread hand-off); larger ones run on the group's worker thread, so that the
# caller (DDP's backward pass) goes on while they travel.
_INLINE_BYTES = int(os.environ.get("HCOMM_TORCH_INLINE_BYTES", str(64 * 1024)))

_OPS: dict[Any, str] = {
    c10d.ReduceOp.RedOpType.SUM: "sum",
    c10d.ReduceOp.RedOpType.PRODUCT: "prod",
    c10d.ReduceOp.RedOpType.MIN: "min",
    c10d.ReduceOp.RedOpType.MAX: "max",
    c10d.ReduceOp.RedOpType.AVG: "avg",
    c10d.ReduceOp.RedOpType.BAND: "band",
    c10d.ReduceOp.RedOpType.BOR: "bor",
    c10d.ReduceOp.RedOpType.BXOR: "bxor",
}
# The same by the enum's value: pybind11 enums hash slowly, and this is looked up per call.
_OPS_BY_VALUE: dict[int, str] = {k.value: v for k, v in _OPS.items()}
_PREMUL_SUM = c10d.ReduceOp.RedOpType.PREMUL_SUM.value

# Tags of the point-to-point messages of monitored_barrier (torch's own tags are small).
_MB_TAG = 0x7FFF_FF00

_registered = False


def register() -> None:
    """Registers the backend with torch.distributed (idempotent): the entry point's callable."""
    global _registered
    if _registered:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
    _install_source_rank()
    _install_shrunk_group_type()
    _registered = True


# The sender of the receive from any source that this thread waited for last (see
# `_install_source_rank`).
_last_any = threading.local()


def _install_source_rank() -> None:
    """Lets ``dist.recv(t)`` without ``src`` learn the sender.

    torch (2.15 included) hands a Python backend's Work back to Python as a plain ``Work``
    whose ``wait()`` and ``get_future()`` reach the Python class (its C++ trampoline forwards
    them) but whose ``_source_rank()`` does not: it raises. ``dist.recv`` calls ``wait()``
    and then ``_source_rank()`` on the same thread, so ``_Work.wait`` of a receive from any
    source records its sender for the thread, and ``Work._source_rank`` is wrapped to give
    that sender (once) where torch's own answer fails. Works of other backends answer as
    before."""
    original = c10d.Work._source_rank
    if getattr(original, "_hcomm", False):
        return

    def _source_rank(self: c10d.Work) -> int:
        try:
            return original(self)
        except RuntimeError:
            src: int | None = getattr(_last_any, "source", None)
            if src is None:
                raise
            _last_any.source = None
            return src

    _source_rank._hcomm = True  # type: ignore[attr-defined]
    c10d.Work._source_rank = _source_rank  # type: ignore[method-assign]


def _install_shrunk_group_type() -> None:
    """Registers the group ``dist.shrink_group`` makes of an hcomm group as a custom backend's.

    torch (2.15 included) registers the backend of every shrunk CPU group as Gloo's; DDP's
    logger then takes it for a ``ProcessGroupGloo`` (it asks Gloo's thread count through a
    cast of the backend) and crashes (SIGSEGV) when DDP is built on the shrunk group. The
    group is made by ``_create_shrunk_process_group``, wrapped here to register an hcomm
    backend again under ``BackendType.CUSTOM``, as ``init_process_group`` does; other
    backends' groups are left as torch makes them."""
    original = getattr(dist.distributed_c10d, "_create_shrunk_process_group", None)
    if original is None or getattr(original, "_hcomm", False):
        return

    def create(new_backend: Any, *args: Any, **kwargs: Any) -> Any:
        pg = original(new_backend, *args, **kwargs)
        if isinstance(new_backend, HcommBackend):
            custom = c10d.ProcessGroup.BackendType.CUSTOM
            pg._register_backend(torch.device("cpu"), custom, new_backend)
            pg._set_default_backend(custom)
        return pg

    create._hcomm = True  # type: ignore[attr-defined]
    dist.distributed_c10d._create_shrunk_process_group = create


# ---------------------------------------------------------------------------------------
# Tensors as hcomm buffers


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The tensor as elements hcomm knows: complex as pairs of reals."""
    if t.is_complex():
        t = torch.view_as_real(t)
    return t


class _Staged:
    """A tensor's memory for hcomm: the tensor itself when contiguous, else a contiguous copy
    that ``finish`` copies back (the documented cost of non-contiguous tensors)."""

    __slots__ = ("buf", "copied", "orig")

    def __init__(self, t: torch.Tensor, copy_in: bool = True) -> None:
        self.orig = _flat(t)
        self.copied = not self.orig.is_contiguous()
        if not self.copied:
            self.buf = self.orig
        elif copy_in:
            self.buf = self.orig.contiguous()
        else:
            self.buf = torch.empty(self.orig.shape, dtype=self.orig.dtype)

    def finish(self) -> None:
        if self.copied:
            self.orig.copy_(self.buf)


def _buf(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as a 1-D buffer of its elements for reductions (0-dim tensors
    too); bool as uint8 (0 and 1)."""
    f = _flat(t).reshape(-1)
    return f.view(torch.uint8) if f.dtype == torch.bool else f


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as its bytes: collectives that only move data need no type."""
    return _flat(t).reshape(-1).view(torch.uint8)


# On bool tensors (0 and 1 as uint8) the logical ops are min and max.
_BOOL_OPS = {"sum": "max", "prod": "min", "band": "min", "bor": "max", "min": "min", "max": "max"}


def _reduce_op(op: Any, dtype: torch.dtype) -> tuple[str, float | None]:
    name, factor = _op_name(op)
    if dtype == torch.bool:
        if name not in _BOOL_OPS:
            raise hcomm.NotSupported(f"hcomm: {name} is not defined on bool tensors")
        return _BOOL_OPS[name], factor
    return name, factor


def _op_name(op: Any) -> tuple[str, float | None]:
    """The hcomm op for a torch ReduceOp and, for PREMUL_SUM, the factor to apply first."""
    kind = op.op if type(op) is c10d.ReduceOp or hasattr(op, "op") else op
    value = kind.value
    if value == _PREMUL_SUM:
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            factor = float(factor.item())
        return "sum", float(factor)
    name = _OPS_BY_VALUE.get(value)
    if name is None:
        raise hcomm.NotSupported(f"hcomm: reduce op {kind} is not supported")
    return name, None


def _unpack(flat: torch.Tensor, outputs: Sequence[torch.Tensor], counts: list[int]) -> None:
    """Copies consecutive byte blocks of `flat` into the output tensors."""
    for o, part in zip(outputs, torch.split(flat, counts), strict=True):
        f = _flat(o)
        f.copy_(part.view(f.dtype).view(f.shape))


def _allgather_into(
    comm: hcomm.Communicator, src: torch.Tensor, out: torch.Tensor, rank: int
) -> None:
    """All-gathers `src` into `out`; in place when `src` is already this rank's block of
    `out` (as FSDP2 passes it), through a copy when it overlaps `out` elsewhere."""
    sb, ob = _bytes(src), _bytes(out)
    start, end = sb.data_ptr(), sb.data_ptr() + sb.numel()
    o_start, o_end = ob.data_ptr(), ob.data_ptr() + ob.numel()
    if start >= o_end or end <= o_start or sb.numel() == 0:
        comm.allgather(sb, ob)
    elif start == o_start + rank * sb.numel():
        comm.allgather(ob, None)
    else:
        comm.allgather(sb.clone(), ob)


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# ---------------------------------------------------------------------------------------
# Work


class _Work(c10d.Work):
    """An operation in flight. Its future's value is the list of output tensors; ``wait()``
    and the future both raise the operation's error.

    Cheap when the operation completed before the caller got it (small collectives): the
    future and the event that blocking waits sleep on are made only when asked for, and the
    description (for errors) only when an error needs it."""

    def __init__(
        self,
        outputs: list[torch.Tensor],
        describe: str | Callable[[], str],
        keep: object = None,
        finish: Callable[[], None] | None = None,
        helper: _Helper | None = None,
        source: Callable[[], int | None] | None = None,
    ) -> None:
        super().__init__()
        if source is not None:
            self._source = source
        self._outputs = outputs
        self._what = describe
        # Inputs and staging copies stay alive until the operation completes.
        self._keep = keep
        if finish is not None:
            self._finish = finish
            self._helper = helper
        self._lock = threading.Lock()

    # Defaults at class level: setting attributes on every (per-call) instance costs.
    # A receive from any source: its sender (group rank), for ``_source_rank``.
    _source: Callable[[], int | None] | None = None
    _fut: Future[list[torch.Tensor]] | None = None
    # The future ``get_future`` handed out: `_fut`, or a child of it (see there).
    _handed: Future[list[torch.Tensor]] | None = None
    # Made for a waiter that must block.
    _event: threading.Event | None = None
    _completed = False
    _error: BaseException | None = None
    # Point to point: completes the operation (waits for the request); runs on the waiter
    # of futures (`_helper`) or in ``wait()``.
    _finish: Callable[[], None] | None = None
    _helper: _Helper | None = None
    # A queued collective: what runs it on the waiting thread if its turn has come and the
    # worker has not started it (see HcommBackend._claim), its body, and its place in the
    # group's call order.
    _claim: Callable[[_Work], None] | None = None
    _body: Callable[[], None] | None = None
    _index = 0

    @property
    def _describe(self) -> str:
        what = self._what
        return what if isinstance(what, str) else what()

    def _complete(self, error: BaseException | None) -> None:
        with self._lock:
            self._keep = None
            self._error = error
            self._completed = True
            event, fut = self._event, self._fut
        if event is not None:
            event.set()
        if fut is not None:
            _settle(fut, self._outputs, error)

    def _run_finish(self) -> None:
        finish = self._take_finish()
        if finish is None:
            return
        try:
            finish()
        except BaseException as e:  # every failure reaches the waiters
            self._complete(_annotate(e, self._describe))
        else:
            self._complete(None)

    def _take_finish(self) -> Callable[[], None] | None:
        with self._lock:
            f, self._finish = self._finish, None
        return f

    def wait(self, timeout: timedelta | None = None) -> bool:
        if not self._completed:
            self._run_finish()
            if self._claim is not None:
                self._claim(self)
        if not self._completed:
            with self._lock:
                if self._event is None and not self._completed:
                    self._event = threading.Event()
                event = self._event
            secs = None if timeout is None or timeout == timedelta(0) else timeout.total_seconds()
            if event is not None and not event.wait(secs):
                raise hcomm.Timeout(f"{self._describe}: not complete after {secs} s (Work.wait)")
        if self._error is not None:
            raise self._error
        if self._source is not None:
            _last_any.source = self._source()
        return True

    def get_future(self) -> Future[list[torch.Tensor]]:
        if self._helper is not None and self._finish is not None:
            self._helper.submit(self._run_finish)
        with self._lock:
            if self._handed is not None:
                return self._handed
            fut = self._fut = Future()
            done, error = self._completed, self._error
            # ``set_exception`` completes a future with the exception as its value, which
            # only Python's ``wait()`` raises: C++ readers (DDP's reducer) would take the
            # exception for the output tensors. Unless the outcome is known to be a success,
            # the future handed out is a child whose callback raises the error, which makes
            # it the child's own error (a RuntimeError naming it, as Gloo's futures raise).
            handed = self._handed = fut if done and error is None else fut.then(_outcome)
        if done:
            _settle(fut, self._outputs, error)
        return handed

    def is_completed(self) -> bool:
        return self._completed

    def is_success(self) -> bool:
        return self._completed and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def _source_rank(self) -> int:
        """The group rank a completed receive got its message from (``dist.recv`` without
        ``src`` returns it, as a global rank)."""
        src = None if self._source is None else self._source()
        if src is None:
            raise ValueError(f"{self._describe}: no source rank (not a completed receive)")
        return src


def _settle(
    fut: Future[list[torch.Tensor]], outputs: list[torch.Tensor], error: BaseException | None
) -> None:
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(outputs)


def _outcome(fut: Future[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The output tensors of a settled future, or its error raised."""
    return fut.value()


def _annotate(e: BaseException, describe: str) -> BaseException:
    """The error with the operation it ended named in front (the same exception class)."""
    if isinstance(e, hcomm.Error):
        try:
            new = type(e)(f"{describe}: {e}")
            for attr in ("code", "peer", "comm_peer"):
                if hasattr(e, attr):
                    setattr(new, attr, getattr(e, attr))
            new.__cause__ = e
            return new
        except Exception:
            return e
    return e


class _Helper:
    """A daemon thread that runs callables in order (the group's worker, or the waiter of
    point-to-point futures); stopped by ``close``."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            f = self._q.get()
            if f is None:
                return
            f()

    def submit(self, f: Callable[[], None]) -> None:
        self._q.put(f)

    def close(self, timeout: float) -> None:
        self._q.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


# ---------------------------------------------------------------------------------------
# Bootstrap through torch's Store


class _World:
    """An hcomm world this process joined for a torch group, with the store it hosts."""

    def __init__(self, comm: hcomm.Communicator, store: Any, global_ranks: list[int]) -> None:
        self.comm = comm
        self.store = store
        self.global_ranks = global_ranks


# The world made for torch's default group: subgroups are communicators of it made without
# messages (torch forms a group with its members only).
_default_world: _World | None = None
# The backends alive: C++ (torch's debug wrapper, for one) may hold a backend that Python
# no longer refers to, and the Python methods are found only while the Python object lives.
_live: set[HcommBackend] = set()
_failed: dict[int, set[int]] = {}


def _unwrap_store(store: Any) -> Any:
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def _advertised_ip(store: Any) -> str:
    """The IP address of this host that the other ranks can reach: HCOMM_IFADDR, else the one
    this host reaches torch's TCPStore from, else the loopback address."""
    ifaddr = os.environ.get("HCOMM_IFADDR")
    if ifaddr:
        return ifaddr
    base = _unwrap_store(store)
    host = getattr(base, "host", None)
    if not host:
        return "127.0.0.1"
    try:
        info = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except OSError:
        return "127.0.0.1"
    if ipaddress.ip_address(info).is_loopback:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((info, 9))  # nothing is sent: this only picks the route
        return str(s.getsockname()[0])


def _join(store: Any, rank: int, size: int, timeout: timedelta) -> _World:
    """Joins a new hcomm world of `size` ranks: rank 0 hosts hcomm's store on a free port and
    publishes its address (and, when HCOMM_JOB_SECRET is unset, a fresh secret) in `store`."""
    secs = max(timeout.total_seconds(), 1.0)
    if size == 1:
        return _World(hcomm.init(rank=0, size=1, timeout=secs), None, [])
    secret = os.environ.get("HCOMM_JOB_SECRET")
    fresh = not secret
    host_store = None
    # The same store serves every world joined through it (torch gives a group created again
    # after destroy_process_group the same prefix): each join has its own keys, numbered by the
    # count of joins so far. Every rank of one join counts before any joins the next one, since
    # hcomm.init returns only when every rank has reached hcomm's store.
    generation = (int(store.add("hcomm/joins", 1)) - 1) // size
    addr_key, secret_key = f"hcomm/{generation}/addr", f"hcomm/{generation}/secret"
    if rank == 0:
        if not secret:
            secret = secrets.token_hex(32)
            store.set(secret_key, secret)
        host_store = _hcomm.RendezvousStore(secret.encode())
        ip = _advertised_ip(store)
        addr = f"[{ip}]:{host_store.port}" if ":" in ip else f"{ip}:{host_store.port}"
        store.set(addr_key, addr)
    else:
        store.wait([addr_key] + ([secret_key] if fresh else []), timeout)
        addr = store.get(addr_key).decode()
        if fresh:
            secret = store.get(secret_key).decode()
    assert secret is not None
    try:
        comm = hcomm.init(rank=rank, size=size, root_addr=addr, secret=secret, timeout=secs)
    except BaseException:
        if host_store is not None:
            host_store.close()
        raise
    if rank == 0 and fresh:
        # Every rank has read the secret by now (each proved it to hcomm's store).
        try:
            store.delete_key(secret_key)
        except Exception:
            pass  # stores without deletion keep it
    return _World(comm, host_store, [])


def _group_tag(group_id: str, ranks: Sequence[int]) -> int:
    h = hashlib.sha256(f"{group_id}/{list(ranks)}".encode()).digest()
    return int.from_bytes(h[:8], "little")


def _create(opts: Any, backend_options: Any) -> HcommBackend:
    global _default_world
    ranks = list(opts.global_ranks_in_group)
    rank, size = opts.group_rank, opts.group_size
    world = _default_world
    if not ranks and world is not None and size == world.comm.size:
        # A group over the whole world in world order (torch passes no rank list then).
        ranks = list(range(size))
    if ranks and world is not None and world.comm.size >= max(ranks) + 1:
        comm = _hcomm._subset(world.comm, ranks, _group_tag(str(opts.group_id), ranks))
        owned = _World(comm, None, ranks)
    else:
        owned = _join(opts.store, rank, size, opts.timeout)
        owned.global_ranks = ranks
        if not ranks:
            _default_world = owned
    backend = HcommBackend(rank, size, owned, opts.timeout, str(opts.group_id))
    _live.add(backend)
    return backend


def failed_ranks(group: Any = None) -> list[int]:
    """The ranks of `group` (torch group ranks) that this rank knows to have failed: found
    lost, or decided by an agreement (``dist.shrink_group`` agrees on them)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    comm = getattr(backend, "comm", None)
    return comm.failed() if comm is not None else []


# ---------------------------------------------------------------------------------------
# The backend


class HcommBackend(c10d.Backend):
    """torch.distributed's CPU backend on an hcomm communicator."""

    def __init__(
        self, rank: int, size: int, world: _World, timeout: timedelta, group_id: str
    ) -> None:
        super().__init__(rank, size)
        self._world = world
        self.comm: hcomm.Communicator = world.comm
        self._timeout = timeout
        self._group = group_id
        self._seq = 0
        self._pending = 0
        # Collectives issued and started, in call order (each is numbered by the former).
        self._issued = 0
        self._started = 0
        self._lock = threading.Lock()
        self._exec = threading.Lock()
        self._worker = _Helper(f"hcomm-torch-{group_id}")
        self._waiter = _Helper(f"hcomm-torch-p2p-{group_id}")
        self._stray: list[Any] = []
        self.failed: set[int] = set()
        self._closed = False
        weakref.finalize(self, HcommBackend._release, world, self._worker, self._waiter)

    # -- lifetime

    @staticmethod
    def _release(world: _World, worker: _Helper, waiter: _Helper) -> None:
        worker.close(5.0)
        waiter.close(5.0)
        world.comm.destroy()
        if world.store is not None:
            world.store.close()

    def getBackendName(self) -> str:
        return NAME

    # torch reads these through the trampoline, which looks them up on the Python object:
    # without them the lookup would come back to the trampoline for ever.
    @property
    def supports_coalescing(self) -> bool:
        return False

    @property
    def supports_splitting(self) -> bool:
        return False

    @property
    def supports_shrinking(self) -> bool:
        return True

    @property
    def supports_reconfigure(self) -> bool:
        return False

    @property
    def supports_window(self) -> bool:
        return False

    @property
    def _supports_time_estimate(self) -> bool:
        return False

    def shrink(
        self, ranks_to_exclude: list[int], shrink_flags: int = 0, opts: Any = None
    ) -> HcommBackend:
        """``dist.shrink_group``: a backend of this group's ranks but `ranks_to_exclude`
        (group ranks: the failed ones, which do not call it). With ``SHRINK_ABORT`` (1) the
        group is revoked first, so that every member leaves its pending operations; then
        the survivors agree on the failed set and shrink (docs/fault-tolerance.md). Raises
        ``hcomm.PeerLost`` when the agreement finds a failed rank beyond `ranks_to_exclude`."""
        global _default_world
        comm = self.comm
        if shrink_flags & 1:
            comm.revoke()
        excluded = sorted(set(ranks_to_exclude))
        new = comm.shrink_excluding(excluded)
        keep = [r for r in range(comm.size) if r not in excluded]
        if new.size != len(keep):
            more = sorted(set(comm.failed()) - set(excluded))
            new.destroy()
            raise hcomm.PeerLost(
                f"hcomm: shrink_group: ranks {more} failed too; shrink again excluding them"
            )
        globals_ = self._world.global_ranks or list(range(comm.size))
        world = _World(new, None, [globals_[r] for r in keep])
        backend = HcommBackend(new.rank, new.size, world, self._timeout, f"{self._group}.s")
        if self._world is _default_world:
            _default_world = world
        _live.add(backend)
        return backend

    def _get_sequence_number_for_group(self) -> int:
        return self._seq

    def _set_sequence_number_for_group(self) -> None:
        """Sequence numbers start at 0 on every rank: nothing to agree on."""

    def shutdown(self) -> None:
        global _default_world
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        self._stray.clear()
        if _default_world is self._world:
            _default_world = None
        HcommBackend._release(self._world, self._worker, self._waiter)

    def abort(self) -> None:
        self.comm.abort()
        self.shutdown()

    # -- running operations

    def _describe(self, op: str, seq: int | None = None) -> str:
        return (
            f"hcomm {op} #{self._seq if seq is None else seq} on group {self._group} "
            f"(rank {self.rank()} of {self.size()})"
        )

    def _run(
        self,
        op: str,
        body: Callable[[], None],
        outputs: list[torch.Tensor],
        nbytes: int,
        keep: object = None,
    ) -> _Work:
        """Runs a collective in call order: on this thread when small and nothing is queued,
        else queued for the group's worker thread, which runs the queue in order so that
        the caller (DDP's backward pass) goes on while they travel. A queued collective
        whose turn has come when its Work is waited for, before the worker started it, runs
        on the waiting thread instead (a blocking call then costs no thread hand-off)."""
        self._seq += 1
        seq = self._seq
        work = _Work(outputs, lambda: self._describe(op, seq), keep)
        with self._lock:
            inline = self._pending == 0 and nbytes <= _INLINE_BYTES
            self._pending += 1
            work._index = self._issued
            self._issued += 1
            if inline:
                self._exec.acquire()
        if inline:
            self._execute(work, body, fresh=True)
        else:
            work._body = body
            work._claim = self._claim
            self._worker.submit(lambda: self._execute_queued(work))
        return work

    def _take_body(self, work: _Work) -> Callable[[], None] | None:
        """The body of a queued collective, for whoever runs it (once)."""
        with work._lock:
            body, work._body = work._body, None
        return body

    def _execute_queued(self, work: _Work) -> None:
        """The worker's turn at a queued collective: runs it unless a waiter already did."""
        self._exec.acquire()
        body = self._take_body(work)
        if body is None:
            self._exec.release()
            return
        self._execute(work, body)

    def _claim(self, work: _Work) -> None:
        """Runs a queued collective on the waiting thread if every earlier one of the group
        has run and nothing runs now; otherwise the worker will."""
        if not self._exec.acquire(blocking=False):
            return
        body = self._take_body(work) if self._started == work._index else None
        if body is None:
            self._exec.release()
            return
        self._execute(work, body)

    def _execute(self, work: _Work, body: Callable[[], None], fresh: bool = False) -> None:
        """Runs `body` holding ``_exec`` (released here), then completes `work` (`fresh`: a
        Work no other thread has seen yet, completed without its lock)."""
        self._started += 1
        error: BaseException | None = None
        try:
            body()
        except BaseException as e:
            error = _annotate(e, work._describe)
            self._note_failure(e)
        finally:
            self._exec.release()
            with self._lock:
                self._pending -= 1
        if fresh and error is None:
            work._keep = None
            work._completed = True
        else:
            work._complete(error)

    def _note_failure(self, e: BaseException) -> None:
        peer = getattr(e, "peer", None)
        if isinstance(peer, int) and peer >= 0:
            self.failed.add(peer)

    # -- collectives

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> _Work:
        name, factor = _reduce_op(opts.reduceOp, tensors[0].dtype)
        comm = self.comm
        if len(tensors) == 1 and factor is None:
            t = tensors[0]
            if t.is_contiguous() and not t.is_complex():
                # The common case, without staging: hcomm reads the tensor as it is.
                buf = t.view(torch.uint8) if t.dtype == torch.bool else t
                return self._run(
                    "all_reduce", lambda: comm.allreduce(buf, None, name), tensors, t.nbytes, buf
                )
        staged = [_Staged(t) for t in tensors]

        def body() -> None:
            for s in staged:
                if factor is not None:
                    s.buf.mul_(factor)
                comm.allreduce(_buf(s.buf), None, name)
                s.finish()

        return self._run("all_reduce", body, tensors, _nbytes(tensors), staged)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> _Work:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> _Work:
        root = opts.rootRank
        staged = [_Staged(t) for t in tensors]
        comm = self.comm

        def body() -> None:
            for s in staged:
                comm.broadcast(_bytes(s.buf), root)
                s.finish()

        return self._run("broadcast", body, tensors, _nbytes(tensors), staged)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> _Work:
        name, factor = _reduce_op(opts.reduceOp, tensors[0].dtype)
        root = opts.rootRank
        me = self.rank()
        staged = [_Staged(t) for t in tensors]
        comm = self.comm

        def body() -> None:
            for s in staged:
                src = _buf(s.buf)
                if factor is not None:
                    src = src * factor
                if me == root:
                    out = torch.empty_like(src) if factor is None else src
                    comm.reduce(src, out, name, root)
                    _buf(s.buf).copy_(out)
                    s.finish()
                else:
                    comm.reduce(src, None, name, root)

        return self._run("reduce", body, tensors, _nbytes(tensors), staged)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _Work:
        out = _Staged(output, copy_in=False)
        src = _flat(input).contiguous()
        comm = self.comm

        rank = self.rank()

        def body() -> None:
            _allgather_into(comm, src, out.buf, rank)
            out.finish()

        return self._run("all_gather_into_tensor", body, [output], _nbytes([output]), (out, src))

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _Work:
        return self.all_gather_single(output, input, opts)

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> _Work:
        pairs = [
            (_Staged(o, copy_in=False), _flat(i).contiguous())
            for o, i in zip(outputs, inputs, strict=True)
        ]
        comm = self.comm

        rank = self.rank()

        def body() -> None:
            for out, src in pairs:
                _allgather_into(comm, src, out.buf, rank)
                out.finish()

        return self._run("all_gather_into_tensor_coalesced", body, outputs, _nbytes(outputs), pairs)

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> _Work:
        comm = self.comm
        jobs = []
        for outs, inp in zip(outputs, inputs, strict=True):
            src = _bytes(_flat(inp).contiguous())
            counts = [_bytes(o).numel() for o in outs]
            flat = torch.empty(sum(counts), dtype=torch.uint8)
            jobs.append((outs, src, counts, flat))

        def body() -> None:
            for outs, src, counts, flat in jobs:
                if all(n == counts[0] for n in counts):
                    comm.allgather(src, flat)
                else:
                    comm.allgatherv(src, flat, counts)
                _unpack(flat, outs, counts)

        flat_outs = [o for outs in outputs for o in outs]
        return self._run("all_gather", body, flat_outs, _nbytes(flat_outs), jobs)

    def allgather_coalesced(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> _Work:
        return self.allgather(outputs, inputs, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _Work:
        name, factor = _reduce_op(opts.reduceOp, input.dtype)
        out = _Staged(output, copy_in=False)
        src = _flat(input).contiguous()
        comm = self.comm

        def body() -> None:
            s = _buf(src) * factor if factor is not None else _buf(src)
            comm.reduce_scatter(s, _buf(out.buf), name)
            out.finish()

        return self._run("reduce_scatter_tensor", body, [output], _nbytes([input]), (out, src))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _Work:
        return self.reduce_scatter_single(output, input, opts)

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> _Work:
        name, factor = _reduce_op(opts.reduceOp, inputs[0].dtype)
        pairs = [
            (_Staged(o, copy_in=False), _flat(i).contiguous())
            for o, i in zip(outputs, inputs, strict=True)
        ]
        comm = self.comm

        def body() -> None:
            for out, src in pairs:
                s = _buf(src) * factor if factor is not None else _buf(src)
                comm.reduce_scatter(s, _buf(out.buf), name)
                out.finish()

        return self._run("reduce_scatter_tensor_coalesced", body, outputs, _nbytes(inputs), pairs)

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> _Work:
        name, factor = _reduce_op(opts.reduceOp, outputs[0].dtype)
        comm = self.comm
        me = self.rank()
        jobs = []
        for out, ins in zip(outputs, inputs, strict=True):
            flat = torch.cat([_buf(_flat(i).contiguous()) for i in ins])
            if factor is not None:
                flat.mul_(factor)
            counts = [_flat(i).numel() for i in ins]
            jobs.append((out, flat, counts))

        def body() -> None:
            for out, flat, counts in jobs:
                if all(n == counts[0] for n in counts):
                    part = torch.empty(counts[0], dtype=flat.dtype)
                    comm.reduce_scatter(flat, part, name)
                else:
                    # Unequal blocks: all-reduce the whole and keep this rank's block.
                    comm.allreduce(flat, None, name)
                    part = torch.split(flat, counts)[me]
                _flat(out).copy_(part.view(_flat(out).shape))

        return self._run(
            "reduce_scatter",
            body,
            outputs,
            sum(j[1].numel() * j[1].element_size() for j in jobs),
            jobs,
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: Any,
    ) -> _Work:
        n = self.size()
        out = _Staged(output, copy_in=False)
        src = _flat(input).contiguous()
        comm = self.comm
        even = not output_splits and not input_splits

        def row_bytes(t: torch.Tensor) -> int:
            f = _flat(t)
            return f[0].numel() * f.element_size() if f.dim() > 0 and f.shape[0] else 0

        if not even:
            osp = list(output_splits) if output_splits else [output.shape[0] // n] * n
            isp = list(input_splits) if input_splits else [input.shape[0] // n] * n
            rcounts = [k * row_bytes(output) for k in osp]
            scounts = [k * row_bytes(input) for k in isp]

        def body() -> None:
            if even:
                comm.alltoall(_bytes(src), _bytes(out.buf))
            else:
                comm.alltoallv(_bytes(src), scounts, None, _bytes(out.buf), rcounts, None)
            out.finish()

        return self._run("all_to_all_single", body, [output], _nbytes([input, output]), (out, src))

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: Any,
    ) -> _Work:
        return self.all_to_all_single(output, input, output_splits, input_splits, opts)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> _Work:
        comm = self.comm
        src = torch.cat([_bytes(_flat(i).contiguous()) for i in inputs])
        scounts = [_bytes(_flat(i).contiguous()).numel() for i in inputs]
        rcounts = [_flat(o).numel() * _flat(o).element_size() for o in outputs]
        flat = torch.empty(sum(rcounts), dtype=torch.uint8)

        def body() -> None:
            comm.alltoallv(src, scounts, None, flat, rcounts, None)
            _unpack(flat, outputs, rcounts)

        return self._run("all_to_all", body, outputs, _nbytes(inputs), (src, flat))

    def gather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> _Work:
        root = opts.rootRank
        comm = self.comm
        src = _bytes(_flat(inputs[0]).contiguous())
        is_root = self.rank() == root
        n = self.size()
        flat = torch.empty(src.numel() * n, dtype=torch.uint8) if is_root else None

        def body() -> None:
            comm.gather(src, flat, root)
            if flat is not None:
                _unpack(flat, outputs[0], [src.numel()] * n)

        outs = outputs[0] if outputs else []
        return self._run("gather", body, outs, _nbytes(inputs) * n, (src, flat))

    def scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> _Work:
        root = opts.rootRank
        comm = self.comm
        out = _Staged(outputs[0], copy_in=False)
        is_root = self.rank() == root
        src = torch.cat([_bytes(_flat(i).contiguous()) for i in inputs[0]]) if is_root else None

        def body() -> None:
            comm.scatter(src, _bytes(out.buf), root)
            out.finish()

        return self._run("scatter", body, outputs, _nbytes(outputs) * self.size(), (out, src))

    def barrier(self, opts: Any) -> _Work:
        comm = self.comm
        return self._run("barrier", comm.barrier, [], 0)

    def monitored_barrier(self, opts: Any, wait_all_ranks: bool = False) -> None:
        """Rank 0 hears from every rank, then releases them; a rank missing at the timeout is
        named (all of them with `wait_all_ranks`)."""
        timeout = opts.timeout if opts.timeout != timedelta(0) else self._timeout
        import time

        deadline = time.monotonic() + timeout.total_seconds()
        token = torch.zeros(1, dtype=torch.uint8)
        comm = self.comm
        n, me = self.size(), self.rank()
        self._seq += 1
        if me != 0:
            comm.send(token, 0, _MB_TAG)
            reply = torch.zeros(1, dtype=torch.uint8)
            req = comm.irecv(reply, 0, _MB_TAG + 1)
            while not req.test():
                if time.monotonic() > deadline:
                    self._stray.append((req, reply))
                    raise hcomm.Timeout(
                        f"{self._describe('monitored_barrier')}: rank 0 did not release this "
                        f"rank within {timeout}"
                    )
                time.sleep(0.0005)
            req.wait()
            return
        bufs = {r: torch.zeros(1, dtype=torch.uint8) for r in range(1, n)}
        reqs = {r: comm.irecv(bufs[r], r, _MB_TAG) for r in range(1, n)}
        missing: list[int] = []
        for r in range(1, n):
            while not reqs[r].test():
                if time.monotonic() > deadline:
                    missing.append(r)
                    if not wait_all_ranks:
                        break
                    break
                time.sleep(0.0005)
            if missing and not wait_all_ranks:
                break
        if missing:
            self._stray.extend(reqs.items())
            self._stray.extend(bufs.items())
            late = [r for r in range(1, n) if r not in reqs or not reqs[r].test()]
            names = late if wait_all_ranks else missing[:1]
            raise hcomm.Timeout(
                f"{self._describe('monitored_barrier')}: rank(s) {names} did not reach the "
                f"barrier within {timeout}"
            )
        for r in range(1, n):
            reqs[r].wait()
            comm.send(token, r, _MB_TAG + 1)

    # -- point to point

    def _p2p(self, op: str, t: torch.Tensor, peer: int, tag: int, sending: bool) -> _Work:
        staged = _Staged(t, copy_in=sending)
        buf = _buf(staged.buf)
        self._seq += 1
        if sending:
            req = self.comm.isend(buf, peer, tag)
        else:
            req = self.comm.irecv(buf, peer, tag)

        def finish() -> None:
            try:
                req.wait()
            except BaseException as e:
                self._note_failure(e)
                raise
            if not sending:
                staged.finish()

        who = "any source" if peer == hcomm.ANY_SOURCE else f"peer {peer}"
        return _Work(
            [t],
            self._describe(f"{op} ({who}, tag {tag})"),
            (staged, req),
            finish,
            self._waiter,
            (lambda: req.source) if peer == hcomm.ANY_SOURCE else None,
        )

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> _Work:
        return self._p2p("send", tensors[0], dst, tag, True)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> _Work:
        return self._p2p("recv", tensors[0], src, tag, False)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> _Work:
        return self._p2p("recv", tensors[0], hcomm.ANY_SOURCE, tag, False)
