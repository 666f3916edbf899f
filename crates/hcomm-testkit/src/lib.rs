//! What hcomm's tests share (a dev-dependency only): free ports, jobs of ranks started by hand
//! or under a launcher with every wait bounded, the seeded generator and the shapes of calls
//! with uneven v-collective layouts (re-exported from hcomm, whose own tests and tools draw
//! theirs there), the check for shared memory a job left in /dev/shm, the launcher
//! variables of an outer job, and network namespaces as hosts ([`netns`]).

mod jobs;
pub mod netns;
mod ranks;
mod run;
mod shm;

pub use hcomm::internal::coll::random::shapes;
pub use hcomm::internal::config::LAUNCHER_VARS;
pub use hcomm::internal::rng::Rng;
pub use jobs::{
    collect_outputs, fresh_secret, job_ok, local_root, self_job, spawn_ranks, without_launcher_env,
};
pub use ranks::{unix_ns, Ranks};
pub use run::{run_bounded, text};
pub use shm::left_in_dev_shm;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};

/// Ports [`free_addr`] chooses from: below the kernel's ephemeral range, where `bind` to port
/// 0 and outgoing connections take theirs, so that no other socket takes the port between the
/// test's choice and its bind (a concurrent job's listener once took a rendezvous store's port
/// that way).
const TEST_PORTS: std::ops::Range<u16> = 20000..32000;

/// An address of 127.0.0.1 with a port that was free when asked (the port is released, so a
/// test binds it soon after): a random one of [`TEST_PORTS`] below the ephemeral range, or one
/// the kernel picks where that range starts too low to leave room.
pub fn free_addr() -> SocketAddr {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(TEST_PORTS.end);
    let ports = TEST_PORTS.start..TEST_PORTS.end.min(ephemeral);
    let seed = (unix_ns() as u64)
        ^ u64::from(std::process::id()) << 32
        ^ CALLS.fetch_add(1, Ordering::Relaxed);
    let mut rng = Rng::new(seed);
    let tries = if ports.is_empty() { 0 } else { 200 };
    for _ in 0..tries {
        let port = ports.start + rng.below(ports.len()) as u16;
        if let Ok(addr) = TcpListener::bind(("127.0.0.1", port)).and_then(|l| l.local_addr()) {
            return addr;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
}

/// A port of 127.0.0.1 that was free when asked (see [`free_addr`]).
pub fn free_port() -> u16 {
    free_addr().port()
}
