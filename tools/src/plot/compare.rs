//! `latency-compare`: the configurations side by side, for the questions a reviewer asks first
//! (host-bounce or native-p2p? TP1 or TP8? with or without a door?). One horizontal bar per
//! configuration, named on the axis next to it (no colour to decode, however many there are), its
//! length the decode step's total (every layer's seam medians summed), split by seam so a
//! transport's cost shows in the join seams. Configurations that differ only in transport sit on
//! adjacent rows; a thin line separates TP sizes.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::canvas::{
    axis_top, draw_grid_legend, fmt_tick, fmt_us, font, seam_color, text_width, title_band, DrawResult, Figure, Keyed,
    Swatch, AXIS_DESC_PX, CAPTION_PX, CELL_PX, FIGURE_WIDTH_PX, SEAM_LEGEND_COLUMNS, TICK_PX, TITLE_BAND_PX,
};
use super::data::Table;
use super::stacked::{seam_entries, seam_legend_px};

/// Height of one configuration's row.
pub const COMPARE_ROW_PX: u32 = 30;
/// The chart is `COMPARE_EXTRA_PX + COMPARE_ROW_PX × configurations` high (caption, x axis).
pub const COMPARE_EXTRA_PX: u32 = 120;
/// Bar thickness as a fraction of a row.
const BAR: f64 = 0.7;

pub(crate) struct Compare<'a> {
    pub table: &'a Table,
}

impl Figure for Compare<'_> {
    const STEM: &'static str = "latency-compare";

    fn size(&self) -> (u32, u32) {
        let t = self.table;
        let chart = COMPARE_EXTRA_PX + COMPARE_ROW_PX * t.series.len() as u32;
        (FIGURE_WIDTH_PX, TITLE_BAND_PX + seam_legend_px(t.axes.seams.len()) + chart)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let t = self.table;
        let subtitle = format!(
            "{} · one bar per configuration: every layer's seam medians summed, split by seam · number: the \
             total (µs) · seams of a few µs: see latency-heatmap",
            t.common
        );
        let rest =
            title_band(root, "Configurations side by side: decode step by seam", subtitle.trim_start_matches(" · "))?;
        let (legend, area) = rest.split_vertically(seam_legend_px(t.axes.seams.len()));
        draw_grid_legend(&legend, &seam_entries(&t.axes.seams), SEAM_LEGEND_COLUMNS, Swatch::Box)?;
        let area = area.margin(4, 8, 8, 24);

        let n = t.series.len();
        let n_layers = t.axes.layers.len();
        let totals: Vec<f64> = t.series.iter().map(|s| (0..n_layers).map(|l| s.layer_total_us(l)).sum()).collect();
        let max = totals.iter().copied().fold(0.0, f64::max);
        // Room for the total written after the longest bar.
        let x_top = axis_top(max) * 1.04;
        let y_area = t.series.iter().map(|s| text_width(&s.label, TICK_PX)).max().unwrap_or(0) + 24;
        // Row i (the first configuration) at the top: y = n − 1 − i.
        let row_y = |i: usize| (n - 1 - i) as f64;
        let keys: Vec<f64> = (0..n).map(row_y).collect();
        let mut chart = ChartBuilder::on(&area)
            .caption("Decode step total (µs): Σ over layers and seams of the seam medians", font(CAPTION_PX))
            .x_label_area_size(56)
            .y_label_area_size(y_area)
            .build_cartesian_2d(0.0..x_top, Keyed::linear(-0.5, n as f64 - 0.5, keys))?;
        let labels: Vec<&str> = t.series.iter().map(|s| s.label.as_str()).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(225, 225, 225))
            .x_labels(10)
            .x_label_formatter(&|v| fmt_tick(*v))
            .y_label_formatter(&|v| {
                let r = v.round() as usize;
                labels.get(n.wrapping_sub(1).wrapping_sub(r)).map(|s| s.to_string()).unwrap_or_default()
            })
            .x_desc("median latency per decode step (µs)")
            .label_style(font(TICK_PX))
            .axis_desc_style(font(AXIS_DESC_PX))
            .draw()?;
        let half = BAR / 2.0;
        for (i, s) in t.series.iter().enumerate() {
            let y = row_y(i);
            let mut x0 = 0.0;
            for (si, seam) in t.axes.seams.iter().enumerate() {
                let Some(v) = s.seam_total_us(si) else { continue };
                let rect = [(x0, y - half), (x0 + v, y + half)];
                chart.draw_series([
                    Rectangle::new(rect, seam_color(seam, si).filled()),
                    Rectangle::new(rect, WHITE.stroke_width(1)),
                ])?;
                x0 += v;
            }
            let style = font(CELL_PX).pos(Pos::new(HPos::Left, VPos::Center));
            chart.draw_series([EmptyElement::at((x0, y)) + Text::new(fmt_us(totals[i]), (6, 0), style)])?;
            // A separator where the group changes (TP size, backend, model), between rows.
            if i > 0 && t.series[i - 1].tp_group != s.tp_group {
                let sep = y + 0.5;
                chart.draw_series([PathElement::new(vec![(0.0, sep), (x_top, sep)], RGBColor(120, 120, 120))])?;
            }
        }
        Ok(())
    }
}
