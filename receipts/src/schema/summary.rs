//! The summary a matrix run writes beside its receipts (`summary.json`): one row per run, the
//! verdict counts and the overall verdict, which the reader checks against the rows.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{required, Divergence, Receipt, Verdict, SUMMARY_SCHEMA_VERSION};

/// The summary a matrix run writes beside its receipts (`summary.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    /// Always [`SUMMARY_SCHEMA_VERSION`].
    pub schema_version: u32,
    pub kind: SummaryKind,
    /// Matrix name as given on the command line (`"all"`, `"smoke"`).
    pub matrix: String,
    /// How many rows have each verdict; the reader checks them against `rows`.
    pub counts: VerdictCounts,
    /// [`overall_verdict`] of the rows; the reader checks it.
    pub overall: Verdict,
    /// One row per run, sorted by `run_id`.
    pub rows: Vec<SummaryRow>,
    /// Configurations of the plan that the registry's rules excluded (a door-set file that
    /// declares `expect_exclusions = true`), each with the rule; absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded: Vec<SummaryExclusion>,
}

/// A configuration that was never run, and the rule that excluded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryExclusion {
    pub label: String,
    pub rule: String,
}

/// The `kind` of a [`Summary`]: always `"summary"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SummaryKind {
    Summary,
}

/// Verdict tallies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerdictCounts {
    pub pass: u64,
    pub fail: u64,
    pub void: u64,
    pub skip: u64,
    pub not_applicable: u64,
    pub error: u64,
}

impl VerdictCounts {
    pub fn tally(verdicts: impl IntoIterator<Item = Verdict>) -> Self {
        let mut c = VerdictCounts::default();
        for v in verdicts {
            c.add(v);
        }
        c
    }

    pub fn add(&mut self, v: Verdict) {
        *self.slot(v) += 1;
    }

    pub fn get(&self, v: Verdict) -> u64 {
        match v {
            Verdict::Pass => self.pass,
            Verdict::Fail => self.fail,
            Verdict::Void => self.void,
            Verdict::Skip => self.skip,
            Verdict::NotApplicable => self.not_applicable,
            Verdict::Error => self.error,
        }
    }

    fn slot(&mut self, v: Verdict) -> &mut u64 {
        match v {
            Verdict::Pass => &mut self.pass,
            Verdict::Fail => &mut self.fail,
            Verdict::Void => &mut self.void,
            Verdict::Skip => &mut self.skip,
            Verdict::NotApplicable => &mut self.not_applicable,
            Verdict::Error => &mut self.error,
        }
    }

    pub fn total(&self) -> u64 {
        Verdict::ALL.iter().map(|v| self.get(*v)).sum()
    }

    /// `"12 PASS · 1 FAIL · 2 SKIP"`: non-zero counts in [`Verdict::ALL`] order, or `"no runs"`.
    pub fn one_line(&self) -> String {
        let parts: Vec<String> =
            Verdict::ALL.iter().filter(|v| self.get(**v) > 0).map(|v| format!("{} {}", self.get(*v), v)).collect();
        if parts.is_empty() {
            "no runs".to_string()
        } else {
            parts.join(" · ")
        }
    }
}

/// One run in a [`Summary`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryRow {
    pub run_id: String,
    pub label: String,
    pub verdict: Verdict,
    #[serde(deserialize_with = "required")]
    pub reason: Option<String>,
    /// [`Divergence::short`] of the run's first divergence.
    #[serde(deserialize_with = "required")]
    pub first_divergence: Option<String>,
    /// Doors with a counter > 0 ([`engaged_doors`]), sorted.
    pub engaged: Vec<String>,
    pub wall_ms: f64,
}

impl Summary {
    /// The summary of a set of receipts (rows sorted by `run_id`).
    pub fn from_receipts(matrix: impl Into<String>, receipts: &[Receipt]) -> Summary {
        let mut rows: Vec<SummaryRow> = receipts
            .iter()
            .map(|r| SummaryRow {
                run_id: r.run_id.clone(),
                label: r.label(),
                verdict: r.evidence.verdict,
                reason: r.evidence.reason.clone(),
                first_divergence: r.evidence.first_divergence.as_ref().map(Divergence::short),
                engaged: engaged_doors(&r.evidence.engaged).into_iter().collect(),
                wall_ms: r.measurements.wall_ms,
            })
            .collect();
        rows.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        let verdicts: Vec<Verdict> = rows.iter().map(|r| r.verdict).collect();
        Summary {
            schema_version: SUMMARY_SCHEMA_VERSION,
            kind: SummaryKind::Summary,
            matrix: matrix.into(),
            counts: VerdictCounts::tally(verdicts.iter().copied()),
            overall: overall_verdict(&verdicts),
            rows,
            excluded: Vec::new(),
        }
    }
}

/// The verdict of a set of runs: FAIL if any failed; else ERROR if any errored; else VOID if any was
/// void; else PASS if any passed; else (only SKIP / NOT-APPLICABLE) SKIP. An empty set is ERROR:
/// nothing was tested.
pub fn overall_verdict(verdicts: &[Verdict]) -> Verdict {
    let has = |v: Verdict| verdicts.contains(&v);
    if verdicts.is_empty() {
        Verdict::Error
    } else if has(Verdict::Fail) {
        Verdict::Fail
    } else if has(Verdict::Error) {
        Verdict::Error
    } else if has(Verdict::Void) {
        Verdict::Void
    } else if has(Verdict::Pass) {
        Verdict::Pass
    } else {
        Verdict::Skip
    }
}

/// The doors whose engagement counter is > 0: the door part of each counter key
/// (`"<door_id>.<what>"` → `door_id`; an older `"MEMRA_X@seam"` → `MEMRA_X`).
pub fn engaged_doors(engaged: &BTreeMap<String, u64>) -> BTreeSet<String> {
    engaged
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, _)| {
            let k = k.split_once('@').map_or(k.as_str(), |(door, _)| door);
            k.split_once('.').map_or(k, |(door, _)| door).to_string()
        })
        .collect()
}
