//! `latency-compare`: the configurations side by side in one chart pair, for the questions a
//! reviewer asks first (host-bounce or native-p2p? TP1 or TP8? with or without a door?). Top: each
//! layer's total (sum of its seam medians), one bar per configuration. Bottom: each seam summed
//! over layers, one bar per configuration, so a transport's cost shows in the join seams. Bars of
//! configurations that differ only in transport share a hue (dark: host-bounce, light:
//! native-p2p).

use std::collections::BTreeMap;

use plotters::coord::ranged1d::BindKeyPoints;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::canvas::{
    axis_top, config_color, draw_column_legend, fmt_tick, font, label_indices, text_width, title_band, DrawResult,
    Figure, Swatch, AXIS_DESC_PX, CAPTION_PX, FIGURE_WIDTH_PX, LEGEND_PX, LEGEND_ROW_PX, TICK_PX, TITLE_BAND_PX,
};
use super::data::Table;

/// Height of each of the two charts.
pub const COMPARE_CHART_PX: u32 = 430;
const Y_LABEL_AREA_PX: u32 = 84;
const X_LABEL_AREA_PX: u32 = 56;
/// Width of a bar group as a fraction of its slot.
const GROUP: f64 = 0.84;

pub(crate) struct Compare<'a> {
    pub table: &'a Table,
    /// One colour per series ([`config_color`]).
    pub colors: Vec<RGBColor>,
}

impl<'a> Compare<'a> {
    pub fn new(table: &'a Table) -> Self {
        let mut groups: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &table.series {
            let next = groups.len();
            groups.entry(s.hue_group.as_str()).or_insert(next);
        }
        let n = table.series.len();
        let colors = table
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| config_color(groups[s.hue_group.as_str()], groups.len(), s.shade, i, n))
            .collect();
        Compare { table, colors }
    }

    fn legend_w(&self) -> u32 {
        let widest = self.table.series.iter().map(|s| text_width(&s.label, LEGEND_PX)).max().unwrap_or(0);
        (widest + 60).clamp(260, 600)
    }
}

impl Figure for Compare<'_> {
    const STEM: &'static str = "latency-compare";

    fn size(&self) -> (u32, u32) {
        let legend_h = 60 + self.table.series.len() as u32 * LEGEND_ROW_PX;
        (FIGURE_WIDTH_PX, TITLE_BAND_PX + (2 * COMPARE_CHART_PX).max(legend_h))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let t = self.table;
        let subtitle = format!(
            "{} · median latency per decode step (µs) · same hue: same configuration but the transport \
             (dark host-bounce, light native-p2p)",
            t.common
        );
        let rest = title_band(root, "Configurations side by side", subtitle.trim_start_matches(" · "))?;
        let (w, _) = rest.dim_in_pixel();
        let (charts, legend) = rest.split_horizontally(w - self.legend_w());
        let entries: Vec<(RGBColor, String)> =
            t.series.iter().zip(&self.colors).map(|(s, c)| (*c, s.label.clone())).collect();
        draw_column_legend(&legend.margin(8, 0, 8, 0), "configuration", &entries, Swatch::Box)?;
        let (top, bottom) = charts.split_vertically(COMPARE_CHART_PX);
        let n_layers = t.axes.layers.len();
        let layer_vals: Vec<Vec<Option<f64>>> = t
            .series
            .iter()
            .map(|s| (0..n_layers).map(|l| Some(s.layer_total_us(l)).filter(|v| *v > 0.0)).collect())
            .collect();
        self.grouped(
            &top.margin(4, 8, 8, 16),
            "Per layer: sum of the layer's seam medians",
            "layer",
            &t.axes.layer_names,
            &layer_vals,
        )?;
        let seam_vals: Vec<Vec<Option<f64>>> =
            t.series.iter().map(|s| (0..t.axes.seams.len()).map(|i| s.seam_total_us(i)).collect()).collect();
        self.grouped(
            &bottom.margin(4, 8, 8, 16),
            "Per seam: sum over layers of the seam's median",
            "seam",
            &t.axes.seams,
            &seam_vals,
        )
    }
}

impl Compare<'_> {
    /// Grouped bars: one group per category, one bar per configuration (`vals[series][category]`).
    fn grouped<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        caption: &str,
        x_desc: &str,
        categories: &[String],
        vals: &[Vec<Option<f64>>],
    ) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let n = categories.len();
        let (w, _) = area.dim_in_pixel();
        let slot_px = f64::from(w.saturating_sub(Y_LABEL_AREA_PX)) / n as f64;
        let widest = categories.iter().map(|c| text_width(c, TICK_PX)).max().unwrap_or(0);
        let keys: Vec<f64> = label_indices(n, slot_px, f64::from(widest)).into_iter().map(|i| i as f64).collect();
        let max = vals.iter().flatten().flatten().copied().fold(0.0, f64::max);
        let mut chart = ChartBuilder::on(area)
            .caption(caption, font(CAPTION_PX))
            .x_label_area_size(X_LABEL_AREA_PX)
            .y_label_area_size(Y_LABEL_AREA_PX)
            .build_cartesian_2d((-0.5..n as f64 - 0.5).with_key_points(keys), 0.0..axis_top(max))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(225, 225, 225))
            .y_labels(6)
            .x_label_formatter(&|v| categories.get(v.round() as usize).cloned().unwrap_or_default())
            .y_label_formatter(&|v| fmt_tick(*v))
            .x_desc(x_desc)
            .y_desc("median latency (µs)")
            .label_style(font(TICK_PX))
            .axis_desc_style(font(AXIS_DESC_PX))
            .draw()?;
        let m = vals.len().max(1) as f64;
        let bar = GROUP / m;
        for (si, series) in vals.iter().enumerate() {
            let color = self.colors[si];
            chart.draw_series(series.iter().enumerate().filter_map(|(c, v)| {
                let x0 = c as f64 - GROUP / 2.0 + si as f64 * bar;
                v.map(|v| Rectangle::new([(x0 + bar * 0.06, 0.0), (x0 + bar * 0.94, v)], color.filled()))
            }))?;
        }
        Ok(())
    }
}
