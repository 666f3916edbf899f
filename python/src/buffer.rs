//! Python objects as memory: the buffer protocol, `__dlpack__` and numpy's
//! `__array_interface__` (numpy cannot export ml_dtypes' bfloat16 through the buffer
//! protocol), without copies. Plain torch CPU tensors are read directly (their address,
//! length and type through the tensor's own C methods): asking them for the buffer protocol
//! first fails with an exception, and `__dlpack__` is Python code, which together cost
//! several microseconds a call.

use std::ffi::{c_void, CStr};

use hcomm::Lease;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyDict, PyTuple, PyType};

use crate::dtype::Dtype;
use crate::errors::invalid;

/// The `DLDevice` of a DLPack tensor.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// The `DLDataType` of a DLPack tensor.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// The `DLTensor` of DLPack 0.x and 1.x.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// `kDLCPU`.
const DL_CPU: i32 = 1;
/// `kDLCUDAHost`: pinned host memory, addressable by the CPU.
const DL_CUDA_HOST: i32 = 3;
/// The capsule name of an unconsumed legacy DLPack tensor.
const DLTENSOR: &CStr = c"dltensor";

/// What keeps the memory of a [`Buffer`] alive: a buffer-protocol view (released when
/// dropped), or the object itself (its `__array_interface__` memory) or the DLPack capsule,
/// whose destructor calls the tensor's deleter.
type Owner = (Option<PyUntypedBuffer>, Option<Py<PyAny>>);

/// A contiguous piece of memory of a Python object, with its element type.
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
    /// The element type; `None` for formats hcomm has no type for (bytes only).
    pub dtype: Option<Dtype>,
    /// Bytes of one element (1 for untyped bytes).
    pub itemsize: usize,
    pub readonly: bool,
    _owner: Owner,
}

// SAFETY: the pointer is memory owned by the Python object that `_owner` keeps alive; moving
// the handle to another thread moves no data. PyO3 releases the buffer view with the
// interpreter attached.
unsafe impl Send for Buffer {}
// SAFETY: shared access gives out only the address and the length.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// The memory of `obj`, which must be contiguous. `what` names the argument in errors.
    pub fn get(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Buffer> {
        if let Some(b) = Buffer::from_torch(obj) {
            return Ok(b);
        }
        match PyUntypedBuffer::get(obj) {
            Ok(view) => return Buffer::from_view(view, what),
            Err(e) => {
                if TORCH_TENSOR.get(obj.py()).is_none() && note_torch(obj.py()) {
                    if let Some(b) = Buffer::from_torch(obj) {
                        return Ok(b);
                    }
                }
                let has = |name: &str| obj.hasattr(name).unwrap_or(false);
                // numpy arrays of ml_dtypes' types offer neither the buffer protocol nor
                // DLPack, but their __array_interface__.
                if has("__array_interface__") {
                    return Buffer::from_array_interface(obj, what);
                }
                if has("__dlpack__") {
                    return Buffer::from_dlpack(obj, what);
                }
                if !e.is_instance_of::<pyo3::exceptions::PyTypeError>(obj.py()) {
                    return Err(invalid(format!("{what}: {e}")));
                }
            }
        }
        Err(invalid(format!(
            "{what}: a {} has neither the buffer protocol nor __dlpack__ (pass a numpy \
             array, bytearray, memoryview or torch CPU tensor)",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        )))
    }

    fn from_view(view: PyUntypedBuffer, what: &str) -> PyResult<Buffer> {
        if !view.is_c_contiguous() && !view.is_fortran_contiguous() {
            return Err(invalid(format!(
                "{what} is not contiguous: pass a contiguous array (numpy.ascontiguousarray)"
            )));
        }
        let itemsize = view.item_size();
        let dtype = Dtype::from_format(view.format().to_bytes(), itemsize).map_err(|f| {
            invalid(format!(
                "{what}: element format {f:?} is not one hcomm knows (bool, int8..uint64, \
                 float16, bfloat16, float32, float64)"
            ))
        })?;
        Ok(Buffer {
            ptr: view.buf_ptr().cast(),
            len: view.len_bytes(),
            dtype,
            itemsize: dtype.map_or(1, Dtype::size),
            readonly: view.readonly(),
            _owner: (Some(view), None),
        })
    }

    /// A torch tensor in CPU memory, contiguous, of a type hcomm knows, neither requiring
    /// gradients nor a lazily negated view; `None` for anything else (torch not imported,
    /// another object, or a tensor the general path accepts or refuses with its error).
    fn from_torch(obj: &Bound<'_, PyAny>) -> Option<Buffer> {
        let py = obj.py();
        let tensor = TORCH_TENSOR.get(py)?;
        if !obj.is_instance(tensor.bind(py)).ok()? {
            return None;
        }
        let flag = |name: &Bound<'_, pyo3::types::PyString>, call: bool| -> Option<bool> {
            let v = if call {
                obj.call_method0(name)
            } else {
                obj.getattr(name)
            };
            v.and_then(|v| v.is_truthy()).ok()
        };
        let plain = flag(intern!(py, "is_cpu"), false)?
            && !flag(intern!(py, "requires_grad"), false)?
            && flag(intern!(py, "is_contiguous"), true)?
            && !flag(intern!(py, "is_neg"), true)?;
        if !plain {
            return None;
        }
        let name = obj
            .getattr(intern!(py, "dtype"))
            .and_then(|d| d.str())
            .ok()?;
        let dtype = Dtype::from_name(name.to_str().ok()?.strip_prefix("torch.")?)?;
        let addr: usize = obj
            .call_method0(intern!(py, "data_ptr"))
            .and_then(|p| p.extract())
            .ok()?;
        let count: usize = obj
            .call_method0(intern!(py, "numel"))
            .and_then(|n| n.extract())
            .ok()?;
        Some(Buffer {
            ptr: addr as *mut u8,
            len: count.checked_mul(dtype.size())?,
            dtype: Some(dtype),
            itemsize: dtype.size(),
            readonly: false,
            _owner: (None, Some(obj.clone().unbind())),
        })
    }

    fn from_dlpack(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Buffer> {
        let capsule = obj
            .call_method0("__dlpack__")
            .map_err(|e| invalid(format!("{what}: __dlpack__ failed: {e}")))?;
        let capsule = capsule
            .cast_into::<PyCapsule>()
            .map_err(|_| invalid(format!("{what}: __dlpack__ did not return a capsule")))?;
        // SAFETY: the capsule is alive for this call; a "dltensor" capsule points to a
        // DLManagedTensor, whose first member is the DLTensor.
        let t = unsafe {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr());
            if p.is_null() {
                pyo3::ffi::PyErr_Clear();
                return Err(invalid(format!(
                    "{what}: __dlpack__ returned a capsule that is not a \"dltensor\""
                )));
            }
            &*(p as *const DlTensor)
        };
        if t.device.device_type != DL_CPU && t.device.device_type != DL_CUDA_HOST {
            return Err(invalid(format!(
                "{what}: the tensor is not in CPU memory (DLPack device type {}): hcomm's \
                 Python API moves host memory",
                t.device.device_type
            )));
        }
        if t.dtype.lanes != 1 {
            return Err(invalid(format!(
                "{what}: vector elements ({} lanes) are not supported",
                t.dtype.lanes
            )));
        }
        let ndim = usize::try_from(t.ndim).unwrap_or(0);
        // SAFETY: DLPack gives `ndim` entries of shape (and of strides when not null).
        let shape = unsafe { slice_or_empty(t.shape, ndim) };
        let count = shape.iter().try_fold(1usize, |n, &d| {
            usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
        });
        let count = count.ok_or_else(|| invalid(format!("{what}: a negative dimension")))?;
        if !t.strides.is_null() {
            // SAFETY: as above.
            let strides = unsafe { slice_or_empty(t.strides, ndim) };
            let mut expect = 1i64;
            for (&d, &s) in shape.iter().zip(strides).rev() {
                if d != 1 && s != expect {
                    return Err(invalid(format!(
                        "{what} is not contiguous: pass a contiguous tensor (.contiguous())"
                    )));
                }
                expect = expect.saturating_mul(d);
            }
        }
        let dtype = Dtype::from_dlpack(t.dtype.code, t.dtype.bits).ok_or_else(|| {
            invalid(format!(
                "{what}: DLPack type (code {}, {} bits) is not one hcomm knows",
                t.dtype.code, t.dtype.bits
            ))
        })?;
        let offset = usize::try_from(t.byte_offset).unwrap_or(0);
        Ok(Buffer {
            ptr: t.data.cast::<u8>().wrapping_add(offset),
            len: count * dtype.size(),
            dtype: Some(dtype),
            itemsize: dtype.size(),
            readonly: false,
            _owner: (None, Some(capsule.into_any().unbind())),
        })
    }

    fn from_array_interface(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Buffer> {
        let bad = |e: PyErr| invalid(format!("{what}: unreadable __array_interface__: {e}"));
        let ai = obj.getattr("__array_interface__").map_err(bad)?;
        let ai = ai.cast_into::<PyDict>().map_err(|e| bad(e.into()))?;
        let item = |k: &str| -> PyResult<Bound<'_, PyAny>> {
            ai.get_item(k)?
                .ok_or_else(|| invalid(format!("{what}: __array_interface__ lacks {k:?}")))
        };
        let data = item("data")?
            .cast_into::<PyTuple>()
            .map_err(|e| bad(e.into()))?;
        let addr: usize = data.get_item(0)?.extract().map_err(bad)?;
        let readonly: bool = data.get_item(1)?.extract().map_err(bad)?;
        let shape: Vec<usize> = item("shape")?.extract().map_err(bad)?;
        if !item("strides")?.is_none() {
            // numpy leaves strides out (None) exactly for C-contiguous arrays.
            return Err(invalid(format!(
                "{what} is not contiguous: pass a contiguous array (numpy.ascontiguousarray)"
            )));
        }
        let name: String = obj
            .getattr("dtype")
            .and_then(|d| d.getattr("name"))
            .and_then(|n| n.extract())
            .map_err(bad)?;
        let dtype = Dtype::from_name(&name)
            .ok_or_else(|| invalid(format!("{what}: dtype {name} is not one hcomm knows")))?;
        let count: usize = shape.iter().product();
        Ok(Buffer {
            ptr: addr as *mut u8,
            len: count * dtype.size(),
            dtype: Some(dtype),
            itemsize: dtype.size(),
            readonly,
            _owner: (None, Some(obj.clone().unbind())),
        })
    }

    /// A writable buffer (an output): read-only memory is refused.
    pub fn get_mut(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Buffer> {
        let b = Buffer::get(obj, what)?;
        if b.readonly {
            return Err(invalid(format!(
                "{what} is read-only: pass a writable buffer"
            )));
        }
        Ok(b)
    }

    /// Elements of the buffer.
    pub fn count(&self) -> usize {
        self.len / self.itemsize
    }

    /// The start address.
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// The memory, for reading.
    ///
    /// # Safety
    /// Nothing may write the memory while the slice is used (Python code on other threads
    /// included: the caller's contract, as for any buffer handed to C).
    pub unsafe fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the owner keeps `len` bytes at `ptr` alive; the caller rules out writers.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The memory, for writing (the buffer must be writable).
    ///
    /// # Safety
    /// Nothing else may access the memory while the slice is used, and no other slice of it
    /// may be alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        debug_assert!(!self.readonly);
        // SAFETY: the owner keeps `len` writable bytes at `ptr` alive; the caller makes the
        // access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The memory, lent to a nonblocking operation of the core.
    ///
    /// # Safety
    /// The buffer must outlive the operation, and the contract of
    /// [`Lease::from_raw_parts`] hold: nothing else writes the memory meanwhile (a
    /// read-only buffer is lent read-only, so the core never writes it).
    pub unsafe fn lend(&self) -> Lease<'static> {
        match self.readonly {
            // SAFETY: forwarded from the caller.
            true => unsafe { Lease::from_raw_parts_const(self.ptr, self.len) },
            // SAFETY: forwarded from the caller.
            false => unsafe { Lease::from_raw_parts(self.ptr, self.len) },
        }
    }

    /// Whether the memory of the two buffers overlaps.
    pub fn overlaps(&self, other: &Buffer) -> bool {
        let (a, b) = (self.addr(), other.addr());
        self.len > 0 && other.len > 0 && a < b + other.len && b < a + self.len
    }

    /// Whether both are exactly the same memory.
    pub fn same_memory(&self, other: &Buffer) -> bool {
        self.addr() == other.addr() && self.len == other.len
    }
}

/// `torch.Tensor`, once torch has been imported (hcomm itself never imports it).
static TORCH_TENSOR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Remembers `torch.Tensor` if torch is imported by now; returns whether it is known.
fn note_torch(py: Python<'_>) -> bool {
    let found = py
        .import(intern!(py, "sys"))
        .and_then(|sys| sys.getattr(intern!(py, "modules")))
        .and_then(|m| m.get_item(intern!(py, "torch")))
        .and_then(|torch| torch.getattr(intern!(py, "Tensor")))
        .and_then(|t| t.cast_into::<PyType>().map_err(PyErr::from));
    match found {
        Ok(t) => {
            let _ = TORCH_TENSOR.set(py, t.unbind());
            true
        }
        Err(_) => false,
    }
}

/// `n` values at `p`, or nothing when `n` is 0.
///
/// # Safety
/// `p` must point to `n` readable values when `n > 0`.
unsafe fn slice_or_empty<'a>(p: *const i64, n: usize) -> &'a [i64] {
    if n == 0 || p.is_null() {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(p, n) }
}
