//! Per-head q/k RMSNorm + NeoX RoPE, and partitioned decode attention with a per-head gate.

/// Head dimension of every preset.
pub const HEAD_DIM: usize = 128;
/// Fixed KV partition length of decode attention.
pub const ATTN_PARTITION: usize = 32;

/// For each head h of `x` (`[heads][128]`): `x_h = rmsnorm_c(x_h, w, eps)` (w has 128 entries),
/// then NeoX RoPE with the table row `cos_sin` (`[64 cos][64 sin]` for this position):
/// for i < 64: `a = x[i], b = x[i+64]; x[i] = a*c - b*s; x[i+64] = b*c + a*s` (products rounded,
/// then the difference / sum).
pub fn qk_norm_rope(x: &mut [f32], w: &[f32], eps: f32, cos_sin: &[f32]) {
    todo!("helper B: {} {} {eps} {}", x.len(), w.len(), cos_sin.len())
}

/// Decode attention of `q` (`[q_heads][128]`) over a cache of `len` positions
/// (`k`, `v`: `[len][kv_heads][128]`, position-major), `q_heads % kv_heads == 0`, q head h reads
/// kv head `h / (q_heads / kv_heads)`. Per head: `s_t = dot32(q_h, k_t) * scale` with
/// scale = 1/sqrt(128) as the f32 bits 0x3DB504F3; positions cut into partitions of
/// `ATTN_PARTITION`; per partition p (in order): `m_p = max s_t`, then for t in order
/// `e = exp_c(s_t - m_p); l_p = l_p + e; o_p[d] = o_p[d] + e * v_t[d]` from +0.0;
/// combine in partition order: `M = max m_p`, `c_p = exp_c(m_p - M)`,
/// `L = fold(l_p * c_p)`, `O[d] = fold(o_p[d] * c_p)` from +0.0; `out[d] = O[d] / L`;
/// then the gate: `out[d] = out[d] * sigmoid_c(gate[h])`.
#[allow(clippy::too_many_arguments)]
pub fn decode_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    gate: &[f32],
    len: usize,
    q_heads: usize,
    kv_heads: usize,
    out: &mut [f32],
) {
    todo!("helper B: {} {} {} {} {len} {q_heads} {kv_heads} {}", q.len(), k.len(), v.len(), gate.len(), out.len())
}
