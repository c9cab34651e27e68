//! The latency noise rule of `diff` (METRICS.md, "diff: latency beyond noise"). Timings on a
//! shared machine move for reasons that are not the change under review: another process takes a
//! core and a whole run gets slower; a thread wakes late and a join's median jumps by 100×. The
//! rule therefore judges *ratios of medians*, normalised by each run's own speed, and asks for
//! agreement before it calls something a regression:
//!
//! - **run speed factor** `f` of a paired run: the median over its layer × seam pairs of
//!   `r = new_median / old_median`. It absorbs load that slows a whole run.
//! - **normalised ratio** `q = r / f` of one layer × seam of one run.
//! - **single run**: slower when `q > 1 + T` and the new samples lie wholly above the old ones
//!   (`new_min > old_max · (1 + T/2)`); faster symmetrically. On CUDA receipts a slower single
//!   run is a regression; on host receipts it is reported only: on a shared machine one seam was
//!   seen to double for a whole short run between back-to-back runs of one build (METRICS.md),
//!   so there a regression needs the agreement of the across-run check below.
//! - **seam across runs**: for each layer × seam present in at least [`MIN_RUNS`] paired runs, the
//!   median of its `q`: slower when above `1 + T`, faster when below `1 / (1 + T)`. A seam made
//!   2× slower by a change is 2× slower in every run; noise is not.
//! - **whole set**: the median of the runs' `f`. Above `1 + T` every seam got slower together; on
//!   CUDA receipts (a dedicated device) that counts as a regression, on host receipts it is
//!   reported only (a uniform slowdown is what a loaded shared machine looks like).
//!
//! `T` is `--threshold`, else [`HOST_THRESHOLD`] when any new receipt ran on the host backend,
//! else [`CUDA_THRESHOLD`]. Slower findings of the first two kinds are regressions; faster ones
//! never are.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::schema::{Backend, Receipt, SeamLatency};

/// Default threshold for receipts of the host backend (shared CPU cores).
pub const HOST_THRESHOLD: f64 = 0.5;
/// Default threshold when every new receipt ran on CUDA (device events on a dedicated device).
pub const CUDA_THRESHOLD: f64 = 0.10;
/// Paired runs a layer × seam needs before its across-run median is judged.
pub const MIN_RUNS: usize = 3;
/// Layer × seam pairs a run needs before its own speed factor is taken (else 1).
pub const MIN_SEAMS_FOR_FACTOR: usize = 3;

/// The rule as applied: its threshold, where the threshold came from, and whether a whole-set
/// slowdown counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NoiseRule {
    pub threshold: f64,
    /// `--threshold`, `host default` or `cuda default`.
    pub source: String,
    pub whole_set_counts: bool,
    /// Whether a slower single run counts as a regression (CUDA receipts) or is reported only
    /// (host receipts).
    pub single_runs_count: bool,
}

impl NoiseRule {
    /// `threshold` when given, else the default for the new receipts' backends.
    pub fn for_receipts(new: &[Receipt], threshold: Option<f64>) -> NoiseRule {
        let host = new.iter().any(|r| r.evidence.config.backend == Backend::Host);
        let whole_set_counts = !host && !new.is_empty();
        let (threshold, source) = match threshold {
            Some(t) => (t, "--threshold"),
            None if host => (HOST_THRESHOLD, "host default"),
            None => (CUDA_THRESHOLD, "cuda default"),
        };
        NoiseRule { threshold, source: source.into(), whole_set_counts, single_runs_count: whole_set_counts }
    }
}

/// One layer × seam of one paired run beyond noise.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyChange {
    pub run_id: String,
    pub label: String,
    pub layer: usize,
    pub seam: String,
    pub old_min_ns: u64,
    pub old_median_ns: u64,
    pub old_max_ns: u64,
    pub new_min_ns: u64,
    pub new_median_ns: u64,
    pub new_max_ns: u64,
    /// `new_median / old_median`.
    pub ratio: f64,
    /// `ratio` divided by the run's speed factor.
    pub normalized: f64,
    pub slower: bool,
    /// Counted as a regression (slower, and the rule counts single runs).
    pub regression: bool,
}

/// A layer × seam whose median normalised ratio across the paired runs is beyond noise.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeamChange {
    pub layer: usize,
    pub seam: String,
    /// Paired runs that have this layer × seam.
    pub runs: usize,
    /// Median over those runs of the normalised ratio.
    pub median_normalized: f64,
    pub slower: bool,
}

/// How the whole set moved: the median of the runs' speed factors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetSpeed {
    pub factor: f64,
    pub runs: usize,
    /// Beyond the threshold in either direction.
    pub beyond_noise: bool,
    /// Counted as a regression (slower, and the rule counts whole-set moves).
    pub regression: bool,
}

/// Everything the rule found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LatencyFindings {
    pub run_changes: Vec<LatencyChange>,
    pub seam_changes: Vec<SeamChange>,
    pub set_speed: Option<SetSpeed>,
    /// Layer × seam pairs of paired runs compared and found within noise at the single-run level.
    pub within_noise: usize,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] * v[n / 2]).sqrt()),
    }
}

/// Apply the rule to the paired runs `(old, new)`.
pub fn judge(pairs: &[(&Receipt, &Receipt)], rule: &NoiseRule) -> LatencyFindings {
    let t = rule.threshold;
    let mut out = LatencyFindings::default();
    let mut by_seam: BTreeMap<(usize, String), Vec<f64>> = BTreeMap::new();
    let mut factors = Vec::new();
    for (o, n) in pairs {
        let olat: BTreeMap<(usize, &str), &SeamLatency> =
            o.measurements.latency.iter().map(|l| ((l.layer, l.seam.as_str()), l)).collect();
        let matched: Vec<(&SeamLatency, &SeamLatency, f64)> = n
            .measurements
            .latency
            .iter()
            .filter_map(|nl| {
                let ol = olat.get(&(nl.layer, nl.seam.as_str()))?;
                let ratio = nl.median_ns.max(1) as f64 / ol.median_ns.max(1) as f64;
                Some((*ol, nl, ratio))
            })
            .collect();
        if matched.is_empty() {
            continue;
        }
        let factor = if matched.len() >= MIN_SEAMS_FOR_FACTOR {
            median(matched.iter().map(|m| m.2).collect()).unwrap_or(1.0)
        } else {
            1.0
        };
        factors.push(factor);
        for (ol, nl, ratio) in matched {
            let q = ratio / factor;
            by_seam.entry((nl.layer, nl.seam.clone())).or_default().push(q);
            let separated_up = nl.min_ns as f64 > ol.max_ns as f64 * (1.0 + t / 2.0);
            let separated_down = (nl.max_ns as f64) * (1.0 + t / 2.0) < ol.min_ns as f64;
            let slower = q > 1.0 + t && separated_up;
            let faster = q < 1.0 / (1.0 + t) && separated_down;
            if slower || faster {
                out.run_changes.push(LatencyChange {
                    run_id: n.run_id.clone(),
                    label: n.label(),
                    layer: nl.layer,
                    seam: nl.seam.clone(),
                    old_min_ns: ol.min_ns,
                    old_median_ns: ol.median_ns,
                    old_max_ns: ol.max_ns,
                    new_min_ns: nl.min_ns,
                    new_median_ns: nl.median_ns,
                    new_max_ns: nl.max_ns,
                    ratio,
                    normalized: q,
                    slower,
                    regression: slower && rule.single_runs_count,
                });
            } else {
                out.within_noise += 1;
            }
        }
    }
    for ((layer, seam), qs) in by_seam {
        let runs = qs.len();
        if runs < MIN_RUNS {
            continue;
        }
        let m = median(qs).unwrap_or(1.0);
        if m > 1.0 + t || m < 1.0 / (1.0 + t) {
            out.seam_changes.push(SeamChange { layer, seam, runs, median_normalized: m, slower: m > 1.0 });
        }
    }
    let runs = factors.len();
    if let Some(f) = median(factors) {
        let beyond_noise = f > 1.0 + t || f < 1.0 / (1.0 + t);
        out.set_speed = Some(SetSpeed {
            factor: f,
            runs,
            beyond_noise,
            regression: beyond_noise && f > 1.0 && rule.whole_set_counts,
        });
    }
    out
}
