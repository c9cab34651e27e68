//! Running jobs through the gates (docs/DESIGN.md §4.2, §5): the oracles and caches one plan
//! shares ([`Suite`]), how one job is evaluated (`evaluate`), and how a list of jobs is
//! scheduled over workers with resume and progress (`schedule`). The gates that need runs of
//! their own live beside: the census baselines of engagement (`census`), the localisation of a
//! failure (`locate`), the byte-integrity probe (`probe`) and the f64 reference check, once per
//! model and battery (`reference`); where the time goes is `phases`.
//!
//! Nothing is computed twice per plan: every reference record (the host oracle, the CUDA TP1
//! baseline, NVFP4 and captured oracles, class and census baselines, the f64 reference check) is
//! computed once and kept, a class baseline job's own run serves as its class's baseline, and
//! every run of the built-in runtime goes through its pool of prepared backends.
//!
//! A job arrives resolved against the registry (`crate::job`), so nothing here reads doors.toml.
//! The jobs run on a `&dyn` [`Subject`]; the oracles always run on the built-in runtime
//! ([`Builtin`]), whatever the subject under test is (docs/DESIGN.md §10).

mod census;
mod determinism;
mod evaluate;
mod locate;
mod memo;
mod phases;
mod probe;
mod reference;
mod schedule;
mod shape_rules;

pub use census::{baseline_ids, unshared_baselines};
pub use phases::{Phase, PhaseTimes};
pub use probe::probe_sizes;
pub(crate) use reference::first_failure as reference_first_failure;
pub use schedule::{clock, Progress, SuiteRun, WriteFailure};

use crate::gate;
use crate::job::Job;
use crate::receipt::{self, Evaluation};
use crate::subject::{Builtin, RunSpec, Subject, SubjectError};
use memra_receipts::schema as rs;
use memra_receipts::Receipt;
use memra_runtime::backend::{BackendKind, ProbeResult};
use memra_runtime::record::Record;
use memra_runtime::{ExpertFormat, RuntimeError, Transport};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

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
    /// How progress is shown while jobs run.
    pub progress: Progress,
    /// Milliseconds spent generating or reading the model (receipts' `phase_generate_ms`).
    pub generate_ms: f64,
}

/// The oracles and caches shared by every job of one suite.
pub struct Suite<'a> {
    /// The built-in runtime on the plan's model and battery: every oracle runs here.
    runtime: &'a Builtin,
    /// What the jobs run on (the built-in runtime itself, or an external subject).
    subject: &'a dyn Subject,
    opts: SuiteOptions,
    /// TP1, host-bounce, every door at default, host backend.
    oracle: Record,
    /// The CUDA TP1 host-bounce default run, when any job runs on CUDA.
    cuda_baseline: Mutex<Option<Result<Record, String>>>,
    /// NUMERIC-CLASS class baselines: (door variables, backend) → the door set's teacher-forced
    /// record at its baseline TP and transport.
    class_baselines: memo::Memo<ClassKey, Result<Record, String>>,
    /// The oracle with full captures of prompt 0 (error budgets), per expert format.
    oracle_captured: Mutex<HashMap<ExpertFormat, Record>>,
    /// The canonical program on NVFP4 expert banks (the oracle of NVFP4 doors).
    nvfp4_oracle: Mutex<Option<Result<Record, String>>>,
    /// The byte-integrity probe per (backend, TP, transport), run once before the first job
    /// over that transport at that TP size.
    probes: Mutex<ProbeCache>,
    /// The run of each configuration with a door off, captures dropped: the door's census and
    /// identity baseline (`census`).
    census_baselines: memo::Memo<census::BaselineKey, Result<Record, String>>,
    /// The f64 reference check of the oracle record, once per suite (`reference`).
    reference: Mutex<Option<gate::Outcome>>,
    /// Milliseconds the host oracle took (receipts' `phase_plan_oracle_ms`).
    oracle_ms: f64,
    /// What each worker is doing, and the phase times of its job.
    activities: phases::Activities,
}

/// A class baseline's key: the door variables of the set, and the backend.
type ClassKey = (Vec<String>, BackendKind);

/// Probe results per (backend, TP size, transport).
type ProbeCache = HashMap<(BackendKind, usize, Transport), Result<Vec<ProbeResult>, String>>;

/// Whether `job`'s runs are teacher-forced (with the oracle of its expert format) and capture all
/// of prompt 0: a NUMERIC job's are (argmax tape and error budget), every other job's run free.
/// The gated runs (`evaluate`) and the plan's count of baseline runs (`census`) both ask here.
fn forced_and_captured(job: &Job) -> bool {
    matches!(job.class, crate::job::JobClass::Numeric { .. })
}

/// The expert format a job's doors imply (NVFP4_EP2 and NVFP4_DEV_ROUTES run on NVFP4 banks).
fn format_of(job: &Job) -> ExpertFormat {
    census::format_of_doors(job.doors)
}

impl<'a> Suite<'a> {
    /// Build the suite: computes the host oracle once, on the built-in runtime.
    pub fn new(runtime: &'a Builtin, subject: &'a dyn Subject, opts: SuiteOptions) -> Result<Suite<'a>, RuntimeError> {
        if opts.progress != Progress::Off {
            eprintln!("memra-gates: oracle: host TP1 host-bounce, every door at default …");
        }
        let t = std::time::Instant::now();
        let (oracle, times) = runtime.run_timed(RunSpec::oracle(BackendKind::Host, ExpertFormat::E4m3), &|_| {})?;
        let oracle_ms = t.elapsed().as_secs_f64() * 1e3;
        if opts.progress != Progress::Off {
            eprintln!(
                "memra-gates: oracle ready in {} (upload {}, run {})",
                clock(oracle_ms / 1e3),
                clock(times.upload_ms / 1e3),
                clock(times.run_ms / 1e3)
            );
        }
        Ok(Suite {
            oracle_ms,
            activities: phases::Activities::default(),
            runtime,
            subject,
            opts,
            oracle,
            cuda_baseline: Mutex::new(None),
            class_baselines: memo::Memo::new(),
            oracle_captured: Mutex::new(HashMap::new()),
            nvfp4_oracle: Mutex::new(None),
            probes: Mutex::new(HashMap::new()),
            census_baselines: memo::Memo::new(),
            reference: Mutex::new(None),
        })
    }

    pub fn oracle(&self) -> &Record {
        &self.oracle
    }

    /// The coverage paths the subject's model claims (`memra_runtime::model::edge::claims_of`).
    pub fn claims(&self) -> Vec<String> {
        memra_runtime::model::edge::claims_of(&self.runtime.model.config.preset).iter().map(|s| s.to_string()).collect()
    }

    fn cuda_baseline(&self) -> Result<Record, String> {
        let mut slot = self.cuda_baseline.lock().expect("cuda baseline lock");
        slot.get_or_insert_with(|| {
            self.subject_as(Phase::Oracle, RunSpec::oracle(BackendKind::Cuda, ExpertFormat::E4m3))
                .map_err(|e| e.to_string())
        })
        .clone()
    }

    /// The oracle a NUMERIC job is held to: the canonical program (host TP1 host-bounce, doors
    /// at default) on the same expert storage as the job.
    fn numeric_oracle(&self, job: &Job) -> Result<Record, String> {
        match format_of(job) {
            ExpertFormat::E4m3 => Ok(self.oracle.clone()),
            ExpertFormat::Nvfp4 => {
                let mut slot = self.nvfp4_oracle.lock().expect("nvfp4 oracle lock");
                slot.get_or_insert_with(|| {
                    self.runtime_as(Phase::Oracle, RunSpec::oracle(BackendKind::Host, ExpertFormat::Nvfp4))
                        .map_err(|e| e.to_string())
                })
                .clone()
            }
        }
    }

    /// The class baselines' key of `job`'s door set.
    fn class_key(job: &Job) -> ClassKey {
        (job.doors_env.keys().cloned().collect(), job.backend)
    }

    fn class_baseline(&self, job: &Job, oracle: &Record) -> Result<Record, String> {
        self.class_baselines.get_or_compute(Self::class_key(job), || {
            let spec = RunSpec {
                backend: job.backend,
                tp: job.baseline_tp,
                transport: job.baseline_transport,
                doors: job.doors,
                door_vars: job.doors_env.clone(),
                format: format_of(job),
                forced: Some(oracle),
                capture: vec![],
                // The class baseline is the door set's single-token fresh tape: a run of several
                // rows or columns must equal it (batch invariance, verify = decode).
                pass: memra_runtime::PassShape::SINGLE,
                // Only its values are read (RunSpec::timing).
                timing: memra_runtime::Timing::Off,
            };
            self.subject_as(Phase::Oracle, spec).map_err(|e| e.to_string())
        })
    }

    /// A class baseline job's own first run IS the class baseline (the same configuration, forced
    /// by the same oracle; its prompt-0 captures change no digest): kept, so the other jobs of its
    /// class do not run it again. (The baseline job gets no class-identity gate, so nothing
    /// compares the record with itself.)
    fn keep_class_baseline(&self, job: &Job, first: &Record) {
        if job.is_class_baseline() {
            self.class_baselines.offer(Self::class_key(job), || {
                let mut r = first.clone();
                r.captures.clear();
                Ok(r)
            });
        }
    }

    /// Run `spec` on the subject under test with this thread's job in `phase` (in the upload
    /// phase while a prepared backend is being made).
    fn subject_as(&self, phase: Phase, spec: RunSpec) -> Result<Record, SubjectError> {
        self.in_phase(phase, |uploading| self.subject.run_observed(spec, uploading))
    }

    /// Run `spec` on the built-in runtime (the oracles) with this thread's job in `phase`.
    fn runtime_as(&self, phase: Phase, spec: RunSpec) -> Result<Record, RuntimeError> {
        self.in_phase(phase, |uploading| self.runtime.run_timed(spec, uploading).map(|(r, _)| r))
    }

    /// `f` with this thread's job in `phase` (upload while `f` says it uploads), then back in the
    /// phase it was in.
    fn in_phase<T>(&self, phase: Phase, f: impl FnOnce(&dyn Fn(bool)) -> T) -> T {
        let before = self.activities.enter(phase);
        let acts = &self.activities;
        let r = f(&|uploading| {
            acts.enter(if uploading { Phase::Upload } else { phase });
        });
        if let Some(p) = before {
            self.activities.enter(p);
        }
        r
    }

    fn oracle_captured(&self, format: ExpertFormat) -> Result<Record, RuntimeError> {
        let mut slot = self.oracle_captured.lock().expect("oracle capture lock");
        if let Some(r) = slot.get(&format) {
            return Ok(r.clone());
        }
        let mut spec = RunSpec::oracle(BackendKind::Host, format);
        spec.capture = gate::all_keys_of_prompt(&self.oracle, 0);
        let r = self.runtime_as(Phase::Oracle, spec)?;
        slot.insert(format, r.clone());
        Ok(r)
    }

    /// The reference an identity job is compared with: the host oracle, or the CUDA TP1 record.
    fn reference_for(&self, job: &Job) -> Result<Record, String> {
        match job.backend {
            BackendKind::Host => Ok(self.oracle.clone()),
            BackendKind::Cuda => self.cuda_baseline(),
        }
    }

    /// The evidence of a job's configuration (its run identity).
    pub fn config_evidence(&self, job: &Job) -> rs::RunConfigEvidence {
        receipt::config_evidence(job, &self.runtime.model_evidence, &self.runtime.battery)
    }

    fn receipt(
        &self,
        job: &Job,
        ev: Evaluation,
        started_at_unix_ms: u64,
        wall_ms: f64,
        times: Option<PhaseTimes>,
    ) -> Receipt {
        let s = self.runtime;
        let mut r = receipt::build_receipt(
            &self.opts.kernel_digest,
            self.subject.version(),
            job,
            &s.model_evidence,
            &s.battery,
            ev,
            started_at_unix_ms,
            wall_ms,
        );
        // Where the time went (volatile measurements, never evidence): the plan's one-off work,
        // and this job's phases (jobs that ran).
        let extra = &mut r.measurements.extra;
        extra.insert(Phase::Generate.key(), self.opts.generate_ms);
        extra.insert("phase_plan_oracle_ms".into(), self.oracle_ms);
        if let Some(t) = times {
            for p in Phase::JOB {
                extra.insert(p.key(), t.get(p));
            }
        }
        // A launch over several processes says so in the volatile part (the evidence stays the
        // single-process run's): `processes` on every receipt, `ranks_per_process` on the runs
        // that spanned them.
        if let Some(d) = &s.dist {
            let n = d.spec.processes;
            r.measurements.extra.insert("processes".into(), n as f64);
            if s.spans_processes(job.backend, job.transport) && job.not_run.is_none() {
                r.measurements.extra.insert("ranks_per_process".into(), (job.tp / n) as f64);
            }
        }
        // How the built-in runtime's host ranks ran (volatile: the values are the same either way,
        // the seam latencies are not): the rank threads, 0 when inline on the job's thread.
        if job.backend == BackendKind::Host && self.subject.name() == crate::subject::BUILTIN_NAME {
            let threads = match s.host_ranks.for_tp(job.tp) {
                memra_runtime::backend::HostRanks::Threads => job.tp,
                memra_runtime::backend::HostRanks::Inline => 0,
            };
            r.measurements.extra.insert("host_rank_threads".into(), threads as f64);
        }
        r
    }
}

/// A built-in runtime job for the suite's unit tests: host backend, host-bounce, IDENTITY class,
/// its class baseline at TP1, no engagement or census declarations.
#[cfg(test)]
pub(crate) fn test_job(tp: usize, doors: memra_runtime::DoorSet) -> Job {
    Job {
        subject: crate::subject::BUILTIN_NAME.to_string(),
        doors_env: std::collections::BTreeMap::new(),
        doors,
        class: crate::job::JobClass::Identity,
        engagement: std::collections::BTreeMap::new(),
        census: Vec::new(),
        tp,
        transport: Transport::HostBounce,
        backend: BackendKind::Host,
        baseline_tp: 1,
        baseline_transport: Transport::HostBounce,
        not_run: None,
        canary_held_to_doors: false,
        pass: memra_runtime::PassShape::SINGLE,
    }
}
