//! The GEMV launches: canonical rows, K-block partials and the tree order (QKV_FUSED) of one
//! weight, in every storage format, and the batched row GEMV of several weights over one `x`
//! (`kernels/cuda/gemv.cu`).

use super::{capacity_err, cfg, i32_of, shape_err, GEMV_MAX_TASKS, GEMV_THREADS, TREE_THREADS};
use crate::backend::cuda::layout::{BPL_SV, E4M3_BPL};
use crate::backend::cuda::memory::WeightKind;
use crate::backend::cuda::safe::{self, DevicePtr};
use crate::backend::cuda::CudaBackend;
use crate::backend::Slice;
use crate::Result;

/// Blocks a GEMV grid should have at least: two per SM of an H200 (132 SMs).
const GEMV_MIN_BLOCKS: usize = 264;

/// Rows per block of a GEMV with `nk` K-blocks: about 32 (row, K-block) tasks for 8 warps,
/// within the fold slots — fewer when the matrix has too few rows to give every SM two blocks
/// (the router's 288 rows, k/v's 1024). A launch choice, never part of the arithmetic.
pub(crate) fn gemv_rows_per_block(rows: usize, nk: usize) -> usize {
    let base = (32 / nk).clamp(1, GEMV_MAX_TASKS / nk);
    base.min((rows / GEMV_MIN_BLOCKS).max(1))
}

/// Rows per block of a block-per-lane E4M3 launch over `matrices` matrices of `nb` scale blocks
/// per row: as many as the block's scaled-dot slots hold (`BPL_SV`), at most 64 — and, when `rows`
/// is given, few enough to leave every SM two blocks (`GEMV_MIN_BLOCKS`). A launch choice only.
pub(crate) fn bpl_rows_per_block(nb: usize, matrices: usize, rows: Option<usize>) -> usize {
    let fit = (BPL_SV / (nb.max(1) * matrices.max(1))).clamp(1, 64);
    rows.map_or(fit, |rows| fit.min((rows / GEMV_MIN_BLOCKS).max(1)))
}

/// The row-fold slots a GEMV block holds bound its K-blocks (`GEMV_MAX_TASKS`).
pub(super) fn check_kblocks(op: &str, nk: usize) -> Result<()> {
    if nk > GEMV_MAX_TASKS {
        return Err(capacity_err(
            op,
            "K-blocks",
            nk,
            GEMV_MAX_TASKS,
            format!("{nk} K-blocks exceed the kernel's {GEMV_MAX_TASKS}"),
        ));
    }
    Ok(())
}

/// `gemv_rows_batch_*`'s parameter block (`struct GemvBatch` in gemv.cu: 104 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct GemvBatch {
    w: [u64; 4],
    out: [u64; 4],
    rows: [i32; 4],
    block_start: [i32; 5],
    count: i32,
}

impl GemvBatch {
    /// A block of `count` weights, every field zero until [`GemvBatch::set`] fills it.
    pub(super) fn empty(count: usize) -> GemvBatch {
        GemvBatch { w: [0; 4], out: [0; 4], rows: [0; 4], block_start: [0; 5], count: count as i32 }
    }

    /// Weight `i`: its data, its output, its rows and the first grid block it owns.
    pub(super) fn set(&mut self, i: usize, w: u64, out: u64, rows: usize, first_block: usize) -> Result<()> {
        let op = "gemv_rows_batch";
        (self.w[i], self.out[i]) = (w, out);
        self.rows[i] = i32_of(op, "rows", rows)?;
        self.block_start[i] = i32_of(op, "blocks", first_block)?;
        Ok(())
    }

    /// The grid ends at `blocks`: every start after the `count` weights is `blocks`.
    pub(super) fn close(&mut self, count: usize, blocks: usize) -> Result<()> {
        for i in count..5 {
            self.block_start[i] = i32_of("gemv_rows_batch", "blocks", blocks)?;
        }
        Ok(())
    }
}

// Passed to the kernel by value: its `DeviceRepr` impl is with the other kernel-argument packing
// in `launch/mod.rs`.

impl CudaBackend {
    fn weight_shape(&self, rank: usize, w: u32, op: &str) -> Result<(WeightKind, usize, usize, usize, usize)> {
        let ws = &self.ranks[rank].weights;
        let wt =
            ws.get(w as usize).ok_or_else(|| shape_err(op, format!("weight {w} does not exist on rank {rank}")))?;
        Ok((wt.kind, wt.rows, wt.cols, wt.kblock_width, wt.vec))
    }

    /// Zero `len` f32 at `ptr` on the rank's stream.
    fn zero(&self, rank: usize, ptr: DevicePtr, len: usize, what: &str) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let r = &self.ranks[rank];
        r.stream.context().bind_to_thread().map_err(|e| self.fault(rank, what, e))?;
        safe::memset_d8(&r.stream, ptr, 0, len * 4).map_err(|e| self.fault(rank, what, e))
    }

    /// `out` is a slice of `out_rank` (`rank` itself, or the root of a peer store).
    pub(super) fn gemv(
        &self,
        rank: usize,
        w: u32,
        x: Slice,
        out: Slice,
        out_rank: usize,
        mode: GemvMode,
    ) -> Result<()> {
        let op = mode.name();
        let (kind, rows, cols, kw, vec) = self.weight_shape(rank, w, op)?;
        let xp = self.slice_ptr(rank, x, op)?;
        let op_ptr = self.slice_ptr(out_rank, out, op)?;
        if x.len != cols {
            return Err(shape_err(op, format!("x has {} elements but the weight has in_features {cols}", x.len)));
        }
        let nk = if cols == 0 { 0 } else { cols / kw };
        let want_out = if mode == GemvMode::Partials { nk * rows } else { rows };
        if out.len != want_out {
            return Err(shape_err(
                op,
                format!("out has {} values, expected {want_out} ({rows} rows, {nk} K-blocks)", out.len),
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        if cols == 0 {
            // Rows of an empty view are +0.0 (the canonical fold of no partials).
            return self.zero(rank, self.slice_region(out_rank, out, op)?, out.len, op);
        }
        let wt = &self.ranks[rank].weights[w as usize];
        let wp = wt.data.ptr();
        let sp = wt.scales.as_ref().map(|s| s.ptr()).unwrap_or(0);
        let (rows_i, cols_i, kw_i, vec_i) = (rows as i32, cols as i32, kw as i32, vec as i32);
        // W8 has one order (the host runs w8_rows for either RowOrder).
        let mode = if kind == WeightKind::W8 && mode == GemvMode::Tree { GemvMode::Rows } else { mode };
        if mode == GemvMode::Tree {
            let name = match kind {
                WeightKind::Bf16 => "gemv_rows_tree_bf16",
                WeightKind::F32 => "gemv_rows_tree_f32",
                _ => {
                    return Err(shape_err(
                        op,
                        format!(
                            "the tree order (QKV_FUSED) is defined for BF16 and F32 weights, not {}",
                            kind.suffix()
                        ),
                    ))
                }
            };
            return launch!(self, rank, name, cfg(rows, TREE_THREADS, 0), wp, xp, op_ptr, rows_i, cols_i, kw_i, vec_i);
        }
        check_kblocks(op, nk)?;
        let rpb = if kind == WeightKind::E4m3 && vec == E4M3_BPL {
            bpl_rows_per_block(cols / 128, 1, Some(rows))
        } else {
            gemv_rows_per_block(rows, nk)
        };
        let grid = rows.div_ceil(rpb);
        let rpb_i = rpb as i32;
        let c = cfg(grid, GEMV_THREADS, 0);
        let partials = mode == GemvMode::Partials;
        match kind {
            WeightKind::Bf16 => {
                let name = if partials { "gemv_partials_bf16" } else { "gemv_rows_bf16" };
                launch!(self, rank, name, c, wp, xp, op_ptr, rows_i, cols_i, kw_i, rpb_i, vec_i)
            }
            WeightKind::F32 => {
                let name = if partials { "gemv_partials_f32" } else { "gemv_rows_f32" };
                launch!(self, rank, name, c, wp, xp, op_ptr, rows_i, cols_i, kw_i, rpb_i, vec_i)
            }
            WeightKind::E4m3 => {
                let name = if partials { "gemv_partials_e4m3" } else { "gemv_rows_e4m3" };
                let row0 = i32_of(op, "row0", wt.row0)?;
                launch!(self, rank, name, c, wp, sp, row0, xp, op_ptr, rows_i, cols_i, kw_i, rpb_i, vec_i)
            }
            WeightKind::Nvfp4 => {
                let name = if partials { "gemv_partials_nvfp4" } else { "gemv_rows_nvfp4" };
                launch!(self, rank, name, c, wp, sp, xp, op_ptr, rows_i, cols_i, kw_i, rpb_i)
            }
            WeightKind::W8 => {
                let name = if partials { "gemv_partials_w8" } else { "gemv_rows_w8" };
                launch!(self, rank, name, c, wp, sp, xp, op_ptr, rows_i, cols_i, kw_i, rpb_i)
            }
        }
    }

    /// Several canonical row GEMVs over one `x`: one launch when every weight is BF16 (or every
    /// one F32) with the same columns, K-block width and layout; else one launch each (the same
    /// arithmetic either way).
    pub(super) fn gemv_batch(&self, rank: usize, items: &[(u32, Slice)], x: Slice) -> Result<()> {
        let op = "gemv_rows_batch";
        let shapes = items.iter().map(|(w, _)| self.weight_shape(rank, *w, op)).collect::<Result<Vec<_>>>()?;
        let first = shapes.first().copied();
        let uniform = first.is_some_and(|(kind, _, cols, kw, vec)| {
            matches!(kind, WeightKind::Bf16 | WeightKind::F32)
                && cols > 0
                && shapes.iter().all(|s| (s.0, s.2, s.3, s.4) == (kind, cols, kw, vec) && s.1 > 0)
        });
        if !uniform || items.len() > 4 {
            for (w, out) in items {
                self.gemv(rank, *w, x, *out, rank, GemvMode::Rows)?;
            }
            return Ok(());
        }
        let (kind, _, cols, kw, vec) = first.expect("checked non-empty");
        let xp = self.slice_ptr(rank, x, op)?;
        if x.len != cols {
            return Err(shape_err(op, format!("x has {} elements but the weights have in_features {cols}", x.len)));
        }
        let nk = cols / kw;
        check_kblocks(op, nk)?;
        let total_rows: usize = shapes.iter().map(|s| s.1).sum();
        let rpb = gemv_rows_per_block(total_rows, nk);
        let mut b = GemvBatch::empty(items.len());
        let mut blocks = 0usize;
        for (i, ((w, out), s)) in items.iter().zip(&shapes).enumerate() {
            if out.len != s.1 {
                return Err(shape_err(op, format!("item {i}: out has {} values, the weight {} rows", out.len, s.1)));
            }
            let wp = self.ranks[rank].weights[*w as usize].data.ptr();
            b.set(i, wp, self.slice_ptr(rank, *out, op)?, s.1, blocks)?;
            blocks += s.1.div_ceil(rpb);
        }
        b.close(items.len(), blocks)?;
        let name = if kind == WeightKind::Bf16 { "gemv_rows_batch_bf16" } else { "gemv_rows_batch_f32" };
        let (cols_i, kw_i, rpb_i, vec_i) = (cols as i32, kw as i32, rpb as i32, vec as i32);
        launch!(self, rank, name, cfg(blocks, GEMV_THREADS, 0), b, xp, cols_i, kw_i, rpb_i, vec_i)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GemvMode {
    Rows,
    Partials,
    Tree,
}

impl GemvMode {
    fn name(self) -> &'static str {
        match self {
            GemvMode::Rows => "gemv_rows",
            GemvMode::Partials => "gemv_partials",
            GemvMode::Tree => "gemv_rows_tree",
        }
    }
}
