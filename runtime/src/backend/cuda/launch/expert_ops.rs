//! The grouped expert launches (`kernels/cuda/experts.cu`): gate/up and down of every routed slot
//! in one launch each, reading the route ids and the matrices from the group's device table; the
//! slot folds, combines and the owner select; and the fused rope + KV append. Every extent a
//! kernel may touch is checked against the group's largest entry first (`experts.rs`).

use super::{cfg, elementwise_grid, i32_of, shape_err, ELEMENTWISE_THREADS, HEAD_DIM};
use crate::backend::cuda::CudaBackend;
use crate::backend::{Op, Slice};
use crate::Result;
use cudarc::driver::LaunchConfig;

impl CudaBackend {
    /// The grouped expert ops, RopeAppend (`out_rank`: a peer store's destination, else `rank`).
    pub(super) fn launch_expert_op(&self, rank: usize, op: &Op, out_rank: usize) -> Result<()> {
        match *op {
            Op::ExpertGateUp { group, route, first_slot, slots, x, limit, fold_up, act, act_pitch } => {
                let what = "expert_gate_up";
                let g = self.group(rank, group, what)?;
                let (tp, rp, xp, ap) = (
                    g.table.ptr(),
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, x, what)?,
                    self.slice_ptr(rank, act, what)?,
                );
                if x.len != g.cols {
                    return Err(shape_err(what, format!("x has {} values, the experts {} columns", x.len, g.cols)));
                }
                let need = g.need(what, "act", route.len, (first_slot, slots, act_pitch), |e| e.rows)?;
                if act.len < need {
                    return Err(shape_err(what, format!("act holds {} values, the slots need {need}", act.len)));
                }
                let Some((c, [ne, ex, k, fs], rpb_i)) =
                    g.slot_launch(what, (g.max_rows, g.rpb_gate_up), slots, route.len, first_slot)?
                else {
                    return Ok(());
                };
                // experts.cu's SWIGLU_PLAIN / SWIGLU_CLAMPED / SWIGLU_FOLD_UP.
                let mode = match (limit, fold_up) {
                    (None, false) => 0i32,
                    (Some(_), false) => 1,
                    (None, true) => 2,
                    (Some(l), true) => {
                        return Err(shape_err(
                            what,
                            format!(
                                "fold_up with a clamp at {l}: the folded up scale is defined for unclamped layers only"
                            ),
                        ))
                    }
                };
                let (lim, pitch) = (limit.unwrap_or(0.0), i32_of(what, "act pitch", act_pitch)?);
                let (c, lane_p, kernel) = (self.on_lanes_y(c), self.lane_pitch(), g.gate_up_kernel);
                // The shared slot may run before the wait where the kernel ahead touches neither
                // x nor act (experts.cu's expert_gate_up_bpl_entry).
                let ahead = i32::from(self.settled(rank, &[x.buf, act.buf]));
                if ahead == 1 {
                    self.note_ahead();
                }
                launch!(self, rank, kernel, c, tp, ne, ex, rp, k, fs, xp, mode, lim, ap, pitch, rpb_i, lane_p, ahead)
            }
            Op::ExpertGateUpRows { group, route, first_slot, slots, x, gate, up, pitch } => {
                let what = "expert_gate_up_rows";
                let g = self.group(rank, group, what)?;
                let (tp, rp, xp, gp, up_p) = (
                    g.table.ptr(),
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, x, what)?,
                    self.slice_ptr(rank, gate, what)?,
                    self.slice_ptr(rank, up, what)?,
                );
                if x.len != g.cols {
                    return Err(shape_err(what, format!("x has {} values, the experts {} columns", x.len, g.cols)));
                }
                let need = g.need(what, "gate", route.len, (first_slot, slots, pitch), |e| e.rows)?;
                if gate.len < need || up.len < need {
                    return Err(shape_err(
                        what,
                        format!("gate holds {} values and up {}, the slots need {need} each", gate.len, up.len),
                    ));
                }
                let Some((c, [ne, ex, k, fs], rpb_i)) =
                    g.slot_launch(what, (g.max_rows, g.rpb_gate_up), slots, route.len, first_slot)?
                else {
                    return Ok(());
                };
                let pitch_i = i32_of(what, "pitch", pitch)?;
                let (c, lane_p) = (self.on_lanes_y(c), self.lane_pitch());
                launch!(
                    self,
                    rank,
                    "expert_gate_up_rows_f32",
                    c,
                    tp,
                    ne,
                    ex,
                    rp,
                    k,
                    fs,
                    xp,
                    gp,
                    up_p,
                    pitch_i,
                    rpb_i,
                    lane_p
                )
            }
            Op::ExpertDown { group, route, first_slot, slots, act, act_pitch, out, out_pitch } => {
                let what = "expert_down";
                let g = self.group(rank, group, what)?;
                let (tp, rp, ap, op_ptr) = (
                    g.table.ptr(),
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, act, what)?,
                    self.slice_ptr(out_rank, out, what)?,
                );
                let need_a = g.need(what, "act", route.len, (first_slot, slots, act_pitch), |e| e.rows)?;
                let need_o = g.need(what, "out", route.len, (first_slot, slots, out_pitch), |e| e.down_parts)?;
                if act.len < need_a || out.len < need_o {
                    return Err(shape_err(
                        what,
                        format!("act holds {} values (need {need_a}), out {} (need {need_o})", act.len, out.len),
                    ));
                }
                let Some((c, [ne, ex, k, fs], rpb_i)) =
                    g.slot_launch(what, (g.max_down_rows, g.rpb_down), slots, route.len, first_slot)?
                else {
                    return Ok(());
                };
                let (ap_i, op_i) = (i32_of(what, "act pitch", act_pitch)?, i32_of(what, "out pitch", out_pitch)?);
                let (c, lane_p, kernel) = (self.on_lanes_y(c), self.lane_pitch(), g.down_kernel);
                launch!(self, rank, kernel, c, tp, ne, ex, rp, k, fs, ap, ap_i, op_ptr, op_i, rpb_i, lane_p)
            }
            Op::FoldSlots { route, first_slot, slots, parts, parts_pitch, n_parts, owner, scales, out } => {
                let what = "fold_slots";
                let (rp, pp, op_ptr) = (
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, parts, what)?,
                    self.slice_ptr(out_rank, out, what)?,
                );
                if slots == 0 || out.len % slots != 0 {
                    return Err(shape_err(what, format!("out of {} values is not {slots} slots", out.len)));
                }
                let width = out.len / slots;
                Self::check_strided(what, "parts", parts, slots, parts_pitch, n_parts * width)?;
                if width == 0 {
                    return Ok(());
                }
                let (tp, ne, ex) = match scales {
                    Some(g) => {
                        let g = self.group(rank, g, what)?;
                        (g.table.ptr(), g.n_entries, g.experts)
                    }
                    None => (0u64, 0, 0),
                };
                let o = owner.unwrap_or(crate::backend::SlotOwner {
                    rule: crate::backend::OwnerRule { experts: 0, div: 0, modulo: 0 },
                    want: 0,
                });
                let c = LaunchConfig {
                    grid_dim: (width.div_ceil(ELEMENTWISE_THREADS as usize).min(64) as u32, slots as u32, 1),
                    block_dim: (ELEMENTWISE_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (k, fs, ppitch, np, w) = (
                    i32_of(what, "route", route.len)?,
                    i32_of(what, "first_slot", first_slot)?,
                    i32_of(what, "parts pitch", parts_pitch)?,
                    i32_of(what, "n_parts", n_parts)?,
                    i32_of(what, "width", width)?,
                );
                let (cond, ne_i, ex_i) = (owner.is_some() as i32, ne as i32, ex as i32);
                let (oe, od, om, ow) = (o.rule.experts, o.rule.div, o.rule.modulo, o.want);
                let (c, lane_p) = (self.on_lanes_z(c), self.lane_pitch());
                launch!(
                    self,
                    rank,
                    "fold_slots_f32",
                    c,
                    rp,
                    k,
                    fs,
                    pp,
                    ppitch,
                    np,
                    w,
                    op_ptr,
                    cond,
                    oe,
                    od,
                    om,
                    ow,
                    tp,
                    ne_i,
                    ex_i,
                    lane_p
                )
            }
            Op::FoldCombineResidual { parts, pitch, n_parts, w, h, out, sum, x } => {
                let what = "fold_combine_residual";
                let p = |s: Slice| self.slice_ptr(rank, s, what);
                let (pp, wp, hp, op_ptr, sp, xp) = (p(parts)?, p(w)?, p(h)?, p(out)?, p(sum)?, p(x)?);
                if out.len % 2 != 0 {
                    return Err(shape_err(what, format!("out of {} values is not [routed | shared]", out.len)));
                }
                let width = out.len / 2;
                if h.len != width || sum.len != width || x.len != width {
                    return Err(shape_err(
                        what,
                        format!("h {} sum {} x {}: each must be out's half ({width})", h.len, sum.len, x.len),
                    ));
                }
                Self::check_strided(what, "parts", parts, w.len + 1, pitch, n_parts * width)?;
                if width == 0 {
                    return Ok(());
                }
                let (pitch_i, np, k, w_i) = (
                    i32_of(what, "pitch", pitch)?,
                    i32_of(what, "n_parts", n_parts)?,
                    i32_of(what, "slots", w.len)?,
                    i32_of(what, "width", width)?,
                );
                let c = self.on_lanes_z(cfg(elementwise_grid(width), ELEMENTWISE_THREADS, 0));
                let lane_p = self.lane_pitch();
                launch!(
                    self,
                    rank,
                    "fold_combine_residual_f32",
                    c,
                    pp,
                    pitch_i,
                    np,
                    wp,
                    k,
                    w_i,
                    hp,
                    op_ptr,
                    sp,
                    xp,
                    lane_p
                )
            }
            Op::SelectSlots { route, rule, ranks, src, rank_pitch, out } => {
                let what = "select_slots";
                let (rp, sp, op_ptr) = (
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, src, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let k = route.len;
                if k == 0 || out.len % k != 0 {
                    return Err(shape_err(what, format!("out of {} values is not {k} slots", out.len)));
                }
                let width = out.len / k;
                Self::check_strided(what, "src", src, ranks, rank_pitch, k * width)?;
                if width == 0 || ranks == 0 {
                    return Ok(());
                }
                let c = LaunchConfig {
                    grid_dim: (width.div_ceil(ELEMENTWISE_THREADS as usize).min(64) as u32, k as u32, 1),
                    block_dim: (ELEMENTWISE_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (k_i, ranks_i, pitch, w) = (
                    i32_of(what, "route", k)?,
                    i32_of(what, "ranks", ranks)?,
                    i32_of(what, "rank pitch", rank_pitch)?,
                    i32_of(what, "width", width)?,
                );
                let (oe, od, om) = (rule.experts, rule.div, rule.modulo);
                launch!(self, rank, "select_slots_f32", c, rp, k_i, oe, od, om, ranks_i, sp, pitch, w, op_ptr)
            }
            Op::CombineOwned { route, owner, y, w, out } => {
                let what = "combine_owned";
                let (rp, yp, wp, op_ptr) = (
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, y, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let k = route.len;
                if Some(y.len) != k.checked_mul(out.len) || w.len < k {
                    return Err(shape_err(what, format!("y {} w {} for {k} slots of {}", y.len, w.len, out.len)));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let (k_i, width) = (i32_of(what, "route", k)?, i32_of(what, "width", out.len)?);
                let (oe, od, om, ow) = (owner.rule.experts, owner.rule.div, owner.rule.modulo, owner.want);
                let c = cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0);
                launch!(self, rank, "combine_owned_f32", c, rp, k_i, oe, od, om, ow, yp, wp, width, op_ptr)
            }
            Op::RopeAppend { q, k, v, q_norm, k_norm, eps, table, pos, q_out, k_out, k_cache, v_cache } => {
                let what = "rope_append";
                let p = |s: Slice| self.slice_ptr(rank, s, what);
                let (qp, kp, vp, qnp, knp, tp) = (p(q)?, p(k)?, p(v)?, p(q_norm)?, p(k_norm)?, p(table)?);
                let (qop, kop, kcp, vcp) = (p(q_out)?, p(k_out)?, p(k_cache)?, p(v_cache)?);
                if pos.len == 0 {
                    return Err(shape_err(what, "the position slice is empty; it must hold one u32".into()));
                }
                let pp = p(pos.sub(0, 1))?;
                let ok = q.len % HEAD_DIM == 0
                    && k.len % HEAD_DIM == 0
                    && k.len > 0
                    && v.len == k.len
                    && q_out.len == q.len
                    && k_out.len == k.len
                    && q_norm.len == HEAD_DIM
                    && k_norm.len == HEAD_DIM
                    && table.len % HEAD_DIM == 0;
                if !ok {
                    return Err(shape_err(
                        what,
                        format!(
                            "q {} k {} v {} q_out {} k_out {} norms {}/{} table {}: whole heads of 128 required",
                            q.len, k.len, v.len, q_out.len, k_out.len, q_norm.len, k_norm.len, table.len
                        ),
                    ));
                }
                let cache_positions = k_cache.len.min(v_cache.len) / k.len;
                let (qh, kvh) = (q.len / HEAD_DIM, k.len / HEAD_DIM);
                let warps = qh + 2 * kvh;
                let (positions, cpos, qh_i, kvh_i) = (
                    i32_of(what, "table rows", table.len / HEAD_DIM)?,
                    i32_of(what, "cache positions", cache_positions)?,
                    qh as i32,
                    kvh as i32,
                );
                let (c, lane_p) = (self.on_lanes_z(cfg(warps.div_ceil(4), 128, 0)), self.lane_pitch());
                launch!(
                    self,
                    rank,
                    "rope_append_f32",
                    c,
                    qp,
                    kp,
                    vp,
                    qnp,
                    knp,
                    eps,
                    tp,
                    pp,
                    positions,
                    cpos,
                    qh_i,
                    kvh_i,
                    qop,
                    kop,
                    kcp,
                    vcp,
                    lane_p
                )
            }
            _ => Err(shape_err("launch_expert_op", "not a grouped expert op".into())),
        }
    }
}
