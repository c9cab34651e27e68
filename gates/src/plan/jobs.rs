//! Configurations resolved into jobs: the runtime's door values, the class of gate with its
//! budgets, the engagement counters, the class baseline, and the NOT-APPLICABLE rules that depend
//! on where the plan runs (transports without meaning there, configurations that cannot span the
//! processes of a distributed launch, configurations outside an external subject's manifest).

use crate::env::DoorRequest;
use crate::error::GateError;
use crate::job::{CensusDecl, Job, JobClass};
use crate::matrix::{Configuration, MatrixPlan};
use crate::registry::census::{CensusChange, Change};
use crate::registry::{BackendKind, Door, DoorClass, FlipAt, Registry};
use crate::subject::protocol::manifest::{Manifest, SubjectClass};
use crate::subject::BUILTIN_NAME;
use memra_receipts::schema::Verdict;
use memra_runtime::{DoorSet, Transport};
use std::collections::BTreeMap;

/// Resolve configurations into jobs. With `processes` > 1 (a run over several processes),
/// configurations that cannot span them are NOT-APPLICABLE with the rule (`dist::rule`); with an
/// external `subject`, so are those outside its manifest.
pub fn jobs_of(
    registry: &Registry,
    plan: &MatrixPlan,
    req: &DoorRequest,
    processes: usize,
    subject: Option<&Manifest>,
) -> Result<Vec<Job>, GateError> {
    let flip = req.canary_flip_at(registry);
    let mut jobs = Vec::new();
    for c in &plan.legal {
        let not_run = crate::dist::rule(c, processes)
            .map(|r| (Verdict::NotApplicable, r))
            .or_else(|| transport_not_applicable(c, processes))
            // Outside the manifest: its backends, TP sizes, transports and pass shapes.
            .or_else(|| subject.and_then(|m| m.not_applicable(c)).map(|r| (Verdict::NotApplicable, r)));
        jobs.push(job_of(registry, c, flip, not_run, subject)?);
    }
    for n in &plan.not_applicable {
        jobs.push(job_of(registry, &n.config, flip, Some((Verdict::NotApplicable, n.reason.clone())), subject)?);
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
/// its NUMERIC doors and of a NUMERIC-class subject, else identity.
fn class_of(doors: &[&Door], subject: Option<&SubjectClass>) -> JobClass {
    if doors.iter().any(|d| d.is_canary()) {
        return JobClass::Canary;
    }
    let numeric: Vec<&&Door> = doors.iter().filter(|d| d.class == DoorClass::Numeric).collect();
    let (subject_budget, subject_identity) = match subject {
        Some(SubjectClass::Numeric { budget, class_identity }) => (Some(budget), *class_identity),
        _ => (None, true),
    };
    let budget = numeric
        .iter()
        .filter_map(|d| d.error_budget.as_ref())
        .chain(subject_budget)
        .map(|b| (b.near_tie_margin, b.max_rel_error))
        .reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)));
    match budget {
        Some((margin, rel)) => JobClass::Numeric {
            margin_budget: margin as f32,
            rel_budget: rel,
            class_identity: subject_identity && numeric.iter().all(|d| d.gate.has_class_identity()),
        },
        None => JobClass::Identity,
    }
}

/// One configuration as a job (of the built-in runtime, or of an external `subject`).
/// A door's census declaration in a job with the doors `enabled`: its own changes, and the host
/// program that a door requiring it would move onto the device (that door declares `read.*` /
/// `write.*` fewer) while that door is off — the same counters must then be higher than without
/// this door (STEP_EP's expert-parallel arithmetic is a host program unless
/// EP_DEVICE_ARITHMETIC is on). Declared, that host traffic is this door's to show, so the
/// round-trip rule of the engagement gate does not read it as a mechanism replaced by the host.
fn with_host_default(registry: &Registry, d: &Door, enabled: &std::collections::BTreeSet<String>) -> Vec<CensusChange> {
    let mut changes = d.census.clone();
    let host = |c: &&CensusChange| {
        c.change == Change::Fewer
            && c.counter.split('+').any(|t| t.trim().starts_with("read.") || t.trim().starts_with("write."))
    };
    for r in registry.doors() {
        if enabled.contains(&r.id) || !r.requires.iter().any(|l| l.id == d.id) {
            continue;
        }
        for c in r.census.iter().filter(host) {
            changes.push(CensusChange { counter: c.counter.clone(), change: Change::More });
        }
    }
    changes
}

pub fn job_of(
    registry: &Registry,
    c: &Configuration,
    flip: Option<FlipAt>,
    not_run: Option<(Verdict, String)>,
    subject: Option<&Manifest>,
) -> Result<Job, GateError> {
    let doors: Vec<&Door> = c
        .doors
        .iter()
        .map(|id| registry.door(id).ok_or_else(|| GateError::usage(format!("door `{id}` is not in the registry"))))
        .collect::<Result<_, _>>()?;
    // The class baseline runs the whole door set, so every door's TP and transport rules
    // bind it, not only the NUMERIC doors' (a peer-store door cannot run at TP1 or over
    // host-bounce); an external subject's manifest binds it too.
    let mut baseline_tp = doors.iter().filter_map(|d| d.tp.allowed.iter().min().copied()).max().unwrap_or(1);
    let mut baseline_transport = doors
        .iter()
        .filter(|d| !d.transports.contains(&Transport::HostBounce))
        .find_map(|d| d.transports.allowed.first().copied())
        .unwrap_or(Transport::HostBounce);
    if let Some(m) = subject {
        let every = |tp: usize, t: Transport| doors.iter().all(|d| d.tp.contains(&tp) && d.transports.contains(&t));
        let mut tps: Vec<usize> = m.tp.iter().copied().filter(|tp| *tp >= baseline_tp).collect();
        tps.sort_unstable();
        let transports = || std::iter::once(Transport::HostBounce).chain(m.transports.iter().copied());
        if let Some((tp, t)) = tps
            .into_iter()
            .flat_map(|tp| transports().map(move |t| (tp, t)))
            .find(|(tp, t)| m.transports.contains(t) && every(*tp, *t))
        {
            (baseline_tp, baseline_transport) = (tp, t);
        }
    }
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
            let off_vars = off.iter().filter_map(|id| registry.door(id)).map(|d| (d.env.clone(), true)).collect();
            let exact = |d: &Door| {
                matches!(d.class, DoorClass::BitIdentical | DoorClass::ValueIdentical | DoorClass::SchedulingOnly)
            };
            let dropped = doors.iter().filter(|x| !off.contains(&x.id.as_str()));
            Ok(CensusDecl {
                door: d.id.clone(),
                changes: with_host_default(registry, d, &c.doors),
                off: registry.to_door_set(&off, flip)?,
                off_vars,
                identity: dropped.clone().all(|x| exact(x)).then(|| d.class.name()),
            })
        })
        .collect::<Result<Vec<_>, GateError>>()?;
    Ok(Job {
        subject: subject.map_or(BUILTIN_NAME, |m| m.name.as_str()).to_string(),
        doors_env: doors.iter().map(|d| (d.env.clone(), true)).collect(),
        census,
        // A subject's own doors have no field in the built-in runtime's door values.
        doors: if subject.is_none_or(|m| m.builtin_doors) { c.door_set(registry, flip)? } else { DoorSet::default() },
        class: class_of(&doors, subject.map(|m| &m.class)),
        engagement: doors.iter().map(|d| (d.id.clone(), d.engagement.clone())).collect::<BTreeMap<_, _>>(),
        tp: c.tp,
        transport: c.transport,
        backend: c.backend,
        baseline_tp,
        baseline_transport,
        not_run,
        pass: c.pass(),
        canary_held_to_doors: doors.iter().any(|d| d.is_canary())
            && doors.iter().any(|d| d.class == DoorClass::Numeric),
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
        let job = job_of(&reg, &c, None, None, None).unwrap();
        assert_eq!((job.baseline_tp, job.baseline_transport), (2, Transport::NativeP2p));
        c.doors = ["qkv_fused"].iter().map(|s| s.to_string()).collect();
        let job = job_of(&reg, &c, None, None, None).unwrap();
        assert_eq!((job.baseline_tp, job.baseline_transport), (1, Transport::HostBounce));
    }

    /// A canary in a NUMERIC door set (the slot-order canary under NVFP4_EP2) is held to identity
    /// with its doors without it; a canary among exact doors (the silent fallback under
    /// OPROJ_DIRECT), and the NUMERIC set without a canary, are not.
    #[test]
    fn a_canary_in_a_numeric_door_set_is_held_to_its_doors() {
        let reg = Registry::builtin().unwrap();
        let job = |tp, transport, ids: &[&str]| {
            let mut c = Configuration::baseline(tp, transport, BackendKind::Host);
            c.doors = ids.iter().map(|s| s.to_string()).collect();
            job_of(&reg, &c, None, None, None).unwrap()
        };
        let hb = Transport::HostBounce;
        assert!(job(2, hb, &["canary_down8_slot_order", "sel_down8", "nvfp4_ep2"]).canary_held_to_doors);
        assert!(!job(2, hb, &["sel_down8", "nvfp4_ep2"]).canary_held_to_doors);
        let fallback = ["canary_silent_fallback", "oproj_direct"];
        assert!(!job(2, Transport::NativeP2p, &fallback).canary_held_to_doors);
    }
}
