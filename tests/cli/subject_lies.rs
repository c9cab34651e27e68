//! Subjects that lie in ways the gates once passed (issue 26), each run at run time beside its
//! honest control: a NaN at the logits with honest tokens (error budget), a door declared
//! BIT-IDENTICAL on a NUMERIC-class subject that changes the numbers (the door against the
//! subject's own run without it), captures that vary between two runs whose digests agree
//! (determinism of the receipts' evidence), step 0 repeated at every step (non-triviality per
//! prompt), and a forged census counter (no witness outside the subject: `self-reported`); and a
//! class-identity failure located against the subject's own baseline, not the oracle.

use crate::util::*;
use memra_receipts::schema::{Gate, Verdict};
use memra_receipts::Receipt;

const SHORT: [&str; 4] = ["--prompts", "1", "--gen-tokens", "3"];

/// Runs the plan `extra` with tests/subjects/`mode`.toml, or with the same manifest's subject in
/// misbehave.py's `honest` mode (`honest`), into a fresh directory; returns the output, the
/// receipts and the directory.
fn plan(mode: &str, honest: bool, extra: &[&str]) -> (Output, Vec<Receipt>, tempfile::TempDir) {
    let tmp = tempdir();
    let text = std::fs::read_to_string(repo(&format!("tests/subjects/{mode}.toml"))).unwrap();
    let text = text.replace("{manifest_dir}", s(&repo("tests/subjects")));
    let text = if honest {
        text.replace(&format!("\"{mode}\", \"{{memra_gates}}\""), "\"honest\", \"{memra_gates}\"")
    } else {
        text
    };
    let manifest = tmp.path().join(format!("{mode}.toml"));
    std::fs::write(&manifest, text).unwrap();
    let out = tmp.path().join("out");
    let mut args = vec!["run", "--backend", "host", "--quiet", "--out", s(&out), "--subject", s(&manifest)];
    args.extend_from_slice(&SHORT);
    args.extend_from_slice(extra);
    let o = run(&args);
    let receipts = read_receipts(&out).into_iter().map(|r| r.1).collect();
    (o, receipts, tmp)
}

fn gate(r: &Receipt, g: Gate) -> (Verdict, String) {
    let found = r.evidence.gates.iter().find(|x| x.gate == g);
    let found = found.unwrap_or_else(|| panic!("{}: no {} gate in {:?}", r.label(), g.as_str(), r.evidence.gates));
    (found.verdict, found.detail.clone())
}

fn only(receipts: &[Receipt]) -> &Receipt {
    assert_eq!(receipts.len(), 1, "one configuration");
    &receipts[0]
}

const ONE: [&str; 4] = ["--tp", "1", "--transport", "host-bounce"];

#[test]
fn a_nan_at_the_logits_with_honest_tokens_fails_the_error_budget() {
    let (o, receipts, _t) = plan("nan", false, &ONE);
    o.expect_code(1);
    let r = only(&receipts);
    assert_eq!(r.evidence.verdict, Verdict::Fail);
    let (v, detail) = gate(r, Gate::ErrorBudget);
    assert_eq!(v, Verdict::Fail, "{detail}");
    assert!(detail.contains(".logits p0 s0 [0]: the run has NaN (0x7fc00000) where the oracle has"), "{detail}");
    // The tokens were honest: only the budget saw it.
    assert_eq!(gate(r, Gate::ArgmaxTape).0, Verdict::Pass);
    // The control: the same subject, honest, passes.
    let (o, receipts, _t) = plan("nan", true, &ONE);
    o.expect_code(0);
    let (v, detail) = gate(only(&receipts), Gate::ErrorBudget);
    assert_eq!(v, Verdict::Pass, "{detail}");
}

#[test]
fn captures_that_vary_between_two_runs_fail_determinism() {
    let (o, receipts, _t) = plan("volatile", false, &ONE);
    o.expect_code(1);
    let r = only(&receipts);
    let (v, detail) = gate(r, Gate::Determinism);
    assert_eq!(v, Verdict::Fail, "{detail}");
    assert!(detail.contains("different receipt evidence (their records agree)"), "{detail}");
    // Both runs stayed within the budget: only comparing what the receipts say catches it.
    assert_eq!(gate(r, Gate::ErrorBudget).0, Verdict::Pass);
    // The move reached the evidence (the logits are off by ulps), so the two runs cannot agree.
    let logits = r.evidence.error_budget.iter().find(|e| e.seam == "logits").expect("the logits' error");
    assert!(logits.max_ulp >= 1 && logits.max_rel > 0.0, "{logits:?}");
    let (o, receipts, _t) = plan("volatile", true, &ONE);
    o.expect_code(0);
    let (v, detail) = gate(only(&receipts), Gate::Determinism);
    assert!(v == Verdict::Pass && detail.contains("the two receipts' evidence is byte-identical"), "{detail}");
}

/// A class-identity failure is located against the subject's own class baseline, never the
/// oracle: the subject's single-token run differs from the oracle at logits element 0 (within its
/// budget), its columns differ from that baseline only at element 1. Re-running the oracle as the
/// reference once named element 0 — the subject's own NUMERIC difference, not what the columns
/// changed.
#[test]
fn a_class_identity_failure_is_located_against_the_subjects_own_baseline() {
    let (o, receipts, _t) =
        plan("own_baseline", false, &["--tp", "1", "--transport", "host-bounce", "--columns", "1,2"]);
    o.expect_code(1);
    assert_eq!(receipts.len(), 2, "t1 and t2");
    let t1 = receipts.iter().find(|r| r.evidence.config.columns.is_none()).expect("the single-token run");
    assert_eq!(t1.evidence.verdict, Verdict::Pass, "{:?}", t1.evidence.reason);
    let t2 = receipts.iter().find(|r| r.evidence.config.columns == Some(2)).expect("the t2 run");
    let (v, detail) = gate(t2, Gate::ClassIdentity);
    assert_eq!(v, Verdict::Fail, "{detail}");
    let d = t2.evidence.first_divergence.as_ref().expect("a FAIL names its first divergence");
    assert_eq!((d.seam.as_str(), d.prompt, d.step), ("logits", 0, 0), "{d:?}");
    assert!(d.reproduced, "{d:?}");
    assert_eq!(d.element, Some(1), "located against the oracle instead of the class baseline: {d:?}");
    assert!(detail.contains("[1]") && detail.contains("(1 ulp)"), "{detail}");
}

#[test]
fn a_bit_identical_door_of_a_numeric_subject_that_changes_numbers_fails() {
    let single = ["--matrix", "single", "--tp", "1,2", "--transport", "host-bounce"];
    let (o, receipts, _t) = plan("numeric_door", false, &single);
    o.expect_code(1);
    let door: Vec<&Receipt> = receipts.iter().filter(|r| !r.evidence.config.doors.is_empty()).collect();
    assert_eq!(door.len(), 1, "ROUTES_PRESTAGE at TP2");
    let (v, detail) = gate(door[0], Gate::ClassIdentity);
    assert_eq!(v, Verdict::Fail, "{detail}");
    assert!(
        detail.contains("routes_prestage is declared BIT-IDENTICAL but changes the numbers: this run differs from the subject's own run without it first at L"),
        "{detail}"
    );
    for r in receipts.iter().filter(|r| r.evidence.config.doors.is_empty()) {
        assert_eq!(r.evidence.verdict, Verdict::Pass, "{}: {:?}", r.label(), r.evidence.reason);
    }
    // The control: an honest door is bit-identical to the run without it.
    let (o, receipts, _t) = plan("numeric_door", true, &single);
    o.expect_code(0);
    let door = receipts.iter().find(|r| !r.evidence.config.doors.is_empty()).expect("the door's receipt");
    let (v, detail) = gate(door, Gate::ClassIdentity);
    assert!(v == Verdict::Pass && detail.contains("without routes_prestage"), "{detail}");
}

#[test]
fn a_subject_repeating_step_0_in_each_prompt_fails_non_triviality() {
    let (o, receipts, _t) = plan("repeat", false, &["--tp", "1,2", "--transport", "host-bounce"]);
    o.expect_code(1);
    for r in &receipts {
        let (v, detail) = gate(r, Gate::NonTriviality);
        if r.evidence.config.tp == 2 {
            assert_eq!(v, Verdict::Fail, "{detail}");
            assert!(detail.starts_with("prompt 0: the last layer's residual is identical at all"), "{detail}");
        } else {
            assert_eq!(r.evidence.verdict, Verdict::Pass, "the TP1 control: {detail}");
        }
    }
}

#[test]
fn a_forged_census_counter_is_marked_self_reported() {
    let (o, receipts, _t) = plan("forge", false, &["--matrix", "single", "--tp", "1,2", "--transport", "host-bounce"]);
    // Nothing outside the subject's process counted: the forged counter passes engagement, and the
    // receipt and the table say whose word it is.
    o.expect_code(0).expect_stdout(&["forged (self-reported)"]);
    let forged: Vec<&Receipt> = receipts.iter().filter(|r| !r.evidence.config.doors.is_empty()).collect();
    assert_eq!(forged.len(), 2);
    for r in &receipts {
        assert_eq!(r.evidence.census_witness.as_deref(), Some("self-reported"), "{}", r.label());
    }
    for r in forged {
        assert_eq!(r.evidence.census.get("forged.calls"), Some(&7));
        assert_eq!(gate(r, Gate::Engagement).0, Verdict::Pass);
    }
}
