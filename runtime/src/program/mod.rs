//! The canonical decode program (docs/DESIGN.md §3.2–§3.4), written once against the backend trait.
//!
//! `run` decodes the battery prompt by prompt, token by token. At every seam it queues one digest
//! per rank-held part of the seam's *logical* tensor (each with its global base index, so the
//! parts add up to the digest of the whole tensor whatever the TP size), and, when asked, reads
//! the parts back as a full capture. Timing marks bracket each seam's compute on every rank.

pub mod buffers;
mod layer;
pub mod placement;
pub mod weights;

use crate::backend::{Backend, Op, RowOrder, Slice};
use crate::config::{Canary, RunConfig};
use crate::error::RuntimeError;
use crate::model::Model;
use crate::record::{Capture, CaptureKey, Record, Seam};
use crate::Result;
use buffers::Buffers;
use placement::Placement;
use weights::Uploaded;

/// One part of a seam tensor: (rank, slice on that rank, global index of its first element).
pub type Part = (usize, Slice, u64);

/// Everything the step functions need.
pub(crate) struct Ctx<'a> {
    pub b: &'a mut dyn Backend,
    pub model: &'a Model,
    pub cfg: &'a RunConfig,
    pub p: Placement,
    pub w: Uploaded,
    pub buf: Buffers,
    pub record: Record,
    /// (seam index in the row, digest tickets) queued during the current step.
    pending: Vec<(usize, Vec<usize>)>,
    /// Seam indices in the order their marks were queued this step.
    marked: Vec<usize>,
    prompt: usize,
    step: usize,
}

impl Ctx<'_> {
    /// Mark the start of a seam's compute on every rank.
    pub fn begin(&mut self) -> Result<()> {
        self.b.mark()
    }

    /// Close a seam: end mark, the flip canary if it targets this seam, digests of every part,
    /// and a full capture when requested.
    pub fn seam(&mut self, layer: usize, seam: Seam, parts: &[Part]) -> Result<()> {
        self.b.mark()?;
        let idx = Record::seam_index(self.record.n_layers, layer, seam);
        self.marked.push(idx);
        if let Some(Canary::FlipBit { layer: cl, seam: cs, step: st }) = self.cfg.doors.canary {
            if cl == layer && cs == seam && st == self.step {
                let (rank, s, _) = parts.iter().find(|p| p.2 == 0).copied().ok_or_else(|| {
                    RuntimeError::Config(format!("seam {} has no part holding element 0", seam.name()))
                })?;
                self.b.launch(rank, Op::FlipLowBit { x: s })?;
                self.record.bump("canary_flip_bit.flips");
            }
        }
        let mut tickets = Vec::with_capacity(parts.len());
        for &(rank, s, base) in parts {
            tickets.push(self.b.digest(rank, s, base)?);
        }
        self.pending.push((idx, tickets));
        let key = CaptureKey { prompt: self.prompt, step: self.step, layer, seam };
        if self.cfg.capture.contains(&key) {
            // Parts may leave gaps (the expert slot stride is the largest G); gaps read as +0.0.
            let total: usize = parts.iter().map(|p| p.2 as usize + p.1.len).max().unwrap_or(0);
            let mut bits = vec![0u32; total];
            let mut owners = Vec::new();
            for &(rank, s, base) in parts {
                let v = self.b.read(rank, s)?;
                let start = base as usize;
                if start + v.len() > total {
                    return Err(RuntimeError::Config(format!(
                        "seam {} part at {start}+{} exceeds the tensor of {total}",
                        seam.name(),
                        v.len()
                    )));
                }
                for (i, x) in v.iter().enumerate() {
                    bits[start + i] = x.to_bits();
                }
                owners.push((rank, start, v.len()));
            }
            self.record.captures.insert(key, Capture { bits, owners });
        }
        Ok(())
    }

    /// Parts of a tensor held whole by the root.
    pub fn root_part(s: Slice) -> Vec<Part> {
        vec![(0, s, 0)]
    }

    /// Count one engagement of a door mechanism (the registry's `engagement` counter names).
    pub fn count(&mut self, counter: &str) {
        self.record.bump(counter);
    }

    /// GRAPH: whether layer `l`'s attention half is issued as a graph segment this step. Steps
    /// whose calls differ from every other step's — a full capture (host reads), a flip canary
    /// aimed at this layer and step, the stale-buffer canary (its o_join changes after step 0) —
    /// run the same position-independent launches eagerly instead, since a segment must issue the
    /// identical sequence on every pass.
    pub fn graph_segment(&self, l: usize) -> bool {
        let d = &self.cfg.doors;
        if !d.graph || d.canary == Some(Canary::StaleBuffer) {
            return false;
        }
        if let Some(Canary::FlipBit { layer, step, .. }) = d.canary {
            if layer == l && step == self.step {
                return false;
            }
        }
        !self.cfg.capture.iter().any(|k| k.prompt == self.prompt && k.step == self.step && k.layer == l)
    }

    /// Whether this step reads a stale buffer (the StaleBuffer canary, after the first step).
    pub fn stale(&self) -> bool {
        self.cfg.doors.canary == Some(Canary::StaleBuffer) && self.step > 0
    }
}

/// Run the whole battery of `cfg` on `b` and return the record.
pub fn run(model: &Model, cfg: &RunConfig, b: &mut dyn Backend) -> Result<Record> {
    if b.ranks() != cfg.tp {
        return Err(RuntimeError::Config(format!(
            "the backend has {} ranks but the run asks for TP {}",
            b.ranks(),
            cfg.tp
        )));
    }
    cfg.check_doors()?;
    let c = &model.config;
    c.validate()?;
    for (i, p) in cfg.battery.prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(RuntimeError::Config(format!("battery prompt {i} is empty: every prompt needs a token")));
        }
        if let Some(t) = p.iter().find(|t| **t as usize >= c.vocab) {
            return Err(RuntimeError::Config(format!(
                "battery prompt {i} has token {t}, outside the vocabulary of {}",
                c.vocab
            )));
        }
        let steps = cfg.battery.steps_of(i);
        if steps > c.max_positions {
            return Err(RuntimeError::Config(format!(
                "battery prompt {i} needs {steps} positions but the model's KV cache holds {}",
                c.max_positions
            )));
        }
    }
    if cfg.battery.gen_tokens == 0 {
        return Err(RuntimeError::Config("the battery generates 0 tokens: nothing would be tested".into()));
    }
    let p = Placement::new(model, cfg.tp, &cfg.doors, cfg.nvfp4_experts())?;
    let longest = (0..cfg.battery.prompts.len()).map(|i| cfg.battery.steps_of(i)).max().unwrap_or(1);
    let w = weights::upload(b, model, &p, &cfg.doors, cfg.nvfp4_experts(), longest)?;
    let buf = buffers::allocate(b, c, &p, model.layers.len())?;
    let n_layers = model.layers.len();
    let mut record = Record { n_layers, backend: b.describe(), build_options: b.build_options(), ..Record::default() };
    record.timings_ns = vec![Vec::new(); n_layers * Seam::LAYER.len() + Seam::HEAD.len()];
    let mut ctx = Ctx { b, model, cfg, p, w, buf, record, pending: Vec::new(), marked: Vec::new(), prompt: 0, step: 0 };
    if ctx.w.widened > 0 {
        ctx.record.engaged.insert("f32_mirror.widened_matrices".into(), ctx.w.widened);
    }
    for prompt in 0..cfg.battery.prompts.len() {
        decode_prompt(&mut ctx, prompt)?;
    }
    for (counter, n) in ctx.b.engagement() {
        if n > 0 {
            *ctx.record.engaged.entry(counter).or_insert(0) += n;
        }
    }
    Ok(ctx.record)
}

fn decode_prompt(ctx: &mut Ctx, prompt: usize) -> Result<()> {
    let cfg = ctx.cfg;
    let tokens = &cfg.battery.prompts[prompt];
    let n_prompt = tokens.len();
    let steps = cfg.battery.steps_of(prompt);
    let mut generated: Vec<u32> = Vec::new();
    let mut top2 = Vec::new();
    let mut digests = Vec::new();
    ctx.prompt = prompt;
    for step in 0..steps {
        ctx.step = step;
        let token = if let Some(t) = tokens.get(step) {
            *t
        } else {
            let j = step - n_prompt;
            match &cfg.forced_tokens {
                Some(f) => *f.get(prompt).and_then(|t| t.get(j)).ok_or_else(|| {
                    RuntimeError::Config(format!("teacher-forced tape has no token {j} for prompt {prompt}"))
                })?,
                None => generated[j],
            }
        };
        decode_step(ctx, token, step)?;
        let got = ctx.b.collect()?;
        // Seam digests: wrapping sum of the parts' digests.
        let mut row = vec![0u64; ctx.record.seams_per_step()];
        for (idx, tickets) in ctx.pending.drain(..) {
            row[idx] = tickets.iter().fold(0u64, |acc, t| acc.wrapping_add(got.digests[*t]));
        }
        // Timing: for each seam, the slowest rank's (end − begin).
        for (i, idx) in ctx.marked.drain(..).enumerate() {
            let dur = got
                .marks_ns
                .iter()
                .filter_map(|m| Some(m.get(2 * i + 1)?.saturating_sub(*m.get(2 * i)?)))
                .max()
                .unwrap_or(0);
            ctx.record.timings_ns[idx].push(dur);
        }
        digests.push(row);
        if step + 1 >= n_prompt {
            let logits = ctx.b.read(0, ctx.buf.root.logits)?;
            let amax = ctx.b.read(0, ctx.buf.root.amax)?[0].to_bits();
            top2.push(top_two(&logits));
            generated.push(amax);
        }
    }
    ctx.record.digests.push(digests);
    ctx.record.tokens.push(generated);
    ctx.record.top2.push(top2);
    Ok(())
}

/// The two largest logits (for near-tie margins).
pub fn top_two(x: &[f32]) -> (f32, f32) {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in x {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    (a, b)
}

fn decode_step(ctx: &mut Ctx, token: u32, pos: usize) -> Result<()> {
    let embed = embed_row(ctx.model, token);
    let x = ctx.buf.root.x;
    ctx.b.write(0, x, &embed)?;
    if ctx.cfg.doors.graph {
        // The position the captured layers read (battery validation keeps it inside the cache).
        for r in 0..ctx.p.tp {
            let out = ctx.buf.ranks[r].pos;
            ctx.b.launch(r, Op::SetU32 { out, value: pos as u32 })?;
        }
    }
    for l in 0..ctx.model.layers.len() {
        layer::attention_half(ctx, l, pos)?;
        layer::moe_half(ctx, l)?;
    }
    head(ctx)
}

/// The f32 embedding row of `token` (BF16 widened exactly).
fn embed_row(model: &Model, token: u32) -> Vec<f32> {
    let h = model.config.hidden;
    match &model.embed {
        crate::model::Matrix::Bf16 { bits, .. } => bits[token as usize * h..(token as usize + 1) * h]
            .iter()
            .map(|b| memra_kernels::formats::bf16_to_f32(*b))
            .collect(),
        crate::model::Matrix::E4m3 { .. } => unreachable!("the loader guarantees a BF16 embedding"),
    }
}

/// Final norm, lm_head, argmax (root).
fn head(ctx: &mut Ctx) -> Result<()> {
    let n = ctx.model.layers.len();
    let eps = ctx.model.config.eps;
    let r = ctx.buf.root.clone();
    let params = ctx.w.params[0];
    ctx.begin()?;
    let w = ctx.w.param_layout.final_norm(params);
    ctx.b.launch(0, Op::RmsNorm { x: r.x, w, eps, out: r.fnorm })?;
    ctx.seam(n, Seam::FinalNorm, &Ctx::root_part(r.fnorm))?;
    ctx.begin()?;
    ctx.b.launch(0, Op::GemvRows { w: ctx.w.lm_head, x: r.fnorm, out: r.logits, order: RowOrder::Canonical })?;
    ctx.b.launch(0, Op::Argmax { x: r.logits, out: r.amax })?;
    ctx.seam(n, Seam::Logits, &Ctx::root_part(r.logits))
}
