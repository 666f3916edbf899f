//! Links: the one interface through which the engine moves frames to and from a peer, whatever
//! the transport ([`Link`]), every peer's links, and the route that picks the link of a frame
//! ([`Links::route`]).
//!
//! A link owns its transport's state (sockets and their queues, rings and fast boxes, a
//! plug-in's threads) and knows nothing of matching, rendezvous or calls. The engine talks to
//! it in both directions without lending it the protocol state:
//!
//! * **Sending:** [`Link::push`] appends a frame to the link's queue, [`Link::flush`] writes
//!   what the transport takes now. A frame's payload is read from its operation's buffer at
//!   the moment it is written (`frame_payload`), so nothing is copied on the way; the link
//!   reports each frame that left (`sent`), and the engine completes the sends.
//! * **Receiving (pull):** [`Link::poll`] hands the engine the next thing that arrived. For a
//!   frame that is first its header ([`Rx::Header`]): the engine dispatches it with all of its
//!   state (matching, rendezvous, calls — free to send on this very link meanwhile, since the
//!   link is not borrowed), and answers with where the payload goes ([`Link::place`]). The link
//!   then copies the payload straight into that destination (an operation's buffer, or an
//!   unexpected message's), now or over later polls ([`Rx::Payload`]). While it copies, a
//!   link borrows only the destinations ([`Dests`]: the operations and the unexpected
//!   messages), fields of the engine's state apart from the links.
//!
//! A peer may hold several links, in the order they were added: the first is its TCP
//! connection (there from init, connected on the peer's first use: [`Link::want`]; a local
//! pair linked by shared memory alone has none), whose end tells that the peer is gone; the
//! last carries the peer's traffic; a frame that the last cannot carry (a goodbye that must
//! precede the end of the connection, a wake-up for a peer sleeping in `epoll_wait`) takes the
//! first link that can ([`Links::route`], by the links' [`Caps`]). A link made later (a second
//! rail) is one more [`Links::add`]; the epoll tokens of a link's descriptors carry its place
//! among its peer's links ([`token`]).
//!
//! A transport plug-in with TCP behind it falls back to the peer's TCP link when it fails
//! ([`Links::fall_back`], see `link/plugin.rs`): from then on the TCP link carries the
//! peer's traffic, and the plug-in link is only read for what the peer still sends through
//! it.

pub(super) mod kept;
pub(super) mod ofi;
pub(super) mod plugin;
pub(super) mod shm;
pub(super) mod tcp;

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;
use rustix::event::epoll;

use super::matching::Matching;
use super::requests::dest_slice;
use super::{Dest, Op, OpId, OutFrame};
use crate::transport::shm::link::{Inbox, Watch};
use crate::transport::shm::split::SplitSlot;
use crate::transport::wire::{FrameHeader, FrameKind};

/// The engine's operations by id: outgoing payloads are read from their buffers.
pub(super) type Ops = HashMap<OpId, Op>;

/// Where received payloads land: the operations' buffers and the unexpected messages held
/// (in the matching).
pub(super) struct Dests<'a> {
    /// The operations.
    pub ops: &'a mut Ops,
    /// The matching, which holds the unexpected messages.
    pub matching: &'a mut Matching,
}

impl Dests<'_> {
    /// The bytes `done..done+len` of destination `dest`; `None` when they are to be dropped.
    pub(super) fn slice(&mut self, dest: Dest, done: usize, len: usize) -> Option<&mut [u8]> {
        dest_slice(self.ops, self.matching, dest, done, len)
    }

    /// Where the whole payload of `hdr` goes, for a link that has it all at once.
    pub(super) fn whole(&mut self, hdr: &FrameHeader, dest: Option<Dest>) -> Option<&mut [u8]> {
        let n = hdr.payload_len() as usize;
        match dest {
            Some(d) if n > 0 => self.slice(d, 0, n),
            _ => None,
        }
    }
}

/// Which transport a link is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// TCP streams.
    Tcp,
    /// A shared-memory ring and fast box.
    Shm,
    /// A transport plug-in.
    Plugin,
    /// libfabric.
    Ofi,
}

impl Kind {
    /// How messages name it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Tcp => "TCP connection",
            Kind::Shm => "shared-memory link",
            Kind::Plugin => "transport plug-in",
            Kind::Ofi => "libfabric endpoint",
        }
    }
}

/// How the watcher tells that the peer behind a link is alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Liveness {
    /// By the frames that come from it; the watcher sends it a `Wake` now and then.
    Frames,
    /// By the heartbeat its watcher bumps ([`Link::heartbeat`]).
    Heartbeat,
    /// Left to the link itself and to the end of the peer's connection.
    Connection,
}

/// What a link can do, fixed when it is made.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caps {
    /// Its transport.
    pub kind: Kind,
    /// One-sided reads of the peer's memory: the process id that cross-memory attach reaches.
    pub read_remote: Option<u32>,
    /// The largest payload of one frame.
    pub max_payload: usize,
    /// Its end follows its last frame: a goodbye sent on it is seen before the end.
    pub ordered_end: bool,
    /// A frame on it wakes a peer sleeping in `epoll_wait`.
    pub wakes_epoll: bool,
    /// It has no descriptor to wait on: the engine polls it on every turn.
    pub polled: bool,
    /// Its frames ring the receiver's doorbell (a waiter may sleep on the futex for them).
    pub doorbell: bool,
    /// What it holds when its peer is lost is still read (it was sent before the loss).
    pub drain_on_loss: bool,
    /// How the watcher tells that the peer is alive.
    pub liveness: Liveness,
}

/// What [`Link::poll`] found.
#[derive(Debug)]
pub(super) enum Rx {
    /// Nothing more this turn.
    Idle,
    /// The header of a frame: the engine dispatches it and answers with [`Link::place`]
    /// before it polls again.
    Header(FrameHeader),
    /// The payload of a frame placed earlier has fully arrived at `Dest`.
    Payload(FrameHeader, Dest),
    /// A frame of this send left (links that send from another thread).
    Sent(OpId),
    /// The link reached its end; `goodbye`: the peer's goodbye came through it first.
    Closed {
        /// The goodbye came through this link before its end.
        goodbye: bool,
    },
    /// The link failed: why (the peer is lost).
    Failed(String),
    /// The peer's traffic falls back from its transport plug-in to TCP: the plug-in failed
    /// (why), or its sender stopped as asked, or the peer fell back (from the TCP link). The
    /// engine calls [`Links::fall_back`] and reads what the plug-in delivered before.
    FallBack(String),
}

/// One link to one peer (see the module docs for how the engine drives it).
pub(super) trait Link: Send + std::fmt::Debug {
    /// What the link can do.
    fn caps(&self) -> &Caps;

    /// Appends a frame to the link's queue; returns whether nothing was queued before it
    /// (then a [`Link::flush`] may write it at once).
    fn push(&mut self, frame: OutFrame) -> bool;

    /// Writes queued frames while the transport takes them, pushing the operation of each
    /// frame that left onto `sent`; returns whether any left. An error says why the peer is
    /// lost.
    fn flush(&mut self, ops: &Ops, sent: &mut Vec<OpId>) -> Result<bool, String>;

    /// Whether frames wait in the link (queued, or handed to another thread and not sent).
    fn busy(&self) -> bool;

    /// The engine is about to need the link (an operation with its peer was posted): a link
    /// made on demand starts connecting.
    fn want(&mut self) {}

    /// A polled link: whether a frame waits to be read, or room for a queued frame.
    fn ready(&mut self) -> bool {
        false
    }

    /// Whether a transfer is under way, so that a waiter keeps polling rather than sleeping:
    /// asked of a polled link whose transport moves data only while it is polled (libfabric
    /// with manual progress) at every turn, and of a link with descriptors after an event of
    /// it (a TCP stream partway through a frame's payload: a piece of it was just read).
    fn streaming(&self) -> bool {
        false
    }

    /// A polled link whose transport has no descriptor to wake a sleeper (libfabric's
    /// completion queue opened without one): the longest a waiter may sleep before it polls
    /// the link again.
    fn nap(&self) -> Option<Duration> {
        None
    }

    /// An epoll event for the link's descriptor `lane` (see [`token`]).
    fn event(&mut self, _lane: usize, _flags: epoll::EventFlags) {}

    /// The next thing that arrived (see [`Rx`]).
    fn poll(&mut self, dests: &mut Dests<'_>) -> Rx;

    /// Where the payload of the header just polled goes (`None`: the frame is handled, or has
    /// no payload); returns whether the payload is all there (else a later poll returns
    /// [`Rx::Payload`]). An error says why the peer is lost.
    fn place(
        &mut self,
        hdr: &FrameHeader,
        dest: Option<Dest>,
        dests: &mut Dests<'_>,
    ) -> Result<bool, String>;

    /// Cuts every tie with operation `op`: its frames not yet written are dropped (one half
    /// written keeps a copy of its payload, so that a stream stays framed), and a payload that
    /// was landing in its buffer is dropped instead.
    fn forget(&mut self, op: OpId, ops: &Ops);

    /// Whether the link asks the engine to wake the peer (it wrote to the peer's memory while
    /// the peer may sleep in `epoll_wait`); asking once clears it.
    fn take_wake(&mut self) -> bool {
        false
    }

    /// Closes the sending side: the peer sees the end after what was written.
    fn shutdown(&mut self) {}

    /// After [`Link::shutdown`]: whether closing the link now could still cost the peer what
    /// was sent on it, so that a finalizing rank keeps reading it a moment longer (see
    /// `Engine::close`). A ring in shared memory stays readable after its writer is gone: by
    /// default, no.
    fn lingers(&self) -> bool {
        false
    }

    /// The peer is lost or the engine ends: drops what is queued and closes the link.
    fn close(&mut self);

    /// The epoll token of the descriptor a waiter may read directly, before a readiness
    /// event, for a small message it expects.
    fn direct_token(&self) -> Option<u64> {
        None
    }

    /// The peer's heartbeat count ([`Liveness::Heartbeat`]).
    fn heartbeat(&self) -> Option<u64> {
        None
    }

    /// Sends a small message (`hdr` and `data`) at once, when the link has room for it
    /// (shared memory: a slot in the peer's memory; libfabric: a bounce buffer) and nothing is
    /// queued before it; `Some(wake)` when it did (`wake`: the peer must be woken out of
    /// `epoll_wait`). The message is then on its way: its send is over.
    fn send_inline(&mut self, _hdr: &FrameHeader, _data: &[u8]) -> Option<bool> {
        None
    }

    /// The header of the next frame when it is a small one in an inline slot, not taken.
    fn peek_inline(&self) -> Option<FrameHeader> {
        None
    }

    /// Takes the frame whose header [`Link::peek_inline`] returned, copying the first
    /// `out.len()` bytes of its payload into `out`.
    fn take_inline(&mut self, _out: &mut [u8]) {}

    /// A watch on the next frame, when nothing is queued to go out.
    fn watch<'a>(&self, _inbox: &'a Inbox) -> Option<Watch<'a>> {
        None
    }

    /// A watch on the next frame of a link whose provider moves frames only while polled
    /// (libfabric): each look reads its completion queue.
    fn cq_watch(&self) -> Option<ofi::OfiWatch> {
        None
    }

    /// Whether a small message may wait in an inline slot now, for [`Link::peek_inline`] to
    /// see (a libfabric link reads its completion queue first, where that is cheap); false
    /// where looking costs more than it saves.
    fn may_hold_inline(&self) -> bool {
        false
    }

    /// The pair's split slot of the messages this rank receives from the peer (`incoming`)
    /// or sends it, for links in shared memory with the peer (see `p2p/split.rs`).
    fn split_slot(&self, _incoming: bool) -> Option<&SplitSlot> {
        None
    }
    /// One-sided writes of whole messages into the peer's receive buffers (direct steps of
    /// collectives, see [`Exposure`]): the sizes of the messages that go that way, `min..=max`
    /// bytes, when the link writes into a peer's memory.
    fn puts(&self) -> Option<(usize, usize)> {
        None
    }

    /// Offers the peer the receive `e` to write its message into (a direct step); `Ok(false)`
    /// when the link cannot (the peer then sends as usual). An error says why the peer is lost.
    fn expose(&mut self, _e: Exposure) -> Result<bool, String> {
        Ok(false)
    }
}

/// A receive of a collective step that the peer writes straight into ([`Link::expose`]): the
/// receiver offers the receive's bytes as soon as it posts it, and the sender, once it has
/// the offer, writes its message there and sends the frame after the data, skipping the
/// rendezvous. Both ranks number the direct steps of a call between them in program order
/// (`ordinal`), which pairs each offer with its send.
#[derive(Debug, Clone, Copy)]
pub(super) struct Exposure {
    /// The receive.
    pub op: OpId,
    /// Its bytes.
    pub ptr: *mut u8,
    /// How many.
    pub len: usize,
    /// The buffer around them (registered whole, once per call).
    pub span: (*mut u8, usize),
    /// Communicator, tag and signature of the call.
    pub comm: u64,
    /// See `comm`.
    pub tag: u32,
    /// See `comm`.
    pub sig: [u64; 2],
    /// The step's number among the call's direct steps from this peer.
    pub ordinal: u32,
}

/// A link of any transport, one variant each, so that the engine's tightest loops (a waiter
/// polling its shared-memory peers) call links without a virtual call and the compiler may
/// inline them (a boxed `dyn Link` cost the shared-memory ping-pong about 4 %). A new
/// transport adds its variant here and its arm in `each!`.
#[derive(Debug)]
pub(super) enum AnyLink {
    /// TCP streams.
    Tcp(tcp::TcpLink),
    /// Shared memory.
    Shm(shm::ShmPeerLink),
    /// A transport plug-in.
    Plugin(plugin::PluginLink),
    /// libfabric.
    Ofi(ofi::OfiLink),
    /// An in-memory link of the unit tests.
    #[cfg(test)]
    Test(Box<dyn Link>),
}

/// Calls the same method on whichever link `$s` holds.
macro_rules! each {
    ($s:expr, $l:ident => $e:expr) => {
        match $s {
            AnyLink::Tcp($l) => $e,
            AnyLink::Shm($l) => $e,
            AnyLink::Plugin($l) => $e,
            AnyLink::Ofi($l) => $e,
            #[cfg(test)]
            AnyLink::Test($l) => $e,
        }
    };
}

impl Link for AnyLink {
    #[inline]
    fn caps(&self) -> &Caps {
        each!(self, l => l.caps())
    }
    #[inline]
    fn push(&mut self, frame: OutFrame) -> bool {
        each!(self, l => l.push(frame))
    }
    #[inline]
    fn flush(&mut self, ops: &Ops, sent: &mut Vec<OpId>) -> Result<bool, String> {
        each!(self, l => l.flush(ops, sent))
    }
    #[inline]
    fn busy(&self) -> bool {
        each!(self, l => l.busy())
    }
    #[inline]
    fn want(&mut self) {
        each!(self, l => l.want())
    }
    #[inline]
    fn ready(&mut self) -> bool {
        each!(self, l => l.ready())
    }
    #[inline]
    fn streaming(&self) -> bool {
        each!(self, l => l.streaming())
    }
    #[inline]
    fn nap(&self) -> Option<Duration> {
        each!(self, l => l.nap())
    }
    #[inline]
    fn event(&mut self, lane: usize, flags: epoll::EventFlags) {
        each!(self, l => l.event(lane, flags))
    }
    #[inline]
    fn poll(&mut self, dests: &mut Dests<'_>) -> Rx {
        each!(self, l => l.poll(dests))
    }
    #[inline]
    fn place(
        &mut self,
        hdr: &FrameHeader,
        dest: Option<Dest>,
        dests: &mut Dests<'_>,
    ) -> Result<bool, String> {
        each!(self, l => l.place(hdr, dest, dests))
    }
    #[inline]
    fn forget(&mut self, op: OpId, ops: &Ops) {
        each!(self, l => l.forget(op, ops))
    }
    #[inline]
    fn take_wake(&mut self) -> bool {
        each!(self, l => l.take_wake())
    }
    #[inline]
    fn shutdown(&mut self) {
        each!(self, l => l.shutdown())
    }
    #[inline]
    fn lingers(&self) -> bool {
        each!(self, l => l.lingers())
    }
    #[inline]
    fn close(&mut self) {
        each!(self, l => l.close())
    }
    #[inline]
    fn direct_token(&self) -> Option<u64> {
        each!(self, l => l.direct_token())
    }
    #[inline]
    fn heartbeat(&self) -> Option<u64> {
        each!(self, l => l.heartbeat())
    }
    #[inline]
    fn send_inline(&mut self, hdr: &FrameHeader, data: &[u8]) -> Option<bool> {
        each!(self, l => l.send_inline(hdr, data))
    }
    #[inline]
    fn peek_inline(&self) -> Option<FrameHeader> {
        each!(self, l => l.peek_inline())
    }
    #[inline]
    fn split_slot(&self, incoming: bool) -> Option<&SplitSlot> {
        each!(self, l => l.split_slot(incoming))
    }
    #[inline]
    fn take_inline(&mut self, out: &mut [u8]) {
        each!(self, l => l.take_inline(out))
    }
    #[inline]
    fn watch<'a>(&self, inbox: &'a Inbox) -> Option<Watch<'a>> {
        each!(self, l => l.watch(inbox))
    }
    fn cq_watch(&self) -> Option<ofi::OfiWatch> {
        each!(self, l => l.cq_watch())
    }
    fn may_hold_inline(&self) -> bool {
        each!(self, l => l.may_hold_inline())
    }
    #[inline]
    fn puts(&self) -> Option<(usize, usize)> {
        each!(self, l => l.puts())
    }
    #[inline]
    fn expose(&mut self, e: Exposure) -> Result<bool, String> {
        each!(self, l => l.expose(e))
    }
}

/// Bits of an epoll token for a link's lane (a descriptor of the link).
const LANE_BITS: u32 = 16;
/// Bits of an epoll token for a link's place among its peer's links.
const LINK_BITS: u32 = 8;

/// The epoll token of descriptor `lane` of link `link` of `peer`.
pub(super) fn token(peer: usize, link: usize, lane: usize) -> u64 {
    ((peer as u64) << (LANE_BITS + LINK_BITS)) | ((link as u64) << LANE_BITS) | lane as u64
}

/// `(peer, link, lane)` of an epoll token.
pub(super) fn untoken(tok: u64) -> (usize, usize, usize) {
    (
        (tok >> (LANE_BITS + LINK_BITS)) as usize,
        ((tok >> LANE_BITS) & ((1 << LINK_BITS) - 1)) as usize,
        (tok & ((1 << LANE_BITS) - 1)) as usize,
    )
}

/// Every peer's links, by world rank.
#[derive(Debug, Default)]
pub(super) struct Links {
    peers: Vec<Vec<AnyLink>>,
    /// `(peer, link)` of the links the engine polls on every turn.
    pub(super) polled: Vec<(usize, usize)>,
    /// Peers whose connection ended while their goodbye travels on another link, since when.
    pub(super) gone: Vec<(usize, Instant)>,
    /// Peers whose traffic rings the doorbell.
    doorbell_peers: usize,
    /// Peers whose traffic fell back from their transport plug-in to their TCP link (their
    /// first), and whether there is any.
    fallen: Vec<bool>,
    any_fallen: bool,
}

/// What [`Links::fall_back`] did.
#[derive(Debug)]
pub(super) enum FellBack {
    /// The peer has no TCP link behind a plug-in: it is lost (why).
    Unable(String),
    /// It fell back, now or before, or will once the plug-in's sender is done with a frame.
    Yes,
}

impl Links {
    /// No links yet, for a world of `size` ranks.
    pub(super) fn new(size: usize) -> Links {
        Links {
            peers: (0..size).map(|_| Vec::new()).collect(),
            fallen: vec![false; size],
            ..Links::default()
        }
    }

    /// The place the next link of `peer` will have.
    pub(super) fn next_index(&self, peer: usize) -> usize {
        self.peers.get(peer).map_or(0, Vec::len)
    }

    /// Adds a link to `peer`: it carries the peer's traffic from now on (see
    /// [`Links::route`]).
    pub(super) fn add(&mut self, peer: usize, link: AnyLink) {
        let Some(links) = self.peers.get_mut(peer) else {
            return;
        };
        let was_doorbell = links.last().is_some_and(|l| l.caps().doorbell);
        if link.caps().polled {
            self.polled.push((peer, links.len()));
        }
        let doorbell = link.caps().doorbell;
        links.push(link);
        match (was_doorbell, doorbell) {
            (false, true) => self.doorbell_peers += 1,
            (true, false) => self.doorbell_peers -= 1,
            _ => {}
        }
    }

    /// The link that carries a frame of `kind` to `peer`: the last one added, unless that one
    /// cannot carry it (a goodbye needs a link whose end follows it, a wake-up one that wakes
    /// a peer in `epoll_wait`), then the first that can.
    #[inline]
    pub(super) fn route(&self, peer: usize, kind: FrameKind) -> Option<usize> {
        let links = self.peers.get(peer)?;
        let last = self.carrier(peer)?;
        let fits = |l: &AnyLink| match kind {
            FrameKind::Close => l.caps().ordered_end,
            FrameKind::Wake => l.caps().wakes_epoll,
            _ => true,
        };
        if fits(&links[last]) {
            return Some(last);
        }
        links.iter().position(fits)
    }

    /// The place of the link that carries `peer`'s messages: the last, or the first (TCP)
    /// once a plug-in fell back to it.
    #[inline]
    fn carrier(&self, peer: usize) -> Option<usize> {
        if self.any_fallen && self.fallen.get(peer) == Some(&true) {
            return Some(0);
        }
        self.peers.get(peer)?.len().checked_sub(1)
    }

    /// The link that carries `peer`'s messages.
    #[inline]
    pub(super) fn primary(&self, peer: usize) -> Option<&AnyLink> {
        self.peers.get(peer)?.get(self.carrier(peer)?)
    }

    /// The link that carries `peer`'s messages, to change.
    #[inline]
    pub(super) fn primary_mut(&mut self, peer: usize) -> Option<&mut AnyLink> {
        let l = self.carrier(peer)?;
        self.peers.get_mut(peer)?.get_mut(l)
    }

    /// The place of `peer`'s transport plug-in link, if it has one.
    pub(super) fn plugin_of(&self, peer: usize) -> Option<usize> {
        self.peers
            .get(peer)?
            .iter()
            .position(|l| matches!(l, AnyLink::Plugin(_)))
    }

    /// Moves `peer`'s traffic from its transport plug-in to the TCP link behind it, without
    /// loss (see `link/plugin.rs`); `why`: the plug-in's failure, or empty when the sender
    /// stopped as asked or the peer fell back.
    pub(super) fn fall_back(&mut self, peer: usize, why: String) -> FellBack {
        let Some(links) = self.peers.get_mut(peer) else {
            return FellBack::Unable(why);
        };
        let [AnyLink::Tcp(tcp), AnyLink::Plugin(plugin)] = links.as_mut_slice() else {
            return FellBack::Unable(why);
        };
        match plugin.give_up(why) {
            plugin::GiveUp::Unable(why) => FellBack::Unable(why),
            plugin::GiveUp::Later | plugin::GiveUp::Done => FellBack::Yes,
            plugin::GiveUp::Moved { kept, queued, why } => {
                tcp.take_over(kept, queued, &why);
                self.fallen[peer] = true;
                self.any_fallen = true;
                FellBack::Yes
            }
        }
    }

    /// What the link that carries `peer`'s messages can do.
    #[inline]
    pub(super) fn caps(&self, peer: usize) -> Option<Caps> {
        self.primary(peer).map(|l| *l.caps())
    }

    /// Link `link` of `peer`.
    #[inline]
    pub(super) fn get_mut(&mut self, peer: usize, link: usize) -> Option<&mut AnyLink> {
        self.peers.get_mut(peer)?.get_mut(link)
    }

    /// The peer's TCP connection, which every peer's list starts with.
    pub(super) fn tcp_mut(&mut self, peer: usize) -> Option<&mut tcp::TcpLink> {
        match self.peers.get_mut(peer)?.first_mut()? {
            AnyLink::Tcp(l) => Some(l),
            _ => None,
        }
    }

    /// Whether `peer` was ever used: its TCP connection is up or being made, or (a local
    /// pair without one) either side sent through shared memory or this rank posted an
    /// operation with it (a peer never used costs nothing, and is not watched).
    pub(super) fn used(&self, peer: usize) -> bool {
        match self.peers.get(peer).and_then(|l| l.first()) {
            Some(AnyLink::Tcp(l)) => l.used(),
            Some(AnyLink::Shm(l)) => l.used(),
            Some(_) => true,
            None => false,
        }
    }

    /// Whether this rank owes `peer` a goodbye at finalize: it used the peer's TCP
    /// connection, or (a local pair without one) sent it frames through shared memory.
    pub(super) fn owes_goodbye(&self, peer: usize) -> bool {
        match self.peers.get(peer).and_then(|l| l.first()) {
            Some(AnyLink::Shm(l)) => l.owes_goodbye(),
            _ => self.used(peer),
        }
    }

    /// Whether `peer` is a local peer linked by shared memory alone (no TCP connection).
    pub(super) fn shm_only(&self, peer: usize) -> bool {
        matches!(
            self.peers.get(peer).and_then(|l| l.first()),
            Some(AnyLink::Shm(_))
        )
    }

    /// Whether `peer`, a local peer without a TCP connection, finalized without ever sending
    /// to this rank (its mark stands for its goodbye: see `shm::ShmPeerLink`).
    pub(super) fn finalized_unheard(&self, peer: usize) -> bool {
        match self.peers.get(peer).and_then(|l| l.first()) {
            Some(AnyLink::Shm(l)) => l.finalized_unheard(),
            _ => false,
        }
    }

    /// Whether `peer`'s TCP connection is up (the watcher judges only such peers).
    pub(super) fn connected(&self, peer: usize) -> bool {
        match self.peers.get(peer).and_then(|l| l.first()) {
            Some(AnyLink::Tcp(l)) => l.connected(),
            Some(_) => true,
            None => false,
        }
    }

    /// The engine is about to need `peer` (see [`Link::want`]).
    #[inline]
    pub(super) fn want(&mut self, peer: usize) {
        if let Some(links) = self.peers.get_mut(peer) {
            for l in links {
                l.want();
            }
        }
    }

    /// How many links `peer` has.
    pub(super) fn count(&self, peer: usize) -> usize {
        self.peers.get(peer).map_or(0, Vec::len)
    }

    /// Whether any link of `peer` asks to be read a while before it is closed
    /// ([`Link::lingers`]).
    pub(super) fn lingers(&self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|links| links.iter().any(|l| l.lingers()))
    }

    /// Whether frames to `peer` wait in any of its links.
    pub(super) fn busy(&self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|links| links.iter().any(|l| l.busy()))
    }

    /// Whether every one of the `others` peers is reached through links that ring the
    /// doorbell (then waiters sleep on its futex rather than in `epoll_wait`).
    pub(super) fn doorbell_only(&self, others: usize) -> bool {
        others > 0 && self.doorbell_peers == others
    }

    /// Lets every operation `op` go from the links of `peer` (see [`Link::forget`]).
    pub(super) fn forget(&mut self, peer: usize, op: OpId, ops: &Ops) {
        if let Some(links) = self.peers.get_mut(peer) {
            for l in links {
                l.forget(op, ops);
            }
        }
    }

    /// Closes the sending side of every link of `peer`.
    pub(super) fn shutdown(&mut self, peer: usize) {
        if let Some(links) = self.peers.get_mut(peer) {
            for l in links {
                l.shutdown();
            }
        }
    }

    /// Closes every link of `peer` (it is lost, or the engine ends).
    pub(super) fn close(&mut self, peer: usize) {
        if let Some(links) = self.peers.get_mut(peer) {
            for l in links {
                l.close();
            }
        }
        self.gone.retain(|&(p, _)| p != peer);
    }

    /// The connection of `peer` ended while its goodbye travels on another link: the engine
    /// gives it a grace period (see `State::judge_gone`).
    pub(super) fn mark_gone(&mut self, peer: usize) {
        if !self.gone.iter().any(|&(p, _)| p == peer) {
            self.gone.push((peer, Instant::now()));
        }
    }

    /// Closes and drops every link.
    pub(super) fn clear(&mut self) {
        for peer in 0..self.peers.len() {
            self.close(peer);
        }
        self.peers.clear();
        self.polled.clear();
        self.doorbell_peers = 0;
        self.fallen.clear();
        self.any_fallen = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link that only has capabilities, for the route.
    #[derive(Debug)]
    struct Shape(Caps);

    impl Link for Shape {
        fn caps(&self) -> &Caps {
            &self.0
        }
        fn push(&mut self, _frame: OutFrame) -> bool {
            false
        }
        fn flush(&mut self, _ops: &Ops, _sent: &mut Vec<OpId>) -> Result<bool, String> {
            Ok(false)
        }
        fn busy(&self) -> bool {
            false
        }
        fn poll(&mut self, _dests: &mut Dests<'_>) -> Rx {
            Rx::Idle
        }
        fn place(
            &mut self,
            _hdr: &FrameHeader,
            _dest: Option<Dest>,
            _dests: &mut Dests<'_>,
        ) -> Result<bool, String> {
            Ok(true)
        }
        fn forget(&mut self, _op: OpId, _ops: &Ops) {}
        fn close(&mut self) {}
    }

    fn caps(kind: Kind) -> Caps {
        let tcp = kind == Kind::Tcp;
        Caps {
            kind,
            read_remote: None,
            max_payload: usize::MAX,
            ordered_end: kind != Kind::Shm,
            wakes_epoll: tcp,
            polled: !tcp,
            doorbell: kind == Kind::Shm,
            drain_on_loss: kind == Kind::Shm,
            liveness: Liveness::Frames,
        }
    }

    fn shape(kind: Kind) -> AnyLink {
        AnyLink::Test(Box::new(Shape(caps(kind))))
    }

    #[test]
    fn a_token_names_its_peer_link_and_lane() {
        for (peer, link, lane) in [(0, 0, 0), (1, 0, 15), (4095, 2, 7), (1 << 20, 255, 65535)] {
            assert_eq!(untoken(token(peer, link, lane)), (peer, link, lane));
        }
    }

    /// The last link carries the traffic; a goodbye and a wake-up take the first link that
    /// can carry them when the last cannot.
    #[test]
    fn the_route_takes_the_last_link_unless_it_cannot_carry_the_frame() {
        let mut links = Links::new(4);
        links.add(1, shape(Kind::Tcp));
        links.add(2, shape(Kind::Tcp));
        links.add(2, shape(Kind::Shm));
        links.add(3, shape(Kind::Tcp));
        links.add(3, shape(Kind::Plugin));
        let kinds = [
            FrameKind::Eager,
            FrameKind::Rts,
            FrameKind::Cts,
            FrameKind::Data,
            FrameKind::Abort,
            FrameKind::Close,
            FrameKind::Wake,
        ];
        for kind in kinds {
            assert_eq!(links.route(0, kind), None, "{kind:?}");
            assert_eq!(links.route(1, kind), Some(0), "{kind:?}");
            let local = match kind {
                FrameKind::Close | FrameKind::Wake => 0,
                _ => 1,
            };
            assert_eq!(links.route(2, kind), Some(local), "{kind:?}");
            let plugged = usize::from(kind != FrameKind::Wake);
            assert_eq!(links.route(3, kind), Some(plugged), "{kind:?}");
        }
        assert_eq!(links.polled, vec![(2, 1), (3, 1)]);
        // Only peer 2 of the three others rings the doorbell.
        assert!(!links.doorbell_only(3));
        assert!(links.doorbell_only(1));
        assert_eq!(links.caps(2).map(|c| c.kind), Some(Kind::Shm));
    }
}
