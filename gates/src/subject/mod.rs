//! Subjects: what produces the records the gates judge (docs/DESIGN.md §10). The built-in runtime
//! runs in this process ([`Builtin`]); an engine that cannot be linked in runs as a child process
//! that speaks the subject protocol ([`External`], format and rules in [`protocol`]). The suite
//! holds a `&dyn` [`Subject`] and never asks which one produced a record, so every gate, receipt,
//! diff, plot and promotion works the same for both.
//!
//! The oracle is never a foreign subject: it is the canonical program of the built-in runtime
//! (host, TP1, host-bounce, doors at default), run in this process whatever is under test.

mod builtin;
mod external;
pub mod protocol;

pub use builtin::{Builtin, HostRankPolicy, BUILTIN_NAME, BUILTIN_VERSION};
pub use external::External;

use memra_receipts::schema::Verdict;
use memra_runtime::backend::BackendKind;
use memra_runtime::record::{CaptureKey, Record};
use memra_runtime::{DoorSet, ExpertFormat, PassShape, RuntimeError, Timing, Transport};
use std::collections::BTreeMap;

/// One configuration of a run: where, how wide, over what, with which doors and expert format, in
/// passes of which shape;
/// teacher-forced by a record's tokens when given; with full captures of `capture`.
#[derive(Debug, Clone)]
pub struct RunSpec<'r> {
    pub backend: BackendKind,
    pub tp: usize,
    pub transport: Transport,
    /// The built-in runtime's explicit door values.
    pub doors: DoorSet,
    /// The same doors as the environment names them (`MEMRA_X` → on): what an external subject
    /// is told. Doors not listed are off.
    pub door_vars: BTreeMap<String, bool>,
    pub format: ExpertFormat,
    pub forced: Option<&'r Record>,
    pub capture: Vec<CaptureKey>,
    /// Rows or columns per pass (docs/DESIGN.md §3.6); every reference runs single-token.
    pub pass: PassShape,
    /// Which device timing marks the built-in runtime records. A receipt's latency table comes
    /// from the job's first gated run alone, so the runs whose timings nobody reads (the
    /// determinism re-run, census and class baselines) run without marks: a mark is an event
    /// record on every rank per seam and a read-back per mark (docs/DESIGN.md §3.2, §4.2).
    /// Timing is not evidence, so the records compare the same. An external subject is asked for
    /// the same run either way (its timings are optional in the protocol).
    pub timing: Timing,
}

impl RunSpec<'_> {
    /// TP1, host-bounce, every door at default, on `backend`: the oracle's configuration.
    pub fn oracle(backend: BackendKind, format: ExpertFormat) -> RunSpec<'static> {
        RunSpec {
            backend,
            tp: 1,
            transport: Transport::HostBounce,
            doors: DoorSet::default(),
            door_vars: BTreeMap::new(),
            format,
            forced: None,
            capture: Vec::new(),
            pass: PassShape::SINGLE,
            timing: Timing::Seams,
        }
    }
}

/// Why a subject produced no record for a run: the built-in runtime's error, or what went wrong
/// with an external subject (it crashed, hung, wrote a tape that breaks the protocol, or claimed
/// an engagement its census does not back), with the verdict the receipt takes.
#[derive(Debug, Clone, PartialEq)]
pub enum SubjectError {
    /// The built-in runtime could not complete the run (ERROR).
    Runtime(String),
    /// An external subject's run that yields no evidence: ERROR (crash, time limit, malformed
    /// tape, a reported error) or VOID (an engagement claim its census does not back).
    Failed { verdict: Verdict, reason: String },
}

impl SubjectError {
    /// The verdict of a run that ended this way (ERROR or VOID; never PASS).
    pub fn verdict(&self) -> Verdict {
        match self {
            SubjectError::Runtime(_) => Verdict::Error,
            SubjectError::Failed { verdict, .. } => *verdict,
        }
    }

    /// The reason a receipt quotes.
    pub fn reason(&self) -> &str {
        match self {
            SubjectError::Runtime(r) | SubjectError::Failed { reason: r, .. } => r,
        }
    }
}

impl std::fmt::Display for SubjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl From<RuntimeError> for SubjectError {
    fn from(e: RuntimeError) -> Self {
        SubjectError::Runtime(e.to_string())
    }
}

/// What produces records: one configuration in, one [`Record`] (or the reason there is none) out.
pub trait Subject: Sync {
    /// The name receipts carry as `evidence.config.subject` (part of the run identity).
    fn name(&self) -> &str;
    /// The version receipts carry as `evidence.build.subject_version` (not part of the identity).
    fn version(&self) -> &str;
    /// Whether the subject claims the canonical program's bits: then its CUDA runs also carry the
    /// device-host gate (its CUDA TP1 record equals the host oracle). A NUMERIC-class subject
    /// makes no such claim; its runs are held to the oracle by the NUMERIC gates instead.
    fn exact(&self) -> bool;
    /// Who counts the census of a run on `backend` (`memra_receipts::schema::Evidence::census_witness`):
    /// `None` when memra-gates' own backend counts it in this process (the built-in runtime);
    /// `Some("self-reported")` when only the subject's own tape says it (the default: a subject
    /// outside this process); a subject whose runs an outside witness counts returns
    /// `Some("outside:<witness>")`.
    fn census_witness(&self, backend: memra_runtime::backend::BackendKind) -> Option<String> {
        let _ = backend;
        Some(memra_receipts::schema::CENSUS_SELF_REPORTED.to_string())
    }
    /// Run one configuration.
    fn run(&self, spec: RunSpec) -> Result<Record, SubjectError>;
    /// [`Subject::run`], with `uploading(true)` / `uploading(false)` around any time spent placing
    /// weights, so the suite can say where a job's time went (docs/DESIGN.md §8). A subject that
    /// does not upload separately from running (an external engine) keeps the default.
    fn run_observed(&self, spec: RunSpec, uploading: &dyn Fn(bool)) -> Result<Record, SubjectError> {
        let _ = uploading;
        self.run(spec)
    }
}
