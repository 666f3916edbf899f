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
}

impl DataType {
    /// Every data type, in discriminant order.
    pub const ALL: [DataType; 10] = [
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
    ];

    /// The size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// The name used by tools, configuration and messages: `"int8"`, …, `"bfloat16"`, …,
    /// `"float64"`.
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
///   builds); `Avg` is the wrapped sum divided by the number of ranks, truncated toward zero.
/// - Floats: IEEE 754 addition and multiplication with round-to-nearest-even; float16 and
///   bfloat16 are computed in f32 and rounded to nearest even back. `Max` and `Min` are IEEE
///   754-2019 `maximum`/`minimum`: NaN if either operand is NaN, and −0 < +0. Every NaN result
///   is the canonical quiet NaN (`0x7E00`, `0x7FC0`, `0x7FC0_0000`, `0x7FF8_0000_0000_0000`), so
///   results do not depend on the order of operands, the CPU or the kernel that ran.
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
}

impl ReduceOp {
    /// Every operation, in discriminant order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// The name used by tools, configuration and messages: `"sum"`, `"prod"`, `"max"`, `"min"`,
    /// `"avg"`.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
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

mod sealed {
    pub trait Sealed {}
}

/// Rust element types usable with the typed collective API.
///
/// Implemented for `i8`, `u8`, `i32`, `u32`, `i64`, `u64`, [`half::f16`], [`half::bf16`], `f32`
/// and `f64`; sealed, because [`Element::DTYPE`] must describe the type's bytes exactly.
pub trait Element: bytemuck::Pod + Send + Sync + 'static + sealed::Sealed {
    /// The data type of this element type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
        }
    )*};
}

element! {
    i8 => Int8,
    u8 => Uint8,
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
        assert_eq!(DataType::from_u8(10), None);
        assert_eq!(ReduceOp::from_name("mean"), None);
        assert_eq!(ReduceOp::from_u8(5), None);
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
        }
        check::<i8>();
        check::<u8>();
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
}
