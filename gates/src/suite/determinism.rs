//! The determinism gate (docs/DESIGN.md §4.2): a job's two identical runs must give the same
//! evidence — first the canonical sections of their records (`crate::record_evidence`: digests,
//! tokens, top-two logits, census, coverage, counters, copy checks; named by section), then the
//! receipts themselves: every gate judges the second run too (`evaluate`), both become receipts,
//! and their serialized `evidence` must be the same bytes. A volatile value anywhere a receipt's
//! evidence is written from — a gate's detail, an error budget read from captures — fails here
//! instead of reaching `diff` as a change between nights.

use super::Suite;
use crate::gate::{self, Outcome};
use crate::job::Job;
use crate::receipt::{build_receipt, Evaluation};

/// Characters of context either side of the first differing byte, in a failure's detail.
const CONTEXT: usize = 48;

impl Suite<'_> {
    /// Determinism of `job` from the evaluations of its two runs (each without this gate, each
    /// holding its run's record).
    pub(super) fn determinism(&self, job: &Job, ev: &Evaluation, again: Evaluation) -> Outcome {
        let evidence = |e: &Evaluation| e.record.as_ref().map(crate::record_evidence::sections).unwrap_or_default();
        let sections = gate::determinism(&evidence(ev), &evidence(&again));
        if !sections.passed() {
            return sections;
        }
        let written = |ev: Evaluation| {
            let s = self.runtime;
            let r = build_receipt(
                &self.opts.kernel_digest,
                self.subject.version(),
                job,
                &s.model_evidence,
                &s.battery,
                ev,
                0,
                0.0,
            );
            memra_receipts::json::to_canonical_json(&r.evidence).map_err(|e| e.to_string())
        };
        match (written(ev.clone()), written(again)) {
            (Ok(a), Ok(b)) => receipt_bytes(sections.detail(), &a, &b),
            (Err(e), _) | (_, Err(e)) => Outcome::Fail(format!("a run's receipt evidence cannot be written: {e}")),
        }
    }
}

/// The comparison of two receipts' serialized evidence, `a` and `b`; `records` is the detail of
/// the records' comparison (which passed).
pub(crate) fn receipt_bytes(records: &str, a: &str, b: &str) -> Outcome {
    if a == b {
        // No byte count: who counted the census (`census_witness`) is in the evidence, and the
        // built-in runtime through the protocol must read as it does in process otherwise.
        return Outcome::Pass(format!("{records}; the two receipts' evidence is byte-identical"));
    }
    let at = a.bytes().zip(b.bytes()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    let around = |s: &str| {
        let mut from = at.saturating_sub(CONTEXT).min(s.len());
        while !s.is_char_boundary(from) {
            from -= 1;
        }
        let mut to = (at + CONTEXT).min(s.len());
        while !s.is_char_boundary(to) {
            to += 1;
        }
        s[from..to].split_whitespace().collect::<Vec<_>>().join(" ")
    };
    Outcome::Fail(format!(
        "two runs of the same configuration wrote different receipt evidence (their records agree): first at byte {at}, \
         `{}` against `{}`",
        around(a),
        around(b)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The negative control in small: a gate detail that carries a volatile value.
    #[test]
    fn a_volatile_detail_fails_and_is_quoted() {
        let ev = |ms: &str| format!("{{\"gates\": [{{\"detail\": \"took {ms} ms\", \"gate\": \"identity\"}}]}}");
        assert!(receipt_bytes("r", &ev("3"), &ev("3")).passed());
        let o = receipt_bytes("r", &ev("3"), &ev("4"));
        assert!(!o.passed() && o.detail().contains("took 3 ms") && o.detail().contains("took 4 ms"), "{}", o.detail());
    }
}
