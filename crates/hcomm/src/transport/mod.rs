//! Transports: how bytes move between two ranks.
//!
//! [`wire`] is the frame format of the stream transports and [`tcp`] sets up the authenticated
//! TCP mesh. The progress engine of the point-to-point layer drives the sockets; transports
//! know nothing about messages, tags or collectives.

pub mod tcp;
pub mod wire;
