//! Door registry, strict edge parsing and matrix enumeration (docs/DESIGN.md §4.1, §4.3, §9).
//!
//! Independent checks: the constraint checker below is written from the registry's data fields,
//! not with `matrix::classify`, so the enumerator is compared against a second implementation.

use std::collections::{BTreeMap, BTreeSet};

use memra_gating::env::{check_explicit, parse_door_flags, parse_env, DoorRequest};
use memra_gating::matrix::{
    self, classify, enumerate, parse_shard, shard, Configuration, Legality, MatrixKind, MatrixPlan,
};
use memra_gating::registry::{
    canary_id, door_set_fields, BackendKind, DoorClass, DoorGate, FlipAt, Registry, RegistryError, SettingValue,
    BUILTIN_REGISTRY,
};
use memra_gating::text::edit_distance;
use memra_runtime::config::{Canary, DoorSet, Transport};
use memra_runtime::record::Seam;

fn reg() -> Registry {
    Registry::builtin().expect("built-in registry loads")
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn err_text<T: std::fmt::Debug>(r: Result<T, RegistryError>) -> String {
    r.expect_err("must be refused").to_string()
}

/// The built-in text with one literal edit applied (the edit must apply).
fn edited(from: &str, to: &str) -> String {
    assert!(BUILTIN_REGISTRY.contains(from), "test edit target {from:?} not in doors.toml");
    BUILTIN_REGISTRY.replacen(from, to, 1)
}

const ALL_TP: [usize; 4] = [1, 2, 4, 8];
const ALL_BACKENDS: [BackendKind; 2] = [BackendKind::Host, BackendKind::Cuda];

// ---- registry ------------------------------------------------------------------------------------

#[test]
fn builtin_registry_loads() {
    let r = reg();
    assert_eq!(r.doors().len(), 38, "21 doors of docs/DESIGN.md §4.3 + 4 of docs/DESIGN.md §3.6 + 13 canaries");
    // Every door declares the census change that witnesses it.
    assert!(r.doors().iter().all(|d| !d.census.is_empty()));
    assert!(r.setting("MEMRA_REQUIRE_GPU").is_some());
    assert!(r.setting("MEMRA_CANARY_FLIP_AT").is_some());
}

#[test]
fn every_design_door_is_present_with_its_class() {
    use DoorClass::*;
    let expected: [(&str, DoorClass); 25] = [
        ("MEMRA_STEP_TP_BULK_P2P", BitIdentical),
        ("MEMRA_OPROJ_DIRECT", BitIdentical),
        ("MEMRA_OPROJ_TAIL", BitIdentical),
        ("MEMRA_MOE_DIRECT", BitIdentical),
        ("MEMRA_ROUTES_PRESTAGE", BitIdentical),
        ("MEMRA_FENCE_MEMOPS", SchedulingOnly),
        ("MEMRA_RANK0_MERGE", SchedulingOnly),
        ("MEMRA_STEP_TP_GRAPH", ValueIdentical),
        ("MEMRA_STEP_TP_F32_MIRROR", BitIdentical),
        ("MEMRA_STEP_EP", BitIdentical),
        ("MEMRA_STEP_TP_QKV_FUSED", Numeric),
        ("MEMRA_STEP_TP_DEV_ROUTER", Numeric),
        ("MEMRA_STEP_TP_W8", Numeric),
        ("MEMRA_STEP_NVFP4_EP2", Numeric),
        ("MEMRA_NCCL_ALLREDUCE", Numeric),
        ("MEMRA_LEN_MIRROR_LAZY", SchedulingOnly),
        ("MEMRA_SEL_MIRROR", BitIdentical),
        ("MEMRA_FENCE_RANK1", SchedulingOnly),
        ("MEMRA_STEP_EP_DEVICE_ARITHMETIC", BitIdentical),
        ("MEMRA_SEL_DOWN8", BitIdentical),
        ("MEMRA_STEP_NVFP4_DEV_ROUTES", Numeric),
        // docs/DESIGN.md §3.6: the rows-and-columns doors.
        ("MEMRA_STEP_TP_DECODE_V2", BitIdentical),
        ("MEMRA_TCOL_OPROJ", BitIdentical),
        ("MEMRA_SPEC_FA2", BitIdentical),
        ("MEMRA_STEP_TP_DCW", BitIdentical),
    ];
    let r = reg();
    for (env, class) in expected {
        let d = r.by_env(env).unwrap_or_else(|| panic!("{env} missing from the registry"));
        assert_eq!(d.class, class, "{env} class");
        let want_gate = if class == Numeric { d.gate != DoorGate::Identity } else { d.gate == DoorGate::Identity };
        assert!(want_gate, "{env} gate {:?} does not fit class {:?}", d.gate, class);
        assert_eq!(d.error_budget.is_some(), class == Numeric, "{env} error budget");
    }
    let non_canary = r.doors().iter().filter(|d| !d.is_canary()).count();
    assert_eq!(non_canary, expected.len(), "no door beyond docs/DESIGN.md §4.3 and docs/DESIGN.md §3.6");
    for env in [
        "MEMRA_CANARY_FLIP_BIT",
        "MEMRA_CANARY_REVERSE_KBLOCKS",
        "MEMRA_CANARY_STALE_BUFFER",
        "MEMRA_CANARY_SKIP_FENCE",
    ] {
        let d = r.by_env(env).unwrap_or_else(|| panic!("{env} missing"));
        assert_eq!(d.class, DoorClass::Canary, "{env}");
        assert_eq!(d.gate, DoorGate::Identity, "{env}");
    }
}

#[test]
fn door_table_decisions() {
    let r = reg();
    let d = |id: &str| r.door(id).unwrap_or_else(|| panic!("door {id}"));
    assert!(d("oproj_tail").requirement("oproj_direct").is_some());
    assert!(d("fence_memops").requirement("moe_direct").is_some());
    assert_eq!(d("bulk_p2p").transports.allowed, vec![Transport::NativeP2p]);
    assert_eq!(d("oproj_direct").transports.allowed, vec![Transport::NativeP2p]);
    assert_eq!(d("nccl_allreduce").transports.allowed, vec![Transport::Nccl]);
    assert_eq!(d("nccl_allreduce").gate, DoorGate::ArgmaxTapeErrorBudget);
    assert_eq!(d("nvfp4_ep2").tp.allowed, vec![1, 2]);
    assert_eq!(d("oproj_direct").tp.allowed, vec![2, 4, 8]);
    assert!(d("step_ep").conflict("nvfp4_ep2").is_some());
    assert!(d("nvfp4_ep2").conflict("step_ep").is_some(), "conflicts hold both ways");
    assert!(d("w8").conflict("qkv_fused").is_some());
    assert!(d("graph").conflict("nvfp4_ep2").is_some());
    // BULK_P2P packs the moe_join's TP-sharded slot copies: inert (VOID) wherever there are none.
    for inert in ["moe_direct", "step_ep", "nvfp4_ep2"] {
        assert!(d("bulk_p2p").conflict(inert).is_some(), "bulk_p2p must exclude {inert}");
    }
    assert_eq!(d("bulk_p2p").seams, vec![Seam::MoeJoin], "the o_join has no per-slot copies to pack");
    assert!(d("dev_router").requires.is_empty() && d("dev_router").conflicts.is_empty());
    let canaries: Vec<&str> = r.doors().iter().filter(|x| x.is_canary()).map(|x| x.id.as_str()).collect();
    for a in &canaries {
        for b in &canaries {
            if a != b {
                assert!(d(a).conflict(b).is_some(), "canaries {a} and {b} must conflict");
            }
        }
    }
    // Every NUMERIC-CLASS door with class identity can produce its TP1 host-bounce baseline.
    for x in r.doors().iter().filter(|x| x.gate.has_class_identity()) {
        assert!(x.tp.contains(&1) && x.transports.contains(&Transport::HostBounce), "{}", x.id);
    }
    // Engagement counters are named after their door.
    for x in r.doors() {
        assert!(x.engagement.starts_with(&format!("{}.", x.id)), "{}", x.engagement);
    }
}

#[test]
fn conflicts_are_symmetric_and_requirements_known() {
    let r = reg();
    for d in r.doors() {
        for l in &d.conflicts {
            let other = r.door(&l.id).expect("known");
            assert!(other.conflict(&d.id).is_some(), "{} conflicts {} but not back", d.id, l.id);
            assert!(!l.why.trim().is_empty());
        }
        for l in &d.requires {
            assert!(r.door(&l.id).is_some(), "{} requires unknown {}", d.id, l.id);
        }
    }
}

#[test]
fn not_applicable_on_host_has_reasons() {
    let r = reg();
    let on_host: BTreeSet<String> =
        r.doors().iter().filter(|d| d.not_applicable_on(BackendKind::Host).is_some()).map(|d| d.id.clone()).collect();
    assert_eq!(
        on_host,
        set(&[
            "bulk_p2p",
            "canary_skip_fence",
            "fence_memops",
            "fence_rank1",
            "graph",
            "nccl_allreduce",
            "rank0_merge"
        ])
    );
    for id in &on_host {
        let d = r.door(id).unwrap();
        assert!(d.not_applicable_on(BackendKind::Host).unwrap().len() > 20, "{id}: a real reason");
        assert!(!d.backends.contains(&BackendKind::Host));
        assert!(d.backends.contains(&BackendKind::Cuda));
    }
    // Only the canaries planted in the host twins have no meaning on CUDA.
    let on_cuda: Vec<&str> =
        r.doors().iter().filter(|d| d.not_applicable_on(BackendKind::Cuda).is_some()).map(|d| d.id.as_str()).collect();
    assert_eq!(on_cuda, ["canary_tie_break", "canary_signed_zero", "canary_clamp"]);
}

#[test]
fn every_non_canary_door_maps_to_a_distinct_runtime_field() {
    let r = reg();
    let field_names: BTreeSet<String> =
        door_set_fields(&DoorSet::default()).iter().map(|(n, _)| n.to_string()).collect();
    let ids: BTreeSet<String> = r.doors().iter().filter(|d| !d.is_canary()).map(|d| d.id.clone()).collect();
    assert_eq!(ids, field_names, "registry doors and runtime DoorSet fields must be the same set");
    let mut seen = BTreeSet::new();
    for id in &ids {
        let ds = r.to_door_set(&[id.as_str()], None).unwrap();
        let on: Vec<&str> = door_set_fields(&ds).iter().filter(|(_, v)| *v).map(|(n, _)| *n).collect();
        assert_eq!(on, vec![id.as_str()], "{id} must switch on exactly its own field");
        assert!(ds.canary.is_none());
        assert!(seen.insert(format!("{ds:?}")), "{id} maps onto a field another door uses");
        assert_eq!(r.ids_of(&ds), set(&[id]));
    }
    let all = r.to_door_set(&ids, None).unwrap();
    assert!(door_set_fields(&all).iter().all(|(_, v)| *v), "all doors on → every field on");
}

#[test]
fn canaries_map_to_runtime_canaries() {
    let r = reg();
    let at = FlipAt { layer: 1, seam: Seam::Qkv, step: 3, element: None };
    let ds = r.to_door_set(&["canary_flip_bit"], Some(at)).unwrap();
    assert_eq!(ds.canary, Some(Canary::FlipBit { layer: 1, seam: Seam::Qkv, step: 3, element: 0 }));
    let ds = r.to_door_set(&["canary_flip_bit"], None).unwrap();
    assert_eq!(
        ds.canary,
        Some(Canary::FlipBit { layer: 1, seam: Seam::Experts, step: 2, element: 0 }),
        "registry default"
    );
    for id in ["canary_reverse_kblocks", "canary_stale_buffer", "canary_skip_fence", "canary_flip_bit"] {
        let ds = r.to_door_set(&[id], None).unwrap();
        assert_eq!(canary_id(&ds.canary.expect("canary set")), id);
        assert_eq!(r.ids_of(&ds), set(&[id]));
    }
    let e = err_text(r.to_door_set(&["canary_stale_buffer", "canary_skip_fence"], None));
    assert!(e.contains("one planted defect at a time"), "{e}");
    let e = err_text(r.to_door_set(&["oproj_dirct"], None));
    assert!(e.contains("did you mean oproj_direct?"), "{e}");
}

#[test]
fn unknown_schema_version_is_refused_naming_it() {
    let e = err_text(Registry::from_toml_str(&edited("schema_version = 2", "schema_version = 1"), "t.toml"));
    assert!(e.contains("schema_version 1") && e.contains("reads schema_version 2 only"), "{e}");
    let e = err_text(Registry::from_toml_str(&edited("schema_version = 2", ""), "t.toml"));
    assert!(e.contains("(missing)"), "{e}");
}

#[test]
fn unknown_field_is_refused() {
    let e =
        err_text(Registry::from_toml_str(&edited("\nid = \"w8\"\n", "\nid = \"w8\"\ncolour = \"red\"\n"), "t.toml"));
    assert!(e.contains("colour"), "{e}");
}

#[test]
fn unknown_door_in_requires_or_conflicts_is_refused() {
    let text = edited("{ id = \"oproj_direct\", why", "{ id = \"oproj_dirct\", why");
    let e = err_text(Registry::from_toml_str(&text, "t.toml"));
    assert!(e.contains("oproj_dirct") && e.contains("did you mean oproj_direct?"), "{e}");
    let text = edited("{ id = \"nvfp4_ep2\", why = \"both", "{ id = \"nvfp5\", why = \"both");
    let e = err_text(Registry::from_toml_str(&text, "t.toml"));
    assert!(e.contains("\"nvfp5\"") && e.contains("conflicts"), "{e}");
}

#[test]
fn duplicate_ids_and_envs_are_refused() {
    let e = err_text(Registry::from_toml_str(&edited("\nid = \"w8\"\n", "\nid = \"dev_router\"\n"), "t.toml"));
    assert!(e.contains("\"dev_router\"") && e.contains("declared twice"), "{e}");
    let e = err_text(Registry::from_toml_str(
        &edited("env = \"MEMRA_STEP_TP_W8\"", "env = \"MEMRA_OPROJ_DIRECT\""),
        "t.toml",
    ));
    assert!(e.contains("MEMRA_OPROJ_DIRECT") && e.contains("unique"), "{e}");
    let e =
        err_text(Registry::from_toml_str(&edited("env = \"MEMRA_REQUIRE_GPU\"", "env = \"MEMRA_STEP_EP\""), "t.toml"));
    assert!(e.contains("MEMRA_STEP_EP") && e.contains("unique"), "{e}");
}

#[test]
fn inconsistent_entries_are_refused_with_the_rule() {
    // A restriction without a why.
    let text = BUILTIN_REGISTRY.replacen(
        "tp = { allowed = [2, 4, 8], why = \"at TP1 nothing crosses ranks, so there is no copy to pack: the counter would stay 0 and the run would be VOID\" }",
        "tp = { allowed = [2, 4, 8] }",
        1,
    );
    assert_ne!(text, BUILTIN_REGISTRY);
    let e = err_text(Registry::from_toml_str(&text, "t.toml"));
    assert!(e.contains("door \"bulk_p2p\" tp why") && e.contains("needs a `why`"), "{e}");
    // A class-identity gate that cannot have its TP1 baseline.
    let e = err_text(Registry::from_toml_str(
        &edited("tp = { allowed = [1, 2], why", "tp = { allowed = [2], why"),
        "t.toml",
    ));
    assert!(e.contains("nvfp4_ep2") && e.contains("TP1 host-bounce"), "{e}");
    // A NUMERIC-CLASS door without its budget.
    let budget_line = BUILTIN_REGISTRY.lines().find(|l| l.starts_with("error_budget")).unwrap();
    let e = err_text(Registry::from_toml_str(&BUILTIN_REGISTRY.replacen(budget_line, "", 1), "t.toml"));
    assert!(e.contains("error_budget") && e.contains("declares its error budget"), "{e}");
    // A door allowed where what it requires is not.
    let text = edited(
        "transports = { allowed = [\"native-p2p\"], why = \"inherits oproj_direct's transport",
        "transports = { allowed = [\"native-p2p\", \"host-bounce\"], why = \"inherits oproj_direct's transport",
    );
    let e = err_text(Registry::from_toml_str(&text, "t.toml"));
    assert!(e.contains("oproj_tail requires oproj_direct, which does not allow host-bounce"), "{e}");
    // A requirement that conflicts.
    let text = edited(
        "{ id = \"graph\", why = \"each token",
        "{ id = \"moe_direct\", why = \"x\" },\n    { id = \"graph\", why = \"each token",
    );
    let e = err_text(Registry::from_toml_str(&text, "t.toml"));
    assert!(e.contains("can never run"), "{e}");
    // A TP size outside the grid and an unknown transport / backend / seam.
    let e = err_text(Registry::from_toml_str(&edited("allowed = [1, 2], why", "allowed = [1, 2, 3], why"), "t.toml"));
    assert!(e.contains("= 3") && e.contains("TP must be 1, 2, 4 or 8"), "{e}");
    let e = err_text(Registry::from_toml_str(&edited("allowed = [\"nccl\"]", "allowed = [\"mpi\"]"), "t.toml"));
    assert!(e.contains("\"mpi\""), "{e}");
    let e = err_text(Registry::from_toml_str(&edited("seams = [\"qkv\"]", "seams = [\"qvk\"]"), "t.toml"));
    assert!(e.contains("\"qvk\"") && e.contains("seam"), "{e}");
    // A backend neither supported nor explained.
    let e = err_text(Registry::from_toml_str(
        &edited(
            "backends = [\"cuda\"]\nnot_applicable = { host = \"the host backend has no device",
            "backends = [\"cuda\"]\nnot_applicable = { hostx = \"the host backend has no device",
        ),
        "t.toml",
    ));
    assert!(e.contains("\"hostx\"") && e.contains("every backend is in `backends` or has a reason"), "{e}");
}

#[test]
fn registry_from_path_reads_a_user_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("doors.toml");
    std::fs::write(
        &path,
        edited("default = false\nchanges = \"device top-k", "default = true\nchanges = \"device top-k"),
    )
    .unwrap();
    let r = Registry::from_path(&path).unwrap();
    assert!(r.door("dev_router").unwrap().default);
    assert_eq!(r.defaults(), set(&["dev_router"]));
    let e = err_text(Registry::from_path(&dir.path().join("missing.toml")));
    assert!(e.contains("missing.toml"), "{e}");
}

// ---- environment and flags -----------------------------------------------------------------------

#[test]
fn door_values_are_parsed_strictly() {
    let r = reg();
    let req = parse_env(env(&[("MEMRA_OPROJ_DIRECT", "1"), ("MEMRA_STEP_TP_W8", "0"), ("MEMRA_MOE_DIRECT", "")]), &r)
        .unwrap();
    assert_eq!(req.doors.get("oproj_direct"), Some(&true));
    assert_eq!(req.doors.get("w8"), Some(&false));
    assert_eq!(req.doors.get("moe_direct"), Some(&false), "empty is off");
    assert_eq!(req.doors.get("graph"), None, "unset is not explicit");
    assert_eq!(req.enabled(&r), set(&["oproj_direct"]));
    for bad in ["yes", "2", " 1", "1 ", "true", "01", "on"] {
        let e = err_text(parse_env(env(&[("MEMRA_OPROJ_DIRECT", bad)]), &r));
        assert_eq!(e, format!("MEMRA_OPROJ_DIRECT={bad:?} is not a door value: use 1 (on), 0 or empty (off)"));
    }
    let e = err_text(parse_env(env(&[("MEMRA_OPROJ_DIRECT", "yes")]), &r));
    assert_eq!(e, "MEMRA_OPROJ_DIRECT=\"yes\" is not a door value: use 1 (on), 0 or empty (off)");
}

#[test]
fn unrelated_variables_are_ignored() {
    let r = reg();
    let req =
        parse_env(env(&[("PATH", "/bin"), ("HOME", "/root"), ("MEMRAX_Y", "1"), ("XMEMRA_OPROJ", "z")]), &r).unwrap();
    assert_eq!(req, DoorRequest::default());
}

#[test]
fn unknown_names_get_a_did_you_mean() {
    let r = reg();
    let e = err_text(parse_env(env(&[("MEMRA_OPROJ_DIRCT", "1")]), &r));
    assert!(e.starts_with("\"MEMRA_OPROJ_DIRCT\" is not a known MEMRA_* variable"), "{e}");
    assert!(e.ends_with("did you mean MEMRA_OPROJ_DIRECT?"), "{e}");
    let e = err_text(parse_env(env(&[("MEMRA_BULK_P2P", "1")]), &r));
    assert!(e.ends_with("did you mean MEMRA_STEP_TP_BULK_P2P?"), "the id spelling counts: {e}");
    let e = err_text(parse_env(env(&[("MEMRA_REQUIRE_GPUS", "1")]), &r));
    assert!(e.ends_with("did you mean MEMRA_REQUIRE_GPU?"), "{e}");
    let e = err_text(parse_env(env(&[("MEMRA_ZZZZZZZZZZZZ", "1")]), &r));
    assert!(e.ends_with("no similar name"), "{e}");
    let e = err_text(parse_env(env(&[("memra_oproj_direct", "1")]), &r));
    assert!(e.contains("case-sensitive") && e.ends_with("did you mean MEMRA_OPROJ_DIRECT?"), "{e}");
}

#[test]
fn all_problems_are_reported_together() {
    let r = reg();
    let e = parse_env(env(&[("MEMRA_OPROJ_DIRCT", "1"), ("MEMRA_STEP_TP_W8", "yes"), ("MEMRA_OPROJ_TAIL", "1")]), &r)
        .unwrap_err();
    let RegistryError::Several(list) = &e else { panic!("expected several errors, got {e}") };
    assert_eq!(list.len(), 2);
    assert_eq!(e.to_string().lines().count(), 2);
}

#[test]
fn settings_parse_their_own_formats() {
    let r = reg();
    assert!(!parse_env(env(&[]), &r).unwrap().require_gpu(&r));
    assert!(parse_env(env(&[("MEMRA_REQUIRE_GPU", "1")]), &r).unwrap().require_gpu(&r));
    assert!(!parse_env(env(&[("MEMRA_REQUIRE_GPU", "0")]), &r).unwrap().require_gpu(&r));
    let e = err_text(parse_env(env(&[("MEMRA_REQUIRE_GPU", "yes")]), &r));
    assert!(e.contains("MEMRA_REQUIRE_GPU=\"yes\"") && e.contains("use 1 (on), 0 or empty (off)"), "{e}");

    // A device count (read by the CUDA test binary; memra-gates only has to accept it).
    let req = parse_env(env(&[("MEMRA_REQUIRE_DEVICES", "8")]), &r).unwrap();
    assert_eq!(req.settings.get("MEMRA_REQUIRE_DEVICES"), Some(&SettingValue::Count(8)));
    let empty = parse_env(env(&[("MEMRA_REQUIRE_DEVICES", "")]), &r).unwrap();
    assert!(!empty.settings.contains_key("MEMRA_REQUIRE_DEVICES"), "empty means the default");
    for bad in ["two", "-1", "2 ", "1.5"] {
        let e = err_text(parse_env(env(&[("MEMRA_REQUIRE_DEVICES", bad)]), &r));
        assert!(
            e.contains(&format!("MEMRA_REQUIRE_DEVICES={bad:?}")) && e.contains("use a whole number (0 or more)"),
            "{e}"
        );
    }

    let req = parse_env(env(&[("MEMRA_CANARY_FLIP_AT", "2:qkv:5")]), &r).unwrap();
    assert_eq!(
        req.settings.get("MEMRA_CANARY_FLIP_AT"),
        Some(&SettingValue::FlipAt(FlipAt { layer: 2, seam: Seam::Qkv, step: 5, element: None }))
    );
    assert_eq!(req.canary_flip_at(&r), Some(FlipAt { layer: 2, seam: Seam::Qkv, step: 5, element: None }));
    let mut with_canary = req.clone();
    with_canary.doors.insert("canary_flip_bit".into(), true);
    assert_eq!(
        with_canary.to_door_set(&r).unwrap().canary,
        Some(Canary::FlipBit { layer: 2, seam: Seam::Qkv, step: 5, element: 0 })
    );
    assert_eq!(
        parse_env(env(&[]), &r).unwrap().canary_flip_at(&r),
        Some(FlipAt { layer: 1, seam: Seam::Experts, step: 2, element: None })
    );
    for (bad, says) in
        [("2:qkv", "LAYER:SEAM:STEP"), ("x:qkv:1", "LAYER \"x\""), ("1:qvk:1", "SEAM \"qvk\""), ("1:qkv:-1", "STEP")]
    {
        let e = err_text(parse_env(env(&[("MEMRA_CANARY_FLIP_AT", bad)]), &r));
        assert!(e.contains(&format!("{bad:?}")) && e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn door_flags_take_ids_or_env_names() {
    let r = reg();
    let flags: Vec<String> =
        ["oproj_direct", "OPROJ_TAIL=1", "MEMRA_STEP_TP_W8=0", "Dev_Router=1"].iter().map(|s| s.to_string()).collect();
    let req = parse_door_flags(&flags, &r).unwrap();
    assert_eq!(
        req.doors,
        BTreeMap::from([
            ("oproj_direct".to_string(), true),
            ("oproj_tail".to_string(), true),
            ("w8".to_string(), false),
            ("dev_router".to_string(), true)
        ])
    );
    let e = err_text(parse_door_flags(&["w8=yes".to_string()], &r));
    assert!(e.contains("\"w8=yes\"") && e.contains("NAME=1 or NAME=0"), "{e}");
    let e = err_text(parse_door_flags(&["w8=".to_string()], &r));
    assert!(e.contains("\"w8=\""), "{e}");
    let e = err_text(parse_door_flags(&["oproj_dirct".to_string()], &r));
    assert!(e.ends_with("did you mean oproj_direct (MEMRA_OPROJ_DIRECT)?"), "{e}");
    let e = err_text(parse_door_flags(&["MEMRA_OPROJ_DIRCT=1".to_string()], &r));
    assert!(e.ends_with("did you mean oproj_direct (MEMRA_OPROJ_DIRECT)?"), "{e}");
    let e = err_text(parse_door_flags(&["MEMRA_REQUIRE_GPU=1".to_string()], &r));
    assert!(e.contains("is a setting, not a door"), "{e}");
    let e = err_text(parse_door_flags(&["w8=1".to_string(), "w8=0".to_string()], &r));
    assert!(e.contains("both on and off"), "{e}");
}

#[test]
fn flags_override_the_environment() {
    let r = reg();
    let mut req = parse_env(env(&[("MEMRA_STEP_TP_W8", "1"), ("MEMRA_OPROJ_DIRECT", "1")]), &r).unwrap();
    req.overlay(parse_door_flags(&["w8=0".to_string()], &r).unwrap());
    assert_eq!(req.enabled(&r), set(&["oproj_direct"]));
}

#[test]
fn conflicting_or_incomplete_requests_quote_the_rule() {
    let r = reg();
    let req = parse_env(env(&[("MEMRA_OPROJ_TAIL", "1")]), &r).unwrap();
    let e = err_text(check_explicit(&req, &r));
    let why = r.door("oproj_tail").unwrap().requirement("oproj_direct").unwrap();
    assert_eq!(e, format!("MEMRA_OPROJ_TAIL=1 requires MEMRA_OPROJ_DIRECT=1 (rule: {why})"));
    assert!(e.contains("the o_join add is deferred into ffn_norm only when peers store partials directly"));

    let req = parse_env(env(&[("MEMRA_OPROJ_TAIL", "1"), ("MEMRA_OPROJ_DIRECT", "0")]), &r).unwrap();
    let e = err_text(check_explicit(&req, &r));
    assert!(e.ends_with("; MEMRA_OPROJ_DIRECT=0 was given"), "{e}");

    let req = parse_env(env(&[("MEMRA_STEP_TP_W8", "1"), ("MEMRA_STEP_TP_QKV_FUSED", "1")]), &r).unwrap();
    let e = err_text(check_explicit(&req, &r));
    let why = r.door("w8").unwrap().conflict("qkv_fused").unwrap();
    assert_eq!(
        e,
        format!("MEMRA_STEP_TP_QKV_FUSED=1 conflicts with MEMRA_STEP_TP_W8=1 (rule: {why}); set one of them to 0")
    );

    let req = parse_env(env(&[("MEMRA_CANARY_FLIP_BIT", "1"), ("MEMRA_CANARY_SKIP_FENCE", "1")]), &r).unwrap();
    assert!(err_text(check_explicit(&req, &r)).contains("one planted defect"));

    let ok = parse_env(
        env(&[("MEMRA_OPROJ_TAIL", "1"), ("MEMRA_OPROJ_DIRECT", "1"), ("MEMRA_STEP_TP_DEV_ROUTER", "1")]),
        &r,
    )
    .unwrap();
    check_explicit(&ok, &r).unwrap();
}

#[test]
fn default_on_doors_take_part_in_the_check() {
    let text = edited("default = false\nchanges = \"one fused QKV", "default = true\nchanges = \"one fused QKV");
    let r = Registry::from_toml_str(&text, "t.toml").unwrap();
    let req = parse_env(env(&[("MEMRA_STEP_TP_W8", "1")]), &r).unwrap();
    let e = err_text(check_explicit(&req, &r));
    assert!(e.contains("MEMRA_STEP_TP_QKV_FUSED (on by default) conflicts with MEMRA_STEP_TP_W8=1"), "{e}");
    let off = parse_env(env(&[("MEMRA_STEP_TP_W8", "1"), ("MEMRA_STEP_TP_QKV_FUSED", "0")]), &r).unwrap();
    check_explicit(&off, &r).unwrap();
}

#[test]
fn edit_distance_counts_transpositions() {
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("ab", "ba"), 1);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(edit_distance("MEMRA_OPROJ_DIRCT", "MEMRA_OPROJ_DIRECT"), 1);
    assert_eq!(edit_distance("same", "same"), 0);
}

// ---- matrix --------------------------------------------------------------------------------------

/// Requires, conflicts, TP and transport rules, read straight from the registry's fields.
fn rules_hold(r: &Registry, c: &Configuration) -> bool {
    c.doors.iter().all(|id| {
        let d = r.door(id).unwrap();
        d.requires.iter().all(|l| c.doors.contains(&l.id))
            && d.conflicts.iter().all(|l| !c.doors.contains(&l.id))
            && d.tp.allowed.contains(&c.tp)
            && d.transports.allowed.contains(&c.transport)
    })
}

/// The enumerations' family rule, checked independently: a set with a door of the multi-token
/// paths (registry `passes` declared) holds only such doors and what they require.
fn pass_family_only(r: &Registry, doors: &BTreeSet<String>) -> bool {
    let family: Vec<&str> = doors.iter().filter(|id| r.door(id).unwrap().pass_door).map(String::as_str).collect();
    family.is_empty() || r.closure_of(family).is_superset(doors)
}

fn applicable(r: &Registry, c: &Configuration) -> bool {
    c.doors.iter().all(|id| r.door(id).unwrap().backends.contains(&c.backend))
}

fn axes_count() -> usize {
    ALL_TP.len() * Transport::ALL.len() * ALL_BACKENDS.len()
}

fn plan(kind: MatrixKind) -> MatrixPlan {
    enumerate(&reg(), &kind, &ALL_TP, &Transport::ALL, &ALL_BACKENDS).unwrap()
}

fn assert_sorted<T: Ord + std::fmt::Debug>(v: &[T]) {
    assert!(v.windows(2).all(|w| w[0] < w[1]), "list not strictly sorted");
}

#[test]
fn rules_checker_negative_control() {
    let r = reg();
    let c = |doors: &[&str], tp, t| Configuration::single(BackendKind::Cuda, tp, t, set(doors));
    assert!(!rules_hold(&r, &c(&["oproj_tail"], 2, Transport::NativeP2p)));
    assert!(!rules_hold(&r, &c(&["w8", "qkv_fused"], 1, Transport::HostBounce)));
    assert!(!rules_hold(&r, &c(&["oproj_direct"], 1, Transport::NativeP2p)));
    assert!(!rules_hold(&r, &c(&["oproj_direct"], 2, Transport::HostBounce)));
    assert!(rules_hold(&r, &c(&["oproj_direct", "oproj_tail"], 2, Transport::NativeP2p)));
}

#[test]
fn single_is_the_baseline_and_each_door_with_its_requirements() {
    let r = reg();
    let p = plan(MatrixKind::Single);
    let n_doors = r.doors().iter().filter(|d| !d.is_canary()).count();
    assert_eq!(p.legal.len() + p.excluded.len() + p.not_applicable.len(), (n_doors + 1) * axes_count());
    let sets: BTreeSet<BTreeSet<String>> = p
        .legal
        .iter()
        .chain(p.excluded.iter().map(|e| &e.config))
        .chain(p.not_applicable.iter().map(|n| &n.config))
        .map(|c| c.doors.clone())
        .collect();
    assert!(sets.contains(&set(&[])));
    assert!(sets.contains(&set(&["oproj_direct", "oproj_tail"])));
    assert!(sets.contains(&set(&["fence_memops", "moe_direct"])));
    assert!(!sets.contains(&set(&["oproj_tail"])));
    // A door with its requirements: at most SPEC_FA2 with DCW and TCOL_OPROJ.
    assert!(sets.contains(&set(&["dcw", "spec_fa2", "tcol_oproj"])));
    assert!(sets.iter().all(|s| s.len() <= 3));
    assert!(sets.iter().flatten().all(|id| !r.door(id).unwrap().is_canary()), "no canary in single");
    // The baseline runs everywhere.
    let baselines = p.legal.iter().filter(|c| c.doors.is_empty()).count();
    assert_eq!(baselines, axes_count());
    // Each door runs at least somewhere.
    for d in r.doors().iter().filter(|d| !d.is_canary()) {
        assert!(p.legal.iter().any(|c| c.doors.contains(&d.id)), "{} never runs in single", d.id);
    }
    assert_sorted(&p.legal);
    assert_sorted(&p.excluded);
    assert_sorted(&p.not_applicable);
}

#[test]
fn not_applicable_on_host_is_listed_with_reasons() {
    let r = reg();
    let p = plan(MatrixKind::Single);
    for id in ["graph", "fence_memops", "rank0_merge", "bulk_p2p", "nccl_allreduce"] {
        let reason = r.door(id).unwrap().not_applicable_on(BackendKind::Host).unwrap();
        let na: Vec<_> = p
            .not_applicable
            .iter()
            .filter(|n| n.config.doors.contains(id) && n.config.backend == BackendKind::Host)
            .collect();
        assert!(!na.is_empty(), "{id} has no NOT-APPLICABLE entry on host");
        for n in &na {
            assert!(n.reason.contains(reason), "{id}: {}", n.reason);
            assert!(rules_hold(&r, &n.config), "NOT-APPLICABLE must be legal by every rule: {}", n.config.label());
        }
        assert!(!p.legal.iter().any(|c| c.doors.contains(id) && c.backend == BackendKind::Host));
        assert!(p.legal.iter().any(|c| c.doors.contains(id) && c.backend == BackendKind::Cuda), "{id} runs on cuda");
    }
    // NOT-APPLICABLE is not EXCLUDED.
    let na: BTreeSet<_> = p.not_applicable.iter().map(|n| &n.config).collect();
    assert!(p.excluded.iter().all(|e| !na.contains(&e.config)));
    let canaries = plan(MatrixKind::Canaries);
    let skip: Vec<_> =
        canaries.not_applicable.iter().filter(|n| n.config.doors.contains("canary_skip_fence")).collect();
    assert!(!skip.is_empty() && skip.iter().all(|n| n.config.backend == BackendKind::Host));
}

#[test]
fn all_is_every_legal_combination() {
    let r = reg();
    let p = plan(MatrixKind::All);
    assert!(p.smallest_sets_only);
    // Brute force with the independent checker.
    let ids: Vec<&str> = r.doors().iter().filter(|d| !d.is_canary()).map(|d| d.id.as_str()).collect();
    // The door sets whose requires and conflicts hold, as bit masks (the same rules `rules_hold`
    // applies below, so this only skips sets it would refuse at every backend, TP and transport:
    // 2^doors sets no longer each build a configuration per axis).
    let bit = |id: &str| 1u32 << ids.iter().position(|x| *x == id).expect("a linked door is not a canary");
    let links = |l: &[memra_gating::registry::Link]| l.iter().map(|l| bit(&l.id)).fold(0u32, |a, b| a | b);
    let rules: Vec<(u32, u32)> =
        ids.iter().map(|id| r.door(id).unwrap()).map(|d| (links(&d.requires), links(&d.conflicts))).collect();
    let closed = |mask: u32| {
        rules
            .iter()
            .enumerate()
            .all(|(i, (req, conf))| mask & (1 << i) == 0 || (mask & req == *req && mask & conf == 0))
    };
    let mut expected = BTreeSet::new();
    for mask in (0u32..(1 << ids.len())).filter(|m| closed(*m)) {
        let doors: BTreeSet<String> =
            ids.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, s)| s.to_string()).collect();
        for backend in ALL_BACKENDS {
            for tp in ALL_TP {
                for transport in Transport::ALL {
                    let c = Configuration::single(backend, tp, transport, doors.clone());
                    if rules_hold(&r, &c) && applicable(&r, &c) && pass_family_only(&r, &c.doors) {
                        expected.insert(c);
                    }
                }
            }
        }
    }
    let got: BTreeSet<Configuration> = p.legal.iter().cloned().collect();
    assert_eq!(got.len(), p.legal.len(), "no repeats");
    assert_eq!(got.len(), expected.len(), "legal count");
    assert!(got == expected, "all must equal the brute-force legal set");
    assert_sorted(&p.legal);
    for c in p.legal.iter().step_by(97) {
        assert_eq!(classify(&r, c).unwrap(), Legality::Legal, "{}", c.label());
    }
    // Exclusions are illegal, not-applicable ones are legal by rule but not applicable.
    for e in &p.excluded {
        assert!(!rules_hold(&r, &e.config), "excluded but legal: {}", e.config.label());
        assert!(!got.contains(&e.config));
    }
    for n in &p.not_applicable {
        assert!(rules_hold(&r, &n.config) && !applicable(&r, &n.config), "{}", n.config.label());
        assert!(!got.contains(&n.config));
    }
    // Each conflict is explained at its smallest set.
    assert!(p
        .excluded
        .iter()
        .any(|e| e.config.doors == set(&["qkv_fused", "w8"]) && e.rule.contains("conflicts with")));
    assert!(p.excluded.iter().any(|e| e.config.doors == set(&["fence_memops", "graph", "moe_direct"])));
    assert!(got.iter().all(|c| c.doors.iter().all(|id| !r.door(id).unwrap().is_canary())), "no canary in all");
}

#[test]
fn single_and_pairwise_are_inside_all() {
    let all: BTreeSet<Configuration> = plan(MatrixKind::All).legal.into_iter().collect();
    let single = plan(MatrixKind::Single);
    let pairwise = plan(MatrixKind::Pairwise);
    assert!(single.legal.iter().all(|c| all.contains(c)), "single ⊆ all");
    assert!(pairwise.legal.iter().all(|c| all.contains(c)), "pairwise ⊆ all");
    assert!(pairwise.legal.len() < all.len() / 10, "pairwise {} vs all {}", pairwise.legal.len(), all.len());
    let r = reg();
    for e in single.excluded.iter().chain(pairwise.excluded.iter()) {
        assert!(!rules_hold(&r, &e.config), "{}", e.config.label());
        assert!(!all.contains(&e.config));
        assert!(matches!(classify(&r, &e.config).unwrap(), Legality::Excluded(ref rule) if *rule == e.rule));
    }
}

type Pair = ((String, bool), (String, bool));

fn pairs(ids: &[String], configs: &[Configuration]) -> BTreeSet<Pair> {
    let mut out = BTreeSet::new();
    for c in configs {
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                out.insert(((a.clone(), c.doors.contains(a)), (b.clone(), c.doors.contains(b))));
            }
        }
    }
    out
}

#[test]
fn pairwise_covers_every_legal_pair_of_settings() {
    let r = reg();
    let ids: Vec<String> = r.doors().iter().filter(|d| !d.is_canary()).map(|d| d.id.clone()).collect();
    let all = plan(MatrixKind::All);
    let pw = plan(MatrixKind::Pairwise);
    let coverable = pairs(&ids, &all.legal);
    let covered = pairs(&ids, &pw.legal);
    let missing: Vec<_> = coverable.difference(&covered).collect();
    assert!(missing.is_empty(), "uncovered pairs: {missing:?}");
    // Pairs that cannot co-occur legally are indeed absent (e.g. bulk_p2p with nccl_allreduce).
    assert!(!coverable.contains(&(("bulk_p2p".into(), true), ("nccl_allreduce".into(), true))));
    assert!(!coverable.contains(&(("qkv_fused".into(), true), ("w8".into(), true))));
    assert!(coverable.contains(&(("oproj_tail".into(), true), ("w8".into(), true))));
    // Negative control: the check finds a gap when the sets holding one door are dropped.
    let fewer: Vec<Configuration> = pw.legal.iter().filter(|c| !c.doors.contains("oproj_tail")).cloned().collect();
    let gap = pairs(&ids, &fewer);
    assert!(!gap.contains(&(("oproj_tail".into(), true), ("w8".into(), true))));
    assert!(coverable.difference(&gap).count() > 0);
    assert!(pw.legal.iter().all(|c| c.doors.iter().all(|id| !r.door(id).unwrap().is_canary())));
}

#[test]
fn canaries_matrix_holds_each_canary_alone() {
    let r = reg();
    let p = plan(MatrixKind::Canaries);
    let sets: BTreeSet<BTreeSet<String>> = p.legal.iter().map(|c| c.doors.clone()).collect();
    // Each canary with what it requires (the silent fallback disables OPROJ_DIRECT's mechanism).
    let canaries: BTreeSet<BTreeSet<String>> =
        r.doors().iter().filter(|d| d.is_canary()).map(|d| r.closure_of([d.id.as_str()])).collect();
    assert_eq!(sets, canaries);
    assert!(p.excluded.iter().any(|e| e.config.doors == set(&["canary_reverse_kblocks"]) && e.config.tp == 1));
}

#[test]
fn enumeration_is_deterministic() {
    for kind in [MatrixKind::Single, MatrixKind::Pairwise, MatrixKind::Canaries] {
        let a = plan(kind.clone());
        let b = enumerate(
            &reg(),
            &kind,
            &[8, 4, 2, 1, 2],
            &[Transport::Nccl, Transport::HostBounce, Transport::NativeP2p],
            &[BackendKind::Cuda, BackendKind::Host],
        )
        .unwrap();
        assert_eq!(a, b, "{kind:?}: input order and repeats must not matter");
    }
}

/// The (backend, TP, transport) lanes of a sorted configuration list, in order.
fn lanes(list: &[Configuration]) -> Vec<(BackendKind, usize, Transport)> {
    let mut out: Vec<_> = list.iter().map(|c| (c.backend, c.tp, c.transport)).collect();
    out.dedup();
    out
}

#[test]
fn shards_partition_the_plan() {
    let p = plan(MatrixKind::Single);
    for n in 1..=5 {
        let shards: Vec<MatrixPlan> = (0..n).map(|i| shard(&p, i, n).unwrap()).collect();
        let mut legal: Vec<Configuration> = shards.iter().flat_map(|s| s.legal.clone()).collect();
        legal.sort();
        assert_eq!(legal, p.legal, "shards of {n} must partition legal");
        let mut na: Vec<_> = shards.iter().flat_map(|s| s.not_applicable.clone()).collect();
        na.sort();
        assert_eq!(na, p.not_applicable);
        let mut ex: Vec<_> = shards.iter().flat_map(|s| s.excluded.clone()).collect();
        ex.sort();
        assert_eq!(ex, p.excluded);
        for lane in lanes(&p.legal) {
            let of_lane = |s: &MatrixPlan| -> Vec<Configuration> {
                s.legal.iter().filter(|c| (c.backend, c.tp, c.transport) == lane).cloned().collect()
            };
            let sizes: Vec<usize> = shards.iter().map(|s| of_lane(s).len()).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{lane:?}: {sizes:?}");
            // Each shard holds a contiguous block of a lane that has one for every shard, the
            // blocks in shard order.
            let whole = of_lane(&p);
            if whole.len() >= n {
                let joined: Vec<Configuration> = shards.iter().flat_map(of_lane).collect();
                assert_eq!(joined, whole, "{lane:?}: shards of {n} must be the lane's consecutive blocks");
            }
        }
        // Short lanes are dealt round: no shard is empty while another holds two more.
        let sizes: Vec<usize> = shards.iter().map(|s| s.legal.len()).collect();
        if p.legal.len() >= n {
            assert!(sizes.iter().all(|&k| k > 0), "shards of {n}: {sizes:?}");
        }
    }
    // Many shards of a small plan (CI's nightly runs shard 0/16 of `single` on the host).
    let host_single = enumerate(
        &reg(),
        &MatrixKind::Single,
        &[1, 2, 4, 8],
        &[Transport::HostBounce, Transport::NativeP2p],
        &[BackendKind::Host],
    )
    .unwrap();
    let sizes: Vec<usize> = (0..16).map(|i| shard(&host_single, i, 16).unwrap().legal.len()).collect();
    assert!(sizes.iter().all(|&k| k > 0), "{sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), host_single.legal.len());
    // `all` on CUDA: a shard of 8 holds most census baselines of its own sets (a set with one
    // door off), so they are runs it makes anyway; a round-robin split kept almost none.
    let all = enumerate(
        &reg(),
        &MatrixKind::All,
        &[2, 8],
        &[Transport::HostBounce, Transport::NativeP2p],
        &[BackendKind::Cuda],
    )
    .unwrap();
    let kept = |s: &MatrixPlan| {
        let own: BTreeSet<&Configuration> = s.legal.iter().collect();
        let (mut found, mut asked) = (0, 0);
        for c in &s.legal {
            for d in &c.doors {
                let mut off = c.clone();
                off.doors.remove(d);
                if all.legal.contains(&off) {
                    asked += 1;
                    found += own.contains(&off) as usize;
                }
            }
        }
        found as f64 / asked as f64
    };
    let round_robin = MatrixPlan {
        legal: all.legal.iter().skip(3).step_by(8).cloned().collect(),
        excluded: vec![],
        not_applicable: vec![],
        smallest_sets_only: true,
        pass_notes: vec![],
    };
    let (blocks, spread) = (kept(&shard(&all, 3, 8).unwrap()), kept(&round_robin));
    assert!(blocks > 0.5 && spread < 0.25, "baselines kept in the shard: blocks {blocks:.2}, round robin {spread:.2}");
    assert_eq!(parse_shard("2/4").unwrap(), (2, 4));
    for bad in ["4/4", "1/0", "x/2", "1", "-1/2", "1/2/3"] {
        assert!(err_text(parse_shard(bad)).contains("0 <= I < N"), "{bad}");
    }
    assert!(shard(&p, 3, 3).is_err());
}

#[test]
fn explain_names_each_exclusion_and_its_rule() {
    let r = reg();
    let p = enumerate(
        &r,
        &MatrixKind::Single,
        &[1, 2],
        &[Transport::HostBounce, Transport::NativeP2p],
        &[BackendKind::Host],
    )
    .unwrap();
    let text = p.explain();
    assert!(text.starts_with(&format!(
        "{} legal, {} excluded, {} not applicable\n",
        p.legal.len(),
        p.excluded.len(),
        p.not_applicable.len()
    )));
    assert_eq!(text.lines().count(), 1 + p.excluded.len() + p.not_applicable.len());
    let why = r.door("oproj_direct").unwrap().tp.why.clone().unwrap();
    let line = format!("EXCLUDED        tp1 native-p2p host +oproj_direct: oproj_direct runs only at TP 2, 4, 8, not TP1 (its `tp` rule: {why})");
    assert!(text.lines().any(|l| l == line), "missing line {line}\n{text}");
    let why = r.door("oproj_direct").unwrap().transports.why.clone().unwrap();
    let line = format!("EXCLUDED        tp2 host-bounce host +oproj_direct: oproj_direct runs only over native-p2p, not host-bounce (its `transports` rule: {why})");
    assert!(text.lines().any(|l| l == line), "missing line {line}");
    assert!(text
        .lines()
        .any(|l| l
            .starts_with("NOT-APPLICABLE  tp1 host-bounce host +graph: graph has no meaning on the host backend: ")));
    assert!(plan(MatrixKind::All).explain().lines().nth(1).unwrap().contains("smallest door set"));
}

#[test]
fn labels_are_short_and_stable() {
    let c = Configuration::single(BackendKind::Host, 4, Transport::NativeP2p, set(&["oproj_tail", "oproj_direct"]));
    assert_eq!(c.label(), "tp4 native-p2p host +oproj_direct+oproj_tail");
    let rows = c.clone().with_pass(memra_runtime::PassShape::new(4, 1).unwrap());
    assert_eq!(rows.label(), "tp4 native-p2p host +oproj_direct+oproj_tail b4");
    let cols = Configuration::baseline(2, Transport::HostBounce, BackendKind::Host)
        .with_pass(memra_runtime::PassShape::new(1, 2).unwrap());
    assert_eq!(cols.label(), "tp2 host-bounce host t2");
    assert_eq!(Configuration::baseline(1, Transport::HostBounce, BackendKind::Cuda).label(), "tp1 host-bounce cuda");
    let ds = c.door_set(&reg(), None).unwrap();
    assert!(ds.oproj_direct && ds.oproj_tail && !ds.moe_direct);
}

#[test]
fn bad_matrix_requests_are_refused() {
    let r = reg();
    let e = err_text(enumerate(&r, &MatrixKind::Single, &[3], &Transport::ALL, &ALL_BACKENDS));
    assert!(e.contains("TP size 3") && e.contains("1, 2, 4 or 8"), "{e}");
    let e = err_text(enumerate(&r, &MatrixKind::Single, &[1], &[], &ALL_BACKENDS));
    assert!(e.contains("transports") && e.contains("nothing would be tested"), "{e}");
    let e = err_text(classify(
        &r,
        &Configuration {
            doors: set(&["grpah"]),
            ..Configuration::baseline(1, Transport::HostBounce, BackendKind::Host)
        },
    ));
    assert!(e.contains("did you mean graph?"), "{e}");
    assert_eq!(MatrixKind::parse("all").unwrap(), MatrixKind::All);
    assert_eq!(MatrixKind::parse("sets.json").unwrap(), MatrixKind::File("sets.json".into()));
    assert!(err_text(MatrixKind::parse("everything")).contains("all, single, pairwise"));
}

#[test]
fn door_set_files_in_toml_and_json() {
    let r = reg();
    let dir = tempfile::tempdir().unwrap();
    let toml_path = dir.path().join("sets.toml");
    std::fs::write(
        &toml_path,
        "schema_version = 1\nexpect_exclusions = true\nsets = [[], [\"OPROJ_DIRECT\", \"MEMRA_OPROJ_TAIL\"], [\"oproj_tail\"]]\n",
    )
    .unwrap();
    let json_path = dir.path().join("sets.json");
    std::fs::write(
        &json_path,
        r#"{"schema_version": 1, "expect_exclusions": true, "sets": [[], ["oproj_direct", "oproj_tail"], ["MEMRA_OPROJ_TAIL"]]}"#,
    )
    .unwrap();
    let axes = ([2usize], [Transport::NativeP2p], [BackendKind::Host]);
    let a = enumerate(&r, &MatrixKind::File(toml_path), &axes.0, &axes.1, &axes.2).unwrap();
    let b = enumerate(&r, &MatrixKind::File(json_path), &axes.0, &axes.1, &axes.2).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.legal.len(), 2);
    assert_eq!(a.excluded.len(), 1, "sets are literal: tail without direct is excluded");
    assert!(a.excluded[0].rule.starts_with("oproj_tail requires oproj_direct (its `requires` rule: "));

    let cases = [
        ("bad.toml", "schema_version = 1\nsets = [[\"oproj_dirct\"]]\n", "did you mean oproj_direct?"),
        ("rep.toml", "schema_version = 1\nsets = [[\"w8\"], [\"MEMRA_STEP_TP_W8\"]]\n", "repeats set #0"),
        ("twice.json", r#"{"schema_version": 1, "sets": [["w8", "W8"]]}"#, "named twice"),
        ("v2.json", r#"{"schema_version": 2, "sets": []}"#, "schema_version 2"),
        ("extra.toml", "schema_version = 1\nsets = []\nruns = 3\n", "runs"),
        ("sets.yaml", "sets: []", ".toml or .json"),
        ("excl.toml", "schema_version = 1\nsets = [[], [\"oproj_tail\"]]\n", "its `requires` rule"),
        ("excl2.toml", "schema_version = 1\nsets = [[\"oproj_tail\"]]\n", "expect_exclusions = true"),
        ("str.json", r#"{"schema_version": "1", "sets": []}"#, "\"1\" (a string, not a number"),
    ];
    for (name, text, says) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        let e = err_text(enumerate(&r, &MatrixKind::File(p), &axes.0, &axes.1, &axes.2));
        assert!(e.contains(says), "{name}: {e}");
    }
    // A set with an unknown door is not an empty set: no "repeats set #0" after the did-you-mean.
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "schema_version = 1\nsets = [[], [\"oproj_drect\"]]\n").unwrap();
    let e = err_text(matrix::read_door_sets(&typo, &r));
    assert!(e.contains("did you mean oproj_direct?") && !e.contains("repeats"), "{e}");
    let e = err_text(matrix::read_door_sets(&dir.path().join("none.toml"), &r));
    assert!(e.contains("none.toml"), "{e}");
}

/// The counters a backend reports itself (and the distributed backend sums across processes)
/// are engagement counters of registered doors, so no backend can prove a door that does not
/// exist or report under a name the gates never read.
#[test]
fn backend_counted_engagement_names_registered_counters() {
    let r = reg();
    let known: BTreeSet<&str> = r.doors().iter().map(|d| d.engagement.as_str()).collect();
    for name in memra_runtime::backend::BACKEND_COUNTERS {
        assert!(known.contains(name), "{name} is not the engagement counter of any door in doors.toml");
    }
}

/// The census declarations (registry schema 2): every door needs one, each well formed; the
/// file's rules refuse a bad family, a misplaced `*`, a repeat, an unknown change and an empty
/// list, naming the door and the rule.
#[test]
fn census_declarations_are_validated() {
    let line = r#"census = [{ counter = "launch.fold_reverse", change = "appears" }]"#;
    for (to, want) in [
        (r#"census = [{ counter = "launches.fold_reverse", change = "appears" }]"#, "census families"),
        (r#"census = [{ counter = "launch.fold*", change = "appears" }]"#, "whole last segment"),
        (r#"census = [{ counter = "launch..x", change = "appears" }]"#, "none of them empty"),
        (
            r#"census = [{ counter = "launch.x", change = "more" }, { counter = "launch.x", change = "more" }]"#,
            "declared once",
        ),
        (r#"census = []"#, "declares the census change"),
    ] {
        let e = err_text(Registry::from_toml_str(&edited(line, to), "t.toml"));
        assert!(e.contains("canary_reverse_kblocks") && e.contains(want), "{to}: {e}");
    }
    let e = err_text(Registry::from_toml_str(
        &edited(line, r#"census = [{ counter = "launch.x", change = "grows" }]"#),
        "t.toml",
    ));
    assert!(e.contains("grows"), "{e}");
    let e = err_text(Registry::from_toml_str(&edited(line, ""), "t.toml"));
    assert!(e.contains("census"), "a door without census: {e}");
    let d = reg().door("canary_reverse_kblocks").unwrap().clone();
    assert_eq!(d.census.len(), 1);
    assert_eq!(d.census[0].counter, "launch.fold_reverse");
}

/// The registry as a whole (issue 28): default-on doors must run together in the oracle's
/// configuration, TP1 host-bounce, or the oracle would claim "TP1 host-bounce, defaults", a
/// configuration that cannot exist (and every run with defaults would drop its TP1 runs).
#[test]
fn default_on_doors_must_run_in_the_oracle_configuration() {
    let on = |changes: &str| {
        (format!("default = false\nchanges = \"{changes}"), format!("default = true\nchanges = \"{changes}"))
    };
    let refused = |edits: &[(String, String)], says: &[&str]| {
        let mut text = BUILTIN_REGISTRY.to_string();
        for (from, to) in edits {
            assert!(text.contains(from.as_str()), "{from:?}");
            text = text.replacen(from.as_str(), to, 1);
        }
        let e = err_text(Registry::from_toml_str(&text, "t.toml"));
        for s in says {
            assert!(e.contains(s), "{s:?} not in: {e}");
        }
    };
    let direct = on("each peer's o_proj GEMV");
    refused(
        std::slice::from_ref(&direct),
        &["door \"oproj_direct\" default = true", "TP1 host-bounce", "`tp` rule allows only TP 2, 4, 8 (rule: at TP1"],
    );
    refused(std::slice::from_ref(&direct), &["`transports` rule allows only native-p2p"]);
    refused(&[on("routed experts are owned whole")], &["door \"step_ep\" default = true", "`tp` rule"]);
    // A default-on door that requires a default-off one; two default-on doors that conflict.
    refused(&[on("the o_join fold is deferred")], &["requires oproj_direct, which is default-off"]);
    refused(
        &[on("one fused QKV"), on("int8 weight mirror")],
        &["two default-on doors conflict: qkv_fused and w8", "rule:"],
    );
    // The control: a door that runs at TP1 host-bounce may be default-on.
    let (from, to) = on("device top-k");
    assert!(
        Registry::from_toml_str(&BUILTIN_REGISTRY.replacen(&from, &to, 1), "t.toml")
            .unwrap()
            .door("dev_router")
            .unwrap()
            .default
    );
}

/// `matrix --explain`'s count of the runs a plan needs beyond its jobs' own: a BIT-IDENTICAL
/// door's door-off run is the smaller configuration's own run (shared), a NUMERIC door's is not
/// (the job is teacher-forced with prompt 0 captured, the door-free set runs free), a NUMERIC set
/// with another door off is the smaller NUMERIC job's own run (shared), and a plan without the
/// smaller configuration must run it as a baseline.
#[test]
fn a_plan_counts_the_census_baselines_no_job_of_it_provides() {
    use memra_gating::plan::jobs_of;
    use memra_gating::suite::unshared_baselines;
    let r = reg();
    let all = enumerate(&r, &MatrixKind::All, &[2], &[Transport::HostBounce], &[BackendKind::Host]).unwrap();
    let pick = |sets: &[&[&str]]| {
        let wanted: Vec<BTreeSet<String>> = sets.iter().map(|s| set(s)).collect();
        let legal: Vec<Configuration> =
            all.legal.iter().filter(|c| c.batch == 1 && c.columns == 1 && wanted.contains(&c.doors)).cloned().collect();
        assert_eq!(legal.len(), sets.len(), "each door set is legal at TP2 host-bounce on the host");
        MatrixPlan { legal, excluded: vec![], not_applicable: vec![], smallest_sets_only: false, pass_notes: vec![] }
    };
    let unshared =
        |sets: &[&[&str]]| unshared_baselines(&jobs_of(&r, &pick(sets), &DoorRequest::default(), 1, None).unwrap());
    assert_eq!(unshared(&[&[], &["f32_mirror"]]), 0, "f32_mirror off is the base configuration's own run");
    assert_eq!(unshared(&[&[], &["w8"]]), 1, "w8 off, forced and captured, is no job's run");
    assert_eq!(
        unshared(&[&[], &["f32_mirror"], &["w8"], &["f32_mirror", "w8"]]),
        2,
        "w8 off twice, f32_mirror off shared"
    );
    assert_eq!(
        unshared(&[&["f32_mirror"], &["w8"], &["f32_mirror", "w8"]]),
        3,
        "and the base set, now outside the plan"
    );
}
