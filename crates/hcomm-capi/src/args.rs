//! Checks of the arguments C callers pass: pointers, sizes, ranks, tags, types and operations.
//! Each failure is an [`Error::InvalidArgument`] naming the argument and the valid range.

use std::ffi::{c_int, c_void};

use hcomm_core::{DataType, Error, ReduceOp, Result};

use crate::types::{DataTypeArg, ReduceOpArg};

/// Largest size of one buffer: Rust slices end at `isize::MAX`.
const MAX_BYTES: usize = isize::MAX as usize;

/// The element type `value` names.
pub(crate) fn data_type(value: DataTypeArg) -> Result<DataType> {
    u8::try_from(value)
        .ok()
        .and_then(DataType::from_u8)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "dtype {value} is not an hcommDataType_t: use HCOMM_INT8 .. HCOMM_UINT16 (0 .. {})",
                DataType::ALL.len() - 1
            ))
        })
}

/// The reduction `value` names.
pub(crate) fn reduce_op(value: ReduceOpArg) -> Result<ReduceOp> {
    u8::try_from(value)
        .ok()
        .and_then(ReduceOp::from_u8)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "op {value} is not an hcommReduceOp_t: use HCOMM_SUM, HCOMM_PROD, HCOMM_MAX, \
                 HCOMM_MIN, HCOMM_AVG, HCOMM_BAND, HCOMM_BOR or HCOMM_BXOR (0 .. {})",
                ReduceOp::ALL.len() - 1
            ))
        })
}

/// A rank (`what`: destination, source, root) of a communicator of `size` ranks.
pub(crate) fn rank(value: c_int, size: usize, what: &str) -> Result<usize> {
    usize::try_from(value)
        .ok()
        .filter(|&r| r < size)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "{what} {value} is not a rank of this communicator: use 0 .. {}",
                size - 1
            ))
        })
}

/// A message tag: any non-negative `int`.
pub(crate) fn tag(value: c_int) -> Result<u32> {
    u32::try_from(value).map_err(|_| {
        Error::invalid_argument(format!(
            "tag {value} is negative: tags are 0 .. {}",
            c_int::MAX
        ))
    })
}

/// `count` elements of `dtype`, times `blocks`, in bytes: an error when that overflows or
/// exceeds what one buffer can hold.
pub(crate) fn byte_size(count: usize, dtype: DataType, blocks: usize, what: &str) -> Result<usize> {
    count
        .checked_mul(dtype.size())
        .and_then(|b| b.checked_mul(blocks))
        .filter(|&b| b <= MAX_BYTES)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "{what} {count} of {dtype} is too large: the buffer of {blocks} x {count} \
                 elements would not fit in the address space"
            ))
        })
}

/// Checks that `len` bytes at `ptr` can form a buffer: not NULL when `len > 0`, within the
/// address space.
pub(crate) fn buffer(ptr: *const c_void, len: usize, what: &str) -> Result<()> {
    if len > MAX_BYTES || ptr.addr().checked_add(len).is_none() {
        return Err(Error::invalid_argument(format!(
            "{what} of {len} bytes at {ptr:p} does not fit in the address space"
        )));
    }
    if ptr.is_null() && len > 0 {
        return Err(Error::invalid_argument(format!(
            "{what} is NULL but the call needs {len} bytes there"
        )));
    }
    Ok(())
}

/// The caller's `len` bytes at `ptr` for reading.
///
/// # Safety
/// Unless `ptr` is NULL or `len` is 0, `ptr..ptr+len` must be readable and not written by
/// anyone during `'a`.
pub(crate) unsafe fn bytes<'a>(ptr: *const c_void, len: usize, what: &str) -> Result<&'a [u8]> {
    buffer(ptr, len, what)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: not NULL, within the address space (checked), readable (the caller's promise).
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast(), len) })
}

/// The caller's `len` bytes at `ptr` for writing.
///
/// # Safety
/// Unless `ptr` is NULL or `len` is 0, `ptr..ptr+len` must be writable and not accessed by
/// anyone else during `'a`.
pub(crate) unsafe fn bytes_mut<'a>(
    ptr: *mut c_void,
    len: usize,
    what: &str,
) -> Result<&'a mut [u8]> {
    buffer(ptr, len, what)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: not NULL, within the address space (checked), writable and unaliased (the
    // caller's promise).
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast(), len) })
}

/// A copy of the caller's array of `n` sizes at `ptr` (counts and displacements).
///
/// # Safety
/// Unless `ptr` is NULL, `ptr..ptr+n` must be readable `size_t` values.
pub(crate) unsafe fn sizes(ptr: *const usize, n: usize, what: &str) -> Result<Vec<usize>> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!(
            "{what} is NULL: pass an array of {n} counts (one per rank)"
        )));
    }
    if !ptr.is_aligned() {
        return Err(Error::invalid_argument(format!(
            "{what} at {ptr:p} is not aligned for size_t"
        )));
    }
    let bytes = n.saturating_mul(size_of::<usize>());
    buffer(ptr.cast(), bytes, what)?;
    // SAFETY: not NULL, aligned, within the address space (checked), readable (the caller's
    // promise).
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) }.to_vec())
}

/// A copy of the caller's array of `n` ints at `ptr` (ranks).
///
/// # Safety
/// Unless `ptr` is NULL, `ptr..ptr+n` must be readable `int` values.
pub(crate) unsafe fn ints(ptr: *const c_int, n: usize, what: &str) -> Result<Vec<c_int>> {
    if ptr.is_null() || !ptr.is_aligned() {
        return Err(Error::invalid_argument(format!(
            "{what} at {ptr:p} is NULL or not aligned for int: pass an array of {n} ranks"
        )));
    }
    buffer(ptr.cast(), n.saturating_mul(size_of::<c_int>()), what)?;
    // SAFETY: not NULL, aligned, within the address space (checked), readable (the caller's
    // promise).
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) }.to_vec())
}

/// Checks an output pointer.
pub(crate) fn out<T>(ptr: *mut T, what: &str) -> Result<()> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!(
            "{what} is NULL: pass the address of a variable to receive the result"
        )));
    }
    Ok(())
}

/// A zero-filled buffer of `len` bytes; `HCOMM_ERR_NO_MEM` instead of an abort when the memory
/// is not there.
pub(crate) fn staging(len: usize, what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Error::no_mem(format!(
            "{what}: no memory for a {len}-byte staging buffer: use smaller messages"
        ))
    })?;
    v.resize(len, 0);
    Ok(v)
}

/// A copy of `data`; `HCOMM_ERR_NO_MEM` instead of an abort when the memory is not there.
pub(crate) fn copy_of(data: &[u8], what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(data.len()).map_err(|_| {
        Error::no_mem(format!(
            "{what}: no memory to copy {} bytes: use smaller messages",
            data.len()
        ))
    })?;
    v.extend_from_slice(data);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_refused() {
        assert!(data_type(-1).is_err());
        assert!(data_type(13).is_err());
        assert_eq!(data_type(10).unwrap(), DataType::Bool);
        assert_eq!(data_type(8).unwrap(), DataType::Float32);
        assert!(reduce_op(8).is_err());
        assert_eq!(reduce_op(7).unwrap(), ReduceOp::BXor);
        assert!(reduce_op(c_int::MIN).is_err());
        assert_eq!(reduce_op(4).unwrap(), ReduceOp::Avg);
        assert!(rank(-1, 4, "root").is_err());
        assert!(rank(4, 4, "root").is_err());
        assert_eq!(rank(3, 4, "root").unwrap(), 3);
        assert!(tag(-5).is_err());
        assert_eq!(tag(c_int::MAX).unwrap(), c_int::MAX as u32);
        assert!(byte_size(usize::MAX / 4, DataType::Float64, 1, "count").is_err());
        assert!(byte_size(usize::MAX / 16, DataType::Int8, 32, "count").is_err());
        assert_eq!(byte_size(3, DataType::Float16, 5, "count").unwrap(), 30);
        assert!(buffer(std::ptr::null(), 1, "buf").is_err());
        assert!(buffer(std::ptr::null(), 0, "buf").is_ok());
        assert!(buffer(std::ptr::without_provenance(usize::MAX - 4), 8, "buf").is_err());
        assert!(out(std::ptr::null_mut::<c_int>(), "rank").is_err());
    }
}
