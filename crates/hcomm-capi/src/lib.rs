//! The C API of hcomm: `libhcomm.so`, `libhcomm.a` and `<hcomm/hcomm.h>`.
//!
//! Every `extern "C"` function runs its body in [`error::guard`]: errors become the codes of
//! `<hcomm/hcomm.h>` (and the thread's last error), panics become `HCOMM_ERR_INTERNAL`, and
//! every argument is checked before use. Communicators and requests are handles looked up in
//! the tables of [`state`], so a stale handle is an error, not a dangling pointer.
//!
//! The header is generated from these sources by cbindgen (`cbindgen.toml`) and checked in;
//! `tests/header.rs` fails when it drifts.

#![allow(non_camel_case_types)]

// Declaration order is the order of the header (rustfmt keeps separate groups apart).
pub mod error;

pub mod types;

pub mod comm;

pub mod memory;

pub mod p2p;

pub mod coll;

pub mod group;

pub mod ft;

pub mod transport;

mod args;
mod state;
