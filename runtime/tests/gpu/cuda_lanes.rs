//! Rows and columns on the device (docs/DESIGN.md §3.6, issue 24 items 1 and 6): the CUDA
//! backend's `launch_lanes` reads each weight once for all the lanes of a pass (one
//! `gemv_*_lanes_*` launch) and must give the bits of the per-lane launches, which are the
//! definition, and of the host twins.
//!
//! - every GEMV kind the program issues per lane (canonical rows, the qkv row batch, the o-proj
//!   partials) in BF16 and F32, both weight layouts, 1 to 8 lanes, several shapes and pitches:
//!   fused = per-lane launches = host, bit for bit, and the census shows one fused launch
//!   (`launch.<op>_lanes.<format>`) instead of one launch per lane;
//! - lanes the device must not fuse (a skipped lane, the tree order) run lane by lane, with the
//!   same bits and per-lane kernels in the census;
//! - negative control: the comparison finds a planted swap of two lanes' outputs;
//! - the whole program with rows (batch 4) and columns (4) on CUDA, co-resident TP1 and TP2:
//!   every seam digest, token and top-2 of the single-token host run, with fused launches in
//!   the census;
//! - `lanes_timing_report` (opt-in, `MEMRA_GPU_BENCH=1`): fused against per-lane time at 8 lanes
//!   on the `step` preset's shapes.
//!
//! Without a CUDA device every test here reads `ignored (no CUDA device: …)`; with
//! `MEMRA_REQUIRE_GPU=1` that is a failure (`harness.rs`).

use crate::cases::{bf16_shard, compare, f32_shard, Rng, FAST, ROW_MAJOR};
use crate::harness::{cuda_backend, GpuTest, Ran, Skip};
use memra_runtime::backend::cuda::{CudaBackend, CudaOptions};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{Backend, Op, RowOrder, Slice, WeightId, Witness};
use memra_runtime::evidence::census::{Census, Counts};
use memra_runtime::model::matrix::MatrixShard;
use memra_runtime::model::{gen::generate, ModelConfig};
use memra_runtime::{program, Battery, PassShape, RunConfig, Transport};

pub fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest::new("fused_lanes_equal_per_lane_launches_and_the_host", fused_lanes_equal_per_lane_and_host),
        GpuTest::new("unfusable_lanes_run_lane_by_lane_with_the_same_bits", unfusable_lanes_run_lane_by_lane),
        GpuTest::new("a_planted_lane_swap_is_detected", a_planted_lane_swap_is_detected),
        GpuTest::new("rows_and_columns_on_cuda_equal_the_single_token_host_run", program_rows_and_columns),
        GpuTest::new("lanes_timing_report", lanes_timing_report),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rows,
    Partials,
    Batch,
}

/// One pass of `lanes` lanes over the weights of `shards` (one, or up to four for a batch).
struct Pass<'a> {
    kind: Kind,
    shards: &'a [MatrixShard],
    lanes: usize,
    /// Extra elements between lanes' inputs and between lanes' outputs (pitch = length + gap).
    gap: usize,
    /// Which lanes are active (the pass issues lane `active[i]` as `ops[i]`).
    active: Vec<usize>,
}

impl Pass<'_> {
    fn out_len(&self, s: &MatrixShard) -> usize {
        let nk = if s.in_features == 0 { 0 } else { s.in_features / s.kblock_width };
        if self.kind == Kind::Partials {
            s.out_features * nk
        } else {
            s.out_features
        }
    }
}

/// What one backend computed for a pass: every output buffer (gaps included), and the census
/// change of the lanes' launch.
struct Outcome {
    outs: Vec<Vec<f32>>,
    census: Counts,
}

fn census_change(before: &Census, after: &Census) -> Counts {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Upload the pass's weights and inputs to `b`, issue the lanes (`fused`: one `launch_lanes`;
/// else one `launch` per lane), read every output buffer back.
fn run(b: &mut dyn Backend, p: &Pass, xs: &[f32], fused: bool) -> Outcome {
    let cols = p.shards[0].in_features;
    let ws: Vec<WeightId> = p.shards.iter().map(|s| b.upload_weight(0, s).unwrap()).collect();
    let x_pitch = cols + p.gap;
    let xbuf = b.alloc(0, x_pitch * p.lanes).unwrap();
    b.write(0, Slice::new(xbuf, 0, xs.len()), xs).unwrap();
    let mut outs = Vec::new();
    for s in p.shards {
        let n = (p.out_len(s) + p.gap) * p.lanes;
        let o = b.alloc(0, n).unwrap();
        b.write(0, Slice::new(o, 0, n), &vec![f32::from_bits(0x7FC0_0001); n]).unwrap();
        outs.push((o, p.out_len(s)));
    }
    let ops: Vec<Op> = p
        .active
        .iter()
        .map(|&l| {
            let x = Slice::new(xbuf, l * x_pitch, cols);
            let out = |j: usize| Slice::new(outs[j].0, l * (outs[j].1 + p.gap), outs[j].1);
            match p.kind {
                Kind::Rows => Op::GemvRows { w: ws[0], x, out: out(0), order: RowOrder::Canonical },
                Kind::Partials => Op::GemvPartials { w: ws[0], x, out: out(0) },
                Kind::Batch => Op::GemvRowsBatch { items: ws.iter().enumerate().map(|(j, &w)| (w, out(j))).collect(), x },
            }
        })
        .collect();
    let before = b.census();
    if fused {
        b.launch_lanes(0, ops).unwrap();
    } else {
        ops.into_iter().for_each(|op| b.launch(0, op).unwrap());
    }
    let census = census_change(&before, &b.census());
    let outs = outs.iter().map(|&(o, n)| b.read(0, Slice::new(o, 0, (n + p.gap) * p.lanes)).unwrap()).collect();
    Outcome { outs, census }
}

fn format_of(s: &MatrixShard) -> &'static str {
    match s.data {
        memra_runtime::model::matrix::ShardData::Bf16(_) => "bf16",
        _ => "f32",
    }
}

fn kernel_of(kind: Kind) -> &'static str {
    match kind {
        Kind::Rows => "gemv_rows",
        Kind::Partials => "gemv_partials",
        Kind::Batch => "gemv_rows_batch",
    }
}

/// Host, per-lane device launches and one fused device launch of `p`: the three outputs must be
/// the same bits; returns the fused outcome and the label, or the first failure.
fn check_pass(host: &mut HostBackend, dev: &mut CudaBackend, p: &Pass, rng: &mut Rng) -> Result<Outcome, String> {
    let xs = rng.vec((p.shards[0].in_features + p.gap) * p.lanes, 4.0);
    let want = run(host, p, &xs, true);
    let per_lane = run(dev, p, &xs, false);
    let fused = run(dev, p, &xs, true);
    if let Some(m) = compare(&want.outs, &per_lane.outs, false) {
        return Err(format!("per-lane launches differ from the host: {m}"));
    }
    if let Some(m) = compare(&want.outs, &fused.outs, false) {
        return Err(format!("the fused launch differs from the host: {m}"));
    }
    Ok(fused)
}

fn shapes(rng: &mut Rng) -> Vec<MatrixShard> {
    let mut v = Vec::new();
    for (rows, cols, kw) in [(37, 1024, 128), (64, 2048, 256), (288, 4096, 512), (5, 1000, 125), (9, 96, 12), (3, 8, 1)]
    {
        v.push(bf16_shard(rng, rows, cols, kw));
    }
    for (rows, cols, kw) in [(21, 1024, 128), (7, 1000, 125)] {
        v.push(f32_shard(rng, rows, cols, kw));
    }
    v
}

fn label(p: &Pass, layout: &CudaOptions) -> String {
    let s = &p.shards[0];
    format!(
        "{:?} {} {}x{}/{} ×{} lanes {:?} gap {} [{:?}]",
        p.kind,
        format_of(s),
        s.out_features,
        s.in_features,
        s.kblock_width,
        p.shards.len(),
        p.active,
        p.gap,
        layout.gemv_layout
    )
}

fn fused_lanes_equal_per_lane_and_host() -> Ran {
    let mut rng = Rng::new(0x1a9e5);
    let singles = shapes(&mut rng);
    // The qkv seam's batch: four weights of one width (q, k, v, gate), BF16 and F32.
    let batches: Vec<Vec<MatrixShard>> = vec![
        [(40, 1024, 128), (16, 1024, 128), (16, 1024, 128), (8, 1024, 128)]
            .iter()
            .map(|&(r, c, k)| bf16_shard(&mut rng, r, c, k))
            .collect(),
        [(24, 512, 64), (9, 512, 64)].iter().map(|&(r, c, k)| f32_shard(&mut rng, r, c, k)).collect(),
    ];
    let mut failures = Vec::new();
    let mut ran = 0usize;
    for layout in [FAST, ROW_MAJOR] {
        let mut dev = cuda_backend(1, layout)?;
        let mut host = HostBackend::new(1).expect("host backend");
        let mut passes: Vec<Pass> = Vec::new();
        for lanes in 1..=8 {
            let gap = if lanes % 2 == 1 { 3 } else { 0 };
            let active: Vec<usize> = (0..lanes).collect();
            for s in &singles {
                for kind in [Kind::Rows, Kind::Partials] {
                    let shards = std::slice::from_ref(s);
                    passes.push(Pass { kind, shards, lanes, gap, active: active.clone() });
                }
            }
            for b in &batches {
                passes.push(Pass { kind: Kind::Batch, shards: b, lanes, gap, active: active.clone() });
            }
        }
        for p in &passes {
            let what = label(p, &layout);
            match check_pass(&mut host, &mut dev, p, &mut rng) {
                Err(e) => failures.push(format!("{what}: {e}")),
                Ok(fused) => {
                    // One fused launch for 2 lanes or more; one lane is a plain launch.
                    let name = if p.lanes > 1 { format!("{}_lanes", kernel_of(p.kind)) } else { kernel_of(p.kind).into() };
                    let want: Counts = [(format!("launch.{name}.{}", format_of(&p.shards[0])), 1)].into();
                    if fused.census != want {
                        failures.push(format!("{what}: census {:?}, expected {want:?}", fused.census));
                    }
                    ran += 1;
                }
            }
        }
    }
    println!("{ran} passes: fused = per-lane = host, bit for bit, one fused launch each");
    assert!(failures.is_empty(), "{} failing pass(es):\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

fn unfusable_lanes_run_lane_by_lane() -> Ran {
    let mut rng = Rng::new(0x1a9e6);
    let w = [bf16_shard(&mut rng, 64, 1024, 128)];
    let mut dev = cuda_backend(1, FAST)?;
    let mut host = HostBackend::new(1).expect("host backend");
    // Lanes 0, 1 and 3 of four (a finished row skipped): no constant pitch.
    for kind in [Kind::Rows, Kind::Partials] {
        let p = Pass { kind, shards: &w, lanes: 4, gap: 0, active: vec![0, 1, 3] };
        let fused = check_pass(&mut host, &mut dev, &p, &mut rng).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        let want: Counts = [(format!("launch.{}.bf16", kernel_of(kind)), 3)].into();
        assert_eq!(fused.census, want, "{kind:?} with a skipped lane must run lane by lane");
    }
    // The tree order (QKV_FUSED) has no multi-lane kernel.
    let ws = dev.upload_weight(0, &w[0]).unwrap();
    let (x, out) = (dev.alloc(0, 2 * 1024).unwrap(), dev.alloc(0, 2 * 64).unwrap());
    let ops: Vec<Op> = (0..2)
        .map(|l| Op::GemvRows {
            w: ws,
            x: Slice::new(x, l * 1024, 1024),
            out: Slice::new(out, l * 64, 64),
            order: RowOrder::Tree,
        })
        .collect();
    let before = dev.census();
    dev.launch_lanes(0, ops).unwrap();
    let want: Counts = [("launch.gemv_rows_tree.bf16".to_string(), 2)].into();
    assert_eq!(census_change(&before, &dev.census()), want, "the tree order runs lane by lane");
    Ok(())
}

fn a_planted_lane_swap_is_detected() -> Ran {
    let mut rng = Rng::new(0x1a9e7);
    let w = [bf16_shard(&mut rng, 288, 4096, 512)];
    let mut dev = cuda_backend(1, FAST)?;
    let mut host = HostBackend::new(1).expect("host backend");
    for lanes in [2, 8] {
        let p = Pass { kind: Kind::Rows, shards: &w, lanes, gap: 0, active: (0..lanes).collect() };
        let xs = rng.vec(4096 * lanes, 4.0);
        let want = run(&mut host, &p, &xs, true);
        let mut got = run(&mut dev, &p, &xs, true);
        assert_eq!(compare(&want.outs, &got.outs, false), None, "{lanes} lanes: the fused launch must match first");
        // Plant the swap of lanes 0 and 1 (what a kernel that mixed up lane pointers would give).
        let (a, b) = got.outs[0].split_at_mut(288);
        a.swap_with_slice(&mut b[..288]);
        let found = compare(&want.outs, &got.outs, false);
        let msg = found.unwrap_or_else(|| panic!("{lanes} lanes: a swap of lanes 0 and 1 went unnoticed"));
        assert!(msg.contains("element 0:"), "{lanes} lanes: the swap shows from lane 0's first row on: {msg}");
        println!("{lanes} lanes, planted swap detected: {msg}");
    }
    Ok(())
}

fn program_rows_and_columns() -> Ran {
    let m = generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap();
    let battery = Battery { prompts: vec![vec![3, 141, 59], vec![26, 535], vec![8, 9, 7, 9, 3, 2], vec![38]], gen_tokens: 3 };
    let cfg = |tp: usize, pass: PassShape| {
        let mut c = RunConfig::new(tp, Transport::NativeP2p, battery.clone()).unwrap();
        c.pass = pass;
        c
    };
    let oracle = program::run(&m, &cfg(1, PassShape::SINGLE), &mut HostBackend::new(1).unwrap()).unwrap();
    for tp in [1, 2] {
        for (b, t) in [(4, 1), (1, 4)] {
            let mut dev = cuda_backend(tp, crate::cases::CO_RESIDENT)?;
            let r = program::run(&m, &cfg(tp, PassShape::new(b, t).unwrap()), &mut dev)
                .unwrap_or_else(|e| panic!("TP{tp} batch {b} columns {t}: CUDA run failed: {e}"));
            let what = format!("TP{tp} batch {b} columns {t}");
            assert_eq!(r.digests, oracle.digests, "{what}: seam digests differ from the single-token host run");
            assert_eq!((&r.tokens, &r.top2), (&oracle.tokens, &oracle.top2), "{what}: tokens / top-2");
            let fused: u64 = r.census.iter().filter(|(k, _)| k.contains("_lanes.")).map(|(_, v)| v).sum();
            assert!(fused > 0, "{what}: no fused lane launch in the census: {:?}", r.census);
            println!("{what}: equal to the host oracle; {fused} fused lane launches");
        }
    }
    Ok(())
}

/// Mean device time of `reps` repetitions of `f` (timing marks around them, after a warm-up).
fn timed(b: &mut CudaBackend, reps: usize, f: &mut dyn FnMut(&mut CudaBackend)) -> f64 {
    for _ in 0..3 {
        f(b);
    }
    b.collect().unwrap();
    b.mark().unwrap();
    for _ in 0..reps {
        f(b);
    }
    b.mark().unwrap();
    let c = b.collect().unwrap();
    c.marks_ns[0][1] as f64 / reps as f64
}

fn lanes_timing_report() -> Ran {
    if std::env::var("MEMRA_GPU_BENCH").as_deref() != Ok("1") {
        return Err(Skip::NotRequested("a measurement: set MEMRA_GPU_BENCH=1 to run it".into()));
    }
    let mut rng = Rng::new(0x1a9e8);
    let mut b = cuda_backend(1, FAST)?;
    let cases: Vec<(&str, Kind, Vec<MatrixShard>)> = vec![
        ("qkv batch bf16 4096+1024+1024+32 x4096", Kind::Batch, {
            [(4096, 4096, 512), (1024, 4096, 512), (1024, 4096, 512), (32, 4096, 512)]
                .iter()
                .map(|&(r, c, k)| bf16_shard(&mut rng, r, c, k))
                .collect()
        }),
        ("o-proj partials bf16 4096x4096", Kind::Partials, vec![bf16_shard(&mut rng, 4096, 4096, 512)]),
        ("router rows bf16 288x4096", Kind::Rows, vec![bf16_shard(&mut rng, 288, 4096, 512)]),
        ("lm_head rows bf16 32768x4096", Kind::Rows, vec![bf16_shard(&mut rng, 32768, 4096, 512)]),
    ];
    for (what, kind, shards) in &cases {
        let ws: Vec<WeightId> = shards.iter().map(|s| b.upload_weight(0, s).unwrap()).collect();
        let lanes = 8;
        let cols = 4096;
        let x = b.alloc(0, cols * lanes).unwrap();
        b.write(0, Slice::new(x, 0, cols * lanes), &rng.vec(cols * lanes, 1.0)).unwrap();
        let p = Pass { kind: *kind, shards, lanes, gap: 0, active: (0..lanes).collect() };
        let outs: Vec<(u32, usize)> =
            shards.iter().map(|s| (b.alloc(0, p.out_len(s) * lanes).unwrap(), p.out_len(s))).collect();
        let ops: Vec<Op> = (0..lanes)
            .map(|l| {
                let xs = Slice::new(x, l * cols, cols);
                let out = |j: usize| Slice::new(outs[j].0, l * outs[j].1, outs[j].1);
                match kind {
                    Kind::Rows => Op::GemvRows { w: ws[0], x: xs, out: out(0), order: RowOrder::Canonical },
                    Kind::Partials => Op::GemvPartials { w: ws[0], x: xs, out: out(0) },
                    Kind::Batch => Op::GemvRowsBatch {
                        items: ws.iter().enumerate().map(|(j, &w)| (w, out(j))).collect(),
                        x: xs,
                    },
                }
            })
            .collect();
        let one = timed(&mut b, 20, &mut |b| b.launch(0, ops[0].clone()).unwrap());
        let per_lane = timed(&mut b, 20, &mut |b| ops.iter().for_each(|op| b.launch(0, op.clone()).unwrap()));
        let fused = timed(&mut b, 20, &mut |b| b.launch_lanes(0, ops.clone()).unwrap());
        let bytes: usize = shards.iter().map(|s| s.bytes()).sum();
        println!(
            "lanes {what}: 1 lane {:.1} us; 8 lanes per-lane {:.1} us, fused {:.1} us ({:.2}x faster, {:.0} GB/s of weights)",
            one / 1e3,
            per_lane / 1e3,
            fused / 1e3,
            per_lane / fused,
            bytes as f64 / fused
        );
    }
    Ok(())
}
