//! Promotion (docs/DESIGN.md §7): turning a door on by default is a claim about every configuration it
//! can appear in, so it is decided from nightly receipts alone — never from a person's memory of
//! "it has been green for a while". This module reads a nightly history (one receipt directory per
//! night), applies the policy below to every door of the registry, and writes the evidence: a
//! table of doors with the first blocking receipt of each, and the defaults to commit.
//!
//! # The rule, per door, over the last N nights (default [`DEFAULT_NIGHTS`])
//!
//! Nights are ordered by date (the earliest `measurements.started_at_unix_ms` of their receipts,
//! ties by directory name); the last N are the window. Only receipts of kind `run` count
//! (performance receipts carry no gate verdicts for promotion). A receipt's configuration is its
//! backend, TP size, transport and the doors its `config.doors` sets to `true` (by `MEMRA_*` name,
//! mapped to registry ids; a name the registry does not know stays as it is, so such a receipt
//! matches no configuration of the registry).
//!
//! A door is **promotable** when the window holds N nights and in each of them:
//!
//! - **(a) coverage.** With [`Coverage::Full`] (the default, docs/DESIGN.md §7's "every legal combination
//!   containing it"): the expected set is `matrix::enumerate(registry, MatrixKind::All, …)` over
//!   every TP size and transport, on the backends present in that night's receipts, restricted to
//!   configurations whose door set contains the door. Every expected configuration has at least
//!   one receipt, and every such receipt is PASS (NOT-APPLICABLE configurations are not in the
//!   legal set, so they are not required; a receipt that says NOT-APPLICABLE for a configuration
//!   the registry calls legal does not pass). A night whose backends admit no configuration of the
//!   door blocks too: there is no evidence. With [`Coverage::Ran`] (for nightlies that run
//!   `pairwise` or `single`): at least one PASS receipt contains the door. In both modes, every
//!   receipt that contains the door is PASS or NOT-APPLICABLE — a FAIL, VOID, SKIP or ERROR
//!   anywhere blocks, and a NOT-APPLICABLE receipt blocks only where the configuration is expected.
//! - **(b) engagement.** Every PASS receipt counted for the door has an `engagement` gate with
//!   verdict PASS, and the door's counter in `evidence.engaged` is > 0. The counter is the
//!   registry's `engagement` name; the receipt format's `MEMRA_X` / `MEMRA_X@seam` keys are also
//!   accepted, and the per-seam counts of one door are summed.
//! - **(c) class baseline (NUMERIC-CLASS only).** The door's class-baseline configuration — its
//!   closure (the door with what it requires) at its smallest TP size over host-bounce (or, for a
//!   door that excludes host-bounce, its first allowed transport) — has a receipt in every night,
//!   on every backend of the door that the window ran, and those receipts are unchanged from the
//!   first such night of the window: same run ids, same `token_tape_digest`, same seam digests.
//!
//! Fewer than N nights blocks ("only 3 of the required 7 nights"). CANARY doors are never
//! promotable. Doors already default-on are reported as such and not evaluated.
//!
//! # Output
//!
//! [`PromotionReport::to_table`] prints one row per door with the first blocking evidence — the
//! night, the configuration label ([`Configuration::label`]) and the gate and verdict — or
//! `passed N nights, K runs`. [`PromotionReport::defaults_toml`] writes the new default of every
//! non-canary door as a `[defaults]` snippet keyed by environment variable; the registry format
//! keeps defaults inside each `[[door]]` entry (and rejects unknown tables), so
//! [`PromotionReport::apply_to_registry_text`] rewrites a `doors.toml` text in place, which is the
//! form to commit.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use memra_receipts::{Gate as ReceiptGate, Receipt, ReceiptError, ReceiptKind, Verdict};
use memra_runtime::config::Transport;
use tabled::builder::Builder;
use tabled::settings::Style;

use crate::matrix::{self, Configuration, MatrixKind};
use crate::registry::{BackendKind, Door, DoorClass, Registry, TP_SIZES};

/// How many of the latest nights a door must hold in (docs/DESIGN.md §7).
pub const DEFAULT_NIGHTS: usize = 7;

/// Errors of loading a nightly history and applying a promotion. Each message names the
/// directory or value and the rule.
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    /// No history directory was given.
    #[error("promote --history: no directory given; promotion needs at least one night of receipts")]
    NoHistory,
    /// A directory could not be listed, or one of its receipts did not read.
    #[error("night {}: {source}", .dir.display())]
    Receipt {
        dir: PathBuf,
        #[source]
        source: ReceiptError,
    },
    /// A directory without a single receipt: a night that ran nothing is not a night of evidence.
    #[error("night {}: holds no run-*.json receipt (rule: every history directory is one night's receipt directory)", .dir.display())]
    EmptyNight { dir: PathBuf },
    /// The same directory given twice would count one night twice.
    #[error("night {}: given twice (as {} and {}); each night counts once", .dir.display(), .first.display(), .second.display())]
    DuplicateNight { dir: PathBuf, first: PathBuf, second: PathBuf },
    /// A policy value that cannot decide anything.
    #[error("{thing} {value:?}: {rule}")]
    Policy { thing: String, value: String, rule: String },
    /// A registry text that the new defaults cannot be written into.
    #[error("{origin}: {rule}")]
    RegistryText { origin: String, rule: String },
}

// ---- policy ------------------------------------------------------------------------------------

/// Which configurations a night must hold for a door (requirement (a) of the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Coverage {
    /// docs/DESIGN.md §7: every legal combination containing the door, on every TP size and transport it
    /// allows, on the backends the night ran, has a receipt, and each one passed.
    #[default]
    Full,
    /// Every receipt that contains the door passed, and at least one exists per night. For
    /// nightlies that run `pairwise` or `single` instead of `all`.
    Ran,
}

impl Coverage {
    pub fn name(self) -> &'static str {
        match self {
            Coverage::Full => "full",
            Coverage::Ran => "ran",
        }
    }

    /// `full` or `ran`.
    pub fn parse(s: &str) -> Result<Coverage, PromoteError> {
        match s {
            "full" => Ok(Coverage::Full),
            "ran" => Ok(Coverage::Ran),
            _ => Err(PromoteError::Policy {
                thing: "--coverage".to_string(),
                value: s.to_string(),
                rule: "use full (every legal combination containing the door, docs/DESIGN.md §7) or ran (every receipt that contains it)".to_string(),
            }),
        }
    }
}

/// The promotion policy: how many nights, and which coverage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub n_last: usize,
    pub coverage: Coverage,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { n_last: DEFAULT_NIGHTS, coverage: Coverage::Full }
    }
}

impl Policy {
    /// A checked policy: at least one night (zero nights would promote every door on no evidence).
    pub fn new(n_last: usize, coverage: Coverage) -> Result<Policy, PromoteError> {
        if n_last == 0 {
            return Err(zero_nights());
        }
        Ok(Policy { n_last, coverage })
    }
}

fn zero_nights() -> PromoteError {
    PromoteError::Policy {
        thing: "--nights".to_string(),
        value: "0".to_string(),
        rule: "at least 1 night is required; 0 would promote every door on no evidence".to_string(),
    }
}

// ---- history -----------------------------------------------------------------------------------

/// One night: the receipts of one directory.
#[derive(Debug, Clone)]
pub struct Night {
    /// How messages name the night: the UTC date of its earliest receipt (`2026-11-27`), followed
    /// by the directory name in parentheses when that differs from the date.
    pub label: String,
    pub dir: PathBuf,
    /// The earliest `measurements.started_at_unix_ms` of its receipts: the night's date.
    pub started_at_unix_ms: u64,
    pub receipts: Vec<Receipt>,
}

impl Night {
    /// A night from receipts already in memory (`dir` only names it and breaks date ties).
    /// `None` when `receipts` is empty.
    pub fn new(dir: impl Into<PathBuf>, receipts: Vec<Receipt>) -> Option<Night> {
        let dir = dir.into();
        let started_at_unix_ms = receipts.iter().map(|r| r.measurements.started_at_unix_ms).min()?;
        let date = utc_date(started_at_unix_ms);
        let name = dir_name(&dir);
        let label = if name == date || name.is_empty() { date } else { format!("{date} ({name})") };
        Some(Night { label, dir, started_at_unix_ms, receipts })
    }
}

fn dir_name(dir: &Path) -> String {
    dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| dir.display().to_string())
}

/// Load one night per directory, ordered by date (earliest receipt start), ties by directory
/// name. An unreadable receipt, a directory without receipts, a directory given twice, or no
/// directory at all is an error naming it.
pub fn load_history(dirs: &[PathBuf]) -> Result<Vec<Night>, PromoteError> {
    if dirs.is_empty() {
        return Err(PromoteError::NoHistory);
    }
    let mut seen: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    let mut nights = Vec::new();
    for dir in dirs {
        let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
        if let Some(first) = seen.insert(canonical.clone(), dir.clone()) {
            return Err(PromoteError::DuplicateNight { dir: canonical, first, second: dir.clone() });
        }
        let receipts = memra_receipts::store::load_dir(dir)
            .map_err(|source| PromoteError::Receipt { dir: dir.clone(), source })?;
        let night = Night::new(dir.clone(), receipts).ok_or_else(|| PromoteError::EmptyNight { dir: dir.clone() })?;
        nights.push(night);
    }
    sort_nights(&mut nights);
    Ok(nights)
}

fn sort_nights(nights: &mut [Night]) {
    nights.sort_by(night_order);
}

/// By date, ties by directory name.
fn night_order(a: &Night, b: &Night) -> std::cmp::Ordering {
    a.started_at_unix_ms.cmp(&b.started_at_unix_ms).then_with(|| dir_name(&a.dir).cmp(&dir_name(&b.dir)))
}

/// `YYYY-MM-DD` (UTC) of a Unix time in milliseconds.
pub fn utc_date(unix_ms: u64) -> String {
    let (year, month, day, _, _) = memra_receipts::schema::utc_civil(unix_ms);
    format!("{year:04}-{month:02}-{day:02}")
}

// ---- report ------------------------------------------------------------------------------------

/// Where a door stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorStatus {
    /// Every requirement held in each of the last N nights.
    Promotable,
    /// Some requirement did not hold; `evidence` names the first blocking receipt.
    Blocked,
    /// Already on by default in the registry (not evaluated).
    AlreadyDefault,
    /// A planted defect: never promoted.
    Canary,
}

impl DoorStatus {
    pub fn name(self) -> &'static str {
        match self {
            DoorStatus::Promotable => "promotable",
            DoorStatus::Blocked => "blocked",
            DoorStatus::AlreadyDefault => "already default",
            DoorStatus::Canary => "canary",
        }
    }
}

/// One door's promotion decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorRow {
    pub id: String,
    pub env: String,
    pub class: DoorClass,
    pub status: DoorStatus,
    /// `status == Promotable`.
    pub promotable: bool,
    /// The first blocking evidence (night, configuration label, gate / verdict) and how many more
    /// there are, or `passed N nights, K runs`.
    pub evidence: String,
    /// Every blocking finding, in night order.
    pub blockers: Vec<String>,
    /// Nights evaluated (the window).
    pub nights: usize,
    /// Receipts that counted for the door over the window.
    pub runs: usize,
}

/// The decision for every door of a registry, in registry order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromotionReport {
    pub policy: Policy,
    /// Labels of the nights evaluated, oldest first.
    pub window: Vec<String>,
    pub rows: Vec<DoorRow>,
}

impl PromotionReport {
    /// The row of door `id`.
    pub fn row(&self, id: &str) -> Option<&DoorRow> {
        self.rows.iter().find(|r| r.id == id)
    }

    /// The ids of the promotable doors.
    pub fn promotable(&self) -> Vec<&str> {
        self.rows.iter().filter(|r| r.promotable).map(|r| r.id.as_str()).collect()
    }

    /// One row per door: id, env, class, status, evidence.
    pub fn to_table(&self) -> String {
        let mut b = Builder::default();
        b.push_record(["door", "env", "class", "status", "evidence"]);
        for r in &self.rows {
            b.push_record([
                r.id.clone(),
                r.env.clone(),
                r.class.name().to_string(),
                r.status.name().to_string(),
                r.evidence.clone(),
            ]);
        }
        let mut t = b.build();
        t.with(Style::sharp());
        let window = if self.window.is_empty() { "(no nights)".to_string() } else { self.window.join(", ") };
        format!(
            "promotion over the last {} night(s), coverage {}: {window}\n{t}\n{} of {} door(s) promotable\n",
            self.policy.n_last,
            self.policy.coverage.name(),
            self.promotable().len(),
            self.rows.len()
        )
    }

    /// The new default of every non-canary door of `registry` (promotable or already default →
    /// `true`), as a `[defaults]` TOML snippet keyed by environment variable, with the evidence as
    /// a comment. Doors the report has no row for keep their registry default.
    pub fn defaults_toml(&self, registry: &Registry) -> String {
        let mut s = format!(
            "# New door defaults from `memra-gates promote` (last {} night(s), coverage {}).\n\
             # Each value is the `default` of that door's [[door]] entry in {}.\n[defaults]\n",
            self.policy.n_last,
            self.policy.coverage.name(),
            registry.origin()
        );
        for d in registry.doors().iter().filter(|d| !d.is_canary()) {
            let (on, why) = match self.row(&d.id) {
                Some(r) if r.status == DoorStatus::Promotable => (true, format!("promoted: {}", r.evidence)),
                Some(r) if r.status == DoorStatus::AlreadyDefault => (true, "already default".to_string()),
                Some(r) => (false, format!("not promoted: {}", one_line(&r.evidence))),
                None => (d.default, "not evaluated".to_string()),
            };
            let _ = writeln!(s, "{} = {on}  # {why}", d.env);
        }
        s
    }

    /// `text` (a `doors.toml` of the same doors) with `default = false` replaced by
    /// `default = true` in the `[[door]]` entry of every promotable door; everything else is kept
    /// byte for byte. The result is parsed back and must give exactly the new defaults.
    pub fn apply_to_registry_text(&self, text: &str, origin: &str) -> Result<String, PromoteError> {
        let fail = |rule: String| PromoteError::RegistryText { origin: origin.to_string(), rule };
        let promote: BTreeSet<&str> = self.promotable().into_iter().collect();
        let mut out = String::with_capacity(text.len());
        let mut block: Vec<&str> = Vec::new();
        let mut changed = BTreeSet::new();
        let mut flush = |block: &mut Vec<&str>, out: &mut String| -> Result<(), PromoteError> {
            let id = block.iter().find_map(|l| toml_string_value(l, "id"));
            let flip = id.is_some_and(|id| promote.contains(id));
            let mut done = false;
            for line in block.drain(..) {
                if flip && !done && toml_key(line) == Some("default") {
                    let indent = &line[..line.len() - line.trim_start().len()];
                    let rest = line.trim_start()["default".len()..].trim_start();
                    let rest = rest.strip_prefix('=').map(str::trim_start).unwrap_or("");
                    let Some(tail) = rest.strip_prefix("false") else {
                        return Err(fail(format!(
                            "door {:?}: its default line {line:?} is not `default = false`",
                            id.unwrap_or_default()
                        )));
                    };
                    out.push_str(indent);
                    out.push_str("default = true");
                    out.push_str(tail);
                    changed.insert(id.unwrap_or_default().to_string());
                    done = true;
                } else {
                    out.push_str(line);
                }
            }
            Ok(())
        };
        for line in text.split_inclusive('\n') {
            if is_table_header(line) {
                flush(&mut block, &mut out)?;
            }
            block.push(line);
        }
        flush(&mut block, &mut out)?;
        let missing: Vec<&str> = promote.iter().copied().filter(|id| !changed.contains(*id)).collect();
        if !missing.is_empty() {
            return Err(fail(format!(
                "no [[door]] entry with `default = false` for promotable door(s) {}",
                missing.join(", ")
            )));
        }
        let updated = Registry::from_toml_str(&out, origin)
            .map_err(|e| fail(format!("the updated registry does not read back: {e}")))?;
        for id in &promote {
            if !updated.door(id).is_some_and(|d| d.default) {
                return Err(fail(format!("door {id:?} is not default-on after the update")));
            }
        }
        Ok(out)
    }
}

/// Whether a line opens a TOML table (`[[door]]`, `[x]`), not an array element.
fn is_table_header(line: &str) -> bool {
    let t = line.split('#').next().unwrap_or("").trim();
    t.starts_with('[') && t.ends_with(']') && !t.contains(',') && !t.contains('"') && !t.contains('=')
}

/// The key of a `key = value` TOML line, if it is one.
fn toml_key(line: &str) -> Option<&str> {
    let (k, _) = line.split_once('=')?;
    let k = k.trim();
    (!k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')).then_some(k)
}

/// The value of a `key = "value"` line.
fn toml_string_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    if toml_key(line)? != key {
        return None;
    }
    let v = line.split_once('=')?.1.trim();
    let v = v.strip_prefix('"')?;
    v.split_once('"').map(|(v, _)| v)
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

// ---- the decision ------------------------------------------------------------------------------

/// [`promote_with`] under docs/DESIGN.md §7's full coverage.
pub fn promote(registry: &Registry, nights: &[Night], n_last: usize) -> PromotionReport {
    promote_with(registry, nights, Policy { n_last, coverage: Coverage::Full })
}

/// Decide every door of `registry` over the last `policy.n_last` of `nights` (sorted by date
/// here, as [`load_history`] sorts them). A policy of 0 nights blocks every door.
pub fn promote_with(registry: &Registry, nights: &[Night], policy: Policy) -> PromotionReport {
    let mut sorted: Vec<&Night> = nights.iter().collect();
    sorted.sort_by(|a, b| night_order(a, b));
    let start = sorted.len().saturating_sub(policy.n_last);
    let window: Vec<NightIndex> = sorted[start..].iter().map(|n| NightIndex::new(registry, n)).collect();
    let mut expected_cache = ExpectedCache::default();
    let rows =
        registry.doors().iter().map(|door| decide(registry, door, &window, policy, &mut expected_cache)).collect();
    PromotionReport { policy, window: window.iter().map(|n| n.label.clone()).collect(), rows }
}

fn decide(
    registry: &Registry,
    door: &Door,
    window: &[NightIndex],
    policy: Policy,
    cache: &mut ExpectedCache,
) -> DoorRow {
    let row = |status: DoorStatus, evidence: String, blockers: Vec<String>, runs: usize| DoorRow {
        id: door.id.clone(),
        env: door.env.clone(),
        class: door.class,
        status,
        promotable: status == DoorStatus::Promotable,
        evidence,
        blockers,
        nights: window.len(),
        runs,
    };
    if door.is_canary() {
        return row(
            DoorStatus::Canary,
            "CANARY doors are planted defects and are never promoted".to_string(),
            vec![],
            0,
        );
    }
    if door.default {
        return row(DoorStatus::AlreadyDefault, format!("already default-on in {}", registry.origin()), vec![], 0);
    }
    if policy.n_last == 0 {
        let e = zero_nights().to_string();
        return row(DoorStatus::Blocked, e.clone(), vec![e], 0);
    }
    let mut blockers = Blockers::default();
    if window.len() < policy.n_last {
        blockers.push(format!("only {} of the required {} nights", window.len(), policy.n_last));
    }
    let mut runs = 0;
    for night in window {
        runs += check_night(registry, door, night, policy.coverage, cache, &mut blockers);
    }
    if door.class == DoorClass::Numeric {
        check_class_baseline(registry, door, window, &mut blockers);
    }
    if blockers.0.is_empty() {
        let baseline = if door.class == DoorClass::Numeric { ", class baseline unchanged" } else { "" };
        row(DoorStatus::Promotable, format!("passed {} nights, {runs} runs{baseline}", window.len()), vec![], runs)
    } else {
        let first = blockers.0[0].clone();
        let more = blockers.0.len() - 1;
        let evidence = if more == 0 { first } else { format!("{first} (+{more} more)") };
        row(DoorStatus::Blocked, evidence, blockers.0, runs)
    }
}

/// Blocking findings, in order, each once.
#[derive(Default)]
struct Blockers(Vec<String>);

impl Blockers {
    fn push(&mut self, s: String) {
        if !self.0.contains(&s) {
            self.0.push(s);
        }
    }
}

/// One night's run receipts by configuration.
struct NightIndex<'n> {
    label: String,
    backends: Vec<BackendKind>,
    by_config: BTreeMap<Configuration, Vec<&'n Receipt>>,
}

impl<'n> NightIndex<'n> {
    fn new(registry: &Registry, night: &'n Night) -> NightIndex<'n> {
        let mut by_config: BTreeMap<Configuration, Vec<&Receipt>> = BTreeMap::new();
        let mut backends = BTreeSet::new();
        for r in night.receipts.iter().filter(|r| r.kind == ReceiptKind::Run) {
            let c = configuration_of(registry, r);
            backends.insert(c.backend);
            by_config.entry(c).or_default().push(r);
        }
        NightIndex { label: night.label.clone(), backends: backends.into_iter().collect(), by_config }
    }
}

/// The configuration a receipt ran, in registry terms.
fn configuration_of(registry: &Registry, r: &Receipt) -> Configuration {
    let c = &r.evidence.config;
    let backend = match c.backend {
        memra_receipts::Backend::Host => BackendKind::Host,
        memra_receipts::Backend::Cuda => BackendKind::Cuda,
    };
    let transport = match c.transport {
        memra_receipts::Transport::HostBounce => Transport::HostBounce,
        memra_receipts::Transport::NativeP2p => Transport::NativeP2p,
        memra_receipts::Transport::Nccl => Transport::Nccl,
    };
    let doors = c
        .doors
        .iter()
        .filter(|(_, on)| **on)
        .map(|(env, _)| registry.by_env(env).map_or_else(|| env.clone(), |d| d.id.clone()))
        .collect();
    Configuration { backend, tp: c.tp, transport, doors }
}

/// `--matrix all` legal configurations per set of backends (the enumeration is the same for
/// every door and every night with the same backends, and it is the expensive part).
#[derive(Default)]
struct ExpectedCache(BTreeMap<Vec<BackendKind>, Result<Vec<Configuration>, String>>);

impl ExpectedCache {
    fn get(&mut self, registry: &Registry, backends: &[BackendKind]) -> &Result<Vec<Configuration>, String> {
        self.0.entry(backends.to_vec()).or_insert_with(|| {
            matrix::enumerate(registry, &MatrixKind::All, &TP_SIZES, &Transport::ALL, backends)
                .map(|plan| plan.legal)
                .map_err(|e| e.to_string())
        })
    }
}

/// Requirements (a) and (b) for one night; returns the number of receipts that counted.
fn check_night(
    registry: &Registry,
    door: &Door,
    night: &NightIndex,
    coverage: Coverage,
    cache: &mut ExpectedCache,
    blockers: &mut Blockers,
) -> usize {
    let at = &night.label;
    if night.backends.is_empty() {
        blockers.push(format!("night {at}: no run receipt (performance receipts only)"));
        return 0;
    }
    let backends = night.backends.iter().map(|b| b.name()).collect::<Vec<_>>().join(", ");
    let mut runs = 0;
    let mut expected: BTreeSet<&Configuration> = BTreeSet::new();
    if coverage == Coverage::Full {
        let legal = match cache.get(registry, &night.backends) {
            Ok(legal) => legal,
            Err(e) => {
                blockers.push(format!("night {at}: cannot enumerate the legal combinations: {e}"));
                return 0;
            }
        };
        expected = legal.iter().filter(|c| c.doors.contains(&door.id)).collect();
        if expected.is_empty() {
            blockers.push(format!(
                "night {at}: no legal combination contains {} on the backend(s) this night ran ({backends})",
                door.id
            ));
        }
        for config in &expected {
            match night.by_config.get(*config) {
                None => blockers.push(format!("night {at}: no receipt for {}", config.label())),
                Some(receipts) => {
                    for r in receipts {
                        runs += 1;
                        check_passed(door, at, config, r, blockers);
                    }
                }
            }
        }
    }
    let mut passed = 0;
    for (config, receipts) in night.by_config.iter().filter(|(c, _)| c.doors.contains(&door.id)) {
        if expected.contains(config) {
            continue;
        }
        for r in receipts {
            match r.evidence.verdict {
                Verdict::NotApplicable => {}
                _ => {
                    runs += 1;
                    if check_passed(door, at, config, r, blockers) {
                        passed += 1;
                    }
                }
            }
        }
    }
    if coverage == Coverage::Ran && passed == 0 {
        blockers.push(format!("night {at}: no PASS receipt contains {} (coverage ran, backends {backends})", door.id));
    }
    runs
}

/// Whether `r` passed with the door engaged; otherwise one blocker naming the night, the
/// configuration and the gate / verdict.
fn check_passed(door: &Door, at: &str, config: &Configuration, r: &Receipt, blockers: &mut Blockers) -> bool {
    let ev = &r.evidence;
    let label = config.label();
    if ev.verdict != Verdict::Pass {
        let why = match ev.gates.iter().find(|g| g.verdict != Verdict::Pass) {
            Some(g) => format!("gate {} {}: {}", g.gate.as_str(), g.verdict, g.detail),
            None => ev.reason.clone().unwrap_or_else(|| "no reason given".to_string()),
        };
        blockers.push(format!("night {at}: {label}: verdict {} ({why}) [run {}]", ev.verdict, r.run_id));
        return false;
    }
    match ev.gates.iter().find(|g| g.gate == ReceiptGate::Engagement) {
        None => {
            blockers.push(format!("night {at}: {label}: no engagement gate in the receipt [run {}]", r.run_id));
            return false;
        }
        Some(g) if g.verdict != Verdict::Pass => {
            blockers
                .push(format!("night {at}: {label}: gate engagement {}: {} [run {}]", g.verdict, g.detail, r.run_id));
            return false;
        }
        Some(_) => {}
    }
    if engaged_count(door, &ev.engaged) == 0 {
        blockers.push(format!(
            "night {at}: {label}: gate engagement PASS but counter {} = 0 (engagement not proven) [run {}]",
            door.engagement, r.run_id
        ));
        return false;
    }
    true
}

/// The door's engagement count: its registry counter, or the receipt format's `MEMRA_X` /
/// `MEMRA_X@seam` keys (and `<counter>@seam`), summed.
fn engaged_count(door: &Door, engaged: &BTreeMap<String, u64>) -> u64 {
    engaged
        .iter()
        .filter(|(k, _)| {
            let name = k.split_once('@').map_or(k.as_str(), |(n, _)| n);
            name == door.engagement || name == door.env
        })
        .fold(0u64, |a, (_, n)| a.saturating_add(*n))
}

/// The configuration whose receipts are a NUMERIC-CLASS door's class baseline on `backend`.
pub fn class_baseline_config(registry: &Registry, door: &Door, backend: BackendKind) -> Configuration {
    let transport = if door.transports.contains(&Transport::HostBounce) {
        Transport::HostBounce
    } else {
        door.transports.allowed.iter().copied().min().unwrap_or(Transport::HostBounce)
    };
    Configuration {
        backend,
        tp: door.tp.allowed.iter().copied().min().unwrap_or(1),
        transport,
        doors: registry.closure_of([door.id.as_str()]),
    }
}

/// Requirement (c): the class baseline is present in every night and unchanged across the window.
fn check_class_baseline(registry: &Registry, door: &Door, window: &[NightIndex], blockers: &mut Blockers) {
    for backend in door.backends.iter().copied() {
        let config = class_baseline_config(registry, door, backend);
        let label = config.label();
        // (night label, receipts by run id) of the first night of the window that ran `backend`.
        let mut reference: Option<(&str, BTreeMap<&str, &Receipt>)> = None;
        for night in window.iter().filter(|n| n.backends.contains(&backend)) {
            let at = &night.label;
            let Some(receipts) = night.by_config.get(&config) else {
                blockers.push(format!("night {at}: no receipt for {label}"));
                continue;
            };
            let these: BTreeMap<&str, &Receipt> = receipts.iter().map(|r| (r.run_id.as_str(), *r)).collect();
            let Some((ref_at, ref_receipts)) = &reference else {
                reference = Some((at, these));
                continue;
            };
            let ids: Vec<&str> = these.keys().copied().collect();
            let ref_ids: Vec<&str> = ref_receipts.keys().copied().collect();
            if ids != ref_ids {
                blockers.push(format!(
                    "night {at}: class baseline {label} ran run(s) {} but night {ref_at} ran {} (model, battery or oracle changed): class baseline not reproduced",
                    ids.join(","),
                    ref_ids.join(",")
                ));
                continue;
            }
            for (id, r) in &these {
                let old = ref_receipts[id];
                if let Some(change) = baseline_change(old, r) {
                    blockers.push(format!(
                        "night {at}: class baseline {label} changed since night {ref_at}: {change} [run {id}]"
                    ));
                }
            }
        }
    }
}

/// How a class-baseline receipt differs from the reference night's, if it does.
fn baseline_change(old: &Receipt, new: &Receipt) -> Option<String> {
    let (o, n) = (&old.evidence, &new.evidence);
    if o.token_tape_digest != n.token_tape_digest {
        return Some(format!("token_tape_digest {} → {}", o.token_tape_digest, n.token_tape_digest));
    }
    if o.digests.columns != n.digests.columns {
        return Some("seam digest columns differ".to_string());
    }
    if o.digests.rows.len() != n.digests.rows.len() {
        return Some(format!("{} → {} seam digest rows", o.digests.rows.len(), n.digests.rows.len()));
    }
    for (a, b) in o.digests.rows.iter().zip(&n.digests.rows) {
        if (a.prompt, a.step) != (b.prompt, b.step) {
            return Some(format!("digest row p{} s{} → p{} s{}", a.prompt, a.step, b.prompt, b.step));
        }
        if let Some(i) = (0..a.digests.len()).find(|&i| a.digests[i] != b.digests[i]) {
            return Some(format!(
                "seam digest {} p{} s{} {} → {}",
                o.digests.columns.get(i).map_or("?", String::as_str),
                a.prompt,
                a.step,
                a.digests[i],
                b.digests[i]
            ));
        }
    }
    None
}
