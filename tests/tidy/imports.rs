//! The import graph of a crate's top-level modules: which module names which through a
//! `crate::…` path (in `use` items and in code). A cycle between modules is a knot — neither can
//! be read, tested or moved without the other — so the crates whose layers are documented in
//! ARCHITECTURE.md must have none. Doc comments and strings are blanked first (`lex`), so a link
//! in prose is not an import.

use super::lex::{mask, Lang};
use super::{violation, Violation};
use std::collections::{BTreeMap, BTreeSet};

/// One edge: `from` names `to`, first at `file:line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub file: String,
    pub line: usize,
}

/// The top-level module of a source file under `src_root` (`gates/src/suite/evaluate.rs` →
/// `suite`); `None` for the crate root (`lib.rs`, `main.rs`).
pub fn top_module(rel: &str, src_root: &str) -> Option<String> {
    let inner = rel.strip_prefix(src_root)?.trim_start_matches('/');
    let first = inner.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_string())
}

/// The first path segment after every `crate::` in `code` (masked), with its 1-based line;
/// `crate::{a, b::c}` names `a` and `b`.
pub fn crate_refs(code: &str) -> Vec<(usize, String)> {
    prefixed_refs(code, "crate::")
}

/// The first path segment after every `prefix` (a path ending in `::`) in `code` that does not
/// continue a longer path, with its 1-based line; `prefix{a, b::c}` names `a` and `b`.
pub fn prefixed_refs(code: &str, prefix: &str) -> Vec<(usize, String)> {
    assert!(prefix.ends_with("::"), "a path prefix ends in `::`: {prefix:?}");
    let mut out = Vec::new();
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut from = 0;
    while let Some(at) = code[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        // `$crate::` (macros), `memra_crate::` and `super::super::` seen from its second `super`
        // are not the paths asked for.
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':') {
            continue;
        }
        let line = code[..start].bytes().filter(|b| *b == b'\n').count() + 1;
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 0 => {
                        let name = ident(&group[i..]);
                        if !name.is_empty() {
                            out.push((line, name));
                        }
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.push((line, name));
            }
        }
    }
    out
}

/// The module graph of `files` (path, text) under `src_root`, a crate's source root: module →
/// module → first edge.
pub fn graph(files: &[(String, String)], src_root: &str) -> BTreeMap<String, BTreeMap<String, Edge>> {
    graph_below(files, src_root, "crate::")
}

/// The graph of the child modules of the module whose folder is `src_root` and whose path from
/// the crate root is `module_path` (`crate::backend::`), as [`graph`] does for a crate: a child
/// names a sibling through `module_path…` or through as many `super::` as it is deep
/// (`backend/host/mod.rs`: `super::cuda`; `backend/host/execute.rs`: `super::super::cuda`).
pub fn graph_below(
    files: &[(String, String)],
    src_root: &str,
    module_path: &str,
) -> BTreeMap<String, BTreeMap<String, Edge>> {
    let files: Vec<&(String, String)> = files.iter().filter(|(rel, _)| !is_unit_test_file(rel)).collect();
    let modules: BTreeSet<String> = files.iter().filter_map(|(rel, _)| top_module(rel, src_root)).collect();
    let mut g: BTreeMap<String, BTreeMap<String, Edge>> =
        modules.iter().map(|m| (m.clone(), BTreeMap::new())).collect();
    for (rel, text) in files {
        let Some(from) = top_module(rel, src_root) else { continue };
        let code = mask(text, Lang::Rust).code;
        let mut refs = prefixed_refs(&code, module_path);
        let depth = depth_below(rel, src_root);
        // The folder's own `mod.rs` (depth 0) names its children by plain paths, not `super::`.
        if module_path != "crate::" && depth > 0 {
            refs.extend(prefixed_refs(&code, &"super::".repeat(depth)));
        }
        for (line, to) in refs {
            if to != from && modules.contains(&to) {
                g.get_mut(&from).expect("every module is a node").entry(to).or_insert(Edge { file: rel.clone(), line });
            }
        }
    }
    g
}

/// A file of unit tests (`tests.rs`, declared `#[cfg(test)] mod tests;`): it may exercise its
/// module through the layers above it, so it is not part of the layering it tests.
fn is_unit_test_file(rel: &str) -> bool {
    rel.ends_with("/tests.rs")
}

/// How many modules deep a file is below `src_root` (`x.rs` and `x/mod.rs` 1, `x/y.rs` 2).
fn depth_below(rel: &str, src_root: &str) -> usize {
    let inner = rel.strip_prefix(src_root).unwrap_or(rel).trim_start_matches('/');
    let parts: Vec<&str> = inner.split('/').collect();
    if parts.last() == Some(&"mod.rs") {
        parts.len() - 1
    } else {
        parts.len()
    }
}

/// Every cycle of the graph, as the strongly connected components of more than one module
/// (Tarjan's algorithm), each reported once with the edges that close it.
pub fn cycles(g: &BTreeMap<String, BTreeMap<String, Edge>>) -> Vec<Violation> {
    struct State<'g> {
        g: &'g BTreeMap<String, BTreeMap<String, Edge>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        next: usize,
        sccs: Vec<Vec<&'g str>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.g[v].keys() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w);
                if w == v {
                    break;
                }
            }
            s.sccs.push(scc);
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        sccs: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    let mut out = Vec::new();
    for mut scc in s.sccs.into_iter().filter(|c| c.len() > 1) {
        scc.sort_unstable();
        let members: BTreeSet<&str> = scc.iter().copied().collect();
        let edges: Vec<String> = scc
            .iter()
            .flat_map(|from| {
                g[*from]
                    .iter()
                    .filter(|(to, _)| members.contains(to.as_str()))
                    .map(move |(to, e)| format!("{from} → {to} ({}:{})", e.file, e.line))
            })
            .collect();
        let first = &g[scc[0]].iter().find(|(to, _)| members.contains(to.as_str())).expect("a cycle has edges").1;
        out.push(violation(
            &first.file,
            first.line,
            format!(
                "modules {} import each other (a cycle: {}); move what they share below both, or pass it in",
                scc.join(", "),
                edges.join("; ")
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect()
    }

    #[test]
    fn a_cycle_between_two_modules_is_found_and_a_chain_is_not() {
        let knot = files(&[
            ("x/src/lib.rs", "//! x\nmod a; mod b; mod c;\n"),
            ("x/src/a.rs", "//! a\nuse crate::b::thing;\n"),
            ("x/src/b/mod.rs", "//! b\nuse crate::{c, a::other};\n"),
            ("x/src/c.rs", "//! c\n// crate::a in a comment is not an import\nconst S: &str = \"crate::a\";\n"),
        ]);
        let v = cycles(&graph(&knot, "x/src"));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].message.contains("modules a, b import each other"), "{v:?}");
        let chain = files(&[
            ("x/src/a.rs", "//! a\nuse crate::b::thing;\n"),
            ("x/src/b.rs", "//! b\nfn f() { crate::c::g(); }\n"),
            ("x/src/c.rs", "//! c\nmacro_rules! m { () => { $crate::a::x } }\n"),
        ]);
        assert!(cycles(&graph(&chain, "x/src")).is_empty());
    }

    #[test]
    fn grouped_and_nested_paths_name_their_first_segment() {
        let refs = crate_refs(
            "use crate::{registry::{Door, Registry}, env, matrix::Configuration};\nlet _ = crate::job::Job;",
        );
        let names: Vec<&str> = refs.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(names, ["registry", "env", "matrix", "job"]);
        assert_eq!(refs[3].0, 2);
    }

    #[test]
    fn a_cycle_between_child_modules_is_found_through_super_and_the_module_path() {
        let knot = files(&[
            ("r/src/backend/mod.rs", "//! b\nmod host; mod op; mod cuda;\n"),
            ("r/src/backend/host/execute.rs", "//! e\nuse super::super::op::Op;\nuse super::Arena;\n"),
            ("r/src/backend/op/mod.rs", "//! o\nuse crate::backend::cuda::x;\n"),
            ("r/src/backend/cuda.rs", "//! c\nuse super::host::y;\n"),
            ("r/src/backend/dist/tests.rs", "//! t\nuse crate::backend::host::z;\n"),
        ]);
        let g = graph_below(&knot, "r/src/backend", "crate::backend::");
        assert!(g["host"].contains_key("op") && !g["host"].contains_key("host"), "{g:?}");
        assert!(!g.contains_key("dist"), "a unit-test file is not a node: {g:?}");
        let v = cycles(&g);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].message.contains("modules cuda, host, op import each other"), "{v:?}");
        let chain = files(&[
            ("r/src/backend/host/mod.rs", "//! h\nuse super::op::Op;\n"),
            ("r/src/backend/op.rs", "//! o\nuse super::Slice; use crate::evidence::x;\n"),
        ]);
        assert!(cycles(&graph_below(&chain, "r/src/backend", "crate::backend::")).is_empty());
    }
}
