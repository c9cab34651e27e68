//! Per-head q/k RMSNorm + NeoX RoPE, and partitioned decode attention with a per-head gate.
//!
//! Attention is where TP invariance is easiest to lose: a kernel that splits the KV sequence
//! differently, or combines partitions in another order, changes the low bits. So the partition
//! length is a constant of the program (not of the launch), partitions are combined in order,
//! and heads never interact — sharding heads over ranks changes nothing.

use crate::canon::{dot32, exp_c, rmsnorm_c, sigmoid_c};

/// Head dimension of every preset.
pub const HEAD_DIM: usize = 128;
/// Fixed KV partition length of decode attention.
pub const ATTN_PARTITION: usize = 32;
/// Bits of the attention score scale 1/sqrt(128) as an f32.
pub const ATTN_SCALE_BITS: u32 = 0x3DB5_04F3;

const HALF: usize = HEAD_DIM / 2;

/// For each head h of `x` (`[heads][128]`): `x_h = rmsnorm_c(x_h, w, eps)` (w has 128 entries),
/// then NeoX RoPE with the table row `cos_sin` (`[64 cos][64 sin]` for this position):
/// for i < 64: `a = x[i], b = x[i+64]; x[i] = a*c - b*s; x[i+64] = b*c + a*s` (products rounded,
/// then the difference / sum).
///
/// `heads = x.len() / 128`; `x.len()` must be a multiple of 128, `w` and `cos_sin` have exactly
/// 128 entries (checked; a violation panics).
pub fn qk_norm_rope(x: &mut [f32], w: &[f32], eps: f32, cos_sin: &[f32]) {
    assert_eq!(x.len() % HEAD_DIM, 0, "qk_norm_rope: x has {} elements, not whole heads of {HEAD_DIM}", x.len());
    assert_eq!(w.len(), HEAD_DIM, "qk_norm_rope: norm weight has {} entries, expected {HEAD_DIM}", w.len());
    assert_eq!(cos_sin.len(), HEAD_DIM, "qk_norm_rope: cos_sin row has {} entries, expected {HEAD_DIM}", cos_sin.len());
    let (cos, sin) = cos_sin.split_at(HALF);
    let mut normed = [0.0f32; HEAD_DIM];
    for head in x.chunks_exact_mut(HEAD_DIM) {
        rmsnorm_c(head, w, eps, &mut normed);
        let (lo, hi) = head.split_at_mut(HALF);
        let (nlo, nhi) = normed.split_at(HALF);
        for i in 0..HALF {
            let (a, b) = (nlo[i], nhi[i]);
            let (c, s) = (cos[i], sin[i]);
            lo[i] = a * c - b * s;
            hi[i] = b * c + a * s;
        }
    }
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
///
/// The last partition holds `len % ATTN_PARTITION` positions when that is not zero.
///
/// Both maxima are plain comparisons in index order: `m = first; if x > m { m = x }`. For
/// non-NaN values this is the exact maximum, whatever the order. NaN behaviour (scores are
/// finite in practice): a NaN score is skipped by the comparison unless it comes first, but it
/// reaches `exp_c` either way (`exp_c(NaN − m)` or `exp_c(s − NaN)`), so any NaN score makes
/// that head's whole output NaN; an infinite score gives `inf − inf = NaN` the same way.
///
/// Preconditions (checked; a violation panics with the numbers): `len >= 1`, `kv_heads >= 1`,
/// `q_heads % kv_heads == 0`, `q.len() == q_heads * 128`, `gate.len() == q_heads`,
/// `out.len() == q_heads * 128`, and `k`, `v` hold at least `len * kv_heads * 128` values (a cache
/// allocated for more positions is fine; only the first `len` are read). Scratch is one
/// allocation of O(len + 128·len/32) floats per call, reused across heads.
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
    decode_attention_parts(q, k, v, gate, len, q_heads, kv_heads, ATTN_PARTITION, out)
}

/// [`decode_attention`] with partitions of `part_len` positions. The program always uses
/// [`ATTN_PARTITION`]; another length is the planted defect of a verify walk whose partition
/// count depends on the pass (the `canary_verify_partitions` canary). `part_len >= 1`.
#[allow(clippy::too_many_arguments)]
pub fn decode_attention_parts(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    gate: &[f32],
    len: usize,
    q_heads: usize,
    kv_heads: usize,
    part_len: usize,
    out: &mut [f32],
) {
    assert!(part_len >= 1, "decode_attention: partition length must be at least 1");
    assert!(len >= 1, "decode_attention: len must be at least 1");
    assert!(kv_heads >= 1, "decode_attention: kv_heads must be at least 1");
    assert!(
        q_heads.is_multiple_of(kv_heads),
        "decode_attention: q_heads {q_heads} is not a multiple of kv_heads {kv_heads}"
    );
    let q_len = q_heads.checked_mul(HEAD_DIM).expect("decode_attention: q_heads * 128 overflows usize");
    assert_eq!(q.len(), q_len, "decode_attention: q has {} elements, expected q_heads {q_heads} * 128", q.len());
    assert_eq!(out.len(), q_len, "decode_attention: out has {} elements, expected q_heads {q_heads} * 128", out.len());
    assert_eq!(gate.len(), q_heads, "decode_attention: gate has {} entries, expected q_heads {q_heads}", gate.len());
    let stride = kv_heads.checked_mul(HEAD_DIM).expect("decode_attention: kv_heads * 128 overflows usize");
    let need = len.checked_mul(stride);
    assert!(
        need.is_some_and(|n| k.len() >= n && v.len() >= n),
        "decode_attention: k has {} and v has {} elements, fewer than len {len} * kv_heads {kv_heads} * 128",
        k.len(),
        v.len()
    );

    let group = q_heads / kv_heads;
    let scale = f32::from_bits(ATTN_SCALE_BITS);
    let n_parts = len.div_ceil(part_len);
    let mut scores = vec![0.0f32; len];
    let mut part_m = vec![0.0f32; n_parts];
    let mut part_l = vec![0.0f32; n_parts];
    let mut part_o = vec![0.0f32; n_parts * HEAD_DIM];

    for (h, (q_h, out_h)) in q.chunks_exact(HEAD_DIM).zip(out.chunks_exact_mut(HEAD_DIM)).enumerate() {
        let kv_off = (h / group) * HEAD_DIM;
        let row = |cache, t| kv_row(cache, t, stride, kv_off);

        for (t, s) in scores.iter_mut().enumerate() {
            *s = dot32(q_h, row(k, t)) * scale;
        }

        for (p, ((s_p, (m_p, l_p)), o_p)) in scores
            .chunks(part_len)
            .zip(part_m.iter_mut().zip(part_l.iter_mut()))
            .zip(part_o.chunks_exact_mut(HEAD_DIM))
            .enumerate()
        {
            let m = max_in_order(s_p);
            let mut l = 0.0f32;
            o_p.fill(0.0);
            for (j, &s) in s_p.iter().enumerate() {
                let e = exp_c(s - m);
                l += e;
                for (o, &vd) in o_p.iter_mut().zip(row(v, p * part_len + j)) {
                    *o += e * vd;
                }
            }
            *m_p = m;
            *l_p = l;
        }

        let m_all = max_in_order(&part_m);
        let mut l_all = 0.0f32;
        out_h.fill(0.0);
        for ((&m_p, &l_p), o_p) in part_m.iter().zip(&part_l).zip(part_o.chunks_exact(HEAD_DIM)) {
            let c = exp_c(m_p - m_all);
            l_all += l_p * c;
            for (o, &od) in out_h.iter_mut().zip(o_p) {
                *o += od * c;
            }
        }
        let g = sigmoid_c(gate[h]);
        for o in out_h.iter_mut() {
            *o /= l_all;
            *o *= g;
        }
    }
}

/// Row of kv head at offset `kv_off` of position `t` in a position-major cache.
fn kv_row(cache: &[f32], t: usize, stride: usize, kv_off: usize) -> &[f32] {
    let start = t * stride + kv_off;
    &cache[start..start + HEAD_DIM]
}

/// Maximum by plain comparisons in index order (`m = xs[0]; if x > m { m = x }`); `xs` is not
/// empty. A leading NaN stays; a later NaN is skipped.
fn max_in_order(xs: &[f32]) -> f32 {
    let mut m = xs[0];
    for &x in &xs[1..] {
        if x > m {
            m = x;
        }
    }
    m
}

/// Twin of `qk_norm_rope_at_f32` (the GRAPH door's position-independent launch): [`qk_norm_rope`]
/// with the row `pos` of `table` (`[positions][128]`). When `pos >= positions` nothing is
/// written and `false` is returned — the kernel cannot report an error, so both sides leave `x`
/// untouched and the seam digest shows it.
pub fn qk_norm_rope_at(x: &mut [f32], w: &[f32], eps: f32, table: &[f32], pos: u32) -> bool {
    assert_eq!(table.len() % HEAD_DIM, 0, "qk_norm_rope_at: table has {} values, not rows of {HEAD_DIM}", table.len());
    let p = pos as usize;
    if p >= table.len() / HEAD_DIM {
        return false;
    }
    qk_norm_rope(x, w, eps, &table[p * HEAD_DIM..(p + 1) * HEAD_DIM]);
    true
}

/// Twin of `decode_attention_at_f32`: [`decode_attention_parts`] over `pos + 1` positions of
/// caches holding `max_len`, partitions of `part_len` (the program's: [`ATTN_PARTITION`]); nothing is written (and `false` returned) when `pos >= max_len`.
#[allow(clippy::too_many_arguments)]
pub fn decode_attention_at(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    gate: &[f32],
    pos: u32,
    max_len: usize,
    q_heads: usize,
    kv_heads: usize,
    part_len: usize,
    out: &mut [f32],
) -> bool {
    if pos as usize >= max_len {
        return false;
    }
    decode_attention_parts(q, k, v, gate, pos as usize + 1, q_heads, kv_heads, part_len, out);
    true
}

/// Twin of `append_at_f32`: `cache[pos * src.len() ..][.. src.len()] = src` when the row fits
/// (`(pos + 1) * src.len() <= cache.len()`); otherwise nothing is written and `false` returned.
pub fn append_at(src: &[f32], cache: &mut [f32], pos: u32) -> bool {
    let n = src.len();
    let start = pos as usize * n;
    match cache.get_mut(start..start + n) {
        Some(dst) if n > 0 => {
            dst.copy_from_slice(src);
            true
        }
        _ => false,
    }
}

/// Twin of `rope_append_f32`, the rope seam in one launch: at position `pos`,
/// `q_out = qk_norm_rope(q, q_norm)` and `k_out = qk_norm_rope(k, k_norm)` with row `pos` of
/// `table` (`[positions][128]`); then `k_out` is stored at row `pos` of `k_cache` and `v` at row
/// `pos` of `v_cache` (rows of `k.len()` values). Nothing is written (and `false` returned) when
/// `pos` is outside the table or the cache — the kernel cannot report an error, so both sides
/// leave every output untouched and the seam digest shows it.
///
/// `q`, `q_out` and `k`, `k_out`, `v` have whole heads of 128 (`v.len() == k.len()`, checked).
#[allow(clippy::too_many_arguments)]
pub fn rope_append(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    norms: (&[f32], &[f32]),
    eps: f32,
    table: &[f32],
    pos: u32,
    q_out: &mut [f32],
    k_out: &mut [f32],
    caches: (&mut [f32], &mut [f32]),
) -> bool {
    let (k_cache, v_cache) = caches;
    assert_eq!(v.len(), k.len(), "rope_append: v has {} values, k {}", v.len(), k.len());
    assert_eq!(q_out.len(), q.len(), "rope_append: q_out has {} values, q {}", q_out.len(), q.len());
    assert_eq!(k_out.len(), k.len(), "rope_append: k_out has {} values, k {}", k_out.len(), k.len());
    assert_eq!(table.len() % HEAD_DIM, 0, "rope_append: table has {} values, not rows of {HEAD_DIM}", table.len());
    let (p, row) = (pos as usize, k.len());
    let cache_positions = k_cache.len().min(v_cache.len()).checked_div(row).unwrap_or(0);
    if p >= table.len() / HEAD_DIM || p >= cache_positions {
        return false;
    }
    let cs = &table[p * HEAD_DIM..(p + 1) * HEAD_DIM];
    q_out.copy_from_slice(q);
    qk_norm_rope(q_out, norms.0, eps, cs);
    k_out.copy_from_slice(k);
    qk_norm_rope(k_out, norms.1, eps, cs);
    k_cache[p * row..(p + 1) * row].copy_from_slice(k_out);
    v_cache[p * row..(p + 1) * row].copy_from_slice(v);
    true
}
