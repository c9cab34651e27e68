//! Which doors `bench` times: the environment's `MEMRA_*` doors and `--door` flags (the same strict
//! edge as `run`, `crate::env`), `--graph` as a spelling of the graph door. A batched-serving user
//! turns on DECODE_V2 for rows; a bench that could only time the default program would anchor
//! its B-row figures on a form nobody serving batches would run, so the door set is the user's
//! choice and the receipt names it.
//!
//! A timed door set must be one the matrix could run at the bench's configuration (TP1,
//! host-bounce, the bench's backend and pass shape): the registry's rules decide, and a broken
//! rule is refused before any timing. Canaries plant defects: they are selftest's, never timed.
//! After the run every door must have engaged (its registry counter above zero), or the receipt
//! says the timing is the default program's under another name.

use crate::env::DoorRequest;
use crate::error::GateError;
use crate::matrix::{classify, Configuration, Legality};
use crate::registry::Registry;
use memra_runtime::backend::BackendKind;
use memra_runtime::record::Record;
use memra_runtime::{DoorSet, PassShape, Transport};
use std::collections::{BTreeMap, BTreeSet};

/// The graph door's id (`--graph`).
pub const GRAPH: &str = "graph";

/// The doors of one bench: what is timed and how the receipt names it.
#[derive(Debug, Clone)]
pub struct BenchDoors {
    /// Enabled door ids (explicit or on by default).
    pub enabled: BTreeSet<String>,
    pub set: DoorSet,
    /// Environment name → on, for the receipt's run identity.
    pub env: BTreeMap<String, bool>,
    /// Door id → its engagement counter, for every enabled door with work at the pass shape.
    pub engagement: BTreeMap<String, String>,
    /// The receipt's `doors` identity field (`bench_compare::doors_identity` of `env`).
    pub identity: String,
}

impl BenchDoors {
    pub fn graph(&self) -> bool {
        self.enabled.contains(GRAPH)
    }

    /// Doors whose engagement counter stayed at zero in `record`: each as `id (counter = 0)`.
    pub fn not_engaged(&self, record: &Record) -> Vec<String> {
        self.engagement
            .iter()
            .filter(|(_, counter)| record.engaged.get(counter.as_str()).copied().unwrap_or(0) == 0)
            .map(|(id, counter)| format!("{id} ({counter} = 0)"))
            .collect()
    }
}

/// The doors a bench asks for: `--door` values and `--graph` (as the graph door) laid over the
/// environment's doors, checked for requirements and conflicts.
pub fn request(registry: &Registry, doors: &[String], graph: bool) -> Result<DoorRequest, GateError> {
    let mut flags = doors.to_vec();
    if graph {
        flags.push(GRAPH.to_string());
    }
    crate::plan::door_request(registry, &flags)
}

/// Check the requested doors against the bench's configuration and say what is timed.
pub fn resolve(
    registry: &Registry,
    request: &DoorRequest,
    backend: BackendKind,
    pass: PassShape,
) -> Result<BenchDoors, GateError> {
    let enabled = request.enabled(registry);
    let refuse = |rule: String| GateError::usage(format!("bench doors {{{}}}: {rule}", list(&enabled)));
    if let Some(c) = enabled.iter().find(|id| registry.door(id).is_some_and(|d| d.is_canary())) {
        return Err(refuse(format!(
            "{c} is a canary (a planted defect, caught by `selftest`): bench times programs a user would run"
        )));
    }
    let config = Configuration {
        backend,
        tp: 1,
        transport: Transport::HostBounce,
        doors: enabled.clone(),
        batch: pass.batch,
        columns: pass.columns,
    };
    match classify(registry, &config)? {
        Legality::Legal => {}
        Legality::Excluded(rule) | Legality::NotApplicable(rule) => {
            return Err(refuse(format!("{rule} (bench runs TP1 over host-bounce)")))
        }
    }
    // A door asked for that has no work at this pass shape is refused; one that is on by default
    // (promoted) is part of the default program wherever it has work, and simply idle elsewhere.
    let asked = |id: &str| request.doors.get(id).copied().unwrap_or(false);
    for id in &enabled {
        if let Some(why) = registry.door(id).and_then(|d| d.not_at_pass(pass)).filter(|_| asked(id)) {
            return Err(refuse(format!("{why}; its timing would be the default program's")));
        }
    }
    let set = request.to_door_set(registry)?;
    let doors: Vec<_> = enabled.iter().filter_map(|id| registry.door(id)).collect();
    let working: Vec<_> = doors.iter().filter(|d| d.not_at_pass(pass).is_none()).collect();
    let env: BTreeMap<String, bool> = doors.iter().map(|d| (d.env.clone(), true)).collect();
    Ok(BenchDoors {
        identity: super::bench_compare::doors_identity(&env),
        env,
        engagement: working.iter().map(|d| (d.id.clone(), d.engagement.clone())).collect(),
        enabled,
        set,
    })
}

fn list(ids: &BTreeSet<String>) -> String {
    ids.iter().cloned().collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        Registry::builtin().unwrap()
    }

    fn resolve_flags(flags: &[&str], pass: PassShape) -> Result<BenchDoors, GateError> {
        let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        let reg = registry();
        resolve(&reg, &request(&reg, &flags, false)?, BackendKind::Cuda, pass)
    }

    fn b8() -> PassShape {
        PassShape::new(8, 1).unwrap()
    }

    #[test]
    fn decode_v2_at_b8_is_timed_with_its_requirement_and_named() {
        let d = resolve_flags(&["graph", "decode_v2", "f32_mirror"], b8()).unwrap();
        assert!(d.graph() && d.set.decode_v2 && d.set.f32_mirror && d.set.graph);
        assert_eq!(d.identity, "MEMRA_STEP_TP_DECODE_V2=true MEMRA_STEP_TP_F32_MIRROR=true");
        assert_eq!(d.engagement.get("decode_v2").map(String::as_str), Some("decode_v2.row_attention"));
    }

    #[test]
    fn the_default_program_is_named_defaults() {
        let d = resolve_flags(&["graph"], PassShape::SINGLE).unwrap();
        assert_eq!(d.identity, "defaults");
        assert!(d.graph() && !d.set.decode_v2);
    }

    #[test]
    fn a_door_without_work_at_the_pass_is_refused_before_timing() {
        let e = resolve_flags(&["decode_v2", "f32_mirror"], PassShape::SINGLE).unwrap_err().to_string();
        assert!(e.contains("decode_v2 at single") && e.contains("default program"), "{e}");
    }

    #[test]
    fn a_promoted_door_without_work_at_the_pass_is_timed_idle_not_refused() {
        let on = BTreeSet::from(["decode_v2", "f32_mirror"]);
        let promoted = crate::registry::file::set_defaults_on(crate::registry::BUILTIN_REGISTRY, "test", &on).unwrap();
        let reg = Registry::from_toml_str(&promoted, "promoted").unwrap();
        let none = request(&reg, &[], false).unwrap();
        let d = resolve(&reg, &none, BackendKind::Cuda, PassShape::SINGLE).unwrap();
        assert!(d.set.decode_v2 && d.enabled.contains("decode_v2"));
        assert!(!d.engagement.contains_key("decode_v2"), "idle at single: not held to engage");
        assert!(d.engagement.contains_key("f32_mirror"));
        let d = resolve(&reg, &none, BackendKind::Cuda, b8()).unwrap();
        assert!(d.engagement.contains_key("decode_v2"), "at b8 it has work: it must engage");
    }

    #[test]
    fn a_missing_requirement_a_canary_and_a_tp_rule_are_refused() {
        let e = resolve_flags(&["decode_v2"], b8()).unwrap_err().to_string();
        assert!(e.contains("requires") && e.contains("F32_MIRROR"), "{e}");
        let e = resolve_flags(&["canary_flip_bit"], PassShape::SINGLE).unwrap_err().to_string();
        assert!(e.contains("canary"), "{e}");
        let e = resolve_flags(&["oproj_direct"], PassShape::SINGLE).unwrap_err().to_string();
        assert!(e.contains("not TP1") && e.contains("bench runs TP1"), "{e}");
    }

    #[test]
    fn a_door_whose_counter_stayed_zero_is_named_and_an_engaged_one_is_not() {
        let d = resolve_flags(&["graph", "decode_v2", "f32_mirror"], b8()).unwrap();
        let mut record = Record::default();
        for counter in d.engagement.values() {
            record.engaged.insert(counter.clone(), 3);
        }
        assert!(d.not_engaged(&record).is_empty());
        record.engaged.insert("decode_v2.row_attention".into(), 0);
        assert_eq!(d.not_engaged(&record), ["decode_v2 (decode_v2.row_attention = 0)"]);
        record.engaged.clear();
        assert_eq!(d.not_engaged(&record).len(), 3, "a counter the run never reported is not engagement");
    }
}
