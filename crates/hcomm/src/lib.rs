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
//! Layers, bottom up: [`bootstrap`] (rendezvous store, authentication), [`topology`],
//! [`transport`] (TCP, shared memory), [`observe`] (statistics for hcomm_profiler, stall
//! warnings, traces), `p2p` (matching, requests, progress), [`Communicator`].

#![forbid(unsafe_op_in_unsafe_fn)]

pub mod bootstrap;
pub mod coll;
mod comm;
pub mod config;
pub mod dtype;
mod error;
#[cfg(test)]
mod fuzz;
pub mod observe;
mod p2p;
pub mod reduce;
pub mod rng;
mod sync;
pub mod topology;
pub mod transport;

pub use comm::{wait_all, Batch, Communicator, Completion, PoolBuf, Request};
pub use config::Config;
pub use dtype::{DataType, ReduceOp};
pub use error::{Error, ErrorCode, Result, ERRORS_DOC};
pub use p2p::lease::Lease;
pub use p2p::ProtocolStats;
