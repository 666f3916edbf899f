//! A link over TCP: framed streams (`HCOMM_TCP_STREAMS` per peer), written from queues and
//! read into the destinations the engine names, waited on with epoll.
//!
//! Control frames and eager messages take stream 0, so that they stay in order; rendezvous
//! data frames (which carry their offset) are spread over all streams. The goodbye (`Close`)
//! takes stream 0 too: after it, the end of stream 0 is orderly, and data may still arrive on
//! the others until they end too.
//!
//! The link exists from init but its connection does not: it is made on the link's first use
//! ([`Link::want`], or the first frame pushed), by the world's [`Mesh`], and handed to the
//! link when it is up ([`TcpLink::attach`]); frames pushed meanwhile wait, in order, and go
//! out once it is. A link never used costs no socket, and owes its peer no goodbye.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

use rustix::event::epoll;

use super::{token, Caps, Dests, Kind, Link, Liveness, Ops, Rx};
use crate::error::{Error, PeerRank, Result};
use crate::p2p::requests::frame_payload;
use crate::p2p::{Dest, Io, OpId, OutFrame};
use crate::transport::tcp::{self, Mesh};
use crate::transport::wire::{FrameHeader, FrameKind, HEADER_LEN};

/// Bytes buffered per stream for small frames; larger payloads are read in place.
const RX_BUF: usize = 64 * 1024;
/// Read and write rounds per stream per event, so one busy peer cannot starve the others.
const MAX_ROUNDS: usize = 64;

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
}

#[derive(Debug)]
struct Stream {
    sock: TcpStream,
    out: VecDeque<OutFrame>,
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
    waiting: VecDeque<OutFrame>,
    streams: Vec<Stream>,
    next_data: usize,
    /// The stream being read.
    cur: usize,
    /// The peer's goodbye came on stream 0.
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
            streams: Vec::new(),
            next_data: 0,
            cur: 0,
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
        for (s, sock) in socks.into_iter().enumerate() {
            sock.set_nonblocking(true)
                .map_err(|e| Error::transport("configuring a link", e))?;
            epoll::add(
                &self.io.epoll,
                &sock,
                epoll::EventData::new_u64(token(self.peer, self.index, s)),
                epoll::EventFlags::IN,
            )
            .map_err(|e| Error::init(format!("epoll_ctl: {e}")).with_source(e.into()))?;
            self.streams.push(Stream {
                sock,
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
            });
        }
        self.conn = Conn::Up;
        for frame in std::mem::take(&mut self.waiting) {
            self.push(frame);
        }
        Ok(())
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

    /// Writes queued frames of stream `i` until the socket is full or the queue empty.
    fn flush_stream(&mut self, i: usize, ops: &Ops, sent: &mut Vec<OpId>) -> Result<bool, String> {
        let s = &mut self.streams[i];
        s.ready_out = false;
        let mut moved = false;
        let mut outcome = Ok(());
        for _ in 0..MAX_ROUNDS {
            let Some(f) = s.out.front_mut() else { break };
            let payload = frame_payload(f, ops).get(f.done..).unwrap_or_default();
            let bufs = [IoSlice::new(&f.hdr[f.hdr_done..]), IoSlice::new(payload)];
            match s.sock.write_vectored(&bufs) {
                Ok(0) => {
                    outcome = Err("the connection accepts no more data".to_string());
                    break;
                }
                Ok(n) => {
                    moved = true;
                    let h = n.min(HEADER_LEN - f.hdr_done);
                    f.hdr_done += h;
                    f.done += n - h;
                    if f.hdr_done == HEADER_LEN && f.done == f.len {
                        if let Some(id) = f.op {
                            sent.push(id);
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
                epoll::EventData::new_u64(token(self.peer, self.index, i)),
                flags,
            ) {
                Ok(()) => s.want_out = want,
                Err(e) => outcome = Err(format!("epoll_ctl failed: {e}")),
            }
        }
        outcome.map(|()| moved)
    }

    /// Reads stream `i` until a frame's header or payload is complete (`Ok(rx)`), or it has
    /// nothing more now, within a bounded number of reads since it became ready.
    fn read(&mut self, i: usize, dests: &mut Dests<'_>) -> std::result::Result<Rx, ReadEnd> {
        // A read that returned less than asked for emptied the socket: the next read would
        // only say so. Stopping before the socket is empty (short read, or MAX_ROUNDS reads
        // for fairness) never misses data, since epoll is level-triggered; but everything
        // already buffered is dispatched first, since no event would announce it again.
        let s = &mut self.streams[i];
        loop {
            match s.rx {
                RxState::Placing => return Err(ReadEnd::Drained),
                RxState::Header => {
                    if s.rx_end - s.rx_start >= HEADER_LEN {
                        let mut raw = [0u8; HEADER_LEN];
                        raw.copy_from_slice(&s.rx_buf[s.rx_start..s.rx_start + HEADER_LEN]);
                        s.rx_start += HEADER_LEN;
                        return match FrameHeader::decode(&raw) {
                            Ok(hdr) => {
                                if i == 0 && hdr.kind == FrameKind::Close {
                                    self.goodbye = true;
                                }
                                s.rx = RxState::Placing;
                                Ok(Rx::Header(hdr))
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
                                s.rx_start = 0;
                                s.rx_end = 0;
                                match read_some(&mut s.sock, &mut s.rx_buf[..]) {
                                    Ok(Some(n)) => {
                                        s.rx_end = n;
                                        s.short_read = n < RX_BUF;
                                    }
                                    Ok(None) => return Err(ReadEnd::Drained),
                                    Err(end) => return Err(end),
                                }
                                0
                            }
                        }
                    };
                    let done = done + got;
                    if done == total {
                        s.rx = RxState::Header;
                        return Ok(Rx::Payload(hdr, dest));
                    }
                    s.rx = RxState::Payload { hdr, dest, done };
                }
            }
        }
    }

    /// Stream `i` reached its end: the link ends when stream 0 ended without a goodbye
    /// before it, or when every stream ended.
    fn ended(&mut self, i: usize) -> Option<Rx> {
        let s = &mut self.streams[i];
        s.eof = true;
        s.ready_in = false;
        let _ = epoll::delete(&self.io.epoll, &s.sock);
        ((i == 0 && !self.goodbye) || self.streams.iter().all(|s| s.eof)).then_some(Rx::Closed {
            goodbye: self.goodbye,
        })
    }
}

impl Link for TcpLink {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn push(&mut self, frame: OutFrame) -> bool {
        if self.conn != Conn::Up {
            // A peer never talked to is owed no goodbye (and gets no connection for one).
            if self.conn == Conn::Idle && frame.kind == FrameKind::Close {
                return false;
            }
            self.want();
            self.waiting.push_back(frame);
            return false;
        }
        let i = match frame.kind {
            FrameKind::Data => {
                self.next_data = self.next_data.wrapping_add(1);
                (self.next_data - 1) % self.streams.len()
            }
            _ => 0,
        };
        let s = &mut self.streams[i];
        s.out.push_back(frame);
        let first = s.out.len() == 1;
        s.ready_out |= first;
        first
    }

    fn flush(&mut self, ops: &Ops, sent: &mut Vec<OpId>) -> Result<bool, String> {
        let mut moved = false;
        if self.closed {
            return Ok(false);
        }
        for i in 0..self.streams.len() {
            if self.streams[i].ready_out {
                moved |= self.flush_stream(i, ops, sent)?;
            }
        }
        Ok(moved)
    }

    fn busy(&self) -> bool {
        !self.waiting.is_empty() || self.streams.iter().any(|s| !s.out.is_empty())
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
        if self.closed || self.streams.is_empty() {
            return Rx::Idle;
        }
        let n = self.streams.len();
        for _ in 0..=n {
            let i = self.cur;
            if self.streams[i].ready_in {
                match self.read(i, dests) {
                    Ok(rx) => return rx,
                    Err(ReadEnd::Drained) => self.streams[i].ready_in = false,
                    Err(ReadEnd::Eof) => {
                        if let Some(rx) = self.ended(i) {
                            return rx;
                        }
                    }
                    Err(ReadEnd::Failed(why)) => return Rx::Failed(why),
                }
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
        let s = &mut self.streams[self.cur];
        match dest {
            Some(dest) if hdr.payload_len() > 0 => {
                s.rx = RxState::Payload {
                    hdr: *hdr,
                    dest,
                    done: 0,
                };
                Ok(false)
            }
            _ => {
                s.rx = RxState::Header;
                Ok(true)
            }
        }
    }

    fn forget(&mut self, op: OpId, ops: &Ops) {
        self.waiting.retain(|f| f.op != Some(op));
        for s in &mut self.streams {
            s.out.retain(|f| f.op != Some(op) || f.hdr_done > 0);
            for f in s.out.iter_mut().filter(|f| f.op == Some(op)) {
                f.owned = Some(frame_payload(f, ops).to_vec());
                f.op = None;
            }
            if let RxState::Payload { dest, .. } = &mut s.rx {
                if matches!(dest, Dest::Op { op: o, .. } if *o == op) {
                    *dest = Dest::Discard;
                }
            }
        }
    }

    fn shutdown(&mut self) {
        if !self.closed {
            for s in &self.streams {
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
            && self
                .streams
                .iter()
                .any(|s| !s.eof && tcp::unacknowledged(&s.sock).is_ok_and(|bytes| bytes > 0))
    }

    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.waiting.clear();
        for s in &mut self.streams {
            let _ = epoll::delete(&self.io.epoll, &s.sock);
            let _ = s.sock.shutdown(Shutdown::Both);
            s.out.clear();
            s.rx = RxState::Header;
        }
    }

    fn direct_token(&self) -> Option<u64> {
        let first = self.streams.first()?;
        (!self.closed && !first.eof).then(|| token(self.peer, self.index, 0))
    }
}
