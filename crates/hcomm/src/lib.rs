//! hcomm: a collective communication library.
//!
//! One process per rank; ranks exchange data through point-to-point messages and collectives
//! through shared memory inside a host and TCP between hosts. Start a job with `hcommrun`,
//! Open MPI's `mpirun`, MPICH's `mpiexec`, Slurm's `srun` or `torchrun`, then:
//!
//! ```no_run
//! let comm = hcomm::Communicator::init()?;
//! let peer = (comm.rank() + 1) % comm.size();
//! let from = (comm.rank() + comm.size() - 1) % comm.size();
//! let mut got = [0u8; 5];
//! comm.sendrecv(b"hello", peer, 7, &mut got, from, 7)?;
//! # Ok::<(), hcomm::Error>(())
//! ```
//!
//! # The public API
//!
//! The crate's public items are what a program needs to run a job, and nothing else:
//!
//! * the communicator: [`Communicator`] (point-to-point, collectives, groups, memory pool),
//!   [`Request`] and its [`Completion`], [`wait_all`], [`Batch`], [`PoolBuf`], [`Lease`];
//!   receives from any source: [`ANY_SOURCE`], [`RecvStatus`];
//! * errors: [`Error`], [`ErrorCode`], [`Result`], [`ERRORS_DOC`];
//! * element types and reductions: [`DataType`], [`ReduceOp`], [`Element`];
//! * collective calls in their untyped form: [`Shape`], [`CollKind`], [`VLayout`];
//! * configuration: [`Config`] and the types of its fields ([`CmaMode`], [`LaunchInfo`],
//!   [`Launcher`]);
//! * what a communicator reports: [`Topology`], [`RankInfo`], [`ProtocolStats`],
//!   [`PoolStats`];
//! * transport plug-ins: the [`plugin`] module ([`plugin::Plugin`], [`plugin::register`]).
//!
//! Layers, bottom up (private modules; docs/ARCHITECTURE.md describes them): `bootstrap`
//! (rendezvous store, authentication), `topology`, `transport` (TCP, shared memory),
//! `observe` (statistics for hcomm_profiler, stall warnings, traces), `p2p` (matching,
//! requests, progress), `coll` (collective algorithms and their execution), `comm`
//! ([`Communicator`]). What hcomm's own tools, C API, Python extension and tests need from
//! them besides is in `hcomm::internal`, hidden from the docs and not part of the API.

#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]

mod bootstrap;
mod coll;
mod comm;
mod config;
mod dtype;
mod error;
#[cfg(test)]
mod fuzz;
mod observe;
mod p2p;
mod reduce;
mod rng;
mod sync;
mod topology;
mod transport;

pub use coll::{CollKind, Shape, VLayout};
pub use comm::{wait_all, Batch, Communicator, Completion, PoolBuf, Request};
pub use comm::{RecvStatus, ANY_SOURCE, JOIN_TOKEN_MAX};
pub use config::{Config, LaunchInfo, Launcher, Secret};
pub use dtype::{DataType, Element, ReduceOp};
pub use error::{
    Error, ErrorCode, ErrorInfo, IoSource, NotEntered, Operation, PeerRank, Result, ERRORS_DOC,
};
pub use p2p::lease::Lease;
pub use p2p::ProtocolStats;
pub use topology::{RankInfo, Topology};
pub use transport::plugin;
pub use transport::shm::cma::CmaMode;
pub use transport::shm::pool::PoolStats;

/// What hcomm's own crates need from the library besides its API: **not part of the public
/// API and not covered by semver**; any of it may change or go in any release.
///
/// Its users: the tools (`hcommrun` hosts the rendezvous store and names the job,
/// `hcomm_profiler` reads the statistics segments, `hcomm_perf` and `hcomm_check` pick
/// algorithms and check results against the reference), the Python extension (the store of
/// the torch backend), the test kit (random shapes, the seeded RNG, the launcher variables),
/// and the crate's integration tests and benchmarks. The paths below mirror the private
/// modules' (`internal::bootstrap::auth` is `bootstrap::auth`).
#[doc(hidden)]
pub mod internal {
    /// The rendezvous store and its authentication.
    pub mod bootstrap {
        pub use crate::bootstrap::{RendezvousStore, StoreClient};

        /// The store's challenge-response handshake.
        pub mod auth {
            pub use crate::bootstrap::auth::client_handshake;
        }

        /// The store's limits.
        pub mod store {
            pub use crate::bootstrap::store::{
                HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES, MAX_VALUE, STALE_HANDSHAKE,
            };
        }
    }

    /// Collective algorithms, their selection and the reference results.
    pub mod coll {
        pub use crate::coll::Algorithm;

        /// The algorithms.
        pub mod algos {
            pub use crate::coll::algos::names_for;

            /// The one-sided shared-memory algorithm.
            pub mod onesided {
                pub use crate::coll::algos::onesided::OneSided;
            }
        }

        /// Random call shapes.
        pub mod random {
            pub use crate::coll::random::shapes;
        }

        /// The results a collective must give, computed serially.
        pub mod reference {
            pub use crate::coll::reference::expected;
        }

        /// The algorithm selector.
        pub mod select {
            pub use crate::coll::select::Selector;
        }
    }

    /// The launchers' environment.
    pub mod config {
        pub use crate::config::LAUNCHER_VARS;
    }

    /// The statistics segments and their clock.
    pub mod observe {
        pub use crate::observe::{OpKind, OP_KINDS};

        /// The statistics' clock.
        pub mod clock {
            pub use crate::observe::clock::{monotonic_ns, ticks, TickKind, TICK_KIND};
        }

        /// The flight recorder's dump format (what `hcomm_trace` reads).
        pub mod flight {
            pub use crate::observe::flight::{
                dump_path, CommDump, Dump, OpRecord, FORMAT, VERSION,
            };
        }

        /// The statistics segments.
        pub mod stats {
            pub use crate::observe::stats::{
                find_job, pack_name, proto, unpack_name, FailoverCount, FailoverSlot,
                FlightSnapshot, OfiStats, StatsLayout, StatsReader, FAILOVER_SLOTS, LANES,
                OFI_PROTOCOLS,
            };
        }
    }

    /// The reduction kernels.
    pub mod reduce {
        pub use crate::reduce::{kernel_isa, reduce_into};

        /// The portable kernels.
        pub mod scalar {
            pub use crate::reduce::scalar::reduce_into;
        }
    }

    /// The seeded RNG.
    pub mod rng {
        pub use crate::rng::{mix, Rng};
    }

    /// The shared-memory transport.
    pub mod shm {
        pub use crate::p2p::split::{arm_stop_in_split_write, stop_in_split_write_armed};
        pub use crate::transport::shm::cma::arm_nondumpable;
        pub use crate::transport::shm::link::job_id;
    }
}
