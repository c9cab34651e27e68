//! Running jobs through the gates: oracles, baselines, determinism re-runs, localisation, and
//! one receipt per job (docs/DESIGN.md §4.2, §5).
//!
//! A job is one configuration of the matrix (door set × TP × transport × backend), already
//! resolved against the registry by the caller, so this module knows nothing of doors.toml.

use crate::gate::{self, FirstDivergence, GateOutcome};
use memra_receipts::schema::{self as rs, Gate, GateResult, Verdict};
use memra_receipts::{Receipt, ReceiptKind};
use memra_runtime::backend::{open, open_with, BackendKind, OpenOptions, ProbeResult, PROBE_SIZES_BYTES};
use memra_runtime::model::Model;
use memra_runtime::record::{CaptureKey, Record};
use memra_runtime::{Battery, DoorSet, ExpertFormat, RunConfig, RuntimeError, Transport};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

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
    /// Explicit door settings as receipts record them (env name → on).
    pub doors_env: BTreeMap<String, bool>,
    pub doors: DoorSet,
    pub class: JobClass,
    /// Door id → engagement counter that must be > 0.
    pub engagement: BTreeMap<String, String>,
    pub tp: usize,
    pub transport: Transport,
    pub backend: BackendKind,
    /// TP size of the class baseline of a NUMERIC-CLASS job (the smallest TP its doors allow).
    pub baseline_tp: usize,
    /// Transport of the class baseline (host-bounce unless the doors do not allow it).
    pub baseline_transport: Transport,
    /// When set, the job is NOT-APPLICABLE (or SKIP) for this reason and does not run.
    pub not_run: Option<(Verdict, String)>,
}

/// The model and battery every job decodes.
pub struct Subject {
    pub model: Model,
    pub model_evidence: rs::ModelEvidence,
    pub battery: Battery,
    /// Fault injection: bytes held on every CUDA device before each run (`--cuda-reserve-gib`).
    pub device_reserve_bytes: usize,
    /// Set when this process is one of several that share the ranks (`--process P/N`): CUDA
    /// runs over the nccl transport then span the processes (`memra_runtime::backend::dist`).
    pub dist: Option<crate::dist::DistContext>,
}

impl Subject {
    /// Whether a run of (backend, transport) spans the processes of a distributed launch; every
    /// other run (oracles, TP1 baselines, reference re-runs) stays inside this process.
    pub fn spans_processes(&self, backend: BackendKind, transport: Transport) -> bool {
        self.dist.is_some() && backend == BackendKind::Cuda && transport == Transport::Nccl
    }
}

/// How a suite runs.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Where receipts go (written atomically as each job finishes); none = keep in memory.
    pub out_dir: Option<PathBuf>,
    /// Skip jobs whose complete receipt already exists in `out_dir`.
    pub resume: bool,
    /// Parallel host workers (the host backend's ranks are threads; several jobs fill the cores).
    pub workers: usize,
    pub kernel_digest: String,
    /// Print a progress line per finished job (terminals only).
    pub progress: bool,
}

/// The oracles and caches shared by every job of one suite.
pub struct Suite<'a> {
    subject: &'a Subject,
    opts: SuiteOptions,
    /// TP1, host-bounce, every door at default, host backend.
    oracle: Record,
    /// The CUDA TP1 host-bounce default run, when any job runs on CUDA.
    cuda_baseline: Mutex<Option<Result<Record, String>>>,
    /// NUMERIC-CLASS class baselines: (doors, backend) → TP1 host-bounce teacher-forced record.
    class_baselines: Mutex<HashMap<(DoorSet, BackendKind), Result<Record, String>>>,
    /// The oracle with full captures of prompt 0 (error budgets), per expert format.
    oracle_captured: Mutex<HashMap<ExpertFormat, Record>>,
    /// The canonical program on NVFP4 expert banks (the oracle of NVFP4 doors).
    nvfp4_oracle: Mutex<Option<Result<Record, String>>>,
    /// The byte-integrity probe per (backend, TP), run once before the first native-P2P job.
    probes: Mutex<ProbeCache>,
}

/// Probe results per (backend, TP size).
type ProbeCache = HashMap<(BackendKind, usize), Result<Vec<ProbeResult>, String>>;

/// Probe sizes: docs/DESIGN.md §3.5's ladder on devices; on the host backend the 64 MiB rung is left
/// out (arena-to-arena copies are plain memcpy, and 56 ordered pairs × 64 MiB would dominate a
/// CI run) — the receipt lists exactly the sizes probed.
fn probe_sizes(backend: BackendKind) -> &'static [usize] {
    match backend {
        BackendKind::Cuda => &PROBE_SIZES_BYTES,
        BackendKind::Host => &PROBE_SIZES_BYTES[..3],
    }
}

/// Run one configuration of the subject.
#[allow(clippy::too_many_arguments)]
pub fn run_subject(
    subject: &Subject,
    backend: BackendKind,
    tp: usize,
    transport: Transport,
    doors: DoorSet,
    format: ExpertFormat,
    forced: Option<&Record>,
    capture: Vec<CaptureKey>,
) -> Result<Record, RuntimeError> {
    let mut cfg = RunConfig::new(tp, transport, subject.battery.clone())?;
    cfg.doors = doors;
    cfg.expert_format = format;
    cfg.forced_tokens = forced.map(|r| r.tokens.clone());
    cfg.capture = capture;
    let opts = OpenOptions { device_reserve_bytes: subject.device_reserve_bytes, rank0_merge: doors.rank0_merge };
    let mut b = match &subject.dist {
        Some(d) if subject.spans_processes(backend, transport) => {
            let mut rendezvous = d.rendezvous.lock().unwrap_or_else(|p| p.into_inner());
            memra_runtime::backend::open_distributed(tp, &mut rendezvous, &opts)?
        }
        _ => open_with(backend, tp, &opts)?,
    };
    memra_runtime::program::run(&subject.model, &cfg, b.as_mut())
}

fn gate_result(gate: Gate, outcome: &GateOutcome, fail_as: Verdict) -> GateResult {
    match outcome {
        Ok(d) => GateResult { gate, verdict: Verdict::Pass, detail: d.clone() },
        Err(d) => GateResult { gate, verdict: fail_as, detail: d.clone() },
    }
}

impl<'a> Suite<'a> {
    /// Build the suite: computes the host oracle once.
    pub fn new(subject: &'a Subject, opts: SuiteOptions) -> Result<Suite<'a>, RuntimeError> {
        let oracle = run_subject(
            subject,
            BackendKind::Host,
            1,
            Transport::HostBounce,
            DoorSet::default(),
            ExpertFormat::E4m3,
            None,
            vec![],
        )?;
        Ok(Suite {
            subject,
            opts,
            oracle,
            cuda_baseline: Mutex::new(None),
            class_baselines: Mutex::new(HashMap::new()),
            oracle_captured: Mutex::new(HashMap::new()),
            nvfp4_oracle: Mutex::new(None),
            probes: Mutex::new(HashMap::new()),
        })
    }

    pub fn oracle(&self) -> &Record {
        &self.oracle
    }

    fn cuda_baseline(&self) -> Result<Record, String> {
        let mut slot = self.cuda_baseline.lock().expect("cuda baseline lock");
        slot.get_or_insert_with(|| {
            run_subject(
                self.subject,
                BackendKind::Cuda,
                1,
                Transport::HostBounce,
                DoorSet::default(),
                ExpertFormat::E4m3,
                None,
                vec![],
            )
            .map_err(|e| e.to_string())
        })
        .clone()
    }

    /// The expert format a job's doors imply (NVFP4_EP2 runs on NVFP4 banks).
    fn format_of(job: &Job) -> ExpertFormat {
        if job.doors.nvfp4_ep2 {
            ExpertFormat::Nvfp4
        } else {
            ExpertFormat::E4m3
        }
    }

    /// The oracle a NUMERIC job is held to: the canonical program (host TP1 host-bounce, doors
    /// at default) on the same expert storage as the job.
    fn numeric_oracle(&self, job: &Job) -> Result<Record, String> {
        match Self::format_of(job) {
            ExpertFormat::E4m3 => Ok(self.oracle.clone()),
            ExpertFormat::Nvfp4 => {
                let mut slot = self.nvfp4_oracle.lock().expect("nvfp4 oracle lock");
                slot.get_or_insert_with(|| {
                    run_subject(
                        self.subject,
                        BackendKind::Host,
                        1,
                        Transport::HostBounce,
                        DoorSet::default(),
                        ExpertFormat::Nvfp4,
                        None,
                        vec![],
                    )
                    .map_err(|e| e.to_string())
                })
                .clone()
            }
        }
    }

    fn class_baseline(&self, job: &Job, oracle: &Record) -> Result<Record, String> {
        let key = (job.doors, job.backend);
        if let Some(r) = self.class_baselines.lock().expect("baseline lock").get(&key) {
            return r.clone();
        }
        let r = run_subject(
            self.subject,
            job.backend,
            job.baseline_tp,
            job.baseline_transport,
            job.doors,
            Self::format_of(job),
            Some(oracle),
            vec![],
        )
        .map_err(|e| e.to_string());
        self.class_baselines.lock().expect("baseline lock").insert(key, r.clone());
        r
    }

    fn oracle_captured(&self, format: ExpertFormat) -> Result<Record, RuntimeError> {
        let mut slot = self.oracle_captured.lock().expect("oracle capture lock");
        if let Some(r) = slot.get(&format) {
            return Ok(r.clone());
        }
        let keys = gate::all_keys_of_prompt(&self.oracle, 0);
        let r = run_subject(
            self.subject,
            BackendKind::Host,
            1,
            Transport::HostBounce,
            DoorSet::default(),
            format,
            None,
            keys,
        )?;
        slot.insert(format, r.clone());
        Ok(r)
    }

    /// The evidence of a job's configuration (its run identity).
    pub fn config_evidence(&self, job: &Job) -> rs::RunConfigEvidence {
        config_evidence(job, &self.subject.model_evidence, &self.subject.battery)
    }

    /// Run every job (host jobs on `workers` threads, CUDA jobs one at a time) and return the
    /// receipts in job order. Receipts are written as each job finishes.
    pub fn run_all(&self, jobs: &[Job]) -> Vec<Receipt> {
        let done: BTreeMap<String, Verdict> = match (&self.opts.out_dir, self.opts.resume) {
            (Some(dir), true) => match memra_receipts::store::scan_dir(dir) {
                Ok(scan) => {
                    // Temp files are writes a killed run never renamed into place: garbage.
                    for t in &scan.temp_files {
                        eprintln!("memra-gates: --resume removes an unfinished write {}", t.display());
                        let _ = std::fs::remove_file(t);
                    }
                    for b in &scan.broken {
                        eprintln!("memra-gates: --resume re-runs a receipt that does not read: {b}");
                    }
                    scan.complete()
                }
                Err(_) => BTreeMap::new(),
            },
            _ => BTreeMap::new(),
        };
        let results: Vec<Mutex<Option<Receipt>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let finished = std::sync::atomic::AtomicUsize::new(0);
        let start = Instant::now();
        let work = |host_only: bool| loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if i >= jobs.len() {
                break;
            }
            let job = &jobs[i];
            if host_only != (job.backend == BackendKind::Host) {
                continue;
            }
            let id = rs::run_id(&self.config_evidence(job));
            let receipt = match (done.contains_key(&id), &self.opts.out_dir) {
                (true, Some(dir)) => memra_receipts::json::read_receipt(&memra_receipts::store::receipt_path(dir, &id))
                    .unwrap_or_else(|_| self.evaluate(job)),
                _ => self.evaluate(job),
            };
            if let Some(dir) = &self.opts.out_dir {
                if !done.contains_key(&id) {
                    if let Err(e) = memra_receipts::store::write_receipt(dir, &receipt) {
                        eprintln!("memra-gates: cannot write the receipt of {}: {e}", receipt.label());
                    }
                }
            }
            let n = finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            if self.opts.progress {
                let elapsed = start.elapsed().as_secs_f64();
                let eta = elapsed / n as f64 * (jobs.len() - n) as f64;
                eprint!("\r[{n}/{}] {:<60} ETA {eta:.0}s   ", jobs.len(), truncate(&receipt.label(), 60));
            }
            *results[i].lock().expect("result slot") = Some(receipt);
        };
        std::thread::scope(|s| {
            for _ in 0..self.opts.workers.max(1) {
                s.spawn(|| work(true));
            }
        });
        next.store(0, std::sync::atomic::Ordering::SeqCst);
        work(false);
        if self.opts.progress {
            eprintln!();
        }
        results.into_iter().map(|m| m.into_inner().expect("result slot").expect("every job ran")).collect()
    }

    /// Evaluate one job: never panics, never aborts the matrix; faults become ERROR receipts.
    pub fn evaluate(&self, job: &Job) -> Receipt {
        let started = now_ms();
        let t0 = Instant::now();
        let mut ev = Evaluation::default();
        if let Some((v, reason)) = &job.not_run {
            ev.verdict = *v;
            ev.reason = Some(reason.clone());
        } else {
            self.gate_job(job, &mut ev);
        }
        self.receipt(job, ev, started, t0.elapsed().as_secs_f64() * 1e3)
    }

    fn reference_for(&self, job: &Job) -> Result<Record, String> {
        match job.backend {
            BackendKind::Host => Ok(self.oracle.clone()),
            BackendKind::Cuda => self.cuda_baseline(),
        }
    }

    fn probe(&self, backend: BackendKind, tp: usize) -> Result<Vec<ProbeResult>, String> {
        let mut probes = self.probes.lock().expect("probe lock");
        probes
            .entry((backend, tp))
            .or_insert_with(|| {
                let mut b = open(backend, tp).map_err(|e| e.to_string())?;
                b.probe(Transport::NativeP2p, probe_sizes(backend)).map_err(|e| e.to_string())
            })
            .clone()
    }

    fn gate_job(&self, job: &Job, ev: &mut Evaluation) {
        if job.transport == Transport::NativeP2p && job.tp > 1 {
            match self.probe(job.backend, job.tp) {
                Err(e) => return ev.error_text(format!("the native-P2P byte-integrity probe could not run: {e}")),
                Ok(results) => {
                    ev.probe = results.clone();
                    if let Some(p) = results.iter().find(|p| p.no_peer_access.is_some()) {
                        ev.verdict = Verdict::Skip;
                        ev.reason = Some(format!(
                            "no peer access from rank {} to rank {}: {}",
                            p.src,
                            p.dst,
                            p.no_peer_access.clone().unwrap_or_default()
                        ));
                        return;
                    }
                    if let Some(p) = results.iter().find(|p| p.bad_words > 0) {
                        return ev.error_text(format!(
                            "the byte-integrity probe found {} wrong words copying {} bytes from rank {} to rank {}: peer copies are corrupt here",
                            p.bad_words, p.bytes, p.src, p.dst
                        ));
                    }
                }
            }
        }
        let numeric = matches!(job.class, JobClass::Numeric { .. });
        let format = Self::format_of(job);
        let oracle = match self.numeric_oracle(job) {
            Ok(o) => o,
            Err(e) => return ev.error_text(format!("the oracle run failed: {e}")),
        };
        let forced = if numeric { Some(&oracle) } else { None };
        let first =
            match run_subject(self.subject, job.backend, job.tp, job.transport, job.doors, format, forced, vec![]) {
                Ok(r) => r,
                Err(e) => return ev.error(e),
            };
        // The determinism re-run also carries full captures of prompt 0 for the error budget.
        let keys = if numeric { gate::all_keys_of_prompt(&first, 0) } else { vec![] };
        let second =
            match run_subject(self.subject, job.backend, job.tp, job.transport, job.doors, format, forced, keys) {
                Ok(r) => r,
                Err(e) => return ev.error(e),
            };
        ev.gates.push(gate_result(Gate::Determinism, &gate::determinism(&first, &second), Verdict::Fail));
        ev.gates.push(gate_result(Gate::NonTriviality, &gate::non_triviality(&first), Verdict::Fail));
        ev.gates.push(gate_result(Gate::Engagement, &gate::engagement(&first, &job.engagement), Verdict::Void));
        if job.backend == BackendKind::Cuda {
            let dh = self.cuda_baseline().and_then(|c| match gate::first_digest_divergence(&self.oracle, &c)? {
                None => Ok("CUDA TP1 equals the host oracle at every layer × seam × step".to_string()),
                Some(d) => Err(format!("CUDA TP1 differs from the host oracle first at {}", describe(&d))),
            });
            ev.gates.push(gate_result(Gate::DeviceHost, &dh, Verdict::Fail));
        }
        match job.class {
            JobClass::Identity | JobClass::Canary => {
                let reference = match self.reference_for(job) {
                    Ok(r) => r,
                    Err(e) => return ev.error_text(format!("the reference run failed: {e}")),
                };
                let outcome = match gate::first_digest_divergence(&reference, &first) {
                    Err(e) => Err(e),
                    Ok(None) if steps(&first) == 0 => Err("no decode step was compared".to_string()),
                    Ok(None) => Ok(format!("{} steps × {} seams bit-identical", steps(&first), first.seams_per_step())),
                    Ok(Some(mut d)) => {
                        d.element = self.localise(job, &d);
                        let text = format!("first divergence at {}", describe(&d));
                        ev.divergence = Some(d);
                        Err(text)
                    }
                };
                ev.gates.push(gate_result(Gate::Identity, &outcome, Verdict::Fail));
            }
            JobClass::Numeric { margin_budget, rel_budget, class_identity } => {
                let (tape, ties) = gate::argmax_tape(&oracle, &first, margin_budget, rel_budget);
                ev.gates.push(gate_result(Gate::ArgmaxTape, &tape, Verdict::Fail));
                ev.near_ties = ties;
                // A door whose registry gate has no class identity gets no such gate: a gate that
                // was not evaluated must not read as passed.
                let class = if !class_identity {
                    None
                } else if job.tp == job.baseline_tp && job.transport == job.baseline_transport {
                    // This run IS the class baseline (the fresh tape): comparing it with itself
                    // would pass vacuously; its reproduction is what the determinism gate checks.
                    None
                } else {
                    Some(self.class_baseline(job, &oracle).and_then(|base| {
                        match gate::first_digest_divergence(&base, &first)? {
                            None => Ok(format!(
                                "bit-identical to the door's TP{} {} class baseline",
                                job.baseline_tp,
                                job.baseline_transport.name()
                            )),
                            Some(d) => Err(format!("differs from the class baseline first at {}", describe(&d))),
                        }
                    }))
                };
                if let Some(class) = class {
                    ev.gates.push(gate_result(Gate::ClassIdentity, &class, Verdict::Fail));
                }
                match self.oracle_captured(format) {
                    Ok(oc) => {
                        let (errors, flips) = gate::error_budget(&oc, &second);
                        let worst = errors.iter().map(|e| e.max_rel).fold(0.0f64, f64::max);
                        let bitwise = errors.iter().all(|e| e.max_ulp == 0);
                        let outcome = if errors.is_empty() {
                            Err("no seam was compared: the error-budget captures are missing".to_string())
                        } else if worst.is_nan() || worst > rel_budget {
                            Err(format!("max normwise relative error {worst:.3e} exceeds the budget {rel_budget:.1e}"))
                        } else {
                            Ok(format!(
                                "max normwise relative error {worst:.3e} within {rel_budget:.1e}; {flips} routing flip(s) excluded{}",
                                if bitwise { "; NOTE: bit-identical to the oracle — the NUMERIC class may be mislabeled" } else { "" }
                            ))
                        };
                        ev.gates.push(gate_result(Gate::ErrorBudget, &outcome, Verdict::Fail));
                        ev.errors = errors;
                    }
                    Err(e) => return ev.error(e),
                }
            }
        }
        ev.record = Some(first);
        ev.settle();
    }

    /// Re-run the reference and the job with a full capture of the divergent seam.
    fn localise(&self, job: &Job, d: &FirstDivergence) -> Option<gate::Element> {
        let key = vec![d.key()];
        let forced = None;
        let e4 = ExpertFormat::E4m3;
        let reference = run_subject(
            self.subject,
            job.backend,
            1,
            Transport::HostBounce,
            DoorSet::default(),
            e4,
            forced,
            key.clone(),
        )
        .ok()?;
        let run = run_subject(self.subject, job.backend, job.tp, job.transport, job.doors, e4, forced, key).ok()?;
        gate::localise(reference.captures.get(&d.key())?, run.captures.get(&d.key())?)
    }

    fn receipt(&self, job: &Job, ev: Evaluation, started_at_unix_ms: u64, wall_ms: f64) -> Receipt {
        let mut r = build_receipt(
            &self.opts,
            job,
            &self.subject.model_evidence,
            &self.subject.battery,
            ev,
            started_at_unix_ms,
            wall_ms,
        );
        // A launch over several processes says so in the volatile part (the evidence stays the
        // single-process run's): `processes` on every receipt, `ranks_per_process` on the runs
        // that spanned them.
        if let Some(d) = &self.subject.dist {
            let n = d.spec.processes;
            r.measurements.extra.insert("processes".into(), n as f64);
            if self.subject.spans_processes(job.backend, job.transport) && job.not_run.is_none() {
                r.measurements.extra.insert("ranks_per_process".into(), (job.tp / n) as f64);
            }
        }
        r
    }
}

/// The receipt of a job from what its evaluation produced.
fn build_receipt(
    opts: &SuiteOptions,
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
            kernel_source_digest: opts.kernel_digest.clone(),
            nvrtc_options: record.build_options.clone(),
        },
        verdict: ev.verdict,
        reason: ev.reason.clone(),
        gates: ev.gates.clone(),
        engaged: record.engaged.clone(),
        first_divergence: ev.divergence.as_ref().and_then(to_divergence),
        digests: digests_of(&record),
        tokens: record.tokens.clone(),
        token_tape_digest: rs::token_tape_digest(&record.tokens),
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

/// A receipt for a record that ran outside the gates (e.g. `bench`): PASS, no gates; callers
/// set the verdict, gates and claim they establish.
pub fn receipt_for_record(
    opts: &SuiteOptions,
    job: &Job,
    model: &rs::ModelEvidence,
    battery: &Battery,
    record: &Record,
    wall_ms: f64,
) -> Receipt {
    let ev = Evaluation { record: Some(record.clone()), ..Evaluation::default() };
    build_receipt(opts, job, model, battery, ev, now_ms(), wall_ms)
}

/// The configuration evidence (run identity) of a job.
pub fn config_evidence(job: &Job, model: &rs::ModelEvidence, battery: &Battery) -> rs::RunConfigEvidence {
    rs::RunConfigEvidence {
        subject: "memra-runtime".into(),
        backend: match job.backend {
            BackendKind::Host => rs::Backend::Host,
            BackendKind::Cuda => rs::Backend::Cuda,
        },
        tp: job.tp,
        transport: match job.transport {
            Transport::HostBounce => rs::Transport::HostBounce,
            Transport::NativeP2p => rs::Transport::NativeP2p,
            Transport::Nccl => rs::Transport::Nccl,
        },
        doors: job.doors_env.clone(),
        model: model.clone(),
        battery_digest: battery_digest(battery),
        oracle: match job.backend {
            BackendKind::Host => "tp1 host-bounce defaults on host".into(),
            BackendKind::Cuda => "tp1 host-bounce defaults on cuda (device-host gated against host)".into(),
        },
    }
}

/// What evaluating a job produced before it becomes a receipt.
struct Evaluation {
    verdict: Verdict,
    reason: Option<String>,
    gates: Vec<GateResult>,
    divergence: Option<FirstDivergence>,
    errors: Vec<gate::SeamError>,
    near_ties: Vec<gate::NearTie>,
    record: Option<Record>,
    probe: Vec<ProbeResult>,
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
        }
    }
}

impl Evaluation {
    fn error(&mut self, e: RuntimeError) {
        self.error_text(e.to_string());
    }
    fn error_text(&mut self, text: String) {
        self.verdict = Verdict::Error;
        self.reason = Some(text);
    }
    /// The run's verdict: FAIL if any gate failed, else VOID if engagement failed, else PASS.
    fn settle(&mut self) {
        let fail = self.gates.iter().find(|g| g.verdict == Verdict::Fail);
        let void = self.gates.iter().find(|g| g.verdict == Verdict::Void);
        (self.verdict, self.reason) = match (fail, void) {
            (Some(g), _) => (Verdict::Fail, Some(format!("{}: {}", g.gate.as_str(), g.detail))),
            (None, Some(g)) => (Verdict::Void, Some(format!("{}: {}", g.gate.as_str(), g.detail))),
            (None, None) => (Verdict::Pass, None),
        };
    }
}

fn to_divergence(d: &FirstDivergence) -> Option<rs::Divergence> {
    let e = d.element?;
    Some(rs::Divergence {
        prompt: d.prompt,
        step: d.step,
        layer: d.layer,
        seam: d.seam.name().into(),
        rank: e.rank,
        element: e.index,
        oracle_bits: format!("0x{:08x}", e.oracle_bits),
        observed_bits: format!("0x{:08x}", e.observed_bits),
        ulp: e.ulp,
    })
}

/// One line: `L0.o_join p0 s1 [17] r1 0x… → 0x… (1 ulp)`.
pub fn describe(d: &FirstDivergence) -> String {
    let mut s = format!("L{}.{} p{} s{}", d.layer, d.seam.name(), d.prompt, d.step);
    if let Some(e) = d.element {
        let rank = e.rank.map(|r| format!(" r{r}")).unwrap_or_default();
        s += &format!(" [{}]{rank} 0x{:08x}→0x{:08x} ({} ulp)", e.index, e.oracle_bits, e.observed_bits, e.ulp);
    }
    s
}

fn steps(r: &Record) -> usize {
    r.digests.iter().map(|p| p.len()).sum()
}

fn digests_of(r: &Record) -> rs::SeamDigests {
    let columns = (0..r.seams_per_step())
        .map(|i| {
            let (layer, seam) = Record::seam_at(r.n_layers, i);
            rs::seam_column(layer, seam.name())
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
                digests: row.iter().map(|d| rs::digest_hex(*d)).collect(),
            })
        })
        .collect();
    rs::SeamDigests { columns, rows }
}

/// Latency per layer × seam; the first decode step of the run is warm-up and not counted.
fn latencies_of(r: &Record) -> Vec<rs::SeamLatency> {
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
    format!("{:016x}", rs::fnv1a64(&bytes))
}

fn host_description() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("{} {} ({cores} cores)", std::env::consts::OS, std::env::consts::ARCH)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}
