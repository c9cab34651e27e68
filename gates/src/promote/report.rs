//! The promotion report: one row per door with its status and first blocking evidence, the
//! defaults block to commit, and the registry rewritten with the new defaults (through the
//! registry's own file module, the one writer of doors.toml).

use std::collections::BTreeSet;

use tabled::builder::Builder;
use tabled::settings::Style;

use super::{Policy, PromoteError};
use crate::registry::file::{defaults_block, set_defaults_on, DefaultEntry};
use crate::registry::{DoorClass, Registry};

/// Where a door stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorStatus {
    /// Every requirement held in each of the last N nights.
    Promotable,
    /// Some requirement did not hold; `evidence` names the first blocking receipt.
    Blocked,
    /// Exact over the window (requirements (a)–(c)) but it did not pay often enough (d).
    ExactNoGain,
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
            DoorStatus::ExactNoGain => "exact, no gain",
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
    /// Requirement (d): in how many nights the door paid, and what the last night showed per TP
    /// size (`faster beyond noise in 6 of 7 night(s) (needs 5); last night: cuda tp2 ×0.81 …`);
    /// empty for doors not evaluated.
    pub gain: String,
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

    /// One row per door: id, env, class, status, evidence, performance (requirement (d)).
    pub fn to_table(&self) -> String {
        let mut b = Builder::default();
        b.push_record(["door", "env", "class", "status", "evidence", "performance"]);
        for r in &self.rows {
            b.push_record([
                r.id.clone(),
                r.env.clone(),
                r.class.name().to_string(),
                r.status.name().to_string(),
                r.evidence.clone(),
                r.gain.clone(),
            ]);
        }
        let mut t = b.build();
        t.with(Style::sharp());
        let window = if self.window.is_empty() { "(no nights)".to_string() } else { self.window.join(", ") };
        format!(
            "promotion over the last {} night(s), coverage {}, gain in {} night(s): {window}\n{t}\n{} of {} door(s) promotable\n",
            self.policy.n_last,
            self.policy.coverage.name(),
            self.policy.needed_gain_nights(),
            self.promotable().len(),
            self.rows.len()
        )
    }

    /// The new default of every non-canary door of `registry` (promotable or already default →
    /// `true`), as the registry format's defaults block keyed by environment variable, with the
    /// evidence as a comment. Doors the report has no row for keep their registry default.
    pub fn defaults_toml(&self, registry: &Registry) -> String {
        let header = [
            format!(
                "New door defaults from `memra-gates promote` (last {} night(s), coverage {}).",
                self.policy.n_last,
                self.policy.coverage.name()
            ),
            format!("Each value is the `default` of that door's [[door]] entry in {}.", registry.origin()),
        ];
        let entries: Vec<DefaultEntry> = registry
            .doors()
            .iter()
            .filter(|d| !d.is_canary())
            .map(|d| {
                let (on, why) = match self.row(&d.id) {
                    Some(r) if r.status == DoorStatus::Promotable => (true, format!("promoted: {}", r.evidence)),
                    Some(r) if r.status == DoorStatus::AlreadyDefault => (true, "already default".to_string()),
                    Some(r) => (false, format!("not promoted: {}", one_line(&r.evidence))),
                    None => (d.default, "not evaluated".to_string()),
                };
                DefaultEntry { env: d.env.clone(), on, why }
            })
            .collect();
        defaults_block(&header, &entries)
    }

    /// `text` (a `doors.toml` of the same doors) with `default = false` replaced by
    /// `default = true` in the `[[door]]` entry of every promotable door; everything else is kept
    /// byte for byte (the registry's own writer, `registry::file::set_defaults_on`).
    pub fn apply_to_registry_text(&self, text: &str, origin: &str) -> Result<String, PromoteError> {
        let promote: BTreeSet<&str> = self.promotable().into_iter().collect();
        Ok(set_defaults_on(text, origin, &promote)?)
    }
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}
