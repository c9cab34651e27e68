//! The subject a plan gates: the model and battery every job decodes, and how one configuration
//! of the built-in runtime is run on it (docs/DESIGN.md §10: the built-in runtime is one subject;
//! the gates only ever see the [`Record`] it produces). Runs in this process share a pool of
//! prepared backends: the weights are uploaded once per backend, options and layout.

use memra_receipts::ModelEvidence;
use memra_runtime::backend::{BackendKind, OpenOptions};
use memra_runtime::model::Model;
use memra_runtime::program::pool::{Pool, RunTimes};
use memra_runtime::record::{CaptureKey, Record};
use memra_runtime::{Battery, DoorSet, ExpertFormat, RunConfig, RuntimeError, Transport};

/// The model and battery every job decodes.
pub struct Subject {
    pub model: Model,
    pub model_evidence: ModelEvidence,
    pub battery: Battery,
    /// Fault injection: bytes held on every CUDA device before each run (`--cuda-reserve-gib`).
    pub device_reserve_bytes: usize,
    /// Set when this process is one of several that share the ranks (`--process P/N`): CUDA
    /// runs over the nccl transport then span the processes (`memra_runtime::backend::dist`).
    pub dist: Option<crate::dist::DistContext>,
    /// Prepared backends of this model, shared by every run of the process.
    pub pool: Pool,
}

/// One configuration of a run: where, how wide, over what, with which doors and expert format;
/// teacher-forced by a record's tokens when given; with full captures of `capture`.
#[derive(Debug, Clone)]
pub struct RunSpec<'r> {
    pub backend: BackendKind,
    pub tp: usize,
    pub transport: Transport,
    pub doors: DoorSet,
    pub format: ExpertFormat,
    pub forced: Option<&'r Record>,
    pub capture: Vec<CaptureKey>,
}

impl RunSpec<'_> {
    /// TP1, host-bounce, every door at default, on `backend`: the oracle's configuration.
    pub fn oracle(backend: BackendKind, format: ExpertFormat) -> RunSpec<'static> {
        RunSpec {
            backend,
            tp: 1,
            transport: Transport::HostBounce,
            doors: DoorSet::default(),
            format,
            forced: None,
            capture: Vec::new(),
        }
    }
}

impl Subject {
    /// Whether a run of (backend, transport) spans the processes of a distributed launch; every
    /// other run (oracles, TP1 baselines, reference re-runs) stays inside this process.
    pub fn spans_processes(&self, backend: BackendKind, transport: Transport) -> bool {
        self.dist.is_some() && backend == BackendKind::Cuda && transport == Transport::Nccl
    }

    /// Run one configuration of the built-in runtime on this subject.
    pub fn run(&self, spec: RunSpec) -> Result<Record, RuntimeError> {
        self.run_timed(spec, &|_| {}).map(|(r, _)| r)
    }

    /// [`Subject::run`], with the time spent uploading weights (0 when a prepared backend was
    /// reused) and running; `uploading(true)` / `uploading(false)` bracket an upload.
    pub fn run_timed(&self, spec: RunSpec, uploading: &dyn Fn(bool)) -> Result<(Record, RunTimes), RuntimeError> {
        let mut cfg = RunConfig::new(spec.tp, spec.transport, self.battery.clone())?;
        cfg.doors = spec.doors;
        cfg.expert_format = spec.format;
        cfg.forced_tokens = spec.forced.map(|r| r.tokens.clone());
        cfg.capture = spec.capture;
        let opts = OpenOptions { device_reserve_bytes: self.device_reserve_bytes, rank0_merge: spec.doors.rank0_merge };
        match &self.dist {
            Some(d) if self.spans_processes(spec.backend, spec.transport) => {
                let t = std::time::Instant::now();
                let mut rendezvous = d.rendezvous.lock().unwrap_or_else(|p| p.into_inner());
                let mut b = memra_runtime::backend::open_distributed(spec.tp, &mut rendezvous, &opts)?;
                let r = memra_runtime::program::run(&self.model, &cfg, b.as_mut())?;
                Ok((r, RunTimes { upload_ms: 0.0, run_ms: t.elapsed().as_secs_f64() * 1e3, reused: false }))
            }
            _ => self.pool.run_observed(&self.model, &cfg, spec.backend, &opts, uploading),
        }
    }
}
