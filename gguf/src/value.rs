//! GGUF metadata values and typed access to them.
use std::collections::HashMap;

/// One metadata value, as the file types it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array. Homogeneous arrays of the types tokenizers use are kept
/// unboxed; anything else is a list of values.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    Strings(Vec<String>),
    F32(Vec<f32>),
    I32(Vec<i32>),
    U32(Vec<u32>),
    Other(Vec<Value>),
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::Strings(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::Other(v) => v.len(),
        }
    }

    /// Whether the array is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Value {
    /// The GGUF type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "uint8",
            Value::I8(_) => "int8",
            Value::U16(_) => "uint16",
            Value::I16(_) => "int16",
            Value::U32(_) => "uint32",
            Value::I32(_) => "int32",
            Value::U64(_) => "uint64",
            Value::I64(_) => "int64",
            Value::F32(_) => "float32",
            Value::F64(_) => "float64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(Array::Strings(_)) => "array of string",
            Value::Array(Array::F32(_)) => "array of float32",
            Value::Array(Array::I32(_)) => "array of int32",
            Value::Array(Array::U32(_)) => "array of uint32",
            Value::Array(Array::Other(_)) => "array",
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
}

/// What a key must hold, for [`Metadata`]'s typed getters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeMismatch {
    pub key: String,
    pub expected: &'static str,
    pub found: &'static str,
}

/// All metadata of a file, by key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    values: HashMap<String, Value>,
}

impl Metadata {
    /// Wraps parsed key/value pairs (a later duplicate key wins).
    pub fn new(pairs: Vec<(String, Value)>) -> Self {
        Self {
            values: pairs.into_iter().collect(),
        }
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key)
    }

    /// Every key, sorted.
    pub fn keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.values.keys().map(String::as_str).collect();
        keys.sort_unstable();
        keys
    }

    fn mismatch(&self, key: &str, expected: &'static str) -> TypeMismatch {
        TypeMismatch {
            key: key.to_owned(),
            expected,
            found: self.values.get(key).map_or("nothing", Value::type_name),
        }
    }

    /// `key` as a string; `Ok(None)` when absent.
    pub fn str(&self, key: &str) -> Result<Option<&str>, TypeMismatch> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.mismatch(key, "string")),
        }
    }

    /// `key` as a non-negative integer; `Ok(None)` when absent.
    pub fn uint(&self, key: &str) -> Result<Option<u64>, TypeMismatch> {
        match self.values.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.mismatch(key, "unsigned integer")),
        }
    }

    /// `key` as a number; `Ok(None)` when absent.
    pub fn float(&self, key: &str) -> Result<Option<f64>, TypeMismatch> {
        match self.values.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.mismatch(key, "number")),
        }
    }

    /// `key` as a bool; `Ok(None)` when absent.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, TypeMismatch> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.mismatch(key, "bool")),
        }
    }

    /// `key` as an array of strings; `Ok(None)` when absent.
    pub fn strings(&self, key: &str) -> Result<Option<&[String]>, TypeMismatch> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::Strings(v))) => Ok(Some(v)),
            Some(Value::Array(a)) if a.is_empty() => Ok(Some(&[])),
            Some(_) => Err(self.mismatch(key, "array of string")),
        }
    }

    /// `key` as an array of float32; `Ok(None)` when absent.
    pub fn f32s(&self, key: &str) -> Result<Option<&[f32]>, TypeMismatch> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::F32(v))) => Ok(Some(v)),
            Some(Value::Array(a)) if a.is_empty() => Ok(Some(&[])),
            Some(_) => Err(self.mismatch(key, "array of float32")),
        }
    }

    /// `key` as an array of int32; `Ok(None)` when absent.
    pub fn i32s(&self, key: &str) -> Result<Option<&[i32]>, TypeMismatch> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::I32(v))) => Ok(Some(v)),
            Some(Value::Array(a)) if a.is_empty() => Ok(Some(&[])),
            Some(_) => Err(self.mismatch(key, "array of int32")),
        }
    }
}

impl std::fmt::Display for TypeMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "metadata key {:?} holds {}, expected {}",
            self.key, self.found, self.expected
        )
    }
}
