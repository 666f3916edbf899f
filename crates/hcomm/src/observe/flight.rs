//! The flight recorder (`HCOMM_TRACE_BUFFER`, `HCOMM_TRACE_DIR`): per communicator, a ring of
//! its last collective calls, dumped as versioned JSON when a call times out or is aborted,
//! when the process gets `SIGUSR1`, and when the program asks (`Communicator::dump_trace`,
//! `hcommCommDumpTrace`, `comm.dump_trace()`). `hcomm_trace DIR` merges a job's dumps.
//!
//! Each record holds the communicator, its epoch, the call's sequence number, collective,
//! element type, count and root, when it was posted (the call made), started (its sequence
//! number taken, its schedule begun) and completed, how it ended, and the member its thread
//! last blocked on. A call costs one uncontended lock and three clock readings on its thread;
//! nothing else runs (the measured cost is in docs/flight-recorder.md).
//!
//! `SIGUSR1`: the handler (installed at the first world, only while the signal has its
//! default action, which would kill the process) only raises a flag; the engine's watcher
//! thread sees it at its next turn and writes the dump, so nothing but an atomic store
//! happens in the handler.
//!
//! Below the engine and the communicator: the communicator makes a [`Recorder`] and reports
//! its calls; the watcher calls [`service`].

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use serde::{Deserialize, Serialize};

use super::clock::monotonic_ns;
use super::OpKind;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::sync::lock;

/// The `format` of a dump.
pub const FORMAT: &str = "hcomm-flight-recorder";
/// The version of the dump format this build writes (and `hcomm_trace` reads).
pub const VERSION: u32 = 1;

/// Records per communicator (0: recording is off).
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

/// Writes the dump a `SIGUSR1` asked for, if one did (the watcher calls this every turn).
pub(crate) fn service() {
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
enum Status {
    Posted,
    Started,
    Completed,
    Failed,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Posted => "posted",
            Status::Started => "started",
            Status::Completed => "completed",
            Status::Failed => "failed",
        }
    }
}

/// One call, as kept in the ring.
#[derive(Debug, Clone)]
struct Entry {
    seq: Option<u64>,
    kind: OpKind,
    dtype: DataType,
    count: u64,
    root: Option<usize>,
    bytes: u64,
    nonblocking: bool,
    status: Status,
    posted: u64,
    started: u64,
    completed: u64,
    peer: Option<usize>,
    error: Option<Arc<str>>,
}

#[derive(Debug)]
struct Ring {
    entries: Vec<Entry>,
    /// Calls recorded so far; the next one's number (its slot is `next % capacity`).
    next: u64,
    /// One more than the highest sequence number started.
    entered: u64,
}

/// The flight recorder of one communicator.
#[derive(Debug)]
pub(crate) struct Recorder {
    comm: u64,
    epoch: u64,
    rank: usize,
    members: Arc<[usize]>,
    capacity: usize,
    ring: Mutex<Ring>,
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
    /// Started in the background (`i`-forms, batches).
    pub nonblocking: bool,
}

thread_local! {
    /// The call this thread runs, so that a blocking wait can say whom it waits for.
    static CURRENT: RefCell<Option<(Arc<Recorder>, Mark)>> = const { RefCell::new(None) };
}

impl Recorder {
    /// The recorder of communicator `comm` (epoch `epoch`), where this process is rank `rank`
    /// of `members` (world ranks); `None` when recording is off (`HCOMM_TRACE_BUFFER=0`).
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
        let r = Arc::new(Recorder {
            comm,
            epoch,
            rank,
            members,
            capacity,
            ring: Mutex::new(Ring {
                entries: Vec::new(),
                next: 0,
                entered: 0,
            }),
        });
        let mut all = lock(&RECORDERS);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&r));
        Some(r)
    }

    /// A call was made (`seq`: its sequence number, when it is taken already).
    #[inline]
    pub(crate) fn post(&self, call: &Call, seq: Option<u64>) -> Mark {
        let now = monotonic_ns();
        let e = Entry {
            seq,
            kind: call.kind,
            dtype: call.dtype,
            count: call.count,
            root: call.root,
            bytes: call.bytes,
            nonblocking: call.nonblocking,
            status: Status::Posted,
            posted: now,
            started: 0,
            completed: 0,
            peer: None,
            error: None,
        };
        let mut ring = lock(&self.ring);
        let n = ring.next;
        ring.next += 1;
        let slot = (n % self.capacity as u64) as usize;
        if slot < ring.entries.len() {
            ring.entries[slot] = e;
        } else {
            ring.entries.push(e);
        }
        Mark(n)
    }

    /// Runs `f` on the entry of `mark`, while the ring still holds it.
    #[inline]
    fn with_entry(&self, mark: Mark, f: impl FnOnce(&mut Entry, &mut u64)) {
        let mut ring = lock(&self.ring);
        if mark.0 + (self.capacity as u64) < ring.next {
            return;
        }
        let slot = (mark.0 % self.capacity as u64) as usize;
        let Ring {
            entries, entered, ..
        } = &mut *ring;
        if let Some(e) = entries.get_mut(slot) {
            f(e, entered);
        }
    }

    /// The call of `mark` took sequence number `seq` and starts on this thread.
    #[inline]
    pub(crate) fn started(self: &Arc<Self>, mark: Mark, seq: u64) {
        let now = monotonic_ns();
        self.with_entry(mark, |e, entered| {
            e.seq = Some(seq);
            e.started = now;
            e.status = Status::Started;
            *entered = (*entered).max(seq + 1);
        });
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = Some((Arc::clone(self), mark)));
    }

    /// The call of `mark` ended with `result`.
    #[inline]
    pub(crate) fn finished(&self, mark: Mark, result: std::result::Result<(), &Error>) {
        let now = monotonic_ns();
        let _ = CURRENT.try_with(|c| c.borrow_mut().take());
        self.with_entry(mark, |e, _| {
            e.completed = now;
            match result {
                Ok(()) => e.status = Status::Completed,
                Err(err) => {
                    e.status = Status::Failed;
                    e.error = Some(err.to_string().into());
                }
            }
        });
    }

    /// This recorder's part of a dump.
    fn snapshot(&self) -> CommDump {
        let ring = lock(&self.ring);
        let cap = self.capacity as u64;
        let first = ring.next.saturating_sub(cap);
        let ops = (first..ring.next)
            .filter_map(|n| ring.entries.get((n % cap) as usize))
            .map(|e| OpRecord {
                seq: e.seq,
                op: e.kind.name().to_string(),
                dtype: e.dtype.name().to_string(),
                count: e.count,
                root: e.root,
                bytes: e.bytes,
                nonblocking: e.nonblocking,
                state: e.status.name().to_string(),
                posted_ns: e.posted,
                started_ns: (e.started != 0).then_some(e.started),
                completed_ns: (e.completed != 0).then_some(e.completed),
                peer: e.peer,
                error: e.error.as_deref().map(str::to_string),
            })
            .collect();
        CommDump {
            comm: format!("{:#x}", self.comm),
            epoch: self.epoch,
            rank: self.rank,
            size: self.members.len(),
            members: self.members.to_vec(),
            capacity: self.capacity,
            recorded: ring.next,
            entered: ring.entered,
            ops,
        }
    }
}

/// The calling thread's blocking wait waits for rank `peer` of its communicator: noted in the
/// call it runs (the slow path: once per blocking wait).
pub(crate) fn blocked_on(peer: usize) {
    let _ = CURRENT.try_with(|c| {
        if let Some((r, mark)) = &*c.borrow() {
            r.with_entry(*mark, |e, _| e.peer = Some(peer));
        }
    });
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
        dumped_monotonic_ns: monotonic_ns(),
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

    fn recorder(capacity: usize) -> Arc<Recorder> {
        Arc::new(Recorder {
            comm: 0x1,
            epoch: 0,
            rank: 0,
            members: vec![0, 1].into(),
            capacity,
            ring: Mutex::new(Ring {
                entries: Vec::new(),
                next: 0,
                entered: 0,
            }),
        })
    }

    #[test]
    fn the_ring_keeps_the_last_calls_in_order() {
        let r = recorder(5);
        for seq in 0..12 {
            let m = r.post(&call(), None);
            r.started(m, seq);
            r.finished(m, Ok(()));
        }
        let d = r.snapshot();
        assert_eq!(d.recorded, 12);
        assert_eq!(d.entered, 12);
        let seqs: Vec<u64> = d.ops.iter().filter_map(|o| o.seq).collect();
        assert_eq!(seqs, [7, 8, 9, 10, 11]);
        assert!(d.ops.iter().all(|o| o.state == "completed"));
        // A call whose record was overwritten changes nothing when it ends.
        let old = Mark(3);
        r.finished(old, Err(&Error::timeout("late")));
        assert!(r.snapshot().ops.iter().all(|o| o.error.is_none()));
    }

    #[test]
    fn a_failed_call_keeps_its_error_and_the_peer_it_waited_for() {
        let r = recorder(8);
        let m = r.post(&call(), None);
        r.started(m, 0);
        blocked_on(1);
        r.finished(m, Err(&Error::timeout("stuck")));
        let op = &r.snapshot().ops[0];
        assert_eq!(op.state, "failed");
        assert_eq!(op.peer, Some(1));
        assert!(op.error.as_deref().is_some_and(|e| e.contains("stuck")));
        assert!(op.started_ns.is_some() && op.completed_ns >= op.started_ns);
        // The call is over: a later wait of the thread is no longer its.
        blocked_on(0);
        assert_eq!(r.snapshot().ops[0].peer, Some(1));
    }

    #[test]
    fn the_dump_format_round_trips_with_its_version() {
        let r = recorder(4);
        let m = r.post(&call(), Some(0));
        r.started(m, 0);
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
