//! OCP FP8 E4M3FN: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; max ±448; no infinities;
//! NaN is S.1111.111. Policy (pinned): encoding rounds to nearest even and SATURATES every finite
//! value (and ±inf) to ±448 — like CUDA's `__NV_SATFINITE`, unlike ml_dtypes/PyTorch which turn
//! values rounding past 448 into NaN. NaN encodes to 0x7F (sign kept: 0xFF for negative NaN).

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// The canonical positive NaN code.
pub const E4M3_NAN: u8 = 0x7F;

/// E4M3 code → f32 (exact; 0x7F/0xFF → NaN).
pub fn e4m3_decode(code: u8) -> f32 {
    todo!("helper A: {code}")
}

/// f32 → E4M3 code, round-to-nearest-even, saturating finite values to ±448.
pub fn e4m3_encode(x: f32) -> u8 {
    todo!("helper A: {x}")
}

/// Unsigned E4M3 scale (NVFP4 per-16 scales): code in 0..=0x7E, value as E4M3 with sign 0.
pub fn ue4m3_decode(code: u8) -> f32 {
    todo!("helper A: {code}")
}

/// f32 ≥ 0 → unsigned E4M3 scale code, round-to-nearest-even, saturating to 448; negative or
/// NaN inputs are a caller bug and map to 0.
pub fn ue4m3_encode(x: f32) -> u8 {
    todo!("helper A: {x}")
}
