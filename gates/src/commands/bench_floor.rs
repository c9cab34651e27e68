//! The memory floor of a pass of several rows or columns (METRICS.md, "bench", "pass floor").
//!
//! A pass of B rows (or T columns) reads each dense weight once (q, k, v, gate, o, router), the
//! shared expert once, and each DISTINCT routed expert its lanes selected once: with 288 experts
//! top-8, eight rows select about 58 distinct experts, so the pass floor lies far above one
//! token's floor and below B times it. Which experts a pass selected is read from the routes the
//! measured run took: the battery is run once more on the same weights with every router seam
//! captured, and its router digests must equal the measured run's seam for seam (so the routes
//! counted are the measured ones).

use super::bench::LayerBytes;
use crate::error::GateError;
use memra_runtime::backend::Backend;
use memra_runtime::model::Model;
use memra_runtime::program::Prepared;
use memra_runtime::record::{CaptureKey, Record, Seam};
use memra_runtime::{RunConfig, RuntimeError, Timing};
use std::collections::{BTreeMap, BTreeSet};

/// What each timed pass of the measured run selected, per layer.
#[derive(Debug, Clone, Default)]
pub struct PassRoutes {
    /// `distinct[l][i]`: distinct routed experts of layer `l` in the i-th timed pass.
    pub distinct: Vec<Vec<usize>>,
    /// Live lanes of the i-th timed pass.
    pub lanes: Vec<usize>,
    /// Routed experts each lane selects (`top_k`) and routed experts in all.
    pub top_k: usize,
    pub experts: usize,
}

/// The routes of `measured` (a run of `cfg` on `prepared`): the passes from `warmup` on, the
/// ones its latency medians cover.
pub fn routes(
    model: &Model,
    cfg: &RunConfig,
    b: &mut dyn Backend,
    prepared: &Prepared,
    measured: &Record,
    warmup: usize,
) -> Result<PassRoutes, GateError> {
    let (n_layers, k) = (model.layers.len(), model.config.top_k);
    let mut cfg = cfg.clone();
    cfg.timing = Timing::Off;
    cfg.capture = (0..cfg.battery.prompts.len())
        .flat_map(|prompt| {
            let steps = measured.digests.get(prompt).map_or(0, |d| d.len());
            (0..steps).flat_map(move |step| {
                (0..n_layers).map(move |layer| CaptureKey { prompt, step, layer, seam: Seam::Router })
            })
        })
        .collect();
    let r = memra_runtime::program::run_prepared(model, &cfg, b, prepared)?;
    let mut by_pass: BTreeMap<u32, (usize, Vec<BTreeSet<u32>>)> = BTreeMap::new();
    for key in &cfg.capture {
        let at = Record::seam_index(n_layers, key.layer, Seam::Router);
        let digest = |rec: &Record| rec.digests.get(key.prompt).and_then(|d| d.get(key.step)).map(|row| row[at]);
        if digest(&r) != digest(measured) {
            return Err(RuntimeError::Contract(format!(
                "the route run's router digest at prompt {} step {} layer {} is {:?}, the measured run's {:?}: \
                 the routes counted would not be the measured run's (the program must be deterministic)",
                key.prompt,
                key.step,
                key.layer,
                digest(&r),
                digest(measured)
            ))
            .into());
        }
        let (Some(cap), Some(&(pass, _))) =
            (r.captures.get(key), r.lanes.get(key.prompt).and_then(|l| l.get(key.step)))
        else {
            return Err(RuntimeError::Contract(format!(
                "the route run has no router capture or lane for prompt {} step {} layer {}",
                key.prompt, key.step, key.layer
            ))
            .into());
        };
        let entry = by_pass.entry(pass).or_insert_with(|| (0, vec![BTreeSet::new(); n_layers]));
        if key.layer == 0 {
            entry.0 += 1;
        }
        entry.1[key.layer].extend(cap.bits[..k].iter().copied());
    }
    let timed: Vec<&(usize, Vec<BTreeSet<u32>>)> =
        by_pass.iter().filter(|(p, _)| **p as usize >= warmup).map(|(_, v)| v).collect();
    Ok(PassRoutes {
        distinct: (0..n_layers).map(|l| timed.iter().map(|(_, sets)| sets[l].len()).collect()).collect(),
        lanes: timed.iter().map(|(n, _)| *n).collect(),
        top_k: k,
        experts: model.config.experts,
    })
}

/// The lower median (None when empty).
pub fn lower_median<T: Ord + Copy>(mut v: Vec<T>) -> Option<T> {
    v.sort_unstable();
    v.get(v.len().checked_sub(1)? / 2).copied()
}

impl PassRoutes {
    /// Layer `l`'s median (lower) distinct routed experts per timed pass: the receipt's
    /// `L<l>.distinct_experts`, and what the PyTorch anchor is asked to read (`--distinct`).
    pub fn median_distinct(&self, l: usize) -> Option<usize> {
        self.distinct.get(l).and_then(|d| lower_median(d.clone()))
    }

    /// Bytes layer `l` must read in the i-th timed pass: dense weights once, each distinct routed
    /// expert once, the shared expert once, and the K/V of each row's session (one session for
    /// columns).
    pub fn pass_bytes(&self, bytes: &LayerBytes, l: usize, i: usize, rows: bool) -> u64 {
        let sessions = if rows { self.lanes[i] as u64 } else { 1 };
        bytes.qkv
            + bytes.o_proj
            + bytes.router
            + self.distinct[l][i] as u64 * bytes.routed_one
            + bytes.shared
            + bytes.kv * sessions
    }
}

/// The per-token lines of a run of `lanes` lanes per pass, and their ratios for the receipt:
/// `L<l>.layer_per_token_us`, `L<l>.layer_gated_per_token_us` (where `gated_ns` has layer `l`),
/// `L<l>.distinct_experts` and, with a bandwidth, `L<l>.pass_floor_us` and
/// `L<l>.layer_over_pass_floor` (METRICS.md, "bench"). `layers` carries the seam-timed run's
/// layer (the sum of its seams, each seam's event pair included); `gated_ns` the gated whole
/// layer of each layer (one mark pair: what a gate run's pass costs), which the seam events
/// inflate by their own cost — so both are printed.
pub fn per_token(
    label: &str,
    lanes: usize,
    rows_shape: bool,
    layers: &[(usize, LayerBytes, u64)],
    gated_ns: &[u64],
    routes: &PassRoutes,
    bandwidth: Option<f64>,
) -> (Vec<String>, BTreeMap<String, f64>) {
    let mut lines = vec![format!(
        "per token ({label}: per-pass layer latency ÷ {lanes}, the seam-timed run; the gated whole layer in brackets):"
    )];
    let mut ratios = BTreeMap::new();
    for (l, bytes, layer_ns) in layers {
        let l = *l;
        let per_token_us = *layer_ns as f64 / 1e3 / lanes as f64;
        ratios.insert(format!("L{l}.layer_per_token_us"), per_token_us);
        let mut line = format!("  L{l}: {per_token_us:.1} µs per token");
        if let Some(&g) = gated_ns.get(l) {
            let gated_us = g as f64 / 1e3 / lanes as f64;
            ratios.insert(format!("L{l}.layer_gated_per_token_us"), gated_us);
            line += &format!(" (gated {gated_us:.1})");
        }
        if let Some(bw) = bandwidth {
            line += &format!(", {:.2}× the one-token floor", per_token_us / (bytes.total() as f64 / bw * 1e6));
        }
        let Some(distinct) = routes.median_distinct(l) else {
            lines.push(line);
            continue;
        };
        ratios.insert(format!("L{l}.distinct_experts"), distinct as f64);
        let pass_bytes =
            lower_median((0..routes.lanes.len()).map(|i| routes.pass_bytes(bytes, l, i, rows_shape)).collect());
        if let (Some(bw), Some(pb)) = (bandwidth, pass_bytes) {
            let floor_us = pb as f64 / bw * 1e6;
            let over = *layer_ns as f64 / 1e3 / floor_us;
            ratios.insert(format!("L{l}.pass_floor_us"), floor_us);
            ratios.insert(format!("L{l}.layer_over_pass_floor"), over);
            line += &format!(
                ", {over:.2}× the pass floor ({floor_us:.1} µs per pass, {:.1} µs per token)",
                floor_us / lanes as f64
            );
        }
        line += &format!(
            "; {distinct} distinct routed experts per pass (median; {} per lane × {lanes} lanes = {}, of {})",
            routes.top_k,
            routes.top_k * lanes,
            routes.experts
        );
        lines.push(line);
    }
    (lines, ratios)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes() -> LayerBytes {
        let (routed_one, shared) = (400, 300);
        LayerBytes { qkv: 1000, o_proj: 500, router: 100, experts: 2 * routed_one + shared, routed_one, shared, kv: 50 }
    }

    #[test]
    fn the_pass_floor_lies_between_one_token_and_b_tokens_and_grows_with_distinct_experts() {
        let b = bytes();
        let routes =
            PassRoutes { distinct: vec![vec![3, 5, 4], vec![2, 2, 2]], lanes: vec![4, 4, 4], top_k: 2, experts: 8 };
        let layers = vec![(0, b.clone(), 4000), (1, b.clone(), 4000)];
        let (lines, r) = per_token("b4", 4, true, &layers, &[3600, 3200], &routes, Some(1e9));
        assert_eq!(r["L0.distinct_experts"], 4.0);
        // The gated whole layer per token beside the seam-timed one (each its own layer's).
        assert_eq!((r["L0.layer_per_token_us"], r["L0.layer_gated_per_token_us"]), (1.0, 0.9));
        assert_eq!(r["L1.layer_gated_per_token_us"], 0.8);
        assert!(lines[1].starts_with("  L0: 1.0 µs per token (gated 0.9)"), "{lines:?}");
        let one_token_us = b.total() as f64 / 1e9 * 1e6;
        for l in 0..2 {
            let f = r[&format!("L{l}.pass_floor_us")];
            assert!(one_token_us < f && f < 4.0 * one_token_us, "L{l}: {f} against {one_token_us}\n{lines:?}");
            assert_eq!(r[&format!("L{l}.layer_over_pass_floor")], 4.0 / f);
        }
        // Layer 1's rows all chose the same two experts: its pass reads fewer bytes than layer 0's.
        assert!(r["L1.pass_floor_us"] < r["L0.pass_floor_us"]);
        assert_eq!(routes.pass_bytes(&b, 0, 2, true) - routes.pass_bytes(&b, 1, 2, true), (4 - 2) * b.routed_one);
        // Columns: one session, its K/V once.
        assert_eq!(routes.pass_bytes(&b, 0, 0, true) - routes.pass_bytes(&b, 0, 0, false), 3 * b.kv);
        assert!(lines.iter().any(|l| l.contains("4 distinct routed experts")), "{lines:?}");
        // Without a bandwidth (the host backend) the count is still recorded, no floor.
        let (_, r) = per_token("b4", 4, true, &layers, &[], &routes, None);
        assert!(r.contains_key("L0.distinct_experts") && !r.contains_key("L0.pass_floor_us"));
        assert!(!r.contains_key("L0.layer_gated_per_token_us"), "no gated run, no gated figure");
    }
}
