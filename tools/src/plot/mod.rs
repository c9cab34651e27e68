//! Latency plots made from receipts (docs/DESIGN.md §6): what a person looks at to see where a decode step
//! spends its time, how configurations (transport, TP size, doors) compare, and how latency moved
//! over nights. Everything drawn is read from receipts, so a plot of last month's receipts looks
//! like one made right after the run; every plotted number is defined in METRICS.md.
//!
//! Each figure is written twice with the same layout: `<stem>.svg` (text stays text: searchable,
//! scalable) and `<stem>.png` (text rendered with the embedded DejaVu Sans, so it needs no system
//! fonts). File names are fixed, so a second run overwrites the first:
//!
//! | file stem         | made by             | shows |
//! |-------------------|---------------------|-------|
//! | `latency-stacked` | [`plot_receipts`]   | per configuration, one bar per layer stacked by seam |
//! | `latency-heatmap` | [`plot_receipts`]   | per configuration, seam × layer cells on a log colour scale |
//! | `latency-compare` | [`plot_receipts`]   | all configurations side by side: one bar each, the step total split by seam |
//! | `latency-history` | [`plot_history`]    | one line per seam across receipt sets: the median over configurations, or one panel per configuration |
//! | `door-effects`    | [`plot_doors`]      | a row per door: its step-latency ratio against its parent sets per TP size, with the noise interval, across nights |
//!
//! # Layout
//!
//! Every figure is [`FIGURE_WIDTH_PX`] wide. Panels (one per configuration) are laid out in
//! [`grid_shape`]`(n)` rows × columns under a 64-pixel title band; the stacked, compare and history figures
//! add a seam legend of 7 entries per row, 28 pixels a row, plus 12. Heights, for `r` panel rows and
//! `s` seams:
//!
//! - stacked: `64 + (⌈s/7⌉·28 + 12) + r·`[`STACKED_PANEL_PX`]
//! - heat map: `64 + r·(`[`HEATMAP_PANEL_EXTRA_PX`]` + s·`[`HEATMAP_ROW_PX`]`)`
//! - compare: `64 + (⌈s/7⌉·28 + 12) + `[`COMPARE_EXTRA_PX`]` + n·`[`COMPARE_ROW_PX`] for `n` configurations
//! - history: `64 + (⌈s/7⌉·28 + 12) + r·`[`HISTORY_PANEL_PX`] (`r` = 1 unless per configuration)
//! - doors: [`doors_figure_height`]: `64 + 28 + 12 + d·`[`DOOR_ROW_PX`]` + 40` for `d` doors

mod canvas;
mod compare;
mod data;
mod doors;
mod heatmap;
mod history;
mod stacked;

use std::path::{Path, PathBuf};

use memra_receipts::effect::DoorNight;
use memra_receipts::schema::Receipt;

pub use canvas::FIGURE_WIDTH_PX;
pub use compare::{COMPARE_EXTRA_PX, COMPARE_ROW_PX};
pub use data::{short_labels, SEAM_ORDER};
pub use doors::{doors_figure_height, DOOR_ROW_PX};
pub use heatmap::{HEATMAP_PANEL_EXTRA_PX, HEATMAP_ROW_PX};
pub use history::HISTORY_PANEL_PX;
pub use stacked::STACKED_PANEL_PX;

use canvas::{ensure_font, render};

/// Why a plot could not be made. Messages name the receipt, set or file and the rule.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error(
        "no latency samples in any of the {n_receipts} receipt(s): nothing to plot (SKIP, NOT-APPLICABLE \
         and ERROR runs carry none)"
    )]
    NoLatency { n_receipts: usize },
    #[error(
        "run {run_id} ({label}) appears twice{}: a plot shows one receipt per configuration, so give each \
         receipt set separately{}",
        set.as_ref().map(|s| format!(" in receipt set {s:?}")).unwrap_or_default(),
        if set.is_some() { "" } else { " or as --history sets" }
    )]
    DuplicateRun { run_id: String, label: String, set: Option<String> },
    #[error("no receipt sets given: a history plot needs at least one")]
    NoSets,
    #[error("receipt set {label:?} holds no receipts: it has no date to be ordered by")]
    EmptySet { label: String },
    #[error("receipt set label {label:?} is given twice: each set needs its own label")]
    DuplicateSetLabel { label: String },
    #[error("no door effect in any of the {n_nights} night(s): no configuration with a door ran beside its parent set (the same doors without it) with latencies")]
    NoDoorEffects { n_nights: usize },
    #[error("cannot create the output directory {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("cannot draw {}: {detail}", path.display())]
    Draw { path: PathBuf, detail: String },
    #[error("the embedded font tools/assets/DejaVuSans.ttf could not be registered with plotters")]
    Font,
}

/// Rows and columns of the panel grid for `n` panels: up to 4 columns, as square as they go
/// (1 → 1×1, 2 → 1×2, 4 → 2×2, 5 → 2×3, 8 → 3×3, 10 → 3×4, 31 → 8×4).
pub fn grid_shape(n: usize) -> (usize, usize) {
    let cols = ((n as f64).sqrt().ceil() as usize).clamp(1, 4);
    (n.div_ceil(cols).max(1), cols)
}

/// Writes the stacked-bar, heat-map and side-by-side figures of `receipts` into `out` (created if
/// missing) as SVG and PNG, and returns the six paths: `latency-stacked.{svg,png}`,
/// `latency-heatmap.{svg,png}`, `latency-compare.{svg,png}`.
///
/// Each receipt with latency samples is one configuration; receipts without (SKIP,
/// NOT-APPLICABLE, ERROR) are left out. Configurations are ordered by model, backend, TP size,
/// doors (defaults first), then transport, so that runs differing only in transport sit together,
/// and labelled by [`short_labels`]. The same run id twice is an error: a plot shows one
/// receipt per configuration.
pub fn plot_receipts(receipts: &[Receipt], out: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let refs: Vec<&Receipt> = receipts.iter().collect();
    let table = data::Table::from_receipts(&refs, None)?;
    prepare(out)?;
    let mut files = render(&stacked::Stacked { table: &table }, out)?;
    files.extend(render(&heatmap::Heatmap { table: &table }, out)?);
    files.extend(render(&compare::Compare { table: &table }, out)?);
    Ok(files)
}

/// Writes `latency-history.{svg,png}` into `out` (created if missing) and returns both paths.
///
/// `sets` are (label, receipts) pairs, e.g. one directory per night; they are drawn in the order
/// of their date, the earliest `started_at_unix_ms` of their receipts (ties by label), whatever
/// their order here. Configurations are paired across sets by run id. Errors: no sets, an empty
/// set, a label given twice, a run id twice in one set, no latency in any receipt.
///
/// With `per_config` one panel per configuration; otherwise one panel, each seam's median over
/// the configurations (readable on one screen whatever the size of the matrix).
pub fn plot_history(sets: &[(String, Vec<Receipt>)], out: &Path, per_config: bool) -> Result<Vec<PathBuf>, PlotError> {
    let mut history = data::History::from_sets(sets)?;
    if !per_config {
        history = history.collapsed();
    }
    prepare(out)?;
    render(&history::HistoryFigure { history: &history }, out)
}

/// Writes `door-effects.{svg,png}` into `out` (created if missing) and returns both paths.
/// `nights` are (label, the night's door summaries), drawn in the order given (oldest first).
/// Error: no night holds any door effect.
pub fn plot_doors(nights: &[(String, Vec<DoorNight>)], out: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let fig = doors::DoorsFigure::new(nights).ok_or(PlotError::NoDoorEffects { n_nights: nights.len() })?;
    prepare(out)?;
    render(&fig, out)
}

fn prepare(out: &Path) -> Result<(), PlotError> {
    ensure_font()?;
    std::fs::create_dir_all(out).map_err(|source| PlotError::CreateDir { path: out.to_path_buf(), source })
}
