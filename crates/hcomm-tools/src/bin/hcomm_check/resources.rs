//! What a process holds (threads, sockets, descriptors) and the life cycle of
//! communicators: nothing of hcomm is left once they are gone.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use hcomm::Communicator;

use super::p2p::ring;

/// Threads and open sockets of this process.
pub(super) fn footprint() -> Result<(usize, usize)> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    let mut sockets = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        // An fd closed since the listing has no link any more.
        if let Ok(link) = std::fs::read_link(entry?.path()) {
            sockets += usize::from(link.to_string_lossy().starts_with("socket:"));
        }
    }
    Ok((threads, sockets))
}

/// How long a released thread may still be listed in /proc/self/task: a thread's join (or its
/// count in the store's census) returns while the kernel is still ending it.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Measures with `measure` until it gives `before` again, for at most [`EXIT_GRACE`]; returns
/// the last measurement.
fn settled(
    before: (usize, usize),
    measure: fn() -> Result<(usize, usize)>,
) -> Result<(usize, usize)> {
    let limit = Instant::now() + EXIT_GRACE;
    loop {
        let now = measure()?;
        if now == before || Instant::now() >= limit {
            return Ok(now);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long a connection may stay in its handshake: the library's limit (10 s) and a margin.
const HANDSHAKE_GRACE: Duration = Duration::from_secs(12);

/// Waits until no connection of this process is in its handshake (no dialing or handshaking
/// thread of hcomm is left), for at most [`HANDSHAKE_GRACE`]. When two ranks dial each other at
/// once, the connection that loses the tie is refused and closed, but it stays connected until
/// the threads on both ends have passed the verdict, which on a loaded host may come after the
/// exchange that needed the link: such a connection is not a link.
pub(super) fn handshakes_ended() -> Result<()> {
    let limit = Instant::now() + HANDSHAKE_GRACE;
    while Instant::now() < limit
        && thread_names()?
            .iter()
            .any(|n| n == "hcomm-dial" || n == "hcomm-handshake")
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The names of this process's threads.
fn thread_names() -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        // A thread that ended since the listing has no name any more.
        if let Ok(name) = std::fs::read_to_string(entry?.path().join("comm")) {
            names.push(name.trim_end().to_owned());
        }
    }
    Ok(names)
}

/// Releases `comm` after a failure and checks that the process is back to `before` (its
/// footprint before the first init): no thread or socket of hcomm is left.
pub(super) fn nothing_left(comm: Communicator, before: (usize, usize)) -> Result<()> {
    drop(comm);
    let after = settled(before, footprint)?;
    ensure!(
        after == before,
        "after the failure and release: (threads, sockets) {after:?}, before init {before:?}; \
         threads: {}",
        thread_names()?.join(", ")
    );
    println!("left threads=0 sockets=0");
    Ok(())
}

/// This process's TCP sockets (see [`tcp_sockets`]).
pub(super) struct TcpSockets {
    /// In the listening state, as their addresses.
    pub listening: Vec<String>,
    /// Connected (established).
    pub connected: usize,
    /// Of those, the ones this process dialed, as `local -> remote` addresses.
    pub dialed: Vec<String>,
}

/// This process's TCP sockets: in the listening state, connected (established), and of
/// those the ones this process dialed (its local port is none of its listening ports; a
/// connection a peer dialed to this process's listener has the listener's port).
///
/// Each socket descriptor listed in /proc/self/fd is asked of the kernel itself, once per
/// socket (a duplicated descriptor names the same socket). Not from /proc/self/net/tcp: that
/// table holds every socket of the network namespace and is read a page at a time, each
/// read resuming at the previous one's position in a hash bucket, so sockets that other
/// processes open and close meanwhile can make it skip or repeat a line of this process.
pub(super) fn tcp_sockets() -> Result<TcpSockets> {
    let mut seen = std::collections::HashSet::new();
    let mut listening = Vec::new();
    let mut connected = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        // A descriptor closed since the listing has no link any more.
        let Ok(link) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let link = link.to_string_lossy().into_owned();
        if !link.starts_with("socket:[") || !seen.insert(link) {
            continue;
        }
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        match tcp_socket(fd) {
            Some(TcpState::Listening(local)) => listening.push(local),
            Some(TcpState::Established(local, remote)) => connected.push((local, remote)),
            None => {}
        }
    }
    let dialed = connected
        .iter()
        .filter(|(local, _)| !listening.iter().any(|l| l.port() == local.port()))
        .map(|(local, remote)| format!("{local} -> {remote}"))
        .collect();
    Ok(TcpSockets {
        listening: listening.iter().map(ToString::to_string).collect(),
        connected: connected.len(),
        dialed,
    })
}

/// A TCP socket's state, as [`tcp_sockets`] counts it.
enum TcpState {
    /// Listening, at this address.
    Listening(SocketAddr),
    /// Established, between these addresses (local, remote).
    Established(SocketAddr, SocketAddr),
}

/// What socket descriptor `fd` of this process is: a listening or established TCP socket
/// (`None` for any other socket or state, or a descriptor closed since it was listed).
fn tcp_socket(fd: i32) -> Option<TcpState> {
    // SAFETY: `fd` is one of this process's descriptors as listed a moment ago, borrowed for
    // the three system calls below only; one closed (or reused) meanwhile makes them fail
    // (or answer for the socket it names now), which the counts then miss.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    // `tcpi_state`, the first byte of `struct tcp_info`: 1 is TCP_ESTABLISHED, 10 TCP_LISTEN.
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: the kernel copies at most `len` bytes of its `tcp_info` into `info`, and refuses
    // (ENOPROTOOPT, EOPNOTSUPP) a socket that is not TCP.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 || len == 0 {
        return None;
    }
    let ip = |a: rustix::net::SocketAddrAny| SocketAddr::try_from(a).ok();
    let local = ip(rustix::net::getsockname(fd).ok()?)?;
    match info[0] {
        10 => Some(TcpState::Listening(local)),
        1 => Some(TcpState::Established(
            local,
            ip(rustix::net::getpeername(fd).ok()??)?,
        )),
        _ => None,
    }
}

/// Traffic of the `inbox-use` scenario.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(super) enum Traffic {
    /// None after init.
    None,
    /// All-reduces of 256 KiB (run with `HCOMM_ALGO=allreduce:ring`: each rank then talks to
    /// its two ring neighbours).
    Allreduce,
    /// All-to-alls of 4 KiB per pair: each rank talks to every other.
    Alltoall,
    /// Splits into the even and the odd ranks, and dups of the world and of the halves,
    /// checked (communicator creation talks to ceil(log2 n) peers each way, not to all).
    Split,
}

/// Runs `traffic` on `comm` (ten calls).
pub(super) fn traffic(comm: &Communicator, traffic: Traffic) -> Result<()> {
    let n = comm.size();
    for _ in 0..10 {
        match traffic {
            Traffic::None => {}
            Traffic::Allreduce => {
                let mut buf = vec![1.0f32; 64 << 10];
                comm.allreduce_in_place(&mut buf, hcomm::ReduceOp::Sum)?;
                ensure!(buf.iter().all(|&x| x == n as f32), "wrong all-reduce");
            }
            Traffic::Alltoall => {
                let send: Vec<u32> = (0..n * 1024).map(|i| (i / 1024) as u32).collect();
                let mut recv = vec![0u32; n * 1024];
                comm.alltoall(&send, &mut recv)?;
                ensure!(
                    recv.iter().all(|&x| x as usize == comm.rank()),
                    "wrong all-to-all"
                );
            }
            Traffic::Split => {
                let me = comm.rank();
                let half = comm
                    .split((me % 2) as i32, -(me as i32))?
                    .context("a split with a color gives a communicator")?;
                // Key -rank: the ranks of a half in reverse order.
                let mates = (n - me % 2).div_ceil(2);
                ensure!(
                    (half.size(), half.rank()) == (mates, mates - 1 - me / 2),
                    "split: rank {} of {} in the half of rank {me}",
                    half.rank(),
                    half.size()
                );
                let (dup, half_dup) = (comm.dup()?, half.dup()?);
                ensure!(
                    (dup.rank(), half_dup.rank()) == (me, half.rank()),
                    "dup: other ranks"
                );
            }
        }
    }
    Ok(())
}

/// How many bytes of this rank's shared-memory inbox have memory (their pages are resident in
/// /dev/shm, whoever touched them), and the inbox's size; (0, 0) without one.
pub(super) fn inbox_use(rank: usize) -> Result<(usize, usize)> {
    let suffix = format!("-{rank}-inbox");
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let Some(line) = maps.lines().find(|l| {
        l.split_whitespace()
            .nth(5)
            .is_some_and(|path| path.starts_with("/dev/shm/hcomm-") && path.ends_with(&suffix))
    }) else {
        return Ok((0, 0));
    };
    let range = line
        .split_whitespace()
        .next()
        .context("a line of /proc/self/maps")?;
    let (start, end) = range
        .split_once('-')
        .context("a range in /proc/self/maps")?;
    let start = usize::from_str_radix(start, 16)?;
    let len = usize::from_str_radix(end, 16)? - start;
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })?;
    let mut resident = vec![0u8; len.div_ceil(page)];
    // SAFETY: `start..start + len` is a mapping of this process (it was listed above and
    // hcomm keeps its inbox mapped while the communicator lives); `resident` has a byte per
    // page of it. mincore only reads the page tables and the page cache.
    let r = unsafe { libc::mincore(start as *mut libc::c_void, len, resident.as_mut_ptr()) };
    ensure!(r == 0, "mincore: {}", std::io::Error::last_os_error());
    let pages = resident.iter().filter(|&&b| b & 1 != 0).count();
    Ok((pages * page, len))
}

/// The `quiet-finalize` scenario (see its description in `main.rs`).
pub(super) fn quiet_finalize(comm: Communicator, done: &std::path::Path) -> Result<()> {
    let (n, me) = (comm.size(), comm.rank());
    ensure!(
        n >= 4 && n % 2 == 0,
        "quiet-finalize needs an even number of ranks, 4 or more"
    );
    let partner = me ^ 1;
    let mut got = [0u8; 8];
    if me % 2 == 0 {
        comm.send(&[me as u8; 8], partner, 1)?;
        comm.recv(&mut got, partner, 1)?;
    } else {
        comm.recv(&mut got, partner, 1)?;
        comm.send(&[me as u8; 8], partner, 1)?;
    }
    ensure!(
        got == [partner as u8; 8],
        "wrong message from rank {partner}"
    );
    // Whatever a peer sent to this rank is in its inbox once the barrier is passed.
    comm.barrier()?;
    let (before, _) = inbox_use(me)?;
    if me >= n / 2 {
        let started = Instant::now();
        comm.destroy()?;
        println!("finalize {:.1}", started.elapsed().as_secs_f64() * 1e3);
        // Alive, not beating: the lower half must take the mark for a finalize.
        let until = Instant::now() + Duration::from_secs(60);
        while !done.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        return Ok(());
    }
    for peer in n / 2..n {
        let started = Instant::now();
        let mut buf = [0u8; 8];
        match comm.recv(&mut buf, peer, 2) {
            Err(e @ hcomm::Error::PeerLost(_)) => {
                ensure!(e.to_string().contains("has finalized"), "rank {peer}: {e}");
            }
            other => anyhow::bail!("the receive from rank {peer} ended with {other:?}"),
        }
        println!(
            "finalized {peer} {:.1}",
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    let (after, _) = inbox_use(me)?;
    println!("inbox {} {} kB", before >> 10, after >> 10);
    if me == 0 {
        std::fs::write(done, b"done").context("creating --done")?;
    }
    comm.destroy()?;
    Ok(())
}

/// Open file descriptors and threads of this process.
pub(super) fn resources() -> Result<(usize, usize)> {
    let fds = std::fs::read_dir("/proc/self/fd")?.count();
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    Ok((fds, threads))
}

pub(super) fn lifecycle(first: Communicator) -> Result<()> {
    ring(&first, 1 << 20)?;
    first.destroy()?;
    let before = resources()?;
    for round in 0..3 {
        let comm = Communicator::init().context("init again")?;
        let dup = comm.dup()?;
        ring(&dup, 65536)?;
        drop(dup);
        comm.destroy()?;
        let after = settled(before, resources)?;
        ensure!(
            after == before,
            "round {round}: (fds, threads) went from {before:?} to {after:?}"
        );
    }
    Ok(())
}
