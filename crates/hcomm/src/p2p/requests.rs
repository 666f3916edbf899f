//! Operations: posting, completing, taking, cancelling and detaching sends and receives, and
//! the buffers they name.

use crate::config::Backoff;
use crate::error::{Error, PeerRank, Result};
use crate::sync::lock;
use crate::transport::wire::FAST_PAYLOAD;
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::link::ofi::OfiWatch;
use super::link::{Exposure, Link};
use super::matching::Matching;
use super::wait::{spin_on, CQ_WATCH};
use super::{
    rank_name, Blocking, BufPtr, Deadline, Dest, Engine, Op, OpId, OpKind, OutFrame, State, Target,
    ANY_PEER,
};

/// The writable bytes `off..off+len` of a live operation's buffer.
pub(super) fn op_slice(op: &mut Op, off: usize, len: usize) -> Option<&mut [u8]> {
    if len == 0 {
        return None;
    }
    let base = match op.detached.as_mut() {
        Some(b) => b.as_mut_ptr(),
        None => op.buf.0,
    };
    // SAFETY: the operation is live, so its buffer is valid for writes of `cap` bytes and not
    // otherwise accessed (see `post_recv`); callers checked `off + len <= msg_len <= cap`.
    Some(unsafe { std::slice::from_raw_parts_mut(base.add(off), len) })
}

/// Where `len` payload bytes at progress `done` go; `None` to drop them.
pub(super) fn dest_slice<'a>(
    ops: &'a mut HashMap<OpId, Op>,
    matching: &'a mut Matching,
    dest: Dest,
    done: usize,
    len: usize,
) -> Option<&'a mut [u8]> {
    match dest {
        Dest::Discard => None,
        Dest::Op { op, base } => op_slice(ops.get_mut(&op)?, base + done, len),
        Dest::Unexpected(uid) => matching.payload(uid, done, len),
    }
}

/// The whole payload of an outgoing frame: its own copy, or its live operation's bytes.
pub(super) fn frame_payload<'a>(f: &'a OutFrame, ops: &'a HashMap<OpId, Op>) -> &'a [u8] {
    match f.op.and_then(|id| ops.get(&id)) {
        _ if f.owned.is_some() => f.owned.as_deref().unwrap_or(&[]),
        Some(op) if f.len > 0 => {
            let src = op
                .detached
                .as_ref()
                .map_or(op.buf.0.cast_const(), |b| b.as_ptr());
            // SAFETY: the frame's operation is live, so its buffer is valid for
            // `off + len <= cap` bytes (see `post_send`).
            unsafe { std::slice::from_raw_parts(src.add(f.off), f.len) }
        }
        _ => &[],
    }
}

pub(super) fn truncated(op: &Op, len: usize) -> Error {
    Error::truncated(format!(
        "message from rank {} (tag {}) is {} bytes but the receive buffer holds {}: post a \
         larger buffer",
        op.target.comm_rank, op.target.tag, len, op.cap
    ))
    .with_peer(PeerRank::ranks(op.target.comm_rank, op.target.peer))
    .with_operation(op.operation())
}

impl Engine {
    /// Posts a send of `len` bytes at `buf`.
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid for reads until the operation is removed by
    /// [`Engine::wait`] or [`Engine::test`] returning its result, or handed over by
    /// [`Engine::detach`].
    pub(super) unsafe fn post_send(
        &self,
        t: Target,
        buf: *const u8,
        len: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        let mut st = lock(&self.shared.state);
        let id = st.post_send(t, BufPtr(buf.cast_mut()), len, asynchronous)?;
        self.note_async(&mut st, id, asynchronous);
        Ok(id)
    }

    /// Posts a send of `len` bytes at `buf` (`Blocking::Send`) or a receive into them, and
    /// takes its result at once when it completed while it was posted: `None` then (an error
    /// is the operation's).
    ///
    /// # Safety
    /// As for [`Engine::post_send`] and [`Engine::post_recv`].
    pub(super) unsafe fn post_or_done(
        &self,
        kind: Blocking,
        t: Target,
        buf: *mut u8,
        len: usize,
    ) -> Result<Option<OpId>> {
        let mut st = lock(&self.shared.state);
        // A small message that is here already is taken straight from its slot, unposted.
        if kind == Blocking::Recv
            && st.links.primary(t.peer).is_some_and(Link::may_hold_inline)
            // SAFETY: forwarded from the caller (a receive's buffer is writable).
            && unsafe { st.recv_fast(&t, buf, len) }.is_some()
        {
            return Ok(None);
        }
        // SAFETY: forwarded from the caller.
        match unsafe { st.start_op(kind, t, buf, len) }? {
            Started::Done(result) => result.map(|_| None),
            Started::Posted(id) => Ok(Some(id)),
        }
    }

    /// A blocking send or receive: posts it, looks at the links once under the same lock,
    /// and waits only if it did not complete there (a small send, or a receive whose
    /// message is already in, costs one lock and no clock read).
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid for reads (a send) or for writes and otherwise unused
    /// (a receive) until this returns.
    pub(super) unsafe fn blocking(
        &self,
        kind: Blocking,
        t: Target,
        buf: *mut u8,
        len: usize,
        timeout: Duration,
    ) -> Result<usize> {
        let sh = &*self.shared;
        if kind == Blocking::Recv {
            // A small message from a local peer: taken straight from its fast box when it is
            // there, or once it comes within a short watch.
            let (watch, cq) = {
                let mut st = lock(&sh.state);
                // SAFETY: forwarded from the caller.
                if let Some(n) = unsafe { st.recv_fast(&t, buf, len) } {
                    return Ok(n);
                }
                let spin = !sh.spin.is_zero();
                let watch = match sh.io.inbox.as_ref() {
                    Some(inbox) if spin && len <= st.cfg.shm_eager_limit => {
                        st.recv_watch(inbox, &t)
                    }
                    _ => None,
                };
                // A peer on a libfabric link: its completion queue is watched instead (larger
                // messages come by a rendezvous, which the engine's turns carry on).
                let cq = match watch {
                    None if spin && len <= st.cfg.eager_limit => st.recv_cq_watch(&t),
                    _ => None,
                };
                (watch, cq)
            };
            if let Some(w) = watch {
                if spin_on(|| w.ready(), Backoff::DEFAULT) {
                    // SAFETY: forwarded from the caller.
                    if let Some(n) = unsafe { lock(&sh.state).recv_fast(&t, buf, len) } {
                        return Ok(n);
                    }
                }
            } else if let Some(w) = cq {
                // SAFETY: forwarded from the caller.
                if let Some(n) = unsafe { self.recv_watched(&w, &t, buf, len) } {
                    return Ok(n);
                }
            }
        }
        let id = {
            let mut st = lock(&sh.state);
            // SAFETY: forwarded from the caller.
            let id = match unsafe { st.start_op(kind, t, buf, len) }? {
                Started::Done(result) => return result,
                Started::Posted(id) => id,
            };
            st.handle(&[], false);
            if let Some(r) = st.take(id) {
                return r;
            }
            id
        };
        self.wait(id, Deadline::After(timeout))
    }

    /// A blocking receive of `len` bytes into `buf` from a peer on a libfabric link: watches
    /// the link (`watch`: each look reads its completion queue, as a turn would, without the
    /// engine's lock and the turn's other work) and takes a small message that comes straight
    /// from its receive slot (`State::recv_fast`); `None` when none came within the watch, or
    /// it was something else. 8 B ping-pong over libfabric tcp between two network
    /// namespaces: 3.49 against 3.73 us (6 interleaved rounds). Not inlined into `blocking`,
    /// whose shared-memory path it would slow down.
    ///
    /// # Safety
    /// `buf..buf+len` must be valid for writes.
    #[inline(never)]
    unsafe fn recv_watched(
        &self,
        watch: &OfiWatch,
        t: &Target,
        buf: *mut u8,
        len: usize,
    ) -> Option<usize> {
        if !spin_on(|| watch.ready(), CQ_WATCH) {
            return None;
        }
        // SAFETY: forwarded from the caller.
        unsafe { lock(&self.shared.state).recv_fast(t, buf, len) }
    }

    /// Posts a receive into `cap` bytes at `buf`.
    ///
    /// # Safety
    /// `buf..buf+cap` must stay valid for writes, and not be accessed otherwise, until the
    /// operation is removed by [`Engine::wait`] or [`Engine::test`], or handed over by
    /// [`Engine::detach`].
    pub(super) unsafe fn post_recv(
        &self,
        t: Target,
        buf: *mut u8,
        cap: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        let mut st = lock(&self.shared.state);
        let id = st.post_recv(t, BufPtr(buf), cap, asynchronous)?;
        self.note_async(&mut st, id, asynchronous);
        Ok(id)
    }

    /// Posts a receive from any rank of a communicator into `cap` bytes at `buf`: `members`
    /// are the communicator's world ranks by communicator rank, and `t` gives its id, the tag
    /// and the signature (`t.peer` and `t.comm_rank` are ignored). The first message that
    /// matches binds it to its sender; [`Engine::take_source`] then names the sender.
    ///
    /// # Safety
    /// As for [`Engine::post_recv`].
    pub(super) unsafe fn post_recv_any(
        &self,
        t: Target,
        members: Arc<[usize]>,
        buf: *mut u8,
        cap: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        let mut st = lock(&self.shared.state);
        let id = st.post_recv_any(t, members, BufPtr(buf), cap, asynchronous)?;
        self.note_async(&mut st, id, asynchronous);
        Ok(id)
    }

    /// Posts a send (`Blocking::Send`) or a receive of a direct step of a collective: the
    /// `ordinal`-th such step between this rank and the peer in the call, in program order on
    /// both sides; `span` is the buffer that holds `buf..buf+len`. A receive that waits for
    /// its message is offered to the peer, which writes the message straight into it, and a
    /// send waits in its link for that offer (see `link::Exposure`); either falls back to the
    /// usual protocols when the peer's link cannot write messages of `len` bytes.
    ///
    /// # Safety
    /// As for [`Engine::post_send`] (a send) or [`Engine::post_recv`] (a receive).
    pub(super) unsafe fn post_direct(
        &self,
        kind: Blocking,
        t: Target,
        (buf, len): (*mut u8, usize),
        span: (*mut u8, usize),
        ordinal: u32,
    ) -> Result<OpId> {
        let mut st = lock(&self.shared.state);
        match kind {
            Blocking::Send => st.post_send_as(t, BufPtr(buf), len, false, Some(ordinal)),
            Blocking::Recv => st.post_recv_direct(t, BufPtr(buf), len, span, ordinal),
        }
    }

    /// Whether any link may write messages straight into the peers' receives (direct steps):
    /// only libfabric's do.
    pub(crate) fn any_direct(&self) -> bool {
        self.shared.ofi.is_some()
    }

    /// The sizes of the messages that the link to world rank `peer` writes straight into the
    /// peer's receives (direct steps of collectives), `min..=max` bytes; `None` when it does
    /// not.
    pub(crate) fn direct_sizes(&self, peer: usize) -> Option<(usize, usize)> {
        let st = lock(&self.shared.state);
        st.links.primary(peer).and_then(Link::puts)
    }

    /// The communicator rank that the receive from any source `id` got its message from,
    /// once its result was taken (by [`Engine::wait`] or [`Engine::test`]); asked once, as
    /// the answer is then forgotten. `None` if it never matched a message.
    pub(crate) fn take_source(&self, id: OpId) -> Option<usize> {
        lock(&self.shared.state).sources.remove(&id)
    }

    /// Counts a nonblocking operation the background thread must progress (one that did
    /// not complete when it was posted).
    pub(super) fn note_async(&self, st: &mut State, id: OpId, asynchronous: bool) {
        let Some(op) = st.ops.get_mut(&id) else {
            return;
        };
        op.asynchronous = asynchronous && op.result.is_none();
        if op.asynchronous && self.shared.io.pending_async.fetch_add(1, Ordering::SeqCst) == 0 {
            self.shared.idle_cv.notify_one();
        }
    }

    /// Removes operations that will not be waited for, so that no buffer of theirs is
    /// referenced afterwards (see `State::disentangle`).
    pub(crate) fn cancel(&self, ids: &[OpId]) {
        let mut st = lock(&self.shared.state);
        for &id in ids {
            if st.take(id).is_none() && st.ops.contains_key(&id) {
                let _ = st.time_out(id);
            }
        }
    }

    /// Hands a pending nonblocking operation's buffer to the engine, which completes the
    /// operation in the background and then frees the buffer.
    pub(super) fn detach(&self, id: OpId, buffer: Vec<u8>) {
        let mut st = lock(&self.shared.state);
        if st.take(id).is_some() {
            return;
        }
        if let Some(op) = st.ops.get_mut(&id) {
            op.detached = Some(buffer);
            // The owner will never take it: stop counting it as pending for the owner.
            if op.asynchronous {
                op.asynchronous = false;
                self.shared.io.pending_async.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// How [`State::start_op`] left an operation.
enum Started {
    /// Over already (a small send written inline, or completed while it was posted): its
    /// result.
    Done(Result<usize>),
    /// Posted, not over yet.
    Posted(OpId),
}

impl State {
    /// Starts a send of `len` bytes at `buf` (`Blocking::Send`) or a receive into them, as a
    /// blocking call and a collective's step do: a small send goes inline when the peer's link
    /// takes it (`State::send_fast`, no operation), else the operation is posted and its
    /// result taken when it completed while it was posted.
    ///
    /// # Safety
    /// As for [`Engine::post_send`] and [`Engine::post_recv`].
    #[inline]
    unsafe fn start_op(
        &mut self,
        kind: Blocking,
        t: Target,
        buf: *mut u8,
        len: usize,
    ) -> Result<Started> {
        if kind == Blocking::Send && len <= FAST_PAYLOAD {
            // SAFETY: the caller's promise: `buf` holds `len` readable bytes.
            let data = unsafe { std::slice::from_raw_parts(buf, len) };
            if self.send_fast(&t, data)? {
                return Ok(Started::Done(Ok(len)));
            }
        }
        let id = match kind {
            Blocking::Send => self.post_send(t, BufPtr(buf), len, false)?,
            Blocking::Recv => self.post_recv(t, BufPtr(buf), len, false)?,
        };
        Ok(match self.take(id) {
            Some(result) => Started::Done(result),
            None => Started::Posted(id),
        })
    }

    /// A receive of a direct step (see [`Engine::post_direct`]): posted as usual, then, when
    /// it waits for its message, offered to the peer's link.
    fn post_recv_direct(
        &mut self,
        t: Target,
        buf: BufPtr,
        cap: usize,
        span: (*mut u8, usize),
        ordinal: u32,
    ) -> Result<OpId> {
        // A message held already is taken at once (the sender did not wait for an offer).
        let waits = !self.matching.has_unexpected(&t.key());
        let id = self.post_recv(t, buf, cap, false)?;
        let fits = self
            .links
            .primary(t.peer)
            .and_then(Link::puts)
            .is_some_and(|(min, max)| (min..=max).contains(&cap));
        let pending = self.ops.get(&id).is_some_and(|o| o.result.is_none());
        if waits && fits && pending {
            let e = Exposure {
                op: id,
                ptr: buf.0,
                len: cap,
                span,
                comm: t.comm,
                tag: t.tag,
                sig: t.sig,
                ordinal,
            };
            let offered = match self.links.primary_mut(t.peer) {
                Some(link) => link.expose(e),
                None => Ok(false),
            };
            if let Err(why) = offered {
                self.fail_peer(t.peer, why);
            }
        }
        Ok(id)
    }

    pub(super) fn new_op(
        &mut self,
        kind: OpKind,
        target: Target,
        buf: BufPtr,
        cap: usize,
        asynchronous: bool,
    ) -> OpId {
        let id = self.next_op;
        self.next_op += 1;
        let op = Op {
            kind,
            target,
            buf,
            cap,
            remaining: 0,
            asynchronous,
            detached: None,
            members: None,
            result: None,
        };
        self.ops.insert(id, op);
        // The operation needs its peer's links (a TCP connection is made on first use).
        if target.peer != ANY_PEER {
            self.want(target.peer);
        }
        id
    }

    /// Whether operation `kind` with `t` may start: its call and communicator were not
    /// aborted and its peer is reachable. The error names the operation.
    pub(super) fn live_peer(&self, t: &Target, kind: OpKind) -> Result<()> {
        self.peer_ready(t)
            .map_err(|e| e.with_operation(t.operation(kind)))
    }

    fn peer_ready(&self, t: &Target) -> Result<()> {
        self.calls.check(t)?;
        if t.peer == self.cfg.rank {
            return Ok(());
        }
        match self.peers.get(t.peer) {
            Some(Some(p)) => match &p.lost {
                None => Ok(()),
                Some(why) => Err(Error::peer_lost(
                    PeerRank::ranks(t.comm_rank, t.peer),
                    why.clone(),
                )),
            },
            _ => Err(Error::internal(format!("no link to world rank {}", t.peer))
                .with_peer(PeerRank::ranks(t.comm_rank, t.peer))),
        }
    }

    pub(super) fn complete(&mut self, id: OpId, result: Result<usize>) {
        let Some(op) = self.ops.get(&id) else {
            return;
        };
        if op.result.is_some() {
            return;
        }
        if result.is_err() && op.kind == OpKind::Recv && self.pulls_into(id) {
            // A failed receive (its communicator aborted or revoked, ...) still pulling: its
            // pull ends now, a split one once the sender writes nothing more into the
            // buffer, which its owner may take back as soon as this returns.
            self.abandon_pull(id);
        }
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        self.completions += 1;
        if op.detached.is_some() {
            if let Err(e) = &result {
                tracing::warn!("the {} of a dropped request failed: {e}", op.describe());
            }
            self.ops.remove(&id);
            self.timers.disarm(id);
            return;
        }
        op.result = Some(result);
    }

    /// Removes and returns the result of a completed operation.
    pub(super) fn take(&mut self, id: OpId) -> Option<Result<usize>> {
        self.ops.get(&id)?.result.as_ref()?;
        let op = self.ops.remove(&id)?;
        self.timers.disarm(id);
        if op.asynchronous {
            self.io.pending_async.fetch_sub(1, Ordering::SeqCst);
        }
        if op.members.is_some() && op.target.comm_rank != ANY_PEER {
            self.sources.insert(id, op.target.comm_rank);
        }
        op.result
    }

    /// The peers that the operations `ids` still wait for, and the operations, for stall
    /// warnings.
    pub(super) fn awaited(&self, ids: &[OpId]) -> String {
        let ops: Vec<&Op> = ids.iter().filter_map(|id| self.ops.get(id)).collect();
        let mut ranks: Vec<(usize, usize)> = ops
            .iter()
            .map(|o| (o.target.comm_rank, o.target.peer))
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        let ranks: Vec<String> = ranks
            .iter()
            .map(|&(r, w)| match r {
                ANY_PEER => rank_name(r),
                _ => format!("rank {r} (world rank {w})"),
            })
            .collect();
        let ops: Vec<String> = ops.iter().map(|o| o.describe()).collect();
        format!("{} [{}]", ranks.join(", "), ops.join("; "))
    }

    /// Gives up on `id` at its deadline and removes it (see [`State::disentangle`]).
    pub(super) fn time_out(&mut self, id: OpId) -> Error {
        let Some(op) = self.ops.get(&id) else {
            return Error::internal("timed out on an unknown operation");
        };
        let t = op.target;
        let why = match op.kind {
            OpKind::Recv => "has not sent a matching message",
            OpKind::Send => "is not receiving (a large message waits for the matching receive)",
        };
        let who = match t.comm_rank {
            ANY_PEER => "no rank has sent a matching message".to_string(),
            r => format!("rank {r} {why}"),
        };
        let err = Error::timeout(format!(
            "{} did not complete within HCOMM_TIMEOUT: {who}; it may be stuck, slow, or calling \
             something else",
            op.describe(),
        ))
        .with_operation(op.operation());
        let err = match t.comm_rank {
            ANY_PEER => err,
            r => err.with_peer(PeerRank::ranks(r, t.peer)),
        };
        self.disentangle(id);
        self.timers.disarm(id);
        let op = self.ops.remove(&id);
        if op.as_ref().is_some_and(|o| o.asynchronous) {
            self.io.pending_async.fetch_sub(1, Ordering::SeqCst);
        }
        match op.and_then(|o| o.result) {
            // Ending the receive failed its peer (a split whose sender stopped in the middle
            // of a piece, `split.rs`): that says more than the timeout.
            Some(Err(lost @ Error::PeerLost(_))) => lost,
            _ => err,
        }
    }

    /// Cuts every tie between operation `id` and the wire, so that its buffer may go: a
    /// receive leaves its queue, and data still due for it is read and dropped; a send loses
    /// its unsent frames, keeps a copy of a half-written one (the stream must stay framed),
    /// and a late CTS for it is ignored. The peer is told nothing here: the collective layer
    /// sends aborts.
    pub(super) fn disentangle(&mut self, id: OpId) {
        let Some(op) = self.ops.get(&id) else { return };
        let (t, kind) = (op.target, op.kind);
        self.links.forget(t.peer, id, &self.ops);
        match kind {
            OpKind::Recv => {
                self.matching.withdraw(&t.key(), id);
                self.rndv.abandon_recv(id);
                self.abandon_pull(id);
            }
            OpKind::Send => self.rndv.abandon_send(id),
        }
    }
}
