//! `latency-heatmap`: every layer × seam cell at once, so that small seams a stacked bar hides
//! (norms, rope: a few µs next to milliseconds of experts) are still visible. One panel per
//! configuration (rows: seams in program order, columns: layers), one colour scale for all panels,
//! logarithmic because seam medians span several decades; each cell also carries its value.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::canvas::{
    captioned, fmt_tick, fmt_us, font, ink_on, label_indices, text_width, title_band, viridis, DrawResult, Figure,
    Keyed, AXIS_DESC_PX, CELL_PX, FIGURE_WIDTH_PX, TICK_PX, TITLE_BAND_PX,
};
use super::data::{Series, Table};
use super::grid_shape;

/// Height of one seam row of a panel.
pub const HEATMAP_ROW_PX: u32 = 30;
/// A panel is `HEATMAP_PANEL_EXTRA_PX + HEATMAP_ROW_PX × seams` high (caption, x labels, margins).
pub const HEATMAP_PANEL_EXTRA_PX: u32 = 116;
/// Width of the colour bar band at the right.
const COLORBAR_BAND_PX: u32 = 200;
const X_LABEL_AREA_PX: u32 = 56;
/// Cells without a value (the head's seams in a layer column and the reverse).
const ABSENT: RGBColor = RGBColor(238, 238, 238);

pub(crate) struct Heatmap<'a> {
    pub table: &'a Table,
}

/// The log colour scale shared by every panel: smallest and largest positive median (µs).
struct Scale {
    lo: f64,
    hi: f64,
}

impl Scale {
    fn of(t: &Table) -> Scale {
        let vals = t.series.iter().flat_map(|s| s.median_us.values().copied()).filter(|v| *v > 0.0);
        let (lo, hi) = vals.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if !lo.is_finite() {
            return Scale { lo: 1.0, hi: 10.0 };
        }
        if hi <= lo {
            return Scale { lo: lo / 2.0, hi: lo * 2.0 };
        }
        Scale { lo, hi }
    }

    /// Position of `v` on the scale, 0 at `lo`, 1 at `hi` (values ≤ 0 sit at the bottom).
    fn t(&self, v: f64) -> f64 {
        if v <= 0.0 {
            return 0.0;
        }
        (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
    }

    /// Tick values: 1, 2, 5 × 10^k inside the scale, or only the powers of ten when those are many.
    fn ticks(&self) -> Vec<f64> {
        let (k0, k1) = (self.lo.log10().floor() as i32, self.hi.log10().ceil() as i32);
        let inside = |v: &f64| *v >= self.lo * 0.999 && *v <= self.hi * 1.001;
        let decades: Vec<f64> = (k0..=k1).map(|k| 10f64.powi(k)).filter(inside).collect();
        let fine: Vec<f64> =
            (k0..=k1).flat_map(|k| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(k))).filter(inside).collect();
        if decades.len() >= 3 {
            decades
        } else if fine.len() >= 2 {
            fine
        } else {
            vec![self.lo, self.hi]
        }
    }
}

pub(crate) fn panel_px(n_seams: usize) -> u32 {
    HEATMAP_PANEL_EXTRA_PX + HEATMAP_ROW_PX * n_seams as u32
}

impl Figure for Heatmap<'_> {
    const STEM: &'static str = "latency-heatmap";

    fn size(&self) -> (u32, u32) {
        let (rows, _) = grid_shape(self.table.series.len());
        (FIGURE_WIDTH_PX, TITLE_BAND_PX + rows as u32 * panel_px(self.table.axes.seams.len()))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let t = self.table;
        let subtitle = format!(
            "{} · one panel per configuration · colour: median latency per decode step (µs), log scale shared by \
             all panels · grey: no such seam in that layer",
            t.common
        );
        let rest = title_band(root, "Median latency per layer × seam", subtitle.trim_start_matches(" · "))?;
        let (w, _) = rest.dim_in_pixel();
        let (panels, bar) = rest.split_horizontally(w - COLORBAR_BAND_PX);
        let scale = Scale::of(t);
        let (rows, cols) = grid_shape(t.series.len());
        for (s, area) in t.series.iter().zip(panels.split_evenly((rows, cols))) {
            self.panel(&area.margin(4, 8, 8, 18), s, &scale)?;
        }
        let bar_h = panel_px(t.axes.seams.len()).min(bar.dim_in_pixel().1);
        colorbar(&bar.margin(4, 0, 0, 16).shrink((0, 0), (COLORBAR_BAND_PX - 16, bar_h)), &scale)
    }
}

impl Heatmap<'_> {
    fn panel<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>, s: &Series, scale: &Scale) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let axes = &self.table.axes;
        let (n_layers, n_seams) = (axes.layers.len(), axes.seams.len());
        let (w, _) = area.dim_in_pixel();
        let y_area = axes.seams.iter().map(|s| text_width(s, TICK_PX)).max().unwrap_or(0) + 44;
        let cell_w = f64::from(w.saturating_sub(y_area)) / n_layers as f64;
        let widest = axes.layer_names.iter().map(|l| text_width(l, TICK_PX)).max().unwrap_or(0);
        let x_keys: Vec<f64> =
            label_indices(n_layers, cell_w, f64::from(widest)).into_iter().map(|i| i as f64 + 0.5).collect();
        let y_keys: Vec<f64> = (0..n_seams).map(|r| r as f64 + 0.5).collect();
        let area = &captioned(area, &s.label)?;
        let mut chart =
            ChartBuilder::on(area).x_label_area_size(X_LABEL_AREA_PX).y_label_area_size(y_area).build_cartesian_2d(
                Keyed::linear(0.0, n_layers as f64, x_keys),
                Keyed::linear(0.0, n_seams as f64, y_keys),
            )?;
        // Row 0 (the first seam in program order) is drawn at the top.
        let row_of = |si: usize| (n_seams - 1 - si) as f64;
        let names = &axes.layer_names;
        let seams = &axes.seams;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_label_formatter(&|v| names.get(v.floor() as usize).cloned().unwrap_or_default())
            .y_label_formatter(&|v| {
                let r = v.floor() as usize;
                seams.get(n_seams.wrapping_sub(1).wrapping_sub(r)).cloned().unwrap_or_default()
            })
            .x_desc("layer")
            .label_style(font(TICK_PX))
            .axis_desc_style(font(AXIS_DESC_PX))
            .draw()?;
        let cell_h = f64::from(HEATMAP_ROW_PX);
        for li in 0..n_layers {
            for si in 0..n_seams {
                let (x, y) = (li as f64, row_of(si));
                let v = s.get(li, si);
                let bg = v.map_or(ABSENT, |v| viridis(scale.t(v)));
                let rect = [(x, y), (x + 1.0, y + 1.0)];
                chart.draw_series([Rectangle::new(rect, bg.filled()), Rectangle::new(rect, WHITE.stroke_width(2))])?;
                let Some(v) = v else { continue };
                let text = fmt_us(v);
                if f64::from(text_width(&text, CELL_PX)) + 8.0 <= cell_w && cell_h >= CELL_PX + 4.0 {
                    let ink = ink_on(bg);
                    let style = font(CELL_PX).color(&ink).pos(Pos::new(HPos::Center, VPos::Center));
                    chart.draw_series([Text::new(text, (x + 0.5, y + 0.5), style)])?;
                }
            }
        }
        Ok(())
    }
}

/// The colour bar: the scale drawn as 100 bands with µs ticks.
fn colorbar<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, scale: &Scale) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let mut chart = ChartBuilder::on(area)
        .caption("median µs (log)", font(AXIS_DESC_PX))
        .margin_top(8)
        .margin_bottom(8)
        .x_label_area_size(8)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..1.0, Keyed::log(scale.lo, scale.hi, scale.ticks()))?;
    chart
        .configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_label_formatter(&|v| fmt_tick(*v))
        .label_style(font(TICK_PX))
        .axis_desc_style(font(AXIS_DESC_PX))
        .draw()?;
    const BANDS: usize = 100;
    let at = |i: usize| (scale.lo.ln() + (scale.hi.ln() - scale.lo.ln()) * i as f64 / BANDS as f64).exp();
    chart.draw_series((0..BANDS).map(|i| {
        Rectangle::new([(0.0, at(i)), (1.0, at(i + 1))], viridis((i as f64 + 0.5) / BANDS as f64).filled())
    }))?;
    chart.draw_series([Rectangle::new([(0.0, scale.lo), (1.0, scale.hi)], BLACK.stroke_width(1))])?;
    Ok(())
}
