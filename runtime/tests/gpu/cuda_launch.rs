//! The launch order's claim on a device: programmatic dependent launch (every kernel scheduled
//! before the one ahead of it completes, each waiting for it in `kernel_entry()` before it touches
//! memory) changes no bit of a run. The same runs — tiny and edge, TP1 and co-resident TP2 over
//! native-p2p, single tokens eager and under whole-step GRAPH, a b4 row pass and a t4 column pass
//! under GRAPH —
//! with `LaunchOrder::Programmatic` and with `LaunchOrder::Serialized` give the same record
//! (digests, tokens, top-2 logits, engagement, census, captures, copies), and both equal the host.
//! The programmatic runs include the experts' shared slot ahead of the wait (SETTLED_FIRST,
//! canon.cuh) wherever the runtime finds the kernel ahead settled: required to happen in some run
//! on sm_90 and later (else the claim would not cover it), and never in a serialized run.
//!
//! Without a CUDA device every test reads `ignored (no CUDA device: …)`.

use crate::cases::CO_RESIDENT;
use crate::harness::{cuda_backend, GpuTest, NotRun, Ran};
use crate::same_record::assert_same_record;
use memra_runtime::backend::cuda::{CudaOptions, LaunchOrder};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::Backend;
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, DoorSet, PassShape, RunConfig, RuntimeError, Transport};

/// The major compute capability in a backend description (`… sm_90 …`), 0 when absent.
fn sm_major(describe: &str) -> u32 {
    describe
        .split_whitespace()
        .find_map(|w| w.strip_prefix("sm_"))
        .and_then(|v| v.get(..v.len().saturating_sub(1)))
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

pub fn tests() -> Vec<GpuTest> {
    vec![GpuTest::new("programmatic_launches_change_no_bit", programmatic_launches_change_no_bit)]
}

fn programmatic_launches_change_no_bit() -> Ran {
    let mut not_run = NotRun::new();
    let (mut ahead, mut programmatic_runs) = (0u64, 0usize);
    for preset in ["tiny", "edge"] {
        let model: Model = generate(&ModelConfig::preset(preset, None).unwrap(), 1).unwrap();
        for (tp, t) in [(1, Transport::HostBounce), (2, Transport::NativeP2p)] {
            for shape in [PassShape::SINGLE, PassShape::new(4, 1).unwrap(), PassShape::new(1, 4).unwrap()] {
                // Row and column passes under GRAPH only (the bench's form), single tokens both ways.
                let graphs: &[bool] = if shape == PassShape::SINGLE { &[false, true] } else { &[true] };
                for &graph in graphs {
                    let sessions = shape.batch.max(2);
                    let prompts = (0..sessions).map(|i| vec![3 + i as u32, 1, 4]).collect();
                    let mut cfg = RunConfig::new(tp, t, Battery { prompts, gen_tokens: 3 }).unwrap();
                    cfg.pass = shape;
                    cfg.doors = DoorSet { graph, ..DoorSet::default() };
                    let what = format!("{preset} TP{tp} {} {shape:?} graph={graph}", t.name());
                    let mut runs = Vec::new();
                    for order in [LaunchOrder::Serialized, LaunchOrder::Programmatic] {
                        let mut b = cuda_backend(tp, CudaOptions { launch_order: order, ..CO_RESIDENT })?;
                        // Not vacuous: on sm_90 and later the programmatic run must really launch
                        // programmatically (else both runs would be plain and trivially equal).
                        let d = b.describe();
                        let want = order == LaunchOrder::Programmatic && sm_major(&d) >= 9;
                        assert_eq!(b.programmatic_launches(), want, "{what} {order:?}: {d}");
                        match program::run(&model, &cfg, &mut b) {
                            Ok(r) => {
                                runs.push(r);
                                if want {
                                    ahead += b.ahead_launches();
                                    programmatic_runs += 1;
                                } else {
                                    assert_eq!(b.ahead_launches(), 0, "{what} {order:?}: the shared slot ran ahead");
                                }
                            }
                            Err(RuntimeError::Unavailable(reason)) => not_run.note(&what, reason),
                            Err(e) => panic!("{what} {order:?}: CUDA run failed: {e}"),
                        }
                    }
                    let [serialized, programmatic] = &runs[..] else { continue };
                    assert_same_record(&format!("{what}: programmatic vs serialized"), programmatic, serialized);
                    // The host cannot capture graphs: it runs the same program eagerly (GRAPH
                    // changes launches, never a value).
                    let eager = RunConfig { doors: DoorSet { graph: false, ..cfg.doors }, ..cfg.clone() };
                    let host = program::run(&model, &eager, &mut HostBackend::new(tp).unwrap()).unwrap();
                    assert_eq!(programmatic.digests, host.digests, "{what}: the device differs from the host");
                    assert_eq!(programmatic.tokens, host.tokens, "{what}: tokens");
                    not_run.ran();
                }
            }
        }
    }
    if programmatic_runs > 0 {
        assert!(ahead > 0, "{programmatic_runs} programmatic runs and no shared slot ahead of its wait");
        println!("shared slot ahead of the wait: {ahead} launches over {programmatic_runs} programmatic runs");
    }
    not_run.finish()
}
