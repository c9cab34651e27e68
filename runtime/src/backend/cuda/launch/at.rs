//! Launches of the GRAPH door's position-independent ops: the decode position lives in device
//! memory (`SetU32`, once per token outside any graph) and the attention half reads it there, so
//! a captured layer replays with zero per-token node updates. Shape rules are checked here as in
//! the parent module; the position itself can only be checked by the kernels, which write nothing
//! when it is out of range (exactly like their host twins).

use super::{attention_shape, attention_smem, cfg, elementwise_grid, i32_of, shape_err, ATTN_THREADS, HEAD_DIM};
use crate::backend::cuda::CudaBackend;
use crate::backend::{Op, Slice};
use crate::Result;

impl CudaBackend {
    /// The position slice of a GRAPH op: at least one u32.
    fn pos_ptr(&self, rank: usize, pos: Slice, what: &str) -> Result<u64> {
        if pos.len == 0 {
            return Err(shape_err(what, "the position slice is empty; it must hold one u32".into()));
        }
        self.slice_ptr(rank, pos.sub(0, 1), what)
    }

    pub(super) fn launch_at_op(&self, rank: usize, op: &Op) -> Result<()> {
        match *op {
            Op::SetU32 { out, value } => {
                let op_ptr = self.pos_ptr(rank, out, "set_u32")?;
                launch!(self, rank, "set_u32", cfg(1, 32, 0), op_ptr, value)
            }
            Op::AppendAt { src, cache, pos } => {
                let what = "append_at";
                let (sp, cp, pp) = (
                    self.slice_ptr(rank, src, what)?,
                    self.slice_ptr(rank, cache, what)?,
                    self.pos_ptr(rank, pos, what)?,
                );
                if src.len == 0 || cache.len % src.len != 0 {
                    return Err(shape_err(
                        what,
                        format!("cache of {} values is not whole rows of the {}-value source", cache.len, src.len),
                    ));
                }
                let (n, positions) =
                    (i32_of(what, "row length", src.len)?, i32_of(what, "positions", cache.len / src.len)?);
                launch!(
                    self,
                    rank,
                    "append_at_f32",
                    cfg(elementwise_grid(src.len), super::ELEMENTWISE_THREADS, 0),
                    sp,
                    cp,
                    pp,
                    n,
                    positions
                )
            }
            Op::QkNormRopeAt { x, w, eps, table, pos } => {
                let what = "qk_norm_rope_at";
                let (xp, wp, tp, pp) = (
                    self.slice_ptr(rank, x, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, table, what)?,
                    self.pos_ptr(rank, pos, what)?,
                );
                if x.len % HEAD_DIM != 0 || w.len != HEAD_DIM || table.len % HEAD_DIM != 0 {
                    return Err(shape_err(
                        what,
                        format!(
                            "x {} (whole heads of 128), w {} (128), table {} (rows of 128)",
                            x.len, w.len, table.len
                        ),
                    ));
                }
                let heads = x.len / HEAD_DIM;
                if heads == 0 {
                    return Ok(());
                }
                let (positions, heads_i) = (i32_of(what, "table rows", table.len / HEAD_DIM)?, heads as i32);
                launch!(
                    self,
                    rank,
                    "qk_norm_rope_at_f32",
                    cfg(heads.div_ceil(4), 128, 0),
                    xp,
                    wp,
                    eps,
                    tp,
                    pp,
                    positions,
                    heads_i
                )
            }
            Op::AttentionAt { q, k, v, gate, pos, max_len, q_heads, kv_heads, partition, out } => {
                let what = "attention_at";
                let (qp, kp, vp, gp, pp, outp) = (
                    self.slice_ptr(rank, q, what)?,
                    self.slice_ptr(rank, k, what)?,
                    self.slice_ptr(rank, v, what)?,
                    self.slice_ptr(rank, gate, what)?,
                    self.pos_ptr(rank, pos, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                // Shared memory holds the scores of the longest sequence the graph may see.
                attention_shape(what, [q, k, v, gate, out], max_len, q_heads, kv_heads)?;
                let smem = attention_smem(what, max_len, 1)?;
                let (max_i, qh, kvh) = (i32_of(what, "max_len", max_len)?, q_heads as i32, kv_heads as i32);
                let part = i32_of(what, "partition", partition)?;
                launch!(
                    self,
                    rank,
                    "decode_attention_at_f32",
                    cfg(q_heads, ATTN_THREADS, smem),
                    qp,
                    kp,
                    vp,
                    gp,
                    pp,
                    max_i,
                    qh,
                    kvh,
                    part,
                    outp
                )
            }
            _ => Err(shape_err("launch_at", "not a GRAPH position-independent op".into())),
        }
    }
}
