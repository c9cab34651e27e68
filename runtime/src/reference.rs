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
//! # The reference step (f64 throughout)
//! - RMSNorm: `y = x / sqrt(mean(x²) + eps) · w`.
//! - `qkv`: `[q | k | v | gate]`, each row `Σ_c w[r][c]·x[c]`.
//! - `rope`: per-head q/k RMSNorm with `q_norm` / `k_norm`, then NeoX RoPE: for i < 64 with
//!   angle `pos · θ^(−2i/128)` (cos/sin in f64): `x[i] = a·cos − b·sin`, `x[i+64] = b·cos + a·sin`
//!   where `a = x[i]`, `b = x[i+64]`. Seam `[q | k]`; k and v join the cache.
//! - `attn`: per query head h (kv head `h / (q_heads / kv_heads)`), softmax over positions
//!   `0..=pos` of `q·k_t / sqrt(128)`, `Σ_t p_t v_t`, times `sigmoid(gate_h)`.
//! - `o_proj`: the partials of the output projection over its G canonical K-blocks, `[G][hidden]`
//!   (G by the rule of docs/DESIGN.md §3.4, restated here from the spec); `o_join`: their sum.
//! - `ffn_norm`: `[h | normed]` with `h = x + o_join`.
//! - `router`: `score_e = sigmoid(router_e · normed)`, the top-k of `score_e + bias_e` (descending,
//!   ties → lower id), weights = the selected scores, divided by their sum if `route_norm`, times
//!   `route_scale`. Seam `[k ids | k weights]` (ids as numbers; the program stores their u32 bits).
//! - `experts`: per slot (the k routed ids in order, then the shared expert)
//!   `act = min(silu(gate·x), limit) · clamp(up·x, −limit, limit)` (no clamp without a limit),
//!   then the partials of `down · act` over the down projection's G K-blocks; seam
//!   `[slot][gmax][hidden]` with slot stride `gmax · hidden` (gmax = the larger G of routed and
//!   shared down projections; a slot with fewer K-blocks leaves zeros, and the tensor ends with
//!   the shared expert's partials).
//! - `moe_join`: `[routed | shared]`, `routed = Σ_s w_s · y_s`, `y_s = Σ_k partials`.
//! - `residual`: `h + routed + shared`. After the last layer, on the head pseudo-layer
//!   `n_layers`: `final_norm` and `logits` (lm_head), the argmax (ties → lower id) and the top-two
//!   margin.
//!
//! # Teacher forcing and router decisions
//! The reference feeds the canonical program's generated tokens (`forced`), so its positions and
//! histories are the program's. Router decisions are discrete: where the program's captured ids
//! (the `route_hint` record) differ from the reference's, and for every slot s the reference's
//! keys of the two choices are within `REFERENCE_REL_BOUND · max_e |key_e|` of each other (for a
//! swap at the k/k+1 boundary this is exactly the boundary gap), the reference adopts the
//! program's ids for that step and reports a router *near-tie*. A larger gap is a real
//! disagreement: the reference keeps its own ids and reports it, and the comparison fails.
//!
//! # The metric and the bound
//! Per seam tensor, the normwise relative error `max_i |got_i − ref_i| / max_i |ref_i|` (a NaN
//! anywhere, or a nonzero error against an all-zero reference, is infinite). The router seam
//! compares its ids exactly and its weights by the same metric. A seam passes when its worst
//! tensor is within [`REFERENCE_REL_BOUND`]. The token tape passes when every generated token
//! equals the reference argmax wherever the reference's top-two margin, relative to its largest
//! `|logit|`, exceeds the bound; closer margins are near-ties, listed and not judged.

use crate::config::Battery;
use crate::error::RuntimeError;
use crate::model::{Expert, Matrix, Model};
use crate::record::{CaptureKey, Record, Seam};
use crate::Result;
use memra_kernels::formats::{bf16_to_f32, e4m3_decode};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

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

/// One generated token as the reference sees it (same step and history as the program's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RefToken {
    pub argmax: u32,
    pub top1: f64,
    pub top2: f64,
    /// `(top1 − top2) / max_i |logit_i|`.
    pub margin_rel: f64,
}

/// A router decision where the program's ids differ from the reference's.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterEvent {
    /// (prompt, step, layer) of the router seam; `seam` is always `Router`.
    pub key: CaptureKey,
    /// The reference's own selection, in slot order.
    pub reference: Vec<u32>,
    /// The program's selection (from the route hint), in slot order.
    pub canonical: Vec<u32>,
    /// `max_s |key[reference_s] − key[canonical_s]| / max_e |key_e|` with the reference's keys
    /// (infinite when the program's ids are not k distinct valid experts).
    pub gap_rel: f64,
    /// Whether the reference adopted the program's ids (a near-tie, `gap_rel ≤ bound`).
    pub adopted: bool,
}

/// Everything the reference computed for a battery.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceRun {
    pub n_layers: usize,
    pub top_k: usize,
    /// The teacher-forced tokens the reference fed (per prompt).
    pub forced: Vec<Vec<u32>>,
    /// Every (prompt, step, layer, seam) logical tensor, in the program's layout.
    pub tensors: BTreeMap<CaptureKey, Vec<f64>>,
    /// `tokens[prompt][j]`: the reference's view of generated token j.
    pub tokens: Vec<Vec<RefToken>>,
    /// Router decisions that differ from the program's (near-ties and disagreements).
    pub router_events: Vec<RouterEvent>,
}

/// Run the f64 reference over `battery`, feeding the prompt tokens and then `forced[p]` (the
/// program's generated tokens; at least `gen_tokens − 1` per prompt). `route_hint` is a record
/// whose captures hold the program's router seams; where a step's router seam is captured, its
/// ids settle the reference's near-ties (see the module docs). Prompts run in parallel.
pub fn reference_run(
    model: &Model,
    battery: &Battery,
    forced: &[Vec<u32>],
    route_hint: Option<&Record>,
) -> Result<ReferenceRun> {
    check_inputs(model, battery, forced)?;
    let weights = RefModel::new(model);
    let n_prompts = battery.prompts.len();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<PromptOut>>>> = Mutex::new((0..n_prompts).map(|_| None).collect());
    let work = || loop {
        let p = next.fetch_add(1, Ordering::Relaxed);
        if p >= n_prompts {
            break;
        }
        let out = run_prompt(&weights, battery, forced, route_hint, p);
        results.lock().unwrap_or_else(|e| e.into_inner())[p] = Some(out);
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(n_prompts).max(1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(work);
        }
    });
    let mut run = ReferenceRun {
        n_layers: model.layers.len(),
        top_k: model.config.top_k,
        forced: forced.iter().map(|f| f[..battery.gen_tokens - 1].to_vec()).collect(),
        tensors: BTreeMap::new(),
        tokens: Vec::with_capacity(n_prompts),
        router_events: Vec::new(),
    };
    for out in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
        let out = out.expect("every prompt ran")?;
        run.tensors.extend(out.tensors);
        run.tokens.push(out.tokens);
        run.router_events.extend(out.events);
    }
    Ok(run)
}

fn check_inputs(model: &Model, battery: &Battery, forced: &[Vec<u32>]) -> Result<()> {
    let c = &model.config;
    let fail = |m: String| Err(RuntimeError::Config(m));
    if c.head_dim != HEAD_DIM || model.layers.is_empty() || c.q_heads.checked_rem(c.kv_heads) != Some(0) {
        return fail(format!(
            "the reference needs head_dim {HEAD_DIM}, at least one layer and whole query groups (head_dim {}, {} layers, \
             q_heads {}, kv_heads {})",
            c.head_dim,
            model.layers.len(),
            c.q_heads,
            c.kv_heads
        ));
    }
    if battery.gen_tokens == 0 {
        return fail("the battery generates 0 tokens: nothing would be compared".into());
    }
    if forced.len() != battery.prompts.len() {
        return fail(format!(
            "the teacher-forced tape has {} prompts but the battery has {}",
            forced.len(),
            battery.prompts.len()
        ));
    }
    for (p, (prompt, f)) in battery.prompts.iter().zip(forced).enumerate() {
        if prompt.is_empty() {
            return fail(format!("battery prompt {p} is empty: every prompt needs a token"));
        }
        if f.len() < battery.gen_tokens - 1 {
            return fail(format!(
                "the teacher-forced tape of prompt {p} has {} tokens, fewer than gen_tokens − 1 = {}",
                f.len(),
                battery.gen_tokens - 1
            ));
        }
        if let Some(t) = prompt.iter().chain(&f[..battery.gen_tokens - 1]).find(|t| **t as usize >= c.vocab) {
            return fail(format!("prompt {p} feeds token {t}, outside the vocabulary of {}", c.vocab));
        }
    }
    Ok(())
}

/// What one prompt produced.
struct PromptOut {
    tensors: Vec<(CaptureKey, Vec<f64>)>,
    tokens: Vec<RefToken>,
    events: Vec<RouterEvent>,
}

/// One prompt's decoding state: its KV caches (`[pos][kv_heads·128]` per layer) and outputs.
struct PromptRun<'a> {
    model: &'a Model,
    w: &'a RefModel<'a>,
    hint: Option<&'a Record>,
    prompt: usize,
    step: usize,
    k_cache: Vec<Vec<f64>>,
    v_cache: Vec<Vec<f64>>,
    out: PromptOut,
}

fn run_prompt(
    w: &RefModel,
    battery: &Battery,
    forced: &[Vec<u32>],
    hint: Option<&Record>,
    prompt: usize,
) -> Result<PromptOut> {
    let model = w.model;
    let n_layers = model.layers.len();
    let mut run = PromptRun {
        model,
        w,
        hint,
        prompt,
        step: 0,
        k_cache: vec![Vec::new(); n_layers],
        v_cache: vec![Vec::new(); n_layers],
        out: PromptOut { tensors: Vec::new(), tokens: Vec::new(), events: Vec::new() },
    };
    let tokens = &battery.prompts[prompt];
    for step in 0..battery.steps_of(prompt) {
        run.step = step;
        let token = if step < tokens.len() { tokens[step] } else { forced[prompt][step - tokens.len()] };
        let logits = run.decode_step(token, step)?;
        if step + 1 >= tokens.len() {
            run.out.tokens.push(judge_logits(&logits));
        }
    }
    Ok(run.out)
}

/// Argmax (ties → lower id) and the top-two margin of one step's logits.
fn judge_logits(logits: &[f64]) -> RefToken {
    let mut argmax = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[argmax] {
            argmax = i;
        }
    }
    let top1 = logits[argmax];
    let top2 =
        logits.iter().enumerate().filter(|(i, _)| *i != argmax).map(|(_, v)| *v).fold(f64::NEG_INFINITY, f64::max);
    let max_abs = logits.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    RefToken { argmax: argmax as u32, top1, top2, margin_rel: (top1 - top2) / max_abs }
}

impl PromptRun<'_> {
    fn keep(&mut self, layer: usize, seam: Seam, tensor: Vec<f64>) {
        let key = CaptureKey { prompt: self.prompt, step: self.step, layer, seam };
        self.out.tensors.push((key, tensor));
    }

    /// One decode step at position `pos`; returns the logits.
    fn decode_step(&mut self, token: u32, pos: usize) -> Result<Vec<f64>> {
        let model = self.model;
        let mut x = self.w.embed.row(token as usize);
        for l in 0..model.layers.len() {
            x = self.layer(l, &x, pos)?;
        }
        let n = model.layers.len();
        let normed = rmsnorm(&x, &model.final_norm, model.config.eps);
        let logits = self.w.lm_head.matvec(&normed);
        self.keep(n, Seam::FinalNorm, normed);
        self.keep(n, Seam::Logits, logits.clone());
        Ok(logits)
    }

    /// One decoder layer on the residual stream `x`; returns the layer output.
    fn layer(&mut self, l: usize, x: &[f64], pos: usize) -> Result<Vec<f64>> {
        let model = self.model;
        let c = &model.config;
        let w = &model.layers[l];
        let dense = &self.w.layers[l];
        let eps = c.eps;

        let normed = rmsnorm(x, &w.attn_norm, eps);
        self.keep(l, Seam::AttnNorm, normed.clone());

        let q = dense.wq.matvec(&normed);
        let k = dense.wk.matvec(&normed);
        let v = dense.wv.matvec(&normed);
        let gate = dense.wg.matvec(&normed);
        self.keep(l, Seam::Qkv, [&q[..], &k, &v, &gate].concat());

        let q = norm_rope_heads(&q, &w.q_norm, eps, pos, c.rope_theta as f64);
        let k = norm_rope_heads(&k, &w.k_norm, eps, pos, c.rope_theta as f64);
        self.keep(l, Seam::Rope, [&q[..], &k].concat());
        self.k_cache[l].extend_from_slice(&k);
        self.v_cache[l].extend_from_slice(&v);

        let attn = attention(&q, &self.k_cache[l], &self.v_cache[l], &gate, c.q_heads, c.kv_heads);
        self.keep(l, Seam::Attn, attn.clone());

        let g_o = kblocks(&w.wo)?;
        let o_parts = dense.wo.partials(&attn, g_o);
        let o = sum_partials(&o_parts, g_o);
        self.keep(l, Seam::OProj, o_parts);
        self.keep(l, Seam::OJoin, o.clone());

        let h: Vec<f64> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
        let xin = rmsnorm(&h, &w.ffn_norm, eps);
        self.keep(l, Seam::FfnNorm, [&h[..], &xin].concat());

        let (ids, weights) = self.route(l, &xin);
        self.keep(l, Seam::Router, ids.iter().map(|i| *i as f64).chain(weights.iter().copied()).collect());

        let slots: Vec<&Expert> = ids.iter().map(|e| &w.experts[*e as usize]).chain([&w.shared]).collect();
        let g_slots: Vec<usize> = slots.iter().map(|e| kblocks(&e.down)).collect::<Result<_>>()?;
        let gmax = g_slots.iter().copied().max().unwrap_or(1);
        let hidden = c.hidden;
        let mut expert_seam = vec![0.0; slots.len() * gmax * hidden];
        let mut y = Vec::with_capacity(slots.len());
        for (s, (expert, g)) in slots.iter().zip(&g_slots).enumerate() {
            let parts = expert_partials(expert, &xin, c.swiglu_limit.map(f64::from), *g);
            expert_seam[s * gmax * hidden..][..parts.len()].copy_from_slice(&parts);
            y.push(sum_partials(&parts, *g));
        }
        // The tensor ends with the last slot's partials (the program's parts cover no more).
        expert_seam.truncate((slots.len() - 1) * gmax * hidden + g_slots[slots.len() - 1] * hidden);
        self.keep(l, Seam::Experts, expert_seam);

        let shared = y.pop().expect("the shared expert has a slot");
        let mut routed = vec![0.0; hidden];
        for (ys, ws) in y.iter().zip(&weights) {
            for (r, v) in routed.iter_mut().zip(ys) {
                *r += ws * v;
            }
        }
        let out: Vec<f64> = (0..hidden).map(|i| h[i] + routed[i] + shared[i]).collect();
        self.keep(l, Seam::MoeJoin, [&routed[..], &shared].concat());
        self.keep(l, Seam::Residual, out.clone());
        Ok(out)
    }

    /// The router: the reference's own top-k, or the program's ids on a near-tie.
    fn route(&mut self, l: usize, xin: &[f64]) -> (Vec<u32>, Vec<f64>) {
        let c = &self.model.config;
        let w = &self.model.layers[l];
        let scores: Vec<f64> = self.w.layers[l].router.matvec(xin).into_iter().map(sigmoid).collect();
        let keys: Vec<f64> = scores.iter().zip(&w.router_bias).map(|(s, b)| s + *b as f64).collect();
        let mut order: Vec<u32> = (0..keys.len() as u32).collect();
        // Descending key; equal keys keep ascending id (the sort is stable).
        order.sort_by(|a, b| keys[*b as usize].total_cmp(&keys[*a as usize]));
        let mut ids = order[..c.top_k].to_vec();

        let key = CaptureKey { prompt: self.prompt, step: self.step, layer: l, seam: Seam::Router };
        if let Some(canonical) = self.hint.and_then(|r| r.captures.get(&key)) {
            let canonical: Vec<u32> = canonical.bits.iter().take(c.top_k).copied().collect();
            if canonical != ids {
                let gap_rel = slot_gap(&keys, &ids, &canonical);
                let adopted = gap_rel <= REFERENCE_REL_BOUND;
                self.out.events.push(RouterEvent {
                    key,
                    reference: ids.clone(),
                    canonical: canonical.clone(),
                    gap_rel,
                    adopted,
                });
                if adopted {
                    ids = canonical;
                }
            }
        }

        let mut weights: Vec<f64> = ids.iter().map(|e| scores[*e as usize]).collect();
        if c.route_norm {
            let sum: f64 = weights.iter().sum();
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        weights.iter_mut().for_each(|w| *w *= c.route_scale as f64);
        (ids, weights)
    }
}

/// `max_s |key[a_s] − key[b_s]| / max_e |key_e|`; infinite when `b` is not `a.len()` distinct
/// valid ids.
fn slot_gap(keys: &[f64], a: &[u32], b: &[u32]) -> f64 {
    let valid = b.len() == a.len()
        && b.iter().all(|e| (*e as usize) < keys.len())
        && b.iter().enumerate().all(|(i, e)| !b[..i].contains(e));
    if !valid {
        return f64::INFINITY;
    }
    let scale = keys.iter().fold(0.0f64, |m, k| m.max(k.abs()));
    let gap = a.iter().zip(b).map(|(x, y)| (keys[*x as usize] - keys[*y as usize]).abs()).fold(0.0, f64::max);
    gap / scale
}

/// The canonical K-block count G of docs/DESIGN.md §3.4, restated from the spec: BF16 → 8 (the width
/// must divide by 8); E4M3 → the largest of 8, 4, 2, 1 that divides the number of 128-column
/// scale blocks.
fn kblocks(m: &Matrix) -> Result<usize> {
    match m {
        Matrix::Bf16 { in_features, .. } if in_features % 8 == 0 => Ok(8),
        Matrix::E4m3 { in_features, .. } if in_features % 128 == 0 && *in_features > 0 => {
            Ok([8, 4, 2, 1].into_iter().find(|g| (in_features / 128) % g == 0).unwrap_or(1))
        }
        other => Err(RuntimeError::Config(format!(
            "a {:?} matrix of in_features {} has no canonical K-block count (docs/DESIGN.md §3.4)",
            other.format(),
            other.in_features()
        ))),
    }
}

/// A weight matrix as the reference reads it: every element's exact value. BF16 matrices are
/// widened once (exactly, `bf16_to_f32`) to f32; E4M3 matrices are read in place, element value
/// `e4m3_decode(code) × scale` of its 128×128 block, exact in f64.
enum Weights<'a> {
    Widened { rows: usize, cols: usize, values: Vec<f32> },
    E4m3 { rows: usize, cols: usize, codes: &'a [u8], scales: &'a [f32] },
}

/// `e4m3_decode` of every code, as f64.
fn e4m3_values() -> &'static [f64; 256] {
    static VALUES: OnceLock<[f64; 256]> = OnceLock::new();
    VALUES.get_or_init(|| std::array::from_fn(|c| e4m3_decode(c as u8) as f64))
}

impl<'a> Weights<'a> {
    fn of(m: &'a Matrix) -> Weights<'a> {
        match m {
            Matrix::Bf16 { out_features, in_features, bits } => Weights::Widened {
                rows: *out_features,
                cols: *in_features,
                values: bits.iter().map(|b| bf16_to_f32(*b)).collect(),
            },
            Matrix::E4m3 { out_features, in_features, codes, scales } => {
                Weights::E4m3 { rows: *out_features, cols: *in_features, codes, scales }
            }
        }
    }

    fn rows(&self) -> usize {
        match self {
            Weights::Widened { rows, .. } | Weights::E4m3 { rows, .. } => *rows,
        }
    }

    fn cols(&self) -> usize {
        match self {
            Weights::Widened { cols, .. } | Weights::E4m3 { cols, .. } => *cols,
        }
    }

    /// `Σ_{c ∈ cols} w[row][c] · x[c]`.
    fn row_dot(&self, row: usize, cols: Range<usize>, x: &[f64]) -> f64 {
        match self {
            Weights::Widened { cols: n, values, .. } => {
                let w = &values[row * n..(row + 1) * n];
                dot_by(&w[cols.clone()], &x[cols], |v| v as f64)
            }
            Weights::E4m3 { cols: n, codes, scales, .. } => {
                let lut = e4m3_values();
                let w = &codes[row * n..(row + 1) * n];
                let scale_row = &scales[(row / 128) * n.div_ceil(128)..];
                // Walk the columns one scale block (or the part of one inside `cols`) at a time.
                let mut sum = 0.0;
                let mut c = cols.start;
                while c < cols.end {
                    let end = ((c / 128 + 1) * 128).min(cols.end);
                    let scale = scale_row[c / 128] as f64;
                    sum += dot_by(&w[c..end], &x[c..end], |code| lut[code as usize] * scale);
                    c = end;
                }
                sum
            }
        }
    }

    /// One row as f64 values (the embedding lookup).
    fn row(&self, row: usize) -> Vec<f64> {
        match self {
            Weights::Widened { cols: n, values, .. } => {
                values[row * n..(row + 1) * n].iter().map(|v| *v as f64).collect()
            }
            Weights::E4m3 { cols: n, codes, scales, .. } => {
                let lut = e4m3_values();
                let scale_row = &scales[(row / 128) * n.div_ceil(128)..];
                let w = &codes[row * n..(row + 1) * n];
                w.iter().enumerate().map(|(c, code)| lut[*code as usize] * scale_row[c / 128] as f64).collect()
            }
        }
    }

    /// `w · x` over every row.
    fn matvec(&self, x: &[f64]) -> Vec<f64> {
        (0..self.rows()).map(|r| self.row_dot(r, 0..self.cols(), x)).collect()
    }

    /// Partials of `w · x` over `g` equal column blocks, laid out `[g][rows]`.
    fn partials(&self, x: &[f64], g: usize) -> Vec<f64> {
        let (rows, width) = (self.rows(), self.cols() / g);
        let mut out = vec![0.0; g * rows];
        for k in 0..g {
            for r in 0..rows {
                out[k * rows + r] = self.row_dot(r, k * width..(k + 1) * width, x);
            }
        }
        out
    }
}

/// `Σ_i value(w_i) · x_i`. Eight running sums only for speed: in f64 the order of a ≤ 4096-term
/// sum moves the result by ~1e-15 relative, far below anything compared here.
fn dot_by<T: Copy>(w: &[T], x: &[f64], value: impl Fn(T) -> f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let (wc, xc) = (w.chunks_exact(8), x.chunks_exact(8));
    let tail: f64 = wc.remainder().iter().zip(xc.remainder()).map(|(w, x)| value(*w) * x).sum();
    for (wb, xb) in wc.zip(xc) {
        for l in 0..8 {
            acc[l] += value(wb[l]) * xb[l];
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// The model's weights as the reference reads them (BF16 matrices widened once per run).
struct RefModel<'a> {
    model: &'a Model,
    embed: Weights<'a>,
    lm_head: Weights<'a>,
    layers: Vec<RefLayer<'a>>,
}

/// One layer's attention and router matrices (experts are read in place from the model).
struct RefLayer<'a> {
    wq: Weights<'a>,
    wk: Weights<'a>,
    wv: Weights<'a>,
    wg: Weights<'a>,
    wo: Weights<'a>,
    router: Weights<'a>,
}

impl<'a> RefModel<'a> {
    fn new(model: &'a Model) -> RefModel<'a> {
        let layers = model
            .layers
            .iter()
            .map(|l| RefLayer {
                wq: Weights::of(&l.wq),
                wk: Weights::of(&l.wk),
                wv: Weights::of(&l.wv),
                wg: Weights::of(&l.wg),
                wo: Weights::of(&l.wo),
                router: Weights::of(&l.router),
            })
            .collect();
        RefModel { model, embed: Weights::of(&model.embed), lm_head: Weights::of(&model.lm_head), layers }
    }
}

/// Sum of `g` partial vectors laid out `[g][width]`.
fn sum_partials(parts: &[f64], g: usize) -> Vec<f64> {
    let width = parts.len() / g;
    (0..width).map(|i| (0..g).map(|k| parts[k * width + i]).sum()).collect()
}

/// One SwiGLU expert on `x`: the partials of its down projection over `g` K-blocks.
fn expert_partials(e: &Expert, x: &[f64], limit: Option<f64>, g: usize) -> Vec<f64> {
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

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x / sqrt(mean(x²) + eps) · w`.
fn rmsnorm(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
    let mean_sq = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (mean_sq + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * *w as f64).collect()
}

/// Per-head RMSNorm (weight `[128]`) then NeoX RoPE at `pos`.
fn norm_rope_heads(x: &[f64], w: &[f32], eps: f32, pos: usize, theta: f64) -> Vec<f64> {
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
fn attention(q: &[f64], k_cache: &[f64], v_cache: &[f64], gate: &[f64], q_heads: usize, kv_heads: usize) -> Vec<f64> {
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

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

/// The worst normwise relative error of one seam over every compared tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct SeamError {
    pub seam: Seam,
    /// Tensors compared (all layers, steps and prompts).
    pub tensors: usize,
    /// `max` over tensors of `max_i |got_i − ref_i| / max_i |ref_i|` (router: weights only).
    pub max_rel: f64,
    /// The tensor holding the worst error and the element where its largest difference is.
    pub worst: Option<(CaptureKey, usize)>,
}

/// One generated token compared with the reference argmax.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TapeEntry {
    pub prompt: usize,
    /// Index among the prompt's generated tokens.
    pub index: usize,
    pub got: u32,
    pub reference: u32,
    /// The reference's `(top1 − top2) / max |logit|`.
    pub margin_rel: f64,
}

/// What [`compare`] found. [`ComparisonReport::passed`] is the verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct ComparisonReport {
    pub bound: f64,
    /// Per seam that had captures, in program order (layer seams, then head seams).
    pub seams: Vec<SeamError>,
    /// The worst seam: (seam, its error).
    pub worst: Option<(Seam, f64)>,
    /// Router seams whose ids differ from the reference's: (key, program ids, reference ids).
    pub router_id_mismatches: Vec<(CaptureKey, Vec<u32>, Vec<u32>)>,
    /// Router near-ties the reference resolved by adopting the program's ids.
    pub router_near_ties: Vec<RouterEvent>,
    /// Router decisions that differ by more than the bound.
    pub router_disagreements: Vec<RouterEvent>,
    /// Generated tokens compared on the tape.
    pub tape_compared: usize,
    /// Tokens that differ from the reference argmax where the margin exceeds the bound.
    pub tape_mismatches: Vec<TapeEntry>,
    /// Tokens whose reference margin is within the bound (agreeing or not; not judged).
    pub tape_near_ties: Vec<TapeEntry>,
    /// Anything that could not be compared (a capture the reference lacks, a length mismatch, a
    /// tape that is not the one the reference was forced with), one line each.
    pub problems: Vec<String>,
}

impl ComparisonReport {
    /// PASS: something was compared, every seam within the bound (NaN never passes), router
    /// ids equal, no router disagreement, the tape agrees outside near-ties, no problems.
    pub fn passed(&self) -> bool {
        let compared: usize = self.seams.iter().map(|s| s.tensors).sum();
        compared > 0
            && self.tape_compared > 0
            && self.seams.iter().all(|s| s.max_rel <= self.bound)
            && self.router_id_mismatches.is_empty()
            && self.router_disagreements.is_empty()
            && self.tape_mismatches.is_empty()
            && self.problems.is_empty()
    }
}

impl fmt::Display for ComparisonReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "reference comparison (bound {:e}): {}", self.bound, if self.passed() { "PASS" } else { "FAIL" })?;
        writeln!(f, "{:<11} {:>8} {:>12}  worst at", "seam", "tensors", "max rel err")?;
        for s in &self.seams {
            let at = s.worst.map_or(String::from("-"), |(k, i)| {
                format!("prompt {} step {} layer {} element {i}", k.prompt, k.step, k.layer)
            });
            writeln!(f, "{:<11} {:>8} {:>12.3e}  {at}", s.seam.name(), s.tensors, s.max_rel)?;
        }
        if let Some((seam, e)) = self.worst {
            writeln!(f, "worst seam: {} at {e:.3e}", seam.name())?;
        }
        writeln!(
            f,
            "token tape: {} compared, {} mismatches, {} near-ties",
            self.tape_compared,
            self.tape_mismatches.len(),
            self.tape_near_ties.len()
        )?;
        for t in self.tape_mismatches.iter().chain(&self.tape_near_ties) {
            writeln!(
                f,
                "  prompt {} token {}: program {} reference {} (margin {:.3e})",
                t.prompt, t.index, t.got, t.reference, t.margin_rel
            )?;
        }
        for e in self.router_near_ties.iter().chain(&self.router_disagreements) {
            writeln!(
                f,
                "  router {} prompt {} step {} layer {}: reference {:?} program {:?} (gap {:.3e})",
                if e.adopted { "near-tie" } else { "DISAGREEMENT" },
                e.key.prompt,
                e.key.step,
                e.key.layer,
                e.reference,
                e.canonical,
                e.gap_rel
            )?;
        }
        for (k, got, r) in &self.router_id_mismatches {
            writeln!(f, "  router ids differ at {k:?}: program {got:?} reference {r:?}")?;
        }
        for p in &self.problems {
            writeln!(f, "  problem: {p}")?;
        }
        Ok(())
    }
}

/// Normwise relative error `max_i |got_i − ref_i| / max_i |ref_i|` and the index of the largest
/// difference; NaN anywhere → infinite; an all-zero reference gives 0 only if `got` is all zero.
fn normwise(got: impl Iterator<Item = f64>, reference: &[f64]) -> (f64, usize) {
    let mut max_diff = 0.0f64;
    let mut at = 0;
    for (i, (g, r)) in got.zip(reference).enumerate() {
        let d = (g - r).abs();
        if d.is_nan() {
            return (f64::INFINITY, i);
        }
        if d > max_diff {
            max_diff = d;
            at = i;
        }
    }
    let scale = reference.iter().fold(0.0f64, |m, r| m.max(r.abs()));
    let rel = if max_diff == 0.0 { 0.0 } else { max_diff / scale };
    (if rel.is_nan() { f64::INFINITY } else { rel }, at)
}

/// Compare every captured seam tensor of `record` and its token tape with the reference (see
/// the module docs for the metric). `bound` is normally [`REFERENCE_REL_BOUND`].
pub fn compare(reference: &ReferenceRun, record: &Record, bound: f64) -> ComparisonReport {
    let mut stats: BTreeMap<(bool, usize), SeamError> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut router_id_mismatches = Vec::new();
    let k = reference.top_k;
    for (key, cap) in &record.captures {
        let Some(r) = reference.tensors.get(key) else {
            problems.push(format!("capture {key:?} has no reference tensor (another battery or model?)"));
            continue;
        };
        if cap.bits.len() != r.len() {
            problems.push(format!(
                "{} at {key:?}: the program's tensor has {} elements, the reference's {}",
                key.seam.name(),
                cap.bits.len(),
                r.len()
            ));
            continue;
        }
        let (rel, at) = if key.seam == Seam::Router {
            let got: Vec<u32> = cap.bits[..k].to_vec();
            let want: Vec<u32> = r[..k].iter().map(|v| *v as u32).collect();
            if got != want {
                router_id_mismatches.push((*key, got, want));
            }
            let (rel, at) = normwise(cap.bits[k..].iter().map(|b| f32::from_bits(*b) as f64), &r[k..]);
            (rel, at + k)
        } else {
            normwise(cap.bits.iter().map(|b| f32::from_bits(*b) as f64), r)
        };
        let head = key.layer == reference.n_layers;
        let entry = stats.entry((head, key.seam.slot())).or_insert(SeamError {
            seam: key.seam,
            tensors: 0,
            max_rel: 0.0,
            worst: None,
        });
        entry.tensors += 1;
        if entry.worst.is_none() || rel > entry.max_rel {
            entry.max_rel = rel;
            entry.worst = Some((*key, at));
        }
    }
    let seams: Vec<SeamError> = stats.into_values().collect();
    let worst = seams.iter().map(|s| (s.seam, s.max_rel)).fold(None, |acc: Option<(Seam, f64)>, s| match acc {
        Some(a) if a.1 >= s.1 => Some(a),
        _ => Some(s),
    });

    // Token tape.
    let mut tape_compared = 0;
    let mut tape_mismatches = Vec::new();
    let mut tape_near_ties = Vec::new();
    if record.tokens.len() != reference.tokens.len() {
        problems.push(format!(
            "the record has {} prompts on its tape, the reference {}",
            record.tokens.len(),
            reference.tokens.len()
        ));
    }
    for (p, (got, want)) in record.tokens.iter().zip(&reference.tokens).enumerate() {
        let fed = &reference.forced[p];
        if got.len() != want.len() || got[..fed.len().min(got.len())] != fed[..] {
            problems.push(format!(
                "prompt {p}: the record's tape {got:?} is not the tape the reference was forced with ({fed:?} then one more)"
            ));
            continue;
        }
        for (j, (g, w)) in got.iter().zip(want).enumerate() {
            tape_compared += 1;
            let entry = TapeEntry { prompt: p, index: j, got: *g, reference: w.argmax, margin_rel: w.margin_rel };
            if w.margin_rel > bound {
                if *g != w.argmax {
                    tape_mismatches.push(entry);
                }
            } else {
                tape_near_ties.push(entry);
            }
        }
    }

    let (router_near_ties, router_disagreements) =
        reference.router_events.iter().cloned().partition(|e: &RouterEvent| e.adopted && e.gap_rel <= bound);
    ComparisonReport {
        bound,
        seams,
        worst,
        router_id_mismatches,
        router_near_ties,
        router_disagreements,
        tape_compared,
        tape_mismatches,
        tape_near_ties,
        problems,
    }
}
