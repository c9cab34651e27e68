//! The model file format: safetensors with documented tensor names and a versioned metadata
//! block. Writing and loading (with validation of every tensor) live here and only here.
//!
//! A model file is how a generated model reaches a GPU machine and how a user's own weights enter
//! the harness, so a reader must be able to trust it completely: loading checks every rule below
//! and answers a bad file with an error that names the tensor (or metadata key) and the rule —
//! never a panic, and never a half-checked model.
//!
//! # Format `memra-model`, version 1
//!
//! A [safetensors](https://github.com/huggingface/safetensors) file. Its `__metadata__` holds
//! exactly these keys (any other key is refused):
//!
//! | key | value |
//! |---|---|
//! | `memra.format` | `"memra-model"` |
//! | `memra.format_version` | `"1"` (any other version is refused) |
//! | `memra.config` | the [`ModelConfig`] as JSON; unknown fields are refused and it must pass [`ModelConfig::validate`]; `unclamped_layers` (the layers without a SwiGLU clamp) is written only when not empty and read as empty when absent |
//!
//! The tensors, for `i` in `0..layers` and `e` in `0..experts` (W = `expert_width`,
//! S = `shared_width`, `ceil(n)` = ⌈n / 128⌉); no other tensor may be present:
//!
//! | name | dtype | shape |
//! |---|---|---|
//! | `embed.weight` | BF16 | `[vocab, hidden]` |
//! | `layers.{i}.attn_norm.weight` | F32 | `[hidden]` |
//! | `layers.{i}.attn.q.weight` | BF16 | `[q_heads·128, hidden]` |
//! | `layers.{i}.attn.k.weight` | BF16 | `[kv_heads·128, hidden]` |
//! | `layers.{i}.attn.v.weight` | BF16 | `[kv_heads·128, hidden]` |
//! | `layers.{i}.attn.gate.weight` | BF16 | `[q_heads, hidden]` |
//! | `layers.{i}.attn.q_norm.weight` | F32 | `[128]` |
//! | `layers.{i}.attn.k_norm.weight` | F32 | `[128]` |
//! | `layers.{i}.attn.o.weight` | BF16 | `[hidden, q_heads·128]` |
//! | `layers.{i}.ffn_norm.weight` | F32 | `[hidden]` |
//! | `layers.{i}.router.weight` | BF16 | `[experts, hidden]` |
//! | `layers.{i}.router.bias` | F32 | `[experts]` |
//! | `layers.{i}.experts.{e}.gate.weight`, `….up.weight` | F8_E4M3 | `[W, hidden]` |
//! | `layers.{i}.experts.{e}.gate.weight_scale`, `….up.weight_scale` | F32 | `[ceil(W), ceil(hidden)]` |
//! | `layers.{i}.experts.{e}.down.weight` | F8_E4M3 | `[hidden, W]` |
//! | `layers.{i}.experts.{e}.down.weight_scale` | F32 | `[ceil(hidden), ceil(W)]` |
//! | `layers.{i}.shared.{gate,up}.weight` (+ `_scale`) | F8_E4M3 (+ F32) | `[S, hidden]` (+ `[ceil(S), ceil(hidden)]`) |
//! | `layers.{i}.shared.down.weight` (+ `_scale`) | F8_E4M3 (+ F32) | `[hidden, S]` (+ `[ceil(hidden), ceil(S)]`) |
//! | `final_norm.weight` | F32 | `[hidden]` |
//! | `lm_head.weight` | BF16 | `[vocab, hidden]` |
//!
//! Matrices are `[out_features, in_features]` row-major. F8_E4M3 is OCP E4M3FN; the value of a
//! code is `decode(code) × weight_scale[row/128][col/128]` (docs/DESIGN.md §3.3).
//!
//! Value rules: every F32 tensor is finite; every `weight_scale` element is finite and > 0; no
//! BF16 element is ±inf or NaN; no F8_E4M3 code is NaN (`0x7F`/`0xFF`). The byte length of every
//! tensor is its shape times its dtype size (safetensors checks the offsets, this module checks
//! again).
//!
//! Example: the header of `ModelConfig::preset("tiny", Some(1))` as written here (shortened at
//! `…`; the line breaks are not in the file):
//!
//! ```json
//! {"__metadata__":{"memra.format":"memra-model","memra.format_version":"1",
//!   "memra.config":"{\"preset\":\"tiny\",\"hidden\":1024,\"layers\":1,\"q_heads\":8,\"kv_heads\":8,\"head_dim\":128,\"experts\":8,\"top_k\":2,\"expert_width\":1024,\"shared_width\":1024,\"vocab\":1024,\"eps\":0.000001,\"rope_theta\":10000.0,\"swiglu_limit\":7.0,\"route_scale\":2.5,\"route_norm\":true,\"max_positions\":64}"},
//!  "layers.0.attn_norm.weight":{"dtype":"F32","shape":[1024],"data_offsets":[0,4096]},
//!  "layers.0.attn.q_norm.weight":{"dtype":"F32","shape":[128],"data_offsets":[4096,4608]},
//!  …
//!  "embed.weight":{"dtype":"BF16","shape":[1024,1024],"data_offsets":[20256,2117408]},
//!  …
//!  "layers.0.experts.0.gate.weight":{"dtype":"F8_E4M3","shape":[1024,1024],"data_offsets":[12635936,13684512]},
//!  …}
//! ```
//!
//! Files written here are byte-for-byte a function of the model: the header lists the metadata
//! keys in the order above, then the tensors in data order — F32 tensors, then BF16, then
//! F8_E4M3 (descending alignment, as the safetensors crate lays them out), each group in the
//! order of the table — padded with spaces to a multiple of 8 bytes. (The header is written here
//! rather than by `safetensors::serialize`, whose `__metadata__` comes from a `HashMap` and so
//! changes order from one call to the next.) Any safetensors writer's file with the same tensors
//! and metadata loads.
//!
//! This module is the definition (the tables above, the constants, the metadata and value rules)
//! and the entry points; `write.rs` lays a checked model out as these bytes, `layout.rs` checks a
//! file's header length and that its header entries tile the data (naming the missing tensor and
//! the sizes when they do not), `read.rs` reads a file back tensor by tensor against the same rules.

mod layout;
mod read;
mod write;

pub use layout::{file_kind, read_regular_file};

use super::{Model, ModelConfig};
use crate::error::RuntimeError;
use memra_kernels::formats::E4M3_BLOCK;
use read::Reader;
use safetensors::SafeTensors;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use write::{prepare, write_to};

/// Value of the `memra.format` metadata key.
pub const FORMAT_NAME: &str = "memra-model";
/// The format version this build writes and the only one it reads.
pub const FORMAT_VERSION: &str = "1";
/// Metadata key: the format name.
pub const KEY_FORMAT: &str = "memra.format";
/// Metadata key: the format version.
pub const KEY_FORMAT_VERSION: &str = "memra.format_version";
/// Metadata key: the model configuration as JSON.
pub const KEY_CONFIG: &str = "memra.config";

/// Tensor names of the format (also the keys of the generator's per-tensor streams).
pub mod names {
    /// The token embedding.
    pub const EMBED: &str = "embed.weight";
    /// The final RMSNorm weight.
    pub const FINAL_NORM: &str = "final_norm.weight";
    /// The output projection.
    pub const LM_HEAD: &str = "lm_head.weight";

    /// `layers.{layer}.{suffix}`.
    pub fn layer(layer: usize, suffix: &str) -> String {
        format!("layers.{layer}.{suffix}")
    }
    /// Prefix of routed expert `expert` of `layer`: `layers.{layer}.experts.{expert}`.
    pub fn expert(layer: usize, expert: usize) -> String {
        format!("layers.{layer}.experts.{expert}")
    }
    /// Prefix of the shared expert of `layer`: `layers.{layer}.shared`.
    pub fn shared(layer: usize) -> String {
        format!("layers.{layer}.shared")
    }
}

/// Serialize a model to safetensors bytes.
pub fn to_bytes(model: &Model) -> Result<Vec<u8>, RuntimeError> {
    let (header, entries) = prepare(model)?;
    let mut bytes = Vec::with_capacity(header.len() + entries.iter().map(|e| e.data.len_bytes()).sum::<usize>());
    write_to(&header, &entries, &mut bytes).expect("writing to a Vec cannot fail");
    Ok(bytes)
}

/// Parse and validate a model from safetensors bytes; `origin` names the file in errors.
pub fn from_bytes(bytes: &[u8], origin: &Path) -> Result<Model, RuntimeError> {
    let file_err = |detail: String| RuntimeError::ModelFile { path: origin.to_path_buf(), detail };
    layout::check(bytes, &file_err)?;
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| file_err(format!("not a valid safetensors file ({} bytes): {e}", bytes.len())))?;
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| file_err(format!("not a valid safetensors file ({} bytes): {e}", bytes.len())))?;
    let config = read_metadata(header.metadata().as_ref(), &file_err)?;
    let mut reader = Reader { st, consumed: HashSet::new() };
    let model = reader.model(config)?;
    // Every tensor of the file must have been read: anything left is not part of the format.
    if reader.consumed.len() != reader.st.len() {
        let mut extra: Vec<&str> = reader.st.names().into_iter().filter(|n| !reader.consumed.contains(*n)).collect();
        extra.sort_unstable();
        if let Some(name) = extra.first() {
            return Err(RuntimeError::model(
                *name,
                format!(
                    "unexpected tensor: not part of format {FORMAT_NAME} version {FORMAT_VERSION} for this \
                     configuration ({} unexpected tensor(s) in all)",
                    extra.len()
                ),
            ));
        }
    }
    Ok(model)
}

/// Write atomically (temp file + rename).
///
/// The model is checked completely before anything is created; the bytes go to a temporary file
/// in the destination's directory, which is flushed to disk (`fsync`) and then renamed over
/// `path`, so a reader sees the old file or the whole new one. On any failure the temporary file
/// is removed and `path` is untouched.
pub fn save(model: &Model, path: &Path) -> Result<(), RuntimeError> {
    let (header, entries) = prepare(model)?;
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RuntimeError::Io { path, source }
    };
    let file_name = path.file_name().ok_or_else(|| {
        io_err(path)(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path (no file name)"))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let unique = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{}.tmp-{}-{unique}", file_name.to_string_lossy(), std::process::id()));

    let write = || -> Result<(), RuntimeError> {
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp).map_err(io_err(&tmp))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        write_to(&header, &entries, &mut w).map_err(io_err(&tmp))?;
        let file = w.into_inner().map_err(|e| io_err(&tmp)(e.into_error()))?;
        file.sync_all().map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err(path))
    };
    if let Err(e) = write() {
        // Best effort: the temporary file may not exist (the error may be its creation).
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // Make the rename durable. Some filesystems refuse to fsync a directory; the file itself is
    // already on disk, so that refusal is not an error of the save.
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Read (a regular file only: [`read_regular_file`]) and validate.
pub fn load(path: &Path) -> Result<Model, RuntimeError> {
    let bytes = read_regular_file(path)?;
    from_bytes(&bytes, path)
}

// ---------------------------------------------------------------------------------------------
// Metadata

fn read_metadata(
    metadata: Option<&std::collections::HashMap<String, String>>,
    file_err: &dyn Fn(String) -> RuntimeError,
) -> Result<ModelConfig, RuntimeError> {
    let empty = std::collections::HashMap::new();
    let meta = metadata.unwrap_or(&empty);
    let get = |key: &str| {
        meta.get(key).ok_or_else(|| {
            file_err(format!(
                "metadata key `{key}` is missing (a {FORMAT_NAME} file carries {KEY_FORMAT}, {KEY_FORMAT_VERSION} \
                 and {KEY_CONFIG})"
            ))
        })
    };
    let format = get(KEY_FORMAT)?;
    if format != FORMAT_NAME {
        return Err(file_err(format!("metadata `{KEY_FORMAT}` is `{format}`, expected `{FORMAT_NAME}`")));
    }
    let version = get(KEY_FORMAT_VERSION)?;
    if version != FORMAT_VERSION {
        return Err(file_err(format!(
            "metadata `{KEY_FORMAT_VERSION}` is `{version}`: unknown version, this build reads version {FORMAT_VERSION}"
        )));
    }
    let mut unknown: Vec<&String> =
        meta.keys().filter(|k| ![KEY_FORMAT, KEY_FORMAT_VERSION, KEY_CONFIG].contains(&k.as_str())).collect();
    unknown.sort_unstable();
    if let Some(key) = unknown.first() {
        return Err(file_err(format!(
            "metadata key `{key}` is unknown to format {FORMAT_NAME} version {FORMAT_VERSION} (its keys are \
             {KEY_FORMAT}, {KEY_FORMAT_VERSION}, {KEY_CONFIG})"
        )));
    }
    let config: ModelConfig = serde_json::from_str(get(KEY_CONFIG)?)
        .map_err(|e| file_err(format!("metadata `{KEY_CONFIG}` is not a valid model configuration: {e}")))?;
    config.validate().map_err(|e| {
        let rule = match e {
            RuntimeError::ModelShape { rule } => rule,
            other => other.to_string(),
        };
        file_err(format!("metadata `{KEY_CONFIG}` is refused: {rule}"))
    })?;
    Ok(config)
}

// ---------------------------------------------------------------------------------------------
// Value rules, shared by the writer and the reader

/// `[r, c]` (or `[i]`) of flat index `i` in a tensor of `shape`.
fn index_of(i: usize, shape: &[usize]) -> String {
    match shape {
        [_, cols] if *cols > 0 => format!("[{}, {}]", i / cols, i % cols),
        _ => format!("[{i}]"),
    }
}

fn check_f32(name: &str, v: &[f32], shape: &[usize]) -> Result<(), RuntimeError> {
    match v.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(RuntimeError::model(
            name,
            format!("element {} is {}: every F32 value must be finite", index_of(i, shape), v[i]),
        )),
        None => Ok(()),
    }
}

fn check_scales(name: &str, v: &[f32], shape: &[usize]) -> Result<(), RuntimeError> {
    match v.iter().position(|x| !(x.is_finite() && *x > 0.0)) {
        Some(i) => Err(RuntimeError::model(
            name,
            format!("scale {} is {:?}: every weight_scale must be finite and > 0", index_of(i, shape), v[i]),
        )),
        None => Ok(()),
    }
}

fn check_bf16(name: &str, bits: &[u16], shape: &[usize]) -> Result<(), RuntimeError> {
    match bits.iter().position(|b| b & 0x7F80 == 0x7F80) {
        Some(i) => Err(RuntimeError::model(
            name,
            format!(
                "element {} is 0x{:04X} ({}): every BF16 value must be finite",
                index_of(i, shape),
                bits[i],
                memra_kernels::formats::bf16_to_f32(bits[i])
            ),
        )),
        None => Ok(()),
    }
}

fn check_e4m3(name: &str, codes: &[u8], shape: &[usize]) -> Result<(), RuntimeError> {
    match codes.iter().position(|c| c & 0x7F == 0x7F) {
        Some(i) => Err(RuntimeError::model(
            name,
            format!("element {} is code 0x{:02X} (NaN): no F8_E4M3 weight may be NaN", index_of(i, shape), codes[i]),
        )),
        None => Ok(()),
    }
}

fn scale_shape(out_features: usize, in_features: usize) -> [usize; 2] {
    [out_features.div_ceil(E4M3_BLOCK), in_features.div_ceil(E4M3_BLOCK)]
}

/// The expected (out, in) of every matrix of a layer, in file order of an expert.
fn expert_shapes(hidden: usize, width: usize) -> [(&'static str, usize, usize); 3] {
    [("gate", width, hidden), ("up", width, hidden), ("down", hidden, width)]
}
