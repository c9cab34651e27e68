//! Just enough lexing of Rust and CUDA C for the tidy rules: comments and literals are blanked
//! out with the line structure kept, so a rule about code never fires on prose or inside a
//! string (this file's own test inputs included), and comments are kept per line for the rules
//! that read them (`// SAFETY:` lines, `# Safety` docs).

/// Which lexical rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// Rust: nested block comments, raw strings, lifetimes.
    Rust,
    /// C / CUDA C: flat block comments, every `'` opens a character literal.
    C,
}

/// A source with its comments and literals separated from its code.
pub struct Masked {
    /// The source with every comment and string / character literal replaced by spaces; newlines
    /// are kept, so byte offsets map to the same lines as in the source.
    pub code: String,
    /// Per line (index 0 = line 1): the text of the comments on that line, without `//`, `/*`.
    pub comments: Vec<String>,
}

impl Masked {
    /// 1-based line of character offset `at` of `code`.
    pub fn line_of(&self, at: usize) -> usize {
        self.code[..at].bytes().filter(|b| *b == b'\n').count() + 1
    }

    /// The comment text of 1-based line `line` (empty when there is none).
    pub fn comment(&self, line: usize) -> &str {
        self.comments.get(line.wrapping_sub(1)).map_or("", String::as_str)
    }

    /// The code of 1-based line `line`, comments and literals blanked.
    pub fn code_line(&self, line: usize) -> &str {
        self.code.split('\n').nth(line.wrapping_sub(1)).unwrap_or("")
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Split `src` into code and comments.
pub fn mask(src: &str, lang: Lang) -> Masked {
    let s: Vec<char> = src.chars().collect();
    let mut code = String::with_capacity(src.len());
    let mut comments = vec![String::new()];
    let n = s.len();
    let mut i = 0;
    while i < n {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            blank(c, &mut code, &mut comments, false);
            blank('/', &mut code, &mut comments, false);
            i += 2;
            while i < n && s[i] != '\n' {
                blank(s[i], &mut code, &mut comments, true);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            blank(c, &mut code, &mut comments, false);
            blank('*', &mut code, &mut comments, false);
            i += 2;
            let mut depth = 1;
            while i < n && depth > 0 {
                if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    blank('*', &mut code, &mut comments, false);
                    blank('/', &mut code, &mut comments, false);
                    i += 2;
                } else if lang == Lang::Rust && s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    blank('/', &mut code, &mut comments, false);
                    blank('*', &mut code, &mut comments, false);
                    i += 2;
                } else {
                    blank(s[i], &mut code, &mut comments, true);
                    i += 1;
                }
            }
        } else if lang == Lang::Rust && c == 'r' && raw_string_start(&s, i) {
            // r"…", r#"…"#, br"…": no escapes, ends at `"` followed by as many `#`.
            let mut j = i + 1;
            let mut hashes = 0;
            while s.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            code.push('r');
            for _ in i + 1..=j {
                blank(' ', &mut code, &mut comments, false);
            }
            i = j + 1;
            while i < n {
                if s[i] == '"' && (1..=hashes).all(|h| s.get(i + h) == Some(&'#')) {
                    for _ in 0..=hashes {
                        blank(' ', &mut code, &mut comments, false);
                    }
                    i += hashes + 1;
                    break;
                }
                blank(s[i], &mut code, &mut comments, false);
                i += 1;
            }
        } else if c == '"' {
            i = skip_quoted(&s, i, '"', &mut code, &mut comments);
        } else if c == '\'' {
            let char_literal = match lang {
                Lang::C => true,
                // 'x' or '\…' is a character; 'a (no closing quote after one char) a lifetime.
                Lang::Rust => next == Some('\\') || s.get(i + 2) == Some(&'\''),
            };
            if char_literal {
                i = skip_quoted(&s, i, '\'', &mut code, &mut comments);
            } else {
                code.push(c);
                i += 1;
            }
        } else {
            code.push(c);
            if c == '\n' {
                comments.push(String::new());
            }
            i += 1;
        }
    }
    Masked { code, comments }
}

/// Whether a Rust raw string starts at `s[i] == 'r'`: `r"`, `r#…"`, not inside an identifier
/// (`br"` counts: `b` is its prefix).
fn raw_string_start(s: &[char], i: usize) -> bool {
    let before_ok = match i {
        0 => true,
        _ if s[i - 1] == 'b' => i < 2 || !is_ident(s[i - 2]),
        _ => !is_ident(s[i - 1]),
    };
    if !before_ok {
        return false;
    }
    let mut j = i + 1;
    while s.get(j) == Some(&'#') {
        j += 1;
    }
    s.get(j) == Some(&'"')
}

/// Emit `c` masked: a space per byte (or the newline itself, which starts the next line's comment
/// entry); a comment's own characters are also kept in `comments` when `keep`.
fn blank(c: char, code: &mut String, comments: &mut Vec<String>, keep: bool) {
    if c == '\n' {
        code.push('\n');
        comments.push(String::new());
    } else {
        code.push_str(&" ".repeat(c.len_utf8()));
        if keep {
            comments.last_mut().expect("one entry per line").push(c);
        }
    }
}

/// Blank a literal from its opening `quote` at `i` to the matching unescaped close; returns the
/// index after it (or the end of the source for an unclosed literal).
fn skip_quoted(s: &[char], mut i: usize, quote: char, code: &mut String, comments: &mut Vec<String>) -> usize {
    blank(quote, code, comments, false);
    i += 1;
    while i < s.len() {
        let c = s[i];
        blank(c, code, comments, false);
        i += 1;
        if c == '\\' {
            if let Some(&e) = s.get(i) {
                blank(e, code, comments, false);
                i += 1;
            }
        } else if c == quote {
            break;
        }
    }
    i
}

/// Every identifier-like word of `code` with its byte offset.
pub fn words(code: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (at, c) in code.char_indices() {
        match (is_ident(c), start) {
            (true, None) => start = Some(at),
            (false, Some(s)) => {
                out.push((s, &code[s..at]));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, &code[s..]));
    }
    out.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_strings_and_chars_are_blanked_and_lines_kept() {
        let src = "let a = \"unsafe { }\"; // unsafe here\nlet b = '\"'; /* unsafe\n */ let c = r#\"unsafe\"#;\nfn f<'a>() {}";
        let m = mask(src, Lang::Rust);
        assert_eq!(m.code.lines().count(), src.lines().count());
        assert!(!m.code.contains("unsafe"), "{}", m.code);
        assert!(m.code.contains("fn f<'a>()"), "a lifetime is code: {}", m.code);
        assert_eq!(m.comment(1).trim(), "unsafe here");
        assert_eq!(m.comment(2).trim(), "unsafe");
        assert_eq!(m.line_of(m.code.find("let c").unwrap()), 3);
    }

    #[test]
    fn c_sources_have_flat_comments_and_char_literals() {
        let m = mask("x = 'a'; /* expf( /* */ y = expf(1); // __expf(\n", Lang::C);
        let calls: Vec<&str> = words(&m.code).map(|(_, w)| w).collect();
        assert_eq!(calls, ["x", "y", "expf", "1"]);
    }
}
