//! The door registry: one data file (`gates/doors.toml`) says everything about every door, so
//! the enumerator, the edge parsers, the gates and the promotion report all read the same facts
//! and nothing about a door lives only in a comment (docs/DESIGN.md §4.1). This module defines,
//! versions and validates that format, and maps door ids onto the runtime's explicit
//! [`DoorSet`].
//!
//! # Format, `schema_version = 1`
//!
//! A TOML file with `schema_version = 1` at the top, one `[[door]]` table per door and one
//! `[[setting]]` table per tool setting that shares the `MEMRA_` prefix. Unknown fields and any
//! other schema version are rejected.
//!
//! ```toml
//! schema_version = 1
//!
//! [[door]]
//! id = "oproj_tail"                 # lower snake case; the runtime DoorSet field of the same name
//! env = "MEMRA_OPROJ_TAIL"          # the environment variable (MEMRA_ + upper snake case)
//! class = "BIT-IDENTICAL"           # BIT-IDENTICAL | VALUE-IDENTICAL | SCHEDULING-ONLY | NUMERIC-CLASS | CANARY
//! default = false                   # the value when nothing sets it (promotion flips it)
//! changes = "the o_join fold is deferred into the ffn_norm kernel (same operands, same order)"
//! gate = "identity"                 # identity | argmax_tape+class_identity+error_budget | argmax_tape+error_budget
//! engagement = "oproj_tail.fused_joins"   # record counter `<id>.<what>` proving the mechanism ran
//! seams = ["o_join", "ffn_norm"]    # seams the mechanism touches (docs/DESIGN.md §3.2 names)
//! tp = { allowed = [2, 4, 8], why = "inherits oproj_direct's TP sizes" }
//! transports = { allowed = ["native-p2p"], why = "the deferred partials are peer stores" }
//! backends = ["host", "cuda"]       # where the mechanism exists
//! not_applicable = {}               # { backend = "reason" } for every backend not in `backends`
//! requires = [ { id = "oproj_direct", why = "the o_join add is deferred only when peers store partials directly" } ]
//! conflicts = []                    # [ { id = "...", why = "..." } ], declared once, holds both ways
//! # NUMERIC-CLASS only:
//! # error_budget = { max_rel_error = 1e-3, near_tie_margin = 1e-2, per_seam = { qkv = 5e-2 }, why = "..." }
//! # gate_why = "..."                # required when a NUMERIC-CLASS door cannot have class identity
//!
//! [[setting]]
//! env = "MEMRA_REQUIRE_GPU"
//! format = "bool01"                 # bool01 | layer:seam:step | process (P/N) | path | seconds
//! default = "0"
//! meaning = "1 turns GPU-test skips into failures"
//! ```
//!
//! # Rules a registry must satisfy (each violation is an error naming the door, value and rule)
//! - ids are unique lower snake case; `env` names are unique across doors and settings, and are
//!   `MEMRA_` + upper snake case.
//! - `tp` values lie in {1, 2, 4, 8}; `transports` are `host-bounce`, `native-p2p`, `nccl`;
//!   `backends` are `host`, `cuda`. Lists are non-empty and free of repeats. Leaving out any TP
//!   size or transport needs a non-empty `why`.
//! - every backend is in exactly one of `backends` and `not_applicable` (with a reason).
//! - `requires` and `conflicts` name known doors other than the door itself, each with a `why`;
//!   `requires` has no cycle; a door's TP sizes, transports and backends lie inside those of
//!   every door it requires; no door requires (directly or through others) a door it conflicts
//!   with. So every door has at least one legal configuration of its own.
//! - the class decides the gate: identity classes and CANARY take `identity`; NUMERIC-CLASS takes
//!   `argmax_tape+class_identity+error_budget`, or `argmax_tape+error_budget` with a `gate_why`.
//!   A gate with class identity needs TP1 and host-bounce allowed (its class baseline is the
//!   door's own TP1 host-bounce run, docs/DESIGN.md §4.2).
//! - `error_budget` is present exactly on NUMERIC-CLASS doors; its numbers are finite and > 0.
//!   `max_rel_error` bounds `max_i |got_i − oracle_i| / max_i |oracle_i|` over one seam tensor
//!   (`per_seam` overrides it for named seams); `near_tie_margin` is in logit units: a step
//!   whose oracle top-1 minus top-2 logit is at or below it is a near-tie.
//! - CANARY doors are default-off; `engagement` starts with `<id>.` and is unique.
//! - a setting's `default` parses under its `format`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use memra_runtime::config::{Canary, DoorSet, Transport};
use memra_runtime::record::Seam;
use serde::Deserialize;

/// The registry format version this build reads and writes.
pub const SCHEMA_VERSION: i64 = 1;

/// The built-in registry (`gates/doors.toml`), embedded at build time.
pub const BUILTIN_REGISTRY: &str = include_str!("../doors.toml");

/// TP sizes the runtime accepts (docs/DESIGN.md §3.4).
pub const TP_SIZES: [usize; 4] = [1, 2, 4, 8];

/// Errors of the registry, the environment / flag edge and the matrix enumerator. Each message
/// names the thing, the value and the rule.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{origin} is not a valid {what}: {message}")]
    Parse { origin: String, what: String, message: String },
    #[error("{origin} has schema_version {found}; this build reads schema_version {supported} only")]
    SchemaVersion { origin: String, found: String, supported: i64 },
    /// A registry entry breaks a rule of the format.
    #[error("{origin}: {thing} = {value}: {rule}")]
    Invalid { origin: String, thing: String, value: String, rule: String },
    /// A door variable or flag with a value other than 0, 1 or empty.
    #[error("{name}={value:?} is not a door value: use 1 (on), 0 or empty (off)")]
    DoorValue { name: String, value: String },
    /// A setting with a value its format does not accept.
    #[error("{name}={value:?} is not a valid value: {rule}")]
    SettingValue { name: String, value: String, rule: String },
    /// A `MEMRA_*` variable, door flag or door name that the registry does not declare.
    #[error("{name} is not a known {kind} ({rule}); {}", suggestion_text(.suggestion))]
    UnknownName { name: String, kind: String, rule: String, suggestion: Option<String> },
    /// A malformed command-line value (door flag, shard spec).
    #[error("{flag} {value:?} is malformed: {rule}")]
    Flag { flag: String, value: String, rule: String },
    /// An explicit door request that breaks a requires / conflicts rule.
    #[error("{0}")]
    Request(String),
    /// A matrix request that cannot be enumerated.
    #[error("matrix {thing} {value}: {rule}")]
    Matrix { thing: String, value: String, rule: String },
    /// A door set the runtime has no field for.
    #[error("door {id:?} cannot run on the built-in runtime: {rule}")]
    NoRuntimeField { id: String, rule: String },
    /// Several independent problems, reported together (one per line).
    #[error("{}", join_lines(.0))]
    Several(Vec<RegistryError>),
}

fn suggestion_text(s: &Option<String>) -> String {
    match s {
        Some(s) => format!("did you mean {s}?"),
        None => "no similar name".to_string(),
    }
}

fn join_lines(errors: &[RegistryError]) -> String {
    errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n")
}

impl RegistryError {
    /// One error as itself, several as [`RegistryError::Several`], none as `Ok`.
    pub fn collect(mut errors: Vec<RegistryError>) -> Result<(), RegistryError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(RegistryError::Several(errors)),
        }
    }
}

/// What a door claims about the numbers (docs/DESIGN.md §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
pub enum DoorClass {
    #[serde(rename = "BIT-IDENTICAL")]
    BitIdentical,
    #[serde(rename = "VALUE-IDENTICAL")]
    ValueIdentical,
    #[serde(rename = "SCHEDULING-ONLY")]
    SchedulingOnly,
    #[serde(rename = "NUMERIC-CLASS")]
    Numeric,
    #[serde(rename = "CANARY")]
    Canary,
}

impl DoorClass {
    pub fn name(self) -> &'static str {
        match self {
            DoorClass::BitIdentical => "BIT-IDENTICAL",
            DoorClass::ValueIdentical => "VALUE-IDENTICAL",
            DoorClass::SchedulingOnly => "SCHEDULING-ONLY",
            DoorClass::Numeric => "NUMERIC-CLASS",
            DoorClass::Canary => "CANARY",
        }
    }
}

/// The gate that promotes a door (for a CANARY: the gate that must FAIL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
pub enum Gate {
    /// Every layer × seam × token digest equals the oracle's, bitwise.
    #[serde(rename = "identity")]
    Identity,
    /// Argmax tape under teacher forcing, the door's TP1 host-bounce run as class baseline that
    /// every other TP size and transport equals bitwise, and the error budget.
    #[serde(rename = "argmax_tape+class_identity+error_budget")]
    ArgmaxTapeClassIdentityErrorBudget,
    /// Argmax tape and error budget only, for a door whose arithmetic depends on the TP size by
    /// design (the door's `gate_why` says why).
    #[serde(rename = "argmax_tape+error_budget")]
    ArgmaxTapeErrorBudget,
}

impl Gate {
    pub fn name(self) -> &'static str {
        match self {
            Gate::Identity => "identity",
            Gate::ArgmaxTapeClassIdentityErrorBudget => "argmax_tape+class_identity+error_budget",
            Gate::ArgmaxTapeErrorBudget => "argmax_tape+error_budget",
        }
    }
    /// Whether the gate compares every run with the door's own TP1 host-bounce class baseline.
    pub fn has_class_identity(self) -> bool {
        matches!(self, Gate::ArgmaxTapeClassIdentityErrorBudget)
    }
}

/// The machine kind that runs the canonical program (`--backend host|cuda`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    Host,
    Cuda,
}

impl BackendKind {
    pub const ALL: [BackendKind; 2] = [BackendKind::Host, BackendKind::Cuda];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        }
    }

    pub fn parse(s: &str) -> Option<BackendKind> {
        BackendKind::ALL.into_iter().find(|b| b.name() == s)
    }
}

/// A `requires` or `conflicts` edge: the other door and the rule that makes the edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub id: String,
    pub why: String,
}

/// Allowed values of one axis, and why the others are left out (`None` when nothing is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed<T> {
    pub allowed: Vec<T>,
    pub why: Option<String>,
}

impl<T: PartialEq> Allowed<T> {
    pub fn contains(&self, v: &T) -> bool {
        self.allowed.contains(v)
    }
}

/// What a NUMERIC-CLASS door may change (see the module docs for the definitions).
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorBudget {
    pub max_rel_error: f64,
    pub near_tie_margin: f64,
    pub per_seam: BTreeMap<Seam, f64>,
    pub why: String,
}

impl ErrorBudget {
    /// The relative-error bound that applies at `seam`.
    pub fn max_rel_error_at(&self, seam: Seam) -> f64 {
        self.per_seam.get(&seam).copied().unwrap_or(self.max_rel_error)
    }
}

/// One door, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Door {
    pub id: String,
    pub env: String,
    pub class: DoorClass,
    pub default: bool,
    pub changes: String,
    pub gate: Gate,
    pub gate_why: Option<String>,
    pub engagement: String,
    pub seams: Vec<Seam>,
    pub tp: Allowed<usize>,
    pub transports: Allowed<Transport>,
    pub backends: Vec<BackendKind>,
    pub not_applicable: BTreeMap<BackendKind, String>,
    pub requires: Vec<Link>,
    /// Declared in either direction in the file; holds both ways here.
    pub conflicts: Vec<Link>,
    pub error_budget: Option<ErrorBudget>,
}

impl Door {
    pub fn is_canary(&self) -> bool {
        self.class == DoorClass::Canary
    }
    /// Why the mechanism has no meaning on `backend`, or `None` when it has.
    pub fn not_applicable_on(&self, backend: BackendKind) -> Option<&str> {
        self.not_applicable.get(&backend).map(String::as_str)
    }
    /// The rule text for a requirement of this door, or `None` if `other` is not required.
    pub fn requirement(&self, other: &str) -> Option<&str> {
        self.requires.iter().find(|l| l.id == other).map(|l| l.why.as_str())
    }
    /// The rule text of a conflict with `other`, or `None`.
    pub fn conflict(&self, other: &str) -> Option<&str> {
        self.conflicts.iter().find(|l| l.id == other).map(|l| l.why.as_str())
    }
}

/// How a setting's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SettingFormat {
    /// Unset, "" or "0" → off, "1" → on (the door rule).
    #[serde(rename = "bool01")]
    Bool01,
    /// `LAYER:SEAM:STEP`, e.g. `0:o_join:3`.
    #[serde(rename = "layer:seam:step")]
    LayerSeamStep,
    /// `P/N`: process P of N of one distributed run (empty: a single process).
    #[serde(rename = "process")]
    Process,
    /// A filesystem path (empty: none).
    #[serde(rename = "path")]
    Path,
    /// A whole number of seconds, at least 1.
    #[serde(rename = "seconds")]
    Seconds,
}

/// Where the flip-bit canary plants its defect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlipAt {
    pub layer: usize,
    pub seam: Seam,
    pub step: usize,
}

/// A parsed setting value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingValue {
    Bool(bool),
    FlipAt(FlipAt),
    Process(memra_runtime::backend::dist::ProcessSpec),
    Path(std::path::PathBuf),
    Seconds(u64),
}

const BOOL01_RULE: &str = "use 1 (on), 0 or empty (off)";

impl SettingFormat {
    pub fn name(self) -> &'static str {
        match self {
            SettingFormat::Bool01 => "bool01",
            SettingFormat::LayerSeamStep => "layer:seam:step",
            SettingFormat::Process => "process",
            SettingFormat::Path => "path",
            SettingFormat::Seconds => "seconds",
        }
    }

    /// Parse `value` of the setting `name`. `Ok(None)` means "empty: use the default".
    pub fn parse(self, name: &str, value: &str) -> Result<Option<SettingValue>, RegistryError> {
        let bad = |rule: String| RegistryError::SettingValue { name: name.to_string(), value: value.to_string(), rule };
        match self {
            SettingFormat::Bool01 => match value {
                "" | "0" => Ok(Some(SettingValue::Bool(false))),
                "1" => Ok(Some(SettingValue::Bool(true))),
                _ => Err(bad(BOOL01_RULE.to_string())),
            },
            SettingFormat::LayerSeamStep => {
                if value.is_empty() {
                    return Ok(None);
                }
                let parts: Vec<&str> = value.split(':').collect();
                let [layer, seam, step] = parts[..] else {
                    return Err(bad("use LAYER:SEAM:STEP, e.g. 0:o_join:3".to_string()));
                };
                let number = |what: &str, s: &str| {
                    s.parse::<usize>()
                        .map_err(|_| bad(format!("{what} {s:?} is not a non-negative integer (LAYER:SEAM:STEP)")))
                };
                let layer = number("LAYER", layer)?;
                let step = number("STEP", step)?;
                let seam = Seam::parse(seam).ok_or_else(|| {
                    let names: Vec<&str> = Seam::LAYER.iter().chain(Seam::HEAD.iter()).map(|s| s.name()).collect();
                    bad(format!("SEAM {seam:?} is unknown; the seams are {}", names.join(", ")))
                })?;
                Ok(Some(SettingValue::FlipAt(FlipAt { layer, seam, step })))
            }
            _ if value.is_empty() => Ok(None),
            SettingFormat::Process => memra_runtime::backend::dist::ProcessSpec::parse(value)
                .map(|p| Some(SettingValue::Process(p)))
                .map_err(&bad),
            SettingFormat::Path => Ok(Some(SettingValue::Path(value.into()))),
            SettingFormat::Seconds => match value.parse::<u64>() {
                Ok(n) if n >= 1 && value.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(SettingValue::Seconds(n))),
                _ => Err(bad("use a whole number of seconds, at least 1".to_string())),
            },
        }
    }
}

/// One of the tool's own `MEMRA_*` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    pub env: String,
    pub format: SettingFormat,
    /// The value when unset, in `format`.
    pub default: String,
    pub meaning: String,
    /// `default`, parsed.
    pub default_value: Option<SettingValue>,
}

/// Env name of the setting that turns GPU skips into failures.
pub const REQUIRE_GPU: &str = "MEMRA_REQUIRE_GPU";
/// Env names of the settings of a run over several processes (`--process`, `--nccl-id-dir`,
/// `--dist-timeout-s`).
pub const PROCESS: &str = "MEMRA_PROCESS";
pub const NCCL_ID_DIR: &str = "MEMRA_NCCL_ID_DIR";
pub const DIST_TIMEOUT_S: &str = "MEMRA_DIST_TIMEOUT_S";
/// Env name of the setting that places the flip-bit canary.
pub const CANARY_FLIP_AT: &str = "MEMRA_CANARY_FLIP_AT";

/// A validated door registry.
#[derive(Debug, Clone, PartialEq)]
pub struct Registry {
    origin: String,
    doors: Vec<Door>,
    settings: Vec<Setting>,
    by_id: BTreeMap<String, usize>,
    by_env: BTreeMap<String, usize>,
}

// ---- raw (file) shapes -------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    schema_version: i64,
    #[serde(default)]
    door: Vec<RawDoor>,
    #[serde(default)]
    setting: Vec<RawSetting>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDoor {
    id: String,
    env: String,
    class: DoorClass,
    default: bool,
    changes: String,
    gate: Gate,
    #[serde(default)]
    gate_why: Option<String>,
    engagement: String,
    seams: Vec<String>,
    tp: RawAllowed<usize>,
    transports: RawAllowed<String>,
    backends: Vec<String>,
    #[serde(default)]
    not_applicable: BTreeMap<String, String>,
    #[serde(default)]
    requires: Vec<RawLink>,
    #[serde(default)]
    conflicts: Vec<RawLink>,
    #[serde(default)]
    error_budget: Option<RawBudget>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAllowed<T> {
    allowed: Vec<T>,
    #[serde(default)]
    why: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    id: String,
    why: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    max_rel_error: f64,
    near_tie_margin: f64,
    #[serde(default)]
    per_seam: BTreeMap<String, f64>,
    why: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSetting {
    env: String,
    format: SettingFormat,
    default: String,
    meaning: String,
}

// ---- loading -----------------------------------------------------------------------------------

fn is_snake(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn is_env_name(s: &str) -> bool {
    s.len() > "MEMRA_".len()
        && s.starts_with("MEMRA_")
        && s.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// Collects the violations of one registry text.
struct Checker<'a> {
    origin: &'a str,
    errors: Vec<RegistryError>,
}

impl Checker<'_> {
    fn fail(&mut self, thing: impl Into<String>, value: impl Into<String>, rule: impl Into<String>) {
        self.errors.push(RegistryError::Invalid {
            origin: self.origin.to_string(),
            thing: thing.into(),
            value: value.into(),
            rule: rule.into(),
        });
    }

    fn text(&mut self, thing: String, value: &str) {
        if value.trim().is_empty() {
            self.fail(thing, format!("{value:?}"), "must say something (a rule or explanation cannot be empty)");
        }
    }
}

impl Registry {
    /// The built-in registry, `gates/doors.toml`.
    pub fn builtin() -> Result<Registry, RegistryError> {
        Registry::from_toml_str(BUILTIN_REGISTRY, "built-in gates/doors.toml")
    }

    /// A registry from a user file (same format).
    pub fn from_path(path: &Path) -> Result<Registry, RegistryError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| RegistryError::Io { path: path.display().to_string(), source })?;
        Registry::from_toml_str(&text, &path.display().to_string())
    }

    /// Parse and validate registry text; `origin` names it in error messages.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Registry, RegistryError> {
        let parse_err = |message: String| RegistryError::Parse {
            origin: origin.to_string(),
            what: format!("door registry (schema_version {SCHEMA_VERSION})"),
            message,
        };
        // The version decides how to read the rest, so check it before any other field.
        let loose: toml::Table = toml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        match loose.get("schema_version") {
            Some(toml::Value::Integer(SCHEMA_VERSION)) => {}
            Some(other) => {
                return Err(RegistryError::SchemaVersion {
                    origin: origin.to_string(),
                    found: other.to_string(),
                    supported: SCHEMA_VERSION,
                })
            }
            None => {
                return Err(RegistryError::SchemaVersion {
                    origin: origin.to_string(),
                    found: "(missing)".to_string(),
                    supported: SCHEMA_VERSION,
                })
            }
        }
        let raw: RawFile = toml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        debug_assert_eq!(raw.schema_version, SCHEMA_VERSION);
        Registry::validate(raw, origin)
    }

    fn validate(raw: RawFile, origin: &str) -> Result<Registry, RegistryError> {
        let mut ck = Checker { origin, errors: Vec::new() };
        if raw.door.is_empty() {
            ck.fail("door", "[]", "a registry declares at least one door");
        }
        let mut doors = Vec::new();
        let mut by_id = BTreeMap::new();
        let mut envs: BTreeMap<String, String> = BTreeMap::new();
        let mut engagements = BTreeSet::new();
        for rd in &raw.door {
            let id = rd.id.clone();
            let at = |field: &str| format!("door {id:?} {field}");
            if !is_snake(&id) {
                ck.fail(at("id"), format!("{id:?}"), "an id is lower snake case: [a-z][a-z0-9_]*");
            }
            if by_id.insert(id.clone(), doors.len()).is_some() {
                ck.fail(at("id"), format!("{id:?}"), "door ids are unique; this id is declared twice");
            }
            if !is_env_name(&rd.env) {
                ck.fail(at("env"), format!("{:?}", rd.env), "an env name is MEMRA_ followed by [A-Z0-9_]+");
            }
            if let Some(prev) = envs.insert(rd.env.clone(), id.clone()) {
                ck.fail(at("env"), format!("{:?}", rd.env), format!("env names are unique; {prev:?} uses it too"));
            }
            ck.text(at("changes"), &rd.changes);
            match rd.engagement.strip_prefix(&format!("{id}.")) {
                Some(what) if is_snake(what) => {}
                _ => ck.fail(
                    at("engagement"),
                    format!("{:?}", rd.engagement),
                    format!("an engagement counter is \"{id}.<what>\" with <what> in lower snake case"),
                ),
            }
            if !engagements.insert(rd.engagement.clone()) {
                ck.fail(at("engagement"), format!("{:?}", rd.engagement), "engagement counters are unique");
            }
            let mut seams = Vec::new();
            for s in &rd.seams {
                match Seam::parse(s) {
                    Some(seam) if !seams.contains(&seam) => seams.push(seam),
                    Some(_) => ck.fail(at("seams"), format!("{s:?}"), "a seam is listed once"),
                    None => ck.fail(at("seams"), format!("{s:?}"), "not a seam name of docs/DESIGN.md §3.2"),
                }
            }
            if seams.is_empty() {
                ck.fail(at("seams"), "[]", "a door touches at least one seam (engagement is checked there)");
            }
            // TP sizes.
            let mut tp = Vec::new();
            for &t in &rd.tp.allowed {
                if !TP_SIZES.contains(&t) {
                    ck.fail(at("tp"), t.to_string(), "TP must be 1, 2, 4 or 8");
                } else if tp.contains(&t) {
                    ck.fail(at("tp"), t.to_string(), "a TP size is listed once");
                } else {
                    tp.push(t);
                }
            }
            tp.sort_unstable();
            check_allowed(&mut ck, at("tp"), tp.len(), TP_SIZES.len(), &rd.tp.why);
            // Transports.
            let mut transports = Vec::new();
            for name in &rd.transports.allowed {
                match Transport::ALL.into_iter().find(|t| t.name() == name) {
                    Some(t) if !transports.contains(&t) => transports.push(t),
                    Some(_) => ck.fail(at("transports"), format!("{name:?}"), "a transport is listed once"),
                    None => ck.fail(
                        at("transports"),
                        format!("{name:?}"),
                        "the transports are host-bounce, native-p2p, nccl",
                    ),
                }
            }
            transports.sort_unstable();
            check_allowed(&mut ck, at("transports"), transports.len(), Transport::ALL.len(), &rd.transports.why);
            // Backends and not-applicable reasons.
            let mut backends = Vec::new();
            for name in &rd.backends {
                match BackendKind::parse(name) {
                    Some(b) if !backends.contains(&b) => backends.push(b),
                    Some(_) => ck.fail(at("backends"), format!("{name:?}"), "a backend is listed once"),
                    None => ck.fail(at("backends"), format!("{name:?}"), "the backends are host, cuda"),
                }
            }
            backends.sort_unstable();
            if backends.is_empty() {
                ck.fail(at("backends"), "[]", "a door runs on at least one backend");
            }
            let mut not_applicable = BTreeMap::new();
            for (name, reason) in &rd.not_applicable {
                match BackendKind::parse(name) {
                    Some(b) if backends.contains(&b) => ck.fail(
                        at("not_applicable"),
                        format!("{name:?}"),
                        "a backend is either in `backends` or not applicable, not both",
                    ),
                    Some(b) => {
                        ck.text(at(&format!("not_applicable.{name}")), reason);
                        not_applicable.insert(b, reason.clone());
                    }
                    None => ck.fail(at("not_applicable"), format!("{name:?}"), "the backends are host, cuda"),
                }
            }
            for b in BackendKind::ALL {
                if !backends.contains(&b) && !not_applicable.contains_key(&b) {
                    ck.fail(
                        at("backends"),
                        format!("{:?}", b.name()),
                        "every backend is in `backends` or has a reason in `not_applicable`",
                    );
                }
            }
            // Class, gate, budget.
            let class_gate_ok = match rd.class {
                DoorClass::BitIdentical | DoorClass::ValueIdentical | DoorClass::SchedulingOnly | DoorClass::Canary => {
                    rd.gate == Gate::Identity
                }
                DoorClass::Numeric => rd.gate != Gate::Identity,
            };
            if !class_gate_ok {
                ck.fail(
                    at("gate"),
                    format!("{:?}", rd.gate.name()),
                    format!(
                        "class {} is promoted by {}",
                        rd.class.name(),
                        if rd.class == DoorClass::Numeric {
                            "argmax_tape+class_identity+error_budget (or argmax_tape+error_budget with a gate_why)"
                        } else {
                            "identity"
                        }
                    ),
                );
            }
            match (&rd.gate_why, rd.gate) {
                (None, Gate::ArgmaxTapeErrorBudget) => ck.fail(
                    at("gate_why"),
                    "(missing)",
                    "a NUMERIC-CLASS door without class identity must say why (gate_why)",
                ),
                (Some(w), _) => ck.text(at("gate_why"), w),
                (None, _) => {}
            }
            if rd.gate.has_class_identity() && !(tp.contains(&1) && transports.contains(&Transport::HostBounce)) {
                ck.fail(
                    at("tp/transports"),
                    format!("{:?} / {:?}", rd.tp.allowed, rd.transports.allowed),
                    "a class-identity gate compares with the door's own TP1 host-bounce run, so TP1 and host-bounce must be allowed",
                );
            }
            let error_budget = match (&rd.error_budget, rd.class) {
                (Some(b), DoorClass::Numeric) => Some(check_budget(&mut ck, &at("error_budget"), b)),
                (None, DoorClass::Numeric) => {
                    ck.fail(at("error_budget"), "(missing)", "a NUMERIC-CLASS door declares its error budget");
                    None
                }
                (Some(_), class) => {
                    ck.fail(
                        at("error_budget"),
                        "(present)",
                        format!("only NUMERIC-CLASS doors have an error budget; this door is {}", class.name()),
                    );
                    None
                }
                (None, _) => None,
            };
            if rd.class == DoorClass::Canary && rd.default {
                ck.fail(at("default"), "true", "a canary is a planted defect and is never on by default");
            }
            let links = |ck: &mut Checker, field: &str, raw: &[RawLink]| {
                let mut out: Vec<Link> = Vec::new();
                for l in raw {
                    ck.text(at(&format!("{field} {:?} why", l.id)), &l.why);
                    if l.id == id {
                        ck.fail(at(field), format!("{:?}", l.id), "a door cannot name itself");
                    } else if out.iter().any(|o| o.id == l.id) {
                        ck.fail(at(field), format!("{:?}", l.id), "each door is named once");
                    } else {
                        out.push(Link { id: l.id.clone(), why: l.why.clone() });
                    }
                }
                out
            };
            let requires = links(&mut ck, "requires", &rd.requires);
            let conflicts = links(&mut ck, "conflicts", &rd.conflicts);
            doors.push(Door {
                id: id.clone(),
                env: rd.env.clone(),
                class: rd.class,
                default: rd.default,
                changes: rd.changes.clone(),
                gate: rd.gate,
                gate_why: rd.gate_why.clone(),
                engagement: rd.engagement.clone(),
                seams,
                tp: Allowed { allowed: tp, why: rd.tp.why.clone() },
                transports: Allowed { allowed: transports, why: rd.transports.why.clone() },
                backends,
                not_applicable,
                requires,
                conflicts,
                error_budget,
            });
        }
        // Settings.
        let mut settings = Vec::new();
        for rs in &raw.setting {
            let at = |field: &str| format!("setting {:?} {field}", rs.env);
            if !is_env_name(&rs.env) {
                ck.fail(at("env"), format!("{:?}", rs.env), "an env name is MEMRA_ followed by [A-Z0-9_]+");
            }
            if let Some(prev) = envs.insert(rs.env.clone(), format!("setting {}", rs.env)) {
                ck.fail(at("env"), format!("{:?}", rs.env), format!("env names are unique; {prev:?} uses it too"));
            }
            ck.text(at("meaning"), &rs.meaning);
            let default_value = match rs.format.parse(&rs.env, &rs.default) {
                Ok(v) => v,
                Err(e) => {
                    ck.fail(
                        at("default"),
                        format!("{:?}", rs.default),
                        format!("must parse as {}: {e}", rs.format.name()),
                    );
                    None
                }
            };
            settings.push(Setting {
                env: rs.env.clone(),
                format: rs.format,
                default: rs.default.clone(),
                meaning: rs.meaning.clone(),
                default_value,
            });
        }
        RegistryError::collect(std::mem::take(&mut ck.errors))?;

        // Cross-door rules, now that every id is known.
        let known: Vec<&str> = doors.iter().map(|d| d.id.as_str()).collect();
        for d in &doors {
            for (field, list) in [("requires", &d.requires), ("conflicts", &d.conflicts)] {
                for l in list {
                    if !by_id.contains_key(&l.id) {
                        ck.errors.push(RegistryError::UnknownName {
                            name: format!("door {:?} {field} {:?}", d.id, l.id),
                            kind: "door id".to_string(),
                            rule: format!("{origin}: requires and conflicts name doors of this registry"),
                            suggestion: crate::env::nearest(&l.id, known.iter().copied()).map(str::to_string),
                        });
                    }
                }
            }
        }
        RegistryError::collect(std::mem::take(&mut ck.errors))?;

        // Conflicts hold both ways: add the mirror of every declared edge.
        let declared: Vec<(usize, Link)> =
            doors.iter().enumerate().flat_map(|(i, d)| d.conflicts.iter().map(move |l| (i, l.clone()))).collect();
        for (i, link) in declared {
            let j = by_id[&link.id];
            let mirror_id = doors[i].id.clone();
            if doors[j].conflict(&mirror_id).is_none() {
                doors[j].conflicts.push(Link { id: mirror_id, why: link.why });
            }
        }

        let mut by_env = BTreeMap::new();
        for (i, d) in doors.iter().enumerate() {
            by_env.insert(d.env.clone(), i);
        }
        let registry = Registry { origin: origin.to_string(), doors, settings, by_id, by_env };
        registry.check_graph(&mut ck);
        RegistryError::collect(ck.errors)?;
        Ok(registry)
    }

    /// Requirement cycles, unreachable doors and restrictions wider than a requirement's.
    fn check_graph(&self, ck: &mut Checker) {
        for d in &self.doors {
            let at = |field: &str| format!("door {:?} {field}", d.id);
            // Cycle: d reachable from its own requirements.
            let mut seen = BTreeSet::new();
            let mut stack: Vec<&str> = d.requires.iter().map(|l| l.id.as_str()).collect();
            while let Some(x) = stack.pop() {
                if x == d.id {
                    ck.fail(at("requires"), format!("{:?}", d.id), "requires must not form a cycle");
                    break;
                }
                if seen.insert(x) {
                    stack.extend(self.doors[self.by_id[x]].requires.iter().map(|l| l.id.as_str()));
                }
            }
            if seen.contains(d.id.as_str()) {
                continue;
            }
            for l in &d.requires {
                let r = &self.doors[self.by_id[&l.id]];
                for t in &d.tp.allowed {
                    if !r.tp.contains(t) {
                        ck.fail(
                            at("tp"),
                            t.to_string(),
                            format!("{} requires {}, which does not allow TP{t}", d.id, r.id),
                        );
                    }
                }
                for t in &d.transports.allowed {
                    if !r.transports.contains(t) {
                        ck.fail(
                            at("transports"),
                            t.name(),
                            format!("{} requires {}, which does not allow {}", d.id, r.id, t.name()),
                        );
                    }
                }
                for b in &d.backends {
                    if !r.backends.contains(b) {
                        ck.fail(
                            at("backends"),
                            b.name(),
                            format!("{} requires {}, which is not applicable on {}", d.id, r.id, b.name()),
                        );
                    }
                }
            }
            let closure = self.closure_of([d.id.as_str()]);
            for a in &closure {
                for b in &closure {
                    if a < b && self.door(a).and_then(|x| x.conflict(b)).is_some() {
                        ck.fail(
                            at("requires"),
                            format!("{closure:?}"),
                            format!("{} needs both {a} and {b}, which conflict, so it can never run", d.id),
                        );
                    }
                }
            }
        }
    }

    // ---- queries ---------------------------------------------------------------------------------

    /// Where this registry came from (for messages).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Every door, in file order.
    pub fn doors(&self) -> &[Door] {
        &self.doors
    }

    pub fn settings(&self) -> &[Setting] {
        &self.settings
    }

    /// The door with this id.
    pub fn door(&self, id: &str) -> Option<&Door> {
        self.by_id.get(id).map(|&i| &self.doors[i])
    }

    /// The door whose environment variable is `name` (exact, case-sensitive).
    pub fn by_env(&self, name: &str) -> Option<&Door> {
        self.by_env.get(name).map(|&i| &self.doors[i])
    }

    /// The setting whose environment variable is `name`.
    pub fn setting(&self, name: &str) -> Option<&Setting> {
        self.settings.iter().find(|s| s.env == name)
    }

    /// Every environment variable name the registry declares (doors and settings), sorted.
    pub fn env_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> =
            self.doors.iter().map(|d| d.env.as_str()).chain(self.settings.iter().map(|s| s.env.as_str())).collect();
        v.sort_unstable();
        v
    }

    /// Every door id, sorted.
    pub fn ids(&self) -> Vec<&str> {
        self.by_id.keys().map(String::as_str).collect()
    }

    /// The doors on when nothing is set explicitly.
    pub fn defaults(&self) -> BTreeSet<String> {
        self.doors.iter().filter(|d| d.default).map(|d| d.id.clone()).collect()
    }

    /// `ids` plus everything they require, transitively. Unknown ids are kept as they are.
    pub fn closure_of<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut stack: Vec<String> = ids.into_iter().map(str::to_string).collect();
        while let Some(x) = stack.pop() {
            if let Some(d) = self.door(&x) {
                stack.extend(d.requires.iter().filter(|l| !out.contains(&l.id)).map(|l| l.id.clone()));
            }
            out.insert(x);
        }
        out
    }

    // ---- mapping onto the runtime --------------------------------------------------------------

    /// The runtime's explicit door values for a set of enabled door ids. `flip_at` places the
    /// flip-bit canary; `None` takes the registry's `MEMRA_CANARY_FLIP_AT` default. Every id must
    /// map to a runtime field or canary, and at most one canary may be enabled: nothing is
    /// silently ignored.
    /// `enabled` is any borrowed collection of ids: `&BTreeSet<String>`, `&[&str]`, `&Vec<String>`.
    pub fn to_door_set<'a, C>(&self, enabled: &'a C, flip_at: Option<FlipAt>) -> Result<DoorSet, RegistryError>
    where
        C: ?Sized,
        &'a C: IntoIterator,
        <&'a C as IntoIterator>::Item: AsRef<str>,
    {
        let enabled: BTreeSet<String> = enabled.into_iter().map(|s| s.as_ref().to_string()).collect();
        let mut ds = DoorSet::default();
        let mut canaries = Vec::new();
        for id in &enabled {
            let id = id.as_str();
            let Some(door) = self.door(id) else {
                return Err(RegistryError::UnknownName {
                    name: format!("door id {id:?}"),
                    kind: "door".to_string(),
                    rule: format!("enabled doors must be declared in {}", self.origin),
                    suggestion: crate::env::nearest(id, self.ids()).map(str::to_string),
                });
            };
            if door.is_canary() {
                let at = flip_at.or_else(|| self.default_flip_at());
                let canary = canary_of(id, at).ok_or_else(|| RegistryError::NoRuntimeField {
                    id: id.to_string(),
                    rule: "the runtime's canaries are canary_flip_bit, canary_reverse_kblocks, canary_stale_buffer, canary_skip_fence (and canary_flip_bit needs MEMRA_CANARY_FLIP_AT or its default)".to_string(),
                })?;
                canaries.push((id, canary));
            } else {
                let field = runtime_flag(&mut ds, id).ok_or_else(|| RegistryError::NoRuntimeField {
                    id: id.to_string(),
                    rule: "every non-canary door id must name a field of memra_runtime::config::DoorSet".to_string(),
                })?;
                *field = true;
            }
        }
        match canaries[..] {
            [] => {}
            [(_, c)] => ds.canary = Some(c),
            _ => {
                let ids: Vec<&str> = canaries.iter().map(|(id, _)| *id).collect();
                return Err(RegistryError::Request(format!(
                    "canaries {} are enabled together (rule: a run carries one planted defect at a time, so a selftest failure is attributable to it)",
                    ids.join(" and ")
                )));
            }
        }
        Ok(ds)
    }

    /// The door ids a runtime [`DoorSet`] has enabled (inverse of [`Registry::to_door_set`]).
    pub fn ids_of(&self, ds: &DoorSet) -> BTreeSet<String> {
        let mut out: BTreeSet<String> =
            door_set_fields(ds).into_iter().filter(|(_, on)| *on).map(|(id, _)| id.to_string()).collect();
        if let Some(c) = &ds.canary {
            out.insert(canary_id(c).to_string());
        }
        out
    }

    /// The registry default of `MEMRA_CANARY_FLIP_AT`, if declared.
    pub fn default_flip_at(&self) -> Option<FlipAt> {
        match self.setting(CANARY_FLIP_AT)?.default_value.as_ref()? {
            SettingValue::FlipAt(at) => Some(*at),
            _ => None,
        }
    }
}

fn check_allowed(ck: &mut Checker, thing: String, n: usize, all: usize, why: &Option<String>) {
    if n == 0 {
        ck.fail(thing.clone(), "[]", "at least one value must be allowed");
    }
    match why {
        Some(w) => ck.text(format!("{thing} why"), w),
        None if n < all => ck.fail(format!("{thing} why"), "(missing)", "leaving a value out needs a `why`"),
        None => {}
    }
}

fn check_budget(ck: &mut Checker, at: &str, b: &RawBudget) -> ErrorBudget {
    fn positive(ck: &mut Checker, thing: String, v: f64) {
        if !(v.is_finite() && v > 0.0) {
            ck.fail(thing, v.to_string(), "must be finite and > 0");
        }
    }
    positive(ck, format!("{at}.max_rel_error"), b.max_rel_error);
    positive(ck, format!("{at}.near_tie_margin"), b.near_tie_margin);
    let mut per_seam = BTreeMap::new();
    for (name, &v) in &b.per_seam {
        positive(ck, format!("{at}.per_seam.{name}"), v);
        match Seam::parse(name) {
            Some(s) => {
                per_seam.insert(s, v);
            }
            None => ck.fail(format!("{at}.per_seam"), format!("{name:?}"), "not a seam name of docs/DESIGN.md §3.2"),
        }
    }
    ck.text(format!("{at}.why"), &b.why);
    ErrorBudget { max_rel_error: b.max_rel_error, near_tie_margin: b.near_tie_margin, per_seam, why: b.why.clone() }
}

/// The runtime field a non-canary door id switches on. Door ids are the field names.
fn runtime_flag<'a>(ds: &'a mut DoorSet, id: &str) -> Option<&'a mut bool> {
    Some(match id {
        "bulk_p2p" => &mut ds.bulk_p2p,
        "oproj_direct" => &mut ds.oproj_direct,
        "oproj_tail" => &mut ds.oproj_tail,
        "moe_direct" => &mut ds.moe_direct,
        "routes_prestage" => &mut ds.routes_prestage,
        "fence_memops" => &mut ds.fence_memops,
        "rank0_merge" => &mut ds.rank0_merge,
        "graph" => &mut ds.graph,
        "f32_mirror" => &mut ds.f32_mirror,
        "step_ep" => &mut ds.step_ep,
        "qkv_fused" => &mut ds.qkv_fused,
        "dev_router" => &mut ds.dev_router,
        "w8" => &mut ds.w8,
        "nvfp4_ep2" => &mut ds.nvfp4_ep2,
        "nccl_allreduce" => &mut ds.nccl_allreduce,
        _ => return None,
    })
}

/// Every boolean door field of a runtime [`DoorSet`], by name (= door id). The destructuring
/// names every field, so a door added to the runtime fails to compile here until it is mapped.
pub fn door_set_fields(ds: &DoorSet) -> [(&'static str, bool); 15] {
    let DoorSet {
        bulk_p2p,
        oproj_direct,
        oproj_tail,
        moe_direct,
        routes_prestage,
        fence_memops,
        rank0_merge,
        graph,
        f32_mirror,
        step_ep,
        qkv_fused,
        dev_router,
        w8,
        nvfp4_ep2,
        nccl_allreduce,
        canary: _,
    } = *ds;
    [
        ("bulk_p2p", bulk_p2p),
        ("oproj_direct", oproj_direct),
        ("oproj_tail", oproj_tail),
        ("moe_direct", moe_direct),
        ("routes_prestage", routes_prestage),
        ("fence_memops", fence_memops),
        ("rank0_merge", rank0_merge),
        ("graph", graph),
        ("f32_mirror", f32_mirror),
        ("step_ep", step_ep),
        ("qkv_fused", qkv_fused),
        ("dev_router", dev_router),
        ("w8", w8),
        ("nvfp4_ep2", nvfp4_ep2),
        ("nccl_allreduce", nccl_allreduce),
    ]
}

/// The registry id of a runtime canary (exhaustive: a new runtime canary fails to compile here).
pub fn canary_id(c: &Canary) -> &'static str {
    match c {
        Canary::FlipBit { .. } => "canary_flip_bit",
        Canary::ReverseKBlocks => "canary_reverse_kblocks",
        Canary::StaleBuffer => "canary_stale_buffer",
        Canary::SkipFence => "canary_skip_fence",
    }
}

fn canary_of(id: &str, flip_at: Option<FlipAt>) -> Option<Canary> {
    match id {
        "canary_flip_bit" => flip_at.map(|a| Canary::FlipBit { layer: a.layer, seam: a.seam, step: a.step }),
        "canary_reverse_kblocks" => Some(Canary::ReverseKBlocks),
        "canary_stale_buffer" => Some(Canary::StaleBuffer),
        "canary_skip_fence" => Some(Canary::SkipFence),
        _ => None,
    }
}
