//! The terminal summary after a run (docs/DESIGN.md §6): one row per configuration.

use memra_receipts::schema::{engaged_doors, Receipt, Verdict};
use tabled::settings::Style;
use tabled::{Table, Tabled};

#[derive(Tabled)]
struct Row {
    #[tabled(rename = "backend")]
    backend: String,
    #[tabled(rename = "TP")]
    tp: usize,
    #[tabled(rename = "transport")]
    transport: String,
    /// Rows (`b4`) or columns (`t2`) per pass; `-` for one token of one session.
    #[tabled(rename = "pass")]
    pass: String,
    #[tabled(rename = "doors")]
    doors: String,
    #[tabled(rename = "verdict")]
    verdict: String,
    #[tabled(rename = "seams compared")]
    seams: String,
    #[tabled(rename = "first divergence / reason")]
    detail: String,
    #[tabled(rename = "engaged")]
    engaged: String,
    #[tabled(rename = "tape")]
    tape: String,
    #[tabled(rename = "wall")]
    wall: String,
    #[tabled(rename = "model")]
    model: String,
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n.saturating_sub(1)).collect::<String>() + "…"
    }
}

/// One row per receipt: the pass shape (rows or columns), verdict, seams compared, the first divergence (or why it did not run),
/// engaged doors, the token-tape digest, the wall time and the model (a run may gate several).
pub fn summary_table(receipts: &[Receipt]) -> String {
    let rows = receipts.iter().map(|r| {
        let ev = &r.evidence;
        let doors = if ev.config.doors.is_empty() {
            "defaults".to_string()
        } else {
            ev.config
                .doors
                .iter()
                .map(|(k, on)| format!("{}{}", if *on { '+' } else { '-' }, k.trim_start_matches("MEMRA_")))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let compared = ev.digests.rows.len() * ev.digests.columns.len();
        let worst = ev.error_budget.iter().map(|e| e.max_rel).fold(0.0f64, f64::max);
        let detail = match (&ev.first_divergence, ev.verdict) {
            (Some(d), _) => d.short(),
            // A NUMERIC-CLASS run that passed is within its budget, not identical.
            (None, Verdict::Pass) if !ev.error_budget.is_empty() => {
                format!("within budget (max rel {worst:.1e}, {} near-ties)", ev.near_ties.len())
            }
            (None, Verdict::Pass) => "identical".to_string(),
            (None, _) => ev.reason.clone().unwrap_or_default(),
        };
        let mut engaged = engaged_doors(&ev.engaged).into_iter().collect::<Vec<_>>().join(",");
        // Engagement only the subject itself vouches for says so.
        if let Some(w) = &ev.census_witness {
            engaged = format!("{} ({w})", if engaged.is_empty() { "-" } else { &engaged });
        }
        Row {
            backend: ev.config.backend.as_str().to_string(),
            tp: ev.config.tp,
            transport: ev.config.transport.as_str().to_string(),
            pass: Some(ev.config.pass_label()).filter(|p| !p.is_empty()).unwrap_or_else(|| "-".into()),
            doors: clip(&doors, 48),
            verdict: ev.verdict.as_str().to_string(),
            seams: if compared == 0 { "-".into() } else { compared.to_string() },
            detail: clip(&detail, 70),
            engaged: if engaged.is_empty() { "-".into() } else { clip(&engaged, 56) },
            tape: ev.token_tape_digest.chars().take(12).collect(),
            wall: format!("{:.2}s", r.measurements.wall_ms / 1e3),
            model: ev.config.model.preset.clone(),
        }
    });
    let mut t = Table::new(rows);
    t.with(Style::sharp());
    t.to_string()
}
