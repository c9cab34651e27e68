//! NVFP4: E2M1 codes (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 and a sign bit 0x8), two per byte,
//! LOW NIBBLE FIRST; one unsigned E4M3 scale per 16 consecutive values of a row; one f32
//! per-matrix scale applied exactly once, after the full row reduce (never per rank).

/// Values per unsigned-E4M3 scale.
pub const NVFP4_GROUP: usize = 16;

/// E2M1 nibble (low 4 bits) → f32.
pub fn e2m1_decode(nibble: u8) -> f32 {
    todo!("helper A: {nibble}")
}

/// f32 → E2M1 nibble: round to nearest (ties to even code), saturating to ±6; NaN → +0 code is
/// not representable, so NaN maps to 0x7 (+6) — callers never encode NaN (the quantizer rejects it).
pub fn e2m1_encode(x: f32) -> u8 {
    todo!("helper A: {x}")
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
    pub fn quantize(w: &[f32], out_features: usize, in_features: usize) -> Result<Self, crate::KernelError> {
        todo!("helper A: {} {out_features} {in_features}", w.len())
    }

    /// The exact dequantized value of element (r, c) WITHOUT the per-matrix scale:
    /// e2m1(code) · ue4m3(scale) (exact in f32).
    pub fn element(&self, r: usize, c: usize) -> f32 {
        todo!("helper A: {r} {c}")
    }
}
