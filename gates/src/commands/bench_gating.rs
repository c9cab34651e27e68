//! What gating costs (docs/DESIGN.md §8: gate overhead ≤ 5 %): the same decode, in the same process,
//! timed per whole layer with the seam digests on and off, and with per-seam timing events.
//!
//! `bench` reports per-seam latencies from a run with seam events (the table users see); the
//! events and the digests themselves cost device time, so the layer's real cost is measured here
//! with one mark pair around each layer only: `gated` (digests on, what a gate run computes) and
//! `ungated` (digests off, the bare program). The overhead ratio is gated ÷ ungated − 1. All three
//! runs share one backend and one upload of the weights (`program::prepare`).

use memra_runtime::backend::Backend;
use memra_runtime::model::Model;
use memra_runtime::program::Prepared;
use memra_runtime::record::Record;
use memra_runtime::{RunConfig, Timing};
use std::collections::BTreeMap;

/// Median whole-layer latencies (ns) per layer of the three timing runs.
#[derive(Debug, Clone, Default)]
pub struct GatingCost {
    /// Digests on, per-seam events on (the `bench` table's run).
    pub seams: Vec<u64>,
    /// Digests on, one mark pair per layer.
    pub gated: Vec<u64>,
    /// Digests off, one mark pair per layer.
    pub ungated: Vec<u64>,
}

fn median(mut v: Vec<u64>) -> Option<u64> {
    v.sort_unstable();
    v.get(v.len().checked_sub(1)? / 2).copied()
}

/// Median over the timed steps of every layer's whole-layer samples (head excluded).
pub fn layer_medians(r: &Record, warmup: usize) -> Vec<u64> {
    (0..r.n_layers)
        .map(|l| {
            median(r.layer_timings_ns.get(l).map(|s| s.iter().skip(warmup).copied().collect()).unwrap_or_default())
                .unwrap_or(0)
        })
        .collect()
}

/// The gated and ungated runs: `cfg` (the seam-timed run's configuration) with one mark pair
/// per layer, digests on and off, on the same backend and prepared weights.
pub fn measure(
    model: &Model,
    cfg: &RunConfig,
    b: &mut dyn Backend,
    prepared: &Prepared,
    warmup: usize,
    seams_run: &Record,
) -> memra_runtime::Result<GatingCost> {
    let mut cost = GatingCost { seams: layer_medians(seams_run, warmup), ..GatingCost::default() };
    for digests in [true, false] {
        let mut cfg = cfg.clone();
        (cfg.timing, cfg.digests) = (Timing::Layers, digests);
        let r = memra_runtime::program::run_prepared(model, &cfg, b, prepared)?;
        let m = layer_medians(&r, warmup);
        if digests {
            cost.gated = m;
        } else {
            cost.ungated = m;
        }
    }
    Ok(cost)
}

impl GatingCost {
    /// gated ÷ ungated − 1 over the sum of the layers (None without samples).
    pub fn overhead(&self) -> Option<f64> {
        let (g, u): (u64, u64) = (self.gated.iter().sum(), self.ungated.iter().sum());
        (u > 0).then(|| g as f64 / u as f64 - 1.0)
    }

    /// The receipt's ratios: per layer gated/ungated and seams/ungated, ungated over the floor,
    /// gated and ungated over PyTorch's fastest whole-layer graph replay (`_pytorch_graph`) and over
    /// its fastest form of all, eager or graph (`_pytorch_fastest`: the anchor), and the overall
    /// gate overhead; beside them the two whole-layer medians themselves (`L<l>.layer_gated_us`,
    /// `L<l>.layer_ungated_us`: what `bench --targets` judges; a receipt's latencies are per seam).
    pub fn ratios(
        &self,
        floors_ns: &[Option<f64>],
        torch_graph_us: Option<f64>,
        torch_fastest_us: Option<f64>,
    ) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for l in 0..self.ungated.len() {
            let u = self.ungated[l] as f64;
            if u <= 0.0 {
                continue;
            }
            out.insert(format!("L{l}.layer_ungated_us"), u / 1e3);
            if let Some(&g) = self.gated.get(l).filter(|g| **g > 0) {
                out.insert(format!("L{l}.layer_gated_us"), g as f64 / 1e3);
            }
            out.insert(format!("L{l}.layer_gated_over_ungated"), self.gated.get(l).copied().unwrap_or(0) as f64 / u);
            out.insert(
                format!("L{l}.layer_seam_events_over_ungated"),
                self.seams.get(l).copied().unwrap_or(0) as f64 / u,
            );
            if let Some(Some(f)) = floors_ns.get(l) {
                out.insert(format!("L{l}.layer_ungated_over_floor"), u / f);
                out.insert(format!("L{l}.layer_gated_over_floor"), self.gated.get(l).copied().unwrap_or(0) as f64 / f);
            }
            for (anchor, us) in [("graph", torch_graph_us), ("fastest", torch_fastest_us)] {
                if let Some(t) = us {
                    out.insert(format!("L{l}.layer_ungated_over_pytorch_{anchor}"), u / (t * 1e3));
                    out.insert(
                        format!("L{l}.layer_gated_over_pytorch_{anchor}"),
                        self.gated.get(l).copied().unwrap_or(0) as f64 / (t * 1e3),
                    );
                }
            }
        }
        if let Some(o) = self.overhead() {
            out.insert("gate_overhead".into(), o);
        }
        out
    }

    /// One line per layer for the terminal.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "{:<6} {:>16} {:>16} {:>16} {:>10}",
            "layer", "ungated µs", "gated µs", "seam events µs", "overhead"
        )];
        for l in 0..self.ungated.len() {
            let (u, g, s) = (self.ungated[l] as f64 / 1e3, self.gated[l] as f64 / 1e3, self.seams[l] as f64 / 1e3);
            out.push(format!("{l:<6} {u:>16.1} {g:>16.1} {s:>16.1} {:>9.1}%", (g / u - 1.0) * 100.0));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_and_ratios_come_from_the_medians() {
        let c = GatingCost { seams: vec![130], gated: vec![105], ungated: vec![100] };
        assert!((c.overhead().unwrap() - 0.05).abs() < 1e-12);
        let r = c.ratios(&[Some(50.0)], Some(0.4), Some(0.2));
        assert!((r["L0.layer_gated_over_ungated"] - 1.05).abs() < 1e-12);
        assert_eq!((r["L0.layer_gated_us"], r["L0.layer_ungated_us"]), (0.105, 0.1));
        assert!((r["L0.layer_ungated_over_floor"] - 2.0).abs() < 1e-12);
        assert!((r["L0.layer_ungated_over_pytorch_graph"] - 0.25).abs() < 1e-12);
        // An eager form faster than every graph form is the anchor.
        assert!((r["L0.layer_gated_over_pytorch_fastest"] - 0.525).abs() < 1e-12);
        let r = c.ratios(&[Some(50.0)], None, None);
        assert!(!r.keys().any(|k| k.contains("pytorch")), "no anchor, no PyTorch ratio: {r:?}");
        assert_eq!(GatingCost::default().overhead(), None);
    }
}
