//! Which lanes of a pass one multi-lane GEMV launch may serve (docs/DESIGN.md §3.6), decided
//! from the ops alone so that every backend decides it the same way: the CUDA backend fuses such
//! lanes into one launch that reads each weight once (`backend/cuda/launch/lanes.rs`), and the
//! host backend counts them in its census as the same one launch (its twins run lane by lane,
//! which is the definition), so the two censuses stay equal name for name.

use crate::backend::{Op, RowOrder, Slice, WeightId};

/// Most lanes one launch computes (`GEMV_LANES_MAX` in gemv_lanes.cu; a pass holds up to 8).
pub const LANES_MAX: usize = 8;
/// Most weights of one fused launch (the batch parameter block's `GEMV_BATCH_MAX`).
pub const ITEMS_MAX: usize = 4;

/// Which op the lanes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneMode {
    /// `Op::GemvRows` in the canonical order.
    Rows,
    /// `Op::GemvRowsBatch`.
    RowsBatch,
    /// `Op::GemvPartials`.
    Partials,
}

/// Lanes the device may run as one launch: lane i reads `x` shifted by `i·x_pitch` and writes
/// each item's output shifted by `i·pitch` (element pitches, one buffer each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanePlan {
    pub mode: LaneMode,
    pub lanes: usize,
    /// Lane 0's input.
    pub x: Slice,
    pub x_pitch: usize,
    /// Per weight: its id, lane 0's output and the outputs' pitch.
    pub items: Vec<(WeightId, Slice, usize)>,
}

impl LanePlan {
    /// The census name of the fused launch: the op's name with `_lanes`, then the storage
    /// (`gemv_rows_lanes.bf16`), so a census shows that the weights were read once per pass.
    pub fn kernel(&self, format: &str) -> String {
        let op = match self.mode {
            LaneMode::Rows => "gemv_rows",
            LaneMode::RowsBatch => "gemv_rows_batch",
            LaneMode::Partials => "gemv_partials",
        };
        format!("{op}_lanes.{format}")
    }
}

/// The constant pitch of `slices` — lane i's slice is lane 0's moved by `i·pitch` elements in
/// the same buffer, with the same length, `pitch ≥ 0` — or why not.
pub fn lane_pitch(what: &str, slices: &[Slice]) -> std::result::Result<usize, String> {
    let first = *slices.first().ok_or_else(|| format!("{what}: no lanes"))?;
    let pitch = match slices.get(1) {
        Some(s) if s.offset >= first.offset => s.offset - first.offset,
        Some(s) => return Err(format!("{what}: lane 1 at {} precedes lane 0 at {}", s.offset, first.offset)),
        None => 0,
    };
    for (i, s) in slices.iter().enumerate() {
        if s.buf != first.buf || s.len != first.len || s.offset != first.offset + i * pitch {
            return Err(format!(
                "{what}: lane {i} is {}+{} of buffer {}, not {}+{} of buffer {} (pitch {pitch})",
                s.offset,
                s.len,
                s.buf,
                first.offset + i * pitch,
                first.len,
                first.buf
            ));
        }
    }
    Ok(pitch)
}

/// The elements lanes `0..lanes` of a slice at `pitch` cover, as (buffer, start, end).
fn span(s: Slice, pitch: usize, lanes: usize) -> (u32, usize, usize) {
    (s.buf, s.offset, s.offset + (lanes - 1) * pitch + s.len)
}

fn overlap(a: (u32, usize, usize), b: (u32, usize, usize)) -> bool {
    a.0 == b.0 && a.1 < b.2 && b.1 < a.2
}

/// Whether `ops` (lane i's op at `ops[i]`) can run as one multi-lane launch, from the ops alone:
/// 2 to 8 lanes of one GEMV kind (canonical rows, a row batch or partials) reading the same
/// weights, inputs in one buffer at a constant pitch, and per weight outputs in one buffer at a
/// constant pitch no smaller than an output (lanes never write each other's elements), no output
/// overlapping an input or another weight's outputs (so the order of the lanes' launches cannot
/// matter). Otherwise the reason, and the caller launches lane by lane.
pub fn plan_lanes(ops: &[Op]) -> std::result::Result<LanePlan, String> {
    if !(2..=LANES_MAX).contains(&ops.len()) {
        return Err(format!("{} lanes: a fused launch takes 2 to {LANES_MAX}", ops.len()));
    }
    // Per lane: the input and, per weight, (id, output).
    let mut xs = Vec::with_capacity(ops.len());
    let mut per_lane: Vec<Vec<(WeightId, Slice)>> = Vec::with_capacity(ops.len());
    let mut mode = None;
    for (i, op) in ops.iter().enumerate() {
        let (m, x, items) = match op {
            Op::GemvRows { w, x, out, order: RowOrder::Canonical } => (LaneMode::Rows, *x, vec![(*w, *out)]),
            Op::GemvRowsBatch { items, x } => (LaneMode::RowsBatch, *x, items.clone()),
            Op::GemvPartials { w, x, out } => (LaneMode::Partials, *x, vec![(*w, *out)]),
            other => return Err(format!("lane {i}: {} has no multi-lane kernel", other.name())),
        };
        if mode.is_some_and(|m0| m0 != m) {
            return Err(format!("lane {i}: {} differs from lane 0's op", op.name()));
        }
        mode = Some(m);
        xs.push(x);
        per_lane.push(items);
    }
    let mode = mode.expect("two lanes or more");
    let n_items = per_lane[0].len();
    if n_items == 0 || n_items > ITEMS_MAX {
        return Err(format!("{n_items} weights: a fused launch takes 1 to {ITEMS_MAX}"));
    }
    let x_pitch = lane_pitch("x", &xs)?;
    let lanes = ops.len();
    let x_span = span(xs[0], x_pitch, lanes);
    let mut items: Vec<(WeightId, Slice, usize)> = Vec::with_capacity(n_items);
    for j in 0..n_items {
        let w = per_lane[0][j].0;
        let mut outs = Vec::with_capacity(lanes);
        for (i, lane) in per_lane.iter().enumerate() {
            match lane.get(j) {
                Some(&(wi, out)) if wi == w && lane.len() == n_items => outs.push(out),
                _ => return Err(format!("lane {i}: its weights differ from lane 0's")),
            }
        }
        let what = format!("out of weight {j}");
        let pitch = lane_pitch(&what, &outs)?;
        if outs[0].len == 0 || pitch < outs[0].len {
            return Err(format!("{what}: pitch {pitch} is below the output's {} elements", outs[0].len));
        }
        let s = span(outs[0], pitch, lanes);
        if overlap(s, x_span) {
            return Err(format!("{what}: the lanes' outputs overlap their inputs"));
        }
        if items.iter().any(|&(_, o, p)| overlap(s, span(o, p, lanes))) {
            return Err(format!("{what}: overlaps another weight's outputs"));
        }
        items.push((w, outs[0], pitch));
    }
    Ok(LanePlan { mode, lanes, x: xs[0], x_pitch, items })
}

/// The census name of the one launch a device makes of `ops`, or `None` where the lanes run
/// one launch each: a GEMV planned by [`plan_lanes`] whose weights are all dense BF16 or F32 of
/// one format (`format` gives a weight's census format), or an op with a lane-grid kernel
/// planned by [`plan_grid`](super::lane_grid::plan_grid) (`kernel_of` names lane 0's kernel as a
/// single launch would be named). Every backend counts multi-lane launches by this rule.
pub fn fused_kernel<'a>(
    ops: &[Op],
    format: impl Fn(WeightId) -> Option<&'a str>,
    kernel_of: impl Fn(&Op) -> String,
) -> Option<String> {
    match plan_lanes(ops) {
        Ok(plan) => {
            let first = format(plan.items[0].0)?;
            let dense = matches!(first, "bf16" | "f32") && plan.items.iter().all(|i| format(i.0) == Some(first));
            dense.then(|| plan.kernel(first))
        }
        Err(_) => {
            super::lane_grid::plan_grid(ops).ok()?;
            Some(super::lane_grid::lanes_name(&kernel_of(&ops[0])))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(w: WeightId, x: Slice, out: Slice) -> Op {
        Op::GemvRows { w, x, out, order: RowOrder::Canonical }
    }

    /// Lane i's op of a pass whose lanes sit at the given pitches in buffers 0 (x) and 1 (out).
    fn lanes(n: usize, x_pitch: usize, out_pitch: usize) -> Vec<Op> {
        (0..n).map(|i| rows(3, Slice::new(0, i * x_pitch, 16), Slice::new(1, 8 + i * out_pitch, 4))).collect()
    }

    #[test]
    fn constant_pitches_are_fused_and_everything_else_falls_back_with_its_reason() {
        for n in 2..=8 {
            let p = plan_lanes(&lanes(n, 16, 4)).unwrap();
            assert_eq!((p.mode, p.lanes, p.x, p.x_pitch), (LaneMode::Rows, n, Slice::new(0, 0, 16), 16));
            assert_eq!(p.items, vec![(3, Slice::new(1, 8, 4), 4)]);
            assert_eq!(p.kernel("bf16"), "gemv_rows_lanes.bf16");
        }
        // One x shared by every lane (pitch 0) is fine; outputs at pitch 0 would collide.
        assert_eq!(plan_lanes(&lanes(4, 0, 4)).unwrap().x_pitch, 0);
        let refuse = |ops: &[Op], needle: &str| {
            let e = plan_lanes(ops).expect_err("must fall back");
            assert!(e.contains(needle), "reason `{e}` does not name `{needle}`");
        };
        refuse(&lanes(4, 16, 0), "pitch 0 is below");
        refuse(&lanes(4, 16, 3), "pitch 3 is below");
        refuse(&lanes(1, 16, 4), "1 lanes");
        refuse(&lanes(9, 16, 4), "9 lanes");
        // A skipped lane (active lanes 0, 1, 3): the pitch is not constant.
        let mut gap = lanes(4, 16, 4);
        gap.remove(2);
        refuse(&gap, "lane 2 is 48+16");
        // Lanes in reverse order (a negative pitch).
        let mut rev = lanes(3, 16, 4);
        rev.reverse();
        refuse(&rev, "precedes lane 0");
        // Another weight, another buffer, another length, another op, the tree order.
        let mut other_w = lanes(3, 16, 4);
        other_w[2] = rows(4, Slice::new(0, 32, 16), Slice::new(1, 16, 4));
        refuse(&other_w, "weights differ");
        let mut other_buf = lanes(3, 16, 4);
        other_buf[1] = rows(3, Slice::new(2, 16, 16), Slice::new(1, 12, 4));
        refuse(&other_buf, "of buffer 2");
        let mut tree = lanes(2, 16, 4);
        tree[1] = Op::GemvRows { w: 3, x: Slice::new(0, 16, 16), out: Slice::new(1, 12, 4), order: RowOrder::Tree };
        refuse(&tree, "gemv_rows has no multi-lane kernel");
        let mut mixed = lanes(2, 16, 4);
        mixed[1] = Op::GemvPartials { w: 3, x: Slice::new(0, 16, 16), out: Slice::new(1, 12, 4) };
        refuse(&mixed, "differs from lane 0");
        refuse(&vec![Op::FlipLowBit { x: Slice::new(0, 0, 1) }; 2], "flip_low_bit has no multi-lane kernel");
        // Outputs in the inputs' buffer: disjoint spans are fused, overlapping ones are not.
        let same_buf = |out0: usize| -> Vec<Op> {
            (0..2).map(|i| rows(3, Slice::new(0, i * 16, 16), Slice::new(0, out0 + i * 4, 4))).collect()
        };
        assert!(plan_lanes(&same_buf(32)).is_ok());
        refuse(&same_buf(20), "overlap their inputs");
    }

    #[test]
    fn row_batches_need_the_same_weights_in_every_lane_and_disjoint_outputs() {
        let batch = |i: usize, outs: [(u32, usize); 2]| Op::GemvRowsBatch {
            items: outs.iter().map(|&(buf, off)| (buf, Slice::new(buf, off + i * 8, 8))).collect(),
            x: Slice::new(0, i * 16, 16),
        };
        let ops: Vec<Op> = (0..3).map(|i| batch(i, [(1, 0), (2, 0)])).collect();
        let p = plan_lanes(&ops).unwrap();
        assert_eq!(p.mode, LaneMode::RowsBatch);
        assert_eq!(p.items, vec![(1, Slice::new(1, 0, 8), 8), (2, Slice::new(2, 0, 8), 8)]);
        assert_eq!(p.kernel("f32"), "gemv_rows_batch_lanes.f32");
        // Two weights writing into one buffer: fused when their lanes' spans are apart.
        let two = |second: usize| -> Vec<Op> {
            (0..2)
                .map(|i| Op::GemvRowsBatch {
                    items: vec![(1, Slice::new(1, i * 8, 8)), (2, Slice::new(1, second + i * 8, 8))],
                    x: Slice::new(0, i * 16, 16),
                })
                .collect()
        };
        assert!(plan_lanes(&two(16)).is_ok());
        let e = plan_lanes(&two(8)).unwrap_err();
        assert!(e.contains("overlaps another weight's outputs"), "{e}");
        let mut fewer = ops.clone();
        fewer[1] = Op::GemvRowsBatch { items: vec![(1, Slice::new(1, 8, 8))], x: Slice::new(0, 16, 16) };
        assert!(plan_lanes(&fewer).unwrap_err().contains("weights differ"));
    }
}
