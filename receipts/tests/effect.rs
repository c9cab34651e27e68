//! Door effects (`memra_receipts::effect`, METRICS.md, "Door effects"): each door paired with its parent
//! configuration in one receipt set, the interval's verdicts, the cost of exactness, the file.

use memra_receipts::effect::{
    door_effects, door_nights, parse_effects, read_effects, write_effects, DoorEffects, Effect,
};
use memra_receipts::{Receipt, Transport, Verdict};

use crate::util::{config, receipt_with};

/// A receipt of `doors` (all on) at `tp` over native-p2p whose every latency is `factor` × the
/// builder's.
fn timed(tp: usize, doors: &[&str], factor: f64) -> Receipt {
    let on: Vec<(&str, bool)> = doors.iter().map(|d| (*d, true)).collect();
    let mut r = receipt_with(config(tp, Transport::NativeP2p, &on), 2, 1, 8);
    for l in &mut r.measurements.latency {
        for x in [&mut l.min_ns, &mut l.median_ns, &mut l.p90_ns, &mut l.max_ns] {
            *x = (*x as f64 * factor).round() as u64;
        }
    }
    r
}

/// MEMRA_A makes every seam 30% faster, MEMRA_B changes nothing.
fn night(tp: usize) -> Vec<Receipt> {
    vec![
        timed(tp, &[], 1.0),
        timed(tp, &["MEMRA_A"], 0.7),
        timed(tp, &["MEMRA_B"], 1.0),
        timed(tp, &["MEMRA_A", "MEMRA_B"], 0.7),
    ]
}

fn effect_of<'a>(e: &'a DoorEffects, door: &str, label_has: &str) -> Vec<&'a memra_receipts::effect::DoorEffect> {
    e.effects.iter().filter(|x| x.door == door && x.label.ends_with(&format!("native-p2p {label_has}"))).collect()
}

#[test]
fn each_door_is_compared_with_the_same_set_without_it() {
    let e = door_effects(&night(2));
    assert_eq!(e.effects.len(), 4, "{:#?}", e.effects);
    for (door, label, want) in [
        ("MEMRA_A", "+A", Effect::Faster),
        ("MEMRA_A", "+A +B", Effect::Faster),
        ("MEMRA_B", "+B", Effect::Same),
        ("MEMRA_B", "+A +B", Effect::Same),
    ] {
        let found = effect_of(&e, door, label);
        assert_eq!(found.len(), 1, "{door} in {label}: {:#?}", e.effects);
        let f = found[0];
        assert_eq!(f.step.effect, want, "{door} in {label}: {:?}", f.step);
        assert!(f.step.lo <= f.step.ratio && f.step.ratio <= f.step.hi);
        // Every seam moved with the step.
        assert_eq!(f.seams.len(), 4);
        assert!(f.seams.values().all(|s| s.effect == want), "{:?}", f.seams);
    }
    let a = effect_of(&e, "MEMRA_A", "+A")[0];
    assert!((a.step.ratio - 0.7).abs() < 0.01, "{}", a.step.ratio);
    let parent = night(2).into_iter().find(|r| r.evidence.config.doors.is_empty()).unwrap();
    assert_eq!(a.parent_run_id, parent.run_id);
}

#[test]
fn without_the_parent_configuration_there_is_no_effect() {
    // Only {A} and {A,B}: A has no parent of its own, B's parent is {A}.
    let rs: Vec<Receipt> = night(2).into_iter().filter(|r| r.evidence.config.doors.contains_key("MEMRA_A")).collect();
    let e = door_effects(&rs);
    assert_eq!(e.effects.len(), 1, "{:#?}", e.effects);
    assert_eq!(e.effects[0].door, "MEMRA_B");
    // Receipts of another TP size or model never pair.
    let mut other = night(4);
    for r in &mut other {
        r.evidence.config.model.digest = "00aa".to_string();
    }
    let mut rs = vec![timed(2, &[], 1.0)];
    rs.extend(other.into_iter().filter(|r| r.evidence.config.doors.len() == 1));
    assert!(door_effects(&rs).effects.is_empty());
}

#[test]
fn a_door_night_sums_up_its_configurations_and_skips_failed_pairs() {
    let mut rs = night(2);
    rs.extend(night(4));
    let nights = door_nights(&door_effects(&rs));
    let a2 = nights.iter().find(|n| n.door == "MEMRA_A" && n.tp == 2).unwrap();
    assert_eq!((a2.n, a2.effect, a2.counts), (2, Effect::Faster, [2, 0, 0, 0]), "{a2:?}");
    let b4 = nights.iter().find(|n| n.door == "MEMRA_B" && n.tp == 4).unwrap();
    assert_eq!(b4.effect, Effect::Same, "{b4:?}");
    // A failed configuration's timing says nothing about the door.
    for r in &mut rs {
        if r.evidence.config.tp == 2 && r.evidence.config.doors.contains_key("MEMRA_A") {
            r.evidence.verdict = Verdict::Fail;
        }
    }
    let nights = door_nights(&door_effects(&rs));
    assert!(!nights.iter().any(|n| n.door == "MEMRA_A" && n.tp == 2), "{nights:?}");
    assert!(nights.iter().any(|n| n.door == "MEMRA_A" && n.tp == 4));
}

#[test]
fn the_cost_of_exactness_is_the_default_against_the_fastest_passing_set() {
    let mut rs = night(2);
    // An even faster set that failed does not count.
    let mut failed = timed(2, &["MEMRA_C"], 0.2);
    failed.evidence.verdict = Verdict::Fail;
    rs.push(failed);
    let e = door_effects(&rs);
    assert_eq!(e.exactness_cost.len(), 1, "{:#?}", e.exactness_cost);
    let c = &e.exactness_cost[0];
    assert!(c.fastest_doors.contains(&"MEMRA_A".to_string()), "{c:?}");
    assert!((c.step.ratio - 0.7).abs() < 0.01 && c.step.effect == Effect::Faster, "{c:?}");
    // Without a passing default there is no cost to state.
    let rs: Vec<Receipt> = night(2).into_iter().filter(|r| !r.evidence.config.doors.is_empty()).collect();
    assert!(door_effects(&rs).exactness_cost.is_empty());
}

#[test]
fn the_file_reads_back_and_refuses_other_versions_and_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let e = door_effects(&night(2));
    let path = write_effects(dir.path(), &e).unwrap();
    assert_eq!(read_effects(&path).unwrap(), e);
    let text = std::fs::read_to_string(&path).unwrap();
    let v2 = text.replacen("\"schema_version\": 1", "\"schema_version\": 2", 1);
    let err = parse_effects(v2.as_bytes(), &path).unwrap_err().to_string();
    assert!(err.contains("schema_version 2 is not supported"), "{err}");
    let summary = text.replacen("\"door-effects\"", "\"summary\"", 1);
    let err = parse_effects(summary.as_bytes(), &path).unwrap_err().to_string();
    assert!(err.contains("kind \"summary\""), "{err}");
    let extra = text.replacen("\"effects\"", "\"surprise\": 1,\n  \"effects\"", 1);
    assert!(parse_effects(extra.as_bytes(), &path).is_err(), "unknown fields are refused");
}

#[test]
fn diff_lists_a_door_that_stopped_paying_as_a_regression_on_cuda_only() {
    let old = night(2);
    // MEMRA_A's mechanism no longer helps: its sets are as slow as their parents.
    let new = vec![
        timed(2, &[], 1.0),
        timed(2, &["MEMRA_A"], 1.0),
        timed(2, &["MEMRA_B"], 1.0),
        timed(2, &["MEMRA_A", "MEMRA_B"], 1.0),
    ];
    // A threshold of ×2 keeps the whole-set move (×1.2) out of it: only the door counts here.
    let report = memra_receipts::diff(&old, &new, Some(1.0)).unwrap();
    assert_eq!(report.door_changes.len(), 1, "{:#?}", report.door_changes);
    let c = &report.door_changes[0];
    assert_eq!((c.door.as_str(), c.tp, c.old_effect, c.new_effect), ("MEMRA_A", 2, Effect::Faster, Effect::Same));
    assert!(c.stopped_paying && c.regression, "{c:?}");
    assert!(report.regressed() && report.counts.regressions == 1, "{:?}", report.counts);
    let md = report.to_markdown();
    assert!(md.contains("Door effects that changed") && md.contains("A cuda tp2: FASTER ×0.70 → SAME ×1.00"), "{md}");
    assert!(report.headline().contains("1 door effect stopped paying"), "{}", report.headline());
    // The control: the same night twice changes no door.
    assert!(memra_receipts::diff(&old, &old, Some(1.0)).unwrap().door_changes.is_empty());
    // On host receipts it is reported, not counted.
    let host = |rs: &[Receipt]| -> Vec<Receipt> {
        rs.iter()
            .cloned()
            .map(|mut r| {
                r.evidence.config.backend = memra_receipts::Backend::Host;
                r.run_id = memra_receipts::run_id(&r.evidence.config);
                r
            })
            .collect()
    };
    // Host's noise floor (×1.5) hides a 30% gain: make it a 60% gain there.
    let mut old_host = host(&old);
    for r in old_host.iter_mut().filter(|r| r.evidence.config.doors.contains_key("MEMRA_A")) {
        for l in &mut r.measurements.latency {
            for x in [&mut l.min_ns, &mut l.median_ns, &mut l.p90_ns, &mut l.max_ns] {
                *x = *x * 4 / 7;
            }
        }
    }
    let report = memra_receipts::diff(&old_host, &host(&new), Some(5.0)).unwrap();
    let c = report.door_changes.iter().find(|c| c.door == "MEMRA_A").expect("the change is reported");
    // Host's floor (ν ≥ 0.5) leaves ×1.00 AMBIGUOUS, never SAME: the gain is lost, not refuted.
    assert!(c.lost_evidence && !c.stopped_paying && !c.regression, "{c:?}");
    assert!(!report.regressed(), "{}", report.headline());
    assert!(report.headline().contains("1 door effect lost its evidence"), "{}", report.headline());
}

#[test]
fn a_door_whose_gain_is_lost_in_noise_is_listed_but_not_a_regression() {
    let old = night(2);
    // MEMRA_A's sets are a little faster but so noisy (p90 twice the median) that the interval
    // straddles ×1.00: AMBIGUOUS, not SAME — the night cannot tell.
    let noisy = |mut r: Receipt| {
        for l in &mut r.measurements.latency {
            l.p90_ns = l.median_ns * 2;
            l.max_ns = l.max_ns.max(l.p90_ns);
        }
        r
    };
    let new = vec![
        timed(2, &[], 1.0),
        noisy(timed(2, &["MEMRA_A"], 0.9)),
        timed(2, &["MEMRA_B"], 1.0),
        noisy(timed(2, &["MEMRA_A", "MEMRA_B"], 0.9)),
    ];
    let report = memra_receipts::diff(&old, &new, Some(1.0)).unwrap();
    let c = report.door_changes.iter().find(|c| c.door == "MEMRA_A").expect("MEMRA_A changed");
    assert_eq!((c.old_effect, c.new_effect), (Effect::Faster, Effect::Ambiguous), "{c:?}");
    assert!(c.lost_evidence && !c.stopped_paying && !c.regression, "{c:?}");
    assert!(!report.regressed(), "{}", report.headline());
    assert!(report.to_markdown().contains("lost its evidence"), "{}", report.to_markdown());
}
