//! The rendezvous store: a small authenticated TCP key/value service that bootstraps a job.
//!
//! One [`RendezvousStore`] serves the job (usually in rank 0 or the launcher); every rank
//! talks to it through a [`StoreClient`]. Keys are strings of at most [`MAX_KEY`] bytes,
//! values byte strings of at most [`MAX_VALUE`] bytes; [`StoreClient::wait`] blocks on the
//! server until a key appears, [`StoreClient::wait_all`] until every key of a numbered set
//! does (one round trip for what every rank of a job published), and [`StoreClient::add`] is
//! an atomic counter.
//!
//! The listening port is reachable by anyone on the network, so the server assumes hostile
//! input until a peer has authenticated with the job secret: each connection is handshaken on
//! its own thread under a deadline ([`HANDSHAKE_TIMEOUT`]), at most
//! [`MAX_PENDING_HANDSHAKES`] handshakes run at once, every length is checked before anything
//! is allocated, and whatever is malformed, oversized or slow is logged and dropped without
//! affecting the authenticated ranks.
//!
//! A crowd is not an attack: the ranks of a large job all connect within moments. While every
//! handshake slot is taken, the store accepts nothing more and the newcomers wait, connected,
//! in the listen backlog ([`LISTEN_BACKLOG`]) until a handshake ends; only a handshake that
//! has been at it for [`STALE_HANDSHAKE`] (a silent intruder's, typically) is dropped to let
//! the next one in. No legitimate connection is turned away for being one too many.
//!
//! Wire format after the [`super::auth`] handshake (hellos `hcomm-store/2` both ways; a
//! peer of another version is refused at the handshake, naming both), integers
//! little-endian, strictly one reply per request:
//!
//! ```text
//! request:  op u8 | key len u16 | value len u32 | key | value
//!           op: 1 set (value) | 2 get | 3 wait (value = timeout ms u64)
//!               4 add (value = delta i64) | 5 delete
//!               6 wait all (key = prefix; value = timeout ms u64 | index u32 x k, k in
//!                 1..=MAX_WAIT_ALL, no index twice): waits for the keys prefix + decimal
//!                 index, all of them
//! reply:    status u8 | len u32 | payload
//!           status: 0 ok | 1 not found | 2 timed out | 3 invalid (payload = message)
//!                   4 store full (payload = message)
//!           wait all: ok = (len u32 | value) for each index, in request order;
//!                     timed out = message naming the missing indices
//! ```
//!
//! A counter made by `add` is stored as its 8 little-endian bytes, so `get` on it returns
//! those.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::auth;
use super::{read_exact_until, read_vec_until, write_all_until, TimedStream};
use crate::error::{Error, Result};
use crate::sync::lock;

/// Longest key, in bytes.
pub(crate) const MAX_KEY: usize = 512;
/// Longest value, in bytes.
pub const MAX_VALUE: usize = 16 << 20;
/// Most bytes (keys plus values) the store holds at once.
pub(crate) const MAX_STORED_BYTES: usize = 256 << 20;
/// Most unauthenticated connections handshaking at once (a thread each). When all slots are
/// taken, the next connection waits in the listen backlog until a handshake ends, or until the
/// oldest has been at it for [`STALE_HANDSHAKE`] and is dropped in its favour.
pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// Connections the kernel queues for the store before it accepts them (capped by
/// `net.core.somaxconn`): room for every rank of a large job arriving at once.
pub(crate) const LISTEN_BACKLOG: i32 = 4096;
/// Age at which a pending handshake may be dropped to make room for a waiting connection: an
/// unloaded handshake takes milliseconds, one among hundreds of ranks starting on a few cores
/// can take a good part of a second.
pub const STALE_HANDSHAKE: Duration = Duration::from_secs(2);
/// Most authenticated connections served at once.
pub(crate) const MAX_CLIENTS: usize = 4096;
/// Time a connection has to authenticate before the store drops it.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest single server-side wait; [`StoreClient::wait`] repeats requests for longer waits,
/// so no server thread is parked on a request for more than this.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(30);

/// Most keys one wait-all request names.
pub(crate) const MAX_WAIT_ALL: usize = 1 << 16;

/// Hello of both sides, naming the protocol and its version so a transport peer is not
/// mistaken for a store, nor a store of another hcomm version for this one.
const STORE_HELLO: &[u8] = b"hcomm-store/2";
/// What every version's hello starts with.
const STORE_HELLO_FAMILY: &[u8] = b"hcomm-store/";
/// Time an authenticated client has to finish a request it started, and to take its reply.
const FRAME_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the accept loop looks at the shutdown flag.
const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// How long dropping the store waits for its connection threads.
const DROP_WAIT: Duration = Duration::from_secs(2);
/// Stack of a connection thread: it only parses frames and copies values.
const CONN_STACK: usize = 256 * 1024;
/// Longest error message in a reply.
const MAX_MESSAGE: usize = 1024;

const REQUEST_HEADER: usize = 1 + 2 + 4;
const REPLY_HEADER: usize = 1 + 4;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_WAIT: u8 = 3;
const OP_ADD: u8 = 4;
const OP_DELETE: u8 = 5;
const OP_WAIT_ALL: u8 = 6;

const ST_OK: u8 = 0;
const ST_NOT_FOUND: u8 = 1;
const ST_TIMED_OUT: u8 = 2;
const ST_INVALID: u8 = 3;
const ST_FULL: u8 = 4;

fn op_name(op: u8) -> &'static str {
    match op {
        OP_SET => "set",
        OP_GET => "get",
        OP_WAIT => "wait",
        OP_ADD => "add",
        OP_DELETE => "delete",
        OP_WAIT_ALL => "wait all",
        _ => "unknown",
    }
}

/// `now + d`, saturating far in the future instead of overflowing.
fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// A key for log lines: lossy UTF-8, truncated.
fn show_key(key: &[u8]) -> String {
    let shown = String::from_utf8_lossy(&key[..key.len().min(64)]);
    if key.len() > 64 {
        format!("{shown:?}...")
    } else {
        format!("{shown:?}")
    }
}

// ---------------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------------

/// The rendezvous store server: binds a port and serves authenticated clients from background
/// threads until dropped.
pub struct RendezvousStore {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

/// State shared by the accept loop and the connection threads.
struct Shared {
    secret: Vec<u8>,
    table: Mutex<Table>,
    /// Signalled on every change of `table` and on shutdown (wakes server-side waits).
    changed: Condvar,
    stopping: AtomicBool,
    /// When the store stops by itself ([`RendezvousStore::expire_at`]).
    expiry: Mutex<Expiry>,
    conns: Mutex<Conns>,
    /// Signalled when a handshake ends (a slot frees) and on shutdown: wakes the accept loop
    /// waiting for room.
    slot_freed: Condvar,
    /// Number of live connection threads.
    threads: Mutex<usize>,
    threads_done: Condvar,
    /// Longest server-side wait ([`MAX_WAIT`]).
    max_wait: Duration,
}

/// Whether and when a store stops by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// It serves until dropped.
    Never,
    /// It stops at this instant unless kept first.
    At(Instant),
    /// It stopped at its expiry.
    Expired,
}

/// Every open connection, kept so that eviction and shutdown can close them.
#[derive(Default)]
struct Conns {
    next_id: u64,
    /// Still handshaking, oldest first (ids only grow).
    pending: BTreeMap<u64, Pending>,
    clients: HashMap<u64, Arc<TcpStream>>,
}

struct Pending {
    stream: Arc<TcpStream>,
    peer: SocketAddr,
    since: Instant,
}

impl RendezvousStore {
    /// Binds `addr` (port 0 picks a free port) with `SO_REUSEADDR` and starts serving.
    ///
    /// `secret` is the job secret every client must prove it holds. Errors:
    /// [`Error::InvalidArgument`] for an empty secret, [`Error::Transport`] when the address
    /// cannot be bound.
    pub fn bind(addr: SocketAddr, secret: &[u8]) -> Result<RendezvousStore> {
        if secret.is_empty() {
            return Err(Error::invalid_argument(
                "the job secret is empty: set HCOMM_JOB_SECRET to a non-empty value",
            ));
        }
        let listener = listen(addr)?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::transport(format!("rendezvous store: address of {addr}"), e))?;
        let shared = Arc::new(Shared {
            secret: secret.to_vec(),
            table: Mutex::new(Table::new(MAX_STORED_BYTES)),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            expiry: Mutex::new(Expiry::Never),
            conns: Mutex::new(Conns::default()),
            slot_freed: Condvar::new(),
            threads: Mutex::new(0),
            threads_done: Condvar::new(),
            max_wait: MAX_WAIT,
        });
        let for_thread = Arc::clone(&shared);
        let acceptor = thread::Builder::new()
            .name("hcomm-store-accept".into())
            .spawn(move || accept_loop(&for_thread, listener))
            .map_err(|e| Error::transport("rendezvous store: starting the accept thread", e))?;
        tracing::debug!("rendezvous store listening on {local_addr}");
        Ok(RendezvousStore {
            shared,
            local_addr,
            acceptor: Some(acceptor),
        })
    }

    /// The address the store listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Makes the store stop by itself at `at` (within [`ACCEPT_POLL`]) unless
    /// [`keep`](Self::keep) is called first: it closes its listener and every connection, and
    /// its threads end, as when it is dropped.
    pub(crate) fn expire_at(&self, at: Instant) {
        let mut e = lock(&self.shared.expiry);
        if *e != Expiry::Expired {
            *e = Expiry::At(at);
        }
    }

    /// Cancels the expiry: true when the store still serves (and now serves until dropped),
    /// false when it has already expired.
    pub(crate) fn keep(&self) -> bool {
        let mut e = lock(&self.shared.expiry);
        if *e == Expiry::Expired {
            return false;
        }
        *e = Expiry::Never;
        true
    }

    /// Whether the store stopped at its expiry.
    pub(crate) fn expired(&self) -> bool {
        *lock(&self.shared.expiry) == Expiry::Expired
    }
}

/// Stops serving: raises `stopping`, wakes the waits and closes every connection, whose
/// threads then end; the accept loop ends within [`ACCEPT_POLL`].
fn stop(shared: &Shared) {
    shared.stopping.store(true, Ordering::SeqCst);
    // Taking the table lock orders this after any waiter's check of `stopping`.
    drop(lock(&shared.table));
    shared.changed.notify_all();
    {
        let conns = lock(&shared.conns);
        let pending = conns.pending.values().map(|p| &p.stream);
        for stream in pending.chain(conns.clients.values()) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
    shared.slot_freed.notify_all();
}

/// True (once the store is stopped) when its expiry has come: marks it expired, unless it was
/// kept.
fn expire_if_due(shared: &Shared) -> bool {
    let mut e = lock(&shared.expiry);
    match *e {
        Expiry::At(at) if Instant::now() >= at => {
            *e = Expiry::Expired;
            drop(e);
            stop(shared);
            tracing::debug!("rendezvous store: expired");
            true
        }
        _ => false,
    }
}

impl fmt::Debug for RendezvousStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RendezvousStore")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl Drop for RendezvousStore {
    /// Stops accepting, closes every connection and waits (boundedly) for the threads.
    fn drop(&mut self) {
        stop(&self.shared);
        if let Some(acceptor) = self.acceptor.take() {
            // The accept loop looks at `stopping` every ACCEPT_POLL, so this is quick.
            let _ = acceptor.join();
        }
        let limit = Instant::now() + DROP_WAIT;
        let mut live = lock(&self.shared.threads);
        while *live > 0 {
            let left = limit.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    "rendezvous store {}: {} connection threads still running after shutdown",
                    self.local_addr,
                    *live
                );
                break;
            }
            live = self
                .shared
                .threads_done
                .wait_timeout(live, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

fn listen(addr: SocketAddr) -> Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let fail =
        |what: &str, e: io::Error| Error::transport(format!("rendezvous store: {what} {addr}"), e);
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| fail("creating a socket for", e))?;
    socket
        .set_reuse_address(true)
        .map_err(|e| fail("setting SO_REUSEADDR on", e))?;
    socket.bind(&addr.into()).map_err(|e| fail("binding", e))?;
    socket
        .listen(LISTEN_BACKLOG)
        .map_err(|e| fail("listening on", e))?;
    // Nonblocking so the loop can both wait with a timeout and drain bursts.
    socket
        .set_nonblocking(true)
        .map_err(|e| fail("configuring", e))?;
    Ok(socket.into())
}

fn accept_loop(shared: &Arc<Shared>, listener: TcpListener) {
    while !shared.stopping.load(Ordering::SeqCst) {
        if expire_if_due(shared) {
            return;
        }
        if !wait_for_room(shared) {
            continue;
        }
        if let Err(e) = wait_readable(&listener, ACCEPT_POLL) {
            if e.kind() != io::ErrorKind::Interrupted {
                tracing::warn!("rendezvous store: waiting for connections failed: {e}");
                thread::sleep(ACCEPT_POLL);
            }
            continue;
        }
        loop {
            match listener.accept() {
                Ok((stream, peer)) => admit(shared, stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    // Typically out of file descriptors: back off instead of spinning.
                    tracing::warn!("rendezvous store: accept failed: {e}");
                    thread::sleep(ACCEPT_POLL);
                    break;
                }
            }
            if shared.stopping.load(Ordering::SeqCst) || !wait_for_room(shared) {
                break;
            }
        }
    }
}

/// Makes room for one more handshake: true at once when a slot is free, or after dropping the
/// oldest handshake if it is stale. Otherwise waits (at most [`ACCEPT_POLL`]) for a slot to
/// free or the oldest to turn stale, and returns false: the caller looks again, and meanwhile
/// the connections queue in the listen backlog instead of being turned away.
fn wait_for_room(shared: &Shared) -> bool {
    let mut conns = lock(&shared.conns);
    if conns.pending.len() < MAX_PENDING_HANDSHAKES {
        return true;
    }
    let Some((&old, oldest)) = conns.pending.iter().next() else {
        return true;
    };
    let age = oldest.since.elapsed();
    if age >= STALE_HANDSHAKE {
        if let Some(evicted) = conns.pending.remove(&old) {
            tracing::warn!(
                "rendezvous store: {MAX_PENDING_HANDSHAKES} handshakes in progress; dropped the \
                 oldest, from {} ({age:.1?} without authenticating), to admit a waiting \
                 connection",
                evicted.peer
            );
            let _ = evicted.stream.shutdown(Shutdown::Both);
        }
        return true;
    }
    let wait = (STALE_HANDSHAKE - age).min(ACCEPT_POLL);
    drop(
        shared
            .slot_freed
            .wait_timeout(conns, wait)
            .unwrap_or_else(PoisonError::into_inner),
    );
    false
}

/// Waits until `listener` has a connection to accept or `timeout` passes.
fn wait_readable(listener: &TcpListener, timeout: Duration) -> io::Result<()> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let timeout = Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    poll(&mut [PollFd::new(listener, PollFlags::IN)], Some(&timeout))?;
    Ok(())
}

/// Registers a new connection as pending and starts its thread (the accept loop made room for
/// it first).
fn admit(shared: &Arc<Shared>, stream: TcpStream, peer: SocketAddr) {
    if let Err(e) = stream.set_nonblocking(false) {
        tracing::warn!("rendezvous store: dropped connection from {peer}: {e}");
        return;
    }
    let _ = stream.set_nodelay(true);
    let stream = Arc::new(stream);
    let id = {
        let mut conns = lock(&shared.conns);
        // Checked under the lock that shutdown takes to close everything (see Drop).
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let id = conns.next_id;
        conns.next_id += 1;
        let pending = Pending {
            stream: Arc::clone(&stream),
            peer,
            since: Instant::now(),
        };
        conns.pending.insert(id, pending);
        id
    };
    *lock(&shared.threads) += 1;
    let for_thread = Arc::clone(shared);
    let spawned = thread::Builder::new()
        .name("hcomm-store-conn".into())
        .stack_size(CONN_STACK)
        .spawn(move || {
            let shared = for_thread;
            let _live = LiveThread(&shared);
            serve_connection(&shared, id, &stream, peer);
        });
    if let Err(e) = spawned {
        tracing::warn!("rendezvous store: dropped connection from {peer}: no thread: {e}");
        lock(&shared.conns).pending.remove(&id);
        shared.slot_freed.notify_all();
        drop(LiveThread(shared));
    }
}

/// Counts a connection thread out when dropped.
struct LiveThread<'a>(&'a Shared);

impl Drop for LiveThread<'_> {
    fn drop(&mut self) {
        let mut live = lock(&self.0.threads);
        *live = live.saturating_sub(1);
        self.0.threads_done.notify_all();
    }
}

/// Authenticates one connection, then serves its requests until it closes.
fn serve_connection(shared: &Shared, id: u64, stream: &Arc<TcpStream>, peer: SocketAddr) {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let hello = auth::server_handshake_shared(stream, &shared.secret, STORE_HELLO, deadline);
    {
        let mut conns = lock(&shared.conns);
        let still_pending = conns.pending.remove(&id).is_some();
        shared.slot_freed.notify_all();
        let refusal = match &hello {
            Err(e) => Some(e.to_string()),
            Ok(h) if h != STORE_HELLO => Some(hello_mismatch(h, "store client")),
            // Evicted or shut down while finishing the handshake: the socket is closed.
            Ok(_) if !still_pending || shared.stopping.load(Ordering::SeqCst) => return,
            Ok(_) if conns.clients.len() >= MAX_CLIENTS => {
                Some(format!("already serving {MAX_CLIENTS} clients"))
            }
            Ok(_) => None,
        };
        if let Some(why) = refusal {
            drop(conns);
            tracing::warn!("rendezvous store: dropped connection from {peer}: {why}");
            return;
        }
        conns.clients.insert(id, Arc::clone(stream));
    }
    // An idle client blocks its thread on a read with no deadline; keepalive probes reap the
    // connection of a host that vanished without closing it.
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10));
    let _ = socket2::SockRef::from(&**stream).set_tcp_keepalive(&keepalive);
    serve_requests(shared, stream, peer);
    lock(&shared.conns).clients.remove(&id);
}

/// Why a peer whose hello is `hello` (not [`STORE_HELLO`]) is refused; `what` it should be
/// ("store client" or "store").
fn hello_mismatch(hello: &[u8], what: &str) -> String {
    if hello.starts_with(STORE_HELLO_FAMILY) {
        format!(
            "a rendezvous {what} of protocol {:?}, but this side speaks {:?}: every rank and the \
             launcher must run the same hcomm version",
            String::from_utf8_lossy(&hello[..hello.len().min(64)]),
            String::from_utf8_lossy(STORE_HELLO)
        )
    } else {
        format!("authenticated, but not a rendezvous {what}")
    }
}

/// Why a connection stopped being served.
enum Stop {
    /// The client closed the connection (or the store is shutting down).
    Closed,
    /// The client broke the protocol or timed out: drop it and say why.
    Dropped(String),
}

fn serve_requests(shared: &Shared, stream: &TcpStream, peer: SocketAddr) {
    loop {
        match serve_one(shared, stream) {
            Ok(()) => {}
            Err(Stop::Closed) => {
                tracing::debug!("rendezvous store: {peer} disconnected");
                return;
            }
            Err(Stop::Dropped(why)) => {
                tracing::warn!("rendezvous store: dropped client {peer}: {why}");
                return;
            }
        }
    }
}

/// Reads one request, answers it.
fn serve_one(shared: &Shared, stream: &TcpStream) -> std::result::Result<(), Stop> {
    let mut op = [0u8; 1];
    // An authenticated client may stay idle as long as it likes: block without a deadline.
    // Shutdown closes the socket, which ends this read.
    let _ = stream.set_read_timeout(None);
    let mut reader = stream;
    loop {
        match reader.read(&mut op) {
            Ok(0) => return Err(Stop::Closed),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Stop::Dropped(format!("reading a request: {e}"))),
        }
    }
    if shared.stopping.load(Ordering::SeqCst) {
        return Err(Stop::Closed);
    }
    serve_request(shared, stream, op[0])
}

/// Reads the rest of a request whose first byte, `op`, has arrived, and answers it.
fn serve_request<S: TimedStream + ?Sized>(
    shared: &Shared,
    stream: &S,
    op: u8,
) -> std::result::Result<(), Stop> {
    let mut header = [op; REQUEST_HEADER];
    let deadline = Instant::now() + FRAME_TIMEOUT;
    let io_err = |what: &str, e: io::Error| Stop::Dropped(format!("{what}: {e}"));
    read_exact_until(stream, &mut header[1..], deadline)
        .map_err(|e| io_err("reading a request header", e))?;
    let key_len = u16::from_le_bytes([header[1], header[2]]) as usize;
    let value_len = u32::from_le_bytes([header[3], header[4], header[5], header[6]]) as usize;
    let expected_value = match op {
        OP_SET => value_len <= MAX_VALUE,
        OP_GET | OP_DELETE => value_len == 0,
        OP_WAIT | OP_ADD => value_len == 8,
        OP_WAIT_ALL => {
            value_len > 8 && (value_len - 8) % 4 == 0 && (value_len - 8) / 4 <= MAX_WAIT_ALL
        }
        _ => return Err(Stop::Dropped(format!("unknown request type {op}"))),
    };
    if key_len > MAX_KEY || !expected_value {
        return Err(Stop::Dropped(format!(
            "malformed {} request: key of {key_len} bytes, value of {value_len} bytes",
            op_name(op)
        )));
    }
    let key = read_vec_until(stream, key_len, deadline).map_err(|e| io_err("reading a key", e))?;
    let value =
        read_vec_until(stream, value_len, deadline).map_err(|e| io_err("reading a value", e))?;

    let (status, payload) = match op {
        OP_SET => lock(&shared.table).set(key, value),
        OP_GET => lock(&shared.table).get(&key),
        OP_WAIT => {
            let ms = u64::from_le_bytes(value.as_slice().try_into().unwrap_or_default());
            wait_for(shared, &key, Duration::from_millis(ms).min(shared.max_wait))?
        }
        OP_WAIT_ALL => {
            let (ms, indices) = value.split_at(8);
            let ms = u64::from_le_bytes(ms.try_into().unwrap_or_default());
            let indices: Vec<u32> = indices
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect();
            if let Some(i) = first_duplicate(&indices) {
                return Err(Stop::Dropped(format!(
                    "malformed wait all request: index {i} named twice"
                )));
            }
            let timeout = Duration::from_millis(ms).min(shared.max_wait);
            wait_for_all(shared, &key, &indices, timeout)?
        }
        OP_ADD => {
            let delta = i64::from_le_bytes(value.as_slice().try_into().unwrap_or_default());
            lock(&shared.table).add(key, delta)
        }
        _ => lock(&shared.table).delete(&key),
    };
    if op == OP_SET || op == OP_ADD {
        shared.changed.notify_all();
    }

    let mut head = [0u8; REPLY_HEADER];
    head[0] = status;
    head[1..].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let deadline = Instant::now() + FRAME_TIMEOUT;
    write_all_until(stream, &head, deadline).map_err(|e| io_err("sending a reply", e))?;
    write_all_until(stream, &payload, deadline).map_err(|e| io_err("sending a reply", e))?;
    Ok(())
}

/// Blocks until `key` exists, `timeout` passes or the store shuts down.
fn wait_for(
    shared: &Shared,
    key: &[u8],
    timeout: Duration,
) -> std::result::Result<(u8, Vec<u8>), Stop> {
    let deadline = Instant::now() + timeout;
    let mut table = lock(&shared.table);
    loop {
        if let Some(value) = table.map.get(key) {
            return Ok((ST_OK, value.clone()));
        }
        if shared.stopping.load(Ordering::SeqCst) {
            return Err(Stop::Closed);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok((ST_TIMED_OUT, Vec::new()));
        }
        table = shared
            .changed
            .wait_timeout(table, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// An index that `indices` holds more than once.
fn first_duplicate(indices: &[u32]) -> Option<u32> {
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// `prefix` followed by `index` in decimal: the key of one member of a wait-all set.
fn indexed_key(key: &mut Vec<u8>, prefix: &[u8], index: u32) {
    use std::io::Write;
    key.clear();
    key.extend_from_slice(prefix);
    // Writing to a vector cannot fail.
    let _ = write!(key, "{index}");
}

/// Blocks until every key `prefix` + index of `indices` exists (then replies with their values
/// in order, each behind its length), `timeout` passes (then names the missing ones) or the
/// store shuts down.
fn wait_for_all(
    shared: &Shared,
    prefix: &[u8],
    indices: &[u32],
    timeout: Duration,
) -> std::result::Result<(u8, Vec<u8>), Stop> {
    let deadline = Instant::now() + timeout;
    let mut key = Vec::with_capacity(prefix.len() + 10);
    // Every key before `next` was there at the last look: only the rest is looked up again.
    let mut next = 0;
    let mut table = lock(&shared.table);
    loop {
        while let Some(&i) = indices.get(next) {
            indexed_key(&mut key, prefix, i);
            if !table.map.contains_key(&key) {
                break;
            }
            next += 1;
        }
        if next == indices.len() {
            // All seen; one pass under this lock gathers them, or finds one deleted since.
            match table.gather(prefix, indices, &mut key) {
                Ok(reply) => return Ok(reply),
                Err(missing) => next = missing,
            }
            continue;
        }
        if shared.stopping.load(Ordering::SeqCst) {
            return Err(Stop::Closed);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok((ST_TIMED_OUT, table.missing(prefix, indices, &mut key)));
        }
        table = shared
            .changed
            .wait_timeout(table, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// The key/value data and its size accounting.
struct Table {
    map: HashMap<Vec<u8>, Vec<u8>>,
    /// Sum of key and value lengths of all entries.
    bytes: usize,
    max_bytes: usize,
}

impl Table {
    fn new(max_bytes: usize) -> Table {
        Table {
            map: HashMap::new(),
            bytes: 0,
            max_bytes,
        }
    }

    /// Stores `key = value` if it fits; the reply to send.
    fn set(&mut self, key: Vec<u8>, value: Vec<u8>) -> (u8, Vec<u8>) {
        let old = self.map.get(&key).map_or(0, |v| key.len() + v.len());
        let new_total = self.bytes - old + key.len() + value.len();
        if new_total > self.max_bytes {
            let msg = format!(
                "the rendezvous store is full ({} bytes, limit {}): cannot store {}",
                self.bytes,
                self.max_bytes,
                show_key(&key)
            );
            return (ST_FULL, msg.into_bytes());
        }
        self.bytes = new_total;
        self.map.insert(key, value);
        (ST_OK, Vec::new())
    }

    fn get(&self, key: &[u8]) -> (u8, Vec<u8>) {
        match self.map.get(key) {
            Some(v) => (ST_OK, v.clone()),
            None => (ST_NOT_FOUND, Vec::new()),
        }
    }

    fn add(&mut self, key: Vec<u8>, delta: i64) -> (u8, Vec<u8>) {
        let current = match self.map.get(&key) {
            None => 0,
            Some(v) => match <[u8; 8]>::try_from(v.as_slice()) {
                Ok(bytes) => i64::from_le_bytes(bytes),
                Err(_) => {
                    let msg = format!(
                        "{} holds {} bytes, not a counter made by add",
                        show_key(&key),
                        v.len()
                    );
                    return (ST_INVALID, msg.into_bytes());
                }
            },
        };
        let Some(sum) = current.checked_add(delta) else {
            let msg = format!("adding {delta} to {} ({current}) overflows", show_key(&key));
            return (ST_INVALID, msg.into_bytes());
        };
        let sum_bytes = sum.to_le_bytes().to_vec();
        match self.set(key, sum_bytes.clone()) {
            (ST_OK, _) => (ST_OK, sum_bytes),
            failed => failed,
        }
    }

    /// The reply to a wait-all of `prefix` and `indices` whose keys all exist, or the position
    /// in `indices` of one that does not. A reply too long for the wire is refused.
    fn gather(
        &self,
        prefix: &[u8],
        indices: &[u32],
        key: &mut Vec<u8>,
    ) -> std::result::Result<(u8, Vec<u8>), usize> {
        let mut total = 0usize;
        for (pos, &i) in indices.iter().enumerate() {
            indexed_key(key, prefix, i);
            match self.map.get(key.as_slice()) {
                Some(v) => total += 4 + v.len(),
                None => return Err(pos),
            }
        }
        if total > MAX_VALUE {
            let msg = format!(
                "the {} values under {} total {total} bytes, more than the {MAX_VALUE} bytes of \
                 one reply: wait for fewer keys at a time",
                indices.len(),
                show_key(prefix)
            );
            return Ok((ST_INVALID, msg.into_bytes()));
        }
        let mut reply = Vec::with_capacity(total);
        for &i in indices {
            indexed_key(key, prefix, i);
            let v = self.map.get(key.as_slice()).map_or(&[][..], Vec::as_slice);
            reply.extend_from_slice(&(v.len() as u32).to_le_bytes());
            reply.extend_from_slice(v);
        }
        Ok((ST_OK, reply))
    }

    /// A message naming the indices whose keys `prefix` + index do not exist (the first few).
    fn missing(&self, prefix: &[u8], indices: &[u32], key: &mut Vec<u8>) -> Vec<u8> {
        const SHOWN: usize = 32;
        let mut absent = Vec::new();
        for &i in indices {
            indexed_key(key, prefix, i);
            if !self.map.contains_key(key.as_slice()) {
                absent.push(i);
            }
        }
        let mut msg = format!(
            "{} of {} keys {}<index> missing, indices {:?}",
            absent.len(),
            indices.len(),
            show_key(prefix),
            &absent[..absent.len().min(SHOWN)]
        );
        if absent.len() > SHOWN {
            msg.push_str(" ...");
        }
        // At most 32 indices and a 64-character key: well within MAX_MESSAGE.
        msg.into_bytes()
    }

    fn delete(&mut self, key: &[u8]) -> (u8, Vec<u8>) {
        match self.map.remove(key) {
            Some(v) => {
                self.bytes -= key.len() + v.len();
                (ST_OK, Vec::new())
            }
            None => (ST_NOT_FOUND, Vec::new()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------------

/// An authenticated connection to a [`RendezvousStore`].
///
/// Requests are bounded by the timeout given to [`connect`](StoreClient::connect) (and
/// [`wait`](StoreClient::wait) by its own). After an I/O error the connection is in an unknown
/// state, so every later request fails: connect again.
#[derive(Debug)]
pub struct StoreClient {
    stream: TcpStream,
    addr: String,
    local_addr: SocketAddr,
    io_timeout: Duration,
    broken: bool,
}

/// Outcome of one connection attempt.
enum Attempt {
    Done(StoreClient),
    /// Worth trying again (refused, unreachable, shed by a busy store); the reason, `None`
    /// when the deadline came before any address was tried.
    Retry(Option<String>),
    Fatal(Error),
}

impl StoreClient {
    /// Connects to the store at `addr` (`host:port`) and authenticates with `secret`.
    ///
    /// Refused or shed connections are retried until `timeout`, since the store may start
    /// after its clients. `timeout` also bounds each later request. Errors: [`Error::Timeout`]
    /// when the store cannot be reached in time, [`Error::Init`] when authentication fails
    /// (wrong secret), [`Error::InvalidArgument`] for an unparsable address or empty secret.
    pub fn connect(addr: &str, secret: &[u8], timeout: Duration) -> Result<StoreClient> {
        StoreClient::connect_until(addr, secret, timeout, deadline_after(timeout))
    }

    /// [`StoreClient::connect`], its tries ending at `deadline` (`timeout` still bounds each
    /// later request, and is the time the error of a store not reached says was spent).
    pub(crate) fn connect_until(
        addr: &str,
        secret: &[u8],
        timeout: Duration,
        deadline: Instant,
    ) -> Result<StoreClient> {
        if secret.is_empty() {
            return Err(Error::invalid_argument(
                "the job secret is empty: set HCOMM_JOB_SECRET to the store's secret",
            ));
        }
        let mut backoff = Duration::from_millis(10);
        let mut why = String::from("none made");
        loop {
            match attempt(addr, secret, timeout, deadline) {
                Attempt::Done(client) => return Ok(client),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Retry(Some(last)) => why = last,
                Attempt::Retry(None) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout(format!(
                    "could not connect to the rendezvous store at {addr} within {timeout:?} \
                     (last attempt: {why}): check HCOMM_ROOT_ADDR and that the store is running"
                )));
            }
            tracing::debug!("rendezvous store at {addr} not ready ({why}); retrying");
            thread::sleep(jittered(backoff).min(left));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Stores `value` under `key`, replacing any previous value, and wakes its waiters.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        match self.request(OP_SET, key, value, Duration::ZERO)? {
            (ST_OK, _) => Ok(()),
            other => Err(self.unexpected(OP_SET, key, other)),
        }
    }

    /// The value under `key`, or `None` when there is none.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
        match self.request(OP_GET, key, &[], Duration::ZERO)? {
            (ST_OK, value) => Ok(Some(value)),
            (ST_NOT_FOUND, _) => Ok(None),
            other => Err(self.unexpected(OP_GET, key, other)),
        }
    }

    /// Blocks until `key` exists and returns its value; the store does the waiting.
    ///
    /// Errors with [`Error::Timeout`] naming the key when `timeout` passes first.
    pub fn wait(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = deadline_after(timeout);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = left.min(MAX_WAIT);
            // Round up so a sub-millisecond rest does not become a busy loop of zero waits.
            let ms = chunk.as_nanos().div_ceil(1_000_000) as u64;
            match self.request(OP_WAIT, key, &ms.to_le_bytes(), chunk)? {
                (ST_OK, value) => return Ok(value),
                (ST_TIMED_OUT, _) if Instant::now() >= deadline => {
                    return Err(Error::timeout(format!(
                        "key {key:?} did not appear in the rendezvous store at {} within \
                         {timeout:?}: a rank is slow, stuck or missing",
                        self.addr
                    )))
                }
                (ST_TIMED_OUT, _) => {}
                other => return Err(self.unexpected(OP_WAIT, key, other)),
            }
        }
    }

    /// Blocks until every key `prefix` + `i` (`i` in decimal) for `i` in `indices` exists and
    /// returns their values in the order of `indices`, in one request: the store does the
    /// waiting, so gathering what every rank of a job published costs one round trip, not one
    /// per rank.
    ///
    /// Errors: [`Error::InvalidArgument`] when `indices` names an index twice, more than
    /// [`MAX_WAIT_ALL`] of them, one whose key would exceed the key limit, or the values
    /// together exceed [`MAX_VALUE`]; [`Error::Timeout`] naming the missing indices when
    /// `timeout` passes first.
    pub fn wait_all(
        &mut self,
        prefix: &str,
        indices: &[usize],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        let request = wait_all_request(prefix, indices)?;
        if indices.is_empty() {
            return Ok(Vec::new());
        }
        let deadline = deadline_after(timeout);
        let mut value = request;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = left.min(MAX_WAIT);
            // Round up so a sub-millisecond rest does not become a busy loop of zero waits.
            let ms = chunk.as_nanos().div_ceil(1_000_000) as u64;
            value[..8].copy_from_slice(&ms.to_le_bytes());
            match self.request(OP_WAIT_ALL, prefix, &value, chunk)? {
                (ST_OK, payload) => {
                    return split_values(&payload, indices.len()).map_err(|why| {
                        self.broken = true;
                        Error::transport_failed(format!(
                            "the rendezvous store at {} gave a malformed reply to the wait all \
                             of {prefix:?}: {why}",
                            self.addr
                        ))
                    })
                }
                (ST_TIMED_OUT, missing) if Instant::now() >= deadline => {
                    return Err(Error::timeout(format!(
                        "keys {prefix:?}<index> did not all appear in the rendezvous store at \
                         {} within {timeout:?} ({}): a rank is slow, stuck or missing",
                        self.addr,
                        String::from_utf8_lossy(&missing)
                    )))
                }
                (ST_TIMED_OUT, _) => {}
                other => return Err(self.unexpected(OP_WAIT_ALL, prefix, other)),
            }
        }
    }

    /// Atomically adds `delta` to the counter at `key` (a missing key counts as 0) and
    /// returns the new value.
    ///
    /// Errors with [`Error::InvalidArgument`] when `key` holds something other than a counter
    /// or the sum overflows.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        match self.request(OP_ADD, key, &delta.to_le_bytes(), Duration::ZERO)? {
            (ST_OK, value) if value.len() == 8 => Ok(i64::from_le_bytes(
                value.as_slice().try_into().unwrap_or_default(),
            )),
            other => Err(self.unexpected(OP_ADD, key, other)),
        }
    }

    /// Deletes `key`; returns whether it existed.
    pub fn delete(&mut self, key: &str) -> Result<bool> {
        match self.request(OP_DELETE, key, &[], Duration::ZERO)? {
            (ST_OK, _) => Ok(true),
            (ST_NOT_FOUND, _) => Ok(false),
            other => Err(self.unexpected(OP_DELETE, key, other)),
        }
    }

    /// The local address of this connection: the interface that routes to the store.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Sends one request and reads its reply; `extra` is how long the store may hold the
    /// request (a wait) on top of the request timeout.
    fn request(
        &mut self,
        op: u8,
        key: &str,
        value: &[u8],
        extra: Duration,
    ) -> Result<(u8, Vec<u8>)> {
        if key.len() > MAX_KEY {
            return Err(Error::invalid_argument(format!(
                "store key of {} bytes exceeds the limit of {MAX_KEY} bytes",
                key.len()
            )));
        }
        if value.len() > MAX_VALUE {
            return Err(Error::invalid_argument(format!(
                "store value of {} bytes for key {key:?} exceeds the limit of {MAX_VALUE} bytes",
                value.len()
            )));
        }
        if self.broken {
            return Err(Error::transport_failed(format!(
                "the connection to the rendezvous store at {} failed earlier; reconnect",
                self.addr
            )));
        }
        let wait = self.io_timeout.saturating_add(extra);
        let result = self.exchange(op, key.as_bytes(), value, deadline_after(wait));
        result.map_err(|e| {
            self.broken = true;
            let what = format!("{} of key {key:?}", op_name(op));
            match e.kind() {
                io::ErrorKind::TimedOut => Error::timeout(format!(
                    "the rendezvous store at {} did not answer the {what} within {wait:?}",
                    self.addr
                ))
                .with_source(e),
                io::ErrorKind::UnexpectedEof => Error::transport_failed(format!(
                    "the rendezvous store at {} closed the connection during the {what}: the \
                     store stopped (it ends with the process that serves it, rank 0 unless a \
                     launcher serves it: that process's own error says why) or dropped us",
                    self.addr
                ))
                .with_source(e),
                _ => Error::transport(format!("rendezvous store at {}: {what}", self.addr), e),
            }
        })
    }

    fn exchange(
        &self,
        op: u8,
        key: &[u8],
        value: &[u8],
        deadline: Instant,
    ) -> io::Result<(u8, Vec<u8>)> {
        write_all_until(&self.stream, &request_head(op, key, value.len()), deadline)?;
        write_all_until(&self.stream, value, deadline)?;
        read_reply(&self.stream, deadline)
    }

    /// The error for a reply that is not a success of `op`.
    fn unexpected(&mut self, op: u8, key: &str, (status, payload): (u8, Vec<u8>)) -> Error {
        let message = String::from_utf8_lossy(&payload).into_owned();
        match status {
            ST_INVALID => Error::invalid_argument(message),
            ST_FULL => Error::no_mem(message),
            _ => {
                // The two ends disagree about the protocol: do not trust the stream again.
                self.broken = true;
                Error::transport_failed(format!(
                    "the rendezvous store at {} gave an unexpected reply (status {status}, {} \
                     bytes) to the {} of key {key:?}",
                    self.addr,
                    payload.len(),
                    op_name(op)
                ))
            }
        }
    }
}

/// Longest pause between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// A pause between half of `backoff` and all of it, drawn at random: the ranks of a job that
/// were shed together do not all come back at the same moment.
fn jittered(backoff: Duration) -> Duration {
    let fraction = getrandom::u32().unwrap_or(u32::MAX) as f64 / u32::MAX as f64;
    backoff.mul_f64(0.5 + 0.5 * fraction)
}

/// A request's header and key; the value follows it. `key` and `value_len` are within their
/// limits.
fn request_head(op: u8, key: &[u8], value_len: usize) -> Vec<u8> {
    let mut head = Vec::with_capacity(REQUEST_HEADER + key.len());
    head.push(op);
    head.extend_from_slice(&(key.len() as u16).to_le_bytes());
    head.extend_from_slice(&(value_len as u32).to_le_bytes());
    head.extend_from_slice(key);
    head
}

/// The value of a wait-all request for `prefix` and `indices`, its first 8 bytes (the
/// timeout) left zero; checks what the store would refuse.
fn wait_all_request(prefix: &str, indices: &[usize]) -> Result<Vec<u8>> {
    if indices.len() > MAX_WAIT_ALL {
        return Err(Error::invalid_argument(format!(
            "a wait for {} store keys exceeds the limit of {MAX_WAIT_ALL} keys",
            indices.len()
        )));
    }
    let mut value = vec![0u8; 8];
    let mut seen = std::collections::HashSet::with_capacity(indices.len());
    for &i in indices {
        let index = u32::try_from(i)
            .ok()
            .filter(|_| prefix.len() + i.to_string().len() <= MAX_KEY)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "store key {prefix:?}{i} exceeds the limit of {MAX_KEY} bytes"
                ))
            })?;
        if !seen.insert(index) {
            return Err(Error::invalid_argument(format!(
                "a wait for store keys {prefix:?}<index> names index {i} twice"
            )));
        }
        value.extend_from_slice(&index.to_le_bytes());
    }
    Ok(value)
}

/// Splits the payload of a successful wait-all reply into its `count` values; says what is
/// wrong when the lengths do not add up to exactly that.
fn split_values(payload: &[u8], count: usize) -> std::result::Result<Vec<Vec<u8>>, String> {
    let mut values = Vec::with_capacity(count.min(payload.len() / 4));
    let mut rest = payload;
    for n in 0..count {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(format!(
                "{} bytes end inside the length of value {n}",
                rest.len()
            ));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len > tail.len() {
            return Err(format!(
                "value {n} claims {len} bytes, {} remain",
                tail.len()
            ));
        }
        let (value, tail) = tail.split_at(len);
        values.push(value.to_vec());
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes after the {count} values", rest.len()));
    }
    Ok(values)
}

/// Reads one reply (status and payload), checking its length before reading the payload.
fn read_reply<S: TimedStream + ?Sized>(stream: &S, deadline: Instant) -> io::Result<(u8, Vec<u8>)> {
    let mut reply = [0u8; REPLY_HEADER];
    read_exact_until(stream, &mut reply, deadline)?;
    let status = reply[0];
    let len = u32::from_le_bytes([reply[1], reply[2], reply[3], reply[4]]) as usize;
    let limit = if status == ST_OK {
        MAX_VALUE
    } else {
        MAX_MESSAGE
    };
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("malformed reply: status {status} with {len} bytes"),
        ));
    }
    let payload = read_vec_until(stream, len, deadline)?;
    Ok((status, payload))
}

/// One try at connecting and authenticating.
fn attempt(addr: &str, secret: &[u8], io_timeout: Duration, deadline: Instant) -> Attempt {
    let targets: Vec<SocketAddr> = match addr.to_socket_addrs() {
        Ok(t) => t.collect(),
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
            return Attempt::Fatal(Error::invalid_argument(format!(
                "rendezvous store address {addr:?} is not host:port: {e}"
            )))
        }
        // Name resolution may fail while the store's host is still coming up.
        Err(e) => return Attempt::Retry(Some(format!("resolving {addr}: {e}"))),
    };
    let mut why = targets
        .is_empty()
        .then(|| format!("{addr} resolved to no address"));
    for target in targets {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let stream = match TcpStream::connect_timeout(&target, left) {
            Ok(s) => s,
            Err(e) => {
                why = Some(format!("connecting to {target}: {e}"));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match auth::client_handshake_detailed(&stream, secret, STORE_HELLO, deadline) {
            Ok(hello) if hello == STORE_HELLO => {}
            Ok(hello) if hello.starts_with(STORE_HELLO_FAMILY) => {
                return Attempt::Fatal(Error::init(format!(
                    "{target} is {}",
                    hello_mismatch(&hello, "store")
                )))
            }
            Ok(_) => {
                return Attempt::Fatal(Error::init(format!(
                    "{target} is an hcomm process of this job but not a rendezvous store: check \
                     HCOMM_ROOT_ADDR"
                )))
            }
            Err(e) if e.retryable => {
                why = Some(e.error.to_string());
                continue;
            }
            Err(e) => return Attempt::Fatal(*e.error),
        }
        let local_addr = match stream.local_addr() {
            Ok(a) => a,
            Err(e) => {
                return Attempt::Fatal(Error::transport(
                    format!("rendezvous store at {addr}: local address"),
                    e,
                ))
            }
        };
        return Attempt::Done(StoreClient {
            stream,
            addr: addr.to_string(),
            local_addr,
            io_timeout,
            broken: false,
        });
    }
    Attempt::Retry(why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const SECRET: &[u8] = b"unit-test-secret";
    const T: Duration = Duration::from_secs(5);

    fn store() -> (RendezvousStore, String) {
        let store = RendezvousStore::bind("127.0.0.1:0".parse().unwrap(), SECRET).unwrap();
        let addr = store.local_addr().to_string();
        (store, addr)
    }

    /// An authenticated raw connection, for sending frames a real client never would.
    fn raw_client(addr: &str) -> TcpStream {
        let stream = TcpStream::connect(addr).unwrap();
        let deadline = Instant::now() + T;
        let hello = auth::client_handshake_detailed(&stream, SECRET, STORE_HELLO, deadline);
        assert_eq!(hello.unwrap(), STORE_HELLO);
        stream.set_read_timeout(Some(T)).unwrap();
        stream
    }

    fn assert_closed_by_server(mut stream: &TcpStream) {
        let mut buf = [0u8; 16];
        match stream.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("expected the store to close the connection, got {other:?}"),
        }
    }

    #[test]
    fn table_accounts_bytes_and_enforces_the_limit() {
        let mut t = Table::new(20);
        assert_eq!(t.set(b"a".to_vec(), vec![0; 9]).0, ST_OK);
        assert_eq!(t.bytes, 10);
        assert_eq!(t.set(b"a".to_vec(), vec![0; 4]).0, ST_OK);
        assert_eq!(t.bytes, 5);
        assert_eq!(t.set(b"b".to_vec(), vec![0; 15]).0, ST_FULL);
        assert_eq!(t.set(b"b".to_vec(), vec![0; 14]).0, ST_OK);
        assert_eq!(t.bytes, 20);
        assert_eq!(t.add(b"c".to_vec(), 1).0, ST_FULL);
        assert_eq!(t.delete(b"b").0, ST_OK);
        assert_eq!(t.delete(b"b").0, ST_NOT_FOUND);
        assert_eq!(t.bytes, 5);
        assert_eq!(
            t.add(b"c".to_vec(), 1),
            (ST_OK, 1i64.to_le_bytes().to_vec())
        );
        assert_eq!(t.bytes, 14);
    }

    #[test]
    fn add_rejects_non_counters_and_overflow() {
        let mut t = Table::new(1000);
        t.set(b"s".to_vec(), b"text".to_vec());
        assert_eq!(t.add(b"s".to_vec(), 1).0, ST_INVALID);
        assert_eq!(t.add(b"n".to_vec(), i64::MAX).0, ST_OK);
        assert_eq!(t.add(b"n".to_vec(), 1).0, ST_INVALID);
        assert_eq!(
            t.add(b"n".to_vec(), -1),
            (ST_OK, (i64::MAX - 1).to_le_bytes().to_vec())
        );
    }

    /// A store given an expiry stops by itself then: its connected client is cut off and a
    /// new one cannot connect; one kept before its expiry serves on.
    #[test]
    fn a_store_stops_at_its_expiry_unless_kept() {
        let (expiring, addr) = store();
        let mut c = StoreClient::connect(&addr, SECRET, T).unwrap();
        c.set("k", b"v").unwrap();
        expiring.expire_at(Instant::now() + Duration::from_millis(100));
        let (kept, kept_addr) = store();
        kept.expire_at(Instant::now() + Duration::from_millis(100));
        assert!(kept.keep());
        let until = Instant::now() + T;
        while !expiring.expired() {
            assert!(Instant::now() < until, "the store did not expire");
            thread::sleep(Duration::from_millis(10));
        }
        assert!(!expiring.keep(), "an expired store was kept");
        assert!(
            c.get("k").is_err(),
            "the client of an expired store still reads"
        );
        let short = Duration::from_millis(300);
        assert!(StoreClient::connect(&addr, SECRET, short).is_err());
        assert!(!kept.expired());
        let mut k = StoreClient::connect(&kept_addr, SECRET, T).unwrap();
        k.set("k", b"v").unwrap();
        assert_eq!(k.get("k").unwrap().unwrap(), b"v");
    }

    #[test]
    fn add_on_a_non_counter_is_an_invalid_argument_and_keeps_the_connection() {
        let (_store, addr) = store();
        let mut c = StoreClient::connect(&addr, SECRET, T).unwrap();
        c.set("text", b"hello").unwrap();
        assert!(matches!(c.add("text", 1), Err(Error::InvalidArgument(_))));
        assert_eq!(c.get("text").unwrap().unwrap(), b"hello");
    }

    #[test]
    fn client_rejects_oversized_key_and_value_locally() {
        let (_store, addr) = store();
        let mut c = StoreClient::connect(&addr, SECRET, T).unwrap();
        let long_key = "k".repeat(MAX_KEY + 1);
        assert!(matches!(
            c.set(&long_key, b""),
            Err(Error::InvalidArgument(_))
        ));
        let big = vec![0u8; MAX_VALUE + 1];
        assert!(matches!(c.set("k", &big), Err(Error::InvalidArgument(_))));
        c.set(&"k".repeat(MAX_KEY), b"ok").unwrap();
        assert_eq!(c.get(&"k".repeat(MAX_KEY)).unwrap().unwrap(), b"ok");
    }

    #[test]
    fn authenticated_garbage_is_dropped_and_others_keep_working() {
        let (_store, addr) = store();
        let mut good = StoreClient::connect(&addr, SECRET, T).unwrap();
        // Unknown op.
        let bad = raw_client(&addr);
        (&bad).write_all(&[99, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_closed_by_server(&bad);
        // Key longer than MAX_KEY.
        let bad = raw_client(&addr);
        (&bad).write_all(&[OP_GET, 0xff, 0xff, 0, 0, 0, 0]).unwrap();
        assert_closed_by_server(&bad);
        // Value claiming 4 GiB: dropped before anything is allocated.
        let bad = raw_client(&addr);
        (&bad)
            .write_all(&[OP_SET, 1, 0, 0xff, 0xff, 0xff, 0xff])
            .unwrap();
        assert_closed_by_server(&bad);
        // A wait with the wrong value size.
        let bad = raw_client(&addr);
        (&bad)
            .write_all(&[OP_WAIT, 1, 0, 1, 0, 0, 0, b'k', 0])
            .unwrap();
        assert_closed_by_server(&bad);
        good.set("still", b"fine").unwrap();
        assert_eq!(good.get("still").unwrap().unwrap(), b"fine");
    }

    #[test]
    fn raw_frames_round_trip() {
        let (_store, addr) = store();
        let raw = raw_client(&addr);
        (&raw)
            .write_all(&[OP_SET, 1, 0, 2, 0, 0, 0, b'k', b'v', b'w'])
            .unwrap();
        let mut reply = [0u8; REPLY_HEADER];
        (&raw).read_exact(&mut reply).unwrap();
        assert_eq!(reply, [ST_OK, 0, 0, 0, 0]);
        (&raw).write_all(&[OP_GET, 1, 0, 0, 0, 0, 0, b'k']).unwrap();
        let mut reply = [0u8; REPLY_HEADER + 2];
        (&raw).read_exact(&mut reply).unwrap();
        assert_eq!(reply, [ST_OK, 2, 0, 0, 0, b'v', b'w']);
    }

    #[test]
    fn client_that_is_not_a_store_client_is_dropped() {
        let (_store, addr) = store();
        let stream = TcpStream::connect(&addr).unwrap();
        let deadline = Instant::now() + T;
        // Authenticates (same secret) but announces another protocol.
        auth::client_handshake_detailed(&stream, SECRET, b"hcomm-tcp/1", deadline).unwrap();
        stream.set_read_timeout(Some(T)).unwrap();
        assert_closed_by_server(&stream);
    }

    #[test]
    fn unparsable_address_is_an_invalid_argument() {
        let err = StoreClient::connect("no-port-here", SECRET, T).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    }

    #[test]
    fn empty_secret_is_rejected() {
        let addr = "127.0.0.1:0".parse().unwrap();
        assert!(matches!(
            RendezvousStore::bind(addr, b""),
            Err(Error::InvalidArgument(_))
        ));
        let err = StoreClient::connect("127.0.0.1:1", b"", T).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
    }

    #[test]
    fn drop_wakes_waiters_and_returns_promptly() {
        let (store, addr) = store();
        let mut c = StoreClient::connect(&addr, SECRET, T).unwrap();
        let waiter = thread::spawn(move || {
            let start = Instant::now();
            (c.wait("never", Duration::from_secs(20)), start.elapsed())
        });
        thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        drop(store);
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "drop took {:?}",
            start.elapsed()
        );
        let (result, waited) = waiter.join().unwrap();
        assert!(matches!(result, Err(Error::Transport(_))), "{result:?}");
        assert!(waited < Duration::from_secs(2));
    }

    #[test]
    fn wait_all_returns_every_value_in_order_once_all_exist() {
        let (_store, addr) = store();
        let mut c = StoreClient::connect(&addr, SECRET, T).unwrap();
        c.set("job/0", b"zero").unwrap();
        c.set("job/2", b"").unwrap();
        let setter = {
            let addr = addr.clone();
            thread::spawn(move || {
                let mut c = StoreClient::connect(&addr, SECRET, T).unwrap();
                thread::sleep(Duration::from_millis(100));
                c.set("job/1", b"one").unwrap();
                thread::sleep(Duration::from_millis(50));
                c.set("job/10", &[7; 3000]).unwrap();
            })
        };
        let start = Instant::now();
        let got = c.wait_all("job/", &[10, 2, 0, 1], T).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(140));
        assert_eq!(
            got,
            vec![vec![7; 3000], vec![], b"zero".to_vec(), b"one".to_vec()]
        );
        setter.join().unwrap();
        assert!(c.wait_all("job/", &[], T).unwrap().is_empty());
        // The connection serves the next request as usual.
        assert_eq!(c.get("job/1").unwrap().unwrap(), b"one");
    }

    #[test]
    fn wait_all_times_out_naming_the_missing_indices() {
        let (_store, addr) = store();
        let mut c = StoreClient::connect(&addr, SECRET, T).unwrap();
        c.set("p/0", b"x").unwrap();
        c.set("p/2", b"x").unwrap();
        let start = Instant::now();
        let err = c
            .wait_all("p/", &[0, 1, 2, 3], Duration::from_millis(200))
            .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(matches!(err, Error::Timeout(_)), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("2 of 4 keys") && text.contains("[1, 3]"),
            "{text}"
        );
        c.set("p/1", b"y").unwrap();
    }

    #[test]
    fn wait_all_rejects_bad_requests_locally() {
        let (_store, addr) = store();
        let mut c = StoreClient::connect(&addr, SECRET, T).unwrap();
        for (prefix, indices) in [
            ("p/", vec![1, 2, 1]),
            ("p/", vec![0; MAX_WAIT_ALL + 1]),
            (&*"k".repeat(MAX_KEY - 1), vec![10]),
            ("p/", vec![u32::MAX as usize + 1]),
        ] {
            let err = c.wait_all(prefix, &indices, T).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        }
        // Nothing was sent: the connection still works.
        c.set("p/1", b"v").unwrap();
        assert_eq!(c.wait_all("p/", &[1], T).unwrap(), vec![b"v".to_vec()]);
    }

    #[test]
    fn wait_all_larger_than_a_reply_is_an_invalid_argument() {
        let (_store, addr) = store();
        let mut c = StoreClient::connect(&addr, SECRET, T).unwrap();
        let big = vec![1u8; MAX_VALUE / 2];
        for i in 0..3 {
            c.set(&format!("big/{i}"), &big).unwrap();
        }
        let err = c.wait_all("big/", &[0, 1, 2], T).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert_eq!(c.wait_all("big/", &[1], T).unwrap()[0].len(), big.len());
    }

    #[test]
    fn malformed_wait_all_requests_are_dropped() {
        let (_store, addr) = store();
        let frames = [
            // No index.
            request(OP_WAIT_ALL, b"p/", &0u64.to_le_bytes()),
            // A partial index.
            request(OP_WAIT_ALL, b"p/", &[0u8; 8 + 3]),
            // An index twice.
            request(
                OP_WAIT_ALL,
                b"p/",
                &[&[0u8; 8][..], &[5, 0, 0, 0, 5, 0, 0, 0]].concat(),
            ),
        ];
        for frame in frames {
            let bad = raw_client(&addr);
            (&bad).write_all(&frame).unwrap();
            assert_closed_by_server(&bad);
        }
        // Too many indices: dropped on the header, before the value is read.
        let bad = raw_client(&addr);
        let len = (8 + 4 * (MAX_WAIT_ALL + 1)) as u32;
        let mut head = vec![OP_WAIT_ALL, 0, 0];
        head.extend_from_slice(&len.to_le_bytes());
        (&bad).write_all(&head).unwrap();
        assert_closed_by_server(&bad);
    }

    #[test]
    fn a_client_of_another_protocol_version_is_told_so() {
        let (_store, addr) = store();
        let stream = TcpStream::connect(&addr).unwrap();
        let deadline = Instant::now() + T;
        let hello = auth::client_handshake_detailed(&stream, SECRET, b"hcomm-store/1", deadline);
        // The store answers with its own version, then drops the connection.
        assert_eq!(hello.unwrap(), STORE_HELLO);
        stream.set_read_timeout(Some(T)).unwrap();
        assert_closed_by_server(&stream);
        let why = hello_mismatch(STORE_HELLO, "store");
        assert!(
            why.contains("hcomm-store/2") && why.contains("same hcomm version"),
            "{why}"
        );
    }

    /// Any payload of a successful wait-all reply: the client's splitter never panics, accepts
    /// exactly the encodings of `count` values and gives back what was encoded.
    #[test]
    fn fuzz_store_wait_all_reply() {
        let encode = |values: &[&[u8]]| {
            let mut out = Vec::new();
            for v in values {
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
            out
        };
        let target = crate::fuzz::Target {
            name: "store wait all reply",
            default_cases: 50_000,
            seeds: vec![
                encode(&[b"a", b"", b"127.0.0.1:5000"]),
                encode(&[&[3; 300]]),
                encode(&[]),
            ],
            max_len: 2048,
            dict: vec![MAX_VALUE as u64, 3, 4],
        };
        crate::fuzz::run(&target, |input, rng| {
            let count = rng.below(5);
            let (result, usage) = crate::fuzz::measure(|| split_values(input, count));
            assert!(usage.peak <= 4 * input.len() + 1024, "{usage:?}");
            if let Ok(values) = result {
                assert_eq!(values.len(), count);
                let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
                assert_eq!(encode(&refs), input);
            }
        });
    }

    /// The server's state for driving `serve_request` in memory: a table of `max_bytes` and
    /// waits that give up at once.
    fn memory_shared(max_bytes: usize) -> Shared {
        Shared {
            secret: SECRET.to_vec(),
            table: Mutex::new(Table::new(max_bytes)),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            expiry: Mutex::new(Expiry::Never),
            conns: Mutex::new(Conns::default()),
            slot_freed: Condvar::new(),
            threads: Mutex::new(0),
            threads_done: Condvar::new(),
            max_wait: Duration::ZERO,
        }
    }

    /// A request as a client encodes it.
    fn request(op: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut r = request_head(op, key, value.len());
        r.extend_from_slice(value);
        r
    }

    /// The value of a wait-all request for `indices` that gives up at once.
    fn wait_all_value(indices: &[u32]) -> Vec<u8> {
        let mut v = 0u64.to_le_bytes().to_vec();
        for i in indices {
            v.extend_from_slice(&i.to_le_bytes());
        }
        v
    }

    /// Table of the fuzzed server: small, so that "store full" happens too.
    const FUZZ_TABLE: usize = 4096;

    /// Serves the requests in `input` (read in pieces of at most `chunk` bytes) until the input
    /// ends or the server drops the client; returns the replies, decoded by the client's
    /// decoder, and whether the server dropped the client. Checks on the way that no request
    /// costs memory beyond what arrived and that the table's accounting holds.
    fn serve_all(shared: &Shared, input: &[u8], chunk: usize) -> (Vec<(u8, Vec<u8>)>, bool) {
        let stream = super::super::MemStream::new(input, chunk);
        let deadline = Instant::now() + T;
        let mut replies = Vec::new();
        loop {
            let mut op = [0u8; 1];
            if stream.read_within(&mut op, T).unwrap() == 0 {
                return (replies, false);
            }
            let before = stream.consumed();
            let (served, usage) = crate::fuzz::measure(|| serve_request(shared, &stream, op[0]));
            let arrived = stream.consumed() - before;
            let bound = 4 * arrived + 256 * 1024 + 2 * FUZZ_TABLE;
            assert!(usage.peak <= bound, "{usage:?} for {arrived} bytes");
            let out = stream.take_output();
            match served {
                Ok(()) => {
                    let reply_stream = super::super::MemStream::new(&out, out.len());
                    let reply = read_reply(&reply_stream, deadline).unwrap();
                    assert_eq!(reply_stream.consumed(), out.len(), "one reply per request");
                    assert!(reply.0 <= ST_FULL, "status {}", reply.0);
                    replies.push(reply);
                }
                Err(Stop::Dropped(_)) => {
                    assert!(out.is_empty(), "a dropped request was answered");
                    return (replies, true);
                }
                Err(Stop::Closed) => panic!("closed while the store is not stopping"),
            }
            let table = lock(&shared.table);
            let bytes: usize = table.map.iter().map(|(k, v)| k.len() + v.len()).sum();
            assert_eq!(table.bytes, bytes);
            assert!(bytes <= FUZZ_TABLE);
        }
    }

    /// Any bytes an authenticated client sends: the server never panics, answers each
    /// well-formed request with one well-formed reply, drops the client at the first
    /// malformed one, keeps its byte accounting and allocates in proportion to what arrived,
    /// never to what a length field claims.
    #[test]
    fn fuzz_store_server() {
        let seeds = vec![
            [
                request(OP_SET, b"k", b"value"),
                request(OP_GET, b"k", b""),
                request(OP_ADD, b"n", &5i64.to_le_bytes()),
                request(OP_WAIT, b"n", &0u64.to_le_bytes()),
                request(OP_DELETE, b"k", b""),
            ]
            .concat(),
            request(OP_SET, &[b'x'; MAX_KEY], &[7; 3000]),
            [
                request(OP_WAIT, b"missing", &1000u64.to_le_bytes()),
                request(OP_ADD, b"n", &i64::MAX.to_le_bytes()),
                request(OP_ADD, b"n", &1i64.to_le_bytes()),
                request(OP_SET, b"big", &[1; 2000]),
                request(OP_SET, b"bigger", &[2; 2500]),
            ]
            .concat(),
            [
                request(OP_SET, b"r/0", b"a"),
                request(OP_SET, b"r/1", &[3; 1000]),
                request(OP_WAIT_ALL, b"r/", &wait_all_value(&[1, 0])),
                request(OP_WAIT_ALL, b"r/", &wait_all_value(&[0, 1, 2])),
            ]
            .concat(),
        ];
        let target = crate::fuzz::Target {
            name: "store server",
            default_cases: 20_000,
            seeds,
            max_len: 8192,
            dict: vec![
                MAX_KEY as u64,
                MAX_VALUE as u64,
                OP_SET as u64,
                OP_GET as u64,
                OP_WAIT as u64,
                OP_ADD as u64,
                OP_DELETE as u64,
                OP_WAIT_ALL as u64,
                MAX_WAIT_ALL as u64,
                8,
                12,
            ],
        };
        crate::fuzz::run(&target, |input, rng| {
            let shared = memory_shared(FUZZ_TABLE);
            serve_all(&shared, input, 1 + rng.len(input.len()));
        });
    }

    /// Random valid request sequences, encoded as the client encodes them: every reply,
    /// decoded as the client decodes it, is what a plain map with the same byte limit says.
    #[test]
    fn fuzz_store_model() {
        let target = crate::fuzz::Target {
            name: "store model",
            default_cases: 20_000,
            seeds: Vec::new(),
            max_len: 0,
            dict: Vec::new(),
        };
        crate::fuzz::run(&target, |_, rng| {
            let keys: [&[u8]; 7] = [b"", b"a", b"n0", b"n1", b"n3", b"counter", &[b'k'; MAX_KEY]];
            let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
            let mut input = Vec::new();
            let mut want = Vec::new();
            for _ in 0..rng.below(24) {
                let key = rng.pick(&keys).to_vec();
                let used: usize = model.iter().map(|(k, v)| k.len() + v.len()).sum();
                let old = model.get(&key).map_or(0, |v| key.len() + v.len());
                match rng.below(6) {
                    5 => {
                        // A wait for some of the numbered keys "n0".."n3".
                        let mut indices: Vec<u32> = (0..4).filter(|_| rng.one_in(2)).collect();
                        if indices.is_empty() {
                            indices.push(rng.below(4) as u32);
                        }
                        if rng.one_in(2) {
                            indices.reverse();
                        }
                        input.extend(request(OP_WAIT_ALL, b"n", &wait_all_value(&indices)));
                        let values: Option<Vec<&Vec<u8>>> = indices
                            .iter()
                            .map(|i| model.get(format!("n{i}").as_bytes()))
                            .collect();
                        want.push(match values {
                            Some(values) => {
                                let mut reply = Vec::new();
                                for v in values {
                                    reply.extend_from_slice(&(v.len() as u32).to_le_bytes());
                                    reply.extend_from_slice(v);
                                }
                                (ST_OK, Some(reply))
                            }
                            None => (ST_TIMED_OUT, None),
                        });
                    }
                    0 => {
                        let mut value = vec![0u8; rng.len(1200)];
                        rng.fill(&mut value);
                        input.extend(request(OP_SET, &key, &value));
                        if used - old + key.len() + value.len() > FUZZ_TABLE {
                            want.push((ST_FULL, None));
                        } else {
                            model.insert(key, value);
                            want.push((ST_OK, Some(Vec::new())));
                        }
                    }
                    1 | 2 => {
                        let op = *rng.pick(&[OP_GET, OP_WAIT]);
                        let value = if op == OP_GET {
                            vec![]
                        } else {
                            5u64.to_le_bytes().to_vec()
                        };
                        input.extend(request(op, &key, &value));
                        want.push(match model.get(&key) {
                            Some(v) => (ST_OK, Some(v.clone())),
                            None if op == OP_GET => (ST_NOT_FOUND, Some(Vec::new())),
                            None => (ST_TIMED_OUT, Some(Vec::new())),
                        });
                    }
                    3 => {
                        let delta = *rng.pick(&[1i64, -7, i64::MAX, i64::MIN]);
                        input.extend(request(OP_ADD, &key, &delta.to_le_bytes()));
                        let current = match model.get(&key) {
                            None => Some(0),
                            Some(v) => <[u8; 8]>::try_from(&v[..]).ok().map(i64::from_le_bytes),
                        };
                        match current.and_then(|c| c.checked_add(delta)) {
                            None => want.push((ST_INVALID, None)),
                            Some(_) if used - old + key.len() + 8 > FUZZ_TABLE => {
                                want.push((ST_FULL, None))
                            }
                            Some(sum) => {
                                let bytes = sum.to_le_bytes().to_vec();
                                model.insert(key, bytes.clone());
                                want.push((ST_OK, Some(bytes)));
                            }
                        }
                    }
                    _ => {
                        input.extend(request(OP_DELETE, &key, b""));
                        let status = match model.remove(&key) {
                            Some(_) => ST_OK,
                            None => ST_NOT_FOUND,
                        };
                        want.push((status, Some(Vec::new())));
                    }
                }
            }
            let shared = memory_shared(FUZZ_TABLE);
            let (replies, dropped) = serve_all(&shared, &input, 1 + rng.len(input.len()));
            assert!(!dropped, "a valid request was dropped");
            assert_eq!(replies.len(), want.len());
            for ((status, payload), (want_status, want_payload)) in replies.iter().zip(&want) {
                assert_eq!(status, want_status);
                // Error messages are text for people; only successes carry data.
                if let Some(p) = want_payload {
                    assert_eq!(payload, p);
                }
            }
        });
    }

    /// Any reply bytes a store (or an impostor with the secret) sends: the client's decoder
    /// never panics, takes a status and exactly the announced payload when the length is
    /// within the limit of its status, refuses it otherwise, and allocates in proportion to
    /// what arrived.
    #[test]
    fn fuzz_store_client_reply() {
        let reply = |status: u8, payload: &[u8]| {
            let mut r = vec![status];
            r.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            r.extend_from_slice(payload);
            r
        };
        let target = crate::fuzz::Target {
            name: "store client reply",
            default_cases: 50_000,
            seeds: vec![
                reply(ST_OK, b""),
                reply(ST_OK, &[9; 700]),
                reply(ST_INVALID, b"not a counter"),
                reply(ST_FULL, &[b'x'; MAX_MESSAGE]),
            ],
            max_len: 4096,
            dict: vec![MAX_VALUE as u64, MAX_MESSAGE as u64, ST_FULL as u64],
        };
        crate::fuzz::run(&target, |input, rng| {
            let stream = super::super::MemStream::new(input, 1 + rng.len(input.len()));
            let deadline = Instant::now() + T;
            let (result, usage) = crate::fuzz::measure(|| read_reply(&stream, deadline));
            assert!(usage.peak <= 4 * input.len() + 256 * 1024, "{usage:?}");
            match result {
                Ok((status, payload)) => {
                    let limit = if status == ST_OK {
                        MAX_VALUE
                    } else {
                        MAX_MESSAGE
                    };
                    assert!(payload.len() <= limit);
                    assert_eq!(stream.consumed(), REPLY_HEADER + payload.len());
                    assert_eq!(&input[REPLY_HEADER..stream.consumed()], &payload[..]);
                }
                Err(e) => assert!(
                    matches!(
                        e.kind(),
                        io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData
                    ),
                    "{e}"
                ),
            }
        });
    }
}
