//! A job: one configuration of the matrix (door set × TP × transport × backend), resolved
//! against the registry into what the runner needs — the runtime's door values, the class of
//! gate, the engagement counters, the class baseline — so that running and gating never read the
//! registry again (`crate::plan` resolves; `crate::suite` runs).

use crate::registry::census::CensusChange;
use memra_receipts::Verdict;
use memra_runtime::backend::BackendKind;
use memra_runtime::{DoorSet, PassShape, Transport};
use std::collections::BTreeMap;

/// What one enabled door must change in the census (`crate::registry::census`), and the door
/// values of the same configuration with that door off (and the doors of the set that require
/// it, which cannot run without it).
#[derive(Debug, Clone, PartialEq)]
pub struct CensusDecl {
    pub door: String,
    pub changes: Vec<CensusChange>,
    pub off: DoorSet,
    /// The same door values as the environment names them (what an external subject is told).
    pub off_vars: BTreeMap<String, bool>,
    /// The door's class when it and every door switched off with it claim to change no number
    /// (BIT-IDENTICAL, VALUE-IDENTICAL, SCHEDULING-ONLY): then this run must equal the run with
    /// them off bit for bit — checked in NUMERIC jobs, where identity with the oracle is not.
    pub identity: Option<&'static str>,
}

/// What the gate of a job is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JobClass {
    /// BIT / VALUE / SCHEDULING doors (and the baseline): identity with the reference.
    Identity,
    /// NUMERIC-CLASS: argmax tape (teacher forced), class identity (unless the door's gate has
    /// none, e.g. NCCL's all-reduce whose order depends on the rank count), error budget.
    Numeric { margin_budget: f32, rel_budget: f64, class_identity: bool },
    /// A planted defect: identity is expected to FAIL (selftest checks that it does).
    Canary,
}

/// One resolved configuration.
#[derive(Debug, Clone)]
pub struct Job {
    /// The subject that runs it (`evidence.config.subject`): `memra-runtime`, or an external
    /// subject's manifest name.
    pub subject: String,
    /// Explicit door settings as receipts record them (env name → on).
    pub doors_env: BTreeMap<String, bool>,
    pub doors: DoorSet,
    pub class: JobClass,
    /// Door id → its call-site counter (reported, decides nothing).
    pub engagement: BTreeMap<String, String>,
    /// Per enabled door, the census change that witnesses its engagement.
    pub census: Vec<CensusDecl>,
    pub tp: usize,
    pub transport: Transport,
    pub backend: BackendKind,
    /// TP size of the class baseline of a NUMERIC-CLASS job (the smallest TP its doors allow).
    pub baseline_tp: usize,
    /// Transport of the class baseline (host-bounce unless the doors do not allow it).
    pub baseline_transport: Transport,
    /// When set, the job is NOT-APPLICABLE (or SKIP) for this reason and does not run.
    pub not_run: Option<(Verdict, String)>,
    /// A CANARY planted in a door set with a NUMERIC door (canary_down8_slot_order under
    /// NVFP4_EP2): those doors leave the oracle's numbers by design, so the identity reference is
    /// the same configuration with the canary off (its census baseline), and a failure is the
    /// canary's alone.
    pub canary_held_to_doors: bool,
    /// Rows or columns per pass (docs/DESIGN.md §3.6). Every reference the job is compared with
    /// (the oracle, the CUDA TP1 record, the class baseline) runs one token of one session per
    /// pass: that comparison is the batch-invariance and verify = decode gate.
    pub pass: PassShape,
}

impl Job {
    /// Whether this run is its own class baseline (the door set's fresh tape).
    pub fn is_class_baseline(&self) -> bool {
        self.tp == self.baseline_tp && self.transport == self.baseline_transport && self.pass == PassShape::SINGLE
    }
}
