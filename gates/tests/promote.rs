//! Promotion policy (docs/DESIGN.md §7) over synthetic nightly histories: receipt directories written
//! with the real writer (`memra_receipts::store::write_receipt`, which validates every receipt),
//! one per night, for a tiny registry whose `--matrix all` has 16 legal configurations per night.
//! Each test plants one defect in an otherwise clean history and checks that exactly the doors it
//! touches are refused, with the night and configuration named; the clean history is the control.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memra_gating::matrix::{enumerate, Configuration, MatrixKind};
use memra_gating::promote::{
    load_history, promote, promote_with, utc_date, Coverage, DoorStatus, Night, Policy, PromoteError, PromotionReport,
    DEFAULT_NIGHTS,
};
use memra_gating::registry::{BackendKind, DoorClass, Registry};
use memra_receipts::store::write_receipt;
use memra_receipts::{
    token_tape_digest, Backend, BuildEvidence, DigestRow, Evidence, Gate, GateResult, LatencyStats, Measurements,
    ModelEvidence, Receipt, ReceiptKind, RunConfigEvidence, SeamDigests, SeamLatency, Transport, Verdict,
};
use memra_runtime::config::Transport as RtTransport;

/// Two BIT-IDENTICAL doors, one NUMERIC-CLASS door and a canary; TP 1 and 2, host-bounce only,
/// host backend only: 2^3 door sets × 2 TP sizes = 16 legal configurations.
pub(crate) const REGISTRY: &str = r#"
schema_version = 2

[[door]]
id = "door_a"
env = "MEMRA_DOOR_A"
class = "BIT-IDENTICAL"
default = false
changes = "test door a"
gate = "identity"
engagement = "door_a.hits"
census = [{ counter = "launch.fold", change = "appears" }]
seams = ["o_join"]
tp = { allowed = [1, 2], why = "test registry: small matrix" }
transports = { allowed = ["host-bounce"], why = "test registry: small matrix" }
backends = ["host"]
not_applicable = { cuda = "test registry: host only" }
requires = []
conflicts = []

[[door]]
id = "door_b"
env = "MEMRA_DOOR_B"
class = "BIT-IDENTICAL"
default = false
changes = "test door b"
gate = "identity"
engagement = "door_b.hits"
census = [{ counter = "launch.fold", change = "appears" }]
seams = ["o_join"]
tp = { allowed = [1, 2], why = "test registry: small matrix" }
transports = { allowed = ["host-bounce"], why = "test registry: small matrix" }
backends = ["host"]
not_applicable = { cuda = "test registry: host only" }
requires = []
conflicts = []

[[door]]
id = "num_c"
env = "MEMRA_NUM_C"
class = "NUMERIC-CLASS"
default = false
changes = "test numeric door c"
gate = "argmax_tape+class_identity+error_budget"
engagement = "num_c.hits"
census = [{ counter = "launch.fold", change = "appears" }]
seams = ["qkv"]
tp = { allowed = [1, 2], why = "test registry: small matrix" }
transports = { allowed = ["host-bounce"], why = "test registry: small matrix" }
backends = ["host"]
not_applicable = { cuda = "test registry: host only" }
requires = []
conflicts = []
error_budget = { max_rel_error = 1e-3, near_tie_margin = 1e-2, why = "test budget" }

[[door]]
id = "canary_flip_bit"
env = "MEMRA_CANARY_FLIP_BIT"
class = "CANARY"
default = false
changes = "a planted defect"
gate = "identity"
engagement = "canary_flip_bit.flips"
census = [{ counter = "launch.fold", change = "appears" }]
seams = ["o_join"]
tp = { allowed = [1, 2], why = "test registry: small matrix" }
transports = { allowed = ["host-bounce"], why = "test registry: small matrix" }
backends = ["host"]
not_applicable = { cuda = "test registry: host only" }
requires = []
conflicts = []
"#;

pub(crate) fn registry() -> Registry {
    Registry::from_toml_str(REGISTRY, "test registry").expect("test registry is valid")
}

/// 2026-11-21 03:00 UTC: night `k` (0-based) starts `k` days later.
pub(crate) const FIRST_NIGHT_MS: u64 = 1_795_230_000_000;
pub(crate) const DAY_MS: u64 = 86_400_000;

pub(crate) fn night_date(k: usize) -> String {
    utc_date(FIRST_NIGHT_MS + k as u64 * DAY_MS)
}

/// What the synthetic nightly runs: `kind` at TP 1 and 2 over host-bounce on host (the baseline
/// at other TP sizes and transports contains no door, so promotion never asks for it).
fn nightly_configs(reg: &Registry, kind: MatrixKind) -> Vec<Configuration> {
    enumerate(reg, &kind, &[1, 2], &[RtTransport::HostBounce], &[BackendKind::Host]).expect("enumerates").legal
}

pub(crate) fn legal_configs(reg: &Registry) -> Vec<Configuration> {
    nightly_configs(reg, MatrixKind::All)
}

fn hash(s: &str) -> u64 {
    memra_receipts::fnv1a64(s.as_bytes())
}

/// A clean, validated PASS receipt of `config`, deterministic in the configuration (so the same
/// configuration gives the same tapes and digests every night).
pub(crate) fn clean_receipt(reg: &Registry, config: &Configuration, started_at_unix_ms: u64) -> Receipt {
    let doors: BTreeMap<String, bool> =
        config.doors.iter().map(|id| (reg.door(id).expect("known door").env.clone(), true)).collect();
    let numeric = config.doors.iter().any(|id| reg.door(id).is_some_and(|d| d.class == DoorClass::Numeric));
    let h = hash(&config.label());
    let tokens = vec![vec![(h % 97) as u32, ((h >> 8) % 97) as u32, ((h >> 16) % 97) as u32]];
    let mut gates = vec![];
    if numeric {
        for g in [Gate::ArgmaxTape, Gate::ClassIdentity, Gate::ErrorBudget] {
            gates.push(GateResult { gate: g, verdict: Verdict::Pass, detail: "ok".to_string() });
        }
    } else {
        gates.push(GateResult { gate: Gate::Identity, verdict: Verdict::Pass, detail: "8 cells equal".to_string() });
    }
    gates.push(GateResult {
        gate: Gate::Engagement,
        verdict: Verdict::Pass,
        detail: format!("{} door(s) engaged", config.doors.len()),
    });
    gates.push(GateResult {
        gate: Gate::NonTriviality,
        verdict: Verdict::Pass,
        detail: "no constant seam".to_string(),
    });
    gates.push(GateResult {
        gate: Gate::Determinism,
        verdict: Verdict::Pass,
        detail: "second run identical".to_string(),
    });
    let engaged = config.doors.iter().map(|id| (reg.door(id).unwrap().engagement.clone(), 2u64)).collect();
    let evidence = Evidence {
        config: RunConfigEvidence {
            subject: "memra-runtime".to_string(),
            backend: Backend::Host,
            tp: config.tp,
            transport: match config.transport {
                RtTransport::HostBounce => Transport::HostBounce,
                RtTransport::NativeP2p => Transport::NativeP2p,
                RtTransport::Nccl => Transport::Nccl,
            },
            doors,
            model: ModelEvidence { preset: "tiny".to_string(), digest: "9f2c41d07a3be851".to_string() },
            battery_digest: "4be1a6c20d93f7e5".to_string(),
            oracle: "tp1 host-bounce defaults on host".to_string(),
            batch: None,
            columns: None,
        },
        build: BuildEvidence {
            kernel_source_digest: "c0ffee0123456789".to_string(),
            nvrtc_options: vec![],
            subject_version: None,
        },
        verdict: Verdict::Pass,
        reason: None,
        gates,
        engaged,
        census: BTreeMap::new(),
        census_witness: None,
        coverage: BTreeMap::new(),
        claims: vec![],
        planted: None,
        first_divergence: None,
        digests: SeamDigests {
            columns: vec!["L0.qkv".to_string(), "L0.o_join".to_string()],
            rows: vec![DigestRow {
                prompt: 0,
                step: 0,
                digests: vec![format!("{:016x}", h), format!("{:016x}", h.rotate_left(17))],
            }],
        },
        token_tape_digest: token_tape_digest(&tokens),
        tokens,
        error_budget: vec![],
        near_ties: vec![],
        performance: None,
    };
    let measurements = Measurements {
        latency: paying_latency(config.doors.len()),
        wall_ms: 12.5,
        host: "test host".to_string(),
        device: None,
        p2p_probe: vec![],
        started_at_unix_ms,
        extra: BTreeMap::new(),
    };
    Receipt::new(ReceiptKind::Run, evidence, measurements)
}

/// Every door halves the step (seams `qkv` and `o_join` of one layer, 8 samples within ±1%): each
/// door is faster than its parent beyond the host's noise floor (METRICS.md, "Door effects"), so the exactness
/// tests below see promotable doors; `crate::promote_gain` plants slowdowns in it.
pub(crate) fn paying_latency(n_doors: usize) -> Vec<SeamLatency> {
    let scale = 0.5f64.powi(n_doors as i32);
    ["qkv", "o_join"]
        .iter()
        .map(|seam| {
            let med = (100_000.0 * scale) as u64;
            let stats = LatencyStats {
                n_samples: 8,
                min_ns: med * 99 / 100,
                median_ns: med,
                p90_ns: med * 101 / 100,
                max_ns: med * 102 / 100,
            };
            SeamLatency::new(0, *seam, stats)
        })
        .collect()
}

/// What a planted defect does to one night's receipt of one configuration.
pub(crate) enum Edit {
    Keep,
    /// Leave the receipt out of the night.
    Drop,
}

/// Write `n_nights` nights under `root` (directories named by date) from `configs`; `plant` may
/// change or drop any receipt (night index, configuration, receipt). Returns the directories in
/// night order.
pub(crate) fn write_history(
    root: &Path,
    reg: &Registry,
    configs: &[Configuration],
    n_nights: usize,
    plant: impl Fn(usize, &Configuration, &mut Receipt) -> Edit,
) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for k in 0..n_nights {
        let dir = root.join(night_date(k));
        std::fs::create_dir_all(&dir).unwrap();
        for (i, config) in configs.iter().enumerate() {
            let mut r = clean_receipt(reg, config, FIRST_NIGHT_MS + k as u64 * DAY_MS + i as u64 * 1000);
            if let Edit::Drop = plant(k, config, &mut r) {
                continue;
            }
            // Re-derive what the edit may have changed, so the receipt still validates.
            r.evidence.token_tape_digest = token_tape_digest(&r.evidence.tokens);
            r.run_id = memra_receipts::run_id(&r.evidence.config);
            write_receipt(&dir, &r).expect("receipt validates and writes");
        }
        dirs.push(dir);
    }
    dirs
}

pub(crate) fn is(config: &Configuration, tp: usize, doors: &[&str]) -> bool {
    config.tp == tp && config.doors.iter().map(String::as_str).eq(doors.iter().copied())
}

pub(crate) fn history(
    n_nights: usize,
    plant: impl Fn(usize, &Configuration, &mut Receipt) -> Edit,
) -> (tempfile::TempDir, Vec<Night>) {
    let reg = registry();
    let tmp = tempfile::tempdir().unwrap();
    let dirs = write_history(tmp.path(), &reg, &legal_configs(&reg), n_nights, plant);
    let nights = load_history(&dirs).expect("history loads").nights;
    (tmp, nights)
}

pub(crate) fn report_of(nights: &[Night]) -> PromotionReport {
    promote(&registry(), nights, DEFAULT_NIGHTS)
}

#[track_caller]
pub(crate) fn assert_promotable(report: &PromotionReport, id: &str) {
    let row = report.row(id).expect("row exists");
    assert!(row.promotable, "{id} must be promotable; got {row:?}\n{}", report.to_table());
    assert_eq!(row.status, DoorStatus::Promotable);
}

#[track_caller]
pub(crate) fn assert_blocked(report: &PromotionReport, id: &str, needles: &[&str]) {
    let row = report.row(id).expect("row exists");
    assert!(!row.promotable, "{id} must be refused; got {row:?}");
    assert_eq!(row.status, DoorStatus::Blocked);
    for n in needles {
        assert!(row.evidence.contains(n), "{id} evidence {:?} must contain {n:?}", row.evidence);
    }
}

// ---- the tests -----------------------------------------------------------------------------------

#[test]
fn test_matrix_is_sixteen_configurations() {
    // The counts below (56 runs = 8 configurations containing a door × 7 nights) rest on this.
    let reg = registry();
    let configs = legal_configs(&reg);
    assert_eq!(configs.len(), 16, "{configs:?}");
    assert_eq!(configs.iter().filter(|c| c.doors.contains("door_a")).count(), 8);
    // Promotion enumerates every TP size and transport; only the door-free baseline adds more.
    let every = enumerate(&reg, &MatrixKind::All, &[1, 2, 4, 8], &RtTransport::ALL, &[BackendKind::Host]).unwrap();
    let with_doors: Vec<&Configuration> = every.legal.iter().filter(|c| !c.doors.is_empty()).collect();
    assert_eq!(with_doors.len(), 14, "{with_doors:?}");
    assert!(with_doors.iter().all(|c| configs.contains(c)));
}

#[test]
fn builtin_registry_is_decided_from_a_thin_night_without_exploding() {
    // One host night holding only the baseline: every door of the real registry is refused, each
    // with a reason, and the 2^15-set `all` enumeration stays fast (it is done once per night's
    // backend set, not per door).
    let reg = Registry::builtin().unwrap();
    let baseline = Configuration::baseline(1, RtTransport::HostBounce, BackendKind::Host);
    let receipt = clean_receipt(&reg, &baseline, FIRST_NIGHT_MS);
    let nights: Vec<Night> = (0..7)
        .map(|k| {
            let mut r = receipt.clone();
            r.measurements.started_at_unix_ms += k as u64 * DAY_MS;
            Night::new(format!("n{k}"), vec![r]).unwrap()
        })
        .collect();
    let started = std::time::Instant::now();
    let report = promote(&reg, &nights, 7);
    assert!(started.elapsed().as_secs() < 30, "promotion took {:?}", started.elapsed());
    assert_eq!(report.rows.len(), reg.doors().len());
    for row in &report.rows {
        let door = reg.door(&row.id).unwrap();
        assert!(!row.promotable, "{row:?}");
        match door.class {
            DoorClass::Canary => assert_eq!(row.status, DoorStatus::Canary),
            _ if door.default => assert_eq!(row.status, DoorStatus::AlreadyDefault),
            _ if door.backends == [BackendKind::Cuda] => assert!(
                row.evidence.contains("no legal combination contains") && row.evidence.contains("(host)"),
                "{row:?}"
            ),
            _ => assert!(row.evidence.contains("night 2026-11-21 (n0): no receipt for tp"), "{row:?}"),
        }
    }
}

#[test]
fn door_passing_every_night_is_promotable() {
    let (_tmp, nights) = history(7, |_, _, _| Edit::Keep);
    assert_eq!(nights.len(), 7);
    let report = report_of(&nights);
    assert_promotable(&report, "door_a");
    assert_promotable(&report, "door_b");
    assert_promotable(&report, "num_c");
    let a = report.row("door_a").unwrap();
    assert_eq!(a.evidence, "passed 7 nights, 56 runs");
    assert_eq!((a.nights, a.runs), (7, 56));
    assert_eq!(report.row("num_c").unwrap().evidence, "passed 7 nights, 56 runs, class baseline unchanged");
    assert_eq!(report.window.first().map(String::as_str), Some(night_date(0).as_str()));
    assert_eq!(report.promotable(), ["door_a", "door_b", "num_c"]);
}

#[test]
fn door_failing_on_night_4_is_refused_naming_night_and_configuration() {
    let (_tmp, nights) = history(7, |k, c, r| {
        if k == 3 && is(c, 2, &["door_b"]) {
            r.evidence.verdict = Verdict::Fail;
            r.evidence.gates[0] =
                GateResult { gate: Gate::Identity, verdict: Verdict::Fail, detail: "L0.o_join differs".to_string() };
        }
        Edit::Keep
    });
    let report = report_of(&nights);
    let night4 = night_date(3);
    assert_eq!(night4, "2026-11-24");
    assert_blocked(
        &report,
        "door_b",
        &[
            "night 2026-11-24",
            "tp2 host-bounce host +door_b",
            "verdict FAIL",
            "gate identity FAIL",
            "L0.o_join differs",
        ],
    );
    assert_eq!(report.row("door_b").unwrap().blockers.len(), 1, "exactly one receipt is bad");
    // The failing configuration does not contain door_a or num_c: they are unaffected.
    assert_promotable(&report, "door_a");
    assert_promotable(&report, "num_c");
}

#[test]
fn failure_in_a_shared_combination_blocks_every_door_in_it() {
    let (_tmp, nights) = history(7, |k, c, r| {
        if k == 1 && is(c, 1, &["door_a", "door_b"]) {
            r.evidence.verdict = Verdict::Error;
            r.evidence.reason = Some("layer 0 o_join: worker panicked".to_string());
        }
        Edit::Keep
    });
    let report = report_of(&nights);
    for id in ["door_a", "door_b"] {
        assert_blocked(&report, id, &["night 2026-11-22", "tp1 host-bounce host +door_a+door_b", "verdict ERROR"]);
    }
    assert_promotable(&report, "num_c");
}

#[test]
fn numeric_door_whose_class_baseline_tape_changes_is_refused_naming_the_night() {
    let (_tmp, nights) = history(7, |k, c, r| {
        // Night 5: the TP1 host-bounce class baseline still PASSes but its tape moved.
        if k == 4 && is(c, 1, &["num_c"]) {
            r.evidence.tokens[0][1] += 1;
        }
        Edit::Keep
    });
    let report = report_of(&nights);
    assert_blocked(
        &report,
        "num_c",
        &[
            "night 2026-11-25",
            "class baseline tp1 host-bounce host +num_c changed since night 2026-11-21",
            "token_tape_digest",
        ],
    );
    assert_promotable(&report, "door_a");
    assert_promotable(&report, "door_b");
}

#[test]
fn numeric_class_baseline_seam_digest_change_is_refused() {
    let (_tmp, nights) = history(7, |k, c, r| {
        if k == 6 && is(c, 1, &["num_c"]) {
            r.evidence.digests.rows[0].digests[1] = "0123456789abcdef".to_string();
        }
        Edit::Keep
    });
    let report = report_of(&nights);
    assert_blocked(&report, "num_c", &["night 2026-11-27", "seam digest L0.o_join p0 s0"]);
}

#[test]
fn identity_door_baseline_tape_change_is_not_a_class_baseline_rule() {
    // Negative control for the NUMERIC-only rule: the same edit on a BIT door's TP1 run (still
    // PASS) does not block it.
    let (_tmp, nights) = history(7, |k, c, r| {
        if k == 4 && is(c, 1, &["door_a"]) {
            r.evidence.tokens[0][1] += 1;
        }
        Edit::Keep
    });
    assert_promotable(&report_of(&nights), "door_a");
}

#[test]
fn night_missing_a_legal_combination_is_refused_naming_it() {
    let (_tmp, nights) =
        history(7, |k, c, _| if k == 5 && is(c, 2, &["door_a", "door_b"]) { Edit::Drop } else { Edit::Keep });
    let report = report_of(&nights);
    for id in ["door_a", "door_b"] {
        assert_blocked(&report, id, &["night 2026-11-26: no receipt for tp2 host-bounce host +door_a+door_b"]);
    }
    assert_promotable(&report, "num_c");
    // Coverage::Ran asks only that what ran passed: the gap does not block there.
    let ran = promote_with(&registry(), &nights, Policy { n_last: 7, coverage: Coverage::Ran, gain_nights: None });
    assert_promotable(&ran, "door_a");
    assert_promotable(&ran, "door_b");
}

#[test]
fn only_six_nights_are_refused() {
    let (_tmp, nights) = history(6, |_, _, _| Edit::Keep);
    let report = report_of(&nights);
    for id in ["door_a", "door_b", "num_c"] {
        assert_blocked(&report, id, &["only 6 of the required 7 nights"]);
    }
    // Control: the same six nights satisfy a six-night policy.
    assert_promotable(&promote(&registry(), &nights, 6), "door_a");
}

#[test]
fn only_the_last_n_nights_count() {
    // A failure 8 nights ago is outside a 7-night window.
    let (_tmp, nights) = history(8, |k, c, r| {
        if k == 0 && is(c, 1, &["door_a"]) {
            r.evidence.verdict = Verdict::Fail;
        }
        Edit::Keep
    });
    let report = report_of(&nights);
    assert_promotable(&report, "door_a");
    assert_eq!(report.window.first().map(String::as_str), Some("2026-11-22"));
    assert_blocked(&promote(&registry(), &nights, 8), "door_a", &["night 2026-11-21", "tp1 host-bounce host +door_a"]);
}

#[test]
fn engagement_counter_zero_is_refused() {
    let (_tmp, nights) = history(7, |k, c, r| {
        // Verdict and engagement gate still say PASS; only the counter shows nothing ran.
        if k == 1 && is(c, 1, &["door_a"]) {
            r.evidence.engaged.insert("door_a.hits".to_string(), 0);
        }
        Edit::Keep
    });
    let report = report_of(&nights);
    assert_blocked(&report, "door_a", &["night 2026-11-22", "tp1 host-bounce host +door_a", "counter door_a.hits = 0"]);
    assert_promotable(&report, "door_b");
}

#[test]
fn pass_receipt_without_a_passing_engagement_gate_is_refused() {
    // The overall verdict says PASS, but the engagement gate is missing (door_b) or not PASS
    // (num_c): engagement is not proven, whatever the counters say.
    let (_tmp, nights) = history(7, |k, c, r| {
        if k == 2 && is(c, 2, &["door_b"]) {
            r.evidence.gates.retain(|g| g.gate != Gate::Engagement);
        }
        if k == 3 && is(c, 1, &["num_c"]) {
            let g = r.evidence.gates.iter_mut().find(|g| g.gate == Gate::Engagement).unwrap();
            g.verdict = Verdict::Void;
            g.detail = "enabled but never engaged".to_string();
        }
        Edit::Keep
    });
    let report = report_of(&nights);
    assert_blocked(&report, "door_b", &["night 2026-11-23", "tp2 host-bounce host +door_b", "no engagement gate"]);
    assert_blocked(&report, "num_c", &["night 2026-11-24", "tp1 host-bounce host +num_c", "gate engagement VOID"]);
    assert_promotable(&report, "door_a");
}

#[test]
fn void_engagement_gate_is_refused() {
    let (_tmp, nights) = history(7, |k, c, r| {
        if k == 2 && is(c, 2, &["door_a", "num_c"]) {
            r.evidence.verdict = Verdict::Void;
            r.evidence.reason = Some("num_c never engaged".to_string());
            let g = r.evidence.gates.iter_mut().find(|g| g.gate == Gate::Engagement).unwrap();
            g.verdict = Verdict::Void;
            g.detail = "enabled but never engaged: num_c (counter num_c.hits = 0)".to_string();
        }
        Edit::Keep
    });
    let report = report_of(&nights);
    for id in ["door_a", "num_c"] {
        assert_blocked(
            &report,
            id,
            &["night 2026-11-23", "tp2 host-bounce host +door_a+num_c", "verdict VOID", "gate engagement VOID"],
        );
    }
    assert_promotable(&report, "door_b");
}

#[test]
fn canary_is_never_promotable_and_default_doors_are_reported() {
    let (_tmp, nights) = history(7, |_, _, _| Edit::Keep);
    let report = report_of(&nights);
    let canary = report.row("canary_flip_bit").unwrap();
    assert_eq!(canary.status, DoorStatus::Canary);
    assert!(!canary.promotable);
    // The same history against a registry where door_a is already on by default.
    let text =
        REGISTRY.replacen("default = false\nchanges = \"test door a\"", "default = true\nchanges = \"test door a\"", 1);
    assert_ne!(text, REGISTRY);
    let reg = Registry::from_toml_str(&text, "test registry (door_a on)").unwrap();
    let report = promote(&reg, &nights, 7);
    let a = report.row("door_a").unwrap();
    assert_eq!(a.status, DoorStatus::AlreadyDefault, "{a:?}");
    assert!(!a.promotable && a.evidence.contains("already default-on"), "{a:?}");
    assert!(report.defaults_toml(&reg).contains("MEMRA_DOOR_A = true  # already default"));
}

#[test]
fn defaults_block_and_registry_update() {
    let (_tmp, nights) = history(7, |k, c, r| {
        if k == 3 && is(c, 2, &["door_b"]) {
            r.evidence.verdict = Verdict::Fail;
        }
        Edit::Keep
    });
    let reg = registry();
    let report = report_of(&nights);
    let toml_text = report.defaults_toml(&reg);
    assert!(toml_text.contains("[defaults]\n"), "{toml_text}");
    assert!(toml_text.contains("MEMRA_DOOR_A = true  # promoted: passed 7 nights, 56 runs\n"), "{toml_text}");
    assert!(toml_text.contains("MEMRA_DOOR_B = false  # not promoted: night 2026-11-24"), "{toml_text}");
    assert!(toml_text.contains("MEMRA_NUM_C = true  # promoted"), "{toml_text}");
    assert!(!toml_text.contains("CANARY"), "canaries are not listed: {toml_text}");
    // The snippet is TOML.
    let parsed: toml::Table = toml::from_str(&toml_text).expect("defaults block is TOML");
    let defaults = parsed["defaults"].as_table().unwrap();
    assert_eq!(defaults.len(), 3);
    assert_eq!(defaults["MEMRA_DOOR_B"].as_bool(), Some(false));

    // The committable form: the registry text with the promoted defaults flipped, nothing else.
    let updated = report.apply_to_registry_text(REGISTRY, "test registry").unwrap();
    let new_reg = Registry::from_toml_str(&updated, "updated").unwrap();
    let on: Vec<String> = new_reg.defaults().into_iter().collect();
    assert_eq!(on, ["door_a", "num_c"]);
    assert_eq!(updated.len() + 2, REGISTRY.len(), "two `false` became `true`, nothing else changed");
}

#[test]
fn coverage_ran_accepts_a_single_matrix_night_but_full_does_not() {
    let reg = registry();
    let single = nightly_configs(&reg, MatrixKind::Single);
    assert_eq!(single.len(), 8, "baseline + 3 doors, TP1 and TP2");
    let tmp = tempfile::tempdir().unwrap();
    let dirs = write_history(tmp.path(), &reg, &single, 7, |_, _, _| Edit::Keep);
    let nights = load_history(&dirs).unwrap().nights;
    let full = promote(&reg, &nights, 7);
    assert_blocked(&full, "door_a", &["night 2026-11-21: no receipt for tp1 host-bounce host +door_a+door_b"]);
    let ran = promote_with(&reg, &nights, Policy { n_last: 7, coverage: Coverage::Ran, gain_nights: None });
    assert_promotable(&ran, "door_a");
    assert_eq!(ran.row("door_a").unwrap().evidence, "passed 7 nights, 14 runs");

    // Under Ran, a failing receipt still blocks; and a night without any receipt of the door too.
    let tmp2 = tempfile::tempdir().unwrap();
    let dirs = write_history(tmp2.path(), &reg, &single, 7, |k, c, r| {
        if k == 6 && is(c, 2, &["door_a"]) {
            r.evidence.verdict = Verdict::Fail;
        }
        if k == 2 && c.doors.contains("door_b") {
            return Edit::Drop;
        }
        Edit::Keep
    });
    let nights = load_history(&dirs).unwrap().nights;
    let ran = promote_with(&reg, &nights, Policy { n_last: 7, coverage: Coverage::Ran, gain_nights: None });
    assert_blocked(&ran, "door_a", &["night 2026-11-27", "tp2 host-bounce host +door_a", "verdict FAIL"]);
    assert_blocked(&ran, "door_b", &["night 2026-11-23: no PASS receipt contains door_b"]);
    assert_promotable(&ran, "num_c");
}

#[test]
fn history_is_ordered_by_date_not_by_argument_or_name() {
    let reg = registry();
    let configs: Vec<Configuration> = legal_configs(&reg).into_iter().take(2).collect();
    let tmp = tempfile::tempdir().unwrap();
    let mut dirs = write_history(tmp.path(), &reg, &configs, 3, |_, _, _| Edit::Keep);
    // Rename so that directory names sort against the dates.
    let renamed: Vec<PathBuf> = ["zz", "mm", "aa"].iter().map(|n| tmp.path().join(n)).collect();
    for (from, to) in dirs.iter().zip(&renamed) {
        std::fs::rename(from, to).unwrap();
    }
    dirs = renamed.into_iter().rev().collect();
    let nights = load_history(&dirs).unwrap().nights;
    let labels: Vec<&str> = nights.iter().map(|n| n.label.as_str()).collect();
    assert_eq!(labels, ["2026-11-21 (zz)", "2026-11-22 (mm)", "2026-11-23 (aa)"]);
    assert_eq!(nights[0].started_at_unix_ms, FIRST_NIGHT_MS);
}

#[test]
fn history_errors_name_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("2026-11-27");
    std::fs::create_dir(&empty).unwrap();
    let e = load_history(std::slice::from_ref(&empty)).unwrap_err();
    assert!(matches!(e, PromoteError::EmptyNight { .. }), "{e:?}");
    assert!(e.to_string().contains("2026-11-27") && e.to_string().contains("no run-*.json receipt"), "{e}");

    let missing = tmp.path().join("no-such-night");
    let e = load_history(std::slice::from_ref(&missing)).unwrap_err();
    assert!(matches!(e, PromoteError::Receipt { .. }) && e.to_string().contains("no-such-night"), "{e}");

    let broken = tmp.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::write(broken.join("run-0123456789abcdef.json"), "{ not json").unwrap();
    let e = load_history(std::slice::from_ref(&broken)).unwrap_err();
    assert!(e.to_string().contains("broken"), "{e}");

    assert!(matches!(load_history(&[]).unwrap_err(), PromoteError::NoHistory));

    let reg = registry();
    let dirs = write_history(&tmp.path().join("h"), &reg, &legal_configs(&reg)[..1], 1, |_, _, _| Edit::Keep);
    let twice = vec![dirs[0].clone(), dirs[0].join("../").join(night_date(0))];
    let e = load_history(&twice).unwrap_err();
    assert!(matches!(e, PromoteError::DuplicateNight { .. }) && e.to_string().contains("given twice"), "{e}");
}

#[test]
fn zero_night_policy_is_refused() {
    let (_tmp, nights) = history(1, |_, _, _| Edit::Keep);
    let report = promote(&registry(), &nights, 0);
    assert!(report.rows.iter().all(|r| !r.promotable), "{}", report.to_table());
    assert!(report.row("door_a").unwrap().evidence.contains("at least 1 night"));
    assert!(Policy::new(0, Coverage::Full).is_err());
    assert_eq!(Coverage::parse("ran").unwrap(), Coverage::Ran);
    assert!(Coverage::parse("all").unwrap_err().to_string().contains("\"all\""));
}

#[test]
fn table_names_every_door_and_its_evidence() {
    let (_tmp, nights) =
        history(7, |k, c, _| if k == 5 && is(c, 2, &["door_a", "door_b"]) { Edit::Drop } else { Edit::Keep });
    let table = report_of(&nights).to_table();
    for needle in [
        "door_a",
        "MEMRA_NUM_C",
        "NUMERIC-CLASS",
        "blocked",
        "promotable",
        "canary",
        "no receipt for tp2",
        "1 of 4 door(s) promotable",
    ] {
        assert!(table.contains(needle), "table must contain {needle:?}:\n{table}");
    }
}

#[test]
fn utc_dates() {
    assert_eq!(utc_date(0), "1970-01-01");
    assert_eq!(utc_date(1_767_225_600_000), "2026-01-01");
    assert_eq!(utc_date(951_782_400_000), "2000-02-29");
    assert_eq!(night_date(0), "2026-11-21");
}

#[test]
fn registry_update_applies_to_the_builtin_doors_toml() {
    // Every non-canary door of the real doors.toml that may be default-on (it runs at TP1
    // host-bounce, the oracle's configuration, needs no other door and conflicts with none chosen
    // before it) marked promotable: the line edit must find each entry's `default = false` through
    // the real file's comments and multi-line tables, and pass over the other entries.
    let reg = Registry::builtin().unwrap();
    let mut chosen: Vec<&str> = Vec::new();
    for d in reg.doors() {
        let runs_in_oracle = d.tp.contains(&1) && d.transports.contains(&RtTransport::HostBounce);
        if !d.is_canary() && runs_in_oracle && d.requires.is_empty() && chosen.iter().all(|c| d.conflict(c).is_none()) {
            chosen.push(&d.id);
        }
    }
    assert!(chosen.len() >= 5, "{chosen:?}");
    let rows_with = |promoted: &dyn Fn(&str) -> bool| -> Vec<memra_gating::promote::DoorRow> {
        reg.doors()
            .iter()
            .map(|d| {
                let status = if d.is_canary() {
                    DoorStatus::Canary
                } else if promoted(&d.id) {
                    DoorStatus::Promotable
                } else {
                    DoorStatus::Blocked
                };
                memra_gating::promote::DoorRow {
                    id: d.id.clone(),
                    env: d.env.clone(),
                    class: d.class,
                    status,
                    promotable: status == DoorStatus::Promotable,
                    evidence: "passed 7 nights, 1 runs".to_string(),
                    blockers: vec![],
                    nights: 7,
                    runs: 1,
                    gain: String::new(),
                }
            })
            .collect()
    };
    let report =
        PromotionReport { policy: Policy::default(), window: vec![], rows: rows_with(&|id| chosen.contains(&id)) };
    let text = memra_gating::registry::BUILTIN_REGISTRY;
    let updated = report.apply_to_registry_text(text, "doors.toml").unwrap();
    let new_reg = Registry::from_toml_str(&updated, "updated doors.toml").unwrap();
    for d in new_reg.doors() {
        assert_eq!(d.default, chosen.contains(&d.id.as_str()), "{}", d.id);
    }
    assert_eq!(updated.len() + chosen.len(), text.len());
    // The negative control: every non-canary door default-on is refused by the registry's rule
    // that default-on doors run in the oracle's configuration, naming a door that cannot.
    let all = PromotionReport { policy: Policy::default(), window: vec![], rows: rows_with(&|_| true) };
    let e = all.apply_to_registry_text(text, "doors.toml").unwrap_err().to_string();
    assert!(e.contains("door \"oproj_direct\" default = true") && e.contains("TP1 host-bounce"), "{e}");
    // A report naming a door the text does not have is an error naming it.
    let e = all.apply_to_registry_text(REGISTRY, "test registry").unwrap_err();
    assert!(e.to_string().contains("oproj_direct"), "{e}");
}

/// Three copies of one night's receipts under three names are one night: a history of them does
/// not reach a 3-night window, and the loader says which directories were copies.
#[test]
fn copies_of_one_night_count_once() {
    let reg = registry();
    let tmp = tempfile::tempdir().unwrap();
    let dirs = write_history(&tmp.path().join("h"), &reg, &legal_configs(&reg), 1, |_, _, _| Edit::Keep);
    let mut copies = vec![dirs[0].clone()];
    for name in ["copy-1", "copy-2"] {
        let to = tmp.path().join(name);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(&dirs[0]).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
        copies.push(to);
    }
    let history = load_history(&copies).unwrap();
    assert_eq!(history.nights.len(), 1, "three copies are one night");
    assert_eq!(history.warnings.len(), 2, "{:?}", history.warnings);
    assert!(
        history.warnings[0].contains("copy-1") && history.warnings[0].contains("counted once"),
        "{:?}",
        history.warnings
    );
    let report = promote(&reg, &history.nights, 3);
    assert!(report.promotable().is_empty(), "one night cannot promote over a 3-night window:\n{}", report.to_table());
    assert!(
        report.row("door_a").unwrap().evidence.contains("only 1 of the required 3 nights"),
        "{}",
        report.to_table()
    );
}

/// A night holds one model's evidence, and a history one model's nights.
#[test]
fn mixed_models_are_refused_within_a_night_and_across_the_history() {
    let reg = registry();
    let tmp = tempfile::tempdir().unwrap();
    let other_model = |k: usize, _: &Configuration, r: &mut Receipt| {
        if k == 1 {
            r.evidence.config.model.digest = "00000000000000aa".into();
        }
        Edit::Keep
    };
    let dirs = write_history(&tmp.path().join("h"), &reg, &legal_configs(&reg), 2, other_model);
    let e = load_history(&dirs).unwrap_err();
    assert!(matches!(e, PromoteError::ModelChanged { .. }), "{e:?}");
    assert!(e.to_string().contains("00000000000000aa") && e.to_string().contains("separately"), "{e}");

    let mixed = |_: usize, c: &Configuration, r: &mut Receipt| {
        if is(c, 2, &[]) {
            r.evidence.config.model.digest = "00000000000000bb".into();
        }
        Edit::Keep
    };
    let dirs = write_history(&tmp.path().join("m"), &reg, &legal_configs(&reg), 1, mixed);
    let e = load_history(&dirs).unwrap_err();
    assert!(matches!(e, PromoteError::MixedModels { .. }), "{e:?}");
    assert!(e.to_string().contains("2 models"), "{e}");
}
