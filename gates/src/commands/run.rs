//! `memra-gates run`: a checked plan, the output directory taken, the subject generated or
//! loaded, every job run through the gates, the receipts and matrix outputs written, a table.
//! Without --model or --preset the plan runs the default model set: `tiny` (receipts in --out)
//! and `edge`, built to reach every special path of the arithmetic (receipts in --out/edge, so
//! each directory holds one model's receipts, as `promote` requires).
//! Exit: passed, a gate failed, or an error — and never "passed" when a receipt or an output
//! file could not be written.

use super::{receipts_status, Status};
use crate::args::{Provenance, RunArgs};
use crate::error::GateError;
use crate::outdir::{OutDir, Reuse};
use crate::plan::RunPlan;
use crate::subject::protocol::witness::{OutsideWitness, WitnessMode};
use crate::subject::{External, Subject};
use crate::suite::{Progress, Suite, SuiteOptions};
use memra_receipts::schema as rs;
use memra_runtime::backend::BackendKind;
use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::time::Duration;

/// How progress is shown for `args`.
pub fn progress_of(quiet: bool, every_s: u64) -> Result<Progress, GateError> {
    if quiet {
        return Ok(Progress::Off);
    }
    if std::io::stderr().is_terminal() {
        return Ok(Progress::Terminal);
    }
    if every_s == 0 {
        return Err(GateError::usage("--progress-every 0: use a number of seconds ≥ 1 (or --quiet for no progress)"));
    }
    Ok(Progress::Lines { every: Duration::from_secs(every_s) })
}

pub fn run(args: &RunArgs, prov: Provenance) -> Result<Status, GateError> {
    let plan = RunPlan::from_args(args)?;
    if plan.request.host_clock(&plan.registry) {
        memra_runtime::host_clock::enable();
    }
    let worker_processes =
        super::run_workers::requested(args, plan.backend, super::run_workers::mps_control_pipe().as_deref())?;
    // The outside witness of an external subject's CUDA runs, found (or refused) before any work.
    let witness = match &plan.subject {
        Some(_) => {
            let exe = std::env::current_exe()
                .map_err(|e| GateError::usage(format!("cannot find this executable (for --witness): {e}")))?;
            OutsideWitness::find(WitnessMode::parse(&args.witness)?, &exe, &crate::env::cuda_var)?
        }
        None => None,
    };
    let progress = progress_of(args.quiet, args.progress_every)?;
    let processes = plan.dist.as_ref().map_or(1, |d| d.spec.processes);
    // Only process 0 of a distributed launch writes receipts; the others compute the same ones.
    let writer = plan.dist.as_ref().is_none_or(|d| d.spec.process == 0);
    let RunPlan {
        dist,
        backend,
        matrix_name,
        matrix,
        jobs,
        model,
        battery,
        more_models,
        workers,
        host_ranks,
        subject: manifest,
        ..
    } = plan;
    // Each model's receipts go to their own directory (a night of receipts holds one model, as
    // `promote` requires): the first model's to --out, every further model's (the default model
    // set's edge model) to --out/<preset>.
    let reuse = match (args.resume, args.replace) {
        (true, _) => Reuse::Resume,
        (_, true) => Reuse::Replace,
        _ => Reuse::Fresh,
    };
    // A door-set file's exclusions (it declared `expect_exclusions = true`, or the plan would
    // have been refused) are printed and written into the summary.
    let from_file = matches!(crate::matrix::MatrixKind::parse(&matrix_name), Ok(crate::matrix::MatrixKind::File(_)));
    let excluded: Vec<rs::SummaryExclusion> = if from_file {
        matrix.excluded.iter().map(|e| rs::SummaryExclusion { label: e.config.label(), rule: e.rule.clone() }).collect()
    } else {
        Vec::new()
    };
    for line in crate::matrix::exclusion_lines(if from_file { &matrix.excluded } else { &[] }, usize::MAX) {
        eprintln!("memra-gates: excluded by the rules (the file expects exclusions): {line}");
    }
    let mut subjects = Vec::new();
    // Each written folder's receipt ids (the workers' gathering checks that every one came back).
    let mut expected = Vec::new();
    for (i, (model, battery)) in std::iter::once((model, battery)).chain(more_models).enumerate() {
        let out = if writer {
            let dir = if i == 0 { args.out.clone() } else { args.out.join(&model.evidence.preset) };
            let ids: BTreeSet<String> = jobs
                .iter()
                .map(|j| memra_receipts::run_id(&crate::receipt::config_evidence(j, &model.evidence, &battery)))
                .collect();
            let out = OutDir::take(&dir, &ids, reuse)?;
            expected.push(ids);
            Some(out)
        } else {
            None
        };
        subjects.push((model, battery, out));
    }
    crate::interrupt::report_on_interrupt(
        subjects.iter().filter_map(|(_, _, o)| o.as_ref().map(|o| o.path().to_path_buf())).collect(),
    );
    if let Some(n) = worker_processes {
        // The workers run the plan; this process only gathers their receipts (so nothing below
        // loads a model or opens a backend here).
        let own: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        let outs: Vec<super::run_workers::ModelOut> = subjects
            .iter()
            .enumerate()
            .filter_map(|(i, (m, _, o))| o.as_ref().map(|o| (o, (i > 0).then_some(m.evidence.preset.as_str()))))
            .zip(&expected)
            .map(|((out, sub), ids)| super::run_workers::ModelOut { out, sub, ids })
            .collect();
        let every = match progress {
            Progress::Off => None,
            Progress::Terminal => Some(Duration::from_secs(args.progress_every.max(1))),
            Progress::Lines { every } => Some(every),
        };
        // Host workers share the cores (each process would otherwise start a job per core).
        let jobs = (backend == BackendKind::Host && args.jobs.is_none()).then(|| (workers / n).max(1));
        let per_model = super::run_workers::run(&own, n, &outs, every, jobs)?;
        let dirs: Vec<_> = subjects.into_iter().map(|(_, _, o)| o).zip(per_model).collect();
        let receipts: Vec<_> = dirs.iter().flat_map(|(_, r)| r.iter().cloned()).collect();
        return finish(&matrix_name, &excluded, receipts, dirs, Vec::new());
    }
    let mut receipts = Vec::new();
    let mut dirs = Vec::new();
    let mut write_failures = Vec::new();
    let mut dist_label = String::new();
    for (i, (model, battery, out)) in subjects.into_iter().enumerate() {
        let model_label = format!("{} {}", model.evidence.preset, model.evidence.digest);
        let (mut subject, generate_ms) = model.load_timed(battery, progress == Progress::Off)?;
        subject.host_ranks = host_ranks;
        if let (Some(d), 0) = (&dist, i) {
            let fp = crate::dist::fingerprint(
                &prov,
                processes,
                &matrix_name,
                (&subject.model_evidence, &subject.battery),
                &jobs,
            );
            eprintln!(
                "memra-gates: process {} joins rendezvous {} (plan fingerprint {fp})",
                d.spec.label(),
                d.id_dir.display()
            );
            subject.dist = Some(crate::dist::join(d, &fp)?);
            dist_label = d.spec.label();
        }
        eprintln!(
            "memra-gates: {} configuration(s) of matrix `{matrix_name}` on {} ({} excluded), model {model_label}{}",
            jobs.len(),
            backend.name(),
            matrix.excluded.len(),
            host_ranks_note(host_ranks, backend, workers),
        );
        let opts = SuiteOptions {
            out_dir: out.as_ref().map(|o| o.path().to_path_buf()),
            resume: args.resume,
            workers,
            kernel_digest: prov.kernel_digest.to_string(),
            progress,
            generate_ms,
        };
        // An external subject runs the jobs; the built-in runtime stays the oracle.
        let external = match &manifest {
            Some(m) => Some(External::prepare(m.clone(), &subject, crate::env::memra_names(), witness.clone())?),
            None => None,
        };
        if let Some(e) = &external {
            let m = e.manifest();
            eprintln!("memra-gates: subject {} {} ({})", m.name, m.version, m.path.display());
        }
        let under_test: &dyn Subject = match &external {
            Some(e) => e,
            None => &subject,
        };
        let suite = Suite::new(&subject, under_test, opts)?;
        let done = suite.run_all(&jobs);
        if args.resume {
            eprintln!(
                "memra-gates: --resume kept {} complete receipt(s) and ran {} configuration(s) of model {}",
                done.kept,
                done.receipts.len() - done.kept,
                subject.model_evidence.preset
            );
        }
        write_failures.extend(done.write_failures);
        dirs.push((out, done.receipts.clone()));
        receipts.extend(done.receipts);
    }
    if !writer {
        let summary = rs::Summary::from_receipts(&matrix_name, &receipts);
        let status = receipts_status(&receipts);
        crate::say!(
            "memra-gates: process {dist_label}: {} (receipts are written by process 0); exit {}",
            summary.counts.one_line(),
            status.as_ref().map_or(2, |s| s.exit_code())
        );
        return status;
    }
    finish(&matrix_name, &excluded, receipts, dirs, write_failures)
}

/// The table, then each directory's matrix outputs beside its receipts (none, and the stale ones
/// removed, when a receipt could not be written), then the exit status of the receipts.
fn finish(
    matrix_name: &str,
    excluded: &[rs::SummaryExclusion],
    receipts: Vec<rs::Receipt>,
    dirs: Vec<(Option<OutDir>, Vec<rs::Receipt>)>,
    write_failures: Vec<crate::suite::WriteFailure>,
) -> Result<Status, GateError> {
    crate::say!("{}", memra_tools::table::summary_table(&receipts));
    if !write_failures.is_empty() {
        // A summary would list receipts that are not beside it: the matrix outputs are not
        // written, and stale ones of an earlier run of this plan are removed.
        let mut failed: Vec<(std::path::PathBuf, String)> =
            write_failures.into_iter().map(|w| (w.path, w.error)).collect();
        failed.sort();
        let first = dirs.first().and_then(|d| d.0.as_ref()).map(|o| o.path().to_path_buf()).unwrap_or_default();
        for (out, _) in &dirs {
            let Some(out) = out else { continue };
            for name in crate::outdir::MATRIX_OUTPUTS {
                let _ = std::fs::remove_file(out.path().join(name));
            }
            failed.push((
                out.path().join("summary.json"),
                "not written (nor junit.xml, latency.csv, summary.md, door-effects.json): it would describe receipts that are not there"
                    .into(),
            ));
        }
        return Err(GateError::ReceiptsNotWritten { dir: first, failed });
    }
    for (out, dir_receipts) in &dirs {
        let Some(out) = out else { continue };
        let (summary, mut failed) = out.write_outputs(matrix_name, dir_receipts, excluded);
        crate::say!("{}  → {}", summary.counts.one_line(), out.path().display());
        if !failed.is_empty() {
            failed.sort();
            return Err(GateError::ReceiptsNotWritten { dir: out.path().to_path_buf(), failed });
        }
    }
    if let Some(table) = memra_runtime::host_clock::report() {
        eprint!("{table}");
    }
    receipts_status(&receipts)
}

/// How the host ranks run, for the plan's first line (empty on CUDA).
fn host_ranks_note(
    policy: crate::subject::HostRankPolicy,
    backend: memra_runtime::backend::BackendKind,
    workers: usize,
) -> String {
    if backend != memra_runtime::backend::BackendKind::Host {
        return String::new();
    }
    let mode = |tp| policy.for_tp(tp).name();
    match (mode(1), mode(8)) {
        (one, many) if one == many => format!("; host ranks {one}, {workers} job(s) at a time"),
        (one, many) => format!("; host ranks {one} at TP1, {many} at TP > 1, {workers} job(s) at a time"),
    }
}
