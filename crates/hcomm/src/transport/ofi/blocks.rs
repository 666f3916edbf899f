//! Registrations of whole shared-memory pool blocks ([`crate::transport::shm::pool`]), made
//! when a block's memory is backed and closed when it goes: a transfer from or to pool memory
//! finds its region here by address, with no registration of its own.
//!
//! The registry only files regions; the endpoint makes and closes them (the caller holds
//! both under the engine's lock).

use std::collections::BTreeMap;
use std::ffi::c_void;

use super::Region;

/// One block's registration.
#[derive(Debug)]
struct Entry {
    block: usize,
    len: usize,
    region: Region,
}

/// The registered pool blocks, by the address of their first byte.
#[derive(Debug, Default)]
pub(crate) struct BlockRegs {
    by_start: BTreeMap<usize, Entry>,
}

/// What an operation on registered bytes passes: the address a peer names them with, the
/// region's key, and the descriptor of local operations.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found {
    /// The address peers name the first of the bytes with.
    pub remote: u64,
    /// The region's key.
    pub key: u64,
    /// The descriptor of local operations (`FI_MR_LOCAL`), else null.
    pub desc: *mut c_void,
}

impl BlockRegs {
    /// Files `region`, the registration of block `block`'s `len` bytes at `base`.
    pub(crate) fn insert(&mut self, block: usize, base: *const u8, len: usize, region: Region) {
        self.by_start
            .insert(base as usize, Entry { block, len, region });
    }

    /// Takes block `block`'s registration out, to close it.
    pub(crate) fn remove(&mut self, block: usize) -> Option<Region> {
        let start = self
            .by_start
            .iter()
            .find(|(_, e)| e.block == block)
            .map(|(s, _)| *s)?;
        self.by_start.remove(&start).map(|e| e.region)
    }

    /// Takes every registration out, to close them.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Region> + '_ {
        std::mem::take(&mut self.by_start)
            .into_values()
            .map(|e| e.region)
    }

    /// The registration that covers the `len` bytes at `ptr` whole, if a block's does.
    pub(crate) fn find(&self, ptr: *const u8, len: usize) -> Option<Found> {
        let addr = ptr as usize;
        let (&start, e) = self.by_start.range(..=addr).next_back()?;
        let offset = addr - start;
        if offset >= e.len || offset.checked_add(len)? > e.len {
            return None;
        }
        // With virtual addressing `remote_base` is the block's address, else 0 (offsets into
        // the region): either way the bytes are `offset` past it.
        Some(Found {
            remote: e.region.remote_base + offset as u64,
            key: e.region.key,
            desc: e.region.desc,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(key: u64, base: u64) -> Region {
        Region {
            mr: std::ptr::null_mut(),
            key,
            desc: std::ptr::null_mut(),
            remote_base: base,
        }
    }

    #[test]
    fn bytes_are_found_inside_a_block_only() {
        let mut regs = BlockRegs::default();
        let a = 0x10_0000 as *const u8;
        let b = 0x40_0000 as *const u8;
        regs.insert(0, a, 0x1000, region(7, a as u64));
        regs.insert(3, b, 0x2000, region(9, 0));
        let f = regs.find(a.wrapping_add(0x10), 0x20).unwrap();
        assert_eq!((f.remote, f.key), (a as u64 + 0x10, 7));
        // Offset addressing: the remote address is the offset into the region.
        let f = regs.find(b.wrapping_add(0x1000), 0x1000).unwrap();
        assert_eq!((f.remote, f.key), (0x1000, 9));
        assert!(
            regs.find(a.wrapping_add(0xff0), 0x20).is_none(),
            "past the end"
        );
        assert!(
            regs.find(a.wrapping_sub(1), 1).is_none(),
            "before the first"
        );
        assert!(
            regs.find(b.wrapping_add(0x2000), 0).is_none(),
            "just past the end"
        );
        assert_eq!(regs.remove(3).map(|r| r.key), Some(9));
        assert!(regs.find(b, 1).is_none());
        assert!(regs.remove(3).is_none());
        assert_eq!(regs.drain().count(), 1);
        assert!(regs.find(a, 1).is_none());
    }
}
