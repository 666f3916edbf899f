//! Named shared-memory segments under `/dev/shm`.
//!
//! A segment is one POSIX shared-memory object, mapped read-write and shared:
//!
//! ```text
//! offset 0               PAYLOAD_OFFSET (128)                      PAYLOAD_OFFSET + len
//! | SegmentHeader, padded | payload: what the segment is for (rings, pool blocks, ...) |
//! ```
//!
//! The creator opens the name with `O_CREAT | O_EXCL` and mode 0600, sizes it, writes the
//! [`SegmentHeader`] and publishes the header's magic last; every other process checks the
//! owner, the mode, the size, the magic, the version and the length before it hands the memory
//! out, so a stale segment of another job, another hcomm build or another user is refused with
//! a message naming it. [`ShmSegment::as_ptr`] is the start of the payload, 128-byte aligned.
//!
//! Names are `hcomm-<job id>-<rank>-<purpose>` ([`segment_name`]): the prefix lets a launcher
//! sweep what a job left behind, the job id keeps concurrent jobs apart. The name only exists
//! while the local ranks attach: every process that maps the segment is counted in the header,
//! and the one that completes the count removes the name ([`ShmSegment::unlink_if_last`]), so
//! after start-up a crash of any process, even by `SIGKILL`, leaves nothing in `/dev/shm`; the
//! kernel frees the memory when the last mapping goes. A caller that gives up before everyone
//! has attached removes the name itself with [`ShmSegment::unlink`].

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::fd::OwnedFd;
use rustix::fs::Mode;
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

use crate::error::{Error, Result};

/// The first eight bytes of every hcomm segment: `HCOMMSHM` in little-endian order.
pub(crate) const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"HCOMMSHM");
/// Version of the segment layout; a process refuses a segment of another version.
/// 2: the inbox's doorbell carries a heartbeat. 3: the fast boxes carry a split slot.
pub(crate) const SEGMENT_VERSION: u32 = 3;
/// Offset of the payload from the start of the mapping: the header padded to two cache lines,
/// so the payload is 128-byte aligned and shares no cache line with the header.
pub(crate) const PAYLOAD_OFFSET: usize = 128;
/// Prefix of every segment name.
pub(crate) const NAME_PREFIX: &str = "hcomm-";
/// Longest segment name accepted (the kernel's limit is 255 bytes).
pub(crate) const MAX_NAME_LEN: usize = 200;

/// The header at offset 0 of every segment, written by its creator and checked on every map.
///
/// The creator fills in every other field first and stores `magic` last with release
/// ordering; a process that reads the magic with acquire ordering then sees the whole header.
/// A freshly sized segment is all zero bytes, so a header that is not published yet reads as
/// magic 0.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct SegmentHeader {
    /// [`SEGMENT_MAGIC`] once the header is complete.
    pub magic: AtomicU64,
    /// [`SEGMENT_VERSION`] of the creator.
    pub version: u32,
    /// [`PAYLOAD_OFFSET`] of the creator.
    pub header_len: u32,
    /// Length of the payload in bytes.
    pub len: u64,
    /// Process id of the creator, for messages.
    pub creator_pid: u32,
    /// How many processes have mapped the segment, the creator included.
    pub mapped: AtomicU32,
}

const _: () = assert!(size_of::<SegmentHeader>() <= PAYLOAD_OFFSET);

/// Builds the segment name `hcomm-<job id>-<rank>-<purpose>`.
///
/// The job id is made of ASCII letters, digits, `_` and `.` (no `-`, so the prefix
/// `hcomm-<job id>-` names exactly one job's segments); the purpose may also contain `-`.
pub(crate) fn segment_name(job_id: &str, rank: u32, purpose: &str) -> Result<String> {
    let job_ok = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'.';
    if job_id.is_empty() || !job_id.bytes().all(job_ok) {
        return Err(Error::invalid_argument(format!(
            "shared-memory job id {job_id:?}: use ASCII letters, digits, '_' and '.' only"
        )));
    }
    if purpose.is_empty() || !purpose.bytes().all(is_name_byte) {
        return Err(Error::invalid_argument(format!(
            "shared-memory segment purpose {purpose:?}: use ASCII letters, digits, '_', '.' \
             and '-' only"
        )));
    }
    let name = format!("{NAME_PREFIX}{job_id}-{rank}-{purpose}");
    validate_name(&name)?;
    Ok(name)
}

/// Checks that `name` is a segment name hcomm may use: it starts with [`NAME_PREFIX`] followed
/// by at least one byte, is at most [`MAX_NAME_LEN`] bytes long and contains only ASCII letters, digits, `_`, `.` and `-`.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    if !name.starts_with(NAME_PREFIX)
        || name.len() == NAME_PREFIX.len()
        || name.len() > MAX_NAME_LEN
        || !name.bytes().all(is_name_byte)
    {
        return Err(Error::invalid_argument(format!(
            "shared-memory segment name {name:?}: must start with {NAME_PREFIX:?}, be at most \
             {MAX_NAME_LEN} bytes long and contain only ASCII letters, digits, '_', '.' and '-'"
        )));
    }
    Ok(())
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-'
}

/// The length of the mapping of a segment with `len` payload bytes.
fn mapping_len(name: &str, len: usize) -> Result<usize> {
    len.checked_add(PAYLOAD_OFFSET)
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "shared-memory segment {name}: a payload of {len} bytes is too large"
            ))
        })
}

fn os_error(name: &str, what: &str, err: Errno) -> Error {
    Error::transport(
        format_args!("shared-memory segment {name}: {what}"),
        err.into(),
    )
}

/// A mapped shared-memory segment: a validated header and `len` bytes of payload.
///
/// Dropping the value unmaps the segment; the name is left alone (see [`ShmSegment::unlink`]).
#[derive(Debug)]
pub(crate) struct ShmSegment {
    name: String,
    /// Start of the mapping, where the header lives.
    base: NonNull<u8>,
    /// Length of the whole mapping, header included.
    map_len: usize,
    /// The header's count of mappers right after this process mapped it: 1 for the creator.
    mapped_as: u32,
}

// SAFETY: the value owns a shared mapping that any thread may use or unmap; the payload is
// reached only through raw pointers, whose users synchronise among themselves (they already
// share it with other processes), and the header's mutable fields are atomics.
unsafe impl Send for ShmSegment {}
// SAFETY: as for `Send`: `&ShmSegment` gives out only atomics and raw pointers.
unsafe impl Sync for ShmSegment {}

impl ShmSegment {
    /// Creates the segment `name` with a payload of `len` zero bytes and maps it. The memory is
    /// reserved in `/dev/shm` up front, so a full `/dev/shm` fails here with [`Error::NoMem`].
    ///
    /// Fails if the name already exists (a leftover of a crashed job with the same id, or a
    /// clash); in that case the existing segment is left untouched. On any later failure the
    /// new name is removed again.
    pub(crate) fn create(name: &str, len: usize) -> Result<ShmSegment> {
        Self::create_with(name, len, len).map(|(seg, _)| seg)
    }

    /// [`ShmSegment::create`], also returning the open file of the segment, for a creator that
    /// later frees or reserves parts of its memory (`fallocate` on the file).
    pub(crate) fn create_keeping_fd(name: &str, len: usize) -> Result<(ShmSegment, OwnedFd)> {
        Self::create_with(name, len, len)
    }

    /// Creates the segment `name` like [`ShmSegment::create`], but reserves memory for the
    /// first `head` bytes of its payload only: the other pages take memory when they are first
    /// touched, and its users reserve a range before they write it ([`ShmSegment::reserve`]),
    /// so that a full `/dev/shm` is an error rather than a SIGBUS.
    pub(crate) fn create_sparse(name: &str, len: usize, head: usize) -> Result<ShmSegment> {
        Self::create_with(name, len, head.min(len)).map(|(seg, _)| seg)
    }

    fn create_with(name: &str, len: usize, head: usize) -> Result<(ShmSegment, OwnedFd)> {
        validate_name(name)?;
        let map_len = mapping_len(name, len)?;
        let fd = rustix::shm::open(
            name,
            rustix::shm::OFlags::CREATE | rustix::shm::OFlags::EXCL | rustix::shm::OFlags::RDWR,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|err| match err {
            Errno::EXIST => Error::transport_failed(format!(
                "shared-memory segment {name} already exists: a job with the same id is \
                 running, or a crashed one left it behind (remove /dev/shm/{name})"
            ))
            .with_source(err.into()),
            err => os_error(name, "cannot create", err),
        })?;
        match Self::init_created(name, &fd, len, map_len, PAYLOAD_OFFSET + head) {
            Ok(seg) => Ok((seg, fd)),
            Err(err) => {
                // Best effort: the original error is the one worth reporting.
                let _ = rustix::shm::unlink(name);
                Err(err)
            }
        }
    }

    fn init_created(
        name: &str,
        fd: &OwnedFd,
        len: usize,
        map_len: usize,
        reserved: usize,
    ) -> Result<ShmSegment> {
        // The umask may have cleared the owner's write bit; the other ranks need it.
        rustix::fs::fchmod(fd, Mode::RUSR | Mode::WUSR)
            .map_err(|err| os_error(name, "cannot set mode 0600", err))?;
        rustix::fs::ftruncate(fd, map_len as u64)
            .map_err(|err| os_error(name, &format!("cannot size to {map_len} bytes"), err))?;
        // Reserve the pages now: a /dev/shm too small for them (64 MiB in a default container)
        // then fails here with a message instead of killing a rank with SIGBUS on first touch.
        match rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::empty(), 0, reserved as u64) {
            Ok(()) | Err(Errno::OPNOTSUPP) => {}
            // ENOMEM: the pages would exceed the memory limit of the cgroup.
            Err(Errno::NOSPC | Errno::NOMEM) => {
                return Err(Error::no_mem(format!(
                    "shared-memory segment {name}: /dev/shm has no room for {reserved} bytes; \
                     enlarge it (e.g. docker run --shm-size) or use smaller buffers"
                )))
            }
            Err(err) => {
                return Err(os_error(
                    name,
                    &format!("cannot reserve {map_len} bytes"),
                    err,
                ))
            }
        }
        let seg = Self::map(name, fd, map_len)?;
        let header = seg.header_ptr();
        // SAFETY: the mapping is at least `PAYLOAD_OFFSET` bytes, page aligned and all zero,
        // so `header` points to a valid `SegmentHeader`. No other process reads the plain
        // fields before it has acquired the magic, which is published below, after them.
        unsafe {
            ptr::addr_of_mut!((*header).version).write(SEGMENT_VERSION);
            ptr::addr_of_mut!((*header).header_len).write(PAYLOAD_OFFSET as u32);
            ptr::addr_of_mut!((*header).len).write(len as u64);
            ptr::addr_of_mut!((*header).creator_pid).write(std::process::id());
        }
        let header = seg.header();
        header.mapped.store(1, Ordering::Relaxed);
        header.magic.store(SEGMENT_MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Maps the existing segment `name`, which must hold a payload of `expected_len` bytes,
    /// and counts this process as one more that has mapped it.
    ///
    /// The segment must belong to this user with mode 0600, be exactly as long as
    /// `expected_len` implies, and carry a complete header of this version of hcomm; anything
    /// else fails with [`Error::Transport`] naming the segment and what was wrong.
    pub(crate) fn open(name: &str, expected_len: usize) -> Result<ShmSegment> {
        Self::open_with(name, Some(expected_len))
    }

    /// [`ShmSegment::open`] for a segment of any length: the payload's length is taken from
    /// the segment's size, and its header must agree with it.
    pub(crate) fn open_any(name: &str) -> Result<ShmSegment> {
        Self::open_with(name, None)
    }

    fn open_with(name: &str, expected_len: Option<usize>) -> Result<ShmSegment> {
        validate_name(name)?;
        let fd =
            rustix::shm::open(name, rustix::shm::OFlags::RDWR, Mode::empty()).map_err(|err| {
                match err {
                    Errno::NOENT => Error::transport_failed(format!(
                        "shared-memory segment {name} does not exist: its creator has not made it \
                     yet, or every rank had already mapped it and it was unlinked"
                    ))
                    .with_source(err.into()),
                    err => os_error(name, "cannot open", err),
                }
            })?;
        let stat = rustix::fs::fstat(&fd).map_err(|err| os_error(name, "cannot stat", err))?;
        let uid = rustix::process::geteuid().as_raw();
        if stat.st_uid != uid {
            return Err(Error::transport_failed(format!(
                "shared-memory segment {name} belongs to uid {}, not to this user (uid {uid})",
                stat.st_uid
            )));
        }
        let mode = stat.st_mode & 0o777;
        if mode != 0o600 {
            return Err(Error::transport_failed(format!(
                "shared-memory segment {name} has mode {mode:04o}; hcomm creates its segments \
                 with mode 0600 and refuses others"
            )));
        }
        let size = usize::try_from(stat.st_size).unwrap_or(0);
        let expected_len = expected_len.unwrap_or_else(|| size.saturating_sub(PAYLOAD_OFFSET));
        let map_len = mapping_len(name, expected_len)?;
        if size != map_len {
            return Err(Error::transport_failed(format!(
                "shared-memory segment {name} is {} bytes long, expected {map_len} (a \
                 {PAYLOAD_OFFSET}-byte header and {expected_len} bytes of payload): it belongs \
                 to another job or another configuration",
                stat.st_size
            )));
        }
        let mut seg = Self::map(name, &fd, map_len)?;
        check_header(name, seg.header(), expected_len)?;
        seg.mapped_as = seg.header().mapped.fetch_add(1, Ordering::AcqRel) + 1;
        Ok(seg)
    }

    /// Removes the name `name` from `/dev/shm`. Existing mappings stay valid; the memory is
    /// freed when the last one goes. Returns whether the name existed.
    pub(crate) fn unlink(name: &str) -> Result<bool> {
        validate_name(name)?;
        match rustix::shm::unlink(name) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(err) => Err(os_error(name, "cannot unlink", err)),
        }
    }

    /// Removes the segment's name if this mapping completed the count: `mappers` processes
    /// (the creator included) are expected to map the segment, and exactly one of them, the
    /// last to map it, removes the name. Every mapper calls this once it has mapped the
    /// segment; returns whether this call removed the name.
    pub(crate) fn unlink_if_last(&self, mappers: u32) -> Result<bool> {
        if self.mapped_as != mappers {
            return Ok(false);
        }
        Self::unlink(&self.name)
    }

    /// The segment's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Start of the payload: `len()` bytes, 128-byte aligned, shared with every process that
    /// maps the segment. Valid until this value is dropped.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr().wrapping_add(PAYLOAD_OFFSET)
    }

    /// Gives the payload bytes `offset..offset + len` memory now (the pages that hold them),
    /// for a segment made by [`ShmSegment::create_sparse`]: a full `/dev/shm` is then an
    /// error here, not a SIGBUS at the first write. A kernel without `MADV_POPULATE_WRITE`
    /// (before 5.14) leaves the pages to be given on first touch, as before this call.
    pub(crate) fn reserve(&self, offset: usize, len: usize) -> Result<()> {
        // SAFETY: sysconf reads a constant of the system and has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|&p| p.is_power_of_two())
            .unwrap_or(4096);
        let start = (PAYLOAD_OFFSET + offset) / page * page;
        let end = (PAYLOAD_OFFSET + offset + len)
            .div_ceil(page)
            .saturating_mul(page)
            .min(self.map_len);
        if end <= start {
            return Ok(());
        }
        // SAFETY: `start..end` lies within this mapping (page aligned, `end` clamped to its
        // length), which lives as long as `self`; populating pages changes no byte of them.
        let populated = unsafe {
            rustix::mm::madvise(
                self.base.as_ptr().add(start).cast(),
                end - start,
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        };
        match populated {
            Ok(()) | Err(Errno::INVAL) => Ok(()),
            Err(err) => Err(Error::no_mem(format!(
                "shared-memory segment {}: /dev/shm has no room for {} more bytes ({err}); \
                 enlarge it (e.g. docker run --shm-size) or lower HCOMM_SHM_RING",
                self.name,
                end - start
            ))),
        }
    }

    /// Length of the payload in bytes.
    pub(crate) fn len(&self) -> usize {
        self.map_len - PAYLOAD_OFFSET
    }

    /// Whether the payload is empty.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many processes have mapped the segment so far, the creator included.
    #[cfg(test)]
    pub(crate) fn mapped_count(&self) -> u32 {
        self.header().mapped.load(Ordering::Acquire)
    }

    fn map(name: &str, fd: &OwnedFd, map_len: usize) -> Result<ShmSegment> {
        // SAFETY: with a null address and no MAP_FIXED the kernel picks fresh addresses, so
        // the new mapping aliases no memory this process already uses.
        let ptr = unsafe {
            rustix::mm::mmap(
                ptr::null_mut(),
                map_len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(|err| os_error(name, &format!("cannot map {map_len} bytes"), err))?;
        let base = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| Error::internal(format!("mmap of segment {name} returned null")))?;
        Ok(ShmSegment {
            name: name.to_owned(),
            base,
            map_len,
            mapped_as: 1,
        })
    }

    fn header_ptr(&self) -> *mut SegmentHeader {
        self.base.as_ptr().cast()
    }

    fn header(&self) -> &SegmentHeader {
        // SAFETY: the mapping starts page aligned with at least `PAYLOAD_OFFSET` bytes, any
        // bytes are a valid `SegmentHeader`, and after creation only its atomics change.
        unsafe { &*self.header_ptr() }
    }
}

/// Checks the header of the segment `name` as a process that maps it finds it: complete, of
/// this version, and describing a payload of `expected_len` bytes.
fn check_header(name: &str, header: &SegmentHeader, expected_len: usize) -> Result<()> {
    let magic = header.magic.load(Ordering::Acquire);
    if magic == 0 {
        return Err(Error::transport_failed(format!(
            "shared-memory segment {name} has no header yet: it was opened before its \
             creator finished setting it up"
        )));
    }
    if magic != SEGMENT_MAGIC {
        return Err(Error::transport_failed(format!(
            "shared-memory segment {name} is not an hcomm segment (magic {magic:#018x}, \
             expected {SEGMENT_MAGIC:#018x})"
        )));
    }
    if header.version != SEGMENT_VERSION {
        return Err(Error::transport_failed(format!(
            "shared-memory segment {name} has layout version {}, this hcomm speaks version \
             {SEGMENT_VERSION}: every rank of a job must run the same hcomm build (creator \
             pid {})",
            header.version, header.creator_pid
        )));
    }
    if header.header_len as usize != PAYLOAD_OFFSET || header.len != expected_len as u64 {
        return Err(Error::transport_failed(format!(
            "shared-memory segment {name} has a {}-byte header and {} bytes of payload, \
             expected {PAYLOAD_OFFSET} and {expected_len} (creator pid {})",
            header.header_len, header.len, header.creator_pid
        )));
    }
    Ok(())
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        // SAFETY: `base` and `map_len` describe the mapping made in `map`, which this value
        // owns; references into it borrow `self`, and users of `as_ptr` must stop at drop.
        if let Err(err) = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.map_len) } {
            tracing::warn!(segment = %self.name, %err, "cannot unmap shared-memory segment");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    use std::path::PathBuf;

    /// A segment name no other test, process or test binary uses.
    pub(crate) fn unique_name(purpose: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let job = format!("test{}", std::process::id());
        segment_name(&job, NEXT.fetch_add(1, Ordering::Relaxed), purpose).unwrap()
    }

    pub(crate) fn dev_shm(name: &str) -> PathBuf {
        PathBuf::from("/dev/shm").join(name)
    }

    fn transport_message(result: Result<ShmSegment>) -> String {
        match result {
            Err(Error::Transport(info)) => info.message,
            other => panic!("expected a transport error, got {other:?}"),
        }
    }

    #[test]
    fn names_are_validated() {
        assert_eq!(
            segment_name("j1.a_b", 3, "ring-0").unwrap(),
            "hcomm-j1.a_b-3-ring-0"
        );
        assert!(segment_name("", 0, "ring").is_err());
        assert!(segment_name("a-b", 0, "ring").is_err());
        assert!(segment_name("job", 0, "").is_err());
        assert!(segment_name("job", 0, "a/b").is_err());
        assert!(segment_name(&"j".repeat(MAX_NAME_LEN), 0, "ring").is_err());
        for bad in [
            "",
            "hcomm-",
            "x-1",
            "hcomm-a/b",
            "hcomm-a b",
            "hcomm-é",
            "/hcomm-a",
        ] {
            let invalid = matches!(validate_name(bad), Err(Error::InvalidArgument(_)));
            assert!(invalid, "{bad:?} accepted");
        }
        assert!(validate_name(&format!("hcomm-{}", "a".repeat(MAX_NAME_LEN))).is_err());
        assert!(matches!(
            ShmSegment::create("../etc", 8),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            ShmSegment::open("hcomm-a/b", 8),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn create_open_share_and_unlink() {
        let name = unique_name("share");
        let a = ShmSegment::create(&name, 4096).unwrap();
        assert_eq!(
            (a.len(), a.name(), a.mapped_count()),
            (4096, name.as_str(), 1)
        );
        assert_eq!(a.as_ptr() as usize % 128, 0);
        let meta = std::fs::metadata(dev_shm(&name)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), (PAYLOAD_OFFSET + 4096) as u64);

        // SAFETY: both payloads are 4096 bytes and valid while `a` and `b` live; the writes
        // and reads below are ordered by this one thread.
        unsafe {
            a.as_ptr().add(4095).write(0x5a);
            let b = ShmSegment::open(&name, 4096).unwrap();
            assert_ne!(a.as_ptr(), b.as_ptr());
            assert_eq!(b.as_ptr().add(4095).read(), 0x5a);
            assert_eq!(a.mapped_count(), 2);

            assert!(ShmSegment::unlink(&name).unwrap());
            assert!(!dev_shm(&name).exists());
            assert!(!ShmSegment::unlink(&name).unwrap());
            // The mappings outlive the name.
            b.as_ptr().write(7);
            assert_eq!(a.as_ptr().read(), 7);
        }
        let msg = transport_message(ShmSegment::open(&name, 4096));
        assert!(
            msg.contains(&name) && msg.contains("does not exist"),
            "{msg}"
        );
    }

    #[test]
    fn open_any_takes_the_length_from_the_segment() {
        let name = unique_name("any");
        let a = ShmSegment::create(&name, 8192).unwrap();
        let b = ShmSegment::open_any(&name).unwrap();
        assert_eq!((b.len(), a.mapped_count()), (8192, 2));
        // The header must agree with the size of the file.
        // SAFETY: the header is mapped and nothing else uses the segment.
        unsafe { ptr::addr_of_mut!((*a.header_ptr()).len).write(4096) };
        let msg = transport_message(ShmSegment::open_any(&name));
        assert!(msg.contains("4096 bytes of payload"), "{msg}");
        ShmSegment::unlink(&name).unwrap();

        let short = unique_name("anyshort");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dev_shm(&short))
            .unwrap()
            .set_len(10)
            .unwrap();
        let msg = transport_message(ShmSegment::open_any(&short));
        ShmSegment::unlink(&short).unwrap();
        assert!(msg.contains("10 bytes long"), "{msg}");
    }

    #[test]
    fn the_last_mapper_unlinks() {
        let name = unique_name("last");
        let creator = ShmSegment::create(&name, 64).unwrap();
        assert!(!creator.unlink_if_last(3).unwrap());
        let first = ShmSegment::open(&name, 64).unwrap();
        assert!(!first.unlink_if_last(3).unwrap());
        assert!(dev_shm(&name).exists());
        let second = ShmSegment::open(&name, 64).unwrap();
        assert!(second.unlink_if_last(3).unwrap());
        assert!(!dev_shm(&name).exists());
        assert_eq!(creator.mapped_count(), 3);

        let alone = unique_name("alone");
        let seg = ShmSegment::create(&alone, 0).unwrap();
        assert!(seg.is_empty());
        assert!(seg.unlink_if_last(1).unwrap());
        assert!(!dev_shm(&alone).exists());
    }

    #[test]
    fn nothing_is_left_behind() {
        let name = unique_name("clean");
        {
            let a = ShmSegment::create(&name, 1 << 20).unwrap();
            let b = ShmSegment::open(&name, 1 << 20).unwrap();
            assert!(!a.unlink_if_last(2).unwrap());
            assert!(b.unlink_if_last(2).unwrap());
        }
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&name))
            .collect();
        assert!(left.is_empty(), "left in /dev/shm: {left:?}");
    }

    #[test]
    fn a_full_dev_shm_fails_at_create_and_leaves_no_name() {
        let fs = rustix::fs::statvfs("/dev/shm").unwrap();
        let size = fs.f_blocks.saturating_mul(fs.f_frsize);
        if size == 0 {
            return; // an unlimited tmpfs has no size to exceed
        }
        // Larger than the whole file system: tmpfs refuses it before allocating anything.
        let name = unique_name("huge");
        match ShmSegment::create(&name, (size + (1 << 30)) as usize) {
            Err(Error::NoMem(msg)) => assert!(msg.message.contains(&name), "{msg}"),
            other => panic!("expected NoMem, got {other:?}"),
        }
        assert!(!dev_shm(&name).exists());
    }

    #[test]
    fn create_refuses_an_existing_name_and_keeps_it() {
        let name = unique_name("exists");
        let first = ShmSegment::create(&name, 64).unwrap();
        let msg = transport_message(ShmSegment::create(&name, 64));
        assert!(
            msg.contains(&name) && msg.contains("already exists"),
            "{msg}"
        );
        // The failed create must not have removed the segment it collided with.
        ShmSegment::open(&name, 64).unwrap();
        assert!(ShmSegment::unlink(first.name()).unwrap());
    }

    #[test]
    fn open_refuses_a_wrong_size() {
        let name = unique_name("size");
        let _seg = ShmSegment::create(&name, 4096).unwrap();
        let msg = transport_message(ShmSegment::open(&name, 8192));
        assert!(
            msg.contains(&name) && msg.contains("4224 bytes long"),
            "{msg}"
        );
        ShmSegment::unlink(&name).unwrap();

        // A file of the right owner and mode but too short for any header.
        let planted = unique_name("short");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dev_shm(&planted))
            .unwrap()
            .set_len(10)
            .unwrap();
        let msg = transport_message(ShmSegment::open(&planted, 0));
        ShmSegment::unlink(&planted).unwrap();
        assert!(
            msg.contains(&planted) && msg.contains("10 bytes long"),
            "{msg}"
        );
    }

    #[test]
    fn open_refuses_a_foreign_mode() {
        let name = unique_name("mode");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dev_shm(&name))
            .unwrap();
        file.set_len(PAYLOAD_OFFSET as u64).unwrap();
        file.set_permissions(std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let msg = transport_message(ShmSegment::open(&name, 0));
        ShmSegment::unlink(&name).unwrap();
        assert!(msg.contains(&name) && msg.contains("mode 0644"), "{msg}");
    }

    #[test]
    fn open_refuses_a_bad_header() {
        let name = unique_name("header");
        let seg = ShmSegment::create(&name, 256).unwrap();
        let header = seg.header_ptr();
        let open_error = || transport_message(ShmSegment::open(&name, 256));

        seg.header().magic.store(0, Ordering::Release);
        let msg = open_error();
        assert!(
            msg.contains(&name) && msg.contains("no header yet"),
            "{msg}"
        );

        seg.header().magic.store(0x1234, Ordering::Release);
        let msg = open_error();
        assert!(
            msg.contains(&name) && msg.contains("not an hcomm segment"),
            "{msg}"
        );
        seg.header().magic.store(SEGMENT_MAGIC, Ordering::Release);

        // SAFETY: the header is mapped, no reference to it is alive, and no other thread or
        // process uses this segment; the same holds for the blocks below.
        unsafe { ptr::addr_of_mut!((*header).version).write(SEGMENT_VERSION + 1) };
        let msg = open_error();
        assert!(
            msg.contains(&name) && msg.contains(&format!("layout version {}", SEGMENT_VERSION + 1)),
            "{msg}"
        );
        // SAFETY: see above.
        unsafe { ptr::addr_of_mut!((*header).version).write(SEGMENT_VERSION) };

        // SAFETY: see above.
        unsafe { ptr::addr_of_mut!((*header).len).write(255) };
        let msg = open_error();
        assert!(
            msg.contains(&name) && msg.contains("255 bytes of payload"),
            "{msg}"
        );
        // SAFETY: see above.
        unsafe { ptr::addr_of_mut!((*header).len).write(256) };

        let _second = ShmSegment::open(&name, 256).unwrap();
        // Failed opens do not count as mappers.
        assert_eq!(seg.mapped_count(), 2);
        ShmSegment::unlink(&name).unwrap();
    }

    /// A header's bytes, aligned as at the start of a mapping.
    #[repr(C, align(128))]
    struct HeaderBytes([u8; PAYLOAD_OFFSET]);

    fn put(b: &mut [u8], at: usize, value: &[u8]) {
        b[at..at + value.len()].copy_from_slice(value);
    }

    /// The header a creator writes for a payload of `len` bytes.
    fn valid_header(len: u64, pid: u32, mapped: u32) -> Vec<u8> {
        use std::mem::offset_of;
        let mut b = vec![0u8; size_of::<SegmentHeader>()];
        put(
            &mut b,
            offset_of!(SegmentHeader, magic),
            &SEGMENT_MAGIC.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(SegmentHeader, version),
            &SEGMENT_VERSION.to_le_bytes(),
        );
        let header_len = PAYLOAD_OFFSET as u32;
        put(
            &mut b,
            offset_of!(SegmentHeader, header_len),
            &header_len.to_le_bytes(),
        );
        put(&mut b, offset_of!(SegmentHeader, len), &len.to_le_bytes());
        put(
            &mut b,
            offset_of!(SegmentHeader, creator_pid),
            &pid.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(SegmentHeader, mapped),
            &mapped.to_le_bytes(),
        );
        b
    }

    /// Whatever another process (or a stale segment) left in a header: the check never
    /// panics, accepts exactly a complete header of this version for the expected payload,
    /// allocates nothing when it accepts, and names the segment when it refuses.
    #[test]
    fn fuzz_segment_header() {
        let target = crate::fuzz::Target {
            name: "shm segment header",
            default_cases: 200_000,
            seeds: vec![
                valid_header(0, 1, 1),
                valid_header(4096, 4242, 3),
                valid_header(1 << 20, u32::MAX, 0),
            ],
            max_len: PAYLOAD_OFFSET,
            dict: vec![
                SEGMENT_MAGIC,
                SEGMENT_VERSION as u64,
                PAYLOAD_OFFSET as u64,
                4096,
                1 << 20,
            ],
        };
        crate::fuzz::run(&target, |input, rng| {
            let mut bytes = HeaderBytes([0; PAYLOAD_OFFSET]);
            bytes.0[..input.len()].copy_from_slice(input);
            // SAFETY: the buffer is aligned and long enough for a header, and any bytes are a
            // valid `SegmentHeader` (integers and atomics).
            let header = unsafe { &*bytes.0.as_ptr().cast::<SegmentHeader>() };
            let claimed = header.len as usize;
            let random = rng.next_u64() as usize;
            let expected = *rng.pick(&[0, 4096, 1 << 20, claimed, random]);
            let (checked, usage) =
                crate::fuzz::measure(|| check_header("hcomm-fuzz-0-x", header, expected));
            let valid = header.magic.load(Ordering::Relaxed) == SEGMENT_MAGIC
                && header.version == SEGMENT_VERSION
                && header.header_len as usize == PAYLOAD_OFFSET
                && header.len == expected as u64;
            match checked {
                Ok(()) => {
                    assert!(valid, "accepted a bad header");
                    assert_eq!(usage.largest, 0);
                }
                Err(Error::Transport(msg)) => {
                    assert!(!valid, "refused a good header: {msg}");
                    assert!(msg.message.contains("hcomm-fuzz-0-x"), "{msg}");
                }
                Err(e) => panic!("not a transport error: {e}"),
            }
        });
    }
}
