//! From parsed flags to a checked plan: registry, door requests (environment + flags, strictly),
//! backend, model, battery, matrix and jobs. All validation happens here, before any run.

use crate::cli::{input, ModelArgs, RunArgs};
use crate::env::{check_explicit, parse_door_flags, parse_env, DoorRequest};
use crate::error::GateError;
use crate::matrix::{self, Configuration, MatrixKind, MatrixPlan};
use crate::registry::{self, DoorClass, Registry};
use crate::suite::{Job, JobClass, Subject};
use memra_receipts::schema::{ModelEvidence, Verdict};
use memra_runtime::backend::BackendKind;
use memra_runtime::model::{format, gen, ModelConfig};
use memra_runtime::{Battery, Transport};
use std::collections::BTreeMap;

/// Load the registry named on the command line, or the built-in one.
pub fn load_registry(path: &Option<std::path::PathBuf>) -> Result<Registry, GateError> {
    let r = match path {
        Some(p) => Registry::from_path(p),
        None => Registry::builtin(),
    };
    r.map_err(|e| input(e.to_string()))
}

/// Door requests from the process environment, then `--door` flags on top; explicit conflicts
/// are refused with the rule quoted.
pub fn door_request(registry: &Registry, flags: &[String]) -> Result<DoorRequest, GateError> {
    let mut req = parse_env(crate::env::process_vars(), registry).map_err(|e| input(e.to_string()))?;
    req.overlay(parse_door_flags(flags, registry).map_err(|e| input(e.to_string()))?);
    check_explicit(&req, registry).map_err(|e| input(e.to_string()))?;
    Ok(req)
}

/// `auto` takes CUDA when a driver and a device are present, and says which it took.
pub fn resolve_backend(name: &str) -> Result<BackendKind, GateError> {
    match name {
        "host" => Ok(BackendKind::Host),
        "cuda" => match memra_runtime::backend::cuda_available() {
            Ok(desc) => {
                eprintln!("memra-gates: backend cuda ({desc})");
                Ok(BackendKind::Cuda)
            }
            Err(reason) => Err(input(format!("--backend cuda: {reason}"))),
        },
        "auto" => match memra_runtime::backend::cuda_available() {
            Ok(desc) => {
                eprintln!("memra-gates: backend auto → cuda ({desc})");
                Ok(BackendKind::Cuda)
            }
            Err(reason) => {
                eprintln!("memra-gates: backend auto → host ({reason})");
                Ok(BackendKind::Host)
            }
        },
        other => Err(input(format!("--backend `{other}` is unknown: use auto, host or cuda"))),
    }
}

/// The model and its evidence (preset name and a digest of the file bytes).
pub fn load_subject(m: &ModelArgs, battery: impl FnOnce(&ModelConfig) -> Battery) -> Result<Subject, GateError> {
    let (model, preset, digest) = match &m.model {
        Some(path) => {
            // The digest is of the file's bytes: the weights exactly as loaded.
            let bytes = std::fs::read(path).map_err(|e| input(format!("--model {}: {e}", path.display())))?;
            let model = format::from_bytes(&bytes, path)?;
            (model, "file".to_string(), format!("{:016x}", memra_receipts::schema::fnv1a64(&bytes)))
        }
        None => {
            // A generated model is a pure function of (config, seed): its identity is their
            // digest (serializing the `step` preset just to hash it would cost gigabytes).
            let cfg = ModelConfig::preset(&m.preset, m.layers)?;
            let identity = format!("generated:{}:{}", serde_json::to_string(&cfg).unwrap_or_default(), m.seed);
            let digest = format!("{:016x}", memra_receipts::schema::fnv1a64(identity.as_bytes()));
            (gen::generate(&cfg, m.seed)?, m.preset.clone(), digest)
        }
    };
    let mut model = model;
    let mut digest = digest;
    if let Some(n) = m.kv_positions {
        model.config.max_positions = n;
        model.config.validate()?;
        // A different cache capacity is a different subject: keep run identities apart.
        digest = format!("{:016x}", memra_receipts::schema::fnv1a64(format!("{digest}:kv{n}").as_bytes()));
    }
    let battery = battery(&model.config);
    let device_reserve_bytes = (m.cuda_reserve_gib * (1u64 << 30) as f64) as usize;
    Ok(Subject { model, model_evidence: ModelEvidence { preset, digest }, battery, device_reserve_bytes, dist: None })
}

/// Battery sizes are checked before any model is generated: 0 prompts or 0 generated tokens
/// would test nothing.
pub fn check_battery_flags(prompts: Option<usize>, gen_tokens: Option<usize>) -> Result<(), GateError> {
    if prompts == Some(0) {
        return Err(input("--prompts 0 selects no prompt: nothing would be tested (use 1 to 8)"));
    }
    if gen_tokens == Some(0) {
        return Err(input("--gen-tokens 0 generates no token: nothing would be tested"));
    }
    Ok(())
}

/// The battery of a run: the documented default, optionally shortened.
pub fn battery_of(cfg: &ModelConfig, seed: u64, prompts: Option<usize>, gen_tokens: Option<usize>) -> Battery {
    let mut b = Battery::default_for(cfg.vocab, seed);
    if let Some(n) = prompts {
        b.prompts.truncate(n);
    }
    if let Some(g) = gen_tokens {
        b.gen_tokens = g;
    }
    b
}

pub fn parse_transports(names: &[String]) -> Result<Vec<Transport>, GateError> {
    names.iter().map(|n| Transport::parse(n).map_err(GateError::from)).collect()
}

pub fn check_tps(tps: &[usize]) -> Result<(), GateError> {
    for tp in tps {
        memra_runtime::config::check_tp(*tp)?;
    }
    if tps.is_empty() {
        return Err(input("--tp is empty: nothing would be tested"));
    }
    Ok(())
}

fn registry_backend(b: BackendKind) -> registry::BackendKind {
    match b {
        BackendKind::Host => registry::BackendKind::Host,
        BackendKind::Cuda => registry::BackendKind::Cuda,
    }
}

/// The matrix of a `run`: a named matrix filtered by explicit requests, or (without --matrix)
/// the requested door set at every TP size and transport.
pub fn run_matrix(
    registry: &Registry,
    args: &RunArgs,
    req: &DoorRequest,
    backend: BackendKind,
) -> Result<(String, MatrixPlan), GateError> {
    check_tps(&args.tp)?;
    let transports = parse_transports(&args.transport)?;
    let backends = [registry_backend(backend)];
    let (name, mut plan) = match &args.matrix {
        Some(m) => {
            let kind = MatrixKind::parse(m).map_err(|e| input(e.to_string()))?;
            let plan = matrix::enumerate(registry, &kind, &args.tp, &transports, &backends)
                .map_err(|e| input(e.to_string()))?;
            (m.clone(), filter_by_request(plan, req))
        }
        None => {
            let doors = req.enabled(registry);
            let mut plan = MatrixPlan::default();
            for &tp in &args.tp {
                for &t in &transports {
                    let config = Configuration { backend: backends[0], tp, transport: t, doors: doors.clone() };
                    match matrix::classify(registry, &config).map_err(|e| input(e.to_string()))? {
                        matrix::Legality::Legal => plan.legal.push(config),
                        matrix::Legality::Excluded(rule) => plan.excluded.push(matrix::Exclusion { config, rule }),
                        matrix::Legality::NotApplicable(reason) => {
                            plan.not_applicable.push(matrix::NotApplicable { config, reason })
                        }
                    }
                }
            }
            if plan.legal.is_empty() && plan.not_applicable.is_empty() {
                let why: Vec<String> =
                    plan.excluded.iter().map(|e| format!("{}: {}", e.config.label(), e.rule)).collect();
                return Err(input(format!("no legal configuration for the requested doors:\n  {}", why.join("\n  "))));
            }
            ("requested".to_string(), plan)
        }
    };
    if let Some(spec) = &args.shard {
        let (i, n) = matrix::parse_shard(spec).map_err(|e| input(e.to_string()))?;
        plan = matrix::shard(&plan, i, n).map_err(|e| input(e.to_string()))?;
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

/// Resolve configurations into jobs: class, budgets, engagement counters, runtime door values.
/// With `processes` > 1 (a run over several processes), configurations that cannot span them
/// are NOT-APPLICABLE with the rule (`dist::rule`).
pub fn jobs_of(
    registry: &Registry,
    plan: &MatrixPlan,
    req: &DoorRequest,
    processes: usize,
) -> Result<Vec<Job>, GateError> {
    let flip = req.canary_flip_at(registry);
    let mut jobs = Vec::new();
    for c in &plan.legal {
        let not_run = crate::dist::rule(c, processes)
            .map(|r| (Verdict::NotApplicable, r))
            .or_else(|| transport_not_applicable(c, processes));
        jobs.push(job_of(registry, c, flip, not_run)?);
    }
    for n in &plan.not_applicable {
        jobs.push(job_of(registry, &n.config, flip, Some((Verdict::NotApplicable, n.reason.clone())))?);
    }
    Ok(jobs)
}

/// Transports that have no meaning where a configuration would run: NCCL needs CUDA devices, one
/// per rank (per rank this process holds, when `processes` share the ranks). Such runs are
/// NOT-APPLICABLE, never silently run over another transport.
fn transport_not_applicable(c: &Configuration, processes: usize) -> Option<(Verdict, String)> {
    if c.transport != Transport::Nccl {
        return None;
    }
    match c.backend {
        registry::BackendKind::Host => Some((
            Verdict::NotApplicable,
            "the nccl transport has no meaning on the host backend: NCCL moves bytes between CUDA devices, and host ranks have no communicator".into(),
        )),
        registry::BackendKind::Cuda => {
            let devices = memra_runtime::backend::cuda_device_count();
            let local = c.tp / processes.max(1);
            (devices < local).then(|| {
                let per = if processes > 1 { format!(" ({local} rank(s) in each of {processes} processes)") } else { String::new() };
                (
                    Verdict::NotApplicable,
                    format!("the nccl transport needs one CUDA device per rank: TP{}{per} but {devices} device(s) visible to this process (co-resident ranks cannot form a NCCL communicator)", c.tp),
                )
            })
        }
    }
}

pub fn job_of(
    registry: &Registry,
    c: &Configuration,
    flip: Option<registry::FlipAt>,
    not_run: Option<(Verdict, String)>,
) -> Result<Job, GateError> {
    let doors: Vec<&registry::Door> = c
        .doors
        .iter()
        .map(|id| registry.door(id).ok_or_else(|| input(format!("door `{id}` is not in the registry"))))
        .collect::<Result<_, _>>()?;
    let class = if doors.iter().any(|d| d.is_canary()) {
        JobClass::Canary
    } else if let Some(budget) = doors
        .iter()
        .filter(|d| d.class == DoorClass::Numeric)
        .filter_map(|d| d.error_budget.as_ref())
        .map(|b| (b.near_tie_margin, b.max_rel_error))
        .reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)))
    {
        let class_identity =
            doors.iter().filter(|d| d.class == DoorClass::Numeric).all(|d| d.gate.has_class_identity());
        JobClass::Numeric { margin_budget: budget.0 as f32, rel_budget: budget.1, class_identity }
    } else {
        JobClass::Identity
    };
    let door_set = c.door_set(registry, flip).map_err(|e| input(e.to_string()))?;
    Ok(Job {
        doors_env: doors.iter().map(|d| (d.env.clone(), true)).collect(),
        doors: door_set,
        class,
        engagement: doors.iter().map(|d| (d.id.clone(), d.engagement.clone())).collect::<BTreeMap<_, _>>(),
        tp: c.tp,
        transport: c.transport,
        backend: match c.backend {
            registry::BackendKind::Host => BackendKind::Host,
            registry::BackendKind::Cuda => BackendKind::Cuda,
        },
        // The class baseline runs the whole door set, so every door's TP and transport rules
        // bind it, not only the NUMERIC doors' (a peer-store door cannot run at TP1 or over
        // host-bounce).
        baseline_tp: doors.iter().filter_map(|d| d.tp.allowed.iter().min().copied()).max().unwrap_or(1),
        baseline_transport: doors
            .iter()
            .filter(|d| !d.transports.contains(&Transport::HostBounce))
            .find_map(|d| d.transports.allowed.first().copied())
            .unwrap_or(Transport::HostBounce),
        not_run,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Configuration;

    /// A NUMERIC door combined with a door that needs TP ≥ 2 and native-p2p: the class baseline
    /// runs the whole set, so it must be the smallest TP and the transport that set can run at.
    #[test]
    fn class_baseline_honours_every_door_of_the_set() {
        let reg = load_registry(&None).unwrap();
        let mut c = Configuration::baseline(4, Transport::NativeP2p, registry::BackendKind::Host);
        c.doors = ["qkv_fused", "oproj_direct"].iter().map(|s| s.to_string()).collect();
        let job = job_of(&reg, &c, None, None).unwrap();
        assert_eq!((job.baseline_tp, job.baseline_transport), (2, Transport::NativeP2p));
        c.doors = ["qkv_fused"].iter().map(|s| s.to_string()).collect();
        let job = job_of(&reg, &c, None, None).unwrap();
        assert_eq!((job.baseline_tp, job.baseline_transport), (1, Transport::HostBounce));
    }
}
