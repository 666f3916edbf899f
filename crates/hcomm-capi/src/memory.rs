//! `hcommMalloc` and `hcommFree`: 64-byte aligned memory, and a record of every live block so
//! that freeing anything else is refused instead of corrupting the heap.
//!
//! [`obtain`] is the only place that gets memory: between `hcommInit` and `hcommFinalize`
//! from this rank's shared-memory pool, whose blocks the local peers read in place;
//! otherwise, and when the pool cannot serve a size, from the heap. A block goes back where it
//! came from when it is freed (pool memory stays valid after `hcommFinalize` until then).

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use hcomm_core::{Error, PoolBuf, Result};

use crate::error::{guard_value, record};
use crate::types::COMM_WORLD;

/// Alignment of every block (a cache line; what DMA engines and vector loads like).
pub const HCOMM_MALLOC_ALIGNMENT: usize = 64;

/// Where a live block came from.
enum Block {
    /// The heap, with this layout.
    Heap(Layout),
    /// The shared-memory pool (or the heap, through the pool's own fallback); freed on drop.
    Pool(PoolBuf<u8>),
}

/// Every live block, by address.
static LIVE: Mutex<Option<HashMap<usize, Block>>> = Mutex::new(None);

fn live() -> MutexGuard<'static, Option<HashMap<usize, Block>>> {
    // Every update is one insert or remove: a panic elsewhere cannot leave it half-done.
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Gets `bytes` bytes (at least one) aligned to [`HCOMM_MALLOC_ALIGNMENT`]: from the pool of
/// the running world, else from the heap.
fn obtain(bytes: usize) -> Result<(NonNull<u8>, Block)> {
    if let Ok(world) = crate::state::comm(COMM_WORLD) {
        let mut buf = world.alloc::<u8>(bytes.max(1))?;
        let p = NonNull::new(buf.as_mut_ptr())
            .ok_or_else(|| Error::internal("the pool returned a null pointer"))?;
        return Ok((p, Block::Pool(buf)));
    }
    let (p, layout) = heap(bytes)?;
    Ok((p, Block::Heap(layout)))
}

/// `bytes` bytes (at least one) of heap memory aligned to [`HCOMM_MALLOC_ALIGNMENT`].
fn heap(bytes: usize) -> Result<(NonNull<u8>, Layout)> {
    let layout = Layout::from_size_align(bytes.max(1), HCOMM_MALLOC_ALIGNMENT).map_err(|_| {
        Error::invalid_argument(format!(
            "{bytes} bytes cannot be allocated: the size is larger than the address space allows"
        ))
    })?;
    // SAFETY: the layout's size is not zero.
    let p = unsafe { std::alloc::alloc(layout) };
    NonNull::new(p).map(|p| (p, layout)).ok_or_else(|| {
        Error::no_mem(format!(
            "the system refused {bytes} bytes: free memory or use smaller buffers"
        ))
    })
}

/// Gives back a block from [`obtain`].
///
/// # Safety
/// `p` and `block` must be a pair [`obtain`] returned, not released yet.
unsafe fn release(p: NonNull<u8>, block: Block) {
    match block {
        // SAFETY: forwarded from the caller: `p` was allocated with `layout` and is live.
        Block::Heap(layout) => unsafe { std::alloc::dealloc(p.as_ptr(), layout) },
        Block::Pool(buf) => drop(buf),
    }
}

/// Allocates `bytes` bytes aligned to 64 bytes, for buffers of any hcomm call (memory from
/// `malloc` works too). Returns NULL when the memory cannot be had (`hcommGetLastError` says
/// why: `HCOMM_ERR_NO_MEM`, or `HCOMM_ERR_INVALID_ARGUMENT` for a size beyond the address
/// space). May be called before `hcommInit` and after `hcommFinalize`. `hcommMalloc(0)` returns
/// a unique non-NULL pointer that must not be read or written, and must be freed like any other.
#[no_mangle]
pub extern "C" fn hcommMalloc(bytes: usize) -> *mut c_void {
    guard_value("hcommMalloc", std::ptr::null_mut(), || {
        let (p, block) = obtain(bytes)?;
        live()
            .get_or_insert_with(HashMap::new)
            .insert(p.as_ptr().addr(), block);
        Ok(p.as_ptr().cast())
    })
}

/// Frees memory from `hcommMalloc`. `NULL` is ignored. A pointer that `hcommMalloc` did not
/// return, or that was already freed, is not touched: hcomm prints a warning to stderr and
/// records `HCOMM_ERR_INVALID_ARGUMENT` as this thread's last error (`hcommGetLastError`).
///
/// # Safety
/// `ptr` is NULL or any pointer; memory from `hcommMalloc` must not be used after it is freed.
#[no_mangle]
pub unsafe extern "C" fn hcommFree(ptr: *mut c_void) {
    guard_value("hcommFree", (), || {
        if ptr.is_null() {
            return Ok(());
        }
        let block = live().as_mut().and_then(|m| m.remove(&ptr.addr()));
        match (NonNull::new(ptr.cast::<u8>()), block) {
            (Some(p), Some(block)) => {
                // SAFETY: the table held this address with its block, so it came from
                // `obtain` and was not released (it is removed from the table before this).
                unsafe { release(p, block) };
                Ok(())
            }
            _ => {
                let e = Error::invalid_argument(format!(
                    "{ptr:p} was not returned by hcommMalloc or was already freed: it was left \
                     alone (free malloc'd memory with free)"
                ));
                record("hcommFree", &e);
                // hcommFree returns nothing: stderr is the only place the program's author
                // will see this bug.
                eprintln!("hcomm: hcommFree: {e}");
                Ok(())
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{hcommGetLastError, HCOMM_ERR_INVALID_ARGUMENT, HCOMM_SUCCESS};

    #[test]
    fn blocks_are_aligned_and_freed_once() {
        for bytes in [0, 1, 63, 64, 65, 4096, 1 << 20] {
            let p = hcommMalloc(bytes);
            assert!(!p.is_null());
            assert_eq!(p.addr() % HCOMM_MALLOC_ALIGNMENT, 0);
            // SAFETY: the block holds `bytes` bytes and is freed once.
            unsafe {
                std::ptr::write_bytes(p.cast::<u8>(), 0xab, bytes);
                hcommFree(p);
            }
        }
        let p = hcommMalloc(16);
        let mut local = 0u64;
        // SAFETY: hcommFree accepts any pointer; only the first free releases the block.
        unsafe {
            hcommFree(p);
            hcommFree(p);
            assert_eq!(hcommGetLastError(), HCOMM_ERR_INVALID_ARGUMENT);
            hcommFree((&raw mut local).cast());
            assert_eq!(hcommGetLastError(), HCOMM_ERR_INVALID_ARGUMENT);
            hcommFree(std::ptr::null_mut());
        }
        assert_eq!(local, 0);
    }

    #[test]
    fn impossible_sizes_give_null() {
        assert!(hcommMalloc(usize::MAX).is_null());
        assert_eq!(hcommGetLastError(), HCOMM_ERR_INVALID_ARGUMENT);
        assert!(hcommMalloc(isize::MAX as usize - 10).is_null());
        assert_ne!(hcommGetLastError(), HCOMM_SUCCESS);
    }
}
