//! `door-effects`: what each door buys, at a glance (docs/DESIGN.md §7, METRICS.md, "Door effects"). One row
//! per door; x: the nights, oldest at the left; in each night one point per (backend,) TP size:
//! the door's step-latency ratio against its parent configurations (the median over its
//! configurations at that TP size, [`memra_receipts::effect::DoorNight`]) with its noise interval
//! as a vertical bar. y is logarithmic and shared by every row, with a line at ×1: below it the
//! door made the step faster. A filled point is beyond noise (FASTER or SLOWER); a hollow one is
//! SAME or AMBIGUOUS. The right margin prints the last night's verdict per TP size.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use memra_receipts::effect::{DoorNight, Effect};

use super::canvas::{
    clip_to_width, draw_grid_legend, font, title_band, DrawResult, Figure, Keyed, Swatch, CELL_PX, FIGURE_WIDTH_PX,
    LEGEND_ROW_PX, TICK_PX,
};

/// Height of one door's row.
pub const DOOR_ROW_PX: u32 = 96;
const NAME_PX: u32 = 250;
const VERDICT_PX: u32 = 300;
const X_AXIS_PX: u32 = 40;

/// The chart's input: nights (label, door summaries), oldest first.
pub(crate) struct DoorsFigure<'a> {
    pub nights: &'a [(String, Vec<DoorNight>)],
    /// Every door with a summary in any night, sorted.
    pub doors: Vec<String>,
    /// Every (backend, TP) of any summary, sorted.
    pub sizes: Vec<(memra_receipts::Backend, usize)>,
    pub lo: f64,
    pub hi: f64,
}

impl<'a> DoorsFigure<'a> {
    pub fn new(nights: &'a [(String, Vec<DoorNight>)]) -> Option<DoorsFigure<'a>> {
        let all = || nights.iter().flat_map(|(_, s)| s.iter());
        let mut doors: Vec<String> = all().map(|s| s.door.clone()).collect();
        doors.sort();
        doors.dedup();
        let mut sizes: Vec<_> = all().map(|s| (s.backend, s.tp)).collect();
        sizes.sort();
        sizes.dedup();
        if doors.is_empty() {
            return None;
        }
        // A shared log range holding every interval and ×1, within ×1/8 … ×8 (beyond is clipped).
        let lo = all().map(|s| s.lo).fold(0.8f64, f64::min).max(0.125);
        let hi = all().map(|s| s.hi).fold(1.25f64, f64::max).min(8.0);
        Some(DoorsFigure { nights, doors, sizes, lo: lo * 0.95, hi: hi * 1.05 })
    }

    fn size_color(&self, i: usize) -> RGBColor {
        const C: [RGBColor; 6] = [
            RGBColor(31, 119, 180),
            RGBColor(255, 127, 14),
            RGBColor(44, 160, 44),
            RGBColor(148, 103, 189),
            RGBColor(214, 39, 40),
            RGBColor(140, 86, 75),
        ];
        C[i % C.len()]
    }

    fn size_name(&self, i: usize) -> String {
        let (b, tp) = self.sizes[i];
        let one_backend = self.sizes.iter().all(|(x, _)| *x == b);
        if one_backend {
            format!("tp{tp}")
        } else {
            format!("{} tp{tp}", b.as_str())
        }
    }
}

/// Pixels of the figure for `doors` rows.
pub fn doors_figure_height(doors: usize) -> u32 {
    super::canvas::TITLE_BAND_PX + LEGEND_ROW_PX + 12 + doors as u32 * DOOR_ROW_PX + X_AXIS_PX
}

impl Figure for DoorsFigure<'_> {
    const STEM: &'static str = "door-effects";

    fn size(&self) -> (u32, u32) {
        (FIGURE_WIDTH_PX, doors_figure_height(self.doors.len()))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let subtitle = "y: step latency with the door ÷ without it (same night), median over its configurations, \
                        log scale; bar: noise interval · filled: beyond noise · x: nights, oldest left";
        let rest = title_band(root, "What each door buys: step-latency ratio against its parent sets", subtitle)?;
        let (legend, rows) = rest.split_vertically(LEGEND_ROW_PX + 12);
        let entries: Vec<(RGBColor, String)> =
            (0..self.sizes.len()).map(|i| (self.size_color(i), self.size_name(i))).collect();
        draw_grid_legend(&legend, &entries, entries.len().clamp(1, 8), Swatch::Line)?;
        let (rows, axis) = rows.split_vertically(self.doors.len() as u32 * DOOR_ROW_PX);
        for (di, area) in rows.split_evenly((self.doors.len(), 1)).iter().enumerate() {
            self.row(area, di)?;
        }
        // Night labels once, under the last row.
        let n = self.nights.len();
        let (w, _) = axis.dim_in_pixel();
        let slot = f64::from(w - NAME_PX - VERDICT_PX) / n as f64;
        let style = font(CELL_PX).pos(Pos::new(HPos::Center, VPos::Top));
        for (i, (label, _)) in self.nights.iter().enumerate() {
            let x = NAME_PX as f64 + slot * (i as f64 + 0.5);
            axis.draw_text(&clip_to_width(label, CELL_PX, slot as u32 - 4), &style, (x as i32, 6))?;
        }
        Ok(())
    }
}

impl DoorsFigure<'_> {
    fn row<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>, di: usize) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let door = &self.doors[di];
        let (w, h) = area.dim_in_pixel();
        let name = door.strip_prefix("MEMRA_").unwrap_or(door);
        let left = font(TICK_PX).pos(Pos::new(HPos::Left, VPos::Center));
        area.draw_text(&clip_to_width(name, TICK_PX, NAME_PX - 60), &left, (8, h as i32 / 2))?;
        let plot = area.margin(4, 4, NAME_PX - 56, VERDICT_PX);
        let n = self.nights.len();
        let keys = [0.5, 1.0, 2.0].into_iter().filter(|k| *k > self.lo && *k < self.hi).collect();
        let mut chart = ChartBuilder::on(&plot)
            .y_label_area_size(52)
            .build_cartesian_2d(-0.5..n as f64 - 0.5, Keyed::log(self.lo, self.hi, keys))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(230, 230, 230))
            .y_label_formatter(&|v| format!("×{v}"))
            .label_style(font(CELL_PX))
            .draw()?;
        chart
            .draw_series(LineSeries::new([(-0.5, 1.0), (n as f64 - 0.5, 1.0)], RGBColor(60, 60, 60).stroke_width(1)))?;
        let k = self.sizes.len() as f64;
        let clamp = |v: f64| v.clamp(self.lo, self.hi);
        for (ni, (_, sums)) in self.nights.iter().enumerate() {
            for (si, size) in self.sizes.iter().enumerate() {
                let Some(s) = sums.iter().find(|s| &s.door == door && (s.backend, s.tp) == *size) else { continue };
                let x = ni as f64 - 0.3 + 0.6 * (si as f64 + 0.5) / k;
                let c = self.size_color(si);
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(x, clamp(s.lo)), (x, clamp(s.hi))],
                    c.stroke_width(2),
                )))?;
                let filled = matches!(s.effect, Effect::Faster | Effect::Slower);
                let style = if filled { c.filled() } else { c.stroke_width(2) };
                chart.draw_series(std::iter::once(Circle::new((x, clamp(s.ratio)), 5, style)))?;
            }
        }
        // The last night's verdicts, one line per size (as many as fit).
        let last = self.nights.last().map(|(_, s)| s.as_slice()).unwrap_or(&[]);
        let lines: Vec<String> = self
            .sizes
            .iter()
            .enumerate()
            .filter_map(|(si, size)| {
                let s = last.iter().find(|s| &s.door == door && (s.backend, s.tp) == *size)?;
                Some(format!("{} ×{:.2} {}", self.size_name(si), s.ratio, s.effect))
            })
            .collect();
        let style = font(CELL_PX).pos(Pos::new(HPos::Left, VPos::Top));
        let fit = ((h - 8) / 18).max(1) as usize;
        for (i, l) in lines.iter().take(fit).enumerate() {
            area.draw_text(
                &clip_to_width(l, CELL_PX, VERDICT_PX - 16),
                &style,
                ((w - VERDICT_PX + 12) as i32, 4 + 18 * i as i32),
            )?;
        }
        area.draw(&PathElement::new(vec![(0, h as i32 - 1), (w as i32, h as i32 - 1)], RGBColor(200, 200, 200)))?;
        Ok(())
    }
}
