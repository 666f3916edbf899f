//! The one error type of the library.
//!
//! Every variant corresponds to one error code of the C API (SPEC F7). The message of each
//! variant says what happened, which peer or operation it concerns, and what to do about it.

use std::fmt;

/// Result type of every fallible hcomm call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An hcomm error: a code (the variant) and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Initialization failed: bad launcher environment, store unreachable, handshake refused.
    #[error("hcomm init error: {0}")]
    Init(String),
    /// Memory could not be allocated.
    #[error("hcomm out of memory: {0}")]
    NoMem(String),
    /// A bounded wait ran out (`HCOMM_TIMEOUT`).
    #[error("hcomm timeout: {0}")]
    Timeout(String),
    /// An argument was invalid (rank out of range, bad tag, bad configuration value).
    #[error("hcomm invalid argument: {0}")]
    InvalidArgument(String),
    /// A peer rank died or closed its connection.
    #[error("hcomm peer lost: {0}")]
    PeerLost(String),
    /// Ranks called different operations, counts, types or roots.
    #[error("hcomm mismatch: {0}")]
    Mismatch(String),
    /// A message was longer than the receive buffer.
    #[error("hcomm truncated: {0}")]
    Truncated(String),
    /// A transport (socket, shared memory) failed.
    #[error("hcomm transport error: {0}")]
    Transport(String),
    /// The operation is not supported in this build or configuration.
    #[error("hcomm not supported: {0}")]
    NotSupported(String),
    /// The communicator was aborted.
    #[error("hcomm aborted: {0}")]
    Aborted(String),
    /// A bug in hcomm: please report it.
    #[error("hcomm internal error (please report): {0}")]
    Internal(String),
}

/// The numeric codes of the C API, in the order of SPEC F7.
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

    /// Wraps an I/O error of a transport, saying what was being done.
    pub(crate) fn transport(what: impl fmt::Display, err: std::io::Error) -> Error {
        Error::Transport(format!("{what}: {err}"))
    }
}
