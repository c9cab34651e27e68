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

/// A first divergence: (prompt, step, layer, seam name, (pass, lane)).
type Divergence = (usize, usize, usize, &'static str, (u32, u8));

/// The first divergence of a canary run against the single-token oracle.
fn planted(m: &Model, canary: memra_runtime::Canary, tp: usize, s: PassShape) -> (Record, Option<Divergence>) {
    let oracle = run(m, 1, Transport::HostBounce, PassShape::SINGLE, None);
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery(m.config.vocab)).unwrap();
    cfg.pass = s;
    cfg.doors.canary = Some(canary);
    let mut b = HostBackend::new(tp).unwrap();
    let r = program::run(m, &cfg, &mut b).unwrap();
    for (p, (a, b)) in oracle.digests.iter().zip(&r.digests).enumerate() {
        for (st, (x, y)) in a.iter().zip(b).enumerate() {
            if let Some(i) = x.iter().zip(y).position(|(u, v)| u != v) {
                let (l, seam) = Record::seam_at(oracle.n_layers, i);
                let lane = r.lanes.get(p).map_or((0, 0), |v| v[st]);
                return (r, Some((p, st, l, seam.name(), lane)));
            }
        }
    }
    (r, None)
}

#[test]
fn each_rows_and_columns_canary_is_caught_where_planted_and_only_on_its_axis() {
    use memra_runtime::Canary;
    let m = model("tiny");
    for tp in [1, 2] {
        // A K order chosen by the batch: caught at the o_join of the first two-row pass.
        let (r, d) = planted(m, Canary::BatchKSplit, tp, shape(2, 1));
        let (p, st, l, seam, (pass, _)) = d.expect("the batch K split must diverge");
        assert_eq!((l, seam), (0, "o_join"), "TP{tp}: prompt {p} step {st}");
        assert!(pass >= 1 && r.engaged.get("canary_batch_ksplit.reversed_folds").copied().unwrap_or(0) > 0);
        // A neighbour's session: the second prompt's first step, its attn seam, row 1.
        let (_, d) = planted(m, Canary::NeighbourSession, tp, shape(4, 1));
        assert_eq!(d.map(|d| (d.0, d.1, d.2, d.3, d.4 .1)), Some((1, 0, 0, "attn", 1)), "TP{tp}");
        // Partitions chosen by T: the attn seam of a verify or prefill column.
        let (r, d) = planted(m, Canary::VerifyPartitions, tp, shape(1, 4));
        let (p, _, _, seam, (pass, _)) = d.expect("the T-dependent partitions must diverge");
        assert_eq!(seam, "attn", "TP{tp}");
        let columns_in_pass = r.lanes[p].iter().filter(|&&(q, _)| q == pass).count();
        assert!(columns_in_pass > 1, "TP{tp}: diverged in a pass of {columns_in_pass} column(s)");
    }
    // Off their axis the planted defects never fire: single-token passes equal the oracle.
    for c in [Canary::BatchKSplit, Canary::NeighbourSession, Canary::VerifyPartitions] {
        let (r, d) = planted(m, c, 2, PassShape::SINGLE);
        assert_eq!(d, None, "{c:?} fired in single-token decode");
        assert!(r.engaged.keys().all(|k| !k.starts_with(c.id())), "{c:?}: {:?}", r.engaged);
    }
}

/// A run of `shape` with the doors `ids` on (by registry id).
fn with_doors(m: &Model, tp: usize, t: Transport, s: PassShape, ids: &[&str]) -> Record {
    let mut cfg = RunConfig::new(tp, t, battery(m.config.vocab)).unwrap();
    cfg.pass = s;
    for id in ids {
        let door =
            memra_runtime::Door::ALL.into_iter().find(|d| d.id() == *id).unwrap_or_else(|| panic!("no door {id}"));
        cfg.doors.set(door, true);
    }
    let mut b = HostBackend::new(tp).unwrap();
    program::run(m, &cfg, &mut b).unwrap_or_else(|e| panic!("{ids:?} TP{tp} {s:?}: {e}"))
}

#[test]
fn the_rows_and_columns_doors_keep_every_bit_and_engage_only_on_their_axis() {
    let m = model("edge");
    let oracle = run(m, 1, Transport::HostBounce, PassShape::SINGLE, None);
    // (doors, shape, the census kernel that must appear, the engagement counter)
    let cases: [(&[&str], PassShape, &str, &str); 5] = [
        (&["f32_mirror", "decode_v2"], shape(4, 1), "attention_rows", "decode_v2.row_attention"),
        (&["f32_mirror", "decode_v2"], shape(1, 8), "attention_rows", "decode_v2.row_attention"),
        (&["tcol_oproj"], shape(1, 4), "fold_lanes", "tcol_oproj.column_joins"),
        (&["dcw", "tcol_oproj", "spec_fa2"], shape(1, 2), "attention_cols_walk_once", "spec_fa2.shared_walks"),
        (&["dcw"], shape(2, 1), "inc_u32", "dcw.device_increments"),
    ];
    for (ids, s, kernel, counter) in cases {
        for (tp, t) in [(1, Transport::HostBounce), (2, Transport::NativeP2p), (4, Transport::NativeP2p)] {
            let r = with_doors(m, tp, t, s, ids);
            assert_eq!(first_divergence(&oracle, &r), None, "{ids:?} TP{tp} {s:?}");
            assert!(
                r.engaged.get(counter).copied().unwrap_or(0) > 0,
                "{ids:?} {s:?}: {counter} never counted: {:?}",
                r.engaged
            );
            let launched: u64 =
                r.census.iter().filter(|(k, _)| k.starts_with("launch.") && k.ends_with(kernel)).map(|(_, n)| n).sum();
            assert!(
                launched > 0,
                "{ids:?} {s:?}: no {kernel} launch in the census {:?}",
                r.census.keys().collect::<Vec<_>>()
            );
        }
        // In single-token decode a multi-lane mechanism has nothing to do; DCW's counter advances
        // single-token steps as well, and must keep every bit there too.
        let r = with_doors(m, 2, Transport::NativeP2p, PassShape::SINGLE, ids);
        if counter == "dcw.device_increments" {
            assert_eq!(first_divergence(&oracle, &r), None, "DCW in single-token decode");
            assert!(r.engaged.get(counter).copied().unwrap_or(0) > 0, "DCW idle in single-token decode");
        } else {
            assert_eq!(r.engaged.get(counter), None, "{ids:?} engaged in single-token decode");
        }
    }
}

fn local_copies(r: &Record) -> u64 {
    r.census.iter().filter(|(k, _)| k.starts_with("copy.local.")).map(|(_, n)| n).sum()
}

/// LEN_MIRROR_LAZY: in single-token decode and rows the per-layer length copies are removed
/// (fewer `copy.local.*` in the census, its registry witness) and every bit is kept; in a
/// columns run, whose verify/prefill passes read the mirrors, the door yields: the census is the
/// door-off one (a run gated there would be VOID) and the bits are kept as well.
#[test]
fn len_mirror_lazy_skips_only_copies_no_later_pass_reads() {
    let m = model("edge");
    let oracle = run(m, 1, Transport::HostBounce, PassShape::SINGLE, None);
    for (tp, t) in [(1, Transport::HostBounce), (2, Transport::NativeP2p), (4, Transport::HostBounce)] {
        for s in [PassShape::SINGLE, shape(4, 1), shape(1, 4)] {
            let off = with_doors(m, tp, t, s, &[]);
            let on = with_doors(m, tp, t, s, &["len_mirror_lazy"]);
            assert_eq!(first_divergence(&oracle, &on), None, "TP{tp} {s:?}");
            let skipped = on.engaged.get("len_mirror_lazy.skipped_copies").copied().unwrap_or(0);
            if s.columns > 1 {
                assert_eq!(on.census, off.census, "TP{tp} {s:?}: the door must yield to the verify reader");
                assert_eq!(skipped, 0, "TP{tp} {s:?}");
            } else {
                // Every layer's copy on every rank, once per pass.
                let layers = m.config.layers as u64;
                assert!(local_copies(&on) < local_copies(&off), "TP{tp} {s:?}: {:?}", on.census);
                assert_eq!(local_copies(&off) - local_copies(&on), skipped, "TP{tp} {s:?}");
                assert_eq!(skipped % (layers * tp as u64), 0, "TP{tp} {s:?}: {skipped} skipped");
            }
        }
    }
}

/// The reader the door yields to, with its negative control: a columns run whose length-mirror
/// copies are dropped (what LEN_MIRROR_LAZY would do if it did not yield) is refused at its
/// first verify/prefill pass after the first, naming the layer, rank and lane of the stale
/// mirror; the same run without the drop completes.
#[test]
fn a_verify_pass_refuses_a_skipped_length_mirror() {
    use crate::segments::SegmentChecker;
    let m = model("tiny");
    for drop in [false, true] {
        let mut cfg = RunConfig::new(2, Transport::NativeP2p, battery(m.config.vocab)).unwrap();
        cfg.pass = shape(1, 2);
        let mut b = SegmentChecker::new(HostBackend::new(2).unwrap());
        b.drop_length_copies = drop;
        let got = program::run(m, &cfg, &mut b);
        match (drop, got) {
            (false, r) => assert!(r.is_ok(), "{:?}", r.err()),
            (true, Ok(_)) => panic!("a stale length mirror was read and not refused"),
            (true, Err(e)) => {
                let e = e.to_string();
                assert!(e.contains("layer 0 rank 0 lane 0") && e.contains("KV length mirror"), "{e}");
            }
        }
    }
}
