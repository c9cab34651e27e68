//! The `edge` model and its short battery (3 prompts, 4 generated tokens), shared by the host
//! tests (`edge.rs`, `doors29.rs`) and the CUDA tests (`gpu/cuda_doors29.rs`): generated once per
//! test binary.

use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::Battery;
use std::sync::OnceLock;

pub fn edge() -> &'static Model {
    static EDGE: OnceLock<Model> = OnceLock::new();
    EDGE.get_or_init(|| generate(&ModelConfig::preset("edge", None).unwrap(), 1).unwrap())
}

pub fn battery() -> Battery {
    let mut b = Battery::default_for(edge().config.vocab, 1);
    b.prompts.truncate(3);
    b.gen_tokens = 4;
    b
}
