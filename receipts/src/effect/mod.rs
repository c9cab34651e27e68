//! Door effects (docs/DESIGN.md §7, METRICS.md, "Door effects"): what each door does to the latency of one
//! night, and what exactness costs. The one definition of the door-effect file
//! (`door-effects.json`, beside a receipt set's `summary.json`), of its computation from a receipt
//! set, and of its reader.
//!
//! # What is compared
//!
//! Two run receipts are *siblings* when they share subject, backend, TP size, transport, model
//! (preset and digest), battery and oracle. For a receipt `c` whose `config.doors` sets door `D` to
//! `true`, its **parent** is the sibling whose `config.doors` is `c`'s without the key `D` (the same
//! door set without that door), in the same receipt set — the same night, the same machine. A
//! configuration whose door set less `D` is not legal (another of its doors requires `D`) has no
//! parent and no effect for `D`. Each (configuration, door, parent) pair is one [`DoorEffect`]: the
//! whole step and each seam (summed over layers) compared by [`rule::compare`].
//! Only single-token runs are compared: a run of several rows or columns per pass
//! (docs/DESIGN.md §3.6) is timed per pass, another workload, left out here.
//!
//! The **cost of exactness** ([`ExactnessCost`]), per sibling group: the canonical default (no door
//! on) against the fastest configuration of the group that passed, NUMERIC-CLASS doors included,
//! compared by the same rule (`ratio` = fastest / default; the cost is `1 / ratio − 1`).
//!
//! Only receipts of kind `run` with latencies take part; the cost of exactness takes only PASS
//! receipts. The file's `schema_version` is [`EFFECTS_SCHEMA_VERSION`]; readers refuse others.
//!
//! ```text
//! DoorEffects            door-effects.json
//! ├─ schema_version      1
//! ├─ kind                "door-effects"
//! ├─ rule                the noise floors and limits the comparisons used
//! ├─ effects[]           door, run_id, label, parent_run_id, backend, tp, transport, verdicts,
//! │                      step: Comparison, seams: { seam → Comparison }
//! └─ exactness_cost[]    backend, tp, transport, default_run_id, fastest_run_id, fastest_doors,
//!                        step: Comparison (fastest against default)
//! Comparison             median_ns, parent_median_ns, ratio, noise, lo, hi, effect
//! ```

pub mod render;
pub mod rule;
mod summary;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use rule::{compare, Comparison, Effect, Span};
pub use summary::{door_nights, DoorNight};

use crate::error::ReceiptError;
use crate::schema::{Backend, Receipt, ReceiptKind, RunConfigEvidence, Transport, Verdict};

/// The version of the door-effect file this build reads and writes.
pub const EFFECTS_SCHEMA_VERSION: u32 = 1;
/// Its file name, beside `summary.json`.
pub const EFFECTS_FILE: &str = "door-effects.json";

/// The door-effect file of one receipt set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoorEffects {
    pub schema_version: u32,
    /// Always `"door-effects"`.
    pub kind: String,
    pub rule: RuleParams,
    /// Sorted by door, backend, TP, transport, run id.
    pub effects: Vec<DoorEffect>,
    /// Sorted by backend, TP, transport.
    pub exactness_cost: Vec<ExactnessCost>,
}

/// The constants of [`rule`] the file was computed with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleParams {
    pub host_floor: f64,
    pub cuda_floor: f64,
    pub same_max_noise: f64,
    pub min_samples: u64,
}

impl Default for RuleParams {
    fn default() -> Self {
        RuleParams {
            host_floor: rule::HOST_FLOOR,
            cuda_floor: rule::CUDA_FLOOR,
            same_max_noise: rule::SAME_MAX_NOISE,
            min_samples: rule::MIN_SAMPLES,
        }
    }
}

/// One configuration with door `door` on, against its parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoorEffect {
    /// The door's environment variable (`MEMRA_OPROJ_DIRECT`).
    pub door: String,
    pub run_id: String,
    pub label: String,
    pub parent_run_id: String,
    pub backend: Backend,
    pub tp: usize,
    pub transport: Transport,
    pub verdict: Verdict,
    pub parent_verdict: Verdict,
    /// The whole step: every layer × seam.
    pub step: Comparison,
    /// Each seam summed over the layers, for the seams both runs timed.
    pub seams: BTreeMap<String, Comparison>,
}

/// The canonical default of one sibling group against its fastest passing configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExactnessCost {
    pub backend: Backend,
    pub tp: usize,
    pub transport: Transport,
    pub default_run_id: String,
    pub fastest_run_id: String,
    /// The doors on in the fastest configuration (empty: the default itself was fastest).
    pub fastest_doors: Vec<String>,
    /// The fastest against the default: `ratio` ≤ 1.
    pub step: Comparison,
}

/// Everything two receipts must share to be compared, less their doors.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SiblingKey {
    subject: String,
    backend: Backend,
    tp: usize,
    transport: Transport,
    model: (String, String),
    battery: String,
    oracle: String,
    /// Rows and columns per pass (docs/DESIGN.md §3.6): a multi-lane run is no sibling of a
    /// single-token one.
    pass: (Option<usize>, Option<usize>),
}

impl SiblingKey {
    fn of(c: &RunConfigEvidence) -> SiblingKey {
        SiblingKey {
            subject: c.subject.clone(),
            backend: c.backend,
            tp: c.tp,
            transport: c.transport,
            model: (c.model.preset.clone(), c.model.digest.clone()),
            battery: c.battery_digest.clone(),
            oracle: c.oracle.clone(),
            pass: (c.batch, c.columns),
        }
    }
}

/// The doors a configuration turns on, sorted.
pub fn doors_on(c: &RunConfigEvidence) -> Vec<String> {
    c.doors.iter().filter(|(_, on)| **on).map(|(k, _)| k.clone()).collect()
}

/// The door effects and the cost of exactness of one receipt set (see the module doc).
pub fn door_effects(receipts: &[Receipt]) -> DoorEffects {
    // Single-token runs only: a pass of several rows or columns is another workload, timed per
    // pass (docs/DESIGN.md §3.6), and the per door × TP summary must not mix the two.
    let timed: Vec<&Receipt> = receipts
        .iter()
        .filter(|r| r.kind == ReceiptKind::Run && !r.measurements.latency.is_empty() && r.evidence.config.lanes() == 1)
        .collect();
    let mut groups: BTreeMap<SiblingKey, BTreeMap<&BTreeMap<String, bool>, &Receipt>> = BTreeMap::new();
    for r in &timed {
        groups.entry(SiblingKey::of(&r.evidence.config)).or_default().entry(&r.evidence.config.doors).or_insert(r);
    }
    let mut effects = Vec::new();
    let mut exactness_cost = Vec::new();
    for (key, group) in &groups {
        for (doors, c) in group {
            for door in doors.iter().filter(|(_, on)| **on).map(|(k, _)| k) {
                let mut parent_doors = (*doors).clone();
                parent_doors.remove(door);
                if let Some(p) = group.get(&parent_doors) {
                    effects.push(effect_of(door, c, p));
                }
            }
        }
        if let Some(cost) = exactness_cost_of(key, group) {
            exactness_cost.push(cost);
        }
    }
    effects.sort_by(|a, b| {
        (&a.door, a.backend, a.tp, a.transport, &a.run_id).cmp(&(&b.door, b.backend, b.tp, b.transport, &b.run_id))
    });
    exactness_cost.sort_by_key(|c| (c.backend, c.tp, c.transport));
    DoorEffects {
        schema_version: EFFECTS_SCHEMA_VERSION,
        kind: "door-effects".to_string(),
        rule: RuleParams::default(),
        effects,
        exactness_cost,
    }
}

fn step_span(r: &Receipt) -> Span {
    Span::of(&r.measurements.latency).unwrap_or_default()
}

fn effect_of(door: &str, c: &Receipt, p: &Receipt) -> DoorEffect {
    let backend = c.evidence.config.backend;
    fn seams_of(r: &Receipt) -> BTreeMap<&str, Vec<&crate::schema::SeamLatency>> {
        let mut m: BTreeMap<&str, Vec<&crate::schema::SeamLatency>> = BTreeMap::new();
        for l in &r.measurements.latency {
            m.entry(l.seam.as_str()).or_default().push(l);
        }
        m
    }
    let (cs, ps) = (seams_of(c), seams_of(p));
    let seams = cs
        .iter()
        .filter_map(|(seam, ce)| {
            let pe = ps.get(seam)?;
            let (a, b) = (Span::of(ce.iter().copied())?, Span::of(pe.iter().copied())?);
            Some((seam.to_string(), compare(&a, &b, backend)))
        })
        .collect();
    DoorEffect {
        door: door.to_string(),
        run_id: c.run_id.clone(),
        label: c.label(),
        parent_run_id: p.run_id.clone(),
        backend,
        tp: c.evidence.config.tp,
        transport: c.evidence.config.transport,
        verdict: c.evidence.verdict,
        parent_verdict: p.evidence.verdict,
        step: compare(&step_span(c), &step_span(p), backend),
        seams,
    }
}

fn exactness_cost_of(key: &SiblingKey, group: &BTreeMap<&BTreeMap<String, bool>, &Receipt>) -> Option<ExactnessCost> {
    let passed = || group.values().filter(|r| r.evidence.verdict == Verdict::Pass);
    let default = passed().find(|r| doors_on(&r.evidence.config).is_empty())?;
    let fastest = passed().min_by_key(|r| (step_span(r).median_ns, r.run_id.clone()))?;
    Some(ExactnessCost {
        backend: key.backend,
        tp: key.tp,
        transport: key.transport,
        default_run_id: default.run_id.clone(),
        fastest_run_id: fastest.run_id.clone(),
        fastest_doors: doors_on(&fastest.evidence.config),
        step: compare(&step_span(fastest), &step_span(default), key.backend),
    })
}

/// `<dir>/door-effects.json`.
pub fn effects_path(dir: &Path) -> PathBuf {
    dir.join(EFFECTS_FILE)
}

/// The file's canonical JSON text.
pub fn effects_to_json(effects: &DoorEffects) -> Result<String, ReceiptError> {
    crate::canonical::to_canonical_json(effects)
}

/// Write `<dir>/door-effects.json` atomically.
pub fn write_effects(dir: &Path, effects: &DoorEffects) -> Result<PathBuf, ReceiptError> {
    let path = effects_path(dir);
    let text = crate::canonical::to_canonical_json_at(effects, &path)?;
    crate::store::write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// Read a door-effect file strictly: its `kind` and `schema_version` first, then every field.
pub fn parse_effects(bytes: &[u8], origin: &Path) -> Result<DoorEffects, ReceiptError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|source| ReceiptError::Syntax { path: origin.to_path_buf(), source })?;
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    if kind != "door-effects" {
        return Err(ReceiptError::WrongKind {
            path: origin.to_path_buf(),
            found: format!("{kind:?}"),
            expected: "a door-effect file (kind \"door-effects\")",
        });
    }
    let version = value.get("schema_version").and_then(|v| v.as_u64());
    if version != Some(u64::from(EFFECTS_SCHEMA_VERSION)) {
        return Err(ReceiptError::UnsupportedVersion {
            path: origin.to_path_buf(),
            found: version.map_or("none".to_string(), |v| v.to_string()),
            supported: "1",
        });
    }
    serde_json::from_slice(bytes).map_err(|source| ReceiptError::Shape {
        path: origin.to_path_buf(),
        version: EFFECTS_SCHEMA_VERSION,
        source,
    })
}

/// Read `path`.
pub fn read_effects(path: &Path) -> Result<DoorEffects, ReceiptError> {
    let bytes = std::fs::read(path).map_err(|e| ReceiptError::io(path, "read", e))?;
    parse_effects(&bytes, path)
}
