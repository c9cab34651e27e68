//! The subcommands other than `selftest`: run, gen-model, doors, matrix, diff.

use crate::cli::{input, DiffArgs, DoorsArgs, GenModelArgs, MatrixArgs, PlotArgs, PromoteArgs, Provenance, RunArgs};
use crate::error::GateError;
use crate::plan;
use crate::suite::{Suite, SuiteOptions};
use memra_receipts::schema::{Receipt, Summary, Verdict};
use memra_receipts::{export, store};
use std::io::IsTerminal;

/// Exit status of a set of receipts: 1 when any is FAIL, VOID or ERROR; 2 when nothing passed
/// (an empty or all-skipped selection tested nothing); else 0.
pub fn exit_status(receipts: &[Receipt]) -> Result<u8, GateError> {
    let bad = receipts.iter().any(|r| matches!(r.evidence.verdict, Verdict::Fail | Verdict::Void | Verdict::Error));
    if bad {
        return Ok(1);
    }
    if !receipts.iter().any(|r| r.evidence.verdict == Verdict::Pass) {
        return Err(input("nothing was tested: no configuration ran to a verdict (all skipped or not applicable)"));
    }
    Ok(0)
}

/// Write the matrix outputs beside the receipts: summary.json, junit.xml, latency.csv, summary.md.
pub fn write_outputs(dir: &std::path::Path, name: &str, receipts: &[Receipt]) -> Result<Summary, GateError> {
    let summary = Summary::from_receipts(name, receipts);
    store::write_summary(dir, &summary)?;
    store::write_atomic(&dir.join("junit.xml"), export::junit_xml(name, receipts).as_bytes())?;
    store::write_atomic(&dir.join("latency.csv"), export::latency_csv(receipts)?.as_bytes())?;
    store::write_atomic(&dir.join("summary.md"), export::summary_markdown(&summary).as_bytes())?;
    Ok(summary)
}

pub fn run(args: &RunArgs, prov: Provenance) -> Result<u8, GateError> {
    let registry = plan::load_registry(&args.registry)?;
    let req = plan::door_request(&registry, &args.doors)?;
    let dist = crate::dist::dist_plan(args, &req, &registry)?;
    plan::check_battery_flags(args.prompts, args.gen_tokens)?;
    let backend = plan::resolve_backend(&args.backend)?;
    let (name, matrix) = plan::run_matrix(&registry, args, &req, backend)?;
    let processes = dist.as_ref().map_or(1, |d| d.spec.processes);
    let jobs = plan::jobs_of(&registry, &matrix, &req, processes)?;
    if jobs.is_empty() {
        return Err(input(format!("matrix `{name}` selects no configuration: nothing would be tested")));
    }
    let mut subject =
        plan::load_subject(&args.model, |c| plan::battery_of(c, args.battery_seed, args.prompts, args.gen_tokens))?;
    if let Some(d) = &dist {
        let fp = crate::dist::fingerprint(&prov, processes, &name, &subject, &jobs);
        eprintln!(
            "memra-gates: process {} joins rendezvous {} (plan fingerprint {fp})",
            d.spec.label(),
            d.id_dir.display()
        );
        subject.dist = Some(crate::dist::join(d, &fp)?);
    }
    // Only process 0 of a distributed launch writes receipts; the others compute the same ones.
    let writer = dist.as_ref().is_none_or(|d| d.spec.process == 0);
    if writer {
        std::fs::create_dir_all(&args.out).map_err(|e| input(format!("--out {}: {e}", args.out.display())))?;
    }
    let workers = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let opts = SuiteOptions {
        out_dir: writer.then(|| args.out.clone()),
        resume: args.resume,
        workers,
        kernel_digest: prov.kernel_digest.to_string(),
        progress: !args.quiet && std::io::stderr().is_terminal(),
    };
    eprintln!(
        "memra-gates: {} configuration(s) of matrix `{name}` on {} ({} excluded), model {} {}",
        jobs.len(),
        backend.name(),
        matrix.excluded.len(),
        subject.model_evidence.preset,
        subject.model_evidence.digest
    );
    let suite = Suite::new(&subject, opts)?;
    let receipts = suite.run_all(&jobs);
    if !writer {
        let summary = memra_receipts::schema::Summary::from_receipts(&name, &receipts);
        let status = exit_status(&receipts);
        crate::say!(
            "memra-gates: process {}: {} (receipts are written by process 0); exit {}",
            subject.dist.as_ref().map(|d| d.spec.label()).unwrap_or_default(),
            summary.counts.one_line(),
            status.as_ref().map_or(2, |c| *c)
        );
        return status;
    }
    let summary = write_outputs(&args.out, &name, &receipts)?;
    crate::say!("{}", memra_tools::table::summary_table(&receipts));
    crate::say!("{}  → {}", summary.counts.one_line(), args.out.display());
    exit_status(&receipts)
}

pub fn gen_model(args: &GenModelArgs) -> Result<u8, GateError> {
    let cfg = memra_runtime::model::ModelConfig::preset(&args.preset, args.layers)?;
    let model = memra_runtime::model::gen::generate(&cfg, args.seed)?;
    memra_runtime::model::format::save(&model, &args.out)?;
    crate::say!("wrote {} ({} preset, seed {}, {} layers)", args.out.display(), args.preset, args.seed, cfg.layers);
    Ok(0)
}

pub fn doors(args: &DoorsArgs) -> Result<u8, GateError> {
    let registry = plan::load_registry(&args.registry)?;
    if args.json {
        crate::say!("{}", crate::registry_view::to_json(&registry));
    } else {
        crate::say!("{}", crate::registry_view::to_table(&registry));
    }
    Ok(0)
}

pub fn matrix(args: &MatrixArgs) -> Result<u8, GateError> {
    let registry = plan::load_registry(&args.registry)?;
    plan::check_tps(&args.tp)?;
    let transports = plan::parse_transports(&args.transport)?;
    let backends = args
        .backend
        .iter()
        .map(|b| {
            crate::registry::BackendKind::parse(b)
                .ok_or_else(|| input(format!("--backend `{b}` is unknown: use host or cuda")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let kind = crate::matrix::MatrixKind::parse(&args.matrix).map_err(|e| input(e.to_string()))?;
    let mut plan = crate::matrix::enumerate(&registry, &kind, &args.tp, &transports, &backends)
        .map_err(|e| input(e.to_string()))?;
    if let Some(spec) = &args.shard {
        let (i, n) = crate::matrix::parse_shard(spec).map_err(|e| input(e.to_string()))?;
        plan = crate::matrix::shard(&plan, i, n).map_err(|e| input(e.to_string()))?;
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
    }
    Ok(0)
}

pub fn diff(args: &DiffArgs) -> Result<u8, GateError> {
    let load = load_receipts;
    let format: memra_receipts::DiffFormat = args.format.parse().map_err(input)?;
    let (old, new) = (load(&args.old)?, load(&args.new)?);
    if old.is_empty() && new.is_empty() {
        return Err(input(format!(
            "{} and {} hold no receipt: nothing was compared",
            args.old.display(),
            args.new.display()
        )));
    }
    let report = memra_receipts::diff(&old, &new, args.threshold)?;
    crate::say!("{}", report.render(format)?);
    Ok(if report.regressed() { 1 } else { 0 })
}

/// Receipts of a file or a directory.
fn load_receipts(p: &std::path::Path) -> Result<Vec<Receipt>, GateError> {
    if p.is_dir() {
        Ok(store::load_dir(p)?)
    } else {
        Ok(vec![memra_receipts::json::read_receipt(p)?])
    }
}

pub fn plot(args: &PlotArgs) -> Result<u8, GateError> {
    let files = if args.history {
        let sets = args
            .receipts
            .iter()
            .map(|p| {
                Ok((p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), load_receipts(p)?))
            })
            .collect::<Result<Vec<_>, GateError>>()?;
        memra_tools::plot::plot_history(&sets, &args.out)
    } else {
        let mut all = Vec::new();
        for p in &args.receipts {
            all.extend(load_receipts(p)?);
        }
        memra_tools::plot::plot_receipts(&all, &args.out)
    }
    .map_err(|e| input(e.to_string()))?;
    for f in files {
        crate::say!("{}", f.display());
    }
    Ok(0)
}

pub fn promote(args: &PromoteArgs) -> Result<u8, GateError> {
    use crate::promote::{load_history, promote_with, Coverage, Policy};
    let registry = plan::load_registry(&args.registry)?;
    let coverage = Coverage::parse(&args.coverage).map_err(|e| input(e.to_string()))?;
    let policy = Policy::new(args.nights, coverage).map_err(|e| input(e.to_string()))?;
    let nights = load_history(&args.history).map_err(|e| input(e.to_string()))?;
    let report = promote_with(&registry, &nights, policy);
    print!("{}", report.to_table());
    store::write_atomic(&args.out, report.defaults_toml(&registry).as_bytes())?;
    crate::say!("defaults block written to {}", args.out.display());
    Ok(0)
}
