//! Cross-memory attach: copying straight between the memory of two local processes.
//!
//! Above the eager threshold a receiver pulls a message out of the sender's buffer with one
//! copy, `process_vm_readv(2)`, instead of two copies through a shared segment;
//! [`read_remote`] and [`write_remote`] wrap the two system calls. Each call moves at most
//! [`MAX_BYTES_PER_CALL`] bytes through one `iovec` pair, and a call that moves fewer bytes
//! than asked (the kernel stops at the first page it cannot reach) is continued where it
//! stopped, so the next call reports the reason. Failures become [`Error`]s that name the
//! process, the address and the length: [`Error::PeerLost`] when the process no longer exists
//! (`ESRCH`) or is exiting (a process killed during a transfer fails it with whatever the
//! kernel meets first while tearing it down, `EFAULT` once its mappings are gone),
//! [`Error::Transport`] otherwise (`EPERM`, `EFAULT`, `ENOSYS`, ...), with what to do about
//! it.
//!
//! # Permission
//!
//! The kernel allows the calls only where this process could attach to the other with
//! `ptrace` (`PTRACE_MODE_ATTACH_REALCREDS`): same user, a dumpable peer, and under the Yama
//! security module with `kernel.yama.ptrace_scope = 1` (the default of many distributions)
//! only to a descendant — or to any process once the peer has declared it may be traced by
//! anyone, which [`allow_peer_access`] does. Scope 2 and 3, seccomp filters (some container
//! runtimes) and kernels built without cross-memory attach refuse it whatever the peer does.
//!
//! So it is detected once at start: each rank calls [`allow_peer_access`], publishes the
//! address of a buffer with known content, and its peers [`probe`] it; the answer,
//! [`CmaSupport`], is logged, and where it is not [`CmaSupport::Available`] large messages
//! take the plain-copy path through shared memory instead. [`CmaMode`] is the `HCOMM_CMA`
//! variable that forces that path ([`CmaMode::Off`]).

use std::ffi::c_void;
use std::fmt;
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::io::Errno;
use rustix::process::PTracer;

use crate::error::{Error, ErrorInfo, Result};

/// Most bytes moved by one `process_vm_readv` / `process_vm_writev` call: larger transfers
/// take several calls, so one call never pins an unbounded number of pages.
pub(crate) const MAX_BYTES_PER_CALL: usize = 64 << 20;

/// The `HCOMM_CMA` setting: whether large messages between local ranks may use cross-memory
/// attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CmaMode {
    /// Probe at start and use cross-memory attach where the kernel allows it (`auto`, the
    /// default).
    #[default]
    Auto,
    /// Never use it: large messages are copied through shared memory (`off`).
    Off,
}

impl CmaMode {
    /// The environment variable this setting comes from.
    pub(crate) const ENV_VAR: &'static str = "HCOMM_CMA";

    /// Parses a value of `HCOMM_CMA`: `auto` or `off`, surrounding white space ignored.
    ///
    /// Anything else, the empty string included, is an [`Error::InvalidArgument`] naming the
    /// variable and the accepted values.
    pub(crate) fn from_env_value(value: &str) -> Result<CmaMode> {
        match value.trim() {
            "auto" => Ok(CmaMode::Auto),
            "off" => Ok(CmaMode::Off),
            _ => Err(Error::invalid_argument(format!(
                "{}={value:?} is not valid: expected auto or off",
                CmaMode::ENV_VAR
            ))),
        }
    }

    /// The value of `HCOMM_CMA` that selects this mode.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CmaMode::Auto => "auto",
            CmaMode::Off => "off",
        }
    }
}

impl fmt::Display for CmaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether this process may use cross-memory attach on a peer: the answer of [`probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CmaSupport {
    /// The probe read the peer's bytes: large messages can be pulled with a single copy.
    Available,
    /// The read was refused or failed (permissions, a security policy, a bad address, a
    /// vanished peer, wrong bytes read back, or `HCOMM_CMA=off`); the reason says which and
    /// what to do. Large messages take the plain-copy path.
    Refused(String),
    /// The kernel has no cross-memory attach (`ENOSYS`). Large messages take the plain-copy
    /// path.
    Unsupported,
}

impl CmaSupport {
    /// Whether large messages may be moved with [`read_remote`] / [`write_remote`].
    #[cfg(test)]
    pub(crate) fn is_available(&self) -> bool {
        matches!(self, CmaSupport::Available)
    }
}

/// Lets any process of the same user read and write this process's memory with
/// cross-memory attach (and `ptrace` it), as if Yama's `ptrace_scope` were 0 for it: calls
/// `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`.
///
/// Under Yama with `ptrace_scope = 1` a process may only attach to its descendants, so ranks
/// started side by side by a launcher cannot read each other until each of them calls this.
/// It is a no-op where Yama is not in the kernel (the `prctl` then fails with `EINVAL`, which
/// this function treats as success), and it does not help under `ptrace_scope` 2 or 3, nor
/// across users or against a non-dumpable process. It widens who may inspect this process to
/// every process of the same user, so call it only in ranks that will use cross-memory
/// attach (not with [`CmaMode::Off`]). The setting lasts for the life of the process and
/// applies to all its threads.
pub(crate) fn allow_peer_access() -> Result<()> {
    match rustix::process::set_ptracer(PTracer::Any) {
        Ok(()) => Ok(()),
        // No Yama: nothing restricts same-user access beyond the usual ptrace rules.
        Err(Errno::INVAL) => Ok(()),
        Err(err) => Err(Error::transport_failed(format!(
            "cannot allow local peers to read this process's memory: \
             prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) failed: {err}; set HCOMM_CMA=off"
        ))
        .with_source(err.into())),
    }
}

/// Whether peers may still attach to this process: it is dumpable. A process turns
/// non-dumpable by `prctl(PR_SET_DUMPABLE, 0)` or by changing its credentials (`setuid`,
/// `setgid`, ...), after which the kernel refuses cross-memory attach on it to every peer
/// without `CAP_SYS_PTRACE`, even where the start-up [`probe`] succeeded. One `prctl` call.
pub(crate) fn attachable() -> bool {
    !matches!(
        rustix::process::dumpable_behavior(),
        Ok(rustix::process::DumpableBehavior::NotDumpable)
    )
}

/// Armed by [`arm_nondumpable`]: the next one-sided call that may use cross-memory attach
/// turns this process non-dumpable.
static NODUMP_ARMED: AtomicBool = AtomicBool::new(false);

/// For tests: the next one-sided collective of this process that may reach heap buffers with
/// cross-memory attach turns the process non-dumpable inside the call, after its check of
/// [`attachable`] and before its peers may touch its buffers, so that they are refused in
/// the middle of the call with no warning before (as when a process's ptrace rules tighten
/// mid-job). Nothing else changes; the process stays non-dumpable.
pub fn arm_nondumpable() {
    NODUMP_ARMED.store(true, Ordering::SeqCst);
}

/// Turns this process non-dumpable if [`arm_nondumpable`] asked for it (once).
pub(crate) fn nondumpable_if_armed() {
    // A plain load first: every one-sided call on heap buffers asks, and the hook is armed
    // only in tests.
    if NODUMP_ARMED.load(Ordering::Relaxed) && NODUMP_ARMED.swap(false, Ordering::SeqCst) {
        if let Err(e) =
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        {
            tracing::warn!("the armed turn to non-dumpable failed: prctl(PR_SET_DUMPABLE, 0): {e}");
        }
    }
}

/// Copies `local.len()` bytes from address `remote_addr` of process `pid` into `local`, with
/// `process_vm_readv`.
///
/// Errors: [`Error::PeerLost`] when the process no longer exists; [`Error::Transport`] when
/// the kernel refuses (`EPERM`: see [`allow_peer_access`] and `HCOMM_CMA=off`), lacks the
/// call (`ENOSYS`), or the range is not readable there (`EFAULT`), each naming the pid, the
/// address and how many bytes were copied; [`Error::InvalidArgument`] for a pid of 0 or above
/// `i32::MAX`. After an error the content of `local` is unspecified. An empty `local` is a
/// successful no-op that makes no system call.
///
/// Reading this very process works like reading `/proc/self/mem`: it bypasses Rust's rules on
/// shared and exclusive references, so use it on other processes.
///
/// # Safety
/// The range `remote_addr..remote_addr + local.len()` of process `pid` must be memory that
/// process handed to this one to read for the time of the call; in this very process, memory
/// that no live exclusive reference covers.
pub(crate) unsafe fn read_remote(pid: u32, remote_addr: usize, local: &mut [u8]) -> Result<()> {
    read_limited(pid, remote_addr, local, MAX_BYTES_PER_CALL)
}

/// Copies `local` to address `remote_addr` of process `pid`, with `process_vm_writev`.
///
/// Errors as for [`read_remote`]; `EFAULT` also means the range is not writable there. After
/// an error a prefix of the range may have been written.
///
/// Writing this very process works like writing `/proc/self/mem`: it bypasses Rust's rules on
/// shared and exclusive references, so use it on other processes.
///
/// # Safety
/// The range `remote_addr..remote_addr + local.len()` of process `pid` must be memory that
/// process handed to this one to write for the time of the call, which nothing there reads or
/// writes meanwhile; in this very process, memory that no live reference covers.
pub(crate) unsafe fn write_remote(pid: u32, remote_addr: usize, local: &[u8]) -> Result<()> {
    write_limited(pid, remote_addr, local, MAX_BYTES_PER_CALL)
}

/// Whether `err`, from [`read_remote`] or [`write_remote`], is the kernel refusing
/// cross-memory attach altogether (`EPERM`: permissions or a security policy; `ENOSYS`: no
/// support), as opposed to a failure of that one transfer: then the data can still travel
/// another way.
pub(crate) fn refused(err: &Error) -> bool {
    let source = std::error::Error::source(err);
    let errno = source
        .and_then(|s| s.downcast_ref::<io::Error>())
        .and_then(io::Error::raw_os_error);
    matches!(err, Error::Transport(_)) && matches!(errno, Some(libc::EPERM | libc::ENOSYS))
}

/// Finds out whether this process may read process `peer_pid` with cross-memory attach: reads
/// `expected.len()` bytes at `peer_addr` there and compares them with `expected`, which the
/// peer published beforehand (a few hundred bytes are enough). Logs the answer at `info`.
///
/// The peer must have called [`allow_peer_access`] for the probe to succeed under Yama
/// `ptrace_scope = 1`. An empty `expected` proves nothing and is answered
/// [`CmaSupport::Refused`].
pub(crate) fn probe(peer_pid: u32, peer_addr: usize, expected: &[u8]) -> CmaSupport {
    let support = probe_quietly(peer_pid, peer_addr, expected);
    log_decision(peer_pid, peer_addr, &support);
    support
}

/// [`probe`] under `mode`: with [`CmaMode::Off`] nothing is read and the answer is
/// [`CmaSupport::Refused`], saying that `HCOMM_CMA=off` forced the plain-copy path. Logs the
/// answer at `info`.
pub(crate) fn probe_with_mode(
    mode: CmaMode,
    peer_pid: u32,
    peer_addr: usize,
    expected: &[u8],
) -> CmaSupport {
    match mode {
        CmaMode::Auto => probe(peer_pid, peer_addr, expected),
        CmaMode::Off => {
            let support = CmaSupport::Refused(format!("disabled by {}=off", CmaMode::ENV_VAR));
            log_decision(peer_pid, peer_addr, &support);
            support
        }
    }
}

fn probe_quietly(peer_pid: u32, peer_addr: usize, expected: &[u8]) -> CmaSupport {
    if expected.is_empty() {
        return CmaSupport::Refused(
            "cross-memory attach probe with no bytes to compare proves nothing".to_owned(),
        );
    }
    let pid = match check_args(Op::Read, peer_pid, peer_addr, expected.len()) {
        Ok(pid) => pid,
        Err(err) => return CmaSupport::Refused(err.to_string()),
    };
    let mut got = vec![0u8; expected.len()];
    match read_raw(pid, peer_addr, &mut got, MAX_BYTES_PER_CALL) {
        Ok(()) if got == expected => CmaSupport::Available,
        Ok(()) => CmaSupport::Refused(format!(
            "cross-memory attach probe of {} bytes at {peer_addr:#x} in process {peer_pid} \
             read bytes that differ from the ones the peer published: wrong address, or the \
             peer changed them",
            expected.len()
        )),
        Err(Failure {
            errno: Some(libc::ENOSYS),
            ..
        }) => CmaSupport::Unsupported,
        Err(failure) => CmaSupport::Refused(
            failure
                .into_error(Op::Read, peer_pid, peer_addr, expected.len())
                .to_string(),
        ),
    }
}

fn log_decision(peer_pid: u32, peer_addr: usize, support: &CmaSupport) {
    let peer_addr = format_args!("{peer_addr:#x}");
    match support {
        CmaSupport::Available => tracing::info!(
            peer_pid,
            %peer_addr,
            "cross-memory attach available: large messages are pulled with a single copy"
        ),
        CmaSupport::Refused(reason) => tracing::info!(
            peer_pid,
            %peer_addr,
            "cross-memory attach not used ({reason}): large messages are copied through \
             shared memory"
        ),
        CmaSupport::Unsupported => tracing::info!(
            peer_pid,
            %peer_addr,
            "cross-memory attach not supported by the kernel (process_vm_readv: ENOSYS): \
             large messages are copied through shared memory"
        ),
    }
}

/// Which way the bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

impl Op {
    fn verb(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }

    fn syscall(self) -> &'static str {
        match self {
            Op::Read => "process_vm_readv",
            Op::Write => "process_vm_writev",
        }
    }

    fn access(self) -> &'static str {
        match self {
            Op::Read => "readable",
            Op::Write => "writable",
        }
    }
}

/// Why a transfer stopped: the error number of the failing call, or `None` when a call
/// moved nothing (or, impossibly, more than asked); and how many bytes had been moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Failure {
    errno: Option<i32>,
    done: usize,
}

impl Failure {
    fn into_error(self, op: Op, pid: u32, remote_addr: usize, len: usize) -> Error {
        let mut what = format!(
            "cross-memory {} of {len} bytes at {remote_addr:#x} in process {pid}",
            op.verb()
        );
        if self.done > 0 {
            what.push_str(&format!(" stopped after {} bytes", self.done));
        }
        let syscall = op.syscall();
        if self.errno != Some(libc::ESRCH) && exiting(pid) {
            let why = self.errno.map_or_else(
                || "no progress".to_string(),
                |e| io::Error::from_raw_os_error(e).to_string(),
            );
            let err = Error::PeerLost(
                ErrorInfo::new(format!(
                    "{what}: the process is exiting; it died during the transfer ({syscall}: {why})"
                ))
                .into(),
            );
            return match self.errno {
                Some(e) => err.with_source(io::Error::from_raw_os_error(e)),
                None => err,
            };
        }
        let err = match self.errno {
            Some(libc::ESRCH) => Error::PeerLost(
                ErrorInfo::new(format!(
                    "{what}: the process no longer exists ({syscall}: ESRCH)"
                ))
                .into(),
            ),
            Some(libc::EPERM) => Error::transport_failed(format!(
                "{what}: refused by the kernel ({syscall}: EPERM): this process may not \
                 ptrace that one (another user, a non-dumpable process, a seccomp filter, or \
                 Yama ptrace_scope >= 1 without the peer calling allow_peer_access, i.e. \
                 prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)); set {}=off to copy through \
                 shared memory instead",
                CmaMode::ENV_VAR
            )),
            Some(libc::ENOSYS) => Error::transport_failed(format!(
                "{what}: the kernel has no cross-memory attach ({syscall}: ENOSYS); set {}=off",
                CmaMode::ENV_VAR
            )),
            Some(libc::EFAULT) => Error::transport_failed(format!(
                "{what}: bad address ({syscall}: EFAULT): the range is not mapped {} in that \
                 process, or the local buffer is not",
                op.access()
            )),
            Some(errno) => Error::transport_failed(format!(
                "{what}: {syscall} failed: {}",
                io::Error::from_raw_os_error(errno)
            )),
            None => Error::transport_failed(format!(
                "{what}: {syscall} made no progress; the range is probably not mapped {} in \
                 that process",
                op.access()
            )),
        };
        match self.errno {
            Some(e) => err.with_source(io::Error::from_raw_os_error(e)),
            None => err,
        }
    }
}

/// Whether process `pid` is gone or on its way out, as `/proc/<pid>/stat` says: no such
/// process, a zombie, or exiting (`PF_EXITING` among its flags).
pub(crate) fn exiting(pid: u32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) => return e.kind() == io::ErrorKind::NotFound,
    };
    // The fields after the command name, which ends at the last ')': the state is the first
    // of them (field 3 of the file), the flags the seventh (field 9).
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return false;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first().copied().unwrap_or_default();
    let flags = fields
        .get(6)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0
}

/// Checks the arguments of a transfer: a pid the kernel can name and a remote range that does
/// not wrap around the address space. Returns the pid as the kernel's type.
fn check_args(op: Op, pid: u32, remote_addr: usize, len: usize) -> Result<libc::pid_t> {
    let raw = libc::pid_t::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "cross-memory {} in process {pid}: not a process id",
                op.verb()
            ))
        })?;
    if remote_addr.checked_add(len).is_none() {
        return Err(Error::transport_failed(format!(
            "cross-memory {} of {len} bytes at {remote_addr:#x} in process {pid}: bad \
             address, the range wraps around the address space",
            op.verb()
        )));
    }
    Ok(raw)
}

fn read_limited(pid: u32, remote_addr: usize, local: &mut [u8], max_call: usize) -> Result<()> {
    if local.is_empty() {
        return Ok(());
    }
    let len = local.len();
    let raw = check_args(Op::Read, pid, remote_addr, len)?;
    read_raw(raw, remote_addr, local, max_call)
        .map_err(|f| f.into_error(Op::Read, pid, remote_addr, len))
}

fn write_limited(pid: u32, remote_addr: usize, local: &[u8], max_call: usize) -> Result<()> {
    if local.is_empty() {
        return Ok(());
    }
    let len = local.len();
    let raw = check_args(Op::Write, pid, remote_addr, len)?;
    write_raw(raw, remote_addr, local, max_call)
        .map_err(|f| f.into_error(Op::Write, pid, remote_addr, len))
}

/// `process_vm_readv` into `local`, at most `max_call` bytes a call, continuing partial
/// transfers. `remote_addr + local.len()` must not overflow (checked by [`check_args`]).
fn read_raw(
    pid: libc::pid_t,
    remote_addr: usize,
    local: &mut [u8],
    max_call: usize,
) -> Result<(), Failure> {
    let base = local.as_mut_ptr();
    transfer(local.len(), max_call, |off, n| {
        let local_iov = libc::iovec {
            iov_base: base.wrapping_add(off).cast::<c_void>(),
            iov_len: n,
        };
        let remote_iov = libc::iovec {
            iov_base: ptr::without_provenance_mut(remote_addr + off),
            iov_len: n,
        };
        // SAFETY: `local_iov` covers `local[off..off + n]` (`transfer` keeps `off + n` within
        // `local.len()`), which this function borrows exclusively, so the kernel writing up
        // to `n` bytes there aliases nothing; both iovecs live across the call and their
        // counts are 1. The remote range is memory of the other process, checked by the
        // kernel, which fails with EFAULT rather than touching anything unmapped.
        unsafe { libc::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0) }
    })
}

/// `process_vm_writev` from `local`, at most `max_call` bytes a call, continuing partial
/// transfers. `remote_addr + local.len()` must not overflow (checked by [`check_args`]).
fn write_raw(
    pid: libc::pid_t,
    remote_addr: usize,
    local: &[u8],
    max_call: usize,
) -> Result<(), Failure> {
    let base = local.as_ptr();
    transfer(local.len(), max_call, |off, n| {
        let local_iov = libc::iovec {
            iov_base: base.wrapping_add(off).cast_mut().cast::<c_void>(),
            iov_len: n,
        };
        let remote_iov = libc::iovec {
            iov_base: ptr::without_provenance_mut(remote_addr + off),
            iov_len: n,
        };
        // SAFETY: `local_iov` covers `local[off..off + n]` (`transfer` keeps `off + n` within
        // `local.len()`), which this function borrows; `process_vm_writev` only reads the
        // local side, so the `*mut` its type asks for is never written through. Both iovecs
        // live across the call and their counts are 1. The remote range is memory of the
        // other process, checked by the kernel, which fails with EFAULT rather than touching
        // anything unmapped or read-only.
        unsafe { libc::process_vm_writev(pid, &local_iov, 1, &remote_iov, 1, 0) }
    })
}

/// Moves `len` bytes by calling `call(offset, n)` for consecutive pieces of at most
/// `max_call` bytes (`offset + n <= len`); `call` returns what the system call returned: the
/// bytes moved, or -1 with `errno` set. Retries on `EINTR` and continues after partial moves.
fn transfer(
    len: usize,
    max_call: usize,
    mut call: impl FnMut(usize, usize) -> isize,
) -> Result<(), Failure> {
    let max_call = max_call.max(1);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(max_call);
        let moved = call(done, n);
        match usize::try_from(moved) {
            Ok(moved) if moved > 0 && moved <= n => done += moved,
            Ok(_) => return Err(Failure { errno: None, done }),
            Err(_) => {
                let errno = io::Error::last_os_error().raw_os_error();
                if errno == Some(libc::EINTR) {
                    continue;
                }
                return Err(Failure { errno, done });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::process::{self, Child, ChildStdin, Command, Stdio};
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

    const LONG: Duration = Duration::from_secs(30);
    /// A pid above the kernel's largest possible pid (`PID_MAX_LIMIT`, 2^22): never a process.
    const NO_SUCH_PID: u32 = 0x7fff_fff0;

    /// [`super::read_remote`] on ranges these tests own: buffers of this process that nothing
    /// else uses during the call, or a child's that it handed out.
    fn read_remote(pid: u32, remote_addr: usize, local: &mut [u8]) -> Result<()> {
        // SAFETY: see above; every range of these tests is one.
        unsafe { super::read_remote(pid, remote_addr, local) }
    }

    /// [`super::write_remote`] on ranges these tests own (as for [`read_remote`]).
    fn write_remote(pid: u32, remote_addr: usize, local: &[u8]) -> Result<()> {
        // SAFETY: see `read_remote`; every range of these tests is one.
        unsafe { super::write_remote(pid, remote_addr, local) }
    }

    /// `len` bytes that differ from one offset to the next and from one `seed` to another.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
            .collect()
    }

    /// Whether the kernel lets this process use the calls at all (they are always allowed on
    /// the calling process itself); prints why not.
    fn syscalls_work() -> bool {
        let src = pattern(64, 9);
        let mut got = vec![0u8; 64];
        match read_remote(process::id(), src.as_ptr() as usize, &mut got) {
            Ok(()) => {
                assert_eq!(got, src);
                true
            }
            Err(err) => {
                eprintln!("cross-memory attach is blocked in this sandbox, even on itself: {err}");
                assert!(matches!(err, Error::Transport(_)), "{err}");
                assert!(err.to_string().contains("HCOMM_CMA=off"), "{err}");
                false
            }
        }
    }

    #[test]
    fn cma_mode_parses_auto_and_off_only() {
        assert_eq!(CmaMode::from_env_value("auto").unwrap(), CmaMode::Auto);
        assert_eq!(CmaMode::from_env_value(" off\n").unwrap(), CmaMode::Off);
        assert_eq!(CmaMode::default(), CmaMode::Auto);
        for mode in [CmaMode::Auto, CmaMode::Off] {
            assert_eq!(CmaMode::from_env_value(mode.as_str()).unwrap(), mode);
            assert_eq!(mode.to_string(), mode.as_str());
        }
        for bad in ["", "on", "1", "0", "AUTO", "of f", "auto,off"] {
            let err = CmaMode::from_env_value(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}: {err}");
            let msg = err.to_string();
            assert!(msg.contains("HCOMM_CMA"), "{msg}");
            assert!(msg.contains("auto or off"), "{msg}");
        }
    }

    #[test]
    fn transfer_continues_partial_moves_and_retries_interrupts() {
        // A fake system call that moves at most 5 bytes, and fails once with EINTR.
        let mut calls = Vec::new();
        let mut interrupted = false;
        let res = transfer(23, 8, |off, n| {
            calls.push((off, n));
            if off == 10 && !interrupted {
                interrupted = true;
                // SAFETY: sets this thread's errno, as a failing system call does.
                unsafe { *libc::__errno_location() = libc::EINTR };
                return -1;
            }
            n.min(5) as isize
        });
        assert_eq!(res, Ok(()));
        assert_eq!(
            calls,
            [(0, 8), (5, 8), (10, 8), (10, 8), (15, 8), (20, 3)],
            "pieces of at most 8 bytes, continued where each stopped"
        );
        // No progress is a failure, not a loop.
        assert_eq!(
            transfer(10, 4, |off, _| if off < 4 { 4 } else { 0 }),
            Err(Failure {
                errno: None,
                done: 4
            })
        );
        assert_eq!(transfer(0, 4, |_, _| unreachable!()), Ok(()));
    }

    #[test]
    fn own_memory_is_read_and_written_in_bounded_calls() {
        if !syscalls_work() {
            return;
        }
        let pid = process::id();
        let src = pattern(300_001, 1);
        for max_call in [1, 7, 4096, 65_537, MAX_BYTES_PER_CALL] {
            let mut got = vec![0u8; src.len() - 3];
            read_limited(pid, src.as_ptr() as usize + 3, &mut got, max_call).unwrap();
            assert!(got == src[3..], "read with {max_call} bytes a call");

            let mut dst = vec![0u8; src.len()];
            let dst_addr = dst.as_mut_ptr() as usize;
            write_limited(pid, dst_addr, &src, max_call).unwrap();
            std::hint::black_box(&mut dst);
            assert!(dst == src, "write with {max_call} bytes a call");
        }
        assert!(read_remote(pid, 0, &mut []).is_ok());
        assert!(write_remote(pid, 0, &[]).is_ok());
    }

    /// Three 64 KiB regions (64 KiB is a multiple of every page size): read-write, read-only,
    /// and inaccessible. Unmapped on drop.
    struct Pages {
        base: *mut c_void,
    }

    const REGION: usize = 64 << 10;

    impl Pages {
        fn new() -> Pages {
            // SAFETY: a fresh anonymous private mapping at an address the kernel picks
            // touches no existing memory.
            let base = unsafe {
                rustix::mm::mmap_anonymous(
                    ptr::null_mut(),
                    3 * REGION,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::PRIVATE,
                )
            }
            .unwrap();
            let pages = Pages { base };
            let fill = pattern(2 * REGION, 5);
            // SAFETY: the first two regions are mapped read-write and owned by `pages`.
            unsafe {
                ptr::copy_nonoverlapping(fill.as_ptr(), pages.addr(0) as *mut u8, 2 * REGION)
            };
            // SAFETY: the regions belong to this mapping, which nothing else references.
            unsafe {
                rustix::mm::mprotect(pages.at(1), REGION, MprotectFlags::READ).unwrap();
                rustix::mm::mprotect(pages.at(2), REGION, MprotectFlags::empty()).unwrap();
            }
            pages
        }

        fn at(&self, region: usize) -> *mut c_void {
            self.base.wrapping_byte_add(region * REGION)
        }

        fn addr(&self, region: usize) -> usize {
            self.at(region) as usize
        }
    }

    impl Drop for Pages {
        fn drop(&mut self) {
            // SAFETY: the mapping was made by `Pages::new` and nothing refers to it any more.
            let _ = unsafe { rustix::mm::munmap(self.base, 3 * REGION) };
        }
    }

    fn assert_transport(err: &Error, pid: u32, addr: usize) {
        let msg = err.to_string();
        assert!(matches!(err, Error::Transport(_)), "{msg}");
        assert!(msg.contains(&format!("process {pid}")), "{msg}");
        assert!(msg.contains(&format!("{addr:#x}")), "{msg}");
    }

    /// Unmapped, inaccessible, read-only and wrapping ranges are errors, never a crash.
    #[test]
    fn bad_addresses_are_transport_errors() {
        let works = syscalls_work();
        let pid = process::id();
        let pages = Pages::new();
        let mut buf = vec![0u8; 1000];

        for addr in [0, 8, pages.addr(2), pages.addr(2) + 100] {
            let err = read_remote(pid, addr, &mut buf).unwrap_err();
            assert_transport(&err, pid, addr);
            if works {
                assert!(err.to_string().contains("EFAULT"), "{err}");
            }
            let err = write_remote(pid, addr, &buf).unwrap_err();
            assert_transport(&err, pid, addr);
        }

        // Across the end of the readable memory: the first call stops at the boundary, the
        // next one reports the fault.
        let addr = pages.addr(2) - 300;
        let err = read_remote(pid, addr, &mut buf).unwrap_err();
        assert_transport(&err, pid, addr);
        if works {
            assert!(err.to_string().contains("stopped after 300 bytes"), "{err}");
            assert!(buf[..300] == pattern(2 * REGION, 5)[2 * REGION - 300..]);
        }

        // Writing read-only memory fails and leaves it alone.
        let addr = pages.addr(1);
        let err = write_remote(pid, addr, &buf).unwrap_err();
        assert_transport(&err, pid, addr);
        if works {
            assert!(err.to_string().contains("writable"), "{err}");
            let mut now = vec![0u8; 1000];
            read_remote(pid, addr, &mut now).unwrap();
            assert!(now == pattern(2 * REGION, 5)[REGION..REGION + 1000]);
        }

        // A range that wraps around the address space is refused before any system call.
        let addr = usize::MAX - 10;
        let err = read_remote(pid, addr, &mut buf).unwrap_err();
        assert_transport(&err, pid, addr);
        assert!(err.to_string().contains("wraps"), "{err}");

        for pid in [0, u32::MAX] {
            let err = read_remote(pid, pages.addr(0), &mut buf).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        }
    }

    #[test]
    fn a_missing_process_is_peer_lost() {
        if !syscalls_work() {
            return;
        }
        let mut buf = [0u8; 16];
        let err = read_remote(NO_SUCH_PID, 0x1000, &mut buf).unwrap_err();
        assert!(matches!(err, Error::PeerLost(_)), "{err}");
        assert!(err.to_string().contains(&NO_SUCH_PID.to_string()), "{err}");
        let err = write_remote(NO_SUCH_PID, 0x1000, &buf).unwrap_err();
        assert!(matches!(err, Error::PeerLost(_)), "{err}");
        let support = probe(NO_SUCH_PID, 0x1000, &buf);
        assert!(
            matches!(&support, CmaSupport::Refused(r) if r.contains("no longer exists")),
            "{support:?}"
        );
    }

    #[test]
    fn probe_checks_the_bytes_it_reads() {
        let pid = process::id();
        let published = pattern(256, 3);
        let addr = published.as_ptr() as usize;
        let works = syscalls_work();
        let support = probe(pid, addr, &published);
        assert_eq!(support.is_available(), works, "{support:?}");

        let mut other = published.clone();
        other[200] ^= 1;
        let support = probe(pid, addr, &other);
        assert!(!support.is_available());
        if works {
            assert!(
                matches!(&support, CmaSupport::Refused(r) if r.contains("differ")),
                "{support:?}"
            );
        }
        assert!(matches!(probe(pid, addr, &[]), CmaSupport::Refused(_)));
        let support = probe_with_mode(CmaMode::Off, pid, addr, &published);
        assert!(
            matches!(&support, CmaSupport::Refused(r) if r.contains("HCOMM_CMA=off")),
            "{support:?}"
        );
        assert_eq!(
            probe_with_mode(CmaMode::Auto, pid, addr, &published).is_available(),
            works
        );
    }

    const CHILD_ENV: &str = "HCOMM_TEST_CMA_CHILD";
    const MARK: &str = "HCOMM-CMA-CHILD";
    const CHILD_LEN: usize = 3 * 1024 * 1024 + 123;

    /// The other process of the tests below. With `HCOMM_TEST_CMA_CHILD=allow` it allows
    /// peers to read it; with `nodump` it makes itself non-dumpable, which refuses them (short
    /// of `CAP_SYS_PTRACE`). Then it publishes its pid and the addresses of a buffer with known
    /// content and of a zeroed one on stdout, and answers `check` on stdin (whether the second
    /// buffer holds what the parent wrote) until stdin closes or it is killed.
    #[test]
    #[ignore = "run by read_and_write_another_process in a child process"]
    fn cma_child() {
        match std::env::var(CHILD_ENV).as_deref() {
            Ok("allow") => allow_peer_access().unwrap(),
            Ok("nodump") => rustix::process::set_dumpable_behavior(
                rustix::process::DumpableBehavior::NotDumpable,
            )
            .unwrap(),
            _ => return,
        }
        let source = pattern(CHILD_LEN, 1);
        let mut target = vec![0u8; CHILD_LEN];
        let target_ptr = target.as_mut_ptr();
        let mut out = io::stdout().lock();
        writeln!(
            out,
            "{MARK} pid={} src={:#x} dst={:#x}",
            process::id(),
            source.as_ptr() as usize,
            target_ptr as usize
        )
        .unwrap();
        out.flush().unwrap();
        let expected = pattern(CHILD_LEN, 2);
        for line in io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim() != "check" {
                break;
            }
            // Volatile reads: the parent wrote these bytes behind the compiler's back.
            let same = (0..CHILD_LEN).all(|i| {
                // SAFETY: `i` is within `target`, which lives until the end of the function.
                unsafe { target_ptr.add(i).read_volatile() == expected[i] }
            });
            writeln!(out, "{MARK} write={}", if same { "ok" } else { "bad" }).unwrap();
            out.flush().unwrap();
        }
        std::hint::black_box((&source, &mut target));
    }

    /// The child process, killed on drop; its stdout lines that carry [`MARK`] arrive on
    /// `lines`, without the mark.
    struct ChildProcess {
        child: Child,
        stdin: ChildStdin,
        lines: mpsc::Receiver<String>,
    }

    impl ChildProcess {
        /// Starts [`cma_child`] with `HCOMM_TEST_CMA_CHILD=mode` and parses what it publishes:
        /// the child, its pid, and the addresses of its source and destination buffers.
        fn spawn(mode: &str) -> (ChildProcess, u32, usize, usize) {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "transport::shm::cma::tests::cma_child",
                    "--ignored",
                    "--test-threads=1",
                    "--nocapture",
                ])
                .env(CHILD_ENV, mode)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("cannot start the child process");
            let stdin = child.stdin.take().unwrap();
            let stdout = child.stdout.take().unwrap();
            let (tx, lines) = mpsc::channel();
            thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    // libtest may print "test <name> ... " on the same line first.
                    if let Some(at) = line.find(MARK) {
                        let rest = line[at + MARK.len()..].trim().to_owned();
                        if tx.send(rest).is_err() {
                            break;
                        }
                    }
                }
            });
            let child = ChildProcess {
                child,
                stdin,
                lines,
            };
            let line = child.next_line();
            let pid = u32::try_from(field(&line, "pid")).unwrap();
            assert_eq!(pid, child.child.id(), "the child published another pid");
            let (src, dst) = (field(&line, "src"), field(&line, "dst"));
            (child, pid, src, dst)
        }

        fn next_line(&self) -> String {
            self.lines
                .recv_timeout(LONG)
                .expect("the child process ended or went silent")
        }
    }

    impl Drop for ChildProcess {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn field(line: &str, key: &str) -> usize {
        let value = line
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} in {line:?}"));
        match value.strip_prefix("0x") {
            Some(hex) => usize::from_str_radix(hex, 16).unwrap(),
            None => value.parse().unwrap(),
        }
    }

    /// Reads and writes the memory of a child process that allowed it; where the kernel
    /// refuses cross-memory attach, checks that the probe says so clearly instead. Then the
    /// child is killed and reading it gives `PeerLost`.
    #[test]
    fn read_and_write_another_process() {
        let works_on_self = syscalls_work();
        let (mut child, pid, src, dst) = ChildProcess::spawn("allow");
        let source = pattern(CHILD_LEN, 1);

        let support = probe(pid, src + 1000, &source[1000..1256]);
        match &support {
            CmaSupport::Available => {
                eprintln!("path run: cross-memory attach works with a child process");
                let mut got = vec![0u8; CHILD_LEN];
                read_remote(pid, src, &mut got).unwrap();
                assert!(got == source, "read_remote returned other bytes");
                let mut got = vec![0u8; 100_000];
                read_limited(pid, src + 77, &mut got, 4093).unwrap();
                assert!(got == source[77..100_077]);

                let payload = pattern(CHILD_LEN, 2);
                write_remote(pid, dst, &payload).unwrap();
                let mut back = vec![0u8; CHILD_LEN];
                read_remote(pid, dst, &mut back).unwrap();
                assert!(back == payload, "write_remote did not round-trip");
                writeln!(child.stdin, "check").unwrap();
                child.stdin.flush().unwrap();
                assert_eq!(child.next_line(), "write=ok");

                for addr in [0, 8] {
                    let err = read_remote(pid, addr, &mut got).unwrap_err();
                    assert_transport(&err, pid, addr);
                    let err = write_remote(pid, addr, &payload[..10]).unwrap_err();
                    assert_transport(&err, pid, addr);
                }
            }
            CmaSupport::Refused(reason) => {
                eprintln!("path run: cross-memory attach refused in this sandbox: {reason}");
                assert!(reason.contains(&format!("process {pid}")), "{reason}");
                assert!(reason.contains("HCOMM_CMA=off"), "{reason}");
                let err = read_remote(pid, src, &mut [0u8; 64]).unwrap_err();
                assert_transport(&err, pid, src);
                assert!(err.to_string().contains("EPERM"), "{err}");
                let err = write_remote(pid, dst, &[0u8; 64]).unwrap_err();
                assert_transport(&err, pid, dst);
            }
            CmaSupport::Unsupported => {
                eprintln!("path run: the kernel has no cross-memory attach");
                let err = read_remote(pid, src, &mut [0u8; 64]).unwrap_err();
                assert_transport(&err, pid, src);
                assert!(err.to_string().contains("ENOSYS"), "{err}");
            }
        }
        if works_on_self {
            assert!(
                !matches!(support, CmaSupport::Unsupported),
                "works on itself but reported unsupported"
            );
        }

        child.child.kill().unwrap();
        child.child.wait().unwrap();
        let res = read_remote(pid, src, &mut [0u8; 64]);
        match res {
            Err(Error::PeerLost(msg)) => {
                assert!(msg.message.contains(&format!("process {pid}")), "{msg}");
                eprintln!("dead child: {msg}");
            }
            // The pid was reused by a new process already: nothing to check.
            _ if std::path::Path::new(&format!("/proc/{pid}")).exists() => {
                eprintln!("the child's pid {pid} was reused; skipping the PeerLost check");
            }
            other if works_on_self => panic!("reading a dead process gave {other:?}"),
            Err(err) => eprintln!("dead child, with the system calls blocked: {err}"),
            Ok(()) => panic!("read a dead process"),
        }
    }

    /// Only the kernel refusing cross-memory attach altogether (`EPERM`, `ENOSYS`) is a
    /// refusal that another path can serve; a bad address, a dead peer or bad arguments are
    /// not.
    #[test]
    fn refusals_are_told_from_failed_transfers() {
        let me = process::id();
        let failure = |errno| Failure {
            errno: Some(errno),
            done: 0,
        };
        for errno in [libc::EPERM, libc::ENOSYS] {
            let err = failure(errno).into_error(Op::Read, me, 8, 64);
            assert!(refused(&err), "{err}");
        }
        for errno in [libc::EFAULT, libc::ESRCH, libc::EINVAL] {
            let err = failure(errno).into_error(Op::Write, me, 8, 64);
            assert!(!refused(&err), "{err}");
        }
        let silent = Failure {
            errno: None,
            done: 0,
        };
        assert!(!refused(&silent.into_error(Op::Read, me, 8, 64)));
        assert!(!refused(&Error::invalid_argument("EPERM")));
    }

    /// A transfer that fails because its peer is dying is `PeerLost`, whatever the kernel
    /// said (found by the kill-to-error test: a rank killed during a one-sided all-reduce
    /// made a peer's read fail with `EFAULT`, reported as a transport error); the same
    /// failure on a live process stays a transport error.
    #[test]
    fn failures_against_a_dying_process_are_peer_lost() {
        let efault = Failure {
            errno: Some(libc::EFAULT),
            done: 0,
        };
        let live = efault.into_error(Op::Read, std::process::id(), 8, 64);
        assert!(matches!(live, Error::Transport(_)), "{live}");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not waited for: once it has exited it stays a zombie.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !exiting(pid) {
            assert!(
                std::time::Instant::now() < until,
                "child {pid} did not exit"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        for failure in [
            efault,
            Failure {
                errno: None,
                done: 10,
            },
        ] {
            let err = failure.into_error(Op::Read, pid, 8, 64);
            assert!(
                matches!(&err, Error::PeerLost(m) if m.message.contains("exiting")),
                "{err}"
            );
        }
        child.wait().unwrap();
        assert!(!exiting(std::process::id()));
    }

    /// A non-dumpable peer refuses cross-memory attach, even after nothing else would, unless
    /// this process has `CAP_SYS_PTRACE` (as root usually does): then it is read like any other.
    #[test]
    fn a_non_dumpable_process_is_refused_clearly() {
        if !syscalls_work() {
            return;
        }
        let (child, pid, src, dst) = ChildProcess::spawn("nodump");
        let source = pattern(CHILD_LEN, 1);
        match probe(pid, src, &source[..256]) {
            CmaSupport::Refused(reason) => {
                eprintln!("path run: a non-dumpable child refused: {reason}");
                assert!(reason.contains(&format!("process {pid}")), "{reason}");
                assert!(reason.contains(&format!("{src:#x}")), "{reason}");
                assert!(reason.contains("EPERM"), "{reason}");
                assert!(reason.contains("HCOMM_CMA=off"), "{reason}");
                let err = read_remote(pid, src, &mut [0u8; 64]).unwrap_err();
                assert_transport(&err, pid, src);
                assert!(err.to_string().contains("EPERM"), "{err}");
                let err = write_remote(pid, dst, &[1u8; 64]).unwrap_err();
                assert_transport(&err, pid, dst);
                assert!(err.to_string().contains("process_vm_writev"), "{err}");
            }
            CmaSupport::Available => {
                eprintln!(
                    "path run: this process has CAP_SYS_PTRACE and read a non-dumpable child; \
                     the refusal cannot be produced here"
                );
                let mut got = vec![0u8; 4096];
                read_remote(pid, src, &mut got).unwrap();
                assert!(got == source[..4096]);
            }
            CmaSupport::Unsupported => panic!("works on itself but reported unsupported"),
        }
        drop(child);
    }
}
