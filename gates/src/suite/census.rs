//! Engagement witnessed by the backend (docs/DESIGN.md §4.2): each enabled door's declared census
//! change (`gates/doors.toml` `census`) is checked against the census of the same configuration
//! with that door off — its *census baseline*, run here and cached per configuration, so the
//! doors of a matrix at one TP size and transport share one baseline run. The baseline runs
//! exactly as the gated run does (same teacher-forced tape, same captures), so the only
//! difference between the two censuses is the door. A job's own gated run is the census baseline
//! of every superset that asks for it (the same configuration, tape and captures), so a matrix
//! scheduled subsets first runs few baselines of its own.

use super::{Phase, Suite};
use crate::gate::{self, Outcome};
use crate::job::{CensusDecl, Job};
use crate::subject::RunSpec;
use memra_runtime::backend::census::Census;
use memra_runtime::backend::BackendKind;
use memra_runtime::record::{CaptureKey, Record};
use memra_runtime::{DoorSet, ExpertFormat, Transport};

/// A census baseline's configuration: backend, TP, transport, door values, expert format, the
/// teacher-forced tape (the tokens of the oracle a NUMERIC job is held to) and the captures — all
/// of its run specification, so one key is one run.
/// The door variables are part of the key: an external subject's doors have no field in the
/// built-in runtime's door values.
pub(super) type BaselineKey =
    (BackendKind, usize, Transport, DoorSet, Vec<String>, ExpertFormat, Option<Vec<Vec<u32>>>, Vec<CaptureKey>);

fn key(
    job: &Job,
    doors: DoorSet,
    vars: &std::collections::BTreeMap<String, bool>,
    format: ExpertFormat,
    forced: Option<&Record>,
    capture: &[CaptureKey],
) -> BaselineKey {
    let vars = vars.iter().filter(|(_, on)| **on).map(|(v, _)| v.clone()).collect();
    (job.backend, job.tp, job.transport, doors, vars, format, forced.map(|r| r.tokens.clone()), capture.to_vec())
}

impl Suite<'_> {
    fn census_baseline(
        &self,
        job: &Job,
        decl: &CensusDecl,
        forced: Option<&Record>,
        capture: &[CaptureKey],
    ) -> Result<Census, String> {
        let off = decl.off;
        // The expert storage is part of the door (NVFP4_EP2 implies NVFP4 banks): the baseline
        // takes the storage its own doors imply.
        let format = if off.nvfp4_ep2 { ExpertFormat::Nvfp4 } else { ExpertFormat::E4m3 };
        let key = key(job, off, &decl.off_vars, format, forced, capture);
        if let Some(c) = self.census_baselines.lock().expect("census baseline lock").get(&key) {
            return c.clone();
        }
        let spec = RunSpec {
            backend: job.backend,
            tp: job.tp,
            transport: job.transport,
            doors: off,
            door_vars: decl.off_vars.clone(),
            format,
            forced,
            capture: capture.to_vec(),
        };
        let c = self.subject_as(Phase::Oracle, spec).map(|r| r.census).map_err(|e| e.to_string());
        self.census_baselines.lock().expect("census baseline lock").insert(key, c.clone());
        c
    }

    /// Keep the census of `run`, the job's gated run (made with `forced` and `capture`), as the
    /// census baseline of its own configuration.
    pub(super) fn keep_census(&self, job: &Job, run: &Record, forced: Option<&Record>, capture: &[CaptureKey]) {
        let key = key(job, job.doors, &job.doors_env, super::format_of(job), forced, capture);
        self.census_baselines
            .lock()
            .expect("census baseline lock")
            .entry(key)
            .or_insert_with(|| Ok(run.census.clone()));
    }

    /// The engagement gate of `run` (the job's gated run, made with `forced` and `capture`).
    pub(super) fn engagement_gate(
        &self,
        job: &Job,
        run: &Record,
        forced: Option<&Record>,
        capture: &[CaptureKey],
    ) -> Outcome {
        let baselines: Vec<_> = job.census.iter().map(|d| (d, self.census_baseline(job, d, forced, capture))).collect();
        gate::engagement(&run.census, &baselines)
    }
}
