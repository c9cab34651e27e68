//! The correctness anchor (docs/DESIGN.md §3.4, last paragraph): a plain f64 reference of the decode
//! step, and its comparison with the canonical program at every seam and on the token tape.
//!
//! Bit-identity across TP sizes proves that every TP size computes the *same* thing; it says
//! nothing about whether that thing is the model. This module is the independent witness. It is
//! written for clarity, in f64, with no canonical order and no code shared with the kernel twins:
//! the only borrowed functions are the weight decoders of `memra_kernels::formats` (BF16 and E4M3
//! codes → values), so both sides read the same weights. Every stored weight is exact in f64
//! (a BF16 widens exactly; `decode(code) × scale` of an E4M3 block has at most 4 + 24 significant
//! bits), so the reference's own error is f64 rounding (~1e-13 relative) and the comparison
//! measures the canonical program's f32 arithmetic and nothing else.
//!
//! Two halves that share nothing but [`ReferenceRun`]: `step.rs` computes the reference (the f64
//! step, teacher forcing, router near-ties), reading the weights through `weights.rs` and the
//! functions of `math.rs`; `compare.rs` judges a record against it (the metric and the bound).

mod compare;
mod math;
mod step;
mod weights;

pub use compare::{compare, ComparisonReport, SeamError, TapeEntry};
pub use step::{reference_run, RefToken, ReferenceRun, RouterEvent};

/// The documented bound on the normwise relative error of every seam, and on the relative
/// top-two margin (and router key gap) below which a decision is a near-tie.
///
/// Measured on the `tiny` preset (seed 7, host backend, TP1 and TP2 identical; every step, layer
/// and seam of the default battery's prompts 0–1, the router seam of all 8 prompts;
/// `runtime/tests/reference.rs` prints the table): worst seam `o_proj` 5.2e-7, then `attn`
/// 5.2e-7, `moe_join` 5.0e-7, `o_join` 4.7e-7, `experts` 4.4e-7, `logits` 3.9e-7, `residual`
/// 3.8e-7, `final_norm` 3.6e-7, `rope` 3.3e-7, `attn_norm` 3.3e-7, `ffn_norm` 3.1e-7, `qkv`
/// 3.0e-7, router weights 1.9e-7. That is f32 rounding of ≤ 1024-term sums (a few ulp of the
/// largest element). 1e-3 leaves ~2000× headroom, so the `step` preset's 4096-wide sums and a
/// device's own rounding fit without retuning, while a 1 % weight perturbation (~1e-2 measured
/// by the negative control) or a swapped expert (~1) lies far outside it.
pub const REFERENCE_REL_BOUND: f64 = 1e-3;

/// Width of every attention head (the kernels, norms and RoPE are defined for 128).
const HEAD_DIM: usize = 128;
