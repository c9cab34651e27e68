//! The canonical decode program (docs/DESIGN.md §3.2–§3.4), written once against the backend trait.
//!
//! `run` decodes the battery prompt by prompt, token by token. At every seam it queues one digest
//! per rank-held part of the seam's *logical* tensor (each with its global base index, so the
//! parts add up to the digest of the whole tensor whatever the TP size), and, when asked, reads
//! the parts back as a full capture. Timing marks bracket each seam's compute on every rank.

pub mod buffers;
mod copies;
mod ep_host;
mod lanes;
mod layer;
mod moe;
mod passes;
pub mod payloads;
pub mod placement;
pub mod pool;
mod prepared;
pub mod weights;

pub use prepared::{prepare, Layout, Prepared};

use crate::backend::{capability, Backend, DigestPart, Op, RowOrder, Slice};
use crate::config::{Canary, RunConfig, Timing};
use crate::error::RuntimeError;
use crate::evidence::coverage::{self, Coverage, SeamPoint};
use crate::evidence::record::{Capture, CaptureKey, Record, Seam};
use crate::model::Model;
use crate::Result;
use buffers::Buffers;
use placement::Placement;
use weights::Uploaded;

/// One part of a seam's logical tensor: the slice of it that one rank holds, and where that slice
/// starts in the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeamPart {
    /// The rank holding the slice.
    pub rank: usize,
    /// The slice, on that rank.
    pub slice: Slice,
    /// Index in the seam's logical tensor of the slice's first element.
    pub offset: u64,
}

/// What a pair of timing marks measures.
#[derive(Debug, Clone, Copy)]
enum Timed {
    /// A seam (its index in a digest row).
    Seam(usize),
    /// A whole layer (`n_layers`: the head).
    Layer(usize),
}

/// How the GRAPH door captures this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GraphMode {
    /// Everything eager.
    Eager,
    /// The whole step (every layer and the head) is one segment.
    Step,
    /// Only each layer's attention half is a segment (the MoE half reads the route on the host).
    AttentionHalves,
}

/// Segment key of the whole-step graph (per-layer segments use the layer index).
pub(super) const STEP_SEGMENT: u64 = 1 << 40;

/// Everything the step functions need.
pub(crate) struct Ctx<'a> {
    /// The machine every op, copy and digest is issued to.
    pub backend: &'a mut dyn Backend,
    pub model: &'a Model,
    pub cfg: &'a RunConfig,
    /// Who owns which chunk, K-block and expert at this TP size.
    pub placement: Placement,
    /// The weights on the ranks (ids per rank and layer, the expert groups).
    pub weights: Uploaded,
    /// The activation buffers and KV caches of every rank.
    pub buffers: Buffers,
    pub record: Record,
    /// (lane, seam index in the row, rank, digest tickets) queued during the current pass; a
    /// seam's value is the wrapping sum over all its entries' tickets. Indices past the row are
    /// the two sides of a copy check (`copies.rs`).
    pending: Vec<(usize, usize, usize, Vec<usize>)>,
    /// Cross-rank copies of this step whose destinations are checked (`copies.rs`).
    checks: Vec<copies::CopyCheck>,
    /// The layer being issued (the head: `n_layers`).
    layer: usize,
    /// Digest parts of the seams closed since the last flush: (lane, seam index, rank, part).
    batch: Vec<(usize, usize, usize, DigestPart)>,
    /// Intervals timed this step: (what, first mark, second mark), marks counted per rank.
    timed: Vec<(Timed, usize, usize)>,
    marks: usize,
    seam_start: Option<usize>,
    layer_start: Option<usize>,
    /// The lanes of the current pass (rows or columns; one for single-token decode).
    pass: Vec<lanes::Lane>,
    /// The lanes the next launch, copy or seam is issued for (indices into `pass`).
    active: Vec<usize>,
    /// Per lane: the position its device-held `pos` holds (DCW's counter advances from it).
    lane_pos: Vec<Option<usize>>,
    /// The coverage of arithmetic the program itself runs on the host (STEP_EP's owner SwiGLU
    /// without EP_DEVICE_ARITHMETIC, `moe.rs`), added to a counting backend's at the end.
    host_coverage: Coverage,
}

impl Ctx<'_> {
    /// Queue a timing mark on every rank; returns its index in this step.
    fn mark(&mut self) -> Result<usize> {
        self.backend.mark()?;
        self.marks += 1;
        Ok(self.marks - 1)
    }

    /// Mark the start of seam `seam`'s compute of layer `layer`: the backend learns where the
    /// program is (coverage's first places), and every rank gets a timing mark (per-seam timing).
    pub fn begin(&mut self, layer: usize, seam: Seam) -> Result<()> {
        self.layer = layer;
        let first = self.pass[self.active[0]];
        self.backend.note_position(SeamPoint { prompt: first.prompt, step: first.step, layer, seam });
        if self.cfg.timing == Timing::Seams {
            self.seam_start = Some(self.mark()?);
        }
        Ok(())
    }

    /// Mark the start of layer `l` (the head: `n_layers`).
    pub fn layer_begin(&mut self) -> Result<()> {
        if self.cfg.timing != Timing::Off {
            self.layer_start = Some(self.mark()?);
        }
        Ok(())
    }

    /// Close layer `l`: one batched digest launch per rank for every seam of the layer, then the
    /// layer's end mark. Every seam tensor of a layer lives until the layer ends (no kernel of the
    /// layer overwrites one), so digesting them here reads exactly what each seam produced.
    pub fn layer_end(&mut self, l: usize) -> Result<()> {
        self.flush_digests()?;
        if let Some(start) = self.layer_start.take() {
            let end = self.mark()?;
            self.timed.push((Timed::Layer(l), start, end));
        }
        Ok(())
    }

    fn flush_digests(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        for rank in 0..self.placement.tp {
            let mut keys: Vec<(usize, usize)> = Vec::new();
            let mut groups: Vec<Vec<DigestPart>> = Vec::new();
            for &(lane, idx, _, part) in batch.iter().filter(|e| e.2 == rank) {
                if keys.last() != Some(&(lane, idx)) {
                    keys.push((lane, idx));
                    groups.push(Vec::new());
                }
                groups.last_mut().expect("pushed above").push(part);
            }
            if groups.is_empty() {
                continue;
            }
            let tickets = self.backend.digest_batch(rank, &groups)?;
            self.pending.extend(keys.into_iter().zip(tickets).map(|((lane, idx), t)| (lane, idx, rank, t)));
        }
        Ok(())
    }

    /// Close a seam whose parts are plain slices.
    pub fn seam(&mut self, layer: usize, seam: Seam, parts: &[SeamPart]) -> Result<()> {
        let parts: Vec<(usize, DigestPart)> =
            parts.iter().map(|p| (p.rank, DigestPart::plain(p.slice, p.offset))).collect();
        self.seam_parts(layer, seam, &parts)
    }

    /// Close a seam: end mark, then for every active lane the flip canary if it targets this
    /// seam and the lane's step, the lane's parts queued for the layer's batched digest, and a
    /// full capture when requested. `parts` are lane 0's.
    pub fn seam_parts(&mut self, layer: usize, seam: Seam, parts: &[(usize, DigestPart)]) -> Result<()> {
        let idx = Record::seam_index(self.record.n_layers, layer, seam);
        if let Some(start) = self.seam_start.take() {
            let end = self.mark()?;
            self.timed.push((Timed::Seam(idx), start, end));
        }
        for l in self.active.clone() {
            let lane = self.pass[l];
            let parts: Vec<(usize, DigestPart)> = parts.iter().map(|&(r, p)| (r, self.lane_part(r, p, l))).collect();
            if lane.live {
                self.flip_canary(layer, seam, lane.step, &parts)?;
            }
            if self.cfg.digests {
                self.batch.extend(parts.iter().map(|&(rank, part)| (l, idx, rank, part)));
            }
            let key = CaptureKey { prompt: lane.prompt, step: lane.step, layer, seam };
            if lane.live && self.cfg.capture.contains(&key) {
                self.capture(key, &parts)?;
            }
        }
        Ok(())
    }

    /// The flip canary, when it targets this seam at `step`: the low bit of its element flipped
    /// on the rank holding it (parts already on the lane's buffers).
    fn flip_canary(&mut self, layer: usize, seam: Seam, step: usize, parts: &[(usize, DigestPart)]) -> Result<()> {
        let Some(Canary::FlipBit { layer: cl, seam: cs, step: st, element }) = self.cfg.doors.canary else {
            return Ok(());
        };
        if cl != layer || cs != seam || st != step {
            return Ok(());
        }
        let e = element as u64;
        let SeamPart { rank, slice, offset } = self
            .resolve_parts(parts)?
            .into_iter()
            .find(|p| p.offset <= e && e < p.offset + p.slice.len as u64)
            .ok_or_else(|| RuntimeError::DoorRefused {
                door: "MEMRA_CANARY_FLIP_BIT",
                rule: format!(
                    "the flip canary's element {element} of seam {} (layer {layer}) is held by no rank: choose an element of the seam's logical tensor (program::payloads::seam_elements)",
                    seam.name()
                ),
            })?;
        self.backend.launch(rank, Op::FlipLowBit { x: slice.sub((e - offset) as usize, 1) })?;
        self.record.bump("canary_flip_bit.flips");
        Ok(())
    }

    /// A full capture of a seam (parts already on the lane's buffers).
    fn capture(&mut self, key: CaptureKey, parts: &[(usize, DigestPart)]) -> Result<()> {
        let parts = self.resolve_parts(parts)?;
        // Parts may leave gaps (the expert slot stride is the largest G); gaps read as +0.0.
        let total: usize = parts.iter().map(|p| p.offset as usize + p.slice.len).max().unwrap_or(0);
        let mut bits = vec![0u32; total];
        let mut owners = Vec::new();
        for &SeamPart { rank, slice, offset } in &parts {
            let v = self.backend.read(rank, slice)?;
            let start = offset as usize;
            for (i, x) in v.iter().enumerate() {
                bits[start + i] = x.to_bits();
            }
            owners.push((rank, start, v.len()));
        }
        self.record.captures.insert(key, Capture { bits, owners });
        Ok(())
    }

    /// The plain slices a seam's digest parts stand for: every block, and for an owned part only
    /// the blocks whose slot the rank owns (the route is read from the rank: host reads happen
    /// only on the eager steps of a capture or a flip canary).
    fn resolve_parts(&mut self, parts: &[(usize, DigestPart)]) -> Result<Vec<SeamPart>> {
        let mut out = Vec::new();
        for &(rank, p) in parts {
            let ids = match p.owned {
                Some(o) => Some(self.backend.read(rank, o.route)?),
                None => None,
            };
            for i in 0..p.blocks {
                if let (Some(o), Some(ids)) = (p.owned, &ids) {
                    if !o.owner.owns(ids, o.first_slot + i) {
                        continue;
                    }
                }
                out.push(SeamPart { rank, slice: p.block(i), offset: p.base + i as u64 * p.base_pitch });
            }
        }
        Ok(out)
    }

    /// Parts of a tensor held whole by the root.
    pub fn root_part(slice: Slice) -> Vec<SeamPart> {
        vec![SeamPart { rank: 0, slice, offset: 0 }]
    }

    /// Count one engagement of a door mechanism (the registry's `engagement` counter names).
    pub fn count(&mut self, counter: &str) {
        self.record.bump(counter);
    }

    /// Whether the MoE half reads the route on the host: MOE_DIRECT on whole experts owned by
    /// data-dependent ranks stores each slot from its owner, and counts each such store, so the
    /// program must know the owners when it issues the stores.
    pub fn host_routes(&self) -> bool {
        self.cfg.doors.moe_direct && self.placement.experts == placement::ExpertMode::ExpertParallel
    }

    /// STEP_EP without EP_DEVICE_ARITHMETIC: the owners' routed SwiGLU and the root's weighted
    /// combine run in the program, on the host twin, between a backend read and a write
    /// (`moe.rs`); with the door (or without STEP_EP) they are device launches.
    pub fn ep_host_arithmetic(&self) -> bool {
        let d = &self.cfg.doors;
        d.step_ep && !d.ep_device_arithmetic && self.placement.experts == placement::ExpertMode::ExpertParallel
    }

    /// Count `n` reaches of coverage path `path` by the program's host arithmetic at `at`.
    pub fn note_coverage(&mut self, path: &str, at: SeamPoint, n: u64) {
        coverage::note(&mut self.host_coverage, path, Some(at), n);
    }

    /// GRAPH: how this step is issued. Steps whose calls differ from every other step's — a full
    /// capture (host reads), a flip canary aimed at this step, the stale-buffer canary (its
    /// o_join changes after step 0) — run the same launches eagerly instead, since a segment must
    /// issue the identical sequence on every pass.
    pub fn graph_mode(&self) -> GraphMode {
        let d = &self.cfg.doors;
        if !d.graph || d.canary == Some(Canary::StaleBuffer) {
            return GraphMode::Eager;
        }
        // The MoE half stays eager where it reads the route on the host, where its expert-parallel
        // arithmetic bounces through the host, or where FENCE_MEMOPS rings a fresh doorbell
        // ticket at every join (a replay would ring the captured one).
        if self.host_routes() || self.ep_host_arithmetic() || (d.moe_direct && d.fence_memops) {
            return GraphMode::AttentionHalves;
        }
        if let Some(Canary::FlipBit { step, .. }) = d.canary {
            if self.any_lane(|lane| lane.step == step) {
                return GraphMode::Eager;
            }
        }
        // Rows: a session starting in a later pass gets the broken copy of its step 0.
        if d.canary == Some(Canary::BrokenBroadcast) && self.any_lane(|lane| lane.step == 0) {
            return GraphMode::Eager;
        }
        if self.any_lane(|lane| self.cfg.capture.iter().any(|k| k.prompt == lane.prompt && k.step == lane.step)) {
            return GraphMode::Eager;
        }
        GraphMode::Step
    }

    /// GRAPH with host routes: whether layer `l`'s attention half is a segment this step.
    pub fn graph_segment(&self, l: usize) -> bool {
        let d = &self.cfg.doors;
        if self.graph_mode() != GraphMode::AttentionHalves {
            return false;
        }
        if let Some(Canary::FlipBit { layer, step, .. }) = d.canary {
            if layer == l && self.any_lane(|lane| lane.step == step) {
                return false;
            }
        }
        !self.any_lane(|lane| {
            self.cfg.capture.iter().any(|k| k.prompt == lane.prompt && k.step == lane.step && k.layer == l)
        })
    }

    /// Issue `calls` as the graph segment `key` (GRAPH): recorded, captured, then replayed by the
    /// backend; an error abandons the segment.
    /// The key carries the pass's lane count: a pass of n lanes issues its own sequence.
    pub fn in_segment(&mut self, key: u64, calls: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let key = key ^ ((self.active.len() as u64) << 48);
        capability::graphs(self.backend)?.segment_begin(key)?;
        match calls(self) {
            Ok(()) => capability::graphs(self.backend)?.segment_end(),
            Err(e) => {
                if let Some(g) = self.backend.graphs() {
                    g.segment_abort();
                }
                Err(e)
            }
        }
    }

    /// Whether this pass reads a stale buffer (the StaleBuffer canary, once a lane is past its
    /// first step).
    pub fn stale(&self) -> bool {
        self.cfg.doors.canary == Some(Canary::StaleBuffer) && self.any_lane(|lane| lane.step > 0)
    }
}

/// Run the whole battery of `cfg` on `b` and return the record: the weights are placed for this
/// run alone ([`prepare`], then [`run_prepared`]).
pub fn run(model: &Model, cfg: &RunConfig, b: &mut dyn Backend) -> Result<Record> {
    check_run(model, cfg, b)?;
    let prepared = prepare(model, Layout::of(cfg), b)?;
    run_prepared(model, cfg, b, &prepared)
}

/// Run the whole battery of `cfg` on weights already placed on `b` by [`prepare`] for
/// `Layout::of(cfg)`: fresh activation buffers and KV caches, the backend rewound to the upload
/// first, so the record is the one [`run`] gives on a fresh backend.
pub fn run_prepared(model: &Model, cfg: &RunConfig, b: &mut dyn Backend, prepared: &Prepared) -> Result<Record> {
    let _clock = crate::host_clock::start(crate::host_clock::Entry::Run);
    check_run(model, cfg, b)?;
    let layout = Layout::of(cfg);
    if layout != prepared.layout {
        return Err(RuntimeError::Contract(format!(
            "the run needs the weights laid out as {layout:?}, but they were prepared as {:?}",
            prepared.layout
        )));
    }
    prepared.begin_run(b)?;
    let c = &model.config;
    let p = prepared.placement.clone();
    let w = prepared.uploaded.clone();
    let buf = buffers::allocate(b, c, &p, model.layers.len(), cfg.pass)?;
    let n_layers = model.layers.len();
    if let Some(d) = cfg.doors.canary.and_then(|c| c.twin_defect()) {
        b.plant(d)?;
    }
    let mut record = Record { n_layers, backend: b.describe(), build_options: b.build_options(), ..Record::default() };
    record.timings_ns = vec![Vec::new(); n_layers * Seam::LAYER.len() + Seam::HEAD.len()];
    record.layer_timings_ns = vec![Vec::new(); n_layers + 1];
    let mut ctx = Ctx {
        backend: b,
        model,
        cfg,
        placement: p,
        weights: w,
        buffers: buf,
        record,
        pending: Vec::new(),
        checks: Vec::new(),
        layer: 0,
        batch: Vec::new(),
        timed: Vec::new(),
        marks: 0,
        seam_start: None,
        layer_start: None,
        pass: vec![lanes::Lane { prompt: 0, step: 0, live: true }],
        active: vec![0],
        lane_pos: Vec::new(),
        host_coverage: Coverage::new(),
    };
    if ctx.weights.widened > 0 {
        ctx.record.engaged.insert("f32_mirror.widened_matrices".into(), ctx.weights.widened);
    }
    passes::run_battery(&mut ctx)?;
    for (counter, n) in ctx.backend.engagement() {
        if n > 0 {
            *ctx.record.engaged.entry(counter).or_insert(0) += n;
        }
    }
    ctx.record.census = ctx.backend.census();
    ctx.record.coverage = ctx.backend.coverage()?;
    // A backend that counts coverage counts the arithmetic it runs; the program's own host twin
    // arithmetic counts beside it (on a backend that does not count, neither does the program).
    if let Some(c) = ctx.record.coverage.as_mut() {
        coverage::merge(c, &ctx.host_coverage);
    }
    Ok(ctx.record)
}

/// What every run checks before any work: ranks, doors, model, battery.
fn check_run(model: &Model, cfg: &RunConfig, b: &dyn Backend) -> Result<()> {
    if b.ranks() != cfg.tp.get() {
        return Err(RuntimeError::Contract(format!(
            "the backend has {} ranks but the run asks for TP {}",
            b.ranks(),
            cfg.tp
        )));
    }
    cfg.check_doors()?;
    let c = &model.config;
    c.validate()?;
    let down8_max = memra_kernels::twins::down8::DOWN8_MAX_COLS;
    if cfg.doors.sel_down8 && c.expert_width > down8_max {
        return Err(RuntimeError::DoorRefused {
            door: "MEMRA_SEL_DOWN8",
            rule: format!(
                "MEMRA_SEL_DOWN8 sweeps a slot's whole down row in one warp, at most {down8_max} values (the engine's \
                 (local_in >> 5) <= 32); this model's routed experts are {} wide",
                c.expert_width
            ),
        });
    }
    for (i, p) in cfg.battery.prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(RuntimeError::Battery {
                prompt: Some(i),
                rule: format!("battery prompt {i} is empty: every prompt needs a token"),
            });
        }
        if let Some(t) = p.iter().find(|t| **t as usize >= c.vocab) {
            return Err(RuntimeError::Battery {
                prompt: Some(i),
                rule: format!("battery prompt {i} has token {t}, outside the vocabulary of {}", c.vocab),
            });
        }
        let steps = cfg.battery.steps_of(i);
        if steps > c.max_positions {
            return Err(RuntimeError::Battery {
                prompt: Some(i),
                rule: format!(
                    "battery prompt {i} needs {steps} positions but the model's KV cache holds {}",
                    c.max_positions
                ),
            });
        }
    }
    if cfg.battery.gen_tokens == 0 {
        return Err(RuntimeError::Battery {
            prompt: None,
            rule: "the battery generates 0 tokens: nothing would be tested".into(),
        });
    }
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

/// Every layer and the head, as issued in one step.
pub(super) fn step_calls(ctx: &mut Ctx) -> Result<()> {
    for l in 0..ctx.model.layers.len() {
        ctx.layer_begin()?;
        layer::attention_half(ctx, l)?;
        moe::moe_half(ctx, l)?;
        ctx.layer_end(l)?;
    }
    head(ctx)
}

/// The f32 embedding row of `token` (BF16 widened exactly).
pub(super) fn embed_row(model: &Model, token: u32) -> Vec<f32> {
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
    let r = ctx.buffers.root.clone();
    let params = ctx.weights.params[0];
    ctx.layer_begin()?;
    ctx.begin(n, Seam::FinalNorm)?;
    let w = ctx.weights.param_layout.final_norm(params);
    ctx.launch(0, Op::RmsNorm { x: r.x, w, eps, out: r.fnorm })?;
    ctx.seam(n, Seam::FinalNorm, &Ctx::root_part(r.fnorm))?;
    ctx.begin(n, Seam::Logits)?;
    ctx.launch(0, Op::GemvRows { w: ctx.weights.lm_head, x: r.fnorm, out: r.logits, order: RowOrder::Canonical })?;
    ctx.launch(0, Op::Argmax { x: r.logits, out: r.amax })?;
    ctx.seam(n, Seam::Logits, &Ctx::root_part(r.logits))?;
    ctx.layer_end(n)
}
