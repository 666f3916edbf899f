//! Revoked communicators and epochs: the engine's part of fault tolerance.
//!
//! A revoke is a reliable broadcast: the revoker sends a revoke frame (an `Abort` frame with
//! [`FLAG_REVOKE`]) to every other member, and every member that sees it for the first time
//! sends it on to every member but the one it came from, so it reaches every live member
//! even if the revoker dies right after. Seeing it fails every pending and later operation
//! on the communicator's data channels with `Error::Revoked` (through the same bookkeeping as
//! an abort), and raises the floor of their epochs: a message frame that arrives later for a
//! revoked communicator (a rank that was stopped and resumed) is dropped and counted
//! ([`Revocations::stale`], `ProtocolStats::stale_frames`).
//!
//! [`Revocations`] is sans I/O (the dispatch asks it about every message frame); the engine's
//! part below queues and forwards the frames. The engine knows each communicator's members
//! from [`Engine::register_comm`], so that a rank forwards a revoke whatever it is doing.

use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::error::{Error, PeerRank};
use crate::sync::lock;
use crate::transport::wire::{FrameHeader, FrameKind, FLAG_REVOKE};

use super::{Engine, OutFrame, State};

/// Revoked communicators, by the ids their frames carry.
#[derive(Debug, Default)]
pub(super) struct Revocations {
    /// The epoch below which a message frame of each communicator id is stale.
    floors: HashMap<u64, u32>,
    /// Communicators that run parts of another's calls (the tiers of the hierarchical
    /// all-reduce), by the other's id, with their ids and epoch: revoked with it, by each
    /// member for itself.
    parts: HashMap<u64, Vec<([u64; 3], u32)>>,
}

impl Revocations {
    /// Whether a message frame of communicator `comm` at `epoch` is stale (its communicator
    /// was revoked at that epoch or later). One empty-map check while nothing was revoked.
    #[inline]
    pub(super) fn stale(&self, comm: u64, epoch: u32) -> bool {
        !self.floors.is_empty() && self.floors.get(&comm).is_some_and(|&f| epoch < f)
    }

    /// Marks `comm` revoked at `epoch`; whether it was not already.
    pub(super) fn revoke(&mut self, comm: u64, epoch: u32) -> bool {
        let floor = epoch.saturating_add(1);
        let old = self.floors.insert(comm, floor);
        match old {
            Some(f) if f >= floor => {
                self.floors.insert(comm, f);
                false
            }
            _ => true,
        }
    }
}

/// The frame that revokes the communicator whose frames carry the ids `comms`, at `epoch`,
/// first revoked by world rank `origin`.
pub(super) fn revoke_frame(comms: [u64; 3], epoch: u32, origin: usize) -> FrameHeader {
    let mut hdr = FrameHeader::new(FrameKind::Abort);
    hdr.flags = FLAG_REVOKE;
    hdr.comm = comms[0];
    hdr.sig = [comms[1], comms[2]];
    hdr.epoch = epoch;
    // The revoker + 1 (0 would name nobody).
    hdr.msg_id = origin as u64 + 1;
    hdr
}

impl State {
    /// Communicator `comms` is revoked at `epoch` (by world rank `origin`; `from`: the peer
    /// the notice came through). The first time: fails its operations, raises its floor,
    /// and sends the notice on to every member but this rank and `from`.
    pub(super) fn on_revoke(
        &mut self,
        comms: [u64; 3],
        epoch: u32,
        origin: usize,
        from: Option<usize>,
    ) {
        if !self.calls.revocations.revoke(comms[0], epoch) {
            return;
        }
        let me = self.cfg.rank;
        let err = if origin == me {
            Error::revoked("this rank revoked the communicator (Communicator::revoke)")
        } else {
            Error::revoked(format!(
                "world rank {origin} revoked the communicator (Communicator::revoke, \
                 hcommCommRevoke): agree on the failed ranks and shrink it to go on"
            ))
            .with_peer(PeerRank::world(origin))
        };
        let parts = self
            .calls
            .revocations
            .parts
            .remove(&comms[0])
            .unwrap_or_default();
        for (ids, e) in std::iter::once((comms, epoch)).chain(parts) {
            for comm in ids {
                self.calls.revocations.revoke(comm, e);
                self.abort_comm(comm, err.clone());
            }
        }
        let members = self
            .members
            .get(&comms[0])
            .and_then(Weak::upgrade)
            .map(|m| m.to_vec())
            .unwrap_or_default();
        for peer in members {
            if peer != me && Some(peer) != from && peer != origin {
                self.queue(peer, OutFrame::control(revoke_frame(comms, epoch, origin)));
            }
        }
    }
}

impl Engine {
    /// Records the world ranks of communicator `id`'s members, so that this rank can forward
    /// a revoke of it (entries of communicators since released are dropped here).
    pub(crate) fn register_comm(&self, id: u64, members: &Arc<[usize]>) {
        let mut st = lock(&self.shared.state);
        st.members.retain(|_, m| m.strong_count() > 0);
        st.members.insert(id, Arc::downgrade(members));
    }

    /// Communicator `part` (its ids, at `epoch`) runs parts of the calls of communicator
    /// `whole`: revoking `whole` revokes it too, on every member (each revokes its own parts).
    pub(crate) fn add_part(&self, whole: u64, part: [u64; 3], epoch: u32) {
        let mut st = lock(&self.shared.state);
        st.calls
            .revocations
            .parts
            .entry(whole)
            .or_default()
            .push((part, epoch));
    }

    /// Revokes the communicator whose frames carry the ids `comms` (at `epoch`): its pending
    /// and later operations fail with `Error::Revoked`, here and on every member, which are
    /// told at once (see the module's description).
    pub(crate) fn revoke_comm(&self, comms: [u64; 3], epoch: u32) {
        {
            let mut st = lock(&self.shared.state);
            let me = st.cfg.rank;
            st.on_revoke(comms, epoch, me, None);
            // Out now (as an abort): a member may leave soon after.
            st.handle(&[], false);
        }
        self.shared.io.wake_all();
    }

    /// Whether communicator `comm` was revoked, as far as this rank has read.
    pub(crate) fn is_revoked(&self, comm: u64, epoch: u32) -> bool {
        if !self.shared.io.any_aborted.load(Ordering::SeqCst) {
            return false;
        }
        lock(&self.shared.state)
            .calls
            .revocations
            .stale(comm, epoch)
    }

    /// Which of `members` (world ranks) this rank knows to be lost, by their index (a peer
    /// that finalized and said goodbye is gone, not failed).
    pub(crate) fn lost_among(&self, members: &[usize]) -> Vec<usize> {
        let st = lock(&self.shared.state);
        members
            .iter()
            .enumerate()
            .filter(|(_, &w)| {
                st.peers
                    .get(w)
                    .and_then(Option::as_ref)
                    .is_some_and(|p| p.lost.is_some() && !p.closed)
            })
            .map(|(i, _)| i)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoked_communicator_drops_the_frames_of_its_epoch_only() {
        let mut r = Revocations::default();
        assert!(!r.stale(5, 0));
        assert!(r.revoke(5, 0));
        assert!(!r.revoke(5, 0), "a second notice changes nothing");
        assert!(r.stale(5, 0));
        assert!(!r.stale(5, 1), "a later epoch of the id is not stale");
        assert!(!r.stale(6, 0), "other communicators are untouched");
        assert!(r.revoke(5, 3));
        assert!(r.stale(5, 3));
        assert!(!r.revoke(5, 1), "an older revoke does not lower the floor");
        assert!(r.stale(5, 3));
    }

    #[test]
    fn the_frame_names_the_ids_the_epoch_and_the_revoker() {
        let h = revoke_frame([7, 8, 9], 4, 2);
        let back = FrameHeader::decode(&h.encode()).expect("a valid frame");
        assert_eq!(back, h);
        assert_eq!(
            (back.comm, back.sig, back.epoch, back.msg_id),
            (7, [8, 9], 4, 3)
        );
    }
}
