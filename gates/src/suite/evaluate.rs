//! How one job becomes a verdict: the byte-integrity probe where the job crosses ranks (`probe`),
//! two identical runs of the configuration (the second for the determinism of the evidence
//! itself; NUMERIC jobs capture prompt 0 in both, for the error budget), the gates every run gets
//! — determinism, non-triviality, engagement witnessed by the census (`census`), the copy checks,
//! coverage of the model's claims, the f64 reference (`reference`), device-host on CUDA — then
//! the gates of its class, and the location of any failure (`locate`). A fault never aborts the
//! matrix: it becomes an ERROR receipt.

use super::{format_of, Phase, Suite};
use crate::gate::{self, Outcome};
use crate::job::{Job, JobClass};
use crate::receipt::{now_ms, Evaluation};
use crate::subject::RunSpec;
use memra_receipts::schema::{Gate, GateResult, Verdict};
use memra_receipts::Receipt;
use memra_runtime::backend::BackendKind;
use memra_runtime::record::{CaptureKey, Record};
use memra_runtime::ExpertFormat;
use std::time::Instant;

/// A gate's result for the receipt: a failure reads as `fail_as` (FAIL, or VOID for engagement).
fn gate_result(gate: Gate, outcome: &Outcome, fail_as: Verdict) -> GateResult {
    let verdict = if outcome.passed() { Verdict::Pass } else { fail_as };
    GateResult { gate, verdict, detail: outcome.detail().to_string() }
}

/// Decode steps a record holds over all prompts.
fn steps(r: &Record) -> usize {
    r.digests.iter().map(|p| p.len()).sum()
}

impl Suite<'_> {
    /// Evaluate one job: never panics, never aborts the matrix; faults become ERROR receipts.
    pub fn evaluate(&self, job: &Job) -> Receipt {
        let started = now_ms();
        let t0 = Instant::now();
        let mut ev = Evaluation::default();
        let mut times = None;
        if let Some((v, reason)) = &job.not_run {
            ev.verdict = *v;
            ev.reason = Some(reason.clone());
        } else if let Some(reason) = super::shape_rules::not_applicable(job, &self.runtime.model.config) {
            ev.verdict = Verdict::NotApplicable;
            ev.reason = Some(reason);
        } else {
            self.activities.begin(self.config_evidence(job).label());
            self.gate_job(job, &mut ev);
            times = Some(self.activities.end());
        }
        self.receipt(job, ev, started, t0.elapsed().as_secs_f64() * 1e3, times)
    }

    fn spec<'r>(&self, job: &Job, forced: Option<&'r Record>, capture: &[CaptureKey]) -> RunSpec<'r> {
        RunSpec {
            backend: job.backend,
            tp: job.tp,
            transport: job.transport,
            doors: job.doors,
            door_vars: job.doors_env.clone(),
            format: format_of(job),
            forced,
            capture: capture.to_vec(),
        }
    }

    fn gate_job(&self, job: &Job, ev: &mut Evaluation) {
        ev.coverage = self.oracle.coverage.clone();
        ev.claims = self.claims();
        if !self.probe_gate(job, ev) {
            return;
        }
        let numeric = matches!(job.class, JobClass::Numeric { .. });
        let oracle = match self.numeric_oracle(job) {
            Ok(o) => o,
            Err(e) => return ev.error_text(format!("the oracle run failed: {e}")),
        };
        let forced = if numeric { Some(&oracle) } else { None };
        // Both runs are identical (NUMERIC jobs capture prompt 0 in both, for the error budget),
        // so the determinism gate can compare their evidence byte for byte.
        let capture = if numeric { gate::all_keys_of_prompt(&oracle, 0) } else { Vec::new() };
        let first = match self.subject_as(Phase::Run, self.spec(job, forced, &capture)) {
            Ok(r) => r,
            Err(e) => return ev.failed(e.verdict(), e.reason()),
        };
        if numeric {
            self.keep_class_baseline(job, &first);
        }
        self.keep_census(job, &first, forced, &capture);
        let second = match self.subject_as(Phase::Run, self.spec(job, forced, &capture)) {
            Ok(r) => r,
            Err(e) => return ev.failed(e.verdict(), e.reason()),
        };
        self.common_gates(job, &first, &second, (forced, &capture), ev);
        let done = match job.class {
            JobClass::Identity | JobClass::Canary => self.identity_gate(job, &first, ev),
            JobClass::Numeric { margin_budget, rel_budget, class_identity } => {
                self.numeric_gates(job, &oracle, &first, (margin_budget, rel_budget, class_identity), ev)
            }
        };
        if done {
            ev.record = Some(first);
            ev.settle();
        }
    }

    /// Determinism, non-triviality, engagement, copies, coverage, the f64 reference, and on CUDA
    /// the device-host gate (for a subject that claims the canonical program's bits).
    fn common_gates(
        &self,
        job: &Job,
        first: &Record,
        second: &Record,
        (forced, capture): (Option<&Record>, &[CaptureKey]),
        ev: &mut Evaluation,
    ) {
        let evidence = |r: &Record| crate::record_evidence::sections(r);
        ev.gates.push(gate_result(
            Gate::Determinism,
            &gate::determinism(&evidence(first), &evidence(second)),
            Verdict::Fail,
        ));
        ev.gates.push(gate_result(Gate::NonTriviality, &gate::non_triviality(first), Verdict::Fail));
        let engagement = self.engagement_gate(job, first, forced, capture);
        ev.gates.push(gate_result(Gate::Engagement, &engagement, Verdict::Void));
        // One rank copies nothing: no copies gate at TP1 (an absent gate, never a vacuous pass).
        // At TP ≥ 2 the built-in runtime verifies its copies, so verifying none is a failure; an
        // external subject that reports no copies (an optional tape key) gets no copies gate.
        if job.tp > 1 {
            let reported = first.copies_verified > 0 || !first.copy_faults.is_empty();
            if reported || self.subject.name() == crate::subject::BUILTIN_NAME {
                ev.gates.push(gate_result(Gate::Copies, &gate::copies(first), Verdict::Fail));
            }
        }
        let claims = self.claims();
        let claims: Vec<&str> = claims.iter().map(String::as_str).collect();
        // A host run counts its own coverage; where it is held to identity it must reach what the
        // oracle reached (a NUMERIC door may legitimately take another path).
        let own = (job.backend == BackendKind::Host && !matches!(job.class, JobClass::Numeric { .. }))
            .then_some(first.coverage.as_ref())
            .flatten();
        ev.gates.push(gate_result(
            Gate::Coverage,
            &gate::coverage(&claims, self.oracle.coverage.as_ref(), own),
            Verdict::Fail,
        ));
        ev.gates.push(gate_result(Gate::Reference, &self.reference_gate(), Verdict::Fail));
        if job.backend == BackendKind::Cuda && self.subject.exact() {
            let dh = match self.cuda_baseline() {
                Err(e) => Outcome::Fail(e),
                Ok(c) => match gate::first_digest_divergence(&self.oracle, &c) {
                    Err(structure) => Outcome::Fail(structure),
                    Ok(None) => Outcome::Pass("CUDA TP1 equals the host oracle at every layer × seam × step".into()),
                    Ok(Some(d)) => {
                        Outcome::Fail(format!("CUDA TP1 differs from the host oracle first at {}", d.describe()))
                    }
                },
            };
            ev.gates.push(gate_result(Gate::DeviceHost, &dh, Verdict::Fail));
        }
    }

    /// Identity with the reference (host oracle or CUDA TP1) — every seam digest, and every
    /// cross-rank copy — located on failure. Returns false when the job ended in ERROR.
    fn identity_gate(&self, job: &Job, first: &Record, ev: &mut Evaluation) -> bool {
        let reference = match self.reference_for(job) {
            Ok(r) => r,
            Err(e) => {
                ev.error_text(format!("the reference run failed: {e}"));
                return false;
            }
        };
        let outcome = match gate::first_difference(&reference, first) {
            Err(structure) => Outcome::Fail(structure),
            Ok(None) if steps(first) == 0 => Outcome::Fail("no decode step was compared".to_string()),
            Ok(None) => {
                Outcome::Pass(format!("{} steps × {} seams bit-identical", steps(first), first.seams_per_step()))
            }
            Ok(Some(mut d)) => {
                let reference = RunSpec::oracle(job.backend, ExpertFormat::E4m3);
                self.locate(&mut d, first, reference, self.spec(job, None, &[]));
                let text = format!("first divergence at {}", d.describe());
                ev.divergence = Some(d);
                Outcome::Fail(text)
            }
        };
        ev.gates.push(gate_result(Gate::Identity, &outcome, Verdict::Fail));
        true
    }

    /// Argmax tape, class identity (where the door's gate has it and this run is not the class
    /// baseline itself; located like identity) and the error budget. Returns false when the job
    /// ended in ERROR.
    fn numeric_gates(
        &self,
        job: &Job,
        oracle: &Record,
        first: &Record,
        (margin_budget, rel_budget, class_identity): (f32, f64, bool),
        ev: &mut Evaluation,
    ) -> bool {
        let (tape, ties) = gate::argmax_tape(oracle, first, margin_budget, rel_budget);
        ev.gates.push(gate_result(Gate::ArgmaxTape, &tape, Verdict::Fail));
        ev.near_ties = ties;
        // A door whose registry gate has no class identity gets no such gate (a gate that was not
        // evaluated must not read as passed); the class baseline run itself is not compared with
        // itself (that would pass vacuously): its reproduction is what the determinism gate checks.
        if class_identity && !job.is_class_baseline() {
            let class = match self.class_baseline(job, oracle) {
                Err(e) => Outcome::Fail(e),
                Ok(base) => match gate::first_difference(&base, first) {
                    Err(structure) => Outcome::Fail(structure),
                    Ok(None) => Outcome::Pass(format!(
                        "bit-identical to the door's TP{} {} class baseline",
                        job.baseline_tp,
                        job.baseline_transport.name()
                    )),
                    Ok(Some(mut d)) => {
                        let baseline = RunSpec {
                            tp: job.baseline_tp,
                            transport: job.baseline_transport,
                            ..self.spec(job, Some(oracle), &[])
                        };
                        self.locate(&mut d, first, baseline, self.spec(job, Some(oracle), &[]));
                        let text = format!("differs from the class baseline first at {}", d.describe());
                        ev.divergence = Some(d);
                        Outcome::Fail(text)
                    }
                },
            };
            ev.gates.push(gate_result(Gate::ClassIdentity, &class, Verdict::Fail));
        }
        let captured = match self.oracle_captured(format_of(job)) {
            Ok(oc) => oc,
            Err(e) => {
                ev.error(e);
                return false;
            }
        };
        let (errors, flips) = gate::error_budget(&captured, first);
        let worst = errors.iter().map(|e| e.max_rel).fold(0.0f64, f64::max);
        let bitwise = errors.iter().all(|e| e.max_ulp == 0);
        let uncompared = gate::uncompared_seams(&captured, &errors);
        let outcome = if errors.is_empty() {
            Outcome::Fail("no seam was compared: the error-budget captures are missing".to_string())
        } else if worst.is_nan() || worst > rel_budget {
            Outcome::Fail(format!("max normwise relative error {worst:.3e} exceeds the budget {rel_budget:.1e}"))
        } else {
            Outcome::Pass(format!(
                "max normwise relative error {worst:.3e} within {rel_budget:.1e}; {flips} routing flip(s) excluded{}{}",
                match uncompared.first() {
                    // Said, never hidden: a model built with router ties (`edge`) can flip at
                    // every step, and then these seams were compared nowhere.
                    Some((layer, seam)) => format!(
                        "; {} seam(s) never compared (flips at every step), first layer {layer} {}",
                        uncompared.len(),
                        seam.name()
                    ),
                    None => String::new(),
                },
                if bitwise {
                    "; NOTE: bit-identical to the oracle — the NUMERIC class may be mislabeled"
                } else {
                    ""
                }
            ))
        };
        ev.gates.push(gate_result(Gate::ErrorBudget, &outcome, Verdict::Fail));
        ev.errors = errors;
        true
    }
}
