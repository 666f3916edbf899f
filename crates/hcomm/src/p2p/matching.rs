//! Tag matching: posted receives against arrived messages, by (communicator, peer, tag) in
//! order, and the messages no receive has claimed yet.

use crate::error::Result;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

use super::requests::{op_slice, truncated};
use super::{BufPtr, MatchKey, OpId, OpKind, State, Target, Unexpected, UnexpectedKind, DISCARDED};

/// Takes the first entry of a matching queue, dropping the queue when it empties (the maps
/// would otherwise keep a key for every tag ever used).
pub(super) fn pop_key<V>(map: &mut HashMap<MatchKey, VecDeque<V>>, key: &MatchKey) -> Option<V> {
    let q = map.get_mut(key)?;
    let v = q.pop_front();
    if q.is_empty() {
        map.remove(key);
    }
    v
}

/// Removes `v` from a matching queue, dropping the queue when it empties.
pub(super) fn remove_from<V: PartialEq>(
    map: &mut HashMap<MatchKey, VecDeque<V>>,
    key: &MatchKey,
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
        match pop_key(&mut self.posted, &key) {
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
