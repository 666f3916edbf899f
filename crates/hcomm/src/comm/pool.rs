//! Memory from the shared-memory pool: the Rust form of `hcommMalloc`/`hcommFree`.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::Arc;

use super::Communicator;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::transport::shm::pool::{PoolStats, ShmPool, POOL_ALIGN};

/// `count` elements of `T`, 64-byte aligned, from this rank's shared-memory pool when it has
/// room (a hit) and from the heap otherwise (a miss). The local peers can read pool memory in
/// place, so collectives on it need no staging copy; heap memory works everywhere too, through
/// cross-memory attach or copies. Zero-initialised; freed when dropped. For element types
/// with every bit pattern valid (not `bool`: use `u8` for truth values there).
pub struct PoolBuf<T: Element + bytemuck::Pod> {
    ptr: NonNull<T>,
    count: usize,
    /// The pool it came from; `None` for heap memory.
    pool: Option<Arc<ShmPool>>,
}

// SAFETY: the buffer owns its memory exclusively (like a Box<[T]>), and T is Send + Sync.
unsafe impl<T: Element + bytemuck::Pod> Send for PoolBuf<T> {}
// SAFETY: as for Send: shared access gives out only `&[T]`.
unsafe impl<T: Element + bytemuck::Pod> Sync for PoolBuf<T> {}

impl<T: Element + bytemuck::Pod> PoolBuf<T> {
    /// Whether the memory came from the shared-memory pool.
    pub fn in_pool(&self) -> bool {
        self.pool.is_some()
    }

    fn layout(count: usize) -> Result<Layout> {
        count
            .checked_mul(size_of::<T>())
            .and_then(|bytes| Layout::from_size_align(bytes.max(1), POOL_ALIGN).ok())
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{count} elements of {} bytes: more bytes than can be allocated",
                    size_of::<T>()
                ))
            })
    }
}

impl<T: Element + bytemuck::Pod> std::ops::Deref for PoolBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `count` initialised elements (zeroed at allocation; every bit
        // pattern is a valid Pod) owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.count) }
    }
}

impl<T: Element + bytemuck::Pod> std::ops::DerefMut for PoolBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.count) }
    }
}

impl<T: Element + bytemuck::Pod> Drop for PoolBuf<T> {
    fn drop(&mut self) {
        match &self.pool {
            Some(pool) => {
                if let Err(e) = pool.free(self.ptr.as_ptr().cast()) {
                    tracing::error!("freeing pool memory: {e}");
                }
            }
            None => {
                if let Ok(layout) = Self::layout(self.count) {
                    // SAFETY: allocated in `Communicator::alloc` with this very layout.
                    unsafe { alloc::dealloc(self.ptr.as_ptr().cast(), layout) };
                }
            }
        }
    }
}

impl Communicator {
    /// `count` zeroed elements of `T`, 64-byte aligned, from the shared-memory pool (or the
    /// heap when the pool cannot serve them: larger than `HCOMM_POOL_BLOCK`, the pool full at
    /// `HCOMM_POOL_MAX`, or no pool). See [`PoolBuf`].
    pub fn alloc<T: Element + bytemuck::Pod>(&self, count: usize) -> Result<PoolBuf<T>> {
        let layout = PoolBuf::<T>::layout(count)?;
        let pool = self.world.pool.as_ref();
        if let Some(got) = pool.and_then(|p| p.alloc(layout.size())) {
            // SAFETY: the allocation holds `layout.size()` writable bytes, 64-byte aligned.
            unsafe { got.as_ptr().write_bytes(0, layout.size()) };
            return Ok(PoolBuf {
                ptr: NonNull::new(got.as_ptr().cast())
                    .ok_or_else(|| Error::internal("the pool returned a null pointer"))?,
                count,
                pool: pool.cloned(),
            });
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw.cast())
            .ok_or_else(|| Error::no_mem(format!("cannot allocate {} bytes", layout.size())))?;
        Ok(PoolBuf {
            ptr,
            count,
            pool: None,
        })
    }

    /// Counters of this rank's shared-memory pool (all zero without a pool).
    pub fn pool_stats(&self) -> PoolStats {
        self.world
            .pool
            .as_ref()
            .map(|p| p.stats())
            .unwrap_or_default()
    }
}
