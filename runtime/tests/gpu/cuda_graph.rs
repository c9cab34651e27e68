//! MEMRA_STEP_TP_GRAPH on CUDA (`ignored (no CUDA device: …)` without a device; a failure under
//! MEMRA_REQUIRE_GPU=1): the position-independent kernels against their host twins bit for bit,
//! captured-and-replayed runs against the host oracle at every TP size, placement and transport,
//! the replay count as engagement, and the negative controls — a replay that issues another call
//! sequence is refused, and a stale device position is caught. The distinct-device runs are
//! registered per device count (`…::on_4_devices`).

use crate::harness::{self, GpuTest, NotRun, Ran, Skip};
use crate::segments::SegmentChecker;
use memra_runtime::backend::cuda::{CudaBackend, CudaOptions, PlacementPolicy};
use memra_runtime::backend::host::HostBackend;
use memra_kernels::twins::attention::ATTN_PARTITION;
use memra_runtime::backend::{Backend, Graphs, Op, Slice, Witness};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::evidence::record::Record;
use memra_runtime::{program, Battery, RunConfig, RuntimeError, Transport};

/// Every test of this file; the distinct-device runs once per device count.
pub fn tests() -> Vec<GpuTest> {
    let mut t = vec![
        GpuTest::new("position_kernels_match_their_twins", position_kernels_match_their_twins),
        GpuTest::new("graph_runs_equal_the_oracle_and_replay", graph_runs_equal_the_oracle_and_replay),
        GpuTest::new("a_replay_that_issues_other_calls_is_refused", a_replay_that_issues_other_calls_is_refused),
        GpuTest::new("a_stale_device_position_under_replay_is_caught", a_stale_device_position_under_replay_is_caught),
        GpuTest::new("graph_with_peer_stores_equals_the_oracle", || graph_with_peer_stores(None)),
    ];
    let graph_runs = graph_runs_on_distinct_devices as fn(usize) -> Ran;
    t.extend(GpuTest::per_device_count("graph_runs_equal_the_oracle_and_replay", &[2, 4, 8], graph_runs));
    let peer_stores = |tp| graph_with_peer_stores(Some(tp));
    t.extend(GpuTest::per_device_count("graph_with_peer_stores_equals_the_oracle", &[2, 4, 8], peer_stores));
    t
}

fn cuda_backend(tp: usize, placement: PlacementPolicy) -> Result<CudaBackend, Skip> {
    harness::cuda_backend(tp, CudaOptions { placement, ..CudaOptions::default() })
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
fn position_kernels_match_their_twins() -> Ran {
    let mut dev = cuda_backend(1, PlacementPolicy::Auto)?;
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
            let op = Op::AttentionAt { q, k, v, gate, pos: p, max_len, q_heads: heads, kv_heads, partition: ATTN_PARTITION, out };
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
    Ok(())
}

/// Every TP size and both copy transports with co-resident ranks: a graphed run equals the host
/// oracle, and the whole step (one segment) was replayed (steps − 2) times.
fn graph_runs_equal_the_oracle_and_replay() -> Ran {
    let runner = GraphRuns::new();
    let mut not_run = NotRun::new();
    for tp in [1, 2, 4, 8] {
        for t in [Transport::HostBounce, Transport::NativeP2p] {
            runner.check(tp, PlacementPolicy::CoResident, t, &mut not_run)?;
        }
    }
    assert!(runner.runs.get() >= 8, "only {} graph runs were made", runner.runs.get());
    not_run.finish()
}

/// TP`tp` with one rank per device over the three transports (registered per device count).
fn graph_runs_on_distinct_devices(tp: usize) -> Ran {
    let runner = GraphRuns::new();
    let mut not_run = NotRun::new();
    for t in [Transport::HostBounce, Transport::NativeP2p, Transport::Nccl] {
        runner.check(tp, PlacementPolicy::Auto, t, &mut not_run)?;
    }
    not_run.finish()
}

/// The oracle, the replay count every graphed run must show, and how many runs were checked.
struct GraphRuns {
    model: Model,
    oracle: Record,
    want_replays: u64,
    runs: std::cell::Cell<usize>,
}

impl GraphRuns {
    fn new() -> GraphRuns {
        let model = tiny();
        let oracle = {
            let cfg = RunConfig::new(1, Transport::HostBounce, battery()).unwrap();
            program::run(&model, &cfg, &mut HostBackend::new(1).unwrap()).unwrap()
        };
        let steps: u64 = (0..battery().prompts.len()).map(|p| battery().steps_of(p) as u64).sum();
        let want_replays = steps - 2;
        GraphRuns { model, oracle, want_replays, runs: std::cell::Cell::new(0) }
    }

    /// One graphed run at TP`tp` over `t`; a transport the machine cannot offer is noted.
    fn check(&self, tp: usize, placement: PlacementPolicy, t: Transport, not_run: &mut NotRun) -> Ran {
        let (model, oracle, want_replays) = (&self.model, &self.oracle, self.want_replays);
        let mut b = cuda_backend(tp, placement)?;
        let mut cfg = RunConfig::new(tp, t, battery()).unwrap();
        cfg.doors.graph = true;
        let r = match program::run(model, &cfg, &mut b) {
            Ok(r) => r,
            Err(RuntimeError::Unavailable(why)) => {
                not_run.note(format!("TP{tp} {placement:?} {t:?}"), why);
                return Ok(());
            }
            Err(e) => panic!("TP{tp} {placement:?} {t:?} graph run: {e}"),
        };
        assert_eq!(first_diff(oracle, &r), None, "TP{tp} {placement:?} {t:?}: graph run vs host oracle");
        assert_eq!(r.tokens, oracle.tokens, "TP{tp} {placement:?} {t:?}: tokens");
        assert_eq!(r.engaged.get("graph.replays"), Some(&want_replays), "TP{tp} {placement:?} {t:?}");
        assert!(r.timings_ns.iter().all(|t| t.iter().any(|ns| *ns > 0)), "every seam has a timing");
        println!("TP{tp} {placement:?} {}: graphed = oracle, {want_replays} replays", t.name());
        self.runs.set(self.runs.get() + 1);
        not_run.ran();
        Ok(())
    }
}

fn a_replay_that_issues_other_calls_is_refused() -> Ran {
    let mut b = cuda_backend(1, PlacementPolicy::Auto)?;
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
    Ok(())
}

fn a_stale_device_position_under_replay_is_caught() -> Ran {
    let b = cuda_backend(2, PlacementPolicy::CoResident)?;
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
    Ok(())
}

/// Peer stores inside the captured attention half (OPROJ_DIRECT + OPROJ_TAIL, MOE_DIRECT eager):
/// co-resident at TP2/4/8 (`distinct: None`), or one rank per device at TP`tp` (`Some(tp)`).
fn graph_with_peer_stores(distinct: Option<usize>) -> Ran {
    let model = tiny();
    let oracle = {
        let cfg = RunConfig::new(1, Transport::HostBounce, battery()).unwrap();
        program::run(&model, &cfg, &mut HostBackend::new(1).unwrap()).unwrap()
    };
    let (placement, sizes) = match distinct {
        None => (PlacementPolicy::CoResident, vec![2, 4, 8]),
        Some(tp) => (PlacementPolicy::Auto, vec![tp]),
    };
    for tp in sizes {
        // With STEP_EP the digests before a layer's segment follow the routing (owners differ
        // per token), so the segment's digest slots must not depend on them.
        for ep in [false, true] {
            let mut b = cuda_backend(tp, placement)?;
            let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery()).unwrap();
            (cfg.doors.graph, cfg.doors.oproj_direct, cfg.doors.oproj_tail, cfg.doors.moe_direct) =
                (true, true, !ep, true);
            cfg.doors.step_ep = ep;
            let r = program::run(&model, &cfg, &mut b).unwrap_or_else(|e| panic!("TP{tp} {placement:?} ep {ep}: {e}"));
            let d = first_diff(&oracle, &r);
            assert_eq!(d, None, "TP{tp} {placement:?} ep {ep}: graph + direct joins vs host oracle");
            for counter in ["graph.replays", "oproj_direct.peer_stores", "moe_direct.peer_stores"] {
                let n = r.engaged.get(counter);
                assert!(n.is_some_and(|n| *n > 0), "TP{tp} {placement:?} ep {ep}: {counter} {:?}", r.engaged);
            }
            println!("TP{tp} {placement:?} ep {ep}: graph + peer stores = oracle");
        }
    }
    Ok(())
}
