//! The library's one global state: whether hcomm is initialized, and the tables that map
//! communicator and request handles to the Rust objects behind them.
//!
//! Handles are table keys that are never reused, so a destroyed communicator or a completed
//! request is simply absent: an `HCOMM_ERR_INVALID_ARGUMENT`, never a dangling pointer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use hcomm_core::{Communicator, Error, Request, Result};

use crate::types::{comm_handle, hcommComm_t, hcommRequest_t, request_handle, COMM_WORLD};

/// Where the process stands between `hcommInit` and `hcommFinalize`.
enum Phase {
    /// `hcommInit` has not succeeded yet.
    Uninit,
    /// Initialized: the live communicators and requests.
    Ready(Tables),
    /// `hcommFinalize` ran: hcomm cannot be used again in this process.
    Finalized,
}

/// The live communicators and requests, by handle.
pub(crate) struct Tables {
    comms: HashMap<usize, Arc<Communicator>>,
    requests: HashMap<usize, Pending>,
    /// Next handle of each table; handles 0 (NULL) and 1 (`COMM_WORLD`) are never drawn.
    next: usize,
}

/// A nonblocking operation: the Rust request, and where a receive's data goes when it
/// completes.
pub(crate) struct Pending {
    pub(crate) request: Request,
    pub(crate) recv_into: Option<RecvTarget>,
}

/// The caller's receive buffer of a nonblocking receive (the data arrives in a staging buffer
/// the request owns, and is copied here on completion).
pub(crate) struct RecvTarget {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    /// The rank received from; `None` for a receive from any source.
    pub(crate) src: Option<usize>,
}

static PHASE: Mutex<Phase> = Mutex::new(Phase::Uninit);

fn phase() -> MutexGuard<'static, Phase> {
    // A panic while the lock was held is caught at the boundary; the tables stay consistent
    // (every update is a single insert or remove).
    PHASE.lock().unwrap_or_else(|e| e.into_inner())
}

fn not_ready(phase: &Phase) -> Error {
    match phase {
        Phase::Finalized => {
            Error::init("hcommFinalize was called: hcomm cannot be used again in this process")
        }
        _ => Error::init("hcomm is not initialized: call hcommInit first"),
    }
}

/// Runs `f` on the tables, or fails with `HCOMM_ERR_INIT` before `hcommInit` and after
/// `hcommFinalize`.
pub(crate) fn with_tables<T>(f: impl FnOnce(&mut Tables) -> Result<T>) -> Result<T> {
    match &mut *phase() {
        Phase::Ready(t) => f(t),
        other => Err(not_ready(other)),
    }
}

/// `hcommInit`: joins the job with `join` unless already initialized (then nothing happens);
/// returns whether it joined.
pub(crate) fn init(join: impl FnOnce() -> Result<Communicator>) -> Result<bool> {
    let mut phase = phase();
    match &*phase {
        Phase::Ready(_) => Ok(false),
        Phase::Finalized => Err(Error::init(
            "hcommInit after hcommFinalize: hcomm cannot be initialized twice in one process",
        )),
        Phase::Uninit => {
            let world = join()?;
            let mut comms = HashMap::new();
            comms.insert(COMM_WORLD.addr(), Arc::new(world));
            *phase = Phase::Ready(Tables {
                comms,
                requests: HashMap::new(),
                next: COMM_WORLD.addr() + 1,
            });
            Ok(true)
        }
    }
}

/// What `hcommFinalize` releases once the state lock is free: the requests still pending,
/// then the communicators (dropping a nonblocking collective's request waits for it, and
/// closing a world waits for queued data).
pub(crate) struct Released {
    pub(crate) requests: Vec<Pending>,
    pub(crate) comms: Vec<Arc<Communicator>>,
}

/// `hcommFinalize`: takes every communicator and request out of the tables, for the caller
/// to release after the lock is released.
pub(crate) fn finalize() -> Result<Released> {
    let mut phase = phase();
    match std::mem::replace(&mut *phase, Phase::Finalized) {
        Phase::Ready(t) => Ok(Released {
            requests: t.requests.into_values().collect(),
            comms: t.comms.into_values().collect(),
        }),
        other => {
            let e = not_ready(&other);
            *phase = other;
            Err(e)
        }
    }
}

impl Tables {
    fn draw(&mut self) -> usize {
        let key = self.next;
        self.next += 1;
        key
    }

    /// The communicator behind `comm`.
    pub(crate) fn comm(&self, comm: hcommComm_t) -> Result<Arc<Communicator>> {
        if comm.is_null() {
            return Err(Error::invalid_argument(
                "the communicator is HCOMM_COMM_NULL: pass COMM_WORLD or one from hcommCommSplit",
            ));
        }
        self.comms.get(&comm.addr()).cloned().ok_or_else(|| {
            Error::invalid_argument(format!(
                "communicator handle {comm:p} is not a live communicator: it was destroyed \
                 (hcommCommDestroy) or never created"
            ))
        })
    }

    /// Adds a communicator; returns its handle.
    pub(crate) fn add_comm(&mut self, comm: Communicator) -> hcommComm_t {
        let key = self.draw();
        self.comms.insert(key, Arc::new(comm));
        comm_handle(key)
    }

    /// Removes a communicator (not the world).
    pub(crate) fn remove_comm(&mut self, comm: hcommComm_t) -> Result<Arc<Communicator>> {
        if comm == COMM_WORLD {
            return Err(Error::invalid_argument(
                "COMM_WORLD cannot be destroyed: hcommFinalize releases it",
            ));
        }
        self.comm(comm)?;
        self.comms
            .remove(&comm.addr())
            .ok_or_else(|| Error::internal("a communicator vanished from its table"))
    }

    /// Adds a request; returns its handle.
    pub(crate) fn add_request(&mut self, pending: Pending) -> hcommRequest_t {
        let key = self.draw();
        self.requests.insert(key, pending);
        request_handle(key)
    }

    /// The request behind `req`, left in the table.
    pub(crate) fn request(&mut self, req: hcommRequest_t) -> Result<&mut Pending> {
        self.requests
            .get_mut(&req.addr())
            .ok_or_else(|| unknown_request(req))
    }

    /// Takes the request behind `req` out of the table.
    pub(crate) fn take_request(&mut self, req: hcommRequest_t) -> Result<Pending> {
        self.requests
            .remove(&req.addr())
            .ok_or_else(|| unknown_request(req))
    }
}

fn unknown_request(req: hcommRequest_t) -> Error {
    Error::invalid_argument(format!(
        "request handle {req:p} is not a pending request: it was already completed by \
         hcommWait or hcommTest, or was never started"
    ))
}

/// The communicator behind `comm`; `HCOMM_ERR_INIT` outside init..finalize.
pub(crate) fn comm(comm: hcommComm_t) -> Result<Arc<Communicator>> {
    with_tables(|t| t.comm(comm))
}
