//! Weights placed once and run many times (docs/DESIGN.md §8): a run on a prepared, rewound
//! backend gives the record of a run on a fresh one — digests, tokens, logits, engagement, census,
//! captures and copies — whatever ran on it before; the pool prepares each (backend, options, layout) once;
//! and the refusals: another layout, another model, a backend that cannot rewind.

use crate::same_record::assert_same_record;
use memra_runtime::backend::dist::memory::{MemoryHub, MemoryMover};
use memra_runtime::backend::dist::{DistBackend, ProcessLayout, ProcessSpec};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{Backend, BackendKind, OpenOptions};
use memra_runtime::evidence::record::{CaptureKey, Record, Seam};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::program::pool::{Budget, Pool};
use memra_runtime::program::{self, Layout};
use memra_runtime::{Battery, Canary, ExpertFormat, RunConfig, Transport};
use std::sync::OnceLock;
use std::time::Duration;

fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap())
}

fn battery() -> Battery {
    Battery { prompts: vec![vec![3, 141, 59], vec![26, 535]], gen_tokens: 3 }
}

fn config(tp: usize, transport: Transport, edit: impl FnOnce(&mut RunConfig)) -> RunConfig {
    let mut cfg = RunConfig::new(tp, transport, battery()).unwrap();
    edit(&mut cfg);
    cfg
}

/// Configurations that share layouts, change per-run state (captures, canaries, F32 mirror
/// counters) or need layouts of their own (EP, NVFP4).
fn configs() -> Vec<(&'static str, RunConfig)> {
    let key = CaptureKey { prompt: 1, step: 2, layer: 1, seam: Seam::OJoin };
    vec![
        ("TP1 host-bounce", config(1, Transport::HostBounce, |_| {})),
        ("TP2 native-p2p", config(2, Transport::NativeP2p, |_| {})),
        ("TP2 capture", config(2, Transport::HostBounce, |c| c.capture = vec![key])),
        ("TP2 stale canary", config(2, Transport::HostBounce, |c| c.doors.canary = Some(Canary::StaleBuffer))),
        ("TP2 F32 mirror", config(2, Transport::HostBounce, |c| c.doors.f32_mirror = true)),
        ("TP4 EP", config(4, Transport::NativeP2p, |c| c.doors.step_ep = true)),
        ("TP2 NVFP4 experts", config(2, Transport::HostBounce, |c| c.expert_format = ExpertFormat::Nvfp4)),
        ("TP2 host-bounce", config(2, Transport::HostBounce, |_| {})),
    ]
}

fn fresh(cfg: &RunConfig) -> Record {
    let mut b = HostBackend::new(cfg.tp.get()).unwrap();
    program::run(tiny(), cfg, &mut b).unwrap()
}

#[test]
fn pooled_runs_equal_fresh_runs_whatever_ran_before() {
    let pool = Pool::new(Budget { host_bytes: u64::MAX, device_bytes: 0, max_idle: 32 });
    let cfgs = configs();
    let want: Vec<Record> = cfgs.iter().map(|(_, c)| fresh(c)).collect();
    // Twice through, the second time backwards: every run follows some other run on its entry.
    let order: Vec<usize> = (0..cfgs.len()).chain((0..cfgs.len()).rev()).collect();
    for i in order {
        let (name, cfg) = &cfgs[i];
        let (got, times) = pool.run(tiny(), cfg, BackendKind::Host, &OpenOptions::default()).unwrap();
        assert_same_record(name, &got, &want[i]);
        assert!(times.run_ms > 0.0, "{name}: the run was timed");
    }
    let layouts: std::collections::HashSet<Layout> = cfgs.iter().map(|(_, c)| Layout::of(c)).collect();
    assert_eq!(layouts.len(), 5, "TP1, TP2, TP2 F32 mirror, TP4 EP, TP2 NVFP4");
    assert_eq!(pool.prepares(), layouts.len() as u64, "one upload per layout, 16 runs");
    // The canary and the counters are per run: the stale canary really read a stale buffer, and
    // the F32 mirror's widenings are counted once per run, not accumulated.
    assert!(want[3].engaged.get("canary_stale_buffer.stale_reads").copied().unwrap_or(0) > 0);
    assert!(want[4].engaged.get("f32_mirror.widened_matrices").copied().unwrap_or(0) > 0);
}

#[test]
fn rewind_frees_the_run_buffers() {
    let cfg = config(2, Transport::HostBounce, |_| {});
    let mut b = HostBackend::new(2).unwrap();
    let prepared = program::prepare(tiny(), Layout::of(&cfg), &mut b).unwrap();
    let after_upload = b.checkpoint().unwrap();
    program::run_prepared(tiny(), &cfg, &mut b, &prepared).unwrap();
    let after_one = b.checkpoint().unwrap();
    assert!(after_one.buffers.iter().zip(&after_upload.buffers).all(|(a, u)| a > u), "a run allocates buffers");
    for _ in 0..3 {
        program::run_prepared(tiny(), &cfg, &mut b, &prepared).unwrap();
    }
    assert_eq!(b.checkpoint().unwrap(), after_one, "each run starts from the upload: buffers do not pile up");
    b.rewind(&after_upload).unwrap();
    assert_eq!(b.checkpoint().unwrap(), after_upload);
}

#[test]
fn another_layout_model_or_a_backend_that_cannot_rewind_is_refused() {
    let cfg = config(2, Transport::HostBounce, |_| {});
    let mut b = HostBackend::new(2).unwrap();
    let prepared = program::prepare(tiny(), Layout::of(&cfg), &mut b).unwrap();
    let mirror = config(2, Transport::HostBounce, |c| c.doors.f32_mirror = true);
    let e = program::run_prepared(tiny(), &mirror, &mut b, &prepared).unwrap_err().to_string();
    assert!(e.contains("f32_mirror: true") && e.contains("prepared as"), "{e}");

    let pool = Pool::new(Budget { host_bytes: u64::MAX, device_bytes: 0, max_idle: 4 });
    pool.run(tiny(), &cfg, BackendKind::Host, &OpenOptions::default()).unwrap();
    let other = generate(&ModelConfig::preset("tiny", None).unwrap(), 8).unwrap();
    let e = pool.run(&other, &cfg, BackendKind::Host, &OpenOptions::default()).unwrap_err().to_string();
    assert!(e.contains("another model needs a pool of its own"), "{e}");

    let layout = ProcessLayout::new(2, ProcessSpec { process: 0, processes: 1 }).unwrap();
    let mover = MemoryMover::new(MemoryHub::new(), layout, Duration::from_secs(5));
    let mut d = DistBackend::new(layout, HostBackend::new(2).unwrap(), mover, None).unwrap();
    let prepared = program::prepare(tiny(), Layout::of(&cfg), &mut d).unwrap();
    let first = program::run_prepared(tiny(), &cfg, &mut d, &prepared).unwrap();
    assert_same_record("distributed, one process", &first, &fresh(&cfg));
    let e = program::run_prepared(tiny(), &cfg, &mut d, &prepared).unwrap_err().to_string();
    assert!(e.contains("cannot rewind"), "{e}");
}

#[test]
fn the_pool_keeps_idle_entries_within_its_budget() {
    let one = {
        let mut b = HostBackend::new(1).unwrap();
        program::prepare(tiny(), Layout::of(&config(1, Transport::HostBounce, |_| {})), &mut b).unwrap().bytes()
    };
    // Room for one entry: the TP2 upload (same bytes) pushes the TP1 one out.
    let pool = Pool::new(Budget { host_bytes: one + one / 2, device_bytes: 0, max_idle: 8 });
    let run =
        |tp| pool.run(tiny(), &config(tp, Transport::HostBounce, |_| {}), BackendKind::Host, &OpenOptions::default());
    assert!(!run(1).unwrap().1.reused);
    assert!(run(1).unwrap().1.reused, "the TP1 entry was kept");
    assert!(!run(2).unwrap().1.reused);
    assert_eq!(pool.idle(), 1, "the budget holds one entry");
    assert!(!run(1).unwrap().1.reused, "TP1 was evicted for TP2");
    assert_eq!(pool.prepares(), 3);
}
