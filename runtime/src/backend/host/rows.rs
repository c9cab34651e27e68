//! The host backend's large GEMVs on all cores: rows split over the rayon pool.
//!
//! Every twin computes a row from that row's storage and `x` alone (`MatrixView::rows`), in the
//! canonical K-block and lane order, so splitting the rows of one launch between threads changes
//! where a row is computed, never its bits. Grouped expert launches also run their slots in
//! parallel (slots write disjoint rows). At `step` shapes this is what makes the host oracle a
//! matter of seconds; small matrices stay on the rank's thread (below [`PARALLEL_ELEMENTS`] the
//! hand-off costs more than it saves).

use super::simd;
use crate::model::matrix::MatrixShard;
use rayon::prelude::*;

/// Weights (rows × columns) from which one launch is split over the pool.
pub(crate) const PARALLEL_ELEMENTS: usize = 1 << 22;

/// Rows per task for a `rows × cols` launch: all of them below the threshold, else about four
/// tasks per thread.
fn rows_per_task(rows: usize, cols: usize) -> usize {
    if rows.saturating_mul(cols) < PARALLEL_ELEMENTS {
        return rows.max(1);
    }
    rows.div_ceil(4 * rayon::current_num_threads()).max(1)
}

/// Run `f(first_row, chunk)` over chunks of `out` (one value per row), in parallel when large.
fn split_rows(out: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let per = rows_per_task(out.len(), cols);
    if per >= out.len() {
        f(0, out);
    } else {
        out.par_chunks_mut(per).enumerate().for_each(|(i, chunk)| f(i * per, chunk));
    }
}

/// Whole rows of `shard` applied to `x` (`tree`: QKV_FUSED's pairwise order), W8 shards by
/// their int8 twin.
pub(crate) fn gemv_rows(shard: &MatrixShard, x: &[f32], tree: bool, out: &mut [f32]) {
    split_rows(out, shard.in_features, |r0, o| {
        let rows = r0..r0 + o.len();
        match (shard.w8_view(), tree) {
            (Some(v), _) => simd::w8_rows(&v.rows(rows), x, o),
            (None, false) => simd::gemv_rows(&shard.view().rows(rows), x, o),
            (None, true) => simd::gemv_rows_tree(&shard.view().rows(rows), x, o),
        }
    });
}

/// K-block partials `out[k · rows + r]` of every row of `shard`.
pub(crate) fn gemv_partials(shard: &MatrixShard, x: &[f32], out: &mut [f32]) {
    let rows = shard.out_features;
    let per = rows_per_task(rows, shard.in_features);
    let part = |r0: usize, n: usize, o: &mut [f32]| match shard.w8_view() {
        Some(v) => simd::w8_partials(&v.rows(r0..r0 + n), x, o),
        None => simd::gemv_partials(&shard.view().rows(r0..r0 + n), x, o),
    };
    if per >= rows || rows == 0 {
        return part(0, rows, out);
    }
    let nk = out.len() / rows;
    // Each task fills `[k][its rows]`; the chunks are then placed at their rows of every k.
    let chunks: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(per))
        .into_par_iter()
        .map(|i| {
            let (r0, n) = (i * per, per.min(rows - i * per));
            let mut o = vec![0.0f32; nk * n];
            part(r0, n, &mut o);
            (r0, o)
        })
        .collect();
    for (r0, o) in chunks {
        let n = o.len() / nk.max(1);
        for k in 0..nk {
            out[k * rows + r0..k * rows + r0 + n].copy_from_slice(&o[k * n..(k + 1) * n]);
        }
    }
}

/// One expert slot's gate and up rows `(g, u)` (`experts::gate_up_rows`: each GEMV, then the NVFP4
/// per-matrix scales `(gate, up)` where given — NVFP4_DEV_ROUTES leaves the up scale to its
/// folded SwiGLU), rows split when large.
pub(crate) fn gate_up_rows(
    gate: &MatrixShard,
    up: &MatrixShard,
    x: &[f32],
    (sg, su): (Option<f32>, Option<f32>),
) -> (Vec<f32>, Vec<f32>) {
    let (gv, uv) = (gate.view(), up.view());
    let (mut g, mut u) = (vec![0.0f32; gate.out_features], vec![0.0f32; up.out_features]);
    split_rows(&mut g, gate.in_features, |r0, o| simd::gemv_rows(&gv.rows(r0..r0 + o.len()), x, o));
    split_rows(&mut u, up.in_features, |r0, o| simd::gemv_rows(&uv.rows(r0..r0 + o.len()), x, o));
    if let Some(sg) = sg {
        for v in g.iter_mut() {
            *v *= sg;
        }
    }
    if let Some(su) = su {
        for v in u.iter_mut() {
            *v *= su;
        }
    }
    (g, u)
}

/// Run `f(j)` for every slot `j` in `0..slots`, results in slot order: in parallel when the
/// slots together hold at least [`PARALLEL_ELEMENTS`] weights (`weights_per_slot` each).
pub(crate) fn per_slot<T: Send>(slots: usize, weights_per_slot: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    if slots <= 1 || slots.saturating_mul(weights_per_slot) < PARALLEL_ELEMENTS {
        return (0..slots).map(f).collect();
    }
    (0..slots).into_par_iter().map(f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Matrix;
    use memra_kernels::formats::{bf16_from_f32, e4m3_block_quantize};
    use memra_kernels::twins::{gemv, w8};

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = memra_kernels::twins::digest::splitmix64(s);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Above the threshold every storage is split over the pool (a 2-row shard starting mid
    /// scale block included); the bits are the plain twins' on the whole shard.
    #[test]
    fn split_launches_equal_the_whole_twins() {
        let (rows, cols) = (2304, 2048);
        assert!(rows * cols >= PARALLEL_ELEMENTS, "the test must exercise the split path");
        let w = values(rows * cols, 1);
        let (codes, scales) = e4m3_block_quantize(&w, rows, cols);
        let bf16 =
            Matrix::Bf16 { out_features: rows, in_features: cols, bits: w.iter().map(|v| bf16_from_f32(*v)).collect() };
        let e4m3 = Matrix::E4m3 { out_features: rows, in_features: cols, codes, scales };
        let x = values(cols, 2);
        let shards = [
            ("bf16", bf16.whole()),
            ("f32", bf16.whole().widened()),
            ("w8", bf16.whole().to_w8()),
            ("e4m3", e4m3.whole()),
            ("e4m3 rows 64..2240", e4m3.shard_rows(64..2240)),
            ("nvfp4", e4m3.to_nvfp4()),
        ];
        for (name, s) in shards {
            let n = s.out_features;
            let nk = s.in_features / s.kblock_width;
            let (mut got, mut want) = (vec![0.0f32; n], vec![0.0f32; n]);
            let (mut got_p, mut want_p) = (vec![0.0f32; n * nk], vec![0.0f32; n * nk]);
            gemv_rows(&s, &x, false, &mut got);
            gemv_partials(&s, &x, &mut got_p);
            match s.w8_view() {
                Some(v) => {
                    w8::w8_rows(&v, &x, &mut want);
                    w8::w8_partials(&v, &x, &mut want_p);
                }
                None => {
                    gemv::gemv_rows(&s.view(), &x, &mut want);
                    gemv::gemv_partials(&s.view(), &x, &mut want_p);
                }
            }
            assert_eq!(bits(&got), bits(&want), "{name}: rows");
            assert_eq!(bits(&got_p), bits(&want_p), "{name}: partials");
            if s.w8_view().is_none() {
                gemv_rows(&s, &x, true, &mut got);
                gemv::gemv_rows_tree(&s.view(), &x, &mut want);
                assert_eq!(bits(&got), bits(&want), "{name}: tree rows");
            }
        }
        let (g, u) = (e4m3.whole(), e4m3.shard_rows(0..rows));
        for scales in [None, Some((0.75f32, 1.5f32))] {
            let (got_g, got_u) = gate_up_rows(&g, &u, &x, (scales.map(|s| s.0), scales.map(|s| s.1)));
            let (want_g, want_u) = memra_kernels::twins::experts::gate_up_rows(&g.view(), &u.view(), &x, scales);
            assert_eq!((bits(&got_g), bits(&got_u)), (bits(&want_g), bits(&want_u)), "gate_up_rows {scales:?}");
        }
    }

    #[test]
    fn per_slot_keeps_slot_order() {
        for weights in [1, PARALLEL_ELEMENTS] {
            assert_eq!(per_slot(9, weights, |j| j * j), (0..9).map(|j| j * j).collect::<Vec<_>>());
            assert!(per_slot(0, weights, |j| j).is_empty());
        }
    }
}
