//! Launches of the rows-and-columns doors (docs/DESIGN.md §3.6): DCW's device counter
//! (`IncU32`), DECODE_V2's and SPEC_FA2's attention over several lanes in one launch
//! (`AttentionRows`), TCOL_OPROJ's fold of every column in one launch (`FoldLanes`). Each lane's
//! values are exactly the single-lane kernel's; the shapes are checked here lane by lane.

use super::{
    attention_shape, attention_smem, cfg, elementwise_grid, i32_of, shape_err, ATTN_THREADS, ELEMENTWISE_THREADS,
};
use crate::backend::cuda::CudaBackend;
use crate::backend::op::{block, span};
use crate::backend::Op;
use crate::Result;

impl CudaBackend {
    pub(super) fn launch_pass_op(&self, rank: usize, op: &Op) -> Result<()> {
        match *op {
            Op::IncU32 { out, by } => {
                if out.len == 0 {
                    return Err(shape_err("inc_u32", "the position slice is empty; it must hold one u32".into()));
                }
                let p = self.slice_ptr(rank, out.sub(0, 1), "inc_u32")?;
                launch!(self, rank, "inc_u32", cfg(1, 32, 0), p, by)
            }
            Op::AttentionRows {
                rows,
                q,
                k,
                v,
                gate,
                pos,
                out,
                pitch: pt,
                max_len,
                q_heads,
                kv_heads,
                partition,
                walk_once,
            } => {
                let what = if walk_once { "attention_cols_walk_once" } else { "attention_rows" };
                if rows == 0 || pos.len == 0 {
                    return Err(shape_err(what, format!("{rows} rows and a position slice of {}", pos.len)));
                }
                if walk_once && (rows != 2 || pt.kv != 0) {
                    return Err(shape_err(
                        what,
                        format!(
                            "one walk serves 2 columns of one session's caches, not {rows} lanes at kv pitch {}",
                            pt.kv
                        ),
                    ));
                }
                for i in 0..rows {
                    let b = |s, p| block(s, p, i);
                    attention_shape(
                        what,
                        [b(q, pt.q), b(k, pt.kv), b(v, pt.kv), b(gate, pt.gate), b(out, pt.out)],
                        max_len,
                        q_heads,
                        kv_heads,
                    )?;
                }
                let smem = attention_smem(what, max_len, if walk_once { 2 } else { 1 })?;
                let ptr = |s, p| self.slice_ptr(rank, span(s, p, rows), what);
                let (qp, kp, vp, gp, pp, op_) = (
                    ptr(q, pt.q)?,
                    ptr(k, pt.kv)?,
                    ptr(v, pt.kv)?,
                    ptr(gate, pt.gate)?,
                    ptr(pos.sub(0, 1), pt.pos)?,
                    ptr(out, pt.out)?,
                );
                let int = |name, x| i32_of(what, name, x);
                let (qpi, gpi, ppi, opi) = (
                    int("q pitch", pt.q)?,
                    int("gate pitch", pt.gate)?,
                    int("pos pitch", pt.pos)?,
                    int("out pitch", pt.out)?,
                );
                let (maxi, qh, kvh, part) = (
                    int("max_len", max_len)?,
                    int("q_heads", q_heads)?,
                    int("kv_heads", kv_heads)?,
                    int("partition", partition)?,
                );
                if walk_once {
                    launch!(
                        self,
                        rank,
                        "decode_attention_cols2_f32",
                        cfg(q_heads, ATTN_THREADS, smem),
                        qp,
                        kp,
                        vp,
                        gp,
                        pp,
                        qpi,
                        gpi,
                        ppi,
                        opi,
                        maxi,
                        qh,
                        kvh,
                        part,
                        op_
                    )
                } else {
                    let (rows_i, kvpi) = (int("rows", rows)?, int("kv pitch", pt.kv)?);
                    launch!(
                        self,
                        rank,
                        "decode_attention_rows_f32",
                        cfg(rows * q_heads, ATTN_THREADS, smem),
                        qp,
                        kp,
                        vp,
                        gp,
                        pp,
                        rows_i,
                        qpi,
                        kvpi,
                        gpi,
                        ppi,
                        opi,
                        maxi,
                        qh,
                        kvh,
                        part,
                        op_
                    )
                }
            }
            Op::FoldLanes { lanes, parts, parts_pitch, n_parts, out, out_pitch } => {
                if Some(parts.len) != n_parts.checked_mul(out.len) || lanes == 0 {
                    return Err(shape_err(
                        "fold_lanes",
                        format!("{} values is not {n_parts} parts × {} (lanes {lanes})", parts.len, out.len),
                    ));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let pp = self.slice_ptr(rank, span(parts, parts_pitch, lanes), "fold_lanes")?;
                let outp = self.slice_ptr(rank, span(out, out_pitch, lanes), "fold_lanes")?;
                let int = |name, x| i32_of("fold_lanes", name, x);
                let (ppi, np, width, ln, opi) = (
                    int("parts pitch", parts_pitch)?,
                    int("n_parts", n_parts)?,
                    int("width", out.len)?,
                    int("lanes", lanes)?,
                    int("out pitch", out_pitch)?,
                );
                launch!(
                    self,
                    rank,
                    "fold_lanes_f32",
                    cfg(elementwise_grid(lanes * out.len), ELEMENTWISE_THREADS, 0),
                    pp,
                    ppi,
                    np,
                    width,
                    ln,
                    outp,
                    opi
                )
            }
            _ => Err(shape_err("launch_pass_op", "not a rows-and-columns op".into())),
        }
    }
}
