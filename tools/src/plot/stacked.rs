//! `latency-stacked`: where a decode step's time goes, layer by layer. One panel per
//! configuration; in each, one bar per layer stacked by seam (program order from the bottom), the
//! layer total written above the bar. All panels share the y scale so bar heights compare across
//! configurations.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::canvas::{
    axis_top, captioned, draw_grid_legend, fmt_tick, fmt_us, font, label_indices, legend_rows, seam_color, text_width,
    title_band, DrawResult, Figure, Keyed, Swatch, AXIS_DESC_PX, CELL_PX, FIGURE_WIDTH_PX, LEGEND_ROW_PX,
    SEAM_LEGEND_COLUMNS, TICK_PX, TITLE_BAND_PX,
};
use super::data::{Series, Table};
use super::grid_shape;

/// Height of one configuration's panel.
pub const STACKED_PANEL_PX: u32 = 380;
const Y_LABEL_AREA_PX: u32 = 84;
const X_LABEL_AREA_PX: u32 = 56;
/// Bar width as a fraction of a layer's slot.
const BAR: f64 = 0.72;

pub(crate) struct Stacked<'a> {
    pub table: &'a Table,
}

/// Height of the seam legend band of the stacked and history figures.
pub(crate) fn seam_legend_px(n_seams: usize) -> u32 {
    legend_rows(n_seams, SEAM_LEGEND_COLUMNS) * LEGEND_ROW_PX + 12
}

pub(crate) fn seam_entries(seams: &[String]) -> Vec<(RGBColor, String)> {
    seams.iter().enumerate().map(|(i, s)| (seam_color(s, i), s.clone())).collect()
}

impl Figure for Stacked<'_> {
    const STEM: &'static str = "latency-stacked";

    fn size(&self) -> (u32, u32) {
        let (rows, _) = grid_shape(self.table.series.len());
        (FIGURE_WIDTH_PX, TITLE_BAND_PX + seam_legend_px(self.table.axes.seams.len()) + rows as u32 * STACKED_PANEL_PX)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let t = self.table;
        let subtitle = format!(
            "{} · one panel per configuration, same y scale · bars stacked by seam in program order from the \
             bottom · number above a bar: layer total (µs)",
            t.common
        );
        let rest =
            title_band(root, "Median latency per decode step, by layer and seam", subtitle.trim_start_matches(" · "))?;
        let (legend, panels) = rest.split_vertically(seam_legend_px(t.axes.seams.len()));
        draw_grid_legend(&legend, &seam_entries(&t.axes.seams), SEAM_LEGEND_COLUMNS, Swatch::Box)?;
        let (rows, cols) = grid_shape(t.series.len());
        let y_top = axis_top(t.max_layer_total_us());
        for (s, area) in t.series.iter().zip(panels.split_evenly((rows, cols))) {
            self.panel(&area.margin(4, 8, 8, 18), s, y_top)?;
        }
        Ok(())
    }
}

impl Stacked<'_> {
    fn panel<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>, s: &Series, y_top: f64) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let axes = &self.table.axes;
        let n = axes.layers.len();
        let (w, _) = area.dim_in_pixel();
        let slot_px = f64::from(w.saturating_sub(Y_LABEL_AREA_PX)) / n as f64;
        let widest = axes.layer_names.iter().map(|l| text_width(l, TICK_PX)).max().unwrap_or(0);
        let keys: Vec<f64> = label_indices(n, slot_px, f64::from(widest)).into_iter().map(|i| i as f64).collect();
        let area = &captioned(area, &s.label)?;
        let mut chart = ChartBuilder::on(area)
            .x_label_area_size(X_LABEL_AREA_PX)
            .y_label_area_size(Y_LABEL_AREA_PX)
            .build_cartesian_2d(Keyed::linear(-0.5, n as f64 - 0.5, keys), 0.0..y_top)?;
        let names = &axes.layer_names;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(225, 225, 225))
            .y_labels(6)
            .x_label_formatter(&|v| names.get(v.round() as usize).cloned().unwrap_or_default())
            .y_label_formatter(&|v| fmt_tick(*v))
            .x_desc("layer")
            .y_desc("median latency (µs)")
            .label_style(font(TICK_PX))
            .axis_desc_style(font(AXIS_DESC_PX))
            .draw()?;
        let half = BAR / 2.0;
        for li in 0..n {
            let x = li as f64;
            let mut y0 = 0.0;
            for (si, seam) in axes.seams.iter().enumerate() {
                let Some(v) = s.get(li, si) else { continue };
                let rect = [(x - half, y0), (x + half, y0 + v)];
                chart.draw_series([
                    Rectangle::new(rect, seam_color(seam, si).filled()),
                    Rectangle::new(rect, WHITE.stroke_width(1)),
                ])?;
                y0 += v;
            }
            // The total above the bar, when it fits the slot (it does not with dozens of layers).
            let total = fmt_us(y0);
            if f64::from(text_width(&total, CELL_PX)) + 4.0 <= slot_px {
                let style = font(CELL_PX).pos(Pos::new(HPos::Center, VPos::Bottom));
                chart.draw_series([EmptyElement::at((x, y0)) + Text::new(total, (0, -4), style)])?;
            }
        }
        Ok(())
    }
}
