//! What every figure shares: the embedded font, sizes, colours, legends, number formats, and the
//! writing of one drawing as both SVG and PNG. Kept in one place so the figures look alike and a
//! change of font size or palette is one edit.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontDesc, FontFamily, FontStyle};

use super::PlotError;

/// DejaVu Sans 2.37 (`tools/assets/DejaVuSans.ttf`, license beside it): embedded so that PNGs get
/// their text on machines without system fonts. SVGs name the generic `sans-serif` family and
/// are rendered with the viewer's fonts.
static FONT_TTF: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Width of every figure, pixels (SVG user units and PNG pixels alike).
pub const FIGURE_WIDTH_PX: u32 = 1600;

pub(crate) const TITLE_PX: f64 = 26.0;
pub(crate) const SUBTITLE_PX: f64 = 18.0;
pub(crate) const CAPTION_PX: f64 = 19.0;
pub(crate) const AXIS_DESC_PX: f64 = 17.0;
pub(crate) const TICK_PX: f64 = 16.0;
pub(crate) const LEGEND_PX: f64 = 17.0;
pub(crate) const CELL_PX: f64 = 14.0;

/// Height of the title band (title and one subtitle line).
pub(crate) const TITLE_BAND_PX: u32 = 64;
/// Seam legend: entries per row and height of a row.
pub(crate) const SEAM_LEGEND_COLUMNS: usize = 7;
pub(crate) const LEGEND_ROW_PX: u32 = 28;

/// What a drawing function returns; any backend error, boxed.
pub(crate) type DrawResult = Result<(), Box<dyn Error + Send + Sync>>;

/// One figure, drawn the same way on the SVG and the PNG backend.
pub(crate) trait Figure {
    /// File name without extension.
    const STEM: &'static str;
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static;
}

/// A value axis (linear or logarithmic) whose ticks are exactly `keys`: category axes put a tick
/// on each category (or every k-th, [`label_indices`]) and the colour bar on round µs values.
/// plotters' own `with_key_points` wrapper loses the f64 tick formatter, so the mesh would not draw.
#[derive(Debug, Clone)]
pub(crate) struct Keyed {
    lo: f64,
    hi: f64,
    keys: Vec<f64>,
    log: bool,
}

impl Keyed {
    pub fn linear(lo: f64, hi: f64, keys: Vec<f64>) -> Self {
        Keyed { lo, hi, keys, log: false }
    }

    /// `lo` and `hi` must be positive.
    pub fn log(lo: f64, hi: f64, keys: Vec<f64>) -> Self {
        Keyed { lo, hi, keys, log: true }
    }

    fn unit(&self, v: f64) -> f64 {
        let f = |x: f64| if self.log { x.max(f64::MIN_POSITIVE).ln() } else { x };
        let span = f(self.hi) - f(self.lo);
        if span == 0.0 {
            0.5
        } else {
            (f(v) - f(self.lo)) / span
        }
    }
}

impl Ranged for Keyed {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        limit.0 + (self.unit(*value) * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Bold points only: no light mesh lines between the ticks.
        if hint.weight().allow_light_points() {
            vec![]
        } else {
            self.keys.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// Registers the embedded font once per process (plotters keeps a global font table).
pub(crate) fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font("sans-serif", FontStyle::Normal, FONT_TTF).is_ok());
    if ok {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

/// Writes `<out>/<STEM>.svg` and `<out>/<STEM>.png`; returns both paths.
pub(crate) fn render<F: Figure>(fig: &F, out: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let size = fig.size();
    let svg = out.join(format!("{}.svg", F::STEM));
    let png = out.join(format!("{}.png", F::STEM));
    let fail = |path: &Path| {
        let path = path.to_path_buf();
        move |e: Box<dyn Error + Send + Sync>| PlotError::Draw { path, detail: e.to_string() }
    };
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        paint(fig, &root).map_err(fail(&svg))?;
    }
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        paint(fig, &root).map_err(fail(&png))?;
    }
    Ok(vec![svg, png])
}

fn paint<F: Figure, DB: DrawingBackend>(fig: &F, root: &DrawingArea<DB, Shift>) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    fig.draw(root)?;
    root.present()?;
    Ok(())
}

pub(crate) fn font(px: f64) -> TextStyle<'static> {
    TextStyle::from(FontDesc::new(FontFamily::SansSerif, px, FontStyle::Normal)).color(&BLACK)
}

/// Width of `text` in pixels at `px`, as the PNG backend lays it out.
pub(crate) fn text_width(text: &str, px: f64) -> u32 {
    FontDesc::new(FontFamily::SansSerif, px, FontStyle::Normal).box_size(text).map(|(w, _)| w).unwrap_or(0)
}

/// Title (centred, large) and a grey subtitle line; returns the area below them.
pub(crate) fn title_band<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
) -> Result<DrawingArea<DB, Shift>, Box<dyn Error + Send + Sync>>
where
    DB::ErrorType: 'static,
{
    let (band, rest) = root.split_vertically(TITLE_BAND_PX);
    let w = band.dim_in_pixel().0 as i32;
    band.draw_text(title, &font(TITLE_PX).pos(Pos::new(HPos::Center, VPos::Top)), (w / 2, 8))?;
    let grey = font(SUBTITLE_PX).color(&RGBColor(80, 80, 80)).pos(Pos::new(HPos::Center, VPos::Top));
    band.draw_text(subtitle, &grey, (w / 2, 40))?;
    Ok(rest)
}

/// How a legend entry shows its colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Swatch {
    /// A filled square (bars, cells).
    Box,
    /// A line with a dot (line charts).
    Line,
}

pub(crate) fn draw_swatch<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    color: RGBColor,
    swatch: Swatch,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    match swatch {
        Swatch::Box => {
            area.draw(&Rectangle::new([(x, y - 8), (x + 18, y + 8)], color.filled()))?;
            area.draw(&Rectangle::new([(x, y - 8), (x + 18, y + 8)], RGBColor(90, 90, 90).stroke_width(1)))?;
        }
        Swatch::Line => {
            area.draw(&PathElement::new(vec![(x - 2, y), (x + 20, y)], color.stroke_width(3)))?;
            area.draw(&Circle::new((x + 9, y), 4, color.filled()))?;
        }
    }
    Ok(())
}

/// Rows needed by a legend of `n` entries laid out `columns` per row.
pub(crate) fn legend_rows(n: usize, columns: usize) -> u32 {
    n.div_ceil(columns).max(1) as u32
}

/// A legend in a fixed grid: `columns` entries per row, each `LEGEND_ROW_PX` high, centred in `area`.
pub(crate) fn draw_grid_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(RGBColor, String)],
    columns: usize,
    swatch: Swatch,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let (w, _) = area.dim_in_pixel();
    let col_w = (w as usize - 40) / columns;
    let used = columns.min(entries.len()) * col_w;
    let x0 = (w as usize - used) / 2;
    let style = font(LEGEND_PX).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (color, text)) in entries.iter().enumerate() {
        let x = (x0 + (i % columns) * col_w + 6) as i32;
        let y = ((i / columns) as u32 * LEGEND_ROW_PX + LEGEND_ROW_PX / 2) as i32;
        draw_swatch(area, (x, y), *color, swatch)?;
        area.draw_text(&clip_to_width(text, LEGEND_PX, col_w as u32 - 40), &style, (x + 26, y))?;
    }
    Ok(())
}

/// Draws a panel's caption (see [`fit_caption`]) centred at the top of `area` and returns the
/// area below it, with room for the top tick label of the chart that goes there.
pub(crate) fn captioned<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
) -> Result<DrawingArea<DB, Shift>, Box<dyn Error + Send + Sync>>
where
    DB::ErrorType: 'static,
{
    let (w, _) = area.dim_in_pixel();
    let (text, style) = fit_caption(text, w.saturating_sub(16));
    area.draw_text(&text, &style.pos(Pos::new(HPos::Center, VPos::Top)), (w as i32 / 2, 4))?;
    Ok(area.margin(CAPTION_BAND_PX, 0, 0, 0))
}

/// Height taken by a panel caption and the gap below it.
pub(crate) const CAPTION_BAND_PX: u32 = 40;

/// A panel caption that fits `max_px`: the caption size, smaller sizes down to 14 px when the
/// label is long (a label's end tells configurations apart, so shrink before clipping), and only
/// then clipped with `…`.
pub(crate) fn fit_caption(text: &str, max_px: u32) -> (String, TextStyle<'static>) {
    for px in [CAPTION_PX, 17.0, 15.5, 14.0] {
        if text_width(text, px) <= max_px {
            return (text.to_string(), font(px));
        }
    }
    (clip_to_width(text, 14.0, max_px), font(14.0))
}

/// `text`, shortened with `…` until it is at most `max_px` wide at `px`.
pub(crate) fn clip_to_width(text: &str, px: f64, max_px: u32) -> String {
    if text_width(text, px) <= max_px {
        return text.to_string();
    }
    let chars: Vec<char> = text.chars().collect();
    for n in (1..chars.len()).rev() {
        let s: String = chars[..n].iter().collect::<String>() + "…";
        if text_width(&s, px) <= max_px {
            return s;
        }
    }
    "…".to_string()
}

/// Which of `n` evenly spaced tick labels to draw so that labels `label_px` wide do not touch
/// in slots `slot_px` wide: every k-th, always the first and the last.
pub(crate) fn label_indices(n: usize, slot_px: f64, label_px: f64) -> Vec<usize> {
    if n == 0 {
        return vec![];
    }
    let k = ((label_px + 12.0) / slot_px.max(1.0)).ceil().max(1.0) as usize;
    let mut v: Vec<usize> = (0..n).step_by(k).collect();
    if *v.last().expect("n > 0") != n - 1 {
        // Keep the last label (the head, the newest set); drop its neighbour if it would touch.
        if v.len() > 1 && n - 1 - v[v.len() - 1] < k {
            v.pop();
        }
        v.push(n - 1);
    }
    v
}

/// A latency in µs for tick and cell labels: three significant digits, no exponent.
pub(crate) fn fmt_us(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// An axis tick value: as short as it can be without losing the tick's digits.
pub(crate) fn fmt_tick(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// The upper end of a value axis: `max` plus headroom for the labels above bars.
pub(crate) fn axis_top(max: f64) -> f64 {
    if max > 0.0 {
        max * 1.12
    } else {
        1.0
    }
}

/// Colour of a seam: related seams share a hue family (attention blues/purples, joins red and
/// orange, MoE greens, head pinks/browns), so the transport's join seams stand out.
pub(crate) fn seam_color(name: &str, idx: usize) -> RGBColor {
    match name {
        "attn_norm" => RGBColor(0xae, 0xc7, 0xe8),
        "qkv" => RGBColor(0x1f, 0x77, 0xb4),
        "rope" => RGBColor(0x17, 0xbe, 0xcf),
        "attn" => RGBColor(0x94, 0x67, 0xbd),
        "o_proj" => RGBColor(0xc5, 0xb0, 0xd5),
        "o_join" => RGBColor(0xd6, 0x27, 0x28),
        "ffn_norm" => RGBColor(0x98, 0xdf, 0x8a),
        "router" => RGBColor(0xbc, 0xbd, 0x22),
        "experts" => RGBColor(0x2c, 0xa0, 0x2c),
        "moe_join" => RGBColor(0xff, 0x7f, 0x0e),
        "residual" => RGBColor(0x7f, 0x7f, 0x7f),
        "final_norm" => RGBColor(0xf7, 0xb6, 0xd2),
        "logits" => RGBColor(0x8c, 0x56, 0x4b),
        _ => hsl_cycle(idx, 7),
    }
}

fn hsl_cycle(i: usize, n: usize) -> RGBColor {
    let h = (i as f64 / n.max(1) as f64) * 360.0;
    let l = [0.42, 0.62][i % 2];
    hsl_to_rgb(h, 0.65, l)
}

fn hsl_to_rgb(h: f64, s: f64, l: f64) -> RGBColor {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let hp = h / 60.0;
    let x = c * (1.0 - (hp % 2.0 - 1.0).abs());
    let (r, g, b) = match hp as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let to = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    RGBColor(to(r), to(g), to(b))
}

/// Viridis at `t` in [0, 1] (10 stops, linear between them): perceptually ordered, readable in
/// grey and by colour-blind readers.
pub(crate) fn viridis(t: f64) -> RGBColor {
    const STOPS: [(u8, u8, u8); 10] = [
        (0x44, 0x01, 0x54),
        (0x48, 0x28, 0x78),
        (0x3e, 0x49, 0x89),
        (0x31, 0x68, 0x8e),
        (0x26, 0x82, 0x8e),
        (0x1f, 0x9e, 0x89),
        (0x35, 0xb7, 0x79),
        (0x6e, 0xce, 0x58),
        (0xb5, 0xde, 0x2b),
        (0xfd, 0xe7, 0x25),
    ];
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 };
    let x = t * (STOPS.len() - 1) as f64;
    let i = (x.floor() as usize).min(STOPS.len() - 2);
    let f = x - i as f64;
    let mix = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * f).round() as u8;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Black or white, whichever reads better on `bg`.
pub(crate) fn ink_on(bg: RGBColor) -> RGBColor {
    let lum = 0.299 * f64::from(bg.0) + 0.587 * f64::from(bg.1) + 0.114 * f64::from(bg.2);
    if lum > 140.0 {
        BLACK
    } else {
        WHITE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_indices_keep_first_and_last() {
        assert_eq!(label_indices(3, 100.0, 30.0), vec![0, 1, 2]);
        assert_eq!(label_indices(62, 8.0, 30.0), vec![0, 6, 12, 18, 24, 30, 36, 42, 48, 54, 61]);
        assert_eq!(label_indices(1, 10.0, 100.0), vec![0]);
        assert!(label_indices(0, 10.0, 10.0).is_empty());
    }

    #[test]
    fn number_formats() {
        assert_eq!(fmt_us(1971.037), "1971");
        assert_eq!(fmt_us(23.826), "23.8");
        assert_eq!(fmt_us(2.394), "2.39");
        assert_eq!(fmt_us(0.6), "0.600");
        assert_eq!(fmt_tick(500.0), "500");
        assert_eq!(fmt_tick(0.25), "0.25");
    }
}
