//! OCP FP8 E4M3FN: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; max ±448; no infinities;
//! NaN is S.1111.111. Policy (pinned): encoding rounds to nearest even and SATURATES every finite
//! value (and ±inf) to ±448 — like CUDA's `__NV_SATFINITE`, unlike ml_dtypes/PyTorch which turn
//! values rounding past 448 into NaN. NaN encodes to 0x7F (sign kept: 0xFF for negative NaN).
//!
//! The codec exists so that the host twin and every device kernel agree on each weight bit: encoding
//! is integer bit manipulation on the f32 pattern (exact round-to-nearest-even, subnormals and ties
//! included), never a float search or a platform conversion.
//!
//! The block-scaled E4M3 matrix (docs/DESIGN.md §3.3) is defined here too: codes `[out][in]` row-major,
//! one f32 scale per 128×128 block, `[ceil(out/128)][ceil(in/128)]`, every scale finite and > 0;
//! value = decode(code) × scale of its block.

use super::E4M3_BLOCK;

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// The canonical positive NaN code.
pub const E4M3_NAN: u8 = 0x7F;

/// Code of +448 (the saturation target).
const E4M3_MAX_CODE: u8 = 0x7E;
/// f32 bit pattern of 448.0: every magnitude at or above it (up to +inf) encodes to 0x7E.
const F32_448_BITS: u32 = 0x43E0_0000;
/// f32 biased exponent of 2^-6, the smallest normal E4M3 power.
const F32_EXP_MIN_NORMAL: u32 = 127 - 6;

/// E4M3 code → f32 (exact; 0x7F/0xFF → NaN).
///
/// The NaN keeps the code's sign bit.
pub fn e4m3_decode(code: u8) -> f32 {
    let sign = ((code & 0x80) as u32) << 24;
    let exp = ((code >> 3) & 0xF) as u32;
    let man = (code & 0x7) as u32;
    let magnitude_bits = if exp == 0xF && man == 0x7 {
        0x7FC0_0000
    } else if exp == 0 {
        // Subnormal: man × 2^-9, exact in f32 (a 3-bit integer times a power of two).
        (man as f32 * f32::from_bits((127 - 9) << 23)).to_bits()
    } else {
        // Normal: (1 + man/8) × 2^(exp - 7); rebias the exponent, left-align the mantissa.
        ((exp + 127 - 7) << 23) | (man << 20)
    };
    f32::from_bits(sign | magnitude_bits)
}

/// f32 → E4M3 code, round-to-nearest-even, saturating finite values to ±448.
///
/// ±inf → ±448 (0x7E / 0xFE); NaN → 0x7F / 0xFF (sign kept); -0.0 → 0x80; magnitudes at or below
/// 2^-10 (half the smallest subnormal) → signed zero.
pub fn e4m3_encode(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7FFF_FFFF;
    if abs > 0x7F80_0000 {
        return sign | E4M3_NAN;
    }
    if abs >= F32_448_BITS {
        // Saturation (pinned policy): everything from 448 up, ±inf included. Values in
        // (448, 464] would round to 448 anyway; above 464 round-to-nearest would leave the grid.
        return sign | E4M3_MAX_CODE;
    }
    let exp = abs >> 23;
    let man = abs & 0x7F_FFFF;
    let magnitude = if exp >= F32_EXP_MIN_NORMAL {
        // Normal E4M3 range: keep 3 of the 23 mantissa bits. The code is exponent·8 + mantissa, so a
        // rounding carry out of the mantissa lands on the next exponent with mantissa 0, as it must.
        let e4m3_exp = exp - F32_EXP_MIN_NORMAL + 1;
        (e4m3_exp << 3) + round_shift_rne(man, 20)
    } else {
        // Subnormal E4M3 range: count quanta of 2^-9. The f32 value is sig × 2^(e - 150) with the
        // implicit bit restored (f32 subnormals: e = 1, no implicit bit), so the quantum count is
        // sig >> (141 - e). Rounding up from 7 gives 8 = the smallest normal code, as it must.
        let (sig, e) = if exp == 0 { (man, 1) } else { (man | 0x80_0000, exp) };
        let shift = 141 - e;
        if shift > 25 {
            // sig < 2^24, so the value is below a quarter quantum: rounds to zero.
            0
        } else {
            round_shift_rne(sig, shift)
        }
    };
    sign | magnitude as u8
}

/// `v >> s` rounded to nearest, ties to even (1 ≤ s ≤ 31).
fn round_shift_rne(v: u32, s: u32) -> u32 {
    let q = v >> s;
    let rem = v & ((1 << s) - 1);
    let half = 1 << (s - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    }
}

/// Unsigned E4M3 scale (NVFP4 per-16 scales): code in 0..=0x7E, value as E4M3 with sign 0.
///
/// The top bit is ignored (scales carry no sign); 0x7F decodes to NaN.
pub fn ue4m3_decode(code: u8) -> f32 {
    e4m3_decode(code & 0x7F)
}

/// f32 ≥ 0 → unsigned E4M3 scale code, round-to-nearest-even, saturating to 448; negative or
/// NaN inputs are a caller bug and map to 0.
///
/// -0.0 maps to 0 as well; +inf saturates to 0x7E.
pub fn ue4m3_encode(x: f32) -> u8 {
    if x.is_nan() || x.is_sign_negative() {
        return 0;
    }
    e4m3_encode(x)
}

/// Number of scale blocks along a dimension of `n` elements (`ceil(n / 128)`).
fn n_blocks(n: usize) -> usize {
    n.div_ceil(E4M3_BLOCK)
}

/// Quantize a row-major f32 matrix `[out_features][in_features]` to block-scaled E4M3.
///
/// Returns `(codes, scales)`: `codes` is `[out][in]` row-major; `scales` is
/// `[ceil(out/128)][ceil(in/128)]` row-major with scale = block_amax / 448 (one f32 division), or
/// 1.0 for a block whose values are all zero; code = `e4m3_encode(w / scale)`.
///
/// Every scale is finite and > 0: block_amax is taken over the finite values only, and a scale that
/// would underflow to 0 is raised to the smallest positive f32. Non-finite weights follow the codec's
/// policy (NaN → NaN code, ±inf → ±448), so the function is total; rejecting them is the caller's
/// choice.
///
/// # Panics
/// If `w.len() != out_features * in_features`.
pub fn e4m3_block_quantize(w: &[f32], out_features: usize, in_features: usize) -> (Vec<u8>, Vec<f32>) {
    let mut codes = vec![0u8; w.len()];
    let mut scales = vec![0.0f32; n_blocks(out_features) * n_blocks(in_features)];
    e4m3_block_quantize_into(w, out_features, in_features, &mut codes, &mut scales);
    (codes, scales)
}

/// [`e4m3_block_quantize`] into caller-provided storage: `codes` of `out_features · in_features`
/// bytes and `scales` of `ceil(out/128) · ceil(in/128)` values, both overwritten.
///
/// A band of 128 rows is quantized independently of every other band (its scale blocks are its
/// own), so a large matrix can be produced band by band, on several threads, with the same bytes.
/// The loops are written to vectorise (`block_amax`, [`e4m3_encode_branchless`]); the bytes are
/// those of the plain definition above.
///
/// # Panics
/// If a length does not match.
pub fn e4m3_block_quantize_into(
    w: &[f32],
    out_features: usize,
    in_features: usize,
    codes: &mut [u8],
    scales: &mut [f32],
) {
    assert_eq!(
        w.len(),
        out_features * in_features,
        "e4m3 block matrix: {} values is not out_features {out_features} × in_features {in_features}",
        w.len()
    );
    let col_blocks = n_blocks(in_features);
    assert_eq!(codes.len(), w.len(), "e4m3 block matrix: {} code bytes for {} values", codes.len(), w.len());
    assert_eq!(
        scales.len(),
        n_blocks(out_features) * col_blocks,
        "e4m3 block matrix: {} scales is not ceil({out_features}/128) × ceil({in_features}/128)",
        scales.len()
    );
    if in_features == 0 {
        scales.fill(1.0);
        return;
    }
    let mut amax = vec![0.0f32; col_blocks];
    for (band, scale_row) in w.chunks(E4M3_BLOCK * in_features).zip(scales.chunks_exact_mut(col_blocks)) {
        amax.fill(0.0);
        for row in band.chunks_exact(in_features) {
            for (a, block) in amax.iter_mut().zip(row.chunks(E4M3_BLOCK)) {
                *a = block_amax(*a, block);
            }
        }
        for (s, &a) in scale_row.iter_mut().zip(&amax) {
            *s = if a == 0.0 { 1.0 } else { (a / E4M3_MAX).max(f32::from_bits(1)) };
        }
    }
    for (r, (code_row, row)) in codes.chunks_exact_mut(in_features).zip(w.chunks_exact(in_features)).enumerate() {
        let scale_row = &scales[(r / E4M3_BLOCK) * col_blocks..][..col_blocks];
        for ((cb, wb), &scale) in code_row.chunks_mut(E4M3_BLOCK).zip(row.chunks(E4M3_BLOCK)).zip(scale_row) {
            for (c, &x) in cb.iter_mut().zip(wb) {
                *c = e4m3_encode_branchless(x / scale);
            }
        }
    }
}

/// `max(m, |x|)` over the finite `x` of `block` (non-finite values count as 0), in 16 running
/// maxima that the compiler keeps in vector registers. Every value is a non-negative finite f32
/// (no NaN, no −0), so `if v > m { v } else { m }` is `f32::max`, and the maximum of a set does
/// not depend on the order it is taken in.
fn block_amax(m: f32, block: &[f32]) -> f32 {
    let finite_abs = |x: f32| {
        let a = x.abs();
        if a < f32::INFINITY {
            a
        } else {
            0.0
        }
    };
    let mut lanes = [0.0f32; 16];
    let mut chunks = block.chunks_exact(16);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            let v = finite_abs(x);
            *l = if v > *l { v } else { *l };
        }
    }
    let tail = chunks.remainder().iter().map(|&x| finite_abs(x));
    lanes.into_iter().chain(tail).fold(m, |a, v| if v > a { v } else { a })
}

/// [`e4m3_encode`] without branches, so the block quantizer's loop vectorises: the same code for
/// every f32 (checked on every pattern of the E4M3 range and a sample of the rest by the tests).
///
/// Normal range: adding `0x7FFFF + lsb` to the pattern and dropping the low 20 bits rounds the
/// mantissa to 3 bits, nearest-even, with a carry into the exponent; rebiasing by 120 exponents
/// gives the code. Subnormal range (|x| < 2^-6): `|x| + 2^14` is rounded by the f32 addition to a
/// multiple of 2^-9 — ulp(2^14) — nearest-even, so the pattern's excess over 2^14 counts E4M3
/// subnormal quanta (8, from a value rounding up to 2^-6, is the smallest normal code).
#[inline]
pub fn e4m3_encode_branchless(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs = bits & 0x7FFF_FFFF;
    let normal = (abs.wrapping_add(0x7FFFF + ((abs >> 20) & 1)) >> 20).wrapping_sub(120 << 3);
    let subnormal = (f32::from_bits(abs) + 16384.0).to_bits().wrapping_sub(0x4680_0000);
    let magnitude = if abs > 0x7F80_0000 {
        E4M3_NAN as u32
    } else if abs >= F32_448_BITS {
        E4M3_MAX_CODE as u32
    } else if abs >= F32_EXP_MIN_NORMAL << 23 {
        normal
    } else {
        subnormal
    };
    (sign | magnitude) as u8
}

/// Dequantize a block-scaled E4M3 matrix: value = `e4m3_decode(code) × scale` of its 128×128 block
/// (one f32 multiply per element), row-major `[out][in]`.
///
/// # Panics
/// If `codes.len() != out_features * in_features` or
/// `scales.len() != ceil(out/128) * ceil(in/128)`.
pub fn e4m3_block_dequant(codes: &[u8], scales: &[f32], out_features: usize, in_features: usize) -> Vec<f32> {
    let col_blocks = n_blocks(in_features);
    assert_eq!(
        codes.len(),
        out_features * in_features,
        "e4m3 block matrix: {} codes is not out_features {out_features} × in_features {in_features}",
        codes.len()
    );
    assert_eq!(
        scales.len(),
        n_blocks(out_features) * col_blocks,
        "e4m3 block matrix: {} scales is not ceil({out_features}/128) × ceil({in_features}/128)",
        scales.len()
    );
    let mut out = Vec::with_capacity(codes.len());
    for r in 0..out_features {
        for c in 0..in_features {
            let scale = scales[(r / E4M3_BLOCK) * col_blocks + c / E4M3_BLOCK];
            out.push(e4m3_decode(codes[r * in_features + c]) * scale);
        }
    }
    out
}
