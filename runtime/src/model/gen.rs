//! Deterministic weight generation from (preset, seed).

use super::{Model, ModelConfig};

/// Generate a model whose every weight is a pure function of (config, seed).
pub fn generate(config: &ModelConfig, seed: u64) -> Result<Model, crate::RuntimeError> {
    todo!("helper E: {config:?} {seed}")
}
