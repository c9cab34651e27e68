//! From an evaluation to a receipt: the one place where the gates' values become the receipt
//! format's (`memra_receipts::schema`), including the conversions of the runtime's backend and
//! transport into their wire forms (and back, for reading receipts in registry terms).

use crate::gate::{self, FirstDivergence};
use crate::job::Job;
use crate::matrix::Configuration;
use crate::registry::Registry;
use memra_receipts::schema::{self as rs, GateResult, Verdict};
use memra_receipts::{Receipt, ReceiptKind};
use memra_runtime::backend::{BackendKind, ProbeResult};
use memra_runtime::evidence::coverage::Coverage;
use memra_runtime::record::Record;
use memra_runtime::{Battery, Canary, Transport};
use std::collections::BTreeMap;

/// The receipt format's backend of a runtime backend.
pub fn wire_backend(b: BackendKind) -> rs::Backend {
    match b {
        BackendKind::Host => rs::Backend::Host,
        BackendKind::Cuda => rs::Backend::Cuda,
    }
}

/// The runtime backend a receipt names.
pub fn backend_of(b: rs::Backend) -> BackendKind {
    match b {
        rs::Backend::Host => BackendKind::Host,
        rs::Backend::Cuda => BackendKind::Cuda,
    }
}

/// The receipt format's transport of a runtime transport.
pub fn wire_transport(t: Transport) -> rs::Transport {
    match t {
        Transport::HostBounce => rs::Transport::HostBounce,
        Transport::NativeP2p => rs::Transport::NativeP2p,
        Transport::Nccl => rs::Transport::Nccl,
    }
}

/// The runtime transport a receipt names.
pub fn transport_of(t: rs::Transport) -> Transport {
    match t {
        rs::Transport::HostBounce => Transport::HostBounce,
        rs::Transport::NativeP2p => Transport::NativeP2p,
        rs::Transport::Nccl => Transport::Nccl,
    }
}

/// What evaluating a job produced before it becomes a receipt.
#[derive(Clone)]
pub(crate) struct Evaluation {
    pub verdict: Verdict,
    pub reason: Option<String>,
    pub gates: Vec<GateResult>,
    pub divergence: Option<FirstDivergence>,
    pub errors: Vec<gate::SeamError>,
    pub near_ties: Vec<gate::NearTie>,
    pub record: Option<Record>,
    /// The byte-integrity probe of the run's transport.
    pub probe: Vec<ProbeResult>,
    /// The coverage of the model and battery (the host oracle's) and the paths the model claims.
    pub coverage: Option<Coverage>,
    pub claims: Vec<String>,
    /// Who counted the run's census (`rs::Evidence::census_witness`): `None` for memra-gates'
    /// own backend in process.
    pub census_witness: Option<String>,
}

impl Default for Evaluation {
    fn default() -> Self {
        Evaluation {
            verdict: Verdict::Pass,
            reason: None,
            gates: Vec::new(),
            divergence: None,
            errors: Vec::new(),
            near_ties: Vec::new(),
            record: None,
            probe: Vec::new(),
            coverage: None,
            claims: Vec::new(),
            census_witness: None,
        }
    }
}

impl Evaluation {
    pub fn error(&mut self, e: memra_runtime::RuntimeError) {
        self.error_text(e.to_string());
    }
    /// A subject run that produced no record: `verdict` is ERROR, or VOID for an engagement
    /// claim the subject's census does not back; `reason` is the subject's.
    pub fn failed(&mut self, verdict: Verdict, reason: &str) {
        self.verdict = verdict;
        self.reason = Some(reason.to_string());
    }
    pub fn error_text(&mut self, text: String) {
        self.verdict = Verdict::Error;
        self.reason = Some(text);
    }
    /// The run's verdict: FAIL if any gate failed, else VOID if engagement failed, else PASS.
    pub fn settle(&mut self) {
        let fail = self.gates.iter().find(|g| g.verdict == Verdict::Fail);
        let void = self.gates.iter().find(|g| g.verdict == Verdict::Void);
        (self.verdict, self.reason) = match (fail, void) {
            (Some(g), _) => (Verdict::Fail, Some(format!("{}: {}", g.gate.as_str(), g.detail))),
            (None, Some(g)) => (Verdict::Void, Some(format!("{}: {}", g.gate.as_str(), g.detail))),
            (None, None) => (Verdict::Pass, None),
        };
    }
}

fn to_divergence(d: &FirstDivergence) -> rs::Divergence {
    let e = d.element.filter(|_| d.reproduced && d.copy_from.is_none());
    rs::Divergence {
        prompt: d.prompt,
        step: d.step,
        layer: d.layer,
        seam: d.seam.name().into(),
        at: if d.copy_from.is_some() { rs::DivergenceAt::Copy } else { rs::DivergenceAt::Seam },
        src_rank: d.copy_from,
        rank: e.and_then(|e| e.rank).or(d.rank),
        // A copy is located at the copy (no element); reproduced: the other run had the fault.
        reproduced: if d.copy_from.is_some() { d.reproduced } else { e.is_some() },
        element: e.map(|e| e.index),
        oracle_bits: e.map(|e| format!("0x{:08x}", e.oracle_bits)),
        observed_bits: e.map(|e| format!("0x{:08x}", e.observed_bits)),
        ulp: e.map(|e| e.ulp),
        lane: d.lane,
    }
}

/// The receipt form of coverage counters.
pub(crate) fn coverage_evidence(c: &Coverage) -> BTreeMap<String, rs::CoverageCount> {
    c.iter()
        .map(|(path, pc)| {
            let first = pc.first.map(|f| rs::SeamPlace {
                prompt: f.prompt,
                step: f.step,
                layer: f.layer,
                seam: f.seam.name().to_string(),
            });
            (path.clone(), rs::CoverageCount { count: pc.count, first })
        })
        .collect()
}

/// Where a job's canary plants its defect, when the place is chosen per run (the flip canary).
fn planted_of(job: &Job) -> Option<rs::Planted> {
    match job.doors.canary {
        Some(Canary::FlipBit { layer, seam, step, element }) => Some(rs::Planted {
            canary: "canary_flip_bit".into(),
            layer,
            seam: seam.name().into(),
            step,
            element: element as u64,
        }),
        _ => None,
    }
}

/// The receipt of a job from what its evaluation produced; `subject_version` is the version of
/// the subject that ran it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_receipt(
    kernel_digest: &str,
    subject_version: &str,
    job: &Job,
    model: &rs::ModelEvidence,
    battery: &Battery,
    ev: Evaluation,
    started_at_unix_ms: u64,
    wall_ms: f64,
) -> Receipt {
    let config = config_evidence(job, model, battery);
    let record = ev.record.clone().unwrap_or_default();
    let evidence = rs::Evidence {
        config,
        build: rs::BuildEvidence {
            kernel_source_digest: kernel_digest.to_string(),
            nvrtc_options: record.build_options.clone(),
            subject_version: Some(subject_version.to_string()),
        },
        verdict: ev.verdict,
        reason: ev.reason.clone(),
        gates: ev.gates.clone(),
        engaged: record.engaged.clone(),
        census: record.census.counts().clone(),
        census_witness: ev.census_witness.clone(),
        coverage: ev.coverage.as_ref().map(coverage_evidence).unwrap_or_default(),
        claims: {
            let mut c = ev.claims.clone();
            c.sort();
            c.dedup();
            c
        },
        planted: planted_of(job),
        first_divergence: ev.divergence.as_ref().map(to_divergence),
        digests: digests_of(&record),
        tokens: record.tokens.clone(),
        token_tape_digest: memra_receipts::token_tape_digest(&record.tokens),
        error_budget: ev
            .errors
            .iter()
            .map(|e| rs::SeamError {
                layer: e.layer,
                seam: e.seam.name().into(),
                max_ulp: e.max_ulp,
                max_rel: if e.max_rel.is_finite() { e.max_rel } else { f64::MAX },
            })
            .collect(),
        near_ties: ev
            .near_ties
            .iter()
            .map(|t| rs::NearTie {
                prompt: t.prompt,
                step: t.token_index,
                margin: t.margin,
                oracle_token: t.oracle_token,
                observed_token: t.run_token,
            })
            .collect(),
        performance: None,
    };
    let measurements = rs::Measurements {
        latency: latencies_of(&record),
        wall_ms,
        host: host_description(),
        device: if job.backend == BackendKind::Cuda { Some(record.backend.clone()) } else { None },
        p2p_probe: ev
            .probe
            .iter()
            .map(|p| rs::ProbeEntry {
                transport: wire_transport(job.transport),
                src: p.src,
                dst: p.dst,
                bytes: p.bytes as u64,
                bad_words: p.bad_words as u64,
                status: match (&p.no_peer_access, p.bad_words) {
                    (Some(_), _) => rs::ProbeStatus::NoPeerAccess,
                    (None, 0) => rs::ProbeStatus::Ok,
                    (None, _) => rs::ProbeStatus::Corrupt,
                },
            })
            .collect(),
        started_at_unix_ms,
        extra: BTreeMap::new(),
    };
    Receipt::new(ReceiptKind::Run, evidence, measurements)
}

/// A receipt for a record that ran outside the gates (e.g. `bench`), of the subject version
/// `subject_version`: PASS, no gates; callers set the verdict, gates and claim they establish.
pub fn receipt_for_record(
    kernel_digest: &str,
    subject_version: &str,
    job: &Job,
    model: &rs::ModelEvidence,
    battery: &Battery,
    record: &Record,
    wall_ms: f64,
) -> Receipt {
    let ev = Evaluation { record: Some(record.clone()), ..Evaluation::default() };
    build_receipt(kernel_digest, subject_version, job, model, battery, ev, now_ms(), wall_ms)
}

/// The configuration evidence (run identity) of a job.
pub fn config_evidence(job: &Job, model: &rs::ModelEvidence, battery: &Battery) -> rs::RunConfigEvidence {
    rs::RunConfigEvidence {
        subject: job.subject.clone(),
        backend: wire_backend(job.backend),
        tp: job.tp,
        transport: wire_transport(job.transport),
        doors: job.doors_env.clone(),
        model: model.clone(),
        battery_digest: battery_digest(battery),
        oracle: match job.backend {
            BackendKind::Host => "tp1 host-bounce defaults on host".into(),
            BackendKind::Cuda => "tp1 host-bounce defaults on cuda (device-host gated against host)".into(),
        },
        // Absent for one token of one session per pass: single-token run ids are unchanged.
        batch: (job.pass.batch > 1).then_some(job.pass.batch),
        columns: (job.pass.columns > 1).then_some(job.pass.columns),
    }
}

pub(crate) fn digests_of(r: &Record) -> rs::SeamDigests {
    let columns = (0..r.seams_per_step())
        .map(|i| {
            let (layer, seam) = Record::seam_at(r.n_layers, i);
            memra_receipts::seam_column(layer, seam.name())
        })
        .collect();
    let rows = r
        .digests
        .iter()
        .enumerate()
        .flat_map(|(prompt, steps)| {
            steps.iter().enumerate().map(move |(step, row)| rs::DigestRow {
                prompt,
                step,
                digests: row.iter().map(|d| memra_receipts::digest_hex(*d)).collect(),
            })
        })
        .collect();
    rs::SeamDigests { columns, rows }
}

/// Latency per layer × seam; the first decode step of the run is warm-up and not counted.
pub(crate) fn latencies_of(r: &Record) -> Vec<rs::SeamLatency> {
    r.timings_ns
        .iter()
        .enumerate()
        .filter_map(|(i, samples)| {
            let (layer, seam) = Record::seam_at(r.n_layers, i);
            let timed = samples.get(1..).filter(|s| !s.is_empty())?;
            Some(rs::SeamLatency::new(layer, seam.name(), rs::LatencyStats::from_samples(timed)?))
        })
        .collect()
}

/// Stable digest of the battery (prompts and generation length).
pub fn battery_digest(b: &Battery) -> String {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(b.gen_tokens as u64).to_le_bytes());
    for p in &b.prompts {
        bytes.extend_from_slice(&(p.len() as u64).to_le_bytes());
        for t in p {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
    }
    format!("{:016x}", memra_receipts::fnv1a64(&bytes))
}

fn host_description() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("{} {} ({cores} cores)", std::env::consts::OS, std::env::consts::ARCH)
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The configuration a receipt ran, in registry terms.
pub fn configuration_of(registry: &Registry, r: &Receipt) -> Configuration {
    let c = &r.evidence.config;
    let backend = backend_of(c.backend);
    let transport = transport_of(c.transport);
    let doors = c
        .doors
        .iter()
        .filter(|(_, on)| **on)
        .map(|(env, _)| registry.by_env(env).map_or_else(|| env.clone(), |d| d.id.clone()))
        .collect();
    Configuration { backend, tp: c.tp, transport, doors, batch: c.batch.unwrap_or(1), columns: c.columns.unwrap_or(1) }
}
