//! Tag matching, sans I/O: posted receives against arrived messages, by (communicator, peer,
//! tag) in order, and the messages no receive has claimed yet.
//!
//! A receive from any source waits in its own queue per (communicator, tag). An arriving
//! message goes to whichever of the specific and the wildcard queue's first receive was
//! posted first (MPI's rule); a wildcard posted while messages are held takes the one that
//! arrived first of those from any member. Matching binds the wildcard to the sender: from
//! then on it is an ordinary receive from that peer (rendezvous, pull, push).
//!
//! [`Matching`] owns its data and touches no link, buffer or clock: the engine tells it what
//! was posted and what arrived, and it answers what to do — which receive a message goes to
//! (the engine then lands the payload straight in that receive's buffer), that it is held as
//! unexpected, that the receive is truncated or mismatched. Its unit tests drive it alone.

use crate::error::{Error, PeerRank, Result};
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::hash::Hash;
use std::sync::Arc;

use super::requests::{op_slice, truncated};
use super::{BufPtr, MatchKey, OpId, OpKind, State, Target, ANY_PEER};

/// A posted receive, as matching sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recv {
    /// The operation.
    pub id: OpId,
    /// Signature of its call: a message with another one is a mismatch.
    pub sig: [u64; 2],
    /// Capacity of its buffer: a longer message truncates it.
    pub cap: usize,
}

/// What arrived: the header of an eager message (its payload follows) or of a rendezvous
/// request to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arrival {
    /// An eager message of `len` bytes.
    Eager { len: usize },
    /// A request to send message `msg_id` of `len` bytes; `pull` is the sender's buffer
    /// address when the receiver may copy the data out of it itself.
    Rts {
        msg_id: u64,
        len: usize,
        pull: Option<u64>,
    },
}

/// What became of an arrival, or of a posted receive.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Matched {
    /// Receive `id` takes the eager message: its `len` payload bytes go straight into its
    /// buffer, and it completes when they are in.
    Eager { id: OpId, len: usize },
    /// Receive `id` takes the rendezvous `msg_id` of `len` bytes (it may be truncated: the
    /// rendezvous decides).
    Rts {
        id: OpId,
        msg_id: u64,
        len: usize,
        pull: Option<u64>,
    },
    /// Receive `id` met an eager message longer than its buffer: it fails, and the payload
    /// (`len` bytes) is dropped.
    Truncated { id: OpId, len: usize },
    /// Receive `id` met a message of another call (`theirs`): it fails; a rendezvous
    /// `refuse` must be refused. An eager payload still due is dropped.
    Mismatch {
        id: OpId,
        theirs: [u64; 2],
        refuse: Option<u64>,
    },
    /// No receive wants the message: held as unexpected message `uid`, whose payload (if
    /// any) lands in its own buffer.
    Held { uid: u64 },
    /// No receive wants the message and it belongs to a call this rank made differently
    /// (the caller's judgement): not kept; an eager payload is dropped.
    Foreign,
    /// The receive found a whole unexpected message: the engine copies `data` into it and
    /// completes it.
    Deliver { id: OpId, data: Vec<u8> },
    /// The receive claimed an eager message whose payload is still arriving: it completes
    /// when [`Matching::payload_done`] says so.
    Claimed { id: OpId },
    /// The receive waits in its queue.
    Queued,
}

/// Where an unexpected message stands.
#[derive(Debug)]
enum Held {
    /// An eager message: its payload, and whether all of it arrived.
    Eager { data: Vec<u8>, complete: bool },
    /// A rendezvous request to send.
    Rts { msg_id: u64, pull: Option<u64> },
}

/// Who takes an eager message whose payload is still arriving.
#[derive(Debug, Clone, Copy)]
enum Claim {
    /// Nobody yet: it waits in its queue.
    Open,
    /// This receive, once the payload is in.
    By(Recv),
    /// Nobody: its payload is dropped as it arrives.
    Discard,
}

#[derive(Debug)]
struct Unexpected {
    /// World rank of the sender.
    peer: usize,
    /// Signature the sender gave the message.
    sig: [u64; 2],
    /// Message length.
    len: usize,
    held: Held,
    claim: Claim,
}

/// An unexpected message that a call refuses (see [`Matching::strangers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stranger {
    /// World rank of its sender.
    pub peer: usize,
    /// Its signature.
    pub sig: [u64; 2],
    /// The rendezvous to refuse, when it is one.
    pub rts: Option<u64>,
}

/// Posted receives and unexpected messages of one engine.
#[derive(Debug)]
pub(super) struct Matching {
    posted: HashMap<MatchKey, VecDeque<Recv>>,
    /// Receives from any source not matched yet, by (communicator, tag), in posting order.
    /// Operation ids grow as operations are posted, so the lower id of the heads of a
    /// specific and a wildcard queue is the receive posted first.
    posted_any: HashMap<(u64, u32), VecDeque<Recv>>,
    unexpected: HashMap<MatchKey, VecDeque<u64>>,
    /// Emptied queues of receives and of unexpected messages, for reuse.
    spare_recvs: Vec<VecDeque<Recv>>,
    spare_uids: Vec<VecDeque<u64>>,
    umsgs: HashMap<u64, Unexpected>,
    /// The id of the next unexpected message: ids count arrivals across all peers, so a
    /// receive from any source takes the held message with the lowest.
    next_umsg: u64,
    /// The receive from any source the last call bound, and its sender.
    bound: Option<(OpId, usize)>,
}

impl Default for Matching {
    fn default() -> Matching {
        Matching {
            posted: HashMap::default(),
            posted_any: HashMap::default(),
            unexpected: HashMap::default(),
            spare_recvs: Vec::new(),
            spare_uids: Vec::new(),
            umsgs: HashMap::default(),
            next_umsg: 1,
            bound: None,
        }
    }
}

/// Emptied matching queues kept for reuse, per kind of queue: a message whose receive waits
/// (or the reverse) would otherwise allocate a queue and free it again.
const SPARE_QUEUES: usize = 8;
/// Largest capacity of a queue kept for reuse (a queue that once held many entries is freed).
const SPARE_CAPACITY: usize = 64;

/// Takes the first entry of a matching queue, dropping the queue when it empties (the maps
/// would otherwise keep a key for every tag ever used) into `spare`.
fn pop_key<K: Hash + Eq, V>(
    map: &mut HashMap<K, VecDeque<V>>,
    spare: &mut Vec<VecDeque<V>>,
    key: &K,
) -> Option<V> {
    let q = map.get_mut(key)?;
    let v = q.pop_front();
    if q.is_empty() {
        retire(map.remove(key), spare);
    }
    v
}

/// Removes the entries `gone` selects from a matching queue, dropping the queue when it
/// empties into `spare`.
fn remove_from<K: Hash + Eq, V>(
    map: &mut HashMap<K, VecDeque<V>>,
    spare: &mut Vec<VecDeque<V>>,
    key: &K,
    gone: impl Fn(&V) -> bool,
) {
    if let Some(q) = map.get_mut(key) {
        q.retain(|x| !gone(x));
        if q.is_empty() {
            retire(map.remove(key), spare);
        }
    }
}

/// Keeps an emptied queue for reuse (a few small ones).
fn retire<V>(q: Option<VecDeque<V>>, spare: &mut Vec<VecDeque<V>>) {
    if let Some(q) = q.filter(|q| spare.len() < SPARE_QUEUES && q.capacity() <= SPARE_CAPACITY) {
        spare.push(q);
    }
}

/// Appends `v` to the matching queue of `key`, made from a spare one when it has none.
fn push_key<K: Hash + Eq, V>(
    map: &mut HashMap<K, VecDeque<V>>,
    spare: &mut Vec<VecDeque<V>>,
    key: K,
    v: V,
) {
    map.entry(key)
        .or_insert_with(|| spare.pop().unwrap_or_default())
        .push_back(v);
}

impl Matching {
    /// Posts receive `r` for `key`: it takes the oldest message held for `key`, or waits.
    pub(super) fn post(&mut self, key: MatchKey, r: Recv) -> Matched {
        match pop_key(&mut self.unexpected, &mut self.spare_uids, &key) {
            None => {
                push_key(&mut self.posted, &mut self.spare_recvs, key, r);
                Matched::Queued
            }
            Some(uid) => self.claim(uid, r),
        }
    }

    /// Whether a message held for `key` waits (a receive posted now would take it).
    pub(super) fn has_unexpected(&self, key: &MatchKey) -> bool {
        self.unexpected.contains_key(key)
    }

    /// Whether nothing is posted (specific or from any source) or held for `key`: the next
    /// message for it would go to the next receive.
    pub(super) fn idle(&self, key: &MatchKey) -> bool {
        !self.posted.contains_key(key)
            && (self.posted_any.is_empty() || !self.posted_any.contains_key(&(key.comm, key.tag)))
            && !self.unexpected.contains_key(key)
    }
    /// The posted receive that a message under `key` goes to, taken off its queue: the first
    /// posted of the specific queue's head and the wildcard queue's head (operation ids grow
    /// as receives are posted). A wildcard taken is bound to `key.peer` (see
    /// [`Matching::take_bound`]).
    fn take_posted(&mut self, key: &MatchKey) -> Option<Recv> {
        // Most programs never post a wildcard: one emptiness test for them.
        if self.posted_any.is_empty() {
            return pop_key(&mut self.posted, &mut self.spare_recvs, key);
        }
        let any_key = (key.comm, key.tag);
        let specific = self.posted.get(key).and_then(|q| q.front().map(|r| r.id));
        let wild = self
            .posted_any
            .get(&any_key)
            .and_then(|q| q.front().map(|r| r.id));
        match (specific, wild) {
            (Some(s), Some(w)) if s < w => pop_key(&mut self.posted, &mut self.spare_recvs, key),
            (_, Some(_)) => {
                let r = pop_key(&mut self.posted_any, &mut self.spare_recvs, &any_key)?;
                self.bound = Some((r.id, key.peer));
                Some(r)
            }
            (_, None) => pop_key(&mut self.posted, &mut self.spare_recvs, key),
        }
    }

    /// The receive from any source that the last call matched, and the world rank it is now
    /// bound to: the engine binds the operation before it carries out the answer.
    pub(super) fn take_bound(&mut self) -> Option<(OpId, usize)> {
        self.bound.take()
    }

    /// The held message of `(comm, tag)` from any of world ranks `members` that arrived first.
    fn first_held(&self, comm: u64, tag: u32, members: &[usize]) -> Option<(MatchKey, u64)> {
        if self.unexpected.is_empty() {
            return None;
        }
        members
            .iter()
            .map(|&peer| MatchKey { comm, peer, tag })
            .filter_map(|k| Some((k, *self.unexpected.get(&k)?.front()?)))
            .min_by_key(|&(_, uid)| uid)
    }

    /// Whether a message of `(comm, tag)` from any of `members` is held.
    pub(super) fn has_unexpected_any(&self, comm: u64, tag: u32, members: &[usize]) -> bool {
        self.first_held(comm, tag, members).is_some()
    }

    /// Posts receive `r` from any of world ranks `members` for `(comm, tag)`: it takes the
    /// held message of theirs that arrived first (and is bound to its sender), or waits in
    /// the wildcard queue, matched in posting order with the specific receives.
    pub(super) fn post_any(&mut self, comm: u64, tag: u32, members: &[usize], r: Recv) -> Matched {
        match self.first_held(comm, tag, members) {
            None => {
                push_key(&mut self.posted_any, &mut self.spare_recvs, (comm, tag), r);
                Matched::Queued
            }
            Some((key, uid)) => {
                remove_from(&mut self.unexpected, &mut self.spare_uids, &key, |&u| {
                    u == uid
                });
                self.bound = Some((r.id, key.peer));
                self.claim(uid, r)
            }
        }
    }

    /// The receives from any source not matched yet.
    pub(super) fn waiting_any(&self) -> Vec<OpId> {
        self.posted_any.values().flatten().map(|r| r.id).collect()
    }

    /// A message for `key` with signature `sig` arrived. `foreign` is asked only when no
    /// receive is posted: whether the message belongs to a call this rank made differently.
    pub(super) fn arrive(
        &mut self,
        key: MatchKey,
        sig: [u64; 2],
        what: Arrival,
        foreign: impl FnOnce() -> bool,
    ) -> Matched {
        match self.take_posted(&key) {
            Some(r) if r.sig != sig => Matched::Mismatch {
                id: r.id,
                theirs: sig,
                refuse: match what {
                    Arrival::Rts { msg_id, .. } => Some(msg_id),
                    Arrival::Eager { .. } => None,
                },
            },
            Some(r) => match what {
                Arrival::Eager { len } if len > r.cap => Matched::Truncated { id: r.id, len },
                Arrival::Eager { len } => Matched::Eager { id: r.id, len },
                Arrival::Rts { msg_id, len, pull } => Matched::Rts {
                    id: r.id,
                    msg_id,
                    len,
                    pull,
                },
            },
            None if foreign() => Matched::Foreign,
            None => {
                let (len, held) = match what {
                    Arrival::Eager { len } => (
                        len,
                        Held::Eager {
                            data: vec![0u8; len],
                            complete: false,
                        },
                    ),
                    Arrival::Rts { msg_id, len, pull } => (len, Held::Rts { msg_id, pull }),
                };
                let uid = self.hold(key, sig, len, held);
                Matched::Held { uid }
            }
        }
    }

    /// A whole message for `key` that is already in memory (a send to this rank itself).
    pub(super) fn arrive_whole(&mut self, key: MatchKey, sig: [u64; 2], data: Vec<u8>) -> Matched {
        let len = data.len();
        let held = Held::Eager {
            data,
            complete: true,
        };
        let uid = self.hold(key, sig, len, held);
        match self.take_posted(&key) {
            Some(r) => {
                remove_from(&mut self.unexpected, &mut self.spare_uids, &key, |&u| {
                    u == uid
                });
                self.claim(uid, r)
            }
            None => Matched::Held { uid },
        }
    }

    /// Keeps a message and queues it for matching under `key`.
    fn hold(&mut self, key: MatchKey, sig: [u64; 2], len: usize, held: Held) -> u64 {
        let uid = self.next_umsg;
        self.next_umsg += 1;
        let u = Unexpected {
            peer: key.peer,
            sig,
            len,
            held,
            claim: Claim::Open,
        };
        self.umsgs.insert(uid, u);
        push_key(&mut self.unexpected, &mut self.spare_uids, key, uid);
        uid
    }

    /// Matches receive `r` with the unexpected message `uid`, already off its queue.
    fn claim(&mut self, uid: u64, r: Recv) -> Matched {
        let Some(u) = self.umsgs.get_mut(&uid) else {
            return Matched::Queued;
        };
        if u.sig != r.sig {
            let theirs = u.sig;
            let refuse = match u.held {
                Held::Rts { msg_id, .. } => Some(msg_id),
                Held::Eager {
                    complete: false, ..
                } => {
                    // Drop the data as it arrives; no receive will ever take it.
                    u.claim = Claim::Discard;
                    return Matched::Mismatch {
                        id: r.id,
                        theirs,
                        refuse: None,
                    };
                }
                Held::Eager { complete: true, .. } => None,
            };
            self.umsgs.remove(&uid);
            return Matched::Mismatch {
                id: r.id,
                theirs,
                refuse,
            };
        }
        match u.held {
            Held::Eager { complete: true, .. } => self.deliver(uid, r),
            Held::Eager {
                complete: false, ..
            } => {
                u.claim = Claim::By(r);
                Matched::Claimed { id: r.id }
            }
            Held::Rts { msg_id, pull } => {
                let len = u.len;
                self.umsgs.remove(&uid);
                Matched::Rts {
                    id: r.id,
                    msg_id,
                    len,
                    pull,
                }
            }
        }
    }

    /// Hands the whole unexpected message `uid` to receive `r`.
    fn deliver(&mut self, uid: u64, r: Recv) -> Matched {
        match self.umsgs.remove(&uid) {
            Some(Unexpected { len, .. }) if len > r.cap => Matched::Truncated { id: r.id, len },
            Some(Unexpected {
                held: Held::Eager { data, .. },
                ..
            }) => Matched::Deliver { id: r.id, data },
            _ => Matched::Queued,
        }
    }

    /// The bytes `done..done + len` of unexpected message `uid`'s payload buffer, where the
    /// engine lands what arrives.
    pub(super) fn payload(&mut self, uid: u64, done: usize, len: usize) -> Option<&mut [u8]> {
        match &mut self.umsgs.get_mut(&uid)?.held {
            Held::Eager { data, .. } => data.get_mut(done..done + len),
            Held::Rts { .. } => None,
        }
    }

    /// All the payload of unexpected message `uid` arrived: what becomes of the receive that
    /// claimed it meanwhile, if one did.
    pub(super) fn payload_done(&mut self, uid: u64) -> Option<Matched> {
        let u = self.umsgs.get_mut(&uid)?;
        if let Held::Eager { complete, .. } = &mut u.held {
            *complete = true;
        }
        match u.claim {
            Claim::Open => None,
            Claim::By(r) => Some(self.deliver(uid, r)),
            Claim::Discard => {
                self.umsgs.remove(&uid);
                None
            }
        }
    }

    /// Takes receive `id` back (timed out, cancelled, failed): it leaves its queue, and the
    /// payload of a message it claimed is dropped as it arrives.
    pub(super) fn withdraw(&mut self, key: &MatchKey, id: OpId) {
        remove_from(&mut self.posted, &mut self.spare_recvs, key, |r| r.id == id);
        remove_from(
            &mut self.posted_any,
            &mut self.spare_recvs,
            &(key.comm, key.tag),
            |r| r.id == id,
        );
        for u in self.umsgs.values_mut() {
            if matches!(u.claim, Claim::By(r) if r.id == id) {
                u.claim = Claim::Discard;
            }
        }
    }

    /// World rank `peer` is lost: receives from it leave their queues (the engine fails
    /// them), and its messages that had not arrived whole are forgotten; whole ones stay
    /// receivable.
    pub(super) fn peer_lost(&mut self, peer: usize) {
        self.posted.retain(|k, _| k.peer != peer);
        let partial = |u: &Unexpected| {
            u.peer == peer
                && matches!(
                    u.held,
                    Held::Eager {
                        complete: false,
                        ..
                    } | Held::Rts { .. }
                )
        };
        self.umsgs.retain(|_, u| !partial(u));
        let umsgs = &self.umsgs;
        for (key, q) in self.unexpected.iter_mut() {
            if key.peer == peer {
                q.retain(|uid| umsgs.contains_key(uid));
            }
        }
        self.unexpected.retain(|_, q| !q.is_empty());
    }

    /// The messages held for call `(comm, tag)` from any of world ranks `0..peers` that carry
    /// another signature than `sig`, taken away (the call fails; a rendezvous among them is
    /// to be refused), in the order of their senders. Every call asks: costs nothing while
    /// nothing is held, and then the fewer of a look-up per rank and a look at each held key
    /// (a large job's call does not hash every rank's key because one message came early).
    pub(super) fn strangers(
        &mut self,
        comm: u64,
        tag: u32,
        sig: [u64; 2],
        peers: usize,
    ) -> Vec<Stranger> {
        if self.unexpected.is_empty() {
            return Vec::new();
        }
        // On the stack for the usual few senders: no allocation per call.
        let senders: SmallVec<[usize; 8]> = if self.unexpected.len() < peers {
            let mut held: SmallVec<[usize; 8]> = self
                .unexpected
                .keys()
                .filter(|k| k.comm == comm && k.tag == tag && k.peer < peers)
                .map(|k| k.peer)
                .collect();
            held.sort_unstable();
            held
        } else {
            (0..peers)
                .filter(|&peer| self.unexpected.contains_key(&MatchKey { comm, peer, tag }))
                .collect()
        };
        let mut found = Vec::new();
        for peer in senders {
            let key = MatchKey { comm, peer, tag };
            let Some(q) = self.unexpected.get(&key) else {
                continue;
            };
            let umsgs = &self.umsgs;
            let theirs: Vec<u64> = q
                .iter()
                .copied()
                .filter(|uid| umsgs.get(uid).is_some_and(|u| u.sig != sig))
                .collect();
            for uid in theirs {
                remove_from(&mut self.unexpected, &mut self.spare_uids, &key, |&u| {
                    u == uid
                });
                if let Some(u) = self.umsgs.remove(&uid) {
                    let rts = match u.held {
                        Held::Rts { msg_id, .. } => Some(msg_id),
                        Held::Eager { .. } => None,
                    };
                    found.push(Stranger {
                        peer,
                        sig: u.sig,
                        rts,
                    });
                }
            }
        }
        found
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
        let matched = self.matching.arrive_whole(t.key(), t.sig, data);
        self.bind_matched();
        self.matched(matched);
        self.complete(id, Ok(len));
    }

    pub(super) fn post_recv(
        &mut self,
        t: Target,
        buf: BufPtr,
        cap: usize,
        asynchronous: bool,
    ) -> Result<OpId> {
        let key = t.key();
        if !self.matching.has_unexpected(&key) || self.calls.is_aborted(t.comm, t.tag) {
            self.live_peer(&t, OpKind::Recv)?;
        }
        let id = self.new_op(OpKind::Recv, t, buf, cap, asynchronous);
        let r = Recv {
            id,
            sig: t.sig,
            cap,
        };
        let matched = self.matching.post(key, r);
        self.matched(matched);
        Ok(id)
    }

    /// Binds the receive from any source that matching just matched, if it did, to its
    /// sender.
    pub(super) fn bind_matched(&mut self) {
        if let Some((id, peer)) = self.matching.take_bound() {
            self.bind(id, peer);
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

    /// Why a receive from any source of `t` (not matched yet), among `members`, cannot
    /// complete: its communicator or call was aborted, a member was lost (it may have been
    /// the sender: ULFM's rule), or every other member has finalized.
    pub(super) fn live_any(&self, t: &Target, members: &[usize]) -> Result<()> {
        self.any_ready(t, members)
            .map_err(|e| e.with_operation(t.operation(OpKind::Recv)))
    }

    fn any_ready(&self, t: &Target, members: &[usize]) -> Result<()> {
        self.calls.check(t)?;
        let mut others = 0;
        let mut gone = 0;
        for (r, &w) in members.iter().enumerate() {
            if w == self.cfg.rank {
                continue;
            }
            others += 1;
            let Some(Some(p)) = self.peers.get(w) else {
                return Err(Error::internal(format!("no link to world rank {w}"))
                    .with_peer(PeerRank::ranks(r, w)));
            };
            if let Some(why) = &p.lost {
                if !p.closed {
                    return Err(Error::peer_lost(
                        PeerRank::ranks(r, w),
                        format!(
                            "recv from any rank (tag {}) failed: rank {r} of the communicator \
                             is lost, and it may have been the sender: {why}",
                            t.tag
                        ),
                    ));
                }
                gone += 1;
            }
        }
        if others > 0 && gone == others {
            return Err(Error::peer_lost(
                PeerRank::default(),
                format!(
                    "recv from any rank (tag {}) failed: every other rank of the communicator \
                     has finalized, so none can send",
                    t.tag
                ),
            ));
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
        if !self.matching.has_unexpected_any(t.comm, t.tag, &members)
            || self.calls.is_aborted(t.comm, t.tag)
        {
            self.live_any(&t, &members)?;
        }
        let id = self.new_op(OpKind::Recv, t, buf, cap, asynchronous);
        if let Some(op) = self.ops.get_mut(&id) {
            op.members = Some(Arc::clone(&members));
        }
        // Any member may send: each is used (its TCP connection is made now).
        for &w in members.iter() {
            self.want(w);
        }
        let r = Recv {
            id,
            sig: t.sig,
            cap,
        };
        let matched = self.matching.post_any(t.comm, t.tag, &members, r);
        self.bind_matched();
        self.matched(matched);
        Ok(id)
    }

    /// World rank `peer` is gone (`closed`: it finalized): fails the receives from any source
    /// not matched yet that it may have been the sender for (see [`State::live_any`]).
    pub(super) fn fail_wildcards(&mut self, peer: usize) {
        for id in self.matching.waiting_any() {
            let Some(op) = self.ops.get(&id) else {
                continue;
            };
            let (t, members) = (op.target, op.members.clone().unwrap_or_default());
            if !members.contains(&peer) {
                continue;
            }
            if let Err(e) = self.live_any(&t, &members) {
                self.matching.withdraw(&t.key(), id);
                self.complete(id, Err(e));
            }
        }
    }

    /// Carries out what matching decided (where an arriving payload goes is
    /// `dispatch::payload_dest`'s answer).
    pub(super) fn matched(&mut self, m: Matched) {
        match m {
            Matched::Queued
            | Matched::Claimed { .. }
            | Matched::Held { .. }
            | Matched::Foreign
            | Matched::Eager { .. } => {}
            Matched::Rts {
                id,
                msg_id,
                len,
                pull,
            } => self.match_rts(id, msg_id, len, pull),
            Matched::Truncated { id, len } => {
                if let Some(op) = self.ops.get(&id) {
                    let err = truncated(op, len);
                    self.complete(id, Err(err));
                }
            }
            Matched::Mismatch { id, theirs, refuse } => {
                if let (Some(msg_id), Some(op)) = (refuse, self.ops.get(&id)) {
                    let peer = op.target.peer;
                    self.refuse_rts(peer, msg_id);
                }
                self.mismatch(id, theirs);
            }
            Matched::Deliver { id, data } => {
                if let Some(op) = self.ops.get_mut(&id) {
                    if let Some(dst) = op_slice(op, 0, data.len()) {
                        dst.copy_from_slice(&data);
                    }
                    self.complete(id, Ok(data.len()));
                }
            }
        }
    }
}
