//! BF16: the top 16 bits of an f32, rounded to nearest even. NaN stays NaN (quiet bit set).
//!
//! Weights stored as BF16 must round the same way on every backend, so the conversion is written
//! once here as integer arithmetic instead of trusting a platform cast.

/// f32 → BF16 bits, round-to-nearest-even; NaN maps to a quiet NaN with the same sign.
///
/// Finite values whose rounding carries past the largest BF16 become ±inf (IEEE behaviour).
pub fn bf16_from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        // NaN: keep sign and the top payload bits, force the quiet bit so truncation cannot turn
        // the NaN into an infinity.
        return ((bits >> 16) | 0x0040) as u16;
    }
    // Adding 0x7FFF plus the kept part's lowest bit rounds half-way cases towards the even value;
    // a carry out of the mantissa correctly bumps the exponent (up to +inf).
    let lsb = (bits >> 16) & 1;
    ((bits + 0x7FFF + lsb) >> 16) as u16
}

/// BF16 bits → f32 (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}
