//! JUnit XML, latency CSV and Markdown summary.

use memra_receipts::export::{junit_xml, latency_csv, md_cell, summary_markdown, xml_escape, LATENCY_CSV_HEADER};
use memra_receipts::*;

use crate::util::*;

/// A minimal XML 1.0 reader, strict enough to catch unescaped text: elements, double-quoted
/// attributes, the five predefined entities and numeric references; no DTD, comments or CDATA.
#[derive(Debug)]
struct Element {
    name: String,
    attrs: Vec<(String, String)>,
    children: Vec<Element>,
    text: String,
}

impl Element {
    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
    fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }
}

struct XmlReader<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> XmlReader<'a> {
    fn parse(s: &'a str) -> Result<Element, String> {
        for c in s.chars() {
            if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') {
                return Err(format!("character U+{:04X} is not allowed in XML 1.0", c as u32));
            }
        }
        let mut r = XmlReader { s, i: 0 };
        if r.rest().starts_with("<?xml") {
            r.i += r.rest().find("?>").ok_or("unterminated declaration")? + 2;
        }
        r.ws();
        let root = r.element()?;
        r.ws();
        if r.i != s.len() {
            return Err(format!("content after the root element at byte {}", r.i));
        }
        Ok(root)
    }
    fn rest(&self) -> &'a str {
        &self.s[self.i..]
    }
    fn ws(&mut self) {
        while self.rest().starts_with(|c: char| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }
    fn name(&mut self) -> Result<String, String> {
        let n = self.rest().find(|c: char| !(c.is_ascii_alphanumeric() || "-_:.".contains(c))).unwrap_or(0);
        if n == 0 {
            return Err(format!("expected a name at byte {}", self.i));
        }
        let name = self.rest()[..n].to_string();
        self.i += n;
        Ok(name)
    }
    fn expect(&mut self, t: &str) -> Result<(), String> {
        if self.rest().starts_with(t) {
            self.i += t.len();
            Ok(())
        } else {
            Err(format!("expected {t:?} at byte {}: {:?}", self.i, &self.rest()[..self.rest().len().min(30)]))
        }
    }
    fn decode(raw: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = raw;
        while let Some(p) = rest.find('&') {
            out.push_str(&rest[..p]);
            let end = rest[p..].find(';').ok_or("unterminated entity")? + p;
            let ent = &rest[p + 1..end];
            out.push(match ent {
                "amp" => '&',
                "lt" => '<',
                "gt" => '>',
                "quot" => '"',
                "apos" => '\'',
                e if e.starts_with('#') => char::from_u32(e[1..].parse().map_err(|_| format!("bad reference &{e};"))?)
                    .ok_or("bad code point")?,
                e => return Err(format!("unknown entity &{e};")),
            });
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
    fn element(&mut self) -> Result<Element, String> {
        self.expect("<")?;
        let name = self.name()?;
        let mut el = Element { name, attrs: Vec::new(), children: Vec::new(), text: String::new() };
        loop {
            self.ws();
            if self.rest().starts_with("/>") {
                self.i += 2;
                return Ok(el);
            }
            if self.rest().starts_with('>') {
                self.i += 1;
                break;
            }
            let key = self.name()?;
            self.expect("=\"")?;
            let end = self.rest().find('"').ok_or("unterminated attribute")?;
            let raw = &self.rest()[..end];
            if raw.contains('<') {
                return Err(format!("'<' inside attribute {key}"));
            }
            el.attrs.push((key, Self::decode(raw)?));
            self.i += end + 1;
        }
        loop {
            let end = self.rest().find('<').ok_or("unterminated element")?;
            let raw = &self.rest()[..end];
            el.text.push_str(&Self::decode(raw)?);
            self.i += end;
            if self.rest().starts_with("</") {
                self.i += 2;
                let close = self.name()?;
                if close != el.name {
                    return Err(format!("</{close}> closes <{}>", el.name));
                }
                self.expect(">")?;
                return Ok(el);
            }
            el.children.push(self.element()?);
        }
    }
}

#[test]
fn the_xml_reader_itself_refuses_bad_xml() {
    for bad in ["<a>x & y</a>", "<a b=\"<\"/>", "<a><b></a></b>", "<a>\u{1}</a>", "<a/><b/>", "<a>&bogus;</a>"] {
        assert!(XmlReader::parse(bad).is_err(), "{bad:?} accepted");
    }
    assert!(XmlReader::parse("<a b=\"1\"><c/>t&amp;t</a>").is_ok());
}

fn matrix() -> Vec<Receipt> {
    let base = passing(2, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)]);
    vec![
        base.clone(),
        failing(passing(4, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)])),
        errored(
            passing(8, Transport::NativeP2p, &[("MEMRA_OPROJ_DIRECT", true)]),
            "layer 0 o_proj: CUDA_ERROR_OUT_OF_MEMORY",
        ),
        skipped(passing(8, Transport::NativeP2p, &[]), "no peer access between devices 0 and 5"),
        with_verdict(passing(1, Transport::Nccl, &[]), Verdict::NotApplicable, "nccl needs the cuda backend"),
        with_verdict(
            passing(2, Transport::HostBounce, &[("MEMRA_STEP_EP", true)]),
            Verdict::Void,
            "MEMRA_STEP_EP did not engage",
        ),
    ]
}

#[test]
fn junit_has_one_case_per_run_and_never_shows_void_as_pass() {
    let receipts = matrix();
    let xml = junit_xml("memra-gates nightly", &receipts);
    let suite = XmlReader::parse(&xml).unwrap_or_else(|e| panic!("{e}\n{xml}"));
    assert_eq!(suite.name, "testsuite");
    assert_eq!(suite.attr("name"), Some("memra-gates nightly"));
    assert_eq!(suite.attr("tests"), Some("6"));
    assert_eq!(suite.attr("failures"), Some("1"));
    assert_eq!(suite.attr("errors"), Some("1"));
    assert_eq!(suite.attr("skipped"), Some("3"));
    assert_eq!(suite.children.len(), 6);
    for (case, r) in suite.children.iter().zip(&receipts) {
        assert_eq!(case.name, "testcase");
        assert_eq!(case.attr("name"), Some(r.label().as_str()));
        assert_eq!(case.attr("classname"), Some("memra-gates"));
        assert!(case.child("system-out").unwrap().text.contains(&r.run_id));
        let has = |n: &str| case.child(n).is_some();
        match r.evidence.verdict {
            Verdict::Pass => assert!(!has("failure") && !has("error") && !has("skipped")),
            Verdict::Fail => {
                let f = case.child("failure").unwrap();
                assert_eq!(f.attr("message"), Some("L1.o_join p1 s2 r1 [4093] 0x3f800000→0x3f800003 (3 ulp)"));
                assert!(f.text.contains("gate identity FAIL"), "{}", f.text);
            }
            Verdict::Error => {
                let e = case.child("error").unwrap();
                assert_eq!(e.attr("message"), Some("layer 0 o_proj: CUDA_ERROR_OUT_OF_MEMORY"));
            }
            v => {
                let s = case.child("skipped").unwrap_or_else(|| panic!("{v} must be skipped, not passed"));
                let msg = s.attr("message").unwrap();
                assert!(
                    msg.starts_with(&format!("{v}: ")) && msg.ends_with(r.evidence.reason.as_deref().unwrap()),
                    "{msg}"
                );
            }
        }
    }
    assert_eq!(suite.children[0].attr("time"), Some("1.234"));
}

#[test]
fn xml_escaping_covers_markup_quotes_whitespace_and_forbidden_characters() {
    assert_eq!(xml_escape(r#"a<b>&"c"'d'"#), "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&apos;");
    assert_eq!(xml_escape("l1\nl2\tx\r"), "l1&#10;l2&#9;x&#13;");
    assert_eq!(xml_escape("bell\u{7}end\u{FFFF}"), "bell\\u{7}end\\u{ffff}");
    assert_eq!(xml_escape("µs → ✓"), "µs → ✓");

    let nasty = "</failure><pwn a=\"1\"> & 'quotes'\nsecond line\u{1b}[31m";
    let mut r = with_verdict(passing(1, Transport::HostBounce, &[]), Verdict::Error, nasty);
    r.evidence.config.subject = "<engine & co>".to_string();
    r = edit(r, |_| {});
    let xml = junit_xml("suite \"quoted\" <&>", &[r.clone()]);
    let suite = XmlReader::parse(&xml).unwrap_or_else(|e| panic!("{e}\n{xml}"));
    assert_eq!(suite.attr("name"), Some("suite \"quoted\" <&>"));
    let case = &suite.children[0];
    assert_eq!(case.attr("name"), Some(r.label().as_str()));
    let err = case.child("error").unwrap();
    // Round trip through escaping, except the ESC control character, which XML cannot hold.
    assert_eq!(err.attr("message").unwrap(), nasty.replace('\u{1b}', "\\u{1b}"));
}

#[test]
fn latency_csv_has_the_documented_columns_and_one_row_per_entry() {
    let mut receipts = matrix();
    receipts[0].evidence.config.subject = "engine, \"quoted\"".to_string();
    receipts[0] = edit(receipts[0].clone(), |_| {});
    let text = latency_csv(&receipts).unwrap();
    assert!(text.starts_with("run_id,label,layer,seam,n,min_ns,median_ns,p90_ns\n"), "{text}");
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    assert_eq!(rd.headers().unwrap().iter().collect::<Vec<_>>(), LATENCY_CSV_HEADER);
    let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    let expected: usize = receipts.iter().map(|r| r.measurements.latency.len()).sum();
    assert!(expected > 0);
    assert_eq!(rows.len(), expected);
    let first = &receipts[0];
    let l = &first.measurements.latency[0];
    assert_eq!(
        rows[0].iter().collect::<Vec<_>>(),
        [
            first.run_id.as_str(),
            first.label().as_str(),
            "0",
            "attn_norm",
            &l.n_samples.to_string(),
            &l.min_ns.to_string(),
            &l.median_ns.to_string(),
            &l.p90_ns.to_string(),
        ]
    );
    assert!(first.label().contains(',') && first.label().contains('"'));
}

#[test]
fn markdown_summary_leads_with_counts_and_lists_failures_first() {
    let mut receipts = matrix();
    receipts[0].evidence.config.subject = "pipe|engine".to_string();
    receipts[0] = edit(receipts[0].clone(), |_| {});
    let s = Summary::from_receipts("nightly", &receipts);
    let md = summary_markdown(&s);
    let lines: Vec<&str> = md.lines().collect();
    assert_eq!(
        lines[0],
        "**memra-gates `nightly`: FAIL** — 6 run(s): 1 PASS · 1 FAIL · 1 VOID · 1 SKIP · 1 NOT-APPLICABLE · 1 ERROR"
    );
    let table: Vec<&str> =
        lines.iter().copied().filter(|l| l.starts_with("| ") && !l.starts_with("| verdict")).collect();
    assert_eq!(table.len(), 6);
    let order: Vec<&str> = table.iter().map(|l| l.split(" | ").next().unwrap().trim_start_matches("| ")).collect();
    assert_eq!(order, ["FAIL", "ERROR", "VOID", "PASS", "SKIP", "NOT-APPLICABLE"]);
    assert!(table[0].contains("L1.o_join p1 s2"), "{}", table[0]);
    assert!(md.contains("pipe\\|engine"), "pipes in cells are escaped:\n{md}");
    // Every row has exactly the five cells of the header.
    for l in &table {
        assert_eq!(l.replace("\\|", "").matches('|').count(), 6, "{l}");
    }
    assert_eq!(md_cell("a|b\nc"), "a\\|b c");
}
