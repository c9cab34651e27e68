//! The GRAPH door's program path on the host (the CUDA capture itself is tested in
//! `gpu/cuda_graph.rs`): the step reads the decode position and the route from device memory, so the
//! whole step is one segment that must issue the identical call sequence at every token (per-layer
//! attention-half segments where MOE_DIRECT on expert-parallel owners reads the route on the
//! host), and the result must equal the oracle bit for bit. A frozen position (the defect of a
//! graph that replays a stale position) must be caught.

use crate::segments::SegmentChecker;
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{capability, Backend, Op, Slice};
use memra_runtime::evidence::record::Record;
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, RunConfig, RuntimeError, Transport};
use std::sync::OnceLock;

fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap())
}

fn battery() -> Battery {
    Battery { prompts: vec![vec![3, 141, 59], vec![26, 535]], gen_tokens: 3 }
}

fn total_steps(b: &Battery) -> u64 {
    (0..b.prompts.len()).map(|p| b.steps_of(p) as u64).sum()
}

fn oracle() -> &'static Record {
    static ORACLE: OnceLock<Record> = OnceLock::new();
    ORACLE.get_or_init(|| {
        let cfg = RunConfig::new(1, Transport::HostBounce, battery()).unwrap();
        program::run(tiny(), &cfg, &mut HostBackend::new(1).unwrap()).unwrap()
    })
}

fn graph_cfg(tp: usize, t: Transport) -> RunConfig {
    let mut cfg = RunConfig::new(tp, t, battery()).unwrap();
    cfg.doors.graph = true;
    cfg
}

fn first_diff(a: &Record, b: &Record) -> Option<(usize, usize, String)> {
    for (p, (ra, rb)) in a.digests.iter().zip(&b.digests).enumerate() {
        for (s, (da, db)) in ra.iter().zip(rb).enumerate() {
            if let Some(i) = da.iter().zip(db).position(|(x, y)| x != y) {
                let (l, seam) = Record::seam_at(a.n_layers, i);
                return Some((p, s, format!("layer {l} {}", seam.name())));
            }
        }
    }
    None
}

#[test]
fn graph_program_path_equals_the_oracle_and_repeats_its_segments_exactly() {
    let layers = tiny().config.layers as u64;
    for tp in [1, 2, 4, 8] {
        for t in [Transport::HostBounce, Transport::NativeP2p] {
            let mut b = SegmentChecker::new(HostBackend::new(tp).unwrap());
            let r = program::run(tiny(), &graph_cfg(tp, t), &mut b).unwrap();
            assert_eq!(first_diff(oracle(), &r), None, "TP{tp} {t:?} with the graph path");
            assert_eq!(r.tokens, oracle().tokens, "TP{tp} {t:?}: token tape");
            assert_eq!(b.mismatches, Vec::<String>::new(), "TP{tp} {t:?}: a segment changed between passes");
            // One pass per step (the whole step is one segment): with ≥ 3 steps it is replayed.
            assert_eq!(b.passes, total_steps(&battery()), "TP{tp} {t:?}: segment passes");
        }
    }
    // MOE_DIRECT on expert-parallel owners reads the route on the host: the attention halves
    // stay segments of their own, the MoE halves eager.
    for tp in [2, 4] {
        let mut cfg = graph_cfg(tp, Transport::NativeP2p);
        (cfg.doors.step_ep, cfg.doors.moe_direct) = (true, true);
        let mut b = SegmentChecker::new(HostBackend::new(tp).unwrap());
        let r = program::run(tiny(), &cfg, &mut b).unwrap();
        assert_eq!(first_diff(oracle(), &r), None, "TP{tp} step_ep + moe_direct with the graph path");
        assert_eq!(b.mismatches, Vec::<String>::new(), "TP{tp} step_ep + moe_direct: a segment changed");
        assert_eq!(b.passes, layers * total_steps(&battery()), "TP{tp} step_ep + moe_direct: segment passes");
    }
}

#[test]
fn graph_program_path_with_the_direct_joins_equals_the_oracle() {
    for tp in [2, 4, 8] {
        let mut cfg = graph_cfg(tp, Transport::NativeP2p);
        (cfg.doors.oproj_direct, cfg.doors.oproj_tail, cfg.doors.moe_direct) = (true, true, true);
        let mut b = SegmentChecker::new(HostBackend::new(tp).unwrap());
        let r = program::run(tiny(), &cfg, &mut b).unwrap();
        assert_eq!(first_diff(oracle(), &r), None, "TP{tp} graph path + direct joins");
        assert_eq!(b.mismatches, Vec::<String>::new(), "TP{tp}: a segment changed between passes");
        assert!(r.engaged.get("oproj_direct.peer_stores").is_some_and(|n| *n > 0), "TP{tp}: {:?}", r.engaged);
    }
}

#[test]
fn a_frozen_device_position_is_caught() {
    // Positions stop advancing after the 2nd token: exactly what a graph that captured the
    // position instead of reading it would do.
    let mut b = SegmentChecker::new(HostBackend::new(2).unwrap());
    b.freeze_position_after = Some(2);
    let r = program::run(tiny(), &graph_cfg(2, Transport::NativeP2p), &mut b).unwrap();
    let d = first_diff(oracle(), &r);
    assert_eq!(d.as_ref().map(|d| (d.0, d.1)), Some((0, 2)), "the stale position must show at prompt 0 step 2: {d:?}");
    assert!(d.unwrap().2.ends_with("rope"), "the first seam reading the position is rope");
}

#[test]
fn the_host_backend_refuses_graph_segments() {
    let mut b = HostBackend::new(2).unwrap();
    let e = capability::graphs(&mut b).map(|_| ()).expect_err("the host backend has no graphs");
    assert!(matches!(&e, RuntimeError::Unsupported { mechanism: "graph capture", .. }), "{e:?}");
    assert!(e.to_string().contains("cannot capture graphs"), "{e}");
    // And the program fails loudly instead of running the eager path under the door's name.
    let e = program::run(tiny(), &graph_cfg(2, Transport::HostBounce), &mut b).expect_err("must refuse");
    assert!(e.to_string().contains("MEMRA_STEP_TP_GRAPH"), "{e}");
}

#[test]
fn position_ops_write_nothing_outside_the_cache() {
    let mut b = HostBackend::new(1).unwrap();
    let n = 256;
    let cache = Slice::new(b.alloc(0, 4 * n).unwrap(), 0, 4 * n);
    let src = Slice::new(b.alloc(0, n).unwrap(), 0, n);
    let pos = Slice::new(b.alloc(0, 1).unwrap(), 0, 1);
    let row: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
    b.write(0, src, &row).unwrap();
    for (p, lands) in [(3u32, true), (4, false), (u32::MAX, false)] {
        b.write(0, cache, &vec![-1.0; 4 * n]).unwrap();
        b.launch(0, Op::SetU32 { out: pos, value: p }).unwrap();
        b.launch(0, Op::AppendAt { src, cache, pos }).unwrap();
        let got = b.read(0, cache).unwrap();
        let written = got.iter().filter(|v| **v != -1.0).count();
        assert_eq!(written, if lands { n } else { 0 }, "position {p}");
        if lands {
            assert_eq!(&got[3 * n..], &row[..]);
        }
    }
}
