//! `memra-gates matrix`: what `run` with the same flags would run, what is excluded and why, and
//! (with `--explain --history DIR…`) how long it would take, estimated from earlier receipts.

use super::Status;
use crate::args::MatrixArgs;
use crate::error::GateError;
use crate::matrix::{self, Configuration, MatrixKind};
use crate::plan;
use crate::registry::{BackendKind, Registry};
use std::collections::BTreeMap;

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
    let mut plan = matrix::enumerate(&registry, &kind, &args.tp, &transports, &backends)?;
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
        if !args.history.is_empty() {
            crate::say!("{}", estimate(&registry, &plan.legal, &args.history)?);
        }
    }
    Ok(Status::Passed)
}

/// The estimated duration of running `legal`, from the wall times of earlier receipts: a
/// configuration seen before takes its median; one not seen takes the median of its (backend,
/// TP) class, else of everything seen.
fn estimate(registry: &Registry, legal: &[Configuration], history: &[std::path::PathBuf]) -> Result<String, GateError> {
    let mut by_config: BTreeMap<Configuration, Vec<f64>> = BTreeMap::new();
    for dir in history {
        for r in super::load_receipts(dir)? {
            if r.kind == memra_receipts::ReceiptKind::Run
                && r.evidence.verdict != memra_receipts::Verdict::NotApplicable
            {
                by_config
                    .entry(crate::receipt::configuration_of(registry, &r))
                    .or_default()
                    .push(r.measurements.wall_ms);
            }
        }
    }
    if by_config.is_empty() {
        return Err(GateError::usage(format!(
            "matrix --history: no run receipt in {} to estimate from",
            history.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut class: BTreeMap<(BackendKind, usize), Vec<f64>> = BTreeMap::new();
    let mut all = Vec::new();
    for (c, v) in &by_config {
        class.entry((c.backend, c.tp)).or_default().extend(v);
        all.extend(v);
    }
    let overall = median(&mut all);
    let (mut total_ms, mut seen, mut by_class) = (0.0, 0usize, 0usize);
    for c in legal {
        if let Some(v) = by_config.get(c) {
            total_ms += median(&mut v.clone());
            seen += 1;
        } else if let Some(v) = class.get(&(c.backend, c.tp)) {
            total_ms += median(&mut v.clone());
            by_class += 1;
        } else {
            total_ms += overall;
        }
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    Ok(format!(
        "estimated duration: {} of configuration time ({} of {} configurations seen before, {} estimated from their backend and TP, {} from the overall median); host configurations share {cores} core(s), CUDA ones run one at a time",
        crate::suite::clock(total_ms / 1e3),
        seen,
        legal.len(),
        by_class,
        legal.len() - seen - by_class
    ))
}
