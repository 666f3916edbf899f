//! Reduction kernels: combine two buffers element by element.
//!
//! Buffers are raw bytes of one [`DataType`], in native byte order, at any alignment (they are
//! user buffers and slices of messages). The semantics of every operation are documented on
//! [`ReduceOp`]; [`scalar`] is the reference implementation, and the vectorised kernels that
//! [`reduce_into`], [`reduce_to`] and [`finish_avg`] dispatch to produce exactly its bytes.
//!
//! The kernel set is chosen once per process from the CPU's features ([`kernel_isa`]):
//!
//! - `"avx2"`: x86_64 with AVX2 and F16C, 32 bytes at a time, every type and operation
//!   (integer [`finish_avg`] stays scalar: x86 has no vector integer division);
//! - `"scalar"`: everywhere else.
//!
//! `Avg` reduces like `Sum`; whoever holds the final sum calls [`finish_avg`] once.

use std::sync::OnceLock;

use crate::dtype::{DataType, ReduceOp};
use crate::{Error, Result};

/// Bytes of the widest vector a kernel set uses (AVX2's 32).
const VECTOR: usize = 32;

// `check_whole` masks with the element size: every size is a power of two.
const _: () = {
    let mut i = 0;
    while i < DataType::ALL.len() {
        assert!(DataType::ALL[i].size().is_power_of_two());
        i += 1;
    }
};

pub(crate) mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

/// `dst[i] = dst[i] (op) src[i]` for every element.
///
/// `Avg` accumulates like `Sum`; finish with `finish_avg`. Fails with
/// [`Error::InvalidArgument`] unless both slices have the same length, a multiple of
/// `dtype.size()`, and `op` is defined on `dtype` ([`ReduceOp::supports`]).
pub fn reduce_into(dtype: DataType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> Result<()> {
    check_op(dtype, op)?;
    check_pair(dtype, dst.len(), src.len())?;
    // Shorter than a vector: the vectorised kernels would leave it all to their scalar tail.
    if dst.len() < VECTOR {
        scalar::into(dtype, op, dst, src);
        return Ok(());
    }
    match isa() {
        Isa::Scalar => scalar::into(dtype, op, dst, src),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(k) => k.reduce_into(dtype, op, dst, src),
    }
    Ok(())
}

/// `dst[i] = a[i] (op) b[i]` for every element.
///
/// `Avg` accumulates like `Sum`; finish with [`finish_avg`]. Fails with
/// [`Error::InvalidArgument`] unless all three slices have the same length, a multiple of
/// `dtype.size()`, and `op` is defined on `dtype` ([`ReduceOp::supports`]).
pub(crate) fn reduce_to(
    dtype: DataType,
    op: ReduceOp,
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
) -> Result<()> {
    check_op(dtype, op)?;
    check_pair(dtype, dst.len(), a.len())?;
    check_pair(dtype, dst.len(), b.len())?;
    match isa() {
        Isa::Scalar => scalar::to(dtype, op, dst, a, b),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(k) => k.reduce_to(dtype, op, dst, a, b),
    }
    Ok(())
}

/// Turns the sum of `n` contributions in `buf` into their average, in place.
///
/// Integers: the (wrapped) sum divided by `n`, truncated toward zero. Floats: `x / n` with `n`
/// converted to the float type (float16 and bfloat16 compute in f32 and round to nearest even).
/// Fails with [`Error::InvalidArgument`] if `n` is 0, `buf.len()` is not a multiple of
/// `dtype.size()`, or `dtype` has no average (bool).
pub(crate) fn finish_avg(dtype: DataType, buf: &mut [u8], n: usize) -> Result<()> {
    check_avg(dtype, buf.len(), n)?;
    match isa() {
        Isa::Scalar => scalar::avg(dtype, buf, n),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(k) => k.finish_avg(dtype, buf, n),
    }
    Ok(())
}

/// Copies `src` into `dst` (equal lengths); on a CPU with AVX the copy bypasses the cache
/// with non-temporal stores, so the destination is not read before it is written (a third
/// less memory traffic) and does not evict what the caller works on — for data that does not
/// fit the caches anyway. The copy is complete and ordered before any later store of the
/// caller. Fails with [`Error::InvalidArgument`] if the lengths differ.
pub(crate) fn copy_streaming(dst: &mut [u8], src: &[u8]) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::invalid_argument(format!(
            "copy of {} bytes into {} bytes",
            src.len(),
            dst.len()
        )));
    }
    match isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(k) => k.copy_streaming(dst, src),
        _ => dst.copy_from_slice(src),
    }
    Ok(())
}

/// The instruction set of the kernels this process dispatches to: `"avx2"` or `"scalar"`.
pub fn kernel_isa() -> &'static str {
    match isa() {
        Isa::Scalar => "scalar",
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(_) => "avx2",
    }
}

/// A kernel set; the vectorised ones carry the proof that the CPU supports them.
#[derive(Debug, Clone, Copy)]
enum Isa {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(x86::Avx2),
}

fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = x86::Avx2::detect() {
            return Isa::Avx2(k);
        }
        Isa::Scalar
    })
}

/// Checks that two buffers hold the same whole number of `dtype` elements.
fn check_pair(dtype: DataType, dst: usize, src: usize) -> Result<()> {
    if dst != src {
        return Err(Error::invalid_argument(format!(
            "reduce of {dtype}: the destination has {dst} bytes but an operand has {src}"
        )));
    }
    check_whole(dtype, dst)
}

/// Checks that `op` is defined on `dtype`.
fn check_op(dtype: DataType, op: ReduceOp) -> Result<()> {
    if op.supports(dtype) {
        return Ok(());
    }
    Err(Error::invalid_argument(format!(
        "reduce: {op} is not defined on {dtype} (the bitwise operations take integers and \
         bool; avg takes numbers)"
    )))
}

fn check_avg(dtype: DataType, len: usize, n: usize) -> Result<()> {
    check_op(dtype, ReduceOp::Avg)?;
    if n == 0 {
        return Err(Error::invalid_argument(format!(
            "average of {dtype} over 0 contributions"
        )));
    }
    check_whole(dtype, len)
}

fn check_whole(dtype: DataType, len: usize) -> Result<()> {
    // Element sizes are powers of two: a mask, not a division.
    if len & (dtype.size() - 1) != 0 {
        return Err(Error::invalid_argument(format!(
            "reduce of {dtype}: {len} bytes is not a whole number of {}-byte elements",
            dtype.size()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bit patterns that stress each type: zeros of both signs, infinities, NaNs of both signs
    /// (quiet and signalling), the smallest subnormal, the largest finite value, one, and for
    /// integers the extremes.
    fn specials(dtype: DataType) -> &'static [u64] {
        match dtype {
            DataType::Float16 => &[
                0, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x7C01, 1, 0x7BFF, 0x3C00,
            ],
            DataType::Bfloat16 => &[
                0, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 1, 0x7F7F, 0x3F80,
            ],
            DataType::Float32 => &[
                0,
                0x8000_0000,
                0x7F80_0000,
                0xFF80_0000,
                0x7FC0_0000,
                0xFFC0_0001,
                0x7F80_0001,
                1,
                0x7F7F_FFFF,
                0x3F80_0000,
            ],
            DataType::Float64 => &[
                0,
                1 << 63,
                0x7FF0 << 48,
                0xFFF0 << 48,
                0x7FF8 << 48,
                0xFFF8 << 48 | 1,
                0x7FF0 << 48 | 1,
                1,
                0x7FEF_FFFF_FFFF_FFFF,
                0x3FF0 << 48,
            ],
            _ => &[
                0,
                1,
                u64::MAX,
                1 << 7,
                1 << 31,
                1 << 63,
                0x7F,
                0x7FFF_FFFF,
                u64::MAX >> 1,
            ],
        }
    }

    /// One operand: `bytes` of pad, then the elements (each a raw pattern or a special,
    /// truncated to the type), so the kernels see every alignment.
    fn operand(dtype: DataType, pad: usize, picks: &[(u64, u8)]) -> Vec<u8> {
        let size = dtype.size();
        let mut v = vec![0xA5; pad];
        for &(bits, k) in picks {
            let special = specials(dtype);
            let bits = if usize::from(k) < special.len() {
                special[usize::from(k)]
            } else {
                bits
            };
            v.extend_from_slice(&bits.to_le_bytes()[..size]);
        }
        v
    }

    fn element_picks() -> impl Strategy<Value = Vec<(u64, u8)>> {
        // Half the elements are specials, half random patterns; a small pool of random values
        // would add ties, which the specials already provide.
        prop::collection::vec((any::<u64>(), 0u8..20), 0..1000)
    }

    /// Runs all three kernels, dispatched and reference, on every type and operation.
    fn compare_all(picks: &[(u64, u8)], pads: [usize; 3], n: usize) {
        let (a_picks, b_picks) = (picks, &picks[picks.len() / 2..]);
        let len = b_picks.len();
        let a_picks = &a_picks[..len];
        for dtype in DataType::ALL {
            let a = operand(dtype, pads[0], a_picks);
            let b = operand(dtype, pads[1], b_picks);
            let (a, b) = (&a[pads[0]..], &b[pads[1]..]);
            for op in ReduceOp::ALL {
                let mut want = a.to_vec();
                if !op.supports(dtype) {
                    // Refused by both, before touching the destination.
                    let refused = |r: Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
                    assert!(refused(scalar::reduce_into(dtype, op, &mut want, b)));
                    assert!(refused(reduce_into(dtype, op, &mut want, b)));
                    assert!(refused(reduce_to(dtype, op, &mut want, a, b)));
                    assert_eq!(want, a, "{dtype} {op}");
                    continue;
                }
                scalar::reduce_into(dtype, op, &mut want, b).unwrap();
                if dtype == DataType::Bool {
                    assert!(want.iter().all(|&x| x <= 1), "{op}: truth values");
                }

                let mut got = vec![0; pads[2] + a.len()];
                got[pads[2]..].copy_from_slice(a);
                reduce_into(dtype, op, &mut got[pads[2]..], b).unwrap();
                assert_eq!(&got[pads[2]..], &want[..], "reduce_into {dtype} {op}");

                let mut got = vec![0; pads[2] + a.len()];
                reduce_to(dtype, op, &mut got[pads[2]..], a, b).unwrap();
                assert_eq!(&got[pads[2]..], &want[..], "reduce_to {dtype} {op}");

                let mut avg = want.clone();
                if !ReduceOp::Avg.supports(dtype) {
                    assert!(scalar::finish_avg(dtype, &mut avg, n).is_err());
                    assert!(finish_avg(dtype, &mut avg, n).is_err());
                    continue;
                }
                scalar::finish_avg(dtype, &mut avg, n).unwrap();
                let mut got = vec![0; pads[2] + a.len()];
                got[pads[2]..].copy_from_slice(&want);
                finish_avg(dtype, &mut got[pads[2]..], n).unwrap();
                assert_eq!(&got[pads[2]..], &avg[..], "finish_avg {dtype} by {n}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn dispatched_kernels_match_the_reference(
            picks in element_picks(),
            pads in [0usize..32, 0usize..32, 0usize..32],
            n in prop_oneof![1usize..10, any::<usize>().prop_map(|n| n.max(1))],
        ) {
            compare_all(&picks, pads, n);
        }
    }

    /// Every length around the vector width, so every tail length runs.
    #[test]
    fn every_short_length_matches_the_reference() {
        let picks: Vec<(u64, u8)> = (0..200u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15), (i % 23) as u8))
            .collect();
        for len in 0..100 {
            compare_all(&picks[..2 * len], [len % 7, len % 5, len % 3], 3);
        }
    }

    #[test]
    fn streaming_copies_equal_plain_ones_at_every_alignment() {
        let src: Vec<u8> = (0..5000).map(|i| (i * 7 + 3) as u8).collect();
        for (off, len) in [(0, 4096), (1, 4101), (31, 4900), (3, 100), (5, 0)] {
            let mut dst = vec![0u8; len + 64];
            copy_streaming(&mut dst[off..off + len], &src[..len]).unwrap();
            assert_eq!(&dst[off..off + len], &src[..len]);
            assert!(dst[..off].iter().chain(&dst[off + len..]).all(|&b| b == 0));
        }
        assert!(copy_streaming(&mut [0u8; 3], &[0u8; 4]).is_err());
    }

    #[test]
    fn isa_is_the_best_the_cpu_runs() {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
            assert_eq!(kernel_isa(), "avx2");
            return;
        }
        assert_eq!(kernel_isa(), "scalar");
    }

    #[test]
    fn ragged_lengths_are_invalid_arguments() {
        let mut d = [0u8; 8];
        let err = reduce_into(DataType::Float32, ReduceOp::Sum, &mut d, &[0; 4]).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        let err = reduce_to(
            DataType::Int64,
            ReduceOp::Max,
            &mut d[..4],
            &[0; 4],
            &[0; 4],
        );
        assert!(matches!(err, Err(Error::InvalidArgument(_))));
        let err = finish_avg(DataType::Float16, &mut d, 0);
        assert!(matches!(err, Err(Error::InvalidArgument(_))));
        let err = finish_avg(DataType::Float16, &mut d[..3], 2);
        assert!(matches!(err, Err(Error::InvalidArgument(_))));
    }
}
