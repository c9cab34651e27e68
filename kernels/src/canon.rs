//! Canonical scalar math: THE definition the CUDA kernels reproduce bit for bit.
//!
//! Contract shared with `cuda/canon.cuh`: no fused multiply-add anywhere (every `a * b + c`
//! rounds the product, then the sum; kernels are compiled with `--fmad=false`), IEEE division
//! and square root (correctly rounded on both sides), no platform libm or CUDA intrinsics, and
//! every constant written as the same f32 bit pattern on both sides (`f32::from_bits` here,
//! `__uint_as_float` there) so no decimal literal can parse to a neighbouring float.
//!
//! Every function below is written in the order of operations a CUDA C twin uses, one IEEE
//! operation per Rust operator; Rust never contracts `a * b + c` into an FMA, so the host side
//! is exactly what it reads. The only integer tricks are exact: float → int conversion of an
//! integral value and the construction of 2^k from exponent bits.

// `a = a + b` is written out on purpose: each line is one IEEE operation with its operand
// order, exactly as the CUDA twin writes it (`+=` would hide the order the contract fixes).
#![allow(clippy::assign_op_pattern)]

/// Number of lanes of the canonical in-block dot product.
pub const LANES: usize = 32;
/// Number of lanes of the canonical row sum of squares of the RMSNorm kernels (one thread block).
pub const NORM_LANES: usize = 256;

/// log2(e) ≈ 1.44269502162933349609375 (f32 nearest to 1.4426950408889634).
const LOG2E: f32 = f32::from_bits(0x3FB8_AA3B);
/// High part of ln 2 for Cody–Waite: 0.693145751953125 (15 significant bits, so `n * LN2_HI` is
/// exact for |n| ≤ 512 and `x − n * LN2_HI` is exact by Sterbenz in the reduced range).
const LN2_HI: f32 = f32::from_bits(0x3F31_7200);
/// Low part of ln 2: ≈ 1.428606765330187e-6 (f32 nearest to ln 2 − LN2_HI = 1.4286068203e-6).
const LN2_LO: f32 = f32::from_bits(0x35BF_BE8E);
/// 1.5 · 2^23 = 12582912.0: `(t + M) − M` rounds t to the nearest integer, ties to even,
/// for |t| < 2^22, using only IEEE additions.
const ROUND_MAGIC: f32 = f32::from_bits(0x4B40_0000);
/// 88.72283172607421875, the largest f32 whose exp is finite in f32 (exp of the next float,
/// 88.72283935546875, rounds past f32::MAX). Above it exp_c returns +inf without computing.
const EXP_OVERFLOW_X: f32 = f32::from_bits(0x42B1_7217);
/// −104.0: below it the true exp is < 2^−150 and rounds to +0 (the exact cutoff is
/// ln 2^−150 ≈ −103.972; between the two the computation itself yields +0).
const EXP_UNDERFLOW_X: f32 = f32::from_bits(0xC2D0_0000);
/// Polynomial P(r) of `exp(r) ≈ 1 + r + r²·P(r)` on |r| ≤ ln2/2 (the Cephes `expf` minimax
/// coefficients, S. L. Moshier), highest degree first:
/// ≈ 1.9875691214110702e-4
const EXP_P0: f32 = f32::from_bits(0x3950_6967);
/// ≈ 1.398199936375022e-3
const EXP_P1: f32 = f32::from_bits(0x3AB7_43CE);
/// ≈ 8.333452045917511e-3
const EXP_P2: f32 = f32::from_bits(0x3C08_8908);
/// ≈ 4.166579619050026e-2
const EXP_P3: f32 = f32::from_bits(0x3D2A_A9C1);
/// ≈ 0.1666666567325592
const EXP_P4: f32 = f32::from_bits(0x3E2A_AAAA);
/// 0.5 exactly.
const EXP_P5: f32 = f32::from_bits(0x3F00_0000);
/// 1.0 exactly.
const ONE: f32 = f32::from_bits(0x3F80_0000);

/// 2^k for −126 ≤ k ≤ 127 (a normal float), built from exponent bits: exact.
#[inline(always)]
fn pow2i(k: i32) -> f32 {
    debug_assert!((-126..=127).contains(&k), "pow2i: 2^{k} is not a normal f32");
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Canonical exp: range reduction by ln 2 (Cody–Waite, two constants), a fixed polynomial, and
/// scaling by 2^n through the exponent bits. Total over f32: −inf → +0, +inf → +inf, NaN → NaN,
/// overflow → +inf, deep underflow → +0.
///
/// The exact program (the CUDA twin repeats it operation for operation):
/// 1. `x` NaN → `x` (returned unchanged); `x > 88.72283172607421875` (0x42B17217, includes
///    +inf) → +inf; `x < −104.0` (0xC2D00000, includes −inf) → +0.
/// 2. `t = x * LOG2E; nf = (t + 12582912.0) − 12582912.0` — n = t rounded to nearest, ties to
///    EVEN (the magic-number trick, only IEEE additions); `n = nf as i32` (exact).
/// 3. `r = (x − nf * LN2_HI) − nf * LN2_LO` (|r| ≤ ln2/2 + 1e-6).
/// 4. `z = r * r`; `p = P0; p = p*r + P1; p = p*r + P2; p = p*r + P3; p = p*r + P4;
///    p = p*r + P5` (Horner, each step a rounded product then a rounded sum);
///    `y = ((p * z) + r) + 1.0`.
/// 5. `n1 = n / 2` (truncating), `n2 = n − n1`, result `(y * 2^n1) * 2^n2` with 2^k built from
///    exponent bits. The first product is exact (never leaves the normal range); the second is
///    the only rounding of the scaling, so a subnormal result is rounded once, correctly, from y.
///
/// Accuracy, measured against f64 `exp` over EVERY f32 in [−104, 88.7228] (exhaustive sweep of
/// 2.24e9 inputs; subnormal results measured in units of 2^−149): max error 0.987 ULP (at
/// x = 59.280243), 99.2 % of results correctly rounded. `kernels/tests/canon.rs` re-measures a
/// dense strided sweep plus random samples and asserts ≤ 1.5 ULP, so a broken coefficient or
/// reduction constant fails it.
pub fn exp_c(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > EXP_OVERFLOW_X {
        return f32::INFINITY;
    }
    if x < EXP_UNDERFLOW_X {
        return 0.0;
    }
    let t = x * LOG2E;
    let nf = (t + ROUND_MAGIC) - ROUND_MAGIC;
    let n = nf as i32;
    let r = (x - nf * LN2_HI) - nf * LN2_LO;
    let z = r * r;
    let mut p = EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    let y = ((p * z) + r) + ONE;
    let n1 = n / 2;
    let n2 = n - n1;
    (y * pow2i(n1)) * pow2i(n2)
}

/// Canonical 1/sqrt(x) = `1.0 / x.sqrt()`, both correctly rounded.
pub fn rsqrt_c(x: f32) -> f32 {
    1.0 / x.sqrt()
}

/// Canonical sigmoid = 1 / (1 + exp_c(−x)).
///
/// Edge behaviour (by the formula, no special cases): NaN → NaN; +inf and x ≥ 104 → 1.0;
/// −inf → +0; for x < −88.7228 `exp_c(−x)` is +inf and the result is +0, although the true value
/// (≤ 2^−128) is a nonzero subnormal — an absolute error below 3e−39. Measured exhaustively over
/// every f32 in [−87.33, 88.73] (results normal; above, the result is exactly 1.0 as it should
/// be): max 2.48 ULP against f64; `kernels/tests/canon.rs` asserts ≤ 3 ULP.
pub fn sigmoid_c(x: f32) -> f32 {
    ONE / (ONE + exp_c(-x))
}

/// Canonical SiLU = x / (1 + exp_c(−x)) (Step's scalar program, one division).
///
/// Edge behaviour: NaN → NaN; +inf → +inf; for −88.7228 > x > −inf `exp_c(−x)` is +inf and the
/// result is `x / inf` = −0.0 (true value ≥ −3e−36: an absolute error, not a NaN); x = −inf is
/// special-cased to −0.0 (the formula would give −inf/inf = NaN). Measured exhaustively over
/// every f32 in [−88.72, 88.73] (above, the result is x exactly, as it should be): max 2.40 ULP
/// against f64; `kernels/tests/canon.rs` asserts ≤ 3 ULP.
pub fn silu_c(x: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        return -0.0;
    }
    x / (ONE + exp_c(-x))
}

/// Step SwiGLU with the Step clamp contract: the SiLU arm is clamped ABOVE at `limit`, the linear
/// arm symmetrically: `min(silu(gate), limit) * clamp(up, −limit, limit)`; without a limit
/// `silu(gate) * up`.
///
/// The clamps are written as comparisons so a NaN operand propagates (like `torch.clamp`, unlike
/// `fminf`, which would hide it); the CUDA twin must use the same comparisons:
/// `s = silu_c(gate); if s > limit { s = limit }`;
/// `u = up; if u > limit { u = limit } else if u < −limit { u = −limit }`; result `s * u`.
/// `limit` is expected finite and ≥ 0.
pub fn swiglu_c(gate: f32, up: f32, limit: Option<f32>) -> f32 {
    swiglu_traced(gate, up, limit).0
}

/// NVFP4_DEV_ROUTES's SwiGLU of an unclamped layer with the up projection's per-matrix scale
/// folded after the product: `(silu_c(gate) · up) · up_scale`, where `up` is the unscaled up row
/// (the canonical program computes `silu_c(gate) · (up · up_scale)`). No clamp: a clamped layer
/// keeps the canonical program, since this form never holds the scaled up value a clamp compares.
pub fn swiglu_folded(gate: f32, up: f32, up_scale: f32) -> f32 {
    (silu_c(gate) * up) * up_scale
}

/// The clamps one SwiGLU applied: which comparisons replaced an operand by the limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwigluClamps {
    pub silu: bool,
    pub up_high: bool,
    pub up_low: bool,
}

/// [`swiglu_c`] and the clamps it applied. Coverage counts what the arithmetic DID (a twin that
/// skipped a clamp reports none), not which operands lie past the limit.
pub fn swiglu_traced(gate: f32, up: f32, limit: Option<f32>) -> (f32, SwigluClamps) {
    let s = silu_c(gate);
    let Some(limit) = limit else { return (s * up, SwigluClamps::default()) };
    let mut c = SwigluClamps::default();
    let s = if s > limit {
        c.silu = true;
        limit
    } else {
        s
    };
    let u = if up > limit {
        c.up_high = true;
        limit
    } else if up < -limit {
        c.up_low = true;
        -limit
    } else {
        up
    };
    (s * u, c)
}

/// Adds `w[i] * x[i]` into lane `i % 32` of `acc` (i counted from the start of `w`), in
/// increasing i: the inner loop of `dot32`. A caller feeding one long dot product in several
/// pieces must pass pieces whose lengths are multiples of 32 (except the last), so every
/// element lands in the lane `dot32` would put it in.
///
/// Written for auto-vectorisation: whole 32-element chunks update all 32 lanes independently
/// (lane-wise vector adds are not a reassociation: each lane still adds its elements in order),
/// and `chunks_exact` removes bounds checks. `decode` maps a stored weight to its f32 value.
#[inline(always)]
pub(crate) fn lanes_accumulate<T: Copy>(acc: &mut [f32; LANES], w: &[T], x: &[f32], decode: impl Fn(T) -> f32) {
    assert_eq!(w.len(), x.len(), "dot32: w has {} elements but x has {}", w.len(), x.len());
    let mut wc = w.chunks_exact(LANES);
    let mut xc = x.chunks_exact(LANES);
    for (wb, xb) in (&mut wc).zip(&mut xc) {
        for l in 0..LANES {
            acc[l] = acc[l] + decode(wb[l]) * xb[l];
        }
    }
    let (wt, xt) = (wc.remainder(), xc.remainder());
    for ((a, &wv), &xv) in acc.iter_mut().zip(wt).zip(xt) {
        *a = *a + decode(wv) * xv;
    }
}

/// The canonical in-block dot order over `n` elements: 32 lanes; lane `l` starts from +0.0 and
/// accumulates `acc = acc + w(i) * x[i]` (product rounded, then sum rounded) for
/// i = l, l+32, l+64, … < n in increasing order; then a xor-butterfly over offsets
/// 16, 8, 4, 2, 1 (`v[l] = v[l] + v[l ^ o]`); the result is lane 0.
///
/// `w` and `x` must have the same length (checked; a mismatch panics); any n ≥ 0. Lanes with no
/// element stay +0.0, so the empty dot is +0.0 and a dot whose products are all −0.0 is +0.0.
pub fn dot32(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    lanes_accumulate(&mut acc, w, x, |v| v);
    butterfly32(acc)
}

/// The xor-butterfly of `dot32` applied to 32 lane accumulators.
///
/// On the device every lane computes `v[l] = v[l] + shfl_xor(v, o)` for o = 16, 8, 4, 2, 1.
/// IEEE addition is commutative bit for bit (`a + b` and `b + a` are the same value, signed
/// zeros included), so after each level lanes l and l^o hold the same value and all 32 lanes end
/// equal (NaN payloads aside: a NaN result is NaN in every lane, its payload is not canonical).
/// The host therefore computes only what lane 0 needs: at offset o, `v[l] = v[l] + v[l + o]`
/// for l < o — the very operations lane 0's value is made of, in the same operand order.
pub fn butterfly32(lanes: [f32; LANES]) -> f32 {
    let mut v = lanes;
    let mut o = LANES / 2;
    while o > 0 {
        for l in 0..o {
            v[l] = v[l] + v[l + o];
        }
        o /= 2;
    }
    v[0]
}

/// Canonical RMSNorm of one row: `ss = dot32(x, x)`, `inv = rsqrt_c(ss / n + eps)`,
/// `y[i] = (x[i] * inv) * w[i]`.
///
/// `n` is `x.len() as f32` (exact for every realistic width); `x`, `w` and `y` must have the same
/// length (checked; a mismatch panics). An empty row writes nothing.
pub fn rmsnorm_c(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    assert_eq!(w.len(), x.len(), "rmsnorm_c: weight has {} entries but the row has {}", w.len(), x.len());
    assert_eq!(y.len(), x.len(), "rmsnorm_c: output has {} entries but the row has {}", y.len(), x.len());
    if x.is_empty() {
        return;
    }
    let n = x.len() as f32;
    let ss = dot32(x, x);
    let inv = rsqrt_c(ss / n + eps);
    for ((yi, &xi), &wi) in y.iter_mut().zip(x).zip(w) {
        *yi = (xi * inv) * wi;
    }
}

/// The canonical sum of squares of a whole row (the RMSNorm of `rmsnorm_rows`, `add_rmsnorm`):
/// a fixed-shape order chosen so that a block of 256 threads computes it in parallel
/// (docs/DESIGN.md §3.4, "a canonical order is a definition, and it should be chosen to be fast").
///
/// 1. 256 lanes: lane `l` starts from +0.0 and accumulates `acc = acc + x[i] * x[i]` (product
///    rounded, then sum) for i = l, l+256, l+512, … < n in increasing order;
/// 2. each run of 32 consecutive lanes (a warp: lanes 32w … 32w+31) is reduced by the
///    xor-butterfly of `dot32` ([`butterfly32`]), giving 8 warp sums `s[0..8]`;
/// 3. the 8 warp sums fold in halves: `s[w] = s[w] + s[w + 4]` for w < 4, then
///    `s[w] = s[w] + s[w + 2]` for w < 2, then `s[0] = s[0] + s[1]`.
///
/// The shape depends only on n (lanes with no element stay +0.0), never on a launch.
pub fn sum_squares256(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; NORM_LANES];
    let mut chunks = x.chunks_exact(NORM_LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = *a + v * v;
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a = *a + v * v;
    }
    let mut warps = [0.0f32; NORM_LANES / LANES];
    for (w, lanes) in warps.iter_mut().zip(acc.chunks_exact(LANES)) {
        *w = butterfly32(lanes.try_into().expect("32 lanes"));
    }
    let mut o = warps.len() / 2;
    while o > 0 {
        for w in 0..o {
            warps[w] = warps[w] + warps[w + o];
        }
        o /= 2;
    }
    warps[0]
}

/// Canonical RMSNorm of one model row (hidden width): `ss = sum_squares256(x)`,
/// `inv = rsqrt_c(ss / n + eps)`, `y[i] = (x[i] * inv) * w[i]`. The per-head q/k norms of RoPE
/// keep [`rmsnorm_c`] (128 values: one warp, the dot32 order).
///
/// `x`, `w` and `y` must have the same length (checked; a mismatch panics). An empty row writes
/// nothing.
pub fn rmsnorm_row_c(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    assert_eq!(w.len(), x.len(), "rmsnorm_row_c: weight has {} entries but the row has {}", w.len(), x.len());
    assert_eq!(y.len(), x.len(), "rmsnorm_row_c: output has {} entries but the row has {}", y.len(), x.len());
    if x.is_empty() {
        return;
    }
    let n = x.len() as f32;
    let inv = rsqrt_c(sum_squares256(x) / n + eps);
    for ((yi, &xi), &wi) in y.iter_mut().zip(x).zip(w) {
        *yi = (xi * inv) * wi;
    }
}
