//! `memra-gates matrix`: what `run` with the same flags would run, what is excluded and why, and
//! (with `--explain --history DIR…`) how long it would take, estimated from earlier receipts.

use super::Status;
use crate::args::MatrixArgs;
use crate::error::GateError;
use crate::matrix::{self, MatrixKind};
use crate::plan;
use crate::registry::BackendKind;

/// `--backend` values as `run` resolves them (`auto` probes for CUDA, and takes the host when
/// there is none unless MEMRA_REQUIRE_GPU=1).
fn backends(args: &MatrixArgs, require_gpu: bool) -> Result<Vec<BackendKind>, GateError> {
    let mut out = Vec::new();
    for b in &args.backend {
        let kind = match BackendKind::parse(b) {
            Some(k) => k,
            None if b == "auto" => plan::resolve_backend(b, require_gpu)?,
            None => return Err(GateError::usage(format!("--backend `{b}` is unknown: use auto, host or cuda"))),
        };
        if out.contains(&kind) {
            return Err(GateError::usage(format!(
                "--backend {}: {} is given twice",
                args.backend.join(","),
                kind.name()
            )));
        }
        out.push(kind);
    }
    Ok(out)
}

pub fn matrix(args: &MatrixArgs) -> Result<Status, GateError> {
    let registry = plan::load_registry(&args.registry)?;
    let request = plan::door_request(&registry, &[])?;
    plan::check_tps(&args.tp)?;
    let transports = plan::parse_transports(&args.transport)?;
    let backends = backends(args, request.require_gpu(&registry))?;
    let kind = MatrixKind::parse(&args.matrix)?;
    let plan = matrix::enumerate(&registry, &kind, &args.tp, &transports, &backends)?;
    let passes = matrix::Passes::from_flags(Some(&kind), args.batch.as_deref(), args.columns.as_deref())?;
    let mut plan = passes.apply(plan, &Default::default(), &registry);
    if let Some(spec) = &args.shard {
        let (i, n) = matrix::parse_shard(spec)?;
        plan = matrix::shard(&plan, i, n)?;
    }
    for c in &plan.legal {
        crate::say!("{}", c.label());
    }
    for n in &plan.not_applicable {
        crate::say!("{}  NOT-APPLICABLE: {}", n.config.label(), n.reason);
    }
    crate::say!(
        "{} legal, {} not applicable, {} excluded",
        plan.legal.len(),
        plan.not_applicable.len(),
        plan.excluded.len()
    );
    if args.explain {
        crate::say!("{}", plan.explain());
        let (runnable, per_backend) = super::matrix_estimate::runs_of(&registry, &plan, &request)?;
        let baselines: usize = per_backend.values().sum();
        let whole = 2 * runnable + baselines;
        let weight = crate::plan::parts::rank_runs(&registry, &plan, &request)?;
        crate::say!(
            "runs on one model: {runnable} configuration(s) × 2 (the determinism gate's second run) + at least \
             {baselines} census baseline(s) that no configuration's own run provides = {whole}; {runnable} of them \
             timed (each configuration's first run, the receipt's latencies), {} without timing marks; {weight} \
             rank-runs (each run × its TP size: a CUDA run's host time grows with its ranks)",
            runnable + baselines
        );
        let history = super::matrix_estimate::load_history(&registry, &args.history)?;
        if let Some(n) = args.worker_processes.filter(|n| *n > 1) {
            let mut parts = Vec::with_capacity(n);
            let mut walls = Vec::with_capacity(n);
            for part in crate::plan::parts::worker_parts(&registry, &plan, &request, n)? {
                let (r, b) = super::matrix_estimate::runs_of(&registry, &part, &request)?;
                parts.push((
                    crate::plan::parts::rank_runs(&registry, &part, &request)?,
                    2 * r + b.values().sum::<usize>(),
                ));
                if let Some(h) = &history {
                    walls.push(super::matrix_estimate::wall_of(&registry, &part.legal, b, h));
                }
            }
            let sum: usize = parts.iter().map(|(_, r)| r).sum();
            let (at, (heaviest, its_runs)) =
                parts.iter().copied().enumerate().max_by_key(|(i, (w, _))| (*w, usize::MAX - i)).unwrap_or_default();
            crate::say!(
                "with {n} worker processes: the parts need {sum} runs in all ({:.2}× one process's {whole}); the \
                 heaviest, part {at}/{n}: {its_runs} runs, {heaviest} rank-runs, {:.3} of one process's {weight} — a \
                 night takes about that share of one process's time × {n} ÷ the throughput gain of {n} processes at \
                 once under MPS",
                sum as f64 / whole.max(1) as f64,
                heaviest as f64 / weight.max(1) as f64,
            );
            if let Some((longest, ms)) = walls.iter().copied().enumerate().max_by(|a, b| a.1.total_cmp(&b.1)) {
                crate::say!(
                    "with {n} worker processes, from the history: the longest part, {longest}/{n}, takes {} in one \
                     process (the parts {} to {}) — the night is that × {n} ÷ the throughput gain of {n} processes \
                     at once under MPS",
                    crate::suite::clock(ms / 1e3),
                    crate::suite::clock(walls.iter().copied().fold(f64::INFINITY, f64::min) / 1e3),
                    crate::suite::clock(ms / 1e3),
                );
            }
        }
        crate::say!("{}", super::matrix_estimate::explain(&registry, &plan.legal, history.as_ref(), &per_backend));
    }
    Ok(Status::Passed)
}
