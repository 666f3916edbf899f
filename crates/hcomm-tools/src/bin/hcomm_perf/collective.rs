//! Collectives: every rank takes part, rank 0 prints.
//!
//! Every rank runs the same sweep. Before it starts, the ranks compare a fingerprint of their
//! arguments and settings (one all-reduce), so that ranks started differently fail with a
//! clear message instead of a mismatch or a hang. Per size: the buffers are allocated and
//! the ranks agree that every allocation worked (all-reduce), the warm-up runs, the ranks
//! agree on the number of timed iterations from the slowest rank's warm-up (all-reduce,
//! max), a barrier, the timed iterations (each timed on its own, back to back), the checked
//! iterations, then an all-reduce (max) of the ranks' medians and one (sum) of their wrong
//! elements. None of these extra calls is timed.

use anyhow::{anyhow, bail, Context as _};
use hcomm::internal::coll::algos::onesided::OneSided;
use hcomm::internal::coll::select::Selector;
use hcomm::internal::coll::{algos, reference, Algorithm};
use hcomm::{CollKind, Shape};
use hcomm::{Communicator, DataType, ReduceOp};

use super::{measure, CollArgs, Outcome, Report, Row, Traffic};

/// The collectives hcomm_perf measures, in the order `all` runs them.
pub(super) const KINDS: [CollKind; 8] = [
    CollKind::AllReduce,
    CollKind::Broadcast,
    CollKind::Reduce,
    CollKind::AllGather,
    CollKind::ReduceScatter,
    CollKind::AllToAll,
    CollKind::Gather,
    CollKind::Scatter,
];

/// Salts of the generated send and receive buffers (the receive buffer is the input of
/// in-place calls, and what bytes a call does not write keep).
const SALT_SEND: u64 = 1;
const SALT_RECV: u64 = 2;
/// Seed of the timed iterations' data; the checked iterations use 0, 1, ...
const SEED_TIMING: u64 = 0x7469_6d65;
/// About this many bytes per rank and buffer go into one piece of the reference
/// computation, so checking needs little memory beyond the buffers themselves.
const CHECK_PIECE_BYTES: usize = 1 << 20;

/// nccl-tests' bus bandwidth factor of `kind` on `n` ranks.
pub(super) fn bus_factor(kind: CollKind, n: usize) -> f64 {
    let n = n as f64;
    match kind {
        CollKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::AllToAll
        | CollKind::Gather
        | CollKind::Scatter => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// How the factor is written in the header.
fn bus_factor_text(kind: CollKind) -> &'static str {
    match kind {
        CollKind::AllReduce => "2(n-1)/n",
        CollKind::Broadcast | CollKind::Reduce => "1",
        _ => "(n-1)/n",
    }
}

/// Whether nccl-tests' size of `kind` covers n blocks (so it is rounded to n elements).
fn blocked(kind: CollKind) -> bool {
    matches!(
        kind,
        CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter
    )
}

/// What the size column means for `kind`.
fn size_meaning(kind: CollKind) -> &'static str {
    match kind {
        CollKind::AllReduce | CollKind::Reduce => "each rank's buffer",
        CollKind::Broadcast => "the buffer",
        CollKind::AllToAll => "each rank's send buffer (n blocks)",
        CollKind::AllGather => "each rank's whole output (n blocks)",
        CollKind::Gather => "the root's whole output (n blocks)",
        CollKind::ReduceScatter => "each rank's whole input (n blocks)",
        CollKind::Scatter => "the root's whole input (n blocks)",
        _ => "the buffer",
    }
}

/// One size of the sweep as nccl-tests counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    /// The size column: bytes, rounded down to whole elements (and blocks).
    pub size: u64,
    /// The count column: elements in `size`.
    pub count: u64,
    /// `Shape::count`: elements per buffer, or per block of blocked collectives.
    pub shape_count: usize,
}

/// The layout of `size` requested bytes of `kind` on `n` ranks; `None` when it holds no
/// element (or no element per block), a row nccl-tests skips too.
pub(super) fn layout(kind: CollKind, dtype: DataType, n: usize, size: u64) -> Option<Layout> {
    let elem = dtype.size() as u64;
    let total = size / elem;
    let (count, per) = if blocked(kind) {
        let n = n.max(1) as u64;
        let c = total - total % n;
        (c, c / n)
    } else {
        (total, total)
    };
    if count == 0 {
        return None;
    }
    Some(Layout {
        size: count * elem,
        count,
        shape_count: usize::try_from(per).ok()?,
    })
}

/// The `HCOMM_ALGO` value for `--algo name` on `kinds`, after the environment's own
/// value `env` (later entries win). A bare name applies to every collective of the run
/// that has an algorithm of that name; a value with ':' is taken as written.
pub(super) fn algo_spec(
    kinds: &[CollKind],
    name: &str,
    env: Option<&str>,
) -> Result<String, String> {
    let name = name.trim();
    let ours = if name.contains(':') {
        name.to_string()
    } else {
        let entries: Vec<String> = kinds
            .iter()
            .filter(|k| algos::names_for(**k).contains(&name))
            .map(|k| format!("{}:{name}", k.name()))
            .collect();
        if entries.is_empty() {
            let mut valid: Vec<&str> = kinds.iter().flat_map(|k| algos::names_for(*k)).collect();
            valid.sort_unstable();
            valid.dedup();
            let which: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
            return Err(format!(
                "--algo {name:?}: no algorithm of that name implements {}; valid: {}",
                which.join(", "),
                valid.join(", ")
            ));
        }
        entries.join(",")
    };
    Ok(match env.map(str::trim).filter(|e| !e.is_empty()) {
        Some(e) => format!("{e},{ours}"),
        None => ours,
    })
}

/// A fingerprint of everything that must be equal on every rank for the sweeps to match.
pub(super) fn fingerprint(
    kinds: &[CollKind],
    args: &CollArgs,
    sizes: &[u64],
    algo: Option<&str>,
    deterministic: bool,
) -> u64 {
    let s = &args.sweep;
    let mut words: Vec<u64> = kinds.iter().map(|k| *k as u64).collect();
    words.extend([
        args.dtype as u64,
        args.op as u64,
        args.root as u64,
        u64::from(args.in_place),
        u64::from(args.all_algos),
        u64::from(deterministic),
        s.check,
        s.iters.unwrap_or(0),
        s.warmup.unwrap_or(u64::MAX),
        s.time_target.to_bits(),
        s.max_iters,
        sizes.len() as u64,
    ]);
    words.extend_from_slice(sizes);
    words.extend(algo.unwrap_or("").bytes().map(u64::from));
    words.iter().fold(0x6863_6f6d_6d5f_636f, |h, &w| {
        hcomm_tools::pattern::mix(h ^ w)
    })
}

/// Compares this rank's fingerprint with every other rank's, and tells whether every rank
/// is `ok`. Every rank reaches the same verdict, so none is left waiting.
fn agree(comm: &Communicator, ok: bool, fp: u64) -> anyhow::Result<bool> {
    let mine = [u64::from(ok), fp, !fp];
    let mut all = [0u64; 3];
    comm.allreduce(&mine, &mut all, ReduceOp::Min)
        .context("comparing the ranks' arguments")?;
    // The minimum of !fp is !(the maximum of fp).
    if all[1] != fp || !all[2] != fp {
        bail!(
            "the ranks were started with different arguments or settings (type, op, root, \
             sizes, iterations, checks, --in-place, --algo/HCOMM_ALGO, \
             HCOMM_DETERMINISTIC): start every rank with the same ones"
        );
    }
    Ok(all[0] == 1)
}

/// Whether every rank is `ok` (one all-reduce).
fn all_ok(comm: &Communicator, ok: bool) -> anyhow::Result<bool> {
    let mut all = [0u64];
    comm.allreduce(&[u64::from(ok)], &mut all, ReduceOp::Min)
        .context("synchronizing with the other ranks")?;
    Ok(all[0] == 1)
}

/// Rank 0's report, and this rank's first error, which the other ranks learn of at the
/// next agreement (so that none is left waiting).
struct Sink {
    report: Option<Report>,
    pending: Option<anyhow::Error>,
}

impl Sink {
    /// Runs `f` on the report (rank 0); an error becomes pending.
    fn with_report(&mut self, f: impl FnOnce(&mut Report) -> anyhow::Result<()>) {
        if let Some(rep) = &mut self.report {
            if let Err(e) = f(rep) {
                self.pending.get_or_insert(e);
            }
        }
    }
}

/// Runs the sweep of every collective of `kinds` on this rank: with the algorithms
/// `comm`'s settings choose, or (`-a`) once with each algorithm of each collective.
pub(super) fn run(
    comm: &Communicator,
    kinds: &[CollKind],
    args: &CollArgs,
    sizes: &[u64],
) -> anyhow::Result<Outcome> {
    let n = comm.size();
    let rank = comm.rank();
    if kinds.iter().any(|k| k.rooted()) && args.root >= n {
        // Every rank sees the same, so every rank stops here.
        bail!(
            "-r {}: the root must be a rank of the job (0..{})",
            args.root,
            n - 1
        );
    }
    // Rank 0's report; an error (a bad -J path) stops every rank at the agreement.
    let mut sink = Sink {
        report: None,
        pending: None,
    };
    if rank == 0 {
        match Report::new(&args.sweep) {
            Ok(r) => sink.report = Some(r),
            Err(e) => sink.pending = Some(e),
        }
    }
    let cfg = comm.config();
    let fp = fingerprint(kinds, args, sizes, cfg.algo.as_deref(), cfg.deterministic);
    if !agree(comm, sink.pending.is_none(), fp)? {
        return Err(sink
            .pending
            .unwrap_or_else(|| anyhow!("rank 0 stopped on an error (see its output)")));
    }
    let mut total_wrong = 0u64;
    let mut traffic = Traffic::default();
    if args.all_algos {
        // One-sided collectives run only where every member is on this host with shared
        // memory; elsewhere "onesided" would measure the direct algorithm under its name.
        let single_host = all_ok(comm, (0..n).all(|p| p == rank || comm.uses_shm(p)))?;
        let env_algo = std::env::var("HCOMM_ALGO").ok();
        for &kind in kinds {
            for name in algos::names_for(kind) {
                if name == OneSided.name() && !single_host {
                    sink.with_report(|rep| {
                        Ok(rep.comment(&format!(
                            "{} {name}: skipped, the ranks are not all on one host with \
                             shared memory",
                            kind.name()
                        ))?)
                    });
                    continue;
                }
                let spec = algo_spec(&[kind], name, env_algo.as_deref()).map_err(|e| anyhow!(e))?;
                // A world of its own per algorithm: the algorithm is a setting of the
                // world. `comm`'s world lives on, holding the store of launchers whose
                // rank 0 hosts it.
                let world = super::config_with_algo(Some(spec))
                    .and_then(Communicator::init_with)
                    .with_context(|| format!("joining the job again for {} {name}", kind.name()))?;
                total_wrong += sweep(&world, kind, args, sizes, &mut sink)?;
                traffic.add(&world);
            }
        }
    } else {
        for &kind in kinds {
            total_wrong += sweep(comm, kind, args, sizes, &mut sink)?;
        }
        traffic.add(comm);
    }
    if let Some(e) = sink.pending {
        return Err(e);
    }
    if let Some(rep) = &mut sink.report {
        let op = if kinds.iter().any(|k| k.reduces()) {
            format!(" {}", args.op.name())
        } else {
            String::new()
        };
        rep.comment(&traffic.line(comm))?;
        rep.finish(&format!("{n} ranks, {}{op}", args.dtype.name()))?;
    }
    Ok(if total_wrong == 0 {
        Outcome::Passed
    } else {
        Outcome::Wrong(total_wrong)
    })
}

/// The curve of `kind`'s rows on `comm`: the algorithm its settings force, or "auto".
fn curve(comm: &Communicator, kind: CollKind) -> &'static str {
    comm.config()
        .algo
        .as_deref()
        .and_then(|a| Selector::new(Some(a), false).ok())
        .and_then(|s| s.forced(kind))
        .map_or("auto", |a| a.name())
}

/// The sweep of one collective on `comm`; returns the wrong elements of all ranks.
fn sweep(
    comm: &Communicator,
    kind: CollKind,
    args: &CollArgs,
    sizes: &[u64],
    sink: &mut Sink,
) -> anyhow::Result<u64> {
    let n = comm.size();
    let sweep = &args.sweep;
    let op = if kind.reduces() {
        args.op
    } else {
        ReduceOp::Sum
    };
    let root = if kind.rooted() { args.root } else { 0 };
    let curve = curve(comm, kind);
    sink.with_report(|rep| Ok(header(rep, comm, kind, args, op, sizes)?));
    let mut total_wrong = 0;
    for &requested in sizes {
        let Some(lay) = layout(kind, args.dtype, n, requested) else {
            continue;
        };
        let shape = Shape {
            // Broadcast has one buffer anyway; the typed API never marks it.
            in_place: args.in_place && kind != CollKind::Broadcast,
            ..Shape::new(kind, args.dtype, op, lay.shape_count, root, n)
        };
        let algo = comm.algorithm_for(kind, args.dtype, op, lay.shape_count, root);
        let mut bench = match Bench::new(comm, shape, args.mem == "pool") {
            Ok(b) => Some(b),
            Err(e) => {
                sink.pending.get_or_insert(e);
                None
            }
        };
        if !all_ok(comm, sink.pending.is_none())? {
            return Err(sink
                .pending
                .take()
                .unwrap_or_else(|| anyhow!("another rank stopped on an error (see its output)")));
        }
        let Some(b) = bench.as_mut() else {
            unreachable!("every rank has its buffers")
        };
        let (wrong, time) = b.measure(sweep.warmup_for(lay.size), sweep)?;
        total_wrong += wrong;
        let algbw = if time > 0.0 {
            lay.size as f64 / time / 1e9
        } else {
            0.0
        };
        let row = Row {
            collective: kind.name(),
            size: lay.size,
            count: lay.count,
            dtype: args.dtype.name(),
            redop: kind.reduces().then(|| op.name()),
            root: kind.rooted().then_some(root),
            time_us: time * 1e6,
            algbw,
            busbw: algbw * bus_factor(kind, n),
            wrong,
            algo: Some(algo),
            curve: Some(curve),
        };
        sink.with_report(|rep| Ok(rep.row(row)?));
    }
    Ok(total_wrong)
}

/// The comment lines and column titles before a collective's rows.
fn header(
    rep: &mut Report,
    comm: &Communicator,
    kind: CollKind,
    args: &CollArgs,
    op: ReduceOp,
    sizes: &[u64],
) -> std::io::Result<()> {
    let cfg = comm.config();
    let sweep = &args.sweep;
    let iters = match sweep.iters {
        Some(n) => format!("{n} iterations"),
        None => format!("~{} s per size", sweep.time_target),
    };
    let n = comm.size();
    let place = if kind == CollKind::Broadcast {
        "in place (always)"
    } else if args.in_place {
        "in place"
    } else {
        "out of place"
    };
    rep.comment(&format!(
        "hcomm_perf {} {}\n\
         ranks: {n}, type {}, op {}, root {}, {place}, sizes {}..{} B requested, {iters}, \
         checked iterations: {}\n\
         hcomm: tcp streams {}, eager limit {} B, chunk {} B, timeout {:.0} s, \
         HCOMM_ALGO {}, deterministic {}, mismatch check {}\n\
         size = {} (nccl-tests; rounded down to whole elements{}); count = elements in size\n\
         time = median of individually timed iterations of the slowest rank; \
         algbw = size/time (1 GB = 1e9 B); busbw = algbw x {}\n\
         #wrong = wrong elements of the checked iterations, all ranks; \
         algo = hcomm's choice for the size",
        kind.name(),
        env!("CARGO_PKG_VERSION"),
        args.dtype.name(),
        if kind.reduces() { op.name() } else { "-" },
        if kind.rooted() {
            args.root.to_string()
        } else {
            "-".to_string()
        },
        sizes.first().copied().unwrap_or(0),
        sizes.last().copied().unwrap_or(0),
        sweep.check,
        cfg.tcp_streams,
        cfg.tcp_eager_limit,
        cfg.tcp_chunk,
        cfg.timeout.as_secs_f64(),
        cfg.algo.as_deref().unwrap_or("-"),
        if cfg.deterministic { "on" } else { "off" },
        if cfg.mismatch_check { "on" } else { "off" },
        size_meaning(kind),
        if blocked(kind) { " and blocks" } else { "" },
        bus_factor_text(kind),
    ))?;
    rep.header(true)
}

/// A benchmark buffer: heap or shared-memory pool memory.
enum Mem {
    Heap(Vec<u8>),
    Pool(hcomm::PoolBuf<u8>),
}

impl Mem {
    /// `data` in memory of the chosen kind.
    fn place(comm: &Communicator, pool: bool, data: Vec<u8>) -> anyhow::Result<Mem> {
        if !pool {
            return Ok(Mem::Heap(data));
        }
        let mut b = comm.alloc::<u8>(data.len())?;
        b.copy_from_slice(&data);
        Ok(Mem::Pool(b))
    }
}

impl std::ops::Deref for Mem {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Mem::Heap(v) => v,
            Mem::Pool(b) => b,
        }
    }
}

impl std::ops::DerefMut for Mem {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Mem::Heap(v) => v,
            Mem::Pool(b) => b,
        }
    }
}

/// One rank's buffers for one size of one collective.
struct Bench<'a> {
    comm: &'a Communicator,
    shape: Shape,
    /// `None` where this rank passes no send buffer (in place, broadcast).
    send: Option<Mem>,
    recv: Mem,
}

impl<'a> Bench<'a> {
    fn new(comm: &'a Communicator, shape: Shape, pool: bool) -> anyhow::Result<Bench<'a>> {
        let r = comm.rank();
        let full = shape.count;
        let send = if shape.in_place_at(r) || shape.kind == CollKind::Broadcast {
            None
        } else {
            Some(generate(
                &shape,
                r,
                shape.send_bytes(r),
                0..full,
                SALT_SEND,
                SEED_TIMING,
            )?)
        };
        let recv = generate(
            &shape,
            r,
            shape.recv_bytes(r),
            0..full,
            SALT_RECV,
            SEED_TIMING,
        )?;
        let send = send.map(|d| Mem::place(comm, pool, d)).transpose()?;
        let recv = Mem::place(comm, pool, recv)?;
        Ok(Bench {
            comm,
            shape,
            send,
            recv,
        })
    }

    fn iteration(&mut self) -> anyhow::Result<()> {
        let s = &self.shape;
        self.comm
            .run_collective(s.clone(), self.send.as_deref(), &mut self.recv)
            .with_context(|| format!("{} of {} x {}", s.kind.name(), s.count, s.dtype.name()))
    }

    /// Warm-up, timed and checked iterations; returns the wrong elements of all ranks
    /// and the slowest rank's median time in seconds.
    fn measure(&mut self, warmup: u64, sweep: &super::SweepArgs) -> anyhow::Result<(u64, f64)> {
        let per_iter = measure::warm_up(warmup, || self.iteration())?;
        let mut slowest = [0.0f64];
        self.comm
            .allreduce(&[per_iter], &mut slowest, ReduceOp::Max)
            .context("agreeing on the iteration count")?;
        let iters = sweep.iters_for(slowest[0]);
        self.comm
            .barrier()
            .context("the barrier before the timed iterations")?;
        let median = measure::median_time(iters, || self.iteration())?;
        let mut wrong = 0u64;
        for k in 0..sweep.check {
            wrong += self.checked_iteration(k)?;
        }
        let mut time = [0.0f64];
        self.comm
            .allreduce(&[median], &mut time, ReduceOp::Max)
            .context("collecting the times")?;
        let mut all_wrong = [0u64];
        self.comm
            .allreduce(&[wrong], &mut all_wrong, ReduceOp::Sum)
            .context("collecting the wrong-element counts")?;
        Ok((all_wrong[0], time[0]))
    }

    /// One call on fresh inputs (seed `k`) checked against the sequential reference;
    /// returns this rank's wrong elements. Every rank generates every rank's inputs, a
    /// piece of each block at a time.
    fn checked_iteration(&mut self, k: u64) -> anyhow::Result<u64> {
        let shape = self.shape.clone();
        let (r, n, e, c) = (self.comm.rank(), shape.size, shape.elem(), shape.count);
        if let Some(send) = &mut self.send {
            send.copy_from_slice(&generate(
                &shape,
                r,
                shape.send_bytes(r),
                0..c,
                SALT_SEND,
                k,
            )?);
        }
        let fresh = generate(&shape, r, shape.recv_bytes(r), 0..c, SALT_RECV, k)?;
        self.recv.copy_from_slice(&fresh);
        self.iteration()?;
        let blocks = if blocked(shape.kind) { n } else { 1 };
        let step = (CHECK_PIECE_BYTES / e / blocks).max(1);
        let mut wrong = 0u64;
        let mut a = 0;
        while a < c {
            let b = (a + step).min(c);
            let piece = Shape {
                count: b - a,
                ..shape.clone()
            };
            let shapes = vec![piece.clone(); n];
            let mut sends = Vec::with_capacity(n);
            let mut recvs = Vec::with_capacity(n);
            for p in 0..n {
                sends.push(generate(
                    &shape,
                    p,
                    shape.send_bytes(p),
                    a..b,
                    SALT_SEND,
                    k,
                )?);
                recvs.push(generate(
                    &shape,
                    p,
                    shape.recv_bytes(p),
                    a..b,
                    SALT_RECV,
                    k,
                )?);
            }
            let want = reference::expected(&shapes, &sends, &recvs);
            let got = extract(&self.recv, c * e, a * e..b * e);
            wrong += count_wrong(&piece, r, &got, &want[r]);
            a = b;
        }
        Ok(wrong)
    }
}

/// Bytes `range` of every `block`-byte block of `buf`, concatenated.
fn extract(buf: &[u8], block: usize, range: std::ops::Range<usize>) -> Vec<u8> {
    let mut out = Vec::new();
    if block == 0 {
        return out;
    }
    for blk in buf.chunks_exact(block) {
        out.extend_from_slice(&blk[range.clone()]);
    }
    out
}

/// Elements of `got` that differ from `want` where the call defines the result (in-place
/// reduce-scatter: block `rank` only).
fn count_wrong(piece: &Shape, rank: usize, got: &[u8], want: &[u8]) -> u64 {
    let e = piece.elem();
    let (got, want) = if piece.kind == CollKind::ReduceScatter && piece.in_place {
        let blk = piece.count * e;
        let at = rank * blk..(rank + 1) * blk;
        (
            got.get(at.clone()).unwrap_or(&[]),
            want.get(at).unwrap_or(&[]),
        )
    } else {
        (got, want)
    };
    let differ = got
        .chunks(e)
        .zip(want.chunks(e))
        .filter(|(g, w)| g != w)
        .count() as u64;
    differ + (got.len().abs_diff(want.len()) / e) as u64
}

/// Elements `range` of every block (of `shape.count` elements) of the `len`-byte buffer of
/// `rank`, concatenated: the whole buffer when `range` is `0..shape.count`. Element `i` of
/// the whole buffer is a small integer that depends on the rank, `i`, `salt` and `seed`
/// (as in hcomm_check), so float sums are exact in any order; for `prod` it is ±1.
fn generate(
    shape: &Shape,
    rank: usize,
    len: usize,
    range: std::ops::Range<usize>,
    salt: u64,
    seed: u64,
) -> anyhow::Result<Vec<u8>> {
    let e = shape.elem();
    let block = shape.count;
    let blocks = if block == 0 { 0 } else { len / (block * e) };
    let bytes = blocks * range.len() * e;
    let mut out = Vec::new();
    out.try_reserve_exact(bytes)
        .with_context(|| format!("cannot allocate a {bytes}-byte buffer"))?;
    for blk in 0..blocks {
        for j in range.clone() {
            let i = (blk * block + j) as u64;
            let x = (rank as u64)
                .wrapping_mul(7919)
                .wrapping_add(i.wrapping_mul(104_729))
                .wrapping_add(salt * 31)
                .wrapping_add(seed)
                % 7;
            hcomm_tools::push_test_value(shape.dtype, shape.op, x, &mut out);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_pieces_match_the_whole_buffer() {
        for kind in KINDS {
            let shape = Shape {
                in_place: kind == CollKind::ReduceScatter,
                ..Shape::new(kind, DataType::Float32, ReduceOp::Sum, 5, 1, 3)
            };
            for r in 0..3 {
                for len in [shape.send_bytes(r), shape.recv_bytes(r)] {
                    let whole = generate(&shape, r, len, 0..5, 2, 9).unwrap();
                    assert_eq!(whole.len(), len);
                    let mut joined = vec![Vec::new(); len / 20];
                    for (a, b) in [(0, 2), (2, 5)] {
                        let piece = generate(&shape, r, len, a..b, 2, 9).unwrap();
                        assert_eq!(piece, extract(&whole, 20, a * 4..b * 4));
                        for (blk, chunk) in piece.chunks((b - a) * 4).enumerate() {
                            joined[blk].extend_from_slice(chunk);
                        }
                    }
                    assert_eq!(joined.concat(), whole);
                }
            }
        }
    }

    #[test]
    fn wrong_elements_are_counted() {
        let s = Shape::new(
            CollKind::AllReduce,
            DataType::Float32,
            ReduceOp::Sum,
            4,
            0,
            2,
        );
        let want = generate(&s, 0, 16, 0..4, 1, 0).unwrap();
        let mut got = want.clone();
        assert_eq!(count_wrong(&s, 0, &got, &want), 0);
        got[0] ^= 1;
        got[3] ^= 1;
        got[15] ^= 1;
        assert_eq!(count_wrong(&s, 0, &got, &want), 2);
        // In-place reduce-scatter: only the rank's block counts.
        let rs = Shape {
            in_place: true,
            ..Shape::new(
                CollKind::ReduceScatter,
                DataType::Float32,
                ReduceOp::Sum,
                2,
                0,
                2,
            )
        };
        let want = vec![0u8; 16];
        let mut got = want.clone();
        got[0] = 1;
        assert_eq!(count_wrong(&rs, 1, &got, &want), 0);
        assert_eq!(count_wrong(&rs, 0, &got, &want), 1);
    }
}
