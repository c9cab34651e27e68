//! NVFP4: E2M1 codes (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 and a sign bit 0x8), two per byte,
//! LOW NIBBLE FIRST; one unsigned E4M3 scale per 16 consecutive values of a row; one f32
//! per-matrix scale applied exactly once, after the full row reduce (never per rank).
//!
//! The quantizer is defined here, once, so that every backend sees the same packed bytes for the
//! same weights: the per-matrix scale must stay outside the sharded arithmetic ((a+b)·m ≠ a·m+b·m in
//! f32), and the group scale codes must never collapse to zero for a group that holds a nonzero value.

use super::e4m3::{ue4m3_decode, ue4m3_encode, E4M3_MAX};
use crate::KernelError;

/// Values per unsigned-E4M3 scale.
pub const NVFP4_GROUP: usize = 16;

/// Largest E2M1 magnitude.
const E2M1_MAX: f32 = 6.0;
/// E2M1 magnitudes by code (low 3 bits).
const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
/// The smallest positive unsigned-E4M3 code (2^-9): the floor for a group scale of a nonzero group.
const UE4M3_MIN_POSITIVE_CODE: u8 = 0x01;

/// E2M1 nibble (low 4 bits) → f32.
///
/// Bit 3 is the sign: 0x8 decodes to -0.0. The high 4 bits of `nibble` are ignored.
pub fn e2m1_decode(nibble: u8) -> f32 {
    let magnitude = E2M1_MAGNITUDES[(nibble & 0x7) as usize];
    if nibble & 0x8 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// f32 → E2M1 nibble: round to nearest (ties to even code), saturating to ±6; NaN → +0 code is
/// not representable, so NaN maps to 0x7 (+6) — callers never encode NaN (the quantizer rejects it).
///
/// The sign is always kept, so -0.0 and negative values that round to zero give 0x8 (-0).
pub fn e2m1_encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7;
    }
    let sign = if x.is_sign_negative() { 0x8 } else { 0x0 };
    let a = x.abs();
    // The code is the number of midpoints between neighbouring magnitudes that `a` passes: `>`
    // where the lower neighbour has the even code (a tie stays on it), `>=` where the upper one
    // has. Counted without branches: quantizing a matrix meets every threshold at random, and a
    // chain of branches mispredicted there (docs/gpu/2026-12-03-performance-history.md).
    let code = u8::from(a > 0.25)
        + u8::from(a >= 0.75)
        + u8::from(a > 1.25)
        + u8::from(a >= 1.75)
        + u8::from(a > 2.5)
        + u8::from(a >= 3.5)
        + u8::from(a > 5.0);
    sign | code
}

/// A block-scaled NVFP4 matrix `[out][in]`, `in % 16 == 0`.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Matrix {
    pub out_features: usize,
    pub in_features: usize,
    /// `out * in / 2` bytes, row-major, element `2i` in the low nibble of byte `i`.
    pub packed: Vec<u8>,
    /// `out * in / 16` unsigned E4M3 codes, row-major.
    pub scales: Vec<u8>,
    /// Per-matrix f32 scale (finite, > 0).
    pub global_scale: f32,
}

impl Nvfp4Matrix {
    /// Quantize a row-major f32 matrix: global scale = amax / (6 · 448) (or 1 if all zero), group
    /// scale = ue4m3(group_amax / 6 / global), code = e2m1(w / (global · scale)).
    ///
    /// Details pinned beyond the formula:
    /// - a nonzero amax whose global scale would underflow to 0 gets the smallest positive f32;
    /// - a group holding a nonzero value never gets scale code 0: its code is raised to 0x01 (2^-9);
    /// - an all-zero group gets scale code 0 and its codes are the signed zeros of its values;
    /// - the sign of every value is kept, so -0.0 (and a negative value rounding to zero) is nibble 0x8.
    ///
    /// Rejected with [`KernelError::Contract`]: `in_features % 16 != 0`,
    /// `w.len() != out_features * in_features`, and any non-finite value (named with its index).
    pub fn quantize(w: &[f32], out_features: usize, in_features: usize) -> Result<Self, KernelError> {
        if !in_features.is_multiple_of(NVFP4_GROUP) {
            return Err(KernelError::contract(
                "nvfp4 in_features",
                in_features,
                "must be a multiple of 16 (one ue4m3 scale per 16 consecutive values of a row)",
            ));
        }
        let n = out_features.checked_mul(in_features).ok_or_else(|| {
            KernelError::contract(
                "nvfp4 shape",
                format!("{out_features}×{in_features}"),
                "out_features × in_features must fit in usize",
            )
        })?;
        if w.len() != n {
            return Err(KernelError::contract(
                "nvfp4 weight length",
                w.len(),
                format!("must equal out_features {out_features} × in_features {in_features} = {n}"),
            ));
        }
        if let Some(i) = w.iter().position(|x| !x.is_finite()) {
            return Err(KernelError::contract(
                format!("nvfp4 weight [{}][{}]", i / in_features, i % in_features),
                w[i],
                "every weight must be finite",
            ));
        }

        let amax = w.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let global_scale = if amax == 0.0 { 1.0 } else { (amax / (E2M1_MAX * E4M3_MAX)).max(f32::from_bits(1)) };

        let mut scales = Vec::with_capacity(n / NVFP4_GROUP);
        let mut packed = vec![0u8; n / 2];
        for (g, group) in w.chunks_exact(NVFP4_GROUP).enumerate() {
            let group_amax = group.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let mut scale_code = ue4m3_encode(group_amax / E2M1_MAX / global_scale);
            if group_amax > 0.0 {
                scale_code = scale_code.max(UE4M3_MIN_POSITIVE_CODE);
            }
            scales.push(scale_code);
            let denom = global_scale * ue4m3_decode(scale_code);
            for (j, &x) in group.iter().enumerate() {
                // A zero keeps its sign whatever the scale (and never divides 0 by a zero scale).
                let code = if x == 0.0 { e2m1_encode(x) } else { e2m1_encode(x / denom) };
                let i = g * NVFP4_GROUP + j;
                packed[i / 2] |= code << (4 * (i % 2));
            }
        }
        Ok(Nvfp4Matrix { out_features, in_features, packed, scales, global_scale })
    }

    /// The exact dequantized value of element (r, c) WITHOUT the per-matrix scale:
    /// e2m1(code) · ue4m3(scale) (exact in f32).
    ///
    /// # Panics
    /// If (r, c) is outside the matrix.
    pub fn element(&self, r: usize, c: usize) -> f32 {
        assert!(
            r < self.out_features && c < self.in_features,
            "nvfp4 element ({r}, {c}) is outside the {}×{} matrix",
            self.out_features,
            self.in_features
        );
        let i = r * self.in_features + c;
        let nibble = (self.packed[i / 2] >> (4 * (i % 2))) & 0xF;
        e2m1_decode(nibble) * ue4m3_decode(self.scales[i / NVFP4_GROUP])
    }

    /// The whole matrix dequantized, row-major, with the per-matrix scale applied to every element:
    /// `element(r, c) · global_scale`. A reference view (tests, the f64-style reference); the
    /// canonical program applies the per-matrix scale once after the reduce instead.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.out_features * self.in_features);
        for r in 0..self.out_features {
            for c in 0..self.in_features {
                out.push(self.element(r, c) * self.global_scale);
            }
        }
        out
    }
}
