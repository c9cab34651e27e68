//! The pool of prepared CUDA backends (`memra_runtime::program::pool`, what every CUDA run of a
//! plan goes through): a backend reused run after run, rewound between runs, and used from
//! several threads at once (the pool is shared by a suite's workers; the runs share the process's
//! context of the device), must give exactly the run made alone on a fresh backend — digests,
//! tokens, top-2 logits, census, engagement and verified copies — whatever ran before it on that
//! backend and whatever the other threads issue meanwhile.
//!
//! Without a CUDA device the test reads `ignored (no CUDA device: …)`.

use crate::cases::CO_RESIDENT;
use crate::harness::{cuda_backend, GpuTest, Ran, Skip};
use crate::same_record::assert_same_record;
use memra_runtime::backend::{BackendKind, OpenOptions};
use memra_runtime::evidence::record::Record;
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::program::pool::{Budget, Pool};
use memra_runtime::{program, Battery, DoorSet, RunConfig, Transport};

pub fn tests() -> Vec<GpuTest> {
    vec![GpuTest::new("concurrent_pooled_runs_equal_fresh_runs_alone", concurrent_pooled_runs_equal_fresh_runs_alone)]
}

/// Threads at once; each runs every configuration twice, starting at its own.
const THREADS: usize = 8;

fn configs() -> Vec<RunConfig> {
    let battery = Battery { prompts: vec![vec![3, 1, 4, 1], vec![5, 9], vec![2, 7, 1]], gen_tokens: 4 };
    let mut out = Vec::new();
    for (tp, transport, doors) in [
        (1, Transport::HostBounce, DoorSet::default()),
        (2, Transport::HostBounce, DoorSet::default()),
        (2, Transport::NativeP2p, DoorSet { oproj_direct: true, moe_direct: true, ..DoorSet::default() }),
        (4, Transport::NativeP2p, DoorSet { moe_direct: true, fence_memops: true, ..DoorSet::default() }),
        (4, Transport::NativeP2p, DoorSet { graph: true, ..DoorSet::default() }),
        (8, Transport::NativeP2p, DoorSet { step_ep: true, ..DoorSet::default() }),
        (2, Transport::NativeP2p, DoorSet { qkv_fused: true, dev_router: true, ..DoorSet::default() }),
        (8, Transport::HostBounce, DoorSet { f32_mirror: true, ..DoorSet::default() }),
    ] {
        let mut cfg = RunConfig::new(tp, transport, battery.clone()).unwrap();
        cfg.doors = doors;
        out.push(cfg);
    }
    out
}

fn what(cfg: &RunConfig) -> String {
    format!("TP{} {:?} {:?}", cfg.tp, cfg.transport, cfg.doors)
}

fn fresh(model: &Model, cfg: &RunConfig) -> Result<Record, Skip> {
    let mut b = cuda_backend(cfg.tp.get(), CO_RESIDENT)?;
    Ok(program::run(model, cfg, &mut b).unwrap_or_else(|e| panic!("{} alone: {e}", what(cfg))))
}

fn concurrent_pooled_runs_equal_fresh_runs_alone() -> Ran {
    let model = generate(&ModelConfig::preset("tiny", None).unwrap(), 1).unwrap();
    let configs = configs();
    let alone: Vec<Record> = configs.iter().map(|c| fresh(&model, c)).collect::<Result<_, _>>()?;
    let pool = Pool::new(Budget::for_this_machine());
    let open = OpenOptions::default();
    let runs: Vec<Vec<(usize, Record)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (pool, model, configs, open) = (&pool, &model, &configs, &open);
                s.spawn(move || {
                    (0..2 * configs.len())
                        .map(|k| {
                            let i = (t + k) % configs.len();
                            let (r, _) = pool
                                .run(model, &configs[i], BackendKind::Cuda, open)
                                .unwrap_or_else(|e| panic!("{} on thread {t}: {e}", what(&configs[i])));
                            (i, r)
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a run thread panicked")).collect()
    });
    for (t, thread) in runs.iter().enumerate() {
        for (k, (i, r)) in thread.iter().enumerate() {
            let what = format!("{} (thread {t}, run {k})", what(&configs[*i]));
            assert_same_record(&what, r, &alone[*i]);
            assert!(r.copy_faults.is_empty(), "{what}: copy faults {:?}", r.copy_faults);
        }
    }
    assert!(pool.prepares() < (THREADS * 2 * configs.len()) as u64, "the pool reused no backend");
    Ok(())
}
