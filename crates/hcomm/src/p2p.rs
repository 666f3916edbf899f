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
//! operation completes, is cancelled, or fails with its peer; the safe layer above (the
//! communicator and [`Request`](crate::Request)) keeps the buffer alive and borrowed until
//! then.

use std::collections::VecDeque;

// Small integer keys, hashed on every message: Fx is several times faster than SipHash and
// the keys come from this process, not from peers.
use rustc_hash::{FxHashMap as HashMap, FxHashSet};
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::buffer::spare_capacity;
use rustix::event::{epoll, eventfd, EventfdFlags, Timespec};

mod plugin;
mod watch;

use crate::error::{Error, Result};
use crate::observe::stall::StallWatch;
use crate::sync::lock;
use crate::transport::plugin::Lease;
use crate::transport::shm::cma;
use crate::transport::shm::link::{Doorbell, Inbox, PeerInbox, ShmLink, Watch};
use crate::transport::wire::{
    FrameHeader, FrameKind, FAST_PAYLOAD, FLAG_CAN_PULL, FLAG_COMM_ABORT, FLAG_DISCARD,
    FLAG_MISMATCH, FLAG_PULLED, HEADER_LEN,
};

/// Identifies an operation inside the engine.
pub(crate) type OpId = u64;

/// Bytes buffered per stream for small frames; larger payloads are read in place.
const RX_BUF: usize = 64 * 1024;
/// Read and write rounds per stream per event, so one busy peer cannot starve the others.
const MAX_ROUNDS: usize = 64;
/// epoll token of the wake-up eventfd.
const WAKE_TOKEN: u64 = u64::MAX;
/// Claims an unexpected message whose data is to be dropped (no operation has this id).
const DISCARDED: OpId = 0;
/// While spinning, every this many rounds the waiter asks epoll instead of reading the
/// awaited peers' sockets directly.
const DIRECT_READS: u32 = 8;
/// Direct reads only for waits on this many peers or fewer.
const MAX_DIRECT_PEERS: usize = 4;
/// Recent calls remembered for mismatch detection.
const CALL_MEMORY: usize = 4096;
/// How long a finalizing rank waits for its peers to close their side of the links.
const LINGER: Duration = Duration::from_secs(1);
/// Longest sleep between checks of a waiter's own state.
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// A spinning waiter reads the clock once in this many rounds.
const CLOCK_ROUNDS: u32 = 16;
/// Polls of a local peer's next frame before a receive's wait takes the engine's lock.
const WATCH_POLLS: u32 = 4096;
/// Of those, the first ones poll without pausing (a pause takes about as long as a cache
/// line takes to arrive).
const EAGER_POLLS: u32 = 256;
/// A waiter with only shared-memory peers asks epoll once in this many rounds.
const SHM_POLLS_PER_EPOLL: u32 = 64;
/// After spinning, a waiter with shared-memory peers yields the CPU this many times before
/// it sleeps.
const SHM_YIELDS: u32 = 64;
/// Messages read from one ring per progress pass, so one busy peer cannot starve the others.
const SHM_ROUNDS: usize = 64;

/// How many messages took each protocol, for tests, logs and the profiler.
#[derive(Debug, Default)]
pub(crate) struct ProtocolCounts {
    /// Inline through a shared-memory ring.
    pub shm_eager: AtomicU64,
    /// Pulled by the receiver with cross-memory attach (one copy).
    pub shm_pull: AtomicU64,
    /// Pushed by the sender in chunks through the ring.
    pub shm_push: AtomicU64,
    /// Eager over TCP.
    pub tcp_eager: AtomicU64,
    /// Rendezvous over TCP.
    pub tcp_rendezvous: AtomicU64,
    /// Eager through a transport plug-in.
    pub plugin_eager: AtomicU64,
    /// Rendezvous through a transport plug-in.
    pub plugin_rendezvous: AtomicU64,
    /// Sleeps of waiters on their shared-memory doorbell.
    pub naps: AtomicU64,
    /// Of those, sleeps that lasted their whole time, woken by nobody.
    pub full_naps: AtomicU64,
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
    /// Eager messages over TCP.
    pub tcp_eager: u64,
    /// Rendezvous messages over TCP.
    pub tcp_rendezvous: u64,
    /// Eager messages through a transport plug-in.
    pub plugin_eager: u64,
    /// Rendezvous messages through a transport plug-in.
    pub plugin_rendezvous: u64,
    /// Times a waiter slept on its shared-memory doorbell.
    pub naps: u64,
    /// Of those, sleeps that lasted their whole time (at most 100 ms), woken by nobody:
    /// only a peer that stays silent that long causes them, or a lost wake-up.
    pub full_naps: u64,
}

impl ProtocolCounts {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ProtocolStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ProtocolStats {
            shm_eager: get(&self.shm_eager),
            shm_pull: get(&self.shm_pull),
            shm_push: get(&self.shm_push),
            tcp_eager: get(&self.tcp_eager),
            tcp_rendezvous: get(&self.tcp_rendezvous),
            plugin_eager: get(&self.plugin_eager),
            plugin_rendezvous: get(&self.plugin_rendezvous),
            naps: get(&self.naps),
            full_naps: get(&self.full_naps),
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
    /// Describes an operation signature for mismatch messages.
    pub describe: fn([u64; 2]) -> String,
    /// `HCOMM_TIMEOUT`: sets the heartbeats of the watcher (see `p2p/watch.rs`).
    pub timeout: Duration,
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
    /// Rank of the peer in the communicator (for messages).
    pub comm_rank: usize,
    /// Message tag.
    pub tag: u32,
    /// Signature of the operation (zero for plain point-to-point): a receive only matches a
    /// message with the same signature; any other is a mismatch.
    pub sig: [u64; 2],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct MatchKey {
    comm: u64,
    peer: usize,
    tag: u32,
}

/// A user buffer, valid while its operation is live (see the module docs).
#[derive(Debug, Clone, Copy)]
struct BufPtr(*mut u8);

// SAFETY: the pointer is only dereferenced under the engine lock while the operation that owns
// it is live, and the API layer keeps the buffer alive and unaliased for exactly that time.
unsafe impl Send for BufPtr {}

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
    /// Recv: length of the matched message.
    msg_len: usize,
    /// Send: frames not yet fully written. Recv (rendezvous): bytes not yet received.
    remaining: usize,
    asynchronous: bool,
    /// Buffer of a nonblocking operation whose request was dropped before completion: the
    /// engine finishes the operation and frees it.
    detached: Option<Vec<u8>>,
    result: Option<Result<usize>>,
}

impl Op {
    fn describe(&self) -> String {
        let t = &self.target;
        match self.kind {
            OpKind::Send => format!(
                "send of {} bytes to rank {} (tag {})",
                self.cap, t.comm_rank, t.tag
            ),
            OpKind::Recv => format!(
                "recv from rank {} (tag {}, buffer {} bytes)",
                t.comm_rank, t.tag, self.cap
            ),
        }
    }
}

#[derive(Debug)]
enum UnexpectedKind {
    Eager {
        data: Vec<u8>,
        complete: bool,
    },
    Rts {
        msg_id: u64,
        len: usize,
        /// Sender's buffer address, when it may be pulled (shared memory).
        pull: Option<u64>,
    },
}

#[derive(Debug)]
struct Unexpected {
    /// World rank of the sender.
    peer: usize,
    /// Signature the sender gave the message.
    sig: [u64; 2],
    kind: UnexpectedKind,
    /// A receive matched this eager message before all of it arrived.
    claimed_by: Option<OpId>,
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
enum RxState {
    Header,
    Payload {
        hdr: FrameHeader,
        dest: Dest,
        done: usize,
    },
}

#[derive(Debug)]
struct OutFrame {
    hdr: [u8; HEADER_LEN],
    hdr_done: usize,
    /// Payload: `len` bytes of `op`'s buffer at `off`.
    op: Option<OpId>,
    off: usize,
    len: usize,
    done: usize,
    /// The payload itself, for a frame whose operation was abandoned half-written.
    owned: Option<Vec<u8>>,
}

impl OutFrame {
    fn control(hdr: FrameHeader) -> OutFrame {
        OutFrame {
            hdr: hdr.encode(),
            hdr_done: 0,
            op: None,
            off: 0,
            len: 0,
            done: 0,
            owned: None,
        }
    }
}

#[derive(Debug)]
struct Stream {
    sock: TcpStream,
    out: VecDeque<OutFrame>,
    want_out: bool,
    rx_buf: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    rx: RxState,
    /// The peer closed its sending side of this stream.
    eof: bool,
}

/// The shared-memory side of a local peer.
#[derive(Debug)]
struct ShmPeer {
    link: ShmLink,
    /// Frames waiting for room in the ring, in order.
    out: VecDeque<OutFrame>,
    /// Frames written to the peer, through the fast box or the ring: the number of the next
    /// one (a ring message carries its number as metadata, a fast box message its number
    /// plus one as stamp).
    out_seq: u64,
    /// Frames read from the peer: the number of the next one.
    in_seq: u64,
}

#[derive(Debug)]
struct Peer {
    streams: Vec<Stream>,
    /// Shared memory, for a peer on this host: it then carries every frame but `Close` and
    /// `Wake`, which take stream 0 (so that a `Close` and the connection's end are seen in
    /// order).
    shm: Option<ShmPeer>,
    /// The transport plug-in, when the world has one: it then carries every frame (the TCP
    /// connection only tells whether the peer is still there).
    plugin: Option<plugin::PluginPeer>,
    next_msg_id: u64,
    next_data_stream: usize,
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
    peers: Vec<Option<Peer>>,
    /// World ranks of the peers reached through shared memory.
    shm_peers: Vec<usize>,
    /// World ranks of the peers reached through the transport plug-in.
    plugin_peers: Vec<usize>,
    counts: Arc<ProtocolCounts>,
    ops: HashMap<OpId, Op>,
    next_op: OpId,
    posted: HashMap<MatchKey, VecDeque<OpId>>,
    unexpected: HashMap<MatchKey, VecDeque<u64>>,
    umsgs: HashMap<u64, Unexpected>,
    next_umsg: u64,
    /// Matched rendezvous receives by (peer, sender's message id).
    rndv_recv: HashMap<(usize, u64), OpId>,
    /// Sends waiting for their CTS by (peer, message id).
    rndv_send: HashMap<(usize, u64), OpId>,
    /// Abandoned rendezvous receives whose data still arrives: bytes still due.
    discarding: HashMap<(usize, u64), u64>,
    /// Abandoned rendezvous sends whose CTS may still arrive.
    abandoned_sends: FxHashSet<(usize, u64)>,
    /// Operations completed since the last look (to wake other waiters).
    completions: usize,
    /// Operations `(comm, tag)` a peer abandoned.
    aborted: HashMap<(u64, u32), Abandoned>,
    /// The world rank this rank last learned was lost (found itself, or named by a peer's
    /// notice): named in the notices of calls abandoned over a lost peer.
    last_lost: Option<usize>,
    /// Signatures of this rank's recent calls by `(comm, tag)`, oldest first in `call_order`.
    calls: HashMap<(u64, u32), [u64; 2]>,
    call_order: VecDeque<(u64, u32)>,
    /// A mismatch found after this rank's part of a call had finished: reported by the next
    /// call on that communicator.
    late: HashMap<u64, Error>,
    /// Whether `late` holds anything, for a look without the lock.
    late_news: Arc<AtomicBool>,
    /// A failing peer's ring is being read to its end.
    draining: bool,
    /// The operations whose frames one `flush_shm` wrote (kept to reuse its allocation).
    sent: Vec<OpId>,
    /// Communicators aborted (by this rank or a peer), with the error of their operations.
    comm_aborted: HashMap<u64, Error>,
}

struct Shared {
    state: Mutex<State>,
    counts: Arc<ProtocolCounts>,
    /// `State::late_news`.
    late_news: Arc<AtomicBool>,
    io: Arc<Io>,
    idle: Mutex<()>,
    idle_cv: Condvar,
    shutdown: AtomicBool,
    /// The engine is closing: the watcher sends no more heartbeats and judges nobody.
    closing: AtomicBool,
    spin: Duration,
}

/// The progress engine of one world.
pub(crate) struct Engine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The transport plug-in's links, when the world has one.
    plugin: Option<plugin::Links>,
    /// The thread that notices dead and hung peers.
    watcher: Option<watch::Watcher>,
}

/// How a peer abandoned an operation: its world rank, its signature, whether over a
/// mismatch, and the world rank it had lost if that was why.
type Abandoned = (usize, [u64; 2], bool, Option<usize>);

/// Tells the launcher on its pipe (`HCOMM_RUN_FD`: descriptor and inode) that world rank
/// `rank` lost world rank `peer`: one line `lost RANK PEER`, in one write (atomic on a
/// pipe), never blocking (the launcher made the pipe nonblocking). Nothing is written unless
/// the descriptor is that pipe; news that cannot be written is dropped (it only helps the
/// launcher name the rank that failed first).
fn tell_launcher((fd, ino): (i32, u64), rank: usize, peer: usize) {
    // SAFETY: the launcher's pipe stays open for the life of the process (inherited, and
    // nothing in hcomm closes it); a stale variable naming a closed descriptor only makes
    // `fstat` fail, and a foreign one fails the checks below, so nothing is written to it.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let Ok(st) = rustix::fs::fstat(fd) else {
        return;
    };
    let fifo = rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo;
    if !fifo || st.st_ino != ino {
        return;
    }
    let _ = rustix::io::write(fd, format!("lost {rank} {peer}\n").as_bytes());
}

/// Polls `watch` for a while, without the engine's lock and without the clock; returns whether
/// it fired.
fn spin_on(watch: &Watch<'_>) -> bool {
    for i in 0..WATCH_POLLS {
        if i >= EAGER_POLLS {
            std::hint::spin_loop();
        }
        if watch.ready() {
            return true;
        }
    }
    false
}

fn token(peer: usize, stream: usize) -> u64 {
    ((peer as u64) << 16) | stream as u64
}

fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    }
}

fn poll(io: &Io, events: &mut Vec<epoll::Event>, sleep: Duration) -> Result<()> {
    events.clear();
    match epoll::wait(&io.epoll, spare_capacity(events), Some(&timespec(sleep))) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(Error::Internal(format!("epoll_wait failed: {e}"))),
    }
}

impl Engine {
    /// Takes over the established links (`links[peer]` = its streams, empty for self).
    /// `shm`: the shared-memory links of the local peers, which then carry their traffic.
    /// `plugin`: a transport plug-in, initialized here, which then carries all traffic.
    pub(crate) fn new(
        links: Vec<Vec<TcpStream>>,
        shm: Option<ShmSetup>,
        plugin: Option<Lease>,
        cfg: EngineConfig,
    ) -> Result<Engine> {
        let sys = |what: &str, e: rustix::io::Errno| Error::Init(format!("{what}: {e}"));
        let epoll =
            epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| sys("epoll_create", e))?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| sys("eventfd", e))?;
        epoll::add(
            &epoll,
            &wake,
            epoll::EventData::new_u64(WAKE_TOKEN),
            epoll::EventFlags::IN,
        )
        .map_err(|e| sys("epoll_ctl", e))?;
        let mut peers = Vec::with_capacity(links.len());
        for (p, socks) in links.into_iter().enumerate() {
            if socks.is_empty() {
                peers.push(None);
                continue;
            }
            let mut streams = Vec::with_capacity(socks.len());
            for (s, sock) in socks.into_iter().enumerate() {
                sock.set_nonblocking(true)
                    .map_err(|e| Error::transport("configuring a link", e))?;
                epoll::add(
                    &epoll,
                    &sock,
                    epoll::EventData::new_u64(token(p, s)),
                    epoll::EventFlags::IN,
                )
                .map_err(|e| sys("epoll_ctl", e))?;
                streams.push(Stream {
                    sock,
                    out: VecDeque::new(),
                    want_out: false,
                    rx_buf: vec![0u8; RX_BUF].into_boxed_slice(),
                    rx_start: 0,
                    rx_end: 0,
                    rx: RxState::Header,
                    eof: false,
                });
            }
            peers.push(Some(Peer {
                streams,
                shm: None,
                plugin: None,
                next_msg_id: 0,
                next_data_stream: 0,
                closed: false,
                lost: None,
                heard: 0,
            }));
        }
        let mut shm_peers = Vec::new();
        let mut peer_inboxes = HashMap::default();
        let inbox = match shm {
            Some(ShmSetup { inbox, links }) => {
                for (p, link) in links {
                    peer_inboxes.insert(p, (link.peer_inbox(), link.pid, link.cma));
                    let peer = peers.get_mut(p).and_then(Option::as_mut).ok_or_else(|| {
                        Error::Internal(format!("shared-memory link to world rank {p} has no peer"))
                    })?;
                    peer.shm = Some(ShmPeer {
                        link,
                        out: VecDeque::new(),
                        out_seq: 0,
                        in_seq: 0,
                    });
                    shm_peers.push(p);
                }
                Some(inbox)
            }
            None => None,
        };
        let spin = cfg.spin;
        let timing = watch::Timing::for_timeout(cfg.timeout);
        // Duplicates of the local peers' stream 0, whose end the watcher waits for.
        let mut ends = Vec::with_capacity(shm_peers.len());
        for &p in &shm_peers {
            if let Some(s) = peers[p].as_ref().and_then(|peer| peer.streams.first()) {
                let dup = s
                    .sock
                    .try_clone()
                    .map_err(|e| Error::transport("duplicating a link for the watcher", e))?;
                ends.push((p, dup));
            }
        }
        let counts = Arc::new(ProtocolCounts::default());
        let late_news = Arc::new(AtomicBool::new(false));
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
        });
        let size = peers.len();
        let mut plugin_peers = Vec::new();
        let plugin = match plugin {
            Some(lease) => {
                let links = plugin::Links::start(lease, cfg.rank, size, &io)?;
                for link in links.links() {
                    let p = link.peer();
                    let peer = peers.get_mut(p).and_then(Option::as_mut).ok_or_else(|| {
                        Error::Internal(format!("plug-in link to world rank {p} has no peer"))
                    })?;
                    peer.plugin = Some(plugin::PluginPeer::new(Arc::clone(link)));
                    plugin_peers.push(p);
                }
                Some(links)
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                cfg,
                io: Arc::clone(&io),
                peers,
                shm_peers,
                plugin_peers,
                counts: Arc::clone(&counts),
                ops: HashMap::default(),
                next_op: 1,
                posted: HashMap::default(),
                unexpected: HashMap::default(),
                umsgs: HashMap::default(),
                next_umsg: 1,
                rndv_recv: HashMap::default(),
                rndv_send: HashMap::default(),
                discarding: HashMap::default(),
                abandoned_sends: FxHashSet::default(),
                completions: 0,
                aborted: HashMap::default(),
                last_lost: None,
                calls: HashMap::default(),
                call_order: VecDeque::new(),
                late: HashMap::default(),
                late_news: Arc::clone(&late_news),
                sent: Vec::new(),
                draining: false,
                comm_aborted: HashMap::default(),
            }),
            io,
            counts,
            late_news,
            idle: Mutex::new(()),
            idle_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            spin,
        });
        // First: should the progress thread fail to start, dropping the watcher stops it.
        let watcher = watch::Watcher::start(Arc::clone(&shared), ends, timing)?;
        let bg = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("hcomm-progress".into())
            .spawn(move || progress_thread(&bg))
            .map_err(|e| Error::Init(format!("cannot start the progress thread: {e}")))?;
        Ok(Engine {
            shared,
            thread: Some(thread),
            plugin,
            watcher: Some(watcher),
        })
    }

    /// How many messages took each protocol so far.
    pub(crate) fn protocol_stats(&self) -> ProtocolStats {
        self.shared.counts.snapshot()
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

    /// An error about call `(comm, tag)` that arrived since it began (a peer's abort, or a
    /// message of this call with another signature), for calls that wait outside the engine.
    pub(crate) fn call_failed(&self, comm: u64, tag: u32) -> Option<Error> {
        let mut st = lock(&self.shared.state);
        if let Some(e) = st.aborted_comm(comm) {
            return Some(e);
        }
        if let Err(e) = st.late_error(comm) {
            return Some(e);
        }
        st.aborted
            .get(&(comm, tag))
            .copied()
            .map(|(peer, sig, mismatch, lost)| {
                let t = Target {
                    comm,
                    peer,
                    comm_rank: peer,
                    tag,
                    sig: st.calls.get(&(comm, tag)).copied().unwrap_or_default(),
                };
                st.abandoned(&t, peer, sig, mismatch, lost)
            })
    }

    /// Fails if communicator `comm` was aborted, by this rank or a peer (as far as this rank
    /// has read), before a call on it does anything else.
    pub(crate) fn check_aborted(&self, comm: u64) -> Result<()> {
        if !self.shared.io.any_aborted.load(Ordering::SeqCst) {
            return Ok(());
        }
        match lock(&self.shared.state).aborted_comm(comm) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Progresses once without blocking, then tells whether world rank `peer` is still
    /// reachable (for waits that do not go through the engine).
    pub(crate) fn check_peer(&self, peer: usize) -> Result<()> {
        let sh = &*self.shared;
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        poll(&sh.io, &mut events, Duration::ZERO)?;
        let mut st = lock(&sh.state);
        st.handle(&events, false);
        match st.peers.get(peer).and_then(Option::as_ref) {
            Some(p) => match &p.lost {
                Some(why) => Err(Error::PeerLost(why.clone())),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// Posts a send of `len` bytes at `buf`.
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid for reads until the operation is removed by
    /// [`Engine::wait`] or [`Engine::test`] returning its result, or handed over by
    /// [`Engine::detach`].
    pub(crate) unsafe fn post_send(
        &self,
        t: Target,
        buf: *const u8,
        len: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        let mut st = lock(&self.shared.state);
        let id = st.post_send(t, BufPtr(buf.cast_mut()), len, asynchronous)?;
        self.note_async(&mut st, id, asynchronous);
        Ok(id)
    }

    /// A blocking send or receive: posts it, looks at the links once under the same lock,
    /// and waits only if it did not complete there (a small send, or a receive whose
    /// message is already in, costs one lock and no clock read).
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid for reads (a send) or for writes and otherwise unused
    /// (a receive) until this returns.
    pub(crate) unsafe fn blocking(
        &self,
        kind: Blocking,
        t: Target,
        buf: *mut u8,
        len: usize,
        timeout: Duration,
    ) -> Result<usize> {
        let sh = &*self.shared;
        if kind == Blocking::Recv {
            // A small message from a local peer: taken straight from its fast box when it is
            // there, or once it comes within a short watch.
            let watch = {
                let mut st = lock(&sh.state);
                // SAFETY: forwarded from the caller.
                if let Some(n) = unsafe { st.recv_fast(&t, buf, len) } {
                    return Ok(n);
                }
                match sh.io.inbox.as_ref() {
                    Some(inbox) if !sh.spin.is_zero() && len <= st.cfg.shm_eager_limit => {
                        st.recv_watch(inbox, &t)
                    }
                    _ => None,
                }
            };
            if watch.is_some_and(|w| spin_on(&w)) {
                // SAFETY: forwarded from the caller.
                if let Some(n) = unsafe { lock(&sh.state).recv_fast(&t, buf, len) } {
                    return Ok(n);
                }
            }
        }
        let id = {
            let mut st = lock(&sh.state);
            if kind == Blocking::Send && len <= FAST_PAYLOAD {
                // SAFETY: the caller's promise: `buf` holds `len` readable bytes.
                let data = unsafe { std::slice::from_raw_parts(buf, len) };
                if st.send_fast(&t, data)? {
                    return Ok(len);
                }
            }
            let id = match kind {
                Blocking::Send => st.post_send(t, BufPtr(buf), len, false)?,
                Blocking::Recv => st.post_recv(t, BufPtr(buf), len, false)?,
            };
            if let Some(r) = st.take(id) {
                return r;
            }
            st.handle(&[], false);
            if let Some(r) = st.take(id) {
                return r;
            }
            id
        };
        self.wait(id, Deadline::After(timeout))
    }

    /// Posts a receive into `cap` bytes at `buf`.
    ///
    /// # Safety
    /// `buf..buf+cap` must stay valid for writes, and not be accessed otherwise, until the
    /// operation is removed by [`Engine::wait`] or [`Engine::test`], or handed over by
    /// [`Engine::detach`].
    pub(crate) unsafe fn post_recv(
        &self,
        t: Target,
        buf: *mut u8,
        cap: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        let mut st = lock(&self.shared.state);
        let id = st.post_recv(t, BufPtr(buf), cap, asynchronous)?;
        self.note_async(&mut st, id, asynchronous);
        Ok(id)
    }

    /// Counts a nonblocking operation the background thread must progress (one that did
    /// not complete when it was posted).
    fn note_async(&self, st: &mut State, id: OpId, asynchronous: bool) {
        let Some(op) = st.ops.get_mut(&id) else {
            return;
        };
        op.asynchronous = asynchronous && op.result.is_none();
        if op.asynchronous && self.shared.io.pending_async.fetch_add(1, Ordering::SeqCst) == 0 {
            self.shared.idle_cv.notify_one();
        }
    }

    /// Waits until `id` completes or `deadline` passes, and removes it.
    pub(crate) fn wait(&self, id: OpId, deadline: impl Into<Deadline>) -> Result<usize> {
        match self.wait_any(&[id], deadline) {
            Ok((_, r)) => r,
            Err(Error::Timeout(_)) => Err(lock(&self.shared.state).time_out(id)),
            Err(e) => {
                self.cancel(&[id]);
                Err(e)
            }
        }
    }

    /// A thread starts driving progress: the background thread steps aside (it is woken
    /// out of `epoll_wait` if it is in there, so the two do not compete for events).
    fn enter_wait(&self) {
        let io = &self.shared.io;
        if io.waiters.fetch_add(1, Ordering::SeqCst) == 0 && io.polling.load(Ordering::SeqCst) {
            io.wake_all();
        }
    }

    /// A thread stops driving progress: the background thread resumes if needed.
    fn leave_wait(&self) {
        let io = &self.shared.io;
        if io.waiters.fetch_sub(1, Ordering::SeqCst) == 1
            && io.pending_async.load(Ordering::SeqCst) > 0
        {
            self.shared.idle_cv.notify_one();
        }
    }

    /// Waits until one of `ids` completes or `deadline` passes; removes it and returns its
    /// index in `ids` with its result. On timeout the error names the first of `ids`, all of
    /// which stay posted (cancel them with [`Engine::cancel`]).
    pub(crate) fn wait_any(
        &self,
        ids: &[OpId],
        deadline: impl Into<Deadline>,
    ) -> Result<(usize, Result<usize>)> {
        self.enter_wait();
        let result = self.wait_any_inner(ids, deadline.into());
        self.leave_wait();
        result
    }

    fn wait_any_inner(&self, ids: &[OpId], deadline: Deadline) -> Result<(usize, Result<usize>)> {
        let sh = &*self.shared;
        // A look before reading the clock: a small send is usually complete already.
        let look = || {
            let mut st = lock(&sh.state);
            st.handle(&[], true);
            for (i, &id) in ids.iter().enumerate() {
                if let Some(r) = st.take(id) {
                    return Err((i, r));
                }
            }
            Ok(match (sh.io.inbox.as_ref(), ids) {
                (Some(inbox), &[id]) if !sh.spin.is_zero() => st.watch(inbox, id),
                _ => None,
            })
        };
        // A receive from a local peer: watch for its next frame without the lock and without
        // the clock for a while (a small message then lands a cache-line transfer after it
        // was written), then look again; the loop below does the rest.
        match look() {
            Err(done) => return Ok(done),
            Ok(Some(watch)) => {
                if spin_on(&watch) {
                    if let Err(done) = look().map(drop) {
                        return Ok(done);
                    }
                }
            }
            Ok(None) => {}
        }
        let deadline = deadline.resolve();
        let mut now = Instant::now();
        let mut spin_until = now + sh.spin;
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        // Whether `events` came from epoll (rather than being direct reads of awaited peers).
        let mut polled = false;
        let mut rounds: u32 = 0;
        let mut yields = 0;
        let mut hot: Vec<usize> = Vec::new();
        let mut all_shm;
        let mut stall = StallWatch::new(now);
        let mut blocked = false;
        loop {
            {
                let mut st = lock(&sh.state);
                let moved = st.handle(&events, true);
                // Keep polling while data moves: sleeping between the bursts of a large
                // transfer costs a wake-up each time.
                // Reading the clock costs as much as a look at the rings: while spinning, read
                // it every few rounds only.
                if moved || polled || rounds % CLOCK_ROUNDS == 0 {
                    now = Instant::now();
                }
                if moved || (polled && !events.is_empty()) {
                    spin_until = now + sh.spin;
                    yields = 0;
                }
                for (i, &id) in ids.iter().enumerate() {
                    if let Some(r) = st.take(id) {
                        return Ok((i, r));
                    }
                }
                if now >= deadline {
                    let what = ids
                        .first()
                        .and_then(|id| st.ops.get(id))
                        .map(Op::describe)
                        .unwrap_or_default();
                    return Err(Error::Timeout(format!(
                        "{what} did not complete within HCOMM_TIMEOUT; the peer may be stuck, slow, \
                         or calling something else"
                    )));
                }
                stall.check(now, || st.awaited(ids));
                if !blocked && now >= spin_until {
                    blocked = true;
                    if let Some(op) = ids.first().and_then(|id| st.ops.get(id)) {
                        crate::observe::blocked_on(op.target.comm_rank);
                    }
                }
                all_shm = st.all_shm();
                // Only small receives: large transfers use every stream and need writes
                // progressed, which epoll tracks.
                hot.clear();
                let small = |op: &Op| op.kind == OpKind::Recv && op.cap <= st.cfg.eager_limit;
                if !all_shm && ids.iter().filter_map(|id| st.ops.get(id)).all(small) {
                    for op in ids.iter().filter_map(|id| st.ops.get(id)) {
                        let p = op.target.peer;
                        if !hot.contains(&p) && st.readable(p) {
                            hot.push(p);
                        }
                    }
                }
            }
            events.clear();
            polled = false;
            if now < spin_until {
                rounds = rounds.wrapping_add(1);
                // Only shared memory to watch: the sockets (which carry nothing but the
                // peers' goodbyes) are looked at now and then.
                if all_shm && rounds % SHM_POLLS_PER_EPOLL != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                // Between epoll checks, read the first stream of the awaited peers directly:
                // a small message that arrives is then read without a readiness call first.
                if rounds % DIRECT_READS != 0 && !hot.is_empty() && hot.len() <= MAX_DIRECT_PEERS {
                    let direct = hot.iter().map(|&p| epoll::Event {
                        flags: epoll::EventFlags::IN,
                        data: epoll::EventData::new_u64(token(p, 0)),
                    });
                    events.extend(direct);
                    continue;
                }
                poll(&sh.io, &mut events, Duration::ZERO)?;
            } else if yields < SHM_YIELDS && sh.io.inbox.is_some() {
                // More ranks than cores: let the rank being waited for run.
                yields += 1;
                std::thread::yield_now();
                if yields % SHM_POLLS_PER_EPOLL == 0 {
                    poll(&sh.io, &mut events, Duration::ZERO)?;
                }
                continue;
            } else {
                let sleep = (deadline - now).min(MAX_SLEEP);
                self.sleep(all_shm, &mut events, sleep)?;
            }
            polled = true;
        }
    }

    /// Sleeps until something may have happened: on the futex of this rank's doorbell when
    /// only shared-memory peers are left (then the sockets are looked at once on waking),
    /// otherwise in `epoll_wait`, flagged on the doorbell (if any) so that local peers send a
    /// wake-up frame.
    fn sleep(&self, all_shm: bool, events: &mut Vec<epoll::Event>, sleep: Duration) -> Result<()> {
        let sh = &*self.shared;
        let Some(bell) = sh.io.bell() else {
            return poll(&sh.io, events, sleep);
        };
        if all_shm {
            // The sockets first, and no sleep once the watcher saw a connection end since:
            // the peer's end may have come after the sockets were last looked at.
            let alarms = sh.io.alarms.load(Ordering::SeqCst);
            poll(&sh.io, events, Duration::ZERO)?;
            if !events.is_empty() {
                return Ok(());
            }
            let mut ready =
                || sh.io.alarms.load(Ordering::SeqCst) != alarms || lock(&sh.state).shm_ready();
            let start = Instant::now();
            if !bell.sleep_unless(&mut ready, sleep) {
                ProtocolCounts::bump(&sh.counts.naps);
                if start.elapsed() >= sleep {
                    ProtocolCounts::bump(&sh.counts.full_naps);
                }
            }
            return poll(&sh.io, events, Duration::ZERO);
        }
        bell.enter_epoll();
        let result = if lock(&sh.state).shm_ready() {
            poll(&sh.io, events, Duration::ZERO)
        } else {
            poll(&sh.io, events, sleep)
        };
        bell.leave_epoll();
        result
    }

    /// Removes operations that will not be waited for, so that no buffer of theirs is
    /// referenced afterwards (see `State::disentangle`).
    pub(crate) fn cancel(&self, ids: &[OpId]) {
        let mut st = lock(&self.shared.state);
        for &id in ids {
            if st.take(id).is_none() && st.ops.contains_key(&id) {
                let _ = st.time_out(id);
            }
        }
    }

    /// The error of an earlier call on `comm` that turned out mismatched after it returned
    /// (see `State::begin_call`), reported once; without the lock when there is none.
    pub(crate) fn late_error(&self, comm: u64) -> Result<()> {
        if !self.shared.late_news.load(Ordering::Acquire) {
            return Ok(());
        }
        lock(&self.shared.state).late_error(comm)
    }

    /// Registers the start of this rank's collective call `(comm, tag)` with signature
    /// `sig` (see `State::begin_call`).
    pub(crate) fn begin_call(&self, comm: u64, tag: u32, sig: [u64; 2]) -> Result<()> {
        lock(&self.shared.state).begin_call(comm, tag, sig)
    }

    /// Tells the peers of `targets` that this rank abandoned their operation, so that they
    /// fail at once instead of waiting for it. The call is forgotten: later news about it
    /// (other peers' aborts) no longer concerns this rank.
    ///
    /// When the call failed over a lost peer (`why`), the notices name the lost rank (one of
    /// the call's, else the one this rank last learned of): the others then report the loss
    /// of that rank, the cause, rather than this rank's abandoning the call (which may itself
    /// die a moment later, as the ranks of one failing host do).
    pub(crate) fn abort(&self, targets: &[Target], why: &Error) {
        let mismatch = matches!(why, Error::Mismatch(_));
        let mut st = lock(&self.shared.state);
        if let Some(t) = targets.first() {
            st.calls.remove(&(t.comm, t.tag));
        }
        let lost = match why {
            Error::PeerLost(_) => targets
                .iter()
                .map(|t| t.peer)
                .find(|&p| {
                    st.peers
                        .get(p)
                        .and_then(Option::as_ref)
                        .is_some_and(|q| q.lost.is_some() && !q.closed)
                })
                .or(st.last_lost),
            _ => None,
        };
        let mut told: Vec<usize> = Vec::new();
        for t in targets {
            if !told.contains(&t.peer) && st.live_peer(t).is_ok() {
                told.push(t.peer);
                st.send_abort(*t, mismatch, lost);
            }
        }
    }

    /// Aborts the communicator whose frames carry the ids `comms`: every pending and later
    /// operation on them fails with `Error::Aborted`, here and on the world ranks `peers`,
    /// which are told with one abort frame each (one, so that a peer learns of all the ids
    /// at once).
    pub(crate) fn abort_comm(&self, comms: [u64; 3], peers: &[usize]) {
        {
            let mut st = lock(&self.shared.state);
            for comm in comms {
                let err = Error::Aborted(
                    "this rank aborted the communicator (Communicator::abort, hcommCommAbort)"
                        .into(),
                );
                st.abort_comm(comm, err);
            }
            for &peer in peers {
                if peer == st.cfg.rank {
                    continue;
                }
                let mut hdr = FrameHeader::new(FrameKind::Abort);
                hdr.flags = FLAG_COMM_ABORT;
                hdr.comm = comms[0];
                hdr.sig = [comms[1], comms[2]];
                st.queue(peer, 0, OutFrame::control(hdr));
            }
        }
        // Threads of this rank waiting on the communicator, in the engine or outside it.
        self.shared.io.wake_all();
    }

    /// Progresses once without blocking; returns the result of `id` if it is complete (and
    /// removes it).
    pub(crate) fn test(&self, id: OpId) -> Option<Result<usize>> {
        let sh = &*self.shared;
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        if poll(&sh.io, &mut events, Duration::ZERO).is_err() {
            events.clear();
        }
        let mut st = lock(&sh.state);
        st.handle(&events, false);
        st.take(id)
    }

    /// Hands a pending nonblocking operation's buffer to the engine, which completes the
    /// operation in the background and then frees the buffer.
    pub(crate) fn detach(&self, id: OpId, buffer: Vec<u8>) {
        let mut st = lock(&self.shared.state);
        if st.take(id).is_some() {
            return;
        }
        if let Some(op) = st.ops.get_mut(&id) {
            op.detached = Some(buffer);
            // The owner will never take it: stop counting it as pending for the owner.
            if op.asynchronous {
                op.asynchronous = false;
                self.shared.io.pending_async.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Tells every peer this rank is finishing, delivers what is still queued (until
    /// `deadline`), closes the sending side of every link and lingers briefly for the peers
    /// to close theirs, reading what they still send so that closing does not reset a link
    /// with data in it. Returns the peers whose queued data could not be delivered.
    pub(crate) fn close(&self, deadline: Instant) -> Vec<usize> {
        let sh = &*self.shared;
        sh.closing.store(true, Ordering::SeqCst);
        {
            let mut st = lock(&sh.state);
            for p in 0..st.peers.len() {
                let Some(peer) = st.peers[p].as_ref().filter(|peer| peer.lost.is_none()) else {
                    continue;
                };
                let close = OutFrame::control(FrameHeader::new(FrameKind::Close));
                // Through the plug-in, after the data; otherwise on the stream whose end
                // follows it.
                if peer.plugin.is_some() {
                    st.queue(p, 0, close);
                } else {
                    st.queue_tcp(p, 0, close);
                }
            }
        }
        let unflushed = self.progress_until(deadline, State::unflushed_peers);
        {
            let st = lock(&sh.state);
            for peer in st.peers.iter().flatten().filter(|p| p.lost.is_none()) {
                for s in &peer.streams {
                    let _ = s.sock.shutdown(Shutdown::Write);
                }
            }
        }
        let linger = deadline.min(Instant::now() + LINGER);
        self.progress_until(linger, State::open_peers);
        unflushed
    }

    /// Drives progress until `left` of the state is empty or `deadline` passes; returns what
    /// is left.
    fn progress_until(&self, deadline: Instant, left: fn(&State) -> Vec<usize>) -> Vec<usize> {
        let sh = &*self.shared;
        self.enter_wait();
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        let rest = loop {
            let rest = {
                let mut st = lock(&sh.state);
                st.handle(&events, true);
                left(&st)
            };
            let now = Instant::now();
            if rest.is_empty() || now >= deadline {
                break rest;
            }
            if poll(&sh.io, &mut events, (deadline - now).min(MAX_SLEEP)).is_err() {
                events.clear();
            }
        };
        self.leave_wait();
        rest
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        drop(self.watcher.take());
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.idle_cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Stops the plug-in's threads and finalizes it.
        drop(self.plugin.take());
        let mut st = lock(&self.shared.state);
        for peer in st.peers.iter().flatten() {
            for s in &peer.streams {
                let _ = s.sock.shutdown(Shutdown::Both);
            }
        }
        st.peers.clear();
    }
}

fn progress_thread(sh: &Shared) {
    let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
    while !sh.shutdown.load(Ordering::SeqCst) {
        // Announce polling before looking at the waiters: a thread that starts waiting
        // meanwhile sees the flag and wakes this one out of epoll_wait.
        sh.io.polling.store(true, Ordering::SeqCst);
        if sh.io.pending_async.load(Ordering::SeqCst) == 0
            || sh.io.waiters.load(Ordering::SeqCst) > 0
        {
            sh.io.polling.store(false, Ordering::SeqCst);
            // Nothing outstanding, or a waiting thread drives progress itself.
            let guard = lock(&sh.idle);
            let _ = sh.idle_cv.wait_timeout(guard, Duration::from_millis(50));
            continue;
        }
        let polled = match sh.io.bell() {
            Some(bell) => {
                bell.enter_epoll();
                let sleep = if lock(&sh.state).shm_ready() {
                    Duration::ZERO
                } else {
                    Duration::from_millis(50)
                };
                let polled = poll(&sh.io, &mut events, sleep);
                bell.leave_epoll();
                polled
            }
            None => poll(&sh.io, &mut events, Duration::from_millis(50)),
        };
        sh.io.polling.store(false, Ordering::SeqCst);
        if polled.is_ok() {
            lock(&sh.state).handle(&events, false);
        }
    }
}

/// What reading a stream ended with.
enum ReadEnd {
    /// Nothing more to read now.
    Drained,
    /// The peer closed its sending side.
    Eof,
    /// The stream failed: the reason.
    Failed(String),
}

impl State {
    fn new_op(
        &mut self,
        kind: OpKind,
        target: Target,
        buf: BufPtr,
        cap: usize,
        asynchronous: bool,
    ) -> OpId {
        let id = self.next_op;
        self.next_op += 1;
        let op = Op {
            kind,
            target,
            buf,
            cap,
            msg_len: 0,
            remaining: 0,
            asynchronous,
            detached: None,
            result: None,
        };
        self.ops.insert(id, op);
        id
    }

    fn live_peer(&self, t: &Target) -> Result<()> {
        if let Some(e) = self.aborted_comm(t.comm) {
            return Err(e);
        }
        if let Some(&(peer, sig, mismatch, lost)) = self.aborted.get(&(t.comm, t.tag)) {
            return Err(self.abandoned(t, peer, sig, mismatch, lost));
        }
        if t.peer == self.cfg.rank {
            return Ok(());
        }
        match self.peers.get(t.peer) {
            Some(Some(p)) => match &p.lost {
                None => Ok(()),
                Some(why) => Err(Error::PeerLost(why.clone())),
            },
            _ => Err(Error::Internal(format!("no link to world rank {}", t.peer))),
        }
    }

    fn post_send(
        &mut self,
        t: Target,
        buf: BufPtr,
        len: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        self.live_peer(&t)?;
        let id = self.new_op(OpKind::Send, t, buf, len, asynchronous);
        if t.peer == self.cfg.rank {
            self.send_to_self(id, t, buf, len);
            return Ok(id);
        }
        let peer = self.peers[t.peer].as_mut().expect("checked by live_peer");
        let msg_id = peer.next_msg_id;
        peer.next_msg_id += 1;
        let mut hdr = FrameHeader::new(FrameKind::Eager);
        hdr.comm = t.comm;
        hdr.tag = t.tag;
        hdr.msg_id = msg_id;
        hdr.len = len as u64;
        hdr.sig = t.sig;
        let shm = peer.shm.as_ref().map(|m| m.link.cma);
        let plugin = peer.plugin.is_some();
        let limit = match shm {
            Some(_) => self.cfg.shm_eager_limit,
            None => self.cfg.eager_limit,
        };
        let eager = len <= limit;
        let frame = if eager {
            self.ops.get_mut(&id).expect("just inserted").remaining = 1;
            OutFrame {
                op: Some(id),
                len,
                ..OutFrame::control(hdr)
            }
        } else {
            hdr.kind = FrameKind::Rts;
            if shm == Some(true) && len <= self.cfg.shm_push_threshold {
                // The receiver may pull the data straight out of this buffer.
                hdr.flags = FLAG_CAN_PULL;
                hdr.offset = buf.0 as u64;
            }
            self.rndv_send.insert((t.peer, msg_id), id);
            OutFrame::control(hdr)
        };
        // A shared-memory rendezvous is counted where its protocol is decided.
        let c = &self.counts;
        let counter = match (shm.is_some(), plugin, eager) {
            (true, _, true) => Some(&c.shm_eager),
            (true, _, false) => None,
            (false, true, true) => Some(&c.plugin_eager),
            (false, true, false) => Some(&c.plugin_rendezvous),
            (false, false, true) => Some(&c.tcp_eager),
            (false, false, false) => Some(&c.tcp_rendezvous),
        };
        counter.map(ProtocolCounts::bump);
        tracing::trace!(
            peer = t.peer,
            tag = t.tag,
            len,
            eager,
            shm = shm.is_some(),
            plugin,
            "send posted"
        );
        self.queue(t.peer, 0, frame);
        Ok(id)
    }

    /// Writes a small message straight into a local peer's fast box, without an operation,
    /// when nothing is queued before it; returns whether it did (then the send is complete:
    /// the message is in the peer's memory). An error when the peer cannot be reached.
    fn send_fast(&mut self, t: &Target, data: &[u8]) -> Result<bool> {
        self.live_peer(t)?;
        let Some(peer) = self.peers.get_mut(t.peer).and_then(Option::as_mut) else {
            return Ok(false);
        };
        let Some(m) = peer.shm.as_mut().filter(|m| m.out.is_empty()) else {
            return Ok(false);
        };
        let mut hdr = FrameHeader::new(FrameKind::Eager);
        hdr.comm = t.comm;
        hdr.tag = t.tag;
        hdr.msg_id = peer.next_msg_id;
        hdr.len = data.len() as u64;
        hdr.sig = t.sig;
        let Some(body) = hdr.encode_fast(data) else {
            return Ok(false);
        };
        if !m.link.fast_out.try_push(m.out_seq + 1, &body) {
            return Ok(false);
        }
        m.out_seq += 1;
        peer.next_msg_id += 1;
        let wake = m.link.peer_bell().ring();
        ProtocolCounts::bump(&self.counts.shm_eager);
        tracing::trace!(
            peer = t.peer,
            tag = t.tag,
            len = data.len(),
            "sent through the fast box"
        );
        if wake {
            self.queue_wake(t.peer);
        }
        Ok(true)
    }

    /// Receives the next frame of local peer `t.peer` straight into `buf` (`cap` bytes) when
    /// it is a small message in the fast box that this receive matches and nothing else
    /// could (no receive posted before it, no message held for it); returns its length.
    /// Anything else (errors included) is left to the general path.
    ///
    /// # Safety
    /// `buf..buf+cap` must be valid for writes.
    unsafe fn recv_fast(&mut self, t: &Target, buf: *mut u8, cap: usize) -> Option<usize> {
        // The fast box first: most calls (other transports, nothing arrived yet) end there
        // without a map lookup.
        let m = self.peers.get(t.peer)?.as_ref()?.shm.as_ref()?;
        let body = m.link.fast_in.peek(m.in_seq + 1)?;
        let (hdr, payload) = FrameHeader::decode_fast(&body).ok()?;
        let len = hdr.len as usize;
        if hdr.comm != t.comm || hdr.tag != t.tag || hdr.sig != t.sig || len > cap {
            return None;
        }
        let key = MatchKey {
            comm: t.comm,
            peer: t.peer,
            tag: t.tag,
        };
        if self.live_peer(t).is_err()
            || self.posted.contains_key(&key)
            || self.unexpected.contains_key(&key)
        {
            return None;
        }
        let peer = self.peers.get_mut(t.peer)?.as_mut()?;
        let m = peer.shm.as_mut()?;
        // SAFETY: the caller's promise; `len <= cap`.
        unsafe { buf.copy_from_nonoverlapping(payload.as_ptr(), len) };
        m.link.fast_in.consume();
        m.in_seq += 1;
        peer.heard = peer.heard.wrapping_add(1);
        Some(len)
    }

    /// A watch on the next frame of local peer `t.peer`, for a receive that
    /// [`State::recv_fast`] may complete once it comes.
    fn recv_watch<'a>(&self, inbox: &'a Inbox, t: &Target) -> Option<Watch<'a>> {
        let peer = self.peers.get(t.peer)?.as_ref()?;
        let m = peer.shm.as_ref().filter(|m| m.out.is_empty())?;
        peer.lost.is_none().then(|| inbox.watch(&m.link, m.in_seq))
    }

    /// A message to this rank itself is copied at once, like a buffered send.
    fn send_to_self(&mut self, id: OpId, t: Target, buf: BufPtr, len: usize) {
        let data = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: the send is live, so `buf` is valid for reads of `len` bytes (see
            // `post_send`).
            unsafe { std::slice::from_raw_parts(buf.0.cast_const(), len) }.to_vec()
        };
        let key = MatchKey {
            comm: t.comm,
            peer: t.peer,
            tag: t.tag,
        };
        let kind = UnexpectedKind::Eager {
            data,
            complete: true,
        };
        match pop_key(&mut self.posted, &key) {
            Some(rid) => {
                let uid = self.store_unexpected(key.peer, t.sig, kind);
                self.deliver_unexpected(uid, rid);
            }
            None => {
                self.push_unexpected(key, t.sig, kind);
            }
        }
        self.complete(id, Ok(len));
    }

    /// Keeps a message no receive has claimed yet; returns its id.
    fn store_unexpected(&mut self, peer: usize, sig: [u64; 2], kind: UnexpectedKind) -> u64 {
        let uid = self.next_umsg;
        self.next_umsg += 1;
        self.umsgs.insert(
            uid,
            Unexpected {
                peer,
                sig,
                kind,
                claimed_by: None,
            },
        );
        uid
    }

    /// Keeps an unexpected message and queues it for matching under `key`.
    fn push_unexpected(&mut self, key: MatchKey, sig: [u64; 2], kind: UnexpectedKind) -> u64 {
        let uid = self.store_unexpected(key.peer, sig, kind);
        self.unexpected.entry(key).or_default().push_back(uid);
        uid
    }

    fn post_recv(
        &mut self,
        t: Target,
        buf: BufPtr,
        cap: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        let key = MatchKey {
            comm: t.comm,
            peer: t.peer,
            tag: t.tag,
        };
        let queued = pop_key(&mut self.unexpected, &key);
        if queued.is_none() || self.aborted.contains_key(&(t.comm, t.tag)) {
            self.live_peer(&t)?;
        }
        let id = self.new_op(OpKind::Recv, t, buf, cap, asynchronous);
        match queued {
            None => self.posted.entry(key).or_default().push_back(id),
            Some(uid) => self.claim_unexpected(uid, id),
        }
        Ok(id)
    }

    /// Matches receive `id` with the unexpected message `uid`.
    fn claim_unexpected(&mut self, uid: u64, id: OpId) {
        let Some(u) = self.umsgs.get_mut(&uid) else {
            return;
        };
        let (peer, sig) = (u.peer, u.sig);
        if self.ops.get(&id).is_some_and(|op| op.target.sig != sig) {
            let rts = match u.kind {
                UnexpectedKind::Rts { msg_id, .. } => Some(msg_id),
                UnexpectedKind::Eager { complete, .. } => {
                    // Drop the data as it arrives; no receive will ever take it.
                    if complete {
                        self.umsgs.remove(&uid);
                    } else {
                        u.claimed_by = Some(DISCARDED);
                    }
                    None
                }
            };
            if let Some(msg_id) = rts {
                self.umsgs.remove(&uid);
                self.refuse_rts(peer, msg_id);
            }
            self.mismatch(id, sig);
            return;
        }
        match u.kind {
            UnexpectedKind::Eager { complete: true, .. } => self.deliver_unexpected(uid, id),
            UnexpectedKind::Eager {
                complete: false, ..
            } => {
                u.claimed_by = Some(id);
            }
            UnexpectedKind::Rts { msg_id, len, pull } => {
                self.umsgs.remove(&uid);
                self.match_rts(id, msg_id, len, pull);
            }
        }
    }

    /// Copies a fully arrived unexpected message into receive `id` and completes it.
    fn deliver_unexpected(&mut self, uid: u64, id: OpId) {
        let Some(Unexpected {
            kind: UnexpectedKind::Eager { data, .. },
            ..
        }) = self.umsgs.remove(&uid)
        else {
            return;
        };
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        let result = if data.len() > op.cap {
            Err(truncated(op, data.len()))
        } else {
            if let Some(dst) = op_slice(op, 0, data.len()) {
                dst.copy_from_slice(&data);
            }
            Ok(data.len())
        };
        self.complete(id, result);
    }

    /// Answers the rendezvous of message `msg_id` (`len` bytes) for receive `id`; `pull` is
    /// the address of the sender's buffer when this rank may copy the data out of it itself
    /// (a local peer, with cross-memory attach).
    fn match_rts(&mut self, id: OpId, msg_id: u64, len: usize, pull: Option<u64>) {
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        let peer = op.target.peer;
        let mut cts = FrameHeader::new(FrameKind::Cts);
        cts.msg_id = msg_id;
        let pid = self.peers[peer]
            .as_ref()
            .and_then(|p| p.shm.as_ref())
            .filter(|m| m.link.cma)
            .map(|m| m.link.pid);
        if len > op.cap {
            cts.flags = FLAG_DISCARD;
            let err = truncated(op, len);
            self.complete(id, Err(err));
        } else if let (Some(addr), Some(pid)) = (pull, pid) {
            // Receiver pull: one copy, straight from the sender's buffer into this one.
            cts.flags = FLAG_PULLED;
            let result = match op_slice(op, 0, len) {
                Some(dst) => cma::read_remote(pid, addr as usize, dst).map(|()| len),
                None => Ok(0),
            };
            if result.is_err() {
                cts.flags = FLAG_DISCARD;
            }
            ProtocolCounts::bump(&self.counts.shm_pull);
            tracing::debug!(
                peer,
                len,
                "shared-memory receive: pulled with cross-memory attach"
            );
            if let Err(Error::PeerLost(why)) = result {
                // The sender's process is gone: the peer is lost, for every operation with it
                // (this one included), not only for this receive; and the call's peers are
                // told whom this rank lost when it abandons the call.
                self.fail_peer(peer, why);
                return;
            }
            self.complete(id, result);
        } else {
            op.msg_len = len;
            op.remaining = len;
            self.rndv_recv.insert((peer, msg_id), id);
        }
        self.queue(peer, 0, OutFrame::control(cts));
    }

    /// Tells the sender of rendezvous `msg_id` not to send its data.
    fn refuse_rts(&mut self, peer: usize, msg_id: u64) {
        let mut cts = FrameHeader::new(FrameKind::Cts);
        cts.msg_id = msg_id;
        cts.flags = FLAG_DISCARD;
        self.queue(peer, 0, OutFrame::control(cts));
    }

    /// Receive `id` met a message of a different operation (`theirs`): fail it, and tell the
    /// sender this rank abandons the operation.
    fn mismatch(&mut self, id: OpId, theirs: [u64; 2]) {
        let Some(op) = self.ops.get(&id) else { return };
        let t = op.target;
        let describe = self.cfg.describe;
        let err = Error::Mismatch(format!(
            "this rank called {} but rank {} called {}: every rank must call the same \
             collectives in the same order with the same type, op, count and root",
            describe(t.sig),
            t.comm_rank,
            describe(theirs)
        ));
        self.complete(id, Err(err));
        self.send_abort(t, true, None);
    }

    /// Tells `t.peer` that this rank abandoned the operation `(t.comm, t.tag)`, over a
    /// mismatch or another error, naming the world rank it lost if that was why (`msg_id` is
    /// that rank + 1, 0 for none).
    fn send_abort(&mut self, t: Target, mismatch: bool, lost: Option<usize>) {
        if t.peer == self.cfg.rank {
            return;
        }
        let mut hdr = FrameHeader::new(FrameKind::Abort);
        if mismatch {
            hdr.flags = FLAG_MISMATCH;
        }
        hdr.msg_id = lost.map_or(0, |l| l as u64 + 1);
        hdr.comm = t.comm;
        hdr.tag = t.tag;
        hdr.sig = t.sig;
        self.queue(t.peer, 0, OutFrame::control(hdr));
    }

    /// The error of an operation on `t` that world rank `peer` abandoned, having called it as
    /// `sig` (and having lost world rank `lost`, if that was why).
    fn abandoned(
        &self,
        t: &Target,
        peer: usize,
        sig: [u64; 2],
        mismatch: bool,
        lost: Option<usize>,
    ) -> Error {
        let describe = self.cfg.describe;
        if let (true, false, Some(l)) = (sig == t.sig, mismatch, lost) {
            Error::PeerLost(format!(
                "world rank {l} is unreachable: world rank {peer} abandoned {} on losing it; \
                 look at the output of world rank {l} (did it exit or crash?)",
                describe(sig)
            ))
        } else if sig == t.sig && mismatch {
            Error::Mismatch(format!(
                "world rank {peer} abandoned {} because ranks called mismatched collectives; \
                 see the first mismatch error of the ranks",
                describe(sig)
            ))
        } else if sig == t.sig {
            Error::Aborted(format!(
                "world rank {peer} abandoned {} after an error; see that rank's error",
                describe(sig)
            ))
        } else {
            Error::Mismatch(format!(
                "this rank called {} but world rank {peer} called {}: every rank must call the \
                 same collectives in the same order with the same type, op, count and root",
                describe(t.sig),
                describe(sig)
            ))
        }
    }

    /// Whether a message belongs to a call this rank made differently.
    fn foreign(&self, hdr: &FrameHeader) -> bool {
        self.calls
            .get(&(hdr.comm, hdr.tag))
            .is_some_and(|ours| *ours != hdr.sig)
    }

    /// A message of `(comm, tag)` carries another signature than this rank's call: fail the
    /// call (now, or at the next call on the communicator if it is over) and tell the sender.
    fn reject_message(&mut self, peer: usize, hdr: &FrameHeader) {
        let Some(&ours) = self.calls.get(&(hdr.comm, hdr.tag)) else {
            return;
        };
        let describe = self.cfg.describe;
        let err = Error::Mismatch(format!(
            "this rank called {} but world rank {peer} called {}: every rank must call the same \
             collectives in the same order with the same type, op, count and root",
            describe(ours),
            describe(hdr.sig)
        ));
        self.fail_call(hdr.comm, hdr.tag, err);
        let t = Target {
            comm: hdr.comm,
            peer,
            comm_rank: peer,
            tag: hdr.tag,
            sig: ours,
        };
        self.send_abort(t, true, None);
    }

    /// Fails the pending operations of call `(comm, tag)` with `err`; when none is pending the
    /// call is over, and the next call on `comm` reports `err`.
    fn fail_call(&mut self, comm: u64, tag: u32, err: Error) {
        let pending = |st: &State, any_tag: bool| -> Vec<OpId> {
            st.ops
                .iter()
                .filter(|(_, op)| {
                    op.result.is_none()
                        && op.target.comm == comm
                        && (any_tag || op.target.tag == tag)
                })
                .map(|(&id, _)| id)
                .collect()
        };
        let mut victims = pending(self, false);
        if victims.is_empty() {
            // Report an over call once, however many peers tell of it.
            if self.calls.remove(&(comm, tag)).is_none() {
                return;
            }
            // The call is over here: the one running now on the communicator reports it, or
            // else the next one.
            victims = pending(self, true);
            if victims.is_empty() {
                self.late.entry(comm).or_insert(err);
                self.late_news.store(true, Ordering::Release);
                return;
            }
        }
        for id in victims {
            self.disentangle(id);
            self.complete(id, Err(err.clone()));
        }
    }

    /// Registers this rank's call `(comm, tag)` with signature `sig`. Fails if an earlier
    /// call on `comm` turned out mismatched after it returned, or if a message of this call
    /// already arrived with another signature.
    fn begin_call(&mut self, comm: u64, tag: u32, sig: [u64; 2]) -> Result<()> {
        if let Some(e) = self.aborted_comm(comm) {
            return Err(e);
        }
        self.late_error(comm)?;
        if self.call_order.len() >= CALL_MEMORY {
            if let Some(old) = self.call_order.pop_front() {
                self.calls.remove(&old);
            }
        }
        self.calls.insert((comm, tag), sig);
        self.call_order.push_back((comm, tag));
        // Messages of this call that arrived before it: one queue per possible sender.
        // Every call pays for this: skip the matching queues when nothing unexpected is held.
        if self.unexpected.is_empty() {
            return Ok(());
        }
        let strangers: Vec<(MatchKey, u64)> = (0..self.peers.len())
            .map(|peer| MatchKey { comm, peer, tag })
            .filter_map(|k| self.unexpected.get(&k).map(|q| (k, q)))
            .flat_map(|(k, q)| q.iter().map(move |&uid| (k, uid)))
            .filter(|(_, uid)| self.umsgs.get(uid).is_some_and(|u| u.sig != sig))
            .collect();
        let Some(&(key, uid)) = strangers.first() else {
            return Ok(());
        };
        let theirs = self.umsgs.get(&uid).map_or([0; 2], |u| u.sig);
        for (key, uid) in &strangers {
            remove_from(&mut self.unexpected, key, uid);
            if let Some(Unexpected {
                kind: UnexpectedKind::Rts { msg_id, .. },
                ..
            }) = self.umsgs.remove(uid)
            {
                self.refuse_rts(key.peer, msg_id);
            }
        }
        self.send_abort(
            Target {
                comm,
                peer: key.peer,
                comm_rank: key.peer,
                tag,
                sig,
            },
            true,
            None,
        );
        let describe = self.cfg.describe;
        Err(Error::Mismatch(format!(
            "this rank called {} but world rank {} called {}: every rank must call the same \
             collectives in the same order with the same type, op, count and root",
            describe(sig),
            key.peer,
            describe(theirs)
        )))
    }

    /// The error of an earlier call on `comm` that turned out mismatched after it returned,
    /// reported once.
    fn late_error(&mut self, comm: u64) -> Result<()> {
        let Some(e) = self.late.remove(&comm) else {
            return Ok(());
        };
        self.late_news
            .store(!self.late.is_empty(), Ordering::Release);
        Err(e)
    }

    /// A peer abandoned `(comm, tag)` (on losing world rank `lost`, if that was why): fail
    /// this rank's operations of it, now and later.
    fn on_abort(
        &mut self,
        peer: usize,
        (comm, tag, sig): (u64, u32, [u64; 2]),
        mismatch: bool,
        lost: Option<usize>,
    ) {
        if let Some(l) = lost {
            self.last_lost = Some(l);
            if let Some(pipe) = self.cfg.run_fd {
                tell_launcher(pipe, self.cfg.rank, l);
            }
        }
        self.aborted
            .insert((comm, tag), (peer, sig, mismatch, lost));
        if let Some(&ours) = self.calls.get(&(comm, tag)) {
            let t = Target {
                comm,
                peer,
                comm_rank: peer,
                tag,
                sig: ours,
            };
            let err = self.abandoned(&t, peer, sig, mismatch, lost);
            self.fail_call(comm, tag, err);
        }
    }

    /// The error of every operation on `comm`, if it was aborted.
    fn aborted_comm(&self, comm: u64) -> Option<Error> {
        if self.comm_aborted.is_empty() {
            return None;
        }
        self.comm_aborted.get(&comm).cloned()
    }

    /// Communicator `comm` is aborted: its pending operations fail with `err`, and so will
    /// every later one.
    fn abort_comm(&mut self, comm: u64, err: Error) {
        self.io.any_aborted.store(true, Ordering::SeqCst);
        let err = self.comm_aborted.entry(comm).or_insert(err).clone();
        let victims: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, op)| op.result.is_none() && op.target.comm == comm)
            .map(|(&id, _)| id)
            .collect();
        for id in victims {
            self.disentangle(id);
            self.complete(id, Err(err.clone()));
        }
    }

    fn complete(&mut self, id: OpId, result: Result<usize>) {
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        if op.result.is_some() {
            return;
        }
        self.completions += 1;
        if op.detached.is_some() {
            if let Err(e) = &result {
                tracing::warn!("the {} of a dropped request failed: {e}", op.describe());
            }
            self.ops.remove(&id);
            return;
        }
        op.result = Some(result);
    }

    /// Removes and returns the result of a completed operation.
    fn take(&mut self, id: OpId) -> Option<Result<usize>> {
        self.ops.get(&id)?.result.as_ref()?;
        let op = self.ops.remove(&id)?;
        if op.asynchronous {
            self.io.pending_async.fetch_sub(1, Ordering::SeqCst);
        }
        op.result
    }

    /// The peers that the operations `ids` still wait for, and the operations, for stall
    /// warnings.
    fn awaited(&self, ids: &[OpId]) -> String {
        let ops: Vec<&Op> = ids.iter().filter_map(|id| self.ops.get(id)).collect();
        let mut ranks: Vec<(usize, usize)> = ops
            .iter()
            .map(|o| (o.target.comm_rank, o.target.peer))
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        let ranks: Vec<String> = ranks
            .iter()
            .map(|(r, w)| format!("rank {r} (world rank {w})"))
            .collect();
        let ops: Vec<String> = ops.iter().map(|o| o.describe()).collect();
        format!("{} [{}]", ranks.join(", "), ops.join("; "))
    }

    /// Gives up on `id` at its deadline and removes it (see [`State::disentangle`]).
    fn time_out(&mut self, id: OpId) -> Error {
        let Some(op) = self.ops.get(&id) else {
            return Error::Internal("timed out on an unknown operation".into());
        };
        let t = op.target;
        let why = match op.kind {
            OpKind::Recv => "has not sent a matching message",
            OpKind::Send => "is not receiving (a large message waits for the matching receive)",
        };
        let err = Error::Timeout(format!(
            "{} did not complete within HCOMM_TIMEOUT: rank {} {why}; it may be stuck, slow, or \
             calling something else",
            op.describe(),
            t.comm_rank
        ));
        self.disentangle(id);
        if self.ops.remove(&id).is_some_and(|o| o.asynchronous) {
            self.io.pending_async.fetch_sub(1, Ordering::SeqCst);
        }
        err
    }

    /// Cuts every tie between operation `id` and the wire, so that its buffer may go: a
    /// receive leaves its queue, and data still due for it is read and dropped; a send loses
    /// its unsent frames, keeps a copy of a half-written one (the stream must stay framed),
    /// and a late CTS for it is ignored. The peer is told nothing here: the collective layer
    /// sends aborts.
    fn disentangle(&mut self, id: OpId) {
        let Some(op) = self.ops.get(&id) else { return };
        let (t, kind, remaining) = (op.target, op.kind, op.remaining);
        match kind {
            OpKind::Recv => {
                let key = MatchKey {
                    comm: t.comm,
                    peer: t.peer,
                    tag: t.tag,
                };
                remove_from(&mut self.posted, &key, &id);
                if let Some(k) = self
                    .rndv_recv
                    .iter()
                    .find(|(_, &o)| o == id)
                    .map(|(k, _)| *k)
                {
                    self.rndv_recv.remove(&k);
                    self.discarding.insert(k, remaining as u64);
                }
                for u in self.umsgs.values_mut() {
                    if u.claimed_by == Some(id) {
                        u.claimed_by = Some(DISCARDED);
                    }
                }
                if let Some(p) = self.peers.get_mut(t.peer).and_then(Option::as_mut) {
                    for st in &mut p.streams {
                        if let RxState::Payload {
                            dest: dest @ Dest::Op { .. },
                            ..
                        } = &mut st.rx
                        {
                            if matches!(dest, Dest::Op { op, .. } if *op == id) {
                                *dest = Dest::Discard;
                            }
                        }
                    }
                }
            }
            OpKind::Send => {
                if let Some(k) = self
                    .rndv_send
                    .iter()
                    .find(|(_, &o)| o == id)
                    .map(|(k, _)| *k)
                {
                    self.rndv_send.remove(&k);
                    self.abandoned_sends.insert(k);
                }
                let Some(op) = self.ops.get(&id) else { return };
                let src = op
                    .detached
                    .as_ref()
                    .map_or(op.buf.0.cast_const(), |b| b.as_ptr());
                if let Some(p) = self.peers.get_mut(t.peer).and_then(Option::as_mut) {
                    // Ring and plug-in frames go whole or not at all.
                    if let Some(m) = p.shm.as_mut() {
                        m.out.retain(|f| f.op != Some(id));
                    }
                    if let Some(pp) = p.plugin.as_mut() {
                        pp.out.retain(|f| f.op != Some(id));
                    }
                    for st in &mut p.streams {
                        st.out.retain(|f| f.op != Some(id) || f.hdr_done > 0);
                        for f in st.out.iter_mut().filter(|f| f.op == Some(id)) {
                            // SAFETY: the operation is still live, so `off..off + len` of its
                            // buffer is readable (see `post_send`).
                            let bytes =
                                unsafe { std::slice::from_raw_parts(src.add(f.off), f.len) };
                            f.owned = Some(bytes.to_vec());
                            f.op = None;
                        }
                    }
                }
            }
        }
    }

    /// Whether `peer` is another rank whose first stream is still open for reading.
    fn readable(&self, peer: usize) -> bool {
        peer != self.cfg.rank
            && self
                .peers
                .get(peer)
                .and_then(Option::as_ref)
                .is_some_and(|p| {
                    p.lost.is_none() && p.shm.is_none() && p.plugin.is_none() && !p.streams[0].eof
                })
    }

    /// Reachable peers with frames not yet handed to the kernel or the ring.
    fn unflushed_peers(&self) -> Vec<usize> {
        let unflushed = |p: &Peer| {
            p.lost.is_none()
                && (p.streams.iter().any(|s| !s.out.is_empty())
                    || p.shm.as_ref().is_some_and(|m| !m.out.is_empty())
                    || p.plugin
                        .as_ref()
                        .is_some_and(|pp| !pp.out.is_empty() || pp.link.sending()))
        };
        (0..self.peers.len())
            .filter(|&p| self.peers[p].as_ref().is_some_and(unflushed))
            .collect()
    }

    /// Peers whose links are still open.
    fn open_peers(&self) -> Vec<usize> {
        (0..self.peers.len())
            .filter(|&p| self.peers[p].as_ref().is_some_and(|p| p.lost.is_none()))
            .collect()
    }

    /// Sends a frame to `peer`: through the transport plug-in or shared memory when the peer
    /// has it, otherwise on TCP stream `stream`.
    fn queue(&mut self, peer: usize, stream: usize, frame: OutFrame) {
        let Some(p) = self.peers[peer].as_mut() else {
            return;
        };
        if p.lost.is_some() {
            return;
        }
        if let Some(pp) = p.plugin.as_mut() {
            pp.out.push_back(frame);
            if pp.out.len() == 1 {
                self.flush_plugin(peer);
            }
            return;
        }
        match p.shm.as_mut() {
            Some(m) => {
                m.out.push_back(frame);
                if m.out.len() == 1 {
                    self.flush_shm(peer);
                }
            }
            None => self.queue_tcp(peer, stream, frame),
        }
    }

    /// Appends a frame to a TCP stream's queue and writes what the socket takes now.
    fn queue_tcp(&mut self, peer: usize, stream: usize, frame: OutFrame) {
        let Some(p) = self.peers[peer].as_mut() else {
            return;
        };
        if p.lost.is_some() {
            return;
        }
        p.streams[stream].out.push_back(frame);
        if p.streams[stream].out.len() == 1 {
            self.flush(peer, stream);
        }
    }

    /// A watch on the next frame of the local peer that `id`, a receive, waits for, when
    /// nothing else is to be done for that peer.
    fn watch<'a>(&self, inbox: &'a Inbox, id: OpId) -> Option<Watch<'a>> {
        let op = self.ops.get(&id).filter(|op| op.kind == OpKind::Recv)?;
        self.recv_watch(inbox, &op.target)
    }

    /// Sends `peer` a frame that only wakes it (it sleeps in `epoll_wait` while this rank
    /// wrote to its shared memory).
    fn queue_wake(&mut self, peer: usize) {
        self.queue_tcp(
            peer,
            0,
            OutFrame::control(FrameHeader::new(FrameKind::Wake)),
        );
    }

    /// Whether every other rank is reached through shared memory (then waiters sleep on the
    /// doorbell's futex rather than in `epoll_wait`).
    fn all_shm(&self) -> bool {
        !self.shm_peers.is_empty() && self.shm_peers.len() + 1 == self.peers.len()
    }

    /// Whether shared memory has something for this rank to do: a frame to read, or room
    /// for a frame waiting to be written.
    fn shm_ready(&mut self) -> bool {
        for &p in &self.shm_peers {
            let Some(peer) = self.peers[p].as_mut() else {
                continue;
            };
            let (Some(m), None) = (peer.shm.as_mut(), &peer.lost) else {
                continue;
            };
            if m.link.fast_in.ready(m.in_seq + 1) || !m.link.consumer.is_empty().unwrap_or(true) {
                return true;
            }
            if let Some(f) = m.out.front() {
                let need = m.link.producer.layout().slots_for(HEADER_LEN + f.len);
                let free = m.link.producer.free_slots().unwrap_or(usize::MAX);
                if need.is_none_or(|n| free >= n) {
                    return true;
                }
            }
        }
        false
    }

    /// Reads what the rings of the shared-memory peers hold and writes frames waiting for
    /// room; returns whether anything moved.
    fn poll_shm(&mut self) -> bool {
        let mut moved = false;
        for i in 0..self.shm_peers.len() {
            let p = self.shm_peers[i];
            if self.peers[p]
                .as_ref()
                .is_some_and(|peer| peer.shm.as_ref().is_some_and(|m| !m.out.is_empty()))
            {
                moved |= self.flush_shm(p);
            }
            moved |= self.read_ring(p);
        }
        moved
    }

    /// Writes the frames queued for a shared-memory peer until its ring is full; returns
    /// whether any was written.
    fn flush_shm(&mut self, peer: usize) -> bool {
        let mut done_ops = std::mem::take(&mut self.sent);
        let mut failure = None;
        let mut wake = false;
        let mut pushed = 0;
        {
            let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
                return false;
            };
            let (Some(m), None) = (p.shm.as_mut(), &p.lost) else {
                return false;
            };
            while let Some(f) = m.out.front() {
                let payload = frame_payload(f, &self.ops);
                // A small eager frame goes through the fast box when it has room.
                let fast = (f.len <= FAST_PAYLOAD)
                    .then(|| FrameHeader::decode(&f.hdr).ok())
                    .flatten()
                    .and_then(|h| h.encode_fast(payload))
                    .is_some_and(|body| m.link.fast_out.try_push(m.out_seq + 1, &body));
                let pushed_one = if fast {
                    Ok(true)
                } else {
                    m.link.producer.try_push_parts(m.out_seq, [&f.hdr, payload])
                };
                match pushed_one {
                    Ok(true) => {
                        m.out_seq += 1;
                        if let Some(id) = f.op {
                            done_ops.push(id);
                        }
                        m.out.pop_front();
                        pushed += 1;
                    }
                    Ok(false) => break,
                    Err(e) => {
                        failure = Some(format!("its shared-memory ring failed: {e}"));
                        break;
                    }
                }
            }
            // Every frame may be what the peer sleeps for, control frames (CTS, RTS)
            // included.
            if pushed > 0 || failure.is_some() {
                wake = m.link.peer_bell().ring();
            }
        }
        let moved = pushed > 0;
        self.frames_sent(done_ops.drain(..));
        self.sent = done_ops;
        if wake {
            self.queue_wake(peer);
        }
        if let Some(why) = failure {
            self.fail_peer(peer, why);
        }
        moved
    }

    /// Reads and dispatches the frames a shared-memory peer's ring holds, within a bounded
    /// number; returns whether it read any.
    fn read_ring(&mut self, peer: usize) -> bool {
        let mut read = 0;
        let mut failure = None;
        while read < SHM_ROUNDS {
            let Some(m) = self.peers[peer].as_mut().and_then(|p| p.shm.as_mut()) else {
                break;
            };
            let seq = m.in_seq;
            // The next frame is in the fast box or at the front of the ring, whichever holds
            // its number (in neither yet: it is still being written).
            if let Some(body) = m.link.fast_in.peek(seq + 1) {
                let (hdr, payload) = match FrameHeader::decode_fast(&body) {
                    Ok(frame) => frame,
                    Err(e) => {
                        failure = Some(format!("it sent a malformed frame ({e})"));
                        break;
                    }
                };
                read += 1;
                let landed = self.dispatch_whole(peer, hdr, |peers, dst| {
                    let m = peers[peer]
                        .as_mut()
                        .and_then(|p| p.shm.as_mut())
                        .ok_or("a frame vanished from its fast box")?;
                    if let Some(dst) = dst {
                        dst.copy_from_slice(&payload[..dst.len()]);
                    }
                    m.link.fast_in.consume();
                    m.in_seq += 1;
                    Ok(())
                });
                if let Err(why) = landed {
                    failure = Some(why);
                    break;
                }
                continue;
            }
            let hdr = match m.link.consumer.peek() {
                Ok(None) => break,
                Ok(Some(msg)) if msg.meta() != seq => {
                    if msg.meta() > seq {
                        // The fast box frame before it is not visible yet.
                        break;
                    }
                    Err(format!(
                        "its shared-memory ring holds frame {} where {seq} was next",
                        msg.meta()
                    ))
                }
                Ok(Some(msg)) => {
                    let mut raw = [0u8; HEADER_LEN];
                    match msg.copy_prefix(&mut raw) {
                        Ok(()) => FrameHeader::decode(&raw)
                            .map_err(|e| format!("it sent a malformed frame ({e})"))
                            .and_then(|h| {
                                if HEADER_LEN as u64 + h.payload_len() == msg.len() as u64 {
                                    Ok(h)
                                } else {
                                    Err("a frame's length disagrees with its ring message"
                                        .to_string())
                                }
                            }),
                        Err(e) => Err(format!("its shared-memory ring failed: {e}")),
                    }
                }
                Err(e) => Err(format!("its shared-memory ring failed: {e}")),
            };
            let hdr = match hdr {
                Ok(h) => h,
                Err(why) => {
                    failure = Some(why);
                    break;
                }
            };
            read += 1;
            let landed = self.dispatch_whole(peer, hdr, |peers, dst| {
                let msg = peers[peer]
                    .as_mut()
                    .and_then(|p| p.shm.as_mut())
                    .and_then(|m| m.link.consumer.peek().ok().flatten())
                    .ok_or("a frame vanished from its shared-memory ring")?;
                if let Some(dst) = dst {
                    msg.copy_range(HEADER_LEN, dst);
                }
                msg.consume();
                if let Some(m) = peers[peer].as_mut().and_then(|p| p.shm.as_mut()) {
                    m.in_seq += 1;
                }
                Ok(())
            });
            if let Err(why) = landed {
                failure = Some(why);
                break;
            }
        }
        if read > 0 {
            if let Some(m) = self.peers[peer].as_ref().and_then(|p| p.shm.as_ref()) {
                // The peer may wait for room in this ring.
                if m.link.peer_bell().ring() {
                    self.queue_wake(peer);
                }
            }
        }
        if let Some(why) = failure {
            self.fail_peer(peer, why);
        }
        read > 0
    }

    /// Dispatches a frame that arrived whole (a ring message, a plug-in frame): handles its
    /// header, then calls `land` once with where the payload goes (`None`: nowhere, or there
    /// is none) to copy it there and release the frame, then finishes what the payload
    /// completes. An error says why the peer must be dropped.
    fn dispatch_whole(
        &mut self,
        peer: usize,
        hdr: FrameHeader,
        land: impl FnOnce(&mut [Option<Peer>], Option<&mut [u8]>) -> std::result::Result<(), String>,
    ) -> std::result::Result<(), String> {
        let dest = self.on_header(peer, hdr)?;
        let n = hdr.payload_len() as usize;
        let dst = match dest {
            Some(d) if n > 0 => dest_slice(&mut self.ops, &mut self.umsgs, d, 0, n),
            _ => None,
        };
        land(&mut self.peers, dst)?;
        if let Some(dest) = dest {
            self.on_payload(peer, hdr, dest);
        }
        Ok(())
    }

    /// Handles the events of one `epoll_wait`.
    /// `by_waiter`: the caller is itself one of the waiting threads.
    fn handle(&mut self, events: &[epoll::Event], by_waiter: bool) -> bool {
        // The wake-up first: one that comes while the links are read below stays pending.
        if events.iter().any(|ev| ev.data.u64() == WAKE_TOKEN) {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.io.wake, &mut b);
        }
        let mut moved = !self.shm_peers.is_empty() && self.poll_shm();
        moved |= !self.plugin_peers.is_empty() && self.poll_plugin();
        for ev in events {
            let tok = ev.data.u64();
            if tok == WAKE_TOKEN {
                continue;
            }
            let (peer, stream) = ((tok >> 16) as usize, (tok & 0xffff) as usize);
            let flags = ev.flags;
            if flags.intersects(
                epoll::EventFlags::OUT | epoll::EventFlags::ERR | epoll::EventFlags::HUP,
            ) {
                self.flush(peer, stream);
            }
            if flags
                .intersects(epoll::EventFlags::IN | epoll::EventFlags::ERR | epoll::EventFlags::HUP)
            {
                match self.read_stream(peer, stream) {
                    ReadEnd::Drained => {}
                    ReadEnd::Eof => self.stream_ended(peer, stream),
                    ReadEnd::Failed(why) => self.fail_peer(peer, why),
                }
            }
        }
        // Wake other sleeping waiters whose operations may have completed here.
        if self.completions > 0 && self.io.waiters.load(Ordering::SeqCst) > usize::from(by_waiter) {
            self.io.wake_all();
        }
        self.completions = 0;
        moved
    }

    /// Writes queued frames of one stream until the socket is full or the queue empty.
    fn flush(&mut self, peer: usize, stream: usize) {
        let mut done_ops: Vec<OpId> = Vec::new();
        let outcome = {
            let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
                return;
            };
            if p.lost.is_some() {
                return;
            }
            let s = &mut p.streams[stream];
            let mut outcome = Ok(());
            for _ in 0..MAX_ROUNDS {
                let Some(f) = s.out.front_mut() else { break };
                let payload = frame_payload(f, &self.ops)
                    .get(f.done..)
                    .unwrap_or_default();
                let bufs = [IoSlice::new(&f.hdr[f.hdr_done..]), IoSlice::new(payload)];
                match s.sock.write_vectored(&bufs) {
                    Ok(0) => {
                        outcome = Err("the connection accepts no more data".to_string());
                        break;
                    }
                    Ok(n) => {
                        let h = n.min(HEADER_LEN - f.hdr_done);
                        f.hdr_done += h;
                        f.done += n - h;
                        if f.hdr_done == HEADER_LEN && f.done == f.len {
                            if let Some(id) = f.op {
                                done_ops.push(id);
                            }
                            s.out.pop_front();
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        outcome = Err(format!("sending failed: {e}"));
                        break;
                    }
                }
            }
            let want = !s.out.is_empty();
            if outcome.is_ok() && want && s.eof {
                // Its streams are out of the poll set: the rest could never be written.
                outcome = Err("it finalized with messages to it still queued".to_string());
            } else if outcome.is_ok() && want != s.want_out {
                let mut flags = epoll::EventFlags::IN;
                if want {
                    flags |= epoll::EventFlags::OUT;
                }
                match epoll::modify(
                    &self.io.epoll,
                    &s.sock,
                    epoll::EventData::new_u64(token(peer, stream)),
                    flags,
                ) {
                    Ok(()) => s.want_out = want,
                    Err(e) => outcome = Err(format!("epoll_ctl failed: {e}")),
                }
            }
            outcome
        };
        self.frames_sent(done_ops);
        if let Err(why) = outcome {
            self.fail_peer(peer, why);
        }
    }

    /// One frame of each of `ops` (sends) left this rank: a send whose frames all did is
    /// complete.
    fn frames_sent(&mut self, ops: impl IntoIterator<Item = OpId>) {
        for id in ops {
            if let Some(op) = self.ops.get_mut(&id) {
                op.remaining = op.remaining.saturating_sub(1);
                if op.remaining == 0 {
                    let len = op.cap;
                    self.complete(id, Ok(len));
                }
            }
        }
    }

    /// Reads and dispatches what a stream has, within a bounded number of rounds.
    fn read_stream(&mut self, peer: usize, stream: usize) -> ReadEnd {
        // A read that returned less than asked for emptied the socket: the next read would
        // only say so. Stopping before the socket is empty (short read, or MAX_ROUNDS reads
        // for fairness) never misses data, since epoll is level-triggered; but everything
        // already buffered is dispatched first, since no event would announce it again.
        let mut short_read = false;
        let mut reads = 0;
        loop {
            let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
                return ReadEnd::Drained;
            };
            if p.lost.is_some() {
                return ReadEnd::Drained;
            }
            let s = &mut p.streams[stream];
            match s.rx {
                RxState::Header => {
                    if s.rx_end - s.rx_start >= HEADER_LEN {
                        let mut raw = [0u8; HEADER_LEN];
                        raw.copy_from_slice(&s.rx_buf[s.rx_start..s.rx_start + HEADER_LEN]);
                        s.rx_start += HEADER_LEN;
                        match FrameHeader::decode(&raw) {
                            Ok(hdr) => match self.on_header(peer, hdr) {
                                Err(why) => return ReadEnd::Failed(why),
                                Ok(None) => {}
                                Ok(Some(dest)) if hdr.payload_len() == 0 => {
                                    self.on_payload(peer, hdr, dest);
                                }
                                Ok(Some(dest)) => {
                                    if let Some(p) = self.peers[peer].as_mut() {
                                        p.streams[stream].rx =
                                            RxState::Payload { hdr, dest, done: 0 };
                                    }
                                }
                            },
                            Err(e) => {
                                return ReadEnd::Failed(format!("it sent a malformed frame ({e})"))
                            }
                        }
                        continue;
                    }
                    if s.rx_start > 0 {
                        s.rx_buf.copy_within(s.rx_start..s.rx_end, 0);
                        s.rx_end -= s.rx_start;
                        s.rx_start = 0;
                    }
                    if short_read || reads == MAX_ROUNDS {
                        return ReadEnd::Drained;
                    }
                    reads += 1;
                    let space = RX_BUF - s.rx_end;
                    match read_some(&mut s.sock, &mut s.rx_buf[s.rx_end..]) {
                        Ok(Some(n)) => {
                            s.rx_end += n;
                            short_read = n < space;
                        }
                        Ok(None) => return ReadEnd::Drained,
                        Err(end) => return end,
                    }
                }
                RxState::Payload { hdr, dest, done } => {
                    let total = hdr.payload_len() as usize;
                    let want = total - done;
                    let buffered = s.rx_end - s.rx_start;
                    let got = if buffered > 0 {
                        let n = want.min(buffered);
                        if let Some(dst) = dest_slice(&mut self.ops, &mut self.umsgs, dest, done, n)
                        {
                            dst.copy_from_slice(&s.rx_buf[s.rx_start..s.rx_start + n]);
                        }
                        s.rx_start += n;
                        n
                    } else if short_read || reads == MAX_ROUNDS {
                        return ReadEnd::Drained;
                    } else {
                        reads += 1;
                        let direct = if want >= RX_BUF / 2 {
                            dest_slice(&mut self.ops, &mut self.umsgs, dest, done, want)
                        } else {
                            None
                        };
                        match direct {
                            Some(dst) => match read_some(&mut s.sock, dst) {
                                Ok(Some(n)) => {
                                    short_read = n < want;
                                    n
                                }
                                Ok(None) => return ReadEnd::Drained,
                                Err(end) => return end,
                            },
                            None => {
                                s.rx_start = 0;
                                s.rx_end = 0;
                                match read_some(&mut s.sock, &mut s.rx_buf[..]) {
                                    Ok(Some(n)) => {
                                        s.rx_end = n;
                                        short_read = n < RX_BUF;
                                    }
                                    Ok(None) => return ReadEnd::Drained,
                                    Err(end) => return end,
                                }
                                0
                            }
                        }
                    };
                    let done = done + got;
                    if done == total {
                        s.rx = RxState::Header;
                        self.on_payload(peer, hdr, dest);
                    } else {
                        s.rx = RxState::Payload { hdr, dest, done };
                    }
                }
            }
        }
    }

    /// Dispatches a frame header; returns where the frame's payload goes (`None`: the frame
    /// is handled), or why the peer must be dropped.
    fn on_header(
        &mut self,
        peer: usize,
        hdr: FrameHeader,
    ) -> std::result::Result<Option<Dest>, String> {
        if let Some(p) = self.peers[peer].as_mut() {
            p.heard = p.heard.wrapping_add(1);
        }
        let dest = match hdr.kind {
            FrameKind::Eager => {
                let key = MatchKey {
                    comm: hdr.comm,
                    peer,
                    tag: hdr.tag,
                };
                let len = hdr.len as usize;
                match pop_key(&mut self.posted, &key) {
                    Some(id) if self.ops.get(&id).is_some_and(|op| op.target.sig != hdr.sig) => {
                        self.mismatch(id, hdr.sig);
                        Dest::Discard
                    }
                    Some(id) => {
                        let op = self.ops.get_mut(&id).ok_or("a posted receive vanished")?;
                        if len > op.cap {
                            let err = truncated(op, len);
                            self.complete(id, Err(err));
                            Dest::Discard
                        } else {
                            op.msg_len = len;
                            Dest::Op { op: id, base: 0 }
                        }
                    }
                    None if self.foreign(&hdr) => {
                        self.reject_message(peer, &hdr);
                        Dest::Discard
                    }
                    None => {
                        let kind = UnexpectedKind::Eager {
                            data: vec![0u8; len],
                            complete: false,
                        };
                        Dest::Unexpected(self.push_unexpected(key, hdr.sig, kind))
                    }
                }
            }
            FrameKind::Rts => {
                let key = MatchKey {
                    comm: hdr.comm,
                    peer,
                    tag: hdr.tag,
                };
                let len = usize::try_from(hdr.len)
                    .map_err(|_| "it announced a message too large for this host")?;
                let pull = (hdr.flags & FLAG_CAN_PULL != 0).then_some(hdr.offset);
                match pop_key(&mut self.posted, &key) {
                    Some(id) if self.ops.get(&id).is_some_and(|op| op.target.sig != hdr.sig) => {
                        self.refuse_rts(peer, hdr.msg_id);
                        self.mismatch(id, hdr.sig);
                    }
                    Some(id) => self.match_rts(id, hdr.msg_id, len, pull),
                    None if self.foreign(&hdr) => {
                        self.refuse_rts(peer, hdr.msg_id);
                        self.reject_message(peer, &hdr);
                    }
                    None => {
                        self.push_unexpected(
                            key,
                            hdr.sig,
                            UnexpectedKind::Rts {
                                msg_id: hdr.msg_id,
                                len,
                                pull,
                            },
                        );
                    }
                }
                return Ok(None);
            }
            FrameKind::Cts => {
                let Some(id) = self.rndv_send.remove(&(peer, hdr.msg_id)) else {
                    if self.abandoned_sends.remove(&(peer, hdr.msg_id)) {
                        return Ok(None);
                    }
                    return Err(format!(
                        "it cleared message {} that was never announced",
                        hdr.msg_id
                    ));
                };
                if hdr.flags & (FLAG_DISCARD | FLAG_PULLED) != 0 {
                    let len = self.ops.get(&id).map_or(0, |op| op.cap);
                    self.complete(id, Ok(len));
                } else {
                    self.send_data(peer, id, hdr.msg_id);
                }
                return Ok(None);
            }
            FrameKind::Data => {
                let Some(&id) = self.rndv_recv.get(&(peer, hdr.msg_id)) else {
                    let key = (peer, hdr.msg_id);
                    let due = self.discarding.get_mut(&key).ok_or_else(|| {
                        format!(
                            "it sent data of message {} that was never cleared",
                            hdr.msg_id
                        )
                    })?;
                    *due = due.saturating_sub(hdr.len);
                    if *due == 0 {
                        self.discarding.remove(&key);
                    }
                    return Ok((hdr.len > 0).then_some(Dest::Discard));
                };
                let op = self.ops.get(&id).ok_or("a matched receive vanished")?;
                if hdr.offset.saturating_add(hdr.len) > op.msg_len as u64 {
                    return Err(format!(
                        "it sent data beyond the end of message {}",
                        hdr.msg_id
                    ));
                }
                Dest::Op {
                    op: id,
                    base: hdr.offset as usize,
                }
            }
            FrameKind::Close => {
                if let Some(p) = self.peers[peer].as_mut() {
                    p.closed = true;
                }
                return Ok(None);
            }
            // It only had to wake this rank up.
            FrameKind::Wake => return Ok(None),
            FrameKind::Abort if hdr.flags & FLAG_COMM_ABORT != 0 => {
                let err = Error::Aborted(format!(
                    "world rank {peer} aborted the communicator (Communicator::abort, \
                     hcommCommAbort); see that rank's output for why"
                ));
                for comm in [hdr.comm, hdr.sig[0], hdr.sig[1]] {
                    self.abort_comm(comm, err.clone());
                }
                return Ok(None);
            }
            FrameKind::Abort => {
                let lost = hdr
                    .msg_id
                    .checked_sub(1)
                    .and_then(|l| usize::try_from(l).ok())
                    .filter(|&l| l < self.peers.len() && l != self.cfg.rank);
                self.on_abort(
                    peer,
                    (hdr.comm, hdr.tag, hdr.sig),
                    hdr.flags & FLAG_MISMATCH != 0,
                    lost,
                );
                return Ok(None);
            }
        };
        Ok(Some(dest))
    }

    /// A frame's payload has fully arrived.
    fn on_payload(&mut self, peer: usize, hdr: FrameHeader, dest: Dest) {
        match dest {
            Dest::Discard => {}
            Dest::Unexpected(uid) => {
                let Some(u) = self.umsgs.get_mut(&uid) else {
                    return;
                };
                if let UnexpectedKind::Eager { complete, .. } = &mut u.kind {
                    *complete = true;
                }
                if let Some(id) = u.claimed_by {
                    self.deliver_unexpected(uid, id);
                }
            }
            Dest::Op { op: id, .. } => match hdr.kind {
                FrameKind::Data => {
                    let Some(op) = self.ops.get_mut(&id) else {
                        return;
                    };
                    op.remaining = op.remaining.saturating_sub(hdr.len as usize);
                    if op.remaining == 0 {
                        let len = op.msg_len;
                        self.rndv_recv.remove(&(peer, hdr.msg_id));
                        self.complete(id, Ok(len));
                    }
                }
                _ => self.complete(id, Ok(hdr.len as usize)),
            },
        }
    }

    /// Queues the data of a cleared rendezvous send, in chunks over all streams of the peer.
    fn send_data(&mut self, peer: usize, id: OpId, msg_id: u64) {
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        let Some(p) = self.peers[peer].as_mut() else {
            return;
        };
        if let Some(m) = p.shm.as_mut() {
            // Sender push: chunks through the ring, copied out by the receiver while the
            // next ones are copied in.
            let len = op.cap;
            let chunk = self
                .cfg
                .shm_chunk
                .min(m.link.producer.layout().max_payload() - HEADER_LEN)
                .max(1);
            let before = m.out.len();
            m.out.extend(data_frames(id, msg_id, len, chunk));
            op.remaining = m.out.len() - before;
            ProtocolCounts::bump(&self.counts.shm_push);
            let frames = op.remaining;
            tracing::debug!(peer, len, frames, "shared-memory send: pushed in chunks");
            self.flush_shm(peer);
            return;
        }
        if let Some(pp) = p.plugin.as_mut() {
            let before = pp.out.len();
            pp.out
                .extend(data_frames(id, msg_id, op.cap, self.cfg.chunk));
            op.remaining = pp.out.len() - before;
            self.flush_plugin(peer);
            return;
        }
        let (len, chunk) = (op.cap, self.cfg.chunk);
        let nstreams = p.streams.len();
        let mut frames = 0;
        let mut touched = vec![false; nstreams];
        for frame in data_frames(id, msg_id, len, chunk) {
            let s = p.next_data_stream % nstreams;
            p.next_data_stream += 1;
            p.streams[s].out.push_back(frame);
            touched[s] = true;
            frames += 1;
        }
        op.remaining = frames;
        tracing::trace!(peer, len, frames, "rendezvous data queued");
        for (s, t) in touched.into_iter().enumerate() {
            if t {
                self.flush(peer, s);
            }
        }
    }

    /// A stream of `peer` reached its end. After the peer's Close (on stream 0) that is
    /// orderly, and data may still arrive on its other streams: the peer is done when all
    /// have ended. Without a Close it died. A plug-in peer's end is judged by
    /// `State::poll_plugin`, which knows whether its Close and this rank's frames are through.
    fn stream_ended(&mut self, peer: usize, stream: usize) {
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return;
        };
        let s = &mut p.streams[stream];
        s.eof = true;
        let _ = epoll::delete(&self.io.epoll, &s.sock);
        if let Some(pp) = p.plugin.as_mut() {
            pp.tcp_gone.get_or_insert_with(Instant::now);
            return;
        }
        if (stream == 0 && !p.closed) || p.streams.iter().all(|s| s.eof) {
            self.fail_peer(peer, "it closed the connection".into());
        }
    }

    /// Marks a peer unreachable: closes its links and fails every operation with it.
    fn fail_peer(&mut self, peer: usize, why: String) {
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return;
        };
        if p.lost.is_some() {
            return;
        }
        if p.shm.is_some() && !self.draining {
            // What the peer wrote to the ring before its connection ended is still due:
            // read it first (its frames may fail the peer themselves).
            self.draining = true;
            while self.read_ring(peer) {}
            self.draining = false;
        }
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return;
        };
        if p.lost.is_some() {
            return;
        }
        let msg = if p.closed {
            format!("world rank {peer} has finalized and closed its connections")
        } else {
            format!("world rank {peer} is unreachable: {why}; look at that rank's output (did it exit or crash?)")
        };
        if p.closed {
            tracing::debug!("{msg}");
        } else {
            self.last_lost = Some(peer);
            tracing::warn!("{msg}");
            if let Some(pipe) = self.cfg.run_fd {
                tell_launcher(pipe, self.cfg.rank, peer);
            }
        }
        for s in &mut p.streams {
            let _ = epoll::delete(&self.io.epoll, &s.sock);
            let _ = s.sock.shutdown(Shutdown::Both);
            s.out.clear();
            s.rx = RxState::Header;
        }
        if let Some(m) = p.shm.as_mut() {
            m.out.clear();
        }
        if let Some(pp) = p.plugin.as_mut() {
            pp.out.clear();
            pp.link.clear_tx();
            pp.tcp_gone = None;
        }
        p.lost = Some(msg.clone());
        self.rndv_recv.retain(|(q, _), _| *q != peer);
        self.rndv_send.retain(|(q, _), _| *q != peer);
        self.posted.retain(|k, _| k.peer != peer);
        // Messages that arrived whole stay receivable; partial ones are gone.
        let partial: Vec<u64> = self
            .umsgs
            .iter()
            .filter(|(_, u)| {
                u.peer == peer
                    && matches!(
                        u.kind,
                        UnexpectedKind::Eager {
                            complete: false,
                            ..
                        } | UnexpectedKind::Rts { .. }
                    )
            })
            .map(|(&uid, _)| uid)
            .collect();
        for (key, q) in self.unexpected.iter_mut() {
            if key.peer == peer {
                q.retain(|uid| !partial.contains(uid));
            }
        }
        self.unexpected.retain(|_, q| !q.is_empty());
        let failed: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, op)| op.target.peer == peer && op.result.is_none())
            .map(|(&id, _)| id)
            .collect();
        for id in failed {
            for uid in &partial {
                if self
                    .umsgs
                    .get(uid)
                    .is_some_and(|u| u.claimed_by == Some(id))
                {
                    self.umsgs.remove(uid);
                }
            }
            let desc = self.ops.get(&id).map(Op::describe).unwrap_or_default();
            self.complete(id, Err(Error::PeerLost(format!("{desc} failed: {msg}"))));
        }
        self.umsgs.retain(|uid, _| {
            !partial.contains(uid) || self.unexpected.values().any(|q| q.contains(uid))
        });
    }
}

/// Takes the first entry of a matching queue, dropping the queue when it empties (the maps
/// would otherwise keep a key for every tag ever used).
fn pop_key<V>(map: &mut HashMap<MatchKey, VecDeque<V>>, key: &MatchKey) -> Option<V> {
    let q = map.get_mut(key)?;
    let v = q.pop_front();
    if q.is_empty() {
        map.remove(key);
    }
    v
}

/// Removes `v` from a matching queue, dropping the queue when it empties.
fn remove_from<V: PartialEq>(map: &mut HashMap<MatchKey, VecDeque<V>>, key: &MatchKey, v: &V) {
    if let Some(q) = map.get_mut(key) {
        q.retain(|x| x != v);
        if q.is_empty() {
            map.remove(key);
        }
    }
}

/// One nonblocking read: `Some(n)` bytes, `None` when nothing is there now.
fn read_some(sock: &mut TcpStream, buf: &mut [u8]) -> std::result::Result<Option<usize>, ReadEnd> {
    loop {
        return match sock.read(buf) {
            Ok(0) => Err(ReadEnd::Eof),
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(ReadEnd::Failed(format!("receiving failed: {e}"))),
        };
    }
}

/// The writable bytes `off..off+len` of a live operation's buffer.
fn op_slice(op: &mut Op, off: usize, len: usize) -> Option<&mut [u8]> {
    if len == 0 {
        return None;
    }
    let base = match op.detached.as_mut() {
        Some(b) => b.as_mut_ptr(),
        None => op.buf.0,
    };
    // SAFETY: the operation is live, so its buffer is valid for writes of `cap` bytes and not
    // otherwise accessed (see `post_recv`); callers checked `off + len <= msg_len <= cap`.
    Some(unsafe { std::slice::from_raw_parts_mut(base.add(off), len) })
}

/// Where `len` payload bytes at progress `done` go; `None` to drop them.
fn dest_slice<'a>(
    ops: &'a mut HashMap<OpId, Op>,
    umsgs: &'a mut HashMap<u64, Unexpected>,
    dest: Dest,
    done: usize,
    len: usize,
) -> Option<&'a mut [u8]> {
    match dest {
        Dest::Discard => None,
        Dest::Op { op, base } => op_slice(ops.get_mut(&op)?, base + done, len),
        Dest::Unexpected(uid) => match &mut umsgs.get_mut(&uid)?.kind {
            UnexpectedKind::Eager { data, .. } => data.get_mut(done..done + len),
            UnexpectedKind::Rts { .. } => None,
        },
    }
}

/// The data frames of rendezvous message `msg_id` of send `id`: `len` bytes in chunks of
/// `chunk`.
fn data_frames(id: OpId, msg_id: u64, len: usize, chunk: usize) -> impl Iterator<Item = OutFrame> {
    (0..len).step_by(chunk).map(move |off| {
        let n = chunk.min(len - off);
        let mut hdr = FrameHeader::new(FrameKind::Data);
        hdr.msg_id = msg_id;
        hdr.len = n as u64;
        hdr.offset = off as u64;
        OutFrame {
            op: Some(id),
            off,
            len: n,
            ..OutFrame::control(hdr)
        }
    })
}

/// The whole payload of an outgoing frame: its own copy, or its live operation's bytes.
fn frame_payload<'a>(f: &'a OutFrame, ops: &'a HashMap<OpId, Op>) -> &'a [u8] {
    match f.op.and_then(|id| ops.get(&id)) {
        _ if f.owned.is_some() => f.owned.as_deref().unwrap_or(&[]),
        Some(op) if f.len > 0 => {
            let src = op
                .detached
                .as_ref()
                .map_or(op.buf.0.cast_const(), |b| b.as_ptr());
            // SAFETY: the frame's operation is live, so its buffer is valid for
            // `off + len <= cap` bytes (see `post_send`).
            unsafe { std::slice::from_raw_parts(src.add(f.off), f.len) }
        }
        _ => &[],
    }
}

fn truncated(op: &Op, len: usize) -> Error {
    Error::Truncated(format!(
        "message from rank {} (tag {}) is {} bytes but the receive buffer holds {}: post a \
         larger buffer",
        op.target.comm_rank, op.target.tag, len, op.cap
    ))
}
