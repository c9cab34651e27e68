//! The fast paths of [`super`] against the twins they copy, bit for bit, with a negative control
//! in each test so that a comparison that could not fail would show.

use super::*;
use memra_kernels::twins::digest::splitmix64;

/// `x` values that exercise the IEEE cases of the products and sums: signed zeros,
/// subnormals, and with `non_finite` infinities and NaN.
fn special(i: usize, s: u64, non_finite: bool) -> f32 {
    match (i % 9, non_finite) {
        (0, _) => 0.0,
        (1, _) => -0.0,
        (2, _) => f32::from_bits(1 + (s as u32 & 0x7F_FFFF) % 0x7F_FFFF), // subnormal
        (3, true) => f32::INFINITY,
        (4, true) => f32::NEG_INFINITY,
        (5, true) => f32::NAN,
        _ => ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0,
    }
}

/// A deterministic stream of test values (splitmix64).
struct Draw(u64);

impl Draw {
    fn bits(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }

    /// Uniform in [−scale/2, scale/2).
    fn uniform(&mut self, scale: f32) -> f32 {
        ((self.bits() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
    }

    /// `n` weights of a real scale (|w| < 1/32: no subnormal BF16, so no microcode path).
    fn weights(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform(1.0 / 16.0)).collect()
    }

    /// An input of `cols` values: kind 0 ordinary, 1 with signed zeros and subnormals among them,
    /// 2 with infinities and NaN too, 3 ordinary but value 3 is 2^120 (finite, but the E4M3 path
    /// that scales `x` by 256 must not be taken for it).
    fn input(&mut self, cols: usize, kind: usize) -> Vec<f32> {
        (0..cols)
            .map(|i| match kind {
                0 => self.uniform(2.0),
                3 if i == 3 => f32::from_bits((120 + 127) << 23),
                3 => self.uniform(2.0),
                k => special(i, self.bits(), k == 2),
            })
            .collect()
    }
}

/// Says which path the comparisons exercise on this CPU.
fn note_path() {
    if !available() {
        eprintln!(
            "no AVX-512F and BW on this CPU: the vector path is not exercised here, only the fallback to the twin"
        );
    }
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
}

/// The view's rows and K-block partials by the fast path equal the twin's bits; returns the
/// twin's rows. With `control`, and more than two K-blocks, the negative control: the same
/// partials folded in reverse order are other bits in some row after the first, so the
/// comparison can fail (two partials fold to the same sum either way: IEEE addition commutes).
fn check_against_twin(what: &str, m: &MatrixView, x: &[f32], control: bool) -> Vec<f32> {
    // The path under test is known: the vector one exactly where the CPU has AVX-512F and BW (these
    // views are all ones it takes), else the twin itself (then this checks the fallback).
    assert_eq!(
        stored(m, x).is_some(),
        available(),
        "{what}: the fast path was {}taken",
        if available() { "not " } else { "" }
    );
    let (rows, nk) = (m.out_features, m.in_features / m.kblock_width);
    let (mut want, mut got) = (vec![0.0f32; rows], vec![0.0f32; rows]);
    gemv::gemv_rows(m, x, &mut want);
    gemv_rows(m, x, &mut got);
    assert!(same(&want, &got), "{what}: rows differ from the twin");
    let (mut want_p, mut got_p) = (vec![0.0f32; rows * nk], vec![0.0f32; rows * nk]);
    gemv::gemv_partials(m, x, &mut want_p);
    gemv_partials(m, x, &mut got_p);
    assert!(same(&want_p, &got_p), "{what}: partials differ from the twin");
    if control && nk > 2 {
        let mut reversed = vec![0.0f32; rows];
        gemv::fold_partials(&got_p, nk, rows, true, &mut reversed);
        assert!(!same(&want[1..], &reversed[1..]), "{what}: a reversed fold must show as a difference");
    }
    want
}

/// Every code (NaN codes and both zeros, in the first two 128-blocks of row 0: the table path;
/// every other block decodes by way of FP16), ordinary and special inputs (huge ones, which keep
/// the weights from being scaled by way of `x`), views of a row shard that starts mid scale
/// block, one and several 128-blocks per K-block: the rows and the partials equal the twin's
/// bits. The other rows hold no NaN code, so their values are finite and the comparison means
/// something (checked), and a planted change (the K-blocks folded in reverse) must differ, so the
/// comparison can fail.
#[test]
fn matches_the_twin_bit_for_bit() {
    note_path();
    let mut draw = Draw(7);
    // (rows, cols, K-block width, row0, x: 0 ordinary, 1 zeros and subnormals, 2 also inf/NaN,
    // 3 one value at 2^120)
    for (rows, cols, kw, row0, x_kind) in [
        (256, 1024, 128, 0, 0),
        (130, 1024, 256, 64, 0),
        (64, 1280, 640, 0, 0),
        (40, 512, 128, 100, 1),
        (8, 256, 128, 0, 2),
        (16, 512, 256, 0, 3),
    ] {
        let codes: Vec<u8> = (0..rows * cols)
            .map(|i| match (i < 256, draw.bits() as u8) {
                (true, _) => i as u8,
                (false, c) if c & 0x7F == 0x7F => c ^ 1, // no NaN code outside row 0
                (false, c) => c,
            })
            .collect();
        let scale_rows = (row0 + rows - 1) / 128 - row0 / 128 + 1;
        let scales: Vec<f32> =
            (0..scale_rows * cols / 128).map(|_| (draw.bits() % 1000) as f32 / 4096.0 + 1e-3).collect();
        let x = draw.input(cols, x_kind);
        let m = MatrixView {
            w: WeightRef::E4m3 { codes: &codes, scales: &scales, row0 },
            out_features: rows,
            in_features: cols,
            kblock_width: kw,
        };
        let what = format!("e4m3 {rows}×{cols} (K-block {kw}, row0 {row0})");
        let want = check_against_twin(&what, &m, &x, x_kind == 0);
        if x_kind == 3 {
            assert!(want.iter().any(|v| v.is_finite()), "{what}: some rows must be finite numbers");
        }
        if x_kind < 2 {
            let finite = want[1..].iter().filter(|v| v.is_finite()).count();
            assert_eq!(finite, rows - 1, "{what}: rows after the first must be finite");
        }
    }
}

/// The E4M3 path scales `x` by 256 exactly where that cannot overflow: every ordinary input
/// takes it (so the FP16 decode is what the test above compares), and a value of 2^120 or more,
/// an infinity or a NaN sends the whole GEMV to the table path.
#[cfg(target_arch = "x86_64")]
#[test]
fn x_is_scaled_by_256_only_where_exact() {
    let mut draw = Draw(3);
    let x = draw.input(512, 1);
    let scaled = avx512::times_256(&x).expect("ordinary and subnormal inputs take the scaled path");
    assert!(x.iter().zip(&scaled).all(|(v, s)| (v * 256.0).to_bits() == s.to_bits() && s / 256.0 == *v));
    let limit = f32::from_bits((120 + 127) << 23);
    assert!(avx512::times_256(&[1.0, f32::from_bits(limit.to_bits() - 1)]).is_some());
    for bad in [limit, -limit, f32::INFINITY, f32::NAN] {
        assert!(avx512::times_256(&[1.0, bad]).is_none(), "{bad} must not be scaled");
    }
}

/// BF16 and F32 views (the F32 mirror's storage) at K-block widths of one and several lane
/// rounds, ordinary and special inputs: the rows and partials equal the twin's bits; a
/// reversed fold differs (the comparison can fail).
#[test]
fn bf16_and_f32_match_the_twin_bit_for_bit() {
    note_path();
    let mut draw = Draw(11);
    for (rows, cols, kw, x_kind) in [(96, 1024, 128, 0), (33, 256, 32, 0), (17, 512, 64, 1), (5, 128, 32, 2)] {
        let values = draw.weights(rows * cols);
        let bits: Vec<u16> = values.iter().map(|v| memra_kernels::formats::bf16_from_f32(*v)).collect();
        let x = draw.input(cols, x_kind);
        for (name, w) in [("bf16", WeightRef::Bf16(&bits)), ("f32", WeightRef::F32(&values))] {
            let m = MatrixView { w, out_features: rows, in_features: cols, kblock_width: kw };
            let what = format!("{name} {rows}×{cols} (K-block {kw})");
            let want = check_against_twin(&what, &m, &x, x_kind == 0);
            if x_kind < 2 {
                assert!(want.iter().all(|v| v.is_finite()), "{what}: the rows must be finite");
            }
        }
    }
}

/// NVFP4 views (every nibble; every scale code, NaN ones included, in the first groups) at K-block
/// widths of one and several lane rounds, one K-block and several, ordinary and special inputs:
/// the rows and partials equal the twin's bits; a reversed fold differs (the comparison can fail).
#[test]
fn nvfp4_matches_the_twin_bit_for_bit() {
    note_path();
    let mut draw = Draw(13);
    for (rows, cols, kw, x_kind) in [(64, 1024, 128, 0), (33, 512, 64, 0), (9, 256, 256, 1), (5, 128, 32, 2)] {
        let packed: Vec<u8> = (0..rows * cols / 2).map(|_| draw.bits() as u8).collect();
        // Groups 0..256 take every scale code; the others ordinary scales (codes 0x28..0x48).
        let special_groups = 256.min(rows * cols / 16);
        let scales: Vec<u8> = (0..rows * cols / 16)
            .map(|g| if g < special_groups { g as u8 } else { 0x28 + (draw.bits() % 0x20) as u8 })
            .collect();
        let x = draw.input(cols, x_kind);
        let m = MatrixView {
            w: WeightRef::Nvfp4 { packed: &packed, scales: &scales },
            out_features: rows,
            in_features: cols,
            kblock_width: kw,
        };
        let what = format!("nvfp4 {rows}×{cols} (K-block {kw})");
        let want = check_against_twin(&what, &m, &x, x_kind == 0);
        if x_kind < 2 {
            let first_ordinary = (special_groups * 16).div_ceil(cols);
            assert!(want[first_ordinary..].iter().all(|v| v.is_finite()), "{what}: ordinary rows must be finite");
        }
    }
}

/// QKV_FUSED's tree rows of BF16 and F32 views, at widths that are a power of two, that are
/// padded to one, and that leave no level or one level for the vector loop; ordinary and special
/// inputs: the rows equal the twin's bits. The negative control: the canonical order's rows of
/// the same view differ from the tree's in some row, so the comparison can fail.
#[test]
fn tree_rows_match_the_twin_bit_for_bit() {
    note_path();
    let mut draw = Draw(17);
    for (rows, cols, x_kind) in [(40, 1024, 0), (17, 768, 0), (9, 48, 0), (3, 16, 1), (6, 1024, 1), (5, 96, 2)] {
        let values = draw.weights(rows * cols);
        let bits: Vec<u16> = values.iter().map(|v| memra_kernels::formats::bf16_from_f32(*v)).collect();
        let x = draw.input(cols, x_kind);
        for (name, w) in [("bf16", WeightRef::Bf16(&bits)), ("f32", WeightRef::F32(&values))] {
            let m = MatrixView { w, out_features: rows, in_features: cols, kblock_width: cols / 8 };
            let what = format!("{name} tree {rows}×{cols}");
            assert_eq!(tree_stored(&m, &x).is_some(), available(), "{what}: the fast path's use is not as expected");
            let (mut want, mut got) = (vec![0.0f32; rows], vec![0.0f32; rows]);
            gemv::gemv_rows_tree(&m, &x, &mut want);
            gemv_rows_tree(&m, &x, &mut got);
            assert!(same(&want, &got), "{what}: rows differ from the twin");
            if x_kind == 0 && cols >= 64 {
                assert!(want.iter().all(|v| v.is_finite()), "{what}: the rows must be finite");
                let mut canonical = vec![0.0f32; rows];
                gemv::gemv_rows(&m, &x, &mut canonical);
                assert!(!same(&want, &canonical), "{what}: the canonical order must show as a difference");
            }
        }
    }
    // E4M3 storage is the twin's: the fast path does not take it.
    let codes = vec![0x38u8; 4 * 128];
    let scales = [1.0f32];
    let m = MatrixView {
        w: WeightRef::E4m3 { codes: &codes, scales: &scales, row0: 0 },
        out_features: 4,
        in_features: 128,
        kblock_width: 128,
    };
    let x = vec![1.0f32; 128];
    assert!(tree_stored(&m, &x).is_none(), "the tree's fast path takes BF16 and F32 only");
    let (mut want, mut got) = ([0.0f32; 4], [0.0f32; 4]);
    gemv::gemv_rows_tree(&m, &x, &mut want);
    gemv_rows_tree(&m, &x, &mut got);
    assert!(same(&want, &got), "e4m3 tree rows (the twin's)");
}

/// W8 views at K-block widths of one and several groups, one K-block and several, ordinary inputs
/// and inputs with zeros and subnormals: the rows and partials equal the twin's bits; a reversed
/// fold differs (the comparison can fail).
#[test]
fn w8_matches_the_twin_bit_for_bit() {
    note_path();
    let mut draw = Draw(19);
    for (rows, cols, kw, x_kind) in [(48, 1024, 128, 0), (21, 256, 32, 0), (7, 512, 512, 1), (9, 128, 64, 1)] {
        let values = draw.weights(rows * cols);
        let (q, scales) = w8::w8_quantize(&values, cols);
        let x = draw.input(cols, x_kind);
        let m = W8View { q: &q, scales: &scales, out_features: rows, in_features: cols, kblock_width: kw };
        let what = format!("w8 {rows}×{cols} (K-block {kw})");
        assert_eq!(w8_fits(&m, &x), available(), "{what}: the fast path's use is not as expected");
        let nk = cols / kw;
        let (mut want, mut got) = (vec![0.0f32; rows], vec![0.0f32; rows]);
        w8::w8_rows(&m, &x, &mut want);
        w8_rows(&m, &x, &mut got);
        assert!(same(&want, &got), "{what}: rows differ from the twin");
        assert!(want.iter().all(|v| v.is_finite()), "{what}: the rows must be finite");
        let (mut want_p, mut got_p) = (vec![0.0f32; rows * nk], vec![0.0f32; rows * nk]);
        w8::w8_partials(&m, &x, &mut want_p);
        w8_partials(&m, &x, &mut got_p);
        assert!(same(&want_p, &got_p), "{what}: partials differ from the twin");
        if x_kind == 0 && nk > 2 {
            let mut reversed = vec![0.0f32; rows];
            gemv::fold_partials(&got_p, nk, rows, true, &mut reversed);
            assert!(!same(&want[1..], &reversed[1..]), "{what}: a reversed fold must show as a difference");
        }
    }
}

/// Views the fast path does not take go to the twin: its checks still panic.
#[test]
fn a_bad_view_still_meets_the_twins_checks() {
    let codes = vec![0u8; 128 * 128];
    let scales = vec![1.0f32; 1];
    let m = MatrixView {
        w: WeightRef::E4m3 { codes: &codes, scales: &scales, row0: 0 },
        out_features: 128,
        in_features: 128,
        kblock_width: 128,
    };
    let short_x = vec![0.0f32; 64];
    let r = std::panic::catch_unwind(|| gemv_rows(&m, &short_x, &mut [0.0f32; 128]));
    assert!(r.is_err(), "an x of the wrong length must panic as the twin does");
}
