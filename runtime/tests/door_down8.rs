//! SEL_DOWN8 on the host backend (the device side is `gpu/cuda_down8.rs`).
//!
//! The door fuses an NVFP4_EP2 owner's down sweep and its route-weight combine into one launch.
//! On `edge` (router ties, signed-zero sums) and `tiny` (experts exactly one warp's row wide,
//! the bound itself), at TP1 and TP2, over both host transports and beside SEL_MIRROR and
//! MOE_DIRECT, every seam keeps every bit of the same configuration without the door; each owner
//! issues exactly one fused launch per layer and step, and the unfused owner sums vanish. Where
//! the experts are wider than one warp's row the door is refused before any work (a typed error
//! with the rule), and without NVFP4_EP2 its `requires` rule refuses it.

use crate::edge_fixture::{battery, edge};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::evidence::record::Record;
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, DoorSet, PassShape, RunConfig, RuntimeError, Transport};
use std::sync::OnceLock;

fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 3).unwrap())
}

fn short(m: &Model) -> Battery {
    let mut b = Battery::default_for(m.config.vocab, 2);
    b.prompts.truncate(2);
    b.gen_tokens = 3;
    b
}

fn run(m: &Model, b: &Battery, tp: usize, t: Transport, doors: DoorSet, pass: PassShape) -> Record {
    let mut cfg = RunConfig::new(tp, t, b.clone()).unwrap();
    cfg.doors = doors;
    cfg.pass = pass;
    program::run(m, &cfg, &mut HostBackend::new(tp).unwrap()).unwrap_or_else(|e| panic!("TP{tp} {doors:?}: {e}"))
}

fn census(r: &Record, key: &str) -> u64 {
    r.census.get(key).copied().unwrap_or(0)
}

fn ep2() -> DoorSet {
    DoorSet { nvfp4_ep2: true, ..DoorSet::default() }
}

#[test]
fn sel_down8_keeps_every_bit_of_nvfp4_ep2_with_one_fused_sweep_per_owner() {
    let models: [(&str, &Model, Battery); 2] = [("edge", edge(), battery()), ("tiny", tiny(), short(tiny()))];
    let single = PassShape::SINGLE;
    for (name, m, b) in &models {
        let steps: u64 = (0..b.prompts.len()).map(|p| b.steps_of(p) as u64).sum();
        let sweeps = 2 * m.config.layers as u64 * steps; // one per owner, layer and step
        for tp in [1, 2] {
            for (label, extra) in [
                ("", DoorSet::default()),
                ("+sel_mirror", DoorSet { sel_mirror: true, ..DoorSet::default() }),
                ("+moe_direct", DoorSet { moe_direct: true, ..DoorSet::default() }),
            ] {
                let off_doors = DoorSet { nvfp4_ep2: true, ..extra };
                let on_doors = DoorSet { sel_down8: true, ..off_doors };
                for t in [Transport::HostBounce, Transport::NativeP2p] {
                    if (extra.sel_mirror || extra.moe_direct) && t != Transport::NativeP2p {
                        continue; // those doors run on native-p2p only
                    }
                    let what = format!("{name} TP{tp} {}{label}", t.name());
                    let off = run(m, b, tp, t, off_doors, single);
                    let on = run(m, b, tp, t, on_doors, single);
                    assert_eq!(off.first_digest_difference(&on), None, "{what}: SEL_DOWN8 changed a bit");
                    assert_eq!(
                        (on.tokens.clone(), on.coverage.clone()),
                        (off.tokens.clone(), off.coverage.clone()),
                        "{what}"
                    );
                    assert_eq!(census(&on, "launch.expert_down_combine.nvfp4"), sweeps, "{what}: fused sweeps");
                    assert_eq!(on.engaged.get("sel_down8.fused_sweeps"), Some(&sweeps), "{what}");
                    assert_eq!(census(&off, "launch.combine_owned"), sweeps, "{what}: the owner sums it replaces");
                    assert_eq!(census(&on, "launch.combine_owned"), 0, "{what}: no owner sum left unfused");
                    assert!(census(&on, "launch.fold_slots") < census(&off, "launch.fold_slots"), "{what}: folds");
                    assert_eq!(on.copy_faults, vec![], "{what}");
                }
            }
        }
    }
}

/// A pass of several rows runs the fused sweep per lane, and equals its own single-token run.
#[test]
fn sel_down8_in_a_rows_pass_equals_single_token_decode() {
    let (m, b) = (edge(), battery());
    let doors = DoorSet { sel_down8: true, ..ep2() };
    let single = run(m, &b, 2, Transport::NativeP2p, doors, PassShape::SINGLE);
    let rows = run(m, &b, 2, Transport::NativeP2p, doors, PassShape::new(2, 1).unwrap());
    assert_eq!(single.first_digest_difference(&rows), None);
    assert_eq!(rows.tokens, single.tokens);
    assert!(census(&rows, "launch.expert_down_combine.nvfp4") > 0);
}

/// Experts wider than one warp's down row (1024 values) are refused before any work, naming the
/// rule and the width; the same model runs NVFP4_EP2 without the door; SEL_DOWN8 without
/// NVFP4_EP2 is refused by its `requires` rule.
#[test]
fn sel_down8_is_refused_on_wide_experts_and_without_nvfp4_ep2() {
    let mut c = ModelConfig::preset("edge", None).unwrap();
    c.expert_width = 1152;
    let wide = generate(&c, 5).unwrap();
    let mut b = battery();
    b.prompts.truncate(1);
    b.gen_tokens = 2;
    let mut cfg = RunConfig::new(2, Transport::HostBounce, b.clone()).unwrap();
    cfg.doors = DoorSet { sel_down8: true, ..ep2() };
    let err = program::run(&wide, &cfg, &mut HostBackend::new(2).unwrap()).unwrap_err();
    let RuntimeError::DoorRefused { door: "MEMRA_SEL_DOWN8", rule } = &err else { panic!("{err:?}") };
    assert!(rule.contains("1152") && rule.contains("1024"), "{rule}");
    cfg.doors = ep2();
    assert!(program::run(&wide, &cfg, &mut HostBackend::new(2).unwrap()).is_ok(), "NVFP4_EP2 alone runs");
    cfg.doors = DoorSet { sel_down8: true, ..DoorSet::default() };
    let err = cfg.check_doors().unwrap_err();
    assert!(err.to_string().contains("without MEMRA_STEP_NVFP4_EP2"), "{err}");
}
