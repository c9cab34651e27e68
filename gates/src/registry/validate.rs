//! The rules a registry must satisfy. Each violation is an error naming the door, the value and
//! the rule; every violation of a file is reported at once (one per line), so a person editing
//! `doors.toml` fixes them in one pass.
//!
//! - ids are unique lower snake case; `env` names are unique across doors and settings, and are
//!   `MEMRA_` + upper snake case.
//! - `tp` values lie in {1, 2, 4, 8}; `transports` are `host-bounce`, `native-p2p`, `nccl`;
//!   `backends` are `host`, `cuda`. Lists are non-empty and free of repeats. Leaving out any TP
//!   size or transport needs a non-empty `why`.
//! - every backend is in exactly one of `backends` and `not_applicable` (with a reason).
//! - `requires` and `conflicts` name known doors other than the door itself, each with a `why`;
//!   `requires` has no cycle; a door's TP sizes, transports and backends lie inside those of
//!   every door it requires; no door requires (directly or through others) a door it conflicts
//!   with. So every door has at least one legal configuration of its own.
//! - the class decides the gate: identity classes and CANARY take `identity`; NUMERIC-CLASS takes
//!   `argmax_tape+class_identity+error_budget`, or `argmax_tape+error_budget` with a `gate_why`.
//!   A gate with class identity needs TP1 and host-bounce allowed (its class baseline is the
//!   door's own TP1 host-bounce run, docs/DESIGN.md §4.2).
//! - `error_budget` is present exactly on NUMERIC-CLASS doors; its numbers are finite and > 0.
//! - CANARY doors are default-off; `engagement` starts with `<id>.` and is unique.
//! - `census` declares at least one change, each once, each counter well formed (a census family,
//!   no empty segment, `*` only as the whole last segment; `super::census::counter_rule`).
//! - a setting's `default` parses under its `format`.
//! - the registry as a whole: the default-on doors together run in the oracle's configuration,
//!   TP1 host-bounce (each allows TP1 and host-bounce, what it requires is default-on too, and no
//!   two of them conflict), or every run with defaults would drop its TP1 configurations.

use crate::registry::PASS_SHAPES;
use std::collections::{BTreeMap, BTreeSet};

use memra_runtime::config::Transport;
use memra_runtime::record::Seam;

use super::census::{counter_rule, Benefit, CensusChange};
use super::file::{RawAllowed, RawBudget, RawCensus, RawDoor, RawFile, RawLink, RawSetting};
use super::{
    Allowed, BackendKind, Door, DoorClass, DoorGate, ErrorBudget, Link, Registry, RegistryError, Setting, TP_SIZES,
};

fn is_snake(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn is_env_name(s: &str) -> bool {
    s.len() > "MEMRA_".len()
        && s.starts_with("MEMRA_")
        && s.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// Collects the violations of one registry text.
struct Checker<'a> {
    origin: &'a str,
    errors: Vec<RegistryError>,
    /// Env name → who declared it (doors and settings share one namespace).
    envs: BTreeMap<String, String>,
    /// Door id → index, as declared.
    by_id: BTreeMap<String, usize>,
    engagements: BTreeSet<String>,
}

impl Checker<'_> {
    fn fail(&mut self, thing: impl Into<String>, value: impl Into<String>, rule: impl Into<String>) {
        self.errors.push(RegistryError::Invalid {
            origin: self.origin.to_string(),
            thing: thing.into(),
            value: value.into(),
            rule: rule.into(),
        });
    }

    fn text(&mut self, thing: String, value: &str) {
        if value.trim().is_empty() {
            self.fail(thing, format!("{value:?}"), "must say something (a rule or explanation cannot be empty)");
        }
    }

    fn flush(&mut self) -> Result<(), RegistryError> {
        RegistryError::collect(std::mem::take(&mut self.errors))
    }
}

/// Validate a parsed registry file; `origin` names it in messages. `allow_no_door`: a subject's
/// registry (docs/subject-protocol.md) may hold no door — the subject's baseline is still gated.
pub(super) fn validate(raw: RawFile, origin: &str, allow_no_door: bool) -> Result<Registry, RegistryError> {
    let mut ck = Checker {
        origin,
        errors: Vec::new(),
        envs: BTreeMap::new(),
        by_id: BTreeMap::new(),
        engagements: BTreeSet::new(),
    };
    if raw.door.is_empty() && !allow_no_door {
        ck.fail("door", "[]", "a registry declares at least one door");
    }
    let mut doors = Vec::new();
    for rd in &raw.door {
        let index = doors.len();
        doors.push(check_door(&mut ck, rd, index, allow_no_door));
    }
    let settings: Vec<Setting> = raw.setting.iter().map(|rs| check_setting(&mut ck, rs)).collect();
    ck.flush()?;

    // Cross-door rules, now that every id is known.
    check_links_known(&mut ck, &doors);
    ck.flush()?;
    mirror_conflicts(&mut doors, &ck.by_id);
    let by_env = doors.iter().enumerate().map(|(i, d)| (d.env.clone(), i)).collect();
    let by_id = std::mem::take(&mut ck.by_id);
    let registry = Registry { origin: origin.to_string(), doors, settings, by_id, by_env };
    check_graph(&mut ck, &registry);
    ck.flush()?;
    check_defaults(&mut ck, &registry);
    ck.flush()?;
    Ok(registry)
}

/// One door's own fields (everything that does not need the other doors). In a subject's
/// registry (`subject`) a door's census may also count in its own family (`<id>.…`, the
/// subject's census: docs/subject-protocol.md).
fn check_door(ck: &mut Checker, rd: &RawDoor, index: usize, subject: bool) -> Door {
    let id = rd.id.clone();
    let at = |field: &str| format!("door {id:?} {field}");
    check_names(ck, rd, index);
    let seams = check_seams(ck, &at("seams"), &rd.seams);
    let mut families = memra_runtime::evidence::census::FAMILIES.to_vec();
    if subject {
        families.push(&id);
    }
    let census = check_census(ck, &at("census"), &rd.census, &families);
    let tp = check_tp(ck, &at("tp"), &rd.tp);
    let transports = check_transports(ck, &at("transports"), &rd.transports);
    let passes = check_passes(ck, &at("passes"), rd.passes.as_ref());
    let (backends, not_applicable) = check_backends(ck, &id, rd);
    let error_budget = check_class_and_gate(ck, &id, rd, &tp, &transports);
    let requires = check_links(ck, &id, "requires", &rd.requires);
    let conflicts = check_links(ck, &id, "conflicts", &rd.conflicts);
    let benefit = rd.benefit.as_ref().and_then(|b| {
        if let Some(rule) = counter_rule(&b.counter, &families) {
            ck.fail(at("benefit.counter"), format!("{:?}", b.counter), rule);
            return None;
        }
        ck.text(at("benefit.why"), &b.why);
        Some(Benefit { saves: b.saves, counter: b.counter.clone(), why: b.why.clone() })
    });
    Door {
        id: id.clone(),
        env: rd.env.clone(),
        class: rd.class,
        default: rd.default,
        changes: rd.changes.clone(),
        gate: rd.gate,
        gate_why: rd.gate_why.clone(),
        engagement: rd.engagement.clone(),
        census,
        seams,
        tp: Allowed { allowed: tp, why: rd.tp.why.clone() },
        transports: Allowed { allowed: transports, why: rd.transports.why.clone() },
        passes,
        pass_door: rd.passes.is_some(),
        backends,
        not_applicable,
        requires,
        conflicts,
        error_budget,
        benefit,
    }
}

/// id, env name, `changes` text and engagement counter: well formed and unique.
fn check_names(ck: &mut Checker, rd: &RawDoor, index: usize) {
    let id = &rd.id;
    let at = |field: &str| format!("door {id:?} {field}");
    if !is_snake(id) {
        ck.fail(at("id"), format!("{id:?}"), "an id is lower snake case: [a-z][a-z0-9_]*");
    }
    if ck.by_id.insert(id.clone(), index).is_some() {
        ck.fail(at("id"), format!("{id:?}"), "door ids are unique; this id is declared twice");
    }
    if !is_env_name(&rd.env) {
        ck.fail(at("env"), format!("{:?}", rd.env), "an env name is MEMRA_ followed by [A-Z0-9_]+");
    }
    if let Some(prev) = ck.envs.insert(rd.env.clone(), id.clone()) {
        ck.fail(at("env"), format!("{:?}", rd.env), format!("env names are unique; {prev:?} uses it too"));
    }
    ck.text(at("changes"), &rd.changes);
    match rd.engagement.strip_prefix(&format!("{id}.")) {
        Some(what) if is_snake(what) => {}
        _ => ck.fail(
            at("engagement"),
            format!("{:?}", rd.engagement),
            format!("an engagement counter is \"{id}.<what>\" with <what> in lower snake case"),
        ),
    }
    if !ck.engagements.insert(rd.engagement.clone()) {
        ck.fail(at("engagement"), format!("{:?}", rd.engagement), "engagement counters are unique");
    }
}

fn check_seams(ck: &mut Checker, at: &str, names: &[String]) -> Vec<Seam> {
    let mut seams = Vec::new();
    for s in names {
        match Seam::parse(s) {
            Some(seam) if !seams.contains(&seam) => seams.push(seam),
            Some(_) => ck.fail(at, format!("{s:?}"), "a seam is listed once"),
            None => ck.fail(at, format!("{s:?}"), "not a seam name of docs/DESIGN.md §3.2"),
        }
    }
    if seams.is_empty() {
        ck.fail(at, "[]", "a door touches at least one seam (engagement is checked there)");
    }
    seams
}

fn check_census(ck: &mut Checker, at: &str, raw: &[RawCensus], families: &[&str]) -> Vec<CensusChange> {
    let mut out: Vec<CensusChange> = Vec::new();
    for r in raw {
        let c = CensusChange { counter: r.counter.clone(), change: r.change };
        if let Some(rule) = counter_rule(&r.counter, families) {
            ck.fail(at, format!("{:?}", r.counter), rule);
        } else if out.contains(&c) {
            ck.fail(at, format!("{:?} {}", r.counter, r.change.name()), "a census change is declared once");
        } else {
            out.push(c);
        }
    }
    if raw.is_empty() {
        ck.fail(at, "[]", "a door declares the census change it causes (how else would its engagement be witnessed?)");
    }
    out
}

fn check_tp(ck: &mut Checker, at: &str, raw: &RawAllowed<usize>) -> Vec<usize> {
    let mut tp = Vec::new();
    for &t in &raw.allowed {
        if !TP_SIZES.contains(&t) {
            ck.fail(at, t.to_string(), "TP must be 1, 2, 4 or 8");
        } else if tp.contains(&t) {
            ck.fail(at, t.to_string(), "a TP size is listed once");
        } else {
            tp.push(t);
        }
    }
    tp.sort_unstable();
    check_allowed(ck, at, tp.len(), TP_SIZES.len(), &raw.why);
    tp
}

fn check_transports(ck: &mut Checker, at: &str, raw: &RawAllowed<String>) -> Vec<Transport> {
    let mut transports = Vec::new();
    for name in &raw.allowed {
        match Transport::ALL.into_iter().find(|t| t.name() == name) {
            Some(t) if !transports.contains(&t) => transports.push(t),
            Some(_) => ck.fail(at, format!("{name:?}"), "a transport is listed once"),
            None => ck.fail(at, format!("{name:?}"), "the transports are host-bounce, native-p2p, nccl"),
        }
    }
    transports.sort_unstable();
    check_allowed(ck, at, transports.len(), Transport::ALL.len(), &raw.why);
    transports
}

/// `backends` and `not_applicable`: every backend in exactly one of them.
fn check_backends(ck: &mut Checker, id: &str, rd: &RawDoor) -> (Vec<BackendKind>, BTreeMap<BackendKind, String>) {
    let at = |field: &str| format!("door {id:?} {field}");
    let mut backends = Vec::new();
    for name in &rd.backends {
        match BackendKind::parse(name) {
            Some(b) if !backends.contains(&b) => backends.push(b),
            Some(_) => ck.fail(at("backends"), format!("{name:?}"), "a backend is listed once"),
            None => ck.fail(at("backends"), format!("{name:?}"), "the backends are host, cuda"),
        }
    }
    backends.sort_unstable();
    if backends.is_empty() {
        ck.fail(at("backends"), "[]", "a door runs on at least one backend");
    }
    let mut not_applicable = BTreeMap::new();
    for (name, reason) in &rd.not_applicable {
        match BackendKind::parse(name) {
            Some(b) if backends.contains(&b) => ck.fail(
                at("not_applicable"),
                format!("{name:?}"),
                "a backend is either in `backends` or not applicable, not both",
            ),
            Some(b) => {
                ck.text(at(&format!("not_applicable.{name}")), reason);
                not_applicable.insert(b, reason.clone());
            }
            None => ck.fail(at("not_applicable"), format!("{name:?}"), "the backends are host, cuda"),
        }
    }
    for b in BackendKind::ALL {
        if !backends.contains(&b) && !not_applicable.contains_key(&b) {
            ck.fail(
                at("backends"),
                format!("{:?}", b.name()),
                "every backend is in `backends` or has a reason in `not_applicable`",
            );
        }
    }
    (backends, not_applicable)
}

/// Class, gate, `gate_why`, error budget and the canary default; returns the checked budget.
fn check_class_and_gate(
    ck: &mut Checker,
    id: &str,
    rd: &RawDoor,
    tp: &[usize],
    transports: &[Transport],
) -> Option<ErrorBudget> {
    let at = |field: &str| format!("door {id:?} {field}");
    let class_gate_ok = match rd.class {
        DoorClass::BitIdentical | DoorClass::ValueIdentical | DoorClass::SchedulingOnly | DoorClass::Canary => {
            rd.gate == DoorGate::Identity
        }
        DoorClass::Numeric => rd.gate != DoorGate::Identity,
    };
    if !class_gate_ok {
        let wanted = if rd.class == DoorClass::Numeric {
            "argmax_tape+class_identity+error_budget (or argmax_tape+error_budget with a gate_why)"
        } else {
            "identity"
        };
        ck.fail(
            at("gate"),
            format!("{:?}", rd.gate.name()),
            format!("class {} is promoted by {wanted}", rd.class.name()),
        );
    }
    match (&rd.gate_why, rd.gate) {
        (None, DoorGate::ArgmaxTapeErrorBudget) => {
            ck.fail(at("gate_why"), "(missing)", "a NUMERIC-CLASS door without class identity must say why (gate_why)")
        }
        (Some(w), _) => ck.text(at("gate_why"), w),
        (None, _) => {}
    }
    if rd.gate.has_class_identity() && !(tp.contains(&1) && transports.contains(&Transport::HostBounce)) {
        ck.fail(
            at("tp/transports"),
            format!("{:?} / {:?}", rd.tp.allowed, rd.transports.allowed),
            "a class-identity gate compares with the door's own TP1 host-bounce run, so TP1 and host-bounce must be allowed",
        );
    }
    if rd.class == DoorClass::Canary && rd.default {
        ck.fail(at("default"), "true", "a canary is a planted defect and is never on by default");
    }
    match (&rd.error_budget, rd.class) {
        (Some(b), DoorClass::Numeric) => Some(check_budget(ck, &at("error_budget"), b)),
        (None, DoorClass::Numeric) => {
            ck.fail(at("error_budget"), "(missing)", "a NUMERIC-CLASS door declares its error budget");
            None
        }
        (Some(_), class) => {
            ck.fail(
                at("error_budget"),
                "(present)",
                format!("only NUMERIC-CLASS doors have an error budget; this door is {}", class.name()),
            );
            None
        }
        (None, _) => None,
    }
}

fn check_links(ck: &mut Checker, id: &str, field: &str, raw: &[RawLink]) -> Vec<Link> {
    let at = |field: &str| format!("door {id:?} {field}");
    let mut out: Vec<Link> = Vec::new();
    for l in raw {
        ck.text(at(&format!("{field} {:?} why", l.id)), &l.why);
        if l.id == id {
            ck.fail(at(field), format!("{:?}", l.id), "a door cannot name itself");
        } else if out.iter().any(|o| o.id == l.id) {
            ck.fail(at(field), format!("{:?}", l.id), "each door is named once");
        } else {
            out.push(Link { id: l.id.clone(), why: l.why.clone() });
        }
    }
    out
}

fn check_setting(ck: &mut Checker, rs: &RawSetting) -> Setting {
    let at = |field: &str| format!("setting {:?} {field}", rs.env);
    if !is_env_name(&rs.env) {
        ck.fail(at("env"), format!("{:?}", rs.env), "an env name is MEMRA_ followed by [A-Z0-9_]+");
    }
    if let Some(prev) = ck.envs.insert(rs.env.clone(), format!("setting {}", rs.env)) {
        ck.fail(at("env"), format!("{:?}", rs.env), format!("env names are unique; {prev:?} uses it too"));
    }
    ck.text(at("meaning"), &rs.meaning);
    let default_value = match rs.format.parse(&rs.env, &rs.default) {
        Ok(v) => v,
        Err(e) => {
            ck.fail(at("default"), format!("{:?}", rs.default), format!("must parse as {}: {e}", rs.format.name()));
            None
        }
    };
    Setting {
        env: rs.env.clone(),
        format: rs.format,
        default: rs.default.clone(),
        meaning: rs.meaning.clone(),
        default_value,
    }
}

/// `requires` and `conflicts` name doors of this registry.
fn check_links_known(ck: &mut Checker, doors: &[Door]) {
    let known: Vec<&str> = doors.iter().map(|d| d.id.as_str()).collect();
    for d in doors {
        for (field, list) in [("requires", &d.requires), ("conflicts", &d.conflicts)] {
            for l in list {
                if !ck.by_id.contains_key(&l.id) {
                    ck.errors.push(RegistryError::UnknownName {
                        name: format!("door {:?} {field} {:?}", d.id, l.id),
                        kind: "door id".to_string(),
                        rule: format!("{}: requires and conflicts name doors of this registry", ck.origin),
                        suggestion: crate::text::nearest(&l.id, known.iter().copied()).map(str::to_string),
                    });
                }
            }
        }
    }
}

/// Conflicts hold both ways: add the mirror of every declared edge.
fn mirror_conflicts(doors: &mut [Door], by_id: &BTreeMap<String, usize>) {
    let declared: Vec<(usize, Link)> =
        doors.iter().enumerate().flat_map(|(i, d)| d.conflicts.iter().map(move |l| (i, l.clone()))).collect();
    for (i, link) in declared {
        let j = by_id[&link.id];
        let mirror_id = doors[i].id.clone();
        if doors[j].conflict(&mirror_id).is_none() {
            doors[j].conflicts.push(Link { id: mirror_id, why: link.why });
        }
    }
}

/// Requirement cycles, restrictions wider than a requirement's, and doors that need two
/// conflicting doors (so could never run).
fn check_graph(ck: &mut Checker, registry: &Registry) {
    for d in &registry.doors {
        let at = |field: &str| format!("door {:?} {field}", d.id);
        // Cycle: d reachable from its own requirements.
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&str> = d.requires.iter().map(|l| l.id.as_str()).collect();
        while let Some(x) = stack.pop() {
            if x == d.id {
                ck.fail(at("requires"), format!("{:?}", d.id), "requires must not form a cycle");
                break;
            }
            if seen.insert(x) {
                stack.extend(registry.doors[registry.by_id[x]].requires.iter().map(|l| l.id.as_str()));
            }
        }
        if seen.contains(d.id.as_str()) {
            continue;
        }
        for l in &d.requires {
            let r = &registry.doors[registry.by_id[&l.id]];
            for t in &d.tp.allowed {
                if !r.tp.contains(t) {
                    ck.fail(at("tp"), t.to_string(), format!("{} requires {}, which does not allow TP{t}", d.id, r.id));
                }
            }
            for p in &d.passes.allowed {
                if !r.passes.contains(p) {
                    ck.fail(at("passes"), p.clone(), format!("{} requires {}, which does not allow {p}", d.id, r.id));
                }
            }
            for t in &d.transports.allowed {
                if !r.transports.contains(t) {
                    ck.fail(
                        at("transports"),
                        t.name(),
                        format!("{} requires {}, which does not allow {}", d.id, r.id, t.name()),
                    );
                }
            }
            for b in &d.backends {
                if !r.backends.contains(b) {
                    ck.fail(
                        at("backends"),
                        b.name(),
                        format!("{} requires {}, which is not applicable on {}", d.id, r.id, b.name()),
                    );
                }
            }
        }
        let closure = registry.closure_of([d.id.as_str()]);
        for a in &closure {
            for b in &closure {
                if a < b && registry.door(a).and_then(|x| x.conflict(b)).is_some() {
                    ck.fail(
                        at("requires"),
                        format!("{closure:?}"),
                        format!("{} needs both {a} and {b}, which conflict, so it can never run", d.id),
                    );
                }
            }
        }
    }
}

/// The default-on doors must be able to run together in the oracle's configuration (TP1
/// host-bounce): the oracle claims "TP1 host-bounce, defaults", which must exist.
fn check_defaults(ck: &mut Checker, registry: &Registry) {
    const ORACLE: &str = "a default-on door must run in the oracle's configuration, TP1 host-bounce";
    for d in registry.doors.iter().filter(|d| d.default) {
        let at = format!("door {:?} default", d.id);
        let why = |w: &Option<String>| w.clone().unwrap_or_else(|| "(none given)".to_string());
        if !d.tp.contains(&1) {
            let allowed: Vec<String> = d.tp.allowed.iter().map(|t| t.to_string()).collect();
            ck.fail(
                at.clone(),
                "true",
                format!("{ORACLE}, but its `tp` rule allows only TP {} (rule: {})", allowed.join(", "), why(&d.tp.why)),
            );
        }
        if !d.transports.contains(&Transport::HostBounce) {
            let allowed: Vec<&str> = d.transports.allowed.iter().map(|t| t.name()).collect();
            ck.fail(
                at.clone(),
                "true",
                format!(
                    "{ORACLE}, but its `transports` rule allows only {} (rule: {})",
                    allowed.join(", "),
                    why(&d.transports.why)
                ),
            );
        }
        for l in &d.requires {
            if registry.door(&l.id).is_some_and(|r| !r.default) {
                ck.fail(
                    at.clone(),
                    "true",
                    format!(
                        "{ORACLE} with its requirements on, but it requires {}, which is default-off (rule: {})",
                        l.id, l.why
                    ),
                );
            }
        }
        for l in &d.conflicts {
            if d.id < l.id && registry.door(&l.id).is_some_and(|c| c.default) {
                ck.fail(
                    at.clone(),
                    "true",
                    format!("two default-on doors conflict: {} and {} (rule: {})", d.id, l.id, l.why),
                );
            }
        }
    }
}

/// `passes`: labels of [`PASS_SHAPES`], each once, in that order; absent: every shape.
fn check_passes(ck: &mut Checker, at: &str, raw: Option<&RawAllowed<String>>) -> Allowed<String> {
    let Some(raw) = raw else {
        return Allowed { allowed: PASS_SHAPES.iter().map(|s| s.to_string()).collect(), why: None };
    };
    let mut passes = Vec::new();
    for p in &raw.allowed {
        if !PASS_SHAPES.contains(&p.as_str()) {
            ck.fail(at, format!("{p:?}"), format!("the pass shapes are {}", PASS_SHAPES.join(", ")));
        } else if passes.contains(p) {
            ck.fail(at, format!("{p:?}"), "a value is listed once");
        } else {
            passes.push(p.clone());
        }
    }
    passes.sort_by_key(|p| PASS_SHAPES.iter().position(|s| s == p));
    check_allowed(ck, at, passes.len(), PASS_SHAPES.len(), &raw.why);
    Allowed { allowed: passes, why: raw.why.clone() }
}

fn check_allowed(ck: &mut Checker, thing: &str, n: usize, all: usize, why: &Option<String>) {
    if n == 0 {
        ck.fail(thing, "[]", "at least one value must be allowed");
    }
    match why {
        Some(w) => ck.text(format!("{thing} why"), w),
        None if n < all => ck.fail(format!("{thing} why"), "(missing)", "leaving a value out needs a `why`"),
        None => {}
    }
}

fn check_budget(ck: &mut Checker, at: &str, b: &RawBudget) -> ErrorBudget {
    fn positive(ck: &mut Checker, thing: String, v: f64) {
        if !(v.is_finite() && v > 0.0) {
            ck.fail(thing, v.to_string(), "must be finite and > 0");
        }
    }
    positive(ck, format!("{at}.max_rel_error"), b.max_rel_error);
    positive(ck, format!("{at}.near_tie_margin"), b.near_tie_margin);
    let mut per_seam = BTreeMap::new();
    for (name, &v) in &b.per_seam {
        positive(ck, format!("{at}.per_seam.{name}"), v);
        match Seam::parse(name) {
            Some(s) => {
                per_seam.insert(s, v);
            }
            None => ck.fail(format!("{at}.per_seam"), format!("{name:?}"), "not a seam name of docs/DESIGN.md §3.2"),
        }
    }
    ck.text(format!("{at}.why"), &b.why);
    ErrorBudget { max_rel_error: b.max_rel_error, near_tie_margin: b.near_tie_margin, per_seam, why: b.why.clone() }
}
