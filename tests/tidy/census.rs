//! Rule 10: the census is written only by backends (docs/DESIGN.md §4.2). A door is witnessed by
//! the census change it causes, so program code that could make a census, or add a counter to
//! one, could forge the witness of a door whose mechanism fell back. The type does most of it
//! (`Census` has no mutable access; `backend/census.rs`'s `CensusCounter` and `Census::counted`
//! are visible only inside the runtime); this rule closes what the compiler cannot see inside the
//! runtime crate and across the workspace: who names the counter, who calls a `Census`
//! constructor, and what a record's census is assigned from.

use super::lex::{mask, words, Lang};
use super::{violation, Violation};

/// Where the census may be made: the backends count it.
const BACKENDS: &str = "runtime/src/backend/";
/// The one place outside the backends that makes a census: an external subject's tape, its own
/// word (the receipt's `census_witness` names whose).
const REPORTED: &str = "gates/src/subject/protocol/";
/// The definition of the type (its constructors are written there).
const DEFINITION: &str = "runtime/src/evidence/census.rs";
/// The source trees the rule reads (tests build stand-in censuses for the gates on purpose).
const SOURCES: [&str; 6] = ["runtime/src/", "gates/src/", "receipts/src/", "tools/src/", "kernels/src/", "src/"];

/// Every place in Rust file `rel` that writes a census outside the backends: a name of the
/// counter (`CensusCounter`), a `Census::…` constructor outside its homes, and, in the runtime
/// outside `runtime/src/backend/`, a `census` field assigned (`x.census = …`, `census: …`) from
/// anything but a backend's own census (`<backend>.census()`).
pub fn check_census_writers(rel: &str, src: &str) -> Vec<Violation> {
    if !SOURCES.iter().any(|s| rel.starts_with(s)) || rel.starts_with(BACKENDS) || rel == DEFINITION {
        return Vec::new();
    }
    let m = mask(src, Lang::Rust);
    let code = m.code.as_str();
    let mut out = Vec::new();
    let mut prev = "";
    for (at, word) in words(code) {
        let after = &code[at + word.len()..];
        if word == "CensusCounter" {
            out.push(violation(
                rel,
                m.line_of(at),
                "names the census counter (`CensusCounter`): only the backends (runtime/src/backend/) count the \
                 census, where they call their driver or arena; a program that counts can forge a door's witness",
            ));
        } else if word == "Census" && after.trim_start().starts_with("::") {
            let ctor = after.trim_start()[2..].trim_start();
            let name: String = ctor.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !(name == "reported" && rel.starts_with(REPORTED)) {
                out.push(violation(
                    rel,
                    m.line_of(at),
                    format!(
                        "makes a census (`Census::{name}`): a census is made only by a backend's counter, or read \
                         from an external subject's tape in {REPORTED} (`Census::reported`)"
                    ),
                ));
            }
        } else if word == "census" && rel.starts_with("runtime/src/") && !matches!(prev, "pub" | "let" | "mut" | "fn") {
            if let Some(value) = field_write(after) {
                if !is_witness_census(value) {
                    out.push(violation(
                        rel,
                        m.line_of(at),
                        format!(
                            "assigns a census from `{}`: outside runtime/src/backend/ a record's census is only \
                             handed over whole from its backend (`record.census = backend.census()`)",
                            value.trim()
                        ),
                    ));
                }
            }
        }
        prev = word;
    }
    out
}

/// The value of `census = …` or `census: …` (a field write), up to the end of the statement or
/// field; `None` for anything else (`census()`, `census ==`, `census::`, `census.get(…)`).
fn field_write(after: &str) -> Option<&str> {
    let t = after.trim_start();
    let rest = if let Some(r) = t.strip_prefix('=') {
        (!r.starts_with('=')).then_some(r)?
    } else if let Some(r) = t.strip_prefix(':') {
        (!r.starts_with(':')).then_some(r)?
    } else {
        return None;
    };
    let end = rest.find([';', ',', '}', '\n']).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// `<path>.census()`: a backend's census handed over whole (the `Witness` is the only source).
fn is_witness_census(value: &str) -> bool {
    let v = value.trim();
    v.strip_suffix(".census()")
        .is_some_and(|path| !path.is_empty() && path.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_census_writer_outside_the_backends_fails() {
        let program = "runtime/src/program/moe.rs";
        // A fallback that adds the counter its door is witnessed by, three ways.
        let counted = "fn f(c: &mut CensusCounter) { c.peer_store(0, k); }\n";
        assert_eq!(check_census_writers(program, counted).len(), 1, "naming the counter");
        let made = "fn f(r: &mut Record) {\n    r.census = Census::counted(forged);\n}\n";
        let v = check_census_writers(program, made);
        let lines: Vec<usize> = v.iter().map(|v| v.line).collect();
        assert_eq!(lines, [2, 2], "the constructor and the assignment: {v:?}");
        let copied = "fn f(r: &mut Record, other: &Record) { r.census = other.census.clone(); }\n";
        assert_eq!(check_census_writers(program, copied).len(), 1, "another record's census: {copied}");
        let literal = "fn f() -> Record { Record { census: door_on.census.clone(), ..Record::default() } }\n";
        assert_eq!(check_census_writers(program, literal).len(), 1, "a struct literal: {literal}");
        let reported = "fn f(m: Counts) -> Census { Census::reported(m) }\n";
        assert_eq!(check_census_writers("gates/src/suite/census.rs", reported).len(), 1, "outside the protocol");
        assert_eq!(check_census_writers("src/main.rs", counted).len(), 1, "the binary is a source tree too");
    }

    #[test]
    fn the_backends_the_protocol_and_reads_pass() {
        let counted = "fn f(c: &mut CensusCounter) -> Census { c.launch(0, k); Census::counted(m) }\n";
        assert!(check_census_writers("runtime/src/backend/host/backend.rs", counted).is_empty());
        assert!(check_census_writers("runtime/src/backend/census.rs", counted).is_empty());
        let reported = "fn f(r: &mut Record, m: Counts) { r.census = Census::reported(m); }\n";
        assert!(check_census_writers("gates/src/subject/protocol/backend_evidence.rs", reported).is_empty());
        let handover = "fn f(ctx: &mut Ctx) {\n    ctx.record.census = ctx.backend.census();\n}\n";
        assert!(check_census_writers("runtime/src/program/mod.rs", handover).is_empty());
        let reads = "// r.census = forged;\nfn f(r: &Record) -> bool {\n    let s = \"census = x\";\n    \
                     let census: u64 = r.census.get(k).copied().unwrap_or(0);\n    r.census == other.census && census > 0\n}\n";
        assert!(
            check_census_writers("runtime/src/program/mod.rs", reads).is_empty(),
            "{:?}",
            check_census_writers("runtime/src/program/mod.rs", reads)
        );
        let decl = "pub struct Record {\n    pub census: Census,\n}\n";
        assert!(check_census_writers("runtime/src/evidence/record.rs", decl).is_empty());
        assert!(check_census_writers("runtime/tests/edge.rs", counted).is_empty(), "tests are not sources");
    }
}
