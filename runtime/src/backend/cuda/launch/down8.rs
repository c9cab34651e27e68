//! SEL_DOWN8's launch (`kernels/cuda/down8.cu`): an NVFP4_EP2 owner's down sweep and route-weight
//! combine as one launch. Every extent the kernel touches is checked against the group first,
//! and the shapes the kernel is not written for are refused with their rule.

use super::{i32_of, shape_err, GEMV_THREADS};
use crate::backend::cuda::CudaBackend;
use crate::backend::Op;
use crate::Result;
use cudarc::driver::LaunchConfig;
use memra_kernels::twins::down8::DOWN8_MAX_COLS;

/// down8.cu's rows per block and the most routed slots one block stages.
const DC_ROWS: usize = 8;
const DC_MAX_SLOTS: usize = 16;

impl CudaBackend {
    /// `Op::ExpertDownCombine` on `rank` (never a peer store: it writes two slices).
    pub(super) fn launch_down_combine(&self, rank: usize, op: &Op) -> Result<()> {
        let Op::ExpertDownCombine { group, route, owner, act, act_pitch, parts, parts_pitch, w, out, reverse } = *op
        else {
            return Err(shape_err("expert_down_combine", format!("{} is not SEL_DOWN8's op", op.name())));
        };
        let what = "expert_down_combine";
        let g = self.group(rank, group, what)?;
        let k = route.len;
        if g.format != "nvfp4" {
            return Err(shape_err(what, format!("the fused sweep is NVFP4's; this group's experts are {}", g.format)));
        }
        if g.max_down_cols > DOWN8_MAX_COLS {
            return Err(shape_err(
                what,
                format!(
                    "a down row of {} values is wider than one warp's {DOWN8_MAX_COLS} (32 chunks of 32: the engine's \
                     (local_in >> 5) <= 32)",
                    g.max_down_cols
                ),
            ));
        }
        if k > DC_MAX_SLOTS || w.len < k || out.len != g.max_down_rows {
            return Err(shape_err(
                what,
                format!(
                    "{k} routed slots (at most {DC_MAX_SLOTS}), {} weights, out {} values for down rows {}",
                    w.len, out.len, g.max_down_rows
                ),
            ));
        }
        let need_a = g.need(what, "act", k, (0, k, act_pitch), |e| e.rows)?;
        let need_p = g.need(what, "parts", k, (0, k, parts_pitch), |e| e.down_parts)?;
        if act.len < need_a || parts.len < need_p {
            return Err(shape_err(
                what,
                format!("act holds {} values (need {need_a}), parts {} (need {need_p})", act.len, parts.len),
            ));
        }
        let p = |s| self.slice_ptr(rank, s, what);
        let (tp, rp, ap, pp, wp, op_ptr) = (g.table.ptr(), p(route)?, p(act)?, p(parts)?, p(w)?, p(out)?);
        if k == 0 || out.len == 0 {
            return Ok(());
        }
        let c = LaunchConfig {
            grid_dim: (out.len.div_ceil(DC_ROWS) as u32, 1, 1),
            block_dim: (GEMV_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ne, ex, k_i) = (i32_of(what, "entries", g.n_entries)?, i32_of(what, "experts", g.experts)?, k as i32);
        let (oe, od, om, ow) = (owner.rule.experts, owner.rule.div, owner.rule.modulo, owner.want);
        // The canary's planted reversed chain (canary_down8_slot_order): slots from k−1 down to 0.
        let reverse_i = i32::from(reverse);
        let (ap_i, pp_i, width) = (
            i32_of(what, "act pitch", act_pitch)?,
            i32_of(what, "parts pitch", parts_pitch)?,
            i32_of(what, "width", out.len)?,
        );
        launch!(
            self,
            rank,
            "expert_down_combine_f32",
            c,
            tp,
            ne,
            ex,
            rp,
            k_i,
            oe,
            od,
            om,
            ow,
            ap,
            ap_i,
            pp,
            pp_i,
            wp,
            op_ptr,
            width,
            reverse_i
        )
    }
}
