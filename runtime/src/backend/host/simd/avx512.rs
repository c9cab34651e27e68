//! The AVX-512 kernels of [`super`]. E4M3: 16 codes become FP16 numbers equal to their values
//! ÷ 256 (`decode16_scaled`), with the 256 moved onto `x`; a 128-code block holding a NaN code,
//! or an `x` that 256 would overflow, takes the table: the 128 magnitudes sit in eight registers,
//! `vpermt2ps` looks 16 of them up and the sign bit is ORed in, exactly as `e4m3_decode` builds
//! the value. NVFP4: 16 nibbles of one group looked up in the 16-entry E2M1
//! table by one `vpermps`, times the group's scale. BF16: widened 16 values at a time (the bits
//! shifted into the upper half, as `bf16_to_f32`); F32 loaded as it is.

// `acc = acc + p` is written out on purpose, as in the twin.
#![allow(clippy::assign_op_pattern)]

use memra_kernels::formats::{E4M3_BLOCK, NVFP4_GROUP};
use std::arch::x86_64::*;

/// 16 codes → their `e4m3_decode` values divided by 256, by way of FP16: a code's 7 magnitude
/// bits shifted left by 7 are the FP16 number with the same exponent and mantissa fields, whose
/// value is the E4M3 value times 2^-8 exactly — subnormal codes included, since FP16's subnormals
/// have the same 2^-14 step that E4M3's 2^-6 step becomes. Sign-extending the code to 16 bits and
/// shifting by 7 puts its sign in bits 14 and 15; clearing bit 14 leaves the FP16 sign.
/// `vcvtph2ps` widens exactly. E4M3's two NaN codes are FP16 numbers this way: callers test a
/// block for them first ([`has_nan_code`]) and take the table path ([`decode16_table`]).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn decode16_scaled(codes: __m128i) -> __m512 {
    let shifted = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(codes));
    _mm512_cvtph_ps(_mm256_and_si256(shifted, _mm256_set1_epi16(0xBFFF_u16 as i16)))
}

/// Whether any of the 128 codes at `c` is one of E4M3's NaN codes (magnitude bits all ones).
///
/// # Safety
/// `c` must point to 128 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn has_nan_code(c: *const u8) -> bool {
    let m = _mm512_set1_epi8(0x7F);
    // SAFETY: two 64-byte loads within the 128 bytes at `c` (the function's contract).
    let (a, b) = unsafe { (_mm512_loadu_si512(c.cast()), _mm512_loadu_si512(c.add(64).cast())) };
    (_mm512_cmpeq_epi8_mask(_mm512_and_si512(a, m), m) | _mm512_cmpeq_epi8_mask(_mm512_and_si512(b, m), m)) != 0
}

/// 16 codes → their `e4m3_decode` values: the magnitude looked up in the 128-entry table,
/// the code's sign bit ORed into the f32 sign bit.
#[inline]
#[target_feature(enable = "avx512f")]
fn decode16_table(codes: __m128i, t: &[__m512; 8]) -> __m512 {
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
/// `x256`, where given, is `x` times 256 (exact: the caller checked that no value overflows):
/// then each lane multiplies `decode(code) / 256` by `256 · x`, whose exact product is
/// `decode(code) · x`, rounded once as the twin's product is, and no weight is scaled. A block
/// holding a NaN code, or a call without `x256`, decodes through the table.
///
/// # Safety
/// `c` and `x` (and `x256` where given) must point to at least 128 readable elements.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn block_dot(t: &[__m512; 8], c: *const u8, x: *const f32, x256: Option<*const f32>) -> f32 {
    let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    // SAFETY: 128 codes at `c` (the function's contract).
    match x256.filter(|_| unsafe { !has_nan_code(c) }) {
        Some(xs) => {
            for j in 0..4 {
                // SAFETY: j·32 + 32 ≤ 128 elements from `c` and `xs` (the function's contract).
                let (w_lo, w_hi, x_lo, x_hi) = unsafe {
                    (
                        decode16_scaled(_mm_loadu_si128(c.add(j * 32).cast())),
                        decode16_scaled(_mm_loadu_si128(c.add(j * 32 + 16).cast())),
                        _mm512_loadu_ps(xs.add(j * 32)),
                        _mm512_loadu_ps(xs.add(j * 32 + 16)),
                    )
                };
                // Lane l: acc = acc + w·x (two roundings, the twin's operand order).
                lo = _mm512_add_ps(lo, _mm512_mul_ps(w_lo, x_lo));
                hi = _mm512_add_ps(hi, _mm512_mul_ps(w_hi, x_hi));
            }
        }
        None => {
            for j in 0..4 {
                // SAFETY: j·32 + 32 ≤ 128 elements from `c` and `x` (the function's contract).
                let (w_lo, w_hi, x_lo, x_hi) = unsafe {
                    (
                        decode16_table(_mm_loadu_si128(c.add(j * 32).cast()), t),
                        decode16_table(_mm_loadu_si128(c.add(j * 32 + 16).cast()), t),
                        _mm512_loadu_ps(x.add(j * 32)),
                        _mm512_loadu_ps(x.add(j * 32 + 16)),
                    )
                };
                lo = _mm512_add_ps(lo, _mm512_mul_ps(w_lo, x_lo));
                hi = _mm512_add_ps(hi, _mm512_mul_ps(w_hi, x_hi));
            }
        }
    }
    butterfly(lo, hi)
}

/// `x` times 256 where that is exact for every value (all finite and below 2^120 in magnitude,
/// so no product overflows); `None` otherwise.
pub(super) fn times_256(x: &[f32]) -> Option<Vec<f32>> {
    const LIMIT: f32 = 1.329_228e36; // 2^120
    x.iter().all(|v| v.abs() < LIMIT).then(|| x.iter().map(|v| v * 256.0).collect())
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

/// 16 BF16 values at `p` widened to f32: the bits shifted into the upper half, as `bf16_to_f32`.
///
/// # Safety
/// `p` must point to 16 readable values.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn widen16(p: *const u16) -> __m512 {
    // SAFETY: 16 values (32 bytes) at `p` (the function's contract).
    let bits = unsafe { _mm256_loadu_si256(p.cast()) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
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
            // SAFETY: j + 32 ≤ kw weights of this K-block (the contract).
            *o = dot32!(kw, xk, |j| unsafe { (widen16(w.add(j)), widen16(w.add(j + 16))) });
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
/// The CPU must have AVX-512F, BW and AVX2; `codes` holds rows × cols codes with rows = `out.len() / nk`,
/// `x` holds cols values, `kw` is a whole number of 128-code blocks dividing cols, and
/// `scales` holds every scale row of the rows `row0 ..` (`cols / 128` each).
#[target_feature(enable = "avx512f,avx512bw,avx2")]
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
    let x256 = times_256(&x[..cols]);
    for (r, row_out) in out.chunks_exact_mut(nk).enumerate() {
        let scale_row = &scales[((row0 + r) / E4M3_BLOCK - row0 / E4M3_BLOCK) * scale_cols..][..scale_cols];
        let row = &codes[r * cols..(r + 1) * cols];
        for (k, o) in row_out.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            let first = k * kw / E4M3_BLOCK;
            for (b, &scale) in scale_row[first..first + kw / E4M3_BLOCK].iter().enumerate() {
                let c0 = (first + b) * E4M3_BLOCK;
                // SAFETY: c0 + 128 ≤ cols for the row's codes and for `x` (the contract).
                let dot = unsafe {
                    block_dot(&t, row.as_ptr().add(c0), x.as_ptr().add(c0), x256.as_ref().map(|v| v.as_ptr().add(c0)))
                };
                acc = acc + scale * dot;
            }
            *o = acc;
        }
    }
}

/// 16 NVFP4 values from element `e` of the view (a multiple of 16, so one whole group): each
/// `e2m1_decode(nibble) * ue4m3_decode(group scale)`, one rounded product as in the twin. The
/// 8 bytes hold the 16 nibbles low first; each byte is doubled into two 32-bit lanes and shifted
/// right by 0 or 4, and the 16-entry E2M1 table is one `vpermps`.
///
/// # Safety
/// `e + 16` elements must lie in `packed` (two per byte) and `e / 16` must index `scales`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn nvfp4_group16(e2m1: __m512, ue4m3: &[f32; 256], packed: &[u8], scales: &[u8], e: usize) -> __m512 {
    let s = ue4m3[scales[e / NVFP4_GROUP] as usize];
    let bytes = &packed[e / 2..e / 2 + 8];
    // SAFETY: `bytes` is 8 readable bytes (bounds checked above).
    let b = unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) };
    let doubled = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    let shifts = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    let nibbles = _mm512_and_si512(_mm512_srlv_epi32(doubled, shifts), _mm512_set1_epi32(0xF));
    _mm512_mul_ps(_mm512_permutexvar_ps(nibbles, e2m1), _mm512_set1_ps(s))
}

/// NVFP4 K-block partials `out[r · nk + k]` (per-matrix scale not applied): the twin's dot32 of
/// the decoded values over the whole K-block, one set of lanes.
///
/// # Safety
/// The CPU must have AVX-512F; `packed` holds rows × cols codes (two per byte) and `scales`
/// rows × cols / 16 group scales with rows = `out.len() / nk`, `x` holds cols values, and `kw`
/// is a multiple of 32 dividing cols.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn partials_nvfp4(
    tables: &super::tables::Nvfp4Tables,
    packed: &[u8],
    scales: &[u8],
    (cols, kw): (usize, usize),
    x: &[f32],
    out: &mut [f32],
) {
    // SAFETY: the table is 16 f32 (one unaligned 512-bit load).
    let e2m1 = unsafe { _mm512_loadu_ps(tables.e2m1.as_ptr()) };
    for (r, row_out) in out.chunks_exact_mut(cols / kw).enumerate() {
        for (k, o) in row_out.iter_mut().enumerate() {
            let (e0, xk) = (r * cols + k * kw, x[k * kw..].as_ptr());
            // SAFETY: e0 + j + 32 ≤ rows × cols elements, a multiple of 16 (the contract).
            *o = dot32!(kw, xk, |j| unsafe {
                (
                    nvfp4_group16(e2m1, &tables.ue4m3, packed, scales, e0 + j),
                    nvfp4_group16(e2m1, &tables.ue4m3, packed, scales, e0 + j + 16),
                )
            });
        }
    }
}

/// The twin's balanced pairwise sum of `p` (a power of two long) with `scratch` (half as long):
/// `next[i] = cur[2i] + cur[2i+1]`, level by level. While a level has 32 values or more, 16
/// pairs are summed at once: the even and the odd elements of 32 gathered by two `vpermt2ps` and
/// added `even + odd`; the last levels are scalar.
#[target_feature(enable = "avx512f")]
fn pairwise_tree(p: &mut [f32], scratch: &mut [f32]) -> f32 {
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let mut len = p.len();
    let (mut src, mut dst) = (p, scratch);
    while len >= 32 {
        len /= 2;
        for (d, s) in dst[..len].chunks_exact_mut(16).zip(src[..2 * len].chunks_exact(32)) {
            // SAFETY: `s` holds 32 values and `d` 16 (chunks_exact).
            unsafe {
                let (a, b) = (_mm512_loadu_ps(s.as_ptr()), _mm512_loadu_ps(s.as_ptr().add(16)));
                let sum = _mm512_add_ps(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
                _mm512_storeu_ps(d.as_mut_ptr(), sum);
            }
        }
        std::mem::swap(&mut src, &mut dst);
    }
    while len > 1 {
        len /= 2;
        for i in 0..len {
            dst[i] = src[2 * i] + src[2 * i + 1];
        }
        std::mem::swap(&mut src, &mut dst);
    }
    src[0]
}

/// QKV_FUSED's tree rows (`gemv::gemv_rows_tree`): per row the products `w[c] * x[c]` 16 at a
/// time from `load(row, c)` (the row's weights c .. c + 16 as f32), padded with +0.0 to a power
/// of two, then [`pairwise_tree`].
macro_rules! tree_rows {
    ($cols:expr, $x:expr, $out:expr, |$r:ident, $c:ident| $load:expr) => {{
        let width = $cols.next_power_of_two();
        let (mut p, mut q) = (vec![0.0f32; width], vec![0.0f32; width / 2]);
        for ($r, o) in $out.iter_mut().enumerate() {
            for ($c, (pc, xc)) in p[..$cols].chunks_exact_mut(16).zip($x.chunks_exact(16)).enumerate() {
                let $c = $c * 16;
                let w = $load;
                // SAFETY: `pc` and `xc` hold 16 values each (chunks_exact).
                unsafe { _mm512_storeu_ps(pc.as_mut_ptr(), _mm512_mul_ps(w, _mm512_loadu_ps(xc.as_ptr()))) };
            }
            p[$cols..].fill(0.0);
            *o = pairwise_tree(&mut p, &mut q);
        }
    }};
}

/// [`tree_rows!`] of BF16 storage.
///
/// # Safety
/// The CPU must have AVX-512F; `bits` holds `out.len()` × cols values, cols is a positive multiple
/// of 16 and `x` holds cols values.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tree_rows_bf16(bits: &[u16], cols: usize, x: &[f32], out: &mut [f32]) {
    let w = &bits[..out.len() * cols];
    // SAFETY: c + 16 ≤ cols values of row r (the contract; `w` is bounds checked above).
    tree_rows!(cols, x, out, |r, c| unsafe { widen16(w.as_ptr().add(r * cols + c)) })
}

/// [`tree_rows!`] of F32 storage.
///
/// # Safety
/// As [`tree_rows_bf16`], with `values` for `bits`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tree_rows_f32(values: &[f32], cols: usize, x: &[f32], out: &mut [f32]) {
    let w = &values[..out.len() * cols];
    // SAFETY: c + 16 ≤ cols values of row r (the contract; `w` is bounds checked above).
    tree_rows!(cols, x, out, |r, c| unsafe { _mm512_loadu_ps(w.as_ptr().add(r * cols + c)) })
}

/// W8 K-block partials `out[r · nk + k]`: per K-block, its 32-value groups folded from +0.0 in
/// column order as `acc = acc + (isum as f32) * (ws · xs)`, the twin's operations. `isum`, the
/// exact i32 sum of the group's 32 products of int8 values (at most 32 · 127² in magnitude), is
/// summed 16 lanes at a time: an integer sum has one value whatever its order.
///
/// # Safety
/// The CPU must have AVX-512F; `q` holds rows × cols int8 weights and `scales` rows × cols / 32
/// scales with rows = `out.len() / nk`, `xq` cols int8 values and `xs` cols / 32 scales, and `kw`
/// is a multiple of 32 dividing cols.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn partials_w8(
    q: &[i8],
    scales: &[f32],
    (xq, xs): (&[i8], &[f32]),
    (cols, kw): (usize, usize),
    out: &mut [f32],
) {
    let (groups, row_groups) = (kw / 32, cols / 32);
    for (r, row_out) in out.chunks_exact_mut(cols / kw).enumerate() {
        for (k, o) in row_out.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for g in k * groups..(k + 1) * groups {
                let (w, x) = (&q[r * cols + g * 32..][..32], &xq[g * 32..][..32]);
                // SAFETY: `w` and `x` hold 32 values each (bounds checked above).
                let isum = unsafe {
                    let widen = |p: *const i8| _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()));
                    let lo = _mm512_mullo_epi32(widen(w.as_ptr()), widen(x.as_ptr()));
                    let hi = _mm512_mullo_epi32(widen(w.as_ptr().add(16)), widen(x.as_ptr().add(16)));
                    _mm512_reduce_add_epi32(_mm512_add_epi32(lo, hi))
                };
                acc = acc + (isum as f32) * (scales[r * row_groups + g] * xs[g]);
            }
            *o = acc;
        }
    }
}
