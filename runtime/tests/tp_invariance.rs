//! TP1 = TP2 = TP4 = TP8 over both host transports, bit for bit, at every layer × seam × step
//! (docs/DESIGN.md §3.4) — and the evidence that the comparison can see a difference: planted defects
//! (canaries) are caught exactly where they are planted, NUMERIC-CLASS doors differ from the
//! oracle while equalling their own TP1 baseline, and the outputs compared are not trivial.
//!
//! Random shapes off the presets are covered by `tp_properties.rs`.

use memra_runtime::backend::host::HostBackend;
use memra_runtime::evidence::record::{CaptureKey, Record, Seam};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, Canary, ExpertFormat, RunConfig, Transport};
use std::sync::OnceLock;

const TRANSPORTS: [Transport; 2] = [Transport::HostBounce, Transport::NativeP2p];

/// The tiny preset (2 layers, top-k 2), seed 7, generated once per test process.
fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap())
}

/// A short battery for the many-run tests: 2 prompts, 9 decode steps in all.
fn short() -> Battery {
    Battery { prompts: vec![vec![3, 141, 59], vec![26, 535]], gen_tokens: 3 }
}

fn run_cfg(model: &Model, cfg: &RunConfig) -> Record {
    let mut b = HostBackend::new(cfg.tp.get()).unwrap();
    program::run(model, cfg, &mut b)
        .unwrap_or_else(|e| panic!("TP{} {} {:?} run failed: {e}", cfg.tp, cfg.transport.name(), cfg.doors))
}

fn run(model: &Model, tp: usize, transport: Transport, battery: &Battery) -> Record {
    run_cfg(model, &RunConfig::new(tp, transport, battery.clone()).unwrap())
}

/// A run configuration changed by `edit`.
fn config(tp: usize, transport: Transport, battery: &Battery, edit: impl FnOnce(&mut RunConfig)) -> RunConfig {
    let mut cfg = RunConfig::new(tp, transport, battery.clone()).unwrap();
    edit(&mut cfg);
    cfg
}

/// The oracle of the short battery on `tiny`: TP1, host-bounce, every door at default.
fn oracle_short() -> &'static Record {
    static ORACLE: OnceLock<Record> = OnceLock::new();
    ORACLE.get_or_init(|| run(tiny(), 1, Transport::HostBounce, &short()))
}

/// The oracle of the default battery on `tiny`.
fn oracle_default() -> &'static Record {
    static ORACLE: OnceLock<Record> = OnceLock::new();
    ORACLE.get_or_init(|| run(tiny(), 1, Transport::HostBounce, &Battery::default_for(tiny().config.vocab, 1)))
}

/// First (prompt, step, seam index) whose digest differs.
fn first_diff(a: &Record, b: &Record) -> Option<(usize, usize, usize)> {
    assert_eq!(a.digests.len(), b.digests.len(), "the records hold different prompt counts");
    for (p, (ra, rb)) in a.digests.iter().zip(&b.digests).enumerate() {
        assert_eq!(ra.len(), rb.len(), "prompt {p}: the records hold different step counts");
        for (s, (da, db)) in ra.iter().zip(rb).enumerate() {
            if let Some(i) = da.iter().zip(db).position(|(x, y)| x != y) {
                return Some((p, s, i));
            }
        }
    }
    None
}

/// `first_diff` as "prompt p step s layer l seam" for messages.
fn describe(n_layers: usize, d: Option<(usize, usize, usize)>) -> String {
    match d {
        None => "no divergence".into(),
        Some((p, s, i)) => {
            let (l, seam) = Record::seam_at(n_layers, i);
            format!("prompt {p} step {s} layer {l} {}", seam.name())
        }
    }
}

/// Assert the records agree at every digest and token.
fn assert_same(oracle: &Record, got: &Record, what: &str) {
    let d = first_diff(oracle, got);
    assert_eq!(d, None, "{what} diverges at {}", describe(oracle.n_layers, d));
    assert_eq!(got.tokens, oracle.tokens, "{what}: token tapes differ");
}

/// Assert the first divergence is at (prompt 0, `step`, `layer`, `seam`).
fn assert_first_diff_at(oracle: &Record, got: &Record, step: usize, layer: usize, seam: Seam, what: &str) {
    let want = Some((0, step, Record::seam_index(oracle.n_layers, layer, seam)));
    let d = first_diff(oracle, got);
    assert_eq!(
        d,
        want,
        "{what}: first divergence at {}, expected {}",
        describe(oracle.n_layers, d),
        describe(oracle.n_layers, want)
    );
}

fn engaged(r: &Record, counter: &str) -> u64 {
    r.engaged.get(counter).copied().unwrap_or(0)
}

/// Distance in units in the last place between two f32 bit patterns (adjacent floats are 1
/// apart, +0.0 and −0.0 are 0 apart; NaN patterns compare by their bits like any other).
fn ulp_distance(a: u32, b: u32) -> u64 {
    let key = |x: u32| -> i64 {
        if x & 0x8000_0000 != 0 {
            -((x & 0x7fff_ffff) as i64)
        } else {
            x as i64
        }
    };
    (key(a) - key(b)).unsigned_abs()
}

// ---------------------------------------------------------------------------------------------
// Invariance

#[test]
fn every_tp_and_transport_equals_tp1_host_bounce() {
    let model = tiny();
    let battery = Battery::default_for(model.config.vocab, 1);
    let oracle = oracle_default();
    assert_eq!(oracle.digests.len(), battery.prompts.len());
    for tp in [1, 2, 4, 8] {
        for t in TRANSPORTS {
            // TP1 host-bounce is a second, separate run: the determinism check.
            let r = run(model, tp, t, &battery);
            assert_same(oracle, &r, &format!("TP{tp} {}", t.name()));
        }
    }
}

/// The `small` preset (16 q / 8 kv heads, 32 experts of width 1024, vocab 8192) cut to one layer:
/// other head groups, expert counts and vocabulary than `tiny`, TP-sharded at every TP size.
#[test]
fn small_preset_one_layer_is_tp_invariant() {
    let model = generate(&ModelConfig::preset("small", Some(1)).unwrap(), 7).unwrap();
    let battery = Battery { prompts: vec![vec![4091, 7, 2048]], gen_tokens: 2 };
    let oracle = run(&model, 1, Transport::HostBounce, &battery);
    for tp in [2, 4, 8] {
        assert_same(&oracle, &run(&model, tp, Transport::HostBounce, &battery), &format!("small TP{tp} host-bounce"));
    }
}

/// What the invariance tests compare is not trivial: the generated tokens vary, and every layer's
/// residual stream and the logits change at every step (a program writing zeros or a constant,
/// or ignoring its input token, would pass "equal at every TP" and fail here).
#[test]
fn compared_outputs_are_not_trivial() {
    let oracle = oracle_default();
    let all: Vec<u32> = oracle.tokens.iter().flatten().copied().collect();
    assert!(all.iter().any(|t| *t != all[0]), "every generated token is {}", all[0]);
    let n = oracle.n_layers;
    let seams: Vec<(usize, Seam)> =
        (0..n).map(|l| (l, Seam::Residual)).chain([(n, Seam::FinalNorm), (n, Seam::Logits)]).collect();
    for (p, steps) in oracle.digests.iter().enumerate() {
        for &(l, seam) in &seams {
            let i = Record::seam_index(n, l, seam);
            let mut d: Vec<u64> = steps.iter().map(|row| row[i]).collect();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), steps.len(), "prompt {p} layer {l} {}: a digest repeats across steps", seam.name());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Negative controls: planted defects are caught exactly where they are planted

#[test]
fn reversed_kblocks_are_caught_at_o_join() {
    let model = tiny();
    let oracle = oracle_short();
    let canary = |c: &mut RunConfig| c.doors.canary = Some(Canary::ReverseKBlocks);
    for t in TRANSPORTS {
        // At TP1 the canary is defined as a no-op (runtime/src/program/layer.rs: `tp > 1`).
        let r = run_cfg(model, &config(1, t, &short(), canary));
        assert_same(oracle, &r, &format!("ReverseKBlocks at TP1 {}", t.name()));
        assert_eq!(engaged(&r, "canary_reverse_kblocks.reversed_folds"), 0, "TP1 {}", t.name());
        for tp in [2, 4, 8] {
            let r = run_cfg(model, &config(tp, t, &short(), canary));
            let what = format!("ReverseKBlocks at TP{tp} {}", t.name());
            assert!(engaged(&r, "canary_reverse_kblocks.reversed_folds") > 0, "{what}: the canary did not engage");
            assert_first_diff_at(oracle, &r, 0, 0, Seam::OJoin, &what);
        }
    }
}

#[test]
fn stale_buffer_is_caught_at_o_join_of_step_1() {
    let model = tiny();
    let oracle = oracle_short();
    for t in TRANSPORTS {
        for tp in [2, 4, 8] {
            let r = run_cfg(model, &config(tp, t, &short(), |c| c.doors.canary = Some(Canary::StaleBuffer)));
            let what = format!("StaleBuffer at TP{tp} {}", t.name());
            assert!(engaged(&r, "canary_stale_buffer.stale_reads") > 0, "{what}: the canary did not engage");
            assert_first_diff_at(oracle, &r, 1, 0, Seam::OJoin, &what);
        }
    }
}

/// A flipped low mantissa bit is found at its (layer, seam, step) and nowhere earlier, and the full
/// capture there shows exactly one element, element 0, one ulp away from the oracle's.
#[test]
fn flipped_bit_is_caught_exactly_where_planted() {
    let model = tiny();
    let n = model.config.layers;
    let battery = short();
    let plain = oracle_short();
    // (TP, transport, layer, seam, step): a root seam, a seam split over ranks, a head seam.
    let sites = [
        (1, Transport::HostBounce, 1, Seam::Experts, 2),
        (4, Transport::NativeP2p, 0, Seam::OProj, 1),
        (2, Transport::HostBounce, n, Seam::Logits, 3),
    ];
    for (tp, t, layer, seam, step) in sites {
        let what = format!("FlipBit at layer {layer} {} step {step}, TP{tp} {}", seam.name(), t.name());
        let key = CaptureKey { prompt: 0, step, layer, seam };
        let oracle = run_cfg(model, &config(1, Transport::HostBounce, &battery, |c| c.capture = vec![key]));
        assert_same(plain, &oracle, "capturing a seam");
        let r = run_cfg(
            model,
            &config(tp, t, &battery, |c| {
                c.capture = vec![key];
                c.doors.canary = Some(Canary::FlipBit { layer, seam, step, element: 0 });
            }),
        );
        assert!(engaged(&r, "canary_flip_bit.flips") > 0, "{what}: the canary did not engage");
        assert_first_diff_at(&oracle, &r, step, layer, seam, &what);
        let (want, got) = (&oracle.captures[&key].bits, &r.captures[&key].bits);
        assert_eq!(want.len(), got.len(), "{what}: capture sizes differ");
        let diffs: Vec<usize> = (0..want.len()).filter(|i| want[*i] != got[*i]).collect();
        assert_eq!(diffs, vec![0], "{what}: elements that differ");
        assert_eq!(ulp_distance(want[0], got[0]), 1, "{what}: {:#010x} vs {:#010x}", want[0], got[0]);
    }
}

// ---------------------------------------------------------------------------------------------
// Expert formats and NUMERIC-CLASS doors: class identity, and a difference from the oracle

/// NVFP4 banks are whole experts on their owners at every TP size, so the NVFP4 program is TP
/// invariant; and it is a different program from the E4M3 one, first visible at the experts.
/// (Every NVFP4 run re-quantizes the banks at upload, about 1 s of CPU on `tiny`, so the other
/// transport is checked at TP8 only; `tp_properties.rs` covers transports broadly.)
#[test]
fn nvfp4_experts_are_tp_invariant_and_differ_from_e4m3() {
    let model = tiny();
    let battery = short();
    let nvfp4 = |c: &mut RunConfig| c.expert_format = ExpertFormat::Nvfp4;
    let base = run_cfg(model, &config(1, Transport::HostBounce, &battery, nvfp4));
    assert_first_diff_at(oracle_short(), &base, 0, 0, Seam::Experts, "NVFP4 TP1 against E4M3 TP1");
    let subjects =
        [(2, Transport::HostBounce), (4, Transport::HostBounce), (8, Transport::HostBounce), (8, Transport::NativeP2p)];
    for (tp, t) in subjects {
        let r = run_cfg(model, &config(tp, t, &battery, nvfp4));
        assert_same(&base, &r, &format!("NVFP4 TP{tp} {} against NVFP4 TP1 host-bounce", t.name()));
    }
}

/// `tiny` with top-k 3. With top-k 2, NVFP4_EP2's per-owner grouping of the routed sum is
/// `(0 + a) + (0 + b)` or `(0 + b) + (0 + a)` against the canonical `(0 + a) + b`: the same f32
/// value whatever the parities, so on `tiny` the door equals the canonical NVFP4 program bit for
/// bit. Three slots give `(a + c) + b` against `(a + b) + c`.
fn tiny_top3() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let mut c = ModelConfig::preset("tiny", None).unwrap();
        c.top_k = 3;
        c.validate().unwrap();
        generate(&c, 7).unwrap()
    })
}

/// The NVFP4_EP2 door's class baseline on `tiny_top3`: its own TP1 host-bounce run.
fn ep2_top3_baseline() -> &'static Record {
    static BASE: OnceLock<Record> = OnceLock::new();
    BASE.get_or_init(|| run_cfg(tiny_top3(), &config(1, Transport::HostBounce, &short(), |c| c.doors.nvfp4_ep2 = true)))
}

/// Class identity: the NVFP4_EP2 door at TP2 equals its own TP1 host-bounce baseline, where it
/// really regroups (top-k 3, both transports) and on `tiny`, and its mechanism ran.
#[test]
fn nvfp4_ep2_tp2_equals_its_tp1_baseline() {
    let ep2 = |c: &mut RunConfig| c.doors.nvfp4_ep2 = true;
    let tiny_base = run_cfg(tiny(), &config(1, Transport::HostBounce, &short(), ep2));
    let cases = [
        (tiny_top3(), ep2_top3_baseline(), Transport::HostBounce),
        (tiny_top3(), ep2_top3_baseline(), Transport::NativeP2p),
        (tiny(), &tiny_base, Transport::HostBounce),
    ];
    for (model, base, t) in cases {
        let k = model.config.top_k;
        assert!(engaged(base, "nvfp4_ep2.owner_sweeps") > 0, "top-k {k}: NVFP4_EP2 at TP1 did not engage");
        let r = run_cfg(model, &config(2, t, &short(), ep2));
        assert!(engaged(&r, "nvfp4_ep2.owner_sweeps") > 0, "top-k {k}: NVFP4_EP2 at TP2 did not engage");
        assert_same(base, &r, &format!("top-k {k}: NVFP4_EP2 TP2 {} against its TP1 baseline", t.name()));
    }
}

/// NVFP4_EP2 is NUMERIC-CLASS: it must differ from the canonical program on the same NVFP4 banks,
/// and first where it regroups (the routed sum at moe_join). See `tiny_top3` for why this needs
/// top-k ≥ 3.
#[test]
fn nvfp4_ep2_differs_from_the_canonical_nvfp4_program_first_at_moe_join() {
    let model = tiny_top3();
    let battery = short();
    let canonical =
        run_cfg(model, &config(1, Transport::HostBounce, &battery, |c| c.expert_format = ExpertFormat::Nvfp4));
    let door = ep2_top3_baseline();
    let d = first_diff(&canonical, door);
    let seam = d.map(|(_, _, i)| Record::seam_at(model.config.layers, i).1);
    assert_eq!(seam, Some(Seam::MoeJoin), "NVFP4_EP2 against NVFP4: first divergence at {}", describe(2, d));
}

/// Class identity of W8 over every TP size and transport, and a real difference from the oracle,
/// first at layer 0 qkv of step 0 (the first projection it replaces).
#[test]
fn w8_is_class_identical_across_tp_and_differs_from_default() {
    let model = tiny();
    let battery = short();
    let w8 = |c: &mut RunConfig| c.doors.w8 = true;
    let base = run_cfg(model, &config(1, Transport::HostBounce, &battery, w8));
    assert!(engaged(&base, "w8.int8_gemvs") > 0, "W8 at TP1 did not engage");
    assert_first_diff_at(oracle_short(), &base, 0, 0, Seam::Qkv, "W8 TP1 against the oracle");
    for tp in [2, 4, 8] {
        for t in TRANSPORTS {
            let r = run_cfg(model, &config(tp, t, &battery, w8));
            assert_same(&base, &r, &format!("W8 TP{tp} {} against W8 TP1 host-bounce", t.name()));
        }
    }
}
