//! Tag matching, sans I/O: posted receives against arrived messages, by (communicator, peer,
//! tag) in order, and the messages no receive has claimed yet.
//!
//! [`Matching`] owns its data and touches no link, buffer or clock: the engine tells it what
//! was posted and what arrived, and it answers what to do — which receive a message goes to
//! (the engine then lands the payload straight in that receive's buffer), that it is held as
//! unexpected, that the receive is truncated or mismatched. Its unit tests drive it alone.

use crate::error::Result;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

use super::requests::{op_slice, truncated};
use super::{BufPtr, Dest, MatchKey, OpId, OpKind, State, Target};

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
    unexpected: HashMap<MatchKey, VecDeque<u64>>,
    umsgs: HashMap<u64, Unexpected>,
    next_umsg: u64,
}

impl Default for Matching {
    fn default() -> Matching {
        Matching {
            posted: HashMap::default(),
            unexpected: HashMap::default(),
            umsgs: HashMap::default(),
            next_umsg: 1,
        }
    }
}

/// Takes the first entry of a matching queue, dropping the queue when it empties (the maps
/// would otherwise keep a key for every tag ever used).
fn pop_key<V>(map: &mut HashMap<MatchKey, VecDeque<V>>, key: &MatchKey) -> Option<V> {
    let q = map.get_mut(key)?;
    let v = q.pop_front();
    if q.is_empty() {
        map.remove(key);
    }
    v
}

/// Removes the entries `gone` selects from a matching queue, dropping the queue when it
/// empties.
fn remove_from<V>(
    map: &mut HashMap<MatchKey, VecDeque<V>>,
    key: &MatchKey,
    gone: impl Fn(&V) -> bool,
) {
    if let Some(q) = map.get_mut(key) {
        q.retain(|x| !gone(x));
        if q.is_empty() {
            map.remove(key);
        }
    }
}

impl Matching {
    /// Posts receive `r` for `key`: it takes the oldest message held for `key`, or waits.
    pub(super) fn post(&mut self, key: MatchKey, r: Recv) -> Matched {
        match pop_key(&mut self.unexpected, &key) {
            None => {
                self.posted.entry(key).or_default().push_back(r);
                Matched::Queued
            }
            Some(uid) => self.claim(uid, r),
        }
    }

    /// Whether a message held for `key` waits (a receive posted now would take it).
    pub(super) fn has_unexpected(&self, key: &MatchKey) -> bool {
        self.unexpected.contains_key(key)
    }

    /// Whether nothing is posted or held for `key`: the next message for it would go to the
    /// next receive.
    pub(super) fn idle(&self, key: &MatchKey) -> bool {
        !self.posted.contains_key(key) && !self.unexpected.contains_key(key)
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
        match pop_key(&mut self.posted, &key) {
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
        match pop_key(&mut self.posted, &key) {
            Some(r) => {
                remove_from(&mut self.unexpected, &key, |&u| u == uid);
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
        self.unexpected.entry(key).or_default().push_back(uid);
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
        remove_from(&mut self.posted, key, |r| r.id == id);
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
    /// to be refused). Every call asks: costs nothing while nothing is held.
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
        let mut found = Vec::new();
        for peer in 0..peers {
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
                remove_from(&mut self.unexpected, &key, |&u| u == uid);
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
            self.live_peer(&t)?;
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

    /// Carries out what matching decided; returns where an arriving payload goes (`None`:
    /// nowhere, or nothing arrives).
    pub(super) fn matched(&mut self, m: Matched) -> Option<Dest> {
        match m {
            Matched::Queued | Matched::Claimed { .. } => None,
            Matched::Held { uid } => Some(Dest::Unexpected(uid)),
            Matched::Foreign => Some(Dest::Discard),
            Matched::Eager { id, .. } => Some(Dest::Op { op: id, base: 0 }),
            Matched::Rts {
                id,
                msg_id,
                len,
                pull,
            } => {
                self.match_rts(id, msg_id, len, pull);
                None
            }
            Matched::Truncated { id, len } => {
                if let Some(op) = self.ops.get(&id) {
                    let err = truncated(op, len);
                    self.complete(id, Err(err));
                }
                Some(Dest::Discard)
            }
            Matched::Mismatch { id, theirs, refuse } => {
                if let (Some(msg_id), Some(op)) = (refuse, self.ops.get(&id)) {
                    let peer = op.target.peer;
                    self.refuse_rts(peer, msg_id);
                }
                self.mismatch(id, theirs);
                Some(Dest::Discard)
            }
            Matched::Deliver { id, data } => {
                if let Some(op) = self.ops.get_mut(&id) {
                    if let Some(dst) = op_slice(op, 0, data.len()) {
                        dst.copy_from_slice(&data);
                    }
                    self.complete(id, Ok(data.len()));
                }
                None
            }
        }
    }
}
