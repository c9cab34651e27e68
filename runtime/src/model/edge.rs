//! The `edge` preset's weights, built on purpose so that every token of any battery reaches every
//! special path of the arithmetic (docs/DESIGN.md §3.2) at every TP size — the paths a random
//! model almost never reaches (measured on `tiny`'s default battery: no exact router tie in 3,366
//! router calls, no sum of −0.0 terms, no SwiGLU clamp). The model starts as a generated model
//! of the `edge` shapes ([`super::gen`]) and is then edited, deterministically from the seed:
//!
//! - **signed zeros**: every embedding column `c` has one sign `s[c]` for every token (magnitudes
//!   stay random, at least 0.01), the attention norm weights are positive, so layer 0's normed
//!   input has the sign pattern `s` at every step; row 0 of layer 0's q projection is `−0.0`
//!   where `s[c] > 0` and `+0.0` where `s[c] < 0`, so every product of that row is −0.0 and the
//!   row is the sum the canonical +0.0 start makes +0.0 (a sum started from −0.0 gives −0.0).
//! - **SwiGLU clamps**: one *dominant* embedding column `c*` (value `24·s[c*]`) that no
//!   attention projection, router or lm_head row reads (their column `c*` is zero), so the
//!   expert input at `c*` is about `13·s[c*]` whatever the token. In every expert, routed and
//!   shared, of every layer: gate row 0 has `s[c*]` at `c*` (gate ≈ 13: the silu side clamps at
//!   7), gate rows 1 and 2 have `0.25·s[c*]`, up row 1 has `−s[c*]` and up row 2 `+s[c*]`
//!   (up ≈ ∓13: the up side clamps below and above).
//! - **E4M3 codes**: a weight of magnitude 1.0 in a 128×128 block whose other weights are
//!   small gets the block scale 1/448, so it is stored as the code of magnitude 448 (the
//!   saturation value); gate row 3 of every expert holds the 8 subnormal codes 0x01–0x07, 0x81 in
//!   its first 8 columns.
//! - **router ties**: layer 0's router rows 0 and 1 are equal and both carry bias 2.0 (every
//!   other bias stays below 0.02), so experts 0 and 1 are selected at every call with exactly
//!   equal keys — a tie inside the top-2. Layer 1: expert 2 has bias 2.0 (always first), rows 3
//!   and 4 are equal with bias 1.0, so the second slot is an exact tie between 3 and 4 — a tie
//!   across the k/k+1 boundary. Experts 3 and 4 of layer 1 have identical weights, so a router
//!   that breaks the tie the other way (the NUMERIC door DEV_ROUTER) computes the same output,
//!   and only the router seam shows which expert was picked.
//!
//! Every claim is checked where it matters: the host backend counts each path where it runs the
//! twins (`backend::coverage`), and a run whose model claims a path its battery did not reach
//! fails the coverage gate.

use super::{Matrix, Model};
use crate::backend::coverage;
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
    if h <= DOMINANT || c.top_k != 2 || c.experts < 5 || c.layers < 2 || c.expert_width < 4 || c.shared_width < 4 {
        return Err(crate::RuntimeError::Config(format!(
            "the edge model needs hidden > {DOMINANT}, top-k 2, at least 5 experts, 2 layers and expert widths ≥ 4 \
             (got hidden {h}, top-k {}, {} experts, {} layers)",
            c.top_k, c.experts, c.layers
        )));
    }
    let sign: Vec<f32> = (0..h).map(|col| if splitmix64(seed ^ 0xED6E ^ col as u64) & 1 == 0 { 1.0 } else { -1.0 }).collect();
    let s_star = sign[DOMINANT];

    // Embedding: one sign per column, magnitudes at least 0.01, the dominant column 24.
    edit_bf16(&mut model.embed, |_, col, v| if col == DOMINANT { 24.0 * s_star } else { v.abs().max(0.01) * sign[col] });
    // Nothing but the experts reads the dominant column.
    let zero_col = |m: &mut Matrix| edit_bf16(m, |_, col, v| if col == DOMINANT { 0.0 } else { v });
    zero_col(&mut model.lm_head);
    for layer in &mut model.layers {
        for m in [&mut layer.wq, &mut layer.wk, &mut layer.wv, &mut layer.wg, &mut layer.router] {
            zero_col(m);
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
            plant_subnormals(&mut e.gate);
        }
    }
    // Signed zeros: row 0 of layer 0's q projection, −0.0 against every positive input.
    let l0 = &mut model.layers[0];
    for w in l0.attn_norm.iter_mut() {
        *w = w.abs();
    }
    if let Matrix::Bf16 { in_features, bits, .. } = &mut l0.wq {
        for (col, b) in bits[..*in_features].iter_mut().enumerate() {
            *b = if sign[col] > 0.0 { 0x8000 } else { 0x0000 };
        }
    }
    // Router ties: inside the top-2 at layer 0, across the boundary at layer 1.
    copy_bf16_row(&mut l0.router, 0, 1);
    l0.router_bias[0] = 2.0;
    l0.router_bias[1] = 2.0;
    let l1 = &mut model.layers[1];
    copy_bf16_row(&mut l1.router, 3, 4);
    l1.router_bias[2] = 2.0;
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
