//! How one job becomes a verdict: the byte-integrity probe where the job crosses ranks (`probe`),
//! two identical runs of the configuration (the second for the determinism of the evidence
//! itself; NUMERIC jobs capture prompt 0 in both, for the error budget), the gates every run gets
//! — determinism, non-triviality, engagement witnessed by the census (`census`), the copy checks,
//! coverage of the model's claims, the f64 reference (`reference`), device-host on CUDA — then
//! the gates of its class, and the location of any failure (`locate`). A fault never aborts the
//! matrix: it becomes an ERROR receipt.

use super::{format_of, Phase, Suite};
use crate::gate::{self, FirstDivergence, Outcome};
use crate::job::{Job, JobClass};
use crate::receipt::{now_ms, Evaluation};
use crate::subject::RunSpec;
use memra_receipts::schema::{Gate, GateResult, Verdict};
use memra_receipts::Receipt;
use memra_runtime::backend::BackendKind;
use memra_runtime::record::{CaptureKey, Record};
use memra_runtime::{ExpertFormat, Timing};
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
        } else if let Some(reason) = super::shape_rules::not_applicable(job, &self.runtime.model.config)
            .or_else(|| super::shape_rules::lanes_not_applicable(job, &self.runtime.battery))
        {
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
            pass: job.pass,
            timing: Timing::Seams,
        }
    }

    fn gate_job(&self, job: &Job, ev: &mut Evaluation) {
        ev.coverage = self.oracle.coverage.clone();
        ev.claims = self.claims();
        if !self.probe_gate(job, ev) {
            return;
        }
        let numeric = super::forced_and_captured(job);
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
        // The same run again, without timing marks: the receipt's latencies are the first run's,
        // and marks are not evidence (RunSpec::timing).
        let again_spec = RunSpec { timing: Timing::Off, ..self.spec(job, forced, &capture) };
        let second = match self.subject_as(Phase::Run, again_spec) {
            Ok(r) => r,
            Err(e) => return ev.failed(e.verdict(), e.reason()),
        };
        // A receipt with a census says who counted it.
        ev.census_witness = self.subject.census_witness(job.backend);
        let at = ev.gates.len();
        let (probe, coverage, claims) = (ev.probe.clone(), ev.coverage.clone(), ev.claims.clone());
        let ctx = Judged { job, oracle: &oracle, forced, capture: &capture };
        if !self.judge(&ctx, &first, &second, Locating::Rerun, ev) {
            return;
        }
        // The same gates judge the second run (its failures placed from the first run's location,
        // never re-run), and the two receipts' evidence must be the same bytes.
        let census_witness = ev.census_witness.clone();
        let mut again = Evaluation { probe, coverage, claims, census_witness, ..Evaluation::default() };
        again.gates = ev.gates[..at].to_vec();
        self.judge(&ctx, &second, &first, Locating::From(ev.divergence.as_ref()), &mut again);
        (ev.record, again.record) = (Some(first), Some(second));
        let determinism = self.determinism(job, ev, again);
        ev.gates.insert(at, gate_result(Gate::Determinism, &determinism, Verdict::Fail));
        ev.settle();
    }

    /// Every gate but determinism of `run` (one of the job's two runs; `other` is the other one),
    /// into `ev`, settled. Returns false when the job ended in ERROR.
    fn judge(&self, ctx: &Judged, run: &Record, other: &Record, locating: Locating, ev: &mut Evaluation) -> bool {
        let job = ctx.job;
        self.common_gates(job, run, (ctx.forced, ctx.capture), ev);
        let done = match job.class {
            JobClass::Identity | JobClass::Canary => self.identity_gate(job, run, other, locating, ev),
            JobClass::Numeric { margin_budget, rel_budget, class_identity } => {
                self.numeric_gates(ctx, run, other, locating, (margin_budget, rel_budget, class_identity), ev)
            }
        };
        if done {
            ev.settle();
        }
        done
    }

    /// Non-triviality, engagement, copies, coverage, the f64 reference, and on CUDA the
    /// device-host gate (for a subject that claims the canonical program's bits).
    fn common_gates(
        &self,
        job: &Job,
        first: &Record,
        (forced, capture): (Option<&Record>, &[CaptureKey]),
        ev: &mut Evaluation,
    ) {
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
        let own = (job.backend == BackendKind::Host
            && !matches!(job.class, JobClass::Numeric { .. })
            && !job.canary_held_to_doors)
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
    fn identity_gate(&self, job: &Job, run: &Record, other: &Record, locating: Locating, ev: &mut Evaluation) -> bool {
        // A canary in a NUMERIC door set is held to that door set without it (the subject's own run).
        let held =
            job.canary_held_to_doors.then(|| job.census.iter().find(|d| d.door.starts_with("canary_"))).flatten();
        let reference = match held {
            Some(decl) => self.census_baseline(job, decl, None, &[]),
            None => self.reference_for(job),
        };
        let reference = match reference {
            Ok(r) => r,
            Err(e) => {
                ev.error_text(format!("the reference run failed: {e}"));
                return false;
            }
        };
        let outcome = match gate::first_difference(&reference, run) {
            Err(structure) => Outcome::Fail(structure),
            Ok(None) if steps(run) == 0 => Outcome::Fail("no decode step was compared".to_string()),
            Ok(None) => match gate::lanes_used(run, job.pass) {
                Err(vacuous) => Outcome::Fail(vacuous),
                Ok(lanes) if lanes.is_empty() => {
                    Outcome::Pass(format!("{} steps × {} seams bit-identical", steps(run), run.seams_per_step()))
                }
                // Batch invariance / verify = decode: every lane equals the single-token reference.
                Ok(lanes) => Outcome::Pass(format!(
                    "{} steps × {} seams bit-identical to the single-token TP1 reference; {lanes}",
                    steps(run),
                    run.seams_per_step()
                )),
            },
            Ok(Some(mut d)) => {
                gate::name_lane(&mut d, run, job.pass);
                let reference = match held {
                    Some(decl) => (
                        RunSpec { doors: decl.off, door_vars: decl.off_vars.clone(), ..self.spec(job, None, &[]) },
                        true,
                    ),
                    None => (RunSpec::oracle(job.backend, ExpertFormat::E4m3), false),
                };
                self.place(&mut d, (run, other), locating, reference, self.spec(job, None, &[]));
                let text = format!("first divergence at {}", d.describe());
                ev.divergence = Some(d);
                Outcome::Fail(text)
            }
        };
        ev.gates.push(gate_result(Gate::Identity, &outcome, Verdict::Fail));
        true
    }

    /// Where `d`, a difference of `run`, is: a cross-rank copy is located at the copy already (and
    /// is deterministic when `other`, the job's other run, has the same fault); a seam difference
    /// is located by a capture re-run of both sides (`Locating::Rerun`), or takes the location
    /// found for the other run when it is the same place (`Locating::From`).
    fn place(
        &self,
        d: &mut FirstDivergence,
        (run, other): (&Record, &Record),
        locating: Locating,
        (reference, own): (RunSpec, bool),
        job: RunSpec,
    ) {
        if d.copy_from.is_some() {
            d.reproduced = gate::copy_fault_in(d, other);
            return;
        }
        match locating {
            Locating::Rerun => self.locate(d, run, reference, job, own),
            Locating::From(Some(found)) if found.copy_from.is_none() && found.key() == d.key() => *d = found.clone(),
            Locating::From(_) => {}
        }
    }

    /// Argmax tape, class identity (where the door's gate has it and this run is not the class
    /// baseline itself; located like identity) together with the identity of each door that
    /// claims to change no number against the run without it, and the error budget. Returns false
    /// when the job ended in ERROR.
    fn numeric_gates(
        &self,
        ctx: &Judged,
        run: &Record,
        other: &Record,
        locating: Locating,
        (margin_budget, rel_budget, class_identity): (f32, f64, bool),
        ev: &mut Evaluation,
    ) -> bool {
        let (job, oracle) = (ctx.job, ctx.oracle);
        let (tape, ties) = gate::argmax_tape(oracle, run, margin_budget, rel_budget);
        // A multi-lane run must have computed several steps in one pass, as identity requires:
        // else its tape compares single-token decode with the oracle under a multi-lane name.
        let tape = match gate::lanes_used(run, job.pass) {
            Ok(lanes) if lanes.is_empty() => tape,
            check => gate::both(Some(tape), Some(Outcome::of(check))).unwrap_or_else(|| unreachable!("both given")),
        };
        ev.gates.push(gate_result(Gate::ArgmaxTape, &tape, Verdict::Fail));
        ev.near_ties = ties;
        // A door whose registry gate has no class identity gets no such gate (a gate that was not
        // evaluated must not read as passed); the class baseline run itself is not compared with
        // itself (that would pass vacuously): its reproduction is what the determinism gate checks.
        let class = (class_identity && !job.is_class_baseline()).then(|| match self.class_baseline(job, oracle) {
            Err(e) => Outcome::Fail(e),
            Ok(base) => match gate::first_difference(&base, run) {
                Err(structure) => Outcome::Fail(structure),
                Ok(None) => Outcome::Pass(format!(
                    "bit-identical to the door's TP{} {} class baseline",
                    job.baseline_tp,
                    job.baseline_transport.name()
                )),
                Ok(Some(mut d)) => {
                    gate::name_lane(&mut d, run, job.pass);
                    let baseline = RunSpec {
                        tp: job.baseline_tp,
                        transport: job.baseline_transport,
                        pass: memra_runtime::PassShape::SINGLE,
                        ..self.spec(job, Some(oracle), &[])
                    };
                    self.place(&mut d, (run, other), locating, (baseline, true), self.spec(job, Some(oracle), &[]));
                    let text = format!("differs from the class baseline first at {}", d.describe());
                    ev.divergence = Some(d);
                    Outcome::Fail(text)
                }
            },
        });
        let doors = self.door_identity(job, run, ctx.forced, ctx.capture);
        if let Some(outcome) = gate::both(class, doors) {
            ev.gates.push(gate_result(Gate::ClassIdentity, &outcome, Verdict::Fail));
        }
        let captured = match self.oracle_captured(format_of(job)) {
            Ok(oc) => oc,
            Err(e) => {
                ev.error(e);
                return false;
            }
        };
        let (outcome, errors) = gate::error_budget_gate(&captured, run, rel_budget);
        ev.gates.push(gate_result(Gate::ErrorBudget, &outcome, Verdict::Fail));
        ev.errors = errors;
        true
    }
}

/// What both runs of a job are judged with.
pub(super) struct Judged<'a> {
    pub job: &'a Job,
    /// The oracle the job is held to (NUMERIC: its tokens are the forced tape).
    pub oracle: &'a Record,
    pub forced: Option<&'a Record>,
    pub capture: &'a [CaptureKey],
}

/// How a failure of a judged run is located.
#[derive(Clone, Copy)]
pub(super) enum Locating<'a> {
    /// Re-run both sides with a full capture of the failing seam (the job's first run).
    Rerun,
    /// Take this location when the failure is at the same place (the job's second run).
    From(Option<&'a FirstDivergence>),
}
