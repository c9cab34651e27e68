//! The reader of the model file format (defined in `format/mod.rs`): each tensor taken by name
//! with exactly its dtype, shape and byte length, checked against the value rules, in table order.

use super::{check_bf16, check_e4m3, check_f32, check_scales, expert_shapes, names, scale_shape};
use super::{FORMAT_NAME, FORMAT_VERSION};
use crate::error::RuntimeError;
use crate::model::{Expert, Layer, Matrix, Model, ModelConfig};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashSet;

pub(super) struct Reader<'a> {
    pub(super) st: SafeTensors<'a>,
    /// Names read so far; what remains at the end is unexpected.
    pub(super) consumed: HashSet<String>,
}

impl<'a> Reader<'a> {
    /// The bytes of tensor `name`, after checking that it exists with exactly this dtype and shape.
    fn take(&mut self, name: &str, dtype: Dtype, shape: &[usize]) -> Result<&'a [u8], RuntimeError> {
        let view = self.st.tensor(name).map_err(|_| {
            RuntimeError::model(
                name,
                format!(
                    "missing: format {FORMAT_NAME} version {FORMAT_VERSION} requires it ({dtype:?} {shape:?}) for \
                     this configuration"
                ),
            )
        })?;
        if view.dtype() != dtype {
            return Err(RuntimeError::model(name, format!("dtype {:?}, expected {dtype:?}", view.dtype())));
        }
        if view.shape() != shape {
            return Err(RuntimeError::model(name, format!("shape {:?}, expected {shape:?}", view.shape())));
        }
        let want = shape.iter().product::<usize>() * dtype.bitsize() / 8;
        if view.data().len() != want {
            return Err(RuntimeError::model(
                name,
                format!("byte length {}, expected {want} for {dtype:?} {shape:?}", view.data().len()),
            ));
        }
        self.consumed.insert(name.to_string());
        Ok(view.data())
    }

    fn f32_values(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, RuntimeError> {
        let bytes = self.take(name, Dtype::F32, shape)?;
        Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    fn f32(&mut self, name: &str, len: usize) -> Result<Vec<f32>, RuntimeError> {
        let v = self.f32_values(name, &[len])?;
        check_f32(name, &v, &[len])?;
        Ok(v)
    }

    fn bf16(&mut self, name: &str, out_features: usize, in_features: usize) -> Result<Matrix, RuntimeError> {
        let shape = [out_features, in_features];
        let bytes = self.take(name, Dtype::BF16, &shape)?;
        let bits: Vec<u16> = bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        check_bf16(name, &bits, &shape)?;
        Ok(Matrix::Bf16 { out_features, in_features, bits })
    }

    fn e4m3(&mut self, name: &str, out_features: usize, in_features: usize) -> Result<Matrix, RuntimeError> {
        let shape = [out_features, in_features];
        let codes = self.take(name, Dtype::F8_E4M3, &shape)?.to_vec();
        check_e4m3(name, &codes, &shape)?;
        let scale_name = format!("{name}_scale");
        let sshape = scale_shape(out_features, in_features);
        let scales = self.f32_values(&scale_name, &sshape)?;
        check_scales(&scale_name, &scales, &sshape)?;
        Ok(Matrix::E4m3 { out_features, in_features, codes, scales })
    }

    fn expert(&mut self, prefix: &str, hidden: usize, width: usize) -> Result<Expert, RuntimeError> {
        let [gate, up, down] = expert_shapes(hidden, width);
        let mut m =
            |(proj, out_f, in_f): (&str, usize, usize)| self.e4m3(&format!("{prefix}.{proj}.weight"), out_f, in_f);
        Ok(Expert { gate: m(gate)?, up: m(up)?, down: m(down)? })
    }

    /// The whole model, in table order. Loops grow their vectors as tensors are found (no
    /// capacity taken from the configuration), so a configuration that claims more than the
    /// file holds ends at its first missing tensor.
    pub(super) fn model(&mut self, c: ModelConfig) -> Result<Model, RuntimeError> {
        let embed = self.bf16(names::EMBED, c.vocab, c.hidden)?;
        let mut layers = Vec::new();
        for i in 0..c.layers {
            let n = |suffix: &str| names::layer(i, suffix);
            let attn_norm = self.f32(&n("attn_norm.weight"), c.hidden)?;
            let wq = self.bf16(&n("attn.q.weight"), c.q_width(), c.hidden)?;
            let wk = self.bf16(&n("attn.k.weight"), c.kv_width(), c.hidden)?;
            let wv = self.bf16(&n("attn.v.weight"), c.kv_width(), c.hidden)?;
            let wg = self.bf16(&n("attn.gate.weight"), c.q_heads, c.hidden)?;
            let q_norm = self.f32(&n("attn.q_norm.weight"), c.head_dim)?;
            let k_norm = self.f32(&n("attn.k_norm.weight"), c.head_dim)?;
            let wo = self.bf16(&n("attn.o.weight"), c.hidden, c.q_width())?;
            let ffn_norm = self.f32(&n("ffn_norm.weight"), c.hidden)?;
            let router = self.bf16(&n("router.weight"), c.experts, c.hidden)?;
            let router_bias = self.f32(&n("router.bias"), c.experts)?;
            let mut experts = Vec::new();
            for e in 0..c.experts {
                experts.push(self.expert(&names::expert(i, e), c.hidden, c.expert_width)?);
            }
            let shared = self.expert(&names::shared(i), c.hidden, c.shared_width)?;
            layers.push(Layer {
                attn_norm,
                wq,
                wk,
                wv,
                wg,
                q_norm,
                k_norm,
                wo,
                ffn_norm,
                router,
                router_bias,
                experts,
                shared,
            });
        }
        let final_norm = self.f32(names::FINAL_NORM, c.hidden)?;
        let lm_head = self.bf16(names::LM_HEAD, c.vocab, c.hidden)?;
        Ok(Model { config: c, embed, layers, final_norm, lm_head })
    }
}
