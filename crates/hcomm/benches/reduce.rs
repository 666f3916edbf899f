//! Reduction kernels against memcpy over 16 MiB: sums of float32, bfloat16, int16 and bool
//! (logical or), exclusive or of uint32, each scalar and vectorised.
//!
//! Every benchmark reports the bytes of its 16 MiB destination per second, so the ratio of a
//! reduce's throughput to memcpy's says how close the kernel comes to moving memory. A reduce
//! reads two buffers and writes one; memcpy reads one and writes one.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hcomm::internal::reduce::{self, scalar};
use hcomm::{DataType, ReduceOp};
use std::hint::black_box;
use std::time::Duration;

const BYTES: usize = 16 << 20;

/// `BYTES` of `value` repeated (its native bytes).
fn filled(value: &[u8]) -> Vec<u8> {
    value.iter().copied().cycle().take(BYTES).collect()
}

fn memcpy_and_sum(c: &mut Criterion) {
    let mut group = c.benchmark_group("16MiB");
    group.throughput(Throughput::Bytes(BYTES as u64));

    let src = filled(&[0x5A]);
    let mut dst = filled(&[0xA5]);
    group.bench_function("memcpy", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&src)));
    });

    let types = [
        (
            DataType::Float32,
            ReduceOp::Sum,
            1.0f32.to_ne_bytes().to_vec(),
            0.5f32.to_ne_bytes().to_vec(),
        ),
        (
            DataType::Bfloat16,
            ReduceOp::Sum,
            half::bf16::ONE.to_ne_bytes().to_vec(),
            half::bf16::from_f32(0.5).to_ne_bytes().to_vec(),
        ),
        (
            DataType::Int16,
            ReduceOp::Sum,
            3i16.to_ne_bytes().to_vec(),
            (-1i16).to_ne_bytes().to_vec(),
        ),
        (
            DataType::Bool,
            ReduceOp::Sum,
            vec![0, 1, 0],
            vec![0, 0, 1, 1],
        ),
        (
            DataType::Uint32,
            ReduceOp::BXor,
            0x0F0F_0F0Fu32.to_ne_bytes().to_vec(),
            0x00FF_00FFu32.to_ne_bytes().to_vec(),
        ),
    ];
    for (dtype, op, acc, value) in types {
        let src = filled(&value);
        let mut dst = filled(&acc);
        group.bench_function(BenchmarkId::new(format!("{op}_scalar"), dtype), |b| {
            b.iter(|| scalar::reduce_into(dtype, op, &mut dst, black_box(&src)));
        });
        let isa = reduce::kernel_isa();
        group.bench_function(BenchmarkId::new(format!("{op}_{isa}"), dtype), |b| {
            b.iter(|| reduce::reduce_into(dtype, op, &mut dst, black_box(&src)));
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = memcpy_and_sum
}
criterion_main!(benches);
