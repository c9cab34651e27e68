//! Requirement (d) of promotion (docs/DESIGN.md §7, `memra_gating::promote::gain`): an exact door
//! is promoted only when it pays. The histories are `crate::promote`'s synthetic nights, where
//! every door halves the step (the control: every door promotable); each test plants a slowdown
//! or removes a saving in one door's mechanism and checks that exactly that door turns to
//! "exact, no gain".

use memra_gating::promote::{promote_with, DoorStatus, Policy, PromotionReport, DEFAULT_NIGHTS};
use memra_gating::registry::Registry;
use memra_receipts::Receipt;

use crate::promote::{assert_promotable, history, legal_configs, write_history, Edit, REGISTRY};

/// Every latency of `r` × `factor`.
fn slow_down(r: &mut Receipt, factor: f64) {
    for l in &mut r.measurements.latency {
        for x in [&mut l.min_ns, &mut l.median_ns, &mut l.p90_ns, &mut l.max_ns] {
            *x = (*x as f64 * factor) as u64;
        }
    }
}

#[track_caller]
fn assert_no_gain(report: &PromotionReport, id: &str, needles: &[&str]) {
    let row = report.row(id).expect("row exists");
    assert_eq!(row.status, DoorStatus::ExactNoGain, "{id}: {row:?}\n{}", report.to_table());
    assert!(!row.promotable && row.blockers.is_empty(), "{row:?}");
    assert!(row.evidence.contains("exact over 7 nights") && row.evidence.contains("no gain"), "{row:?}");
    for n in needles {
        assert!(row.gain.contains(n), "{id} performance {:?} must contain {n:?}", row.gain);
    }
}

fn policy() -> Policy {
    Policy::default()
}

#[test]
fn negative_control_a_planted_slowdown_in_one_door_is_exact_no_gain() {
    // Control: the clean history pays for every door.
    let (_t, nights) = history(7, |_, _, _| Edit::Keep);
    let clean = promote_with(&crate::promote::registry(), &nights, policy());
    for id in ["door_a", "door_b", "num_c"] {
        assert_promotable(&clean, id);
        assert!(clean.row(id).unwrap().gain.contains("FASTER"), "{:?}", clean.row(id));
    }
    assert!(clean.to_table().contains("faster beyond noise in 7 of 7 night(s) (needs 5)"), "{}", clean.to_table());
    // door_a's mechanism now costs 2.5× wherever it runs: its own ratio is 0.5 × 2.5 = 1.25 against
    // the same set without it. Every run still passes its gates: exact, but no gain.
    let (_t, nights) = history(7, |_, c, r| {
        if c.doors.contains("door_a") {
            slow_down(r, 2.5);
        }
        Edit::Keep
    });
    let report = promote_with(&crate::promote::registry(), &nights, policy());
    assert_no_gain(&report, "door_a", &["faster beyond noise in 0 of 7", "host tp1 ×1.25"]);
    // The other doors still pay against parents that contain the slow door as well.
    assert_promotable(&report, "door_b");
    assert_promotable(&report, "num_c");
    assert!(report.to_table().contains("exact, no gain"), "{}", report.to_table());
    // The defaults block keeps it off and says why.
    let block = report.defaults_toml(&crate::promote::registry());
    assert!(block.contains("MEMRA_DOOR_A = false") && block.contains("no gain"), "{block}");
}

#[test]
fn enough_nights_must_pay_and_gain_nights_sets_how_many() {
    // door_a is slow in the first 3 nights: it pays in 4 of 7, one short of the default 5.
    let (_t, nights) = history(7, |k, c, r| {
        if k < 3 && c.doors.contains("door_a") {
            slow_down(r, 2.5);
        }
        Edit::Keep
    });
    let reg = crate::promote::registry();
    let report = promote_with(&reg, &nights, policy());
    assert_no_gain(&report, "door_a", &["in 4 of 7 night(s) (needs 5)", "first short: night 2026-11-21"]);
    let four = promote_with(&reg, &nights, policy().with_gain_nights(4).unwrap());
    assert_promotable(&four, "door_a");
    assert!(policy().with_gain_nights(0).is_err());
    let e = policy().with_gain_nights(DEFAULT_NIGHTS + 1).unwrap_err().to_string();
    assert!(e.contains("--gain-nights") && e.contains("between 1 and --nights (7)"), "{e}");
}

#[test]
fn a_door_that_declares_a_benefit_must_repeat_its_saving_instead() {
    let text = REGISTRY.replacen(
        "engagement = \"door_b.hits\"\n",
        "engagement = \"door_b.hits\"\nbenefit = { saves = \"launches\", counter = \"launch.*\", why = \"test: one launch fewer per step\" }\n",
        1,
    );
    let reg = Registry::from_toml_str(&text, "benefit registry").expect("valid");
    // door_b does not change the step's latency at all; it saves two launches, or (planted) none.
    let nights_with = |saves: bool| {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = write_history(tmp.path(), &reg, &legal_configs(&reg), 7, |_, c, r| {
            let on = c.doors.contains("door_b");
            if on {
                slow_down(r, 2.0);
            }
            let launches = if on && saves { 8 } else { 10 };
            r.evidence.census.insert("launch.gemv".to_string(), launches);
            Edit::Keep
        });
        (tmp, memra_gating::promote::load_history(&dirs).unwrap().nights)
    };
    let (_t, nights) = nights_with(true);
    let report = promote_with(&reg, &nights, policy());
    assert_promotable(&report, "door_b");
    assert!(report.row("door_b").unwrap().gain.contains("launches saved in 7 of 7"), "{:?}", report.row("door_b"));
    let (_t, nights) = nights_with(false);
    let report = promote_with(&reg, &nights, policy());
    assert_no_gain(&report, "door_b", &["launches saved in 0 of 7", "launch.* lower in 0 of"]);
    // A benefit naming no census counter is refused by the registry.
    let bad = text.replace("counter = \"launch.*\", why", "counter = \"nonsense\", why");
    let e = Registry::from_toml_str(&bad, "bad").unwrap_err().to_string();
    assert!(e.contains("benefit.counter") && e.contains("nonsense"), "{e}");
}
