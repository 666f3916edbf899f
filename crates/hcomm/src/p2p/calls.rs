//! Collective calls: their signatures, mismatches between ranks, aborted calls and aborted
//! communicators.

use crate::error::{Error, PeerRank, Result};
use crate::sync::lock;
use crate::transport::wire::{FrameHeader, FrameKind, FLAG_COMM_ABORT, FLAG_MISMATCH};
use std::sync::atomic::Ordering;

use super::matching::remove_from;
use super::progress::tell_launcher;
use super::{
    Engine, MatchKey, OpId, OutFrame, State, Target, Unexpected, UnexpectedKind, CALL_MEMORY,
};

impl Engine {
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
                let err = Error::aborted(
                    "this rank aborted the communicator (Communicator::abort, hcommCommAbort)",
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
}

impl State {
    /// Receive `id` met a message of a different operation (`theirs`): fail it, and tell the
    /// sender this rank abandons the operation.
    pub(super) fn mismatch(&mut self, id: OpId, theirs: [u64; 2]) {
        let Some(op) = self.ops.get(&id) else { return };
        let t = op.target;
        let describe = self.cfg.describe;
        let err = Error::mismatch(format!(
            "this rank called {} but rank {} called {}: every rank must call the same \
             collectives in the same order with the same type, op, count and root",
            describe(t.sig),
            t.comm_rank,
            describe(theirs)
        ))
        .with_peer(PeerRank::ranks(t.comm_rank, t.peer));
        self.complete(id, Err(err));
        self.send_abort(t, true, None);
    }

    /// Tells `t.peer` that this rank abandoned the operation `(t.comm, t.tag)`, over a
    /// mismatch or another error, naming the world rank it lost if that was why (`msg_id` is
    /// that rank + 1, 0 for none).
    pub(super) fn send_abort(&mut self, t: Target, mismatch: bool, lost: Option<usize>) {
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
    pub(super) fn abandoned(
        &self,
        t: &Target,
        peer: usize,
        sig: [u64; 2],
        mismatch: bool,
        lost: Option<usize>,
    ) -> Error {
        let describe = self.cfg.describe;
        if let (true, false, Some(l)) = (sig == t.sig, mismatch, lost) {
            Error::peer_lost(
                PeerRank::world(l),
                format!(
                    "world rank {l} is unreachable: world rank {peer} abandoned {} on losing \
                     it; look at the output of world rank {l} (did it exit or crash?)",
                    describe(sig)
                ),
            )
        } else if sig == t.sig && mismatch {
            Error::mismatch(format!(
                "world rank {peer} abandoned {} because ranks called mismatched collectives; \
                 see the first mismatch error of the ranks",
                describe(sig)
            ))
            .with_peer(PeerRank::world(peer))
        } else if sig == t.sig {
            Error::aborted(format!(
                "world rank {peer} abandoned {} after an error; see that rank's error",
                describe(sig)
            ))
            .with_peer(PeerRank::world(peer))
        } else {
            Error::mismatch(format!(
                "this rank called {} but world rank {peer} called {}: every rank must call the \
                 same collectives in the same order with the same type, op, count and root",
                describe(t.sig),
                describe(sig)
            ))
            .with_peer(PeerRank::world(peer))
        }
    }

    /// Whether a message belongs to a call this rank made differently.
    pub(super) fn foreign(&self, hdr: &FrameHeader) -> bool {
        self.calls
            .get(&(hdr.comm, hdr.tag))
            .is_some_and(|ours| *ours != hdr.sig)
    }

    /// A message of `(comm, tag)` carries another signature than this rank's call: fail the
    /// call (now, or at the next call on the communicator if it is over) and tell the sender.
    pub(super) fn reject_message(&mut self, peer: usize, hdr: &FrameHeader) {
        let Some(&ours) = self.calls.get(&(hdr.comm, hdr.tag)) else {
            return;
        };
        let describe = self.cfg.describe;
        let err = Error::mismatch(format!(
            "this rank called {} but world rank {peer} called {}: every rank must call the same \
             collectives in the same order with the same type, op, count and root",
            describe(ours),
            describe(hdr.sig)
        ))
        .with_peer(PeerRank::world(peer));
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
    pub(super) fn fail_call(&mut self, comm: u64, tag: u32, err: Error) {
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
    pub(super) fn begin_call(&mut self, comm: u64, tag: u32, sig: [u64; 2]) -> Result<()> {
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
        Err(Error::mismatch(format!(
            "this rank called {} but world rank {} called {}: every rank must call the same \
             collectives in the same order with the same type, op, count and root",
            describe(sig),
            key.peer,
            describe(theirs)
        ))
        .with_peer(PeerRank::world(key.peer)))
    }

    /// The error of an earlier call on `comm` that turned out mismatched after it returned,
    /// reported once.
    pub(super) fn late_error(&mut self, comm: u64) -> Result<()> {
        let Some(e) = self.late.remove(&comm) else {
            return Ok(());
        };
        self.late_news
            .store(!self.late.is_empty(), Ordering::Release);
        Err(e)
    }

    /// A peer abandoned `(comm, tag)` (on losing world rank `lost`, if that was why): fail
    /// this rank's operations of it, now and later.
    pub(super) fn on_abort(
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
    pub(super) fn aborted_comm(&self, comm: u64) -> Option<Error> {
        if self.comm_aborted.is_empty() {
            return None;
        }
        self.comm_aborted.get(&comm).cloned()
    }

    /// Communicator `comm` is aborted: its pending operations fail with `err`, and so will
    /// every later one.
    pub(super) fn abort_comm(&mut self, comm: u64, err: Error) {
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
}
