//! How one job becomes a verdict: the byte-integrity probe where a transport needs it, two runs
//! of the configuration (the second for determinism, with captures where the error budget needs
//! them), the gates every run gets, then the gates of its class, and localisation of a failure.
//! A fault never aborts the matrix: it becomes an ERROR receipt.

use super::{format_of, Suite};
use crate::gate::{self, FirstDivergence, Outcome};
use crate::job::{Job, JobClass};
use crate::receipt::{now_ms, Evaluation};
use crate::subject::RunSpec;
use memra_receipts::schema::{Gate, GateResult, Verdict};
use memra_receipts::Receipt;
use memra_runtime::backend::BackendKind;
use memra_runtime::record::Record;
use memra_runtime::{ExpertFormat, Transport};
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
        if let Some((v, reason)) = &job.not_run {
            ev.verdict = *v;
            ev.reason = Some(reason.clone());
        } else {
            self.gate_job(job, &mut ev);
        }
        self.receipt(job, ev, started, t0.elapsed().as_secs_f64() * 1e3)
    }

    fn spec<'r>(&self, job: &Job, forced: Option<&'r Record>) -> RunSpec<'r> {
        RunSpec {
            backend: job.backend,
            tp: job.tp,
            transport: job.transport,
            doors: job.doors,
            door_vars: job.doors_env.clone(),
            format: format_of(job),
            forced,
            capture: vec![],
        }
    }

    fn gate_job(&self, job: &Job, ev: &mut Evaluation) {
        if !self.probe_gate(job, ev) {
            return;
        }
        let numeric = matches!(job.class, JobClass::Numeric { .. });
        let oracle = match self.numeric_oracle(job) {
            Ok(o) => o,
            Err(e) => return ev.error_text(format!("the oracle run failed: {e}")),
        };
        let forced = if numeric { Some(&oracle) } else { None };
        let first = match self.subject.run(self.spec(job, forced)) {
            Ok(r) => r,
            Err(e) => return ev.failed(e.verdict(), e.reason()),
        };
        // The determinism re-run also carries full captures of prompt 0 for the error budget.
        let mut again = self.spec(job, forced);
        if numeric {
            again.capture = gate::all_keys_of_prompt(&first, 0);
        }
        let second = match self.subject.run(again) {
            Ok(r) => r,
            Err(e) => return ev.failed(e.verdict(), e.reason()),
        };
        self.common_gates(job, &first, &second, ev);
        let done = match job.class {
            JobClass::Identity | JobClass::Canary => self.identity_gate(job, &first, ev),
            JobClass::Numeric { margin_budget, rel_budget, class_identity } => {
                self.numeric_gates(job, &oracle, &first, &second, (margin_budget, rel_budget, class_identity), ev)
            }
        };
        if done {
            ev.record = Some(first);
            ev.settle();
        }
    }

    /// The native-P2P byte-integrity probe (docs/DESIGN.md §3.5). Returns false when the job
    /// cannot go on: no peer access (SKIP) or corrupt copies (ERROR).
    fn probe_gate(&self, job: &Job, ev: &mut Evaluation) -> bool {
        if !(job.transport == Transport::NativeP2p && job.tp > 1) {
            return true;
        }
        let results = match self.probe(job.backend, job.tp) {
            Ok(r) => r,
            Err(e) => {
                ev.error_text(format!("the native-P2P byte-integrity probe could not run: {e}"));
                return false;
            }
        };
        ev.probe = results.clone();
        if let Some(p) = results.iter().find(|p| p.no_peer_access.is_some()) {
            ev.verdict = Verdict::Skip;
            ev.reason = Some(format!(
                "no peer access from rank {} to rank {}: {}",
                p.src,
                p.dst,
                p.no_peer_access.clone().unwrap_or_default()
            ));
            return false;
        }
        if let Some(p) = results.iter().find(|p| p.bad_words > 0) {
            ev.error_text(format!(
                "the byte-integrity probe found {} wrong words copying {} bytes from rank {} to rank {}: peer copies are corrupt here",
                p.bad_words, p.bytes, p.src, p.dst
            ));
            return false;
        }
        true
    }

    /// Determinism, non-triviality, engagement, and on CUDA the device-host gate (for a subject
    /// that claims the canonical program's bits).
    fn common_gates(&self, job: &Job, first: &Record, second: &Record, ev: &mut Evaluation) {
        ev.gates.push(gate_result(Gate::Determinism, &gate::determinism(first, second), Verdict::Fail));
        ev.gates.push(gate_result(Gate::NonTriviality, &gate::non_triviality(first), Verdict::Fail));
        ev.gates.push(gate_result(Gate::Engagement, &gate::engagement(first, &job.engagement), Verdict::Void));
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

    /// Identity with the reference (host oracle or CUDA TP1), localised on failure. Returns false
    /// when the job ended in ERROR.
    fn identity_gate(&self, job: &Job, first: &Record, ev: &mut Evaluation) -> bool {
        let reference = match self.reference_for(job) {
            Ok(r) => r,
            Err(e) => {
                ev.error_text(format!("the reference run failed: {e}"));
                return false;
            }
        };
        let outcome = match gate::first_digest_divergence(&reference, first) {
            Err(structure) => Outcome::Fail(structure),
            Ok(None) if steps(first) == 0 => Outcome::Fail("no decode step was compared".to_string()),
            Ok(None) => {
                Outcome::Pass(format!("{} steps × {} seams bit-identical", steps(first), first.seams_per_step()))
            }
            Ok(Some(mut d)) => {
                d.element = self.localise(job, &d);
                let text = format!("first divergence at {}", d.describe());
                ev.divergence = Some(d);
                Outcome::Fail(text)
            }
        };
        ev.gates.push(gate_result(Gate::Identity, &outcome, Verdict::Fail));
        true
    }

    /// Argmax tape, class identity (where the door's gate has it and this run is not the class
    /// baseline itself) and the error budget. Returns false when the job ended in ERROR.
    fn numeric_gates(
        &self,
        job: &Job,
        oracle: &Record,
        first: &Record,
        second: &Record,
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
                Ok(base) => match gate::first_digest_divergence(&base, first) {
                    Err(structure) => Outcome::Fail(structure),
                    Ok(None) => Outcome::Pass(format!(
                        "bit-identical to the door's TP{} {} class baseline",
                        job.baseline_tp,
                        job.baseline_transport.name()
                    )),
                    Ok(Some(d)) => Outcome::Fail(format!("differs from the class baseline first at {}", d.describe())),
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
        let (errors, flips) = gate::error_budget(&captured, second);
        let worst = errors.iter().map(|e| e.max_rel).fold(0.0f64, f64::max);
        let bitwise = errors.iter().all(|e| e.max_ulp == 0);
        let outcome =
            if errors.is_empty() {
                Outcome::Fail("no seam was compared: the error-budget captures are missing".to_string())
            } else if worst.is_nan() || worst > rel_budget {
                Outcome::Fail(format!("max normwise relative error {worst:.3e} exceeds the budget {rel_budget:.1e}"))
            } else {
                Outcome::Pass(format!(
                "max normwise relative error {worst:.3e} within {rel_budget:.1e}; {flips} routing flip(s) excluded{}",
                if bitwise { "; NOTE: bit-identical to the oracle — the NUMERIC class may be mislabeled" } else { "" }
            ))
            };
        ev.gates.push(gate_result(Gate::ErrorBudget, &outcome, Verdict::Fail));
        ev.errors = errors;
        true
    }

    /// Re-run the reference (`reference_for`: the host oracle, or the subject's CUDA TP1 run)
    /// and the job with a full capture of the divergent seam.
    fn localise(&self, job: &Job, d: &FirstDivergence) -> Option<gate::Element> {
        let key = vec![d.key()];
        let mut reference = RunSpec::oracle(job.backend, ExpertFormat::E4m3);
        reference.capture = key.clone();
        let reference = match job.backend {
            BackendKind::Host => self.runtime.run_canonical(reference).ok()?,
            BackendKind::Cuda => self.subject.run(reference).ok()?,
        };
        let run = self
            .subject
            .run(RunSpec {
                backend: job.backend,
                tp: job.tp,
                transport: job.transport,
                doors: job.doors,
                door_vars: job.doors_env.clone(),
                format: ExpertFormat::E4m3,
                forced: None,
                capture: key,
            })
            .ok()?;
        gate::localise(reference.captures.get(&d.key())?, run.captures.get(&d.key())?)
    }
}
