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

/// An address of 127.0.0.1 with a port that was free when asked (the port is released, so a
/// test binds it soon after).
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
}

/// A port of 127.0.0.1 that was free when asked (see [`free_addr`]).
pub fn free_port() -> u16 {
    free_addr().port()
}
