//! Door effects on the command line (docs/DESIGN.md §7): `run` writes `door-effects.json` beside
//! its summary, `effects` states each door against its parent sets and the cost of exactness,
//! `plot --doors` draws the door chart; a set without any parent pair has nothing to draw.

use crate::util::*;

#[test]
fn run_writes_door_effects_and_effects_and_plot_doors_state_them() {
    let dir = tempdir();
    let out = dir.path().join("night");
    let pairs = repo(".ci/door-pairs.toml");
    run(&short_host_run("2", &out, &["--matrix", s(&pairs), "--transport", "native-p2p", "--batch", "1", "--quiet"]))
        .expect_code(0);
    let effects = memra_receipts::effect::read_effects(&out.join("door-effects.json")).expect("run wrote it");
    // {} ← {f32_mirror}, {} ← {oproj_direct}, {oproj_direct} ← {oproj_direct, oproj_tail}.
    let mut doors: Vec<&str> = effects.effects.iter().map(|e| e.door.as_str()).collect();
    doors.sort();
    assert_eq!(doors, ["MEMRA_OPROJ_DIRECT", "MEMRA_OPROJ_TAIL", "MEMRA_STEP_TP_F32_MIRROR"]);
    assert_eq!(effects.exactness_cost.len(), 1, "{:?}", effects.exactness_cost);
    let text = run(&["effects", s(&out), "--no-write"]);
    text.expect_code(0).expect_stdout(&["| OPROJ_DIRECT | host | 2 |", "Cost of exactness", "host tp2 native-p2p ×"]);
    let plots = dir.path().join("plots");
    run(&["plot", "--doors", s(&out), "--out", s(&plots)]).expect_code(0);
    assert!(plots.join("door-effects.png").is_file() && plots.join("door-effects.svg").is_file());

    // The control: the baseline alone pairs nothing, and the chart says why instead of drawing.
    let base_sets = dir.path().join("base.toml");
    std::fs::write(&base_sets, "schema_version = 1\nsets = [[]]\n").unwrap();
    let only_base = dir.path().join("base");
    run(&short_host_run(
        "2",
        &only_base,
        &["--matrix", s(&base_sets), "--transport", "native-p2p", "--batch", "1", "--quiet"],
    ))
    .expect_code(0);
    run(&["plot", "--doors", s(&only_base), "--out", s(&plots)]).expect_code(2).expect_stderr(&["no door effect"]);
}
