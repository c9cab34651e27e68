//! Block GEMV on the canonical grid (DESIGN.md §3.4).
//!
//! A matrix `[out][in]` has G canonical K-blocks of width `in / G`. The partial of row r over
//! K-block k is:
//! - BF16 / F32: `dot32(w[r][k-block], x[k-block])`;
//! - E4M3: fold over the 128-column scale blocks b of the K-block in column order, from +0.0:
//!   `acc = acc + scale[r/128][b] * dot32(decode(codes[r][b-block]), x[b-block])`;
//! - NVFP4 (per-matrix scale NOT applied): `dot32(e2m1 · ue4m3 values, x)` over the K-block.
//!
//! The value of a row is the canonical fold of its G partials `((+0 + P0) + P1) + … + P(G−1)`,
//! so a row computed whole (column-parallel) equals the fold of its row-parallel partials.

use crate::KernelError;

/// Storage of one matrix (or one shard of it: a contiguous range of rows, or a contiguous range
/// of whole K-blocks repacked row-major over the local columns).
#[derive(Debug, Clone, Copy)]
pub enum WeightRef<'a> {
    /// BF16 bits, row-major.
    Bf16(&'a [u16]),
    /// f32 values, row-major (the F32 mirror of a BF16 matrix).
    F32(&'a [f32]),
    /// E4M3 codes row-major + f32 scales `[ceil(out/128)][ceil(in/128)]` of THIS view. `row0` is
    /// the global index of the view's first row, so a row shard starting mid scale-block still
    /// reads the right scale row: scale row = (row0 + r) / 128 − row0 / 128.
    E4m3 { codes: &'a [u8], scales: &'a [f32], row0: usize },
    /// NVFP4 packed codes + ue4m3 group scales of this view (per-matrix scale applied by caller).
    Nvfp4 { packed: &'a [u8], scales: &'a [u8] },
}

/// A view of a matrix as a kernel sees it.
#[derive(Debug, Clone, Copy)]
pub struct MatrixView<'a> {
    pub w: WeightRef<'a>,
    pub out_features: usize,
    /// Columns of this view (a multiple of `kblock_width`).
    pub in_features: usize,
    /// Width of one canonical K-block (a property of the full matrix).
    pub kblock_width: usize,
}

/// Weight storage classes, for deciding the canonical grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    Bf16,
    E4m3,
    Nvfp4,
}

/// G for a matrix of `in_features` columns: the largest of 8, 4, 2, 1 that cuts the input into G
/// groups of whole scale blocks (128 columns for E4M3, 16 for NVFP4; for BF16 G = 8 whenever the
/// width divides by 8, else an error).
pub fn canonical_kblocks(format: WeightFormat, in_features: usize) -> Result<usize, KernelError> {
    todo!("helper B: {format:?} {in_features}")
}

/// Partials of every row of the view over each of its K-blocks: `out[k * rows + r]` for
/// k in 0..in/kblock_width, `x.len() == view.in_features`.
pub fn gemv_partials(m: &MatrixView, x: &[f32], out: &mut [f32]) {
    todo!("helper B: {} {} {}", m.out_features, x.len(), out.len())
}

/// Whole rows: `out[r]` = canonical fold of the row's K-block partials (`x.len() == in`).
pub fn gemv_rows(m: &MatrixView, x: &[f32], out: &mut [f32]) {
    todo!("helper B: {} {} {}", m.out_features, x.len(), out.len())
}

/// Canonical fold of `n_parts` partial vectors laid out `[part][width]`:
/// `out[i] = ((+0 + p[0][i]) + p[1][i]) + …`; `reverse` is the CANARY order (P(G−1) first).
pub fn fold_partials(parts: &[f32], n_parts: usize, width: usize, reverse: bool, out: &mut [f32]) {
    todo!("helper B: {} {n_parts} {width} {reverse} {}", parts.len(), out.len())
}
