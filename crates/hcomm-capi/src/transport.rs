//! Transport plug-ins from C: `struct hcomm_transport_ops` and
//! `hcommTransportRegister`, over the Rust crate's [`Plugin`] trait.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

use hcomm_core::plugin::{self, Plugin, MAX_NAME};
use hcomm_core::{Error, Operation, PeerRank, Result};

use crate::error::guard;

/// The functions of a transport plug-in, registered with `hcommTransportRegister`. `send` and
/// `recv` are required; the members after them are optional, and a zero member is absent
/// (initialize the struct with designated initializers, or zero it first).
///
/// The contract, for every member: hcomm sends each message as two `send` calls (a 64-byte
/// header, then the payload when there is one) and receives it with `recv` calls of exactly
/// the same counts in the same order, so a byte stream and a message transport both work;
/// counts are never 0 and a rank never sends to itself. `send` to one peer is called from one
/// thread at a time, and so is `recv` from one peer; calls for different peers, and one
/// peer's `send` and `recv`, run at the same time on different threads. Both block until done
/// (`send` may block while the peer is slow, but not forever) and return 0, or non-zero when
/// the link to that peer failed: hcomm then moves the traffic with that peer to its TCP
/// connection, without loss (the fallback; with `HCOMM_FAILOVER=0` it fails every operation
/// with the peer instead, `HCOMM_ERR_PEER_LOST`).
#[repr(C)]
pub struct hcomm_transport_ops {
    /// Sends the `count` bytes at `buf` (which it must not write) to world rank `dest`.
    pub send: Option<unsafe extern "C" fn(buf: *mut c_void, count: usize, dest: c_int) -> c_int>,
    /// Receives exactly `count` bytes from world rank `src` into `buf`.
    pub recv: Option<unsafe extern "C" fn(buf: *mut c_void, count: usize, src: c_int) -> c_int>,
    /// Optional. Called once by `hcommInit`, before any `send` or `recv`, as rank `rank` of
    /// `size` (world ranks), with `ctx`: sets up the connections to the peers. Non-zero
    /// fails `hcommInit` with `HCOMM_ERR_INIT` (and `finalize` is not called: clean up
    /// first).
    pub init: Option<unsafe extern "C" fn(rank: c_int, size: c_int, ctx: *mut c_void) -> c_int>,
    /// Optional. Called once by `hcommFinalize` with `ctx`, after the last message to the peers
    /// was sent (or `HCOMM_TIMEOUT` ran out): releases the connections. Calls still running on other threads (a `recv` from
    /// a peer that has not finalized yet, a `send` to a stuck one) must be made to return
    /// non-zero, as `shutdown(2)` does for a socket, and later calls must fail at once.
    pub finalize: Option<unsafe extern "C" fn(ctx: *mut c_void) -> c_int>,
    /// Optional. Passed to `init` and `finalize` as it is.
    pub ctx: *mut c_void,
}

/// A plug-in registered from C: its functions, called as the Rust trait asks.
struct CPlugin {
    send: unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int,
    init: Option<unsafe extern "C" fn(c_int, c_int, *mut c_void) -> c_int>,
    finalize: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
    ctx: *mut c_void,
}

// SAFETY: `ctx` is only passed back to the plug-in's own functions, which the contract of
// `hcomm_transport_ops` lets hcomm call from any thread.
unsafe impl Send for CPlugin {}
// SAFETY: as above; the struct itself is never changed after registration.
unsafe impl Sync for CPlugin {}

/// A world rank as the C functions take it.
fn c_rank(rank: usize) -> Result<c_int> {
    c_int::try_from(rank)
        .map_err(|_| Error::invalid_argument(format!("rank {rank} does not fit a C int")))
}

impl Plugin for CPlugin {
    fn init(&self, rank: usize, size: usize) -> Result<()> {
        let Some(init) = self.init else {
            return Ok(());
        };
        // SAFETY: a function of the registered plug-in, called as its contract says.
        let rc = unsafe { init(c_rank(rank)?, c_rank(size)?, self.ctx) };
        match rc {
            0 => Ok(()),
            _ => Err(Error::init(format!(
                "init({rank}, {size}, ctx) returned {rc}"
            ))),
        }
    }

    fn send(&self, buf: &[u8], dest: usize) -> Result<()> {
        // SAFETY: `buf` is valid for `buf.len()` bytes, which `send` only reads.
        let rc = unsafe { (self.send)(buf.as_ptr().cast_mut().cast(), buf.len(), c_rank(dest)?) };
        match rc {
            0 => Ok(()),
            _ => Err(Error::transport_failed(format!(
                "send of {} bytes to world rank {dest} returned {rc}",
                buf.len()
            ))
            .with_peer(PeerRank::world(dest))
            .with_operation(Operation::new("send"))),
        }
    }

    fn recv(&self, buf: &mut [u8], src: usize) -> Result<()> {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
        let rc = unsafe { (self.recv)(buf.as_mut_ptr().cast(), buf.len(), c_rank(src)?) };
        match rc {
            0 => Ok(()),
            _ => Err(Error::transport_failed(format!(
                "recv of {} bytes from world rank {src} returned {rc}",
                buf.len()
            ))
            .with_peer(PeerRank::world(src))
            .with_operation(Operation::new("recv"))),
        }
    }

    fn finalize(&self) -> Result<()> {
        let Some(finalize) = self.finalize else {
            return Ok(());
        };
        // SAFETY: a function of the registered plug-in, called as its contract says.
        match unsafe { finalize(self.ctx) } {
            0 => Ok(()),
            rc => Err(Error::transport_failed(format!(
                "finalize(ctx) returned {rc}"
            ))),
        }
    }
}

/// Registers the transport plug-in `ops` as `name`: with `HCOMM_TRANSPORT=<name>`, `hcommInit`
/// sends all traffic of the job (collectives included) through it. Call it before
/// `hcommInit`. `*ops` is copied: it need not outlive the call. `name` is 1 to 64 letters,
/// digits, `_`, `-` or `.`, and neither `tcp` nor `shm` (the built-in transports); a name can
/// be registered once. NULL `name` or `ops`, a NULL `send` or `recv`, or a bad or taken name
/// give `HCOMM_ERR_INVALID_ARGUMENT`. Works at any time, but only a plug-in registered before
/// `hcommInit` can be chosen (the world picks its transport there).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `ops` is NULL or points to a
/// `struct hcomm_transport_ops` whose members are valid for the contract documented there.
#[no_mangle]
pub unsafe extern "C" fn hcommTransportRegister(
    name: *const c_char,
    ops: *const hcomm_transport_ops,
) -> c_int {
    guard("hcommTransportRegister", || {
        if name.is_null() {
            return Err(Error::invalid_argument(
                "name is NULL: pass the name HCOMM_TRANSPORT will select the plug-in by",
            ));
        }
        if ops.is_null() {
            return Err(Error::invalid_argument(
                "ops is NULL: pass a struct hcomm_transport_ops with send and recv",
            ));
        }
        // SAFETY: `name` is not NULL, so NUL-terminated (the caller's promise); at most
        // MAX_NAME + 1 bytes are read.
        let len = unsafe { libc::strnlen(name, MAX_NAME + 1) };
        if len > MAX_NAME {
            return Err(Error::invalid_argument(format!(
                "name is longer than {MAX_NAME} characters"
            )));
        }
        // SAFETY: `len` bytes and the NUL after them are readable, as measured.
        let name = unsafe { CStr::from_ptr(name) };
        let name = name.to_str().map_err(|_| {
            Error::invalid_argument(format!("name {name:?} is not ASCII letters and digits"))
        })?;
        // SAFETY: `ops` is not NULL, so it points to the struct (the caller's promise).
        let ops = unsafe { ops.read() };
        let (Some(send), Some(recv)) = (ops.send, ops.recv) else {
            return Err(Error::invalid_argument(
                "ops->send and ops->recv are required: a plug-in cannot be without them",
            ));
        };
        let plugin = CPlugin {
            send,
            recv,
            init: ops.init,
            finalize: ops.finalize,
            ctx: ops.ctx,
        };
        plugin::register(name, Arc::new(plugin))
    })
}
