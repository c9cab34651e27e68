//! Tidy: the repository's invariants as tests, so nobody has to remember them (rust-analyzer's
//! `xtask/src/tidy.rs` is the model). A rule written only in ARCHITECTURE.md is a rule somebody
//! breaks by accident; each rule here names the file and line that breaks it and what to do.
//!
//! Rules about code (`code`):
//! 1. `unsafe` lives only in its homes (`unsafety`): the CUDA backend's driver layer (`driver.rs`,
//!    `nccl_sys.rs`, `safe/`), its kernel-argument packing (`launch/mod.rs`) and the host
//!    backend's `simd/`. Every `unsafe` block (and `unsafe impl`) has a `// SAFETY:` comment naming
//!    its invariant just above it; every `unsafe fn` documents its contract under `# Safety`; each
//!    file's count of `unsafe` sites stays at or below its ceiling, which is lowered as it falls.
//! 2. The environment is read only by `gates/src/env.rs` and a short list of files, each with its
//!    reason (`ENV_READERS`), and written only by `gates/src/env.rs`, once, first thing in `main`.
//! 3. The CUDA kernels call no platform math: no libm, no fast-math intrinsics, no directed
//!    rounding (docs/DESIGN.md §3.4); NVRTC keeps IEEE arithmetic.
//! 4. Every Rust file opens with a `//!` paragraph saying why it exists.
//! 8. cudarc's raw layers (`sys`, `result`: the driver and NVRTC FFI) are named only by
//!    `runtime/src/backend/cuda/driver.rs`, whose thin wrappers every other file calls.
//! 10. The census is written only by backends (`census`): outside `runtime/src/backend/` no source
//!     names the census counter or calls a `Census` constructor (but an external subject's tape,
//!     read in `gates/src/subject/protocol/`), and the runtime assigns a record's census only
//!     from its backend's `census()`.
//!
//! Rules about structure (`imports`):
//! 7. The top-level modules of `gates/src`, `receipts/src`, `tools/src` and `kernels/src` import
//!    each other in one direction only: no cycle in the graph of their `crate::…` paths.
//!
//! Rules about documents (`docs`):
//! 5. Every citation of the design names `docs/DESIGN.md` and a section that exists there, and
//!    every document the repository cites by name is in the repository.
//! 6. Every path that the maps (ARCHITECTURE.md, README.md, docs/DESIGN.md, METRICS.md,
//!    docs/multi-host.md) name exists, so moving a file without its documentation fails here.
//! 9. Every f32 constant of the canonical arithmetic (`kernels/src/canon.rs`, the attention twin)
//!    is written in docs/DESIGN.md with its bits, so an engine written from the design keeps them.
//!
//! The code rules read source text through `lex`, which blanks comments and literals, so a rule
//! about code never fires on prose or inside a string. Each rule is a function of (path, text)
//! with negative controls in its module (synthetic inputs that break it must fail); the tests
//! below run every rule over the whole tree (`tree`: the repository minus what `.gitignore`
//! ignores).

mod census;
mod code;
mod docs;
mod imports;
mod lex;
mod tree;
mod unsafety;

use census::check_census_writers;
use code::*;
use docs::*;
use std::fmt;
use tree::{all_file_names, ignored_patterns, is_ignored, root, tree, File};
use unsafety::*;

/// One broken rule, at a place.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

fn violation(file: &str, line: usize, message: impl Into<String>) -> Violation {
    Violation { file: file.to_string(), line, message: message.into() }
}

/// Fails with every violation, one per line.
fn assert_clean(rule: &str, violations: Vec<Violation>) {
    let list: Vec<String> = violations.iter().map(|v| v.to_string()).collect();
    assert!(list.is_empty(), "tidy: {rule}: {} violation(s)\n{}", list.len(), list.join("\n"));
}

/// This checker's own files: their test inputs break the rules on purpose.
fn is_tidy(rel: &str) -> bool {
    rel == "tests/tidy.rs" || rel.starts_with("tests/tidy/")
}

#[test]
fn crate_modules_import_in_one_direction() {
    let files = tree(&["rs"]);
    let mut v = Vec::new();
    for src in ["gates/src", "receipts/src", "tools/src", "kernels/src"] {
        let crate_files: Vec<(String, String)> = files
            .iter()
            .filter(|f| f.rel.starts_with(&format!("{src}/")))
            .map(|f| (f.rel.clone(), f.text.clone()))
            .collect();
        let g = imports::graph(&crate_files, src);
        let edges: usize = g.values().map(|e| e.len()).sum();
        // The checker must see the layered crates' real structure (tools and kernels are flat).
        if src == "gates/src" || src == "receipts/src" {
            assert!(g.len() >= 8 && edges >= 10, "tidy found only {} modules and {edges} edges in {src}", g.len());
        }
        v.extend(imports::cycles(&g));
    }
    // The runtime, and its backend folder one level down (docs: ARCHITECTURE.md, "runtime").
    for (src, module_path, min_modules) in
        [("runtime/src", "crate::", 7), ("runtime/src/backend", "crate::backend::", 5)]
    {
        let crate_files: Vec<(String, String)> = files
            .iter()
            .filter(|f| f.rel.starts_with(&format!("{src}/")))
            .map(|f| (f.rel.clone(), f.text.clone()))
            .collect();
        let g = imports::graph_below(&crate_files, src, module_path);
        let edges: usize = g.values().map(|e| e.len()).sum();
        assert!(
            g.len() >= min_modules && edges >= min_modules,
            "tidy found only {} modules and {edges} edges in {src}",
            g.len()
        );
        v.extend(imports::cycles(&g));
    }
    assert_clean("import cycles", v);
}

#[test]
fn unsafe_lives_only_in_its_homes_with_safety_comments() {
    let files = tree(&["rs"]);
    let sites: usize = files.iter().filter(|f| unsafe_allowed(&f.rel)).map(|f| unsafe_sites(&f.text)).sum();
    // The rule must have something to check: the driver layer is made of unsafe calls.
    assert!(sites > 50, "tidy found only {sites} `unsafe` sites in the homes of unsafe: is it reading the tree?");
    assert_clean("unsafe", files.iter().flat_map(|f| check_unsafe(&f.rel, &f.text)).collect());
}

#[test]
fn unsafe_per_file_stays_at_or_below_its_ceiling() {
    let files = tree(&["rs"]);
    let counts: Vec<(String, usize)> =
        files.iter().filter(|f| !is_tidy(&f.rel)).map(|f| (f.rel.clone(), unsafe_sites(&f.text))).collect();
    assert!(counts.iter().filter(|(_, n)| *n > 0).count() >= 5, "tidy found too few files with unsafe");
    assert_clean("unsafe ceilings", check_unsafe_ceilings(&counts, UNSAFE_CEILINGS));
}

#[test]
fn only_gates_env_reads_the_environment() {
    let files = tree(&["rs"]);
    let env_rs = files.iter().find(|f| f.rel == "gates/src/env.rs").expect("gates/src/env.rs exists");
    let mut probe = env_rs.text.clone();
    probe.push_str("\nfn x() { let _ = std::env::var(\"X\"); }\n");
    assert!(check_env("gates/src/other.rs", &probe).len() >= 2, "the env rule must see env.rs's own reads");
    assert_clean(
        "environment",
        files.iter().filter(|f| !is_tidy(&f.rel)).flat_map(|f| check_env(&f.rel, &f.text)).collect(),
    );
}

#[test]
fn raw_driver_calls_live_behind_the_driver_layer() {
    let files = tree(&["rs"]);
    let layer = files.iter().find(|f| f.rel == DRIVER_LAYER).expect("the driver layer exists");
    // The rule must recognise the layer's own calls as raw calls (it only exempts that file).
    let seen = check_driver_calls("runtime/src/backend/cuda/elsewhere.rs", &layer.text).len();
    assert!(seen > 30, "the driver rule sees only {seen} raw calls in {DRIVER_LAYER}");
    assert_clean(
        "driver calls",
        files.iter().filter(|f| !is_tidy(&f.rel)).flat_map(|f| check_driver_calls(&f.rel, &f.text)).collect(),
    );
}

#[test]
fn census_is_written_only_by_backends() {
    let files = tree(&["rs"]);
    // The rule must see the backends' own writes as writes (it only exempts their folder).
    let host = files.iter().find(|f| f.rel == "runtime/src/backend/host/backend.rs").expect("the host backend exists");
    let seen = check_census_writers("runtime/src/program/elsewhere.rs", &host.text).len();
    assert!(seen >= 2, "the census rule sees only {seen} writes in the host backend");
    let hand_over = files.iter().filter(|f| f.text.contains(".census = ") && f.rel.starts_with("runtime/src/")).count();
    assert!(hand_over >= 1, "tidy found no record census assignment in runtime/src: is it reading the tree?");
    assert_clean(
        "census writers",
        files.iter().filter(|f| !is_tidy(&f.rel)).flat_map(|f| check_census_writers(&f.rel, &f.text)).collect(),
    );
}

#[test]
fn kernels_call_no_platform_math_and_nvrtc_keeps_ieee() {
    let kernels = tree(&["cu", "cuh"]);
    assert!(kernels.len() >= 7, "tidy found {} kernel sources", kernels.len());
    let mut v: Vec<Violation> = kernels.iter().flat_map(|f| check_kernel_math(&f.rel, &f.text)).collect();
    let runtime: Vec<(String, String)> =
        tree(&["rs"]).into_iter().filter(|f| f.rel.starts_with("runtime/src/")).map(|f| (f.rel, f.text)).collect();
    v.extend(check_nvrtc_options(&runtime));
    assert_clean("kernel math", v);
}

#[test]
fn every_rust_file_opens_with_a_module_doc() {
    let files = tree(&["rs"]);
    assert!(files.len() > 100, "tidy found only {} Rust files", files.len());
    assert_clean("module docs", files.iter().flat_map(|f| check_module_doc(&f.rel, &f.text)).collect());
}

#[test]
fn design_citations_resolve() {
    let design = std::fs::read_to_string(root().join(DESIGN)).expect("docs/DESIGN.md is in the repository");
    let sections = design_sections(&design);
    assert!(sections.len() >= 10, "docs/DESIGN.md has {} numbered sections: {sections:?}", sections.len());
    let files: Vec<File> = tree(&CITING).into_iter().filter(|f| !is_tidy(&f.rel)).collect();
    let cited: usize = files.iter().map(|f| f.text.matches("docs/DESIGN.md §").count()).sum();
    assert!(cited > 50, "tidy found only {cited} citations of docs/DESIGN.md");
    let names = all_file_names();
    let mut v = Vec::new();
    for f in &files {
        v.extend(check_citations(&f.rel, &f.ext, &f.text, &sections));
        v.extend(check_cited_documents(&f.rel, &f.text, &names));
    }
    assert_clean("citations", v);
}

#[test]
fn canonical_constants_are_in_the_design() {
    let design = std::fs::read_to_string(root().join(DESIGN)).expect("docs/DESIGN.md is in the repository");
    let (mut found, mut v) = (0, Vec::new());
    for rel in CANONICAL_CONSTANTS {
        let text = std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let (n, bad) = check_constants_documented(rel, &text, &design);
        found += n;
        v.extend(bad);
    }
    assert!(found >= 14, "tidy found only {found} canonical constants in {CANONICAL_CONSTANTS:?}");
    assert_clean("canonical constants", v);
}

#[test]
fn paths_named_by_the_maps_exist() {
    let root = root();
    // A path in a map may be relative to the root or to a member's folder (`backend/cuda/`); what
    // `.gitignore` ignores is output a run writes (`memra-receipts/`), not a file of the repository.
    let ignored = ignored_patterns(&root);
    let bases = ["", "docs/", "kernels/", "kernels/src/", "runtime/", "runtime/src/", "gates/", "gates/src/"];
    let bases = bases.iter().chain(&["receipts/", "receipts/src/", "tools/", "tools/src/"]);
    let bases: Vec<&str> = bases.copied().collect();
    let exists = |p: &str| is_ignored(p, &ignored) || bases.iter().any(|b| root.join(format!("{b}{p}")).exists());
    let mut checked = 0;
    let mut v = Vec::new();
    for map in MAPS {
        let text = std::fs::read_to_string(root.join(map)).unwrap_or_else(|e| panic!("{map}: {e}"));
        checked += text.matches('`').count();
        v.extend(check_doc_paths(map, &text, &exists));
    }
    assert!(checked > 200, "tidy found only {checked} backticks in {MAPS:?}");
    assert_clean("paths in documents", v);
}
