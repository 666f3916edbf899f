//! Tag matching: posted receives against arrived messages, by (communicator, peer, tag) in
//! order, and the messages no receive has claimed yet.
//!
//! A receive from any source waits in its own queue per (communicator, tag). An arriving
//! message goes to whichever of the specific and the wildcard queue's first receive was
//! posted first (MPI's rule); a wildcard posted while messages are held takes the one that
//! arrived first of those from any member. Matching binds the wildcard to the sender: from
//! then on it is an ordinary receive from that peer (rendezvous, pull, push).

use std::hash::Hash;
use std::sync::Arc;

use crate::error::{Error, ErrorInfo, PeerRank, Result};
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

use super::requests::{op_slice, truncated};
use super::{
    BufPtr, MatchKey, OpId, OpKind, State, Target, Unexpected, UnexpectedKind, ANY_PEER, DISCARDED,
};

/// Takes the first entry of a matching queue, dropping the queue when it empties (the maps
/// would otherwise keep a key for every tag ever used).
pub(super) fn pop_key<K: Hash + Eq, V>(map: &mut HashMap<K, VecDeque<V>>, key: &K) -> Option<V> {
    let q = map.get_mut(key)?;
    let v = q.pop_front();
    if q.is_empty() {
        map.remove(key);
    }
    v
}

/// Removes `v` from a matching queue, dropping the queue when it empties.
pub(super) fn remove_from<K: Hash + Eq, V: PartialEq>(
    map: &mut HashMap<K, VecDeque<V>>,
    key: &K,
    v: &V,
) {
    if let Some(q) = map.get_mut(key) {
        q.retain(|x| x != v);
        if q.is_empty() {
            map.remove(key);
        }
    }
}

impl State {
    /// A message to this rank itself is copied at once, like a buffered send.
    pub(super) fn send_to_self(&mut self, id: OpId, t: Target, buf: BufPtr, len: usize) {
        let data = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: the send is live, so `buf` is valid for reads of `len` bytes (see
            // `post_send`).
            unsafe { std::slice::from_raw_parts(buf.0.cast_const(), len) }.to_vec()
        };
        let key = MatchKey {
            comm: t.comm,
            peer: t.peer,
            tag: t.tag,
        };
        let kind = UnexpectedKind::Eager {
            data,
            complete: true,
        };
        match self.match_posted(&key) {
            Some(rid) => {
                let uid = self.store_unexpected(key.peer, t.sig, kind);
                self.deliver_unexpected(uid, rid);
            }
            None => {
                self.push_unexpected(key, t.sig, kind);
            }
        }
        self.complete(id, Ok(len));
    }

    /// Keeps a message no receive has claimed yet; returns its id.
    pub(super) fn store_unexpected(
        &mut self,
        peer: usize,
        sig: [u64; 2],
        kind: UnexpectedKind,
    ) -> u64 {
        let uid = self.next_umsg;
        self.next_umsg += 1;
        self.umsgs.insert(
            uid,
            Unexpected {
                peer,
                sig,
                kind,
                claimed_by: None,
            },
        );
        uid
    }

    /// Keeps an unexpected message and queues it for matching under `key`.
    pub(super) fn push_unexpected(
        &mut self,
        key: MatchKey,
        sig: [u64; 2],
        kind: UnexpectedKind,
    ) -> u64 {
        let uid = self.store_unexpected(key.peer, sig, kind);
        self.unexpected.entry(key).or_default().push_back(uid);
        uid
    }

    pub(super) fn post_recv(
        &mut self,
        t: Target,
        buf: BufPtr,
        cap: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        let key = MatchKey {
            comm: t.comm,
            peer: t.peer,
            tag: t.tag,
        };
        let queued = pop_key(&mut self.unexpected, &key);
        if queued.is_none() || self.aborted.contains_key(&(t.comm, t.tag)) {
            self.live_peer(&t)?;
        }
        let id = self.new_op(OpKind::Recv, t, buf, cap, asynchronous);
        match queued {
            None => self.posted.entry(key).or_default().push_back(id),
            Some(uid) => self.claim_unexpected(uid, id),
        }
        Ok(id)
    }

    /// The posted receive that a message under `key` goes to, removed from its queue: the
    /// first posted of the specific queue's head and the wildcard queue's head. A wildcard is
    /// bound to `key.peer`.
    pub(super) fn match_posted(&mut self, key: &MatchKey) -> Option<OpId> {
        // Most programs never post a wildcard: one emptiness test for them.
        if self.posted_any.is_empty() {
            return pop_key(&mut self.posted, key);
        }
        let any_key = (key.comm, key.tag);
        let specific = self.posted.get(key).and_then(|q| q.front().copied());
        let wild = self
            .posted_any
            .get(&any_key)
            .and_then(|q| q.front().copied());
        match (specific, wild) {
            (Some(s), Some(w)) if s < w => pop_key(&mut self.posted, key),
            (_, Some(_)) => {
                let w = pop_key(&mut self.posted_any, &any_key)?;
                self.bind(w, key.peer);
                Some(w)
            }
            (s, None) => s.and_then(|_| pop_key(&mut self.posted, key)),
        }
    }

    /// Binds receive-from-any-source `id` to world rank `peer`, its message's sender.
    pub(super) fn bind(&mut self, id: OpId, peer: usize) {
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        op.target.peer = peer;
        op.target.comm_rank = op
            .members
            .as_ref()
            .and_then(|m| m.iter().position(|&w| w == peer))
            .unwrap_or(ANY_PEER);
    }

    /// The held message of `(comm, tag)` from any of `members` that arrived first.
    fn first_unexpected(&self, comm: u64, tag: u32, members: &[usize]) -> Option<(MatchKey, u64)> {
        if self.unexpected.is_empty() {
            return None;
        }
        members
            .iter()
            .map(|&peer| MatchKey { comm, peer, tag })
            .filter_map(|k| Some((k, *self.unexpected.get(&k)?.front()?)))
            .min_by_key(|&(_, uid)| uid)
    }

    /// Why a receive from any source of `t` (not matched yet), among `members`, cannot
    /// complete: its communicator or call was aborted, a member was lost (it may have been
    /// the sender: ULFM's rule), or every other member has finalized.
    pub(super) fn live_any(&self, t: &Target, members: &[usize]) -> Result<()> {
        if let Some(e) = self.aborted_comm(t.comm) {
            return Err(e);
        }
        if let Some(&(peer, sig, mismatch, lost)) = self.aborted.get(&(t.comm, t.tag)) {
            return Err(self.abandoned(t, peer, sig, mismatch, lost));
        }
        let mut others = 0;
        let mut gone = 0;
        for (r, &w) in members.iter().enumerate() {
            if w == self.cfg.rank {
                continue;
            }
            others += 1;
            let Some(Some(p)) = self.peers.get(w) else {
                return Err(Error::internal(format!("no link to world rank {w}")));
            };
            if let Some(why) = &p.lost {
                if !p.closed {
                    return Err(Error::peer_lost(
                        PeerRank::ranks(r, w),
                        format!(
                            "recv from any rank (tag {}) failed: rank {r} of the communicator is lost, \
                             and it may have been the sender: {why}",
                            t.tag
                        ),
                    ));
                }
                gone += 1;
            }
        }
        if others > 0 && gone == others {
            return Err(Error::PeerLost(ErrorInfo::new(format!(
                "recv from any rank (tag {}) failed: every other rank of the communicator has \
                 finalized, so none can send",
                t.tag
            ))));
        }
        Ok(())
    }

    /// Posts a receive from any member of `members` (world ranks, by communicator rank) of
    /// communicator `t.comm` with tag `t.tag`.
    pub(super) fn post_recv_any(
        &mut self,
        mut t: Target,
        members: Arc<[usize]>,
        buf: BufPtr,
        cap: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        t.peer = ANY_PEER;
        t.comm_rank = ANY_PEER;
        let queued = self.first_unexpected(t.comm, t.tag, &members);
        if queued.is_none() || self.aborted.contains_key(&(t.comm, t.tag)) {
            self.live_any(&t, &members)?;
        }
        let id = self.new_op(OpKind::Recv, t, buf, cap, asynchronous);
        if let Some(op) = self.ops.get_mut(&id) {
            op.members = Some(members);
        }
        match queued {
            None => self
                .posted_any
                .entry((t.comm, t.tag))
                .or_default()
                .push_back(id),
            Some((key, uid)) => {
                remove_from(&mut self.unexpected, &key, &uid);
                self.bind(id, key.peer);
                self.claim_unexpected(uid, id);
            }
        }
        Ok(id)
    }

    /// World rank `peer` is gone (`closed`: it finalized): fails the receives from any source
    /// not matched yet that it may have been the sender for (see [`State::live_any`]).
    pub(super) fn fail_wildcards(&mut self, peer: usize) {
        if self.posted_any.is_empty() {
            return;
        }
        let waiting: Vec<OpId> = self.posted_any.values().flatten().copied().collect();
        for id in waiting {
            let Some(op) = self.ops.get(&id) else {
                continue;
            };
            let (t, members) = (op.target, op.members.clone().unwrap_or_default());
            if !members.contains(&peer) {
                continue;
            }
            if let Err(e) = self.live_any(&t, &members) {
                remove_from(&mut self.posted_any, &(t.comm, t.tag), &id);
                self.complete(id, Err(e));
            }
        }
    }

    /// Matches receive `id` with the unexpected message `uid`.
    pub(super) fn claim_unexpected(&mut self, uid: u64, id: OpId) {
        let Some(u) = self.umsgs.get_mut(&uid) else {
            return;
        };
        let (peer, sig) = (u.peer, u.sig);
        if self.ops.get(&id).is_some_and(|op| op.target.sig != sig) {
            let rts = match u.kind {
                UnexpectedKind::Rts { msg_id, .. } => Some(msg_id),
                UnexpectedKind::Eager { complete, .. } => {
                    // Drop the data as it arrives; no receive will ever take it.
                    if complete {
                        self.umsgs.remove(&uid);
                    } else {
                        u.claimed_by = Some(DISCARDED);
                    }
                    None
                }
            };
            if let Some(msg_id) = rts {
                self.umsgs.remove(&uid);
                self.refuse_rts(peer, msg_id);
            }
            self.mismatch(id, sig);
            return;
        }
        match u.kind {
            UnexpectedKind::Eager { complete: true, .. } => self.deliver_unexpected(uid, id),
            UnexpectedKind::Eager {
                complete: false, ..
            } => {
                u.claimed_by = Some(id);
            }
            UnexpectedKind::Rts { msg_id, len, pull } => {
                self.umsgs.remove(&uid);
                self.match_rts(id, msg_id, len, pull);
            }
        }
    }

    /// Copies a fully arrived unexpected message into receive `id` and completes it.
    pub(super) fn deliver_unexpected(&mut self, uid: u64, id: OpId) {
        let Some(Unexpected {
            kind: UnexpectedKind::Eager { data, .. },
            ..
        }) = self.umsgs.remove(&uid)
        else {
            return;
        };
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        let result = if data.len() > op.cap {
            Err(truncated(op, data.len()))
        } else {
            if let Some(dst) = op_slice(op, 0, data.len()) {
                dst.copy_from_slice(&data);
            }
            Ok(data.len())
        };
        self.complete(id, result);
    }
}
