//! Receipts in the forms other tools read: JUnit XML for CI dashboards, a CSV of latencies for
//! spreadsheets and plots, and a Markdown table for people. Each is derived from receipts only, so
//! nothing a CI page shows can disagree with the evidence.

use std::fmt::Write as _;

use crate::error::ReceiptError;
use crate::schema::{Receipt, Summary, SummaryRow, Verdict};

/// The `classname` of every JUnit test case.
pub const JUNIT_CLASSNAME: &str = "memra-gates";

/// Header of [`latency_csv`].
pub const LATENCY_CSV_HEADER: [&str; 8] = ["run_id", "label", "layer", "seam", "n", "min_ns", "median_ns", "p90_ns"];

/// JUnit XML with one `<testsuite name=suite>` and one `<testcase>` per receipt, in the given order.
///
/// - name = the run's label, classname = `memra-gates`, time = wall time in seconds
/// - FAIL → `<failure>`, ERROR → `<error>`: the message is the first divergence (or the reason),
///   the body has reason, first divergence and failing gates
/// - SKIP, NOT-APPLICABLE, VOID → `<skipped message="VERDICT: reason"/>`: a VOID run (a door that did
///   not engage) is never reported as a pass
/// - PASS → an empty test case
///
/// Every test case's `<system-out>` names its run_id and verdict.
pub fn junit_xml(suite: &str, receipts: &[Receipt]) -> String {
    let count = |pred: fn(Verdict) -> bool| receipts.iter().filter(|r| pred(r.evidence.verdict)).count();
    let failures = count(|v| v == Verdict::Fail);
    let errors = count(|v| v == Verdict::Error);
    let skipped = count(|v| matches!(v, Verdict::Skip | Verdict::NotApplicable | Verdict::Void));
    let total_s: f64 = receipts.iter().map(|r| r.measurements.wall_ms / 1000.0).sum();
    let mut x = String::new();
    x.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"{total_s:.3}\">",
        xml_escape(suite),
        receipts.len()
    );
    for r in receipts {
        let ev = &r.evidence;
        let _ = writeln!(
            x,
            "  <testcase name=\"{}\" classname=\"{JUNIT_CLASSNAME}\" time=\"{:.3}\">",
            xml_escape(&r.label()),
            r.measurements.wall_ms / 1000.0
        );
        let reason = ev.reason.as_deref().unwrap_or("");
        let divergence = ev.first_divergence.as_ref().map(|d| d.short());
        match ev.verdict {
            Verdict::Fail | Verdict::Error => {
                let tag = if ev.verdict == Verdict::Fail { "failure" } else { "error" };
                let message = divergence.clone().unwrap_or_else(|| reason.to_string());
                let mut body = String::new();
                if !reason.is_empty() {
                    let _ = writeln!(body, "reason: {reason}");
                }
                if let Some(d) = &divergence {
                    let _ = writeln!(body, "first divergence: {d}");
                }
                for g in ev.gates.iter().filter(|g| g.verdict != Verdict::Pass) {
                    let _ = writeln!(body, "gate {} {}: {}", g.gate.as_str(), g.verdict, g.detail);
                }
                let _ = writeln!(
                    x,
                    "    <{tag} message=\"{}\" type=\"{}\">{}</{tag}>",
                    xml_escape(&message),
                    ev.verdict,
                    xml_escape(&body)
                );
            }
            Verdict::Skip | Verdict::NotApplicable | Verdict::Void => {
                let _ = writeln!(x, "    <skipped message=\"{}\"/>", xml_escape(&format!("{}: {reason}", ev.verdict)));
            }
            Verdict::Pass => {}
        }
        let _ = writeln!(x, "    <system-out>run_id {} verdict {}</system-out>", xml_escape(&r.run_id), ev.verdict);
        x.push_str("  </testcase>\n");
    }
    x.push_str("</testsuite>\n");
    x
}

/// Escapes text for XML 1.0 element content and attribute values (double- or single-quoted).
///
/// `& < > " '` become entities; tab, newline and carriage return become character references (so
/// attribute-value normalization keeps them); other characters XML 1.0 forbids (C0 controls,
/// U+FFFE, U+FFFF) cannot be written at all and become `\u{XX}` text.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// CSV of latencies: header [`LATENCY_CSV_HEADER`], one row per receipt × latency entry, in the
/// given order (RFC 4180 quoting by the `csv` crate).
pub fn latency_csv(receipts: &[Receipt]) -> Result<String, ReceiptError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let csv_err = |source| ReceiptError::Csv { source };
    w.write_record(LATENCY_CSV_HEADER).map_err(csv_err)?;
    for r in receipts {
        let label = r.label();
        for l in &r.measurements.latency {
            w.write_record([
                r.run_id.as_str(),
                label.as_str(),
                &l.layer.to_string(),
                l.seam.as_str(),
                &l.n_samples.to_string(),
                &l.min_ns.to_string(),
                &l.median_ns.to_string(),
                &l.p90_ns.to_string(),
            ])
            .map_err(csv_err)?;
        }
    }
    let bytes = w.into_inner().map_err(|e| ReceiptError::Csv { source: e.into_error().into() })?;
    Ok(String::from_utf8(bytes).expect("CSV of UTF-8 fields is UTF-8"))
}

/// Order in which people want to read verdicts: problems first, then passes, then non-runs.
fn display_rank(v: Verdict) -> u8 {
    match v {
        Verdict::Fail => 0,
        Verdict::Error => 1,
        Verdict::Void => 2,
        Verdict::Pass => 3,
        Verdict::Skip => 4,
        Verdict::NotApplicable => 5,
    }
}

/// Escapes a Markdown table cell: `|` and backslash escaped, line breaks and backticks made inert.
pub fn md_cell(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' => out.push_str("\\|"),
            '\\' => out.push_str("\\\\"),
            '`' => out.push('\''),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A Markdown summary of a matrix: one line of counts, then a table with one row per run
/// (failures first), columns verdict, run, first divergence or reason, engaged doors, wall time.
pub fn summary_markdown(summary: &Summary) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "**memra-gates `{}`: {}** — {} run(s): {}\n",
        md_cell(&summary.matrix),
        summary.overall,
        summary.counts.total(),
        summary.counts.one_line()
    );
    md.push_str("| verdict | run | first divergence / reason | engaged doors | wall |\n");
    md.push_str("|---|---|---|---|---:|\n");
    let mut rows: Vec<&SummaryRow> = summary.rows.iter().collect();
    rows.sort_by(|a, b| {
        (display_rank(a.verdict), &a.label, &a.run_id).cmp(&(display_rank(b.verdict), &b.label, &b.run_id))
    });
    for r in rows {
        let what = r.first_divergence.as_deref().or(r.reason.as_deref()).unwrap_or("");
        let doors: Vec<&str> = r.engaged.iter().map(|d| d.strip_prefix("MEMRA_").unwrap_or(d)).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.2} s |",
            r.verdict,
            md_cell(&r.label),
            md_cell(what),
            md_cell(&doors.join(", ")),
            r.wall_ms / 1000.0
        );
    }
    if !summary.excluded.is_empty() {
        let _ = writeln!(
            md,
            "\n{} configuration(s) excluded by the registry's rules (never run):\n",
            summary.excluded.len()
        );
        md.push_str("| configuration | rule |\n|---|---|\n");
        for e in &summary.excluded {
            let _ = writeln!(md, "| {} | {} |", md_cell(&e.label), md_cell(&e.rule));
        }
    }
    md
}
