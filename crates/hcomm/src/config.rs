//! Every environment variable hcomm reads, parsed in this one place.
//!
//! docs/environment.md documents the same list. Parsing is strict: a value that does not
//! parse is an [`Error::InvalidArgument`] naming the variable, never a silent default.

use std::time::Duration;

pub use crate::bootstrap::auth::Secret;
use crate::error::{Error, Result};
use crate::transport::iface::IfSpec;

/// Default bound on every wait, in seconds (`HCOMM_TIMEOUT`).
pub(crate) const DEFAULT_TIMEOUT_SECS: f64 = 300.0;
/// Default largest message sent eagerly over TCP (`HCOMM_TCP_EAGER_LIMIT`).
pub(crate) const DEFAULT_TCP_EAGER_LIMIT: usize = 64 * 1024;
/// Default time data may stay unacknowledged on a stream that can fail over
/// (`HCOMM_LINK_TIMEOUT`), in seconds.
const DEFAULT_LINK_TIMEOUT_SECS: f64 = 5.0;
/// Default number of TCP streams per peer (`HCOMM_TCP_STREAMS`).
pub(crate) const DEFAULT_TCP_STREAMS: usize = 2;
/// The library the `ofi` transport loads (`HCOMM_OFI_LIB`).
pub(crate) const DEFAULT_OFI_LIB: &str = "libfabric.so.1";
/// Default largest payload inline through libfabric (`HCOMM_OFI_EAGER_LIMIT`): 64 KiB, so that
/// the message (payload, hcomm's 64-byte header, its protocol fields) stays within one eager
/// buffer of `ofi_rxm`, whose size hcomm sets to 65 KiB unless the user set it
/// (`FI_OFI_RXM_BUFFER_SIZE`, see `transport::ofi::RXM_BUFFER`). Over the tcp provider between
/// two namespaces (`bench/ofi_eager.sh`, three interleaved rounds, loaded machine) a 16 KiB /
/// 64 KiB ping-pong took 10.0 / 21.0 us eager and 22.2 / 29.1 us with 15 KiB eager (RDMA read
/// above), a 16 KiB / 64 KiB all-reduce of two ranks 13.7 / 34.0 us and 29.2 / 64.7 us.
pub(crate) const DEFAULT_OFI_EAGER_LIMIT: usize = 64 << 10;
/// Default threshold above which the sender writes a payload (`HCOMM_OFI_WRITE_THRESHOLD`).
pub(crate) const DEFAULT_OFI_WRITE_THRESHOLD: usize = 1 << 20;
/// Default chunk of a large message on one stream (`HCOMM_TCP_CHUNK`).
pub(crate) const DEFAULT_TCP_CHUNK: usize = 512 * 1024;
/// How every waiting rank backs off while what it waits for has not happened: the engine's
/// waits for messages and the one-sided collectives' waits for their peers alike. It spins
/// (for `HCOMM_SPIN_US` where the wait reads the clock anyway, else for `polls` looks), then
/// yields the CPU, then sleeps. Not read from the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// Looks of a spinning wait that does not read the clock (reading it costs about as much
    /// as a look at a peer's cache line).
    pub polls: u32,
    /// Of those, the first ones look without pausing (a pause takes about as long as a cache
    /// line takes to arrive).
    pub eager_polls: u32,
    /// While spinning (by count or by the clock), a wait yields the CPU once every this many
    /// looks. A peer that shares this core (more busy threads than cores, as on a loaded host)
    /// then runs within microseconds instead of after the whole spin, which would make every
    /// hand-off between two ranks cost a spin (measured: 8-byte all-reduce of 2 ranks on a
    /// 2-core host at load 14, 410-510 µs, against 2 µs without spinning); a rank with a core
    /// to itself pays a `sched_yield` call (about 0.2 µs) per this many looks, until its
    /// yields find the core idle (`idle_yield_every`). 0: never.
    pub yield_every: u32,
    /// Most looks between two such yields on a thread whose yields come back at once (no
    /// other thread wanted the core, so each was a wasted system call: measured, a pinned
    /// 2-rank 4 KiB all-reduce yielded in 40% of its calls at every 256 looks). The interval
    /// doubles from `yield_every` after each yield that came back within `yield_turn`, up to
    /// this, and is `yield_every` again after one that let another thread run.
    pub idle_yield_every: u32,
    /// A yield that took at least this many ticks of the statistics clock
    /// (`observe::clock::ticks`: the TSC, 1.5 µs at 2.6 GHz; else nanoseconds) let another
    /// thread run; a `sched_yield` that finds nobody else takes 0.1-0.5 µs.
    pub yield_turn: u64,
    /// A yield that took at least this many ticks of the same clock (130 000: 50 µs at
    /// 2.6 GHz, `short_sleep`) gave the core to threads that kept it for a whole time slice
    /// (more busy threads than cores, not just the peer): the wait yields no more and sleeps
    /// at its next pause, and it teaches the thread's next waits what a long sleep does.
    /// Yielding on would cost a slice per yield: with 16 busy loops on the 2-core host a
    /// `sched_yield` took 12 ms (median), and a wait's 64 yields most of a second.
    pub slow_yield: u64,
    /// Most times a thread's waits halve their spinning (never below `eager_polls` looks)
    /// and their yields: one halving more after each wait of the thread that slept longer
    /// than `short_sleep`, one fewer after each that spinning, yielding or a short sleep
    /// served. On a host with more busy
    /// threads than cores, spinning and yielding rarely serve, and burn the time slice that
    /// the peer (or the kernel's preference for threads that sleep) would have used: measured
    /// on the 2-core host at load 14-22, torch's 8-byte all-reduce of 2 ranks took 940-1130 µs
    /// with the full spin against 260-340 µs without it.
    pub max_halvings: u32,
    /// A wait that slept no longer than this would have been served by a full spin, or by
    /// one whose peer had not slept either: it counts as served for `max_halvings`. Without it
    /// a thread whose spin was halved to a fraction of a microsecond, which serves no wait,
    /// saw every later wait end asleep and kept that spin for good. Twice `HCOMM_SPIN_US`'s
    /// default: at 50 us, a 2-rank 64 KiB TCP ping-pong whose waits once slept kept sleeping,
    /// each sleep (a wake-up, 50-100 us) lengthening the peer's next wait past the halved
    /// spin (one-way 20, 33, 48 or 54 us a run; 100 us: 20-33 us in 11 runs, as with a full
    /// spin). Under 14 busy loops on the 2 cores an 8 B all-reduce took 2.3-3.3 us against
    /// 2.7-3.7 us at 50 us, and with 2 an 8 B ping-pong 0.22 us either way.
    pub short_sleep: Duration,
    /// Times a wait yields the CPU after spinning, before it sleeps (a loaded host: the rank
    /// waited for may need this core).
    pub yields: u32,
    /// Times a wait that must not spin (more local ranks than cores) yields the CPU before it
    /// sleeps on the futex that the rank it waits for rings (not halved). 0 here:
    /// such waits sleep at once and leave the core to the ranks that have work; the small
    /// one-sided collectives, whose peers publish within microseconds, yield a few times
    /// first (`coll::onesided`).
    pub oversubscribed_yields: u32,
    /// Longest sleep between a wait's looks at its peers and its deadline.
    pub max_sleep: Duration,
}

impl Backoff {
    /// The policy of every wait.
    pub(crate) const DEFAULT: Backoff = Backoff {
        polls: 20_000,
        eager_polls: 256,
        yield_every: 256,
        idle_yield_every: 4096,
        yield_turn: 4000,
        slow_yield: 130_000,
        max_halvings: 8,
        short_sleep: Duration::from_micros(100),
        yields: 64,
        oversubscribed_yields: 0,
        max_sleep: Duration::from_millis(100),
    };
}

/// Largest accepted `HCOMM_TCP_STREAMS`.
pub(crate) const MAX_TCP_STREAMS: usize = 16;
/// Default largest message sent inline through shared memory (`HCOMM_SHM_EAGER_LIMIT`).
pub(crate) const DEFAULT_SHM_EAGER_LIMIT: usize = 4096;
/// Default largest message the receiver pulls where cross-memory attach works; larger ones
/// the sender pushes (`HCOMM_SHM_PUSH_THRESHOLD`): no limit, every size is pulled (in pieces
/// of `HCOMM_SHM_CHUNK`).
pub(crate) const DEFAULT_SHM_PUSH_THRESHOLD: usize = usize::MAX;
/// Default smallest pulled message that both ranks copy at once, the receiver pulling while
/// the sender writes (`HCOMM_SHM_SPLIT_THRESHOLD`).
pub(crate) const DEFAULT_SHM_SPLIT_THRESHOLD: usize = 64 << 10;
/// Default chunk of a shared-memory push (`HCOMM_SHM_CHUNK`).
pub(crate) const DEFAULT_SHM_CHUNK: usize = 256 * 1024;
/// Default bytes of each shared-memory ring (`HCOMM_SHM_RING`).
pub(crate) const DEFAULT_SHM_RING: usize = 1 << 20;
/// Default bytes of each shared-memory pool block (`HCOMM_POOL_BLOCK`).
pub(crate) const DEFAULT_POOL_BLOCK: usize = 64 << 20;
/// Default seconds a wait blocks before it is logged as a stall (`HCOMM_STALL_WARN`).
pub(crate) const DEFAULT_STALL_WARN_SECS: f64 = 10.0;
/// Calls the flight recorder keeps per communicator when `HCOMM_TRACE_BUFFER` is unset.
pub(crate) const DEFAULT_TRACE_BUFFER: usize = 2048;
/// The most calls `HCOMM_TRACE_BUFFER` may ask for (a GiB of records per communicator).
const MAX_TRACE_BUFFER: usize = 1 << 24;
/// Where the flight recorder writes its dumps when `HCOMM_TRACE_DIR` is unset.
pub(crate) const DEFAULT_TRACE_DIR: &str = "/tmp/hcomm-trace";

/// Which launcher the rank information came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `HCOMM_RANK`/`HCOMM_SIZE` (hcommrun, or set by hand).
    Hcomm,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// MPICH's Hydra `mpiexec` (`PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`).
    MpichHydra,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`).
    Slurm,
    /// PyTorch's `torchrun` (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`).
    Torchrun,
    /// No launcher: a world of one rank.
    Singleton,
}

/// Where this process sits in its job, as the launcher told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// The launcher the values came from.
    pub launcher: Launcher,
    /// This process's rank in the world.
    pub rank: usize,
    /// Number of ranks in the world.
    pub size: usize,
    /// Rank among the processes of this host, when the launcher says.
    pub local_rank: Option<usize>,
    /// `host:port` of the rendezvous store, when known.
    pub root_addr: Option<String>,
}

/// Tunables and job settings read from the environment. Its `Debug` shows every setting but
/// the job secret ([`Secret`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// `HCOMM_DEBUG=1`: rank 0 prints the topology table at start.
    pub debug: bool,
    /// `HCOMM_LOG_LEVEL` 0 (errors) .. 4 (trace); `None` = logging off.
    pub log_level: Option<u8>,
    /// `HCOMM_TIMEOUT` (seconds, fractions allowed): the bound on every wait.
    pub timeout: Duration,
    /// `HCOMM_STALL_WARN` (seconds, fractions allowed): a wait blocked this long is logged
    /// with its operation and the peers it waits for, again at doubling intervals; `None`
    /// (`0`) turns the warnings off.
    pub stall_warn: Option<Duration>,
    /// `HCOMM_TRACE`: where each rank writes a Chrome trace of its operations (see
    /// `observe::trace::rank_path` for the file of each rank).
    pub trace: Option<String>,
    /// `HCOMM_TRACE_BUFFER`: calls the flight recorder keeps per communicator (0: off).
    pub trace_buffer: usize,
    /// `HCOMM_TRACE_DIR`: where the flight recorder writes its dumps.
    pub trace_dir: std::path::PathBuf,
    /// `HCOMM_RUN_FD=FD:INODE`, set by `hcommrun`: a pipe (descriptor FD, inode INODE) on
    /// which this rank tells the launcher which peers it lost, so that the launcher names the
    /// rank that failed first rather than one that only noticed it. The inode guards against
    /// a variable inherited by a process whose descriptor FD is something else.
    pub run_fd: Option<(i32, u64)>,
    /// `HCOMM_TRANSPORT`: force one transport: `tcp`, `shm` (the default: shared memory
    /// between ranks of one host, TCP between hosts), or the name of a transport plug-in
    /// ([`crate::transport::plugin`]), checked against the registered ones when the world
    /// starts.
    pub transport: Option<String>,
    /// `HCOMM_SHM_EAGER_LIMIT`: largest message sent inline through a shared-memory ring.
    pub shm_eager_limit: usize,
    /// `HCOMM_SHM_PUSH_THRESHOLD`: larger shared-memory messages are pushed by the sender in
    /// chunks; smaller ones (above the eager limit) are pulled by the receiver where
    /// cross-memory attach works. Unset: `usize::MAX`, every size is pulled.
    pub shm_push_threshold: usize,
    /// `HCOMM_SHM_SPLIT_THRESHOLD`: pulled shared-memory messages of at least this size are
    /// copied by both ranks at once (the sender writes pieces into the receiver's buffer
    /// while the receiver pulls others), where ranks may spin (a core per local rank).
    pub shm_split_threshold: usize,
    /// `HCOMM_SHM_CHUNK`: bytes per chunk of a shared-memory push, and per piece of a pull
    /// (one piece per turn of the engine).
    pub shm_chunk: usize,
    /// `HCOMM_SHM_RING`: bytes of each shared-memory ring (one per ordered pair of local
    /// ranks).
    pub shm_ring: usize,
    /// `HCOMM_POOL_BLOCK`: bytes of each ordinary shared-memory pool block (a larger
    /// allocation gets a block of its own size).
    pub pool_block: usize,
    /// `HCOMM_POOL_MAX`: most bytes of `/dev/shm` the pool blocks of one rank hold; `0` turns
    /// the pool off; unset (`None`): half of the smallest of `/dev/shm`'s free space, the
    /// physical memory and the control group's memory limit, divided by the ranks on the host.
    pub pool_max: Option<usize>,
    /// `HCOMM_CMA`: `auto` (use cross-memory attach where the kernel allows it) or `off`.
    pub cma: crate::transport::shm::cma::CmaMode,
    /// `HCOMM_ALGO`: per-collective algorithm overrides, as written.
    pub algo: Option<String>,
    /// `HCOMM_DETERMINISTIC=1`: reductions in a fixed order, bitwise reproducible floats.
    pub deterministic: bool,
    /// `HCOMM_MISMATCH_CHECK=0` turns off the signature check of collectives (on by default).
    pub mismatch_check: bool,
    /// `HCOMM_JOB_SECRET`: the job's shared secret (bytes of the string).
    pub job_secret: Option<Secret>,
    /// `HCOMM_TCP_STREAMS`: TCP connections per peer (1..=16).
    pub tcp_streams: usize,
    /// `HCOMM_TCP_EAGER_LIMIT`: largest message sent without a rendezvous handshake.
    pub tcp_eager_limit: usize,
    /// `HCOMM_TCP_CHUNK`: bytes of a large message sent on one stream at a time.
    pub tcp_chunk: usize,
    /// `HCOMM_TCP_CONGESTION`: the congestion control of the TCP connections between ranks
    /// (Linux's `TCP_CONGESTION`): a name the kernel allows (`reno`, `cubic`, `dctcp`, ...),
    /// or `system` for the system's default. `None` (unset): `reno` where the kernel allows
    /// it (every Linux kernel does), else the system's default.
    pub tcp_congestion: Option<String>,
    /// `HCOMM_OFI_LIB`: the libfabric library the `ofi` transport loads.
    pub ofi_lib: String,
    /// `HCOMM_OFI_EAGER_LIMIT`: largest payload sent inline through libfabric.
    pub ofi_eager_limit: usize,
    /// `HCOMM_OFI_WRITE_THRESHOLD`: larger payloads through libfabric are written by the
    /// sender (RDMA write); smaller ones above the eager limit are read by the receiver.
    pub ofi_write_threshold: usize,
    /// `HCOMM_OFI_CQ_WAIT`: libfabric's completion queue has a wait descriptor that sleeping
    /// waiters watch (`fd`); else (`none`, the default) it has none and sleepers nap.
    pub ofi_cq_fd: bool,
    /// `HCOMM_OFI_DIRECT`: collective steps through libfabric are written straight into the
    /// receive the peer offered (on by default; `0`: they go as other messages).
    pub ofi_direct: bool,
    /// `HCOMM_SPIN_US`: microseconds a waiting rank polls before it sleeps; `None` = automatic
    /// (spin when the host has a core per local rank, otherwise sleep at once).
    pub spin_us: Option<u64>,
    /// `HCOMM_IFADDR`: IP address this rank listens on and announces (default: the address
    /// its connection to the store leaves from).
    pub if_addr: Option<String>,
    /// `HCOMM_SOCKET_IFNAME`: the interfaces (rails) to listen on and announce, NCCL's syntax
    /// (checked when read; default: every interface that is up but loopback and virtual
    /// bridges).
    pub socket_ifname: Option<String>,
    /// `HCOMM_FAILOVER`: `None` (`auto`, the default): a TCP pair that shares two rails or
    /// more can move a dead stream's frames to another; `Some(true)` (`1`): every pair with two
    /// streams or more can; `Some(false)` (`0`): none (a stream that fails loses the peer).
    pub failover: Option<bool>,
    /// `HCOMM_LINK_TIMEOUT` (seconds): how long data sent on a stream that can fail over may
    /// stay unacknowledged before the stream is judged dead (`TCP_USER_TIMEOUT`).
    pub link_timeout: Duration,
    /// `HCOMM_HOST_ID`: the host identity to announce instead of hostname and boot id
    /// (containers that share a host, tests that lay out several hosts on one machine).
    pub host_id: Option<String>,
    /// Where this process sits in its job.
    pub launch: LaunchInfo,
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `lookup` (a stand-in for the environment in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let timeout_secs = match get("HCOMM_TIMEOUT") {
            Some(v) => parse_num::<f64>("HCOMM_TIMEOUT", &v)?,
            None => DEFAULT_TIMEOUT_SECS,
        };
        // A positive value below a nanosecond would become a zero timeout: every wait would
        // fail at once.
        if !(timeout_secs > 0.0 && timeout_secs <= 1e7)
            || Duration::from_secs_f64(timeout_secs).is_zero()
        {
            return Err(invalid(
                "HCOMM_TIMEOUT",
                &timeout_secs.to_string(),
                "0 < seconds <= 1e7, at least a nanosecond",
            ));
        }
        let stall_secs = match get("HCOMM_STALL_WARN") {
            Some(v) => parse_num::<f64>("HCOMM_STALL_WARN", &v)?,
            None => DEFAULT_STALL_WARN_SECS,
        };
        if !(0.0..=1e7).contains(&stall_secs) {
            return Err(invalid(
                "HCOMM_STALL_WARN",
                &stall_secs.to_string(),
                "0 (off) <= seconds <= 1e7",
            ));
        }
        // `-0` passes the range check but is no duration.
        let stall_warn = Duration::try_from_secs_f64(stall_secs)
            .ok()
            .filter(|d| !d.is_zero());
        let log_level = match get("HCOMM_LOG_LEVEL") {
            Some(v) => {
                let l = parse_num::<u8>("HCOMM_LOG_LEVEL", &v)?;
                if l > 4 {
                    return Err(invalid("HCOMM_LOG_LEVEL", &v, "0 (errors) .. 4 (trace)"));
                }
                Some(l)
            }
            None => None,
        };
        let tcp_streams = match get("HCOMM_TCP_STREAMS") {
            Some(v) => {
                let n = parse_num::<usize>("HCOMM_TCP_STREAMS", &v)?;
                if !(1..=MAX_TCP_STREAMS).contains(&n) {
                    return Err(invalid("HCOMM_TCP_STREAMS", &v, "1 .. 16"));
                }
                n
            }
            None => DEFAULT_TCP_STREAMS,
        };
        let size = |name: &str, default: usize, min: usize, max: usize| -> Result<usize> {
            let Some(v) = get(name) else {
                return Ok(default);
            };
            let n = parse_num::<usize>(name, &v)?;
            if !(min..=max).contains(&n) {
                return Err(invalid(name, &v, &format!("{min} .. {max} bytes")));
            }
            Ok(n)
        };
        let tcp_eager_limit = size(
            "HCOMM_TCP_EAGER_LIMIT",
            DEFAULT_TCP_EAGER_LIMIT,
            0,
            16 << 20,
        )?;
        let tcp_chunk = size("HCOMM_TCP_CHUNK", DEFAULT_TCP_CHUNK, 4096, 64 << 20)?;
        let ofi_eager_limit = size(
            "HCOMM_OFI_EAGER_LIMIT",
            DEFAULT_OFI_EAGER_LIMIT,
            0,
            64 << 10,
        )?;
        let ofi_write_threshold = size(
            "HCOMM_OFI_WRITE_THRESHOLD",
            DEFAULT_OFI_WRITE_THRESHOLD.max(ofi_eager_limit),
            ofi_eager_limit,
            16 << 20,
        )?;
        let shm_eager_limit = size(
            "HCOMM_SHM_EAGER_LIMIT",
            DEFAULT_SHM_EAGER_LIMIT,
            0,
            32 << 10,
        )?;
        let shm_push_threshold = size(
            "HCOMM_SHM_PUSH_THRESHOLD",
            DEFAULT_SHM_PUSH_THRESHOLD,
            0,
            usize::MAX,
        )?;
        let shm_split_threshold = size(
            "HCOMM_SHM_SPLIT_THRESHOLD",
            DEFAULT_SHM_SPLIT_THRESHOLD,
            0,
            usize::MAX,
        )?;
        let shm_chunk = size("HCOMM_SHM_CHUNK", DEFAULT_SHM_CHUNK, 4096, 32 << 20)?;
        let shm_ring = size("HCOMM_SHM_RING", DEFAULT_SHM_RING, 128 << 10, 64 << 20)?;
        let pool_block = size("HCOMM_POOL_BLOCK", DEFAULT_POOL_BLOCK, 64 << 10, 1 << 40)?;
        let pool_max = match get("HCOMM_POOL_MAX") {
            Some(_) => Some(size("HCOMM_POOL_MAX", 0, 0, 1 << 44)?),
            None => None,
        };
        let cma = match get(crate::transport::shm::cma::CmaMode::ENV_VAR) {
            Some(v) => crate::transport::shm::cma::CmaMode::from_env_value(&v)?,
            None => crate::transport::shm::cma::CmaMode::Auto,
        };
        let spin_us = match get("HCOMM_SPIN_US") {
            Some(v) => Some(parse_num::<u64>("HCOMM_SPIN_US", &v)?.min(1_000_000)),
            None => None,
        };
        let run_fd = match get("HCOMM_RUN_FD") {
            Some(v) => {
                let bad = || invalid("HCOMM_RUN_FD", &v, "FD:INODE, FD 3 or more");
                let (fd, ino) = v.trim().split_once(':').ok_or_else(bad)?;
                let fd = fd
                    .parse::<i32>()
                    .ok()
                    .filter(|&fd| fd >= 3)
                    .ok_or_else(bad)?;
                Some((fd, ino.parse::<u64>().map_err(|_| bad())?))
            }
            None => None,
        };
        let transport = get("HCOMM_TRANSPORT");
        if let Some(t) = &transport {
            crate::transport::plugin::check_name(t, "HCOMM_TRANSPORT")?;
        }
        Ok(Config {
            debug: get("HCOMM_DEBUG").is_some_and(|v| v != "0"),
            log_level,
            timeout: Duration::from_secs_f64(timeout_secs),
            stall_warn,
            trace: get("HCOMM_TRACE"),
            trace_buffer: match get("HCOMM_TRACE_BUFFER") {
                Some(v) => match parse_num::<usize>("HCOMM_TRACE_BUFFER", &v)? {
                    n if n > MAX_TRACE_BUFFER => {
                        return Err(invalid(
                            "HCOMM_TRACE_BUFFER",
                            &v,
                            "a number of calls from 0 to 16777216",
                        ))
                    }
                    n => n,
                },
                None => DEFAULT_TRACE_BUFFER,
            },
            trace_dir: get("HCOMM_TRACE_DIR")
                .unwrap_or_else(|| DEFAULT_TRACE_DIR.into())
                .into(),
            run_fd,
            transport,
            shm_eager_limit,
            shm_push_threshold,
            shm_split_threshold,
            shm_chunk,
            shm_ring,
            pool_block: pool_block / 64 * 64,
            pool_max,
            cma,
            algo: get("HCOMM_ALGO"),
            deterministic: get("HCOMM_DETERMINISTIC").is_some_and(|v| v != "0"),
            mismatch_check: get("HCOMM_MISMATCH_CHECK").is_none_or(|v| v != "0"),
            job_secret: get("HCOMM_JOB_SECRET").map(Secret::new),
            tcp_streams,
            tcp_eager_limit,
            tcp_chunk,
            tcp_congestion: match get("HCOMM_TCP_CONGESTION") {
                None => None,
                Some(v) => {
                    let name = v.trim();
                    let ok = (1..=15).contains(&name.len())
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                    if !ok {
                        return Err(invalid(
                            "HCOMM_TCP_CONGESTION",
                            &v,
                            "a congestion control's name (1 to 15 letters, digits, '_' or \
                             '-'; see net.ipv4.tcp_allowed_congestion_control), or system",
                        ));
                    }
                    Some(name.to_string())
                }
            },
            ofi_lib: get("HCOMM_OFI_LIB").unwrap_or_else(|| DEFAULT_OFI_LIB.to_owned()),
            ofi_eager_limit,
            ofi_write_threshold,
            ofi_direct: get("HCOMM_OFI_DIRECT").is_none_or(|v| v.trim() != "0"),
            ofi_cq_fd: match get("HCOMM_OFI_CQ_WAIT").as_deref().map(str::trim) {
                None | Some("none") => false,
                Some("fd") => true,
                Some(v) => return Err(invalid("HCOMM_OFI_CQ_WAIT", v, "none or fd")),
            },
            spin_us,
            if_addr: get("HCOMM_IFADDR"),
            failover: match get("HCOMM_FAILOVER").as_deref().map(str::trim) {
                None | Some("auto") => None,
                Some("1") => Some(true),
                Some("0") => Some(false),
                Some(v) => return Err(invalid("HCOMM_FAILOVER", v, "auto, 1 or 0")),
            },
            link_timeout: {
                let secs = match get("HCOMM_LINK_TIMEOUT") {
                    Some(v) => parse_num::<f64>("HCOMM_LINK_TIMEOUT", &v)?,
                    None => DEFAULT_LINK_TIMEOUT_SECS,
                };
                if !(0.01..=3600.0).contains(&secs) {
                    return Err(invalid(
                        "HCOMM_LINK_TIMEOUT",
                        &secs.to_string(),
                        "0.01 <= seconds <= 3600",
                    ));
                }
                Duration::from_secs_f64(secs)
            },
            socket_ifname: match get("HCOMM_SOCKET_IFNAME") {
                Some(v) => IfSpec::parse(&v)?.map(|_| v),
                None => None,
            },
            host_id: get("HCOMM_HOST_ID"),
            launch: detect_launch(&get)?,
        })
    }
}

fn invalid(name: &str, value: &str, expected: &str) -> Error {
    Error::invalid_argument(format!(
        "{name}={value:?} is not valid: expected {expected}"
    ))
}

fn parse_num<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value
        .trim()
        .parse::<T>()
        .map_err(|_| invalid(name, value, "a number"))
}

/// The launchers hcomm recognises, in the order it looks for them; the first three names of
/// [`LAUNCHER_VARS`] belong to the first, the next three to the second, and so on.
const LAUNCHERS: [Launcher; 5] = [
    Launcher::Hcomm,
    Launcher::OpenMpi,
    Launcher::MpichHydra,
    Launcher::Slurm,
    Launcher::Torchrun,
];

/// Every variable through which a launcher places a process in its job: rank, size and local
/// rank of each launcher hcomm recognises (in the order it looks for them), then the store
/// address and job secret (`HCOMM_ROOT_ADDR`, `HCOMM_JOB_SECRET`) and torchrun's store
/// (`MASTER_ADDR`, `MASTER_PORT`). A program started without these runs as a world of one;
/// tests remove them to run a program alone, whatever job runs the tests.
pub const LAUNCHER_VARS: [&str; 19] = [
    "HCOMM_RANK",
    "HCOMM_SIZE",
    "HCOMM_LOCAL_RANK",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "HCOMM_ROOT_ADDR",
    "HCOMM_JOB_SECRET",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// Reads rank, size, local rank and store address from the first launcher whose variables are
/// present, in the order hcomm, Open MPI, MPICH Hydra, Slurm, torchrun.
fn detect_launch(get: &dyn Fn(&str) -> Option<String>) -> Result<LaunchInfo> {
    let root_addr = get("HCOMM_ROOT_ADDR");
    for (&launcher, vars) in LAUNCHERS.iter().zip(LAUNCHER_VARS.chunks_exact(3)) {
        let [rank_var, size_var, local_var] = [vars[0], vars[1], vars[2]];
        let (Some(rank), Some(size)) = (get(rank_var), get(size_var)) else {
            continue;
        };
        let rank = parse_num::<usize>(rank_var, &rank)?;
        let size = parse_num::<usize>(size_var, &size)?;
        if size == 0 || rank >= size {
            return Err(Error::invalid_argument(format!(
                "{rank_var}={rank} and {size_var}={size}: need 0 <= rank < size"
            )));
        }
        let local_rank = match get(local_var) {
            Some(v) => Some(parse_num::<usize>(local_var, &v)?),
            None => None,
        };
        let root_addr = match (root_addr, launcher) {
            (Some(a), _) => Some(a),
            (None, Launcher::Torchrun) => torchrun_store(get)?,
            (None, _) => None,
        };
        if size > 1 && root_addr.is_none() {
            return Err(Error::init(format!(
                "launched by {launcher:?} with {size} ranks but HCOMM_ROOT_ADDR is not set: \
                 set HCOMM_ROOT_ADDR=host:port (a free port on rank 0's host) and \
                 HCOMM_JOB_SECRET for every rank, or start the job with hcommrun"
            )));
        }
        return Ok(LaunchInfo {
            launcher,
            rank,
            size,
            local_rank,
            root_addr,
        });
    }
    Ok(LaunchInfo {
        launcher: Launcher::Singleton,
        rank: 0,
        size: 1,
        local_rank: Some(0),
        root_addr,
    })
}

/// torchrun's own store listens on `MASTER_PORT`; hcomm's store takes the next port.
fn torchrun_store(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>> {
    let (Some(addr), Some(port)) = (get("MASTER_ADDR"), get("MASTER_PORT")) else {
        return Ok(None);
    };
    let port = parse_num::<u16>("MASTER_PORT", &port)?;
    let port = port
        .checked_add(1)
        .ok_or_else(|| invalid("MASTER_PORT", &port.to_string(), "a port below 65535"))?;
    Ok(Some(format!("{addr}:{port}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::LazyLock;

    #[test]
    fn each_launchers_variables_in_the_public_list_select_it() {
        for (&launcher, vars) in LAUNCHERS.iter().zip(LAUNCHER_VARS.chunks_exact(3)) {
            let env: HashMap<&str, &str> = [
                (vars[0], "1"),
                (vars[1], "2"),
                (vars[2], "1"),
                ("HCOMM_ROOT_ADDR", "127.0.0.1:1"),
            ]
            .into();
            let info = detect_launch(&|k| env.get(k).map(|v| v.to_string())).unwrap();
            assert_eq!(
                (info.launcher, info.rank, info.size),
                (launcher, 1, 2),
                "{vars:?}"
            );
        }
    }

    fn cfg(vars: &[(&str, &str)]) -> Result<Config> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn ofi_cq_wait_is_none_by_default_fd_when_asked_and_nothing_else() {
        assert!(!cfg(&[]).unwrap().ofi_cq_fd);
        assert!(!cfg(&[("HCOMM_OFI_CQ_WAIT", "none")]).unwrap().ofi_cq_fd);
        assert!(cfg(&[("HCOMM_OFI_CQ_WAIT", " fd")]).unwrap().ofi_cq_fd);
        let e = cfg(&[("HCOMM_OFI_CQ_WAIT", "epoll")]).unwrap_err();
        assert!(e.to_string().contains("HCOMM_OFI_CQ_WAIT"), "{e}");
    }

    /// A configuration can be logged: its `Debug` shows the other settings but not the job
    /// secret, in no form (text or bytes), while the secret itself stays usable.
    #[test]
    fn the_debug_of_a_configuration_does_not_show_the_job_secret() {
        let secret = "s3cret-that-must-not-be-logged";
        let config = cfg(&[
            ("HCOMM_RANK", "1"),
            ("HCOMM_SIZE", "2"),
            ("HCOMM_ROOT_ADDR", "127.0.0.1:29400"),
            ("HCOMM_JOB_SECRET", secret),
        ])
        .unwrap();
        for shown in [format!("{config:?}"), format!("{config:#?}")] {
            assert!(!shown.contains(secret), "{shown}");
            assert!(
                !shown.contains(&format!("{:?}", secret.as_bytes())),
                "{shown}"
            );
            assert!(!shown.contains("115, 51, 99"), "{shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
            assert!(shown.contains("127.0.0.1:29400"), "{shown}");
        }
        assert_eq!(
            config.job_secret.as_ref().map(Secret::expose),
            Some(secret.as_bytes())
        );
    }

    #[test]
    fn no_launcher_is_a_world_of_one() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.launch.launcher, Launcher::Singleton);
        assert_eq!((c.launch.rank, c.launch.size), (0, 1));
        assert_eq!(c.timeout, Duration::from_secs(300));
        assert_eq!(c.stall_warn, Some(Duration::from_secs(10)));
        assert_eq!(c.trace, None);
    }

    #[test]
    fn the_launchers_pipe_is_a_descriptor_beyond_stdio() {
        assert_eq!(
            cfg(&[("HCOMM_RUN_FD", "7:1234")]).unwrap().run_fd,
            Some((7, 1234))
        );
        assert_eq!(cfg(&[]).unwrap().run_fd, None);
        for bad in ["7", "2:5", "-1:5", "x:5", "7:y", ":"] {
            let e = cfg(&[("HCOMM_RUN_FD", bad)]).unwrap_err().to_string();
            assert!(e.contains("HCOMM_RUN_FD"), "{bad}: {e}");
        }
    }

    #[test]
    fn stall_warnings_turn_off_with_zero() {
        assert_eq!(cfg(&[("HCOMM_STALL_WARN", "0")]).unwrap().stall_warn, None);
        assert_eq!(
            cfg(&[("HCOMM_STALL_WARN", "0.5")]).unwrap().stall_warn,
            Some(Duration::from_millis(500))
        );
        let e = cfg(&[("HCOMM_STALL_WARN", "-1")]).unwrap_err();
        assert!(e.to_string().contains("HCOMM_STALL_WARN"), "{e}");
    }

    #[test]
    fn launchers_are_detected_in_order() {
        let c = cfg(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("HCOMM_ROOT_ADDR", "h:1"),
        ])
        .unwrap();
        assert_eq!(c.launch.launcher, Launcher::OpenMpi);
        assert_eq!(
            (c.launch.rank, c.launch.size, c.launch.local_rank),
            (2, 4, Some(0))
        );
        let c = cfg(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("HCOMM_ROOT_ADDR", "h:1"),
        ])
        .unwrap();
        assert_eq!(c.launch.launcher, Launcher::MpichHydra);
        let c = cfg(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "3"),
            ("HCOMM_ROOT_ADDR", "h:1"),
        ])
        .unwrap();
        assert_eq!(c.launch.launcher, Launcher::Slurm);
        let c = cfg(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(c.launch.launcher, Launcher::Torchrun);
        assert_eq!(c.launch.root_addr.as_deref(), Some("10.0.0.1:29501"));
    }

    #[test]
    fn bad_values_are_named() {
        let e = cfg(&[("HCOMM_TIMEOUT", "soon")]).unwrap_err();
        assert!(e.to_string().contains("HCOMM_TIMEOUT"), "{e}");
        let e = cfg(&[("HCOMM_RANK", "3"), ("HCOMM_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("HCOMM_RANK"), "{e}");
        let e = cfg(&[("HCOMM_RANK", "0"), ("HCOMM_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("HCOMM_ROOT_ADDR"), "{e}");
        let e = cfg(&[("HCOMM_TCP_STREAMS", "99")]).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let e = cfg(&[("HCOMM_TRACE_BUFFER", "18446744073709551615")]).unwrap_err();
        assert!(e.to_string().contains("HCOMM_TRACE_BUFFER"), "{e}");
        let c = cfg(&[("HCOMM_TRACE_BUFFER", "16777216")]).unwrap();
        assert_eq!(c.trace_buffer, 1 << 24);
        let e = cfg(&[("HCOMM_TRANSPORT", "carrier pigeon")]).unwrap_err();
        assert!(e.to_string().contains("HCOMM_TRANSPORT"), "{e}");
        // Any other name may be a plug-in's: checked when the world starts.
        let c = cfg(&[("HCOMM_TRANSPORT", "carrier-pigeon")]).unwrap();
        assert_eq!(c.transport.as_deref(), Some("carrier-pigeon"));
    }

    #[test]
    fn the_congestion_control_is_a_name_or_system() {
        assert_eq!(cfg(&[]).unwrap().tcp_congestion, None);
        let c = cfg(&[("HCOMM_TCP_CONGESTION", " reno ")]).unwrap();
        assert_eq!(c.tcp_congestion.as_deref(), Some("reno"));
        let c = cfg(&[("HCOMM_TCP_CONGESTION", "system")]).unwrap();
        assert_eq!(c.tcp_congestion.as_deref(), Some("system"));
        for bad in ["cubic reno", "a_name_far_too_long", "bbr;rm"] {
            let e = cfg(&[("HCOMM_TCP_CONGESTION", bad)]).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad:?}: {e}");
            assert!(e.to_string().contains("HCOMM_TCP_CONGESTION"), "{e}");
        }
    }

    /// The settings `from_lookup` reads besides the launcher variables.
    const SETTINGS: [&str; 35] = [
        "HCOMM_TIMEOUT",
        "HCOMM_STALL_WARN",
        "HCOMM_TRACE",
        "HCOMM_TRACE_BUFFER",
        "HCOMM_TRACE_DIR",
        "HCOMM_RUN_FD",
        "HCOMM_LOG_LEVEL",
        "HCOMM_TCP_STREAMS",
        "HCOMM_TCP_EAGER_LIMIT",
        "HCOMM_TCP_CHUNK",
        "HCOMM_TCP_CONGESTION",
        "HCOMM_OFI_LIB",
        "HCOMM_OFI_EAGER_LIMIT",
        "HCOMM_OFI_WRITE_THRESHOLD",
        "HCOMM_OFI_DIRECT",
        "HCOMM_OFI_CQ_WAIT",
        "HCOMM_SHM_EAGER_LIMIT",
        "HCOMM_SHM_PUSH_THRESHOLD",
        "HCOMM_SHM_SPLIT_THRESHOLD",
        "HCOMM_SHM_CHUNK",
        "HCOMM_SHM_RING",
        "HCOMM_POOL_BLOCK",
        "HCOMM_POOL_MAX",
        "HCOMM_CMA",
        "HCOMM_SPIN_US",
        "HCOMM_TRANSPORT",
        "HCOMM_DEBUG",
        "HCOMM_ALGO",
        "HCOMM_DETERMINISTIC",
        "HCOMM_MISMATCH_CHECK",
        "HCOMM_IFADDR",
        "HCOMM_SOCKET_IFNAME",
        "HCOMM_FAILOVER",
        "HCOMM_LINK_TIMEOUT",
        "HCOMM_HOST_ID",
    ];

    /// Every variable `from_lookup` reads (the fuzz harness checks that it asks for no other).
    static NAMES: LazyLock<Vec<&str>> =
        LazyLock::new(|| SETTINGS.iter().chain(&LAUNCHER_VARS).copied().collect());

    /// An environment as fuzz input: records of a variable (index into [`NAMES`]), a value
    /// length and the value's bytes (not UTF-8 ones replaced, as `std::env::var` gives only
    /// strings).
    fn environment(input: &[u8]) -> HashMap<String, String> {
        let mut vars = HashMap::new();
        let mut rest = input;
        while let [name, len, tail @ ..] = rest {
            let (value, next) = tail.split_at((*len as usize).min(tail.len()));
            let name = NAMES[*name as usize % NAMES.len()].to_string();
            vars.insert(name, String::from_utf8_lossy(value).into_owned());
            rest = next;
        }
        vars
    }

    fn record(name: &str, value: &str) -> Vec<u8> {
        let i = NAMES.iter().position(|n| *n == name).unwrap();
        let mut r = vec![i as u8, value.len() as u8];
        r.extend_from_slice(value.as_bytes());
        r
    }

    /// Whatever the environment holds: parsing never panics and asks for no variable outside
    /// the documented list; a configuration it accepts keeps every value within its documented
    /// range; a refusal names a variable; `HCOMM_ALGO` goes through the selector the same
    /// way; and valid values parse to themselves.
    #[test]
    fn fuzz_config_from_lookup() {
        let seeds = [
            &[
                ("HCOMM_RANK", "1"),
                ("HCOMM_SIZE", "4"),
                ("HCOMM_LOCAL_RANK", "1"),
                ("HCOMM_ROOT_ADDR", "127.0.0.1:29400"),
                ("HCOMM_JOB_SECRET", "s3cret"),
                ("HCOMM_TIMEOUT", "0.5"),
                ("HCOMM_ALGO", "allreduce:hier,broadcast:tree"),
            ][..],
            &[
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", "2"),
                ("HCOMM_ROOT_ADDR", "[::1]:80"),
                ("HCOMM_TCP_STREAMS", "16"),
                ("HCOMM_TCP_EAGER_LIMIT", "16777216"),
                ("HCOMM_SHM_RING", "131072"),
                ("HCOMM_POOL_BLOCK", "65537"),
                ("HCOMM_POOL_MAX", "0"),
            ],
            &[
                ("RANK", "3"),
                ("WORLD_SIZE", "4"),
                ("MASTER_ADDR", "node0"),
                ("MASTER_PORT", "65534"),
                ("HCOMM_SPIN_US", "18446744073709551615"),
                ("HCOMM_CMA", " off "),
                ("HCOMM_LOG_LEVEL", "4"),
            ],
            &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "1"),
                ("PMI_RANK", "1"),
                ("PMI_SIZE", "1"),
                ("HCOMM_TRANSPORT", "tcp"),
                ("HCOMM_SHM_PUSH_THRESHOLD", "0"),
                ("HCOMM_TIMEOUT", "1e7"),
                ("HCOMM_ALGO", " barrier : dissemination , "),
            ],
        ]
        .map(|vars| {
            vars.iter()
                .flat_map(|(n, v)| record(n, v))
                .collect::<Vec<u8>>()
        });
        // Numbers as people and programs misspell them, given to every variable in turn.
        let tricky = [
            "-1",
            "-0",
            "+5",
            "0x10",
            "1_000",
            " 7 ",
            "NaN",
            "inf",
            "1e400",
            "1e-10",
            "4.5",
            "18446744073709551616",
            "65535",
            "65536",
            "0.0",
            "\u{663}",
            "",
            ":",
            ",",
        ];
        let tricky = NAMES.iter().enumerate().map(|(i, name)| {
            (0..4)
                .flat_map(|k| {
                    record(
                        NAMES[(i + 7 * k) % NAMES.len()],
                        tricky[(i + k) % tricky.len()],
                    )
                })
                .chain(record(name, tricky[i % tricky.len()]))
                .collect::<Vec<u8>>()
        });
        let target = crate::fuzz::Target {
            name: "config from_lookup",
            default_cases: 50_000,
            seeds: seeds.into_iter().chain(tricky).collect(),
            max_len: 512,
            dict: vec![
                u64::from(b'0'),
                u64::from(b'9'),
                u64::from(b':'),
                u64::from(b'e'),
            ],
        };
        crate::fuzz::run(&target, check_environment);
    }

    /// Found by `fuzz_config_from_lookup`: a positive timeout below a nanosecond was accepted
    /// and became zero, so every wait failed at once.
    #[test]
    fn fuzz_regression_timeout_below_a_nanosecond() {
        let input = hex::decode("19034e614e2003696e6600053165343030000531652d313019034e614e");
        check_environment(
            &input.unwrap(),
            &mut crate::fuzz::Rng::new(0x0af1_f8bc_062f_318d),
        );
        let e = cfg(&[("HCOMM_TIMEOUT", "1e-10")]).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(ref m) if m.message.contains("HCOMM_TIMEOUT")));
        assert_eq!(
            cfg(&[("HCOMM_TIMEOUT", "1e-9")]).unwrap().timeout,
            Duration::from_nanos(1)
        );
    }

    /// The check of `fuzz_config_from_lookup` on one input.
    fn check_environment(input: &[u8], rng: &mut crate::fuzz::Rng) {
        let vars = environment(input);
        let asked = std::cell::RefCell::new(Vec::new());
        let (parsed, usage) = crate::fuzz::measure(|| {
            Config::from_lookup(|name| {
                asked.borrow_mut().push(name.to_string());
                vars.get(name).cloned()
            })
        });
        let bound = 64 * 1024 + 16 * input.len();
        assert!(usage.peak <= bound, "{usage:?}");
        for name in asked.borrow().iter() {
            assert!(NAMES.contains(&name.as_str()), "reads undocumented {name}");
        }
        match parsed {
            Ok(c) => check_ranges(&c, &vars),
            Err(e @ (Error::InvalidArgument(_) | Error::Init(_))) => {
                let msg = e.to_string();
                assert!(NAMES.iter().any(|n| msg.contains(n)), "{msg}");
            }
            Err(e) => panic!("{e}"),
        }
        if let Some(algo) = vars.get("HCOMM_ALGO") {
            match crate::coll::select::Selector::new(Some(algo), rng.one_in(2)) {
                Ok(_) => {}
                Err(Error::InvalidArgument(msg)) => assert!(msg.message.contains("HCOMM_ALGO")),
                Err(e) => panic!("{e}"),
            }
        }
        let (eager, spin) = (rng.below((16 << 20) + 1), rng.below(1_000_001));
        let c = cfg(&[
            ("HCOMM_TCP_EAGER_LIMIT", &eager.to_string()),
            ("HCOMM_SPIN_US", &format!(" {spin}\n")),
        ])
        .unwrap();
        assert_eq!((c.tcp_eager_limit, c.spin_us), (eager, Some(spin as u64)));
    }

    /// What an accepted configuration promises.
    fn check_ranges(c: &Config, vars: &HashMap<String, String>) {
        assert!(!c.timeout.is_zero() && c.timeout <= Duration::from_secs(10_000_000));
        assert!(c.log_level.is_none_or(|l| l <= 4));
        assert!(c
            .stall_warn
            .is_none_or(|d| !d.is_zero() && d <= Duration::from_secs(10_000_000)));
        assert!((1..=MAX_TCP_STREAMS).contains(&c.tcp_streams));
        assert!(c.tcp_eager_limit <= 16 << 20);
        assert!((4096..=64 << 20).contains(&c.tcp_chunk));
        assert!(c.shm_eager_limit <= 32 << 10);
        assert!((4096..=32 << 20).contains(&c.shm_chunk));
        assert!((128 << 10..=64 << 20).contains(&c.shm_ring));
        assert!((64 << 10..=1 << 40).contains(&c.pool_block) && c.pool_block % 64 == 0);
        assert!(c.pool_max.is_none_or(|m| m <= 1 << 44));
        assert!(c.spin_us.is_none_or(|us| us <= 1_000_000));
        // `tcp`, `shm` or a plug-in's name: a well-formed one.
        assert!(c
            .transport
            .as_deref()
            .is_none_or(|t| crate::transport::plugin::check_name(t, "HCOMM_TRANSPORT").is_ok()));
        let l = &c.launch;
        assert!(l.rank < l.size, "{l:?}");
        assert!(l.size == 1 || l.root_addr.is_some(), "{l:?}");
        if l.launcher == Launcher::Torchrun && !vars.contains_key("HCOMM_ROOT_ADDR") {
            let port: u16 = vars["MASTER_PORT"].trim().parse().unwrap();
            let addr = l.root_addr.as_deref().unwrap();
            assert!(addr.ends_with(&format!(":{}", port + 1)), "{addr}");
        }
    }
}
