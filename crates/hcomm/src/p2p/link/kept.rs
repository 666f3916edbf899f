//! What failover keeps of a path to a peer: every frame written on it, numbered by its
//! origin, until the peer acknowledged it, so that the frames a dead path had not delivered go
//! out again on another, in order ([`Kept`]). One mechanism for both kinds of failover: a TCP
//! stream that dies hands its kept frames to another stream of its link (`tcp.rs`), and a
//! transport plug-in that fails hands its kept frames to the TCP link behind it (`plugin.rs`);
//! either way the receiver's TCP link takes each origin's frames once, in number order
//! (`TcpLink::on_record`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::p2p::{OpId, OutFrame};
use crate::transport::wire::FrameKind;

/// The origin stream number of the frames a transport plug-in carried first.
pub(super) const PLUGIN: u16 = u16::MAX;

/// Where a frame was first written: stream ([`PLUGIN`] for the plug-in), the stream's
/// generation (how many times its connection was made again after it died), and number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Origin {
    pub stream: u16,
    pub gen: u16,
    pub seq: u64,
}

impl Origin {
    /// The stream and generation alone (whose frames are numbered from 0).
    pub(super) fn key(&self) -> (u16, u16) {
        (self.stream, self.gen)
    }

    /// Frame `seq` of the plug-in path.
    pub(super) fn plugin(seq: u64) -> Origin {
        Origin {
            stream: PLUGIN,
            gen: 0,
            seq,
        }
    }
}

/// A frame in a queue: its origin once it was given one (when first written, or before, for
/// a frame moved from a path that died).
#[derive(Debug)]
pub(super) struct Queued {
    pub f: OutFrame,
    pub origin: Option<Origin>,
}

/// The frames written on one path and not yet acknowledged by the peer.
#[derive(Debug, Default)]
pub(super) struct Kept {
    /// Frames written in full, and those of them the peer acknowledged.
    written: u64,
    acked: u64,
    /// The unacknowledged frames, oldest first.
    frames: VecDeque<Queued>,
    /// How many of them are data frames kept in place (their payload still in their
    /// operation's buffer), whose sends complete when they are acknowledged.
    held_ops: usize,
}

impl Kept {
    /// Keeps a frame just written in full (its payload copied, or in place for a data frame
    /// whose send completes on its acknowledgement).
    pub(super) fn push(&mut self, mut q: Queued) {
        if q.f.kind == FrameKind::Data && q.f.op.is_some() && q.f.owned.is_none() {
            self.held_ops += 1;
        }
        q.f.hdr_done = 0;
        q.f.done = 0;
        self.written += 1;
        self.frames.push_back(q);
    }

    /// Frames written in full.
    pub(super) fn written(&self) -> u64 {
        self.written
    }

    /// Whether sends wait for the acknowledgement of their data frames.
    pub(super) fn holds_ops(&self) -> bool {
        self.held_ops > 0
    }

    /// The peer acknowledged the first `ack` frames: they are dropped, and the operations of
    /// the data frames kept in place among them go to `done` (their sends are complete).
    /// `in_flight`: frames being written, which the peer may acknowledge before they are
    /// kept (they stay kept until the next acknowledgement). An acknowledgement of frames
    /// never written is an error (the number written).
    pub(super) fn ack(
        &mut self,
        ack: u64,
        in_flight: u64,
        done: &mut VecDeque<OpId>,
    ) -> Result<(), u64> {
        if ack > self.written + in_flight {
            return Err(self.written);
        }
        while self.acked < ack.min(self.written) {
            self.acked += 1;
            if let Some(id) = self.frames.pop_front().and_then(|q| q.f.op) {
                self.held_ops -= 1;
                done.push_back(id);
            }
        }
        Ok(())
    }

    /// The kept frames, to change (a cancelled operation's payload copied out of its buffer);
    /// [`Kept::recount`] afterwards.
    pub(super) fn frames_mut(&mut self) -> impl Iterator<Item = &mut Queued> {
        self.frames.iter_mut()
    }

    /// Counts again the frames kept in place, after [`Kept::frames_mut`].
    pub(super) fn recount(&mut self) {
        self.held_ops = self.frames.iter().filter(|q| q.f.op.is_some()).count();
    }

    /// Takes every kept frame, oldest first, to be sent again on another path.
    pub(super) fn take(&mut self) -> VecDeque<Queued> {
        self.held_ops = 0;
        std::mem::take(&mut self.frames)
    }
}

/// The plug-in path from one peer as both of this side's links to it see it: the number of
/// the next frame of the peer's plug-in origin this side takes. The frames come through the
/// plug-in, and after the peer fell back to TCP once more through TCP, from its oldest
/// unacknowledged one; whichever link brings a number first delivers the frame, the other
/// drops its copy.
#[derive(Debug, Default)]
pub(in crate::p2p) struct Handoff {
    taken: AtomicU64,
}

impl Handoff {
    /// The next number to take.
    pub(super) fn next(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }

    /// Frames up to `next` (excluded) were taken.
    pub(super) fn took(&self, next: u64) {
        self.taken.fetch_max(next, Ordering::Relaxed);
    }
}
