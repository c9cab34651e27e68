//! STEP_EP's expert-parallel arithmetic as a host program: its default, which
//! `MEMRA_STEP_EP_DEVICE_ARITHMETIC` replaces with device launches (docs/DESIGN.md §3.4; the
//! engine's host bounce). Each function runs for the one active lane (`Ctx::each_lane`): it reads
//! its operands from device memory (backend reads, counted in the census), applies the host twin
//! — the exact function the device kernel twins — and writes the result back (backend writes).
//! The same operands in the same order give the same bits as the door's kernels; only the census
//! tells the two apart.

use super::moe::held;
use super::Ctx;
use crate::backend::Slice;
use crate::evidence::coverage;
use crate::evidence::record::Seam;
use crate::Result;

/// The SwiGLU of every routed slot rank `r` owns (`ids`: the lane's route): the gate rows (which
/// `Op::ExpertGateUpRows` stored in `ea`) and up rows (in `eu`) read, `canon::swiglu_traced`
/// applied — both clamps, counted in the program's coverage as the host backend's twin counts the
/// fused kernel's — and the activations written back into `ea` for the down projection.
pub(super) fn swiglu(ctx: &mut Ctx, l: usize, r: usize, ids: &[usize]) -> Result<()> {
    let c = &ctx.model.config;
    let (rows, limit, pitch) = (c.expert_width, c.swiglu_limit_at(l), ctx.buffers.act_pitch);
    let (ea, eu) = (ctx.buffers.ranks[r].ea, ctx.buffers.ranks[r].eu);
    let at = ctx.lane_point(l, Seam::Experts);
    for (s, e) in ids.iter().enumerate() {
        if !held(ctx, l, r, Some(*e)) {
            continue;
        }
        let g = ctx.read_lane(r, ea.sub(s * pitch, rows))?;
        let u = ctx.read_lane(r, eu.sub(s * pitch, rows))?;
        let (mut silu, mut high, mut low) = (0u64, 0u64, 0u64);
        let act: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&gv, &uv)| {
                let (v, clamps) = memra_kernels::canon::swiglu_traced(gv, uv, limit);
                (silu, high, low) =
                    (silu + clamps.silu as u64, high + clamps.up_high as u64, low + clamps.up_low as u64);
                v
            })
            .collect();
        ctx.write_lane(r, ea.sub(s * pitch, rows), &act)?;
        for (what, n) in
            [("elements", rows as u64), ("clamp_silu", silu), ("clamp_up_high", high), ("clamp_up_low", low)]
        {
            ctx.note_coverage(&coverage::swiglu_path(what, false), at, n);
        }
    }
    Ok(())
}

/// The root's weighted combine: the slot outputs `y` and route weights `w` read,
/// `twins::moe::combine_shared` applied (the routed sum in slot order from +0.0, then the shared
/// slot), `out` written.
pub(super) fn combine(ctx: &mut Ctx, y: Slice, w: Slice, out: Slice) -> Result<()> {
    let yv = ctx.read_lane(0, y)?;
    let wv = ctx.read_lane(0, w)?;
    let mut o = vec![0.0f32; out.len];
    memra_kernels::twins::moe::combine_shared(&yv, &wv, &mut o);
    ctx.write_lane(0, out, &o)
}
