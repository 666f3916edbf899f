//! `hcomm_check`: conformance checks of point-to-point messaging, run under any launcher.
//!
//! Each scenario exchanges data between all ranks and verifies every byte; the test suite
//! runs it under hcommrun, Open MPI and MPICH. Every rank prints `OK <scenario>` on success
//! and exits non-zero with the reason on failure.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::{Parser, Subcommand};
use std::sync::Arc;

use hcomm::coll::{CollKind, Shape, VLayout};
use hcomm::{Communicator, DataType, Error, ReduceOp};
use hcomm_tools::pattern::{v_displs, v_layout, v_matrix, Rng};

#[derive(Parser)]
#[command(about = "Conformance checks of hcomm's point-to-point layer (run under a launcher)")]
struct Args {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand, Clone)]
enum Scenario {
    /// Print rank, size and local rank; check a barrier.
    Hello,
    /// Ring exchange (send right, receive left) at sizes 0 B .. --max-size.
    Ring {
        /// Largest message, in bytes.
        #[arg(long, default_value_t = 64 << 20)]
        max_size: usize,
    },
    /// Every rank sends to and receives from every other rank at once (nonblocking). First
    /// every rank prints `listening N threads T`: its TCP sockets in the listening state once
    /// init is done (the mesh listener closes once every peer connected; rank 0 of a job
    /// without a launcher's store keeps the store's) and its threads.
    AllPairs {
        /// Largest message, in bytes.
        #[arg(long, default_value_t = 4 << 20)]
        max_size: usize,
    },
    /// Messages of one source and tag arrive in order, whatever other tags do.
    Tags,
    /// A message longer than the receive buffer gives Error::Truncated, small and large.
    Truncate,
    /// A receive from a rank that never sends times out (set a short HCOMM_TIMEOUT).
    Timeout,
    /// split and dup give independent communicators.
    Split,
    /// Rank 1 exits with status 3 at once; the others wait for it (launcher failure test).
    Exit,
    /// Rank 1 exits with status 3 in the middle of a loop of all-reduces; the others must
    /// fail fast (PeerLost or Aborted), not wait out HCOMM_TIMEOUT.
    CollExit,
    /// A nonblocking send completes while its sender computes without calling hcomm.
    Progress,
    /// Every collective, data type and op against the sequential reference.
    Collectives {
        /// Largest count (elements) tried.
        #[arg(long, default_value_t = 70_000)]
        max_count: usize,
        /// Only this collective.
        #[arg(long)]
        only: Option<String>,
        /// Buffers from the shared-memory pool (`Communicator::alloc`) instead of the heap.
        #[arg(long)]
        pool: bool,
    },
    /// Ranks calling different collectives, counts, types or roots get Error::Mismatch.
    Mismatch,
    /// Ranks configured with different HCOMM_ALGO: their all-reduce reports a mismatch.
    AlgoMismatch,
    /// With HCOMM_DETERMINISTIC=1, float reductions of arbitrary values equal the rank-order
    /// reference bit for bit, whatever HCOMM_ALGO says.
    Deterministic,
    /// Nonblocking collectives on two communicators progress together; a batch of 1000
    /// small all-reduces gives the same results as separate calls.
    Overlap,
    /// Worlds created and destroyed in a row leave no socket or thread behind.
    Lifecycle,
    /// Ring exchange at sizes around every protocol threshold, then the protocol counts.
    Protocols,
    /// Ranks 0 and 1 ping-pong messages of every protocol (run with HCOMM_SPIN_US=0, so that
    /// every wait sleeps); then the count of sleeps nobody woke, which must be zero.
    Wakeups,
    /// Random collectives (kinds, types, ops, counts, roots, in place or not, heap or pool
    /// memory) on the world and on communicators made by split and dup, each checked against
    /// the sequential reference; every rank draws the same calls from --seed.
    Soak {
        /// Number of calls (on all communicators together).
        #[arg(long, default_value_t = 1000)]
        calls: usize,
        /// Seed of the random calls: the same seed gives the same calls.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Largest count (elements) of a call.
        #[arg(long, default_value_t = 100_000)]
        max_count: usize,
    },
    /// The ranks in --victims are killed while the others wait in a pending operation on
    /// them; the others must fail with PeerLost (or Aborted, when another survivor's abort
    /// reaches them first). Every rank prints `ready <ns>` after the start-up barrier, a victim
    /// that kills itself `killing <ns>` just before, a survivor `lost <ns> <error>` when its
    /// operation fails (ns: nanoseconds since the Unix epoch), for kill-to-error latencies.
    PeerLoss {
        /// World ranks that die.
        #[arg(long, value_delimiter = ',', required = true)]
        victims: Vec<usize>,
        /// A victim kills itself with SIGKILL this long after the barrier; without it, the
        /// victims wait to be killed from outside (a failure if nobody does).
        #[arg(long)]
        kill_after_ms: Option<u64>,
        /// What the survivors wait in: a receive from the first victim, or a loop of
        /// all-reduces on the world (the victims run it too until they die).
        #[arg(long, value_enum, default_value_t = Pending::Recv)]
        pending: Pending,
    },
    /// All-reduces in a loop, checked, for the profiler, stall and trace tests: every rank
    /// prints `pid <pid>` first; rank --late joins call --late-call only after --late-ms (the
    /// others stall in it), and every rank pauses --pause-ms between calls.
    Observe {
        /// Number of all-reduces.
        #[arg(long, default_value_t = 100)]
        calls: usize,
        /// Floats per all-reduce.
        #[arg(long, default_value_t = 1024)]
        count: usize,
        /// Milliseconds between calls.
        #[arg(long, default_value_t = 0)]
        pause_ms: u64,
        /// The rank that comes late to the first call.
        #[arg(long)]
        late: Option<usize>,
        /// How late it comes, in milliseconds.
        #[arg(long, default_value_t = 0)]
        late_ms: u64,
        /// The call it comes late to (from 0; the first call of a shape also sets up).
        #[arg(long, default_value_t = 0)]
        late_call: usize,
    },
    /// Rank --aborter aborts the world (`Communicator::abort`) while the others, and another
    /// thread of its own, wait in a pending operation; they must fail with Aborted naming it,
    /// as must every later call, while a communicator duplicated before still works.
    /// Every rank prints `ready <ns>` after the start-up barrier, the aborter `aborting <ns>`
    /// just before, the others `aborted <ns> <error>`. Then every rank releases the world and
    /// checks that no thread or socket of hcomm is left; the aborter lingers a second (so that
    /// the others report before the launcher stops them) and exits with status 1.
    Abort {
        /// World rank that aborts.
        #[arg(long, default_value_t = 1)]
        aborter: usize,
        /// What the others wait in: a receive from the aborter, or a loop of all-reduces on
        /// the world (which the aborter never joins).
        #[arg(long, value_enum, default_value_t = Pending::Recv)]
        pending: Pending,
    },
    /// After a barrier rank 1 kills itself with SIGKILL; the others run all-reduces and must
    /// fail fast with PeerLost naming it.
    Kill {
        /// Rank 1 first takes pool memory no peer has mapped (its block's name is left for
        /// hcommrun to sweep).
        #[arg(long)]
        pool: bool,
    },
}

/// The operation survivors of `peer-loss` wait in.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Pending {
    /// A blocking receive from the first victim (the waiter sleeps).
    Recv,
    /// All-reduces of 256 KiB in a loop (the waiter is busy).
    Allreduce,
}

/// The byte at `i` of the message from `src` to `dst` in round `round`.
fn pattern(src: usize, dst: usize, round: usize, i: usize) -> u8 {
    let x = (src as u64 + 1).wrapping_mul(0x9e37_79b9) ^ (dst as u64 + 7).wrapping_mul(0x85eb_ca6b);
    (x.wrapping_add(round as u64 * 131)
        .wrapping_add(i as u64 * 2_654_435_761)
        >> 11) as u8
}

fn fill(src: usize, dst: usize, round: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(src, dst, round, i)).collect()
}

fn verify(buf: &[u8], src: usize, dst: usize, round: usize) -> Result<()> {
    if let Some(i) = (0..buf.len()).find(|&i| buf[i] != pattern(src, dst, round, i)) {
        bail!(
            "byte {i} of {} from rank {src} (round {round}) is wrong",
            buf.len()
        );
    }
    Ok(())
}

fn sizes(max: usize) -> Vec<usize> {
    let mut v = vec![
        0,
        1,
        7,
        4096,
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

fn ring(comm: &Communicator, max: usize) -> Result<()> {
    ring_sizes(comm, sizes(max))
}

fn ring_sizes(comm: &Communicator, sizes: Vec<usize>) -> Result<()> {
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

fn all_pairs(comm: &Communicator, max: usize) -> Result<()> {
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

fn tags(comm: &Communicator) -> Result<()> {
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

fn truncate(comm: &Communicator) -> Result<()> {
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
                            msg.contains(&expect.to_string()),
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

fn timeout(comm: &Communicator) -> Result<()> {
    ensure!(comm.size() >= 2, "timeout needs 2 ranks");
    if comm.rank() == 1 {
        let t0 = Instant::now();
        let mut buf = [0u8; 8];
        match comm.recv(&mut buf, 0, 77) {
            Err(Error::Timeout(msg)) => {
                ensure!(
                    msg.contains("rank 0"),
                    "timeout message does not name the peer: {msg}"
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

fn split(comm: &Communicator) -> Result<()> {
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

fn progress(comm: &Communicator) -> Result<()> {
    ensure!(comm.size() >= 2, "progress needs 2 ranks");
    const LEN: usize = 16 << 20;
    const BUSY: Duration = Duration::from_millis(1500);
    match comm.rank() {
        0 => {
            let req = comm.isend(fill(0, 1, 0, LEN), 1, 6)?;
            // "Compute" without touching hcomm: the transfer must go on meanwhile.
            std::thread::sleep(BUSY);
            req.wait()?;
        }
        1 => {
            let t0 = Instant::now();
            let mut buf = vec![0u8; LEN];
            comm.recv(&mut buf, 0, 6)?;
            let took = t0.elapsed();
            verify(&buf, 0, 1, 0)?;
            ensure!(
                took < BUSY / 2,
                "the receive took {took:?}: the sender's isend did not progress on its own"
            );
        }
        _ => {}
    }
    comm.barrier()?;
    Ok(())
}

/// Threads and open sockets of this process.
fn footprint() -> Result<(usize, usize)> {
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

/// Releases `comm` after a failure and checks that the process is back to `before` (its
/// footprint before the first init): no thread or socket of hcomm is left.
fn nothing_left(comm: Communicator, before: (usize, usize)) -> Result<()> {
    drop(comm);
    let after = footprint()?;
    ensure!(
        after == before,
        "after the failure and release: (threads, sockets) {after:?}, before init {before:?}"
    );
    println!("left threads=0 sockets=0");
    Ok(())
}

/// This process's TCP sockets in the listening state.
fn listening_sockets() -> Result<usize> {
    // Sockets of this process by inode, from /proc/self/fd ("socket:[INODE]").
    let mut mine = std::collections::HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        if let Ok(link) = std::fs::read_link(entry?.path()) {
            let link = link.to_string_lossy().into_owned();
            if let Some(inode) = link
                .strip_prefix("socket:[")
                .and_then(|l| l.strip_suffix(']'))
            {
                mine.insert(inode.to_owned());
            }
        }
    }
    // The namespace's TCP sockets: column 4 is the state (0A: listening), column 10 the inode.
    let mut count = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == "0A" && mine.contains(cols[9]) {
                count += 1;
            }
        }
    }
    Ok(count)
}

/// Open file descriptors and threads of this process.
fn resources() -> Result<(usize, usize)> {
    let fds = std::fs::read_dir("/proc/self/fd")?.count();
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    Ok((fds, threads))
}

fn lifecycle(first: Communicator) -> Result<()> {
    ring(&first, 1 << 20)?;
    first.destroy()?;
    let before = resources()?;
    for round in 0..3 {
        let comm = Communicator::init().context("init again")?;
        let dup = comm.dup()?;
        ring(&dup, 65536)?;
        drop(dup);
        comm.destroy()?;
        let after = resources()?;
        ensure!(
            after == before,
            "round {round}: (fds, threads) went from {before:?} to {after:?}"
        );
    }
    Ok(())
}

/// Every rank's input of a call, generated identically on all ranks: small integers, so
/// that float results are exact in any reduction order.
fn inputs(shapes: &[Shape], seed: u64) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let gen = |r: usize, len: usize, salt: u64, dtype: DataType, op: ReduceOp| -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        for i in 0..len / dtype.size() {
            let x = r as u64 * 7919 + i as u64 * 104_729 + salt * 31 + seed;
            hcomm_tools::push_test_value(dtype, op, x, &mut out);
        }
        out
    };
    let sends = shapes
        .iter()
        .enumerate()
        .map(|(r, s)| gen(r, s.send_bytes(r), 1, s.dtype, s.op))
        .collect();
    let recvs = shapes
        .iter()
        .enumerate()
        .map(|(r, s)| gen(r, s.recv_bytes(r), 2, s.dtype, s.op))
        .collect();
    (sends, recvs)
}

/// A call for messages: collective, type, op, count, root, in place or not.
fn describe(s: &Shape) -> String {
    format!(
        "{} {} {} count {} root {} in place {}",
        s.kind.name(),
        s.dtype.name(),
        s.op.name(),
        s.count,
        s.root,
        s.in_place
    )
}

/// Runs one call on this rank and checks it against the reference.
fn check_call(comm: &Communicator, shapes: &[Shape], seed: u64, pool: bool) -> Result<()> {
    let r = comm.rank();
    let (sends, recvs) = inputs(shapes, seed);
    let want = hcomm::coll::reference::expected(shapes, &sends, &recvs);
    let s = &shapes[r];
    let send = if s.in_place_at(r) || !has_send(s.kind) {
        None
    } else {
        Some(&sends[r][..])
    };
    let pooled = |data: &[u8]| -> Result<hcomm::PoolBuf<u8>> {
        let mut b = comm.alloc::<u8>(data.len())?;
        b.copy_from_slice(data);
        Ok(b)
    };
    let result = if pool {
        let send = send.map(pooled).transpose()?;
        let mut recv = pooled(&recvs[r])?;
        comm.run_collective(s.clone(), send.as_deref(), &mut recv)
            .map(|()| recv.to_vec())
    } else {
        let mut recv = recvs[r].clone();
        comm.run_collective(s.clone(), send, &mut recv)
            .map(|()| recv)
    };
    let recv = result.with_context(|| describe(s))?;
    if recv != want[r] {
        let at = recv.iter().zip(&want[r]).position(|(a, b)| a != b);
        bail!(
            "{}: result differs from the reference at byte {at:?}",
            describe(s)
        );
    }
    Ok(())
}

fn has_send(kind: CollKind) -> bool {
    !matches!(kind, CollKind::Broadcast | CollKind::Barrier)
}

fn collectives(
    comm: &Communicator,
    max_count: usize,
    only: Option<&str>,
    pool: bool,
) -> Result<()> {
    let n = comm.size();
    let mut seed = 0;
    let counts: Vec<usize> = [0usize, 1, 7, 1000, n * 333 + 1, max_count]
        .into_iter()
        .filter(|&c| c <= max_count)
        .collect();
    for kind in CollKind::ALL {
        if only.is_some_and(|o| o != kind.name()) {
            continue;
        }
        let types: Vec<(DataType, ReduceOp)> = if kind.reduces() {
            DataType::ALL
                .iter()
                .flat_map(|&d| ReduceOp::ALL.iter().map(move |&o| (d, o)))
                .collect()
        } else {
            vec![
                (DataType::Int32, ReduceOp::Sum),
                (DataType::Float64, ReduceOp::Sum),
            ]
        };
        for (dtype, op) in types {
            // All counts for one pair per kind, a small and a mid count for the others.
            let cs: Vec<usize> = if dtype == DataType::Float32 || !kind.reduces() {
                counts.clone()
            } else {
                vec![1, 1000]
            };
            for &count in &cs {
                for in_place in [false, true] {
                    if in_place
                        && matches!(
                            kind,
                            CollKind::AllToAllV | CollKind::Broadcast | CollKind::Barrier
                        )
                    {
                        continue;
                    }
                    seed += 1;
                    let root = if kind.rooted() { seed as usize % n } else { 0 };
                    let shapes = call_shapes(kind, n, count, root, dtype, op, in_place, seed);
                    check_call(comm, &shapes, seed, pool)?;
                }
            }
        }
    }
    println!("checked {seed} calls");
    if pool {
        let stats = comm.pool_stats();
        ensure!(
            stats.hits > 0,
            "no allocation came from the pool: {stats:?}"
        );
        println!("pool hits {} misses {}", stats.hits, stats.misses);
    }
    Ok(())
}

/// Every rank's shape of a call (the v-collectives get uneven layouts drawn from `seed`, the
/// same on every rank).
#[allow(clippy::too_many_arguments)]
fn call_shapes(
    kind: CollKind,
    n: usize,
    count: usize,
    root: usize,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    seed: u64,
) -> Vec<Shape> {
    let base = Shape {
        in_place,
        ..Shape::new(kind, dtype, op, count, root, n)
    };
    let mut rng = Rng::new(seed);
    match kind {
        CollKind::AllGatherV => {
            let (recv_counts, recv_displs) = v_layout(n, count, &mut rng);
            let v = VLayout {
                recv_counts,
                recv_displs,
                ..VLayout::default()
            };
            vec![
                Shape {
                    v: Some(Arc::new(v)),
                    ..base
                };
                n
            ]
        }
        CollKind::AllToAllV => {
            let matrix = v_matrix(n, count, &mut rng);
            (0..n)
                .map(|r| {
                    let send_counts = matrix[r].clone();
                    let recv_counts: Vec<usize> = (0..n).map(|p| matrix[p][r]).collect();
                    let v = VLayout {
                        send_displs: v_displs(&send_counts, &mut rng),
                        recv_displs: v_displs(&recv_counts, &mut rng),
                        send_counts,
                        recv_counts,
                    };
                    Shape {
                        v: Some(Arc::new(v)),
                        in_place: false,
                        ..base.clone()
                    }
                })
                .collect()
        }
        _ => vec![base; n],
    }
}

/// Checks that this rank learns of a mismatch in the call itself (`res`) or, when its part
/// of the call only sent, at its next call on the communicator (a barrier of every rank;
/// with `HCOMM_ALGO=barrier:direct` every rank hears directly from every detecting rank).
fn expect_mismatch(comm: &Communicator, what: &str, res: hcomm::Result<()>) -> Result<()> {
    let now = match res {
        Err(Error::Mismatch(m)) => {
            println!("{what}: {m}");
            true
        }
        Ok(()) => false,
        Err(e) => bail!("{what}: expected Mismatch, got {e}"),
    };
    match comm.barrier() {
        Ok(()) if now => Ok(()),
        Ok(()) => bail!("{what}: this rank never learned of the mismatch"),
        Err(Error::Mismatch(m)) => {
            if !now {
                println!("{what} (reported by the next call): {m}");
            }
            Ok(())
        }
        Err(e) => bail!("{what}: the barrier after the mismatch gave {e}"),
    }
}

fn mismatch(comm: &Communicator) -> Result<()> {
    ensure!(comm.size() >= 2, "mismatch needs 2 ranks");
    let r = comm.rank();
    // Each case on its own communicator: news of one mismatch may still be travelling when
    // the ranks move on, and must not reach the next case.
    let c = comm.dup()?;
    let mut buf = vec![1.0f32; 64];
    let res = if r == 1 {
        c.allreduce_in_place(&mut buf[..32], ReduceOp::Sum)
    } else {
        c.allreduce_in_place(&mut buf, ReduceOp::Sum)
    };
    expect_mismatch(&c, "count", res)?;
    let c = comm.dup()?;
    let res = if r == 0 {
        c.broadcast(&mut buf, 0)
    } else {
        c.allreduce_in_place(&mut buf, ReduceOp::Sum)
    };
    expect_mismatch(&c, "collective", res)?;
    let c = comm.dup()?;
    let res = if r == 1 {
        let mut ints = vec![1i32; 64];
        c.allreduce_in_place(&mut ints, ReduceOp::Sum)
    } else {
        c.allreduce_in_place(&mut buf, ReduceOp::Sum)
    };
    expect_mismatch(&c, "type", res)?;
    let c = comm.dup()?;
    let res = c.broadcast(&mut buf, if r == 0 { 0 } else { 1 });
    expect_mismatch(&c, "root", res)?;
    let c = comm.dup()?;
    let mut big = vec![1u8; 1 << 20];
    let res = if r == 0 {
        c.allreduce_in_place(&mut big, ReduceOp::Max)
    } else {
        c.allreduce_in_place(&mut big, ReduceOp::Min)
    };
    expect_mismatch(&c, "op (large)", res)?;
    // The communicator that saw no mismatch still works.
    let mut ok = vec![1.0f32; 1000];
    comm.allreduce_in_place(&mut ok, ReduceOp::Sum)?;
    ensure!(
        ok.iter().all(|&x| x == comm.size() as f32),
        "allreduce after mismatches is wrong"
    );
    Ok(())
}

/// A count for a soak call: mostly small, sometimes up to `max`.
fn soak_count(rng: &mut Rng, max: usize) -> usize {
    let top = match rng.below(20) {
        0..=9 => 64,
        10..=15 => 4096,
        16..=18 => 65_536,
        _ => max,
    };
    rng.below(top.min(max) + 1)
}

/// Unix time in nanoseconds, to compare events of different processes of one machine.
fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn soak(world: &Communicator, calls: usize, seed: u64, max_count: usize) -> Result<()> {
    let (r, n) = (world.rank(), world.size());
    // Every rank makes every communicator (split is collective); a rank outside one gets
    // None and skips its calls. Calls on different communicators interleave in the one order
    // all ranks draw, so nobody waits for a rank that waits for it.
    let comms: Vec<(&str, Option<Communicator>)> = vec![
        ("world", Some(world.dup()?)),
        ("parity", world.split((r % 2) as i32, -(r as i32))?),
        (
            "lower half",
            world.split(if 2 * r < n { 0 } else { -1 }, r as i32)?,
        ),
        ("rotated", world.split(0, ((r + 1) % n) as i32)?),
    ];
    // Every rank draws the same soak calls from the same seed.
    let mut rng = Rng::new(seed);
    let mut done = vec![0u64; CollKind::ALL.len()];
    let t0 = Instant::now();
    let mut report = t0;
    for call in 0..calls {
        // The same draws on every rank, member or not.
        let (c, k, d, o) = (
            rng.below(comms.len()),
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
        );
        let (count, root, flags, salt) = (
            soak_count(&mut rng, max_count),
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
        );
        let (name, Some(comm)) = (comms[c].0, &comms[c].1) else {
            continue;
        };
        let kind = CollKind::ALL[k as usize % CollKind::ALL.len()];
        let dtype = DataType::ALL[d as usize % DataType::ALL.len()];
        let op = if kind.reduces() {
            ReduceOp::ALL[o as usize % ReduceOp::ALL.len()]
        } else {
            ReduceOp::Sum
        };
        let size = comm.size();
        let root = if kind.rooted() {
            root as usize % size
        } else {
            0
        };
        let in_place = flags & 1 == 1
            && !matches!(
                kind,
                CollKind::AllToAllV | CollKind::Broadcast | CollKind::Barrier
            );
        let pool = flags & 2 == 2;
        let shapes = call_shapes(kind, size, count, root, dtype, op, in_place, salt);
        check_call(comm, &shapes, salt, pool)
            .with_context(|| format!("soak call {call} (--seed {seed}) on {name}"))?;
        done[k as usize % CollKind::ALL.len()] += 1;
        if r == 0 && report.elapsed() > Duration::from_secs(30) {
            report = Instant::now();
            println!(
                "soak: {call} of {calls} calls, {:.0} s",
                t0.elapsed().as_secs_f64()
            );
        }
    }
    for (_, comm) in comms {
        if let Some(c) = comm {
            c.destroy()?;
        }
    }
    let per_kind: Vec<String> = CollKind::ALL
        .iter()
        .zip(&done)
        .map(|(k, d)| format!("{}={d}", k.name()))
        .collect();
    println!(
        "soak: {} calls checked on this rank of {calls} drawn (seed {seed}) in {:.1} s: {}",
        done.iter().sum::<u64>(),
        t0.elapsed().as_secs_f64(),
        per_kind.join(" ")
    );
    Ok(())
}

fn peer_loss(
    comm: Communicator,
    victims: &[usize],
    kill_after_ms: Option<u64>,
    pending: Pending,
    before: (usize, usize),
) -> Result<()> {
    let r = comm.rank();
    ensure!(
        victims.iter().all(|&v| v < comm.size()) && !victims.is_empty(),
        "--victims must name ranks below {}",
        comm.size()
    );
    ensure!(
        victims.len() < comm.size(),
        "somebody must survive to notice"
    );
    comm.barrier()?;
    println!("ready {}", unix_ns());
    let mut buf = vec![1.0f32; 1 << 16];
    if victims.contains(&r) {
        let Some(ms) = kill_after_ms else {
            // Wait to be killed from outside, taking part meanwhile.
            let until = Instant::now() + comm.config().timeout;
            while Instant::now() < until {
                match pending {
                    Pending::Allreduce => comm.allreduce_in_place(&mut buf, ReduceOp::Max)?,
                    Pending::Recv => std::thread::sleep(Duration::from_millis(50)),
                }
            }
            bail!("rank {r} of --victims was not killed");
        };
        std::thread::sleep(Duration::from_millis(ms));
        println!("killing {}", unix_ns());
        // SAFETY: kill has no memory-safety preconditions; it ends this process at once.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        bail!("SIGKILL did not arrive");
    }
    let err = match pending {
        Pending::Recv => {
            let mut byte = [0u8; 1];
            match comm.recv(&mut byte, victims[0], 99) {
                Ok(_) => bail!(
                    "received a message from rank {} that never sends",
                    victims[0]
                ),
                Err(e) => e,
            }
        }
        Pending::Allreduce => loop {
            if let Err(e) = comm.allreduce_in_place(&mut buf, ReduceOp::Max) {
                break e;
            }
        },
    };
    let at = unix_ns();
    match err {
        Error::PeerLost(_) | Error::Aborted(_) => {
            println!("lost {at} {:?}: {err}", err.code());
        }
        e => bail!("expected PeerLost or Aborted, got {e}"),
    }
    // The world has lost a rank: release it without the goodbye of destroy.
    nothing_left(comm, before)
}

fn abort(
    comm: Communicator,
    aborter: usize,
    pending: Pending,
    before: (usize, usize),
) -> Result<()> {
    let r = comm.rank();
    ensure!(
        aborter < comm.size() && comm.size() > 1,
        "--aborter must name a rank below {}, and somebody must wait",
        comm.size()
    );
    // Derived before the abort: not aborted with it.
    let spare = comm.dup()?;
    comm.barrier()?;
    println!("ready {}", unix_ns());
    let mut buf = vec![1.0f32; 1 << 16];
    let later = |comm: &Communicator| -> Result<()> {
        match comm.barrier() {
            Err(Error::Aborted(_)) => {}
            other => bail!("a call after the abort gave {other:?}, not Aborted"),
        }
        spare
            .barrier()
            .context("a communicator duplicated before the abort")
    };
    if r == aborter {
        // Another thread of the aborter waits on the communicator too: the abort ends it.
        let peer = (r + 1) % comm.size();
        std::thread::scope(|s| -> Result<()> {
            let waiter = s.spawn(|| {
                let mut byte = [0u8; 1];
                comm.recv(&mut byte, peer, 98)
            });
            std::thread::sleep(Duration::from_millis(300));
            println!("aborting {}", unix_ns());
            comm.abort()?;
            comm.abort()?;
            match waiter.join() {
                Ok(Err(Error::Aborted(m))) if m.contains("this rank aborted") => Ok(()),
                Ok(other) => bail!("the aborter's other thread got {other:?}, not Aborted"),
                Err(_) => bail!("the aborter's other thread panicked"),
            }
        })?;
        later(&comm)?;
        drop(spare);
        std::thread::sleep(Duration::from_secs(1));
        nothing_left(comm, before)?;
        bail!("rank {r} aborted the world on purpose");
    }
    let err = match pending {
        Pending::Recv => {
            let mut byte = [0u8; 1];
            match comm.recv(&mut byte, aborter, 99) {
                Ok(_) => bail!("received a message from rank {aborter} that never sends"),
                Err(e) => e,
            }
        }
        Pending::Allreduce => loop {
            if let Err(e) = comm.allreduce_in_place(&mut buf, ReduceOp::Max) {
                break e;
            }
        },
    };
    let at = unix_ns();
    let named = format!("world rank {aborter} aborted");
    match &err {
        Error::Aborted(m) if m.contains(&named) => println!("aborted {at} {:?}: {err}", err.code()),
        e => bail!("expected Aborted naming rank {aborter}, got {e}"),
    }
    later(&comm)?;
    drop(spare);
    nothing_left(comm, before)
}

fn deterministic(comm: &Communicator) -> Result<()> {
    ensure!(
        comm.config().deterministic,
        "run with HCOMM_DETERMINISTIC=1"
    );
    let n = comm.size();
    let mut seed = 7u64;
    for kind in [
        CollKind::AllReduce,
        CollKind::Reduce,
        CollKind::ReduceScatter,
    ] {
        for dtype in [
            DataType::Float32,
            DataType::Float64,
            DataType::Float16,
            DataType::Bfloat16,
        ] {
            for count in [1usize, 999, 65_537] {
                seed += 1;
                let shapes =
                    vec![Shape::new(kind, dtype, ReduceOp::Sum, count, seed as usize % n, n); n];
                // Values of mixed magnitude and sign: sums depend on the order of additions.
                let gen = |r: usize, len: usize, salt: u64| -> Vec<u8> {
                    let mut out = Vec::with_capacity(len);
                    for i in 0..len / dtype.size() {
                        let x = ((r as u64 * 31 + i as u64 * 17 + salt + seed) as f64 * 0.618)
                            .sin()
                            * 10f64.powi(((i + r) % 7) as i32 - 3);
                        match dtype {
                            DataType::Float32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
                            DataType::Float64 => out.extend_from_slice(&x.to_le_bytes()),
                            DataType::Float16 => {
                                out.extend_from_slice(&half::f16::from_f64(x).to_le_bytes())
                            }
                            _ => out.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
                        }
                    }
                    out
                };
                let sends: Vec<Vec<u8>> = shapes
                    .iter()
                    .enumerate()
                    .map(|(r, s)| gen(r, s.send_bytes(r), 1))
                    .collect();
                let recvs: Vec<Vec<u8>> = shapes
                    .iter()
                    .enumerate()
                    .map(|(r, s)| gen(r, s.recv_bytes(r), 2))
                    .collect();
                let want = hcomm::coll::reference::expected(&shapes, &sends, &recvs);
                let r = comm.rank();
                let mut recv = recvs[r].clone();
                comm.run_collective(shapes[r].clone(), Some(&sends[r]), &mut recv)?;
                ensure!(
                    recv == want[r],
                    "{} {} x {}: not bitwise equal to the rank-order reference",
                    kind.name(),
                    count,
                    dtype.name()
                );
            }
        }
    }
    Ok(())
}

fn overlap(comm: &Communicator) -> Result<()> {
    let n = comm.size();
    let other = comm.dup()?;
    // Opposite orders on alternate ranks would deadlock if the two did not progress together.
    let a = hcomm::coll::Shape::new(
        CollKind::AllReduce,
        DataType::Float32,
        ReduceOp::Sum,
        1 << 18,
        0,
        n,
    );
    let mk = |v: f32| -> Vec<u8> { bytemuck::cast_slice(&vec![v; a.count]).to_vec() };
    let (ra, rb) = if comm.rank() % 2 == 0 {
        let ra = comm.iallreduce(mk(1.0), DataType::Float32, ReduceOp::Sum)?;
        let rb = other.iallreduce(mk(2.0), DataType::Float32, ReduceOp::Sum)?;
        (ra, rb)
    } else {
        let rb = other.iallreduce(mk(2.0), DataType::Float32, ReduceOp::Sum)?;
        let ra = comm.iallreduce(mk(1.0), DataType::Float32, ReduceOp::Sum)?;
        (ra, rb)
    };
    let (a_out, b_out) = (rb.wait()?, ra.wait()?);
    let fa: &[f32] = bytemuck::cast_slice(&b_out.buffer);
    let fb: &[f32] = bytemuck::cast_slice(&a_out.buffer);
    ensure!(
        fa.iter().all(|&x| x == n as f32) && fb.iter().all(|&x| x == 2.0 * n as f32),
        "overlapped allreduces are wrong"
    );
    // Any collective can start in the background: an all-gather overlapping a barrier on
    // the other communicator.
    let g = Shape::new(CollKind::AllGather, DataType::Int32, ReduceOp::Sum, 3, 0, n);
    let mine: Vec<u8> = bytemuck::cast_slice(&[comm.rank() as i32; 3]).to_vec();
    let req = comm.start_collective(g.clone(), Some(mine), vec![0u8; g.recv_bytes(comm.rank())])?;
    other.barrier()?;
    let got = req.wait()?;
    let ints: &[i32] = bytemuck::cast_slice(&got.buffer);
    ensure!(
        ints.chunks(3)
            .enumerate()
            .all(|(p, c)| c.iter().all(|&x| x == p as i32)),
        "nonblocking allgather is wrong"
    );
    // A batch of 1000 small all-reduces equals 1000 separate ones.
    let mut bufs: Vec<Vec<f32>> = (0..1000)
        .map(|i| vec![(comm.rank() + i) as f32; 8])
        .collect();
    let mut batch = comm.batch();
    for b in bufs.iter_mut() {
        batch.allreduce(b, ReduceOp::Sum);
    }
    batch.run()?;
    for (i, b) in bufs.iter().enumerate() {
        let want = (0..n).map(|r| (r + i) as f32).sum::<f32>();
        ensure!(
            b.iter().all(|&x| x == want),
            "batched allreduce {i} is wrong"
        );
    }
    Ok(())
}

/// The `observe` scenario: checked all-reduces; `late` = (rank, call, delay): that rank
/// comes to that call that late.
fn observe(
    comm: &Communicator,
    calls: usize,
    count: usize,
    pause_ms: u64,
    late: Option<(usize, usize, Duration)>,
) -> Result<()> {
    use std::io::Write as _;
    println!("pid {}", std::process::id());
    std::io::stdout().flush()?;
    let n = comm.size() as f32;
    for call in 0..calls {
        if let Some((_, _, delay)) = late.filter(|&(r, c, _)| (r, c) == (comm.rank(), call)) {
            std::thread::sleep(delay);
        }
        let mut buf = vec![(comm.rank() + call) as f32; count];
        comm.allreduce_in_place(&mut buf, ReduceOp::Sum)?;
        // Rank r contributes r + call: the sum is n(n-1)/2 + n * call.
        let want = n * (n - 1.0) / 2.0 + n * call as f32;
        ensure!(
            buf.iter().all(|&x| x == want),
            "all-reduce {call}: got {:?}, expected {want}",
            buf.first()
        );
        if pause_ms > 0 {
            std::thread::sleep(Duration::from_millis(pause_ms));
        }
    }
    Ok(())
}

fn run(scenario: Scenario) -> Result<()> {
    let before = footprint()?;
    let comm = Communicator::init().context("init")?;
    let name = match scenario {
        Scenario::Hello => {
            println!(
                "rank {} of {} local {} of {} launcher {:?}",
                comm.rank(),
                comm.size(),
                comm.local_rank(),
                comm.local_size(),
                comm.config().launch.launcher
            );
            comm.barrier()?;
            "hello"
        }
        Scenario::Ring { max_size } => {
            ring(&comm, max_size)?;
            "ring"
        }
        Scenario::AllPairs { max_size } => {
            let threads = std::fs::read_dir("/proc/self/task")?.count();
            println!("listening {} threads {threads}", listening_sockets()?);
            all_pairs(&comm, max_size)?;
            "all-pairs"
        }
        Scenario::Tags => {
            tags(&comm)?;
            "tags"
        }
        Scenario::Truncate => {
            truncate(&comm)?;
            "truncate"
        }
        Scenario::Timeout => {
            timeout(&comm)?;
            "timeout"
        }
        Scenario::Split => {
            split(&comm)?;
            "split"
        }
        Scenario::Progress => {
            progress(&comm)?;
            "progress"
        }
        Scenario::Collectives {
            max_count,
            only,
            pool,
        } => {
            collectives(&comm, max_count, only.as_deref(), pool)?;
            "collectives"
        }
        Scenario::Mismatch => {
            mismatch(&comm)?;
            "mismatch"
        }
        Scenario::AlgoMismatch => {
            let mut buf = vec![1.0f32; 4096];
            let res = comm.allreduce_in_place(&mut buf, ReduceOp::Sum);
            expect_mismatch(&comm, "algorithm", res)?;
            "algo-mismatch"
        }
        Scenario::Deterministic => {
            deterministic(&comm)?;
            "deterministic"
        }
        Scenario::Overlap => {
            overlap(&comm)?;
            "overlap"
        }
        Scenario::Lifecycle => return lifecycle(comm).map(|()| println!("OK lifecycle")),
        Scenario::Soak {
            calls,
            seed,
            max_count,
        } => {
            soak(&comm, calls, seed, max_count)?;
            "soak"
        }
        Scenario::PeerLoss {
            victims,
            kill_after_ms,
            pending,
        } => {
            return peer_loss(comm, &victims, kill_after_ms, pending, before)
                .map(|()| println!("OK peer-loss"));
        }
        Scenario::Observe {
            calls,
            count,
            pause_ms,
            late,
            late_ms,
            late_call,
        } => {
            let late = late.map(|rank| (rank, late_call, Duration::from_millis(late_ms)));
            observe(&comm, calls, count, pause_ms, late)?;
            "observe"
        }
        Scenario::Abort { aborter, pending } => {
            return abort(comm, aborter, pending, before).map(|()| println!("OK abort"));
        }
        Scenario::Protocols => {
            let c = comm.config();
            let (eager, push) = (c.shm_eager_limit, c.shm_push_threshold);
            let mut sizes = vec![0, 1, eager, eager + 1, push, push + 1, 3 * push + 5];
            sizes.retain(|&s| s <= 64 << 20);
            ring_sizes(&comm, sizes)?;
            let s = comm.protocol_stats();
            let right = (comm.rank() + 1) % comm.size();
            println!(
                "protocols shm={} shm_eager={} shm_pull={} shm_push={} tcp_eager={} tcp_rendezvous={}",
                comm.uses_shm(right),
                s.shm_eager,
                s.shm_pull,
                s.shm_push,
                s.tcp_eager,
                s.tcp_rendezvous
            );
            "protocols"
        }
        Scenario::Wakeups => {
            let c = comm.config();
            let sizes = [8, c.shm_eager_limit + 1, c.shm_push_threshold + 1];
            let me = comm.rank();
            for (round, &len) in sizes.iter().enumerate() {
                for _ in 0..50 {
                    let mut got = vec![0u8; len];
                    match me {
                        0 => {
                            comm.send(&fill(0, 1, round, len), 1, 9)?;
                            comm.recv(&mut got, 1, 9)?;
                            verify(&got, 1, 0, round)?;
                        }
                        1 => {
                            comm.recv(&mut got, 0, 9)?;
                            verify(&got, 0, 1, round)?;
                            comm.send(&fill(1, 0, round, len), 0, 9)?;
                        }
                        _ => {}
                    }
                }
            }
            let s = comm.protocol_stats();
            println!("wakeups naps={} full_naps={}", s.naps, s.full_naps);
            ensure!(
                s.full_naps == 0,
                "{} of {} sleeps were never woken: a lost wake-up",
                s.full_naps,
                s.naps
            );
            "wakeups"
        }
        Scenario::Kill { pool } => {
            comm.barrier()?;
            if comm.rank() == 1 {
                let held = if pool {
                    let b = comm.alloc::<u8>(1 << 20)?;
                    ensure!(b.in_pool(), "the pool did not serve 1 MiB");
                    Some(b)
                } else {
                    None
                };
                // SAFETY: raise has no memory preconditions; SIGKILL ends this process here.
                unsafe { libc::raise(libc::SIGKILL) };
                std::thread::sleep(std::time::Duration::from_secs(10));
                drop(held);
                bail!("SIGKILL did not arrive");
            }
            let mut buf = vec![1.0f32; 1 << 16];
            for i in 0..100_000 {
                comm.allreduce_in_place(&mut buf, ReduceOp::Max)
                    .with_context(|| format!("allreduce {i}"))?;
            }
            "kill"
        }
        Scenario::CollExit => {
            let mut buf = vec![1.0f32; 1 << 18];
            for i in 0..1000 {
                if comm.rank() == 1 && i == 10 {
                    std::process::exit(3);
                }
                comm.allreduce_in_place(&mut buf, ReduceOp::Max)
                    .with_context(|| format!("allreduce {i}"))?;
            }
            "coll-exit"
        }
        Scenario::Exit => {
            if comm.rank() == 1 {
                std::process::exit(3);
            }
            let mut buf = [0u8; 1];
            comm.recv(&mut buf, 1, 0).context("waiting for rank 1")?;
            "exit"
        }
    };
    comm.destroy()?;
    println!("OK {name}");
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args.scenario) {
        let rank = std::env::var("HCOMM_RANK").unwrap_or_else(|_| "?".into());
        eprintln!("hcomm_check (rank {rank}): FAILED: {e:#}");
        std::process::exit(1);
    }
}
