"""Type stubs of the native module ``hcomm._hcomm`` (re-exported by ``hcomm``)."""

from types import TracebackType
from typing import Any, Protocol, final

from typing_extensions import Buffer as _PyBuffer
from typing_extensions import Self

__version__: str
ERRORS_DOC: str
ANY_SOURCE: int

class _DLPack(Protocol):
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...

#: Anything hcomm reads or writes: buffer protocol (numpy, bytearray, memoryview) or
#: ``__dlpack__`` (torch CPU tensors).
BufferLike = _PyBuffer | _DLPack
#: ``hcomm.SUM``, ... or a name such as ``"sum"``.
OpLike = int | str

def init(
    *,
    rank: int | None = None,
    size: int | None = None,
    root_addr: str | None = None,
    secret: str | bytes | None = None,
    timeout: float | None = None,
) -> Communicator: ...

@final
class Request:
    """A nonblocking operation in flight."""

    def wait(self) -> int | None:
        """Waits for completion: bytes sent/received (point-to-point) or None."""
    def test(self) -> bool:
        """Whether the operation has completed."""
    @property
    def source(self) -> int | None:
        """A receive's sender (for ``ANY_SOURCE``: once complete); None otherwise."""

@final
class Batch:
    """In-place all-reduces and broadcasts run together."""

    def allreduce(self, buf: BufferLike, op: OpLike | None = None) -> None: ...
    def broadcast(self, buf: BufferLike, root: int = 0) -> None: ...
    def run(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        _exc: BaseException | None = None,
        _tb: TracebackType | None = None,
    ) -> None: ...

@final
class PoolMemory:
    """Bytes of the shared-memory pool, exported through the buffer protocol."""

    @property
    def in_pool(self) -> bool: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

@final
class Communicator:
    """A group of ranks."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def local_size(self) -> int: ...
    @property
    def timeout(self) -> float: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> None: ...
    def send(self, buf: BufferLike, dest: int, tag: int = 0) -> None: ...
    def recv(self, buf: BufferLike, source: int, tag: int = 0) -> int: ...
    def recv_any(self, buf: BufferLike, tag: int = 0) -> tuple[int, int]: ...
    def sendrecv(
        self,
        sendbuf: BufferLike,
        dest: int,
        recvbuf: BufferLike,
        source: int,
        sendtag: int = 0,
        recvtag: int = 0,
    ) -> int: ...
    def isend(self, buf: BufferLike, dest: int, tag: int = 0) -> Request: ...
    def irecv(self, buf: BufferLike, source: int, tag: int = 0) -> Request: ...
    def allreduce(
        self, sendbuf: BufferLike, recvbuf: BufferLike | None = None, op: OpLike | None = None
    ) -> None: ...
    def iallreduce(
        self, sendbuf: BufferLike, recvbuf: BufferLike | None = None, op: OpLike | None = None
    ) -> Request: ...
    def broadcast(self, buf: BufferLike, root: int = 0) -> None: ...
    def ibroadcast(self, buf: BufferLike, root: int = 0) -> Request: ...
    def reduce(
        self,
        sendbuf: BufferLike,
        recvbuf: BufferLike | None = None,
        op: OpLike | None = None,
        root: int = 0,
    ) -> None: ...
    def ireduce(
        self,
        sendbuf: BufferLike,
        recvbuf: BufferLike | None = None,
        op: OpLike | None = None,
        root: int = 0,
    ) -> Request: ...
    def allgather(self, sendbuf: BufferLike, recvbuf: BufferLike | None = None) -> None: ...
    def iallgather(self, sendbuf: BufferLike, recvbuf: BufferLike | None = None) -> Request: ...
    def allgatherv(
        self,
        sendbuf: BufferLike,
        recvbuf: BufferLike,
        counts: list[int],
        displs: list[int] | None = None,
    ) -> None: ...
    def iallgatherv(
        self,
        sendbuf: BufferLike,
        recvbuf: BufferLike,
        counts: list[int],
        displs: list[int] | None = None,
    ) -> Request: ...
    def reduce_scatter(
        self, sendbuf: BufferLike, recvbuf: BufferLike | None = None, op: OpLike | None = None
    ) -> None: ...
    def ireduce_scatter(
        self, sendbuf: BufferLike, recvbuf: BufferLike | None = None, op: OpLike | None = None
    ) -> Request: ...
    def alltoall(self, sendbuf: BufferLike, recvbuf: BufferLike | None = None) -> None: ...
    def ialltoall(self, sendbuf: BufferLike, recvbuf: BufferLike | None = None) -> Request: ...
    def alltoallv(
        self,
        sendbuf: BufferLike,
        scounts: list[int],
        sdispls: list[int] | None,
        recvbuf: BufferLike,
        rcounts: list[int],
        rdispls: list[int] | None,
    ) -> None: ...
    def ialltoallv(
        self,
        sendbuf: BufferLike,
        scounts: list[int],
        sdispls: list[int] | None,
        recvbuf: BufferLike,
        rcounts: list[int],
        rdispls: list[int] | None,
    ) -> Request: ...
    def gather(
        self, sendbuf: BufferLike, recvbuf: BufferLike | None = None, root: int = 0
    ) -> None: ...
    def igather(
        self, sendbuf: BufferLike, recvbuf: BufferLike | None = None, root: int = 0
    ) -> Request: ...
    def scatter(
        self, sendbuf: BufferLike | None, recvbuf: BufferLike | None = None, root: int = 0
    ) -> None: ...
    def iscatter(
        self, sendbuf: BufferLike | None, recvbuf: BufferLike | None = None, root: int = 0
    ) -> Request: ...
    def barrier(self) -> None: ...
    def ibarrier(self) -> Request: ...
    def batch(self) -> Batch: ...
    def split(self, color: int, key: int = 0) -> Communicator | None: ...
    def dup(self) -> Communicator: ...
    def abort(self) -> None: ...
    def dump_trace(self) -> str: ...
    def destroy(self) -> None: ...
    def _alloc(self, nbytes: int) -> PoolMemory: ...
    def _info(self) -> dict[str, Any]: ...
