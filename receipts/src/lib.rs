//! memra-receipts: the receipt file format and everything that reads, writes, compares and exports
//! it. A receipt outlives the build that wrote it (nightly history, PR diffs, promotion), so the
//! format lives in one dependency-free crate that every other part of memra-gates links; no other
//! crate defines or parses receipt JSON.
//!
//! - [`schema`]: the format (schema v1), documented with a full example
//! - [`canonical`]: the canonical JSON writer (below everything: identities hash its text)
//! - [`identity`]: run ids, digests and the hex forms of receipts; [`time`]: the date routine
//! - [`validate`]: the rules the serde shape cannot express
//! - [`json`]: the receipt and summary writer and strict reader
//! - [`store`]: atomic writes, directory layout, loading, `--resume` listing
//! - [`export`]: JUnit XML, latency CSV, Markdown summary
//! - [`mod@diff`]: comparison of two receipt sets
//!
//! The published JSON Schema documents are [`RECEIPT_SCHEMA_V1`] and [`SUMMARY_SCHEMA_V1`]
//! (`receipts/schema/*.schema.json`).

#![forbid(unsafe_code)]

pub mod canonical;
pub mod diff;
pub mod effect;
pub mod error;
pub mod export;
pub mod identity;
pub mod json;
pub mod schema;
pub mod store;
pub mod time;
pub mod validate;

pub use diff::{diff, DiffFormat, DiffReport};
pub use error::ReceiptError;
pub use identity::{digest_hex, f32_bits_hex, fnv1a64, run_id, token_tape_digest};
pub use schema::seam_column;
pub use schema::{
    Backend, BuildEvidence, CoverageCount, DigestRow, Divergence, DivergenceAt, Evidence, Gate, GateResult, LaneAxis,
    LaneEvidence, LatencyStats, Measurements, ModelEvidence, NearTie, PerformanceClaim, Planted, ProbeEntry,
    ProbeStatus, Receipt, ReceiptKind, RunConfigEvidence, SeamDigests, SeamError, SeamLatency, SeamPlace, Summary,
    SummaryExclusion, SummaryKind, SummaryRow, Transport, Verdict, VerdictCounts, READ_VERSIONS, SCHEMA_VERSION,
    SUMMARY_SCHEMA_VERSION,
};

/// The published JSON Schema (draft 2020-12) of run and performance receipts, schema v2.
pub const RECEIPT_SCHEMA_V2: &str = include_str!("../schema/receipt-v2.schema.json");
/// The published JSON Schema (draft 2020-12) of run and performance receipts, schema v1 (still read).
pub const RECEIPT_SCHEMA_V1: &str = include_str!("../schema/receipt-v1.schema.json");
/// The published JSON Schema (draft 2020-12) of matrix summaries, schema v1.
pub const SUMMARY_SCHEMA_V1: &str = include_str!("../schema/summary-v1.schema.json");
