//! Tests of the canonical block GEMV (`memra_kernels::twins::gemv`): rows equal the fold of their
//! K-block partials, column and row shards reproduce the full matrix bit for bit, the fold order
//! is the documented one, and the numbers agree with an f64 reference. Weight values in the f64
//! reference are decoded with formulas written here, independently of `memra_kernels::formats`.

// Reference sums are written `acc = acc + v`: the operand order is what is being tested.
#![allow(clippy::assign_op_pattern)]

use memra_kernels::canon::dot32;
use memra_kernels::twins::gemv::{
    canonical_kblocks, fold_partials, gemv_partials, gemv_rows, gemv_rows_tree, MatrixView, WeightFormat, WeightRef,
};

use crate::util::Rng;

/// E4M3 value by the textbook formula (sign, 4-bit exponent bias 7, 3-bit mantissa).
fn e4m3_value(code: u8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (((code >> 3) & 0xF) as i32, (code & 7) as f64);
    let mag = if e == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) };
    sign * mag
}

/// E2M1 value: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 and a sign bit 0x8.
fn e2m1_value(nib: u8) -> f64 {
    const MAG: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let v = MAG[(nib & 7) as usize];
    if nib & 8 != 0 {
        -v
    } else {
        v
    }
}

/// One test matrix in every storage this module reads, with its exact element values.
enum Store {
    Bf16(Vec<u16>),
    F32(Vec<f32>),
    E4m3 { codes: Vec<u8>, scales: Vec<f32> },
    Nvfp4 { packed: Vec<u8>, scales: Vec<u8> },
}

struct Mat {
    out: usize,
    inp: usize,
    kw: usize,
    store: Store,
}

impl Mat {
    fn view(&self) -> MatrixView<'_> {
        let w = match &self.store {
            Store::Bf16(b) => WeightRef::Bf16(b),
            Store::F32(v) => WeightRef::F32(v),
            Store::E4m3 { codes, scales } => WeightRef::E4m3 { codes, scales, row0: 0 },
            Store::Nvfp4 { packed, scales } => WeightRef::Nvfp4 { packed, scales },
        };
        MatrixView { w, out_features: self.out, in_features: self.inp, kblock_width: self.kw }
    }

    /// The exact value of element (r, c) in f64, by the independent formulas above.
    fn value(&self, r: usize, c: usize) -> f64 {
        let i = r * self.inp + c;
        match &self.store {
            Store::Bf16(b) => f32::from_bits((b[i] as u32) << 16) as f64,
            Store::F32(v) => v[i] as f64,
            Store::E4m3 { codes, scales } => {
                e4m3_value(codes[i]) * scales[(r / 128) * self.inp.div_ceil(128) + c / 128] as f64
            }
            Store::Nvfp4 { packed, scales } => {
                let nib = if i.is_multiple_of(2) { packed[i / 2] & 0xF } else { packed[i / 2] >> 4 };
                e2m1_value(nib) * e4m3_value(scales[i / 16] & 0x7F)
            }
        }
    }

    /// Columns `[c0, c1)` (whole K-blocks) of every row, repacked row-major over the local
    /// columns, as a rank of a row-parallel projection holds them.
    fn shard_cols(&self, c0: usize, c1: usize) -> Mat {
        let (out, inp, w) = (self.out, self.inp, c1 - c0);
        let store = match &self.store {
            Store::Bf16(b) => Store::Bf16((0..out).flat_map(|r| b[r * inp + c0..r * inp + c1].to_vec()).collect()),
            Store::F32(v) => Store::F32((0..out).flat_map(|r| v[r * inp + c0..r * inp + c1].to_vec()).collect()),
            Store::E4m3 { codes, scales } => {
                let sc = inp / 128;
                Store::E4m3 {
                    codes: (0..out).flat_map(|r| codes[r * inp + c0..r * inp + c1].to_vec()).collect(),
                    scales: (0..out.div_ceil(128))
                        .flat_map(|sr| scales[sr * sc + c0 / 128..sr * sc + c1 / 128].to_vec())
                        .collect(),
                }
            }
            Store::Nvfp4 { packed, scales } => Store::Nvfp4 {
                packed: (0..out).flat_map(|r| packed[(r * inp + c0) / 2..(r * inp + c1) / 2].to_vec()).collect(),
                scales: (0..out).flat_map(|r| scales[(r * inp + c0) / 16..(r * inp + c1) / 16].to_vec()).collect(),
            },
        };
        Mat { out, inp: w, kw: self.kw, store }
    }
}

fn random_x(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect()
}

/// BF16 bits of random values (top half of a random f32 in ±[2^-8, 2^2)).
fn random_bf16(rng: &mut Rng, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| {
            let v = rng.uniform(-1.0, 1.0) * 2f32.powi(rng.below(10) as i32 - 8);
            (v.to_bits() >> 16) as u16
        })
        .collect()
}

fn bf16_mat(rng: &mut Rng, out: usize, inp: usize) -> Mat {
    let kw = inp / canonical_kblocks(WeightFormat::Bf16, inp).unwrap();
    Mat { out, inp, kw, store: Store::Bf16(random_bf16(rng, out * inp)) }
}

fn e4m3_mat(rng: &mut Rng, out: usize, inp: usize) -> Mat {
    let kw = inp / canonical_kblocks(WeightFormat::E4m3, inp).unwrap();
    let codes = (0..out * inp)
        .map(|_| loop {
            let c = rng.below(256) as u8;
            if c & 0x7F != 0x7F {
                break c;
            }
        })
        .collect();
    let scales = (0..out.div_ceil(128) * inp.div_ceil(128)).map(|_| rng.uniform(0.25, 4.0) / 448.0).collect();
    Mat { out, inp, kw, store: Store::E4m3 { codes, scales } }
}

fn nvfp4_mat(rng: &mut Rng, out: usize, inp: usize) -> Mat {
    let kw = inp / canonical_kblocks(WeightFormat::Nvfp4, inp).unwrap();
    let packed = (0..out * inp / 2).map(|_| rng.below(256) as u8).collect();
    // Scale codes 0x20..0x50: 2^-3 … 2^3, normal E4M3 values.
    let scales = (0..out * inp / 16).map(|_| 0x20 + rng.below(0x30) as u8).collect();
    Mat { out, inp, kw, store: Store::Nvfp4 { packed, scales } }
}

/// The four storages on shapes that exercise several K-blocks and scale blocks.
fn test_matrices(rng: &mut Rng) -> Vec<(&'static str, Mat)> {
    let bf = bf16_mat(rng, 37, 1000);
    let mirror = match &bf.store {
        Store::Bf16(b) => Store::F32(b.iter().map(|&v| f32::from_bits((v as u32) << 16)).collect()),
        _ => unreachable!(),
    };
    let f32m = Mat { out: bf.out, inp: bf.inp, kw: bf.kw, store: mirror };
    vec![
        ("bf16 37x1000", bf),
        ("f32 mirror 37x1000", f32m),
        ("bf16 9x1024", bf16_mat(rng, 9, 1024)),
        ("e4m3 300x1280", e4m3_mat(rng, 300, 1280)),
        ("e4m3 130x1024", e4m3_mat(rng, 130, 1024)),
        ("e4m3 5x384", e4m3_mat(rng, 5, 384)),
        ("nvfp4 33x1280", nvfp4_mat(rng, 33, 1280)),
        ("nvfp4 7x400", nvfp4_mat(rng, 7, 400)),
    ]
}

fn partials(m: &MatrixView, x: &[f32]) -> Vec<f32> {
    let nk = m.in_features / m.kblock_width;
    let mut p = vec![f32::NAN; nk * m.out_features];
    gemv_partials(m, x, &mut p);
    p
}

fn rows(m: &MatrixView, x: &[f32]) -> Vec<f32> {
    let mut out = vec![f32::NAN; m.out_features];
    gemv_rows(m, x, &mut out);
    out
}

fn fold(parts: &[f32], n_parts: usize, width: usize, reverse: bool) -> Vec<f32> {
    let mut out = vec![f32::NAN; width];
    fold_partials(parts, n_parts, width, reverse, &mut out);
    out
}

/// First index where two vectors differ in bits, with both values.
fn first_divergence(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).enumerate().find(|(_, (x, y))| x.to_bits() != y.to_bits()).map(|(i, (x, y))| (i, *x, *y))
}

fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    if let Some((i, g, w)) = first_divergence(got, want) {
        let n_bad = got.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        panic!("{what}: {n_bad} of {} differ; first at {i}: {g:e} vs {w:e}", got.len());
    }
}

#[test]
fn canonical_kblocks_table() {
    use WeightFormat::*;
    let cases: [(WeightFormat, usize, usize); 12] = [
        (Bf16, 1024, 8),
        (Bf16, 1000, 8),
        (Bf16, 8, 8),
        (E4m3, 1024, 8),
        (E4m3, 4096, 8),
        (E4m3, 1280, 2),
        (E4m3, 384, 1),
        (E4m3, 512, 4),
        (E4m3, 128, 1),
        (Nvfp4, 1280, 8),
        (Nvfp4, 400, 1),
        (Nvfp4, 96, 2),
    ];
    for (f, n, g) in cases {
        assert_eq!(canonical_kblocks(f, n), Ok(g), "{f:?} {n}");
    }
    let err = canonical_kblocks(Bf16, 1001).unwrap_err().to_string();
    assert!(err.contains("1001") && err.contains("8 canonical K-blocks") && err.contains("BF16"), "{err}");
    let err = canonical_kblocks(E4m3, 1000).unwrap_err().to_string();
    assert!(err.contains("1000") && err.contains("128") && err.contains("E4M3"), "{err}");
    let err = canonical_kblocks(Nvfp4, 1000).unwrap_err().to_string();
    assert!(err.contains("1000") && err.contains("16") && err.contains("NVFP4"), "{err}");
    for f in [Bf16, E4m3, Nvfp4] {
        assert!(canonical_kblocks(f, 0).is_err(), "{f:?} width 0 must be refused");
    }
}

#[test]
fn rows_equal_fold_of_partials_bit_for_bit() {
    let mut rng = Rng(21);
    for (name, m) in test_matrices(&mut rng) {
        let v = m.view();
        let x = random_x(&mut rng, m.inp);
        let nk = m.inp / m.kw;
        let p = partials(&v, &x);
        assert!(p.iter().all(|v| v.is_finite()), "{name}: partials not all written");
        assert_bits_eq(name, &rows(&v, &x), &fold(&p, nk, m.out, false));
        // Each partial is exactly the documented formula on the decoded K-block (BF16 / F32 /
        // NVFP4: one dot32; the decoded NVFP4 values are exact products, E4M3 checked below).
        if !matches!(m.store, Store::E4m3 { .. }) {
            for r in 0..m.out {
                for k in 0..nk {
                    let w: Vec<f32> = (k * m.kw..(k + 1) * m.kw).map(|c| m.value(r, c) as f32).collect();
                    let want = dot32(&w, &x[k * m.kw..(k + 1) * m.kw]);
                    assert_eq!(p[k * m.out + r].to_bits(), want.to_bits(), "{name}: partial r={r} k={k}");
                }
            }
        }
    }
}

#[test]
fn e4m3_partial_is_scaled_block_dots_in_column_order() {
    let mut rng = Rng(22);
    let m = e4m3_mat(&mut rng, 130, 1280); // G = 2: 5 scale blocks per K-block
    let (v, x) = (m.view(), random_x(&mut rng, 1280));
    let p = partials(&v, &x);
    let Store::E4m3 { codes, scales } = &m.store else { unreachable!() };
    for r in [0usize, 1, 127, 128, 129] {
        for k in 0..2 {
            let mut acc = 0.0f32;
            for b in k * 5..(k + 1) * 5 {
                let w: Vec<f32> = (b * 128..(b + 1) * 128).map(|c| e4m3_value(codes[r * 1280 + c]) as f32).collect();
                acc = acc + scales[(r / 128) * 10 + b] * dot32(&w, &x[b * 128..(b + 1) * 128]);
            }
            assert_eq!(p[k * 130 + r].to_bits(), acc.to_bits(), "r={r} k={k}");
        }
    }
}

/// The F32 mirror of a BF16 matrix gives the same bits (exact widening changes nothing).
#[test]
fn f32_mirror_equals_bf16() {
    let mut rng = Rng(23);
    let mats = test_matrices(&mut rng);
    let (bf, f) = (&mats[0].1, &mats[1].1);
    let x = random_x(&mut rng, bf.inp);
    assert_bits_eq("rows", &rows(&bf.view(), &x), &rows(&f.view(), &x));
    assert_bits_eq("partials", &partials(&bf.view(), &x), &partials(&f.view(), &x));
    let (mut a, mut b) = (vec![0.0; bf.out], vec![0.0; bf.out]);
    gemv_rows_tree(&bf.view(), &x, &mut a);
    gemv_rows_tree(&f.view(), &x, &mut b);
    assert_bits_eq("tree rows", &a, &b);
}

/// Row-parallel sharding: partials computed on a column shard of whole K-blocks (repacked
/// row-major) equal the full matrix's partials for those K-blocks, and the root's fold of the
/// gathered partials equals the whole rows — for every TP that divides G.
#[test]
fn column_shards_reproduce_full_partials() {
    let mut rng = Rng(24);
    for (name, m) in test_matrices(&mut rng) {
        let x = random_x(&mut rng, m.inp);
        let nk = m.inp / m.kw;
        let full = partials(&m.view(), &x);
        let whole = rows(&m.view(), &x);
        for tp in [1usize, 2, 4, 8].into_iter().filter(|tp| nk % tp == 0) {
            let per = nk / tp;
            let mut gathered = vec![f32::NAN; nk * m.out];
            for rank in 0..tp {
                let (k0, k1) = (rank * per, (rank + 1) * per);
                let s = m.shard_cols(k0 * m.kw, k1 * m.kw);
                let local = partials(&s.view(), &x[k0 * m.kw..k1 * m.kw]);
                assert_bits_eq(&format!("{name} TP{tp} rank {rank}"), &local, &full[k0 * m.out..k1 * m.out]);
                gathered[k0 * m.out..k1 * m.out].copy_from_slice(&local);
            }
            assert_bits_eq(&format!("{name} TP{tp} fold"), &fold(&gathered, nk, m.out, false), &whole);
        }
    }
}

/// Column-parallel sharding: a contiguous range of rows — for E4M3 starting mid scale block,
/// carrying the covering scale rows and `row0` — gives the same rows as the full matrix.
#[test]
fn row_shards_reproduce_full_rows() {
    let mut rng = Rng(25);
    for (name, m) in test_matrices(&mut rng) {
        let x = random_x(&mut rng, m.inp);
        let whole = rows(&m.view(), &x);
        let whole_tree = {
            let mut t = vec![0.0; m.out];
            gemv_rows_tree(&m.view(), &x, &mut t);
            t
        };
        let mut cuts = vec![(0, m.out), (1, m.out), (0, m.out / 3 + 1), (m.out / 2, m.out)];
        for _ in 0..6 {
            let a = rng.below(m.out);
            cuts.push((a, a + 1 + rng.below(m.out - a)));
        }
        for (a, b) in cuts {
            let n = m.inp;
            let shard_rows = b - a;
            let w = match &m.store {
                Store::Bf16(v) => WeightRef::Bf16(&v[a * n..b * n]),
                Store::F32(v) => WeightRef::F32(&v[a * n..b * n]),
                Store::E4m3 { codes, scales } => {
                    let sc = n / 128;
                    WeightRef::E4m3 {
                        codes: &codes[a * n..b * n],
                        scales: &scales[(a / 128) * sc..((b - 1) / 128 + 1) * sc],
                        row0: a,
                    }
                }
                Store::Nvfp4 { packed, scales } => {
                    WeightRef::Nvfp4 { packed: &packed[a * n / 2..b * n / 2], scales: &scales[a * n / 16..b * n / 16] }
                }
            };
            let v = MatrixView { w, out_features: shard_rows, in_features: n, kblock_width: m.kw };
            assert_bits_eq(&format!("{name} rows {a}..{b}"), &rows(&v, &x), &whole[a..b]);
            let mut t = vec![0.0; shard_rows];
            gemv_rows_tree(&v, &x, &mut t);
            assert_bits_eq(&format!("{name} tree rows {a}..{b}"), &t, &whole_tree[a..b]);
        }
    }
}

/// `MatrixView::rows` (how a host splits one launch over threads): the rows and partials of
/// sub-views — and of sub-views of sub-views, whose E4M3 scale rows start mid block — are the
/// whole view's bits.
#[test]
fn sub_views_reproduce_the_whole_view() {
    let mut rng = Rng(31);
    for (name, m) in test_matrices(&mut rng) {
        let x = random_x(&mut rng, m.inp);
        let view = m.view();
        let (whole, whole_parts) = (rows(&view, &x), partials(&view, &x));
        let nk = m.inp / m.kw;
        let mut cuts = vec![(0, m.out), (0, 1), (m.out - 1, m.out)];
        for _ in 0..6 {
            let a = rng.below(m.out);
            cuts.push((a, a + 1 + rng.below(m.out - a)));
        }
        for (a, b) in cuts {
            let sub = view.rows(a..b);
            assert_bits_eq(&format!("{name} rows {a}..{b}"), &rows(&sub, &x), &whole[a..b]);
            let p = partials(&sub, &x);
            for k in 0..nk {
                let want = &whole_parts[k * m.out + a..k * m.out + b];
                assert_bits_eq(
                    &format!("{name} partials {a}..{b} K-block {k}"),
                    &p[k * (b - a)..(k + 1) * (b - a)],
                    want,
                );
            }
            let mid = (b - a) / 2;
            let nested = sub.rows(mid..b - a);
            assert_bits_eq(
                &format!("{name} rows {}..{b} of {a}..{b}", a + mid),
                &rows(&nested, &x),
                &whole[a + mid..b],
            );
        }
    }
}

/// One-hot inputs read single weights back: checks the decode tables, the E4M3 scale indexing
/// (including a row shard that starts mid scale block) and the NVFP4 nibble order against the
/// independent formulas.
#[test]
fn one_hot_inputs_read_back_element_values() {
    let mut rng = Rng(26);
    for (name, m) in test_matrices(&mut rng) {
        for _ in 0..40 {
            let c = rng.below(m.inp);
            let mut x = vec![0.0f32; m.inp];
            x[c] = 1.0;
            let got = rows(&m.view(), &x);
            for (r, &g) in got.iter().enumerate() {
                // E4M3: scale * (decode * 1) rounds once, like the f32 product of the two.
                let want = match &m.store {
                    Store::E4m3 { codes, scales } => {
                        scales[(r / 128) * m.inp.div_ceil(128) + c / 128] * e4m3_value(codes[r * m.inp + c]) as f32
                    }
                    _ => m.value(r, c) as f32,
                };
                assert_eq!(g, want, "{name}: element ({r}, {c})");
            }
        }
    }
}

#[test]
fn fold_order_and_signed_zero() {
    assert_eq!(fold(&[-0.0], 1, 1, false)[0].to_bits(), 0.0f32.to_bits(), "fold of [-0.0] is +0.0");
    assert_eq!(fold(&[-0.0], 1, 1, true)[0].to_bits(), 0.0f32.to_bits());
    assert_eq!(fold(&[-0.0, -0.0, -0.0], 3, 1, false)[0].to_bits(), 0.0f32.to_bits());
    assert_eq!(fold(&[], 0, 3, false), vec![0.0; 3]);
    // Crafted: forward ((0 + 1) + 1e8) − 1e8 = 0 (1 is lost); reverse ((0 − 1e8) + 1e8) + 1 = 1.
    let parts = [1.0f32, 1.0e8, -1.0e8];
    assert_eq!(fold(&parts, 3, 1, false), vec![0.0]);
    assert_eq!(fold(&parts, 3, 1, true), vec![1.0]);
    // Layout [part][width]: width 2, two parts.
    assert_eq!(fold(&[1.0, 2.0, 10.0, 20.0], 2, 2, false), vec![11.0, 22.0]);
}

/// Negative control: the CANARY (reverse) fold of real partials must differ from the canonical
/// rows somewhere — otherwise the bit-equality tests above could not see an order change.
#[test]
fn reverse_fold_is_observably_different() {
    let mut rng = Rng(27);
    let m = bf16_mat(&mut rng, 256, 1024);
    let x = random_x(&mut rng, 1024);
    let p = partials(&m.view(), &x);
    let fwd = fold(&p, 8, 256, false);
    let rev = fold(&p, 8, 256, true);
    assert_bits_eq("forward fold", &fwd, &rows(&m.view(), &x));
    let n_diff = fwd.iter().zip(&rev).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert!(n_diff > 10, "reverse fold differs in only {n_diff} of 256 rows");
}

/// Agreement with an f64 reference: |got − ref| ≤ depth · 2^−24 · Σ|w·x|, where depth counts the
/// roundings on the longest path: the product, the lane adds (ceil(len/32) for a dot over len
/// elements), the 5 butterfly adds, for E4M3 the scale multiply and the block fold (kw/128 adds),
/// and the G-fold adds — for 1280 E4M3 columns at G = 2: 1 + 4 + 5 + 1 + 5 + 2 = 18.
/// The tree: the product (+1 for the E4M3 scale · decode) and log2 P levels.
#[test]
fn rows_agree_with_f64_reference() {
    let mut rng = Rng(28);
    for (name, m) in test_matrices(&mut rng) {
        let x = random_x(&mut rng, m.inp);
        let got = rows(&m.view(), &x);
        let mut tree = vec![0.0; m.out];
        gemv_rows_tree(&m.view(), &x, &mut tree);
        let nk = m.inp / m.kw;
        let is_e4m3 = matches!(m.store, Store::E4m3 { .. });
        let depth = if is_e4m3 { 1 + 128 / 32 + 5 + 1 + m.kw / 128 + nk } else { 1 + m.kw.div_ceil(32) + 5 + nk };
        let tree_depth = 1 + is_e4m3 as usize + m.inp.next_power_of_two().trailing_zeros() as usize;
        for r in 0..m.out {
            let exact: f64 = (0..m.inp).map(|c| m.value(r, c) * x[c] as f64).sum();
            let abs: f64 = (0..m.inp).map(|c| (m.value(r, c) * x[c] as f64).abs()).sum();
            let bound = depth as f64 * 2f64.powi(-24) * abs;
            assert!(
                (got[r] as f64 - exact).abs() <= bound,
                "{name} row {r}: {:e} vs f64 {exact:e} (bound {bound:e})",
                got[r]
            );
            let bound = tree_depth as f64 * 2f64.powi(-24) * abs;
            assert!((tree[r] as f64 - exact).abs() <= bound, "{name} tree row {r}: {:e} vs {exact:e}", tree[r]);
        }
    }
}

/// The independent pairwise tree: products padded with +0 to a power of two, adjacent pairs.
fn tree_reference(w: &[f32], x: &[f32]) -> f32 {
    let mut v: Vec<f32> = w.iter().zip(x).map(|(a, b)| a * b).collect();
    v.resize(w.len().next_power_of_two(), 0.0);
    while v.len() > 1 {
        v = v.chunks(2).map(|p| p[0] + p[1]).collect();
    }
    v[0]
}

/// QKV_FUSED arithmetic: exactly the documented tree, different bits from the canonical rows in
/// many rows, yet close to them relative to Σ|w·x|.
#[test]
fn tree_rows_follow_the_tree_and_differ_from_canonical() {
    let mut rng = Rng(29);
    for (name, m) in test_matrices(&mut rng) {
        let x = random_x(&mut rng, m.inp);
        let canon = rows(&m.view(), &x);
        let mut tree = vec![f32::NAN; m.out];
        gemv_rows_tree(&m.view(), &x, &mut tree);
        let mut n_diff = 0;
        for r in 0..m.out {
            let w: Vec<f32> = (0..m.inp)
                .map(|c| match &m.store {
                    Store::E4m3 { codes, scales } => {
                        scales[(r / 128) * m.inp.div_ceil(128) + c / 128] * e4m3_value(codes[r * m.inp + c]) as f32
                    }
                    _ => m.value(r, c) as f32,
                })
                .collect();
            assert_eq!(tree[r].to_bits(), tree_reference(&w, &x).to_bits(), "{name}: tree row {r}");
            let abs: f64 = w.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let diff = (tree[r] as f64 - canon[r] as f64).abs();
            assert!(diff <= 32.0 * 2f64.powi(-24) * abs, "{name} row {r}: tree {:e} canonical {:e}", tree[r], canon[r]);
            n_diff += (tree[r].to_bits() != canon[r].to_bits()) as usize;
        }
        assert!(n_diff * 4 >= m.out, "{name}: tree differs from canonical in only {n_diff} of {} rows", m.out);
    }
    // Empty rows and the all −0 case: +0 padding.
    let v = MatrixView { w: WeightRef::F32(&[]), out_features: 3, in_features: 0, kblock_width: 0 };
    let mut out = vec![f32::NAN; 3];
    gemv_rows_tree(&v, &[], &mut out);
    assert_eq!(out, vec![0.0; 3]);
    gemv_rows(&v, &[], &mut out);
    assert!(out.iter().all(|v| v.to_bits() == 0), "empty canonical rows are +0.0");
}

#[test]
#[should_panic(expected = "x has 5 elements")]
fn gemv_rejects_wrong_input_length() {
    let w = vec![0.0f32; 16];
    let v = MatrixView { w: WeightRef::F32(&w), out_features: 2, in_features: 8, kblock_width: 1 };
    gemv_rows(&v, &[0.0; 5], &mut [0.0; 2]);
}

#[test]
#[should_panic(expected = "need 4 scales")]
fn gemv_rejects_e4m3_view_missing_a_scale_row() {
    // Rows 100..228 span scale rows 0 and 1: two scale rows × 2 scale columns are needed.
    let codes = vec![0x38u8; 128 * 256];
    let scales = vec![1.0f32; 2];
    let v = MatrixView {
        w: WeightRef::E4m3 { codes: &codes, scales: &scales, row0: 100 },
        out_features: 128,
        in_features: 256,
        kblock_width: 128,
    };
    gemv_rows(&v, &[0.0; 256], &mut [0.0; 128]);
}
