//! The workspace's one test layout, checked (ARCHITECTURE.md: integration tests in one binary,
//! `tests/tests.rs` + modules + `util.rs`; the CUDA tests in `runtime/tests/gpu/`).
//!
//! Every manifest sets `autotests = false` and names its test binaries, so cargo no longer builds
//! each file of `tests/` on its own — which also means a file dropped into `tests/` (or merged
//! from a branch written against the old layout) would silently never be compiled, let alone
//! run. This check walks each test binary's module tree from its root and refuses a `.rs` file
//! under `tests/` that no binary reaches, and a `#[test]` inside a `harness = false` binary
//! (libtest-mimic never sees it: such a test is registered in its module's `tests()` list).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The module-list macro of the GPU binary: `gpu_modules![a, b]` declares `mod a; mod b;`.
const MODULE_LIST_MACRO: &str = "gpu_modules![";

/// One test binary of a package: its root file and whether it uses libtest's harness.
struct TestTarget {
    root: PathBuf,
    harness: bool,
}

/// Everything wrong with the layout of the workspace at `workspace`, one sentence each.
pub fn layout_problems(workspace: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let manifest = read_toml(&workspace.join("Cargo.toml"));
    let mut packages = vec![PathBuf::new()];
    if let Some(members) = manifest.get("workspace").and_then(|w| w.get("members")).and_then(|m| m.as_array()) {
        packages.extend(members.iter().filter_map(|m| m.as_str()).map(PathBuf::from));
    }
    for package in packages {
        let dir = workspace.join(&package);
        let shown = if package.as_os_str().is_empty() { ".".to_string() } else { package.display().to_string() };
        let manifest = read_toml(&dir.join("Cargo.toml"));
        let tests_dir = dir.join("tests");
        if !tests_dir.is_dir() {
            continue;
        }
        let autotests = manifest.get("package").and_then(|p| p.get("autotests")).and_then(|a| a.as_bool());
        if autotests != Some(false) {
            problems.push(format!(
                "{shown}/Cargo.toml: set `autotests = false` and name the test binary \
                 (`[[test]] name = \"tests\" path = \"tests/tests.rs\"`): otherwise every file of tests/ is a \
                 binary of its own"
            ));
        }
        let targets: Vec<TestTarget> = manifest
            .get("test")
            .and_then(|t| t.as_array())
            .map(|tests| {
                tests
                    .iter()
                    .filter_map(|t| {
                        let path = t.get("path")?.as_str()?;
                        Some(TestTarget {
                            root: dir.join(path),
                            harness: t.get("harness").and_then(|h| h.as_bool()).unwrap_or(true),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut reached = BTreeSet::new();
        for target in &targets {
            if !target.root.is_file() {
                problems.push(format!("{shown}/Cargo.toml: test binary root {} does not exist", target.root.display()));
                continue;
            }
            let files = module_tree(&target.root, &mut problems);
            if !target.harness {
                for f in &files {
                    let text = fs::read_to_string(f).unwrap_or_default();
                    if text.lines().any(|l| l.trim() == "#[test]") {
                        problems.push(format!(
                            "{}: `#[test]` in a `harness = false` binary is never run: return `Ran` and register \
                             the test in the module's `tests()` list",
                            f.display()
                        ));
                    }
                }
            }
            reached.extend(files);
        }
        for file in rust_files(&tests_dir) {
            if !reached.contains(&file) {
                problems.push(format!(
                    "{} is not part of any test binary (with `autotests = false` cargo never builds it): \
                     declare it as a module of {shown}/tests/tests.rs, or, a CUDA test, move it into \
                     runtime/tests/gpu/ and add its name to `gpu_modules!` in gpu/main.rs",
                    file.display()
                ));
            }
        }
    }
    problems
}

fn read_toml(path: &Path) -> toml::Table {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.parse::<toml::Table>().unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("listing {}: {e}", d.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The files of the module tree rooted at `root`: `mod name;` (with an optional
/// `#[path = "…"]` on the line before) and the names in `gpu_modules![…]`, followed file to file.
/// A declared module whose file is missing is a problem (rustc would say so too).
/// `text` with a `gpu_modules![…]` list that rustfmt spread over several lines put on one.
fn one_line_module_list(text: &str) -> String {
    let Some(start) = text.find(MODULE_LIST_MACRO) else { return text.to_string() };
    let Some(len) = text[start..].find("];") else { return text.to_string() };
    let list: String = text[start..start + len].split_whitespace().collect::<Vec<_>>().join(" ");
    format!("{}{}{}", &text[..start], list.replace("[ ", "["), &text[start + len..])
}

fn module_tree(root: &Path, problems: &mut Vec<String>) -> BTreeSet<PathBuf> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![(root.to_path_buf(), true)];
    while let Some((file, owns_dir)) = stack.pop() {
        if !seen.insert(file.clone()) {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let text = one_line_module_list(&text);
        let parent = file.parent().expect("a file has a folder").to_path_buf();
        // A crate root or mod.rs declares its children beside it; `a.rs` declares them in `a/`.
        let child_dir = if owns_dir { parent.clone() } else { parent.join(file.file_stem().expect("a file name")) };
        let mut path_attr: Option<String> = None;
        for line in text.lines().map(str::trim) {
            if let Some(p) = line.strip_prefix("#[path = \"").and_then(|r| r.strip_suffix("\"]")) {
                path_attr = Some(p.to_string());
                continue;
            }
            let mut names = Vec::new();
            if let Some(name) = module_declaration(line) {
                names.push(name.to_string());
            } else if let Some(list) = line.strip_prefix(MODULE_LIST_MACRO).and_then(|r| r.strip_suffix("];")) {
                names.extend(list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from));
            }
            for name in names {
                let (path, owns) = match path_attr.take() {
                    // `#[path]` is relative to the declaring file's folder for a crate root or mod.rs.
                    Some(p) => (parent.join(p), false),
                    None if child_dir.join(format!("{name}.rs")).is_file() => {
                        (child_dir.join(format!("{name}.rs")), false)
                    }
                    None => (child_dir.join(&name).join("mod.rs"), true),
                };
                let path = normalize(&path);
                if path.is_file() {
                    stack.push((path, owns));
                } else {
                    problems.push(format!("{}: module `{name}` has no file ({})", file.display(), path.display()));
                }
            }
            path_attr = None;
        }
    }
    seen
}

/// `name` of a `mod name;` line (any visibility), or None.
fn module_declaration(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("pub ").or(line.strip_prefix("pub(crate) ")).unwrap_or(line);
    let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
    name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_').then_some(name)
}

/// `a/b/../c` → `a/c` (paths from `#[path = "../x"]`), without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_test_file_belongs_to_one_test_binary() {
    let problems = layout_problems(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert!(problems.is_empty(), "{} layout problem(s):\n{}", problems.len(), problems.join("\n"));
}

/// The negative control: a workspace with the defects this check exists for — a stray test file
/// (as a branch written against the old layout would bring), a `#[test]` in the custom-harness
/// binary, and a package still on `autotests` — must be refused, each named.
#[test]
fn a_stray_test_file_and_a_test_attribute_under_a_custom_harness_are_refused() {
    let ws = tempfile::tempdir().expect("temporary folder");
    let w = ws.path();
    let write = |rel: &str, text: &str| {
        let p = w.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    };
    let one_binary = "autotests = false\n[[test]]\nname = \"tests\"\npath = \"tests/tests.rs\"\n";
    write(
        "Cargo.toml",
        &format!("[package]\nname = \"root\"\n{one_binary}\n[workspace]\nmembers = [\"rt\", \"old\"]\n"),
    );
    write("tests/tests.rs", "mod cli;\nmod util;\n");
    write("tests/cli/mod.rs", "mod run;\n");
    write("tests/cli/run.rs", "#[test]\nfn runs() {}\n");
    write("tests/util.rs", "pub fn helper() {}\n");
    let gpu_binary = "[[test]]\nname = \"gpu\"\npath = \"tests/gpu/main.rs\"\nharness = false\n";
    write("rt/Cargo.toml", &format!("[package]\nname = \"rt\"\n{one_binary}{gpu_binary}"));
    write("rt/tests/tests.rs", "#[path = \"support/segments.rs\"]\nmod segments;\nmod model;\n");
    write("rt/tests/support/segments.rs", "pub struct S;\n");
    write("rt/tests/model.rs", "#[test]\nfn loads() {}\n");
    write(
        "rt/tests/gpu/main.rs",
        "mod harness;\n#[path = \"../support/segments.rs\"]\nmod segments;\ngpu_modules![cuda_kernels, cuda_graph];\n",
    );
    write("rt/tests/gpu/harness.rs", "pub type Ran = Result<(), ()>;\n");
    write("rt/tests/gpu/cuda_kernels.rs", "pub fn tests() {}\n");
    write("rt/tests/gpu/cuda_graph.rs", "#[test]\nfn graph() {}\n");
    write("rt/tests/cuda_step.rs", "#[test]\nfn step() {}\n");
    write("old/Cargo.toml", "[package]\nname = \"old\"\n");
    write("old/tests/plot.rs", "#[test]\nfn plots() {}\n");

    let problems = layout_problems(w);
    let text = problems.join("\n");
    assert_eq!(problems.len(), 4, "{text}");
    let named = |what: &str| problems.iter().any(|p| p.contains(what));
    assert!(named("rt/tests/cuda_step.rs is not part of any test binary"), "{text}");
    assert!(named("rt/tests/gpu/cuda_graph.rs: `#[test]` in a `harness = false` binary is never run"), "{text}");
    assert!(named("old/Cargo.toml: set `autotests = false`"), "{text}");
    assert!(named("old/tests/plot.rs is not part of any test binary"), "{text}");
    // The healthy parts (a mod.rs folder, #[path] from both binaries, the module-list macro)
    // are reached: fixing the four defects leaves nothing.
    fs::remove_file(w.join("rt/tests/cuda_step.rs")).unwrap();
    write("rt/tests/gpu/cuda_graph.rs", "pub fn tests() {}\n");
    write("old/Cargo.toml", &format!("[package]\nname = \"old\"\n{one_binary}"));
    write("old/tests/tests.rs", "mod plot;\n");
    assert_eq!(layout_problems(w), Vec::<String>::new());
}
