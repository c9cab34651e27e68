//! `bench`'s PyTorch anchor (docs/PERFORMANCE.md, METRICS.md "bench"): the anchor script is asked
//! for the pass the program timed — `--columns T` for a verify pass, `--batch B` for rows, and
//! `--distinct D`, the program's median distinct routed experts per pass — and the anchor is its
//! fastest form of all, eager or graph: a stand-in script (python3, no PyTorch)
//! records the arguments it got and reports an eager FP8 form faster than every graph form; the
//! receipt's ratio against the fastest form is then the graph ratio times graph ÷ fastest, and the
//! terminal names the fastest form and a form that could not be captured, with its reason.

use crate::util::*;
use std::path::Path;

/// The stand-in's medians (µs per pass): its eager form is the faster.
const GRAPH_US: f64 = 400.0;
const FASTEST_US: f64 = 100.0;

/// A stand-in anchor at `dir/anchor.py`: writes its arguments to `anchor.py.argv`, prints the JSON
/// shape `scripts/bench/torch_layer.py` prints.
fn stand_in(dir: &Path) -> std::path::PathBuf {
    let script = dir.join("anchor.py");
    let code = format!(
        r#"import json, sys
open(sys.argv[0] + ".argv", "w").write(json.dumps(sys.argv[1:]))
arg = lambda name: int(sys.argv[sys.argv.index(name) + 1])
print(json.dumps({{
    "torch": "stand-in", "device": "no device", "expert_dtype": "bf16; E4M3 in the *_fp8 forms",
    "batch": arg("--batch"), "columns": arg("--columns"),
    "forms": {{"index_einsum.graph": {{"median_us": {GRAPH_US}}}, "host_loop_fp8.eager": {{"median_us": {FASTEST_US}}}}},
    "not_timed": {{"slots_fp8.graph": "capture failed: stand-in"}},
    "fastest": {{"form": "host_loop_fp8.eager", "median_us": {FASTEST_US}}},
    "layer_eager": {{"median_us": {FASTEST_US}}}, "layer_eager_form": "host_loop_fp8.eager",
    "layer_graph": {{"median_us": {GRAPH_US}}}, "layer_graph_form": "index_einsum.graph",
    "max_rel_diff": {{}},
}}))
"#
    );
    std::fs::write(&script, code).unwrap();
    script
}

#[test]
fn the_anchor_gets_the_pass_shape_and_its_fastest_form_of_all_is_the_anchor() {
    for (flag, value, want_batch, want_columns) in [("--columns", "2", "1", "2"), ("--batch", "2", "2", "1")] {
        let dir = tempdir();
        let script = stand_in(dir.path());
        let out_dir = dir.path().join("out");
        let args = [
            "bench",
            "--backend",
            "host",
            "--allow-host",
            "--preset",
            "tiny",
            "--steps",
            "4",
            flag,
            value,
            "--torch-script",
            s(&script),
            "--out",
            s(&out_dir),
        ];
        let out = run(&args);
        out.expect_code(0).expect_stdout(&[
            "PyTorch's fastest form of all (host_loop_fp8.eager, the anchor)",
            "slots_fp8.graph",
            "not timed: capture failed: stand-in",
        ]);
        let argv: Vec<String> =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("anchor.py.argv")).unwrap()).unwrap();
        let at = |name: &str| argv.iter().position(|a| a == name).map(|i| argv[i + 1].as_str());
        assert_eq!(
            (at("--batch"), at("--columns")),
            (Some(want_batch), Some(want_columns)),
            "{flag} {value}: the anchor was asked {argv:?}"
        );

        let receipts = read_receipts(&out_dir);
        assert_eq!(receipts.len(), 1, "{flag} {value}: {receipts:?}");
        let ratios = &receipts[0].1.evidence.performance.as_ref().expect("a performance receipt").ratios;
        // The anchor reads as many distinct experts per pass as the program's layer 0 did.
        let distinct = ratios["L0.distinct_experts"];
        assert_eq!(
            at("--distinct").map(|d| d.parse::<f64>().unwrap()),
            Some(distinct),
            "{flag} {value}: the anchor was asked {argv:?}"
        );
        for l in 0..2 {
            let (graph, fastest) = (
                ratios[&format!("L{l}.layer_gated_over_pytorch_graph")],
                ratios[&format!("L{l}.layer_gated_over_pytorch_fastest")],
            );
            assert!(graph > 0.0, "{flag} {value}: layer {l} graph ratio {graph}");
            let want = graph * GRAPH_US / FASTEST_US;
            assert!((fastest - want).abs() <= 1e-9 * want, "{flag} {value}: layer {l}: {fastest} against {want}");
        }
    }
}
