//! Point-to-point scenarios: every byte of every message checked, tags, truncation,
//! timeouts, split communicators and progress.

use std::io;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use hcomm::{Communicator, Error};

/// The byte at `i` of the message from `src` to `dst` in round `round`.
pub(super) fn pattern(src: usize, dst: usize, round: usize, i: usize) -> u8 {
    let x = (src as u64 + 1).wrapping_mul(0x9e37_79b9) ^ (dst as u64 + 7).wrapping_mul(0x85eb_ca6b);
    (x.wrapping_add(round as u64 * 131)
        .wrapping_add(i as u64 * 2_654_435_761)
        >> 11) as u8
}

pub(super) fn fill(src: usize, dst: usize, round: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(src, dst, round, i)).collect()
}

pub(super) fn verify(buf: &[u8], src: usize, dst: usize, round: usize) -> Result<()> {
    if let Some(i) = (0..buf.len()).find(|&i| buf[i] != pattern(src, dst, round, i)) {
        bail!(
            "byte {i} of {} from rank {src} (round {round}) is wrong",
            buf.len()
        );
    }
    Ok(())
}

pub(super) fn sizes(max: usize) -> Vec<usize> {
    let mut v = vec![
        0,
        1,
        7,
        4096,
        4097,
        65536,
        65537,
        1 << 20,
        (1 << 20) + 3,
        16 << 20,
        64 << 20,
    ];
    v.retain(|&s| s <= max);
    v
}

pub(super) fn ring(comm: &Communicator, max: usize) -> Result<()> {
    ring_sizes(comm, sizes(max))
}

pub(super) fn ring_sizes(comm: &Communicator, sizes: Vec<usize>) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    for (round, len) in sizes.into_iter().enumerate() {
        let out = fill(r, right, round, len);
        let mut got = vec![0u8; len];
        let k = comm
            .sendrecv(&out, right, 5, &mut got, left, 5)
            .with_context(|| format!("ring, {len} bytes"))?;
        ensure!(k == len, "ring: received {k} bytes, expected {len}");
        verify(&got, left, r, round)?;
    }
    Ok(())
}

/// The scenario `split-stop` (see its help): 16 MiB messages from world rank 0 to rank 1,
/// until rank 0's armed stop fires (at most 20; it fires unless rank 1 took every piece
/// before rank 0 claimed one). Rank 1 prints `split-stop recv failed after MS ms: ERROR` and
/// `split-stop buffer untouched`; rank 0 `split-stop send ended: RESULT` and `split-stop
/// written=W` (the pieces it wrote as a sender).
pub(super) fn split_stop(comm: &Communicator) -> Result<()> {
    const LEN: usize = 16 << 20;
    const TRIES: usize = 20;
    ensure!(comm.size() == 2, "split-stop runs on 2 ranks");
    if comm.rank() == 0 {
        comm.send(&std::process::id().to_le_bytes(), 1, 1)?;
        let msg = fill(0, 1, 0, LEN);
        hcomm::internal::shm::arm_stop_in_split_write();
        let before = comm.protocol_stats().shm_split_written;
        for _ in 0..TRIES {
            let sent = comm.send(&msg, 1, 2);
            if sent.is_ok() && hcomm::internal::shm::stop_in_split_write_armed() {
                continue;
            }
            println!("split-stop send ended: {sent:?}");
            let written = comm.protocol_stats().shm_split_written - before;
            println!("split-stop written={written}");
            return Ok(());
        }
        bail!("the armed stop never fired in {TRIES} messages");
    }
    let mut pid = [0u8; 4];
    comm.recv(&mut pid, 0, 1)?;
    let pid =
        rustix::process::Pid::from_raw(i32::from_le_bytes(pid)).context("rank 0 sent no pid")?;
    let mut buf = vec![0u8; LEN];
    for _ in 0..TRIES {
        let t = Instant::now();
        match comm.recv(&mut buf, 0, 2) {
            Ok(n) => {
                // Rank 0 claimed no piece of this one (its stop did not fire): exact anyway.
                ensure!(n == LEN, "received {n} bytes");
                verify(&buf, 0, 1, 0)?;
            }
            Err(e) => {
                println!(
                    "split-stop recv failed after {} ms: {e}",
                    t.elapsed().as_millis()
                );
                buf.fill(0xa5);
                rustix::process::kill_process(pid, rustix::process::Signal::CONT)
                    .context("continuing rank 0")?;
                std::thread::sleep(Duration::from_secs(1));
                if let Some(i) = buf.iter().position(|&b| b != 0xa5) {
                    bail!("byte {i} of the receive buffer was written after the receive failed");
                }
                println!("split-stop buffer untouched");
                return Ok(());
            }
        }
    }
    bail!("rank 0 never stopped in {TRIES} messages")
}

/// Makes every link (each probing cross-memory attach), then world rank `rank` turns
/// non-dumpable: its peers without `CAP_SYS_PTRACE` are refused cross-memory attach on it
/// from then on, after their probes succeeded. Collective.
pub(super) fn links_then_nodump(comm: &Communicator, rank: usize) -> Result<()> {
    ensure!(
        rank < comm.size(),
        "--nodump {rank}: no such rank in a world of {}",
        comm.size()
    );
    open_links(comm)?;
    comm.barrier()?;
    if comm.rank() == rank {
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
            .context("prctl(PR_SET_DUMPABLE, 0)")?;
    }
    comm.barrier()?;
    Ok(())
}

/// Makes this rank's link to every peer: an empty message each way on every pair.
pub(super) fn open_links(comm: &Communicator) -> Result<()> {
    let r = comm.rank();
    let peers = || (0..comm.size()).filter(move |&p| p != r);
    let reqs = peers()
        .map(|p| comm.irecv(Vec::new(), p, 8))
        .collect::<hcomm::Result<Vec<_>>>()?;
    let sends = peers()
        .map(|p| comm.isend(Vec::new(), p, 8))
        .collect::<hcomm::Result<Vec<_>>>()?;
    hcomm::wait_all(reqs).context("opening the links: receive")?;
    hcomm::wait_all(sends).context("opening the links: send")?;
    Ok(())
}

pub(super) fn all_pairs(comm: &Communicator, max: usize) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    for (round, len) in sizes(max).into_iter().enumerate() {
        let mut reqs = Vec::new();
        for p in (0..n).filter(|&p| p != r) {
            reqs.push(comm.irecv(vec![0u8; len], p, 9)?);
        }
        let mut sends = Vec::new();
        for p in (0..n).filter(|&p| p != r) {
            sends.push(comm.isend(fill(r, p, round, len), p, 9)?);
        }
        let got =
            hcomm::wait_all(reqs).with_context(|| format!("all-pairs receive, {len} bytes"))?;
        for (c, p) in got.iter().zip((0..n).filter(|&p| p != r)) {
            ensure!(
                c.len == len,
                "all-pairs: {} bytes from rank {p}, expected {len}",
                c.len
            );
            verify(&c.buffer, p, r, round)?;
        }
        hcomm::wait_all(sends).context("all-pairs send")?;
    }
    Ok(())
}

/// The scenario `small` (see its help).
pub(super) fn small(comm: &Communicator) -> Result<()> {
    const MAX: usize = 40;
    const UNTOUCHED: u8 = 0xee;
    ensure!(comm.size() == 2, "small runs on 2 ranks");
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    for len in 0..=MAX {
        for from in [0, 1] {
            if me == from {
                comm.send(&fill(me, peer, len, len), peer, 4)?;
            }
            // The message is there before its receive starts.
            comm.barrier()?;
            if me != from {
                let mut buf = [UNTOUCHED; MAX + 8];
                let k = comm.recv(&mut buf, peer, 4)?;
                ensure!(
                    k == len,
                    "small: received {k} bytes from rank {peer}, expected {len}"
                );
                verify(&buf[..k], peer, me, len)?;
                ensure!(
                    buf[k..].iter().all(|&b| b == UNTOUCHED),
                    "small: a {len}-byte message from rank {peer} wrote past its length"
                );
            }
        }
    }
    Ok(())
}

pub(super) fn tags(comm: &Communicator) -> Result<()> {
    ensure!(comm.size() >= 2, "tags needs 2 ranks");
    const N: usize = 40;
    let len_of = |i: usize| if i % 3 == 0 { 200_000 + i } else { 10 + i };
    match comm.rank() {
        0 => {
            for i in 0..N {
                let tag = 1 + (i % 2) as u32;
                let mut msg = fill(0, 1, i, len_of(i));
                msg[0] = i as u8;
                let req = comm.isend(msg, 1, tag)?;
                // Keep some in flight while later ones are posted.
                if i % 4 == 3 {
                    req.wait()?;
                } else {
                    drop(req);
                }
            }
            comm.barrier()?;
        }
        1 => {
            // All of tag 2 first, then tag 1: within each tag the order must hold.
            for tag in [2u32, 1] {
                for i in (0..N).filter(|i| 1 + (i % 2) as u32 == tag) {
                    let mut buf = vec![0u8; 300_000];
                    let k = comm.recv(&mut buf, 0, tag)?;
                    ensure!(
                        k == len_of(i) && buf[0] == i as u8,
                        "tag {tag}: got message {} where {i} was due",
                        buf[0]
                    );
                    let mut want = fill(0, 1, i, k);
                    want[0] = i as u8;
                    ensure!(buf[..k] == want[..], "tag {tag}: message {i} is corrupt");
                }
            }
            comm.barrier()?;
        }
        _ => comm.barrier()?,
    }
    Ok(())
}

pub(super) fn truncate(comm: &Communicator) -> Result<()> {
    ensure!(comm.size() >= 2, "truncate needs 2 ranks");
    match comm.rank() {
        0 => {
            comm.send(&[1u8; 100], 1, 3)?;
            comm.send(&vec![2u8; 1 << 20], 1, 3)?;
            comm.send(&[3u8; 10], 1, 3)?;
        }
        1 => {
            for expect in [100usize, 1 << 20] {
                let mut small = [0u8; 10];
                match comm.recv(&mut small, 0, 3) {
                    Err(Error::Truncated(msg)) => {
                        ensure!(
                            msg.message.contains(&expect.to_string()),
                            "message does not name the length: {msg}"
                        )
                    }
                    other => bail!(
                        "{expect}-byte message into 10 bytes gave {other:?}, expected Truncated"
                    ),
                }
            }
            let mut buf = [0u8; 10];
            ensure!(
                comm.recv(&mut buf, 0, 3)? == 10 && buf == [3u8; 10],
                "message after truncation is wrong"
            );
        }
        _ => {}
    }
    comm.barrier()?;
    Ok(())
}

pub(super) fn timeout(comm: &Communicator) -> Result<()> {
    ensure!(comm.size() >= 2, "timeout needs 2 ranks");
    if comm.rank() == 1 {
        let t0 = Instant::now();
        let mut buf = [0u8; 8];
        match comm.recv(&mut buf, 0, 77) {
            Err(Error::Timeout(msg)) => {
                ensure!(
                    msg.peer.and_then(|p| p.world) == Some(0),
                    "the timeout does not name the peer: {msg}"
                );
                println!("timed out after {:.2} s: {msg}", t0.elapsed().as_secs_f64());
            }
            other => bail!("receive from a silent rank gave {other:?}, expected Timeout"),
        }
    } else {
        // Stay silent past rank 1's timeout, then check the link still works.
        std::thread::sleep(comm.config().timeout + Duration::from_millis(500));
    }
    comm.barrier()?;
    Ok(())
}

pub(super) fn split(comm: &Communicator) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let half = comm
        .split((r % 2) as i32, -(r as i32))?
        .context("split returned no communicator")?;
    let expect_size = (n + 1 - r % 2) / 2;
    ensure!(
        half.size() == expect_size,
        "split size {} expected {expect_size}",
        half.size()
    );
    // key = -rank: ranks are ordered in reverse.
    ensure!(
        half.rank() == expect_size - 1 - r / 2,
        "split rank {} is wrong for rank {r}",
        half.rank()
    );
    ring(&half, 1 << 20)?;
    let none = comm.split(if r == 0 { -1 } else { 0 }, 0)?;
    ensure!(
        none.is_none() == (r == 0),
        "negative color must give no communicator"
    );
    let dup = comm.dup()?;
    // The same tag on both communicators must not cross.
    if n >= 2 {
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let mut a = [0u8; 1];
        let mut b = [0u8; 1];
        let ra = comm.irecv(vec![0u8; 1], left, 4)?;
        dup.send(&[2], right, 4)?;
        comm.send(&[1], right, 4)?;
        dup.recv(&mut b, left, 4)?;
        a[0] = ra.wait()?.buffer[0];
        ensure!(
            a == [1] && b == [2],
            "messages crossed between a communicator and its dup"
        );
    }
    dup.barrier()?;
    half.destroy()?;
    Ok(())
}

/// A nonblocking send completes while its sender stays out of hcomm: rank 0 starts a 16 MiB
/// `isend` and then blocks in a plain socket (no hcomm call) until rank 1 says, through that
/// socket, that its receive is done; only then does rank 0 wait for its request. Were the
/// transfer to need the sender's calls, rank 1 would never say so and rank 0 gives up at
/// `AWAY`, a bound on a hang. No clock is compared: the order of the events is the check, so
/// a loaded machine (where filling 16 MiB alone took rank 0 half a second) slows it without
/// failing it.
pub(super) fn progress(comm: &Communicator) -> Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};

    ensure!(comm.size() >= 2, "progress needs 2 ranks");
    let topo = comm.topology();
    ensure!(
        topo.host_of(0) == topo.host_of(1),
        "progress needs ranks 0 and 1 on one host (they signal through a local socket)"
    );
    const LEN: usize = 16 << 20;
    const AWAY: Duration = Duration::from_secs(30);
    // Rank 0's socket, in the abstract namespace (nothing left on disk), named by its pid.
    let name = |pid: u32| SocketAddr::from_abstract_name(format!("hcomm-check-progress-{pid}"));
    match comm.rank() {
        0 => {
            let pid = std::process::id();
            let sock = UnixDatagram::bind_addr(&name(pid)?)?;
            sock.set_read_timeout(Some(AWAY))?;
            comm.send(&pid.to_le_bytes(), 1, 7)?;
            let req = comm.isend(fill(0, 1, 0, LEN), 1, 6)?;
            // "Compute" without touching hcomm: the transfer must go on meanwhile.
            let mut said = [0u8; 1];
            match sock.recv(&mut said) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    bail!(
                        "rank 1's receive did not complete in {AWAY:?} while this rank made \
                         no hcomm call: the isend did not progress on its own"
                    )
                }
                Err(e) => return Err(e).context("waiting for rank 1's word"),
            }
            req.wait()?;
        }
        1 => {
            let mut pid = [0u8; 4];
            comm.recv(&mut pid, 0, 7)?;
            let mut buf = vec![0u8; LEN];
            comm.recv(&mut buf, 0, 6)?;
            verify(&buf, 0, 1, 0)?;
            UnixDatagram::unbound()?
                .send_to_addr(&[1], &name(u32::from_le_bytes(pid))?)
                .context("telling rank 0 the receive is done")?;
        }
        _ => {}
    }
    comm.barrier()?;
    Ok(())
}
