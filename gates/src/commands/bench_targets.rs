//! `memra-gates bench --targets RECEIPT.json [--ncu PROFILE.csv]`: issue 27's targets judged from
//! one b1 bench receipt and ncu's profile of the same build on the same card — the target table of
//! a GPU call as one printed verdict, nothing run.
//!
//! The targets (issue 27, one H200, `step`, TP1, one token per pass, `--graph`): the gated layer
//! ≤ 100 µs; the experts seam ≤ 1.35× its floor; each BF16 GEMV seam (qkv, o_proj) ≤ 1.3× its
//! floor; gate overhead ≤ 5 %; each single-row reduction kernel (rmsnorm, add_rmsnorm, router
//! top-k, argmax, fold_combine) ≤ 3 µs per launch under ncu. The card is a row of its own: on
//! another card every figure is printed and judged, and the card's row is NOT MET. A figure the
//! receipt or profile lacks is NOT MEASURED, never met. Exit status 0 only when every row is MET.
//! The router seam is not judged as a BF16 GEMV: it holds the top-k too (its kernels are).

use super::bench_compare::{cuda_card, GRAPH_DOOR};
use super::ncu_profile::{self, NcuProfile};
use super::Status;
use crate::error::GateError;
use memra_receipts::schema::{Backend, Receipt};
use std::path::Path;

/// The card the targets are set for (a substring of the receipt's device).
pub const CARD: &str = "H200";
pub const LAYER_GATED_US: f64 = 100.0;
pub const EXPERTS_OVER_FLOOR: f64 = 1.35;
pub const BF16_GEMV_OVER_FLOOR: f64 = 1.3;
pub const GATE_OVERHEAD: f64 = 0.05;
pub const ROW_KERNEL_US: f64 = 3.0;
/// The single-row reduction kernels by name stem (every kernel of the profile whose name starts
/// with one is a row; a stem no kernel matches is NOT MEASURED).
pub const ROW_KERNELS: [&str; 5] = ["rmsnorm_", "add_rmsnorm_", "router_topk_", "argmax_", "fold_combine_"];
/// The BF16 GEMV seams with a floor in the receipt.
const BF16_SEAMS: [&str; 2] = ["qkv", "o_proj"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    NotMet,
    NotMeasured,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Met => "MET",
            Verdict::NotMet => "NOT MET",
            Verdict::NotMeasured => "NOT MEASURED",
        }
    }
}

/// One judged figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub target: String,
    /// The figure as printed (`119.5 µs`, `1.36×`), or why there is none.
    pub value: String,
    pub limit: String,
    pub verdict: Verdict,
}

/// A figure printed with `fmt` at its unit's decimals, or more where that would print a value
/// other than the limit as the limit (1.3503 against ≤ 1.35 is NOT MET and reads `1.3503×`).
fn judged(target: String, value: Option<f64>, limit: f64, fmt: fn(f64, usize) -> String, missing: &str) -> Row {
    let (value, verdict) = match value {
        Some(v) if v.is_finite() => {
            let mut d = 0;
            while d < 6 && v != limit && fmt(v, d) == fmt(limit, d) {
                d += 1;
            }
            (fmt(v, d), if v <= limit { Verdict::Met } else { Verdict::NotMet })
        }
        _ => (missing.to_string(), Verdict::NotMeasured),
    };
    Row { target, value, limit: format!("≤ {}", fmt(limit, 0)), verdict }
}

/// µs at 1 + `more` decimals.
fn us(v: f64, more: usize) -> String {
    format!("{v:.*} µs", 1 + more)
}
/// A ratio at 2 + `more` decimals.
fn times(v: f64, more: usize) -> String {
    format!("{v:.*}×", 2 + more)
}
/// A fraction as a percentage at 1 + `more` decimals.
fn percent(v: f64, more: usize) -> String {
    format!("{:.*} %", 1 + more, v * 100.0)
}

/// Refuse a receipt the targets are not about, naming the field, its value and the rule.
fn check_shape(path: &Path, r: &Receipt) -> Result<(), GateError> {
    let c = &r.evidence.config;
    let graph = c.doors.get(GRAPH_DOOR).copied().unwrap_or(false);
    let wrong: Option<(&str, String, &str)> = if c.backend != Backend::Cuda {
        Some(("backend", c.backend.as_str().into(), "cuda"))
    } else if c.model.preset != "step" {
        Some(("preset", c.model.preset.clone(), "step"))
    } else if c.tp != 1 {
        Some(("tp", c.tp.to_string(), "1"))
    } else if c.lanes() != 1 {
        Some(("lanes per pass", c.lanes().to_string(), "1 (no --batch or --columns)"))
    } else if !graph {
        Some(("graph", "off".into(), "on (--graph)"))
    } else {
        None
    };
    match wrong {
        Some((field, value, rule)) => Err(GateError::usage(format!(
            "--targets {}: {field} is {value}; issue 27's targets are for {rule}",
            path.display()
        ))),
        None => Ok(()),
    }
}

/// Every row of the table, in the order printed.
pub fn judge(r: &Receipt, profile: Option<&NcuProfile>) -> Vec<Row> {
    let ratios = r.evidence.performance.as_ref().map(|p| &p.ratios);
    let ratio = |k: &str| ratios.and_then(|m| m.get(k)).copied();
    let mut rows = Vec::new();
    let device = cuda_card(r);
    rows.push(Row {
        target: "card".into(),
        value: device.unwrap_or("not named").into(),
        limit: format!("an {CARD}"),
        verdict: match device {
            Some(d) if d.contains(CARD) => Verdict::Met,
            Some(_) => Verdict::NotMet,
            None => Verdict::NotMeasured,
        },
    });
    let mut layers: Vec<usize> =
        r.measurements.latency.iter().filter(|e| e.seam == "experts").map(|e| e.layer).collect();
    layers.sort_unstable();
    layers.dedup();
    if layers.is_empty() {
        // No layer timed: the per-layer targets would pass by their absence.
        rows.push(Row {
            target: "layers".into(),
            value: "no experts seam in the receipt's latencies".into(),
            limit: "at least one layer".into(),
            verdict: Verdict::NotMeasured,
        });
    }
    for l in layers {
        let k = |name: &str| format!("L{l}.{name}");
        let miss = |name: &str| format!("no {} in the receipt", k(name));
        rows.push(judged(
            format!("L{l} gated layer"),
            ratio(&k("layer_gated_us")),
            LAYER_GATED_US,
            us,
            &miss("layer_gated_us"),
        ));
        rows.push(judged(
            format!("L{l} experts / floor"),
            ratio(&k("experts_over_floor")),
            EXPERTS_OVER_FLOOR,
            times,
            &miss("experts_over_floor"),
        ));
        for seam in BF16_SEAMS {
            let key = format!("{seam}_over_floor");
            rows.push(judged(
                format!("L{l} {seam} / floor"),
                ratio(&k(&key)),
                BF16_GEMV_OVER_FLOOR,
                times,
                &miss(&key),
            ));
        }
    }
    rows.push(judged("gate overhead".into(), ratio("gate_overhead"), GATE_OVERHEAD, percent, "no gate_overhead"));
    match profile {
        None => rows.push(Row {
            target: "single-row kernels (ncu)".into(),
            value: "no --ncu profile".into(),
            limit: format!("≤ {}", us(ROW_KERNEL_US, 0)),
            verdict: Verdict::NotMeasured,
        }),
        Some(p) => {
            for stem in ROW_KERNELS {
                let found: Vec<_> = p.kernels.iter().filter(|k| k.name.starts_with(stem)).collect();
                if found.is_empty() {
                    let target = format!("{}* (ncu)", stem);
                    rows.push(judged(target, None, ROW_KERNEL_US, us, "not in the profile"));
                }
                for k in found {
                    rows.push(judged(format!("{} (ncu)", k.name), Some(k.mean_ns / 1e3), ROW_KERNEL_US, us, ""));
                }
            }
        }
    }
    rows
}

/// The printed table, the anchor and profile lines, and the verdict.
pub fn lines(r: &Receipt, rows: &[Row], profile: Option<&NcuProfile>) -> Vec<String> {
    let mut out = vec![format!("issue 27's targets, receipt {} ({}):", r.run_id, cuda_card(r).unwrap_or("no card"))];
    let width = |f: fn(&Row) -> &str, title: &str| {
        rows.iter().map(|r| f(r).chars().count()).chain([title.chars().count()]).max().unwrap_or(0)
    };
    let (wt, wv, wl) = (width(|r| &r.target, "target"), width(|r| &r.value, "measured"), width(|r| &r.limit, "limit"));
    out.push(format!("  {:<wt$}  {:<wv$}  {:<wl$}  verdict", "target", "measured", "limit"));
    for row in rows {
        out.push(format!("  {:<wt$}  {:<wv$}  {:<wl$}  {}", row.target, row.value, row.limit, row.verdict.as_str()));
    }
    if let Some((form, v)) = super::bench_torch::fastest_form(&r.measurements.extra) {
        out.push(format!("  anchor (not a target): PyTorch's fastest form {form}, {v:.1} µs per layer, same call"));
    }
    if let Some(p) = profile {
        out.push(match &p.device {
            Some(d) => format!("  ncu per launch (mean over the profile's launches; profiled on {d}):"),
            None => "  ncu per launch (mean over the profile's launches; the file names no card: same card by the caller's word):"
                .into(),
        });
        for k in &p.kernels {
            out.push(format!("    {:<32} {:>4} launches  {:>8.1} µs", k.name, k.launches, k.mean_ns / 1e3));
        }
    }
    let count = |v: Verdict| rows.iter().filter(|r| r.verdict == v).count();
    out.push(format!(
        "verdict: {} of {} MET, {} NOT MET, {} NOT MEASURED",
        count(Verdict::Met),
        rows.len(),
        count(Verdict::NotMet),
        count(Verdict::NotMeasured)
    ));
    out
}

/// `bench --targets RECEIPT [--ncu PROFILE]`.
pub fn report(receipt_path: &Path, ncu: Option<&Path>) -> Result<Status, GateError> {
    let r = super::bench_compare::read("--targets", receipt_path)?;
    check_shape(receipt_path, &r)?;
    let profile = match ncu {
        None => None,
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| GateError::usage(format!("--ncu {}: cannot read it: {e}", p.display())))?;
            let profile =
                ncu_profile::parse(&text).map_err(|e| GateError::usage(format!("--ncu {}: {e}", p.display())))?;
            if let (Some(pd), Some(rd)) = (&profile.device, cuda_card(&r)) {
                if !rd.starts_with(pd.as_str()) {
                    return Err(GateError::usage(format!(
                        "--ncu {}: profiled on {pd}, the receipt ran on {rd}; the table judges one card",
                        p.display()
                    )));
                }
            }
            Some(profile)
        }
    };
    let rows = judge(&r, profile.as_ref());
    for line in lines(&r, &rows, profile.as_ref()) {
        crate::say!("{line}");
    }
    Ok(if rows.iter().all(|r| r.verdict == Verdict::Met) { Status::Passed } else { Status::Failed })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/gpu/2026-12-07-remeasure-h100/");

    /// Today's main on an H100: its b1 receipt and ncu profile (the same call).
    fn h100() -> (Receipt, NcuProfile) {
        let r = memra_receipts::json::read_receipt(Path::new(&format!("{DIR}logs/b1-receipt.json"))).unwrap();
        let text = std::fs::read_to_string(format!("{DIR}ncu-b1-flushed.csv")).unwrap();
        (r, ncu_profile::parse(&text).unwrap())
    }

    fn row<'a>(rows: &'a [Row], target: &str) -> &'a Row {
        rows.iter().find(|r| r.target == target).unwrap_or_else(|| panic!("no row {target}: {rows:#?}"))
    }

    fn set(r: &mut Receipt, key: &str, v: f64) {
        r.evidence.performance.as_mut().unwrap().ratios.insert(key.into(), v);
    }

    #[test]
    fn the_h100_receipt_is_judged_row_by_row_and_its_card_is_not_the_targets() {
        let (r, p) = h100();
        let rows = judge(&r, Some(&p));
        assert_eq!(row(&rows, "card").verdict, Verdict::NotMet);
        // Written before the receipt kept the layer's median: not measured, never met.
        let g = row(&rows, "L0 gated layer");
        assert_eq!((g.verdict, g.value.as_str()), (Verdict::NotMeasured, "no L0.layer_gated_us in the receipt"));
        let ratios = &r.evidence.performance.as_ref().unwrap().ratios;
        for (target, key, limit) in [
            ("L0 experts / floor", "L0.experts_over_floor", EXPERTS_OVER_FLOOR),
            ("L1 qkv / floor", "L1.qkv_over_floor", BF16_GEMV_OVER_FLOOR),
        ] {
            let want = if ratios[key] <= limit { Verdict::Met } else { Verdict::NotMet };
            assert_eq!(row(&rows, target).verdict, want, "{key} = {}", ratios[key]);
        }
        assert_eq!(row(&rows, "L0 o_proj / floor").verdict, Verdict::NotMeasured);
        assert_eq!(row(&rows, "gate overhead").verdict, Verdict::Met, "{}", ratios["gate_overhead"]);
        // Every single-row kernel the profile holds is a row, judged by its own mean.
        for k in p.kernels.iter().filter(|k| ROW_KERNELS.iter().any(|s| k.name.starts_with(s))) {
            let want = if k.mean_ns <= ROW_KERNEL_US * 1e3 { Verdict::Met } else { Verdict::NotMet };
            assert_eq!(row(&rows, &format!("{} (ncu)", k.name)).verdict, want);
        }
        assert!(rows.iter().any(|r| r.target == "fold_combine_residual_f32 (ncu)"));
        // The rmsnorm_ stem takes rmsnorm_f32 alone, not add_rmsnorm_f32 a second time.
        assert_eq!(rows.iter().filter(|r| r.target == "add_rmsnorm_f32 (ncu)").count(), 1);
        let text = lines(&r, &rows, Some(&p));
        assert!(text.last().unwrap().starts_with("verdict: "), "{text:#?}");
        assert!(text.iter().any(|l| l.contains("grouped_mm.graph")), "the anchor is named: {text:#?}");
    }

    #[test]
    fn each_limit_is_inclusive_and_one_step_past_it_fails() {
        let (mut r, p) = h100();
        r.measurements.device = r.measurements.device.map(|d| d.replace("H100 80GB HBM3", "H200"));
        for (key, limit, target) in [
            ("L0.layer_gated_us", LAYER_GATED_US, "L0 gated layer"),
            ("L0.experts_over_floor", EXPERTS_OVER_FLOOR, "L0 experts / floor"),
            ("L1.o_proj_over_floor", BF16_GEMV_OVER_FLOOR, "L1 o_proj / floor"),
            ("gate_overhead", GATE_OVERHEAD, "gate overhead"),
        ] {
            set(&mut r, key, limit);
            assert_eq!(row(&judge(&r, Some(&p)), target).verdict, Verdict::Met, "{key} at its limit");
            set(&mut r, key, limit * 1.001);
            assert_eq!(row(&judge(&r, Some(&p)), target).verdict, Verdict::NotMet, "{key} past its limit");
            set(&mut r, key, f64::NAN);
            assert_eq!(row(&judge(&r, Some(&p)), target).verdict, Verdict::NotMeasured, "{key} NaN");
        }
        assert_eq!(row(&judge(&r, Some(&p)), "card").verdict, Verdict::Met);
    }

    #[test]
    fn every_target_met_is_the_only_pass_and_a_missing_profile_or_kernel_is_not_measured() {
        let (mut r, mut p) = h100();
        r.measurements.device = r.measurements.device.map(|d| d.replace("H100 80GB HBM3", "H200"));
        for l in 0..2 {
            for (k, v) in [("layer_gated_us", 99.0), ("experts_over_floor", 1.3), ("qkv_over_floor", 1.2)] {
                set(&mut r, &format!("L{l}.{k}"), v);
            }
            set(&mut r, &format!("L{l}.o_proj_over_floor"), 1.2);
        }
        for k in &mut p.kernels {
            k.mean_ns = k.mean_ns.min(2900.0);
        }
        let rows = judge(&r, Some(&p));
        assert!(rows.iter().all(|r| r.verdict == Verdict::Met), "{rows:#?}");
        // The defect planted: no profile, or a row kernel gone from it.
        let none = judge(&r, None);
        assert_eq!(row(&none, "single-row kernels (ncu)").verdict, Verdict::NotMeasured);
        let mut untimed = r.clone();
        untimed.measurements.latency.clear();
        assert_eq!(row(&judge(&untimed, Some(&p)), "layers").verdict, Verdict::NotMeasured);
        p.kernels.retain(|k| !k.name.starts_with("argmax_"));
        assert_eq!(row(&judge(&r, Some(&p)), "argmax_* (ncu)").verdict, Verdict::NotMeasured);
    }

    #[test]
    fn a_figure_just_past_its_limit_never_prints_as_the_limit() {
        let r = judged("x".into(), Some(1.35028), 1.35, times, "");
        assert_eq!((r.value.as_str(), r.limit.as_str(), r.verdict), ("1.3503×", "≤ 1.35×", Verdict::NotMet));
        let r = judged("x".into(), Some(1.363), 1.35, times, "");
        assert_eq!((r.value.as_str(), r.verdict), ("1.36×", Verdict::NotMet));
        let r = judged("x".into(), Some(1.35), 1.35, times, "");
        assert_eq!((r.value.as_str(), r.verdict), ("1.35×", Verdict::Met));
        let r = judged("x".into(), Some(100.04), 100.0, us, "");
        assert_eq!((r.value.as_str(), r.verdict), ("100.04 µs", Verdict::NotMet));
    }

    #[test]
    fn a_receipt_of_another_shape_is_refused_by_field() {
        let (r, _) = h100();
        let path = Path::new("x.json");
        assert!(check_shape(path, &r).is_ok());
        let mut b8 = r.clone();
        b8.evidence.config.batch = Some(8);
        let e = check_shape(path, &b8).unwrap_err().to_string();
        assert!(e.contains("lanes per pass is 8"), "{e}");
        let mut eager = r.clone();
        eager.evidence.config.doors.insert(GRAPH_DOOR.into(), false);
        assert!(check_shape(path, &eager).unwrap_err().to_string().contains("graph is off"));
        let mut tp2 = r;
        tp2.evidence.config.tp = 2;
        assert!(check_shape(path, &tp2).unwrap_err().to_string().contains("tp is 2"));
    }
}
