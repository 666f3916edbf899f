"""hcomm: collective communication between processes, on numpy arrays and any buffer.

>>> import hcomm, numpy as np
>>> comm = hcomm.init()                  # the launcher's environment, or a world of one
>>> x = np.arange(4, dtype=np.float32)
>>> comm.allreduce(x)                    # in place: x becomes the sum over the ranks

Buffers are any object with the buffer protocol or ``__dlpack__`` (numpy arrays,
bytearray, memoryview, torch CPU tensors); the element type and count come from the buffer,
and the memory is used where it is. See ``docs/python.md``.
"""

from __future__ import annotations

import enum
import math
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _hcomm
from ._hcomm import Batch, Communicator, PoolMemory, Request
from .errors import (
    Aborted,
    Error,
    InitError,
    Internal,
    InvalidArgument,
    Mismatch,
    NoMem,
    NotSupported,
    PeerLost,
    Quorum,
    Revoked,
    Timeout,
    Transport,
    Truncated,
)

__version__: str = _hcomm.__version__
#: The ``source`` of ``Communicator.recv``/``irecv`` that receives from any rank.
ANY_SOURCE: int = _hcomm.ANY_SOURCE

__all__ = [
    "ANY_SOURCE",
    "AVG",
    "BAND",
    "BOR",
    "BXOR",
    "MAX",
    "MIN",
    "PROD",
    "SUM",
    "Aborted",
    "Batch",
    "Communicator",
    "Error",
    "InitError",
    "Internal",
    "InvalidArgument",
    "Mismatch",
    "NoMem",
    "NotSupported",
    "Op",
    "PeerLost",
    "PoolMemory",
    "Quorum",
    "Request",
    "Revoked",
    "Timeout",
    "Transport",
    "Truncated",
    "__version__",
    "empty",
    "init",
    "join",
    "wait_all",
    "zeros",
]


class Op(enum.IntEnum):
    """Reduction operations (the values of the C API's ``hcommRedOp_t``).

    Integers wrap around; ``AVG`` is the sum divided by the number of ranks (truncated for
    integers); ``BAND``, ``BOR``, ``BXOR`` apply to integers and bool. Every call taking an
    ``op`` also accepts its name: ``"sum"``, ``"prod"``, ...
    """

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


SUM = Op.SUM
PROD = Op.PROD
MAX = Op.MAX
MIN = Op.MIN
AVG = Op.AVG
BAND = Op.BAND
BOR = Op.BOR
BXOR = Op.BXOR

_last: weakref.ref[Communicator] | None = None


def init(
    *,
    rank: int | None = None,
    size: int | None = None,
    root_addr: str | None = None,
    secret: str | bytes | None = None,
    timeout: float | None = None,
) -> Communicator:
    """Joins the job this process was launched into, or the job the arguments describe.

    With no arguments the rank, size and rendezvous address come from the launcher's
    environment: ``hcommrun``, Open MPI's ``mpirun``, MPICH's ``mpiexec``, Slurm's ``srun``
    or ``torchrun``; without a launcher the world has one rank. ``rank`` and ``size`` (given
    together) describe the job explicitly; ``root_addr`` is the ``host:port`` of the
    rendezvous store, which rank 0 hosts; ``secret`` authenticates the ranks (default
    ``HCOMM_JOB_SECRET``); ``timeout`` (seconds) bounds every wait (default
    ``HCOMM_TIMEOUT``, 300).

    The communicator is also the default one of :func:`empty` and :func:`zeros`.
    """
    global _last
    comm = _hcomm.init(rank=rank, size=size, root_addr=root_addr, secret=secret, timeout=timeout)
    _last = weakref.ref(comm)
    return comm


def join(token: str, *, timeout: float | None = None) -> Communicator:
    """Joins, in a new process, the communicator its members grow with ``token``
    (``Communicator.grow``; a member made the token with ``Communicator.join_token``): this
    process gets the next free rank of the grown communicator. Needs no launcher and no job
    secret: the token authenticates the process. ``timeout`` (seconds) bounds every wait
    (default ``HCOMM_TIMEOUT``). Raises ``InvalidArgument`` for a token already used.

    The communicator is also the default one of :func:`empty` and :func:`zeros`.
    """
    global _last
    comm = _hcomm.join(token, timeout=timeout)
    _last = weakref.ref(comm)
    return comm


def _default(comm: Communicator | None) -> Communicator:
    if comm is not None:
        return comm
    found = _last() if _last is not None else None
    if found is None:
        raise InvalidArgument(
            "hcomm.empty/zeros need a communicator: call hcomm.init() first or pass comm= "
            "(see docs/errors.md#invalid-argument)",
            4,
        )
    return found


def empty(
    shape: int | Sequence[int],
    dtype: npt.DTypeLike = np.float64,
    *,
    comm: Communicator | None = None,
) -> npt.NDArray[Any]:
    """A C-contiguous numpy array in the shared-memory pool of ``comm``'s rank (default: the
    communicator of the last :func:`init`), 64-byte aligned; collectives between ranks of
    one host read such arrays in place; arrays larger than an ordinary block
    (``HCOMM_POOL_BLOCK``) get a block of their own size. Falls back to the heap when the
    pool cannot serve the size (over ``HCOMM_POOL_MAX``, ``/dev/shm`` full). The memory is
    freed when the array and every view of it are. Its contents are zero (like :func:`zeros`).
    """
    c = _default(comm)
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(d < 0 for d in dims):
        raise InvalidArgument(
            f"hcomm.empty: negative dimension in {dims} (see docs/errors.md#invalid-argument)", 4
        )
    nbytes = math.prod(dims) * dt.itemsize
    mem = c._alloc(nbytes)
    flat: npt.NDArray[np.uint8] = np.frombuffer(memoryview(mem), dtype=np.uint8, count=nbytes)
    out: npt.NDArray[Any] = flat.view(dt).reshape(dims)
    return out


def zeros(
    shape: int | Sequence[int],
    dtype: npt.DTypeLike = np.float64,
    *,
    comm: Communicator | None = None,
) -> npt.NDArray[Any]:
    """:func:`empty`, filled with zeros."""
    return empty(shape, dtype, comm=comm)


def wait_all(requests: Iterable[Request]) -> list[int | None]:
    """Waits for every request, in order; returns their values. The first error is raised
    once all were waited for."""
    results: list[int | None] = []
    first: Error | None = None
    for r in requests:
        try:
            results.append(r.wait())
        except Error as e:
            results.append(None)
            if first is None:
                first = e
    if first is not None:
        raise first
    return results
