//! Configurations resolved into jobs: the runtime's door values, the class of gate with its
//! budgets, the engagement counters, the class baseline, and the NOT-APPLICABLE rules that depend
//! on where the plan runs (transports without meaning there, configurations that cannot span the
//! processes of a distributed launch).

use crate::env::DoorRequest;
use crate::error::GateError;
use crate::job::{CensusDecl, Job, JobClass};
use crate::matrix::{Configuration, MatrixPlan};
use crate::registry::{BackendKind, Door, DoorClass, FlipAt, Registry};
use memra_receipts::schema::Verdict;
use memra_runtime::Transport;
use std::collections::BTreeMap;

/// Resolve configurations into jobs. With `processes` > 1 (a run over several processes),
/// configurations that cannot span them are NOT-APPLICABLE with the rule (`dist::rule`).
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
        BackendKind::Host => Some((
            Verdict::NotApplicable,
            "the nccl transport has no meaning on the host backend: NCCL moves bytes between CUDA devices, and host ranks have no communicator".into(),
        )),
        BackendKind::Cuda => {
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

/// The gate class of a door set: CANARY if it plants a defect, NUMERIC with the widest budget of
/// its NUMERIC doors, else identity.
fn class_of(doors: &[&Door]) -> JobClass {
    if doors.iter().any(|d| d.is_canary()) {
        return JobClass::Canary;
    }
    let numeric: Vec<&&Door> = doors.iter().filter(|d| d.class == DoorClass::Numeric).collect();
    let budget = numeric
        .iter()
        .filter_map(|d| d.error_budget.as_ref())
        .map(|b| (b.near_tie_margin, b.max_rel_error))
        .reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)));
    match budget {
        Some((margin, rel)) => JobClass::Numeric {
            margin_budget: margin as f32,
            rel_budget: rel,
            class_identity: numeric.iter().all(|d| d.gate.has_class_identity()),
        },
        None => JobClass::Identity,
    }
}

/// One configuration as a job.
pub fn job_of(
    registry: &Registry,
    c: &Configuration,
    flip: Option<FlipAt>,
    not_run: Option<(Verdict, String)>,
) -> Result<Job, GateError> {
    let doors: Vec<&Door> = c
        .doors
        .iter()
        .map(|id| registry.door(id).ok_or_else(|| GateError::usage(format!("door `{id}` is not in the registry"))))
        .collect::<Result<_, _>>()?;
    // Each door's census is compared with the same configuration without it and without the
    // doors of the set that require it (they cannot run without it).
    let census = doors
        .iter()
        .map(|d| {
            let off: Vec<&str> = c
                .doors
                .iter()
                .filter(|id| !registry.closure_of([id.as_str()]).contains(&d.id))
                .map(String::as_str)
                .collect();
            Ok(CensusDecl { door: d.id.clone(), changes: d.census.clone(), off: registry.to_door_set(&off, flip)? })
        })
        .collect::<Result<Vec<_>, GateError>>()?;
    Ok(Job {
        doors_env: doors.iter().map(|d| (d.env.clone(), true)).collect(),
        census,
        doors: c.door_set(registry, flip)?,
        class: class_of(&doors),
        engagement: doors.iter().map(|d| (d.id.clone(), d.engagement.clone())).collect::<BTreeMap<_, _>>(),
        tp: c.tp,
        transport: c.transport,
        backend: c.backend,
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

    /// A NUMERIC door combined with a door that needs TP ≥ 2 and native-p2p: the class baseline
    /// runs the whole set, so it must be the smallest TP and the transport that set can run at.
    #[test]
    fn class_baseline_honours_every_door_of_the_set() {
        let reg = Registry::builtin().unwrap();
        let mut c = Configuration::baseline(4, Transport::NativeP2p, BackendKind::Host);
        c.doors = ["qkv_fused", "oproj_direct"].iter().map(|s| s.to_string()).collect();
        let job = job_of(&reg, &c, None, None).unwrap();
        assert_eq!((job.baseline_tp, job.baseline_transport), (2, Transport::NativeP2p));
        c.doors = ["qkv_fused"].iter().map(|s| s.to_string()).collect();
        let job = job_of(&reg, &c, None, None).unwrap();
        assert_eq!((job.baseline_tp, job.baseline_transport), (1, Transport::HostBounce));
    }
}
