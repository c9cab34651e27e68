//! Latency plots: files, sizes, what the text of each figure says, date order of history sets, and
//! the errors. Receipts are built here with known medians, so the numbers a figure prints can be
//! checked against sums computed by hand.

use std::collections::BTreeMap;
use std::path::Path;

use memra_receipts::schema::{
    Backend, BuildEvidence, Evidence, Measurements, ModelEvidence, Receipt, ReceiptKind, RunConfigEvidence,
    SeamDigests, SeamLatency, Transport, Verdict,
};
use memra_receipts::token_tape_digest;
use memra_tools::plot::{
    grid_shape, plot_history, plot_receipts, short_labels, PlotError, COMPARE_EXTRA_PX, COMPARE_ROW_PX,
    FIGURE_WIDTH_PX, HEATMAP_PANEL_EXTRA_PX, HEATMAP_ROW_PX, HISTORY_PANEL_PX, SEAM_ORDER, STACKED_PANEL_PX,
};

const LAYER_SEAMS: [&str; 11] =
    ["attn_norm", "qkv", "rope", "attn", "o_proj", "o_join", "ffn_norm", "router", "experts", "moe_join", "residual"];
const HEAD_SEAMS: [&str; 2] = ["final_norm", "logits"];
const N_LAYERS: usize = 2;

/// The median (µs) of `seam` at `layer` for a configuration scaled by `scale`: small seams of a
/// few µs, big ones of hundreds to thousands, every value distinct.
fn median_us(layer: usize, seam: &str, scale: f64) -> f64 {
    let base = match seam {
        "attn_norm" => 2.0,
        "qkv" => 300.0,
        "rope" => 4.0,
        "attn" => 9.0,
        "o_proj" => 120.0,
        "o_join" => 40.0,
        "ffn_norm" => 2.5,
        "router" => 5.0,
        "experts" => 1800.0,
        "moe_join" => 60.0,
        "residual" => 1.5,
        "final_norm" => 2.2,
        "logits" => 190.0,
        other => panic!("unknown seam {other}"),
    };
    (base * scale * (1.0 + 0.25 * layer as f64)).round()
}

pub(crate) fn config(tp: usize, transport: Transport, doors: &[&str]) -> RunConfigEvidence {
    RunConfigEvidence {
        subject: "memra-runtime".into(),
        backend: Backend::Host,
        tp,
        transport,
        doors: doors.iter().map(|d| (d.to_string(), true)).collect(),
        model: ModelEvidence { preset: "tiny".into(), digest: "dccead46e60bfad9".into() },
        battery_digest: "94b4ccc70972dc13".into(),
        oracle: "tp1 host-bounce defaults on host".into(),
        batch: None,
        columns: None,
    }
}

/// A PASS receipt with latencies of every seam of 2 layers and the head (`scale` × the base
/// medians), or, with `timed == false`, a SKIP receipt without any.
pub(crate) fn receipt(cfg: RunConfigEvidence, scale: f64, started_at_unix_ms: u64, timed: bool) -> Receipt {
    let mut latency = Vec::new();
    if timed {
        for layer in 0..=N_LAYERS {
            let seams: &[&str] = if layer < N_LAYERS { &LAYER_SEAMS } else { &HEAD_SEAMS };
            for seam in seams {
                let med = (median_us(layer, seam, scale) * 1e3) as u64;
                latency.push(SeamLatency {
                    layer,
                    seam: seam.to_string(),
                    n_samples: 40,
                    min_ns: med * 9 / 10,
                    median_ns: med,
                    p90_ns: med * 12 / 10,
                    max_ns: med * 2,
                });
            }
        }
    }
    let evidence = Evidence {
        config: cfg,
        build: BuildEvidence { kernel_source_digest: "abcd".into(), nvrtc_options: vec![], subject_version: None },
        verdict: if timed { Verdict::Pass } else { Verdict::Skip },
        reason: if timed { None } else { Some("no peer access from rank 0 to rank 1".into()) },
        gates: vec![],
        engaged: BTreeMap::new(),
        census: BTreeMap::new(),
        census_witness: None,
        coverage: BTreeMap::new(),
        claims: vec![],
        planted: None,
        first_divergence: None,
        digests: SeamDigests { columns: vec![], rows: vec![] },
        tokens: vec![],
        token_tape_digest: token_tape_digest(&[]),
        error_budget: vec![],
        near_ties: vec![],
        performance: None,
    };
    let measurements = Measurements {
        latency,
        wall_ms: 1234.5,
        host: "linux x86_64 (2 cores)".into(),
        device: None,
        p2p_probe: vec![],
        started_at_unix_ms,
        extra: BTreeMap::new(),
    };
    let r = Receipt::new(ReceiptKind::Run, evidence, measurements);
    r.validate().expect("the test builds valid receipts");
    r
}

/// TP1/TP2 × host-bounce/native-p2p with defaults, a door set, and a SKIP run without latency.
/// Returns the receipts and the labels the plots must show for the timed ones.
fn matrix() -> (Vec<Receipt>, Vec<&'static str>) {
    let t0 = 1_764_400_000_000;
    let receipts = vec![
        receipt(config(2, Transport::NativeP2p, &["MEMRA_STEP_EP"]), 1.7, t0 + 5, true),
        receipt(config(1, Transport::HostBounce, &[]), 1.0, t0, true),
        receipt(config(2, Transport::HostBounce, &[]), 0.6, t0 + 2, true),
        receipt(config(1, Transport::NativeP2p, &[]), 1.1, t0 + 1, true),
        receipt(config(2, Transport::NativeP2p, &["MEMRA_OPROJ_DIRECT"]), 1.0, t0 + 6, false),
        receipt(config(2, Transport::NativeP2p, &[]), 0.8, t0 + 3, true),
    ];
    // Plot order: TP, then doors (defaults first), then transport.
    let labels = vec![
        "tp1 host-bounce defaults",
        "tp1 native-p2p defaults",
        "tp2 host-bounce defaults",
        "tp2 native-p2p defaults",
        "tp2 native-p2p +STEP_EP",
    ];
    (receipts, labels)
}

/// Every `<text>` of an SVG: (content, x, y).
pub(crate) fn svg_texts(path: &Path) -> Vec<(String, f64, f64)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc =
        roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{} is not well-formed XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg", "{}", path.display());
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| {
            let at = |a: &str| n.attribute(a).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
            (n.text().unwrap_or("").trim().to_string(), at("x"), at("y"))
        })
        .collect()
}

pub(crate) fn svg_size(path: &Path) -> (u32, u32) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let root = doc.root_element();
    let dim = |a: &str| root.attribute(a).unwrap_or_else(|| panic!("{} has no {a}", path.display())).parse().unwrap();
    (dim("width"), dim("height"))
}

/// (width, height, RGB pixels) of a PNG.
pub(crate) fn read_png(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader =
        png::Decoder::new(file).read_info().unwrap_or_else(|e| panic!("{} is not a PNG: {e}", path.display()));
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let samples = info.color_type.samples();
    assert!(samples >= 3, "{}: expected RGB(A), got {:?}", path.display(), info.color_type);
    let pixels = buf[..info.buffer_size()].chunks(samples).map(|p| [p[0], p[1], p[2]]).collect();
    (info.width, info.height, pixels)
}

pub(crate) fn seam_legend_px(n_seams: u32) -> u32 {
    n_seams.div_ceil(7) * 28 + 12
}

#[test]
fn plot_receipts_writes_each_figure_as_svg_and_png_of_the_documented_size() {
    let (receipts, labels) = matrix();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plots"); // created by plot_receipts
    let files = plot_receipts(&receipts, &out).unwrap();
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(
        names,
        [
            "latency-stacked.svg",
            "latency-stacked.png",
            "latency-heatmap.svg",
            "latency-heatmap.png",
            "latency-compare.svg",
            "latency-compare.png"
        ]
    );
    let n = labels.len();
    let (rows, _) = grid_shape(n);
    assert_eq!(grid_shape(5), (2, 3));
    let seams = SEAM_ORDER.len() as u32;
    let expected: BTreeMap<&str, (u32, u32)> = [
        ("latency-stacked", (FIGURE_WIDTH_PX, 64 + seam_legend_px(seams) + rows as u32 * STACKED_PANEL_PX)),
        ("latency-heatmap", (FIGURE_WIDTH_PX, 64 + rows as u32 * (HEATMAP_PANEL_EXTRA_PX + seams * HEATMAP_ROW_PX))),
        (
            "latency-compare",
            (FIGURE_WIDTH_PX, 64 + seam_legend_px(seams) + COMPARE_EXTRA_PX + n as u32 * COMPARE_ROW_PX),
        ),
    ]
    .into_iter()
    .collect();
    for path in &files {
        assert!(path.starts_with(&out), "{} is not under {}", path.display(), out.display());
        let len = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).len();
        assert!(len > 1000, "{} has only {len} bytes", path.display());
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let want = expected[stem];
        if path.extension().unwrap() == "svg" {
            assert_eq!(svg_size(path), want, "{}", path.display());
            svg_texts(path); // well-formed
        } else {
            let (w, h, px) = read_png(path);
            assert_eq!((w, h), want, "{}", path.display());
            // Text was rendered with the embedded font: the title band has dark pixels.
            let dark_in_title = px[..(64 * w) as usize].iter().filter(|p| p.iter().all(|c| *c < 80)).count();
            assert!(dark_in_title > 500, "{}: only {dark_in_title} dark pixels in the title band", path.display());
            // The experts seam (the largest) is drawn in its colour in the stacked and compare bars.
            if stem != "latency-heatmap" {
                let experts = px.iter().filter(|p| **p == [0x2c, 0xa0, 0x2c]).count();
                assert!(experts > 2000, "{}: only {experts} pixels of the experts colour", path.display());
            }
        }
    }
}

#[test]
fn every_configuration_label_appears_in_every_figure_and_skipped_runs_in_none() {
    let (receipts, labels) = matrix();
    let dir = tempfile::tempdir().unwrap();
    let files = plot_receipts(&receipts, dir.path()).unwrap();
    for svg in files.iter().filter(|p| p.extension().unwrap() == "svg") {
        let texts: Vec<String> = svg_texts(svg).into_iter().map(|(t, ..)| t).collect();
        for label in &labels {
            assert!(texts.iter().any(|t| t == label), "{}: no text {label:?} in {texts:?}", svg.display());
        }
        assert!(!texts.iter().any(|t| t.contains("OPROJ_DIRECT")), "{}: the SKIP run is drawn", svg.display());
        // What all runs share is said once, in the subtitle.
        assert!(texts.iter().any(|t| t.starts_with("memra-runtime/tiny on host")), "{}", svg.display());
        let name = svg.file_name().unwrap().to_str().unwrap();
        if name != "latency-heatmap.svg" {
            // The seam legend names every seam.
            for seam in SEAM_ORDER {
                assert!(texts.iter().any(|t| t == seam), "{name}: no legend entry {seam:?}");
            }
        }
        assert!(texts.iter().any(|t| t.contains("(µs)")), "{name}: no axis label with its unit");
    }
    let timed: Vec<&Receipt> = receipts.iter().filter(|r| !r.measurements.latency.is_empty()).collect();
    let cfgs: Vec<&RunConfigEvidence> = timed.iter().map(|r| &r.evidence.config).collect();
    let ids: Vec<&str> = timed.iter().map(|r| r.run_id.as_str()).collect();
    let mut short = short_labels(&cfgs, &ids);
    short.sort();
    let mut want: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(short, want);
}

#[test]
fn printed_numbers_are_the_medians_and_their_sums() {
    let (receipts, _) = matrix();
    let dir = tempfile::tempdir().unwrap();
    plot_receipts(&receipts, dir.path()).unwrap();
    let texts =
        |name: &str| -> Vec<String> { svg_texts(&dir.path().join(name)).into_iter().map(|(t, ..)| t).collect() };
    let scale = 1.7; // tp2 native-p2p +STEP_EP
                     // Heat map cell: the median itself (≥ 100 µs: no decimals).
    let experts_l1 = median_us(1, "experts", scale);
    assert_eq!(experts_l1, 3825.0);
    assert!(texts("latency-heatmap.svg").contains(&"3825".to_string()));
    // A small seam keeps three significant digits: attn_norm L0 = 3.4 µs → "3.40".
    assert!(texts("latency-heatmap.svg").contains(&format!("{:.2}", median_us(0, "attn_norm", scale))));
    // Stacked bar: the layer total above the bar (sum of its seam medians).
    let layer1: f64 = LAYER_SEAMS.iter().map(|s| median_us(1, s, scale)).sum();
    assert!(texts("latency-stacked.svg").contains(&format!("{layer1:.0}")), "no layer total {layer1:.0}");
    // Compare bar: the decode step total, over every layer and seam.
    let total: f64 = (0..N_LAYERS)
        .flat_map(|l| LAYER_SEAMS.iter().map(move |s| median_us(l, s, scale)))
        .chain(HEAD_SEAMS.iter().map(|s| median_us(N_LAYERS, s, scale)))
        .sum();
    assert!(texts("latency-compare.svg").contains(&format!("{total:.0}")), "no step total {total:.0}");
}

#[test]
fn the_same_receipts_give_byte_identical_files() {
    let (receipts, _) = matrix();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let fa = plot_receipts(&receipts, a.path()).unwrap();
    let mut reversed = receipts.clone();
    reversed.reverse();
    let fb = plot_receipts(&reversed, b.path()).unwrap();
    for (x, y) in fa.iter().zip(&fb) {
        assert_eq!(x.file_name(), y.file_name());
        assert!(std::fs::read(x).unwrap() == std::fs::read(y).unwrap(), "{} differs between runs", x.display());
    }
}

#[test]
fn receipts_without_latency_are_an_error_and_write_nothing() {
    let skipped = vec![
        receipt(config(2, Transport::NativeP2p, &[]), 1.0, 1, false),
        receipt(config(4, Transport::NativeP2p, &[]), 1.0, 2, false),
    ];
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plots");
    let err = plot_receipts(&skipped, &out).unwrap_err();
    assert!(matches!(err, PlotError::NoLatency { n_receipts: 2 }), "{err:?}");
    assert!(err.to_string().starts_with("no latency samples in any of the 2 receipt(s): nothing to plot"), "{err}");
    assert!(!out.exists(), "an error must not create {}", out.display());
    assert!(matches!(plot_receipts(&[], &out), Err(PlotError::NoLatency { n_receipts: 0 })));
}

#[test]
fn the_same_run_twice_is_an_error_naming_it() {
    let r = receipt(config(1, Transport::HostBounce, &[]), 1.0, 1, true);
    let err = plot_receipts(&[r.clone(), r.clone()], tempfile::tempdir().unwrap().path()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PlotError::DuplicateRun { .. }), "{err:?}");
    assert!(msg.contains(&r.run_id) && msg.contains("appears twice"), "{msg}");
}

#[test]
fn short_labels_keep_what_differs_and_disambiguate_collisions() {
    let a = config(1, Transport::HostBounce, &[]);
    let mut b = config(8, Transport::Nccl, &["MEMRA_STEP_EP"]);
    b.backend = Backend::Cuda;
    let mut c = config(1, Transport::HostBounce, &[]);
    c.oracle = "another oracle".into(); // same label, different run
    let ids = ["1111111111111111", "2222222222222222", "3333333333333333"];
    let labels = short_labels(&[&a, &b, &c], &ids);
    assert_eq!(
        labels,
        ["host tp1 host-bounce defaults #111111", "cuda tp8 nccl +STEP_EP", "host tp1 host-bounce defaults #333333"]
    );
    let mut d = config(2, Transport::NativeP2p, &[]);
    d.doors = ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M"]
        .iter()
        .map(|x| (format!("MEMRA_DOOR_{x}"), true))
        .collect();
    let long = &short_labels(&[&d], &["4444444444444444"])[0];
    assert!(long.starts_with("tp2 native-p2p +DOOR_A +DOOR_B") && long.ends_with('…'), "{long}");
    assert!(long.chars().count() <= "tp2 native-p2p ".len() + 44, "{long}");
}

pub(crate) fn history_sets() -> Vec<(String, Vec<Receipt>)> {
    let day = 86_400_000;
    let t0 = 1_764_400_000_000;
    let set = |days: u64, scale: f64| -> Vec<Receipt> {
        vec![
            receipt(config(1, Transport::HostBounce, &[]), scale, t0 + days * day + 60_000, true),
            receipt(config(2, Transport::NativeP2p, &[]), scale * 0.7, t0 + days * day, true),
        ]
    };
    // Neither the argument order nor the label order is the date order.
    vec![("mike".to_string(), set(2, 1.3)), ("zulu".to_string(), set(0, 1.0)), ("alpha".to_string(), set(1, 1.1))]
}

#[test]
fn history_draws_sets_in_date_order() {
    let dir = tempfile::tempdir().unwrap();
    let files = plot_history(&history_sets(), dir.path(), true).unwrap();
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["latency-history.svg", "latency-history.png"]);
    let texts = svg_texts(&files[0]);
    // The first panel's tick labels: the x of each set's first label, oldest at the left.
    let at = |label: &str| {
        let (_, x, y) =
            texts.iter().find(|(t, ..)| t == label).unwrap_or_else(|| panic!("no x label {label:?} in the history"));
        (*x, *y)
    };
    let ((zulu, y), (alpha, _), (mike, _)) = (at("zulu"), at("alpha"), at("mike"));
    assert!(zulu < alpha && alpha < mike, "x of zulu {zulu}, alpha {alpha}, mike {mike}: not in date order");
    // …and under the first panel's plot: below its middle, above its bottom.
    let panel_top = f64::from(64 + seam_legend_px(SEAM_ORDER.len() as u32));
    let panel_bottom = panel_top + f64::from(HISTORY_PANEL_PX);
    assert!(
        y > (panel_top + panel_bottom) / 2.0 && y < panel_bottom,
        "set label at y {y}, panel {panel_top}..{panel_bottom}"
    );
    assert!(mike < f64::from(FIGURE_WIDTH_PX) / 2.0, "set label at x {mike}: not in the first of two panels");
    // Each label has its date (UTC) under it; the earliest start of the set is its date.
    // All sets are of 2025: the year is said once, in the subtitle.
    for date in ["11-29 07:06", "11-30 07:06", "12-01 07:06"] {
        assert!(texts.iter().any(|(t, ..)| t == date), "no date {date}");
    }
    assert!(texts.iter().any(|(t, ..)| t.ends_with("by earliest start (UTC, 2025)")), "no year in the subtitle");
    for label in ["tp1 host-bounce defaults", "tp2 native-p2p defaults"] {
        assert!(texts.iter().any(|(t, ..)| t == label), "no panel for {label}");
    }
    for seam in SEAM_ORDER {
        assert!(texts.iter().any(|(t, ..)| t == seam), "no legend entry {seam:?}");
    }
    let (w, h, _) = read_png(&files[1]);
    let want = (FIGURE_WIDTH_PX, 64 + seam_legend_px(SEAM_ORDER.len() as u32) + HISTORY_PANEL_PX);
    assert_eq!((w, h), want);
    assert_eq!(svg_size(&files[0]), want);
}

#[test]
fn history_errors_name_the_set_and_the_rule() {
    let out = tempfile::tempdir().unwrap();
    let msg = |sets: &[(String, Vec<Receipt>)]| plot_history(sets, out.path(), true).unwrap_err().to_string();

    assert!(matches!(plot_history(&[], out.path(), true), Err(PlotError::NoSets)));

    let mut sets = history_sets();
    sets[1].1.clear();
    assert_eq!(msg(&sets), "receipt set \"zulu\" holds no receipts: it has no date to be ordered by");

    let mut sets = history_sets();
    sets[2].0 = "mike".into();
    assert_eq!(msg(&sets), "receipt set label \"mike\" is given twice: each set needs its own label");

    let mut sets = history_sets();
    let again = sets[0].1[0].clone();
    sets[0].1.push(again);
    let m = msg(&sets);
    assert!(m.contains("appears twice in receipt set \"mike\""), "{m}");

    let skipped: Vec<(String, Vec<Receipt>)> = ["a", "b"]
        .iter()
        .map(|l| (l.to_string(), vec![receipt(config(2, Transport::NativeP2p, &[]), 1.0, 5, false)]))
        .collect();
    assert!(msg(&skipped).starts_with("no latency samples in any of the 2 receipt(s)"));
}
