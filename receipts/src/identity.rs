//! Identities and the hex forms of receipts: the FNV-1a digest every identity uses, the run id
//! (a hash of the canonical JSON of the run's configuration, so it pairs runs across builds and
//! nights), the token-tape digest, and how digests, bit patterns and digest columns are written.

use crate::canonical::to_canonical_json;
use crate::schema::{Evidence, Measurements, Receipt, ReceiptKind, RunConfigEvidence, SCHEMA_VERSION};

impl Receipt {
    /// A receipt of the current schema version whose `run_id` is derived from the evidence.
    pub fn new(kind: ReceiptKind, evidence: Evidence, measurements: Measurements) -> Self {
        Receipt { schema_version: SCHEMA_VERSION, kind, run_id: run_id(&evidence.config), evidence, measurements }
    }
}

/// 64-bit FNV-1a (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`): small, fully specified,
/// the same on every platform and build.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The stable identity of a run: [`fnv1a64`] of the canonical JSON ([`to_canonical_json`], UTF-8,
/// 2-space indent, trailing newline) of `config`, as 16 lowercase hex digits.
///
/// It depends only on the configuration's values (struct field order and `BTreeMap` key order are
/// fixed), so it is the same across builds, platforms and nights; `diff` pairs runs by it.
pub fn run_id(config: &RunConfigEvidence) -> String {
    let text = to_canonical_json(config).expect("a run configuration has no floats to reject");
    digest_hex(fnv1a64(text.as_bytes()))
}

/// The digest of a token tape: [`fnv1a64`] over, for each prompt in order, its token count as u32
/// little-endian followed by each token as u32 little-endian; 16 lowercase hex digits.
pub fn token_tape_digest(tokens: &[Vec<u32>]) -> String {
    let mut bytes = Vec::with_capacity(tokens.iter().map(|t| 4 + 4 * t.len()).sum());
    for tape in tokens {
        let n = u32::try_from(tape.len()).expect("a token tape longer than u32::MAX");
        bytes.extend_from_slice(&n.to_le_bytes());
        for t in tape {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
    }
    digest_hex(fnv1a64(&bytes))
}

/// A 64-bit digest as written in receipts: 16 lowercase hex digits.
pub fn digest_hex(d: u64) -> String {
    format!("{d:016x}")
}

/// An f32 bit pattern as written in receipts: `"0x"` + 8 lowercase hex digits (`1.0` → `"0x3f800000"`).
pub fn f32_bits_hex(x: f32) -> String {
    format!("0x{:08x}", x.to_bits())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_reference_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }
}
