//! Point-to-point messaging: tag matching, requests and the progress engine over TCP links,
//! shared-memory rings, or a transport plug-in.
//!
//! One [`Engine`] serves every communicator of a world (split and dup share it); frames carry
//! the communicator id. Messages up to the eager limit travel in one frame; larger ones use a
//! rendezvous (RTS, CTS, then data chunks spread over all streams of the peer and written
//! straight into the receive buffer), so unexpected large messages never pile up in memory.
//!
//! Progress: a thread that waits drives the sockets itself (it spins briefly, then sleeps in
//! `epoll_wait`), so a blocking receive reads its own data with no hand-off. A background
//! thread progresses outstanding nonblocking operations while nobody waits.
//!
//! Collectives put a signature in every frame (what the call was: collective, type, op,
//! count, root). A receive only matches a message with its own signature; a message of a
//! different call fails the receiving call with a mismatch, and an `Abort` frame tells the
//! sender, whose call then fails too (or, if it is over, its next call on that
//! communicator). Abandoned operations are disentangled from the wire — data still due is
//! read and dropped — so that a mismatch never costs a connection.
//!
//! Every operation names a buffer by raw pointer. The engine touches it only until the
//! operation completes, is cancelled, or fails with its peer; memory reaches it only as a
//! [`lease::Lease`], through the safe doors of `lease` that keep the buffer alive and
//! borrowed until then.
//!
//! The engine by concern: `matching` (posted receives and unexpected messages),
//! `rendezvous` (eager or rendezvous per message), `pull` (a local message copied out of the
//! sender's buffer a piece per turn), `calls` (signatures, mismatches, aborts),
//! `dispatch` (what each arriving frame means, sans I/O), `timers` (deadlines, sans I/O),
//! `requests` (operations), `lease` (the memory they use), `progress` (one turn over the links, the
//! background thread, lost peers), `wait` (how waiters spin, yield and sleep), `watch` (dead
//! and hung peers), `inline` (the short cuts of small messages), and `link`: the [`Link`]
//! interface every transport implements (`link/tcp.rs`, `link/shm.rs`, `link/plugin.rs`), and
//! the route of each frame.
//!
//! [`Link`]: link::Link

// Small integer keys, hashed on every message: Fx is several times faster than SipHash and
// the keys come from this process, not from peers.
use rustc_hash::FxHashMap as HashMap;
use std::net::TcpStream;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{epoll, eventfd, EventfdFlags};

mod calls;
mod dispatch;
mod inline;
pub(crate) mod lease;
mod link;
mod matching;
mod progress;
mod pull;
mod rendezvous;
mod requests;
mod revoke;
#[cfg(test)]
mod sansio_tests;
pub(crate) mod split;
#[cfg(test)]
mod tests;
mod timers;
pub(crate) mod wait;
mod watch;

use crate::config::Backoff;
use crate::error::{Error, Operation, PeerRank, Result};
use crate::sync::lock;
use crate::transport::plugin::Lease;
use crate::transport::shm::link::{Doorbell, Inbox, PeerInbox, ShmLink};
use crate::transport::shm::wake::PeerEnd;
use crate::transport::tcp::{Mesh, MeshConfig};
use crate::transport::wire::{FrameHeader, FrameKind, HEADER_LEN};
use calls::Calls;
use dispatch::comm_abort_frame;
use lease::BufPtr;
use link::kept::Handoff;
pub(crate) use link::ofi::OfiLimits;
use link::ofi::{Hub, OfiLink};
use link::plugin::{Channels, PluginLink};
use link::shm::ShmPeerLink;
use link::tcp::TcpLink;
use link::{AnyLink, Link, Links};
use matching::Matching;
use progress::progress_thread;
use rendezvous::Rendezvous;
use timers::Timers;
use wait::{poll, timespec};

/// Identifies an operation inside the engine.
pub(crate) type OpId = u64;

/// The peer (and communicator rank) of a receive from any source until a message binds it
/// to its sender.
pub(crate) const ANY_PEER: usize = usize::MAX;

/// epoll token of the wake-up eventfd.
const WAKE_TOKEN: u64 = u64::MAX;
/// epoll token of the shared-memory wake socket (local peers' wake-ups, see
/// `transport::shm::wake`).
const SHM_WAKE_TOKEN: u64 = u64::MAX - 1;
/// epoll token of the listener, where peers connect on demand.
const LISTEN_TOKEN: u64 = u64::MAX - 2;
/// While spinning, every this many rounds the waiter asks epoll instead of reading the
/// awaited peers' sockets directly (each ask is a system call that finds nothing most of the
/// time). 2 ranks between two network namespaces, 8 B over TCP, 5 interleaved runs: ping-pong
/// 3.84-3.85 us at 32 against 3.88-3.99 at 8 (3.80-3.87 at 64; asking every round, 4.2),
/// all-gather 4.95-5.13 against 5.08-5.27 us, all-reduce level.
const DIRECT_READS: u32 = 32;
/// Direct reads only for waits on this many peers or fewer.
const MAX_DIRECT_PEERS: usize = 4;
/// How long a finalizing rank keeps reading the links that ask for it after it closed its
/// side (see [`Engine::close`]).
const LINGER: Duration = Duration::from_secs(1);
/// How often a lingering rank looks whether its links still ask for it (a peer's kernel
/// acknowledging data wakes nobody).
const LINGER_NAP: Duration = Duration::from_millis(2);
/// A spinning waiter reads the clock once in this many rounds.
const CLOCK_ROUNDS: u32 = 16;
/// A waiter with only shared-memory peers asks epoll once in this many rounds.
const SHM_POLLS_PER_EPOLL: u32 = 64;
/// How long the engine waits, after a peer's connection ended, for its goodbye to come
/// through the link that carries its traffic before it counts the peer as lost.
const GRACE: Duration = LINGER;

/// How many messages took each protocol, for tests, logs and the profiler.
#[derive(Debug, Default)]
pub(crate) struct ProtocolCounts {
    /// Inline through a shared-memory ring.
    pub shm_eager: AtomicU64,
    /// Pulled by the receiver with cross-memory attach (one copy).
    pub shm_pull: AtomicU64,
    /// Pushed by the sender in chunks through the ring.
    pub shm_push: AtomicU64,
    /// Of the pulled messages, those split between both ranks (the sender was asked to write
    /// pieces too).
    pub shm_split: AtomicU64,
    /// Pieces of split messages this rank wrote into its receivers' buffers.
    pub shm_split_written: AtomicU64,
    /// Eager over TCP.
    pub tcp_eager: AtomicU64,
    /// Rendezvous over TCP.
    pub tcp_rendezvous: AtomicU64,
    /// Eager through a transport plug-in.
    pub plugin_eager: AtomicU64,
    /// Rendezvous through a transport plug-in.
    pub plugin_rendezvous: AtomicU64,
    /// Frames through libfabric with their payload inline.
    pub ofi_eager: AtomicU64,
    /// Frames through libfabric whose payload the receiver read (RDMA read).
    pub ofi_read: AtomicU64,
    /// Frames through libfabric whose payload the sender wrote (RDMA write).
    pub ofi_write: AtomicU64,
    /// Messages of collective steps written straight into the receive the peer offered
    /// (direct steps: no rendezvous).
    pub ofi_direct: AtomicU64,
    /// libfabric memory registrations found in the cache.
    pub ofi_mr_hits: AtomicU64,
    /// libfabric memory registrations made.
    pub ofi_mr_misses: AtomicU64,
    /// Payload bytes of the libfabric frames of each protocol.
    pub ofi_eager_bytes: AtomicU64,
    /// As `ofi_eager_bytes`, read by the receiver.
    pub ofi_read_bytes: AtomicU64,
    /// As `ofi_eager_bytes`, written by the sender.
    pub ofi_write_bytes: AtomicU64,
    /// As `ofi_eager_bytes`, written straight into the peer's offered receive (direct steps).
    pub ofi_direct_bytes: AtomicU64,
    /// libfabric registrations closed because their memory may go.
    pub ofi_mr_invalidations: AtomicU64,
    /// Transfers of pool memory through a pool block's own registration.
    pub ofi_mr_pool: AtomicU64,
    /// Pool blocks registered with libfabric.
    pub ofi_pool_blocks: AtomicU64,
    /// Sleeps of waiters on their shared-memory doorbell, or in `epoll_wait` while they have
    /// shared-memory peers.
    pub naps: AtomicU64,
    /// Of those, sleeps that lasted their whole time, woken by nobody.
    pub full_naps: AtomicU64,
    /// Message frames dropped as stale: of a revoked communicator's epoch.
    pub stale_frames: AtomicU64,
    /// One-sided all-reduces of heap buffers run through pool memory.
    pub shm_staged: AtomicU64,
}

/// How many messages took each protocol so far, and how waiters slept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProtocolStats {
    /// Messages inline through a shared-memory ring.
    pub shm_eager: u64,
    /// Messages pulled by the receiver with cross-memory attach.
    pub shm_pull: u64,
    /// Messages pushed by the sender in chunks through shared memory.
    pub shm_push: u64,
    /// Of the pulled messages, those copied by both ranks at once: the receiver pulled
    /// pieces while the sender was asked to write others into its buffer.
    pub shm_split: u64,
    /// Pieces of split messages this rank wrote, as their sender, into the receivers'
    /// buffers.
    pub shm_split_written: u64,
    /// Eager messages over TCP.
    pub tcp_eager: u64,
    /// Rendezvous messages over TCP.
    pub tcp_rendezvous: u64,
    /// Eager messages through a transport plug-in.
    pub plugin_eager: u64,
    /// Rendezvous messages through a transport plug-in.
    pub plugin_rendezvous: u64,
    /// Frames through libfabric with their payload inline (eager).
    pub ofi_eager: u64,
    /// Frames through libfabric whose payload the receiver read (RDMA read).
    pub ofi_read: u64,
    /// Frames through libfabric whose payload the sender wrote (RDMA write).
    pub ofi_write: u64,
    /// Messages of collective steps through libfabric written straight into the receive the
    /// peer offered for them (direct steps, with no rendezvous; not counted above).
    pub ofi_direct: u64,
    /// libfabric memory registrations found in the registration cache.
    pub ofi_mr_hits: u64,
    /// libfabric memory registrations made (cache misses).
    pub ofi_mr_misses: u64,
    /// Payload bytes of the libfabric frames sent eager.
    pub ofi_eager_bytes: u64,
    /// Payload bytes of the libfabric frames the receiver read.
    pub ofi_read_bytes: u64,
    /// Payload bytes of the libfabric frames the sender wrote.
    pub ofi_write_bytes: u64,
    /// Payload bytes of the direct steps (`ofi_direct`).
    pub ofi_direct_bytes: u64,
    /// libfabric registrations closed because their memory may go: a cached registration
    /// whose last user ended (the memory's owner may free it), or a pool block's whose memory
    /// the pool gave back.
    pub ofi_mr_invalidations: u64,
    /// Transfers from or to shared-memory pool memory that used the registration of its pool
    /// block (made when the block was created) instead of one of their own.
    pub ofi_mr_pool: u64,
    /// Shared-memory pool blocks registered with libfabric (when their memory was backed:
    /// at creation, or when a grown block's given-back memory was reserved again).
    pub ofi_pool_blocks: u64,
    /// Times a waiter slept on its shared-memory doorbell, or in `epoll_wait` while it has
    /// shared-memory peers (it also has peers over other transports).
    pub naps: u64,
    /// Of those, sleeps that lasted their whole time (at most 100 ms), woken by nobody:
    /// only peers that stay silent that long cause them, or a lost wake-up.
    pub full_naps: u64,
    /// TCP connections this rank opened to its peers (`HCOMM_TCP_STREAMS` per peer it
    /// connected to first: links are made on a peer's first use).
    pub tcp_opened: u64,
    /// TCP connections this rank accepted from its peers.
    pub tcp_accepted: u64,
    /// Failovers: TCP streams that died with others to the same peer left, whose frames
    /// went out on another (`HCOMM_FAILOVER`).
    pub tcp_failovers: u64,
    /// Fallbacks: peers whose traffic moved from the transport plug-in to TCP after the
    /// plug-in failed (or the peer's did), without loss (`HCOMM_FAILOVER`).
    pub plugin_fallbacks: u64,
    /// Message frames dropped because their communicator was revoked at their epoch (a
    /// member stopped and resumed after the others shrank it sends them).
    pub stale_frames: u64,
    /// Shared-memory all-reduces of heap buffers that went through pool memory: their input
    /// copied into the communicator's pool memory and the result out of it, with many more
    /// local ranks than cores, where the peers' mapped pool blocks save the system calls of
    /// cross-memory attach.
    pub shm_staged: u64,
}

impl ProtocolCounts {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn add(c: &AtomicU64, v: usize) {
        c.fetch_add(v as u64, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ProtocolStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ProtocolStats {
            shm_eager: get(&self.shm_eager),
            shm_pull: get(&self.shm_pull),
            shm_split: get(&self.shm_split),
            shm_split_written: get(&self.shm_split_written),
            shm_push: get(&self.shm_push),
            tcp_eager: get(&self.tcp_eager),
            tcp_rendezvous: get(&self.tcp_rendezvous),
            plugin_eager: get(&self.plugin_eager),
            plugin_rendezvous: get(&self.plugin_rendezvous),
            ofi_eager: get(&self.ofi_eager),
            ofi_read: get(&self.ofi_read),
            ofi_write: get(&self.ofi_write),
            ofi_direct: get(&self.ofi_direct),
            ofi_mr_hits: get(&self.ofi_mr_hits),
            ofi_mr_misses: get(&self.ofi_mr_misses),
            ofi_eager_bytes: get(&self.ofi_eager_bytes),
            ofi_read_bytes: get(&self.ofi_read_bytes),
            ofi_write_bytes: get(&self.ofi_write_bytes),
            ofi_direct_bytes: get(&self.ofi_direct_bytes),
            ofi_mr_invalidations: get(&self.ofi_mr_invalidations),
            ofi_mr_pool: get(&self.ofi_mr_pool),
            ofi_pool_blocks: get(&self.ofi_pool_blocks),
            naps: get(&self.naps),
            full_naps: get(&self.full_naps),
            stale_frames: get(&self.stale_frames),
            shm_staged: get(&self.shm_staged),
            tcp_opened: 0,
            tcp_accepted: 0,
            tcp_failovers: 0,
            plugin_fallbacks: 0,
        }
    }
}

/// The shared-memory side of an engine: this rank's inbox and its links with local peers.
pub(crate) struct ShmSetup {
    /// This rank's inbox (its doorbell lives at its start).
    pub inbox: Inbox,
    /// `(world rank, link)` for every other local rank.
    pub links: Vec<(usize, ShmLink)>,
}

impl ShmSetup {
    /// Whether world rank `peer` is linked by shared memory alone, with no TCP connection.
    pub(crate) fn socketless(&self, peer: usize) -> bool {
        self.links
            .iter()
            .any(|(p, l)| *p == peer && l.end.is_some())
    }
}

/// Engine settings, fixed at creation.
#[derive(Debug, Clone)]
pub(crate) struct EngineConfig {
    /// This process's world rank.
    pub rank: usize,
    /// `HCOMM_RUN_FD`: the launcher's pipe for news of lost peers (descriptor, inode).
    pub run_fd: Option<(i32, u64)>,
    /// Messages up to this size go eagerly.
    pub eager_limit: usize,
    /// Data chunk size of rendezvous transfers.
    pub chunk: usize,
    /// How long a waiter polls before it sleeps.
    pub spin: Duration,
    /// Shared-memory messages up to this size go inline through the ring.
    pub shm_eager_limit: usize,
    /// Shared-memory messages up to this size are pulled by the receiver with cross-memory
    /// attach (where it works); larger ones are pushed by the sender in chunks.
    pub shm_push_threshold: usize,
    /// Chunk size of shared-memory pushes.
    pub shm_chunk: usize,
    /// Pulled shared-memory messages from this size are copied by both ranks at once.
    pub shm_split_threshold: usize,
    /// Describes an operation signature for mismatch messages.
    pub describe: fn([u64; 2]) -> String,
    /// `HCOMM_TIMEOUT`: sets the heartbeats of the watcher (see `p2p/watch.rs`).
    pub timeout: Duration,
    /// `HCOMM_DEBUG`: say on the terminal which links come up.
    pub debug: bool,
}

/// Which operation [`Engine::blocking`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocking {
    Send,
    Recv,
}

/// When a wait gives up: at an instant, or a duration after the wait starts (the clock is
/// then read only if the operation is not complete at once: reading it costs about as much as
/// a small message through shared memory).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Deadline {
    /// At this instant.
    At(Instant),
    /// This long after the wait started.
    After(Duration),
}

impl Deadline {
    fn resolve(self) -> Instant {
        match self {
            Deadline::At(at) => at,
            Deadline::After(d) => Instant::now() + d,
        }
    }
}

impl From<Instant> for Deadline {
    fn from(at: Instant) -> Deadline {
        Deadline::At(at)
    }
}

/// Which rank of which communicator an operation talks to, for messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    /// Communicator id (frames carry it).
    pub comm: u64,
    /// World rank of the peer (indexes the links).
    pub peer: usize,
    /// Rank of the peer in the communicator (for messages); [`ANY_PEER`], with `peer`, for a
    /// receive from any source not matched yet.
    pub comm_rank: usize,
    /// Message tag.
    pub tag: u32,
    /// Signature of the operation (zero for plain point-to-point): a receive only matches a
    /// message with the same signature; any other is a mismatch.
    pub sig: [u64; 2],
    /// The point-to-point call's number on its communicator at this rank, which its errors
    /// name (`Operation::seq`): sends and receives are numbered apart, from 1; 0 for the
    /// messages of collectives and of the library's own exchanges, which are not numbered.
    pub seq: u64,
    /// The communicator's epoch, which its message frames carry (see `Calls::stale`).
    pub epoch: u32,
}

impl Target {
    /// The operation `kind` with this target, for errors: named, and numbered when its call
    /// is.
    fn operation(&self, kind: OpKind) -> Operation {
        let name = match kind {
            OpKind::Send => "send",
            OpKind::Recv => "recv",
        };
        match self.seq {
            0 => Operation::new(name),
            n => Operation::seq(name, n),
        }
    }

    /// The matching key of its messages.
    fn key(&self) -> MatchKey {
        MatchKey {
            comm: self.comm,
            peer: self.peer,
            tag: self.tag,
        }
    }
}

/// What a message is matched by: communicator id, sender's world rank, tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct MatchKey {
    comm: u64,
    peer: usize,
    tag: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Send,
    Recv,
}

#[derive(Debug)]
struct Op {
    kind: OpKind,
    target: Target,
    buf: BufPtr,
    /// Send: message length. Recv: buffer capacity.
    cap: usize,
    /// Send: frames not yet fully written.
    remaining: usize,
    asynchronous: bool,
    /// Buffer of a nonblocking operation whose request was dropped before completion: the
    /// engine finishes the operation and frees it.
    detached: Option<Vec<u8>>,
    /// A receive from any source: the world ranks of its communicator's members, by
    /// communicator rank (the first message that matches binds `target` to its sender).
    members: Option<Arc<[usize]>>,
    result: Option<Result<usize>>,
}

/// Names a communicator rank in messages ("any rank" for an unmatched wildcard).
fn rank_name(comm_rank: usize) -> String {
    if comm_rank == ANY_PEER {
        "any rank".to_string()
    } else {
        format!("rank {comm_rank}")
    }
}

impl Op {
    /// The operation, for errors.
    fn operation(&self) -> Operation {
        self.target.operation(self.kind)
    }

    fn describe(&self) -> String {
        let t = &self.target;
        match self.kind {
            OpKind::Send => format!(
                "send of {} bytes to rank {} (tag {})",
                self.cap, t.comm_rank, t.tag
            ),
            OpKind::Recv => format!(
                "recv from {} (tag {}, buffer {} bytes)",
                rank_name(t.comm_rank),
                t.tag,
                self.cap
            ),
        }
    }
}

/// Where the payload of the frame being read goes.
#[derive(Debug, Clone, Copy)]
enum Dest {
    /// Into an operation's buffer at `base` + progress.
    Op { op: OpId, base: usize },
    /// Into an unexpected eager message.
    Unexpected(u64),
    /// Read and dropped (truncated message).
    Discard,
}

#[derive(Debug)]
struct OutFrame {
    /// What the frame is (the links route by it).
    kind: FrameKind,
    hdr: [u8; HEADER_LEN],
    hdr_done: usize,
    /// Payload: `len` bytes of `op`'s buffer at `off`.
    op: Option<OpId>,
    off: usize,
    len: usize,
    done: usize,
    /// The payload itself, for a frame whose operation was abandoned half-written.
    owned: Option<Vec<u8>>,
    /// A direct step of a collective (see `link::Exposure`): the link writes the message into
    /// the receive the peer offered under this number.
    direct: Option<u32>,
}

impl OutFrame {
    fn control(hdr: FrameHeader) -> OutFrame {
        OutFrame {
            kind: hdr.kind,
            hdr: hdr.encode(),
            hdr_done: 0,
            op: None,
            off: 0,
            len: 0,
            done: 0,
            owned: None,
            direct: None,
        }
    }
}

/// What the protocol knows of a peer (its links are in `State::links`).
#[derive(Debug)]
struct Peer {
    /// The peer said it is finalizing.
    closed: bool,
    /// Why the peer cannot be reached any more.
    lost: Option<String>,
    /// Frames received from the peer (a sign of life for the watcher).
    heard: u64,
}

/// The parts of the engine used without its lock.
struct Io {
    epoll: OwnedFd,
    /// An eventfd that wakes every thread sleeping in `epoll_wait`.
    wake: OwnedFd,
    /// Threads inside `wait` (they drive progress).
    waiters: AtomicUsize,
    /// Nonblocking operations not yet taken by their owner.
    pending_async: AtomicUsize,
    /// The background thread is (about to be) inside `epoll_wait`.
    polling: AtomicBool,
    /// This rank's shared-memory inbox, when it has local peers.
    inbox: Option<Inbox>,
    /// The inboxes of the shared-memory peers, by world rank, with their process ids and
    /// whether cross-memory attach reaches them.
    peer_inboxes: HashMap<usize, (PeerInbox, u32, bool)>,
    /// Items the plug-in receivers queued that the engine has not taken yet.
    plugin_rx: AtomicUsize,
    /// Bumped by the watcher when a peer's connection ended or it failed a peer: a sleeper
    /// that saw it change must look at the sockets and its operations before sleeping.
    alarms: AtomicU64,
    /// Some communicator was aborted (so that checking for it costs no lock until one is).
    any_aborted: AtomicBool,
    /// Duplicates of the stream 0 of local peers whose TCP connection came up, for the
    /// watcher to wait for their end; `ends_kick` tells it that some came.
    new_ends: Mutex<Vec<(usize, watch::End)>>,
    /// An eventfd the watcher polls: new ends to watch.
    ends_kick: OwnedFd,
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io")
            .field("peer_inboxes", &self.peer_inboxes.len())
            .finish_non_exhaustive()
    }
}

impl Io {
    /// Wakes every thread sleeping in `epoll_wait` on this engine.
    fn wake_all(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        if let Some(bell) = self.bell() {
            bell.ring();
        }
    }

    fn bell(&self) -> Option<&Doorbell> {
        self.inbox.as_ref().map(Inbox::bell)
    }

    /// Hands the watcher the end of a local peer's connection.
    fn watch_end(&self, peer: usize, end: TcpStream) {
        lock(&self.new_ends).push((peer, watch::End::Stream(end)));
        let _ = rustix::io::write(&self.ends_kick, &1u64.to_ne_bytes());
    }

    /// The watcher found news about a peer: wakes every sleeper, and keeps those about to
    /// sleep awake (see `alarms`).
    fn alarm(&self) {
        self.alarms.fetch_add(1, Ordering::SeqCst);
        self.wake_all();
    }
}

struct State {
    cfg: EngineConfig,
    io: Arc<Io>,
    /// The world's TCP connections, made on demand (none in a world of one).
    mesh: Option<Arc<Mesh>>,
    peers: Vec<Option<Peer>>,
    /// Every peer's links, behind the one interface of all transports.
    links: Links,
    counts: Arc<ProtocolCounts>,
    ops: HashMap<OpId, Op>,
    next_op: OpId,
    /// Posted receives and unexpected messages.
    matching: Matching,
    /// The communicator rank each completed receive from any source got its message from,
    /// until its owner asks ([`Engine::take_source`]).
    sources: HashMap<OpId, usize>,
    /// Message ids and rendezvous in flight.
    rndv: Rendezvous,
    /// Collective calls, mismatches and aborts.
    calls: Calls,
    /// The deadlines of the operations being waited for.
    timers: Timers,
    /// Operations completed since the last look (to wake other waiters).
    completions: usize,
    /// A failing peer's links are being read to their end.
    draining: bool,
    /// The communicator aborts this rank made or learnt of (ids, aborting world rank): sent
    /// again to every peer before this rank's goodbye, which could otherwise reach a peer
    /// before the aborter's own notice does.
    comm_aborts: Vec<([u64; 3], usize)>,
    /// The operations whose frames one flush of a link wrote (kept to reuse its allocation).
    sent: Vec<OpId>,
    /// The world ranks of each communicator's members, by id, for forwarding revokes
    /// (`revoke.rs`).
    members: HashMap<u64, std::sync::Weak<[usize]>>,
    /// Receives copying their message out of a local sender's buffer, a piece per turn.
    pulls: Vec<pull::Pull>,
    /// Per world rank: the kernel refused a pull from it, so its messages are pushed.
    pull_refused: Vec<bool>,
    /// Messages copied by both ranks at once (`split.rs`).
    split: split::Splits,
    /// The transport plug-in and the threads of the channels opened so far, when the world
    /// has one.
    plugin: Option<Channels>,
}

struct Shared {
    state: Mutex<State>,
    counts: Arc<ProtocolCounts>,
    /// `Calls::late_news`.
    late_news: Arc<AtomicBool>,
    io: Arc<Io>,
    idle: Mutex<()>,
    idle_cv: Condvar,
    shutdown: AtomicBool,
    /// The engine is closing: the watcher sends no more heartbeats and judges nobody.
    closing: AtomicBool,
    spin: Duration,
    /// The world's TCP connections (see `State::mesh`).
    mesh: Option<Arc<Mesh>>,
    /// The world's libfabric endpoint, when it has one.
    ofi: Option<Arc<Hub>>,
}

/// What carries the traffic of the peers instead of TCP and shared memory.
pub(crate) enum Carrier {
    /// A transport plug-in, all of it.
    Plugin(Lease),
    /// A libfabric endpoint, that of the peers it has an address of (boxed: the endpoint's
    /// handles and names outweigh a plug-in's lease many times).
    Ofi(Box<OfiSetup>),
}

/// A world's libfabric endpoint and the peers it reaches.
pub(crate) struct OfiSetup {
    /// The endpoint, open.
    pub endpoint: crate::transport::ofi::Endpoint,
    /// Each world rank's endpoint address; `None`: not reached through libfabric.
    pub addrs: Vec<Option<Vec<u8>>>,
    /// The protocols' thresholds.
    pub limits: OfiLimits,
}

/// The progress engine of one world.
pub(crate) struct Engine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The thread that notices dead and hung peers.
    watcher: Option<watch::Watcher>,
}

impl Engine {
    /// The engine of a world of `size` ranks. `mesh`: this rank's listener and the peers'
    /// addresses, through which every peer's TCP link connects on its first use (none in a
    /// world of one). `shm`: the shared-memory links of the local peers, which then carry their
    /// traffic. `carrier`: a transport plug-in, initialized here, which then carries all
    /// traffic, or a libfabric endpoint, which carries that of the peers it reaches.
    pub(crate) fn new(
        size: usize,
        mesh: Option<MeshConfig>,
        shm: Option<ShmSetup>,
        carrier: Option<Carrier>,
        cfg: EngineConfig,
    ) -> Result<Engine> {
        let sys = |what: &str, e: rustix::io::Errno| {
            Error::init(format!("{what}: {e}")).with_source(e.into())
        };
        let epoll =
            epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| sys("epoll_create", e))?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| sys("eventfd", e))?;
        let ends_kick = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| sys("eventfd", e))?;
        epoll::add(
            &epoll,
            &wake,
            epoll::EventData::new_u64(WAKE_TOKEN),
            epoll::EventFlags::IN,
        )
        .map_err(|e| sys("epoll_ctl", e))?;
        let socketless: Vec<bool> = (0..size)
            .map(|p| shm.as_ref().is_some_and(|s| s.socketless(p)))
            .collect();
        let (inbox, mut shm_links) = match shm {
            Some(ShmSetup { inbox, links }) => (Some(inbox), links),
            None => (None, Vec::new()),
        };
        if let Some(w) = inbox.as_ref().and_then(Inbox::wake_socket) {
            epoll::add(
                &epoll,
                w,
                epoll::EventData::new_u64(SHM_WAKE_TOKEN),
                epoll::EventFlags::IN,
            )
            .map_err(|e| sys("epoll_ctl", e))?;
        }
        let peer_inboxes: HashMap<usize, (PeerInbox, u32, bool)> = shm_links
            .iter()
            .map(|(p, link)| (*p, (link.peer_inbox(), link.pid, link.cma)))
            .collect();
        let io = Arc::new(Io {
            epoll,
            wake,
            waiters: AtomicUsize::new(0),
            pending_async: AtomicUsize::new(0),
            polling: AtomicBool::new(false),
            inbox,
            peer_inboxes,
            plugin_rx: AtomicUsize::new(0),
            alarms: AtomicU64::new(0),
            any_aborted: AtomicBool::new(false),
            new_ends: Mutex::new(Vec::new()),
            ends_kick,
        });
        let mesh = match mesh {
            Some(m) => {
                let woken = Arc::clone(&io);
                let mesh = Mesh::start(m, Box::new(move || woken.wake_all()))?;
                epoll::add(
                    &io.epoll,
                    mesh.listener(),
                    epoll::EventData::new_u64(LISTEN_TOKEN),
                    epoll::EventFlags::IN,
                )
                .map_err(|e| sys("epoll_ctl", e))?;
                Some(Arc::new(mesh))
            }
            None => None,
        };
        // A peer's first link is its TCP connection, made on the peer's first use, when the
        // pair has one (every pair but the local ones linked by shared memory alone); a
        // shared-memory link or the plug-in then carries its traffic.
        let mut all = Links::new(size);
        let peers: Vec<Option<Peer>> = (0..size)
            .map(|p| {
                (p != cfg.rank).then_some(Peer {
                    closed: false,
                    lost: None,
                    heard: 0,
                })
            })
            .collect();
        // What the watcher waits on for the end of each local peer: a pidfd of its process
        // (the pairs linked by shared memory alone), or a duplicate of stream 0 of its TCP
        // connection once that is up (`Io::watch_end`).
        let mut ends = Vec::with_capacity(shm_links.len());
        for (p, link) in &mut shm_links {
            if let Some(pidfd) = link.end.as_mut().and_then(PeerEnd::take_pidfd) {
                ends.push((*p, watch::End::Process(pidfd)));
            }
        }
        if let Some(mesh) = &mesh {
            for p in (0..size).filter(|&p| p != cfg.rank && !socketless[p]) {
                let tcp = TcpLink::new(p, all.next_index(p), &io, mesh);
                all.add(p, AnyLink::Tcp(tcp));
            }
        }
        for (p, link) in shm_links {
            if p >= size || p == cfg.rank {
                return Err(Error::internal(format!(
                    "shared-memory link to world rank {p} has no peer"
                ))
                .with_peer(PeerRank::world(p)));
            }
            all.add(p, AnyLink::Shm(ShmPeerLink::new(link)));
        }
        // A local pair that keeps its TCP connection needs it from the start, not on first
        // use: its end is how the watcher learns of the peer's death (no pidfd), and it
        // carries the wake-up frames for a sleeper in epoll.
        for &p in io.peer_inboxes.keys() {
            if !socketless[p] {
                all.want(p);
            }
        }
        let spin = cfg.spin;
        let timing = watch::Timing::for_timeout(cfg.timeout);
        let counts = Arc::new(ProtocolCounts::default());
        let late_news = Arc::new(AtomicBool::new(false));
        let mut limits = rendezvous::Limits {
            eager: cfg.eager_limit,
            shm_eager: cfg.shm_eager_limit,
            shm_pull: cfg.shm_push_threshold,
            rma_eager: cfg.eager_limit,
        };
        let describe = cfg.describe;
        let (plugin, ofi) = match carrier {
            Some(Carrier::Plugin(lease)) => (Some(lease), None),
            Some(Carrier::Ofi(setup)) => (None, Some(*setup)),
            None => (None, None),
        };
        let mut ofi_hub = None;
        if let Some(setup) = ofi {
            // Frames up to the write threshold go whole (their payload inline or read by the
            // receiver); larger messages take the rendezvous, whose data the sender writes.
            limits.rma_eager = setup.limits.write;
            let hub = Hub::start(
                setup.endpoint,
                cfg.rank,
                &setup.addrs,
                setup.limits,
                Arc::clone(&counts),
            )?;
            let hub = Arc::new(hub);
            let line = format!("hcomm: rank {}: libfabric: {}", cfg.rank, hub.describe());
            if cfg.debug {
                // HCOMM_DEBUG=1 asks for exactly this on the terminal.
                eprintln!("{line}");
            }
            tracing::debug!("{line}");
            let reached: Vec<usize> = (0..size).filter(|&p| hub.reaches(p)).collect();
            if let (Some(fd), Some(&first)) = (hub.wait_fd(), reached.first()) {
                // SAFETY: the descriptor is the completion queue's, open as long as the hub,
                // which the links keep; epoll forgets it when it closes.
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                let tok = link::token(first, all.next_index(first), 0);
                epoll::add(
                    &io.epoll,
                    fd,
                    epoll::EventData::new_u64(tok),
                    epoll::EventFlags::IN,
                )
                .map_err(|e| sys("epoll_ctl", e))?;
            }
            for p in reached {
                let direct = link::token(p, all.next_index(p), link::ofi::DIRECT_LANE);
                all.add(p, AnyLink::Ofi(OfiLink::new(&hub, p, direct)));
            }
            ofi_hub = Some(hub);
        }
        let rndv = Rendezvous::new(limits, size);
        // The plug-in's channels open on each pair's first use (`State::want_plugin`), each
        // with the peer's TCP link standing behind it (unless HCOMM_FAILOVER=0).
        let fallback = mesh
            .as_ref()
            .is_some_and(|m| m.config().failover != Some(false));
        let plugin = plugin
            .map(|lease| Channels::start(lease, cfg.rank, size, &io, fallback))
            .transpose()?;
        if let Some(p) = (0..size).find(|&p| p != cfg.rank && all.count(p) == 0) {
            return Err(Error::internal(format!("world rank {p} has no link"))
                .with_peer(PeerRank::world(p)));
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                cfg,
                io: Arc::clone(&io),
                mesh: mesh.clone(),
                peers,
                links: all,
                counts: Arc::clone(&counts),
                ops: HashMap::default(),
                next_op: 1,
                matching: Matching::default(),
                sources: HashMap::default(),
                rndv,
                calls: Calls::new(describe, Arc::clone(&late_news)),
                timers: Timers::default(),
                completions: 0,
                sent: Vec::new(),
                members: HashMap::default(),
                pulls: Vec::new(),
                pull_refused: vec![false; size],
                split: split::Splits::new(size),
                draining: false,
                comm_aborts: Vec::new(),
                plugin,
            }),
            io,
            counts,
            late_news,
            idle: Mutex::new(()),
            idle_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            spin,
            mesh,
            ofi: ofi_hub,
        });
        // First: should the progress thread fail to start, dropping the watcher stops it.
        let watcher = watch::Watcher::start(Arc::clone(&shared), ends, timing)?;
        let bg = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("hcomm-progress".into())
            .spawn(move || progress_thread(&bg))
            .map_err(|e| {
                Error::init(format!("cannot start the progress thread: {e}")).with_source(e)
            })?;
        Ok(Engine {
            shared,
            thread: Some(thread),
            watcher: Some(watcher),
        })
    }

    /// A one-sided all-reduce went through pool memory (`ProtocolStats::shm_staged`).
    pub(crate) fn count_staged(&self) {
        ProtocolCounts::bump(&self.shared.counts.shm_staged);
    }

    /// How many messages took each protocol so far.
    pub(crate) fn protocol_stats(&self) -> ProtocolStats {
        let mut stats = self.shared.counts.snapshot();
        if let Some(mesh) = &self.shared.mesh {
            (stats.tcp_opened, stats.tcp_accepted) = mesh.counts();
            stats.tcp_failovers = mesh.failovers();
            stats.plugin_fallbacks = mesh.fallbacks();
        }
        stats
    }

    /// What registers the shared-memory pool's blocks with the NIC: the libfabric hub, when
    /// the world has one.
    pub(crate) fn block_watcher(
        &self,
    ) -> Option<std::sync::Weak<dyn crate::transport::shm::pool::BlockWatcher>> {
        let hub = self.shared.ofi.as_ref()?;
        let weak: std::sync::Weak<dyn crate::transport::shm::pool::BlockWatcher> =
            Arc::downgrade(hub) as _;
        Some(weak)
    }

    /// The libfabric provider's name (`tcp;ofi_rxm`), when the world has an endpoint.
    pub(crate) fn ofi_provider(&self) -> Option<String> {
        self.shared.ofi.as_ref().map(|h| h.provider())
    }

    /// The failovers and fallbacks to TCP so far, by peer and rail.
    pub(crate) fn failover_counts(&self) -> Vec<crate::observe::stats::FailoverCount> {
        self.shared
            .mesh
            .as_ref()
            .map_or_else(Vec::new, |m| m.failover_counts())
    }

    /// The TCP streams to world rank `peer`, each as `local -> remote`, ` (lost)` after a
    /// stream that failed and was not connected again; empty while it has none.
    pub(crate) fn tcp_rails(&self, peer: usize) -> Vec<String> {
        lock(&self.shared.state)
            .links
            .tcp_mut(peer)
            .map_or_else(Vec::new, |l| l.rails())
    }

    /// Whether world rank `peer` is reached through shared memory.
    pub(crate) fn is_shm_peer(&self, peer: usize) -> bool {
        self.shared.io.peer_inboxes.contains_key(&peer)
    }

    /// How many peers are reached through shared memory.
    pub(crate) fn shm_peer_count(&self) -> usize {
        self.shared.io.peer_inboxes.len()
    }

    /// Process id of the shared-memory peer `peer`, and whether cross-memory attach
    /// reaches it.
    pub(crate) fn shm_peer_pid(&self, peer: usize) -> Option<(u32, bool)> {
        self.shared
            .io
            .peer_inboxes
            .get(&peer)
            .map(|(_, pid, cma)| (*pid, *cma))
    }

    /// A count that changes whenever the watcher learns that a peer's connection ended or
    /// fails a peer: a wait outside the engine reads it before it looks at its peers
    /// ([`Engine::check_peer`]), and does not sleep once it changed.
    pub(crate) fn alarms(&self) -> u64 {
        self.shared.io.alarms.load(Ordering::SeqCst)
    }

    /// This rank's doorbell, when it has shared-memory peers.
    pub(crate) fn own_bell(&self) -> Option<&Doorbell> {
        self.shared.io.bell()
    }

    /// The job id of this rank's shared-memory segment names.
    pub(crate) fn shm_job_id(&self) -> Option<&str> {
        self.shared.io.inbox.as_ref().map(Inbox::job_id)
    }

    /// Rings the doorbell of shared-memory peer `peer` after this rank published something
    /// for it outside the rings; wakes it with a frame if it sleeps in `epoll_wait`.
    pub(crate) fn ring_peer(&self, peer: usize) {
        let Some((inbox, _, _)) = self.shared.io.peer_inboxes.get(&peer) else {
            return;
        };
        if inbox.bell().ring() {
            lock(&self.shared.state).queue_wake(peer);
        }
    }

    /// Tells every peer this rank talked to that it is finishing (the local peers it never
    /// sent to by a mark in its inbox), delivers what is still queued (until `deadline`),
    /// closes the sending side of every link and lingers briefly, reading what the peers
    /// still send, while a link says closing it now could cost the peer what was
    /// sent ([`Link::lingers`](link::Link::lingers): a TCP connection until the peer's kernel
    /// acknowledged everything, a plug-in's until the peer closes its side; a shared-memory
    /// ring never). It does not wait for the peers to finish: a finalize costs the same with
    /// 2 ranks or 256, however late the others come. Returns the peers whose queued data
    /// could not be delivered.
    pub(crate) fn close(&self, deadline: Instant) -> Vec<usize> {
        let sh = &*self.shared;
        sh.closing.store(true, Ordering::SeqCst);
        {
            let mut st = lock(&sh.state);
            // Peers never talked to have no connection, and are owed no goodbye; local peers
            // never sent to take the mark of this rank's inbox for it (below). A rank that
            // forwards aborts says goodbye to every local peer, after the aborts: a mark seen
            // before the aborter's own notice would fail a peer's wait as a finalize, not an
            // abort. A plug-in link ends after its goodbye (else its end would look like the
            // plug-in failing, and the peer would fall back to TCP).
            let aborts = std::mem::take(&mut st.comm_aborts);
            for p in 0..st.peers.len() {
                if !st.links.owes_goodbye(p)
                    && st.links.plugin_of(p).is_none()
                    && (aborts.is_empty() || !st.links.shm_only(p))
                {
                    continue;
                }
                for &(comms, origin) in aborts.iter().filter(|&&(_, o)| o != p) {
                    let origin = (origin != st.cfg.rank).then_some(origin);
                    st.queue(p, OutFrame::control(comm_abort_frame(comms, origin)));
                }
                // On the link whose end follows it (see `Links::route`), after the data.
                st.queue(p, OutFrame::control(FrameHeader::new(FrameKind::Close)));
            }
        }
        let nap = Backoff::DEFAULT.max_sleep;
        let unflushed = self.progress_until(deadline, nap, State::unflushed_peers);
        // The goodbyes went out: the local peers this rank never sent to take this mark for
        // theirs (see `transport::shm::link`).
        if let Some(inbox) = &sh.io.inbox {
            inbox.mark_finalized();
        }
        {
            let mut st = lock(&sh.state);
            for p in st.open_peers() {
                st.links.shutdown(p);
            }
        }
        let linger = deadline.min(Instant::now() + LINGER);
        self.progress_until(linger, LINGER_NAP, State::lingering_peers);
        unflushed
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Both threads are told first and wind down together: on a loaded host every thread
        // that must run before this one goes on costs a turn of the scheduler.
        if let Some(w) = &self.watcher {
            w.tell_stop();
        }
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.idle_cv.notify_all();
        // Out of `epoll_wait` too, rather than at the end of its timeout.
        self.shared.io.wake_all();
        drop(self.watcher.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Stops the plug-in's threads and finalizes it (outside the lock: it waits for them).
        let plugin = lock(&self.shared.state).plugin.take();
        drop(plugin);
        // Stops dialing and accepting (joins the threads of handshakes in flight).
        if let Some(mesh) = &self.shared.mesh {
            mesh.stop();
        }
        let mut st = lock(&self.shared.state);
        st.links.clear();
        st.peers.clear();
    }
}

impl State {
    /// The engine is about to need `peer` (an operation with it was posted, or a frame is
    /// due): its links made on demand start (see [`Link::want`]), and so does its channel
    /// through the plug-in.
    #[inline]
    fn want(&mut self, peer: usize) {
        self.links.want(peer);
        if self.plugin.as_ref().is_some_and(|c| !c.is_open(peer)) {
            self.want_plugin(peer);
        }
    }

    /// Opens the plug-in channel of `peer` unless it is open (the pair's first use, on
    /// either side): its link then carries the peer's traffic. The pair's TCP connection is
    /// made too: the peer opens its channel of this rank when that comes up, if this rank
    /// used the pair first.
    #[cold]
    fn want_plugin(&mut self, peer: usize) {
        let Some(plugin) = self.plugin.as_mut() else {
            return;
        };
        if plugin.is_open(peer) || self.peers.get(peer).and_then(Option::as_ref).is_none() {
            return;
        }
        let fallback = plugin.fallback();
        let opened = plugin.open(peer);
        self.links.want(peer);
        let chan = match opened {
            Ok(chan) => chan,
            Err(why) => return self.fail_peer(peer, why),
        };
        // The peer's TCP link stands behind the plug-in: both share where the peer's frames
        // stand (`Handoff`).
        let handoff = match self.links.tcp_mut(peer) {
            Some(tcp) if fallback => {
                let h = Arc::new(Handoff::default());
                tcp.back(Arc::clone(&h));
                Some(h)
            }
            _ => None,
        };
        let link = PluginLink::new(chan, &self.io, handoff);
        self.links.add(peer, AnyLink::Plugin(link));
    }

    /// Hands eager `frame` (header `hdr`) to the link [`Links::route`] picks for `peer` when
    /// that link sends it at once ([`Link::send_inline`]); whether it did (then nothing is
    /// queued: the frame is on its way). Not while a transport plug-in is configured, which
    /// may claim every frame ([`State::queue`]).
    fn send_at_once(&mut self, peer: usize, hdr: &FrameHeader, frame: &OutFrame) -> bool {
        if self.plugin.is_some() || frame.direct.is_some() {
            return false;
        }
        let Some(l) = self.links.route(peer, frame.kind) else {
            return false;
        };
        let payload = requests::frame_payload(frame, &self.ops);
        self.links
            .get_mut(peer, l)
            .and_then(|link| link.send_inline(hdr, payload))
            .is_some()
    }

    /// Sends a frame to `peer` on the link [`Links::route`] picks for it, and writes what
    /// the link takes now.
    #[inline]
    fn queue(&mut self, peer: usize, frame: OutFrame) {
        if self
            .peers
            .get(peer)
            .and_then(Option::as_ref)
            .is_none_or(|p| p.lost.is_some())
        {
            return;
        }
        if self.plugin.as_ref().is_some_and(|c| !c.is_open(peer)) {
            // Every frame goes through the plug-in (a wake-up over TCP), whichever call made
            // it: the pair is used from now on.
            self.want_plugin(peer);
        }
        let Some(l) = self.links.route(peer, frame.kind) else {
            return;
        };
        if let Some(link) = self.links.get_mut(peer, l) {
            if link.push(frame) {
                self.flush_link(peer, l);
            }
        }
    }
}
