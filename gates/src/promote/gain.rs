//! Requirement (d) of promotion (docs/DESIGN.md §7): the door pays. Exactness is necessary, not
//! sufficient: a door stays default-off until repeated performance evidence qualifies it.
//!
//! # The rule
//!
//! In one night, the door's **required sizes** are the (backend, TP size) pairs, TP allowed by
//! the door, at which the night holds a PASS run receipt containing the door. The night **pays**
//! when it has at least one required size and, at every one of them:
//!
//! - a speed door (no `benefit` in the registry): the door's summary at that size
//!   ([`memra_receipts::effect::DoorNight`]: the medians of the step-latency ratio and interval of
//!   every configuration containing the door against its parent, same night) is FASTER;
//! - a door that declares `benefit = { saves, counter }`: at least one comparison exists there, and
//!   in every one of them (both sides PASS) the census counter is lower with the door than in the
//!   parent.
//!
//! The door **gains** when at least `gain_nights` nights of the window pay (default
//! [`default_gain_nights`]: two thirds of the window, rounded up — 5 of 7 — so one noisy night
//! cannot block a door and one lucky night cannot promote it).

use std::collections::{BTreeMap, BTreeSet};

use memra_receipts::effect::{door_effects, door_nights, DoorEffects, DoorNight, Effect};
use memra_receipts::{Backend, Receipt, Verdict};

use crate::registry::Door;

/// `⌈2N/3⌉`: the nights of a window of `n` that must pay.
pub fn default_gain_nights(n: usize) -> usize {
    (2 * n).div_ceil(3)
}

/// One night's door effects, computed once for every door.
pub(super) struct NightGain<'n> {
    pub effects: DoorEffects,
    pub summaries: Vec<DoorNight>,
    pub by_run: BTreeMap<&'n str, &'n Receipt>,
}

impl<'n> NightGain<'n> {
    pub fn new(receipts: &'n [Receipt]) -> NightGain<'n> {
        let effects = door_effects(receipts);
        let summaries = door_nights(&effects);
        NightGain { effects, summaries, by_run: receipts.iter().map(|r| (r.run_id.as_str(), r)).collect() }
    }
}

/// What the window says about a door's gain.
pub(super) struct GainOutcome {
    pub paying: usize,
    pub needed: usize,
    /// `faster in 6 of 7 nights (needs 5): tp2 ×0.81, tp4 ×0.77` — the column of the table.
    pub summary: String,
}

impl GainOutcome {
    pub fn gains(&self) -> bool {
        self.paying >= self.needed
    }
}

fn backend_name(b: Backend) -> &'static str {
    b.as_str()
}

/// The (backend, TP) sizes a night requires of a door.
pub(super) type Sizes = BTreeSet<(Backend, usize)>;

/// Requirement (d) over the window: per night its label, its required sizes and its effects.
pub(super) fn check_gain(door: &Door, nights: &[(String, Sizes, &NightGain)], needed: usize) -> GainOutcome {
    let mut paying = 0;
    let mut last: Option<String> = None;
    let mut first_short: Option<String> = None;
    for (label, required, gain) in nights {
        let (pays, what) = night_pays(door, required, gain);
        if pays {
            paying += 1;
        } else if first_short.is_none() {
            first_short = Some(format!("night {label}: {what}"));
        }
        last = Some(what);
    }
    let verb = match &door.benefit {
        Some(b) => format!("{} saved", b.saves.name()),
        None => "faster beyond noise".to_string(),
    };
    let mut summary = format!("{verb} in {paying} of {} night(s) (needs {needed})", nights.len());
    if let Some(l) = last {
        summary.push_str(&format!("; last night: {l}"));
    }
    if paying < needed {
        if let Some(f) = first_short {
            summary.push_str(&format!("; first short: {f}"));
        }
    }
    GainOutcome { paying, needed, summary }
}

/// Whether one night pays, and what it showed at each required size.
fn night_pays(door: &Door, required: &Sizes, gain: &NightGain) -> (bool, String) {
    if required.is_empty() {
        return (false, "no PASS configuration contains the door".to_string());
    }
    let mut pays = true;
    let mut parts = Vec::new();
    for &(backend, tp) in required {
        let at = format!("{} tp{tp}", backend_name(backend));
        let (ok, what) = match &door.benefit {
            None => match gain.summaries.iter().find(|s| s.door == door.env && s.backend == backend && s.tp == tp) {
                Some(s) => (s.effect == Effect::Faster, s.one_line()),
                None => (false, "no parent configuration to compare with".to_string()),
            },
            Some(benefit) => {
                let pairs: Vec<(u64, u64)> = gain
                    .effects
                    .effects
                    .iter()
                    .filter(|e| e.door == door.env && e.backend == backend && e.tp == tp)
                    .filter(|e| e.verdict == Verdict::Pass && e.parent_verdict == Verdict::Pass)
                    .filter_map(|e| {
                        let (c, p) = (gain.by_run.get(e.run_id.as_str())?, gain.by_run.get(e.parent_run_id.as_str())?);
                        Some((benefit.value(&c.evidence.census), benefit.value(&p.evidence.census)))
                    })
                    .collect();
                let saved = pairs.iter().filter(|(on, off)| on < off).count();
                let ok = !pairs.is_empty() && saved == pairs.len();
                (ok, format!("{} lower in {saved} of {} comparison(s)", benefit.counter, pairs.len()))
            }
        };
        pays &= ok;
        parts.push(format!("{at} {what}"));
    }
    (pays, parts.join(", "))
}
