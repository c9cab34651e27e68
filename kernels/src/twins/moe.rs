//! Router, SwiGLU, weighted slot combine, argmax.

/// Sigmoid top-k router over `logits` (one token): `score_e = sigmoid_c(logit_e)`; select the k
/// largest `score_e + bias_e` in descending order, ties → lower expert id first; the route
/// weights are the selected raw scores; if `normalize`, each is divided by their sum (folded in
/// slot order from +0.0); then each is multiplied by `scaling`. Returns (ids, weights) in slot
/// order.
pub fn router_topk(logits: &[f32], bias: &[f32], k: usize, normalize: bool, scaling: f32) -> (Vec<u32>, Vec<f32>) {
    todo!("helper B: {} {} {k} {normalize} {scaling}", logits.len(), bias.len())
}

/// Elementwise `out[i] = swiglu_c(gate[i], up[i], limit)`.
pub fn swiglu(gate: &[f32], up: &[f32], limit: Option<f32>, out: &mut [f32]) {
    todo!("helper B: {} {} {limit:?} {}", gate.len(), up.len(), out.len())
}

/// Weighted combine in canonical slot order: `acc = +0.0; acc = acc + w[s] * y[s][i]` for each
/// slot s (`y` is `[slots][width]`).
pub fn combine_slots(y: &[f32], w: &[f32], width: usize, out: &mut [f32]) {
    todo!("helper B: {} {} {width} {}", y.len(), w.len(), out.len())
}

/// Index of the largest value, lowest index on ties; NaN never wins.
pub fn argmax(x: &[f32]) -> u32 {
    todo!("helper B: {}", x.len())
}
