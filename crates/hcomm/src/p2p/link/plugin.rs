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
//! error, which fails the peer unless it had said goodbye. The TCP connection of the mesh
//! stays open beside the plug-in: its end tells a dead peer apart from one still delivering
//! its goodbye (the engine then waits for the goodbye, see `State::judge_gone`).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// What a peer's threads hand the engine.
#[derive(Debug)]
enum Incoming {
    /// A whole frame the receiver got.
    Frame(FrameHeader, Vec<u8>),
    /// The sender handed a frame of this send operation to the plug-in.
    Sent(OpId),
    /// The link failed: why.
    Ended(String),
}

/// Frames on their way to the sender thread, with the send operation each belongs to.
#[derive(Default)]
struct Tx {
    frames: VecDeque<(Option<OpId>, Vec<u8>)>,
    /// Bytes of `frames` and of the frame being sent.
    bytes: usize,
    /// The engine kept frames back for want of room: wake it when there is some.
    blocked: bool,
    /// The world is closing: the sender stops.
    stop: bool,
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
        let queued: usize = tx.frames.iter().map(|(_, f)| f.len()).sum();
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
    /// Held until the threads are gone: the plug-in is free for another world then.
    _lease: Lease,
}

impl Channels {
    /// Initializes the plug-in of `lease` as rank `rank` of `size`; the channels open on
    /// demand ([`Channels::open`]).
    pub(in crate::p2p) fn start(
        lease: Lease,
        rank: usize,
        size: usize,
        io: &Arc<Io>,
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
        })
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
            tx: Mutex::default(),
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

/// The sender of one link: hands each queued frame to the plug-in, header then payload.
fn send_loop(common: &Common, link: &Channel) {
    loop {
        let (op, frame) = {
            let mut tx = lock(&link.tx);
            loop {
                if tx.stop {
                    return;
                }
                if let Some(f) = tx.frames.pop_front() {
                    break f;
                }
                tx = link.tx_ready.wait(tx).unwrap_or_else(|e| e.into_inner());
            }
        };
        let (hdr, payload) = frame.split_at(HEADER_LEN);
        let peer = link.peer;
        let what = || format!("sending to world rank {peer}");
        let sent =
            common
                .call(what, |p| p.send(hdr, peer))
                .and_then(|()| match payload.is_empty() {
                    true => Ok(()),
                    false => common.call(what, |p| p.send(payload, peer)),
                });
        if let Err(why) = sent {
            lock(&link.tx).bytes -= frame.len();
            link.deliver(&common.io, Incoming::Ended(why));
            return;
        }
        // Like a TCP send once the kernel has it, a send is complete once the plug-in took
        // all its frames. The completion is queued before the frame stops counting as in
        // flight: an engine that sees nothing in flight (a peer that said goodbye is let go
        // then) finds every completion in the queue. Queued after, a completion could come
        // too late: the peer, having received the frame, could say goodbye and be let go in
        // between, failing a send that had been done.
        if let Some(id) = op {
            link.deliver(&common.io, Incoming::Sent(id));
        }
        let wake = {
            let mut tx = lock(&link.tx);
            tx.bytes -= frame.len();
            // The engine waits for room, or (closing) for everything to be sent.
            std::mem::take(&mut tx.blocked) || tx.bytes == 0
        };
        if wake {
            common.io.wake_all();
        }
    }
}

/// The receiver of one link: receives whole frames and queues them for the engine, until the
/// peer's goodbye or the first error.
fn recv_loop(common: &Common, link: &Channel) {
    let peer = link.peer;
    let what = || format!("receiving from world rank {peer}");
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
        let mut payload = vec![0u8; hdr.payload_len() as usize];
        if !payload.is_empty() {
            if let Err(why) = common.call(what, |p| p.recv(&mut payload, peer)) {
                break why;
            }
        }
        let last = hdr.kind == FrameKind::Close;
        link.deliver(&common.io, Incoming::Frame(hdr, payload));
        if last {
            return;
        }
    };
    link.deliver(&common.io, Incoming::Ended(why));
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
    caps: Caps,
}

impl PluginLink {
    /// The engine's side of `chan`.
    pub(in crate::p2p) fn new(chan: Arc<Channel>, io: &Arc<Io>) -> PluginLink {
        PluginLink {
            chan,
            io: Arc::clone(io),
            out: VecDeque::new(),
            batch: VecDeque::new(),
            taken: false,
            held: None,
            closed: false,
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
                let mut frame = Vec::with_capacity(size);
                frame.extend_from_slice(&f.hdr);
                frame.extend_from_slice(frame_payload(f, ops));
                tx.bytes += size;
                tx.frames.push_back((f.op, frame));
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
        if self.batch.is_empty() {
            // One batch a turn, so that a busy peer cannot keep the engine here.
            if std::mem::take(&mut self.taken) || self.io.plugin_rx.load(Ordering::SeqCst) == 0 {
                return Rx::Idle;
            }
            self.batch = self.chan.take_rx(&self.io);
            self.taken = true;
        }
        match self.batch.pop_front() {
            None => {
                self.taken = false;
                Rx::Idle
            }
            Some(Incoming::Sent(id)) => Rx::Sent(id),
            Some(Incoming::Frame(hdr, payload)) => {
                self.held = Some(payload);
                Rx::Header(hdr)
            }
            // After the peer's goodbye only a send can fail: the peer is done then.
            Some(Incoming::Ended(why)) => Rx::Failed(why),
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
        !self.closed
    }

    fn close(&mut self) {
        self.closed = true;
        self.out.clear();
        self.batch.clear();
        self.chan.clear_tx();
    }
}
