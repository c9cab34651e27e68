//! The volatile part of a receipt: timings, host and device, the P2P probe. Nothing here is
//! compared for identity; `diff` judges latencies with its noise rule.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::required;

/// Everything that depends on the clock or the machine. Never compared for identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measurements {
    /// One entry per timed layer × seam.
    pub latency: Vec<SeamLatency>,
    /// Wall time of the whole run, milliseconds.
    pub wall_ms: f64,
    /// Host description (CPU model, core count, OS).
    pub host: String,
    /// Device description (name, driver, memory) on the CUDA backend.
    #[serde(deserialize_with = "required")]
    pub device: Option<String>,
    /// The byte-integrity probe of the run's transport, run before any run at TP > 1
    /// (docs/DESIGN.md §3.5); empty otherwise.
    pub p2p_probe: Vec<ProbeEntry>,
    /// Start of the run, milliseconds since the Unix epoch.
    pub started_at_unix_ms: u64,
    /// Other named measurements (e.g. `"gate_overhead_ms"`). A launch over several processes
    /// (`--process P/N`) adds `"processes"` (N) to each of its receipts and `"ranks_per_process"`
    /// (TP / N) to the runs that spanned the processes; absent keys mean one process. They live
    /// here, not in `evidence`, because the evidence must equal the single-process run's.
    /// A host run of the built-in runtime adds `"host_rank_threads"`: its rank threads (TP), or 0
    /// where its ranks ran inline on the job's thread (the same values, other latencies).
    pub extra: BTreeMap<String, f64>,
}

/// Latency of one layer × seam over the timed decode steps.
///
/// Formulas, over the `n_samples` timed steps sorted ascending as `x[0] ≤ … ≤ x[n−1]` (integer
/// nanoseconds, one sample per timed step after warm-up; CUDA events on the GPU, a monotonic clock
/// on the host):
///
/// - `min_ns = x[0]`, `max_ns = x[n−1]`
/// - `median_ns = x[(n−1) / 2]` — the *lower* median (integer division), always an observed sample
/// - `p90_ns = x[⌈0.9·n⌉ − 1]` — nearest-rank 90th percentile, computed in integers as
///   `x[⌈9n / 10⌉ − 1]`; an observed sample
///
/// so `min ≤ median ≤ p90 ≤ max`. [`LatencyStats::from_samples`] is the one implementation.
/// `[min_ns, max_ns]` is the noise band that `diff` uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeamLatency {
    pub layer: usize,
    pub seam: String,
    pub n_samples: u64,
    pub min_ns: u64,
    pub median_ns: u64,
    pub p90_ns: u64,
    pub max_ns: u64,
}

impl SeamLatency {
    pub fn new(layer: usize, seam: impl Into<String>, stats: LatencyStats) -> Self {
        SeamLatency {
            layer,
            seam: seam.into(),
            n_samples: stats.n_samples,
            min_ns: stats.min_ns,
            median_ns: stats.median_ns,
            p90_ns: stats.p90_ns,
            max_ns: stats.max_ns,
        }
    }

    pub fn stats(&self) -> LatencyStats {
        LatencyStats {
            n_samples: self.n_samples,
            min_ns: self.min_ns,
            median_ns: self.median_ns,
            p90_ns: self.p90_ns,
            max_ns: self.max_ns,
        }
    }
}

/// Order statistics of a set of latency samples; formulas on [`SeamLatency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyStats {
    pub n_samples: u64,
    pub min_ns: u64,
    pub median_ns: u64,
    pub p90_ns: u64,
    pub max_ns: u64,
}

impl LatencyStats {
    /// The statistics of `samples_ns` (any order); `None` when there are no samples.
    pub fn from_samples(samples_ns: &[u64]) -> Option<LatencyStats> {
        if samples_ns.is_empty() {
            return None;
        }
        let mut x = samples_ns.to_vec();
        x.sort_unstable();
        let n = x.len();
        Some(LatencyStats {
            n_samples: n as u64,
            min_ns: x[0],
            median_ns: x[(n - 1) / 2],
            p90_ns: x[(9 * n).div_ceil(10) - 1],
            max_ns: x[n - 1],
        })
    }
}

/// One ordered pair and size of the P2P byte-integrity probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeEntry {
    /// The transport probed (schema version 1 probed native-p2p only).
    pub transport: super::Transport,
    /// Source device index.
    pub src: usize,
    /// Destination device index.
    pub dst: usize,
    /// Bytes copied.
    pub bytes: u64,
    /// Words of the destination that did not hold the pattern after the copy.
    pub bad_words: u64,
    pub status: ProbeStatus,
}

/// Outcome of one probe copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeStatus {
    /// Every word arrived.
    Ok,
    /// The copy reported success but `bad_words` > 0.
    Corrupt,
    /// The pair has no peer access; native-P2P runs are skipped.
    NoPeerAccess,
    /// The copy itself failed.
    Failed,
}
