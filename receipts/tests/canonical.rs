//! Canonical writer and strict reader.

use std::path::Path;

use memra_receipts::json::{parse_receipt, parse_summary, receipt_to_json, summary_to_json, to_canonical_json};
use memra_receipts::*;
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::util::*;

fn origin() -> &'static Path {
    Path::new("runs/run-x.json")
}

fn shapes() -> Vec<(&'static str, Receipt)> {
    let base = passing(2, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)]);
    vec![
        ("pass", base.clone()),
        ("fail with divergence", failing(base.clone())),
        ("skip", skipped(base.clone(), "no peer access between devices 0 and 1")),
        ("error", errored(base.clone(), "layer 1 o_join: CUDA_ERROR_ILLEGAL_ADDRESS")),
        ("void", with_verdict(base.clone(), Verdict::Void, "MEMRA_OPROJ_DIRECT did not engage")),
        ("performance", performance(base)),
    ]
}

/// Parses `text` after editing its JSON value; the edit works on the generic tree.
fn parse_edited(r: &Receipt, f: impl FnOnce(&mut Value)) -> Result<Receipt, ReceiptError> {
    let mut v: Value = serde_json::from_str(&receipt_to_json(r).unwrap()).unwrap();
    f(&mut v);
    parse_receipt(serde_json::to_string_pretty(&v).unwrap().as_bytes(), origin())
}

#[test]
fn round_trip_is_byte_identical_for_every_shape() {
    for (name, r) in shapes() {
        let first = receipt_to_json(&r).unwrap_or_else(|e| panic!("{name}: {e}"));
        let back = parse_receipt(first.as_bytes(), origin()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back, r, "{name}: read back differs");
        assert_eq!(receipt_to_json(&back).unwrap(), first, "{name}: second write differs");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]
    #[test]
    fn prop_write_read_write_is_byte_identical(r in arb_receipt()) {
        let first = receipt_to_json(&r).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let back = parse_receipt(first.as_bytes(), origin()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&back, &r);
        prop_assert_eq!(receipt_to_json(&back).unwrap(), first);
    }

    #[test]
    fn prop_run_id_is_16_hex_and_ignores_door_insertion_order(cfg in arb_config()) {
        let id = run_id(&cfg);
        prop_assert_eq!(id.len(), 16);
        prop_assert!(id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let mut reversed = cfg.clone();
        reversed.doors = cfg.doors.iter().rev().map(|(k, v)| (k.clone(), *v)).collect();
        prop_assert_eq!(run_id(&reversed), id);
    }
}

#[test]
fn evidence_is_deterministic_for_equal_configurations() {
    let a = passing(4, Transport::HostBounce, &[("MEMRA_STEP_EP", true)]);
    let mut b = passing(4, Transport::HostBounce, &[("MEMRA_STEP_EP", true)]);
    b.measurements.wall_ms = 999.0;
    b.measurements.started_at_unix_ms += 86_400_000;
    assert_eq!(to_canonical_json(&a.evidence).unwrap(), to_canonical_json(&b.evidence).unwrap());
    assert_ne!(receipt_to_json(&a).unwrap(), receipt_to_json(&b).unwrap());
}

#[test]
fn key_order_follows_struct_order_and_map_order() {
    // Doors given in reverse order come out sorted.
    let r = passing(2, Transport::NativeP2p, &[("MEMRA_Z_LAST", true), ("MEMRA_A_FIRST", false)]);
    let text = receipt_to_json(&r).unwrap();
    let pos = |needle: &str| text.find(needle).unwrap_or_else(|| panic!("{needle} not in output"));
    let ordered = |keys: &[&str]| {
        let p: Vec<usize> = keys.iter().map(|k| pos(k)).collect();
        assert!(p.windows(2).all(|w| w[0] < w[1]), "keys out of order: {keys:?} at {p:?}");
    };
    ordered(&["\"schema_version\"", "\"kind\"", "\"run_id\"", "\"evidence\"", "\"measurements\""]);
    ordered(&[
        "\"config\"",
        "\"build\"",
        "\"verdict\"",
        "\"reason\"",
        "\"gates\"",
        "\"engaged\"",
        "\"census\"",
        "\"coverage\"",
        "\"claims\"",
        "\"planted\"",
        "\"first_divergence\"",
        "\"digests\"",
        "\"tokens\"",
        "\"token_tape_digest\"",
        "\"error_budget\"",
        "\"near_ties\"",
        "\"performance\"",
    ]);
    ordered(&["\"MEMRA_A_FIRST\": false", "\"MEMRA_Z_LAST\": true"]);
    assert!(text.starts_with("{\n  \"schema_version\": 2,\n  \"kind\": \"run\",\n"), "{}", &text[..60]);
}

#[test]
fn canonical_text_layout_and_float_forms() {
    let mut r = performance(passing(1, Transport::HostBounce, &[]));
    r.measurements.extra = [
        ("a_one", 1.0),
        ("b_tenth", 0.1),
        ("c_tiny", 1e-7),
        ("d_huge", 1.5e16),
        ("e_neg_zero", -0.0),
        ("f_third", 1.0 / 3.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    r.evidence.near_ties[0].margin = 0.1f32;
    let text = receipt_to_json(&r).unwrap();
    for line in [
        "\"a_one\": 1.0",
        "\"b_tenth\": 0.1",
        "\"c_tiny\": 1e-7",
        "\"d_huge\": 1.5e16",
        "\"e_neg_zero\": -0.0",
        "\"f_third\": 0.3333333333333333",
        // f32 fields are written with f32 precision.
        "\"margin\": 0.1",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(text.ends_with("}\n") && !text.ends_with("\n\n"), "exactly one trailing newline");
    assert!(text.contains("\n    \"config\": {\n      \"subject\""), "2-space indentation");
    assert!(
        text.contains("\n      \"nvrtc_options\": [\"--gpu-architecture=sm_90\", \"--fmad=false\"],\n"),
        "scalar arrays on one line"
    );
    assert!(text.contains("\n    \"tokens\": [\n      [17, 24, 31],\n      [48, 55, 62]\n    ],\n"), "{text}");
    assert!(text.contains("\n    \"error_budget\": [\n      {\n"), "arrays of objects stay multi-line");
    assert!(text.contains("\"first_divergence\": null"), "absent values are explicit nulls");
}

#[test]
fn f32_known_double_rounding_case_round_trips() {
    // 0x15ae43fd is a value that reads back 1 ulp off when parsed via f64 and narrowed.
    let mut r = performance(passing(1, Transport::HostBounce, &[]));
    r.evidence.near_ties[0].margin = f32::from_bits(0x15ae_43fd);
    let text = receipt_to_json(&r).unwrap();
    let back = parse_receipt(text.as_bytes(), origin()).unwrap();
    assert_eq!(back.evidence.near_ties[0].margin.to_bits(), 0x15ae_43fd);
}

#[test]
fn non_finite_floats_are_rejected_naming_the_field() {
    let base = performance(passing(1, Transport::HostBounce, &[]));
    let cases: Vec<(&str, ReceiptEdit)> = vec![
        ("measurements.wall_ms", Box::new(|r| r.measurements.wall_ms = f64::NAN)),
        ("evidence.error_budget[0].max_rel", Box::new(|r| r.evidence.error_budget[0].max_rel = f64::INFINITY)),
        ("evidence.near_ties[0].margin", Box::new(|r| r.evidence.near_ties[0].margin = f32::NAN)),
        (
            "measurements.extra.gate_overhead_ms",
            Box::new(|r| {
                r.measurements.extra.insert("gate_overhead_ms".into(), f64::NEG_INFINITY);
            }),
        ),
        (
            "evidence.performance.ratios.L0.latency_over_pytorch",
            Box::new(|r| {
                r.evidence.performance.as_mut().unwrap().ratios.insert("L0.latency_over_pytorch".into(), f64::NAN);
            }),
        ),
    ];
    for (field, break_it) in cases {
        let mut r = base.clone();
        break_it(&mut r);
        match receipt_to_json(&r) {
            Err(ReceiptError::NonFinite { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected NonFinite, got {other:?}"),
        }
        let msg = to_canonical_json(&r).unwrap_err().to_string();
        assert!(msg.contains(field) && msg.contains("non-finite"), "{msg}");
    }
}

#[test]
fn unknown_schema_version_is_rejected_before_anything_else() {
    // Checked first: the rest of the document need not make sense.
    let err =
        parse_receipt(br#"{"schema_version": 7, "whatever": [1, 2]}"#, Path::new("nightly/run-a.json")).unwrap_err();
    assert!(matches!(err, ReceiptError::UnsupportedVersion { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "receipt nightly/run-a.json: schema_version 7 is not supported; this build reads version 1 or 2"
    );

    let r = passing(1, Transport::HostBounce, &[]);
    let err = parse_edited(&r, |v| v["schema_version"] = json!(3)).unwrap_err();
    assert!(err.to_string().contains("schema_version 3 is not supported; this build reads version 1 or 2"), "{err}");
    let err = parse_edited(&r, |v| v["schema_version"] = json!("1")).unwrap_err();
    assert!(err.to_string().contains("schema_version \"1\" is not supported"), "{err}");
    let err = parse_edited(&r, |v| {
        v.as_object_mut().unwrap().shift_remove("schema_version");
    })
    .unwrap_err();
    assert!(matches!(err, ReceiptError::MissingVersion { .. }), "{err:?}");
    let err = parse_summary(br#"{"schema_version": 0}"#, origin()).unwrap_err();
    assert!(matches!(err, ReceiptError::UnsupportedVersion { .. }), "{err:?}");
}

#[test]
fn not_json_is_a_syntax_error_naming_the_file() {
    let err = parse_receipt(b"{\"schema_version\": 1,", Path::new("d/run-b.json")).unwrap_err();
    assert!(matches!(err, ReceiptError::Syntax { .. }));
    assert!(err.to_string().starts_with("receipt d/run-b.json: not valid JSON"), "{err}");
}

#[test]
fn unknown_field_is_rejected_at_every_level() {
    let r = failing(passing(2, Transport::NativeP2p, &[]));
    let edits: Vec<(&str, ValueEdit)> = vec![
        ("top", Box::new(|v| v["colour"] = json!("red"))),
        ("config", Box::new(|v| v["evidence"]["config"]["colour"] = json!("red"))),
        ("divergence", Box::new(|v| v["evidence"]["first_divergence"]["colour"] = json!("red"))),
        ("digest row", Box::new(|v| v["evidence"]["digests"]["rows"][0]["colour"] = json!("red"))),
        ("latency", Box::new(|v| v["measurements"]["latency"][0]["colour"] = json!("red"))),
    ];
    for (name, edit) in edits {
        let err = parse_edited(&r, |v| edit(v)).unwrap_err();
        assert!(matches!(err, ReceiptError::Shape { .. }), "{name}: {err:?}");
        assert!(err.to_string().contains("unknown field `colour`"), "{name}: {err}");
    }
}

#[test]
fn missing_wrong_typed_and_unknown_enum_values_are_rejected() {
    let r = passing(2, Transport::NativeP2p, &[]);
    let cases: Vec<(&str, ValueEdit)> = vec![
        (
            "missing field `reason`",
            Box::new(|v| {
                v["evidence"].as_object_mut().unwrap().shift_remove("reason");
            }),
        ),
        (
            "missing field `device`",
            Box::new(|v| {
                v["measurements"].as_object_mut().unwrap().shift_remove("device");
            }),
        ),
        ("invalid type", Box::new(|v| v["evidence"]["config"]["tp"] = json!("2"))),
        ("unknown variant `MAYBE`", Box::new(|v| v["evidence"]["verdict"] = json!("MAYBE"))),
        ("unknown variant `rdma`", Box::new(|v| v["evidence"]["config"]["transport"] = json!("rdma"))),
        ("invalid value", Box::new(|v| v["measurements"]["started_at_unix_ms"] = json!(-1))),
    ];
    for (expect, edit) in cases {
        let err = parse_edited(&r, |v| edit(v)).unwrap_err();
        assert!(matches!(err, ReceiptError::Shape { .. }), "{expect}: {err:?}");
        assert!(err.to_string().contains(expect), "{expect}: {err}");
    }
}

#[test]
fn broken_rules_are_rejected_by_reader_and_writer() {
    let base = passing(2, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)]);
    let cases: Vec<(&str, Receipt)> = vec![
        ("run_id", {
            let mut r = base.clone();
            r.run_id = "0000000000000000".into();
            r
        }),
        ("evidence.token_tape_digest", {
            let mut r = base.clone();
            r.evidence.tokens[0][0] ^= 1;
            r
        }),
        ("evidence.config.tp", edit(base.clone(), |e| e.config.tp = 3)),
        ("evidence.reason", edit(base.clone(), |e| e.verdict = Verdict::Skip)),
        ("evidence.reason", with_verdict(base.clone(), Verdict::Void, "")),
        ("evidence.digests.rows[1]", edit(base.clone(), |e| e.digests.rows.swap(0, 1))),
        (
            "evidence.digests.rows[0].digests",
            edit(base.clone(), |e| {
                e.digests.rows[0].digests.pop();
            }),
        ),
        (
            "evidence.digests.rows[0].digests[0]",
            edit(base.clone(), |e| e.digests.rows[0].digests[0] = "ABCDEF0123456789".into()),
        ),
        ("evidence.digests.columns[1]", edit(base.clone(), |e| e.digests.columns[1] = e.digests.columns[0].clone())),
        ("evidence.gates[1].gate", edit(base.clone(), |e| e.gates[1].gate = e.gates[0].gate)),
        ("evidence.config.model.digest", edit(base.clone(), |e| e.config.model.digest = "abc".into())),
        (
            "evidence.first_divergence.oracle_bits",
            edit(failing(base.clone()), |e| {
                e.first_divergence.as_mut().unwrap().oracle_bits = Some("0x3F800000".into());
            }),
        ),
        ("evidence.performance", {
            let mut r = performance(base.clone());
            r.kind = ReceiptKind::Run;
            r
        }),
        ("evidence.performance", {
            let mut r = base.clone();
            r.kind = ReceiptKind::Performance;
            r
        }),
        ("measurements.latency[0]", {
            let mut r = base.clone();
            r.measurements.latency[0].median_ns = r.measurements.latency[0].max_ns + 1;
            r
        }),
        ("measurements.latency[1]", {
            let mut r = base.clone();
            r.measurements.latency[1] = r.measurements.latency[0].clone();
            r
        }),
    ];
    for (field, bad) in cases {
        let err = receipt_to_json(&bad).unwrap_err();
        match &err {
            ReceiptError::Invalid { field: f, .. } => assert_eq!(f, field, "{err}"),
            other => panic!("writer, {field}: expected Invalid, got {other:?}"),
        }
        // The same bytes, written without the check, are refused by the reader.
        let text = to_canonical_json(&bad).unwrap();
        let err = parse_receipt(text.as_bytes(), origin()).unwrap_err();
        match &err {
            ReceiptError::Invalid { field: f, .. } => assert_eq!(f, field, "{err}"),
            other => panic!("reader, {field}: expected Invalid, got {other:?}"),
        }
        assert!(err.to_string().starts_with(&format!("receipt runs/run-x.json: {field} = ")), "{err}");
    }
}

#[test]
fn run_id_is_pinned_and_moves_with_the_configuration() {
    let cfg = config(2, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true), ("MEMRA_OPROJ_TAIL", true)]);
    // Pinned: a change here changes every run id in every stored receipt set (a schema change).
    assert_eq!(run_id(&cfg), "6245653ea2f6aecd");
    let mut other = cfg.clone();
    other.doors.insert("MEMRA_OPROJ_TAIL".into(), false);
    assert_ne!(run_id(&other), run_id(&cfg));
    let mut other = cfg.clone();
    other.tp = 4;
    assert_ne!(run_id(&other), run_id(&cfg));
    let mut other = cfg.clone();
    other.backend = Backend::Host;
    assert_ne!(run_id(&other), run_id(&cfg));
}

#[test]
fn kinds_are_not_confused() {
    let r = passing(1, Transport::HostBounce, &[]);
    let summary = Summary::from_receipts("smoke", std::slice::from_ref(&r));
    let s_text = summary_to_json(&summary).unwrap();
    let err = parse_receipt(s_text.as_bytes(), origin()).unwrap_err();
    assert!(matches!(err, ReceiptError::WrongKind { .. }), "{err:?}");
    let r_text = receipt_to_json(&r).unwrap();
    let err = parse_summary(r_text.as_bytes(), origin()).unwrap_err();
    assert!(matches!(err, ReceiptError::WrongKind { .. }), "{err:?}");
    assert!(err.to_string().contains("kind \"run\" where a summary was expected"), "{err}");
}

#[test]
fn summary_round_trips_and_its_tallies_are_checked() {
    let base = passing(2, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)]);
    let receipts = vec![
        base.clone(),
        failing(passing(4, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)])),
        skipped(passing(8, Transport::NativeP2p, &[]), "no peer access"),
    ];
    let s = Summary::from_receipts("all", &receipts);
    assert_eq!(s.overall, Verdict::Fail);
    assert_eq!((s.counts.pass, s.counts.fail, s.counts.skip, s.counts.total()), (1, 1, 1, 3));
    assert!(s.rows.windows(2).all(|w| w[0].run_id < w[1].run_id));
    let fail_row = s.rows.iter().find(|r| r.verdict == Verdict::Fail).unwrap();
    assert_eq!(fail_row.first_divergence.as_deref(), Some("L1.o_join p1 s2 r1 [4093] 0x3f800000→0x3f800003 (3 ulp)"));
    assert_eq!(fail_row.engaged, ["MEMRA_OPROJ_DIRECT"]);

    let text = summary_to_json(&s).unwrap();
    let back = parse_summary(text.as_bytes(), origin()).unwrap();
    assert_eq!(back, s);
    assert_eq!(summary_to_json(&back).unwrap(), text);

    let mut bad = s.clone();
    bad.counts.pass += 1;
    assert!(matches!(summary_to_json(&bad), Err(ReceiptError::Invalid { ref field, .. }) if field == "counts"));
    let mut bad = s.clone();
    bad.overall = Verdict::Pass;
    let text = to_canonical_json(&bad).unwrap();
    let err = parse_summary(text.as_bytes(), origin()).unwrap_err();
    assert!(matches!(err, ReceiptError::Invalid { ref field, .. } if field == "overall"), "{err:?}");
    let mut v: Value = serde_json::from_str(&summary_to_json(&s).unwrap()).unwrap();
    v["rows"][0]["colour"] = json!(1);
    let err = parse_summary(v.to_string().as_bytes(), origin()).unwrap_err();
    assert!(err.to_string().contains("unknown field `colour`"), "{err}");
}

#[test]
fn empty_summary_is_an_error_verdict() {
    let s = Summary::from_receipts("nothing", &[]);
    assert_eq!(s.overall, Verdict::Error);
    assert_eq!(s.counts.one_line(), "no runs");
}
