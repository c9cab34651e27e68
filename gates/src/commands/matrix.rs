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
        crate::say!(
            "runs on one model: {runnable} configuration(s) × 2 (the determinism gate's second run) + at least \
             {baselines} census baseline(s) that no configuration's own run provides = {}; {runnable} of them timed \
             (each configuration's first run, the receipt's latencies), {} without timing marks",
            2 * runnable + baselines,
            runnable + baselines
        );
        if let Some(n) = args.worker_processes.filter(|n| *n > 1) {
            let mut parts = Vec::with_capacity(n);
            for part in crate::plan::parts::worker_parts(&registry, &plan, &request, n)? {
                let (r, b) = super::matrix_estimate::runs_of(&registry, &part, &request)?;
                parts.push(2 * r + b.values().sum::<usize>());
            }
            let (largest, at) = parts.iter().enumerate().map(|(i, r)| (*r, i)).max().unwrap_or((0, 0));
            crate::say!(
                "with {n} worker processes: the parts need {} runs in all ({:.2}× one process's {}), the largest \
                 {largest} (part {at}/{n}); a night takes about its largest part's time at the per-run rate of \
                 {n} processes at once",
                parts.iter().sum::<usize>(),
                parts.iter().sum::<usize>() as f64 / (2 * runnable + baselines).max(1) as f64,
                2 * runnable + baselines
            );
        }
        crate::say!("{}", super::matrix_estimate::explain(&registry, &plan.legal, &args.history, &per_backend)?);
    }
    Ok(Status::Passed)
}
