//! `hcommrun`: starts the ranks of an hcomm job on this host.
//!
//! One rendezvous store runs inside hcommrun; every rank gets its place in the job, the
//! store's address and the job secret through the environment. Output is prefixed with the
//! rank; the first rank to fail brings the whole job down, and so does a signal to hcommrun.

use std::ffi::{OsStr, OsString};
use std::io::{self, BufReader, IsTerminal};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use clap::Parser;
use hcomm_tools::bind::{self, BindTo, Core};
use hcomm_tools::{copy_prefixed_lines, generate_job_secret, signal_name, write_line_locked};
use rustix::io::FdFlags;
use rustix::pipe::{self, PipeFlags};
use rustix::process::{self, Pid, Resource, Rlimit, Signal};
#[cfg(target_os = "linux")]
use rustix::thread::CpuSet;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// Most ranks one hcommrun starts.
const MAX_RANKS: u32 = 1024;
/// How long stopped ranks get to exit after SIGTERM (or a forwarded signal) before SIGKILL.
const GRACE: Duration = Duration::from_secs(2);
/// How long to wait for ranks to go after SIGKILL; only a process stuck in the kernel takes
/// longer, and hcommrun must not hang on it.
const KILL_WAIT: Duration = Duration::from_secs(3);
/// How long a rank's output may still drain after the rank exited: output is complete once
/// the pipes close, but a leftover background process of the rank may hold them open.
const DRAIN_WAIT: Duration = Duration::from_millis(500);
/// After a rank failed, how long other failures are gathered to find the first (the others
/// usually fail because of it).
const FAILURE_WINDOW: Duration = Duration::from_millis(300);
/// How long, after the first failure, hcommrun waits to hear of the exit of a rank that the
/// others reported losing: it failed first, but its exit may be reported late (its waiting
/// thread is one of thousands of threads on a loaded machine).
const LOST_WAIT: Duration = Duration::from_secs(3);
/// Stack size of the helper threads (three per rank): they only copy lines and wait.
const THREAD_STACK: usize = 128 * 1024;
/// Exit status for usage errors and jobs that could not be started.
const EXIT_USAGE: i32 = 2;
/// Exit status when `--timeout` ran out, as timeout(1) does.
const EXIT_TIMEOUT: i32 = 124;

/// Start N local ranks of an hcomm program.
///
/// Every rank runs PROG ARGS... with these variables added to hcommrun's environment:
///
///   HCOMM_RANK         the rank, 0..N-1
///   HCOMM_SIZE         N
///   HCOMM_LOCAL_RANK   the rank on this host (= HCOMM_RANK)
///   HCOMM_LOCAL_SIZE   ranks on this host (= N)
///   HCOMM_ROOT_ADDR    host:port of the job's rendezvous store
///   HCOMM_JOB_SECRET   the job's shared secret
///
/// hcommrun runs the rendezvous store itself on 127.0.0.1 with a free port, unless
/// HCOMM_ROOT_ADDR is already set: then that address is passed on and rank 0 of the job
/// binds the store there. HCOMM_JOB_SECRET is passed on when set; otherwise hcommrun makes a
/// fresh one (32 random bytes, hex) for every job.
///
/// Each line a rank writes is printed with the rank in front ("[3] text"), stdout to stdout
/// and stderr to stderr. Standard input goes to rank 0 when it is not a terminal.
///
/// When a rank fails (non-zero exit or killed by a signal), the other ranks get SIGTERM and,
/// two seconds later, SIGKILL; hcommrun then exits with the failed rank's status (128+N for
/// signal N). SIGINT, SIGTERM and SIGHUP to hcommrun are passed on to every rank and stop the
/// job the same way. Each rank runs in its own process group, so its children get the
/// signals too, and a rank is killed if hcommrun dies.
///
/// --keep-going: a failed rank does not stop the others (for fault-tolerant programs, whose
/// survivors revoke, agree and shrink: docs/fault-tolerance.md); each failure is reported as
/// it happens, the job ends when every rank has exited, and hcommrun exits with the first
/// failed rank's status (0 when none failed).
///
/// --bind-to core pins rank r to the r-th core hcommrun may run on (all of that core's
/// hardware threads that hcommrun's own CPU mask allows), as `mpirun --bind-to core` does;
/// --bind-to none leaves every rank with hcommrun's mask. Without --bind-to, ranks are pinned
/// when they fit (no more ranks than allowed cores) and left unpinned when oversubscribed.
/// Each rank sees the choice in HCOMM_BIND_TO (core or none) and, when pinned, its CPUs in
/// HCOMM_BIND_CPUS (a comma list).
///
/// Exit status: 0 when every rank exited 0; the failed rank's status; 128+N after signal N;
/// 124 when --timeout ran out; 2 for bad arguments or a program that cannot be started.
#[derive(Debug, Parser)]
#[command(
    name = "hcommrun",
    version,
    verbatim_doc_comment,
    override_usage = "hcommrun -n N [--timeout SECS] [--bind-to core|none] [--keep-going] [--] \
                      PROG [ARGS]..."
)]
struct Args {
    /// Number of ranks to start (1..=1024).
    #[arg(short = 'n', long = "np", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_RANKS)))]
    ranks: u32,

    /// Stop the whole job after SECS seconds of wall time (exit status 124).
    #[arg(long, value_name = "SECS", value_parser = parse_timeout)]
    timeout: Option<Duration>,

    /// Pin each rank to a core of its own (`core`) or leave the CPU mask alone (`none`).
    /// Default: `core` when the ranks fit the allowed cores, `none` when they do not.
    #[arg(long = "bind-to", value_name = "core|none")]
    bind_to: Option<BindTo>,

    /// A failed rank does not stop the others; exit with the first failure's status once
    /// every rank has exited.
    #[arg(long = "keep-going")]
    keep_going: bool,

    /// The program each rank runs, and its arguments.
    #[arg(value_name = "PROG", required = true, trailing_var_arg = true,
          allow_hyphen_values = true, num_args = 1..)]
    command: Vec<OsString>,
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    // Also rejects NaN, which compares false to everything.
    if !(secs.is_finite() && secs > 0.0 && secs <= 1e9) {
        return Err(format!(
            "{s:?} must be a number of seconds above 0 (at most 1e9)"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// What the main loop waits for.
enum Event {
    /// A rank's process ended (its output has drained or [`DRAIN_WAIT`] passed).
    Exited {
        rank: u32,
        status: io::Result<ExitStatus>,
        /// When the process ended (before its output drained).
        at: Instant,
    },
    /// hcommrun got a signal to stop.
    Signal(i32),
}

fn main() {
    let args = Args::parse();
    let code = match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hcommrun: error: {e:#}");
            EXIT_USAGE
        }
    };
    std::process::exit(code);
}

/// Runs the job; `Err` means it could not be started (exit status 2).
fn run(args: &Args) -> anyhow::Result<i32> {
    let (tx, rx) = mpsc::channel::<Event>();

    // Catch the stop signals before the first rank exists, so that none is lost.
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("cannot install signal handlers")?;
    {
        let tx = tx.clone();
        thread::Builder::new()
            .name("signals".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                for sig in signals.forever() {
                    if tx.send(Event::Signal(sig)).is_err() {
                        break;
                    }
                }
            })
            .context("cannot start the signal thread")?;
    }

    let secret: OsString = match std::env::var_os("HCOMM_JOB_SECRET") {
        Some(s) if !s.is_empty() => s,
        _ => generate_job_secret()
            .context("cannot make a job secret")?
            .into(),
    };

    // The store lives until `run` returns: ranks may use it until the very end.
    let (_store, root_addr): (
        Option<hcomm::internal::bootstrap::RendezvousStore>,
        OsString,
    ) = match std::env::var_os("HCOMM_ROOT_ADDR") {
        Some(addr) if !addr.is_empty() => (None, addr),
        _ => {
            let bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
            let store = hcomm::internal::bootstrap::RendezvousStore::bind(bind, secret.as_bytes())
                .map_err(|e| anyhow!("cannot start the rendezvous store: {e}"))?;
            let addr = store.local_addr().to_string().into();
            (Some(store), addr)
        }
    };

    let cores = bind::allowed_cores().context("cannot read this process's CPU mask")?;
    let (bind_to, pins) = bind::plan(args.bind_to, args.ranks, &cores).map_err(|e| anyhow!(e))?;
    let nofile = raise_nofile_limit(args.ranks);
    let start = Instant::now();
    let deadline = args.timeout.map(|t| start + t);

    let losses = LossPipe::new()?;
    let mut job = Job {
        pids: Vec::with_capacity(args.ranks as usize),
        running: 0,
        exited: vec![false; args.ranks as usize],
        rx: &rx,
        losses: &losses,
        keep_going: args.keep_going,
        first_failure: None,
    };
    for rank in 0..args.ranks {
        let env = RankEnv {
            root_addr: &root_addr,
            secret: &secret,
            losses: &losses.env,
            bind_to,
            cpus: pins[rank as usize].as_ref(),
        };
        if let Err(e) = start_rank(args, rank, &env, nofile, &tx, &mut job) {
            // Ranks already started would wait for the missing one forever.
            job.stop(Signal::TERM);
            return Err(e);
        }
    }
    drop(tx);

    let code = job.supervise(deadline, args.timeout);
    sweep_shm(&secret, &root_addr);
    Ok(code)
}

/// Removes what the job's first world may have left in `/dev/shm`: the ranks remove their
/// segment names themselves once every local rank has mapped them, so names remain only
/// when a rank died before that (during start-up, or holding an unmapped pool block).
fn sweep_shm(secret: &OsStr, root_addr: &OsStr) {
    let id = hcomm::internal::shm::job_id(secret.as_bytes(), &root_addr.to_string_lossy(), 0);
    let prefix = format!("hcomm-{id}-");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        if entry.file_name().as_bytes().starts_with(prefix.as_bytes()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The pipe on which ranks report the peers they lost (`HCOMM_RUN_FD`): a rank that fails
/// because another failed says so, and the launcher names the other one.
struct LossPipe {
    /// hcommrun's end, nonblocking, closed on exec.
    read: OwnedFd,
    /// The ranks' end, inherited (nonblocking: a full pipe drops news, never stalls a rank).
    _write: OwnedFd,
    /// `HCOMM_RUN_FD` for the ranks: `FD:INODE` of the write end.
    env: String,
}

impl LossPipe {
    fn new() -> anyhow::Result<LossPipe> {
        let context = "cannot make the ranks' report pipe";
        let (read, cloexec_write) =
            pipe::pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC).context(context)?;
        // The ranks' copy: above stdio, and inherited across exec (no close-on-exec).
        let write = rustix::io::fcntl_dupfd_cloexec(&cloexec_write, 3).context(context)?;
        rustix::io::fcntl_setfd(&write, FdFlags::empty()).context(context)?;
        let inode = rustix::fs::fstat(&write).context(context)?.st_ino;
        Ok(LossPipe {
            read,
            env: format!("{}:{inode}", write.as_raw_fd()),
            _write: write,
        })
    }

    /// The ranks reported lost so far (by `lost RANK PEER` lines), without waiting.
    fn lost(&self) -> Vec<u32> {
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        while text.len() < 1 << 20 {
            // Nothing more for now (EAGAIN), or every writer gone: done.
            let Ok(n @ 1..) = rustix::io::read(&self.read, &mut buf) else {
                break;
            };
            text.extend_from_slice(&buf[..n]);
        }
        parse_losses(&text)
    }
}

/// The peers named by `lost RANK PEER` lines; other lines are ignored.
fn parse_losses(text: &[u8]) -> Vec<u32> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            match (words.next(), words.next(), words.next(), words.next()) {
                (Some("lost"), Some(rank), Some(peer), None) => {
                    rank.parse::<u32>().ok().and(peer.parse::<u32>().ok())
                }
                _ => None,
            }
        })
        .collect()
}

/// What every rank's environment carries besides its rank.
struct RankEnv<'a> {
    root_addr: &'a OsStr,
    secret: &'a OsStr,
    /// `HCOMM_RUN_FD`.
    losses: &'a str,
    /// `HCOMM_BIND_TO`.
    bind_to: BindTo,
    /// The CPUs the rank is pinned to; `None`: hcommrun's mask.
    cpus: Option<&'a Core>,
}

/// Starts one rank and the threads that watch it, and adds it to `job`.
fn start_rank(
    args: &Args,
    rank: u32,
    env: &RankEnv<'_>,
    nofile: Option<Rlimit>,
    tx: &Sender<Event>,
    job: &mut Job<'_>,
) -> anyhow::Result<()> {
    let child = spawn_rank(args, rank, env, nofile)?;
    let pid = Pid::from_child(&child);
    // Tracked before anything else can fail, so that stopping the job reaches it.
    job.pids.push(pid);
    watch_rank(rank, child, tx.clone())?;
    job.running += 1;
    Ok(())
}

/// Starts one rank with its environment, in its own process group.
fn spawn_rank(
    args: &Args,
    rank: u32,
    env: &RankEnv<'_>,
    nofile: Option<Rlimit>,
) -> anyhow::Result<Child> {
    let prog = &args.command[0];
    let mut cmd = Command::new(prog);
    cmd.args(&args.command[1..])
        .env("HCOMM_RANK", rank.to_string())
        .env("HCOMM_SIZE", args.ranks.to_string())
        .env("HCOMM_LOCAL_RANK", rank.to_string())
        .env("HCOMM_LOCAL_SIZE", args.ranks.to_string())
        .env("HCOMM_ROOT_ADDR", env.root_addr)
        .env("HCOMM_JOB_SECRET", env.secret)
        .env("HCOMM_RUN_FD", env.losses)
        .env("HCOMM_BIND_TO", env.bind_to.name())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own group: signals to the group reach the rank's children too, and a Ctrl-C on
        // the terminal reaches only hcommrun, which then stops the ranks in order.
        .process_group(0);
    // A rank in a background group that reads the terminal would be stopped (SIGTTIN).
    if rank == 0 && !io::stdin().is_terminal() {
        cmd.stdin(Stdio::inherit());
    } else {
        cmd.stdin(Stdio::null());
    }
    match env.cpus {
        Some(cpus) => cmd.env("HCOMM_BIND_CPUS", bind::cpu_list(cpus)),
        None => cmd.env_remove("HCOMM_BIND_CPUS"),
    };
    #[cfg(target_os = "linux")]
    set_parent_death_signal(&mut cmd, nofile, env.cpus.map(|c| bind::set_of(c)));
    #[cfg(not(target_os = "linux"))]
    let _ = nofile;

    cmd.spawn().map_err(|e| {
        let name = prog.to_string_lossy();
        match e.kind() {
            io::ErrorKind::NotFound => {
                anyhow!("cannot start {name:?}: program not found (is it on PATH?)")
            }
            io::ErrorKind::PermissionDenied => {
                anyhow!("cannot start {name:?}: permission denied (is it executable?)")
            }
            _ => anyhow!("cannot start rank {rank} ({name:?}): {e}"),
        }
    })
}

/// Makes the rank die with SIGKILL when hcommrun dies, whatever killed hcommrun, gives the
/// rank back the open-file limit hcommrun started with, and pins it to `cpus` when given.
#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut Command, nofile: Option<Rlimit>, cpus: Option<CpuSet>) {
    let parent = std::process::id();
    let hook = move || -> io::Result<()> {
        process::set_parent_process_death_signal(Some(Signal::KILL))?;
        // hcommrun died between fork and prctl: the death signal would never come.
        if process::getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(parent) {
            return Err(rustix::io::Errno::SRCH.into());
        }
        if let Some(limit) = nofile {
            // Failure only leaves the raised limit in place, which is harmless.
            let _ = process::setrlimit(Resource::Nofile, limit);
        }
        if let Some(cpus) = &cpus {
            // The mask is a subset of hcommrun's own, so the kernel accepts it.
            rustix::thread::sched_setaffinity(None, cpus)?;
        }
        Ok(())
    };
    // SAFETY: the hook runs between fork and exec; it makes only system calls that are
    // async-signal-safe (prctl, getppid, setrlimit, sched_setaffinity, through rustix, which
    // does not allocate for them), allocates nothing itself and touches no lock.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Raises the soft limit on open files when N ranks need more pipes than it allows (two per
/// rank). Returns the old limit, which the ranks get back, when it was raised.
fn raise_nofile_limit(ranks: u32) -> Option<Rlimit> {
    let needed = u64::from(ranks) * 2 + 64;
    let old = process::getrlimit(Resource::Nofile);
    // None is no limit.
    if old.current.is_none_or(|cur| cur >= needed) {
        return None;
    }
    let new = Rlimit {
        current: Some(old.maximum.map_or(needed, |max| needed.min(max))),
        maximum: old.maximum,
    };
    // On failure nothing changed, and spawning reports EMFILE.
    process::setrlimit(Resource::Nofile, new).ok()?;
    Some(old)
}

/// Starts the threads that copy a rank's output and report its exit.
///
/// The exit is dated by the end of the rank's output when that came first: a process closes
/// its files, its pipes (fds 0-2) before its sockets, before its parent learns it exited, so
/// the end of a dying rank's output precedes anything its peers do on noticing its sockets
/// close, their own exits included. Dated by `wait` alone, a peer that noticed fast and failed
/// at once could seem to have failed first and be named instead.
fn watch_rank(rank: u32, mut child: Child, tx: Sender<Event>) -> anyhow::Result<()> {
    // The copy threads hold these senders and send when their pipe ended; the channel
    // disconnects when both are done.
    let (drained_tx, drained_rx) = mpsc::channel::<Instant>();
    let prefix = format!("[{rank}] ").into_bytes();
    if let Some(out) = child.stdout.take() {
        let (prefix, drained) = (prefix.clone(), drained_tx.clone());
        spawn_helper(format!("rank{rank}-out"), move || {
            let _ = copy_prefixed_lines(BufReader::new(out), &prefix, |line| {
                write_line_locked(io::stdout().lock(), line)
            });
            let _ = drained.send(Instant::now());
        })?;
    }
    if let Some(err) = child.stderr.take() {
        let drained = drained_tx.clone();
        spawn_helper(format!("rank{rank}-err"), move || {
            let _ = copy_prefixed_lines(BufReader::new(err), &prefix, |line| {
                write_line_locked(io::stderr().lock(), line)
            });
            let _ = drained.send(Instant::now());
        })?;
    }
    drop(drained_tx);
    spawn_helper(format!("rank{rank}-wait"), move || {
        let status = child.wait();
        let exited = Instant::now();
        // Let the rank's last lines out before its exit is reported.
        let until = exited + DRAIN_WAIT;
        let mut ended: Option<Instant> = None;
        let mut pipes = 0;
        while let Ok(t) = drained_rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            ended = ended.max(Some(t));
            pipes += 1;
        }
        // Both pipes ended (a rank that closed one early is dated by its exit).
        let at = match ended {
            Some(t) if pipes == 2 => t.min(exited),
            _ => exited,
        };
        let _ = tx.send(Event::Exited { rank, status, at });
    })?;
    Ok(())
}

fn spawn_helper<F: FnOnce() + Send + 'static>(name: String, f: F) -> anyhow::Result<()> {
    thread::Builder::new()
        .name(name)
        .stack_size(THREAD_STACK)
        .spawn(f)
        .context("cannot start a thread (too many ranks for this system?)")?;
    Ok(())
}

/// The started ranks and the events about them.
struct Job<'a> {
    /// Process id of each rank, which is also its process group id.
    pids: Vec<Pid>,
    /// Ranks whose exit has not been reported yet.
    running: usize,
    /// Whether each rank's exit has been reported.
    exited: Vec<bool>,
    rx: &'a Receiver<Event>,
    /// Where ranks report the peers they lost.
    losses: &'a LossPipe,
    /// `--keep-going`: a failed rank does not stop the others.
    keep_going: bool,
    /// With `--keep-going`, the exit status for the first rank that failed.
    first_failure: Option<i32>,
}

impl Job<'_> {
    /// Waits for the job to end and returns hcommrun's exit status.
    fn supervise(&mut self, deadline: Option<Instant>, timeout: Option<Duration>) -> i32 {
        while self.running > 0 {
            let event = match deadline {
                None => self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(d) => self
                    .rx
                    .recv_timeout(d.saturating_duration_since(Instant::now())),
            };
            match event {
                Ok(Event::Exited { rank, status, at }) => {
                    self.exit_of(rank);
                    if failed(&status) && self.keep_going {
                        let code = report_failure(rank, &status, "the others go on (--keep-going)");
                        self.first_failure.get_or_insert(code);
                    } else if failed(&status) {
                        let (rank, status) = self.first_failure(rank, status, at);
                        let code = report_failure(rank, &status, "stopping the other ranks");
                        self.stop(Signal::TERM);
                        return code;
                    }
                }
                Ok(Event::Signal(sig)) => {
                    eprintln!(
                        "hcommrun: got {}; passing it on and stopping all ranks",
                        signal_name(sig)
                    );
                    self.stop(Signal::from_named_raw(sig).unwrap_or(Signal::TERM));
                    return 128 + sig;
                }
                Err(RecvTimeoutError::Timeout) => {
                    let secs = timeout.map_or(0.0, |t| t.as_secs_f64());
                    eprintln!(
                        "hcommrun: timeout: the job ran longer than {secs}s; stopping all ranks"
                    );
                    self.stop(Signal::TERM);
                    return EXIT_TIMEOUT;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Cannot happen while a waiter thread lives; never wait on nothing.
                    eprintln!("hcommrun: lost track of the ranks; stopping them");
                    self.stop(Signal::KILL);
                    return 1;
                }
            }
        }
        self.first_failure.unwrap_or(0)
    }

    /// Sends `sig` to every rank's process group, gives them [`GRACE`] to exit, then kills
    /// what is left. Returns within about GRACE + KILL_WAIT, whatever the ranks do.
    fn stop(&mut self, sig: Signal) {
        self.signal_all(sig);
        if sig != Signal::KILL {
            let grace_end = Instant::now() + GRACE;
            while self.running > 0 {
                match self
                    .rx
                    .recv_timeout(grace_end.saturating_duration_since(Instant::now()))
                {
                    Ok(Event::Exited { rank, .. }) => self.exit_of(rank),
                    // A second Ctrl-C: the user does not want to wait for the grace period.
                    Ok(Event::Signal(_)) => break,
                    Err(_) => break,
                }
            }
        }
        // Also the groups of ranks that have exited: their children may still be running.
        self.signal_all(Signal::KILL);
        let kill_end = Instant::now() + KILL_WAIT;
        while self.running > 0 {
            match self
                .rx
                .recv_timeout(kill_end.saturating_duration_since(Instant::now()))
            {
                Ok(Event::Exited { rank, .. }) => self.exit_of(rank),
                Ok(Event::Signal(_)) => {}
                Err(_) => {
                    eprintln!(
                        "hcommrun: {} rank(s) did not exit after SIGKILL",
                        self.running
                    );
                    break;
                }
            }
        }
    }

    /// Counts the exit of `rank`.
    fn exit_of(&mut self, rank: u32) {
        self.running -= 1;
        if let Some(e) = self.exited.get_mut(rank as usize) {
            *e = true;
        }
    }

    /// A rank failed: its peers notice within moments and fail too, and their exits may be
    /// reported first. Gathers the failures of a short while, longer (up to [`LOST_WAIT`])
    /// while a rank the others reported losing is still to be heard of, and returns the
    /// first: the earliest of those that other ranks reported losing, else the earliest.
    fn first_failure(
        &mut self,
        rank: u32,
        status: io::Result<ExitStatus>,
        at: Instant,
    ) -> (u32, io::Result<ExitStatus>) {
        let mut failures = vec![(at, rank, status)];
        let start = Instant::now();
        // The survivors write their reports before they exit.
        let mut lost = self.losses.lost();
        while self.running > 0 {
            let awaited = lost
                .iter()
                .any(|&l| !self.exited.get(l as usize).unwrap_or(&true));
            let until = start + if awaited { LOST_WAIT } else { FAILURE_WINDOW };
            match self
                .rx
                .recv_timeout(until.saturating_duration_since(Instant::now()))
            {
                Ok(Event::Exited { rank, status, at }) => {
                    self.exit_of(rank);
                    if failed(&status) {
                        failures.push((at, rank, status));
                    }
                }
                Ok(Event::Signal(_)) | Err(_) => break,
            }
            lost.extend(self.losses.lost());
        }
        lost.extend(self.losses.lost());
        failures.sort_by_key(|f| (!lost.contains(&f.1), f.0));
        let (_, rank, status) = failures.swap_remove(0);
        (rank, status)
    }

    fn signal_all(&self, sig: Signal) {
        for &pid in &self.pids {
            // The rank's process group, which hcommrun created; ESRCH (group gone) is fine.
            let _ = process::kill_process_group(pid, sig);
        }
    }
}

/// Whether a rank's exit is a failure.
fn failed(status: &io::Result<ExitStatus>) -> bool {
    !matches!(status, Ok(s) if s.success())
}

/// Reports a failed rank, and `then` what hcommrun does; returns hcommrun's exit status for
/// it.
fn report_failure(rank: u32, status: &io::Result<ExitStatus>, then: &str) -> i32 {
    match status {
        Ok(s) => {
            if let Some(sig) = s.signal() {
                eprintln!(
                    "hcommrun: rank {rank} was killed by signal {} ({sig}); {then}",
                    signal_name(sig)
                );
                128 + sig
            } else {
                let code = s.code().unwrap_or(1);
                eprintln!("hcommrun: rank {rank} exited with status {code}; {then}");
                code
            }
        }
        Err(e) => {
            eprintln!("hcommrun: cannot wait for rank {rank}: {e}; {then}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_name_the_lost_peers_and_nothing_else_counts() {
        let text = b"lost 0 1\nlost 2 1\nnoise\nlost 3\nlost x 4\nlost 5 6 7\nlost 4 9\n";
        assert_eq!(parse_losses(text), [1, 1, 9]);
        assert!(parse_losses(&[0xff, b'\n']).is_empty());
    }

    #[test]
    fn the_report_pipe_reaches_hcommrun_without_blocking() {
        let pipe = LossPipe::new().unwrap();
        assert!(pipe.lost().is_empty(), "an empty pipe must not block");
        let (fd, ino) = pipe.env.split_once(':').unwrap();
        let fd: i32 = fd.parse().unwrap();
        assert!(fd >= 3);
        // SAFETY: `fd` is the pipe's write end, open while `pipe` lives.
        let write = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let file = std::fs::File::from(write.try_clone_to_owned().unwrap());
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(file.metadata().unwrap().ino().to_string(), ino);
        use std::io::Write as _;
        (&file).write_all(b"lost 3 0\n").unwrap();
        assert_eq!(pipe.lost(), [0]);
    }
}
