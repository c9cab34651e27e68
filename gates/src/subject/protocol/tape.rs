//! The tape of the subject protocol (safetensors, format `memra-tape` version 1; documented in
//! [`super`]): what one start of a subject produced, turned into the [`Record`] the gates judge.
//!
//! Reading is strict, because a tape is a claim by a program the gates do not trust: every rule
//! is checked, and a tape that breaks one is a [`TapeError`] naming the tensor, key or value and
//! the rule — an ERROR receipt (or VOID for an engagement the census does not back), never a
//! record that could pass. Writing is for the built-in runtime's protocol subject and the tests.

use super::backend_evidence::{BackendEvidence, WireCopies, WirePath};
use super::{seam_columns, seam_len};
use memra_receipts::schema::Verdict;
use memra_runtime::model::ModelConfig;
use memra_runtime::record::{Capture, CaptureKey, Record};
use memra_runtime::{Battery, PassShape};
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Value of the `memra.format` metadata key.
pub const FORMAT_NAME: &str = "memra-tape";
/// The version this build writes and the only one it reads.
pub const FORMAT_VERSION: &str = "1";
/// Metadata keys (no other key is allowed).
pub const KEY_FORMAT: &str = "memra.format";
pub const KEY_FORMAT_VERSION: &str = "memra.format_version";
pub const KEY_TAPE: &str = "memra.tape";

/// The `memra.tape` JSON of a tape that holds a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TapeMeta {
    pub subject: String,
    pub subject_version: String,
    pub layers: usize,
    /// The digest columns, `L{layer}.{seam}` (exactly [`seam_columns`]`(layers)`).
    pub seams: Vec<String>,
    /// Door variables the subject says engaged in this run.
    pub engaged_doors: Vec<String>,
    /// Counter name → count: whatever the subject counts, at least each engaged door's counter.
    pub census: BTreeMap<String, u64>,
    /// What ran, in words (device, library versions).
    pub backend: String,
    /// Compiler options that decided the arithmetic (empty when none).
    pub build_options: Vec<String>,
    /// Capture tensor name → (rank, first element, element count) of each part; absent: rank 0
    /// produced the whole tensor.
    pub capture_owners: BTreeMap<String, Vec<(usize, usize, usize)>>,
    /// Must be null in a tape that holds a run.
    pub error: Option<String>,
    /// Optional: the backend's own census ([`super::backend_evidence`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_census: Option<BTreeMap<String, u64>>,
    /// Optional: coverage of the special paths ([`super::backend_evidence`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<BTreeMap<String, WirePath>>,
    /// Optional: the cross-rank copies checked ([`super::backend_evidence`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies: Option<WireCopies>,
}

/// The `memra.tape` JSON of a tape that reports a run the subject could not complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorMeta {
    subject: String,
    subject_version: String,
    error: String,
}

/// A tape that yields no record, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TapeError {
    /// The tape breaks a rule of the format (ERROR).
    #[error("{0}")]
    Malformed(String),
    /// The subject reports that it could not complete the run (ERROR, the subject's own words).
    #[error("{0}")]
    Reported(String),
    /// A door is claimed engaged and the subject's census does not show it (VOID).
    #[error("{0}")]
    Unbacked(String),
}

impl TapeError {
    /// The verdict of a run whose tape reads this way.
    pub fn verdict(&self) -> Verdict {
        match self {
            TapeError::Malformed(_) | TapeError::Reported(_) => Verdict::Error,
            TapeError::Unbacked(_) => Verdict::Void,
        }
    }
}

/// One door of the subject as a run sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct DoorState {
    pub env: String,
    /// The registry's engagement counter of the door.
    pub counter: String,
    /// Whether the run turned it on.
    pub on: bool,
}

/// What a tape must hold: who wrote it, for which model, battery, captures and doors.
#[derive(Debug, Clone)]
pub struct Expect<'a> {
    pub subject: &'a str,
    pub version: &'a str,
    pub config: &'a ModelConfig,
    pub battery: &'a Battery,
    pub capture: &'a [CaptureKey],
    pub doors: &'a [DoorState],
    /// The run's pass shape: with several lanes the tape carries `p{p}.lanes` ([`super::lanes`]).
    pub pass: PassShape,
}

/// The tensor name of a capture.
pub fn capture_name(k: &CaptureKey) -> String {
    format!("capture.p{}.s{}.L{}.{}", k.prompt, k.step, k.layer, k.seam.name())
}

fn malformed(rule: impl Into<String>) -> TapeError {
    TapeError::Malformed(rule.into())
}

/// Read a tape strictly into a record (its `engaged` is the census).
pub fn read(bytes: &[u8], expect: &Expect) -> Result<Record, TapeError> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| malformed(format!("the tape is not a valid safetensors file ({} bytes): {e}", bytes.len())))?;
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| malformed(format!("the tape is not a valid safetensors file ({} bytes): {e}", bytes.len())))?;
    let tape_json = metadata(header.metadata().as_ref())?;
    let loose: serde_json::Value =
        serde_json::from_str(&tape_json).map_err(|e| malformed(format!("metadata `{KEY_TAPE}` is not JSON: {e}")))?;
    let reported = loose.get("error").is_some_and(|e| !e.is_null());
    let (subject, version) = (loose.get("subject"), loose.get("subject_version"));
    if subject.and_then(|s| s.as_str()) != Some(expect.subject)
        || version.and_then(|v| v.as_str()) != Some(expect.version)
    {
        return Err(malformed(format!(
            "the tape names subject {} version {}, but the manifest's subject is {:?} version {:?} (a stale manifest, or another program?)",
            subject.map_or("(missing)".to_string(), |s| s.to_string()),
            version.map_or("(missing)".to_string(), |v| v.to_string()),
            expect.subject,
            expect.version
        )));
    }
    if reported {
        let meta: ErrorMeta = serde_json::from_value(loose)
            .map_err(|e| malformed(format!("metadata `{KEY_TAPE}` of an error tape: {e}")))?;
        if !st.is_empty() {
            return Err(malformed(format!(
                "a tape that reports an error holds no tensor, this one holds {} (its error: {})",
                st.len(),
                meta.error
            )));
        }
        if meta.error.trim().is_empty() {
            return Err(malformed("the tape reports an error without saying what it is"));
        }
        return Err(TapeError::Reported(meta.error));
    }
    let meta: TapeMeta = serde_json::from_value(loose).map_err(|e| malformed(format!("metadata `{KEY_TAPE}`: {e}")))?;
    let mut reader = Reader { st, consumed: BTreeSet::new() };
    let record = reader.record(&meta, expect)?;
    let mut extra: Vec<&str> = reader.st.names().into_iter().filter(|n| !reader.consumed.contains(*n)).collect();
    extra.sort_unstable();
    if let Some(name) = extra.first() {
        return Err(malformed(format!(
            "tensor {name} is not part of this run's tape ({} unexpected tensor(s); a tape holds exactly the digests, tokens, top-two logits, the lanes of a multi-lane run, optional seam and layer timings and rank digests, and the requested captures)",
            extra.len()
        )));
    }
    check_claims(&meta, expect)?;
    Ok(record)
}

/// The `memra.tape` value, after the format and version keys are checked.
fn metadata(meta: Option<&HashMap<String, String>>) -> Result<String, TapeError> {
    let empty = HashMap::new();
    let meta = meta.unwrap_or(&empty);
    let get = |key: &str| {
        meta.get(key).map(String::as_str).ok_or_else(|| {
            malformed(format!(
                "metadata key `{key}` is missing (a {FORMAT_NAME} tape carries {KEY_FORMAT}, {KEY_FORMAT_VERSION} and {KEY_TAPE})"
            ))
        })
    };
    if get(KEY_FORMAT)? != FORMAT_NAME {
        return Err(malformed(format!("metadata `{KEY_FORMAT}` is {:?}, expected {FORMAT_NAME:?}", get(KEY_FORMAT)?)));
    }
    let version = get(KEY_FORMAT_VERSION)?;
    if version != FORMAT_VERSION {
        return Err(malformed(format!(
            "metadata `{KEY_FORMAT_VERSION}` is {version:?}: this build reads {FORMAT_NAME} version {FORMAT_VERSION}"
        )));
    }
    let mut unknown: Vec<&String> =
        meta.keys().filter(|k| ![KEY_FORMAT, KEY_FORMAT_VERSION, KEY_TAPE].contains(&k.as_str())).collect();
    unknown.sort_unstable();
    if let Some(k) = unknown.first() {
        return Err(malformed(format!("metadata key `{k}` is unknown to {FORMAT_NAME} version {FORMAT_VERSION}")));
    }
    get(KEY_TAPE).map(str::to_string)
}

struct Reader<'a> {
    st: SafeTensors<'a>,
    consumed: BTreeSet<String>,
}

impl Reader<'_> {
    /// The raw bytes of tensor `name`, checked for dtype and shape.
    fn tensor(&mut self, name: &str, dtype: Dtype, shape: &[usize], what: &str) -> Result<Vec<u8>, TapeError> {
        let t = self.st.tensor(name).map_err(|_| malformed(format!("tensor {name} is missing ({what})")))?;
        if t.dtype() != dtype {
            return Err(malformed(format!(
                "tensor {name} is {:?}, the protocol writes it as {dtype:?} ({what})",
                t.dtype()
            )));
        }
        if t.shape() != shape {
            return Err(malformed(format!("tensor {name} has shape {:?}, expected {shape:?} ({what})", t.shape())));
        }
        self.consumed.insert(name.to_string());
        Ok(t.data().to_vec())
    }

    fn record(&mut self, meta: &TapeMeta, expect: &Expect) -> Result<Record, TapeError> {
        let c = expect.config;
        if meta.layers != c.layers {
            return Err(malformed(format!("the tape has {} layers, the model {}", meta.layers, c.layers)));
        }
        let columns = seam_columns(c.layers);
        if meta.seams != columns {
            let missing = columns.iter().find(|s| !meta.seams.contains(s));
            let stray = meta.seams.iter().find(|s| !columns.contains(s));
            return Err(malformed(match (missing, stray) {
                (Some(m), _) => format!(
                    "seam {m} is missing from the tape (`seams` lists {} of {})",
                    meta.seams.len(),
                    columns.len()
                ),
                (None, Some(s)) => format!("seam {s:?} in `seams` is not a seam of this model (docs/DESIGN.md §3.2)"),
                (None, None) => {
                    "`seams` lists every seam, but not once each in record order (L0.attn_norm … the head seams)"
                        .to_string()
                }
            }));
        }
        let s = columns.len();
        let b = expect.battery;
        let mut record = Record {
            n_layers: c.layers,
            engaged: meta.census.clone(),
            backend: meta.backend.clone(),
            build_options: meta.build_options.clone(),
            ..Record::default()
        };
        let timed = self.st.names().iter().any(|n| n.ends_with(".timings_ns") && !n.ends_with(".layer_timings_ns"));
        if timed {
            record.timings_ns = vec![Vec::new(); s];
        }
        let layers_timed = self.st.names().iter().any(|n| n.ends_with(".layer_timings_ns"));
        if layers_timed {
            record.layer_timings_ns = vec![Vec::new(); c.layers + 1];
        }
        let ranked = self.st.names().iter().any(|n| n.ends_with(".rank_digests"));
        let ranks = match self.st.tensor("p0.rank_digests") {
            Ok(t) if t.shape().len() == 3 && t.shape()[2] > 0 => t.shape()[2],
            _ => 1,
        };
        for p in 0..b.prompts.len() {
            let steps = b.steps_of(p);
            let g = b.gen_tokens;
            let what = format!(
                "prompt {p}: {} prompt tokens + {g} generated − 1 = {steps} steps × {s} seams",
                b.prompts[p].len()
            );
            let digests = u64s(&self.tensor(&format!("p{p}.digests"), Dtype::U64, &[steps, s], &what)?);
            if let Some(i) = digests.iter().position(|d| *d == 0) {
                return Err(malformed(format!(
                    "p{p}.digests: step {} seam {} is 0, a seam that was never written (every seam tensor is non-empty, and its digest is 0 with probability 2^-64)",
                    i / s,
                    columns[i % s]
                )));
            }
            if ranked {
                let shares = u64s(&self.tensor(
                    &format!("p{p}.rank_digests"),
                    Dtype::U64,
                    &[steps, s, ranks],
                    &format!("{what} × {ranks} ranks (rank digests: all prompts or none)"),
                )?);
                let mut steps_of = Vec::with_capacity(steps);
                for (i, (step, digest)) in shares.chunks(s * ranks).zip(digests.chunks(s)).enumerate() {
                    let seams: Vec<Vec<u64>> = step.chunks(ranks).map(<[u64]>::to_vec).collect();
                    for (j, parts) in seams.iter().enumerate() {
                        let sum = parts.iter().fold(0u64, |a, x| a.wrapping_add(*x));
                        if sum != digest[j] {
                            return Err(malformed(format!(
                                "p{p}.rank_digests: step {i} seam {}: the ranks' shares sum to {sum:#018x}, the seam digest is {:#018x} (a seam digest is the wrapping sum of its ranks' shares)",
                                columns[j], digest[j]
                            )));
                        }
                    }
                    steps_of.push(seams);
                }
                record.rank_digests.push(steps_of);
            }
            record.digests.push(digests.chunks(s).map(<[u64]>::to_vec).collect());
            let tokens = u32s(&self.tensor(
                &format!("p{p}.tokens"),
                Dtype::U32,
                &[g],
                &format!("prompt {p}: {g} generated tokens"),
            )?);
            if let Some(t) = tokens.iter().find(|t| **t as usize >= c.vocab) {
                return Err(malformed(format!("p{p}.tokens: token {t} is outside the vocabulary of {}", c.vocab)));
            }
            record.tokens.push(tokens);
            let top2 = u32s(&self.tensor(
                &format!("p{p}.top2"),
                Dtype::F32,
                &[g, 2],
                &format!("prompt {p}: top-two logits of {g} tokens"),
            )?);
            record.top2.push(top2.chunks(2).map(|x| (f32::from_bits(x[0]), f32::from_bits(x[1]))).collect());
            if expect.pass.lanes() > 1 {
                let lanes = u32s(&self.tensor(
                    &super::lanes::tensor_name(p),
                    Dtype::U32,
                    &[steps, 2],
                    &format!("prompt {p}: the (pass, lane) of each of {steps} steps in a {} run", expect.pass.label()),
                )?);
                let named = lanes
                    .chunks(2)
                    .map(|x| u8::try_from(x[1]).map(|lane| (x[0], lane)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| malformed(format!("p{p}.lanes: a lane index above 255")))?;
                record.lanes.push(named);
            }
            if timed {
                let t = u64s(&self.tensor(
                    &format!("p{p}.timings_ns"),
                    Dtype::U64,
                    &[steps, s],
                    &format!("{what} (timings: all prompts or none)"),
                )?);
                for row in t.chunks(s) {
                    for (i, ns) in row.iter().enumerate() {
                        record.timings_ns[i].push(*ns);
                    }
                }
            }
            if layers_timed {
                let l = c.layers + 1;
                let t = u64s(&self.tensor(
                    &format!("p{p}.layer_timings_ns"),
                    Dtype::U64,
                    &[steps, l],
                    &format!(
                        "prompt {p}: {steps} steps × {l} layers and the head (layer timings: all prompts or none)"
                    ),
                )?);
                for row in t.chunks(l) {
                    for (i, ns) in row.iter().enumerate() {
                        record.layer_timings_ns[i].push(*ns);
                    }
                }
            }
        }
        super::lanes::check(&record.lanes, expect.pass).map_err(malformed)?;
        let mut owners_left: BTreeSet<&String> = meta.capture_owners.keys().collect();
        for key in expect.capture {
            let name = capture_name(key);
            let len = seam_len(c, key.seam).map_err(malformed)?;
            let bits = u32s(&self.tensor(
                &name,
                Dtype::F32,
                &[len],
                &format!("the requested capture of {}", key.seam.name()),
            )?);
            owners_left.remove(&name);
            let owners = match meta.capture_owners.get(&name) {
                Some(o) => check_owners(&name, o, len)?,
                None => vec![(0, 0, len)],
            };
            record.captures.insert(*key, Capture { bits, owners });
        }
        if let Some(stray) = owners_left.first() {
            return Err(malformed(format!("capture_owners names {stray}, which is not a requested capture")));
        }
        let evidence = BackendEvidence {
            backend_census: meta.backend_census.clone(),
            coverage: meta.coverage.clone(),
            copies: meta.copies.clone(),
        };
        evidence.apply(&mut record, c.layers).map_err(malformed)?;
        Ok(record)
    }
}

/// Owner ranges lie inside the tensor and do not overlap.
fn check_owners(
    name: &str,
    owners: &[(usize, usize, usize)],
    len: usize,
) -> Result<Vec<(usize, usize, usize)>, TapeError> {
    let mut sorted: Vec<&(usize, usize, usize)> = owners.iter().collect();
    sorted.sort_by_key(|o| o.1);
    let mut end = 0;
    for (rank, start, n) in sorted {
        if *start < end || start.checked_add(*n).is_none_or(|e| e > len) {
            return Err(malformed(format!(
                "capture_owners of {name}: rank {rank}'s part {start}+{n} overlaps another or leaves the tensor of {len}"
            )));
        }
        end = start + n;
    }
    Ok(owners.to_vec())
}

/// `engaged_doors` against the run's doors and the census (docs/DESIGN.md §4.2): ERROR for claims
/// the configuration contradicts, VOID for a claim the census does not back.
fn check_claims(meta: &TapeMeta, expect: &Expect) -> Result<(), TapeError> {
    let claimed: BTreeSet<&str> = meta.engaged_doors.iter().map(String::as_str).collect();
    if claimed.len() != meta.engaged_doors.len() {
        return Err(malformed("engaged_doors names a door twice"));
    }
    for env in &claimed {
        match expect.doors.iter().find(|d| d.env == *env) {
            None => return Err(malformed(format!("engaged_doors claims {env}, which is not a door of this subject"))),
            Some(d) if !d.on => {
                return Err(malformed(format!(
                    "engaged_doors claims {env} engaged, but this run turned it off ({env}=0)"
                )))
            }
            Some(_) => {}
        }
    }
    for d in expect.doors {
        let count = meta.census.get(&d.counter).copied().unwrap_or(0);
        if !d.on && count > 0 {
            return Err(malformed(format!(
                "census shows {} = {count} for {}, which this run turned off: the door's mechanism ran on the default path",
                d.counter, d.env
            )));
        }
        if d.on && count > 0 && !claimed.contains(d.env.as_str()) {
            return Err(malformed(format!(
                "census shows {} = {count}, but engaged_doors does not claim {} (the claim and the census must agree)",
                d.counter, d.env
            )));
        }
    }
    for d in expect.doors.iter().filter(|d| claimed.contains(d.env.as_str())) {
        if meta.census.get(&d.counter).copied().unwrap_or(0) == 0 {
            return Err(TapeError::Unbacked(format!(
                "engagement: the subject claims {} engaged, but its census does not back it ({} = {})",
                d.env,
                d.counter,
                meta.census.get(&d.counter).map_or("absent".to_string(), |n| n.to_string())
            )));
        }
    }
    Ok(())
}

fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}

/// An owned tensor for the writer.
struct Owned {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl safetensors::View for &Owned {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn le_u64(v: impl IntoIterator<Item = u64>) -> Vec<u8> {
    v.into_iter().flat_map(u64::to_le_bytes).collect()
}

fn le_u32(v: impl IntoIterator<Item = u32>) -> Vec<u8> {
    v.into_iter().flat_map(u32::to_le_bytes).collect()
}

fn with_meta(tape: String) -> HashMap<String, String> {
    HashMap::from([
        (KEY_FORMAT.to_string(), FORMAT_NAME.to_string()),
        (KEY_FORMAT_VERSION.to_string(), FORMAT_VERSION.to_string()),
        (KEY_TAPE.to_string(), tape),
    ])
}

/// The tape of a record: its digests, tokens, top-two logits, timings (when it has them) and
/// captures; `engaged_doors` as the subject claims them.
pub fn write(record: &Record, subject: &str, version: &str, engaged_doors: &[String]) -> Result<Vec<u8>, String> {
    let s = record.seams_per_step();
    let mut tensors: BTreeMap<String, Owned> = BTreeMap::new();
    let mut sample = 0;
    for (p, steps) in record.digests.iter().enumerate() {
        let n = steps.len();
        tensors.insert(
            format!("p{p}.digests"),
            Owned { dtype: Dtype::U64, shape: vec![n, s], data: le_u64(steps.iter().flatten().copied()) },
        );
        let tokens = record.tokens.get(p).cloned().unwrap_or_default();
        let g = tokens.len();
        tensors.insert(format!("p{p}.tokens"), Owned { dtype: Dtype::U32, shape: vec![g], data: le_u32(tokens) });
        let top2 = record.top2.get(p).cloned().unwrap_or_default();
        tensors.insert(
            format!("p{p}.top2"),
            Owned {
                dtype: Dtype::F32,
                shape: vec![top2.len(), 2],
                data: le_u32(top2.iter().flat_map(|(a, b)| [a.to_bits(), b.to_bits()])),
            },
        );
        // A multi-lane record's samples are per pass, not per step: the tape carries no timings.
        let per_step = record.lanes.is_empty();
        if per_step && record.timings_ns.len() == s && record.timings_ns.iter().all(|t| t.len() >= sample + n) {
            let rows = (sample..sample + n).flat_map(|i| record.timings_ns.iter().map(move |t| t[i]));
            tensors
                .insert(format!("p{p}.timings_ns"), Owned { dtype: Dtype::U64, shape: vec![n, s], data: le_u64(rows) });
        }
        let l = record.n_layers + 1;
        let lt = &record.layer_timings_ns;
        if per_step && lt.len() == l && lt.iter().all(|t| t.len() >= sample + n) {
            let rows = (sample..sample + n).flat_map(|i| lt.iter().map(move |t| t[i]));
            tensors.insert(
                format!("p{p}.layer_timings_ns"),
                Owned { dtype: Dtype::U64, shape: vec![n, l], data: le_u64(rows) },
            );
        }
        if let Some(lanes) = record.lanes.get(p).filter(|l| l.len() == n) {
            tensors.insert(
                super::lanes::tensor_name(p),
                Owned {
                    dtype: Dtype::U32,
                    shape: vec![n, 2],
                    data: le_u32(lanes.iter().flat_map(|&(pass, lane)| [pass, u32::from(lane)])),
                },
            );
        }
        if let Some(shares) = record.rank_digests.get(p).filter(|r| r.len() == n) {
            let ranks = shares.first().and_then(|st| st.first()).map_or(0, Vec::len);
            if ranks > 0 && shares.iter().all(|st| st.len() == s && st.iter().all(|x| x.len() == ranks)) {
                tensors.insert(
                    format!("p{p}.rank_digests"),
                    Owned {
                        dtype: Dtype::U64,
                        shape: vec![n, s, ranks],
                        data: le_u64(shares.iter().flatten().flatten().copied()),
                    },
                );
            }
        }
        sample += n;
    }
    let evidence = BackendEvidence::of(record);
    let mut owners = BTreeMap::new();
    for (key, cap) in &record.captures {
        let name = capture_name(key);
        owners.insert(name.clone(), cap.owners.clone());
        tensors.insert(
            name,
            Owned { dtype: Dtype::F32, shape: vec![cap.bits.len()], data: le_u32(cap.bits.iter().copied()) },
        );
    }
    let meta = TapeMeta {
        subject: subject.to_string(),
        subject_version: version.to_string(),
        layers: record.n_layers,
        seams: seam_columns(record.n_layers),
        engaged_doors: engaged_doors.to_vec(),
        census: record.engaged.clone(),
        backend: record.backend.clone(),
        build_options: record.build_options.clone(),
        capture_owners: owners,
        error: None,
        backend_census: evidence.backend_census,
        coverage: evidence.coverage,
        copies: evidence.copies,
    };
    let json = serde_json::to_string(&meta).map_err(|e| e.to_string())?;
    safetensors::serialize(tensors.iter().map(|(k, v)| (k.clone(), v)), Some(with_meta(json)))
        .map_err(|e| e.to_string())
}

/// The tape of a run the subject could not complete.
pub fn write_error(subject: &str, version: &str, reason: &str) -> Vec<u8> {
    let meta = ErrorMeta { subject: subject.into(), subject_version: version.into(), error: reason.into() };
    let json = serde_json::to_string(&meta).expect("an error tape serializes");
    safetensors::serialize(Vec::<(String, &Owned)>::new(), Some(with_meta(json))).expect("an empty tape serializes")
}
