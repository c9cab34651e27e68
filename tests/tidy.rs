//! Tidy: the repository's invariants as tests, so nobody has to remember them (rust-analyzer's
//! `xtask/src/tidy.rs` is the model). A rule written only in ARCHITECTURE.md is a rule somebody
//! breaks by accident; each rule here names the file and line that breaks it and what to do.
//!
//! 1. `unsafe` lives only in `runtime/src/backend/cuda/`, and every `unsafe` block (and `unsafe
//!    impl`) there has a `// SAFETY:` comment naming its invariant just above it; every `unsafe fn`
//!    documents its contract under `# Safety`.
//! 2. The environment is read only by `gates/src/env.rs` and a short list of files with a reason
//!    ([`ENV_READERS`]), and written only by `gates/src/env.rs` (once, first thing in `main`).
//! 3. The CUDA kernels call no platform math: no libm, no fast-math intrinsics, no directed
//!    rounding (docs/DESIGN.md §3.4); NVRTC keeps IEEE arithmetic.
//! 4. Every Rust file opens with a `//!` paragraph saying why it exists.
//! 5. Every citation of the design names `docs/DESIGN.md` and a section that exists there, and
//!    every document the repository cites by name is in the repository.
//!
//! The rules read source text through [`lex`], which blanks comments and literals, so a rule
//! about code never fires on prose or inside a string. Each rule is a function of (path, text),
//! tested below on synthetic inputs that break it (a negative control per rule), then run over
//! the whole tree.

mod lex;

use lex::{mask, words, Lang, Masked};
use std::fmt;
use std::path::{Path, PathBuf};

/// The one folder where `unsafe` may appear.
const UNSAFE_HOME: &str = "runtime/src/backend/cuda/";

/// How many lines above an `unsafe` block its `// SAFETY:` comment may start (a multi-line
/// comment, or a statement whose `unsafe` block sits on a continuation line).
const SAFETY_WINDOW: usize = 6;

/// Files (or folders, ending in `/`) that may read the environment besides `gates/src/env.rs`,
/// each with the reason.
const ENV_READERS: &[(&str, &str)] = &[
    ("gates/src/env.rs", "the one module that reads the tool's environment: MEMRA_* doors and settings, strictly"),
    ("build.rs", "cargo hands a build script its settings (RUSTC) in the environment"),
    (
        "runtime/src/backend/cuda/nccl.rs",
        "checks (never writes) NCCL's own NCCL_NVLS_ENABLE before handing out NCCL; the binary sets it in gates/src/env.rs",
    ),
    ("tests/", "the CLI tests start the binary with the caller's environment minus every MEMRA_* variable"),
    (
        "runtime/tests/",
        "knobs of the GPU test executables: MEMRA_REQUIRE_GPU (skips become failures), MEMRA_GPU_BENCH, MEMRA_DUMP_KERNELS, PROPTEST_* defaults",
    ),
    ("receipts/tests/", "RECEIPTS_BLESS rewrites the published example receipt"),
];

/// Files that may write the environment, with the reason. A write races with every thread that
/// reads the environment (C's `getenv` takes no lock), so there is one, at process start.
const ENV_WRITERS: &[(&str, &str)] = &[(
    "gates/src/env.rs",
    "keep_nccl_multicast_off sets NCCL_NVLS_ENABLE=0, called first thing in main while single-threaded",
)];

/// The environment functions of `std::env` that read it.
const ENV_READS: [&str; 4] = ["var", "var_os", "vars", "vars_os"];
/// The environment functions of `std::env` that write it.
const ENV_WRITES: [&str; 2] = ["set_var", "remove_var"];

/// Math the canonical kernels must not call: its results are the platform's (libm, libdevice)
/// or approximations (fast-math intrinsics), not the host twin's (docs/DESIGN.md §3.4: the
/// transcendental functions are the project's own, `canon.cuh` / `canon.rs`). Exact operations
/// stay allowed: `__fdiv_rn`, `__fsqrt_rn`, `__frcp_rn`, `__fmul_rn`, `__fadd_rn`, `rintf`,
/// `fabsf`, comparisons. So does an explicit `fmaf` / `__fmaf_rn`: it is one IEEE operation
/// that `f32::mul_add` reproduces bit for bit, and whether the canonical program uses FMA is the
/// contract of `kernels/src/canon.rs`, enforced by `kernels/src/sources.rs`, not a tidy rule.
const BANNED_MATH: &[&str] = &[
    // libm, float and double
    "exp", "expf", "exp2", "exp2f", "exp10", "exp10f", "expm1", "expm1f", "log", "logf", "log2", "log2f", "log10",
    "log10f", "log1p", "log1pf", "pow", "powf", "sqrt", "sqrtf", "rsqrt", "rsqrtf", "cbrt", "cbrtf", "rcbrt",
    "rcbrtf", "hypot", "hypotf", "rhypot", "rhypotf", "norm3d", "norm3df", "rnorm3d", "rnorm3df", "sin", "sinf",
    "cos", "cosf", "tan", "tanf", "sincos", "sincosf", "sinpi", "sinpif", "cospi", "cospif", "sincospi",
    "sincospif", "asin", "asinf", "acos", "acosf", "atan", "atanf", "atan2", "atan2f", "sinh", "sinhf", "cosh",
    "coshf", "tanh", "tanhf", "asinh", "asinhf", "acosh", "acoshf", "atanh", "atanhf", "erf", "erff", "erfc",
    "erfcf", "erfinv", "erfinvf", "erfcinv", "erfcinvf", "lgamma", "lgammaf", "tgamma", "tgammaf", "fdivide",
    "fdividef",
    // fast-math intrinsics (approximate)
    "__expf", "__exp10f", "__logf", "__log2f", "__log10f", "__powf", "__sinf", "__cosf", "__tanf", "__sincosf",
    "__fdividef", "__frsqrt_rn", "__fsqrt_approx",
];

/// NVRTC options that keep the kernels' arithmetic IEEE and uncontracted; each must appear in the
/// runtime's sources.
const NVRTC_REQUIRED: [&str; 4] = ["--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"];
/// NVRTC options that would change the kernels' arithmetic; none may appear.
const NVRTC_BANNED: [&str; 5] = ["use_fast_math", "--fmad=true", "--prec-div=false", "--prec-sqrt=false", "--ftz=true"];

/// Extensions of the files whose text may cite the design.
const CITING: [&str; 7] = ["rs", "cu", "cuh", "md", "toml", "sh", "py"];
/// Extensions of code files, where a bare `§N` (no document named) is an error.
const CODE: [&str; 6] = ["rs", "cu", "cuh", "toml", "sh", "py"];
/// The design document.
const DESIGN: &str = "docs/DESIGN.md";

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

// ---------------------------------------------------------------------------------------------
// Rule 1: unsafe
// ---------------------------------------------------------------------------------------------

/// Every `unsafe` of Rust file `rel` outside [`UNSAFE_HOME`], and inside it every `unsafe` block
/// or impl without a `// SAFETY:` comment within [`SAFETY_WINDOW`] lines above (or on its line),
/// and every `unsafe fn` / `unsafe trait` without a `# Safety` section in its docs.
pub fn check_unsafe(rel: &str, src: &str) -> Vec<Violation> {
    let m = mask(src, Lang::Rust);
    let mut out = Vec::new();
    for (at, word) in words(&m.code) {
        if word != "unsafe" {
            continue;
        }
        let line = m.line_of(at);
        if !rel.starts_with(UNSAFE_HOME) {
            out.push(violation(
                rel,
                line,
                format!(
                    "`unsafe` outside {UNSAFE_HOME}: every unsafe operation and driver call of the workspace lives \
                     behind the CUDA backend's safe functions; move it there, or make this code safe"
                ),
            ));
            continue;
        }
        let rest = m.code[at + word.len()..].trim_start();
        let rest = rest.strip_prefix("extern").map_or(rest, |r| r.trim_start());
        let needs = if rest.starts_with('{') || rest.starts_with("impl") {
            Need::SafetyComment
        } else if let Some(after) = rest.strip_prefix("fn") {
            // `unsafe fn name(` declares; `unsafe fn(` is a function pointer type.
            if after.trim_start().starts_with('(') {
                Need::Nothing
            } else {
                Need::SafetyDoc
            }
        } else if rest.starts_with("trait") {
            Need::SafetyDoc
        } else {
            Need::Nothing
        };
        match needs {
            Need::SafetyComment if !safety_comment_above(&m, line) => out.push(violation(
                rel,
                line,
                format!(
                    "`unsafe` without a `// SAFETY:` comment in the {SAFETY_WINDOW} lines above: name the invariant \
                     the block relies on (\"// SAFETY: ffi.\" explains nothing)"
                ),
            )),
            Need::SafetyDoc if !safety_doc_above(&m, line) => out.push(violation(
                rel,
                line,
                "`unsafe fn` / `unsafe trait` without a `# Safety` section in its docs: list what the caller must guarantee",
            )),
            _ => {}
        }
    }
    out
}

enum Need {
    SafetyComment,
    SafetyDoc,
    Nothing,
}

fn safety_comment_above(m: &Masked, line: usize) -> bool {
    (line.saturating_sub(SAFETY_WINDOW).max(1)..=line).any(|l| m.comment(l).trim_start().starts_with("SAFETY"))
}

/// The doc comment block directly above `line` (attributes and blank lines between allowed)
/// has a `# Safety` heading.
fn safety_doc_above(m: &Masked, line: usize) -> bool {
    let mut l = line;
    while l > 1 {
        l -= 1;
        let code = m.code_line(l).trim();
        let comment = m.comment(l);
        if comment.contains("# Safety") {
            return true;
        }
        let attribute_or_blank = code.is_empty() || code.starts_with("#[");
        if !attribute_or_blank {
            return false;
        }
    }
    false
}

// ---------------------------------------------------------------------------------------------
// Rule 2: the environment
// ---------------------------------------------------------------------------------------------

fn allowed<'a>(list: &'a [(&str, &str)], rel: &str) -> Option<&'a str> {
    list.iter()
        .find(|(path, _)| if path.ends_with('/') { rel.starts_with(path) } else { rel == *path })
        .map(|(_, why)| *why)
}

/// Every read of the environment in Rust file `rel` that is not allowed by [`ENV_READERS`], and
/// every write not allowed by [`ENV_WRITERS`]. A read is `env::var`, `env::var_os`, `env::vars`,
/// `env::vars_os` (any path prefix); `var_os`, `vars_os`, `set_var` and `remove_var` count even
/// when imported by name.
pub fn check_env(rel: &str, src: &str) -> Vec<Violation> {
    let m = mask(src, Lang::Rust);
    let mut out = Vec::new();
    for (at, word) in words(&m.code) {
        let write = ENV_WRITES.contains(&word);
        if !write && !ENV_READS.contains(&word) {
            continue;
        }
        let qualified = m.code[..at].trim_end().strip_suffix("::").is_some_and(|p| p.trim_end().ends_with("env"));
        let distinctive = word.contains('_');
        if !qualified && !distinctive {
            continue;
        }
        let line = m.line_of(at);
        if write {
            if allowed(ENV_WRITERS, rel).is_none() {
                out.push(violation(
                    rel,
                    line,
                    format!(
                        "writes the environment (`std::env::{word}`): a write races with every thread that reads it; \
                         only gates/src/env.rs writes it, once, first thing in main"
                    ),
                ));
            }
        } else if allowed(ENV_READERS, rel).is_none() && allowed(ENV_WRITERS, rel).is_none() {
            out.push(violation(
                rel,
                line,
                format!(
                    "reads the environment (`std::env::{word}`): only gates/src/env.rs reads it (doors and settings \
                     are parsed strictly there, docs/DESIGN.md §4.1); pass the value in, or add this file to \
                     ENV_READERS in tests/tidy.rs with the reason"
                ),
            ));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Rule 3: kernel math
// ---------------------------------------------------------------------------------------------

/// Every call of banned math in CUDA C file `rel`: [`BANNED_MATH`] and every directed-rounding
/// intrinsic (`__<op>_rz`, `_ru`, `_rd`: the twins round to nearest).
pub fn check_kernel_math(rel: &str, src: &str) -> Vec<Violation> {
    let m = mask(src, Lang::C);
    let mut out = Vec::new();
    for (at, word) in words(&m.code) {
        if !m.code[at + word.len()..].trim_start().starts_with('(') {
            continue;
        }
        let directed = word.starts_with("__") && ["_rz", "_ru", "_rd"].iter().any(|s| word.ends_with(s));
        if BANNED_MATH.contains(&word) {
            out.push(violation(
                rel,
                m.line_of(at),
                format!(
                    "calls `{word}`: the canonical program uses the project's own math (canon.cuh: exp_c, rsqrt_c, \
                     sigmoid_c, silu_c; IEEE `_rn` operations), identical on host and device; platform math differs \
                     from the host twin (docs/DESIGN.md §3.4)"
                ),
            ));
        } else if directed {
            out.push(violation(
                rel,
                m.line_of(at),
                format!("calls `{word}`, which rounds toward a direction: the host twins round to nearest even"),
            ));
        }
    }
    out
}

/// The NVRTC options of the runtime's sources `(rel, text)`: every [`NVRTC_REQUIRED`] option
/// appears, no [`NVRTC_BANNED`] one does.
pub fn check_nvrtc_options(files: &[(String, String)]) -> Vec<Violation> {
    let mut out = Vec::new();
    for want in NVRTC_REQUIRED {
        if !files.iter().any(|(_, text)| text.contains(&format!("\"{want}\""))) {
            out.push(violation(
                "runtime/src",
                0,
                format!("no NVRTC option \"{want}\": the kernels must compile with IEEE arithmetic and no contraction"),
            ));
        }
    }
    for (rel, text) in files {
        for (n, line) in text.lines().enumerate() {
            if let Some(bad) = NVRTC_BANNED.iter().find(|b| line.contains(*b)) {
                out.push(violation(rel, n + 1, format!("NVRTC option `{bad}` changes the kernels' arithmetic")));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Rule 4: module docs
// ---------------------------------------------------------------------------------------------

/// Rust file `rel` opens (first non-blank line) with a `//!` module doc.
pub fn check_module_doc(rel: &str, src: &str) -> Vec<Violation> {
    match src.lines().enumerate().find(|(_, l)| !l.trim().is_empty()) {
        Some((_, l)) if l.trim_start().starts_with("//!") => Vec::new(),
        found => vec![violation(
            rel,
            found.map_or(1, |(n, _)| n + 1),
            "opens without a `//!` module doc: say in a paragraph why this module exists",
        )],
    }
}

// ---------------------------------------------------------------------------------------------
// Rule 5: citations
// ---------------------------------------------------------------------------------------------

/// The section numbers of the design document: `## 3. Title` → "3", `### 3.4 Title` → "3.4".
pub fn design_sections(design: &str) -> Vec<String> {
    design
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("##")?.trim_start_matches('#');
            let num = rest.trim_start().split_whitespace().next()?.trim_end_matches('.');
            (!num.is_empty() && num.chars().all(|c| c.is_ascii_digit() || c == '.')).then(|| num.to_string())
        })
        .collect()
}

/// The section number at `s[i..]` (`3`, `3.4`; a sentence's final `.` is not part of it).
fn section_at(s: &[char], i: usize) -> (String, usize) {
    let mut j = i;
    while j < s.len() && (s[j].is_ascii_digit() || (s[j] == '.' && s.get(j + 1).is_some_and(char::is_ascii_digit))) {
        j += 1;
    }
    (s[i..j].iter().collect(), j)
}

/// Every citation of the design in file `rel` (extension `ext`) that does not resolve:
/// `DESIGN.md` named without its path `docs/`, a `§N` that is not a section of `sections`, and
/// in code files a bare `§N` that names no document. In the design itself, bare `§N` are its own
/// cross-references and must exist too.
pub fn check_citations(rel: &str, ext: &str, text: &str, sections: &[String]) -> Vec<Violation> {
    let s: Vec<char> = text.chars().collect();
    let line_at = |i: usize| s[..i].iter().filter(|c| **c == '\n').count() + 1;
    let mut out = Vec::new();
    let mut cited = vec![false; s.len()];
    let mut i = 0;
    while i + 6 <= s.len() {
        if s[i..i + 6].iter().collect::<String>() != "DESIGN" || (i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_')) {
            i += 1;
            continue;
        }
        let with_path = i >= 5 && s[i - 5..i].iter().collect::<String>() == "docs/";
        let mut j = i + 6;
        let with_md = s[j..].iter().take(3).collect::<String>() == ".md";
        if with_md {
            j += 3;
        }
        let mut k = j;
        while k < s.len() && s[k] == ' ' {
            k += 1;
        }
        let is_citation = s.get(k) == Some(&'§');
        if (with_md || is_citation) && !(with_path && with_md) {
            out.push(violation(
                rel,
                line_at(i),
                format!("names the design as `{}`: write `{DESIGN}`, the document in this repository", {
                    let end = if is_citation { k } else { j };
                    s[i..end].iter().collect::<String>().trim().to_string()
                }),
            ));
        }
        if is_citation {
            // A chain: §4.1, §4.3, §9 / §3.2–§3.4 / §5/§9 / §3 and §4.
            let mut at = k;
            loop {
                cited[at] = true;
                let (num, end) = section_at(&s, at + 1);
                if !sections.contains(&num) {
                    out.push(violation(rel, line_at(at), format!("cites §{num}, which is not a section of {DESIGN}")));
                }
                let mut m = end;
                loop {
                    match s.get(m) {
                        Some(' ' | ',' | '/' | '–' | '-' | '&') => m += 1,
                        Some('a') if s[m..].iter().take(4).collect::<String>() == "and " => m += 4,
                        _ => break,
                    }
                }
                if s.get(m) == Some(&'§') {
                    at = m;
                } else {
                    break;
                }
            }
        }
        i = j;
    }
    for (at, c) in s.iter().enumerate() {
        if *c != '§' || cited[at] {
            continue;
        }
        let (num, _) = section_at(&s, at + 1);
        if rel == DESIGN {
            if !sections.contains(&num) {
                out.push(violation(rel, line_at(at), format!("refers to §{num}, which is not one of its sections")));
            }
        } else if CODE.contains(&ext) {
            out.push(violation(rel, line_at(at), format!("a bare §{num}: name the document (`{DESIGN} §{num}`)")));
        }
    }
    out
}

/// Every document that `text` cites by a capitalised file name (`ARCHITECTURE.md`, `METRICS.md`)
/// and that no file of the repository (`names`: file names) is called.
pub fn check_cited_documents(rel: &str, text: &str, names: &[String]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find(".md") {
            let head = &rest[..at];
            let start = head.rfind(|c: char| !(c.is_alphanumeric() || "_-./".contains(c))).map_or(0, |p| p + 1);
            let path = &head[start..];
            let base = path.rsplit('/').next().unwrap_or(path);
            let after = rest[at + 3..].chars().next();
            let is_name = !after.is_some_and(|c| c.is_alphanumeric() || c == '_');
            if is_name && base.starts_with(|c: char| c.is_ascii_uppercase()) {
                let file = format!("{base}.md");
                if !names.contains(&file) {
                    out.push(violation(
                        rel,
                        n + 1,
                        format!("cites {path}.md, which is not in this repository: cite a document the repository holds"),
                    ));
                }
            }
            rest = &rest[at + 3..];
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The tree
// ---------------------------------------------------------------------------------------------

/// A file of the repository: path relative to the root with `/` separators, extension, text.
struct File {
    rel: String,
    ext: String,
    text: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The root `.gitignore`'s patterns (what builds and runs leave in the tree: target/,
/// memra-receipts/, …): the files tidy must not read.
fn ignored_patterns(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join(".gitignore"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
        .map(|l| l.trim_end_matches('/').to_string())
        .collect()
}

/// `*` matches any run of characters except `/`.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            let Some(rest) = text.strip_prefix(head) else { return false };
            (0..=rest.len())
                .take_while(|&k| k == 0 || !rest[..k].contains('/'))
                .any(|k| rest.is_char_boundary(k) && glob(tail, &rest[k..]))
        }
    }
}

fn is_ignored(rel: &str, patterns: &[String]) -> bool {
    patterns.iter().any(|p| match p.strip_prefix('/') {
        Some(anchored) => glob(anchored, rel),
        None => glob(p, rel.rsplit('/').next().unwrap_or(rel)),
    })
}

/// Every text file of the repository with one of `exts`, sorted, skipping hidden folders and what
/// `.gitignore` ignores.
fn tree(exts: &[&str]) -> Vec<File> {
    let root = root();
    let patterns = ignored_patterns(&root);
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(&root).expect("under the root").to_string_lossy().replace('\\', "/");
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || is_ignored(&rel, &patterns) {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if let Some(ext) = path.extension().and_then(|e| e.to_str()).filter(|e| exts.contains(e)) {
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                out.push(File { rel, ext: ext.to_string(), text });
            }
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    out
}

fn all_file_names() -> Vec<String> {
    tree(&["md", "rs", "toml", "cu", "cuh", "sh", "py", "json"])
        .into_iter()
        .map(|f| f.rel.rsplit('/').next().unwrap_or(&f.rel).to_string())
        .collect()
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
fn unsafe_lives_only_in_the_cuda_backend_with_safety_comments() {
    let files = tree(&["rs"]);
    let blocks: usize = files
        .iter()
        .filter(|f| f.rel.starts_with(UNSAFE_HOME))
        .map(|f| words(&mask(&f.text, Lang::Rust).code).filter(|(_, w)| *w == "unsafe").count())
        .sum();
    // The rule must have something to check: the CUDA backend is made of unsafe calls.
    assert!(blocks > 50, "tidy found only {blocks} `unsafe` in {UNSAFE_HOME}: is it reading the tree?");
    assert_clean("unsafe", files.iter().flat_map(|f| check_unsafe(&f.rel, &f.text)).collect());
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

/// Each rule on inputs that break it (the negative controls) and on inputs that keep it.
mod rules {
    use super::*;

    #[test]
    fn unsafe_block_outside_the_cuda_backend_fails() {
        let src = "//! x\nfn f() {\n    // SAFETY: even with a reason\n    unsafe { g() }\n}\n";
        let v = check_unsafe("runtime/src/program/layer.rs", src);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].file.as_str(), v[0].line), ("runtime/src/program/layer.rs", 4));
        assert!(v[0].message.contains("outside runtime/src/backend/cuda/"), "{}", v[0]);
        assert_eq!(check_unsafe("gates/src/suite.rs", "unsafe impl Send for X {}").len(), 1);
        assert_eq!(check_unsafe("tools/src/x.rs", "pub unsafe fn f() {}").len(), 1);
    }

    #[test]
    fn unsafe_block_in_the_cuda_backend_needs_a_safety_comment() {
        let rel = "runtime/src/backend/cuda/memory.rs";
        let bare = "fn f() {\n    let r = unsafe { g() };\n}\n";
        let v = check_unsafe(rel, bare);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].line, 2);
        let far = format!("// SAFETY: too far\n{}unsafe {{ g() }}\n", "x();\n".repeat(SAFETY_WINDOW + 1));
        assert_eq!(check_unsafe(rel, &far).len(), 1, "a SAFETY comment beyond the window does not count");
        let ok = "fn f() {\n    // SAFETY: `p` is a live allocation of this context.\n    let r = unsafe { g(p) };\n}\n";
        assert!(check_unsafe(rel, ok).is_empty());
        let impl_ok = "// SAFETY: the handle is only used under the backend's lock.\nunsafe impl Send for H {}\n";
        assert!(check_unsafe(rel, impl_ok).is_empty());
        assert_eq!(check_unsafe(rel, "unsafe impl Send for H {}\n").len(), 1);
    }

    #[test]
    fn unsafe_fn_needs_a_safety_section_and_pointer_types_need_nothing() {
        let rel = "runtime/src/backend/cuda/nccl.rs";
        assert_eq!(check_unsafe(rel, "/// Resolves a symbol.\nunsafe fn sym() {}\n").len(), 1);
        let ok = "/// Resolves a symbol.\n///\n/// # Safety\n/// `F` is its type.\n#[inline]\nunsafe fn sym() {}\n";
        assert!(check_unsafe(rel, ok).is_empty());
        assert!(check_unsafe(rel, "struct L { f: unsafe extern \"C\" fn(i32) -> i32, g: unsafe fn() }\n").is_empty());
    }

    #[test]
    fn unsafe_in_comments_and_strings_is_not_code() {
        let src = "//! Why `unsafe` stays in the CUDA backend.\nfn f() { let s = \"unsafe { }\"; /* unsafe */ }\n";
        assert!(check_unsafe("gates/src/x.rs", src).is_empty());
    }

    #[test]
    fn environment_reads_and_writes_outside_their_module_fail() {
        let read = "fn f() { let v = std::env::var(\"MEMRA_X\"); }\n";
        let v = check_env("runtime/src/program/mod.rs", read);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].message.contains("reads the environment"), "{}", v[0]);
        assert!(check_env("gates/src/env.rs", read).is_empty());
        let imported = "use std::env::var_os;\nfn f() { var_os(\"X\"); }\n";
        assert_eq!(check_env("gates/src/plan.rs", imported).len(), 2);
        let write = "fn f() { std::env::set_var(\"NCCL_NVLS_ENABLE\", \"0\"); }\n";
        let v = check_env("runtime/src/backend/cuda/nccl.rs", write);
        assert_eq!(v.len(), 1, "reading is allowed there, writing is not: {v:?}");
        assert!(v[0].message.contains("writes the environment"), "{}", v[0]);
        assert_eq!(check_env("runtime/tests/support/gpu.rs", write).len(), 1, "tests may not write it either");
        assert!(check_env("runtime/tests/support/gpu.rs", read).is_empty());
        assert!(check_env("src/main.rs", "fn f() { let v = \"std::env::var\"; let c = cmd.env(\"A\", \"1\"); }").is_empty());
    }

    #[test]
    fn platform_math_in_kernels_fails_and_canonical_math_passes() {
        let src = "float f(float x) {\n  float a = __expf(x);\n  float b = expf(x) + sqrtf(x);\n  return __fadd_rz(a, b);\n}\n";
        let v = check_kernel_math("kernels/cuda/x.cu", src);
        let named: Vec<(usize, bool)> = v.iter().map(|v| (v.line, v.message.contains("directed") || v.message.contains("rounds toward"))).collect();
        assert_eq!(named, [(2, false), (3, false), (3, false), (4, true)], "{v:?}");
        let ok = "// expf( would be wrong here\nfloat g(float x) { return exp_c(x) * __fdiv_rn(x, __fsqrt_rn(x)) + fmaf(x, x, x) + rintf(x); }\n";
        assert!(check_kernel_math("kernels/cuda/x.cu", ok).is_empty(), "{:?}", check_kernel_math("kernels/cuda/x.cu", ok));
    }

    #[test]
    fn nvrtc_options_must_stay_ieee() {
        let good = vec![("runtime/src/backend/cuda/compile.rs".to_string(), "\"--fmad=false\".into(), \"--prec-div=true\".into(), \"--prec-sqrt=true\".into(), \"--ftz=false\".into()".to_string())];
        assert!(check_nvrtc_options(&good).is_empty());
        let bad = vec![("runtime/src/backend/cuda/compile.rs".to_string(), "\"--use_fast_math\".into()".to_string())];
        assert_eq!(check_nvrtc_options(&bad).len(), NVRTC_REQUIRED.len() + 1);
    }

    #[test]
    fn a_file_without_module_docs_fails() {
        assert_eq!(check_module_doc("gates/src/x.rs", "\n// a plain comment\nfn f() {}\n")[0].line, 2);
        assert_eq!(check_module_doc("gates/src/x.rs", "/// an item doc\nfn f() {}\n").len(), 1);
        assert!(check_module_doc("gates/src/x.rs", "\n//! Why this exists.\nfn f() {}\n").is_empty());
    }

    #[test]
    fn citations_must_name_docs_design_and_an_existing_section() {
        let sections = design_sections("# T\n## 3. Program\n### 3.4 Why\n## 4. Doors\n### 4.1 Registry\n");
        assert_eq!(sections, ["3", "3.4", "4", "4.1"]);
        let ok = "// docs/DESIGN.md §3.4, last paragraph; docs/DESIGN.md §3–§4.1 and §4; (docs/DESIGN.md §3.4's rule).\n";
        assert!(check_citations("a.rs", "rs", ok, &sections).is_empty(), "{:?}", check_citations("a.rs", "rs", ok, &sections));
        let missing = check_citations("a.rs", "rs", "//! docs/DESIGN.md §4.1, §9\n", &sections);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].message.contains("§9"), "{}", missing[0]);
        let old = check_citations("a.rs", "rs", "// DESIGN.md §3.4\n// DESIGN §4\n// see DESIGN.md\n", &sections);
        assert_eq!(old.iter().map(|v| v.line).collect::<Vec<_>>(), [1, 2, 3], "{old:?}");
        let bare = check_citations("a.rs", "rs", "// (§4)\n", &sections);
        assert_eq!(bare.len(), 1, "{bare:?}");
        assert!(check_citations("METRICS.md", "md", "follows §1–2\n", &sections).is_empty(), "prose may number its own parts");
        assert_eq!(check_citations(DESIGN, "md", "as §3.4 says; not §7\n", &sections).len(), 1);
    }

    #[test]
    fn cited_documents_must_exist() {
        let names = vec!["ARCHITECTURE.md".to_string(), "README.md".to_string()];
        let text = "see ARCHITECTURE.md and ../README.md; not NOWHERE.md; summary.md is output\n";
        let v = check_cited_documents("docs/x.md", text, &names);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].message.contains("NOWHERE.md"), "{}", v[0]);
    }

    #[test]
    fn gitignore_globs() {
        assert!(glob("target-*", "target-x"));
        assert!(glob("scripts/gpu/*.whl", "scripts/gpu/a.whl"));
        assert!(!glob("scripts/gpu/*.whl", "scripts/gpu/x/a.whl"));
        assert!(is_ignored("memra-receipts", &["/memra-receipts".to_string()]));
        assert!(!is_ignored("docs/gpu", &["/memra-receipts".to_string()]));
    }
}
