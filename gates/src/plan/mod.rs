//! From parsed flags to a checked plan (ripgrep's low args → high args): the registry, the door
//! requests (environment and flags, strictly), the backend, the matrix, the jobs, the model and
//! the battery. Every check of a request happens here, before any device work, output directory
//! or model generation, so a bad request fails in milliseconds with one clear message.

mod backend;
mod jobs;
mod model;
pub mod parts;

pub use backend::resolve_backend;
pub use jobs::{job_of, jobs_of};
pub use model::{battery_for, check_fits, model_bytes, ModelPlan, ModelSource};

use crate::args::RunArgs;
use crate::dist::DistPlan;
use crate::env::{check_explicit, parse_door_flags, parse_env, DoorRequest};
use crate::error::GateError;
use crate::job::Job;
use crate::matrix::{self, Configuration, MatrixKind, MatrixPlan};
use crate::registry::{BackendKind, Registry};
use crate::subject::protocol::manifest::Manifest;
use memra_runtime::{Battery, Transport};

/// Load the registry named on the command line, or the built-in one.
pub fn load_registry(path: &Option<std::path::PathBuf>) -> Result<Registry, GateError> {
    Ok(match path {
        Some(p) => Registry::from_path(p)?,
        None => Registry::builtin()?,
    })
}

/// Door requests from the process environment, then `--door` flags on top; explicit conflicts
/// are refused with the rule quoted.
pub fn door_request(registry: &Registry, flags: &[String]) -> Result<DoorRequest, GateError> {
    let mut req = parse_env(crate::env::process_vars(), registry)?;
    req.overlay(parse_door_flags(flags, registry)?);
    check_explicit(&req, registry)?;
    Ok(req)
}

/// `--transport` values: known names, each once.
pub fn parse_transports(names: &[String]) -> Result<Vec<Transport>, GateError> {
    let mut out: Vec<Transport> = Vec::new();
    for n in names {
        let t = Transport::parse(n)?;
        if out.contains(&t) {
            return Err(GateError::usage(format!(
                "--transport {}: {n} is given twice (each transport is a column of the matrix; name it once)",
                names.join(",")
            )));
        }
        out.push(t);
    }
    if out.is_empty() {
        return Err(GateError::NothingToTest("--transport is empty: nothing would be tested".into()));
    }
    Ok(out)
}

/// `--tp` values: sizes of the canonical grid, each once.
pub fn check_tps(tps: &[usize]) -> Result<(), GateError> {
    for (i, tp) in tps.iter().enumerate() {
        memra_runtime::config::check_tp(*tp)?;
        if tps[..i].contains(tp) {
            let list: Vec<String> = tps.iter().map(|t| t.to_string()).collect();
            return Err(GateError::usage(format!(
                "--tp {}: TP{tp} is given twice (each TP size is a column of the matrix; name it once)",
                list.join(",")
            )));
        }
    }
    if tps.is_empty() {
        return Err(GateError::NothingToTest("--tp is empty: nothing would be tested".into()));
    }
    Ok(())
}

/// The checked plan of `run`.
pub struct RunPlan {
    pub registry: Registry,
    pub request: DoorRequest,
    /// Set for one process of a run over several (`--process P/N`).
    pub dist: Option<DistPlan>,
    pub backend: BackendKind,
    /// The matrix's name (`single`, a file, or `requested`).
    pub matrix_name: String,
    pub matrix: MatrixPlan,
    pub jobs: Vec<Job>,
    pub model: ModelPlan,
    pub battery: Battery,
    /// Further subjects every job also runs on, after the first: the default model set adds the
    /// `edge` model (built to reach every special path) when no model or preset is named.
    pub more_models: Vec<(ModelPlan, Battery)>,
    /// Parallel host jobs.
    pub workers: usize,
    /// How host runs place their ranks (`--host-ranks`).
    pub host_ranks: crate::subject::HostRankPolicy,
    /// The external subject under test (`--subject`); `None`: the built-in runtime.
    pub subject: Option<Manifest>,
}

impl RunPlan {
    /// Check every flag of `run` (and the environment's doors and settings).
    pub fn from_args(args: &RunArgs) -> Result<RunPlan, GateError> {
        // An external subject brings its own doors: its manifest's registry is the plan's.
        let subject = args.subject.as_deref().map(Manifest::load).transpose()?;
        if let Some(m) = &subject {
            let exe = std::env::current_exe()
                .map_err(|e| GateError::usage(format!("cannot find this executable for {{memra_gates}}: {e}")))?;
            m.check_program(&exe, &crate::env::path_var())?;
        }
        let registry = match &subject {
            Some(m) => m.registry.clone(),
            None => load_registry(&args.registry)?,
        };
        let request = door_request(&registry, &args.doors)?;
        if let Some(m) = &subject {
            let distributed = args.process.is_some() || request.settings.contains_key(crate::registry::PROCESS);
            check_subject_flags(args, distributed, m)?;
        }
        let dist = crate::dist::dist_plan(args, &request, &registry)?;
        let workers = match args.jobs {
            Some(0) => {
                return Err(GateError::usage(
                    "--jobs 0: at least one worker is needed to run anything (use 1 or more, or leave it out for one per core)",
                ))
            }
            Some(n) => n,
            None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        };
        let host_ranks = crate::subject::HostRankPolicy::parse(&args.host_ranks, workers).ok_or_else(|| {
            GateError::usage(format!(
                "--host-ranks {}: use auto, threads (a thread per rank) or inline (every rank on the job's thread)",
                args.host_ranks
            ))
        })?;
        check_tps(&args.tp)?;
        let transports = parse_transports(&args.transport)?;
        let backend = resolve_backend(&args.backend, request.require_gpu(&registry))?;
        let (matrix_name, matrix) = run_matrix(&registry, args, &request, backend, &transports, subject.is_some())?;
        let processes = dist.as_ref().map_or(1, |d| d.spec.processes);
        let jobs = jobs_of(&registry, &matrix, &request, processes, subject.as_ref())?;
        if jobs.is_empty() {
            let shard = args.shard.as_ref().map(|s| format!(" (shard {s})")).unwrap_or_default();
            let mut why = format!("matrix `{matrix_name}`{shard} selects no configuration: nothing would be tested");
            if !matrix.excluded.is_empty() {
                why += &format!(
                    "; the registry's rules exclude {} configuration(s):\n  {}",
                    matrix.excluded.len(),
                    matrix::exclusion_lines(&matrix.excluded, 8).join("\n  ")
                );
            }
            return Err(GateError::NothingToTest(why));
        }
        let model = ModelPlan::from_args(&args.model)?;
        let battery = battery_for(&model.config, args.battery_seed, args.prompts, args.gen_tokens)?;
        // The default model set (no --model, no --preset, one process, the built-in runtime): tiny,
        // then edge. An external subject runs the model it is given, once.
        let mut more_models = Vec::new();
        if args.model.model.is_none() && args.model.preset.is_none() && dist.is_none() && subject.is_none() {
            let mut edge = args.model.clone();
            edge.preset = Some("edge".to_string());
            let edge = ModelPlan::from_args(&edge)?;
            let battery = battery_for(&edge.config, args.battery_seed, args.prompts, args.gen_tokens)?;
            more_models.push((edge, battery));
        }
        Ok(RunPlan {
            registry,
            request,
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
            subject,
        })
    }
}

/// Flags that have no meaning for an external subject, refused with the reason.
fn check_subject_flags(args: &RunArgs, distributed: bool, m: &Manifest) -> Result<(), GateError> {
    let who = format!("--subject {}", m.path.display());
    if distributed {
        return Err(GateError::usage(format!(
            "{who} with --process (or MEMRA_PROCESS): a run over several processes spreads the built-in runtime's ranks; an external subject runs its own ranks in the one process gates starts per run"
        )));
    }
    if args.model.cuda_reserve_gib != 0.0 {
        return Err(GateError::usage(format!(
            "{who} with --cuda-reserve-gib: the planted crowded device is the built-in runtime's fault injection; an external subject allocates its own memory"
        )));
    }
    Ok(())
}

/// The matrix of a `run`: a named matrix filtered by explicit requests, or (without --matrix)
/// the requested door set at every TP size and transport.
fn run_matrix(
    registry: &Registry,
    args: &RunArgs,
    req: &DoorRequest,
    backend: BackendKind,
    transports: &[Transport],
    external: bool,
) -> Result<(String, MatrixPlan), GateError> {
    let kind = args.matrix.as_deref().map(MatrixKind::parse).transpose()?;
    let passes = match (external, &args.batch, &args.columns) {
        // An external subject gets no default multi-lane shapes; asked for, it runs those its
        // manifest declares (protocol 2), the rest NOT-APPLICABLE with the reason.
        (true, None, None) => matrix::Passes::single_only(),
        _ => matrix::Passes::from_flags(kind.as_ref(), args.batch.as_deref(), args.columns.as_deref())?,
    };
    let (name, mut plan) = match (&args.matrix, &kind) {
        (Some(m), Some(kind)) => {
            let plan = matrix::enumerate(registry, kind, &args.tp, transports, &[backend])?;
            let plan = filter_by_request(plan, req);
            // The base door set of the default shapes: the baseline, or (filtered by explicit
            // requests) the smallest set left.
            let base = plan.legal.iter().map(|c| c.doors.clone()).min_by_key(|d| d.len()).unwrap_or_default();
            (m.clone(), passes.apply(plan, &base, registry))
        }
        _ => {
            let doors = req.enabled(registry);
            let mut plan = MatrixPlan::default();
            for &tp in &args.tp {
                for &t in transports {
                    let config = Configuration::single(backend, tp, t, doors.clone());
                    let legality = matrix::classify(registry, &config)?;
                    plan.push(config, legality);
                }
            }
            if plan.legal.is_empty() && plan.not_applicable.is_empty() {
                let why: Vec<String> =
                    plan.excluded.iter().map(|e| format!("{}: {}", e.config.label(), e.rule)).collect();
                return Err(GateError::NothingToTest(format!(
                    "no legal configuration for the requested doors:\n  {}",
                    why.join("\n  ")
                )));
            }
            let plan = passes.apply(plan, &doors, registry);
            ("requested".to_string(), plan)
        }
    };
    if let Some(spec) = &args.shard {
        let (i, n) = matrix::parse_shard(spec)?;
        plan = matrix::shard(&plan, i, n)?;
    }
    // A worker process of `--worker-processes` runs its part of the (sharded) plan: the parts
    // partition any plan, so the workers' parts are the plan exactly.
    if let Some(spec) = &args.worker_shard {
        let (i, n) = matrix::parse_shard(spec)?;
        plan = parts::worker_part(registry, &plan, req, i, n)?;
    }
    Ok((name, plan))
}

/// Explicitly-on doors keep only configurations that contain them; explicitly-off doors drop
/// configurations that contain them (so `MEMRA_X=0 memra-gates --matrix all` excludes door X).
fn filter_by_request(mut plan: MatrixPlan, req: &DoorRequest) -> MatrixPlan {
    let keep = |c: &Configuration| req.doors.iter().all(|(id, on)| c.doors.contains(id) == *on);
    plan.legal.retain(keep);
    plan.not_applicable.retain(|n| keep(&n.config));
    plan
}
