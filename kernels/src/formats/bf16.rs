//! BF16: the top 16 bits of an f32, rounded to nearest even. NaN stays NaN (quiet bit set).

/// f32 → BF16 bits, round-to-nearest-even; NaN maps to a quiet NaN with the same sign.
pub fn bf16_from_f32(x: f32) -> u16 {
    todo!("helper A: {x}")
}

/// BF16 bits → f32 (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}
