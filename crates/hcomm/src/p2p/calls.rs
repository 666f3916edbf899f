//! Collective calls, sans I/O: their signatures, mismatches between ranks, aborted calls and
//! aborted communicators.
//!
//! [`Calls`] owns this bookkeeping and touches no link or operation: it records the calls
//! this rank makes and what peers said about theirs, judges arriving messages against them,
//! and writes the errors; the engine sends the abort frames and fails the operations it names.

use crate::error::{Error, PeerRank, Result};
use crate::sync::lock;
use crate::transport::wire::FrameHeader;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::dispatch::{abort_frame, comm_abort_frame, entered_frame};
use super::matching::Stranger;
use super::progress::tell_launcher;
use super::revoke::Revocations;
use super::watch::Timing;
use super::{Engine, OpId, OutFrame, State, Target};

/// Recent calls remembered for mismatch detection.
const CALL_MEMORY: usize = 4096;

/// How a peer abandoned an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Abandoned {
    /// Its world rank.
    pub peer: usize,
    /// Its signature of the call.
    pub sig: [u64; 2],
    /// Over a mismatch.
    pub mismatch: bool,
    /// The world rank it had lost, if that was why.
    pub lost: Option<usize>,
}

/// The calls of one engine and what is known about them.
#[derive(Debug)]
pub(super) struct Calls {
    /// Describes an operation signature for messages.
    describe: fn([u64; 2]) -> String,
    /// Signatures of this rank's recent calls by `(comm, tag)`, oldest first in `order`.
    calls: HashMap<(u64, u32), [u64; 2]>,
    order: VecDeque<(u64, u32)>,
    /// Operations `(comm, tag)` a peer abandoned.
    aborted: HashMap<(u64, u32), Abandoned>,
    /// A mismatch found after this rank's part of a call had finished: reported by the next
    /// call on that communicator.
    late: HashMap<u64, Error>,
    /// Whether `late` holds anything, for a look without the engine's lock.
    late_news: Arc<AtomicBool>,
    /// Communicators aborted (by this rank or a peer), with the error of their operations.
    comm_aborted: HashMap<u64, Error>,
    /// The world rank this rank last learned was lost (found itself, or named by a peer's
    /// notice): named in the notices of calls abandoned over a lost peer.
    last_lost: Option<usize>,
    /// Revoked communicators and the epochs their frames may no longer have.
    pub(super) revocations: Revocations,
    /// Per communicator (its collective channel), the counter of the collectives this rank
    /// entered, which the communicator keeps (what a peer's `Ask` is answered).
    entered: HashMap<u64, (Weak<AtomicU32>, Arc<[usize]>)>,
    /// The peers' answers to this rank's asks, by (communicator, world rank).
    answers: HashMap<(u64, usize), u64>,
}

impl Calls {
    /// Bookkeeping that describes signatures with `describe` and raises `late_news` while a
    /// late error waits.
    pub(super) fn new(describe: fn([u64; 2]) -> String, late_news: Arc<AtomicBool>) -> Calls {
        Calls {
            describe,
            calls: HashMap::default(),
            order: VecDeque::new(),
            aborted: HashMap::default(),
            late: HashMap::default(),
            late_news,
            comm_aborted: HashMap::default(),
            last_lost: None,
            revocations: Revocations::default(),
            entered: HashMap::default(),
            answers: HashMap::default(),
        }
    }

    /// Registers this rank's call `(comm, tag)` with signature `sig`. Fails if `comm` was
    /// aborted or an earlier call on it turned out mismatched after it returned.
    pub(super) fn begin(&mut self, comm: u64, tag: u32, sig: [u64; 2]) -> Result<()> {
        if let Some(e) = self.aborted_comm(comm) {
            return Err(e);
        }
        self.late_error(comm)?;
        if self.order.len() >= CALL_MEMORY {
            if let Some(old) = self.order.pop_front() {
                self.calls.remove(&old);
            }
        }
        self.calls.insert((comm, tag), sig);
        self.order.push_back((comm, tag));
        Ok(())
    }

    /// Communicator `comm` (a collective channel) of `members` (world ranks) counts the
    /// collectives this rank entered in `counter`.
    pub(super) fn track_entered(
        &mut self,
        comm: u64,
        counter: &Arc<AtomicU32>,
        members: Arc<[usize]>,
    ) {
        self.entered.retain(|_, (c, _)| c.strong_count() > 0);
        self.entered
            .insert(comm, (Arc::downgrade(counter), members));
    }

    /// How many collectives of `comm` this rank entered (0 for a communicator it does not
    /// know, or no longer has).
    pub(super) fn entered(&self, comm: u64) -> u64 {
        self.entered
            .get(&comm)
            .and_then(|(c, _)| c.upgrade())
            .map_or(0, |c| u64::from(c.load(Ordering::Relaxed)))
    }

    /// The members (world ranks) of communicator `comm`, if it counts its collectives here.
    pub(super) fn members(&self, comm: u64) -> Option<Arc<[usize]>> {
        self.entered.get(&comm).map(|(_, m)| Arc::clone(m))
    }

    /// What the answers that came say of call `seq` of `comm`: the members that had not
    /// entered it when they answered, for a stall warning; `None` when none is known.
    pub(super) fn not_entered_report(&self, comm: u64, seq: u32) -> Option<String> {
        let members = self.members(comm)?;
        let late: Vec<String> = members
            .iter()
            .enumerate()
            .filter_map(|(r, &w)| {
                let n = *self.answers.get(&(comm, w))?;
                (n <= u64::from(seq)).then(|| {
                    let last = n.checked_sub(1).map_or("none".into(), |l| format!("#{l}"));
                    format!("rank {r} (world rank {w}; its last entered: {last})")
                })
            })
            .collect();
        (!late.is_empty()).then(|| format!("; not entered #{seq} yet: {}", late.join(", ")))
    }

    /// World rank `peer` answered that it entered `count` collectives of `comm`.
    pub(super) fn on_entered(&mut self, comm: u64, peer: usize, count: u64) {
        self.answers.insert((comm, peer), count);
    }

    /// Takes `peer`'s answer about `comm`, if it came.
    pub(super) fn take_answer(&mut self, comm: u64, peer: usize) -> Option<u64> {
        self.answers.remove(&(comm, peer))
    }

    /// This rank's signature of call `(comm, tag)`, while it remembers the call.
    pub(super) fn ours(&self, comm: u64, tag: u32) -> Option<[u64; 2]> {
        self.calls.get(&(comm, tag)).copied()
    }

    /// Forgets call `(comm, tag)`: later news about it no longer concerns this rank. Whether
    /// it was remembered.
    pub(super) fn forget(&mut self, comm: u64, tag: u32) -> bool {
        self.calls.remove(&(comm, tag)).is_some()
    }

    /// Whether a message belongs to a call this rank made differently.
    pub(super) fn foreign(&self, hdr: &FrameHeader) -> bool {
        self.calls
            .get(&(hdr.comm, hdr.tag))
            .is_some_and(|ours| *ours != hdr.sig)
    }

    /// The error of this rank's call `ours` when `who` (e.g. "rank 3") called `theirs`.
    pub(super) fn mismatch(&self, ours: [u64; 2], who: &str, theirs: [u64; 2]) -> Error {
        let describe = self.describe;
        Error::mismatch(format!(
            "this rank called {} but {who} called {}: every rank must call the same \
             collectives in the same order with the same type, op, count and root",
            describe(ours),
            describe(theirs)
        ))
    }

    /// The error of this rank's call `ours` that the call `(comm, tag)` stranger messages
    /// refuted (see [`super::matching::Matching::strangers`]).
    pub(super) fn refuted(&self, ours: [u64; 2], first: &Stranger) -> Error {
        self.mismatch(ours, &format!("world rank {}", first.peer), first.sig)
            .with_peer(PeerRank::world(first.peer))
    }

    /// Whether a peer abandoned `t`'s call, and the error of `t` if so; or the error of
    /// `t`'s communicator if it was aborted.
    pub(super) fn check(&self, t: &Target) -> Result<()> {
        if let Some(e) = self.aborted_comm(t.comm) {
            return Err(e);
        }
        // Every operation asks: no hashing while no call was abandoned.
        if self.aborted.is_empty() {
            return Ok(());
        }
        match self.aborted.get(&(t.comm, t.tag)) {
            Some(a) => Err(self.abandoned(t.sig, a)),
            None => Ok(()),
        }
    }

    /// Whether a peer abandoned call `(comm, tag)`.
    pub(super) fn is_aborted(&self, comm: u64, tag: u32) -> bool {
        self.aborted.contains_key(&(comm, tag))
    }

    /// The error of call `(comm, tag)` if a peer abandoned it, for calls that wait outside
    /// the engine.
    pub(super) fn abandoned_call(&self, comm: u64, tag: u32) -> Option<Error> {
        let a = self.aborted.get(&(comm, tag))?;
        Some(self.abandoned(self.ours(comm, tag).unwrap_or_default(), a))
    }

    /// The error of this rank's operation (signature `ours`) that a peer abandoned (`a`).
    pub(super) fn abandoned(&self, ours: [u64; 2], a: &Abandoned) -> Error {
        let describe = self.describe;
        let Abandoned {
            peer,
            sig,
            mismatch,
            lost,
        } = *a;
        if let (true, false, Some(l)) = (sig == ours, mismatch, lost) {
            Error::peer_lost(
                PeerRank::world(l),
                format!(
                    "world rank {l} is unreachable: world rank {peer} abandoned {} on losing \
                     it; look at the output of world rank {l} (did it exit or crash?)",
                    describe(sig)
                ),
            )
        } else if sig == ours && mismatch {
            Error::mismatch(format!(
                "world rank {peer} abandoned {} because ranks called mismatched collectives; \
                 see the first mismatch error of the ranks",
                describe(sig)
            ))
            .with_peer(PeerRank::world(peer))
        } else if sig == ours {
            Error::aborted(format!(
                "world rank {peer} abandoned {} after an error; see that rank's error",
                describe(sig)
            ))
            .with_peer(PeerRank::world(peer))
        } else {
            self.mismatch(ours, &format!("world rank {peer}"), sig)
                .with_peer(PeerRank::world(peer))
        }
    }

    /// A peer abandoned call `(comm, tag)` (`a`): remembered for this rank's operations of
    /// it, now and later; the error of this rank's call if it made it.
    pub(super) fn on_abort(&mut self, comm: u64, tag: u32, a: Abandoned) -> Option<Error> {
        if let Some(l) = a.lost {
            self.last_lost = Some(l);
        }
        self.aborted.insert((comm, tag), a);
        let ours = self.ours(comm, tag)?;
        Some(self.abandoned(ours, &a))
    }

    /// World rank `peer` was found lost.
    pub(super) fn peer_lost(&mut self, peer: usize) {
        self.last_lost = Some(peer);
    }

    /// The world rank this rank last learned was lost.
    pub(super) fn last_lost(&self) -> Option<usize> {
        self.last_lost
    }

    /// Keeps `err` for the next call on `comm` (its own call was over when it came).
    pub(super) fn report_late(&mut self, comm: u64, err: Error) {
        self.late.entry(comm).or_insert(err);
        self.late_news.store(true, Ordering::Release);
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

    /// The error of every operation on `comm`, if it was aborted.
    pub(super) fn aborted_comm(&self, comm: u64) -> Option<Error> {
        if self.comm_aborted.is_empty() {
            return None;
        }
        self.comm_aborted.get(&comm).cloned()
    }

    /// Communicator `comm` is aborted with `err` (the first error given stays): returns the
    /// error of its operations.
    pub(super) fn abort_comm(&mut self, comm: u64, err: Error) -> Error {
        self.comm_aborted.entry(comm).or_insert(err).clone()
    }
}

impl Engine {
    /// An error about call `(comm, tag)` that arrived since it began (a peer's abort, or a
    /// message of this call with another signature), for calls that wait outside the engine.
    pub(crate) fn call_failed(&self, comm: u64, tag: u32) -> Option<Error> {
        let mut st = lock(&self.shared.state);
        if let Some(e) = st.calls.aborted_comm(comm) {
            return Some(e);
        }
        if let Err(e) = st.calls.late_error(comm) {
            return Some(e);
        }
        st.calls.abandoned_call(comm, tag)
    }

    /// Fails if communicator `comm` was aborted, by this rank or a peer (as far as this rank
    /// has read), before a call on it does anything else.
    #[inline]
    pub(crate) fn check_aborted(&self, comm: u64) -> Result<()> {
        if !self.shared.io.any_aborted.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.aborted_comm(comm)
    }

    /// [`Engine::check_aborted`] once some communicator was aborted.
    #[cold]
    fn aborted_comm(&self, comm: u64) -> Result<()> {
        match lock(&self.shared.state).calls.aborted_comm(comm) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The error of an earlier call on `comm` that turned out mismatched after it returned
    /// (see `State::begin_call`), reported once; without the lock when there is none.
    #[inline]
    pub(crate) fn late_error(&self, comm: u64) -> Result<()> {
        if !self.shared.late_news.load(Ordering::Acquire) {
            return Ok(());
        }
        self.late_news(comm)
    }

    /// [`Engine::late_error`] once some call turned out mismatched late.
    #[cold]
    fn late_news(&self, comm: u64) -> Result<()> {
        lock(&self.shared.state).calls.late_error(comm)
    }

    /// Asks the world ranks `peers` how many collectives of `comm` (a collective channel)
    /// each entered, and waits for their answers: for each peer its count, `None` where no
    /// answer came (lost, or too slow). This rank answers itself. A rank answers from
    /// whichever thread drives its progress, its watcher when none does, so a rank that is
    /// alive but busy elsewhere answers within a few watcher intervals, which bound the wait
    /// (`Timing::answer_within`: under a second for `HCOMM_TIMEOUT` up to 2 s, 3.25 s at
    /// most).
    pub(crate) fn ask_entered(&self, comm: u64, peers: &[usize]) -> Vec<Option<u64>> {
        let mut out: Vec<Option<u64>> = vec![None; peers.len()];
        let deadline;
        {
            let mut st = lock(&self.shared.state);
            deadline = Instant::now() + Timing::for_timeout(st.cfg.timeout).answer_within();
            let me = st.cfg.rank;
            for (i, &p) in peers.iter().enumerate() {
                if p == me {
                    out[i] = Some(st.calls.entered(comm));
                    continue;
                }
                st.ask(p, comm);
            }
            st.handle(&[], false);
        }
        let mut events = Vec::with_capacity(64);
        let mut pause = Duration::from_micros(200);
        loop {
            let mut st = super::watch::pump(&self.shared, &mut events);
            for (i, &p) in peers.iter().enumerate() {
                if out[i].is_none() {
                    out[i] = st.calls.take_answer(comm, p);
                }
            }
            let lost = |p: usize| {
                st.peers
                    .get(p)
                    .and_then(Option::as_ref)
                    .is_none_or(|q| q.lost.is_some())
            };
            let pending = peers
                .iter()
                .zip(&out)
                .any(|(&p, o)| o.is_none() && !lost(p));
            drop(st);
            if !pending || Instant::now() >= deadline {
                return out;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// Communicator `comm` (a collective channel) of `members` (world ranks) counts the
    /// collectives this rank entered in `counter`: peers asking are answered from it (see
    /// [`Engine::ask_entered`]).
    pub(crate) fn track_entered(&self, comm: u64, counter: &Arc<AtomicU32>, members: Arc<[usize]>) {
        lock(&self.shared.state)
            .calls
            .track_entered(comm, counter, members);
    }

    /// A call of `comm` stalls: asks its members how many collectives of it they entered; the
    /// answers come in the background (for [`Engine::not_entered_report`]).
    pub(crate) fn ask_members(&self, comm: u64) {
        lock(&self.shared.state).ask_members(comm);
    }

    /// What the members' answers say of call `seq` of `comm` (see `Calls::not_entered_report`).
    pub(crate) fn not_entered_report(&self, comm: u64, seq: u32) -> Option<String> {
        lock(&self.shared.state).calls.not_entered_report(comm, seq)
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
            st.calls.forget(t.comm, t.tag);
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
                .or(st.calls.last_lost()),
            _ => None,
        };
        // Every peer still reachable is told, also when this call failed on another peer's
        // notice (the call then counts as abandoned here, which must not stop the notice: a
        // peer waiting for this rank would otherwise learn only of its goodbye, and blame its
        // finalize instead of the lost rank); not when the communicator was aborted, whose
        // notice reaches every member and names the aborter.
        let mut told: Vec<usize> = Vec::new();
        for t in targets {
            let reachable = st
                .peers
                .get(t.peer)
                .and_then(Option::as_ref)
                .is_some_and(|q| q.lost.is_none());
            let aborted = st.calls.aborted_comm(t.comm).is_some();
            if !told.contains(&t.peer) && reachable && !aborted {
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
                st.queue(peer, OutFrame::control(comm_abort_frame(comms, None)));
            }
            let me = st.cfg.rank;
            st.comm_aborts.push((comms, me));
            // Out now, not at this rank's next call: a member that learns of the abort first
            // may leave at once, and its goodbye must not reach the others before the abort.
            st.handle(&[], false);
        }
        // Threads of this rank waiting on the communicator, in the engine or outside it.
        self.shared.io.wake_all();
    }
}

impl State {
    /// Asks every other member of `comm` (a collective channel this rank counts) how many
    /// collectives of it they entered; their answers replace earlier ones as they come.
    pub(super) fn ask_members(&mut self, comm: u64) {
        let Some(members) = self.calls.members(comm) else {
            return;
        };
        let me = self.cfg.rank;
        for &p in members.iter().filter(|&&p| p != me) {
            self.ask(p, comm);
        }
    }

    /// Asks world rank `p` how many collectives of `comm` it entered (forgetting what it
    /// answered before).
    fn ask(&mut self, p: usize, comm: u64) {
        self.calls.take_answer(comm, p);
        self.want(p);
        self.queue(p, OutFrame::control(entered_frame(comm, true, 0)));
    }

    /// Receive `id` met a message of a different operation (`theirs`): fail it, and tell the
    /// sender this rank abandons the operation.
    pub(super) fn mismatch(&mut self, id: OpId, theirs: [u64; 2]) {
        let Some(op) = self.ops.get(&id) else { return };
        let t = op.target;
        let err = self
            .calls
            .mismatch(t.sig, &format!("rank {}", t.comm_rank), theirs)
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
        let hdr = abort_frame(t.comm, t.tag, t.sig, mismatch, lost);
        self.queue(t.peer, OutFrame::control(hdr));
    }

    /// A message of `(comm, tag)` carries another signature than this rank's call: fail the
    /// call (now, or at the next call on the communicator if it is over) and tell the sender.
    pub(super) fn reject_message(&mut self, peer: usize, hdr: &FrameHeader) {
        let Some(ours) = self.calls.ours(hdr.comm, hdr.tag) else {
            return;
        };
        let err = self
            .calls
            .mismatch(ours, &format!("world rank {peer}"), hdr.sig)
            .with_peer(PeerRank::world(peer));
        self.fail_call(hdr.comm, hdr.tag, err);
        let t = Target {
            comm: hdr.comm,
            peer,
            comm_rank: peer,
            tag: hdr.tag,
            sig: ours,
            seq: 0,
            epoch: hdr.epoch,
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
            if !self.calls.forget(comm, tag) {
                return;
            }
            // The call is over here: the one running now on the communicator reports it, or
            // else the next one.
            victims = pending(self, true);
            if victims.is_empty() {
                self.calls.report_late(comm, err);
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
        self.calls.begin(comm, tag, sig)?;
        // Messages of this call that arrived before it, from any possible sender.
        let strangers = self.matching.strangers(comm, tag, sig, self.peers.len());
        let Some(first) = strangers.first() else {
            return Ok(());
        };
        let err = self.calls.refuted(sig, first);
        let peer = first.peer;
        for s in &strangers {
            if let Some(msg_id) = s.rts {
                self.refuse_rts(s.peer, msg_id);
            }
        }
        self.send_abort(
            Target {
                comm,
                peer,
                comm_rank: peer,
                tag,
                sig,
                seq: 0,
                epoch: 0,
            },
            true,
            None,
        );
        Err(err)
    }

    /// A peer abandoned `(comm, tag)` (`a`; on losing world rank `a.lost`, if that was why):
    /// fail this rank's operations of it, now and later.
    pub(super) fn on_abort(&mut self, comm: u64, tag: u32, a: Abandoned) {
        if let (Some(l), Some(pipe)) = (a.lost, self.cfg.run_fd) {
            tell_launcher(pipe, self.cfg.rank, l);
        }
        if let Some(err) = self.calls.on_abort(comm, tag, a) {
            self.fail_call(comm, tag, err);
        }
    }

    /// Communicator `comm` is aborted: its pending operations fail with `err`, and so will
    /// every later one.
    pub(super) fn abort_comm(&mut self, comm: u64, err: Error) {
        self.io.any_aborted.store(true, Ordering::SeqCst);
        let err = self.calls.abort_comm(comm, err);
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
