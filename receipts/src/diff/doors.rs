//! Door-effect changes between two receipt sets (`diff`, docs/DESIGN.md §5 and §7): each door's
//! per-TP summary of the old set against the new one (`effect::door_nights`, METRICS.md, "Door effects"). A
//! (door, backend, TP) whose effect changed is listed; one that was FASTER and is now SAME or
//! SLOWER — a door that **stopped paying**, its interval ruling the old gain out — is a regression
//! on CUDA receipts, and is reported only on host receipts (host latency moves by more than any
//! door's gain; the same policy as a whole-set slowdown in [`super::latency`]). FASTER → AMBIGUOUS
//! is listed as *lost its evidence*, not counted: an interval that straddles ×1.00 says one night
//! was too noisy to tell, and a nightly that fails on noise teaches reviewers to ignore it (seen on
//! the H200, 2026-12-03: GRAPH tp8 ×0.64 → ×0.85 [0.50, 1.45] on two configurations).

use std::collections::BTreeMap;

use serde::Serialize;

use super::latency::NoiseRule;
use crate::effect::{door_effects, door_nights, DoorNight, Effect};
use crate::schema::{Backend, Receipt};

/// One door at one backend and TP size whose effect changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DoorChange {
    pub door: String,
    pub backend: Backend,
    pub tp: usize,
    pub old_effect: Effect,
    pub new_effect: Effect,
    pub old_ratio: f64,
    pub new_ratio: f64,
    pub new_lo: f64,
    pub new_hi: f64,
    /// FASTER before, SAME or SLOWER now (the new interval rules the gain out).
    pub stopped_paying: bool,
    /// FASTER before, AMBIGUOUS now: listed, never counted.
    pub lost_evidence: bool,
    /// Counted as a regression (stopped paying, and the rule counts whole-set moves: CUDA).
    pub regression: bool,
}

impl DoorChange {
    /// `OPROJ_DIRECT cuda tp2: FASTER ×0.82 → SAME ×0.99 [0.96, 1.02]`.
    pub fn one_line(&self) -> String {
        format!(
            "{} {} tp{}: {} ×{:.2} → {} ×{:.2} [{:.2}, {:.2}]{}",
            self.door.strip_prefix("MEMRA_").unwrap_or(&self.door),
            self.backend.as_str(),
            self.tp,
            self.old_effect,
            self.old_ratio,
            self.new_effect,
            self.new_ratio,
            self.new_lo,
            self.new_hi,
            if self.stopped_paying {
                " (stopped paying)"
            } else if self.lost_evidence {
                " (lost its evidence: too noisy to tell)"
            } else {
                ""
            }
        )
    }
}

/// The door-effect changes from `old` to `new` (sorted by door, backend, TP).
pub fn door_changes(old: &[Receipt], new: &[Receipt], rule: &NoiseRule) -> Vec<DoorChange> {
    let key = |n: &DoorNight| (n.door.clone(), n.backend, n.tp);
    let olds: BTreeMap<_, DoorNight> = door_nights(&door_effects(old)).into_iter().map(|n| (key(&n), n)).collect();
    door_nights(&door_effects(new))
        .into_iter()
        .filter_map(|n| {
            let o = olds.get(&key(&n))?;
            if o.effect == n.effect {
                return None;
            }
            let was_faster = o.effect == Effect::Faster;
            let stopped_paying = was_faster && matches!(n.effect, Effect::Same | Effect::Slower);
            let lost_evidence = was_faster && n.effect == Effect::Ambiguous;
            Some(DoorChange {
                door: n.door.clone(),
                backend: n.backend,
                tp: n.tp,
                old_effect: o.effect,
                new_effect: n.effect,
                old_ratio: o.ratio,
                new_ratio: n.ratio,
                new_lo: n.lo,
                new_hi: n.hi,
                stopped_paying,
                lost_evidence,
                regression: stopped_paying && rule.whole_set_counts,
            })
        })
        .collect()
}
