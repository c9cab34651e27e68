//! `memra-gates diff OLD NEW` (docs/DESIGN.md §5): pairs runs by run id, is quiet about identical sets, and
//! exits non-zero on a real verdict regression.
//!
//! The regression is real, not hand-typed: the FAIL receipt of a run with the flip-bit canary is
//! re-labelled (through the receipts library, which recomputes the run id and validates) as the
//! clean configuration's receipt, exactly what a PR that planted that defect would produce.
//! Latency is compared with `--threshold 1e9` where the test is about verdicts and digests: a few
//! timed host steps on a shared machine move by more than 5% between any two runs.

use std::path::Path;

use memra_receipts::{store, Verdict};
use serde_json::Value;

use crate::util::*;

fn small(out_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut all = vec!["--transport", "host-bounce", "--quiet"];
    all.extend_from_slice(extra);
    let args = short_host_run("1", out_dir, &all);
    run_env(&args, env)
}

fn diff_json(old: &Path, new: &Path, code: i32) -> Value {
    let out = run(&["diff", s(old), s(new), "--format", "json", "--threshold", "1e9"]);
    out.expect_code(code);
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("diff --format json is not JSON: {e}\n{}", out.transcript()))
}

#[test]
fn diff_of_identical_sets_is_quiet_and_a_planted_defect_is_a_regression() {
    let dir = tempdir();
    let (clean, clean2, canary, tampered) =
        (dir.path().join("clean"), dir.path().join("clean2"), dir.path().join("canary"), dir.path().join("pr"));
    small(&clean, &[], &[]).expect_code(0);
    small(&clean2, &[], &[]).expect_code(0);
    // The flipped bit at L0.o_join step 1: the canary run FAILs (exit 1).
    small(&canary, &["--door", "canary_flip_bit"], &[("MEMRA_CANARY_FLIP_AT", "0:o_join:1")]).expect_code(1);

    // The same directory on both sides: nothing changed, exit 0 whatever the latency.
    let same = run(&["diff", s(&clean), s(&clean)]);
    same.expect_code(0).expect_stdout(&[
        "no regression",
        "1 paired (1 unchanged)",
        "0 verdict changes",
        "0 digest changes",
    ]);

    // Two independent runs of the same configuration pair up with no verdict or digest change.
    let v = diff_json(&clean, &clean2, 0);
    assert_eq!(v["regressed"], false);
    for (k, n) in [("paired", 1), ("verdict_changes", 0), ("digest_changes", 0), ("added", 0), ("missing", 0)] {
        assert_eq!(v["counts"][k], n, "counts.{k} of two clean runs\n{v:#}");
    }

    // Build the PR's receipt set: the clean set with its one receipt replaced by the canary's
    // evidence under the clean configuration.
    let (_, clean_receipt) = read_receipts(&clean).pop().unwrap();
    let (_, mut failing) = read_receipts(&canary).pop().unwrap();
    assert_eq!(failing.evidence.verdict, Verdict::Fail, "the canary run did not fail: {:?}", failing.evidence.reason);
    failing.evidence.config.doors = clean_receipt.evidence.config.doors.clone();
    failing.run_id = memra_receipts::run_id(&failing.evidence.config);
    assert_eq!(failing.run_id, clean_receipt.run_id, "the canary's config differs from the clean one beyond its door");
    std::fs::create_dir_all(&tampered).unwrap();
    store::write_receipt(&tampered, &failing).expect("the re-labelled receipt is valid");

    let v = diff_json(&clean, &tampered, 1);
    assert_eq!(v["regressed"], true, "{v:#}");
    assert_eq!(v["counts"]["paired"], 1);
    assert_eq!(v["counts"]["verdict_changes"], 1, "{v:#}");
    let change = &v["verdict_changes"][0];
    assert_eq!(change["run_id"], clean_receipt.run_id.as_str());
    assert_eq!(
        (change["old"].as_str(), change["new"].as_str(), change["regression"].as_bool()),
        (Some("PASS"), Some("FAIL"), Some(true))
    );
    assert!(change["first_divergence"].as_str().is_some_and(|d| d.contains("L0.o_join")), "{change:#}");
    assert!(v["counts"]["digest_changes"].as_u64() >= Some(1), "the flipped bit changed no digest?\n{v:#}");

    // The Markdown report for a PR comment says so in its headline and names the place.
    let md = run(&["diff", s(&clean), s(&tampered), "--threshold", "1e9"]);
    md.expect_code(1).expect_stdout(&["REGRESSED", "PASS", "FAIL", "L0.o_join"]);

    // The other way round is a verdict change but not a regression: exit 0.
    let v = diff_json(&tampered, &clean, 0);
    assert_eq!(v["counts"]["verdict_changes"], 1, "{v:#}");
    assert_eq!(v["verdict_changes"][0]["regression"], false, "{v:#}");

    // A run that disappeared is a regression (lost coverage), not silence.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let v = diff_json(&clean, &empty, 1);
    assert_eq!(v["counts"]["missing"], 1, "{v:#}");
    assert_eq!(v["missing"][0]["run_id"], clean_receipt.run_id.as_str(), "{v:#}");
}

/// A changed host twin on a host night (issue 26, planted in the receipts a rebuilt night writes):
/// the oracle and every run use the same twin, so every verdict stays PASS and only the build and
/// every digest move. `diff` must name that — sources changed, every digest moved, and the twins
/// not checked against a device — not "no regression". The control: the same moves under the same
/// build are an ordinary digest change.
#[test]
fn a_rebuilt_twin_on_a_host_night_is_named_sources_changed_not_no_regression() {
    let dir = tempdir();
    let (old, rebuilt, same_build) = (dir.path().join("old"), dir.path().join("rebuilt"), dir.path().join("same"));
    small(&old, &[], &[]).expect_code(0);
    let flip = |hex: &str| -> String {
        let mut c: Vec<char> = hex.chars().collect();
        let last = c.len() - 1;
        c[last] = if c[last] == '0' { '1' } else { '0' };
        c.into_iter().collect()
    };
    for (dir, new_build) in [(&rebuilt, true), (&same_build, false)] {
        std::fs::create_dir_all(dir).unwrap();
        for (_, mut r) in read_receipts(&old) {
            assert_eq!(r.evidence.verdict, Verdict::Pass, "{}", r.label());
            if new_build {
                r.evidence.build.kernel_source_digest = flip(&r.evidence.build.kernel_source_digest);
            }
            // The twin moved every seam's numbers: every digest cell differs.
            for row in &mut r.evidence.digests.rows {
                for d in row.digests.iter_mut() {
                    *d = flip(d);
                }
            }
            store::write_receipt(dir, &r).expect("the rebuilt night's receipt is valid");
        }
    }
    let md = run(&["diff", s(&old), s(&rebuilt), "--threshold", "1e9"]);
    md.expect_code(0).expect_stdout(&[
        "sources changed, every digest moved (not a regression check: review the change itself)",
        "host receipts only: the twins were not checked against a device",
    ]);
    assert!(!md.stdout.contains("no regression"), "{}", md.stdout);
    let v = diff_json(&old, &rebuilt, 0);
    assert_eq!((v["counts"]["digest_changes"].as_u64(), v["counts"]["paired"].as_u64()), (Some(1), Some(1)), "{v:#}");
    // Control: the same digests moved under the same build are not "sources changed".
    let md = run(&["diff", s(&old), s(&same_build), "--threshold", "1e9"]);
    md.expect_code(0).expect_stdout(&["no regression"]);
    assert!(!md.stdout.contains("sources changed"), "{}", md.stdout);
}
