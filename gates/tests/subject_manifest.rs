//! The subject manifest (gates/src/subject/protocol/manifest.rs) and what a plan makes of it: the
//! subject's registry (built-in doors with their links, its own doors, the tool's settings), its
//! class in every job, the class baseline inside its support, and NOT-APPLICABLE outside it.

use memra_gating::job::JobClass;
use memra_gating::matrix::Configuration;
use memra_gating::plan::job_of;
use memra_gating::registry::{BackendKind, Registry};
use memra_gating::subject::protocol::manifest::{Manifest, SubjectClass};
use memra_runtime::Transport;
use std::path::{Path, PathBuf};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn load(rel: &str) -> Manifest {
    Manifest::load(&repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn parse(text: &str) -> Result<Manifest, String> {
    Manifest::parse(text, Path::new("/x/m.toml")).map_err(|e| e.to_string())
}

fn config(tp: usize, transport: Transport, doors: &[&str]) -> Configuration {
    let mut c = Configuration::baseline(tp, transport, BackendKind::Host);
    c.doors = doors.iter().map(|d| d.to_string()).collect();
    c
}

#[test]
fn the_builtin_manifest_is_the_builtin_registry() {
    let m = load("scripts/subjects/builtin.toml");
    let builtin = Registry::builtin().unwrap();
    assert_eq!(m.registry.doors(), builtin.doors(), "same doors, same links, same order");
    assert_eq!(m.registry.settings(), builtin.settings());
    assert!(m.builtin_doors);
    assert_eq!(m.class, SubjectClass::Exact);
    assert_eq!((m.name.as_str(), m.version.as_str()), ("memra-runtime", env!("CARGO_PKG_VERSION")));
}

#[test]
fn the_torch_manifest_brings_its_own_numeric_door() {
    let m = load("scripts/subjects/torch.toml");
    assert!(!m.builtin_doors);
    assert_eq!(m.registry.ids(), vec!["torch_bf16_matmul"]);
    let SubjectClass::Numeric { budget, class_identity } = &m.class else { panic!("NUMERIC-CLASS") };
    assert!(*class_identity);
    // The baseline job is NUMERIC with the subject's budget; with the door, the wider of the two.
    let base = job_of(&m.registry, &config(1, Transport::HostBounce, &[]), None, None, Some(&m)).unwrap();
    let JobClass::Numeric { rel_budget, class_identity, .. } = base.class else { panic!("{:?}", base.class) };
    assert_eq!((rel_budget, class_identity), (budget.max_rel_error, true));
    let door = m.registry.door("torch_bf16_matmul").unwrap().error_budget.clone().unwrap();
    let with =
        job_of(&m.registry, &config(1, Transport::HostBounce, &["torch_bf16_matmul"]), None, None, Some(&m)).unwrap();
    let JobClass::Numeric { rel_budget, .. } = with.class else { panic!("{:?}", with.class) };
    assert_eq!(rel_budget, door.max_rel_error.max(budget.max_rel_error));
    assert_eq!(with.subject, "torch-reference");
    assert_eq!(with.doors, memra_runtime::DoorSet::default(), "a subject's own door has no runtime field");
    // Outside the manifest: NOT-APPLICABLE reasons name the subject and the rule.
    assert_eq!(m.not_applicable(&config(1, Transport::HostBounce, &[])), None);
    let r = m.not_applicable(&config(2, Transport::HostBounce, &[])).unwrap();
    assert!(r.contains("subject torch-reference 0.1.0 supports TP1 only: TP2 is outside its manifest"), "{r}");
    let r = m.not_applicable(&config(1, Transport::NativeP2p, &[])).unwrap();
    assert!(r.contains("host-bounce only: native-p2p is outside its manifest"), "{r}");
}

/// A subset of the built-in doors: requirements must come along, conflicts with doors left out
/// are dropped, and the class baseline lies inside what the subject supports.
#[test]
fn a_subset_of_builtin_doors_keeps_its_links_and_the_baseline_stays_inside_the_manifest() {
    let base = std::fs::read_to_string(repo("scripts/subjects/builtin.toml")).unwrap();
    let start = base.find("doors = [").unwrap();
    let end = start + base[start..].find(']').unwrap() + 1;
    let with_doors = |doors: &str, tp: &str| base[..start].replace("tp = [1, 2, 4, 8]", tp) + doors + &base[end..];
    let e = parse(&with_doors("doors = [\"MEMRA_FENCE_MEMOPS\"]", "tp = [1, 2, 4, 8]")).unwrap_err();
    assert!(e.contains("requires the built-in door moe_direct"), "{e}");
    let m = parse(&with_doors(
        "doors = [\"MEMRA_MOE_DIRECT\", \"MEMRA_FENCE_MEMOPS\", \"MEMRA_STEP_TP_W8\"]",
        "tp = [4, 8]",
    ))
    .unwrap();
    assert_eq!(m.registry.ids(), vec!["fence_memops", "moe_direct", "w8"]);
    assert!(
        m.registry.door("fence_memops").unwrap().conflicts.is_empty(),
        "its conflict with graph is not in this registry"
    );
    let job = job_of(&m.registry, &config(8, Transport::NativeP2p, &["w8"]), None, None, Some(&m)).unwrap();
    assert_eq!((job.baseline_tp, job.baseline_transport), (4, Transport::HostBounce), "TP1 is outside the manifest");
    assert!(job.doors.w8, "built-in doors keep their runtime field");
    let e = parse(&with_doors("doors = []", "tp = [1]")).map(|m| m.registry.doors().len()).unwrap();
    assert_eq!(e, 0, "a subject may have no door: its baseline is still gated");
}

#[test]
fn own_doors_follow_the_registry_rules() {
    let torch = std::fs::read_to_string(repo("scripts/subjects/torch.toml")).unwrap();
    for (edit, fragment) in [
        (
            torch.replace("doors = [\"MEMRA_TORCH_BF16_MATMUL\"]", "doors = []"),
            "a [[door]] entry the subject does not list",
        ),
        (
            torch
                .replace("env = \"MEMRA_TORCH_BF16_MATMUL\"", "env = \"MEMRA_STEP_TP_W8\"")
                .replace("doors = [\"MEMRA_TORCH_BF16_MATMUL\"]", "doors = [\"MEMRA_STEP_TP_W8\"]"),
            "a [[door]] entry cannot redefine it",
        ),
        (
            torch.replace("engagement = \"torch_bf16_matmul.bf16_matmuls\"", "engagement = \"bf16.matmuls\""),
            "an engagement counter is \"torch_bf16_matmul.<what>\"",
        ),
        (
            torch.replace("error_budget = { max_rel_error = 1e-4", "error_budget = { max_rel_error = -1"),
            "every bound is finite and > 0",
        ),
        (
            torch.replace("class = \"NUMERIC-CLASS\"\nerror_budget", "class = \"VALUE-IDENTICAL\"\nerror_budget"),
            "a subject is BIT-IDENTICAL or NUMERIC-CLASS",
        ),
        (torch.replace("tp = [1]", "tp = [3]"), "TP must be 1, 2, 4 or 8"),
        (torch.replace("time_limit_s = 900", "time_limit_s = 0"), "at least 1 second"),
        (torch.replace("name = \"torch-reference\"", "name = \"torch reference\""), "a subject name is"),
    ] {
        let e = parse(&edit).unwrap_err();
        assert!(e.contains(fragment), "{fragment:?} not in {e}");
    }
}
