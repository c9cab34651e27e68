//! The f64 functions of the reference step: RMSNorm, per-head norm + NeoX RoPE, softmax
//! attention, the SwiGLU expert and the sums of K-block partials — written for clarity, with no
//! canonical order and no code shared with the kernel twins.

use super::weights::Weights;
use super::HEAD_DIM;
use crate::model::Expert;

/// Sum of `g` partial vectors laid out `[g][width]`.
pub(super) fn sum_partials(parts: &[f64], g: usize) -> Vec<f64> {
    let width = parts.len() / g;
    (0..width).map(|i| (0..g).map(|k| parts[k * width + i]).sum()).collect()
}

/// One SwiGLU expert on `x`: the partials of its down projection over `g` K-blocks.
pub(super) fn expert_partials(e: &Expert, x: &[f64], limit: Option<f64>, g: usize) -> Vec<f64> {
    let gate = Weights::of(&e.gate).matvec(x);
    let up = Weights::of(&e.up).matvec(x);
    let act: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(g, u)| {
            let s = g * sigmoid(*g);
            match limit {
                Some(lim) => s.min(lim) * u.clamp(-lim, lim),
                None => s * u,
            }
        })
        .collect();
    Weights::of(&e.down).partials(&act, g)
}

pub(super) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x / sqrt(mean(x²) + eps) · w`.
pub(super) fn rmsnorm(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
    let mean_sq = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (mean_sq + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * *w as f64).collect()
}

/// Per-head RMSNorm (weight `[128]`) then NeoX RoPE at `pos`.
pub(super) fn norm_rope_heads(x: &[f64], w: &[f32], eps: f32, pos: usize, theta: f64) -> Vec<f64> {
    let half = HEAD_DIM / 2;
    let mut out = Vec::with_capacity(x.len());
    for head in x.chunks(HEAD_DIM) {
        let n = rmsnorm(head, w, eps);
        let mut rotated = vec![0.0; HEAD_DIM];
        for i in 0..half {
            let angle = pos as f64 * theta.powf(-(2.0 * i as f64) / HEAD_DIM as f64);
            let (sin, cos) = angle.sin_cos();
            let (a, b) = (n[i], n[i + half]);
            rotated[i] = a * cos - b * sin;
            rotated[i + half] = b * cos + a * sin;
        }
        out.extend(rotated);
    }
    out
}

/// Softmax attention of every query head over the cached positions, gated per head.
pub(super) fn attention(
    q: &[f64],
    k_cache: &[f64],
    v_cache: &[f64],
    gate: &[f64],
    q_heads: usize,
    kv_heads: usize,
) -> Vec<f64> {
    let kv_width = kv_heads * HEAD_DIM;
    let positions = k_cache.len() / kv_width;
    let group = q_heads / kv_heads;
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let mut out = vec![0.0; q_heads * HEAD_DIM];
    for h in 0..q_heads {
        let qh = &q[h * HEAD_DIM..(h + 1) * HEAD_DIM];
        let kv_off = (h / group) * HEAD_DIM;
        let at = |cache: &'_ [f64], t: usize| -> Vec<f64> { cache[t * kv_width + kv_off..][..HEAD_DIM].to_vec() };
        let scores: Vec<f64> =
            (0..positions).map(|t| qh.iter().zip(at(k_cache, t)).map(|(a, b)| a * b).sum::<f64>() * scale).collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = e.iter().sum();
        let g = sigmoid(gate[h]);
        let oh = &mut out[h * HEAD_DIM..(h + 1) * HEAD_DIM];
        for (t, et) in e.iter().enumerate() {
            for (o, v) in oh.iter_mut().zip(at(v_cache, t)) {
                *o += et / total * v;
            }
        }
        oh.iter_mut().for_each(|o| *o *= g);
    }
    out
}
