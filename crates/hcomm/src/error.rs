//! The one error type of the library.
//!
//! Every variant corresponds to one error code of the C API (the `HCOMM_*` codes of
//! `<hcomm/hcomm.h>`) and holds an [`ErrorInfo`]: the message for people, and the facts a
//! program can act on without reading it — the [`PeerRank`] it concerns, the [`Operation`], the
//! hcomm error that caused it and the I/O error underneath (its
//! [`source`](std::error::Error::source)).

use std::fmt;
use std::io;
use std::sync::Arc;

/// Result type of every fallible hcomm call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An hcomm error: a code (the variant) and what is known about it ([`ErrorInfo`]).
///
/// Its `Display` is `hcomm <kind>: <message> (see docs/errors.md#<entry>)`: the entry of
/// [`ErrorCode::doc_entry`] in `docs/errors.md` lists the causes of the code and their fixes.
/// Match the variant for the code, and the fields (or [`Error::peer`], [`Error::operation`],
/// [`Error::cause`], [`Error::io_error`]) for the facts; the message is for people.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// Initialization failed: bad launcher environment, store unreachable, handshake refused.
    Init(Box<ErrorInfo>),
    /// Memory could not be allocated.
    NoMem(Box<ErrorInfo>),
    /// A bounded wait ran out (`HCOMM_TIMEOUT`).
    Timeout(Box<ErrorInfo>),
    /// An argument was invalid (rank out of range, bad tag, bad configuration value).
    InvalidArgument(Box<ErrorInfo>),
    /// A peer rank died or closed its connection.
    PeerLost(Box<ErrorInfo>),
    /// Ranks called different operations, counts, types or roots.
    Mismatch(Box<ErrorInfo>),
    /// A message was longer than the receive buffer.
    Truncated(Box<ErrorInfo>),
    /// A transport (socket, shared memory) failed.
    Transport(Box<ErrorInfo>),
    /// The operation is not supported in this build or configuration.
    NotSupported(Box<ErrorInfo>),
    /// The communicator was aborted.
    Aborted(Box<ErrorInfo>),
    /// A bug in hcomm: please report it.
    Internal(Box<ErrorInfo>),
    /// The communicator was revoked (`Communicator::revoke`, by this rank or another member):
    /// only the fault-tolerance calls (agree, shrink) still work on it.
    Revoked(Box<ErrorInfo>),
    /// Too few members are reachable to go on: only a side holding a strict majority of the
    /// communicator may shrink it.
    Quorum(Box<ErrorInfo>),
}

/// What an [`Error`] says beyond its code.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ErrorInfo {
    /// The message for people, without the code's words and the pointer to its entry.
    pub message: String,
    /// The rank the error concerns, when it concerns one.
    pub peer: Option<PeerRank>,
    /// The operation that failed, when known.
    pub operation: Option<Operation>,
    /// The hcomm error that led to this one (a lost peer behind an abort), when there is one.
    pub cause: Option<Arc<Error>>,
    /// The I/O error underneath, when there is one: [`std::error::Error::source`] returns it.
    pub io: Option<IoSource>,
    /// For a collective that timed out or was abandoned: the members that never entered it,
    /// as the members themselves told (see [`NotEntered`]).
    pub not_entered: Option<Arc<NotEntered>>,
}

/// The members of a communicator that never entered a collective call: the diagnosis of a
/// call that timed out or was abandoned, made by asking every member how many collectives of
/// the communicator it had entered (a member alive but busy elsewhere answers too; see
/// docs/flight-recorder.md).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotEntered {
    /// The communicator's id (as in the flight recorder's dumps).
    pub comm: u64,
    /// The call: its collective and sequence number.
    pub operation: Operation,
    /// The members that never entered it (ranks in the communicator and world ranks).
    pub ranks: Vec<PeerRank>,
    /// For each member, by rank in the communicator, how many collectives of the communicator
    /// it had entered (so its last one is this minus one); `None` where no answer came (a lost
    /// member, or one too slow to answer).
    pub entered: Vec<Option<u64>>,
}

/// The rank an error concerns: its world rank (`HCOMM_RANK`, its rank in the job), its rank
/// in the communicator of the failed call, or both where both are known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PeerRank {
    /// The world rank.
    pub world: Option<usize>,
    /// The rank in the communicator of the failed call.
    pub comm: Option<usize>,
}

impl PeerRank {
    /// The peer of world rank `rank`.
    pub fn world(rank: usize) -> PeerRank {
        PeerRank {
            world: Some(rank),
            comm: None,
        }
    }

    /// The peer of rank `rank` in the communicator of the call (world rank unknown).
    pub fn comm(rank: usize) -> PeerRank {
        PeerRank {
            world: None,
            comm: Some(rank),
        }
    }

    /// The peer of rank `comm` in the communicator of the call, world rank `world`.
    pub fn ranks(comm: usize, world: usize) -> PeerRank {
        PeerRank {
            world: Some(world),
            comm: Some(comm),
        }
    }
}

/// The operation an error concerns: its name (`send`, `recv`, `allreduce`, ...) and its
/// sequence number on the communicator where known (a collective's; a point-to-point call's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Operation {
    /// The operation's name: `send`, `recv`, or a collective's name (`allreduce`, ...).
    pub name: &'static str,
    /// The sequence number on its communicator: a collective's is the tag of its messages
    /// (the same on every rank); a point-to-point call's counts this rank's calls of its
    /// direction on the communicator from 1, sends (send, isend, the send of a sendrecv) and
    /// receives (recv, recv_any, irecv, the receive of a sendrecv) apart, in the order they
    /// were started (a call refused for its arguments takes no number; calls started at the
    /// same time by several threads on one communicator may share one). `None` for the
    /// messages the library exchanges itself.
    pub seq: Option<u64>,
}

impl Operation {
    /// The operation `name`, sequence number unknown.
    pub fn new(name: &'static str) -> Operation {
        Operation { name, seq: None }
    }

    /// The operation `name` with sequence number `seq` on its communicator.
    pub fn seq(name: &'static str, seq: u64) -> Operation {
        Operation {
            name,
            seq: Some(seq),
        }
    }
}

/// The I/O error under an [`Error`], shared so that the error stays `Clone`. Two are equal
/// when their kinds and messages are.
#[derive(Debug, Clone)]
pub struct IoSource(pub Arc<io::Error>);

impl PartialEq for IoSource {
    fn eq(&self, other: &IoSource) -> bool {
        self.0.kind() == other.0.kind() && self.0.to_string() == other.0.to_string()
    }
}

impl Eq for IoSource {}

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
            Error::Revoked(_) => "revoked",
            Error::Quorum(_) => "no quorum",
        };
        write!(
            f,
            "hcomm {kind}: {} (see {ERRORS_DOC}#{})",
            self.detail(),
            self.code().doc_entry()
        )
    }
}

impl std::error::Error for Error {
    /// The I/O error underneath, else the hcomm error that caused this one.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let info = self.info();
        match (&info.io, &info.cause) {
            (Some(io), _) => Some(&*io.0),
            (None, Some(cause)) => Some(&**cause),
            (None, None) => None,
        }
    }
}

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
    /// See [`Error::Revoked`].
    Revoked = 12,
    /// See [`Error::Quorum`].
    Quorum = 13,
}

impl ErrorCode {
    /// Every code, in numeric order.
    pub const ALL: [ErrorCode; 14] = [
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
        ErrorCode::Revoked,
        ErrorCode::Quorum,
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
            ErrorCode::Revoked => "revoked",
            ErrorCode::Quorum => "quorum",
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
            ErrorCode::Revoked => {
                "the communicator was revoked: agree on the failed ranks and shrink it \
                 (Communicator::shrink, hcommCommShrink) to go on"
            }
            ErrorCode::Quorum => {
                "this side of a partition holds no strict majority of the communicator: it \
                 may not shrink it; the majority goes on without it"
            }
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

impl Error {
    /// An [`Error::Init`] saying `message`.
    pub fn init(message: impl Into<String>) -> Error {
        Error::Init(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::NoMem`] saying `message`.
    pub fn no_mem(message: impl Into<String>) -> Error {
        Error::NoMem(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::Timeout`] saying `message`.
    pub fn timeout(message: impl Into<String>) -> Error {
        Error::Timeout(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::InvalidArgument`] saying `message`.
    pub fn invalid_argument(message: impl Into<String>) -> Error {
        Error::InvalidArgument(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::PeerLost`] about `peer`, saying `message`.
    pub fn peer_lost(peer: PeerRank, message: impl Into<String>) -> Error {
        Error::PeerLost(Box::new(ErrorInfo::new(message))).with_peer(peer)
    }

    /// An [`Error::Mismatch`] saying `message`.
    pub fn mismatch(message: impl Into<String>) -> Error {
        Error::Mismatch(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::Truncated`] saying `message`.
    pub fn truncated(message: impl Into<String>) -> Error {
        Error::Truncated(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::Transport`] saying `message` (see [`Error::transport`] for one over an I/O
    /// error).
    pub fn transport_failed(message: impl Into<String>) -> Error {
        Error::Transport(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::NotSupported`] saying `message`.
    pub fn not_supported(message: impl Into<String>) -> Error {
        Error::NotSupported(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::Aborted`] saying `message`.
    pub fn aborted(message: impl Into<String>) -> Error {
        Error::Aborted(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::Internal`] saying `message`.
    pub fn internal(message: impl Into<String>) -> Error {
        Error::Internal(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::Revoked`] saying `message`.
    pub fn revoked(message: impl Into<String>) -> Error {
        Error::Revoked(Box::new(ErrorInfo::new(message)))
    }

    /// An [`Error::Quorum`] saying `message`.
    pub fn quorum(message: impl Into<String>) -> Error {
        Error::Quorum(Box::new(ErrorInfo::new(message)))
    }

    /// This error, about `peer`.
    #[must_use]
    pub fn with_peer(mut self, peer: PeerRank) -> Error {
        self.info_mut().peer = Some(peer);
        self
    }

    /// This error, about operation `op`.
    #[must_use]
    pub fn with_operation(mut self, op: Operation) -> Error {
        self.info_mut().operation = Some(op);
        self
    }

    /// This error, caused by the hcomm error `cause`.
    #[must_use]
    pub fn with_cause(mut self, cause: Error) -> Error {
        self.info_mut().cause = Some(Arc::new(cause));
        self
    }

    /// This error, over the I/O error `source` (which [`std::error::Error::source`] returns).
    #[must_use]
    pub fn with_source(mut self, source: io::Error) -> Error {
        self.info_mut().io = Some(IoSource(Arc::new(source)));
        self
    }

    /// This error with the diagnosis `ne` of its call, which its message then states.
    #[must_use]
    pub fn with_not_entered(mut self, ne: NotEntered) -> Error {
        let info = self.info_mut();
        let who: Vec<String> = ne
            .ranks
            .iter()
            .map(|p| {
                let last = p
                    .comm
                    .and_then(|r| ne.entered.get(r).copied().flatten())
                    .and_then(|n| n.checked_sub(1))
                    .map_or("none".to_string(), |l| format!("#{l}"));
                match (p.comm, p.world) {
                    (Some(c), Some(w)) => {
                        format!("rank {c} (world rank {w}; its last entered: {last})")
                    }
                    (Some(c), None) => format!("rank {c} (its last entered: {last})"),
                    (None, Some(w)) => format!("world rank {w}"),
                    (None, None) => "a rank".to_string(),
                }
            })
            .collect();
        let seq = ne.operation.seq.map_or(String::new(), |s| format!(" #{s}"));
        info.message = format!(
            "{}; never entered {}{seq} of communicator {:#x}: {} (alive, but not in the call)",
            info.message,
            ne.operation.name,
            ne.comm,
            who.join(", ")
        );
        info.not_entered = Some(Arc::new(ne));
        self
    }

    /// This error with `what` before its message (`"{what}: {message}"`), the facts kept.
    #[must_use]
    pub fn prefixed(mut self, what: impl fmt::Display) -> Error {
        let info = self.info_mut();
        info.message = format!("{what}: {}", info.message);
        self
    }

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
            Error::Revoked(_) => ErrorCode::Revoked,
            Error::Quorum(_) => ErrorCode::Quorum,
        }
    }

    /// What this error says beyond its code.
    pub fn info(&self) -> &ErrorInfo {
        match self {
            Error::Init(i)
            | Error::NoMem(i)
            | Error::Timeout(i)
            | Error::InvalidArgument(i)
            | Error::PeerLost(i)
            | Error::Mismatch(i)
            | Error::Truncated(i)
            | Error::Transport(i)
            | Error::NotSupported(i)
            | Error::Aborted(i)
            | Error::Internal(i)
            | Error::Revoked(i)
            | Error::Quorum(i) => i,
        }
    }

    fn info_mut(&mut self) -> &mut ErrorInfo {
        match self {
            Error::Init(i)
            | Error::NoMem(i)
            | Error::Timeout(i)
            | Error::InvalidArgument(i)
            | Error::PeerLost(i)
            | Error::Mismatch(i)
            | Error::Truncated(i)
            | Error::Transport(i)
            | Error::NotSupported(i)
            | Error::Aborted(i)
            | Error::Internal(i)
            | Error::Revoked(i)
            | Error::Quorum(i) => i,
        }
    }

    /// The message alone, without the code's words and the pointer to its entry: for
    /// wrapping this error into another one.
    pub fn detail(&self) -> &str {
        &self.info().message
    }

    /// The rank this error concerns, when it concerns one.
    pub fn peer(&self) -> Option<PeerRank> {
        self.info().peer
    }

    /// The operation that failed, when known.
    pub fn operation(&self) -> Option<Operation> {
        self.info().operation
    }

    /// The members that never entered the collective this error ended, when that was
    /// diagnosed.
    pub fn not_entered(&self) -> Option<&NotEntered> {
        self.info().not_entered.as_deref()
    }

    /// The hcomm error that led to this one, when there is one.
    pub fn cause(&self) -> Option<&Error> {
        self.info().cause.as_deref()
    }

    /// The I/O error underneath, when there is one.
    pub fn io_error(&self) -> Option<&io::Error> {
        self.info().io.as_ref().map(|s| &*s.0)
    }

    /// Wraps an I/O error of a transport, saying what was being done: the message is
    /// `"{what}: {err}"`, and `err` is the [`source`](std::error::Error::source).
    pub(crate) fn transport(what: impl fmt::Display, err: io::Error) -> Error {
        Error::transport_failed(format!("{what}: {err}")).with_source(err)
    }
}

impl fmt::Display for ErrorInfo {
    /// The message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl ErrorInfo {
    /// The facts of an error saying `message`, nothing else known yet.
    pub fn new(message: impl Into<String>) -> ErrorInfo {
        ErrorInfo {
            message: message.into(),
            ..ErrorInfo::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn shareable<T: Clone + Send + Sync + 'static>() {}

    /// Two words: a `Result<usize>` or `Result<()>` comes back in registers (120 bytes of
    /// facts inline made every result of the hot path go through memory: 8 B shared-memory
    /// stream 0.419 against 0.368 us boxed).
    #[test]
    fn an_error_is_two_words() {
        assert_eq!(
            std::mem::size_of::<Error>(),
            2 * std::mem::size_of::<usize>()
        );
        assert_eq!(
            std::mem::size_of::<Result<usize>>(),
            std::mem::size_of::<Error>()
        );
    }

    #[test]
    fn an_error_is_clone_send_sync() {
        shareable::<Error>();
    }

    #[test]
    fn the_io_source_is_kept_and_returned_by_source() {
        let io = io::Error::new(io::ErrorKind::ConnectionReset, "reset by peer");
        let e = Error::transport("reading from world rank 2", io);
        assert_eq!(
            e.to_string(),
            "hcomm transport error: reading from world rank 2: reset by peer (see \
             docs/errors.md#transport)"
        );
        assert_eq!(
            e.io_error().map(io::Error::kind),
            Some(io::ErrorKind::ConnectionReset)
        );
        let source = e.source().expect("a source");
        let io = source.downcast_ref::<io::Error>().expect("an io::Error");
        assert_eq!(io.kind(), io::ErrorKind::ConnectionReset);
        assert_eq!(e.clone(), e);
    }

    #[test]
    fn the_facts_survive_a_prefix_and_the_cause_is_the_source_without_io() {
        let lost = Error::peer_lost(PeerRank::ranks(1, 5), "world rank 5 is unreachable")
            .with_operation(Operation::new("recv"));
        let e = Error::aborted("rank 1 abandoned this collective")
            .with_peer(PeerRank::comm(1))
            .with_cause(lost.clone())
            .with_operation(Operation::seq("allreduce", 3))
            .prefixed("allreduce(4 x f32 sum) on rank 0");
        assert_eq!(
            e.detail(),
            "allreduce(4 x f32 sum) on rank 0: rank 1 abandoned this collective"
        );
        assert_eq!(e.peer(), Some(PeerRank::comm(1)));
        assert_eq!(e.operation(), Some(Operation::seq("allreduce", 3)));
        assert_eq!(e.cause(), Some(&lost));
        assert_eq!(e.io_error().map(io::Error::kind), None);
        let source = e.source().expect("the cause");
        assert_eq!(source.downcast_ref::<Error>(), Some(&lost));
        assert_eq!(lost.peer().and_then(|p| p.world), Some(5));
        assert_eq!(lost.code(), ErrorCode::PeerLost);
        assert!(lost.source().is_none());
    }

    #[test]
    fn every_constructor_gives_its_code() {
        let m = "m";
        let made = [
            (Error::init(m), ErrorCode::Init),
            (Error::no_mem(m), ErrorCode::NoMem),
            (Error::timeout(m), ErrorCode::Timeout),
            (Error::invalid_argument(m), ErrorCode::InvalidArgument),
            (Error::peer_lost(PeerRank::world(0), m), ErrorCode::PeerLost),
            (Error::mismatch(m), ErrorCode::Mismatch),
            (Error::truncated(m), ErrorCode::Truncated),
            (Error::transport_failed(m), ErrorCode::Transport),
            (Error::not_supported(m), ErrorCode::NotSupported),
            (Error::aborted(m), ErrorCode::Aborted),
            (Error::internal(m), ErrorCode::Internal),
            (Error::revoked(m), ErrorCode::Revoked),
            (Error::quorum(m), ErrorCode::Quorum),
        ];
        for (e, code) in made {
            assert_eq!(e.code(), code);
            assert_eq!(e.detail(), "m");
        }
    }
}
