//! Argument checks of the public API on a world of one rank (no launcher needed).

use std::sync::Arc;

use hcomm::{CollKind, Shape, VLayout};
use hcomm::{Communicator, Config, DataType, Error, Operation, ReduceOp};

fn world() -> Communicator {
    Communicator::init_with(Config::from_lookup(|_| None).unwrap()).unwrap()
}

#[test]
fn a_world_of_one_runs_every_collective() {
    let comm = world();
    assert_eq!((comm.rank(), comm.size()), (0, 1));
    let mut out = [0f32; 4];
    comm.allreduce(&[1.0, 2.0, 3.0, 4.0], &mut out, ReduceOp::Avg)
        .unwrap();
    assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
    let mut buf = [7u8; 3];
    comm.broadcast(&mut buf, 0).unwrap();
    comm.barrier().unwrap();
    let mut g = [0i64; 2];
    comm.allgather(&[5i64, 6], &mut g).unwrap();
    assert_eq!(g, [5, 6]);
}

#[test]
fn bad_arguments_are_clear_errors() {
    let comm = world();
    let mut small = [0f32; 2];
    let e = comm
        .allreduce(&[1.0f32; 4], &mut small, ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.message.contains("receive buffer")),
        "{e}"
    );
    let e = comm.broadcast(&mut small, 3).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.message.contains("root 3")),
        "{e}"
    );
    let e = comm.send(b"x", 1, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let huge = Shape::new(
        CollKind::AllReduce,
        DataType::Float64,
        ReduceOp::Sum,
        usize::MAX / 2,
        0,
        1,
    );
    let e = comm.run_collective(huge, None, &mut []).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.message.contains("out of range")),
        "{e}"
    );
    let no_counts = Shape::new(
        CollKind::AllGatherV,
        DataType::Uint8,
        ReduceOp::Sum,
        1,
        0,
        1,
    );
    let e = comm
        .run_collective(no_counts, Some(&[1]), &mut [0])
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let v = VLayout {
        recv_counts: vec![usize::MAX],
        recv_displs: vec![1],
        ..VLayout::default()
    };
    let overflow = Shape {
        v: Some(Arc::new(v)),
        ..Shape::new(
            CollKind::AllGatherV,
            DataType::Uint8,
            ReduceOp::Sum,
            1,
            0,
            1,
        )
    };
    let e = comm
        .run_collective(overflow, Some(&[1]), &mut [0])
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.message.contains("out of range")),
        "{e}"
    );
    let wrong_size = Shape::new(CollKind::AllReduce, DataType::Uint8, ReduceOp::Sum, 1, 0, 2);
    assert!(comm
        .run_collective(wrong_size, Some(&[1]), &mut [0])
        .is_err());
}

#[test]
fn self_messages_and_truncation() {
    let comm = world();
    comm.send(b"hello", 0, 9).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(comm.recv(&mut buf, 0, 9).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    comm.send(&[1u8; 16], 0, 9).unwrap();
    let e = comm.recv(&mut buf, 0, 9).unwrap_err();
    assert!(matches!(e, Error::Truncated(_)), "{e}");
    assert_eq!(e.code(), hcomm::ErrorCode::Truncated);
}

#[test]
fn a_point_to_point_error_names_its_call_by_direction_and_number() {
    let comm = Communicator::init_with(
        Config::from_lookup(|k| (k == "HCOMM_TIMEOUT").then(|| "0.2".to_string())).unwrap(),
    )
    .unwrap();
    let mut buf = [0u8; 4];
    for _ in 0..4 {
        comm.send(b"1234", 0, 1).unwrap();
    }
    comm.recv(&mut buf, 0, 1).unwrap();
    let mut exchanged = [0u8; 4];
    comm.sendrecv(b"5678", 0, 2, &mut exchanged, 0, 2).unwrap();
    // Sends and receives are numbered apart: after five sends, this is the 3rd receive.
    let e = comm.recv(&mut [0u8; 2], 0, 1).unwrap_err();
    assert!(matches!(e, Error::Truncated(_)), "{e}");
    assert_eq!(e.operation(), Some(Operation::seq("recv", 3)));
    // A nonblocking receive takes the next number, and its error names it when collected.
    let e = comm.irecv(vec![0; 2], 0, 1).unwrap().wait().unwrap_err();
    assert!(matches!(e, Error::Truncated(_)), "{e}");
    assert_eq!(e.operation(), Some(Operation::seq("recv", 4)));
    // The 6th receive waits for a message nobody sends.
    comm.recv(&mut buf, 0, 1).unwrap();
    let e = comm.recv(&mut buf, 0, 9).unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert_eq!(e.operation(), Some(Operation::seq("recv", 6)));
    // A call refused for its arguments takes no number.
    assert!(comm.send(b"x", 1, 0).is_err());
    comm.send(b"1234", 0, 3).unwrap();
    let e = comm.recv(&mut [0u8; 1], 0, 3).unwrap_err();
    assert_eq!(e.operation(), Some(Operation::seq("recv", 7)));
}

#[test]
fn calls_are_counted_per_algorithm_and_plans_are_reused() {
    let comm = world();
    let mut buf = [1u32; 16];
    for _ in 0..5 {
        comm.allreduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
    }
    let algo = comm.algorithm_for(CollKind::AllReduce, DataType::Uint32, ReduceOp::Sum, 16, 0);
    let counts = comm.collective_counts();
    assert!(
        counts.contains(&(CollKind::AllReduce, algo, 5)),
        "{counts:?}"
    );
}

#[test]
fn untyped_batches_fuse_and_check_lengths() {
    let comm = world();
    let mut a = 1.5f32.to_ne_bytes().repeat(3);
    let mut b = 2i64.to_ne_bytes().to_vec();
    let mut c = 7u16.to_ne_bytes().repeat(5);
    let mut d = vec![9u8; 3];
    let mut e = (-4.0f32).to_ne_bytes().to_vec();
    let mut batch = comm.batch();
    batch
        .allreduce_bytes(&mut a, DataType::Float32, ReduceOp::Max)
        .unwrap()
        .allreduce_bytes(&mut c, DataType::Float16, ReduceOp::Max)
        .unwrap()
        .broadcast_bytes(&mut d, 0)
        .allreduce_bytes(&mut e, DataType::Float32, ReduceOp::Max)
        .unwrap();
    batch
        .allreduce_bytes(&mut b, DataType::Int64, ReduceOp::Avg)
        .unwrap();
    let mut odd = [0u8; 3];
    assert!(matches!(
        batch.allreduce_bytes(&mut odd, DataType::Int32, ReduceOp::Sum),
        Err(Error::InvalidArgument(_))
    ));
    batch.run().unwrap();
    assert_eq!(a, 1.5f32.to_ne_bytes().repeat(3));
    assert_eq!(b, 2i64.to_ne_bytes());
    assert_eq!(c, 7u16.to_ne_bytes().repeat(5));
    assert_eq!(d, [9, 9, 9]);
    assert_eq!(e, (-4.0f32).to_ne_bytes());
    // One all-reduce per (type, op) and one broadcast: four calls for five operations.
    let calls: u64 = comm.collective_counts().iter().map(|c| c.2).sum();
    assert_eq!(calls, 4);
}
