//! Tests of the host twins in `twins/{norm,attention,moe,digest}.rs`.
//!
//! Two kinds of evidence, as docs/DESIGN.md §3.4 asks:
//! - **value**: every twin against an independent f64 reference written plainly here (no
//!   canonical order), within a stated two-sided bound `|got − ref| ≤ atol + rtol·|ref|` where
//!   NaN never passes;
//! - **order**: where the documented operation order is observable in the bits, inputs crafted
//!   (or searched for) so that another order gives other bits, and a bitwise comparison.
//!
//! Every order test also checks its own premise (that the alternative order really differs), so
//! it cannot pass vacuously.

use memra_kernels::canon::{exp_c, rmsnorm_c, rmsnorm_row_c, sigmoid_c, silu_c, swiglu_c, swiglu_folded};
use memra_kernels::twins::attention::{decode_attention, qk_norm_rope, ATTN_PARTITION, ATTN_SCALE_BITS, HEAD_DIM};
use memra_kernels::twins::digest::{digest_f32, digest_u32, splitmix64};
use memra_kernels::twins::moe::{
    argmax, combine_scaled, combine_shared, combine_slots, router_topk, router_topk_device_variant,
    sigmoid_device_variant, swiglu,
};
use memra_kernels::twins::norm::{add_rmsnorm, rmsnorm_rows};

// ---------------------------------------------------------------------------------------------
// Utilities
// ---------------------------------------------------------------------------------------------

use crate::util::Rng;

/// Two-sided bound check; NaN (in either) never passes. Panics with the count of bad elements,
/// the first bad index and its values.
#[track_caller]
fn assert_close(what: &str, got: &[f32], reference: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), reference.len(), "{what}: length");
    if let Some(msg) = close_report(got, reference, atol, rtol) {
        panic!("{what}: {msg} (atol {atol:e}, rtol {rtol:e})");
    }
}

fn close_report(got: &[f32], reference: &[f64], atol: f64, rtol: f64) -> Option<String> {
    let mut bad = 0usize;
    let mut first = None;
    for (i, (&g, &r)) in got.iter().zip(reference).enumerate() {
        let ok = (g as f64 - r).abs() <= atol + rtol * r.abs();
        if !ok {
            bad += 1;
            first.get_or_insert((i, g, r));
        }
    }
    first.map(|(i, g, r)| {
        format!(
            "{bad} of {} outside the bound; first at [{i}]: got {g:e} (bits {:#010x}), ref {r:e}",
            got.len(),
            g.to_bits()
        )
    })
}

/// Bitwise comparison; reports the count of differing elements and the first one.
#[track_caller]
fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let diff: Vec<usize> = (0..got.len()).filter(|&i| got[i].to_bits() != want[i].to_bits()).collect();
    if let Some(&i) = diff.first() {
        panic!(
            "{what}: {} of {} elements differ; first at [{i}]: got {:e} ({:#010x}), want {:e} ({:#010x})",
            diff.len(),
            got.len(),
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

fn bits_differ(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits())
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu64(x: f64) -> f64 {
    x * sigmoid64(x)
}

fn rmsnorm64(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let inv = 1.0 / (ss / x.len() as f64 + eps as f64).sqrt();
    x.iter().zip(w).map(|(&v, &wi)| v as f64 * inv * wi as f64).collect()
}

#[test]
fn assert_close_rejects_nan_and_out_of_bound() {
    assert!(close_report(&[1.0], &[1.0], 0.0, 0.0).is_none());
    assert!(close_report(&[f32::NAN], &[1.0], 1e9, 1e9).is_some(), "NaN got must fail");
    assert!(close_report(&[1.0], &[f64::NAN], 1e9, 1e9).is_some(), "NaN ref must fail");
    assert!(close_report(&[1.001], &[1.0], 0.0, 1e-4).is_some(), "out of rtol must fail");
    assert!(close_report(&[0.999], &[1.0], 0.0, 1e-4).is_some(), "two-sided");
    assert!(close_report(&[1.00005], &[1.0], 0.0, 1e-4).is_none());
}

// ---------------------------------------------------------------------------------------------
// norm.rs
// ---------------------------------------------------------------------------------------------

/// RMSNorm error bound: ss = Σx² of ≤ 2048 positive terms in 32 lanes of ≤ 64 terms + 5
/// butterfly levels has relative error ≤ ~70·2^−24 ≈ 4.2e−6 worst case; inv adds half of that
/// plus 2 roundings, y two more. No cancellation anywhere, so a pure relative bound.
const NORM_RTOL: f64 = 1e-5;

#[test]
fn rmsnorm_rows_matches_f64_reference() {
    let mut rng = Rng::new(1);
    for &(width, rows) in &[(1024usize, 3usize), (2048, 2), (128, 5), (1000, 1), (33, 4)] {
        let x = rng.vec(width * rows, -3.0, 3.0);
        let w = rng.vec(width, 0.5, 1.5);
        let eps = 1e-6f32;
        let mut y = vec![f32::NAN; x.len()];
        rmsnorm_rows(&x, &w, eps, &mut y);
        let reference: Vec<f64> = x.chunks(width).flat_map(|r| rmsnorm64(r, &w, eps)).collect();
        assert_close(&format!("rmsnorm_rows width {width} rows {rows}"), &y, &reference, 0.0, NORM_RTOL);
    }
}

#[test]
fn rmsnorm_rows_normalises_each_row_on_its_own() {
    // Rows of very different scale: a norm over the whole batch would leave the small row tiny.
    let width = 256;
    let mut rng = Rng::new(2);
    let mut x = rng.vec(width, -1.0, 1.0);
    x.extend(rng.vec(width, -1000.0, 1000.0));
    let w = vec![1.0f32; width];
    let mut y = vec![0.0; 2 * width];
    rmsnorm_rows(&x, &w, 1e-6, &mut y);
    let mut want = vec![0.0; 2 * width];
    for (xr, yr) in x.chunks(width).zip(want.chunks_mut(width)) {
        rmsnorm_row_c(xr, &w, 1e-6, yr);
    }
    assert_bits_eq("rmsnorm_rows vs rmsnorm_row_c per row", &y, &want);
    for row in y.chunks(width) {
        let rms = (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / width as f64).sqrt();
        assert!((rms - 1.0).abs() < 1e-4, "row rms {rms}");
    }
}

#[test]
fn add_rmsnorm_is_add_then_canonical_norm() {
    let mut rng = Rng::new(3);
    let (width, rows) = (1024, 2);
    let x = rng.vec(width * rows, -2.0, 2.0);
    let a = rng.vec(width * rows, -2.0, 2.0);
    let w = rng.vec(width, 0.5, 1.5);
    let eps = 1e-5f32;
    let mut h = vec![f32::NAN; x.len()];
    let mut y = vec![f32::NAN; x.len()];
    add_rmsnorm(&x, &a, &w, eps, &mut h, &mut y);

    let h_want: Vec<f32> = x.iter().zip(&a).map(|(&p, &q)| p + q).collect();
    assert_bits_eq("add_rmsnorm h", &h, &h_want);
    let mut y_want = vec![0.0; x.len()];
    rmsnorm_rows(&h_want, &w, eps, &mut y_want);
    assert_bits_eq("add_rmsnorm y vs add + rmsnorm_rows", &y, &y_want);

    // Value: against f64 of (x + a) computed in f64 (the f32 add is one rounding, ≤ 2^−24 rel,
    // but x + a can cancel: bound the absolute error by the operands' size).
    let reference: Vec<f64> = x
        .chunks(width)
        .zip(a.chunks(width))
        .flat_map(|(xr, ar)| {
            let h64: Vec<f64> = xr.iter().zip(ar).map(|(&p, &q)| p as f64 + q as f64).collect();
            let ss: f64 = h64.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss / width as f64 + eps as f64).sqrt();
            h64.iter().zip(&w).map(move |(v, &wi)| v * inv * wi as f64).collect::<Vec<_>>()
        })
        .collect();
    assert_close("add_rmsnorm y vs f64", &y, &reference, 1e-6, NORM_RTOL);
}

// ---------------------------------------------------------------------------------------------
// attention.rs
// ---------------------------------------------------------------------------------------------

/// NeoX RoPE row for position `pos`: `[64 cos][64 sin]` of pos · 10000^(−2i/128), from f64.
fn rope_row(pos: usize) -> Vec<f32> {
    let half = HEAD_DIM / 2;
    let theta: Vec<f64> = (0..half).map(|i| pos as f64 * 10000f64.powf(-(2.0 * i as f64) / HEAD_DIM as f64)).collect();
    theta.iter().map(|t| t.cos() as f32).chain(theta.iter().map(|t| t.sin() as f32)).collect()
}

#[test]
fn qk_norm_rope_matches_f64_reference() {
    let mut rng = Rng::new(10);
    let heads = 8;
    let w = rng.vec(HEAD_DIM, 0.5, 1.5);
    for &pos in &[1usize, 7, 300, 4095] {
        let x0 = rng.vec(heads * HEAD_DIM, -2.0, 2.0);
        let cs = rope_row(pos);
        let mut x = x0.clone();
        qk_norm_rope(&mut x, &w, 1e-6, &cs);
        let mut reference = Vec::new();
        for head in x0.chunks(HEAD_DIM) {
            let n = rmsnorm64(head, &w, 1e-6);
            let (lo, hi) = n.split_at(HEAD_DIM / 2);
            let mut out = vec![0.0f64; HEAD_DIM];
            for i in 0..HEAD_DIM / 2 {
                let (c, s) = (cs[i] as f64, cs[HEAD_DIM / 2 + i] as f64);
                out[i] = lo[i] * c - hi[i] * s;
                out[i + HEAD_DIM / 2] = hi[i] * c + lo[i] * s;
            }
            reference.extend(out);
        }
        // The rotation can cancel: absolute error ≈ rel error of the normed pair × its size
        // (normed values are ≤ ~4.5 here), plus 3 roundings.
        assert_close(&format!("qk_norm_rope pos {pos}"), &x, &reference, 5e-5, 1e-5);
    }
}

#[test]
fn qk_norm_rope_at_position_zero_is_pure_norm() {
    let mut rng = Rng::new(11);
    let heads = 4;
    let x0 = rng.vec(heads * HEAD_DIM, -2.0, 2.0);
    let w = rng.vec(HEAD_DIM, 0.5, 1.5);
    let cs = rope_row(0);
    assert!(cs[..64].iter().all(|&c| c == 1.0) && cs[64..].iter().all(|&s| s == 0.0));
    let mut x = x0.clone();
    qk_norm_rope(&mut x, &w, 1e-6, &cs);
    let mut want = vec![0.0; x0.len()];
    for (xr, yr) in x0.chunks(HEAD_DIM).zip(want.chunks_mut(HEAD_DIM)) {
        rmsnorm_c(xr, &w, 1e-6, yr);
    }
    assert_bits_eq("rope at pos 0", &x, &want);
}

#[test]
fn qk_norm_rope_pairs_i_with_i_plus_64() {
    // A quarter turn (cos 0, sin 1 exactly) maps (a, b) → (−b, a) on the NeoX pairs (i, i+64);
    // an interleaved (2i, 2i+1) RoPE would give other values.
    let mut rng = Rng::new(12);
    let x0 = rng.vec(HEAD_DIM, -2.0, 2.0);
    let w = vec![1.0f32; HEAD_DIM];
    let mut cs = vec![0.0f32; 64];
    cs.extend(vec![1.0f32; 64]);
    let mut x = x0.clone();
    qk_norm_rope(&mut x, &w, 1e-6, &cs);
    let mut n = vec![0.0; HEAD_DIM];
    rmsnorm_c(&x0, &w, 1e-6, &mut n);
    let want: Vec<f32> = (0..HEAD_DIM).map(|i| if i < 64 { 0.0 - n[i + 64] } else { n[i - 64] }).collect();
    assert_bits_eq("quarter-turn rope", &x, &want);
}

/// Plain f64 attention: softmax over all positions, no partitions, gate sigmoid in f64.
fn attention64(q: &[f32], k: &[f32], v: &[f32], gate: &[f32], len: usize, q_heads: usize, kv_heads: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; q_heads * HEAD_DIM];
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    for h in 0..q_heads {
        let g = h * kv_heads / q_heads;
        let qh = &q[h * HEAD_DIM..(h + 1) * HEAD_DIM];
        let at = |c: &[f32], t: usize, d: usize| c[(t * kv_heads + g) * HEAD_DIM + d] as f64;
        let s: Vec<f64> =
            (0..len).map(|t| (0..HEAD_DIM).map(|d| qh[d] as f64 * at(k, t, d)).sum::<f64>() * scale).collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = e.iter().sum();
        let sg = sigmoid64(gate[h] as f64);
        for d in 0..HEAD_DIM {
            let o: f64 = (0..len).map(|t| e[t] * at(v, t, d)).sum();
            out[h * HEAD_DIM + d] = o / l * sg;
        }
    }
    out
}

/// Literal f32 transcription of the documented partition algorithm, with the partition length
/// as a parameter (32 is the contract; others are negative controls). Index loops on purpose:
/// it reads like the doc comment it transcribes.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
fn attention_transcribed(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    gate: &[f32],
    len: usize,
    q_heads: usize,
    kv_heads: usize,
    part: usize,
) -> Vec<f32> {
    let scale = f32::from_bits(0x3DB5_04F3);
    let mut out = vec![0.0f32; q_heads * HEAD_DIM];
    for h in 0..q_heads {
        let g = h / (q_heads / kv_heads);
        let qh = &q[h * HEAD_DIM..(h + 1) * HEAD_DIM];
        let row = |c: &[f32], t: usize| c[(t * kv_heads + g) * HEAD_DIM..][..HEAD_DIM].to_vec();
        let s: Vec<f32> = (0..len).map(|t| memra_kernels::canon::dot32(qh, &row(k, t)) * scale).collect();
        let mut ms = Vec::new();
        let mut ls = Vec::new();
        let mut os = Vec::new();
        let mut t0 = 0;
        while t0 < len {
            let t1 = (t0 + part).min(len);
            let mut m = s[t0];
            for &x in &s[t0 + 1..t1] {
                if x > m {
                    m = x;
                }
            }
            let mut l = 0.0f32;
            let mut o = vec![0.0f32; HEAD_DIM];
            for t in t0..t1 {
                let e = exp_c(s[t] - m);
                l += e;
                let vt = row(v, t);
                for d in 0..HEAD_DIM {
                    o[d] += e * vt[d];
                }
            }
            ms.push(m);
            ls.push(l);
            os.push(o);
            t0 = t1;
        }
        let mut big_m = ms[0];
        for &m in &ms[1..] {
            if m > big_m {
                big_m = m;
            }
        }
        let mut big_l = 0.0f32;
        let mut big_o = vec![0.0f32; HEAD_DIM];
        for p in 0..ms.len() {
            let c = exp_c(ms[p] - big_m);
            big_l += ls[p] * c;
            for d in 0..HEAD_DIM {
                big_o[d] += os[p][d] * c;
            }
        }
        let sg = sigmoid_c(gate[h]);
        for d in 0..HEAD_DIM {
            out[h * HEAD_DIM + d] = big_o[d] / big_l * sg;
        }
    }
    out
}

struct AttnCase {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    gate: Vec<f32>,
}

/// q scaled so scores spread over a few units (a peaked, not uniform, softmax).
fn attn_case(rng: &mut Rng, len: usize, q_heads: usize, kv_heads: usize) -> AttnCase {
    AttnCase {
        q: rng.vec(q_heads * HEAD_DIM, -4.0, 4.0),
        k: rng.vec(len * kv_heads * HEAD_DIM, -1.0, 1.0),
        v: rng.vec(len * kv_heads * HEAD_DIM, -2.0, 2.0),
        gate: rng.vec(q_heads, -3.0, 3.0),
    }
}

fn run_attention(c: &AttnCase, len: usize, q_heads: usize, kv_heads: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; q_heads * HEAD_DIM];
    decode_attention(&c.q, &c.k, &c.v, &c.gate, len, q_heads, kv_heads, &mut out);
    out
}

/// Attention bound: score error ≈ 40·2^−24·Σ|q_i k_i| ≈ 3e−4 before the 1/√128 scale, so each
/// softmax weight is off by ≲ 1e−4 relative; the output (a convex combination of |v| ≤ 2, times a
/// gate ≤ 1) then has absolute error ≲ 2e−4·max|v| at the very worst, typically far less.
const ATTN_ATOL: f64 = 2e-4;
const ATTN_RTOL: f64 = 1e-4;

#[test]
fn decode_attention_matches_f64_reference() {
    let mut rng = Rng::new(20);
    for &(len, qh, kvh) in &[(1usize, 8usize, 8usize), (31, 8, 8), (32, 8, 8), (33, 16, 8), (70, 16, 8), (300, 4, 1)] {
        let c = attn_case(&mut rng, len, qh, kvh);
        let out = run_attention(&c, len, qh, kvh);
        let reference = attention64(&c.q, &c.k, &c.v, &c.gate, len, qh, kvh);
        assert_close(&format!("attention len {len} q {qh} kv {kvh}"), &out, &reference, ATTN_ATOL, ATTN_RTOL);
    }
}

#[test]
fn decode_attention_scale_constant_is_inverse_sqrt_128() {
    let s = f32::from_bits(ATTN_SCALE_BITS);
    assert_eq!(s, (1.0f64 / 128f64.sqrt()) as f32, "0x3DB504F3 must be 1/sqrt(128) rounded to f32");
    assert_eq!(ATTN_PARTITION, 32);
}

#[test]
fn decode_attention_partition_combine_is_bit_exact_for_ragged_len() {
    // len not a multiple of 32: 3 full partitions + a ragged one of 6, and a single ragged one.
    let mut rng = Rng::new(21);
    for &len in &[102usize, 17, 257] {
        let (qh, kvh) = (16, 8);
        let c = attn_case(&mut rng, len, qh, kvh);
        let out = run_attention(&c, len, qh, kvh);
        let want = attention_transcribed(&c.q, &c.k, &c.v, &c.gate, len, qh, kvh, ATTN_PARTITION);
        assert_bits_eq(&format!("attention len {len} vs documented partitions"), &out, &want);
        if len > ATTN_PARTITION {
            // Premise: the partition structure is visible in the bits.
            for other in [16, len] {
                let alt = attention_transcribed(&c.q, &c.k, &c.v, &c.gate, len, qh, kvh, other);
                assert!(bits_differ(&alt, &want), "len {len}: partition {other} gives the same bits as 32");
            }
        }
    }
}

#[test]
fn decode_attention_len_one_is_gated_v() {
    assert_eq!(exp_c(0.0), 1.0, "premise: exp_c(0) = 1 exactly");
    let mut rng = Rng::new(22);
    let (qh, kvh) = (16, 8);
    let c = attn_case(&mut rng, 1, qh, kvh);
    let out = run_attention(&c, 1, qh, kvh);
    let want: Vec<f32> = (0..qh * HEAD_DIM)
        .map(|i| c.v[(i / HEAD_DIM / 2) * HEAD_DIM + i % HEAD_DIM] * sigmoid_c(c.gate[i / HEAD_DIM]))
        .collect();
    assert_bits_eq("len 1: out = v · sigmoid_c(gate)", &out, &want);
}

#[test]
fn decode_attention_accumulates_from_plus_zero() {
    // A v column that is −0.0 at every position: every product e·v is −0.0, so only the +0.0
    // start of the folds makes the output +0.0 (a fold seeded with its first term keeps −0.0).
    let mut rng = Rng::new(27);
    let (len, qh, kvh) = (50, 4, 2);
    let mut c = attn_case(&mut rng, len, qh, kvh);
    let d0 = 5;
    for t in 0..len {
        for g in 0..kvh {
            c.v[(t * kvh + g) * HEAD_DIM + d0] = -0.0;
        }
    }
    let out = run_attention(&c, len, qh, kvh);
    for h in 0..qh {
        assert_eq!(out[h * HEAD_DIM + d0].to_bits(), 0, "head {h}: −0.0 column must give +0.0");
    }
    let want = attention_transcribed(&c.q, &c.k, &c.v, &c.gate, len, qh, kvh, ATTN_PARTITION);
    assert_bits_eq("−0.0 column vs transcription", &out, &want);
}

#[test]
fn decode_attention_gqa_maps_q_head_to_kv_head_h_div_2() {
    // v constant over positions per kv head, distinct across kv heads: the output of q head h is
    // then v[h / 2] · sigmoid(gate[h]) whatever the scores.
    let mut rng = Rng::new(23);
    let (len, qh, kvh) = (45, 16, 8);
    let mut c = attn_case(&mut rng, len, qh, kvh);
    let vh: Vec<Vec<f32>> =
        (0..kvh).map(|g| (0..HEAD_DIM).map(|d| (g + 1) as f32 + d as f32 / 256.0).collect()).collect();
    for t in 0..len {
        for (g, vg) in vh.iter().enumerate() {
            c.v[(t * kvh + g) * HEAD_DIM..][..HEAD_DIM].copy_from_slice(vg);
        }
    }
    let out = run_attention(&c, len, qh, kvh);
    let reference: Vec<f64> = (0..qh * HEAD_DIM)
        .map(|i| vh[i / HEAD_DIM / 2][i % HEAD_DIM] as f64 * sigmoid64(c.gate[i / HEAD_DIM] as f64))
        .collect();
    assert_close("GQA h -> h/2", &out, &reference, 0.0, 1e-5);
}

#[test]
fn decode_attention_equal_scores_give_mean_of_v() {
    let mut rng = Rng::new(24);
    let (len, qh, kvh) = (77, 8, 8);
    let mut c = attn_case(&mut rng, len, qh, kvh);
    c.q.iter_mut().for_each(|x| *x = 0.0); // every score is exactly 0
    let out = run_attention(&c, len, qh, kvh);
    let mut reference = vec![0.0f64; qh * HEAD_DIM];
    for h in 0..qh {
        for d in 0..HEAD_DIM {
            let mean = (0..len).map(|t| c.v[(t * kvh + h) * HEAD_DIM + d] as f64).sum::<f64>() / len as f64;
            reference[h * HEAD_DIM + d] = mean * sigmoid64(c.gate[h] as f64);
        }
    }
    // Sum of 77 values |v| ≤ 2 in f32: absolute error ≤ 77·2·2^−24 ≈ 1e−5, divided by 77.
    assert_close("equal scores -> mean of v", &out, &reference, 1e-6, 1e-5);
}

#[test]
fn decode_attention_reads_only_len_positions() {
    let mut rng = Rng::new(25);
    let (len, cap, qh, kvh) = (40, 64, 8, 4);
    let c = attn_case(&mut rng, len, qh, kvh);
    let out = run_attention(&c, len, qh, kvh);
    let mut k = c.k.clone();
    let mut v = c.v.clone();
    k.resize(cap * kvh * HEAD_DIM, f32::NAN);
    v.resize(cap * kvh * HEAD_DIM, f32::NAN);
    let mut out_cap = vec![0.0; qh * HEAD_DIM];
    decode_attention(&c.q, &k, &v, &c.gate, len, qh, kvh, &mut out_cap);
    assert_bits_eq("cache with spare NaN positions", &out_cap, &out);
}

#[test]
fn decode_attention_nan_score_poisons_its_head_only() {
    let mut rng = Rng::new(26);
    let (len, qh, kvh) = (40, 4, 4);
    let mut c = attn_case(&mut rng, len, qh, kvh);
    c.k[(35 * kvh + 2) * HEAD_DIM] = f32::NAN; // position 35, kv head 2 → q head 2
    let out = run_attention(&c, len, qh, kvh);
    for h in 0..qh {
        let head = &out[h * HEAD_DIM..(h + 1) * HEAD_DIM];
        if h == 2 {
            assert!(head.iter().all(|x| x.is_nan()), "head 2 must be NaN");
        } else {
            assert!(head.iter().all(|x| x.is_finite()), "head {h} must stay finite");
        }
    }
}

#[test]
#[should_panic(expected = "len must be at least 1")]
fn decode_attention_refuses_empty_cache() {
    let q = vec![0.0; HEAD_DIM];
    let mut out = vec![0.0; HEAD_DIM];
    decode_attention(&q, &[], &[], &[0.0], 0, 1, 1, &mut out);
}

#[test]
#[should_panic(expected = "fewer than len")]
fn decode_attention_refuses_short_cache() {
    let q = vec![0.0; HEAD_DIM];
    let kv = vec![0.0; 2 * HEAD_DIM];
    let mut out = vec![0.0; HEAD_DIM];
    decode_attention(&q, &kv, &kv, &[0.0], 3, 1, 1, &mut out);
}

// ---------------------------------------------------------------------------------------------
// moe.rs: router
// ---------------------------------------------------------------------------------------------

/// f64 router reference: (ids, weights) and the smallest key gap around the selection (between
/// consecutive selected keys and across the selection boundary).
fn router64(logits: &[f32], bias: &[f32], k: usize, normalize: bool, scaling: f32) -> (Vec<u32>, Vec<f64>, f64) {
    let scores: Vec<f64> = logits.iter().map(|&l| sigmoid64(l as f64)).collect();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let key = |e: usize| scores[e] + bias[e] as f64;
    order.sort_by(|&a, &b| key(b).partial_cmp(&key(a)).unwrap().then(a.cmp(&b)));
    let gap = (0..k.min(order.len().saturating_sub(1)))
        .map(|i| key(order[i]) - key(order[i + 1]))
        .fold(f64::INFINITY, f64::min);
    let sel = &order[..k];
    let sum: f64 = sel.iter().map(|&e| scores[e]).sum();
    let w = sel.iter().map(|&e| if normalize { scores[e] / sum } else { scores[e] } * scaling as f64).collect();
    (sel.iter().map(|&e| e as u32).collect(), w, gap)
}

/// Weights: sigmoid ≤ 3 ulp, normalisation a sum of ≤ 8 terms and one division, scaling one
/// product: ≤ ~15·2^−24 ≈ 1e−6 relative; stated bound 1e−5.
const ROUTER_RTOL: f64 = 1e-5;

fn check_router_against_f64(variant: bool) {
    let mut rng = Rng::new(if variant { 31 } else { 30 });
    let mut compared = 0;
    let mut total = 0;
    for &(n, k) in &[(8usize, 2usize), (32, 4), (288, 8)] {
        for &(normalize, scaling) in &[(true, 1.0f32), (true, 2.5), (false, 1.0), (false, 0.75)] {
            for _ in 0..20 {
                total += 1;
                let logits = rng.vec(n, -6.0, 6.0);
                let bias = rng.vec(n, -0.05, 0.05);
                let (ids, w) = if variant {
                    router_topk_device_variant(&logits, &bias, k, normalize, scaling)
                } else {
                    router_topk(&logits, &bias, k, normalize, scaling)
                };
                let (rids, rw, gap) = router64(&logits, &bias, k, normalize, scaling);
                if gap < 1e-6 {
                    continue; // near tie: f32 keys may legitimately order differently
                }
                compared += 1;
                assert_eq!(ids, rids, "n {n} k {k} ids");
                assert_close(&format!("n {n} k {k} norm {normalize} scale {scaling}"), &w, &rw, 0.0, ROUTER_RTOL);
            }
        }
    }
    assert!(compared * 4 >= total * 3, "only {compared} of {total} cases were separated enough to compare");
}

#[test]
fn router_topk_matches_f64_reference() {
    check_router_against_f64(false);
}

#[test]
fn router_topk_device_variant_matches_f64_reference() {
    check_router_against_f64(true);
}

#[test]
fn router_ties_go_to_lower_id_and_device_variant_to_higher() {
    // All experts equal: canonical takes 0, 1, 2; the device variant 7, 6, 5.
    let logits = vec![0.5f32; 8];
    let bias = vec![0.0f32; 8];
    assert_eq!(router_topk(&logits, &bias, 3, false, 1.0).0, vec![0, 1, 2]);
    assert_eq!(router_topk_device_variant(&logits, &bias, 3, false, 1.0).0, vec![7, 6, 5]);

    // A clear winner (3), then a tie between 2 and 5, above everyone else.
    let mut logits = vec![-1.0f32; 8];
    logits[3] = 2.0;
    logits[2] = 1.0;
    logits[5] = 1.0;
    assert_eq!(router_topk(&logits, &bias, 3, false, 1.0).0, vec![3, 2, 5]);
    assert_eq!(router_topk_device_variant(&logits, &bias, 3, false, 1.0).0, vec![3, 5, 2]);

    // −0.0 and +0.0 keys tie.
    let logits = vec![f32::NEG_INFINITY; 4]; // score +0.0
    let bias = vec![0.0, -0.0, 0.0, -0.0];
    assert_eq!(router_topk(&logits, &bias, 2, false, 1.0).0, vec![0, 1]);
}

#[test]
fn router_selects_on_score_plus_bias_but_weights_are_raw_scores() {
    let logits = [2.0f32, -2.0, 0.0, -3.0];
    let bias = [0.0f32, 1.0, 0.0, 0.0];
    // keys: 0.881, 1.119, 0.5, 0.047 → slots 1, 0.
    let (ids, w) = router_topk(&logits, &bias, 2, false, 1.0);
    assert_eq!(ids, vec![1, 0]);
    assert_bits_eq("raw scores", &w, &[sigmoid_c(-2.0), sigmoid_c(2.0)]);
    let (ids, w) = router_topk(&logits, &bias, 2, false, 3.0);
    assert_eq!(ids, vec![1, 0]);
    assert_bits_eq("scaled raw scores", &w, &[sigmoid_c(-2.0) * 3.0, sigmoid_c(2.0) * 3.0]);
}

#[test]
fn router_normalises_by_the_slot_order_sum_then_scales() {
    // Search seeds for a case where every plausible alternative gives other bits than the
    // contract: the sum in expert-id order, the f64 sum, and the scaling folded differently.
    let (n, k, scaling) = (64usize, 8usize, 2.5f32);
    let mut found = false;
    for seed in 0..500u64 {
        let mut rng = Rng::new(1000 + seed);
        let logits = rng.vec(n, -6.0, 6.0);
        let bias = rng.vec(n, -1.0, 1.0); // strong bias: slot order far from score order
        let (ids, w) = router_topk(&logits, &bias, k, true, scaling);
        let s: Vec<f32> = ids.iter().map(|&e| sigmoid_c(logits[e as usize])).collect();
        let slot_sum = s.iter().fold(0.0f32, |a, &x| a + x);
        let want: Vec<f32> = s.iter().map(|&x| (x / slot_sum) * scaling).collect();
        assert_bits_eq(&format!("seed {seed}: (s / slot-order sum) · scaling"), &w, &want);

        let mut by_id: Vec<(u32, f32)> = ids.iter().cloned().zip(s.iter().cloned()).collect();
        by_id.sort_by_key(|p| p.0);
        let id_sum = by_id.iter().fold(0.0f32, |a, p| a + p.1);
        let f64_sum = s.iter().map(|&x| x as f64).sum::<f64>() as f32;
        let alternatives: [Vec<f32>; 4] = [
            s.iter().map(|&x| (x / id_sum) * scaling).collect(),
            s.iter().map(|&x| (x / f64_sum) * scaling).collect(),
            s.iter().map(|&x| (x * scaling) / slot_sum).collect(),
            s.iter().map(|&x| x * (scaling / slot_sum)).collect(),
        ];
        if slot_sum != id_sum && alternatives.iter().all(|a| bits_differ(a, &want)) {
            found = true;
            break;
        }
    }
    assert!(found, "no seed discriminates the slot-order sum from the alternatives");
}

#[test]
fn router_edge_cases() {
    let logits = [0.3f32, f32::NAN, -0.2, 1.0];
    let bias = [0.0f32; 4];
    // NaN key ranks below every number, so expert 1 comes last.
    assert_eq!(router_topk(&logits, &bias, 4, false, 1.0).0, vec![3, 0, 2, 1]);
    assert_eq!(router_topk_device_variant(&logits, &bias, 4, false, 1.0).0, vec![3, 0, 2, 1]);
    let (ids, w) = router_topk(&logits, &bias, 0, true, 1.0);
    assert!(ids.is_empty() && w.is_empty());
}

#[test]
fn sigmoid_device_variant_is_accurate_but_not_sigmoid_c() {
    let mut rng = Rng::new(40);
    let xs = rng.vec(20_000, -12.0, 12.0);
    let got: Vec<f32> = xs.iter().map(|&x| sigmoid_device_variant(x)).collect();
    let reference: Vec<f64> = xs.iter().map(|&x| sigmoid64(x as f64)).collect();
    // exp_c ≤ 1.02 ulp plus ≤ 4 roundings: a few ulp of the result.
    assert_close("sigmoid_device_variant", &got, &reference, 0.0, 1e-6);
    // Both arms must differ from sigmoid_c on a good share of their inputs.
    for (arm, negative) in [("x < 0", true), ("x >= 0", false)] {
        let inputs: Vec<(f32, f32)> =
            xs.iter().zip(&got).filter(|(&x, _)| (x < 0.0) == negative).map(|(&x, &g)| (x, g)).collect();
        let differ = inputs.iter().filter(|(x, g)| g.to_bits() != sigmoid_c(*x).to_bits()).count();
        eprintln!("sigmoid_device_variant {arm}: {differ} of {} differ from sigmoid_c", inputs.len());
        assert!(differ * 10 >= inputs.len(), "{arm}: only {differ} of {} inputs differ from sigmoid_c", inputs.len());
    }
    assert_eq!(sigmoid_device_variant(f32::INFINITY), 1.0);
    assert_eq!(sigmoid_device_variant(f32::NEG_INFINITY).to_bits(), 0);
    assert!(sigmoid_device_variant(f32::NAN).is_nan());
}

// ---------------------------------------------------------------------------------------------
// moe.rs: swiglu, combine, argmax
// ---------------------------------------------------------------------------------------------

#[test]
fn swiglu_matches_f64_reference() {
    let mut rng = Rng::new(50);
    let g = rng.vec(4096, -10.0, 10.0);
    let u = rng.vec(4096, -3.0, 3.0);
    let mut out = vec![f32::NAN; g.len()];
    swiglu(&g, &u, None, &mut out);
    let reference: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| silu64(a as f64) * b as f64).collect();
    // silu_c ≤ 2.6 ulp, one product.
    assert_close("swiglu no limit", &out, &reference, 0.0, 1e-6);

    let limit = 7.0f32;
    let g = rng.vec(4096, -20.0, 20.0);
    let u = rng.vec(4096, -12.0, 12.0);
    swiglu(&g, &u, Some(limit), &mut out);
    let l = limit as f64;
    let reference: Vec<f64> =
        g.iter().zip(&u).map(|(&a, &b)| silu64(a as f64).min(l) * (b as f64).clamp(-l, l)).collect();
    assert_close("swiglu limit 7", &out, &reference, 0.0, 1e-6);
    let want: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| swiglu_c(a, b, Some(limit))).collect();
    assert_bits_eq("swiglu elementwise = swiglu_c", &out, &want);
}

#[test]
fn swiglu_clamps_silu_only_above_and_up_symmetrically() {
    let limit = 7.0f32;
    let cases: [(f32, f32, f32); 6] = [
        (20.0, 3.0, 7.0 * 3.0),                           // SiLU arm clamped above
        (20.0, 10.0, 7.0 * 7.0),                          // both arms clamped
        (20.0, -10.0, 7.0 * -7.0),                        // up clamped below at −limit
        (2.0, -10.0, silu_c(2.0) * -7.0),                 // only up clamped
        (-20.0, 10.0, silu_c(-20.0) * 7.0),               // tiny negative SiLU untouched
        (-1.278_464_5, 10.0, silu_c(-1.278_464_5) * 7.0), // SiLU minimum ≈ −0.2785
    ];
    let g: Vec<f32> = cases.iter().map(|c| c.0).collect();
    let u: Vec<f32> = cases.iter().map(|c| c.1).collect();
    let want: Vec<f32> = cases.iter().map(|c| c.2).collect();
    let mut out = vec![0.0; cases.len()];
    swiglu(&g, &u, Some(limit), &mut out);
    assert_bits_eq("swiglu limit 7", &out, &want);

    // With a small limit the SiLU arm's negative values (≥ −0.2785) would be changed by a
    // symmetric clamp; the contract clamps it only above.
    let limit = 0.2f32;
    let g = [-1.278_464_5f32, -3.0, 5.0];
    let u = [0.1f32, -0.5, 0.5];
    let mut out = [0.0f32; 3];
    swiglu(&g, &u, Some(limit), &mut out);
    let want = [silu_c(g[0]) * 0.1, silu_c(g[1]) * -0.2, 0.2f32 * 0.2];
    assert_bits_eq("swiglu limit 0.2", &out, &want);
    let symmetric = [(-0.2f32) * 0.1, silu_c(g[1]).max(-0.2) * -0.2, 0.2f32 * 0.2];
    assert!(bits_differ(&symmetric, &want), "premise: a symmetric SiLU clamp would differ");
}

/// f32 fold in an arbitrary slot order, for order tests.
fn combine_in_order(y: &[f32], w: &[f32], width: usize, order: &[usize]) -> Vec<f32> {
    (0..width).map(|i| order.iter().fold(0.0f32, |acc, &s| acc + w[s] * y[s * width + i])).collect()
}

#[test]
fn combine_slots_is_the_slot_order_fold_from_plus_zero() {
    // Columns crafted so that another slot order gives other bits:
    // col 0: 1, 1e8, −1e8: ((0 + 1) + 1e8) − 1e8 = 0 in slot order; 1 in reverse.
    // col 1: 1e8, 1, −1e8 with weights applied: 0 or 1 by order too.
    // col 2: all products −0.0: the +0.0 start makes the result +0.0.
    // col 3: ordinary values.
    let width = 4;
    let w = [1.0f32, 1.0, 1.0];
    let y = [
        1.0f32, 1e8, -0.0, 0.3, // slot 0
        1e8, 1.0, -0.0, -0.7, // slot 1
        -1e8, -1e8, -0.0, 0.11, // slot 2
    ];
    let mut out = vec![f32::NAN; width];
    combine_slots(&y, &w, width, &mut out);
    let want = combine_in_order(&y, &w, width, &[0, 1, 2]);
    assert_bits_eq("combine crafted", &out, &want);
    assert_eq!(out[0].to_bits(), 0.0f32.to_bits());
    assert_eq!(out[2].to_bits(), 0.0f32.to_bits(), "all −0.0 products must give +0.0");
    // Every order except swapping the first two slots (0 + a + b = 0 + b + a: IEEE addition is
    // commutative) is observable on these columns.
    for order in [[2, 1, 0], [0, 2, 1], [2, 0, 1], [1, 2, 0]] {
        assert!(bits_differ(&combine_in_order(&y, &w, width, &order), &want), "premise: order {order:?} differs");
    }
    // Starting from the first product instead of +0.0 would keep −0.0.
    assert_eq!((-0.0f32 + -0.0 + -0.0).to_bits(), (-0.0f32).to_bits());
}

#[test]
fn combine_slots_matches_f64_reference_and_exact_order() {
    let mut rng = Rng::new(60);
    let (slots, width) = (8, 1024);
    let y = rng.vec(slots * width, -4.0, 4.0);
    let w = rng.vec(slots, 0.0, 0.5);
    let mut out = vec![f32::NAN; width];
    combine_slots(&y, &w, width, &mut out);
    let reference: Vec<f64> =
        (0..width).map(|i| (0..slots).map(|s| w[s] as f64 * y[s * width + i] as f64).sum()).collect();
    // 8 products and sums of magnitude ≤ 2: absolute error ≤ 16·2·2^−24 ≈ 2e−6.
    assert_close("combine vs f64", &out, &reference, 4e-6, 1e-6);
    let order: Vec<usize> = (0..slots).collect();
    assert_bits_eq("combine vs slot-order fold", &out, &combine_in_order(&y, &w, width, &order));
    let rev: Vec<usize> = (0..slots).rev().collect();
    assert!(bits_differ(&combine_in_order(&y, &w, width, &rev), &out), "premise: reverse order differs somewhere");
}

/// NVFP4_DEV_ROUTES's combine: with every scale 1.0 it is `combine_shared` bit for bit; with
/// per-expert scales it is the slot-order fold of `(w·m)·y` from +0.0, looks each slot's scale up
/// by its route id (1.0 outside the table), copies the shared slot, and differs from the
/// canonical `w·(y·m)` somewhere (the door's numeric change is real, and small).
#[test]
fn combine_scaled_folds_each_slots_scale_into_its_weight() {
    let mut rng = Rng::new(61);
    let (k, width, experts) = (4usize, 512usize, 8usize);
    let ids: Vec<f32> = [3u32, 7, 99, 0].iter().map(|&i| f32::from_bits(i)).collect();
    let y = rng.vec((k + 1) * width, -4.0, 4.0);
    let w = rng.vec(k, 0.0, 0.5);
    let (mut plain, mut ones) = (vec![f32::NAN; 2 * width], vec![f32::NAN; 2 * width]);
    combine_shared(&y, &w, &mut plain);
    combine_scaled(&ids, &vec![1.0; experts], &y, &w, &mut ones);
    assert_bits_eq("scales 1.0 = combine_shared", &ones, &plain);
    let m = rng.vec(experts, 0.001, 0.01);
    let mut out = vec![f32::NAN; 2 * width];
    combine_scaled(&ids, &m, &y, &w, &mut out);
    let scale = |s: usize| m.get(ids[s].to_bits() as usize).copied().unwrap_or(1.0);
    let want: Vec<f32> =
        (0..width).map(|i| (0..k).fold(0.0f32, |acc, s| acc + (w[s] * scale(s)) * y[s * width + i])).collect();
    assert_bits_eq("routed: (w·m)·y in slot order", &out[..width], &want);
    assert_bits_eq("shared slot copied", &out[width..], &y[k * width..]);
    let canonical: Vec<f32> =
        (0..width).map(|i| (0..k).fold(0.0f32, |acc, s| acc + w[s] * (y[s * width + i] * scale(s)))).collect();
    assert!(bits_differ(&canonical, &want), "premise: the canonical parenthesization differs somewhere");
    let reference: Vec<f64> =
        (0..width).map(|i| (0..k).map(|s| w[s] as f64 * scale(s) as f64 * y[s * width + i] as f64).sum()).collect();
    assert_close("combine_scaled vs f64", &out[..width], &reference, 1e-6, 1e-5);
}

/// The folded SwiGLU is `(silu·u)·us` and differs from the canonical `silu·(u·us)` somewhere.
#[test]
fn swiglu_folded_applies_the_up_scale_after_the_product() {
    let mut rng = Rng::new(62);
    let (g, u) = (rng.vec(4096, -8.0, 8.0), rng.vec(4096, -3.0, 3.0));
    let us = 0.0123f32;
    let folded: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| swiglu_folded(a, b, us)).collect();
    let want: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| (silu_c(a) * b) * us).collect();
    assert_bits_eq("swiglu_folded", &folded, &want);
    let canonical: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| swiglu_c(a, b * us, None)).collect();
    assert!(bits_differ(&canonical, &folded), "premise: the canonical order differs somewhere");
}

#[test]
fn argmax_lowest_index_on_ties_and_nan_never_wins() {
    assert_eq!(argmax(&[1.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1, "tie → lower index");
    assert_eq!(argmax(&[f32::NAN, 1.0, 2.0]), 2, "leading NaN");
    assert_eq!(argmax(&[1.0, f32::NAN, 0.5]), 0, "NaN in the middle");
    assert_eq!(argmax(&[f32::NAN, f32::NAN, f32::NAN]), 0, "all NaN → 0");
    assert_eq!(argmax(&[]), 0, "empty → 0");
    assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 1, "−inf beats NaN");
    assert_eq!(argmax(&[-0.0, 0.0]), 0, "−0.0 and +0.0 tie");
    assert_eq!(argmax(&[-5.0, -1.0, f32::INFINITY, f32::NAN]), 2);
}

#[test]
fn argmax_matches_plain_reference() {
    let mut rng = Rng::new(70);
    for _ in 0..200 {
        let n = 1 + rng.below(300);
        // Few distinct values so ties are common; some NaN.
        let x: Vec<f32> =
            (0..n).map(|_| if rng.below(10) == 0 { f32::NAN } else { (rng.below(7) as f32) - 3.0 }).collect();
        let mut best: Option<(usize, f64)> = None;
        for (i, &v) in x.iter().enumerate() {
            if !v.is_nan() && best.is_none_or(|(_, b)| v as f64 > b) {
                best = Some((i, v as f64));
            }
        }
        assert_eq!(argmax(&x) as usize, best.map_or(0, |b| b.0), "{x:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// digest.rs
// ---------------------------------------------------------------------------------------------

/// splitmix64 written out independently, with the standard first output of the seed-0 stream.
fn splitmix64_ref(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn digest_definition() {
    assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF, "splitmix64 known vector");
    let mut rng = Rng::new(80);
    let x = rng.vec(1000, -5.0, 5.0);
    let base = 12_345u64;
    let want = x
        .iter()
        .enumerate()
        .fold(0u64, |a, (i, v)| a.wrapping_add(splitmix64_ref(((base + i as u64) << 32) | v.to_bits() as u64)));
    assert_eq!(digest_f32(&x, base), want);
    let bits: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
    assert_eq!(digest_u32(&bits, base), want, "f32 digest = u32 digest of the bits");
}

#[test]
fn digest_of_concatenation_is_wrapping_sum_of_shard_digests() {
    let mut rng = Rng::new(81);
    let x = rng.vec(4096, -5.0, 5.0);
    let whole = digest_f32(&x, 0);
    for cuts in [vec![0, 1024, 2048, 3072, 4096], vec![0, 1, 2999, 4096], vec![0, 4096]] {
        let sum = cuts.windows(2).fold(0u64, |a, c| a.wrapping_add(digest_f32(&x[c[0]..c[1]], c[0] as u64)));
        assert_eq!(sum, whole, "cuts {cuts:?}");
        if cuts.len() > 2 {
            let wrong = cuts.windows(2).fold(0u64, |a, c| a.wrapping_add(digest_f32(&x[c[0]..c[1]], 0)));
            assert_ne!(wrong, whole, "premise: shards digested without their offset must differ");
        }
    }
    let ids: Vec<u32> = (0..64).map(|_| rng.next_u64() as u32).collect();
    let sum = digest_u32(&ids[..24], 0).wrapping_add(digest_u32(&ids[24..], 24));
    assert_eq!(sum, digest_u32(&ids, 0), "u32 shards");
}

#[test]
fn digest_is_order_independent_but_position_sensitive() {
    let mut rng = Rng::new(82);
    let x = rng.vec(2048, -5.0, 5.0);
    let whole = digest_f32(&x, 7);
    let mut pairs: Vec<(u64, f32)> = x.iter().enumerate().map(|(i, &v)| (7 + i as u64, v)).collect();
    for i in (1..pairs.len()).rev() {
        let j = rng.below(i + 1);
        pairs.swap(i, j);
    }
    let shuffled = pairs.iter().fold(0u64, |a, &(idx, v)| a.wrapping_add(digest_f32(&[v], idx)));
    assert_eq!(shuffled, whole, "shuffled (index, value) pairs");

    let mut swapped = x.clone();
    swapped.swap(10, 11);
    assert_ne!(x[10].to_bits(), x[11].to_bits());
    assert_ne!(digest_f32(&swapped, 7), whole, "moving values to other indices changes the digest");
}

#[test]
fn digest_distinguishes_signed_zeros_and_one_bit_flips() {
    assert_ne!(digest_f32(&[0.0], 0), digest_f32(&[-0.0], 0));
    assert_ne!(digest_f32(&[1.0, 0.0, 2.0], 0), digest_f32(&[1.0, -0.0, 2.0], 0));
    let mut rng = Rng::new(83);
    let x = rng.vec(512, -1.0, 1.0);
    let d = digest_f32(&x, 0);
    for i in [0usize, 100, 511] {
        let mut y = x.clone();
        y[i] = f32::from_bits(y[i].to_bits() ^ 1);
        assert_ne!(digest_f32(&y, 0), d, "low-bit flip at {i}");
    }
}
