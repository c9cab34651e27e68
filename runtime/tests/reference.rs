//! The canonical program against the plain f64 reference (docs/DESIGN.md §3.4, last paragraph): every
//! seam within `REFERENCE_REL_BOUND`, the token tape equal outside near-ties, the same verdict
//! at TP2, and negative controls showing that a wrong model or a wrong router decision fails.
//!
//! One canonical TP1 run of the `tiny` preset's default battery serves every test: it captures
//! every (step, layer, seam) tensor of prompts 0 and 1 (full capture reads every tensor, so two
//! prompts keep it fast) and the router seam of every prompt, step and layer (the route hint),
//! and its tape covers all 8 prompts × 8 tokens.

use memra_runtime::backend::host::HostBackend;
use memra_runtime::config::Tp;
use memra_runtime::evidence::record::{CaptureKey, Record, Seam};
use memra_runtime::model::{gen::generate, Matrix, Model, ModelConfig};
use memra_runtime::reference::{compare, reference_run, ComparisonReport, ReferenceRun, REFERENCE_REL_BOUND};
use memra_runtime::{program, Battery, RunConfig, Transport};
use std::sync::OnceLock;
use std::time::Instant;

/// Prompts of the default battery whose every seam tensor is captured.
const FULL_PROMPTS: usize = 2;

struct Fixture {
    model: Model,
    battery: Battery,
    cfg: RunConfig,
    record: Record,
    reference: ReferenceRun,
    report: ComparisonReport,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let t = Instant::now();
        let model = generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap();
        let battery = Battery::default_for(model.config.vocab, 1);
        let mut cfg = RunConfig::new(1, Transport::HostBounce, battery.clone()).unwrap();
        cfg.capture = capture_keys(&battery, model.layers.len(), FULL_PROMPTS);
        let record = run(&model, &cfg);
        let reference = reference_run(&model, &battery, &record.tokens, Some(&record)).unwrap();
        let report = compare(&reference, &record, REFERENCE_REL_BOUND);
        eprintln!("fixture (model, TP1 run, reference, compare): {:.2?}", t.elapsed());
        Fixture { model, battery, cfg, record, reference, report }
    })
}

/// Every seam of prompts `0..full`, and the router seam of every prompt, at every step.
fn capture_keys(battery: &Battery, n_layers: usize, full: usize) -> Vec<CaptureKey> {
    let mut keys = Vec::new();
    for prompt in 0..battery.prompts.len() {
        for step in 0..battery.steps_of(prompt) {
            for layer in 0..=n_layers {
                let seams: &[Seam] = if layer == n_layers { &Seam::HEAD } else { &Seam::LAYER };
                for &seam in seams {
                    if prompt < full || seam == Seam::Router {
                        keys.push(CaptureKey { prompt, step, layer, seam });
                    }
                }
            }
        }
    }
    keys
}

fn run(model: &Model, cfg: &RunConfig) -> Record {
    let mut backend = HostBackend::new(cfg.tp.get()).unwrap();
    program::run(model, cfg, &mut backend).unwrap()
}

/// The part of a record that concerns prompt 0 only (captures and tape).
fn prompt0(record: &Record) -> Record {
    let mut r = record.clone();
    r.captures.retain(|k, _| k.prompt == 0);
    r.tokens.truncate(1);
    r.top2.truncate(1);
    r.digests.truncate(1);
    r
}

fn battery0(f: &Fixture) -> Battery {
    Battery { prompts: vec![f.battery.prompts[0].clone()], gen_tokens: f.battery.gen_tokens }
}

/// The reference of `model` on prompt 0 of the fixture, compared with the fixture's record.
fn compare_prompt0(model: &Model) -> ComparisonReport {
    let f = fixture();
    let record = prompt0(&f.record);
    let reference = reference_run(model, &battery0(f), &record.tokens, Some(&record)).unwrap();
    compare(&reference, &record, REFERENCE_REL_BOUND)
}

fn seam_error(report: &ComparisonReport, seam: Seam) -> f64 {
    report.seams.iter().find(|s| s.seam == seam).map(|s| s.max_rel).unwrap_or_else(|| panic!("no {seam:?} in report"))
}

fn bf16_row_copy(m: &mut Matrix, from: usize, to: usize) {
    let Matrix::Bf16 { in_features, bits, .. } = m else { panic!("the router is BF16") };
    let n = *in_features;
    bits.copy_within(from * n..(from + 1) * n, to * n);
}

#[test]
fn reference_matches_tp1_at_every_seam_and_on_the_token_tape() {
    let f = fixture();
    let report = &f.report;
    eprintln!("{report}");
    assert!(report.passed(), "the canonical program disagrees with the f64 reference:\n{report}");

    // Every seam was compared, as often as it was captured.
    let n_layers = f.model.layers.len();
    let full_steps: usize = (0..FULL_PROMPTS).map(|p| f.battery.steps_of(p)).sum();
    let all_steps: usize = (0..f.battery.prompts.len()).map(|p| f.battery.steps_of(p)).sum();
    for seam in Seam::LAYER.into_iter().chain(Seam::HEAD) {
        let expected = match seam {
            Seam::Router => all_steps * n_layers,
            Seam::FinalNorm | Seam::Logits => full_steps,
            _ => full_steps * n_layers,
        };
        let stat = report.seams.iter().find(|s| s.seam == seam).unwrap_or_else(|| panic!("{seam:?} not compared"));
        assert_eq!(stat.tensors, expected, "{seam:?} compared {} times", stat.tensors);
    }
    assert_eq!(report.tape_compared, f.battery.prompts.len() * f.battery.gen_tokens);
    assert_eq!(report.router_id_mismatches, vec![]);

    // Non-triviality: an f32 program measured against f64 must show a small nonzero error (zero
    // would mean the comparison looked at the same numbers twice), and the tape is not constant.
    let (worst_seam, worst) = report.worst.unwrap();
    assert!(worst > 0.0 && worst <= REFERENCE_REL_BOUND, "worst seam {worst_seam:?} at {worst:e}");
    let tape: Vec<u32> = f.record.tokens.iter().flatten().copied().collect();
    assert!(tape.iter().any(|t| *t != tape[0]), "every generated token is {}", tape[0]);
}

#[test]
fn tp2_record_compares_identically() {
    let f = fixture();
    let t = Instant::now();
    let mut cfg = f.cfg.clone();
    cfg.tp = Tp::new(2).unwrap();
    let record = run(&f.model, &cfg);
    let report = compare(&f.reference, &record, REFERENCE_REL_BOUND);
    eprintln!("TP2 run + compare: {:.2?}", t.elapsed());
    // The same tensors bit for bit (only the owners of each range differ).
    assert!(record.captures.keys().eq(f.record.captures.keys()));
    let differ = f.record.captures.iter().find(|(k, c)| record.captures[*k].bits != c.bits);
    assert_eq!(differ.map(|(k, _)| *k), None, "TP2 capture differs from TP1");
    assert_eq!(record.tokens, f.record.tokens);
    assert_eq!(report, f.report, "TP2's comparison differs from TP1's:\n{report}");
    assert!(report.passed());
}

/// Negative control: a 1 % larger o_proj in layer 0 (re-rounded to BF16) must fail.
#[test]
fn scaled_o_proj_fails_the_comparison() {
    let f = fixture();
    let t = Instant::now();
    // Control of the control: the unperturbed model passes on the same prompt.
    let clean = compare_prompt0(&f.model);
    assert!(clean.passed(), "unperturbed prompt 0:\n{clean}");

    let mut model = f.model.clone();
    let Matrix::Bf16 { bits, .. } = &mut model.layers[0].wo else { panic!("o_proj is BF16") };
    for b in bits.iter_mut() {
        *b = memra_kernels::formats::bf16_from_f32(memra_kernels::formats::bf16_to_f32(*b) * 1.01);
    }
    let report = compare_prompt0(&model);
    eprintln!("scaled o_proj ({:.2?}):\n{report}", t.elapsed());
    assert!(!report.passed(), "a scaled o_proj passed the reference comparison:\n{report}");
    assert_eq!(report.problems, Vec::<String>::new(), "it must fail on the numbers, not on bookkeeping");
    assert!(seam_error(&report, Seam::OProj) > REFERENCE_REL_BOUND);
    assert!(seam_error(&report, Seam::Qkv) > REFERENCE_REL_BOUND, "later steps read the wrong residual stream");
}

/// Negative control: two routed experts of layer 0 swapped (one of them selected at step 0)
/// must fail, at the experts seam.
#[test]
fn swapped_experts_fail_the_comparison() {
    let f = fixture();
    let t = Instant::now();
    let key = CaptureKey { prompt: 0, step: 0, layer: 0, seam: Seam::Router };
    let ids = &f.record.captures[&key].bits[..f.model.config.top_k];
    let a = ids[0] as usize;
    let b = (0..f.model.config.experts).find(|e| !ids.contains(&(*e as u32))).unwrap();
    let mut model = f.model.clone();
    model.layers[0].experts.swap(a, b);
    let report = compare_prompt0(&model);
    eprintln!("swapped experts {a} and {b} ({:.2?}):\n{report}", t.elapsed());
    assert!(!report.passed(), "swapped experts passed the reference comparison:\n{report}");
    assert_eq!(report.problems, Vec::<String>::new());
    assert!(seam_error(&report, Seam::Experts) > REFERENCE_REL_BOUND);
}

/// A model in which routed expert `b` is an exact copy of `a` (weights, router row and bias):
/// the two keys tie bit for bit wherever they are computed. Expert `z`'s bias is −10, so it is
/// never selected and its key is far below every other. Returns the model, its canonical record
/// of prompt 0 (2 generated tokens, every seam captured), the battery, and (a, b, z).
struct TieFixture {
    model: Model,
    battery: Battery,
    record: Record,
    a: u32,
    b: u32,
    z: u32,
}

fn tie_fixture() -> &'static TieFixture {
    static TIE: OnceLock<TieFixture> = OnceLock::new();
    TIE.get_or_init(|| {
        let f = fixture();
        let key = CaptureKey { prompt: 0, step: 0, layer: 0, seam: Seam::Router };
        let ids = &f.record.captures[&key].bits[..f.model.config.top_k];
        // a: the top-1 expert of layer 0 at step 0; b, z: the first two experts not selected.
        let a = ids[0];
        let mut others = (0..f.model.config.experts as u32).filter(|e| !ids.contains(e));
        let (b, z) = (others.next().unwrap(), others.next().unwrap());
        let mut model = f.model.clone();
        let layer = &mut model.layers[0];
        layer.experts[b as usize] = layer.experts[a as usize].clone();
        bf16_row_copy(&mut layer.router, a as usize, b as usize);
        layer.router_bias[b as usize] = layer.router_bias[a as usize];
        layer.router_bias[z as usize] = -10.0;
        let battery = Battery { prompts: vec![f.battery.prompts[0].clone()], gen_tokens: 2 };
        let mut cfg = RunConfig::new(1, Transport::HostBounce, battery.clone()).unwrap();
        cfg.capture = capture_keys(&battery, model.layers.len(), 1);
        let record = run(&model, &cfg);
        let got = &record.captures[&key].bits[..2];
        assert_eq!(got, [a.min(b), a.max(b)], "the tie must select both copies, lower id first");
        TieFixture { model, battery, record, a, b, z }
    })
}

/// The program lists the tied copies in the other order (as a device that breaks ties the other
/// way would): the reference adopts the program's ids, lists the near-tie, and passes.
#[test]
fn router_near_tie_is_adopted_and_listed() {
    let tf = tie_fixture();
    let key = CaptureKey { prompt: 0, step: 0, layer: 0, seam: Seam::Router };
    let mut record = tf.record.clone();
    let (lo, hi) = (tf.a.min(tf.b), tf.a.max(tf.b));
    record.captures.get_mut(&key).unwrap().bits[..2].copy_from_slice(&[hi, lo]);

    let reference = reference_run(&tf.model, &tf.battery, &record.tokens, Some(&record)).unwrap();
    let report = compare(&reference, &record, REFERENCE_REL_BOUND);
    eprintln!("{report}");
    assert!(report.passed(), "an exact router tie must be adopted:\n{report}");
    assert_eq!(report.router_near_ties.len(), 1, "{report}");
    let e = &report.router_near_ties[0];
    assert_eq!((e.key, e.reference.clone(), e.canonical.clone()), (key, vec![lo, hi], vec![hi, lo]));
    assert_eq!(e.gap_rel, 0.0);
    assert!(e.adopted);
}

/// The program "selects" expert z, whose key is ~10 below the boundary: the reference keeps its
/// own ids, reports the disagreement, and the comparison fails although every seam's numbers
/// match.
#[test]
fn router_disagreement_is_reported_and_fails() {
    let tf = tie_fixture();
    let key = CaptureKey { prompt: 0, step: 0, layer: 0, seam: Seam::Router };
    let mut record = tf.record.clone();
    let (lo, hi) = (tf.a.min(tf.b), tf.a.max(tf.b));
    record.captures.get_mut(&key).unwrap().bits[1] = tf.z;

    let reference = reference_run(&tf.model, &tf.battery, &record.tokens, Some(&record)).unwrap();
    let report = compare(&reference, &record, REFERENCE_REL_BOUND);
    eprintln!("{report}");
    assert!(!report.passed(), "a far-off router choice must fail:\n{report}");
    assert_eq!(report.router_disagreements.len(), 1, "{report}");
    let e = &report.router_disagreements[0];
    assert_eq!((e.key, e.reference.clone(), e.canonical.clone()), (key, vec![lo, hi], vec![lo, tf.z]));
    assert!(e.gap_rel > 0.5 && !e.adopted, "gap {}", e.gap_rel);
    assert_eq!(report.router_id_mismatches, vec![(key, vec![lo, tf.z], vec![lo, hi])]);
    assert!(report.seams.iter().all(|s| s.max_rel <= REFERENCE_REL_BOUND), "{report}");
}
