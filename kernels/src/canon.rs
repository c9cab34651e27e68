//! Canonical scalar math: THE definition the CUDA kernels reproduce bit for bit.
//!
//! Contract shared with `cuda/canon.cuh`: no fused multiply-add anywhere (every `a * b + c`
//! rounds the product, then the sum; kernels are compiled with `--fmad=false`), IEEE division
//! and square root (correctly rounded on both sides), no platform libm or CUDA intrinsics, and
//! every constant written as the same f32 bit pattern on both sides (`f32::from_bits` here,
//! `__uint_as_float` there) so no decimal literal can parse to a neighbouring float.

/// Number of lanes of the canonical in-block dot product.
pub const LANES: usize = 32;

/// Canonical exp: range reduction by ln 2 (Cody–Waite, two constants), a fixed polynomial, and
/// scaling by 2^n through the exponent bits. Total over f32: −inf → +0, +inf → +inf, NaN → NaN,
/// overflow → +inf, deep underflow → +0.
pub fn exp_c(x: f32) -> f32 {
    todo!("helper B: {x}")
}

/// Canonical 1/sqrt(x) = `1.0 / x.sqrt()`, both correctly rounded.
pub fn rsqrt_c(x: f32) -> f32 {
    1.0 / x.sqrt()
}

/// Canonical sigmoid = 1 / (1 + exp_c(−x)).
pub fn sigmoid_c(x: f32) -> f32 {
    todo!("helper B: {x}")
}

/// Canonical SiLU = x / (1 + exp_c(−x)) (Step's scalar program, one division).
pub fn silu_c(x: f32) -> f32 {
    todo!("helper B: {x}")
}

/// Step SwiGLU with the Step clamp contract: the SiLU arm is clamped ABOVE at `limit`, the linear
/// arm symmetrically: `min(silu(gate), limit) * clamp(up, −limit, limit)`; without a limit
/// `silu(gate) * up`.
pub fn swiglu_c(gate: f32, up: f32, limit: Option<f32>) -> f32 {
    todo!("helper B: {gate} {up} {limit:?}")
}

/// The canonical in-block dot order over `n` elements: 32 lanes; lane `l` starts from +0.0 and
/// accumulates `acc = acc + w(i) * x[i]` (product rounded, then sum rounded) for
/// i = l, l+32, l+64, … < n in increasing order; then a xor-butterfly over offsets
/// 16, 8, 4, 2, 1 (`v[l] = v[l] + v[l ^ o]`); the result is lane 0.
pub fn dot32(w: &[f32], x: &[f32]) -> f32 {
    todo!("helper B: {} {}", w.len(), x.len())
}

/// The xor-butterfly of `dot32` applied to 32 lane accumulators.
pub fn butterfly32(lanes: [f32; LANES]) -> f32 {
    todo!("helper B: {}", lanes[0])
}

/// Canonical RMSNorm of one row: `ss = dot32(x, x)`, `inv = rsqrt_c(ss / n + eps)`,
/// `y[i] = (x[i] * inv) * w[i]`.
pub fn rmsnorm_c(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    todo!("helper B: {} {} {eps} {}", x.len(), w.len(), y.len())
}
