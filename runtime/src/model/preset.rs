//! Model configuration and the presets `tiny`, `small`, `step` (docs/DESIGN.md §3.1).
//!
//! A configuration is the one place where a model's shapes are decided, so it is also the one
//! place where shapes are checked against the canonical grid of docs/DESIGN.md §3.4: a configuration
//! that [`ModelConfig::validate`] accepts can be sharded at every TP size the plan allows, and
//! one it refuses is refused before any weight is generated or loaded, with a message that names
//! the tensor, the width and the rule.
//!
//! | preset | hidden | layers | q / kv heads × 128 | routed experts | top-k | width | shared | vocab | positions | unclamped layers |
//! |---|---|---|---|---|---|---|---|---|---|---|
//! | `tiny` (CI default) | 1024 | 2 | 8 / 8 | 8 | 2 | 1024 | 1024 | 1024 | 64 | 1 |
//! | `small` | 2048 | 4 | 16 / 8 | 32 | 4 | 1024 | 1024 | 8192 | 64 | none |
//! | `step` (performance shapes) | 4096 | caller's | 32 / 8 | 288 | 8 | 1280 | 1280 | 32768 | 256 | none |
//! | `edge` (special paths; `model::edge`) | 256 | 2 | 8 / 8 | 8 | 2 | 256 | 128 | 256 | 64 | 1 |
//!
//! Scalars, the same for every preset: `eps` 1e-6, `rope_theta` 10000, `swiglu_limit` 7.0,
//! `route_scale` 2.5, `route_norm` true. `route_scale` is Step's 2.5 on the small presets too:
//! a scale of 1.0 would let a program that forgets to apply it pass every comparison with the
//! reference.
//!
//! The SwiGLU clamp is a property of each layer, as in Step (which clamps only some layers):
//! `swiglu_limit` applies to every layer not listed in `unclamped_layers`
//! ([`ModelConfig::swiglu_limit_at`]). `tiny` and `edge` leave layer 1 unclamped (when the
//! caller's layer count has a layer 1), so both kinds of layer — and the doors that serve only
//! unclamped ones — run on the default models; `small` and `step` clamp every layer.

use crate::error::RuntimeError;
use memra_kernels::twins::gemv::{canonical_kblocks, WeightFormat};

/// Shapes and scalar constants of a model. Serialized into the safetensors metadata.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub preset: String,
    pub hidden: usize,
    pub layers: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub experts: usize,
    pub top_k: usize,
    pub expert_width: usize,
    pub shared_width: usize,
    pub vocab: usize,
    pub eps: f32,
    pub rope_theta: f32,
    /// Step's SwiGLU clamp limit (finite, > 0) or none, for every layer not in `unclamped_layers`.
    pub swiglu_limit: Option<f32>,
    /// The layers whose SwiGLU has no clamp (ascending, distinct, each < `layers`). Absent from
    /// the JSON when empty, so a fully clamped model reads and writes as before the field existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unclamped_layers: Vec<usize>,
    pub route_scale: f32,
    pub route_norm: bool,
    /// Longest sequence (positions) the KV cache holds.
    pub max_positions: usize,
}

/// The preset names, in the order error messages list them.
pub const PRESETS: [&str; 4] = ["tiny", "small", "step", "edge"];

/// Canonical chunks of a column-parallel projection and of a TP-sharded head set (docs/DESIGN.md §3.4).
const CANONICAL_CHUNKS: usize = 8;
/// Side of an E4M3 scale block.
const SCALE_BLOCK: usize = memra_kernels::formats::E4M3_BLOCK;
/// Largest value of any count in a configuration (2^24).
const MAX_DIM: usize = 1 << 24;
/// The one head width the attention kernels and the q/k norms are defined for.
const HEAD_DIM: usize = 128;

impl ModelConfig {
    /// A preset by name; `layers` overrides the preset's layer count (the `step` preset needs it).
    /// The result is validated, so `layers: Some(0)` is refused here.
    pub fn preset(name: &str, layers: Option<usize>) -> Result<ModelConfig, RuntimeError> {
        // (hidden, default layers, q_heads, kv_heads, experts, top_k, width, shared, vocab, positions)
        let shape = match name {
            "tiny" => (1024, Some(2), 8, 8, 8, 2, 1024, 1024, 1024, 64),
            "small" => (2048, Some(4), 16, 8, 32, 4, 1024, 1024, 8192, 64),
            "step" => (4096, None, 32, 8, 288, 8, 1280, 1280, 32768, 256),
            // Built to reach every special path (`model::edge`): small, and its widths give
            // TP-sharded routed experts at TP2, expert-parallel ones at TP4 and TP8, and a shared
            // expert of one K-block (whole on rank 0 at TP > 1).
            "edge" => (256, Some(2), 8, 8, 8, 2, 256, 128, 256, 64),
            other => {
                return Err(RuntimeError::Preset {
                    name: other.to_string(),
                    rule: format!("model preset `{other}` is unknown; the presets are {}", PRESETS.join(", ")),
                })
            }
        };
        let (hidden, default_layers, q_heads, kv_heads, experts, top_k, expert_width, shared_width, vocab, positions) =
            shape;
        let layers = layers.or(default_layers).ok_or_else(|| RuntimeError::Preset {
            name: name.to_string(),
            rule: format!(
                "model preset `{name}` has no default layer count: give one (e.g. --layers 4); \
                 its layers are 4096 wide with 288 experts each, so the count decides memory and time"
            ),
        })?;
        // Layer 1 of the small random presets is unclamped (module docs); a caller's layer count
        // without a layer 1 leaves the model fully clamped.
        let unclamped_layers = match name {
            "tiny" | "edge" => [1].into_iter().filter(|l| *l < layers).collect(),
            _ => Vec::new(),
        };
        let config = ModelConfig {
            preset: name.to_string(),
            hidden,
            layers,
            q_heads,
            kv_heads,
            head_dim: HEAD_DIM,
            experts,
            top_k,
            expert_width,
            shared_width,
            vocab,
            eps: 1e-6,
            rope_theta: 10000.0,
            swiglu_limit: Some(7.0),
            unclamped_layers,
            route_scale: 2.5,
            route_norm: true,
            max_positions: positions,
        };
        config.validate()?;
        Ok(config)
    }

    /// Check every shape rule of the canonical grid (heads and widths divisible into 8 chunks,
    /// K-blocks of whole scale blocks, head_dim 128, top_k ≤ experts…); the error names the
    /// tensor, the width and the rule.
    ///
    /// The rules, and why:
    /// - every count ≤ 2^24, `layers ≥ 1`, `max_positions ≥ 1`;
    /// - `head_dim == 128` (attention kernels, q/k norm and RoPE tables are 128 wide);
    /// - `q_heads`, `kv_heads` positive multiples of 8 (8 canonical chunks of whole heads) and
    ///   `q_heads % kv_heads == 0` (whole query groups per KV head);
    /// - `hidden % 128 == 0` (E4M3 experts take `hidden` as in_features; K-blocks are whole
    ///   128-column scale blocks), expert and shared widths `% 128 == 0` (the down projections);
    /// - `experts` a positive multiple of 8 (router rows in 8 chunks; expert-parallel ownership),
    ///   `vocab` a positive multiple of 8 (lm_head rows in 8 chunks), `1 ≤ top_k ≤ experts`;
    /// - `eps`, `rope_theta`, `route_scale` and `swiglu_limit` (when set) finite and > 0;
    /// - `unclamped_layers` strictly ascending (so no duplicate) and each entry < `layers`;
    /// - every matrix has a canonical K-block count (`canonical_kblocks`).
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let fail = |rule: String| Err(RuntimeError::ModelShape { rule });
        // A bound on every count keeps the shape products of later code (two dimensions at a
        // time) far from overflow, whatever a file's metadata claims.
        for (what, value) in [
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("q_heads", self.q_heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("experts", self.experts),
            ("top_k", self.top_k),
            ("expert_width", self.expert_width),
            ("shared_width", self.shared_width),
            ("vocab", self.vocab),
            ("max_positions", self.max_positions),
        ] {
            if value > MAX_DIM {
                return fail(format!("{what} {value} exceeds the supported maximum {MAX_DIM}"));
            }
        }
        if self.layers == 0 {
            return fail("layers 0: a model needs at least 1 layer".into());
        }
        if self.max_positions == 0 {
            return fail("max_positions 0: the KV cache must hold at least 1 position".into());
        }
        if self.head_dim != HEAD_DIM {
            return fail(format!(
                "layers.*.attn.q.weight head_dim {} is not {HEAD_DIM}: the attention kernels, q/k norms and \
                 RoPE tables are defined for 128-wide heads",
                self.head_dim
            ));
        }
        for (tensor, what, heads) in
            [("layers.*.attn.q.weight", "q_heads", self.q_heads), ("layers.*.attn.k.weight", "kv_heads", self.kv_heads)]
        {
            if heads == 0 || !heads.is_multiple_of(CANONICAL_CHUNKS) {
                return fail(format!(
                    "{tensor} {what} {heads} is not divisible into {CANONICAL_CHUNKS} canonical chunks of whole \
                     heads (it must be a positive multiple of {CANONICAL_CHUNKS})"
                ));
            }
        }
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return fail(format!(
                "layers.*.attn.q.weight q_heads {} is not a multiple of kv_heads {}: grouped-query attention \
                 needs whole query groups per KV head",
                self.q_heads, self.kv_heads
            ));
        }
        for (tensor, what, width) in [
            ("layers.*.experts.*.gate.weight", "in_features (hidden)", self.hidden),
            ("layers.*.experts.*.down.weight", "in_features (expert_width)", self.expert_width),
            ("layers.*.shared.down.weight", "in_features (shared_width)", self.shared_width),
        ] {
            if width == 0 || !width.is_multiple_of(SCALE_BLOCK) {
                return fail(format!(
                    "{tensor} {what} {width} is not divisible into canonical K-blocks of whole \
                     {SCALE_BLOCK}-column scale blocks (it must be a positive multiple of {SCALE_BLOCK})"
                ));
            }
        }
        if self.experts == 0 || !self.experts.is_multiple_of(CANONICAL_CHUNKS) {
            return fail(format!(
                "layers.*.router.weight experts {} is not divisible into {CANONICAL_CHUNKS} canonical chunks \
                 (router rows and expert-parallel ownership; it must be a positive multiple of {CANONICAL_CHUNKS})",
                self.experts
            ));
        }
        if self.vocab == 0 || !self.vocab.is_multiple_of(CANONICAL_CHUNKS) {
            return fail(format!(
                "lm_head.weight vocab {} is not divisible into {CANONICAL_CHUNKS} canonical chunks (it must be a \
                 positive multiple of {CANONICAL_CHUNKS})",
                self.vocab
            ));
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return fail(format!(
                "layers.*.router.weight top_k {} is outside 1..={} (the number of routed experts)",
                self.top_k, self.experts
            ));
        }
        for (what, value) in [("eps", self.eps), ("rope_theta", self.rope_theta), ("route_scale", self.route_scale)] {
            if !(value.is_finite() && value > 0.0) {
                return fail(format!("{what} {value} must be finite and > 0"));
            }
        }
        if let Some(limit) = self.swiglu_limit {
            if !(limit.is_finite() && limit > 0.0) {
                return fail(format!("swiglu_limit {limit} must be finite and > 0 (or absent)"));
            }
        }
        for (i, &l) in self.unclamped_layers.iter().enumerate() {
            if l >= self.layers {
                return fail(format!("unclamped_layers entry {l} is not a layer: it must be < layers {}", self.layers));
            }
            if let Some(&prev) = i.checked_sub(1).map(|p| &self.unclamped_layers[p]).filter(|p| **p >= l) {
                let what = if prev == l { "a duplicate" } else { "out of order" };
                return fail(format!(
                    "unclamped_layers entry {l} follows {prev} ({what}): the list must be strictly ascending"
                ));
            }
        }
        // Every matrix must have a canonical K-block count. The rules above already imply it;
        // asking the kernels' own definition keeps the two from drifting apart.
        let q_width = self.q_heads * HEAD_DIM;
        for (tensor, format, in_features) in [
            ("layers.*.attn.q.weight", WeightFormat::Bf16, self.hidden),
            ("layers.*.attn.o.weight", WeightFormat::Bf16, q_width),
            ("layers.*.router.weight", WeightFormat::Bf16, self.hidden),
            ("lm_head.weight", WeightFormat::Bf16, self.hidden),
            ("layers.*.experts.*.gate.weight", WeightFormat::E4m3, self.hidden),
            ("layers.*.experts.*.down.weight", WeightFormat::E4m3, self.expert_width),
            ("layers.*.shared.down.weight", WeightFormat::E4m3, self.shared_width),
        ] {
            if let Err(e) = canonical_kblocks(format, in_features) {
                return fail(format!("{tensor} in_features {in_features} has no canonical K-block count: {e}"));
            }
        }
        Ok(())
    }

    /// The SwiGLU clamp limit of layer `layer`: `swiglu_limit`, unless the layer is listed in
    /// `unclamped_layers` (then none).
    pub fn swiglu_limit_at(&self, layer: usize) -> Option<f32> {
        if self.unclamped_layers.contains(&layer) {
            None
        } else {
            self.swiglu_limit
        }
    }

    /// Rows of the query projection (`q_heads × head_dim`).
    pub fn q_width(&self) -> usize {
        self.q_heads * self.head_dim
    }

    /// Rows of each of the key and value projections (`kv_heads × head_dim`).
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}
