//! From receipts to the numbers a figure draws: which configurations, which layers and seams, and
//! each cell's median. Figures only read this table, so every plotted number has one definition
//! (METRICS.md) and one place that computes it.

use std::collections::{BTreeMap, BTreeSet};

use memra_receipts::schema::{Receipt, RunConfigEvidence};

use super::PlotError;

/// The canonical program's seams in program order: the 11 of every layer, then the 2 of the head
/// pseudo-layer after the last layer (`runtime/src/evidence/record.rs`, `Seam::LAYER` and `Seam::HEAD`).
/// Seams a receipt names that are not listed here (another engine's) follow in name order.
pub const SEAM_ORDER: [&str; 13] = [
    "attn_norm",
    "qkv",
    "rope",
    "attn",
    "o_proj",
    "o_join",
    "ffn_norm",
    "router",
    "experts",
    "moe_join",
    "residual",
    "final_norm",
    "logits",
];

/// The seams of the head pseudo-layer; a layer holding only these is drawn as `head`.
const HEAD_SEAMS: [&str; 2] = ["final_norm", "logits"];

/// Longest door list kept in a short label; longer ones end in `…`.
const MAX_DOORS_CHARS: usize = 44;

/// One configuration: a receipt's median latencies.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub run_id: String,
    /// Short label ([`short_labels`]), unique within the figure.
    pub label: String,
    /// Backend, model and TP size: the comparison figure separates groups with a line.
    pub tp_group: String,
    /// `(layer index in Axes::layers, seam index in Axes::seams)` → median in µs.
    pub median_us: BTreeMap<(usize, usize), f64>,
}

impl Series {
    pub fn get(&self, layer: usize, seam: usize) -> Option<f64> {
        self.median_us.get(&(layer, seam)).copied()
    }

    /// Sum over seams of the medians of one layer (µs); 0 when the layer has none.
    pub fn layer_total_us(&self, layer: usize) -> f64 {
        self.median_us.iter().filter(|((l, _), _)| *l == layer).map(|(_, v)| v).sum()
    }

    /// Sum over layers of the medians of one seam (µs), `None` when no layer has the seam.
    pub fn seam_total_us(&self, seam: usize) -> Option<f64> {
        let v: Vec<f64> = self.median_us.iter().filter(|((_, s), _)| *s == seam).map(|(_, v)| *v).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    }
}

/// The layers and seams present in any configuration, in program order.
#[derive(Debug, Clone)]
pub(crate) struct Axes {
    /// Layer indices as written in receipts, ascending.
    pub layers: Vec<usize>,
    /// `L0`, `L1`, …, and `head` for the pseudo-layer that holds only head seams.
    pub layer_names: Vec<String>,
    pub seams: Vec<String>,
}

/// What every latency figure draws.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    pub axes: Axes,
    /// Ordered by model, backend, TP size, doors (defaults first), transport, run id.
    pub series: Vec<Series>,
    /// What all configurations share and their labels leave out (`memra-runtime/tiny on host`).
    pub common: String,
}

impl Table {
    /// The table of every receipt that has latency samples; receipts without any (SKIP,
    /// NOT-APPLICABLE, ERROR) are left out. `set` names the receipt set in errors.
    pub fn from_receipts(receipts: &[&Receipt], set: Option<&str>) -> Result<Table, PlotError> {
        let mut seen = BTreeMap::new();
        for r in receipts {
            if let Some(prev) = seen.insert(r.run_id.as_str(), r.label()) {
                return Err(PlotError::DuplicateRun {
                    run_id: r.run_id.clone(),
                    label: prev,
                    set: set.map(str::to_string),
                });
            }
        }
        let mut timed: Vec<&Receipt> =
            receipts.iter().copied().filter(|r| !r.measurements.latency.is_empty()).collect();
        if timed.is_empty() {
            return Err(PlotError::NoLatency { n_receipts: receipts.len() });
        }
        timed.sort_by_key(|r| order_key(&r.evidence.config, &r.run_id));
        let configs: Vec<&RunConfigEvidence> = timed.iter().map(|r| &r.evidence.config).collect();
        let ids: Vec<&str> = timed.iter().map(|r| r.run_id.as_str()).collect();
        let (labels, common) = short_labels_with_common(&configs, &ids);

        let mut layer_seams: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
        for r in &timed {
            for l in &r.measurements.latency {
                layer_seams.entry(l.layer).or_default().insert(l.seam.as_str());
            }
        }
        let seams = ordered_seams(&layer_seams.values().flatten().copied().collect());
        let layers: Vec<usize> = layer_seams.keys().copied().collect();
        let layer_names = layer_seams
            .iter()
            .map(|(l, s)| if s.iter().all(|x| HEAD_SEAMS.contains(x)) { "head".to_string() } else { format!("L{l}") })
            .collect();

        let series = timed
            .iter()
            .zip(labels)
            .map(|(r, label)| Series {
                run_id: r.run_id.clone(),
                label,
                tp_group: {
                    let c = &r.evidence.config;
                    // A pass of several lanes is timed per pass: its own group (docs/DESIGN.md §3.6).
                    let pass = c.pass_label();
                    let pass = if pass.is_empty() { pass } else { format!(" {pass}") };
                    format!("{}/{} {} tp{}{pass}", c.subject, c.model.preset, c.backend.as_str(), c.tp)
                },
                median_us: r
                    .measurements
                    .latency
                    .iter()
                    .map(|l| {
                        let li = layers.binary_search(&l.layer).expect("every layer was collected");
                        let si = seams.iter().position(|s| *s == l.seam).expect("every seam was collected");
                        ((li, si), l.median_ns as f64 / 1e3)
                    })
                    .collect(),
            })
            .collect();
        Ok(Table { axes: Axes { layers, layer_names, seams }, series, common })
    }

    /// Largest per-layer total over all configurations (µs).
    pub fn max_layer_total_us(&self) -> f64 {
        self.series
            .iter()
            .flat_map(|s| (0..self.axes.layers.len()).map(move |l| s.layer_total_us(l)))
            .fold(0.0, f64::max)
    }
}

/// `names` in program order ([`SEAM_ORDER`]), then the unknown ones in name order.
fn ordered_seams(names: &BTreeSet<&str>) -> Vec<String> {
    let mut seams: Vec<String> = SEAM_ORDER.iter().filter(|s| names.contains(*s)).map(|s| s.to_string()).collect();
    seams.extend(names.iter().filter(|s| !SEAM_ORDER.contains(s)).map(|s| s.to_string()));
    seams
}

/// Receipt sets over time: what the history figure draws.
#[derive(Debug, Clone)]
pub(crate) struct History {
    /// (label, date in Unix ms): ordered by date, then label.
    pub sets: Vec<(String, u64)>,
    /// (run_id, short label) of every configuration with latency in any set, in table order.
    pub configs: Vec<(String, String)>,
    /// Every seam of any receipt, in program order.
    pub seams: Vec<String>,
    pub common: String,
    /// `values[config][set][seam]`: Σ over layers of the seam's median (µs); `None` when the set
    /// has no such configuration or seam.
    pub values: Vec<Vec<Vec<Option<f64>>>>,
    /// `Some(n)` when this is [`History::collapsed`] of `n` configurations.
    pub collapsed_from: Option<usize>,
}

impl History {
    pub fn from_sets(sets: &[(String, Vec<Receipt>)]) -> Result<History, PlotError> {
        if sets.is_empty() {
            return Err(PlotError::NoSets);
        }
        let mut labels = BTreeSet::new();
        let mut dated = Vec::with_capacity(sets.len());
        for (label, receipts) in sets {
            if !labels.insert(label.as_str()) {
                return Err(PlotError::DuplicateSetLabel { label: label.clone() });
            }
            let date = set_date_ms(receipts).ok_or_else(|| PlotError::EmptySet { label: label.clone() })?;
            let mut ids = BTreeMap::new();
            for r in receipts {
                if let Some(prev) = ids.insert(r.run_id.as_str(), r.label()) {
                    return Err(PlotError::DuplicateRun {
                        run_id: r.run_id.clone(),
                        label: prev,
                        set: Some(label.clone()),
                    });
                }
            }
            dated.push((date, label.as_str(), receipts));
        }
        dated.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));

        // One receipt per configuration (its earliest) decides labels and order.
        let mut reps: BTreeMap<&str, &Receipt> = BTreeMap::new();
        let mut names = BTreeSet::new();
        for (_, _, receipts) in &dated {
            for r in receipts.iter().filter(|r| !r.measurements.latency.is_empty()) {
                reps.entry(r.run_id.as_str()).or_insert(r);
                names.extend(r.measurements.latency.iter().map(|l| l.seam.as_str()));
            }
        }
        let reps: Vec<&Receipt> = reps.into_values().collect();
        let n_receipts = sets.iter().map(|(_, r)| r.len()).sum();
        let table = Table::from_receipts(&reps, None).map_err(|e| match e {
            PlotError::NoLatency { .. } => PlotError::NoLatency { n_receipts },
            e => e,
        })?;
        let seams = ordered_seams(&names);
        let values = table
            .series
            .iter()
            .map(|s| {
                dated
                    .iter()
                    .map(|(_, _, receipts)| {
                        let mut v = vec![None; seams.len()];
                        if let Some(r) = receipts.iter().find(|r| r.run_id == s.run_id) {
                            for l in &r.measurements.latency {
                                let si = seams.iter().position(|x| *x == l.seam).expect("every seam was collected");
                                *v[si].get_or_insert(0.0) += l.median_ns as f64 / 1e3;
                            }
                        }
                        v
                    })
                    .collect()
            })
            .collect();
        Ok(History {
            sets: dated.iter().map(|(d, l, _)| (l.to_string(), *d)).collect(),
            configs: table.series.iter().map(|s| (s.run_id.clone(), s.label.clone())).collect(),
            seams,
            common: table.common,
            values,
            collapsed_from: None,
        })
    }

    /// The one-screen form (`plot --history` without `--per-config`): a single panel whose seam
    /// value in a set is the median (lower median) over the configurations that have it there.
    pub fn collapsed(&self) -> History {
        let n_sets = self.sets.len();
        let values = vec![(0..n_sets)
            .map(|set| {
                (0..self.seams.len())
                    .map(|si| {
                        let mut v: Vec<f64> = self.values.iter().filter_map(|c| c[set][si]).collect();
                        v.sort_by(f64::total_cmp);
                        (!v.is_empty()).then(|| v[(v.len() - 1) / 2])
                    })
                    .collect()
            })
            .collect()];
        History {
            sets: self.sets.clone(),
            configs: vec![(String::new(), format!("median over {} configuration(s)", self.configs.len()))],
            seams: self.seams.clone(),
            common: self.common.clone(),
            values,
            collapsed_from: Some(self.configs.len()),
        }
    }
}

/// Configurations that differ only in transport end up next to each other, defaults first.
fn order_key(c: &RunConfigEvidence, run_id: &str) -> impl Ord {
    (
        (c.subject.clone(), c.model.preset.clone(), c.backend, c.tp, (c.batch, c.columns)),
        (!c.doors.is_empty(), doors_text(c)),
        c.transport,
        run_id.to_string(),
    )
}

/// `+NAME -NAME` without the `MEMRA_` prefix in key order, or `defaults` (as in
/// [`RunConfigEvidence::label`]).
fn doors_text(c: &RunConfigEvidence) -> String {
    if c.doors.is_empty() {
        return "defaults".to_string();
    }
    c.doors
        .iter()
        .map(|(name, on)| format!("{}{}", if *on { '+' } else { '-' }, name.strip_prefix("MEMRA_").unwrap_or(name)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}

/// The labels plots use for `configs`: [`RunConfigEvidence::label`] without what every
/// configuration shares (subject/preset, backend), so `memra-runtime/tiny host tp2 native-p2p
/// +STEP_EP` becomes `tp2 native-p2p +STEP_EP` when all runs are `memra-runtime/tiny` on `host`.
/// Door lists longer than 44 characters end in `…`; labels that would still collide get ` #` and
/// the first 6 digits of their run id. `run_ids[i]` belongs to `configs[i]`.
pub fn short_labels(configs: &[&RunConfigEvidence], run_ids: &[&str]) -> Vec<String> {
    short_labels_with_common(configs, run_ids).0
}

fn short_labels_with_common(configs: &[&RunConfigEvidence], run_ids: &[&str]) -> (Vec<String>, String) {
    let all_same = |f: &dyn Fn(&RunConfigEvidence) -> String| configs.windows(2).all(|w| f(w[0]) == f(w[1]));
    let model = |c: &RunConfigEvidence| format!("{}/{}", c.subject, c.model.preset);
    let backend = |c: &RunConfigEvidence| c.backend.as_str().to_string();
    let same_model = all_same(&model);
    let same_backend = all_same(&backend);
    let mut labels: Vec<String> = configs
        .iter()
        .map(|c| {
            let mut parts = Vec::new();
            if !same_model {
                parts.push(model(c));
            }
            if !same_backend {
                parts.push(backend(c));
            }
            parts.push(format!("tp{}", c.tp));
            parts.push(c.transport.as_str().to_string());
            parts.push(clip(&doors_text(c), MAX_DOORS_CHARS));
            let pass = c.pass_label();
            if !pass.is_empty() {
                parts.push(pass);
            }
            parts.join(" ")
        })
        .collect();
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for l in &labels {
        *count.entry(l.clone()).or_default() += 1;
    }
    for (l, id) in labels.iter_mut().zip(run_ids) {
        if count[l.as_str()] > 1 {
            l.push_str(&format!(" #{}", id.chars().take(6).collect::<String>()));
        }
    }
    let mut common = Vec::new();
    if let (true, Some(c)) = (same_model, configs.first()) {
        common.push(model(c));
    }
    if let (true, Some(c)) = (same_backend, configs.first()) {
        common.push(format!("on {}", backend(c)));
    }
    (labels, common.join(" "))
}

/// The date a receipt set is ordered by: its earliest `started_at_unix_ms`.
pub(crate) fn set_date_ms(receipts: &[Receipt]) -> Option<u64> {
    receipts.iter().map(|r| r.measurements.started_at_unix_ms).min()
}

/// `YYYY-MM-DD HH:MM` (UTC) of a Unix time in milliseconds.
pub(crate) fn utc_minute(unix_ms: u64) -> String {
    let (y, rest) = utc_year_and_rest(unix_ms);
    format!("{y:04}-{rest}")
}

/// The year and `MM-DD HH:MM` (UTC) of a Unix time in milliseconds.
pub(crate) fn utc_year_and_rest(unix_ms: u64) -> (i64, String) {
    let (y, mo, d, h, m) = memra_receipts::time::utc_civil(unix_ms);
    (y, format!("{mo:02}-{d:02} {h:02}:{m:02}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_minute_known_dates() {
        assert_eq!(utc_minute(0), "1970-01-01 00:00");
        // 2000-02-29 12:34:56 UTC
        assert_eq!(utc_minute(951_827_696_000), "2000-02-29 12:34");
        // 2025-11-29 15:59:00 UTC
        assert_eq!(utc_minute(1_764_431_940_000), "2025-11-29 15:59");
    }
}
