//! The CUDA backend against the host twins, bit for bit: every kernel on seeded inputs (signed
//! zeros, subnormals, E4M3 codes up to ±448, large |x| for exp/silu), then the whole decode
//! program (device-host gate: CUDA TP1 = host TP1; CUDA TP2/4/8 co-resident over host-bounce and
//! native-p2p = CUDA TP1; the reversed-K-block canary differs at o_join), NCCL between distinct
//! devices, and the skip-fence canary.
//!
//! Without a CUDA device every test here reads `ignored (no CUDA device: <reason>)`; with
//! `MEMRA_REQUIRE_GPU=1` (the GPU machine) that is a failure (`harness.rs`). Cases that need
//! several devices are registered per device count (`…::on_4_devices`).
//! `nvrtc_compiles_all_kernels` needs only libnvrtc (no device): it compiles the sources with the
//! production options and checks the PTX for contraction and approximate math.

use crate::harness::{cuda_backend, gpu_required, GpuTest, NotRun, Ran, Skip};
use memra_kernels::sources::KERNEL_NAMES;
use memra_kernels::twins::digest::digest_f32;
use memra_runtime::backend::cuda::{self, CudaBackend, CudaOptions};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{
    capability, AllReduce, Backend, Op, RowOrder, Slice, Transfer, UnfencedCopies, PROBE_SIZES_BYTES,
};
use memra_runtime::model::matrix::{MatrixShard, ShardData};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::evidence::record::{CaptureKey, Record, Seam};
use memra_runtime::{program, Battery, Canary, DoorSet, RunConfig, RuntimeError, Transport};

/// Every test of this file; the cases that need several devices are registered once per count.
pub fn tests() -> Vec<GpuTest> {
    let mut t = vec![
        GpuTest::new("gemv_rows_matches_twin", gemv_rows_matches_twin),
        GpuTest::new("gemv_partials_matches_twin", gemv_partials_matches_twin),
        GpuTest::new("gemv_rows_tree_matches_twin", gemv_rows_tree_matches_twin),
        GpuTest::new("fold_matches_twin", fold_matches_twin),
        GpuTest::new("elementwise_match_twins", elementwise_match_twins),
        GpuTest::new("norms_match_twins", norms_match_twins),
        GpuTest::new("attention_kernels_match_twins", attention_kernels_match_twins),
        GpuTest::new("moe_kernels_match_twins", moe_kernels_match_twins),
        GpuTest::new("digest_matches_twin", digest_matches_twin),
        GpuTest::new("copies_between_ranks_move_bytes_exactly", copies_between_ranks_move_bytes_exactly),
        GpuTest::new("nvrtc_compiles_all_kernels", nvrtc_compiles_all_kernels).needs_devices(0),
        GpuTest::new("probing_never_panics", probing_never_panics).needs_devices(0),
        GpuTest::new("program_device_host_gate_and_tp_invariance", program_device_host_gate_and_tp_invariance),
        GpuTest::new("reversed_kblocks_canary_differs_at_o_join", reversed_kblocks_canary_differs_at_o_join),
        GpuTest::new("doors_on_cuda_equal_doors_on_host", doors_on_cuda_equal_doors_on_host),
        GpuTest::new(
            "backends_without_nccl_refuse_all_reduce_and_unfenced_copies",
            backends_without_nccl_refuse_all_reduce_and_unfenced_copies,
        )
        .needs_devices(0),
        GpuTest::new(
            "nccl_allreduce_door_is_refused_on_co_resident_ranks",
            nccl_allreduce_door_is_refused_on_co_resident_ranks,
        ),
        GpuTest::new("skip_fence_canary_engages_on_cuda", skip_fence_canary_engages_on_cuda),
        GpuTest::new("gemv_bandwidth_report", gemv_bandwidth_report),
    ];
    for (name, body) in [
        ("program_on_distinct_devices_equals_tp1", program_on_distinct_devices_equals_tp1 as fn(usize) -> Ran),
        ("nccl_copies_move_bytes_exactly_between_devices", nccl_copies_move_bytes_exactly_between_devices),
        ("program_over_nccl_equals_tp1", program_over_nccl_equals_tp1),
        ("nccl_allreduce_door_engages_and_reports_its_o_join", nccl_allreduce_door_engages_and_reports_its_o_join),
    ] {
        t.extend(GpuTest::per_device_count(name, &[2, 4, 8], body));
    }
    let skip_fence = skip_fence_canary_on_distinct_devices;
    t.extend(GpuTest::per_device_count("skip_fence_canary_engages_on_cuda", &[2, 4], skip_fence));
    t
}

use crate::cases::*;

fn gemv_cases(seed: u64, orders: &[&str]) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    // (label, shard, whether its results may hold NaN: only the E4M3 case with NaN codes).
    let mut shards: Vec<(String, MatrixShard, bool)> = Vec::new();
    for (rows, cols, kw) in [(37, 1024, 128), (64, 2048, 256), (33, 4096, 512), (5, 1000, 125), (9, 96, 12), (3, 8, 1)]
    {
        shards.push((format!("bf16 {rows}x{cols}/{kw}"), bf16_shard(&mut rng, rows, cols, kw), false));
    }
    for (rows, cols, kw) in [(21, 1024, 128), (7, 1000, 125)] {
        shards.push((format!("f32 {rows}x{cols}/{kw}"), f32_shard(&mut rng, rows, cols, kw), false));
    }
    for (rows, cols, kw, row0, nan) in [
        (300, 1024, 128, 0, false),
        (200, 1024, 128, 100, false),
        (40, 4096, 512, 0, false),
        (130, 1280, 640, 60, false),
        (17, 384, 384, 0, false),
        (20, 1024, 128, 0, true),
        // Wider than the block-per-lane kernels stage (32 scale blocks): lane-major, 16 and 4.
        (12, 8192, 1024, 0, false),
        (9, 5120, 640, 130, false),
    ] {
        let label = format!("e4m3 {rows}x{cols}/{kw} row0 {row0}{}", if nan { " with NaN codes" } else { "" });
        shards.push((label, e4m3_shard(&mut rng, rows, cols, kw, row0, nan), nan));
    }
    for (rows, cols, kw) in [(19, 1024, 128), (8, 1280, 640), (4, 48, 16)] {
        shards.push((format!("nvfp4 {rows}x{cols}/{kw}"), nvfp4_shard(&mut rng, rows, cols, kw), false));
    }
    for (rows, cols, kw) in [(23, 1024, 128), (6, 2048, 1024)] {
        shards.push((format!("w8 {rows}x{cols}/{kw}"), bf16_shard(&mut rng, rows, cols, kw).to_w8(), false));
    }
    let mut cases = Vec::new();
    for (label, shard, nan_codes) in shards {
        let is_dense = matches!(shard.data, ShardData::Bf16(_) | ShardData::F32(_));
        let (rows, cols, kw) = (shard.out_features, shard.in_features, shard.kblock_width);
        // The block-per-lane E4M3 kernels stage a 16-byte-aligned x with float4 loads and any
        // other x value by value (gemv.cu `bpl_stage_x`): x also at +1 and +4 floats into its
        // buffer, so both paths meet the twin.
        let bpl = matches!(shard.data, ShardData::E4m3 { .. }) && !nan_codes && cols <= 4096;
        let x_offsets: &[usize] = if bpl { &[0, 1, 4] } else { &[0] };
        for (&order, &x_off) in orders.iter().flat_map(|o| x_offsets.iter().map(move |x| (o, x))) {
            if order == "tree" && !is_dense {
                continue;
            }
            let at = if x_off > 0 { format!(" x at +{x_off}") } else { String::new() };
            let mut c = Case::new(format!("{order} {label}{at}"));
            // A NaN code makes its rows NaN. NaN payloads are not part of the kernel contract:
            // the host twin keeps the quiet NaN its decode produced (0x7FC00000) while NVIDIA
            // GPUs return the canonical NaN (0x7FFFFFFF), so these cases compare "both NaN" as
            // equal. Only these: every other case compares bits, and no real model has NaN
            // codes (the loader rejects an F8_E4M3 code 0x7F/0xFF, `model/format/mod.rs`).
            c.nan_equal = nan_codes;
            let w = c.weight(shard.clone());
            let x = c.buf(rng.vec(x_off + cols, 4.0));
            let x = Slice::new(x.buf, x_off, cols);
            let op = match order {
                "rows" => Op::GemvRows { w, x, out: c.out(rows), order: RowOrder::Canonical },
                "tree" => Op::GemvRows { w, x, out: c.out(rows), order: RowOrder::Tree },
                _ => Op::GemvPartials { w, x, out: c.out(rows * (cols / kw)) },
            };
            c.ops.push(op);
            cases.push(c);
        }
    }
    cases
}

// ---------------------------------------------------------------- kernels

fn gemv_rows_matches_twin() -> Ran {
    check_cases("gemv_rows", gemv_cases(11, &["rows"]), &[FAST, ROW_MAJOR])?;
    Ok(())
}

fn gemv_partials_matches_twin() -> Ran {
    check_cases("gemv_partials", gemv_cases(12, &["partials"]), &[FAST, ROW_MAJOR])?;
    Ok(())
}

fn gemv_rows_tree_matches_twin() -> Ran {
    check_cases("gemv_rows_tree", gemv_cases(13, &["tree"]), &[FAST, ROW_MAJOR])?;
    Ok(())
}

fn fold_matches_twin() -> Ran {
    let mut rng = Rng::new(21);
    let mut cases = Vec::new();
    for (n_parts, width) in [(8, 1024), (2, 4096), (1, 7), (5, 33)] {
        for reverse in [false, true] {
            let mut c = Case::new(format!("{n_parts}x{width} reverse={reverse}"));
            let mut data = rng.vec(n_parts * width, 3.0);
            data[0] = -0.0; // a lone −0.0 column must fold to +0.0
            for p in 0..n_parts {
                data[p * width] = -0.0;
            }
            let parts = c.buf(data);
            let out = c.out(width);
            c.ops.push(Op::Fold { parts, n_parts, reverse, out });
            cases.push(c);
        }
    }
    check_cases("fold_f32", cases, &[FAST])?;
    Ok(())
}

fn elementwise_match_twins() -> Ran {
    let mut rng = Rng::new(22);
    let mut cases = Vec::new();
    for n in [1, 1000, 70_000] {
        let mut c = Case::new(format!("add {n}"));
        let (a, b) = (c.buf(rng.vec(n, 100.0)), c.buf(rng.vec(n, 100.0)));
        let out = c.out(n);
        c.ops.push(Op::Add { a, b, out });
        cases.push(c);
        let mut c = Case::new(format!("add in place {n}"));
        let (a, b) = (c.buf(rng.vec(n, 1.0)), c.buf(rng.vec(n, 1.0)));
        c.outputs.push(a);
        c.ops.push(Op::Add { a, b, out: a });
        cases.push(c);
        for s in [0.3f32, -1.7, f32::from_bits(0x0000_0003), 1e30] {
            let mut c = Case::new(format!("scale {n} by {s:e} in place"));
            let x = c.buf(rng.vec(n, 10.0));
            c.outputs.push(x);
            c.ops.push(Op::Scale { x, s, out: x });
            cases.push(c);
        }
    }
    let mut c = Case::new("flip_low_bit");
    let x = c.buf(vec![1.5, 2.5]);
    c.outputs.push(x);
    c.ops.push(Op::FlipLowBit { x: x.sub(0, 1) });
    cases.push(c);
    let mut c = Case::new("flip_low_bit of an element inside a buffer");
    let x = c.buf(vec![-0.0, 3.0, 4.0]);
    c.outputs.push(x);
    c.ops.push(Op::FlipLowBit { x: x.sub(1, 2) });
    cases.push(c);
    check_cases("elementwise", cases, &[FAST])?;
    Ok(())
}


fn norms_match_twins() -> Ran {
    let mut rng = Rng::new(23);
    let mut cases = Vec::new();
    // Up to 16 · 256 values a row is held in registers, above that staged in shared memory
    // (norm.cu): 4096 and 4097 are either side.
    for (rows, width) in [(1, 1024), (3, 4096), (2, 4097), (1, 6000), (2, 100), (4, 31), (1, 1)] {
        let mut c = Case::new(format!("rmsnorm {rows}x{width}"));
        let (x, w) = (c.buf(rng.vec(rows * width, 8.0)), c.buf(rng.vec(width, 2.0)));
        let out = c.out(rows * width);
        c.ops.push(Op::RmsNorm { x, w, eps: EPS, out });
        cases.push(c);

        let mut c = Case::new(format!("rmsnorm in place {rows}x{width}"));
        let (x, w) = (c.buf(rng.vec(rows * width, 8.0)), c.buf(rng.vec(width, 2.0)));
        c.outputs.push(x);
        c.ops.push(Op::RmsNorm { x, w, eps: EPS, out: x });
        cases.push(c);

        let mut c = Case::new(format!("add_rmsnorm {rows}x{width}"));
        let (x, a, w) =
            (c.buf(rng.vec(rows * width, 8.0)), c.buf(rng.vec(rows * width, 8.0)), c.buf(rng.vec(width, 2.0)));
        let (h, out) = (c.out(rows * width), c.out(rows * width));
        c.ops.push(Op::AddRmsNorm { x, a, w, eps: EPS, h, out });
        cases.push(c);

        let n_parts = 8;
        let mut c = Case::new(format!("fold_add_rmsnorm {rows}x{width}"));
        let parts = c.buf(rng.vec(n_parts * rows * width, 2.0));
        let (x, w) = (c.buf(rng.vec(rows * width, 8.0)), c.buf(rng.vec(width, 2.0)));
        let (a, h, out) = (c.out(rows * width), c.out(rows * width), c.out(rows * width));
        c.ops.push(Op::FoldAddRmsNorm { parts, n_parts, x, w, eps: EPS, a, h, out });
        cases.push(c);
    }
    // A zero row: ss = 0, inv = 1/sqrt(eps).
    let mut c = Case::new("rmsnorm of zeros");
    let (x, w) = (c.buf(vec![0.0; 256]), c.buf(vec![1.0; 256]));
    let out = c.out(256);
    c.ops.push(Op::RmsNorm { x, w, eps: EPS, out });
    cases.push(c);
    check_cases("norm", cases, &[FAST])?;
    Ok(())
}

fn rope_row(pos: usize) -> Vec<f32> {
    let angles: Vec<f64> = (0..64).map(|i| pos as f64 * 1e6f64.powf(-(2.0 * i as f64) / 128.0)).collect();
    angles.iter().map(|a| a.cos() as f32).chain(angles.iter().map(|a| a.sin() as f32)).collect()
}

fn attention_kernels_match_twins() -> Ran {
    let mut rng = Rng::new(24);
    let mut cases = Vec::new();
    for (heads, pos) in [(8, 0), (1, 5), (9, 1000), (32, 77)] {
        let mut c = Case::new(format!("qk_norm_rope {heads} heads pos {pos}"));
        let x = c.buf(rng.vec(heads * 128, 6.0));
        let w = c.buf(rng.vec(128, 2.0));
        let cos_sin = c.buf(rope_row(pos));
        c.outputs.push(x);
        c.ops.push(Op::QkNormRope { x, w, eps: EPS, cos_sin });
        cases.push(c);
    }
    for (len, q_heads, kv_heads, score_scale) in [
        (1, 8, 8, 1.0),
        (31, 8, 2, 1.0),
        (32, 4, 4, 3.0),
        (33, 8, 1, 1.0),
        (100, 16, 8, 6.0),
        (256, 32, 8, 2.0),
        (64, 2, 1, 40.0),
        // The most positions whose scores fit a block's shared memory (the launch's capacity rule,
        // 47 KiB): 376 partitions.
        (12032, 2, 1, 2.0),
    ] {
        let mut c = Case::new(format!("decode_attention len {len} q {q_heads} kv {kv_heads} x{score_scale}"));
        let cap = len + 3; // a cache allocated for more positions than are read
        let q = c.buf(rng.vec(q_heads * 128, score_scale));
        let k = c.buf(rng.vec(cap * kv_heads * 128, score_scale));
        let v = c.buf(rng.vec(cap * kv_heads * 128, 4.0));
        let mut g = rng.vec(q_heads, 3.0);
        g[0] = 95.0; // sigmoid saturates to 1
        let gate = c.buf(g);
        let out = c.out(q_heads * 128);
        let (k, v) = (k.sub(0, len * kv_heads * 128), v.sub(0, len * kv_heads * 128));
        c.ops.push(Op::Attention { q, k, v, gate, len, q_heads, kv_heads, out });
        cases.push(c);
    }
    check_cases("attention", cases, &[FAST])?;
    Ok(())
}

fn moe_kernels_match_twins() -> Ran {
    let mut rng = Rng::new(25);
    let mut cases = Vec::new();
    for (n, k, normalize, dup) in
        // 600 experts: a second batch of candidates per thread (moe.cu's ROUTER_BATCH) and the scan path.
        [
            (8, 2, true, false),
            (288, 8, true, false),
            (288, 8, false, true),
            (16, 16, true, true),
            (64, 4, true, false),
            (600, 8, true, true),
        ]
    {
        for device_variant in [false, true] {
            let mut logits = rng.vec(n, 6.0);
            let mut bias = rng.vec(n, 0.1);
            if dup {
                // Equal keys: the tie-break decides.
                for e in (0..n).step_by(3) {
                    logits[e] = 1.25;
                    bias[e] = 0.0;
                }
                // NaN keys rank below every number, -inf among the numbers; two NaNs by id.
                logits[n - 1] = f32::NAN;
                logits[n - 2] = f32::NAN;
                bias[2] = f32::NEG_INFINITY;
            }
            logits[1] = -120.0; // exp_c overflow side of sigmoid
            let mut c =
                Case::new(format!("router {n} experts top-{k} normalize={normalize} ties={dup} dev={device_variant}"));
            c.nan_equal = true;
            let (logits, bias) = (c.buf(logits), c.buf(bias));
            let out = c.out(2 * k);
            c.ops.push(Op::Router { logits, bias, k, normalize, scaling: 2.5, out, device_variant });
            cases.push(c);
        }
    }
    for limit in [None, Some(7.0f32)] {
        let n = 5000;
        let mut c = Case::new(format!("swiglu limit {limit:?}"));
        c.nan_equal = true;
        let mut gate = rng.vec(n, 30.0);
        for (i, g) in
            [f32::INFINITY, f32::NEG_INFINITY, -0.0, 89.0, -89.0, 104.5, -104.5, 1e20, -1e20].into_iter().enumerate()
        {
            gate[i] = g;
        }
        let (gate, up) = (c.buf(gate), c.buf(rng.vec(n, 20.0)));
        let out = c.out(n);
        c.ops.push(Op::Swiglu { gate, up, limit, out });
        cases.push(c);
    }
    for (slots, width) in [(9, 1024), (1, 5), (3, 4096)] {
        let mut c = Case::new(format!("combine {slots}x{width}"));
        let (y, w) = (c.buf(rng.vec(slots * width, 5.0)), c.buf(rng.vec(slots, 1.0)));
        let out = c.out(width);
        c.ops.push(Op::Combine { y, w, out });
        cases.push(c);
    }
    let mut argmax_inputs: Vec<(String, Vec<f32>)> = vec![
        ("random 1024".into(), rng.vec(1024, 10.0)),
        ("random 32768".into(), rng.vec(32768, 10.0)),
        ("signed zeros".into(), vec![-0.0, 0.0, -0.0, 0.0]),
        ("all NaN".into(), vec![f32::NAN; 7]),
        ("empty".into(), vec![]),
    ];
    let mut ties = rng.vec(5000, 1.0);
    for i in [17, 900, 4000] {
        ties[i] = 3.0;
    }
    ties[3] = f32::NAN;
    argmax_inputs.push(("ties and NaN".into(), ties));
    // More values than the grid has threads (several per thread: argmax_f32's load batches).
    let mut long = rng.vec(70_001, 10.0);
    long[70_000] = 11.0;
    argmax_inputs.push(("long with its best in the tail".into(), long));
    // Every value below zero but signed zeros in four blocks, -0.0 first: the blocks' rank codes
    // meet in one atomic maximum, where -0.0 and +0.0 must tie and the lowest index win.
    let mut zeros: Vec<f32> = rng.vec(32_768, 10.0).iter().map(|v| -v.abs() - 1.0).collect();
    for (i, z) in [(5_000, -0.0), (9_000, 0.0), (20_000, -0.0), (32_767, 0.0)] {
        zeros[i] = z;
    }
    argmax_inputs.push(("negatives with signed zeros across blocks".into(), zeros));
    for (label, xs) in argmax_inputs {
        let mut c = Case::new(format!("argmax {label}"));
        let x = c.buf(xs);
        let out = c.out(1);
        c.ops.push(Op::Argmax { x, out });
        cases.push(c);
    }
    // A slice that starts one value into its buffer.
    let mut c = Case::new("argmax unaligned 4098");
    let x = c.buf(rng.vec(4099, 10.0)).sub(1, 4098);
    let out = c.out(1);
    c.ops.push(Op::Argmax { x, out });
    cases.push(c);
    check_cases("moe", cases, &[FAST])?;
    Ok(())
}

/// Digests go through Backend::digest/collect, twice (the slots are zeroed between steps).
fn digest_matches_twin() -> Ran {
    let mut b = cuda_backend(1, FAST)?;
    let mut rng = Rng::new(26);
    for step in 0..2 {
        let mut want = Vec::new();
        for (n, base) in [(1usize, 0u64), (1000, 7), (70_000, 123_456), (4096, 1 << 31)] {
            let data = rng.vec(n, 1e3);
            let id = b.alloc(0, n).unwrap();
            let s = Slice::new(id, 0, n);
            b.write(0, s, &data).unwrap();
            let t = b.digest(0, s, base).unwrap();
            assert_eq!(t, want.len());
            want.push(digest_f32(&data, base));
            let t = b.digest(0, s.sub(n / 2, n - n / 2), base + 5).unwrap();
            assert_eq!(t, want.len());
            want.push(digest_f32(&data[n / 2..], base + 5));
        }
        b.mark().unwrap();
        b.mark().unwrap();
        let got = b.collect().unwrap();
        assert_eq!(got.digests, want, "step {step}");
        assert_eq!(got.marks_ns.len(), 1);
        assert_eq!(got.marks_ns[0].len(), 2);
        assert_eq!(got.marks_ns[0][0], 0);
    }
    Ok(())
}

/// Copies between co-resident ranks over both transports, the byte-integrity probe, and the
/// nccl refusal.
fn copies_between_ranks_move_bytes_exactly() -> Ran {
    for tp in [2, 4] {
        let mut b = cuda_backend(tp, CO_RESIDENT)?;
        assert!(b.co_resident());
        let mut rng = Rng::new(27 + tp as u64);
        let n = 10_000;
        let bufs: Vec<u32> = (0..tp).map(|r| b.alloc(r, n).unwrap()).collect();
        for t in [Transport::HostBounce, Transport::NativeP2p] {
            for _ in 0..3 {
                let data = rng.vec(n, 1e3);
                b.write(0, Slice::new(bufs[0], 0, n), &data).unwrap();
                // a chain 0 → 1 → … → tp−1, then a partial copy back into the middle of rank 0
                for r in 1..tp {
                    b.copy(Transfer::new(t, (r - 1, Slice::new(bufs[r - 1], 0, n)), (r, Slice::new(bufs[r], 0, n)))).unwrap();
                }
                b.copy(Transfer::new(t, (tp - 1, Slice::new(bufs[tp - 1], 0, 100)), (0, Slice::new(bufs[0], 5000, 100)))).unwrap();
                let last = b.read(tp - 1, Slice::new(bufs[tp - 1], 0, n)).unwrap();
                assert!(last.iter().zip(&data).all(|(a, b)| a.to_bits() == b.to_bits()), "TP{tp} {t:?} chain");
                let first = b.read(0, Slice::new(bufs[0], 5000, 100)).unwrap();
                assert!(first.iter().zip(&data).all(|(a, b)| a.to_bits() == b.to_bits()), "TP{tp} {t:?} back");
            }
            let probe = b.probe(t, &PROBE_SIZES_BYTES).unwrap();
            assert_eq!(probe.len(), PROBE_SIZES_BYTES.len() * tp * (tp - 1));
            assert!(probe.iter().all(|p| p.bad_words == 0 && p.no_peer_access.is_none()), "TP{tp} {t:?}: {probe:?}");
        }
        let err = b.copy(Transfer::new(Transport::Nccl, (0, Slice::new(bufs[0], 0, 4)), (1, Slice::new(bufs[1], 0, 4)))).unwrap_err();
        assert!(matches!(&err, RuntimeError::Unsupported { mechanism: "nccl transport", .. }), "{err:?}");
        assert!(err.to_string().contains("nccl needs one device per rank"), "{err}");
    }
    Ok(())
}

fn nvrtc_compiles_all_kernels() -> Ran {
    if !cuda::nvrtc_library_present() {
        return Err(Skip::Missing("no NVRTC library (libnvrtc.so.13 not loadable; set LD_LIBRARY_PATH)".into()));
    }
    let arch =
        cuda::probe_cuda().ok().and_then(|s| s.devices.first().map(|d| d.arch())).unwrap_or_else(|| "sm_90".into());
    let c = cuda::compile(&arch).unwrap_or_else(|e| panic!("NVRTC failed for {arch}: {e}"));
    for name in KERNEL_NAMES {
        assert!(c.ptx.contains(&format!(".entry {name}(")), "kernel {name} missing from the PTX");
    }
    // No contraction and no approximate math in the canonical program.
    for banned in ["fma.rn.f32", "fma.f32", ".approx.", "div.full", "div.approx"] {
        assert!(!c.ptx.contains(banned), "the PTX contains `{banned}`");
    }
    assert!(!c.cubin.is_empty());
    println!(
        "nvrtc {}.{} compiled {} kernels for {arch}: {} bytes of PTX, {} bytes of CUBIN; options {}; log: {:?}",
        c.nvrtc_version.0,
        c.nvrtc_version.1,
        KERNEL_NAMES.len(),
        c.ptx.len(),
        c.cubin.len(),
        c.options.join(" "),
        c.log
    );
    if let Ok(dir) = std::env::var("MEMRA_DUMP_KERNELS") {
        std::fs::write(format!("{dir}/memra_kernels.{arch}.cubin"), &c.cubin).expect("write cubin");
        std::fs::write(format!("{dir}/memra_kernels.{arch}.ptx"), &c.ptx).expect("write ptx");
    }
    Ok(())
}

fn probing_never_panics() -> Ran {
    match cuda::probe_cuda() {
        Ok(s) => println!("{}", s.describe()),
        // Without a device this test still runs in full (its subject is the failed probe); on
        // the GPU machine a failed probe is the failure.
        Err(e) => assert!(!gpu_required(), "MEMRA_REQUIRE_GPU=1 but the probe failed: {e}"),
    }
    // A failed probe is an error value, never a panic, and stays the same.
    let a = cuda::probe_cuda().map(|s| s.devices.len());
    let b = cuda::probe_cuda().map(|s| s.devices.len());
    assert_eq!(a, b);
    if let Err(e) = CudaBackend::new(1) {
        assert!(matches!(e, RuntimeError::Unavailable(_)), "{e}");
    }
    Ok(())
}

// ---------------------------------------------------------------- the whole program

fn tiny() -> Model {
    generate(&ModelConfig::preset("tiny", Some(1)).expect("tiny preset"), 7).expect("tiny model")
}

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

fn describe_diff(r: &Record, d: Option<(usize, usize, usize)>) -> String {
    match d {
        None => "identical".into(),
        Some((p, s, i)) => {
            let (layer, seam) = Record::seam_at(r.n_layers, i);
            format!("first divergence: prompt {p} step {s} layer {layer} seam {}", seam.name())
        }
    }
}

fn run_program(model: &Model, cfg: &RunConfig, b: &mut dyn Backend) -> Record {
    program::run(model, cfg, b)
        .unwrap_or_else(|e| panic!("run TP{} {:?} on {}: {e}", cfg.tp, cfg.transport, b.describe()))
}

fn program_device_host_gate_and_tp_invariance() -> Ran {
    let mut tp1 = cuda_backend(1, FAST)?;
    let model = tiny();
    let battery = Battery::default_for(model.config.vocab, 1);
    let cfg = RunConfig::new(1, Transport::HostBounce, battery.clone()).unwrap();
    let oracle = run_program(&model, &cfg, &mut HostBackend::new(1).unwrap());
    let dev1 = run_program(&model, &cfg, &mut tp1);
    let d = first_diff(&oracle, &dev1);
    assert_eq!(d, None, "device-host gate: CUDA TP1 vs host TP1: {}", describe_diff(&oracle, d));
    assert_eq!(dev1.tokens, oracle.tokens);
    assert!(dev1.timings_ns.iter().any(|t| !t.is_empty()), "no timings recorded");
    println!("device-host gate: identical over {} prompts ({})", oracle.digests.len(), tp1.describe());

    // The reference (row-major) kernels give the same record.
    let mut rm = cuda_backend(1, ROW_MAJOR)?;
    let r = run_program(&model, &cfg, &mut rm);
    let d = first_diff(&oracle, &r);
    assert_eq!(d, None, "CUDA TP1 row-major kernels vs host: {}", describe_diff(&oracle, d));

    for tp in [2, 4, 8] {
        for t in [Transport::HostBounce, Transport::NativeP2p] {
            let mut b = cuda_backend(tp, CO_RESIDENT)?;
            let cfg = RunConfig::new(tp, t, battery.clone()).unwrap();
            let r = run_program(&model, &cfg, &mut b);
            let d = first_diff(&dev1, &r);
            assert_eq!(d, None, "CUDA TP{tp} co-resident {t:?} vs CUDA TP1: {}", describe_diff(&dev1, d));
            assert_eq!(r.tokens, dev1.tokens);
            println!("TP{tp} co-resident {} = CUDA TP1", t.name());
        }
    }
    Ok(())
}

/// TP`tp` with one rank per device equals CUDA TP1 over both transports (registered per device
/// count: the harness starts it only on a machine with `tp` devices). A device pair without peer
/// access leaves its native-p2p run not run, which the test reports instead of passing.
fn program_on_distinct_devices_equals_tp1(tp: usize) -> Ran {
    let model = tiny();
    let battery = Battery { prompts: vec![vec![1, 2, 3], vec![9, 8]], gen_tokens: 3 };
    let cfg1 = RunConfig::new(1, Transport::HostBounce, battery.clone()).unwrap();
    let mut b1 = cuda_backend(1, FAST)?;
    let base = run_program(&model, &cfg1, &mut b1);
    let mut not_run = NotRun::new();
    for t in [Transport::HostBounce, Transport::NativeP2p] {
        let mut b = cuda_backend(tp, FAST)?;
        assert!(!b.co_resident());
        let cfg = RunConfig::new(tp, t, battery.clone()).unwrap();
        match program::run(&model, &cfg, &mut b) {
            Ok(r) => {
                let d = first_diff(&base, &r);
                assert_eq!(d, None, "TP{tp} on devices {:?} {t:?}: {}", b.placement(), describe_diff(&base, d));
                not_run.ran();
            }
            Err(RuntimeError::Unavailable(reason)) if t == Transport::NativeP2p => {
                not_run.note(format!("TP{tp} native-p2p"), reason)
            }
            Err(e) => panic!("TP{tp} {t:?}: {e}"),
        }
    }
    not_run.finish()
}

fn reversed_kblocks_canary_differs_at_o_join() -> Ran {
    let mut b1 = cuda_backend(1, FAST)?;
    let model = tiny();
    let battery = Battery { prompts: vec![vec![1, 2, 3]], gen_tokens: 2 };
    let base = run_program(&model, &RunConfig::new(1, Transport::HostBounce, battery.clone()).unwrap(), &mut b1);
    let mut cfg = RunConfig::new(2, Transport::HostBounce, battery).unwrap();
    cfg.doors.canary = Some(Canary::ReverseKBlocks);
    let mut b2 = cuda_backend(2, CO_RESIDENT)?;
    let r = run_program(&model, &cfg, &mut b2);
    let (p, s, i) = first_diff(&base, &r).expect("the reversed reduction must be detected on CUDA");
    assert_eq!((p, s), (0, 0));
    assert_eq!(Record::seam_at(base.n_layers, i), (0, Seam::OJoin));
    Ok(())
}

/// Each door's arithmetic on CUDA equals the same door on the host, at TP1 and TP2 (the device
/// reproduces every twin, not only the default path).
fn doors_on_cuda_equal_doors_on_host() -> Ran {
    let model = tiny();
    let battery = Battery { prompts: vec![vec![3, 1, 4, 1], vec![5, 9]], gen_tokens: 3 };
    let doors: Vec<(&str, DoorSet)> = vec![
        ("f32_mirror", DoorSet { f32_mirror: true, ..DoorSet::default() }),
        ("qkv_fused", DoorSet { qkv_fused: true, ..DoorSet::default() }),
        ("dev_router", DoorSet { dev_router: true, ..DoorSet::default() }),
        ("w8", DoorSet { w8: true, ..DoorSet::default() }),
        ("oproj_direct+tail", DoorSet { oproj_direct: true, oproj_tail: true, ..DoorSet::default() }),
        ("moe_direct", DoorSet { moe_direct: true, ..DoorSet::default() }),
        ("routes_prestage", DoorSet { routes_prestage: true, ..DoorSet::default() }),
        ("step_ep", DoorSet { step_ep: true, ..DoorSet::default() }),
        ("nvfp4_ep2", DoorSet { nvfp4_ep2: true, ..DoorSet::default() }),
        (
            "flip canary",
            DoorSet { canary: Some(Canary::FlipBit { layer: 0, seam: Seam::Attn, step: 1, element: 0 }), ..DoorSet::default() },
        ),
        ("stale canary", DoorSet { canary: Some(Canary::StaleBuffer), ..DoorSet::default() }),
    ];
    let mut failures = Vec::new();
    for (name, set) in doors {
        for tp in [1, 2] {
            let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery.clone()).unwrap();
            cfg.doors = set;
            let host = match program::run(&model, &cfg, &mut HostBackend::new(tp).unwrap()) {
                Ok(r) => r,
                Err(e) => {
                    println!("not applicable: door {name} at TP{tp} is refused by the host program too ({e})");
                    continue;
                }
            };
            let mut b = cuda_backend(tp, CO_RESIDENT)?;
            match program::run(&model, &cfg, &mut b) {
                Err(e) => failures.push(format!("door {name} TP{tp}: CUDA run failed: {e}")),
                Ok(r) => match first_diff(&host, &r) {
                    None if r.tokens == host.tokens => println!("ok door {name} TP{tp}"),
                    d => failures.push(format!("door {name} TP{tp}: CUDA vs host: {}", describe_diff(&host, d))),
                },
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

// ---------------------------------------------------------------- NCCL, its door, the skip-fence canary

/// NCCL's version line, or why it cannot be loaded (a skip: a failure under MEMRA_REQUIRE_GPU=1,
/// where the harness already found the devices NCCL would run on).
fn nccl_loaded() -> Ran {
    match cuda::nccl_version() {
        Ok(v) => {
            println!("{v}");
            Ok(())
        }
        Err(reason) => Err(Skip::Missing(format!("no NCCL library: {reason}"))),
    }
}

fn capture_key(seam: Seam) -> CaptureKey {
    CaptureKey { prompt: 0, step: 0, layer: 0, seam }
}

/// Elements whose bits differ, and the first one.
fn bit_diff(want: &[u32], got: &[u32]) -> (usize, Option<String>) {
    let bad: Vec<usize> = (0..want.len().max(got.len())).filter(|i| want.get(*i) != got.get(*i)).collect();
    let first = bad.first().map(|&i| {
        let (w, g) = (want.get(i).copied().unwrap_or(0), got.get(i).copied().unwrap_or(0));
        format!("element {i}: {w:#010x} ({:e}) vs {g:#010x} ({:e})", f32::from_bits(w), f32::from_bits(g))
    });
    (bad.len(), first)
}

/// Neither the host nor any backend without NCCL or device streams silently runs the door or
/// the canary as the default path (no device needed).
fn backends_without_nccl_refuse_all_reduce_and_unfenced_copies() -> Ran {
    let mut h = HostBackend::new(2).unwrap();
    let (a, b) = (h.alloc(0, 8).unwrap(), h.alloc(1, 8).unwrap());
    let (sa, sb) = (Slice::new(a, 0, 8), Slice::new(b, 0, 8));
    let err = capability::all_reduce(&mut h).map(|_| ()).unwrap_err();
    assert!(matches!(&err, RuntimeError::Unsupported { mechanism: "NCCL all-reduce", .. }), "{err:?}");
    assert!(err.to_string().contains("no NCCL all-reduce"), "{err}");
    let _ = (sa, sb);
    let err = capability::unfenced_copies(&mut h).map(|_| ()).unwrap_err();
    assert!(matches!(&err, RuntimeError::Unsupported { mechanism: "unfenced copies", .. }), "{err:?}");
    assert!(err.to_string().contains("no producer fence to skip"), "{err}");
    // Through the program: the door asks for the nccl transport, which the host has not.
    let model = tiny();
    let battery = Battery { prompts: vec![vec![1, 2]], gen_tokens: 1 };
    let mut cfg = RunConfig::new(2, Transport::NativeP2p, battery).unwrap();
    cfg.doors.nccl_allreduce = true;
    let err = program::run(&model, &cfg, &mut HostBackend::new(2).unwrap()).unwrap_err();
    assert!(matches!(&err, RuntimeError::DoorRefused { door: "MEMRA_NCCL_ALLREDUCE", .. }), "{err:?}");
    assert!(err.to_string().contains("with transport native-p2p: the all-reduce runs on an NCCL communicator"), "{err}");
    cfg.doors = DoorSet { canary: Some(Canary::SkipFence), ..DoorSet::default() };
    let err = program::run(&model, &cfg, &mut HostBackend::new(2).unwrap()).unwrap_err();
    assert!(err.to_string().contains("no producer fence to skip"), "{err}");
    Ok(())
}

/// NCCL send/receive between distinct devices moves bytes exactly (NaN payloads, signed zeros
/// and infinities included), chained through every rank, and passes the byte-integrity probe.
fn nccl_copies_move_bytes_exactly_between_devices(tp: usize) -> Ran {
    nccl_loaded()?;
    let mut b = cuda_backend(tp, FAST)?;
    assert!(!b.co_resident());
    let mut rng = Rng::new(40 + tp as u64);
    let n = 10_000;
    let bufs: Vec<u32> = (0..tp).map(|r| b.alloc(r, n).unwrap()).collect();
    let whole = |r: usize| Slice::new(bufs[r], 0, n);
    for round in 0..3 {
        let mut data = rng.vec(n, 1e3);
        for (i, bits) in [0x7FC0_1234u32, 0xFF80_0001, 0x7F80_0001, 0x8000_0000, 0x7F80_0000, 0xFF80_0000, 1]
            .into_iter()
            .enumerate()
        {
            data[i * 7 + round] = f32::from_bits(bits);
        }
        b.write(0, whole(0), &data).unwrap();
        // A chain 0 → 1 → … → tp−1, a partial copy back into the middle of rank 0, and a
        // same-rank copy (no NCCL) on the last rank.
        for r in 1..tp {
            b.copy(Transfer::new(Transport::Nccl, (r - 1, whole(r - 1)), (r, whole(r)))).unwrap();
        }
        b.copy(Transfer::new(Transport::Nccl, (tp - 1, whole(tp - 1).sub(0, 100)), (0, whole(0).sub(5000, 100)))).unwrap();
        b.copy(Transfer::new(Transport::Nccl, (tp - 1, whole(tp - 1).sub(0, 100)), (tp - 1, whole(tp - 1).sub(9000, 100)))).unwrap();
        let want: Vec<u32> = data.iter().map(|v| v.to_bits()).collect();
        let last: Vec<u32> = b.read(tp - 1, whole(tp - 1)).unwrap().iter().map(|v| v.to_bits()).collect();
        let mut want_last = want.clone();
        want_last.copy_within(0..100, 9000);
        let (bad, first) = bit_diff(&want_last, &last);
        assert_eq!(bad, 0, "TP{tp} nccl chain: {bad} words differ, first {first:?}");
        let back: Vec<u32> = b.read(0, whole(0).sub(5000, 100)).unwrap().iter().map(|v| v.to_bits()).collect();
        let (bad, first) = bit_diff(&want[..100], &back);
        assert_eq!(bad, 0, "TP{tp} nccl copy back: {bad} words differ, first {first:?}");
    }
    let probe = b.probe(Transport::Nccl, &PROBE_SIZES_BYTES).unwrap();
    assert_eq!(probe.len(), PROBE_SIZES_BYTES.len() * tp * (tp - 1));
    assert!(probe.iter().all(|p| p.bad_words == 0 && p.no_peer_access.is_none()), "TP{tp} nccl: {probe:?}");
    println!("ok nccl copies and probe TP{tp} on devices {:?}", b.placement());
    Ok(())
}

/// NCCL only moves bytes: the whole program over `nccl`, ranks on distinct devices, equals CUDA
/// TP1 bit for bit (docs/DESIGN.md §3.5).
fn program_over_nccl_equals_tp1(tp: usize) -> Ran {
    nccl_loaded()?;
    let model = tiny();
    let battery = Battery::default_for(model.config.vocab, 1);
    let mut b1 = cuda_backend(1, FAST)?;
    let base = run_program(&model, &RunConfig::new(1, Transport::HostBounce, battery.clone()).unwrap(), &mut b1);
    let mut b = cuda_backend(tp, FAST)?;
    assert!(!b.co_resident());
    let cfg = RunConfig::new(tp, Transport::Nccl, battery.clone()).unwrap();
    let r = run_program(&model, &cfg, &mut b);
    let d = first_diff(&base, &r);
    assert_eq!(d, None, "TP{tp} nccl on devices {:?} vs CUDA TP1: {}", b.placement(), describe_diff(&base, d));
    assert_eq!(r.tokens, base.tokens);
    println!("TP{tp} nccl on devices {:?} = CUDA TP1 over {} prompts", b.placement(), base.digests.len());
    Ok(())
}

/// MEMRA_NCCL_ALLREDUCE on co-resident ranks: they cannot form a communicator, and the refusal
/// names the rule (runs on a one-GPU machine).
fn nccl_allreduce_door_is_refused_on_co_resident_ranks() -> Ran {
    let mut co = cuda_backend(2, CO_RESIDENT)?;
    let (a, b) = (co.alloc(0, 16).unwrap(), co.alloc(1, 16).unwrap());
    let err = co.all_reduce_sum(&[(0, Slice::new(a, 0, 16)), (1, Slice::new(b, 0, 16))], 0, Slice::new(a, 0, 16));
    let err = err.unwrap_err();
    assert!(matches!(&err, RuntimeError::Unsupported { mechanism: "nccl transport", .. }), "{err:?}");
    let err = err.to_string();
    assert!(err.contains("nccl needs one device per rank: TP2 on 1 device(s)"), "{err}");
    Ok(())
}

/// MEMRA_NCCL_ALLREDUCE (NUMERIC): refused on co-resident ranks; on distinct devices it engages
/// once per o_join, leaves o_proj untouched, and its o_join is compared with CUDA TP1 (printed:
/// a NUMERIC door may diverge). At TP2 the result is known exactly: NCCL adds two vectors, and
/// f32 addition is commutative, so o_join = fold(rank 0's K-blocks) + fold(rank 1's).
fn nccl_allreduce_door_engages_and_reports_its_o_join(tp: usize) -> Ran {
    nccl_loaded()?;
    let model = tiny();
    let hidden = model.config.hidden;
    let battery = Battery { prompts: vec![vec![1, 2, 3], vec![9, 8]], gen_tokens: 3 };
    let keys = vec![capture_key(Seam::OProj), capture_key(Seam::OJoin)];
    let mut cfg1 = RunConfig::new(1, Transport::HostBounce, battery.clone()).unwrap();
    cfg1.capture = keys.clone();
    let mut b1 = cuda_backend(1, FAST)?;
    let base = run_program(&model, &cfg1, &mut b1);
    let steps: usize = (0..battery.prompts.len()).map(|p| battery.steps_of(p)).sum();
    let mut cfg = RunConfig::new(tp, Transport::Nccl, battery.clone()).unwrap();
    cfg.doors.nccl_allreduce = true;
    // Teacher forcing: every step consumes the TP1 tokens, so the records stay aligned.
    cfg.forced_tokens = Some(base.tokens.clone());
    cfg.capture = keys.clone();
    let mut b = cuda_backend(tp, FAST)?;
    let r = run_program(&model, &cfg, &mut b);
    let n = r.engaged.get("nccl_allreduce.allreduces").copied().unwrap_or(0);
    assert_eq!(n as usize, steps * model.layers.len(), "TP{tp}: one all-reduce per o_join");
    let (want_oproj, got_oproj) = (&base.captures[&keys[0]].bits, &r.captures[&keys[0]].bits);
    let (bad, first) = bit_diff(want_oproj, got_oproj);
    assert_eq!(bad, 0, "TP{tp}: o_proj partials must not change under the door; first {first:?}");
    let (want, got) = (&base.captures[&keys[1]].bits, &r.captures[&keys[1]].bits);
    let (bad, first) = bit_diff(want, got);
    match first {
        None => println!("nccl_allreduce TP{tp}: o_join bit-identical to CUDA TP1 (prompt 0 step 0 layer 0)"),
        Some(f) => println!(
            "nccl_allreduce TP{tp}: o_join DIVERGED from CUDA TP1 in {bad} of {hidden} elements; first {f}"
        ),
    }
    println!("nccl_allreduce TP{tp}: whole record vs CUDA TP1: {}", describe_diff(&base, first_diff(&base, &r)));
    if tp == 2 {
        // fold(P0..P(G/2-1)) + fold(P(G/2)..P(G-1)), each fold from +0.0 in K-block order.
        let g = got_oproj.len() / hidden;
        let fold = |blocks: std::ops::Range<usize>, i: usize| {
            blocks.fold(0.0f32, |acc, k| acc + f32::from_bits(got_oproj[k * hidden + i]))
        };
        let exact: Vec<u32> = (0..hidden).map(|i| (fold(0..g / 2, i) + fold(g / 2..g, i)).to_bits()).collect();
        let (bad, first) = bit_diff(&exact, got);
        assert_eq!(bad, 0, "TP2 all-reduce ≠ S0 + S1: {bad} elements, first {first:?}");
        // Two runs of the same configuration agree (the determinism gate's question).
        let mut again = cuda_backend(tp, FAST)?;
        let r2 = run_program(&model, &cfg, &mut again);
        let d = first_diff(&r, &r2);
        assert_eq!(d, None, "nccl_allreduce TP2 is not deterministic: {}", describe_diff(&r, d));
    }
    Ok(())
}

/// The SkipFence canary's copy: refused within one rank, moves the bytes once the producer is
/// done, and in a program run it engages once per peer per o_join. Whether the race fires is
/// printed, never asserted (the selftest counts an identity or a determinism failure as caught).
fn skip_fence_canary_engages_on_cuda() -> Ran {
    let mut b = cuda_backend(2, CO_RESIDENT)?;
    let n = 4096;
    let (s, d) = (Slice::new(b.alloc(1, n).unwrap(), 0, n), Slice::new(b.alloc(0, n).unwrap(), 0, n));
    let data = Rng::new(50).vec(n, 10.0);
    b.write(1, s, &data).unwrap(); // write() waits for its stream: the producer is done
    b.copy_unfenced(Transfer::new(Transport::HostBounce, (1, s), (0, d))).unwrap();
    let got = b.read(0, d).unwrap();
    assert!(got.iter().zip(&data).all(|(x, y)| x.to_bits() == y.to_bits()), "unfenced copy of finished bytes");
    let err = b.copy_unfenced(Transfer::new(Transport::HostBounce, (0, d), (0, d))).unwrap_err();
    assert!(err.to_string().contains("no producer fence to skip"), "{err}");
    drop(b);

    let ctx = SkipFenceRuns::new()?;
    let mut not_run = NotRun::new();
    for tp in [2, 4] {
        for t in [Transport::HostBounce, Transport::NativeP2p] {
            ctx.check(tp, "co-resident", CO_RESIDENT, t, &mut not_run)?;
        }
    }
    not_run.finish()
}

/// The SkipFence canary's program runs with one rank per device (registered per device count).
fn skip_fence_canary_on_distinct_devices(tp: usize) -> Ran {
    let ctx = SkipFenceRuns::new()?;
    let mut not_run = NotRun::new();
    for t in [Transport::HostBounce, Transport::NativeP2p] {
        ctx.check(tp, "distinct devices", FAST, t, &mut not_run)?;
    }
    not_run.finish()
}

/// The model, battery and CUDA TP1 record the SkipFence program runs are compared with.
struct SkipFenceRuns {
    model: Model,
    battery: Battery,
    base: Record,
}

impl SkipFenceRuns {
    fn new() -> Result<SkipFenceRuns, Skip> {
        let model = tiny();
        let battery = Battery::default_for(model.config.vocab, 1);
        let mut b1 = cuda_backend(1, FAST)?;
        let base = run_program(&model, &RunConfig::new(1, Transport::HostBounce, battery.clone()).unwrap(), &mut b1);
        Ok(SkipFenceRuns { model, battery, base })
    }

    /// Two runs with the canary at TP`tp` over `t`: it engages once per peer per o_join; whether
    /// the race fired is printed. A run the machine cannot make (no peer access) is noted.
    fn check(&self, tp: usize, placement: &str, opts: CudaOptions, t: Transport, not_run: &mut NotRun) -> Ran {
        let (model, battery, base) = (&self.model, &self.battery, &self.base);
        let steps: usize = (0..battery.prompts.len()).map(|p| battery.steps_of(p)).sum();
        let mut cfg = RunConfig::new(tp, t, battery.clone()).unwrap();
        cfg.doors.canary = Some(Canary::SkipFence);
        let mut runs = Vec::new();
        for _ in 0..2 {
            let mut b = cuda_backend(tp, opts)?;
            match program::run(model, &cfg, &mut b) {
                Ok(r) => runs.push(r),
                Err(RuntimeError::Unavailable(reason)) => {
                    not_run.note(format!("skip_fence TP{tp} {placement} {}", t.name()), reason);
                    return Ok(());
                }
                Err(e) => panic!("skip_fence TP{tp} {placement} {}: {e}", t.name()),
            }
        }
        for r in &runs {
            let n = r.engaged.get("canary_skip_fence.skipped_fences").copied().unwrap_or(0);
            let want = steps * model.layers.len() * (tp - 1);
            assert_eq!(n as usize, want, "TP{tp}: one unfenced copy per peer per o_join");
        }
        let identity = describe_diff(base, first_diff(base, &runs[0]));
        let determinism = describe_diff(&runs[0], first_diff(&runs[0], &runs[1]));
        let caught = first_diff(base, &runs[0]).is_some() || first_diff(&runs[0], &runs[1]).is_some();
        println!(
            "skip_fence TP{tp} {placement} {}: race {}; vs CUDA TP1: {identity}; run 1 vs run 2: {determinism}",
            t.name(),
            if caught { "OBSERVED" } else { "not observed" }
        );
        not_run.ran();
        Ok(())
    }
}

// ---------------------------------------------------------------- performance (informational)

/// GEMV time against the memory floor (weight bytes ÷ measured device-to-device copy bandwidth,
/// read + write bytes counted) for the `step` preset's shapes, in both layouts. Runs only with
/// MEMRA_GPU_BENCH=1 (scripts/gpu/check.sh sets it); prints `bench` lines, asserts nothing.
fn gemv_bandwidth_report() -> Ran {
    if std::env::var("MEMRA_GPU_BENCH").as_deref() != Ok("1") {
        return Err(Skip::NotRequested("a measurement: set MEMRA_GPU_BENCH=1 to run it".into()));
    }
    let mut b = cuda_backend(1, FAST)?;
    let timed = |b: &mut CudaBackend, reps: usize, f: &mut dyn FnMut(&mut CudaBackend)| -> f64 {
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
    };
    // Copy bandwidth: 256 MiB device-to-device.
    let n = 64 << 20;
    let (s, d) = (b.alloc(0, n).unwrap(), b.alloc(0, n).unwrap());
    let copy_ns = timed(&mut b, 10, &mut |b| {
        b.copy(Transfer::new(Transport::HostBounce, (0, Slice::new(s, 0, n)), (0, Slice::new(d, 0, n)))).unwrap();
    });
    let copy_gbs = (2 * n * 4) as f64 / copy_ns;
    println!("bench copy 256 MiB d2d: {:.1} us, {copy_gbs:.0} GB/s (read+write)", copy_ns / 1e3);
    drop(b);

    let mut rng = Rng::new(99);
    let shapes: Vec<(&str, MatrixShard, bool)> = vec![
        ("q/o bf16 4096x4096 kw512", bf16_shard(&mut rng, 4096, 4096, 512), false),
        ("k/v bf16 1024x4096 kw512", bf16_shard(&mut rng, 1024, 4096, 512), false),
        ("router bf16 288x4096 kw512", bf16_shard(&mut rng, 288, 4096, 512), false),
        ("lm_head bf16 32768x4096 kw512", bf16_shard(&mut rng, 32768, 4096, 512), false),
        ("expert gate e4m3 1280x4096 kw512", e4m3_shard(&mut rng, 1280, 4096, 512, 0, false), false),
        ("expert down e4m3 4096x1280 kw640 partials", e4m3_shard(&mut rng, 4096, 1280, 640, 0, false), true),
        ("tiny q bf16 1024x1024 kw128", bf16_shard(&mut rng, 1024, 1024, 128), false),
    ];
    for opts in [FAST, ROW_MAJOR] {
        let mut b = cuda_backend(1, opts)?;
        for (label, shard, partials) in &shapes {
            let w = b.upload_weight(0, shard).unwrap();
            let (rows, cols, kw) = (shard.out_features, shard.in_features, shard.kblock_width);
            let x = b.alloc(0, cols).unwrap();
            b.write(0, Slice::new(x, 0, cols), &rng.vec(cols, 1.0)).unwrap();
            let out_len = if *partials { rows * (cols / kw) } else { rows };
            let out = b.alloc(0, out_len).unwrap();
            let op = if *partials {
                Op::GemvPartials { w, x: Slice::new(x, 0, cols), out: Slice::new(out, 0, out_len) }
            } else {
                Op::GemvRows {
                    w,
                    x: Slice::new(x, 0, cols),
                    out: Slice::new(out, 0, out_len),
                    order: RowOrder::Canonical,
                }
            };
            let ns = timed(&mut b, 20, &mut |b| b.launch(0, op.clone()).unwrap());
            let bytes = shard.bytes() as f64;
            let floor_ns = bytes / copy_gbs;
            println!(
                "bench {:<44} [{:?}] {:>8.1} us  {:>6.0} GB/s  {:.2}x floor",
                label,
                opts.gemv_layout,
                ns / 1e3,
                bytes / ns,
                ns / floor_ns
            );
        }
    }
    Ok(())
}
