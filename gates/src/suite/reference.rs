//! The correctness anchor as a gate (docs/DESIGN.md §3.4, last paragraph): once per suite — one
//! model and battery — the host oracle is run again with a full capture of every seam of every
//! prompt, the plain f64 reference (`memra_runtime::reference`) is teacher-forced with its tokens,
//! and the two are compared at every seam and on the token tape within the documented bound.
//! Every receipt of the suite carries the result: bit-identity across TP sizes says every
//! configuration computes the same thing; this gate says that thing is the model.

use super::{Phase, Suite};
use crate::gate::{self, Outcome};
use crate::subject::RunSpec;
use memra_runtime::backend::BackendKind;
use memra_runtime::reference::{compare, reference_run, REFERENCE_REL_BOUND};
use memra_runtime::ExpertFormat;

impl Suite<'_> {
    /// The reference gate of this suite's model and battery (computed on first use).
    pub(super) fn reference_gate(&self) -> Outcome {
        let mut slot = self.reference.lock().expect("reference lock");
        slot.get_or_insert_with(|| self.compute_reference()).clone()
    }

    fn compute_reference(&self) -> Outcome {
        let mut spec = RunSpec::oracle(BackendKind::Host, ExpertFormat::E4m3);
        spec.capture = (0..self.oracle.digests.len()).flat_map(|p| gate::all_keys_of_prompt(&self.oracle, p)).collect();
        let record = match self.runtime_as(Phase::Oracle, spec) {
            Ok(r) => r,
            Err(e) => return Outcome::Fail(format!("the captured oracle run for the f64 reference failed: {e}")),
        };
        let reference = match reference_run(&self.runtime.model, &self.runtime.battery, &record.tokens, Some(&record)) {
            Ok(r) => r,
            Err(e) => return Outcome::Fail(format!("the f64 reference could not run: {e}")),
        };
        let report = compare(&reference, &record, REFERENCE_REL_BOUND);
        let tensors: usize = report.seams.iter().map(|s| s.tensors).sum();
        if report.passed() {
            let worst = report.worst.map(|(s, e)| format!("worst seam {} at {e:.1e}", s.name())).unwrap_or_default();
            Outcome::Pass(format!(
                "the canonical program agrees with the f64 reference within {REFERENCE_REL_BOUND:.0e}: {tensors} seam tensors, \
                 {worst}; {} tokens ({} near-ties), {} router near-ties adopted",
                report.tape_compared,
                report.tape_near_ties.len(),
                report.router_near_ties.len()
            ))
        } else {
            let first =
                report.to_string().lines().find(|l| l.contains("FAIL") || l.contains("mismatch")).map(str::to_string);
            Outcome::Fail(format!(
                "the canonical program disagrees with the f64 reference: {} router mismatch(es), {} disagreement(s), {} tape mismatch(es), {} problem(s), worst seam {:?}{}",
                report.router_id_mismatches.len(),
                report.router_disagreements.len(),
                report.tape_mismatches.len(),
                report.problems.len(),
                report.worst.map(|(s, e)| (s.name(), e)),
                first.map(|l| format!("; {l}")).unwrap_or_default()
            ))
        }
    }
}
