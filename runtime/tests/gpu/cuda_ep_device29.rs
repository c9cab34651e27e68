//! Issue 29's MEMRA_STEP_EP_DEVICE_ARITHMETIC on a device. The kernel of STEP_EP's host program,
//! `expert_gate_up_rows_f32` (the SwiGLU's operands), is checked against its twin with the other
//! grouped expert kernels (`cuda_step.rs`, grouped_expert_kernels_match_twins). Here, on `edge` —
//! both SwiGLU clamps on routed experts, sums of −0.0 products — co-resident runs at TP2/4/8 equal
//! the host oracle bit for bit with STEP_EP's arithmetic on the host (the rows kernel, the
//! program's SwiGLU and combine) and on the device (the door: fused SwiGLU, combine_shared), and
//! the device census equals the host backend's census of the same configuration (the door's
//! launches with it, the rows launches and the bounce's reads and writes without it). Under the
//! graph door the host program keeps the MoE half eager (attention halves are captured) and the
//! door lets the whole step be captured; both replay and equal the oracle.
//!
//! Without a CUDA device every test reads `ignored (no CUDA device: …)`.

use crate::cases::CO_RESIDENT;
use crate::edge_fixture::{battery, edge};
use crate::harness::{cuda_backend, GpuTest, NotRun, Ran};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::evidence::record::Record;
use memra_runtime::{program, DoorSet, RunConfig, RuntimeError, Transport};
use std::sync::OnceLock;

pub fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest::new("ep_device_arithmetic_runs_equal_the_host_oracle_co_resident", ep_runs_co_resident),
        GpuTest::new("ep_arithmetic_under_the_graph_door_equals_the_host_oracle", ep_runs_under_graph),
    ]
}

fn config(tp: usize, doors: DoorSet) -> RunConfig {
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery()).unwrap();
    cfg.doors = doors;
    cfg
}

fn oracle() -> &'static Record {
    static ORACLE: OnceLock<Record> = OnceLock::new();
    ORACLE.get_or_init(|| {
        let cfg = RunConfig::new(1, Transport::HostBounce, battery()).unwrap();
        program::run(edge(), &cfg, &mut HostBackend::new(1).unwrap()).unwrap()
    })
}

fn census(r: &Record, prefix: &str) -> u64 {
    r.census.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum()
}

fn step_ep() -> DoorSet {
    DoorSet { step_ep: true, ..DoorSet::default() }
}

fn device() -> DoorSet {
    DoorSet { ep_device_arithmetic: true, ..step_ep() }
}

/// A co-resident CUDA run of `doors` at `tp`; `None` after noting a run the machine cannot make.
fn cuda_run(tp: usize, doors: DoorSet, what: &str, not_run: &mut NotRun) -> Result<Option<Record>, crate::harness::Skip> {
    let mut b = cuda_backend(tp, CO_RESIDENT)?;
    match program::run(edge(), &config(tp, doors), &mut b) {
        Ok(r) => Ok(Some(r)),
        Err(RuntimeError::Unavailable(reason)) => {
            not_run.note(what, reason);
            Ok(None)
        }
        Err(e) => panic!("{what}: CUDA run failed: {e}"),
    }
}

fn ep_runs_co_resident() -> Ran {
    let mut not_run = NotRun::new();
    let steps: u64 = (0..battery().prompts.len()).map(|p| battery().steps_of(p) as u64).sum();
    let layers = edge().config.layers as u64;
    for tp in [2, 4, 8] {
        for (name, doors) in [("step_ep (host arithmetic)", step_ep()), ("step_ep+ep_device_arithmetic", device())] {
            let what = format!("TP{tp} co-resident {name}");
            let Some(r) = cuda_run(tp, doors, &what, &mut not_run)? else { continue };
            assert_eq!(oracle().first_digest_difference(&r), None, "{what}: device ≠ host oracle");
            assert_eq!(r.tokens, oracle().tokens, "{what}");
            assert_eq!(r.copy_faults, vec![], "{what}");
            let host = program::run(edge(), &config(tp, doors), &mut HostBackend::new(tp).unwrap()).unwrap();
            assert_eq!(r.census, host.census, "{what}: device census ≠ host census");
            let (rows, combines) = (census(&r, "launch.expert_gate_up_rows."), census(&r, "launch.combine_shared"));
            if doors.ep_device_arithmetic {
                assert_eq!((rows, combines), (0, layers * steps), "{what}: rows launches, combines");
            } else {
                assert!(rows > 0 && combines == 0, "{what}: rows launches {rows}, combines {combines}");
            }
            println!("ok {what}: {rows} rows launches, {combines} combines, {} reads", census(&r, "read."));
            not_run.ran();
        }
    }
    not_run.finish()
}

fn ep_runs_under_graph() -> Ran {
    let mut not_run = NotRun::new();
    for (name, doors) in [("step_ep+graph", step_ep()), ("step_ep+ep_device_arithmetic+graph", device())] {
        let doors = DoorSet { graph: true, ..doors };
        let what = format!("TP2 co-resident {name}");
        let Some(r) = cuda_run(2, doors, &what, &mut not_run)? else { continue };
        assert_eq!(oracle().first_digest_difference(&r), None, "{what}: device ≠ host oracle");
        assert_eq!(r.tokens, oracle().tokens, "{what}");
        assert!(census(&r, "graph_replay") > 0, "{what}: nothing replayed");
        println!("ok {what}: {} replays", census(&r, "graph_replay"));
        not_run.ran();
    }
    not_run.finish()
}
