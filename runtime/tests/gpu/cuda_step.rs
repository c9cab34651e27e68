//! The fast `step` layer's kernels against their host twins, bit for bit, and the program built on
//! them (issue 12): the 256-lane norms, the warp router, the multi-block argmax, the fused rope +
//! KV append, the grouped expert kernels (block-per-lane and row-major E4M3, TP shards with a row
//! offset, NVFP4 with per-matrix scales, the shared entry, an id that is no expert), the owner
//! folds / select / owner sums of expert-parallel placements, the batched digest with owned
//! slots; then the whole program on CUDA: TP1 = host, TP2/4/8 co-resident = TP1 for the TP-sharded,
//! expert-parallel and NVFP4_EP2 placements, the whole-step graph, and (MEMRA_GPU_STEP=1) the
//! device-host gate on the `step` preset itself.
//!
//! Every failure names the case, the output, the first differing index and both bit patterns, so
//! one GPU run says exactly what is wrong. Without a device every test reads `ignored (reason)`;
//! with `MEMRA_REQUIRE_GPU=1` that is a failure (`harness.rs`).

use memra_kernels::twins::digest::digest_f32;
use memra_runtime::config::Tp;
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{Backend, DigestPart, GroupEntry, Op, OwnedSlots, OwnerRule, RowOrder, Slice, SlotOwner};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::evidence::record::Record;
use memra_runtime::{program, Battery, DoorSet, ExpertFormat, RunConfig, Transport};

use crate::harness::{cuda_backend, GpuTest, Ran, Skip};

/// Every test of this file.
pub fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest::new("norms_256_lanes_match_twins", norms_256_lanes_match_twins),
        GpuTest::new("router_and_argmax_at_step_shapes_match_twins", router_and_argmax_at_step_shapes_match_twins),
        GpuTest::new("batched_and_small_gemvs_match_twins", batched_and_small_gemvs_match_twins),
        GpuTest::new("moe_join_and_residual_kernels_match_twins", moe_join_and_residual_kernels_match_twins),
        GpuTest::new("rope_append_matches_twin", rope_append_matches_twin),
        GpuTest::new("grouped_expert_kernels_match_twins", grouped_expert_kernels_match_twins),
        GpuTest::new("batched_digest_matches_twin", batched_digest_matches_twin),
        GpuTest::new("placements_and_whole_step_graph_on_cuda_equal_the_host", placements_and_whole_step_graph_on_cuda_equal_the_host),
        GpuTest::new("step_preset_device_host_gate", step_preset_device_host_gate),
        GpuTest::new("grouped_experts_bandwidth_report", grouped_experts_bandwidth_report),
    ]
}

use crate::cases::*;

// ---------------------------------------------------------------- kernels

fn norms_256_lanes_match_twins() -> Ran {
    let mut rng = Rng(31);
    let mut cases = Vec::new();
    for (rows, width) in [(1, 4096), (3, 4096), (2, 255), (1, 257), (2, 31), (1, 11776)] {
        let mut c = Case::new(format!("rmsnorm {rows}x{width}"));
        let (x, w) = (c.buf(rng.vec(rows * width, 8.0)), c.buf(rng.vec(width, 2.0)));
        let out = c.out(rows * width);
        c.ops.push(Op::RmsNorm { x, w, eps: EPS, out });
        cases.push(c);
        let mut c = Case::new(format!("add_rmsnorm {rows}x{width}"));
        let (x, a, w) =
            (c.buf(rng.vec(rows * width, 8.0)), c.buf(rng.vec(rows * width, 8.0)), c.buf(rng.vec(width, 2.0)));
        let (h, out) = (c.out(rows * width), c.out(rows * width));
        c.ops.push(Op::AddRmsNorm { x, a, w, eps: EPS, h, out });
        cases.push(c);
        let mut c = Case::new(format!("fold_add_rmsnorm {rows}x{width}"));
        let parts = c.buf(rng.vec(8 * rows * width, 2.0));
        let (x, w) = (c.buf(rng.vec(rows * width, 8.0)), c.buf(rng.vec(width, 2.0)));
        let (a, h, out) = (c.out(rows * width), c.out(rows * width), c.out(rows * width));
        c.ops.push(Op::FoldAddRmsNorm { parts, n_parts: 8, x, w, eps: EPS, a, h, out });
        cases.push(c);
    }
    check_cases("norm256", cases, &[FAST])
}

fn router_and_argmax_at_step_shapes_match_twins() -> Ran {
    let mut rng = Rng(32);
    let mut cases = Vec::new();
    // 288 and below take the register path of the selection (n <= 512), 600 the shared-memory scan.
    for (n, k, ties) in [(288, 8, false), (288, 8, true), (64, 32, true), (8, 2, false), (600, 8, true), (512, 32, true)] {
        for device_variant in [false, true] {
            let mut logits = rng.vec(n, 6.0);
            let mut bias = rng.vec(n, 0.1);
            if ties {
                for e in (0..n).step_by(5) {
                    logits[e] = 1.25;
                    bias[e] = 0.0;
                }
                logits[n - 1] = f32::NAN;
            }
            let mut c = Case::new(format!("router {n} top-{k} ties={ties} dev={device_variant}"));
            c.nan_equal = true;
            let (logits, bias) = (c.buf(logits), c.buf(bias));
            let out = c.out(2 * k);
            c.ops.push(Op::Router { logits, bias, k, normalize: true, scaling: 2.5, out, device_variant });
            cases.push(c);
        }
    }
    let mut inputs: Vec<(String, Vec<f32>)> = vec![
        ("random 32768".into(), rng.vec(32768, 10.0)),
        ("random 300000".into(), rng.vec(300_000, 10.0)),
        ("all NaN".into(), vec![f32::NAN; 5000]),
        ("one".into(), vec![-3.0]),
    ];
    let mut ties = rng.vec(32768, 1.0);
    for i in [17, 9000, 32000] {
        ties[i] = 5.0; // the lowest index must win across blocks
    }
    ties[3] = f32::NAN;
    inputs.push(("ties across blocks".into(), ties));
    for (label, xs) in inputs {
        // Twice on one backend: the last block resets the counter for the next launch.
        let mut c = Case::new(format!("argmax {label}"));
        let x = c.buf(xs);
        let (o1, o2) = (c.out(1), c.out(1));
        c.ops.push(Op::Argmax { x, out: o1 });
        c.ops.push(Op::Argmax { x, out: o2 });
        cases.push(c);
    }
    check_cases("router/argmax", cases, &[FAST])
}


/// The qkv seam's four projections in one launch, and single GEMVs whose few rows get a smaller
/// rows-per-block (router 288 × 4096, k 1024 × 4096): the same bits as one launch each.
fn batched_and_small_gemvs_match_twins() -> Ran {
    let mut rng = Rng(38);
    let mut cases = Vec::new();
    for (label, shapes, f32_mirror) in [
        ("step qkv+gate bf16", vec![(4096usize, 4096usize), (1024, 4096), (1024, 4096), (32, 4096)], false),
        ("tiny qkv+gate f32 mirror", vec![(1024, 1024), (1024, 1024), (1024, 1024), (8, 1024)], true),
        ("mixed widths (falls back to one launch each)", vec![(64, 1024), (32, 2048)], false),
    ] {
        let mut c = Case::new(format!("gemv_rows_batch {label}"));
        let mut items = Vec::new();
        let x = c.buf(rng.vec(4096, 3.0));
        for (rows, cols) in &shapes {
            let mut w = bf16_shard(&mut rng, *rows, *cols, cols / 8);
            if f32_mirror {
                w = w.widened();
            }
            let w = c.weight(w);
            items.push((w, c.out(*rows)));
        }
        let cols = shapes[0].1;
        let uniform = shapes.iter().all(|s| s.1 == cols);
        let x = if uniform { x.sub(0, cols) } else { x };
        if uniform {
            c.ops.push(Op::GemvRowsBatch { items, x });
        } else {
            for (w, out) in items {
                let xs = x.sub(0, c.weights[w as usize].in_features);
                c.ops.push(Op::GemvRows { w, x: xs, out, order: RowOrder::Canonical });
            }
        }
        cases.push(c);
    }
    for (rows, cols) in [(288, 4096), (1024, 4096), (7, 4096)] {
        let mut c = Case::new(format!("gemv_rows bf16 {rows}x{cols}"));
        let w = c.weight(bf16_shard(&mut rng, rows, cols, cols / 8));
        let x = c.buf(rng.vec(cols, 3.0));
        let out = c.out(rows);
        c.ops.push(Op::GemvRows { w, x, out, order: RowOrder::Canonical });
        cases.push(c);
    }
    check_cases("gemv batch/small", cases, &[FAST, ROW_MAJOR])
}

fn moe_join_and_residual_kernels_match_twins() -> Ran {
    let mut rng = Rng(37);
    let mut cases = Vec::new();
    for (k, width) in [(8, 4096), (2, 1024), (1, 5), (16, 300)] {
        let mut c = Case::new(format!("combine_shared k {k} width {width}"));
        let (y, w) = (c.buf(rng.vec((k + 1) * width, 5.0)), c.buf(rng.vec(k, 1.0)));
        let out = c.out(2 * width);
        c.ops.push(Op::CombineShared { y, w, out });
        cases.push(c);
        // NVFP4_DEV_ROUTES's combine: ids inside and outside a table of per-expert scales.
        let mut c = Case::new(format!("combine_scaled k {k} width {width}"));
        let ids: Vec<u32> = (0..k as u32).map(|s| if s == 1 { 40 } else { (s * 7 + 3) % 16 }).collect();
        let route = c.ids(&ids);
        let macros = c.buf(rng.vec(16, 0.01));
        let (y, w) = (c.buf(rng.vec((k + 1) * width, 5.0)), c.buf(rng.vec(k, 1.0)));
        let out = c.out(2 * width);
        c.ops.push(Op::CombineScaled { route, y, w, macros, out });
        cases.push(c);
        // (k + 1) · n_parts values per element: the constant-count path (k ≤ 8, 1, 2 or 4 parts),
        // one load batch of the general loop (≤ 32) or several.
        for n_parts in [1, 2, 3, 4] {
            let mut c = Case::new(format!("fold_combine_residual k {k} parts {n_parts} width {width}"));
            let pitch = n_parts * width + 3;
            let parts = c.buf(rng.vec(k * pitch + n_parts * width, 4.0));
            let (w, h) = (c.buf(rng.vec(k, 1.0)), c.buf(rng.vec(width, 9.0)));
            let (out, sum, x) = (c.out(2 * width), c.out(width), c.out(width));
            c.ops.push(Op::FoldCombineResidual { parts, pitch, n_parts, w, h, out, sum, x });
            cases.push(c);
        }
        let mut c = Case::new(format!("residual_add {width}"));
        let (h, a, b) = (c.buf(rng.vec(width, 9.0)), c.buf(rng.vec(width, 3.0)), c.buf(rng.vec(width, 3.0)));
        let (sum, out) = (c.out(width), c.out(width));
        c.ops.push(Op::ResidualAdd { h, a, b, sum, out });
        cases.push(c);
    }
    check_cases("moe_join/residual", cases, &[FAST])
}

fn rope_append_matches_twin() -> Ran {
    let mut rng = Rng(33);
    let mut cases = Vec::new();
    let (positions, cache_positions) = (6usize, 5usize);
    for (qh, kvh) in [(32, 8), (4, 1)] {
        for pos in [0u32, 4, 5, 7] {
            let mut c = Case::new(format!("rope_append q{qh} kv{kvh} pos {pos}"));
            let (q, k, v) =
                (c.buf(rng.vec(qh * 128, 6.0)), c.buf(rng.vec(kvh * 128, 6.0)), c.buf(rng.vec(kvh * 128, 3.0)));
            let (q_norm, k_norm) = (c.buf(rng.vec(128, 2.0)), c.buf(rng.vec(128, 2.0)));
            let table = c.buf((0..positions * 128).map(|i| ((i % 97) as f32 * 0.37).sin()).collect());
            let pos = c.buf(vec![f32::from_bits(pos)]);
            let (q_out, k_out) = (c.out(qh * 128), c.out(kvh * 128));
            let (k_cache, v_cache) = (c.out(cache_positions * kvh * 128), c.out(cache_positions * kvh * 128));
            c.ops.push(Op::RopeAppend {
                q,
                k,
                v,
                q_norm,
                k_norm,
                eps: EPS,
                table,
                pos,
                q_out,
                k_out,
                k_cache,
                v_cache,
            });
            cases.push(c);
        }
    }
    check_cases("rope_append", cases, &[FAST])
}

/// A group of `experts` routed experts (gate/up `rows` × `cols` with K-blocks of `kw` and E4M3
/// row offset `row0` — a TP shard when non-zero; down `cols` × `rows` with K-blocks of `down_kw`)
/// plus a shared E4M3 expert; `nvfp4`: the routed experts are NVFP4 with per-matrix scales;
/// `nan_codes_in`: that expert's gate holds NaN codes (so it is stored row-major).
pub(crate) struct GroupSpec {
    pub(crate) experts: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) kw: usize,
    pub(crate) down_kw: usize,
    pub(crate) row0: usize,
    pub(crate) nvfp4: bool,
    pub(crate) nan_codes_in: Option<usize>,
}

pub(crate) fn add_group(c: &mut Case, rng: &mut Rng, g: &GroupSpec, held: impl Fn(usize) -> bool) -> u32 {
    let mut entries = Vec::new();
    for e in 0..=g.experts {
        if e < g.experts && !held(e) {
            entries.push(None);
            continue;
        }
        let shared = e == g.experts;
        let (gate, up, down, scales) = if g.nvfp4 && !shared {
            let s = Some([1.5f32, 0.75, 3.0]);
            (
                nvfp4_shard(rng, g.rows, g.cols, g.kw),
                nvfp4_shard(rng, g.rows, g.cols, g.kw),
                nvfp4_shard(rng, g.cols, g.rows, g.down_kw),
                s,
            )
        } else {
            let nan = g.nan_codes_in == Some(e);
            (
                e4m3_shard(rng, g.rows, g.cols, g.kw, g.row0, nan),
                e4m3_shard(rng, g.rows, g.cols, g.kw, g.row0, false),
                e4m3_shard(rng, g.cols, g.rows, g.down_kw, 0, false),
                None,
            )
        };
        let (gate, up, down) = (c.weight(gate), c.weight(up), c.weight(down));
        entries.push(Some(GroupEntry { gate, up, down, nvfp4_scales: scales }));
    }
    c.groups.push((g.experts, entries));
    (c.groups.len() - 1) as u32
}

fn grouped_expert_kernels_match_twins() -> Ran {
    let mut rng = Rng(34);
    let mut cases = Vec::new();
    let specs = [
        (
            "step TP1 e4m3 (block per lane)",
            GroupSpec {
                experts: 12,
                rows: 1280,
                cols: 4096,
                kw: 512,
                down_kw: 640,
                row0: 0,
                nvfp4: false,
                nan_codes_in: None,
            },
        ),
        (
            "step TP2 shard row0 640",
            GroupSpec {
                experts: 12,
                rows: 640,
                cols: 4096,
                kw: 512,
                down_kw: 640,
                row0: 640,
                nvfp4: false,
                nan_codes_in: None,
            },
        ),
        (
            "tiny e4m3 with a NaN-code expert (row-major)",
            GroupSpec {
                experts: 8,
                rows: 1024,
                cols: 1024,
                kw: 128,
                down_kw: 128,
                row0: 0,
                nvfp4: false,
                nan_codes_in: Some(3),
            },
        ),
        (
            "nvfp4 routed + e4m3 shared",
            GroupSpec {
                experts: 8,
                rows: 1024,
                cols: 1024,
                kw: 128,
                down_kw: 128,
                row0: 0,
                nvfp4: true,
                nan_codes_in: None,
            },
        ),
    ];
    for (label, g) in specs {
        let k = 8;
        // Route: duplicates are impossible from a router but harmless here; 999 is no expert.
        let ids: Vec<u32> = (0..k as u32).map(|s| if s == 5 { 999 } else { (s * 5 + 1) % g.experts as u32 }).collect();
        let odd = |e: usize| e % 2 == 1;
        for (hold, held) in [("all held", &(|_| true) as &dyn Fn(usize) -> bool), ("odd experts held", &odd)] {
            let mut c = Case::new(format!("{label}, {hold}"));
            c.nan_equal = g.nan_codes_in.is_some();
            let group = add_group(&mut c, &mut rng, &g, held);
            let route = c.ids(&ids);
            let x = c.buf(rng.vec(g.cols, 2.0));
            let n_parts = g.rows / g.down_kw;
            let (slots, pitch, stride) = (k + 1, g.rows + 3, n_parts * g.cols + 7);
            let act = c.out(slots * pitch);
            let out = c.out(slots * stride);
            // The NVFP4 group runs without a SwiGLU limit, the others with one.
            let limit = if g.nvfp4 { None } else { Some(7.0f32) };
            let fold_up = false;
            c.ops.push(Op::ExpertGateUp { group, route, first_slot: 0, slots, x, limit, fold_up, act, act_pitch: pitch });
            if g.nvfp4 {
                // NVFP4_DEV_ROUTES's folded up scale (the shared E4M3 slot stays unclamped).
                let act_f = c.out(slots * pitch);
                let (fold_up, act) = (true, act_f);
                c.ops.push(Op::ExpertGateUp { group, route, first_slot: 0, slots, x, limit, fold_up, act, act_pitch: pitch });
            }
            // The SwiGLU's operands alone (STEP_EP without EP_DEVICE_ARITHMETIC): the same rows.
            let (gate_rows, up_rows) = (c.out(slots * pitch), c.out(slots * pitch));
            c.ops.push(Op::ExpertGateUpRows { group, route, first_slot: 0, slots, x, gate: gate_rows, up: up_rows, pitch });
            c.ops.push(Op::ExpertDown {
                group,
                route,
                first_slot: 0,
                slots,
                act,
                act_pitch: pitch,
                out,
                out_pitch: stride,
            });
            // One slot alone (the MOE_DIRECT shape) into its own output.
            let one = c.out(n_parts * g.cols);
            let act1 = act.sub(2 * pitch, pitch);
            c.ops.push(Op::ExpertDown {
                group,
                route,
                first_slot: 2,
                slots: 1,
                act: act1,
                act_pitch: pitch,
                out: one,
                out_pitch: one.len,
            });
            // Folds (of their own partials: a skipped slot's poison must not meet arithmetic, whose
            // NaN payloads differ by platform): every slot, then owned slots with the NVFP4 down
            // scale from the group.
            let width = g.cols;
            let folded = c.out(slots * width);
            let parts = c.buf(rng.vec((slots - 1) * stride + n_parts * width, 3.0));
            c.ops.push(Op::FoldSlots {
                route,
                first_slot: 0,
                slots,
                parts,
                parts_pitch: stride,
                n_parts,
                owner: None,
                scales: None,
                out: folded,
            });
            let owner = SlotOwner { rule: OwnerRule { experts: g.experts as u32, div: 1, modulo: 2 }, want: 1 };
            let owned = c.out(slots * width);
            c.ops.push(Op::FoldSlots {
                route,
                first_slot: 0,
                slots,
                parts,
                parts_pitch: stride,
                n_parts,
                owner: Some(owner),
                scales: Some(group),
                out: owned,
            });
            cases.push(c);
        }
    }
    // Select and owner sums on their own (bytes and the one-slot-combine order).
    let mut c = Case::new("select_slots and combine_owned");
    let (k, width, ranks) = (8usize, 4096usize, 4usize);
    let ids: Vec<u32> = vec![0, 71, 72, 150, 287, 288, 216, 143];
    let route = c.ids(&ids);
    let src = c.buf(rng.vec(ranks * (k + 1) * width, 5.0));
    let sel = c.out(k * width);
    let rule = OwnerRule { experts: 288, div: 72, modulo: 4 };
    c.ops.push(Op::SelectSlots { route, rule, ranks, src, rank_pitch: (k + 1) * width, out: sel });
    let y = c.buf(rng.vec(k * width, 5.0));
    let w = c.buf(rng.vec(k, 1.0));
    for want in 0..2 {
        let acc = c.out(width);
        let owner = SlotOwner { rule: OwnerRule { experts: 288, div: 1, modulo: 2 }, want };
        c.ops.push(Op::CombineOwned { route, owner, y, w, out: acc });
    }
    cases.push(c);
    check_cases("experts", cases, &[FAST, ROW_MAJOR])
}

/// The batched digest equals the sum of per-block twin digests, owned slots only, twice (slots
/// are zeroed between collects).
fn batched_digest_matches_twin() -> Ran {
    let mut b = cuda_backend(1, FAST)?;
    let mut rng = Rng(35);
    let (n, k, stride) = (5000usize, 8usize, 6000usize);
    let data = rng.vec(k * stride, 1e3);
    let buf = b.alloc(0, data.len()).unwrap();
    b.write(0, Slice::new(buf, 0, data.len()), &data).unwrap();
    let ids: Vec<u32> = vec![3, 10, 17, 4, 300, 9, 2, 15];
    let rb = b.alloc(0, k).unwrap();
    let route = Slice::new(rb, 0, k);
    b.write(0, route, &ids.iter().map(|i| f32::from_bits(*i)).collect::<Vec<_>>()).unwrap();
    let rule = OwnerRule { experts: 16, div: 8, modulo: 2 };
    for step in 0..2 {
        let plain = DigestPart::plain(Slice::new(buf, 7, 70_000.min(data.len() - 7)), 123);
        let strided = DigestPart {
            src: Slice::new(buf, 0, n),
            blocks: k,
            pitch: stride,
            base: 1 << 20,
            base_pitch: stride as u64,
            owned: None,
        };
        let owned = DigestPart {
            owned: Some(OwnedSlots { route, first_slot: 0, owner: SlotOwner { rule, want: 1 } }),
            ..strided
        };
        let groups = vec![vec![plain], vec![strided, plain], vec![owned]];
        let tickets = b.digest_batch(0, &groups).unwrap();
        let got = b.collect().unwrap();
        let value = |t: &Vec<usize>| t.iter().fold(0u64, |a, i| a.wrapping_add(got.digests[*i]));
        let block = |i: usize| digest_f32(&data[i * stride..i * stride + n], (1 << 20) + (i * stride) as u64);
        let want_plain = digest_f32(&data[7..7 + plain.src.len], 123);
        let want_strided = (0..k).fold(0u64, |a, i| a.wrapping_add(block(i)));
        let want_owned =
            (0..k).filter(|i| rule.owner_of(ids[*i]) == Some(1)).fold(0u64, |a, i| a.wrapping_add(block(i)));
        assert_eq!(value(&tickets[0]), want_plain, "step {step}: plain part");
        assert_eq!(value(&tickets[1]), want_strided.wrapping_add(want_plain), "step {step}: strided + plain");
        assert_eq!(value(&tickets[2]), want_owned, "step {step}: owned slots only (ids {ids:?})");
    }
    Ok(())
}

// ---------------------------------------------------------------- the program

fn first_diff(a: &Record, b: &Record) -> Option<String> {
    for (p, (ra, rb)) in a.digests.iter().zip(&b.digests).enumerate() {
        for (s, (da, db)) in ra.iter().zip(rb).enumerate() {
            if let Some(i) = da.iter().zip(db).position(|(x, y)| x != y) {
                let (layer, seam) = Record::seam_at(a.n_layers, i);
                return Some(format!("first divergence: prompt {p} step {s} layer {layer} seam {}", seam.name()));
            }
        }
    }
    None
}

fn run(model: &Model, cfg: &RunConfig, b: &mut dyn Backend) -> Record {
    program::run(model, cfg, b).unwrap_or_else(|e| panic!("run TP{} {:?} on {}: {e}", cfg.tp, cfg.doors, b.describe()))
}

/// On tiny: CUDA TP1 = host TP1 for the TP-sharded, expert-parallel and NVFP4 placements, and
/// every co-resident TP size = CUDA TP1, over host-bounce and native-p2p; the whole-step graph
/// replays and equals the eager run.
fn placements_and_whole_step_graph_on_cuda_equal_the_host() -> Ran {
    let mut tp1 = cuda_backend(1, FAST)?;
    drop(tp1.collect());
    let model = generate(&ModelConfig::preset("tiny", Some(2)).unwrap(), 7).unwrap();
    let battery = Battery { prompts: vec![vec![3, 141, 59], vec![26, 535]], gen_tokens: 4 };
    let variants: [(&str, DoorSet, ExpertFormat, &[usize]); 4] = [
        ("default", DoorSet::default(), ExpertFormat::E4m3, &[2, 4, 8]),
        ("step_ep", DoorSet { step_ep: true, ..DoorSet::default() }, ExpertFormat::E4m3, &[2, 4, 8]),
        ("nvfp4 experts", DoorSet::default(), ExpertFormat::Nvfp4, &[2, 4, 8]),
        ("nvfp4_ep2", DoorSet { nvfp4_ep2: true, ..DoorSet::default() }, ExpertFormat::Nvfp4, &[2]),
    ];
    let mut failures = Vec::new();
    for (name, doors, format, tps) in variants {
        let mut cfg = RunConfig::new(1, Transport::HostBounce, battery.clone()).unwrap();
        (cfg.doors, cfg.expert_format) = (doors, format);
        let oracle = run(&model, &cfg, &mut HostBackend::new(1).unwrap());
        let mut b = cuda_backend(1, FAST)?;
        let dev1 = run(&model, &cfg, &mut b);
        if let Some(d) = first_diff(&oracle, &dev1) {
            failures.push(format!("{name}: CUDA TP1 vs host TP1: {d}"));
        }
        for &tp in tps {
            for t in [Transport::HostBounce, Transport::NativeP2p] {
                let mut c = cfg.clone();
                (c.tp, c.transport) = (Tp::new(tp).unwrap(), t);
                let mut b = cuda_backend(tp, CO_RESIDENT)?;
                let r = run(&model, &c, &mut b);
                match first_diff(&dev1, &r) {
                    Some(d) => failures.push(format!("{name}: CUDA TP{tp} co-resident {t:?} vs CUDA TP1: {d}")),
                    None => println!("ok {name} TP{tp} {}", t.name()),
                }
                if !doors.nvfp4_ep2 {
                    c.doors.graph = true;
                    let mut b = cuda_backend(tp, CO_RESIDENT)?;
                    let r = run(&model, &c, &mut b);
                    let replays = r.engaged.get("graph.replays").copied().unwrap_or(0);
                    if replays == 0 {
                        failures.push(format!("{name}: TP{tp} {t:?} graph: no replay ({:?})", r.engaged));
                    }
                    if let Some(d) = first_diff(&dev1, &r) {
                        failures.push(format!("{name}: CUDA TP{tp} {t:?} whole-step graph vs CUDA TP1: {d}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// docs/DESIGN.md §8: the device-host gate on the `step` preset itself (one layer, a short battery):
/// CUDA TP1 = host TP1, CUDA TP2 (TP-sharded experts) and TP4 (expert-parallel) co-resident =
/// CUDA TP1, and the whole-step graph at TP1. Runs only with MEMRA_GPU_STEP=1 (generating the
/// 288-expert layer takes a while on the host).
fn step_preset_device_host_gate() -> Ran {
    if std::env::var("MEMRA_GPU_STEP").as_deref() != Ok("1") {
        return Err(Skip::NotRequested("set MEMRA_GPU_STEP=1 to run the step-preset device-host gate".into()));
    }
    let mut b1 = cuda_backend(1, FAST)?;
    let t0 = std::time::Instant::now();
    let model = generate(&ModelConfig::preset("step", Some(1)).unwrap(), 11).unwrap();
    println!("step model generated in {:.1}s", t0.elapsed().as_secs_f64());
    let battery = Battery { prompts: vec![vec![5, 77]], gen_tokens: 2 };
    let cfg = RunConfig::new(1, Transport::HostBounce, battery).unwrap();
    let t0 = std::time::Instant::now();
    let oracle = run(&model, &cfg, &mut HostBackend::new(1).unwrap());
    println!("host oracle in {:.1}s", t0.elapsed().as_secs_f64());
    let dev1 = run(&model, &cfg, &mut b1);
    drop(b1);
    assert_eq!(first_diff(&oracle, &dev1), None, "step preset: CUDA TP1 vs host TP1");
    assert_eq!(dev1.tokens, oracle.tokens);
    for tp in [2, 4] {
        let mut c = cfg.clone();
        (c.tp, c.transport) = (Tp::new(tp).unwrap(), Transport::NativeP2p);
        let mut b = cuda_backend(tp, CO_RESIDENT)?;
        let r = run(&model, &c, &mut b);
        assert_eq!(first_diff(&dev1, &r), None, "step preset: CUDA TP{tp} co-resident vs CUDA TP1");
        println!("ok step preset TP{tp}");
    }
    let mut g = cfg.clone();
    g.doors.graph = true;
    let mut b = cuda_backend(1, FAST)?;
    let r = run(&model, &g, &mut b);
    assert_eq!(first_diff(&dev1, &r), None, "step preset: whole-step graph vs eager");
    println!("step preset device-host gate: identical ({} steps)", oracle.digests[0].len());
    Ok(())
}

/// The grouped expert launch at `step` shapes, timed (MEMRA_GPU_BENCH=1): the 9 slots' gate/up
/// and down of one layer against the bytes they read.
fn grouped_experts_bandwidth_report() -> Ran {
    if std::env::var("MEMRA_GPU_BENCH").as_deref() != Ok("1") {
        return Err(Skip::NotRequested("set MEMRA_GPU_BENCH=1 to time the grouped experts".into()));
    }
    let mut b = cuda_backend(1, FAST)?;
    let mut rng = Rng(36);
    let (experts, k, rows, cols) = (16usize, 8usize, 1280usize, 4096usize);
    let mut entries = Vec::new();
    let mut bytes = 0usize;
    for _ in 0..=experts {
        let g = b.upload_weight(0, &e4m3_shard(&mut rng, rows, cols, 512, 0, false)).unwrap();
        let u = b.upload_weight(0, &e4m3_shard(&mut rng, rows, cols, 512, 0, false)).unwrap();
        let d = b.upload_weight(0, &e4m3_shard(&mut rng, cols, rows, 640, 0, false)).unwrap();
        entries.push(Some(GroupEntry { gate: g, up: u, down: d, nvfp4_scales: None }));
    }
    let group = b.register_experts(0, experts, &entries).unwrap();
    for _ in 0..=k {
        bytes += 3 * (rows * cols + rows * cols / (128 * 128) * 4);
    }
    let alloc = |b: &mut dyn Backend, n: usize| Slice::new(b.alloc(0, n).unwrap(), 0, n);
    let route = alloc(&mut b, k);
    let ids: Vec<f32> = (0..k as u32).map(|i| f32::from_bits(i * 2)).collect();
    b.write(0, route, &ids).unwrap();
    let x = alloc(&mut b, cols);
    b.write(0, x, &rng.vec(cols, 1.0)).unwrap();
    let act = alloc(&mut b, (k + 1) * rows);
    let out = alloc(&mut b, (k + 1) * 2 * cols);
    let bw = b.copy_bandwidth(1 << 30).unwrap().unwrap_or(f64::NAN);
    let mut ns = Vec::new();
    for _ in 0..30 {
        b.mark().unwrap();
        b.launch(
            0,
            Op::ExpertGateUp {
                group,
                route,
                first_slot: 0,
                slots: k + 1,
                x,
                limit: Some(7.0),
                fold_up: false,
                act,
                act_pitch: rows,
            },
        )
        .unwrap();
        b.mark().unwrap();
        b.launch(
            0,
            Op::ExpertDown {
                group,
                route,
                first_slot: 0,
                slots: k + 1,
                act,
                act_pitch: rows,
                out,
                out_pitch: 2 * cols,
            },
        )
        .unwrap();
        b.mark().unwrap();
        let m = b.collect().unwrap().marks_ns.swap_remove(0);
        ns.push((m[1] - m[0], m[2] - m[1]));
    }
    ns.sort_by_key(|p| p.0 + p.1);
    let (gu, dn) = ns[ns.len() / 2];
    let floor_ns = bytes as f64 / bw * 1e9;
    println!(
        "grouped experts (9 slots, E4M3 1280x4096): gate+up {:.1} µs, down {:.1} µs, total {:.1} µs; floor {:.1} µs at {:.2} TB/s -> {:.2}x",
        gu as f64 / 1e3,
        dn as f64 / 1e3,
        (gu + dn) as f64 / 1e3,
        floor_ns / 1e3,
        bw / 1e12,
        (gu + dn) as f64 / floor_ns
    );
    Ok(())
}
