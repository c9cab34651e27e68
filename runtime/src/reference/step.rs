//! The f64 reference step (docs/DESIGN.md §3.4, last paragraph): one prompt at a time, teacher
//! forced with the program's tokens, every seam tensor kept in the program's layout.
//!
//! # The step (f64 throughout)
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
//!   `act = min(silu(gate·x), limit) · clamp(up·x, −limit, limit)` with the layer's limit
//!   (`ModelConfig::swiglu_limit_at`; no clamp without one),
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

use super::math::{attention, expert_partials, norm_rope_heads, rmsnorm, sigmoid, sum_partials};
use super::weights::{kblocks, RefModel};
use super::{HEAD_DIM, REFERENCE_REL_BOUND};
use crate::config::Battery;
use crate::error::RuntimeError;
use crate::evidence::record::{CaptureKey, Record, Seam};
use crate::model::{Expert, Model};
use crate::Result;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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
    let fail = |prompt: Option<usize>, rule: String| Err(RuntimeError::Battery { prompt, rule });
    if c.head_dim != HEAD_DIM || model.layers.is_empty() || c.q_heads.checked_rem(c.kv_heads) != Some(0) {
        let rule = format!(
            "the reference needs head_dim {HEAD_DIM}, at least one layer and whole query groups (head_dim {}, {} layers, \
             q_heads {}, kv_heads {})",
            c.head_dim,
            model.layers.len(),
            c.q_heads,
            c.kv_heads
        );
        return Err(RuntimeError::ModelShape { rule });
    }
    if battery.gen_tokens == 0 {
        return fail(None, "the battery generates 0 tokens: nothing would be compared".into());
    }
    if forced.len() != battery.prompts.len() {
        return fail(
            None,
            format!(
                "the teacher-forced tape has {} prompts but the battery has {}",
                forced.len(),
                battery.prompts.len()
            ),
        );
    }
    for (p, (prompt, f)) in battery.prompts.iter().zip(forced).enumerate() {
        if prompt.is_empty() {
            return fail(Some(p), format!("battery prompt {p} is empty: every prompt needs a token"));
        }
        if f.len() < battery.gen_tokens - 1 {
            return fail(
                Some(p),
                format!(
                    "the teacher-forced tape of prompt {p} has {} tokens, fewer than gen_tokens − 1 = {}",
                    f.len(),
                    battery.gen_tokens - 1
                ),
            );
        }
        if let Some(t) = prompt.iter().chain(&f[..battery.gen_tokens - 1]).find(|t| **t as usize >= c.vocab) {
            return fail(Some(p), format!("prompt {p} feeds token {t}, outside the vocabulary of {}", c.vocab));
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
            let parts = expert_partials(expert, &xin, c.swiglu_limit_at(l).map(f64::from), *g);
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
