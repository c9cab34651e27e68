//! Written once over the trait: the byte-integrity probe of a transport (every ordered rank pair,
//! a ladder of sizes, a hashed pattern that a shifted, truncated or stale copy cannot match) and
//! the bandwidth of a same-rank copy timed with the backend's own marks.

use super::{Backend, BufId, ProbeResult, Slice, Transfer};
use crate::config::Transport;
use crate::Result;

/// The probe's ladder of sizes (docs/DESIGN.md §3.5): from one 4-byte word up, odd word counts
/// (3, 9, 257, 4097 words) that no power-of-two fast path covers, then 16 KiB to 64 MiB. The
/// gates add the model's real copy payloads (`program::payloads::copy_payload_bytes`).
pub const PROBE_SIZES_BYTES: [usize; 9] = [4, 12, 36, 1028, 16388, 16 << 10, 64 << 10, 1 << 20, 64 << 20];

/// Word `i` of the probe pattern for (src, dst): hashed so a shifted, truncated or stale copy
/// cannot match by accident.
pub fn probe_word(src: usize, dst: usize, i: usize) -> u32 {
    memra_kernels::twins::digest::splitmix64(((src as u64) << 56) ^ ((dst as u64) << 48) ^ i as u64) as u32
}

/// The byte-integrity probe, written once over the trait: for every ordered pair and size, fill
/// the source with the hashed pattern, poison the destination, copy over `transport`, read the
/// destination back and count every wrong word.
pub fn run_probe<B: Backend + ?Sized>(
    b: &mut B,
    transport: Transport,
    sizes_bytes: &[usize],
) -> Result<Vec<ProbeResult>> {
    probe_ladder(
        b,
        sizes_bytes,
        |_, _, _| None,
        |b, (src, s), (dst, d)| b.copy(Transfer::new(transport, (src, s), (dst, d))),
    )
}

/// The probe's loop for any backend: `unavailable(b, src, dst)` names why a pair cannot be copied
/// (reported, not copied); `copy` moves one slice between two ranks over the transport probed.
pub(crate) fn probe_ladder<B: Backend + ?Sized>(
    b: &mut B,
    sizes_bytes: &[usize],
    unavailable: impl Fn(&mut B, usize, usize) -> Option<String>,
    copy: impl Fn(&mut B, (usize, Slice), (usize, Slice)) -> Result<()>,
) -> Result<Vec<ProbeResult>> {
    let mut out = Vec::new();
    let n = b.ranks();
    for &bytes in sizes_bytes {
        let mut rung = Rung::new(bytes / 4);
        let bufs: Vec<BufId> = (0..n).map(|r| b.alloc(r, rung.words)).collect::<Result<_>>()?;
        for src in 0..n {
            for dst in (0..n).filter(|d| *d != src) {
                if let Some(reason) = unavailable(b, src, dst) {
                    out.push(ProbeResult { src, dst, bytes, bad_words: 0, no_peer_access: Some(reason) });
                    continue;
                }
                let (s, d) = (Slice::new(bufs[src], 0, rung.words), Slice::new(bufs[dst], 0, rung.words));
                b.write(src, s, rung.pattern(src, dst))?;
                b.write(dst, d, &rung.poison)?;
                copy(b, (src, s), (dst, d))?;
                let bad_words = rung.bad_words(src, dst, &b.read(dst, d)?);
                out.push(ProbeResult { src, dst, bytes, bad_words, no_peer_access: None });
            }
        }
    }
    Ok(out)
}

/// The host side of one rung of the ladder: the poisoned destination's words, made once, and the
/// pattern of the pair being probed, refilled in place. The top rung is 16 M words for each of
/// TP8's 56 pairs, so the pattern is made and checked on every core, in chunks (the words and
/// the count are the same in any split).
struct Rung {
    words: usize,
    pattern: Vec<f32>,
    poison: Vec<f32>,
}

/// Words per chunk of the parallel fill and check (smaller rungs are one chunk).
const RUNG_CHUNK: usize = 1 << 16;

impl Rung {
    fn new(words: usize) -> Rung {
        const POISON: u32 = 0xDEAD_BEEF;
        Rung { words, pattern: vec![0.0; words], poison: vec![f32::from_bits(POISON); words] }
    }

    /// The pattern of (src, dst), word i = `probe_word(src, dst, i)`.
    fn pattern(&mut self, src: usize, dst: usize) -> &[f32] {
        use rayon::prelude::*;
        self.pattern.par_chunks_mut(RUNG_CHUNK).enumerate().for_each(|(c, chunk)| {
            for (j, w) in chunk.iter_mut().enumerate() {
                *w = f32::from_bits(probe_word(src, dst, c * RUNG_CHUNK + j));
            }
        });
        &self.pattern
    }

    /// Words of `got` that are not (src, dst)'s pattern (a length mismatch counts every missing
    /// or extra word).
    fn bad_words(&self, src: usize, dst: usize, got: &[f32]) -> usize {
        use rayon::prelude::*;
        let wrong: usize = got
            .par_chunks(RUNG_CHUNK)
            .enumerate()
            .map(|(c, chunk)| {
                let base = c * RUNG_CHUNK;
                chunk.iter().enumerate().filter(|(j, v)| v.to_bits() != probe_word(src, dst, base + j)).count()
            })
            .sum();
        wrong + got.len().abs_diff(self.words)
    }
}

/// Median bandwidth (bytes read + written per second) of a same-rank copy of `bytes` on rank 0,
/// timed with the backend's own marks over `reps` repetitions after one warm-up copy.
pub fn measure_copy_bandwidth<B: Backend + ?Sized>(b: &mut B, bytes: usize, reps: usize) -> Result<f64> {
    let n = bytes / 4;
    let (src, dst) = (Slice::new(b.alloc(0, n)?, 0, n), Slice::new(b.alloc(0, n)?, 0, n));
    b.copy(Transfer::new(Transport::NativeP2p, (0, src), (0, dst)))?;
    b.collect()?;
    for _ in 0..reps {
        b.mark()?;
        b.copy(Transfer::new(Transport::NativeP2p, (0, src), (0, dst)))?;
        b.mark()?;
    }
    let marks = b.collect()?.marks_ns.swap_remove(0);
    let mut ns: Vec<u64> = marks.chunks_exact(2).map(|m| m[1].saturating_sub(m[0])).collect();
    ns.sort_unstable();
    let median = *ns
        .get(ns.len().saturating_sub(1) / 2)
        .ok_or_else(|| crate::RuntimeError::Contract("copy bandwidth: no timed repetition (reps = 0)".into()))?;
    Ok(2.0 * (n * 4) as f64 / (median.max(1) as f64 * 1e-9))
}

#[cfg(test)]
mod tests {
    use super::{probe_word, Rung, RUNG_CHUNK};

    /// The parallel fill is word for word the pattern, across chunk edges, and the check counts
    /// exactly the words planted wrong, in any chunk, and a short or long read's missing words.
    #[test]
    fn a_rung_fills_the_pattern_and_counts_every_wrong_word() {
        let words = 2 * RUNG_CHUNK + 5;
        let mut rung = Rung::new(words);
        let got: Vec<f32> = rung.pattern(3, 5).to_vec();
        assert!(got.iter().enumerate().all(|(i, w)| w.to_bits() == probe_word(3, 5, i)));
        assert_eq!(rung.bad_words(3, 5, &got), 0);
        assert_eq!(rung.bad_words(5, 3, &got), words, "another pair's pattern matches nowhere");
        let mut planted = got.clone();
        for i in [0, RUNG_CHUNK - 1, RUNG_CHUNK, words - 1] {
            planted[i] = f32::from_bits(planted[i].to_bits() ^ 1);
        }
        assert_eq!(rung.bad_words(3, 5, &planted), 4);
        assert_eq!(rung.bad_words(3, 5, &got[..words - 7]), 7);
        assert!(rung.poison.iter().all(|w| w.to_bits() == 0xDEAD_BEEF) && rung.poison.len() == words);
    }
}
