//! Fault tolerance: going on after a member is lost (docs/fault-tolerance.md).
//!
//! * `revoke`: the engine's reliable broadcast (`p2p/revoke.rs`) fails every pending and later
//!   operation of the communicator, on every live member, with `Error::Revoked`.
//! * `failed` and `ack_failed`: the members this rank knows to be lost (found by the engine,
//!   or agreed), and acknowledging them.
//! * `agree`: fault-tolerant consensus on the AND of the survivors' flags and on the failed
//!   set: the flooding uniform consensus of Cachin, Guerraoui and Rodrigues (Introduction to
//!   Reliable and Secure Distributed Programming, 2nd ed., algorithm 5.3), over the engine's
//!   failure detection.
//! * `shrink`, `shrink_excluding`: agreement on the failed set, then a communicator of the
//!   survivors in the old order, at the next epoch, made without further messages.
//!
//! Their messages travel on the communicator's fault-tolerance channel (its id with both the
//! internal and the collective bit), which a revoke leaves open.

use std::collections::BTreeSet;

use super::{Communicator, Request, COLL, INTERNAL, WORLD_ID};
use crate::error::{Error, PeerRank, Result};
use crate::p2p::lease::Lease;
use crate::p2p::Blocking;
use crate::rng::mix;

/// The channel of the fault-tolerance calls' messages (an id bit pattern no other channel
/// uses: `next_id` clears both bits).
const FT: u64 = INTERNAL | COLL;
/// Keeps the ids of shrunk communicators apart from those of `split`, `dup` and `subset`.
const SHRINK_DOMAIN: u64 = 0x5368_7269_6e6b_0001;
/// A proposal's entry for a rank: no proposal from it known yet.
const UNKNOWN: u8 = 0;
/// A proposal's entry: the rank proposed `false`.
const PROPOSED_FALSE: u8 = 1;
/// A proposal's entry: the rank proposed `true`.
const PROPOSED_TRUE: u8 = 2;

/// What one communicator's handles share about failures.
#[derive(Debug, Default)]
pub(super) struct FtState {
    /// Ranks an agreement decided had failed.
    agreed: BTreeSet<usize>,
    /// Ranks this rank acknowledged as failed (`ack_failed`).
    acked: BTreeSet<usize>,
    /// Fault-tolerance calls made so far: numbers each one's messages (every survivor makes
    /// the same calls in the same order).
    calls: u32,
}

/// What an agreement decided: the same at every survivor.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Decision {
    /// The AND of the flags proposed.
    flag: bool,
    /// The failed ranks: those some proposer knew had failed, the ranks told to be left
    /// out, and those whose proposal reached nobody.
    failed: BTreeSet<usize>,
}

/// One rank's knowledge during an agreement: every rank's proposal that reached it, and the
/// union of the failed sets those proposals carried. Flooded whole each round.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Knowledge {
    proposals: Vec<u8>,
    failed: Vec<bool>,
}

impl Knowledge {
    fn new(n: usize, me: usize, flag: bool, failed: &BTreeSet<usize>) -> Knowledge {
        let mut k = Knowledge {
            proposals: vec![UNKNOWN; n],
            failed: vec![false; n],
        };
        k.proposals[me] = if flag { PROPOSED_TRUE } else { PROPOSED_FALSE };
        for &r in failed {
            k.failed[r] = true;
        }
        k
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = self.proposals.clone();
        v.extend(self.failed.iter().map(|&f| u8::from(f)));
        v
    }

    /// Adds what a peer knew (`msg`, its encoding); an error for a malformed one.
    fn merge(&mut self, msg: &[u8]) -> std::result::Result<(), String> {
        let n = self.proposals.len();
        if msg.len() != 2 * n {
            return Err(format!("{} bytes instead of {}", msg.len(), 2 * n));
        }
        for (mine, &theirs) in self.proposals.iter_mut().zip(&msg[..n]) {
            match (theirs, *mine) {
                (UNKNOWN, _) => {}
                (t, UNKNOWN) if t == PROPOSED_FALSE || t == PROPOSED_TRUE => *mine = t,
                (t, m) if t == m => {}
                (t, m) => return Err(format!("a proposal {t} where this rank knows {m}")),
            }
        }
        for (mine, &theirs) in self.failed.iter_mut().zip(&msg[n..]) {
            match theirs {
                0 => {}
                1 => *mine = true,
                b => return Err(format!("a failed mark {b}")),
            }
        }
        Ok(())
    }

    fn decide(&self) -> Decision {
        Decision {
            flag: self.proposals.iter().all(|&p| p != PROPOSED_FALSE),
            failed: (0..self.proposals.len())
                .filter(|&r| self.failed[r] || self.proposals[r] == UNKNOWN)
                .collect(),
        }
    }
}

impl Communicator {
    /// The ids this communicator's frames carry: point-to-point, collectives, internal.
    pub(super) fn channel_ids(&self) -> [u64; 3] {
        [self.id, self.id | COLL, self.id | INTERNAL]
    }

    /// Revokes the communicator, on every member: each operation pending on it — here, on
    /// other threads and on the other members — and every later one fails with
    /// [`Error::Revoked`] within moments (the notice is forwarded by every member that gets
    /// it, so it reaches every live member even if this rank dies right after). Only
    /// [`Communicator::agree`], [`Communicator::shrink`], [`Communicator::failed`] and
    /// [`Communicator::ack_failed`] still work on it. Revoking twice does nothing more.
    pub fn revoke(&self) -> Result<()> {
        self.world
            .engine
            .revoke_comm(self.channel_ids(), self.epoch);
        Ok(())
    }

    /// Whether the communicator was revoked (by this rank or by a member whose notice came).
    pub fn is_revoked(&self) -> bool {
        self.world.engine.is_revoked(self.id, self.epoch)
    }

    /// The epoch of the communicator: 0 for one no shrink made, else one more than the
    /// communicator it was shrunk from. Its message frames carry it.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The ranks of the communicator this rank knows to have failed, ascending: those its
    /// engine found lost (killed, unreachable, silent past the heartbeats) and those an
    /// agreement decided.
    pub fn failed(&self) -> Vec<usize> {
        let mut all: BTreeSet<usize> = self
            .world
            .engine
            .lost_among(&self.members)
            .into_iter()
            .collect();
        all.extend(crate::sync::lock(&self.state.ft).agreed.iter().copied());
        all.into_iter().collect()
    }

    /// Acknowledges the failures [`Communicator::failed`] returns now: a later
    /// [`Communicator::agree`] no longer reports them as [`Error::PeerLost`]. Returns how
    /// many ranks are acknowledged.
    pub fn ack_failed(&self) -> usize {
        let failed = self.failed();
        let mut ft = crate::sync::lock(&self.state.ft);
        ft.acked.extend(failed);
        ft.acked.len()
    }

    /// Fault-tolerant agreement: every surviving member calls it, and each returns with
    /// `*flag` set to the AND of the flags of the members that took part, the same at every
    /// survivor, also when members die during the call. Works on a revoked communicator.
    ///
    /// Errors: [`Error::PeerLost`] when the agreed failed set holds ranks this rank has not
    /// acknowledged ([`Communicator::ack_failed`]); `*flag` is the agreed value all the same.
    /// [`Error::Timeout`] when a live member does not take part within `HCOMM_TIMEOUT`.
    pub fn agree(&self, flag: &mut bool) -> Result<()> {
        let known: BTreeSet<usize> = self.failed().into_iter().collect();
        let d = self.consensus(*flag, &known, &BTreeSet::new())?;
        *flag = d.flag;
        let mut ft = crate::sync::lock(&self.state.ft);
        ft.agreed.extend(d.failed.iter().copied());
        let unacked: Vec<usize> = d.failed.difference(&ft.acked).copied().collect();
        match unacked.first() {
            None => Ok(()),
            Some(&r) => Err(Error::peer_lost(
                PeerRank::ranks(r, self.members[r]),
                format!(
                    "the agreement found ranks {unacked:?} failed, which this rank has not \
                     acknowledged (Communicator::ack_failed); the flag is agreed all the same"
                ),
            )),
        }
    }

    /// A communicator of the surviving members, in their old order, at the next epoch: the
    /// survivors agree on the failed set (again while members die during it), then each makes
    /// the new communicator without further messages. Every surviving member calls it; it
    /// works on a revoked communicator.
    ///
    /// Errors: [`Error::Quorum`] when the survivors are no strict majority of the members (a
    /// partition's smaller side: only the majority may go on); [`Error::Revoked`] on a rank
    /// the others decided had failed (it was stopped or cut off for too long);
    /// [`Error::Timeout`] when a live member does not take part within `HCOMM_TIMEOUT`.
    pub fn shrink(&self) -> Result<Communicator> {
        self.shrink_with(&BTreeSet::new())
    }

    /// [`Communicator::shrink`] that also leaves out `ranks` (live members removed on
    /// purpose; they do not call it). The majority rule counts only the other members.
    ///
    /// Errors: those of `shrink`; [`Error::InvalidArgument`] when `ranks` names a rank out of
    /// range or this rank.
    pub fn shrink_excluding(&self, ranks: &[usize]) -> Result<Communicator> {
        if let Some(&bad) = ranks.iter().find(|&&r| r >= self.size() || r == self.rank) {
            return Err(Error::invalid_argument(format!(
                "shrink_excluding: rank {bad} is out of range (the communicator has {} ranks) \
                 or is this rank",
                self.size()
            )));
        }
        self.shrink_with(&ranks.iter().copied().collect())
    }

    fn shrink_with(&self, excluded: &BTreeSet<usize>) -> Result<Communicator> {
        let n = self.size();
        // Agree until an agreement finds that no proposer knew of a failure beyond the set
        // decided before: each other one adds a failure, so at most n rounds of it.
        let mut decided: BTreeSet<usize> = BTreeSet::new();
        let (failed, seq) = loop {
            let mut known: BTreeSet<usize> = self.failed().into_iter().collect();
            known.extend(excluded.iter().copied());
            let flag = known.is_subset(&decided);
            known.extend(decided.iter().copied());
            let seq = crate::sync::lock(&self.state.ft).calls;
            let d = self.consensus(flag, &known, excluded)?;
            decided = d.failed;
            if d.flag {
                break (decided, seq);
            }
        };
        crate::sync::lock(&self.state.ft)
            .agreed
            .extend(failed.difference(excluded).copied());
        if failed.contains(&self.rank) {
            return Err(Error::revoked(
                "this rank was excluded: the other members shrank the communicator without it \
                 (they found it failed: it was stopped or cut off for longer than they waited)",
            ));
        }
        let survivors: Vec<usize> = (0..n).filter(|r| !failed.contains(r)).collect();
        let voters = n - excluded.len();
        let lost = failed.len().saturating_sub(excluded.len());
        if 2 * (voters - lost) <= voters {
            return Err(Error::quorum(format!(
                "only {} of the {voters} members are reachable: the ranks {:?} may be alive on \
                 the other side of a partition, and only a strict majority may shrink the \
                 communicator",
                voters - lost,
                failed.difference(excluded).collect::<Vec<_>>()
            )));
        }
        let mut h = mix(self.id ^ mix(SHRINK_DOMAIN ^ u64::from(seq)));
        for &r in &survivors {
            h = mix(h ^ r as u64);
        }
        let id = (h & !(INTERNAL | COLL)).max(WORLD_ID + 1);
        let rank = survivors
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| Error::internal("this rank is missing from its own shrink"))?;
        Ok(self.derive_at(id, survivors, rank, self.epoch + 1))
    }

    /// Posts a message of the fault-tolerance channel to or from `peer`.
    fn ft_post(&self, kind: Blocking, peer: usize, tag: u32, buf: Vec<u8>) -> Result<Request> {
        let t = self.target(self.id | FT, peer, tag, "agreement")?;
        let loan = self.world.engine.lend(kind, t, Lease::from(buf))?;
        Ok(Request::p2p(&self.world, loan, false))
    }

    /// One agreement (flooding uniform consensus): this rank proposes `flag` and the failed
    /// set `failed`; `absent` are ranks left out on purpose, never waited for. As many
    /// rounds as members; in each, every rank sends all it knows to every rank it does not
    /// know to have failed and waits for the same from each (or for its loss). With at most
    /// n - 1 failures one round has none, after which every survivor knows the same, so all
    /// decide alike.
    fn consensus(
        &self,
        flag: bool,
        failed: &BTreeSet<usize>,
        absent: &BTreeSet<usize>,
    ) -> Result<Decision> {
        let n = self.size();
        let seq = {
            let mut ft = crate::sync::lock(&self.state.ft);
            ft.calls = ft.calls.wrapping_add(1);
            ft.calls
        };
        let mut know = Knowledge::new(n, self.rank, flag, failed);
        let mut gone: Vec<bool> = (0..n)
            .map(|r| failed.contains(&r) || absent.contains(&r))
            .collect();
        gone[self.rank] = true;
        for round in 0..n {
            let tag = ((seq & 0xffff) << 16) | (round as u32 & 0xffff);
            let msg = know.encode();
            let peers: Vec<usize> = (0..n).filter(|&p| !gone[p]).collect();
            let mut recvs = Vec::with_capacity(peers.len());
            for &p in &peers {
                match self.ft_post(Blocking::Recv, p, tag, vec![0; 2 * n]) {
                    Ok(r) => recvs.push((p, r)),
                    Err(_) => gone[p] = true,
                }
            }
            let sends: Vec<Request> = peers
                .iter()
                .filter_map(|&p| self.ft_post(Blocking::Send, p, tag, msg.clone()).ok())
                .collect();
            for (p, r) in recvs {
                match r.wait() {
                    Ok(c) => know.merge(&c.buffer[..c.len]).map_err(|why| {
                        Error::internal(format!(
                            "rank {p} sent a malformed agreement message: {why}"
                        ))
                        .with_peer(PeerRank::ranks(p, self.members[p]))
                    })?,
                    Err(Error::PeerLost(_)) => gone[p] = true,
                    Err(e) => return Err(e.prefixed("agreement")),
                }
            }
            // A send to a rank lost meanwhile fails; that rank's receive said so already.
            for s in sends {
                let _ = s.wait();
            }
        }
        Ok(know.decide())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knowledge_merges_proposals_and_failures_and_decides_the_and() {
        let none = BTreeSet::new();
        let mut a = Knowledge::new(4, 0, true, &none);
        let b = Knowledge::new(4, 1, false, &[3].into_iter().collect());
        a.merge(&b.encode()).expect("valid");
        let d = a.decide();
        assert!(!d.flag);
        // Rank 2 proposed nothing that arrived, rank 3 was known failed.
        assert_eq!(d.failed, [2, 3].into_iter().collect());
        let mut c = Knowledge::new(4, 2, true, &none);
        c.merge(&a.encode()).expect("valid");
        assert_eq!(c.decide().failed, [3].into_iter().collect::<BTreeSet<_>>());
    }

    #[test]
    fn knowledge_refuses_malformed_messages() {
        let mut a = Knowledge::new(3, 0, true, &BTreeSet::new());
        assert!(a.merge(&[0; 5]).is_err());
        assert!(
            a.merge(&[1, 0, 0, 0, 0, 0]).is_err(),
            "rank 0 proposed true here"
        );
        assert!(a.merge(&[0, 3, 0, 0, 0, 0]).is_err());
        assert!(a.merge(&[0, 0, 0, 0, 2, 0]).is_err());
    }
}
