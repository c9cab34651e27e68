//! `plot_doors` (the door chart) and the one-screen default of `plot_history`.

use memra_receipts::effect::{door_effects, door_nights, DoorNight};
use memra_receipts::schema::{Receipt, Transport};
use memra_tools::plot::{
    doors_figure_height, plot_doors, plot_history, PlotError, FIGURE_WIDTH_PX, HISTORY_PANEL_PX, SEAM_ORDER,
};

use crate::plot::{config, history_sets, read_png, receipt, seam_legend_px, svg_size, svg_texts};

/// One night of receipts at TP1 and TP2: MEMRA_FAST makes every seam ×`fast`, MEMRA_SLOW ×1.5.
fn night(day: u64, fast: f64) -> (String, Vec<DoorNight>) {
    let t = 1_764_400_000_000 + day * 86_400_000;
    let mut rs: Vec<Receipt> = Vec::new();
    for tp in [1, 2] {
        rs.push(receipt(config(tp, Transport::HostBounce, &[]), 1.0, t, true));
        rs.push(receipt(config(tp, Transport::HostBounce, &["MEMRA_FAST"]), fast, t, true));
        rs.push(receipt(config(tp, Transport::HostBounce, &["MEMRA_SLOW"]), 1.5, t, true));
    }
    (format!("night{day}"), door_nights(&door_effects(&rs)))
}

#[test]
fn the_door_chart_has_a_row_per_door_and_names_the_last_nights_verdicts() {
    let nights = vec![night(0, 0.9), night(1, 0.5)];
    let dir = tempfile::tempdir().unwrap();
    let files = plot_doors(&nights, dir.path()).unwrap();
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["door-effects.svg", "door-effects.png"]);
    let texts = svg_texts(&files[0]);
    let has = |t: &str| texts.iter().any(|(x, ..)| x == t);
    for t in ["FAST", "SLOW", "night0", "night1", "tp1", "tp2", "×1"] {
        assert!(has(t), "no text {t:?} in {:?}", texts.iter().map(|t| &t.0).collect::<Vec<_>>());
    }
    // The right margin states the last night: the receipts' spread (0.9–1.2 of the median) is
    // wider than ×0.9 but not than ×0.5, so night 1 says FASTER for MEMRA_FAST.
    let fast = nights[1].1.iter().find(|s| s.door == "MEMRA_FAST" && s.tp == 2).unwrap();
    assert!(has(&format!("tp2 ×{:.2} {}", fast.ratio, fast.effect)), "{fast:?}");
    assert_eq!(fast.effect.as_str(), "FASTER");
    let early = nights[0].1.iter().find(|s| s.door == "MEMRA_FAST" && s.tp == 2).unwrap();
    assert_ne!(early.effect.as_str(), "FASTER", "a 10% gain inside a 30% spread is not a gain: {early:?}");
    let want = (FIGURE_WIDTH_PX, doors_figure_height(2));
    assert_eq!(svg_size(&files[0]), want);
    assert_eq!(read_png(&files[1]).0, want.0);
    // Nights without any door effect: an error that says why.
    let e = plot_doors(&[("n".to_string(), vec![])], dir.path()).unwrap_err();
    assert!(matches!(e, PlotError::NoDoorEffects { n_nights: 1 }), "{e}");
    assert!(e.to_string().contains("parent set"), "{e}");
}

#[test]
fn the_default_history_is_one_panel_of_medians_and_per_config_keeps_the_panels() {
    let dir = tempfile::tempdir().unwrap();
    let files = plot_history(&history_sets(), dir.path(), false).unwrap();
    let texts = svg_texts(&files[0]);
    assert!(texts.iter().any(|(t, ..)| t == "median over 2 configuration(s)"), "no collapsed caption");
    assert!(!texts.iter().any(|(t, ..)| t == "tp1 host-bounce defaults"), "a per-configuration panel in the default");
    let want = (FIGURE_WIDTH_PX, 64 + seam_legend_px(SEAM_ORDER.len() as u32) + HISTORY_PANEL_PX);
    assert_eq!(svg_size(&files[0]), want, "one panel row");
}
