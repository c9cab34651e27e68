//! Router, SwiGLU, weighted slot combine, argmax.
//!
//! The MoE seams decide which experts run and in which order their outputs are added, so every
//! choice that could differ between implementations — tie-break, the sum that normalises the
//! route weights, the slot order of the combine, the argmax on ties and NaN — is pinned here.
//! `router_topk_device_variant` is the deliberately different arithmetic of the NUMERIC-CLASS
//! door `MEMRA_STEP_TP_DEV_ROUTER`, kept beside the canonical router so the two can be compared.

use crate::canon::{exp_c, sigmoid_c, swiglu_c};

/// Sigmoid top-k router over `logits` (one token): `score_e = sigmoid_c(logit_e)`; select the k
/// largest `score_e + bias_e` in descending order, ties → lower expert id first; the route
/// weights are the selected raw scores; if `normalize`, each is divided by their sum (folded in
/// slot order from +0.0); then each is multiplied by `scaling`. Returns (ids, weights) in slot
/// order.
///
/// Selection compares keys with `>` / `==`, so −0.0 and +0.0 tie. A NaN key ranks below every
/// non-NaN key (it is chosen only when nothing else is left, lowest id first). If `normalize`
/// and the selected scores sum to zero, the weights are NaN (0/0), as the kernel's would be.
///
/// Preconditions (checked): `bias.len() == logits.len()`, `k <= logits.len()`, fewer than 2^32
/// experts.
pub fn router_topk(logits: &[f32], bias: &[f32], k: usize, normalize: bool, scaling: f32) -> (Vec<u32>, Vec<f32>) {
    route(logits, bias, k, normalize, scaling, sigmoid_c, TieBreak::LowerId)
}

/// The NUMERIC-CLASS `MEMRA_STEP_TP_DEV_ROUTER` arithmetic: the same selection, normalisation
/// and scaling as [`router_topk`], except
/// - the score is [`sigmoid_device_variant`] instead of `sigmoid_c` (accurate, but differing from
///   `sigmoid_c` in the low bits on many inputs);
/// - ties (equal `score + bias`) go to the HIGHER expert id first.
///
/// NaN keys still rank below every non-NaN key; among NaN keys the higher id comes first too.
pub fn router_topk_device_variant(
    logits: &[f32],
    bias: &[f32],
    k: usize,
    normalize: bool,
    scaling: f32,
) -> (Vec<u32>, Vec<f32>) {
    route(logits, bias, k, normalize, scaling, sigmoid_device_variant, TieBreak::HigherId)
}

/// The arithmetic of the CANARY `MEMRA_CANARY_TIE_BREAK` (a planted defect, run by the host
/// backend only): exactly [`router_topk`] except that exact key ties go to the HIGHER expert id.
/// It differs from the canonical router only on a step with an exact tie that decides a slot, so
/// a battery without such ties cannot tell the two apart.
pub fn router_topk_ties_high(
    logits: &[f32],
    bias: &[f32],
    k: usize,
    normalize: bool,
    scaling: f32,
) -> (Vec<u32>, Vec<f32>) {
    route(logits, bias, k, normalize, scaling, sigmoid_c, TieBreak::HigherId)
}

/// Sigmoid of the DEV_ROUTER variant, written through the tanh identity
/// `sigmoid(x) = 0.5 · (1 + tanh(x/2))` with `tanh(x/2) = (1 − E) / (1 + E)`, `E = exp_c(−x)`,
/// for x ≥ 0; for x < 0 (where `1 + tanh` would cancel) `e / (1 + e)` with `e = exp_c(x)`.
/// Both arms are accurate to a few ulp (asserted ≤ 1e−6 relative against f64 in
/// `tests/twins.rs`), yet round differently from `sigmoid_c`: on uniform x in [−12, 12] about
/// half of the negative and a quarter of the non-negative inputs differ in the low bits.
/// NaN → NaN, +inf → 1, −inf → +0.
pub fn sigmoid_device_variant(x: f32) -> f32 {
    let one = f32::from_bits(0x3F80_0000);
    let half = f32::from_bits(0x3F00_0000);
    if x < 0.0 {
        let e = exp_c(x);
        e / (one + e)
    } else {
        let e = exp_c(-x);
        half * (one + (one - e) / (one + e))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TieBreak {
    LowerId,
    HigherId,
}

fn route(
    logits: &[f32],
    bias: &[f32],
    k: usize,
    normalize: bool,
    scaling: f32,
    sigmoid: fn(f32) -> f32,
    tie: TieBreak,
) -> (Vec<u32>, Vec<f32>) {
    let n = logits.len();
    assert_eq!(bias.len(), n, "router: bias has {} entries, logits {}", bias.len(), n);
    assert!(k <= n, "router: top-k {k} exceeds the {n} experts");
    assert!(u32::try_from(n).is_ok(), "router: {n} experts do not fit u32 ids");

    let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
    let keys: Vec<f32> = scores.iter().zip(bias).map(|(&s, &b)| s + b).collect();
    let mut taken = vec![false; n];
    let mut ids = Vec::with_capacity(k);
    let mut weights = Vec::with_capacity(k);

    // k passes of a linear scan: k ≤ 8 and n ≤ a few hundred in every preset.
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for (e, (&t, &key)) in taken.iter().zip(&keys).enumerate() {
            if t {
                continue;
            }
            let better = match best {
                None => true,
                Some(b) => beats(key, keys[b], tie),
            };
            if better {
                best = Some(e);
            }
        }
        let b = best.expect("k <= n leaves an expert to take");
        taken[b] = true;
        ids.push(b as u32);
        weights.push(scores[b]);
    }

    if normalize {
        let mut sum = 0.0f32;
        for &w in &weights {
            sum += w;
        }
        for w in &mut weights {
            *w /= sum;
        }
    }
    for w in &mut weights {
        *w *= scaling;
    }
    (ids, weights)
}

/// Whether a candidate with key `cand`, scanned after the current best (so with a HIGHER id),
/// replaces it. NaN ranks below every number.
fn beats(cand: f32, best: f32, tie: TieBreak) -> bool {
    match (cand.is_nan(), best.is_nan()) {
        (true, true) => tie == TieBreak::HigherId,
        (true, false) => false,
        (false, true) => true,
        (false, false) => cand > best || (tie == TieBreak::HigherId && cand == best),
    }
}

/// Elementwise `out[i] = swiglu_c(gate[i], up[i], limit)`.
///
/// `gate`, `up` and `out` have the same length (checked).
pub fn swiglu(gate: &[f32], up: &[f32], limit: Option<f32>, out: &mut [f32]) {
    assert_eq!(up.len(), gate.len(), "swiglu: up has {} elements, gate {}", up.len(), gate.len());
    assert_eq!(out.len(), gate.len(), "swiglu: out has {} elements, gate {}", out.len(), gate.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = swiglu_c(g, u, limit);
    }
}

/// Weighted combine in canonical slot order: `acc = +0.0; acc = acc + w[s] * y[s][i]` for each
/// slot s (`y` is `[slots][width]`).
///
/// `slots = w.len()`; `y.len() == slots * width` and `out.len() == width` (checked). Because the
/// accumulator starts at +0.0, an output whose every product is −0.0 is +0.0.
pub fn combine_slots(y: &[f32], w: &[f32], width: usize, out: &mut [f32]) {
    assert_eq!(out.len(), width, "combine_slots: out has {} elements, width is {width}", out.len());
    assert!(
        w.len().checked_mul(width) == Some(y.len()),
        "combine_slots: y has {} elements, expected slots {} * width {width}",
        y.len(),
        w.len()
    );
    out.fill(0.0);
    if width == 0 {
        return;
    }
    for (&ws, ys) in w.iter().zip(y.chunks_exact(width)) {
        for (o, &yi) in out.iter_mut().zip(ys) {
            *o += ws * yi;
        }
    }
}

/// The moe_join in one kernel (`combine_shared_f32`): `out[..width]` = [`combine_slots`] of the
/// first `w.len()` slots of `y`, `out[width..]` = slot `w.len()` of `y` (the shared expert,
/// copied). `y` is `[w.len() + 1][width]`, `out` has `2·width` values (checked).
pub fn combine_shared(y: &[f32], w: &[f32], out: &mut [f32]) {
    let k = w.len();
    assert!(out.len().is_multiple_of(2), "combine_shared: out has {} values, not [routed | shared]", out.len());
    let width = out.len() / 2;
    assert_eq!(y.len(), (k + 1) * width, "combine_shared: y has {} values, expected ({k} + 1) × {width}", y.len());
    let (routed, shared) = out.split_at_mut(width);
    combine_slots(&y[..k * width], w, width, routed);
    shared.copy_from_slice(&y[k * width..]);
}

/// NVFP4_DEV_ROUTES's moe_join in one kernel (`combine_scaled_f32`): [`combine_shared`] with each
/// routed slot's NVFP4 down scale folded into its weight — `out[..width] = +0.0`, then per routed
/// slot s in order `acc = acc + (w[s] · m_s) · y[s][i]`, `m_s = macros[ids[s]]` (the id's bits;
/// 1.0 for an id outside the table), `out[width..] = y[k]`. The canonical program applies the
/// scale to the fold instead (`y_s · sd`, then `w[s] · y_s`).
///
/// `ids.len() == w.len() == k`; `y` is `[k + 1][width]`, `out` `2·width` (checked).
pub fn combine_scaled(ids: &[f32], macros: &[f32], y: &[f32], w: &[f32], out: &mut [f32]) {
    let k = w.len();
    assert_eq!(ids.len(), k, "combine_scaled: {} route ids for {k} weights", ids.len());
    assert!(out.len().is_multiple_of(2), "combine_scaled: out has {} values, not [routed | shared]", out.len());
    let width = out.len() / 2;
    assert_eq!(y.len(), (k + 1) * width, "combine_scaled: y has {} values, expected ({k} + 1) × {width}", y.len());
    let (routed, shared) = out.split_at_mut(width);
    routed.fill(0.0);
    for s in 0..k {
        let m = macros.get(ids[s].to_bits() as usize).copied().unwrap_or(1.0);
        let ws = w[s] * m;
        for (o, &yi) in routed.iter_mut().zip(&y[s * width..(s + 1) * width]) {
            *o += ws * yi;
        }
    }
    shared.copy_from_slice(&y[k * width..]);
}

/// The residual in one kernel (`residual_add_f32`): `sum[i] = a[i] + b[i]`, then
/// `out[i] = h[i] + sum[i]` — the two roundings of `h + (routed + shared)` in that order.
pub fn residual_add(h: &[f32], a: &[f32], b: &[f32], sum: &mut [f32], out: &mut [f32]) {
    let n = h.len();
    assert!(a.len() == n && b.len() == n && sum.len() == n && out.len() == n, "residual_add: lengths differ");
    for i in 0..n {
        sum[i] = a[i] + b[i];
        out[i] = h[i] + sum[i];
    }
}

/// Index of the largest value, lowest index on ties; NaN never wins.
///
/// Comparisons are `>`, so −0.0 and +0.0 tie (lower index wins). All-NaN or empty input → 0.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in x.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if v <= b => {}
            _ => best = Some((i, v)),
        }
    }
    best.map_or(0, |(i, _)| u32::try_from(i).expect("argmax: index does not fit u32"))
}
