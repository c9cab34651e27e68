//! The lanes of one GEMV in one launch (docs/DESIGN.md §3.6): [`Backend::launch_lanes`] hands
//! the CUDA backend the same op for every row or column of a pass; when they read the same
//! weights with inputs and outputs at a constant pitch, one `gemv_*_lanes_*` launch
//! (`kernels/cuda/gemv_lanes.cu`) reads each weight element once for every lane, with each
//! lane's operands and order unchanged — so the bits are those of the per-lane launches, which
//! are the definition (anything this file does not fuse is launched lane by lane).
//!
//! [`plan_lanes`] (`backend/op/lanes.rs`, shared with the host backend's census) is the half
//! decided from the ops alone: same op kind, same weights, one
//! buffer per input and output at a constant pitch, lane outputs disjoint from each other and
//! from the inputs. [`CudaBackend::fused_lanes`] adds what the weights decide (dense formats of
//! one layout and shape, the sizes each op asserts), then [`CudaBackend::launch_fused_lanes`]
//! issues the launch.
//!
//! [`Backend::launch_lanes`]: crate::backend::Backend::launch_lanes

use super::gemv::{check_kblocks, gemv_rows_per_block, GemvBatch};
use super::{cfg, i32_of, GEMV_THREADS};
use crate::backend::cuda::memory::WeightKind;
use crate::backend::cuda::CudaBackend;
use crate::backend::op::lanes::{plan_lanes, LaneMode, LanePlan, ITEMS_MAX};
use crate::backend::{Op, Slice};
use crate::Result;

/// A plan the weights accept: the kernel, its census name and the launch shape.
pub(crate) struct FusedLanes {
    plan: LanePlan,
    pub kernel: String,
    dense: WeightKind,
    cols: usize,
    kw: usize,
    vec: usize,
}

impl CudaBackend {
    /// The fused launch of `ops` on `rank`, or `None` where they must run lane by lane (the
    /// plan refuses them, or a weight is not dense, the weights differ in format, layout or
    /// columns, or a size breaks a rule the per-lane launch reports with its own error).
    pub(crate) fn fused_lanes(&self, rank: usize, ops: &[Op]) -> Option<FusedLanes> {
        let plan = plan_lanes(ops).ok()?;
        let ws = &self.ranks.get(rank)?.weights;
        let first = ws.get(plan.items[0].0 as usize)?;
        let (kind, cols, kw, vec) = (first.kind, first.cols, first.kblock_width, first.vec);
        if !matches!(kind, WeightKind::Bf16 | WeightKind::F32) || cols == 0 || kw == 0 || plan.x.len != cols {
            return None;
        }
        let nk = cols / kw;
        check_kblocks("gemv_lanes", nk).ok()?;
        for &(w, out, pitch) in &plan.items {
            let wt = ws.get(w as usize)?;
            let want = if plan.mode == LaneMode::Partials { nk * wt.rows } else { wt.rows };
            let same = (wt.kind, wt.cols, wt.kblock_width, wt.vec) == (kind, cols, kw, vec);
            if !same || wt.rows == 0 || out.len != want || i32::try_from(pitch).is_err() {
                return None;
            }
        }
        i32::try_from(plan.x_pitch).ok()?;
        let kernel = plan.kernel(kind.suffix());
        Some(FusedLanes { plan, kernel, dense: kind, cols, kw, vec })
    }

    /// Issue a fused launch on `rank` (every lane's slices checked against their buffers first).
    pub(crate) fn launch_fused_lanes(&self, rank: usize, f: &FusedLanes) -> Result<()> {
        let op = "gemv_lanes";
        let p = &f.plan;
        let lane = |s: Slice, pitch: usize, i: usize| Slice::new(s.buf, s.offset + i * pitch, s.len);
        for i in 0..p.lanes {
            self.slice_ptr(rank, lane(p.x, p.x_pitch, i), op)?;
            for &(_, out, pitch) in &p.items {
                self.slice_ptr(rank, lane(out, pitch, i), op)?;
            }
        }
        let nk = f.cols / f.kw;
        let total_rows: usize = p.items.iter().map(|&(w, _, _)| self.ranks[rank].weights[w as usize].rows).sum();
        let rpb = gemv_rows_per_block(total_rows, nk);
        let mut b = GemvBatch::empty(p.items.len());
        let mut pitches = [0i32; ITEMS_MAX];
        let mut blocks = 0usize;
        for (i, &(w, out, pitch)) in p.items.iter().enumerate() {
            let rows = self.ranks[rank].weights[w as usize].rows;
            b.set(i, self.ranks[rank].weights[w as usize].data.ptr(), self.slice_ptr(rank, out, op)?, rows, blocks)?;
            pitches[i] = i32_of(op, "out pitch", pitch)?;
            blocks += rows.div_ceil(rpb);
        }
        b.close(p.items.len(), blocks)?;
        let xp = self.slice_ptr(rank, p.x, op)?;
        let name = match (p.mode == LaneMode::Partials, f.dense) {
            (false, WeightKind::Bf16) => "gemv_rows_lanes_bf16",
            (false, _) => "gemv_rows_lanes_f32",
            (true, WeightKind::Bf16) => "gemv_partials_lanes_bf16",
            (true, _) => "gemv_partials_lanes_f32",
        };
        let (cols_i, kw_i, rpb_i, vec_i) = (f.cols as i32, f.kw as i32, rpb as i32, f.vec as i32);
        let (lanes_i, x_pitch_i) = (p.lanes as i32, i32_of(op, "x pitch", p.x_pitch)?);
        let [p0, p1, p2, p3] = pitches;
        launch!(
            self,
            rank,
            name,
            cfg(blocks, GEMV_THREADS, 0),
            b,
            xp,
            cols_i,
            kw_i,
            rpb_i,
            vec_i,
            lanes_i,
            x_pitch_i,
            p0,
            p1,
            p2,
            p3
        )
    }
}
