//! The SwiGLU clamp is a property of each layer (`ModelConfig::unclamped_layers`, read through
//! `swiglu_limit_at`): on `edge`, whose clamp rows sit in every expert of every layer, a layer
//! listed as unclamped applies no clamp on any path of the program — the fused gate/up launch
//! (TP1, TP-sharded experts), STEP_EP's host SwiGLU and EP_DEVICE_ARITHMETIC's launch — and the
//! f64 reference follows the same per-layer value. Each run test runs edge's weights under
//! `unclamped_layers` other than the preset's, so a program or reference that read one clamp for
//! every layer would fail it. Also here: the presets' lists, `swiglu_limit_at`, and the model
//! format writing the field only when it is not empty.

use crate::edge_fixture::{battery, edge};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::evidence::coverage::Coverage;
use memra_runtime::evidence::record::{CaptureKey, Record, Seam};
use memra_runtime::model::format::{from_bytes, to_bytes};
use memra_runtime::model::{Model, ModelConfig};
use memra_runtime::reference::{compare, reference_run, REFERENCE_REL_BOUND};
use memra_runtime::{program, DoorSet, RunConfig, Transport};
use safetensors::SafeTensors;
use std::path::Path;

/// The clamp counters of both expert classes (coverage names): the clamp paths `edge` claims.
fn clamp_paths() -> Vec<&'static str> {
    let v: Vec<&str> = memra_runtime::model::edge::CLAIMS.iter().copied().filter(|c| c.contains(".clamp_")).collect();
    assert_eq!(v.len(), 6, "edge claims three clamps of two expert classes: {v:?}");
    v
}

/// The edge model's weights with `unclamped` as its unclamped layers.
fn edge_with(unclamped: &[usize]) -> Model {
    let mut m = edge().clone();
    m.config.unclamped_layers = unclamped.to_vec();
    m.config.validate().unwrap();
    m
}

fn run(model: &Model, tp: usize, t: Transport, doors: DoorSet, capture: Vec<CaptureKey>) -> Record {
    let mut cfg = RunConfig::new(tp, t, battery()).unwrap();
    cfg.doors = doors;
    cfg.capture = capture;
    let mut b = HostBackend::new(tp).unwrap();
    program::run(model, &cfg, &mut b).unwrap_or_else(|e| panic!("TP{tp} {doors:?}: {e}"))
}

/// The expert paths: TP1 (whole experts), TP2 (TP-sharded), TP4 STEP_EP (the owners' SwiGLU on
/// the host, `program::ep_host`) and TP4 STEP_EP with EP_DEVICE_ARITHMETIC (in the launch).
fn expert_paths() -> Vec<(usize, Transport, DoorSet)> {
    let step_ep = DoorSet { step_ep: true, ..DoorSet::default() };
    vec![
        (1, Transport::HostBounce, DoorSet::default()),
        (2, Transport::NativeP2p, DoorSet::default()),
        (4, Transport::HostBounce, step_ep),
        (4, Transport::NativeP2p, DoorSet { ep_device_arithmetic: true, ..step_ep }),
    ]
}

fn clamps(cov: &Coverage) -> Vec<(&'static str, u64, Option<usize>)> {
    clamp_paths().into_iter().map(|p| (p, cov[p].count, cov[p].first.map(|f| f.layer))).collect()
}

/// With layer 0 unclamped, every clamp the edge battery reaches is first reached in layer 1
/// (edge's layer 0 reaches them all when it is clamped); with both layers unclamped, none is.
/// The same on every expert path, with the same counts as TP1.
#[test]
fn an_unclamped_layer_applies_no_clamp_on_any_expert_path() {
    let only_1 = edge_with(&[0]);
    let none = edge_with(&[0, 1]);
    let mut tp1: Option<Coverage> = None;
    for (tp, t, doors) in expert_paths() {
        let what = format!("TP{tp} {} {doors:?}", t.name());
        let cov = run(&only_1, tp, t, doors, Vec::new()).coverage.expect("the host backend counts coverage");
        for (path, count, first) in clamps(&cov) {
            assert!(count > 0, "{what}: layer 1 is clamped on edge yet {path} was never reached");
            assert_eq!(first, Some(1), "{what}: {path} was reached in unclamped layer 0");
        }
        let base = tp1.get_or_insert_with(|| cov.clone());
        assert_eq!(clamps(&cov), clamps(base), "{what}: clamp counts differ from TP1");
        let cov = run(&none, tp, t, doors, Vec::new()).coverage.expect("the host backend counts coverage");
        for (path, count, first) in clamps(&cov) {
            assert_eq!((count, first), (0, None), "{what}: {path} counted with every layer unclamped");
        }
    }
    // The preset itself (layer 1 unclamped): every clamp first reached in layer 0.
    let cov = run(edge(), 1, Transport::HostBounce, DoorSet::default(), Vec::new()).coverage.unwrap();
    assert_eq!(edge().config.unclamped_layers, vec![1]);
    for (path, count, first) in clamps(&cov) {
        assert!(count > 0 && first == Some(0), "the edge preset: {path} {count} first in layer {first:?}");
    }
}

/// Every seam of every step of the edge battery.
fn every_seam(layers: usize) -> Vec<CaptureKey> {
    let b = battery();
    let mut keys = Vec::new();
    for prompt in 0..b.prompts.len() {
        for step in 0..b.steps_of(prompt) {
            for layer in 0..=layers {
                let seams: &[Seam] = if layer == layers { &Seam::HEAD } else { &Seam::LAYER };
                keys.extend(seams.iter().map(|&seam| CaptureKey { prompt, step, layer, seam }));
            }
        }
    }
    keys
}

/// The f64 reference reads each layer's clamp: a run with layer 0 unclamped agrees with the
/// reference of the same configuration, and not with the reference of the same weights clamped
/// everywhere, which first differs at layer 0's experts (negative control).
#[test]
fn the_reference_reads_each_layers_clamp() {
    let only_1 = edge_with(&[0]);
    let clamped = edge_with(&[]);
    let record = run(&only_1, 1, Transport::HostBounce, DoorSet::default(), every_seam(only_1.layers.len()));
    let same = reference_run(&only_1, &battery(), &record.tokens, Some(&record)).unwrap();
    let report = compare(&same, &record, REFERENCE_REL_BOUND);
    assert!(report.passed(), "layer 0 unclamped, against its own reference: {report}");
    let other = reference_run(&clamped, &battery(), &record.tokens, Some(&record)).unwrap();
    let report = compare(&other, &record, REFERENCE_REL_BOUND);
    assert!(!report.passed(), "the reference of the clamped model accepted the unclamped run");
    let first = report
        .seams
        .iter()
        .filter_map(|s| s.first_over.map(|(k, _, _)| k))
        .min_by_key(|k| (k.prompt, k.step, k.layer, k.seam))
        .expect("a seam over the bound");
    assert_eq!((first.layer, first.seam), (0, Seam::Experts), "{report}");
}

#[test]
fn the_presets_unclamp_layer_1_of_tiny_and_edge_only() {
    for (preset, layers, want) in [
        ("tiny", None, vec![1]),
        ("edge", None, vec![1]),
        ("tiny", Some(3), vec![1]),
        // No layer 1: fully clamped (and valid).
        ("tiny", Some(1), vec![]),
        ("small", None, vec![]),
        ("step", Some(3), vec![]),
    ] {
        let c = ModelConfig::preset(preset, layers).unwrap();
        assert_eq!(c.unclamped_layers, want, "{preset} {layers:?}");
        for l in 0..c.layers {
            let limit = if want.contains(&l) { None } else { Some(7.0) };
            assert_eq!(c.swiglu_limit_at(l), limit, "{preset} {layers:?} layer {l}");
        }
    }
}

#[test]
fn swiglu_limit_at_is_the_limit_except_on_unclamped_layers() {
    let c = ModelConfig { layers: 4, unclamped_layers: vec![0, 2], ..ModelConfig::preset("small", None).unwrap() };
    let got: Vec<_> = (0..4).map(|l| c.swiglu_limit_at(l)).collect();
    assert_eq!(got, [None, Some(7.0), None, Some(7.0)]);
    // Without a limit no layer is clamped, listed or not.
    let c = ModelConfig { swiglu_limit: None, ..c };
    assert!((0..4).all(|l| c.swiglu_limit_at(l).is_none()));
}

/// The configuration as serialized before `unclamped_layers` existed: the same fields in the same
/// order.
#[derive(serde::Serialize)]
struct ConfigBefore<'a> {
    preset: &'a str,
    hidden: usize,
    layers: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    experts: usize,
    top_k: usize,
    expert_width: usize,
    shared_width: usize,
    vocab: usize,
    eps: f32,
    rope_theta: f32,
    swiglu_limit: Option<f32>,
    route_scale: f32,
    route_norm: bool,
    max_positions: usize,
}

impl<'a> From<&'a ModelConfig> for ConfigBefore<'a> {
    fn from(c: &'a ModelConfig) -> Self {
        ConfigBefore {
            preset: &c.preset,
            hidden: c.hidden,
            layers: c.layers,
            q_heads: c.q_heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            experts: c.experts,
            top_k: c.top_k,
            expert_width: c.expert_width,
            shared_width: c.shared_width,
            vocab: c.vocab,
            eps: c.eps,
            rope_theta: c.rope_theta,
            swiglu_limit: c.swiglu_limit,
            route_scale: c.route_scale,
            route_norm: c.route_norm,
            max_positions: c.max_positions,
        }
    }
}

/// A fully clamped model's file holds the configuration JSON of before the field, byte for byte
/// (no `unclamped_layers` key), and reads back equal (absent reads as empty); an unclamped layer
/// is written and read back.
#[test]
fn unclamped_layers_is_written_only_when_not_empty() {
    let metadata_config = |bytes: &[u8]| {
        let (_, meta) = SafeTensors::read_metadata(bytes).unwrap();
        meta.metadata().as_ref().unwrap()["memra.config"].clone()
    };
    let clamped = edge_with(&[]);
    let bytes = to_bytes(&clamped).unwrap();
    let before = serde_json::to_string(&ConfigBefore::from(&clamped.config)).unwrap();
    assert_eq!(metadata_config(&bytes), before, "a fully clamped configuration changed its JSON");
    assert!(from_bytes(&bytes, Path::new("clamped.safetensors")).unwrap() == clamped);
    let bytes = to_bytes(edge()).unwrap();
    assert!(metadata_config(&bytes).contains(r#","unclamped_layers":[1],"#), "{}", metadata_config(&bytes));
    let loaded = from_bytes(&bytes, Path::new("edge.safetensors")).unwrap();
    assert_eq!(loaded.config.unclamped_layers, vec![1]);
    assert!(&loaded == edge());
}
