//! Ctrl-C during a blocking call: the call is waiting in the core with the GIL released, so
//! Python cannot raise `KeyboardInterrupt` until it returns. A watcher thread learns of
//! SIGINT through a pipe written by a signal handler that runs before Python's own (which
//! still runs and sets Python's pending-signal flag), and aborts the communicator the main
//! thread is blocked on: the call returns `Aborted` at once, and the binding then lets
//! Python raise `KeyboardInterrupt`.
//!
//! A Ctrl-C that lands while the call is being entered — after Python last ran its signal
//! handlers, before the call is marked in progress — finds no call to abort, and the GIL is
//! released before Python would raise it: the call would block until `HCOMM_TIMEOUT`. So the
//! call is marked first, and then, with the GIL still held, Python's pending handlers run:
//! a `KeyboardInterrupt` there aborts the communicator and is raised without the call, as if
//! it had come a moment later. Either way a `KeyboardInterrupt` out of a blocking call leaves
//! its communicator aborted.
//!
//! The handler is installed once, at the first communicator, and only when SIGINT has a
//! handler (Python's default or the program's): SIG_DFL and SIG_IGN are left as they are.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};

use pyo3::prelude::*;

/// The communicator of the main thread's blocking call in progress.
static ACTIVE: Mutex<Option<Arc<hcomm::Communicator>>> = Mutex::new(None);
/// The watcher aborted a call since the main thread last looked.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

thread_local! {
    /// This thread is the process's main thread (where Python runs signal handlers).
    static MAIN: bool = rustix::thread::gettid() == rustix::process::getpid();
}

/// Installs the SIGINT watcher (once per process).
pub fn install() {
    INSTALL.call_once(|| {
        if let Err(e) = try_install() {
            eprintln!("hcomm: Ctrl-C will not interrupt blocking calls: {e}");
        }
    });
}

fn try_install() -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid value to be overwritten; a null new action only
    // reads the current one.
    let current = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGINT, std::ptr::null(), &mut old) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        old.sa_sigaction
    };
    if current == libc::SIG_DFL || current == libc::SIG_IGN {
        return Ok(());
    }
    let (mut rx, tx) = UnixStream::pair()?;
    signal_hook::low_level::pipe::register(libc::SIGINT, tx)?;
    std::thread::Builder::new()
        .name("hcomm-sigint".into())
        .spawn(move || {
            let mut byte = [0u8; 64];
            while rx.read(&mut byte).is_ok_and(|n| n > 0) {
                let active = ACTIVE.lock().map(|a| a.clone()).unwrap_or(None);
                if let Some(comm) = active {
                    INTERRUPTED.store(true, Ordering::SeqCst);
                    let _ = comm.abort();
                }
            }
        })?;
    Ok(())
}

/// Enters a blocking call on `comm` (see the module's documentation): marks it in progress
/// on this thread until the guard is dropped (effective on the main thread only), then runs
/// Python's pending signal handlers; a `KeyboardInterrupt` among them aborts `comm` and is
/// returned, and the call must not be made. Call it with the GIL held, and drop the guard
/// after the call, which runs with the GIL released.
pub fn enter(py: Python<'_>, comm: &Arc<hcomm::Communicator>) -> PyResult<Guard> {
    let guard = Guard::enter(comm);
    if guard.armed {
        if let Err(e) = py.check_signals() {
            if e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) {
                let _ = py.detach(|| comm.abort());
            }
            return Err(e);
        }
    }
    Ok(guard)
}

/// Marks a blocking call on `comm` in progress on this thread until dropped.
pub struct Guard {
    armed: bool,
}

impl Guard {
    /// Enters a blocking call (effective on the main thread only).
    fn enter(comm: &Arc<hcomm::Communicator>) -> Guard {
        let armed = MAIN.with(|m| *m);
        if armed {
            if let Ok(mut a) = ACTIVE.lock() {
                *a = Some(Arc::clone(comm));
            }
        }
        Guard { armed }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.armed {
            if let Ok(mut a) = ACTIVE.lock() {
                *a = None;
            }
        }
    }
}

/// The Python error of a failed call: `KeyboardInterrupt` (or what the program's SIGINT
/// handler raises) when Ctrl-C aborted it, else the core's error.
pub fn error(py: Python<'_>, e: hcomm::Error) -> PyErr {
    if INTERRUPTED.swap(false, Ordering::SeqCst) {
        if let Err(signal) = py.check_signals() {
            return signal;
        }
    }
    crate::errors::to_py(e)
}
