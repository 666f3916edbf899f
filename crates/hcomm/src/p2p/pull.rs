//! Receiver pulls: a local rendezvous message copied straight out of the sender's buffer with
//! cross-memory attach, one piece per engine turn.
//!
//! A pull is one copy (the kernel's, from the sender's pages into the receive buffer) where a
//! push through the pair's ring is two (the sender's into the ring, the receiver's out of
//! it) and a hand-off between both ranks every chunk; on a loaded host each hand-off may cost
//! a scheduling round. The message moves in pieces of `HCOMM_SHM_CHUNK` bytes, one piece of
//! every pull in flight per turn of the engine, so the engine (and its lock) is never held
//! for a whole large message: other links are read and written between the pieces, and an
//! abandoned receive stops at the next piece.
//!
//! The sender keeps its buffer unchanged until the CTS that ends the pull (`FLAG_PULLED`,
//! or `FLAG_DISCARD` for a receive that failed or was abandoned); its wait spins for about
//! the time of the copy besides `HCOMM_SPIN_US` ([`State::pull_spin`]), so that the CTS does
//! not find it asleep. When the kernel refuses the
//! pull (`EPERM`, `ENOSYS`: a security policy that the start-up probe did not meet), the
//! message falls back to the push at once — a plain CTS — and every later message from that
//! peer is pushed.

use std::time::Duration;

use crate::error::Error;
use crate::transport::shm::cma;

use super::link::Kind;
use super::rendezvous::{Accepted, Rendezvous};
use super::requests::op_slice;
use super::split::Part;
use super::{Op, OpId, OpKind, OutFrame, ProtocolCounts, State};

/// The copy rate a sender's wait assumes for a pull of its message (bytes per nanosecond,
/// about a fifth of what one core copied here: the spin ends with the pull anyway).
const PULL_BYTES_PER_NS: usize = 4;
/// The longest extra spin of a wait for a pulled send.
const PULL_SPIN_MAX: Duration = Duration::from_millis(4);

/// A receive pulling its message out of a local sender's buffer.
#[derive(Debug, Clone)]
pub(super) struct Pull {
    /// The receive.
    id: OpId,
    /// The sender (world rank) and its process.
    pub peer: usize,
    pub pid: u32,
    /// The sender's message id.
    msg_id: u64,
    /// The sender's buffer.
    addr: u64,
    /// Bytes of the message, and bytes copied so far (of a pull that is not split).
    pub len: usize,
    done: usize,
    /// The receiver's side of a split: the sender writes pieces too (`split.rs`).
    pub split: Option<Part>,
}

/// What one piece of a pull came to.
enum Step {
    /// More pieces to go.
    More,
    /// The pull is over (complete, failed, abandoned, or fallen back to a push).
    Over,
}

impl State {
    /// Starts pulling message `msg_id` (`len` bytes at `addr` in process `pid` of world rank
    /// `peer`) into receive `id`, and copies its first piece now.
    pub(super) fn start_pull(
        &mut self,
        id: OpId,
        (peer, pid): (usize, u32),
        (msg_id, addr, len): (u64, u64, usize),
    ) {
        tracing::debug!(
            peer,
            len,
            "shared-memory receive: pulled with cross-memory attach"
        );
        let split = self.offer_split(id, peer, msg_id, len);
        let mut pull = Pull {
            id,
            peer,
            pid,
            msg_id,
            addr,
            len,
            done: 0,
            split,
        };
        if let Step::More = self.pull_piece(&mut pull) {
            self.pulls.push(pull);
        }
    }

    /// How long a wait for any of `ids` spins beyond `HCOMM_SPIN_US`: about the time a local
    /// peer takes to pull the largest of them that it may pull (a send above the eager limit
    /// over shared memory with cross-memory attach), at most [`PULL_SPIN_MAX`]. The sender
    /// has nothing to do meanwhile, and the CTS that ends the pull comes when the copy is
    /// done: a sender asleep by then costs a wake-up on the way of every large message (a
    /// 1 MiB pull takes about 50 µs here, the default spin is 50 µs).
    pub(super) fn pull_spin(&self, ids: &[OpId]) -> Duration {
        let pulled = |op: &&Op| {
            let peer = op.target.peer;
            op.kind == OpKind::Send
                && op.result.is_none()
                && (self.cfg.shm_eager_limit + 1..=self.cfg.shm_push_threshold).contains(&op.cap)
                && !self.pull_refused.get(peer).copied().unwrap_or(true)
                && self
                    .links
                    .caps(peer)
                    .is_some_and(|c| c.kind == Kind::Shm && c.read_remote.is_some())
        };
        let most = ids
            .iter()
            .filter_map(|id| self.ops.get(id))
            .filter(pulled)
            .map(|op| op.cap)
            .max()
            .unwrap_or(0);
        Duration::from_nanos((most / PULL_BYTES_PER_NS) as u64).min(PULL_SPIN_MAX)
    }

    /// Whether pulls or split writes are in flight (work for the next turn, so waiters must
    /// not sleep).
    pub(super) fn pulling(&self) -> bool {
        !self.pulls.is_empty() || self.writing()
    }

    /// Copies one piece of every pull and split write in flight; returns whether any was in
    /// flight.
    pub(super) fn advance_pulls(&mut self) -> bool {
        let wrote = self.advance_writes();
        if self.pulls.is_empty() {
            return wrote;
        }
        let mut pulls = std::mem::take(&mut self.pulls);
        let mut i = 0;
        while i < pulls.len() {
            match self.pull_piece(&mut pulls[i]) {
                Step::More => i += 1,
                Step::Over => {
                    pulls.swap_remove(i);
                }
            }
        }
        pulls.append(&mut self.pulls);
        self.pulls = pulls;
        true
    }

    /// Copies the piece of `p` at `p.done` (at most `HCOMM_SHM_CHUNK` bytes; of a split, the
    /// next piece it claims) and, after the last one, completes the receive and clears the
    /// sender.
    fn pull_piece(&mut self, p: &mut Pull) -> Step {
        if self.peers[p.peer].as_ref().is_none_or(|q| q.lost.is_some()) {
            // The peer's loss failed the receive already (and ended its split).
            self.end_split(p);
            return Step::Over;
        }
        if self.ops.get(&p.id).is_none_or(|op| op.result.is_some()) {
            // The receive was abandoned: the sender may reuse its buffer.
            self.end_split(p);
            self.queue(p.peer, OutFrame::control(Rendezvous::refuse(p.msg_id)));
            return Step::Over;
        }
        let (at, piece) = match p.split.take() {
            Some(mut s) => {
                let next = self.split_next(p, &mut s);
                p.split = Some(s);
                match next {
                    Ok(range) => range,
                    Err(false) => return Step::More,
                    Err(true) => return self.pull_over(p, Ok(())),
                }
            }
            None => (p.done, self.cfg.shm_chunk.max(1).min(p.len - p.done)),
        };
        // Still there: checked above, and nothing since removes an operation.
        let Some(op) = self.ops.get_mut(&p.id) else {
            return Step::Over;
        };
        let result = match op_slice(op, at, piece) {
            Some(dst) => {
                let from = (p.addr as usize).wrapping_add(at);
                // SAFETY: the sender offered this buffer to be pulled (`FLAG_CAN_PULL`) and
                // keeps it unchanged until this rank's CTS says the pull is over; the
                // receive is live, so `dst` is its buffer (checked `len <= cap` when
                // accepted), which nothing else touches meanwhile (of a split, the sender
                // writes only the pieces it claimed, never this one).
                unsafe { cma::read_remote(p.pid, from, dst) }
            }
            None => Ok(()),
        };
        match result {
            Ok(()) if p.split.is_some() => Step::More,
            Ok(()) if p.done + piece < p.len => {
                p.done += piece;
                Step::More
            }
            result => self.pull_over(p, result),
        }
    }

    /// Pull `p` is over with `result`: completes the receive (a refused pull falls back to
    /// the push) and clears the sender.
    fn pull_over(&mut self, p: &mut Pull, result: crate::error::Result<()>) -> Step {
        if result.is_err() {
            self.end_split(p);
        }
        match result {
            Ok(()) => {
                ProtocolCounts::bump(&self.counts.shm_pull);
                if p.split.is_some() {
                    ProtocolCounts::bump(&self.counts.shm_split);
                    self.split.release(p.peer);
                }
                self.complete(p.id, Ok(p.len));
                self.queue(
                    p.peer,
                    OutFrame::control(Rendezvous::pulled(p.msg_id, true)),
                );
                Step::Over
            }
            Err(Error::PeerLost(why)) => {
                // The sender's process is gone: the peer is lost, for every operation with
                // it (this one included), not only for this receive; and the call's peers
                // are told whom this rank lost when it abandons the call.
                self.fail_peer(p.peer, why.message);
                Step::Over
            }
            Err(err) if cma::refused(&err) => {
                tracing::info!(
                    peer = p.peer,
                    "cross-memory attach refused ({err}): this and later messages from world \
                     rank {} are pushed through shared memory",
                    p.peer
                );
                if let Some(refused) = self.pull_refused.get_mut(p.peer) {
                    *refused = true;
                }
                let cap = self.ops.get(&p.id).map_or(0, |op| op.cap);
                if let Accepted::Data { cts } =
                    self.rndv.accept(p.peer, p.msg_id, p.id, (cap, p.len), None)
                {
                    self.queue(p.peer, OutFrame::control(cts));
                }
                Step::Over
            }
            Err(err) => {
                ProtocolCounts::bump(&self.counts.shm_pull);
                self.complete(p.id, Err(err));
                self.queue(
                    p.peer,
                    OutFrame::control(Rendezvous::pulled(p.msg_id, false)),
                );
                Step::Over
            }
        }
    }

    /// Whether receive `id` is pulling its message.
    pub(super) fn pulls_into(&self, id: OpId) -> bool {
        self.pulls.iter().any(|p| p.id == id)
    }

    /// Receive `id` is abandoned: its pull (if any) stops, and the sender is told to reuse
    /// its buffer.
    pub(super) fn abandon_pull(&mut self, id: OpId) {
        if let Some(i) = self.pulls.iter().position(|p| p.id == id) {
            let p = self.pulls.swap_remove(i);
            // Before the buffer goes: the sender writes nothing more into it.
            self.end_split(&p);
            self.queue(p.peer, OutFrame::control(Rendezvous::refuse(p.msg_id)));
        }
    }

    /// World rank `peer` is being lost: its split pulls end before their receives fail, so
    /// that the buffers go only once the peer writes nothing more into them.
    pub(super) fn end_splits_with(&mut self, peer: usize) {
        let ending: Vec<Pull> = self
            .pulls
            .iter()
            .filter(|p| p.peer == peer && p.split.is_some())
            .cloned()
            .collect();
        for p in &ending {
            self.end_split(p);
        }
        for p in self.pulls.iter_mut().filter(|p| p.peer == peer) {
            p.split = None;
        }
    }
}
