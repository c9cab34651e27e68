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
use memra_kernels::formats::{E4M3_BLOCK, E4M3_NAN};

/// Lanes of the canonical dot product.
const LANES: usize = 32;
/// A K-block must hold whole groups of 4 elements per lane (128 columns) to be stored lane-major.
const LANE_MAJOR_KBLOCK: usize = 128;

/// The `vec` value of E4M3's block-per-lane layout (`E4M3_BPL` in gemv.cu): one thread owns a whole
/// 128-column scale block of a row and evaluates its dot32 alone, in the lane-major kernel's order.
pub(crate) const E4M3_BPL: usize = 128;
/// Scale blocks per row the block-per-lane kernels stage in shared memory (`BPL_MAX_NB`).
pub(crate) const BPL_MAX_NB: usize = 32;
/// Scaled block dots a block-per-lane block holds (`BPL_SV`): rows × blocks × matrices per block.
pub(crate) const BPL_SV: usize = 1024;

/// Elements per vector for a shard (lane-major), [`E4M3_BPL`] (block per lane), or 0 for
/// row-major storage.
///
/// BF16: 8 (16-byte loads) when each lane's run divides by 8, else 4 (8-byte loads); F32: 4
/// (16-byte loads); E4M3: [`E4M3_BPL`] (block per lane) when a row has at most [`BPL_MAX_NB`] scale
/// blocks, else 16 (16-byte loads, four 128-column scale blocks per vector) when each lane's run
/// divides by 16, else 4 (one scale block per 4-byte load) — only when no code is a NaN code,
/// because those kernels decode with the finite-only fast path; NVFP4 and W8: always row-major.
/// `allow` = false (the reference-kernel option) forces row-major.
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
            } else if shard.in_features / E4M3_BLOCK <= BPL_MAX_NB {
                E4M3_BPL
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

/// Bit reversal of a lane index (5 bits): the order in which a block-per-lane pair stores its 32
/// lane sums, so that the butterfly's tree is evaluated left to right.
pub(crate) fn brev5(m: usize) -> usize {
    ((m & 1) << 4) | ((m & 2) << 2) | (m & 4) | ((m & 8) >> 2) | ((m & 16) >> 4)
}

/// Byte position of column `c` of row `r` in the block-per-lane layout of a matrix of `nb` scale
/// blocks per row: pair q = r·nb + c/128; chunk q/32; vector g and byte 4j + i of the pair hold
/// block column m + 32i with 4g + j = brev5(m) (gemv.cu, "block-per-lane layout"). The
/// specification [`to_block_per_lane`] is tested against.
#[cfg(test)]
fn bpl_position(r: usize, c: usize, nb: usize) -> usize {
    let q = r * nb + c / E4M3_BLOCK;
    let e = c % E4M3_BLOCK;
    let (m, i) = (e % LANES, e / LANES);
    let n = brev5(m);
    (((q / LANES) * 8 + n / 4) * LANES + q % LANES) * 16 + 4 * (n % 4) + i
}

/// Bytes the block-per-lane layout of `rows × cols` codes occupies: whole chunks of 32 pairs (a
/// last partial chunk is padded with zero codes, which no kernel reads).
pub(crate) fn bpl_len(rows: usize, cols: usize) -> usize {
    (rows * (cols / E4M3_BLOCK)).div_ceil(LANES) * LANES * E4M3_BLOCK
}

/// Row-major E4M3 codes rearranged into the block-per-lane layout (`cols` a multiple of 128);
/// chunks of 32 pairs (4096 contiguous bytes each) are filled in parallel.
pub(crate) fn to_block_per_lane(codes: &[u8], cols: usize) -> Vec<u8> {
    use rayon::prelude::*;
    if cols == 0 {
        return Vec::new();
    }
    let (rows, nb) = (codes.len() / cols, cols / E4M3_BLOCK);
    let mut out = vec![0u8; bpl_len(rows, cols)];
    out.par_chunks_mut(LANES * E4M3_BLOCK).enumerate().for_each(|(chunk, dst)| {
        for l in 0..LANES.min(rows * nb - chunk * LANES) {
            let q = chunk * LANES + l;
            let (r, b) = (q / nb, q % nb);
            for (e, &code) in codes[r * cols + b * E4M3_BLOCK..][..E4M3_BLOCK].iter().enumerate() {
                let n = brev5(e % LANES);
                dst[((n / 4) * LANES + l) * 16 + 4 * (n % 4) + e / LANES] = code;
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

    /// The Rust mirrors of gemv.cu's block-per-lane bounds are the values the kernels were built
    /// with (a drift would let the runtime launch shapes the shared memory does not hold).
    #[test]
    fn block_per_lane_bounds_mirror_the_kernel_source() {
        let src = memra_kernels::sources::cuda_source();
        for (name, value) in [("E4M3_BPL", E4M3_BPL), ("BPL_MAX_NB", BPL_MAX_NB), ("BPL_SV", BPL_SV)] {
            let line = format!("#define {name} {value}\n");
            assert!(src.contains(&line), "gemv.cu does not define {name} as {value}");
        }
    }

    #[test]
    fn block_per_lane_positions_are_a_bijection_and_the_rearrangement_follows_them() {
        for (rows, cols) in [(4, 4096), (7, 1280), (3, 384), (1, 128)] {
            let nb = cols / 128;
            let codes: Vec<u8> = (0..rows * cols).map(|i| (i * 131 % 251) as u8).collect();
            let bpl = to_block_per_lane(&codes, cols);
            assert_eq!(bpl.len(), bpl_len(rows, cols));
            assert_eq!(bpl.len() % 4096, 0, "whole chunks of 32 pairs");
            let mut seen = vec![false; bpl.len()];
            for r in 0..rows {
                for c in 0..cols {
                    let p = bpl_position(r, c, nb);
                    assert!(!seen[p], "position {p} used twice ({rows}x{cols}, row {r}, column {c})");
                    seen[p] = true;
                    assert_eq!(bpl[p], codes[r * cols + c], "row {r} column {c}");
                }
            }
        }
    }

    /// The device's view of a block-per-lane matrix (`bpl_pairs` + `bpl_dot` + `gemv_bpl` in
    /// gemv.cu), simulated operation for operation from the stored bytes: the same bits as the
    /// canonical twins' rows and partials, with signed zeros, negative codes and subnormals in play.
    #[test]
    #[allow(clippy::assign_op_pattern)] // each line is one IEEE operation with its operand order
    fn the_block_per_lane_program_read_from_the_stored_bytes_equals_the_canonical_gemv() {
        use memra_kernels::twins::gemv::{gemv_partials, gemv_rows, MatrixView, WeightRef};
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = || {
            state = memra_kernels::twins::digest::splitmix64(state);
            state
        };
        for (rows, cols, kw, row0) in [(6, 1280, 640, 0), (5, 4096, 512, 130), (3, 512, 128, 0)] {
            let nb = cols / 128;
            // Finite codes only (the layout is chosen only then); every 7th a signed zero.
            let codes: Vec<u8> = (0..rows * cols)
                .map(|i| {
                    let c = (next() & 0xFF) as u8;
                    if i % 7 == 0 {
                        c & 0x80
                    } else if c & 0x7F == 0x7F {
                        c ^ 1
                    } else {
                        c
                    }
                })
                .collect();
            let scale_rows = (row0 + rows - 1) / 128 - row0 / 128 + 1;
            let scales: Vec<f32> =
                (0..scale_rows * nb).map(|_| f32::from_bits(0x3A00_0000 | (next() as u32 & 0x00FF_FFFF))).collect();
            let x: Vec<f32> = (0..cols)
                .map(|i| match i % 11 {
                    0 => -0.0,
                    1 => f32::from_bits(1 + (next() as u32 & 0xFF)),
                    _ => f32::from_bits((next() as u32 & 0x807F_FFFF) | 0x3E00_0000) * 3.0,
                })
                .collect();
            let bpl = to_block_per_lane(&codes, cols);
            // x staged as bpl_stage_x: block b, lane sum m's four values at 4 * brev5(m).
            let mut xs = vec![0.0f32; nb * 128];
            for (c, &v) in x.iter().enumerate() {
                xs[(c / 128) * 128 + 4 * brev5(c % 128 % 32) + c % 128 / 32] = v;
            }
            let (bk, nk) = (kw / 128, cols / kw);
            let mut sv = vec![0.0f32; rows * nb];
            for (q, s) in sv.iter_mut().enumerate() {
                let (r, b) = (q / nb, q % nb);
                let mut stack: Vec<f32> = Vec::new();
                for n in 0..32 {
                    let (g, j) = (n / 4, n % 4);
                    let mut v = 0.0f32;
                    for i in 0..4 {
                        let code = bpl[(((q / 32) * 8 + g) * 32 + q % 32) * 16 + 4 * j + i];
                        v = v + e4m3_decode(code) * xs[b * 128 + 16 * g + 4 * j + i];
                    }
                    let mut t = n;
                    while t & 1 == 1 {
                        v = stack.pop().expect("a closed subtree has a left half") + v;
                        t >>= 1;
                    }
                    stack.push(v);
                }
                assert_eq!(stack.len(), 1);
                *s = scales[((row0 + r) / 128 - row0 / 128) * nb + b] * stack[0];
            }
            let kpart = |r: usize, k: usize| (0..bk).fold(0.0f32, |acc, j| acc + sv[r * nb + k * bk + j]);
            let view = MatrixView {
                w: WeightRef::E4m3 { codes: &codes, scales: &scales, row0 },
                out_features: rows,
                in_features: cols,
                kblock_width: kw,
            };
            let mut parts = vec![0.0f32; nk * rows];
            gemv_partials(&view, &x, &mut parts);
            let mut whole = vec![0.0f32; rows];
            gemv_rows(&view, &x, &mut whole);
            for r in 0..rows {
                for k in 0..nk {
                    assert_eq!(
                        kpart(r, k).to_bits(),
                        parts[k * rows + r].to_bits(),
                        "{rows}x{cols} row {r} K-block {k}"
                    );
                }
                let row = (0..nk).fold(0.0f32, |acc, k| acc + kpart(r, k));
                assert_eq!(row.to_bits(), whole[r].to_bits(), "{rows}x{cols} row {r}");
            }
        }
    }

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
