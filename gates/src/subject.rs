//! The subject a plan gates: the model and battery every job decodes, and how one configuration
//! of the built-in runtime is run on it (docs/DESIGN.md §10: the built-in runtime is one subject;
//! the gates only ever see the [`Record`] it produces).

use memra_receipts::ModelEvidence;
use memra_runtime::backend::{open_with, BackendKind, OpenOptions};
use memra_runtime::model::Model;
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
        let mut cfg = RunConfig::new(spec.tp, spec.transport, self.battery.clone())?;
        cfg.doors = spec.doors;
        cfg.expert_format = spec.format;
        cfg.forced_tokens = spec.forced.map(|r| r.tokens.clone());
        cfg.capture = spec.capture;
        let opts = OpenOptions { device_reserve_bytes: self.device_reserve_bytes, rank0_merge: spec.doors.rank0_merge };
        let mut b = match &self.dist {
            Some(d) if self.spans_processes(spec.backend, spec.transport) => {
                let mut rendezvous = d.rendezvous.lock().unwrap_or_else(|p| p.into_inner());
                memra_runtime::backend::open_distributed(spec.tp, &mut rendezvous, &opts)?
            }
            _ => open_with(spec.backend, spec.tp, &opts)?,
        };
        memra_runtime::program::run(&self.model, &cfg, b.as_mut())
    }
}
