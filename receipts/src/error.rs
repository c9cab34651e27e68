//! The crate's one error type. Every message names the file (or `<in-memory>`), the value and the
//! rule it broke, so a person reading a CI log knows which receipt to open and what to fix.

use std::io;
use std::path::{Path, PathBuf};

/// A rule of the receipt format that a value broke: field path, the value (quoted for display)
/// and the rule (see `validate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub value: String,
    pub rule: String,
}

/// Name used in messages for values that are not (yet) in a file.
pub const IN_MEMORY: &str = "<in-memory>";

/// Everything that can go wrong reading, writing, exporting or comparing receipts.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    /// The file system refused an operation.
    #[error("receipt {}: cannot {action}: {source}", .path.display())]
    Io {
        path: PathBuf,
        /// What was attempted: "read", "create temporary file", "rename into place", …
        action: &'static str,
        #[source]
        source: io::Error,
    },

    /// The bytes are not JSON at all.
    #[error("receipt {}: not valid JSON: {source}", .path.display())]
    Syntax {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// The top level is not an object with a `schema_version`.
    #[error("receipt {}: no schema_version at the top level; every receipt carries one (this build reads version {supported})", .path.display())]
    MissingVersion { path: PathBuf, supported: &'static str },

    /// A version this build does not read (checked before anything else).
    #[error("receipt {}: schema_version {found} is not supported; this build reads version {supported}", .path.display())]
    UnsupportedVersion {
        path: PathBuf,
        /// The value as found, in JSON (`7`, `"1"`).
        found: String,
        /// The versions read, in words (`"1 or 2"`).
        supported: &'static str,
    },

    /// A summary where a run receipt was expected, or the other way round.
    #[error("receipt {}: kind {found} where {expected} was expected", .path.display())]
    WrongKind { path: PathBuf, found: String, expected: &'static str },

    /// The JSON does not have the shape of its schema version (unknown or missing field, wrong
    /// type, unknown enum value); serde's message names the field, and the line and column.
    #[error("receipt {}: does not match schema v{version}: {source}", .path.display())]
    Shape {
        path: PathBuf,
        version: u32,
        #[source]
        source: serde_json::Error,
    },

    /// The shape is right but a value breaks a rule of the format (see `Receipt::validate`).
    #[error("receipt {}: {field} = {value}: {rule}", .path.display())]
    Invalid { path: PathBuf, field: String, value: String, rule: String },

    /// NaN or ±inf cannot be written canonically (JSON has no such numbers; serde_json would write null).
    #[error("receipt {}: {field} is {value}; canonical JSON has no representation for non-finite numbers", .path.display())]
    NonFinite { path: PathBuf, field: String, value: f64 },

    /// A receipt whose file name and content disagree (`run-<id>.json` must hold run `<id>`).
    #[error("receipt {}: the file name says run_id {named} but the receipt holds run_id {found}", .path.display())]
    Misnamed { path: PathBuf, named: String, found: String },

    /// A serializer failure other than a non-finite float (should not happen for this crate's types).
    #[error("receipt {}: cannot serialize: {message}", .path.display())]
    Serialize { path: PathBuf, message: String },

    /// A CSV export failure.
    #[error("latency CSV: {source}")]
    Csv {
        #[source]
        source: csv::Error,
    },

    /// `diff` was given a noise threshold that is not a finite number ≥ 0.
    #[error("diff threshold {value} is not a finite number ≥ 0 (a relative change, e.g. 0.05 for 5%)")]
    InvalidThreshold { value: f64 },
}

impl ReceiptError {
    pub(crate) fn invalid(path: &Path, v: Violation) -> Self {
        ReceiptError::Invalid { path: path.to_path_buf(), field: v.field, value: v.value, rule: v.rule }
    }

    pub(crate) fn io(path: &Path, action: &'static str, source: io::Error) -> Self {
        ReceiptError::Io { path: path.to_path_buf(), action, source }
    }

    /// The file this error is about, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ReceiptError::Io { path, .. }
            | ReceiptError::Syntax { path, .. }
            | ReceiptError::MissingVersion { path, .. }
            | ReceiptError::UnsupportedVersion { path, .. }
            | ReceiptError::WrongKind { path, .. }
            | ReceiptError::Shape { path, .. }
            | ReceiptError::Invalid { path, .. }
            | ReceiptError::NonFinite { path, .. }
            | ReceiptError::Misnamed { path, .. }
            | ReceiptError::Serialize { path, .. } => Some(path),
            ReceiptError::Csv { .. } | ReceiptError::InvalidThreshold { .. } => None,
        }
    }
}
