//! Model configuration and the presets `tiny`, `small`, `step` (DESIGN.md §3.1).

use crate::error::RuntimeError;

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
    /// Step's SwiGLU clamp limit (finite, > 0) or none.
    pub swiglu_limit: Option<f32>,
    pub route_scale: f32,
    pub route_norm: bool,
    /// Longest sequence (positions) the KV cache holds.
    pub max_positions: usize,
}

impl ModelConfig {
    /// A preset by name; `layers` overrides the preset's layer count (the `step` preset needs it).
    pub fn preset(name: &str, layers: Option<usize>) -> Result<ModelConfig, RuntimeError> {
        todo!("helper E: {name} {layers:?}")
    }

    /// Check every shape rule of the canonical grid (heads and widths divisible into 8 chunks,
    /// K-blocks of whole scale blocks, head_dim 128, top_k ≤ experts…); the error names the
    /// tensor, the width and the rule.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        todo!("helper E")
    }
}
