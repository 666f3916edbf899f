//! The reference implementation: one element at a time, plain Rust, every target.
//!
//! The vectorised kernels must produce exactly these bytes; the tests compare them bit for bit.
//! It is also the fallback where no vectorised kernel applies (other CPUs and architectures) and
//! finishes the tails the vectorised kernels leave.

#![forbid(unsafe_code)]

use half::{bf16, f16};

use crate::dtype::{DataType, ReduceOp};
use crate::Result;

/// `dst[i] = dst[i] (op) src[i]`, one element at a time; see [`super::reduce_into`].
pub fn reduce_into(dtype: DataType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> Result<()> {
    super::check_op(dtype, op)?;
    super::check_pair(dtype, dst.len(), src.len())?;
    into(dtype, op, dst, src);
    Ok(())
}

/// `dst[i] = a[i] (op) b[i]`, one element at a time; see [`super::reduce_to`].
#[cfg(test)]
pub(crate) fn reduce_to(
    dtype: DataType,
    op: ReduceOp,
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
) -> Result<()> {
    super::check_op(dtype, op)?;
    super::check_pair(dtype, dst.len(), a.len())?;
    super::check_pair(dtype, dst.len(), b.len())?;
    to(dtype, op, dst, a, b);
    Ok(())
}

/// Divides every element by `n`, one element at a time; see [`super::finish_avg`].
pub(crate) fn finish_avg(dtype: DataType, buf: &mut [u8], n: usize) -> Result<()> {
    super::check_avg(dtype, buf.len(), n)?;
    avg(dtype, buf, n);
    Ok(())
}

/// Arithmetic of one element type, with the semantics documented on [`ReduceOp`].
///
/// Floats have bitwise operations too, on their bit patterns (NaN results canonical), which
/// the public functions refuse ([`ReduceOp::supports`]): the vectorised kernels compute the
/// same, so every kernel agrees on every pair.
trait Arith: bytemuck::Pod {
    fn sum(self, other: Self) -> Self;
    fn prod(self, other: Self) -> Self;
    fn max(self, other: Self) -> Self;
    fn min(self, other: Self) -> Self;
    fn band(self, other: Self) -> Self;
    fn bor(self, other: Self) -> Self;
    fn bxor(self, other: Self) -> Self;
    /// Divides every element of `buf` by `n` (at least 1).
    fn div_all(buf: &mut [u8], n: usize);
}

/// Runs `$body` with `$t` bound to the Rust type of `$dtype`, and `$bool` for bool (whose
/// truth values are no Rust arithmetic type: [`or`], [`and`] and [`xor`] compute them).
macro_rules! with_type {
    ($dtype:expr, $t:ident => $body:expr, bool => $bool:expr) => {
        match $dtype {
            DataType::Bool => $bool,
            DataType::Int16 => {
                type $t = i16;
                $body
            }
            DataType::Uint16 => {
                type $t = u16;
                $body
            }
            DataType::Int8 => {
                type $t = i8;
                $body
            }
            DataType::Uint8 => {
                type $t = u8;
                $body
            }
            DataType::Int32 => {
                type $t = i32;
                $body
            }
            DataType::Uint32 => {
                type $t = u32;
                $body
            }
            DataType::Int64 => {
                type $t = i64;
                $body
            }
            DataType::Uint64 => {
                type $t = u64;
                $body
            }
            DataType::Float16 => {
                type $t = f16;
                $body
            }
            DataType::Bfloat16 => {
                type $t = bf16;
                $body
            }
            DataType::Float32 => {
                type $t = f32;
                $body
            }
            DataType::Float64 => {
                type $t = f64;
                $body
            }
        }
    };
}

/// Runs `$body` with `$f` bound to the function of `$op` on elements of `$t`, a function
/// item (so that it inlines into the loop).
macro_rules! with_op {
    ($op:expr, $t:ty, $f:ident => $body:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => {
                let $f = <$t as Arith>::sum;
                $body
            }
            ReduceOp::Prod => {
                let $f = <$t as Arith>::prod;
                $body
            }
            ReduceOp::Max => {
                let $f = <$t as Arith>::max;
                $body
            }
            ReduceOp::Min => {
                let $f = <$t as Arith>::min;
                $body
            }
            ReduceOp::BAnd => {
                let $f = <$t as Arith>::band;
                $body
            }
            ReduceOp::BOr => {
                let $f = <$t as Arith>::bor;
                $body
            }
            ReduceOp::BXor => {
                let $f = <$t as Arith>::bxor;
                $body
            }
        }
    };
}

/// Truth functions on bool bytes (nonzero is true; the result is 0 or 1).
fn or(a: u8, b: u8) -> u8 {
    u8::from(a | b != 0)
}

fn and(a: u8, b: u8) -> u8 {
    u8::from(a != 0 && b != 0)
}

fn xor(a: u8, b: u8) -> u8 {
    u8::from((a != 0) != (b != 0))
}

/// Runs `$body` with `$f` bound to the truth function of `$op`: `Sum` and `Max` are or,
/// `Prod` and `Min` and (`Avg`, refused by the public functions, accumulates like `Sum`).
macro_rules! with_truth {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Max | ReduceOp::BOr => {
                let $f = or;
                $body
            }
            ReduceOp::Prod | ReduceOp::Min | ReduceOp::BAnd => {
                let $f = and;
                $body
            }
            ReduceOp::BXor => {
                let $f = xor;
                $body
            }
        }
    };
}

/// [`reduce_into`] without the checks: whole elements of the shorter slice.
pub(super) fn into(dtype: DataType, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    with_type!(
        dtype,
        T => with_op!(op, T, f => zip_into::<T>(dst, src, f)),
        bool => with_truth!(op, f => zip_into::<u8>(dst, src, f))
    )
}

/// [`reduce_to`] without the checks: whole elements of the shortest slice.
pub(super) fn to(dtype: DataType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    with_type!(
        dtype,
        T => with_op!(op, T, f => zip_to::<T>(dst, a, b, f)),
        bool => with_truth!(op, f => zip_to::<u8>(dst, a, b, f))
    )
}

/// [`finish_avg`] without the checks (`n` must be at least 1): whole elements of `buf`. Bool
/// has no average (the public functions refuse it): its bytes stay.
pub(super) fn avg(dtype: DataType, buf: &mut [u8], n: usize) {
    with_type!(dtype, T => T::div_all(buf, n), bool => ())
}

#[inline(always)]
fn zip_into<T: bytemuck::Pod>(dst: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T) {
    // By index rather than zipped chunks: the zip's set-up (its length divisions) cost more
    // than a few elements' arithmetic, and the one-sided calls reduce a few elements at a time.
    let size = std::mem::size_of::<T>();
    let len = dst.len().min(src.len()) / size * size;
    let (dst, src) = (&mut dst[..len], &src[..len]);
    let mut at = 0;
    while at < len {
        let r = f(
            bytemuck::pod_read_unaligned(&dst[at..at + size]),
            bytemuck::pod_read_unaligned(&src[at..at + size]),
        );
        dst[at..at + size].copy_from_slice(bytemuck::bytes_of(&r));
        at += size;
    }
}

#[inline(always)]
fn zip_to<T: bytemuck::Pod>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(T, T) -> T) {
    let size = std::mem::size_of::<T>();
    let ab = a.chunks_exact(size).zip(b.chunks_exact(size));
    for (d, (x, y)) in dst.chunks_exact_mut(size).zip(ab) {
        let r = f(
            bytemuck::pod_read_unaligned(x),
            bytemuck::pod_read_unaligned(y),
        );
        d.copy_from_slice(bytemuck::bytes_of(&r));
    }
}

#[inline(always)]
fn map<T: bytemuck::Pod>(buf: &mut [u8], f: impl Fn(T) -> T) {
    for d in buf.chunks_exact_mut(std::mem::size_of::<T>()) {
        let r = f(bytemuck::pod_read_unaligned(d));
        d.copy_from_slice(bytemuck::bytes_of(&r));
    }
}

macro_rules! int_arith {
    ($($t:ty => $wide:ty),* $(,)?) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn sum(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            #[inline(always)]
            fn prod(self, other: Self) -> Self {
                self.wrapping_mul(other)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                Ord::max(self, other)
            }
            #[inline(always)]
            fn min(self, other: Self) -> Self {
                Ord::min(self, other)
            }
            #[inline(always)]
            fn band(self, other: Self) -> Self {
                self & other
            }
            #[inline(always)]
            fn bor(self, other: Self) -> Self {
                self | other
            }
            #[inline(always)]
            fn bxor(self, other: Self) -> Self {
                self ^ other
            }
            fn div_all(buf: &mut [u8], n: usize) {
                match <$t>::try_from(n) {
                    // `d >= 1`: the quotient truncates toward zero and cannot overflow.
                    Ok(d) => map(buf, |x: $t| x.wrapping_div(d)),
                    // `n` exceeds the type: only a wider division tells 0 from -1.
                    Err(_) => map(buf, |x: $t| {
                        let q = <$wide>::from(x) / n as $wide;
                        q as $t
                    }),
                }
            }
        }
    )*};
}

int_arith! {
    i8 => i128,
    u8 => u128,
    i16 => i128,
    u16 => u128,
    i32 => i128,
    u32 => u128,
    i64 => i128,
    u64 => u128,
}

macro_rules! float_arith {
    ($($t:ident),* $(,)?) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn sum(self, other: Self) -> Self {
                canonical(self + other)
            }
            #[inline(always)]
            fn prod(self, other: Self) -> Self {
                canonical(self * other)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() {
                    $t::NAN
                } else if self > other {
                    self
                } else if other > self {
                    other
                } else {
                    // Equal: the same value, or zeros of either sign, where +0 wins.
                    $t::from_bits(self.to_bits() & other.to_bits())
                }
            }
            #[inline(always)]
            fn min(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() {
                    $t::NAN
                } else if self < other {
                    self
                } else if other < self {
                    other
                } else {
                    // Equal: the same value, or zeros of either sign, where -0 wins.
                    $t::from_bits(self.to_bits() | other.to_bits())
                }
            }
            #[inline(always)]
            fn band(self, other: Self) -> Self {
                canonical($t::from_bits(self.to_bits() & other.to_bits()))
            }
            #[inline(always)]
            fn bor(self, other: Self) -> Self {
                canonical($t::from_bits(self.to_bits() | other.to_bits()))
            }
            #[inline(always)]
            fn bxor(self, other: Self) -> Self {
                canonical($t::from_bits(self.to_bits() ^ other.to_bits()))
            }
            fn div_all(buf: &mut [u8], n: usize) {
                let d = n as $t;
                map(buf, |x: $t| canonical(x / d));
            }
        }

        impl Canonical for $t {
            #[inline(always)]
            fn canonical(self) -> Self {
                if self.is_nan() {
                    $t::NAN
                } else {
                    self
                }
            }
        }
    )*};
}

float_arith!(f32, f64);

/// Replaces every NaN by the one canonical quiet NaN (`f32::NAN`, `f64::NAN`).
trait Canonical {
    fn canonical(self) -> Self;
}

#[inline(always)]
fn canonical<T: Canonical>(x: T) -> T {
    x.canonical()
}

/// float16 and bfloat16 compute in f32 and round back to nearest even (`from_f32` does).
macro_rules! half_arith {
    ($($t:ident),* $(,)?) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn sum(self, other: Self) -> Self {
                $t::from_f32(Arith::sum(self.to_f32(), other.to_f32()))
            }
            #[inline(always)]
            fn prod(self, other: Self) -> Self {
                $t::from_f32(Arith::prod(self.to_f32(), other.to_f32()))
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                $t::from_f32(Arith::max(self.to_f32(), other.to_f32()))
            }
            #[inline(always)]
            fn min(self, other: Self) -> Self {
                $t::from_f32(Arith::min(self.to_f32(), other.to_f32()))
            }
            #[inline(always)]
            fn band(self, other: Self) -> Self {
                $t::from_f32(Arith::band(self.to_f32(), other.to_f32()))
            }
            #[inline(always)]
            fn bor(self, other: Self) -> Self {
                $t::from_f32(Arith::bor(self.to_f32(), other.to_f32()))
            }
            #[inline(always)]
            fn bxor(self, other: Self) -> Self {
                $t::from_f32(Arith::bxor(self.to_f32(), other.to_f32()))
            }
            fn div_all(buf: &mut [u8], n: usize) {
                let d = n as f32;
                map(buf, |x: $t| $t::from_f32(canonical(x.to_f32() / d)));
            }
        }
    )*};
}

half_arith!(f16, bf16);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Element;

    fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    fn values<T: bytemuck::Pod>(b: &[u8]) -> Vec<T> {
        b.chunks_exact(std::mem::size_of::<T>())
            .map(bytemuck::pod_read_unaligned)
            .collect()
    }

    fn apply<T: bytemuck::Pod + Element>(op: ReduceOp, a: &[T], b: &[T]) -> Vec<T> {
        let mut d = bytes(a);
        reduce_into(T::DTYPE, op, &mut d, &bytes(b)).unwrap();
        let mut e = vec![0u8; d.len()];
        reduce_to(T::DTYPE, op, &mut e, &bytes(a), &bytes(b)).unwrap();
        assert_eq!(d, e, "reduce_into and reduce_to agree");
        values(&d)
    }

    fn avg_of<T: bytemuck::Pod + Element>(v: &[T], n: usize) -> Vec<T> {
        let mut d = bytes(v);
        finish_avg(T::DTYPE, &mut d, n).unwrap();
        values(&d)
    }

    #[test]
    fn integers_wrap() {
        assert_eq!(
            apply(ReduceOp::Sum, &[i8::MAX, -128], &[1, -1]),
            [i8::MIN, 127]
        );
        assert_eq!(apply(ReduceOp::Prod, &[100i8, -128], &[3, -1]), [44, -128]);
        assert_eq!(apply(ReduceOp::Sum, &[u8::MAX], &[2]), [1]);
        assert_eq!(apply(ReduceOp::Avg, &[u32::MAX], &[1]), [0]);
        assert_eq!(apply(ReduceOp::Prod, &[u64::MAX], &[u64::MAX]), [1]);
        assert_eq!(apply(ReduceOp::Sum, &[i64::MIN], &[-1]), [i64::MAX]);
        assert_eq!(apply(ReduceOp::Max, &[-5i32, 7], &[3, -9]), [3, 7]);
        assert_eq!(apply(ReduceOp::Min, &[u32::MAX, 0], &[1, 1]), [1, 0]);
    }

    #[test]
    fn sixteen_bit_integers_and_bitwise_operations() {
        assert_eq!(
            apply(ReduceOp::Sum, &[i16::MAX, -3], &[1, 1]),
            [i16::MIN, -2]
        );
        assert_eq!(apply(ReduceOp::Prod, &[300u16, 7], &[300, 3]), [24464, 21]);
        assert_eq!(apply(ReduceOp::Max, &[-5i16, 7], &[3, -9]), [3, 7]);
        assert_eq!(apply(ReduceOp::Min, &[u16::MAX, 0], &[1, 1]), [1, 0]);
        assert_eq!(avg_of(&[-7i16, 9], 2), [-3, 4]);
        let (a, b) = (0b1100u16, 0b1010u16);
        assert_eq!(apply(ReduceOp::BAnd, &[a], &[b]), [0b1000]);
        assert_eq!(apply(ReduceOp::BOr, &[a], &[b]), [0b1110]);
        assert_eq!(apply(ReduceOp::BXor, &[a], &[b]), [0b0110]);
        assert_eq!(apply(ReduceOp::BAnd, &[-1i64, 6], &[5, 3]), [5, 2]);
        assert_eq!(apply(ReduceOp::BXor, &[0xF0u8], &[0xFF]), [0x0F]);
    }

    #[test]
    fn bool_is_logic_on_truth_bytes() {
        let (a, b) = ([0u8, 0, 1, 1, 2, 0xFF], [0u8, 1, 0, 1, 0, 0x80]);
        let run = |op| {
            let mut d = a.to_vec();
            reduce_into(DataType::Bool, op, &mut d, &b).unwrap();
            d
        };
        let or = [0, 1, 1, 1, 1, 1];
        let and = [0, 0, 0, 1, 0, 1];
        assert_eq!(run(ReduceOp::Sum), or);
        assert_eq!(run(ReduceOp::Max), or);
        assert_eq!(run(ReduceOp::BOr), or);
        assert_eq!(run(ReduceOp::Prod), and);
        assert_eq!(run(ReduceOp::Min), and);
        assert_eq!(run(ReduceOp::BAnd), and);
        assert_eq!(run(ReduceOp::BXor), [0, 1, 1, 0, 1, 0]);
        let mut d = a.to_vec();
        let e = reduce_into(DataType::Bool, ReduceOp::Avg, &mut d, &b).unwrap_err();
        assert!(e.to_string().contains("avg"), "{e}");
        assert!(finish_avg(DataType::Bool, &mut d, 2).is_err());
        assert_eq!(d, a);
    }

    #[test]
    fn floats_refuse_bitwise_operations() {
        for dtype in DataType::ALL.into_iter().filter(|t| t.is_float()) {
            for op in [ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor] {
                let mut d = vec![0u8; dtype.size()];
                let e = reduce_into(dtype, op, &mut d, &vec![0; dtype.size()]).unwrap_err();
                assert!(matches!(e, crate::Error::InvalidArgument(_)), "{e}");
            }
        }
    }

    #[test]
    fn integer_avg_truncates_toward_zero() {
        assert_eq!(avg_of(&[7i32, -7, 6, -1], 2), [3, -3, 3, 0]);
        assert_eq!(avg_of(&[-128i8, 127, -1], 3), [-42, 42, 0]);
        // Divisors wider than the type.
        assert_eq!(avg_of(&[-128i8, 127, -127], 128), [-1, 0, 0]);
        assert_eq!(avg_of(&[-128i8, 127], 129), [0, 0]);
        assert_eq!(avg_of(&[255u8, 3], 256), [0, 0]);
        assert_eq!(avg_of(&[i64::MIN, i64::MAX], usize::MAX), [0, 0]);
        assert_eq!(avg_of(&[u64::MAX], usize::MAX), [1]);
    }

    #[test]
    fn float_semantics() {
        let nan = f32::from_bits(0xFFC0_0001);
        assert_eq!(apply(ReduceOp::Sum, &[1.5f32], &[2.25]), [3.75]);
        let r = apply(
            ReduceOp::Sum,
            &[f32::INFINITY, nan],
            &[f32::NEG_INFINITY, 1.0],
        );
        assert_eq!(r.map_bits(), [0x7FC0_0000; 2]);
        let r = apply(
            ReduceOp::Max,
            &[0.0f32, -0.0, 1.0, nan],
            &[-0.0, 0.0, nan, 1.0],
        );
        assert_eq!(r.map_bits(), [0, 0, 0x7FC0_0000, 0x7FC0_0000]);
        let r = apply(ReduceOp::Min, &[0.0f32, -0.0, -1.0], &[-0.0, 0.0, 2.0]);
        assert_eq!(
            r.map_bits(),
            [0x8000_0000, 0x8000_0000, (-1.0f32).to_bits()]
        );
        let r = apply(ReduceOp::Max, &[0.0f64, f64::NAN], &[-0.0, -3.0]);
        assert_eq!(r[0].to_bits(), 0);
        assert_eq!(r[1].to_bits(), f64::NAN.to_bits());
        assert_eq!(avg_of(&[3.0f64, -1.0], 4), [0.75, -0.25]);
        assert_eq!(avg_of(&[f32::NAN], 4).map_bits(), [0x7FC0_0000]);
    }

    #[test]
    fn half_types_round_to_nearest_even() {
        // 2048 + 1 is halfway between representable float16 values 2048 and 2050: even wins.
        let r = apply(ReduceOp::Sum, &[f16::from_f32(2048.0)], &[f16::ONE]);
        assert_eq!(r, [f16::from_f32(2048.0)]);
        let r = apply(ReduceOp::Sum, &[f16::from_f32(2050.0)], &[f16::ONE]);
        assert_eq!(r, [f16::from_f32(2052.0)]);
        // 256 + 1 is halfway between bfloat16 256 and 258.
        let r = apply(ReduceOp::Sum, &[bf16::from_f32(256.0)], &[bf16::ONE]);
        assert_eq!(r, [bf16::from_f32(256.0)]);
        let r = apply(ReduceOp::Sum, &[bf16::from_f32(258.0)], &[bf16::ONE]);
        assert_eq!(r, [bf16::from_f32(260.0)]);
        let r = apply(ReduceOp::Prod, &[bf16::INFINITY], &[bf16::ZERO]);
        assert_eq!(r[0].to_bits(), 0x7FC0);
        let r = apply(ReduceOp::Max, &[f16::NAN], &[f16::ONE]);
        assert_eq!(r[0].to_bits(), 0x7E00);
        assert_eq!(avg_of(&[bf16::from_f32(3.0)], 2), [bf16::from_f32(1.5)]);
        assert_eq!(
            avg_of(&[f16::MAX], 100_000),
            [f16::from_f32(65504.0 / 100_000.0)]
        );
    }

    trait MapBits {
        fn map_bits(&self) -> Vec<u32>;
    }

    impl MapBits for Vec<f32> {
        fn map_bits(&self) -> Vec<u32> {
            self.iter().map(|x| x.to_bits()).collect()
        }
    }

    #[test]
    fn lengths_are_checked() {
        let mut d = [0u8; 8];
        assert!(reduce_into(DataType::Float32, ReduceOp::Sum, &mut d, &[0; 4]).is_err());
        assert!(reduce_into(DataType::Float32, ReduceOp::Sum, &mut d[..6], &[0; 6]).is_err());
        assert!(reduce_to(DataType::Int8, ReduceOp::Sum, &mut d, &[0; 8], &[0; 7]).is_err());
        assert!(finish_avg(DataType::Int64, &mut d, 0).is_err());
        assert!(finish_avg(DataType::Int64, &mut d[..4], 2).is_err());
        assert!(reduce_into(DataType::Uint64, ReduceOp::Sum, &mut d, &[0; 8]).is_ok());
        assert!(reduce_into(DataType::Uint64, ReduceOp::Sum, &mut [], &[]).is_ok());
    }
}
