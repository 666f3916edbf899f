//! `#[repr(C)]` mirrors of the parts of libfabric's 1.x ABI that hcomm calls (checked against
//! the 1.17 headers, `<rdma/fabric.h>` and friends), and the library's five exported functions,
//! found with `dlopen` at run time.
//!
//! Most `fi_*` calls of the API are `static inline` wrappers in the headers that call through
//! tables of function pointers in the objects (`fid_ep::msg->send`, …): they are not symbols of
//! `libfabric.so`. hcomm mirrors those tables here rather than compiling a C shim against the
//! headers, so that building hcomm needs neither libfabric nor its headers, and `libhcomm` loads
//! where libfabric is absent. libfabric keeps these tables ABI-stable within major version 1
//! (new members only at their ends, after the ones mirrored here), and `fi_getinfo` is asked for
//! version 1.17 of the structures.
#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_void};

/// `fi_addr_t`.
pub(crate) type fi_addr_t = u64;

/// `FI_VERSION(1, 17)`.
pub(crate) const API_VERSION: u32 = (1 << 16) | 17;

pub(crate) const FI_MSG: u64 = 1 << 1;
pub(crate) const FI_RMA: u64 = 1 << 2;
pub(crate) const FI_TAGGED: u64 = 1 << 3;
pub(crate) const FI_READ: u64 = 1 << 8;
pub(crate) const FI_WRITE: u64 = 1 << 9;
pub(crate) const FI_RECV: u64 = 1 << 10;
pub(crate) const FI_SEND: u64 = 1 << 11;
pub(crate) const FI_REMOTE_READ: u64 = 1 << 12;
pub(crate) const FI_REMOTE_WRITE: u64 = 1 << 13;
pub(crate) const FI_COMPLETION: u64 = 1 << 24;
pub(crate) const FI_DELIVERY_COMPLETE: u64 = 1 << 28;
pub(crate) const FI_CONTEXT: u64 = 1 << 59;
pub(crate) const FI_CONTEXT2: u64 = 1 << 52;
pub(crate) const FI_ORDER_SAS: u64 = 1 << 8;
pub(crate) const FI_ORDER_SAW: u64 = 1 << 7;
pub(crate) const FI_SOURCE: u64 = 1 << 57;
pub(crate) const FI_ADDR_UNSPEC: u64 = u64::MAX;

pub(crate) const FI_MR_BASIC: c_int = 1;
pub(crate) const FI_MR_SCALABLE: c_int = 2;
pub(crate) const FI_MR_LOCAL: c_int = 1 << 2;
pub(crate) const FI_MR_RAW: c_int = 1 << 3;
pub(crate) const FI_MR_VIRT_ADDR: c_int = 1 << 4;
pub(crate) const FI_MR_ALLOCATED: c_int = 1 << 5;
pub(crate) const FI_MR_PROV_KEY: c_int = 1 << 6;
pub(crate) const FI_MR_MMU_NOTIFY: c_int = 1 << 7;
pub(crate) const FI_MR_RMA_EVENT: c_int = 1 << 8;
pub(crate) const FI_MR_ENDPOINT: c_int = 1 << 9;
pub(crate) const FI_MR_HMEM: c_int = 1 << 10;

pub(crate) const FI_EP_RDM: c_int = 3;
pub(crate) const FI_AV_TABLE: c_int = 2;
pub(crate) const FI_THREAD_DOMAIN: c_int = 3;
pub(crate) const FI_CQ_FORMAT_TAGGED: c_int = 4;
pub(crate) const FI_WAIT_NONE: c_int = 0;
pub(crate) const FI_WAIT_FD: c_int = 3;
/// `fi_control` commands.
pub(crate) const FI_GETWAIT: c_int = 5;
pub(crate) const FI_ENABLE: c_int = 6;

/// `-FI_EAGAIN`, `-FI_EAVAIL`.
pub(crate) const FI_EAGAIN: isize = 11;
pub(crate) const FI_EAVAIL: isize = 259;

#[repr(C)]
pub(crate) struct fid {
    pub(crate) fclass: usize,
    pub(crate) context: *mut c_void,
    pub(crate) ops: *mut fi_ops,
}

#[repr(C)]
pub(crate) struct fi_ops {
    pub(crate) size: usize,
    pub(crate) close: unsafe extern "C" fn(*mut fid) -> c_int,
    pub(crate) bind: unsafe extern "C" fn(*mut fid, *mut fid, u64) -> c_int,
    pub(crate) control: unsafe extern "C" fn(*mut fid, c_int, *mut c_void) -> c_int,
}

/// The first members of `fi_tx_attr` and `fi_rx_attr` (caps, mode, op_flags, msg_order,
/// comp_order): only `msg_order` is used.
#[repr(C)]
pub(crate) struct fi_xx_attr_head {
    pub(crate) _caps_mode_flags: [u64; 3],
    pub(crate) msg_order: u64,
    pub(crate) _comp_order: u64,
}

/// `fi_tx_attr`: the head, then inject_size, size, iov_limit, rma_iov_limit and tclass.
#[repr(C)]
pub(crate) struct fi_tx_attr {
    pub(crate) head: fi_xx_attr_head,
    pub(crate) _inject_size_size: [usize; 2],
    pub(crate) iov_limit: usize,
    pub(crate) _rma_iov_limit: usize,
    pub(crate) _tclass: u32,
}

/// `fi_rx_attr`: the head, then total_buffered_recv, size and iov_limit.
#[repr(C)]
pub(crate) struct fi_rx_attr {
    pub(crate) head: fi_xx_attr_head,
    pub(crate) _sizes: [usize; 3],
}

/// `fi_ep_attr`: type, protocol, protocol_version, max_msg_size, then msg_prefix_size, the
/// three max_order sizes, mem_tag_format, tx/rx_ctx_cnt, auth_key_size (opaque here) and
/// auth_key.
#[repr(C)]
pub(crate) struct fi_ep_attr {
    pub(crate) type_: c_int,
    pub(crate) _protocol: [u32; 2],
    pub(crate) max_msg_size: usize,
    pub(crate) _sizes: [usize; 8],
    pub(crate) _auth_key: *mut u8,
}

/// `fi_domain_attr`: domain, name, threading, control_progress, data_progress,
/// resource_mgmt, av_type, mr_mode; then mr_key_size through mr_iov_limit (twelve sizes),
/// caps, mode, auth_key, auth_key_size, max_err_data, mr_cnt and tclass, opaque here.
#[repr(C)]
pub(crate) struct fi_domain_attr {
    pub(crate) _domain: *mut c_void,
    pub(crate) name: *mut c_char,
    pub(crate) threading: c_int,
    pub(crate) _progress: [c_int; 3],
    pub(crate) av_type: c_int,
    pub(crate) mr_mode: c_int,
    pub(crate) _counts: [usize; 12],
    pub(crate) _caps_mode: [u64; 2],
    pub(crate) _auth_key: *mut u8,
    pub(crate) _sizes: [usize; 3],
    pub(crate) _tclass: u32,
}

#[repr(C)]
pub(crate) struct fi_fabric_attr {
    pub(crate) fabric: *mut c_void,
    pub(crate) name: *mut c_char,
    pub(crate) prov_name: *mut c_char,
    pub(crate) prov_version: u32,
    pub(crate) api_version: u32,
}

#[repr(C)]
pub(crate) struct fi_info {
    pub(crate) next: *mut fi_info,
    pub(crate) caps: u64,
    pub(crate) mode: u64,
    pub(crate) addr_format: u32,
    pub(crate) src_addrlen: usize,
    pub(crate) dest_addrlen: usize,
    pub(crate) src_addr: *mut c_void,
    pub(crate) dest_addr: *mut c_void,
    pub(crate) handle: *mut fid,
    pub(crate) tx_attr: *mut fi_tx_attr,
    pub(crate) rx_attr: *mut fi_rx_attr,
    pub(crate) ep_attr: *mut fi_ep_attr,
    pub(crate) domain_attr: *mut fi_domain_attr,
    pub(crate) fabric_attr: *mut fi_fabric_attr,
    pub(crate) nic: *mut c_void,
}

#[repr(C)]
pub(crate) struct fi_ops_fabric {
    pub(crate) size: usize,
    pub(crate) domain: unsafe extern "C" fn(
        *mut fid_fabric,
        *mut fi_info,
        *mut *mut fid_domain,
        *mut c_void,
    ) -> c_int,
    pub(crate) passive_ep: *const c_void,
    pub(crate) eq_open: *const c_void,
    pub(crate) wait_open: *const c_void,
    pub(crate) trywait: unsafe extern "C" fn(*mut fid_fabric, *mut *mut fid, c_int) -> c_int,
}

#[repr(C)]
pub(crate) struct fid_fabric {
    pub(crate) fid: fid,
    pub(crate) ops: *mut fi_ops_fabric,
    pub(crate) api_version: u32,
}

#[repr(C)]
pub(crate) struct fi_ops_domain {
    pub(crate) size: usize,
    pub(crate) av_open: unsafe extern "C" fn(
        *mut fid_domain,
        *mut fi_av_attr,
        *mut *mut fid_av,
        *mut c_void,
    ) -> c_int,
    pub(crate) cq_open: unsafe extern "C" fn(
        *mut fid_domain,
        *mut fi_cq_attr,
        *mut *mut fid_cq,
        *mut c_void,
    ) -> c_int,
    pub(crate) endpoint:
        unsafe extern "C" fn(*mut fid_domain, *mut fi_info, *mut *mut fid_ep, *mut c_void) -> c_int,
}

#[repr(C)]
pub(crate) struct fi_ops_mr {
    pub(crate) size: usize,
    pub(crate) reg: unsafe extern "C" fn(
        *mut fid,
        *const c_void,
        usize,
        u64,
        u64,
        u64,
        u64,
        *mut *mut fid_mr,
        *mut c_void,
    ) -> c_int,
}

#[repr(C)]
pub(crate) struct fid_domain {
    pub(crate) fid: fid,
    pub(crate) ops: *mut fi_ops_domain,
    pub(crate) mr: *mut fi_ops_mr,
}

#[repr(C)]
pub(crate) struct fid_mr {
    pub(crate) fid: fid,
    pub(crate) mem_desc: *mut c_void,
    pub(crate) key: u64,
}

#[repr(C)]
pub(crate) struct fi_av_attr {
    pub(crate) type_: c_int,
    pub(crate) rx_ctx_bits: c_int,
    pub(crate) count: usize,
    pub(crate) ep_per_node: usize,
    pub(crate) name: *const c_char,
    pub(crate) map_addr: *mut c_void,
    pub(crate) flags: u64,
}

#[repr(C)]
pub(crate) struct fi_ops_av {
    pub(crate) size: usize,
    pub(crate) insert: unsafe extern "C" fn(
        *mut fid_av,
        *const c_void,
        usize,
        *mut u64,
        u64,
        *mut c_void,
    ) -> c_int,
}

#[repr(C)]
pub(crate) struct fid_av {
    pub(crate) fid: fid,
    pub(crate) ops: *mut fi_ops_av,
}

#[repr(C)]
pub(crate) struct fi_cq_attr {
    pub(crate) size: usize,
    pub(crate) flags: u64,
    pub(crate) format: c_int,
    pub(crate) wait_obj: c_int,
    pub(crate) signaling_vector: c_int,
    pub(crate) wait_cond: c_int,
    pub(crate) wait_set: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct fi_cq_tagged_entry {
    pub(crate) op_context: *mut c_void,
    pub(crate) flags: u64,
    pub(crate) len: usize,
    pub(crate) buf: *mut c_void,
    pub(crate) data: u64,
    pub(crate) tag: u64,
}

#[repr(C)]
pub(crate) struct fi_cq_err_entry {
    pub(crate) op_context: *mut c_void,
    pub(crate) flags: u64,
    pub(crate) len: usize,
    pub(crate) buf: *mut c_void,
    pub(crate) data: u64,
    pub(crate) tag: u64,
    pub(crate) olen: usize,
    pub(crate) err: c_int,
    pub(crate) prov_errno: c_int,
    pub(crate) err_data: *mut c_void,
    pub(crate) err_data_size: usize,
}

#[repr(C)]
pub(crate) struct fi_ops_cq {
    pub(crate) size: usize,
    pub(crate) read: unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize) -> isize,
    pub(crate) readfrom: unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize, *mut u64) -> isize,
    pub(crate) readerr: unsafe extern "C" fn(*mut fid_cq, *mut fi_cq_err_entry, u64) -> isize,
    pub(crate) sread: *const c_void,
    pub(crate) sreadfrom: *const c_void,
    pub(crate) signal: *const c_void,
    pub(crate) strerror: unsafe extern "C" fn(
        *mut fid_cq,
        c_int,
        *const c_void,
        *mut c_char,
        usize,
    ) -> *const c_char,
}

#[repr(C)]
pub(crate) struct fid_cq {
    pub(crate) fid: fid,
    pub(crate) ops: *mut fi_ops_cq,
}

#[repr(C)]
pub(crate) struct fi_ops_cm {
    pub(crate) size: usize,
    pub(crate) setname: *const c_void,
    pub(crate) getname: unsafe extern "C" fn(*mut fid, *mut c_void, *mut usize) -> c_int,
}

/// `fi_read` and `fi_trecv`: endpoint, buffer, length, descriptor, address, two 64-bit words
/// (remote address and key; tag and ignore mask), context.
pub(crate) type ReadFn = unsafe extern "C" fn(
    *mut fid_ep,
    *mut c_void,
    usize,
    *mut c_void,
    u64,
    u64,
    u64,
    *mut c_void,
) -> isize;

#[repr(C)]
pub(crate) struct fi_ops_rma {
    pub(crate) size: usize,
    pub(crate) read: ReadFn,
    pub(crate) readv: *const c_void,
    pub(crate) readmsg: *const c_void,
    pub(crate) write: unsafe extern "C" fn(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub(crate) writev: *const c_void,
    pub(crate) writemsg: unsafe extern "C" fn(*mut fid_ep, *const fi_msg_rma, u64) -> isize,
}

#[repr(C)]
pub(crate) struct fi_ops_tagged {
    pub(crate) size: usize,
    pub(crate) recv: ReadFn,
    pub(crate) recvv: *const c_void,
    pub(crate) recvmsg: *const c_void,
    pub(crate) send: unsafe extern "C" fn(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub(crate) sendv: unsafe extern "C" fn(
        *mut fid_ep,
        *const iovec,
        *mut *mut c_void,
        usize,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
}

#[repr(C)]
pub(crate) struct fid_ep {
    pub(crate) fid: fid,
    pub(crate) ops: *mut c_void,
    pub(crate) cm: *mut fi_ops_cm,
    pub(crate) msg: *mut c_void,
    pub(crate) rma: *mut fi_ops_rma,
    pub(crate) tagged: *mut fi_ops_tagged,
}

#[repr(C)]
pub(crate) struct iovec {
    pub(crate) base: *mut c_void,
    pub(crate) len: usize,
}

#[repr(C)]
pub(crate) struct fi_rma_iov {
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) key: u64,
}

#[repr(C)]
pub(crate) struct fi_msg_rma {
    pub(crate) msg_iov: *const iovec,
    pub(crate) desc: *mut *mut c_void,
    pub(crate) iov_count: usize,
    pub(crate) addr: u64,
    pub(crate) rma_iov: *const fi_rma_iov,
    pub(crate) rma_iov_count: usize,
    pub(crate) context: *mut c_void,
    pub(crate) data: u64,
}

/// The functions `libfabric.so.1` exports that hcomm calls.
pub(crate) struct Api {
    pub(crate) getinfo: unsafe extern "C" fn(
        u32,
        *const c_char,
        *const c_char,
        u64,
        *const fi_info,
        *mut *mut fi_info,
    ) -> c_int,
    pub(crate) freeinfo: unsafe extern "C" fn(*mut fi_info),
    pub(crate) dupinfo: unsafe extern "C" fn(*const fi_info) -> *mut fi_info,
    pub(crate) fabric:
        unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int,
    pub(crate) strerror: unsafe extern "C" fn(c_int) -> *const c_char,
    /// Keeps the library mapped while the pointers above are used.
    pub(crate) _lib: libloading::Library,
}

impl Api {
    /// Loads `name` (a file name the dynamic loader looks up, or a path) and finds the
    /// functions. An error says why, in words.
    pub(crate) fn load(name: &str) -> Result<Api, String> {
        // SAFETY: loading libfabric runs its constructors, which only initialise its own state.
        let lib = unsafe { libloading::Library::new(name) }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($n:literal) => {
                // SAFETY: the symbol is the libfabric function of that name, whose C signature
                // (fabric.h, fi_errno.h) the field's type mirrors.
                *unsafe { lib.get($n) }.map_err(|e| e.to_string())?
            };
        }
        Ok(Api {
            getinfo: sym!(b"fi_getinfo\0"),
            freeinfo: sym!(b"fi_freeinfo\0"),
            dupinfo: sym!(b"fi_dupinfo\0"),
            fabric: sym!(b"fi_fabric\0"),
            strerror: sym!(b"fi_strerror\0"),
            _lib: lib,
        })
    }

    /// `fi_strerror(-ret)` of a negative return code.
    pub(crate) fn error(&self, ret: isize) -> String {
        let code = c_int::try_from(ret.unsigned_abs()).unwrap_or(c_int::MAX);
        // SAFETY: fi_strerror returns a static string for any code.
        let s = unsafe { (self.strerror)(code) };
        if s.is_null() {
            return format!("libfabric error {code}");
        }
        // SAFETY: a non-null result is a NUL-terminated static string.
        unsafe { std::ffi::CStr::from_ptr(s) }
            .to_string_lossy()
            .into_owned()
    }
}
