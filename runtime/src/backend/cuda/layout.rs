//! Where a weight's bytes live on the device: row-major (as `MatrixShard` stores them) or
//! lane-major, the layout that lets one vector load hand a GEMV lane the next elements of its own
//! canonical sequence (see `kernels/cuda/gemv.cu`).
//!
//! The canonical dot order is fixed: inside a K-block of width `kw`, lane l accumulates columns
//! l, l+32, l+64, … in that order. Row-major storage makes those elements 32 apart, so each lane
//! would load one element at a time. Lane-major storage puts lane l's `n = kw/32` elements in
//! vectors of `vec` consecutive elements: column `j*32 + l` of a K-block moves to position
//! `(j/vec*32 + l)*vec + j%vec`. The layout only moves bytes; the kernel still performs the same
//! operations in the same order, so the result is the same bits. Pure safe code, tested here
//! without a device.

use crate::model::matrix::{MatrixShard, ShardData};
use memra_kernels::formats::E4M3_NAN;

/// Lanes of the canonical dot product.
const LANES: usize = 32;
/// A K-block must hold whole groups of 4 elements per lane (128 columns) to be stored lane-major.
const LANE_MAJOR_KBLOCK: usize = 128;

/// Elements per lane-major vector for a shard, or 0 for row-major storage.
///
///
/// BF16: 8 (16-byte loads) when each lane's run divides by 8, else 4 (8-byte loads); F32: 4
/// (16-byte loads); E4M3: 16 (16-byte loads, four 128-column scale blocks per vector) when each
/// lane's run divides by 16, else 4 (one scale block per 4-byte load) — only when no code is a
/// NaN code, because the lane-major kernel decodes with the finite-only fast path; NVFP4 and W8:
/// always row-major. `allow` = false (the reference-kernel option) forces row-major.
pub(crate) fn choose_vec(shard: &MatrixShard, allow: bool) -> usize {
    let kw = shard.kblock_width;
    if !allow || kw == 0 || !kw.is_multiple_of(LANE_MAJOR_KBLOCK) || !shard.in_features.is_multiple_of(kw) {
        return 0;
    }
    let per_lane = kw / LANES;
    match &shard.data {
        ShardData::Bf16(_) => {
            if per_lane.is_multiple_of(8) {
                8
            } else {
                4
            }
        }
        ShardData::F32(_) => 4,
        ShardData::E4m3 { codes, .. } => {
            if codes.iter().any(|c| c & 0x7F == E4M3_NAN) {
                0
            } else if per_lane.is_multiple_of(16) {
                16
            } else {
                4
            }
        }
        ShardData::Nvfp4 { .. } | ShardData::W8 { .. } => 0,
    }
}

/// Position of column `c` of a row inside its stored row (`vec` = 0: row-major).
pub(crate) fn stored_column(c: usize, kw: usize, vec: usize) -> usize {
    if vec == 0 {
        return c;
    }
    let (k, rem) = (c / kw, c % kw);
    let (j, l) = (rem / LANES, rem % LANES);
    k * kw + (j / vec * LANES + l) * vec + j % vec
}

/// A row-major `[rows][cols]` matrix rearranged lane-major (`vec` > 0), row by row: the column
/// permutation is computed once per matrix, and rows are moved on the rayon pool (a `step`
/// layer's experts are gigabytes, and this runs on every upload).
pub(crate) fn to_lane_major<T: Copy + Default + Send + Sync>(data: &[T], cols: usize, kw: usize, vec: usize) -> Vec<T> {
    use rayon::prelude::*;
    if vec == 0 || cols == 0 {
        return data.to_vec();
    }
    let perm: Vec<usize> = (0..cols).map(|c| stored_column(c, kw, vec)).collect();
    let mut out = vec![T::default(); data.len()];
    // Bands of rows of about 1 MiB keep the tasks few and the permutation in cache.
    let rows_per_task = (1 << 20) / (cols * std::mem::size_of::<T>()).max(1) + 1;
    out.par_chunks_mut(rows_per_task * cols).zip(data.par_chunks(rows_per_task * cols)).for_each(|(dst, src)| {
        for (d, s) in dst.chunks_exact_mut(cols).zip(src.chunks_exact(cols)) {
            for (v, &p) in s.iter().zip(&perm) {
                d[p] = *v;
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_kernels::canon::{butterfly32, dot32};
    use memra_kernels::formats::e4m3_decode;

    #[test]
    fn stored_column_is_a_permutation_of_each_kblock() {
        for (kw, vec) in [(128, 4), (256, 8), (512, 16), (640, 4), (512, 8)] {
            let cols = kw * 3;
            let mut seen = vec![false; cols];
            for c in 0..cols {
                let p = stored_column(c, kw, vec);
                assert_eq!(p / kw, c / kw, "column {c} left its K-block");
                assert!(!seen[p], "position {p} used twice");
                seen[p] = true;
            }
        }
    }

    /// The banded, parallel rearrangement puts every element where `stored_column` says, for
    /// matrices of many bands and a last partial band.
    #[test]
    fn to_lane_major_moves_each_element_to_its_stored_column() {
        for (rows, cols, kw, vec) in [(3, 512, 512, 16), (700, 1280, 640, 4), (2100, 256, 128, 4)] {
            let data: Vec<u32> = (0..(rows * cols) as u32).collect();
            let lm = to_lane_major(&data, cols, kw, vec);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(lm[r * cols + stored_column(c, kw, vec)], data[r * cols + c], "row {r} column {c}");
                }
            }
        }
    }

    #[test]
    fn lane_l_reads_its_canonical_sequence_in_order() {
        // The kernel's view: lane l's vector g at (g*32 + l)*vec holds j = g*vec + t.
        let (kw, vec) = (512, 16);
        let data: Vec<u32> = (0..kw as u32).collect();
        let lm = to_lane_major(&data, kw, kw, vec);
        for l in 0..32 {
            let seq: Vec<u32> =
                (0..kw / 32 / vec).flat_map(|g| lm[(g * 32 + l) * vec..][..vec].iter().copied()).collect();
            let want: Vec<u32> = (0..kw / 32).map(|j| (j * 32 + l) as u32).collect();
            assert_eq!(seq, want, "lane {l}");
        }
    }

    /// The finite-only E4M3 decode of the lane-major kernel (`e4m3_decode_finite` in
    /// canon.cuh), mirrored bit for bit: equal to the codec for every non-NaN code.
    #[test]
    fn e4m3_fast_decode_matches_the_codec() {
        let two_p120 = f32::from_bits(0x7B80_0000);
        for code in 0u32..256 {
            if code & 0x7F == 0x7F {
                continue;
            }
            let fast = f32::from_bits(((code & 0x7F) << 20) | ((code & 0x80) << 24)) * two_p120;
            assert_eq!(fast.to_bits(), e4m3_decode(code as u8).to_bits(), "code {code:#04x}");
        }
    }

    /// The reduce-scatter of four butterflies (`butterfly32_x4` in gemv.cu), simulated lane by
    /// lane, gives each block exactly `butterfly32` of its lanes.
    #[test]
    fn four_way_reduce_scatter_equals_four_butterflies() {
        let mut state = 0x1234_5678_u64;
        let mut next = || {
            state = memra_kernels::twins::digest::splitmix64(state);
            f32::from_bits(((state >> 40) as u32 & 0x807F_FFFF) | 0x3F00_0000) * 3.0
        };
        let p: Vec<[f32; 4]> = (0..32).map(|_| [next(), next(), next(), next()]).collect();
        // stage o = 16
        let mut k: Vec<[f32; 2]> = vec![[0.0; 2]; 32];
        for l in 0..32 {
            let hi = (l >> 4) & 1 == 1;
            let partner = l ^ 16;
            let keep = if hi { [p[l][2], p[l][3]] } else { [p[l][0], p[l][1]] };
            let phi = (partner >> 4) & 1 == 1;
            let recv = if phi { [p[partner][0], p[partner][1]] } else { [p[partner][2], p[partner][3]] };
            k[l] = [keep[0] + recv[0], keep[1] + recv[1]];
        }
        // stage o = 8
        let mut v = vec![0.0f32; 32];
        for l in 0..32 {
            let mid = (l >> 3) & 1 == 1;
            let partner = l ^ 8;
            let keep = if mid { k[l][1] } else { k[l][0] };
            let pmid = (partner >> 3) & 1 == 1;
            let recv = if pmid { k[partner][0] } else { k[partner][1] };
            v[l] = keep + recv;
        }
        for o in [4, 2, 1] {
            let prev = v.clone();
            for l in 0..32 {
                v[l] = prev[l] + prev[l ^ o];
            }
        }
        let want: [f32; 4] = std::array::from_fn(|q| butterfly32(std::array::from_fn(|l| p[l][q])));
        for (q, w) in want.iter().enumerate() {
            let lane = (q >> 1) * 16 + (q & 1) * 8;
            assert_eq!(v[lane].to_bits(), w.to_bits(), "block {q}");
        }
        // and butterfly32 is dot32's reduction
        let w: Vec<f32> = (0..64).map(|i| i as f32).collect();
        assert_eq!(dot32(&w, &w), butterfly32(std::array::from_fn(|l| w[l] * w[l] + w[l + 32] * w[l + 32])));
    }
}
