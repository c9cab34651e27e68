//! Lanes of a pass run as one launch over a grid of lanes (docs/DESIGN.md §3.6): for the ops
//! below the device kernel takes a lane index and moves each of its pointers by that slice's
//! lane pitch, so lane i computes exactly what its own launch would (same kernel body, same
//! operands, same order) — only the launch count changes. The row-wise reductions (norms, the
//! router's top-k, the MoE folds) are latency-bound single blocks, and the rope seam's launch is a
//! few blocks; launched once per lane they cost a B-row pass B launch latencies each. The grouped
//! expert ops read every selected expert of every lane in one launch instead of one launch per
//! lane.
//!
//! The rule is decided from the ops alone, so the CUDA backend fuses exactly when the host
//! and distributed backends count one fused launch in their censuses (`fused_kernel` in
//! `lanes.rs`); the twins run lane by lane, which is the definition of the bits.

use super::lanes::{lane_pitch, LANES_MAX};
use super::{span, Op, Slice};

/// The slices (by their index in [`Op::map_slices`] order) that an op with a lane-grid kernel
/// writes; `None` for ops without one.
fn written(op: &Op) -> Option<&'static [usize]> {
    // Not `Fold`: one fold launch for every column of a pass is TCOL_OPROJ's mechanism (a door,
    // witnessed by its `fold_lanes` launches), so the canonical path keeps one fold per lane.
    Some(match op {
        Op::RmsNorm { .. } | Op::Router { .. } | Op::FoldSlots { .. } => &[2],
        Op::AddRmsNorm { .. } | Op::ResidualAdd { .. } => &[3, 4],
        Op::FoldCombineResidual { .. } => &[3, 4, 5],
        Op::ExpertGateUp { .. } | Op::ExpertDown { .. } => &[2],
        // q_out, k_out and the two caches: rows append to their own sessions' caches. The
        // columns of a pass share one cache (each column's row of it), so their cache slices
        // overlap and stay one launch per column, in column order.
        Op::RopeAppend { .. } => &[7, 8, 9, 10],
        _ => return None,
    })
}

/// Lanes `0..lanes` of one op as one launch: lane i's slice j is lane 0's moved by
/// `i · pitches[j]` elements (pitch 0: every lane reads the same slice, e.g. a norm weight).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GridPlan {
    pub lanes: usize,
    /// Per slice of lane 0's op, in [`Op::map_slices`] order.
    pub pitches: Vec<usize>,
}

fn slices_of(op: &Op) -> Vec<Slice> {
    let mut v = Vec::new();
    op.clone().map_slices(|s| v.push(*s));
    v
}

fn overlap(a: Slice, b: Slice) -> bool {
    a.buf == b.buf && a.offset < b.offset + b.len && b.offset < a.offset + a.len
}

/// Whether `ops` (lane i's op at `ops[i]`) can run as one lane-grid launch, from the ops alone:
/// 2 to 8 lanes of one op kind that has a lane-grid kernel, equal in everything but their
/// slices; every slice at a constant pitch in one buffer; every written slice at a pitch no
/// smaller than itself, and no lane writing what another lane reads or writes (so running the
/// lanes in any order, or at once, gives the per-lane launches' bits). Otherwise the reason.
pub fn plan_grid(ops: &[Op]) -> Result<GridPlan, String> {
    if !(2..=LANES_MAX).contains(&ops.len()) {
        return Err(format!("{} lanes: a lane-grid launch takes 2 to {LANES_MAX}", ops.len()));
    }
    let outs = written(&ops[0]).ok_or_else(|| format!("{} has no lane-grid kernel", ops[0].name()))?;
    let per_lane: Vec<Vec<Slice>> = ops.iter().map(slices_of).collect();
    for (i, op) in ops.iter().enumerate().skip(1) {
        // Lane 0's op with lane i's slices must be lane i's op: only the slices differ.
        let mut probe = ops[0].clone();
        let mut it = per_lane[i].iter();
        let mut short = false;
        probe.map_slices(|s| match it.next() {
            Some(v) => *s = *v,
            None => short = true,
        });
        if short || it.next().is_some() || &probe != op {
            return Err(format!("lane {i}: {} differs from lane 0's in more than its slices", op.name()));
        }
    }
    let n = per_lane[0].len();
    let mut pitches = Vec::with_capacity(n);
    for j in 0..n {
        let lane_slices: Vec<Slice> = per_lane.iter().map(|s| s[j]).collect();
        let pitch = lane_pitch(&format!("slice {j} of {}", ops[0].name()), &lane_slices)?;
        if outs.contains(&j) && (lane_slices[0].len == 0 || pitch < lane_slices[0].len) {
            return Err(format!(
                "written slice {j} of {}: pitch {pitch} is below its {} elements",
                ops[0].name(),
                lane_slices[0].len
            ));
        }
        pitches.push(pitch);
    }
    for (i, mine) in per_lane.iter().enumerate() {
        for &o in outs {
            for (l, theirs) in per_lane.iter().enumerate().filter(|(l, _)| *l != i) {
                if let Some(j) = (0..n).find(|&j| overlap(mine[o], theirs[j])) {
                    return Err(format!(
                        "lane {i}'s written slice {o} of {} overlaps lane {l}'s slice {j}",
                        ops[0].name()
                    ));
                }
            }
        }
    }
    Ok(GridPlan { lanes: ops.len(), pitches })
}

/// The census name of a lane-grid launch: the kernel's name with `_lanes` before its storage
/// (`expert_gate_up.e4m3` → `expert_gate_up_lanes.e4m3`, `rmsnorm` → `rmsnorm_lanes`).
pub fn lanes_name(kernel: &str) -> String {
    match kernel.split_once('.') {
        Some((name, storage)) => format!("{name}_lanes.{storage}"),
        None => format!("{kernel}_lanes"),
    }
}

/// Every slice lanes `0..plan.lanes` of `op` touch, each as its span over the lanes.
pub fn grid_spans(op: &Op, plan: &GridPlan) -> Vec<Slice> {
    slices_of(op).into_iter().zip(&plan.pitches).map(|(s, &p)| span(s, p, plan.lanes)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(i: usize, x_pitch: usize, out_pitch: usize) -> Op {
        Op::RmsNorm {
            x: Slice::new(0, i * x_pitch, 16),
            w: Slice::new(1, 0, 16),
            eps: 1e-6,
            out: Slice::new(2, i * out_pitch, 16),
        }
    }

    #[test]
    fn lanes_at_constant_pitches_are_one_launch_and_everything_else_says_why_not() {
        for n in 2..=8 {
            let ops: Vec<Op> = (0..n).map(|i| norm(i, 16, 32)).collect();
            assert_eq!(plan_grid(&ops).unwrap(), GridPlan { lanes: n, pitches: vec![16, 0, 32] });
        }
        let refuse = |ops: &[Op], needle: &str| {
            let e = plan_grid(ops).expect_err("must run lane by lane");
            assert!(e.contains(needle), "reason `{e}` does not name `{needle}`");
        };
        refuse(&[norm(0, 16, 16)], "1 lanes");
        refuse(&(0..9).map(|i| norm(i, 16, 16)).collect::<Vec<_>>(), "9 lanes");
        // Outputs at pitch 0 or overlapping: lanes would write each other's elements.
        refuse(&(0..3).map(|i| norm(i, 16, 0)).collect::<Vec<_>>(), "pitch 0 is below");
        refuse(&(0..3).map(|i| norm(i, 16, 8)).collect::<Vec<_>>(), "pitch 8 is below");
        // Another eps in one lane: more than the slices differ.
        let mut eps = (0..3).map(|i| norm(i, 16, 16)).collect::<Vec<_>>();
        if let Op::RmsNorm { eps: e, .. } = &mut eps[2] {
            *e = 1e-5;
        }
        refuse(&eps, "differs from lane 0's");
        // A skipped lane: the pitch is not constant.
        let mut gap = (0..4).map(|i| norm(i, 16, 16)).collect::<Vec<_>>();
        gap.remove(1);
        refuse(&gap, "lane 2 is 48+16");
        // Lane 1 writes where lane 0 reads (out in x's buffer, shifted by one lane).
        let in_place = |i: usize| Op::RmsNorm {
            x: Slice::new(0, i * 16, 16),
            w: Slice::new(1, 0, 16),
            eps: 1e-6,
            out: Slice::new(0, 16 + i * 16, 16),
        };
        refuse(&(0..2).map(in_place).collect::<Vec<_>>(), "overlaps lane");
        // Each lane in place on its own row is fine.
        let own = |i: usize| Op::RmsNorm {
            x: Slice::new(0, i * 16, 16),
            w: Slice::new(1, 0, 16),
            eps: 1e-6,
            out: Slice::new(0, i * 16, 16),
        };
        assert!(plan_grid(&(0..4).map(own).collect::<Vec<_>>()).is_ok());
        let fold = Op::Fold { parts: Slice::new(0, 0, 4), n_parts: 2, reverse: false, out: Slice::new(1, 0, 2) };
        refuse(&vec![fold; 2], "fold has no lane-grid");
        let argmax = Op::Argmax { x: Slice::new(0, 0, 4), out: Slice::new(1, 0, 1) };
        refuse(&vec![argmax; 2], "argmax has no lane-grid");
    }

    /// Lane i's rope at `pos` pitch 1; its caches `cache_pitch` apart (rows: one session each;
    /// columns: 0, one shared cache).
    fn rope(i: usize, cache_pitch: usize) -> Op {
        let (lq, lkv, positions) = (512, 256, 6);
        Op::RopeAppend {
            q: Slice::new(0, i * lq, lq),
            k: Slice::new(1, i * lkv, lkv),
            v: Slice::new(2, i * lkv, lkv),
            q_norm: Slice::new(3, 0, 128),
            k_norm: Slice::new(3, 128, 128),
            eps: 1e-6,
            table: Slice::new(4, 0, positions * 128),
            pos: Slice::new(5, i, 1),
            q_out: Slice::new(6, i * lq, lq),
            k_out: Slice::new(7, i * lkv, lkv),
            k_cache: Slice::new(8, i * cache_pitch, positions * lkv),
            v_cache: Slice::new(9, i * cache_pitch, positions * lkv),
        }
    }

    #[test]
    fn rows_rope_into_their_own_caches_in_one_launch_and_columns_of_one_cache_do_not() {
        let rows: Vec<Op> = (0..8).map(|i| rope(i, 6 * 256)).collect();
        let plan = plan_grid(&rows).unwrap();
        assert_eq!(plan.pitches, vec![512, 256, 256, 0, 0, 0, 1, 512, 256, 6 * 256, 6 * 256]);
        // Columns append to one session's cache: the lanes' cache slices are one slice.
        let columns: Vec<Op> = (0..4).map(|i| rope(i, 0)).collect();
        let e = plan_grid(&columns).expect_err("columns share their cache");
        assert!(e.contains("written slice 9") && e.contains("pitch 0"), "{e}");
        // Caches closer than a cache apart would let a row write into its neighbour's session.
        let e = plan_grid(&(0..2).map(|i| rope(i, 256)).collect::<Vec<_>>()).expect_err("overlapping caches");
        assert!(e.contains("written slice 9"), "{e}");
    }

    #[test]
    fn census_names_put_lanes_before_the_storage() {
        assert_eq!(lanes_name("expert_gate_up.e4m3"), "expert_gate_up_lanes.e4m3");
        assert_eq!(lanes_name("router_dev"), "router_dev_lanes");
    }
}
