//! The element types and operations added for the Python front end (bool, int16, uint16;
//! band, bor, bxor) in jobs of real processes: every reducing collective against the
//! sequential reference, the typed API on `bool`, `i16` and `u16`, and the pairs that are
//! refused (bitwise operations on floats, the average of bool) failing before anything is
//! sent.

use hcomm::internal::coll::reference;
use hcomm::{CollKind, Shape};
use hcomm::{Communicator, DataType, Error, ReduceOp};

/// Environment of a rank started by [`job`]: the scenario it runs.
const SCENARIO: &str = "HCOMM_TYPES_TEST_SCENARIO";

/// Byte `i` of rank `r`'s buffer: every bit pattern, so bool sees bytes other than 0 and 1.
fn byte(r: usize, i: usize) -> u8 {
    ((r * 131 + i * 29 + (i >> 3) * 7) % 256) as u8
}

/// Every reducing collective on every supported (new type, op) pair, and every op on the new
/// integer types, small and large.
fn reductions() {
    let comm = Communicator::init().unwrap();
    let (n, me) = (comm.size(), comm.rank());
    let mut calls = 0;
    for dtype in [
        DataType::Bool,
        DataType::Int16,
        DataType::Uint16,
        DataType::Int64,
    ] {
        for op in ReduceOp::ALL.into_iter().filter(|op| op.supports(dtype)) {
            for kind in [
                CollKind::AllReduce,
                CollKind::Reduce,
                CollKind::ReduceScatter,
            ] {
                for count in [5usize, 40_000] {
                    let shape = Shape::new(kind, dtype, op, count, n - 1, n);
                    let all = vec![shape.clone(); n];
                    let sends: Vec<Vec<u8>> = (0..n)
                        .map(|r| (0..shape.send_bytes(r)).map(|i| byte(r, i)).collect())
                        .collect();
                    let recvs: Vec<Vec<u8>> =
                        (0..n).map(|r| vec![0xEE; shape.recv_bytes(r)]).collect();
                    let want = reference::expected(&all, &sends, &recvs);
                    let mut recv = recvs[me].clone();
                    comm.run_collective(shape, Some(&sends[me]), &mut recv)
                        .unwrap_or_else(|e| panic!("{kind:?} {dtype} {op} x {count}: {e}"));
                    assert_eq!(recv, want[me], "{kind:?} {dtype} {op} x {count}");
                    calls += 1;
                }
            }
        }
    }
    println!("OK {calls} reductions on rank {me}");
}

/// The typed API on `bool`, `i16` and `u16`; refused pairs fail on every rank before sending.
fn typed() {
    let comm = Communicator::init().unwrap();
    let (n, me) = (comm.size(), comm.rank());
    // Rank r contributes true at positions r and r+1 (mod n + 1).
    let flags: Vec<bool> = (0..=n).map(|i| i == me || i == me + 1).collect();
    let mut any = vec![false; n + 1];
    comm.allreduce(&flags, &mut any, ReduceOp::BOr).unwrap();
    assert!(any.iter().all(|&x| x), "{any:?}");
    let count_at = |i: usize| (0..n).filter(|&r| i == r || i == r + 1).count();
    let mut all = flags.clone();
    comm.allreduce_in_place(&mut all, ReduceOp::Prod).unwrap();
    let want: Vec<bool> = (0..=n).map(|i| count_at(i) == n).collect();
    assert_eq!(all, want);
    let mut odd = flags.clone();
    comm.allreduce_in_place(&mut odd, ReduceOp::BXor).unwrap();
    let want: Vec<bool> = (0..=n).map(|i| count_at(i) % 2 == 1).collect();
    assert_eq!(odd, want);

    let mut gathered = vec![false; 2 * n];
    comm.allgather(&[true, me % 2 == 0], &mut gathered).unwrap();
    let want: Vec<bool> = (0..n).flat_map(|r| [true, r % 2 == 0]).collect();
    assert_eq!(gathered, want);

    let mut s = [-(me as i16) - 1, i16::MAX];
    comm.allreduce_in_place(&mut s, ReduceOp::Sum).unwrap();
    let total: i16 = (0..n as i16).map(|r| -r - 1).sum();
    assert_eq!(s, [total, i16::MAX.wrapping_mul(n as i16)]);
    let mut u = [1u16 << me, 0xFFFF];
    comm.allreduce_in_place(&mut u, ReduceOp::BOr).unwrap();
    assert_eq!(u, [(1u16 << n) - 1, 0xFFFF]);
    let mut m = [me as u16 * 1000];
    comm.allreduce_in_place(&mut m, ReduceOp::Max).unwrap();
    assert_eq!(m, [(n as u16 - 1) * 1000]);

    // Refused on every rank before anything is sent: the next call still matches.
    let mut f = [1.0f32; 3];
    let e = comm.allreduce_in_place(&mut f, ReduceOp::BAnd).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.message.contains("band")),
        "{e}"
    );
    let mut b = [true; 3];
    let e = comm.allreduce_in_place(&mut b, ReduceOp::Avg).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = comm
        .reduce_scatter(&vec![1.5f64; n], &mut [0.0], ReduceOp::BXor)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let mut ok = [1i16; 2];
    comm.allreduce_in_place(&mut ok, ReduceOp::Sum).unwrap();
    assert_eq!(ok, [n as i16; 2]);
    println!("OK typed on rank {me}");
}

/// The entry of a rank started by [`job`] (ignored in normal runs).
#[test]
#[ignore = "a rank of the jobs the other tests start"]
fn rank_of_a_job() {
    match std::env::var(SCENARIO).as_deref() {
        Ok("reductions") => reductions(),
        Ok("typed") => typed(),
        other => panic!("no scenario {other:?}"),
    }
}

fn job(scenario: &str, n: usize, env: &[(&str, &str)]) {
    hcomm_testkit::job_ok(SCENARIO, scenario, n, env);
}

#[test]
fn new_types_and_bitwise_ops_reduce_like_the_reference() {
    job("reductions", 3, &[]);
    job("reductions", 2, &[("HCOMM_TRANSPORT", "tcp")]);
}

#[test]
fn typed_bool_and_16_bit_collectives_and_refused_pairs() {
    for n in [1, 2, 4] {
        job("typed", n, &[]);
    }
}
