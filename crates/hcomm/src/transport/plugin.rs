//! Transport plug-ins: a user's transport that carries all of a job's traffic.
//!
//! A plug-in moves bytes between ranks with a blocking `send(buf, dest)` and
//! `recv(buf, src)`; it is registered under a name with [`register`], and a world created with
//! `HCOMM_TRANSPORT=<name>` sends every frame (point-to-point and collectives alike) through
//! it. The TCP mesh and the rendezvous store still start the job (rendezvous, authentication,
//! and noticing a peer process that dies); the plug-in carries the data.
//!
//! Threading contract (what the engine guarantees, and what it needs):
//!
//! * [`Plugin::init`] is called once per world, before any other call, from the thread
//!   creating the world (if it fails, `finalize` is not called); [`Plugin::finalize`] once
//!   when the world closes, after the last frame to the peers was sent or the close ran out
//!   of time (`HCOMM_TIMEOUT`). One plug-in serves one world at a time: a second world naming
//!   it while the first is open is refused.
//! * Every frame is sent as two calls (its 64-byte header, then its payload when it has one)
//!   and received with calls of exactly the same sizes, in the same order: so a stream
//!   transport and a message transport (each `recv` takes one whole `send`) both work. No
//!   call has a count of zero, and hcomm never sends to its own rank.
//! * `send` to one peer is called from one thread at a time, `recv` from one peer from one
//!   thread at a time; calls for different peers, and a peer's `send` and `recv`, run
//!   concurrently on different threads. `recv` blocks until the bytes arrived.
//! * A peer's threads start on the pair's first use, as TCP links are made: the first
//!   operation with the peer, or the pair's TCP connection coming up (a rank dials it before
//!   its first frame through the plug-in, so the peer starts receiving from it then). A rank
//!   that never talks to a peer never calls `send` or `recv` for it; `init` still names every
//!   rank, and may connect them all or leave each pair to its first call. (The plug-in API
//!   has no call that says a peer started sending, so hcomm learns it from the connection.)
//! * `send` may block while the peer is slow, not forever: it runs on a thread of its own,
//!   so operations still time out (`HCOMM_TIMEOUT`), and closing the world waits for queued
//!   frames at most that long before it calls `finalize`.
//! * `finalize` may run while calls are in progress on other threads (a `recv` from a peer
//!   that has not finalized yet, a `send` to a stuck one): it must make them return an
//!   error, as `shutdown(2)` does for a socket, and calls after it (a thread winding down may
//!   make one) must fail at once. hcomm waits a second for its threads, then leaves them
//!   behind with a warning.
//! * An error from `send` or `recv` means the link to that peer is gone: the traffic with
//!   the peer moves to its TCP connection without loss (the fallback, see
//!   `p2p/link/plugin.rs`), or, with `HCOMM_FAILOVER=0`, every operation with the peer fails
//!   with [`Error::PeerLost`] naming it. A frame may then have reached the peer twice, once
//!   through each; it is taken once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// The transports built into hcomm, which no plug-in may take the name of.
pub(crate) const BUILT_IN: [&str; 3] = ["tcp", "shm", "ofi"];
/// The longest plug-in name, in bytes.
pub const MAX_NAME: usize = 64;

/// A transport plug-in: see the [module documentation](self) for the contract.
pub trait Plugin: Send + Sync {
    /// Prepares the links of this process, rank `rank` of `size` (connections to every peer,
    /// typically). Called once per world before any `send` or `recv`; an error fails the
    /// world's creation, and `finalize` is then not called (clean up before returning).
    fn init(&self, rank: usize, size: usize) -> Result<()> {
        let _ = (rank, size);
        Ok(())
    }

    /// Sends all of `buf` to world rank `dest`.
    fn send(&self, buf: &[u8], dest: usize) -> Result<()>;

    /// Receives exactly `buf.len()` bytes from world rank `src` into `buf`.
    fn recv(&self, buf: &mut [u8], src: usize) -> Result<()>;

    /// Releases the links; makes `send` and `recv` calls still running return an error.
    /// Called once when the world closes.
    fn finalize(&self) -> Result<()> {
        Ok(())
    }
}

/// A registered plug-in, and whether a world uses it.
struct Entry {
    plugin: Arc<dyn Plugin>,
    in_use: bool,
}

static REGISTRY: Mutex<BTreeMap<String, Entry>> = Mutex::new(BTreeMap::new());

fn registry() -> MutexGuard<'static, BTreeMap<String, Entry>> {
    // Every update is a single insert or flag change: a panic elsewhere leaves it consistent.
    crate::sync::lock(&REGISTRY)
}

/// Checks that `name` may name a transport: 1 to [`MAX_NAME`] letters, digits, `_`, `-` or
/// `.` (it travels in `HCOMM_TRANSPORT`). `what` says where the name came from.
pub(crate) fn check_name(name: &str, what: &str) -> Result<()> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(ok) {
        return Err(Error::invalid_argument(format!(
            "{what} {name:?} is not a transport name: use 1 to {MAX_NAME} letters, digits, \
             '_', '-' or '.'"
        )));
    }
    Ok(())
}

/// Registers `plugin` under `name`, for worlds created afterwards with
/// `HCOMM_TRANSPORT=<name>`. Fails for an invalid name, the name of a built-in transport
/// (`tcp`, `shm`, `ofi`) and a name already registered (a registration is never replaced, so that
/// no running world changes transport under its feet).
pub fn register(name: &str, plugin: Arc<dyn Plugin>) -> Result<()> {
    check_name(name, "the plug-in name")?;
    if BUILT_IN.contains(&name) {
        return Err(Error::invalid_argument(format!(
            "{name:?} is a built-in transport: give the plug-in another name"
        )));
    }
    let mut reg = registry();
    if reg.contains_key(name) {
        return Err(Error::invalid_argument(format!(
            "a transport plug-in named {name:?} is already registered: register each plug-in \
             once, under a name of its own"
        )));
    }
    reg.insert(
        name.to_owned(),
        Entry {
            plugin,
            in_use: false,
        },
    );
    Ok(())
}

/// A plug-in taken by a world: released (usable by another world) when dropped.
pub(crate) struct Lease {
    name: String,
    plugin: Arc<dyn Plugin>,
}

impl Lease {
    /// Takes the plug-in registered as `name` for one world. Fails for a name nobody
    /// registered (the message lists the valid ones) and for a plug-in another world of this
    /// process uses.
    pub(crate) fn take(name: &str) -> Result<Lease> {
        let mut reg = registry();
        let known = || {
            BUILT_IN
                .iter()
                .map(|s| s.to_string())
                .chain(reg.keys().cloned())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let Some(entry) = reg.get(name) else {
            return Err(Error::invalid_argument(format!(
                "HCOMM_TRANSPORT={name:?} names no transport: expected one of {} (register a \
                 plug-in with hcommTransportRegister before hcommInit)",
                known()
            )));
        };
        if entry.in_use {
            return Err(Error::invalid_argument(format!(
                "the transport plug-in {name:?} already serves another world of this process; \
                 a plug-in serves one world at a time"
            )));
        }
        let plugin = Arc::clone(&entry.plugin);
        if let Some(e) = reg.get_mut(name) {
            e.in_use = true;
        }
        Ok(Lease {
            name: name.to_owned(),
            plugin,
        })
    }

    /// The name the plug-in was registered under.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The plug-in.
    pub(crate) fn plugin(&self) -> &Arc<dyn Plugin> {
        &self.plugin
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(e) = registry().get_mut(&self.name) {
            e.in_use = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    impl Plugin for Nothing {
        fn send(&self, _: &[u8], _: usize) -> Result<()> {
            Ok(())
        }
        fn recv(&self, _: &mut [u8], _: usize) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn names_are_checked_and_registered_once() {
        for bad in ["", "a b", "x/y", "tab\t", &"n".repeat(MAX_NAME + 1)] {
            let e = register(bad, Arc::new(Nothing)).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad:?}: {e}");
        }
        for built_in in BUILT_IN {
            let e = register(built_in, Arc::new(Nothing)).unwrap_err();
            assert!(e.to_string().contains("built-in"), "{e}");
        }
        register("unit-nothing", Arc::new(Nothing)).unwrap();
        let e = register("unit-nothing", Arc::new(Nothing)).unwrap_err();
        assert!(e.to_string().contains("already registered"), "{e}");
        drop(Lease::take("unit-nothing").unwrap());
        register(&"n".repeat(MAX_NAME), Arc::new(Nothing)).unwrap();
    }

    #[test]
    fn a_plugin_serves_one_world_at_a_time_and_unknown_names_list_the_valid_ones() {
        register("unit-lease", Arc::new(Nothing)).unwrap();
        let lease = Lease::take("unit-lease").unwrap();
        assert_eq!(lease.name(), "unit-lease");
        let e = Lease::take("unit-lease").err().unwrap();
        assert!(e.to_string().contains("one world at a time"), "{e}");
        drop(lease);
        drop(Lease::take("unit-lease").unwrap());
        let e = Lease::take("unit-missing").err().unwrap();
        let m = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{m}");
        assert!(
            m.contains("tcp") && m.contains("shm") && m.contains("unit-lease"),
            "{m}"
        );
    }
}
