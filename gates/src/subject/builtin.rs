//! The built-in runtime as a subject, in this process: the model and battery every job of a plan
//! decodes, and how one configuration of the canonical program runs on them. It is also the
//! oracle of every plan, whatever subject is under test (docs/DESIGN.md §4.2, §10). Runs in this
//! process share a pool of prepared backends: the weights are uploaded once per backend, options
//! and layout (docs/DESIGN.md §8).

use super::{RunSpec, Subject, SubjectError};
use memra_receipts::ModelEvidence;
use memra_runtime::backend::{BackendKind, HostRanks, OpenOptions};
use memra_runtime::model::Model;
use memra_runtime::program::pool::{Pool, RunTimes};
use memra_runtime::record::Record;
use memra_runtime::{Battery, RunConfig, RuntimeError, Transport};

/// The name of the built-in runtime in receipts (`evidence.config.subject`).
pub const BUILTIN_NAME: &str = "memra-runtime";
/// The version of the built-in runtime in receipts (`evidence.build.subject_version`): the
/// workspace's crate version. `scripts/subjects/builtin.toml` declares the same, so the built-in
/// runtime run through the protocol writes identical evidence.
pub const BUILTIN_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The model and battery every job decodes, and the built-in runtime that decodes them.
pub struct Builtin {
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
    /// How host runs place their ranks (`run --host-ranks`).
    pub host_ranks: HostRankPolicy,
}

/// How the host backend's ranks run, per configuration (`run --host-ranks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostRankPolicy {
    /// Threads where a run has the cores to itself and ranks to spread over them (one job at a
    /// time, TP > 1); inline where the plan's jobs already fill the cores (`workers` ≥ 2) or the
    /// run has one rank, since rank threads then only add hand-offs (docs/gpu/2026-12-03-performance-history.md).
    Auto {
        workers: usize,
    },
    Fixed(HostRanks),
}

impl HostRankPolicy {
    /// `auto`, `threads` or `inline`.
    pub fn parse(s: &str, workers: usize) -> Option<HostRankPolicy> {
        match s {
            "auto" => Some(HostRankPolicy::Auto { workers }),
            "threads" => Some(HostRankPolicy::Fixed(HostRanks::Threads)),
            "inline" => Some(HostRankPolicy::Fixed(HostRanks::Inline)),
            _ => None,
        }
    }

    /// The mode of a host run at TP `tp`.
    pub fn for_tp(self, tp: usize) -> HostRanks {
        match self {
            HostRankPolicy::Fixed(m) => m,
            HostRankPolicy::Auto { workers } if workers >= 2 || tp == 1 => HostRanks::Inline,
            HostRankPolicy::Auto { .. } => HostRanks::Threads,
        }
    }
}

impl Builtin {
    /// Whether a run of (backend, transport) spans the processes of a distributed launch; every
    /// other run (oracles, TP1 baselines, reference re-runs) stays inside this process.
    pub fn spans_processes(&self, backend: BackendKind, transport: Transport) -> bool {
        self.dist.is_some() && backend == BackendKind::Cuda && transport == Transport::Nccl
    }

    /// Run one configuration of the canonical program on this model and battery.
    pub fn run_canonical(&self, spec: RunSpec) -> Result<Record, RuntimeError> {
        self.run_timed(spec, &|_| {}).map(|(r, _)| r)
    }

    /// [`Builtin::run_canonical`], with the time spent uploading weights (0 when a prepared
    /// backend was reused) and running; `uploading(true)` / `uploading(false)` bracket an upload.
    pub fn run_timed(&self, spec: RunSpec, uploading: &dyn Fn(bool)) -> Result<(Record, RunTimes), RuntimeError> {
        let mut cfg = RunConfig::new(spec.tp, spec.transport, self.battery.clone())?;
        cfg.doors = spec.doors;
        cfg.expert_format = spec.format;
        cfg.forced_tokens = spec.forced.map(|r| r.tokens.clone());
        cfg.capture = spec.capture;
        cfg.pass = spec.pass;
        cfg.timing = spec.timing;
        let opts = OpenOptions {
            device_reserve_bytes: self.device_reserve_bytes,
            rank0_merge: spec.doors.rank0_merge,
            host_ranks: self.host_ranks.for_tp(spec.tp),
            launch_order: Default::default(),
        };
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

impl Subject for Builtin {
    fn name(&self) -> &str {
        BUILTIN_NAME
    }
    fn version(&self) -> &str {
        BUILTIN_VERSION
    }
    fn census_witness(&self, _: memra_runtime::backend::BackendKind) -> Option<String> {
        None
    }
    fn exact(&self) -> bool {
        true
    }
    fn run(&self, spec: RunSpec) -> Result<Record, SubjectError> {
        Ok(self.run_canonical(spec)?)
    }
    fn run_observed(&self, spec: RunSpec, uploading: &dyn Fn(bool)) -> Result<Record, SubjectError> {
        Ok(self.run_timed(spec, uploading)?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `auto` runs ranks inline while several jobs share the cores or a run has one rank, and
    /// gives a lone job at TP > 1 its rank threads; the fixed modes are what they say.
    #[test]
    fn host_rank_policy() {
        let auto = |workers| HostRankPolicy::parse("auto", workers).unwrap();
        for tp in [1, 2, 4, 8] {
            assert_eq!(auto(2).for_tp(tp), HostRanks::Inline, "TP{tp}, 2 jobs");
            assert_eq!(HostRankPolicy::parse("threads", 2).unwrap().for_tp(tp), HostRanks::Threads);
            assert_eq!(HostRankPolicy::parse("inline", 1).unwrap().for_tp(tp), HostRanks::Inline);
        }
        assert_eq!(auto(1).for_tp(1), HostRanks::Inline);
        assert_eq!(auto(1).for_tp(2), HostRanks::Threads);
        assert_eq!(auto(1).for_tp(8), HostRanks::Threads);
        assert_eq!(HostRankPolicy::parse("fibers", 2), None);
    }
}
