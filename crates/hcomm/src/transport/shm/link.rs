//! Shared-memory links between the ranks of one host: setting them up, and the doorbell.
//!
//! Every rank creates one *inbox* segment, `hcomm-<job id>-<rank>-inbox`, that holds a ring
//! for each other local rank (that rank produces, this one consumes), in front of them a
//! [`Doorbell`] the rank sleeps on, and a probe pattern its peers read once to find out
//! whether cross-memory attach works between them:
//!
//! ```text
//! payload offset 0    Doorbell (128 bytes): event count + epoll sleepers
//!                128  probe pattern (PROBE_LEN bytes)
//!                192  finalized: non-zero once the rank finalized (a cache line of its own)
//!                256  started: one bit per local rank (a word per 64), up to RINGS_OFFSET
//!               4096  fast box and ring of local rank 0 | of local rank 1 | ...
//!                     (fastbox::REGION_LEN + ring_bytes each)
//! ```
//!
//! The fast box and ring of local rank `i` in the inbox of rank `r` carry `i`'s frames to `r`
//! (single-line frames through the box, the others through the ring; see
//! [`super::fastbox`]); the place of `r` itself is unused. A rank publishes the name, its
//! process id and the address of its probe pattern in the rendezvous store, maps its peers'
//! inboxes, and the last mapper of each inbox removes its name, so after start-up nothing of
//! the job is left under `/dev/shm` whatever happens to its processes.
//!
//! # Memory that grows with use
//!
//! An inbox reserves memory for its first page only (doorbell, probe, started bits): the
//! fast boxes and rings are valid when zero (an empty box, a ring whose counters are zero and
//! whose layout both ends compute from `HCOMM_SHM_RING`), so nobody writes them at creation and
//! their pages take no memory until the pair exchanges frames. Before a rank writes a frame to
//! a peer, it gives the pages the frame may reach in its fast box and ring in the peer's inbox
//! their memory, 64 KiB at a time as the ring fills for the first time
//! ([`ShmSegment::reserve`]: a full `/dev/shm` fails the link with a message, not a SIGBUS),
//! and before its first frame sets its started bit there; the peer reads that box and ring
//! only once the bit is set. A rank's shared memory thus grows with the peers that send to
//! it and with how much of their rings they used: a goodbye or a barrier costs 64 KiB, a ring
//! that carried large messages its whole `HCOMM_SHM_RING`.
//!
//! # Finalizing without a goodbye to every peer
//!
//! A rank that finalizes says goodbye through the rings of the peers it talked to (the
//! goodbye is the last frame there: it follows the data). It would cost a frame, 64 KiB of
//! ring memory and a wake-up per local rank to say it to the others too, so instead it sets
//! the `finalized` word of its own inbox once, after its goodbyes went out
//! ([`Inbox::mark_finalized`]). A peer that never heard from it (its started bit is clear)
//! takes the word for its goodbye ([`ShmLink::finalized_unheard`]): nothing can follow, since
//! the rank sends nothing more. A peer that heard from it waits for the goodbye in the ring,
//! as before; a rank killed before it set the word set none, and its peers count it lost.
//!
//! # Waking
//!
//! A producer rings the consumer's doorbell after pushing frames: a fence and a load when the
//! consumer is awake, a futex wake when it sleeps on the doorbell's shared futex. A consumer
//! that must also watch sockets sleeps in `epoll_wait` instead and counts itself in
//! `epoll_sleepers`; a producer that sees that count asks the engine to wake it (the same
//! store-buffering handshake as the futex; see [`super::futex`]): a datagram to the
//! consumer's wake socket, or a wake-up frame over the pair's TCP connection for a pair that
//! keeps one (see [`super::wake`]). The entry a rank publishes also says whether its peers can
//! reach it without a connection ([`Reach`]).

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::cma::{self, CmaMode, CmaSupport};
use super::fastbox::{self, FastBox, FastReader, FastWriter};
use super::futex::EventCount;
use super::ring::{Consumer, Producer, ShmRing, RING_ALIGN, TAIL_OFFSET};
use super::segment::{segment_name, ShmSegment};
use super::wake::{PeerEnd, Reach, WakeSocket};
use crate::error::{Error, PeerRank, Result};

/// Bytes of the probe pattern.
const PROBE_LEN: usize = 64;
/// Offset of the probe pattern in the inbox payload.
const PROBE_OFFSET: usize = 128;
/// Offset of the finalized word in the inbox payload.
const FINALIZED_OFFSET: usize = 192;
/// Offset of the started bits in the inbox payload.
const STARTED_OFFSET: usize = 256;
/// Offset of the first ring in the inbox payload.
const RINGS_OFFSET: usize = 4096;
/// The most local ranks an inbox has started bits for.
const MAX_LOCALS: usize = (RINGS_OFFSET - STARTED_OFFSET) * 8;
/// Bytes of a ring given memory at a time as the ring fills for the first time.
const RESERVE_STEP: usize = 64 << 10;
/// Slot size of the rings: one cache line.
const SLOT_SIZE: usize = 64;

/// What a rank sleeps on, at the start of its inbox.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    /// Futex sleepers (see [`EventCount`]).
    event: EventCount,
    /// Threads of the inbox's owner sleeping in `epoll_wait` rather than on the futex.
    epoll_sleepers: AtomicU32,
    /// The owner's heartbeat: bumped by its watcher thread while the process runs, so that
    /// local peers tell a hung or stopped process from a slow one.
    heartbeat: AtomicU64,
}

const _: () = {
    assert!(size_of::<Doorbell>() <= PROBE_OFFSET);
    assert!(PROBE_OFFSET + PROBE_LEN <= FINALIZED_OFFSET);
    assert!(FINALIZED_OFFSET + 64 <= STARTED_OFFSET);
};

impl Doorbell {
    /// Rings the bell after the caller published frames for its owner; returns whether the
    /// owner sleeps in `epoll_wait` and needs a wake-up frame on its socket.
    pub(crate) fn ring(&self) -> bool {
        // `notify` fences before it looks at the futex sleepers; that fence also orders the
        // published frames before the load of `epoll_sleepers`.
        self.event.notify();
        self.epoll_sleepers.load(Ordering::Relaxed) != 0
    }

    /// The owner sleeps on the futex until woken or `timeout`, unless `ready` (checked after
    /// the owner announced itself) holds; returns whether it held.
    pub(crate) fn sleep_unless(&self, ready: &mut impl FnMut() -> bool, timeout: Duration) -> bool {
        self.event.sleep_unless(ready, timeout)
    }

    /// The owner is about to sleep in `epoll_wait`; the caller then checks its rings once more
    /// before it sleeps, and calls [`Doorbell::leave_epoll`] when it wakes.
    pub(crate) fn enter_epoll(&self) {
        self.epoll_sleepers.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// The owner woke up from `epoll_wait`.
    pub(crate) fn leave_epoll(&self) {
        self.epoll_sleepers.fetch_sub(1, Ordering::Relaxed);
    }

    /// The owner shows it is alive.
    pub(crate) fn beat(&self) {
        self.heartbeat.fetch_add(1, Ordering::Relaxed);
    }

    /// The owner's heartbeats so far.
    pub(crate) fn beats(&self) -> u64 {
        self.heartbeat.load(Ordering::Relaxed)
    }
}

/// Settings of the shared-memory links.
#[derive(Debug, Clone)]
pub(crate) struct LinkConfig {
    /// Job id in the segment names (ASCII letters, digits, `_`, `.`).
    pub job_id: String,
    /// Bytes of each ring (rounded down to what a power of two of slots fills).
    pub ring_bytes: usize,
    /// `HCOMM_CMA`.
    pub cma: CmaMode,
}

/// One local rank as the others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    /// Name of its inbox.
    pub name: String,
    /// Its process id.
    pub pid: u32,
    /// Address of its probe pattern in its own address space.
    pub probe_addr: usize,
    /// Whether a peer can reach it without a connection (see [`super::wake`]).
    pub reach: Reach,
}

impl Published {
    /// Encodes for the rendezvous store.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let r = &self.reach;
        format!(
            "{} {} {} {} {} {}",
            self.name,
            self.pid,
            self.probe_addr,
            r.pid_ns,
            r.net_ns,
            u8::from(r.able)
        )
        .into_bytes()
    }

    /// Decodes what [`Published::encode`] wrote; anything else is an error naming `rank`.
    pub(crate) fn decode(rank: usize, bytes: &[u8]) -> Result<Published> {
        let bad = || {
            Error::init(format!(
                "rank {rank} published a malformed shared-memory entry"
            ))
            .with_peer(PeerRank::world(rank))
        };
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let mut it = text.split(' ');
        let (Some(name), Some(pid), Some(addr), Some(pid_ns), Some(net_ns), Some(able), None) = (
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
        ) else {
            return Err(bad());
        };
        super::segment::validate_name(name)?;
        Ok(Published {
            name: name.to_owned(),
            pid: pid.parse().map_err(|_| bad())?,
            probe_addr: addr.parse().map_err(|_| bad())?,
            reach: Reach {
                pid_ns: pid_ns.parse().map_err(|_| bad())?,
                net_ns: net_ns.parse().map_err(|_| bad())?,
                able: match able {
                    "0" => false,
                    "1" => true,
                    _ => return Err(bad()),
                },
            },
        })
    }
}

/// This rank's inbox, created and ready for its peers to map.
pub(crate) struct Inbox {
    seg: Arc<ShmSegment>,
    locals: usize,
    me: usize,
    ring_bytes: usize,
    cfg: LinkConfig,
    /// This rank's wake socket, when it could bind it (see [`super::wake`]).
    wake: Option<Arc<WakeSocket>>,
    /// What this rank publishes about reaching it without a connection.
    reach: Reach,
}

/// The link with one local peer.
pub(crate) struct ShmLink {
    /// This rank's frames to the peer (a ring in the peer's inbox).
    pub producer: Producer,
    /// The peer's frames to this rank (a ring in this rank's inbox).
    pub consumer: Consumer,
    /// This rank's single-line frames to the peer (a fast box in the peer's inbox).
    pub fast_out: FastWriter,
    /// The peer's single-line frames to this rank (a fast box in this rank's inbox).
    pub fast_in: FastReader,
    /// The peer's process id (for cross-memory attach).
    pub pid: u32,
    /// Whether this rank may read and write the peer's memory with cross-memory attach.
    pub cma: bool,
    /// How to wake the peer and notice its end without a connection; `None`: the pair keeps
    /// a TCP connection for both.
    pub end: Option<PeerEnd>,
    /// The peer's local rank (the place of its fast box and ring in this rank's inbox).
    local: usize,
    /// This rank's local rank (the place of its fast box and ring in the peer's inbox).
    me: usize,
    /// Where this rank's fast box and ring lie in the peer's inbox, and their length.
    out_at: usize,
    region_len: usize,
    /// The bytes of that region, from its start, that have their memory.
    reserved: usize,
    /// The peer was told to read them (its started bit for this rank is set).
    told: bool,
    /// The peer's inbox, which holds its doorbell (and the producer's ring).
    peer_inbox: Arc<ShmSegment>,
    /// This rank's inbox, which holds the consumer's ring.
    _own_inbox: Arc<ShmSegment>,
}

impl std::fmt::Debug for ShmLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmLink")
            .field("pid", &self.pid)
            .field("cma", &self.cma)
            .field("peer_inbox", &self.peer_inbox.name())
            .field("end", &self.end)
            .finish()
    }
}

impl ShmLink {
    /// The peer's doorbell.
    pub(crate) fn peer_bell(&self) -> &Doorbell {
        bell_of(&self.peer_inbox)
    }

    /// A handle on the peer's inbox, to ring its doorbell without the link.
    pub(crate) fn peer_inbox(&self) -> PeerInbox {
        PeerInbox(Arc::clone(&self.peer_inbox))
    }

    /// Whether the peer has started sending to this rank: until then its fast box and ring in
    /// this rank's inbox are not read (their pages may have no memory).
    #[inline]
    pub(crate) fn started(&self) -> bool {
        let (word, bit) = started_bit(&self._own_inbox, self.local);
        word.load(Ordering::Acquire) & bit != 0
    }

    /// Whether this rank has started sending to the peer ([`ShmLink::prepare`]).
    #[inline]
    pub(crate) fn is_started(&self) -> bool {
        self.told
    }

    /// Whether the peer finalized without ever sending to this rank (see the module docs:
    /// its `finalized` word stands for its goodbye, since nothing can follow it).
    pub(crate) fn finalized_unheard(&self) -> bool {
        // The word is stored after anything the peer wrote before it (release): once it is
        // seen, a clear started bit read after it means the peer never sent to this rank.
        finalized_word(&self.peer_inbox).load(Ordering::Acquire) != 0 && !self.started()
    }

    /// Before this rank writes a frame to the peer, through the fast box (`None`) or of
    /// `Some(len)` bytes through the ring: gives the pages it may write in the peer's inbox
    /// their memory, a [`RESERVE_STEP`] at a time as the ring's first lap advances, and, before
    /// the first frame, tells the peer to read this rank's fast box and ring. An error when
    /// `/dev/shm` has no room for them.
    #[inline]
    pub(crate) fn prepare(&mut self, ring_len: Option<usize>) -> Result<()> {
        // The first call reserved the fast box; then the ring only while its first lap lasts.
        if self.told {
            match ring_len {
                None => return Ok(()),
                Some(_) if self.reserved == self.region_len => return Ok(()),
                Some(len) if fastbox::REGION_LEN + self.producer.reach(len) <= self.reserved => {
                    return Ok(())
                }
                Some(_) => {}
            }
        }
        self.grow(ring_len.unwrap_or(0))
    }

    #[cold]
    fn grow(&mut self, len: usize) -> Result<()> {
        let upto = fastbox::REGION_LEN + self.producer.reach(len);
        if upto > self.reserved {
            let to = upto.next_multiple_of(RESERVE_STEP).min(self.region_len);
            self.peer_inbox
                .reserve(self.out_at + self.reserved, to - self.reserved)?;
            self.reserved = to;
        }
        if !self.told {
            let (word, bit) = started_bit(&self.peer_inbox, self.me);
            word.fetch_or(bit, Ordering::Release);
            self.told = true;
        }
        Ok(())
    }
}

/// A look at whether a local peer's next frame has arrived, made by [`Inbox::watch`].
#[derive(Debug)]
pub(crate) struct Watch<'a> {
    stamp: &'a AtomicU64,
    want: u64,
    tail: &'a AtomicU64,
    seen: u64,
}

impl Watch<'_> {
    /// Whether the frame arrived in the fast box, or something in the ring.
    pub(crate) fn ready(&self) -> bool {
        self.stamp.load(Ordering::Acquire) == self.want
            || self.tail.load(Ordering::Acquire) != self.seen
    }
}

/// A local peer's inbox, kept mapped for its doorbell.
#[derive(Debug, Clone)]
pub(crate) struct PeerInbox(Arc<ShmSegment>);

impl PeerInbox {
    /// The peer's doorbell.
    pub(crate) fn bell(&self) -> &Doorbell {
        bell_of(&self.0)
    }
}

/// The doorbell at the start of an inbox (this module maps only inboxes, at least
/// `RINGS_OFFSET` bytes long).
fn bell_of(inbox: &ShmSegment) -> &Doorbell {
    // SAFETY: every inbox starts with a `Doorbell` (written by its creator before it published
    // the name), the payload is 128-byte aligned and longer than a Doorbell, and the mapping
    // lives as long as `inbox`. Its fields are atomics, so sharing it with other processes is
    // sound.
    unsafe { &*inbox.as_ptr().cast::<Doorbell>() }
}

/// Offset in an inbox of the fast box and ring of local rank `i` (with rings of `ring_bytes`);
/// for `i` = the number of local ranks, the inbox's length.
fn place(i: usize, ring_bytes: usize) -> usize {
    RINGS_OFFSET + i * (fastbox::REGION_LEN + ring_bytes)
}

/// The finalized word of `inbox` (see the module docs).
fn finalized_word(inbox: &ShmSegment) -> &AtomicU64 {
    // SAFETY: the word lies in the inbox's first page (FINALIZED_OFFSET < RINGS_OFFSET, and
    // every inbox is at least RINGS_OFFSET long), 8-byte aligned; the mapping lives as long
    // as `inbox`, and the word is an atomic shared with the peers (zero in a new inbox).
    unsafe { &*inbox.as_ptr().add(FINALIZED_OFFSET).cast::<AtomicU64>() }
}

/// The started bit of local rank `i` in `inbox`: its word and mask.
fn started_bit(inbox: &ShmSegment, i: usize) -> (&AtomicU64, u64) {
    debug_assert!(i < MAX_LOCALS);
    // SAFETY: the word lies in the inbox's first page, below RINGS_OFFSET (`i < MAX_LOCALS`,
    // checked when the inbox was made), 8-byte aligned; the mapping lives as long as `inbox`,
    // and the word is an atomic shared with the peers.
    let word = unsafe {
        &*inbox
            .as_ptr()
            .add(STARTED_OFFSET + 8 * (i / 64))
            .cast::<AtomicU64>()
    };
    (word, 1 << (i % 64))
}

fn pattern(me: usize) -> [u8; PROBE_LEN] {
    let mut p = [0u8; PROBE_LEN];
    for (i, b) in p.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ (me as u8).wrapping_add(0x5a);
    }
    p
}

impl Inbox {
    /// Creates this rank's inbox for `locals` local ranks, of which it is local rank `me`.
    pub(crate) fn create(cfg: &LinkConfig, rank: usize, locals: usize, me: usize) -> Result<Inbox> {
        let ring_bytes = cfg.ring_bytes / RING_ALIGN * RING_ALIGN;
        if locals > MAX_LOCALS {
            return Err(Error::invalid_argument(format!(
                "{locals} ranks on one host: shared memory links at most {MAX_LOCALS}"
            )));
        }
        let len = locals
            .checked_mul(fastbox::REGION_LEN + ring_bytes)
            .and_then(|n| n.checked_add(RINGS_OFFSET))
            .ok_or_else(|| Error::invalid_argument("shared-memory rings too large"))?;
        let name = segment_name(&cfg.job_id, rank as u32, "inbox")?;
        // The fast boxes and rings are zero, valid as they are: their pages stay untouched.
        let seg = ShmSegment::create_sparse(&name, len, RINGS_OFFSET)?;
        let base = seg.as_ptr();
        // SAFETY: the payload is ours alone until the name is published, 128-byte aligned and
        // at least RINGS_OFFSET bytes long; a zeroed Doorbell is a valid one, and the probe
        // pattern lies within the payload.
        unsafe {
            base.cast::<Doorbell>().write(Doorbell::default());
            base.add(PROBE_OFFSET)
                .copy_from_nonoverlapping(pattern(me).as_ptr(), PROBE_LEN);
        }
        let wake = match WakeSocket::bind(&cfg.job_id, rank) {
            Ok(w) => Some(Arc::new(w)),
            Err(e) => {
                tracing::info!(
                    "rank {rank}: no wake socket ({e}); local peers keep a TCP connection"
                );
                None
            }
        };
        let reach = Reach::own(wake.is_some());
        Ok(Inbox {
            seg: Arc::new(seg),
            locals,
            me,
            ring_bytes,
            cfg: cfg.clone(),
            wake,
            reach,
        })
    }

    /// What the peers need to map this inbox.
    pub(crate) fn published(&self) -> Published {
        Published {
            name: self.seg.name().to_owned(),
            pid: std::process::id(),
            probe_addr: self.seg.as_ptr() as usize + PROBE_OFFSET,
            reach: self.reach,
        }
    }

    /// This rank's wake socket, for the engine's epoll set.
    pub(crate) fn wake_socket(&self) -> Option<&WakeSocket> {
        self.wake.as_deref()
    }

    /// Whether this rank and the rank that published `peer` are linked by shared memory
    /// alone, with no TCP connection (both decide alike; see [`super::wake`]).
    pub(crate) fn socketless(&self, peer: &Published) -> bool {
        self.reach.socketless(&peer.reach)
    }

    /// This rank's doorbell.
    pub(crate) fn bell(&self) -> &Doorbell {
        bell_of(&self.seg)
    }

    /// Tells the local peers that this rank finalized: it sends them nothing more, and those
    /// it never sent to take this for its goodbye (see the module docs). Called once its
    /// goodbyes went out.
    pub(crate) fn mark_finalized(&self) {
        finalized_word(&self.seg).store(1, Ordering::Release);
    }

    /// The job id of the segment names.
    pub(crate) fn job_id(&self) -> &str {
        &self.cfg.job_id
    }

    /// Maps the inbox of local rank `peer_local` (world rank `peer_rank`, published as `peer`)
    /// and joins the two rings between them. Every rank links with every other local rank
    /// once.
    pub(crate) fn link(
        &self,
        peer_local: usize,
        peer_rank: usize,
        peer: &Published,
    ) -> Result<ShmLink> {
        let end = match &self.wake {
            Some(w) if self.socketless(peer) => Some(PeerEnd::open(
                Arc::clone(w),
                &self.cfg.job_id,
                peer_rank,
                peer.pid,
            )?),
            _ => None,
        };
        let len = place(self.locals, self.ring_bytes);
        let theirs = Arc::new(ShmSegment::open(&peer.name, len)?);
        theirs.unlink_if_last(self.locals as u32)?;
        let out_at = place(self.me, self.ring_bytes);
        let in_at = place(peer_local, self.ring_bytes);
        // SAFETY: our fast box and ring in the peer's inbox lie within the mapping, 128-byte
        // aligned, zero until we write them (a new segment's bytes; nobody else writes them)
        // and laid out by both ends from the same `ring_bytes`. We are their only writer.
        let (producer, fast_out) = unsafe {
            let base = theirs.as_ptr().add(out_at);
            (
                ShmRing::zeroed(base.add(fastbox::REGION_LEN), self.ring_bytes, SLOT_SIZE)?
                    .into_producer(),
                FastBox::attach(base).into_writer(),
            )
        };
        // SAFETY: the peer's fast box and ring in our inbox, likewise; we are their only
        // reader, and read them only once the peer set its started bit (`ShmLink::started`).
        let (consumer, fast_in) = unsafe {
            let base = self.seg.as_ptr().add(in_at);
            (
                ShmRing::zeroed(base.add(fastbox::REGION_LEN), self.ring_bytes, SLOT_SIZE)?
                    .into_consumer(),
                FastBox::attach(base).into_reader(),
            )
        };
        let support = cma::probe_with_mode(
            self.cfg.cma,
            peer.pid,
            peer.probe_addr,
            &pattern(peer_local),
        );
        Ok(ShmLink {
            producer,
            consumer,
            fast_out,
            fast_in,
            pid: peer.pid,
            cma: matches!(support, CmaSupport::Available),
            end,
            local: peer_local,
            me: self.me,
            out_at,
            region_len: fastbox::REGION_LEN + self.ring_bytes,
            reserved: 0,
            told: false,
            peer_inbox: theirs,
            _own_inbox: Arc::clone(&self.seg),
        })
    }

    /// A watch on the next frame `link`'s peer sends this rank, numbered `seq`, that needs
    /// neither the link nor its lock: it looks at the fast box slot and the ring tail in this
    /// inbox that the link's reading ends look at next. It goes stale once they read again.
    pub(crate) fn watch(&self, link: &ShmLink, seq: u64) -> Watch<'_> {
        let at = place(link.local, self.ring_bytes);
        let word = |offset: usize| -> &AtomicU64 {
            // SAFETY: the offset lies within this inbox (the fast box and ring of a local
            // peer; `link` was made by this inbox for that peer), 8-byte aligned; the inbox
            // stays mapped while `self` is borrowed, and both words are atomics shared with
            // the peer.
            unsafe { &*self.seg.as_ptr().add(offset).cast::<AtomicU64>() }
        };
        Watch {
            stamp: word(at + link.fast_in.next_stamp_offset()),
            want: seq + 1,
            tail: word(at + fastbox::REGION_LEN + TAIL_OFFSET),
            seen: link.consumer.seen_tail(),
        }
    }

    /// Removes the inbox's name whoever has mapped it: for a start-up that failed.
    pub(crate) fn abandon(&self) {
        let _ = ShmSegment::unlink(self.seg.name());
    }
}

/// The id in the shared-memory names of a job's world (`generation` counts the worlds a
/// process made): the same on every rank, and nothing of the secret shows. `hcommrun`
/// computes it too, to sweep what a job that died during start-up left behind.
pub fn job_id(secret: &[u8], root_addr: &str, generation: u64) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(secret);
    h.update(root_addr.as_bytes());
    h.update(format!("hcomm/{generation}").as_bytes());
    hex::encode(&h.finalize()[..8])
}

/// Makes this process readable by its peers with cross-memory attach, where the mode allows.
pub(crate) fn prepare_cma(mode: CmaMode) {
    if mode == CmaMode::Auto {
        if let Err(e) = cma::allow_peer_access() {
            tracing::info!("cross-memory attach not offered to peers: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::segment::MAX_NAME_LEN;

    fn random_published(rng: &mut crate::fuzz::Rng) -> Published {
        let job: String = (0..1 + rng.below(40))
            .map(|_| *rng.pick(b"abcxyz019_."))
            .map(char::from)
            .collect();
        let rank = rng.next_u64() as u32;
        Published {
            name: segment_name(&job, rank, "inbox").unwrap(),
            pid: rng.next_u64() as u32,
            probe_addr: rng.next_u64() as usize,
            reach: Reach {
                pid_ns: rng.next_u64(),
                net_ns: rng.next_u64(),
                able: rng.below(2) == 1,
            },
        }
    }

    /// Whatever a local rank publishes as its inbox: decoding never panics, accepts only a
    /// valid segment name with a pid and an address (which then encode to an entry that
    /// decodes the same), refuses the rest with an error naming the rank, allocates in
    /// proportion to the entry, and valid entries round-trip.
    #[test]
    fn fuzz_published_decode() {
        let mut rng = crate::fuzz::Rng::new(5);
        let target = crate::fuzz::Target {
            name: "shm Published::decode",
            default_cases: 100_000,
            seeds: (0..16)
                .map(|_| random_published(&mut rng).encode())
                .collect(),
            max_len: 2 * MAX_NAME_LEN + 128,
            dict: vec![u32::MAX as u64, MAX_NAME_LEN as u64, u64::from(b' ')],
        };
        crate::fuzz::run(&target, |input, rng| {
            let (decoded, usage) = crate::fuzz::measure(|| Published::decode(3, input));
            assert!(usage.peak <= 2 * input.len() + 1024, "{usage:?}");
            match decoded {
                Ok(p) => {
                    super::super::segment::validate_name(&p.name).unwrap();
                    assert_eq!(Published::decode(3, &p.encode()).unwrap(), p);
                }
                Err(Error::Init(info)) => assert_eq!(info.peer, Some(PeerRank::world(3)), "{info}"),
                Err(Error::InvalidArgument(msg)) => assert!(msg.message.contains("segment name")),
                Err(e) => panic!("{e}"),
            }
            let valid = random_published(rng);
            assert_eq!(Published::decode(3, &valid.encode()).unwrap(), valid);
        });
    }
}
