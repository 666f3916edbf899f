//! TCP links between ranks: a listener on a free port, the authenticated all-pairs mesh, and
//! the socket options of the data path.
//!
//! Every pair of ranks gets `streams` connections, opened by the higher rank towards the lower
//! one, so no pair ever races to connect twice. Each connection proves, by the job secret's
//! challenge-response, that both ends belong to the job, and says which rank and stream it
//! is; anything else on the listener is dropped after a bounded handshake.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::bootstrap::auth;
use crate::error::{Error, PeerRank, Result};

/// A handshake that takes longer than this is dropped, so a silent intruder frees its slot.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// At most this many handshakes run at once on a listener; further connections wait in the
/// listen backlog until one ends (a crowd of ranks is served in turn, never turned away).
const MAX_PENDING_HANDSHAKES: usize = 64;
const HELLO_MAGIC: &[u8; 4] = b"HCMT";

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

/// Sets the options of a data-path socket.
pub(crate) fn tune(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let sock = socket2::SockRef::from(stream);
    sock.set_keepalive(true)?;
    Ok(())
}

/// Establishes `streams` authenticated connections to every other rank `r` with `pairs[r]`
/// (both ranks of a pair must agree on it).
///
/// `addrs[r]` is where rank `r` listens; `listener` is this rank's own. Returns, for each
/// rank, its connections in stream order (empty for this rank and the ranks without a
/// connection). Bounded by `deadline`.
pub(crate) fn connect_mesh(
    listener: TcpListener,
    rank: usize,
    addrs: &[SocketAddr],
    pairs: &[bool],
    streams: usize,
    secret: &[u8],
    deadline: Instant,
) -> Result<Vec<Vec<TcpStream>>> {
    let size = addrs.len();
    let mut links: Vec<Vec<Option<TcpStream>>> = (0..size)
        .map(|r| {
            if r == rank || !pairs.get(r).copied().unwrap_or(false) {
                Vec::new()
            } else {
                (0..streams).map(|_| None).collect()
            }
        })
        .collect();
    let expected_in = expected_in(&links, rank);
    let secret: Arc<[u8]> = Arc::from(secret);
    let (tx, rx) = mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let (secret, done) = (Arc::clone(&secret), Arc::clone(&done));
        thread::Builder::new()
            .name("hcomm-accept".into())
            .spawn(move || {
                accept_peers(
                    listener,
                    rank,
                    size,
                    streams,
                    expected_in,
                    secret,
                    deadline,
                    tx,
                    done,
                )
            })
            .map_err(|e| {
                Error::init(format!("cannot start the accept thread: {e}")).with_source(e)
            })?
    };
    let result = collect_links(&mut links, &rx, rank, addrs, streams, &secret, deadline);
    // Stop the acceptor on every path, so no thread or listener outlives a failed setup.
    done.store(true, Ordering::SeqCst);
    let _ = acceptor.join();
    result?;
    Ok(links
        .into_iter()
        .map(|l| l.into_iter().flatten().collect())
        .collect())
}

/// Connects to the lower ranks and gathers the accepted connections of the higher ones.
fn collect_links(
    links: &mut [Vec<Option<TcpStream>>],
    rx: &mpsc::Receiver<(usize, usize, TcpStream)>,
    rank: usize,
    addrs: &[SocketAddr],
    streams: usize,
    secret: &[u8],
    deadline: Instant,
) -> Result<()> {
    let size = addrs.len();
    let expected_in = expected_in(links, rank);
    for (peer, addr) in addrs.iter().enumerate().take(rank) {
        for (s, link) in links[peer].iter_mut().enumerate() {
            *link = Some(connect_one(
                *addr, rank, size, peer, s, streams, secret, deadline,
            )?);
        }
    }
    let mut got = 0;
    while got < expected_in {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((peer, s, stream)) => {
                // A connection of a pair that has none is dropped.
                if let Some(slot @ None) = links[peer].get_mut(s) {
                    *slot = Some(stream);
                    got += 1;
                }
            }
            Err(_) => {
                let missing: Vec<usize> = (rank + 1..size)
                    .filter(|&p| links[p].iter().any(Option::is_none))
                    .collect();
                return Err(Error::timeout(format!(
                    "rank {rank}: ranks {missing:?} did not connect within HCOMM_TIMEOUT; are \
                     they running, and can they reach this host?"
                )));
            }
        }
    }
    Ok(())
}

/// How many connections the higher ranks open to this one (the slots of `links` above it).
fn expected_in(links: &[Vec<Option<TcpStream>>], rank: usize) -> usize {
    links.iter().skip(rank + 1).map(Vec::len).sum()
}

#[allow(clippy::too_many_arguments)]
fn connect_one(
    addr: SocketAddr,
    rank: usize,
    size: usize,
    peer: usize,
    stream: usize,
    streams: usize,
    secret: &[u8],
    deadline: Instant,
) -> Result<TcpStream> {
    let fail = |what: String| {
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
    let (conn, theirs) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::timeout(format!(
                "rank {rank} could not connect to rank {peer} at {addr} within HCOMM_TIMEOUT"
            ))
            .with_peer(PeerRank::world(peer)));
        }
        let conn = match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(c) => c,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut
                ) =>
            {
                thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(fail(e.to_string())),
        };
        tune(&conn).map_err(|e| fail(e.to_string()))?;
        match auth::client_handshake_detailed(&conn, secret, &hello.encode(), deadline) {
            Ok(theirs) => break (conn, theirs),
            Err(e) if e.retryable => {
                tracing::debug!("rank {rank}: rank {peer} hung up the handshake; retrying");
                thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(e.error),
        }
    };
    match Hello::decode(&theirs) {
        Some(h)
            if h.rank as usize == peer
                && h.size as usize == size
                && h.streams as usize == streams =>
        {
            Ok(conn)
        }
        _ => Err(fail(format!(
            "the process there is not rank {peer} of this job with {streams} streams per peer \
             (different HCOMM_SIZE or HCOMM_TCP_STREAMS?)"
        ))),
    }
}

#[allow(clippy::too_many_arguments)]
fn accept_peers(
    listener: TcpListener,
    rank: usize,
    size: usize,
    streams: usize,
    expected: usize,
    secret: Arc<[u8]>,
    deadline: Instant,
    tx: mpsc::Sender<(usize, usize, TcpStream)>,
    done: Arc<AtomicBool>,
) {
    if expected == 0 {
        return;
    }
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!("rank {rank}: cannot poll the listener: {e}");
        return;
    }
    let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let me = Hello {
        rank: rank as u32,
        size: size as u32,
        stream: 0,
        streams: streams as u16,
    }
    .encode();
    let me: Arc<[u8]> = Arc::from(me);
    // The handshakes in flight, and whether each handed its connection over as a link: the
    // others are ended (their sockets shut down) and joined when the acceptor stops, so that
    // no intruder's silent connection keeps a thread after init.
    type Handshake = (thread::JoinHandle<()>, TcpStream, Arc<AtomicBool>);
    let mut handshakes: Vec<Handshake> = Vec::new();
    // Stops when the deadline passes or when the main thread has all its links.
    while Instant::now() < deadline {
        handshakes.retain(|(t, _, _)| !t.is_finished());
        // No slot: leave the next connections in the backlog until a handshake ends.
        if pending.load(std::sync::atomic::Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES {
            if done.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            thread::sleep(Duration::from_millis(2));
            continue;
        }
        match listener.accept() {
            Ok((conn, from)) => {
                use std::sync::atomic::Ordering::SeqCst;
                let Ok(end) = conn.try_clone() else {
                    tracing::warn!("rank {rank}: cannot keep track of {from}, dropping it");
                    continue;
                };
                pending.fetch_add(1, SeqCst);
                let handed = Arc::new(AtomicBool::new(false));
                let (tx, secret, me, slot, handing) = (
                    tx.clone(),
                    Arc::clone(&secret),
                    Arc::clone(&me),
                    Arc::clone(&pending),
                    Arc::clone(&handed),
                );
                let spawned =
                    thread::Builder::new()
                        .name("hcomm-handshake".into())
                        .spawn(move || {
                            let limit = deadline.min(Instant::now() + HANDSHAKE_LIMIT);
                            match accept_one(conn, rank, size, streams, &secret, &me, limit) {
                                Ok((peer, s, c)) => {
                                    handing.store(true, SeqCst);
                                    let _ = tx.send((peer, s, c));
                                }
                                Err(e) => tracing::warn!(
                                    "rank {rank}: dropped connection from {from}: {e}"
                                ),
                            }
                            slot.fetch_sub(1, SeqCst);
                        });
                match spawned {
                    Ok(t) => handshakes.push((t, end, handed)),
                    Err(_) => {
                        pending.fetch_sub(1, SeqCst);
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                thread::sleep(Duration::from_millis(2));
            }
            Err(e) => {
                tracing::warn!("rank {rank}: accept failed: {e}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
    // Every link arrived (or the deadline passed): a handshake that has not handed over a
    // link is an intruder's, whose blocked read or write fails once its socket is shut down.
    for (t, end, handed) in handshakes {
        if !handed.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = end.shutdown(std::net::Shutdown::Both);
        }
        let _ = t.join();
    }
}

fn accept_one(
    mut conn: TcpStream,
    rank: usize,
    size: usize,
    streams: usize,
    secret: &[u8],
    me: &[u8],
    deadline: Instant,
) -> Result<(usize, usize, TcpStream)> {
    conn.set_nonblocking(false)
        .map_err(|e| Error::transport("configuring a connection", e))?;
    tune(&conn).map_err(|e| Error::transport("configuring a connection", e))?;
    let theirs = auth::server_handshake(&mut conn, secret, me, deadline)?;
    let h = Hello::decode(&theirs)
        .ok_or_else(|| Error::init("malformed hello from an authenticated peer"))?;
    let (peer, s) = (h.rank as usize, h.stream as usize);
    if h.size as usize != size
        || h.streams as usize != streams
        || peer <= rank
        || peer >= size
        || s >= streams
    {
        return Err(Error::init(format!(
            "rank {peer} announced size {} and {} streams (expected a rank above {rank} of {size} \
             with {streams} streams): mixed job settings?",
            h.size, h.streams
        ))
        .with_peer(PeerRank::world(peer)));
    }
    Ok((peer, s, conn))
}

#[cfg(test)]
mod tests {
    use super::*;

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
