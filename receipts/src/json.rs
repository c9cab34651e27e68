//! Canonical JSON: the one byte form of every receipt, so that two receipts with the same content
//! are the same bytes (reviewers diff files; `run_id` hashes them), and a strict reader that refuses
//! what this build does not understand instead of guessing.
//!
//! # Canonical form
//!
//! - UTF-8, 2-space indentation, `": "` after keys, one trailing newline; empty lists are `[]`,
//!   empty maps `{}`.
//! - A non-empty array whose elements are all scalars (numbers, strings, booleans, null) is written
//!   on one line, elements separated by `", "`: `"tokens": [[17, 24], [5, 6]]` is written as one line
//!   per inner array, a digest row is one line. Receipts stay small and a diff shows which row moved.
//! - Keys in struct declaration order; maps (`BTreeMap`) in key order.
//! - Integers in decimal. Floats are finite and written as Rust's `{:?}` prints them: the shortest
//!   decimal that reads back to the same bits, always with a `.` or an exponent (`1.0`, `0.1`,
//!   `1e-7`, `1.5e16`, `-0.0`); an `f32` field is written with f32 precision (`0.1`, not
//!   `0.10000000149011612`). NaN and ±inf are refused with [`ReceiptError::NonFinite`], which names
//!   the field (serde_json alone would silently write `null`).
//! - Strings escaped as serde_json does (`"`, `\`, control characters; non-ASCII written as is).
//!
//! # Reading
//!
//! [`parse_receipt`] and [`parse_summary`] read `schema_version` first from a generic JSON value
//! and refuse any version but [`SCHEMA_VERSION`] before looking at anything else; then they
//! deserialize strictly (unknown fields, missing fields, wrong types and unknown enum values are
//! errors) straight from the text, so floats read back bit-exactly, and finally check the rules of
//! `Receipt::validate` / `Summary::validate`.

use std::io;
use std::path::Path;

use serde::ser::{self, Serialize};
use serde_json::ser::{Formatter, PrettyFormatter};
use serde_json::Value;

use crate::error::{ReceiptError, IN_MEMORY};
use crate::schema::{Receipt, Summary, SCHEMA_VERSION};

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

/// The canonical JSON text of any serializable value (no semantic checks; see [`receipt_to_json`]).
pub fn to_canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<String, ReceiptError> {
    to_canonical_json_at(value, Path::new(IN_MEMORY))
}

/// The canonical JSON of a receipt, after [`Receipt::validate`]: the writer never produces a
/// receipt its own reader would refuse.
pub fn receipt_to_json(receipt: &Receipt) -> Result<String, ReceiptError> {
    receipt_to_json_at(receipt, Path::new(IN_MEMORY))
}

/// The canonical JSON of a summary, after [`Summary::validate`].
pub fn summary_to_json(summary: &Summary) -> Result<String, ReceiptError> {
    summary_to_json_at(summary, Path::new(IN_MEMORY))
}

pub(crate) fn receipt_to_json_at(receipt: &Receipt, path: &Path) -> Result<String, ReceiptError> {
    receipt.validate().map_err(|v| ReceiptError::invalid(path, v))?;
    to_canonical_json_at(receipt, path)
}

pub(crate) fn summary_to_json_at(summary: &Summary, path: &Path) -> Result<String, ReceiptError> {
    summary.validate().map_err(|v| ReceiptError::invalid(path, v))?;
    to_canonical_json_at(summary, path)
}

pub(crate) fn to_canonical_json_at<T: Serialize + ?Sized>(value: &T, path: &Path) -> Result<String, ReceiptError> {
    let mut checker = FiniteCheck { path: Vec::new() };
    value.serialize(&mut checker).map_err(|e| match e {
        CheckError::NonFinite { field, value } => ReceiptError::NonFinite { path: path.to_path_buf(), field, value },
        CheckError::Custom(message) => ReceiptError::Serialize { path: path.to_path_buf(), message },
    })?;
    let mut out = Vec::with_capacity(4096);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, CanonicalFormatter::new());
    value
        .serialize(&mut ser)
        .map_err(|e| ReceiptError::Serialize { path: path.to_path_buf(), message: e.to_string() })?;
    let pretty = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(collapse_scalar_arrays(&pretty))
}

/// Rewrites every multi-line array of scalars of serde_json's pretty output onto one line, and ends
/// the text with exactly one newline. Works line by line: in pretty output every scalar array
/// element is alone on its line (strings never contain raw newlines), and a line ending in `[`
/// opens an array.
fn collapse_scalar_arrays(pretty: &str) -> String {
    fn scalar(item: &str) -> bool {
        matches!(serde_json::from_str::<Value>(item), Ok(v) if !v.is_array() && !v.is_object())
    }
    let lines: Vec<&str> = pretty.lines().collect();
    let mut out = String::with_capacity(pretty.len() + 1);
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        if line.ends_with('[') {
            let mut items = Vec::new();
            let mut j = i;
            while let Some(next) = lines.get(j) {
                let t = next.trim_start();
                let item = t.strip_suffix(',').unwrap_or(t);
                if !scalar(item) {
                    break;
                }
                items.push(item);
                j += 1;
            }
            let close = lines.get(j).map(|l| l.trim_start());
            if !items.is_empty() && matches!(close, Some("]" | "],")) {
                out.push_str(line);
                out.push_str(&items.join(", "));
                out.push_str(close.unwrap_or_default());
                out.push('\n');
                i = j + 1;
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// serde_json's 2-space pretty printer with our float rule (see the module doc).
struct CanonicalFormatter {
    pretty: PrettyFormatter<'static>,
}

impl CanonicalFormatter {
    fn new() -> Self {
        CanonicalFormatter { pretty: PrettyFormatter::with_indent(b"  ") }
    }
}

impl Formatter for CanonicalFormatter {
    fn write_f32<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f32) -> io::Result<()> {
        // Only reached for finite values: FiniteCheck ran first.
        write!(writer, "{value:?}")
    }
    fn write_f64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        write!(writer, "{value:?}")
    }
    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.begin_array(writer)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_array(writer)
    }
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        self.pretty.begin_array_value(writer, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_array_value(writer)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.begin_object(writer)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_object(writer)
    }
    fn begin_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        self.pretty.begin_object_key(writer, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.begin_object_value(writer)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_object_value(writer)
    }
}

/// A serializer that writes nothing and fails at the first non-finite float, naming its field
/// (`evidence.error_budget[3].max_rel`). It exists because serde_json writes NaN as `null`.
struct FiniteCheck {
    path: Vec<String>,
}

impl FiniteCheck {
    fn field(&self) -> String {
        let mut s = String::new();
        for seg in &self.path {
            if !seg.starts_with('[') && !s.is_empty() {
                s.push('.');
            }
            s.push_str(seg);
        }
        if s.is_empty() {
            s.push_str("(top level)");
        }
        s
    }

    fn check(&self, value: f64) -> Result<(), CheckError> {
        if value.is_finite() {
            Ok(())
        } else {
            Err(CheckError::NonFinite { field: self.field(), value })
        }
    }

    fn nested<T: Serialize + ?Sized>(&mut self, seg: String, value: &T) -> Result<(), CheckError> {
        self.path.push(seg);
        let r = value.serialize(&mut *self);
        self.path.pop();
        r
    }
}

#[derive(Debug)]
enum CheckError {
    NonFinite { field: String, value: f64 },
    Custom(String),
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckError::NonFinite { field, value } => write!(f, "{field} is {value}"),
            CheckError::Custom(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CheckError {}

impl ser::Error for CheckError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        CheckError::Custom(msg.to_string())
    }
}

/// Compound state: sequence index or pending map key.
struct Compound<'a> {
    check: &'a mut FiniteCheck,
    index: usize,
    key: String,
}

impl<'a> Compound<'a> {
    fn new(check: &'a mut FiniteCheck) -> Self {
        Compound { check, index: 0, key: String::new() }
    }
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CheckError> {
        let seg = format!("[{}]", self.index);
        self.index += 1;
        self.check.nested(seg, value)
    }
}

macro_rules! ok_scalars {
    ($($name:ident: $ty:ty),*) => {
        $(fn $name(self, _v: $ty) -> Result<(), CheckError> { Ok(()) })*
    };
}

impl<'a> ser::Serializer for &'a mut FiniteCheck {
    type Ok = ();
    type Error = CheckError;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    ok_scalars!(serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32,
        serialize_i64: i64, serialize_i128: i128, serialize_u8: u8, serialize_u16: u16,
        serialize_u32: u32, serialize_u64: u64, serialize_u128: u128, serialize_char: char,
        serialize_str: &str, serialize_bytes: &[u8]);

    fn serialize_f32(self, v: f32) -> Result<(), CheckError> {
        self.check(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), CheckError> {
        self.check(v)
    }
    fn serialize_none(self) -> Result<(), CheckError> {
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), CheckError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), CheckError> {
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), CheckError> {
        Ok(())
    }
    fn serialize_unit_variant(self, _n: &'static str, _i: u32, _v: &'static str) -> Result<(), CheckError> {
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _n: &'static str, value: &T) -> Result<(), CheckError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _n: &'static str,
        _i: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), CheckError> {
        self.nested(variant.to_string(), value)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a>, CheckError> {
        Ok(Compound::new(self))
    }
    fn serialize_tuple(self, _len: usize) -> Result<Compound<'a>, CheckError> {
        Ok(Compound::new(self))
    }
    fn serialize_tuple_struct(self, _n: &'static str, _len: usize) -> Result<Compound<'a>, CheckError> {
        Ok(Compound::new(self))
    }
    fn serialize_tuple_variant(
        self,
        _n: &'static str,
        _i: u32,
        _v: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, CheckError> {
        Ok(Compound::new(self))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a>, CheckError> {
        Ok(Compound::new(self))
    }
    fn serialize_struct(self, _n: &'static str, _len: usize) -> Result<Compound<'a>, CheckError> {
        Ok(Compound::new(self))
    }
    fn serialize_struct_variant(
        self,
        _n: &'static str,
        _i: u32,
        _v: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, CheckError> {
        Ok(Compound::new(self))
    }
}

/// The sequence-like compounds: each element is checked under its index.
macro_rules! elements {
    ($($trait:ident :: $method:ident),+) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = CheckError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CheckError> {
                self.element(value)
            }
            fn end(self) -> Result<(), CheckError> {
                Ok(())
            }
        }
    )+};
}
elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// The struct-like compounds: each field is checked under its name.
macro_rules! fields {
    ($($trait:ident),+) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = CheckError;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), CheckError> {
                self.check.nested(key.to_string(), value)
            }
            fn end(self) -> Result<(), CheckError> {
                Ok(())
            }
        }
    )+};
}
fields!(SerializeStruct, SerializeStructVariant);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = CheckError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), CheckError> {
        // Keys are strings in this format; anything else is named by its JSON text.
        self.key = match serde_json::to_value(key) {
            Ok(Value::String(s)) => s,
            Ok(other) => other.to_string(),
            Err(_) => "?".to_string(),
        };
        key.serialize(&mut *self.check)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CheckError> {
        let seg = std::mem::take(&mut self.key);
        self.check.nested(seg, value)
    }
    fn end(self) -> Result<(), CheckError> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------

/// Reads a run or performance receipt from `bytes`; `origin` names the file in errors.
pub fn parse_receipt(bytes: &[u8], origin: &Path) -> Result<Receipt, ReceiptError> {
    let head = check_head(bytes, origin)?;
    if head.kind.as_deref() == Some("summary") {
        return Err(ReceiptError::WrongKind {
            path: origin.to_path_buf(),
            found: "\"summary\"".to_string(),
            expected: "a run or performance receipt",
        });
    }
    let receipt: Receipt =
        serde_json::from_slice(bytes).map_err(|source| ReceiptError::Shape { path: origin.to_path_buf(), source })?;
    receipt.validate().map_err(|v| ReceiptError::invalid(origin, v))?;
    Ok(receipt)
}

/// Reads a matrix summary from `bytes`; `origin` names the file in errors.
pub fn parse_summary(bytes: &[u8], origin: &Path) -> Result<Summary, ReceiptError> {
    let head = check_head(bytes, origin)?;
    if let Some(k @ ("run" | "performance")) = head.kind.as_deref() {
        return Err(ReceiptError::WrongKind {
            path: origin.to_path_buf(),
            found: format!("{k:?}"),
            expected: "a summary",
        });
    }
    let summary: Summary =
        serde_json::from_slice(bytes).map_err(|source| ReceiptError::Shape { path: origin.to_path_buf(), source })?;
    summary.validate().map_err(|v| ReceiptError::invalid(origin, v))?;
    Ok(summary)
}

/// Reads a run or performance receipt file.
pub fn read_receipt(path: &Path) -> Result<Receipt, ReceiptError> {
    let bytes = std::fs::read(path).map_err(|e| ReceiptError::io(path, "read", e))?;
    parse_receipt(&bytes, path)
}

/// Reads a summary file.
pub fn read_summary(path: &Path) -> Result<Summary, ReceiptError> {
    let bytes = std::fs::read(path).map_err(|e| ReceiptError::io(path, "read", e))?;
    parse_summary(&bytes, path)
}

struct Head {
    kind: Option<String>,
}

/// Parses generically and checks `schema_version` before anything else.
fn check_head(bytes: &[u8], origin: &Path) -> Result<Head, ReceiptError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|source| ReceiptError::Syntax { path: origin.to_path_buf(), source })?;
    let Some(obj) = value.as_object() else {
        return Err(ReceiptError::MissingVersion { path: origin.to_path_buf(), supported: SCHEMA_VERSION });
    };
    let Some(version) = obj.get("schema_version") else {
        return Err(ReceiptError::MissingVersion { path: origin.to_path_buf(), supported: SCHEMA_VERSION });
    };
    if version.as_u64() != Some(u64::from(SCHEMA_VERSION)) {
        return Err(ReceiptError::UnsupportedVersion {
            path: origin.to_path_buf(),
            found: version.to_string(),
            supported: SCHEMA_VERSION,
        });
    }
    Ok(Head { kind: obj.get("kind").and_then(Value::as_str).map(str::to_string) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_arrays_collapse_and_nothing_else_does() {
        let v = serde_json::json!({
            "tokens": [[1, 2], [], [3]],
            "tricky": ["ends with [", "\": 1", "a, b", "]", "{"],
            "mixed": [1, {"k": [true, null]}],
            "one": [-0.5],
        });
        let text = to_canonical_json(&v).unwrap();
        let expected = r#"{
  "tokens": [
    [1, 2],
    [],
    [3]
  ],
  "tricky": ["ends with [", "\": 1", "a, b", "]", "{"],
  "mixed": [
    1,
    {
      "k": [true, null]
    }
  ],
  "one": [-0.5]
}
"#;
        assert_eq!(text, expected);
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
    }
}
