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
use memra_runtime::record::{CaptureKey, Record};
use memra_runtime::reference::{compare, reference_run, ComparisonReport, REFERENCE_REL_BOUND};
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
            let first = first_failure(&report, self.oracle.n_layers).or_else(|| {
                report.to_string().lines().find(|l| l.contains("FAIL") || l.contains("mismatch")).map(str::to_string)
            });
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

/// The first failure of `report` in program order, named by layer, seam, prompt and step (and the
/// element of a seam tensor, or the token of the tape): the first seam tensor over the bound, the
/// first router whose ids differ or whose decision disagrees, or the first tape mismatch.
pub(crate) fn first_failure(report: &ComparisonReport, n_layers: usize) -> Option<String> {
    let order = |k: &CaptureKey| (k.prompt, k.step, Record::seam_index(n_layers, k.layer, k.seam));
    let place = |k: &CaptureKey| format!("L{}.{} p{} s{}", k.layer, k.seam.name(), k.prompt, k.step);
    let mut found: Vec<((usize, usize, usize), String)> = Vec::new();
    for s in &report.seams {
        if let Some((k, at, rel)) = s.first_over {
            found.push((order(&k), format!("first over the bound at {} [{at}]: {rel:.1e}", place(&k))));
        }
    }
    for (k, got, want) in &report.router_id_mismatches {
        found.push((order(k), format!("router ids differ at {}: {got:?}, the reference {want:?}", place(k))));
    }
    for e in &report.router_disagreements {
        found.push((order(&e.key), format!("router decision disagrees at {} by {:.1e}", place(&e.key), e.gap_rel)));
    }
    let seam_failure = found.into_iter().min_by_key(|f| f.0).map(|f| f.1);
    seam_failure.or_else(|| {
        report.tape_mismatches.first().map(|t| {
            format!(
                "tape mismatch at prompt {} token {}: {} where the reference's argmax is {}",
                t.prompt, t.index, t.got, t.reference
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_runtime::record::Seam;
    use memra_runtime::reference::SeamError;

    fn report(seams: Vec<SeamError>) -> ComparisonReport {
        ComparisonReport {
            bound: 1e-3,
            seams,
            worst: None,
            router_id_mismatches: Vec::new(),
            router_near_ties: Vec::new(),
            router_disagreements: Vec::new(),
            tape_compared: 3,
            tape_mismatches: Vec::new(),
            tape_near_ties: Vec::new(),
            problems: Vec::new(),
        }
    }

    fn seam(seam: Seam, first_over: Option<(usize, usize, usize)>) -> SeamError {
        SeamError {
            seam,
            tensors: 4,
            max_rel: if first_over.is_some() { 0.5 } else { 1e-7 },
            worst: None,
            first_over: first_over.map(|(prompt, step, layer)| (CaptureKey { prompt, step, layer, seam }, 17, 0.5)),
        }
    }

    /// A failing seam is named by layer, seam, prompt, step and element — the first in program
    /// order when several fail (a shared expert that skipped its clamp once read only "experts").
    #[test]
    fn a_failure_names_layer_seam_prompt_and_step() {
        assert_eq!(first_failure(&report(vec![seam(Seam::Qkv, None)]), 2), None, "nothing failed");
        let r = report(vec![seam(Seam::Experts, Some((0, 3, 1))), seam(Seam::Residual, Some((0, 3, 0)))]);
        assert_eq!(first_failure(&r, 2).unwrap(), "first over the bound at L0.residual p0 s3 [17]: 5.0e-1");
        let r = report(vec![seam(Seam::Experts, Some((0, 2, 1))), seam(Seam::Residual, Some((0, 3, 0)))]);
        assert!(first_failure(&r, 2).unwrap().contains("L1.experts p0 s2 [17]"));
    }
}
