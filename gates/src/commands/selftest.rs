//! `memra-gates selftest`: every canary's gate must FAIL, at the place its defect predicts; and a
//! NUMERIC-CLASS door that turns out bit-identical is reported (its class may be mislabeled).
//!
//! The expected first divergence of each canary is derived from the canary's own definition
//! (where it plants the defect), never from a previous run.

use super::Status;
use crate::args::{Provenance, SelftestArgs};
use crate::error::GateError;
use crate::matrix::{self, MatrixKind};
use crate::outdir::{OutDir, Reuse};
use crate::plan::{self, ModelPlan};
use crate::registry::{self, DoorClass};
use crate::subject::RunSpec;
use crate::suite::{Progress, Suite, SuiteOptions};
use memra_receipts::schema::{Gate, Verdict};
use memra_runtime::record::Seam;
use memra_runtime::{Canary, Transport};
use std::collections::BTreeSet;

/// Where a canary's defect must first show: (prompt, step, layer, seam).
pub fn expected_divergence(c: &Canary) -> Option<(usize, usize, usize, Seam)> {
    match *c {
        Canary::FlipBit { layer, seam, step } => Some((0, step, layer, seam)),
        // The reversed fold changes the first o_join it touches.
        Canary::ReverseKBlocks => Some((0, 0, 0, Seam::OJoin)),
        // The first step has no previous step: the stale read shows at step 1.
        Canary::StaleBuffer => Some((0, 1, 0, Seam::OJoin)),
        // A race: any divergence (identity or determinism) catches it.
        Canary::SkipFence => None,
    }
}

pub fn selftest(args: &SelftestArgs, prov: Provenance) -> Result<Status, GateError> {
    let registry = plan::load_registry(&None)?;
    let req = plan::door_request(&registry, &[])?;
    let backend = plan::resolve_backend(&args.backend, req.require_gpu(&registry))?;
    // TP2: the reversed K-block fold needs more than one rank.
    let canaries = matrix::enumerate(&registry, &MatrixKind::Canaries, &[2], &[Transport::HostBounce], &[backend])?;
    let mut jobs = plan::jobs_of(&registry, &canaries, &req, 1, None)?;
    if let Some(id) = &args.disarm {
        let job = jobs
            .iter_mut()
            .find(|j| j.doors.canary.map(|c| registry::canary_id(&c)) == Some(id.as_str()))
            .ok_or_else(|| GateError::usage(format!("--disarm {id}: no such canary in this selftest")))?;
        eprintln!("memra-gates: selftest with canary {id} DISARMED (its defect is not planted)");
        job.doors.canary = None;
    }
    let model = ModelPlan::from_args(&args.model)?;
    let battery = plan::battery_for(&model.config, 1, Some(args.prompts), None)?;
    let ids: BTreeSet<String> = jobs
        .iter()
        .map(|j| memra_receipts::run_id(&crate::receipt::config_evidence(j, &model.evidence, &battery)))
        .collect();
    let out = OutDir::take(&args.out, &ids, Reuse::Fresh)?;
    let subject = model.load(battery)?;
    let opts = SuiteOptions {
        out_dir: Some(out.path().to_path_buf()),
        resume: false,
        workers: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        kernel_digest: prov.kernel_digest.to_string(),
        progress: Progress::Off,
    };
    let suite = Suite::new(&subject, &subject, opts)?;
    let done = suite.run_all(&jobs);
    let (_, mut failed) = out.write_outputs("selftest", &done.receipts);
    failed.extend(done.write_failures.into_iter().map(|w| (w.path, w.error)));
    if !failed.is_empty() {
        return Err(GateError::ReceiptsNotWritten { dir: out.path().to_path_buf(), failed });
    }
    let receipts = done.receipts;

    let mut all_caught = true;
    let mut ran = 0;
    crate::say!("{:<26} {:<16} {:<28} {:<40}", "canary", "verdict", "expected first divergence", "observed");
    for (job, r) in jobs.iter().zip(&receipts) {
        let ev = &r.evidence;
        let name = job.engagement.keys().next().cloned().unwrap_or_default();
        if ev.verdict == Verdict::NotApplicable {
            crate::say!("{name:<26} {:<16} {:<28} {}", "NOT-APPLICABLE", "-", ev.reason.clone().unwrap_or_default());
            continue;
        }
        ran += 1;
        let canary = registry
            .to_door_set(&BTreeSet::from([name.clone()]), req.canary_flip_at(&registry))
            .ok()
            .and_then(|d| d.canary);
        let expected = canary.as_ref().and_then(expected_divergence);
        let observed = ev.first_divergence.as_ref();
        let identity_failed = ev.gates.iter().any(|g| g.gate == Gate::Identity && g.verdict == Verdict::Fail);
        let determinism_failed = ev.gates.iter().any(|g| g.gate == Gate::Determinism && g.verdict == Verdict::Fail);
        let caught = match (expected, observed) {
            (Some((p, s, l, seam)), Some(d)) => {
                identity_failed && d.prompt == p && d.step == s && d.layer == l && d.seam == seam.name()
            }
            (Some(_), None) => false,
            (None, _) => identity_failed || determinism_failed,
        };
        all_caught &= caught;
        let exp = expected.map(|(p, s, l, seam)| format!("L{l}.{} p{p} s{s}", seam.name())).unwrap_or("any".into());
        let obs = observed.map(|d| d.short()).unwrap_or_else(|| ev.reason.clone().unwrap_or("no divergence".into()));
        crate::say!("{name:<26} {:<16} {exp:<28} {obs}", if caught { "CAUGHT" } else { "MISSED" });
    }
    if ran == 0 {
        return Err(GateError::NothingToTest("selftest ran no canary: nothing was tested".into()));
    }

    // NUMERIC-CLASS doors that change nothing may be mislabeled.
    for door in registry.doors().iter().filter(|d| d.class == DoorClass::Numeric && d.backends.contains(&backend)) {
        let tp = if door.tp.contains(&1) { 1 } else { door.tp.allowed.first().copied().unwrap_or(2) };
        let transport = if door.transports.contains(&Transport::HostBounce) {
            Transport::HostBounce
        } else {
            door.transports.allowed[0]
        };
        let doors = registry.to_door_set(&BTreeSet::from([door.id.clone()]), None)?;
        let mut spec = RunSpec::oracle(backend, memra_runtime::ExpertFormat::E4m3);
        (spec.tp, spec.transport, spec.doors, spec.forced) = (tp, transport, doors, Some(suite.oracle()));
        match subject.run_canonical(spec) {
            Ok(r) if r.digests == suite.oracle().digests => {
                crate::say!(
                    "{:<26} WARNING: bit-identical to the oracle at TP{tp} {}: its NUMERIC class may be mislabeled",
                    door.id,
                    transport.name()
                );
            }
            Ok(_) => crate::say!("{:<26} changes arithmetic as its NUMERIC class says", door.id),
            Err(e) => crate::say!("{:<26} could not run: {e}", door.id),
        }
    }
    if all_caught {
        crate::say!("selftest: every canary was caught");
        Ok(Status::Passed)
    } else {
        crate::say!("selftest: FAILED — a planted defect went unnoticed");
        Ok(Status::Failed)
    }
}
