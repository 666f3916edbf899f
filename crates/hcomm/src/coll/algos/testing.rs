//! Test support: runs an algorithm's schedules for every rank in the simulator and compares
//! the result with the sequential reference.

use proptest::prelude::*;

use crate::coll::reference;
use crate::coll::sim::{simulate, RankBuffers};
use crate::coll::{Algorithm, CollKind, Shape};
use crate::dtype::{DataType, ReduceOp};
use crate::reduce::scalar;
use crate::rng::Rng;
use crate::topology::{RankInfo, Topology};

/// A topology of `n` ranks spread round-robin over `hosts` hosts.
pub(crate) fn topology(n: usize, hosts: usize) -> Topology {
    Topology::new(
        (0..n)
            .map(|r| RankInfo {
                host_id: format!("host{}", r % hosts.max(1)),
                hostname: format!("host{}", r % hosts.max(1)),
                pid: r as u32,
                numa_node: 0,
                cpu: 0,
            })
            .collect(),
    )
}

/// Random elements of `dtype`: any bit pattern for integers; for floats small integers (±1
/// for products) so that results are exact in any order and compare bit for bit.
fn random_bytes(dtype: DataType, op: ReduceOp, elems: usize, g: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(elems * dtype.size());
    for _ in 0..elems {
        let small = if op == ReduceOp::Prod {
            [1, -1][(g.next_u64() % 2) as usize]
        } else {
            (g.next_u64() % 7) as i32 - 3
        };
        match dtype {
            DataType::Float32 => out.extend_from_slice(&(small as f32).to_le_bytes()),
            DataType::Float64 => out.extend_from_slice(&(small as f64).to_le_bytes()),
            DataType::Float16 => {
                out.extend_from_slice(&half::f16::from_f32(small as f32).to_le_bytes())
            }
            DataType::Bfloat16 => {
                out.extend_from_slice(&half::bf16::from_f32(small as f32).to_le_bytes())
            }
            _ => out.extend_from_slice(&g.next_u64().to_le_bytes()[..dtype.size()]),
        }
    }
    out
}

pub(crate) use crate::coll::random::shapes;

/// Simulates `algo` on `shapes` and compares every rank's result with the reference.
pub(crate) fn check_shapes(
    algo: &dyn Algorithm,
    shapes: &[Shape],
    hosts: usize,
    seed: u64,
) -> Result<(), String> {
    let n = shapes.len();
    let topo = topology(n, hosts);
    let s0 = &shapes[0];
    let mut g = Rng::new(seed);
    let elem = s0.elem();
    let inputs: Vec<RankBuffers> = shapes
        .iter()
        .enumerate()
        .map(|(r, s)| RankBuffers {
            send: random_bytes(s.dtype, s.op, s.send_bytes(r) / elem, &mut g),
            recv: random_bytes(s.dtype, s.op, s.recv_bytes(r) / elem, &mut g),
        })
        .collect();
    let sends: Vec<Vec<u8>> = inputs.iter().map(|b| b.send.clone()).collect();
    let recvs: Vec<Vec<u8>> = inputs.iter().map(|b| b.recv.clone()).collect();
    let scheds: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(r, s)| algo.schedule(s, r, &topo))
        .collect();
    let in_place: Vec<bool> = shapes
        .iter()
        .enumerate()
        .map(|(r, s)| s.in_place_at(r))
        .collect();
    let mut out =
        simulate(&scheds, inputs, s0.dtype, s0.op, &in_place).map_err(|e| e.to_string())?;
    // What the front end does after the schedule: finish an average.
    if s0.kind.reduces() && s0.op == ReduceOp::Avg {
        for (r, o) in out.iter_mut().enumerate() {
            let region = match s0.kind {
                CollKind::Reduce if r != s0.root => continue,
                CollKind::ReduceScatter => s0.output(r, 0, s0.count * elem),
                _ => s0.output(r, 0, s0.count * elem),
            };
            scalar::finish_avg(s0.dtype, &mut o.recv[region.range()], n)
                .map_err(|e| e.to_string())?;
        }
    }
    let want = reference::expected(shapes, &sends, &recvs);
    for r in 0..n {
        if out[r].recv != want[r] {
            let first = out[r].recv.iter().zip(&want[r]).position(|(a, b)| a != b);
            return Err(format!(
                "rank {r} differs from the reference (first byte {first:?})"
            ));
        }
    }
    Ok(())
}

/// Checks `algo` for one call shape.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check(
    algo: &dyn Algorithm,
    kind: CollKind,
    n: usize,
    count: usize,
    root: usize,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    hosts: usize,
    seed: u64,
) -> Result<(), String> {
    let shapes = shapes(kind, n, count, root, dtype, op, in_place, seed);
    check_shapes(algo, &shapes, hosts, seed).map_err(|e| {
        format!(
            "{} {} n={n} count={count} root={root} {} {} in_place={in_place} hosts={hosts} seed={seed}: {e}",
            algo.name(),
            kind.name(),
            dtype.name(),
            op.name()
        )
    })
}

/// Collectives that have an in-place form.
pub(crate) fn has_in_place(kind: CollKind) -> bool {
    !matches!(
        kind,
        CollKind::AllToAllV | CollKind::Broadcast | CollKind::Barrier
    )
}

/// Rank counts the sweeps use: odd, even, prime, powers of two, up to 64.
pub(crate) const SIZES: [usize; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 31, 64];

/// A small deterministic sweep of every supported collective for `algo`: every size in
/// [`SIZES`] up to 16, every root, several counts, every data type and op on some.
pub(crate) fn sweep(algo: &dyn Algorithm) {
    let mut seed = 1;
    for kind in CollKind::ALL.into_iter().filter(|k| algo.supports(*k)) {
        for n in SIZES.into_iter().filter(|&n| n <= 16) {
            for count in [0, 1, n + 1, 3 * n] {
                let roots: Vec<usize> = if kind.rooted() {
                    (0..n).collect()
                } else {
                    vec![0]
                };
                for root in roots {
                    for in_place in [false, true] {
                        if in_place && !has_in_place(kind) {
                            continue;
                        }
                        seed += 1;
                        for hosts in [1, 2] {
                            if let Err(e) = check(
                                algo,
                                kind,
                                n,
                                count,
                                root,
                                DataType::Int32,
                                ReduceOp::Sum,
                                in_place,
                                hosts,
                                seed,
                            ) {
                                panic!("{e}");
                            }
                        }
                    }
                }
            }
        }
        if kind.reduces() {
            for dtype in DataType::ALL {
                for op in ReduceOp::ALL.into_iter().filter(|op| op.supports(dtype)) {
                    seed += 1;
                    if let Err(e) = check(algo, kind, 5, 11, 2, dtype, op, false, 1, seed) {
                        panic!("{e}");
                    }
                }
            }
        }
    }
}

/// A proptest strategy over everything a call can vary in.
pub(crate) fn any_call() -> impl Strategy<
    Value = (
        CollKind,
        usize,
        usize,
        usize,
        usize,
        usize,
        bool,
        usize,
        u64,
    ),
> {
    (
        proptest::sample::select(CollKind::ALL.to_vec()),
        proptest::sample::select(SIZES.to_vec()),
        0usize..40,
        0usize..64,
        0usize..DataType::ALL.len(),
        0usize..ReduceOp::ALL.len(),
        any::<bool>(),
        1usize..4,
        any::<u64>(),
    )
}

/// Checks `algo` on one generated call (skipping what it does not support).
pub(crate) fn check_generated(
    algo: &dyn Algorithm,
    (kind, n, count, root, dt, op, in_place, hosts, seed): (
        CollKind,
        usize,
        usize,
        usize,
        usize,
        usize,
        bool,
        usize,
        u64,
    ),
) -> Result<(), String> {
    if !algo.supports(kind) {
        return Ok(());
    }
    let in_place = in_place && has_in_place(kind);
    let root = if kind.rooted() { root % n } else { 0 };
    let (dtype, op) = (DataType::ALL[dt], ReduceOp::ALL[op]);
    if kind.reduces() && !op.supports(dtype) {
        // Refused by the communicator before any schedule runs.
        return Ok(());
    }
    check(algo, kind, n, count, root, dtype, op, in_place, hosts, seed)
}

#[test]
fn every_algorithm_passes_the_sweep() {
    for algo in super::all() {
        sweep(*algo);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_algorithm_matches_the_reference(call in any_call()) {
        for algo in super::all() {
            let r = check_generated(*algo, call);
            prop_assert!(r.is_ok(), "{}", r.unwrap_err());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The ranks of one call see different v-layouts (each its own counts of all-to-all-v)
    /// but must pick the same algorithm, or their schedules do not fit together (found by
    /// the soak test of hcomm_check: ranks of an all-to-all-v with uneven counts chose
    /// pairwise and direct and failed with a mismatch).
    #[test]
    fn every_rank_of_a_call_chooses_the_same_algorithm(
        kind in proptest::sample::select(CollKind::ALL.to_vec()),
        n in proptest::sample::select(SIZES.to_vec()),
        log_count in 0u32..23,
        dt in 0usize..DataType::ALL.len(),
        hosts in 1usize..4,
        seed in any::<u64>(),
    ) {
        let count = (1usize << log_count) - 1;
        let topo = topology(n, hosts);
        let selector = crate::coll::select::Selector::new(None, false).unwrap();
        let shapes = shapes(kind, n, count, 0, DataType::ALL[dt], ReduceOp::Sum, false, seed);
        let chosen: Vec<&str> = shapes.iter().map(|s| selector.choose(s, &topo).name()).collect();
        prop_assert!(chosen.iter().all(|a| *a == chosen[0]), "{:?} {} ranks: {:?}", kind, n, chosen);
    }
}
