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
//! - **(d) gain.** Exactness is necessary, not sufficient: the door must pay, in at least
//!   `gain_nights` nights of the window (default two thirds, rounded up: 5 of 7), at every TP size
//!   it allows that the night ran with it — faster beyond noise than the same configurations
//!   without it (its parent sets, same night, same machine: METRICS.md, "Door effects"), or, for a door that
//!   declares a `benefit` in the registry, that saving in every comparison ([`gain`] states the
//!   rule). A door that meets (a)–(c) but not (d) is **exact, no gain**: never promoted silently.
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
//! form to commit. The history (`history`: nights, their identity, duplicates and models) and the
//! report (`report`) have modules of their own.

pub mod gain;
mod history;
mod report;

pub use history::{load_history, utc_date, History, Night};
pub use report::{DoorRow, DoorStatus, PromotionReport};

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use memra_receipts::{Gate as ReceiptGate, Receipt, ReceiptError, ReceiptKind, Verdict};
use memra_runtime::config::Transport;

use crate::matrix::{self, Configuration, MatrixKind};
use crate::registry::{BackendKind, Door, DoorClass, Registry, TP_SIZES};

/// How many of the latest nights a door must hold in (docs/DESIGN.md §7).
pub const DEFAULT_NIGHTS: usize = 7;

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

/// The promotion policy: how many nights, which coverage, and how many nights must pay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub n_last: usize,
    pub coverage: Coverage,
    /// Nights of the window that must pay (requirement (d)); `None`:
    /// [`gain::default_gain_nights`] of `n_last`.
    pub gain_nights: Option<usize>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { n_last: DEFAULT_NIGHTS, coverage: Coverage::Full, gain_nights: None }
    }
}

impl Policy {
    /// A checked policy: at least one night (zero nights would promote every door on no evidence).
    pub fn new(n_last: usize, coverage: Coverage) -> Result<Policy, PromoteError> {
        if n_last == 0 {
            return Err(zero_nights());
        }
        Ok(Policy { n_last, coverage, gain_nights: None })
    }

    /// This policy with `k` nights that must pay: 1 ≤ k ≤ `n_last`.
    pub fn with_gain_nights(self, k: usize) -> Result<Policy, PromoteError> {
        if k == 0 || k > self.n_last {
            return Err(PromoteError::Policy {
                thing: "--gain-nights".to_string(),
                value: k.to_string(),
                rule: format!(
                    "between 1 and --nights ({}): 0 would promote a door that never paid, more than the window can never be met",
                    self.n_last
                ),
            });
        }
        Ok(Policy { gain_nights: Some(k), ..self })
    }

    /// The nights that must pay.
    pub fn needed_gain_nights(&self) -> usize {
        self.gain_nights.unwrap_or_else(|| gain::default_gain_nights(self.n_last))
    }
}

pub(crate) fn zero_nights() -> PromoteError {
    PromoteError::Policy {
        thing: "--nights".to_string(),
        value: "0".to_string(),
        rule: "at least 1 night is required; 0 would promote every door on no evidence".to_string(),
    }
}

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
    /// A night whose run receipts are of several models: a night is one model's evidence.
    #[error("night {}: holds receipts of {} models ({}); keep each model's receipts in its own directory", .dir.display(), .models.len(), .models.join(", "))]
    MixedModels { dir: PathBuf, models: Vec<String> },
    /// Nights of different models in one history: promotion judges one model's nights.
    #[error("the history mixes models: {first} in night {} and {second} in night {}; promote each model's history separately", .first_dir.display(), .second_dir.display())]
    ModelChanged { first: String, first_dir: PathBuf, second: String, second_dir: PathBuf },
    /// The registry's rewrite refused the new defaults.
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
}

/// [`promote_with`] under docs/DESIGN.md §7's full coverage.
pub fn promote(registry: &Registry, nights: &[Night], n_last: usize) -> PromotionReport {
    promote_with(registry, nights, Policy { n_last, coverage: Coverage::Full, gain_nights: None })
}

/// Decide every door of `registry` over the last `policy.n_last` of `nights` (sorted by date
/// here, as [`load_history`] sorts them). A policy of 0 nights blocks every door.
pub fn promote_with(registry: &Registry, nights: &[Night], policy: Policy) -> PromotionReport {
    let mut sorted: Vec<&Night> = nights.iter().collect();
    sorted.sort_by(|a, b| history::night_order(a, b));
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
        gain: String::new(),
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
    // Last, so a night's evidence stays the first blocker. A default-on door must run in the oracle's configuration (the registry refuses it otherwise).
    if !door.tp.contains(&1) || !door.transports.contains(&memra_runtime::config::Transport::HostBounce) {
        blockers.push(format!(
            "{} cannot be default-on: it does not run in the oracle's configuration, TP1 host-bounce (its `tp` and \
             `transports` rules)",
            door.id
        ));
    }

    let nights: Vec<_> = window.iter().map(|n| (n.label.clone(), n.required_sizes(door), &n.gain)).collect();
    let gain = gain::check_gain(door, &nights, policy.needed_gain_nights());
    let mut decided = if !blockers.0.is_empty() {
        let evidence = blockers.summary();
        row(DoorStatus::Blocked, evidence, blockers.0, runs)
    } else if !gain.gains() {
        let evidence = format!(
            "exact over {} nights, {runs} runs; no gain: {} of the {} night(s) needed paid",
            window.len(),
            gain.paying,
            gain.needed
        );
        row(DoorStatus::ExactNoGain, evidence, vec![], runs)
    } else {
        let baseline = if door.class == DoorClass::Numeric { ", class baseline unchanged" } else { "" };
        row(DoorStatus::Promotable, format!("passed {} nights, {runs} runs{baseline}", window.len()), vec![], runs)
    };
    decided.gain = gain.summary;
    decided
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

    /// The first finding, and what the rest are by kind: `… (and 1998 more: 1990 configurations
    /// without a receipt, 8 runs not PASS)`. Every finding stays in the row's `blockers`.
    fn summary(&self) -> String {
        let first = self.0[0].clone();
        if self.0.len() == 1 {
            return first;
        }
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for b in &self.0[1..] {
            *kinds.entry(blocker_kind(b)).or_insert(0) += 1;
        }
        let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        format!("{first} (and {} more: {})", self.0.len() - 1, parts.join(", "))
    }
}

/// What kind of finding a blocker is, for the summary (the texts are made in this module).
fn blocker_kind(b: &str) -> &'static str {
    if b.contains("class baseline") {
        "class-baseline findings"
    } else if b.contains(": no receipt for ") {
        "configurations without a receipt"
    } else if b.contains(": verdict ") {
        "runs not PASS"
    } else if b.contains("engagement") {
        "runs without proven engagement"
    } else if b.contains("nights") {
        "findings about the window"
    } else {
        "other findings"
    }
}

/// One night's run receipts by configuration, and its door effects.
struct NightIndex<'n> {
    label: String,
    backends: Vec<BackendKind>,
    by_config: BTreeMap<Configuration, Vec<&'n Receipt>>,
    gain: gain::NightGain<'n>,
}

impl<'n> NightIndex<'n> {
    fn new(registry: &Registry, night: &'n Night) -> NightIndex<'n> {
        let mut by_config: BTreeMap<Configuration, Vec<&Receipt>> = BTreeMap::new();
        let mut backends = BTreeSet::new();
        for r in night.receipts.iter().filter(|r| r.kind == ReceiptKind::Run) {
            let c = crate::receipt::configuration_of(registry, r);
            backends.insert(c.backend);
            by_config.entry(c).or_default().push(r);
        }
        let gain = gain::NightGain::new(&night.receipts);
        NightIndex { label: night.label.clone(), backends: backends.into_iter().collect(), by_config, gain }
    }

    /// Requirement (d)'s sizes: (backend, TP) with a PASS receipt containing the door at a TP
    /// size the door allows.
    fn required_sizes(&self, door: &Door) -> BTreeSet<(memra_receipts::Backend, usize)> {
        self.by_config
            .iter()
            .filter(|(c, _)| c.doors.contains(&door.id) && door.tp.allowed.contains(&c.tp))
            .flat_map(|(_, rs)| rs.iter())
            .filter(|r| r.evidence.verdict == Verdict::Pass)
            .map(|r| (r.evidence.config.backend, r.evidence.config.tp))
            .collect()
    }
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
    Configuration::single(
        backend,
        door.tp.allowed.iter().copied().min().unwrap_or(1),
        transport,
        registry.closure_of([door.id.as_str()]),
    )
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
