//! The GEMV twins (`memra_kernels::twins::gemv`) of E4M3, BF16 and F32 storage with AVX-512, for
//! the host backend: the same operations in the same order, so the same bits, faster.
//!
//! Why: the twins are most of a host run's time, and the E4M3 twin decodes codes one table load at
//! a time (docs/PERFORMANCE.md, issue 13). Here 16 codes are decoded at once: the 128 magnitudes
//! of the code table sit in eight registers and `vpermt2ps` looks 16 of them up; the sign bit is
//! ORed in, exactly as `e4m3_decode` builds the value. BF16 is widened 16 values at a time (the
//! bits shifted into the upper half, as `bf16_to_f32`), F32 loaded as it is.
//!
//! The arithmetic is the twin's, operation by operation: each of the 32 lanes accumulates
//! `acc = acc + w * x` (product rounded, then sum rounded; never fused) from +0.0, over each
//! 128-code block for E4M3 and over the whole K-block for BF16 and F32; lanes 0–15 live in one register and 16–31 in another, so the butterfly's first level
//! (`v[l] + v[l + 16]`) is one add of the two, and every later level adds the upper half of what
//! is left to the lower, with the twin's operand order. E4M3 block scales, the K-block partial and
//! the row's fold are scalar, as in the twin. Views the fast path does not take (NVFP4, a K-block
//! that is not whole lane rounds or 128-code blocks, shapes that do not match) go to the twin,
//! which checks and panics.
//!
//! Used only where the CPU has AVX-512F (detected once at run time); elsewhere the twin runs.
//! `tests::matches_the_twin_bit_for_bit` compares both on every code, signed zeros, subnormal,
//! infinite and NaN inputs (NaN payloads aside, which are not canonical: docs/DESIGN.md §3.4).

// `acc = acc + p` is written out on purpose, as in the twin: each line is one IEEE operation with
// its operand order.
#![allow(clippy::assign_op_pattern)]

use memra_kernels::formats::E4M3_BLOCK;
use memra_kernels::twins::gemv::{self, MatrixView, WeightRef};

/// Whether the fast path runs on this CPU (AVX-512F, detected once).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The stored weights of a view the fast path takes.
enum Stored<'a> {
    /// E4M3 codes, their scales and the view's first global row (K-blocks of whole 128-code blocks).
    E4m3(&'a [u8], &'a [f32], usize),
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
        WeightRef::Bf16(bits) if bits.len() == n => Some(Stored::Bf16(bits)),
        WeightRef::F32(values) if values.len() == n => Some(Stored::F32(values)),
        _ => None,
    }
}

/// `gemv::gemv_rows`, bit for bit.
pub(crate) fn gemv_rows(m: &MatrixView, x: &[f32], out: &mut [f32]) {
    match stored(m, x) {
        Some(w) if out.len() == m.out_features => {
            let nk = m.in_features / m.kblock_width;
            let partials = row_partials(m, w, x);
            for (o, row) in out.iter_mut().zip(partials.chunks_exact(nk)) {
                // The row's canonical fold of its K-block partials from +0.0.
                let mut acc = 0.0f32;
                for &p in row {
                    acc = acc + p;
                }
                *o = acc;
            }
        }
        _ => gemv::gemv_rows(m, x, out),
    }
}

/// `gemv::gemv_partials`, bit for bit.
pub(crate) fn gemv_partials(m: &MatrixView, x: &[f32], out: &mut [f32]) {
    let (rows, nk) = (m.out_features, m.in_features / m.kblock_width.max(1));
    match stored(m, x) {
        Some(w) if out.len() == rows * nk => {
            let partials = row_partials(m, w, x);
            for (r, row) in partials.chunks_exact(nk).enumerate() {
                for (k, &p) in row.iter().enumerate() {
                    out[k * rows + r] = p;
                }
            }
        }
        _ => gemv::gemv_partials(m, x, out),
    }
}

/// The K-block partials of every row, row-major (`[r · nk + k]`).
fn row_partials(m: &MatrixView, w: Stored, x: &[f32]) -> Vec<f32> {
    let (rows, cols, kw) = (m.out_features, m.in_features, m.kblock_width);
    let mut out = vec![0.0f32; rows * (cols / kw)];
    #[cfg(target_arch = "x86_64")]
    {
        let table: [[f32; 16]; 8] =
            std::array::from_fn(|i| std::array::from_fn(|j| memra_kernels::formats::e4m3_decode((i * 16 + j) as u8)));
        // `stored` returned `w` only if AVX-512F is on this CPU (`available()`), and it checked
        // what the functions read: the storage is rows × cols, `x` is cols long, K-blocks are
        // whole 32-value lane rounds (whole 128-code blocks for E4M3), E4M3 scales cover every
        // scale row from `row0`; `out` is rows × K-blocks.
        match w {
            // SAFETY: AVX-512F present and the E4M3 shapes checked by `stored` (above).
            Stored::E4m3(codes, scales, row0) => unsafe {
                avx512::partials_e4m3(&table, codes, scales, row0, (cols, kw), x, &mut out)
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use memra_kernels::formats::E4M3_BLOCK;
    use std::arch::x86_64::*;

    /// 16 codes → their `e4m3_decode` values: the magnitude looked up in the 128-entry table,
    /// the code's sign bit ORed into the f32 sign bit.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn decode16(codes: __m128i, t: &[__m512; 8]) -> __m512 {
        let c = _mm512_cvtepu8_epi32(codes);
        let idx = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
        // Each two-table permute covers 32 magnitudes (index bits 0–4); bits 5 and 6 pick one.
        let q0 = _mm512_permutex2var_ps(t[0], idx, t[1]);
        let q1 = _mm512_permutex2var_ps(t[2], idx, t[3]);
        let q2 = _mm512_permutex2var_ps(t[4], idx, t[5]);
        let q3 = _mm512_permutex2var_ps(t[6], idx, t[7]);
        let bit5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(0x20));
        let bit6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(0x40));
        let low = _mm512_mask_blend_ps(bit5, q0, q1);
        let high = _mm512_mask_blend_ps(bit5, q2, q3);
        let magnitude = _mm512_castps_si512(_mm512_mask_blend_ps(bit6, low, high));
        let sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
        _mm512_castsi512_ps(_mm512_or_si512(magnitude, sign))
    }

    /// The twin's dot32 of the decoded 128-code block at `c` with the 128 values at `x`.
    ///
    /// # Safety
    /// `c` and `x` must point to at least 128 readable elements.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block_dot(t: &[__m512; 8], c: *const u8, x: *const f32) -> f32 {
        let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for j in 0..4 {
            // SAFETY: j·32 + 32 ≤ 128 elements from `c` and `x` (the function's contract).
            let (w_lo, w_hi, x_lo, x_hi) = unsafe {
                (
                    decode16(_mm_loadu_si128(c.add(j * 32).cast()), t),
                    decode16(_mm_loadu_si128(c.add(j * 32 + 16).cast()), t),
                    _mm512_loadu_ps(x.add(j * 32)),
                    _mm512_loadu_ps(x.add(j * 32 + 16)),
                )
            };
            // Lane l: acc = acc + w·x (two roundings, the twin's operand order).
            lo = _mm512_add_ps(lo, _mm512_mul_ps(w_lo, x_lo));
            hi = _mm512_add_ps(hi, _mm512_mul_ps(w_hi, x_hi));
        }
        butterfly(lo, hi)
    }

    /// The butterfly of 32 lanes (0–15 in `lo`, 16–31 in `hi`): v[l] = v[l] + v[l + o] for
    /// o = 16, 8, 4, 2, 1; lane 0 is the dot.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn butterfly(lo: __m512, hi: __m512) -> f32 {
        let v16 = _mm512_add_ps(lo, hi);
        let v8 = _mm256_add_ps(
            _mm512_castps512_ps256(v16),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v16))),
        );
        let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
        let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
        let v1 = _mm_add_ss(v2, _mm_shuffle_ps::<1>(v2, v2));
        _mm_cvtss_f32(v1)
    }

    /// The twin's dot32 over `n` (a multiple of 32) weights, 32 at a time from `load(j)` (the
    /// weights j .. j + 32 as two registers), with `x`: one set of lanes over all `n`, then the
    /// butterfly.
    macro_rules! dot32 {
        ($n:expr, $x:expr, |$j:ident| $load:expr) => {{
            let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let mut $j = 0;
            while $j < $n {
                let (w_lo, w_hi) = $load;
                // SAFETY: j + 32 ≤ n values of `x` (the callers' contract).
                let (x_lo, x_hi) = unsafe { (_mm512_loadu_ps($x.add($j)), _mm512_loadu_ps($x.add($j + 16))) };
                lo = _mm512_add_ps(lo, _mm512_mul_ps(w_lo, x_lo));
                hi = _mm512_add_ps(hi, _mm512_mul_ps(w_hi, x_hi));
                $j += 32;
            }
            butterfly(lo, hi)
        }};
    }

    /// BF16 K-block partials `out[r · nk + k]`: the twin's dot32 of the widened weights.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `bits` holds rows × cols values with rows = `out.len() / nk`,
    /// `x` holds cols values, and `kw` is a multiple of 32 dividing cols.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn partials_bf16(bits: &[u16], (cols, kw): (usize, usize), x: &[f32], out: &mut [f32]) {
        for (r, row_out) in out.chunks_exact_mut(cols / kw).enumerate() {
            for (k, o) in row_out.iter_mut().enumerate() {
                let (w, xk) = (bits[r * cols + k * kw..].as_ptr(), x[k * kw..].as_ptr());
                *o = dot32!(kw, xk, |j| {
                    // SAFETY: j + 32 ≤ kw weights of this K-block (the contract); a BF16 value
                    // is its bits shifted into the upper half of an f32, as `bf16_to_f32` does.
                    unsafe {
                        let widen = |p: *const u16| {
                            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                p.cast(),
                            ))))
                        };
                        (widen(w.add(j)), widen(w.add(j + 16)))
                    }
                });
            }
        }
    }

    /// F32 K-block partials `out[r · nk + k]`: the twin's dot32.
    ///
    /// # Safety
    /// As [`partials_bf16`], with `values` for `bits`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn partials_f32(values: &[f32], (cols, kw): (usize, usize), x: &[f32], out: &mut [f32]) {
        for (r, row_out) in out.chunks_exact_mut(cols / kw).enumerate() {
            for (k, o) in row_out.iter_mut().enumerate() {
                let (w, xk) = (values[r * cols + k * kw..].as_ptr(), x[k * kw..].as_ptr());
                // SAFETY: j + 32 ≤ kw weights of this K-block (the contract).
                *o = dot32!(kw, xk, |j| unsafe { (_mm512_loadu_ps(w.add(j)), _mm512_loadu_ps(w.add(j + 16))) });
            }
        }
    }

    /// K-block partials `out[r · nk + k]` of every row: per K-block, the block scales times the
    /// block dots folded from +0.0 in column order (the twin's `partial`).
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `codes` holds rows × cols codes with rows = `out.len() / nk`,
    /// `x` holds cols values, `kw` is a whole number of 128-code blocks dividing cols, and
    /// `scales` holds every scale row of the rows `row0 ..` (`cols / 128` each).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn partials_e4m3(
        table: &[[f32; 16]; 8],
        codes: &[u8],
        scales: &[f32],
        row0: usize,
        (cols, kw): (usize, usize),
        x: &[f32],
        out: &mut [f32],
    ) {
        // SAFETY: each table row is 16 f32 (one unaligned 512-bit load).
        let t: [__m512; 8] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(table[i].as_ptr()) });
        let (nk, scale_cols) = (cols / kw, cols / E4M3_BLOCK);
        for (r, row_out) in out.chunks_exact_mut(nk).enumerate() {
            let scale_row = &scales[((row0 + r) / E4M3_BLOCK - row0 / E4M3_BLOCK) * scale_cols..][..scale_cols];
            let row = &codes[r * cols..(r + 1) * cols];
            for (k, o) in row_out.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                let first = k * kw / E4M3_BLOCK;
                for (b, &scale) in scale_row[first..first + kw / E4M3_BLOCK].iter().enumerate() {
                    let c0 = (first + b) * E4M3_BLOCK;
                    // SAFETY: c0 + 128 ≤ cols for the row's codes and for `x` (the contract).
                    let dot = unsafe { block_dot(&t, row.as_ptr().add(c0), x.as_ptr().add(c0)) };
                    acc = acc + scale * dot;
                }
                *o = acc;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_kernels::twins::digest::splitmix64;

    /// `x` values that exercise the IEEE cases of the products and sums: signed zeros,
    /// subnormals, and with `non_finite` infinities and NaN.
    fn special(i: usize, s: u64, non_finite: bool) -> f32 {
        match (i % 9, non_finite) {
            (0, _) => 0.0,
            (1, _) => -0.0,
            (2, _) => f32::from_bits(1 + (s as u32 & 0x7F_FFFF) % 0x7F_FFFF), // subnormal
            (3, true) => f32::INFINITY,
            (4, true) => f32::NEG_INFINITY,
            (5, true) => f32::NAN,
            _ => ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0,
        }
    }

    /// Says which path the comparisons exercise on this CPU.
    fn note_path() {
        if !available() {
            eprintln!("no AVX-512F on this CPU: the vector path is not exercised here, only the fallback to the twin");
        }
    }

    fn same(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
    }

    /// The view's rows and K-block partials by the fast path equal the twin's bits; returns the
    /// twin's rows. With `control`, and more than two K-blocks, the negative control: the same
    /// partials folded in reverse order are other bits in some row after the first, so the
    /// comparison can fail (two partials fold to the same sum either way: IEEE addition commutes).
    fn check_against_twin(what: &str, m: &MatrixView, x: &[f32], control: bool) -> Vec<f32> {
        // The path under test is known: the vector one exactly where the CPU has AVX-512F (these
        // views are all ones it takes), else the twin itself (then this checks the fallback).
        assert_eq!(
            stored(m, x).is_some(),
            available(),
            "{what}: the fast path was {}taken",
            if available() { "not " } else { "" }
        );
        let (rows, nk) = (m.out_features, m.in_features / m.kblock_width);
        let (mut want, mut got) = (vec![0.0f32; rows], vec![0.0f32; rows]);
        gemv::gemv_rows(m, x, &mut want);
        gemv_rows(m, x, &mut got);
        assert!(same(&want, &got), "{what}: rows differ from the twin");
        let (mut want_p, mut got_p) = (vec![0.0f32; rows * nk], vec![0.0f32; rows * nk]);
        gemv::gemv_partials(m, x, &mut want_p);
        gemv_partials(m, x, &mut got_p);
        assert!(same(&want_p, &got_p), "{what}: partials differ from the twin");
        if control && nk > 2 {
            let mut reversed = vec![0.0f32; rows];
            gemv::fold_partials(&got_p, nk, rows, true, &mut reversed);
            assert!(!same(&want[1..], &reversed[1..]), "{what}: a reversed fold must show as a difference");
        }
        want
    }

    /// Every code (NaN codes and both zeros, in row 0), ordinary and special inputs, views of a
    /// row shard that starts mid scale block, one and several 128-blocks per K-block: the rows and
    /// the partials equal the twin's bits. The other rows hold no NaN code, so their values are
    /// finite and the comparison means something (checked), and a planted change (the K-blocks
    /// folded in reverse) must differ, so the comparison can fail.
    #[test]
    fn matches_the_twin_bit_for_bit() {
        note_path();
        let mut s = 7u64;
        let mut next = move || {
            s = splitmix64(s);
            s
        };
        // (rows, cols, K-block width, row0, x: 0 ordinary, 1 zeros and subnormals, 2 also inf/NaN)
        for (rows, cols, kw, row0, x_kind) in [
            (256, 1024, 128, 0, 0),
            (130, 1024, 256, 64, 0),
            (64, 1280, 640, 0, 0),
            (40, 512, 128, 100, 1),
            (8, 256, 128, 0, 2),
        ] {
            let codes: Vec<u8> = (0..rows * cols)
                .map(|i| match (i < 256, next() as u8) {
                    (true, _) => i as u8,
                    (false, c) if c & 0x7F == 0x7F => c ^ 1, // no NaN code outside row 0
                    (false, c) => c,
                })
                .collect();
            let scale_rows = (row0 + rows - 1) / 128 - row0 / 128 + 1;
            let scales: Vec<f32> =
                (0..scale_rows * cols / 128).map(|_| (next() % 1000) as f32 / 4096.0 + 1e-3).collect();
            let x: Vec<f32> = (0..cols)
                .map(|i| match x_kind {
                    0 => ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0,
                    k => special(i, next(), k == 2),
                })
                .collect();
            let m = MatrixView {
                w: WeightRef::E4m3 { codes: &codes, scales: &scales, row0 },
                out_features: rows,
                in_features: cols,
                kblock_width: kw,
            };
            let what = format!("e4m3 {rows}×{cols} (K-block {kw}, row0 {row0})");
            let want = check_against_twin(&what, &m, &x, x_kind == 0);
            if x_kind < 2 {
                let finite = want[1..].iter().filter(|v| v.is_finite()).count();
                assert_eq!(finite, rows - 1, "{what}: rows after the first must be finite");
            }
        }
    }

    /// BF16 and F32 views (the F32 mirror's storage) at K-block widths of one and several lane
    /// rounds, ordinary and special inputs: the rows and partials equal the twin's bits; a
    /// reversed fold differs (the comparison can fail).
    #[test]
    fn bf16_and_f32_match_the_twin_bit_for_bit() {
        note_path();
        let mut s = 11u64;
        let mut next = move || {
            s = splitmix64(s);
            s
        };
        for (rows, cols, kw, x_kind) in [(96, 1024, 128, 0), (33, 256, 32, 0), (17, 512, 64, 1), (5, 128, 32, 2)] {
            let values: Vec<f32> =
                (0..rows * cols).map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) / 16.0).collect();
            let bits: Vec<u16> = values.iter().map(|v| memra_kernels::formats::bf16_from_f32(*v)).collect();
            let x: Vec<f32> = (0..cols)
                .map(|i| match x_kind {
                    0 => ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0,
                    k => special(i, next(), k == 2),
                })
                .collect();
            for (name, w) in [("bf16", WeightRef::Bf16(&bits)), ("f32", WeightRef::F32(&values))] {
                let m = MatrixView { w, out_features: rows, in_features: cols, kblock_width: kw };
                let what = format!("{name} {rows}×{cols} (K-block {kw})");
                let want = check_against_twin(&what, &m, &x, x_kind == 0);
                if x_kind < 2 {
                    assert!(want.iter().all(|v| v.is_finite()), "{what}: the rows must be finite");
                }
            }
        }
    }

    /// Views the fast path does not take go to the twin: its checks still panic.
    #[test]
    fn a_bad_view_still_meets_the_twins_checks() {
        let codes = vec![0u8; 128 * 128];
        let scales = vec![1.0f32; 1];
        let m = MatrixView {
            w: WeightRef::E4m3 { codes: &codes, scales: &scales, row0: 0 },
            out_features: 128,
            in_features: 128,
            kblock_width: 128,
        };
        let short_x = vec![0.0f32; 64];
        let r = std::panic::catch_unwind(|| gemv_rows(&m, &short_x, &mut [0.0f32; 128]));
        assert!(r.is_err(), "an x of the wrong length must panic as the twin does");
    }
}
