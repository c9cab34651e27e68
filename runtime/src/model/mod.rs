//! The Step-like MoE decoder model: configuration, presets, weights, deterministic generation,
//! and the safetensors file format (defined, versioned and documented in `format`).

pub mod edge;
pub mod format;
pub mod gen;
pub mod matrix;
pub mod preset;

pub use matrix::Matrix;
pub use preset::ModelConfig;

/// One SwiGLU expert: gate and up `[width][hidden]`, down `[hidden][width]`, all E4M3
/// block-scaled.
#[derive(Debug, Clone, PartialEq)]
pub struct Expert {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
}

/// One decoder layer's weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    /// RMSNorm weight of the layer input `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// BF16 `[q_heads*128][hidden]`.
    pub wq: Matrix,
    /// BF16 `[kv_heads*128][hidden]`.
    pub wk: Matrix,
    /// BF16 `[kv_heads*128][hidden]`.
    pub wv: Matrix,
    /// BF16 per-head attention gate `[q_heads][hidden]`.
    pub wg: Matrix,
    /// Per-head q / k RMSNorm weights `[128]`.
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    /// BF16 output projection `[hidden][q_heads*128]`.
    pub wo: Matrix,
    /// RMSNorm weight before the MoE `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// BF16 router `[experts][hidden]` and its f32 selection bias `[experts]`.
    pub router: Matrix,
    pub router_bias: Vec<f32>,
    pub experts: Vec<Expert>,
    pub shared: Expert,
}

/// A whole model.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub config: ModelConfig,
    /// BF16 token embedding `[vocab][hidden]`.
    pub embed: Matrix,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<f32>,
    /// BF16 `[vocab][hidden]`.
    pub lm_head: Matrix,
}

impl Model {
    /// NeoX RoPE table row for `pos`: `[64 cos][64 sin]` of `pos · θ^(−2i/128)`, computed in f64
    /// and rounded once to f32, so host and device read the same bits.
    pub fn rope_row(&self, pos: usize) -> Vec<f32> {
        let half = memra_kernels::twins::attention::HEAD_DIM / 2;
        let theta = self.config.rope_theta as f64;
        let angles: Vec<f64> =
            (0..half).map(|i| pos as f64 * theta.powf(-(2.0 * i as f64) / (2 * half) as f64)).collect();
        angles.iter().map(|a| a.cos() as f32).chain(angles.iter().map(|a| a.sin() as f32)).collect()
    }
}
