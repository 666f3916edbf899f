//! Element types as Python spells them, and reduction operations.

use hcomm::{DataType, ReduceOp};
use pyo3::prelude::*;

use crate::errors::{invalid, not_supported};

/// The element types of the Python API (SPEC F10), by their numpy names.
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

    /// The core's data type, when the core has this one.
    pub fn core(self) -> Option<DataType> {
        DataType::from_name(self.name())
    }
}

/// The core type and count for a collective that only moves data: a type the core lacks
/// travels as its bytes.
pub fn moving(dtype: Option<Dtype>, count: usize) -> (DataType, usize) {
    match dtype {
        Some(d) => match d.core() {
            Some(t) => (t, count),
            None => (DataType::Uint8, count * d.size()),
        },
        None => (DataType::Uint8, count),
    }
}

/// The core type for a reduction on `dtype`.
pub fn reducing(dtype: Option<Dtype>, what: &str) -> PyResult<DataType> {
    let d = dtype.ok_or_else(|| {
        invalid(format!(
            "{what}: the buffer has untyped bytes; reductions need a numeric type"
        ))
    })?;
    d.core().ok_or_else(|| {
        not_supported(format!(
            "{what}: reductions on {} are not in this build of the core",
            d.name()
        ))
    })
}

/// The reduction names, by the values of `hcomm.Op` (the C API's `hcommRedOp_t`).
const OP_NAMES: [&str; 8] = ["sum", "prod", "max", "min", "avg", "band", "bor", "bxor"];

/// A reduction operation from `hcomm.SUM`, ... (an `int`) or its name (`"sum"`, ...).
pub fn op_from(obj: &Bound<'_, PyAny>) -> PyResult<ReduceOp> {
    let name = if let Ok(v) = obj.extract::<i64>() {
        usize::try_from(v)
            .ok()
            .and_then(|v| OP_NAMES.get(v).copied())
            .ok_or_else(|| invalid(format!("op: {v} is not a reduction operation")))?
            .to_owned()
    } else if let Ok(s) = obj.extract::<String>() {
        s.to_ascii_lowercase()
    } else {
        return Err(invalid(
            "op: pass hcomm.SUM, hcomm.PROD, ... or a name such as \"sum\"".to_owned(),
        ));
    };
    if !OP_NAMES.contains(&name.as_str()) {
        return Err(invalid(format!(
            "op: {name:?} is not one of {}",
            OP_NAMES.join(", ")
        )));
    }
    ReduceOp::from_name(&name)
        .ok_or_else(|| not_supported(format!("op {name} is not in this build of the core")))
}
