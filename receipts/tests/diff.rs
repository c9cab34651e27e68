//! `diff` fixtures: each rule of the module doc, in both directions where it matters.

use memra_receipts::diff::{DiffFormat, DigestDifference};
use memra_receipts::*;

use crate::util::*;

fn set() -> Vec<Receipt> {
    vec![
        passing(1, Transport::HostBounce, &[]),
        passing(2, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)]),
        passing(4, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true), ("MEMRA_OPROJ_TAIL", true)]),
    ]
}

fn d(old: &[Receipt], new: &[Receipt]) -> DiffReport {
    diff(old, new, DEFAULT_THRESHOLD).unwrap()
}

#[test]
fn identical_sets_have_no_change_and_no_regression() {
    let r = d(&set(), &set());
    assert!(!r.regressed());
    assert_eq!((r.counts.paired, r.counts.unchanged, r.counts.regressions), (3, 3, 0));
    assert!(r.verdict_changes.is_empty() && r.digest_changes.is_empty() && r.latency_changes.is_empty());
    assert!(r.added.is_empty() && r.missing.is_empty());
    assert_eq!(r.counts.latency_within_noise, 3 * 8);
    let md = r.to_markdown();
    assert_eq!(md.lines().count(), 1, "nothing to detail:\n{md}");
    assert!(md.starts_with("**memra-gates diff — no regression: 3 paired (3 unchanged) · 0 regressions"), "{md}");
}

#[test]
fn pass_to_fail_is_a_named_regression() {
    let old = set();
    let mut new = set();
    new[1] = failing(new[1].clone());
    let r = d(&old, &new);
    assert!(r.regressed());
    assert_eq!(r.verdict_changes.len(), 1);
    let v = &r.verdict_changes[0];
    assert_eq!((v.old, v.new, v.regression), (Verdict::Pass, Verdict::Fail, true));
    assert_eq!(v.run_id, new[1].run_id);
    assert_eq!(v.label, new[1].label());
    assert_eq!(v.first_divergence.as_deref(), Some("L1.o_join p1 s2 r1 [4093] 0x3f800000→0x3f800003 (3 ulp)"));
    assert_eq!(r.counts.regressions, 1);
    let md = r.to_markdown();
    assert!(md.contains("<details open><summary>Verdict changes (1)</summary>"), "{md}");
    assert!(md.contains(&format!("| ❌ PASS → FAIL | {} | `{}` |", new[1].label(), new[1].run_id)), "{md}");
    assert!(r.to_text().contains("REGRESSION PASS -> FAIL"), "{}", r.to_text());
}

#[test]
fn verdict_changes_that_are_not_regressions() {
    let old = vec![failing(set()[1].clone()), skipped(set()[2].clone(), "no peer access")];
    let new = vec![set()[1].clone(), with_verdict(set()[2].clone(), Verdict::Void, "did not engage")];
    let r = d(&old, &new);
    assert_eq!(r.verdict_changes.len(), 2);
    assert!(r.verdict_changes.iter().all(|v| !v.regression), "{:?}", r.verdict_changes);
    assert!(!r.regressed());
    assert!(r.to_markdown().contains("<details><summary>Verdict changes (2)</summary>"));
}

#[test]
fn pass_to_skip_and_skip_to_error_are_regressions() {
    let old = vec![set()[0].clone(), skipped(set()[1].clone(), "no peer access")];
    let new = vec![skipped(set()[0].clone(), "no device"), errored(set()[1].clone(), "layer 0 qkv: launch failed")];
    let r = d(&old, &new);
    assert_eq!(r.verdict_changes.iter().filter(|v| v.regression).count(), 2);
    assert!(r.regressed());
}

#[test]
fn digest_change_names_the_first_differing_cell_and_the_new_divergence() {
    let old = set();
    let mut new = set();
    new[2] = failing(new[2].clone());
    let r = d(&old, &new);
    assert_eq!(r.digest_changes.len(), 1);
    let c = &r.digest_changes[0];
    assert_eq!(c.run_id, new[2].run_id);
    let first = c.first.as_ref().unwrap();
    assert_eq!((first.prompt, first.step, first.column.as_str()), (1, 2, "L1.o_join"));
    let col = old[2].evidence.digests.columns.iter().position(|x| x == "L1.o_join").unwrap();
    let row = old[2].evidence.digests.rows.iter().position(|x| (x.prompt, x.step) == (1, 2)).unwrap();
    assert_eq!(first.old.as_ref(), Some(&old[2].evidence.digests.rows[row].digests[col]));
    assert_eq!(first.new.as_ref(), Some(&new[2].evidence.digests.rows[row].digests[col]));
    assert_eq!(c.new_first_divergence.as_ref(), new[2].evidence.first_divergence.as_ref());
    assert!(!c.token_tape_changed && !c.columns_changed);
    assert!(r.to_markdown().contains("| p1 s2 L1.o_join |"), "{}", r.to_markdown());
}

#[test]
fn digest_change_alone_is_reported_but_not_a_regression() {
    let old = set();
    let mut new = set();
    new[0] = edit(new[0].clone(), |e| {
        e.digests.rows[3].digests[5] = "00000000000000ff".into();
        e.tokens[1][0] += 1;
    });
    let r = d(&old, &new);
    assert_eq!(r.digest_changes.len(), 1);
    let c = &r.digest_changes[0];
    let row = &new[0].evidence.digests.rows[3];
    assert_eq!(
        c.first,
        Some(DigestDifference {
            prompt: row.prompt,
            step: row.step,
            column: new[0].evidence.digests.columns[5].clone(),
            old: Some(old[0].evidence.digests.rows[3].digests[5].clone()),
            new: Some("00000000000000ff".into()),
        })
    );
    assert!(c.token_tape_changed);
    assert!(!r.regressed());
    assert_eq!(r.counts.unchanged, 2);
}

#[test]
fn digest_rows_present_on_one_side_only_are_a_difference() {
    let old = set();
    let mut new = set();
    new[1] = edit(new[1].clone(), |e| {
        e.digests.rows.pop();
    });
    let r = d(&old, &new);
    let first = r.digest_changes[0].first.as_ref().unwrap();
    let last = old[1].evidence.digests.rows.last().unwrap();
    assert_eq!((first.prompt, first.step), (last.prompt, last.step));
    assert!(first.old.is_some() && first.new.is_none());
}

#[test]
fn latency_slowdown_beyond_noise_is_a_regression() {
    let mut old = set();
    let mut new = set();
    set_latency(&mut old[1], 1, "qkv", 9_500, 10_000, 10_500);
    set_latency(&mut new[1], 1, "qkv", 11_500, 12_000, 12_500);
    let r = d(&old, &new);
    assert_eq!(r.latency_changes.len(), 1);
    let l = &r.latency_changes[0];
    assert_eq!((l.layer, l.seam.as_str(), l.slower), (1, "qkv", true));
    assert_eq!((l.old_median_ns, l.new_median_ns, l.old_min_ns, l.old_max_ns), (10_000, 12_000, 9_500, 10_500));
    assert!((l.relative - 0.2).abs() < 1e-12);
    assert!(r.regressed());
    assert_eq!(r.counts.latency_slower, 1);
    let md = r.to_markdown();
    assert!(md.contains("<details open><summary>Latency beyond noise (1)</summary>"), "{md}");
    assert!(md.contains("| ❌ +20.0% |") && md.contains("| L1.qkv | 10.0 µs [9.5 µs – 10.5 µs] | 12.0 µs |"), "{md}");
}

#[test]
fn latency_speedup_beyond_noise_is_reported_but_not_a_regression() {
    let mut old = set();
    let mut new = set();
    set_latency(&mut old[0], 0, "attn_norm", 9_500, 10_000, 10_500);
    set_latency(&mut new[0], 0, "attn_norm", 7_000, 8_000, 8_500);
    let r = d(&old, &new);
    assert_eq!(r.latency_changes.len(), 1);
    assert!(!r.latency_changes[0].slower);
    assert_eq!(r.counts.latency_faster, 1);
    assert!(!r.regressed());
}

#[test]
fn latency_move_inside_the_old_band_is_noise_even_above_threshold() {
    let mut old = set();
    let mut new = set();
    set_latency(&mut old[1], 0, "o_join", 8_000, 10_000, 13_000);
    set_latency(&mut new[1], 0, "o_join", 12_000, 12_500, 12_900); // +25%, but inside [8000, 13000]
    let r = diff(&old, &new, 0.01).unwrap();
    assert!(r.latency_changes.is_empty(), "{:?}", r.latency_changes);
    assert!(!r.regressed());
    assert_eq!(r.counts.unchanged, 3);
    assert_eq!(r.counts.latency_within_noise, 3 * 8);
}

#[test]
fn latency_move_outside_the_band_but_under_threshold_is_noise() {
    let mut old = set();
    let mut new = set();
    set_latency(&mut old[2], 1, "residual", 9_900, 10_000, 10_100);
    set_latency(&mut new[2], 1, "residual", 10_250, 10_300, 10_400); // outside the band, +3% < 5%
    let r = d(&old, &new);
    assert!(r.latency_changes.is_empty(), "{:?}", r.latency_changes);
    assert!(!r.regressed());
    // The same move with a 2% threshold is reported.
    let r = diff(&old, &new, 0.02).unwrap();
    assert_eq!(r.latency_changes.len(), 1);
    assert!(r.regressed());
}

#[test]
fn missing_runs_regress_and_new_runs_are_listed() {
    let old = set();
    let mut new = set();
    let gone = new.remove(0);
    let fresh = passing(8, Transport::NativeP2p, &[("MEMRA_STEP_EP", true)]);
    new.push(fresh.clone());
    let r = d(&old, &new);
    assert_eq!(r.missing.len(), 1);
    assert_eq!((r.missing[0].run_id.as_str(), r.missing[0].verdict), (gone.run_id.as_str(), Verdict::Pass));
    assert_eq!(r.added.len(), 1);
    assert_eq!(r.added[0].run_id, fresh.run_id);
    assert!(r.regressed(), "a missing run is lost coverage");
    assert_eq!(r.counts.regressions, 1);
    let md = r.to_markdown();
    assert!(md.contains("<details><summary>New runs (1)</summary>"), "{md}");
    assert!(md.contains("<details open><summary>Missing runs (1)</summary>"), "{md}");

    // Only additions: not a regression, unless an added run fails.
    let mut more = set();
    more.push(fresh.clone());
    assert!(!d(&set(), &more).regressed());
    more.push(failing(passing(8, Transport::NativeP2p, &[])));
    let r = d(&set(), &more);
    assert!(r.regressed());
    assert_eq!(r.counts.regressions, 1);
}

#[test]
fn invalid_threshold_is_refused() {
    for t in [f64::NAN, -0.01, f64::INFINITY] {
        let err = diff(&set(), &set(), t).unwrap_err();
        assert!(matches!(err, ReceiptError::InvalidThreshold { .. }), "{t}: {err:?}");
    }
}

#[test]
fn duplicate_run_ids_are_noted() {
    let mut new = set();
    new.push(new[0].clone());
    let r = d(&set(), &new);
    assert_eq!(r.notes.len(), 1);
    assert!(r.notes[0].contains(&new[0].run_id) && r.notes[0].contains("NEW"), "{:?}", r.notes);
}

#[test]
fn renderings_json_text_and_format_names() {
    let old = set();
    let mut new = set();
    new[1] = failing(new[1].clone());
    set_latency(&mut new[0], 0, "qkv", 50_000, 60_000, 70_000);
    let r = d(&old, &new);
    let json_text = r.render(DiffFormat::Json).unwrap();
    assert!(json_text.ends_with("}\n"));
    let v: serde_json::Value = serde_json::from_str(&json_text).unwrap();
    assert_eq!(v["regressed"], true);
    assert_eq!(v["counts"]["verdict_changes"], 1);
    assert_eq!(v["latency_changes"][0]["seam"], "qkv");
    assert_eq!(v["verdict_changes"][0]["new"], "FAIL");
    // Canonical: rendering twice gives the same bytes.
    assert_eq!(r.render(DiffFormat::Json).unwrap(), json_text);

    let text = r.render(DiffFormat::Text).unwrap();
    assert!(text.starts_with("memra-gates diff — REGRESSED: 3 paired (1 unchanged) · 2 regressions"), "{text}");
    assert!(text.contains("latency beyond noise (1):"), "{text}");

    assert_eq!("md".parse::<DiffFormat>(), Ok(DiffFormat::Markdown));
    assert_eq!("json".parse::<DiffFormat>(), Ok(DiffFormat::Json));
    assert_eq!("text".parse::<DiffFormat>(), Ok(DiffFormat::Text));
    assert!("html".parse::<DiffFormat>().unwrap_err().contains("\"html\" is not one of md, text, json"));
}

#[test]
fn markdown_is_capped_for_pr_comments() {
    let old: Vec<Receipt> =
        (0..60).map(|i| passing(1, Transport::HostBounce, &[(&*format!("MEMRA_D{i}"), true)])).collect();
    let new: Vec<Receipt> = old.iter().map(|r| failing(r.clone())).collect();
    let r = d(&old, &new);
    assert_eq!(r.verdict_changes.len(), 60);
    let md = r.to_markdown();
    assert!(md.contains("… and 10 more"), "{md}");
    assert!(md.lines().filter(|l| l.starts_with("| ❌ PASS → FAIL")).count() == 50);
}
