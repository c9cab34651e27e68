//! The receipt format, schema version 2: the one place that defines what a receipt file contains.
//!
//! A receipt is the durable evidence of one run (one configuration of subject, backend, TP size,
//! transport and doors, checked against the oracle). Nightly CI, `memra-gates diff`, the plots and
//! `memra-gates promote` all read receipts written months earlier by other builds, so the format is
//! defined here once, versioned, published as a JSON Schema (`receipts/schema/receipt-v2.schema.json`,
//! `receipts/schema/summary-v1.schema.json`; version 1's `receipts/schema/receipt-v1.schema.json`
//! stays published) and read strictly: unknown fields, missing fields and unknown schema versions
//! are errors, never guesses. Version 1 receipts are still read (`v1`: converted on reading, and
//! read-only); this build writes version 2.
//!
//! # Shape
//!
//! ```text
//! Receipt                      one file per run: <dir>/run-<run_id>.json
//! ├─ schema_version            2 for what this build writes (1 for a receipt read from version 1)
//! ├─ kind                      "run" | "performance"
//! ├─ run_id                    run_id(&evidence.config): 16 hex digits, pairs runs across receipt sets
//! ├─ evidence                  DETERMINISTIC: the same configuration on the same build gives
//! │  │                         byte-identical evidence (no clocks, no host names, no timings)
//! │  ├─ config                 what was asked for (the input of run_id)
//! │  ├─ build                  what numerics were compiled (build digest, NVRTC options)
//! │  ├─ verdict, reason        PASS | FAIL | VOID | SKIP | NOT-APPLICABLE | ERROR, and why
//! │  ├─ gates                  one verdict per gate that ran
//! │  ├─ engaged                call-site counters ("<door_id>.<what>" → count, as named in doors.toml)
//! │  ├─ census                 what the backend carried out (v2; the engagement gate's evidence)
//! │  ├─ census_witness         who counted it, when not memra-gates' own backend ("self-reported")
//! │  ├─ coverage, claims       special paths reached by the model and battery, and those it claims (v2)
//! │  ├─ planted                where a canary planted its defect, when chosen per run (v2)
//! │  ├─ first_divergence       where the run first differed from its reference, if it did
//! │  ├─ digests                layer × seam × token digest table
//! │  ├─ tokens, token_tape_digest
//! │  ├─ error_budget, near_ties   NUMERIC-CLASS evidence
//! │  └─ performance            only in "performance" receipts
//! └─ measurements              VOLATILE: latencies per layer × seam, wall time, host, device, byte-integrity probe
//! ```
//!
//! A matrix run also writes one [`Summary`] (`<dir>/summary.json`, kind `"summary"`, its own
//! schema version [`SUMMARY_SCHEMA_VERSION`]).
//!
//! # Version 2 (this build) against version 1
//!
//! - `evidence.census`, `evidence.coverage`, `evidence.claims`, `evidence.planted` are new;
//! - `first_divergence` always names prompt, step, layer and seam, says whether it is a seam or a
//!   cross-rank copy (`at`, `src_rank`), and names the element only when a capture re-run
//!   reproduced it (`reproduced`; the element fields are `null` otherwise);
//! - the gates `copies`, `coverage` and `probe` are new;
//! - a probe entry names its `transport` (version 1 probed native-p2p only).
//!
//! Within version 2, later additions that older version 2 readers do not know:
//! `evidence.census_witness` (optional, written only when memra-gates' own backend did not count
//! the census: `"self-reported"` for an external subject, `"outside:<witness>"` for a witness
//! outside its process), and a copy divergence's `reproduced` (it was always `false`; it now says
//! whether the configuration's second run had the same fault — a deterministic transport fault —
//! and a copy never names an element). Rows and columns (docs/DESIGN.md §3.6) added three more,
//! all optional so that a single-token receipt, and its run id, stay exactly as they were:
//! `evidence.config.batch` and `evidence.config.columns` (2, 4 or 8, at most one of them; absent
//! for one token of one session per pass) and `first_divergence.lane` (`axis` row or column,
//! `index`, `pass`: the lane of the pass that computed the divergent step).
//!
//! # Conventions
//!
//! - Digests and bit patterns are lowercase hex strings: seam digests and `token_tape_digest` are
//!   exactly 16 digits (a `u64`, see [`digest_hex`](crate::identity::digest_hex)); model, battery and kernel digests are any
//!   non-empty even number of digits (e.g. SHA-256); element bit patterns are `"0x"` + 8 digits
//!   (an `f32`'s `to_bits()`, see [`f32_bits_hex`](crate::identity::f32_bits_hex)).
//! - Every field is always present; an absent optional value is `null`, an empty list is `[]`.
//! - Indices (`prompt`, `step`, `layer`, `rank`) count from 0. `step` is the index in the prompt's
//!   token tape (the n-th generated token), in the digest table, the first divergence and near-ties.
//! - Digest columns are named `L<layer>.<seam>` (see [`seam_column`]); seams after the last layer
//!   (final norm, lm_head) may use `head.<seam>`.
//! - Floats are finite (the canonical writer refuses NaN and ±inf) and written as the shortest
//!   decimal that reads back to the same bits (see `json`).
//! - Lists whose order is not given by the program are written sorted: `digests.rows` by
//!   `(prompt, step)`, maps by key. The reader checks what it can (see [`Receipt::validate`]).
//!
//! # Compatibility
//!
//! Any change to a field (added, removed, renamed, retyped, new enum value) is a new schema version,
//! with its own JSON Schema document. `run_id` hashes the canonical JSON of [`RunConfigEvidence`],
//! so a change to that struct also changes every run id.
//!
//! # Example
//!
//! A complete receipt of a TP2 native-P2P run with two doors (`receipts/schema/example-run-v2.json`;
//! a test checks that it reads strictly, writes back byte-identically and validates against the
//! published JSON Schema):
//!
//! ```json
#![doc = include_str!("../../schema/example-run-v2.json")]
//! ```
//!
//! Reading and checking it:
//!
//! ```
//! use memra_receipts::{json, Verdict};
//! let text = include_str!("../../schema/example-run-v2.json");
//! let receipt = json::parse_receipt(text.as_bytes(), "example-run-v2.json".as_ref()).unwrap();
//! assert_eq!(receipt.evidence.verdict, Verdict::Pass);
//! assert_eq!(receipt.run_id, memra_receipts::run_id(&receipt.evidence.config));
//! assert_eq!(json::to_canonical_json(&receipt).unwrap(), text);
//! ```

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

mod evidence;
mod measurements;
mod summary;
pub(crate) mod v1;

pub use evidence::*;
pub use measurements::*;
pub use summary::*;

/// The receipt schema version this module defines and this build writes.
pub const SCHEMA_VERSION: u32 = 2;

/// The receipt schema versions this build reads: version 1 receipts are converted on reading
/// (`v1`) and are read-only.
pub const READ_VERSIONS: [u32; 2] = [1, 2];

/// The schema version of matrix summaries (their shape is unchanged since version 1).
pub const SUMMARY_SCHEMA_VERSION: u32 = 1;

/// The TP sizes a run may have (docs/DESIGN.md §3.4): the canonical grid's, defined once.
pub use memra_kernels::grid::TP_SIZES;

/// `Option` fields are required in the file (written as `null` when absent): serde_derive would
/// otherwise accept a missing `Option` field silently, which the published schema does not.
pub(crate) fn required<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer)
}

// ---------------------------------------------------------------------------------------------
// Top level
// ---------------------------------------------------------------------------------------------

/// One run's receipt (kind `"run"` or `"performance"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// [`SCHEMA_VERSION`] for what this build writes; 1 for a receipt read from version 1.
    pub schema_version: u32,
    pub kind: ReceiptKind,
    /// [`run_id`](crate::identity::run_id) of `evidence.config`; the reader checks that they agree.
    pub run_id: String,
    pub evidence: Evidence,
    pub measurements: Measurements,
}

impl Receipt {
    /// Human-readable name of the run ([`RunConfigEvidence::label`]).
    pub fn label(&self) -> String {
        self.evidence.config.label()
    }
}

/// What a receipt records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReceiptKind {
    /// A correctness run of the matrix (`memra-gates run`).
    Run,
    /// A benchmark (`memra-gates bench`); `evidence.performance` is present exactly then.
    Performance,
}

impl ReceiptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptKind::Run => "run",
            ReceiptKind::Performance => "performance",
        }
    }
}

/// Outcome of a run or of one gate. Serialized as the upper-case names below.
///
/// A SKIP, NOT-APPLICABLE or VOID never counts as a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Verdict {
    /// Every gate held.
    #[serde(rename = "PASS")]
    Pass,
    /// A gate found a difference or a bound was exceeded; `first_divergence` says where.
    #[serde(rename = "FAIL")]
    Fail,
    /// The run completed but an enabled door did not engage (it silently fell back): no evidence.
    #[serde(rename = "VOID")]
    Void,
    /// The run was not attempted here (e.g. no peer access); `reason` says why.
    #[serde(rename = "SKIP")]
    Skip,
    /// The configuration has no meaning on this backend (registry rule); `reason` quotes it.
    #[serde(rename = "NOT-APPLICABLE")]
    NotApplicable,
    /// The run could not complete (fault, OOM, failed launch); `reason` says where.
    #[serde(rename = "ERROR")]
    Error,
}

impl Verdict {
    pub const ALL: [Verdict; 6] =
        [Verdict::Pass, Verdict::Fail, Verdict::Void, Verdict::Skip, Verdict::NotApplicable, Verdict::Error];

    /// The string written in receipts.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Void => "VOID",
            Verdict::Skip => "SKIP",
            Verdict::NotApplicable => "NOT-APPLICABLE",
            Verdict::Error => "ERROR",
        }
    }

    /// Whether a change from `old` to `self` is a regression: a PASS that became anything else, or
    /// anything that became FAIL or ERROR (FAIL → ERROR and ERROR → FAIL included: the run's failure
    /// changed character). Staying the same is never a regression.
    pub fn is_regression_from(self, old: Verdict) -> bool {
        if self == old {
            return false;
        }
        old == Verdict::Pass || matches!(self, Verdict::Fail | Verdict::Error)
    }

    /// Whether a receipt with this verdict must say why (`reason` non-empty).
    pub fn requires_reason(self) -> bool {
        matches!(self, Verdict::Void | Verdict::Skip | Verdict::NotApplicable | Verdict::Error)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The digest column name of a seam: `L<layer>.<seam>` (`seam_column(0, "attn_norm")` → `"L0.attn_norm"`).
pub fn seam_column(layer: usize, seam: &str) -> String {
    format!("L{layer}.{seam}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn latency_stats_formulas() {
        let s = LatencyStats::from_samples(&[50, 10, 40, 20, 30, 60, 70, 80, 90, 100]).unwrap();
        assert_eq!((s.n_samples, s.min_ns, s.median_ns, s.p90_ns, s.max_ns), (10, 10, 50, 90, 100));
        let one = LatencyStats::from_samples(&[7]).unwrap();
        assert_eq!((one.median_ns, one.p90_ns), (7, 7));
        // Lower median of an even count; nearest-rank p90 of 11 samples is the 10th (ceil(9.9)).
        let s = LatencyStats::from_samples(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]).unwrap();
        assert_eq!((s.median_ns, s.p90_ns), (6, 10));
        let s = LatencyStats::from_samples(&[4, 1, 3, 2]).unwrap();
        assert_eq!((s.median_ns, s.p90_ns), (2, 4));
        assert!(LatencyStats::from_samples(&[]).is_none());
    }

    #[test]
    fn regression_rule() {
        use Verdict::*;
        assert!(Fail.is_regression_from(Pass));
        assert!(Skip.is_regression_from(Pass));
        assert!(Error.is_regression_from(Skip));
        assert!(Fail.is_regression_from(Error));
        assert!(!Pass.is_regression_from(Fail));
        assert!(!Void.is_regression_from(Skip));
        assert!(!Pass.is_regression_from(Pass));
        assert!(!Fail.is_regression_from(Fail));
    }

    #[test]
    fn overall_verdict_precedence() {
        use Verdict::*;
        assert_eq!(overall_verdict(&[]), Error);
        assert_eq!(overall_verdict(&[Pass, Error, Fail]), Fail);
        assert_eq!(overall_verdict(&[Pass, Error, Void]), Error);
        assert_eq!(overall_verdict(&[Pass, Void, Skip]), Void);
        assert_eq!(overall_verdict(&[Pass, Skip, NotApplicable]), Pass);
        assert_eq!(overall_verdict(&[Skip, NotApplicable]), Skip);
    }

    #[test]
    fn engaged_doors_strips_seam_suffix_and_zero_counters() {
        let m: BTreeMap<String, u64> = [("MEMRA_A@o_join", 3), ("MEMRA_A@qkv", 0), ("MEMRA_B", 0), ("MEMRA_C", 1)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let doors: Vec<String> = engaged_doors(&m).into_iter().collect();
        assert_eq!(doors, ["MEMRA_A", "MEMRA_C"]);
    }
}
