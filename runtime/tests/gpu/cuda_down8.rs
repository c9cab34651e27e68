//! SEL_DOWN8 on a device (`kernels/cuda/down8.cu`):
//! - the fused kernel equals its host twin (`twins::down8`) bit for bit, and on the device itself
//!   equals the unfused `expert_down` + `fold_slots` + `combine_owned` it replaces — both owners,
//!   experts one warp's row wide (1024) and narrower (256), every or only odd experts held, inputs
//!   with signed zeros and subnormals, a route with a non-expert id, weights with ±0.0;
//! - runs: on `edge` with NVFP4_EP2, the door's runs at TP1 and co-resident TP2 (and TP2 on two
//!   devices) equal the host run of the same doors bit for bit, equal the device run without the
//!   door, and the device census equals the host's (one fused sweep per owner, layer and step).
//!
//! Without a CUDA device every test reads `ignored (no CUDA device: …)`.

use crate::cases::{compare, run_case, Case, Rng, CO_RESIDENT, FAST, ROW_MAJOR};
use crate::cuda_step::{add_group, GroupSpec};
use crate::edge_fixture::{battery, edge};
use crate::harness::{cuda_backend, GpuTest, NotRun, Ran};
use memra_runtime::backend::cuda::{CudaOptions, PlacementPolicy};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{Op, OwnerRule, Slice, SlotOwner};
use memra_runtime::{program, DoorSet, RunConfig, RuntimeError, Transport};

pub fn tests() -> Vec<GpuTest> {
    let mut t = vec![
        GpuTest::new("expert_down_combine_matches_twin_and_the_unfused_ops", kernel_matches_twin_and_unfused),
        GpuTest::new("sel_down8_runs_equal_the_host_co_resident", || runs(None)),
    ];
    t.extend(GpuTest::per_device_count("sel_down8_runs_equal_the_host", &[2], |n| runs(Some(n))));
    t
}

/// The fused op of `owner` and, after it, the unfused ops of the same owner: outputs
/// (fused parts, fused sum, unfused parts, unfused sum) appended to the case in that order.
#[allow(clippy::too_many_arguments)]
fn fused_and_unfused(
    c: &mut Case,
    group: u32,
    route: Slice,
    owner: SlotOwner,
    act: Slice,
    (pitch, n_parts): (usize, usize),
    w: Slice,
    width: usize,
) {
    let k = route.len;
    let stride = n_parts * width + 3;
    let parts_len = (k - 1) * stride + n_parts * width;
    let (parts, out) = (c.out(parts_len), c.out(width));
    let fused = Op::ExpertDownCombine {
        group,
        route,
        owner,
        act,
        act_pitch: pitch,
        parts,
        parts_pitch: stride,
        w,
        out,
        reverse: false,
    };
    c.ops.push(fused);
    // The unfused ops: every held slot's partials, the owner's folds with the NVFP4 down scale,
    // the owner's sum (the folded outputs in a scratch of their own).
    let (parts, out) = (c.out(parts_len), c.out(width));
    let y = c.buf(vec![0.0; k * width]);
    c.ops.push(Op::ExpertDown { group, route, first_slot: 0, slots: k, act, act_pitch: pitch, out: parts, out_pitch: stride });
    let fold = Op::FoldSlots {
        route,
        first_slot: 0,
        slots: k,
        parts,
        parts_pitch: stride,
        n_parts,
        owner: Some(owner),
        scales: Some(group),
        out: y,
    };
    c.ops.push(fold);
    c.ops.push(Op::CombineOwned { route, owner, y, w, out });
}

/// One case per (expert width, holding): both owners of a route with 3 slots each (so a chain in
/// another slot order shows) and a non-expert id; then owner 0 of a route where its only slot's
/// weight is −0.0 (so a chain that does not start from +0.0 shows as −0.0 rows).
fn kernel_matches_twin_and_unfused() -> Ran {
    let mut rng = Rng(29);
    let (mut cases, mut reversed) = (Vec::new(), Vec::new());
    for width in [1024usize, 256] {
        // K-blocks of 128 columns: the group's E4M3 shared expert needs whole scale blocks.
        let g = GroupSpec { experts: 8, rows: width, cols: 512, kw: 128, down_kw: 128, row0: 0, nvfp4: true, nan_codes_in: None };
        let n_parts = width / g.down_kw;
        let odd = |e: usize| e % 2 == 1;
        for (hold, held) in [("all held", &(|_| true) as &dyn Fn(usize) -> bool), ("odd experts held", &odd)] {
            let mut c = Case::new(format!("width {width}, {hold}"));
            let group = add_group(&mut c, &mut rng, &g, held);
            let k = 6usize;
            let pitch = width + 5;
            let act = c.buf(rng.vec(k * pitch, 2.0));
            let rule = OwnerRule { experts: g.experts as u32, div: 1, modulo: 2 };
            let route = c.ids(&[3, 0, 5, 2, 6, 1]);
            let w = c.buf(vec![0.5, -0.0, 1.25, 2.0, 0.0, -3.5]);
            // An owner holds the experts it owns (a rank of NVFP4_EP2 holds the odd ones and owns
            // them): with only odd experts held, owner 1 alone is a real configuration (owner 0
            // would own experts nobody uploaded, whose unfused folds read unwritten partials).
            let owners: &[u32] = if hold == "all held" { &[0, 1] } else { &[1] };
            for &want in owners {
                fused_and_unfused(&mut c, group, route, SlotOwner { rule, want }, act, (pitch, n_parts), w, g.cols);
            }
            // Owner 1's only owned slot (expert 3, slot 0; the rest are even or no expert) weighted
            // −0.0: a chain that does not start from +0.0 shows as −0.0 rows.
            let lone = c.ids(&[3, 4, 6, 999, 2, 0]);
            let w_lone = c.buf(vec![-0.0, 0.5, 1.25, 2.0, 0.0, -3.5]);
            fused_and_unfused(&mut c, group, lone, SlotOwner { rule, want: 1 }, act, (pitch, n_parts), w_lone, g.cols);
            cases.push(c);
            // The canary's planted defect (canary_down8_slot_order): each owner's fused sweep in
            // slot order, then reversed — the device's reversed chain is held to the twin's.
            let mut r = Case::new(format!("width {width}, {hold}, reversed chain"));
            let group = add_group(&mut r, &mut rng, &g, held);
            let act = r.buf(rng.vec(k * pitch, 2.0));
            let (route, w) = (r.ids(&[3, 0, 5, 2, 6, 1]), r.buf(vec![0.5, -0.0, 1.25, 2.0, 0.0, -3.5]));
            for &want in owners {
                for reverse in [false, true] {
                    let stride = n_parts * g.cols + 3;
                    let (parts, out) = (r.out((k - 1) * stride + n_parts * g.cols), r.out(g.cols));
                    let owner = SlotOwner { rule, want };
                    let (act_pitch, parts_pitch) = (pitch, stride);
                    let op = Op::ExpertDownCombine { group, route, owner, act, act_pitch, parts, parts_pitch, w, out, reverse };
                    r.ops.push(op);
                }
            }
            reversed.push(r);
        }
    }
    let mut failures = Vec::new();
    // Outputs come in fours per op pair: the fused sum is 4i + 1, the unfused one 4i + 3; the
    // last pair is the lone −0.0-weighted slot's.
    let sums = |o: &[Vec<f32>], at: usize| (0..o.len() / 4).map(|i| o[4 * i + at].clone()).collect::<Vec<_>>();
    for c in &cases {
        let mut host = HostBackend::new(1).expect("host backend");
        let want = run_case(&mut host, c).unwrap_or_else(|e| panic!("{}: host run failed: {e}", c.label));
        // On the host: fused sums = unfused sums (the twin is the composition).
        assert_eq!(compare(&sums(&want, 1), &sums(&want, 3), false), None, "{} host", c.label);
        let lone = &want[want.len() - 3];
        assert!(lone.iter().all(|v| v.to_bits() == 0), "{}: a lone -0.0-weighted slot sums to +0.0", c.label);
        for opts in [FAST, ROW_MAJOR] {
            let mut dev = cuda_backend(1, opts)?;
            let label = format!("{} [{:?}]", c.label, opts.gemv_layout);
            match run_case(&mut dev, c) {
                Err(e) => failures.push(format!("{label}: CUDA run failed: {e}")),
                Ok(got) => {
                    if let Some(msg) = compare(&want, &got, false) {
                        failures.push(format!("{label}: device ≠ twin: {msg}"));
                    }
                    if let Some(msg) = compare(&sums(&got, 1), &sums(&got, 3), false) {
                        failures.push(format!("{label}: fused ≠ unfused on the device: {msg}"));
                    }
                    println!("ok {label}");
                }
            }
        }
    }
    for c in &reversed {
        let mut host = HostBackend::new(1).expect("host backend");
        let want = run_case(&mut host, c).unwrap_or_else(|e| panic!("{}: host run failed: {e}", c.label));
        // Outputs per owner: (parts, sum) in slot order, then reversed; the partials are the same,
        // and with 3 owned slots the reversed chain shows on the host (so the comparison can fail).
        for o in want.chunks(4) {
            assert_eq!(compare(&o[..1], &o[2..3], false), None, "{}: partials", c.label);
        }
        assert!(want.chunks(4).any(|o| compare(&o[1..2], &o[3..4], false).is_some()), "{}: order unseen", c.label);
        let mut dev = cuda_backend(1, FAST)?;
        match run_case(&mut dev, c) {
            Err(e) => failures.push(format!("{}: CUDA run failed: {e}", c.label)),
            Ok(got) => match compare(&want, &got, false) {
                Some(msg) => failures.push(format!("{}: device ≠ twin: {msg}", c.label)),
                None => println!("ok {}", c.label),
            },
        }
    }
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// The door's runs on `edge`: device = host with the same doors, = device without the door,
/// census = host census.
fn runs(distinct: Option<usize>) -> Ran {
    let (where_, opts, sizes): (&str, CudaOptions, Vec<usize>) = match distinct {
        None => ("co-resident", CO_RESIDENT, vec![1, 2]),
        Some(tp) => ("distinct devices", CudaOptions { placement: PlacementPolicy::Auto, ..CO_RESIDENT }, vec![tp]),
    };
    let ep2 = DoorSet { nvfp4_ep2: true, ..DoorSet::default() };
    let mut not_run = NotRun::new();
    for tp in sizes {
        for (name, extra) in [("", DoorSet::default()), ("+sel_mirror", DoorSet { sel_mirror: true, ..DoorSet::default() })] {
            if extra.sel_mirror && tp == 1 {
                continue;
            }
            let what = format!("TP{tp} {where_} nvfp4_ep2+sel_down8{name}");
            let cfg = |down8: bool| {
                let mut c = RunConfig::new(tp, Transport::NativeP2p, battery()).unwrap();
                c.doors = DoorSet { sel_down8: down8, sel_mirror: extra.sel_mirror, ..ep2 };
                c
            };
            let mut got = Vec::new();
            for down8 in [true, false] {
                let mut b = cuda_backend(tp, opts)?;
                match program::run(edge(), &cfg(down8), &mut b) {
                    Ok(r) => got.push(r),
                    Err(RuntimeError::Unavailable(reason)) => {
                        not_run.note(&what, reason);
                        break;
                    }
                    Err(e) => panic!("{what}: CUDA run failed: {e}"),
                }
            }
            let [on, off] = &got[..] else { continue };
            let host = program::run(edge(), &cfg(true), &mut HostBackend::new(tp).unwrap()).unwrap();
            assert_eq!(host.first_digest_difference(on), None, "{what}: device ≠ host");
            assert_eq!(on.tokens, host.tokens, "{what}");
            assert_eq!(off.first_digest_difference(on), None, "{what}: the door changed a bit on the device");
            assert_eq!(on.census, host.census, "{what}: census");
            let sweeps = on.census.get("launch.expert_down_combine.nvfp4").copied().unwrap_or(0);
            assert!(sweeps > 0, "{what}: no fused sweep");
            println!("ok {what}: {sweeps} fused sweeps");
            not_run.ran();
        }
    }
    not_run.finish()
}
