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
//! - **Latency change**: per paired run and layer × seam present on both sides, with the old run's
//!   `[min_ns, max_ns]` as its noise band and `t` the threshold (default 5%). Reported only when the
//!   new median lies outside the old band AND `|new_median − old_median| / max(old_median, 1 ns) > t`;
//!   otherwise counted as within noise. A reported slowdown is a regression; a speedup is not.
//! - **Added / missing**: runs only in NEW / only in OLD. A missing run is a regression (coverage
//!   was lost); an added run is a regression only when it is FAIL or ERROR.
//!
//! [`DiffReport::regressed`] decides the exit status (1 when true).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::str::FromStr;

use serde::Serialize;

use crate::error::ReceiptError;
use crate::export::md_cell;
use crate::json;
use crate::schema::{Divergence, Receipt, SeamDigests, Verdict};

/// Default relative latency threshold (5%).
pub const DEFAULT_THRESHOLD: f64 = 0.05;

/// Most rows shown per section in Markdown and text; the rest are counted.
pub const MAX_ROWS_SHOWN: usize = 50;

/// The comparison of two receipt sets. Serialized with the canonical writer for `--format json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffReport {
    /// Whether anything regressed (see the module doc); decides exit status 1.
    pub regressed: bool,
    /// Relative latency threshold used.
    pub threshold: f64,
    pub counts: DiffCounts,
    pub verdict_changes: Vec<VerdictChange>,
    pub digest_changes: Vec<DigestChange>,
    pub latency_changes: Vec<LatencyChange>,
    pub added: Vec<RunRef>,
    pub missing: Vec<RunRef>,
    /// Anomalies in the inputs (e.g. a run_id present twice in one set).
    pub notes: Vec<String>,
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
    /// Layer × seam pairs compared and found within noise.
    pub latency_within_noise: usize,
    pub added: usize,
    pub missing: usize,
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

/// A layer × seam whose median moved beyond noise.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyChange {
    pub run_id: String,
    pub label: String,
    pub layer: usize,
    pub seam: String,
    pub old_min_ns: u64,
    pub old_median_ns: u64,
    pub old_max_ns: u64,
    pub new_median_ns: u64,
    /// `(new_median − old_median) / max(old_median, 1)`.
    pub relative: f64,
    /// New median above the old band (a regression) rather than below it.
    pub slower: bool,
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

/// Compares `old` with `new` under the rules of the module doc. `threshold` is relative (0.05 = 5%)
/// and must be finite and ≥ 0. When a run_id appears twice in one set, the first is used and a
/// note says so.
pub fn diff(old: &[Receipt], new: &[Receipt], threshold: f64) -> Result<DiffReport, ReceiptError> {
    if !(threshold.is_finite() && threshold >= 0.0) {
        return Err(ReceiptError::InvalidThreshold { value: threshold });
    }
    let mut notes = Vec::new();
    let old_map = index(old, "OLD", &mut notes);
    let new_map = index(new, "NEW", &mut notes);

    let mut report = DiffReport {
        regressed: false,
        threshold,
        counts: DiffCounts { old_runs: old_map.len(), new_runs: new_map.len(), ..DiffCounts::default() },
        verdict_changes: Vec::new(),
        digest_changes: Vec::new(),
        latency_changes: Vec::new(),
        added: Vec::new(),
        missing: Vec::new(),
        notes,
    };

    for (id, o) in &old_map {
        let Some(n) = new_map.get(id) else {
            report.missing.push(run_ref(o));
            continue;
        };
        report.counts.paired += 1;
        let mut changed = false;
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
        let before = report.latency_changes.len();
        report.counts.latency_within_noise += latency_changes(o, n, threshold, &mut report.latency_changes);
        changed |= report.latency_changes.len() > before;
        if !changed {
            report.counts.unchanged += 1;
        }
    }
    for (id, n) in &new_map {
        if !old_map.contains_key(id) {
            report.added.push(run_ref(n));
        }
    }

    let c = &mut report.counts;
    c.verdict_changes = report.verdict_changes.len();
    c.digest_changes = report.digest_changes.len();
    c.latency_slower = report.latency_changes.iter().filter(|l| l.slower).count();
    c.latency_faster = report.latency_changes.len() - c.latency_slower;
    c.added = report.added.len();
    c.missing = report.missing.len();
    c.regressions = report.verdict_changes.iter().filter(|v| v.regression).count()
        + c.latency_slower
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

/// Appends the reported changes of one paired run; returns how many pairs were within noise.
fn latency_changes(o: &Receipt, n: &Receipt, threshold: f64, out: &mut Vec<LatencyChange>) -> usize {
    let olat: BTreeMap<(usize, &str), _> =
        o.measurements.latency.iter().map(|l| ((l.layer, l.seam.as_str()), l)).collect();
    let mut within = 0;
    for nl in &n.measurements.latency {
        let Some(ol) = olat.get(&(nl.layer, nl.seam.as_str())) else { continue };
        let outside_band = nl.median_ns < ol.min_ns || nl.median_ns > ol.max_ns;
        let relative = (nl.median_ns as f64 - ol.median_ns as f64) / (ol.median_ns.max(1) as f64);
        if outside_band && relative.abs() > threshold {
            out.push(LatencyChange {
                run_id: n.run_id.clone(),
                label: n.label(),
                layer: nl.layer,
                seam: nl.seam.clone(),
                old_min_ns: ol.min_ns,
                old_median_ns: ol.median_ns,
                old_max_ns: ol.max_ns,
                new_median_ns: nl.median_ns,
                relative,
                slower: nl.median_ns > ol.max_ns,
            });
        } else {
            within += 1;
        }
    }
    within
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn ns(v: u64) -> String {
    if v >= 1_000_000 {
        format!("{:.2} ms", v as f64 / 1e6)
    } else if v >= 1_000 {
        format!("{:.1} µs", v as f64 / 1e3)
    } else {
        format!("{v} ns")
    }
}

fn pct(r: f64) -> String {
    format!("{:+.1}%", r * 100.0)
}

impl DiffReport {
    /// Whether anything regressed: exit status 1.
    pub fn regressed(&self) -> bool {
        self.regressed
    }

    /// The report in the requested format.
    pub fn render(&self, format: DiffFormat) -> Result<String, ReceiptError> {
        match format {
            DiffFormat::Markdown => Ok(self.to_markdown()),
            DiffFormat::Text => Ok(self.to_text()),
            DiffFormat::Json => json::to_canonical_json(self),
        }
    }

    /// The one line of counts that opens every rendering.
    pub fn headline(&self) -> String {
        let c = &self.counts;
        format!(
            "{}: {} paired ({} unchanged) · {} · {} · {} · {} beyond noise (±{:.0}% and outside the old min–max) · {} · {}",
            if self.regressed { "REGRESSED" } else { "no regression" },
            c.paired,
            c.unchanged,
            plural(c.regressions, "regression", "regressions"),
            plural(c.verdict_changes, "verdict change", "verdict changes"),
            plural(c.digest_changes, "digest change", "digest changes"),
            plural(c.latency_slower + c.latency_faster, "latency move", "latency moves"),
            self.threshold * 100.0,
            plural(c.added, "new run", "new runs"),
            plural(c.missing, "missing run", "missing runs"),
        )
    }

    /// Markdown for a pull-request comment: the headline, then one `<details>` block per non-empty
    /// section (opened when it holds a regression), at most [`MAX_ROWS_SHOWN`] rows each.
    pub fn to_markdown(&self) -> String {
        let mut md = format!("**memra-gates diff — {}**\n", self.headline());
        let section = |md: &mut String, title: &str, n: usize, open: bool, header: &str, rows: Vec<String>| {
            if n == 0 {
                return;
            }
            let _ = write!(
                md,
                "\n<details{}><summary>{title} ({n})</summary>\n\n{header}\n",
                if open { " open" } else { "" }
            );
            for row in rows.iter().take(MAX_ROWS_SHOWN) {
                let _ = writeln!(md, "{row}");
            }
            if rows.len() > MAX_ROWS_SHOWN {
                let _ = writeln!(md, "\n… and {} more", rows.len() - MAX_ROWS_SHOWN);
            }
            md.push_str("\n</details>\n");
        };
        let vc: Vec<String> = self
            .verdict_changes
            .iter()
            .map(|v| {
                let what = v.first_divergence.as_deref().or(v.reason.as_deref()).unwrap_or("");
                format!(
                    "| {}{} → {} | {} | `{}` | {} |",
                    if v.regression { "❌ " } else { "" },
                    v.old,
                    v.new,
                    md_cell(&v.label),
                    v.run_id,
                    md_cell(what)
                )
            })
            .collect();
        section(
            &mut md,
            "Verdict changes",
            vc.len(),
            self.verdict_changes.iter().any(|v| v.regression),
            "| change | run | run_id | first divergence / reason |\n|---|---|---|---|",
            vc,
        );
        let dc: Vec<String> = self
            .digest_changes
            .iter()
            .map(|d| {
                let (cell, change) = match &d.first {
                    Some(f) => (
                        format!("p{} s{} {}", f.prompt, f.step, f.column),
                        format!("{} → {}", f.old.as_deref().unwrap_or("—"), f.new.as_deref().unwrap_or("—")),
                    ),
                    None => ("token tape only".to_string(), String::new()),
                };
                let mut notes = Vec::new();
                if d.token_tape_changed {
                    notes.push("token tape changed".to_string());
                }
                if d.columns_changed {
                    notes.push("columns changed".to_string());
                }
                if let Some(div) = &d.new_first_divergence {
                    notes.push(format!("first divergence {}", div.short()));
                }
                format!("| {} | {} | {} | {} |", md_cell(&d.label), md_cell(&cell), change, md_cell(&notes.join("; ")))
            })
            .collect();
        section(
            &mut md,
            "Digest changes",
            dc.len(),
            false,
            "| run | first differing cell | old → new | notes |\n|---|---|---|---|",
            dc,
        );
        let lc: Vec<String> = self
            .latency_changes
            .iter()
            .map(|l| {
                format!(
                    "| {}{} | {} | L{}.{} | {} [{} – {}] | {} |",
                    if l.slower { "❌ " } else { "" },
                    pct(l.relative),
                    md_cell(&l.label),
                    l.layer,
                    md_cell(&l.seam),
                    ns(l.old_median_ns),
                    ns(l.old_min_ns),
                    ns(l.old_max_ns),
                    ns(l.new_median_ns)
                )
            })
            .collect();
        section(
            &mut md,
            "Latency beyond noise",
            lc.len(),
            self.latency_changes.iter().any(|l| l.slower),
            "| change | run | seam | old median [min – max] | new median |\n|---:|---|---|---|---|",
            lc,
        );
        let refs = |v: &[RunRef], bad: fn(Verdict) -> bool| -> Vec<String> {
            v.iter()
                .map(|r| {
                    format!(
                        "| {}{} | {} | `{}` |",
                        if bad(r.verdict) { "❌ " } else { "" },
                        r.verdict,
                        md_cell(&r.label),
                        r.run_id
                    )
                })
                .collect()
        };
        let is_bad_new = |v: Verdict| matches!(v, Verdict::Fail | Verdict::Error);
        section(
            &mut md,
            "New runs",
            self.added.len(),
            self.added.iter().any(|a| is_bad_new(a.verdict)),
            "| verdict | run | run_id |\n|---|---|---|",
            refs(&self.added, is_bad_new),
        );
        section(
            &mut md,
            "Missing runs",
            self.missing.len(),
            true,
            "| old verdict | run | run_id |\n|---|---|---|",
            refs(&self.missing, |_| true),
        );
        if !self.notes.is_empty() {
            md.push('\n');
            for n in &self.notes {
                let _ = writeln!(md, "> note: {}", md_cell(n));
            }
        }
        md
    }

    /// Plain text for a terminal: the headline, then one line per item.
    pub fn to_text(&self) -> String {
        let mut t = format!("memra-gates diff — {}\n", self.headline());
        let cap = |t: &mut String, title: &str, lines: Vec<String>| {
            if lines.is_empty() {
                return;
            }
            let _ = writeln!(t, "\n{title} ({}):", lines.len());
            for l in lines.iter().take(MAX_ROWS_SHOWN) {
                let _ = writeln!(t, "  {l}");
            }
            if lines.len() > MAX_ROWS_SHOWN {
                let _ = writeln!(t, "  … and {} more", lines.len() - MAX_ROWS_SHOWN);
            }
        };
        cap(
            &mut t,
            "verdict changes",
            self.verdict_changes
                .iter()
                .map(|v| {
                    let what = v.first_divergence.as_deref().or(v.reason.as_deref()).unwrap_or("");
                    format!(
                        "{}{} -> {}  {} [{}]  {what}",
                        if v.regression { "REGRESSION " } else { "" },
                        v.old,
                        v.new,
                        v.label,
                        v.run_id
                    )
                })
                .collect(),
        );
        cap(
            &mut t,
            "digest changes",
            self.digest_changes
                .iter()
                .map(|d| {
                    let first = match &d.first {
                        Some(f) => format!(
                            "first at p{} s{} {}: {} -> {}",
                            f.prompt,
                            f.step,
                            f.column,
                            f.old.as_deref().unwrap_or("-"),
                            f.new.as_deref().unwrap_or("-")
                        ),
                        None => "digest table equal".to_string(),
                    };
                    let tape = if d.token_tape_changed { "; token tape changed" } else { "" };
                    let div = d.new_first_divergence.as_ref().map(|x| format!("; first divergence {}", x.short()));
                    format!("{} [{}]  {first}{tape}{}", d.label, d.run_id, div.unwrap_or_default())
                })
                .collect(),
        );
        cap(
            &mut t,
            "latency beyond noise",
            self.latency_changes
                .iter()
                .map(|l| {
                    format!(
                        "{}{}  {} L{}.{}  {} [{} - {}] -> {}",
                        if l.slower { "REGRESSION " } else { "" },
                        pct(l.relative),
                        l.label,
                        l.layer,
                        l.seam,
                        ns(l.old_median_ns),
                        ns(l.old_min_ns),
                        ns(l.old_max_ns),
                        ns(l.new_median_ns)
                    )
                })
                .collect(),
        );
        cap(
            &mut t,
            "new runs",
            self.added.iter().map(|r| format!("{}  {} [{}]", r.verdict, r.label, r.run_id)).collect(),
        );
        cap(
            &mut t,
            "missing runs",
            self.missing.iter().map(|r| format!("REGRESSION was {}  {} [{}]", r.verdict, r.label, r.run_id)).collect(),
        );
        cap(&mut t, "notes", self.notes.clone());
        t
    }
}
