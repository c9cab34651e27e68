//! The model file format: safetensors with documented tensor names and a versioned metadata
//! block. Writing and loading (with validation of every tensor) live here and only here.

use super::Model;
use std::path::Path;

/// Serialize a model to safetensors bytes.
pub fn to_bytes(model: &Model) -> Result<Vec<u8>, crate::RuntimeError> {
    todo!("helper E: {}", model.layers.len())
}

/// Parse and validate a model from safetensors bytes; `origin` names the file in errors.
pub fn from_bytes(bytes: &[u8], origin: &Path) -> Result<Model, crate::RuntimeError> {
    todo!("helper E: {} {}", bytes.len(), origin.display())
}

/// Write atomically (temp file + rename).
pub fn save(model: &Model, path: &Path) -> Result<(), crate::RuntimeError> {
    todo!("helper E: {} {}", model.layers.len(), path.display())
}

/// Read and validate.
pub fn load(path: &Path) -> Result<Model, crate::RuntimeError> {
    todo!("helper E: {}", path.display())
}
