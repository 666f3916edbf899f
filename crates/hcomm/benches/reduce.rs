//! Reduction kernels against memcpy over 16 MiB.
//!
//! Every benchmark reports the bytes of its 16 MiB destination per second, so the ratio of a
//! reduce's throughput to memcpy's says how close the kernel comes to moving memory. A reduce
//! reads two buffers and writes one; memcpy reads one and writes one.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hcomm::reduce::{self, scalar};
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
            1.0f32.to_ne_bytes().to_vec(),
            0.5f32.to_ne_bytes().to_vec(),
        ),
        (
            DataType::Bfloat16,
            half::bf16::ONE.to_ne_bytes().to_vec(),
            half::bf16::from_f32(0.5).to_ne_bytes().to_vec(),
        ),
    ];
    for (dtype, acc, value) in types {
        let src = filled(&value);
        let mut dst = filled(&acc);
        group.bench_function(BenchmarkId::new("sum_scalar", dtype), |b| {
            b.iter(|| scalar::reduce_into(dtype, ReduceOp::Sum, &mut dst, black_box(&src)));
        });
        let isa = reduce::kernel_isa();
        group.bench_function(BenchmarkId::new(format!("sum_{isa}"), dtype), |b| {
            b.iter(|| reduce::reduce_into(dtype, ReduceOp::Sum, &mut dst, black_box(&src)));
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
