//! A link through a transport plug-in ([`crate::transport::plugin`]).
//!
//! A plug-in's `send` and `recv` block, so every peer gets two threads: a sender that hands
//! the peer's frames to `send` (header, then payload), and a receiver that loops on `recv`
//! (a 64-byte header, validated, then the payload it announces) and queues each whole frame
//! for the engine, waking it. The link hands the engine those frames as it polls, exactly as a
//! shared-memory link reads its ring, and copies outgoing frames into the sender's queue up to
//! a window of bytes, so that a slow peer holds back only its own frames and no engine lock is
//! ever held across a plug-in call.
//!
//! A peer's channel (its link and two threads) is opened on the pair's first use, as a TCP
//! link is connected: when this rank is about to send the peer a frame or wait for one from
//! it, or when the peer's TCP connection comes up (the peer used the pair first: it dials its
//! TCP connection before its first frame through the plug-in, so this rank starts receiving
//! from it then). The plug-in's API has no way to learn that a peer started sending (`recv`
//! names its source and blocks), hence the TCP connection as the signal; the plug-in's own
//! `init` still sees every rank. A rank's threads thus grow with the peers it talks to.
//!
//! A peer's receiver ends after the peer's `Close` (nothing follows it) or at the first
//! error. The TCP connection of the mesh stays open beside the plug-in: its end tells a dead
//! peer apart from one still delivering its goodbye (the engine then waits for the goodbye,
//! see `State::judge_gone`).
//!
//! **Fallback to TCP** (the seed's automatic fallback; on unless `HCOMM_FAILOVER=0`): the
//! peer's TCP link stands behind the plug-in, and a plug-in that fails (a `send` or `recv`
//! error, its link to the peer gone) moves the peer's traffic to it without loss, the same
//! way a TCP stream that dies hands its frames to another ([`super::kept`]):
//!
//! * The sender keeps every frame it handed to the plug-in, numbered in order (origin
//!   [`PLUGIN`](super::kept::PLUGIN)), until the peer acknowledges it; the peer's receiver
//!   acknowledges the frames it got every [`ACK_EVERY`] frames or [`ACK_BYTES`] bytes, with a
//!   `Wake` frame through the plug-in whose `msg_id` is the count (a `Wake` never travels
//!   through a plug-in otherwise, and never reaches the engine). A frame's send still
//!   completes when the plug-in took it.
//! * On a failure, or the engine's request (the peer fell back), the sender stops handing
//!   frames to the plug-in; the link then gives up ([`PluginLink::give_up`]): its kept frames
//!   (and those queued behind them, numbered on) go out on the TCP link with their plug-in
//!   origins, after a notice that tells the peer, then the frames never handed over, and from
//!   then on every frame to the peer takes TCP (`Links::route`). The TCP connection is the
//!   peer's usual one, made on the peer's first use (the world's mesh, through the addresses
//!   the store published): no connection is made at the failure itself, unless none was
//!   made before. It carries the failover records from the start, on one stream too.
//! * The peer, told, takes first what its plug-in had already delivered, then the frames
//!   that come again on TCP, skipping those it had ([`Handoff`]: the next number it takes,
//!   shared by its two links to the sender); and falls back too, so that the frames it sent
//!   through the plug-in and that were not acknowledged come on TCP as well.
//!
//! Nothing is lost, duplicated or reordered; the peer is lost only when the TCP link fails
//! too. Each fallback is a warning naming the peer and counted (`plugin_fallbacks`).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::kept::{Handoff, Kept, Origin, Queued};
use super::{Caps, Dests, Kind, Link, Liveness, Ops, Rx};
use crate::error::{Error, Result};
use crate::p2p::requests::frame_payload;
use crate::p2p::{Dest, Io, OpId, OutFrame, LINGER};
use crate::sync::lock;
use crate::transport::plugin::{Lease, Plugin};
use crate::transport::wire::{FrameHeader, FrameKind, HEADER_LEN};

/// Bytes of frames a peer's sender may hold before the engine keeps further frames back.
const WINDOW: usize = 4 << 20;
/// How often a closing engine looks whether its plug-in threads have ended.
const JOIN_POLL: Duration = Duration::from_millis(2);
/// Fallback: a receiver acknowledges the frames it got at least every this many frames...
const ACK_EVERY: u64 = 32;
/// ... and every this many bytes, so that what a sender keeps stays small.
const ACK_BYTES: usize = 1 << 20;

/// What a peer's threads hand the engine.
#[derive(Debug)]
enum Incoming {
    /// A whole frame the receiver got.
    Frame(FrameHeader, Vec<u8>),
    /// The sender handed a frame of this send operation to the plug-in.
    Sent(OpId),
    /// The link failed: why.
    Ended(String),
    /// The sender stopped handing frames to the plug-in, as asked (a fallback), and has none
    /// in flight.
    Stopped,
}

/// Frames on their way to the sender thread (their payloads copied, with the send
/// operation each belongs to).
#[derive(Default)]
struct Tx {
    frames: VecDeque<OutFrame>,
    /// Bytes of `frames` and of the frame being sent.
    bytes: usize,
    /// The engine kept frames back for want of room: wake it when there is some.
    blocked: bool,
    /// The world is closing: the sender stops.
    stop: bool,
    /// Fallback: the frames handed to the plug-in and not acknowledged yet.
    kept: Option<Kept>,
    /// Fallback: an acknowledgement due to the peer (frames received from it).
    ack: Option<u64>,
    /// Fallback: the sender hands the plug-in no more frames (acknowledgements still).
    stopped: bool,
    /// A frame is being handed to the plug-in.
    in_flight: bool,
}

/// One peer's channel through the plug-in, shared by the engine's link and its two threads.
pub(in crate::p2p) struct Channel {
    peer: usize,
    tx: Mutex<Tx>,
    tx_ready: Condvar,
    rx: Mutex<VecDeque<Incoming>>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Channel {
    /// Queues what the threads have for the engine, and wakes the engine if the queue was
    /// empty (otherwise a wake-up is still due from the earlier item).
    fn deliver(&self, io: &Io, item: Incoming) {
        let was_empty = {
            let mut rx = lock(&self.rx);
            let was_empty = rx.is_empty();
            rx.push_back(item);
            was_empty
        };
        io.plugin_rx.fetch_add(1, Ordering::SeqCst);
        if was_empty {
            io.wake_all();
        }
    }

    /// Everything the receiver queued so far.
    fn take_rx(&self, io: &Io) -> VecDeque<Incoming> {
        let items = std::mem::take(&mut *lock(&self.rx));
        io.plugin_rx.fetch_sub(items.len(), Ordering::SeqCst);
        items
    }

    /// Whether frames handed to the sender are not all sent yet.
    fn sending(&self) -> bool {
        lock(&self.tx).bytes > 0
    }

    /// Drops the frames not yet sent (the peer is lost).
    fn clear_tx(&self) {
        let mut tx = lock(&self.tx);
        let queued: usize = tx.frames.iter().map(|f| HEADER_LEN + f.len).sum();
        tx.frames.clear();
        tx.bytes -= queued;
    }
}

/// What the threads of all links share.
struct Common {
    name: String,
    plugin: Arc<dyn Plugin>,
    io: Arc<Io>,
}

impl Common {
    /// Runs one plug-in call; an error or a panic becomes a message saying `what` failed.
    fn call(
        &self,
        what: impl FnOnce() -> String,
        f: impl FnOnce(&dyn Plugin) -> Result<()>,
    ) -> std::result::Result<(), String> {
        let name = &self.name;
        match catch_unwind(AssertUnwindSafe(|| f(&*self.plugin))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!(
                "the transport plug-in {name:?} failed {}: {e}",
                what()
            )),
            Err(_) => Err(format!(
                "the transport plug-in {name:?} panicked {}",
                what()
            )),
        }
    }
}

/// A world's plug-in and the threads of the channels opened so far. Dropping it stops the
/// senders, finalizes the plug-in and waits (boundedly) for the threads.
pub(in crate::p2p) struct Channels {
    common: Arc<Common>,
    /// World ranks of the job.
    size: usize,
    /// The channel of each peer, once opened.
    links: Vec<Option<Arc<Channel>>>,
    threads: Vec<JoinHandle<()>>,
    /// The channels' links fall back to TCP when the plug-in fails.
    fallback: bool,
    /// Held until the threads are gone: the plug-in is free for another world then.
    _lease: Lease,
}

impl Channels {
    /// Initializes the plug-in of `lease` as rank `rank` of `size`; the channels open on
    /// demand ([`Channels::open`]); `fallback`: their links fall back to TCP when the plug-in
    /// fails (see the module docs).
    pub(in crate::p2p) fn start(
        lease: Lease,
        rank: usize,
        size: usize,
        io: &Arc<Io>,
        fallback: bool,
    ) -> Result<Channels> {
        let common = Arc::new(Common {
            name: lease.name().to_owned(),
            plugin: Arc::clone(lease.plugin()),
            io: Arc::clone(io),
        });
        common
            .call(
                || format!("starting as rank {rank} of {size}"),
                |p| p.init(rank, size),
            )
            .map_err(Error::init)?;
        Ok(Channels {
            common,
            size,
            links: vec![None; size],
            threads: Vec::new(),
            _lease: lease,
            fallback,
        })
    }

    /// Whether the channels' links fall back to TCP when the plug-in fails.
    pub(in crate::p2p) fn fallback(&self) -> bool {
        self.fallback
    }

    /// Whether the channel of world rank `peer` is open.
    pub(in crate::p2p) fn is_open(&self, peer: usize) -> bool {
        self.links.get(peer).is_some_and(Option::is_some)
    }

    /// Opens the channel of world rank `peer`: starts its sender and its receiver. An error
    /// says why the peer cannot be reached.
    pub(in crate::p2p) fn open(
        &mut self,
        peer: usize,
    ) -> std::result::Result<Arc<Channel>, String> {
        if peer >= self.size {
            return Err(format!("world rank {peer} is not in the job"));
        }
        if let Some(link) = &self.links[peer] {
            return Ok(Arc::clone(link));
        }
        let link = Arc::new(Channel {
            peer,
            tx: Mutex::new(Tx {
                kept: self.fallback.then(Kept::default),
                ..Tx::default()
            }),
            tx_ready: Condvar::new(),
            rx: Mutex::default(),
        });
        // Kept even when a thread fails to start: dropping the channels stops the other.
        self.links[peer] = Some(Arc::clone(&link));
        for (role, body) in [
            ("tx", send_loop as fn(&Common, &Channel)),
            ("rx", recv_loop),
        ] {
            let (common, chan) = (Arc::clone(&self.common), Arc::clone(&link));
            let thread = std::thread::Builder::new()
                .name(format!("hcomm-{role}-{peer}"))
                .spawn(move || body(&common, &chan))
                .map_err(|e| format!("cannot start a thread of its plug-in link: {e}"))?;
            self.threads.push(thread);
        }
        Ok(link)
    }
}

impl Drop for Channels {
    fn drop(&mut self) {
        for link in self.links.iter().flatten() {
            lock(&link.tx).stop = true;
            link.tx_ready.notify_one();
        }
        let name = &self.common.name;
        if let Err(why) = self.common.call(|| "finalizing".into(), |p| p.finalize()) {
            tracing::warn!("{why}");
        }
        let deadline = Instant::now() + LINGER;
        while self.threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(JOIN_POLL);
        }
        for t in self.threads.drain(..) {
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!(
                    "a call into the transport plug-in {name:?} did not return within {LINGER:?} \
                     after its finalize; leaving its thread behind"
                );
            }
        }
    }
}

/// What the sender does next.
enum Job {
    /// Sends an acknowledgement of this many frames (fallback).
    Ack(u64),
    /// Sends a frame.
    Frame(OutFrame),
}

/// The sender of one link: hands each queued frame to the plug-in, header then payload, and
/// the acknowledgements due (fallback).
fn send_loop(common: &Common, link: &Channel) {
    let peer = link.peer;
    let what = || format!("sending to world rank {peer}");
    loop {
        let job = {
            let mut tx = lock(&link.tx);
            loop {
                if tx.stop {
                    return;
                }
                if let Some(n) = tx.ack.take() {
                    break Job::Ack(n);
                }
                if !tx.stopped {
                    if let Some(f) = tx.frames.pop_front() {
                        tx.in_flight = true;
                        break Job::Frame(f);
                    }
                }
                tx = link.tx_ready.wait(tx).unwrap_or_else(|e| e.into_inner());
            }
        };
        let (sent, frame) = match job {
            Job::Ack(n) => {
                let mut hdr = FrameHeader::new(FrameKind::Wake);
                hdr.msg_id = n;
                (common.call(what, |p| p.send(&hdr.encode(), peer)), None)
            }
            Job::Frame(f) => {
                let payload = f.owned.as_deref().unwrap_or_default();
                let sent = common
                    .call(what, |p| p.send(&f.hdr, peer))
                    .and_then(|()| match payload.is_empty() {
                        true => Ok(()),
                        false => common.call(what, |p| p.send(payload, peer)),
                    });
                (sent, Some(f))
            }
        };
        if let Err(why) = sent {
            let mut tx = lock(&link.tx);
            tx.in_flight = false;
            match frame {
                // Delivered or not: it goes again, first, on TCP (the peer skips it if it
                // had it).
                Some(f) if tx.kept.is_some() => tx.frames.push_front(f),
                Some(f) => tx.bytes -= HEADER_LEN + f.len,
                None => {}
            }
            tx.stopped = true;
            drop(tx);
            link.deliver(&common.io, Incoming::Ended(why));
            return;
        }
        let Some(mut f) = frame else {
            continue;
        };
        // Like a TCP send once the kernel has it, a send is complete once the plug-in took
        // all its frames. The completion is queued before the frame stops counting as in
        // flight: an engine that sees nothing in flight (a peer that said goodbye is let go
        // then) finds every completion in the queue. Queued after, a completion could come
        // too late: the peer, having received the frame, could say goodbye and be let go in
        // between, failing a send that had been done.
        if let Some(id) = f.op.take() {
            link.deliver(&common.io, Incoming::Sent(id));
        }
        let (wake, stopped) = {
            let mut tx = lock(&link.tx);
            tx.in_flight = false;
            tx.bytes -= HEADER_LEN + f.len;
            if let Some(kept) = &mut tx.kept {
                let origin = Some(Origin::plugin(kept.written()));
                kept.push(Queued { f, origin });
            }
            // The engine waits for room, or (closing) for everything to be sent.
            let wake = std::mem::take(&mut tx.blocked) || tx.bytes == 0;
            (wake, tx.stopped)
        };
        if stopped {
            link.deliver(&common.io, Incoming::Stopped);
        } else if wake {
            common.io.wake_all();
        }
    }
}

/// The receiver of one link: receives whole frames and queues them for the engine, until the
/// peer's goodbye or the first error.
fn recv_loop(common: &Common, link: &Channel) {
    let peer = link.peer;
    let what = || format!("receiving from world rank {peer}");
    let fallback = lock(&link.tx).kept.is_some();
    // Frames and bytes received, and the count last acknowledged (fallback).
    let (mut got, mut bytes, mut acked) = (0u64, 0usize, 0u64);
    let why = loop {
        let mut raw = [0u8; HEADER_LEN];
        if let Err(why) = common.call(what, |p| p.recv(&mut raw, peer)) {
            break why;
        }
        // Validated before the payload is allocated: its length is bounded.
        let hdr = match FrameHeader::decode(&raw) {
            Ok(h) => h,
            Err(e) => break format!("it sent a malformed frame through the plug-in ({e})"),
        };
        if hdr.kind == FrameKind::Wake {
            // The peer's acknowledgement of the frames it got (fallback).
            let mut tx = lock(&link.tx);
            // The frame being sent may have arrived before the sender kept it.
            let in_flight = u64::from(tx.in_flight);
            let acked = tx
                .kept
                .as_mut()
                .map(|k| k.ack(hdr.msg_id, in_flight, &mut VecDeque::new()));
            if let Some(Err(written)) = acked {
                break format!(
                    "it acknowledged {} frames through the plug-in where {written} were sent",
                    hdr.msg_id
                );
            }
            continue;
        }
        let mut payload = vec![0u8; hdr.payload_len() as usize];
        if !payload.is_empty() {
            if let Err(why) = common.call(what, |p| p.recv(&mut payload, peer)) {
                break why;
            }
        }
        let last = hdr.kind == FrameKind::Close;
        bytes += HEADER_LEN + payload.len();
        link.deliver(&common.io, Incoming::Frame(hdr, payload));
        if last {
            return;
        }
        got += 1;
        if fallback && (got - acked >= ACK_EVERY || bytes >= ACK_BYTES) {
            // Queued before it is acknowledged: whatever the peer sends again after a
            // fallback comes after what is in the engine's queue already.
            (acked, bytes) = (got, 0);
            lock(&link.tx).ack = Some(got);
            link.tx_ready.notify_one();
        }
    };
    // The world closing finalized the plug-in, which ended the call: nothing failed.
    if !lock(&link.tx).stop {
        link.deliver(&common.io, Incoming::Ended(why));
    }
}

/// The link to a peer through the plug-in.
#[derive(Debug)]
pub(in crate::p2p) struct PluginLink {
    chan: Arc<Channel>,
    io: Arc<Io>,
    /// Frames waiting for room in the sender's window, in order.
    out: VecDeque<OutFrame>,
    /// What the threads queued, taken this turn.
    batch: VecDeque<Incoming>,
    /// The batch was taken this turn.
    taken: bool,
    /// The payload of the frame whose header the engine has.
    held: Option<Vec<u8>>,
    closed: bool,
    /// Fallback: the next number of the peer's plug-in frames to take, shared with the TCP
    /// link behind; the number of the next frame the receiver hands over.
    handoff: Option<Arc<Handoff>>,
    next_seq: u64,
    /// Fallback: why the link gave up, once it was asked to; whether its frames moved to
    /// TCP.
    why: Option<String>,
    fallen: bool,
    caps: Caps,
}

/// What [`PluginLink::give_up`] did.
#[derive(Debug)]
pub(super) enum GiveUp {
    /// The link has no TCP link behind it: the peer is lost (why).
    Unable(String),
    /// A frame is being handed to the plug-in: the link gives up once it was
    /// ([`Rx::FallBack`] again).
    Later,
    /// It gave up before.
    Done,
    /// It gives up now: its frames handed to the plug-in and not acknowledged, numbered, and
    /// those never handed to it go to TCP, in that order.
    Moved {
        /// The frames with their plug-in origins.
        kept: VecDeque<Queued>,
        /// The frames never copied for the plug-in.
        queued: VecDeque<OutFrame>,
        /// Why it gave up.
        why: String,
    },
}

impl PluginLink {
    /// The engine's side of `chan`; `handoff`: with a TCP link behind it (fallback), what
    /// both share.
    pub(in crate::p2p) fn new(
        chan: Arc<Channel>,
        io: &Arc<Io>,
        handoff: Option<Arc<Handoff>>,
    ) -> PluginLink {
        PluginLink {
            chan,
            io: Arc::clone(io),
            out: VecDeque::new(),
            batch: VecDeque::new(),
            taken: false,
            held: None,
            closed: false,
            handoff,
            next_seq: 0,
            why: None,
            fallen: false,
            caps: Caps {
                kind: Kind::Plugin,
                read_remote: None,
                max_payload: usize::MAX,
                // The receiver ends after the goodbye.
                ordered_end: true,
                wakes_epoll: false,
                polled: true,
                doorbell: false,
                drain_on_loss: false,
                liveness: Liveness::Connection,
            },
        }
    }

    /// Falls back to TCP (see the module docs): the sender stops, and once it has no frame
    /// in flight, the frames go to the caller for the TCP link.
    pub(super) fn give_up(&mut self, why: String) -> GiveUp {
        if self.handoff.is_none() {
            return GiveUp::Unable(why);
        }
        if self.fallen {
            return GiveUp::Done;
        }
        let why = self.why.get_or_insert(why).clone();
        let mut tx = lock(&self.chan.tx);
        tx.stopped = true;
        if tx.in_flight {
            return GiveUp::Later;
        }
        let Some(kept) = tx.kept.as_mut() else {
            return GiveUp::Unable(why);
        };
        let mut moved = kept.take();
        let first = kept.written();
        let frames = std::mem::take(&mut tx.frames);
        moved.extend((first..).zip(frames).map(|(seq, f)| Queued {
            f,
            origin: Some(Origin::plugin(seq)),
        }));
        tx.bytes = 0;
        drop(tx);
        self.fallen = true;
        GiveUp::Moved {
            kept: moved,
            queued: std::mem::take(&mut self.out),
            why,
        }
    }

    /// Takes everything the receiver queued so far into this turn's batch, whatever was
    /// taken this turn already: it comes before what the peer sends again on TCP.
    pub(in crate::p2p) fn catch_up(&mut self) {
        let more = self.chan.take_rx(&self.io);
        self.batch.extend(more);
        self.taken = true;
    }
}

impl Link for PluginLink {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn push(&mut self, frame: OutFrame) -> bool {
        self.out.push_back(frame);
        self.out.len() == 1
    }

    /// Copies the queued frames into the sender's queue while the window has room (a frame is
    /// copied whole, so that its operation may be cancelled while the copy is sent); the
    /// sender reports each frame it handed to the plug-in ([`Rx::Sent`]).
    fn flush(&mut self, ops: &Ops, _sent: &mut Vec<OpId>) -> Result<bool, String> {
        if self.closed {
            return Ok(false);
        }
        let mut moved = false;
        {
            let mut tx = lock(&self.chan.tx);
            while let Some(f) = self.out.front() {
                let size = HEADER_LEN + f.len;
                if tx.bytes > 0 && tx.bytes + size > WINDOW {
                    tx.blocked = true;
                    break;
                }
                let frame = OutFrame {
                    kind: f.kind,
                    hdr: f.hdr,
                    hdr_done: 0,
                    op: f.op,
                    off: 0,
                    len: f.len,
                    done: 0,
                    owned: Some(frame_payload(f, ops).to_vec()),
                    direct: None,
                };
                tx.bytes += size;
                tx.frames.push_back(frame);
                self.out.pop_front();
                moved = true;
            }
        }
        if moved {
            self.chan.tx_ready.notify_one();
        }
        Ok(moved)
    }

    fn busy(&self) -> bool {
        !self.out.is_empty() || self.chan.sending()
    }

    fn poll(&mut self, _dests: &mut Dests<'_>) -> Rx {
        if self.closed || self.held.is_some() {
            return Rx::Idle;
        }
        loop {
            if self.batch.is_empty() {
                // One batch a turn, so that a busy peer cannot keep the engine here.
                if std::mem::take(&mut self.taken) || self.io.plugin_rx.load(Ordering::SeqCst) == 0
                {
                    return Rx::Idle;
                }
                self.batch = self.chan.take_rx(&self.io);
                self.taken = true;
            }
            return match self.batch.pop_front() {
                None => {
                    self.taken = false;
                    Rx::Idle
                }
                Some(Incoming::Sent(id)) => Rx::Sent(id),
                Some(Incoming::Frame(hdr, payload)) => {
                    if let Some(h) = &self.handoff {
                        let seq = self.next_seq;
                        self.next_seq += 1;
                        if seq < h.next() {
                            // It came through TCP first, after the peer fell back.
                            continue;
                        }
                        h.took(seq + 1);
                    }
                    self.held = Some(payload);
                    Rx::Header(hdr)
                }
                Some(Incoming::Ended(why)) if self.handoff.is_some() => Rx::FallBack(why),
                Some(Incoming::Stopped) => Rx::FallBack(String::new()),
                // After the peer's goodbye only a send can fail: the peer is done then.
                Some(Incoming::Ended(why)) => Rx::Failed(why),
            };
        }
    }

    fn place(
        &mut self,
        hdr: &FrameHeader,
        dest: Option<Dest>,
        dests: &mut Dests<'_>,
    ) -> Result<bool, String> {
        let payload = self
            .held
            .take()
            .ok_or("a frame was placed that was never read")?;
        if let Some(dst) = dests.whole(hdr, dest) {
            dst.copy_from_slice(&payload);
        }
        Ok(true)
    }

    fn forget(&mut self, op: OpId, _ops: &Ops) {
        // Frames go whole or not at all.
        self.out.retain(|f| f.op != Some(op));
    }

    /// What the plug-in does with frames in flight when one side goes is its own: the link
    /// is read until the peer closes its side too.
    fn lingers(&self) -> bool {
        !self.closed && !self.fallen
    }

    fn close(&mut self) {
        self.closed = true;
        self.out.clear();
        self.batch.clear();
        self.chan.clear_tx();
    }
}
