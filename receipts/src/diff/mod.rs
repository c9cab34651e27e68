//! Comparing two receipt sets (`memra-gates diff OLD NEW`, docs/DESIGN.md §5): what a reviewer needs to see
//! about a pull request — verdicts that got worse, numerics that moved, runs that appeared or
//! vanished, and latencies that moved by more than the noise — short enough for a PR comment.
//!
//! # Rules
//!
//! - Runs are paired by `run_id` (a hash of the configuration), so the same configuration is
//!   compared across builds and nights.
//! - **Verdict change**: paired runs whose verdict differs. It is a *regression* when a PASS became
//!   anything else or anything became FAIL or ERROR ([`Verdict::is_regression_from`]).
//! - **Digest change**: paired runs whose layer × seam × token digests or token tape differ. The
//!   report names the first differing (prompt, step, column) in (prompt, step) then column order,
//!   and the new run's first divergence. A digest change alone is not a regression (a change to the
//!   canonical program moves the oracle too); the verdicts judge it.
//! - **Latency**: the noise rule of [`latency`] — ratios of medians normalised by each run's own
//!   speed, judged per run (with separated sample ranges), per seam across runs, and for the whole
//!   set. Slower findings are regressions (a whole-set slowdown only on CUDA receipts); faster
//!   ones never are.
//! - **Door effects**: each door's per-TP effect against its parent sets in OLD and in NEW
//!   ([`doors`]); a door that was FASTER and no longer is has *stopped paying*: a regression on
//!   CUDA receipts, reported only on host receipts.
//! - **Added / missing**: runs only in NEW / only in OLD. A missing run is a regression (coverage
//!   was lost); an added run is a regression only when it is FAIL or ERROR.
//!
//! [`DiffReport::regressed`] decides the exit status (1 when true).

pub mod doors;
pub mod latency;
mod render;

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use serde::Serialize;

pub use latency::{LatencyChange, NoiseRule, SeamChange, SetSpeed, CUDA_THRESHOLD, HOST_THRESHOLD};

use crate::error::ReceiptError;
use crate::schema::{Divergence, Receipt, SeamDigests, Verdict};

/// Most rows shown per section in Markdown and text; the rest are counted.
pub const MAX_ROWS_SHOWN: usize = 50;

/// The comparison of two receipt sets. Serialized with the canonical writer for `--format json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffReport {
    /// Whether anything regressed (see the module doc); decides exit status 1.
    pub regressed: bool,
    /// The latency noise rule as applied.
    pub noise: NoiseRule,
    pub counts: DiffCounts,
    pub verdict_changes: Vec<VerdictChange>,
    pub digest_changes: Vec<DigestChange>,
    /// Layer × seam of single runs beyond noise.
    pub latency_changes: Vec<LatencyChange>,
    /// Layer × seam beyond noise across the paired runs.
    pub seam_changes: Vec<SeamChange>,
    /// How the whole set moved.
    pub set_speed: Option<SetSpeed>,
    /// Doors whose per-TP effect against their parent sets changed.
    pub door_changes: Vec<doors::DoorChange>,
    pub added: Vec<RunRef>,
    pub missing: Vec<RunRef>,
    /// Anomalies in the inputs (e.g. a run_id present twice in one set).
    pub notes: Vec<String>,
    /// Whether the paired runs were built from other sources (their build digests,
    /// `kernel_source_digest`, differ): then moved digests are the build's doing, and every
    /// digest moving is "sources changed", not "no regression".
    pub sources_changed: bool,
    /// Whether every receipt of both sets ran on the host backend: the oracle and every run then
    /// use the same host twins, so a changed twin moves digests without any gate seeing it — the
    /// twins were not checked against a device.
    pub host_only: bool,
}

/// Totals for the one-line summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DiffCounts {
    pub old_runs: usize,
    pub new_runs: usize,
    pub paired: usize,
    /// Paired runs with the same verdict, digests and no latency change beyond noise.
    pub unchanged: usize,
    pub regressions: usize,
    pub verdict_changes: usize,
    pub digest_changes: usize,
    pub latency_slower: usize,
    pub latency_faster: usize,
    pub seams_slower: usize,
    pub seams_faster: usize,
    /// Layer × seam pairs of single runs compared and found within noise.
    pub latency_within_noise: usize,
    pub added: usize,
    pub missing: usize,
    /// Door × TP that were FASTER and no longer are.
    pub doors_stopped_paying: usize,
    /// Door effects that were FASTER and are now AMBIGUOUS (listed, never counted).
    pub doors_lost_evidence: usize,
}

/// A run present in only one set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunRef {
    pub run_id: String,
    pub label: String,
    pub verdict: Verdict,
}

/// A paired run whose verdict changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerdictChange {
    pub run_id: String,
    pub label: String,
    pub old: Verdict,
    pub new: Verdict,
    pub regression: bool,
    /// The new receipt's reason.
    pub reason: Option<String>,
    /// The new receipt's first divergence ([`Divergence::short`]).
    pub first_divergence: Option<String>,
}

/// A paired run whose evidence digests changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DigestChange {
    pub run_id: String,
    pub label: String,
    /// The first differing cell of the digest table, if the tables differ.
    pub first: Option<DigestDifference>,
    /// Whether the token tape digest changed.
    pub token_tape_changed: bool,
    /// Whether the digest column lists differ (cells are then compared by column name).
    pub columns_changed: bool,
    /// The new run's first divergence, if it records one.
    pub new_first_divergence: Option<Divergence>,
}

/// One cell of the digest table that differs; a side is `None` when it has no such row or column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DigestDifference {
    pub prompt: usize,
    pub step: usize,
    pub column: String,
    pub old: Option<String>,
    pub new: Option<String>,
}

/// Output format of a report (`--format md|text|json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiffFormat {
    Markdown,
    Text,
    Json,
}

impl FromStr for DiffFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "md" | "markdown" => Ok(DiffFormat::Markdown),
            "text" => Ok(DiffFormat::Text),
            "json" => Ok(DiffFormat::Json),
            other => Err(format!("diff format {other:?} is not one of md, text, json")),
        }
    }
}

/// Compares `old` with `new` under the rules of the module doc. `threshold` (relative: 0.5 is
/// 50%) overrides the noise rule's default and must be finite and ≥ 0. When a run_id appears
/// twice in one set, the first is used and a note says so.
pub fn diff(old: &[Receipt], new: &[Receipt], threshold: Option<f64>) -> Result<DiffReport, ReceiptError> {
    if let Some(t) = threshold.filter(|t| !(t.is_finite() && *t >= 0.0)) {
        return Err(ReceiptError::InvalidThreshold { value: t });
    }
    let noise = NoiseRule::for_receipts(new, threshold);
    let mut notes = Vec::new();
    let old_map = index(old, "OLD", &mut notes);
    let new_map = index(new, "NEW", &mut notes);

    let mut report = DiffReport {
        regressed: false,
        noise,
        counts: DiffCounts { old_runs: old_map.len(), new_runs: new_map.len(), ..DiffCounts::default() },
        verdict_changes: Vec::new(),
        digest_changes: Vec::new(),
        latency_changes: Vec::new(),
        seam_changes: Vec::new(),
        set_speed: None,
        door_changes: Vec::new(),
        added: Vec::new(),
        missing: Vec::new(),
        notes,
        sources_changed: false,
        host_only: old.iter().chain(new).all(|r| r.evidence.config.backend == crate::schema::Backend::Host),
    };

    let pairs: Vec<(&Receipt, &Receipt)> =
        old_map.iter().filter_map(|(id, o)| new_map.get(id).map(|n| (*o, *n))).collect();
    let findings = latency::judge(&pairs, &report.noise);
    let moved: BTreeSet<&str> = findings.run_changes.iter().map(|l| l.run_id.as_str()).collect();
    for (id, o) in &old_map {
        let Some(n) = new_map.get(id) else {
            report.missing.push(run_ref(o));
            continue;
        };
        report.counts.paired += 1;
        report.sources_changed |= o.evidence.build.kernel_source_digest != n.evidence.build.kernel_source_digest;
        let mut changed = moved.contains(id);
        let (ov, nv) = (o.evidence.verdict, n.evidence.verdict);
        if ov != nv {
            changed = true;
            report.verdict_changes.push(VerdictChange {
                run_id: id.to_string(),
                label: n.label(),
                old: ov,
                new: nv,
                regression: nv.is_regression_from(ov),
                reason: n.evidence.reason.clone(),
                first_divergence: n.evidence.first_divergence.as_ref().map(Divergence::short),
            });
        }
        if let Some(dc) = digest_change(o, n) {
            changed = true;
            report.digest_changes.push(dc);
        }
        if !changed {
            report.counts.unchanged += 1;
        }
    }
    for (id, n) in &new_map {
        if !old_map.contains_key(id) {
            report.added.push(run_ref(n));
        }
    }
    report.counts.latency_within_noise = findings.within_noise;
    report.latency_changes = findings.run_changes;
    report.seam_changes = findings.seam_changes;
    report.set_speed = findings.set_speed;
    report.door_changes = doors::door_changes(old, new, &report.noise);

    let c = &mut report.counts;
    c.verdict_changes = report.verdict_changes.len();
    c.digest_changes = report.digest_changes.len();
    c.latency_slower = report.latency_changes.iter().filter(|l| l.slower).count();
    c.latency_faster = report.latency_changes.len() - c.latency_slower;
    c.seams_slower = report.seam_changes.iter().filter(|s| s.slower).count();
    c.seams_faster = report.seam_changes.len() - c.seams_slower;
    c.added = report.added.len();
    c.missing = report.missing.len();
    c.doors_stopped_paying = report.door_changes.iter().filter(|d| d.stopped_paying).count();
    c.doors_lost_evidence = report.door_changes.iter().filter(|d| d.lost_evidence).count();
    c.regressions = report.door_changes.iter().filter(|d| d.regression).count()
        + report.verdict_changes.iter().filter(|v| v.regression).count()
        + report.latency_changes.iter().filter(|l| l.regression).count()
        + c.seams_slower
        + usize::from(report.set_speed.as_ref().is_some_and(|s| s.regression))
        + c.missing
        + report.added.iter().filter(|a| matches!(a.verdict, Verdict::Fail | Verdict::Error)).count();
    report.regressed = c.regressions > 0;
    Ok(report)
}

fn index<'a>(set: &'a [Receipt], name: &str, notes: &mut Vec<String>) -> BTreeMap<&'a str, &'a Receipt> {
    let mut map = BTreeMap::new();
    for r in set {
        if map.contains_key(r.run_id.as_str()) {
            notes.push(format!("run_id {} appears more than once in {name}; the first is used", r.run_id));
        } else {
            map.insert(r.run_id.as_str(), r);
        }
    }
    map
}

fn run_ref(r: &Receipt) -> RunRef {
    RunRef { run_id: r.run_id.clone(), label: r.label(), verdict: r.evidence.verdict }
}

fn digest_change(o: &Receipt, n: &Receipt) -> Option<DigestChange> {
    let (od, nd) = (&o.evidence.digests, &n.evidence.digests);
    let token_tape_changed = o.evidence.token_tape_digest != n.evidence.token_tape_digest;
    if od == nd && !token_tape_changed {
        return None;
    }
    Some(DigestChange {
        run_id: n.run_id.clone(),
        label: n.label(),
        first: first_digest_difference(od, nd),
        token_tape_changed,
        columns_changed: od.columns != nd.columns,
        new_first_divergence: n.evidence.first_divergence.clone(),
    })
}

/// The first differing cell in (prompt, step) order, then in the new table's column order (then
/// columns only the old table has).
fn first_digest_difference(od: &SeamDigests, nd: &SeamDigests) -> Option<DigestDifference> {
    let rows = |d: &SeamDigests| -> BTreeMap<(usize, usize), BTreeMap<String, String>> {
        d.rows
            .iter()
            .map(|r| ((r.prompt, r.step), d.columns.iter().cloned().zip(r.digests.iter().cloned()).collect()))
            .collect()
    };
    let (orows, nrows) = (rows(od), rows(nd));
    let mut columns: Vec<&String> = nd.columns.iter().collect();
    columns.extend(od.columns.iter().filter(|c| !nd.columns.contains(c)));
    let keys: BTreeSet<(usize, usize)> = orows.keys().chain(nrows.keys()).copied().collect();
    for key in keys {
        let (orow, nrow) = (orows.get(&key), nrows.get(&key));
        for col in &columns {
            let ov = orow.and_then(|r| r.get(*col));
            let nv = nrow.and_then(|r| r.get(*col));
            if ov != nv {
                return Some(DigestDifference {
                    prompt: key.0,
                    step: key.1,
                    column: (*col).clone(),
                    old: ov.cloned(),
                    new: nv.cloned(),
                });
            }
        }
    }
    None
}
