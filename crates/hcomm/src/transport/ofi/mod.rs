//! libfabric: one reliable-datagram endpoint (`FI_EP_RDM`) per world with tagged messages and
//! RMA (`FI_MSG | FI_TAGGED | FI_RMA`), its completion queue, its address vector, and memory
//! registration.
//!
//! The library is loaded at run time ([`ffi::Api::load`], `HCOMM_OFI_LIB`, by default
//! `libfabric.so.1`): hcomm neither links it nor needs its headers to build, and a machine
//! without it runs every other transport. The provider is chosen by `fi_getinfo` (which
//! honours `FI_PROVIDER`); [`Endpoint::open`] takes the first one that offers an `FI_EP_RDM`
//! endpoint with the capabilities above, and honours the memory-registration modes it asks for
//! (`FI_MR_LOCAL`: local buffers are registered too and their descriptors passed;
//! `FI_MR_VIRT_ADDR`: remote addresses are virtual addresses, else offsets into the region;
//! `FI_MR_PROV_KEY`: keys come from the provider, else hcomm picks them; `FI_MR_ENDPOINT`:
//! regions are bound to the endpoint and enabled; `FI_MR_ALLOCATED`, `FI_MR_BASIC`: regions
//! are only ever made over allocated memory, as hcomm does anyway). A provider that needs
//! `FI_MR_RAW` or `FI_MR_HMEM`-only support is skipped.
//!
//! Everything here is called with the engine's lock held (the endpoint is opened with
//! `FI_THREAD_DOMAIN`): no call is made from two threads at once. Nothing spins in the
//! background: completions are read when the engine progresses ([`Endpoint::read_cq`]), which
//! for providers with manual progress (`tcp`) is also what moves their data; the completion
//! queue's wait descriptor, when the provider has one, sits in the engine's epoll set.

pub(crate) mod blocks;
pub(crate) mod ffi;

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

use crate::error::{Error, Result};
use ffi::*;

/// Completions [`Endpoint::read_cq`] reads at most per call.
pub(crate) const CQ_BATCH: usize = 16;

/// The size of `ofi_rxm`'s eager buffers hcomm asks for (`FI_OFI_RXM_BUFFER_SIZE`, unless the
/// user set it): 65 KiB, room for an eager message of hcomm's largest eager limit (64 KiB, with
/// its header and protocol fields), so that it travels as one message instead of being
/// segmented by rxm (16 KiB buffers by default). Measured over the tcp provider between two
/// namespaces (`bench/ofi_eager.sh`): a 64 KiB all-reduce of two ranks took 34 us eager in one
/// buffer and 65 us by RDMA read; 16 KiB 13.7 and 29 us. rxm grows its receive and send buffer
/// pools by 1024 buffers at a time: 2 x 65 MiB of address space per endpoint (2 x 16 MiB with
/// its default), registered with the provider underneath (the tcp provider pins nothing).
pub(crate) const RXM_BUFFER: usize = 65 << 10;

/// Providers whose RMA is done by hardware: chosen by default between hosts.
pub(crate) const HARDWARE: [&str; 4] = ["verbs", "efa", "psm3", "cxi"];

/// What a world's endpoint is opened with.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The library to load (`HCOMM_OFI_LIB`).
    pub lib: String,
    /// Only providers of [`HARDWARE`] (the default choice); else any (forced).
    pub hardware_only: bool,
    /// The address to open the endpoint on (`fi_getinfo`'s node with `FI_SOURCE`): tried
    /// first, then any address, since a provider may not name its devices by it.
    pub node: Option<String>,
    /// The completion queue gets a wait descriptor (`HCOMM_OFI_CQ_WAIT=fd`); else none.
    pub wait_fd: bool,
}

/// Registered memory: its key, its descriptor for local operations, and what remote peers
/// name its start with.
#[derive(Debug)]
pub(crate) struct Region {
    mr: *mut fid_mr,
    /// The key a peer passes to read or write it.
    pub key: u64,
    /// The descriptor local operations pass (`FI_MR_LOCAL`), else null.
    pub desc: *mut c_void,
    /// The address a peer names the region's first byte with.
    pub remote_base: u64,
}

// SAFETY: a region is a handle the provider made; hcomm uses it under the engine's lock only.
unsafe impl Send for Region {}

/// A completion: the context of the operation, and for received messages their tag and
/// length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion {
    /// The context the operation was posted with.
    pub context: usize,
    /// The tag of a received message.
    pub tag: u64,
    /// Bytes received.
    pub len: usize,
}

/// A failed operation: its context and the provider's message.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The context the operation was posted with.
    pub context: usize,
    /// The provider's words.
    pub why: String,
}

/// The endpoint of one world, with everything it needs.
pub(crate) struct Endpoint {
    api: Api,
    info: *mut fi_info,
    fabric: *mut fid_fabric,
    domain: *mut fid_domain,
    cq: *mut fid_cq,
    av: *mut fid_av,
    ep: *mut fid_ep,
    mr_mode: i32,
    next_key: u64,
    /// The provider keeps sends after RMA writes in order (`FI_ORDER_SAW`).
    ordered_writes: bool,
    /// The most pieces one send may gather (`tx_attr.iov_limit`).
    iov_limit: usize,
    wait_fd: Option<i32>,
    /// The provider's name (`tcp;ofi_rxm`).
    pub provider: String,
    /// The fabric's name.
    pub fabric_name: String,
    /// The domain's name.
    pub domain_name: String,
    /// The largest message of the endpoint.
    pub max_msg: usize,
}

// SAFETY: the endpoint's handles are used under the engine's lock only (FI_THREAD_DOMAIN).
unsafe impl Send for Endpoint {}
// SAFETY: as above: every method that touches the provider is called under that lock.
unsafe impl Sync for Endpoint {}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("provider", &self.provider)
            .field("fabric", &self.fabric_name)
            .finish_non_exhaustive()
    }
}

/// A string of the provider, or "".
fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's strings are NUL-terminated and live as long as their fi_info.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Loads the library `lib`; `Error::NotSupported` saying why it cannot.
fn load(lib: &str) -> Result<Api> {
    Api::load(lib).map_err(|e| {
        Error::not_supported(format!(
            "the libfabric transport is unavailable: cannot load {lib:?} ({e}); install \
             libfabric (e.g. libfabric1) or point HCOMM_OFI_LIB at it"
        ))
    })
}

/// Checks that the library `lib` loads (a rank forced onto libfabric fails before it joins
/// the job, so that its peers do not wait for it).
pub(crate) fn preflight(lib: &str) -> Result<()> {
    load(lib).map(drop)
}

/// Whether this machine shows a device that a provider of [`HARDWARE`] drives: an RDMA device
/// (verbs, EFA and PSM3 go through one: an entry of `/sys/class/infiniband`, or a
/// `/dev/infiniband/uverbs*` node) or a Slingshot NIC (cxi: an entry of `/sys/class/cxi`, or a
/// `/dev/cxi*` node). Without one the default choice does not ask libfabric at all: the first
/// `fi_getinfo` of a process loads every provider, which (libfabric 1.17 on this project's VM)
/// read /proc/kallsyms twice, a kilobyte a system call: 260 ms of a rank's init between two
/// network namespaces, against 3 ms for all the rest of it.
pub(crate) fn hardware_visible() -> bool {
    hardware_visible_in(std::path::Path::new("/"))
}

/// [`hardware_visible`] under `root` instead of `/`.
fn hardware_visible_in(root: &std::path::Path) -> bool {
    let any_entry = |dir: &str, prefix: &str| {
        std::fs::read_dir(root.join(dir)).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
        })
    };
    any_entry("sys/class/infiniband", "")
        || any_entry("dev/infiniband", "uverbs")
        || any_entry("sys/class/cxi", "")
        || any_entry("dev", "cxi")
}

/// Whether the provider named `prov` (`verbs;ofi_rxm`) does RMA in hardware.
pub(crate) fn is_hardware(prov: &str) -> bool {
    prov.split(';').any(|p| HARDWARE.contains(&p))
}

impl Endpoint {
    /// Loads libfabric and opens an endpoint on the first provider that fits (see the module
    /// docs). An error says why none could be opened (`Error::NotSupported` when the library
    /// or a fitting provider is missing).
    pub(crate) fn open(opts: &Options) -> Result<Endpoint> {
        let api = load(&opts.lib)?;
        // Read by ofi_rxm when libfabric first looks for providers (below, unless another
        // world of this process did already), once; a value the user set stays.
        if std::env::var_os("FI_OFI_RXM_BUFFER_SIZE").is_none() {
            std::env::set_var("FI_OFI_RXM_BUFFER_SIZE", RXM_BUFFER.to_string());
        }
        // SAFETY: fi_dupinfo(NULL) allocates a zeroed fi_info with its attribute structs.
        let hints = unsafe { (api.dupinfo)(std::ptr::null()) };
        if hints.is_null() {
            return Err(Error::no_mem("fi_allocinfo failed"));
        }
        // SAFETY: `hints` and its attribute structs were just allocated by libfabric.
        unsafe {
            let h = &mut *hints;
            h.caps = FI_MSG
                | FI_TAGGED
                | FI_RMA
                | FI_READ
                | FI_WRITE
                | FI_REMOTE_READ
                | FI_REMOTE_WRITE
                | FI_SEND
                | FI_RECV;
            h.mode = FI_CONTEXT | FI_CONTEXT2;
            (*h.ep_attr).type_ = FI_EP_RDM;
            let d = &mut *h.domain_attr;
            d.mr_mode =
                FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
            d.threading = FI_THREAD_DOMAIN;
            d.av_type = FI_AV_TABLE;
            (*h.tx_attr).head.msg_order = FI_ORDER_SAS;
            (*h.rx_attr).head.msg_order = FI_ORDER_SAS;
        }
        let mut list: *mut fi_info = null_mut();
        let node = opts
            .node
            .as_deref()
            .and_then(|n| std::ffi::CString::new(n).ok());
        let mut ret = -1;
        if let Some(node) = &node {
            // SAFETY: valid hints and node string; `list` receives a list to free with
            // fi_freeinfo.
            ret = unsafe {
                (api.getinfo)(
                    API_VERSION,
                    node.as_ptr(),
                    std::ptr::null(),
                    FI_SOURCE,
                    hints,
                    &mut list,
                )
            };
        }
        if ret != 0 || list.is_null() {
            // SAFETY: as above, without a node.
            ret = unsafe {
                (api.getinfo)(
                    API_VERSION,
                    std::ptr::null(),
                    std::ptr::null(),
                    0,
                    hints,
                    &mut list,
                )
            };
        }
        // SAFETY: the hints are ours to free.
        unsafe { (api.freeinfo)(hints) };
        if ret != 0 || list.is_null() {
            return Err(Error::not_supported(format!(
                "the libfabric transport is unavailable: no provider offers reliable datagram \
                 endpoints with tagged messages and RMA ({}){}",
                api.error(ret as isize),
                provider_hint()
            )));
        }
        let mut tried = Vec::new();
        let mut cur = list;
        let mut chosen = None;
        while !cur.is_null() {
            // SAFETY: `cur` is an entry of the list fi_getinfo returned.
            let info = unsafe { &*cur };
            // SAFETY: every entry has its attribute structs.
            let (prov, mr_mode) = unsafe {
                (
                    cstr((*info.fabric_attr).prov_name),
                    (*info.domain_attr).mr_mode,
                )
            };
            let usable = mr_mode & (FI_MR_RAW | FI_MR_HMEM) == 0;
            if usable && (!opts.hardware_only || is_hardware(&prov)) {
                chosen = Some(cur);
                break;
            }
            tried.push(prov);
            cur = info.next;
        }
        let Some(pick) = chosen else {
            // SAFETY: the list is ours to free.
            unsafe { (api.freeinfo)(list) };
            return Err(Error::not_supported(format!(
                "the libfabric transport is unavailable: no provider with hardware RMA ({}) \
                 among {tried:?}{}",
                HARDWARE.join(", "),
                provider_hint()
            )));
        };
        // SAFETY: `pick` is an entry of `list`; the copy is ours (freed in Drop).
        let info = unsafe { (api.dupinfo)(pick) };
        // SAFETY: the list is ours to free; `info` is a copy.
        unsafe { (api.freeinfo)(list) };
        if info.is_null() {
            return Err(Error::no_mem("fi_dupinfo failed"));
        }
        let mut ep = Endpoint {
            api,
            info,
            fabric: null_mut(),
            domain: null_mut(),
            cq: null_mut(),
            av: null_mut(),
            ep: null_mut(),
            mr_mode: 0,
            next_key: 1,
            ordered_writes: false,
            iov_limit: 1,
            wait_fd: None,
            provider: String::new(),
            fabric_name: String::new(),
            domain_name: String::new(),
            max_msg: 0,
        };
        // Dropping `ep` on an error closes what was opened.
        ep.open_objects(opts.wait_fd)?;
        Ok(ep)
    }

    /// Turns a negative return code of `what` into an error with the provider's words.
    fn check(&self, what: &str, ret: isize) -> Result<()> {
        if ret >= 0 {
            return Ok(());
        }
        Err(Error::transport_failed(format!(
            "libfabric ({}): {what} failed: {}",
            self.provider,
            self.api.error(ret)
        )))
    }

    fn open_objects(&mut self, wait_fd: bool) -> Result<()> {
        // SAFETY: `self.info` is a valid fi_info copy with its attribute structs; each object
        // is opened through the ops table of its parent, as the inline wrappers of the
        // headers do (fi_fabric, fi_domain, fi_cq_open, fi_av_open, fi_endpoint, fi_ep_bind,
        // fi_enable, fi_getname), and stored before the next call so that Drop closes it.
        unsafe {
            let info = &*self.info;
            self.provider = cstr((*info.fabric_attr).prov_name);
            self.fabric_name = cstr((*info.fabric_attr).name);
            self.domain_name = cstr((*info.domain_attr).name);
            self.mr_mode = (*info.domain_attr).mr_mode;
            self.max_msg = (*info.ep_attr).max_msg_size;
            self.ordered_writes = (*info.tx_attr).head.msg_order & FI_ORDER_SAW != 0;
            self.iov_limit = (*info.tx_attr).iov_limit;
            let ret = (self.api.fabric)(info.fabric_attr, &mut self.fabric, null_mut());
            self.check("fi_fabric", ret as isize)?;
            let f = &*self.fabric;
            let ret = ((*f.ops).domain)(self.fabric, self.info, &mut self.domain, null_mut());
            self.check("fi_domain", ret as isize)?;
            let d = &*self.domain;
            let mut cq_attr = fi_cq_attr {
                size: 0,
                flags: 0,
                format: FI_CQ_FORMAT_TAGGED,
                wait_obj: if wait_fd { FI_WAIT_FD } else { FI_WAIT_NONE },
                signaling_vector: 0,
                wait_cond: 0,
                wait_set: null_mut(),
            };
            let ret = ((*d.ops).cq_open)(self.domain, &mut cq_attr, &mut self.cq, null_mut());
            if ret != 0 && wait_fd {
                // No wait descriptor: the engine polls the queue on every turn anyway.
                cq_attr.wait_obj = FI_WAIT_NONE;
                let ret = ((*d.ops).cq_open)(self.domain, &mut cq_attr, &mut self.cq, null_mut());
                self.check("fi_cq_open", ret as isize)?;
            } else if !wait_fd {
                self.check("fi_cq_open", ret as isize)?;
            } else {
                let mut fd: i32 = -1;
                let cq = &mut (*self.cq).fid;
                let ret = ((*cq.ops).control)(cq, FI_GETWAIT, (&mut fd as *mut i32).cast());
                if ret == 0 && fd >= 0 {
                    self.wait_fd = Some(fd);
                }
            }
            let mut av_attr = fi_av_attr {
                type_: FI_AV_TABLE,
                rx_ctx_bits: 0,
                count: 0,
                ep_per_node: 0,
                name: std::ptr::null(),
                map_addr: null_mut(),
                flags: 0,
            };
            let ret = ((*d.ops).av_open)(self.domain, &mut av_attr, &mut self.av, null_mut());
            self.check("fi_av_open", ret as isize)?;
            let ret = ((*d.ops).endpoint)(self.domain, self.info, &mut self.ep, null_mut());
            self.check("fi_endpoint", ret as isize)?;
            let ep = &mut (*self.ep).fid;
            let ret = ((*ep.ops).bind)(ep, &mut (*self.cq).fid, FI_SEND | FI_RECV);
            self.check("binding the completion queue", ret as isize)?;
            let ret = ((*ep.ops).bind)(ep, &mut (*self.av).fid, 0);
            self.check("binding the address vector", ret as isize)?;
            let ret = ((*ep.ops).control)(ep, FI_ENABLE, null_mut());
            self.check("fi_enable", ret as isize)?;
        }
        Ok(())
    }

    /// The endpoint's address, to publish.
    pub(crate) fn name(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: fi_getname through the endpoint's cm ops, into a buffer of `len` bytes.
        let ret = unsafe {
            let ep = &mut *self.ep;
            ((*ep.cm).getname)(&mut ep.fid, buf.as_mut_ptr().cast(), &mut len)
        };
        self.check("fi_getname", ret as isize)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Inserts a peer's address; returns its `fi_addr_t`.
    pub(crate) fn insert(&self, addr: &[u8]) -> Result<u64> {
        let mut out: u64 = FI_ADDR_UNSPEC;
        // SAFETY: fi_av_insert of one address of the endpoint's format.
        let ret = unsafe {
            let av = &*self.av;
            ((*av.ops).insert)(self.av, addr.as_ptr().cast(), 1, &mut out, 0, null_mut())
        };
        if ret != 1 {
            self.check("fi_av_insert", (ret as isize).min(-1))?;
        }
        Ok(out)
    }

    /// The completion queue's wait descriptor, when the provider has one.
    pub(crate) fn wait_fd(&self) -> Option<i32> {
        self.wait_fd
    }

    /// Whether the engine may sleep on the wait descriptor now (`fi_trywait`): false while
    /// the provider holds work that only polling moves, or completions to read.
    pub(crate) fn may_sleep(&self) -> bool {
        if self.wait_fd.is_none() || self.ep.is_null() {
            return true;
        }
        let mut cq = self.cq.cast::<fid>();
        // SAFETY: fi_trywait on the fabric's ops with the one completion queue it opened.
        let ret = unsafe { ((*(*self.fabric).ops).trywait)(self.fabric, &mut cq, 1) };
        ret == 0
    }

    /// Whether the provider keeps sends after RMA writes in order (`FI_ORDER_SAW`): a message
    /// sent after a write arrives after the written data.
    pub(crate) fn orders_writes(&self) -> bool {
        self.ordered_writes
    }

    /// Whether local buffers must be registered too (`FI_MR_LOCAL`).
    pub(crate) fn local_mr(&self) -> bool {
        self.mr_mode & FI_MR_LOCAL != 0
    }

    /// Registers `len` bytes at `addr` for `access` (`FI_READ | FI_WRITE | FI_REMOTE_*`).
    ///
    /// # Safety
    /// The memory stays valid (mapped) until the region is closed with [`Endpoint::close_mr`].
    pub(crate) unsafe fn register(
        &mut self,
        addr: *const u8,
        len: usize,
        access: u64,
    ) -> Result<Region> {
        let key = self.next_key;
        self.next_key += 1;
        let mut mr: *mut fid_mr = null_mut();
        // SAFETY: fi_mr_reg through the domain's mr ops over memory the caller keeps valid.
        let ret = unsafe {
            let d = &*self.domain;
            ((*d.mr).reg)(
                &mut (*self.domain).fid,
                addr.cast(),
                len.max(1),
                access,
                0,
                key,
                0,
                &mut mr,
                null_mut(),
            )
        };
        self.check("registering memory (fi_mr_reg)", ret as isize)?;
        let region = Region {
            mr,
            // SAFETY: a registered region's key and descriptor (fi_mr_key, fi_mr_desc).
            key: unsafe { (*mr).key },
            // SAFETY: as above.
            desc: unsafe { (*mr).mem_desc },
            remote_base: if self.mr_mode & FI_MR_VIRT_ADDR != 0 || self.mr_mode & FI_MR_BASIC != 0 {
                addr as u64
            } else {
                0
            },
        };
        if self.mr_mode & FI_MR_ENDPOINT != 0 {
            // SAFETY: fi_mr_bind and fi_mr_enable through the region's fid ops.
            let ret = unsafe {
                let fid = &mut (*mr).fid;
                let r = ((*fid.ops).bind)(fid, &mut (*self.ep).fid, 0);
                if r == 0 {
                    ((*fid.ops).control)(fid, FI_ENABLE, null_mut())
                } else {
                    r
                }
            };
            if let Err(e) = self.check("binding memory to the endpoint", ret as isize) {
                self.close_mr(region);
                return Err(e);
            }
        }
        Ok(region)
    }

    /// Closes a region: the peers can no longer reach it.
    pub(crate) fn close_mr(&mut self, region: Region) {
        // SAFETY: the region was made by `register` and is closed once (it is consumed).
        unsafe {
            let fid = &mut (*region.mr).fid;
            ((*fid.ops).close)(fid);
        }
    }

    /// Posts a tagged receive of up to `len` bytes into `buf` (any source, any tag).
    ///
    /// # Safety
    /// `buf` stays valid for `len` bytes, and `ctx` for the provider's context (at least
    /// `FI_CONTEXT2`), until the receive completes or the endpoint closes.
    pub(crate) unsafe fn post_recv(
        &self,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        ctx: *mut c_void,
    ) -> Result<bool> {
        // SAFETY: fi_trecv through the tagged ops, per the caller's promise.
        self.post("posting a receive (fi_trecv)", |ep| unsafe {
            ((*ep.tagged).recv)(self.ep, buf.cast(), len, desc, FI_ADDR_UNSPEC, 0, !0, ctx)
        })
    }

    /// Posts a tagged send of `len` bytes at `buf` to `dest`; `Ok(false)`: try again later.
    ///
    /// # Safety
    /// As [`Endpoint::post_recv`], for the send.
    pub(crate) unsafe fn post_send(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: u64,
        tag: u64,
        ctx: *mut c_void,
    ) -> Result<bool> {
        // SAFETY: fi_tsend through the tagged ops, per the caller's promise.
        self.post("sending (fi_tsend)", |ep| unsafe {
            ((*ep.tagged).send)(self.ep, buf.cast(), len, desc, dest, tag, ctx)
        })
    }

    /// Whether one send may gather two pieces ([`Endpoint::post_send2`]).
    pub(crate) fn gathers(&self) -> bool {
        self.iov_limit >= 2
    }

    /// Posts a tagged send of two pieces, `(address, length, descriptor)` each, gathered into
    /// one message to `dest`; `Ok(false)`: try again later. Only where [`Endpoint::gathers`].
    ///
    /// # Safety
    /// As [`Endpoint::post_recv`], for both pieces of the send.
    pub(crate) unsafe fn post_send2(
        &self,
        pieces: [(*const u8, usize, *mut c_void); 2],
        dest: u64,
        tag: u64,
        ctx: *mut c_void,
    ) -> Result<bool> {
        let iov = pieces.map(|(base, len, _)| iovec {
            base: base.cast_mut().cast(),
            len,
        });
        let mut desc = pieces.map(|(_, _, d)| d);
        // SAFETY: fi_tsendv through the tagged ops; `iov` and `desc` live across the call, the
        // buffers per the caller's promise.
        self.post("sending (fi_tsendv)", |ep| unsafe {
            ((*ep.tagged).sendv)(self.ep, iov.as_ptr(), desc.as_mut_ptr(), 2, dest, tag, ctx)
        })
    }

    /// Posts an RMA read of `len` bytes from `peer`'s region (`addr`, `key`) into `buf`.
    ///
    /// # Safety
    /// As [`Endpoint::post_recv`], for the read.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn post_read(
        &self,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        peer: u64,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> Result<bool> {
        // SAFETY: fi_read through the RMA ops, per the caller's promise.
        self.post("reading remote memory (fi_read)", |ep| unsafe {
            ((*ep.rma).read)(self.ep, buf.cast(), len, desc, peer, addr, key, ctx)
        })
    }

    /// Posts an RMA write of `len` bytes at `buf` into `peer`'s region (`addr`, `key`), with
    /// delivery completion unless the provider orders sends after writes.
    ///
    /// # Safety
    /// As [`Endpoint::post_recv`], for the write.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn post_write(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        peer: u64,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> Result<bool> {
        let iov = iovec {
            base: buf.cast_mut().cast(),
            len,
        };
        let rma = fi_rma_iov { addr, len, key };
        let mut d = desc;
        let msg = fi_msg_rma {
            msg_iov: &iov,
            desc: &mut d,
            iov_count: 1,
            addr: peer,
            rma_iov: &rma,
            rma_iov_count: 1,
            context: ctx,
            data: 0,
        };
        let flags = if self.ordered_writes {
            FI_COMPLETION
        } else {
            ffi::FI_DELIVERY_COMPLETE | FI_COMPLETION
        };
        // SAFETY: fi_writemsg through the RMA ops; `msg` and what it points to live across the
        // call, the buffers per the caller's promise.
        self.post("writing remote memory (fi_write)", |ep| unsafe {
            ((*ep.rma).writemsg)(self.ep, &msg, flags)
        })
    }

    /// Posts through the endpoint's ops (`call` gets them): `Ok(false)` when the provider
    /// has no room now (`-FI_EAGAIN`), an error once the endpoint is closed.
    fn post(&self, what: &str, call: impl FnOnce(&fid_ep) -> isize) -> Result<bool> {
        if self.ep.is_null() {
            return Err(Error::transport_failed(format!(
                "libfabric ({}): the endpoint was closed",
                self.provider
            )));
        }
        // SAFETY: the endpoint is open (checked above) and used under the engine's lock.
        let ret = call(unsafe { &*self.ep });
        if ret == -FI_EAGAIN {
            return Ok(false);
        }
        self.check(what, ret).map(|()| true)
    }

    /// Closes the endpoint alone: every operation on it ends, nothing more is posted.
    pub(crate) fn close_endpoint(&mut self) {
        if self.ep.is_null() {
            return;
        }
        // SAFETY: the endpoint was opened by `open_objects` and is closed once (then null).
        unsafe {
            let fid = &mut (*self.ep).fid;
            ((*fid.ops).close)(fid);
        }
        self.ep = null_mut();
    }

    /// Reads up to `out`'s capacity of completions (progressing the provider). A failed
    /// operation comes back as `Err(Failure)`, one per call.
    pub(crate) fn read_cq(&self, out: &mut Vec<Completion>) -> std::result::Result<(), Failure> {
        let mut entries = [fi_cq_tagged_entry {
            op_context: null_mut(),
            flags: 0,
            len: 0,
            buf: null_mut(),
            data: 0,
            tag: 0,
        }; CQ_BATCH];
        // SAFETY: fi_cq_read of up to 16 tagged entries into `entries`.
        let n = unsafe {
            let cq = &*self.cq;
            ((*cq.ops).read)(self.cq, entries.as_mut_ptr().cast(), entries.len())
        };
        if n > 0 {
            for e in &entries[..n as usize] {
                out.push(Completion {
                    context: e.op_context as usize,
                    tag: e.tag,
                    len: e.len,
                });
            }
            return Ok(());
        }
        if n != -FI_EAVAIL {
            return Ok(());
        }
        // SAFETY: fi_cq_err_entry is plain data; zeroed is its documented initial state.
        let mut err: fi_cq_err_entry = unsafe { std::mem::zeroed() };
        // SAFETY: fi_cq_readerr into `err`.
        let n = unsafe {
            let cq = &*self.cq;
            ((*cq.ops).readerr)(self.cq, &mut err, 0)
        };
        if n <= 0 {
            return Ok(());
        }
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: fi_cq_strerror into `buf`; its result is a NUL-terminated string.
        let prov = unsafe {
            let cq = &*self.cq;
            cstr(((*cq.ops).strerror)(
                self.cq,
                err.prov_errno,
                err.err_data,
                buf.as_mut_ptr(),
                buf.len(),
            ))
        };
        Err(Failure {
            context: err.op_context as usize,
            why: format!(
                "libfabric ({}): {} ({prov})",
                self.provider,
                self.api.error(-(err.err as isize))
            ),
        })
    }
}

/// "; FI_PROVIDER=…" when the variable narrows the choice.
fn provider_hint() -> String {
    match std::env::var("FI_PROVIDER") {
        Ok(p) => format!("; FI_PROVIDER={p} narrows the choice"),
        Err(_) => String::new(),
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: each object was opened by `open_objects` (or is null) and is closed once,
        // children before parents, through its fid ops (fi_close).
        unsafe {
            for f in [
                self.ep.cast::<fid>(),
                self.av.cast(),
                self.cq.cast(),
                self.domain.cast(),
                self.fabric.cast(),
            ] {
                if !f.is_null() {
                    ((*(*f).ops).close)(f);
                }
            }
            if !self.info.is_null() {
                (self.api.freeinfo)(self.info);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An endpoint on libfabric's tcp provider.
    pub(crate) fn open() -> Endpoint {
        // The tests' machine has libfabric (scripts/test-env.sh installs it) and its tcp provider.
        std::env::set_var("FI_PROVIDER", "tcp");
        let opts = Options {
            lib: "libfabric.so.1".into(),
            hardware_only: false,
            node: None,
            wait_fd: true,
        };
        Endpoint::open(&opts).expect("libfabric with its tcp provider")
    }

    /// An RDMA device or a Slingshot NIC, in sysfs or as a device node, is what makes the
    /// default choice ask libfabric; a host without one (an `rdma_cm` node alone, other
    /// devices) is left to TCP without loading any provider.
    #[test]
    fn hardware_is_seen_through_its_devices() {
        let root = std::env::temp_dir().join(format!(
            "hcomm-ofi-devices-{}-{}",
            std::process::id(),
            hcomm_testkit::unix_ns()
        ));
        let at = |p: &str| root.join(p);
        std::fs::create_dir_all(at("dev/infiniband")).unwrap();
        std::fs::create_dir_all(at("sys/class/infiniband")).unwrap();
        std::fs::write(at("dev/infiniband/rdma_cm"), b"").unwrap();
        std::fs::write(at("dev/null"), b"").unwrap();
        assert!(!hardware_visible_in(&root), "no device yet");
        for (made, dir) in [
            ("sys/class/infiniband/mlx5_0", false),
            ("dev/infiniband/uverbs0", false),
            ("sys/class/cxi/cxi0", true),
            ("dev/cxi0", false),
        ] {
            if dir {
                std::fs::create_dir_all(at(made)).unwrap();
            } else {
                std::fs::create_dir_all(at(made).parent().unwrap()).unwrap();
                std::fs::write(at(made), b"").unwrap();
            }
            assert!(hardware_visible_in(&root), "{made}");
            if dir {
                std::fs::remove_dir_all(at(made)).unwrap();
            } else {
                std::fs::remove_file(at(made)).unwrap();
            }
            assert!(!hardware_visible_in(&root), "{made} removed");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// By default only providers with hardware RMA are taken: the tcp provider never is.
    #[test]
    fn the_default_choice_skips_providers_without_hardware_rma() {
        assert!(is_hardware("verbs;ofi_rxm") && is_hardware("efa") && is_hardware("cxi"));
        assert!(!is_hardware("tcp;ofi_rxm") && !is_hardware("sockets") && !is_hardware("shm"));
        std::env::set_var("FI_PROVIDER", "tcp");
        let opts = Options {
            lib: "libfabric.so.1".into(),
            hardware_only: true,
            node: None,
            wait_fd: true,
        };
        let e = Endpoint::open(&opts).expect_err("tcp is no hardware provider");
        assert!(matches!(e, Error::NotSupported(_)), "{e}");
        assert!(e.to_string().contains("hardware RMA"), "{e}");
        let missing = Options {
            lib: "libfabric-missing-for-hcomm-tests.so.1".into(),
            ..opts
        };
        let e = Endpoint::open(&missing).expect_err("no such library");
        assert!(e.to_string().contains("cannot load"), "{e}");
    }

    /// Drives both endpoints until `want` completions came from `b`.
    fn complete(a: &Endpoint, b: &Endpoint, want: usize) -> Vec<Completion> {
        let (mut got, mut scratch) = (Vec::new(), Vec::new());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while got.len() < want {
            a.read_cq(&mut scratch).expect("no failure");
            b.read_cq(&mut got).expect("no failure");
            assert!(std::time::Instant::now() < deadline, "no completion");
        }
        got
    }

    /// `HCOMM_OFI_CQ_WAIT`: the queue has a wait descriptor only when asked for one; without
    /// one, the engine may always sleep (its naps are bounded instead).
    #[test]
    fn the_completion_queue_has_a_wait_descriptor_only_when_asked() {
        assert!(open().wait_fd().is_some());
        let opts = Options {
            lib: "libfabric.so.1".into(),
            hardware_only: false,
            node: None,
            wait_fd: false,
        };
        let without = Endpoint::open(&opts).expect("libfabric with its tcp provider");
        assert!(without.wait_fd().is_none());
        assert!(without.may_sleep());
    }

    /// Two endpoints of one process: a tagged message, then an RMA read and write, through the
    /// mirrored ops tables (the ABI of the 1.17 headers).
    #[test]
    fn two_endpoints_send_read_and_write() {
        let (mut a, mut b) = (open(), open());
        assert!(a.provider.contains("tcp"), "{}", a.provider);
        let a_at_b = b.insert(&a.name().unwrap()).unwrap();
        let b_at_a = a.insert(&b.name().unwrap()).unwrap();
        let mut ctx = [[0usize; 8]; 4];
        let mut inbox = vec![0u8; 64];
        let msg = b"hello over libfabric".to_vec();
        // SAFETY: buffers and contexts outlive the operations, which complete below.
        unsafe {
            let rin = b.register(inbox.as_ptr(), 64, FI_RECV).unwrap();
            let rmsg = a.register(msg.as_ptr(), msg.len(), FI_SEND).unwrap();
            assert!(b
                .post_recv(inbox.as_mut_ptr(), 64, rin.desc, ctx[0].as_mut_ptr().cast())
                .unwrap());
            // The first send may find the connection still being made: progress, try again.
            let mut scratch = Vec::new();
            while !a
                .post_send(
                    msg.as_ptr(),
                    msg.len(),
                    rmsg.desc,
                    b_at_a,
                    7 << 32 | 3,
                    ctx[1].as_mut_ptr().cast(),
                )
                .unwrap()
            {
                a.read_cq(&mut scratch).unwrap();
                b.read_cq(&mut scratch).unwrap();
            }
            let c = complete(&a, &b, 1);
            assert_eq!((c[0].tag, c[0].len), (7 << 32 | 3, msg.len()));
            assert_eq!(c[0].context, ctx[0].as_ptr() as usize);
            assert_eq!(&inbox[..msg.len()], &msg[..]);
            // b reads a's buffer, then writes into it.
            let src: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
            let mut dst = vec![0u8; src.len()];
            let rs = a
                .register(src.as_ptr(), src.len(), FI_REMOTE_READ | FI_REMOTE_WRITE)
                .unwrap();
            let rd = b
                .register(dst.as_ptr(), dst.len(), FI_READ | FI_WRITE)
                .unwrap();
            assert!(b
                .post_read(
                    dst.as_mut_ptr(),
                    dst.len(),
                    rd.desc,
                    a_at_b,
                    rs.remote_base,
                    rs.key,
                    ctx[2].as_mut_ptr().cast()
                )
                .unwrap());
            complete(&a, &b, 1);
            assert!(dst == src);
            dst.iter_mut().for_each(|x| *x = 9);
            assert!(b
                .post_write(
                    dst.as_ptr(),
                    dst.len(),
                    rd.desc,
                    a_at_b,
                    rs.remote_base,
                    rs.key,
                    ctx[3].as_mut_ptr().cast()
                )
                .unwrap());
            complete(&a, &b, 1);
            assert!(src.iter().all(|&x| x == 9));
            a.close_mr(rs);
            a.close_mr(rmsg);
            b.close_mr(rd);
            b.close_mr(rin);
        }
    }
}
