//! The deterministic part of a receipt: what was asked for, what numerics were compiled, and
//! everything the gates concluded. Two runs of one configuration on one build write byte-identical
//! evidence.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{required, seam_column, Verdict};

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
    /// Call-site counters: detail, they decide nothing (the census does).
    pub engaged: BTreeMap<String, u64>,
    /// The census of the gated run: what the backend carried out, counted where it called the
    /// driver or its host arena (`"launch.<kernel>"`, `"copy.<transport>.<bytes>"`,
    /// `"peer_store.<kernel>"`, …; `memra_runtime::evidence::census`). The engagement gate
    /// compares it with the census of the same configuration with each door off. Empty in
    /// receipts read from schema version 1.
    pub census: BTreeMap<String, u64>,
    /// Who counted `census`: absent when memra-gates' own backend counted it in this process (the
    /// built-in runtime run in process); [`CENSUS_SELF_REPORTED`] when it is the subject's own
    /// tape (an external subject: nothing outside its process saw the counters, so its
    /// engagement is only as good as its word); `"outside:<witness>"` when a witness outside the
    /// subject's process counted what it issued (e.g. `outside:cupti`, a CUDA injection library)
    /// — the value an outside witness sets. Absent in receipts written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub census_witness: Option<String>,
    /// Coverage of the special paths of docs/DESIGN.md §3.2 by this run's model and battery, as
    /// the host oracle counted them (`memra_runtime::evidence::coverage`): path → count and the
    /// first place reached. Empty when no coverage was counted (and in version 1 receipts).
    pub coverage: BTreeMap<String, CoverageCount>,
    /// The paths the model claims its battery reaches (the coverage gate checks each), sorted.
    pub claims: Vec<String>,
    /// Where the run's canary planted its defect, when the place is chosen per run (the flip
    /// canary's seeded element).
    #[serde(deserialize_with = "required")]
    pub planted: Option<Planted>,
    /// The first place this run differed from its reference, if it did (docs/DESIGN.md §4.2).
    #[serde(deserialize_with = "required")]
    pub first_divergence: Option<Divergence>,
    pub digests: SeamDigests,
    /// Token tape: `tokens[prompt][step]`, the argmax token of each decode step.
    pub tokens: Vec<Vec<u32>>,
    /// [`token_tape_digest`](crate::identity::token_tape_digest) of `tokens`; the reader checks that they agree.
    pub token_tape_digest: String,
    /// Per-seam error against the oracle (NUMERIC-CLASS doors; empty otherwise).
    pub error_budget: Vec<SeamError>,
    /// Steps where the oracle's top-two margin lies within the error budget: reported, never hidden.
    pub near_ties: Vec<NearTie>,
    /// Present exactly in receipts of kind `"performance"`.
    #[serde(deserialize_with = "required")]
    pub performance: Option<PerformanceClaim>,
}

/// [`Evidence::census_witness`] of a census that only the subject itself reported.
pub const CENSUS_SELF_REPORTED: &str = "self-reported";

/// Whether `w` is a [`Evidence::census_witness`] value: [`CENSUS_SELF_REPORTED`] or
/// `"outside:<witness>"` (a non-empty name of `[a-z0-9._-]`).
pub fn census_witness_ok(w: &str) -> bool {
    w == CENSUS_SELF_REPORTED
        || w.strip_prefix("outside:").is_some_and(|n| {
            !n.is_empty() && n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
        })
}

/// The configuration of a run: the input of [`run_id`](crate::identity::run_id). Nothing volatile may go here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfigEvidence {
    /// What ran: `"memra-runtime"` for the built-in runtime, or an external engine's name (docs/DESIGN.md §10).
    pub subject: String,
    pub backend: Backend,
    /// Tensor-parallel size, one of [`TP_SIZES`](crate::schema::TP_SIZES).
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
    /// Sessions per pass (rows, docs/DESIGN.md §3.6): 2, 4 or 8; absent for one session per pass,
    /// so a single-token run's identity (and run id) is what it was before the axis existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    /// Consecutive tokens of one session per pass (columns: verify and prefill): 2, 4 or 8; absent
    /// for one token per pass. At most one of `batch` and `columns` is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<usize>,
}

impl RunConfigEvidence {
    /// Human-readable run name used in tables, JUnit and CSV:
    /// `"<subject>/<preset> <backend> tp<N> <transport> <doors>"`, where doors are `+NAME` (on) and
    /// `-NAME` (off) without the `MEMRA_` prefix, in key order, or `defaults` when none is set.
    /// A run of several rows or columns per pass ends in ` b<B>` or ` t<T>` ([`Self::pass_label`]).
    /// Not unique by itself (the oracle and digests are not in it); [`run_id`](crate::identity::run_id) is.
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
        let pass = self.pass_label();
        let pass = if pass.is_empty() { pass } else { format!(" {pass}") };
        format!(
            "{}/{} {} tp{} {} {doors}{pass}",
            self.subject,
            self.model.preset,
            self.backend.as_str(),
            self.tp,
            self.transport.as_str()
        )
    }

    /// `b4` (4 rows per pass), `t2` (2 columns per pass), or `` (one token of one session).
    pub fn pass_label(&self) -> String {
        match (self.batch, self.columns) {
            (Some(b), _) => format!("b{b}"),
            (None, Some(t)) => format!("t{t}"),
            (None, None) => String::new(),
        }
    }

    /// Lanes of one pass: rows or columns, 1 for single-token decode.
    pub fn lanes(&self) -> usize {
        self.batch.or(self.columns).unwrap_or(1)
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
    /// The version of the subject that produced the numbers (docs/DESIGN.md §10): the built-in
    /// runtime's crate version, or the version an external engine's manifest declares (and its
    /// tape repeats). Not part of the run identity, so `diff` pairs the runs of two versions of
    /// one engine. Absent (`None`, not written) in receipts from builds before the subject
    /// protocol; every receipt written now has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_version: Option<String>,
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
    /// Every cross-rank copy's destination equals its source (schema version 2).
    Copies,
    /// Every path the model claims was reached by its battery (schema version 2).
    Coverage,
    /// The byte-integrity probe of the run's transport found every word (schema version 2).
    Probe,
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
            Gate::Copies => "copies",
            Gate::Coverage => "coverage",
            Gate::Probe => "probe",
        }
    }
}

/// Where a run first differed from its reference (docs/DESIGN.md §4.2): always the prompt, step,
/// layer and seam (from the digests); the rank whose part differed; and the element when a
/// re-run with a full capture of that seam reproduced the difference (`reproduced`; when it did
/// not, the difference depends on timing — a race is likely — and no element is named).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Divergence {
    pub prompt: usize,
    pub step: usize,
    pub layer: usize,
    pub seam: String,
    /// What differed: the seam's tensor, or a cross-rank copy of it (destination ≠ source).
    pub at: DivergenceAt,
    /// The copy's source rank (`at` = `copy` only).
    #[serde(deserialize_with = "required")]
    pub src_rank: Option<usize>,
    /// The rank whose part differed (a copy's destination rank), when the evidence names one.
    #[serde(deserialize_with = "required")]
    pub rank: Option<usize>,
    /// A seam: whether a re-run with a full capture reproduced the difference; the element fields
    /// are present exactly when it did. A copy (located at the copy, never an element): whether
    /// the configuration's second run had the same fault — `true` is a deterministic transport
    /// fault, `false` a fault of one run only (a race is likely).
    pub reproduced: bool,
    /// Flat element index within the seam's tensor.
    #[serde(deserialize_with = "required")]
    pub element: Option<u64>,
    /// `"0x"` + 8 lowercase hex digits: the reference's `f32::to_bits()` ([`f32_bits_hex`](crate::identity::f32_bits_hex)).
    #[serde(deserialize_with = "required")]
    pub oracle_bits: Option<String>,
    /// Same for the observed value.
    #[serde(deserialize_with = "required")]
    pub observed_bits: Option<String>,
    /// Distance in units in the last place between the two values (see [`ulp_distance`](memra_kernels::grid::ulp_distance)).
    #[serde(deserialize_with = "required")]
    pub ulp: Option<u64>,
    /// In a run of several rows or columns per pass (docs/DESIGN.md §3.6): the pass and the row or
    /// column that computed the divergent step. Absent in single-token runs (and receipts written
    /// before the axes existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<LaneEvidence>,
}

/// The lane of a multi-lane pass that computed a step: `axis` is `row` (batch) or `column`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaneEvidence {
    pub axis: LaneAxis,
    /// The row or column within its pass, from 0.
    pub index: usize,
    /// The pass of the run (counted from 0 over the whole run).
    pub pass: u64,
}

/// Rows (several sessions per pass) or columns (several tokens of one session per pass).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaneAxis {
    Row,
    Column,
}

impl LaneEvidence {
    /// `row 1 of pass 7` / `column 3 of pass 2`.
    pub fn describe(&self) -> String {
        let axis = match self.axis {
            LaneAxis::Row => "row",
            LaneAxis::Column => "column",
        };
        format!("{axis} {} of pass {}", self.index, self.pass)
    }
}

/// What a [`Divergence`] found different.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceAt {
    /// The seam's digest.
    Seam,
    /// A cross-rank copy of the seam's tensor: its destination's digest differs from its source's.
    Copy,
}

impl Divergence {
    /// One line for tables: `L3.o_join p0 s5 r2 [1234] 0x3f800000→0x3f800001 (1 ulp)`,
    /// `L0.attn_norm p0 s0 copy r0→r1 (in both runs: deterministic)`, or
    /// `L1.experts p0 s3 r1 (not reproduced: race likely)`.
    /// A multi-lane run's place names the lane too: `L3.o_join p0 s5 (row 1 of pass 7) r2 …`.
    pub fn short(&self) -> String {
        let rank = self.rank.map(|r| format!(" r{r}")).unwrap_or_default();
        let lane = self.lane.map(|l| format!(" ({})", l.describe())).unwrap_or_default();
        let place = format!("{} p{} s{}{lane}", seam_column(self.layer, &self.seam), self.prompt, self.step);
        if self.at == DivergenceAt::Copy {
            let src = self.src_rank.map(|r| format!("r{r}")).unwrap_or_else(|| "?".into());
            let dst = self.rank.map(|r| format!("r{r}")).unwrap_or_else(|| "?".into());
            let how = if self.reproduced { "in both runs: deterministic" } else { "in one run only: race likely" };
            return format!("{place} copy {src}→{dst} ({how})");
        }
        match (self.element, &self.oracle_bits, &self.observed_bits, self.ulp) {
            (Some(e), Some(o), Some(b), Some(u)) => format!("{place}{rank} [{e}] {o}→{b} ({u} ulp)"),
            _ => format!("{place}{rank} (not reproduced: race likely)"),
        }
    }
}

/// How often a special path was reached, and the first place (in program order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoverageCount {
    pub count: u64,
    #[serde(deserialize_with = "required")]
    pub first: Option<SeamPlace>,
}

/// A place in the program: prompt, step, layer, seam.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeamPlace {
    pub prompt: usize,
    pub step: usize,
    pub layer: usize,
    pub seam: String,
}

/// Where a canary planted its defect (the flip canary's seeded element).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Planted {
    /// The canary's door id.
    pub canary: String,
    pub layer: usize,
    pub seam: String,
    pub step: usize,
    /// Flat element index within the seam's tensor.
    pub element: u64,
}

/// The layer × seam × token digest table. A digest is order-independent (wrapping sum over
/// elements of splitmix64 of (element index, f32 bits), docs/DESIGN.md §5), written with [`digest_hex`](crate::identity::digest_hex).
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
    /// Largest [`ulp_distance`](memra_kernels::grid::ulp_distance) over all elements and steps.
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
