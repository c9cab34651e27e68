//! `memra-gates bench --compare BASE.json [--against NEW.json]`: is this build faster or slower
//! than an earlier bench of the same configuration on the same machine?
//!
//! Both sides are performance receipts (`bench` writes them). Each layer × seam, each whole layer
//! (the sum of its seams; per token for rows or columns, the same ratio ÷ lanes on both sides) and
//! the whole step are judged by the one noise rule of door effects
//! ([`memra_receipts::effect::rule`], METRICS.md, "Door effects"): FASTER, SAME, SLOWER or AMBIGUOUS with the
//! interval `[r / (1 + ν), r · (1 + ν)]`. Any SLOWER is a regression: exit status
//! [`REGRESSION_EXIT`]. A base that is not the same configuration on the same machine is refused
//! before anything is judged ([`comparable`]; exit status 2), naming the field and both values.

use super::Status;
use crate::error::GateError;
use memra_receipts::effect::{compare, Comparison, Effect, Span};
use memra_receipts::schema::{Backend, Receipt, ReceiptKind, SeamLatency};
use std::path::Path;

/// The exit status of a bench whose comparison found a regression (a SLOWER seam, layer or
/// step): distinct from 1 (a gate failed) and 2 (the harness could not run, or the base is not
/// comparable).
pub const REGRESSION_EXIT: u8 = 3;

/// The door that captures the whole step (`bench --graph`).
pub(super) const GRAPH_DOOR: &str = "MEMRA_STEP_TP_GRAPH";

/// The card of a CUDA receipt: its name, architecture and memory (`cuda: <ranks>; <name> <arch>
/// <GiB>; …` → `<name> <arch> <GiB>`), not its ordinal or the compile options.
pub(super) fn cuda_card(r: &Receipt) -> Option<&str> {
    r.measurements.device.as_deref().map(|d| d.split("; ").nth(1).unwrap_or(d))
}

/// One judged latency.
#[derive(Debug, Clone)]
pub struct Row {
    /// `L0.qkv`, `L0 layer`, `L0 per token`, `head.logits`, `step`.
    pub name: String,
    /// Whether it is a single seam (the verdict counts seams apart from sums).
    pub seam: bool,
    /// Lanes per pass the medians are divided by when printed (per token), else 1.
    pub per: usize,
    pub cmp: Comparison,
}

/// The comparison of a performance receipt with its base.
#[derive(Debug, Clone)]
pub struct BenchComparison {
    pub backend: Backend,
    pub rows: Vec<Row>,
}

/// The fields that must agree for two performance receipts to be compared: (field, value).
fn identity(r: &Receipt) -> Vec<(&'static str, String)> {
    let c = &r.evidence.config;
    let layers = r.measurements.latency.iter().filter(|e| e.seam != "final_norm" && e.seam != "logits");
    let n_layers = layers.map(|e| e.layer + 1).max().unwrap_or(0);
    let graph = c.doors.get(GRAPH_DOOR).copied().unwrap_or(false);
    // The device: the card on CUDA; the host's description on the host backend.
    let device = match (cuda_card(r), c.backend) {
        (Some(d), Backend::Cuda) => d.to_string(),
        _ => r.measurements.host.clone(),
    };
    vec![
        ("kind", r.kind.as_str().to_string()),
        ("subject", c.subject.clone()),
        ("preset", c.model.preset.clone()),
        ("model digest", c.model.digest.clone()),
        ("layers", n_layers.to_string()),
        ("tp", c.tp.to_string()),
        ("transport", c.transport.as_str().to_string()),
        ("batch", c.batch.unwrap_or(1).to_string()),
        ("columns", c.columns.unwrap_or(1).to_string()),
        ("backend", c.backend.as_str().to_string()),
        ("graph", if graph { "on" } else { "off" }.to_string()),
        ("doors", doors_identity(&c.doors)),
        ("device", device),
    ]
}

/// The `doors` field of a performance receipt's identity: its door variables but the graph door
/// (a field of its own), `NAME=value` sorted, or `defaults`.
pub fn doors_identity(doors: &std::collections::BTreeMap<String, bool>) -> String {
    let others: Vec<String> = doors.iter().filter(|(k, _)| *k != GRAPH_DOOR).map(|(k, v)| format!("{k}={v}")).collect();
    if others.is_empty() {
        "defaults".into()
    } else {
        others.join(" ")
    }
}

/// The first field two receipts disagree on: the field, the base's value, the new one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub field: &'static str,
    pub base: String,
    pub new: String,
}

/// Refuse two receipts that are not the same configuration on the same machine.
pub fn comparable(base: &Receipt, new: &Receipt) -> Result<(), Mismatch> {
    for ((field, b), (_, n)) in identity(base).into_iter().zip(identity(new)) {
        if b != n {
            return Err(Mismatch { field, base: b, new: n });
        }
    }
    Ok(())
}

/// Before a run: refuse a base whose configuration already differs from the planned one in any of
/// `planned` (field, value) — the fields [`comparable`] checks that are known before timing.
pub fn precheck(base_path: &Path, base: &Receipt, planned: &[(&'static str, String)]) -> Result<(), GateError> {
    let known = identity(base);
    for (field, new) in planned {
        if let Some((_, b)) = known.iter().find(|(f, _)| f == field).filter(|(_, b)| b != new) {
            return Err(GateError::Incomparable {
                base_path: base_path.to_path_buf(),
                field,
                base: b.clone(),
                new: new.clone(),
            });
        }
    }
    Ok(())
}

/// Judge `new` against `base` (both checked by [`comparable`]).
pub fn judge(base: &Receipt, new: &Receipt) -> Result<BenchComparison, Mismatch> {
    comparable(base, new)?;
    let backend = new.evidence.config.backend;
    let lanes = new.evidence.config.lanes();
    let find = |r: &'_ Receipt, layer: usize, seam: &str| -> Option<SeamLatency> {
        r.measurements.latency.iter().find(|e| e.layer == layer && e.seam == seam).cloned()
    };
    let mut rows = Vec::new();
    let mut push = |name: String, seam: bool, per: usize, b: &[SeamLatency], n: &[SeamLatency]| {
        if let (Some(bs), Some(ns)) = (Span::of(b), Span::of(n)) {
            rows.push(Row { name, seam, per, cmp: compare(&ns, &bs, backend) });
        }
    };
    let layers: std::collections::BTreeSet<usize> = new.measurements.latency.iter().map(|e| e.layer).collect();
    for &l in &layers {
        let (mut bl, mut nl) = (Vec::new(), Vec::new());
        let seams = new.measurements.latency.iter().filter(|e| e.layer == l).map(|e| e.seam.clone());
        let head = new.measurements.latency.iter().any(|e| e.layer == l && e.seam == "logits");
        for seam in seams.collect::<Vec<_>>() {
            let Some(n) = find(new, l, &seam) else { continue };
            let Some(b) = find(base, l, &seam) else {
                return Err(Mismatch { field: "seams", base: format!("no L{l}.{seam}"), new: format!("L{l}.{seam}") });
            };
            let name = if head { format!("head.{seam}") } else { format!("L{l}.{seam}") };
            push(name, true, 1, std::slice::from_ref(&b), std::slice::from_ref(&n));
            bl.push(b);
            nl.push(n);
        }
        if !head {
            push(format!("L{l} layer"), false, 1, &bl, &nl);
            if lanes > 1 {
                push(format!("L{l} per token"), false, lanes, &bl, &nl);
            }
        }
    }
    push("step".into(), false, 1, &base.measurements.latency, &new.measurements.latency);
    Ok(BenchComparison { backend, rows })
}

impl BenchComparison {
    /// The rows judged SLOWER.
    pub fn slower(&self) -> Vec<&Row> {
        self.rows.iter().filter(|r| r.cmp.effect == Effect::Slower).collect()
    }

    /// Whether anything is SLOWER beyond noise.
    pub fn regressed(&self) -> bool {
        !self.slower().is_empty()
    }

    /// The table and the one-line verdict.
    pub fn lines(&self) -> Vec<String> {
        let floor = memra_receipts::effect::rule::floor(self.backend);
        let mut out = vec![
            format!(
                "compared with the base by the door-effect noise rule (METRICS.md, door effects): noise ν = max(spreads, {floor}) on {}, \
                 SAME needs ν ≤ {}",
                self.backend.as_str(),
                memra_receipts::effect::rule::SAME_MAX_NOISE
            ),
            format!("{:<18} {:>11} {:>11} {:>7} {:>15}  effect", "", "base µs", "new µs", "ratio", "interval"),
        ];
        for r in &self.rows {
            let us = |ns: u64| ns as f64 / 1e3 / r.per as f64;
            out.push(format!(
                "{:<18} {:>11.1} {:>11.1} {:>7} {:>15}  {}",
                r.name,
                us(r.cmp.parent_median_ns),
                us(r.cmp.median_ns),
                format!("×{:.2}", r.cmp.ratio),
                format!("[{:.2}, {:.2}]", r.cmp.lo, r.cmp.hi),
                r.cmp.effect
            ));
        }
        out.push(self.verdict());
        out
    }

    /// `verdict: REGRESSION …` or `verdict: no regression …`, with the counts of seams by effect.
    pub fn verdict(&self) -> String {
        let seams: Vec<&Row> = self.rows.iter().filter(|r| r.seam).collect();
        let count = |e: Effect| seams.iter().filter(|r| r.cmp.effect == e).count();
        let counts = format!(
            "{} seams: {} FASTER, {} SAME, {} SLOWER, {} AMBIGUOUS",
            seams.len(),
            count(Effect::Faster),
            count(Effect::Same),
            count(Effect::Slower),
            count(Effect::Ambiguous)
        );
        let slower = self.slower();
        if slower.is_empty() {
            return format!("verdict: no regression ({counts})");
        }
        let named: Vec<String> = slower.iter().take(6).map(|r| format!("{} ×{:.2}", r.name, r.cmp.ratio)).collect();
        let more = if slower.len() > 6 { format!(" and {} more", slower.len() - 6) } else { String::new() };
        format!(
            "verdict: REGRESSION: {} SLOWER beyond noise ({}{more}); {counts}; exit status {REGRESSION_EXIT}",
            slower.len(),
            named.join(", ")
        )
    }
}

/// Read a performance receipt for `--compare` or `--against`.
pub fn read(flag: &str, p: &Path) -> Result<Receipt, GateError> {
    let r = memra_receipts::json::read_receipt(p)
        .map_err(|e| GateError::usage(format!("{flag} {}: not a readable receipt: {e}", p.display())))?;
    if r.kind != ReceiptKind::Performance {
        return Err(GateError::usage(format!(
            "{flag} {}: a {} receipt; --compare and --against take performance receipts (`bench --out` writes them)",
            p.display(),
            r.kind.as_str()
        )));
    }
    Ok(r)
}

/// Print the comparison of `new` with `base`; the status a regression gives.
pub fn report(base_path: &Path, base: &Receipt, new: &Receipt) -> Result<Status, GateError> {
    let c = judge(base, new).map_err(|m| GateError::Incomparable {
        base_path: base_path.to_path_buf(),
        field: m.field,
        base: m.base,
        new: m.new,
    })?;
    crate::say!("--compare {} (run {}):", base_path.display(), base.run_id);
    for line in c.lines() {
        crate::say!("{line}");
    }
    Ok(if c.regressed() { Status::Regressed } else { Status::Passed })
}

/// `bench --compare BASE --against NEW`: two receipts, nothing run.
pub fn compare_receipts(base_path: &Path, new_path: &Path) -> Result<Status, GateError> {
    let base = read("--compare", base_path)?;
    let new = read("--against", new_path)?;
    report(base_path, &base, &new)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A performance receipt the H200 wrote (docs/gpu/2026-12-01-perf/).
    fn h200(mode: &str) -> Receipt {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../docs/gpu/2026-12-01-perf/bench-step-2layers-{mode}-receipt.json"));
        memra_receipts::json::read_receipt(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn a_cuda_receipt_against_itself_is_no_regression_and_a_tenth_slower_experts_seam_is() {
        let base = h200("graph");
        let c = judge(&base, &base).unwrap();
        assert!(!c.regressed(), "{:#?}", c.lines());
        assert!(c.rows.iter().all(|r| matches!(r.cmp.effect, Effect::Same | Effect::Ambiguous)));
        // The device's tight spread (CUDA floor 0.03) resolves a 10 % slowdown of one seam.
        let mut new = base.clone();
        for e in new.measurements.latency.iter_mut().filter(|e| e.layer == 0 && e.seam == "experts") {
            (e.min_ns, e.median_ns, e.p90_ns, e.max_ns) =
                (e.min_ns * 11 / 10, e.median_ns * 11 / 10, e.p90_ns * 11 / 10, e.max_ns * 11 / 10);
        }
        let c = judge(&base, &new).unwrap();
        let slower: Vec<&str> = c.slower().iter().map(|r| r.name.as_str()).collect();
        assert!(slower.contains(&"L0.experts"), "{:#?}", c.lines());
        assert!(c.verdict().starts_with("verdict: REGRESSION"), "{}", c.verdict());
        // And the other way round it is FASTER, not a regression.
        let c = judge(&new, &base).unwrap();
        assert!(!c.regressed());
        assert!(c.rows.iter().any(|r| r.name == "L0.experts" && r.cmp.effect == Effect::Faster));
    }

    #[test]
    fn graph_on_against_off_and_another_device_are_not_comparable() {
        let (graph, eager) = (h200("graph"), h200("eager"));
        let m = comparable(&graph, &eager).unwrap_err();
        assert_eq!((m.field, m.base.as_str(), m.new.as_str()), ("graph", "on", "off"));
        // Another ordinal of the same device is the same device; another device is not.
        let mut other = graph.clone();
        let d = other.measurements.device.clone().unwrap();
        other.measurements.device = Some(d.replace("devices [0]", "devices [3]"));
        assert_ne!(other.measurements.device, graph.measurements.device);
        assert_eq!(comparable(&graph, &other), Ok(()));
        other.measurements.device = Some(d.replace("H200", "H100"));
        assert_eq!(comparable(&graph, &other).unwrap_err().field, "device");
    }
}
