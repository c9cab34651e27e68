//! The byte layout of a model file, checked before the safetensors parser sees it, so that a
//! damaged file is answered with the real culprit and the numbers: the size its header length
//! claims against the file's size, the byte range no header entry covers together with the tensor
//! of the format that is missing from the header, the tensor that runs past the end of a
//! truncated file. (The parser itself would blame the tensor *after* a removed entry, or say only
//! "incomplete metadata".) Anything this check does not recognise is left to the parser.

use super::{expert_shapes, names, read_metadata, scale_shape};
use crate::error::RuntimeError;
use crate::model::ModelConfig;
use safetensors::Dtype;
use std::collections::HashMap;
use std::io::Read as _;
use std::path::Path;

/// The safetensors crate's limit on a header (it refuses a larger one).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The tensors of the format for configuration `c` (name, dtype, shape), in table order: the
/// first layers' until at least `limit` are listed, then the final ones (a configuration may claim
/// millions of layers; the list never grows with the claim, only with `limit`).
pub(super) fn expected_tensors(c: &ModelConfig, limit: usize) -> Vec<(String, Dtype, Vec<usize>)> {
    let mut v = vec![(names::EMBED.to_string(), Dtype::BF16, vec![c.vocab, c.hidden])];
    let e4m3 = |v: &mut Vec<(String, Dtype, Vec<usize>)>, name: String, out_f: usize, in_f: usize| {
        let scale = format!("{name}_scale");
        v.push((name, Dtype::F8_E4M3, vec![out_f, in_f]));
        v.push((scale, Dtype::F32, scale_shape(out_f, in_f).to_vec()));
    };
    for i in 0..c.layers {
        if v.len() >= limit {
            break;
        }
        let n = |suffix: &str| names::layer(i, suffix);
        v.push((n("attn_norm.weight"), Dtype::F32, vec![c.hidden]));
        v.push((n("attn.q.weight"), Dtype::BF16, vec![c.q_width(), c.hidden]));
        v.push((n("attn.k.weight"), Dtype::BF16, vec![c.kv_width(), c.hidden]));
        v.push((n("attn.v.weight"), Dtype::BF16, vec![c.kv_width(), c.hidden]));
        v.push((n("attn.gate.weight"), Dtype::BF16, vec![c.q_heads, c.hidden]));
        v.push((n("attn.q_norm.weight"), Dtype::F32, vec![c.head_dim]));
        v.push((n("attn.k_norm.weight"), Dtype::F32, vec![c.head_dim]));
        v.push((n("attn.o.weight"), Dtype::BF16, vec![c.hidden, c.q_width()]));
        v.push((n("ffn_norm.weight"), Dtype::F32, vec![c.hidden]));
        v.push((n("router.weight"), Dtype::BF16, vec![c.experts, c.hidden]));
        v.push((n("router.bias"), Dtype::F32, vec![c.experts]));
        let prefixes = (0..c.experts).map(|e| (names::expert(i, e), c.expert_width));
        for (prefix, width) in prefixes.chain(std::iter::once((names::shared(i), c.shared_width))) {
            for (proj, out_f, in_f) in expert_shapes(c.hidden, width) {
                e4m3(&mut v, format!("{prefix}.{proj}.weight"), out_f, in_f);
            }
        }
    }
    v.push((names::FINAL_NORM.to_string(), Dtype::F32, vec![c.hidden]));
    v.push((names::LM_HEAD.to_string(), Dtype::BF16, vec![c.vocab, c.hidden]));
    v
}

fn size_bytes(dtype: Dtype, shape: &[usize]) -> u64 {
    (shape.iter().product::<usize>() * dtype.bitsize() / 8) as u64
}

/// One header entry as the file states it.
struct Entry<'a> {
    name: &'a str,
    start: u64,
    end: u64,
}

/// Check the 8-byte header length against the file's size, and that the header's entries tile
/// the data section exactly; name the missing tensor when entries leave a hole.
pub(super) fn check(bytes: &[u8], origin_err: &dyn Fn(String) -> RuntimeError) -> Result<(), RuntimeError> {
    let len = bytes.len() as u64;
    let file_err = |detail: String| origin_err(format!("not a valid safetensors file ({len} bytes): {detail}"));
    if len < 8 {
        return Err(file_err("a safetensors file starts with an 8-byte header length".to_string()));
    }
    let claimed = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if claimed > len - 8 {
        return Err(file_err(format!(
            "the header length field claims a header of {claimed} bytes, but the file is {len} bytes ({} bytes after the 8-byte length field)",
            len - 8
        )));
    }
    if claimed > MAX_HEADER_BYTES {
        return Err(file_err(format!(
            "the header length field claims a header of {claimed} bytes, more than the safetensors limit of {MAX_HEADER_BYTES} bytes"
        )));
    }
    let header = &bytes[8..8 + claimed as usize];
    // A header that is not a JSON object of entries is the parser's to report.
    let Ok(map) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(header) else {
        return Ok(());
    };
    let data_len = len - 8 - claimed;
    let mut entries = Vec::new();
    for (name, v) in &map {
        if name == "__metadata__" {
            continue;
        }
        let offsets = v.get("data_offsets").and_then(|o| o.as_array());
        let pair = offsets.and_then(|o| Some((o.first()?.as_u64()?, o.get(1)?.as_u64()?)));
        let Some((start, end)) = pair else { return Ok(()) };
        entries.push(Entry { name, start, end });
    }
    entries.sort_by_key(|e| (e.start, e.end));
    let config = map.get("__metadata__").and_then(|m| {
        let meta: HashMap<String, String> = serde_json::from_value(m.clone()).ok()?;
        read_metadata(Some(&meta), origin_err).ok()
    });
    // The tensors of the format absent from the header: a hole means an entry was removed, so
    // the one to name is among the first entries' count of the table (and the final ones).
    let missing = || -> Vec<(String, Dtype, Vec<usize>)> {
        let Some(c) = &config else { return Vec::new() };
        expected_tensors(c, entries.len() + 1).into_iter().filter(|(n, _, _)| !map.contains_key(n)).collect()
    };
    let hole = |from: u64, to: u64, truncated: bool| {
        let missing = missing();
        let gap = to - from;
        let mut s = format!("data bytes {from}..{to} ({gap} bytes) are covered by no header entry");
        // The missing tensor whose size fits the hole best (exactly, when only an entry was removed).
        let best = missing.iter().min_by_key(|(_, d, sh)| size_bytes(*d, sh).abs_diff(gap));
        if let Some((name, dtype, shape)) = best {
            let want = size_bytes(*dtype, shape);
            s += &format!(
                ": the header lacks `{name}` ({dtype:?} {shape:?}, {want} bytes), which the configuration requires"
            );
            if truncated && want > gap {
                s += &format!(
                    "; the file also ends {} bytes short of it (file {len} bytes, {} expected)",
                    want - gap,
                    len + (want - gap)
                );
            }
            if missing.len() > 1 {
                s += &format!(" (and {} more tensor(s) of the format are missing from the header)", missing.len() - 1);
            }
        }
        file_err(s)
    };
    let mut pos = 0u64;
    let mut prev: Option<&Entry> = None;
    for e in &entries {
        if e.start > pos {
            return Err(hole(pos, e.start, false));
        }
        if e.start < pos {
            let p = prev.expect("pos > 0 only after an entry");
            return Err(file_err(format!(
                "tensor `{}` (data bytes {}..{}) overlaps tensor `{}` (data bytes {}..{})",
                e.name, e.start, e.end, p.name, p.start, p.end
            )));
        }
        if e.end < e.start {
            return Err(file_err(format!(
                "tensor `{}` has data_offsets [{}, {}]: the end lies before the start",
                e.name, e.start, e.end
            )));
        }
        pos = e.end;
        prev = Some(e);
    }
    if pos > data_len {
        let p = prev.expect("pos > 0 only after an entry");
        return Err(file_err(format!(
            "tensor `{}` needs data bytes {}..{} ({} bytes), but the file holds only {data_len} data bytes: it is \
             truncated by {} bytes (file {len} bytes, {} expected)",
            p.name,
            p.start,
            p.end,
            p.end - p.start,
            pos - data_len,
            len + (pos - data_len)
        )));
    }
    if pos < data_len {
        return Err(hole(pos, data_len, true));
    }
    Ok(())
}

/// The bytes of `path`, refused before it is opened unless it is a regular file (a FIFO would
/// block the read forever, a device never end), and read no further than its size.
pub fn read_regular_file(path: &Path) -> Result<Vec<u8>, RuntimeError> {
    let io = |source| RuntimeError::Io { path: path.to_path_buf(), source };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(RuntimeError::ModelFile {
            path: path.to_path_buf(),
            detail: format!("is {}, not a regular file: a model file is read whole", file_kind(&meta)),
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path).and_then(|f| f.take(meta.len()).read_to_end(&mut bytes)).map_err(io)?;
    Ok(bytes)
}

/// What a path that is not a regular file is, in words ("a directory", "a FIFO", …).
pub fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_file() {
        "a regular file"
    } else {
        "something other than a file or directory"
    }
}
