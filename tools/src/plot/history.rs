//! `latency-history`: how each seam's latency moved across receipt sets (nights, builds), oldest
//! at the left. One panel per configuration (paired across sets by run id, with its own y scale so
//! a drift is visible whatever the configuration's size), one line per seam: the seam's median
//! summed over layers. A configuration missing from a set leaves a gap. The default form is one
//! panel, each seam's median over the configurations (`History::collapsed`): one screen whatever
//! the matrix; `plot --history --per-config` draws the panels.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::canvas::{
    axis_top, captioned, clip_to_width, draw_grid_legend, fmt_tick, font, label_indices, seam_color, text_width,
    title_band, DrawResult, Figure, Keyed, Swatch, AXIS_DESC_PX, CELL_PX, FIGURE_WIDTH_PX, SEAM_LEGEND_COLUMNS,
    TICK_PX, TITLE_BAND_PX,
};
use super::data::{utc_minute, utc_year_and_rest, History};
use super::grid_shape;
use super::stacked::{seam_entries, seam_legend_px};

/// Height of one configuration's panel.
pub const HISTORY_PANEL_PX: u32 = 400;
const Y_LABEL_AREA_PX: u32 = 84;
/// Two lines of tick labels (set label, date) and the axis description.
const X_LABEL_AREA_PX: u32 = 82;

pub(crate) struct HistoryFigure<'a> {
    pub history: &'a History,
}

impl Figure for HistoryFigure<'_> {
    const STEM: &'static str = "latency-history";

    fn size(&self) -> (u32, u32) {
        let (rows, _) = grid_shape(self.history.configs.len());
        (FIGURE_WIDTH_PX, TITLE_BAND_PX + seam_legend_px(self.history.seams.len()) + rows as u32 * HISTORY_PANEL_PX)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let h = self.history;
        let years: Vec<i64> = h.sets.iter().map(|(_, d)| utc_year_and_rest(*d).0).collect();
        let year = if years.windows(2).all(|w| w[0] == w[1]) { format!(", {}", years[0]) } else { String::new() };
        let panels = match h.collapsed_from {
            None => "one panel per configuration, own y scale".to_string(),
            Some(n) => format!("the median of {n} configurations (--per-config: one panel each)"),
        };
        let subtitle = format!(
            "{} · {panels} · y: each seam's median per decode step, summed over layers (µs) · x: receipt sets by \
             earliest start (UTC{year})",
            h.common
        );
        let rest = title_band(root, "Seam latency across receipt sets", subtitle.trim_start_matches(" · "))?;
        let (legend, panels) = rest.split_vertically(seam_legend_px(h.seams.len()));
        draw_grid_legend(&legend, &seam_entries(&h.seams), SEAM_LEGEND_COLUMNS, Swatch::Line)?;
        let (rows, cols) = grid_shape(h.configs.len());
        for (ci, area) in (0..h.configs.len()).zip(panels.split_evenly((rows, cols))) {
            self.panel(&area.margin(4, 8, 8, 24), ci)?;
        }
        Ok(())
    }
}

/// The date under each set's label: `MM-DD HH:MM` when all sets share a year (the subtitle
/// names it), else `YYYY-MM-DD HH:MM`.
fn set_dates(h: &History) -> Vec<String> {
    let split: Vec<(i64, String)> = h.sets.iter().map(|(_, d)| utc_year_and_rest(*d)).collect();
    if split.windows(2).all(|w| w[0].0 == w[1].0) {
        split.into_iter().map(|(_, rest)| rest).collect()
    } else {
        h.sets.iter().map(|(_, d)| utc_minute(*d)).collect()
    }
}

impl HistoryFigure<'_> {
    fn panel<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>, ci: usize) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let h = self.history;
        let n = h.sets.len();
        let vals = &h.values[ci];
        let (w, _) = area.dim_in_pixel();
        let area = &captioned(area, &h.configs[ci].1)?;
        let slot_px = f64::from(w.saturating_sub(Y_LABEL_AREA_PX)) / n as f64;
        let dates = set_dates(h);
        // Labels are clipped to their slot, so a label never runs into its neighbour's; when even
        // a date does not fit, only every k-th set is labelled.
        let date_px = dates.iter().map(|d| text_width(d, CELL_PX)).max().unwrap_or(0);
        let shown = label_indices(n, slot_px, f64::from(date_px));
        let stride = if shown.len() > 1 { shown[1] - shown[0] } else { n };
        let label_px = (slot_px * stride as f64 - 12.0).max(f64::from(date_px)) as u32;
        let max = vals.iter().flatten().flatten().copied().fold(0.0, f64::max);
        let keys: Vec<f64> = shown.iter().map(|i| *i as f64).collect();
        let mut chart = ChartBuilder::on(area)
            .x_label_area_size(X_LABEL_AREA_PX)
            .y_label_area_size(Y_LABEL_AREA_PX)
            .build_cartesian_2d(Keyed::linear(-0.5, n as f64 - 0.5, keys), 0.0..axis_top(max))?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(225, 225, 225))
            .y_labels(6)
            .x_label_formatter(&|_| String::new())
            .y_label_formatter(&|v| fmt_tick(*v))
            .x_desc("receipt set")
            .y_desc("latency (µs)")
            .label_style(font(TICK_PX))
            .axis_desc_style(font(AXIS_DESC_PX))
            .draw()?;
        for (si, seam) in h.seams.iter().enumerate() {
            let color = seam_color(seam, si);
            // Consecutive sets that have the value form one line; a missing set breaks it.
            let mut run: Vec<(f64, f64)> = Vec::new();
            for (set, v) in vals.iter().map(|per_seam| per_seam[si]).enumerate() {
                match v {
                    Some(v) => run.push((set as f64, v)),
                    None => {
                        chart.draw_series(LineSeries::new(run.drain(..), color.stroke_width(2)))?;
                    }
                }
            }
            chart.draw_series(LineSeries::new(run, color.stroke_width(2)))?;
            chart.draw_series(
                vals.iter().enumerate().filter_map(|(set, per_seam)| {
                    per_seam[si].map(|v| Circle::new((set as f64, v), 4, color.filled()))
                }),
            )?;
        }
        // Two-line tick labels (set label, then its date) under the ticks: plotters' own tick
        // labels are one line. `backend_coord` is absolute; `draw_text` is relative to the area.
        let (bx, by) = area.get_base_pixel();
        let grey = font(CELL_PX).color(&RGBColor(90, 90, 90)).pos(Pos::new(HPos::Center, VPos::Top));
        let style = font(TICK_PX).pos(Pos::new(HPos::Center, VPos::Top));
        for &i in &shown {
            let (x, y) = chart.backend_coord(&(i as f64, 0.0));
            let (x, y) = (x - bx, y - by);
            area.draw_text(&clip_to_width(&h.sets[i].0, TICK_PX, label_px), &style, (x, y + 8))?;
            area.draw_text(&dates[i], &grey, (x, y + 28))?;
        }
        Ok(())
    }
}
