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

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

use memra_runtime::config::{DoorSet, PassShape, Transport};

use crate::registry::{BackendKind, FlipAt, Registry, RegistryError, TP_SIZES};

mod covering;
mod door_sets;
mod passes;

use covering::Table;
pub use door_sets::{parse_door_sets, read_door_sets, DoorSets, SetFileFormat, DOOR_SET_FILE_VERSION};
pub use passes::Passes;

/// Most doors `--matrix all` and `--matrix pairwise` enumerate over (door sets are 64-bit masks;
/// the legal ones are found without visiting all 2^n, `covering::Table::legal_masks`).
pub const MAX_ENUMERATED_DOORS: usize = 63;

/// One run: which doors are on, at which TP size, over which transport, on which backend, and
/// the shape of its passes (rows or columns, docs/DESIGN.md §3.6). Field order is the sort order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Configuration {
    pub backend: BackendKind,
    pub tp: usize,
    pub transport: Transport,
    /// Enabled door ids (every other door off).
    pub doors: BTreeSet<String>,
    /// Sessions per pass (rows): 1, 2, 4 or 8.
    pub batch: usize,
    /// Consecutive tokens of one session per pass (columns): 1, 2, 4 or 8; not with `batch` > 1.
    pub columns: usize,
}

impl Configuration {
    /// Every door off, one token of one session per pass.
    pub fn baseline(tp: usize, transport: Transport, backend: BackendKind) -> Configuration {
        Configuration::single(backend, tp, transport, BTreeSet::new())
    }

    /// `doors` at one token of one session per pass.
    pub fn single(backend: BackendKind, tp: usize, transport: Transport, doors: BTreeSet<String>) -> Configuration {
        Configuration { backend, tp, transport, doors, batch: 1, columns: 1 }
    }

    /// The same configuration with passes of `pass`'s shape.
    pub fn with_pass(mut self, pass: PassShape) -> Configuration {
        (self.batch, self.columns) = (pass.batch, pass.columns);
        self
    }

    /// The runtime's pass shape (checked when the configuration was made: 1/2/4/8, not both).
    pub fn pass(&self) -> PassShape {
        PassShape { batch: self.batch, columns: self.columns }
    }

    /// A short stable name, e.g. `tp4 native-p2p host +oproj_direct+oproj_tail`, ending in ` b4`
    /// or ` t2` for passes of several rows or columns.
    pub fn label(&self) -> String {
        let mut s = format!("tp{} {} {}", self.tp, self.transport.name(), self.backend.name());
        if !self.doors.is_empty() {
            s.push(' ');
            for d in &self.doors {
                s.push('+');
                s.push_str(d);
            }
        }
        let pass = self.pass().label();
        if !pass.is_empty() {
            s.push(' ');
            s.push_str(&pass);
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
    /// What the pass-shape axes include and exclude, and why (`passes`; `--explain`).
    pub pass_notes: Vec<String>,
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
        for note in &self.pass_notes {
            let _ = writeln!(s, "{note}");
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

    /// Add a classified configuration to the list its legality puts it in.
    pub fn push(&mut self, config: Configuration, legality: Legality) {
        match legality {
            Legality::Legal => self.legal.push(config),
            Legality::Excluded(rule) => self.excluded.push(Exclusion { config, rule }),
            Legality::NotApplicable(reason) => self.not_applicable.push(NotApplicable { config, reason }),
        }
    }
}

/// `set [a, b]: rule` per distinct (door set, rule), at most `max` lines and a count of the rest.
pub fn exclusion_lines(excluded: &[Exclusion], max: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for e in excluded {
        let doors: Vec<&str> = e.config.doors.iter().map(String::as_str).collect();
        let line = format!("set [{}]: {}", doors.join(", "), e.rule);
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
    if lines.len() > max {
        let rest = lines.len() - max;
        lines.truncate(max);
        lines.push(format!("… and {rest} more (memra-gates matrix --matrix FILE --explain lists them)"));
    }
    lines
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
                return Ok(Legality::Excluded(format!("{} requires {} (its `requires` rule: {})", d.id, l.id, l.why)));
            }
        }
    }
    for d in &doors {
        for l in &d.conflicts {
            if d.id < l.id && config.doors.contains(&l.id) {
                return Ok(Legality::Excluded(format!(
                    "{} conflicts with {} (its `conflicts` rule: {})",
                    d.id, l.id, l.why
                )));
            }
        }
    }
    for d in &doors {
        if !d.tp.contains(&config.tp) {
            return Ok(Legality::Excluded(format!(
                "{} runs only at TP {}, not TP{} (its `tp` rule: {})",
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
                "{} runs only over {}, not {} (its `transports` rule: {})",
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
        suggestion: crate::text::nearest(id, registry.ids()).map(str::to_string),
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
pub(crate) struct Axes {
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
    pub(crate) fn each(&self) -> impl Iterator<Item = (BackendKind, usize, Transport)> + '_ {
        self.backends
            .iter()
            .flat_map(move |&b| self.tps.iter().flat_map(move |&tp| self.transports.iter().map(move |&t| (b, tp, t))))
    }

    fn cross(&self, registry: &Registry, doors: &BTreeSet<String>, plan: &mut MatrixPlan) -> Result<(), RegistryError> {
        for (backend, tp, transport) in self.each() {
            let config = Configuration::single(backend, tp, transport, doors.clone());
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
            let file = read_door_sets(path, registry)?;
            for set in &file.sets {
                axes.cross(registry, set, &mut plan)?;
            }
            if !file.expect_exclusions && !plan.excluded.is_empty() {
                return Err(RegistryError::Matrix {
                    thing: "door-set file".to_string(),
                    value: path.display().to_string(),
                    rule: format!(
                        "the registry's rules exclude {} of its configuration(s) at the requested TP sizes and \
                         transports; change the sets (or --tp / --transport), or add `expect_exclusions = true` to \
                         the file if these exclusions are intended:\n  {}",
                        plan.excluded.len(),
                        exclusion_lines(&plan.excluded, 8).join("\n  ")
                    ),
                });
            }
        }
        MatrixKind::All => {
            let table = Table::new(registry)?;
            for mask in table.legal_masks() {
                let doors = table.set_of(mask);
                for (backend, tp, transport) in axes.each() {
                    if table.runs(mask, backend, tp, transport) {
                        plan.legal.push(Configuration::single(backend, tp, transport, doors.clone()));
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

/// Shard `index` of `count` (0-based). Each list is cut into *lanes* — its runs of
/// configurations with one backend, TP size and transport (contiguous, the lists are sorted) —
/// and every lane of at least `count` configurations into `count` contiguous blocks of
/// near-equal size; the shard takes block `index` of every such lane (the configurations of
/// shorter lanes are dealt round the shards). The shards partition the plan, each gets its share of every TP size
/// (so N concurrent shards finish together), and a shard's door sets are neighbours in the
/// sorted order: they share their leading doors, so a set and the same set with one door off —
/// its census baseline — usually land in the same shard, where the run of one serves the other
/// (a round-robin split left nearly every baseline in another shard and ran it again).
pub fn shard(plan: &MatrixPlan, index: usize, count: usize) -> Result<MatrixPlan, RegistryError> {
    if count == 0 || index >= count {
        return Err(RegistryError::Flag {
            flag: "--shard".to_string(),
            value: format!("{index}/{count}"),
            rule: "use I/N with N >= 1 and 0 <= I < N (shards are numbered from 0)".to_string(),
        });
    }
    fn pick<T: Clone>(
        v: &[T],
        lane: impl Fn(&T) -> (BackendKind, usize, Transport),
        index: usize,
        count: usize,
    ) -> Vec<T> {
        let mut out = Vec::new();
        let (mut start, mut dealt) = (0, 0);
        while start < v.len() {
            let key = lane(&v[start]);
            let len = v[start..].iter().take_while(|x| lane(x) == key).count();
            if len >= count {
                let block = |i: usize| start + i * len / count;
                out.extend_from_slice(&v[block(index)..block(index + 1)]);
            } else {
                // A lane shorter than the shard count has no block for every shard: its
                // configurations are dealt one per shard, continuing where the last short lane
                // stopped, so no shard is left empty while others hold several.
                for (k, x) in v[start..start + len].iter().enumerate() {
                    if (dealt + k) % count == index {
                        out.push(x.clone());
                    }
                }
                dealt += len;
            }
            start += len;
        }
        out
    }
    let lane = |c: &Configuration| (c.backend, c.tp, c.transport);
    Ok(MatrixPlan {
        legal: pick(&plan.legal, lane, index, count),
        excluded: pick(&plan.excluded, |e| lane(&e.config), index, count),
        not_applicable: pick(&plan.not_applicable, |n| lane(&n.config), index, count),
        smallest_sets_only: plan.smallest_sets_only,
        pass_notes: plan.pass_notes.clone(),
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
