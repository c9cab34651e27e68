//! MEMRA_STEP_TP_GRAPH on CUDA (skipped visibly without a device; a failure under
//! MEMRA_REQUIRE_GPU=1): the position-independent kernels against their host twins bit for bit,
//! captured-and-replayed runs against the host oracle at every TP size, placement and transport,
//! the replay count as engagement, and the negative controls — a replay that issues another call
//! sequence is refused, and a stale device position is caught.

#[path = "support/segments.rs"]
mod segments;

use memra_runtime::backend::cuda::{self, CudaBackend, CudaOptions, PlacementPolicy};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{Backend, Op, Slice};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::record::Record;
use memra_runtime::{program, Battery, RunConfig, RuntimeError, Transport};
use segments::SegmentChecker;

#[path = "support/gpu.rs"]
mod gpu;

fn cuda_backend(tp: usize, placement: PlacementPolicy) -> Option<CudaBackend> {
    gpu::cuda_backend(tp, CudaOptions { placement, ..CudaOptions::default() })
}

fn tiny() -> Model {
    generate(&ModelConfig::preset("tiny", None).expect("tiny preset"), 7).expect("tiny model")
}

fn battery() -> Battery {
    Battery { prompts: vec![vec![3, 141, 59], vec![26, 535]], gen_tokens: 4 }
}

fn first_diff(a: &Record, b: &Record) -> Option<String> {
    for (p, (ra, rb)) in a.digests.iter().zip(&b.digests).enumerate() {
        for (s, (da, db)) in ra.iter().zip(rb).enumerate() {
            if let Some(i) = da.iter().zip(db).position(|(x, y)| x != y) {
                let (l, seam) = Record::seam_at(a.n_layers, i);
                return Some(format!("prompt {p} step {s} layer {l} {}", seam.name()));
            }
        }
    }
    None
}

/// Run the same ops on the host and on the device and compare every buffer bit for bit.
#[test]
fn position_kernels_match_their_twins() {
    let Some(mut dev) = cuda_backend(1, PlacementPolicy::Auto) else { return };
    let mut host = HostBackend::new(1).unwrap();
    let (heads, kv_heads, max_len) = (4usize, 2usize, 40usize);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut vals = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    };
    let inputs: Vec<Vec<f32>> = vec![
        vals(heads * 128),              // q
        vals(max_len * kv_heads * 128), // k cache
        vals(max_len * kv_heads * 128), // v cache
        vals(heads),                    // gate
        vals(128),                      // norm weight
        vals(max_len * 128),            // rope table
        vals(kv_heads * 128),           // new k row
        vec![0.0; heads * 128],         // attention out
        vec![0.0; 1],                   // position
    ];
    for (pos, label) in [(0u32, "first"), (17, "middle"), (39, "last"), (40, "outside"), (u32::MAX, "far outside")] {
        let mut results = Vec::new();
        for b in [&mut host as &mut dyn Backend, &mut dev as &mut dyn Backend] {
            let s: Vec<Slice> = inputs
                .iter()
                .map(|v| {
                    let s = Slice::new(b.alloc(0, v.len()).unwrap(), 0, v.len());
                    b.write(0, s, v).unwrap();
                    s
                })
                .collect();
            let (q, k, v, gate, w, table, row, out, p) = (s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8]);
            b.launch(0, Op::SetU32 { out: p, value: pos }).unwrap();
            b.launch(0, Op::QkNormRopeAt { x: q, w, eps: 1e-6, table, pos: p }).unwrap();
            b.launch(0, Op::AppendAt { src: row, cache: k, pos: p }).unwrap();
            let op = Op::AttentionAt { q, k, v, gate, pos: p, max_len, q_heads: heads, kv_heads, out };
            b.launch(0, op).unwrap();
            results.push(s.iter().map(|x| b.read(0, *x).unwrap()).collect::<Vec<_>>());
        }
        for (i, (h, d)) in results[0].iter().zip(&results[1]).enumerate() {
            let bad = h.iter().zip(d).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(bad, 0, "position {pos} ({label}): buffer {i} differs in {bad} of {} values", h.len());
        }
        let moved = results[0][7].iter().any(|x| *x != 0.0);
        assert_eq!(moved, pos < max_len as u32, "position {pos}: attention output written iff in range");
        println!("position {pos} ({label}): device = host twin, bit for bit");
    }
}

/// Every TP size and transport, co-resident and (with ≥ 2 devices) distinct: a graphed run
/// equals the host oracle, and the whole step (one segment) was replayed (steps − 2) times.
#[test]
fn graph_runs_equal_the_oracle_and_replay() {
    let Some(_) = cuda_backend(1, PlacementPolicy::Auto) else { return };
    let model = tiny();
    let oracle = {
        let cfg = RunConfig::new(1, Transport::HostBounce, battery()).unwrap();
        program::run(&model, &cfg, &mut HostBackend::new(1).unwrap()).unwrap()
    };
    let steps: u64 = (0..battery().prompts.len()).map(|p| battery().steps_of(p) as u64).sum();
    let want_replays = steps - 2;
    let n_devices = cuda::probe_cuda().map(|s| s.devices.len()).unwrap_or(0);
    let mut runs = 0;
    for tp in [1, 2, 4, 8] {
        let mut placements = vec![PlacementPolicy::CoResident];
        if tp > 1 && n_devices >= tp {
            placements.push(PlacementPolicy::Auto);
        }
        for placement in placements {
            let mut transports = vec![Transport::HostBounce, Transport::NativeP2p];
            if placement == PlacementPolicy::Auto {
                transports.push(Transport::Nccl);
            }
            for t in transports {
                let Some(mut b) = cuda_backend(tp, placement) else { return };
                let mut cfg = RunConfig::new(tp, t, battery()).unwrap();
                cfg.doors.graph = true;
                let r = match program::run(&model, &cfg, &mut b) {
                    Ok(r) => r,
                    Err(RuntimeError::Unavailable(why)) => {
                        println!("skipped: TP{tp} {placement:?} {t:?}: {why}");
                        continue;
                    }
                    Err(e) => panic!("TP{tp} {placement:?} {t:?} graph run: {e}"),
                };
                assert_eq!(first_diff(&oracle, &r), None, "TP{tp} {placement:?} {t:?}: graph run vs host oracle");
                assert_eq!(r.tokens, oracle.tokens, "TP{tp} {placement:?} {t:?}: tokens");
                assert_eq!(r.engaged.get("graph.replays"), Some(&want_replays), "TP{tp} {placement:?} {t:?}");
                assert!(r.timings_ns.iter().all(|t| t.iter().any(|ns| *ns > 0)), "every seam has a timing");
                println!("TP{tp} {placement:?} {}: graphed = oracle, {want_replays} replays", t.name());
                runs += 1;
            }
        }
    }
    assert!(runs >= 8, "only {runs} graph runs were made");
}

#[test]
fn a_replay_that_issues_other_calls_is_refused() {
    let Some(mut b) = cuda_backend(1, PlacementPolicy::Auto) else { return };
    let x = Slice::new(b.alloc(0, 64).unwrap(), 0, 64);
    let y = Slice::new(b.alloc(0, 64).unwrap(), 0, 64);
    b.write(0, x, &[1.5; 64]).unwrap();
    for _ in 0..3 {
        b.segment_begin(5).unwrap();
        b.launch(0, Op::Add { a: x, b: x, out: y }).unwrap();
        b.segment_end().unwrap();
    }
    b.segment_begin(5).unwrap();
    let e = b.launch(0, Op::Scale { x, s: 2.0, out: y }).expect_err("another op than the captured one");
    assert!(e.to_string().contains("graph segment 5"), "{e}");
    // The segment is dropped; the backend works eagerly and records the segment afresh.
    b.launch(0, Op::Add { a: x, b: x, out: y }).unwrap();
    assert_eq!(b.read(0, y).unwrap(), vec![3.0; 64]);
    b.segment_begin(5).unwrap();
    b.launch(0, Op::Scale { x, s: 4.0, out: y }).unwrap();
    b.segment_end().unwrap();
    b.collect().unwrap();
    assert_eq!(b.read(0, y).unwrap(), vec![6.0; 64], "the re-recorded segment ran");
    assert_eq!(b.engagement(), vec![("graph.replays".to_string(), 1)]);
}

#[test]
fn a_stale_device_position_under_replay_is_caught() {
    let Some(b) = cuda_backend(2, PlacementPolicy::CoResident) else { return };
    let model = tiny();
    let mut cfg = RunConfig::new(2, Transport::NativeP2p, battery()).unwrap();
    let oracle = program::run(&model, &cfg, &mut HostBackend::new(2).unwrap()).unwrap();
    cfg.doors.graph = true;
    let mut checked = SegmentChecker::new(b);
    checked.forward_segments = true;
    checked.freeze_position_after = Some(3);
    let r = program::run(&model, &cfg, &mut checked).unwrap();
    let d = first_diff(&oracle, &r);
    assert_eq!(d.as_deref(), Some("prompt 0 step 3 layer 0 rope"), "the frozen position must show where it froze");
}

/// Peer stores inside the captured attention half (OPROJ_DIRECT + OPROJ_TAIL, MOE_DIRECT eager).
#[test]
fn graph_with_peer_stores_equals_the_oracle() {
    let Some(_) = cuda_backend(1, PlacementPolicy::Auto) else { return };
    let model = tiny();
    let oracle = {
        let cfg = RunConfig::new(1, Transport::HostBounce, battery()).unwrap();
        program::run(&model, &cfg, &mut HostBackend::new(1).unwrap()).unwrap()
    };
    let n_devices = cuda::probe_cuda().map(|s| s.devices.len()).unwrap_or(0);
    for tp in [2, 4, 8] {
        let mut placements = vec![PlacementPolicy::CoResident];
        if n_devices >= tp {
            placements.push(PlacementPolicy::Auto);
        }
        for placement in placements {
            // With STEP_EP the digests before a layer's segment follow the routing (owners
            // differ per token), so the segment's digest slots must not depend on them.
            for ep in [false, true] {
                let Some(mut b) = cuda_backend(tp, placement) else { return };
                let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery()).unwrap();
                (cfg.doors.graph, cfg.doors.oproj_direct, cfg.doors.oproj_tail, cfg.doors.moe_direct) =
                    (true, true, !ep, true);
                cfg.doors.step_ep = ep;
                let r =
                    program::run(&model, &cfg, &mut b).unwrap_or_else(|e| panic!("TP{tp} {placement:?} ep {ep}: {e}"));
                let d = first_diff(&oracle, &r);
                assert_eq!(d, None, "TP{tp} {placement:?} ep {ep}: graph + direct joins vs host oracle");
                for counter in ["graph.replays", "oproj_direct.peer_stores", "moe_direct.peer_stores"] {
                    let n = r.engaged.get(counter);
                    assert!(n.is_some_and(|n| *n > 0), "TP{tp} {placement:?} ep {ep}: {counter} {:?}", r.engaged);
                }
                println!("TP{tp} {placement:?} ep {ep}: graph + peer stores = oracle");
            }
        }
    }
}
