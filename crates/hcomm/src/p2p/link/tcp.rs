//! A link over TCP: framed streams (`HCOMM_TCP_STREAMS` per peer), written from queues and
//! read into the destinations the engine names, waited on with epoll.
//!
//! Control frames and eager messages take stream 0, so that they stay in order; rendezvous
//! data frames (which carry their offset) are spread over all streams. The goodbye (`Close`)
//! takes stream 0 too: after it, the end of stream 0 is orderly, and data may still arrive on
//! the others until they end too.
//!
//! **Failover** (`HCOMM_FAILOVER`; by default on pairs that share two rails or more): every
//! frame on a stream is preceded by a record ([`Record`]) naming its origin (the stream it was
//! first written on, and its number there) and acknowledging the frames read so far on the
//! same stream the other way. A sender keeps each frame it wrote until the peer acknowledged
//! it: control and eager frames as a copy (their sends complete when written, as without
//! failover), data frames in place, their sends completing when acknowledged (a stream that
//! goes quiet asks for an acknowledgement with its last frame). A stream that fails (an
//! error, an end without goodbye, or data unacknowledged for `HCOMM_LINK_TIMEOUT`, which the
//! kernel enforces with `TCP_USER_TIMEOUT`) is dropped, and what it held and queued goes out
//! on another, in order, with its origin: the receiver takes each origin's frames in order
//! once, skips those it already had, and resumes a payload it was reading on the dead stream.
//! The ordered frames move with it. Nothing is lost, duplicated or reordered; only when the
//! last stream fails is the peer lost ("all links lost").
//!
//! Behind a transport plug-in (its fallback, see `plugin.rs`), the link carries the records
//! from the start, on one stream too: the plug-in's frames not acknowledged come here with
//! their plug-in origin ([`PLUGIN`]) after a notice ([`TcpLink::take_over`]), and the
//! receiver takes them as it takes a dead stream's, counting from what its plug-in link took
//! ([`Handoff`]).
//!
//! The link exists from init but its connection does not: it is made on the link's first use
//! ([`Link::want`], or the first frame pushed), by the world's [`Mesh`], and handed to the
//! link when it is up ([`TcpLink::attach`]); frames pushed meanwhile wait, in order, and go
//! out once it is. A link never used costs no socket, and owes its peer no goodbye.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;
use std::time::Duration;

use rustix::event::epoll;

use super::kept::{Handoff, Kept, Origin, Queued, PLUGIN};
use super::{token, Caps, Dests, Kind, Link, Liveness, Ops, Rx};
use crate::error::{Error, PeerRank, Result};
use crate::p2p::requests::frame_payload;
use crate::p2p::{Dest, Io, OpId, OutFrame};
use crate::transport::tcp::{self, Mesh};
use crate::transport::wire::{FrameHeader, FrameKind, HEADER_LEN};

/// Largest frame (with its record) copied into one buffer and sent with `send` rather than
/// gathered by `sendmsg`: between two network namespaces, 8 B ping-pong 3.72 against 3.84 us,
/// all-reduce 4.14 against 4.38 us (3 interleaved rounds).
const SMALL_SEND: usize = 256;

/// Bytes buffered per stream for small frames; larger payloads are read in place.
const RX_BUF: usize = 64 * 1024;
/// Read and write rounds per stream per event, so one busy peer cannot starve the others.
const MAX_ROUNDS: usize = 64;
/// A receiver acknowledges at least every this many frames read on a stream.
const ACK_EVERY: u64 = 32;

/// Bytes of a failover record.
const REC_LEN: usize = 24;
/// "RA": a failover record.
const REC_MAGIC: u16 = 0x4152;
/// Record flag: no frame follows (an acknowledgement alone).
const REC_ACK_ONLY: u16 = 1;
/// Record flag: the receiver should acknowledge at once (the sender's stream goes quiet).
const REC_ACK_WANTED: u16 = 2;
/// Record flag (with [`REC_ACK_ONLY`]): the sender gave up the stream the origin names; the
/// receiver gives it up too, and sends what it held there on another.
const REC_DROPPED: u16 = 4;

/// The record before each frame on a stream that can fail over (little-endian: magic u16,
/// flags u16, origin stream u16, its generation u16, origin number u64, acknowledged u64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    flags: u16,
    /// The stream the frame was first written on, and its number among that stream's frames.
    origin: Origin,
    /// Frames this side has read in full on this stream.
    ack: u64,
}

impl Record {
    fn encode(&self) -> [u8; REC_LEN] {
        let mut b = [0u8; REC_LEN];
        b[0..2].copy_from_slice(&REC_MAGIC.to_le_bytes());
        b[2..4].copy_from_slice(&self.flags.to_le_bytes());
        b[4..6].copy_from_slice(&self.origin.stream.to_le_bytes());
        b[6..8].copy_from_slice(&self.origin.gen.to_le_bytes());
        b[8..16].copy_from_slice(&self.origin.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.ack.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Record> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        if b.len() != REC_LEN || u16_at(0) != REC_MAGIC {
            return None;
        }
        let flags = u16_at(2);
        if flags & !(REC_ACK_ONLY | REC_ACK_WANTED | REC_DROPPED) != 0 {
            return None;
        }
        Some(Record {
            flags,
            origin: Origin {
                stream: u16_at(4),
                gen: u16_at(6),
                seq: u64_at(8),
            },
            ack: u64_at(16),
        })
    }
}

#[derive(Debug)]
enum RxState {
    Header,
    /// A header was handed to the engine, which has not placed its payload yet.
    Placing,
    Payload {
        hdr: FrameHeader,
        dest: Dest,
        done: usize,
    },
    /// The payload of a frame this side already had (sent again after a failover), dropped.
    Skip {
        left: usize,
    },
}

#[derive(Debug)]
struct Stream {
    sock: TcpStream,
    /// The local and remote addresses, for messages.
    rail: String,
    out: VecDeque<Queued>,
    /// Registered for `EPOLLOUT` (frames wait for room).
    want_out: bool,
    rx_buf: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    rx: RxState,
    /// The peer closed its sending side of this stream.
    eof: bool,
    /// An event (or a direct read) says there may be something to read.
    ready_in: bool,
    /// Frames may be written (an event, or a frame queued on an empty queue).
    ready_out: bool,
    /// Reads since the stream became ready, and whether the last one emptied the socket.
    reads: usize,
    short_read: bool,
    /// Failover only: the stream died and its frames went to another.
    dead: bool,
    /// The record being written (`rec_len` 0: none), and whether it is the front frame's
    /// (else an acknowledgement alone); whether the front frame's record was composed.
    rec: [u8; REC_LEN],
    rec_len: usize,
    rec_done: usize,
    rec_frame: bool,
    front_rec: bool,
    /// The frames written and not acknowledged yet, kept to be sent again should the stream
    /// die.
    kept: Kept,
    /// Frames read in full, the count last acknowledged, whether an acknowledgement is due,
    /// and whether the frame being read asked for one.
    read: u64,
    ack_sent: u64,
    ack_due: bool,
    ack_wanted: bool,
    /// The origin of the frame being read.
    reading: Option<Origin>,
    /// Streams this side gave up (and their generations), to tell the peer on this one.
    notices: VecDeque<(u16, u16)>,
    /// How many times this stream's connection was made again.
    gen: u16,
}

impl Stream {
    /// Reads what the socket has into the whole receive buffer (it held nothing left to
    /// read); `Drained` when nothing came.
    #[inline]
    fn refill(&mut self) -> std::result::Result<(), ReadEnd> {
        self.rx_start = 0;
        self.rx_end = 0;
        match read_some(&mut self.sock, &mut self.rx_buf[..])? {
            Some(n) => {
                self.rx_end = n;
                self.short_read = n < RX_BUF;
                Ok(())
            }
            None => Err(ReadEnd::Drained),
        }
    }

    fn new(sock: TcpStream) -> Stream {
        let rail = match (sock.local_addr(), sock.peer_addr()) {
            (Ok(l), Ok(p)) => format!("{} -> {}", l.ip(), p.ip()),
            _ => "?".to_string(),
        };
        Stream {
            sock,
            rail,
            out: VecDeque::new(),
            want_out: false,
            rx_buf: vec![0u8; RX_BUF].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            rx: RxState::Header,
            eof: false,
            // Anything the peer sent before the registration is read on the next poll.
            ready_in: true,
            ready_out: false,
            reads: 0,
            short_read: false,
            dead: false,
            rec: [0; REC_LEN],
            rec_len: 0,
            rec_done: 0,
            rec_frame: false,
            front_rec: false,
            kept: Kept::default(),
            read: 0,
            ack_sent: 0,
            ack_due: false,
            ack_wanted: false,
            reading: None,
            notices: VecDeque::new(),
            gen: 0,
        }
    }

    /// Whether the stream has something to write (a frame, a record, an acknowledgement due).
    fn has_output(&self) -> bool {
        !self.out.is_empty()
            || self.rec_len > 0
            || !self.notices.is_empty()
            || (self.ack_due && self.read > self.ack_sent)
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

/// What reading a stream found.
enum Got {
    /// A frame's header, with its record on a stream that can fail over.
    Header(FrameHeader, Option<Record>),
    /// An acknowledgement alone.
    Ack(Record),
    /// A payload placed earlier has fully arrived.
    Payload(FrameHeader, Dest),
    /// A payload this side already had was dropped to its end.
    Skipped,
}

/// A warning operators must see: through the logger when one is installed, else on stderr
/// (as the stall warnings).
fn warn(msg: &str) {
    if tracing::dispatcher::has_been_set() {
        tracing::warn!("{msg}");
    } else {
        eprintln!("hcomm: {msg}");
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

/// Where the link's connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Conn {
    /// Never used: no connection, none asked for.
    Idle,
    /// Asked for: the mesh connects (or the peer's connection is coming).
    Connecting,
    /// Connected: the streams carry the frames.
    Up,
}

/// The TCP streams to one peer.
#[derive(Debug)]
pub(in crate::p2p) struct TcpLink {
    peer: usize,
    /// Its place among the peer's links (in its epoll tokens).
    index: usize,
    io: Arc<Io>,
    /// The world's connections, which make this one on demand.
    mesh: Arc<Mesh>,
    conn: Conn,
    /// Frames pushed before the connection was up, in order.
    waiting: VecDeque<Queued>,
    /// The transport plug-in in front of this link (fallback): what its link and this one
    /// share.
    behind: Option<Arc<Handoff>>,
    /// The plug-in fell back before the connection was up: the peer is told once it is.
    notice_due: bool,
    /// Why the plug-in in front gave up, for the message should this link fail too.
    plugin_failed: Option<String>,
    /// The peer said it fell back from its plug-in: `poll` tells the engine.
    peer_fell_back: bool,
    streams: Vec<Stream>,
    next_data: usize,
    /// The stream being read.
    cur: usize,
    /// The stream of the ordered frames (0 until it dies).
    lane: usize,
    /// The link timeout when the pair can fail over (`HCOMM_FAILOVER`).
    failover: Option<Duration>,
    /// Failover: the next number of each stream's frames; the next number expected from
    /// each origin stream; a payload whose stream died while it was being read (the header
    /// was dispatched), by origin stream, resumed when the frame comes again.
    next_seq: Vec<u64>,
    rseq: HashMap<(u16, u16), u64>,
    partial: HashMap<(u16, u16), (FrameHeader, Dest)>,
    /// Sends whose data frames were all acknowledged, reported by `poll`.
    acked_ops: VecDeque<OpId>,
    /// The peer's goodbye came on the ordered stream.
    goodbye: bool,
    closed: bool,
    caps: Caps,
}

impl TcpLink {
    /// The link to `peer`, not connected yet; `index`: its place among the peer's links.
    pub(in crate::p2p) fn new(
        peer: usize,
        index: usize,
        io: &Arc<Io>,
        mesh: &Arc<Mesh>,
    ) -> TcpLink {
        TcpLink {
            peer,
            index,
            io: Arc::clone(io),
            mesh: Arc::clone(mesh),
            conn: Conn::Idle,
            waiting: VecDeque::new(),
            behind: None,
            notice_due: false,
            plugin_failed: None,
            peer_fell_back: false,
            streams: Vec::new(),
            next_data: 0,
            cur: 0,
            lane: 0,
            failover: None,
            next_seq: Vec::new(),
            rseq: HashMap::default(),
            partial: HashMap::default(),
            acked_ops: VecDeque::new(),
            goodbye: false,
            closed: false,
            caps: Caps {
                kind: Kind::Tcp,
                read_remote: None,
                max_payload: usize::MAX,
                ordered_end: true,
                wakes_epoll: true,
                polled: false,
                doorbell: false,
                drain_on_loss: false,
                liveness: Liveness::Frames,
            },
        }
    }

    /// Takes over the connected streams to the peer, registers them with the engine's epoll
    /// and queues the frames that waited for them (a flush writes them).
    pub(in crate::p2p) fn attach(&mut self, socks: Vec<TcpStream>) -> Result<()> {
        if self.conn == Conn::Up || self.closed {
            return Err(Error::internal(format!(
                "a second connection to world rank {} came up",
                self.peer
            ))
            .with_peer(PeerRank::world(self.peer)));
        }
        let cfg = self.mesh.config();
        self.failover = cfg
            .failover_with(self.peer)
            .filter(|_| socks.len() >= 2)
            .or(self.behind.as_ref().map(|_| cfg.link_timeout));
        for (s, sock) in socks.into_iter().enumerate() {
            sock.set_nonblocking(true)
                .map_err(|e| Error::transport("configuring a link", e))?;
            if let Some(limit) = self.failover {
                // Data unacknowledged this long fails the stream (link down, black hole).
                socket2::SockRef::from(&sock)
                    .set_tcp_user_timeout(Some(limit))
                    .map_err(|e| Error::transport("configuring a link", e))?;
            }
            epoll::add(
                &self.io.epoll,
                &sock,
                epoll::EventData::new_u64(token(self.peer, self.index, s)),
                epoll::EventFlags::IN,
            )
            .map_err(|e| Error::init(format!("epoll_ctl: {e}")).with_source(e.into()))?;
            self.streams.push(Stream::new(sock));
        }
        self.next_seq = vec![0; self.streams.len()];
        self.conn = Conn::Up;
        if std::mem::take(&mut self.notice_due) {
            self.streams[self.lane].notices.push_back((PLUGIN, 0));
        }
        for q in std::mem::take(&mut self.waiting) {
            self.enqueue(q);
        }
        Ok(())
    }

    /// Stands behind a transport plug-in (its fallback), sharing `handoff` with its link.
    pub(in crate::p2p) fn back(&mut self, handoff: Arc<Handoff>) {
        self.behind = Some(handoff);
    }

    /// The plug-in in front gave up (`why`): `kept` (its frames with their plug-in origins)
    /// and then `queued` (frames never handed to it) go out here, in order, after a notice
    /// that tells the peer (see `plugin.rs`).
    pub(super) fn take_over(
        &mut self,
        kept: VecDeque<Queued>,
        queued: VecDeque<OutFrame>,
        why: &str,
    ) {
        let count = kept.len() + queued.len();
        if self.conn == Conn::Up {
            let lane = &mut self.streams[self.lane];
            lane.notices.push_back((PLUGIN, 0));
            lane.ready_out = true;
        } else {
            self.notice_due = true;
            self.want();
        }
        for q in kept {
            self.enqueue(q);
        }
        for f in queued {
            self.push(f);
        }
        let why = if why.is_empty() {
            "world rank {peer} fell back to TCP".replace("{peer}", &self.peer.to_string())
        } else {
            why.to_string()
        };
        let rail = self.streams.get(self.lane).map_or_else(
            || "the one it is connecting".to_string(),
            |s| s.rail.clone(),
        );
        self.mesh.count_fallback(self.peer, &rail);
        self.plugin_failed = Some(why.clone());
        warn(&format!(
            "rank {}: fallback: the transport plug-in to world rank {} is given up ({why}); \
             its {count} frames not acknowledged or not sent go out on TCP (rail {rail}), and \
             its traffic from now on",
            self.mesh.config().rank,
            self.peer,
        ));
    }

    /// Queues `q` on its stream: one with an origin (moved from a path that died) and every
    /// ordered frame on the lane, data frames round all streams; returns whether nothing was
    /// queued before it there.
    fn enqueue(&mut self, q: Queued) -> bool {
        if self.conn != Conn::Up {
            self.want();
            self.waiting.push_back(q);
            return false;
        }
        let n = self.streams.len();
        let i = match q.f.kind {
            FrameKind::Data if q.origin.is_none() => loop {
                self.next_data = self.next_data.wrapping_add(1);
                let i = (self.next_data - 1) % n;
                if !self.streams[i].dead {
                    break i;
                }
            },
            _ => self.lane,
        };
        let s = &mut self.streams[i];
        s.out.push_back(q);
        let first = s.out.len() == 1;
        s.ready_out |= first;
        first
    }

    /// A new connection for stream `i`, whose earlier one died (its rail came back): the
    /// stream carries frames again, as the next generation of its origin numbers. A stream
    /// this side still used is given up first (the peer found it dead).
    pub(in crate::p2p) fn replace(&mut self, i: usize, sock: TcpStream) -> Result<(), String> {
        let (Some(limit), Some(old)) = (self.failover, self.streams.get(i)) else {
            return Ok(());
        };
        if self.closed {
            return Ok(());
        }
        if !old.dead {
            self.fail_stream(i, "the peer connected it again")?;
        }
        let gen = self.streams[i].gen.wrapping_add(1);
        let setup = sock
            .set_nonblocking(true)
            .and_then(|()| socket2::SockRef::from(&sock).set_tcp_user_timeout(Some(limit)));
        if let Err(e) = setup {
            return Err(format!("configuring a stream connected again: {e}"));
        }
        epoll::add(
            &self.io.epoll,
            &sock,
            epoll::EventData::new_u64(token(self.peer, self.index, i)),
            epoll::EventFlags::IN,
        )
        .map_err(|e| format!("epoll_ctl: {e}"))?;
        let mut stream = Stream::new(sock);
        stream.gen = gen;
        warn(&format!(
            "rank {}: the link to world rank {} has its stream {i} back, on rail {}",
            self.mesh.config().rank,
            self.peer,
            stream.rail
        ));
        self.streams[i] = stream;
        self.next_seq[i] = 0;
        Ok(())
    }

    /// Each stream's rail, `local -> remote`, ` (lost)` after one that failed.
    pub(in crate::p2p) fn rails(&self) -> Vec<String> {
        self.streams
            .iter()
            .map(|s| {
                if s.dead {
                    format!("{} (lost)", s.rail)
                } else {
                    s.rail.clone()
                }
            })
            .collect()
    }

    /// Whether the connection is up.
    pub(in crate::p2p) fn connected(&self) -> bool {
        self.conn == Conn::Up
    }

    /// Whether the link was ever used (its connection is up or being made).
    pub(in crate::p2p) fn used(&self) -> bool {
        self.conn != Conn::Idle
    }

    /// A duplicate of stream 0, whose end the watcher waits for.
    pub(in crate::p2p) fn end_watch(&self) -> Result<TcpStream> {
        let first = self.streams.first().ok_or_else(|| {
            Error::internal(format!("a link to {} has no stream", self.peer))
                .with_peer(PeerRank::world(self.peer))
        })?;
        first
            .sock
            .try_clone()
            .map_err(|e| Error::transport("duplicating a link for the watcher", e))
    }

    /// Composes the next record of stream `i` (failover): the front frame's, else an
    /// acknowledgement alone when one is due.
    fn compose_record(&mut self, i: usize) {
        let s = &mut self.streams[i];
        if s.rec_len > 0 {
            return;
        }
        let last = s.out.len() == 1;
        let notice = if s.front_rec {
            None
        } else {
            s.notices.pop_front()
        };
        let (flags, origin) = match s.out.front_mut() {
            _ if notice.is_some() => {
                s.rec_frame = false;
                let (stream, gen) = notice.unwrap_or_default();
                let origin = Origin {
                    stream,
                    gen,
                    seq: 0,
                };
                (REC_ACK_ONLY | REC_DROPPED, origin)
            }
            Some(q) if !s.front_rec => {
                let origin = *q.origin.get_or_insert_with(|| {
                    let seq = self.next_seq[i];
                    self.next_seq[i] += 1;
                    Origin {
                        stream: i as u16,
                        gen: s.gen,
                        seq,
                    }
                });
                // The stream goes quiet after this frame while sends wait for their
                // acknowledgement: ask for it at once.
                let wanted = last && (q.f.kind == FrameKind::Data || s.kept.holds_ops());
                s.front_rec = true;
                s.rec_frame = true;
                (if wanted { REC_ACK_WANTED } else { 0 }, origin)
            }
            None if s.ack_due && s.read > s.ack_sent => {
                s.rec_frame = false;
                let origin = Origin {
                    stream: 0,
                    gen: 0,
                    seq: 0,
                };
                (REC_ACK_ONLY, origin)
            }
            _ => return,
        };
        s.ack_due = false;
        s.ack_sent = s.read;
        s.rec = Record {
            flags,
            origin,
            ack: s.read,
        }
        .encode();
        s.rec_len = REC_LEN;
        s.rec_done = 0;
    }

    /// Writes queued frames of stream `i` until the socket is full or the queue empty (a
    /// small frame copied into one buffer first: `send` rather than `sendmsg`).
    fn flush_stream(&mut self, i: usize, ops: &Ops, sent: &mut Vec<OpId>) -> Result<bool, String> {
        let reliable = self.failover.is_some();
        self.streams[i].ready_out = false;
        let mut moved = false;
        let mut outcome = Ok(());
        for _ in 0..MAX_ROUNDS {
            if reliable {
                self.compose_record(i);
            }
            let s = &mut self.streams[i];
            let rec = &s.rec[s.rec_done..s.rec_len];
            let front = if s.rec_len > 0 && !s.rec_frame {
                None
            } else {
                s.out.front_mut()
            };
            if front.is_none() && rec.is_empty() {
                break;
            }
            let (hdr, payload) = match &front {
                Some(q) => (
                    &q.f.hdr[q.f.hdr_done..],
                    frame_payload(&q.f, ops).get(q.f.done..).unwrap_or_default(),
                ),
                None => (&[][..], &[][..]),
            };
            let bufs = [IoSlice::new(rec), IoSlice::new(hdr), IoSlice::new(payload)];
            let sock = socket2::SockRef::from(&s.sock);
            let total = rec.len() + hdr.len() + payload.len();
            // MSG_NOSIGNAL: a peer gone raises no SIGPIPE in the process (a C program keeps
            // the default action, which kills it); the error says so instead.
            let written = if total <= SMALL_SEND {
                let mut one = [0u8; SMALL_SEND];
                let mut at = 0;
                for part in [rec, hdr, payload] {
                    one[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
                sock.send_with_flags(&one[..total], libc::MSG_NOSIGNAL)
            } else {
                sock.send_vectored_with_flags(&bufs, libc::MSG_NOSIGNAL)
            };
            match written {
                Ok(0) => {
                    outcome = Err("the connection accepts no more data".to_string());
                    break;
                }
                Ok(n) => {
                    moved = true;
                    let r = n.min(s.rec_len - s.rec_done);
                    s.rec_done += r;
                    if s.rec_done == s.rec_len {
                        s.rec_len = 0;
                        s.rec_done = 0;
                    }
                    let n = n - r;
                    let Some(q) = s.out.front_mut().filter(|_| s.rec_frame || !reliable) else {
                        continue;
                    };
                    let h = n.min(HEADER_LEN - q.f.hdr_done);
                    q.f.hdr_done += h;
                    q.f.done += n - h;
                    if q.f.hdr_done == HEADER_LEN && q.f.done == q.f.len && s.rec_len == 0 {
                        let Some(mut q) = s.out.pop_front() else {
                            break;
                        };
                        s.front_rec = false;
                        s.rec_frame = false;
                        if !reliable {
                            if let Some(id) = q.f.op {
                                sent.push(id);
                            }
                            continue;
                        }
                        // Kept until acknowledged: data in place (its send completes then),
                        // anything else as a copy (its send completes now).
                        let in_place = q.f.kind == FrameKind::Data && q.f.owned.is_none();
                        if let Some(id) = q.f.op.filter(|_| !in_place) {
                            if q.f.owned.is_none() && q.f.len > 0 {
                                q.f.owned = Some(frame_payload(&q.f, ops).to_vec());
                            }
                            q.f.op = None;
                            sent.push(id);
                        }
                        s.kept.push(q);
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
        let s = &mut self.streams[i];
        let want = s.has_output();
        if outcome.is_ok() && !s.out.is_empty() && s.eof {
            // Its streams are out of the poll set: the rest could never be written.
            outcome = Err("it finalized with messages to it still queued".to_string());
        } else if outcome.is_ok() && want != s.want_out && !s.eof {
            let mut flags = epoll::EventFlags::IN;
            if want {
                flags |= epoll::EventFlags::OUT;
            }
            match epoll::modify(
                &self.io.epoll,
                &s.sock,
                epoll::EventData::new_u64(token(self.peer, self.index, i)),
                flags,
            ) {
                Ok(()) => s.want_out = want,
                Err(e) => outcome = Err(format!("epoll_ctl failed: {e}")),
            }
        }
        outcome.map(|()| moved)
    }

    /// The peer acknowledged `ack` frames of stream `i`: they are dropped, and the sends
    /// whose data frames they were complete (reported by `poll`).
    fn on_ack(&mut self, i: usize, ack: u64) -> Result<(), String> {
        let s = &mut self.streams[i];
        s.kept.ack(ack, 0, &mut self.acked_ops).map_err(|written| {
            format!(
                "it acknowledged {ack} frames on rail {} where {written} were sent",
                s.rail
            )
        })
    }

    /// A frame of stream `i` was read in full (failover): counted, and acknowledged at once
    /// when the sender asked or enough went unacknowledged.
    fn frame_read(&mut self, i: usize) {
        let s = &mut self.streams[i];
        s.read += 1;
        if std::mem::take(&mut s.ack_wanted) || s.read - s.ack_sent >= ACK_EVERY {
            s.ack_due = true;
            if s.out.is_empty() && s.rec_len == 0 && !s.dead && !s.eof {
                // Written now if the socket takes it, else on its next event.
                let _ = self.flush_stream(i, &Ops::default(), &mut Vec::new());
            }
        }
    }

    /// Stream `i` failed (`why`): with failover and another stream left, it is dropped and
    /// what it held or queued goes out on another, in order, the ordered frames included;
    /// else the peer is lost (the error).
    fn fail_stream(&mut self, i: usize, why: &str) -> Result<(), String> {
        if self.failover.is_none() {
            return Err(why.to_string());
        }
        let n = self.streams.len();
        let Some(t) = (1..n)
            .map(|k| (i + k) % n)
            .find(|&k| !self.streams[k].dead && !self.streams[k].eof)
        else {
            let before = self.plugin_failed.as_ref().map_or_else(String::new, |w| {
                format!("; the transport plug-in in front of it had failed: {w}")
            });
            return Err(format!(
                "all links lost (the last, rail {}: {why}{before})",
                self.streams[i].rail
            ));
        };
        let s = &mut self.streams[i];
        s.dead = true;
        s.ready_in = false;
        s.ready_out = false;
        let _ = epoll::delete(&self.io.epoll, &s.sock);
        let _ = s.sock.shutdown(Shutdown::Both);
        if let (RxState::Payload { hdr, dest, .. }, Some(o)) = (&s.rx, s.reading) {
            self.partial.insert(o.key(), (*hdr, *dest));
        }
        s.rx = RxState::Header;
        s.rec_len = 0;
        s.front_rec = false;
        let mut moved = s.kept.take();
        moved.extend(s.out.drain(..));
        for q in &mut moved {
            q.f.hdr_done = 0;
            q.f.done = 0;
        }
        let from = s.rail.clone();
        let gen = s.gen;
        let count = moved.len();
        let to = &mut self.streams[t];
        to.out.extend(moved);
        to.notices.push_back((i as u16, gen));
        to.ready_out = true;
        // Found while reading, maybe: the engine learns of the frames to write from the
        // socket's room.
        if !to.want_out {
            let flags = epoll::EventFlags::IN | epoll::EventFlags::OUT;
            let data = epoll::EventData::new_u64(token(self.peer, self.index, t));
            if epoll::modify(&self.io.epoll, &to.sock, data, flags).is_ok() {
                to.want_out = true;
            }
        }
        if self.lane == i {
            self.lane = t;
        }
        self.mesh.count_failover(self.peer, &from);
        if self.mesh.config().rank < self.peer {
            // The lower rank probes the rail for its return.
            self.mesh.redial(self.peer, i);
        }
        warn(&format!(
            "rank {}: failover: the link to world rank {} lost its stream {i} on rail {from} \
             ({why}); its {count} frames not acknowledged go out on stream {t} (rail {})",
            self.mesh.config().rank,
            self.peer,
            self.streams[t].rail
        ));
        Ok(())
    }

    /// Reads stream `i` until a frame's header or payload is complete, or a record alone
    /// came, or it has nothing more now, within a bounded number of reads since it became
    /// ready.
    fn read(&mut self, i: usize, dests: &mut Dests<'_>) -> std::result::Result<Got, ReadEnd> {
        // A read that returned less than asked for emptied the socket: the next read would
        // only say so. Stopping before the socket is empty (short read, or MAX_ROUNDS reads
        // for fairness) never misses data, since epoll is level-triggered; but everything
        // already buffered is dispatched first, since no event would announce it again.
        let reliable = self.failover.is_some();
        let s = &mut self.streams[i];
        loop {
            match s.rx {
                RxState::Placing => return Err(ReadEnd::Drained),
                RxState::Header => {
                    let buffered = s.rx_end - s.rx_start;
                    let at = s.rx_start;
                    let rec = if reliable && buffered >= REC_LEN {
                        match Record::decode(&s.rx_buf[at..at + REC_LEN]) {
                            Some(r) => Some(r),
                            None => {
                                return Err(ReadEnd::Failed(
                                    "it sent a malformed failover record".to_string(),
                                ))
                            }
                        }
                    } else {
                        None
                    };
                    if let Some(r) = rec.filter(|r| r.flags & REC_ACK_ONLY != 0) {
                        s.rx_start += REC_LEN;
                        return Ok(Got::Ack(r));
                    }
                    let need = if reliable { REC_LEN } else { 0 } + HEADER_LEN;
                    if buffered >= need {
                        let mut raw = [0u8; HEADER_LEN];
                        raw.copy_from_slice(&s.rx_buf[at + need - HEADER_LEN..at + need]);
                        s.rx_start += need;
                        return match FrameHeader::decode(&raw) {
                            Ok(hdr) => {
                                s.rx = RxState::Placing;
                                Ok(Got::Header(hdr, rec))
                            }
                            Err(e) => {
                                Err(ReadEnd::Failed(format!("it sent a malformed frame ({e})")))
                            }
                        };
                    }
                    if s.rx_start > 0 {
                        s.rx_buf.copy_within(s.rx_start..s.rx_end, 0);
                        s.rx_end -= s.rx_start;
                        s.rx_start = 0;
                    }
                    if s.short_read || s.reads == MAX_ROUNDS {
                        return Err(ReadEnd::Drained);
                    }
                    s.reads += 1;
                    let space = RX_BUF - s.rx_end;
                    match read_some(&mut s.sock, &mut s.rx_buf[s.rx_end..]) {
                        Ok(Some(n)) => {
                            s.rx_end += n;
                            s.short_read = n < space;
                        }
                        Ok(None) => return Err(ReadEnd::Drained),
                        Err(end) => return Err(end),
                    }
                }
                RxState::Skip { left } => {
                    let buffered = s.rx_end - s.rx_start;
                    if buffered > 0 {
                        let n = left.min(buffered);
                        s.rx_start += n;
                        if n == left {
                            s.rx = RxState::Header;
                            return Ok(Got::Skipped);
                        }
                        s.rx = RxState::Skip { left: left - n };
                        continue;
                    }
                    if s.short_read || s.reads == MAX_ROUNDS {
                        return Err(ReadEnd::Drained);
                    }
                    s.reads += 1;
                    s.refill()?;
                }
                RxState::Payload { hdr, dest, done } => {
                    let total = hdr.payload_len() as usize;
                    let want = total - done;
                    let buffered = s.rx_end - s.rx_start;
                    let got = if buffered > 0 {
                        let n = want.min(buffered);
                        if let Some(dst) = dests.slice(dest, done, n) {
                            dst.copy_from_slice(&s.rx_buf[s.rx_start..s.rx_start + n]);
                        }
                        s.rx_start += n;
                        n
                    } else if s.short_read || s.reads == MAX_ROUNDS {
                        return Err(ReadEnd::Drained);
                    } else {
                        s.reads += 1;
                        let direct = if want >= RX_BUF / 2 {
                            dests.slice(dest, done, want)
                        } else {
                            None
                        };
                        match direct {
                            Some(dst) => match read_some(&mut s.sock, dst) {
                                Ok(Some(n)) => {
                                    s.short_read = n < want;
                                    n
                                }
                                Ok(None) => return Err(ReadEnd::Drained),
                                Err(end) => return Err(end),
                            },
                            None => {
                                s.refill()?;
                                0
                            }
                        }
                    };
                    let done = done + got;
                    if done == total {
                        s.rx = RxState::Header;
                        return Ok(Got::Payload(hdr, dest));
                    }
                    s.rx = RxState::Payload { hdr, dest, done };
                }
            }
        }
    }

    /// A header read on stream `i` with its failover record: the acknowledgement it carries
    /// is taken, and the frame is new (`Ok(true)`: dispatch it), or one this side already
    /// had, whose payload is resumed or dropped (`Ok(false)`).
    fn on_record(&mut self, i: usize, hdr: &FrameHeader, rec: Record) -> Result<bool, String> {
        self.on_ack(i, rec.ack)?;
        let o = rec.origin.stream as usize;
        // A frame the plug-in in front carried first (or should have): numbered after what
        // the plug-in link took.
        let plugin = self.behind.clone().filter(|_| rec.origin.stream == PLUGIN);
        if plugin.is_none() && o >= self.streams.len() {
            return Err(format!("it named stream {o} of {}", self.streams.len()));
        }
        // The peer sends a stream's frames elsewhere only once it gave the stream up.
        let current =
            plugin.is_none() && self.streams[o].gen == rec.origin.gen && !self.streams[o].dead;
        if o != i && current {
            self.fail_stream(o, "the peer moved its frames off it")?;
        }
        let s = &mut self.streams[i];
        s.ack_wanted = rec.flags & REC_ACK_WANTED != 0;
        let next = self.rseq.entry(rec.origin.key()).or_insert(0);
        if let Some(h) = &plugin {
            *next = (*next).max(h.next());
        }
        let expected = *next;
        if rec.origin.seq == expected {
            *next += 1;
            if let Some(h) = &plugin {
                h.took(*next);
            }
            s.reading = Some(rec.origin);
            return Ok(true);
        }
        if rec.origin.seq > expected {
            return Err(format!(
                "frame {} of stream {o} came before frame {expected}",
                rec.origin.seq
            ));
        }
        let resumed = match self.partial.remove(&rec.origin.key()) {
            Some((phdr, dest)) if rec.origin.seq + 1 == expected && phdr == *hdr => Some(dest),
            Some(other) => {
                self.partial.insert(rec.origin.key(), other);
                None
            }
            None => None,
        };
        s.reading = Some(rec.origin);
        match resumed {
            Some(dest) => {
                s.rx = RxState::Payload {
                    hdr: *hdr,
                    dest,
                    done: 0,
                }
            }
            None if hdr.payload_len() > 0 => {
                s.rx = RxState::Skip {
                    left: hdr.payload_len() as usize,
                }
            }
            None => {
                s.rx = RxState::Header;
                self.frame_read(i);
            }
        }
        Ok(false)
    }

    /// Stream `i` reached its end: the link ends when the ordered stream ended without a
    /// goodbye before it, or when every stream ended. With failover, only the end of every
    /// stream ends it (a peer that gives up one stream says so on another, and its goodbye
    /// may come after the end of a stream that is not its ordered one).
    fn ended(&mut self, i: usize) -> Option<Rx> {
        let s = &mut self.streams[i];
        s.eof = true;
        s.ready_in = false;
        let _ = epoll::delete(&self.io.epoll, &s.sock);
        let end = (i == self.lane && !self.goodbye && self.failover.is_none())
            || self.streams.iter().all(|s| s.eof || s.dead);
        match &self.plugin_failed {
            // The link carries the traffic: its end without goodbye loses the peer.
            Some(w) if end && !self.goodbye => Some(Rx::Failed(format!(
                "it closed the connection; the transport plug-in in front of it had failed: {w}"
            ))),
            _ => end.then_some(Rx::Closed {
                goodbye: self.goodbye,
            }),
        }
    }
}

impl Link for TcpLink {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn push(&mut self, frame: OutFrame) -> bool {
        // A peer never talked to is owed no goodbye (and gets no connection for one).
        if self.conn == Conn::Idle && frame.kind == FrameKind::Close {
            return false;
        }
        self.enqueue(Queued {
            f: frame,
            origin: None,
        })
    }

    fn flush(&mut self, ops: &Ops, sent: &mut Vec<OpId>) -> Result<bool, String> {
        let mut moved = false;
        if self.closed {
            return Ok(false);
        }
        // A stream that fails hands its frames to another, which may come earlier in the
        // order: one more round writes them.
        for _ in 0..2 {
            let mut failed = false;
            for i in 0..self.streams.len() {
                let s = &self.streams[i];
                if s.ready_out && !s.dead {
                    match self.flush_stream(i, ops, sent) {
                        Ok(m) => moved |= m,
                        Err(why) => {
                            self.fail_stream(i, &why)?;
                            failed = true;
                        }
                    }
                }
            }
            if !failed {
                break;
            }
        }
        Ok(moved)
    }

    fn busy(&self) -> bool {
        !self.waiting.is_empty() || self.streams.iter().any(|s| !s.out.is_empty())
    }

    fn streaming(&self) -> bool {
        self.streams
            .iter()
            .any(|s| matches!(s.rx, RxState::Payload { .. } | RxState::Skip { .. }))
    }

    fn want(&mut self) {
        if self.conn == Conn::Idle && !self.closed {
            self.conn = Conn::Connecting;
            self.mesh.want(self.peer);
        }
    }

    fn event(&mut self, lane: usize, flags: epoll::EventFlags) {
        let Some(s) = self.streams.get_mut(lane) else {
            return;
        };
        if s.dead {
            return;
        }
        let trouble = epoll::EventFlags::ERR | epoll::EventFlags::HUP;
        if flags.intersects(epoll::EventFlags::OUT | trouble) {
            s.ready_out = true;
        }
        if flags.intersects(epoll::EventFlags::IN | trouble) && !s.eof {
            s.ready_in = true;
            s.reads = 0;
            s.short_read = false;
        }
    }

    fn poll(&mut self, dests: &mut Dests<'_>) -> Rx {
        if let Some(id) = self.acked_ops.pop_front() {
            return Rx::Sent(id);
        }
        if self.closed || self.streams.is_empty() {
            return Rx::Idle;
        }
        let n = self.streams.len();
        for _ in 0..=n {
            let i = self.cur;
            while self.streams[i].ready_in && !self.streams[i].dead {
                let failed = match self.read(i, dests) {
                    Ok(Got::Header(hdr, None)) => {
                        if i == self.lane && hdr.kind == FrameKind::Close {
                            self.goodbye = true;
                        }
                        return Rx::Header(hdr);
                    }
                    Ok(Got::Header(hdr, Some(rec))) => match self.on_record(i, &hdr, rec) {
                        Ok(true) => {
                            if hdr.kind == FrameKind::Close {
                                self.goodbye = true;
                            }
                            return Rx::Header(hdr);
                        }
                        Ok(false) => None,
                        Err(why) => Some(why),
                    },
                    Ok(Got::Ack(rec)) => match self.on_ack(i, rec.ack).and_then(|()| {
                        let d = rec.origin.stream as usize;
                        let live = self
                            .streams
                            .get(d)
                            .is_some_and(|s| !s.dead && s.gen == rec.origin.gen);
                        if rec.flags & REC_DROPPED != 0 && live {
                            self.fail_stream(d, "the peer gave it up")?;
                        }
                        if rec.flags & REC_DROPPED != 0 && rec.origin.stream == PLUGIN {
                            self.peer_fell_back = self.behind.is_some();
                        }
                        Ok(())
                    }) {
                        Ok(()) if std::mem::take(&mut self.peer_fell_back) => {
                            return Rx::FallBack(format!(
                                "world rank {} gave up its plug-in to this rank",
                                self.peer
                            ));
                        }
                        Ok(()) => {
                            if let Some(id) = self.acked_ops.pop_front() {
                                return Rx::Sent(id);
                            }
                            None
                        }
                        Err(why) => Some(why),
                    },
                    Ok(Got::Payload(hdr, dest)) => {
                        if self.failover.is_some() {
                            self.frame_read(i);
                        }
                        return Rx::Payload(hdr, dest);
                    }
                    Ok(Got::Skipped) => {
                        self.frame_read(i);
                        None
                    }
                    Err(ReadEnd::Drained) => {
                        self.streams[i].ready_in = false;
                        None
                    }
                    Err(ReadEnd::Eof) => {
                        if let Some(rx) = self.ended(i) {
                            return rx;
                        }
                        None
                    }
                    Err(ReadEnd::Failed(why)) => Some(why),
                };
                if let Some(why) = failed {
                    if let Err(why) = self.fail_stream(i, &why) {
                        return Rx::Failed(why);
                    }
                }
            }
            if let Some(id) = self.acked_ops.pop_front() {
                return Rx::Sent(id);
            }
            self.cur = (i + 1) % n;
        }
        Rx::Idle
    }

    fn place(
        &mut self,
        hdr: &FrameHeader,
        dest: Option<Dest>,
        _dests: &mut Dests<'_>,
    ) -> Result<bool, String> {
        let i = self.cur;
        let s = &mut self.streams[i];
        match dest {
            Some(dest) if hdr.payload_len() > 0 => {
                if s.dead {
                    // The stream failed while the engine dispatched the header: the payload
                    // comes again on another.
                    if let Some(o) = s.reading {
                        self.partial.insert(o.key(), (*hdr, dest));
                    }
                    return Ok(false);
                }
                s.rx = RxState::Payload {
                    hdr: *hdr,
                    dest,
                    done: 0,
                };
                Ok(false)
            }
            _ => {
                if !s.dead {
                    s.rx = RxState::Header;
                }
                if self.failover.is_some() && !self.streams[i].dead {
                    self.frame_read(i);
                }
                Ok(true)
            }
        }
    }

    fn forget(&mut self, op: OpId, ops: &Ops) {
        self.waiting
            .retain(|q| q.f.op != Some(op) || q.origin.is_some());
        for q in &mut self.waiting {
            if q.f.op == Some(op) {
                if q.f.owned.is_none() {
                    q.f.owned = Some(frame_payload(&q.f, ops).to_vec());
                }
                q.f.op = None;
            }
        }
        self.acked_ops.retain(|&id| id != op);
        for s in &mut self.streams {
            // Frames begun, or numbered for failover, stay (as copies): the stream stays
            // framed and the peer's count of them right.
            s.out
                .retain(|q| q.f.op != Some(op) || q.f.hdr_done > 0 || q.origin.is_some());
            for q in s.out.iter_mut().chain(s.kept.frames_mut()) {
                if q.f.op == Some(op) {
                    if q.f.owned.is_none() {
                        q.f.owned = Some(frame_payload(&q.f, ops).to_vec());
                    }
                    q.f.op = None;
                }
            }
            s.kept.recount();
            if let RxState::Payload { dest, .. } = &mut s.rx {
                if matches!(dest, Dest::Op { op: o, .. } if *o == op) {
                    *dest = Dest::Discard;
                }
            }
        }
        for p in self.partial.values_mut() {
            if matches!(p.1, Dest::Op { op: o, .. } if o == op) {
                p.1 = Dest::Discard;
            }
        }
    }

    fn shutdown(&mut self) {
        if !self.closed {
            for s in self.streams.iter().filter(|s| !s.dead) {
                let _ = s.sock.shutdown(Shutdown::Write);
            }
        }
    }

    /// Until the peer's kernel acknowledged everything written, the end included: closing a
    /// socket that then receives data resets the connection, and a reset discards what the
    /// sending kernel still held, but not what the peer's kernel already took. A peer that
    /// closed its side sends nothing more.
    fn lingers(&self) -> bool {
        !self.closed
            && self.streams.iter().any(|s| {
                !s.eof && !s.dead && tcp::unacknowledged(&s.sock).is_ok_and(|bytes| bytes > 0)
            })
    }

    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.waiting.clear();
        self.acked_ops.clear();
        for s in &mut self.streams {
            let _ = epoll::delete(&self.io.epoll, &s.sock);
            let _ = s.sock.shutdown(Shutdown::Both);
            s.out.clear();
            s.kept.take();
            s.rx = RxState::Header;
        }
    }

    fn direct_token(&self) -> Option<u64> {
        let lane = self.streams.get(self.lane)?;
        (!self.closed && !lane.eof && !lane.dead).then(|| token(self.peer, self.index, self.lane))
    }
}
