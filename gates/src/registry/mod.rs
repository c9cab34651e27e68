//! The door registry: one data file (`gates/doors.toml`) says everything about every door, so
//! the enumerator, the edge parsers, the gates and the promotion report all read the same facts
//! and nothing about a door lives only in a comment (docs/DESIGN.md §4.1).
//!
//! - this module: the validated types ([`Registry`], [`Door`], …) and their queries;
//! - [`file`](mod@file): the file format (`schema_version = 2`), documented there with an example, its
//!   reader and the one writer of the file (the defaults block that `promote` updates);
//! - `validate`: the rules a registry must satisfy;
//! - [`census`]: a door's declared census change and its evaluation;
//! - `settings`: the tool's own `MEMRA_*` settings;
//! - `door_set`: the mapping onto the runtime's explicit [`DoorSet`](memra_runtime::DoorSet);
//! - [`view`]: `memra-gates doors` (table and JSON).

pub mod census;
mod door_set;
mod error;
pub mod file;
mod settings;
mod validate;
pub mod view;

use std::collections::{BTreeMap, BTreeSet};

use memra_runtime::config::Transport;
use memra_runtime::record::Seam;
use serde::Deserialize;

pub use door_set::{canary_id, door_set_fields};
pub use error::RegistryError;
pub use file::{BUILTIN_REGISTRY, SCHEMA_VERSION};
pub use memra_kernels::grid::TP_SIZES;
pub use memra_runtime::backend::BackendKind;
pub use settings::{
    FlipAt, Setting, SettingFormat, SettingValue, CANARY_FLIP_AT, DIST_TIMEOUT_S, HOST_CLOCK, NCCL_ID_DIR, PROCESS,
    REQUIRE_GPU, SUBJECT_BACKEND, SUBJECT_BATTERY, SUBJECT_MODEL, SUBJECT_PROTOCOL, SUBJECT_TAPE, SUBJECT_TP,
    SUBJECT_TRANSPORT,
};

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
pub enum DoorGate {
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

impl DoorGate {
    pub fn name(self) -> &'static str {
        match self {
            DoorGate::Identity => "identity",
            DoorGate::ArgmaxTapeClassIdentityErrorBudget => "argmax_tape+class_identity+error_budget",
            DoorGate::ArgmaxTapeErrorBudget => "argmax_tape+error_budget",
        }
    }
    /// Whether the gate compares every run with the door's own TP1 host-bounce class baseline.
    pub fn has_class_identity(self) -> bool {
        matches!(self, DoorGate::ArgmaxTapeClassIdentityErrorBudget)
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
    pub gate: DoorGate,
    pub gate_why: Option<String>,
    pub engagement: String,
    /// The census changes the door must cause against the same configuration with it off.
    pub census: Vec<census::CensusChange>,
    pub seams: Vec<Seam>,
    pub tp: Allowed<usize>,
    pub transports: Allowed<Transport>,
    pub backends: Vec<BackendKind>,
    pub not_applicable: BTreeMap<BackendKind, String>,
    pub requires: Vec<Link>,
    /// Declared in either direction in the file; holds both ways here.
    pub conflicts: Vec<Link>,
    pub error_budget: Option<ErrorBudget>,
    /// What the door saves when its purpose is not speed (docs/DESIGN.md §7): promotion asks
    /// that saving to repeat instead of a faster step.
    pub benefit: Option<census::Benefit>,
    /// The pass shapes where the mechanism has work ([`PASS_SHAPES`] labels; default all).
    pub passes: Allowed<String>,
    /// Whether the entry declares `passes`: a door of the multi-token paths
    /// (docs/DESIGN.md §3.6), which `--matrix all` crosses only with such doors and what they need.
    pub pass_door: bool,
}

/// Every pass shape a door may allow, by label: single-token decode, rows, columns.
pub const PASS_SHAPES: [&str; 7] = ["single", "b2", "b4", "b8", "t2", "t4", "t8"];

/// The registry label of a pass shape (`single`, `b4`, `t2`).
pub fn pass_label(shape: memra_runtime::PassShape) -> String {
    if shape.lanes() == 1 {
        "single".into()
    } else {
        shape.label()
    }
}

impl Door {
    pub fn is_canary(&self) -> bool {
        self.class == DoorClass::Canary
    }
    /// Why the door has nothing to do in passes of `shape`, or `None` when it has.
    pub fn not_at_pass(&self, shape: memra_runtime::PassShape) -> Option<String> {
        let label = pass_label(shape);
        (!self.passes.contains(&label)).then(|| {
            format!(
                "{} at {label}: {}",
                self.id,
                self.passes.why.clone().unwrap_or_else(|| format!("it allows {}", self.passes.allowed.join(", ")))
            )
        })
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

/// A validated door registry.
#[derive(Debug, Clone, PartialEq)]
pub struct Registry {
    origin: String,
    doors: Vec<Door>,
    settings: Vec<Setting>,
    by_id: BTreeMap<String, usize>,
    by_env: BTreeMap<String, usize>,
}

impl Registry {
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
}
