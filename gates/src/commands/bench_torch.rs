//! The PyTorch anchor of `bench` (`scripts/bench/torch_layer.py`, METRICS.md, "bench"): the same layer
//! in every honest PyTorch form, run in the same session; what the receipt and the table keep of it.

use crate::args::BenchArgs;
use memra_runtime::model::Model;
use std::collections::BTreeMap;

/// The PyTorch anchor's JSON, or the reason it could not run: the same pass as the program's,
/// timed per pass — `pass.batch` sessions of one token each (each its own cache), or
/// `pass.columns` consecutive tokens of one session (causal within the pass) — reading `distinct`
/// routed experts per pass when given (the program's measured median: the anchor's forms that read
/// each distinct expert once then read what the program read).
pub fn run_torch(
    args: &BenchArgs,
    model: &Model,
    positions: usize,
    pass: memra_runtime::PassShape,
    distinct: Option<usize>,
) -> Result<serde_json::Value, String> {
    let c = &model.config;
    let mut cmd = std::process::Command::new(&args.python);
    cmd.arg(&args.torch_script);
    if let Some(d) = distinct {
        cmd.args(["--distinct", &d.to_string()]);
    }
    let out = cmd
        .args(["--batch", &pass.batch.to_string(), "--columns", &pass.columns.to_string()])
        .args(["--hidden", &c.hidden.to_string(), "--q-heads", &c.q_heads.to_string()])
        .args(["--kv-heads", &c.kv_heads.to_string(), "--head-dim", &c.head_dim.to_string()])
        .args(["--experts", &c.experts.to_string(), "--top-k", &c.top_k.to_string()])
        .args(["--width", &c.expert_width.to_string(), "--ctx", &positions.to_string()])
        .output()
        .map_err(|e| format!("{} {}: {e}", args.python, args.torch_script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the PyTorch anchor failed: {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("the PyTorch anchor printed no JSON: {e}"))
}

/// What the receipt records of the PyTorch anchor (METRICS.md, "bench"): the halves and the fastest
/// eager and graph layers (`pytorch_<key>_median_us`), every form the script timed
/// (`pytorch_form.<form>.<eager|graph>_median_us`) and the fastest of all, named in its key
/// (`pytorch_fastest.<form>.<mode>_median_us`).
pub fn torch_extra(t: &serde_json::Value) -> BTreeMap<String, f64> {
    let mut extra = BTreeMap::new();
    for key in ["layer_eager", "layer_graph", "attention_eager", "attention_graph", "moe_eager"] {
        if let Some(us) = t[key]["median_us"].as_f64() {
            extra.insert(format!("pytorch_{key}_median_us"), us);
        }
    }
    if let Some(forms) = t["forms"].as_object() {
        for (form, s) in forms {
            if let Some(us) = s["median_us"].as_f64() {
                extra.insert(format!("pytorch_form.{form}_median_us"), us);
            }
        }
    }
    if let (Some(form), Some(us)) = (t["fastest"]["form"].as_str(), t["fastest"]["median_us"].as_f64()) {
        extra.insert(format!("{FASTEST}{form}{MEDIAN}"), us);
    }
    extra
}

const FASTEST: &str = "pytorch_fastest.";
const MEDIAN: &str = "_median_us";

/// The anchor a receipt recorded (`torch_extra`'s fastest form): its name (`<form>.<mode>`) and
/// median µs, or None for a bench without PyTorch.
pub fn fastest_form(extra: &BTreeMap<String, f64>) -> Option<(&str, f64)> {
    extra.iter().find_map(|(k, v)| Some((k.strip_prefix(FASTEST)?.strip_suffix(MEDIAN)?, *v)))
}

/// The anchor's table: one line per form (fastest marked), the forms not timed and why.
pub fn torch_form_lines(t: &serde_json::Value) -> Vec<String> {
    let fastest = t["fastest"]["form"].as_str().unwrap_or("");
    let mut lines = Vec::new();
    let mut forms: Vec<(&String, f64)> = t["forms"]
        .as_object()
        .map(|m| m.iter().filter_map(|(k, s)| Some((k, s["median_us"].as_f64()?))).collect())
        .unwrap_or_default();
    forms.sort_by(|a, b| a.1.total_cmp(&b.1));
    for (form, us) in forms {
        let mark = if form == fastest { "  ← fastest: the anchor" } else { "" };
        lines.push(format!("  {form:<22} {us:>9.1} µs{mark}"));
    }
    if let Some(m) = t["not_timed"].as_object() {
        for (form, why) in m {
            lines.push(format!("  {form:<22}  not timed: {}", why.as_str().unwrap_or("?")));
        }
    }
    for (key, what) in [
        ("attention_eager", "attention half eager"),
        ("attention_graph", "attention half graphed"),
        ("moe_eager", "MoE half eager"),
    ] {
        if let Some(us) = t[key]["median_us"].as_f64() {
            lines.push(format!("  ({what}: {us:.1} µs)"));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::{fastest_form, torch_extra, torch_form_lines};
    use std::collections::BTreeMap;

    /// The shape `scripts/bench/torch_layer.py` prints (its docstring), with made-up numbers.
    fn anchor() -> serde_json::Value {
        serde_json::json!({
            "torch": "2.11.0", "device": "NVIDIA H200", "expert_dtype": "bf16",
            "forms": {
                "index_einsum.eager": {"median_us": 900.0, "min_us": 890.0, "p90_us": 950.0, "n": 50},
                "index_einsum.graph": {"median_us": 395.0, "min_us": 390.0, "p90_us": 400.0, "n": 50},
                "gather_bmm.graph": {"median_us": 786.0, "min_us": 780.0, "p90_us": 790.0, "n": 50},
                "host_loop.eager": {"median_us": 1200.0, "min_us": 1190.0, "p90_us": 1250.0, "n": 50}
            },
            "not_timed": {"host_loop.graph": "reads the route ids on the host: a CUDA graph cannot capture it"},
            "fastest": {"form": "index_einsum.graph", "median_us": 395.0},
            "layer_eager": {"median_us": 900.0}, "layer_eager_form": "index_einsum.eager",
            "layer_graph": {"median_us": 395.0}, "layer_graph_form": "index_einsum.graph",
            "attention_eager": {"median_us": 300.0}, "moe_eager": {"median_us": 600.0},
            "max_rel_diff": {"index_einsum": 0.0, "gather_bmm": 0.001, "host_loop": 0.001}
        })
    }

    #[test]
    fn the_receipt_records_every_form_and_names_the_fastest() {
        let e = torch_extra(&anchor());
        for form in ["index_einsum.eager", "index_einsum.graph", "gather_bmm.graph", "host_loop.eager"] {
            assert!(e.contains_key(&format!("pytorch_form.{form}_median_us")), "{form}: {e:?}");
        }
        assert_eq!(e["pytorch_fastest.index_einsum.graph_median_us"], 395.0);
        assert_eq!(e["pytorch_layer_graph_median_us"], 395.0);
        assert_eq!(e.keys().filter(|k| k.starts_with("pytorch_fastest.")).count(), 1);
        assert_eq!(fastest_form(&e), Some(("index_einsum.graph", 395.0)));
        assert_eq!(fastest_form(&BTreeMap::new()), None);
        let lines = torch_form_lines(&anchor());
        assert!(lines[0].contains("index_einsum.graph") && lines[0].contains("fastest"), "{lines:?}");
        assert_eq!(lines.iter().filter(|l| l.contains("fastest")).count(), 1, "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("host_loop.graph") && l.contains("not timed")), "{lines:?}");
        // An anchor of the old shape (no forms) still records what it has.
        let old = serde_json::json!({"layer_eager": {"median_us": 1.0}});
        assert_eq!(torch_extra(&old).len(), 1);
    }
}
