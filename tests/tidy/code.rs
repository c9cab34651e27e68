//! The rules about code: who may touch the environment, which math the kernels may call, that raw
//! driver calls stay behind one layer, and that every module says why it exists (where `unsafe`
//! may appear is `unsafety.rs`). Each rule is a function of (path, text) so that the tests below
//! can break it on purpose.

use super::lex::{mask, words, Lang};
use super::{violation, Violation};

/// Files (or folders, ending in `/`) that may read the environment besides `gates/src/env.rs`,
/// each with the reason.
const ENV_READERS: &[(&str, &str)] = &[
    ("gates/src/env.rs", "the one module that reads the tool's environment: MEMRA_* doors and settings, strictly"),
    ("build.rs", "cargo hands a build script its settings (RUSTC) in the environment"),
    ("runtime/build.rs", "cargo hands a build script its folders (CARGO_MANIFEST_DIR, OUT_DIR) in the environment"),
    (
        "runtime/src/backend/cuda/nccl.rs",
        "checks (never writes) NCCL's own NCCL_NVLS_ENABLE before handing out NCCL; the binary sets it in gates/src/env.rs",
    ),
    (
        "runtime/witness/src/inject.rs",
        "the CUPTI injection library runs inside a subject's process, where memra-gates is not: it reads the two \
         variables memra-gates set for it (its record directory, the CUPTI path)",
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
#[rustfmt::skip]
const BANNED_MATH: &[&str] = &[
    // libm, float and double
    "exp", "expf", "exp2", "exp2f", "exp10", "exp10f", "expm1", "expm1f", "log", "logf", "log2", "log2f",
    "log10", "log10f", "log1p", "log1pf", "pow", "powf", "sqrt", "sqrtf", "rsqrt", "rsqrtf", "cbrt", "cbrtf",
    "rcbrt", "rcbrtf", "hypot", "hypotf", "rhypot", "rhypotf", "norm3d", "norm3df", "rnorm3d", "rnorm3df",
    "sin", "sinf", "cos", "cosf", "tan", "tanf", "sincos", "sincosf", "sinpi", "sinpif", "cospi", "cospif",
    "sincospi", "sincospif", "asin", "asinf", "acos", "acosf", "atan", "atanf", "atan2", "atan2f", "sinh",
    "sinhf", "cosh", "coshf", "tanh", "tanhf", "asinh", "asinhf", "acosh", "acoshf", "atanh", "atanhf", "erf",
    "erff", "erfc", "erfcf", "erfinv", "erfinvf", "erfcinv", "erfcinvf", "lgamma", "lgammaf", "tgamma", "tgammaf",
    "fdivide", "fdividef",
    // fast-math intrinsics (approximate)
    "__expf", "__exp10f", "__logf", "__log2f", "__log10f", "__powf", "__sinf", "__cosf", "__tanf", "__sincosf",
    "__fdividef", "__frsqrt_rn", "__fsqrt_approx",
];

/// NVRTC options that keep the kernels' arithmetic IEEE and uncontracted; each must appear in the
/// runtime's sources.
const NVRTC_REQUIRED: [&str; 4] = ["--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"];
/// NVRTC options that would change the kernels' arithmetic; none may appear.
const NVRTC_BANNED: [&str; 5] = ["use_fast_math", "--fmad=true", "--prec-div=false", "--prec-sqrt=false", "--ftz=true"];

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
// Rule 8: raw driver calls
// ---------------------------------------------------------------------------------------------

/// The one file of the workspace that may name cudarc's raw layers (`sys`: the FFI, `result`: the
/// FFI returning `Result`); the rest of the CUDA backend uses cudarc's safe types and this file's
/// wrappers.
pub const DRIVER_LAYER: &str = "runtime/src/backend/cuda/driver.rs";
/// The outside witness's injection library: it calls CUPTI's raw layer (not the driver's), inside
/// a subject's process, where the backend's driver layer does not exist.
pub const CUPTI_LAYER: &str = "runtime/witness/src/inject.rs";

/// Every use of cudarc's raw layers in Rust file `rel` outside [`DRIVER_LAYER`]: a path through a
/// `sys` or `result` segment (`dsys::cuMemcpyAsync(…)`, `cudarc::driver::result::init()`), and a
/// `use` of cudarc that imports either layer under any name (`use cudarc::driver::{sys as d}`).
/// `std::result` and `core::result` are not driver layers.
pub fn check_driver_calls(rel: &str, src: &str) -> Vec<Violation> {
    if rel == DRIVER_LAYER || rel == CUPTI_LAYER {
        return Vec::new();
    }
    let m = mask(src, Lang::Rust);
    let all: Vec<(usize, &str)> = words(&m.code).collect();
    // Every `use … ;` that names cudarc, as a byte range of the code.
    let cudarc_uses: Vec<std::ops::Range<usize>> = all
        .iter()
        .filter(|(_, w)| *w == "use")
        .filter_map(|(at, _)| m.code[*at..].find(';').map(|end| *at..*at + end))
        .filter(|r| m.code[r.clone()].contains("cudarc"))
        .collect();
    let mut out = Vec::new();
    for (i, (at, word)) in all.iter().enumerate() {
        if *word != "sys" && *word != "result" {
            continue;
        }
        let before = m.code[..*at].trim_end();
        let after = m.code[at + word.len()..].trim_start();
        let std_layer = before.ends_with("::") && i > 0 && matches!(all[i - 1].1, "std" | "core");
        let segment = before.ends_with("::") || after.starts_with("::");
        let imported = cudarc_uses.iter().any(|r| r.contains(at));
        if (segment || imported) && !std_layer {
            out.push(violation(
                rel,
                m.line_of(*at),
                format!(
                    "names cudarc's raw `{word}` layer: every raw driver or NVRTC call goes through {DRIVER_LAYER} \
                     (a thin wrapper with its `# Safety` contract), so that file lists every entry point the \
                     backend depends on; add a wrapper there and call it"
                ),
            ));
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(
            check_env("src/main.rs", "fn f() { let v = \"std::env::var\"; let c = cmd.env(\"A\", \"1\"); }").is_empty()
        );
    }

    #[test]
    fn platform_math_in_kernels_fails_and_canonical_math_passes() {
        let src = "float f(float x) {\n  float a = __expf(x);\n  float b = expf(x) + sqrtf(x);\n  return __fadd_rz(a, b);\n}\n";
        let v = check_kernel_math("kernels/cuda/x.cu", src);
        let named: Vec<(usize, bool)> =
            v.iter().map(|v| (v.line, v.message.contains("directed") || v.message.contains("rounds toward"))).collect();
        assert_eq!(named, [(2, false), (3, false), (3, false), (4, true)], "{v:?}");
        let ok = "// expf( would be wrong here\nfloat g(float x) { return exp_c(x) * __fdiv_rn(x, __fsqrt_rn(x)) + fmaf(x, x, x) + rintf(x); }\n";
        assert!(
            check_kernel_math("kernels/cuda/x.cu", ok).is_empty(),
            "{:?}",
            check_kernel_math("kernels/cuda/x.cu", ok)
        );
    }

    #[test]
    fn nvrtc_options_must_stay_ieee() {
        let good = vec![(
            "runtime/src/backend/cuda/compile.rs".to_string(),
            "\"--fmad=false\".into(), \"--prec-div=true\".into(), \"--prec-sqrt=true\".into(), \"--ftz=false\".into()"
                .to_string(),
        )];
        assert!(check_nvrtc_options(&good).is_empty());
        let bad = vec![("runtime/src/backend/cuda/compile.rs".to_string(), "\"--use_fast_math\".into()".to_string())];
        assert_eq!(check_nvrtc_options(&bad).len(), NVRTC_REQUIRED.len() + 1);
    }

    #[test]
    fn raw_driver_calls_outside_the_driver_layer_fail() {
        let rel = "runtime/src/backend/cuda/transfer.rs";
        let planted = "use cudarc::driver::{result as dresult, sys as dsys, CudaEvent};\nfn f() {\n    // SAFETY: x\n    unsafe { dsys::cuMemcpyAsync(d, s, n, st) };\n    cudarc::driver::result::init();\n}\n";
        let lines: Vec<usize> = check_driver_calls(rel, planted).iter().map(|v| v.line).collect();
        assert_eq!(lines, [1, 1, 5], "{:?}", check_driver_calls(rel, planted));
        let aliased = "use cudarc::nvrtc::{\n    result as r,\n    Ptx,\n};\n";
        assert_eq!(check_driver_calls(rel, aliased).len(), 1, "an aliased import is caught on its line");
        assert!(check_driver_calls(DRIVER_LAYER, planted).is_empty(), "the layer itself may");
        let fine = "use super::driver;\nuse cudarc::driver::{CudaEvent, CudaStream};\nfn f() -> std::result::Result<(), core::result::Result<u8, u8>> {\n    let r = unsafe { driver::cuMemcpyAsync(d, s, n, st) };\n    if r != driver::CUresult::CUDA_SUCCESS { let result = 1; }\n    let t = \"dsys::cuMemcpyAsync\"; // dresult::init()\n    Ok(())\n}\n";
        assert!(check_driver_calls(rel, fine).is_empty(), "{:?}", check_driver_calls(rel, fine));
    }

    #[test]
    fn a_file_without_module_docs_fails() {
        assert_eq!(check_module_doc("gates/src/x.rs", "\n// a plain comment\nfn f() {}\n")[0].line, 2);
        assert_eq!(check_module_doc("gates/src/x.rs", "/// an item doc\nfn f() {}\n").len(), 1);
        assert!(check_module_doc("gates/src/x.rs", "\n//! Why this exists.\nfn f() {}\n").is_empty());
    }
}
