//! Rule 1, `unsafe`: where it may appear, what it must say, and how much of it each file may
//! hold. The CUDA backend keeps its `unsafe` in the driver layer (raw: `driver.rs`, `nccl_sys.rs`;
//! safe: `safe/`) and in kernel-argument packing (`launch/mod.rs`); the host backend in its
//! AVX-512 folder. Every other file calls safe functions. Each file that holds `unsafe` has a
//! ceiling, and the count may only fall: a file above its ceiling fails, and so does one below it
//! until the ceiling is lowered to match (a ratchet, so the number cannot creep back).

use super::lex::{mask, words, Lang, Masked};
use super::{violation, Violation};

/// The files (or folders, ending in `/`) where `unsafe` may appear, each with the reason.
pub const UNSAFE_HOMES: &[(&str, &str)] = &[
    (
        "runtime/src/backend/cuda/driver.rs",
        "the raw CUDA driver and NVRTC layer: thin unsafe wrappers of cudarc's `sys` and `result`, each with its \
         `# Safety` contract",
    ),
    ("runtime/src/backend/cuda/nccl_sys.rs", "the raw NCCL layer: dlopen, dlsym and nccl.h's entry points"),
    (
        "runtime/src/backend/cuda/safe/",
        "the safe driver layer: typed handles and checked device regions whose methods make the raw calls",
    ),
    (
        "runtime/src/backend/cuda/launch/mod.rs",
        "kernel-argument packing: the parameter blocks passed by value (`DeviceRepr`) and the launch macro",
    ),
    (
        "runtime/witness/src/inject.rs",
        "the outside witness's CUPTI injection library: CUPTI's C entry points, its callback's raw data, atexit",
    ),
    (
        "runtime/src/backend/host/simd/",
        "the host backend's AVX-512 GEMV twins: raw-pointer vector loads and calls of `#[target_feature]` \
         functions after detecting the feature",
    ),
];

/// The most `unsafe` sites (blocks, impls, `unsafe fn` and `unsafe trait` declarations; not
/// `unsafe fn(…)` pointer types) each file may hold. Lower an entry when its file's count falls;
/// raising one means new `unsafe` outside the safe layer's functions, which a review must accept.
#[rustfmt::skip]
pub const UNSAFE_CEILINGS: &[(&str, usize)] = &[
    ("runtime/src/backend/cuda/driver.rs", 68),
    ("runtime/src/backend/cuda/nccl_sys.rs", 9),
    ("runtime/src/backend/cuda/safe/mem.rs", 21),
    ("runtime/src/backend/cuda/safe/mod.rs", 11),
    ("runtime/src/backend/cuda/safe/nccl.rs", 14),
    ("runtime/src/backend/cuda/safe/nvrtc.rs", 7),
    ("runtime/src/backend/cuda/launch/mod.rs", 2),
    ("runtime/src/backend/host/simd/avx512.rs", 29),
    ("runtime/src/backend/host/simd/mod.rs", 7),
    ("runtime/witness/src/inject.rs", 9),
];

/// How many lines above an `unsafe` block its `// SAFETY:` comment may start (a multi-line
/// comment, or a statement whose `unsafe` block sits on a continuation line).
pub const SAFETY_WINDOW: usize = 6;

/// `entry` of a list of (file or folder ending in `/`, value) that covers `rel`.
fn entry<T: Copy>(list: &[(&str, T)], rel: &str) -> Option<T> {
    list.iter()
        .find(|(path, _)| if path.ends_with('/') { rel.starts_with(path) } else { rel == *path })
        .map(|(_, v)| *v)
}

/// Whether `unsafe` may appear in Rust file `rel`.
pub fn unsafe_allowed(rel: &str) -> bool {
    entry(UNSAFE_HOMES, rel).is_some()
}

enum Need {
    SafetyComment,
    SafetyDoc,
    Nothing,
}

/// What the `unsafe` at byte `at` of the masked code must carry: a block or impl its
/// `// SAFETY:` comment, a declared `unsafe fn` or `unsafe trait` its `# Safety` doc, a
/// function pointer type (`unsafe fn(`, `unsafe extern "C" fn(`) nothing.
fn need(m: &Masked, at: usize) -> Need {
    let rest = m.code[at + "unsafe".len()..].trim_start();
    let rest = rest.strip_prefix("extern").map_or(rest, |r| r.trim_start());
    let rest = rest.strip_prefix("\"C\"").map_or(rest, |r| r.trim_start());
    if rest.starts_with('{') || rest.starts_with("impl") {
        Need::SafetyComment
    } else if let Some(after) = rest.strip_prefix("fn") {
        if after.trim_start().starts_with('(') {
            Need::Nothing
        } else {
            Need::SafetyDoc
        }
    } else if rest.starts_with("trait") {
        Need::SafetyDoc
    } else {
        Need::Nothing
    }
}

/// The `unsafe` sites of Rust source `src`: blocks, impls, `unsafe fn` and `unsafe trait`
/// declarations (function pointer types, comments and strings are not sites).
pub fn unsafe_sites(src: &str) -> usize {
    let m = mask(src, Lang::Rust);
    words(&m.code).filter(|(_, w)| *w == "unsafe").filter(|(at, _)| !matches!(need(&m, *at), Need::Nothing)).count()
}

/// Every `unsafe` of Rust file `rel` outside [`UNSAFE_HOMES`], and inside them every `unsafe`
/// block or impl without a `// SAFETY:` comment within [`SAFETY_WINDOW`] lines above (or on its
/// line), and every `unsafe fn` / `unsafe trait` without a `# Safety` section in its docs.
pub fn check_unsafe(rel: &str, src: &str) -> Vec<Violation> {
    let m = mask(src, Lang::Rust);
    let mut out = Vec::new();
    for (at, word) in words(&m.code) {
        if word != "unsafe" {
            continue;
        }
        let line = m.line_of(at);
        if !unsafe_allowed(rel) {
            let homes: Vec<&str> = UNSAFE_HOMES.iter().map(|(p, _)| *p).collect();
            out.push(violation(
                rel,
                line,
                format!(
                    "`unsafe` outside its homes ({}): the CUDA backend's other files call the safe driver layer \
                     (runtime/src/backend/cuda/safe/); add a safe function there, or make this code safe",
                    homes.join(", ")
                ),
            ));
            continue;
        }
        match need(&m, at) {
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

/// Every file of `counts` (path, its [`unsafe_sites`]) above its entry in `ceilings`, below it
/// (the entry must be lowered), or holding `unsafe` without an entry; and every entry naming no
/// file of `counts`.
pub fn check_unsafe_ceilings(counts: &[(String, usize)], ceilings: &[(&str, usize)]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (rel, n) in counts {
        let n = *n;
        match ceilings.iter().find(|(p, _)| p == rel).map(|(_, max)| *max) {
            None if n > 0 => out.push(violation(
                rel,
                0,
                format!(
                    "{n} `unsafe` sites and no entry in UNSAFE_CEILINGS (tests/tidy/unsafety.rs): a file that \
                     needs `unsafe` is listed with its count, which then only falls"
                ),
            )),
            Some(max) if n > max => out.push(violation(
                rel,
                0,
                format!(
                    "{n} `unsafe` sites, above its ceiling of {max} in UNSAFE_CEILINGS: the number only falls; call \
                     (or add) a safe function of runtime/src/backend/cuda/safe/ instead"
                ),
            )),
            Some(max) if n < max => out.push(violation(
                rel,
                0,
                format!(
                    "{n} `unsafe` sites, below its ceiling of {max}: lower its entry in UNSAFE_CEILINGS \
                     (tests/tidy/unsafety.rs) to {n} so the number cannot creep back"
                ),
            )),
            _ => {}
        }
    }
    for (path, max) in ceilings {
        if !counts.iter().any(|(rel, _)| rel == path) {
            out.push(violation(
                path,
                0,
                format!("has a ceiling of {max} in UNSAFE_CEILINGS but is not in the tree: remove the entry"),
            ));
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    const SIMD: &str = "runtime/src/backend/host/simd/avx512.rs";
    const SAFE: &str = "runtime/src/backend/cuda/safe/mem.rs";

    #[test]
    fn unsafe_outside_its_homes_fails() {
        let src = "//! x\nfn f() {\n    // SAFETY: even with a reason\n    unsafe { g() }\n}\n";
        let v = check_unsafe("runtime/src/program/layer.rs", src);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].file.as_str(), v[0].line), ("runtime/src/program/layer.rs", 4));
        assert!(v[0].message.contains("outside its homes"), "{}", v[0]);
        assert_eq!(check_unsafe("gates/src/suite.rs", "unsafe impl Send for X {}").len(), 1);
        assert_eq!(check_unsafe("tools/src/x.rs", "pub unsafe fn f() {}").len(), 1);
        // The CUDA backend beyond its driver layer and kernel-argument packing is no home either.
        for rel in [
            "runtime/src/backend/cuda/transfer.rs",
            "runtime/src/backend/cuda/nccl.rs",
            "runtime/src/backend/cuda/launch/gemv.rs",
            "runtime/src/backend/cuda/safety.rs",
        ] {
            assert_eq!(check_unsafe(rel, src).len(), 1, "{rel} must not hold unsafe");
        }
        for rel in [SIMD, SAFE, "runtime/src/backend/cuda/driver.rs", "runtime/src/backend/cuda/launch/mod.rs"] {
            assert!(check_unsafe(rel, src).is_empty(), "{rel} is a home");
        }
        assert_eq!(check_unsafe("runtime/src/backend/host/rows.rs", src).len(), 1);
        let bare = "//! x\nfn f() {\n    unsafe { g() }\n}\n";
        assert_eq!(check_unsafe(SIMD, bare).len(), 1, "the SAFETY rule holds in every home");
    }

    #[test]
    fn unsafe_block_in_a_home_needs_a_safety_comment() {
        let bare = "fn f() {\n    let r = unsafe { g() };\n}\n";
        let v = check_unsafe(SAFE, bare);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].line, 2);
        let far = format!("// SAFETY: too far\n{}unsafe {{ g() }}\n", "x();\n".repeat(SAFETY_WINDOW + 1));
        assert_eq!(check_unsafe(SAFE, &far).len(), 1, "a SAFETY comment beyond the window does not count");
        let ok =
            "fn f() {\n    // SAFETY: `p` is a live allocation of this context.\n    let r = unsafe { g(p) };\n}\n";
        assert!(check_unsafe(SAFE, ok).is_empty());
        let impl_ok = "// SAFETY: the handle is only used under the backend's lock.\nunsafe impl Send for H {}\n";
        assert!(check_unsafe(SAFE, impl_ok).is_empty());
        assert_eq!(check_unsafe(SAFE, "unsafe impl Send for H {}\n").len(), 1);
    }

    #[test]
    fn unsafe_fn_needs_a_safety_section_and_pointer_types_need_nothing() {
        let rel = "runtime/src/backend/cuda/nccl_sys.rs";
        assert_eq!(check_unsafe(rel, "/// Resolves a symbol.\nunsafe fn sym() {}\n").len(), 1);
        let ok = "/// Resolves a symbol.\n///\n/// # Safety\n/// `F` is its type.\n#[inline]\nunsafe fn sym() {}\n";
        assert!(check_unsafe(rel, ok).is_empty());
        assert!(check_unsafe(rel, "struct L { f: unsafe extern \"C\" fn(i32) -> i32, g: unsafe fn() }\n").is_empty());
    }

    #[test]
    fn unsafe_in_comments_and_strings_is_not_code() {
        let src = "//! Why `unsafe` stays in the CUDA backend.\nfn f() { let s = \"unsafe { }\"; /* unsafe */ }\n";
        assert!(check_unsafe("gates/src/x.rs", src).is_empty());
        assert_eq!(unsafe_sites(src), 0);
    }

    #[test]
    fn sites_count_blocks_impls_and_declarations_not_pointer_types() {
        let src = "// SAFETY: a\nunsafe impl Send for H {}\n/// # Safety\n/// b\nunsafe fn f() {}\n\
                   struct L { p: unsafe extern \"C\" fn(i32), q: unsafe fn() }\n\
                   fn g() { let a = unsafe { f() }; let b = unsafe { f() }; }\n";
        assert_eq!(unsafe_sites(src), 4);
    }

    #[test]
    fn a_count_above_its_ceiling_fails_and_below_it_asks_to_lower_it() {
        let ceilings = [(SAFE, 2), ("runtime/src/backend/cuda/driver.rs", 1)];
        let file = "// SAFETY: a\nfn f() { unsafe { g() } }\n// SAFETY: b\nfn h() { unsafe { g() } }\n";
        let counts = |src: &str| {
            vec![(SAFE.to_string(), unsafe_sites(src)), ("runtime/src/backend/cuda/driver.rs".to_string(), 1)]
        };
        assert!(check_unsafe_ceilings(&counts(file), &ceilings).is_empty(), "at the ceiling");
        // Negative control: one planted block more.
        let planted = format!("{file}// SAFETY: c\nfn k() {{ unsafe {{ g() }} }}\n");
        let v = check_unsafe_ceilings(&counts(&planted), &ceilings);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].message.contains("3 `unsafe` sites, above its ceiling of 2"), "{}", v[0]);
        let fewer = "// SAFETY: a\nfn f() { unsafe { g() } }\n";
        let v = check_unsafe_ceilings(&counts(fewer), &ceilings);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].message.contains("lower its entry in UNSAFE_CEILINGS") && v[0].message.contains("to 1"));
    }

    #[test]
    fn a_file_with_unsafe_needs_a_ceiling_and_a_ceiling_needs_its_file() {
        let counts = vec![("runtime/src/backend/cuda/safe/new.rs".to_string(), 1), (SAFE.to_string(), 0)];
        let v = check_unsafe_ceilings(&counts, &[("runtime/src/backend/cuda/safe/gone.rs", 3)]);
        let msgs: Vec<&str> = v.iter().map(|v| v.message.as_str()).collect();
        assert_eq!(v.len(), 2, "{msgs:?}");
        assert!(msgs[0].contains("no entry in UNSAFE_CEILINGS"), "{}", msgs[0]);
        assert!(msgs[1].contains("not in the tree"), "{}", msgs[1]);
    }

    #[test]
    fn every_ceiling_names_a_home() {
        for (path, _) in UNSAFE_CEILINGS {
            assert!(unsafe_allowed(path), "{path} has a ceiling but may not hold unsafe");
        }
    }
}
