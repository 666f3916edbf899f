//! The communicator: a group of ranks that exchange messages, and its lifetime.
//!
//! No unsafe code here: memory reaches the engine only as a `p2p::lease::Lease`.

#![forbid(unsafe_code)]

mod collectives;
mod ft;
mod group;
mod grow;
mod pool;
mod raw;
mod subset;

pub use grow::JOIN_TOKEN_MAX;
pub use pool::PoolBuf;

pub use collectives::Batch;

use rustc_hash::FxHashMap as HashMap;
use std::net::{IpAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use crate::bootstrap::{self, RendezvousStore, StoreClient};
use crate::coll::algos::hier::tiered::Tiers;
use crate::coll::onesided::OneSided;
use crate::coll::schedule::Schedule;
use crate::coll::select::Selector;
use crate::coll::{Algorithm, Shape};
use crate::config::{Config, Secret};
use crate::error::{Error, PeerRank, Result};
use crate::observe::flight::{self, Recorder};
use crate::observe::OpKind;
use crate::p2p::lease::{Lease, Loan, Part};
use crate::p2p::{
    Blocking, Carrier, Engine, EngineConfig, OfiLimits, OfiSetup, OpId, ProtocolStats, ShmSetup,
    Target, ANY_PEER,
};
use crate::rng::mix;
use crate::topology::{RankInfo, Topology};
use crate::transport::iface::{self, IfSpec};
use crate::transport::ofi;
use crate::transport::plugin;
use crate::transport::shm::link::{self, Inbox, LinkConfig, Published};
use crate::transport::shm::pool::{default_max_total, PoolConfig, ShmPool};
use crate::transport::tcp;

/// Communicator ids with this bit carry hcomm's own traffic (split, barrier), never a
/// user's.
const INTERNAL: u64 = 1 << 63;
/// Communicator ids with this bit carry collective traffic (tags are call sequence numbers).
const COLL: u64 = 1 << 62;
const WORLD_ID: u64 = 1;
/// How long a waiting rank polls before sleeping, when it has a core to itself.
const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// Internal tags.
const TAG_SPLIT: u32 = 1;
const TAG_AGREE: u32 = 2;

/// Counts worlds created by this process, so that several worlds on one store keep their
/// keys apart (every rank creates its worlds in the same order).
static WORLDS: AtomicU64 = AtomicU64::new(0);

/// How messages to a peer travel (decided at init; for the statistics).
#[derive(Debug, Clone, Copy)]
enum Route {
    /// This rank itself.
    Own,
    /// Shared memory; whether cross-memory attach reaches the peer.
    Shm { cma: bool },
    /// TCP.
    Tcp,
    /// A transport plug-in.
    Plugin,
    /// libfabric.
    Ofi,
}

/// What every communicator of one world shares: the engine, the store and the settings.
struct World {
    config: Config,
    selector: Selector,
    engine: Engine,
    rank: usize,
    /// Waiting ranks may spin: the host has a core per local rank (or `HCOMM_SPIN_US` says so).
    spin: bool,
    /// This rank's shared-memory pool (`None` with `HCOMM_POOL_MAX=0`).
    pool: Option<Arc<ShmPool>>,
    /// How messages to each world rank travel.
    routes: Box<[Route]>,
    /// The address this rank announces first (its first rail); `None` in a world of one.
    announce: Option<IpAddr>,
    /// The world's hold on the statistics segment and the trace (after the engine: closing
    /// it may still finish operations).
    _observe: crate::observe::stats::Registration,
    /// Kept for the world's lifetime: rank 0 may host the store of the job.
    _store: Option<RendezvousStore>,
    _client: Option<Mutex<StoreClient>>,
}

impl World {
    /// How a message of `len` bytes to world rank `peer` travels (an
    /// `observe::stats::proto` bit; 0 for this rank itself), as the engine decides it.
    fn protocol(&self, peer: usize, len: usize) -> u64 {
        use crate::observe::stats::proto;
        let c = &self.config;
        match self.routes.get(peer) {
            None | Some(Route::Own) => 0,
            Some(Route::Plugin) if len <= c.tcp_eager_limit => proto::PLUGIN_EAGER,
            Some(Route::Plugin) => proto::PLUGIN_RENDEZVOUS,
            // The statistics segment has no bit for libfabric's protocols yet.
            Some(Route::Ofi) => 0,
            Some(Route::Shm { .. }) if len <= c.shm_eager_limit => proto::SHM_INLINE,
            Some(Route::Shm { cma: true })
                if len <= c.shm_push_threshold && len >= c.shm_split_threshold && self.spin =>
            {
                proto::SHM_PULL | proto::SHM_SPLIT
            }
            Some(Route::Shm { cma: true }) if len <= c.shm_push_threshold => proto::SHM_PULL,
            Some(Route::Shm { .. }) => proto::SHM_PUSH,
            Some(Route::Tcp) if len <= c.tcp_eager_limit => proto::TCP_EAGER,
            Some(Route::Tcp) => proto::TCP_RENDEZVOUS,
        }
    }

    /// Copies the process-wide counters into the statistics segment while a profiler
    /// watches it (nothing otherwise: one load).
    #[inline]
    fn publish_counters(&self) {
        if let Some(h) = crate::observe::stats::watched() {
            self.publish_counters_to(h);
        }
    }

    /// Publishes the transports' and the pool's counters in the statistics header `h`.
    #[cold]
    fn publish_counters_to(&self, h: &crate::observe::stats::StatsHeader) {
        let p = self.engine.protocol_stats();
        let pool = self.pool.as_ref().map(|p| p.stats()).unwrap_or_default();
        h.publish(
            [
                p.shm_eager,
                p.shm_pull,
                p.shm_push,
                p.tcp_eager,
                p.tcp_rendezvous,
                p.plugin_eager,
                p.plugin_rendezvous,
                0,
                p.shm_split,
            ],
            pool.hits,
            pool.misses,
        );
        if p.tcp_failovers + p.plugin_fallbacks > 0 {
            h.publish_failovers(&self.engine.failover_counts());
        }
        if let Some(provider) = self.engine.ofi_provider() {
            let counts = crate::observe::stats::OfiCounts {
                messages: [p.ofi_eager, p.ofi_read, p.ofi_write, p.ofi_direct],
                bytes: [
                    p.ofi_eager_bytes,
                    p.ofi_read_bytes,
                    p.ofi_write_bytes,
                    p.ofi_direct_bytes,
                ],
                mr_hits: p.ofi_mr_hits,
                mr_misses: p.ofi_mr_misses,
                mr_invalidations: p.ofi_mr_invalidations,
                mr_pool: p.ofi_mr_pool,
                pool_blocks: p.ofi_pool_blocks,
            };
            h.ofi.publish(&provider, &counts);
        }
    }

    /// Starts recording a point-to-point operation `kind` of `len` bytes with `t`'s peer.
    fn p2p_scope(
        &self,
        kind: crate::observe::OpKind,
        t: &Target,
        len: usize,
        size: usize,
    ) -> crate::observe::OpScope {
        crate::observe::OpScope::start(
            kind,
            u64::from(t.tag),
            len as u64,
            size,
            [0; 3],
            self.protocol(t.peer, len),
            0,
            (t.comm_rank != ANY_PEER).then_some(t.comm_rank),
        )
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let undelivered = self.engine.close(Instant::now() + self.config.timeout);
        if !undelivered.is_empty() {
            tracing::warn!(
                "rank {}: messages to world ranks {undelivered:?} could not be delivered within \
                 HCOMM_TIMEOUT before closing",
                self.rank
            );
        }
    }
}

/// A group of ranks that exchange messages: the world, or one made by [`Communicator::split`]
/// or [`Communicator::dup`].
///
/// Every call is bounded by `HCOMM_TIMEOUT`. Dropping the last communicator of a world (or
/// calling [`Communicator::destroy`] on it) delivers what is still queued, then closes the
/// connections; a peer that later talks to this rank gets [`Error::PeerLost`].
pub struct Communicator {
    world: Arc<World>,
    id: u64,
    rank: usize,
    /// World rank of each member, by rank in this communicator.
    members: Arc<[usize]>,
    topology: Arc<Topology>,
    state: Arc<CommState>,
    /// Shrinks that led to this communicator: its message frames carry it (`comm/ft.rs`).
    epoch: u32,
}

/// What the handles of one communicator share (nonblocking collectives run on a handle).
#[derive(Default)]
struct CommState {
    /// Communicators derived from this one so far (all members derive in the same order).
    derived: AtomicU64,
    /// Collectives called so far: the sequence number tags each call's messages. The engine
    /// answers the peers' questions about it (`Engine::track_entered`). Written only under
    /// `plans`' lock (`Communicator::next_seq`, `Communicator::cached`), read without it.
    coll_seq: Arc<AtomicU32>,
    /// Point-to-point sends started so far (send, isend, the send of a sendrecv): each one's
    /// number names it in its errors (`Operation::seq`).
    sends: AtomicU64,
    /// Point-to-point receives started so far (recv, recv_any, irecv, the receive of a
    /// sendrecv), numbered like the sends but apart from them.
    recvs: AtomicU64,
    /// Planned schedules by call shape.
    plans: Mutex<Plans>,
    /// Scratch space reused by blocking collectives.
    scratch: Mutex<Vec<u8>>,
    /// The one-sided state, made at the first call that may use it (`Some(None)`: this
    /// communicator cannot use one-sided collectives); read without a lock once made.
    onesided: std::sync::OnceLock<Option<Arc<OneSided>>>,
    /// Held while the first call that may use the one-sided state makes it.
    onesided_making: Mutex<()>,
    /// The host and host-leader sub-communicators of the tiered all-reduce, made at its first
    /// call.
    tiers: Mutex<Option<Arc<Tiers<Communicator>>>>,
    /// Failures known and acknowledged, and the fault-tolerance calls made (`comm/ft.rs`).
    ft: Mutex<ft::FtState>,
    /// The join tokens this rank made and those a grow used (`comm/grow.rs`).
    grow: Mutex<grow::GrowState>,
    /// The flight recorder of its collectives (`None` with `HCOMM_TRACE_BUFFER=0`).
    flight: Option<Arc<Recorder>>,
}

impl CommState {
    /// The state of a new communicator `id` at `epoch` of `engine`'s world where this process
    /// is rank `rank` of `members` (world ranks).
    fn new(
        engine: &Engine,
        (id, epoch): (u64, u32),
        rank: usize,
        members: &Arc<[usize]>,
    ) -> Arc<CommState> {
        let state = CommState {
            flight: Recorder::new(id, u64::from(epoch), rank, Arc::clone(members)),
            ..CommState::default()
        };
        engine.track_entered(id | COLL, &state.coll_seq, Arc::clone(members));
        Arc::new(state)
    }
}

/// The plans of a communicator by call shape. The last one used is looked at first: programs
/// repeat their calls, and comparing a shape costs less than hashing it.
#[derive(Default)]
struct Plans {
    by_shape: HashMap<Shape, Arc<Plan>>,
    last: Option<(Shape, Arc<Plan>)>,
}

/// A cached choice of algorithm and its schedule for one call shape.
struct Plan {
    head: Head,
    sched: Arc<Schedule>,
}

/// What a call takes of its plan besides the schedule: copied out of the cache under its
/// lock, so that a call that runs one-sided touches no reference count.
#[derive(Clone, Copy)]
struct Head {
    algo: &'static dyn Algorithm,
    /// The selector's counter of this (collective, algorithm).
    slot: usize,
    /// Blocking calls run one-sided, on the communicator's one-sided state (the schedule is
    /// for nonblocking ones, and for calls whose cross-memory attach is refused).
    onesided: bool,
    /// Blocking calls run the tiered all-reduce: one-sided within hosts.
    tiered: bool,
    /// The algorithm's name for the statistics (`observe::stats::pack_name`).
    algo_name: [u64; 3],
    /// How the call's messages travel (`observe::stats::proto` bits).
    protocols: u64,
}

/// The `src` of a receive that takes a message from any rank of the communicator
/// ([`Communicator::recv`], [`Communicator::irecv`], [`Communicator::irecv_raw`]; see
/// [`Communicator::recv_any`]).
pub const ANY_SOURCE: usize = usize::MAX;

/// What a receive from any source got: who sent the message, and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvStatus {
    /// The sender's rank in the communicator.
    pub source: usize,
    /// Bytes received into the front of the buffer.
    pub len: usize,
}

/// A finished nonblocking operation: its buffer back, and the bytes sent or received.
#[derive(Debug)]
pub struct Completion {
    /// The buffer given to [`Communicator::isend`], [`Communicator::irecv`] or
    /// [`Communicator::start_collective`]; empty for operations on lent memory
    /// ([`Lease`] from raw parts), whose result is in that memory.
    pub buffer: Vec<u8>,
    /// Bytes sent, or bytes received into the front of `buffer`.
    pub len: usize,
    /// For a receive from [`ANY_SOURCE`]: the sender's rank in the communicator (`None` for
    /// every other operation).
    pub source: Option<usize>,
}

/// A nonblocking operation in flight: point-to-point or collective. It progresses in the
/// background; [`Request::wait`] collects it. Dropping it before completion lets it finish in
/// the background, except for operations on lent memory (a [`Lease`] from raw parts):
/// dropping those waits for them (at most `HCOMM_TIMEOUT`), so that the memory is free once
/// the drop returns.
#[must_use = "a request does nothing visible until it is waited for"]
pub struct Request {
    inner: RequestInner,
}

enum RequestInner {
    /// A point-to-point operation in the engine.
    P2p {
        world: Arc<World>,
        /// The operation and its memory; `None` once collected.
        loan: Option<Loan>,
        result: Option<Result<usize>>,
        /// A receive from any source: its sender once known.
        any: Option<Option<usize>>,
    },
    /// A collective running on its own thread (it waits with the world's timeout).
    Task {
        handle: Option<std::thread::JoinHandle<Result<Completion>>>,
        /// The call uses lent memory: the request joins the thread before it goes.
        lent: bool,
    },
}

impl Request {
    /// A point-to-point operation on the memory `loan` holds; `any`: a receive from any
    /// source.
    fn p2p(world: &Arc<World>, loan: Loan, any: bool) -> Request {
        Request {
            inner: RequestInner::P2p {
                world: Arc::clone(world),
                loan: Some(loan),
                result: None,
                any: any.then_some(None),
            },
        }
    }

    /// For a receive from [`ANY_SOURCE`] that [`Request::test`] found complete: the sender's
    /// rank in the communicator ([`Completion::source`] tells it too). `None` before, for a
    /// receive that failed before it matched, and for every other operation.
    pub fn source(&self) -> Option<usize> {
        match &self.inner {
            RequestInner::P2p { any, .. } => any.flatten(),
            RequestInner::Task { .. } => None,
        }
    }

    /// Waits (at most `HCOMM_TIMEOUT`) for the operation and returns its buffer.
    pub fn wait(mut self) -> Result<Completion> {
        match &mut self.inner {
            RequestInner::P2p {
                world,
                loan,
                result,
                any,
            } => {
                let Some(mut l) = loan.take() else {
                    return Err(Error::internal("the request was already collected"));
                };
                let r = match result.take() {
                    Some(r) => r,
                    None => {
                        let r = world
                            .engine
                            .wait_loan(&mut l, Instant::now() + world.config.timeout);
                        note_source(world, l.id(), any);
                        r
                    }
                };
                let buffer = l.into_vec();
                let source = any.flatten();
                r.map(|len| Completion {
                    buffer,
                    len,
                    source,
                })
            }
            RequestInner::Task { handle, .. } => match handle.take().map(|h| h.join()) {
                Some(Ok(r)) => r,
                Some(Err(_)) => Err(Error::internal("a nonblocking collective panicked")),
                None => Err(Error::internal("the request was already collected")),
            },
        }
    }

    /// Progresses and tells whether the operation has completed (then [`Request::wait`]
    /// returns at once).
    pub fn test(&mut self) -> Result<bool> {
        match &mut self.inner {
            RequestInner::P2p {
                world,
                loan,
                result,
                any,
            } => {
                if let (None, Some(l)) = (&result, loan.as_mut()) {
                    *result = world.engine.test_loan(l);
                    if result.is_some() {
                        note_source(world, l.id(), any);
                    }
                }
                Ok(result.is_some())
            }
            RequestInner::Task { handle, .. } => {
                Ok(handle.as_ref().is_none_or(|h| h.is_finished()))
            }
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        match &mut self.inner {
            RequestInner::P2p {
                world, loan, any, ..
            } => {
                if let Some(l) = loan.take() {
                    // An owned buffer goes to the engine; lent memory waits for its
                    // operation (at most HCOMM_TIMEOUT), so that it is free once this returns.
                    let id = l.id();
                    world.engine.release(l, world.config.timeout);
                    note_source(world, id, any);
                }
            }
            RequestInner::Task { handle, lent: true } => {
                if let Some(h) = handle.take() {
                    // The call is bounded by HCOMM_TIMEOUT; its result goes unseen.
                    let _ = h.join();
                }
            }
            RequestInner::Task { .. } => {}
        }
    }
}

/// Records the sender of receive-from-any-source `id` (`any` is `Some` for one), whose
/// result was just taken from the engine.
fn note_source(world: &World, id: OpId, any: &mut Option<Option<usize>>) {
    if let Some(source) = any {
        *source = world.engine.take_source(id);
    }
}

/// Waits for every request, in order; the first error is returned after all were waited for.
pub fn wait_all(requests: Vec<Request>) -> Result<Vec<Completion>> {
    let mut out = Vec::with_capacity(requests.len());
    let mut first_err = None;
    for r in requests {
        match r.wait() {
            Ok(c) => out.push(c),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn init_logging(level: Option<u8>) {
    static ONCE: Once = Once::new();
    let Some(level) = level else { return };
    ONCE.call_once(|| {
        let max = match level {
            0 => tracing::Level::ERROR,
            1 => tracing::Level::WARN,
            2 => tracing::Level::INFO,
            3 => tracing::Level::DEBUG,
            _ => tracing::Level::TRACE,
        };
        let _ = tracing_subscriber::fmt()
            .with_max_level(max)
            .with_writer(std::io::stderr)
            .with_target(false)
            .try_init();
    });
}

/// This rank's shared-memory pool: blocks named with the shared-memory job id, mapped by the
/// local ranks (a rank without local peers names them after its process too).
fn make_pool(
    config: &Config,
    engine: &Engine,
    rank: usize,
    local_size: usize,
    generation: u64,
) -> Result<Option<Arc<ShmPool>>> {
    let max_total = match config.pool_max {
        Some(0) => return Ok(None),
        Some(max) => max,
        None => default_max_total(local_size, config.pool_block),
    };
    let job_id = match engine.shm_job_id() {
        Some(id) => id.to_owned(),
        None => format!(
            "{}p{}",
            link::job_id(b"", "", generation),
            std::process::id()
        ),
    };
    let pool_config = PoolConfig {
        block_size: config.pool_block,
        max_total: max_total.max(config.pool_block),
        mappers: local_size as u32,
    };
    ShmPool::new(&job_id, rank as u32, pool_config).map(|p| Some(Arc::new(p)))
}

/// Sets up the shared-memory links with the other ranks of this host (unless
/// `HCOMM_TRANSPORT` names another transport than `shm`): every local rank creates its inbox
/// (named with `job_id`), publishes it under `ns` in the store, and maps the others'.
fn setup_shm(
    config: &Config,
    topology: &Topology,
    rank: usize,
    client: &mut StoreClient,
    (ns, job_id): (&str, &str),
    deadline: Instant,
) -> Result<Option<ShmSetup>> {
    let host = topology.host_of(rank);
    let locals: Vec<usize> = (0..topology.size())
        .filter(|&r| topology.host_of(r) == host)
        .collect();
    if locals.len() < 2 || config.transport.as_deref().is_some_and(|t| t != "shm") {
        return Ok(None);
    }
    let job_id = job_id.to_owned();
    let me = topology.local_rank(rank);
    link::prepare_cma(config.cma);
    let cfg = LinkConfig {
        job_id,
        ring_bytes: config.shm_ring,
        cma: config.cma,
    };
    let inbox = Inbox::create(&cfg, rank, locals.len(), me)?;
    let linked = (|| {
        let mine = inbox.published().encode();
        let all =
            bootstrap::exchange(client, &format!("{ns}/shm"), rank, &mine, &locals, deadline)?;
        let mut links = Vec::with_capacity(locals.len() - 1);
        for (i, (&r, published)) in locals.iter().zip(&all).enumerate() {
            if r != rank {
                links.push((r, inbox.link(i, r, &Published::decode(r, published)?)?));
            }
        }
        Ok(links)
    })();
    match linked {
        Ok(links) => {
            let cma: Vec<_> = links
                .iter()
                .filter(|(_, l)| l.cma)
                .map(|(r, _)| *r)
                .collect();
            let tcp_too: Vec<_> = links
                .iter()
                .filter(|(_, l)| l.end.is_none())
                .map(|(r, _)| *r)
                .collect();
            let line = format!(
                "hcomm: rank {rank}: shared memory with world ranks {:?} (inbox {}; \
                 cross-memory attach with {cma:?}; a TCP connection beside it with \
                 {tcp_too:?}); inline <= {} B, receiver pull {}, in {} B pieces (sender push \
                 without cross-memory attach); TCP with the others",
                links.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
                inbox.published().name,
                config.shm_eager_limit,
                match config.shm_push_threshold {
                    usize::MAX => "above it".to_owned(),
                    t => format!("<= {t} B, sender push above"),
                },
                config.shm_chunk,
            );
            if config.debug {
                // HCOMM_DEBUG=1 asks for exactly this on the terminal.
                eprintln!("{line}");
            }
            tracing::debug!("{line}");
            Ok(Some(ShmSetup { inbox, links }))
        }
        Err(e) => {
            inbox.abandon();
            Err(e)
        }
    }
}

/// Opens this rank's libfabric endpoint, preferably on the interface of `ip` (the address
/// this rank announces): with `HCOMM_TRANSPORT=ofi` on any provider (an error says why it
/// cannot), by default only on a provider with hardware RMA (none found: `None`, and TCP
/// carries the traffic), never when `HCOMM_TRANSPORT` names another transport.
fn open_ofi(config: &Config, rank: usize, ip: std::net::IpAddr) -> Result<Option<ofi::Endpoint>> {
    let forced = match config.transport.as_deref() {
        Some("ofi") => true,
        Some(_) => return Ok(None),
        None => false,
    };
    if !forced && !ofi::hardware_visible() {
        let why = "no RDMA device or Slingshot NIC on this host (/sys/class/infiniband, \
                   /dev/infiniband, /sys/class/cxi, /dev/cxi*): libfabric not asked";
        tracing::debug!(rank, "libfabric not used: {why}");
        if config.debug {
            // HCOMM_DEBUG=1 asks for exactly this on the terminal.
            eprintln!("hcomm: rank {rank}: libfabric not used: {why}");
        }
        return Ok(None);
    }
    let opts = ofi::Options {
        lib: config.ofi_lib.clone(),
        hardware_only: !forced,
        node: Some(ip.to_string()),
        wait_fd: config.ofi_cq_fd,
    };
    match ofi::Endpoint::open(&opts) {
        Ok(ep) => Ok(Some(ep)),
        Err(e) if forced => Err(e.prefixed("HCOMM_TRANSPORT=ofi")),
        Err(e) => {
            tracing::debug!(rank, "libfabric not used: {}", e.detail());
            if config.debug {
                // HCOMM_DEBUG=1 asks for exactly this on the terminal.
                eprintln!("hcomm: rank {rank}: libfabric not used: {}", e.detail());
            }
            Ok(None)
        }
    }
}

/// Which peers the libfabric endpoint `ep` carries: every other rank with
/// `HCOMM_TRANSPORT=ofi` (each must have published an address), by default those on other
/// hosts that have one; `None` when it carries none.
fn ofi_carrier(
    ep: ofi::Endpoint,
    fabric: Vec<Option<Vec<u8>>>,
    topology: &Topology,
    rank: usize,
    config: &Config,
) -> Result<Option<Carrier>> {
    let forced = config.transport.as_deref() == Some("ofi");
    let mut addrs = fabric;
    for (p, a) in addrs.iter_mut().enumerate() {
        if p == rank || (!forced && topology.host_of(p) == topology.host_of(rank)) {
            *a = None;
        } else if forced && a.is_none() {
            return Err(Error::init(format!(
                "HCOMM_TRANSPORT=ofi: rank {p} published no libfabric endpoint: set \
                 HCOMM_TRANSPORT=ofi for every rank"
            ))
            .with_peer(PeerRank::world(p)));
        }
    }
    if addrs.iter().all(Option::is_none) {
        return Ok(None);
    }
    let limits = OfiLimits {
        eager: config.ofi_eager_limit,
        write: config.ofi_write_threshold,
        direct: config.ofi_direct,
    };
    Ok(Some(Carrier::Ofi(Box::new(OfiSetup {
        endpoint: ep,
        addrs,
        limits,
    }))))
}

/// How the ranks of a world of more than one rank meet: this rank's connection to the world's
/// rendezvous store, the store itself where this rank hosts it, the secret that authenticates
/// the ranks to each other, the prefix of the world's keys in the store, and the id in the
/// world's shared-memory names (the same on every rank).
struct Boot {
    client: StoreClient,
    store: Option<RendezvousStore>,
    secret: Secret,
    ns: String,
    shm_id: String,
}

impl World {
    /// Starts the world of `config.launch` (its rank and size): `meet` connects a world of
    /// more than one rank to its store, given the settings and this world's number among the
    /// worlds of this process. Returns the world and where its ranks run.
    fn start(
        config: Config,
        meet: impl FnOnce(&Config, u64) -> Result<Boot>,
    ) -> Result<(Arc<World>, Topology)> {
        init_logging(config.log_level);
        let selector = Selector::new(config.algo.as_deref(), config.deterministic)?;
        // A transport plug-in carries all traffic; the TCP mesh (one stream per peer) then
        // only starts the job and notices peers that die.
        let lease = match config.transport.as_deref() {
            Some(name) if !plugin::BUILT_IN.contains(&name) => Some(plugin::Lease::take(name)?),
            _ => None,
        };
        let (rank, size) = (config.launch.rank, config.launch.size);
        let force_ofi = config.transport.as_deref() == Some("ofi");
        if force_ofi {
            ofi::preflight(&config.ofi_lib).map_err(|e| e.prefixed("HCOMM_TRANSPORT=ofi"))?;
        }
        let tcp_streams = match (&lease, force_ofi) {
            (Some(_), _) | (None, true) => 1,
            _ => config.tcp_streams,
        };
        let deadline = Instant::now() + config.timeout;
        let generation = WORLDS.fetch_add(1, Ordering::SeqCst);
        let me = RankInfo::current(config.host_id.as_deref());
        let (mesh, topology, shm, store, client, ofi, fabric, announce) = if size == 1 {
            (
                None,
                Topology::new(vec![me]),
                None,
                None,
                None,
                None,
                Vec::new(),
                None,
            )
        } else {
            // Chosen before the store is reached, so that a choice that matches nothing fails
            // every rank at once.
            let rails = rail_addrs(&config)?;
            let Boot {
                mut client,
                store,
                secret,
                ns,
                shm_id,
            } = meet(&config, generation)?;
            let (listener, mine) = listen_on_rails(&config, rails, client.local_addr().ip())?;
            let all: Vec<usize> = (0..size).collect();
            let addrs = bootstrap::exchange(
                &mut client,
                &format!("{ns}/addr"),
                rank,
                mine.as_bytes(),
                &all,
                deadline,
            )?
            .iter()
            .enumerate()
            .map(|(r, a)| {
                std::str::from_utf8(a)
                    .ok()
                    .and_then(tcp::parse_addrs)
                    .ok_or_else(|| {
                        Error::init(format!("rank {r} published a malformed address"))
                            .with_peer(PeerRank::world(r))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
            let infos = bootstrap::exchange(
                &mut client,
                &format!("{ns}/info"),
                rank,
                &me.encode(),
                &all,
                deadline,
            )?
            .iter()
            .enumerate()
            .map(|(r, info)| RankInfo::decode(r, info))
            .collect::<Result<Vec<_>>>()?;
            // Shared memory first: local pairs it links alone need no TCP connection.
            let topology = Topology::new(infos);
            let shm = setup_shm(
                &config,
                &topology,
                rank,
                &mut client,
                (&ns, &shm_id),
                deadline,
            )?;
            // The address this rank announces first (its first rail).
            let announce = match addrs.get(rank).and_then(|a| a.first()) {
                Some(a) => a.ip(),
                None => client.local_addr().ip(),
            };
            // libfabric only where the world may use it: forced, or by default between hosts.
            // Every rank sees the same topology, so all agree on exchanging the endpoints'
            // addresses (an empty one: none).
            let hosts = (0..size).any(|p| topology.host_of(p) != topology.host_of(0));
            let (ofi, fabric) = if force_ofi || (config.transport.is_none() && hosts) {
                let opened = open_ofi(&config, rank, announce);
                let name = match &opened {
                    Ok(Some(ep)) => ep.name()?,
                    _ => Vec::new(),
                };
                let fabric = bootstrap::exchange(
                    &mut client,
                    &format!("{ns}/ofi"),
                    rank,
                    &name,
                    &all,
                    deadline,
                )?
                .into_iter()
                .map(|a| (!a.is_empty()).then_some(a))
                .collect();
                (opened?, fabric)
            } else {
                (None, Vec::new())
            };
            // No TCP connection yet: each is made on its pair's first use, and never for a
            // pair that shared memory links alone (the engine knows them from `shm`).
            let mesh = tcp::MeshConfig {
                listener,
                rank,
                addrs,
                streams: tcp_streams,
                secret,
                timeout: config.timeout,
                failover: config.failover,
                // A rail must be given up before the heartbeats (HCOMM_TIMEOUT / 2) give up
                // the peer.
                link_timeout: config.link_timeout.min(config.timeout / 4),
                congestion: config.tcp_congestion.clone(),
            };
            (
                Some(mesh),
                topology,
                shm,
                store,
                Some(Mutex::new(client)),
                ofi,
                fabric,
                Some(announce),
            )
        };
        let local_size = topology.local_size(rank);
        let cores = topology.local_cores(rank);
        let spin = match config.spin_us {
            Some(us) => Duration::from_micros(us),
            None if local_size <= cores => DEFAULT_SPIN,
            None => Duration::ZERO,
        };
        let waits = format!(
            "hcomm: rank {rank}: {local_size} local ranks on {cores} core(s): waits {}",
            if spin.is_zero() {
                "sleep at once (no spinning; one-sided collectives yield a few times \
                 first), woken by the rank they wait for"
            } else {
                "spin, then yield, then sleep"
            }
        );
        if config.debug {
            // HCOMM_DEBUG=1 asks for exactly this on the terminal.
            eprintln!("{waits}");
        }
        tracing::debug!("{waits}");
        if let Some(lease) = &lease {
            let line = format!(
                "hcomm: rank {rank}: all traffic through the transport plug-in {:?}",
                lease.name()
            );
            if config.debug {
                // HCOMM_DEBUG=1 asks for exactly this on the terminal.
                eprintln!("{line}");
            }
            tracing::debug!("{line}");
        }
        let via_plugin = lease.is_some();
        let carrier = match (lease, ofi) {
            (Some(lease), _) => Some(Carrier::Plugin(lease)),
            (None, Some(ep)) => ofi_carrier(ep, fabric, &topology, rank, &config)?,
            (None, None) => None,
        };
        let ofi_peers: Vec<bool> = match &carrier {
            Some(Carrier::Ofi(setup)) => setup.addrs.iter().map(Option::is_some).collect(),
            _ => vec![false; size],
        };
        let engine = Engine::new(
            size,
            mesh,
            shm,
            carrier,
            EngineConfig {
                rank,
                eager_limit: config.tcp_eager_limit,
                chunk: config.tcp_chunk,
                spin,
                shm_eager_limit: config.shm_eager_limit,
                shm_push_threshold: config.shm_push_threshold,
                shm_chunk: config.shm_chunk,
                shm_split_threshold: config.shm_split_threshold,
                describe: crate::coll::Shape::describe_signature,
                timeout: config.timeout,
                run_fd: config.run_fd,
                debug: config.debug,
            },
        )?;
        if config.debug && rank == 0 {
            // HCOMM_DEBUG=1 asks for exactly this on the terminal.
            eprint!("{}", topology.table());
        }
        let pool = make_pool(&config, &engine, rank, local_size, generation)?;
        if let (Some(pool), Some(watcher)) = (&pool, engine.block_watcher()) {
            // libfabric registers the pool's blocks whole, as they are made.
            pool.watch(watcher)?;
        }
        if config.debug {
            // HCOMM_DEBUG=1 asks for exactly this on the terminal.
            match &pool {
                Some(p) => eprintln!(
                    "hcomm: rank {rank}: shared-memory pool: blocks of {} B (larger \
                     allocations get a block of their size), at most {} B in all \
                     (HCOMM_POOL_BLOCK, HCOMM_POOL_MAX); what does not fit uses the heap",
                    p.block_size(),
                    p.max_total()
                ),
                None => eprintln!("hcomm: rank {rank}: shared-memory pool off (HCOMM_POOL_MAX=0)"),
            }
        }
        tracing::debug!(rank, size, launcher = ?config.launch.launcher, "world ready");
        let observe = crate::observe::attach(&config, rank, size);
        let routes = (0..size)
            .map(|p| match engine.shm_peer_pid(p) {
                _ if p == rank => Route::Own,
                _ if via_plugin => Route::Plugin,
                _ if ofi_peers[p] => Route::Ofi,
                Some((_, cma)) => Route::Shm { cma },
                None => Route::Tcp,
            })
            .collect();
        let world = Arc::new(World {
            config,
            selector,
            engine,
            rank,
            spin: !spin.is_zero(),
            pool,
            routes,
            announce,
            _observe: observe,
            _store: store,
            _client: client,
        });
        Ok((world, topology))
    }
}

impl Communicator {
    /// Joins the job this process was launched into (see the README for the launchers and
    /// variables), or makes a world of one rank when there is no launcher.
    pub fn init() -> Result<Communicator> {
        Communicator::init_with(Config::from_env()?)
    }

    /// Joins the job described by `config`.
    pub fn init_with(config: Config) -> Result<Communicator> {
        let (world, topology) = World::start(config, |config, generation| {
            let secret = config.job_secret.clone().ok_or_else(|| {
                Error::init(
                    "HCOMM_JOB_SECRET is not set: give every rank of the job the same secret \
                     (hcommrun does this for you)",
                )
            })?;
            let root = config.launch.root_addr.clone().ok_or_else(|| {
                Error::init("HCOMM_ROOT_ADDR is not set: the ranks cannot find each other")
            })?;
            let (client, store) = if config.launch.rank == 0 {
                host_or_join(&root, secret.expose(), config.timeout)?
            } else {
                let client = StoreClient::connect(&root, secret.expose(), config.timeout)?;
                (client, None)
            };
            Ok(Boot {
                client,
                store,
                shm_id: link::job_id(secret.expose(), &root, generation),
                secret,
                ns: format!("hcomm/{generation}"),
            })
        })?;
        Ok(Communicator::of_world(world, topology, WORLD_ID, 0))
    }

    /// The communicator `id` at `epoch` of every rank of `world` (whose ranks run where
    /// `topology` says).
    fn of_world(world: Arc<World>, topology: Topology, id: u64, epoch: u32) -> Communicator {
        let members: Arc<[usize]> = (0..topology.size()).collect();
        world.engine.register_comm(id, &members);
        Communicator {
            state: CommState::new(&world.engine, (id, epoch), world.rank, &members),
            rank: world.rank,
            world,
            id,
            members,
            topology: Arc::new(topology),
            epoch,
        }
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the communicator.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Rank among the members on this host.
    pub fn local_rank(&self) -> usize {
        self.topology.local_rank(self.rank)
    }

    /// Number of members on this host.
    pub fn local_size(&self) -> usize {
        self.topology.local_size(self.rank)
    }

    /// Where every member runs.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The settings the world was created with.
    pub fn config(&self) -> &Config {
        &self.world.config
    }

    /// How many messages of this process took each protocol so far (all communicators of
    /// the world together).
    pub fn protocol_stats(&self) -> ProtocolStats {
        self.world.engine.protocol_stats()
    }

    /// Whether messages to `rank` (of this communicator) travel through shared memory.
    pub fn uses_shm(&self, rank: usize) -> bool {
        self.members
            .get(rank)
            .is_some_and(|&w| self.world.engine.is_shm_peer(w))
    }

    /// The TCP streams to `rank` (its rails, `HCOMM_SOCKET_IFNAME`), each as
    /// `local-ip -> remote-ip`, ` (lost)` after one that failed and is not back; empty when
    /// no TCP connection to it was made (shared memory, or not used yet).
    pub fn tcp_rails(&self, rank: usize) -> Vec<String> {
        self.members
            .get(rank)
            .map_or_else(Vec::new, |&w| self.world.engine.tcp_rails(w))
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.world.config.timeout
    }

    fn target(&self, comm: u64, peer: usize, tag: u32, what: &str) -> Result<Target> {
        match self.members.get(peer) {
            Some(&world_rank) => Ok(Target {
                comm,
                peer: world_rank,
                comm_rank: peer,
                tag,
                sig: [0; 2],
                seq: 0,
                epoch: self.epoch,
            }),
            None => Err(Error::invalid_argument(format!(
                "{what} rank {peer} does not exist: the communicator has {} ranks",
                self.size()
            ))),
        }
    }

    /// Sends `buf` to rank `dest` with `tag`; returns when `buf` may be reused.
    pub fn send(&self, buf: &[u8], dest: usize, tag: u32) -> Result<()> {
        let t = self.target(self.id, dest, tag, "destination")?;
        let t = self.numbered(t, Blocking::Send);
        self.recorded(OpKind::Send, &t, buf.len(), || self.send_to(t, buf))
    }

    /// Runs `f`, a point-to-point operation `kind` of `len` bytes with `t`'s peer, recorded
    /// for the profiler and the trace.
    fn recorded<R>(&self, kind: OpKind, t: &Target, len: usize, f: impl FnOnce() -> R) -> R {
        let op = self.world.p2p_scope(kind, t, len, self.size());
        let r = f();
        drop(op);
        self.world.publish_counters();
        r
    }

    fn send_to(&self, t: Target, buf: &[u8]) -> Result<()> {
        let timeout = self.world.config.timeout;
        let mut lease = Lease::from(buf);
        self.world
            .engine
            .transfer(Blocking::Send, t, &mut lease, timeout)
            .map(drop)
    }

    /// Receives a message from rank `src` with `tag` into `buf`; returns its length.
    /// A longer message gives [`Error::Truncated`] (and is consumed). `src` may be
    /// [`ANY_SOURCE`]: see [`Communicator::recv_any`], which also tells the sender.
    pub fn recv(&self, buf: &mut [u8], src: usize, tag: u32) -> Result<usize> {
        if src == ANY_SOURCE {
            return self.recv_any(buf, tag).map(|s| s.len);
        }
        let t = self.target(self.id, src, tag, "source")?;
        let t = self.numbered(t, Blocking::Recv);
        self.recorded(OpKind::Recv, &t, buf.len(), || self.recv_from(t, buf))
    }

    /// Receives a message with `tag` from any rank of the communicator (this one included)
    /// into `buf`; returns the sender and the length. MPI's rules: messages from one sender
    /// are received in the order they were sent; receives are matched in the order they were
    /// posted, specific ones and these alike; a message already here is taken in arrival
    /// order. A longer message gives [`Error::Truncated`] (and is consumed).
    ///
    /// While it waits, a member of the communicator that is lost (killed, unreachable) fails
    /// it with [`Error::PeerLost`] at once, since that rank may have been the sender (the
    /// rule of MPI's fault-tolerance proposal, ULFM); so does every other member having
    /// finalized. Once a member is lost, receives from any source on the communicator fail
    /// unless a message is already here: receive from named ranks instead. Point-to-point
    /// only: collectives never match a receive from any source.
    pub fn recv_any(&self, buf: &mut [u8], tag: u32) -> Result<RecvStatus> {
        let t = self.numbered(self.any_target(tag), Blocking::Recv);
        self.recorded(OpKind::Recv, &t, buf.len(), || {
            let members = Arc::clone(&self.members);
            let mut lease = Lease::from(buf);
            let (len, source) =
                self.world
                    .engine
                    .transfer_any(t, members, &mut lease, self.deadline());
            let len = len?;
            source
                .map(|source| RecvStatus { source, len })
                .ok_or_else(|| Error::internal("a receive from any source has no sender"))
        })
    }

    /// The target of a receive from any source of this communicator with `tag`.
    fn any_target(&self, tag: u32) -> Target {
        Target {
            comm: self.id,
            peer: ANY_PEER,
            comm_rank: ANY_PEER,
            tag,
            sig: [0; 2],
            seq: 0,
            epoch: self.epoch,
        }
    }

    /// `t` as this communicator's next point-to-point call of direction `kind`: numbered
    /// from 1, sends and receives apart, in the order this rank starts them (docs/errors.md).
    /// A load and a store, not an atomic add: the add costs a locked instruction on every
    /// call (about 20 ns more per call here, measured beside a mutex), and the number only
    /// names the call in errors; calls started at the same time on one communicator by
    /// several threads, whose order is undefined anyway, may share a number.
    fn numbered(&self, mut t: Target, kind: Blocking) -> Target {
        let count = match kind {
            Blocking::Send => &self.state.sends,
            Blocking::Recv => &self.state.recvs,
        };
        t.seq = count.load(Ordering::Relaxed) + 1;
        count.store(t.seq, Ordering::Relaxed);
        t
    }

    fn recv_from(&self, t: Target, buf: &mut [u8]) -> Result<usize> {
        let timeout = self.world.config.timeout;
        let mut lease = Lease::from(buf);
        self.world
            .engine
            .transfer(Blocking::Recv, t, &mut lease, timeout)
    }

    /// Sends `sendbuf` to `dest` and receives from `src` into `recvbuf` at the same time, so
    /// that ranks exchanging with each other never deadlock. Returns the received length.
    pub fn sendrecv(
        &self,
        sendbuf: &[u8],
        dest: usize,
        sendtag: u32,
        recvbuf: &mut [u8],
        src: usize,
        recvtag: u32,
    ) -> Result<usize> {
        let st = self.target(self.id, dest, sendtag, "destination")?;
        let rt = self.target(self.id, src, recvtag, "source")?;
        let (st, rt) = (
            self.numbered(st, Blocking::Send),
            self.numbered(rt, Blocking::Recv),
        );
        self.recorded(OpKind::SendRecv, &st, sendbuf.len(), || {
            self.exchange(st, sendbuf, rt, recvbuf)
        })
    }

    fn exchange(
        &self,
        st: Target,
        sendbuf: &[u8],
        rt: Target,
        recvbuf: &mut [u8],
    ) -> Result<usize> {
        let deadline = self.deadline();
        let (recv_len, send_len) = (recvbuf.len(), sendbuf.len());
        let mut bufs = [Lease::from(recvbuf), Lease::from(sendbuf)];
        self.world.engine.scope(&mut bufs, |ops| {
            let rid = ops.post(
                Blocking::Recv,
                rt,
                Part {
                    buf: 0,
                    off: 0,
                    len: recv_len,
                },
            )?;
            // On an error the scope cancels the receive: it never outlives this call.
            let sid = ops.post(
                Blocking::Send,
                st,
                Part {
                    buf: 1,
                    off: 0,
                    len: send_len,
                },
            )?;
            let (mut sent, mut received) = (None, None);
            while sent.is_none() || received.is_none() {
                let ids: Vec<OpId> = [(sid, &sent), (rid, &received)]
                    .iter()
                    .filter(|(_, r)| r.is_none())
                    .map(|&(id, _)| id)
                    .collect();
                let (k, r) = ops.wait_any(&ids, deadline)?;
                match ids[k] == sid {
                    true => sent = Some(r),
                    false => received = Some(r),
                }
                if sent.as_ref().is_some_and(Result::is_err) {
                    break;
                }
            }
            sent.unwrap_or(Ok(0))?;
            received.unwrap_or(Ok(0))
        })
    }

    /// Starts sending `buf` to `dest`; [`Request::wait`] gives the buffer back.
    pub fn isend(&self, buf: Vec<u8>, dest: usize, tag: u32) -> Result<Request> {
        self.post_async(Blocking::Send, dest, tag, Lease::from(buf))
    }

    /// Starts receiving from `src` into `buf` (its length is the capacity);
    /// [`Request::wait`] gives the buffer back with the received length. `src` may be
    /// [`ANY_SOURCE`] (the rules of [`Communicator::recv_any`]): the completion then names
    /// the sender ([`Completion::source`]).
    pub fn irecv(&self, buf: Vec<u8>, src: usize, tag: u32) -> Result<Request> {
        self.post_async(Blocking::Recv, src, tag, Lease::from(buf))
    }

    /// Posts a nonblocking send to or receive from `peer` ([`ANY_SOURCE`] for a receive from
    /// any source) of `buf`, recorded for the profiler.
    fn post_async(
        &self,
        kind: Blocking,
        peer: usize,
        tag: u32,
        buf: Lease<'static>,
    ) -> Result<Request> {
        let engine = &self.world.engine;
        if kind == Blocking::Recv && peer == ANY_SOURCE {
            let t = self.numbered(self.any_target(tag), Blocking::Recv);
            drop(
                self.world
                    .p2p_scope(OpKind::Irecv, &t, buf.len(), self.size()),
            );
            let loan = engine.lend_any(t, Arc::clone(&self.members), buf)?;
            return Ok(Request::p2p(&self.world, loan, true));
        }
        let (what, op) = match kind {
            Blocking::Send => ("destination", OpKind::Isend),
            Blocking::Recv => ("source", OpKind::Irecv),
        };
        let t = self.numbered(self.target(self.id, peer, tag, what)?, kind);
        drop(self.world.p2p_scope(op, &t, buf.len(), self.size()));
        let loan = engine.lend(kind, t, buf)?;
        Ok(Request::p2p(&self.world, loan, false))
    }

    /// Returns when every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        let shape = crate::coll::Shape::new(
            crate::coll::CollKind::Barrier,
            crate::dtype::DataType::Uint8,
            crate::dtype::ReduceOp::Sum,
            0,
            0,
            self.size(),
        );
        self.run_collective(shape, None, &mut [])
    }

    /// Every rank's `mine`, by rank (hcomm's own small all-gather for communicator creation):
    /// Bruck's all-gather in ceil(log2 n) rounds, so that each rank talks to that many peers
    /// each way (as [`Communicator::all_agree`]), not to all n - 1. In round k (distance
    /// d = 2^k) a rank sends the records it holds, its own and those of the d - 1 ranks before
    /// it, to rank + d, and receives those of rank - d and the ranks before that one.
    fn exchange_all(&self, mine: &[u8; 16]) -> Result<Vec<[u8; 16]>> {
        const R: usize = 16;
        let n = self.size();
        // held[i * R..]: the record of rank (rank - i) mod n.
        let mut held = vec![0u8; n * R];
        held[..R].copy_from_slice(mine);
        let mut dist = 1;
        while dist < n {
            let to = (self.rank + dist) % n;
            let from = (self.rank + n - dist) % n;
            let count = dist.min(n - dist);
            let st = self.target(self.id | INTERNAL, to, TAG_SPLIT, "split")?;
            let rt = self.target(self.id | INTERNAL, from, TAG_SPLIT, "split")?;
            let (have, rest) = held.split_at_mut(dist * R);
            let got = self.exchange(st, &have[..count * R], rt, &mut rest[..count * R])?;
            if got != count * R {
                return Err(Error::mismatch(format!(
                    "rank {from} sent {got} bytes during communicator creation, not {}: ranks \
                     are calling different operations",
                    count * R
                ))
                .with_peer(PeerRank::ranks(from, self.members[from])));
            }
            dist *= 2;
        }
        let mut all = vec![[0u8; R]; n];
        for (i, rec) in held.chunks_exact(R).enumerate() {
            all[(self.rank + n - i) % n].copy_from_slice(rec);
        }
        Ok(all)
    }

    /// Whether every rank says `ok` (collective): a dissemination in ceil(log2 n) rounds of
    /// one exchange each, so that each rank talks to that many peers (an all-to-all would
    /// make every pair of the host use its rings, and owe a goodbye through them at finalize).
    fn all_agree(&self, ok: bool) -> Result<bool> {
        let n = self.size();
        let mut all = ok;
        let mut dist = 1;
        while dist < n {
            let to = (self.rank + dist) % n;
            let from = (self.rank + n - dist) % n;
            let st = self.target(self.id | INTERNAL, to, TAG_AGREE, "agreement")?;
            let rt = self.target(self.id | INTERNAL, from, TAG_AGREE, "agreement")?;
            let mut theirs = [0u8; 1];
            let got = self.exchange(st, &[u8::from(all)], rt, &mut theirs)?;
            if got != 1 || theirs[0] > 1 {
                return Err(Error::mismatch(format!(
                    "rank {from} sent something else than an agreement: ranks are calling \
                     different operations"
                ))
                .with_peer(PeerRank::ranks(from, self.members[from])));
            }
            all &= theirs[0] == 1;
            dist *= 2;
        }
        Ok(all)
    }

    fn derive(&self, id: u64, members: Vec<usize>, rank: usize) -> Communicator {
        self.derive_at(id, members, rank, self.epoch)
    }

    /// A communicator `id` of the `members` (ranks of this one) at `epoch`, where this
    /// process is rank `rank`.
    fn derive_at(&self, id: u64, members: Vec<usize>, rank: usize, epoch: u32) -> Communicator {
        let world_members: Arc<[usize]> = members.iter().map(|&r| self.members[r]).collect();
        self.world.engine.register_comm(id, &world_members);
        Communicator {
            world: Arc::clone(&self.world),
            id,
            rank,
            topology: Arc::new(self.topology.subset(&members)),
            state: CommState::new(&self.world.engine, (id, epoch), rank, &world_members),
            members: world_members,
            epoch,
        }
    }

    fn next_id(&self, color: u64) -> u64 {
        let n = self.state.derived.fetch_add(1, Ordering::SeqCst);
        let id = mix(self.id ^ mix(n ^ mix(color)));
        // Keep clear of the world's id and of the internal and collective channels.
        (id & !(INTERNAL | COLL)).max(WORLD_ID + 1)
    }

    /// Splits into disjoint communicators: ranks with the same `color` land together,
    /// ordered by `key` then by rank here. Collective over this communicator. A negative
    /// color joins none and returns `None`.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Communicator>> {
        let mut mine = [0u8; 16];
        mine[..4].copy_from_slice(&color.to_le_bytes());
        mine[4..8].copy_from_slice(&key.to_le_bytes());
        let all = self.exchange_all(&mine)?;
        let decode = |b: &[u8; 16]| {
            (
                i32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            )
        };
        // Every rank draws an id for every color so that all stay in step.
        let id = self.next_id(color as u32 as u64);
        if color < 0 {
            return Ok(None);
        }
        let mut members: Vec<(i32, usize)> = all
            .iter()
            .enumerate()
            .filter_map(|(r, b)| {
                let (c, k) = decode(b);
                (c == color).then_some((k, r))
            })
            .collect();
        members.sort();
        let members: Vec<usize> = members.into_iter().map(|(_, r)| r).collect();
        let rank = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| Error::internal("this rank is missing from its own split"))?;
        Ok(Some(self.derive(id, members, rank)))
    }

    /// A new communicator with the same members, whose messages never match this one's.
    /// Collective over this communicator.
    pub fn dup(&self) -> Result<Communicator> {
        // Every member has entered: a dissemination of ceil(log2 n) rounds (the barrier's
        // algorithm of choice may talk to every member, opening links to all of them).
        self.all_agree(true)?;
        let id = self.next_id(u64::MAX);
        Ok(self.derive(id, (0..self.size()).collect(), self.rank))
    }

    /// Aborts the communicator, on every rank: each operation pending on it — here, on
    /// other threads, and on the other members, which this rank tells at once — fails with
    /// [`Error::Aborted`], and so does every later call on it (communicators derived from it
    /// before are not affected). It returns without waiting for the other ranks; release the
    /// communicator afterwards as usual. Aborting twice does nothing more.
    pub fn abort(&self) -> Result<()> {
        let comms = [self.id, self.id | COLL, self.id | INTERNAL];
        self.world.engine.abort_comm(comms, &self.members);
        flight::dump_on(flight::Reason::Abort);
        // The sub-communicators of the tiered all-reduce run parts of this one's calls. While
        // they are being made (a split over this communicator, which the abort ends) there
        // are none to abort yet.
        let tiers = match self.state.tiers.try_lock() {
            Ok(slot) => slot.clone(),
            Err(_) => None,
        };
        if let Some(tiers) = tiers {
            tiers.abort()?;
        }
        Ok(())
    }

    /// Writes the flight recorder of every communicator of this process (the last
    /// `HCOMM_TRACE_BUFFER` collective calls of each) to this rank's dump file in
    /// `HCOMM_TRACE_DIR`, replacing an earlier dump, and returns the file. Local: the other
    /// ranks are not involved (`hcomm_trace DIR` merges the dumps of a job). Fails when the
    /// recorder is off (`HCOMM_TRACE_BUFFER=0`) or the file cannot be written.
    pub fn dump_trace(&self) -> Result<std::path::PathBuf> {
        if self.state.flight.is_none() {
            return Err(Error::invalid_argument(
                "the flight recorder is off (HCOMM_TRACE_BUFFER=0): there is nothing to dump",
            ));
        }
        flight::dump(flight::Reason::Api)
    }

    /// Releases the communicator. For the last communicator of a world this delivers what
    /// is still queued (bounded by `HCOMM_TIMEOUT`) and closes the connections.
    pub fn destroy(self) -> Result<()> {
        drop(self);
        Ok(())
    }
}

/// The addresses this rank listens on and announces, one per rail: `HCOMM_IFADDR` alone
/// when that is set, else those of the interfaces `HCOMM_SOCKET_IFNAME` selects (or the
/// default ones). Chosen before the store is reached, so that a choice that matches nothing
/// fails every rank at once.
fn rail_addrs(config: &Config) -> Result<Vec<(String, IpAddr)>> {
    if let Some(a) = &config.if_addr {
        let ip = a.parse().map_err(|_| {
            Error::invalid_argument(format!("HCOMM_IFADDR={a:?} is not an IP address"))
        })?;
        return Ok(vec![("HCOMM_IFADDR".to_string(), ip)]);
    }
    let spec = match &config.socket_ifname {
        Some(v) => IfSpec::parse(v)?,
        None => None,
    };
    let up = iface::up_interfaces()?;
    Ok(iface::select(spec.as_ref(), &up)?
        .into_iter()
        .map(|i| (i.name, i.addr))
        .collect())
}

/// Binds this rank's listener on its rails (the one that reaches the store at `to_store`
/// first) and says what it publishes: its address on each.
fn listen_on_rails(
    config: &Config,
    mut rails: Vec<(String, IpAddr)>,
    to_store: IpAddr,
) -> Result<(TcpListener, String)> {
    if let Some(pos) = rails.iter().position(|(_, ip)| *ip == to_store) {
        let lead = rails.remove(pos);
        rails.insert(0, lead);
    }
    if config.debug {
        let names: Vec<String> = rails.iter().map(|(n, ip)| format!("{n} {ip}")).collect();
        // HCOMM_DEBUG=1 asks for exactly this on the terminal.
        eprintln!(
            "hcomm: rank {}: rails {}",
            config.launch.rank,
            names.join(", ")
        );
    }
    let ips: Vec<IpAddr> = rails.into_iter().map(|(_, ip)| ip).collect();
    let listener = tcp::listen_all(&ips)?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::transport("reading the listen address", e))?
        .port();
    Ok((listener, tcp::format_addrs(&ips, port)))
}

/// How long rank 0 tries to join a store at the root address before it tries again to host
/// one there itself.
const HOST_RETRY: Duration = Duration::from_secs(1);

/// Rank 0's store client, and the store when rank 0 hosts it: the store at `root` when rank 0
/// can bind it, else the one already listening there (a launcher's, such as `hcommrun`'s).
/// When neither (another socket holds the port, such as another job's listener, which does
/// not answer as a store), rank 0 tries both again every [`HOST_RETRY`] until `timeout`, so
/// that it hosts the store once the port is free.
fn host_or_join(
    root: &str,
    secret: &[u8],
    timeout: Duration,
) -> Result<(StoreClient, Option<RendezvousStore>)> {
    let deadline = Instant::now() + timeout;
    loop {
        let (store, bind_err) = host_store(root, secret);
        let retry = Instant::now() + HOST_RETRY;
        let until = if store.is_some() {
            deadline
        } else {
            deadline.min(retry)
        };
        match StoreClient::connect_until(root, secret, timeout, until) {
            Ok(client) => return Ok((client, store)),
            Err(Error::Timeout(_)) if until < deadline => {}
            Err(e) => {
                return Err(match &bind_err {
                    Some(b) => Error::init(format!(
                        "{} (rank 0 could not host the store there either: {b})",
                        e.detail()
                    )),
                    None => e,
                })
            }
        }
        tracing::debug!("rank 0: no store answers at {root} and its port is taken; retrying");
    }
}

/// Rank 0 hosts the store at `HCOMM_ROOT_ADDR` unless something (hcommrun's store) already
/// listens there; the bind error is kept to explain a later failure.
fn host_store(root: &str, secret: &[u8]) -> (Option<RendezvousStore>, Option<String>) {
    let addr = match root.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => return (None, Some(format!("{root} resolves to no address"))),
        Err(e) => return (None, Some(format!("cannot resolve {root}: {e}"))),
    };
    match RendezvousStore::bind(addr, secret) {
        Ok(s) => {
            tracing::debug!("rank 0 hosts the rendezvous store at {addr}");
            (Some(s), None)
        }
        Err(e) => {
            tracing::debug!("rank 0 does not host the store at {addr}: {e}");
            (None, Some(e.to_string()))
        }
    }
}
