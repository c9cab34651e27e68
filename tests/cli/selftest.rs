//! `memra-gates selftest`: every canary that can run on the host is CAUGHT at the place its defect
//! predicts; and the negative control of the negative control: with one canary disarmed, selftest
//! itself must fail and name that canary MISSED.

use std::collections::BTreeMap;

use memra_receipts::{Gate, Verdict};

use crate::util::*;

/// The canary ids of the registry (`doors --json`, class CANARY).
fn registry_canaries() -> Vec<String> {
    let out = run(&["doors", "--json"]);
    out.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    v["doors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["class"] == "CANARY")
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect()
}

/// canary id → status word (CAUGHT, MISSED, NOT-APPLICABLE) from the selftest table.
fn statuses(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter(|l| l.starts_with("canary_"))
        .map(|l| {
            let mut w = l.split_whitespace();
            (w.next().unwrap().to_string(), w.next().unwrap_or("").to_string())
        })
        .collect()
}

#[test]
fn selftest_catches_every_canary_that_runs() {
    let dir = tempdir();
    let out_dir = dir.path().join("selftest");
    let out = run(&["selftest", "--backend", "host", "--prompts", "1", "--out", s(&out_dir)]);
    out.expect_code(0).expect_stdout(&["selftest: every canary was caught"]);

    let st = statuses(&out.stdout);
    let canaries = registry_canaries();
    assert!(canaries.len() >= 4, "docs/DESIGN.md §4.3 asks for at least 4 canaries: {canaries:?}");
    assert_eq!(
        st.keys().cloned().collect::<Vec<_>>(),
        {
            let mut c = canaries.clone();
            c.sort();
            c
        },
        "selftest does not list every canary\n{}",
        out.transcript()
    );
    let caught = st.values().filter(|v| *v == "CAUGHT").count();
    assert!(st.values().all(|v| v == "CAUGHT" || v == "NOT-APPLICABLE"), "{st:?}\n{}", out.transcript());
    // On the host backend only the skipped-fence race has no meaning.
    assert!(caught >= 3, "only {caught} canaries ran and were caught: {st:?}");

    // The receipts say the same: each canary that ran FAILed its identity gate with a divergence.
    let receipts = read_receipts(&out_dir);
    assert_eq!(receipts.len(), st.len(), "one receipt per canary");
    let failed = receipts
        .iter()
        .filter(|(_, r)| r.evidence.verdict == Verdict::Fail)
        .inspect(|(name, r)| {
            assert!(
                r.evidence.gates.iter().any(|g| g.gate == Gate::Identity && g.verdict == Verdict::Fail),
                "{name}: a caught canary without a failed identity gate"
            );
            assert!(r.evidence.first_divergence.is_some(), "{name}: a caught canary without a first divergence");
        })
        .count();
    assert_eq!(failed, caught, "CAUGHT in the table vs FAIL receipts");
}

#[test]
fn selftest_fails_when_a_canary_is_disarmed() {
    let dir = tempdir();
    let out = run(&[
        "selftest",
        "--backend",
        "host",
        "--prompts",
        "1",
        "--out",
        s(&dir.path().join("selftest")),
        "--disarm",
        "canary_reverse_kblocks",
    ]);
    out.expect_code(1).expect_stdout(&["selftest: FAILED"]);
    let st = statuses(&out.stdout);
    assert_eq!(st.get("canary_reverse_kblocks").map(String::as_str), Some("MISSED"), "{}", out.transcript());
    // Only the disarmed canary is missed.
    for (id, status) in &st {
        if id != "canary_reverse_kblocks" {
            assert_ne!(status, "MISSED", "{id} was missed although only canary_reverse_kblocks was disarmed");
        }
    }
}
