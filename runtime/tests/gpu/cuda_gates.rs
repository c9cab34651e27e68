//! Issue 11's evidence on a device:
//! - the CUDA backend's census is the host backend's, name for name and count for count, for the
//!   same run (the two count exactly alike, `backend::census`), on tiny and edge, with and without
//!   the doors that change what is issued; under GRAPH the replayed calls are not issued one by
//!   one and `graph_replay` counts the replays;
//! - the edge model, built to reach every special path, runs on the device bit-identical to the
//!   host oracle at TP1 (the device-host gate's claim on the paths the host twins count), and
//!   bit-identical across TP sizes with every cross-rank copy verified;
//! - a broken broadcast is named at the copy on the device too;
//! - the byte-integrity probe passes from one 4-byte word up over every transport the machine has.
//!
//! Without a CUDA device every test reads `ignored (no CUDA device: …)`.

use crate::cases::CO_RESIDENT;
use crate::harness::{cuda_backend, GpuTest, NotRun, Ran};
use memra_runtime::backend::cuda::{CudaOptions, PlacementPolicy};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{Backend, PROBE_SIZES_BYTES};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::evidence::record::{CopyFault, Record, Seam};
use memra_runtime::{program, Battery, Canary, DoorSet, RunConfig, RuntimeError, Transport};
use std::sync::OnceLock;

pub fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest::new("census_equals_the_host_census", census_equals_the_host_census),
        GpuTest::new("graph_replays_are_counted_instead_of_their_calls", graph_replays_are_counted),
        GpuTest::new("edge_model_equals_the_host_oracle_at_every_tp", edge_model_equals_the_host_oracle),
        GpuTest::new("broken_broadcast_is_named_at_the_copy", broken_broadcast_is_named_at_the_copy),
        GpuTest::new("probe_passes_from_one_word_over_every_transport", probe_passes_from_one_word),
    ]
}


fn model(preset: &str) -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    static EDGE: OnceLock<Model> = OnceLock::new();
    let cell = if preset == "edge" { &EDGE } else { &TINY };
    cell.get_or_init(|| generate(&ModelConfig::preset(preset, None).unwrap(), 1).unwrap())
}

fn battery() -> Battery {
    Battery { prompts: vec![vec![3, 1, 4, 1], vec![5, 9]], gen_tokens: 3 }
}

fn config(tp: usize, transport: Transport, doors: DoorSet) -> RunConfig {
    let mut cfg = RunConfig::new(tp, transport, battery()).unwrap();
    cfg.doors = doors;
    cfg
}

/// Run on the host and on CUDA (co-resident); `None` after noting a run the machine cannot make.
fn both(preset: &str, cfg: &RunConfig, not_run: &mut NotRun) -> Result<Option<(Record, Record)>, crate::harness::Skip> {
    let host = program::run(model(preset), cfg, &mut HostBackend::new(cfg.tp.get()).unwrap()).unwrap();
    let mut b = cuda_backend(cfg.tp.get(), CO_RESIDENT)?;
    match program::run(model(preset), cfg, &mut b) {
        Ok(r) => Ok(Some((host, r))),
        Err(RuntimeError::Unavailable(reason)) => {
            not_run.note(format!("{preset} TP{} {:?}", cfg.tp, cfg.doors), reason);
            Ok(None)
        }
        Err(e) => panic!("{preset} TP{} {:?}: CUDA run failed: {e}", cfg.tp, cfg.doors),
    }
}

fn census_equals_the_host_census() -> Ran {
    let mut not_run = NotRun::new();
    let doors = [
        DoorSet::default(),
        DoorSet { oproj_direct: true, oproj_tail: true, ..DoorSet::default() },
        DoorSet { moe_direct: true, ..DoorSet::default() },
        DoorSet { routes_prestage: true, ..DoorSet::default() },
        DoorSet { f32_mirror: true, ..DoorSet::default() },
        DoorSet { w8: true, ..DoorSet::default() },
        DoorSet { qkv_fused: true, dev_router: true, ..DoorSet::default() },
        DoorSet { step_ep: true, ..DoorSet::default() },
    ];
    for preset in ["tiny", "edge"] {
        for tp in [1, 2, 4] {
            for d in doors {
                let needs_peers = d.oproj_direct || d.moe_direct || d.routes_prestage || d.step_ep;
                if needs_peers && tp == 1 {
                    continue;
                }
                let cfg = config(tp, Transport::NativeP2p, d);
                let Some((host, cuda)) = both(preset, &cfg, &mut not_run)? else { continue };
                assert_eq!(cuda.census, host.census, "{preset} TP{tp} {d:?}: the CUDA census differs from the host's");
                assert_eq!(cuda.digests, host.digests, "{preset} TP{tp} {d:?}: digests");
                assert_eq!((cuda.copies_verified, &cuda.copy_faults), (host.copies_verified, &host.copy_faults));
                not_run.ran();
            }
        }
    }
    not_run.finish()
}

fn graph_replays_are_counted() -> Ran {
    let mut not_run = NotRun::new();
    for tp in [1, 2] {
        let plain = config(tp, Transport::NativeP2p, DoorSet::default());
        let graph = config(tp, Transport::NativeP2p, DoorSet { graph: true, ..DoorSet::default() });
        let Some((_, eager)) = both("tiny", &plain, &mut not_run)? else { continue };
        let mut b = cuda_backend(tp, CO_RESIDENT)?;
        let g = program::run(model("tiny"), &graph, &mut b).expect("GRAPH run");
        let replays = g.census.get("graph_replay").copied().unwrap_or(0);
        assert!(replays > 0, "TP{tp}: a GRAPH run with no replay in its census: {:?}", g.census);
        let launches = |r: &Record| r.census.iter().filter(|(k, _)| k.starts_with("launch.")).map(|(_, v)| v).sum::<u64>();
        assert!(launches(&g) < launches(&eager), "TP{tp}: replayed calls must not be counted one by one");
        assert_eq!(g.digests, eager.digests, "TP{tp}: GRAPH changes no bit");
        not_run.ran();
    }
    not_run.finish()
}

fn edge_model_equals_the_host_oracle() -> Ran {
    let mut not_run = NotRun::new();
    let oracle = program::run(model("edge"), &config(1, Transport::HostBounce, DoorSet::default()), &mut HostBackend::new(1).unwrap())
        .unwrap();
    assert!(oracle.coverage.as_ref().is_some_and(|c| c["router.tie_at_boundary"].count > 0));
    for (tp, t) in [(1, Transport::HostBounce), (2, Transport::HostBounce), (2, Transport::NativeP2p), (4, Transport::NativeP2p)] {
        let mut b = cuda_backend(tp, CO_RESIDENT)?;
        let r = match program::run(model("edge"), &config(tp, t, DoorSet::default()), &mut b) {
            Ok(r) => r,
            Err(RuntimeError::Unavailable(reason)) => {
                not_run.note(format!("edge TP{tp} {}", t.name()), reason);
                continue;
            }
            Err(e) => panic!("edge TP{tp} {}: {e}", t.name()),
        };
        assert_eq!(r.digests, oracle.digests, "edge TP{tp} {}: the device differs from the host oracle", t.name());
        assert_eq!(r.tokens, oracle.tokens);
        assert_eq!(r.copy_faults, vec![], "edge TP{tp} {}", t.name());
        assert!(tp == 1 || r.copies_verified > 0);
        not_run.ran();
    }
    not_run.finish()
}

fn broken_broadcast_is_named_at_the_copy() -> Ran {
    let mut not_run = NotRun::new();
    for tp in [2, 4] {
        let cfg = config(tp, Transport::NativeP2p, DoorSet { canary: Some(Canary::BrokenBroadcast), ..DoorSet::default() });
        let Some((host, cuda)) = both("edge", &cfg, &mut not_run)? else { continue };
        let want = CopyFault { prompt: 0, step: 0, layer: 0, seam: Seam::AttnNorm, src_rank: 0, dst_rank: tp - 1 };
        assert_eq!(cuda.copy_faults.first(), Some(&want), "TP{tp}: {:?}", cuda.copy_faults);
        assert_eq!(cuda.copy_faults, host.copy_faults, "TP{tp}: the device and the host name the same copies");
        not_run.ran();
    }
    not_run.finish()
}

fn probe_passes_from_one_word() -> Ran {
    let mut not_run = NotRun::new();
    let sizes = &PROBE_SIZES_BYTES[..PROBE_SIZES_BYTES.len() - 1];
    // NCCL needs one device per rank: on a one-device machine it has no meaning (not a skip).
    let transports: Vec<Transport> = Transport::ALL
        .into_iter()
        .filter(|t| *t != Transport::Nccl || memra_runtime::backend::cuda_device_count() >= 2)
        .collect();
    for t in transports {
        let mut b = cuda_backend(2, CudaOptions { placement: PlacementPolicy::Auto, ..CO_RESIDENT })?;
        match b.probe(t, sizes) {
            Ok(results) => {
                assert_eq!(results.len(), sizes.len() * 2, "{}", t.name());
                if let Some(p) = results.iter().find(|p| p.no_peer_access.is_some()) {
                    not_run.note(t.name(), format!("{:?}", p.no_peer_access));
                    continue;
                }
                let bad: Vec<_> = results.iter().filter(|p| p.bad_words > 0).collect();
                assert!(bad.is_empty(), "{}: {bad:?}", t.name());
                not_run.ran();
            }
            Err(e) => not_run.note(t.name(), e),
        }
    }
    not_run.finish()
}
