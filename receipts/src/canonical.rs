//! The canonical JSON writer: stable key order (struct field order, sorted maps), 2-space indent,
//! arrays of scalars on one line, floats as the shortest decimal that reads back to the same bits,
//! non-finite floats refused, one trailing newline. Everything identity-bearing (run ids, evidence
//! digests) is a hash of this text, so it is defined once, here, below every other module.

use std::io;
use std::path::Path;

use serde::ser::{self, Serialize};
use serde_json::ser::{Formatter, PrettyFormatter};
use serde_json::Value;

use crate::error::{ReceiptError, IN_MEMORY};

/// The canonical JSON text of any serializable value (no semantic checks; see
/// `json::receipt_to_json`).
pub fn to_canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<String, ReceiptError> {
    to_canonical_json_at(value, Path::new(IN_MEMORY))
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
