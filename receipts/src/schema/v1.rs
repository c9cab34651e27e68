//! Reading schema version 1 receipts: `diff`, `promote` and `--resume` keep reading receipts that
//! earlier builds wrote (docs/gpu/ holds some). The types below are version 1's shape exactly
//! (strict: unknown fields, missing fields and version 2's gates are refused), and each converts
//! into the current [`Receipt`] with `schema_version` kept at 1, so the reader and `validate`
//! know what they hold: the fields version 1 did not have are empty (no census, no coverage, no
//! claims, nothing planted), a divergence is a seam divergence whose element was located (version
//! 1 named one only when the capture re-run reproduced it), and the probe was native-p2p's. A
//! version 1 receipt is read-only: the writer refuses it.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{
    required, BuildEvidence, Divergence, DivergenceAt, Evidence, Gate, GateResult, Measurements, NearTie,
    PerformanceClaim, ProbeEntry, ProbeStatus, Receipt, ReceiptKind, RunConfigEvidence, SeamDigests, SeamError,
    SeamLatency, Transport, Verdict,
};

/// A version 1 receipt.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReceiptV1 {
    schema_version: u32,
    kind: ReceiptKind,
    run_id: String,
    evidence: EvidenceV1,
    measurements: MeasurementsV1,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EvidenceV1 {
    config: RunConfigEvidence,
    build: BuildEvidence,
    verdict: Verdict,
    #[serde(deserialize_with = "required")]
    reason: Option<String>,
    gates: Vec<GateResultV1>,
    engaged: BTreeMap<String, u64>,
    #[serde(deserialize_with = "required")]
    first_divergence: Option<DivergenceV1>,
    digests: SeamDigests,
    tokens: Vec<Vec<u32>>,
    token_tape_digest: String,
    error_budget: Vec<SeamError>,
    near_ties: Vec<NearTie>,
    #[serde(deserialize_with = "required")]
    performance: Option<PerformanceClaim>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GateResultV1 {
    gate: GateV1,
    verdict: Verdict,
    detail: String,
}

/// The gates of version 1 (version 2 added copies, coverage and probe).
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum GateV1 {
    Identity,
    ArgmaxTape,
    ClassIdentity,
    ErrorBudget,
    Engagement,
    NonTriviality,
    Determinism,
    DeviceHost,
    Reference,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DivergenceV1 {
    prompt: usize,
    step: usize,
    layer: usize,
    seam: String,
    #[serde(deserialize_with = "required")]
    rank: Option<usize>,
    element: u64,
    oracle_bits: String,
    observed_bits: String,
    ulp: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MeasurementsV1 {
    latency: Vec<SeamLatency>,
    wall_ms: f64,
    host: String,
    #[serde(deserialize_with = "required")]
    device: Option<String>,
    p2p_probe: Vec<ProbeEntryV1>,
    started_at_unix_ms: u64,
    extra: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProbeEntryV1 {
    src: usize,
    dst: usize,
    bytes: u64,
    bad_words: u64,
    status: ProbeStatus,
}

impl From<GateV1> for Gate {
    fn from(g: GateV1) -> Gate {
        match g {
            GateV1::Identity => Gate::Identity,
            GateV1::ArgmaxTape => Gate::ArgmaxTape,
            GateV1::ClassIdentity => Gate::ClassIdentity,
            GateV1::ErrorBudget => Gate::ErrorBudget,
            GateV1::Engagement => Gate::Engagement,
            GateV1::NonTriviality => Gate::NonTriviality,
            GateV1::Determinism => Gate::Determinism,
            GateV1::DeviceHost => Gate::DeviceHost,
            GateV1::Reference => Gate::Reference,
        }
    }
}

impl From<ReceiptV1> for Receipt {
    fn from(r: ReceiptV1) -> Receipt {
        let e = r.evidence;
        let m = r.measurements;
        Receipt {
            schema_version: r.schema_version,
            kind: r.kind,
            run_id: r.run_id,
            evidence: Evidence {
                config: e.config,
                build: e.build,
                verdict: e.verdict,
                reason: e.reason,
                gates: e
                    .gates
                    .into_iter()
                    .map(|g| GateResult { gate: g.gate.into(), verdict: g.verdict, detail: g.detail })
                    .collect(),
                engaged: e.engaged,
                census: BTreeMap::new(),
                census_witness: None,
                coverage: BTreeMap::new(),
                claims: Vec::new(),
                planted: None,
                first_divergence: e.first_divergence.map(|d| Divergence {
                    prompt: d.prompt,
                    step: d.step,
                    layer: d.layer,
                    seam: d.seam,
                    at: DivergenceAt::Seam,
                    src_rank: None,
                    rank: d.rank,
                    reproduced: true,
                    element: Some(d.element),
                    oracle_bits: Some(d.oracle_bits),
                    observed_bits: Some(d.observed_bits),
                    ulp: Some(d.ulp),
                    lane: None,
                }),
                digests: e.digests,
                tokens: e.tokens,
                token_tape_digest: e.token_tape_digest,
                error_budget: e.error_budget,
                near_ties: e.near_ties,
                performance: e.performance,
            },
            measurements: Measurements {
                latency: m.latency,
                wall_ms: m.wall_ms,
                host: m.host,
                device: m.device,
                p2p_probe: m
                    .p2p_probe
                    .into_iter()
                    .map(|p| ProbeEntry {
                        transport: Transport::NativeP2p,
                        src: p.src,
                        dst: p.dst,
                        bytes: p.bytes,
                        bad_words: p.bad_words,
                        status: p.status,
                    })
                    .collect(),
                started_at_unix_ms: m.started_at_unix_ms,
                extra: m.extra,
            },
        }
    }
}
