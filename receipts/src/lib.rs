//! memra-receipts: the receipt file format and everything that reads, writes, compares and exports
//! it. A receipt outlives the build that wrote it (nightly history, PR diffs, promotion), so the
//! format lives in one dependency-free crate that every other part of memra-gates links; no other
//! crate defines or parses receipt JSON.
//!
//! - [`schema`]: the format (schema v1), documented with a full example; run identity
//! - [`json`]: canonical writer and strict reader
//! - [`store`]: atomic writes, directory layout, loading, `--resume` listing
//! - [`export`]: JUnit XML, latency CSV, Markdown summary
//! - [`mod@diff`]: comparison of two receipt sets
//!
//! The published JSON Schema documents are [`RECEIPT_SCHEMA_V1`] and [`SUMMARY_SCHEMA_V1`]
//! (`receipts/schema/*.schema.json`).

#![forbid(unsafe_code)]

pub mod diff;
pub mod error;
pub mod export;
pub mod json;
pub mod schema;
pub mod store;

pub use diff::{diff, DiffFormat, DiffReport, DEFAULT_THRESHOLD};
pub use error::ReceiptError;
pub use schema::{
    run_id, token_tape_digest, Backend, BuildEvidence, DigestRow, Divergence, Evidence, Gate, GateResult, LatencyStats,
    Measurements, ModelEvidence, NearTie, PerformanceClaim, ProbeEntry, ProbeStatus, Receipt, ReceiptKind,
    RunConfigEvidence, SeamDigests, SeamError, SeamLatency, Summary, SummaryKind, SummaryRow, Transport, Verdict,
    VerdictCounts, SCHEMA_VERSION,
};

/// The published JSON Schema (draft 2020-12) of run and performance receipts, schema v1.
pub const RECEIPT_SCHEMA_V1: &str = include_str!("../schema/receipt-v1.schema.json");
/// The published JSON Schema (draft 2020-12) of matrix summaries, schema v1.
pub const SUMMARY_SCHEMA_V1: &str = include_str!("../schema/summary-v1.schema.json");
