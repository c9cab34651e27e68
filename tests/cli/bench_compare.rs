//! `memra-gates bench --compare BASE.json [--against NEW.json]` (METRICS.md, "bench", "--compare"): a
//! receipt against itself is no regression (exit 0); against a base whose samples are made 3×
//! faster — the real receipt with its latencies edited, no expected number typed in — it is a
//! regression (SLOWER rows, exit 3), whether the new side is the same receipt or a fresh run; a
//! base of another shape or another machine is refused naming the field and both values (exit 2).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::*;

const REGRESSION: i32 = 3;

/// `bench` on the host backend, `tiny`, few steps, with `extra`.
fn bench_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["bench", "--backend", "host", "--allow-host", "--no-torch", "--preset", "tiny", "--steps", "8"];
    a.extend_from_slice(extra);
    a
}

/// The one receipt file in `dir`.
fn receipt_in(dir: &Path) -> PathBuf {
    let names = receipt_names(dir);
    assert_eq!(names.len(), 1, "{} holds {names:?}", dir.display());
    dir.join(&names[0])
}

/// `src` with every latency sample statistic divided by `div` (rounded down; the order min ≤
/// median ≤ p90 ≤ max survives), written to `dst`.
fn scaled(src: &Path, dst: &Path, edit: impl Fn(u64) -> u64) -> PathBuf {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    let latency = v["measurements"]["latency"].as_array_mut().expect("a receipt has latencies");
    assert!(!latency.is_empty());
    for e in latency {
        for k in ["min_ns", "median_ns", "p90_ns", "max_ns"] {
            e[k] = Value::from(edit(e[k].as_u64().unwrap()));
        }
    }
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    std::fs::write(dst, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    dst.to_path_buf()
}

/// The effects printed in the comparison table (the last column of its rows).
fn effects(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter(|l| l.starts_with('L') || l.starts_with("head.") || l.starts_with("step "))
        .filter_map(|l| {
            let last = l.split_whitespace().last()?;
            ["FASTER", "SAME", "SLOWER", "AMBIGUOUS"].contains(&last).then(|| (l.to_string(), last.to_string()))
        })
        .collect()
}

#[test]
fn a_receipt_against_itself_is_no_regression_and_against_a_3x_faster_base_it_regresses() {
    let dir = tempdir();
    let a = dir.path().join("a");
    run(&bench_args(&["--out", s(&a)])).expect_code(0);
    let f = receipt_in(&a);

    // Itself: ratio 1 everywhere, nothing beyond noise.
    let same = run(&["bench", "--compare", s(&f), "--against", s(&f)]);
    same.expect_code(0).expect_stdout(&["verdict: no regression", "0 FASTER", "0 SLOWER"]);
    let rows = effects(&same.stdout);
    assert!(rows.len() >= 2 * 11 + 2, "too few rows compared:\n{}", same.stdout);
    assert!(rows.iter().all(|(_, e)| e == "SAME" || e == "AMBIGUOUS"), "{}", same.stdout);

    // A base 3× faster than the receipt: the receipt is slower beyond noise somewhere, faster nowhere.
    let fast = scaled(&f, &dir.path().join("fast/base.json"), |ns| ns / 3);
    let out = run(&["bench", "--compare", s(&fast), "--against", s(&f)]);
    out.expect_code(REGRESSION).expect_stdout(&["verdict: REGRESSION", "exit status 3"]);
    let rows = effects(&out.stdout);
    assert!(rows.iter().any(|(_, e)| e == "SLOWER"), "{}", out.stdout);
    assert!(rows.iter().all(|(_, e)| e != "FASTER"), "{}", out.stdout);
    // The ratios are the edit's: every seam's median ratio is about 3 — the base's nanoseconds
    // are integers divided by 3, so a seam of a few hundred ns (the residual's marks, where the
    // moe_join's kernel computed it) reads up to about ×3.1.
    let ratio = |l: &str| l.split_whitespace().find_map(|w| w.strip_prefix('×')?.parse::<f64>().ok());
    let slower: Vec<&(String, String)> = rows.iter().filter(|(_, e)| e == "SLOWER").collect();
    assert!(slower.iter().all(|(l, _)| ratio(l).is_some_and(|r| (2.9..=3.2).contains(&r))), "{slower:?}");

    // A fresh run against the 3×-faster base (timing: the machine to this test alone).
    let _alone = machine_alone();
    let live = run_alone(&bench_args(&["--compare", s(&fast)]));
    live.expect_code(REGRESSION).expect_stdout(&["verdict: REGRESSION"]);
    // And against a base 3× slower: faster, never a regression.
    let slow = scaled(&f, &dir.path().join("slow/base.json"), |ns| ns * 3);
    let live = run_alone(&bench_args(&["--compare", s(&slow)]));
    live.expect_code(0).expect_stdout(&["verdict: no regression", "0 SLOWER"]);
    assert!(effects(&live.stdout).iter().any(|(_, e)| e == "FASTER"), "{}", live.stdout);
}

#[test]
fn an_incomparable_base_is_refused_naming_the_field_and_both_values() {
    let dir = tempdir();
    let (a, b) = (dir.path().join("a"), dir.path().join("b2"));
    run(&bench_args(&["--out", s(&a)])).expect_code(0);
    run(&bench_args(&["--batch", "2", "--out", s(&b)])).expect_code(0);
    let (f, b2) = (receipt_in(&a), receipt_in(&b));

    let out = run(&["bench", "--compare", s(&f), "--against", s(&b2)]);
    out.expect_code(2).expect_stderr(&["not comparable", "batch is 1 in the base and 2"]);
    assert!(!out.stdout.contains("verdict"), "judged an incomparable base:\n{}", out.transcript());

    // Another machine: the same receipt with another host description.
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    v["measurements"]["host"] = Value::from("linux riscv64 (64 cores)");
    let other = dir.path().join("other.json");
    std::fs::write(&other, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    run(&["bench", "--compare", s(&other), "--against", s(&f)])
        .expect_code(2)
        .expect_stderr(&["device is linux riscv64 (64 cores) in the base"]);

    // A fresh run against a base of another shape is refused too, before anything is timed.
    let out = run(&bench_args(&["--compare", s(&b2)]));
    out.expect_code(2).expect_stderr(&["batch is 2 in the base and 1"]);
    assert!(!out.stdout.contains("bytes MB"), "timed before refusing:\n{}", out.transcript());
    // --against without --compare is a usage error.
    run(&["bench", "--against", s(&f)]).expect_code(2);
}

#[test]
fn a_timed_door_set_is_named_in_the_receipt_and_another_set_is_not_comparable() {
    let dir = tempdir();
    let (plain, v2) = (dir.path().join("plain"), dir.path().join("v2"));
    run(&bench_args(&["--batch", "2", "--out", s(&plain)])).expect_code(0);
    let rows = ["--batch", "2", "--door", "decode_v2", "--door", "f32_mirror"];
    let out = run(&bench_args(&[&rows[..], &["--out", s(&v2)]].concat()));
    out.expect_code(0).expect_stdout(&["doors timed: MEMRA_STEP_TP_DECODE_V2=true MEMRA_STEP_TP_F32_MIRROR=true"]);
    let (p, v) = (receipt_in(&plain), receipt_in(&v2));
    let receipt: Value = serde_json::from_str(&std::fs::read_to_string(&v).unwrap()).unwrap();
    let doors = &receipt["evidence"]["config"]["doors"];
    assert_eq!(doors["MEMRA_STEP_TP_DECODE_V2"], Value::Bool(true), "{doors}");
    assert_eq!(receipt["evidence"]["verdict"], "PASS", "{}", receipt["evidence"]);
    run(&["bench", "--compare", s(&p), "--against", s(&v)])
        .expect_code(2)
        .expect_stderr(&["doors is defaults in the base and MEMRA_STEP_TP_DECODE_V2=true"]);
    // A door without work at the pass shape, or without its requirement, is refused before timing.
    for (flags, says) in [
        (&["--door", "decode_v2", "--door", "f32_mirror"][..], "decode_v2 at single"),
        (&["--batch", "2", "--door", "decode_v2"][..], "requires MEMRA_STEP_TP_F32_MIRROR=1"),
    ] {
        let out = run(&bench_args(flags));
        out.expect_code(2).expect_stderr(&[says]);
        assert!(!out.stdout.contains("bytes MB"), "timed before refusing:\n{}", out.transcript());
    }
}
