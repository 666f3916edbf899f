"""hcomm's exceptions: :class:`Error` and one subclass per error code of the core.

Every exception carries ``code`` (the C API's ``HCOMM_ERR_*`` value), ``peer`` (the world
rank of the peer the error concerns, when it concerns one: a lost peer, the peer a call timed
out on, the rank that aborted or called something else), ``comm_peer`` (that peer's rank in
the communicator of the failed call, when known), ``not_entered`` (for a collective that timed
out or was abandoned: the ranks of its communicator that never entered it, as they told; see
docs/flight-recorder.md) and a message ending in its entry of ``docs/errors.md``. The peer
comes from the error's fields, not from its message.
"""

from __future__ import annotations

__all__ = [
    "Aborted",
    "Error",
    "InitError",
    "Internal",
    "InvalidArgument",
    "Mismatch",
    "NoMem",
    "NotSupported",
    "PeerLost",
    "Quorum",
    "Revoked",
    "Timeout",
    "Transport",
    "Truncated",
]


class Error(Exception):
    """An hcomm call failed.

    Attributes:
        code: the error code (``HCOMM_ERR_*`` of the C API).
        peer: the world rank of the peer the failure concerns, when known, else None.
        comm_peer: that peer's rank in the communicator of the failed call, when known.
        not_entered: for a collective that timed out or was abandoned, the ranks of its
            communicator that never entered it (alive, but elsewhere), when diagnosed.
        message: the message, with its entry of ``docs/errors.md``.
    """

    code: int = -1

    def __init__(
        self,
        message: str,
        code: int | None = None,
        peer: int | None = None,
        comm_peer: int | None = None,
        not_entered: list[int] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.peer: int | None = peer
        self.comm_peer: int | None = comm_peer
        self.not_entered: list[int] | None = not_entered


class InitError(Error):
    """Initialization failed: launcher environment, store, handshake (code 1)."""

    code = 1


class NoMem(Error, MemoryError):
    """Memory could not be allocated (code 2)."""

    code = 2


class Timeout(Error, TimeoutError):
    """A wait ran out of ``HCOMM_TIMEOUT`` (code 3); ``peer`` is the world rank waited for."""

    code = 3


class InvalidArgument(Error, ValueError):
    """An argument was invalid: a rank, tag, buffer type, shape or setting (code 4)."""

    code = 4


class PeerLost(Error):
    """A peer rank died or closed its connection (code 5); ``peer`` is its world rank.

    Raised by ``Communicator.agree`` while the agreed failed set holds unacknowledged ranks:
    ``flag`` is then the agreed flag (None for every other call).
    """

    code = 5
    flag: bool | None = None


class Mismatch(Error):
    """Ranks called different operations, counts, types or roots (code 6)."""

    code = 6


class Truncated(Error):
    """A message was longer than the receive buffer (code 7)."""

    code = 7


class Transport(Error):
    """A transport (socket, shared memory) failed (code 8)."""

    code = 8


class NotSupported(Error, NotImplementedError):
    """Not supported in this build or configuration (code 9)."""

    code = 9


class Aborted(Error):
    """The communicator was aborted, here or by another rank (code 10)."""

    code = 10


class Internal(Error):
    """A bug in hcomm: please report it (code 11)."""

    code = 11


class Revoked(Error):
    """The communicator was revoked (code 12): agree on the failed ranks and shrink it."""

    code = 12


class Quorum(Error):
    """This side of a partition holds no strict majority of the communicator (code 13)."""

    code = 13


_BY_CODE: dict[int, type[Error]] = {
    c.code: c
    for c in (
        InitError,
        NoMem,
        Timeout,
        InvalidArgument,
        PeerLost,
        Mismatch,
        Truncated,
        Transport,
        NotSupported,
        Aborted,
        Internal,
        Revoked,
        Quorum,
    )
}


def _from_code(
    code: int,
    message: str,
    peer: int | None = None,
    comm_peer: int | None = None,
    not_entered: list[int] | None = None,
) -> Error:
    """The exception of a core error and the peer it concerns (called by the native module)."""
    return _BY_CODE.get(code, Error)(message, code, peer, comm_peer, not_entered)
