//! Nonblocking operations on lent memory ([`Lease`]) and blocking collectives of every
//! shape, in jobs of real processes (this test binary started again as each rank): every
//! collective, in place and not, v-variants included, against the sequential reference;
//! point-to-point messages; requests collected by `wait`, by `test`, and dropped unwaited
//! (the drop finishes the operation before the memory is looked at).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hcomm::internal::coll::reference;
use hcomm::{CollKind, Shape, VLayout};
use hcomm::{Communicator, DataType, Error, Lease, ReduceOp, Request};

/// Environment of a rank started by [`job`]: the scenario it runs.
const SCENARIO: &str = "HCOMM_RAW_TEST_SCENARIO";

/// How a rank runs one collective call.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// `run_collective` on slices.
    Blocking,
    /// `start_collective_raw`, then `wait`.
    Wait,
    /// `start_collective_raw`, then `test` until done.
    Test,
    /// `start_collective_raw`, then the request dropped.
    Drop,
}

/// Element `i` of rank `r`'s buffer `which` (small values: sums and products stay exact).
fn value(r: usize, which: usize, i: usize) -> i32 {
    ((r * 7 + which * 3 + i * 5) % 11) as i32 - 5
}

fn filled(r: usize, which: usize, bytes: usize) -> Vec<u8> {
    (0..bytes / 4)
        .flat_map(|i| value(r, which, i).to_ne_bytes())
        .collect()
}

/// Prefix sums of `counts`, with a gap of `gap` elements after each block.
fn displs(counts: &[usize], gap: usize) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c + gap;
            Some(d)
        })
        .collect()
}

/// Every rank's view of a call of `kind` on `n` ranks, `count` elements.
fn shapes(kind: CollKind, op: ReduceOp, n: usize, count: usize, in_place: bool) -> Vec<Shape> {
    let root = n / 2;
    let base = Shape {
        in_place,
        ..Shape::new(kind, DataType::Int32, op, count, root, n)
    };
    match kind {
        CollKind::AllGatherV => {
            let counts: Vec<usize> = (0..n).map(|p| count + p * 3).collect();
            let v = VLayout {
                recv_displs: displs(&counts, 1),
                recv_counts: counts,
                ..VLayout::default()
            };
            vec![
                Shape {
                    v: Some(Arc::new(v)),
                    count: 0,
                    ..base
                };
                n
            ]
        }
        CollKind::AllToAllV => {
            // Rank r sends `sent(r, p)` elements to rank p.
            let sent = |r: usize, p: usize| count + (r * 2 + p) % 3;
            (0..n)
                .map(|r| {
                    let send_counts: Vec<usize> = (0..n).map(|p| sent(r, p)).collect();
                    let recv_counts: Vec<usize> = (0..n).map(|p| sent(p, r)).collect();
                    let v = VLayout {
                        send_displs: displs(&send_counts, 2),
                        send_counts,
                        recv_displs: displs(&recv_counts, 1),
                        recv_counts,
                    };
                    Shape {
                        v: Some(Arc::new(v)),
                        count: 0,
                        ..base.clone()
                    }
                })
                .collect()
        }
        _ => vec![base; n],
    }
}

/// Runs one call on this rank in `mode` and checks its receive buffer against the reference.
fn check_call(comm: &Communicator, all: &[Shape], mode: Mode) {
    let n = comm.size();
    let me = comm.rank();
    let sends: Vec<Vec<u8>> = (0..n)
        .map(|r| {
            if all[r].in_place_at(r) {
                Vec::new()
            } else {
                filled(r, 0, all[r].send_bytes(r))
            }
        })
        .collect();
    let recvs: Vec<Vec<u8>> = (0..n).map(|r| filled(r, 1, all[r].recv_bytes(r))).collect();
    let want = reference::expected(all, &sends, &recvs);
    let shape = all[me].clone();
    let what = format!("{mode:?} {shape:?} on rank {me}");
    let send = (!shape.in_place_at(me)).then(|| sends[me].clone());
    let mut recv = recvs[me].clone();
    match mode {
        Mode::Blocking => comm
            .run_collective(shape, send.as_deref(), &mut recv)
            .unwrap_or_else(|e| panic!("{what}: {e}")),
        Mode::Wait | Mode::Test | Mode::Drop => {
            // SAFETY: `send` and `recv` outlive the request, which is collected or dropped
            // (its drop waits) before they are read or freed; they do not overlap.
            let lent = send
                .as_ref()
                .map(|s| unsafe { Lease::from_raw_parts_const(s.as_ptr(), s.len()) });
            // SAFETY: as above.
            let out = unsafe { Lease::from_raw_parts(recv.as_mut_ptr(), recv.len()) };
            let mut req = comm
                .start_collective_raw(shape.clone(), lent, out)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            match mode {
                Mode::Wait => {
                    let done = req.wait().unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(done.buffer.is_empty(), "{what}");
                    assert_eq!(done.len, shape.recv_bytes(me), "{what}");
                }
                Mode::Test => {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while !req.test().unwrap_or_else(|e| panic!("{what}: {e}")) {
                        assert!(Instant::now() < deadline, "{what}: never completed");
                        std::thread::yield_now();
                    }
                    req.wait().unwrap_or_else(|e| panic!("{what}: {e}"));
                }
                _ => drop(req),
            }
        }
    }
    assert_eq!(recv, want[me], "{what}");
}

/// Whether a collective has an in-place form.
fn has_in_place(kind: CollKind) -> bool {
    !matches!(
        kind,
        CollKind::Broadcast | CollKind::Barrier | CollKind::AllToAllV
    )
}

/// Every collective, in place and not, at a small and a large count, in every mode.
fn collectives() {
    let comm = Communicator::init().unwrap();
    let n = comm.size();
    let modes = [Mode::Blocking, Mode::Wait, Mode::Test, Mode::Drop];
    let mut calls = 0;
    for kind in CollKind::ALL {
        for in_place in [false, true] {
            if in_place && !has_in_place(kind) {
                continue;
            }
            for (i, count) in [3usize, 20_000].into_iter().enumerate() {
                let op = [ReduceOp::Sum, ReduceOp::Max][i];
                for mode in modes {
                    check_call(&comm, &shapes(kind, op, n, count, in_place), mode);
                    calls += 1;
                }
            }
        }
    }
    println!("OK {calls} calls on rank {}", comm.rank());
}

/// Several nonblocking collectives on lent memory in flight at once, collected in reverse
/// order; and point-to-point messages on lent memory in a ring, collected by `wait`, by
/// `test` and by dropping.
fn overlapped() {
    let comm = Communicator::init().unwrap();
    let (n, me) = (comm.size(), comm.rank());
    let mut bufs: Vec<Vec<i32>> = (0..4).map(|k| vec![(me + k) as i32; 1000 + k]).collect();
    let reqs: Vec<Request> = bufs
        .iter_mut()
        .map(|b| {
            let shape = Shape {
                in_place: true,
                ..Shape::new(
                    CollKind::AllReduce,
                    DataType::Int32,
                    ReduceOp::Sum,
                    b.len(),
                    0,
                    n,
                )
            };
            // SAFETY: `bufs` outlives the requests, which are all collected below before it
            // is read; the buffers are distinct.
            let lent = unsafe { Lease::from_raw_parts(b.as_mut_ptr().cast(), b.len() * 4) };
            comm.start_collective_raw(shape, None, lent).unwrap()
        })
        .collect();
    for r in reqs.into_iter().rev() {
        r.wait().unwrap();
    }
    let ranks: i32 = (0..n as i32).sum();
    for (k, b) in bufs.iter().enumerate() {
        assert!(b.iter().all(|&x| x == ranks + (n * k) as i32), "buffer {k}");
    }

    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    for (round, len) in [5usize, 300_000].into_iter().enumerate() {
        let tag = round as u32;
        let out: Vec<u8> = (0..len).map(|i| (i * 31 + me) as u8).collect();
        let mut got = vec![0u8; len + 8];
        // SAFETY: `got` and `out` outlive the requests, collected before they are read.
        let mut rr = comm
            .irecv_raw(
                unsafe { Lease::from_raw_parts(got.as_mut_ptr(), got.len()) },
                left,
                tag,
            )
            .unwrap();
        // SAFETY: as above.
        let sr = comm
            .isend_raw(
                unsafe { Lease::from_raw_parts_const(out.as_ptr(), len) },
                right,
                tag,
            )
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !rr.test().unwrap() {
            assert!(Instant::now() < deadline, "the receive never completed");
            std::thread::yield_now();
        }
        let done = rr.wait().unwrap();
        assert_eq!((done.len, done.buffer.len()), (len, 0));
        let want: Vec<u8> = (0..len).map(|i| (i * 31 + left) as u8).collect();
        assert_eq!(&got[..len], &want[..]);
        assert_eq!(sr.wait().unwrap().len, len);
    }
    // A dropped receive has its message once the drop returns; a dropped send is delivered
    // (a large one waits for its receive: that is posted first).
    let mut got = vec![0u8; 70_000];
    let out = vec![me as u8 + 1; 70_000];
    // SAFETY: `got` outlives the request, which is dropped (and so finished) before `got` is
    // read; `out` likewise.
    let rr = comm
        .irecv_raw(
            unsafe { Lease::from_raw_parts(got.as_mut_ptr(), got.len()) },
            left,
            9,
        )
        .unwrap();
    // SAFETY: as above.
    drop(
        comm.isend_raw(
            unsafe { Lease::from_raw_parts_const(out.as_ptr(), out.len()) },
            right,
            9,
        )
        .unwrap(),
    );
    drop(rr);
    assert!(got.iter().all(|&b| b == left as u8 + 1));
    comm.barrier().unwrap();
    println!("OK overlapped on rank {me}");
}

/// Bad calls on lent memory fail before anything is sent: the next call still matches.
fn refused() {
    let comm = Communicator::init().unwrap();
    let n = comm.size();
    let mut small = [0u8; 4];
    let shape = Shape::new(CollKind::AllReduce, DataType::Int32, ReduceOp::Sum, 2, 0, n);
    let input = [0u8; 8];
    // SAFETY: the buffers outlive the call, which fails without keeping them.
    let e = comm
        .start_collective_raw(
            shape.clone(),
            Some(unsafe { Lease::from_raw_parts_const(input.as_ptr(), input.len()) }),
            unsafe { Lease::from_raw_parts(small.as_mut_ptr(), small.len()) },
        )
        .err()
        .expect("a short receive buffer is refused");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = comm
        .isend_raw(Lease::empty(), n, 0)
        .err()
        .expect("a rank outside the communicator is refused");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let v = Shape {
        v: Some(Arc::new(VLayout {
            recv_counts: vec![1; n + 1],
            recv_displs: vec![0; n + 1],
            ..VLayout::default()
        })),
        ..Shape::new(
            CollKind::AllGatherV,
            DataType::Int32,
            ReduceOp::Sum,
            0,
            0,
            n,
        )
    };
    let e = comm
        .start_collective_raw(v, Some(Lease::empty()), Lease::empty())
        .err()
        .expect("counts of the wrong length are refused");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let mut ok = [1i32; 2];
    comm.allreduce_in_place(&mut ok, ReduceOp::Sum).unwrap();
    assert_eq!(ok, [n as i32; 2]);
    println!("OK refused on rank {}", comm.rank());
}

/// The entry of a rank started by [`job`] (ignored in normal runs).
#[test]
#[ignore = "a rank of the jobs the other tests start"]
fn rank_of_a_job() {
    match std::env::var(SCENARIO).as_deref() {
        Ok("collectives") => collectives(),
        Ok("overlapped") => overlapped(),
        Ok("refused") => refused(),
        other => panic!("no scenario {other:?}"),
    }
}

fn job(scenario: &str, n: usize, env: &[(&str, &str)]) {
    hcomm_testkit::job_ok(SCENARIO, scenario, n, env);
}

#[test]
fn every_collective_on_lent_and_borrowed_memory_shm() {
    for n in [1, 3] {
        job("collectives", n, &[]);
    }
}

#[test]
fn every_collective_on_lent_and_borrowed_memory_tcp() {
    job("collectives", 4, &[("HCOMM_TRANSPORT", "tcp")]);
}

#[test]
fn overlapped_requests_and_messages_on_lent_memory() {
    job("overlapped", 2, &[]);
    job("overlapped", 3, &[("HCOMM_TRANSPORT", "tcp")]);
}

#[test]
fn bad_calls_on_lent_memory_are_refused_before_sending() {
    job("refused", 2, &[]);
}

/// Front ends keep requests in objects other threads may hold (Python objects, C handles).
#[test]
fn requests_and_lent_buffers_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Request>();
    send_sync::<Communicator>();
    send::<Lease<'static>>();
}
