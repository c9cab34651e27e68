//! Rendering a diff report: Markdown for a pull-request comment, plain text for a terminal,
//! canonical JSON for machines. Every rendering opens with the same headline.

use std::fmt::Write as _;

use super::{DiffFormat, DiffReport, RunRef, MAX_ROWS_SHOWN};
use crate::error::ReceiptError;
use crate::export::md_cell;
use crate::json;
use crate::schema::Verdict;

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn ns(v: u64) -> String {
    if v >= 1_000_000 {
        format!("{:.2} ms", v as f64 / 1e6)
    } else if v >= 1_000 {
        format!("{:.1} µs", v as f64 / 1e3)
    } else {
        format!("{v} ns")
    }
}

fn times(r: f64) -> String {
    format!("×{r:.2}")
}

impl DiffReport {
    /// Whether anything regressed: exit status 1.
    pub fn regressed(&self) -> bool {
        self.regressed
    }

    /// The report in the requested format.
    pub fn render(&self, format: DiffFormat) -> Result<String, ReceiptError> {
        match format {
            DiffFormat::Markdown => Ok(self.to_markdown()),
            DiffFormat::Text => Ok(self.to_text()),
            DiffFormat::Json => json::to_canonical_json(self),
        }
    }

    /// The one line of counts that opens every rendering.
    pub fn headline(&self) -> String {
        let c = &self.counts;
        let speed = match &self.set_speed {
            Some(s) if s.beyond_noise => format!(
                " · whole set {} ({}{})",
                times(s.factor),
                if s.factor > 1.0 { "slower" } else { "faster" },
                if s.factor > 1.0 && !s.regression { ", not counted on host receipts" } else { "" }
            ),
            _ => String::new(),
        };
        let every_digest = c.paired > 0 && c.digest_changes == c.paired;
        let word = if self.regressed {
            "REGRESSED"
        } else if self.sources_changed && every_digest {
            // Nothing was compared run for run: the new build computes other numbers everywhere.
            "sources changed, every digest moved (not a regression check: review the change itself)"
        } else if self.sources_changed {
            "no regression (sources changed)"
        } else {
            "no regression"
        };
        let twins =
            if self.host_only { " · host receipts only: the twins were not checked against a device" } else { "" };
        let mut doors = if c.doors_stopped_paying > 0 {
            format!(
                " · {} stopped paying{}",
                plural(c.doors_stopped_paying, "door effect", "door effects"),
                if self.noise.whole_set_counts { "" } else { " (not counted on host receipts)" }
            )
        } else {
            String::new()
        };
        if c.doors_lost_evidence > 0 {
            doors += &format!(
                " · {} lost its evidence (too noisy to tell; not counted)",
                plural(c.doors_lost_evidence, "door effect", "door effects")
            );
        }
        format!(
            "{word}: {} paired ({} unchanged) · {} · {} · {} · {} · {} beyond noise (×{:.2} normalised, {}; METRICS.md){speed}{doors} · {} · {}{twins}",
            c.paired,
            c.unchanged,
            plural(c.regressions, "regression", "regressions"),
            plural(c.verdict_changes, "verdict change", "verdict changes"),
            plural(c.digest_changes, "digest change", "digest changes"),
            plural(c.seams_slower + c.seams_faster, "seam move across runs", "seam moves across runs"),
            plural(c.latency_slower + c.latency_faster, "single-run latency move", "single-run latency moves"),
            1.0 + self.noise.threshold,
            self.noise.source,
            plural(c.added, "new run", "new runs"),
            plural(c.missing, "missing run", "missing runs"),
        )
    }

    /// Markdown for a pull-request comment: the headline, then one `<details>` block per non-empty
    /// section (opened when it holds a regression), at most [`MAX_ROWS_SHOWN`] rows each.
    pub fn to_markdown(&self) -> String {
        let mut md = format!("**memra-gates diff — {}**\n", self.headline());
        let section = |md: &mut String, title: &str, n: usize, open: bool, header: &str, rows: Vec<String>| {
            if n == 0 {
                return;
            }
            let _ = write!(
                md,
                "\n<details{}><summary>{title} ({n})</summary>\n\n{header}\n",
                if open { " open" } else { "" }
            );
            for row in rows.iter().take(MAX_ROWS_SHOWN) {
                let _ = writeln!(md, "{row}");
            }
            if rows.len() > MAX_ROWS_SHOWN {
                let _ = writeln!(md, "\n… and {} more", rows.len() - MAX_ROWS_SHOWN);
            }
            md.push_str("\n</details>\n");
        };
        let vc: Vec<String> = self
            .verdict_changes
            .iter()
            .map(|v| {
                let what = v.first_divergence.as_deref().or(v.reason.as_deref()).unwrap_or("");
                format!(
                    "| {}{} → {} | {} | `{}` | {} |",
                    if v.regression { "❌ " } else { "" },
                    v.old,
                    v.new,
                    md_cell(&v.label),
                    v.run_id,
                    md_cell(what)
                )
            })
            .collect();
        section(
            &mut md,
            "Verdict changes",
            vc.len(),
            self.verdict_changes.iter().any(|v| v.regression),
            "| change | run | run_id | first divergence / reason |\n|---|---|---|---|",
            vc,
        );
        let dc: Vec<String> = self
            .digest_changes
            .iter()
            .map(|d| {
                let (cell, change) = match &d.first {
                    Some(f) => (
                        format!("p{} s{} {}", f.prompt, f.step, f.column),
                        format!("{} → {}", f.old.as_deref().unwrap_or("—"), f.new.as_deref().unwrap_or("—")),
                    ),
                    None => ("token tape only".to_string(), String::new()),
                };
                let mut notes = Vec::new();
                if d.token_tape_changed {
                    notes.push("token tape changed".to_string());
                }
                if d.columns_changed {
                    notes.push("columns changed".to_string());
                }
                if let Some(div) = &d.new_first_divergence {
                    notes.push(format!("first divergence {}", div.short()));
                }
                format!("| {} | {} | {} | {} |", md_cell(&d.label), md_cell(&cell), change, md_cell(&notes.join("; ")))
            })
            .collect();
        section(
            &mut md,
            "Digest changes",
            dc.len(),
            false,
            "| run | first differing cell | old → new | notes |\n|---|---|---|---|",
            dc,
        );
        let sc: Vec<String> = self
            .seam_changes
            .iter()
            .map(|s| {
                format!(
                    "| {}{} | L{}.{} | {} |",
                    if s.slower { "❌ " } else { "" },
                    times(s.median_normalized),
                    s.layer,
                    md_cell(&s.seam),
                    s.runs
                )
            })
            .collect();
        section(
            &mut md,
            "Seams beyond noise across runs",
            sc.len(),
            self.seam_changes.iter().any(|s| s.slower),
            "| median normalised change | seam | runs |\n|---:|---|---:|",
            sc,
        );
        let lc: Vec<String> = self
            .latency_changes
            .iter()
            .map(|l| {
                format!(
                    "| {}{} | {} | L{}.{} | {} [{} – {}] | {} [{} – {}] |",
                    if l.regression { "❌ " } else { "" },
                    times(l.normalized),
                    md_cell(&l.label),
                    l.layer,
                    md_cell(&l.seam),
                    ns(l.old_median_ns),
                    ns(l.old_min_ns),
                    ns(l.old_max_ns),
                    ns(l.new_median_ns),
                    ns(l.new_min_ns),
                    ns(l.new_max_ns)
                )
            })
            .collect();
        section(
            &mut md,
            "Latency beyond noise in single runs",
            lc.len(),
            self.latency_changes.iter().any(|l| l.regression),
            "| normalised change | run | seam | old median [min – max] | new median [min – max] |\n|---:|---|---|---|---|",
            lc,
        );
        let door_rows: Vec<String> = self
            .door_changes
            .iter()
            .map(|d| format!("| {}{} |", if d.regression { "❌ " } else { "" }, md_cell(&d.one_line())))
            .collect();
        section(
            &mut md,
            "Door effects that changed (each door against its parent sets, METRICS.md, door effects)",
            door_rows.len(),
            self.door_changes.iter().any(|d| d.regression),
            "| door backend TP: old → new [new interval] |\n|---|",
            door_rows,
        );
        let refs = |v: &[RunRef], bad: fn(Verdict) -> bool| -> Vec<String> {
            v.iter()
                .map(|r| {
                    format!(
                        "| {}{} | {} | `{}` |",
                        if bad(r.verdict) { "❌ " } else { "" },
                        r.verdict,
                        md_cell(&r.label),
                        r.run_id
                    )
                })
                .collect()
        };
        let is_bad_new = |v: Verdict| matches!(v, Verdict::Fail | Verdict::Error);
        section(
            &mut md,
            "New runs",
            self.added.len(),
            self.added.iter().any(|a| is_bad_new(a.verdict)),
            "| verdict | run | run_id |\n|---|---|---|",
            refs(&self.added, is_bad_new),
        );
        section(
            &mut md,
            "Missing runs",
            self.missing.len(),
            true,
            "| old verdict | run | run_id |\n|---|---|---|",
            refs(&self.missing, |_| true),
        );
        if !self.notes.is_empty() {
            md.push('\n');
            for n in &self.notes {
                let _ = writeln!(md, "> note: {}", md_cell(n));
            }
        }
        md
    }

    /// Plain text for a terminal: the headline, then one line per item.
    pub fn to_text(&self) -> String {
        let mut t = format!("memra-gates diff — {}\n", self.headline());
        let cap = |t: &mut String, title: &str, lines: Vec<String>| {
            if lines.is_empty() {
                return;
            }
            let _ = writeln!(t, "\n{title} ({}):", lines.len());
            for l in lines.iter().take(MAX_ROWS_SHOWN) {
                let _ = writeln!(t, "  {l}");
            }
            if lines.len() > MAX_ROWS_SHOWN {
                let _ = writeln!(t, "  … and {} more", lines.len() - MAX_ROWS_SHOWN);
            }
        };
        cap(
            &mut t,
            "verdict changes",
            self.verdict_changes
                .iter()
                .map(|v| {
                    let what = v.first_divergence.as_deref().or(v.reason.as_deref()).unwrap_or("");
                    format!(
                        "{}{} -> {}  {} [{}]  {what}",
                        if v.regression { "REGRESSION " } else { "" },
                        v.old,
                        v.new,
                        v.label,
                        v.run_id
                    )
                })
                .collect(),
        );
        cap(
            &mut t,
            "digest changes",
            self.digest_changes
                .iter()
                .map(|d| {
                    let first = match &d.first {
                        Some(f) => format!(
                            "first at p{} s{} {}: {} -> {}",
                            f.prompt,
                            f.step,
                            f.column,
                            f.old.as_deref().unwrap_or("-"),
                            f.new.as_deref().unwrap_or("-")
                        ),
                        None => "digest table equal".to_string(),
                    };
                    let tape = if d.token_tape_changed { "; token tape changed" } else { "" };
                    let div = d.new_first_divergence.as_ref().map(|x| format!("; first divergence {}", x.short()));
                    format!("{} [{}]  {first}{tape}{}", d.label, d.run_id, div.unwrap_or_default())
                })
                .collect(),
        );
        cap(
            &mut t,
            "seams beyond noise across runs",
            self.seam_changes
                .iter()
                .map(|s| {
                    format!(
                        "{}{}  L{}.{}  median over {} runs",
                        if s.slower { "REGRESSION " } else { "" },
                        times(s.median_normalized),
                        s.layer,
                        s.seam,
                        s.runs
                    )
                })
                .collect(),
        );
        cap(
            &mut t,
            "latency beyond noise in single runs",
            self.latency_changes
                .iter()
                .map(|l| {
                    format!(
                        "{}{}  {} L{}.{}  {} [{} - {}] -> {} [{} - {}]",
                        if l.regression { "REGRESSION " } else { "" },
                        times(l.normalized),
                        l.label,
                        l.layer,
                        l.seam,
                        ns(l.old_median_ns),
                        ns(l.old_min_ns),
                        ns(l.old_max_ns),
                        ns(l.new_median_ns),
                        ns(l.new_min_ns),
                        ns(l.new_max_ns)
                    )
                })
                .collect(),
        );
        cap(
            &mut t,
            "door effects that changed",
            self.door_changes
                .iter()
                .map(|d| format!("{}{}", if d.regression { "REGRESSION " } else { "" }, d.one_line()))
                .collect(),
        );
        cap(
            &mut t,
            "new runs",
            self.added.iter().map(|r| format!("{}  {} [{}]", r.verdict, r.label, r.run_id)).collect(),
        );
        cap(
            &mut t,
            "missing runs",
            self.missing.iter().map(|r| format!("REGRESSION was {}  {} [{}]", r.verdict, r.label, r.run_id)).collect(),
        );
        cap(&mut t, "notes", self.notes.clone());
        t
    }
}
