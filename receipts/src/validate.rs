//! The rules of the receipt format that its serde shape cannot express; the reader and the
//! writer both check them, so the writer never produces a receipt its own reader would refuse.

use std::collections::BTreeSet;
use std::fmt;

use crate::error::Violation;
use crate::identity::{run_id, token_tape_digest};
use crate::schema::{
    overall_verdict, seam_column, DivergenceAt, Gate, Receipt, ReceiptKind, Summary, Verdict, VerdictCounts,
    READ_VERSIONS, SUMMARY_SCHEMA_VERSION, TP_SIZES,
};

/// Whether `s` is a non-empty string of lowercase hex digits.
pub fn is_lower_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn violation(field: impl Into<String>, value: impl fmt::Debug, rule: impl Into<String>) -> Violation {
    let mut value = format!("{value:?}");
    if value.len() > 80 {
        let cut = (0..=77).rev().find(|i| value.is_char_boundary(*i)).unwrap_or(0);
        value.truncate(cut);
        value.push('…');
    }
    Violation { field: field.into(), value, rule: rule.into() }
}

fn check_hex(field: &str, s: &str) -> Result<(), Violation> {
    if is_lower_hex(s) && s.len().is_multiple_of(2) {
        Ok(())
    } else {
        Err(violation(field, s, "must be a non-empty, even number of lowercase hex digits"))
    }
}

fn check_hex16(field: &str, s: &str) -> Result<(), Violation> {
    if s.len() == 16 && is_lower_hex(s) {
        Ok(())
    } else {
        Err(violation(field, s, "must be exactly 16 lowercase hex digits"))
    }
}

fn check_bits(field: &str, s: &str) -> Result<(), Violation> {
    match s.strip_prefix("0x") {
        Some(h) if h.len() == 8 && is_lower_hex(h) => Ok(()),
        _ => Err(violation(field, s, "must be \"0x\" followed by 8 lowercase hex digits (an f32's bits)")),
    }
}

impl Receipt {
    /// Checks the rules the serde shape cannot express; the reader and the writer both call it.
    ///
    /// - `schema_version` is one of [`READ_VERSIONS`]; a version 1 receipt has none of version 2's
    ///   fields (census, coverage, claims, planted, the gates copies / coverage / probe);
    ///   `run_id` equals [`run_id`] of the config
    /// - `tp` is in [`TP_SIZES`]; digests and bit patterns are hex of the documented widths
    /// - `token_tape_digest` equals [`token_tape_digest`] of `tokens`
    /// - digest columns are unique; every row has one digest per column; rows strictly sorted by
    ///   (prompt, step)
    /// - each gate appears at most once; VOID, SKIP, NOT-APPLICABLE and ERROR carry a non-empty reason
    /// - `evidence.performance` is present exactly when `kind` is `"performance"`
    /// - each latency entry has `n_samples ≥ 1` and `min ≤ median ≤ p90 ≤ max`; (layer, seam) unique
    /// - a seam divergence names its element (with bits and ulp) exactly when `reproduced`, and
    ///   no source rank; a copy divergence names both ranks and no element
    /// - `claims` are sorted and unique
    /// - `config.batch` / `config.columns`, when present, are 2, 4 or 8 and not both; a
    ///   divergence names a lane only in such a run, on its axis, below its lane count
    pub fn validate(&self) -> Result<(), Violation> {
        if !READ_VERSIONS.contains(&self.schema_version) {
            return Err(violation("schema_version", self.schema_version, format!("must be one of {READ_VERSIONS:?}")));
        }
        let ev = &self.evidence;
        if self.schema_version == 1 {
            let v2_gate = ev.gates.iter().find(|g| matches!(g.gate, Gate::Copies | Gate::Coverage | Gate::Probe));
            if !ev.census.is_empty() || !ev.coverage.is_empty() || !ev.claims.is_empty() || ev.planted.is_some() {
                return Err(violation(
                    "schema_version",
                    1,
                    "a version 1 receipt has no census, coverage, claims or planted",
                ));
            }
            if let Some(g) = v2_gate {
                return Err(violation(
                    "evidence.gates",
                    g.gate.as_str(),
                    "a gate of schema version 2 in a version 1 receipt",
                ));
            }
        }
        if ev.claims.windows(2).any(|w| w[0] >= w[1]) {
            return Err(violation("evidence.claims", &ev.claims, "claims are sorted and unique"));
        }
        let cfg = &ev.config;
        let expected = run_id(cfg);
        if self.run_id != expected {
            return Err(violation(
                "run_id",
                &self.run_id,
                format!("must equal run_id(evidence.config) = {expected:?} (FNV-1a-64 of its canonical JSON)"),
            ));
        }
        if !TP_SIZES.contains(&cfg.tp) {
            return Err(violation("evidence.config.tp", cfg.tp, "must be 1, 2, 4 or 8"));
        }
        for (field, n) in [("evidence.config.batch", cfg.batch), ("evidence.config.columns", cfg.columns)] {
            if let Some(n) = n.filter(|n| ![2, 4, 8].contains(n)) {
                return Err(violation(field, n, "is 2, 4 or 8 when present (absent: one per pass)"));
            }
        }
        if cfg.batch.is_some() && cfg.columns.is_some() {
            return Err(violation(
                "evidence.config.columns",
                cfg.columns,
                "a pass is rows (batch) or columns, not both: at most one of them is present",
            ));
        }
        check_hex("evidence.config.model.digest", &cfg.model.digest)?;
        check_hex("evidence.config.battery_digest", &cfg.battery_digest)?;
        check_hex("evidence.build.kernel_source_digest", &ev.build.kernel_source_digest)?;
        if ev.build.subject_version.as_deref().is_some_and(str::is_empty) {
            return Err(violation(
                "evidence.build.subject_version",
                "",
                "names the subject's version when present (leave the field out when unknown)",
            ));
        }
        if let Some(w) = ev.census_witness.as_deref().filter(|w| !crate::schema::census_witness_ok(w)) {
            return Err(violation(
                "evidence.census_witness",
                w,
                "is `self-reported` or `outside:<witness>` when present (absent: counted by memra-gates' own backend)",
            ));
        }
        if ev.verdict.requires_reason() && ev.reason.as_deref().is_none_or(str::is_empty) {
            return Err(violation(
                "evidence.reason",
                &ev.reason,
                format!("a {} verdict must say why (non-empty reason)", ev.verdict),
            ));
        }
        let mut seen_gates = BTreeSet::new();
        for (i, g) in ev.gates.iter().enumerate() {
            if !seen_gates.insert(g.gate) {
                return Err(violation(format!("evidence.gates[{i}].gate"), g.gate.as_str(), "each gate appears once"));
            }
        }
        if let Some(d) = &ev.first_divergence {
            let located = [d.element.is_some(), d.oracle_bits.is_some(), d.observed_bits.is_some(), d.ulp.is_some()];
            // A copy is located at the copy: no element, whether or not its fault reproduced.
            let want = d.reproduced && d.at == DivergenceAt::Seam;
            if located.iter().any(|l| *l != want) {
                return Err(violation(
                    "evidence.first_divergence",
                    (d.reproduced, located),
                    "element, oracle_bits, observed_bits and ulp are present exactly when a seam divergence was reproduced (never for a copy)",
                ));
            }
            if let (Some(o), Some(b)) = (&d.oracle_bits, &d.observed_bits) {
                check_bits("evidence.first_divergence.oracle_bits", o)?;
                check_bits("evidence.first_divergence.observed_bits", b)?;
            }
            let copy_ok = match d.at {
                DivergenceAt::Copy => d.src_rank.is_some() && d.rank.is_some(),
                DivergenceAt::Seam => d.src_rank.is_none(),
            };
            if !copy_ok {
                return Err(violation(
                    "evidence.first_divergence.at",
                    (d.at, d.src_rank, d.rank),
                    "a copy divergence names its source and destination ranks (and no element); a seam divergence no source rank",
                ));
            }
            if let Some(l) = d.lane {
                let lanes = match l.axis {
                    crate::schema::LaneAxis::Row => cfg.batch,
                    crate::schema::LaneAxis::Column => cfg.columns,
                };
                if lanes.is_none_or(|n| l.index >= n) {
                    return Err(violation(
                        "evidence.first_divergence.lane",
                        (l.axis, l.index, cfg.batch, cfg.columns),
                        "names a row only in a run with config.batch, a column only with config.columns, below that count",
                    ));
                }
            }
        }
        let mut columns = BTreeSet::new();
        for (i, c) in ev.digests.columns.iter().enumerate() {
            if c.is_empty() || !columns.insert(c.as_str()) {
                return Err(violation(
                    format!("evidence.digests.columns[{i}]"),
                    c,
                    "column names are non-empty and unique",
                ));
            }
        }
        let mut prev: Option<(usize, usize)> = None;
        for (i, row) in ev.digests.rows.iter().enumerate() {
            let key = (row.prompt, row.step);
            if prev.is_some_and(|p| p >= key) {
                return Err(violation(
                    format!("evidence.digests.rows[{i}]"),
                    key,
                    "rows are strictly sorted by (prompt, step)",
                ));
            }
            prev = Some(key);
            if row.digests.len() != ev.digests.columns.len() {
                return Err(violation(
                    format!("evidence.digests.rows[{i}].digests"),
                    row.digests.len(),
                    format!("must hold one digest per column ({})", ev.digests.columns.len()),
                ));
            }
            for (j, d) in row.digests.iter().enumerate() {
                check_hex16(&format!("evidence.digests.rows[{i}].digests[{j}]"), d)?;
            }
        }
        check_hex16("evidence.token_tape_digest", &ev.token_tape_digest)?;
        let tape = token_tape_digest(&ev.tokens);
        if ev.token_tape_digest != tape {
            return Err(violation(
                "evidence.token_tape_digest",
                &ev.token_tape_digest,
                format!("must equal token_tape_digest(evidence.tokens) = {tape:?}"),
            ));
        }
        match (self.kind, &ev.performance) {
            (ReceiptKind::Performance, None) => {
                return Err(violation("evidence.performance", "null", "a performance receipt carries its claim"))
            }
            (ReceiptKind::Run, Some(_)) => {
                return Err(violation("evidence.performance", "{…}", "only performance receipts carry a claim"))
            }
            _ => {}
        }
        let mut seen_lat = BTreeSet::new();
        for (i, l) in self.measurements.latency.iter().enumerate() {
            let field = format!("measurements.latency[{i}]");
            if !seen_lat.insert((l.layer, l.seam.as_str())) {
                return Err(violation(field, seam_column(l.layer, &l.seam), "each layer × seam appears once"));
            }
            if l.n_samples == 0 || !(l.min_ns <= l.median_ns && l.median_ns <= l.p90_ns && l.p90_ns <= l.max_ns) {
                return Err(violation(
                    field,
                    (l.n_samples, l.min_ns, l.median_ns, l.p90_ns, l.max_ns),
                    "needs n_samples ≥ 1 and min_ns ≤ median_ns ≤ p90_ns ≤ max_ns",
                ));
            }
        }
        Ok(())
    }
}

impl Summary {
    /// Checks what the serde shape cannot: version, counts and overall verdict agree with the rows,
    /// rows sorted by unique `run_id`s of 16 hex digits.
    pub fn validate(&self) -> Result<(), Violation> {
        if self.schema_version != SUMMARY_SCHEMA_VERSION {
            return Err(violation("schema_version", self.schema_version, format!("must be {SUMMARY_SCHEMA_VERSION}")));
        }
        for (i, w) in self.rows.windows(2).enumerate() {
            if w[0].run_id >= w[1].run_id {
                return Err(violation(
                    format!("rows[{}].run_id", i + 1),
                    &w[1].run_id,
                    "rows are sorted by unique run_id",
                ));
            }
        }
        for (i, r) in self.rows.iter().enumerate() {
            check_hex16(&format!("rows[{i}].run_id"), &r.run_id)?;
        }
        let verdicts: Vec<Verdict> = self.rows.iter().map(|r| r.verdict).collect();
        let counts = VerdictCounts::tally(verdicts.iter().copied());
        if counts != self.counts {
            return Err(violation("counts", self.counts, format!("must match the rows: {counts:?}")));
        }
        let overall = overall_verdict(&verdicts);
        if overall != self.overall {
            return Err(violation("overall", self.overall.as_str(), format!("must be {overall} for these rows")));
        }
        Ok(())
    }
}
