//! The `edge` preset's weights, built on purpose so that every token of any battery reaches every
//! special path of the arithmetic (docs/DESIGN.md §3.2) at every TP size — the paths a random
//! model almost never reaches (measured on `tiny`'s default battery: no exact router tie in 3,366
//! router calls, no sum of −0.0 terms, no SwiGLU clamp). The model starts as a generated model
//! of the `edge` shapes ([`super::gen`]) and is then edited, deterministically from the seed:
//!
//! - **signed zeros**: one *dominant* embedding column `c*` (value `24·s*` for every token, `s*`
//!   a sign drawn from the seed) stays dominant in the residual stream, so every layer's normed
//!   input has the sign `s*` at `c*`. The value rows of KV head 0 read only `c*` (each row a
//!   fixed weight of a fixed sign), so attention head 0's output has one sign pattern whatever the
//!   token and position (a softmax-weighted sum of values of one sign, times a positive gate).
//!   Row 0 of the output projection has `−0.0` in K-block 0 (head 0's columns) where that output
//!   is positive and `+0.0` where it is negative: every product of that K-block is −0.0, so its
//!   partial is the sum the canonical +0.0 start makes +0.0 (a sum started from −0.0 gives −0.0),
//!   at every layer and step, and the o_proj seam digests it.
//! - **SwiGLU clamps**: no other attention projection, router or lm_head row reads `c*` (their
//!   column `c*` is zero), so the expert input at `c*` is about `13·s*` whatever the token. In
//!   every expert, routed and shared, of every layer: gate row 0 has `s*` at `c*` (gate ≈ 13: the
//!   silu side clamps at 7), gate rows 1 and 2 have `0.25·s*`, up row 1 has `−s*` and up row 2 `+s*`
//!   (up ≈ ∓13: the up side clamps below and above). The down projection reads those three rows
//!   at 1/32 of their generated weights, so the nearly constant clamped values change the experts
//!   seam's bits without drowning the tokens' own signal in the residual stream. Layer 1 is
//!   unclamped (the preset's `unclamped_layers`): it has the same rows, but its SwiGLU passes
//!   them through unclamped, so the clamp paths are reached in layer 0 (every token, every
//!   expert class) and layer 1 is the unclamped layer the doors for such layers serve.
//! - **E4M3 codes**: a weight of magnitude 1.0 in a 128×128 block whose other weights are
//!   small gets the block scale 1/448, so it is stored as the code of magnitude 448 (the
//!   saturation value); gate row 3 of every expert holds the 8 subnormal codes 0x01–0x07, 0x81 in
//!   its first 8 columns.
//! - **router ties**: layer 0's router rows 0 and 1 are equal and both carry bias 2.0 (every
//!   other bias stays below 0.02), so experts 0 and 1 are selected at every call with exactly
//!   equal keys — a tie inside the top-2. Layer 1: the last expert has bias 2.0 (always first),
//!   rows 3 and 4 are equal with bias 1.0, so the second slot is an exact tie between 3 and 4 — a
//!   tie across the k/k+1 boundary. The last expert is owned by the last rank wherever the routed
//!   experts are expert-parallel (contiguous ranges at TP2, TP4 and TP8), so a slot's owner is
//!   another rank than the root at every such TP size and the doors that move an owner's slot to
//!   the root (STEP_EP, MOE_DIRECT) have work to witness. Experts 3 and 4 of layer 1 have identical weights, so a router
//!   that breaks the tie the other way (the NUMERIC door DEV_ROUTER) computes the same output,
//!   and only the router seam shows which expert was picked.
//!
//! Every claim is checked where it matters: the host backend counts each path where it runs the
//! twins (`backend::coverage`), and a run whose model claims a path its battery did not reach
//! fails the coverage gate.

use super::{Matrix, Model};
use crate::evidence::coverage;
use crate::Result;
use memra_kernels::formats::{bf16_from_f32, bf16_to_f32, e4m3_block_dequant, e4m3_block_quantize};
use memra_kernels::twins::digest::splitmix64;

/// The paths the `edge` preset claims its battery reaches (coverage counter names).
pub const CLAIMS: [&str; 11] = [
    coverage::TIE_IN_TOPK,
    coverage::TIE_AT_BOUNDARY,
    coverage::NEGATIVE_ZERO_SUMS,
    "swiglu.clamp_silu.routed",
    "swiglu.clamp_up_high.routed",
    "swiglu.clamp_up_low.routed",
    "swiglu.clamp_silu.shared",
    "swiglu.clamp_up_high.shared",
    "swiglu.clamp_up_low.shared",
    coverage::E4M3_MAX_CODES,
    coverage::E4M3_SUBNORMAL_CODES,
];

/// The coverage paths a preset claims (none but `edge`'s: the random presets claim nothing).
pub fn claims_of(preset: &str) -> &'static [&'static str] {
    match preset {
        "edge" => &CLAIMS,
        _ => &[],
    }
}

/// The dominant embedding column.
const DOMINANT: usize = 7;

/// Edit a generated model of the `edge` shapes into the edge model (module docs).
pub fn shape(model: &mut Model, seed: u64) -> Result<()> {
    let c = model.config.clone();
    let h = c.hidden;
    if h <= DOMINANT || c.top_k != 2 || c.experts < 6 || c.layers < 2 || c.expert_width < 4 || c.shared_width < 4 {
        return Err(crate::RuntimeError::ModelShape {
            rule: format!(
                "the edge model needs hidden > {DOMINANT}, top-k 2, at least 6 experts, 2 layers and expert widths ≥ 4 \
                 (got hidden {h}, top-k {}, {} experts, {} layers)",
                c.top_k, c.experts, c.layers
            ),
        });
    }
    let s_star = if splitmix64(seed ^ 0xED6E) & 1 == 0 { 1.0f32 } else { -1.0 };

    // The dominant column; nothing but the experts and KV head 0's values reads it.
    edit_bf16(&mut model.embed, |_, col, v| if col == DOMINANT { 24.0 * s_star } else { v });
    let zero_col = |m: &mut Matrix| edit_bf16(m, |_, col, v| if col == DOMINANT { 0.0 } else { v });
    zero_col(&mut model.lm_head);
    let hd = c.head_dim;
    // Value row j of KV head 0: weight a_j at c*, alternating in sign, nothing elsewhere.
    let a = |j: usize| (if j.is_multiple_of(2) { 0.05 } else { -0.05 }) * (1.0 + j as f32 / hd as f32);
    for layer in &mut model.layers {
        for m in [&mut layer.wq, &mut layer.wk, &mut layer.wg, &mut layer.router] {
            zero_col(m);
        }
        edit_bf16(&mut layer.wv, |r, col, v| match (r < hd, col == DOMINANT) {
            (true, true) => a(r),
            (true, false) | (false, true) => 0.0,
            (false, false) => v,
        });
        // Output row 0, K-block 0 (head 0's outputs, sign a_j·s*): −0.0 against a positive
        // output, +0.0 against a negative one, so every product is −0.0.
        if let Matrix::Bf16 { bits, .. } = &mut layer.wo {
            for (j, b) in bits[..hd].iter_mut().enumerate() {
                *b = if a(j) * s_star > 0.0 { 0x8000 } else { 0x0000 };
            }
        }
        for e in layer.experts.iter_mut().chain(std::iter::once(&mut layer.shared)) {
            edit_e4m3(&mut e.gate, |r, col, v| match (r, col == DOMINANT) {
                (0, true) => s_star,
                (1 | 2, true) => 0.25 * s_star,
                (_, true) => 0.0,
                _ => v,
            });
            edit_e4m3(&mut e.up, |r, col, v| match (r, col == DOMINANT) {
                (1, true) => -s_star,
                (2, true) => s_star,
                (_, true) => 0.0,
                _ => v,
            });
            // The clamped rows feed the residual stream only faintly (a clamp still changes the
            // experts seam's bits), so the constant they add does not drown the tokens' own signal.
            edit_e4m3(&mut e.down, |_, col, v| if col < 3 { v * (1.0 / 32.0) } else { v });
            plant_subnormals(&mut e.gate);
        }
    }
    // Router ties: inside the top-2 at layer 0, across the boundary at layer 1.
    let l0 = &mut model.layers[0];
    copy_bf16_row(&mut l0.router, 0, 1);
    l0.router_bias[0] = 2.0;
    l0.router_bias[1] = 2.0;
    let l1 = &mut model.layers[1];
    copy_bf16_row(&mut l1.router, 3, 4);
    l1.router_bias[c.experts - 1] = 2.0;
    l1.router_bias[3] = 1.0;
    l1.router_bias[4] = 1.0;
    l1.experts[4] = l1.experts[3].clone();
    Ok(())
}

/// Rewrite every value of a BF16 matrix through `f(row, col, value)`.
fn edit_bf16(m: &mut Matrix, f: impl Fn(usize, usize, f32) -> f32) {
    if let Matrix::Bf16 { in_features, bits, .. } = m {
        let n = *in_features;
        for (i, b) in bits.iter_mut().enumerate() {
            *b = bf16_from_f32(f(i / n, i % n, bf16_to_f32(*b)));
        }
    }
}

/// Rewrite every value of an E4M3 matrix through `f(row, col, value)` and quantize it again.
fn edit_e4m3(m: &mut Matrix, f: impl Fn(usize, usize, f32) -> f32) {
    if let Matrix::E4m3 { out_features, in_features, codes, scales } = m {
        let (rows, cols) = (*out_features, *in_features);
        let mut w = e4m3_block_dequant(codes, scales, rows, cols);
        for (i, v) in w.iter_mut().enumerate() {
            *v = f(i / cols, i % cols, *v);
        }
        (*codes, *scales) = e4m3_block_quantize(&w, rows, cols);
    }
}

/// The 8 subnormal codes 0x01–0x07 and 0x81 in the first 8 columns of row 3.
fn plant_subnormals(m: &mut Matrix) {
    if let Matrix::E4m3 { in_features, codes, .. } = m {
        let row = &mut codes[3 * *in_features..];
        for (i, code) in [0x01u8, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x81].into_iter().enumerate() {
            row[i] = code;
        }
    }
}

fn copy_bf16_row(m: &mut Matrix, from: usize, to: usize) {
    if let Matrix::Bf16 { in_features, bits, .. } = m {
        let n = *in_features;
        bits.copy_within(from * n..(from + 1) * n, to * n);
    }
}
