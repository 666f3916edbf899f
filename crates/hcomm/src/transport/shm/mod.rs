//! Shared memory between the ranks of one host.
//!
//! [`segment`] creates, maps, validates and unlinks the named segments under `/dev/shm`: mode
//! 0600, names that carry the job's id, a `#[repr(C)]` header with a magic and a version checked
//! on every map, and the name unlinked as soon as every local rank has mapped the segment, so a
//! crash of any process leaves nothing behind. [`futex`] is how a rank waits for a peer through
//! that memory: spin briefly, then yield, then sleep on a futex in the segment (the shared
//! futex, which works across processes), woken by the writer only when a sleeper is flagged.

pub(crate) mod board;
pub(crate) mod cma;
pub(crate) mod fastbox;
pub(crate) mod futex;
pub(crate) mod link;
pub(crate) mod pool;
pub(crate) mod ring;
pub(crate) mod segment;
pub(crate) mod split;
pub(crate) mod wake;
