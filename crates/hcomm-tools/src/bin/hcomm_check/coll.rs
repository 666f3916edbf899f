//! Collective scenarios: every call checked against the sequential reference, mismatched
//! calls, determinism, two communicators progressing together and observed calls.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use hcomm::internal::coll::random::shapes;
use hcomm::{CollKind, Shape};
use hcomm::{Communicator, DataType, Error, ReduceOp};

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
pub(super) fn check_call(
    comm: &Communicator,
    shapes: &[Shape],
    seed: u64,
    pool: bool,
) -> Result<()> {
    let r = comm.rank();
    let (sends, recvs) = inputs(shapes, seed);
    let want = hcomm::internal::coll::reference::expected(shapes, &sends, &recvs);
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

pub(super) fn collectives(
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
                .filter(|&(d, o)| o.supports(d))
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
                    let shapes = shapes(kind, n, count, root, dtype, op, in_place, seed);
                    check_call(comm, &shapes, seed, pool)?;
                }
            }
        }
    }
    println!("checked {seed} calls");
    println!("staged {}", comm.protocol_stats().shm_staged);
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

/// Messages `comm`'s rank sent eagerly, pushed or pulled (a pull counts where it is made).
fn messages_moved(comm: &Communicator) -> u64 {
    let s = comm.protocol_stats();
    s.shm_eager + s.shm_pull + s.shm_push + s.tcp_eager + s.tcp_rendezvous
}

/// Every rank's shape of call `seed` of `kind` on `n` ranks: `count` Int32 elements, summed,
/// in place or not, the root drawn from the seed.
pub(super) fn int32_shapes(
    kind: CollKind,
    n: usize,
    count: usize,
    in_place: bool,
    seed: u64,
) -> Vec<Shape> {
    let root = seed as usize % n;
    shapes(
        kind,
        n,
        count,
        root,
        DataType::Int32,
        ReduceOp::Sum,
        in_place,
        seed,
    )
}

/// The collectives with a one-sided form.
const ONE_SIDED_KINDS: [CollKind; 8] = [
    CollKind::AllToAll,
    CollKind::Scatter,
    CollKind::AllGather,
    CollKind::Gather,
    CollKind::Broadcast,
    CollKind::AllReduce,
    CollKind::ReduceScatter,
    CollKind::Reduce,
];

/// The `one-sided --nodump-mid RANK` scenario (see its description in `main.rs`).
pub(super) fn one_sided_midcall(comm: &Communicator, rank: usize) -> Result<()> {
    let n = comm.size();
    ensure!(
        rank < n,
        "--nodump-mid {rank}: no such rank in a world of {n}"
    );
    let mut seed = 5000;
    for kind in ONE_SIDED_KINDS {
        for in_place in [false, true] {
            if in_place && kind == CollKind::Broadcast {
                continue;
            }
            seed += 1;
            let shapes = int32_shapes(kind, n, 262_147, in_place, seed);
            // A fresh one-sided state, made while every rank is dumpable.
            let dup = comm.dup()?;
            dup.barrier()?;
            let before = messages_moved(&dup);
            if comm.rank() == rank {
                hcomm::internal::shm::arm_nondumpable();
            }
            let outcome = match check_call(&dup, &shapes, seed, false) {
                Ok(()) => "ok",
                Err(e) if in_place && format!("{e:#}").contains("called it in place") => "refused",
                Err(e) => return Err(e),
            };
            let moved = messages_moved(&dup) - before;
            let way = if in_place { "in-place" } else { "out-of-place" };
            println!("midcall {} {way} {outcome} moved {moved}", kind.name());
            if comm.rank() == rank {
                rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)
                    .context("prctl(PR_SET_DUMPABLE, 1)")?;
            }
            comm.barrier()?;
        }
    }
    Ok(())
}

/// The `one-sided` scenario (see `Scenario::OneSided`).
pub(super) fn one_sided(comm: &Communicator) -> Result<()> {
    let n = comm.size();
    let kinds = ONE_SIDED_KINDS;
    let counted = |comm: &Communicator| -> u64 {
        comm.collective_counts()
            .iter()
            .filter(|(kind, algo, _)| kinds.contains(kind) && *algo == "onesided")
            .map(|&(_, _, c)| c)
            .sum()
    };
    // The first collective of a communicator makes its one-sided state, with messages.
    comm.barrier()?;
    let (calls_before, moved_before) = (counted(comm), messages_moved(comm));
    let mut calls = 0;
    let mut seed = 1000;
    for kind in kinds {
        // Int32 elements: blocks of 3 KiB + 4 B (all-to-all and scatter contributions beyond
        // 8 KiB from 3 ranks on, which read buffers in place), 16 KiB + 4 B (fits a slot but
        // read in place, not copied into it), 40 KiB + 4 B (beyond a slot), 128 KiB and
        // 128 KiB + 4 B (the largest all-to-all blocks written whole into the peers, and the
        // smallest split) and 1 MiB + 12 B (several cache-sized pieces); odd counts split
        // unevenly.
        for count in [769, 4_097, 10_241, 32_768, 32_769, 262_147] {
            for in_place in [false, true] {
                if in_place && kind == CollKind::Broadcast {
                    continue;
                }
                seed += 1;
                let shapes = int32_shapes(kind, n, count, in_place, seed);
                check_call(comm, &shapes, seed, false)?;
                calls += 1;
            }
        }
    }
    println!(
        "onesided calls {} of {calls} messages {}",
        counted(comm) - calls_before,
        messages_moved(comm) - moved_before
    );
    Ok(())
}

/// All-reduce and broadcast on pool buffers of `bytes` bytes, twice (the second round on
/// fresh buffers must reuse the first round's blocks); every element checked. With `heap`
/// the pool must miss, and the buffers come from the heap.
pub(super) fn big_pool(comm: &Communicator, bytes: usize, heap: bool) -> Result<()> {
    let (n, r) = (comm.size(), comm.rank());
    let count = bytes / 4;
    // Small integers: every sum is exact in float32.
    let value = |rank: usize, i: usize| ((i * 7 + rank * 3) % 1000) as f32;
    let mut blocks = 0;
    for round in 0..2 {
        let mut send = comm.alloc::<f32>(count)?;
        let mut recv = comm.alloc::<f32>(count)?;
        ensure!(
            [send.in_pool(), recv.in_pool()] == [!heap; 2],
            "round {round}: {bytes} bytes in the pool: {}, {}, expected {}: {:?}",
            send.in_pool(),
            recv.in_pool(),
            !heap,
            comm.pool_stats()
        );
        for (i, v) in send.iter_mut().enumerate() {
            *v = value(r, i);
        }
        comm.allreduce(&send, &mut recv, ReduceOp::Sum)
            .context("allreduce")?;
        let wrong = (0..count).find(|&i| recv[i] != (0..n).map(|p| value(p, i)).sum::<f32>());
        ensure!(
            wrong.is_none(),
            "round {round}: allreduce wrong at {wrong:?}"
        );
        let root = round % n;
        for (i, v) in recv.iter_mut().enumerate() {
            *v = if r == root {
                value(root, i) + 1.0
            } else {
                -1.0
            };
        }
        comm.broadcast(&mut recv, root).context("broadcast")?;
        let wrong = (0..count).find(|&i| recv[i] != value(root, i) + 1.0);
        ensure!(
            wrong.is_none(),
            "round {round}: broadcast wrong at {wrong:?}"
        );
        comm.barrier()?;
        let stats = comm.pool_stats();
        if round == 0 {
            blocks = stats.blocks;
        } else {
            ensure!(
                stats.blocks == blocks,
                "the second round made new blocks: {blocks} then {}",
                stats.blocks
            );
        }
        println!(
            "round {round}: pool hits {} misses {} blocks {} high water {}",
            stats.hits, stats.misses, stats.blocks, stats.high_water
        );
    }
    Ok(())
}

/// Checks that this rank learns of a mismatch in the call itself (`res`) or, when its part
/// of the call only sent, at its next call on the communicator (a barrier of every rank;
/// with `HCOMM_ALGO=barrier:direct` every rank hears directly from every detecting rank).
pub(super) fn expect_mismatch(
    comm: &Communicator,
    what: &str,
    res: hcomm::Result<()>,
) -> Result<()> {
    let now = mismatched_now(what, res)?;
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

/// Whether `res`, the call of the case `what`, failed with the mismatch itself (printed), or
/// returned (`false`); any other error fails the check.
fn mismatched_now(what: &str, res: hcomm::Result<()>) -> Result<bool> {
    match res {
        Err(Error::Mismatch(m)) => {
            println!("{what}: {m}");
            Ok(true)
        }
        Ok(()) => Ok(false),
        Err(e) => bail!("{what}: expected Mismatch, got {e}"),
    }
}

/// Tiny one-sided calls of the ranks that return without waiting for their peers when they
/// have a core each (a gather's other ranks, a reduce's), mismatched: on `c` (a fresh
/// communicator), then on another one made from `comm`.
fn tiny_one_sided_mismatches(comm: &Communicator, c: &Communicator) -> Result<()> {
    let r = comm.rank();
    let mut small = [1.0f32; 2];
    let mut all = vec![0.0f32; 2 * comm.size()];
    let res = c.gather(&small, &mut all, if r == 0 { 0 } else { 1 });
    expect_mismatch(c, "tiny gather root", res)?;
    let c = comm.dup()?;
    let res = if r == 0 {
        c.broadcast(&mut small, 0)
    } else {
        let mine = small;
        c.reduce(&mine, &mut small, ReduceOp::Sum, 0)
    };
    // With a core per rank every rank returns at once and learns of the mismatch at the next
    // one-sided call; with more ranks than cores nobody returns early, and the call itself
    // fails.
    let early = !mismatched_now("tiny broadcast against reduce", res)?;
    match (early, c.allreduce_in_place(&mut small, ReduceOp::Sum)) {
        (true, Err(Error::Mismatch(m))) => println!("tiny, found by the next one-sided call: {m}"),
        (false, Ok(())) => {}
        (_, other) => bail!(
            "tiny broadcast against reduce (returned early: {early}): the next call gave {other:?}"
        ),
    }
    Ok(())
}

pub(super) fn mismatch(comm: &Communicator) -> Result<()> {
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
    // Tiny calls whose root (a broadcast's) or other ranks (a gather's, a reduce's) return
    // without waiting for the peers: such a rank learns of the mismatch at its next call,
    // one that ran its schedule (the barrier) or a one-sided one.
    let mut small = [1.0f32; 2];
    let c = comm.dup()?;
    let res = if r == 0 {
        c.broadcast(&mut small, 0)
    } else {
        c.allreduce_in_place(&mut small, ReduceOp::Sum)
    };
    expect_mismatch(&c, "tiny collective", res)?;
    let c = comm.dup()?;
    let res = c.broadcast(&mut small, if r == 0 { 0 } else { 1 });
    expect_mismatch(&c, "tiny root", res)?;
    // Inside one host only (the calls run one-sided): between hosts a gather root that
    // nobody sends to cannot learn that the others took another root, and the ranks of a
    // reduce tree hear of the broadcast's messages in the call itself.
    let c = comm.dup()?;
    if c.algorithm_for(CollKind::Gather, DataType::Float32, ReduceOp::Sum, 2, 0) == "onesided" {
        tiny_one_sided_mismatches(comm, &c)?;
    }
    // The communicator that saw no mismatch still works.
    let mut ok = vec![1.0f32; 1000];
    comm.allreduce_in_place(&mut ok, ReduceOp::Sum)?;
    ensure!(
        ok.iter().all(|&x| x == comm.size() as f32),
        "allreduce after mismatches is wrong"
    );
    Ok(())
}

pub(super) fn deterministic(comm: &Communicator) -> Result<()> {
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
                let want = hcomm::internal::coll::reference::expected(&shapes, &sends, &recvs);
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

pub(super) fn overlap(comm: &Communicator) -> Result<()> {
    let n = comm.size();
    let other = comm.dup()?;
    // Opposite orders on alternate ranks would deadlock if the two did not progress together.
    let a = hcomm::Shape::new(
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
pub(super) fn observe(
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

/// See `Scenario::Stuck`.
pub(super) fn stuck(
    comm: &Communicator,
    skip: usize,
    at: usize,
    hold: Duration,
    mismatch: bool,
) -> Result<()> {
    let n = comm.size() as i64;
    for call in 0..at {
        let mut buf = vec![comm.rank() as i64 + call as i64; 16];
        comm.allreduce_in_place(&mut buf, ReduceOp::Sum)?;
        let want = n * (n - 1) / 2 + n * call as i64;
        ensure!(
            buf.iter().all(|&x| x == want),
            "all-reduce {call}: got {:?}, expected {want}",
            buf.first()
        );
    }
    let mut buf = vec![1i64; 16];
    let result = if comm.rank() == skip && mismatch {
        comm.broadcast(&mut buf, 0)
    } else if comm.rank() == skip {
        std::thread::sleep(hold);
        Ok(())
    } else {
        comm.allreduce_in_place(&mut buf, ReduceOp::Sum)
    };
    match result {
        Err(e) if mismatch => {
            println!("mismatched {e}");
            ensure!(
                matches!(e, Error::Mismatch(_)),
                "expected a mismatch, got {e}"
            );
        }
        Err(e) => {
            let ne = e
                .not_entered()
                .with_context(|| format!("the error names no rank that never entered: {e}"))?;
            let ranks: Vec<usize> = ne.ranks.iter().filter_map(|p| p.comm).collect();
            println!(
                "not-entered {} {} {ranks:?} {e}",
                ne.operation.name,
                ne.operation.seq.unwrap_or(u64::MAX)
            );
            ensure!(ranks == [skip], "expected rank {skip} alone: {e}");
            ensure!(
                ne.operation.seq == Some(at as u64),
                "expected call {at}: {e}"
            );
        }
        Ok(()) => ensure!(
            comm.rank() == skip && !mismatch,
            "call {at} completed without rank {skip}"
        ),
    }
    // The others dumped when their call timed out or was abandoned; the skipping rank, and
    // every rank of a mismatch, dump through the API.
    if comm.rank() == skip || mismatch {
        let path = comm.dump_trace()?;
        println!("dumped {}", path.display());
    }
    Ok(())
}
