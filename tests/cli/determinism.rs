//! docs/DESIGN.md §5: two runs of the same configuration on the same build have byte-identical `evidence`;
//! only `measurements` (clocks, host) may differ. The second run uses one worker instead of
//! several, so job scheduling must not leak into the evidence either.

use std::path::Path;

use crate::util::*;

/// The raw text of the top-level `evidence` object of a canonical receipt.
fn evidence_text(text: &str) -> &str {
    let start = text.find("\n  \"evidence\": {").expect("receipt has a top-level evidence object");
    let end = text.find("\n  \"measurements\": {").expect("receipt has a top-level measurements object");
    assert!(start < end, "evidence comes before measurements in the canonical form");
    &text[start..end]
}

fn small_run(out_dir: &Path, jobs: Option<&str>) {
    let mut args = short_host_run("1,2", out_dir, &["--quiet"]);
    if let Some(j) = jobs {
        args.extend(["--jobs", j]);
    }
    run(&args).expect_code(0);
}

#[test]
fn evidence_is_byte_identical_across_runs_of_the_same_configuration() {
    let dir = tempdir();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    small_run(&a, None);
    small_run(&b, Some("1"));

    let names = receipt_names(&a);
    assert_eq!(names.len(), 4, "tp 1,2 × 2 transports: {names:?}");
    assert_eq!(receipt_names(&b), names, "the two runs wrote different run ids");
    for name in &names {
        let ta = std::fs::read_to_string(a.join(name)).unwrap();
        let tb = std::fs::read_to_string(b.join(name)).unwrap();
        let (ea, eb) = (evidence_text(&ta), evidence_text(&tb));
        assert!(ea.contains("\"digests\"") && ea.contains("\"tokens\""), "{name}: evidence without digests or tokens");
        if ea != eb {
            let line = ea.lines().zip(eb.lines()).position(|(x, y)| x != y).unwrap_or(0);
            panic!(
                "{name}: evidence differs between two runs of the same configuration, first at evidence line {line}:\n  a: {}\n  b: {}",
                ea.lines().nth(line).unwrap_or("(end)"),
                eb.lines().nth(line).unwrap_or("(end)")
            );
        }
        // The same through a JSON parser, independent of the text layout.
        let va: serde_json::Value = serde_json::from_str(&ta).unwrap();
        let vb: serde_json::Value = serde_json::from_str(&tb).unwrap();
        assert_eq!(va["evidence"], vb["evidence"], "{name}: evidence values differ");
        assert!(va["measurements"].is_object() && vb["measurements"].is_object(), "{name}: measurements missing");
    }
}
