//! AVX2 + F16C kernels for x86_64.
//!
//! Every kernel takes 32 bytes at a time with unaligned loads and stores and leaves the tail
//! (under 32 bytes) to the scalar reference. They reproduce the reference bit for bit: NaN
//! results become the canonical NaN, ties of `max`/`min` (equal values or zeros of both signs)
//! resolve with `a & b` / `a | b` of the bit patterns, float16 rounds with F16C's
//! round-to-nearest-even and bfloat16 rounds with integer arithmetic exactly like
//! `half::bf16::from_f32`.
//!
//! There is no AVX-512 level: its intrinsics need Rust 1.89, above the workspace's
//! `rust-version`. At 16 MiB AVX2 already keeps up with memcpy; bfloat16, at about 24
//! instructions per 32 bytes (widen, add, NaN test, round, narrow), is the kernel that would
//! gain from it when a busy hyperthread sibling takes half the vector units.

use std::arch::x86_64::*;

use super::scalar;
use crate::dtype::{DataType, ReduceOp};

/// Proof that the CPU runs AVX2 and F16C: only [`Avx2::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx2 {
    _proof: (),
}

/// Evaluates `$body` with `$l` naming the [`Lanes`] of `$dtype`.
macro_rules! by_type {
    ($dtype:expr, $l:ident => $body:expr) => {
        match $dtype {
            DataType::Int8 => {
                type $l = I8;
                $body
            }
            DataType::Uint8 => {
                type $l = U8;
                $body
            }
            DataType::Bool => {
                type $l = Bool;
                $body
            }
            DataType::Int16 => {
                type $l = I16;
                $body
            }
            DataType::Uint16 => {
                type $l = U16;
                $body
            }
            DataType::Int32 => {
                type $l = I32;
                $body
            }
            DataType::Uint32 => {
                type $l = U32;
                $body
            }
            DataType::Int64 => {
                type $l = I64;
                $body
            }
            DataType::Uint64 => {
                type $l = U64;
                $body
            }
            DataType::Float16 => {
                type $l = F16;
                $body
            }
            DataType::Bfloat16 => {
                type $l = Bf16;
                $body
            }
            DataType::Float32 => {
                type $l = F32;
                $body
            }
            DataType::Float64 => {
                type $l = F64;
                $body
            }
        }
    };
}

/// Evaluates `$body` with `$o` naming the [`Op`] of `$op` (`Avg` reduces like `Sum`).
macro_rules! by_op {
    ($op:expr, $o:ident => $body:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => {
                type $o = Sum;
                $body
            }
            ReduceOp::Prod => {
                type $o = Prod;
                $body
            }
            ReduceOp::Max => {
                type $o = Max;
                $body
            }
            ReduceOp::Min => {
                type $o = Min;
                $body
            }
            ReduceOp::BAnd => {
                type $o = BAnd;
                $body
            }
            ReduceOp::BOr => {
                type $o = BOr;
                $body
            }
            ReduceOp::BXor => {
                type $o = BXor;
                $body
            }
        }
    };
}

type IntoKernel = unsafe fn(&mut [u8], &[u8]);
type ToKernel = unsafe fn(&mut [u8], &[u8], &[u8]);
type AvgKernel = unsafe fn(&mut [u8], usize);

impl Avx2 {
    /// The AVX2 kernel set, if this CPU runs it.
    pub(super) fn detect() -> Option<Avx2> {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
            Some(Avx2 { _proof: () })
        } else {
            None
        }
    }

    /// [`super::reduce_into`] for checked lengths.
    pub(super) fn reduce_into(self, dtype: DataType, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
        let kernel: IntoKernel = by_type!(dtype, L => by_op!(op, O => into::<L, O>));
        // SAFETY: `self` exists only where `detect` found AVX2 and F16C, the kernels' only
        // requirement.
        unsafe { kernel(dst, src) }
    }

    /// [`super::reduce_to`] for checked lengths.
    pub(super) fn reduce_to(
        self,
        dtype: DataType,
        op: ReduceOp,
        dst: &mut [u8],
        a: &[u8],
        b: &[u8],
    ) {
        let kernel: ToKernel = by_type!(dtype, L => by_op!(op, O => to::<L, O>));
        // SAFETY: `self` exists only where `detect` found AVX2 and F16C, the kernels' only
        // requirement.
        unsafe { kernel(dst, a, b) }
    }

    /// [`super::copy_streaming`] for slices of equal length.
    pub(super) fn copy_streaming(self, dst: &mut [u8], src: &[u8]) {
        // SAFETY: `self` exists only where `detect` found AVX2 (which includes AVX, the
        // kernel's only requirement); the slices have equal lengths (the caller checked).
        unsafe { stream_copy(dst, src) }
    }

    /// [`super::finish_avg`] for checked arguments; integers stay scalar (no vector division).
    pub(super) fn finish_avg(self, dtype: DataType, buf: &mut [u8], n: usize) {
        let kernel: AvgKernel = match dtype {
            DataType::Float16 => avg::<F16>,
            DataType::Bfloat16 => avg::<Bf16>,
            DataType::Float32 => avg::<F32>,
            DataType::Float64 => avg::<F64>,
            _ => return scalar::avg(dtype, buf, n),
        };
        // SAFETY: `self` exists only where `detect` found AVX2 and F16C, the kernels' only
        // requirement.
        unsafe { kernel(buf, n) }
    }
}

/// `dst = dst (O) src` over the whole elements of the shorter slice.
///
/// # Safety
///
/// The CPU must run AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn into<L: Lanes, O: Op>(dst: &mut [u8], src: &[u8]) {
    let len = dst.len().min(src.len());
    let body = len - len % 32;
    let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 32 <= body <= len` keeps the 32-byte accesses inside both slices, the
        // accesses are unaligned ones, and our caller provides AVX2 and F16C.
        unsafe { store(d.add(i), L::apply::<O>(load(d.add(i)), load(s.add(i)))) };
        i += 32;
    }
    // The tail, where there is one (its scalar loop divides to count its elements).
    if body < len {
        scalar::into(L::DTYPE, O::OP, &mut dst[body..len], &src[body..len]);
    }
}

/// `dst = a (O) b` over the whole elements of the shortest slice.
///
/// # Safety
///
/// The CPU must run AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn to<L: Lanes, O: Op>(dst: &mut [u8], a: &[u8], b: &[u8]) {
    let len = dst.len().min(a.len()).min(b.len());
    let body = len - len % 32;
    let (d, x, y) = (dst.as_mut_ptr(), a.as_ptr(), b.as_ptr());
    let mut i = 0;
    if len >= PREFETCH_FROM {
        while i + 64 <= body {
            // Operands beyond the caches (a large call's own contribution) arrive sooner
            // asked for ahead: the hardware prefetchers stop at every 4 KiB page.
            prefetch(x.wrapping_add(i + PREFETCH_AHEAD));
            prefetch(y.wrapping_add(i + PREFETCH_AHEAD));
            // SAFETY: `i + 64 <= body <= len` keeps the two 32-byte accesses inside all
            // three slices, the accesses are unaligned ones, and our caller provides AVX2 and
            // F16C.
            unsafe {
                store(d.add(i), L::apply::<O>(load(x.add(i)), load(y.add(i))));
                store(
                    d.add(i + 32),
                    L::apply::<O>(load(x.add(i + 32)), load(y.add(i + 32))),
                );
            }
            i += 64;
        }
    }
    while i < body {
        // SAFETY: `i + 32 <= body <= len` keeps the 32-byte accesses inside all three slices,
        // the accesses are unaligned ones, and our caller provides AVX2 and F16C.
        unsafe { store(d.add(i), L::apply::<O>(load(x.add(i)), load(y.add(i)))) };
        i += 32;
    }
    if body < len {
        scalar::to(
            L::DTYPE,
            O::OP,
            &mut dst[body..len],
            &a[body..len],
            &b[body..len],
        );
    }
}

/// `buf = buf / n` over the whole elements of `buf`; `n` must be at least 1.
///
/// # Safety
///
/// The CPU must run AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn avg<L: Divide>(buf: &mut [u8], n: usize) {
    let body = buf.len() - buf.len() % 32;
    let p = buf.as_mut_ptr();
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 32 <= body <= buf.len()` keeps the 32-byte accesses inside `buf`, the
        // accesses are unaligned ones, and our caller provides AVX2 and F16C.
        unsafe { store(p.add(i), L::div(load(p.add(i)), n)) };
        i += 32;
    }
    if body < buf.len() {
        scalar::avg(L::DTYPE, &mut buf[body..], n);
    }
}

/// How far ahead of its reads `to` asks for its operands' cache lines. A 2-rank heap
/// all-reduce of 256 MiB (the own half comes from memory) took 72.1 against 77.9 ms without
/// (medians of 4 interleaved rounds, pinned; docs/tuning.md#heap-buffers-at-256-mib); 512 B
/// and 2 KiB ahead gained nothing there, and 64 KiB to 16 MiB calls, whose operands are in the
/// caches, took as long as without.
const PREFETCH_AHEAD: usize = 1024;

/// `to` prefetches (64 bytes a step) only on operands at least this long (the large one-sided
/// all-reduce's pieces); shorter ones, in the caches, take the plain 32-byte loop. With the
/// prefetch at every length a 2-rank 64 KiB pool all-reduce (32 KiB halves) took 1.10x the
/// time of the build before it (1.22x against 1.11x a27d6a5's, 5 interleaved rounds each,
/// quiet); gated, 1.00x.
const PREFETCH_FROM: usize = 128 << 10;

/// Asks for the cache line at `p` into every cache level; any address, since a prefetch never
/// faults.
#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: a prefetch is a hint: it reads nothing the program sees and never faults, at
    // any address (SSE, part of x86_64).
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
}

/// Loads 32 bytes from `p`, at any alignment.
///
/// # Safety
///
/// `p..p + 32` must be readable and the CPU must run AVX.
#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: our caller guarantees the bytes are readable and AVX; `loadu` has no alignment
    // requirement.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// Stores 32 bytes at `p`, at any alignment.
///
/// # Safety
///
/// `p..p + 32` must be writable and the CPU must run AVX.
#[inline(always)]
unsafe fn store(p: *mut u8, v: __m256i) {
    // SAFETY: our caller guarantees the bytes are writable and AVX; `storeu` has no alignment
    // requirement.
    unsafe { _mm256_storeu_si256(p.cast(), v) }
}

/// One reduction operation on 32 bytes of each element type.
///
/// Float results may carry any NaN payload where the result is NaN; [`Lanes::apply`] makes
/// every NaN canonical.
///
/// Every method requires a CPU with AVX2 and F16C (its `# Safety`).
trait Op {
    const OP: ReduceOp;
    unsafe fn i8(a: __m256i, b: __m256i) -> __m256i;
    unsafe fn u8(a: __m256i, b: __m256i) -> __m256i;
    unsafe fn i16(a: __m256i, b: __m256i) -> __m256i;
    unsafe fn u16(a: __m256i, b: __m256i) -> __m256i;
    /// Bool bytes (nonzero is true) to 0 or 1, like `scalar`'s truth functions.
    unsafe fn bool(a: __m256i, b: __m256i) -> __m256i;
    unsafe fn i32(a: __m256i, b: __m256i) -> __m256i;
    unsafe fn u32(a: __m256i, b: __m256i) -> __m256i;
    unsafe fn i64(a: __m256i, b: __m256i) -> __m256i;
    unsafe fn u64(a: __m256i, b: __m256i) -> __m256i;
    unsafe fn f32(a: __m256, b: __m256) -> __m256;
    unsafe fn f64(a: __m256d, b: __m256d) -> __m256d;
}

/// Defines an [`Op`] from one expression per element type.
macro_rules! op {
    ($name:ident = $op:ident {
        i8: $i8:path, u8: $u8:path, i16: $i16:path, u16: $u16:path, bool: $bool:path,
        i32: $i32:path, u32: $u32:path, i64: $i64:path, u64: $u64:path,
        f32: $f32:path, f64: $f64:path $(,)?
    }) => {
        struct $name;
        impl Op for $name {
            const OP: ReduceOp = ReduceOp::$op;
            #[inline(always)]
            unsafe fn i8(a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $i8(a, b) }
            }
            #[inline(always)]
            unsafe fn u8(a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $u8(a, b) }
            }
            #[inline(always)]
            unsafe fn i16(a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $i16(a, b) }
            }
            #[inline(always)]
            unsafe fn u16(a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $u16(a, b) }
            }
            #[inline(always)]
            unsafe fn bool(a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $bool(a, b) }
            }
            #[inline(always)]
            unsafe fn i32(a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $i32(a, b) }
            }
            #[inline(always)]
            unsafe fn u32(a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $u32(a, b) }
            }
            #[inline(always)]
            unsafe fn i64(a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $i64(a, b) }
            }
            #[inline(always)]
            unsafe fn u64(a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $u64(a, b) }
            }
            #[inline(always)]
            unsafe fn f32(a: __m256, b: __m256) -> __m256 {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $f32(a, b) }
            }
            #[inline(always)]
            unsafe fn f64(a: __m256d, b: __m256d) -> __m256d {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { $f64(a, b) }
            }
        }
    };
}

op!(Sum = Sum {
    i8: _mm256_add_epi8,
    u8: _mm256_add_epi8,
    i16: _mm256_add_epi16,
    u16: _mm256_add_epi16,
    bool: or_bool,
    i32: _mm256_add_epi32,
    u32: _mm256_add_epi32,
    i64: _mm256_add_epi64,
    u64: _mm256_add_epi64,
    f32: _mm256_add_ps,
    f64: _mm256_add_pd,
});

op!(Prod = Prod {
    i8: mul_epi8,
    u8: mul_epi8,
    i16: _mm256_mullo_epi16,
    u16: _mm256_mullo_epi16,
    bool: and_bool,
    i32: _mm256_mullo_epi32,
    u32: _mm256_mullo_epi32,
    i64: mul_epi64,
    u64: mul_epi64,
    f32: _mm256_mul_ps,
    f64: _mm256_mul_pd,
});

op!(Max = Max {
    i8: _mm256_max_epi8,
    u8: _mm256_max_epu8,
    i16: _mm256_max_epi16,
    u16: _mm256_max_epu16,
    bool: or_bool,
    i32: _mm256_max_epi32,
    u32: _mm256_max_epu32,
    i64: max_epi64,
    u64: max_epu64,
    f32: max_ps,
    f64: max_pd,
});

op!(Min = Min {
    i8: _mm256_min_epi8,
    u8: _mm256_min_epu8,
    i16: _mm256_min_epi16,
    u16: _mm256_min_epu16,
    bool: and_bool,
    i32: _mm256_min_epi32,
    u32: _mm256_min_epu32,
    i64: min_epi64,
    u64: min_epu64,
    f32: min_ps,
    f64: min_pd,
});

// The bitwise operations are the same on every integer width. On floats (refused by the
// public functions) they act on the bit patterns, like the reference.

op!(BAnd = BAnd {
    i8: _mm256_and_si256,
    u8: _mm256_and_si256,
    i16: _mm256_and_si256,
    u16: _mm256_and_si256,
    bool: and_bool,
    i32: _mm256_and_si256,
    u32: _mm256_and_si256,
    i64: _mm256_and_si256,
    u64: _mm256_and_si256,
    f32: _mm256_and_ps,
    f64: _mm256_and_pd,
});

op!(BOr = BOr {
    i8: _mm256_or_si256,
    u8: _mm256_or_si256,
    i16: _mm256_or_si256,
    u16: _mm256_or_si256,
    bool: or_bool,
    i32: _mm256_or_si256,
    u32: _mm256_or_si256,
    i64: _mm256_or_si256,
    u64: _mm256_or_si256,
    f32: _mm256_or_ps,
    f64: _mm256_or_pd,
});

op!(BXor = BXor {
    i8: _mm256_xor_si256,
    u8: _mm256_xor_si256,
    i16: _mm256_xor_si256,
    u16: _mm256_xor_si256,
    bool: xor_bool,
    i32: _mm256_xor_si256,
    u32: _mm256_xor_si256,
    i64: _mm256_xor_si256,
    u64: _mm256_xor_si256,
    f32: _mm256_xor_ps,
    f64: _mm256_xor_pd,
});

/// 32 bytes of one element type.
///
/// Every method requires a CPU with AVX2 and F16C (its `# Safety`).
trait Lanes {
    const DTYPE: DataType;
    /// `a (O) b` element by element.
    unsafe fn apply<O: Op>(a: __m256i, b: __m256i) -> __m256i;
}

/// 32 bytes of one float type that [`avg`] divides.
///
/// Every method requires a CPU with AVX2 and F16C (its `# Safety`).
trait Divide {
    const DTYPE: DataType;
    /// `x / n` element by element, NaN canonical, like [`scalar::avg`].
    unsafe fn div(x: __m256i, n: usize) -> __m256i;
}

macro_rules! int_lanes {
    ($($name:ident = $dtype:ident, $method:ident;)*) => {$(
        struct $name;
        impl Lanes for $name {
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            unsafe fn apply<O: Op>(a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: our caller provides AVX2 and F16C.
                unsafe { O::$method(a, b) }
            }
        }
    )*};
}

int_lanes! {
    I8 = Int8, i8;
    U8 = Uint8, u8;
    I16 = Int16, i16;
    U16 = Uint16, u16;
    Bool = Bool, bool;
    I32 = Int32, i32;
    U32 = Uint32, u32;
    I64 = Int64, i64;
    U64 = Uint64, u64;
}

struct F32;

impl Lanes for F32 {
    const DTYPE: DataType = DataType::Float32;
    #[inline(always)]
    unsafe fn apply<O: Op>(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: our caller provides AVX2 and F16C.
        unsafe {
            let r = O::f32(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
            _mm256_castps_si256(canonical_ps(r))
        }
    }
}

impl Divide for F32 {
    const DTYPE: DataType = DataType::Float32;
    #[inline(always)]
    unsafe fn div(x: __m256i, n: usize) -> __m256i {
        // SAFETY: our caller provides AVX2 and F16C.
        unsafe { _mm256_castps_si256(canonical_ps(div_ps(_mm256_castsi256_ps(x), n))) }
    }
}

struct F64;

impl Lanes for F64 {
    const DTYPE: DataType = DataType::Float64;
    #[inline(always)]
    unsafe fn apply<O: Op>(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: our caller provides AVX2 and F16C.
        unsafe {
            let r = O::f64(_mm256_castsi256_pd(a), _mm256_castsi256_pd(b));
            _mm256_castpd_si256(canonical_pd(r))
        }
    }
}

impl Divide for F64 {
    const DTYPE: DataType = DataType::Float64;
    #[inline(always)]
    unsafe fn div(x: __m256i, n: usize) -> __m256i {
        // SAFETY: our caller provides AVX2 and F16C.
        unsafe {
            let r = _mm256_div_pd(_mm256_castsi256_pd(x), _mm256_set1_pd(n as f64));
            _mm256_castpd_si256(canonical_pd(r))
        }
    }
}

/// float16: 16 elements widen to two f32 vectors (F16C), compute, and narrow back rounding to
/// nearest even.
struct F16;

impl Lanes for F16 {
    const DTYPE: DataType = DataType::Float16;
    #[inline(always)]
    unsafe fn apply<O: Op>(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: our caller provides AVX2 and F16C.
        unsafe {
            let (a0, a1) = f16_to_f32(a);
            let (b0, b1) = f16_to_f32(b);
            f32_to_f16(O::f32(a0, b0), O::f32(a1, b1))
        }
    }
}

impl Divide for F16 {
    const DTYPE: DataType = DataType::Float16;
    #[inline(always)]
    unsafe fn div(x: __m256i, n: usize) -> __m256i {
        // SAFETY: our caller provides AVX2 and F16C.
        unsafe {
            let (x0, x1) = f16_to_f32(x);
            f32_to_f16(div_ps(x0, n), div_ps(x1, n))
        }
    }
}

/// bfloat16: the even and odd elements of 16 widen to two f32 vectors by shifting, compute, and
/// narrow back rounding to nearest even.
struct Bf16;

impl Lanes for Bf16 {
    const DTYPE: DataType = DataType::Bfloat16;
    #[inline(always)]
    unsafe fn apply<O: Op>(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: our caller provides AVX2 and F16C.
        unsafe {
            let (a0, a1) = bf16_to_f32(a);
            let (b0, b1) = bf16_to_f32(b);
            f32_to_bf16(O::f32(a0, b0), O::f32(a1, b1))
        }
    }
}

impl Divide for Bf16 {
    const DTYPE: DataType = DataType::Bfloat16;
    #[inline(always)]
    unsafe fn div(x: __m256i, n: usize) -> __m256i {
        // SAFETY: our caller provides AVX2 and F16C.
        unsafe {
            let (x0, x1) = bf16_to_f32(x);
            f32_to_bf16(div_ps(x0, n), div_ps(x1, n))
        }
    }
}

// The helpers below all require a CPU with AVX2 and F16C (their `# Safety`), and every
// `unsafe` block in them is sound because their caller provides both.

/// Bytes of both operands multiplied, keeping the low 8 bits (the same for signed and
/// unsigned): AVX2 multiplies 16-bit lanes only, so even and odd bytes go separately.
#[inline(always)]
unsafe fn mul_epi8(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe {
        let even = _mm256_mullo_epi16(a, b);
        let odd = _mm256_mullo_epi16(_mm256_srli_epi16::<8>(a), _mm256_srli_epi16::<8>(b));
        _mm256_or_si256(
            _mm256_slli_epi16::<8>(odd),
            _mm256_and_si256(even, _mm256_set1_epi16(0x00FF)),
        )
    }
}

/// Bytes that are 0 (false): all ones; the others (true): zero.
#[inline(always)]
unsafe fn false_bytes(a: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe { _mm256_cmpeq_epi8(a, _mm256_setzero_si256()) }
}

/// 1 where a byte of `falses` is zero, 0 where it is all ones.
#[inline(always)]
unsafe fn truth(falses: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe { _mm256_andnot_si256(falses, _mm256_set1_epi8(1)) }
}

/// Logical or of bool bytes.
#[inline(always)]
unsafe fn or_bool(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe { truth(false_bytes(_mm256_or_si256(a, b))) }
}

/// Logical and of bool bytes.
#[inline(always)]
unsafe fn and_bool(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe { truth(_mm256_or_si256(false_bytes(a), false_bytes(b))) }
}

/// Logical exclusive or of bool bytes.
#[inline(always)]
unsafe fn xor_bool(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe {
        let differ = _mm256_xor_si256(false_bytes(a), false_bytes(b));
        _mm256_and_si256(differ, _mm256_set1_epi8(1))
    }
}

/// 64-bit lanes multiplied, keeping the low 64 bits: `lo*lo + ((hi*lo + lo*hi) << 32)`.
#[inline(always)]
unsafe fn mul_epi64(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe {
        let low = _mm256_mul_epu32(a, b);
        let cross = _mm256_add_epi64(
            _mm256_mul_epu32(_mm256_srli_epi64::<32>(a), b),
            _mm256_mul_epu32(a, _mm256_srli_epi64::<32>(b)),
        );
        _mm256_add_epi64(low, _mm256_slli_epi64::<32>(cross))
    }
}

#[inline(always)]
unsafe fn max_epi64(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe { _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b)) }
}

#[inline(always)]
unsafe fn min_epi64(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe { _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)) }
}

/// Unsigned `a > b` per 64-bit lane: flipping the sign bits turns it into a signed compare.
#[inline(always)]
unsafe fn cmpgt_epu64(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe {
        let sign = _mm256_set1_epi64x(i64::MIN);
        _mm256_cmpgt_epi64(_mm256_xor_si256(a, sign), _mm256_xor_si256(b, sign))
    }
}

#[inline(always)]
unsafe fn max_epu64(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe { _mm256_blendv_epi8(b, a, cmpgt_epu64(a, b)) }
}

#[inline(always)]
unsafe fn min_epu64(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe { _mm256_blendv_epi8(a, b, cmpgt_epu64(a, b)) }
}

/// Every NaN lane replaced by `f32::NAN`. NaNs are rare, so one test skips the blend.
#[inline(always)]
unsafe fn canonical_ps(r: __m256) -> __m256 {
    // SAFETY: our caller provides AVX.
    unsafe {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(r, r);
        if _mm256_testz_ps(nan, nan) == 1 {
            return r;
        }
        _mm256_blendv_ps(r, _mm256_set1_ps(f32::NAN), nan)
    }
}

/// [`canonical_ps`] of two vectors, with one test for both.
#[inline(always)]
unsafe fn canonical2_ps(r0: __m256, r1: __m256) -> (__m256, __m256) {
    // SAFETY: our caller provides AVX.
    unsafe {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(r0, r1);
        if _mm256_testz_ps(nan, nan) == 1 {
            return (r0, r1);
        }
        (canonical_ps(r0), canonical_ps(r1))
    }
}

/// Every NaN lane replaced by `f64::NAN`. NaNs are rare, so one test skips the blend.
#[inline(always)]
unsafe fn canonical_pd(r: __m256d) -> __m256d {
    // SAFETY: our caller provides AVX.
    unsafe {
        let nan = _mm256_cmp_pd::<_CMP_UNORD_Q>(r, r);
        if _mm256_testz_pd(nan, nan) == 1 {
            return r;
        }
        _mm256_blendv_pd(r, _mm256_set1_pd(f64::NAN), nan)
    }
}

// The float operations leave NaN payloads as the hardware makes them; [`Lanes::apply`] makes
// them canonical.

#[inline(always)]
unsafe fn div_ps(x: __m256, n: usize) -> __m256 {
    // SAFETY: our caller provides AVX.
    unsafe { _mm256_div_ps(x, _mm256_set1_ps(n as f32)) }
}

/// IEEE 754-2019 maximum up to NaN payloads: `vmaxps` decides every ordered, unequal pair, ties
/// take `a & b` (+0 over -0) and unordered pairs all ones (a NaN).
#[inline(always)]
unsafe fn max_ps(a: __m256, b: __m256) -> __m256 {
    // SAFETY: our caller provides AVX.
    unsafe {
        let tie = _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b);
        let r = _mm256_blendv_ps(_mm256_max_ps(a, b), _mm256_and_ps(a, b), tie);
        _mm256_or_ps(r, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, b))
    }
}

/// IEEE 754-2019 minimum up to NaN payloads: like [`max_ps`], ties take `a | b` (-0 over +0).
#[inline(always)]
unsafe fn min_ps(a: __m256, b: __m256) -> __m256 {
    // SAFETY: our caller provides AVX.
    unsafe {
        let tie = _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b);
        let r = _mm256_blendv_ps(_mm256_min_ps(a, b), _mm256_or_ps(a, b), tie);
        _mm256_or_ps(r, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, b))
    }
}

/// See [`max_ps`].
#[inline(always)]
unsafe fn max_pd(a: __m256d, b: __m256d) -> __m256d {
    // SAFETY: our caller provides AVX.
    unsafe {
        let tie = _mm256_cmp_pd::<_CMP_EQ_OQ>(a, b);
        let r = _mm256_blendv_pd(_mm256_max_pd(a, b), _mm256_and_pd(a, b), tie);
        _mm256_or_pd(r, _mm256_cmp_pd::<_CMP_UNORD_Q>(a, b))
    }
}

/// See [`min_ps`].
#[inline(always)]
unsafe fn min_pd(a: __m256d, b: __m256d) -> __m256d {
    // SAFETY: our caller provides AVX.
    unsafe {
        let tie = _mm256_cmp_pd::<_CMP_EQ_OQ>(a, b);
        let r = _mm256_blendv_pd(_mm256_min_pd(a, b), _mm256_or_pd(a, b), tie);
        _mm256_or_pd(r, _mm256_cmp_pd::<_CMP_UNORD_Q>(a, b))
    }
}

/// 16 float16 values as f32: elements 0..8 and 8..16 (exact).
#[inline(always)]
unsafe fn f16_to_f32(x: __m256i) -> (__m256, __m256) {
    // SAFETY: our caller provides AVX2 and F16C.
    unsafe {
        (
            _mm256_cvtph_ps(_mm256_castsi256_si128(x)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(x)),
        )
    }
}

/// The inverse of [`f16_to_f32`], rounding to nearest even like `half::f16::from_f32`, every
/// NaN canonical.
#[inline(always)]
unsafe fn f32_to_f16(lo: __m256, hi: __m256) -> __m256i {
    // SAFETY: our caller provides AVX and F16C.
    unsafe {
        let (lo, hi) = canonical2_ps(lo, hi);
        _mm256_set_m128i(
            _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(hi),
            _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(lo),
        )
    }
}

const HIGH_HALVES: i32 = 0xFFFF_0000_u32 as i32;

/// 16 bfloat16 values as f32: the even and the odd elements (a bfloat16 is the upper half of
/// an f32, so each widening is a shift or a mask).
#[inline(always)]
unsafe fn bf16_to_f32(x: __m256i) -> (__m256, __m256) {
    // SAFETY: our caller provides AVX2.
    unsafe {
        (
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x)),
            _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(HIGH_HALVES))),
        )
    }
}

/// The inverse of [`bf16_to_f32`], rounding to nearest even like `half::bf16::from_f32`, every
/// NaN canonical (first, as rounding could carry a NaN's payload into infinity).
#[inline(always)]
unsafe fn f32_to_bf16(even: __m256, odd: __m256) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe {
        let (even, odd) = canonical2_ps(even, odd);
        _mm256_or_si256(
            _mm256_srli_epi32::<16>(round_bf16(even)),
            _mm256_and_si256(round_bf16(odd), _mm256_set1_epi32(HIGH_HALVES)),
        )
    }
}

/// `x`'s bits plus `0x7FFF` plus the lowest kept bit: the upper 16 bits are then `x` rounded to
/// nearest even (a carry into the exponent is the correct rounding up, to infinity at most).
#[inline(always)]
unsafe fn round_bf16(x: __m256) -> __m256i {
    // SAFETY: our caller provides AVX2.
    unsafe {
        let x = _mm256_castps_si256(x);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)))
    }
}

/// Copies `src` to `dst` (equal lengths) with non-temporal 32-byte stores to the aligned
/// middle of `dst`, then a store fence.
///
/// # Safety
/// The CPU must support AVX.
#[target_feature(enable = "avx")]
unsafe fn stream_copy(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_sfence};
    let len = dst.len().min(src.len());
    let head = dst.as_ptr().align_offset(32).min(len);
    dst[..head].copy_from_slice(&src[..head]);
    let mut i = head;
    let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
    while i + 128 <= len {
        // SAFETY: `i + 128 <= len`, so the four 32-byte loads and stores are in bounds; the
        // stores are 32-byte aligned (`head` aligned `d + i`, and `i` moves in steps of 128).
        unsafe {
            let a = _mm256_loadu_si256(s.add(i).cast::<__m256i>());
            let b = _mm256_loadu_si256(s.add(i + 32).cast::<__m256i>());
            let c = _mm256_loadu_si256(s.add(i + 64).cast::<__m256i>());
            let e = _mm256_loadu_si256(s.add(i + 96).cast::<__m256i>());
            _mm256_stream_si256(d.add(i).cast::<__m256i>(), a);
            _mm256_stream_si256(d.add(i + 32).cast::<__m256i>(), b);
            _mm256_stream_si256(d.add(i + 64).cast::<__m256i>(), c);
            _mm256_stream_si256(d.add(i + 96).cast::<__m256i>(), e);
        }
        i += 128;
    }
    dst[i..len].copy_from_slice(&src[i..len]);
    // Non-temporal stores are weakly ordered: make them visible before anything the caller
    // stores next (a release store that tells a peer the data is there).
    _mm_sfence();
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// The narrowing conversions agree with `half` on every sign, exponent and mantissa top
    /// with the low bits that matter for rounding; NaNs become the canonical NaN.
    #[test]
    fn narrowing_matches_half() {
        let Some(_) = Avx2::detect() else { return };
        let lows = [
            0u32, 1, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x3001, 0x6FFF, 0x7FFF, 0x8000,
            0x8001, 0x9000, 0xB000, 0xFFFF,
        ];
        let mut inputs: Vec<f32> = (0..=0xFFFFu32)
            .flat_map(|hi| lows.map(|lo| f32::from_bits(hi << 16 | lo)))
            .collect();
        inputs.resize(inputs.len().next_multiple_of(16), 0.0);
        for chunk in inputs.chunks_exact(16) {
            let (lo, hi) = chunk.split_at(8);
            let (mut bf, mut f) = ([0u16; 16], [0u16; 16]);
            // SAFETY: AVX2 and F16C were detected above; the loads read 8 f32 from 8-element
            // slices and the stores write 32 bytes into 16-element `u16` arrays.
            unsafe {
                let lo = _mm256_loadu_ps(lo.as_ptr());
                let hi = _mm256_loadu_ps(hi.as_ptr());
                _mm256_storeu_si256(bf.as_mut_ptr().cast(), f32_to_bf16(lo, hi));
                _mm256_storeu_si256(f.as_mut_ptr().cast(), f32_to_f16(lo, hi));
            }
            for (i, &x) in chunk.iter().enumerate() {
                let x = if x.is_nan() { f32::NAN } else { x };
                // `f32_to_bf16` interleaves: even lanes from the first vector, odd ones from
                // the second.
                let j = if i < 8 { 2 * i } else { 2 * (i - 8) + 1 };
                assert_eq!(
                    bf[j],
                    bf16::from_f32(x).to_bits(),
                    "bf16 of {:#x}",
                    x.to_bits()
                );
                assert_eq!(
                    f[i],
                    f16::from_f32(x).to_bits(),
                    "f16 of {:#x}",
                    x.to_bits()
                );
            }
        }
    }
}
