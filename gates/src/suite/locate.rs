//! Always a location (docs/DESIGN.md §4.2): a failure found from the digests names prompt, step,
//! layer and seam at once; then both sides are re-run with a full capture of that seam. The rank
//! comes from the failed run's per-rank digest shares compared with the reference's values over
//! the same element ranges, so it is named whether or not the re-run reproduces the failure; the
//! element is named when the re-run reproduces it exactly (same seam digest as the failed run),
//! and the receipt says when it did not — then the failure depends on timing, and a race is
//! likely. A cross-rank copy that arrived wrong is already located at the copy (its ranks and
//! the seam whose tensor it moved).

use super::{Phase, Suite};
use crate::gate::{self, FirstDivergence};
use crate::subject::RunSpec;
use memra_runtime::backend::BackendKind;
use memra_runtime::record::Record;

impl Suite<'_> {
    /// Locate `d`, a difference between the record of `reference` and `run` (the record of
    /// `job`): re-run both with a full capture of its seam. `own`: the reference is the
    /// subject's own run (a class baseline), re-run by the subject whatever the backend.
    pub(super) fn locate(&self, d: &mut FirstDivergence, run: &Record, reference: RunSpec, job: RunSpec, own: bool) {
        if d.copy_from.is_some() {
            return;
        }
        let key = d.key();
        let (mut reference, mut job) = (reference, job);
        reference.capture = vec![key];
        job.capture = vec![key];
        // The host oracle is the built-in runtime's; a CUDA reference, and a class baseline on
        // either backend, is the subject's own run (an external NUMERIC subject's class baseline
        // re-run by the built-in runtime once showed the canonical bits as the reference).
        let reference = match reference.backend {
            BackendKind::Host if !own => self.runtime_as(Phase::Oracle, reference).map_err(|e| e.to_string()),
            _ => self.subject_as(Phase::Oracle, reference).map_err(|e| e.to_string()),
        };
        let Ok(reference) = reference else { return };
        let Some(reference) = reference.captures.get(&key) else { return };
        let Ok(again) = self.subject_as(Phase::Run, job) else { return };
        let Some(captured) = again.captures.get(&key) else { return };
        d.rank = gate::ranks_differing(run, key, reference, &captured.owners).first().copied();
        let idx = Record::seam_index(run.n_layers, key.layer, key.seam);
        let digest =
            |r: &Record| r.digests.get(key.prompt).and_then(|p| p.get(key.step)).and_then(|s| s.get(idx)).copied();
        d.reproduced = digest(&again).is_some() && digest(&again) == digest(run);
        if d.reproduced {
            d.element = gate::localise(reference, captured);
            d.rank = d.element.and_then(|e| e.rank).or(d.rank);
        }
    }
}
