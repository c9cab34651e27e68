//! `memra-gates bench --targets RECEIPT.json [--ncu PROFILE.csv]` (METRICS.md, "bench", "--targets"):
//! issue 27's targets judged from a real b1 receipt and its ncu profile, nothing run. The H100
//! receipt of docs/gpu/2026-12-07-remeasure-h100/ is judged row by row and fails (exit 1: its card
//! is not the targets'); the same receipt edited to meet every target on an H200 passes (exit 0),
//! and one figure edited past its limit fails again; a receipt of another shape, a file that is
//! not a profile and a profile of another card are refused by name (exit 2).

use serde_json::Value;

use crate::util::*;

const RECEIPT: &str = "docs/gpu/2026-12-07-remeasure-h100/logs/b1-receipt.json";
const PROFILE: &str = "docs/gpu/2026-12-07-remeasure-h100/ncu-b1-flushed.csv";

/// The receipt with `edit` applied, written into `dir`.
fn edited(dir: &std::path::Path, name: &str, edit: impl Fn(&mut Value)) -> std::path::PathBuf {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(repo(RECEIPT)).unwrap()).unwrap();
    edit(&mut v);
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    p
}

/// Every figure at or inside its target, on an H200 (the ratios the receipt holds set, and the
/// two the bench of that day did not write yet).
fn meets_all(v: &mut Value) {
    let d = v["measurements"]["device"].as_str().unwrap().replace("H100 80GB HBM3", "H200");
    v["measurements"]["device"] = Value::from(d);
    let ratios = v["evidence"]["performance"]["ratios"].as_object_mut().unwrap();
    for l in 0..2 {
        for (k, x) in [("layer_gated_us", 99.5), ("experts_over_floor", 1.34), ("qkv_over_floor", 1.29)] {
            ratios.insert(format!("L{l}.{k}"), Value::from(x));
        }
        ratios.insert(format!("L{l}.o_proj_over_floor"), Value::from(1.25));
    }
}

#[test]
fn the_h100_receipt_fails_the_targets_and_an_edited_one_meets_them() {
    let out = run(&["bench", "--targets", s(&repo(RECEIPT)), "--ncu", s(&repo(PROFILE))]);
    out.expect_code(1).expect_stdout(&[
        "card",
        "NOT MET",
        "L0 experts / floor",
        "no L0.layer_gated_us in the receipt",
        "rmsnorm_f32 (ncu)",
        "profiled on NVIDIA H100 80GB HBM3",
        "verdict: ",
    ]);
    // Without a profile the single-row kernels are not measured, never met.
    let dir = tempdir();
    let good = edited(dir.path(), "good.json", meets_all);
    run(&["bench", "--targets", s(&good)]).expect_code(1).expect_stdout(&["no --ncu profile", "NOT MEASURED"]);
    // With every figure inside its target and a profile whose row kernels are under 3 µs.
    let text = std::fs::read_to_string(repo(PROFILE)).unwrap().replace("H100 80GB HBM3", "H200");
    let fast: String = text
        .lines()
        .map(|l| {
            let row = ["rmsnorm_", "add_rmsnorm_", "router_topk_", "argmax_", "fold_combine_"]
                .iter()
                .any(|k| l.contains(&format!("\"{k}")));
            if row && l.contains("gpu__time_duration.sum") {
                let (head, _) = l.rsplit_once(",\"").unwrap();
                format!("{head},\"2,900\"")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let profile = dir.path().join("fast.csv");
    std::fs::write(&profile, fast).unwrap();
    let out = run(&["bench", "--targets", s(&good), "--ncu", s(&profile)]);
    out.expect_code(0).expect_stdout(&[", 0 NOT MET, 0 NOT MEASURED"]);
    // The defect planted: one figure just past its limit.
    let late = edited(dir.path(), "late.json", |v| {
        meets_all(v);
        v["evidence"]["performance"]["ratios"]["L1.layer_gated_us"] = Value::from(100.1);
    });
    run(&["bench", "--targets", s(&late), "--ncu", s(&profile)])
        .expect_code(1)
        .expect_stdout(&[", 1 NOT MET, 0 NOT MEASURED"]);
}

#[test]
fn another_shape_a_non_profile_and_another_card_are_refused_by_name() {
    let dir = tempdir();
    // A b8 receipt: the shape is part of the run's identity, so its run id follows.
    let mut r = memra_receipts::json::read_receipt(&repo(RECEIPT)).unwrap();
    r.evidence.config.batch = Some(8);
    r.run_id = memra_receipts::run_id(&r.evidence.config);
    let b8 = dir.path().join("b8.json");
    std::fs::write(&b8, serde_json::to_string_pretty(&r).unwrap()).unwrap();
    run(&["bench", "--targets", s(&b8)])
        .expect_code(2)
        .expect_stderr(&["lanes per pass is 8", "issue 27's targets are for 1"]);
    run(&["bench", "--targets", s(&repo(RECEIPT)), "--ncu", s(&repo("README.md"))])
        .expect_code(2)
        .expect_stderr(&["README.md", "not an `ncu --csv` profile"]);
    let h200 = edited(dir.path(), "h200.json", meets_all);
    run(&["bench", "--targets", s(&h200), "--ncu", s(&repo(PROFILE))])
        .expect_code(2)
        .expect_stderr(&["profiled on NVIDIA H100 80GB HBM3", "the table judges one card"]);
    run(&["bench", "--ncu", s(&repo(PROFILE))]).expect_code(2).expect_stderr(&["--targets"]);
}
