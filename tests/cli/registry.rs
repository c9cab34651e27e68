//! `memra-gates doors` shows the whole registry of docs/DESIGN.md §4.3 (table and JSON agree), and
//! `memra-gates matrix --explain` lists every excluded configuration with the rule that excluded it.

use std::collections::BTreeSet;

use crate::util::*;

/// The door environment variables of docs/DESIGN.md §4.3 (canaries aside).
const DESIGN_DOORS: [&str; 15] = [
    "MEMRA_STEP_TP_BULK_P2P",
    "MEMRA_OPROJ_DIRECT",
    "MEMRA_OPROJ_TAIL",
    "MEMRA_MOE_DIRECT",
    "MEMRA_ROUTES_PRESTAGE",
    "MEMRA_FENCE_MEMOPS",
    "MEMRA_RANK0_MERGE",
    "MEMRA_STEP_TP_GRAPH",
    "MEMRA_STEP_TP_F32_MIRROR",
    "MEMRA_STEP_EP",
    "MEMRA_STEP_TP_QKV_FUSED",
    "MEMRA_STEP_TP_DEV_ROUTER",
    "MEMRA_STEP_TP_W8",
    "MEMRA_STEP_NVFP4_EP2",
    "MEMRA_NCCL_ALLREDUCE",
];

#[test]
fn doors_lists_every_door_of_the_design_and_the_json_agrees() {
    let table = run(&["doors"]);
    table.expect_code(0).expect_stdout(&DESIGN_DOORS).expect_stdout(&["MEMRA_REQUIRE_GPU", "MEMRA_CANARY_FLIP_AT"]);

    let json = run(&["doors", "--json"]);
    json.expect_code(0);
    let v: serde_json::Value =
        serde_json::from_str(&json.stdout).unwrap_or_else(|e| panic!("doors --json: {e}\n{}", json.transcript()));
    let doors = v["doors"].as_array().expect("doors array");
    let envs: BTreeSet<&str> = doors.iter().map(|d| d["env"].as_str().expect("env string")).collect();
    assert_eq!(envs.len(), doors.len(), "two doors share an environment variable");
    for env in DESIGN_DOORS {
        assert!(envs.contains(env), "doors --json lacks {env}");
    }
    // At least the four planted defects of docs/DESIGN.md §4.3, all under MEMRA_CANARY_*.
    let canaries: Vec<&serde_json::Value> = doors.iter().filter(|d| d["class"] == "CANARY").collect();
    assert!(canaries.len() >= 4, "{} canaries", canaries.len());
    assert!(canaries.iter().all(|d| d["env"].as_str().unwrap().starts_with("MEMRA_CANARY_")));
    // Every door env of the JSON is in the table too (same registry).
    for env in &envs {
        assert!(table.stdout.contains(env), "the table lacks {env}");
    }
    // Every door carries its engagement counter (the VOID check depends on it).
    for d in doors {
        assert!(d["engagement"].as_str().is_some_and(|e| !e.is_empty()), "door {} has no engagement counter", d["id"]);
    }
    let settings: BTreeSet<&str> =
        v["settings"].as_array().unwrap().iter().map(|s| s["env"].as_str().unwrap()).collect();
    assert!(settings.contains("MEMRA_REQUIRE_GPU") && settings.contains("MEMRA_CANARY_FLIP_AT"), "{settings:?}");
}

#[test]
fn matrix_explain_lists_exclusions_with_their_rules() {
    let out = run(&["matrix", "--matrix", "single", "--explain"]);
    out.expect_code(0);
    let excluded: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("EXCLUDED")).collect();
    assert!(!excluded.is_empty(), "no excluded configuration explained\n{}", out.transcript());
    for line in &excluded {
        assert!(line.contains(" rule: "), "an exclusion without its rule: {line}");
    }
    // The count line agrees with the explanation.
    let count: usize = out
        .stdout
        .lines()
        .find_map(|l| l.strip_suffix(" excluded").and_then(|r| r.rsplit(", ").next()).and_then(|n| n.parse().ok()))
        .expect("a count line");
    assert_eq!(excluded.len(), count, "the count line and the EXCLUDED lines disagree\n{}", out.transcript());
    // A known exclusion: oproj_tail without native-p2p, with the registry's reason.
    assert!(
        excluded
            .iter()
            .any(|l| l.contains("host-bounce") && l.contains("+oproj_direct+oproj_tail") && l.contains("native-p2p")),
        "the oproj_tail transport exclusion is not explained\n{}",
        out.transcript()
    );
    // The runs the plan needs add up: every configuration twice plus the unshared baselines, of
    // which only the first runs are timed (the re-runs and baselines record no marks).
    let line = out.stdout.lines().find(|l| l.starts_with("runs on one model: ")).expect("the runs line");
    let numbers: Vec<usize> =
        line.split(|c: char| !c.is_ascii_digit()).filter(|t| !t.is_empty()).map(|t| t.parse().unwrap()).collect();
    let [configs, 2, baselines, total, timed, untimed, rank_runs] = numbers[..] else {
        panic!("the runs line has not its counts (N × 2 + M = T; A timed, B without marks; R rank-runs): {line}");
    };
    assert!(configs > 0, "{line}");
    // Runs × TP size: above the runs, as the plan has runs above TP1.
    assert!(rank_runs > total, "{line}");
    assert_eq!(total, 2 * configs + baselines, "{line}");
    assert_eq!((timed, untimed), (configs, configs + baselines), "{line}");
}
