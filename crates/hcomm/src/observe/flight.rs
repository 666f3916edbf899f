//! The flight recorder (`HCOMM_TRACE_BUFFER`, `HCOMM_TRACE_DIR`): per communicator, a ring of
//! its last collective calls, dumped as versioned JSON when a call times out or is aborted,
//! when the process gets `SIGUSR1`, and when the program asks (`Communicator::dump_trace`,
//! `hcommCommDumpTrace`, `comm.dump_trace()`). `hcomm_trace DIR` merges a job's dumps.
//!
//! Each record holds the communicator, its epoch, the call's sequence number, collective,
//! element type, count and root, when it was posted (the call made), started (its sequence
//! number taken, its schedule begun) and completed, how it ended, and the member its thread
//! last waited for. A blocking call that waits for nothing costs relaxed loads and stores
//! into one cache line of the ring, on its thread, and no reading of the clock (10 ns here, 3%
//! of an 8-byte all-reduce between two cores): its times are the clock word
//! ([`clock::now`]), which the watcher refreshes at every turn and every wait that yields or
//! sleeps refreshes too. A call whose waits yielded or slept reads the clock when it ends, and
//! a blocking one takes its start from its first pause ([`clock::take_pause`]): a call that
//! hangs is timed from its first wait. No lock (a failed call also keeps its error, under
//! a lock) and no atomic read-modify-write, whose fence would also wait for the record's cache
//! line (calls on one communicator come one after the other); nothing else runs (the
//! measured cost is in docs/flight-recorder.md).
//!
//! `SIGUSR1`: the handler (installed at the first world, only while the signal has its
//! default action, which would kill the process) only raises a flag; the engine's watcher
//! thread sees it at its next turn and writes the dump, so nothing but an atomic store
//! happens in the handler.
//!
//! Below the engine and the communicator: the communicator makes a [`Recorder`] and reports
//! its calls; the watcher calls [`service`].

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use serde::{Deserialize, Serialize};

use super::clock::{self, monotonic_ns};
use super::OpKind;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::sync::lock;

/// The `format` of a dump.
pub const FORMAT: &str = "hcomm-flight-recorder";
/// The version of the dump format this build writes (and `hcomm_trace` reads).
pub const VERSION: u32 = 1;

/// Records per communicator (0: recording is off); rounded up to a power of two by
/// [`Recorder::new`].
static CAPACITY: AtomicUsize = AtomicUsize::new(crate::config::DEFAULT_TRACE_BUFFER);
/// Where this process writes, and who it is.
static SETUP: Mutex<Option<Setup>> = Mutex::new(None);
/// Every live recorder of the process.
static RECORDERS: Mutex<Vec<Weak<Recorder>>> = Mutex::new(Vec::new());
/// Raised by the `SIGUSR1` handler.
static REQUESTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

#[derive(Debug, Clone)]
struct Setup {
    dir: PathBuf,
    job: String,
    rank: usize,
    size: usize,
}

/// Sets the policy of the process from its latest world: `capacity` records per
/// communicator, dumps into `dir`, as world rank `rank` of `size` in job `job`; installs the
/// `SIGUSR1` handler once.
pub(crate) fn configure(capacity: usize, dir: &Path, job: &str, rank: usize, size: usize) {
    CAPACITY.store(capacity, Ordering::Relaxed);
    *lock(&SETUP) = Some(Setup {
        dir: dir.to_path_buf(),
        job: job.to_string(),
        rank,
        size,
    });
    if capacity > 0 {
        install_signal();
    }
}

/// Installs the `SIGUSR1` handler, once, if the signal still has its default action.
fn install_signal() {
    if REQUESTED.get().is_some() {
        return;
    }
    let flag = Arc::new(AtomicBool::new(false));
    if REQUESTED.set(Arc::clone(&flag)).is_err() {
        return;
    }
    // SAFETY: sigaction with a null new action only reads the current disposition into
    // `old`, a zeroed sigaction this call may overwrite.
    let default = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_DFL
    };
    if !default {
        tracing::debug!("SIGUSR1 has a handler already: the flight recorder does not take it");
        return;
    }
    if let Err(e) = signal_hook::flag::register(libc::SIGUSR1, flag) {
        tracing::warn!("cannot install the flight recorder's SIGUSR1 handler: {e}");
    }
}

/// Refreshes the recorder's clock word ([`clock::now`]) and writes the dump a `SIGUSR1` asked
/// for, if one did (the watcher calls this every turn).
pub(crate) fn service() {
    clock::coarse_ns();
    let Some(flag) = REQUESTED.get() else { return };
    if flag.swap(false, Ordering::Relaxed) {
        match dump(Reason::Signal) {
            Ok(path) => tracing::warn!("flight recorder dumped to {} (SIGUSR1)", path.display()),
            Err(e) => tracing::warn!("{e}"),
        }
    }
}

/// Why a dump was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// A collective call timed out.
    Timeout,
    /// A communicator was aborted (here or by a peer).
    Abort,
    /// `SIGUSR1`.
    Signal,
    /// The program asked.
    Api,
}

impl Reason {
    fn name(self) -> &'static str {
        match self {
            Reason::Timeout => "timeout",
            Reason::Abort => "abort",
            Reason::Signal => "signal",
            Reason::Api => "api",
        }
    }
}

/// How a recorded call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Status {
    Posted = 0,
    Started = 1,
    Completed = 2,
    Failed = 3,
}

impl Status {
    fn name(self) -> &'static str {
        ["posted", "started", "completed", "failed"][self as usize]
    }

    fn from_bits(b: u64) -> Status {
        [
            Status::Posted,
            Status::Started,
            Status::Completed,
            Status::Failed,
        ][(b & 3) as usize]
    }
}

/// One call in the ring: one cache line of atomics, written by the calling thread with
/// relaxed stores (no lock on the path of a call), read by a dump. A dump that races a call
/// may see a record half updated; `owner` tells records of different calls apart.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot {
    /// The number of the call that owns the slot, plus one (0: never used).
    owner: AtomicU64,
    /// Collective (bits 0..8), element type (8..16), status (16..18), nonblocking (18), and
    /// the sequence number plus one (from bit [`SEQ_SHIFT`]; 0: not numbered yet).
    what: AtomicU64,
    /// Root plus one (bits 0..32, 0: none) and the peer waited for plus one (32..64).
    ranks: AtomicU64,
    count: AtomicU64,
    bytes: AtomicU64,
    /// When it was posted, started and ended (coarse monotonic nanoseconds; 0: not yet).
    posted: AtomicU64,
    started: AtomicU64,
    completed: AtomicU64,
}

impl Slot {
    /// Sets the status bits of the record.
    #[inline]
    fn set_status(&self, status: Status) {
        let what = self.what.load(RELAXED) & !(3 << 16);
        self.what.store(what | (status as u64) << 16, RELAXED);
    }
}

// Eight words: one cache line per call, which a call's stores fill (a record over two lines
// cost a second line's fetch per call).
const _: () = assert!(std::mem::size_of::<Slot>() == 64);

/// Where a record's sequence number (plus one) starts in its `what`.
const SEQ_SHIFT: u32 = 20;

/// The flight recorder of one communicator.
#[derive(Debug)]
pub(crate) struct Recorder {
    comm: u64,
    epoch: u64,
    rank: usize,
    members: Arc<[usize]>,
    slots: Box<[Slot]>,
    /// `slots.len() - 1`: the ring holds a power of two of records.
    mask: u64,
    /// Calls recorded so far; the next one's number (its slot is `next & mask`).
    next: AtomicU64,
    /// One more than the highest sequence number started.
    entered: AtomicU64,
    /// The errors of the failed calls the ring holds, by call number (failures are rare: a
    /// lock is fine there).
    errors: Mutex<VecDeque<(u64, Arc<str>)>>,
}

/// A recorded call: its number among the recorder's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark(u64);

/// What a call is, for [`Recorder::post`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    /// The collective.
    pub kind: OpKind,
    /// Its element type.
    pub dtype: DataType,
    /// Its count (elements, as the call was made).
    pub count: u64,
    /// Its root, for rooted collectives.
    pub root: Option<usize>,
    /// Bytes this rank sends or receives, the larger.
    pub bytes: u64,
    /// Started in the background (`i`-forms).
    pub nonblocking: bool,
}

const RELAXED: Ordering = Ordering::Relaxed;

impl Recorder {
    /// The recorder of communicator `comm` (epoch `epoch`), where this process is rank `rank`
    /// of `members` (world ranks); `None` when recording is off (`HCOMM_TRACE_BUFFER=0`). It
    /// keeps `HCOMM_TRACE_BUFFER` records rounded up to a power of two (a record's slot is
    /// then a mask of its number, not a division).
    pub(crate) fn new(
        comm: u64,
        epoch: u64,
        rank: usize,
        members: Arc<[usize]>,
    ) -> Option<Arc<Recorder>> {
        let capacity = CAPACITY.load(Ordering::Relaxed);
        if capacity == 0 {
            return None;
        }
        let r = Arc::new(Recorder::with_capacity(
            comm, epoch, rank, members, capacity,
        ));
        let mut all = lock(&RECORDERS);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&r));
        Some(r)
    }

    fn with_capacity(
        comm: u64,
        epoch: u64,
        rank: usize,
        members: Arc<[usize]>,
        capacity: usize,
    ) -> Recorder {
        let capacity = capacity.max(1).next_power_of_two();
        Recorder {
            comm,
            epoch,
            rank,
            members,
            slots: (0..capacity).map(|_| Slot::default()).collect(),
            mask: capacity as u64 - 1,
            next: AtomicU64::new(0),
            entered: AtomicU64::new(0),
            errors: Mutex::new(VecDeque::new()),
        }
    }

    /// The slot of call `mark`, while it still owns it.
    #[inline]
    fn slot(&self, mark: Mark) -> Option<&Slot> {
        let s = &self.slots[(mark.0 & self.mask) as usize];
        (s.owner.load(RELAXED) == mark.0 + 1).then_some(s)
    }

    /// A call was made (`seq`: its sequence number, when it is taken already): relaxed loads
    /// and stores, its time the clock word.
    #[inline]
    pub(crate) fn post(&self, call: &Call, seq: Option<u64>) -> Mark {
        // The pauses that count are this call's.
        let _ = clock::take_pause();
        // A load and a store rather than an atomic increment, which fences: calls on one
        // communicator are made one after the other (two made at the same time by two
        // threads may share a record, as they may share a sequence number).
        let n = self.next.load(RELAXED);
        self.next.store(n + 1, RELAXED);
        let s = &self.slots[(n & self.mask) as usize];
        s.owner.store(n + 1, RELAXED);
        s.what.store(
            call.kind as u64
                | (call.dtype as u64) << 8
                | u64::from(call.nonblocking) << 18
                | seq.map_or(0, |q| q + 1) << SEQ_SHIFT,
            RELAXED,
        );
        s.ranks.store(
            call.root.map_or(0, |r| (r as u64 + 1) & 0xffff_ffff),
            RELAXED,
        );
        s.count.store(call.count, RELAXED);
        s.bytes.store(call.bytes, RELAXED);
        s.posted.store(clock::now(), RELAXED);
        s.started.store(0, RELAXED);
        s.completed.store(0, RELAXED);
        Mark(n)
    }

    /// The call of `mark` took sequence number `seq` and starts: now (`stamp`: a nonblocking
    /// call, on its own thread, which reads the clock), or when it was posted (a blocking call,
    /// whose planning is part of it).
    #[inline]
    pub(crate) fn started(&self, mark: Mark, seq: u64, stamp: bool) {
        // A blocking call: a load and a store, no read-modify-write (which fences), as the
        // calls of one communicator come one after the other; nonblocking calls start on
        // threads of their own, maybe at the same time.
        if stamp {
            self.entered.fetch_max(seq + 1, RELAXED);
        } else if self.entered.load(RELAXED) <= seq {
            self.entered.store(seq + 1, RELAXED);
        }
        if let Some(s) = self.slot(mark) {
            let at = if stamp {
                let _ = clock::take_pause();
                clock::coarse_ns()
            } else {
                s.posted.load(RELAXED)
            };
            s.started.store(at, RELAXED);
            let what = s.what.load(RELAXED) & ((1 << SEQ_SHIFT) - 1);
            s.what.store(
                what | (Status::Started as u64) << 16 | (seq + 1) << SEQ_SHIFT,
                RELAXED,
            );
        }
    }

    /// The call of `mark` completed. A call whose waits yielded or slept reads the clock now
    /// (and a blocking one started at its first pause: [`Recorder::timed`]); a call that
    /// waited for nothing (it took microseconds) ends at the clock word.
    #[inline]
    pub(crate) fn completed(&self, mark: Mark) {
        let Some(s) = self.slot(mark) else { return };
        match clock::take_pause() {
            None => s.completed.store(clock::now(), RELAXED),
            paused => self.timed(s, paused),
        }
        s.set_status(Status::Completed);
        // The next call's record is a line this core last wrote a whole ring ago, no longer in
        // its first-level cache: a load now brings it in (a load waits for nobody), and the
        // next call's stores find it there. Stored into cold, it held the next lock on the
        // call's path until the line came (8-byte broadcast of 2 ranks: 2% slower than
        // with one record, which stays in the cache).
        let next = &self.slots[((mark.0 + 1) & self.mask) as usize];
        std::hint::black_box(next.owner.load(RELAXED));
    }

    /// The call of `mark` failed with `err`; `peer`: the member its thread last waited for.
    #[cold]
    pub(crate) fn failed(&self, mark: Mark, err: &Error, peer: Option<usize>) {
        let Some(s) = self.slot(mark) else { return };
        self.timed(s, clock::take_pause());
        if let Some(p) = peer {
            let root = s.ranks.load(RELAXED) & 0xffff_ffff;
            s.ranks.store(root | (p as u64 + 1) << 32, RELAXED);
        }
        {
            let mut errors = lock(&self.errors);
            if errors.len() >= self.slots.len() {
                errors.pop_front();
            }
            errors.push_back((mark.0, err.to_string().into()));
        }
        s.set_status(Status::Failed);
    }

    /// The call of record `s`, which paused first at `paused` (or failed), ends now, by the
    /// clock.
    /// A blocking call that paused started, as the record says, at its first pause when the
    /// clock word it was posted at is older: it waited from then on.
    #[cold]
    fn timed(&self, s: &Slot, paused: Option<u64>) {
        s.completed.store(clock::coarse_ns(), RELAXED);
        let blocking = s.what.load(RELAXED) & (1 << 18) == 0;
        if let Some(at) = paused.filter(|_| blocking) {
            if s.started.load(RELAXED) < at {
                s.started.store(at, RELAXED);
            }
        }
    }

    /// This recorder's part of a dump.
    fn snapshot(&self) -> CommDump {
        let cap = self.slots.len() as u64;
        let next = self.next.load(Ordering::Acquire);
        let errors = lock(&self.errors).clone();
        let time = |t: u64| (t != 0).then_some(t);
        let ops = (next.saturating_sub(cap)..next)
            .filter_map(|n| {
                let s = self.slot(Mark(n))?;
                let what = s.what.load(RELAXED);
                let ranks = s.ranks.load(RELAXED);
                let kind = OpKind::from_index((what & 0xff) as usize)?;
                let dtype = DataType::from_u8(((what >> 8) & 0xff) as u8)?;
                let status = Status::from_bits(what >> 16);
                let below = |v: u64| v.checked_sub(1).and_then(|v| usize::try_from(v).ok());
                Some(OpRecord {
                    seq: (what >> SEQ_SHIFT).checked_sub(1),
                    op: kind.name().to_string(),
                    dtype: dtype.name().to_string(),
                    count: s.count.load(RELAXED),
                    root: below(ranks & 0xffff_ffff),
                    bytes: s.bytes.load(RELAXED),
                    nonblocking: what & (1 << 18) != 0,
                    state: status.name().to_string(),
                    posted_ns: s.posted.load(RELAXED),
                    started_ns: time(s.started.load(RELAXED)),
                    completed_ns: time(s.completed.load(RELAXED)),
                    peer: below(ranks >> 32),
                    error: errors
                        .iter()
                        .find(|(m, _)| *m == n)
                        .map(|(_, e)| e.to_string()),
                })
            })
            .collect();
        CommDump {
            comm: format!("{:#x}", self.comm),
            epoch: self.epoch,
            rank: self.rank,
            size: self.members.len(),
            members: self.members.to_vec(),
            capacity: self.slots.len(),
            recorded: next,
            entered: self.entered.load(RELAXED),
            ops,
        }
    }
}

/// A dump: one rank's recorders (version [`VERSION`] of the format).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Dump {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format's version ([`VERSION`]).
    pub version: u32,
    /// The job (a hash of its secret and rendezvous address): dumps of one job share it.
    pub job: String,
    /// World rank of the process.
    pub rank: usize,
    /// Ranks in the world.
    pub size: usize,
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
    /// Why it was written: `timeout`, `abort`, `signal` or `api`.
    pub reason: String,
    /// When it was written, nanoseconds since the Unix epoch.
    pub dumped_unix_ns: u64,
    /// When it was written, on the monotonic clock of the record times.
    pub dumped_monotonic_ns: u64,
    /// Every live communicator of the process.
    pub communicators: Vec<CommDump>,
}

/// One communicator in a [`Dump`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommDump {
    /// Its id, `0x…` (the same on every member).
    pub comm: String,
    /// Its epoch (0 until communicators have epochs).
    pub epoch: u64,
    /// This process's rank in it.
    pub rank: usize,
    /// Its size.
    pub size: usize,
    /// World rank of each member.
    pub members: Vec<usize>,
    /// Records kept at most (`HCOMM_TRACE_BUFFER`).
    pub capacity: usize,
    /// Calls recorded since it was made (more than `ops` once the ring wrapped).
    pub recorded: u64,
    /// Collectives entered: one more than the highest sequence number started.
    pub entered: u64,
    /// The calls kept, oldest first.
    pub ops: Vec<OpRecord>,
}

/// One call in a [`CommDump`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpRecord {
    /// Its sequence number on the communicator (`None`: posted, not numbered yet).
    pub seq: Option<u64>,
    /// The collective (`allreduce`, ...).
    pub op: String,
    /// Element type.
    pub dtype: String,
    /// Count, as called.
    pub count: u64,
    /// Root of a rooted collective.
    pub root: Option<usize>,
    /// Bytes this rank sent or received, the larger.
    pub bytes: u64,
    /// Started in the background.
    pub nonblocking: bool,
    /// `posted`, `started`, `completed` or `failed`.
    pub state: String,
    /// When the call was made (monotonic ns).
    pub posted_ns: u64,
    /// When it took its number and began.
    pub started_ns: Option<u64>,
    /// When it ended.
    pub completed_ns: Option<u64>,
    /// The member (rank in the communicator) its thread last blocked on.
    pub peer: Option<usize>,
    /// The error it ended with.
    pub error: Option<String>,
}

/// The dump file of world rank `rank` in `dir`.
pub fn dump_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank{rank}.json"))
}

/// Writes every live recorder of the process to its dump file (replacing an earlier one);
/// returns the file.
pub(crate) fn dump(reason: Reason) -> Result<PathBuf> {
    let setup = lock(&SETUP)
        .clone()
        .ok_or_else(|| Error::invalid_argument("the flight recorder has no world yet"))?;
    let live: Vec<Arc<Recorder>> = lock(&RECORDERS).iter().filter_map(Weak::upgrade).collect();
    let now = monotonic_ns();
    let communicators = live.iter().map(|r| r.snapshot()).collect();
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let d = Dump {
        format: FORMAT.into(),
        version: VERSION,
        job: setup.job.clone(),
        rank: setup.rank,
        size: setup.size,
        pid: std::process::id(),
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        reason: reason.name().into(),
        dumped_unix_ns: unix,
        dumped_monotonic_ns: now,
        communicators,
    };
    let cannot = |what: &str, e: std::io::Error| {
        Error::invalid_argument(format!(
            "HCOMM_TRACE_DIR: cannot {what} {}: {e}",
            setup.dir.display()
        ))
        .with_source(e)
    };
    std::fs::create_dir_all(&setup.dir).map_err(|e| cannot("create", e))?;
    let path = dump_path(&setup.dir, setup.rank);
    let json = serde_json::to_vec_pretty(&d)
        .map_err(|e| Error::internal(format!("cannot encode the flight recorder: {e}")))?;
    // Written beside, then renamed: a reader never sees half a dump.
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, json).map_err(|e| cannot("write into", e))?;
    std::fs::rename(&tmp, &path).map_err(|e| cannot("write into", e))?;
    Ok(path)
}

/// Dumps after a failure (`reason`), logging the outcome rather than failing.
pub(crate) fn dump_on(reason: Reason) {
    if CAPACITY.load(Ordering::Relaxed) == 0 {
        return;
    }
    match dump(reason) {
        Ok(path) => tracing::warn!(
            "flight recorder dumped to {} ({}); `hcomm_trace {}` merges the job's dumps",
            path.display(),
            reason.name(),
            path.parent().unwrap_or(Path::new(".")).display()
        ),
        Err(e) => tracing::warn!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> Call {
        Call {
            kind: OpKind::AllReduce,
            dtype: DataType::Int32,
            count: 4,
            root: None,
            bytes: 16,
            nonblocking: false,
        }
    }

    fn recorder(capacity: usize) -> Recorder {
        Recorder::with_capacity(0x1, 0, 0, vec![0, 1].into(), capacity)
    }

    #[test]
    fn the_ring_keeps_the_last_calls_in_order() {
        // 5 records asked for: the ring holds 8 (a power of two).
        let r = recorder(5);
        for seq in 0..12 {
            let m = r.post(&call(), None);
            r.started(m, seq, true);
            r.completed(m);
        }
        let d = r.snapshot();
        assert_eq!((d.capacity, d.recorded, d.entered), (8, 12, 12));
        let seqs: Vec<u64> = d.ops.iter().filter_map(|o| o.seq).collect();
        assert_eq!(seqs, [4, 5, 6, 7, 8, 9, 10, 11]);
        assert!(d.ops.iter().all(|o| o.state == "completed"));
        // A call whose record was overwritten changes nothing when it ends.
        r.failed(Mark(3), &Error::timeout("late"), Some(1));
        r.completed(Mark(3));
        let d = r.snapshot();
        assert!(d.ops.iter().all(|o| o.error.is_none() && o.peer.is_none()));
        assert!(d.ops.iter().all(|o| o.state == "completed"));
    }

    #[test]
    fn a_failed_call_keeps_its_error_and_the_peer_it_waited_for() {
        let r = recorder(8);
        let root = Call {
            kind: OpKind::Broadcast,
            root: Some(3),
            ..call()
        };
        let m = r.post(&root, None);
        assert_eq!(r.snapshot().ops[0].state, "posted");
        r.started(m, 0, true);
        r.failed(m, &Error::timeout("stuck"), Some(1));
        let op = &r.snapshot().ops[0];
        assert_eq!(op.state, "failed");
        assert_eq!(op.op, "broadcast");
        assert_eq!(op.dtype, "int32");
        assert_eq!((op.root, op.peer), (Some(3), Some(1)));
        assert!(op.error.as_deref().is_some_and(|e| e.contains("stuck")));
        assert!(op.started_ns.is_some() && op.completed_ns >= op.started_ns);
    }

    /// A blocking call that waited for nothing ends at the clock word it was posted at (no
    /// reading of the clock); one whose waits paused started at its first pause and reads
    /// the clock when it ends.
    #[test]
    fn a_call_that_paused_is_timed_from_its_first_pause() {
        let r = recorder(8);
        let fast = r.post(&call(), None);
        r.started(fast, 0, false);
        r.completed(fast);
        let slow = r.post(&call(), None);
        r.started(slow, 1, false);
        // Long enough for the coarse clock to tick (4 ms here, 10 ms on a 100 Hz kernel).
        std::thread::sleep(std::time::Duration::from_millis(30));
        clock::pausing();
        std::thread::sleep(std::time::Duration::from_millis(30));
        r.completed(slow);
        let d = r.snapshot();
        let (f, s) = (&d.ops[0], &d.ops[1]);
        assert_eq!(f.started_ns, Some(f.posted_ns));
        assert!(f.completed_ns >= f.started_ns);
        assert!(s.started_ns.is_some_and(|t| t > s.posted_ns), "{s:?}");
        assert!(s.completed_ns > s.started_ns, "{s:?}");
        assert!(d.ops.iter().all(|o| o.state == "completed"));
    }

    #[test]
    fn the_dump_format_round_trips_with_its_version() {
        let r = recorder(4);
        let m = r.post(&call(), Some(0));
        r.started(m, 0, true);
        let d = Dump {
            format: FORMAT.into(),
            version: VERSION,
            job: "j".into(),
            rank: 0,
            size: 2,
            pid: 1,
            host: "h".into(),
            reason: Reason::Api.name().into(),
            dumped_unix_ns: 1,
            dumped_monotonic_ns: 2,
            communicators: vec![r.snapshot()],
        };
        let text = serde_json::to_string(&d).expect("encodes");
        let v: serde_json::Value = serde_json::from_str(&text).expect("parses");
        assert_eq!(v["version"], VERSION);
        assert_eq!(v["format"], FORMAT);
        assert_eq!(v["communicators"][0]["ops"][0]["state"], "started");
        let back: Dump = serde_json::from_str(&text).expect("decodes");
        assert_eq!(back.communicators[0].ops[0].seq, Some(0));
    }
}
