//! Transports: how bytes move between two ranks.
//!
//! [`wire`] is the frame format of the stream transports and [`tcp`] sets up the authenticated
//! TCP mesh over the interfaces [`iface`] selects; [`shm`] holds the shared-memory segments and futex waiting of ranks on one host;
//! [`ofi`] opens a libfabric endpoint for RDMA-class networks (loaded at run time);
//! [`plugin`] lets a user's transport carry a job's traffic instead.
//! The progress engine of the point-to-point layer drives the sockets; transports know nothing
//! about messages, tags or collectives.

pub(crate) mod iface;
pub(crate) mod ofi;
pub mod plugin;
pub(crate) mod shm;
pub(crate) mod tcp;
pub(crate) mod wire;
