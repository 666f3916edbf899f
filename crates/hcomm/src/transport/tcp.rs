//! TCP links between ranks: a listener on a free port, the authenticated connections made on
//! demand ([`Mesh`]), and the socket options of the data path.
//!
//! No connection is made at init. Every rank keeps its listener (its address is in the store)
//! and the addresses of all ranks; a pair of ranks is connected when one of them first needs
//! the other ([`Mesh::want`]). That rank dials `streams` connections (`HCOMM_TCP_STREAMS`),
//! one after the other: each proves, by the job secret's challenge-response, that both ends
//! belong to the job and says which rank and stream it is, then reads the acceptor's verdict
//! (one byte) before it carries any frame. The pair is up, on both sides, once all of its
//! streams are. Anything else on the listener is dropped after a bounded handshake.
//!
//! **Both ranks dialing at once**: the connection dialed by the lower rank wins ([`takes`]).
//! The lower rank refuses the higher rank's stream 0 while its own dial is in flight; the
//! higher rank takes the lower rank's and lets its own be refused. A refused dialer waits for
//! the peer's connection (and dials again if none came within a second). Nothing is
//! sent on a connection before its verdict, so the tie loses no frame; frames queued for the
//! peer meanwhile wait in its link (`p2p/link/tcp.rs`).
//!
//! Dials and handshakes run on short-lived threads (the handshake blocks, within its
//! deadlines), so that connecting never stalls the progress of other links; the engine
//! accepts on its own turns (the listener is in its epoll set: [`Mesh::accept`]) and takes the
//! pairs that came up ([`Mesh::take_ready`]) after the mesh's `notify` woke it.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;
use socket2::{Domain, Protocol, Socket, Type};

use crate::bootstrap::auth::{self, Secret};
use crate::error::{Error, PeerRank, Result};
use crate::sync::lock;

/// A handshake that takes longer than this is dropped, so a silent intruder frees its slot.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// How long a refused dialer waits for the peer's own connection before it dials again (the
/// peer's dial usually lands within milliseconds; one that never comes is a peer that died
/// meanwhile, which the next dial finds refused).
const AWAIT_LIMIT: Duration = Duration::from_secs(1);
/// At most this many handshakes run at once on a listener; further connections wait in the
/// listen backlog until one ends (a crowd of ranks is served in turn, never turned away).
const MAX_PENDING_HANDSHAKES: usize = 64;
/// The longest single `connect` of a dial (it is tried again until the dial's deadline), so
/// that stopping the mesh never waits longer for a dialing thread.
const CONNECT_STEP: Duration = Duration::from_secs(1);
/// Stack of the dialing and handshaking threads (they only run the handshake).
const WORKER_STACK: usize = 256 * 1024;
const HELLO_MAGIC: &[u8; 4] = b"HCMT";
/// The acceptor's verdicts on a connection, sent after the handshake.
const TAKEN: u8 = 1;
const REFUSED: u8 = 0;
/// In a hello's stream number: the connection replaces that stream of a pair that is up.
const REPLACES: u16 = 0x8000;
/// Which connection of which rank a hello announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hello {
    rank: u32,
    size: u32,
    stream: u16,
    streams: u16,
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16);
        b.extend_from_slice(HELLO_MAGIC);
        b.extend_from_slice(&self.rank.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.stream.to_le_bytes());
        b.extend_from_slice(&self.streams.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Hello> {
        if b.len() != 16 || &b[..4] != HELLO_MAGIC {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(Hello {
            rank: u32_at(4),
            size: u32_at(8),
            stream: u16_at(12),
            streams: u16_at(14),
        })
    }
}

/// Binds a listener on `ip` and a free port, with a backlog for many simultaneous peers.
pub(crate) fn listen(ip: IpAddr) -> Result<TcpListener> {
    let addr = SocketAddr::new(ip, 0);
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| Error::transport("creating the listening socket", e))?;
    socket
        .bind(&addr.into())
        .map_err(|e| Error::transport(format_args!("binding a free port on {ip}"), e))?;
    socket
        .listen(1024)
        .map_err(|e| Error::transport("listening", e))?;
    Ok(socket.into())
}

/// Binds one listener that every address of `ips` (a rank's rails) reaches, on a free port:
/// on that address itself when there is one, else on the unspecified address of their family
/// (`::`, which takes IPv4 too, when they mix families).
pub(crate) fn listen_all(ips: &[IpAddr]) -> Result<TcpListener> {
    match ips {
        [] => Err(Error::internal("no address to listen on")),
        [one] => listen(*one),
        many if many.iter().all(IpAddr::is_ipv4) => listen(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        _ => listen(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    }
}

/// What a rank publishes: its address on every rail, `ip:port` or `[ip]:port`, joined by
/// commas.
pub(crate) fn format_addrs(ips: &[IpAddr], port: u16) -> String {
    let addrs: Vec<String> = ips
        .iter()
        .map(|ip| SocketAddr::new(*ip, port).to_string())
        .collect();
    addrs.join(",")
}

/// Reads what a rank published ([`format_addrs`]): `None` unless every address parses and
/// there is at least one.
pub(crate) fn parse_addrs(text: &str) -> Option<Vec<SocketAddr>> {
    let addrs = text
        .split(',')
        .map(|a| a.trim().parse::<SocketAddr>().ok())
        .collect::<Option<Vec<_>>>()?;
    (!addrs.is_empty()).then_some(addrs)
}

/// The congestion control of the TCP connections between ranks when `HCOMM_TCP_CONGESTION`
/// is unset: `reno`, which every Linux kernel has and lets every process choose. A pacing one
/// (`bbr`, this machine's default) spreads each burst of a collective over its estimate of
/// the path's rate, an estimate that traffic in bursts keeps low: 2 ranks between two network
/// namespaces created afresh for each run, all-reduce, medians of 4 runs, `cubic` against
/// `bbr`: 256 KiB 157 against 306 us, 1 MiB 0.61 against 0.90 ms, 4 MiB 2.3 against 3.7 ms,
/// 16 MiB 11.5 against 16.9 ms. `cubic` in turn ran a 64 KiB message at one of two speeds a
/// run, where `reno` kept the fast one (fresh namespaces, 4 runs each, `reno` against
/// `cubic`): ping-pong 64 KiB 17.4-19.9 against 17.6-27.9 us, all-reduce 64 KiB 21.5-22.8
/// against 22.0-53.3 us, 1 MiB 358-389 against 378-501 us, 16 MiB 6.7-7.3 against 7.0-8.7
/// ms; ping-pong 256 KiB level (48-50 against 49-51 us).
pub(crate) const DEFAULT_TCP_CONGESTION: &str = "reno";

/// A connection to `addr` within `timeout`, its congestion control set to `congestion` before
/// it connects: a connection that starts with a pacing one (`bbr`) keeps pacing its bursts
/// when it is switched to another later (2 ranks between two network namespaces, 8 MiB
/// all-reduce, 3 runs each in the same namespaces: 8.4-9.0 ms switched to `cubic` after
/// connecting, 5.2-5.9 ms with `cubic` from the start).
fn dial_with(
    addr: SocketAddr,
    timeout: Duration,
    congestion: Option<&[u8]>,
) -> io::Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if let Some(name) = congestion {
        sock.set_tcp_congestion(name)?;
    }
    sock.connect_timeout(&addr.into(), timeout)?;
    Ok(sock.into())
}

/// Sets the options of a data-path socket. Its congestion control it has from the start: a
/// dialed socket from [`dial_with`], an accepted one from the listener ([`congestion_control`]).
pub(crate) fn tune(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    socket2::SockRef::from(stream).set_keepalive(true)
}

/// The congestion control the data-path sockets take (`HCOMM_TCP_CONGESTION`: `wanted`, as
/// read), tried on `listener` (its accepted connections start with it): `None` for the
/// system's default. A name the user gave that the kernel refuses is an error; the default,
/// [`DEFAULT_TCP_CONGESTION`], is taken only where the kernel allows it.
pub(crate) fn congestion_control(
    listener: &TcpListener,
    wanted: Option<&str>,
) -> Result<Option<Vec<u8>>> {
    let sock = socket2::SockRef::from(listener);
    match wanted {
        Some("system") => Ok(None),
        Some(name) => match sock.set_tcp_congestion(name.as_bytes()) {
            Ok(()) => Ok(Some(name.as_bytes().to_vec())),
            Err(e) => Err(Error::invalid_argument(format!(
                "HCOMM_TCP_CONGESTION={name}: the kernel refuses it \
                 (net.ipv4.tcp_allowed_congestion_control lists those a process may choose; \
                 system takes the system's default)"
            ))
            .with_source(e)),
        },
        None => match sock.set_tcp_congestion(DEFAULT_TCP_CONGESTION.as_bytes()) {
            Ok(()) => Ok(Some(DEFAULT_TCP_CONGESTION.as_bytes().to_vec())),
            Err(e) => {
                tracing::debug!(
                    "TCP congestion control {DEFAULT_TCP_CONGESTION} not allowed here ({e}): \
                     the connections take the system's default"
                );
                Ok(None)
            }
        },
    }
}

/// Bytes written to `stream` (its end included, once shut down) that the peer's kernel has
/// not acknowledged yet (`SIOCOUTQ`).
pub(crate) fn unacknowledged(stream: &TcpStream) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut bytes: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ on a socket) writes one int to the pointer, which points to a
    // live local; the descriptor is the stream's own, open while it is borrowed.
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(bytes).unwrap_or(0))
}

/// What a rank knows of its connection with one peer.
#[derive(Debug)]
enum Pair {
    /// Not connected, and nobody dials.
    Idle,
    /// This rank dials the peer.
    Dialing,
    /// The peer refused this rank's dial (its own dial won the tie): its connection is
    /// awaited.
    Awaiting,
    /// The peer's stream 0 was taken; its other streams follow (since `since`). `wanted`:
    /// the engine asked for the peer, before (this rank was dialing or awaiting it when the
    /// stream came: [`accepting`]) or meanwhile; should the peer give up half-way, this rank
    /// dials it.
    Accepting {
        socks: Vec<Option<TcpStream>>,
        since: Instant,
        wanted: bool,
    },
    /// Connected: the streams went to the engine.
    Up,
    /// Dialing failed: the peer is lost.
    Failed,
}

/// The tie rule: whether rank `me`, whose pair with `peer` is in state `pair`, takes the
/// stream 0 that `peer` dialed (else it refuses it).
///
/// While both dial, the lower rank's connection wins: `me` takes the peer's only when the
/// peer is the lower rank, and the peer, applying the same rule, refuses `me`'s. A rank that
/// is not dialing takes it; a rank already connected (or that found the peer lost) refuses
/// it. A pair whose other streams never came within the handshake limit (the dialer gave up
/// half-way) is taken afresh.
fn takes(me: usize, peer: usize, pair: &Pair) -> bool {
    match pair {
        Pair::Idle | Pair::Awaiting => true,
        Pair::Dialing => peer < me,
        Pair::Accepting { since, .. } => since.elapsed() >= HANDSHAKE_LIMIT,
        Pair::Up | Pair::Failed => false,
    }
}

/// The state of a pair, in state `pair`, once the peer's stream 0 was taken at `since`.
///
/// A rank that was itself dialing or awaiting the peer (the peer's dial won the tie) still
/// wants it: its dialing thread ends on seeing the pair accepted, so should the peer give up
/// half-way, only `wanted` makes this rank dial it again (and find it lost), instead of
/// leaving the pair idle with the engine's link waiting for a connection nobody makes.
fn accepting(pair: &Pair, streams: usize, since: Instant) -> Pair {
    let wanted = match pair {
        Pair::Dialing | Pair::Awaiting => true,
        Pair::Accepting { wanted, .. } => *wanted,
        Pair::Idle | Pair::Up | Pair::Failed => false,
    };
    Pair::Accepting {
        socks: (0..streams).map(|_| None).collect(),
        since,
        wanted,
    }
}

/// Drops the half set of an accepting pair whose dialer gave up half-way: the pair is dialed
/// from this side if this rank wants the peer (the dial then fails naming it if it is gone),
/// else idle. Returns whether to dial.
fn give_up(pair: &mut Pair) -> bool {
    let wanted = matches!(pair, Pair::Accepting { wanted: true, .. });
    *pair = if wanted { Pair::Dialing } else { Pair::Idle };
    wanted
}

/// A pair that came up or failed, for the engine ([`Mesh::take_ready`]).
#[derive(Debug)]
pub(crate) enum Ready {
    /// The pair's streams, in stream order; `dialed`: this rank dialed them.
    Up {
        /// The peer's world rank.
        peer: usize,
        /// Its connected streams.
        socks: Vec<TcpStream>,
        /// This rank dialed them (else it accepted them).
        dialed: bool,
    },
    /// A new connection for stream `stream` of a pair that is up, whose earlier connection
    /// died (its rail came back: [`Mesh::redial`]).
    Rail {
        /// The peer's world rank.
        peer: usize,
        /// The stream it replaces.
        stream: usize,
        /// The connection.
        sock: TcpStream,
    },
    /// Connecting to the peer failed: it is lost.
    Failed {
        /// The peer's world rank.
        peer: usize,
        /// Why, naming the peer.
        error: Error,
    },
}

/// What a rank needs to connect to its peers on demand.
#[derive(Debug)]
pub(crate) struct MeshConfig {
    /// This rank's listener (its address is published in the store).
    pub listener: TcpListener,
    /// This rank.
    pub rank: usize,
    /// Where every rank listens, by world rank: one address per rail (interface), its first
    /// rail first.
    pub addrs: Vec<Vec<SocketAddr>>,
    /// Connections per pair (`HCOMM_TCP_STREAMS`), at least one per rail the pair shares
    /// ([`MeshConfig::streams_with`]).
    pub streams: usize,
    /// The job secret.
    pub secret: Secret,
    /// `HCOMM_TIMEOUT`: how long a dial may take.
    pub timeout: Duration,
    /// `HCOMM_FAILOVER`: `None` for pairs that share two rails or more, `Some(true)` for
    /// every pair of several streams, `Some(false)` for none.
    pub failover: Option<bool>,
    /// `HCOMM_LINK_TIMEOUT`: how long a stream that can fail over may leave data
    /// unacknowledged.
    pub link_timeout: Duration,
    /// `HCOMM_TCP_CONGESTION`, as read ([`congestion_control`]).
    pub congestion: Option<String>,
}

impl MeshConfig {
    /// The rails this rank shares with `peer`: the fewer of their interfaces.
    pub(crate) fn rails_with(&self, peer: usize) -> usize {
        let rails = |r: usize| self.addrs.get(r).map_or(1, |a| a.len().max(1));
        rails(self.rank).min(rails(peer))
    }

    /// The connections of the pair with `peer`: `HCOMM_TCP_STREAMS`, or one per rail they
    /// share if that is more (both ends compute the same from the published addresses).
    pub(crate) fn streams_with(&self, peer: usize) -> usize {
        self.streams.max(self.rails_with(peer))
    }

    /// Whether the pair with `peer` moves the frames of a stream that died to another
    /// (`HCOMM_FAILOVER`; it needs two streams or more): the link timeout if so. Both ends
    /// decide the same from the same settings and the published addresses.
    pub(crate) fn failover_with(&self, peer: usize) -> Option<Duration> {
        let on = match self.failover {
            None => self.rails_with(peer) >= 2,
            Some(on) => on,
        };
        (on && self.streams_with(peer) >= 2).then_some(self.link_timeout)
    }

    /// The address of `peer` that stream `stream` dials: stream `s` takes rail `s % rails`.
    pub(crate) fn addr_of(&self, peer: usize, stream: usize) -> SocketAddr {
        let addrs = &self.addrs[peer];
        addrs[stream % self.rails_with(peer) % addrs.len()]
    }
}

/// The failovers of one peer on one rail, as a rank counts them (`Mesh::failover_counts`;
/// the statistics segment shows them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverCount {
    /// World rank of the peer.
    pub peer: usize,
    /// A fallback from the transport plug-in to TCP (else a TCP stream's failover).
    pub plugin: bool,
    /// The rail, `local -> remote` (the TCP stream that died, or the one that took over
    /// from the plug-in).
    pub rail: String,
    /// How many times.
    pub count: u64,
}

/// The connections of one rank with its peers, made on demand (see the module docs).
pub(crate) struct Mesh {
    sh: Arc<MeshShared>,
}

struct MeshShared {
    cfg: MeshConfig,
    /// The congestion control of the connections (`None`: the system's default).
    congestion: Option<Vec<u8>>,
    /// This rank's hello as an acceptor.
    hello: Vec<u8>,
    pairs: Mutex<Vec<Pair>>,
    ready: Mutex<Vec<Ready>>,
    has_ready: AtomicBool,
    notify: Box<dyn Fn() + Send + Sync>,
    stop: AtomicBool,
    handshakes: AtomicUsize,
    workers: Mutex<Vec<thread::JoinHandle<()>>>,
    /// Sockets of the dials and handshakes in flight, cut when the mesh stops.
    live: Mutex<HashMap<u64, TcpStream>>,
    next_live: AtomicU64,
    opened: AtomicU64,
    accepted: AtomicU64,
    failovers: AtomicU64,
    fallbacks: AtomicU64,
    /// The failovers and fallbacks by peer and rail.
    by_rail: Mutex<Vec<FailoverCount>>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("rank", &self.sh.cfg.rank)
            .field("streams", &self.sh.cfg.streams)
            .finish_non_exhaustive()
    }
}

impl Mesh {
    /// Takes over the listener; `notify` is called (from another thread) whenever a pair came
    /// up or failed.
    pub(crate) fn start(cfg: MeshConfig, notify: Box<dyn Fn() + Send + Sync>) -> Result<Mesh> {
        cfg.listener
            .set_nonblocking(true)
            .map_err(|e| Error::transport("configuring the listener", e))?;
        let congestion = congestion_control(&cfg.listener, cfg.congestion.as_deref())?;
        tracing::debug!(
            "rank {}: TCP connections take congestion control {}",
            cfg.rank,
            congestion
                .as_deref()
                .map_or("of the system".into(), String::from_utf8_lossy)
        );
        let hello = Hello {
            rank: cfg.rank as u32,
            size: cfg.addrs.len() as u32,
            stream: 0,
            streams: cfg.streams as u16,
        }
        .encode();
        let pairs = (0..cfg.addrs.len()).map(|_| Pair::Idle).collect();
        Ok(Mesh {
            sh: Arc::new(MeshShared {
                cfg,
                congestion,
                hello,
                pairs: Mutex::new(pairs),
                ready: Mutex::new(Vec::new()),
                has_ready: AtomicBool::new(false),
                notify,
                stop: AtomicBool::new(false),
                handshakes: AtomicUsize::new(0),
                workers: Mutex::new(Vec::new()),
                live: Mutex::new(HashMap::default()),
                next_live: AtomicU64::new(0),
                opened: AtomicU64::new(0),
                accepted: AtomicU64::new(0),
                failovers: AtomicU64::new(0),
                fallbacks: AtomicU64::new(0),
                by_rail: Mutex::default(),
            }),
        })
    }

    /// The listener, for the engine's epoll set.
    pub(crate) fn listener(&self) -> &TcpListener {
        &self.sh.cfg.listener
    }

    /// This rank needs `peer`: dials it unless the pair is connected or being connected.
    pub(crate) fn want(&self, peer: usize) {
        let sh = &self.sh;
        if peer == sh.cfg.rank {
            return;
        }
        {
            let mut pairs = lock(&sh.pairs);
            let Some(pair) = pairs.get_mut(peer) else {
                return;
            };
            match pair {
                Pair::Idle => {}
                Pair::Accepting { since, .. } if since.elapsed() >= HANDSHAKE_LIMIT => {}
                Pair::Accepting { wanted, .. } => {
                    *wanted = true;
                    return;
                }
                _ => return,
            }
            *pair = Pair::Dialing;
        }
        start_dial(sh, peer);
    }

    /// Accepts the connections waiting on the listener (its epoll event), each authenticated
    /// on a thread of its own, as many at once as `MAX_PENDING_HANDSHAKES`.
    pub(crate) fn accept(&self) {
        let sh = &self.sh;
        while sh.handshakes.load(Ordering::SeqCst) < MAX_PENDING_HANDSHAKES {
            match sh.cfg.listener.accept() {
                Ok((conn, from)) => {
                    sh.handshakes.fetch_add(1, Ordering::SeqCst);
                    let acceptor = Arc::clone(sh);
                    let spawned = spawn(sh, "hcomm-handshake", move || {
                        if let Err(e) = admit(&acceptor, conn) {
                            tracing::warn!(
                                "rank {}: dropped connection from {from}: {e}",
                                acceptor.cfg.rank
                            );
                        }
                        acceptor.handshakes.fetch_sub(1, Ordering::SeqCst);
                    });
                    if spawned.is_err() {
                        sh.handshakes.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("rank {}: accept failed: {e}", sh.cfg.rank);
                    break;
                }
            }
        }
    }

    /// Whether pairs came up or failed since the last [`Mesh::take_ready`].
    #[inline]
    pub(crate) fn has_ready(&self) -> bool {
        self.sh.has_ready.load(Ordering::Acquire)
    }

    /// The pairs that came up or failed since the last call.
    pub(crate) fn take_ready(&self) -> Vec<Ready> {
        if !self.sh.has_ready.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *lock(&self.sh.ready))
    }

    /// Connections this rank opened and accepted that became links (every stream counts).
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.sh.opened.load(Ordering::Relaxed),
            self.sh.accepted.load(Ordering::Relaxed),
        )
    }

    /// The settings the mesh was started with.
    pub(crate) fn config(&self) -> &MeshConfig {
        &self.sh.cfg
    }

    /// Dials stream `stream` of the pair with `peer` again, its earlier connection having
    /// died: a try every link timeout, each bounded by it, until one is taken (the new
    /// connection comes as [`Ready::Rail`]), the mesh stops, or `HCOMM_TIMEOUT` passed.
    pub(crate) fn redial(&self, peer: usize, stream: usize) {
        let sh = Arc::clone(&self.sh);
        let _ = spawn(&self.sh, "hcomm-redial", move || {
            let every = sh.cfg.link_timeout;
            let until = Instant::now() + sh.cfg.timeout;
            while !sh.stop.load(Ordering::SeqCst) && Instant::now() < until {
                let tried = Instant::now();
                let deadline = tried + every;
                let hello = stream as u16 | REPLACES;
                if let Ok(Some(sock)) = connect_one(&sh, peer, usize::from(hello), deadline) {
                    sh.opened.fetch_add(1, Ordering::Relaxed);
                    deliver(&sh, Ready::Rail { peer, stream, sock });
                    return;
                }
                let left = every.saturating_sub(tried.elapsed());
                let step = Duration::from_millis(20);
                let mut slept = Duration::ZERO;
                while slept < left && !sh.stop.load(Ordering::SeqCst) {
                    thread::sleep(step);
                    slept += step;
                }
            }
        });
    }

    /// Counts a failover: a stream to `peer` on `rail` died and its frames moved to another.
    pub(crate) fn count_failover(&self, peer: usize, rail: &str) {
        self.sh.failovers.fetch_add(1, Ordering::Relaxed);
        self.count_by_rail(peer, false, rail);
    }

    /// Adds one to the row of `peer`, `plugin` and `rail` of [`Mesh::failover_counts`].
    fn count_by_rail(&self, peer: usize, plugin: bool, rail: &str) {
        let mut rows = lock(&self.sh.by_rail);
        match rows
            .iter_mut()
            .find(|r| r.peer == peer && r.plugin == plugin && r.rail == rail)
        {
            Some(row) => row.count += 1,
            None => rows.push(FailoverCount {
                peer,
                plugin,
                rail: rail.to_string(),
                count: 1,
            }),
        }
    }

    /// The failovers and fallbacks by peer and rail, in the order each row first happened.
    pub(crate) fn failover_counts(&self) -> Vec<FailoverCount> {
        lock(&self.sh.by_rail).clone()
    }

    /// Failovers so far ([`Mesh::count_failover`]).
    pub(crate) fn failovers(&self) -> u64 {
        self.sh.failovers.load(Ordering::Relaxed)
    }

    /// Counts a fallback: the traffic to `peer` moved from its transport plug-in to TCP, on
    /// `rail`.
    pub(crate) fn count_fallback(&self, peer: usize, rail: &str) {
        self.sh.fallbacks.fetch_add(1, Ordering::Relaxed);
        self.count_by_rail(peer, true, rail);
    }

    /// Fallbacks so far ([`Mesh::count_fallback`]).
    pub(crate) fn fallbacks(&self) -> u64 {
        self.sh.fallbacks.load(Ordering::Relaxed)
    }

    /// Stops dialing and accepting: cuts the connections still in their handshake and joins
    /// their threads. Pairs already up are the engine's.
    pub(crate) fn stop(&self) {
        let sh = &self.sh;
        sh.stop.store(true, Ordering::SeqCst);
        for sock in lock(&sh.live).values() {
            let _ = sock.shutdown(Shutdown::Both);
        }
        let workers = std::mem::take(&mut *lock(&sh.workers));
        for w in workers {
            let _ = w.join();
        }
        lock(&sh.ready).clear();
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts a dialing or handshaking thread (none once the mesh stops), keeping its handle.
fn spawn(sh: &MeshShared, name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    let mut workers = lock(&sh.workers);
    if sh.stop.load(Ordering::SeqCst) {
        return Err(io::Error::other("the mesh is stopping"));
    }
    workers.retain(|w| !w.is_finished());
    let t = thread::Builder::new()
        .name(name.into())
        .stack_size(WORKER_STACK)
        .spawn(f)?;
    workers.push(t);
    Ok(())
}

/// Starts the dialing thread of a pair just set to `Dialing`.
fn start_dial(sh: &Arc<MeshShared>, peer: usize) {
    let dialer = Arc::clone(sh);
    if let Err(e) = spawn(sh, "hcomm-dial", move || dial(&dialer, peer)) {
        if let Some(pair) = lock(&sh.pairs).get_mut(peer) {
            *pair = Pair::Failed;
        }
        deliver(
            sh,
            Ready::Failed {
                peer,
                error: Error::init(format!("cannot start a thread to connect: {e}"))
                    .with_peer(PeerRank::world(peer)),
            },
        );
    }
}

/// Hands a pair to the engine and wakes it.
fn deliver(sh: &MeshShared, ready: Ready) {
    lock(&sh.ready).push(ready);
    sh.has_ready.store(true, Ordering::Release);
    (sh.notify)();
}

/// A socket in a handshake, cut if the mesh stops meanwhile.
struct Live<'a> {
    sh: &'a MeshShared,
    id: u64,
}

impl<'a> Live<'a> {
    fn track(sh: &'a MeshShared, sock: &TcpStream) -> io::Result<Live<'a>> {
        let id = sh.next_live.fetch_add(1, Ordering::Relaxed);
        lock(&sh.live).insert(id, sock.try_clone()?);
        if sh.stop.load(Ordering::SeqCst) {
            let _ = sock.shutdown(Shutdown::Both);
        }
        Ok(Live { sh, id })
    }
}

impl Drop for Live<'_> {
    fn drop(&mut self) {
        lock(&self.sh.live).remove(&self.id);
    }
}

/// The dialing thread of one pair: connects every stream, or waits for the peer's connection
/// when the peer's dial won the tie, and hands the outcome to the engine.
fn dial(sh: &MeshShared, peer: usize) {
    let deadline = Instant::now() + sh.cfg.timeout;
    let outcome = loop {
        match dial_streams(sh, peer, deadline) {
            Ok(Some(socks)) => break Ok(socks),
            Ok(None) => {
                if !await_peer(sh, peer, deadline) {
                    return;
                }
            }
            Err(e) => break Err(e),
        }
    };
    let mut pairs = lock(&sh.pairs);
    let pair = &mut pairs[peer];
    match outcome {
        Ok(socks) if matches!(pair, Pair::Dialing) => {
            *pair = Pair::Up;
            sh.opened.fetch_add(socks.len() as u64, Ordering::Relaxed);
            deliver(
                sh,
                Ready::Up {
                    peer,
                    socks,
                    dialed: true,
                },
            );
        }
        // The peer took this rank's stream 0 while this rank took the peer's: the tie rule
        // makes that impossible, so the peer must have broken it.
        Ok(_) => tracing::warn!(
            "rank {}: rank {peer} accepted a connection while its own was taken; dropped",
            sh.cfg.rank
        ),
        Err(error) if matches!(pair, Pair::Dialing | Pair::Awaiting) => {
            *pair = Pair::Failed;
            deliver(sh, Ready::Failed { peer, error });
        }
        // The peer's own connection came meanwhile.
        Err(_) => {}
    }
}

/// After the peer refused this rank's dial: waits for the peer's own connection. Returns
/// whether to dial again (none came within `AWAIT_LIMIT`).
fn await_peer(sh: &MeshShared, peer: usize, deadline: Instant) -> bool {
    {
        let mut pairs = lock(&sh.pairs);
        if !matches!(pairs[peer], Pair::Dialing) {
            return false;
        }
        pairs[peer] = Pair::Awaiting;
    }
    let until = deadline.min(Instant::now() + AWAIT_LIMIT);
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return false;
        }
        {
            let mut pairs = lock(&sh.pairs);
            match pairs[peer] {
                Pair::Awaiting if Instant::now() >= until => {
                    pairs[peer] = Pair::Dialing;
                    return true;
                }
                Pair::Awaiting => {}
                _ => return false,
            }
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Dials every stream of the pair in order: `None` when the peer refused stream 0 (its own
/// dial won the tie).
fn dial_streams(sh: &MeshShared, peer: usize, deadline: Instant) -> Result<Option<Vec<TcpStream>>> {
    let streams = sh.cfg.streams_with(peer);
    let mut socks = Vec::with_capacity(streams);
    for s in 0..streams {
        match connect_one(sh, peer, s, deadline)? {
            Some(conn) => socks.push(conn),
            None if s == 0 => return Ok(None),
            None => {
                return Err(Error::init(format!(
                    "rank {} connecting to rank {peer}: it refused stream {s} after taking \
                     stream 0",
                    sh.cfg.rank
                ))
                .with_peer(PeerRank::world(peer)))
            }
        }
    }
    Ok(Some(socks))
}

/// Dials stream `stream` of the pair with `peer`: the connection once the peer took it,
/// `None` when it refused it.
fn connect_one(
    sh: &MeshShared,
    peer: usize,
    stream: usize,
    deadline: Instant,
) -> Result<Option<TcpStream>> {
    let (rank, streams, size) = (sh.cfg.rank, sh.cfg.streams_with(peer), sh.cfg.addrs.len());
    let replaces = stream & usize::from(REPLACES) != 0;
    let mut addr = sh.cfg.addr_of(peer, stream & !usize::from(REPLACES));
    // A replacement probes its own rail: no falling back to the first.
    let first = if replaces {
        addr
    } else {
        sh.cfg.addr_of(peer, 0)
    };
    let fail = |addr: SocketAddr, what: String| {
        Error::init(format!(
            "rank {rank} connecting to rank {peer} at {addr}: {what}"
        ))
        .with_peer(PeerRank::world(peer))
    };
    let hello = Hello {
        rank: rank as u32,
        size: size as u32,
        stream: stream as u16,
        streams: streams as u16,
    };
    // A peer that hangs up before authenticating (a listener shedding load) is tried again.
    let mut backoff = Duration::from_millis(10);
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return Err(fail(addr, "this rank is finalizing".into()));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::timeout(format!(
                "rank {rank} could not connect to rank {peer} at {addr} within HCOMM_TIMEOUT \
                 (is it hung or stopped?)"
            ))
            .with_peer(PeerRank::world(peer)));
        }
        let conn = match dial_with(addr, left.min(CONNECT_STEP), sh.congestion.as_deref()) {
            Ok(c) => c,
            // A rank listens from before its address is published until it ends (a full
            // backlog drops connections, it does not refuse them): its process is gone.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && addr == first => {
                return Err(fail(
                    addr,
                    format!("{e}: nothing listens there any more, so its process has ended"),
                ));
            }
            // A rail that does not reach the peer: this stream takes its first rail (the one
            // its address was published from reaches the store, and so, likely, the peer).
            Err(e) if addr != first => {
                tracing::warn!(
                    "rank {rank}: rank {peer}'s rail at {addr} cannot be reached ({e}); stream \
                     {stream} takes its rail at {first}"
                );
                addr = first;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut && !replaces => continue,
            Err(e) => return Err(fail(addr, e.to_string())),
        };
        tune(&conn).map_err(|e| fail(addr, e.to_string()))?;
        let _live = Live::track(sh, &conn).map_err(|e| fail(addr, e.to_string()))?;
        let theirs = match auth::client_handshake_detailed(
            &conn,
            sh.cfg.secret.expose(),
            &hello.encode(),
            deadline,
        ) {
            Ok(theirs) => theirs,
            Err(e) if e.retryable && !sh.stop.load(Ordering::SeqCst) => {
                tracing::debug!("rank {rank}: rank {peer} hung up the handshake; retrying");
                thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(200));
                continue;
            }
            Err(e) => return Err(*e.error),
        };
        match Hello::decode(&theirs) {
            Some(h)
                if h.rank as usize == peer
                    && h.size as usize == size
                    && h.streams as usize == sh.cfg.streams => {}
            _ => {
                return Err(fail(
                    addr,
                    format!(
                        "the process there is not rank {peer} of this job with {} streams per \
                         peer (different HCOMM_SIZE or HCOMM_TCP_STREAMS?)",
                        sh.cfg.streams
                    ),
                ))
            }
        }
        return match read_verdict(&conn, deadline) {
            Ok(TAKEN) => Ok(Some(conn)),
            Ok(_) => Ok(None),
            Err(e) => Err(fail(
                addr,
                format!("reading its verdict on the connection: {e}"),
            )),
        };
    }
}

/// Reads the acceptor's verdict on a connection, before `deadline`.
fn read_verdict(mut conn: &TcpStream, deadline: Instant) -> io::Result<u8> {
    let left = deadline.saturating_duration_since(Instant::now());
    conn.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
    let mut b = [0u8; 1];
    conn.read_exact(&mut b)?;
    conn.set_read_timeout(None)?;
    Ok(b[0])
}

/// The handshake of one accepted connection: authenticates it, decides by the tie rule
/// whether to take it, tells the dialer, and hands the pair to the engine once all of its
/// streams came.
fn admit(sh: &Arc<MeshShared>, mut conn: TcpStream) -> Result<()> {
    let (rank, size) = (sh.cfg.rank, sh.cfg.addrs.len());
    let deadline = Instant::now() + HANDSHAKE_LIMIT;
    conn.set_nonblocking(false)
        .map_err(|e| Error::transport("configuring a connection", e))?;
    tune(&conn).map_err(|e| Error::transport("configuring a connection", e))?;
    let live = Live::track(sh, &conn).map_err(|e| Error::transport("tracking a connection", e))?;
    let theirs = auth::server_handshake(&mut conn, sh.cfg.secret.expose(), &sh.hello, deadline)?;
    let h = Hello::decode(&theirs)
        .ok_or_else(|| Error::init("malformed hello from an authenticated peer"))?;
    let replaces = h.stream & REPLACES != 0;
    let (peer, s) = (h.rank as usize, usize::from(h.stream & !REPLACES));
    let streams = if peer < size {
        sh.cfg.streams_with(peer)
    } else {
        0
    };
    if h.size as usize != size
        || h.streams as usize != streams
        || peer == rank
        || peer >= size
        || s >= streams
    {
        return Err(Error::init(format!(
            "rank {peer} announced size {} and {} streams (expected another rank of {size} \
             with {streams} streams): mixed job settings?",
            h.size, h.streams
        ))
        .with_peer(PeerRank::world(peer)));
    }
    drop(live);
    let mut pairs = lock(&sh.pairs);
    let pair = &mut pairs[peer];
    let take = if replaces {
        matches!(pair, Pair::Up)
    } else if s == 0 {
        takes(rank, peer, pair)
    } else {
        matches!(pair, Pair::Accepting { socks, .. } if socks[s].is_none())
    };
    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
    (&conn)
        .write_all(&[if take { TAKEN } else { REFUSED }])
        .map_err(|e| Error::transport("sending the verdict on a connection", e))?;
    let _ = conn.set_write_timeout(None);
    if !take {
        return Ok(());
    }
    if replaces {
        drop(pairs);
        sh.accepted.fetch_add(1, Ordering::Relaxed);
        deliver(
            sh,
            Ready::Rail {
                peer,
                stream: s,
                sock: conn,
            },
        );
        return Ok(());
    }
    // Stream 0 of a pair of several: watched until the others came (see `await_streams`).
    let mut first = None;
    if s == 0 {
        let since = Instant::now();
        *pair = accepting(pair, streams, since);
        if streams > 1 {
            let watch = conn
                .try_clone()
                .map_err(|e| Error::transport("duplicating a connection", e))?;
            first = Some((watch, since));
        }
    }
    let Pair::Accepting { socks, .. } = pair else {
        return Ok(());
    };
    socks[s] = Some(conn);
    if socks.iter().all(Option::is_some) {
        let socks: Vec<TcpStream> = socks.drain(..).flatten().collect();
        *pair = Pair::Up;
        sh.accepted.fetch_add(socks.len() as u64, Ordering::Relaxed);
        deliver(
            sh,
            Ready::Up {
                peer,
                socks,
                dialed: false,
            },
        );
    }
    drop(pairs);
    match first {
        Some((watch, since)) => await_streams(sh, peer, &watch, since),
        None => Ok(()),
    }
}

/// After taking stream 0 of a pair of several: waits until the dialer's other streams came.
/// Should the dialer hang up stream 0 first (its process died half-way) or not finish within
/// the handshake limit, the half set is dropped, and the pair is dialed from this side if the
/// engine asked for the peer meanwhile (which then fails naming the peer if it is gone).
fn await_streams(
    sh: &Arc<MeshShared>,
    peer: usize,
    watch: &TcpStream,
    since: Instant,
) -> Result<()> {
    use rustix::event::{poll, PollFd, PollFlags};
    let step = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 5_000_000,
    };
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        if !matches!(&lock(&sh.pairs)[peer], Pair::Accepting { since: s, .. } if *s == since) {
            return Ok(());
        }
        let mut fds = [PollFd::new(watch, PollFlags::RDHUP)];
        let hung_up = match poll(&mut fds, Some(&step)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => !fds[0].revents().is_empty(),
            Err(_) => true,
        };
        if hung_up || since.elapsed() >= HANDSHAKE_LIMIT {
            break;
        }
    }
    let mut pairs = lock(&sh.pairs);
    if !matches!(&pairs[peer], Pair::Accepting { since: s, .. } if *s == since) {
        return Ok(());
    }
    let wanted = give_up(&mut pairs[peer]);
    drop(pairs);
    if wanted {
        start_dial(sh, peer);
    }
    Err(Error::init(format!(
        "rank {peer} left its connection half set up (did its process end?)"
    ))
    .with_peer(PeerRank::world(peer)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One rank of the model of two ranks connecting: its state, and whether it dials.
    #[derive(Debug)]
    struct Side {
        pair: Pair,
        dials: bool,
    }

    /// The steps of one rank's dial: it wants the peer, its stream 0 reaches the peer (which
    /// decides by the tie rule), the verdict comes back.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Step {
        Want,
        Arrive,
        Verdict,
    }

    /// Plays the steps of ranks 0 and 1 (`order`: which rank steps next) and returns their
    /// states and which rank's connection each took (as dialer or acceptor).
    fn play(order: &[usize]) -> ([Side; 2], Vec<usize>) {
        let mut sides = [0, 1].map(|_| Side {
            pair: Pair::Idle,
            dials: false,
        });
        let mut next = [0usize; 2];
        let mut verdict = [None::<bool>; 2];
        let mut taken = Vec::new();
        let steps = [Step::Want, Step::Arrive, Step::Verdict];
        for &me in order {
            let peer = 1 - me;
            let step = steps[next[me]];
            next[me] += 1;
            match step {
                Step::Want => {
                    if matches!(sides[me].pair, Pair::Idle) {
                        sides[me].pair = Pair::Dialing;
                        sides[me].dials = true;
                    }
                }
                Step::Arrive if sides[me].dials => {
                    let take = takes(peer, me, &sides[peer].pair);
                    if take {
                        // One stream: taking stream 0 brings the pair up.
                        sides[peer].pair = Pair::Up;
                        taken.push(me);
                    }
                    verdict[me] = Some(take);
                }
                Step::Verdict if sides[me].dials => match (verdict[me], &sides[me].pair) {
                    (Some(true), Pair::Dialing) => sides[me].pair = Pair::Up,
                    (Some(true), other) => panic!("{order:?}: taken while {other:?}"),
                    (Some(false), Pair::Dialing) => sides[me].pair = Pair::Awaiting,
                    _ => {}
                },
                _ => {}
            }
        }
        (sides, taken)
    }

    /// Every interleaving of both ranks' dials (each wants the other, its stream 0 arrives,
    /// its verdict returns, in that order): exactly one connection is taken, both ranks end
    /// up connected, and when both dialed before either arrived the lower rank's won.
    #[test]
    fn the_tie_rule_keeps_exactly_one_connection_in_every_interleaving() {
        let mut orders = Vec::new();
        for mask in 0u32..64 {
            if mask.count_ones() == 3 {
                orders.push((0..6).map(|i| (mask >> i & 1) as usize).collect::<Vec<_>>());
            }
        }
        assert_eq!(orders.len(), 20);
        for order in &orders {
            let (sides, taken) = play(order);
            assert_eq!(taken.len(), 1, "{order:?}: {sides:?}");
            for s in &sides {
                assert!(matches!(s.pair, Pair::Up), "{order:?}: {sides:?}");
            }
            if sides[0].dials && sides[1].dials {
                // Both dialed: whichever arrived first while the other still dialed, the
                // lower rank's connection is the one kept unless the higher one's arrived at
                // an idle rank 0.
                let first_arrival = order
                    .iter()
                    .enumerate()
                    .filter(|&(i, &r)| order[..=i].iter().filter(|&&x| x == r).count() == 2)
                    .map(|(_, &r)| r)
                    .next();
                if first_arrival == Some(1) {
                    // Rank 0 was dialing when rank 1's arrived: refused.
                    assert_eq!(taken, vec![0], "{order:?}");
                }
            }
        }
    }

    /// A rank that dials or awaits the peer and takes the peer's stream 0 still wants it: when
    /// the peer gives up half-way (its process died between its streams), the pair is dialed
    /// again from this side, so it fails (or comes up) instead of staying idle forever. A
    /// rank that never asked for the peer goes back to idle, unless it asked meanwhile.
    #[test]
    fn a_pair_taken_while_dialing_is_dialed_again_when_the_peer_gives_up_half_way() {
        let since = Instant::now();
        for (before, dials_again) in [
            (Pair::Dialing, true),
            (Pair::Awaiting, true),
            (Pair::Idle, false),
        ] {
            let mut pair = accepting(&before, 2, since);
            assert!(
                matches!(&pair, Pair::Accepting { socks, .. } if socks.len() == 2),
                "{before:?}: {pair:?}"
            );
            assert_eq!(give_up(&mut pair), dials_again, "{before:?}");
            if dials_again {
                assert!(matches!(pair, Pair::Dialing), "{before:?}: {pair:?}");
            } else {
                assert!(matches!(pair, Pair::Idle), "{before:?}: {pair:?}");
            }
        }
        // Wanted after the stream 0 was taken (`Mesh::want` sets the flag), and kept by a
        // stale half set taken afresh.
        let mut pair = accepting(&Pair::Idle, 2, since);
        if let Pair::Accepting { wanted, .. } = &mut pair {
            *wanted = true;
        }
        let mut afresh = accepting(&pair, 2, Instant::now());
        assert!(give_up(&mut afresh));
        assert!(matches!(afresh, Pair::Dialing));
    }

    /// The rule on its own: a rank that dials refuses a higher peer and takes a lower one;
    /// idle or awaiting ranks take, connected or failed ones refuse.
    #[test]
    fn the_lower_rank_s_connection_wins_a_tie() {
        assert!(!takes(2, 5, &Pair::Dialing));
        assert!(takes(5, 2, &Pair::Dialing));
        for me in [0, 3] {
            assert!(takes(me, 1, &Pair::Idle));
            assert!(takes(me, 1, &Pair::Awaiting));
            assert!(!takes(me, 1, &Pair::Up));
            assert!(!takes(me, 1, &Pair::Failed));
        }
        let fresh = Pair::Accepting {
            socks: vec![None, None],
            since: Instant::now(),
            wanted: false,
        };
        assert!(!takes(0, 1, &fresh));
        let stale = Pair::Accepting {
            socks: vec![None, None],
            since: Instant::now() - HANDSHAKE_LIMIT,
            wanted: true,
        };
        assert!(takes(0, 1, &stale));
    }

    /// Published addresses round-trip, IPv6 bracketed; a malformed list is refused whole.
    #[test]
    fn rails_publish_every_address_bracketing_ipv6() {
        let ips: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "fd00::2".parse().unwrap()];
        let text = format_addrs(&ips, 4242);
        assert_eq!(text, "10.0.0.1:4242,[fd00::2]:4242");
        let back = parse_addrs(&text).unwrap();
        assert_eq!(back.iter().map(|a| a.ip()).collect::<Vec<_>>(), ips);
        assert!(back.iter().all(|a| a.port() == 4242));
        for bad in ["", "10.0.0.1", "fd00::2:4242", "10.0.0.1:1,", "x:1"] {
            assert_eq!(parse_addrs(bad), None, "{bad}");
        }
    }

    /// Streams go round the rails the pair shares; at least one stream per shared rail. The
    /// settings' Debug does not show the secret.
    #[test]
    fn streams_take_the_rails_in_turn() {
        let a = |s: &str| parse_addrs(s).unwrap();
        let cfg = MeshConfig {
            listener: TcpListener::bind("127.0.0.1:0").unwrap(),
            rank: 0,
            addrs: vec![
                a("10.0.0.1:1,10.0.1.1:1"),
                a("10.0.0.2:2,10.0.1.2:2"),
                a("[fd00::3]:3"),
            ],
            streams: 1,
            secret: Secret::new("the job's secret"),
            timeout: Duration::from_secs(1),
            failover: None,
            link_timeout: Duration::from_secs(1),
            congestion: None,
        };
        assert_eq!(cfg.streams_with(1), 2);
        assert_eq!(cfg.streams_with(2), 1);
        let shown = format!("{cfg:?}");
        assert!(
            shown.contains("secret: <redacted>") && !shown.contains("job's"),
            "{shown}"
        );
        let dialed: Vec<String> = (0..4).map(|s| cfg.addr_of(1, s).to_string()).collect();
        assert_eq!(
            dialed,
            ["10.0.0.2:2", "10.0.1.2:2", "10.0.0.2:2", "10.0.1.2:2"]
        );
        assert_eq!(cfg.addr_of(2, 1).to_string(), "[fd00::3]:3");
        // Failover by default where two rails are shared; forced, where two streams are.
        assert!(cfg.failover_with(1).is_some() && cfg.failover_with(2).is_none());
        let more = MeshConfig { streams: 4, ..cfg };
        assert_eq!(more.streams_with(1), 4);
        assert!(more.failover_with(2).is_none());
        let forced = MeshConfig {
            failover: Some(true),
            ..more
        };
        assert!(forced.failover_with(2).is_some());
        let off = MeshConfig {
            failover: Some(false),
            ..forced
        };
        assert!(off.failover_with(1).is_none());
    }

    /// The congestion control of a data-path socket, as the kernel reports it.
    fn congestion_of(sock: impl std::os::fd::AsFd) -> String {
        let name = socket2::SockRef::from(&sock).tcp_congestion().unwrap();
        String::from_utf8_lossy(&name)
            .trim_end_matches('\0')
            .to_string()
    }

    #[test]
    fn connections_start_with_the_congestion_control_asked_for() {
        // `reno` is built into every Linux kernel and always allowed.
        let listener = listen(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        let asked = congestion_control(&listener, Some("reno")).unwrap();
        assert_eq!(asked.as_deref(), Some(&b"reno"[..]));
        let addr = listener.local_addr().unwrap();
        let dialed = dial_with(addr, Duration::from_secs(5), asked.as_deref()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        // The dialer set it before connecting; the accepted end inherits the listener's.
        assert_eq!(congestion_of(&dialed), "reno");
        assert_eq!(congestion_of(&accepted), "reno");
        tune(&accepted).unwrap();
        assert_eq!(congestion_of(&accepted), "reno");

        // `system` leaves the listener as it is; a name the kernel does not know is an error
        // that names the variable.
        let listener = listen(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        let before = congestion_of(&listener);
        assert_eq!(congestion_control(&listener, Some("system")).unwrap(), None);
        assert_eq!(congestion_of(&listener), before);
        let e = congestion_control(&listener, Some("no_such_cc")).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(
            e.to_string().contains("HCOMM_TCP_CONGESTION=no_such_cc"),
            "{e}"
        );
        // Unset: the default where the kernel allows it, else the system's.
        match congestion_control(&listener, None).unwrap() {
            Some(name) => {
                assert_eq!(name, DEFAULT_TCP_CONGESTION.as_bytes());
                assert_eq!(congestion_of(&listener), DEFAULT_TCP_CONGESTION);
            }
            None => assert_eq!(congestion_of(&listener), before),
        }
    }

    /// Whatever an authenticated peer says in its hello: decoding never panics or allocates,
    /// accepts only a 16-byte hello with the magic (which re-encodes to the same bytes), and
    /// valid hellos round-trip.
    #[test]
    fn fuzz_hello_decode() {
        let hello = |rank, size, stream, streams| Hello {
            rank,
            size,
            stream,
            streams,
        };
        let target = crate::fuzz::Target {
            name: "tcp Hello::decode",
            default_cases: 100_000,
            seeds: vec![
                hello(1, 2, 0, 2).encode(),
                hello(u32::MAX, 0, 15, 16).encode(),
            ],
            max_len: 24,
            dict: vec![u32::from_le_bytes(*HELLO_MAGIC) as u64, 16],
        };
        crate::fuzz::run(&target, |input, rng| {
            let (decoded, usage) = crate::fuzz::measure(|| Hello::decode(input));
            assert_eq!(usage.largest, 0);
            if let Some(h) = decoded {
                assert_eq!(h.encode(), input);
            }
            let r = rng.next_u64();
            let valid = hello(r as u32, (r >> 32) as u32, r as u16, (r >> 16) as u16);
            assert_eq!(Hello::decode(&valid.encode()), Some(valid));
        });
    }
}
