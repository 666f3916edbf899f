//! The soak: random collectives on several communicators, the same draws on every rank.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hcomm::internal::coll::random::shapes;
use hcomm::internal::rng::Rng;
use hcomm::CollKind;
use hcomm::{Communicator, DataType, ReduceOp};

use super::coll::check_call;

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

pub(super) fn soak(world: &Communicator, calls: usize, seed: u64, max_count: usize) -> Result<()> {
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
        let op = match ReduceOp::ALL[o as usize % ReduceOp::ALL.len()] {
            op if kind.reduces() && op.supports(dtype) => op,
            _ => ReduceOp::Sum,
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
        let shapes = shapes(kind, size, count, root, dtype, op, in_place, salt);
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
    let s = world.protocol_stats();
    println!(
        "ofi eager={} read={} write={} direct={} mr_hits={} mr_misses={}",
        s.ofi_eager, s.ofi_read, s.ofi_write, s.ofi_direct, s.ofi_mr_hits, s.ofi_mr_misses
    );
    Ok(())
}
