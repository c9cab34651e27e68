//! Matrix enumeration: which door combinations × TP sizes × transports × backends a run covers,
//! derived from the registry alone, with every left-out configuration explained by the rule
//! that left it out (`memra-gates matrix --explain`, docs/DESIGN.md §4.1). Keeping this a pure
//! function of the registry means a new door or constraint changes the matrix by editing
//! `doors.toml`, never code, and a nightly job can be split into shards that provably cover it.
//!
//! Three outcomes per configuration, kept distinct:
//! - **legal**: it runs;
//! - **excluded**: illegal by a requires / conflicts / TP / transport rule; it is never run and
//!   only explained;
//! - **not applicable**: legal by every rule, but a door's mechanism has no meaning on that
//!   backend; it becomes a receipt with verdict NOT-APPLICABLE and the registry's reason.
//!
//! Everything is sorted ([`Configuration`]'s order: backend, TP, transport, doors), so the same
//! registry and request always give the same plan.
//!
//! # Door-set files (`--matrix FILE`)
//! A TOML (`.toml`) or JSON (`.json`) file with a schema version and a list of door sets; each
//! door is named by its id (any case) or its `MEMRA_*` variable; `[]` is the baseline. Sets are
//! taken literally (requirements are not added), so an illegal set is reported as excluded with
//! its rule. Unknown doors, repeated doors and repeated sets are errors.
//! ```toml
//! schema_version = 1
//! sets = [[], ["oproj_direct", "oproj_tail"], ["MEMRA_STEP_TP_W8"]]
//! ```
//! ```json
//! {"schema_version": 1, "sets": [[], ["oproj_direct", "oproj_tail"], ["MEMRA_STEP_TP_W8"]]}
//! ```

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use memra_runtime::config::{DoorSet, Transport};
use serde::Deserialize;

use crate::registry::{BackendKind, FlipAt, Registry, RegistryError, TP_SIZES};

/// The schema version of door-set files.
pub const DOOR_SET_FILE_VERSION: i64 = 1;

/// Most doors `--matrix all` and `--matrix pairwise` enumerate over (2^n door sets).
pub const MAX_ENUMERATED_DOORS: usize = 24;

/// One run: which doors are on, at which TP size, over which transport, on which backend.
/// Field order is the sort order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Configuration {
    pub backend: BackendKind,
    pub tp: usize,
    pub transport: Transport,
    /// Enabled door ids (every other door off).
    pub doors: BTreeSet<String>,
}

impl Configuration {
    /// Every door off.
    pub fn baseline(tp: usize, transport: Transport, backend: BackendKind) -> Configuration {
        Configuration { backend, tp, transport, doors: BTreeSet::new() }
    }

    /// A short stable name, e.g. `tp4 native-p2p host +oproj_direct+oproj_tail`.
    pub fn label(&self) -> String {
        let mut s = format!("tp{} {} {}", self.tp, self.transport.name(), self.backend.name());
        if !self.doors.is_empty() {
            s.push(' ');
            for d in &self.doors {
                s.push('+');
                s.push_str(d);
            }
        }
        s
    }

    /// The runtime's explicit door values for this configuration.
    pub fn door_set(&self, registry: &Registry, flip_at: Option<FlipAt>) -> Result<DoorSet, RegistryError> {
        registry.to_door_set(&self.doors, flip_at)
    }
}

/// Which matrix to enumerate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatrixKind {
    /// Every legal combination of (non-canary) doors × TP × transport × backend.
    All,
    /// The baseline and each door alone (with what it requires).
    Single,
    /// A covering set: every pair of door settings that can co-occur legally appears together.
    Pairwise,
    /// Each canary alone (for `selftest`); canaries are in no other generated matrix.
    Canaries,
    /// The door sets of a file (see the module docs).
    File(PathBuf),
}

impl MatrixKind {
    /// `all`, `single`, `pairwise`, `canaries`, or a path ending in `.toml` / `.json`.
    pub fn parse(s: &str) -> Result<MatrixKind, RegistryError> {
        Ok(match s {
            "all" => MatrixKind::All,
            "single" => MatrixKind::Single,
            "pairwise" => MatrixKind::Pairwise,
            "canaries" => MatrixKind::Canaries,
            _ if s.ends_with(".toml") || s.ends_with(".json") => MatrixKind::File(PathBuf::from(s)),
            _ => {
                return Err(RegistryError::Flag {
                    flag: "--matrix".to_string(),
                    value: s.to_string(),
                    rule: "use all, single, pairwise, canaries, or a door-set file ending in .toml or .json"
                        .to_string(),
                })
            }
        })
    }
}

/// Whether one configuration may run, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Legality {
    Legal,
    /// Broken rule, quoted.
    Excluded(String),
    /// The mechanism has no meaning on the backend; the registry's reason.
    NotApplicable(String),
}

/// A configuration that is never run, with the rule that excluded it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Exclusion {
    pub config: Configuration,
    pub rule: String,
}

/// A configuration that becomes a NOT-APPLICABLE receipt, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NotApplicable {
    pub config: Configuration,
    pub reason: String,
}

/// The outcome of enumeration, each list sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MatrixPlan {
    pub legal: Vec<Configuration>,
    pub excluded: Vec<Exclusion>,
    pub not_applicable: Vec<NotApplicable>,
    /// `--matrix all` lists each exclusion and not-applicable case once, at its smallest door
    /// set (a door with what it requires, or a conflicting pair with what they require); every
    /// larger set containing it is left out by the same rule (ask [`classify`] about any one).
    pub smallest_sets_only: bool,
}

impl MatrixPlan {
    /// The `--explain` text: counts, then every excluded configuration with its rule and every
    /// not-applicable one with its reason.
    pub fn explain(&self) -> String {
        let mut s = format!(
            "{} legal, {} excluded, {} not applicable\n",
            self.legal.len(),
            self.excluded.len(),
            self.not_applicable.len()
        );
        if self.smallest_sets_only {
            s.push_str("(each rule is shown at its smallest door set; larger sets containing it are left out by the same rule)\n");
        }
        for e in &self.excluded {
            let _ = writeln!(s, "EXCLUDED        {}: {}", e.config.label(), e.rule);
        }
        for n in &self.not_applicable {
            let _ = writeln!(s, "NOT-APPLICABLE  {}: {}", n.config.label(), n.reason);
        }
        s
    }

    fn finish(mut self) -> MatrixPlan {
        self.legal.sort();
        self.legal.dedup();
        self.excluded.sort();
        self.excluded.dedup();
        self.not_applicable.sort();
        self.not_applicable.dedup();
        self
    }

    fn push(&mut self, config: Configuration, legality: Legality) {
        match legality {
            Legality::Legal => self.legal.push(config),
            Legality::Excluded(rule) => self.excluded.push(Exclusion { config, rule }),
            Legality::NotApplicable(reason) => self.not_applicable.push(NotApplicable { config, reason }),
        }
    }
}

fn list<T>(items: &[T], name: impl Fn(&T) -> String) -> String {
    items.iter().map(name).collect::<Vec<_>>().join(", ")
}

/// Decide one configuration by the registry's rules, in this order: requires, conflicts, TP,
/// transport (→ excluded), then backend (→ not applicable). Unknown doors and TP sizes outside
/// {1, 2, 4, 8} are errors, not exclusions.
pub fn classify(registry: &Registry, config: &Configuration) -> Result<Legality, RegistryError> {
    check_tps(&[config.tp])?;
    let mut doors = Vec::new();
    for id in &config.doors {
        doors.push(registry.door(id).ok_or_else(|| unknown_door(registry, id))?);
    }
    for d in &doors {
        for l in &d.requires {
            if !config.doors.contains(&l.id) {
                return Ok(Legality::Excluded(format!("{} requires {} (rule: {})", d.id, l.id, l.why)));
            }
        }
    }
    for d in &doors {
        for l in &d.conflicts {
            if d.id < l.id && config.doors.contains(&l.id) {
                return Ok(Legality::Excluded(format!("{} conflicts with {} (rule: {})", d.id, l.id, l.why)));
            }
        }
    }
    for d in &doors {
        if !d.tp.contains(&config.tp) {
            return Ok(Legality::Excluded(format!(
                "{} runs only at TP {}, not TP{} (rule: {})",
                d.id,
                list(&d.tp.allowed, |t| t.to_string()),
                config.tp,
                d.tp.why.as_deref().unwrap_or("(none given)")
            )));
        }
    }
    for d in &doors {
        if !d.transports.contains(&config.transport) {
            return Ok(Legality::Excluded(format!(
                "{} runs only over {}, not {} (rule: {})",
                d.id,
                list(&d.transports.allowed, |t| t.name().to_string()),
                config.transport.name(),
                d.transports.why.as_deref().unwrap_or("(none given)")
            )));
        }
    }
    for d in &doors {
        if let Some(reason) = d.not_applicable_on(config.backend) {
            return Ok(Legality::NotApplicable(format!(
                "{} has no meaning on the {} backend: {reason}",
                d.id,
                config.backend.name()
            )));
        }
    }
    Ok(Legality::Legal)
}

fn unknown_door(registry: &Registry, id: &str) -> RegistryError {
    RegistryError::UnknownName {
        name: format!("door {id:?}"),
        kind: "door id".to_string(),
        rule: format!("configurations name doors of {}", registry.origin()),
        suggestion: crate::env::nearest(id, registry.ids()).map(str::to_string),
    }
}

fn check_tps(tps: &[usize]) -> Result<(), RegistryError> {
    for &tp in tps {
        if !TP_SIZES.contains(&tp) {
            return Err(RegistryError::Matrix {
                thing: "TP size".to_string(),
                value: tp.to_string(),
                rule: "TP must be 1, 2, 4 or 8 (it must divide the canonical grid of 8 blocks)".to_string(),
            });
        }
    }
    Ok(())
}

/// The requested axes, sorted and free of repeats.
struct Axes {
    tps: Vec<usize>,
    transports: Vec<Transport>,
    backends: Vec<BackendKind>,
}

impl Axes {
    fn new(tps: &[usize], transports: &[Transport], backends: &[BackendKind]) -> Result<Axes, RegistryError> {
        let empty = |thing: &str| RegistryError::Matrix {
            thing: thing.to_string(),
            value: "[]".to_string(),
            rule: "at least one value is needed, or nothing would be tested".to_string(),
        };
        if tps.is_empty() {
            return Err(empty("TP sizes"));
        }
        if transports.is_empty() {
            return Err(empty("transports"));
        }
        if backends.is_empty() {
            return Err(empty("backends"));
        }
        check_tps(tps)?;
        let mut a = Axes { tps: tps.to_vec(), transports: transports.to_vec(), backends: backends.to_vec() };
        a.tps.sort_unstable();
        a.tps.dedup();
        a.transports.sort_unstable();
        a.transports.dedup();
        a.backends.sort_unstable();
        a.backends.dedup();
        Ok(a)
    }

    /// Every (backend, tp, transport), in configuration order.
    fn each(&self) -> impl Iterator<Item = (BackendKind, usize, Transport)> + '_ {
        self.backends
            .iter()
            .flat_map(move |&b| self.tps.iter().flat_map(move |&tp| self.transports.iter().map(move |&t| (b, tp, t))))
    }

    fn cross(&self, registry: &Registry, doors: &BTreeSet<String>, plan: &mut MatrixPlan) -> Result<(), RegistryError> {
        for (backend, tp, transport) in self.each() {
            let config = Configuration { backend, tp, transport, doors: doors.clone() };
            let legality = classify(registry, &config)?;
            plan.push(config, legality);
        }
        Ok(())
    }
}

/// Enumerate a matrix over the requested TP sizes, transports and backends.
pub fn enumerate(
    registry: &Registry,
    kind: &MatrixKind,
    tps: &[usize],
    transports: &[Transport],
    backends: &[BackendKind],
) -> Result<MatrixPlan, RegistryError> {
    let axes = Axes::new(tps, transports, backends)?;
    let mut plan = MatrixPlan::default();
    match kind {
        MatrixKind::Single => {
            for set in single_sets(registry, false) {
                axes.cross(registry, &set, &mut plan)?;
            }
        }
        MatrixKind::Canaries => {
            for set in single_sets(registry, true) {
                if !set.is_empty() {
                    axes.cross(registry, &set, &mut plan)?;
                }
            }
        }
        MatrixKind::File(path) => {
            for set in read_door_sets(path, registry)? {
                axes.cross(registry, &set, &mut plan)?;
            }
        }
        MatrixKind::All => {
            let table = Table::new(registry)?;
            for mask in 0..(1u64 << table.ids.len()) {
                if !table.door_rules_hold(mask) {
                    continue;
                }
                let doors = table.set_of(mask);
                for (backend, tp, transport) in axes.each() {
                    if table.runs(mask, backend, tp, transport) {
                        plan.legal.push(Configuration { backend, tp, transport, doors: doors.clone() });
                    }
                }
            }
            // Exclusions at their smallest sets: each door with what it requires (TP, transport
            // and backend rules), and each conflicting pair with what the two require.
            for set in single_sets(registry, false) {
                let mut scratch = MatrixPlan::default();
                axes.cross(registry, &set, &mut scratch)?;
                plan.excluded.extend(scratch.excluded);
                plan.not_applicable.extend(scratch.not_applicable);
            }
            for (a, b) in table.conflicting_pairs() {
                let set = registry.closure_of([a, b]);
                let mut scratch = MatrixPlan::default();
                axes.cross(registry, &set, &mut scratch)?;
                debug_assert!(scratch.legal.is_empty() && scratch.not_applicable.is_empty());
                plan.excluded.extend(scratch.excluded);
            }
            plan.smallest_sets_only = true;
        }
        MatrixKind::Pairwise => {
            let table = Table::new(registry)?;
            for mask in table.covering(&axes) {
                axes.cross(registry, &table.set_of(mask), &mut plan)?;
            }
        }
    }
    Ok(plan.finish())
}

/// The baseline and, for each door of the kind asked (canaries or not), the door with what it
/// requires.
fn single_sets(registry: &Registry, canaries: bool) -> Vec<BTreeSet<String>> {
    let mut sets = vec![BTreeSet::new()];
    for d in registry.doors() {
        if d.is_canary() == canaries {
            sets.push(registry.closure_of([d.id.as_str()]));
        }
    }
    sets
}

/// The non-canary doors as bit masks, for the enumerations that range over 2^n door sets.
struct Table<'r> {
    /// Sorted non-canary door ids; bit i of a mask is `ids[i]`.
    ids: Vec<&'r str>,
    /// Bits of the doors each door directly requires.
    requires: Vec<u64>,
    conflicts: Vec<u64>,
    tp_ok: Vec<Vec<usize>>,
    transport_ok: Vec<Vec<Transport>>,
    backend_ok: Vec<Vec<BackendKind>>,
}

impl<'r> Table<'r> {
    fn new(registry: &'r Registry) -> Result<Table<'r>, RegistryError> {
        let mut ids: Vec<&str> = registry.doors().iter().filter(|d| !d.is_canary()).map(|d| d.id.as_str()).collect();
        ids.sort_unstable();
        if ids.len() > MAX_ENUMERATED_DOORS {
            return Err(RegistryError::Matrix {
                thing: "door count".to_string(),
                value: ids.len().to_string(),
                rule: format!(
                    "all and pairwise range over 2^n door sets and accept at most {MAX_ENUMERATED_DOORS} doors; use single or a door-set file"
                ),
            });
        }
        let bit = |id: &str| ids.iter().position(|x| *x == id).map_or(0, |i| 1u64 << i);
        let mut t = Table {
            ids: ids.clone(),
            requires: Vec::new(),
            conflicts: Vec::new(),
            tp_ok: Vec::new(),
            transport_ok: Vec::new(),
            backend_ok: Vec::new(),
        };
        for id in &ids {
            let d = registry.door(id).expect("ids come from the registry");
            // Canaries are not enumerated here, so a door that requires one gets an
            // unsatisfiable requirement (every bit) and is never enumerated either.
            let mut req = 0;
            for l in &d.requires {
                req |= if registry.door(&l.id).is_some_and(|x| x.is_canary()) { u64::MAX } else { bit(&l.id) };
            }
            t.requires.push(req);
            t.conflicts.push(d.conflicts.iter().map(|l| bit(&l.id)).fold(0, |a, b| a | b));
            t.tp_ok.push(d.tp.allowed.clone());
            t.transport_ok.push(d.transports.allowed.clone());
            t.backend_ok.push(d.backends.clone());
        }
        Ok(t)
    }

    fn members(&self, mask: u64) -> impl Iterator<Item = usize> + '_ {
        (0..self.ids.len()).filter(move |i| mask & (1 << i) != 0)
    }

    /// Every requirement present and no conflict.
    fn door_rules_hold(&self, mask: u64) -> bool {
        self.members(mask).all(|i| self.requires[i] & !mask == 0 && self.conflicts[i] & mask == 0)
    }

    /// Legal and applicable (door rules are checked by the caller).
    fn runs(&self, mask: u64, backend: BackendKind, tp: usize, transport: Transport) -> bool {
        self.members(mask).all(|i| {
            self.tp_ok[i].contains(&tp)
                && self.transport_ok[i].contains(&transport)
                && self.backend_ok[i].contains(&backend)
        })
    }

    fn set_of(&self, mask: u64) -> BTreeSet<String> {
        self.members(mask).map(|i| self.ids[i].to_string()).collect()
    }

    fn conflicting_pairs(&self) -> Vec<(&'r str, &'r str)> {
        let mut out = Vec::new();
        for i in 0..self.ids.len() {
            for j in i + 1..self.ids.len() {
                if self.conflicts[i] & (1 << j) != 0 {
                    out.push((self.ids[i], self.ids[j]));
                }
            }
        }
        out
    }

    /// Greedy covering array over door on/off settings. A pair of settings (door i = a,
    /// door j = b) is coverable when some legal door set with that pair runs somewhere on the
    /// requested axes; the baseline is taken first, then repeatedly the set that covers the most
    /// uncovered pairs (ties: the smallest mask), until every coverable pair is covered.
    fn covering(&self, axes: &Axes) -> Vec<u64> {
        let n = self.ids.len();
        let candidates: Vec<u64> = (0..(1u64 << n))
            .filter(|&m| self.door_rules_hold(m) && axes.each().any(|(b, tp, t)| self.runs(m, b, tp, t)))
            .collect();
        let pair_index = |i: usize, j: usize, mask: u64| {
            let a = usize::from(mask & (1 << i) != 0);
            let b = usize::from(mask & (1 << j) != 0);
            ((i * n + j) << 2) | (a << 1) | b
        };
        let pairs_of = |mask: u64| (0..n).flat_map(move |i| (i + 1..n).map(move |j| pair_index(i, j, mask)));
        let mut coverable = vec![false; n * n * 4];
        for &m in &candidates {
            for p in pairs_of(m) {
                coverable[p] = true;
            }
        }
        let mut covered = vec![false; n * n * 4];
        let mut remaining = coverable.iter().filter(|c| **c).count();
        let mut chosen = Vec::new();
        let mut take = |m: u64, covered: &mut Vec<bool>, remaining: &mut usize| {
            for p in pairs_of(m) {
                if !covered[p] {
                    covered[p] = true;
                    *remaining -= 1;
                }
            }
            chosen.push(m);
        };
        if candidates.contains(&0) {
            take(0, &mut covered, &mut remaining);
        }
        while remaining > 0 {
            let mut best = (0usize, 0u64);
            for &m in &candidates {
                let gain = pairs_of(m).filter(|&p| !covered[p]).count();
                if gain > best.0 {
                    best = (gain, m);
                }
            }
            if best.0 == 0 {
                break; // cannot happen: every coverable pair comes from some candidate
            }
            take(best.1, &mut covered, &mut remaining);
        }
        chosen
    }
}

/// Shard `index` of `count` (0-based): the configurations at positions `k` with
/// `k % count == index` of each sorted list. The shards partition the plan.
pub fn shard(plan: &MatrixPlan, index: usize, count: usize) -> Result<MatrixPlan, RegistryError> {
    if count == 0 || index >= count {
        return Err(RegistryError::Flag {
            flag: "--shard".to_string(),
            value: format!("{index}/{count}"),
            rule: "use I/N with N >= 1 and 0 <= I < N (shards are numbered from 0)".to_string(),
        });
    }
    fn pick<T: Clone>(v: &[T], index: usize, count: usize) -> Vec<T> {
        v.iter().enumerate().filter(|(k, _)| k % count == index).map(|(_, x)| x.clone()).collect()
    }
    Ok(MatrixPlan {
        legal: pick(&plan.legal, index, count),
        excluded: pick(&plan.excluded, index, count),
        not_applicable: pick(&plan.not_applicable, index, count),
        smallest_sets_only: plan.smallest_sets_only,
    })
}

/// Parse a `--shard I/N` value (0-based `I`).
pub fn parse_shard(spec: &str) -> Result<(usize, usize), RegistryError> {
    let bad = || RegistryError::Flag {
        flag: "--shard".to_string(),
        value: spec.to_string(),
        rule: "use I/N with N >= 1 and 0 <= I < N (shards are numbered from 0), e.g. 0/4".to_string(),
    };
    let (i, n) = spec.split_once('/').ok_or_else(bad)?;
    let i: usize = i.parse().map_err(|_| bad())?;
    let n: usize = n.parse().map_err(|_| bad())?;
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DoorSetFile {
    #[allow(dead_code)] // checked before strict parsing
    schema_version: i64,
    sets: Vec<Vec<String>>,
}

/// How a door-set file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetFileFormat {
    Toml,
    Json,
}

/// Read a door-set file (format by extension: `.toml` or `.json`).
pub fn read_door_sets(path: &Path, registry: &Registry) -> Result<Vec<BTreeSet<String>>, RegistryError> {
    let origin = path.display().to_string();
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => SetFileFormat::Toml,
        Some("json") => SetFileFormat::Json,
        _ => {
            return Err(RegistryError::Matrix {
                thing: "door-set file".to_string(),
                value: origin,
                rule: "the file name must end in .toml or .json".to_string(),
            })
        }
    };
    let text = std::fs::read_to_string(path).map_err(|source| RegistryError::Io { path: origin.clone(), source })?;
    parse_door_sets(&text, format, &origin, registry)
}

/// Parse door-set file text; `origin` names it in error messages.
pub fn parse_door_sets(
    text: &str,
    format: SetFileFormat,
    origin: &str,
    registry: &Registry,
) -> Result<Vec<BTreeSet<String>>, RegistryError> {
    let parse_err = |message: String| RegistryError::Parse {
        origin: origin.to_string(),
        what: format!("door-set file (schema_version {DOOR_SET_FILE_VERSION})"),
        message,
    };
    let version = match format {
        SetFileFormat::Toml => {
            let t: toml::Table = toml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
            t.get("schema_version").map(|v| (v.as_integer(), v.to_string()))
        }
        SetFileFormat::Json => {
            let v: serde_json::Value = serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?;
            v.get("schema_version").map(|v| (v.as_i64(), v.to_string()))
        }
    };
    match version {
        Some((Some(DOOR_SET_FILE_VERSION), _)) => {}
        other => {
            return Err(RegistryError::SchemaVersion {
                origin: origin.to_string(),
                found: other.map_or("(missing)".to_string(), |(_, s)| s),
                supported: DOOR_SET_FILE_VERSION,
            })
        }
    }
    let file: DoorSetFile = match format {
        SetFileFormat::Toml => toml::from_str(text).map_err(|e| parse_err(e.to_string()))?,
        SetFileFormat::Json => serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?,
    };
    let mut sets: Vec<BTreeSet<String>> = Vec::new();
    let mut errors = Vec::new();
    for (k, names) in file.sets.iter().enumerate() {
        let mut set = BTreeSet::new();
        for name in names {
            let door = registry.by_env(name).or_else(|| registry.door(&name.to_ascii_lowercase()));
            match door {
                Some(d) if !set.insert(d.id.clone()) => errors.push(RegistryError::Matrix {
                    thing: format!("{origin} set #{k}"),
                    value: format!("{names:?}"),
                    rule: format!("door {} is named twice", d.id),
                }),
                Some(_) => {}
                None => errors.push(RegistryError::UnknownName {
                    name: format!("{origin} set #{k} door {name:?}"),
                    kind: "door".to_string(),
                    rule: format!("doors are the ids and MEMRA_* variables of {}", registry.origin()),
                    suggestion: crate::env::nearest(&name.to_ascii_lowercase(), registry.ids())
                        .or_else(|| crate::env::nearest(name, registry.env_names()))
                        .map(str::to_string),
                }),
            }
        }
        if let Some(first) = sets.iter().position(|s| *s == set) {
            errors.push(RegistryError::Matrix {
                thing: format!("{origin} set #{k}"),
                value: format!("{names:?}"),
                rule: format!("repeats set #{first}"),
            });
        }
        sets.push(set);
    }
    RegistryError::collect(errors)?;
    Ok(sets)
}
