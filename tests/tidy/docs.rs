//! The rules about documents: every citation of the design names `docs/DESIGN.md` and a section
//! it has, every document the repository cites is in it, and every path the main documents name
//! exists — so a file moved without its documentation fails here, not in a reader's hands.

use super::{violation, Violation};

/// Extensions of the files whose text may cite the design.
pub const CITING: [&str; 7] = ["rs", "cu", "cuh", "md", "toml", "sh", "py"];
/// Extensions of code files, where a bare `§N` (no document named) is an error.
const CODE: [&str; 6] = ["rs", "cu", "cuh", "toml", "sh", "py"];
/// The design document.
pub const DESIGN: &str = "docs/DESIGN.md";

// ---------------------------------------------------------------------------------------------
// Rule 5: citations
// ---------------------------------------------------------------------------------------------

/// Files whose citations may spell the document `DESIGN.md` (it resolves to docs/DESIGN.md, and
/// the section must still exist): the kernel sources are digested byte for byte into every
/// receipt's evidence (`kernel_source_digest`), so a comment edit there is a change of evidence.
/// Respell them with the next change to the kernels.
const SPELLING_FROZEN: &str = "kernels/cuda/";

/// The section numbers of the design document: `## 3. Title` → "3", `### 3.4 Title` → "3.4".
pub fn design_sections(design: &str) -> Vec<String> {
    design
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("##")?.trim_start_matches('#');
            let num = rest.split_whitespace().next()?.trim_end_matches('.');
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
        if s[i..i + 6].iter().collect::<String>() != "DESIGN"
            || (i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_'))
        {
            i += 1;
            continue;
        }
        let with_path =
            (i >= 5 && s[i - 5..i].iter().collect::<String>() == "docs/") || rel.starts_with(SPELLING_FROZEN);
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
                if num.is_empty() {
                    out.push(violation(rel, line_at(at), "a `§` without a section number: cite one, e.g. §3.4"));
                } else if !sections.contains(&num) {
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
                        format!(
                            "cites {path}.md, which is not in this repository: cite a document the repository holds"
                        ),
                    ));
                }
            }
            rest = &rest[at + 3..];
        }
    }
    out
}

/// The documents that map the code: every repository path they name in backticks must exist.
pub const MAPS: [&str; 5] = ["ARCHITECTURE.md", "README.md", "docs/DESIGN.md", "METRICS.md", "docs/multi-host.md"];

/// Extensions that make a backticked span with a `/` a file path.
const PATH_EXTS: [&str; 12] = ["rs", "cu", "cuh", "md", "toml", "sh", "py", "json", "txt", "log", "svg", "png"];

/// Every backticked path of `text` that `exists` does not find. A span is a path when it holds a
/// `/`, no spaces, globs or placeholders (`*`, `{`, `<`, `$`, `|`), does not start with `-`, and
/// ends in `/` or in a file name with a known extension (so `P/N` or `DIR/plan` are not paths).
pub fn check_doc_paths(rel: &str, text: &str, exists: &dyn Fn(&str) -> bool) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut offset = 0;
    for (k, span) in text.split('`').enumerate() {
        let at = offset;
        offset += span.len() + 1;
        if k % 2 == 0 || !span.contains('/') || span.starts_with('-') || span.contains("://") {
            continue;
        }
        if span.chars().any(|c| c.is_whitespace() || "*{<$|@=(:".contains(c)) {
            continue;
        }
        let last = span.trim_end_matches('/').rsplit('/').next().unwrap_or(span);
        let is_file = last.rsplit_once('.').is_some_and(|(_, ext)| PATH_EXTS.contains(&ext));
        if !(span.ends_with('/') || is_file) {
            continue;
        }
        if !exists(span.trim_end_matches('/')) {
            let line = text[..at].bytes().filter(|b| *b == b'\n').count() + 1;
            out.push(violation(
                rel,
                line,
                format!("names `{span}`, which does not exist: update the document with the code it maps"),
            ));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Rule 9: the canonical constants are in the design
// ---------------------------------------------------------------------------------------------

/// The files that define the f32 constants of the canonical arithmetic.
pub const CANONICAL_CONSTANTS: [&str; 2] = ["kernels/src/canon.rs", "kernels/src/twins/attention.rs"];

/// The f32 bit patterns `source` defines (`f32::from_bits(0x…)`, `…_BITS: u32 = 0x…`) and the
/// violations: each pattern `design` does not write as `0x` and eight upper-case hex digits. A
/// bit-identical engine is written from the design (docs/DESIGN.md §3.4, "Every operation"), and
/// a constant no battery exposes (exp_c's reduction constants) would drift unnoticed otherwise.
pub fn check_constants_documented(rel: &str, source: &str, design: &str) -> (usize, Vec<Violation>) {
    let mut out = Vec::new();
    let mut found = 0;
    for (n, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let Some(at) =
            code.find("from_bits(0x").map(|i| i + 10).or_else(|| code.find("_BITS: u32 = 0x").map(|i| i + 13))
        else {
            continue;
        };
        let hex: String =
            code[at + 2..].chars().take_while(|c| c.is_ascii_hexdigit() || *c == '_').filter(|c| *c != '_').collect();
        let bits = format!("0x{:0>8}", hex.to_ascii_uppercase());
        found += 1;
        if !design.contains(&bits) {
            out.push(violation(
                rel,
                n + 1,
                format!("defines the canonical constant {bits}, which {DESIGN} does not write: add it to §3.4's operation list"),
            ));
        }
    }
    (found, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn citations_must_name_docs_design_and_an_existing_section() {
        let sections = design_sections("# T\n## 3. Program\n### 3.4 Why\n## 4. Doors\n### 4.1 Registry\n");
        assert_eq!(sections, ["3", "3.4", "4", "4.1"]);
        let ok =
            "// docs/DESIGN.md §3.4, last paragraph; docs/DESIGN.md §3–§4.1 and §4; (docs/DESIGN.md §3.4's rule).\n";
        assert!(
            check_citations("a.rs", "rs", ok, &sections).is_empty(),
            "{:?}",
            check_citations("a.rs", "rs", ok, &sections)
        );
        let missing = check_citations("a.rs", "rs", "//! docs/DESIGN.md §4.1, §9\n", &sections);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].message.contains("§9"), "{}", missing[0]);
        let old = check_citations("a.rs", "rs", "// DESIGN.md §3.4\n// DESIGN §4\n// see DESIGN.md\n", &sections);
        assert_eq!(old.iter().map(|v| v.line).collect::<Vec<_>>(), [1, 2, 3], "{old:?}");
        assert!(check_citations("kernels/cuda/gemv.cu", "cu", "// (DESIGN.md §3.4)\n", &sections).is_empty());
        assert_eq!(check_citations("kernels/cuda/gemv.cu", "cu", "// (DESIGN.md §9)\n", &sections).len(), 1);
        let bare = check_citations("a.rs", "rs", "// (§4)\n", &sections);
        assert_eq!(bare.len(), 1, "{bare:?}");
        assert!(
            check_citations("METRICS.md", "md", "follows §1–2\n", &sections).is_empty(),
            "prose may number its own parts"
        );
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
    fn paths_the_documents_name_must_exist() {
        let exists = |p: &str| ["runtime/src/record.rs", "scripts/gpu", "backend/cuda"].contains(&p);
        let text = "`runtime/src/record.rs` `Seam`; `scripts/gpu/`, `backend/cuda/`,\n`gates/src/gone.rs` and `P/N`, `--process P/N`, `kernels/cuda/*.cu`, `docs/x/`";
        let v = check_doc_paths("ARCHITECTURE.md", text, &exists);
        let named: Vec<(usize, bool)> = v.iter().map(|v| (v.line, v.message.contains("gone.rs"))).collect();
        assert_eq!(named, [(2, true), (2, false)], "{v:?}");
    }

    #[test]
    fn canonical_constants_must_be_written_in_the_design() {
        let source = "const A: f32 = f32::from_bits(0x3FB8_AA3B);\npub const S_BITS: u32 = 0x3DB5_04F3;\n// f32::from_bits(0x1)\nfn f() {}\n";
        let (found, v) = check_constants_documented("k.rs", source, "LOG2E = 0x3FB8AA3B and 0x3DB504F3");
        assert_eq!((found, v.len()), (2, 0), "{v:?}");
        let (found, v) = check_constants_documented("k.rs", source, "LOG2E = 0x3FB8AA3C, scale 0x3DB504F3");
        assert_eq!((found, v.len()), (2, 1), "{v:?}");
        assert!(v[0].message.contains("0x3FB8AA3B") && v[0].line == 1, "{}", v[0]);
    }
}
