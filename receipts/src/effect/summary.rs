//! A door's effect at one TP size in one night (METRICS.md, "Door effects"): the door's comparisons there —
//! every configuration containing it at that TP size, on every transport, against its parent —
//! summed up into one ratio and interval. This is what the door chart plots, what `promote` asks to
//! be FASTER, and what `diff` compares between nights.
//!
//! Over the `n` comparisons of the door at (backend, TP) whose configuration and parent both
//! PASSed: `ratio`, `lo`, `hi` and `noise` are the medians of theirs (the geometric mean of the two
//! middle values for an even `n`), and `effect` applies the rule's verdict to them: FASTER when
//! `hi < 1`, SLOWER when `lo > 1`, else SAME when `noise ≤ SAME_MAX_NOISE`, else AMBIGUOUS; with no
//! comparison left, no entry. `counts` tallies the comparisons' own effects.

use std::collections::BTreeMap;

use serde::Serialize;

use super::rule::{Effect, SAME_MAX_NOISE};
use super::DoorEffects;
use crate::schema::{Backend, Verdict};

/// One door at one backend and TP size in one night.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DoorNight {
    pub door: String,
    pub backend: Backend,
    pub tp: usize,
    /// Comparisons whose configuration and parent both passed.
    pub n: usize,
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
    pub noise: f64,
    pub effect: Effect,
    /// The comparisons' own effects: FASTER, SAME, SLOWER, AMBIGUOUS.
    pub counts: [usize; 4],
}

impl DoorNight {
    /// `×0.82 [0.79, 0.85] FASTER (4 configs)`.
    pub fn one_line(&self) -> String {
        format!("×{:.2} [{:.2}, {:.2}] {} ({} config(s))", self.ratio, self.lo, self.hi, self.effect, self.n)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 1.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] * v[n / 2]).sqrt(),
    }
}

fn slot(e: Effect) -> usize {
    match e {
        Effect::Faster => 0,
        Effect::Same => 1,
        Effect::Slower => 2,
        Effect::Ambiguous => 3,
    }
}

/// Every (door, backend, TP) of a night's effects, sorted by door, backend, TP. Comparisons where
/// either side did not PASS are left out (a failed run's timing measures a wrong program), and so
/// is a (door, backend, TP) with none left: no evidence, not a verdict.
pub fn door_nights(effects: &DoorEffects) -> Vec<DoorNight> {
    let mut by: BTreeMap<(&str, Backend, usize), Vec<&super::DoorEffect>> = BTreeMap::new();
    for e in &effects.effects {
        let list = by.entry((e.door.as_str(), e.backend, e.tp)).or_default();
        if e.verdict == Verdict::Pass && e.parent_verdict == Verdict::Pass {
            list.push(e);
        }
    }
    by.into_iter()
        .filter(|(_, list)| !list.is_empty())
        .map(|((door, backend, tp), list)| {
            let mut counts = [0; 4];
            for e in &list {
                counts[slot(e.step.effect)] += 1;
            }
            let n = list.len();
            let pick = |f: fn(&super::DoorEffect) -> f64| median(list.iter().map(|e| f(e)).collect());
            let (ratio, lo, hi, noise) =
                (pick(|e| e.step.ratio), pick(|e| e.step.lo), pick(|e| e.step.hi), pick(|e| e.step.noise));
            let effect = if hi < 1.0 {
                Effect::Faster
            } else if lo > 1.0 {
                Effect::Slower
            } else if noise <= SAME_MAX_NOISE {
                Effect::Same
            } else {
                Effect::Ambiguous
            };
            DoorNight { door: door.to_string(), backend, tp, n, ratio, lo, hi, noise, effect, counts }
        })
        .collect()
}
