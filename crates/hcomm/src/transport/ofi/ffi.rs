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
pub type fi_addr_t = u64;

/// `FI_VERSION(1, 17)`.
pub const API_VERSION: u32 = (1 << 16) | 17;

pub const FI_MSG: u64 = 1 << 1;
pub const FI_RMA: u64 = 1 << 2;
pub const FI_TAGGED: u64 = 1 << 3;
pub const FI_READ: u64 = 1 << 8;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
pub const FI_COMPLETION: u64 = 1 << 24;
pub const FI_DELIVERY_COMPLETE: u64 = 1 << 28;
pub const FI_CONTEXT: u64 = 1 << 59;
pub const FI_CONTEXT2: u64 = 1 << 52;
pub const FI_ORDER_SAS: u64 = 1 << 8;
pub const FI_ORDER_SAW: u64 = 1 << 7;
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;

pub const FI_MR_BASIC: c_int = 1;
pub const FI_MR_SCALABLE: c_int = 2;
pub const FI_MR_LOCAL: c_int = 1 << 2;
pub const FI_MR_RAW: c_int = 1 << 3;
pub const FI_MR_VIRT_ADDR: c_int = 1 << 4;
pub const FI_MR_ALLOCATED: c_int = 1 << 5;
pub const FI_MR_PROV_KEY: c_int = 1 << 6;
pub const FI_MR_MMU_NOTIFY: c_int = 1 << 7;
pub const FI_MR_RMA_EVENT: c_int = 1 << 8;
pub const FI_MR_ENDPOINT: c_int = 1 << 9;
pub const FI_MR_HMEM: c_int = 1 << 10;

pub const FI_EP_RDM: c_int = 3;
pub const FI_AV_TABLE: c_int = 2;
pub const FI_THREAD_DOMAIN: c_int = 3;
pub const FI_CQ_FORMAT_TAGGED: c_int = 4;
pub const FI_WAIT_NONE: c_int = 0;
pub const FI_WAIT_FD: c_int = 3;
/// `fi_control` commands.
pub const FI_GETWAIT: c_int = 5;
pub const FI_ENABLE: c_int = 6;

/// `-FI_EAGAIN`, `-FI_EAVAIL`.
pub const FI_EAGAIN: isize = 11;
pub const FI_EAVAIL: isize = 259;

#[repr(C)]
pub struct fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *mut fi_ops,
}

#[repr(C)]
pub struct fi_ops {
    pub size: usize,
    pub close: unsafe extern "C" fn(*mut fid) -> c_int,
    pub bind: unsafe extern "C" fn(*mut fid, *mut fid, u64) -> c_int,
    pub control: unsafe extern "C" fn(*mut fid, c_int, *mut c_void) -> c_int,
}

#[repr(C)]
pub struct fi_tx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

#[repr(C)]
pub struct fi_rx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub total_buffered_recv: usize,
    pub size: usize,
    pub iov_limit: usize,
}

#[repr(C)]
pub struct fi_ep_attr {
    pub type_: c_int,
    pub protocol: u32,
    pub protocol_version: u32,
    pub max_msg_size: usize,
    pub msg_prefix_size: usize,
    pub max_order_raw_size: usize,
    pub max_order_war_size: usize,
    pub max_order_waw_size: usize,
    pub mem_tag_format: u64,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
}

#[repr(C)]
pub struct fi_domain_attr {
    pub domain: *mut c_void,
    pub name: *mut c_char,
    pub threading: c_int,
    pub control_progress: c_int,
    pub data_progress: c_int,
    pub resource_mgmt: c_int,
    pub av_type: c_int,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub cq_cnt: usize,
    pub ep_cnt: usize,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub max_ep_tx_ctx: usize,
    pub max_ep_rx_ctx: usize,
    pub max_ep_stx_ctx: usize,
    pub max_ep_srx_ctx: usize,
    pub cntr_cnt: usize,
    pub mr_iov_limit: usize,
    pub caps: u64,
    pub mode: u64,
    pub auth_key: *mut u8,
    pub auth_key_size: usize,
    pub max_err_data: usize,
    pub mr_cnt: usize,
    pub tclass: u32,
}

#[repr(C)]
pub struct fi_fabric_attr {
    pub fabric: *mut c_void,
    pub name: *mut c_char,
    pub prov_name: *mut c_char,
    pub prov_version: u32,
    pub api_version: u32,
}

#[repr(C)]
pub struct fi_info {
    pub next: *mut fi_info,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addrlen: usize,
    pub dest_addrlen: usize,
    pub src_addr: *mut c_void,
    pub dest_addr: *mut c_void,
    pub handle: *mut fid,
    pub tx_attr: *mut fi_tx_attr,
    pub rx_attr: *mut fi_rx_attr,
    pub ep_attr: *mut fi_ep_attr,
    pub domain_attr: *mut fi_domain_attr,
    pub fabric_attr: *mut fi_fabric_attr,
    pub nic: *mut c_void,
}

#[repr(C)]
pub struct fi_ops_fabric {
    pub size: usize,
    pub domain: unsafe extern "C" fn(
        *mut fid_fabric,
        *mut fi_info,
        *mut *mut fid_domain,
        *mut c_void,
    ) -> c_int,
}

#[repr(C)]
pub struct fid_fabric {
    pub fid: fid,
    pub ops: *mut fi_ops_fabric,
    pub api_version: u32,
}

#[repr(C)]
pub struct fi_ops_domain {
    pub size: usize,
    pub av_open: unsafe extern "C" fn(
        *mut fid_domain,
        *mut fi_av_attr,
        *mut *mut fid_av,
        *mut c_void,
    ) -> c_int,
    pub cq_open: unsafe extern "C" fn(
        *mut fid_domain,
        *mut fi_cq_attr,
        *mut *mut fid_cq,
        *mut c_void,
    ) -> c_int,
    pub endpoint:
        unsafe extern "C" fn(*mut fid_domain, *mut fi_info, *mut *mut fid_ep, *mut c_void) -> c_int,
}

#[repr(C)]
pub struct fi_ops_mr {
    pub size: usize,
    pub reg: unsafe extern "C" fn(
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
pub struct fid_domain {
    pub fid: fid,
    pub ops: *mut fi_ops_domain,
    pub mr: *mut fi_ops_mr,
}

#[repr(C)]
pub struct fid_mr {
    pub fid: fid,
    pub mem_desc: *mut c_void,
    pub key: u64,
}

#[repr(C)]
pub struct fi_av_attr {
    pub type_: c_int,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: *const c_char,
    pub map_addr: *mut c_void,
    pub flags: u64,
}

#[repr(C)]
pub struct fi_ops_av {
    pub size: usize,
    pub insert: unsafe extern "C" fn(
        *mut fid_av,
        *const c_void,
        usize,
        *mut u64,
        u64,
        *mut c_void,
    ) -> c_int,
}

#[repr(C)]
pub struct fid_av {
    pub fid: fid,
    pub ops: *mut fi_ops_av,
}

#[repr(C)]
pub struct fi_cq_attr {
    pub size: usize,
    pub flags: u64,
    pub format: c_int,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_cond: c_int,
    pub wait_set: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct fi_cq_tagged_entry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
}

#[repr(C)]
pub struct fi_cq_err_entry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
    pub olen: usize,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
}

#[repr(C)]
pub struct fi_ops_cq {
    pub size: usize,
    pub read: unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize) -> isize,
    pub readfrom: unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize, *mut u64) -> isize,
    pub readerr: unsafe extern "C" fn(*mut fid_cq, *mut fi_cq_err_entry, u64) -> isize,
    pub sread: *const c_void,
    pub sreadfrom: *const c_void,
    pub signal: *const c_void,
    pub strerror: unsafe extern "C" fn(
        *mut fid_cq,
        c_int,
        *const c_void,
        *mut c_char,
        usize,
    ) -> *const c_char,
}

#[repr(C)]
pub struct fid_cq {
    pub fid: fid,
    pub ops: *mut fi_ops_cq,
}

#[repr(C)]
pub struct fi_ops_cm {
    pub size: usize,
    pub setname: *const c_void,
    pub getname: unsafe extern "C" fn(*mut fid, *mut c_void, *mut usize) -> c_int,
}

#[repr(C)]
pub struct fi_ops_rma {
    pub size: usize,
    pub read: unsafe extern "C" fn(
        *mut fid_ep,
        *mut c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub readv: *const c_void,
    pub readmsg: *const c_void,
    pub write: unsafe extern "C" fn(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub writev: *const c_void,
    pub writemsg: unsafe extern "C" fn(*mut fid_ep, *const fi_msg_rma, u64) -> isize,
}

#[repr(C)]
pub struct fi_ops_tagged {
    pub size: usize,
    pub recv: unsafe extern "C" fn(
        *mut fid_ep,
        *mut c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub recvv: *const c_void,
    pub recvmsg: *const c_void,
    pub send: unsafe extern "C" fn(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
}

#[repr(C)]
pub struct fid_ep {
    pub fid: fid,
    pub ops: *mut c_void,
    pub cm: *mut fi_ops_cm,
    pub msg: *mut c_void,
    pub rma: *mut fi_ops_rma,
    pub tagged: *mut fi_ops_tagged,
}

#[repr(C)]
pub struct iovec {
    pub base: *mut c_void,
    pub len: usize,
}

#[repr(C)]
pub struct fi_rma_iov {
    pub addr: u64,
    pub len: usize,
    pub key: u64,
}

#[repr(C)]
pub struct fi_msg_rma {
    pub msg_iov: *const iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: u64,
    pub rma_iov: *const fi_rma_iov,
    pub rma_iov_count: usize,
    pub context: *mut c_void,
    pub data: u64,
}

/// The functions `libfabric.so.1` exports that hcomm calls.
pub struct Api {
    pub getinfo: unsafe extern "C" fn(
        u32,
        *const c_char,
        *const c_char,
        u64,
        *const fi_info,
        *mut *mut fi_info,
    ) -> c_int,
    pub freeinfo: unsafe extern "C" fn(*mut fi_info),
    pub dupinfo: unsafe extern "C" fn(*const fi_info) -> *mut fi_info,
    pub fabric:
        unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int,
    pub strerror: unsafe extern "C" fn(c_int) -> *const c_char,
    /// Keeps the library mapped while the pointers above are used.
    pub _lib: libloading::Library,
}

impl Api {
    /// Loads `name` (a file name the dynamic loader looks up, or a path) and finds the
    /// functions. An error says why, in words.
    pub fn load(name: &str) -> Result<Api, String> {
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
    pub fn error(&self, ret: isize) -> String {
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
