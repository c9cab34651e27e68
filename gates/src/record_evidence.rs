//! The canonical evidence of one record, as the bytes a receipt would carry: the determinism
//! gate (docs/DESIGN.md §4.2) compares these bytes of its two runs — digests, tokens, the
//! top-two logits' bits, the census, the coverage, the call-site counters, the copy checks and
//! the compiler options — so a volatile value that leaks into any of them (a clock, an address,
//! an order that depends on scheduling) fails the run instead of being written as evidence.

use crate::receipt::{coverage_evidence, digests_of};
use memra_receipts::canonical::to_canonical_json;
use memra_runtime::record::Record;
use serde_json::json;

/// Canonical JSON of `v` (a value that cannot be written — a non-finite float — is named in the
/// text, so two such runs still compare).
fn canon<T: serde::Serialize>(v: &T) -> String {
    to_canonical_json(v).unwrap_or_else(|e| format!("<not serializable: {e}>"))
}

/// The record's evidence in sections `(name, canonical JSON)`, in a fixed order.
pub fn sections(r: &Record) -> Vec<(&'static str, String)> {
    let top2: Vec<Vec<String>> = r
        .top2
        .iter()
        .map(|p| p.iter().map(|(a, b)| format!("{:08x}:{:08x}", a.to_bits(), b.to_bits())).collect())
        .collect();
    let faults: Vec<serde_json::Value> = r
        .copy_faults
        .iter()
        .map(|c| json!([c.prompt, c.step, c.layer, c.seam.name(), c.src_rank, c.dst_rank]))
        .collect();
    let coverage = r.coverage.as_ref().map(coverage_evidence);
    vec![
        ("digests", canon(&digests_of(r))),
        ("tokens", canon(&r.tokens)),
        ("top2", canon(&top2)),
        ("census", canon(r.census.counts())),
        ("coverage", canon(&coverage)),
        ("engaged", canon(&r.engaged)),
        ("copies", canon(&json!({ "verified": r.copies_verified, "faults": faults }))),
        ("build_options", canon(&r.build_options)),
    ]
}
