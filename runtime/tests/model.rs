//! The model: presets and the canonical-grid rules, deterministic generation, the safetensors
//! format (round trip and every rejection rule), and matrix sharding.
//!
//! Bad-input tests start from a valid file, change one thing with the safetensors crate itself,
//! and check that loading names the tensor (or metadata key) and the rule.

use memra_kernels::formats::{bf16_to_f32, e4m3_block_dequant, Nvfp4Matrix};
use memra_kernels::twins::gemv::{canonical_kblocks, gemv_partials, gemv_rows, WeightFormat, WeightRef};
use memra_runtime::model::format::{self, from_bytes, load, save, to_bytes};
use memra_runtime::model::gen::generate;
use memra_runtime::model::matrix::{MatrixShard, ShardData};
use memra_runtime::model::{Matrix, Model, ModelConfig};
use memra_runtime::RuntimeError;
use proptest::prelude::*;
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

// ---------------------------------------------------------------------------------------------
// Fixtures

/// The tiny preset (2 layers), seed 7, generated once per test process.
fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap())
}

/// The smallest configuration on the canonical grid with 2×2 scale blocks per 256×256 expert
/// matrix: cheap enough to corrupt in many ways.
fn micro_config() -> ModelConfig {
    ModelConfig {
        preset: "micro".into(),
        hidden: 256,
        layers: 1,
        expert_width: 256,
        shared_width: 256,
        vocab: 64,
        // Fully clamped: the file's config JSON has no `unclamped_layers` (as before the field).
        unclamped_layers: Vec::new(),
        ..ModelConfig::preset("tiny", None).unwrap()
    }
}

fn micro_bytes() -> &'static [u8] {
    static MICRO: OnceLock<Vec<u8>> = OnceLock::new();
    MICRO.get_or_init(|| to_bytes(&generate(&micro_config(), 11).unwrap()).unwrap())
}

const ORIGIN: &str = "micro.safetensors";

/// A file's tensors and metadata, editable, re-serialized with the safetensors crate.
struct Raw {
    meta: HashMap<String, String>,
    tensors: Vec<Tensor>,
}

struct Tensor {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Tensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

impl Raw {
    fn parse(bytes: &[u8]) -> Raw {
        let (_, header) = SafeTensors::read_metadata(bytes).unwrap();
        let st = SafeTensors::deserialize(bytes).unwrap();
        let tensors = st
            .tensors()
            .into_iter()
            .map(|(name, v)| Tensor { name, dtype: v.dtype(), shape: v.shape().to_vec(), data: v.data().to_vec() })
            .collect();
        Raw { meta: header.metadata().clone().unwrap_or_default(), tensors }
    }

    fn micro() -> Raw {
        Raw::parse(micro_bytes())
    }

    fn bytes(&self) -> Vec<u8> {
        let meta = if self.meta.is_empty() { None } else { Some(self.meta.clone()) };
        safetensors::serialize(self.tensors.iter().map(|t| (t.name.clone(), t)), meta).unwrap()
    }

    fn get(&mut self, name: &str) -> &mut Tensor {
        self.tensors.iter_mut().find(|t| t.name == name).unwrap_or_else(|| panic!("fixture has no tensor {name}"))
    }

    fn remove(&mut self, name: &str) {
        let before = self.tensors.len();
        self.tensors.retain(|t| t.name != name);
        assert_eq!(self.tensors.len(), before - 1, "fixture has no tensor {name}");
    }

    fn set_f32(&mut self, name: &str, index: usize, value: f32) {
        let t = self.get(name);
        assert_eq!(t.dtype, Dtype::F32);
        t.data[index * 4..index * 4 + 4].copy_from_slice(&value.to_le_bytes());
    }

    fn load(&self) -> Result<Model, RuntimeError> {
        from_bytes(&self.bytes(), Path::new(ORIGIN))
    }
}

/// The (tensor, detail) of a `RuntimeError::Model`, or a failure naming what came instead.
fn model_error(result: Result<Model, RuntimeError>) -> (String, String) {
    match result {
        Err(RuntimeError::Model { tensor, detail }) => (tensor, detail),
        Err(other) => panic!("expected a model tensor error, got: {other}"),
        Ok(_) => panic!("expected a model tensor error, the file loaded"),
    }
}

/// The detail of a `RuntimeError::ModelFile` naming `ORIGIN`.
fn file_error(result: Result<Model, RuntimeError>) -> String {
    match result {
        Err(RuntimeError::ModelFile { path, detail }) => {
            assert_eq!(path, Path::new(ORIGIN), "the error must name the file");
            detail
        }
        Err(other) => panic!("expected a model file error, got: {other}"),
        Ok(_) => panic!("expected a model file error, the file loaded"),
    }
}

fn assert_contains(text: &str, parts: &[&str]) {
    for p in parts {
        assert!(text.contains(p), "message {text:?} does not mention {p:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Presets and the canonical grid

#[test]
fn preset_tiny_has_the_documented_shapes() {
    let c = ModelConfig::preset("tiny", None).unwrap();
    let got = (c.hidden, c.layers, c.q_heads, c.kv_heads, c.head_dim, c.experts, c.top_k, c.expert_width);
    assert_eq!(got, (1024, 2, 8, 8, 128, 8, 2, 1024));
    assert_eq!((c.shared_width, c.vocab, c.max_positions), (1024, 1024, 64));
    assert_eq!(
        (c.eps, c.rope_theta, c.swiglu_limit, c.route_scale, c.route_norm),
        (1e-6, 10000.0, Some(7.0), 2.5, true)
    );
    assert_eq!(c.preset, "tiny");
}

#[test]
fn preset_small_validates_with_documented_shapes() {
    let c = ModelConfig::preset("small", None).unwrap();
    c.validate().unwrap();
    let got = (c.hidden, c.layers, c.q_heads, c.kv_heads, c.experts, c.top_k, c.expert_width, c.vocab);
    assert_eq!(got, (2048, 4, 16, 8, 32, 4, 1024, 8192));
}

#[test]
fn preset_step_needs_a_layer_count() {
    match ModelConfig::preset("step", None) {
        Err(RuntimeError::Preset { name, rule }) => {
            assert_eq!(name, "step");
            assert_contains(&rule, &["step", "layer"])
        }
        other => panic!("step without layers must be a preset error, got {other:?}"),
    }
    let c = ModelConfig::preset("step", Some(3)).unwrap();
    let got = (c.hidden, c.layers, c.q_heads, c.kv_heads, c.experts, c.top_k, c.expert_width, c.shared_width);
    assert_eq!(got, (4096, 3, 32, 8, 288, 8, 1280, 1280));
    assert_eq!((c.vocab, c.max_positions), (32768, 256));
    // 1280 = 10 scale blocks: G = 2 for the down projection (docs/DESIGN.md §3.4).
    assert_eq!(canonical_kblocks(WeightFormat::E4m3, c.expert_width).unwrap(), 2);
}

#[test]
fn preset_layers_override_and_zero_layers_refused() {
    assert_eq!(ModelConfig::preset("tiny", Some(1)).unwrap().layers, 1);
    assert_eq!(ModelConfig::preset("small", Some(7)).unwrap().layers, 7);
    match ModelConfig::preset("tiny", Some(0)) {
        Err(RuntimeError::ModelShape { rule }) => assert_contains(&rule, &["layers 0"]),
        other => panic!("0 layers must be refused, got {other:?}"),
    }
}

#[test]
fn preset_unknown_names_the_value_and_the_list() {
    match ModelConfig::preset("huge", None) {
        Err(RuntimeError::Preset { name, rule }) => {
            assert_eq!(name, "huge");
            assert_contains(&rule, &["huge", "tiny", "small", "step"])
        }
        other => panic!("an unknown preset must be a preset error, got {other:?}"),
    }
}

#[test]
fn validate_refuses_every_rule_of_the_canonical_grid() {
    type Edit = fn(&mut ModelConfig);
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        ("hidden 1000", |c| c.hidden = 1000, &["layers.*.experts.*.gate.weight", "1000", "128-column scale blocks"]),
        ("q_heads 12", |c| c.q_heads = 12, &["layers.*.attn.q.weight", "q_heads 12", "8 canonical chunks"]),
        ("kv_heads 12", |c| c.kv_heads = 12, &["layers.*.attn.k.weight", "kv_heads 12", "8 canonical chunks"]),
        ("kv_heads 0", |c| c.kv_heads = 0, &["kv_heads 0", "8 canonical chunks"]),
        (
            "q_heads 24 / kv_heads 16",
            |c| {
                c.q_heads = 24;
                c.kv_heads = 16
            },
            &["q_heads 24", "kv_heads 16", "multiple"],
        ),
        ("head_dim 64", |c| c.head_dim = 64, &["head_dim 64", "128"]),
        (
            "expert width 1000",
            |c| c.expert_width = 1000,
            &["layers.*.experts.*.down.weight", "1000", "canonical K-blocks of whole 128-column scale blocks"],
        ),
        ("shared width 1000", |c| c.shared_width = 1000, &["layers.*.shared.down.weight", "1000", "scale blocks"]),
        ("experts 12", |c| c.experts = 12, &["layers.*.router.weight", "experts 12", "8 canonical chunks"]),
        ("vocab 1001", |c| c.vocab = 1001, &["lm_head.weight", "vocab 1001", "8 canonical chunks"]),
        ("top_k 0", |c| c.top_k = 0, &["top_k 0", "1..=8"]),
        ("top_k 9", |c| c.top_k = 9, &["top_k 9", "1..=8"]),
        ("eps NaN", |c| c.eps = f32::NAN, &["eps NaN", "finite and > 0"]),
        ("eps 0", |c| c.eps = 0.0, &["eps 0", "finite and > 0"]),
        ("rope_theta inf", |c| c.rope_theta = f32::INFINITY, &["rope_theta inf", "finite"]),
        ("route_scale -1", |c| c.route_scale = -1.0, &["route_scale -1", "> 0"]),
        ("swiglu_limit inf", |c| c.swiglu_limit = Some(f32::INFINITY), &["swiglu_limit inf", "finite"]),
        ("swiglu_limit 0", |c| c.swiglu_limit = Some(0.0), &["swiglu_limit 0", "> 0"]),
        ("max_positions 0", |c| c.max_positions = 0, &["max_positions 0"]),
        ("layers 0", |c| c.layers = 0, &["layers 0"]),
        ("hidden 2^40", |c| c.hidden = 1 << 40, &["hidden", "exceeds the supported maximum"]),
        (
            "unclamped layer 2 of 2",
            |c| c.unclamped_layers = vec![0, 2],
            &["unclamped_layers entry 2", "not a layer", "< layers 2"],
        ),
        (
            "unclamped layers duplicated",
            |c| c.unclamped_layers = vec![1, 1],
            &["unclamped_layers entry 1 follows 1", "a duplicate", "strictly ascending"],
        ),
        (
            "unclamped layers unsorted",
            |c| c.unclamped_layers = vec![1, 0],
            &["unclamped_layers entry 0 follows 1", "out of order", "strictly ascending"],
        ),
    ];
    let mut failures = Vec::new();
    for (what, edit, parts) in cases {
        let mut c = ModelConfig::preset("tiny", None).unwrap();
        edit(&mut c);
        match c.validate() {
            Err(RuntimeError::ModelShape { rule: msg }) => {
                if let Some(p) = parts.iter().find(|p| !msg.contains(**p)) {
                    failures.push(format!("{what}: message {msg:?} does not mention {p:?}"));
                }
            }
            other => failures.push(format!("{what}: expected a model shape error, got {other:?}")),
        }
    }
    assert!(failures.is_empty(), "{} of the cases failed:\n{}", failures.len(), failures.join("\n"));
    // swiglu_limit may be absent.
    let c = ModelConfig { swiglu_limit: None, ..ModelConfig::preset("tiny", None).unwrap() };
    c.validate().unwrap();
    // Every layer may be unclamped, and none.
    for unclamped_layers in [vec![0, 1], vec![]] {
        ModelConfig { unclamped_layers, ..ModelConfig::preset("tiny", None).unwrap() }.validate().unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Generation

#[test]
fn generation_is_deterministic_and_seeded() {
    let config = ModelConfig::preset("tiny", None).unwrap();
    let a = to_bytes(tiny()).unwrap();
    let b = to_bytes(&generate(&config, 7).unwrap()).unwrap();
    assert!(a == b, "the same (config, seed) gave different bytes");
    let other = generate(&config, 8).unwrap();
    let c = to_bytes(&other).unwrap();
    assert_eq!(a.len(), c.len());
    assert!(a != c, "seeds 7 and 8 gave identical bytes");
    // Every tensor changes with the seed, not only some.
    assert_ne!(tiny().embed, other.embed);
    assert_ne!(tiny().layers[1].experts[7].down, other.layers[1].experts[7].down);
    assert_ne!(tiny().layers[1].router_bias, other.layers[1].router_bias);
    assert_ne!(tiny().final_norm, other.final_norm);
}

#[test]
fn generated_tensor_depends_on_its_name_not_on_generation_order() {
    // A one-layer model shares names with the first layer of the two-layer one: same values.
    let one = generate(&ModelConfig::preset("tiny", Some(1)).unwrap(), 7).unwrap();
    let two = tiny();
    assert_eq!(one.embed, two.embed);
    assert_eq!(one.layers[0], two.layers[0]);
    assert_eq!(one.lm_head, two.lm_head);
    // Different names give different values even with identical shapes.
    assert_ne!(two.layers[0].wk, two.layers[0].wv);
    assert_ne!(two.layers[0].experts[0].gate, two.layers[0].experts[0].up);
    assert_ne!(two.layers[0].experts[0], two.layers[1].experts[0]);
    assert_ne!(two.layers[0].attn_norm, two.layers[0].ffn_norm);
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64;
    (mean, var.sqrt())
}

fn values(m: &Matrix) -> Vec<f64> {
    m.dequantize().into_iter().map(f64::from).collect()
}

#[test]
fn generated_distributions_match_the_documentation() {
    let m = tiny();
    let l = &m.layers[0];
    // Bounds of 5 standard errors of the estimates (plus 0.5% for BF16 rounding).
    let check = |what: &str, v: &[f64], std: f64| {
        let (mean, s) = mean_std(v);
        let n = v.len() as f64;
        assert!(mean.abs() < 5.0 * std / n.sqrt(), "{what}: mean {mean} is not ~0 (std {std}, n {n})");
        assert!((s / std - 1.0).abs() < 5.0 / (2.0 * n).sqrt() + 0.005, "{what}: std {s}, documented {std}");
    };
    check("embed", &values(&m.embed), 1.0);
    check("attn.q", &values(&l.wq), 1.0 / 32.0);
    check("attn.o", &values(&l.wo), 1.0 / 32.0);
    check("router", &values(&l.router), 1.0 / 32.0);
    check("lm_head", &values(&m.lm_head), 1.0 / 32.0);
    // E4M3 with per-block scales keeps ~3 significant bits: a looser std band.
    let (mean, s) = mean_std(&values(&l.experts[3].down));
    assert!(mean.abs() < 1e-3 && (s * 32.0 - 1.0).abs() < 0.05, "expert down: mean {mean} std {s}");
    for (what, v) in [("attn_norm", &l.attn_norm), ("q_norm", &l.q_norm), ("final_norm", &m.final_norm)] {
        assert!(v.iter().all(|x| (0.9..=1.1).contains(x)), "{what} outside 1 ± 0.1");
        assert!(v.iter().any(|x| *x != v[0]), "{what} is constant");
    }
    assert!(l.router_bias.iter().all(|x| x.abs() <= 0.01) && l.router_bias.iter().any(|x| *x != 0.0));
    if let Matrix::E4m3 { scales, .. } = &l.experts[0].gate {
        assert_eq!(scales.len(), 64);
        assert!(scales.iter().all(|s| s.is_finite() && *s > 0.0));
    } else {
        panic!("experts must be E4M3");
    }
}

/// Logits of `lm_head · rmsnorm(embed[t])` in f64: a one-line model that already shows whether
/// the weights are degenerate (constant rows, all-equal logits, one token winning everywhere).
#[test]
fn generated_tiny_decodes_non_degenerately() {
    let m = tiny();
    let (emb, head) = (m.embed.dequantize(), m.lm_head.dequantize());
    let h = m.config.hidden;
    let mut argmaxes = Vec::new();
    for t in [0usize, 1, 17, 500, 1023] {
        let x = &emb[t * h..(t + 1) * h];
        let rms = (x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / h as f64).sqrt();
        let logits: Vec<f64> = (0..m.config.vocab)
            .map(|v| (0..h).map(|i| head[v * h + i] as f64 * x[i] as f64 / rms).sum::<f64>())
            .collect();
        let (_, spread) = mean_std(&logits);
        assert!(spread > 0.5, "token {t}: logits nearly constant (std {spread})");
        let best = (0..logits.len()).max_by(|a, b| logits[*a].total_cmp(&logits[*b])).unwrap();
        argmaxes.push(best);
    }
    argmaxes.dedup();
    assert!(argmaxes.len() > 1, "every token decodes to the same next token {argmaxes:?}");
}

#[test]
fn generate_refuses_a_config_off_the_grid() {
    let c = ModelConfig { hidden: 1000, ..micro_config() };
    match generate(&c, 1) {
        Err(RuntimeError::ModelShape { rule }) => assert_contains(&rule, &["1000"]),
        other => panic!("expected a model shape error, got {:?}", other.map(|_| ())),
    }
}

// ---------------------------------------------------------------------------------------------
// The file format: round trip

#[test]
fn save_load_round_trip_equals_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.safetensors");
    save(tiny(), &path).unwrap();
    let loaded = load(&path).unwrap();
    assert!(&loaded == tiny(), "the loaded model differs from the saved one");
    // The file is exactly to_bytes, and no temporary file is left behind.
    assert!(std::fs::read(&path).unwrap() == to_bytes(tiny()).unwrap());
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("tiny.safetensors")]);
}

#[test]
fn save_replaces_an_existing_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    std::fs::write(&path, b"old contents").unwrap();
    let micro = from_bytes(micro_bytes(), Path::new(ORIGIN)).unwrap();
    save(&micro, &path).unwrap();
    assert!(load(&path).unwrap() == micro);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn save_of_an_inconsistent_model_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.safetensors");
    let mut m = from_bytes(micro_bytes(), Path::new(ORIGIN)).unwrap();
    if let Matrix::E4m3 { scales, .. } = &mut m.layers[0].shared.up {
        scales[1] = 0.0;
    }
    let (tensor, detail) = model_error(save(&m, &path).map(|_| unreachable!()));
    assert_eq!(tensor, "layers.0.shared.up.weight_scale");
    assert_contains(&detail, &["[0, 1]", "finite and > 0"]);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a refused save left a file");
}

#[test]
fn load_of_a_missing_file_names_the_path() {
    match load(Path::new("/nonexistent/dir/model.safetensors")) {
        Err(RuntimeError::Io { path, .. }) => assert_eq!(path, Path::new("/nonexistent/dir/model.safetensors")),
        other => panic!("expected an I/O error naming the path, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn header_lists_metadata_then_tensors_in_data_order() {
    let bytes = micro_bytes();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(n % 8, 0, "header length must be padded to 8");
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    assert!(header
        .starts_with(r#"{"__metadata__":{"memra.format":"memra-model","memra.format_version":"1","memra.config":"#));
    // F32 tensors first, then BF16, then F8_E4M3.
    let order: Vec<&str> = ["\"F32\"", "\"BF16\"", "\"F8_E4M3\""].into_iter().collect();
    let last_f32 = header.rfind(order[0]).unwrap();
    let first_bf16 = header.find(order[1]).unwrap();
    let last_bf16 = header.rfind(order[1]).unwrap();
    let first_f8 = header.find(order[2]).unwrap();
    assert!(last_f32 < first_bf16 && last_bf16 < first_f8, "data order is not F32, BF16, F8_E4M3");
    // The tensor count is the documented one: 3 + layers · (11 + 6 · (experts + 1)).
    let c = micro_config();
    assert_eq!(Raw::micro().tensors.len(), 3 + c.layers * (11 + 6 * (c.experts + 1)));
}

#[test]
fn file_written_by_the_safetensors_crate_loads() {
    // Raw::bytes serializes with safetensors::serialize (its own tensor order and header).
    let raw = Raw::micro();
    let crate_bytes = raw.bytes();
    let model = from_bytes(&crate_bytes, Path::new(ORIGIN)).unwrap();
    assert!(model == from_bytes(micro_bytes(), Path::new(ORIGIN)).unwrap());
}

// ---------------------------------------------------------------------------------------------
// The file format: every rejection rule

#[test]
fn truncated_file_is_refused_at_every_cut() {
    let bytes = micro_bytes();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for cut in [0, 1, 7, 8, 9, 8 + n / 2, 8 + n - 1, 8 + n, 8 + n + 1, bytes.len() / 2, bytes.len() - 1] {
        let detail = file_error(from_bytes(&bytes[..cut], Path::new(ORIGIN)));
        assert_contains(&detail, &["not a valid safetensors file", &format!("({cut} bytes)")]);
    }
}

#[test]
fn garbage_is_refused() {
    let mut state = 99u64;
    let noise: Vec<u8> = (0..4096)
        .map(|_| {
            state = memra_kernels::twins::digest::splitmix64(state);
            state as u8
        })
        .collect();
    let mut huge_header = 1_000_000u64.to_le_bytes().to_vec();
    huge_header.extend_from_slice(b"{}");
    let mut bad_json = 8u64.to_le_bytes().to_vec();
    bad_json.extend_from_slice(b"{\"a\":1 ");
    for (what, bytes) in [
        ("noise", noise),
        ("zeros", vec![0u8; 64]),
        ("text", b"this is not a model file at all".to_vec()),
        ("header longer than the file", huge_header),
        ("bad JSON", bad_json),
    ] {
        let detail = file_error(from_bytes(&bytes, Path::new(ORIGIN)));
        assert!(detail.contains("not a valid safetensors file"), "{what}: {detail}");
    }
}

#[test]
fn wrong_dtype_is_refused() {
    let mut raw = Raw::micro();
    let t = raw.get("layers.0.attn.q.weight");
    // The same values widened to F32: a plausible file, but not this format.
    t.data = t.data.chunks_exact(2).flat_map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])).to_le_bytes()).collect();
    t.dtype = Dtype::F32;
    let (tensor, detail) = model_error(raw.load());
    assert_eq!(tensor, "layers.0.attn.q.weight");
    assert_contains(&detail, &["dtype F32", "expected BF16"]);
}

#[test]
fn wrong_shape_is_refused() {
    let mut raw = Raw::micro();
    raw.get("layers.0.attn.o.weight").shape = vec![1024, 256]; // transposed: same bytes
    let (tensor, detail) = model_error(raw.load());
    assert_eq!(tensor, "layers.0.attn.o.weight");
    assert_contains(&detail, &["shape [1024, 256]", "expected [256, 1024]"]);

    let mut raw = Raw::micro();
    let t = raw.get("layers.0.experts.5.up.weight_scale");
    t.shape = vec![4];
    let (tensor, detail) = model_error(raw.load());
    assert_eq!(tensor, "layers.0.experts.5.up.weight_scale");
    assert_contains(&detail, &["shape [4]", "expected [2, 2]"]);
}

#[test]
fn missing_tensor_is_refused() {
    for name in
        ["embed.weight", "layers.0.experts.3.down.weight_scale", "layers.0.shared.gate.weight", "lm_head.weight"]
    {
        let mut raw = Raw::micro();
        raw.remove(name);
        let (tensor, detail) = model_error(raw.load());
        assert_eq!(tensor, name);
        assert_contains(&detail, &["missing"]);
    }
}

#[test]
fn extra_tensor_is_refused() {
    for name in [
        "layers.0.attn.bias",
        "layers.1.attn_norm.weight",
        "layers.0.experts.8.gate.weight",
        "layers.00.ffn_norm.weight",
    ] {
        let mut raw = Raw::micro();
        raw.tensors.push(Tensor { name: name.into(), dtype: Dtype::F32, shape: vec![2], data: vec![0; 8] });
        let (tensor, detail) = model_error(raw.load());
        assert_eq!(tensor, name);
        assert_contains(&detail, &["unexpected tensor"]);
    }
}

#[test]
fn bad_scales_are_refused_with_index_and_value() {
    for (value, shown) in [(f32::NAN, "NaN"), (0.0, "0.0"), (-0.25, "-0.25"), (f32::INFINITY, "inf")] {
        let mut raw = Raw::micro();
        raw.set_f32("layers.0.experts.6.down.weight_scale", 2, value); // scale [1, 0] of 2×2
        let (tensor, detail) = model_error(raw.load());
        assert_eq!(tensor, "layers.0.experts.6.down.weight_scale", "value {value}");
        assert_contains(&detail, &["scale [1, 0]", shown, "finite and > 0"]);
    }
}

#[test]
fn non_finite_f32_values_are_refused() {
    for (name, index) in
        [("layers.0.ffn_norm.weight", 5), ("layers.0.attn.q_norm.weight", 127), ("layers.0.router.bias", 0)]
    {
        let mut raw = Raw::micro();
        raw.set_f32(name, index, f32::NAN);
        let (tensor, detail) = model_error(raw.load());
        assert_eq!(tensor, name);
        assert_contains(&detail, &[&format!("element [{index}] is NaN"), "finite"]);
    }
    let mut raw = Raw::micro();
    raw.set_f32("final_norm.weight", 3, f32::NEG_INFINITY);
    let (tensor, detail) = model_error(raw.load());
    assert_eq!(tensor, "final_norm.weight");
    assert_contains(&detail, &["element [3] is -inf"]);
}

#[test]
fn non_finite_weights_are_refused() {
    let mut raw = Raw::micro();
    let t = raw.get("layers.0.attn.k.weight");
    t.data[2 * 300..2 * 300 + 2].copy_from_slice(&0x7F80u16.to_le_bytes()); // +inf at [1, 44]
    let (tensor, detail) = model_error(raw.load());
    assert_eq!(tensor, "layers.0.attn.k.weight");
    assert_contains(&detail, &["element [1, 44]", "0x7F80", "finite"]);

    let mut raw = Raw::micro();
    raw.get("layers.0.experts.2.gate.weight").data[256 * 3 + 7] = 0xFF; // -NaN at [3, 7]
    let (tensor, detail) = model_error(raw.load());
    assert_eq!(tensor, "layers.0.experts.2.gate.weight");
    assert_contains(&detail, &["element [3, 7]", "0xFF", "NaN"]);
}

#[test]
fn metadata_is_checked_key_by_key() {
    type Edit = fn(&mut HashMap<String, String>);
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        (
            "unknown version",
            |m| {
                m.insert("memra.format_version".into(), "2".into());
            },
            &["memra.format_version", "`2`", "unknown version"],
        ),
        (
            "wrong format",
            |m| {
                m.insert("memra.format".into(), "gguf".into());
            },
            &["memra.format", "`gguf`", "memra-model"],
        ),
        (
            "missing version",
            |m| {
                m.remove("memra.format_version");
            },
            &["memra.format_version", "missing"],
        ),
        (
            "missing config",
            |m| {
                m.remove("memra.config");
            },
            &["memra.config", "missing"],
        ),
        ("no metadata at all", |m| m.clear(), &["memra.format", "missing"]),
        (
            "unknown key",
            |m| {
                m.insert("memra.extra".into(), "1".into());
            },
            &["memra.extra", "unknown"],
        ),
        (
            "config is not JSON",
            |m| {
                m.insert("memra.config".into(), "{hidden:".into());
            },
            &["memra.config", "not a valid model configuration"],
        ),
        (
            "config has an unknown field",
            |m| {
                let c = m["memra.config"].replace("\"hidden\"", "\"bias\":true,\"hidden\"");
                m.insert("memra.config".into(), c);
            },
            &["memra.config", "unknown field", "bias"],
        ),
        (
            "config off the grid",
            |m| {
                let c = m["memra.config"].replace("\"expert_width\":256", "\"expert_width\":1000");
                m.insert("memra.config".into(), c);
            },
            &["memra.config", "layers.*.experts.*.down.weight", "1000", "scale blocks"],
        ),
        (
            "config unclamps a layer it does not have",
            |m| {
                let c = m["memra.config"].replace("\"max_positions\"", "\"unclamped_layers\":[1],\"max_positions\"");
                m.insert("memra.config".into(), c);
            },
            &["memra.config", "unclamped_layers entry 1", "< layers 1"],
        ),
    ];
    for (what, edit, parts) in cases {
        let mut raw = Raw::micro();
        edit(&mut raw.meta);
        let detail = file_error(raw.load());
        for p in parts {
            assert!(detail.contains(p), "{what}: message {detail:?} does not mention {p:?}");
        }
    }
}

#[test]
fn config_claiming_more_layers_than_the_file_holds_names_the_first_missing_tensor() {
    let mut raw = Raw::micro();
    let c = raw.meta["memra.config"].replace("\"layers\":1", "\"layers\":16777216");
    raw.meta.insert("memra.config".into(), c);
    let (tensor, detail) = model_error(raw.load());
    assert_eq!(tensor, "layers.1.attn_norm.weight");
    assert_contains(&detail, &["missing"]);
}

/// How a corruption case edits the file.
#[derive(Debug, Clone, Copy)]
enum Corruption {
    /// XOR random bytes anywhere (mostly tensor data: value rules).
    FlipAnywhere,
    /// XOR random bytes of the header (structure: JSON, offsets, dtypes).
    FlipHeader,
    /// Overwrite header bytes with JSON-ish ASCII, so the header often stays valid JSON with
    /// changed numbers, names or dtypes.
    RewriteHeader,
    /// The same inside the `__metadata__` object: changed keys, versions and configuration
    /// fields (layer counts, widths) that reach the configuration-driven reader.
    RewriteMetadata,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random corruption never panics: whatever the edit, and with or without a truncation, load
    /// returns Ok or Err.
    #[test]
    fn no_corruption_panics(
        mode in prop_oneof![
            Just(Corruption::FlipAnywhere),
            Just(Corruption::FlipHeader),
            Just(Corruption::RewriteHeader),
            Just(Corruption::RewriteMetadata)
        ],
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in proptest::option::weighted(0.2, any::<prop::sample::Index>()),
    ) {
        const ASCII: &[u8] = b"0123456789012345678901234567890123456789,:[]{}\"_.-aeEF8BIU ";
        let mut bytes = micro_bytes().to_vec();
        let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let len = bytes.len();
        let header = std::str::from_utf8(&bytes[8..header_end]).unwrap();
        let metadata_end = 8 + header.find("\"},\"").expect("the metadata object closes before the tensors");
        for (at, value) in &edits {
            match mode {
                Corruption::FlipAnywhere => bytes[at.index(len)] ^= value.max(&1),
                Corruption::FlipHeader => bytes[at.index(header_end)] ^= value.max(&1),
                Corruption::RewriteHeader => {
                    bytes[8 + at.index(header_end - 8)] = ASCII[*value as usize % ASCII.len()]
                }
                Corruption::RewriteMetadata => {
                    bytes[8 + at.index(metadata_end - 8)] = ASCII[*value as usize % ASCII.len()]
                }
            }
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        let _ = from_bytes(&bytes, Path::new(ORIGIN));
    }
}

// ---------------------------------------------------------------------------------------------
// Sharding

/// A BF16 and an E4M3 matrix with every element distinct and every scale distinct.
fn test_matrices(out_features: usize, in_features: usize) -> [Matrix; 2] {
    let n = out_features * in_features;
    let bits = (0..n).map(|i| 0x3C00 + (i % 0x3000) as u16).collect();
    let codes = (0..n).map(|i| ((i * 7 + i / in_features) % 0x7E) as u8).collect();
    let n_scales = out_features.div_ceil(128) * in_features.div_ceil(128);
    let scales = (0..n_scales).map(|i| 1.0 + i as f32 / 8.0).collect();
    [Matrix::Bf16 { out_features, in_features, bits }, Matrix::E4m3 { out_features, in_features, codes, scales }]
}

/// Element (r, c) of a shard as the gemv contract reads it: (code or bits, scale).
fn shard_element(s: &MatrixShard, r: usize, c: usize) -> (u32, f32) {
    match s.view().w {
        WeightRef::Bf16(b) => (b[r * s.in_features + c] as u32, 1.0),
        WeightRef::E4m3 { codes, scales, row0 } => {
            let scale_row = (row0 + r) / 128 - row0 / 128;
            (codes[r * s.in_features + c] as u32, scales[scale_row * s.in_features.div_ceil(128) + c / 128])
        }
        other => panic!("unexpected storage {other:?}"),
    }
}

fn matrix_element(m: &Matrix, r: usize, c: usize) -> (u32, f32) {
    match m {
        Matrix::Bf16 { bits, in_features, .. } => (bits[r * in_features + c] as u32, 1.0),
        Matrix::E4m3 { codes, scales, in_features, .. } => {
            (codes[r * in_features + c] as u32, scales[(r / 128) * in_features.div_ceil(128) + c / 128])
        }
    }
}

/// Every element of `shard` equals the element of `m` at (r + r0, c + c0); reports the first
/// difference.
fn assert_shard_reads(m: &Matrix, shard: &MatrixShard, r0: usize, c0: usize, what: &str) {
    for r in 0..shard.out_features {
        for c in 0..shard.in_features {
            let (got, want) = (shard_element(shard, r, c), matrix_element(m, r + r0, c + c0));
            assert_eq!(got, want, "{what}: local ({r}, {c}) = global ({}, {})", r + r0, c + c0);
        }
    }
}

#[test]
fn row_shards_reconstruct_the_matrix() {
    // 1280 rows in 8 canonical chunks of 160: most chunks start mid scale block.
    for m in test_matrices(1280, 384) {
        for tp in [1, 2, 4, 8] {
            let bounds: Vec<usize> = (0..=tp).map(|r| r * 1280 / tp).collect();
            let mut rebuilt = Vec::new();
            for w in bounds.windows(2) {
                let s = m.shard_rows(w[0]..w[1]);
                assert_eq!(
                    (s.out_features, s.in_features, s.kblock_width),
                    (w[1] - w[0], 384, 384 / m.kblocks().unwrap())
                );
                assert_shard_reads(&m, &s, w[0], 0, &format!("{:?} TP{tp} rows {w:?}", m.format()));
                match s.data {
                    ShardData::Bf16(b) => rebuilt.extend(b.iter().map(|x| *x as u32)),
                    ShardData::E4m3 { codes, row0, .. } => {
                        assert_eq!(row0, w[0]);
                        rebuilt.extend(codes.iter().map(|x| *x as u32));
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            let whole: Vec<u32> = (0..1280 * 384).map(|i| matrix_element(&m, i / 384, i % 384).0).collect();
            assert!(rebuilt == whole, "{:?} TP{tp}: concatenated row shards differ from the matrix", m.format());
        }
    }
}

#[test]
fn col_shards_reconstruct_the_matrix() {
    // in 1280: E4M3 G = 2 (K-blocks of 640 = 5 scale blocks); BF16 G = 8 (K-blocks of 160).
    for m in test_matrices(256, 1280) {
        let g = m.kblocks().unwrap();
        let kw = 1280 / g;
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); 256];
        for k in 0..g {
            let s = m.shard_cols(k * kw..(k + 1) * kw);
            assert_eq!((s.out_features, s.in_features, s.kblock_width), (256, kw, kw));
            assert_shard_reads(&m, &s, 0, k * kw, &format!("{:?} K-block {k}", m.format()));
            if let ShardData::E4m3 { row0, ref scales, .. } = s.data {
                assert_eq!(row0, 0);
                assert_eq!(scales.len(), 2 * kw / 128);
            }
            for (r, row) in rows.iter_mut().enumerate() {
                row.extend((0..kw).map(|c| shard_element(&s, r, c).0));
            }
        }
        let whole: Vec<u32> = (0..256 * 1280).map(|i| matrix_element(&m, i / 1280, i % 1280).0).collect();
        assert!(rows.concat() == whole, "{:?}: concatenated column shards differ from the matrix", m.format());
        // Two K-blocks at once are a legal shard too.
        if g >= 2 {
            let s = m.shard_cols(0..2 * kw);
            assert_shard_reads(&m, &s, 0, 0, "two K-blocks");
        }
    }
}

#[test]
fn row_shard_mid_scale_block_reads_the_right_scales() {
    let [_, m] = test_matrices(512, 256);
    // Rows 200..400 lie in scale rows 1, 2 and 3: the shard starts mid scale block 1.
    let s = m.shard_rows(200..400);
    match (&s.data, &m) {
        (ShardData::E4m3 { scales, row0, .. }, Matrix::E4m3 { scales: full, .. }) => {
            assert_eq!(*row0, 200);
            assert!(scales[..] == full[2..8], "the shard must keep scale rows 1..4 (of 2 columns)");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_shard_reads(&m, &s, 200, 0, "rows 200..400");
    // The kernel twin computes the same rows from the shard as from the whole matrix.
    let x: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
    let (mut whole, mut part) = (vec![0.0f32; 512], vec![0.0f32; 200]);
    gemv_rows(&m.whole().view(), &x, &mut whole);
    gemv_rows(&s.view(), &x, &mut part);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&part), bits(&whole[200..400]));
}

#[test]
fn col_shard_partials_equal_the_whole_matrix_partials() {
    for m in test_matrices(256, 1280) {
        let g = m.kblocks().unwrap();
        let kw = 1280 / g;
        let x: Vec<f32> = (0..1280).map(|i| ((i * 29 % 97) as f32 - 48.0) / 32.0).collect();
        let mut whole = vec![0.0f32; g * 256];
        gemv_partials(&m.whole().view(), &x, &mut whole);
        for k in 0..g {
            let mut part = vec![0.0f32; 256];
            gemv_partials(&m.shard_cols(k * kw..(k + 1) * kw).view(), &x[k * kw..(k + 1) * kw], &mut part);
            let same = part.iter().zip(&whole[k * 256..(k + 1) * 256]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{:?}: K-block {k} partials differ between shard and whole", m.format());
        }
    }
}

#[test]
fn col_shard_off_the_grid_is_refused() {
    let [bf16, e4m3] = test_matrices(256, 1280);
    let reversed = std::ops::Range { start: 1280, end: 640 }; // both ends on the grid
    for (m, cols) in [(&bf16, 0..100), (&bf16, 160..300), (&e4m3, 0..160), (&e4m3, 640..1400), (&e4m3, reversed)] {
        match m.try_shard_cols(cols.clone()) {
            Err(RuntimeError::ModelShape { rule }) => assert_contains(&rule, &[&format!("{cols:?}"), "K-block"]),
            other => panic!("{:?} cols {cols:?}: expected a refusal, got {other:?}", m.format()),
        }
    }
    assert!(bf16.try_shard_rows(200..300).is_err());
    let result = std::panic::catch_unwind(|| e4m3.shard_cols(0..160));
    assert!(result.is_err(), "shard_cols off the grid must panic (try_shard_cols returns the error)");
}

#[test]
fn whole_is_the_full_row_shard() {
    for m in test_matrices(384, 256) {
        let w = m.whole();
        assert_eq!(w, m.shard_rows(0..384));
        assert_eq!(w.kblock_width, 256 / m.kblocks().unwrap());
        assert_shard_reads(&m, &w, 0, 0, "whole");
    }
}

#[test]
fn to_nvfp4_requantizes_the_dequantized_matrix() {
    let micro = from_bytes(micro_bytes(), Path::new(ORIGIN)).unwrap();
    let m = &micro.layers[0].experts[1].down; // [256, 256]
    let (codes, scales) = match m {
        Matrix::E4m3 { codes, scales, .. } => (codes, scales),
        _ => panic!("experts are E4M3"),
    };
    let values = e4m3_block_dequant(codes, scales, 256, 256);
    let q = Nvfp4Matrix::quantize(&values, 256, 256).unwrap();
    let s = m.to_nvfp4();
    assert_eq!((s.out_features, s.in_features), (256, 256));
    assert_eq!(s.kblock_width, 256 / canonical_kblocks(WeightFormat::Nvfp4, 256).unwrap());
    match &s.data {
        ShardData::Nvfp4 { packed, scales, global_scale } => {
            assert!(packed == &q.packed && scales == &q.scales);
            assert_eq!(global_scale.to_bits(), q.global_scale.to_bits());
            assert!(*global_scale > 0.0 && packed.iter().any(|b| *b != 0));
        }
        other => panic!("expected NVFP4 storage, got {other:?}"),
    }
    // NVFP4 keeps the matrix recognisable: correlation with the E4M3 values close to 1.
    let back: Vec<f64> = (0..256 * 256).map(|i| q.element(i / 256, i % 256) as f64 * q.global_scale as f64).collect();
    let dot: f64 = back.iter().zip(&values).map(|(a, b)| a * *b as f64).sum();
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    let corr = dot / (norm(&mut back.iter().copied()) * norm(&mut values.iter().map(|x| *x as f64)));
    assert!(corr > 0.95, "NVFP4 re-quantization correlation {corr}");
}

#[test]
fn format_names_are_the_documented_ones() {
    assert_eq!(format::names::layer(3, "attn.q.weight"), "layers.3.attn.q.weight");
    assert_eq!(format::names::expert(2, 17), "layers.2.experts.17");
    assert_eq!(format::names::shared(0), "layers.0.shared");
    assert_eq!((format::FORMAT_NAME, format::FORMAT_VERSION), ("memra-model", "1"));
}
