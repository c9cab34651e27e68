//! The receipt format, schema version 1: the one place that defines what a receipt file contains.
//!
//! A receipt is the durable evidence of one run (one configuration of subject, backend, TP size,
//! transport and doors, checked against the oracle). Nightly CI, `memra-gates diff`, the plots and
//! `memra-gates promote` all read receipts written months earlier by other builds, so the format is
//! defined here once, versioned, published as a JSON Schema (`receipts/schema/receipt-v1.schema.json`,
//! `receipts/schema/summary-v1.schema.json`) and read strictly: unknown fields, missing fields and
//! unknown schema versions are errors, never guesses.
//!
//! # Shape
//!
//! ```text
//! Receipt                      one file per run: <dir>/run-<run_id>.json
//! ├─ schema_version            always 1 for this module; readers check it before anything else
//! ├─ kind                      "run" | "performance"
//! ├─ run_id                    run_id(&evidence.config): 16 hex digits, pairs runs across receipt sets
//! ├─ evidence                  DETERMINISTIC: the same configuration on the same build gives
//! │  │                         byte-identical evidence (no clocks, no host names, no timings)
//! │  ├─ config                 what was asked for (the input of run_id)
//! │  ├─ build                  what numerics were compiled (kernel digest, NVRTC options)
//! │  ├─ verdict, reason        PASS | FAIL | VOID | SKIP | NOT-APPLICABLE | ERROR, and why
//! │  ├─ gates                  one verdict per gate that ran
//! │  ├─ engaged                engagement counters ("<door_id>.<what>" → count, as named in doors.toml)
//! │  ├─ first_divergence       where the run first differed from its reference, if it did
//! │  ├─ digests                layer × seam × token digest table
//! │  ├─ tokens, token_tape_digest
//! │  ├─ error_budget, near_ties   NUMERIC-CLASS evidence
//! │  └─ performance            only in "performance" receipts
//! └─ measurements              VOLATILE: latencies per layer × seam, wall time, host, device, P2P probe
//! ```
//!
//! A matrix run also writes one [`Summary`] (`<dir>/summary.json`, kind `"summary"`).
//!
//! # Conventions
//!
//! - Digests and bit patterns are lowercase hex strings: seam digests and `token_tape_digest` are
//!   exactly 16 digits (a `u64`, see [`digest_hex`]); model, battery and kernel digests are any
//!   non-empty even number of digits (e.g. SHA-256); element bit patterns are `"0x"` + 8 digits
//!   (an `f32`'s `to_bits()`, see [`f32_bits_hex`]).
//! - Every field is always present; an absent optional value is `null`, an empty list is `[]`.
//! - Indices (`prompt`, `step`, `layer`, `rank`) count from 0. `step` is the index in the prompt's
//!   token tape (the n-th generated token), in the digest table, the first divergence and near-ties.
//! - Digest columns are named `L<layer>.<seam>` (see [`seam_column`]); seams after the last layer
//!   (final norm, lm_head) may use `head.<seam>`.
//! - Floats are finite (the canonical writer refuses NaN and ±inf) and written as the shortest
//!   decimal that reads back to the same bits (see `json`).
//! - Lists whose order is not given by the program are written sorted: `digests.rows` by
//!   `(prompt, step)`, maps by key. The reader checks what it can (see [`Receipt::validate`]).
//!
//! # Compatibility
//!
//! Any change to a field (added, removed, renamed, retyped, new enum value) is a new schema version,
//! with its own JSON Schema document. `run_id` hashes the canonical JSON of [`RunConfigEvidence`],
//! so a change to that struct also changes every run id.
//!
//! # Example
//!
//! A complete receipt of a TP2 native-P2P run with two doors (`receipts/schema/example-run-v1.json`;
//! a test checks that it reads strictly, writes back byte-identically and validates against the
//! published JSON Schema):
//!
//! ```json
#![doc = include_str!("../schema/example-run-v1.json")]
//! ```
//!
//! Reading and checking it:
//!
//! ```
//! use memra_receipts::{json, Verdict};
//! let text = include_str!("../schema/example-run-v1.json");
//! let receipt = json::parse_receipt(text.as_bytes(), "example-run-v1.json".as_ref()).unwrap();
//! assert_eq!(receipt.evidence.verdict, Verdict::Pass);
//! assert_eq!(receipt.run_id, memra_receipts::run_id(&receipt.evidence.config));
//! assert_eq!(json::to_canonical_json(&receipt).unwrap(), text);
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// The schema version this module defines, and the only one this build reads.
pub const SCHEMA_VERSION: u32 = 1;

/// The TP sizes a run may have (docs/DESIGN.md §3.4).
pub const TP_SIZES: [usize; 4] = [1, 2, 4, 8];

/// `Option` fields are required in the file (written as `null` when absent): serde_derive would
/// otherwise accept a missing `Option` field silently, which the published schema does not.
fn required<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer)
}

// ---------------------------------------------------------------------------------------------
// Top level
// ---------------------------------------------------------------------------------------------

/// One run's receipt (kind `"run"` or `"performance"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    pub kind: ReceiptKind,
    /// [`run_id`] of `evidence.config`; the reader checks that they agree.
    pub run_id: String,
    pub evidence: Evidence,
    pub measurements: Measurements,
}

impl Receipt {
    /// A receipt of the current schema version whose `run_id` is derived from the evidence.
    pub fn new(kind: ReceiptKind, evidence: Evidence, measurements: Measurements) -> Self {
        Receipt { schema_version: SCHEMA_VERSION, kind, run_id: run_id(&evidence.config), evidence, measurements }
    }

    /// Human-readable name of the run ([`RunConfigEvidence::label`]).
    pub fn label(&self) -> String {
        self.evidence.config.label()
    }
}

/// What a receipt records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReceiptKind {
    /// A correctness run of the matrix (`memra-gates run`).
    Run,
    /// A benchmark (`memra-gates bench`); `evidence.performance` is present exactly then.
    Performance,
}

impl ReceiptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptKind::Run => "run",
            ReceiptKind::Performance => "performance",
        }
    }
}

/// Outcome of a run or of one gate. Serialized as the upper-case names below.
///
/// A SKIP, NOT-APPLICABLE or VOID never counts as a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Verdict {
    /// Every gate held.
    #[serde(rename = "PASS")]
    Pass,
    /// A gate found a difference or a bound was exceeded; `first_divergence` says where.
    #[serde(rename = "FAIL")]
    Fail,
    /// The run completed but an enabled door did not engage (it silently fell back): no evidence.
    #[serde(rename = "VOID")]
    Void,
    /// The run was not attempted here (e.g. no peer access); `reason` says why.
    #[serde(rename = "SKIP")]
    Skip,
    /// The configuration has no meaning on this backend (registry rule); `reason` quotes it.
    #[serde(rename = "NOT-APPLICABLE")]
    NotApplicable,
    /// The run could not complete (fault, OOM, failed launch); `reason` says where.
    #[serde(rename = "ERROR")]
    Error,
}

impl Verdict {
    pub const ALL: [Verdict; 6] =
        [Verdict::Pass, Verdict::Fail, Verdict::Void, Verdict::Skip, Verdict::NotApplicable, Verdict::Error];

    /// The string written in receipts.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Void => "VOID",
            Verdict::Skip => "SKIP",
            Verdict::NotApplicable => "NOT-APPLICABLE",
            Verdict::Error => "ERROR",
        }
    }

    /// Whether a change from `old` to `self` is a regression: a PASS that became anything else, or
    /// anything that became FAIL or ERROR (FAIL → ERROR and ERROR → FAIL included: the run's failure
    /// changed character). Staying the same is never a regression.
    pub fn is_regression_from(self, old: Verdict) -> bool {
        if self == old {
            return false;
        }
        old == Verdict::Pass || matches!(self, Verdict::Fail | Verdict::Error)
    }

    /// Whether a receipt with this verdict must say why (`reason` non-empty).
    pub fn requires_reason(self) -> bool {
        matches!(self, Verdict::Void | Verdict::Skip | Verdict::NotApplicable | Verdict::Error)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------
// Evidence (deterministic)
// ---------------------------------------------------------------------------------------------

/// Everything about a run that does not depend on the clock or the machine: two runs of the same
/// configuration on the same build serialize this byte-identically.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    pub config: RunConfigEvidence,
    pub build: BuildEvidence,
    /// Overall verdict of the run (the worst of its gates, or SKIP / NOT-APPLICABLE / ERROR).
    pub verdict: Verdict,
    /// Why the verdict is what it is; required (non-empty) for VOID, SKIP, NOT-APPLICABLE and ERROR.
    /// An ERROR's reason says where the run stopped ("layer 3 o_join: cudaErrorIllegalAddress").
    #[serde(deserialize_with = "required")]
    pub reason: Option<String>,
    /// One entry per gate that ran, in the order they ran; each gate at most once.
    pub gates: Vec<GateResult>,
    /// Engagement counters, named `"<door_id>.<what>"` by the door registry (e.g.
    /// `"oproj_direct.peer_stores"`): how many times the door's mechanism ran. Older spellings
    /// `"MEMRA_X"` / `"MEMRA_X@seam"` are also accepted by readers.
    /// (per seam it touches). A door counts as engaged when any of its counters is > 0.
    pub engaged: BTreeMap<String, u64>,
    /// The first place this run differed from its reference, if it did (docs/DESIGN.md §4.2).
    #[serde(deserialize_with = "required")]
    pub first_divergence: Option<Divergence>,
    pub digests: SeamDigests,
    /// Token tape: `tokens[prompt][step]`, the argmax token of each decode step.
    pub tokens: Vec<Vec<u32>>,
    /// [`token_tape_digest`] of `tokens`; the reader checks that they agree.
    pub token_tape_digest: String,
    /// Per-seam error against the oracle (NUMERIC-CLASS doors; empty otherwise).
    pub error_budget: Vec<SeamError>,
    /// Steps where the oracle's top-two margin lies within the error budget: reported, never hidden.
    pub near_ties: Vec<NearTie>,
    /// Present exactly in receipts of kind `"performance"`.
    #[serde(deserialize_with = "required")]
    pub performance: Option<PerformanceClaim>,
}

/// The configuration of a run: the input of [`run_id`]. Nothing volatile may go here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfigEvidence {
    /// What ran: `"memra-runtime"` for the built-in runtime, or an external engine's name (docs/DESIGN.md §10).
    pub subject: String,
    pub backend: Backend,
    /// Tensor-parallel size, one of [`TP_SIZES`].
    pub tp: usize,
    pub transport: Transport,
    /// Doors set explicitly for this run: environment variable → on (`true`) / off (`false`).
    /// Doors not listed are at their registry default.
    pub doors: BTreeMap<String, bool>,
    pub model: ModelEvidence,
    /// Hex digest of the prompt battery.
    pub battery_digest: String,
    /// What this run was compared against, e.g. `"tp1 host-bounce defaults on host"`.
    pub oracle: String,
}

impl RunConfigEvidence {
    /// Human-readable run name used in tables, JUnit and CSV:
    /// `"<subject>/<preset> <backend> tp<N> <transport> <doors>"`, where doors are `+NAME` (on) and
    /// `-NAME` (off) without the `MEMRA_` prefix, in key order, or `defaults` when none is set.
    /// Not unique by itself (the oracle and digests are not in it); [`run_id`] is.
    pub fn label(&self) -> String {
        let doors = if self.doors.is_empty() {
            "defaults".to_string()
        } else {
            self.doors
                .iter()
                .map(|(name, on)| {
                    let short = name.strip_prefix("MEMRA_").unwrap_or(name);
                    format!("{}{short}", if *on { '+' } else { '-' })
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        format!(
            "{}/{} {} tp{} {} {doors}",
            self.subject,
            self.model.preset,
            self.backend.as_str(),
            self.tp,
            self.transport.as_str()
        )
    }
}

/// Which backend executed the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// CPU ranks (threads with private arenas).
    Host,
    /// CUDA devices through cudarc.
    Cuda,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Host => "host",
            Backend::Cuda => "cuda",
        }
    }
}

/// How bytes move between ranks (docs/DESIGN.md §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    HostBounce,
    NativeP2p,
    Nccl,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::HostBounce => "host-bounce",
            Transport::NativeP2p => "native-p2p",
            Transport::Nccl => "nccl",
        }
    }
}

/// The model a run used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEvidence {
    /// Preset name (`"tiny"`, `"small"`, `"step"`) or `"file"` for a user's safetensors.
    pub preset: String,
    /// Hex digest of the weights.
    pub digest: String,
}

/// What was compiled: everything that decides the numerics of the build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildEvidence {
    /// Hex digest of the kernel sources (stamped by build.rs).
    pub kernel_source_digest: String,
    /// NVRTC options in the order they were passed; empty on the host backend.
    pub nvrtc_options: Vec<String>,
}

/// One gate's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateResult {
    pub gate: Gate,
    pub verdict: Verdict,
    /// One line a person can act on ("17 of 17 doors engaged", "max 3 ulp at L1.qkv, bound 4").
    pub detail: String,
}

/// The gates of docs/DESIGN.md §4.2, serialized in snake_case (`"argmax_tape"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// Every layer × seam × token digest equals the oracle's, bitwise.
    Identity,
    /// Teacher-forced argmax tape equals the oracle's except at reported near-ties.
    ArgmaxTape,
    /// A NUMERIC-CLASS door equals its own TP1 host-bounce baseline bitwise.
    ClassIdentity,
    /// Per-seam max ULP / relative error against the oracle within the door's budget.
    ErrorBudget,
    /// Every enabled door reports that its mechanism ran.
    Engagement,
    /// Outputs are not all-zero or constant.
    NonTriviality,
    /// The same configuration twice gives identical digests.
    Determinism,
    /// The CUDA TP1 run equals the host oracle bitwise.
    DeviceHost,
    /// The canonical program agrees with the plain f64 reference within its bound (docs/DESIGN.md §3.4).
    Reference,
}

impl Gate {
    pub fn as_str(self) -> &'static str {
        match self {
            Gate::Identity => "identity",
            Gate::ArgmaxTape => "argmax_tape",
            Gate::ClassIdentity => "class_identity",
            Gate::ErrorBudget => "error_budget",
            Gate::Engagement => "engagement",
            Gate::NonTriviality => "non_triviality",
            Gate::Determinism => "determinism",
            Gate::DeviceHost => "device_host",
            Gate::Reference => "reference",
        }
    }
}

/// The first element at which a run differed from its reference (docs/DESIGN.md §4.2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Divergence {
    pub prompt: usize,
    pub step: usize,
    pub layer: usize,
    pub seam: String,
    /// The rank whose buffer differed, when the seam is rank-local (e.g. `o_proj` partials).
    #[serde(deserialize_with = "required")]
    pub rank: Option<usize>,
    /// Flat element index within the seam's tensor.
    pub element: u64,
    /// `"0x"` + 8 lowercase hex digits: the reference's `f32::to_bits()` ([`f32_bits_hex`]).
    pub oracle_bits: String,
    /// Same for the observed value.
    pub observed_bits: String,
    /// Distance in units in the last place between the two values (see [`ulp_distance`]).
    pub ulp: u64,
}

impl Divergence {
    /// One line for tables: `L3.o_join p0 s5 r2 [1234] 0x3f800000→0x3f800001 (1 ulp)`.
    pub fn short(&self) -> String {
        let rank = self.rank.map(|r| format!(" r{r}")).unwrap_or_default();
        format!(
            "{} p{} s{}{rank} [{}] {}→{} ({} ulp)",
            seam_column(self.layer, &self.seam),
            self.prompt,
            self.step,
            self.element,
            self.oracle_bits,
            self.observed_bits,
            self.ulp
        )
    }
}

/// The layer × seam × token digest table. A digest is order-independent (wrapping sum over
/// elements of splitmix64 of (element index, f32 bits), docs/DESIGN.md §5), written with [`digest_hex`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeamDigests {
    /// Column names, in program order: `L<layer>.<seam>` ([`seam_column`]), unique.
    pub columns: Vec<String>,
    /// One row per (prompt, step), sorted by (prompt, step), each with one digest per column.
    pub rows: Vec<DigestRow>,
}

/// The digests of one decode step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DigestRow {
    pub prompt: usize,
    pub step: usize,
    /// `digests[i]` belongs to `columns[i]`; 16 lowercase hex digits each.
    pub digests: Vec<String>,
}

/// Worst error of one seam against the oracle over the whole battery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeamError {
    pub layer: usize,
    pub seam: String,
    /// Largest [`ulp_distance`] over all elements and steps.
    pub max_ulp: u64,
    /// Largest `|observed − oracle| / |oracle|` (elements whose oracle value is 0 count with
    /// `|observed|`); finite.
    pub max_rel: f64,
}

/// A step where the oracle's top-two logit margin lies within the door's error budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NearTie {
    pub prompt: usize,
    pub step: usize,
    /// The oracle's top-1 minus top-2 logit, in f32.
    pub margin: f32,
    pub oracle_token: u32,
    pub observed_token: u32,
}

/// A performance receipt's claim (docs/DESIGN.md §8). Ratios are named freely, e.g.
/// `"L0.latency_over_memory_floor"`, `"L0.latency_over_pytorch"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerformanceClaim {
    pub performance_claim: bool,
    pub ratios: BTreeMap<String, f64>,
}

// ---------------------------------------------------------------------------------------------
// Measurements (volatile)
// ---------------------------------------------------------------------------------------------

/// Everything that depends on the clock or the machine. Never compared for identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measurements {
    /// One entry per timed layer × seam.
    pub latency: Vec<SeamLatency>,
    /// Wall time of the whole run, milliseconds.
    pub wall_ms: f64,
    /// Host description (CPU model, core count, OS).
    pub host: String,
    /// Device description (name, driver, memory) on the CUDA backend.
    #[serde(deserialize_with = "required")]
    pub device: Option<String>,
    /// The byte-integrity probe run before native-P2P runs (docs/DESIGN.md §3.5); empty otherwise.
    pub p2p_probe: Vec<ProbeEntry>,
    /// Start of the run, milliseconds since the Unix epoch.
    pub started_at_unix_ms: u64,
    /// Other named measurements (e.g. `"gate_overhead_ms"`). A launch over several processes
    /// (`--process P/N`) adds `"processes"` (N) to each of its receipts and `"ranks_per_process"`
    /// (TP / N) to the runs that spanned the processes; absent keys mean one process. They live
    /// here, not in `evidence`, because the evidence must equal the single-process run's.
    pub extra: BTreeMap<String, f64>,
}

/// Latency of one layer × seam over the timed decode steps.
///
/// Formulas, over the `n_samples` timed steps sorted ascending as `x[0] ≤ … ≤ x[n−1]` (integer
/// nanoseconds, one sample per timed step after warm-up; CUDA events on the GPU, a monotonic clock
/// on the host):
///
/// - `min_ns = x[0]`, `max_ns = x[n−1]`
/// - `median_ns = x[(n−1) / 2]` — the *lower* median (integer division), always an observed sample
/// - `p90_ns = x[⌈0.9·n⌉ − 1]` — nearest-rank 90th percentile, computed in integers as
///   `x[⌈9n / 10⌉ − 1]`; an observed sample
///
/// so `min ≤ median ≤ p90 ≤ max`. [`LatencyStats::from_samples`] is the one implementation.
/// `[min_ns, max_ns]` is the noise band that `diff` uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeamLatency {
    pub layer: usize,
    pub seam: String,
    pub n_samples: u64,
    pub min_ns: u64,
    pub median_ns: u64,
    pub p90_ns: u64,
    pub max_ns: u64,
}

impl SeamLatency {
    pub fn new(layer: usize, seam: impl Into<String>, stats: LatencyStats) -> Self {
        SeamLatency {
            layer,
            seam: seam.into(),
            n_samples: stats.n_samples,
            min_ns: stats.min_ns,
            median_ns: stats.median_ns,
            p90_ns: stats.p90_ns,
            max_ns: stats.max_ns,
        }
    }

    pub fn stats(&self) -> LatencyStats {
        LatencyStats {
            n_samples: self.n_samples,
            min_ns: self.min_ns,
            median_ns: self.median_ns,
            p90_ns: self.p90_ns,
            max_ns: self.max_ns,
        }
    }
}

/// Order statistics of a set of latency samples; formulas on [`SeamLatency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyStats {
    pub n_samples: u64,
    pub min_ns: u64,
    pub median_ns: u64,
    pub p90_ns: u64,
    pub max_ns: u64,
}

impl LatencyStats {
    /// The statistics of `samples_ns` (any order); `None` when there are no samples.
    pub fn from_samples(samples_ns: &[u64]) -> Option<LatencyStats> {
        if samples_ns.is_empty() {
            return None;
        }
        let mut x = samples_ns.to_vec();
        x.sort_unstable();
        let n = x.len();
        Some(LatencyStats {
            n_samples: n as u64,
            min_ns: x[0],
            median_ns: x[(n - 1) / 2],
            p90_ns: x[(9 * n).div_ceil(10) - 1],
            max_ns: x[n - 1],
        })
    }
}

/// One ordered pair and size of the P2P byte-integrity probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeEntry {
    /// Source device index.
    pub src: usize,
    /// Destination device index.
    pub dst: usize,
    /// Bytes copied.
    pub bytes: u64,
    /// Words of the destination that did not hold the pattern after the copy.
    pub bad_words: u64,
    pub status: ProbeStatus,
}

/// Outcome of one probe copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeStatus {
    /// Every word arrived.
    Ok,
    /// The copy reported success but `bad_words` > 0.
    Corrupt,
    /// The pair has no peer access; native-P2P runs are skipped.
    NoPeerAccess,
    /// The copy itself failed.
    Failed,
}

// ---------------------------------------------------------------------------------------------
// Summary of a matrix run
// ---------------------------------------------------------------------------------------------

/// The summary a matrix run writes beside its receipts (`summary.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    pub kind: SummaryKind,
    /// Matrix name as given on the command line (`"all"`, `"smoke"`).
    pub matrix: String,
    /// How many rows have each verdict; the reader checks them against `rows`.
    pub counts: VerdictCounts,
    /// [`overall_verdict`] of the rows; the reader checks it.
    pub overall: Verdict,
    /// One row per run, sorted by `run_id`.
    pub rows: Vec<SummaryRow>,
}

/// The `kind` of a [`Summary`]: always `"summary"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SummaryKind {
    Summary,
}

/// Verdict tallies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerdictCounts {
    pub pass: u64,
    pub fail: u64,
    pub void: u64,
    pub skip: u64,
    pub not_applicable: u64,
    pub error: u64,
}

impl VerdictCounts {
    pub fn tally(verdicts: impl IntoIterator<Item = Verdict>) -> Self {
        let mut c = VerdictCounts::default();
        for v in verdicts {
            c.add(v);
        }
        c
    }

    pub fn add(&mut self, v: Verdict) {
        *self.slot(v) += 1;
    }

    pub fn get(&self, v: Verdict) -> u64 {
        match v {
            Verdict::Pass => self.pass,
            Verdict::Fail => self.fail,
            Verdict::Void => self.void,
            Verdict::Skip => self.skip,
            Verdict::NotApplicable => self.not_applicable,
            Verdict::Error => self.error,
        }
    }

    fn slot(&mut self, v: Verdict) -> &mut u64 {
        match v {
            Verdict::Pass => &mut self.pass,
            Verdict::Fail => &mut self.fail,
            Verdict::Void => &mut self.void,
            Verdict::Skip => &mut self.skip,
            Verdict::NotApplicable => &mut self.not_applicable,
            Verdict::Error => &mut self.error,
        }
    }

    pub fn total(&self) -> u64 {
        Verdict::ALL.iter().map(|v| self.get(*v)).sum()
    }

    /// `"12 PASS · 1 FAIL · 2 SKIP"`: non-zero counts in [`Verdict::ALL`] order, or `"no runs"`.
    pub fn one_line(&self) -> String {
        let parts: Vec<String> =
            Verdict::ALL.iter().filter(|v| self.get(**v) > 0).map(|v| format!("{} {}", self.get(*v), v)).collect();
        if parts.is_empty() {
            "no runs".to_string()
        } else {
            parts.join(" · ")
        }
    }
}

/// One run in a [`Summary`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryRow {
    pub run_id: String,
    pub label: String,
    pub verdict: Verdict,
    #[serde(deserialize_with = "required")]
    pub reason: Option<String>,
    /// [`Divergence::short`] of the run's first divergence.
    #[serde(deserialize_with = "required")]
    pub first_divergence: Option<String>,
    /// Doors with a counter > 0 ([`engaged_doors`]), sorted.
    pub engaged: Vec<String>,
    pub wall_ms: f64,
}

impl Summary {
    /// The summary of a set of receipts (rows sorted by `run_id`).
    pub fn from_receipts(matrix: impl Into<String>, receipts: &[Receipt]) -> Summary {
        let mut rows: Vec<SummaryRow> = receipts
            .iter()
            .map(|r| SummaryRow {
                run_id: r.run_id.clone(),
                label: r.label(),
                verdict: r.evidence.verdict,
                reason: r.evidence.reason.clone(),
                first_divergence: r.evidence.first_divergence.as_ref().map(Divergence::short),
                engaged: engaged_doors(&r.evidence.engaged).into_iter().collect(),
                wall_ms: r.measurements.wall_ms,
            })
            .collect();
        rows.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        let verdicts: Vec<Verdict> = rows.iter().map(|r| r.verdict).collect();
        Summary {
            schema_version: SCHEMA_VERSION,
            kind: SummaryKind::Summary,
            matrix: matrix.into(),
            counts: VerdictCounts::tally(verdicts.iter().copied()),
            overall: overall_verdict(&verdicts),
            rows,
        }
    }
}

/// The verdict of a set of runs: FAIL if any failed; else ERROR if any errored; else VOID if any was
/// void; else PASS if any passed; else (only SKIP / NOT-APPLICABLE) SKIP. An empty set is ERROR:
/// nothing was tested.
pub fn overall_verdict(verdicts: &[Verdict]) -> Verdict {
    let has = |v: Verdict| verdicts.contains(&v);
    if verdicts.is_empty() {
        Verdict::Error
    } else if has(Verdict::Fail) {
        Verdict::Fail
    } else if has(Verdict::Error) {
        Verdict::Error
    } else if has(Verdict::Void) {
        Verdict::Void
    } else if has(Verdict::Pass) {
        Verdict::Pass
    } else {
        Verdict::Skip
    }
}

/// The doors whose engagement counter is > 0: the door part of each counter key
/// (`"<door_id>.<what>"` → `door_id`; an older `"MEMRA_X@seam"` → `MEMRA_X`).
pub fn engaged_doors(engaged: &BTreeMap<String, u64>) -> BTreeSet<String> {
    engaged
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, _)| {
            let k = k.split_once('@').map_or(k.as_str(), |(door, _)| door);
            k.split_once('.').map_or(k, |(door, _)| door).to_string()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Identity and hex helpers
// ---------------------------------------------------------------------------------------------

/// UTC civil time (year, month, day, hour, minute) of a receipt timestamp in Unix milliseconds
/// (proleptic Gregorian; H. Hinnant's `civil_from_days`). The one date routine for receipts'
/// `started_at_unix_ms`, used by promotion and plots.
pub fn utc_civil(unix_ms: u64) -> (i64, u32, u32, u32, u32) {
    let secs = unix_ms / 1000;
    let days = (secs / 86_400) as i64;
    let (h, m) = (((secs % 86_400) / 3600) as u32, ((secs % 3600) / 60) as u32);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let mo = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let y = yoe + era * 400 + i64::from(mo <= 2);
    (y, mo, d, h, m)
}

/// 64-bit FNV-1a (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`): small, fully specified,
/// the same on every platform and build.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The stable identity of a run: [`fnv1a64`] of the canonical JSON (`json::to_canonical_json`, UTF-8,
/// 2-space indent, trailing newline) of `config`, as 16 lowercase hex digits.
///
/// It depends only on the configuration's values (struct field order and `BTreeMap` key order are
/// fixed), so it is the same across builds, platforms and nights; `diff` pairs runs by it.
pub fn run_id(config: &RunConfigEvidence) -> String {
    let text = crate::json::to_canonical_json(config).expect("a run configuration has no floats to reject");
    digest_hex(fnv1a64(text.as_bytes()))
}

/// The digest of a token tape: [`fnv1a64`] over, for each prompt in order, its token count as u32
/// little-endian followed by each token as u32 little-endian; 16 lowercase hex digits.
pub fn token_tape_digest(tokens: &[Vec<u32>]) -> String {
    let mut bytes = Vec::with_capacity(tokens.iter().map(|t| 4 + 4 * t.len()).sum());
    for tape in tokens {
        let n = u32::try_from(tape.len()).expect("a token tape longer than u32::MAX");
        bytes.extend_from_slice(&n.to_le_bytes());
        for t in tape {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
    }
    digest_hex(fnv1a64(&bytes))
}

/// A 64-bit digest as written in receipts: 16 lowercase hex digits.
pub fn digest_hex(d: u64) -> String {
    format!("{d:016x}")
}

/// An f32 bit pattern as written in receipts: `"0x"` + 8 lowercase hex digits (`1.0` → `"0x3f800000"`).
pub fn f32_bits_hex(x: f32) -> String {
    format!("0x{:08x}", x.to_bits())
}

/// The digest column name of a seam: `L<layer>.<seam>` (`seam_column(0, "attn_norm")` → `"L0.attn_norm"`).
pub fn seam_column(layer: usize, seam: &str) -> String {
    format!("L{layer}.{seam}")
}

/// ULP distance between two f32 values: the number of representable f32 values between them,
/// on the monotone integer line of f32 bit patterns (so `-0.0` and `+0.0` are 1 apart).
/// NaN has no distance: `u64::MAX`.
pub fn ulp_distance(a: f32, b: f32) -> u64 {
    if a.is_nan() || b.is_nan() {
        return u64::MAX;
    }
    // Map sign-magnitude bits onto a monotone signed line: -0.0 → -1, +0.0 → 0.
    fn key(x: f32) -> i64 {
        let bits = x.to_bits();
        if bits & 0x8000_0000 != 0 {
            -i64::from(bits & 0x7fff_ffff) - 1
        } else {
            i64::from(bits)
        }
    }
    key(a).abs_diff(key(b))
}

/// Whether `s` is a non-empty string of lowercase hex digits.
pub(crate) fn is_lower_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

// ---------------------------------------------------------------------------------------------
// Semantic checks beyond the serde shape
// ---------------------------------------------------------------------------------------------

/// A rule a value broke: field path, the value (quoted for display) and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub value: String,
    pub rule: String,
}

fn violation(field: impl Into<String>, value: impl fmt::Debug, rule: impl Into<String>) -> Violation {
    let mut value = format!("{value:?}");
    if value.len() > 80 {
        let cut = (0..=77).rev().find(|i| value.is_char_boundary(*i)).unwrap_or(0);
        value.truncate(cut);
        value.push('…');
    }
    Violation { field: field.into(), value, rule: rule.into() }
}

fn check_hex(field: &str, s: &str) -> Result<(), Violation> {
    if is_lower_hex(s) && s.len().is_multiple_of(2) {
        Ok(())
    } else {
        Err(violation(field, s, "must be a non-empty, even number of lowercase hex digits"))
    }
}

fn check_hex16(field: &str, s: &str) -> Result<(), Violation> {
    if s.len() == 16 && is_lower_hex(s) {
        Ok(())
    } else {
        Err(violation(field, s, "must be exactly 16 lowercase hex digits"))
    }
}

fn check_bits(field: &str, s: &str) -> Result<(), Violation> {
    match s.strip_prefix("0x") {
        Some(h) if h.len() == 8 && is_lower_hex(h) => Ok(()),
        _ => Err(violation(field, s, "must be \"0x\" followed by 8 lowercase hex digits (an f32's bits)")),
    }
}

impl Receipt {
    /// Checks the rules the serde shape cannot express; the reader and the writer both call it.
    ///
    /// - `schema_version` is [`SCHEMA_VERSION`]; `run_id` equals [`run_id`] of the config
    /// - `tp` is in [`TP_SIZES`]; digests and bit patterns are hex of the documented widths
    /// - `token_tape_digest` equals [`token_tape_digest`] of `tokens`
    /// - digest columns are unique; every row has one digest per column; rows strictly sorted by
    ///   (prompt, step)
    /// - each gate appears at most once; VOID, SKIP, NOT-APPLICABLE and ERROR carry a non-empty reason
    /// - `evidence.performance` is present exactly when `kind` is `"performance"`
    /// - each latency entry has `n_samples ≥ 1` and `min ≤ median ≤ p90 ≤ max`; (layer, seam) unique
    pub fn validate(&self) -> Result<(), Violation> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(violation("schema_version", self.schema_version, format!("must be {SCHEMA_VERSION}")));
        }
        let ev = &self.evidence;
        let cfg = &ev.config;
        let expected = run_id(cfg);
        if self.run_id != expected {
            return Err(violation(
                "run_id",
                &self.run_id,
                format!("must equal run_id(evidence.config) = {expected:?} (FNV-1a-64 of its canonical JSON)"),
            ));
        }
        if !TP_SIZES.contains(&cfg.tp) {
            return Err(violation("evidence.config.tp", cfg.tp, "must be 1, 2, 4 or 8"));
        }
        check_hex("evidence.config.model.digest", &cfg.model.digest)?;
        check_hex("evidence.config.battery_digest", &cfg.battery_digest)?;
        check_hex("evidence.build.kernel_source_digest", &ev.build.kernel_source_digest)?;
        if ev.verdict.requires_reason() && ev.reason.as_deref().is_none_or(str::is_empty) {
            return Err(violation(
                "evidence.reason",
                &ev.reason,
                format!("a {} verdict must say why (non-empty reason)", ev.verdict),
            ));
        }
        let mut seen_gates = BTreeSet::new();
        for (i, g) in ev.gates.iter().enumerate() {
            if !seen_gates.insert(g.gate) {
                return Err(violation(format!("evidence.gates[{i}].gate"), g.gate.as_str(), "each gate appears once"));
            }
        }
        if let Some(d) = &ev.first_divergence {
            check_bits("evidence.first_divergence.oracle_bits", &d.oracle_bits)?;
            check_bits("evidence.first_divergence.observed_bits", &d.observed_bits)?;
        }
        let mut columns = BTreeSet::new();
        for (i, c) in ev.digests.columns.iter().enumerate() {
            if c.is_empty() || !columns.insert(c.as_str()) {
                return Err(violation(
                    format!("evidence.digests.columns[{i}]"),
                    c,
                    "column names are non-empty and unique",
                ));
            }
        }
        let mut prev: Option<(usize, usize)> = None;
        for (i, row) in ev.digests.rows.iter().enumerate() {
            let key = (row.prompt, row.step);
            if prev.is_some_and(|p| p >= key) {
                return Err(violation(
                    format!("evidence.digests.rows[{i}]"),
                    key,
                    "rows are strictly sorted by (prompt, step)",
                ));
            }
            prev = Some(key);
            if row.digests.len() != ev.digests.columns.len() {
                return Err(violation(
                    format!("evidence.digests.rows[{i}].digests"),
                    row.digests.len(),
                    format!("must hold one digest per column ({})", ev.digests.columns.len()),
                ));
            }
            for (j, d) in row.digests.iter().enumerate() {
                check_hex16(&format!("evidence.digests.rows[{i}].digests[{j}]"), d)?;
            }
        }
        check_hex16("evidence.token_tape_digest", &ev.token_tape_digest)?;
        let tape = token_tape_digest(&ev.tokens);
        if ev.token_tape_digest != tape {
            return Err(violation(
                "evidence.token_tape_digest",
                &ev.token_tape_digest,
                format!("must equal token_tape_digest(evidence.tokens) = {tape:?}"),
            ));
        }
        match (self.kind, &ev.performance) {
            (ReceiptKind::Performance, None) => {
                return Err(violation("evidence.performance", "null", "a performance receipt carries its claim"))
            }
            (ReceiptKind::Run, Some(_)) => {
                return Err(violation("evidence.performance", "{…}", "only performance receipts carry a claim"))
            }
            _ => {}
        }
        let mut seen_lat = BTreeSet::new();
        for (i, l) in self.measurements.latency.iter().enumerate() {
            let field = format!("measurements.latency[{i}]");
            if !seen_lat.insert((l.layer, l.seam.as_str())) {
                return Err(violation(field, seam_column(l.layer, &l.seam), "each layer × seam appears once"));
            }
            if l.n_samples == 0 || !(l.min_ns <= l.median_ns && l.median_ns <= l.p90_ns && l.p90_ns <= l.max_ns) {
                return Err(violation(
                    field,
                    (l.n_samples, l.min_ns, l.median_ns, l.p90_ns, l.max_ns),
                    "needs n_samples ≥ 1 and min_ns ≤ median_ns ≤ p90_ns ≤ max_ns",
                ));
            }
        }
        Ok(())
    }
}

impl Summary {
    /// Checks what the serde shape cannot: version, counts and overall verdict agree with the rows,
    /// rows sorted by unique `run_id`s of 16 hex digits.
    pub fn validate(&self) -> Result<(), Violation> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(violation("schema_version", self.schema_version, format!("must be {SCHEMA_VERSION}")));
        }
        for (i, w) in self.rows.windows(2).enumerate() {
            if w[0].run_id >= w[1].run_id {
                return Err(violation(
                    format!("rows[{}].run_id", i + 1),
                    &w[1].run_id,
                    "rows are sorted by unique run_id",
                ));
            }
        }
        for (i, r) in self.rows.iter().enumerate() {
            check_hex16(&format!("rows[{i}].run_id"), &r.run_id)?;
        }
        let verdicts: Vec<Verdict> = self.rows.iter().map(|r| r.verdict).collect();
        let counts = VerdictCounts::tally(verdicts.iter().copied());
        if counts != self.counts {
            return Err(violation("counts", self.counts, format!("must match the rows: {counts:?}")));
        }
        let overall = overall_verdict(&verdicts);
        if overall != self.overall {
            return Err(violation("overall", self.overall.as_str(), format!("must be {overall} for these rows")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_stats_formulas() {
        let s = LatencyStats::from_samples(&[50, 10, 40, 20, 30, 60, 70, 80, 90, 100]).unwrap();
        assert_eq!((s.n_samples, s.min_ns, s.median_ns, s.p90_ns, s.max_ns), (10, 10, 50, 90, 100));
        let one = LatencyStats::from_samples(&[7]).unwrap();
        assert_eq!((one.median_ns, one.p90_ns), (7, 7));
        // Lower median of an even count; nearest-rank p90 of 11 samples is the 10th (ceil(9.9)).
        let s = LatencyStats::from_samples(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]).unwrap();
        assert_eq!((s.median_ns, s.p90_ns), (6, 10));
        let s = LatencyStats::from_samples(&[4, 1, 3, 2]).unwrap();
        assert_eq!((s.median_ns, s.p90_ns), (2, 4));
        assert!(LatencyStats::from_samples(&[]).is_none());
    }

    #[test]
    fn fnv1a64_reference_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn ulp_distance_counts_representable_values() {
        assert_eq!(ulp_distance(1.0, 1.0), 0);
        assert_eq!(ulp_distance(1.0, f32::from_bits(0x3f80_0001)), 1);
        assert_eq!(ulp_distance(-0.0, 0.0), 1);
        assert_eq!(ulp_distance(f32::from_bits(1), -f32::from_bits(1)), 3);
        assert_eq!(ulp_distance(f32::NAN, 1.0), u64::MAX);
    }

    #[test]
    fn regression_rule() {
        use Verdict::*;
        assert!(Fail.is_regression_from(Pass));
        assert!(Skip.is_regression_from(Pass));
        assert!(Error.is_regression_from(Skip));
        assert!(Fail.is_regression_from(Error));
        assert!(!Pass.is_regression_from(Fail));
        assert!(!Void.is_regression_from(Skip));
        assert!(!Pass.is_regression_from(Pass));
        assert!(!Fail.is_regression_from(Fail));
    }

    #[test]
    fn overall_verdict_precedence() {
        use Verdict::*;
        assert_eq!(overall_verdict(&[]), Error);
        assert_eq!(overall_verdict(&[Pass, Error, Fail]), Fail);
        assert_eq!(overall_verdict(&[Pass, Error, Void]), Error);
        assert_eq!(overall_verdict(&[Pass, Void, Skip]), Void);
        assert_eq!(overall_verdict(&[Pass, Skip, NotApplicable]), Pass);
        assert_eq!(overall_verdict(&[Skip, NotApplicable]), Skip);
    }

    #[test]
    fn engaged_doors_strips_seam_suffix_and_zero_counters() {
        let m: BTreeMap<String, u64> = [("MEMRA_A@o_join", 3), ("MEMRA_A@qkv", 0), ("MEMRA_B", 0), ("MEMRA_C", 1)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let doors: Vec<String> = engaged_doors(&m).into_iter().collect();
        assert_eq!(doors, ["MEMRA_A", "MEMRA_C"]);
    }
}
