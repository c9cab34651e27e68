//! The published JSON Schema documents agree with the code: everything the writer produces
//! validates, and what the schema refuses the strict reader refuses too. The validator (boon) is
//! independent of this crate.

use std::collections::BTreeSet;
use std::path::Path;

use memra_receipts::json::{parse_receipt, parse_summary, receipt_to_json, summary_to_json};
use memra_receipts::*;
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::util::*;

const EXAMPLE: &str = include_str!("../schema/example-run-v2.json");
/// The version 1 example, kept: version 1 receipts are still read.
const EXAMPLE_V1: &str = include_str!("../schema/example-run-v1.json");

struct Validator {
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
}

impl Validator {
    fn new(file: &str) -> Self {
        let path = format!("{}/schema/{file}", env!("CARGO_MANIFEST_DIR"));
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        let index = compiler.compile(&path, &mut schemas).unwrap_or_else(|e| panic!("{file} does not compile: {e:#}"));
        Validator { schemas, index }
    }
    fn receipt() -> Self {
        Validator::new("receipt-v2.schema.json")
    }
    fn summary() -> Self {
        Validator::new("summary-v1.schema.json")
    }
    fn check(&self, text: &str) -> Result<(), String> {
        let v: Value = serde_json::from_str(text).unwrap();
        self.schemas.validate(&v, self.index).map_err(|e| format!("{e:#}"))
    }
}

fn shapes() -> Vec<(&'static str, Receipt)> {
    let base = passing(4, Transport::NativeP2p, &[("MEMRA_MOE_DIRECT", true), ("MEMRA_FENCE_MEMOPS", false)]);
    vec![
        ("pass", base.clone()),
        ("fail with divergence", failing(base.clone())),
        ("fail without rank", edit(failing(base.clone()), |e| e.first_divergence.as_mut().unwrap().rank = None)),
        ("skip", skipped(base.clone(), "no peer access between devices 2 and 3")),
        ("not applicable", with_verdict(base.clone(), Verdict::NotApplicable, "graph capture has no meaning on host")),
        ("error", errored(base.clone(), "layer 0 experts: out of memory allocating 2 GiB on device 1")),
        ("void", with_verdict(base.clone(), Verdict::Void, "MEMRA_MOE_DIRECT did not engage")),
        ("performance", performance(base)),
        ("host, no device", {
            let mut r = passing(1, Transport::HostBounce, &[]);
            r.measurements.device = None;
            r
        }),
    ]
}

#[test]
fn published_schemas_compile_against_the_2020_12_metaschema() {
    Validator::receipt();
    Validator::summary();
    for text in [RECEIPT_SCHEMA_V2, RECEIPT_SCHEMA_V1, SUMMARY_SCHEMA_V1] {
        let v: Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["$schema"], "https://json-schema.org/draft/2020-12/schema");
    }
}

#[test]
fn receipts_of_every_shape_validate() {
    let validator = Validator::receipt();
    for (name, r) in shapes() {
        let text = receipt_to_json(&r).unwrap();
        validator.check(&text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
    }
}

#[test]
fn summaries_validate() {
    let validator = Validator::summary();
    // Same shapes, each on its own configuration (a summary holds each run once).
    let receipts: Vec<Receipt> = shapes()
        .into_iter()
        .enumerate()
        .map(|(i, (_, r))| edit(r, |e| e.config.oracle = format!("oracle {i}")))
        .collect();
    for s in [Summary::from_receipts("all", &receipts), Summary::from_receipts("empty", &[])] {
        let text = summary_to_json(&s).unwrap();
        validator.check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn prop_random_receipts_validate(r in arb_receipt()) {
        let text = receipt_to_json(&r).unwrap();
        let validator = Validator::receipt();
        prop_assert!(validator.check(&text).is_ok(), "{:?}\n{}", validator.check(&text), text);
    }
}

/// Each negative case: the schema refuses it AND the strict reader refuses it.
#[test]
fn schema_and_reader_refuse_the_same_bad_receipts() {
    let validator = Validator::receipt();
    let base = failing(passing(2, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)]));
    let cases: Vec<(&str, ValueEdit)> = vec![
        ("extra top-level field", Box::new(|v| v["extra_field"] = json!(true))),
        ("extra field in config", Box::new(|v| v["evidence"]["config"]["seed"] = json!(7))),
        ("extra field in measurements", Box::new(|v| v["measurements"]["gpu_temp"] = json!(61.0))),
        ("tp as a string", Box::new(|v| v["evidence"]["config"]["tp"] = json!("2"))),
        ("tp not a TP size", Box::new(|v| v["evidence"]["config"]["tp"] = json!(3))),
        ("wall_ms as a string", Box::new(|v| v["measurements"]["wall_ms"] = json!("1.5"))),
        ("unknown verdict", Box::new(|v| v["evidence"]["verdict"] = json!("PASSED"))),
        ("unknown gate", Box::new(|v| v["evidence"]["gates"][0]["gate"] = json!("vibes"))),
        (
            "missing reason",
            Box::new(|v| {
                v["evidence"].as_object_mut().unwrap().shift_remove("reason");
            }),
        ),
        (
            "skip without reason",
            Box::new(|v| {
                v["evidence"]["verdict"] = json!("SKIP");
                v["evidence"]["reason"] = json!(null);
            }),
        ),
        ("performance kind without claim", Box::new(|v| v["kind"] = json!("performance"))),
        (
            "upper-case seam digest",
            Box::new(|v| v["evidence"]["digests"]["rows"][0]["digests"][0] = json!("00000000DEADBEEF")),
        ),
        ("short run_id", Box::new(|v| v["run_id"] = json!("abc"))),
        ("bits without 0x", Box::new(|v| v["evidence"]["first_divergence"]["observed_bits"] = json!("3f800003"))),
        ("negative element", Box::new(|v| v["evidence"]["first_divergence"]["element"] = json!(-1))),
        ("token above u32", Box::new(|v| v["evidence"]["tokens"][0][0] = json!(4294967296u64))),
        ("schema_version 3", Box::new(|v| v["schema_version"] = json!(3))),
        ("schema_version 1 with version 2 fields", Box::new(|v| v["schema_version"] = json!(1))),
        ("reproduced without element", Box::new(|v| v["evidence"]["first_divergence"]["element"] = json!(null))),
        ("unknown probe status", Box::new(|v| v["measurements"]["p2p_probe"][0]["status"] = json!("meh"))),
        ("zero samples", Box::new(|v| v["measurements"]["latency"][0]["n_samples"] = json!(0))),
    ];
    for (name, edit_value) in cases {
        let mut v: Value = serde_json::from_str(&receipt_to_json(&base).unwrap()).unwrap();
        edit_value(&mut v);
        let text = serde_json::to_string_pretty(&v).unwrap();
        assert!(validator.check(&text).is_err(), "{name}: the schema accepted it");
        assert!(parse_receipt(text.as_bytes(), Path::new("bad.json")).is_err(), "{name}: the reader accepted it");
    }
}

#[test]
fn schema_and_reader_refuse_bad_summaries() {
    let validator = Validator::summary();
    let s = Summary::from_receipts("all", &[passing(1, Transport::HostBounce, &[])]);
    let cases: Vec<(&str, ValueEdit)> = vec![
        ("extra field", Box::new(|v| v["host"] = json!("x"))),
        ("extra row field", Box::new(|v| v["rows"][0]["tp"] = json!(1))),
        ("wrong kind", Box::new(|v| v["kind"] = json!("run"))),
        ("count as string", Box::new(|v| v["counts"]["pass"] = json!("1"))),
        (
            "missing overall",
            Box::new(|v| {
                v.as_object_mut().unwrap().shift_remove("overall");
            }),
        ),
    ];
    for (name, edit_value) in cases {
        let mut v: Value = serde_json::from_str(&summary_to_json(&s).unwrap()).unwrap();
        edit_value(&mut v);
        let text = v.to_string();
        assert!(validator.check(&text).is_err(), "{name}: the schema accepted it");
        assert!(parse_summary(text.as_bytes(), Path::new("summary.json")).is_err(), "{name}: the reader accepted it");
    }
}

/// Properties a reader may find absent, each with the reason: fields added to version 1 after
/// receipts of it were written (those receipts stay readable; every receipt written now has them).
const OPTIONAL_PROPERTIES: &[(&str, &str, &str)] = &[
    (
        "receipt/$defs/evidence",
        "census_witness",
        "written only when memra-gates' own backend did not count the census (an external subject: self-reported); absent in process and in receipts written before it",
    ),
    (
        "receipt v1/$defs/build",
        "subject_version",
        "added with the subject protocol (docs/DESIGN.md §10); receipts written before it do not name the subject's version",
    ),
    (
        "receipt/$defs/build",
        "subject_version",
        "optional in v2 too: v1 receipts converted to v2 in memory keep their absence",
    ),
    (
        "receipt/$defs/config",
        "batch",
        "rows per pass (docs/DESIGN.md §3.6), written only above 1: a single-token run's config, and so its run id, is what it was before the axis",
    ),
    (
        "receipt/$defs/config",
        "columns",
        "columns per pass, written only above 1, for the same reason as batch",
    ),
    (
        "receipt/$defs/divergence",
        "lane",
        "the row or column of a multi-lane run's divergence; absent in single-token runs",
    ),
    (
        "summary",
        "excluded",
        "a door-set file's exclusions (issue 28), written only when the file expects some: every other summary stays as it was",
    ),
];

/// Every object schema lists all its properties as required (but the few of
/// [`OPTIONAL_PROPERTIES`]) and forbids others, as the structs do (`deny_unknown_fields`, and
/// `Option` fields required as `null`).
#[test]
fn every_object_schema_is_closed_and_fully_required() {
    fn walk(v: &Value, at: &str, seen: &mut usize) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Object(props)) = m.get("properties") {
                    if m.get("type") == Some(&json!("object")) {
                        *seen += 1;
                        assert_eq!(m.get("additionalProperties"), Some(&json!(false)), "{at}: additionalProperties");
                        let optional = |k: &&str| OPTIONAL_PROPERTIES.iter().any(|(o, p, _)| *o == at && p == k);
                        let keys: BTreeSet<&str> = props.keys().map(String::as_str).filter(|k| !optional(k)).collect();
                        let required: BTreeSet<&str> = m["required"]
                            .as_array()
                            .unwrap_or_else(|| panic!("{at}: no required list"))
                            .iter()
                            .map(|r| r.as_str().unwrap())
                            .collect();
                        assert_eq!(keys, required, "{at}: required must list every property");
                    }
                }
                for (k, child) in m {
                    walk(child, &format!("{at}/{k}"), seen);
                }
            }
            Value::Array(a) => a.iter().enumerate().for_each(|(i, c)| walk(c, &format!("{at}/{i}"), seen)),
            _ => {}
        }
    }
    for (name, text, min_objects) in
        [("receipt", RECEIPT_SCHEMA_V2, 18), ("receipt v1", RECEIPT_SCHEMA_V1, 15), ("summary", SUMMARY_SCHEMA_V1, 3)]
    {
        let mut seen = 0;
        walk(&serde_json::from_str(text).unwrap(), name, &mut seen);
        assert!(seen >= min_objects, "{name}: only {seen} closed object schemas found");
    }
}

/// The example in the rustdoc of `schema.rs` is exactly what the code writes for
/// `util::example()`, reads strictly and validates. `RECEIPTS_BLESS=1` rewrites it.
#[test]
fn documented_example_is_current_and_valid() {
    let text = receipt_to_json(&example()).unwrap();
    if std::env::var_os("RECEIPTS_BLESS").is_some() {
        std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/schema/example-run-v2.json"), &text).unwrap();
        return;
    }
    assert_eq!(EXAMPLE, text, "schema/example-run-v2.json is stale; rerun with RECEIPTS_BLESS=1 and review the diff");
    let r = parse_receipt(EXAMPLE.as_bytes(), Path::new("example-run-v2.json")).unwrap();
    assert_eq!(receipt_to_json(&r).unwrap(), EXAMPLE);
    Validator::receipt().check(EXAMPLE).unwrap();
}

/// A receipt written before the subject protocol has no `build.subject_version`: it still reads
/// (strictly) and validates against the published schema, so a nightly history that spans the
/// change stays readable by `promote` and `diff`; an empty version is refused by both.
#[test]
fn receipts_without_a_subject_version_stay_readable() {
    let mut v: Value = serde_json::from_str(EXAMPLE).unwrap();
    v["evidence"]["build"].as_object_mut().unwrap().remove("subject_version").expect("the example names a version");
    let text = serde_json::to_string_pretty(&v).unwrap();
    Validator::receipt().check(&text).unwrap();
    let r = parse_receipt(text.as_bytes(), Path::new("old.json")).unwrap();
    assert_eq!(r.evidence.build.subject_version, None);
    v["evidence"]["build"]["subject_version"] = json!("");
    let text = serde_json::to_string_pretty(&v).unwrap();
    assert!(Validator::receipt().check(&text).is_err(), "the schema accepted an empty subject_version");
    assert!(
        parse_receipt(text.as_bytes(), Path::new("empty.json")).is_err(),
        "the reader accepted an empty subject_version"
    );
}

/// Version 1 receipts are still read (converted, read-only): the published v1 example and every
/// v1 receipt kept in docs/gpu/ read strictly, validate against the v1 schema, convert with their
/// element located and their probe named native-p2p, and the writer refuses to write them back.
#[test]
fn version_1_receipts_are_read_and_never_written() {
    let v1 = Validator::new("receipt-v1.schema.json");
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/gpu");
    let mut texts = vec![("example-run-v1.json".to_string(), EXAMPLE_V1.to_string())];
    for e in std::fs::read_dir(docs).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let t = std::fs::read_to_string(&p).unwrap();
            if t.contains("\"kind\": \"run\"") || t.contains("\"kind\": \"performance\"") {
                texts.push((p.display().to_string(), t));
            }
        }
    }
    assert!(texts.len() >= 2, "docs/gpu holds v1 receipts to read: {texts:?}");
    for (name, text) in &texts {
        v1.check(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let r = parse_receipt(text.as_bytes(), Path::new(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.schema_version, 1, "{name}");
        assert!(r.evidence.census.is_empty() && r.evidence.coverage.is_empty() && r.evidence.planted.is_none());
        if let Some(d) = &r.evidence.first_divergence {
            assert!(d.reproduced && d.element.is_some() && d.at == DivergenceAt::Seam, "{name}");
        }
        assert!(r.measurements.p2p_probe.iter().all(|p| p.transport == Transport::NativeP2p), "{name}");
        let e = receipt_to_json(&r).unwrap_err().to_string();
        assert!(e.contains("read-only"), "{name}: {e}");
    }
    // A v1 file with a v2 field is refused (strict per version).
    let mut v: Value = serde_json::from_str(EXAMPLE_V1).unwrap();
    v["evidence"]["census"] = json!({});
    assert!(parse_receipt(v.to_string().as_bytes(), Path::new("edited-v1.json")).is_err());
}

/// Rows and columns (docs/DESIGN.md §3.6) extend version 2 without changing a single-token
/// receipt: its config writes neither axis, so its run id is unchanged; a multi-lane receipt
/// names its axis (a different run id) and its divergence's lane, validates against the
/// published schema and reads back byte-identically; the reader and the schema both refuse a
/// lane count outside 2/4/8, both axes at once, and a lane on the other axis.
#[test]
fn rows_and_columns_extend_version_2_without_changing_single_token_ids() {
    let single = example();
    let text = receipt_to_json(&single).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let config = v["evidence"]["config"].as_object().unwrap();
    assert!(!config.contains_key("batch") && !config.contains_key("columns"), "a 1×1 config names an axis");
    assert_eq!(single.run_id, parse_receipt(EXAMPLE.as_bytes(), Path::new("example.json")).unwrap().run_id);
    let mut multi = failing(passing(2, Transport::NativeP2p, &[]));
    multi.evidence.config.batch = Some(4);
    multi.evidence.first_divergence.as_mut().unwrap().lane =
        Some(LaneEvidence { axis: LaneAxis::Row, index: 3, pass: 9 });
    multi.run_id = run_id(&multi.evidence.config);
    assert_ne!(multi.run_id, single.run_id, "the batch axis must be part of the run identity");
    assert!(multi.evidence.config.label().ends_with(" b4"), "{}", multi.evidence.config.label());
    let text = receipt_to_json(&multi).unwrap();
    Validator::receipt().check(&text).unwrap();
    let back = parse_receipt(text.as_bytes(), Path::new("multi.json")).unwrap();
    assert_eq!(receipt_to_json(&back).unwrap(), text);
    assert!(back.evidence.first_divergence.unwrap().short().contains("row 3 of pass 9"));
    let bad: Vec<(&str, ValueEdit)> = vec![
        ("batch 3", Box::new(|v: &mut Value| v["evidence"]["config"]["batch"] = json!(3))),
        ("batch and columns", Box::new(|v: &mut Value| v["evidence"]["config"]["columns"] = json!(2))),
        (
            "a column in a batch run",
            Box::new(|v: &mut Value| v["evidence"]["first_divergence"]["lane"]["axis"] = json!("column")),
        ),
        (
            "row 4 of a 4-row pass",
            Box::new(|v: &mut Value| v["evidence"]["first_divergence"]["lane"]["index"] = json!(4)),
        ),
    ];
    for (name, edit_value) in bad {
        let mut v: Value = serde_json::from_str(&text).unwrap();
        edit_value(&mut v);
        // The run id follows the edited config, so only the rule under test can refuse it.
        let cfg: RunConfigEvidence = serde_json::from_value(v["evidence"]["config"].clone()).unwrap();
        v["run_id"] = json!(run_id(&cfg));
        let edited = v.to_string();
        let schema = Validator::receipt().check(&edited).is_err();
        let reader = parse_receipt(edited.as_bytes(), Path::new("bad.json")).is_err();
        assert!(reader, "{name}: the reader accepted it");
        // The schema cannot compare a lane with the config's counts; it refuses the rest.
        if !name.contains("a column") && !name.contains("row 4") {
            assert!(schema, "{name}: the schema accepted it");
        }
    }
}
