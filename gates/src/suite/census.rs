//! Engagement witnessed by the backend (docs/DESIGN.md §4.2): each enabled door's declared census
//! change (`gates/doors.toml` `census`) is checked against the census of the same configuration
//! with that door off — its *census baseline*, run here and cached per configuration, so the
//! doors of a matrix at one TP size and transport share one baseline run. The baseline runs
//! exactly as the gated run does (same teacher-forced tape, same captures), so the only
//! difference between the two censuses is the door.

use super::Suite;
use crate::gate::{self, Outcome};
use crate::job::{CensusDecl, Job};
use crate::subject::RunSpec;
use memra_runtime::backend::census::Census;
use memra_runtime::backend::BackendKind;
use memra_runtime::record::{CaptureKey, Record};
use memra_runtime::{DoorSet, ExpertFormat, Transport};

/// A census baseline's configuration: backend, TP, transport, door values, expert format, and
/// whether it is teacher-forced and captured like a NUMERIC job's runs.
/// The door variables are part of the key: an external subject's doors have no field in the
/// built-in runtime's door values.
pub(super) type BaselineKey = (BackendKind, usize, Transport, DoorSet, Vec<String>, ExpertFormat, bool, bool);

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
        let vars: Vec<String> = decl.off_vars.keys().cloned().collect();
        let key = (job.backend, job.tp, job.transport, off, vars, format, forced.is_some(), !capture.is_empty());
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
        let c = self.subject.run(spec).map(|r| r.census).map_err(|e| e.to_string());
        self.census_baselines.lock().expect("census baseline lock").insert(key, c.clone());
        c
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
