//! Lane-grid launches on the device (docs/DESIGN.md §3.6, `backend/op/lane_grid.rs`): the lanes
//! of a pass that run one norm, router, MoE fold, residual, rope or grouped expert op at constant pitches
//! are one launch with a lane dimension. Each lane must keep the bits of its own launch, which are
//! the host twin's:
//!
//! - every op kind with a lane-grid kernel, 2, 5 and 8 lanes, with and without gaps between the
//!   lanes' slices: one `launch_lanes` on CUDA = per-lane CUDA launches = the host, bit for bit,
//!   and the census shows one `<kernel>_lanes` launch where the per-lane path shows one per lane;
//! - grouped experts (E4M3 block-per-lane at the `step` shapes, NVFP4 routed + E4M3 shared) with a
//!   different route per lane, duplicate experts across lanes and a route id outside the experts;
//! - negative control: lanes that differ in more than their slices (another eps in one lane) are
//!   not fused — the census shows per-lane kernels — and still give the per-lane bits.
//!
//! Without a CUDA device every test here reads `ignored (no CUDA device: …)`.

use crate::cases::{compare, Case, Rng, EPS, FAST};
use crate::cuda_step::{add_group, GroupSpec};
use crate::harness::{cuda_backend, GpuTest, Ran};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{Backend, Op, Slice};
use memra_runtime::evidence::census::Counts;

pub fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest::new("lane_grid_launches_equal_per_lane_launches_and_the_host", lane_grid_equals_per_lane_and_host),
        GpuTest::new("lanes_differing_beyond_their_slices_run_lane_by_lane", lanes_differing_run_lane_by_lane),
    ]
}

/// A case of `lanes` lanes: `ops[i]` is lane i's op; `kernel` the single launch's census name.
struct LaneCase {
    case: Case,
    kernel: &'static str,
}

/// A buffer of `lanes` copies of `len` values `gap` apart; lane l's slice.
struct Lanes {
    s: Slice,
    pitch: usize,
}

impl Lanes {
    fn at(&self, l: usize) -> Slice {
        Slice::new(self.s.buf, self.s.offset + l * self.pitch, self.s.len)
    }
}

fn input(c: &mut Case, rng: &mut Rng, len: usize, lanes: usize, gap: usize, scale: f32) -> Lanes {
    let b = c.buf(rng.vec((len + gap) * lanes, scale));
    Lanes { s: b.sub(0, len), pitch: len + gap }
}

fn output(c: &mut Case, len: usize, lanes: usize, gap: usize) -> Lanes {
    let b = c.out((len + gap) * lanes);
    Lanes { s: b.sub(0, len), pitch: len + gap }
}

fn plain_cases(rng: &mut Rng, lanes: usize, gap: usize) -> Vec<LaneCase> {
    let mut v = Vec::new();
    let label = |what: &str| format!("{what} ×{lanes} gap {gap}");
    for (n, rows) in [(4096, 1), (96, 2)] {
        let mut c = Case::new(label(&format!("rmsnorm {rows}x{n}")));
        let x = input(&mut c, rng, rows * n, lanes, gap, 2.0);
        let w = c.buf(rng.vec(n, 1.0));
        let out = output(&mut c, rows * n, lanes, gap);
        c.ops = (0..lanes).map(|l| Op::RmsNorm { x: x.at(l), w, eps: EPS, out: out.at(l) }).collect();
        v.push(LaneCase { case: c, kernel: "rmsnorm" });
        let mut c = Case::new(label(&format!("add_rmsnorm {rows}x{n}")));
        let x = input(&mut c, rng, rows * n, lanes, gap, 2.0);
        let a = input(&mut c, rng, rows * n, lanes, gap, 2.0);
        let w = c.buf(rng.vec(n, 1.0));
        let (h, out) = (output(&mut c, rows * n, lanes, gap), output(&mut c, rows * n, lanes, gap));
        c.ops = (0..lanes)
            .map(|l| Op::AddRmsNorm { x: x.at(l), a: a.at(l), w, eps: EPS, h: h.at(l), out: out.at(l) })
            .collect();
        v.push(LaneCase { case: c, kernel: "add_rmsnorm" });
    }
    {
        let mut c = Case::new(label("residual_add"));
        let n = 4096;
        let (h, a, b) =
            (input(&mut c, rng, n, lanes, gap, 2.0), input(&mut c, rng, n, lanes, gap, 2.0), input(&mut c, rng, n, lanes, gap, 2.0));
        let (sum, out) = (output(&mut c, n, lanes, gap), output(&mut c, n, lanes, gap));
        c.ops = (0..lanes)
            .map(|l| Op::ResidualAdd { h: h.at(l), a: a.at(l), b: b.at(l), sum: sum.at(l), out: out.at(l) })
            .collect();
        v.push(LaneCase { case: c, kernel: "residual_add" });
    }
    for (device_variant, kernel) in [(false, "router"), (true, "router_dev")] {
        let mut c = Case::new(label(kernel));
        let (n, k) = (288, 8);
        let logits = input(&mut c, rng, n, lanes, gap, 4.0);
        let bias = c.buf(rng.vec(n, 0.5));
        let out = output(&mut c, 2 * k, lanes, gap);
        c.ops = (0..lanes)
            .map(|l| Op::Router {
                logits: logits.at(l),
                bias,
                k,
                normalize: true,
                scaling: 2.5,
                out: out.at(l),
                device_variant,
            })
            .collect();
        v.push(LaneCase { case: c, kernel });
    }
    {
        let mut c = Case::new(label("fold_combine_residual"));
        let (k, n_parts, width) = (8, 2, 512);
        let pitch = n_parts * width + 5;
        let parts = input(&mut c, rng, k * pitch + n_parts * width, lanes, gap, 3.0);
        let (w, h) = (input(&mut c, rng, k, lanes, gap, 1.0), input(&mut c, rng, width, lanes, gap, 2.0));
        let out = output(&mut c, 2 * width, lanes, gap);
        let (sum, x) = (output(&mut c, width, lanes, gap), output(&mut c, width, lanes, gap));
        c.ops = (0..lanes)
            .map(|l| Op::FoldCombineResidual {
                parts: parts.at(l),
                pitch,
                n_parts,
                w: w.at(l),
                h: h.at(l),
                out: out.at(l),
                sum: sum.at(l),
                x: x.at(l),
            })
            .collect();
        v.push(LaneCase { case: c, kernel: "fold_combine_residual" });
    }
    {
        // Rows' rope: every lane its own position (lane 1's past the table: it writes nothing)
        // and its own session's caches.
        let mut c = Case::new(label("rope_append"));
        let (qh, kvh, positions) = (4, 2, 6);
        let (lq, lkv) = (qh * 128, kvh * 128);
        let (q, k, vv) = (
            input(&mut c, rng, lq, lanes, gap, 2.0),
            input(&mut c, rng, lkv, lanes, gap, 2.0),
            input(&mut c, rng, lkv, lanes, gap, 2.0),
        );
        let (q_norm, k_norm) = (c.buf(rng.vec(128, 1.0)), c.buf(rng.vec(128, 1.0)));
        let table = c.buf(rng.vec(positions * 128, 1.0));
        let at: Vec<u32> = (0..lanes).map(|l| if l == 1 { positions as u32 + 2 } else { (3 * l % positions) as u32 }).collect();
        let pos_buf = c.ids(&at);
        let pos = Lanes { s: pos_buf.sub(0, 1), pitch: 1 };
        let (q_out, k_out) = (output(&mut c, lq, lanes, gap), output(&mut c, lkv, lanes, gap));
        let (k_cache, v_cache) = (output(&mut c, positions * lkv, lanes, gap), output(&mut c, positions * lkv, lanes, gap));
        c.ops = (0..lanes)
            .map(|l| Op::RopeAppend {
                q: q.at(l),
                k: k.at(l),
                v: vv.at(l),
                q_norm,
                k_norm,
                eps: EPS,
                table,
                pos: pos.at(l),
                q_out: q_out.at(l),
                k_out: k_out.at(l),
                k_cache: k_cache.at(l),
                v_cache: v_cache.at(l),
            })
            .collect();
        v.push(LaneCase { case: c, kernel: "rope_append" });
    }
    v
}

/// Grouped experts: gate/up + SwiGLU, then down partials, then the slot folds, every lane with
/// its own route (lanes share some experts; slot 5 of lane 1 is no expert).
fn expert_cases(rng: &mut Rng, lanes: usize, gap: usize) -> Vec<LaneCase> {
    let specs = [
        ("e4m3 step TP1", GroupSpec { experts: 12, rows: 1280, cols: 4096, kw: 512, down_kw: 640, row0: 0, nvfp4: false, nan_codes_in: None }),
        ("nvfp4 routed", GroupSpec { experts: 8, rows: 512, cols: 1024, kw: 128, down_kw: 128, row0: 0, nvfp4: true, nan_codes_in: None }),
    ];
    let k = 8;
    let mut v = Vec::new();
    for (what, g) in specs {
        let ids: Vec<u32> = (0..lanes)
            .flat_map(|l| {
                (0..k as u32).map(move |s| if l == 1 && s == 5 { 999 } else { (s * 5 + 3 * l as u32 + 1) % g.experts as u32 })
            })
            .collect();
        let n_parts = g.rows / g.down_kw;
        let (slots, act_pitch, stride) = (k + 1, g.rows + 3, n_parts * g.cols + 7);
        let limit = if g.nvfp4 { None } else { Some(7.0f32) };
        let mut c = Case::new(format!("expert_gate_up {what} ×{lanes} gap {gap}"));
        let group = add_group(&mut c, rng, &g, |_| true);
        let route_buf = c.ids(&ids);
        let route = Lanes { s: route_buf.sub(0, k), pitch: k };
        let x = input(&mut c, rng, g.cols, lanes, gap, 2.0);
        let act = output(&mut c, slots * act_pitch, lanes, gap);
        c.ops = (0..lanes)
            .map(|l| Op::ExpertGateUp {
                group,
                route: route.at(l),
                first_slot: 0,
                slots,
                x: x.at(l),
                limit,
                fold_up: false,
                act: act.at(l),
                act_pitch,
            })
            .collect();
        v.push(LaneCase { case: c, kernel: if g.nvfp4 { "expert_gate_up.nvfp4" } else { "expert_gate_up.e4m3" } });
        // Down partials of every slot over per-lane activations (random: the gate/up case
        // above checks the activations themselves).
        let mut c = Case::new(format!("expert_down {what} ×{lanes} gap {gap}"));
        let group = add_group(&mut c, rng, &g, |_| true);
        let route_buf = c.ids(&ids);
        let route = Lanes { s: route_buf.sub(0, k), pitch: k };
        let act = input(&mut c, rng, slots * act_pitch, lanes, gap, 1.0);
        let out = output(&mut c, slots * stride, lanes, gap);
        c.ops = (0..lanes)
            .map(|l| Op::ExpertDown {
                group,
                route: route.at(l),
                first_slot: 0,
                slots,
                act: act.at(l),
                act_pitch,
                out: out.at(l),
                out_pitch: stride,
            })
            .collect();
        v.push(LaneCase { case: c, kernel: if g.nvfp4 { "expert_down.nvfp4" } else { "expert_down.e4m3" } });
    }
    // The slot folds (every slot, per-lane routes).
    let (width, n_parts, slots) = (1024, 2, k + 1);
    let pitch = n_parts * width + 9;
    let mut c = Case::new(format!("fold_slots ×{lanes} gap {gap}"));
    let ids: Vec<u32> = (0..lanes * k).map(|i| (i * 7 % 13) as u32).collect();
    let route_buf = c.ids(&ids);
    let route = Lanes { s: route_buf.sub(0, k), pitch: k };
    let parts = input(&mut c, rng, (slots - 1) * pitch + n_parts * width, lanes, gap, 3.0);
    let out = output(&mut c, slots * width, lanes, gap);
    c.ops = (0..lanes)
        .map(|l| Op::FoldSlots {
            route: route.at(l),
            first_slot: 0,
            slots,
            parts: parts.at(l),
            parts_pitch: pitch,
            n_parts,
            owner: None,
            scales: None,
            out: out.at(l),
        })
        .collect();
    v.push(LaneCase { case: c, kernel: "fold_slots" });
    v
}

/// Run a case's lanes on `b` (`fused`: one `launch_lanes`, else one launch per lane); the
/// outputs and the census change.
fn run(b: &mut dyn Backend, c: &Case, fused: bool) -> (Vec<Vec<f32>>, Counts) {
    for data in &c.bufs {
        let id = b.alloc(0, data.len()).unwrap();
        b.write(0, Slice::new(id, 0, data.len()), data).unwrap();
    }
    for w in &c.weights {
        b.upload_weight(0, w).unwrap();
    }
    for (experts, entries) in &c.groups {
        b.register_experts(0, *experts, entries).unwrap();
    }
    let before = b.census();
    if fused {
        b.launch_lanes(0, c.ops.clone()).unwrap_or_else(|e| panic!("{}: fused launch failed: {e}", c.label));
    } else {
        for op in &c.ops {
            b.launch(0, op.clone()).unwrap_or_else(|e| panic!("{}: launch failed: {e}", c.label));
        }
    }
    let outs = c.outputs.iter().map(|s| b.read(0, *s).unwrap()).collect();
    let after = b.census();
    let change = after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect();
    (outs, change)
}

fn launches(census: &Counts) -> Vec<(String, u64)> {
    census.iter().filter(|(k, _)| k.starts_with("launch.")).map(|(k, v)| (k.clone(), *v)).collect()
}

/// Host, per-lane CUDA launches and one lane-grid launch: the same bits; the fused census one
/// `launch.<kernel>_lanes…` launch on both backends.
fn check(lc: &LaneCase, want_fused: bool) -> Result<String, String> {
    let c = &lc.case;
    let lanes = c.ops.len() as u64;
    let mut host = HostBackend::new(1).expect("host backend");
    let (want, host_census) = run(&mut host, c, true);
    let mut dev = cuda_backend(1, FAST).map_err(|s| format!("{s:?}"))?;
    let (per_lane, _) = run(&mut dev, c, false);
    let mut dev = cuda_backend(1, FAST).map_err(|s| format!("{s:?}"))?;
    let (fused, dev_census) = run(&mut dev, c, true);
    if let Some(m) = compare(&want, &per_lane, c.nan_equal) {
        return Err(format!("{}: per-lane launches differ from the host: {m}", c.label));
    }
    if let Some(m) = compare(&want, &fused, c.nan_equal) {
        return Err(format!("{}: the lane-grid launch differs from the host: {m}", c.label));
    }
    let fused_name = match lc.kernel.split_once('.') {
        Some((n, s)) => format!("launch.{n}_lanes.{s}"),
        None => format!("launch.{}_lanes", lc.kernel),
    };
    let expect = if want_fused { vec![(fused_name, 1)] } else { vec![(format!("launch.{}", lc.kernel), lanes)] };
    for (who, census) in [("host", &host_census), ("cuda", &dev_census)] {
        if launches(census) != expect {
            return Err(format!("{}: {who} census {:?}, expected {expect:?}", c.label, launches(census)));
        }
    }
    Ok(format!("ok {} ({} launch(es))", c.label, expect[0].1))
}

fn lane_grid_equals_per_lane_and_host() -> Ran {
    cuda_backend(1, FAST)?;
    let mut rng = Rng::new(0x9e1d);
    let mut failures = Vec::new();
    let mut ran = 0;
    for lanes in [2, 5, 8] {
        for gap in [0, 3] {
            let mut cases = plain_cases(&mut rng, lanes, gap);
            if gap == 0 || lanes == 5 {
                cases.extend(expert_cases(&mut rng, lanes, gap));
            }
            for lc in &cases {
                ran += 1;
                match check(lc, true) {
                    Ok(line) => println!("{line}"),
                    Err(e) => failures.push(e),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {ran} lane-grid case(s) failed:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

fn lanes_differing_run_lane_by_lane() -> Ran {
    cuda_backend(1, FAST)?;
    let mut rng = Rng::new(0x51de);
    let mut cases = plain_cases(&mut rng, 4, 0);
    let lc = cases.iter_mut().find(|c| c.kernel == "rmsnorm").expect("an rmsnorm case");
    if let Op::RmsNorm { eps, .. } = &mut lc.case.ops[2] {
        *eps = 1e-3;
    }
    match check(lc, false) {
        Ok(line) => println!("{line}"),
        Err(e) => panic!("{e}"),
    }
    // The same case claimed fused must fail on the census: the check can tell.
    let e = check(lc, true).expect_err("a lane-by-lane census passed as one lane-grid launch");
    assert!(e.contains("census"), "failed for another reason: {e}");
    Ok(())
}
