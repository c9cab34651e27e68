//! The record a subject produces and the gates consume (docs/DESIGN.md §10): layer × seam × step
//! digests, optional full tensors, token tapes, engaged doors and timings. Nothing in it refers
//! to runtime internals, so an external engine's tape can be turned into the same record.

use std::collections::BTreeMap;

/// A named point of the decode step where every rank's result is defined (docs/DESIGN.md §3.2).
/// `FinalNorm` and `Logits` exist only on the pseudo-layer `n_layers` (after the last layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Seam {
    AttnNorm,
    Qkv,
    Rope,
    Attn,
    OProj,
    OJoin,
    FfnNorm,
    Router,
    Experts,
    MoeJoin,
    Residual,
    FinalNorm,
    Logits,
}

impl Seam {
    /// Seams of a transformer layer, in program order.
    pub const LAYER: [Seam; 11] = [
        Seam::AttnNorm,
        Seam::Qkv,
        Seam::Rope,
        Seam::Attn,
        Seam::OProj,
        Seam::OJoin,
        Seam::FfnNorm,
        Seam::Router,
        Seam::Experts,
        Seam::MoeJoin,
        Seam::Residual,
    ];
    /// Seams of the pseudo-layer after the last layer.
    pub const HEAD: [Seam; 2] = [Seam::FinalNorm, Seam::Logits];

    pub fn name(self) -> &'static str {
        match self {
            Seam::AttnNorm => "attn_norm",
            Seam::Qkv => "qkv",
            Seam::Rope => "rope",
            Seam::Attn => "attn",
            Seam::OProj => "o_proj",
            Seam::OJoin => "o_join",
            Seam::FfnNorm => "ffn_norm",
            Seam::Router => "router",
            Seam::Experts => "experts",
            Seam::MoeJoin => "moe_join",
            Seam::Residual => "residual",
            Seam::FinalNorm => "final_norm",
            Seam::Logits => "logits",
        }
    }

    pub fn parse(s: &str) -> Option<Seam> {
        Seam::LAYER.into_iter().chain(Seam::HEAD).find(|x| x.name() == s)
    }

    /// Position of the seam inside its layer's row of digests.
    pub fn slot(self) -> usize {
        match self {
            Seam::FinalNorm => 0,
            Seam::Logits => 1,
            other => Seam::LAYER.iter().position(|s| *s == other).unwrap_or(0),
        }
    }
}

/// Identifies one seam tensor of one run: prompt, decode step within the prompt, layer, seam.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CaptureKey {
    pub prompt: usize,
    pub step: usize,
    pub layer: usize,
    pub seam: Seam,
}

/// A full logical seam tensor (raw 32-bit patterns) and which rank produced which range.
#[derive(Debug, Clone, PartialEq)]
pub struct Capture {
    pub bits: Vec<u32>,
    /// (rank, first global element, element count), covering `bits` exactly once.
    pub owners: Vec<(usize, usize, usize)>,
}

impl Capture {
    /// Rank that produced element `idx`.
    pub fn owner_of(&self, idx: usize) -> Option<usize> {
        self.owners.iter().find(|(_, start, len)| idx >= *start && idx < start + len).map(|o| o.0)
    }
}

/// Latency samples of one layer × seam (nanoseconds, one per decode step).
pub type SeamSamples = Vec<u64>;

/// What one run of a subject produced.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record {
    /// Transformer layers (the head pseudo-layer has index `n_layers`).
    pub n_layers: usize,
    /// `digests[prompt][step]` = `n_layers * 11` layer seam digests (layer-major, `Seam::LAYER`
    /// order) followed by the 2 head seam digests.
    pub digests: Vec<Vec<Vec<u64>>>,
    /// Generated tokens per prompt (`gen_tokens` each).
    pub tokens: Vec<Vec<u32>>,
    /// Per generated token: (top-1 logit, top-2 logit) of the step that produced it.
    pub top2: Vec<Vec<(f32, f32)>>,
    /// Engagement counters: door mechanism name → times it ran.
    pub engaged: BTreeMap<String, u64>,
    /// Per layer (incl. head pseudo-layer) × seam latency samples, same indexing as a digest row.
    pub timings_ns: Vec<SeamSamples>,
    /// Per layer (index `n_layers`: the head) whole-layer latency samples: from before its first
    /// seam to after its digests (everything the layer costs, gating included).
    pub layer_timings_ns: Vec<SeamSamples>,
    /// Full tensors requested through `RunConfig::capture`.
    pub captures: BTreeMap<CaptureKey, Capture>,
    /// Human-readable description of the backend and placement that produced it.
    pub backend: String,
    /// Compiler options that decided the arithmetic (empty for the host twins).
    pub build_options: Vec<String>,
    /// What the backend carried out (`Witness::census`; a read-only `Census` only a backend makes):
    /// launches per kernel, copies per
    /// transport and size, peer stores, … — the engagement gate's evidence.
    pub census: crate::evidence::census::Census,
    /// Coverage of the special paths (`backend::coverage`), where the backend counts it (host).
    pub coverage: Option<crate::evidence::coverage::Coverage>,
    /// `rank_digests[prompt][step][seam index][rank]`: each rank's share of a seam digest (the
    /// wrapping sum over ranks is the seam digest), to name the rank of a divergence.
    pub rank_digests: Vec<Vec<Vec<Vec<u64>>>>,
    /// Cross-rank copies whose destination was checked against its source (digests at the end of
    /// the copy's layer), and those whose destination differed.
    pub copies_verified: u64,
    pub copy_faults: Vec<CopyFault>,
    /// Rows and columns (docs/DESIGN.md §3.6): `lanes[prompt][step]` = (pass, lane) that
    /// computed the step — its row (batch) or column (verify/prefill) in that pass. Empty for a
    /// run of single-token passes.
    pub lanes: Vec<Vec<(u32, u8)>>,
}

/// A cross-rank copy whose destination did not equal its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CopyFault {
    pub prompt: usize,
    pub step: usize,
    pub layer: usize,
    /// The seam whose tensor the copy moved (the copy follows that seam in program order).
    pub seam: Seam,
    pub src_rank: usize,
    pub dst_rank: usize,
}

impl Record {
    /// Index of (layer, seam) inside a digest row.
    pub fn seam_index(n_layers: usize, layer: usize, seam: Seam) -> usize {
        if layer == n_layers {
            n_layers * Seam::LAYER.len() + seam.slot()
        } else {
            layer * Seam::LAYER.len() + seam.slot()
        }
    }

    /// Inverse of `seam_index`.
    pub fn seam_at(n_layers: usize, idx: usize) -> (usize, Seam) {
        let per = Seam::LAYER.len();
        if idx >= n_layers * per {
            (n_layers, Seam::HEAD[idx - n_layers * per])
        } else {
            (idx / per, Seam::LAYER[idx % per])
        }
    }

    /// The first (prompt, step, layer, seam) whose digest differs between two records of one plan
    /// (compared over the prompts and steps both have), or None: the tests' verdict of "the same
    /// bits". The gates' `first_difference` also names the element, the rank and the bits.
    pub fn first_digest_difference(&self, other: &Record) -> Option<(usize, usize, usize, Seam)> {
        for (p, (ra, rb)) in self.digests.iter().zip(&other.digests).enumerate() {
            for (s, (da, db)) in ra.iter().zip(rb).enumerate() {
                if let Some(i) = da.iter().zip(db).position(|(x, y)| x != y) {
                    let (layer, seam) = Record::seam_at(self.n_layers, i);
                    return Some((p, s, layer, seam));
                }
            }
        }
        None
    }

    /// Seams compared per step.
    pub fn seams_per_step(&self) -> usize {
        self.n_layers * Seam::LAYER.len() + Seam::HEAD.len()
    }

    pub fn bump(&mut self, counter: &str) {
        *self.engaged.entry(counter.to_string()).or_insert(0) += 1;
    }
}
