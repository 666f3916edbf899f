//! The one error type of the library.
//!
//! Every variant corresponds to one error code of the C API (the `HCOMM_*` codes of
//! `<hcomm/hcomm.h>`). The message of each variant says what happened, which peer or
//! operation it concerns, and what to do about it.

use std::fmt;

/// Result type of every fallible hcomm call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An hcomm error: a code (the variant) and a message for people.
///
/// Its `Display` is `hcomm <kind>: <message> (see docs/errors.md#<entry>)`: the entry of
/// [`ErrorCode::doc_entry`] in `docs/errors.md` lists the causes of the code and their fixes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// Initialization failed: bad launcher environment, store unreachable, handshake refused.
    Init(String),
    /// Memory could not be allocated.
    NoMem(String),
    /// A bounded wait ran out (`HCOMM_TIMEOUT`).
    Timeout(String),
    /// An argument was invalid (rank out of range, bad tag, bad configuration value).
    InvalidArgument(String),
    /// A peer rank died or closed its connection.
    PeerLost(String),
    /// Ranks called different operations, counts, types or roots.
    Mismatch(String),
    /// A message was longer than the receive buffer.
    Truncated(String),
    /// A transport (socket, shared memory) failed.
    Transport(String),
    /// The operation is not supported in this build or configuration.
    NotSupported(String),
    /// The communicator was aborted.
    Aborted(String),
    /// A bug in hcomm: please report it.
    Internal(String),
}

/// Where the documented error entries live, relative to the repository root.
pub const ERRORS_DOC: &str = "docs/errors.md";

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Error::Init(_) => "init error",
            Error::NoMem(_) => "out of memory",
            Error::Timeout(_) => "timeout",
            Error::InvalidArgument(_) => "invalid argument",
            Error::PeerLost(_) => "peer lost",
            Error::Mismatch(_) => "mismatch",
            Error::Truncated(_) => "truncated",
            Error::Transport(_) => "transport error",
            Error::NotSupported(_) => "not supported",
            Error::Aborted(_) => "aborted",
            Error::Internal(_) => "internal error (please report)",
        };
        write!(
            f,
            "hcomm {kind}: {} (see {ERRORS_DOC}#{})",
            self.detail(),
            self.code().doc_entry()
        )
    }
}

impl std::error::Error for Error {}

/// The numeric codes of the C API, in the order of the `HCOMM_*` codes of `<hcomm/hcomm.h>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Success (0).
    Success = 0,
    /// See [`Error::Init`].
    Init = 1,
    /// See [`Error::NoMem`].
    NoMem = 2,
    /// See [`Error::Timeout`].
    Timeout = 3,
    /// See [`Error::InvalidArgument`].
    InvalidArgument = 4,
    /// See [`Error::PeerLost`].
    PeerLost = 5,
    /// See [`Error::Mismatch`].
    Mismatch = 6,
    /// See [`Error::Truncated`].
    Truncated = 7,
    /// See [`Error::Transport`].
    Transport = 8,
    /// See [`Error::NotSupported`].
    NotSupported = 9,
    /// See [`Error::Aborted`].
    Aborted = 10,
    /// See [`Error::Internal`].
    Internal = 11,
}

impl ErrorCode {
    /// Every code, in numeric order.
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::Success,
        ErrorCode::Init,
        ErrorCode::NoMem,
        ErrorCode::Timeout,
        ErrorCode::InvalidArgument,
        ErrorCode::PeerLost,
        ErrorCode::Mismatch,
        ErrorCode::Truncated,
        ErrorCode::Transport,
        ErrorCode::NotSupported,
        ErrorCode::Aborted,
        ErrorCode::Internal,
    ];

    /// The name of this code's entry in `docs/errors.md`: the entry's heading and its anchor
    /// (`docs/errors.md#peer-lost`).
    pub fn doc_entry(self) -> &'static str {
        match self {
            ErrorCode::Success => "success",
            ErrorCode::Init => "init",
            ErrorCode::NoMem => "no-mem",
            ErrorCode::Timeout => "timeout",
            ErrorCode::InvalidArgument => "invalid-argument",
            ErrorCode::PeerLost => "peer-lost",
            ErrorCode::Mismatch => "mismatch",
            ErrorCode::Truncated => "truncated",
            ErrorCode::Transport => "transport",
            ErrorCode::NotSupported => "not-supported",
            ErrorCode::Aborted => "aborted",
            ErrorCode::Internal => "internal",
        }
    }

    /// A short description of the code and what to do about it.
    pub fn description(self) -> &'static str {
        match self {
            ErrorCode::Success => "success: the call did what was asked",
            ErrorCode::Init => {
                "initialization failed: check the launcher variables (HCOMM_RANK, HCOMM_SIZE, \
                 HCOMM_ROOT_ADDR, HCOMM_JOB_SECRET) and that every rank was started"
            }
            ErrorCode::NoMem => {
                "out of memory: use smaller buffers or fewer outstanding operations, or free \
                 memory on this host"
            }
            ErrorCode::Timeout => {
                "a wait exceeded HCOMM_TIMEOUT: a peer is slow, stuck or missing; raise \
                 HCOMM_TIMEOUT or find the peer named in the message"
            }
            ErrorCode::InvalidArgument => {
                "invalid argument: fix the argument or environment variable the message names"
            }
            ErrorCode::PeerLost => {
                "a peer rank died or closed its connection: look at that rank's output"
            }
            ErrorCode::Mismatch => {
                "ranks called different operations, counts, types or roots: make all ranks \
                 call the same sequence"
            }
            ErrorCode::Truncated => {
                "a message was longer than the receive buffer: post a larger buffer"
            }
            ErrorCode::Transport => "a transport failed: check the network and the log",
            ErrorCode::NotSupported => {
                "not supported in this build or configuration: change the setting the message \
                 names (HCOMM_TRANSPORT, HCOMM_ALGO) or use another operation"
            }
            ErrorCode::Aborted => {
                "the communicator was aborted: it cannot be used any more; restart the job"
            }
            ErrorCode::Internal => "internal error in hcomm: please report it with the log",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

impl Error {
    /// The code of this error, as the C API returns it.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Init(_) => ErrorCode::Init,
            Error::NoMem(_) => ErrorCode::NoMem,
            Error::Timeout(_) => ErrorCode::Timeout,
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Error::PeerLost(_) => ErrorCode::PeerLost,
            Error::Mismatch(_) => ErrorCode::Mismatch,
            Error::Truncated(_) => ErrorCode::Truncated,
            Error::Transport(_) => ErrorCode::Transport,
            Error::NotSupported(_) => ErrorCode::NotSupported,
            Error::Aborted(_) => ErrorCode::Aborted,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The message alone, without the code's words and the pointer to its entry: for
    /// wrapping this error into another one.
    pub fn detail(&self) -> &str {
        match self {
            Error::Init(m)
            | Error::NoMem(m)
            | Error::Timeout(m)
            | Error::InvalidArgument(m)
            | Error::PeerLost(m)
            | Error::Mismatch(m)
            | Error::Truncated(m)
            | Error::Transport(m)
            | Error::NotSupported(m)
            | Error::Aborted(m)
            | Error::Internal(m) => m,
        }
    }

    /// Wraps an I/O error of a transport, saying what was being done.
    pub(crate) fn transport(what: impl fmt::Display, err: std::io::Error) -> Error {
        Error::Transport(format!("{what}: {err}"))
    }
}
