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
//! and refuse any version they do not read (receipts: [`READ_VERSIONS`], version 1 converted by
//! `schema::v1`; summaries: [`SUMMARY_SCHEMA_VERSION`]) before looking at anything else; then they
//! deserialize strictly (unknown fields, missing fields, wrong types and unknown enum values are
//! errors) straight from the text, so floats read back bit-exactly, and finally check the rules of
//! `Receipt::validate` / `Summary::validate`. The writer writes [`SCHEMA_VERSION`] only.

use std::path::Path;

use serde_json::Value;

use crate::error::{ReceiptError, IN_MEMORY};
use crate::schema::{Receipt, Summary, READ_VERSIONS, SCHEMA_VERSION, SUMMARY_SCHEMA_VERSION};

pub use crate::canonical::to_canonical_json;
use crate::canonical::to_canonical_json_at;

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

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
    if receipt.schema_version != SCHEMA_VERSION {
        return Err(ReceiptError::Invalid {
            path: path.to_path_buf(),
            field: "schema_version".into(),
            value: receipt.schema_version.to_string(),
            rule: format!(
                "a receipt read from an older schema version is read-only; this build writes version {SCHEMA_VERSION}"
            ),
        });
    }
    to_canonical_json_at(receipt, path)
}

pub(crate) fn summary_to_json_at(summary: &Summary, path: &Path) -> Result<String, ReceiptError> {
    summary.validate().map_err(|v| ReceiptError::invalid(path, v))?;
    to_canonical_json_at(summary, path)
}

// ---------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------

/// Reads a run or performance receipt from `bytes`; `origin` names the file in errors.
pub fn parse_receipt(bytes: &[u8], origin: &Path) -> Result<Receipt, ReceiptError> {
    let head = check_head(bytes, origin, &READ_VERSIONS, "1 or 2")?;
    if head.kind.as_deref() == Some("summary") {
        return Err(ReceiptError::WrongKind {
            path: origin.to_path_buf(),
            found: "\"summary\"".to_string(),
            expected: "a run or performance receipt",
        });
    }
    let shape = |source| ReceiptError::Shape { path: origin.to_path_buf(), version: head.version, source };
    let receipt: Receipt = if head.version == 1 {
        serde_json::from_slice::<crate::schema::v1::ReceiptV1>(bytes).map_err(shape)?.into()
    } else {
        serde_json::from_slice(bytes).map_err(shape)?
    };
    receipt.validate().map_err(|v| ReceiptError::invalid(origin, v))?;
    Ok(receipt)
}

/// Reads a matrix summary from `bytes`; `origin` names the file in errors.
pub fn parse_summary(bytes: &[u8], origin: &Path) -> Result<Summary, ReceiptError> {
    // A receipt of any version this build reads is refused as the wrong kind, not the wrong version.
    let head = check_head(bytes, origin, &READ_VERSIONS, "1")?;
    if let Some(k @ ("run" | "performance")) = head.kind.as_deref() {
        return Err(ReceiptError::WrongKind {
            path: origin.to_path_buf(),
            found: format!("{k:?}"),
            expected: "a summary",
        });
    }
    if head.version != SUMMARY_SCHEMA_VERSION {
        return Err(ReceiptError::UnsupportedVersion {
            path: origin.to_path_buf(),
            found: head.version.to_string(),
            supported: "1",
        });
    }
    let summary: Summary = serde_json::from_slice(bytes).map_err(|source| ReceiptError::Shape {
        path: origin.to_path_buf(),
        version: head.version,
        source,
    })?;
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
    version: u32,
    kind: Option<String>,
}

/// Parses generically and checks `schema_version` (one of `versions`, named `words` in errors)
/// before anything else.
fn check_head(bytes: &[u8], origin: &Path, versions: &[u32], words: &'static str) -> Result<Head, ReceiptError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|source| ReceiptError::Syntax { path: origin.to_path_buf(), source })?;
    let Some(obj) = value.as_object() else {
        return Err(ReceiptError::MissingVersion { path: origin.to_path_buf(), supported: words });
    };
    let Some(version) = obj.get("schema_version") else {
        return Err(ReceiptError::MissingVersion { path: origin.to_path_buf(), supported: words });
    };
    match version.as_u64().and_then(|v| u32::try_from(v).ok()).filter(|v| versions.contains(v)) {
        Some(v) => Ok(Head { version: v, kind: obj.get("kind").and_then(Value::as_str).map(str::to_string) }),
        None => Err(ReceiptError::UnsupportedVersion {
            path: origin.to_path_buf(),
            found: version.to_string(),
            supported: words,
        }),
    }
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
