//! Memory of the shared-memory pool as a Python buffer (`hcomm.empty`, `hcomm.zeros`).

use std::ffi::c_int;

use hcomm::PoolBuf;
use pyo3::ffi;
use pyo3::prelude::*;

/// Bytes from a rank's shared-memory pool (or the heap when the pool cannot serve them),
/// exported through the buffer protocol and freed when the last array on them goes.
#[pyclass(frozen, module = "hcomm._hcomm")]
pub struct PoolMemory {
    ptr: *mut u8,
    len: usize,
    in_pool: bool,
    _mem: PoolBuf<u8>,
}

// SAFETY: `ptr` is the memory `_mem` owns exclusively (a PoolBuf is Send + Sync); Python
// code reaches it only through buffer views, like any bytearray's.
unsafe impl Send for PoolMemory {}
// SAFETY: as for Send.
unsafe impl Sync for PoolMemory {}

impl PoolMemory {
    /// Wraps `mem`.
    pub fn new(mut mem: PoolBuf<u8>) -> PoolMemory {
        PoolMemory {
            ptr: mem.as_mut_ptr(),
            len: mem.len(),
            in_pool: mem.in_pool(),
            _mem: mem,
        }
    }
}

#[pymethods]
impl PoolMemory {
    /// Whether the bytes came from the shared-memory pool (not the heap).
    #[getter]
    fn in_pool(&self) -> bool {
        self.in_pool
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// # Safety
    /// `view` is the buffer view Python passes to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (ptr, len) = (slf.get().ptr, slf.get().len);
        let len = isize::try_from(len)
            .map_err(|_| pyo3::exceptions::PyBufferError::new_err("buffer too large"))?;
        // SAFETY: `view` is valid to fill; `ptr` holds `len` writable bytes for as long as
        // the view holds its reference to `slf`, which PyBuffer_FillInfo takes.
        let rc = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr.cast(), len, 0, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
