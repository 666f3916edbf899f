//! Element types and reduction operations of collectives.
//!
//! [`DataType`] and [`ReduceOp`] are the runtime descriptions that travel through schedules, the
//! wire and the C API (their discriminants are the C enum values); [`Element`] ties a Rust type
//! to its [`DataType`] for the typed API.

#![forbid(unsafe_code)]

use std::fmt;

/// The element type of a collective's buffers.
///
/// The discriminants are the values of the C API's `hcommDataType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
    /// Signed 8-bit integer.
    Int8 = 0,
    /// Unsigned 8-bit integer.
    Uint8 = 1,
    /// Signed 32-bit integer.
    Int32 = 2,
    /// Unsigned 32-bit integer.
    Uint32 = 3,
    /// Signed 64-bit integer.
    Int64 = 4,
    /// Unsigned 64-bit integer.
    Uint64 = 5,
    /// IEEE 754 binary16 ([`half::f16`]).
    Float16 = 6,
    /// bfloat16: the upper half of an IEEE binary32 ([`half::bf16`]).
    Bfloat16 = 7,
    /// IEEE 754 binary32.
    Float32 = 8,
    /// IEEE 754 binary64.
    Float64 = 9,
    /// Truth values, one byte each: 0 is false and every other byte true (results are always
    /// 0 or 1). Rust's `bool`, C's `bool`, numpy's and torch's `bool`.
    Bool = 10,
    /// Signed 16-bit integer.
    Int16 = 11,
    /// Unsigned 16-bit integer.
    Uint16 = 12,
}

impl DataType {
    /// Every data type, in discriminant order.
    pub const ALL: [DataType; 13] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bool,
        DataType::Int16,
        DataType::Uint16,
    ];

    /// The size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Bool => 1,
            DataType::Int16 | DataType::Uint16 | DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// The name used by tools, configuration and messages: `"int8"`, …, `"bfloat16"`, …,
    /// `"float64"`, `"bool"`, `"int16"`, `"uint16"`.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "float16",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float32 => "float32",
            DataType::Float64 => "float64",
            DataType::Bool => "bool",
            DataType::Int16 => "int16",
            DataType::Uint16 => "uint16",
        }
    }

    /// The data type called `name` (as [`DataType::name`] spells it, ASCII case ignored).
    pub fn from_name(name: &str) -> Option<DataType> {
        DataType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The data type whose C enum value is `value`.
    pub fn from_u8(value: u8) -> Option<DataType> {
        DataType::ALL.get(usize::from(value)).copied()
    }

    /// Whether this is a floating-point type (float16, bfloat16, float32, float64).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16 | DataType::Bfloat16 | DataType::Float32 | DataType::Float64
        )
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The reduction operation of a reduce, all-reduce or reduce-scatter.
///
/// The discriminants are the values of the C API's `hcommRedOp_t`. Semantics, for every
/// [`DataType`]:
///
/// - Integers: `Sum` and `Prod` wrap around in two's complement (never a panic, also in debug
///   builds); `Avg` is the wrapped sum divided by the number of ranks, truncated toward zero;
///   `BAnd`, `BOr`, `BXor` are bitwise and, or, exclusive or.
/// - Bool (every nonzero byte is true; results are 0 or 1): `Sum` and `Max` are logical or,
///   `Prod` and `Min` logical and (as numpy's `add` and `multiply` on bool arrays), `BAnd`,
///   `BOr`, `BXor` logical and, or, exclusive or. `Avg` is refused.
/// - Floats: IEEE 754 addition and multiplication with round-to-nearest-even; float16 and
///   bfloat16 are computed in f32 and rounded to nearest even back. `Max` and `Min` are IEEE
///   754-2019 `maximum`/`minimum`: NaN if either operand is NaN, and −0 < +0. Every NaN result
///   is the canonical quiet NaN (`0x7E00`, `0x7FC0`, `0x7FC0_0000`, `0x7FF8_0000_0000_0000`), so
///   results do not depend on the order of operands, the CPU or the kernel that ran. The
///   bitwise operations are refused.
///
/// A refused pair ([`ReduceOp::supports`]) fails with `InvalidArgument` before anything is
/// sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum.
    Sum = 0,
    /// Product.
    Prod = 1,
    /// Maximum.
    Max = 2,
    /// Minimum.
    Min = 3,
    /// Average: the sum divided by the number of contributions.
    Avg = 4,
    /// Bitwise and (logical and on bool).
    BAnd = 5,
    /// Bitwise or (logical or on bool).
    BOr = 6,
    /// Bitwise exclusive or (logical on bool).
    BXor = 7,
}

impl ReduceOp {
    /// Every operation, in discriminant order.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::BAnd,
        ReduceOp::BOr,
        ReduceOp::BXor,
    ];

    /// The name used by tools, configuration and messages: `"sum"`, `"prod"`, `"max"`, `"min"`,
    /// `"avg"`, `"band"`, `"bor"`, `"bxor"`.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::BAnd => "band",
            ReduceOp::BOr => "bor",
            ReduceOp::BXor => "bxor",
        }
    }

    /// Whether this is one of the bitwise operations (`BAnd`, `BOr`, `BXor`).
    pub const fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor)
    }

    /// Whether the operation is defined on `dtype`: every one on integers; all but the
    /// bitwise ones on floats; all but `Avg` on bool.
    pub const fn supports(self, dtype: DataType) -> bool {
        match dtype {
            DataType::Bool => !matches!(self, ReduceOp::Avg),
            _ if dtype.is_float() => !self.is_bitwise(),
            _ => true,
        }
    }

    /// The operation called `name` (as [`ReduceOp::name`] spells it, ASCII case ignored).
    pub fn from_name(name: &str) -> Option<ReduceOp> {
        ReduceOp::ALL
            .into_iter()
            .find(|op| op.name().eq_ignore_ascii_case(name))
    }

    /// The operation whose C enum value is `value`.
    pub fn from_u8(value: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(usize::from(value)).copied()
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

pub(crate) mod sealed {
    /// The byte views of an element type, for hcomm only.
    pub trait Sealed: Sized {
        /// The bytes of `s`.
        fn as_bytes(s: &[Self]) -> &[u8];
        /// Runs `f` on the bytes of `s`, which it may overwrite with any bytes: for `bool`
        /// through a copy, written back as truth values (a `bool` holds only 0 or 1).
        fn with_bytes_mut<R>(s: &mut [Self], f: impl FnOnce(&mut [u8]) -> R) -> R;
    }
}

/// Rust element types usable with the typed collective API.
///
/// Implemented for `bool`, `i8`, `u8`, `i16`, `u16`, `i32`, `u32`, `i64`, `u64`,
/// [`half::f16`], [`half::bf16`], `f32` and `f64`; sealed, because [`Element::DTYPE`] must
/// describe the type's bytes exactly. Received `bool` buffers go through a copy (any byte
/// from a peer is read as a truth value); the other types are used in place.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The data type of this element type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {
            fn as_bytes(s: &[Self]) -> &[u8] {
                bytemuck::cast_slice(s)
            }
            fn with_bytes_mut<R>(s: &mut [Self], f: impl FnOnce(&mut [u8]) -> R) -> R {
                f(bytemuck::cast_slice_mut(s))
            }
        }
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
        }
    )*};
}

impl sealed::Sealed for bool {
    fn as_bytes(s: &[Self]) -> &[u8] {
        bytemuck::cast_slice(s)
    }
    fn with_bytes_mut<R>(s: &mut [Self], f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut bytes = bytemuck::cast_slice::<bool, u8>(s).to_vec();
        let r = f(&mut bytes);
        for (b, &x) in s.iter_mut().zip(&bytes) {
            *b = x != 0;
        }
        r
    }
}

impl Element for bool {
    const DTYPE: DataType = DataType::Bool;
}

element! {
    i8 => Int8,
    u8 => Uint8,
    i16 => Int16,
    u16 => Uint16,
    i32 => Int32,
    u32 => Uint32,
    i64 => Int64,
    u64 => Uint64,
    half::f16 => Float16,
    half::bf16 => Bfloat16,
    f32 => Float32,
    f64 => Float64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in DataType::ALL {
            assert_eq!(DataType::from_name(t.name()), Some(t));
            assert_eq!(DataType::from_name(&t.name().to_uppercase()), Some(t));
            assert_eq!(DataType::from_u8(t as u8), Some(t));
            assert_eq!(t.to_string(), t.name());
        }
        for op in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_name(op.name()), Some(op));
            assert_eq!(ReduceOp::from_u8(op as u8), Some(op));
            assert_eq!(op.to_string(), op.name());
        }
        assert_eq!(DataType::from_name("float"), None);
        assert_eq!(DataType::from_u8(13), None);
        assert_eq!(ReduceOp::from_name("mean"), None);
        assert_eq!(ReduceOp::from_u8(8), None);
    }

    #[test]
    fn discriminants_follow_all() {
        for (i, t) in DataType::ALL.into_iter().enumerate() {
            assert_eq!(t as usize, i);
        }
        for (i, op) in ReduceOp::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, i);
        }
    }

    #[test]
    fn sizes_and_kinds() {
        fn check<T: Element>() {
            assert_eq!(T::DTYPE.size(), std::mem::size_of::<T>());
            assert!(ReduceOp::ALL.iter().any(|op| op.supports(T::DTYPE)));
        }
        check::<i8>();
        check::<u8>();
        check::<bool>();
        check::<i16>();
        check::<u16>();
        check::<i32>();
        check::<u32>();
        check::<i64>();
        check::<u64>();
        check::<half::f16>();
        check::<half::bf16>();
        check::<f32>();
        check::<f64>();
        let floats: Vec<_> = DataType::ALL.into_iter().filter(|t| t.is_float()).collect();
        assert_eq!(
            floats,
            [
                DataType::Float16,
                DataType::Bfloat16,
                DataType::Float32,
                DataType::Float64
            ]
        );
    }

    #[test]
    fn supported_pairs() {
        for t in DataType::ALL {
            for op in ReduceOp::ALL {
                let want = match (t, op) {
                    (DataType::Bool, ReduceOp::Avg) => false,
                    (t, op) if t.is_float() => !op.is_bitwise(),
                    _ => true,
                };
                assert_eq!(op.supports(t), want, "{op} on {t}");
            }
        }
    }

    #[test]
    fn bool_buffers_come_back_as_truth_values() {
        let mut b = [false, true, false];
        let seen = <bool as sealed::Sealed>::with_bytes_mut(&mut b, |bytes| {
            let seen = bytes.to_vec();
            bytes.copy_from_slice(&[2, 0, 255]);
            seen
        });
        assert_eq!(seen, [0, 1, 0]);
        assert_eq!(b, [true, false, true]);
        assert_eq!(<bool as sealed::Sealed>::as_bytes(&b), [1, 0, 1]);
    }
}
