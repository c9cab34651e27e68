//! The GEMV twins (`memra_kernels::twins::gemv`) of E4M3, NVFP4, BF16 and F32 storage, the W8
//! twin (`memra_kernels::twins::w8`), and QKV_FUSED's tree rows of BF16 and F32 storage, with AVX-512 for the host backend: the same
//! operations in the same order, so the same bits, faster.
//!
//! Why: the twins are most of a host run's time, and they decode one weight at a time
//! (docs/gpu/2026-12-03-performance-history.md, issue 13). Here 16 weights are decoded at once
//! ([`avx512`](self::avx512) says how for each format).
//!
//! The canonical arithmetic is the twin's, operation by operation: each of the 32 lanes accumulates
//! `acc = acc + w * x` (product rounded, then sum rounded; never fused) from +0.0, over each
//! 128-code block for E4M3 and over the whole K-block for NVFP4, BF16 and F32; lanes 0–15 live in
//! one register and 16–31 in another, so the butterfly's first level (`v[l] + v[l + 16]`) is one
//! add of the two, and every later level adds the upper half of what is left to the lower, with
//! the twin's operand order. E4M3 block scales, the K-block partial and the row's fold are scalar,
//! as in the twin. The tree rows compute the twin's products 16 at a time and each level of its
//! pairwise sum 16 pairs at a time (`even + odd`, the twin's operand order). W8's group sums are
//! exact integers, so their vector order is free; its scale products and folds are the twin's.
//!
//! Views the fast path does not take (a K-block that is not whole lane rounds or 128-code blocks,
//! a tree over E4M3 or NVFP4 storage or over a width that is not whole 16-value vectors, shapes that
//! do not match) go to the twin, which checks and panics.
//!
//! Used only where the CPU has AVX-512F and BW (detected once at run time); elsewhere the twin
//! runs.
//! `tests` compares both on every code, signed zeros, subnormal, infinite and NaN inputs (NaN
//! payloads aside, which are not canonical: docs/DESIGN.md §3.4).

// `acc = acc + p` is written out on purpose, as in the twin: each line is one IEEE operation with
// its operand order.
#![allow(clippy::assign_op_pattern)]

use memra_kernels::formats::{E4M3_BLOCK, NVFP4_GROUP};
use memra_kernels::twins::gemv::{self, MatrixView, WeightRef};
use memra_kernels::twins::w8::{self, W8View, W8_GROUP};

/// Whether the fast path runs on this CPU (AVX-512F and BW, and AVX2 which every AVX-512F CPU
/// has; detected once).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx2")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The stored weights of a view the fast path takes.
#[derive(Clone, Copy)]
enum Stored<'a> {
    /// E4M3 codes, their scales and the view's first global row (K-blocks of whole 128-code blocks).
    E4m3(&'a [u8], &'a [f32], usize),
    /// NVFP4 packed codes (two per byte, low nibble first) and ue4m3 group scales (K-blocks of
    /// whole 32-value lane rounds).
    Nvfp4(&'a [u8], &'a [u8]),
    /// BF16 bits (K-blocks of whole 32-value lane rounds).
    Bf16(&'a [u16]),
    /// F32 values (K-blocks of whole 32-value lane rounds).
    F32(&'a [f32]),
}

/// The view's weights if the fast path takes it: shapes that match and K-blocks the vector loop
/// covers whole. Anything else is the twin's (which checks it and panics where it is wrong).
fn stored<'a>(m: &MatrixView<'a>, x: &[f32]) -> Option<Stored<'a>> {
    let (rows, cols, kw) = (m.out_features, m.in_features, m.kblock_width);
    if !available() || rows == 0 || kw == 0 || cols % kw != 0 || x.len() != cols || kw % 32 != 0 {
        return None;
    }
    let n = rows * cols;
    match m.w {
        WeightRef::E4m3 { codes, scales, row0 } if kw % E4M3_BLOCK == 0 && codes.len() == n => {
            let scale_rows = (row0 + rows - 1) / E4M3_BLOCK - row0 / E4M3_BLOCK + 1;
            (scales.len() >= scale_rows * (cols / E4M3_BLOCK)).then_some(Stored::E4m3(codes, scales, row0))
        }
        WeightRef::Nvfp4 { packed, scales } if packed.len() == n / 2 && scales.len() == n / NVFP4_GROUP => {
            Some(Stored::Nvfp4(packed, scales))
        }
        WeightRef::Bf16(bits) if bits.len() == n => Some(Stored::Bf16(bits)),
        WeightRef::F32(values) if values.len() == n => Some(Stored::F32(values)),
        _ => None,
    }
}

/// The view's weights if the tree's fast path takes it: BF16 or F32 storage of the view's shape,
/// a width of whole 16-value vectors and an `x` of that width.
fn tree_stored<'a>(m: &MatrixView<'a>, x: &[f32]) -> Option<Stored<'a>> {
    let (rows, cols) = (m.out_features, m.in_features);
    if !available() || rows == 0 || cols == 0 || cols % 16 != 0 || x.len() != cols {
        return None;
    }
    match m.w {
        WeightRef::Bf16(bits) if bits.len() == rows * cols => Some(Stored::Bf16(bits)),
        WeightRef::F32(values) if values.len() == rows * cols => Some(Stored::F32(values)),
        _ => None,
    }
}

/// `gemv::gemv_rows`, bit for bit.
pub(crate) fn gemv_rows(m: &MatrixView, x: &[f32], out: &mut [f32]) {
    match stored(m, x) {
        Some(w) if out.len() == m.out_features => {
            fold_rows(&row_partials(m, w, x), m.in_features / m.kblock_width, out)
        }
        _ => gemv::gemv_rows(m, x, out),
    }
}

/// `gemv::gemv_partials`, bit for bit.
pub(crate) fn gemv_partials(m: &MatrixView, x: &[f32], out: &mut [f32]) {
    let (rows, nk) = (m.out_features, m.in_features / m.kblock_width.max(1));
    match stored(m, x) {
        Some(w) if out.len() == rows * nk => scatter_partials(&row_partials(m, w, x), nk, out),
        _ => gemv::gemv_partials(m, x, out),
    }
}

/// Whether the W8 fast path takes `m` with `x`: storage of the view's shape, K-blocks of whole
/// 32-value groups, an `x` of the view's width.
fn w8_fits(m: &W8View, x: &[f32]) -> bool {
    let (rows, cols, kw) = (m.out_features, m.in_features, m.kblock_width);
    available()
        && rows > 0
        && kw > 0
        && kw % W8_GROUP == 0
        && cols % kw == 0
        && x.len() == cols
        && m.q.len() == rows * cols
        && m.scales.len() == rows * cols / W8_GROUP
}

/// The K-block partials of every row of a W8 view, row-major (`[r · nk + k]`); `w8_fits` holds.
fn w8_row_partials(m: &W8View, x: &[f32]) -> Vec<f32> {
    let (xq, xs) = w8::w8_quantize(x, m.in_features);
    let mut out = vec![0.0f32; m.out_features * (m.in_features / m.kblock_width)];
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F present and the shapes checked by `w8_fits` (the caller's); `xq` and `xs`
    // are the quantized `x`, cols values and cols / 32 scales.
    unsafe {
        avx512::partials_w8(m.q, m.scales, (&xq, &xs), (m.in_features, m.kblock_width), &mut out)
    };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("the AVX-512 path is never taken off x86-64 (available() is false): {xq:?} {xs:?}");
    out
}

/// `w8::w8_rows`, bit for bit.
pub(crate) fn w8_rows(m: &W8View, x: &[f32], out: &mut [f32]) {
    if w8_fits(m, x) && out.len() == m.out_features {
        fold_rows(&w8_row_partials(m, x), m.in_features / m.kblock_width, out)
    } else {
        w8::w8_rows(m, x, out)
    }
}

/// `w8::w8_partials`, bit for bit.
pub(crate) fn w8_partials(m: &W8View, x: &[f32], out: &mut [f32]) {
    let nk = m.in_features / m.kblock_width.max(1);
    if w8_fits(m, x) && out.len() == m.out_features * nk {
        scatter_partials(&w8_row_partials(m, x), nk, out)
    } else {
        w8::w8_partials(m, x, out)
    }
}

/// Each row's canonical fold of its K-block partials (row-major, `nk` per row) from +0.0.
fn fold_rows(partials: &[f32], nk: usize, out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(partials.chunks_exact(nk)) {
        let mut acc = 0.0f32;
        for &p in row {
            acc = acc + p;
        }
        *o = acc;
    }
}

/// Row-major partials (`[r · nk + k]`) placed as the twins lay them out, `out[k · rows + r]`.
fn scatter_partials(partials: &[f32], nk: usize, out: &mut [f32]) {
    let rows = partials.len() / nk;
    for (r, row) in partials.chunks_exact(nk).enumerate() {
        for (k, &p) in row.iter().enumerate() {
            out[k * rows + r] = p;
        }
    }
}

/// `gemv::gemv_rows_tree` (QKV_FUSED's order), bit for bit.
pub(crate) fn gemv_rows_tree(m: &MatrixView, x: &[f32], out: &mut [f32]) {
    match tree_stored(m, x) {
        #[cfg(target_arch = "x86_64")]
        Some(w) if out.len() == m.out_features => {
            let cols = m.in_features;
            match w {
                // SAFETY: AVX-512F present; `tree_stored` checked the storage is rows × cols,
                // cols a multiple of 16, `x` cols long; `out` has one value per row.
                Stored::Bf16(bits) => unsafe { avx512::tree_rows_bf16(bits, cols, x, out) },
                // SAFETY: as for BF16 (above), with F32 storage.
                Stored::F32(values) => unsafe { avx512::tree_rows_f32(values, cols, x, out) },
                Stored::E4m3(..) | Stored::Nvfp4(..) => unreachable!("tree_stored takes BF16 and F32 only"),
            }
        }
        _ => gemv::gemv_rows_tree(m, x, out),
    }
}

/// The K-block partials of every row, row-major (`[r · nk + k]`).
fn row_partials(m: &MatrixView, w: Stored, x: &[f32]) -> Vec<f32> {
    let (rows, cols, kw) = (m.out_features, m.in_features, m.kblock_width);
    let mut out = vec![0.0f32; rows * (cols / kw)];
    #[cfg(target_arch = "x86_64")]
    {
        // `stored` returned `w` only if AVX-512F, BW and AVX2 are on this CPU (`available()`), and it checked
        // what the functions read: the storage is rows × cols, `x` is cols long, K-blocks are
        // whole 32-value lane rounds (whole 128-code blocks for E4M3), E4M3 scales cover every
        // scale row from `row0`, NVFP4 has cols / 2 bytes and cols / 16 group scales per row;
        // `out` is rows × K-blocks.
        match w {
            // SAFETY: AVX-512F, BW and AVX2 present and the E4M3 shapes checked by `stored` (above).
            Stored::E4m3(codes, scales, row0) => unsafe {
                avx512::partials_e4m3(tables::e4m3(), codes, scales, row0, (cols, kw), x, &mut out)
            },
            // SAFETY: AVX-512F present and the NVFP4 shapes checked by `stored` (above).
            Stored::Nvfp4(packed, scales) => unsafe {
                avx512::partials_nvfp4(tables::nvfp4(), packed, scales, (cols, kw), x, &mut out)
            },
            // SAFETY: AVX-512F present and the BF16 shapes checked by `stored` (above).
            Stored::Bf16(bits) => unsafe { avx512::partials_bf16(bits, (cols, kw), x, &mut out) },
            // SAFETY: AVX-512F present and the F32 shapes checked by `stored` (above).
            Stored::F32(values) => unsafe { avx512::partials_f32(values, (cols, kw), x, &mut out) },
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, x);
        unreachable!("the AVX-512 path is never taken off x86-64 (available() is false)");
    }
    out
}

/// Decoding tables built once from the format codecs: every entry is exactly the codec's value.
mod tables {
    use memra_kernels::formats::{e2m1_decode, e4m3_decode, ue4m3_decode};
    use std::sync::OnceLock;

    /// The E4M3 magnitudes: `[i][j] = e4m3_decode(16 i + j)` for the 128 codes without the sign.
    pub(super) fn e4m3() -> &'static [[f32; 16]; 8] {
        static T: OnceLock<[[f32; 16]; 8]> = OnceLock::new();
        T.get_or_init(|| std::array::from_fn(|i| std::array::from_fn(|j| e4m3_decode((i * 16 + j) as u8))))
    }

    /// NVFP4's two codecs: `e2m1_decode` of the 16 nibbles and `ue4m3_decode` of the 256 scale
    /// codes.
    pub(super) struct Nvfp4Tables {
        pub(super) e2m1: [f32; 16],
        pub(super) ue4m3: [f32; 256],
    }

    pub(super) fn nvfp4() -> &'static Nvfp4Tables {
        static T: OnceLock<Nvfp4Tables> = OnceLock::new();
        T.get_or_init(|| Nvfp4Tables {
            e2m1: std::array::from_fn(|c| e2m1_decode(c as u8)),
            ue4m3: std::array::from_fn(|c| ue4m3_decode(c as u8)),
        })
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests;
