//! The noise interval of a door effect (METRICS.md, "Door effects"): one latency of a configuration against the
//! same latency of its parent configuration, measured in the same night on the same machine, with
//! an interval that says whether the difference is beyond noise. In the spirit of nvbench's
//! `compare.py`: a relative difference within the measurements' own noise is SAME, outside it is
//! FASTER or SLOWER; a difference whose noise is too large to resolve anything is AMBIGUOUS.
//!
//! # The rule
//!
//! A latency is summarised by three sums over the layer × seam entries it covers (the whole step,
//! or one seam over every layer): `MIN = Σ min_ns`, `MED = Σ median_ns`, `P90 = Σ p90_ns`. Its
//! relative spread is `ν = (P90 − MIN) / MED` (0 when `MED` = 0). For a configuration `c` and its
//! parent `p` on backend `b`:
//!
//! - `r = MED(c) / MED(p)` (both at least 1 ns);
//! - `ν = max(ν(c), ν(p), floor(b))`, `floor` = [`HOST_FLOOR`] on the host backend (the spread
//!   between back-to-back host runs, which a run's own spread does not see) and [`CUDA_FLOOR`] on
//!   CUDA (events on a dedicated device);
//! - the interval is `[r / (1 + ν), r · (1 + ν)]`;
//! - **FASTER** when its upper end is below 1, **SLOWER** when its lower end is above 1;
//! - otherwise **SAME** when `ν ≤` [`SAME_MAX_NOISE`] (the interval is narrow enough that "no
//!   difference" means something), else **AMBIGUOUS**;
//! - **AMBIGUOUS** also when either side has fewer than [`MIN_SAMPLES`] timed steps.
//!
//! On the host the floor (0.5) exceeds [`SAME_MAX_NOISE`], so a host comparison is FASTER only
//! below ×0.67, SLOWER only above ×1.5, and AMBIGUOUS otherwise: it never invents a gain from the
//! ×0.72–×1.38 that back-to-back host runs move by.

use serde::{Deserialize, Serialize};

use crate::schema::{Backend, SeamLatency};

/// Noise floor of a host comparison: back-to-back host runs on a shared machine move whole runs by
/// ×0.72–×1.38 (METRICS.md, "diff"), which no run's own spread shows.
pub const HOST_FLOOR: f64 = 0.5;
/// Noise floor of a CUDA comparison (device events on a dedicated device).
pub const CUDA_FLOOR: f64 = 0.03;
/// Largest noise at which a difference inside the interval is called SAME rather than AMBIGUOUS.
pub const SAME_MAX_NOISE: f64 = 0.25;
/// Timed steps each side needs before anything is said.
pub const MIN_SAMPLES: u64 = 3;

/// What a comparison says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Effect {
    /// Faster beyond noise: the whole interval lies below 1.
    Faster,
    /// Within a narrow noise interval around 1.
    Same,
    /// Slower beyond noise: the whole interval lies above 1.
    Slower,
    /// The interval holds 1 and is too wide to say SAME, or too few samples.
    Ambiguous,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Faster => "FASTER",
            Effect::Same => "SAME",
            Effect::Slower => "SLOWER",
            Effect::Ambiguous => "AMBIGUOUS",
        }
    }
}

impl std::fmt::Display for Effect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One latency summarised over a set of layer × seam entries (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub min_ns: u64,
    pub median_ns: u64,
    pub p90_ns: u64,
    /// The fewest timed steps of any entry.
    pub n_samples: u64,
}

impl Span {
    /// The sums over `entries` (`None` when there are none).
    pub fn of<'a>(entries: impl IntoIterator<Item = &'a SeamLatency>) -> Option<Span> {
        let mut s: Option<Span> = None;
        for e in entries {
            let t = s.get_or_insert(Span { n_samples: e.n_samples, ..Span::default() });
            t.min_ns = t.min_ns.saturating_add(e.min_ns);
            t.median_ns = t.median_ns.saturating_add(e.median_ns);
            t.p90_ns = t.p90_ns.saturating_add(e.p90_ns);
            t.n_samples = t.n_samples.min(e.n_samples);
        }
        s
    }

    /// `ν = (P90 − MIN) / MED`.
    pub fn spread(&self) -> f64 {
        if self.median_ns == 0 {
            return 0.0;
        }
        self.p90_ns.saturating_sub(self.min_ns) as f64 / self.median_ns as f64
    }
}

/// A latency against its parent's, with the interval and what it says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Comparison {
    /// `MED` of the configuration, ns.
    pub median_ns: u64,
    /// `MED` of the parent, ns.
    pub parent_median_ns: u64,
    /// `r = MED / parent MED`: below 1 is faster.
    pub ratio: f64,
    /// `ν`, the relative noise used.
    pub noise: f64,
    /// `r / (1 + ν)`.
    pub lo: f64,
    /// `r · (1 + ν)`.
    pub hi: f64,
    pub effect: Effect,
}

/// The noise floor of `backend`.
pub fn floor(backend: Backend) -> f64 {
    match backend {
        Backend::Host => HOST_FLOOR,
        Backend::Cuda => CUDA_FLOOR,
    }
}

/// Compare `c` with its parent `p` under the rule of the module doc.
pub fn compare(c: &Span, p: &Span, backend: Backend) -> Comparison {
    let ratio = c.median_ns.max(1) as f64 / p.median_ns.max(1) as f64;
    let noise = c.spread().max(p.spread()).max(floor(backend));
    let (lo, hi) = (ratio / (1.0 + noise), ratio * (1.0 + noise));
    let effect = if c.n_samples < MIN_SAMPLES || p.n_samples < MIN_SAMPLES {
        Effect::Ambiguous
    } else if hi < 1.0 {
        Effect::Faster
    } else if lo > 1.0 {
        Effect::Slower
    } else if noise <= SAME_MAX_NOISE {
        Effect::Same
    } else {
        Effect::Ambiguous
    };
    Comparison { median_ns: c.median_ns, parent_median_ns: p.median_ns, ratio, noise, lo, hi, effect }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(min: u64, med: u64, p90: u64) -> Span {
        Span { min_ns: min, median_ns: med, p90_ns: p90, n_samples: 20 }
    }

    #[test]
    fn a_gain_beyond_the_spread_is_faster_and_within_it_is_same() {
        let parent = span(990, 1000, 1010);
        let c = compare(&span(790, 800, 810), &parent, Backend::Cuda);
        assert_eq!(c.effect, Effect::Faster, "{c:?}");
        assert!(c.lo < c.ratio && c.ratio < c.hi && c.hi < 1.0);
        let c = compare(&span(985, 995, 1005), &parent, Backend::Cuda);
        assert_eq!(c.effect, Effect::Same, "{c:?}");
        let c = compare(&span(1190, 1200, 1210), &parent, Backend::Cuda);
        assert_eq!(c.effect, Effect::Slower, "{c:?}");
    }

    #[test]
    fn a_wide_spread_makes_a_small_gain_ambiguous_not_faster() {
        // The same 20% gain with samples spread over ±30% of the median says nothing.
        let c = compare(&span(560, 800, 1040), &span(700, 1000, 1300), Backend::Cuda);
        assert_eq!(c.effect, Effect::Ambiguous, "{c:?}");
    }

    #[test]
    fn the_host_floor_never_calls_a_modest_host_gain_faster() {
        let c = compare(&span(795, 800, 805), &span(995, 1000, 1005), Backend::Host);
        assert_eq!(c.noise, HOST_FLOOR);
        assert_eq!(c.effect, Effect::Ambiguous, "{c:?}");
        // Beyond the floor the host does say it.
        let c = compare(&span(595, 600, 605), &span(995, 1000, 1005), Backend::Host);
        assert_eq!(c.effect, Effect::Faster, "{c:?}");
    }

    #[test]
    fn too_few_samples_is_ambiguous() {
        let mut few = span(390, 400, 410);
        few.n_samples = MIN_SAMPLES - 1;
        assert_eq!(compare(&few, &span(990, 1000, 1010), Backend::Cuda).effect, Effect::Ambiguous);
    }
}
