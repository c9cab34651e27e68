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
    const POISON: u32 = 0xDEAD_BEEF;
    let mut out = Vec::new();
    let n = b.ranks();
    for &bytes in sizes_bytes {
        let words = bytes / 4;
        let bufs: Vec<BufId> = (0..n).map(|r| b.alloc(r, words)).collect::<Result<_>>()?;
        for src in 0..n {
            for dst in (0..n).filter(|d| *d != src) {
                let pattern: Vec<f32> = (0..words).map(|i| f32::from_bits(probe_word(src, dst, i))).collect();
                b.write(src, Slice::new(bufs[src], 0, words), &pattern)?;
                b.write(dst, Slice::new(bufs[dst], 0, words), &vec![f32::from_bits(POISON); words])?;
                b.copy(Transfer::new(
                    transport,
                    (src, Slice::new(bufs[src], 0, words)),
                    (dst, Slice::new(bufs[dst], 0, words)),
                ))?;
                let got = b.read(dst, Slice::new(bufs[dst], 0, words))?;
                let bad_words = got.iter().enumerate().filter(|(i, v)| v.to_bits() != probe_word(src, dst, *i)).count();
                out.push(ProbeResult { src, dst, bytes, bad_words, no_peer_access: None });
            }
        }
    }
    Ok(out)
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
