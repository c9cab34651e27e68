//! Rows and columns (docs/DESIGN.md §3.6) on the host backend: a pass of B sessions (rows) or
//! of T consecutive tokens (columns) gives, for every session and step, the single-token
//! program's bits at every layer × seam — at TP1/2/4/8 over both host transports — and the
//! passes really were multi-lane (ragged rows, accepted and rejected columns).

use memra_runtime::backend::host::HostBackend;
use memra_runtime::evidence::record::Record;
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, PassShape, RunConfig, Transport};
use std::sync::OnceLock;

fn model(preset: &str) -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    static EDGE: OnceLock<Model> = OnceLock::new();
    let cell = if preset == "tiny" { &TINY } else { &EDGE };
    cell.get_or_init(|| generate(&ModelConfig::preset(preset, None).unwrap(), 7).unwrap())
}

/// 5 prompts of different lengths (so rows are ragged and a lane is refilled), 4 tokens each.
fn battery(vocab: usize) -> Battery {
    let p = |v: &[u32]| v.iter().map(|t| t % vocab as u32).collect::<Vec<u32>>();
    Battery {
        prompts: vec![p(&[3, 141, 59]), p(&[26, 535]), p(&[8, 9, 7, 9, 3, 2]), p(&[38]), p(&[4, 6, 2, 6])],
        gen_tokens: 4,
    }
}

fn run(m: &Model, tp: usize, t: Transport, shape: PassShape, forced: Option<Vec<Vec<u32>>>) -> Record {
    let mut cfg = RunConfig::new(tp, t, battery(m.config.vocab)).unwrap();
    cfg.pass = shape;
    cfg.forced_tokens = forced;
    let mut b = HostBackend::new(tp).unwrap();
    program::run(m, &cfg, &mut b).unwrap_or_else(|e| panic!("TP{tp} {} {shape:?}: {e}", t.name()))
}

/// The first (prompt, step, seam) where two records differ, with the lane that computed it.
fn first_divergence(oracle: &Record, r: &Record) -> Option<String> {
    for (p, (a, b)) in oracle.digests.iter().zip(&r.digests).enumerate() {
        assert_eq!(a.len(), b.len(), "prompt {p}: step counts differ");
        for (s, (x, y)) in a.iter().zip(b).enumerate() {
            if let Some(i) = x.iter().zip(y).position(|(u, v)| u != v) {
                let (l, seam) = Record::seam_at(oracle.n_layers, i);
                return Some(format!("prompt {p} step {s} layer {l} {} (pass, lane) {:?}", seam.name(), r.lanes[p][s]));
            }
        }
    }
    (oracle.tokens != r.tokens).then(|| "tokens differ".into())
}

fn shape(b: usize, t: usize) -> PassShape {
    PassShape::new(b, t).unwrap()
}

#[test]
fn rows_equal_each_session_decoded_alone_at_every_tp_and_transport() {
    for preset in ["tiny", "edge"] {
        let m = model(preset);
        let oracle = run(m, 1, Transport::HostBounce, PassShape::SINGLE, None);
        for (tp, t) in [
            (1, Transport::HostBounce),
            (2, Transport::NativeP2p),
            (4, Transport::HostBounce),
            (8, Transport::NativeP2p),
        ] {
            for b in [2, 4, 8] {
                let r = run(m, tp, t, shape(b, 1), None);
                assert_eq!(first_divergence(&oracle, &r), None, "{preset} TP{tp} {} batch {b}", t.name());
                assert_eq!((r.top2.clone(), r.tokens.clone()), (oracle.top2.clone(), oracle.tokens.clone()));
                // Really rows: some pass held several sessions at different positions.
                let mut by_pass = std::collections::BTreeMap::<u32, Vec<usize>>::new();
                for steps in &r.lanes {
                    for (s, &(pass, _)) in steps.iter().enumerate() {
                        by_pass.entry(pass).or_default().push(s);
                    }
                }
                let ragged = by_pass.values().any(|steps| steps.len() > 1 && steps.iter().any(|s| *s != steps[0]));
                assert!(ragged, "{preset} batch {b}: no pass held two sessions at different positions");
            }
        }
    }
}

#[test]
fn columns_equal_single_token_steps_prefill_and_verify() {
    for preset in ["tiny", "edge"] {
        let m = model(preset);
        let oracle = run(m, 1, Transport::HostBounce, PassShape::SINGLE, None);
        for (tp, t) in [
            (1, Transport::NativeP2p),
            (2, Transport::HostBounce),
            (4, Transport::NativeP2p),
            (8, Transport::HostBounce),
        ] {
            for cols in [2, 4, 8] {
                // Teacher-forced from the oracle's tape: every draft is right, every column kept.
                let forced = Some(oracle.tokens.iter().map(|g| g[..g.len() - 1].to_vec()).collect());
                for (label, f) in [("own drafts", None), ("tape drafts", forced)] {
                    let r = run(m, tp, t, shape(1, cols), f);
                    assert_eq!(
                        first_divergence(&oracle, &r),
                        None,
                        "{preset} TP{tp} {} columns {cols} {label}",
                        t.name()
                    );
                    assert_eq!(r.top2, oracle.top2, "{preset} columns {cols} {label}");
                    let widest = r.lanes.iter().flatten().map(|&(_, lane)| lane).max().unwrap();
                    assert!(widest as usize + 1 >= cols.min(6), "{preset} columns {cols}: widest lane {widest}");
                }
            }
        }
    }
}

#[test]
fn pass_shapes_outside_the_grid_are_refused_with_the_rule() {
    for (b, t, needle) in [(3, 1, "--batch 3"), (1, 16, "--columns 16"), (0, 1, "--batch 0"), (2, 2, "not both")] {
        let err = PassShape::new(b, t).unwrap_err().to_string();
        assert!(err.contains(needle), "{b}×{t}: {err}");
    }
}
