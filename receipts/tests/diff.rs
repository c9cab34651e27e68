//! `diff` fixtures: each rule of the module doc, in both directions where it matters.

use memra_receipts::diff::{DiffFormat, DigestDifference, CUDA_THRESHOLD, HOST_THRESHOLD};
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
    diff(old, new, None).unwrap()
}

/// Every latency statistic of one layer × seam of `r` multiplied by `factor`.
fn scale(r: &mut Receipt, layer: usize, seam: &str, factor: f64) {
    let l = r.measurements.latency.iter_mut().find(|l| l.layer == layer && l.seam == seam).unwrap();
    for v in [&mut l.min_ns, &mut l.median_ns, &mut l.p90_ns, &mut l.max_ns] {
        *v = (*v as f64 * factor) as u64;
    }
}

/// Every latency of `r` multiplied by `factor` (a run slowed by load).
fn scale_all(r: &mut Receipt, factor: f64) {
    let keys: Vec<(usize, String)> = r.measurements.latency.iter().map(|l| (l.layer, l.seam.clone())).collect();
    for (layer, seam) in keys {
        scale(r, layer, &seam, factor);
    }
}

fn on_host(mut set: Vec<Receipt>) -> Vec<Receipt> {
    for r in &mut set {
        r.evidence.config.backend = Backend::Host;
        r.run_id = run_id(&r.evidence.config);
    }
    set
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
fn single_run_slowdown_with_separated_samples_is_a_regression() {
    let mut old = set();
    let mut new = set();
    set_latency(&mut old[1], 1, "qkv", 9_500, 10_000, 10_500);
    set_latency(&mut new[1], 1, "qkv", 11_800, 12_000, 12_500);
    let r = d(&old, &new);
    assert_eq!(r.noise.threshold, CUDA_THRESHOLD, "CUDA receipts take the CUDA default");
    assert_eq!(r.latency_changes.len(), 1, "{:?}", r.latency_changes);
    let l = &r.latency_changes[0];
    assert_eq!((l.layer, l.seam.as_str(), l.slower), (1, "qkv", true));
    assert_eq!((l.old_median_ns, l.new_median_ns, l.old_min_ns, l.old_max_ns), (10_000, 12_000, 9_500, 10_500));
    assert!((l.ratio - 1.2).abs() < 1e-12 && (l.normalized - 1.2).abs() < 1e-12, "{l:?}");
    assert!(r.regressed());
    assert_eq!(r.counts.latency_slower, 1);
    assert!(r.seam_changes.is_empty(), "one run of three moved: not a seam move {:?}", r.seam_changes);
    let md = r.to_markdown();
    assert!(md.contains("<details open><summary>Latency beyond noise in single runs (1)</summary>"), "{md}");
    assert!(md.contains("| ❌ ×1.20 |") && md.contains("| L1.qkv | 10.0 µs [9.5 µs – 10.5 µs] | 12.0 µs"), "{md}");
}

#[test]
fn single_run_speedup_is_reported_but_not_a_regression() {
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
fn overlapping_samples_are_noise_even_far_above_the_threshold() {
    let mut old = set();
    let mut new = set();
    set_latency(&mut old[1], 0, "o_join", 8_000, 10_000, 13_000);
    set_latency(&mut new[1], 0, "o_join", 12_000, 20_000, 25_000); // ×2 median, but min 12 µs < 13 µs
    let r = diff(&old, &new, Some(0.01)).unwrap();
    assert!(r.latency_changes.is_empty(), "{:?}", r.latency_changes);
    assert!(!r.regressed());
    assert_eq!(r.counts.unchanged, 3);
    assert_eq!(r.counts.latency_within_noise, 3 * 8);
}

#[test]
fn a_move_under_the_threshold_is_noise_and_the_threshold_flag_overrides() {
    let mut old = set();
    let mut new = set();
    set_latency(&mut old[2], 1, "residual", 9_900, 10_000, 10_100);
    set_latency(&mut new[2], 1, "residual", 10_700, 10_800, 10_900); // separated, ×1.08 < ×1.10
    let r = d(&old, &new);
    assert!(r.latency_changes.is_empty(), "{:?}", r.latency_changes);
    assert!(!r.regressed());
    let r = diff(&old, &new, Some(0.05)).unwrap();
    assert_eq!(r.noise.source, "--threshold");
    assert_eq!(r.latency_changes.len(), 1);
    assert!(r.regressed());
}

#[test]
fn a_whole_run_slowed_by_load_is_normalised_away() {
    let old = on_host(set());
    let mut new = on_host(set());
    scale_all(&mut new[1], 1.8); // another process took a core during this run
    let r = d(&old, &new);
    assert!(r.latency_changes.is_empty() && r.seam_changes.is_empty(), "{:?} {:?}", r.latency_changes, r.seam_changes);
    assert!(!r.regressed(), "{}", r.to_text());
}

#[test]
fn a_seam_slower_in_every_run_is_a_regression_even_without_separated_samples() {
    let old = on_host(set());
    let mut new = on_host(set());
    for (i, r) in new.iter_mut().enumerate() {
        scale(r, 1, "qkv", 2.0);
        // Noisy samples: widen the new range so no single run is separated from its old one.
        let l = r.measurements.latency.iter_mut().find(|l| l.layer == 1 && l.seam == "qkv").unwrap();
        l.min_ns = 5_000 + i as u64;
    }
    let r = d(&old, &new);
    assert_eq!(r.noise.threshold, HOST_THRESHOLD, "host receipts take the host default");
    assert!(r.latency_changes.is_empty(), "{:?}", r.latency_changes);
    assert_eq!(r.seam_changes.len(), 1, "{:?}", r.seam_changes);
    let s = &r.seam_changes[0];
    assert_eq!((s.layer, s.seam.as_str(), s.runs, s.slower), (1, "qkv", 3, true));
    assert!((s.median_normalized - 2.0).abs() < 0.05, "{s:?}");
    assert!(r.regressed());
    assert!(r.to_text().contains("REGRESSION ×2.00  L1.qkv  median over 3 runs"), "{}", r.to_text());
}

#[test]
fn a_uniform_slowdown_counts_on_cuda_and_is_only_reported_on_the_host() {
    let slow = |mut v: Vec<Receipt>| {
        v.iter_mut().for_each(|r| scale_all(r, 2.0));
        v
    };
    let r = d(&set(), &slow(set()));
    let speed = r.set_speed.clone().unwrap();
    assert!(speed.beyond_noise && speed.regression && (speed.factor - 2.0).abs() < 0.01, "{speed:?}");
    assert!(r.regressed() && r.seam_changes.is_empty() && r.latency_changes.is_empty());
    let r = d(&on_host(set()), &slow(on_host(set())));
    let speed = r.set_speed.clone().unwrap();
    assert!(speed.beyond_noise && !speed.regression, "{speed:?}");
    assert!(!r.regressed(), "{}", r.to_text());
    assert!(r.headline().contains("whole set ×2.00 (slower, not counted on host receipts)"), "{}", r.headline());
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
        let err = diff(&set(), &set(), Some(t)).unwrap_err();
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
    set_latency(&mut new[0], 0, "qkv", 50_000, 60_000, 70_000); // old is ~11 µs: ×5, separated
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
    assert!(text.contains("latency beyond noise in single runs (1):"), "{text}");

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

/// A slower single run is a regression on CUDA receipts and reported only on host receipts (a
/// shared machine; a host regression needs agreement across runs): the same move both ways.
#[test]
fn a_slower_single_run_counts_on_cuda_and_is_reported_on_host() {
    let mv = |old: &mut Vec<Receipt>, new: &mut Vec<Receipt>| {
        set_latency(&mut old[1], 1, "residual", 900, 1_000, 1_100);
        set_latency(&mut new[1], 1, "residual", 2_000, 2_500, 3_000); // ×2.5, separated
    };
    let (mut old, mut new) = (on_host(set()), on_host(set()));
    mv(&mut old, &mut new);
    let r = d(&old, &new);
    assert!(!r.noise.single_runs_count);
    assert_eq!(r.latency_changes.len(), 1, "the move is reported: {:?}", r.latency_changes);
    assert!(r.latency_changes[0].slower && !r.latency_changes[0].regression);
    assert!(!r.regressed(), "{}", r.to_text());
    assert!(!r.to_text().contains("REGRESSION"), "{}", r.to_text());
    let (mut old, mut new) = (set(), set());
    mv(&mut old, &mut new);
    let r = d(&old, &new);
    assert!(r.noise.single_runs_count);
    assert!(r.latency_changes[0].regression && r.regressed(), "{}", r.to_text());
    assert!(r.to_text().contains("REGRESSION ×2.50"), "{}", r.to_text());
}

/// Every paired run's digests moved with the build (`kernel_source_digest`): the headline says
/// "sources changed, every digest moved", not "no regression"; a host-only pair says its twins
/// were not checked against a device. The controls: the same digest moves without a source
/// change, and a set with a CUDA run.
#[test]
fn sources_changed_with_every_digest_moved_is_named_not_no_regression() {
    let moved = |r: &mut Receipt, build: &str| {
        r.evidence.build.kernel_source_digest = build.to_string();
        r.evidence.token_tape_digest = "00".repeat(8);
        r.evidence.tokens = Vec::new();
    };
    let (old, mut new) = (on_host(set()), on_host(set()));
    for r in &mut new {
        moved(r, "abcd");
    }
    let report = d(&old, &new);
    assert_eq!((report.counts.digest_changes, report.counts.paired), (3, 3));
    let head = report.headline();
    assert!(head.starts_with("sources changed, every digest moved"), "{head}");
    assert!(head.ends_with("host receipts only: the twins were not checked against a device"), "{head}");
    // Control: the same moves with the same sources are no regression (and say nothing of sources).
    let mut same = on_host(set());
    let build = old[0].evidence.build.kernel_source_digest.clone();
    for r in &mut same {
        moved(r, &build);
    }
    let head = d(&old, &same).headline();
    assert!(head.starts_with("no regression:"), "{head}");
    // Control: a set with a device run does not claim host only.
    let mut cuda = set();
    cuda[0].evidence.config.backend = Backend::Cuda;
    cuda[0].run_id = run_id(&cuda[0].evidence.config);
    assert!(!d(&cuda, &cuda).headline().contains("host receipts only"));
}
