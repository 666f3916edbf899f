//! Links through libfabric ([`crate::transport::ofi`]): one reliable-datagram endpoint per
//! world, shared by the links of every peer it reaches (a [`Hub`]).
//!
//! Each engine frame travels as one tagged message whose tag names the sender's world rank
//! and the message's kind; the receive side posts a ring of buffers that take any tag. A
//! frame's payload goes by one of three protocols, chosen by its size:
//!
//! * **eager** (up to `HCOMM_OFI_EAGER_LIMIT`, 64 KiB): header and payload are copied into a
//!   registered bounce buffer and sent as one message; the receiver copies the payload into
//!   its destination when the engine places it.
//! * **RDMA read** (up to `HCOMM_OFI_WRITE_THRESHOLD`, 1 MiB): the sender registers the
//!   payload where it lies and sends the header with the region's address and key; the
//!   receiver, told by the engine where the payload goes, `fi_read`s it straight into that
//!   buffer (in [`piece`]s, all in flight at once) and answers `ReadDone`, upon which the
//!   sender's frame counts as sent.
//! * **RDMA write** (larger): the sender announces the frame; the receiver registers the
//!   destination and answers with its address and key; the sender `fi_write`s into it (in
//!   [`piece`]s, all in flight at once) and sends a completion notice after the last
//!   (ordered after the write by `FI_ORDER_SAW`, or the write asks for delivery completion
//!   first), upon which the payload has landed. A receive given up meanwhile withdraws the
//!   destination (`WITHDRAW`: a write not posted yet is dropped) and revokes it after at most
//!   [`REVOKE_WAIT`], as an offer (below).
//!
//! * **direct** (a collective's steps above the eager limit, up to 16 MiB, when the provider
//!   orders sends after writes and `HCOMM_OFI_DIRECT` is on): the receiver offers the receive
//!   of each such step as it posts it ([`Link::expose`]: `OFFER`, with its address and key,
//!   the buffer around it registered once per call); the sender parks the step's frame (and
//!   the frames of the same call behind it) until the offer with its number came, writes the
//!   payload into it (in [`piece`]s) and sends the header after it (`PUT`), which the
//!   receiver matches as a frame whose payload is already in place. The link sends parked
//!   frames itself, in their order, as offers come; a step whose offer does not fit it goes
//!   as a plain frame. A receive given up withdraws its offer (`WITHDRAW`) and
//!   waits at most [`REVOKE_WAIT`] for the sender's answer (`WITHDRAWN`, after any write of
//!   its), polling without holding the hub, then releases the offer's registration anyway (a
//!   late write fails at the writer, for that pair only); the endpoint is never closed for it.
//!
//! Frames above the write threshold only come as rendezvous data (the engine treats frames up
//! to the threshold as eager: see `Route::Rma`), so the receiver's buffer is posted when a
//! write is announced.
//!
//! **Memory the NIC touches.** A registration lives while an operation uses it
//! ([`MrCache`]: keyed by address, length and access, counted, closed when its last user
//! ends; a second operation over the same bytes meanwhile finds it), so memory freed by its
//! owner is never left registered, and an address reused by a new allocation is registered
//! anew. Shared-memory pool memory needs none of this: the hub registers every pool block
//! whole when its memory is backed and closes the region when it goes (the hub is the pool's
//! [`BlockWatcher`]; the regions are filed in a [`BlockRegs`]), so a transfer from or to pool
//! memory finds its region by address, with no registration of its own; memory exposed to a
//! peer's writes (offers, the destinations of RDMA writes) is registered on its own
//! ([`OFFERED`]), so that it can be revoked. A receive given up withdraws what it exposed to
//! the peer's writes (`WITHDRAW`) and waits at most [`REVOKE_WAIT`] for the answer, then
//! releases the registration: a late write fails at the writer, for that pair only (a
//! limit: the tcp provider checks a write's key once, when its header comes, and places the
//! rest as it comes, so a writer stalled halfway through a write for longer than
//! [`REVOKE_WAIT`] would still finish it into the revoked bytes; hardware checks every
//! packet). This
//! rank's own RMA on an abandoned operation's buffer (a read in flight into it, a write in
//! flight from it) is drained first ([`Link::forget`], [`Link::close`]): completions are read
//! until it ends, at most [`DRAIN`]; should that pass, the endpoint is closed for every peer,
//! which stops the NIC (nothing else stops an operation the provider is carrying out: a
//! region's descriptor is not checked by the tcp provider for local buffers).
//!
//! Completions are read when the engine polls a link (every turn: the links are `polled`, and
//! the queue's wait descriptor, when the provider has one, sits in the engine's epoll set);
//! what belongs to another peer waits in that peer's queue. A read that returns fewer
//! completions than it asked for ends the poll, and the poll right after a frame was placed
//! takes the inbox without reading the queue again. The descriptor is reset (`fi_trywait`)
//! only after [`QUIET_TURNS`] asks without completions, not on every turn: each reset costs a
//! `read`, and the provider's next completion a `write`; a waiter for a small message reads
//! the link directly rather than through `epoll_wait` on most spin rounds
//! ([`Link::direct_token`]). The TCP connection of the mesh
//! stays beside the link: its end tells the engine that the peer died.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;

use super::{Caps, Dests, Exposure, Kind, Link, Liveness, Ops, Rx};
use crate::error::Result;
use crate::p2p::requests::frame_payload;
use crate::p2p::{Dest, OpId, OutFrame, ProtocolCounts};
use crate::sync::lock;
use crate::transport::ofi::blocks::BlockRegs;
use crate::transport::ofi::ffi::{
    FI_READ, FI_RECV, FI_REMOTE_READ, FI_REMOTE_WRITE, FI_SEND, FI_WRITE,
};
use crate::transport::ofi::{Completion, Endpoint, Region};
use crate::transport::shm::pool::BlockWatcher;
use crate::transport::wire::{FrameHeader, FrameKind, HEADER_LEN, MAX_EAGER};

/// Receive buffers posted at once.
const RECVS: usize = 64;
/// Bounce buffers for sends.
const BOUNCES: usize = 64;
/// Room after a header for a protocol's fields.
const EXTRA: usize = 32;
/// Eager payloads of at least this many bytes go from the sending operation's buffer itself
/// (gathered behind their header), not through a bounce buffer: the operation then completes
/// when the provider is done with its buffer, one completion-queue read later. Below it the
/// copy costs less than that read.
const FROM_BUFFER: usize = 16 << 10;
/// Longest an abandoned operation's RMA is waited for before the endpoint is closed.
pub(in crate::p2p) const DRAIN: Duration = Duration::from_secs(2);
/// Longest a receive given up waits for the peer's answer to the withdrawal of its offer
/// (which comes within a round trip from a peer that progresses) before it revokes it anyway.
const REVOKE_WAIT: Duration = Duration::from_millis(200);
/// An offer older than this is used only after what came since from the peer was read (see
/// `HubState::take_offer`): well below [`REVOKE_WAIT`].
const STALE_OFFER: Duration = Duration::from_millis(20);
/// Contexts of ended operations kept for later ones (the receives and bounce sends in flight
/// at once).
const SPARE_CTXS: usize = RECVS + BOUNCES;
/// Completion batches read per poll, so that a busy peer cannot keep the engine here.
const CQ_ROUNDS: usize = 4;
/// Completions one batch reads at most ([`Endpoint::read_cq`]).
const CQ_BATCH: usize = crate::transport::ofi::CQ_BATCH;
/// Turns without a completion before the link asks the provider whether the engine may sleep
/// on its wait descriptor (`fi_trywait`, see [`OfiLink::streaming`]).
const QUIET_TURNS: u32 = 64;
/// The longest a waiter sleeps before it polls a completion queue opened without a wait
/// descriptor (`HCOMM_OFI_CQ_WAIT=none`): nothing wakes it when a completion comes.
pub(in crate::p2p) const NAP: Duration = Duration::from_micros(100);
/// The lane of a link's direct-read token (the completion queue's descriptor is lane 0).
pub(in crate::p2p) const DIRECT_LANE: usize = 1;
/// The largest piece one RMA read or write moves: a larger payload is read or written in
/// pieces ([`piece`]), all in flight at once. Over the tcp provider one read is one response
/// on the socket, and on this kernel responses much above half a MiB stalled for milliseconds
/// where pieces did not; a 16 MiB RDMA write took 7.2-7.4 ms whole and 2.3-4.1 ms in pieces
/// of 256 KiB (ping-pong between two network namespaces, 3 interleaved rounds).
pub(in crate::p2p) const READ_PIECE: usize = 256 << 10;

/// The pieces of an RMA transfer of `len` bytes: up to [`READ_PIECE`] whole, else an eighth
/// of it (whole pages), from 64 KiB to [`READ_PIECE`]. Read ping-pong (3 interleaved rounds,
/// the namespaces above), us: 256 KiB 41-42 whole, 51-52 in 64 KiB pieces; 512 KiB 84-85 in
/// 64 KiB pieces, 100-171 in 256 KiB pieces; 1 MiB 134-145 in 128 KiB pieces, 161-338 in
/// 256 KiB pieces; from 4 MiB on 256 KiB pieces were the fastest.
fn piece(len: usize) -> usize {
    if len <= READ_PIECE {
        return len;
    }
    ((len / 8) & !4095).clamp(64 << 10, READ_PIECE)
}

/// Message kinds, in the tag's bits 32..40 (bits 0..32: the sender's world rank).
mod msg {
    /// A frame with its payload inline.
    pub(super) const FRAME: u64 = 1;
    /// A frame whose payload the receiver reads: header, address, key, token.
    pub(super) const READ: u64 = 2;
    /// The receiver read (or dropped) the payload of token.
    pub(super) const READ_DONE: u64 = 3;
    /// A frame whose payload the sender writes: header, token.
    pub(super) const WRITE: u64 = 4;
    /// Where to write token's payload: token, address, key (key `u64::MAX`: drop it).
    pub(super) const WRITE_CTS: u64 = 5;
    /// Token's payload was written.
    pub(super) const WRITE_DONE: u64 = 6;
    /// A receive offered for a direct step: communicator, tag | ordinal << 32, signature (two
    /// words), address, key (`u64::MAX`: none, send as usual), length, the receiver's token.
    pub(super) const OFFER: u64 = 7;
    /// A frame whose payload was written into the offer of token (after it: `FI_ORDER_SAW`):
    /// header, token.
    pub(super) const PUT: u64 = 8;
    /// The receiver withdraws the offer of token, or the destination of token it named in a
    /// `WRITE_CTS` (its receive was given up).
    pub(super) const WITHDRAW: u64 = 9;
    /// The sender will not write into the offer or destination of token (any write of its
    /// came first; a write already posted is answered by its `WRITE_DONE` instead).
    pub(super) const WITHDRAWN: u64 = 10;
}

/// The thresholds of the protocols.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OfiLimits {
    /// Payloads up to this go inline.
    pub eager: usize,
    /// Payloads above this are written by the sender; others read by the receiver.
    pub write: usize,
    /// Collective steps are written straight into the receive the peer offered (when the
    /// provider orders sends after writes).
    pub direct: bool,
}

/// An operation's provider context (`FI_CONTEXT2`: eight words the provider owns while the
/// operation runs), followed by what the operation is.
#[repr(C)]
struct Ctx {
    fi: [usize; 8],
    what: What,
}

#[derive(Debug, Clone, Copy)]
enum What {
    /// Receive buffer `slot`.
    Recv(usize),
    /// A send from bounce buffer `slot`, to `peer`.
    Send { slot: usize, peer: usize },
    /// A send to `peer` of a header in bounce buffer `slot` and the payload of this rank's
    /// send `token`, from the operation's buffer.
    SendFrom {
        slot: usize,
        peer: usize,
        token: u64,
    },
    /// A read for `peer`'s payload `token` (receiver's token).
    Read { peer: usize, token: u64 },
    /// A write of this rank's payload `token` to `peer`.
    Write { peer: usize, token: u64 },
    /// A write of this rank's direct step `token` into `peer`'s offer.
    Put { peer: usize, token: u64 },
}

/// Which way an RMA transfer goes.
#[derive(Debug, Clone, Copy)]
enum Rma {
    Read,
    Write,
}

/// An RMA transfer: `len` bytes at `local` (the destination of a read, the source of a
/// write; `desc` its descriptor) and at `remote` (address and key) of the peer at `dest`.
struct Span {
    local: *mut u8,
    len: usize,
    desc: *mut c_void,
    dest: u64,
    remote: (u64, u64),
}

/// A registration in use, counted.
#[derive(Debug)]
struct MrEntry {
    region: Region,
    users: usize,
}

/// Registrations of memory by (address, length, access), each closed when its last user ends.
#[derive(Debug, Default)]
struct MrCache {
    entries: HashMap<(usize, usize, u64), MrEntry>,
}

/// Key of a registration in the cache.
type MrKey = (usize, usize, u64);

/// A bit of a registration's access in its cache key, never given to the provider: memory
/// exposed to a peer's writes (the buffers around receives offered for direct steps, and the
/// destinations of RDMA writes) has registrations of its own, shared by the offers of one
/// call only (not by other transfers, nor the pool block's, which would keep pool memory
/// writable), so that once a receive given up revokes them (`HubState::revoke`) nothing keeps
/// its bytes open to the peers' writes.
const OFFERED: u64 = 1 << 63;

/// What the threads of the engine see of one peer.
#[derive(Debug, Default)]
struct PeerState {
    /// Frames from the engine not yet handed to the provider, in order.
    out: VecDeque<OutFrame>,
    /// Small protocol messages not yet handed to the provider: kind and body.
    control: VecDeque<(u64, Vec<u8>)>,
    /// Writes ready to be posted: this rank's tokens.
    writes: VecDeque<u64>,
    /// Reads ready to be posted: receiver tokens.
    reads: VecDeque<u64>,
    /// What arrived for the engine, in order.
    inbox: VecDeque<In>,
    /// Sends whose payload the peer reads, this rank writes, or the provider sends from the
    /// operation's buffer, by this rank's token.
    sending: HashMap<u64, Sending>,
    /// Payloads landing in this rank's memory, by this rank's token.
    landing: HashMap<u64, Landing>,
    /// Frames held back in order: direct steps waiting for the peer's offer, and the frames
    /// of the same communicator and tag behind them.
    parked: VecDeque<OutFrame>,
    /// The peer's offers not used yet, by communicator, tag and ordinal.
    offers: HashMap<(u64, u32, u32), Offer>,
    /// This rank's receives offered to the peer, by operation.
    offered: HashMap<OpId, Offered>,
    /// The direct step being written, when the provider took only some of its pieces.
    putting: Option<Putting>,
    /// Direct steps written, by this rank's token: pieces in flight, and whether all were
    /// posted.
    pieces: HashMap<u64, (usize, bool)>,
    next_token: u64,
    closed: bool,
}

impl PeerState {
    /// A new token for a transfer with the peer (the peer names the transfer by it).
    fn take_token(&mut self) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        token
    }
}

/// A receive the peer offered for a direct step (`msg::OFFER`).
#[derive(Debug, Clone, Copy)]
struct Offer {
    addr: u64,
    key: u64,
    len: u64,
    sig: [u64; 2],
    /// The peer's token.
    token: u64,
    /// When it came.
    at: Instant,
}

/// A direct step whose pieces are being posted.
#[derive(Debug)]
struct Putting {
    token: u64,
    /// Bytes posted.
    at: usize,
    hdr: [u8; HEADER_LEN],
    offer: Offer,
}

/// A receive of this rank offered to the peer.
#[derive(Debug)]
struct Offered {
    token: u64,
    ptr: *mut u8,
    len: usize,
    mr: Option<MrKey>,
    /// Withdrawn: the peer has not answered yet.
    withdrawn: bool,
}

// SAFETY: the pointer names a live operation's buffer, only compared, under the hub's lock.
unsafe impl Send for Offered {}

/// What the engine gets from a peer's link, in order.
#[derive(Debug)]
enum In {
    /// An eager frame, still in the receive slot it came into (header first, the payload at
    /// [`HEADER_LEN`]): copied from there into its destination, then the slot is posted again.
    Frame(FrameHeader, HeldSlot),
    /// A payload to read: address, key, the sender's token.
    Read(FrameHeader, u64, u64, u64),
    /// A payload the sender will write: its token.
    Write(FrameHeader, u64),
    /// A payload the sender wrote into this rank's offer: the offer's token.
    Put(FrameHeader, u64),
    Sent(OpId),
    /// This rank's payload `token` landed.
    Landed(u64),
    Failed(String),
}

/// The frame header at the start of message `b` from a peer.
fn header_of(b: &[u8]) -> std::result::Result<FrameHeader, String> {
    let raw: &[u8; HEADER_LEN] = b
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or("it sent a message shorter than a frame header through libfabric")?;
    FrameHeader::decode(raw)
        .map_err(|e| format!("it sent a malformed frame through libfabric ({e})"))
}

/// A receive slot that holds an eager frame the engine has not placed yet: posted again
/// once the frame is placed ([`HeldSlot::release`]); one dropped unplaced (its peer's link
/// closed) is handed back for the next progress turn to post.
#[derive(Debug)]
struct HeldSlot {
    slot: usize,
    /// The message's length (header included).
    len: usize,
    back: Option<Arc<Returned>>,
}

impl HeldSlot {
    /// The slot, which the caller posts again.
    fn release(mut self) -> usize {
        self.back = None;
        self.slot
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        if let Some(back) = self.back.take() {
            lock(&back.slots).push(self.slot);
            back.any.store(true, Ordering::Release);
        }
    }
}

/// Receive slots dropped with their frames unplaced, to post again.
#[derive(Debug, Default)]
struct Returned {
    any: AtomicBool,
    slots: Mutex<Vec<usize>>,
}

/// A send whose payload stays registered until the peer read it or this rank wrote it.
#[derive(Debug)]
struct Sending {
    op: Option<OpId>,
    ptr: *const u8,
    len: usize,
    mr: Option<MrKey>,
    /// The payload's own copy, for an operation abandoned before its write.
    owned: Option<Vec<u8>>,
    /// The peer's region to write into: address, key, and its token.
    target: Option<(u64, u64, u64)>,
    /// The peer reads the payload (else this rank writes it).
    read: bool,
    /// The write was posted (its first piece).
    posted: bool,
    /// Write: bytes whose write is posted (from the start), and the pieces in flight.
    written: usize,
    flying: usize,
}

/// A payload landing in this rank's memory.
#[derive(Debug)]
struct Landing {
    hdr: FrameHeader,
    dest: Dest,
    ptr: *mut u8,
    len: usize,
    mr: Option<MrKey>,
    /// Read: the sender's address, key and token; write: the sender's token.
    remote: (u64, u64, u64),
    read: bool,
    /// The read was posted (its first piece), or the write cleared.
    posted: bool,
    /// The payload is all there (the read completed, or the writer's notice came).
    arrived: bool,
    /// Read: bytes whose read is posted (from the start), and the pieces in flight.
    read_at: usize,
    pieces: usize,
    /// Read: a piece failed (the landing goes when the others have ended).
    broken: Option<String>,
    /// Write: its receive was given up, and the writer asked not to write (`msg::WITHDRAW`).
    withdrawn: bool,
}

impl Landing {
    /// The destination of a payload: `len` bytes at `ptr`, registered as `mr`; `remote` the
    /// peer's (address, key, token): this rank reads it (`read`; its pieces are posted
    /// later), or the peer writes it (address and key unused).
    fn new(
        hdr: FrameHeader,
        dest: Dest,
        (ptr, len): (*mut u8, usize),
        mr: Option<MrKey>,
        remote: (u64, u64, u64),
        read: bool,
    ) -> Landing {
        Landing {
            hdr,
            dest,
            ptr,
            len,
            mr,
            remote,
            read,
            posted: !read,
            arrived: false,
            read_at: 0,
            pieces: 0,
            broken: None,
            withdrawn: false,
        }
    }
}

// SAFETY: the raw pointers name operation buffers the engine keeps alive while the entries
// exist; the state is only touched under the hub's lock.
unsafe impl Send for Sending {}
// SAFETY: as above.
unsafe impl Send for Landing {}

/// The endpoint and everything its links share.
struct HubState {
    ep: Endpoint,
    rank: usize,
    /// `fi_addr_t` of each world rank (`None`: not reached through libfabric).
    addrs: Vec<Option<u64>>,
    limits: OfiLimits,
    peers: Vec<PeerState>,
    /// Receive buffers: `RECVS` slots of `slot` bytes.
    recv_buf: Vec<u8>,
    recv_mr: Option<Region>,
    /// Bounce buffers: `BOUNCES` slots of `slot` bytes.
    send_buf: Vec<u8>,
    send_mr: Option<Region>,
    free_bounces: Vec<usize>,
    slot: usize,
    /// Contexts of operations in flight.
    live: HashMap<usize, Box<Ctx>>,
    /// Receive slots whose frames were dropped unplaced, to post again.
    returned: Arc<Returned>,
    cache: MrCache,
    /// The shared-memory pool's blocks, registered whole.
    blocks: BlockRegs,
    /// Regions of pool blocks whose memory went while a transfer still named it (a peer yet
    /// to read a forgotten send's payload): address, length, region; closed once none does.
    retired: Vec<(usize, usize, Region)>,
    counts: Arc<ProtocolCounts>,
    /// The endpoint failed, or was closed: why.
    dead: Option<String>,
    /// Completions were read since a link last asked: what they brought may wait in the
    /// queue of a peer whose link was already polled this turn.
    fresh: bool,
    /// Turns without completions since the last ones (see [`OfiLink::streaming`]).
    quiet: u32,
    /// Room for the completions one read of the queue brings, kept between reads.
    done: Vec<Completion>,
    /// Contexts of operations that ended, for the next ones ([`HubState::new_ctx`]): boxed,
    /// as in `live`, where a context's address is the provider's handle on it.
    #[allow(clippy::vec_box)]
    spare: Vec<Box<Ctx>>,
}

// SAFETY: the contexts' and regions' raw pointers are only used under the hub's lock.
unsafe impl Send for HubState {}

/// A world's libfabric endpoint, shared by the links of its peers.
pub(in crate::p2p) struct Hub {
    state: Mutex<HubState>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

fn tag(kind: u64, rank: usize) -> u64 {
    (kind << 32) | rank as u64
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        w.copy_from_slice(s);
    }
    u64::from_le_bytes(w)
}

fn words(ws: &[u64]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

impl Hub {
    /// The hub of `ep` for world rank `rank`; `addrs`: each rank's endpoint address
    /// (`None`: not reached through libfabric). Posts the receive buffers.
    pub(in crate::p2p) fn start(
        mut ep: Endpoint,
        rank: usize,
        addrs: &[Option<Vec<u8>>],
        limits: OfiLimits,
        counts: Arc<ProtocolCounts>,
    ) -> Result<Hub> {
        let mut fi = Vec::with_capacity(addrs.len());
        for (r, a) in addrs.iter().enumerate() {
            fi.push(match a {
                Some(a) if r != rank => Some(ep.insert(a)?),
                _ => None,
            });
        }
        let slot = HEADER_LEN + EXTRA + limits.eager;
        let recv_buf = vec![0u8; RECVS * slot];
        let send_buf = vec![0u8; BOUNCES * slot];
        // SAFETY: both buffers live in the hub, which closes the regions before it drops them
        // (HubState's Drop).
        let (recv_mr, send_mr) = unsafe {
            (
                ep.register(recv_buf.as_ptr(), recv_buf.len(), FI_RECV)?,
                ep.register(send_buf.as_ptr(), send_buf.len(), FI_SEND)?,
            )
        };
        let mut st = HubState {
            ep,
            rank,
            addrs: fi,
            limits,
            peers: (0..addrs.len()).map(|_| PeerState::default()).collect(),
            recv_buf,
            recv_mr: Some(recv_mr),
            send_buf,
            send_mr: Some(send_mr),
            free_bounces: (0..BOUNCES).rev().collect(),
            slot,
            live: HashMap::default(),
            returned: Arc::default(),
            cache: MrCache::default(),
            blocks: BlockRegs::default(),
            retired: Vec::new(),
            counts,
            dead: None,
            fresh: false,
            quiet: 0,
            done: Vec::with_capacity(CQ_BATCH),
            spare: Vec::new(),
        };
        for s in 0..RECVS {
            st.post_recv(s)?;
        }
        Ok(Hub {
            state: Mutex::new(st),
        })
    }

    /// The completion queue's wait descriptor, for the engine's epoll set.
    pub(in crate::p2p) fn wait_fd(&self) -> Option<i32> {
        lock(&self.state).ep.wait_fd()
    }

    /// Provider, fabric and domain, for the logs.
    pub(in crate::p2p) fn describe(&self) -> String {
        let st = lock(&self.state);
        format!(
            "provider {}, fabric {}, domain {} (eager up to {} B, RDMA read up to {} B, RDMA \
             write above; completions {})",
            st.ep.provider,
            st.ep.fabric_name,
            st.ep.domain_name,
            st.limits.eager,
            st.limits.write,
            match st.ep.wait_fd() {
                Some(_) => "wake epoll",
                None => "polled",
            }
        )
    }

    /// The provider's name, for the profiler.
    pub(in crate::p2p) fn provider(&self) -> String {
        lock(&self.state).ep.provider.clone()
    }

    /// Whether world rank `peer` is reached through the endpoint.
    pub(in crate::p2p) fn reaches(&self, peer: usize) -> bool {
        lock(&self.state)
            .addrs
            .get(peer)
            .is_some_and(Option::is_some)
    }
}

/// The hub registers the shared-memory pool's blocks whole (see the module docs).
impl BlockWatcher for Hub {
    fn backed(&self, block: usize, base: *mut u8, len: usize) {
        // SAFETY: the pool keeps the block mapped until it calls `going` for it.
        unsafe { lock(&self.state).register_block(block, base, len) };
    }

    fn going(&self, block: usize) {
        lock(&self.state).release_block(block);
    }
}

impl Drop for HubState {
    fn drop(&mut self) {
        // Registrations first, while the buffers they cover are alive; the endpoint (closed
        // when `ep` drops, after this) ends every operation still in flight, and only then
        // are the contexts and buffers freed (fields drop after this body).
        for (_, e) in self.cache.entries.drain() {
            self.ep.close_mr(e.region);
        }
        let retired = std::mem::take(&mut self.retired)
            .into_iter()
            .map(|(_, _, r)| r);
        for r in self
            .blocks
            .drain()
            .collect::<Vec<_>>()
            .into_iter()
            .chain(retired)
        {
            self.ep.close_mr(r);
        }
        if let Some(r) = self.recv_mr.take() {
            self.ep.close_mr(r);
        }
        if let Some(r) = self.send_mr.take() {
            self.ep.close_mr(r);
        }
    }
}

impl HubState {
    fn post_recv(&mut self, s: usize) -> Result<()> {
        let mut ctx = self.ctx_box(What::Recv(s));
        let key = &mut *ctx as *mut Ctx as usize;
        let desc = self.recv_mr.as_ref().map_or(null_mut(), |r| r.desc);
        let slot = self.slot;
        // SAFETY: the slot lies inside `recv_buf`, which lives as long as the endpoint; the
        // context is kept in `live` until its completion.
        let posted = unsafe {
            let buf = self.recv_buf.as_mut_ptr().add(s * slot);
            self.ep.post_recv(buf, slot, desc, key as *mut c_void)?
        };
        if !posted {
            return Err(crate::error::Error::transport_failed(format!(
                "libfabric ({}): the endpoint takes fewer than {RECVS} posted receives",
                self.ep.provider
            )));
        }
        self.live.insert(key, ctx);
        Ok(())
    }

    /// Registers `len` bytes at `ptr` for `access`, or counts one more user of the region
    /// that has them; bytes of a registered pool block take its region (and `None` for a
    /// key: there is nothing to release).
    ///
    /// # Safety
    /// The memory stays valid until the matching [`HubState::unregister`].
    unsafe fn register(
        &mut self,
        ptr: *const u8,
        len: usize,
        access: u64,
    ) -> std::result::Result<(Option<MrKey>, u64, u64, *mut c_void), String> {
        if let Some(f) = self.blocks.find(ptr, len).filter(|_| access & OFFERED == 0) {
            ProtocolCounts::bump(&self.counts.ofi_mr_pool);
            return Ok((None, f.remote, f.key, f.desc));
        }
        let key = (ptr as usize, len, access);
        if let Some(e) = self.cache.entries.get_mut(&key) {
            e.users += 1;
            ProtocolCounts::bump(&self.counts.ofi_mr_hits);
            return Ok((Some(key), e.region.remote_base, e.region.key, e.region.desc));
        }
        // SAFETY: per this function's contract.
        let region = unsafe { self.ep.register(ptr, len, access & !OFFERED) }
            .map_err(|e| e.detail().to_owned())?;
        ProtocolCounts::bump(&self.counts.ofi_mr_misses);
        let out = (Some(key), region.remote_base, region.key, region.desc);
        self.cache.entries.insert(key, MrEntry { region, users: 1 });
        Ok(out)
    }

    /// One user of a registration ended: the last closes it.
    fn unregister(&mut self, key: Option<MrKey>) {
        let Some(key) = key else { return };
        if let Some(e) = self.cache.entries.get_mut(&key) {
            e.users -= 1;
            if e.users == 0 {
                if let Some(e) = self.cache.entries.remove(&key) {
                    self.ep.close_mr(e.region);
                    ProtocolCounts::bump(&self.counts.ofi_mr_invalidations);
                }
            }
        }
    }

    /// Local memory an operation uses: registered when the provider wants local regions.
    ///
    /// # Safety
    /// As [`HubState::register`].
    unsafe fn local(
        &mut self,
        ptr: *const u8,
        len: usize,
        access: u64,
    ) -> std::result::Result<(Option<MrKey>, *mut c_void), String> {
        if !self.ep.local_mr() {
            return Ok((None, null_mut()));
        }
        // SAFETY: per this function's contract.
        let (k, _, _, desc) = unsafe { self.register(ptr, len, access) }?;
        Ok((k, desc))
    }

    /// The local descriptor of the `len` bytes at `ptr`: that of registration `mr`, else of
    /// the pool block they lie in, registered or retired while a transfer names it (null
    /// without either).
    fn desc(&self, mr: Option<MrKey>, ptr: *const u8, len: usize) -> *mut c_void {
        match mr {
            Some(k) => self
                .cache
                .entries
                .get(&k)
                .map_or(null_mut(), |e| e.region.desc),
            None => match self.blocks.find(ptr, len) {
                Some(f) => f.desc,
                None => {
                    let at = ptr as usize;
                    self.retired
                        .iter()
                        .find(|(start, n, _)| at >= *start && at - start < *n)
                        .map_or(null_mut(), |(_, _, r)| r.desc)
                }
            },
        }
    }

    /// Registers pool block `block`, `len` bytes at `base`, for every operation.
    ///
    /// # Safety
    /// The memory stays mapped until [`HubState::release_block`] of the block.
    unsafe fn register_block(&mut self, block: usize, base: *mut u8, len: usize) {
        if self.dead.is_some() {
            return;
        }
        let access = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
        // SAFETY: per this function's contract.
        match unsafe { self.ep.register(base, len, access) } {
            Ok(region) => {
                self.blocks.insert(block, base, len, region);
                ProtocolCounts::bump(&self.counts.ofi_pool_blocks);
            }
            Err(e) => tracing::warn!(
                "libfabric: pool block {block} ({len} B) not registered ({}); its buffers are \
                 registered on use",
                e.detail()
            ),
        }
    }

    /// Closes pool block `block`'s registration, if it has one; while a transfer still names
    /// its memory, only once that ends ([`HubState::sweep_retired`]).
    fn release_block(&mut self, block: usize) {
        if let Some((start, len, r)) = self.blocks.remove(block) {
            self.retired.push((start, len, r));
            self.sweep_retired();
        }
    }

    /// Closes the retired pool regions that no transfer names any more: no send, landing or
    /// receive offered to a peer without a registration of its own lies in them.
    fn sweep_retired(&mut self) {
        let mut i = 0;
        while i < self.retired.len() {
            let (start, len, _) = self.retired[i];
            let inside = |p: usize| p >= start && p - start < len;
            let named = self.peers.iter().any(|p| {
                p.sending
                    .values()
                    .any(|s| s.mr.is_none() && s.owned.is_none() && inside(s.ptr as usize))
                    || p.landing
                        .values()
                        .any(|l| l.mr.is_none() && inside(l.ptr as usize))
                    || p.offered
                        .values()
                        .any(|o| o.mr.is_none() && inside(o.ptr as usize))
            });
            if named {
                i += 1;
                continue;
            }
            let (_, _, r) = self.retired.swap_remove(i);
            self.ep.close_mr(r);
            ProtocolCounts::bump(&self.counts.ofi_mr_invalidations);
        }
    }

    /// What the post of context `ctx` came to: `Ok(true)` posted; otherwise the context
    /// leaves `live` (`Ok(false)`: no room now).
    fn settle(
        &mut self,
        ctx: *mut c_void,
        posted: crate::error::Result<bool>,
    ) -> std::result::Result<bool, String> {
        if posted.as_ref().is_ok_and(|&p| p) {
            return Ok(true);
        }
        self.end_ctx(ctx as usize);
        posted.map_err(|e| e.detail().to_owned())
    }

    /// A context for an operation that is `what`: a spare one when there is.
    fn ctx_box(&mut self, what: What) -> Box<Ctx> {
        match self.spare.pop() {
            Some(mut c) => {
                *c = Ctx { fi: [0; 8], what };
                c
            }
            None => Box::new(Ctx { fi: [0; 8], what }),
        }
    }

    fn new_ctx(&mut self, what: What) -> *mut c_void {
        let mut ctx = self.ctx_box(what);
        let key = &mut *ctx as *mut Ctx as usize;
        self.live.insert(key, ctx);
        key as *mut c_void
    }

    /// What the operation of context `key` was, once the provider is done with the context
    /// (kept for a later operation); `None` for a context not in flight.
    fn end_ctx(&mut self, key: usize) -> Option<What> {
        let ctx = self.live.remove(&key)?;
        let what = ctx.what;
        if self.spare.len() < SPARE_CTXS {
            self.spare.push(ctx);
        }
        Some(what)
    }

    /// Sends `parts` (whose first bytes may be a frame header) as a message of `kind` to
    /// `peer` from a bounce buffer; `Ok(false)`: no room now.
    fn send_msg(
        &mut self,
        peer: usize,
        kind: u64,
        parts: &[&[u8]],
    ) -> std::result::Result<bool, String> {
        // SAFETY: nothing outside the bounce buffer is sent.
        unsafe { self.post_bounced(peer, kind, parts, None, |slot| What::Send { slot, peer }) }
    }

    /// Posts `parts`, copied into a bounce buffer, followed by `from` (address, length,
    /// descriptor) where it lies when given, as one message of `kind` to `peer`, its context
    /// saying `what(slot)`; `Ok(false)`: no room now (nothing posted, the slot free again).
    ///
    /// # Safety
    /// `from`'s bytes stay valid until the send completes.
    unsafe fn post_bounced(
        &mut self,
        peer: usize,
        kind: u64,
        parts: &[&[u8]],
        from: Option<(*const u8, usize, *mut c_void)>,
        what: impl FnOnce(usize) -> What,
    ) -> std::result::Result<bool, String> {
        let Some(dest) = self.addrs.get(peer).copied().flatten() else {
            return Err(format!("world rank {peer} has no libfabric address"));
        };
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let Some(slot) = self.free_bounces.pop() else {
            return Ok(false);
        };
        let start = slot * self.slot;
        let mut at = start;
        for p in parts {
            self.send_buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        let ctx = self.new_ctx(what(slot));
        let desc = self.send_mr.as_ref().map_or(null_mut(), |r| r.desc);
        // SAFETY: the bounce slot stays reserved (off the free list) and the context in
        // `live` until the send completes; `from` per this function's contract.
        let posted = unsafe {
            let bounced = (self.send_buf.as_ptr().add(start), len, desc);
            let tag = tag(kind, self.rank);
            match from {
                None => self.ep.post_send(bounced.0, len, desc, dest, tag, ctx),
                Some(from) => self.ep.post_send2([bounced, from], dest, tag, ctx),
            }
        };
        let settled = self.settle(ctx, posted);
        if settled != Ok(true) {
            self.free_bounces.push(slot);
        }
        settled
    }

    /// Sends frame header `hdr` and `payload`, the buffer of live send `op`, to `peer` as one
    /// message gathered from the header's bounce buffer and the payload where it is: the
    /// operation completes when the provider is done with its buffer (an operation forgotten
    /// meanwhile waits for that, see [`OfiLink::forget`]). `Ok(false)`: no room now.
    fn send_from(
        &mut self,
        peer: usize,
        hdr: &[u8],
        op: OpId,
        payload: &[u8],
    ) -> std::result::Result<bool, String> {
        if self.free_bounces.is_empty() {
            return Ok(false);
        }
        let (ptr, len) = (payload.as_ptr(), payload.len());
        // SAFETY: the payload is the live operation's buffer, valid until the operation ends,
        // which is after the send completes; its registration is released then.
        let (mr, desc) = unsafe { self.local(ptr, len, FI_SEND) }?;
        let token = self.peers[peer].next_token;
        let what = |slot| What::SendFrom { slot, peer, token };
        // SAFETY: as above, the payload outlives the send.
        let settled =
            unsafe { self.post_bounced(peer, msg::FRAME, &[hdr], Some((ptr, len, desc)), what) };
        if settled != Ok(true) {
            self.unregister(mr);
            return settled;
        }
        let p = &mut self.peers[peer];
        p.next_token += 1;
        p.sending.insert(
            token,
            Sending {
                op: Some(op),
                ptr,
                len,
                mr,
                owned: None,
                target: None,
                read: false,
                posted: true,
                written: 0,
                flying: 0,
            },
        );
        Ok(true)
    }

    /// The provider is done with send `token` to `peer` from an operation's buffer (header in
    /// bounce buffer `slot`), sent or failed: frees the slot and the buffer's registration;
    /// the operation, unless it was forgotten meanwhile.
    fn sent_from(&mut self, slot: usize, peer: usize, token: u64) -> Option<OpId> {
        self.free_bounces.push(slot);
        let s = self.peers[peer].sending.remove(&token)?;
        self.unregister(s.mr);
        s.op
    }

    /// Reads completions and does what each means, then posts what waited for room.
    fn progress(&mut self) {
        if self.dead.is_some() {
            return;
        }
        self.repost_returned();
        let mut done = std::mem::take(&mut self.done);
        for _ in 0..CQ_ROUNDS {
            done.clear();
            match self.ep.read_cq(&mut done) {
                Ok(()) => {}
                Err(f) => {
                    self.failed(f.context, f.why);
                    continue;
                }
            }
            if done.is_empty() {
                break;
            }
            self.fresh = true;
            for c in &done {
                self.completed(c);
            }
            if done.len() < CQ_BATCH {
                // Fewer than asked for: the queue is empty (what came since waits for the
                // next turn), and another read would only cost the provider's poll.
                break;
            }
        }
        done.clear();
        self.done = done;
        for p in 0..self.peers.len() {
            if self.peers[p].closed {
                continue;
            }
            if let Err(why) = self.push_peer(p) {
                self.fail(p, why);
            }
        }
        if !self.retired.is_empty() {
            self.sweep_retired();
        }
    }

    /// A peer's link failed: everything it has waiting is for the engine to learn.
    fn fail(&mut self, peer: usize, why: String) {
        if let Some(p) = self.peers.get_mut(peer) {
            if !p.closed {
                p.inbox.push_back(In::Failed(why));
            }
        }
    }

    fn failed(&mut self, context: usize, why: String) {
        let Some(what) = self.end_ctx(context) else {
            return;
        };
        match what {
            What::Recv(s) => {
                // A receive failed (the provider cancelled it, or a peer's message broke it):
                // post it again; the peer's connection tells whether the peer is gone.
                tracing::debug!("libfabric receive failed: {why}");
                if let Err(e) = self.post_recv(s) {
                    self.kill(format!("{why}; then {e}"));
                }
            }
            What::Send { slot, peer } => {
                self.free_bounces.push(slot);
                self.fail(peer, why);
            }
            What::SendFrom { slot, peer, token } => {
                self.sent_from(slot, peer, token);
                self.fail(peer, why);
            }
            What::Read { peer, token } => {
                let Some(l) = self.peers[peer].landing.get_mut(&token) else {
                    return;
                };
                l.pieces -= 1;
                l.broken.get_or_insert(why);
                self.read_piece_ended(peer, token);
            }
            What::Write { peer, token } | What::Put { peer, token } => {
                self.peers[peer].pieces.remove(&token);
                if let Some(s) = self.peers[peer].sending.remove(&token) {
                    self.unregister(s.mr);
                }
                self.fail(peer, why);
            }
        }
    }

    /// The endpoint cannot go on: every peer fails.
    fn kill(&mut self, why: String) {
        for p in 0..self.peers.len() {
            self.fail(p, why.clone());
        }
        self.dead = Some(why);
    }

    fn completed(&mut self, c: &Completion) {
        let Some(what) = self.end_ctx(c.context) else {
            return;
        };
        match what {
            What::Recv(s) => self.arrived(c.tag, s, c.len.min(self.slot)),
            What::Send { slot, .. } => self.free_bounces.push(slot),
            What::SendFrom { slot, peer, token } => {
                if let Some(op) = self.sent_from(slot, peer, token) {
                    self.peers[peer].inbox.push_back(In::Sent(op));
                }
            }
            What::Read { peer, token } => {
                if let Some(l) = self.peers[peer].landing.get_mut(&token) {
                    l.pieces -= 1;
                    self.read_piece_ended(peer, token);
                }
            }
            What::Write { peer, token } => {
                let p = &mut self.peers[peer];
                let Some(s) = p.sending.get_mut(&token) else {
                    return;
                };
                s.flying = s.flying.saturating_sub(1);
                if s.flying > 0 || s.written < s.len {
                    return;
                }
                let Some(s) = p.sending.remove(&token) else {
                    return;
                };
                self.unregister(s.mr);
                let p = &mut self.peers[peer];
                if let Some((_, _, theirs)) = s.target {
                    p.control.push_back((msg::WRITE_DONE, words(&[theirs])));
                }
                if let Some(op) = s.op {
                    p.inbox.push_back(In::Sent(op));
                }
            }
            What::Put { peer, token } => {
                // The notice goes after the write: the send is over once its bytes left.
                let p = &mut self.peers[peer];
                let last = match p.pieces.get_mut(&token) {
                    Some((flying, all)) => {
                        *flying = flying.saturating_sub(1);
                        *flying == 0 && *all
                    }
                    None => true,
                };
                if !last {
                    return;
                }
                p.pieces.remove(&token);
                if let Some(s) = self.peers[peer].sending.remove(&token) {
                    self.unregister(s.mr);
                    if let Some(op) = s.op {
                        self.peers[peer].inbox.push_back(In::Sent(op));
                    }
                }
            }
        }
    }

    /// Posts receive slot `s` again; the endpoint cannot go on without it.
    fn repost(&mut self, s: usize) {
        if let Err(e) = self.post_recv(s) {
            self.kill(e.detail().to_owned());
        }
    }

    /// Posts again the slots whose frames were dropped unplaced.
    fn repost_returned(&mut self) {
        if !self.returned.any.load(Ordering::Relaxed)
            || !self.returned.any.swap(false, Ordering::Acquire)
        {
            return;
        }
        let back = Arc::clone(&self.returned);
        let mut slots = lock(&back.slots);
        while let Some(s) = slots.pop() {
            if self.dead.is_some() {
                return;
            }
            self.repost(s);
        }
    }

    /// A message of `len` bytes arrived with `tag` in receive slot `s`: an eager frame stays
    /// there until the engine placed it (one copy, into its destination); any other message
    /// is read now and the slot posted again.
    fn arrived(&mut self, tag: u64, s: usize, len: usize) {
        let (kind, src) = (tag >> 32, (tag & 0xffff_ffff) as usize);
        let at = s * self.slot;
        if kind == msg::FRAME && src < self.peers.len() && !self.peers[src].closed {
            let held = HeldSlot {
                slot: s,
                len,
                back: Some(Arc::clone(&self.returned)),
            };
            let item = header_of(&self.recv_buf[at..at + len]).map(|h| In::Frame(h, held));
            self.peers[src]
                .inbox
                .push_back(item.unwrap_or_else(In::Failed));
            return;
        }
        let body = self.recv_buf[at..at + len].to_vec();
        self.repost(s);
        if src >= self.peers.len() || self.peers[src].closed {
            return;
        }
        let item = match kind {
            msg::READ => header_of(&body).map(|h| {
                In::Read(
                    h,
                    u64_at(&body, HEADER_LEN),
                    u64_at(&body, HEADER_LEN + 8),
                    u64_at(&body, HEADER_LEN + 16),
                )
            }),
            msg::WRITE => header_of(&body).map(|h| In::Write(h, u64_at(&body, HEADER_LEN))),
            msg::PUT => header_of(&body).map(|h| In::Put(h, u64_at(&body, HEADER_LEN))),
            msg::OFFER => {
                let w = |i: usize| u64_at(&body, 8 * i);
                let offer = Offer {
                    sig: [w(2), w(3)],
                    addr: w(4),
                    key: w(5),
                    len: w(6),
                    token: w(7),
                    at: Instant::now(),
                };
                let at = (w(0), w(1) as u32, (w(1) >> 32) as u32);
                self.peers[src].offers.insert(at, offer);
                return;
            }
            msg::WITHDRAW => {
                // Not used yet: it never will be; being written: no more pieces go (those in
                // flight land before the answer).
                let token = u64_at(&body, 0);
                let p = &mut self.peers[src];
                p.offers.retain(|_, o| o.token != token);
                if p.putting.as_ref().is_some_and(|u| u.offer.token == token) {
                    self.end_putting(src, true);
                }
                if !self.drop_write(src, token) {
                    // Its write is on the wire: its `WRITE_DONE` answers, after it.
                    return;
                }
                let p = &mut self.peers[src];
                p.control.push_back((msg::WITHDRAWN, words(&[token])));
                return;
            }
            msg::WITHDRAWN => {
                let token = u64_at(&body, 0);
                let p = &mut self.peers[src];
                let op = p
                    .offered
                    .iter()
                    .find(|(_, o)| o.token == token && o.withdrawn)
                    .map(|(op, _)| *op);
                if let Some(o) = op.and_then(|op| p.offered.remove(&op)) {
                    self.unregister(o.mr);
                }
                let p = &mut self.peers[src];
                if p.landing.get(&token).is_some_and(|l| l.withdrawn) {
                    if let Some(l) = p.landing.remove(&token) {
                        self.unregister(l.mr);
                    }
                }
                return;
            }
            msg::READ_DONE => {
                if let Some(s) = self.peers[src].sending.remove(&u64_at(&body, 0)) {
                    self.unregister(s.mr);
                    if let Some(op) = s.op {
                        self.peers[src].inbox.push_back(In::Sent(op));
                    }
                }
                return;
            }
            msg::WRITE_CTS => {
                let (token, addr, key, theirs) = (
                    u64_at(&body, 0),
                    u64_at(&body, 8),
                    u64_at(&body, 16),
                    u64_at(&body, 24),
                );
                let p = &mut self.peers[src];
                if key == u64::MAX {
                    // The peer drops the payload: the frame is sent.
                    if let Some(s) = p.sending.remove(&token) {
                        if let Some(op) = s.op {
                            p.inbox.push_back(In::Sent(op));
                        }
                        self.unregister(s.mr);
                    }
                } else if let Some(s) = p.sending.get_mut(&token) {
                    s.target = Some((addr, key, theirs));
                    p.writes.push_back(token);
                }
                return;
            }
            msg::WRITE_DONE => {
                let token = u64_at(&body, 0);
                if let Some(l) = self.peers[src].landing.get_mut(&token) {
                    l.arrived = true;
                    self.peers[src].inbox.push_back(In::Landed(token));
                }
                return;
            }
            _ => Err(format!(
                "it sent a message of unknown kind {kind} through libfabric"
            )),
        };
        let item = item.unwrap_or_else(In::Failed);
        self.peers[src].inbox.push_back(item);
    }

    /// The receiver `peer` gave up the destination of token (its token, from `WRITE_CTS`):
    /// a write of this rank's not posted yet is dropped, and its frame counts as sent (as when
    /// the receiver drops a payload at once). `false`: the write is posted (its `WRITE_DONE`
    /// follows it).
    fn drop_write(&mut self, peer: usize, token: u64) -> bool {
        let p = &mut self.peers[peer];
        let mine = p
            .sending
            .iter()
            .find(|(_, s)| !s.read && s.target.is_some_and(|t| t.2 == token))
            .map(|(t, s)| (*t, s.posted));
        match mine {
            None => true,
            Some((_, true)) => false,
            Some((t, false)) => {
                p.writes.retain(|&w| w != t);
                if let Some(s) = p.sending.remove(&t) {
                    if let Some(op) = s.op {
                        p.inbox.push_back(In::Sent(op));
                    }
                    self.unregister(s.mr);
                }
                true
            }
        }
    }

    /// Posts what `peer` has waiting: protocol messages, reads, writes, then frames.
    fn push_peer(&mut self, peer: usize) -> std::result::Result<(), String> {
        while let Some((kind, body)) = self.peers[peer].control.pop_front() {
            if !self.send_msg(peer, kind, &[&body])? {
                self.peers[peer].control.push_front((kind, body));
                return Ok(());
            }
        }
        while let Some(token) = self.peers[peer].reads.pop_front() {
            if !self.post_read(peer, token)? {
                self.peers[peer].reads.push_front(token);
                return Ok(());
            }
        }
        while let Some(token) = self.peers[peer].writes.pop_front() {
            if !self.post_write(peer, token)? {
                self.peers[peer].writes.push_front(token);
                return Ok(());
            }
        }
        Ok(())
    }

    /// Posts the pieces of landing `token`'s read not yet posted; `Ok(false)`: the provider
    /// took fewer than all (the rest go on a later turn).
    fn post_read(&mut self, peer: usize, token: u64) -> std::result::Result<bool, String> {
        let Some(src) = self.addrs.get(peer).copied().flatten() else {
            return Err(format!("world rank {peer} has no libfabric address"));
        };
        let Some(l) = self.peers[peer].landing.get(&token) else {
            return Ok(true);
        };
        if l.read_at >= l.len.max(1) || l.broken.is_some() {
            return Ok(true);
        }
        let span = Span {
            local: l.ptr,
            len: l.len,
            desc: self.desc(l.mr, l.ptr, l.len),
            dest: src,
            remote: (l.remote.0, l.remote.1),
        };
        // SAFETY: the destination stays valid while the landing exists (the engine keeps its
        // operation or unexpected message until the payload lands, and `forget`/`close` drain
        // the reads in flight first).
        let (at, pieces, result) =
            unsafe { self.post_pieces(Rma::Read, What::Read { peer, token }, &span, l.read_at) };
        if let Some(l) = self.peers[peer].landing.get_mut(&token) {
            l.posted |= pieces > 0;
            l.read_at = at;
            l.pieces += pieces;
        }
        result
    }

    /// Posts the pieces of `span` from byte `from` on ([`piece`]s, all in flight at once),
    /// each with a context saying `what`, while the provider takes them; returns the bytes
    /// posted by then (from the start), how many pieces this posted, and `Ok(false)` when the
    /// provider had no room for the rest (or the error of the piece it refused).
    ///
    /// # Safety
    /// `span.local` must stay valid for `span.len` bytes (for writes by a read, for reads by
    /// a write) until every piece posted completes.
    unsafe fn post_pieces(
        &mut self,
        rma: Rma,
        what: What,
        span: &Span,
        from: usize,
    ) -> (usize, usize, std::result::Result<bool, String>) {
        let (mut at, mut pieces) = (from, 0);
        while at < span.len.max(1) {
            let n = (span.len - at).min(piece(span.len));
            let ctx = self.new_ctx(what);
            let (local, addr) = (span.local.wrapping_add(at), span.remote.0 + at as u64);
            let (dest, key, desc) = (span.dest, span.remote.1, span.desc);
            // SAFETY: `local` by the caller's promise; the peer's region holds `span.len`
            // bytes from its address; the context stays in `live`.
            let posted = unsafe {
                match rma {
                    Rma::Read => self.ep.post_read(local, n, desc, dest, addr, key, ctx),
                    Rma::Write => self.ep.post_write(local, n, desc, dest, addr, key, ctx),
                }
            };
            match self.settle(ctx, posted) {
                Ok(true) => {}
                other => return (at, pieces, other),
            }
            at += n.max(1);
            pieces += 1;
        }
        (at, pieces, Ok(true))
    }

    /// A piece of landing `token`'s read ended: once the last has, the payload arrived (and
    /// the sender hears it may let its buffer go), or the landing failed.
    fn read_piece_ended(&mut self, peer: usize, token: u64) {
        let Some(l) = self.peers[peer].landing.get_mut(&token) else {
            return;
        };
        if l.pieces > 0 || (l.read_at < l.len && l.broken.is_none()) {
            return;
        }
        if let Some(why) = l.broken.take() {
            if let Some(l) = self.peers[peer].landing.remove(&token) {
                self.unregister(l.mr);
            }
            self.fail(peer, why);
            return;
        }
        l.arrived = true;
        let (mr, sender) = (l.mr.take(), l.remote.2);
        self.unregister(mr);
        let p = &mut self.peers[peer];
        p.control.push_back((msg::READ_DONE, words(&[sender])));
        p.inbox.push_back(In::Landed(token));
    }

    fn post_write(&mut self, peer: usize, token: u64) -> std::result::Result<bool, String> {
        let Some(dest) = self.addrs.get(peer).copied().flatten() else {
            return Err(format!("world rank {peer} has no libfabric address"));
        };
        let Some(s) = self.peers[peer].sending.get(&token) else {
            return Ok(true);
        };
        let Some((addr, key, _)) = s.target else {
            return Ok(true);
        };
        let (ptr, len) = match &s.owned {
            Some(v) => (v.as_ptr(), v.len()),
            None => (s.ptr, s.len),
        };
        let span = Span {
            local: ptr.cast_mut(),
            len,
            desc: self.desc(s.mr, ptr, len),
            dest,
            remote: (addr, key),
        };
        // SAFETY: the source stays valid while the send exists (its operation is live, or the
        // payload was copied into `owned` when it was abandoned before its first piece; once
        // one is posted, `forget` waits for the last).
        let (at, pieces, result) =
            unsafe { self.post_pieces(Rma::Write, What::Write { peer, token }, &span, s.written) };
        if let Some(s) = self.peers[peer].sending.get_mut(&token) {
            s.posted |= pieces > 0;
            s.written = at;
            s.flying += pieces;
        }
        result
    }

    /// Hands `peer`'s queued frames to the provider while it takes them.
    fn flush(
        &mut self,
        peer: usize,
        ops: &Ops,
        sent: &mut Vec<OpId>,
    ) -> std::result::Result<bool, String> {
        let mut moved = false;
        self.push_peer(peer)?;
        if !self.go_on_putting(peer)? {
            return Ok(moved);
        }
        moved |= self.unpark(peer, ops, sent)?;
        while let Some(f) = self.peers[peer].out.front() {
            if f.direct.is_some() || !self.peers[peer].parked.is_empty() {
                match self.divert(peer, ops)? {
                    Divert::Go => {}
                    Divert::Parked | Divert::Put => {
                        moved = true;
                        continue;
                    }
                    Divert::Full => break,
                }
            }
            // A notice queued (a direct step's `PUT`, which may wait for room) goes before
            // any frame: a frame of the same call must not overtake it.
            if !self.peers[peer].control.is_empty() {
                break;
            }
            let Some(f) = self.peers[peer].out.pop_front() else {
                break;
            };
            if !self.send_plain(peer, &f, ops, sent)? {
                self.peers[peer].out.push_front(f);
                break;
            }
            moved = true;
        }
        Ok(moved)
    }

    /// The header of `peer`'s next frame for the engine when it is a whole eager message
    /// still in its receive slot.
    fn peek_eager(&self, peer: usize) -> Option<FrameHeader> {
        let p = self.peers.get(peer)?;
        match p.inbox.front()? {
            In::Frame(h, held)
                if !p.closed
                    && h.kind == FrameKind::Eager
                    && held.len.checked_sub(HEADER_LEN) == usize::try_from(h.len).ok() =>
            {
                Some(*h)
            }
            _ => None,
        }
    }

    /// Takes `peer`'s next frame, an eager one ([`HubState::peek_eager`]), copying the first
    /// `out.len()` bytes of its payload into `out`, and posts its slot again.
    fn take_eager(&mut self, peer: usize, out: &mut [u8]) {
        let Some(p) = self.peers.get_mut(peer) else {
            return;
        };
        if let Some(In::Frame(_, held)) = p.inbox.pop_front() {
            self.land_eager(held, Some(out));
        }
    }

    /// Copies the payload of the eager frame in `held` (as much as fits) into `dst`, when it
    /// goes somewhere, and posts the slot again.
    fn land_eager(&mut self, held: HeldSlot, dst: Option<&mut [u8]>) {
        let at = held.slot * self.slot;
        if let Some(dst) = dst {
            let payload = &self.recv_buf[at + HEADER_LEN.min(held.len)..at + held.len];
            let n = dst.len().min(payload.len());
            dst[..n].copy_from_slice(&payload[..n]);
        }
        let slot = held.release();
        self.repost(slot);
    }

    /// Whether something of `peer`'s waits for the engine (or its link ended), the completion
    /// queue read first when nothing did.
    fn awaits_engine(&mut self, peer: usize) -> bool {
        if self.dead.is_some() {
            return true;
        }
        if self.peers.get(peer).is_some_and(|p| p.inbox.is_empty()) {
            self.progress();
        }
        self.peers
            .get(peer)
            .is_none_or(|p| p.closed || !p.inbox.is_empty())
    }

    /// Sends an eager frame (`hdr`, then `payload`) to `peer` at once, copied into a bounce
    /// buffer, when the peer's link is open and nothing waits to go out before it (queued
    /// frames and notices, parked direct steps, a put under way); whether it did. Otherwise
    /// nothing was sent (a provider's refusal included: the queue's turn meets it again and
    /// reports it).
    fn send_now(&mut self, peer: usize, hdr: &FrameHeader, payload: &[u8]) -> bool {
        let Some(p) = self.peers.get(peer) else {
            return false;
        };
        if self.dead.is_some()
            || p.closed
            || !p.out.is_empty()
            || !p.control.is_empty()
            || !p.parked.is_empty()
            || p.putting.is_some()
            || payload.len() > self.limits.eager
            || payload.len() >= FROM_BUFFER
        {
            return false;
        }
        if self.send_msg(peer, msg::FRAME, &[&hdr.encode(), payload]) != Ok(true) {
            return false;
        }
        if !payload.is_empty() {
            ProtocolCounts::bump(&self.counts.ofi_eager);
            ProtocolCounts::add(&self.counts.ofi_eager_bytes, payload.len());
        }
        true
    }

    /// Hands frame `f` to the provider by the protocol its size takes (eager, RDMA read, RDMA
    /// write); `Ok(false)`: no room now, nothing was sent.
    fn send_plain(
        &mut self,
        peer: usize,
        f: &OutFrame,
        ops: &Ops,
        sent: &mut Vec<OpId>,
    ) -> std::result::Result<bool, String> {
        let payload = frame_payload(f, ops);
        let (hdr, op, ptr, n) = (f.hdr, f.op, payload.as_ptr(), payload.len());
        let len = n;
        // SAFETY: the bytes `frame_payload` found: the frame's live operation's buffer (or its
        // own copy), valid through this turn.
        let payload = unsafe { std::slice::from_raw_parts(ptr, n) };
        if n <= self.limits.eager {
            let from_buffer =
                op.filter(|_| n >= FROM_BUFFER && f.owned.is_none() && self.ep.gathers());
            if let Some(op) = from_buffer {
                if !self.send_from(peer, &hdr, op, payload)? {
                    return Ok(false);
                }
                ProtocolCounts::bump(&self.counts.ofi_eager);
                ProtocolCounts::add(&self.counts.ofi_eager_bytes, n);
                return Ok(true);
            }
            if !self.send_msg(peer, msg::FRAME, &[&hdr, payload])? {
                return Ok(false);
            }
            if n > 0 {
                ProtocolCounts::bump(&self.counts.ofi_eager);
                ProtocolCounts::add(&self.counts.ofi_eager_bytes, n);
            }
            if let Some(op) = op {
                sent.push(op);
            }
            return Ok(true);
        }
        let token = self.peers[peer].next_token;
        let read = n <= self.limits.write;
        let access = if read { FI_REMOTE_READ } else { FI_WRITE };
        let (mr, base, key) = if read || self.ep.local_mr() {
            // SAFETY: the payload is the live operation's buffer; its registration is released
            // when the send ends (read done, written, or dropped by the peer), and an abandoned
            // operation's write goes from a copy (`forget`).
            let (k, base, key, _) = unsafe { self.register(ptr, len, access) }?;
            (k, base, key)
        } else {
            (None, 0, 0)
        };
        let sent_now = if read {
            self.send_msg(peer, msg::READ, &[&hdr, &words(&[base, key, token])])
        } else {
            self.send_msg(peer, msg::WRITE, &[&hdr, &words(&[token])])
        };
        match sent_now {
            Ok(true) => {}
            other => {
                self.unregister(mr);
                return other;
            }
        }
        let (c, bytes) = if read {
            (&self.counts.ofi_read, &self.counts.ofi_read_bytes)
        } else {
            (&self.counts.ofi_write, &self.counts.ofi_write_bytes)
        };
        ProtocolCounts::bump(c);
        ProtocolCounts::add(bytes, n);
        let p = &mut self.peers[peer];
        p.next_token += 1;
        p.sending.insert(
            token,
            Sending {
                op,
                ptr,
                len,
                mr,
                owned: None,
                target: None,
                read,
                posted: false,
                written: 0,
                flying: 0,
            },
        );
        Ok(true)
    }

    /// The frame at the front of `peer`'s queue when it is a direct step, or parked frames
    /// wait: parks it when it must wait for the peer's offer (its own, or one of a frame ahead
    /// of it with the same communicator and tag), writes it into the offer it has, or, when
    /// that offer cannot be used, leaves it at the front as a plain frame.
    fn divert(&mut self, peer: usize, ops: &Ops) -> std::result::Result<Divert, String> {
        if self.peers[peer].putting.is_some() {
            // A direct step that `unpark` began waits for room for the rest of its pieces: a
            // second one would take its place (its pieces and notice never posted).
            return Ok(Divert::Full);
        }
        let Some(f) = self.peers[peer].out.front() else {
            return Ok(Divert::Go);
        };
        let (key, number) = (frame_key(f), f.direct);
        let behind = key.is_some() && self.peers[peer].parked.iter().any(|g| frame_key(g) == key);
        let offer = match (number, key) {
            (Some(k), Some((comm, tag))) if !behind => self.take_offer(peer, (comm, tag, k)),
            _ => None,
        };
        let direct = number.is_some() && key.is_some();
        let p = &mut self.peers[peer];
        if behind || (direct && offer.is_none()) {
            if let Some(f) = p.out.pop_front() {
                p.parked.push_back(f);
            }
            return Ok(Divert::Parked);
        }
        // A frame of another call while frames wait parked goes as usual (taken off the queue
        // only when it is written into an offer).
        let Some(offer) = offer else {
            return Ok(Divert::Go);
        };
        let Some(mut f) = p.out.pop_front() else {
            return Ok(Divert::Go);
        };
        match self.put(peer, &f, offer, ops)? {
            Put::Done if self.peers[peer].control.is_empty() => Ok(Divert::Put),
            // The rest, or the notice, waits for room: nothing may overtake it.
            Put::Done | Put::Partial => Ok(Divert::Full),
            Put::Unusable => {
                // Its offer is spent: it goes as a plain frame (the receiver's matching then
                // reports calls that differ), not back to wait for another.
                f.direct = None;
                self.peers[peer].out.push_front(f);
                Ok(Divert::Go)
            }
        }
    }

    /// Sends what of `peer`'s parked frames may go now, in their order: direct steps whose
    /// offer came are written into it, plain frames (and direct steps whose offer cannot be
    /// used) are handed to the provider. A frame whose call has one waiting for its offer
    /// stays, as does everything once the provider has no room or a notice waits for it, so
    /// that no frame overtakes an earlier one of its call.
    fn unpark(
        &mut self,
        peer: usize,
        ops: &Ops,
        sent: &mut Vec<OpId>,
    ) -> std::result::Result<bool, String> {
        if self.peers[peer].parked.is_empty() {
            return Ok(false);
        }
        let parked = std::mem::take(&mut self.peers[peer].parked);
        let mut keep = VecDeque::new();
        let mut blocked: Vec<Option<(u64, u32)>> = Vec::new();
        let (mut moved, mut stop) = (false, false);
        for mut f in parked {
            let key = frame_key(&f);
            if stop || blocked.contains(&key) {
                keep.push_back(f);
                continue;
            }
            if let (Some(k), Some((comm, tag))) = (f.direct, key) {
                let Some(o) = self.take_offer(peer, (comm, tag, k)) else {
                    blocked.push(key);
                    keep.push_back(f);
                    continue;
                };
                match self.put(peer, &f, o, ops)? {
                    Put::Done => {
                        moved = true;
                        stop = !self.peers[peer].control.is_empty();
                        continue;
                    }
                    Put::Partial => {
                        moved = true;
                        stop = true;
                        continue;
                    }
                    Put::Unusable => f.direct = None,
                }
            }
            if !self.peers[peer].control.is_empty() || !self.send_plain(peer, &f, ops, sent)? {
                keep.push_back(f);
                stop = true;
                continue;
            }
            moved = true;
        }
        self.peers[peer].parked = keep;
        Ok(moved)
    }

    /// Takes `peer`'s offer `at` (communicator, tag, number) to write into. One that came
    /// more than [`STALE_OFFER`] ago is taken only after the completions that arrived since
    /// were read: the peer may have given up its receive meanwhile (its `WITHDRAW` waiting
    /// there), and after [`REVOKE_WAIT`] no longer keeps it registered.
    fn take_offer(&mut self, peer: usize, at: (u64, u32, u32)) -> Option<Offer> {
        if self.peers[peer].offers.get(&at)?.at.elapsed() > STALE_OFFER {
            self.progress();
        }
        self.peers[peer].offers.remove(&at)
    }

    /// Writes the payload of direct frame `f` into the peer's `offer`, then sends the frame's
    /// header after it (`FI_ORDER_SAW`: the peer has the bytes when it reads the header).
    fn put(
        &mut self,
        peer: usize,
        f: &OutFrame,
        offer: Offer,
        ops: &Ops,
    ) -> std::result::Result<Put, String> {
        let payload = frame_payload(f, ops);
        let (ptr, n) = (payload.as_ptr(), payload.len());
        let sig = [u64_at(&f.hdr, 48), u64_at(&f.hdr, 56)];
        if offer.key == u64::MAX || offer.len != n as u64 || offer.sig != sig {
            // Refused, or not this call's receive: the frame goes as any other.
            return Ok(Put::Unusable);
        }
        // SAFETY: the payload is the frame's live operation's buffer; the registration is
        // released when the write ends, and `forget` waits for a write in flight.
        let (mr, _) = unsafe { self.local(ptr, n, FI_WRITE) }?;
        ProtocolCounts::bump(&self.counts.ofi_direct);
        ProtocolCounts::add(&self.counts.ofi_direct_bytes, n);
        let p = &mut self.peers[peer];
        let token = p.take_token();
        p.sending.insert(
            token,
            Sending {
                op: f.op,
                ptr,
                len: n,
                mr,
                owned: None,
                target: Some((offer.addr, offer.key, offer.token)),
                read: false,
                posted: false,
                written: 0,
                flying: 0,
            },
        );
        p.pieces.insert(token, (0, false));
        p.putting = Some(Putting {
            token,
            at: 0,
            hdr: f.hdr,
            offer,
        });
        match self.go_on_putting(peer)? {
            true => Ok(Put::Done),
            false => Ok(Put::Partial),
        }
    }

    /// Posts the pieces of `peer`'s direct step under way ([`piece`]s, all in flight at
    /// once: single large transfers stall over the tcp provider, see [`READ_PIECE`]), then
    /// its notice; `Ok(false)`: the provider has no room for the rest now (nothing else goes
    /// to the peer meanwhile).
    fn go_on_putting(&mut self, peer: usize) -> std::result::Result<bool, String> {
        let Some(pu) = self.peers[peer].putting.take() else {
            return Ok(true);
        };
        let Some(dest) = self.addrs.get(peer).copied().flatten() else {
            return Err(format!("world rank {peer} has no libfabric address"));
        };
        let token = pu.token;
        let Some(s) = self.peers[peer].sending.get(&token) else {
            return Ok(true);
        };
        let span = Span {
            local: s.ptr.cast_mut(),
            len: s.len,
            desc: self.desc(s.mr, s.ptr, s.len),
            dest,
            remote: (pu.offer.addr, pu.offer.key),
        };
        // SAFETY: the source stays valid until its last piece completes (`forget` waits for
        // the pieces in flight and posts no more); the peer's region is the receive it
        // offered, of this length.
        let (at, pieces, result) =
            unsafe { self.post_pieces(Rma::Write, What::Put { peer, token }, &span, pu.at) };
        let p = &mut self.peers[peer];
        if pieces > 0 {
            if let Some(s) = p.sending.get_mut(&token) {
                s.posted = true;
            }
        }
        if let Some(c) = p.pieces.get_mut(&token) {
            c.0 += pieces;
        }
        if !result? {
            p.putting = Some(Putting { at, ..pu });
            return Ok(false);
        }
        if let Some(c) = p.pieces.get_mut(&token) {
            c.1 = true;
        }
        let mut notice = pu.hdr.to_vec();
        notice.extend_from_slice(&pu.offer.token.to_le_bytes());
        p.control.push_back((msg::PUT, notice));
        self.push_peer(peer)?;
        Ok(true)
    }

    /// Operation `op`'s direct step under way posts no more pieces: it ends with the last one
    /// in flight (at once when none is).
    fn abandon_put(&mut self, peer: usize, op: OpId) {
        let p = &self.peers[peer];
        let mine = p
            .putting
            .as_ref()
            .is_some_and(|u| p.sending.get(&u.token).is_some_and(|s| s.op == Some(op)));
        if mine {
            self.end_putting(peer, false);
        }
    }

    /// `peer`'s direct step under way posts no more pieces: it ends with the last one in
    /// flight, or at once when none is (then, when `sent`, its operation counts as sent: the
    /// peer gave up the receive it was written into).
    fn end_putting(&mut self, peer: usize, sent: bool) {
        let p = &mut self.peers[peer];
        let Some(token) = p.putting.take().map(|u| u.token) else {
            return;
        };
        match p.pieces.get_mut(&token) {
            Some(c) if c.0 > 0 => c.1 = true,
            _ => {
                p.pieces.remove(&token);
                if let Some(s) = p.sending.remove(&token) {
                    if let Some(op) = s.op.filter(|_| sent) {
                        p.inbox.push_back(In::Sent(op));
                    }
                    self.unregister(s.mr);
                }
            }
        }
    }

    /// Withdraws what receive `op` exposed to the peer's writes and the peer did not use yet:
    /// its offer (a direct step), and the destinations it named for RDMA writes not yet
    /// landed (`WRITE_CTS`). Tells the peer (`WITHDRAW`, once each), which answers
    /// (`WITHDRAWN`, or a write's `WRITE_DONE`) once it will not write into it, after any
    /// write of its. Whether an answer is awaited (see `OfiLink::forget`).
    fn withdraw(&mut self, peer: usize, op: OpId) -> bool {
        let p = &mut self.peers[peer];
        let mut tokens = Vec::new();
        if let Some(o) = p.offered.get_mut(&op) {
            if !std::mem::replace(&mut o.withdrawn, true) {
                tokens.push(o.token);
            }
        }
        for (t, l) in p.landing.iter_mut() {
            if writes_into(l, op) && !std::mem::replace(&mut l.withdrawn, true) {
                tokens.push(*t);
            }
        }
        for token in tokens {
            p.control.push_back((msg::WITHDRAW, words(&[token])));
        }
        if let Err(why) = self.push_peer(peer) {
            self.fail(peer, why);
        }
        !self.withdrawn(peer, op)
    }

    /// Whether what receive `op` withdrew is settled: the peer answered (the offer is gone,
    /// the writes landed or were dropped), or the peer is lost, or the endpoint.
    fn withdrawn(&self, peer: usize, op: OpId) -> bool {
        let p = &self.peers[peer];
        self.lost(peer)
            || (!p.offered.contains_key(&op) && !p.landing.values().any(|l| writes_into(l, op)))
    }

    /// Revokes what receive `op` exposed to the peer's writes, answered or not: the offer and
    /// the destinations of writes not landed; their registrations are released (an offer's
    /// closed once no other offer of its call uses it), so that a write of the peer's that
    /// comes later fails at the peer, for that peer only; the endpoint is not touched.
    fn revoke(&mut self, peer: usize, op: OpId) {
        let silent = !self.lost(peer);
        let mut keys = Vec::new();
        let p = &mut self.peers[peer];
        if let Some(o) = p.offered.remove(&op) {
            if o.withdrawn && silent {
                tracing::debug!(
                    "libfabric: world rank {peer} did not answer the withdrawal of an offered \
                     receive within {REVOKE_WAIT:?}: its registration is released"
                );
            }
            keys.push(o.mr);
        }
        let writes: Vec<u64> = p
            .landing
            .iter()
            .filter(|(_, l)| writes_into(l, op))
            .map(|(t, _)| *t)
            .collect();
        for t in writes {
            if let Some(l) = p.landing.remove(&t) {
                if silent {
                    tracing::debug!(
                        "libfabric: world rank {peer} did not answer the withdrawal of the \
                         destination of a write ({} B) within {REVOKE_WAIT:?}: its \
                         registration is released",
                        l.len
                    );
                }
                keys.push(l.mr);
            }
        }
        for k in keys {
            self.unregister(k);
        }
    }

    /// Whether `peer` is lost, or the endpoint (no answer comes then).
    fn lost(&self, peer: usize) -> bool {
        let p = &self.peers[peer];
        self.dead.is_some() || p.closed || p.inbox.iter().any(|i| matches!(i, In::Failed(_)))
    }

    /// Waits (reading completions) until `done` says so or [`DRAIN`] passes; then closes the
    /// endpoint, which stops every operation of the NIC.
    fn drain(&mut self, done: impl Fn(&HubState) -> bool) {
        let deadline = Instant::now() + DRAIN;
        while !done(self) {
            if self.dead.is_some() {
                return;
            }
            if Instant::now() >= deadline {
                let why = format!(
                    "libfabric ({}): an abandoned transfer did not end within {DRAIN:?}; the \
                     endpoint was closed so that nothing writes into its memory any more",
                    self.ep.provider
                );
                tracing::warn!("{why}");
                self.ep.close_endpoint();
                self.kill(why);
                return;
            }
            self.progress();
            std::thread::yield_now();
        }
    }
}

/// What `HubState::flush` does with a frame at the front of a queue.
enum Divert {
    /// Send it as usual.
    Go,
    /// It waits among the parked frames.
    Parked,
    /// It was written into the peer's offer.
    Put,
    /// No room now: stop for this turn.
    Full,
}

/// How writing a direct frame into an offer went.
enum Put {
    /// Written; its notice is queued.
    Done,
    /// Some of its pieces wait for room (`HubState::go_on_putting`).
    Partial,
    /// The offer does not fit the frame (refused, or another length or call).
    Unusable,
}

/// The communicator and tag of a message's first frame (eager or request to send).
fn frame_key(f: &OutFrame) -> Option<(u64, u32)> {
    match f.kind {
        FrameKind::Eager | FrameKind::Rts => Some((u64_at(&f.hdr, 8), u64_at(&f.hdr, 16) as u32)),
        _ => None,
    }
}

/// Whether `l` is the destination of an RDMA write into receive `op`'s buffer that has not
/// landed (the peer may still write into it).
fn writes_into(l: &Landing, op: OpId) -> bool {
    !l.read && !l.arrived && matches!(l.dest, Dest::Op { op: o, .. } if o == op)
}

/// A look at whether a peer's next frame came through libfabric, made by [`OfiLink`]'s
/// `cq_watch`: each look reads the completion queue.
#[derive(Debug)]
pub(in crate::p2p) struct OfiWatch {
    hub: Arc<Hub>,
    peer: usize,
}

impl OfiWatch {
    /// Whether something came for the engine from the peer (or its link ended).
    pub(in crate::p2p) fn ready(&self) -> bool {
        lock(&self.hub.state).awaits_engine(self.peer)
    }
}

/// The link to one peer through the hub.
#[derive(Debug)]
pub(in crate::p2p) struct OfiLink {
    hub: Arc<Hub>,
    peer: usize,
    /// The frame whose header the engine has.
    held: Option<In>,
    /// The next poll takes the inbox without reading the completion queue first.
    skip_progress: bool,
    /// The epoll token of the link's direct reads ([`DIRECT_LANE`]).
    direct: u64,
    caps: Caps,
    /// The sizes of the messages written straight into the peer's offers (`Link::puts`).
    puts: Option<(usize, usize)>,
    /// A read of the completion queue costs about a system call: the provider's endpoint is
    /// its own, not layered on `ofi_rxm` (whose reads progress its connections' queues too,
    /// several calls each). See `may_hold_inline`.
    cheap_reads: bool,
}

impl OfiLink {
    /// The link to world rank `peer` through `hub`; `direct`: its epoll token on
    /// [`DIRECT_LANE`].
    pub(in crate::p2p) fn new(hub: &Arc<Hub>, peer: usize, direct: u64) -> OfiLink {
        let (puts, cheap_reads) = {
            let st = lock(&hub.state);
            // The notice of a direct step must arrive after its bytes.
            let puts = (st.limits.direct && st.ep.orders_writes())
                .then_some((st.limits.eager + 1, MAX_EAGER as usize));
            (puts, !st.ep.provider.contains("ofi_rxm"))
        };
        OfiLink {
            hub: Arc::clone(hub),
            peer,
            direct,
            held: None,
            puts,
            cheap_reads,
            skip_progress: false,
            caps: Caps {
                kind: Kind::Ofi,
                read_remote: None,
                max_payload: usize::MAX,
                // Messages between a pair arrive in order (FI_ORDER_SAS): a goodbye follows
                // every frame sent before it.
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

impl OfiLink {
    /// Waits, at most [`REVOKE_WAIT`] and without holding the hub between its polls, for the
    /// peer's answer to the withdrawal of what receive `op` exposed to its writes (its offer,
    /// the destinations of its RDMA writes), after any write of its, then revokes them: a peer
    /// that does not answer (stopped, or not progressing) is not waited for longer, and should
    /// it write later, the write fails at its end.
    fn await_withdrawn(&self, op: OpId) {
        let deadline = Instant::now() + REVOKE_WAIT;
        loop {
            let mut st = lock(&self.hub.state);
            st.progress();
            if st.withdrawn(self.peer, op) || Instant::now() >= deadline {
                st.revoke(self.peer, op);
                return;
            }
            drop(st);
            std::thread::yield_now();
        }
    }
}

impl Link for OfiLink {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    /// A waiter for a small message polls the link on every turn anyway (it is `polled`):
    /// a direct read of this token saves it the `epoll_wait` of most turns (see `event`).
    fn direct_token(&self) -> Option<u64> {
        Some(self.direct)
    }

    /// An event for [`DIRECT_LANE`] comes from a waiter's direct read, after the turn polled
    /// the link: the read it causes finds the inbox without reading the queue again.
    fn event(&mut self, lane: usize, _flags: rustix::event::epoll::EventFlags) {
        if lane == DIRECT_LANE {
            self.skip_progress = true;
        }
    }

    /// An eager frame below [`FROM_BUFFER`] bytes goes to the provider at once, copied into a
    /// bounce buffer, when nothing is queued before it (`HubState::send_now`): the send is
    /// then over, with no queue and no later turn (2-rank 8 B all-reduce over libfabric's tcp
    /// provider: 4.40 against 4.56 us, 6 interleaved rounds).
    fn send_inline(&mut self, hdr: &FrameHeader, data: &[u8]) -> Option<bool> {
        lock(&self.hub.state)
            .send_now(self.peer, hdr, data)
            .then_some(false)
    }

    /// The next frame when it is a whole eager message in its receive slot: a blocking
    /// receive it matches copies it straight from there. Not inlined (nor the take): they
    /// stay out of the shared-memory receive's code, into which the link's dispatch is
    /// inlined.
    #[inline(never)]
    fn peek_inline(&self) -> Option<FrameHeader> {
        if self.held.is_some() {
            return None;
        }
        lock(&self.hub.state).peek_eager(self.peer)
    }

    #[inline(never)]
    fn take_inline(&mut self, out: &mut [u8]) {
        lock(&self.hub.state).take_eager(self.peer, out);
    }

    /// Only where the provider's reads are cheap (`OfiLink::cheap_reads`): reads the
    /// completion queue when nothing of the peer's waits in the inbox, so that a collective's
    /// receive takes a message already in the socket unposted. 2-rank 8 B all-reduce over
    /// libfabric tcp: Intel's 2.4 (its own tcp endpoint) 4.23 against 4.57 us so; Debian's
    /// 1.17 (`tcp;ofi_rxm`) 7.37 against 6.11 us reading, and 6.30 looking without reading,
    /// so it does neither there (4 and 5 interleaved rounds).
    #[inline(never)]
    fn may_hold_inline(&self) -> bool {
        self.cheap_reads && self.held.is_none() && lock(&self.hub.state).awaits_engine(self.peer)
    }

    /// A blocking receive's watch: each look reads the completion queue.
    fn cq_watch(&self) -> Option<OfiWatch> {
        self.held.is_none().then(|| OfiWatch {
            hub: Arc::clone(&self.hub),
            peer: self.peer,
        })
    }

    fn push(&mut self, frame: OutFrame) -> bool {
        let mut st = lock(&self.hub.state);
        let out = &mut st.peers[self.peer].out;
        out.push_back(frame);
        out.len() == 1
    }

    fn flush(&mut self, ops: &Ops, sent: &mut Vec<OpId>) -> std::result::Result<bool, String> {
        let mut st = lock(&self.hub.state);
        if let Some(why) = &st.dead {
            return Err(why.clone());
        }
        if st.peers[self.peer].closed {
            return Ok(false);
        }
        st.flush(self.peer, ops, sent)
    }

    /// Something arrived for the engine, or waits to go out.
    fn ready(&mut self) -> bool {
        let st = lock(&self.hub.state);
        let p = &st.peers[self.peer];
        !p.closed && (!p.inbox.is_empty() || !p.out.is_empty() || !p.control.is_empty())
    }

    /// Completions read since a link last asked (they may be waiting for a link polled
    /// earlier in the turn), RMA in flight (posted reads and writes, payloads offered to the
    /// peer's reads or being written here: the provider moves their bytes only while it is
    /// polled), direct steps under way (parked for their offer, or offered), fewer than
    /// [`QUIET_TURNS`] asks since the last completions, or work the provider holds that its
    /// wait descriptor would not announce (`fi_trywait`).
    ///
    /// `fi_trywait` is left to quiet spells because it resets the descriptor (a `read`),
    /// after which the provider's next completion sets it again (a `write`): asked on every
    /// turn, that cost a pair of system calls per message; left set while messages flow, the
    /// descriptor only keeps a sleeper's `epoll_wait` from sleeping, which no one does then.
    fn streaming(&self) -> bool {
        let mut st = lock(&self.hub.state);
        if std::mem::take(&mut st.fresh) {
            st.quiet = 0;
            return true;
        }
        let p = &st.peers[self.peer];
        // A direct step waiting for its offer, or a receive offered and not written yet: the
        // peer's next message comes soon, and a waiter that slept would add a wake-up to
        // every step (measured: 64 KiB all-reduces of two ranks 54 us polling, 120-150 us in
        // three rounds of five sleeping).
        let direct = !p.parked.is_empty() || !p.offered.is_empty();
        if !p.closed
            && (direct
                || !p.sending.is_empty()
                || p.landing.values().any(|l| l.posted && !l.arrived))
        {
            return true;
        }
        if st.quiet < QUIET_TURNS {
            st.quiet += 1;
            return true;
        }
        !st.ep.may_sleep()
    }

    fn nap(&self) -> Option<Duration> {
        lock(&self.hub.state).ep.wait_fd().is_none().then_some(NAP)
    }

    fn busy(&self) -> bool {
        let st = lock(&self.hub.state);
        let p = &st.peers[self.peer];
        !p.out.is_empty() || !p.control.is_empty() || !p.sending.is_empty() || !p.parked.is_empty()
    }

    fn puts(&self) -> Option<(usize, usize)> {
        self.puts
    }

    /// Registers the buffer around the receive (once per call: the cache counts its users)
    /// and sends the peer the receive's address and key; a buffer that cannot be registered
    /// is offered as none, so that the peer sends as usual.
    fn expose(&mut self, e: Exposure) -> std::result::Result<bool, String> {
        if self.puts.is_none() {
            return Ok(false);
        }
        let mut st = lock(&self.hub.state);
        let peer = self.peer;
        if st.peers[peer].closed {
            return Ok(false);
        }
        let at = (e.ptr as usize).wrapping_sub(e.span.0 as usize) as u64;
        // SAFETY: the span is the buffer of the receive's scope, valid until the operation
        // ends; the registration is released when the peer's notice came, or when the
        // operation is forgotten once the peer gave up the offer.
        let (offered, mr, addr, key) =
            match unsafe { st.register(e.span.0, e.span.1, FI_REMOTE_WRITE | OFFERED) } {
                Ok((k, base, key, _)) => (true, k, base + at, key),
                Err(why) => {
                    tracing::debug!("libfabric: a receive was not offered: {why}");
                    (false, None, 0, u64::MAX)
                }
            };
        let p = &mut st.peers[peer];
        let token = p.take_token();
        if offered {
            p.offered.insert(
                e.op,
                Offered {
                    token,
                    ptr: e.ptr,
                    len: e.len,
                    mr,
                    withdrawn: false,
                },
            );
        }
        let body = words(&[
            e.comm,
            u64::from(e.tag) | u64::from(e.ordinal) << 32,
            e.sig[0],
            e.sig[1],
            addr,
            key,
            e.len as u64,
            token,
        ]);
        p.control.push_back((msg::OFFER, body));
        st.push_peer(peer)?;
        Ok(true)
    }

    fn poll(&mut self, _dests: &mut Dests<'_>) -> Rx {
        if self.held.is_some() {
            return Rx::Idle;
        }
        let mut st = lock(&self.hub.state);
        if st.peers[self.peer].closed {
            return Rx::Idle;
        }
        // Right after a frame was placed (or a direct read of the turn, see `event`), what
        // the turn's completions brought is in the inbox already: no second read of the queue.
        if !std::mem::take(&mut self.skip_progress) {
            st.progress();
        }
        let p = &mut st.peers[self.peer];
        match p.inbox.pop_front() {
            None => Rx::Idle,
            Some(In::Sent(op)) => Rx::Sent(op),
            Some(In::Failed(why)) => Rx::Failed(why),
            Some(In::Landed(token)) => match p.landing.remove(&token) {
                Some(l) => {
                    let (hdr, dest, mr) = (l.hdr, l.dest, l.mr);
                    st.unregister(mr);
                    Rx::Payload(hdr, dest)
                }
                None => Rx::Idle,
            },
            Some(item) => {
                let hdr = match &item {
                    In::Frame(h, _) | In::Read(h, ..) | In::Write(h, _) | In::Put(h, _) => *h,
                    _ => return Rx::Idle,
                };
                self.held = Some(item);
                Rx::Header(hdr)
            }
        }
    }

    fn place(
        &mut self,
        hdr: &FrameHeader,
        dest: Option<Dest>,
        dests: &mut Dests<'_>,
    ) -> std::result::Result<bool, String> {
        let item = self
            .held
            .take()
            .ok_or("a frame was placed that was never read")?;
        self.skip_progress = true;
        let mut st = lock(&self.hub.state);
        let peer = self.peer;
        // A receive offered to the peer is taken by this frame: the offer ends.
        let offered = match dest {
            Some(Dest::Op { op, .. }) => st.peers[peer].offered.remove(&op),
            _ => None,
        };
        if let In::Put(_, token) = item {
            let target = dests.whole(hdr, dest).map(|d| (d.as_mut_ptr(), d.len()));
            let Some(o) = offered else {
                return match dest {
                    Some(Dest::Op { .. }) => Err(format!(
                        "it wrote a message of {} bytes for a receive it was not offered",
                        hdr.payload_len()
                    )),
                    // Its receive was given up: the bytes went nowhere it still reads.
                    _ => Ok(true),
                };
            };
            st.unregister(o.mr);
            return match target {
                Some((ptr, len)) if o.token == token && o.ptr == ptr && o.len == len => Ok(true),
                _ => Err(format!(
                    "it wrote a message of {} bytes somewhere else than the receive it matches",
                    hdr.payload_len()
                )),
            };
        }
        if let Some(o) = offered {
            st.unregister(o.mr);
        }
        match item {
            In::Frame(_, held) => {
                st.land_eager(held, dests.whole(hdr, dest));
                Ok(true)
            }
            In::Read(_, addr, key, theirs) => {
                let target = dests.whole(hdr, dest).map(|d| (d.as_mut_ptr(), d.len()));
                let (Some((ptr, len)), Some(dest)) = (target, dest) else {
                    st.peers[peer]
                        .control
                        .push_back((msg::READ_DONE, words(&[theirs])));
                    return Ok(true);
                };
                // SAFETY: the destination stays valid until the payload lands or the
                // operation is forgotten, which drains the read first.
                let (mr, _) = unsafe { st.local(ptr, len, FI_READ) }?;
                let p = &mut st.peers[peer];
                let token = p.take_token();
                let landing = Landing::new(*hdr, dest, (ptr, len), mr, (addr, key, theirs), true);
                p.landing.insert(token, landing);
                p.reads.push_back(token);
                st.push_peer(peer)?;
                Ok(false)
            }
            In::Write(_, theirs) => {
                let target = dests.whole(hdr, dest).map(|d| (d.as_mut_ptr(), d.len()));
                let (Some((ptr, len)), Some(dest)) = (target, dest) else {
                    st.peers[peer]
                        .control
                        .push_back((msg::WRITE_CTS, words(&[theirs, 0, u64::MAX, 0])));
                    return Ok(true);
                };
                // SAFETY: the destination stays valid until the payload lands or the
                // operation is forgotten, which revokes the registration first (a registration
                // of its own, not the pool block's: see `OFFERED`).
                let (mr, base, key, _) =
                    unsafe { st.register(ptr, len, FI_REMOTE_WRITE | OFFERED) }?;
                let p = &mut st.peers[peer];
                let token = p.take_token();
                let landing = Landing::new(*hdr, dest, (ptr, len), mr, (0, 0, theirs), false);
                p.landing.insert(token, landing);
                p.control
                    .push_back((msg::WRITE_CTS, words(&[theirs, base, key, token])));
                st.push_peer(peer)?;
                Ok(false)
            }
            _ => Err("a frame was placed that was never read".into()),
        }
    }

    /// Drops the operation's frames not yet sent. A send whose payload the peer reads keeps
    /// its registration until the peer says it read it (the memory is only read); one the
    /// peer waits to have written goes from a copy. What a receive exposed to the peer's
    /// writes (an offer, the destination of an RDMA write) is withdrawn and revoked within
    /// [`REVOKE_WAIT`] (see `OfiLink::await_withdrawn`); this rank's own RMA in flight on the
    /// operation's buffer (a read landing in it, a write from it) is waited for (see
    /// [`DRAIN`]).
    fn forget(&mut self, op: OpId, _ops: &Ops) {
        let peer = self.peer;
        let offered = {
            let mut st = lock(&self.hub.state);
            st.peers[peer].out.retain(|f| f.op != Some(op));
            st.peers[peer].parked.retain(|f| f.op != Some(op));
            st.abandon_put(peer, op);
            st.withdraw(peer, op)
        };
        if offered {
            self.await_withdrawn(op);
        }
        let mut st = lock(&self.hub.state);
        let mut copies = Vec::new();
        for (t, s) in st.peers[peer].sending.iter_mut() {
            if s.op == Some(op) {
                s.op = None;
                if !s.read && !s.posted && s.owned.is_none() {
                    copies.push(*t);
                }
            }
        }
        for t in copies {
            let Some(s) = st.peers[peer].sending.get(&t) else {
                continue;
            };
            // SAFETY: the operation is still live while it is forgotten: its bytes are valid.
            let copy = unsafe { std::slice::from_raw_parts(s.ptr, s.len) }.to_vec();
            let old = s.mr;
            st.unregister(old);
            let (ptr, len) = (copy.as_ptr(), copy.len());
            // SAFETY: the copy lives in the entry until the write ends.
            let mr = match unsafe { st.local(ptr, len, FI_WRITE) } {
                Ok((mr, _)) => mr,
                Err(why) => {
                    st.fail(peer, why);
                    None
                }
            };
            if let Some(s) = st.peers[peer].sending.get_mut(&t) {
                s.owned = Some(copy);
                s.ptr = ptr;
                s.mr = mr;
            }
        }
        // A write in flight from the operation's buffer reads it until it completes; a read
        // landing in it writes it until it has arrived (the peer's writes were revoked above).
        let mine = move |l: &Landing| matches!(l.dest, Dest::Op { op: o, .. } if o == op);
        let busy = move |st: &HubState| {
            let p = &st.peers[peer];
            let writing = p
                .sending
                .values()
                .any(|s| s.posted && s.owned.is_none() && s.op.is_none() && !s.read);
            let landing = p
                .landing
                .values()
                .any(|l| mine(l) && !l.arrived && l.read && l.posted);
            writing || landing
        };
        st.drain(|st| !busy(st));
        let gone: Vec<u64> = st.peers[peer]
            .landing
            .iter()
            .filter(|(_, l)| mine(l))
            .map(|(t, _)| *t)
            .collect();
        for t in gone {
            if let Some(mut l) = st.peers[peer].landing.remove(&t) {
                if l.read && !l.posted {
                    // Never read: the sender still waits to hear it may let its buffer go.
                    let theirs = l.remote.2;
                    st.peers[peer]
                        .control
                        .push_back((msg::READ_DONE, words(&[theirs])));
                }
                let mr = l.mr.take();
                st.unregister(mr);
            }
        }
    }

    /// What the provider does with messages in flight when one side goes is its own: the
    /// link is read until the peer closes its side too.
    fn lingers(&self) -> bool {
        !lock(&self.hub.state).peers[self.peer].closed
    }

    /// The peer is lost: RMA into this rank's memory is waited for (see [`DRAIN`]), then
    /// every registration made for the peer is closed.
    fn close(&mut self) {
        let mut st = lock(&self.hub.state);
        let peer = self.peer;
        if st.peers[peer].closed {
            return;
        }
        let busy = |st: &HubState| {
            let p = &st.peers[peer];
            p.landing.values().any(|l| l.read && l.posted) || p.sending.values().any(|s| s.posted)
        };
        st.drain(|st| !busy(st));
        let p = &mut st.peers[peer];
        p.closed = true;
        p.out.clear();
        p.parked.clear();
        p.offers.clear();
        p.putting = None;
        p.pieces.clear();
        p.control.clear();
        p.reads.clear();
        p.writes.clear();
        p.inbox.clear();
        let keys: Vec<Option<MrKey>> = p
            .landing
            .drain()
            .map(|(_, l)| l.mr)
            .chain(p.sending.drain().map(|(_, s)| s.mr))
            .chain(p.offered.drain().map(|(_, o)| o.mr))
            .collect();
        for k in keys {
            st.unregister(k);
        }
        self.held = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Protocol limits of the tests' hubs: eager up to 4 KiB, direct steps on.
    const LIMITS: OfiLimits = OfiLimits {
        eager: 4096,
        write: 1 << 20,
        direct: true,
    };
    /// Communicator, tag and signature of the tests' frames.
    const COMM: u64 = 0x5eed;
    const TAG: u32 = 9;
    const SIG: [u64; 2] = [0xa11, 0x7ed];

    /// Two hubs of one process, world ranks 0 and 1, each reaching the other.
    fn two_hubs() -> (Hub, Hub) {
        two_hubs_with(LIMITS)
    }

    /// [`two_hubs`] with the protocol limits `limits`.
    fn two_hubs_with(limits: OfiLimits) -> (Hub, Hub) {
        let (a, b) = (
            crate::transport::ofi::tests::open(),
            crate::transport::ofi::tests::open(),
        );
        let names = [Some(a.name().unwrap()), Some(b.name().unwrap())];
        let counts = || Arc::new(ProtocolCounts::default());
        (
            Hub::start(a, 0, &names, limits, counts()).unwrap(),
            Hub::start(b, 1, &names, limits, counts()).unwrap(),
        )
    }

    /// Sends of the tests' call to world rank 1, by operation id: the payload of send `id`
    /// is `payloads[id]`, which must outlive the operations' use.
    fn sends(payloads: &[Vec<u8>]) -> Ops {
        let target = crate::p2p::Target {
            comm: COMM,
            peer: 1,
            comm_rank: 1,
            tag: TAG,
            sig: SIG,
            seq: 0,
            epoch: 0,
        };
        (0..)
            .zip(payloads)
            .map(|(id, p)| {
                let op = crate::p2p::Op {
                    kind: crate::p2p::OpKind::Send,
                    target,
                    buf: crate::p2p::BufPtr(p.as_ptr().cast_mut()),
                    cap: p.len(),
                    remaining: 1,
                    asynchronous: false,
                    detached: None,
                    members: None,
                    result: None,
                };
                (id, op)
            })
            .collect()
    }

    /// The eager frame header of send `id` of `ops` (its message id is `id` too).
    fn header(ops: &Ops, id: OpId) -> FrameHeader {
        let mut hdr = FrameHeader::new(FrameKind::Eager);
        let len = ops[&id].cap;
        (hdr.comm, hdr.tag, hdr.sig, hdr.msg_id, hdr.len) = (COMM, TAG, SIG, id, len as u64);
        hdr
    }

    /// The eager frame of send `id` of `ops` ([`header`]); `direct`: the number of a direct
    /// step.
    fn frame(ops: &Ops, id: OpId, direct: Option<u32>) -> OutFrame {
        OutFrame {
            op: Some(id),
            len: ops[&id].cap,
            direct,
            ..OutFrame::control(header(ops, id))
        }
    }

    /// Hands `frames` to `a`'s queue for world rank 1 and flushes it.
    fn flush_frames(a: &Hub, ops: &Ops, frames: Vec<OutFrame>) {
        let mut st = lock(&a.state);
        st.peers[1].out.extend(frames);
        st.flush(1, ops, &mut Vec::new()).unwrap();
    }

    /// Progresses both hubs, flushing `a`'s queue for rank 1 (the provider takes transfers
    /// to a peer only once it connected to it), until `b` has `n` items from rank 0 for the
    /// engine (at most 10 s); returns their message ids and kinds (`'f'` inline, `'r'` to
    /// read, `'p'` written into an offer).
    fn arrivals(a: &Hub, b: &Hub, ops: &Ops, n: usize) -> Vec<(u64, char)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            {
                let mut st = lock(&a.state);
                st.progress();
                st.flush(1, ops, &mut Vec::new()).unwrap();
            }
            let mut st = lock(&b.state);
            st.progress();
            let inbox = &st.peers[0].inbox;
            if inbox.len() >= n {
                return inbox
                    .iter()
                    .map(|i| match i {
                        In::Frame(h, _) => (h.msg_id, 'f'),
                        In::Read(h, ..) => (h.msg_id, 'r'),
                        In::Put(h, _) => (h.msg_id, 'p'),
                        other => panic!("unexpected {other:?}"),
                    })
                    .collect();
            }
            assert!(Instant::now() < deadline, "only {inbox:?} arrived");
        }
    }

    /// Posted receives of `hub`.
    fn posted(hub: &Hub) -> usize {
        let st = lock(&hub.state);
        st.live
            .values()
            .filter(|c| matches!(c.what, What::Recv(_)))
            .count()
    }

    /// An eager frame stays in its receive slot until placed; frames dropped unplaced (their
    /// peer's link closed) give their slots back, posted again at the next progress turn.
    #[test]
    fn eager_frames_hold_their_slots_until_placed_or_dropped() {
        let (a, b) = two_hubs();
        let payloads = vec![vec![7u8; 100]; 3];
        let ops = sends(&payloads);
        flush_frames(&a, &ops, (0..3).map(|id| frame(&ops, id, None)).collect());
        assert_eq!(arrivals(&a, &b, &ops, 3), [(0, 'f'), (1, 'f'), (2, 'f')]);
        assert_eq!(posted(&b), RECVS - 3);
        let mut st = lock(&b.state);
        st.peers[0].inbox.clear();
        st.progress();
        drop(st);
        assert_eq!(posted(&b), RECVS);
    }

    /// A small eager frame goes to the provider at once only when nothing of the peer's waits
    /// before it (a queued frame, a queued notice) and it is below [`FROM_BUFFER`] bytes;
    /// it then arrives after what was sent before it.
    #[test]
    fn a_small_frame_goes_at_once_only_when_nothing_waits_before_it() {
        let (a, b) = two_hubs_with(OfiLimits {
            eager: 2 * FROM_BUFFER,
            ..LIMITS
        });
        let payloads = vec![vec![1u8; 8], vec![2u8; 8], vec![3u8; FROM_BUFFER]];
        let ops = sends(&payloads);
        let hdr = |id: OpId| header(&ops, id);
        {
            let mut st = lock(&a.state);
            st.peers[1].out.push_back(frame(&ops, 0, None));
            assert!(
                !st.send_now(1, &hdr(1), &payloads[1]),
                "a frame waits before it"
            );
            st.peers[1].out.clear();
            st.peers[1].control.push_back((msg::READ_DONE, words(&[0])));
            assert!(
                !st.send_now(1, &hdr(1), &payloads[1]),
                "a notice waits before it"
            );
            st.peers[1].control.clear();
            assert!(!st.send_now(1, &hdr(2), &payloads[2]), "too large to copy");
        }
        flush_frames(&a, &ops, vec![frame(&ops, 0, None)]);
        // The provider takes transfers to a peer once it connected to it: both progress.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut st = lock(&a.state);
            st.progress();
            st.flush(1, &ops, &mut Vec::new()).unwrap();
            if st.peers[1].out.is_empty() && st.send_now(1, &hdr(1), &payloads[1]) {
                break;
            }
            drop(st);
            lock(&b.state).progress();
            assert!(Instant::now() < deadline, "the provider took no frame");
        }
        assert_eq!(arrivals(&a, &b, &ops, 2), [(0, 'f'), (1, 'f')]);
        let st = lock(&b.state);
        let Some(In::Frame(h, held)) = st.peers[0].inbox.get(1) else {
            panic!("no frame second");
        };
        let at = held.slot * st.slot + HEADER_LEN;
        assert_eq!((h.len, &st.recv_buf[at..at + 8]), (8, &payloads[1][..]));
    }

    /// A blocking receive takes a whole eager frame straight from its slot (`peek_eager`,
    /// `take_eager`: the payload copied, the slot posted again); a frame of another kind
    /// (here a payload to read) is left to the engine's turn.
    #[test]
    fn an_eager_frame_is_taken_from_its_slot_and_anything_else_left_for_the_turn() {
        let (a, b) = two_hubs();
        let payloads = vec![vec![4u8; 24], vec![5u8; 8192]];
        let ops = sends(&payloads);
        flush_frames(&a, &ops, vec![frame(&ops, 0, None), frame(&ops, 1, None)]);
        assert_eq!(arrivals(&a, &b, &ops, 2), [(0, 'f'), (1, 'r')]);
        let mut st = lock(&b.state);
        let h = st.peek_eager(0).expect("the eager frame first");
        assert_eq!((h.msg_id, h.len), (0, 24));
        let mut out = [0u8; 32];
        st.take_eager(0, &mut out[..24]);
        assert_eq!(out, [&[4u8; 24][..], &[0u8; 8][..]].concat()[..]);
        assert!(
            st.peek_eager(0).is_none(),
            "a payload to read is the turn's"
        );
        assert!(matches!(st.peers[0].inbox.front(), Some(In::Read(..))));
        st.progress();
        drop(st);
        assert_eq!(posted(&b), RECVS, "the taken slot is posted again");
    }

    /// An eager payload of [`FROM_BUFFER`] bytes or more goes from the sending operation's
    /// buffer behind its header: its send is not over when the provider took it (a smaller
    /// one's is, its bytes copied), but once the provider is done with the buffer, and the
    /// bytes arrive whole.
    #[test]
    fn large_eager_payloads_go_from_the_operations_buffer_until_the_provider_is_done() {
        let (a, b) = two_hubs_with(OfiLimits {
            eager: 2 * FROM_BUFFER,
            ..LIMITS
        });
        let big: Vec<u8> = (0..FROM_BUFFER + 5).map(|i| (i % 251) as u8).collect();
        let payloads = vec![vec![3u8; 100], big.clone()];
        let ops = sends(&payloads);
        assert!(
            lock(&a.state).ep.gathers(),
            "the test provider gathers two pieces"
        );
        let mut sent = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        lock(&a.state).peers[1]
            .out
            .extend([frame(&ops, 0, None), frame(&ops, 1, None)]);
        // The provider takes transfers to a peer once it connected to it: both progress.
        while !lock(&a.state).peers[1].out.is_empty() {
            let mut st = lock(&a.state);
            st.flush(1, &ops, &mut sent).unwrap();
            st.progress();
            drop(st);
            lock(&b.state).progress();
            assert!(Instant::now() < deadline, "the provider took no frame");
        }
        assert_eq!(
            sent,
            [0],
            "the copied send is over at once, the other is not"
        );
        assert_eq!(arrivals(&a, &b, &ops, 2), [(0, 'f'), (1, 'f')]);
        {
            let st = lock(&b.state);
            let Some(In::Frame(h, held)) = st.peers[0].inbox.get(1) else {
                panic!("no frame");
            };
            let at = held.slot * st.slot + HEADER_LEN;
            assert_eq!(h.len as usize, big.len());
            assert!(
                st.recv_buf[at..at + big.len()] == big[..],
                "the payload arrived whole"
            );
        }
        loop {
            let mut st = lock(&a.state);
            st.progress();
            if st.peers[1].inbox.iter().any(|i| matches!(i, In::Sent(1))) {
                assert!(st.peers[1].sending.is_empty());
                break;
            }
            assert!(Instant::now() < deadline, "the send never completed");
        }
    }

    /// A receive of `b` offered to rank 0 for direct step `ordinal`: `len` bytes of `buf`,
    /// registered at `b` (the registration stays until `b` goes).
    fn offer(b: &Hub, buf: &mut [u8], ordinal: u32, token: u64) -> ((u64, u32, u32), Offer) {
        let mut st = lock(&b.state);
        // SAFETY: the buffers outlive the hubs in the tests.
        let (_, base, key, _) =
            unsafe { st.register(buf.as_mut_ptr(), buf.len(), FI_REMOTE_WRITE) }.unwrap();
        let o = Offer {
            addr: base,
            key,
            len: buf.len() as u64,
            sig: SIG,
            token,
            at: Instant::now(),
        };
        ((COMM, TAG, ordinal), o)
    }

    /// A direct step whose offer cannot be used (the receiver could not register its buffer,
    /// or the offer is of another call: another signature, another length) goes at once as a
    /// plain message, instead of waiting among the parked frames for an offer that never
    /// comes.
    #[test]
    fn a_direct_step_whose_offer_is_unusable_goes_as_a_plain_message() {
        let (a, b) = two_hubs();
        let refused = Offer {
            addr: 0,
            key: u64::MAX,
            len: 8192,
            sig: SIG,
            token: 1,
            at: Instant::now(),
        };
        let other_call = Offer {
            key: 5,
            sig: [1, 2],
            ..refused
        };
        let other_len = Offer {
            key: 5,
            len: 4096,
            ..refused
        };
        let payloads = vec![vec![7u8; 8192]; 3];
        let ops = sends(&payloads);
        for (k, o) in (0..).zip([refused, other_call, other_len]) {
            lock(&a.state).peers[1].offers.insert((COMM, TAG, k), o);
            flush_frames(&a, &ops, vec![frame(&ops, u64::from(k), Some(k))]);
        }
        assert_eq!(arrivals(&a, &b, &ops, 3), [(0, 'r'), (1, 'r'), (2, 'r')]);
        assert_eq!(lock(&a.state).counts.ofi_direct.load(Ordering::Relaxed), 0);
    }

    /// Frames of one call parked behind direct steps leave in their order when the offers
    /// come: a small frame between two direct steps goes after the first and before the
    /// second, never after both (the receiver matches a call's messages in order).
    #[test]
    fn parked_frames_of_one_call_leave_in_order() {
        let (a, b) = two_hubs();
        let (mut first, mut second) = (vec![0u8; 8192], vec![0u8; 8192]);
        let payloads = [vec![], vec![1u8; 8192], vec![2u8; 100], vec![3u8; 8192]];
        let ops = sends(&payloads);
        let frames = vec![
            frame(&ops, 1, Some(0)),
            frame(&ops, 2, None),
            frame(&ops, 3, Some(1)),
        ];
        flush_frames(&a, &ops, frames);
        assert_eq!(
            lock(&a.state).peers[1].parked.len(),
            3,
            "all wait for offers"
        );
        let offers = [offer(&b, &mut first, 0, 10), offer(&b, &mut second, 1, 11)];
        lock(&a.state).peers[1].offers.extend(offers);
        flush_frames(&a, &ops, Vec::new());
        assert_eq!(arrivals(&a, &b, &ops, 3), [(1, 'p'), (2, 'f'), (3, 'p')]);
        assert!(first.iter().all(|&x| x == 1) && second.iter().all(|&x| x == 3));
        drop((a, b));
    }

    /// An offer that came a while ago is used only after what came since from the peer was
    /// read: a withdrawal waiting there (the peer gave up its receive, and may no longer keep
    /// it registered) keeps the step parked instead of written into the peer's memory.
    #[test]
    fn a_stale_offer_is_not_used_once_the_peer_withdrew_it() {
        let (a, b) = two_hubs();
        let payloads = [vec![4u8; 100], vec![4u8; 8192]];
        let ops = sends(&payloads);
        // The pair connected first (a message from each side).
        flush_frames(&a, &ops, vec![frame(&ops, 0, None)]);
        assert_eq!(arrivals(&a, &b, &ops, 1), [(0, 'f')]);
        let mut buf = vec![0u8; 8192];
        let (at, mut o) = offer(&b, &mut buf, 0, 77);
        o.at = Instant::now() - 2 * STALE_OFFER;
        lock(&a.state).peers[1].offers.insert(at, o);
        {
            let mut st = lock(&b.state);
            st.peers[0].control.push_back((msg::WITHDRAW, words(&[77])));
            st.push_peer(0).unwrap();
            assert!(st.peers[0].control.is_empty(), "the withdrawal left");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&a.state).peers[1].offers.contains_key(&at) {
            // Only `b` progresses: `a` reads what came when it takes the offer.
            lock(&b.state).progress();
            std::thread::sleep(Duration::from_millis(30));
            flush_frames(&a, &ops, vec![frame(&ops, 1, Some(0))]);
            let st = lock(&a.state);
            assert_eq!(st.counts.ofi_direct.load(Ordering::Relaxed), 0, "written");
            assert!(Instant::now() < deadline, "the withdrawal never came");
        }
        assert!(buf.iter().all(|&x| x == 0));
    }

    /// [`two_hubs`], the first shared, and its link to world rank 1.
    fn receiver() -> (Arc<Hub>, Hub, OfiLink) {
        let (a, b) = two_hubs();
        let a = Arc::new(a);
        let link = OfiLink::new(&a, 1, 0);
        (a, b, link)
    }

    /// `link` (to world rank 1, on `a`) forgets receive `op` within 500 ms (well below the 2 s
    /// of `DRAIN`), leaving the endpoint alive and no registration open.
    fn forget_quickly(a: &Hub, link: &mut OfiLink, op: OpId) {
        let t0 = Instant::now();
        link.forget(op, &Ops::default());
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(500), "forget took {took:?}");
        let st = lock(&a.state);
        assert!(st.dead.is_none(), "{:?}", st.dead);
        assert!(st.cache.entries.is_empty(), "the registration is closed");
    }

    /// A receive offered to a peer that does not answer (it does not progress) and then given
    /// up is revoked after a short wait (`REVOKE_WAIT`, not the 2 s of `DRAIN`): its
    /// registration is closed (a late write of the peer would fail at the peer), and the
    /// endpoint is not, so it still carries messages; the peer, when it progresses, drops the
    /// offer.
    #[test]
    fn a_receive_given_up_revokes_its_offer_without_waiting_for_a_silent_peer() {
        let (a, b, mut link) = receiver();
        let mut buf = vec![0u8; 1 << 16];
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        let e = Exposure {
            op: 42,
            ptr: ptr.wrapping_add(4096),
            len: 8192,
            span: (ptr, len),
            comm: COMM,
            tag: TAG,
            sig: SIG,
            ordinal: 0,
        };
        assert_eq!(link.expose(e), Ok(true));
        assert_eq!(
            lock(&a.state).cache.entries.len(),
            1,
            "the span is registered"
        );
        forget_quickly(&a, &mut link, 42);
        assert!(lock(&a.state).peers[1].offered.is_empty());
        let payloads = [vec![5u8; 100]];
        let ops = sends(&payloads);
        flush_frames(&a, &ops, vec![frame(&ops, 0, None)]);
        // The peer gets the offer, its withdrawal, and the message after them.
        assert_eq!(arrivals(&a, &b, &ops, 1), [(0, 'f')]);
        assert!(lock(&b.state).peers[0].offers.is_empty());
        drop(buf);
    }

    /// The destination of an RDMA write from world rank `from` on `hub`: `buf` registered for
    /// the writer (the registration stays until `hub` goes, or `forget` releases it), with
    /// its landing for operation 42; returns its address, key and token.
    fn write_destination(hub: &Hub, from: usize, buf: &mut [u8]) -> (u64, u64, u64) {
        let mut st = lock(&hub.state);
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: the buffers outlive the hubs in the tests.
        let (mr, base, key, _) =
            unsafe { st.register(ptr, len, FI_REMOTE_WRITE | OFFERED) }.unwrap();
        let p = &mut st.peers[from];
        let token = p.take_token();
        let hdr = FrameHeader::new(FrameKind::Eager);
        let dest = Dest::Op { op: 42, base: 0 };
        let landing = Landing::new(hdr, dest, (ptr, len), mr, (0, 0, 3), false);
        p.landing.insert(token, landing);
        (base, key, token)
    }

    /// Send 5 of `hub`, `payload` to world rank `to`, whose destination `target` (address,
    /// key and token) came and which is not written yet: its token 3, queued to write.
    fn pending_write(hub: &Hub, to: usize, payload: &[u8], target: (u64, u64, u64)) {
        let mut st = lock(&hub.state);
        let sending = Sending {
            op: Some(5),
            ptr: payload.as_ptr(),
            len: payload.len(),
            mr: None,
            owned: None,
            target: Some(target),
            read: false,
            posted: false,
            written: 0,
            flying: 0,
        };
        st.peers[to].sending.insert(3, sending);
        st.peers[to].writes.push_back(3);
    }

    /// The destination of an RDMA write whose receive is given up while the writer is silent
    /// is revoked after a short wait (`REVOKE_WAIT`, not the 2 s of `DRAIN` and then the
    /// endpoint closed): its own registration is closed and the endpoint still carries
    /// messages; the writer, when it progresses, drops the write it had not posted yet (its
    /// frame counts as sent) instead of writing into the revoked region.
    #[test]
    fn a_receive_given_up_revokes_the_destination_of_a_write_without_waiting_for_the_writer() {
        let (a, b, mut link) = receiver();
        let mut buf = vec![0u8; 1 << 16];
        let target = write_destination(&a, 1, &mut buf);
        // The writer has the destination (its `WRITE_CTS` came) and has not written yet.
        let payload = vec![6u8; 1 << 16];
        pending_write(&b, 0, &payload, target);
        forget_quickly(&a, &mut link, 42);
        assert!(lock(&a.state).peers[1].landing.is_empty());
        let small = [vec![5u8; 100]];
        let ops = sends(&small);
        flush_frames(&a, &ops, vec![frame(&ops, 0, None)]);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            {
                let mut st = lock(&a.state);
                st.progress();
                st.flush(1, &ops, &mut Vec::new()).unwrap();
            }
            let mut st = lock(&b.state);
            st.progress();
            let p = &st.peers[0];
            assert!(
                !p.inbox.iter().any(|i| matches!(i, In::Failed(_))),
                "{:?}",
                p.inbox
            );
            let dropped = p.inbox.iter().any(|i| matches!(i, In::Sent(5)));
            let came = p
                .inbox
                .iter()
                .any(|i| matches!(i, In::Frame(h, _) if h.msg_id == 0));
            if dropped && came {
                assert!(p.sending.is_empty() && p.writes.is_empty());
                assert_eq!(st.counts.ofi_direct.load(Ordering::Relaxed), 0);
                break;
            }
            assert!(Instant::now() < deadline, "only {:?} arrived", p.inbox);
        }
        assert!(buf.iter().all(|&x| x == 0), "nothing was written");
        drop(payload);
    }

    /// An RDMA write larger than a piece goes in pieces ([`piece`]), all posted at once
    /// into their places of the destination; the send is over, and the receiver hears the
    /// payload landed, only once the last piece completed.
    #[test]
    fn a_large_write_goes_in_pieces_and_ends_with_the_last() {
        let (a, b) = two_hubs();
        let len = 2 * READ_PIECE + 1000;
        let payload: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        let mut buf = vec![0u8; len];
        let target = write_destination(&b, 0, &mut buf);
        pending_write(&a, 1, &payload, target);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut most = 0;
        loop {
            let sent = {
                let mut st = lock(&a.state);
                st.progress();
                if let Some(s) = st.peers[1].sending.get(&3) {
                    most = most.max(s.flying);
                }
                let p = &st.peers[1];
                assert!(
                    !p.inbox.iter().any(|i| matches!(i, In::Failed(_))),
                    "{:?}",
                    p.inbox
                );
                p.inbox.iter().any(|i| matches!(i, In::Sent(5)))
            };
            let landed = {
                let mut st = lock(&b.state);
                st.progress();
                st.peers[0]
                    .inbox
                    .iter()
                    .any(|i| matches!(i, In::Landed(t) if *t == target.2))
            };
            if landed {
                assert!(
                    sent,
                    "the receiver heard of the payload before the send was over"
                );
                break;
            }
            assert!(Instant::now() < deadline, "the write never landed");
        }
        let pieces = len.div_ceil(piece(len));
        assert!(pieces > 1);
        assert_eq!(most, pieces, "all pieces were in flight at once");
        assert!(lock(&a.state).peers[1].sending.is_empty());
        assert!(buf == payload, "every piece landed in its place");
    }

    /// Pool memory takes its block's region, with no registration of its own; when the pool
    /// says the block's memory goes, the region is closed, but only once no transfer names it
    /// any more (a peer yet to read a forgotten send's payload).
    #[test]
    fn a_pool_blocks_region_serves_its_bytes_and_outlives_the_transfers_that_name_it() {
        let ep = crate::transport::ofi::tests::open();
        let me = ep.name().unwrap();
        let counts = Arc::new(ProtocolCounts::default());
        let limits = OfiLimits {
            eager: 4096,
            write: 1 << 20,
            direct: false,
        };
        let hub = Hub::start(ep, 0, &[None, Some(me)], limits, Arc::clone(&counts)).unwrap();
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let block = vec![0u8; 1 << 16];
        let base = block.as_ptr().cast_mut();
        hub.backed(3, base, block.len());
        assert_eq!(count(&counts.ofi_pool_blocks), 1);
        let at = base.wrapping_add(100);
        {
            let mut st = lock(&hub.state);
            // SAFETY: the block outlives every use of its region (the hub goes first).
            let (k, remote, _, _) = unsafe { st.register(at, 1000, FI_REMOTE_READ) }.unwrap();
            assert!(k.is_none(), "the block's region, not one of its own");
            assert!(remote == at as u64 || remote == 100, "{remote:#x}");
            // Bytes outside the block are registered on their own.
            let other = [0u8; 64];
            // SAFETY: `other` outlives its registration, released at once.
            let (k, ..) = unsafe { st.register(other.as_ptr(), 64, FI_REMOTE_READ) }.unwrap();
            assert!(k.is_some());
            st.unregister(k);
            st.peers[1].sending.insert(
                7,
                Sending {
                    op: None,
                    ptr: at,
                    len: 1000,
                    mr: None,
                    owned: None,
                    target: None,
                    read: true,
                    posted: false,
                    written: 0,
                    flying: 0,
                },
            );
        }
        assert_eq!(count(&counts.ofi_mr_pool), 1);
        assert_eq!(count(&counts.ofi_mr_misses), 1);
        hub.going(3);
        {
            let st = lock(&hub.state);
            assert!(
                st.blocks.find(at, 1).is_none(),
                "new transfers no longer find it"
            );
            assert_eq!(st.retired.len(), 1, "kept while the send names it");
            assert_eq!(
                st.desc(None, at, 1000),
                st.retired[0].2.desc,
                "the send's later pieces take the retired region's descriptor"
            );
        }
        assert_eq!(
            count(&counts.ofi_mr_invalidations),
            1,
            "only the own registration"
        );
        {
            let mut st = lock(&hub.state);
            st.peers[1].sending.clear();
            // A receive offered to the peer, in the block's region: the peer may write there.
            st.peers[1].offered.insert(
                5,
                Offered {
                    token: 9,
                    ptr: at,
                    len: 1000,
                    mr: None,
                    withdrawn: false,
                },
            );
            st.progress();
            assert_eq!(st.retired.len(), 1, "kept while the offer names it");
            st.peers[1].offered.clear();
            st.progress();
            assert!(st.retired.is_empty());
        }
        assert_eq!(count(&counts.ofi_mr_invalidations), 2);
        drop(hub);
        drop(block);
    }
}
