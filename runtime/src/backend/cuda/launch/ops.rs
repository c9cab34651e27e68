//! Op → kernel for every plain op of the program (folds, elementwise ops, norms, q/k norm + RoPE,
//! attention, the router, SwiGLU, combines, residual add, argmax, the flip canary); GEMVs, the
//! GRAPH door's position-independent ops and the grouped expert ops are dispatched to their own
//! files.

use super::gemv::GemvMode;
use super::{
    attention_shape, attention_smem, cfg, elementwise_grid, i32_of, shape_err, ARGMAX_MAX_BLOCKS, ARGMAX_THREADS,
    ATTN_THREADS, ELEMENTWISE_THREADS, HEAD_DIM, ROUTER_THREADS, SMEM_LIMIT,
};
use crate::backend::cuda::CudaBackend;
use crate::backend::{Op, RowOrder, Slice};
use crate::error::RuntimeError;
use crate::Result;

/// Dynamic shared memory of the norm kernels: one staged row of `n` f32 (one block per row),
/// within `SMEM_LIMIT` (a 12288-wide row, exactly 48 KiB, failed to launch on the H200). Their
/// warp sums add 32 bytes of static shared memory to the 1 KiB that limit keeps; a row at the
/// limit has not been launched.
fn norm_smem(n: usize) -> Result<usize> {
    if n * 4 > SMEM_LIMIT {
        return Err(RuntimeError::Capacity {
            what: "rmsnorm shared memory (bytes)".into(),
            value: n * 4,
            limit: SMEM_LIMIT,
            rule: format!(
                "rmsnorm: a row of {n} values needs {} bytes of shared memory, more than the {SMEM_LIMIT} a block gets",
                n * 4
            ),
        });
    }
    Ok(n * 4)
}

impl CudaBackend {
    /// Check `rows` rows of `width` (the weight length) in `x`, as the norm twins do.
    fn norm_rows(op: &str, n: usize, width: usize) -> Result<usize> {
        if width == 0 {
            return if n == 0 { Ok(0) } else { Err(shape_err(op, format!("empty weight but {n} input elements"))) };
        }
        if !n.is_multiple_of(width) {
            return Err(shape_err(op, format!("{n} input elements are not whole rows of width {width}")));
        }
        Ok(n / width)
    }

    pub(crate) fn launch_op(&self, rank: usize, op: &Op) -> Result<()> {
        self.launch_op_to(rank, op, rank)
    }

    /// Launch `op` on `rank`'s stream with its store target ([`Op::store_target`]) resolved on
    /// `out_rank` — the one place a kernel is handed another rank's pointer (a peer store; the
    /// caller enabled peer access and placed the fences). Every other slice is `rank`'s. An op
    /// without a store target cannot be redirected.
    pub(crate) fn launch_op_to(&self, rank: usize, op: &Op, out_rank: usize) -> Result<()> {
        if out_rank != rank && op.store_target().is_none() {
            return Err(shape_err(
                op.name(),
                format!("has no single output to store into rank {out_rank} from rank {rank}"),
            ));
        }
        let to = out_rank;
        match *op {
            Op::GemvRows { w, x, out, order } => {
                let mode = if order == RowOrder::Tree { GemvMode::Tree } else { GemvMode::Rows };
                self.gemv(rank, w, x, out, to, mode)
            }
            Op::GemvPartials { w, x, out } => self.gemv(rank, w, x, out, to, GemvMode::Partials),
            Op::GemvRowsBatch { ref items, x } => self.gemv_batch(rank, items, x),
            Op::Fold { parts, n_parts, reverse, out } => {
                let (pp, outp) = (self.slice_ptr(rank, parts, "fold")?, self.slice_ptr(to, out, "fold")?);
                if Some(parts.len) != n_parts.checked_mul(out.len) {
                    return Err(shape_err(
                        "fold",
                        format!("{} values is not {n_parts} parts × {}", parts.len, out.len),
                    ));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let (np, width, rev) = (i32_of("fold", "n_parts", n_parts)?, out.len as i32, reverse as i32);
                let c = cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0);
                launch!(self, rank, "fold_f32", c, pp, np, width, rev, outp)
            }
            Op::Add { a, b, out } => {
                let (ap, bp, outp) =
                    (self.slice_ptr(rank, a, "add")?, self.slice_ptr(rank, b, "add")?, self.slice_ptr(to, out, "add")?);
                if a.len != out.len || b.len != out.len {
                    return Err(shape_err("add", format!("lengths {} + {} → {}", a.len, b.len, out.len)));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let n = out.len as i32;
                launch!(self, rank, "add_f32", cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0), ap, bp, outp, n)
            }
            Op::Scale { x, s, out } => {
                let (xp, outp) = (self.slice_ptr(rank, x, "scale")?, self.slice_ptr(to, out, "scale")?);
                if x.len != out.len {
                    return Err(shape_err("scale", format!("lengths {} → {}", x.len, out.len)));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let n = out.len as i32;
                launch!(self, rank, "scale_f32", cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0), xp, s, outp, n)
            }
            Op::RmsNorm { x, w, eps, out } => {
                let (xp, wp, outp) = (
                    self.slice_ptr(rank, x, "rmsnorm")?,
                    self.slice_ptr(rank, w, "rmsnorm")?,
                    self.slice_ptr(rank, out, "rmsnorm")?,
                );
                let rows = Self::norm_rows("rmsnorm", x.len, w.len)?;
                if out.len != x.len {
                    return Err(shape_err("rmsnorm", format!("out has {} elements, x has {}", out.len, x.len)));
                }
                if rows == 0 {
                    return Ok(());
                }
                let (n, rows_i) = (w.len as i32, rows as i32);
                let (c, lane_p) = (self.on_lanes_z(cfg(rows, 256, norm_smem(w.len)?)), self.lane_pitch());
                launch!(self, rank, "rmsnorm_f32", c, xp, wp, eps, outp, n, rows_i, lane_p)
            }
            Op::AddRmsNorm { x, a, w, eps, h, out } => {
                let what = "add_rmsnorm";
                let (xp, ap, wp, hp, outp) = (
                    self.slice_ptr(rank, x, what)?,
                    self.slice_ptr(rank, a, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, h, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let rows = Self::norm_rows(what, x.len, w.len)?;
                if a.len != x.len || h.len != x.len || out.len != x.len {
                    return Err(shape_err(what, format!("x {} a {} h {} out {} differ", x.len, a.len, h.len, out.len)));
                }
                if rows == 0 {
                    return Ok(());
                }
                let (n, rows_i, lane_p) = (w.len as i32, rows as i32, self.lane_pitch());
                launch!(
                    self,
                    rank,
                    "add_rmsnorm_f32",
                    self.on_lanes_z(cfg(rows, 256, norm_smem(w.len)?)),
                    xp,
                    ap,
                    wp,
                    eps,
                    hp,
                    outp,
                    n,
                    rows_i,
                    lane_p
                )
            }
            Op::FoldAddRmsNorm { parts, n_parts, x, w, eps, a, h, out } => {
                let what = "fold_add_rmsnorm";
                let (pp, xp, wp, ap, hp, outp) = (
                    self.slice_ptr(rank, parts, what)?,
                    self.slice_ptr(rank, x, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, a, what)?,
                    self.slice_ptr(rank, h, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let rows = Self::norm_rows(what, x.len, w.len)?;
                if a.len != x.len || h.len != x.len || out.len != x.len || Some(parts.len) != n_parts.checked_mul(x.len)
                {
                    return Err(shape_err(
                        what,
                        format!(
                            "parts {} ({n_parts} parts) x {} a {} h {} out {}",
                            parts.len, x.len, a.len, h.len, out.len
                        ),
                    ));
                }
                if rows == 0 {
                    return Ok(());
                }
                let (np, n, rows_i) = (i32_of(what, "n_parts", n_parts)?, w.len as i32, rows as i32);
                launch!(
                    self,
                    rank,
                    "fold_add_rmsnorm_f32",
                    cfg(rows, 256, norm_smem(w.len)?),
                    pp,
                    np,
                    xp,
                    wp,
                    eps,
                    ap,
                    hp,
                    outp,
                    n,
                    rows_i
                )
            }
            Op::QkNormRope { x, w, eps, cos_sin } => {
                let what = "qk_norm_rope";
                let (xp, wp, cp) = (
                    self.slice_ptr(rank, x, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, cos_sin, what)?,
                );
                if x.len % HEAD_DIM != 0 || w.len != HEAD_DIM || cos_sin.len != HEAD_DIM {
                    return Err(shape_err(
                        what,
                        format!("x {} (whole heads of 128), w {}, cos_sin {} (128 each)", x.len, w.len, cos_sin.len),
                    ));
                }
                let heads = x.len / HEAD_DIM;
                if heads == 0 {
                    return Ok(());
                }
                let heads_i = heads as i32;
                launch!(self, rank, "qk_norm_rope_f32", cfg(heads.div_ceil(4), 128, 0), xp, wp, eps, cp, heads_i)
            }
            Op::Attention { q, k, v, gate, len, q_heads, kv_heads, out } => {
                let what = "attention";
                let (qp, kp, vp, gp, outp) = (
                    self.slice_ptr(rank, q, what)?,
                    self.slice_ptr(rank, k, what)?,
                    self.slice_ptr(rank, v, what)?,
                    self.slice_ptr(rank, gate, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                attention_shape(what, [q, k, v, gate, out], len, q_heads, kv_heads)?;
                let smem = attention_smem(what, len, 1)?;
                let (len_i, qh, kvh) = (len as i32, q_heads as i32, kv_heads as i32);
                launch!(
                    self,
                    rank,
                    "decode_attention_f32",
                    cfg(q_heads, ATTN_THREADS, smem),
                    qp,
                    kp,
                    vp,
                    gp,
                    len_i,
                    qh,
                    kvh,
                    outp
                )
            }
            Op::Router { logits, bias, k, normalize, scaling, out, device_variant } => {
                let what = "router";
                let (lp, bp, outp) = (
                    self.slice_ptr(rank, logits, what)?,
                    self.slice_ptr(rank, bias, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let n = logits.len;
                if bias.len != n || k > n || out.len != 2 * k || k > 32 || 12 * n > SMEM_LIMIT {
                    return Err(shape_err(
                        what,
                        format!(
                            "{n} experts, bias {}, top-{k}, out {} (needs 2k, k ≤ 32, ≤ 4096 experts)",
                            bias.len, out.len
                        ),
                    ));
                }
                if k == 0 {
                    return Ok(());
                }
                let name = if device_variant { "router_topk_dev_f32" } else { "router_topk_f32" };
                let (n_i, k_i, norm) = (n as i32, k as i32, normalize as i32);
                let (c, lane_p) = (self.on_lanes_z(cfg(1, ROUTER_THREADS, 12 * n)), self.lane_pitch());
                launch!(self, rank, name, c, lp, bp, n_i, k_i, norm, scaling, outp, lane_p)
            }
            Op::Swiglu { gate, up, limit, out } => {
                let what = "swiglu";
                let (gp, up_p, outp) = (
                    self.slice_ptr(rank, gate, what)?,
                    self.slice_ptr(rank, up, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                if up.len != gate.len || out.len != gate.len {
                    return Err(shape_err(what, format!("gate {} up {} out {}", gate.len, up.len, out.len)));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let (has, lim, n) = (limit.is_some() as i32, limit.unwrap_or(0.0), out.len as i32);
                launch!(
                    self,
                    rank,
                    "swiglu_f32",
                    cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0),
                    gp,
                    up_p,
                    has,
                    lim,
                    outp,
                    n
                )
            }
            Op::Combine { y, w, out } => {
                let what = "combine";
                let (yp, wp, outp) =
                    (self.slice_ptr(rank, y, what)?, self.slice_ptr(rank, w, what)?, self.slice_ptr(rank, out, what)?);
                if Some(y.len) != w.len.checked_mul(out.len) {
                    return Err(shape_err(
                        what,
                        format!("y has {} elements, expected slots {} × width {}", y.len, w.len, out.len),
                    ));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let (slots, width) = (i32_of(what, "slots", w.len)?, out.len as i32);
                launch!(
                    self,
                    rank,
                    "combine_f32",
                    cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0),
                    yp,
                    wp,
                    slots,
                    width,
                    outp
                )
            }
            Op::CombineShared { y, w, out } => {
                let what = "combine_shared";
                let (yp, wp, outp) =
                    (self.slice_ptr(rank, y, what)?, self.slice_ptr(rank, w, what)?, self.slice_ptr(rank, out, what)?);
                let width = combine_width(what, y, w, out)?;
                if width == 0 {
                    return Ok(());
                }
                let (k, width_i) = (i32_of(what, "slots", w.len)?, i32_of(what, "width", width)?);
                let c = cfg(elementwise_grid(width), ELEMENTWISE_THREADS, 0);
                launch!(self, rank, "combine_shared_f32", c, yp, wp, k, width_i, outp)
            }
            Op::CombineScaled { route, y, w, macros, out } => {
                let what = "combine_scaled";
                let (rp, yp, wp, mp, outp) = (
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, y, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, macros, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let width = combine_width(what, y, w, out)?;
                if route.len != w.len {
                    return Err(shape_err(what, format!("{} route ids for {} routed weights", route.len, w.len)));
                }
                if width == 0 {
                    return Ok(());
                }
                let (k, width_i, n_m) =
                    (i32_of(what, "slots", w.len)?, i32_of(what, "width", width)?, i32_of(what, "macros", macros.len)?);
                let c = cfg(elementwise_grid(width), ELEMENTWISE_THREADS, 0);
                launch!(self, rank, "combine_scaled_f32", c, rp, yp, wp, mp, n_m, k, width_i, outp)
            }
            Op::ResidualAdd { h, a, b, sum, out } => {
                let what = "residual_add";
                let p = |s: Slice| self.slice_ptr(rank, s, what);
                let (hp, ap, bp, sp, outp) = (p(h)?, p(a)?, p(b)?, p(sum)?, p(out)?);
                let n = h.len;
                if a.len != n || b.len != n || sum.len != n || out.len != n {
                    return Err(shape_err(
                        what,
                        format!("h {n} a {} b {} sum {} out {}", a.len, b.len, sum.len, out.len),
                    ));
                }
                if n == 0 {
                    return Ok(());
                }
                let n_i = i32_of(what, "length", n)?;
                let (c, lane_p) =
                    (self.on_lanes_z(cfg(elementwise_grid(n), ELEMENTWISE_THREADS, 0)), self.lane_pitch());
                launch!(self, rank, "residual_add_f32", c, hp, ap, bp, sp, outp, n_i, lane_p)
            }
            Op::Argmax { x, out } => {
                let (xp, outp) = (self.slice_ptr(rank, x, "argmax")?, self.slice_ptr(rank, out, "argmax")?);
                if out.len != 1 {
                    return Err(shape_err("argmax", format!("out has {} elements, expected 1", out.len)));
                }
                let n = i32_of("argmax", "length", x.len)?;
                // One value per thread up to the block cap (a vocabulary of 32,768 is 128 blocks of
                // one load each): the result is the same for any grid (a strict total order).
                let grid = x.len.div_ceil(ARGMAX_THREADS as usize).clamp(1, ARGMAX_MAX_BLOCKS);
                let scratch = self.ranks[rank].scratch.ptr();
                launch!(self, rank, "argmax_f32", cfg(grid, ARGMAX_THREADS, 0), xp, n, outp, scratch)
            }
            Op::FlipLowBit { x } => {
                let xp = self.slice_ptr(rank, x, "flip_low_bit")?;
                if x.len == 0 {
                    return Err(shape_err("flip_low_bit", "empty slice".into()));
                }
                launch!(self, rank, "flip_low_bit_f32", cfg(1, 32, 0), xp)
            }
            Op::SetU32 { .. } | Op::QkNormRopeAt { .. } | Op::AttentionAt { .. } | Op::AppendAt { .. } => {
                self.launch_at_op(rank, op)
            }
            Op::IncU32 { .. } | Op::AttentionRows { .. } | Op::FoldLanes { .. } => self.launch_pass_op(rank, op),
            Op::MirrorSel { src, out } => self.launch_mirror_sel(rank, src, out, to),
            Op::ExpertDownCombine { .. } => self.launch_down_combine(rank, op),
            Op::RopeAppend { .. }
            | Op::ExpertGateUp { .. }
            | Op::ExpertGateUpRows { .. }
            | Op::ExpertDown { .. }
            | Op::FoldSlots { .. }
            | Op::FoldCombineResidual { .. }
            | Op::SelectSlots { .. }
            | Op::CombineOwned { .. } => self.launch_expert_op(rank, op, to),
        }
    }
}

/// The width of a `[routed | shared]` combine (`combine_shared`, `combine_scaled`): `out` is
/// `2·width` and `y` holds the `w.len` routed slots and the shared one, `[w.len + 1][width]`.
fn combine_width(what: &str, y: Slice, w: Slice, out: Slice) -> Result<usize> {
    let width = out.len / 2;
    if !out.len.is_multiple_of(2) || Some(y.len) != (w.len + 1).checked_mul(width) {
        return Err(shape_err(
            what,
            format!("y {} for {} routed slots + shared, out {} (2 × width)", y.len, w.len, out.len),
        ));
    }
    Ok(width)
}
