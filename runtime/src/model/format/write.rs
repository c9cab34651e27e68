//! The writer of the model file format (defined in `format/mod.rs`): every tensor checked against
//! the configuration and the value rules, laid out in data order, and the header bytes written by
//! hand so that a file is byte for byte a function of the model.

use super::{check_bf16, check_e4m3, check_f32, check_scales, expert_shapes, names, scale_shape};
use super::{FORMAT_NAME, FORMAT_VERSION, KEY_CONFIG, KEY_FORMAT, KEY_FORMAT_VERSION};
use crate::error::RuntimeError;
use crate::model::{Expert, Layer, Matrix, Model, ModelConfig};
use safetensors::Dtype;
use std::io::Write;

/// A tensor's storage, borrowed from the model.
pub(super) enum Data<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    E4m3(&'a [u8]),
}

impl Data<'_> {
    fn dtype(&self) -> Dtype {
        match self {
            Data::F32(_) => Dtype::F32,
            Data::Bf16(_) => Dtype::BF16,
            Data::E4m3(_) => Dtype::F8_E4M3,
        }
    }
    pub(super) fn len_bytes(&self) -> usize {
        match self {
            Data::F32(v) => v.len() * 4,
            Data::Bf16(v) => v.len() * 2,
            Data::E4m3(v) => v.len(),
        }
    }
    /// Data order of the file: F32, then BF16, then F8 (descending alignment).
    fn group(&self) -> u8 {
        match self {
            Data::F32(_) => 0,
            Data::Bf16(_) => 1,
            Data::E4m3(_) => 2,
        }
    }
    fn write(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(1 << 16);
        match self {
            Data::F32(v) => {
                for chunk in v.chunks(1 << 14) {
                    buf.clear();
                    chunk.iter().for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
                    w.write_all(&buf)?;
                }
            }
            Data::Bf16(v) => {
                for chunk in v.chunks(1 << 15) {
                    buf.clear();
                    chunk.iter().for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
                    w.write_all(&buf)?;
                }
            }
            Data::E4m3(v) => w.write_all(v)?,
        }
        Ok(())
    }
}

pub(super) struct Entry<'a> {
    name: String,
    shape: Vec<usize>,
    pub(super) data: Data<'a>,
}

/// Every tensor of the model, checked against the configuration and the value rules, in data
/// order; and the header that describes them.
pub(super) fn prepare(model: &Model) -> Result<(Vec<u8>, Vec<Entry<'_>>), RuntimeError> {
    let c = &model.config;
    c.validate()?;
    let mut w = EntryList { entries: Vec::new() };
    w.bf16(names::EMBED, &model.embed, c.vocab, c.hidden)?;
    if model.layers.len() != c.layers {
        return Err(RuntimeError::model(
            "layers",
            format!("the model holds {} layers, its configuration says {}", model.layers.len(), c.layers),
        ));
    }
    for (i, layer) in model.layers.iter().enumerate() {
        let Layer { attn_norm, wq, wk, wv, wg, q_norm, k_norm, wo, ffn_norm, router, router_bias, experts, shared } =
            layer;
        let n = |suffix: &str| names::layer(i, suffix);
        w.f32(n("attn_norm.weight"), attn_norm, c.hidden)?;
        w.bf16(&n("attn.q.weight"), wq, c.q_width(), c.hidden)?;
        w.bf16(&n("attn.k.weight"), wk, c.kv_width(), c.hidden)?;
        w.bf16(&n("attn.v.weight"), wv, c.kv_width(), c.hidden)?;
        w.bf16(&n("attn.gate.weight"), wg, c.q_heads, c.hidden)?;
        w.f32(n("attn.q_norm.weight"), q_norm, c.head_dim)?;
        w.f32(n("attn.k_norm.weight"), k_norm, c.head_dim)?;
        w.bf16(&n("attn.o.weight"), wo, c.hidden, c.q_width())?;
        w.f32(n("ffn_norm.weight"), ffn_norm, c.hidden)?;
        w.bf16(&n("router.weight"), router, c.experts, c.hidden)?;
        w.f32(n("router.bias"), router_bias, c.experts)?;
        if experts.len() != c.experts {
            return Err(RuntimeError::model(
                n("experts"),
                format!("the layer holds {} routed experts, the configuration says {}", experts.len(), c.experts),
            ));
        }
        for (e, expert) in experts.iter().enumerate() {
            w.expert(&names::expert(i, e), expert, c.hidden, c.expert_width)?;
        }
        w.expert(&names::shared(i), shared, c.hidden, c.shared_width)?;
    }
    w.f32(names::FINAL_NORM.into(), &model.final_norm, c.hidden)?;
    w.bf16(names::LM_HEAD, &model.lm_head, c.vocab, c.hidden)?;

    let mut entries = w.entries;
    entries.sort_by_key(|e| e.data.group()); // stable: the table's order inside each group
    let header = header_bytes(c, &entries)?;
    Ok((header, entries))
}

struct EntryList<'a> {
    entries: Vec<Entry<'a>>,
}

impl<'a> EntryList<'a> {
    fn f32(&mut self, name: String, v: &'a [f32], len: usize) -> Result<(), RuntimeError> {
        if v.len() != len {
            return Err(RuntimeError::model(name, format!("holds {} values, expected {len}", v.len())));
        }
        check_f32(&name, v, &[len])?;
        self.entries.push(Entry { name, shape: vec![len], data: Data::F32(v) });
        Ok(())
    }

    fn bf16(&mut self, name: &str, m: &'a Matrix, out_f: usize, in_f: usize) -> Result<(), RuntimeError> {
        let shape = [out_f, in_f];
        match m {
            Matrix::Bf16 { out_features, in_features, bits }
                if [*out_features, *in_features] == shape && bits.len() == out_f * in_f =>
            {
                check_bf16(name, bits, &shape)?;
                self.entries.push(Entry { name: name.into(), shape: shape.to_vec(), data: Data::Bf16(bits) });
                Ok(())
            }
            _ => Err(mismatch(name, m, "BF16", shape)),
        }
    }

    fn expert(&mut self, prefix: &str, x: &'a Expert, hidden: usize, width: usize) -> Result<(), RuntimeError> {
        for ((proj, out_f, in_f), m) in expert_shapes(hidden, width).into_iter().zip([&x.gate, &x.up, &x.down]) {
            let name = format!("{prefix}.{proj}.weight");
            let shape = [out_f, in_f];
            let sshape = scale_shape(out_f, in_f);
            match m {
                Matrix::E4m3 { out_features, in_features, codes, scales }
                    if [*out_features, *in_features] == shape
                        && codes.len() == out_f * in_f
                        && scales.len() == sshape[0] * sshape[1] =>
                {
                    check_e4m3(&name, codes, &shape)?;
                    let scale_name = format!("{name}_scale");
                    check_scales(&scale_name, scales, &sshape)?;
                    self.entries.push(Entry { name, shape: shape.to_vec(), data: Data::E4m3(codes) });
                    self.entries.push(Entry { name: scale_name, shape: sshape.to_vec(), data: Data::F32(scales) });
                }
                _ => return Err(mismatch(&name, m, "E4M3", shape)),
            }
        }
        Ok(())
    }
}

fn mismatch(name: &str, m: &Matrix, format: &str, shape: [usize; 2]) -> RuntimeError {
    let (got, len) = match m {
        Matrix::Bf16 { bits, .. } => ("BF16", format!("{} values", bits.len())),
        Matrix::E4m3 { codes, scales, .. } => ("E4M3", format!("{} codes and {} scales", codes.len(), scales.len())),
    };
    RuntimeError::model(
        name,
        format!(
            "the model holds a {got} [{}, {}] matrix with {len}; the format needs {format} {shape:?}",
            m.out_features(),
            m.in_features()
        ),
    )
}

fn header_bytes(config: &ModelConfig, entries: &[Entry]) -> Result<Vec<u8>, RuntimeError> {
    use serde_json::{json, Map, Value};
    let config_json = serde_json::to_string(config)
        .map_err(|e| RuntimeError::Contract(format!("model configuration cannot be written as JSON: {e}")))?;
    let mut header = Map::new();
    header.insert(
        "__metadata__".into(),
        json!({ KEY_FORMAT: FORMAT_NAME, KEY_FORMAT_VERSION: FORMAT_VERSION, KEY_CONFIG: config_json }),
    );
    let mut offset = 0usize;
    for e in entries {
        let end = offset + e.data.len_bytes();
        let dtype = match e.data.dtype() {
            Dtype::F32 => "F32",
            Dtype::BF16 => "BF16",
            _ => "F8_E4M3",
        };
        header.insert(e.name.clone(), json!({ "dtype": dtype, "shape": e.shape, "data_offsets": [offset, end] }));
        offset = end;
    }
    let mut bytes = serde_json::to_vec(&Value::Object(header))
        .map_err(|e| RuntimeError::Contract(format!("model header cannot be written as JSON: {e}")))?;
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    Ok(bytes)
}

/// `[u64 LE header length][header][tensor data in entry order]`.
pub(super) fn write_to(header: &[u8], entries: &[Entry], w: &mut dyn Write) -> std::io::Result<()> {
    w.write_all(&(header.len() as u64).to_le_bytes())?;
    w.write_all(header)?;
    for e in entries {
        e.data.write(w)?;
    }
    w.flush()
}
