//! The CUDA C sources of the kernels, embedded at compile time, and the closed list of kernel
//! names the runtime launches (checked after every NVRTC load).
//!
//! The sources are one translation unit for NVRTC: `canon.cuh` (canonical math, the dot32 lane
//! order, the weight decoders) first, then one `.cu` file per kernel family. Each `.cu` file
//! includes `canon.cuh` only behind its include guard, so the concatenation needs no include path.

/// (file name, contents) in the fixed concatenation order.
const SOURCES: [(&str, &str); 11] = [
    ("canon.cuh", include_str!("../cuda/canon.cuh")),
    ("gemv.cu", include_str!("../cuda/gemv.cu")),
    ("gemv_lanes.cu", include_str!("../cuda/gemv_lanes.cu")),
    ("experts.cu", include_str!("../cuda/experts.cu")),
    ("down8.cu", include_str!("../cuda/down8.cu")),
    ("norm.cu", include_str!("../cuda/norm.cu")),
    ("attention.cu", include_str!("../cuda/attention.cu")),
    ("moe.cu", include_str!("../cuda/moe.cu")),
    ("elementwise.cu", include_str!("../cuda/elementwise.cu")),
    ("digest.cu", include_str!("../cuda/digest.cu")),
    ("doors29.cu", include_str!("../cuda/doors29.cu")),
];

/// All kernel sources concatenated in a fixed order (one translation unit for NVRTC). A
/// `#line` directive before each file keeps NVRTC's error messages pointing at the right file.
pub fn cuda_source() -> String {
    concat_sources(SOURCES)
}

/// The NVRTC translation unit of `(file name, text)` pairs in order: a `#line 1 "name"`
/// directive, the text, and a newline where the text has none ([`cuda_source`]'s rule, for a
/// caller that reads the same files from another tree).
pub fn concat_sources<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (name, text) in files {
        out.push_str(&format!("#line 1 \"{name}\"\n"));
        out.push_str(text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// The file names of the sources in concatenation order (for provenance and error messages).
pub fn source_files() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().map(|(name, _)| *name)
}

/// Stable digest of [`cuda_source`]: 16 hex digits of FNV-1a 64 over its bytes. It changes
/// whenever any kernel source changes, so receipts and the binary's provenance stamp can name the
/// exact kernels a run used.
pub fn source_digest() -> String {
    const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01B3;
    let digest = cuda_source().bytes().fold(FNV_OFFSET, |h, b| (h ^ b as u64).wrapping_mul(FNV_PRIME));
    format!("{digest:016x}")
}

/// The host twins and the canonical definitions they are made of (crate-relative paths): the other
/// half of the canonical program. A change of a twin without its kernel (or the reverse) is a
/// change of the program, so the build digest covers both halves.
const TWIN_SOURCES: [(&str, &str); 14] = [
    ("src/canon.rs", include_str!("canon.rs")),
    ("src/formats/mod.rs", include_str!("formats/mod.rs")),
    ("src/formats/bf16.rs", include_str!("formats/bf16.rs")),
    ("src/formats/e4m3.rs", include_str!("formats/e4m3.rs")),
    ("src/formats/nvfp4.rs", include_str!("formats/nvfp4.rs")),
    ("src/twins/mod.rs", include_str!("twins/mod.rs")),
    ("src/twins/attention.rs", include_str!("twins/attention.rs")),
    ("src/twins/digest.rs", include_str!("twins/digest.rs")),
    ("src/twins/down8.rs", include_str!("twins/down8.rs")),
    ("src/twins/experts.rs", include_str!("twins/experts.rs")),
    ("src/twins/gemv.rs", include_str!("twins/gemv.rs")),
    ("src/twins/moe.rs", include_str!("twins/moe.rs")),
    ("src/twins/norm.rs", include_str!("twins/norm.rs")),
    ("src/twins/w8.rs", include_str!("twins/w8.rs")),
];

/// Crate-relative paths of the twin sources covered by [`build_digest`] (for `rerun-if-changed`).
pub fn twin_files() -> impl Iterator<Item = &'static str> {
    TWIN_SOURCES.iter().map(|(name, _)| *name)
}

/// The twin sources covered by the build digest: (crate-relative path, text).
pub fn twin_sources() -> &'static [(&'static str, &'static str)] {
    &TWIN_SOURCES
}

/// The digest the binary is stamped with (`MG_BUILD_KERNEL_DIGEST`, receipts'
/// `kernel_source_digest`): [`build_digest_of`] of the kernel text NVRTC compiles
/// ([`cuda_source`]), every twin source, and the `program` sources the caller names (the
/// runtime's order of operations, `memra_runtime::provenance`), so a receipt names every part of
/// the canonical program that produced it. [`source_digest`] stays the digest of the compiled
/// text alone (what a compilation is checked against).
pub fn build_digest(program: &[(&str, &str)]) -> String {
    build_digest_of(&cuda_source(), &TWIN_SOURCES, program)
}

/// 16 hex digits of FNV-1a 64 over `cuda`, then each twin's name and text, then each program
/// source's name and text, in order: any changed byte of any part changes it.
pub fn build_digest_of(cuda: &str, twins: &[(&str, &str)], program: &[(&str, &str)]) -> String {
    const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01B3;
    let fold = |h: u64, bytes: &[u8]| bytes.iter().fold(h, |h, b| (h ^ *b as u64).wrapping_mul(FNV_PRIME));
    let mut h = fold(FNV_OFFSET, cuda.as_bytes());
    for (name, text) in twins.iter().chain(program) {
        h = fold(h, name.as_bytes());
        h = fold(h, text.as_bytes());
    }
    format!("{h:016x}")
}

/// Every `extern "C"` kernel the CUDA backend launches.
pub const KERNEL_NAMES: &[&str] = &[
    // gemv.cu
    "gemv_rows_bf16",
    "gemv_rows_f32",
    "gemv_rows_e4m3",
    "gemv_rows_nvfp4",
    "gemv_rows_w8",
    "gemv_partials_bf16",
    "gemv_partials_f32",
    "gemv_partials_e4m3",
    "gemv_partials_nvfp4",
    "gemv_partials_w8",
    "gemv_rows_batch_bf16",
    "gemv_rows_batch_f32",
    "gemv_rows_tree_bf16",
    "gemv_rows_tree_f32",
    "fold_f32",
    "fold_lanes_f32",
    // gemv_lanes.cu
    "gemv_rows_lanes_bf16",
    "gemv_rows_lanes_f32",
    "gemv_partials_lanes_bf16",
    "gemv_partials_lanes_f32",
    // experts.cu
    "expert_gate_up_f32",
    "expert_gate_up_bpl_f32",
    "expert_gate_up_rows_f32",
    "expert_down_f32",
    "expert_down_bpl_f32",
    "fold_slots_f32",
    "fold_combine_f32",
    "select_slots_f32",
    "combine_owned_f32",
    // down8.cu
    "expert_down_combine_f32",
    // norm.cu
    "rmsnorm_f32",
    "add_rmsnorm_f32",
    "fold_add_rmsnorm_f32",
    // attention.cu
    "qk_norm_rope_f32",
    "decode_attention_f32",
    "qk_norm_rope_at_f32",
    "decode_attention_at_f32",
    "decode_attention_rows_f32",
    "decode_attention_cols2_f32",
    "rope_append_f32",
    // moe.cu
    "router_topk_f32",
    "router_topk_dev_f32",
    "swiglu_f32",
    "combine_f32",
    "combine_shared_f32",
    "combine_scaled_f32",
    "residual_add_f32",
    "argmax_f32",
    // elementwise.cu
    "add_f32",
    "scale_f32",
    "flip_low_bit_f32",
    "set_u32",
    "inc_u32",
    "append_at_f32",
    // digest.cu
    "digest_f32",
    "digest_batch_f32",
    // doors29.cu
    "mirror_sel_u32",
    "ring_flag_u32",
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The kernel name of a declaration that follows `extern "C" __global__ void`, past an
    /// optional `__launch_bounds__(..)`.
    fn kernel_name(after_void: &str) -> &str {
        let mut head = after_void.trim_start();
        if let Some(after) = head.strip_prefix("__launch_bounds__(") {
            let close = after.find(')').expect("unclosed __launch_bounds__");
            head = after[close + 1..].trim_start();
        }
        let end = head.find('(').expect("a kernel name is followed by its parameter list");
        head[..end].trim()
    }

    /// Names declared as `extern "C" __global__ void [__launch_bounds__(..)] NAME(` in the source.
    fn declared_kernels(src: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let mut rest = src;
        while let Some(at) = rest.find("extern \"C\" __global__ void") {
            rest = &rest[at + "extern \"C\" __global__ void".len()..];
            names.insert(kernel_name(rest).to_string());
        }
        names
    }

    #[test]
    fn every_listed_kernel_is_declared_and_every_declared_kernel_is_listed() {
        let declared = declared_kernels(&cuda_source());
        let listed: BTreeSet<String> = KERNEL_NAMES.iter().map(|s| s.to_string()).collect();
        assert_eq!(listed.len(), KERNEL_NAMES.len(), "KERNEL_NAMES has a duplicate");
        let missing: Vec<_> = listed.difference(&declared).collect();
        let unlisted: Vec<_> = declared.difference(&listed).collect();
        assert!(missing.is_empty(), "listed but not declared as extern \"C\" __global__ void NAME: {missing:?}");
        assert!(unlisted.is_empty(), "declared but missing from KERNEL_NAMES: {unlisted:?}");
    }

    /// What a weights-first path may not name before its wait: the activations and outputs of
    /// the kernels that take it (and a task's slice of x), read or written only after the wait.
    const AFTER_THE_WAIT: [&str; 6] = ["x", "xk", "out", "a", "h", "y"];

    /// `src` without its `//` comments (a comment may name anything).
    fn code_of(src: &str) -> String {
        let mut out = String::with_capacity(src.len());
        let mut in_string = false;
        let mut chars = src.chars().peekable();
        while let Some(c) = chars.next() {
            if !in_string && c == '/' && chars.peek() == Some(&'/') {
                while chars.peek().is_some_and(|&n| n != '\n') {
                    chars.next();
                }
                continue;
            }
            out.push(c);
            if c == '\\' && in_string {
                out.extend(chars.next());
            } else if c == '"' {
                in_string = !in_string;
            }
        }
        out
    }

    /// The byte offset just past the string literal that opens at `at` (escapes skipped).
    fn past_string(bytes: &[u8], at: usize) -> usize {
        let mut i = at + 1;
        while i < bytes.len() && bytes[i] != b'"' {
            i += if bytes[i] == b'\\' { 2 } else { 1 };
        }
        i + 1
    }

    /// The index of the bracket that closes the one at `open` (ASCII brackets, so byte indices;
    /// brackets in string literals do not count).
    fn closing(text: &str, open: usize) -> Option<usize> {
        let bytes = text.as_bytes();
        let (o, c) = match bytes[open] {
            b'(' => (b'(', b')'),
            b'{' => (b'{', b'}'),
            b'<' => (b'<', b'>'),
            _ => return None,
        };
        let mut depth = 0i32;
        let mut i = open;
        while i < bytes.len() {
            if bytes[i] == b'"' {
                i = past_string(bytes, i);
                continue;
            }
            depth += i32::from(bytes[i] == o) - i32::from(bytes[i] == c);
            if depth == 0 {
                return Some(i);
            }
            i += 1;
        }
        None
    }

    /// `code` with every string literal's contents blanked (same byte length), so that a bracket,
    /// `;` or name in a string cannot count as code.
    fn blank_strings(code: &str) -> String {
        let mut bytes = code.as_bytes().to_vec();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'"' {
                let end = past_string(&bytes, i);
                let close = (end - 1).min(bytes.len());
                bytes[i + 1..close].fill(b' ');
                i = end;
            } else {
                i += 1;
            }
        }
        String::from_utf8(bytes).expect("only whole strings are blanked")
    }

    fn is_ident(b: u8) -> bool {
        b.is_ascii_alphanumeric() || b == b'_'
    }

    /// The identifiers of `code` with their byte offsets, except member names (after `.`) and
    /// words in string literals.
    fn identifiers(code: &str) -> Vec<(usize, &str)> {
        let bytes = code.as_bytes();
        let mut found = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'"' {
                i = past_string(bytes, i);
            } else if is_ident(bytes[i]) {
                let start = i;
                while i < bytes.len() && is_ident(bytes[i]) {
                    i += 1;
                }
                let member = start > 0 && bytes[start - 1] == b'.';
                if !bytes[start].is_ascii_digit() && !member {
                    found.push((start, &code[start..i]));
                }
            } else {
                i += 1;
            }
        }
        found
    }

    /// The device function templates of `code` (comments stripped) whose last template parameter
    /// is the weights-first flag `bool WF`: (name, body between the braces).
    fn weights_first_functions(code: &str) -> Vec<(String, String)> {
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(at) = code[from..].find("template <") {
            let open = from + at + "template ".len();
            let close = closing(code, open).expect("a template header closes");
            from = close;
            let last = code[open + 1..close].rsplit(',').next().unwrap_or("");
            if last.split_whitespace().collect::<Vec<_>>() != ["bool", "WF"] {
                continue;
            }
            let paren = close + code[close..].find('(').expect("a function template has parameters");
            let name = identifiers(&code[close + 1..paren]).last().map(|(_, n)| n.to_string()).unwrap_or_default();
            let params_end = closing(code, paren).expect("a parameter list closes");
            let brace = params_end + code[params_end..].find('{').expect("a function template has a body");
            let end = closing(code, brace).expect("a body closes");
            found.push((name, code[brace + 1..end].to_string()));
        }
        found
    }

    /// Trimmed text of the statement head before byte `at` of `body`: back to the last `;`, `{`
    /// or `}` (the `if constexpr (WF)` a statement or block is guarded by, or nothing).
    fn head_before(body: &str, at: usize) -> &str {
        let start = body[..at].rfind([';', '{', '}']).map_or(0, |i| i + 1);
        body[start..at].trim()
    }

    /// Whether the weights-first path of a function body waits before it touches anything a
    /// kernel writes: its first `kernel_entry();` is unconditional on that path (at the body's
    /// top level, or directly in a top-level `if constexpr (WF) { .. }`), and the code before it
    /// names none of AFTER_THE_WAIT and has no `return`, except inside calls that hand the flag
    /// on (`g<.., WF>(..);`, optionally followed by `return;`) to a function of `wf_functions`,
    /// which is checked in turn.
    fn waits_before(body: &str, wf_functions: &[String]) -> Result<(), String> {
        const GUARD: &str = "if constexpr (WF)";
        let body = &blank_strings(body);
        let wait = identifiers(body)
            .into_iter()
            .find(|&(i, n)| n == "kernel_entry" && body[i + n.len()..].starts_with("();"))
            .map(|(i, _)| i)
            .ok_or("never calls kernel_entry()")?;
        let before = &body[..wait];
        let depth = before.matches('{').count() as i64 - before.matches('}').count() as i64;
        let head = head_before(body, wait);
        let placed = match depth {
            0 => head.is_empty() || head == GUARD,
            1 => {
                let mut open = wait;
                let mut d = 0i64;
                while open > 0 {
                    open -= 1;
                    match body.as_bytes()[open] {
                        b'}' => d += 1,
                        b'{' if d == 0 => break,
                        b'{' => d -= 1,
                        _ => {}
                    }
                }
                head.is_empty() && head_before(body, open) == GUARD
            }
            _ => false,
        };
        if !placed {
            return Err(format!("kernel_entry() is conditional (`{head}` at depth {depth})"));
        }
        // The code before the wait, less the calls that hand the flag on.
        let mut prologue = before.to_string();
        while let Some(at) = prologue.find("WF>(") {
            let lt = prologue[..at].rfind('<').ok_or("a `WF>(` without its `<`")?;
            let callee = identifiers(&prologue[..lt]).last().map(|&(i, n)| (i, n.to_string()));
            let (start, callee) = callee.ok_or("a `WF>(` call without a name")?;
            if !wf_functions.contains(&callee) {
                return Err(format!("hands WF on to `{callee}`, which takes no weights-first path"));
            }
            let args_end = closing(&prologue, at + "WF>".len()).ok_or("an unclosed call")?;
            let rest = prologue[args_end + 1..].trim_start();
            let rest = rest.strip_prefix(';').ok_or("a handing-on call is a statement")?.trim_start();
            let rest = rest.strip_prefix("return;").unwrap_or(rest);
            prologue = format!("{} {}", &prologue[..start], rest);
        }
        for (_, name) in identifiers(&prologue) {
            if AFTER_THE_WAIT.contains(&name) {
                return Err(format!("names `{name}` before kernel_entry()"));
            }
            if name == "return" {
                return Err("returns before kernel_entry()".to_string());
            }
        }
        Ok(())
    }

    /// Checks the wait of every kernel of `src` (canon.cuh's rule and its WEIGHTS_FIRST
    /// exception): a kernel's body opens with `kernel_entry();`, or its first statement is a call
    /// `f<.., WEIGHTS_FIRST>(..);` of a weights-first function template, and every such function
    /// passes [`waits_before`]. Returns the number of kernels and the weights-first ones.
    fn check_kernel_waits(src: &str) -> Result<(usize, Vec<String>), String> {
        let code = code_of(src);
        let functions = weights_first_functions(&code);
        let names: Vec<String> = functions.iter().map(|(n, _)| n.clone()).collect();
        for (name, body) in &functions {
            waits_before(body, &names).map_err(|e| format!("weights-first `{name}`: {e}"))?;
        }
        let mut rest = code.as_str();
        let (mut seen, mut weights_first) = (0, Vec::new());
        while let Some(at) = rest.find("extern \"C\" __global__") {
            rest = &rest[at..];
            let name = kernel_name(&rest["extern \"C\" __global__ void".len()..]).to_string();
            let mut depth = 0i32;
            let open = rest
                .char_indices()
                .find(|&(_, c)| {
                    depth += i32::from(c == '(') - i32::from(c == ')');
                    c == '{' && depth == 0
                })
                .map(|(i, _)| i)
                .ok_or(format!("`{name}` has no body"))?;
            let body = rest[open + 1..].trim_start();
            rest = &rest[open + 1..];
            seen += 1;
            if body.starts_with("kernel_entry();") {
                continue;
            }
            // `f<.., WEIGHTS_FIRST>(..);`: f's template arguments end with the flag, and the call
            // is the whole statement.
            let (at, call) = identifiers(body).first().map(|&(i, n)| (i + n.len(), n.to_string())).unwrap_or_default();
            let flag = body.find("WEIGHTS_FIRST>(").filter(|&i| {
                let args = &body[at..i];
                args.starts_with('<') && !args.contains(['(', ';'])
            });
            let opens_weights_first = flag.is_some_and(|i| {
                let args_end = closing(body, i + "WEIGHTS_FIRST>".len());
                args_end.is_some_and(|e| body[e + 1..].trim_start().starts_with(';'))
            });
            if !opens_weights_first || !names.contains(&call) {
                return Err(format!(
                    "`{name}` opens neither with kernel_entry(); nor with a weights-first call `f<.., WEIGHTS_FIRST>(..);`"
                ));
            }
            weights_first.push(name);
        }
        weights_first.sort();
        Ok((seen, weights_first))
    }

    /// The runtime launches kernels with programmatic stream serialization, which schedules a
    /// kernel before the one ahead of it has finished: only a kernel that waits for that kernel
    /// (`kernel_entry()`, canon.cuh) before it touches memory a kernel writes may be launched that
    /// way. Every kernel opens with the wait, or with a weights-first call whose function loads
    /// weights and then waits (canon.cuh's WEIGHTS_FIRST).
    #[test]
    fn every_kernel_opens_with_kernel_entry() {
        let (seen, weights_first) = check_kernel_waits(&cuda_source()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(seen, KERNEL_NAMES.len(), "kernels found by the body scan against KERNEL_NAMES");
        let expected =
            ["add_rmsnorm_f32", "gemv_partials_bf16", "gemv_rows_batch_bf16", "gemv_rows_bf16", "rmsnorm_f32"];
        assert_eq!(weights_first, expected, "the kernels that load weights before their wait");
        let code = code_of(&cuda_source());
        let checked: BTreeSet<String> = weights_first_functions(&code).into_iter().map(|(n, _)| n).collect();
        for f in ["gemv_dispatch", "gemv_tasks", "gemv_rows_batch", "norm_rows"] {
            assert!(checked.contains(f), "`{f}` is not found as a weights-first function: {checked:?}");
        }
    }

    /// A small source of one weights-first kernel and one plain kernel (the shapes of gemv.cu's
    /// and norm.cu's paths), for the negative controls below.
    const WAITS: &str = r#"
template <bool WF>
__device__ __forceinline__ void scale_row(const float* w, const float* x, float* out, int n) {
    const float wv = threadIdx.x < n ? w[threadIdx.x] : 0;  // x and out: after the wait
    static_assert(sizeof(float) == 4, "a string names x, out { and } without effect");
    if constexpr (WF) kernel_entry();
    if (threadIdx.x < n) out[threadIdx.x] = wv * x[threadIdx.x];
}
template <int V, bool WF>
__device__ __forceinline__ void dispatch(const float* w, const float* x, float* out, int n, int vec) {
    if (vec == V) {
        scale_row<WF>(w, x, out, n);
        return;
    }
    if constexpr (WF) {
        kernel_entry();
    }
    if (threadIdx.x == 0) out[0] = x[0];
}
extern "C" __global__ void __launch_bounds__(256) scale_f32(const float* w, const float* x, float* out, int n) {
    dispatch<8, WEIGHTS_FIRST>(w, x, out, n, 8);
}
extern "C" __global__ void copy_f32(const float* x, float* out) {
    kernel_entry();
    out[0] = x[0];
}
"#;

    fn doctored(from: &str, to: &str) -> String {
        assert!(WAITS.contains(from), "the negative control no longer matches its source: {from}");
        WAITS.replacen(from, to, 1)
    }

    #[test]
    fn a_wait_after_a_read_or_off_the_path_fails_the_check() {
        assert_eq!(check_kernel_waits(WAITS), Ok((2, vec!["scale_f32".to_string()])));
        // The wait moved after the read of x and the write of out.
        let late = doctored(
            "    if constexpr (WF) kernel_entry();\n    if (threadIdx.x < n) out[threadIdx.x] = wv * x[threadIdx.x];\n",
            "    if (threadIdx.x < n) out[threadIdx.x] = wv * x[threadIdx.x];\n    if constexpr (WF) kernel_entry();\n",
        );
        let e = check_kernel_waits(&late).unwrap_err();
        assert!(e.contains("scale_row") && e.contains("names `out` before kernel_entry()"), "{e}");
        // The wait on one path only, a return before it, and a wait dropped.
        let conditional = doctored("if constexpr (WF) kernel_entry();", "if (n > 0) kernel_entry();");
        assert!(check_kernel_waits(&conditional).unwrap_err().contains("conditional"));
        let nested =
            doctored("    if constexpr (WF) {\n        kernel_entry();", "    if (vec > 0) {\n        kernel_entry();");
        assert!(check_kernel_waits(&nested).unwrap_err().contains("conditional"));
        let early = doctored("    const float wv", "    if (n == 0) return;\n    const float wv");
        assert!(check_kernel_waits(&early).unwrap_err().contains("returns before kernel_entry()"));
        let dropped = doctored("    if constexpr (WF) {\n        kernel_entry();\n    }\n", "");
        assert!(check_kernel_waits(&dropped).unwrap_err().starts_with("weights-first `dispatch`: never calls"));
        // The flag handed to a function without the path, or a kernel that opens with neither.
        let handed = doctored("scale_row<WF>(w, x, out, n);", "copy_row<WF>(w, x, out, n);");
        assert!(check_kernel_waits(&handed).unwrap_err().contains("`copy_row`, which takes no weights-first path"));
        let plain = doctored("dispatch<8, WEIGHTS_FIRST>(", "dispatch<8, false>(");
        assert!(check_kernel_waits(&plain).unwrap_err().contains("`scale_f32` opens neither"));
        let unknown = doctored("dispatch<8, WEIGHTS_FIRST>(", "launch<8, WEIGHTS_FIRST>(");
        assert!(check_kernel_waits(&unknown).unwrap_err().contains("`scale_f32` opens neither"));
        let opened = doctored("    kernel_entry();\n    out[0] = x[0];", "    out[0] = x[0];\n    kernel_entry();");
        assert!(check_kernel_waits(&opened).unwrap_err().contains("`copy_f32` opens neither"));
    }

    /// The same check on the real kernels, doctored: norm_rows' wait moved after x's lane
    /// pointer, gemv_tasks' wait after its first task, gemv_dispatch's wait dropped.
    #[test]
    fn a_doctored_kernel_source_fails_the_check() {
        let moves: [(&[(&str, &str)], &str); 3] = [
            (
                &[(
                    "    if constexpr (WF) kernel_entry();\n    x = LANE_AT(x, lp, 0, blockIdx.z);\n",
                    "    x = LANE_AT(x, lp, 0, blockIdx.z);\n    if constexpr (WF) kernel_entry();\n",
                )],
                "weights-first `norm_rows`: names `x`",
            ),
            (
                &[
                    ("        kernel_entry();\n        if (t.nvalid > 0) {", "        if (t.nvalid > 0) {"),
                    ("        task += GEMV_WARPS;\n", "        task += GEMV_WARPS;\n        kernel_entry();\n"),
                ],
                "weights-first `gemv_tasks`: names `x`",
            ),
            (
                &[(
                    "    if constexpr (WF) kernel_entry();\n    if constexpr (FMT == FMT_E4M3)",
                    "    if constexpr (FMT == FMT_E4M3)",
                )],
                "weights-first `gemv_dispatch`: never",
            ),
        ];
        for (edits, error) in moves {
            let mut src = cuda_source();
            for (from, to) in edits {
                assert!(src.contains(from), "the doctored text is no longer in the source: {from}");
                src = src.replacen(from, to, 1);
            }
            let e = check_kernel_waits(&src).unwrap_err();
            assert!(e.starts_with(error), "expected `{error}…`, got: {e}");
        }
    }

    #[test]
    fn kernel_names_follow_op_dtype() {
        for name in KERNEL_NAMES {
            let dtype = name.rsplit('_').next().unwrap_or("");
            assert!(["f32", "u32", "bf16", "e4m3", "nvfp4", "w8"].contains(&dtype), "{name} does not end in _<dtype>");
        }
    }

    #[test]
    fn build_digest_covers_the_twins_and_the_program() {
        assert_ne!(build_digest(&[]), source_digest());
        assert_eq!(build_digest(&[]), build_digest(&[]));
        assert!(twin_files().any(|f| f == "src/twins/experts.rs"));
        assert_ne!(build_digest(&[("p.rs", "a")]), build_digest(&[("p.rs", "b")]));
        let mut twins = twin_sources().to_vec();
        let changed = twins[1].1.replacen('a', "b", 1);
        twins[1].1 = &changed;
        assert_ne!(build_digest_of(&cuda_source(), &twins, &[]), build_digest(&[]));
        assert_eq!(concat_sources(SOURCES), cuda_source());
    }

    #[test]
    fn canon_header_comes_first_and_digest_is_stable() {
        assert_eq!(source_files().next(), Some("canon.cuh"));
        let d = source_digest();
        assert_eq!(d.len(), 16);
        assert_eq!(d, source_digest());
        assert!(d.chars().all(|c| c.is_ascii_hexdigit()));
    }

    /// Every f32 constant in the device math is written as a bit pattern, never as a decimal
    /// literal that could parse to a neighbouring float (integer literals are allowed).
    #[test]
    fn no_decimal_float_literals_in_kernels() {
        for (name, text) in SOURCES {
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let bytes = code.as_bytes();
                for (i, w) in bytes.windows(2).enumerate() {
                    let digit_dot = w[0].is_ascii_digit() && w[1] == b'.';
                    let prev_ident = i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
                    assert!(!digit_dot || prev_ident, "{name}:{}: decimal float literal in `{}`", n + 1, line.trim());
                }
            }
        }
    }

    /// The canonical program never calls CUDA math functions, intrinsics that approximate, or an
    /// explicit fused multiply-add.
    #[test]
    fn no_platform_math_in_kernels() {
        let banned = [
            "fmaf(",
            "__fmaf",
            "expf(",
            "__expf",
            "exp2f(",
            "rsqrtf(",
            "__frsqrt",
            "logf(",
            "tanhf(",
            "__fdividef",
            "sqrtf(",
            "powf(",
            "__powf",
        ];
        for (name, text) in SOURCES {
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for b in banned {
                    assert!(!code.contains(b), "{name}:{}: calls {b}", n + 1);
                }
            }
        }
    }
}
