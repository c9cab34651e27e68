//! Rows and columns on a device (docs/DESIGN.md §3.6): the device-host gate on passes of several
//! rows or columns — every lane of a CUDA run equals the host oracle's single-token decode, seam
//! for seam, at co-resident TP1/2/4, with the rows-and-columns doors on (whose kernels serve
//! several lanes per launch: `decode_attention_rows_f32`, `decode_attention_cols2_f32`,
//! `fold_lanes_f32`, `inc_u32`; LEN_MIRROR_LAZY's skipped length copies, and in every columns
//! case the verify/prefill read of the device's length mirrors) and with the device census equal
//! to the host's; and each rows and columns canary diverges on the device exactly where it does on
//! the host.
//!
//! Without a CUDA device every test reads `ignored (no CUDA device: …)`.

use crate::cases::CO_RESIDENT;
use crate::harness::{cuda_backend, GpuTest, NotRun, Ran};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::evidence::record::Record;
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, Canary, Door, PassShape, RunConfig, RuntimeError, Transport};
use std::sync::OnceLock;

pub fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest::new("rows_and_columns_equal_the_host_oracle", rows_and_columns_equal_the_host_oracle),
        GpuTest::new("rows_and_columns_canaries_diverge_as_on_the_host", canaries_diverge_as_on_the_host),
        GpuTest::new("step_rows_and_columns_device_host_gate", step_rows_and_columns_device_host_gate),
    ]
}


fn model(preset: &str) -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    static EDGE: OnceLock<Model> = OnceLock::new();
    let cell = if preset == "edge" { &EDGE } else { &TINY };
    cell.get_or_init(|| generate(&ModelConfig::preset(preset, None).unwrap(), 1).unwrap())
}

fn battery(vocab: usize) -> Battery {
    let p = |v: &[u32]| v.iter().map(|t| t % vocab as u32).collect::<Vec<u32>>();
    Battery { prompts: vec![p(&[3, 1, 4, 1, 5]), p(&[9, 2]), p(&[6, 5, 3, 5, 8, 9]), p(&[7])], gen_tokens: 4 }
}

fn config(preset: &str, tp: usize, shape: PassShape, doors: &[&str], canary: Option<Canary>) -> RunConfig {
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery(model(preset).config.vocab)).unwrap();
    cfg.pass = shape;
    for id in doors {
        cfg.doors.set(Door::ALL.into_iter().find(|d| d.id() == *id).expect("a registry door"), true);
    }
    cfg.doors.canary = canary;
    cfg
}

/// The host oracle (TP1, single-token) and a CUDA run of `cfg`; `None` after noting a run the
/// machine cannot make.
fn pair(preset: &str, cfg: &RunConfig, not_run: &mut NotRun) -> Result<Option<(Record, Record)>, crate::harness::Skip> {
    let oracle_cfg = config(preset, 1, PassShape::SINGLE, &[], None);
    let oracle = program::run(model(preset), &oracle_cfg, &mut HostBackend::new(1).unwrap()).unwrap();
    let mut b = cuda_backend(cfg.tp.get(), CO_RESIDENT)?;
    match program::run(model(preset), cfg, &mut b) {
        Ok(r) => Ok(Some((oracle, r))),
        Err(RuntimeError::Unavailable(reason)) => {
            not_run.note(format!("{preset} TP{} {:?}", cfg.tp, cfg.pass), reason);
            Ok(None)
        }
        Err(e) => panic!("{preset} TP{} {:?} {:?}: CUDA run failed: {e}", cfg.tp, cfg.pass, cfg.doors),
    }
}

/// The first (prompt, step, seam index) where two records' digests differ.
fn first_diff(a: &Record, b: &Record) -> Option<(usize, usize, usize)> {
    for (p, (ra, rb)) in a.digests.iter().zip(&b.digests).enumerate() {
        for (s, (da, db)) in ra.iter().zip(rb).enumerate() {
            if let Some(i) = da.iter().zip(db).position(|(x, y)| x != y) {
                return Some((p, s, i));
            }
        }
    }
    None
}

fn shape(b: usize, t: usize) -> PassShape {
    PassShape::new(b, t).unwrap()
}

fn rows_and_columns_equal_the_host_oracle() -> Ran {
    let mut not_run = NotRun::new();
    let cases: [(PassShape, &[&str]); 9] = [
        (shape(2, 1), &[]),
        (shape(4, 1), &["len_mirror_lazy"]),
        (shape(8, 1), &[]),
        (shape(4, 1), &["f32_mirror", "decode_v2", "dcw"]),
        (shape(1, 2), &["dcw", "tcol_oproj", "spec_fa2"]),
        (shape(1, 4), &[]),
        (shape(1, 8), &["f32_mirror", "decode_v2", "tcol_oproj"]),
        (shape(1, 4), &["dcw", "tcol_oproj"]),
        (shape(2, 1), &["oproj_direct", "oproj_tail", "moe_direct"]),
    ];
    for preset in ["tiny", "edge"] {
        for tp in [1, 2, 4] {
            for (s, doors) in cases {
                let peers = doors.iter().any(|d| d.contains("direct") || d.contains("tail"));
                if peers && tp == 1 {
                    continue;
                }
                let cfg = config(preset, tp, s, doors, None);
                let Some((oracle, cuda)) = pair(preset, &cfg, &mut not_run)? else { continue };
                assert_eq!(first_diff(&oracle, &cuda), None, "{preset} TP{tp} {s:?} {doors:?}: device ≠ host oracle");
                assert_eq!((&cuda.tokens, &cuda.top2), (&oracle.tokens, &oracle.top2), "{preset} TP{tp} {s:?} {doors:?}");
                // The same run on the host counts the same launches and copies.
                let host = program::run(model(preset), &cfg, &mut HostBackend::new(tp).unwrap()).unwrap();
                assert_eq!(cuda.census, host.census, "{preset} TP{tp} {s:?} {doors:?}: census");
                assert!(cuda.lanes.iter().flatten().any(|&(_, lane)| lane > 0), "{preset} {s:?}: no lane beyond 0 ran");
                not_run.ran();
            }
        }
    }
    not_run.finish()
}

fn canaries_diverge_as_on_the_host() -> Ran {
    let mut not_run = NotRun::new();
    let cases = [
        (Canary::BatchKSplit, shape(4, 1)),
        (Canary::NeighbourSession, shape(4, 1)),
        (Canary::VerifyPartitions, shape(1, 4)),
    ];
    for tp in [1, 2] {
        for (c, s) in cases {
            let cfg = config("edge", tp, s, &[], Some(c));
            let Some((oracle, cuda)) = pair("edge", &cfg, &mut not_run)? else { continue };
            let host = program::run(model("edge"), &cfg, &mut HostBackend::new(tp).unwrap()).unwrap();
            let (d_cuda, d_host) = (first_diff(&oracle, &cuda), first_diff(&oracle, &host));
            assert!(d_cuda.is_some(), "{c:?} TP{tp}: the planted defect did not show on the device");
            assert_eq!(d_cuda, d_host, "{c:?} TP{tp}: the device diverges elsewhere than the host");
            assert_eq!(cuda.digests, host.digests, "{c:?} TP{tp}: device ≠ host with the defect planted");
            not_run.ran();
        }
    }
    not_run.finish()
}

/// The `step` preset (one layer; MEMRA_GPU_STEP=1): rows and columns on the device against the
/// host's single-token oracle, with the multi-lane doors.
fn step_rows_and_columns_device_host_gate() -> Ran {
    if std::env::var("MEMRA_GPU_STEP").as_deref() != Ok("1") {
        return Err(crate::harness::Skip::NotRequested("set MEMRA_GPU_STEP=1 to run the step-preset rows and columns gate".into()));
    }
    let m = generate(&ModelConfig::preset("step", Some(1)).unwrap(), 11).unwrap();
    let battery = Battery { prompts: vec![vec![5, 77, 9], vec![12], vec![300, 2]], gen_tokens: 3 };
    let cfg = |tp: usize, s: PassShape, doors: &[&str]| {
        let mut c = RunConfig::new(tp, Transport::NativeP2p, battery.clone()).unwrap();
        c.pass = s;
        for id in doors {
            c.doors.set(Door::ALL.into_iter().find(|d| d.id() == *id).expect("a registry door"), true);
        }
        c
    };
    let t0 = std::time::Instant::now();
    let oracle = program::run(&m, &cfg(1, PassShape::SINGLE, &[]), &mut HostBackend::new(1).unwrap()).unwrap();
    println!("step host oracle in {:.1}s", t0.elapsed().as_secs_f64());
    let cases: [(usize, PassShape, &[&str]); 5] = [
        (1, shape(4, 1), &[]),
        (1, shape(4, 1), &["f32_mirror", "decode_v2", "dcw"]),
        (1, shape(1, 2), &["dcw", "tcol_oproj", "spec_fa2"]),
        (2, shape(1, 4), &["tcol_oproj"]),
        (4, shape(2, 1), &[]),
    ];
    for (tp, s, doors) in cases {
        let mut b = cuda_backend(tp, CO_RESIDENT)?;
        let r = program::run(&m, &cfg(tp, s, doors), &mut b).unwrap_or_else(|e| panic!("step TP{tp} {s:?} {doors:?}: {e}"));
        assert_eq!(first_diff(&oracle, &r), None, "step TP{tp} {s:?} {doors:?}: device ≠ host oracle");
        assert_eq!(r.tokens, oracle.tokens, "step TP{tp} {s:?} {doors:?}");
        println!("ok step TP{tp} {s:?} {doors:?}");
    }
    Ok(())
}
