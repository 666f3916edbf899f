//! Memory from the shared-memory pool: the Rust form of `hcommMalloc`/`hcommFree`.

use std::marker::PhantomData;

use super::Communicator;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::transport::shm::pool::{PoolMem, PoolStats};

/// `count` elements of `T`, 64-byte aligned, from this rank's shared-memory pool when it has
/// room (a hit) and from the heap otherwise (a miss). The local peers can read pool memory in
/// place, so collectives on it need no staging copy; heap memory works everywhere too, through
/// cross-memory attach or copies. Zero-initialised; freed when dropped. For element types
/// with every bit pattern valid (not `bool`: use `u8` for truth values there).
pub struct PoolBuf<T: Element + bytemuck::Pod> {
    mem: PoolMem,
    count: usize,
    _elem: PhantomData<T>,
}

impl<T: Element + bytemuck::Pod> PoolBuf<T> {
    /// Whether the memory came from the shared-memory pool.
    pub fn in_pool(&self) -> bool {
        self.mem.in_pool()
    }
}

impl<T: Element + bytemuck::Pod> std::ops::Deref for PoolBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // The memory is 64-byte aligned and holds `count` elements (see `alloc`).
        bytemuck::cast_slice(&self.mem.as_bytes()[..self.count * size_of::<T>()])
    }
}

impl<T: Element + bytemuck::Pod> std::ops::DerefMut for PoolBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let bytes = self.count * size_of::<T>();
        bytemuck::cast_slice_mut(&mut self.mem.as_bytes_mut()[..bytes])
    }
}

impl Communicator {
    /// `count` zeroed elements of `T`, 64-byte aligned, from the shared-memory pool (or the
    /// heap when the pool cannot serve them: the pool's blocks would pass `HCOMM_POOL_MAX`,
    /// `/dev/shm` is full, or no pool). Sizes beyond `HCOMM_POOL_BLOCK` get a pool block of
    /// their own, whose memory goes back to the system when freed. See [`PoolBuf`].
    pub fn alloc<T: Element + bytemuck::Pod>(&self, count: usize) -> Result<PoolBuf<T>> {
        let bytes = count.checked_mul(size_of::<T>()).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{count} elements of {} bytes: more bytes than can be allocated",
                size_of::<T>()
            ))
        })?;
        Ok(PoolBuf {
            mem: PoolMem::alloc(self.world.pool.as_ref(), bytes)?,
            count,
            _elem: PhantomData,
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
