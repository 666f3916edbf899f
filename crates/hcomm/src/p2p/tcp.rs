//! The engine's side of TCP links: framed streams, written from queues and read into
//! operations' buffers.

use crate::transport::wire::{FrameHeader, HEADER_LEN};
use rustix::event::epoll;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;

use super::requests::{dest_slice, frame_payload};
use super::{OpId, OutFrame, ReadEnd, RxState, State, MAX_ROUNDS, RX_BUF};

pub(super) fn token(peer: usize, stream: usize) -> u64 {
    ((peer as u64) << 16) | stream as u64
}

/// One nonblocking read: `Some(n)` bytes, `None` when nothing is there now.
pub(super) fn read_some(
    sock: &mut TcpStream,
    buf: &mut [u8],
) -> std::result::Result<Option<usize>, ReadEnd> {
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

impl State {
    /// Whether `peer` is another rank whose first stream is still open for reading.
    pub(super) fn readable(&self, peer: usize) -> bool {
        peer != self.cfg.rank
            && self
                .peers
                .get(peer)
                .and_then(Option::as_ref)
                .is_some_and(|p| {
                    p.lost.is_none() && p.shm.is_none() && p.plugin.is_none() && !p.streams[0].eof
                })
    }

    /// Appends a frame to a TCP stream's queue and writes what the socket takes now.
    pub(super) fn queue_tcp(&mut self, peer: usize, stream: usize, frame: OutFrame) {
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

    /// Writes queued frames of one stream until the socket is full or the queue empty.
    pub(super) fn flush(&mut self, peer: usize, stream: usize) {
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

    /// Reads and dispatches what a stream has, within a bounded number of rounds.
    pub(super) fn read_stream(&mut self, peer: usize, stream: usize) -> ReadEnd {
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
                        if let Some(dst) =
                            dest_slice(&mut self.ops, &mut self.matching, dest, done, n)
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
                            dest_slice(&mut self.ops, &mut self.matching, dest, done, want)
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
}
