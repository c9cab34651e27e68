//! Block GEMV on the canonical grid (docs/DESIGN.md §3.4).
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

// `acc = acc + p` is written out on purpose, here and in `canon`: each line is one IEEE
// operation with its operand order, as the CUDA twin writes it.
#![allow(clippy::assign_op_pattern)]

use std::sync::OnceLock;

use crate::canon::{butterfly32, dot32, lanes_accumulate, LANES};
use crate::formats::{bf16_to_f32, e2m1_decode, e4m3_decode, ue4m3_decode, E4M3_BLOCK, NVFP4_GROUP};
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
    /// reads the right scale row: scale row = (row0 + r) / 128 − row0 / 128. (Such a shard holds
    /// the scale rows row0/128 ..= (row0 + out − 1)/128, which can be one more than
    /// ceil(out/128); the kernels check that many are present.)
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

impl<'a> MatrixView<'a> {
    /// Rows `rows` of this view as a view of their own (the storage of a contiguous row range;
    /// an E4M3 view keeps the scale rows covering it and its global first row). Every twin here
    /// computes a row from that row's storage alone, so the rows of a sub-view give the same bits
    /// as the same rows of the whole view — which lets a host run one GEMV on several threads.
    ///
    /// # Panics
    /// If `rows` is not inside `0..out_features`.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> MatrixView<'a> {
        assert!(
            rows.start <= rows.end && rows.end <= self.out_features,
            "MatrixView::rows: {rows:?} is not inside the view's {} rows",
            self.out_features
        );
        let cols = self.in_features;
        let w = match self.w {
            WeightRef::Bf16(b) => WeightRef::Bf16(&b[rows.start * cols..rows.end * cols]),
            WeightRef::F32(v) => WeightRef::F32(&v[rows.start * cols..rows.end * cols]),
            WeightRef::E4m3 { codes, scales, row0 } => {
                let scale_cols = cols / E4M3_BLOCK;
                let first = (row0 + rows.start) / E4M3_BLOCK - row0 / E4M3_BLOCK;
                WeightRef::E4m3 {
                    codes: &codes[rows.start * cols..rows.end * cols],
                    scales: &scales[(first * scale_cols).min(scales.len())..],
                    row0: row0 + rows.start,
                }
            }
            WeightRef::Nvfp4 { packed, scales } => WeightRef::Nvfp4 {
                packed: &packed[rows.start * cols / 2..rows.end * cols / 2],
                scales: &scales[rows.start * cols / NVFP4_GROUP..rows.end * cols / NVFP4_GROUP],
            },
        };
        MatrixView { w, out_features: rows.len(), in_features: cols, kblock_width: self.kblock_width }
    }
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
///
/// Errors (the message names the format, the width and the rule): a zero width; a BF16 width that
/// is not a multiple of 8; an E4M3 width that is not a multiple of 128; an NVFP4 width that is not
/// a multiple of 16. E4M3 and NVFP4 always have G ≥ 1 once the width is whole scale blocks, e.g.
/// E4M3 1024 → 8 (8 blocks), 1280 → 2 (10 blocks), 384 → 1 (3 blocks).
pub fn canonical_kblocks(format: WeightFormat, in_features: usize) -> Result<usize, KernelError> {
    let (name, block) = match format {
        WeightFormat::Bf16 => ("BF16", 1),
        WeightFormat::E4m3 => ("E4M3", E4M3_BLOCK),
        WeightFormat::Nvfp4 => ("NVFP4", NVFP4_GROUP),
    };
    let what = format!("{name} in_features");
    if in_features == 0 {
        return Err(KernelError::contract(
            what,
            0,
            "a matrix needs at least one input column to be cut into canonical K-blocks",
        ));
    }
    if format == WeightFormat::Bf16 {
        return if in_features.is_multiple_of(CANONICAL_G) {
            Ok(CANONICAL_G)
        } else {
            Err(KernelError::contract(
                what,
                in_features,
                format!(
                    "in_features {in_features} is not divisible into {CANONICAL_G} canonical K-blocks \
                     (a BF16 width must be a multiple of {CANONICAL_G})"
                ),
            ))
        };
    }
    if !in_features.is_multiple_of(block) {
        return Err(KernelError::contract(
            what,
            in_features,
            format!(
                "in_features {in_features} is not a whole number of {block}-column {name} scale blocks, so it cannot \
                 be cut into canonical K-blocks (the width must be a multiple of {block})"
            ),
        ));
    }
    let n_blocks = in_features / block;
    Ok([8, 4, 2, 1].into_iter().find(|&g| n_blocks.is_multiple_of(g)).unwrap_or(1))
}

/// The canonical grid size: G is at most 8, and exactly 8 for BF16.
const CANONICAL_G: usize = 8;

/// Decoding tables built once from the format codecs (`crate::formats`), so the hot loop does a
/// table load per weight. Every entry is exactly the codec's value: the tables change speed, not
/// bits.
struct Luts {
    /// `e4m3[code] = e4m3_decode(code)`.
    e4m3: [f32; 256],
    /// `ue4m3[code] = ue4m3_decode(code)`.
    ue4m3: [f32; 256],
    /// `e2m1[nibble] = e2m1_decode(nibble)`.
    e2m1: [f32; 16],
}

fn luts() -> &'static Luts {
    static LUTS: OnceLock<Luts> = OnceLock::new();
    LUTS.get_or_init(|| Luts {
        e4m3: std::array::from_fn(|c| e4m3_decode(c as u8)),
        ue4m3: std::array::from_fn(|c| ue4m3_decode(c as u8)),
        e2m1: std::array::from_fn(|c| e2m1_decode(c as u8)),
    })
}

/// Checks the view against its storage and `x`; returns the number of K-blocks of the view.
/// A violation is a caller bug (the runtime validates shapes when it loads a model), so it panics
/// with a message naming the value and the rule.
fn check_view(m: &MatrixView, x: &[f32], who: &str) -> usize {
    let (rows, cols, kw) = (m.out_features, m.in_features, m.kblock_width);
    assert_eq!(x.len(), cols, "{who}: x has {} elements but the view has in_features {cols}", x.len());
    assert!(kw > 0 || cols == 0, "{who}: kblock_width 0 with in_features {cols}");
    if cols == 0 {
        return 0;
    }
    assert_eq!(cols % kw, 0, "{who}: in_features {cols} is not a whole number of K-blocks of width {kw}");
    let n = rows * cols;
    match m.w {
        WeightRef::Bf16(b) => {
            assert_eq!(b.len(), n, "{who}: BF16 storage has {} values, view is {rows}×{cols}", b.len())
        }
        WeightRef::F32(v) => assert_eq!(v.len(), n, "{who}: F32 storage has {} values, view is {rows}×{cols}", v.len()),
        WeightRef::E4m3 { codes, scales, row0 } => {
            assert_eq!(codes.len(), n, "{who}: E4M3 storage has {} codes, view is {rows}×{cols}", codes.len());
            assert_eq!(kw % E4M3_BLOCK, 0, "{who}: E4M3 K-block width {kw} is not whole 128-column scale blocks");
            let scale_rows = if rows == 0 { 0 } else { (row0 + rows - 1) / E4M3_BLOCK - row0 / E4M3_BLOCK + 1 };
            let need = scale_rows * (cols / E4M3_BLOCK);
            assert!(
                scales.len() >= need,
                "{who}: E4M3 view rows {row0}..{} need {need} scales, storage has {}",
                row0 + rows,
                scales.len()
            );
        }
        WeightRef::Nvfp4 { packed, scales } => {
            assert_eq!(kw % NVFP4_GROUP, 0, "{who}: NVFP4 K-block width {kw} is not whole 16-value groups");
            assert_eq!(packed.len(), n / 2, "{who}: NVFP4 storage has {} bytes, view is {rows}×{cols}", packed.len());
            assert_eq!(
                scales.len(),
                n / NVFP4_GROUP,
                "{who}: NVFP4 has {} group scales, view is {rows}×{cols}",
                scales.len()
            );
        }
    }
    cols / kw
}

/// The partial of view row `r` over its K-block `k` (module doc). Shapes already checked.
#[inline]
fn partial(m: &MatrixView, luts: &Luts, r: usize, k: usize, x: &[f32]) -> f32 {
    let (cols, kw) = (m.in_features, m.kblock_width);
    let c0 = k * kw;
    let xk = &x[c0..c0 + kw];
    let row = r * cols + c0;
    match m.w {
        WeightRef::F32(v) => dot32(&v[row..row + kw], xk),
        WeightRef::Bf16(b) => {
            let mut acc = [0.0f32; LANES];
            lanes_accumulate(&mut acc, &b[row..row + kw], xk, bf16_to_f32);
            butterfly32(acc)
        }
        WeightRef::E4m3 { codes, scales, row0 } => {
            let scale_cols = cols / E4M3_BLOCK;
            let scale_row = &scales[((row0 + r) / E4M3_BLOCK - row0 / E4M3_BLOCK) * scale_cols..][..scale_cols];
            let mut acc = 0.0f32;
            for (j, (cb, xb)) in
                codes[row..row + kw].chunks_exact(E4M3_BLOCK).zip(xk.chunks_exact(E4M3_BLOCK)).enumerate()
            {
                // dot32 of the decoded block, decoded 32 codes at a time into registers (the
                // same lanes and order as dot32 on a decoded [f32; 128]; measured ~1.7x faster than
                // a [f32; 128] buffer or a table lookup inside the lane loop).
                let mut lanes = [0.0f32; LANES];
                for (c32, x32) in cb.chunks_exact(LANES).zip(xb.chunks_exact(LANES)) {
                    let w32: [f32; LANES] = std::array::from_fn(|l| luts.e4m3[c32[l] as usize]);
                    lanes_accumulate(&mut lanes, &w32, x32, |v| v);
                }
                acc = acc + scale_row[c0 / E4M3_BLOCK + j] * butterfly32(lanes);
            }
            acc
        }
        WeightRef::Nvfp4 { packed, scales } => {
            // Decode 128 values at a time (a multiple of 32, so every element keeps its dot32
            // lane) and keep one set of lane accumulators across the whole K-block.
            let mut acc = [0.0f32; LANES];
            let mut buf = [0.0f32; 128];
            let mut c = 0;
            while c < kw {
                let len = (kw - c).min(buf.len());
                for (g, dg) in buf[..len].chunks_exact_mut(NVFP4_GROUP).enumerate() {
                    let e0 = row + c + g * NVFP4_GROUP;
                    let s = luts.ue4m3[scales[e0 / NVFP4_GROUP] as usize];
                    let bytes = &packed[e0 / 2..e0 / 2 + NVFP4_GROUP / 2];
                    for (pair, &byte) in dg.chunks_exact_mut(2).zip(bytes) {
                        pair[0] = luts.e2m1[(byte & 0xF) as usize] * s;
                        pair[1] = luts.e2m1[(byte >> 4) as usize] * s;
                    }
                }
                lanes_accumulate(&mut acc, &buf[..len], &xk[c..c + len], |v| v);
                c += len;
            }
            butterfly32(acc)
        }
    }
}

/// The value row `r`, column `c` of the view contributes to its in-block dot product: BF16
/// widened, F32 as is, E4M3 `decode(code)` (its block scale multiplies the block's dot, so it is
/// left out), NVFP4 `e2m1 · ue4m3`. Every product of a dot is `weight_value(r, c) * x[c]`, so a
/// caller can see which dots consist of −0.0 products only (the signed-zero path: the +0.0 start
/// of every canonical sum decides the sign of such a dot, docs/DESIGN.md §3.4).
///
/// Panics on an index outside the view.
pub fn weight_value(m: &MatrixView, r: usize, c: usize) -> f32 {
    assert!(r < m.out_features && c < m.in_features, "weight_value: ({r}, {c}) outside the view");
    let e = r * m.in_features + c;
    let luts = luts();
    match m.w {
        WeightRef::F32(v) => v[e],
        WeightRef::Bf16(b) => bf16_to_f32(b[e]),
        WeightRef::E4m3 { codes, .. } => luts.e4m3[codes[e] as usize],
        WeightRef::Nvfp4 { packed, scales } => {
            let nib = (packed[e / 2] >> ((e & 1) * 4)) & 0xF;
            luts.e2m1[nib as usize] * luts.ue4m3[scales[e / NVFP4_GROUP] as usize]
        }
    }
}

/// Partials of every row of the view over each of its K-blocks: `out[k * rows + r]` for
/// k in 0..in/kblock_width, `x.len() == view.in_features`.
///
/// Shapes are checked (storage length, K-block width a multiple of the scale block, E4M3 scales
/// covering the view's rows from `row0`, `out.len() == rows · K-blocks`); a violation panics.
pub fn gemv_partials(m: &MatrixView, x: &[f32], out: &mut [f32]) {
    let nk = check_view(m, x, "gemv_partials");
    let rows = m.out_features;
    assert_eq!(
        out.len(),
        nk * rows,
        "gemv_partials: out has {} values, expected {nk} K-blocks × {rows} rows",
        out.len()
    );
    let luts = luts();
    for r in 0..rows {
        for k in 0..nk {
            out[k * rows + r] = partial(m, luts, r, k, x);
        }
    }
}

/// Whole rows: `out[r]` = canonical fold of the row's K-block partials (`x.len() == in`).
///
/// Bit for bit `fold_partials(gemv_partials(m, x), G, rows, false)`; a view with no columns gives
/// +0.0 rows. Shapes are checked as in [`gemv_partials`], and `out.len() == rows`.
pub fn gemv_rows(m: &MatrixView, x: &[f32], out: &mut [f32]) {
    let nk = check_view(m, x, "gemv_rows");
    assert_eq!(
        out.len(),
        m.out_features,
        "gemv_rows: out has {} values, the view has {} rows",
        out.len(),
        m.out_features
    );
    let luts = luts();
    for (r, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for k in 0..nk {
            acc = acc + partial(m, luts, r, k, x);
        }
        *o = acc;
    }
}

/// NUMERIC-CLASS arithmetic of the QKV_FUSED door: each row's whole dot product as one balanced
/// pairwise tree, ignoring the canonical K-blocks and lanes. It is a different summation order,
/// so its bits generally differ from [`gemv_rows`] (by a few ULP relative to Σ|w·x|); that is the
/// point of the class, and its gate compares against the canonical program within a bound.
///
/// Per row: products `p[c] = v(r, c) * x[c]` for every column, where `v` is the stored value —
/// BF16 widened, F32 as is, E4M3 `scale * decode(code)` (one rounded product, the scale of the
/// element's 128×128 block), NVFP4 `e2m1 · ue4m3` (exact; per-matrix scale NOT applied). The
/// products are padded with +0.0 to the next power of two P (P = 1 for an empty row), then
/// reduced level by level, adjacent pairs: `p[i] = p[2i] + p[2i+1]` for i < len/2, until one
/// value is left. Shapes are checked as in [`gemv_rows`].
pub fn gemv_rows_tree(m: &MatrixView, x: &[f32], out: &mut [f32]) {
    check_view(m, x, "gemv_rows_tree");
    let (rows, cols) = (m.out_features, m.in_features);
    assert_eq!(out.len(), rows, "gemv_rows_tree: out has {} values, the view has {rows} rows", out.len());
    let luts = luts();
    let width = cols.next_power_of_two();
    let mut p = vec![0.0f32; width];
    // Ping-pong buffer: each level writes the other buffer, so the pair sums need no bounds
    // checks and vectorise (same operations as the in-place `p[i] = p[2i] + p[2i+1]`).
    let mut q = vec![0.0f32; width / 2];
    for (r, o) in out.iter_mut().enumerate() {
        let row = r * cols;
        match m.w {
            WeightRef::F32(v) => {
                for ((pi, &w), &xi) in p.iter_mut().zip(&v[row..row + cols]).zip(x) {
                    *pi = w * xi;
                }
            }
            WeightRef::Bf16(b) => {
                for ((pi, &w), &xi) in p.iter_mut().zip(&b[row..row + cols]).zip(x) {
                    *pi = bf16_to_f32(w) * xi;
                }
            }
            WeightRef::E4m3 { codes, scales, row0 } => {
                let scale_cols = cols / E4M3_BLOCK;
                let scale_row = &scales[((row0 + r) / E4M3_BLOCK - row0 / E4M3_BLOCK) * scale_cols..][..scale_cols];
                for (c, (pi, &code)) in p.iter_mut().zip(&codes[row..row + cols]).enumerate() {
                    *pi = (scale_row[c / E4M3_BLOCK] * luts.e4m3[code as usize]) * x[c];
                }
            }
            WeightRef::Nvfp4 { packed, scales } => {
                for (c, pi) in p[..cols].iter_mut().enumerate() {
                    let e = row + c;
                    let nib = (packed[e / 2] >> ((e & 1) * 4)) & 0xF;
                    *pi = (luts.e2m1[nib as usize] * luts.ue4m3[scales[e / NVFP4_GROUP] as usize]) * x[c];
                }
            }
        }
        p[cols..].fill(0.0);
        *o = pairwise_tree(&mut p, &mut q);
    }
}

/// Balanced pairwise sum of `p` (length a power of two), adjacent pairs level by level:
/// `next[i] = cur[2i] + cur[2i+1]`. `scratch` holds at least `p.len() / 2` values.
fn pairwise_tree(p: &mut [f32], scratch: &mut [f32]) -> f32 {
    let mut len = p.len();
    let (mut src, mut dst) = (p, scratch);
    while len > 1 {
        len /= 2;
        for (d, pair) in dst[..len].iter_mut().zip(src[..2 * len].chunks_exact(2)) {
            *d = pair[0] + pair[1];
        }
        std::mem::swap(&mut src, &mut dst);
    }
    src[0]
}

/// Canonical fold of `n_parts` partial vectors laid out `[part][width]`:
/// `out[i] = ((+0 + p[0][i]) + p[1][i]) + …`; `reverse` is the CANARY order (P(G−1) first).
///
/// The explicit +0.0 start makes the fold of a lone −0.0 equal +0.0. `parts.len()` must be
/// `n_parts · width` and `out.len()` must be `width` (checked; a violation panics).
pub fn fold_partials(parts: &[f32], n_parts: usize, width: usize, reverse: bool, out: &mut [f32]) {
    assert_eq!(parts.len(), n_parts * width, "fold_partials: {} values is not {n_parts} parts × {width}", parts.len());
    assert_eq!(out.len(), width, "fold_partials: out has {} values, expected width {width}", out.len());
    out.fill(0.0);
    if width == 0 {
        return;
    }
    let mut fold = |part: &[f32]| {
        for (o, &p) in out.iter_mut().zip(part) {
            *o = *o + p;
        }
    };
    if reverse {
        parts.chunks_exact(width).rev().for_each(&mut fold);
    } else {
        parts.chunks_exact(width).for_each(&mut fold);
    }
}
