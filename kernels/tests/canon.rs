//! Tests of the canonical scalar math (`memra_kernels::canon`): accuracy against f64, special
//! values, purity, and the exact operation order of the canonical dot product.

// Reference sums are written `acc = acc + v`: the operand order is what is being tested.
#![allow(clippy::assign_op_pattern)]

use memra_kernels::canon::{
    butterfly32, dot32, exp_c, rmsnorm_c, rmsnorm_row_c, rsqrt_c, sigmoid_c, silu_c, sum_squares256, swiglu_c,
    swiglu_traced, LANES,
};

use crate::util::Rng;

/// Size of one f32 ULP at the magnitude of `v` (subnormals: 2^−149).
fn ulp_f32(v: f64) -> f64 {
    let a = v.abs();
    if a == 0.0 {
        return 2f64.powi(-149);
    }
    let e = (((a.to_bits() >> 52) as i32) - 1023).max(-126);
    2f64.powi(e - 23)
}

/// Error of `got` against the exact value `r`, in f32 ULPs of `r`. NaN never passes.
fn ulp_err(got: f32, r: f64) -> f64 {
    if got.is_nan() {
        return f64::INFINITY;
    }
    if got.is_infinite() && (r as f32).is_infinite() && got.signum() as f64 == r.signum() {
        return 0.0;
    }
    ((got as f64) - r).abs() / ulp_f32(r)
}

/// Every f32 from `lo` to `hi` (same sign, |lo| ≤ |hi|) whose bit pattern is a multiple of
/// `stride` apart, plus both end points.
fn strided(lo: f32, hi: f32, stride: u32) -> impl Iterator<Item = f32> {
    let (a, b) = (lo.to_bits(), hi.to_bits());
    (a..=b).step_by(stride as usize).chain(std::iter::once(b)).map(f32::from_bits)
}

/// The inputs of an accuracy sweep: a dense strided sweep of both signs up to the given
/// magnitudes, plus random bit patterns and random uniform values in the range.
fn sweep(neg_max: f32, pos_max: f32, seed: u64) -> Vec<f32> {
    let mut xs: Vec<f32> = strided(0.0, pos_max, 151).chain(strided(-0.0, -neg_max, 151)).collect();
    let mut rng = Rng(seed);
    for _ in 0..200_000 {
        xs.push(rng.uniform(-neg_max, pos_max));
        let bits = (rng.next_u64() >> 32) as u32;
        let x = f32::from_bits(bits);
        if x >= -neg_max && x <= pos_max {
            xs.push(x);
        }
    }
    xs
}

/// Worst ULP error of `f` against `reference` over `xs`: (error, input).
fn worst(xs: &[f32], f: impl Fn(f32) -> f32, reference: impl Fn(f64) -> f64) -> (f64, f32) {
    let mut w = (0.0f64, 0.0f32);
    for &x in xs {
        let e = ulp_err(f(x), reference(x as f64));
        if e > w.0 || e.is_nan() {
            w = (e, x);
        }
    }
    w
}

/// exp_c: measured 0.987 ULP exhaustively over [−104, 88.73] (every f32); asserted ≤ 1.5 here.
#[test]
fn exp_c_within_1_5_ulp_of_f64() {
    let xs = sweep(104.0, f32::from_bits(0x42B1_7217), 1);
    let (e, x) = worst(&xs, exp_c, f64::exp);
    assert!(e <= 1.5, "exp_c: {e} ULP at x = {x:e} ({:#010x})", x.to_bits());
    // The sweep must reach the subnormal results and the top of the range.
    assert!(xs.iter().any(|&x| x < -100.0) && xs.iter().any(|&x| x > 88.0));
}

/// Around the subnormal boundary every result is compared in units of 2^−149 (one rounding).
#[test]
fn exp_c_subnormal_results_are_rounded_once() {
    for x in strided(-87.0, -104.0, 1) {
        let e = ulp_err(exp_c(x), (x as f64).exp());
        assert!(e <= 1.0, "exp_c({x:e}) = {:e}: {e} ULP of 2^-149", exp_c(x));
    }
}

/// sigmoid_c: measured 2.48 ULP exhaustively over every x whose result is normal (≥ −87.33);
/// asserted ≤ 3. Below, the result must be within 2^−126 absolute and never NaN.
#[test]
fn sigmoid_c_within_3_ulp_of_f64() {
    let reference = |x: f64| 1.0 / (1.0 + (-x).exp());
    let xs = sweep(87.33, 120.0, 2);
    let (e, x) = worst(&xs, sigmoid_c, reference);
    assert!(e <= 3.0, "sigmoid_c: {e} ULP at x = {x:e} ({:#010x})", x.to_bits());
    for x in strided(-87.33, -200.0, 1 << 12) {
        let got = sigmoid_c(x);
        assert!(got >= 0.0 && (got as f64 - reference(x as f64)).abs() <= 2f64.powi(-126), "sigmoid_c({x}) = {got}");
    }
}

/// silu_c: measured 2.6 ULP exhaustively over x ≥ −88.72; asserted ≤ 3. Below, −0.0 or a
/// value within 1e−35 absolute, never NaN.
#[test]
fn silu_c_within_3_ulp_of_f64() {
    let reference = |x: f64| x / (1.0 + (-x).exp());
    let xs = sweep(88.72, 1.0e30, 3);
    let (e, x) = worst(&xs, silu_c, reference);
    assert!(e <= 3.0, "silu_c: {e} ULP at x = {x:e} ({:#010x})", x.to_bits());
    for x in strided(-88.72, -1.0e30, 1 << 14) {
        let got = silu_c(x);
        assert!(!got.is_nan() && (got as f64 - reference(x as f64)).abs() <= 1e-35, "silu_c({x}) = {got}");
    }
}

#[test]
fn exp_c_special_values() {
    assert!(exp_c(f32::NAN).is_nan());
    assert!(exp_c(-f32::NAN).is_nan());
    assert_eq!(exp_c(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp_c(f32::NEG_INFINITY).to_bits(), 0.0f32.to_bits());
    assert_eq!(exp_c(0.0).to_bits(), 1.0f32.to_bits());
    assert_eq!(exp_c(-0.0).to_bits(), 1.0f32.to_bits());
    // Overflow edge: 0x42B17217 is the last f32 with a finite exp; the next one overflows.
    let last = f32::from_bits(0x42B1_7217);
    assert!(exp_c(last).is_finite() && exp_c(last) > 3.4e38, "exp_c({last}) = {}", exp_c(last));
    assert_eq!(exp_c(f32::from_bits(0x42B1_7218)), f32::INFINITY);
    assert_eq!(exp_c(f32::MAX), f32::INFINITY);
    // Underflow edge: the smallest subnormal appears just above ln 2^−149.5; below −104 → +0.
    assert_eq!(exp_c(-103.0).to_bits(), 1, "e^-103 ≈ 1.34 · 2^-149 rounds to the smallest subnormal");
    assert_eq!(exp_c(-103.9).to_bits(), 1, "e^-103.9 ≈ 0.55 · 2^-149 rounds up to the smallest subnormal");
    assert_eq!(exp_c(-103.99).to_bits(), 0);
    assert_eq!(exp_c(-104.5).to_bits(), 0);
    assert_eq!(exp_c(f32::MIN).to_bits(), 0);
    // Tiny arguments: exp(±2^-30) rounds to 1.
    assert_eq!(exp_c(f32::from_bits(0x3080_0000)), 1.0);
    assert_eq!(exp_c(f32::from_bits(0xB080_0000)), 1.0);
}

#[test]
fn sigmoid_silu_swiglu_special_values() {
    assert!(sigmoid_c(f32::NAN).is_nan());
    assert_eq!(sigmoid_c(f32::INFINITY), 1.0);
    assert_eq!(sigmoid_c(f32::NEG_INFINITY).to_bits(), 0);
    assert_eq!(sigmoid_c(0.0), 0.5);
    assert_eq!(sigmoid_c(-100.0).to_bits(), 0, "exp_c(100) overflows: documented +0");
    assert_eq!(sigmoid_c(200.0), 1.0);

    assert!(silu_c(f32::NAN).is_nan());
    assert_eq!(silu_c(f32::INFINITY), f32::INFINITY);
    assert_eq!(silu_c(f32::NEG_INFINITY).to_bits(), (-0.0f32).to_bits());
    assert_eq!(silu_c(-100.0).to_bits(), (-0.0f32).to_bits(), "x / inf = -0");
    assert_eq!(silu_c(0.0).to_bits(), 0);
    assert_eq!(silu_c(-0.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(silu_c(1.0e30), 1.0e30);

    // swiglu: silu arm clamped above only, linear arm symmetrically.
    let (g, u) = (20.0f32, 30.0f32);
    assert_eq!(swiglu_c(g, u, None).to_bits(), (silu_c(g) * u).to_bits());
    assert_eq!(swiglu_c(g, u, Some(7.0)), 49.0);
    assert_eq!(swiglu_c(g, -u, Some(7.0)), -49.0);
    assert_eq!(swiglu_c(-20.0, -u, Some(7.0)).to_bits(), (silu_c(-20.0) * -7.0).to_bits(), "no clamp below");
    assert_eq!(swiglu_c(1.0, 2.0, Some(7.0)).to_bits(), (silu_c(1.0) * 2.0).to_bits());
    assert!(swiglu_c(f32::NAN, 1.0, Some(7.0)).is_nan(), "NaN gate propagates through the clamp");
    assert!(swiglu_c(1.0, f32::NAN, Some(7.0)).is_nan(), "NaN up propagates through the clamp");
    assert_eq!(swiglu_c(f32::NEG_INFINITY, 3.0, Some(7.0)).to_bits(), (-0.0f32).to_bits());
    // The clamps applied, side by side with the value (coverage counts these).
    let flags = |g: f32, u: f32, l: Option<f32>| {
        let (v, c) = swiglu_traced(g, u, l);
        assert_eq!(v.to_bits(), swiglu_c(g, u, l).to_bits());
        (c.silu, c.up_high, c.up_low)
    };
    assert_eq!(flags(g, u, Some(7.0)), (true, true, false));
    assert_eq!(flags(g, -u, Some(7.0)), (true, false, true));
    assert_eq!(flags(1.0, 2.0, Some(7.0)), (false, false, false));
    assert_eq!(flags(g, u, None), (false, false, false));
    assert_eq!(flags(f32::NAN, f32::NAN, Some(7.0)), (false, false, false), "NaN reaches no clamp");
}

/// Same input → same bits, whatever was computed before (no hidden state, no call-order effect).
#[test]
fn canonical_functions_are_pure() {
    let mut rng = Rng(7);
    let xs: Vec<f32> = (0..4096).map(|_| rng.uniform(-100.0, 100.0)).collect();
    let run = |order: &[usize]| -> Vec<u32> {
        let mut out = vec![0u32; xs.len() * 3];
        for &i in order {
            out[3 * i] = exp_c(xs[i]).to_bits();
            out[3 * i + 1] = sigmoid_c(xs[i]).to_bits();
            out[3 * i + 2] = silu_c(xs[i]).to_bits();
        }
        out
    };
    let forward: Vec<usize> = (0..xs.len()).collect();
    let backward: Vec<usize> = (0..xs.len()).rev().collect();
    let mut shuffled = forward.clone();
    for i in (1..shuffled.len()).rev() {
        shuffled.swap(i, rng.below(i + 1));
    }
    let a = run(&forward);
    assert_eq!(a, run(&forward));
    assert_eq!(a, run(&backward));
    assert_eq!(a, run(&shuffled));
    let threaded = std::thread::scope(|s| s.spawn(|| run(&shuffled)).join().unwrap());
    assert_eq!(a, threaded);
}

/// The documented dot order, written out independently: 32 explicit lane accumulators filled
/// element by element, then the full 32-lane xor-butterfly (every lane updated from a copy).
fn dot32_reference(w: &[f32], x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 32];
    for i in 0..w.len() {
        let prod = w[i] * x[i];
        lanes[i % 32] = lanes[i % 32] + prod;
    }
    for o in [16usize, 8, 4, 2, 1] {
        let prev = lanes;
        for l in 0..32 {
            lanes[l] = prev[l] + prev[l ^ o];
        }
    }
    // All lanes agree (commutativity of IEEE addition), so lane 0 is every lane.
    for l in 1..32 {
        assert_eq!(lanes[l].to_bits(), lanes[0].to_bits(), "butterfly lane {l} differs from lane 0");
    }
    lanes[0]
}

fn random_vec(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0) * if rng.below(8) == 0 { 64.0 } else { 1.0 }).collect()
}

#[test]
fn dot32_matches_independent_reference_bit_for_bit() {
    let mut rng = Rng(11);
    let mut lens: Vec<usize> = (0..=70).collect();
    lens.extend([95, 96, 97, 127, 128, 129, 512, 1000, 1024, 1280, 4096]);
    lens.extend((0..100).map(|_| rng.below(3000)));
    for &n in &lens {
        let w = random_vec(&mut rng, n);
        let x = random_vec(&mut rng, n);
        let got = dot32(&w, &x);
        let want = dot32_reference(&w, &x);
        assert_eq!(got.to_bits(), want.to_bits(), "n = {n}: dot32 {got:e} vs reference {want:e}");
    }
}

/// The canonical order is not just "some" order: a sequential left-to-right sum differs on
/// crafted data, and the reference above would catch a dot32 that used it.
#[test]
fn dot32_order_is_observable() {
    // 1e8 in lane 0, then −1e8 at element 32 (same lane) and 1.0 at element 1 (lane 1).
    let mut w = vec![0.0f32; 64];
    w[0] = 1.0e8;
    w[1] = 1.0;
    w[32] = -1.0e8;
    let x = vec![1.0f32; 64];
    // Canonical: lane 0 = 1e8 + −1e8 = 0, lane 1 = 1 → 1.
    assert_eq!(dot32(&w, &x), 1.0);
    // Sequential: (1e8 + 1) rounds to 1e8, then − 1e8 = 0.
    let seq = w.iter().zip(&x).fold(0.0f32, |a, (w, x)| a + w * x);
    assert_eq!(seq, 0.0);
}

#[test]
fn dot32_within_bound_of_f64() {
    let mut rng = Rng(12);
    for _ in 0..200 {
        let n = rng.below(5000);
        let w = random_vec(&mut rng, n);
        let x = random_vec(&mut rng, n);
        let exact: f64 = w.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let abs: f64 = w.iter().zip(&x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
        // Each product rounds once, each lane adds ≤ ceil(n/32) times, the butterfly 5 times.
        let depth = n.div_ceil(32) + 5 + 1;
        let bound = depth as f64 * 2f64.powi(-24) * abs;
        let got = dot32(&w, &x) as f64;
        assert!((got - exact).abs() <= bound, "n = {n}: dot32 {got:e}, f64 {exact:e}, bound {bound:e}");
    }
}

#[test]
fn dot32_signed_zeros() {
    assert_eq!(dot32(&[], &[]).to_bits(), 0.0f32.to_bits(), "empty dot is +0.0");
    for n in [1usize, 5, 32, 33, 100] {
        let w = vec![-0.0f32; n];
        let x = vec![1.0f32; n];
        assert_eq!(dot32(&w, &x).to_bits(), 0.0f32.to_bits(), "n = {n}: all −0 products give +0");
        let w = vec![-1.0f32; n];
        let x = vec![0.0f32; n];
        assert_eq!(dot32(&w, &x).to_bits(), 0.0f32.to_bits(), "n = {n}: −1 · +0 products give +0");
    }
    // A sequential fold seeded with the first product would give −0 here.
    let seq = [-0.0f32].iter().fold(None, |a: Option<f32>, &p| Some(a.map_or(p, |a| a + p)));
    assert_eq!(seq.unwrap().to_bits(), (-0.0f32).to_bits());
}

#[test]
#[should_panic(expected = "dot32")]
fn dot32_rejects_mismatched_lengths() {
    dot32(&[1.0, 2.0], &[1.0]);
}

#[test]
fn butterfly32_is_the_full_butterfly() {
    let mut rng = Rng(13);
    for _ in 0..1000 {
        let lanes: [f32; LANES] =
            std::array::from_fn(|_| rng.uniform(-1.0, 1.0) * 2f32.powi(rng.below(40) as i32 - 20));
        let mut v = lanes;
        for o in [16usize, 8, 4, 2, 1] {
            let prev = v;
            for l in 0..32 {
                v[l] = prev[l] + prev[l ^ o];
            }
        }
        assert_eq!(butterfly32(lanes).to_bits(), v[0].to_bits());
        for l in 0..32 {
            assert_eq!(v[l].to_bits(), v[0].to_bits(), "lane {l} disagrees with lane 0");
        }
    }
    // Not a sequential sum: lanes [1e8, 1, 0 … 0, −1e8 at 16]: butterfly pairs 0 and 16 first.
    let mut lanes = [0.0f32; LANES];
    lanes[0] = 1.0e8;
    lanes[1] = 1.0;
    lanes[16] = -1.0e8;
    assert_eq!(butterfly32(lanes), 1.0);
}

#[test]
fn rmsnorm_c_follows_its_formula() {
    let mut rng = Rng(14);
    for n in [1usize, 7, 128, 1024, 1000] {
        let x = random_vec(&mut rng, n);
        let w = random_vec(&mut rng, n);
        let eps = 1.0e-6f32;
        let mut y = vec![f32::NAN; n];
        rmsnorm_c(&x, &w, eps, &mut y);
        let ss = dot32_reference(&x, &x);
        let inv = 1.0f32 / (ss / n as f32 + eps).sqrt();
        assert_eq!(rsqrt_c(ss / n as f32 + eps).to_bits(), inv.to_bits());
        // And it is an RMSNorm: within a few ULP of the f64 formula (bound ~ (n/32 + 10) · 2^-24).
        let ms: f64 = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
        for i in 0..n {
            assert_eq!(y[i].to_bits(), ((x[i] * inv) * w[i]).to_bits(), "n = {n}, i = {i}");
            let want = x[i] as f64 / (ms + eps as f64).sqrt() * w[i] as f64;
            assert!((y[i] as f64 - want).abs() <= 1e-5 * want.abs(), "n = {n}, i = {i}: {} vs {want}", y[i]);
        }
    }
    let mut y: [f32; 0] = [];
    rmsnorm_c(&[], &[], 1e-6, &mut y);
}

/// The documented 256-lane order, written out independently: 256 explicit lane accumulators
/// filled element by element, a full 32-lane xor-butterfly per warp (every lane updated from a
/// copy, as the device does it), then the 8 warp sums folded in halves.
fn sum_squares256_reference(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 256];
    for (i, &v) in x.iter().enumerate() {
        let prod = v * v;
        lanes[i % 256] = lanes[i % 256] + prod;
    }
    let mut warps = [0.0f32; 8];
    for w in 0..8 {
        let mut l32: [f32; 32] = lanes[32 * w..32 * w + 32].try_into().unwrap();
        for o in [16usize, 8, 4, 2, 1] {
            let prev = l32;
            for l in 0..32 {
                l32[l] = prev[l] + prev[l ^ o];
            }
        }
        warps[w] = l32[0];
    }
    let h4: Vec<f32> = (0..4).map(|w| warps[w] + warps[w + 4]).collect();
    let h2: Vec<f32> = (0..2).map(|w| h4[w] + h4[w + 2]).collect();
    h2[0] + h2[1]
}

#[test]
fn sum_squares256_matches_independent_reference_bit_for_bit() {
    let mut rng = Rng(21);
    let mut lens: Vec<usize> = (0..=40).collect();
    lens.extend([255, 256, 257, 511, 512, 1000, 1024, 2048, 4095, 4096, 4097, 8192]);
    lens.extend((0..60).map(|_| rng.below(9000)));
    for &n in &lens {
        let x = random_vec(&mut rng, n);
        let (got, want) = (sum_squares256(&x), sum_squares256_reference(&x));
        assert_eq!(got.to_bits(), want.to_bits(), "n = {n}: sum_squares256 {got:e} vs reference {want:e}");
    }
    assert_eq!(sum_squares256(&[]).to_bits(), 0.0f32.to_bits(), "the empty sum is +0.0");
    assert_eq!(sum_squares256(&[-0.0; 300]).to_bits(), 0.0f32.to_bits(), "squares of −0 sum to +0");
}

/// The 256-lane order is observable: with 2^24 in element 0 and 1.0 in elements 32 and 33, the
/// 256-lane tree adds the two ones first (both in warp 1) and keeps them (2^24 + 2), while dot32
/// puts element 32 into lane 0 with 2^24, where (2^24 + 1) rounds back to 2^24 (ties to even).
#[test]
fn sum_squares256_order_is_observable() {
    let mut y = vec![0.0f32; 64];
    y[0] = 4096.0;
    y[32] = 1.0;
    y[33] = 1.0;
    // 256 lanes: every element its own lane; warp 0 butterfly pairs lane 0 with 16, 8, 4, 2, 1
    // (zeros), then lanes 32 and 33 (warp 1) give 2 → folded: 2^24 + 2 exactly.
    assert_eq!(sum_squares256(&y), 16_777_218.0);
    // dot32 puts element 32 into lane 0: (2^24 + 1) rounds to 2^24, then + 1 again: 2^24.
    assert_eq!(dot32(&y, &y), 16_777_216.0);
}

#[test]
fn rmsnorm_row_c_follows_its_formula() {
    let mut rng = Rng(15);
    for n in [1usize, 7, 255, 256, 1024, 4096, 1000] {
        let x = random_vec(&mut rng, n);
        let w = random_vec(&mut rng, n);
        let eps = 1.0e-6f32;
        let mut y = vec![f32::NAN; n];
        rmsnorm_row_c(&x, &w, eps, &mut y);
        let inv = 1.0f32 / (sum_squares256_reference(&x) / n as f32 + eps).sqrt();
        let ms: f64 = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
        for i in 0..n {
            assert_eq!(y[i].to_bits(), ((x[i] * inv) * w[i]).to_bits(), "n = {n}, i = {i}");
            let want = x[i] as f64 / (ms + eps as f64).sqrt() * w[i] as f64;
            assert!((y[i] as f64 - want).abs() <= 1e-5 * want.abs(), "n = {n}, i = {i}: {} vs {want}", y[i]);
        }
    }
}

/// FNV-1a over the bit patterns of `f` on every 4099th f32 of [−105, 90] (≈ 0.5 M inputs, both
/// signs, subnormal results included) plus the special values.
fn digest(f: impl Fn(f32) -> f32) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    let specials = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN, 1.0e-45, -1.0e-45];
    let xs = strided(0.0, 90.0, 4099).chain(strided(-0.0, -105.0, 4099)).chain(specials);
    for x in xs {
        for byte in f(x).to_bits().to_le_bytes() {
            h = (h ^ byte as u64).wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
    h
}

/// Regression pin of the canonical definition itself. Accuracy bounds cannot see a change of a
/// coefficient's last bit, but the CUDA twin must reproduce these exact bits: a change here is a
/// change of the canonical program and must be made on both sides (then update the pins).
#[test]
fn canonical_bits_are_pinned() {
    assert_eq!(exp_c(1.0).to_bits(), 0x402D_F854, "exp_c(1) = 2.7182817 (correctly rounded e)");
    assert_eq!(exp_c(-1.0).to_bits(), 0x3EBC_5AB2, "exp_c(-1) = 0.36787945");
    let got = [digest(exp_c), digest(sigmoid_c), digest(silu_c)];
    assert_eq!(
        got,
        [0xD56D_2423_D6FE_04C9, 0xDCE4_C222_D90A_786B, 0x6091_CD3D_4502_E3FB],
        "canonical digests (exp_c, sigmoid_c, silu_c)"
    );
}
