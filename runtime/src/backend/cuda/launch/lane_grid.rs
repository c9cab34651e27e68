//! Lane-grid launches (docs/DESIGN.md §3.6, the rule in `backend/op/lane_grid.rs`): the lanes of
//! a pass that run one op with every slice at a constant pitch are one launch whose grid has a
//! lane dimension; the kernel moves each pointer by `lane × pitch` of its slice and runs the
//! single-lane body unchanged, so lane i's bits are its own launch's.
//!
//! The kernels that take a [`LanePitch`] (`struct LanePitch` in canon.cuh) take it on every
//! launch: a single lane passes [`LanePitch::ONE`]. The lane index is `blockIdx.z`, except in
//! the grouped expert kernels, whose `blockIdx.y` interleaves (slot, lane) slot-major so that the
//! lanes' blocks of one slot — every lane's shared expert above all — run side by side and read
//! the same weights through L2.

use crate::backend::cuda::CudaBackend;
use crate::backend::op::lane_grid::{grid_spans, GridPlan};
use crate::backend::Op;
use crate::error::RuntimeError;
use crate::Result;
use cudarc::driver::LaunchConfig;

/// Most slices of an op with a lane-grid kernel (`rope_append` has 11; `p[11]` in canon.cuh).
pub(crate) const PITCHES_MAX: usize = 11;

/// The lanes of one launch and each slice's lane pitch (elements), in the op's slice order
/// ([`Op::map_slices`]); the kernel parameter `lp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LanePitch {
    lanes: i32,
    p: [i32; PITCHES_MAX],
}

impl LanePitch {
    /// A single lane.
    pub(crate) const ONE: LanePitch = LanePitch { lanes: 1, p: [0; PITCHES_MAX] };

    fn of(plan: &GridPlan, what: &str) -> Result<LanePitch> {
        let bad = |rule: String| RuntimeError::Contract(format!("{what} over {} lanes: {rule}", plan.lanes));
        if plan.pitches.len() > PITCHES_MAX {
            return Err(bad(format!("{} slices, a lane-grid kernel takes {PITCHES_MAX}", plan.pitches.len())));
        }
        let mut p = [0i32; PITCHES_MAX];
        for (d, &s) in p.iter_mut().zip(&plan.pitches) {
            *d = i32::try_from(s).map_err(|_| bad(format!("lane pitch {s} does not fit a 32-bit kernel argument")))?;
        }
        Ok(LanePitch { lanes: plan.lanes as i32, p })
    }
}

impl CudaBackend {
    /// The lane pitches of the launch being issued (`ONE` outside a lane-grid launch).
    pub(super) fn lane_pitch(&self) -> LanePitch {
        self.lane_grid.get()
    }

    /// `c` with the lane dimension of the launch being issued: `grid.z` = lanes.
    pub(super) fn on_lanes_z(&self, mut c: LaunchConfig) -> LaunchConfig {
        c.grid_dim.2 = self.lane_grid.get().lanes as u32;
        c
    }

    /// `c` with the lanes interleaved into `grid.y` (slot-major: y = slot × lanes + lane).
    pub(super) fn on_lanes_y(&self, mut c: LaunchConfig) -> LaunchConfig {
        c.grid_dim.1 *= self.lane_grid.get().lanes as u32;
        c
    }

    /// Issue lane 0's op with the lane dimension of `plan`: every lane's slices are checked
    /// against their buffers (the spans over the lanes), and the op's own shape rules against
    /// lane 0's (the lanes differ only by offsets, `plan_grid`).
    pub(crate) fn launch_lane_grid(&self, rank: usize, ops: &[Op], plan: &GridPlan) -> Result<()> {
        let op = &ops[0];
        for s in grid_spans(op, plan) {
            self.slice_ptr(rank, s, op.name())?;
        }
        self.lane_grid.set(LanePitch::of(plan, op.name())?);
        let out = self.launch_op(rank, op);
        self.lane_grid.set(LanePitch::ONE);
        out
    }
}
