//! Element types as Python spells them, and reduction operations.

use hcomm::{DataType, ReduceOp};
use pyo3::prelude::*;

use crate::errors::invalid;

/// The element types of the Python API, by their numpy names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    Bool,
    Int8,
    Uint8,
    Int16,
    Uint16,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Float16,
    Bfloat16,
    Float32,
    Float64,
}

impl Dtype {
    const ALL: [Dtype; 13] = [
        Dtype::Bool,
        Dtype::Int8,
        Dtype::Uint8,
        Dtype::Int16,
        Dtype::Uint16,
        Dtype::Int32,
        Dtype::Uint32,
        Dtype::Int64,
        Dtype::Uint64,
        Dtype::Float16,
        Dtype::Bfloat16,
        Dtype::Float32,
        Dtype::Float64,
    ];

    /// The numpy name (the core's name for the same type).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::Int8 => "int8",
            Dtype::Uint8 => "uint8",
            Dtype::Int16 => "int16",
            Dtype::Uint16 => "uint16",
            Dtype::Int32 => "int32",
            Dtype::Uint32 => "uint32",
            Dtype::Int64 => "int64",
            Dtype::Uint64 => "uint64",
            Dtype::Float16 => "float16",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
        }
    }

    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::Int8 | Dtype::Uint8 => 1,
            Dtype::Int16 | Dtype::Uint16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Int32 | Dtype::Uint32 | Dtype::Float32 => 4,
            Dtype::Int64 | Dtype::Uint64 | Dtype::Float64 => 8,
        }
    }

    /// The type called `name` (numpy's name).
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The type of a buffer-protocol format (`struct` module syntax) with items of
    /// `itemsize` bytes: `Ok(None)` for plain bytes of formats without arithmetic
    /// (`c`, `x`), `Err(format)` for formats hcomm cannot move as they are.
    pub fn from_format(format: &[u8], itemsize: usize) -> Result<Option<Dtype>, String> {
        let shown = || String::from_utf8_lossy(format).into_owned();
        let (order, code) = match format {
            [] => (b'@', b'B'),
            [c] => (b'@', *c),
            [o @ (b'@' | b'=' | b'<' | b'>' | b'!'), c] => (*o, *c),
            _ => return Err(shown()),
        };
        if matches!(order, b'>' | b'!') && itemsize > 1 && cfg!(target_endian = "little") {
            return Err(shown());
        }
        let signed = |size| match size {
            1 => Some(Dtype::Int8),
            2 => Some(Dtype::Int16),
            4 => Some(Dtype::Int32),
            8 => Some(Dtype::Int64),
            _ => None,
        };
        let unsigned = |size| match size {
            1 => Some(Dtype::Uint8),
            2 => Some(Dtype::Uint16),
            4 => Some(Dtype::Uint32),
            8 => Some(Dtype::Uint64),
            _ => None,
        };
        let dtype = match code {
            b'?' => Some(Dtype::Bool),
            b'b' | b'h' | b'i' | b'l' | b'q' | b'n' => signed(itemsize),
            b'B' | b'H' | b'I' | b'L' | b'Q' | b'N' => unsigned(itemsize),
            b'e' => Some(Dtype::Float16),
            b'f' => Some(Dtype::Float32),
            b'd' => Some(Dtype::Float64),
            b'c' | b'x' if itemsize == 1 => return Ok(None),
            _ => None,
        };
        match dtype {
            Some(d) if d.size() == itemsize => Ok(Some(d)),
            _ => Err(shown()),
        }
    }

    /// The type of a DLPack `(code, bits)` with one lane.
    pub fn from_dlpack(code: u8, bits: u8) -> Option<Dtype> {
        match (code, bits) {
            (0, 8) => Some(Dtype::Int8),
            (0, 16) => Some(Dtype::Int16),
            (0, 32) => Some(Dtype::Int32),
            (0, 64) => Some(Dtype::Int64),
            (1, 8) => Some(Dtype::Uint8),
            (1, 16) => Some(Dtype::Uint16),
            (1, 32) => Some(Dtype::Uint32),
            (1, 64) => Some(Dtype::Uint64),
            (2, 16) => Some(Dtype::Float16),
            (2, 32) => Some(Dtype::Float32),
            (2, 64) => Some(Dtype::Float64),
            (4, 16) => Some(Dtype::Bfloat16),
            (6, 8) => Some(Dtype::Bool),
            _ => None,
        }
    }

    /// The core's data type.
    pub fn core(self) -> DataType {
        match self {
            Dtype::Bool => DataType::Bool,
            Dtype::Int8 => DataType::Int8,
            Dtype::Uint8 => DataType::Uint8,
            Dtype::Int16 => DataType::Int16,
            Dtype::Uint16 => DataType::Uint16,
            Dtype::Int32 => DataType::Int32,
            Dtype::Uint32 => DataType::Uint32,
            Dtype::Int64 => DataType::Int64,
            Dtype::Uint64 => DataType::Uint64,
            Dtype::Float16 => DataType::Float16,
            Dtype::Bfloat16 => DataType::Bfloat16,
            Dtype::Float32 => DataType::Float32,
            Dtype::Float64 => DataType::Float64,
        }
    }
}

/// The core type and count for a collective that only moves data: untyped bytes travel as
/// uint8.
pub fn moving(dtype: Option<Dtype>, count: usize) -> (DataType, usize) {
    (dtype.map_or(DataType::Uint8, Dtype::core), count)
}

/// The core type for a reduction on `dtype` (the core refuses the pairs it has no
/// arithmetic for, such as bitwise operations on floats, before anything is sent).
pub fn reducing(dtype: Option<Dtype>, what: &str) -> PyResult<DataType> {
    dtype.map(Dtype::core).ok_or_else(|| {
        invalid(format!(
            "{what}: the buffer has untyped bytes; reductions need a numeric type"
        ))
    })
}

/// The reductions, by the values of `hcomm.Op` (the C API's `hcommRedOp_t`) and by name.
const OPS: [(&str, ReduceOp); 8] = [
    ("sum", ReduceOp::Sum),
    ("prod", ReduceOp::Prod),
    ("max", ReduceOp::Max),
    ("min", ReduceOp::Min),
    ("avg", ReduceOp::Avg),
    ("band", ReduceOp::BAnd),
    ("bor", ReduceOp::BOr),
    ("bxor", ReduceOp::BXor),
];

/// A reduction operation from `hcomm.SUM`, ... (an `int`) or its name (`"sum"`, ...).
pub fn op_from(obj: &Bound<'_, PyAny>) -> PyResult<ReduceOp> {
    if let Ok(v) = obj.extract::<i64>() {
        return usize::try_from(v)
            .ok()
            .and_then(|v| OPS.get(v))
            .map(|&(_, op)| op)
            .ok_or_else(|| invalid(format!("op: {v} is not a reduction operation")));
    }
    let Ok(name) = obj.extract::<String>() else {
        return Err(invalid(
            "op: pass hcomm.SUM, hcomm.PROD, ... or a name such as \"sum\"".to_owned(),
        ));
    };
    OPS.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(&name))
        .map(|&(_, op)| op)
        .ok_or_else(|| {
            let names: Vec<&str> = OPS.iter().map(|(n, _)| *n).collect();
            invalid(format!("op: {name:?} is not one of {}", names.join(", ")))
        })
}
