//! The C types, handles and constants of `<hcomm/hcomm.h>`.
//!
//! Handles are opaque pointers that hold a number, never an address: the library looks every
//! handle up in its tables, so a destroyed, forged or stale handle is an error code, not a
//! dangling pointer.

use std::ffi::c_int;

/// Opaque communicator; only `hcommComm_t` handles are used.
pub struct hcommComm {
    _opaque: [u8; 0],
}

/// Opaque nonblocking operation; only `hcommRequest_t` handles are used.
pub struct hcommRequest {
    _opaque: [u8; 0],
}

/// A communicator: `COMM_WORLD` or one made by `hcommCommSplit`.
pub type hcommComm_t = *mut hcommComm;

/// A nonblocking operation started by `hcommIsend` or `hcommIrecv`, until `hcommWait` or a
/// successful `hcommTest` completes it (and sets it to `HCOMM_REQUEST_NULL`).
pub type hcommRequest_t = *mut hcommRequest;

/// The world communicator: every rank of the job. Valid from `hcommInit` to `hcommFinalize`.
pub const COMM_WORLD: hcommComm_t = 1 as hcommComm_t;

/// No communicator: what `hcommCommSplit` gives a rank with a negative color.
pub const HCOMM_COMM_NULL: hcommComm_t = 0 as hcommComm_t;

/// No request: what `hcommWait` and `hcommTest` leave behind once an operation completed.
pub const HCOMM_REQUEST_NULL: hcommRequest_t = 0 as hcommRequest_t;

/// The element type of a collective's buffers.
#[repr(C)]
pub enum hcommDataType_t {
    /// Signed 8-bit integer.
    HCOMM_INT8 = 0,
    /// Unsigned 8-bit integer.
    HCOMM_UINT8 = 1,
    /// Signed 32-bit integer.
    HCOMM_INT32 = 2,
    /// Unsigned 32-bit integer.
    HCOMM_UINT32 = 3,
    /// Signed 64-bit integer.
    HCOMM_INT64 = 4,
    /// Unsigned 64-bit integer.
    HCOMM_UINT64 = 5,
    /// IEEE 754 binary16 (2 bytes; computed in float32, rounded to nearest even).
    HCOMM_FLOAT16 = 6,
    /// bfloat16: the upper 2 bytes of a float32 (computed in float32, rounded to nearest even).
    HCOMM_BFLOAT16 = 7,
    /// IEEE 754 binary32 (`float`).
    HCOMM_FLOAT32 = 8,
    /// IEEE 754 binary64 (`double`).
    HCOMM_FLOAT64 = 9,
    /// Truth values, 1 byte each (`bool`): 0 is false, any other byte true; results are
    /// always 0 or 1. `HCOMM_SUM` and `HCOMM_MAX` are logical or, `HCOMM_PROD` and
    /// `HCOMM_MIN` logical and; `HCOMM_AVG` is refused.
    HCOMM_BOOL = 10,
    /// Signed 16-bit integer.
    HCOMM_INT16 = 11,
    /// Unsigned 16-bit integer.
    HCOMM_UINT16 = 12,
}

/// The reduction of `hcommAllReduce`, `hcommReduce` and `hcommReduceScatter`.
#[repr(C)]
pub enum hcommReduceOp_t {
    /// Sum (integers wrap around).
    HCOMM_SUM = 0,
    /// Product (integers wrap around).
    HCOMM_PROD = 1,
    /// Maximum (NaN if any operand is NaN).
    HCOMM_MAX = 2,
    /// Minimum (NaN if any operand is NaN).
    HCOMM_MIN = 3,
    /// Average: the sum divided by the number of ranks (integers: truncated toward zero; not
    /// on `HCOMM_BOOL`).
    HCOMM_AVG = 4,
    /// Bitwise and (integers; logical and on `HCOMM_BOOL`; refused on floats).
    HCOMM_BAND = 5,
    /// Bitwise or (integers; logical or on `HCOMM_BOOL`; refused on floats).
    HCOMM_BOR = 6,
    /// Bitwise exclusive or (integers; logical on `HCOMM_BOOL`; refused on floats).
    HCOMM_BXOR = 7,
}

/// How the functions receive an `hcommDataType_t`: as the integer the caller passed, so that a
/// value outside the enum is an error code, not undefined behaviour.
///
/// cbindgen:no-export
pub type DataTypeArg = c_int;

/// How the functions receive an `hcommReduceOp_t` (see [`DataTypeArg`]).
///
/// cbindgen:no-export
pub type ReduceOpArg = c_int;

/// The handle of the communicator with table key `key`.
pub(crate) fn comm_handle(key: usize) -> hcommComm_t {
    std::ptr::without_provenance_mut(key)
}

/// The handle of the request with table key `key`.
pub(crate) fn request_handle(key: usize) -> hcommRequest_t {
    std::ptr::without_provenance_mut(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcomm_core::{DataType, ReduceOp};

    #[test]
    fn c_enums_are_the_rust_discriminants() {
        use hcommDataType_t::*;
        use hcommReduceOp_t::*;
        let types = [
            HCOMM_INT8,
            HCOMM_UINT8,
            HCOMM_INT32,
            HCOMM_UINT32,
            HCOMM_INT64,
            HCOMM_UINT64,
            HCOMM_FLOAT16,
            HCOMM_BFLOAT16,
            HCOMM_FLOAT32,
            HCOMM_FLOAT64,
            HCOMM_BOOL,
            HCOMM_INT16,
            HCOMM_UINT16,
        ];
        assert_eq!(types.len(), DataType::ALL.len());
        for (c, rust) in types.into_iter().zip(DataType::ALL) {
            assert_eq!(c as c_int, rust as c_int);
        }
        let ops = [
            HCOMM_SUM, HCOMM_PROD, HCOMM_MAX, HCOMM_MIN, HCOMM_AVG, HCOMM_BAND, HCOMM_BOR,
            HCOMM_BXOR,
        ];
        assert_eq!(ops.len(), ReduceOp::ALL.len());
        for (c, rust) in ops.into_iter().zip(ReduceOp::ALL) {
            assert_eq!(c as c_int, rust as c_int);
        }
        assert_eq!(COMM_WORLD.addr(), 1);
        assert!(HCOMM_COMM_NULL.is_null() && HCOMM_REQUEST_NULL.is_null());
    }
}
