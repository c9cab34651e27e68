//! The wait rule of programmatic launches, checked on the kernel source (tests only): every kernel
//! opens with `kernel_entry();`, or with a weights-first call whose function template loads
//! weights and then waits before it touches anything a kernel writes (canon.cuh's WEIGHTS_FIRST),
//! or with a settled-first call whose function template opens with the wait that only the
//! runtime's `ahead` argument may skip (canon.cuh's SETTLED_FIRST).
//! A textual check of the C++ — brackets, identifiers, string literals and `//` comments only —
//! which is enough for the shapes the kernels use; the negative controls below plant each way of
//! breaking the rule, in a small source and in the real one.

use super::tests::kernel_name;
use super::{cuda_source, KERNEL_NAMES};
use std::collections::BTreeSet;

/// What a weights-first path may not name before its wait: the activations and outputs of
/// the kernels that take it (and a task's slice of x), read or written only after the wait.
const AFTER_THE_WAIT: [&str; 7] = ["x", "xk", "out", "a", "h", "y", "logits"];

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
    flag_functions(code, "WF")
}

/// The device function templates of `code` whose last template parameter is `bool FLAG`.
fn flag_functions(code: &str, flag: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("template <") {
        let open = from + at + "template ".len();
        let close = closing(code, open).expect("a template header closes");
        from = close;
        let last = code[open + 1..close].rsplit(',').next().unwrap_or("");
        if last.split_whitespace().collect::<Vec<_>>() != ["bool", flag] {
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

/// The opening a settled-first function's body must have: the wait, skipped only where the
/// flag is on and the runtime passed `ahead` (then `&&` the blocks that may run ahead).
const SETTLED_GUARD: &str = "if (!(SF && ahead != 0 && ";

/// Whether a settled-first function's body opens with its wait, skippable only by `ahead`: its
/// first statement is `if (!(SF && ahead != 0 && ..)) kernel_entry();`.
fn opens_with_settled_wait(body: &str) -> Result<(), String> {
    let body = blank_strings(body);
    let first = body.trim_start();
    let end = first.find(';').ok_or("has no statement")?;
    let stmt = &first[..=end];
    if !stmt.starts_with(SETTLED_GUARD) || !stmt.ends_with(")) kernel_entry();") {
        return Err(format!("does not open with `{SETTLED_GUARD}..)) kernel_entry();` but `{stmt}`"));
    }
    Ok(())
}

/// Whether `body` opens with the call `f<.., FLAG>(..);` (f's template arguments end with the
/// flag, and the call is the whole statement); then f's name.
fn opening_flag_call(body: &str, flag: &str) -> Option<String> {
    let (at, call) = identifiers(body).first().map(|&(i, n)| (i + n.len(), n.to_string()))?;
    let pattern = format!("{flag}>(");
    let i = body.find(&pattern).filter(|&i| {
        let args = &body[at..i];
        args.starts_with('<') && !args.contains(['(', ';'])
    })?;
    let args_end = closing(body, i + flag.len() + 1)?;
    body[args_end + 1..].trim_start().starts_with(';').then_some(call)
}

/// The kernels of `src` that open with a weights-first and with a settled-first call.
#[derive(Debug, PartialEq)]
struct Openings {
    weights_first: Vec<String>,
    settled_first: Vec<String>,
}

/// Checks the wait of every kernel of `src` (canon.cuh's rule and its WEIGHTS_FIRST and
/// SETTLED_FIRST exceptions): a kernel's body opens with `kernel_entry();`, or its first statement
/// is a call `f<.., WEIGHTS_FIRST>(..);` of a weights-first function template, every such function
/// passing [`waits_before`], or a call `f<.., SETTLED_FIRST>(..);` of a settled-first one, every
/// such function passing [`opens_with_settled_wait`]. Returns the number of kernels and the
/// kernels of each exception.
fn check_kernel_waits(src: &str) -> Result<(usize, Openings), String> {
    let code = code_of(src);
    let functions = weights_first_functions(&code);
    let names: Vec<String> = functions.iter().map(|(n, _)| n.clone()).collect();
    for (name, body) in &functions {
        waits_before(body, &names).map_err(|e| format!("weights-first `{name}`: {e}"))?;
    }
    let settled = flag_functions(&code, "SF");
    for (name, body) in &settled {
        opens_with_settled_wait(body).map_err(|e| format!("settled-first `{name}` {e}"))?;
    }
    let settled_names: Vec<String> = settled.into_iter().map(|(n, _)| n).collect();
    let mut rest = code.as_str();
    let (mut seen, mut weights_first, mut settled_first) = (0, Vec::new(), Vec::new());
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
        if opening_flag_call(body, "WEIGHTS_FIRST").is_some_and(|f| names.contains(&f)) {
            weights_first.push(name);
        } else if opening_flag_call(body, "SETTLED_FIRST").is_some_and(|f| settled_names.contains(&f)) {
            settled_first.push(name);
        } else {
            return Err(format!(
                "`{name}` opens neither with kernel_entry(); nor with a weights-first call `f<.., WEIGHTS_FIRST>(..);` \
                 nor with a settled-first call `f<.., SETTLED_FIRST>(..);`"
            ));
        }
    }
    weights_first.sort();
    settled_first.sort();
    Ok((seen, Openings { weights_first, settled_first }))
}

/// The runtime launches kernels with programmatic stream serialization, which schedules a
/// kernel before the one ahead of it has finished: only a kernel that waits for that kernel
/// (`kernel_entry()`, canon.cuh) before it touches memory a kernel writes may be launched that
/// way. Every kernel opens with the wait, or with a weights-first call whose function loads
/// weights and then waits (canon.cuh's WEIGHTS_FIRST).
#[test]
fn every_kernel_opens_with_kernel_entry() {
    let (seen, open) = check_kernel_waits(&cuda_source()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(seen, KERNEL_NAMES.len(), "kernels found by the body scan against KERNEL_NAMES");
    let expected = [
        "add_rmsnorm_f32",
        "gemv_partials_bf16",
        "gemv_rows_batch_bf16",
        "gemv_rows_bf16",
        "rmsnorm_f32",
        "router_topk_dev_f32",
        "router_topk_f32",
    ];
    assert_eq!(open.weights_first, expected, "the kernels that load weights before their wait");
    assert_eq!(open.settled_first, ["expert_gate_up_bpl_f32"], "the kernels whose settled blocks may run ahead");
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
template <bool SF>
__device__ __forceinline__ void ahead_row(const float* x, float* out, int ahead) {
    if (!(SF && ahead != 0 && blockIdx.x == 0)) kernel_entry();
    out[blockIdx.x] = x[blockIdx.x];
}
extern "C" __global__ void ahead_f32(const float* x, float* out, int ahead) {
    ahead_row<SETTLED_FIRST>(x, out, ahead);
}
"#;

fn doctored(from: &str, to: &str) -> String {
    assert!(WAITS.contains(from), "the negative control no longer matches its source: {from}");
    WAITS.replacen(from, to, 1)
}

#[test]
fn a_wait_after_a_read_or_off_the_path_fails_the_check() {
    let open = Openings { weights_first: vec!["scale_f32".into()], settled_first: vec!["ahead_f32".into()] };
    assert_eq!(check_kernel_waits(WAITS), Ok((3, open)));
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

#[test]
fn a_settled_first_wait_not_held_by_ahead_fails_the_check() {
    // The wait skippable without the runtime's `ahead`, moved after the read, or dropped.
    let unguarded = doctored("if (!(SF && ahead != 0 && blockIdx.x == 0))", "if (!(SF && blockIdx.x == 0))");
    let e = check_kernel_waits(&unguarded).unwrap_err();
    assert!(e.starts_with("settled-first `ahead_row` does not open with"), "{e}");
    let late = doctored(
        "    if (!(SF && ahead != 0 && blockIdx.x == 0)) kernel_entry();\n    out[blockIdx.x] = x[blockIdx.x];\n",
        "    out[blockIdx.x] = x[blockIdx.x];\n    if (!(SF && ahead != 0 && blockIdx.x == 0)) kernel_entry();\n",
    );
    assert!(check_kernel_waits(&late).unwrap_err().starts_with("settled-first `ahead_row` does not open with"));
    let dropped = doctored("    if (!(SF && ahead != 0 && blockIdx.x == 0)) kernel_entry();\n", "");
    assert!(check_kernel_waits(&dropped).unwrap_err().starts_with("settled-first `ahead_row` does not open with"));
    // A settled-first flag handed to a function without the guard, or the other flag's function.
    let wrong = doctored("ahead_row<SETTLED_FIRST>(", "scale_row<SETTLED_FIRST>(");
    assert!(check_kernel_waits(&wrong).unwrap_err().contains("`ahead_f32` opens neither"));
    let swapped = doctored("ahead_row<SETTLED_FIRST>(", "ahead_row<WEIGHTS_FIRST>(");
    assert!(check_kernel_waits(&swapped).unwrap_err().contains("`ahead_f32` opens neither"));
}

/// The same check on the real kernels, doctored: norm_rows' wait moved after x's lane
/// pointer, gemv_tasks' wait after its first task, gemv_dispatch's wait dropped, the experts'
/// settled-first wait skippable without `ahead`.
#[test]
fn a_doctored_kernel_source_fails_the_check() {
    let moves: [(&[(&str, &str)], &str); 4] = [
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
        (
            &[("if (!(SF && ahead != 0 && first_slot", "if (!(SF && first_slot")],
            "settled-first `expert_gate_up_bpl_entry` does not open",
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
