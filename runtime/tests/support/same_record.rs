//! One comparison of two records for the tests that must get the same run two ways (pooled and
//! fresh, on several threads and alone): everything a gate reads, timings aside.

use memra_runtime::evidence::record::Record;

/// `got` equals `want` in digests, tokens, top-2 logits (bit for bit), engagement counters,
/// census, captures and verified copies; `what` names the run in the failure.
pub fn assert_same_record(what: &str, got: &Record, want: &Record) {
    assert_eq!(got.digests, want.digests, "{what}: digests");
    assert_eq!(got.tokens, want.tokens, "{what}: tokens");
    let bits = |r: &Record| r.top2.iter().flatten().map(|(a, b)| (a.to_bits(), b.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(got), bits(want), "{what}: top-2 logits");
    assert_eq!(got.engaged, want.engaged, "{what}: engagement counters");
    assert_eq!(got.census, want.census, "{what}: census");
    assert_eq!(got.captures, want.captures, "{what}: captures");
    assert_eq!((got.copies_verified, &got.copy_faults), (want.copies_verified, &want.copy_faults), "{what}: copies");
}
