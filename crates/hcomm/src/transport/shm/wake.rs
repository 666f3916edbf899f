//! What a local pair needs besides shared memory, without a connection between them: a way to
//! wake a peer sleeping in `epoll_wait`, and a way to notice that the peer's process ended.
//!
//! * **Waking.** Every rank binds one Unix datagram socket in the abstract namespace,
//!   `hcomm-<job id>-<rank>-wake` (nothing in the file system, gone with the process), and
//!   keeps it in its engine's epoll set. A producer that finds the rank sleeping in
//!   `epoll_wait` (its doorbell says so) sends it one byte; the sleeper wakes and drains the
//!   socket. A datagram carries nothing else, so a stranger can only wake the rank for
//!   nothing; a full receive queue means a wake-up is pending already.
//! * **The end of a peer.** A rank opens a pidfd of each local peer's process
//!   (`pidfd_open`), which becomes readable when that process ends, SIGKILL included; the
//!   watcher polls it.
//!
//! Both need the two ranks to share a pid namespace (the published pid is the peer's own) and
//! a network namespace (abstract socket names are per network namespace): each rank publishes
//! the inode numbers of its `/proc/self/ns/pid` and `/proc/self/ns/net`, and whether it could
//! open a pidfd of itself and bind its wake socket ([`Reach`]). A pair whose two entries agree
//! on both namespaces and both can is linked by shared memory alone; any other pair keeps a
//! TCP connection beside its shared memory, for the wake-ups and the end, as before. Both
//! ranks of a pair decide from the same two entries, so they always agree.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;

use rustix::event::{eventfd, EventfdFlags};
use rustix::io::Errno;
use rustix::process::{pidfd_open, Pid, PidfdFlags};

use crate::error::{Error, PeerRank, Result};

/// What a rank publishes about how its local peers may reach it without a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reach {
    /// Inode of its pid namespace (0: unknown).
    pub pid_ns: u64,
    /// Inode of its network namespace (0: unknown).
    pub net_ns: u64,
    /// It bound its wake socket and could open a pidfd of itself.
    pub able: bool,
}

impl Reach {
    /// This process's: `able` says whether its wake socket is bound.
    pub(crate) fn own(bound: bool) -> Reach {
        let ns =
            |name: &str| std::fs::metadata(format!("/proc/self/ns/{name}")).map_or(0, |m| m.ino());
        let pidfd = pidfd_open(rustix::process::getpid(), PidfdFlags::empty()).is_ok();
        let (pid_ns, net_ns) = (ns("pid"), ns("net"));
        Reach {
            pid_ns,
            net_ns,
            able: bound && pidfd && pid_ns != 0 && net_ns != 0,
        }
    }

    /// Whether two ranks with these entries need no connection: both able, in the same
    /// namespaces.
    pub(crate) fn socketless(&self, other: &Reach) -> bool {
        self.able && other.able && self.pid_ns == other.pid_ns && self.net_ns == other.net_ns
    }
}

/// The abstract name of the wake socket of `rank` in job `job_id`.
fn address(job_id: &str, rank: usize) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("hcomm-{job_id}-{rank}-wake"))
}

/// A rank's wake socket: it receives its peers' wake-ups and sends its own.
#[derive(Debug)]
pub(crate) struct WakeSocket(UnixDatagram);

impl WakeSocket {
    /// Binds the wake socket of `rank` in job `job_id` (nonblocking).
    pub(crate) fn bind(job_id: &str, rank: usize) -> io::Result<WakeSocket> {
        let sock = UnixDatagram::bind_addr(&address(job_id, rank)?)?;
        sock.set_nonblocking(true)?;
        Ok(WakeSocket(sock))
    }

    /// Reads every wake-up that arrived.
    pub(crate) fn drain(&self) {
        let mut b = [0u8; 16];
        while self.0.recv(&mut b).is_ok() {}
    }

    /// Wakes the rank whose socket is `to`. A full queue already holds a wake-up, and a rank
    /// that is gone needs none: errors are dropped.
    pub(crate) fn wake(&self, to: &SocketAddr) {
        let _ = self.0.send_to_addr(&[1], to);
    }
}

impl AsFd for WakeSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// How this rank reaches one local peer without a connection: its wake socket's address and
/// a pidfd of its process.
#[derive(Debug)]
pub(crate) struct PeerEnd {
    /// This rank's wake socket, which sends the wake-ups.
    from: Arc<WakeSocket>,
    /// Where to send them (boxed: it is large, and used only to wake the peer).
    to: Box<SocketAddr>,
    /// Readable once its process ended (taken by the watcher).
    pidfd: Option<OwnedFd>,
}

impl PeerEnd {
    /// Opens the pidfd of world rank `rank` (process `pid`) of job `job_id`; `from` sends the
    /// wake-ups.
    pub(crate) fn open(
        from: Arc<WakeSocket>,
        job_id: &str,
        rank: usize,
        pid: u32,
    ) -> Result<PeerEnd> {
        let fail = |what: String| {
            Error::init(format!(
                "cannot watch local world rank {rank} (process {pid}): {what}"
            ))
            .with_peer(PeerRank::world(rank))
        };
        let p = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| fail("not a process id".into()))?;
        let pidfd = match pidfd_open(p, PidfdFlags::empty()) {
            Ok(fd) => fd,
            // The process ended already: the peer did all it had to and finished while this
            // rank was still setting up (a loaded host). Its end is known at once, as the
            // pidfd would have told a moment later: an eventfd that is always readable.
            Err(Errno::SRCH) => eventfd(1, EventfdFlags::CLOEXEC)
                .map_err(|e| fail(format!("process gone, and eventfd: {e}")))?,
            Err(e) => return Err(fail(format!("pidfd_open: {e}"))),
        };
        let to = Box::new(address(job_id, rank).map_err(|e| fail(e.to_string()))?);
        Ok(PeerEnd {
            from,
            to,
            pidfd: Some(pidfd),
        })
    }

    /// Wakes the peer out of `epoll_wait`.
    pub(crate) fn wake(&self) {
        self.from.wake(&self.to);
    }

    /// The pidfd of the peer's process, for the watcher (once).
    pub(crate) fn take_pidfd(&mut self) -> Option<OwnedFd> {
        self.pidfd.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{poll, PollFd, PollFlags, Timespec};

    /// A datagram to a rank's wake socket makes it readable, and draining empties it; a wake
    /// socket's name is taken while it lives.
    #[test]
    fn a_wake_up_reaches_the_socket_of_its_rank() {
        let job = format!("waketest{}", std::process::id());
        let a = WakeSocket::bind(&job, 0).unwrap();
        let b = WakeSocket::bind(&job, 1).unwrap();
        assert!(WakeSocket::bind(&job, 1).is_err());
        let readable = |s: &WakeSocket| {
            let mut fds = [PollFd::new(s, PollFlags::IN)];
            let zero = Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            poll(&mut fds, Some(&zero)).unwrap() == 1
        };
        assert!(!readable(&a));
        b.wake(&address(&job, 0).unwrap());
        b.wake(&address(&job, 0).unwrap());
        assert!(readable(&a));
        a.drain();
        assert!(!readable(&a));
        assert!(Reach::own(true).socketless(&Reach::own(true)));
        assert!(!Reach::own(false).socketless(&Reach::own(true)));
    }

    /// A peer whose process ended before this rank opened its pidfd is watched all the same:
    /// its end is readable at once (it finished while this rank was still in init).
    #[test]
    fn a_peer_that_ended_before_it_was_watched_reads_as_ended() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let job = format!("gonetest{}", std::process::id());
        let from = Arc::new(WakeSocket::bind(&job, 0).unwrap());
        let mut end = PeerEnd::open(from, &job, 1, pid).unwrap();
        let fd = end.take_pidfd().unwrap();
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        assert_eq!(poll(&mut fds, Some(&zero)).unwrap(), 1);
    }

    /// The pidfd of a child becomes readable when the child is killed.
    #[test]
    fn the_pidfd_of_a_killed_process_becomes_readable() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let job = format!("pidfdtest{}", std::process::id());
        let from = Arc::new(WakeSocket::bind(&job, 0).unwrap());
        let mut end = PeerEnd::open(from, &job, 1, child.id()).unwrap();
        let pidfd = end.take_pidfd().unwrap();
        let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        assert_eq!(poll(&mut fds, Some(&zero)).unwrap(), 0);
        child.kill().unwrap();
        let second = Timespec {
            tv_sec: 5,
            tv_nsec: 0,
        };
        assert_eq!(poll(&mut fds, Some(&second)).unwrap(), 1);
        child.wait().unwrap();
    }
}
