//! Split copies: a large local message copied by both processes at once. The receiver pulls
//! pieces from the front of the sender's buffer (`pull.rs`) while the sender writes pieces
//! from the back into the receiver's buffer with `process_vm_writev`, both claiming pieces
//! in the pair's split slot (`transport::shm::split`), so two cores copy where a pull uses
//! one.
//!
//! **Offer.** A receive that matches a request to send which it may pull, of at least
//! `HCOMM_SHM_SPLIT_THRESHOLD` bytes, opens the slot under a new generation and sends the
//! sender a CTS with [`FLAG_SPLIT`](crate::transport::wire::FLAG_SPLIT): its buffer's
//! address, the piece size and the generation. Not offered: when ranks may not spin (more
//! local ranks than cores, or `HCOMM_SPIN_US=0`: the two copies would take turns on one core
//! and the sender would poll for pieces), while a split from the same peer is still in
//! flight (one slot per pair and direction), or once the peer has shown that it cannot write
//! into this rank (see below).
//!
//! **Writes.** The sender claims one piece per turn of its engine (as the receiver pulls one
//! per turn), writes it, and reports the pieces written in the slot; it stops when no piece
//! is left, when its send was abandoned, or when a write fails (then it reports the failure
//! and the receiver copies the sender's unwritten pieces itself). A refused write (`EPERM`:
//! the receiver is not dumpable, a security policy) also stops the splits the sender is
//! offered later: it fails them at once, as it does when it cannot write into the receiver at
//! all (its start-up probe of the receiver failed). A sender that is not in a call claims
//! nothing, and the receiver takes every piece.
//!
//! **A sender that cannot write.** A failure reported in the slot — with pieces claimed or
//! not, seen while the receive runs or, for a report that came after the receiver was done,
//! when it next offers that peer a split (the report stays in the slot until then) — makes
//! the receiver offer that peer no split again: every later large message from it is pulled
//! by the receiver alone, with no CTS round that the sender can only decline. This lasts for
//! the life of the world's engine and is never reset: the causes (the receiver turned
//! non-dumpable, a security policy, a probe that failed) do not go away while the processes
//! live, and the fallback is the plain pull, which is what a split costs at worst.
//!
//! **Ending.** The receive completes when every piece is in: its own, and the sender's as
//! reported. Any other end (the receive abandoned or timed out, a failed or refused pull, the
//! sender lost) first *closes* the slot, taking every piece left, then waits for the pieces
//! the sender already claimed to be reported ([`State::end_split`]). This is what makes the
//! sender's writes safe: the sender writes only a piece it claimed under the generation the
//! receiver opened, and a receiver returns its buffer only after that piece was reported, so
//! nothing is written into memory the receiver no longer owns. That wait covers at most one
//! piece being copied (`HCOMM_SHM_CHUNK` bytes, tens of microseconds); it ends early when the
//! sender's process ends.
//!
//! **A sender that stops mid-piece.** Only a sender that does not run (stopped by `SIGSTOP`
//! or a debugger, or starved for that long) holds a claimed piece for `HCOMM_TIMEOUT`,
//! counted from when the receiver ran out of pieces of its own. The receiver then gives the
//! buffer up, but not quietly: it *revokes* the slot (no generation is held from then on) and
//! fails the pair — the peer is lost, named in the error of every operation with it and in a
//! warning, and the launcher is told, so the job stops rather than run on beside a process
//! that may still write into a buffer it no longer owns. The sender checks that the slot
//! still holds its generation immediately before each write, so once continued it starts no
//! write after the revocation. One window stays open: a sender stopped after that check and
//! before (or inside) its `process_vm_writev` completes the write when it is continued, into
//! memory the receiver has given back. It cannot be closed from the receiver's side alone: the
//! kernel offers no way to revoke another process's access to this one's pages short of
//! unmapping them (the buffer is the caller's, not hcomm's) or ending the writer; closing it
//! needs the sender's cooperation, which a stopped sender cannot give. The window is a few
//! instructions wide, and the failed pair stops the job around it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::transport::shm::cma;
use crate::transport::shm::split::MAX_PIECES;
use crate::transport::wire::FrameHeader;

use super::link::{Kind, Link};
use super::pull::Pull;
use super::requests::op_slice;
use super::{OpId, ProtocolCounts, State};

/// The receiver's side of a split pull.
#[derive(Debug, Clone)]
pub(super) struct Part {
    /// The slot's generation for this message.
    pub gen: u32,
    /// Bytes of a piece, and pieces of the message.
    pub piece: usize,
    pub pieces: usize,
    /// After the sender failed: the pieces it claimed but did not write, which the receiver
    /// copies itself.
    pub redo: Option<std::ops::Range<usize>>,
    /// Since when the receiver, with no piece left to claim, waits for the sender's.
    pub stalled: Option<Instant>,
}

/// A sender's writes of its pieces of a split.
#[derive(Debug, Clone, Copy)]
pub(super) struct Write {
    /// The send.
    id: OpId,
    /// The receiver (world rank) and its process.
    peer: usize,
    pid: u32,
    /// The generation, the receiver's buffer, the piece size, the message length.
    gen: u32,
    addr: u64,
    piece: usize,
    len: usize,
    /// Pieces written so far.
    wrote: usize,
}

/// The engine's splits.
#[derive(Debug)]
pub(super) struct Splits {
    /// The writes this rank does as a sender, a piece per turn.
    writes: Vec<Write>,
    /// Per world rank: the last generation this rank opened for that sender's messages.
    gens: Vec<u32>,
    /// Per world rank: a split of a message from it is in flight (its slot is taken).
    busy: Vec<bool>,
    /// Per world rank: it has shown that it cannot write into this rank's memory (it
    /// reported a failure); no split is offered to it again.
    no_writes: Vec<bool>,
    /// Per world rank: the kernel refused this rank's writes into it; its offers fail.
    write_refused: Vec<bool>,
}

impl Splits {
    /// Splits of a world of `size` ranks.
    pub(super) fn new(size: usize) -> Splits {
        Splits {
            writes: Vec::new(),
            gens: vec![0; size],
            busy: vec![false; size],
            no_writes: vec![false; size],
            write_refused: vec![false; size],
        }
    }
}

impl Splits {
    /// The split of a message from world rank `peer` is over: its slot is free.
    pub(super) fn release(&mut self, peer: usize) {
        if let Some(busy) = self.busy.get_mut(peer) {
            *busy = false;
        }
    }
}

/// Armed by [`arm_stop_in_split_write`]: the next piece this process claims as a sender, it
/// stops itself before writing.
static STOP_ARMED: AtomicBool = AtomicBool::new(false);

/// For tests: the next piece of a split this process claims as its sender, it stops itself
/// with `SIGSTOP` right after the claim, before its check and write, as a process stopped by
/// its user or a debugger at the worst moment would be. Its receiver gives the split up after
/// `HCOMM_TIMEOUT` and fails the pair; once continued (`SIGCONT`), this process writes
/// nothing into the buffer given up.
pub fn arm_stop_in_split_write() {
    STOP_ARMED.store(true, Ordering::SeqCst);
}

/// Whether the stop that [`arm_stop_in_split_write`] armed is still to come.
pub fn stop_in_split_write_armed() -> bool {
    STOP_ARMED.load(Ordering::SeqCst)
}

/// Stops this process (`SIGSTOP`) if [`arm_stop_in_split_write`] asked for it (once).
fn stop_if_armed() {
    if STOP_ARMED.swap(false, Ordering::SeqCst) {
        let me = rustix::process::getpid();
        if let Err(e) = rustix::process::kill_process(me, rustix::process::Signal::STOP) {
            tracing::warn!("the armed stop failed: kill(SIGSTOP): {e}");
        }
    }
}

/// The smallest piece of a split.
const MIN_PIECE: usize = 32 << 10;

/// The piece size of a split message of `len` bytes: half of it, in whole pages, between
/// [`MIN_PIECE`] and `chunk` (`HCOMM_SHM_CHUNK`). Each piece costs a system call and a claim
/// besides its copy, so a small message goes in two pieces, one per rank, and a large one in
/// pieces of the chunk. Measured here (2 ranks pinned, ping-pong, half the round trip): 256 KiB
/// took 6.7 µs in two pieces and 7.7 µs in four, 512 KiB 10.8 and 12.0 µs; pulled whole by
/// the receiver alone 10.1 and 19.2 µs.
pub(super) fn piece_size(len: usize, chunk: usize) -> usize {
    (len / 2)
        .next_multiple_of(4096)
        .clamp(MIN_PIECE, chunk.max(MIN_PIECE))
}

#[cfg(test)]
#[test]
fn pieces_are_halves_of_small_messages_and_chunks_of_large_ones() {
    assert_eq!(piece_size(64 << 10, 256 << 10), 32 << 10);
    assert_eq!(piece_size(100_000, 256 << 10), 53_248);
    assert_eq!(piece_size(1 << 20, 256 << 10), 256 << 10);
    assert_eq!(piece_size(10 << 10, 256 << 10), MIN_PIECE);
    assert_eq!(piece_size(1 << 20, 4096), MIN_PIECE);
    assert_eq!(piece_range(3, 100, 350), (300, 50));
    assert_eq!(piece_range(4, 100, 350), (350, 0));
}

/// The byte range of piece `k` of a message of `len` bytes in pieces of `piece`.
pub(super) fn piece_range(k: usize, piece: usize, len: usize) -> (usize, usize) {
    let start = k.saturating_mul(piece).min(len);
    (start, piece.min(len - start))
}

impl State {
    /// Receive `id` pulls message `msg_id` (`len` bytes) from world rank `peer`: when it is
    /// large enough and the pair may split it, opens the pair's slot and asks the sender to
    /// write its share; the receiver's side of the split, if offered.
    pub(super) fn offer_split(
        &mut self,
        id: OpId,
        peer: usize,
        msg_id: u64,
        len: usize,
    ) -> Option<Part> {
        let piece = piece_size(len, self.cfg.shm_chunk);
        let pieces = len.div_ceil(piece);
        if len < self.cfg.shm_split_threshold
            || self.cfg.spin.is_zero()
            || !(2..=MAX_PIECES).contains(&pieces)
            || self.split.busy.get(peer).copied().unwrap_or(true)
            || self.split.no_writes.get(peer).copied().unwrap_or(true)
        {
            return None;
        }
        let op = self.ops.get_mut(&id)?;
        let addr = op_slice(op, 0, len)?.as_mut_ptr() as u64;
        let slot = self.links.primary(peer)?.split_slot(true)?;
        let last = self.split.gens[peer];
        if last != 0 && slot.sent(last).failed {
            // The sender failed the previous split after this rank was done with it (it
            // could not write, and this rank had taken every piece by then).
            self.split.no_writes[peer] = true;
            return None;
        }
        let gen = match last.wrapping_add(1) {
            0 => 1,
            g => g,
        };
        self.split.gens[peer] = gen;
        slot.open(gen, pieces);
        self.split.busy[peer] = true;
        tracing::debug!(
            peer,
            len,
            pieces,
            "shared-memory receive: split with the sender"
        );
        self.queue(
            peer,
            super::OutFrame::control(super::rendezvous::Rendezvous::split(
                msg_id, gen, addr, piece,
            )),
        );
        Some(Part {
            gen,
            piece,
            pieces,
            redo: None,
            stalled: None,
        })
    }

    /// The receiver's next piece of split pull `p` (part `s`): `Some((offset, bytes))` to
    /// copy, or `None` with whether every piece is in (the sender's as reported; not yet:
    /// the receiver waits for the sender's last pieces).
    pub(super) fn split_next(&mut self, p: &Pull, s: &mut Part) -> Result<(usize, usize), bool> {
        loop {
            if let Some(redo) = s.redo.as_mut() {
                return redo
                    .next()
                    .map(|k| piece_range(k, s.piece, p.len))
                    .ok_or(true);
            }
            let Some(slot) = self.links.primary(p.peer).and_then(|l| l.split_slot(true)) else {
                // No slot (cannot happen on a shared-memory link): copy everything.
                s.redo = Some(0..s.pieces);
                continue;
            };
            if let Some(k) = slot.claim(s.gen, false) {
                return Ok(piece_range(k, s.piece, p.len));
            }
            let Some(from) = slot.close(s.gen) else {
                // The slot was overwritten (a peer that broke the protocol): copy everything.
                s.redo = Some(0..s.pieces);
                continue;
            };
            let sent = slot.sent(s.gen);
            if sent.failed {
                // The sender cannot write into this rank (or stopped): no more splits are
                // offered to it, even when it claimed no piece of this one.
                self.split.no_writes[p.peer] = true;
            }
            if sent.pieces >= s.pieces - from {
                return Err(true);
            }
            if !sent.failed {
                s.stalled.get_or_insert_with(Instant::now);
                return Err(false);
            }
            // The sender stopped: its unwritten pieces are copied here.
            s.redo = Some(from..s.pieces - sent.pieces);
        }
    }

    /// Ends split pull `p` early (abandoned, failed, refused, its sender lost): takes every
    /// piece left and waits until the pieces the sender claimed are written (see the module
    /// documentation: after this, the sender writes nothing more into the receive buffer).
    /// A sender that holds its claim for `HCOMM_TIMEOUT` (from when this rank ran out of
    /// pieces) is not waited for longer: the slot is revoked and the peer failed.
    pub(super) fn end_split(&mut self, p: &Pull) {
        let Some(s) = p.split.as_ref() else {
            return;
        };
        self.split.release(p.peer);
        if s.redo.is_some() {
            // The sender failed or the slot was lost: it writes nothing more.
            return;
        }
        let Some(slot) = self.links.primary(p.peer).and_then(|l| l.split_slot(true)) else {
            return;
        };
        let Some(from) = slot.close(s.gen) else {
            return;
        };
        let theirs = s.pieces - from;
        let start = s.stalled.unwrap_or_else(Instant::now);
        let mut checked = Instant::now();
        loop {
            let sent = slot.sent(s.gen);
            if sent.pieces >= theirs || sent.failed {
                return;
            }
            let now = Instant::now();
            if now.duration_since(checked) >= Duration::from_millis(1) {
                checked = now;
                if cma::exiting(p.pid) {
                    return;
                }
                if now.duration_since(start) >= self.cfg.timeout {
                    // Revoked first: a sender continued later starts no write (its check
                    // before each write fails).
                    slot.revoke(s.gen);
                    self.fail_peer(
                        p.peer,
                        format!(
                            "it did not finish writing its piece of a {}-byte split message \
                             into this rank within HCOMM_TIMEOUT (is its process stopped?); \
                             the receive buffer is given back and the pair failed",
                            p.len
                        ),
                    );
                    return;
                }
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }

    /// The sender of send `id` (`len` bytes) to world rank `peer` is asked to write pieces of
    /// it (the CTS `hdr`): starts writing, a piece now.
    pub(super) fn start_write(&mut self, peer: usize, id: OpId, len: usize, hdr: &FrameHeader) {
        let (gen, addr, piece) = (hdr.tag, hdr.offset, hdr.comm as usize);
        let pid = self
            .links
            .caps(peer)
            .filter(|c| c.kind == Kind::Shm)
            .and_then(|c| c.read_remote)
            .filter(|_| !self.split.write_refused.get(peer).copied().unwrap_or(true));
        let Some(slot) = self.links.primary(peer).and_then(|l| l.split_slot(false)) else {
            return;
        };
        let Some(pid) = pid.filter(|_| piece > 0 && len.div_ceil(piece) <= MAX_PIECES) else {
            // This rank cannot write into the receiver: it copies every piece itself.
            slot.report(gen, 0, true);
            return;
        };
        let mut w = Write {
            id,
            peer,
            pid,
            gen,
            addr,
            piece,
            len,
            wrote: 0,
        };
        if self.write_piece(&mut w) {
            self.split.writes.push(w);
        }
    }

    /// Whether writes are in flight (work for the next turn).
    pub(super) fn writing(&self) -> bool {
        !self.split.writes.is_empty()
    }

    /// Writes one piece of every write in flight; returns whether any was in flight.
    pub(super) fn advance_writes(&mut self) -> bool {
        if self.split.writes.is_empty() {
            return false;
        }
        let mut writes = std::mem::take(&mut self.split.writes);
        writes.retain_mut(|w| self.write_piece(w));
        writes.append(&mut self.split.writes);
        self.split.writes = writes;
        true
    }

    /// Claims and writes the next piece of `w`; returns whether more may follow.
    fn write_piece(&mut self, w: &mut Write) -> bool {
        if self.peers[w.peer].as_ref().is_none_or(|q| q.lost.is_some()) {
            return false;
        }
        let Some(slot) = self.links.primary(w.peer).and_then(|l| l.split_slot(false)) else {
            return false;
        };
        let Some(op) = self.ops.get_mut(&w.id).filter(|op| op.result.is_none()) else {
            // The send is over (the receiver has every piece) or was abandoned (its buffer
            // may go): no more claims, and the receiver copies what is left.
            return false;
        };
        let Some(k) = slot.claim(w.gen, true) else {
            return false;
        };
        stop_if_armed();
        let (off, n) = piece_range(k, w.piece, w.len);
        let result = match op_slice(op, off, n) {
            // Immediately before the write: the receiver did not revoke the split (it gave its
            // buffer up after waiting too long for this piece; see the module documentation).
            Some(_) if !slot.holds(w.gen) => {
                slot.report(w.gen, w.wrote, true);
                tracing::warn!(
                    peer = w.peer,
                    "world rank {} gave up a split message of this rank's; its piece is not \
                     written",
                    w.peer
                );
                return false;
            }
            Some(src) => {
                let at = (w.addr as usize).wrapping_add(off);
                // SAFETY: this rank claimed piece `k` under the generation the receiver opened
                // for this message, and the receiver keeps its buffer (`len` bytes at `addr`,
                // checked against its capacity when it matched) until this piece is reported
                // (`State::end_split`); nothing else writes these bytes meanwhile. The send is
                // live, so `src` is its buffer.
                unsafe { cma::write_remote(w.pid, at, src) }
            }
            None => Ok(()),
        };
        match result {
            Ok(()) => {
                ProtocolCounts::bump(&self.counts.shm_split_written);
                w.wrote += 1;
                slot.report(w.gen, w.wrote, false);
                true
            }
            Err(err) => {
                slot.report(w.gen, w.wrote, true);
                if let Error::PeerLost(why) = err {
                    self.fail_peer(w.peer, why.message);
                } else if cma::refused(&err) {
                    tracing::info!(
                        peer = w.peer,
                        "cross-memory attach refused a write ({err}): world rank {} copies \
                         the messages of this rank itself",
                        w.peer
                    );
                    if let Some(r) = self.split.write_refused.get_mut(w.peer) {
                        *r = true;
                    }
                } else {
                    tracing::debug!(peer = w.peer, "a split write failed ({err})");
                }
                false
            }
        }
    }
}
