//! Property and exhaustive tests of the bit-exact weight formats (docs/DESIGN.md §3.3) against references
//! that share no code with the codecs: the `float8` and `half` crates, hand-written value tables, and
//! brute-force "nearest representable value" searches written here.

use float8::F8E4M3;
use half::bf16;
use memra_kernels::formats::{
    bf16_from_f32, bf16_to_f32, e2m1_decode, e2m1_encode, e4m3_block_dequant, e4m3_block_quantize,
    e4m3_block_quantize_into, e4m3_decode, e4m3_encode, e4m3_encode_branchless, ue4m3_decode, ue4m3_encode,
    Nvfp4Matrix, E4M3_BLOCK, E4M3_MAX, E4M3_NAN, NVFP4_GROUP,
};
use memra_kernels::KernelError;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// References
// ---------------------------------------------------------------------------------------------

/// E4M3 magnitude of a code's low 7 bits from the OCP definition, in f64 (0x7F is NaN, excluded).
fn e4m3_reference_magnitude(code: u8) -> f64 {
    let exp = ((code >> 3) & 0xF) as i32;
    let man = (code & 0x7) as f64;
    if exp == 0 {
        man / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f64.powi(exp - 7)
    }
}

/// Nearest finite E4M3 of the same sign (ties to the even code), by brute force over the 127 finite
/// magnitudes 0x00..=0x7E. "Nearest finite value" is exactly the saturating policy for |x| > 448;
/// ±inf has no distance, so the policy is written out for it (and for every |x| ≥ 448).
fn e4m3_nearest_reference(x: f32) -> u8 {
    assert!(!x.is_nan());
    let sign = if x.is_sign_negative() { 0x80 } else { 0x00 };
    if x.is_infinite() {
        return sign | 0x7E;
    }
    let a = (x as f64).abs();
    if a >= 448.0 {
        // Nothing is nearer than the largest value; said explicitly because f64 distances to 416
        // and 448 become equal for huge |x|.
        return sign | 0x7E;
    }
    let (mut best, mut best_d) = (0u8, f64::INFINITY);
    for c in 0u8..=0x7E {
        let d = (a - e4m3_reference_magnitude(c)).abs();
        if d < best_d || (d == best_d && c % 2 == 0) {
            best = c;
            best_d = d;
        }
    }
    sign | best
}

/// E2M1 magnitudes by code, from the format definition.
const E2M1_TABLE: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Nearest E2M1 of the same sign (ties to the even code) by brute force; saturates at ±6.
fn e2m1_nearest_reference(x: f32) -> u8 {
    assert!(!x.is_nan());
    let sign = if x.is_sign_negative() { 0x8 } else { 0x0 };
    if x.is_infinite() {
        return sign | 0x7;
    }
    let a = (x as f64).abs();
    if a >= 6.0 {
        // Nothing is nearer than the largest value (f64 distances to 4 and 6 tie for huge |x|).
        return sign | 0x7;
    }
    let (mut best, mut best_d) = (0u8, f64::INFINITY);
    for (c, &m) in E2M1_TABLE.iter().enumerate() {
        let d = (a - m).abs();
        if d < best_d || (d == best_d && c % 2 == 0) {
            best = c as u8;
            best_d = d;
        }
    }
    sign | best
}

/// Pack nibbles low nibble first, written independently of the quantizer.
fn pack_low_first(nibbles: &[u8]) -> Vec<u8> {
    nibbles.chunks(2).map(|p| (p[0] & 0xF) | ((p[1] & 0xF) << 4)).collect()
}

/// First index where two code slices differ, for a readable failure.
fn first_diff<T: PartialEq + Copy + std::fmt::Debug>(got: &[T], want: &[T]) -> Option<(usize, T, T)> {
    got.iter().zip(want).enumerate().find(|(_, (g, w))| g != w).map(|(i, (g, w))| (i, *g, *w))
}

/// Deterministic pseudo-random f32 in [-1, 1) (SplitMix64), for fixed matrices.
fn seeded_values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// f32 inputs that stress an 8-bit codec: all bit patterns (NaN payloads, subnormals, ±inf), the
/// E4M3 range, its subnormal range, the neighbourhood of 448 and of the 464 rounding midpoint, and
/// the special values.
fn interesting_f32() -> impl Strategy<Value = f32> {
    let signed = |neg: bool, x: f32| if neg { -x } else { x };
    prop_oneof![
        any::<u32>().prop_map(f32::from_bits),
        -500.0f32..500.0,
        -0.02f32..0.02,
        (any::<bool>(), 400.0f32..530.0).prop_map(move |(n, x)| signed(n, x)),
        (any::<bool>(), -4096i32..4096)
            .prop_map(move |(n, k)| signed(n, f32::from_bits((464f32.to_bits() as i32 + k) as u32))),
        (any::<bool>(), -4096i32..4096)
            .prop_map(move |(n, k)| signed(n, f32::from_bits((448f32.to_bits() as i32 + k) as u32))),
        proptest::num::f32::SUBNORMAL,
        proptest::num::f32::ANY,
        prop::sample::select(vec![
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            448.0,
            -448.0,
            464.0,
            -464.0,
            480.0,
        ]),
    ]
}

/// Adjacent pairs of finite non-negative E4M3 codes with the midpoint of their values (exact in f32:
/// the values have at most 4 significant bits).
fn e4m3_adjacent_midpoints() -> impl Iterator<Item = (u8, u8, f32)> {
    (0u8..0x7E).map(|c| {
        let mid = (e4m3_reference_magnitude(c) + e4m3_reference_magnitude(c + 1)) / 2.0;
        assert_eq!(mid as f32 as f64, mid);
        (c, c + 1, mid as f32)
    })
}

// ---------------------------------------------------------------------------------------------
// E4M3
// ---------------------------------------------------------------------------------------------

#[test]
fn e4m3_decode_matches_float8_all_codes() {
    for c in 0u8..=255 {
        let got = e4m3_decode(c);
        let want = F8E4M3::from_bits(c).to_f32();
        if c & 0x7F == 0x7F {
            assert!(got.is_nan() && want.is_nan(), "code {c:#04x}: got {got}, float8 {want}");
            assert_eq!(got.is_sign_negative(), c & 0x80 != 0, "code {c:#04x}: NaN sign");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "code {c:#04x}: got {got:e}, float8 {want:e}");
        }
    }
}

#[test]
fn e4m3_decode_matches_definition_all_codes() {
    for c in 0u8..=255 {
        let got = e4m3_decode(c);
        if c & 0x7F == 0x7F {
            assert!(got.is_nan(), "code {c:#04x}");
            continue;
        }
        let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
        let want = sign * e4m3_reference_magnitude(c & 0x7F);
        assert_eq!(got as f64, want, "code {c:#04x}");
        assert_eq!(got.is_sign_negative(), c & 0x80 != 0, "code {c:#04x}: sign (±0 included)");
    }
}

#[test]
fn e4m3_decode_known_values() {
    let cases: [(u8, f32); 9] = [
        (0x00, 0.0),
        (0x01, 2f32.powi(-9)),
        (0x07, 7.0 * 2f32.powi(-9)),
        (0x08, 2f32.powi(-6)),
        (0x38, 1.0),
        (0x3C, 1.5),
        (0x7E, 448.0),
        (0xFE, -448.0),
        (0xB8, -1.0),
    ];
    for (c, v) in cases {
        assert_eq!(e4m3_decode(c).to_bits(), v.to_bits(), "code {c:#04x}");
    }
    assert_eq!(e4m3_decode(0x80).to_bits(), (-0.0f32).to_bits());
    assert_eq!(E4M3_MAX, 448.0);
    assert!(e4m3_decode(E4M3_NAN).is_nan());
}

#[test]
fn e4m3_encode_decode_round_trip_all_codes() {
    for c in 0u8..=255 {
        if c & 0x7F == 0x7F {
            assert_eq!(e4m3_encode(e4m3_decode(c)), c, "NaN code {c:#04x} keeps its sign");
        } else {
            assert_eq!(e4m3_encode(e4m3_decode(c)), c, "code {c:#04x} (value {})", e4m3_decode(c));
        }
    }
}

#[test]
fn e4m3_encode_special_values() {
    let cases: [(f32, u8); 16] = [
        (0.0, 0x00),
        (-0.0, 0x80),
        (f32::INFINITY, 0x7E),
        (f32::NEG_INFINITY, 0xFE),
        (f32::NAN, 0x7F),
        (-f32::NAN, 0xFF),
        (f32::MAX, 0x7E),
        (f32::MIN, 0xFE),
        (1e30, 0x7E),
        (480.0, 0x7E),
        (464.0, 0x7E),
        (-464.0, 0xFE),
        (f32::from_bits(1), 0x00),
        (-f32::from_bits(1), 0x80),
        (2f32.powi(-10), 0x00),
        (-(2f32.powi(-10)).next_up(), 0x81),
    ];
    for (x, c) in cases {
        assert_eq!(e4m3_encode(x), c, "encode({x:e})");
    }
    // A NaN with a payload is still NaN, sign kept.
    assert_eq!(e4m3_encode(f32::from_bits(0x7F80_0001)), 0x7F);
    assert_eq!(e4m3_encode(f32::from_bits(0xFFC1_2345)), 0xFF);
}

#[test]
fn e4m3_encode_ties_to_even_at_every_midpoint() {
    for (lo, hi, mid) in e4m3_adjacent_midpoints() {
        let even = if lo % 2 == 0 { lo } else { hi };
        for sign in [0x00u8, 0x80] {
            let s = if sign == 0 { 1.0 } else { -1.0 };
            assert_eq!(e4m3_encode(s * mid), sign | even, "midpoint {mid:e} of {lo:#04x}/{hi:#04x}");
            assert_eq!(e4m3_encode(s * mid.next_down()), sign | lo, "just below {mid:e}");
            assert_eq!(e4m3_encode(s * mid.next_up()), sign | hi, "just above {mid:e}");
        }
    }
    // Past the top: 464 is the midpoint of 448 and the (NaN-coded) 480; saturation above it.
    assert_eq!(e4m3_encode(464f32.next_down()), 0x7E);
    assert_eq!(e4m3_encode(464.0), 0x7E);
    assert_eq!(e4m3_encode(464f32.next_up()), 0x7E);
    assert_eq!(e4m3_encode(-(464f32.next_up())), 0xFE);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn e4m3_encode_matches_float8_and_saturates(x in interesting_f32()) {
        let got = e4m3_encode(x);
        let sign = if x.is_sign_negative() { 0x80 } else { 0x00 };
        if x.is_nan() {
            prop_assert_eq!(got, sign | 0x7F, "NaN {:#010x}", x.to_bits());
        } else if x.abs() > E4M3_MAX {
            // Pinned policy, stated independently of any reference crate.
            prop_assert_eq!(got, sign | 0x7E, "saturation of {:e}", x);
        }
        // float8 0.7 converts with CUDA's satfinite rule, so it agrees everywhere, NaN included.
        let want = F8E4M3::from_f32(x).to_bits();
        prop_assert_eq!(got, want, "encode({:e}) = {:#04x}, float8 {:#04x}", x, got, want);
    }

    #[test]
    fn e4m3_encode_is_nearest_finite_ties_to_even(x in interesting_f32()) {
        prop_assume!(!x.is_nan());
        let got = e4m3_encode(x);
        let want = e4m3_nearest_reference(x);
        prop_assert_eq!(got, want, "encode({:e}) = {:#04x}, brute force {:#04x}", x, got, want);
    }

    #[test]
    fn ue4m3_encode_matches_float8_for_nonnegative(x in interesting_f32()) {
        let got = ue4m3_encode(x);
        prop_assert!(got <= 0x7E, "ue4m3 code {:#04x} out of range for {:e}", got, x);
        if x.is_nan() || x.is_sign_negative() {
            prop_assert_eq!(got, 0, "caller-bug input {:e} maps to 0", x);
        } else {
            prop_assert_eq!(got, F8E4M3::from_f32(x).to_bits(), "ue4m3 encode({:e})", x);
        }
    }
}

#[test]
fn ue4m3_decode_matches_float8_all_codes() {
    for c in 0u8..=0x7E {
        assert_eq!(ue4m3_decode(c).to_bits(), F8E4M3::from_bits(c).to_f32().to_bits(), "code {c:#04x}");
        assert_eq!(ue4m3_encode(ue4m3_decode(c)), c, "round trip {c:#04x}");
    }
    assert_eq!(ue4m3_encode(-1.0), 0);
    assert_eq!(ue4m3_encode(f32::NAN), 0);
    assert_eq!(ue4m3_encode(f32::INFINITY), 0x7E);
    assert_eq!(ue4m3_encode(1000.0), 0x7E);
}

// ---------------------------------------------------------------------------------------------
// BF16
// ---------------------------------------------------------------------------------------------

fn check_bf16_against_half(x: f32) -> Result<(), TestCaseError> {
    let got = bf16_from_f32(x);
    let want = bf16::from_f32(x).to_bits();
    if x.is_nan() {
        let back = bf16_to_f32(got);
        prop_assert!(back.is_nan(), "NaN {:#010x} → {:#06x} is not NaN", x.to_bits(), got);
        prop_assert!(got & 0x0040 != 0, "NaN {:#010x} → {:#06x} is not quiet", x.to_bits(), got);
        prop_assert_eq!(back.is_sign_negative(), x.is_sign_negative(), "NaN sign");
    } else {
        prop_assert_eq!(got, want, "bf16({:e}) = {:#06x}, half {:#06x}", x, got, want);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn bf16_from_f32_matches_half(x in interesting_f32()) {
        check_bf16_against_half(x)?;
    }

    #[test]
    fn bf16_from_f32_matches_half_near_ties(hi in any::<u16>(), low in 0x7FF0u32..0x8010) {
        check_bf16_against_half(f32::from_bits(((hi as u32) << 16) | low))?;
    }
}

#[test]
fn bf16_special_values() {
    let cases: [(f32, u16); 8] = [
        (0.0, 0x0000),
        (-0.0, 0x8000),
        (f32::INFINITY, 0x7F80),
        (f32::NEG_INFINITY, 0xFF80),
        (1.0, 0x3F80),
        (f32::MAX, 0x7F80),                    // rounds past the largest BF16
        (f32::from_bits(0x3F80_8000), 0x3F80), // tie, even stays
        (f32::from_bits(0x3F81_8000), 0x3F82), // tie, odd rounds up
    ];
    for (x, b) in cases {
        assert_eq!(bf16_from_f32(x), b, "bf16({x:e})");
    }
}

#[test]
fn bf16_all_codes_round_trip_and_ties() {
    for b in 0u16..=0xFFFF {
        let x = bf16_to_f32(b);
        let reference = bf16::from_bits(b).to_f32();
        if x.is_nan() {
            assert!(reference.is_nan(), "code {b:#06x}: NaN, half says {reference}");
            assert!(bf16_to_f32(bf16_from_f32(x)).is_nan(), "NaN code {b:#06x}");
            continue;
        }
        assert_eq!(x.to_bits(), reference.to_bits(), "bf16_to_f32({b:#06x}) vs half");
        assert_eq!(bf16_from_f32(x), b, "round trip {b:#06x}");
        if b & 0x7FFF < 0x7F80 {
            // The exact midpoint to the next code (away from zero) goes to the even code.
            let mid = f32::from_bits(((b as u32) << 16) | 0x8000);
            let even = if b % 2 == 0 { b } else { b + 1 };
            assert_eq!(bf16_from_f32(mid), even, "tie above {b:#06x}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// E2M1
// ---------------------------------------------------------------------------------------------

#[test]
fn e2m1_decode_all_codes() {
    for c in 0u8..16 {
        let want = E2M1_TABLE[(c & 7) as usize] * if c & 8 != 0 { -1.0 } else { 1.0 };
        let got = e2m1_decode(c);
        assert_eq!(got as f64, want, "nibble {c:#x}");
        assert_eq!(got.is_sign_negative(), c & 8 != 0, "sign of nibble {c:#x}");
        assert_eq!(e2m1_decode(c | 0xF0).to_bits(), got.to_bits(), "high bits ignored for {c:#x}");
        assert_eq!(e2m1_encode(got), c, "round trip of nibble {c:#x}");
    }
}

#[test]
fn e2m1_encode_midpoints_and_saturation() {
    for c in 0..7usize {
        let mid = ((E2M1_TABLE[c] + E2M1_TABLE[c + 1]) / 2.0) as f32;
        let even = if c % 2 == 0 { c } else { c + 1 } as u8;
        assert_eq!(e2m1_encode(mid), even, "midpoint {mid}");
        assert_eq!(e2m1_encode(-mid), 0x8 | even, "midpoint -{mid}");
        assert_eq!(e2m1_encode(mid.next_down()), c as u8, "below {mid}");
        assert_eq!(e2m1_encode(mid.next_up()), c as u8 + 1, "above {mid}");
    }
    assert_eq!(e2m1_encode(7.0), 0x7);
    assert_eq!(e2m1_encode(f32::INFINITY), 0x7);
    assert_eq!(e2m1_encode(-1e9), 0xF);
    assert_eq!(e2m1_encode(-0.0), 0x8);
    assert_eq!(e2m1_encode(-0.1), 0x8);
    assert_eq!(e2m1_encode(f32::NAN), 0x7);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn e2m1_encode_is_nearest_ties_to_even(x in prop_oneof![-8.0f32..8.0, interesting_f32()]) {
        prop_assume!(!x.is_nan());
        let got = e2m1_encode(x);
        let want = e2m1_nearest_reference(x);
        prop_assert_eq!(got, want, "e2m1({:e}) = {:#x}, brute force {:#x}", x, got, want);
    }
}

// ---------------------------------------------------------------------------------------------
// NVFP4 matrices
// ---------------------------------------------------------------------------------------------

#[test]
fn nvfp4_packs_low_nibble_first_hand_built() {
    // Row 0 holds 6·448 = 2688, so the global scale is exactly 1 and row 0's group scale is 448
    // (code 0x7E). Row 1's amax is 3, so its scale is 0.5 (code 0x30 = 2^-1).
    let row0 = [6.0, 0.5, 1.0, -1.5, 2.0, 3.0, 4.0, -6.0, 0.0, -0.5, 1.5, 0.0, -0.0, 6.0, -2.0, 1.0];
    let row1 = [0.5, 1.0, 0.0, 3.0, -3.0, 0.25, 1.5, 2.0, -1.0, 0.75, 0.0, 0.0, 1.0, -0.5, 0.5, 2.0];
    let mut w: Vec<f32> = row0.iter().map(|v| v * 448.0).collect();
    w.extend_from_slice(&row1);
    let m = Nvfp4Matrix::quantize(&w, 2, 16).unwrap();
    assert_eq!(m.global_scale, 1.0);
    assert_eq!(m.scales, vec![0x7E, 0x30]);
    // Row 0 nibbles: 7 1 2 B 4 5 6 F 0 9 3 0 8 7 C 2; each byte is (low = even element, high = odd).
    // Row 1 divided by its scale 0.5: 1 2 0 6 -6 0.5 3 4 -2 1.5 0 0 2 -1 1 4
    //   → nibbles 2 4 0 7 F 1 5 6 C 3 0 0 4 A 2 6.
    let want: Vec<u8> = vec![
        0x17, 0xB2, 0x54, 0xF6, 0x90, 0x03, 0x78, 0x2C, // row 0
        0x42, 0x70, 0x1F, 0x65, 0x3C, 0x00, 0xA4, 0x62, // row 1
    ];
    assert_eq!(m.packed, want, "packed bytes");
    for r in 0..2 {
        for c in 0..16 {
            let x = w[r * 16 + c];
            assert_eq!(m.element(r, c).to_bits(), x.to_bits(), "element ({r}, {c})");
        }
    }
}

#[test]
fn nvfp4_all_zero_matrix_keeps_zero_signs() {
    let mut w = vec![0.0f32; 32];
    w[1] = -0.0;
    w[18] = -0.0;
    let m = Nvfp4Matrix::quantize(&w, 1, 32).unwrap();
    assert_eq!(m.global_scale, 1.0);
    assert_eq!(m.scales, vec![0, 0]);
    let mut want = vec![0u8; 16];
    want[0] = 0x80;
    want[9] = 0x08;
    assert_eq!(m.packed, want);
    assert_eq!(m.element(0, 1).to_bits(), (-0.0f32).to_bits());
    assert_eq!(m.element(0, 0).to_bits(), 0.0f32.to_bits());
}

#[test]
fn nvfp4_nonzero_group_never_gets_scale_code_zero() {
    // Group 0 sets the global scale to 1; group 1's ideal scale 1e-3/6 is below half the smallest
    // ue4m3 subnormal (2^-10) and would round to code 0.
    let mut w = vec![0.0f32; 32];
    w[0] = 2688.0;
    w[16] = 1e-3;
    w[17] = -1e-3;
    let m = Nvfp4Matrix::quantize(&w, 1, 32).unwrap();
    assert_eq!(m.global_scale, 1.0);
    assert_eq!(m.scales, vec![0x7E, 0x01]);
    // 1e-3 / 2^-9 = 0.512 → 0.5: element = 0.5 · 2^-9.
    assert_eq!(m.element(0, 16), 2f32.powi(-10));
    assert_eq!(m.element(0, 17), -(2f32.powi(-10)));
}

fn contract_parts(e: KernelError) -> (String, String, String) {
    match e {
        KernelError::Contract { what, value, rule } => (what, value, rule),
    }
}

#[test]
fn nvfp4_rejects_bad_width_length_and_non_finite() {
    let (what, value, rule) = contract_parts(Nvfp4Matrix::quantize(&[0.0; 48], 2, 24).unwrap_err());
    assert_eq!((what.as_str(), value.as_str()), ("nvfp4 in_features", "24"));
    assert!(rule.contains("multiple of 16"), "{rule}");

    let (what, value, rule) = contract_parts(Nvfp4Matrix::quantize(&[0.0; 31], 2, 16).unwrap_err());
    assert_eq!((what.as_str(), value.as_str()), ("nvfp4 weight length", "31"));
    assert!(rule.contains("32"), "{rule}");

    for (bad, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf"), (f32::NEG_INFINITY, "-inf")] {
        let mut w = vec![1.0f32; 64];
        w[32 + 3] = bad; // row 1, column 3 of a 2×32 matrix
        let err = Nvfp4Matrix::quantize(&w, 2, 32).unwrap_err();
        let msg = err.to_string();
        let (what, value, rule) = contract_parts(err);
        assert_eq!(what, "nvfp4 weight [1][3]", "{msg}");
        assert_eq!(value, shown, "{msg}");
        assert!(rule.contains("finite"), "{msg}");
    }
}

/// Strategy: an NVFP4 matrix built from its parts so that quantizing its exact values must give the
/// parts back: global scale 2^k, group 0 scale code 0x7E, every group holding a ±6 code.
fn exact_nvfp4_parts() -> impl Strategy<Value = (usize, usize, i32, Vec<u8>, Vec<u8>)> {
    (1usize..4, 1usize..4, -20i32..20).prop_flat_map(|(rows, groups_per_row, k)| {
        let n = rows * groups_per_row * NVFP4_GROUP;
        let n_groups = rows * groups_per_row;
        (
            Just(rows),
            Just(groups_per_row * NVFP4_GROUP),
            Just(k),
            proptest::collection::vec(0u8..16, n),
            proptest::collection::vec(1u8..=0x7E, n_groups),
            proptest::collection::vec((0usize..NVFP4_GROUP, any::<bool>()), n_groups),
        )
            .prop_map(|(rows, cols, k, mut nibbles, mut scales, sixes)| {
                scales[0] = 0x7E;
                for (g, (pos, neg)) in sixes.into_iter().enumerate() {
                    nibbles[g * NVFP4_GROUP + pos] = if neg { 0xF } else { 0x7 };
                }
                (rows, cols, k, nibbles, scales)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn nvfp4_round_trips_exactly_representable((rows, cols, k, nibbles, scales) in exact_nvfp4_parts()) {
        let global = 2f32.powi(k);
        let w: Vec<f32> = nibbles
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let v = E2M1_TABLE[(n & 7) as usize] * e4m3_reference_magnitude(scales[i / NVFP4_GROUP]);
                let v = (v * global as f64) as f32;
                if n & 8 != 0 { -v } else { v }
            })
            .collect();
        let m = Nvfp4Matrix::quantize(&w, rows, cols).unwrap();
        prop_assert_eq!(m.global_scale.to_bits(), global.to_bits());
        prop_assert_eq!(first_diff(&m.scales, &scales), None, "scale codes");
        prop_assert_eq!(first_diff(&m.packed, &pack_low_first(&nibbles)), None, "packed bytes");
        let back = m.dequantize();
        let (gb, wb): (Vec<u32>, Vec<u32>) = back.iter().zip(&w).map(|(a, b)| (a.to_bits(), b.to_bits())).unzip();
        prop_assert_eq!(first_diff(&gb, &wb), None, "dequantized bits");
    }

    #[test]
    fn nvfp4_dequant_error_is_within_one_e2m1_step(
        rows in 1usize..5,
        groups_per_row in 1usize..5,
        seed in any::<u64>(),
        group_exps in proptest::collection::vec(-6i32..6, 16),
    ) {
        let cols = groups_per_row * NVFP4_GROUP;
        let mut w = seeded_values(seed, rows * cols);
        for (i, x) in w.iter_mut().enumerate() {
            *x *= 2f32.powi(group_exps[(i / NVFP4_GROUP) % group_exps.len()]) * 10.0;
        }
        let m = Nvfp4Matrix::quantize(&w, rows, cols).unwrap();
        prop_assert!(m.global_scale.is_finite() && m.global_scale > 0.0);
        let amax = w.iter().fold(0.0f64, |a, x| a.max(x.abs() as f64));
        prop_assert!(((m.global_scale as f64) - amax / 2688.0).abs() <= amax / 2688.0 * 1e-6);
        for g in 0..rows * groups_per_row {
            let group = &w[g * NVFP4_GROUP..(g + 1) * NVFP4_GROUP];
            let gamax = group.iter().fold(0.0f64, |a, x| a.max(x.abs() as f64));
            let code = m.scales[g];
            prop_assert!(gamax == 0.0 || code > 0, "group {} has values but scale code 0", g);
            let ideal = gamax / 6.0 / m.global_scale as f64;
            let scale = e4m3_reference_magnitude(code);
            if (0x08..0x7E).contains(&code) {
                prop_assert!((scale - ideal).abs() <= ideal / 16.0 * (1.0 + 1e-5),
                    "group {}: scale {} for ideal {}", g, scale, ideal);
            }
            let step = scale * m.global_scale as f64; // value of E2M1 1.0 in this group
            for (j, &x) in group.iter().enumerate() {
                let i = g * NVFP4_GROUP + j;
                let (r, c) = (i / cols, i % cols);
                let got = m.element(r, c) as f64 * m.global_scale as f64;
                let t = (x as f64).abs() / step;
                let slop = 1e-5 * (x as f64).abs() + 1e-30;
                if t > 6.0 * (1.0 + 1e-6) {
                    prop_assert!((got.abs() - 6.0 * step).abs() <= slop, "({}, {}): {} saturates to {}", r, c, x, got);
                } else {
                    let half_gap = if t <= 2.0 { 0.25 } else if t <= 4.0 { 0.5 } else { 1.0 };
                    prop_assert!((got - x as f64).abs() <= half_gap * step + slop,
                        "({}, {}): {} dequantized to {} (step {})", r, c, x, got, step);
                }
                prop_assert!(got == 0.0 || (got < 0.0) == (x < 0.0), "sign of ({}, {})", r, c);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Block-scaled E4M3 matrices
// ---------------------------------------------------------------------------------------------

#[test]
fn e4m3_block_scales_shape_and_values() {
    let (rows, cols) = (130usize, 200usize);
    let mut w = seeded_values(7, rows * cols);
    // Block (1, 1) = rows 128..130 × cols 128..200 is all zero; block (0, 1) is scaled up.
    for r in 0..rows {
        for c in 0..cols {
            if r >= 128 && c >= 128 {
                w[r * cols + c] = 0.0;
            } else if c >= 128 {
                w[r * cols + c] *= 1000.0;
            }
        }
    }
    let (codes, scales) = e4m3_block_quantize(&w, rows, cols);
    assert_eq!(codes.len(), rows * cols);
    assert_eq!(scales.len(), 4, "ceil(130/128) × ceil(200/128)");
    let mut amax = [0.0f32; 4];
    for (i, x) in w.iter().enumerate() {
        let b = (i / cols / 128) * 2 + (i % cols) / 128;
        amax[b] = amax[b].max(x.abs());
    }
    for b in 0..4 {
        let want = if amax[b] == 0.0 { 1.0 } else { amax[b] / 448.0 };
        assert_eq!(scales[b].to_bits(), want.to_bits(), "scale of block {b}");
    }
    assert_eq!(scales[3], 1.0);
    let back = e4m3_block_dequant(&codes, &scales, rows, cols);
    for (i, (&x, &y)) in w.iter().zip(&back).enumerate() {
        let scale = scales[(i / cols / 128) * 2 + (i % cols) / 128] as f64;
        // Half an E4M3 ulp: 2^-4 relative in the normal range, 2^-10 · scale in the subnormal one.
        let bound = (x as f64).abs() / 16.0 + scale * 2f64.powi(-10) + 1e-6 * (x as f64).abs();
        assert!(((y as f64) - x as f64).abs() <= bound, "element {i}: {x} → {y}");
    }
    for r in 128..rows {
        assert!(codes[r * cols + 128..(r + 1) * cols].iter().all(|&c| c == 0), "zero block codes, row {r}");
    }
}

#[test]
fn e4m3_block_non_finite_follow_codec_policy() {
    let mut w = vec![1.0f32; 4];
    w[0] = f32::NAN;
    w[1] = f32::NEG_INFINITY;
    w[2] = 2.0;
    let (codes, scales) = e4m3_block_quantize(&w, 2, 2);
    assert_eq!(scales, vec![2.0 / 448.0], "amax over finite values");
    assert_eq!(codes[0], 0x7F);
    assert_eq!(codes[1], 0xFE);
    assert_eq!(codes[2], 0x7E);
    let (codes, scales) = e4m3_block_quantize(&[f32::NAN], 1, 1);
    assert_eq!((codes, scales), (vec![0x7F], vec![1.0]));
}

#[test]
#[should_panic(expected = "is not out_features 2 × in_features 3")]
fn e4m3_block_quantize_rejects_wrong_length() {
    let _ = e4m3_block_quantize(&[0.0; 5], 2, 3);
}

/// The quantizer's branchless encoder is the codec: every f32 pattern of magnitude below 512
/// (all of E4M3's rounding, its subnormals and the saturation from 448 up) — every 7th of them
/// negative too (the sign is one bit copied by both) — and every 61st pattern beyond, both signs
/// (large values, ±inf, NaN payloads).
#[test]
fn branchless_encode_equals_the_codec_on_every_pattern_that_rounds() {
    let check = |bits: u32| {
        let x = f32::from_bits(bits);
        assert_eq!(e4m3_encode_branchless(x), e4m3_encode(x), "pattern {bits:#010x} ({x:e})");
    };
    for abs in 0..0x4400_0000u32 {
        check(abs);
        if abs % 7 == 0 {
            check(abs | 0x8000_0000);
        }
    }
    for abs in (0x4400_0000..=0x7FFF_FFFFu32).step_by(61).chain([0x7F80_0000, 0x7F80_0001, 0x7FC0_0000, 0x7FFF_FFFF]) {
        check(abs);
        check(abs | 0x8000_0000);
    }
}

/// The block quantizer written the plain way (scales from `f32::max` over the finite `|x|`, block
/// by block, then one code per element): the optimised `e4m3_block_quantize` must give its bytes.
fn block_quantize_reference(w: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let (rb, cb) = (rows.div_ceil(E4M3_BLOCK), cols.div_ceil(E4M3_BLOCK));
    let mut scales = vec![0.0f32; rb * cb];
    for br in 0..rb {
        for bc in 0..cb {
            let mut amax = 0.0f32;
            for r in br * E4M3_BLOCK..((br + 1) * E4M3_BLOCK).min(rows) {
                for c in bc * E4M3_BLOCK..((bc + 1) * E4M3_BLOCK).min(cols) {
                    let x = w[r * cols + c];
                    if x.is_finite() {
                        amax = amax.max(x.abs());
                    }
                }
            }
            scales[br * cb + bc] = if amax == 0.0 { 1.0 } else { (amax / E4M3_MAX).max(f32::from_bits(1)) };
        }
    }
    let codes = (0..rows * cols)
        .map(|i| e4m3_encode(w[i] / scales[(i / cols / E4M3_BLOCK) * cb + (i % cols) / E4M3_BLOCK]))
        .collect();
    (codes, scales)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// The optimised quantizer equals the plain one on matrices with signed zeros, subnormals,
    /// NaN, ±inf and huge values mixed in, for shapes that are not whole blocks; and quantizing
    /// band by band (128 rows at a time, as the model generator does on several threads) gives the
    /// same bytes as quantizing the whole matrix.
    #[test]
    fn block_quantize_equals_the_plain_definition_and_bands(
        rows in 1usize..=300,
        cols in 1usize..=300,
        seed in any::<u64>(),
        specials in proptest::collection::vec((any::<usize>(), 0usize..6), 0..12),
    ) {
        let mut w: Vec<f32> = seeded_values(seed, rows * cols).iter().map(|x| x * 3.0).collect();
        for (at, kind) in specials {
            w[at % (rows * cols)] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::from_bits(3), 1e30][kind];
        }
        let (codes, scales) = e4m3_block_quantize(&w, rows, cols);
        let (want_codes, want_scales) = block_quantize_reference(&w, rows, cols);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        prop_assert_eq!(first_diff(&bits(&scales), &bits(&want_scales)), None, "scales");
        prop_assert_eq!(first_diff(&codes, &want_codes), None, "codes");
        let cb = cols.div_ceil(E4M3_BLOCK);
        let (mut band_codes, mut band_scales) = (vec![0u8; rows * cols], vec![0.0f32; scales.len()]);
        for r0 in (0..rows).step_by(E4M3_BLOCK) {
            let n = (rows - r0).min(E4M3_BLOCK);
            e4m3_block_quantize_into(
                &w[r0 * cols..(r0 + n) * cols],
                n,
                cols,
                &mut band_codes[r0 * cols..(r0 + n) * cols],
                &mut band_scales[r0 / E4M3_BLOCK * cb..][..cb],
            );
        }
        prop_assert_eq!(first_diff(&band_codes, &codes), None, "band codes");
        prop_assert_eq!(first_diff(&bits(&band_scales), &bits(&scales)), None, "band scales");
    }
}

/// Strategy: a block E4M3 matrix built from codes and power-of-two block scales, every block holding
/// a ±448 code, so that quantizing its values must give the same codes and scales back.
fn exact_e4m3_blocks() -> impl Strategy<Value = (usize, usize, Vec<u8>, Vec<i32>)> {
    (1usize..=300, 1usize..=300).prop_flat_map(|(rows, cols)| {
        let n_scales = rows.div_ceil(E4M3_BLOCK) * cols.div_ceil(E4M3_BLOCK);
        (
            Just(rows),
            Just(cols),
            any::<u64>(),
            proptest::collection::vec(-30i32..30, n_scales),
            proptest::collection::vec((any::<usize>(), any::<bool>()), n_scales),
        )
            .prop_map(|(rows, cols, seed, exps, tops)| {
                // Codes from a seeded generator (a proptest value per element would be slow); NaN
                // codes are cleared to a finite one.
                let mut codes: Vec<u8> = seeded_values(seed, rows * cols)
                    .iter()
                    .map(|x| {
                        let c = (x.to_bits() >> 5) as u8;
                        if c & 0x7F == 0x7F {
                            c & 0xF0
                        } else {
                            c
                        }
                    })
                    .collect();
                let col_blocks = cols.div_ceil(E4M3_BLOCK);
                for (b, (pick, neg)) in tops.into_iter().enumerate() {
                    let (br, bc) = (b / col_blocks, b % col_blocks);
                    let h = (rows - br * E4M3_BLOCK).min(E4M3_BLOCK);
                    let wd = (cols - bc * E4M3_BLOCK).min(E4M3_BLOCK);
                    let (r, c) = (br * E4M3_BLOCK + (pick % h), bc * E4M3_BLOCK + (pick / h) % wd);
                    codes[r * cols + c] = if neg { 0xFE } else { 0x7E };
                }
                (rows, cols, codes, exps)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn e4m3_block_round_trips_exactly_representable((rows, cols, codes, exps) in exact_e4m3_blocks()) {
        let col_blocks = cols.div_ceil(E4M3_BLOCK);
        let scales: Vec<f32> = exps.iter().map(|&e| 2f32.powi(e)).collect();
        let w: Vec<f32> = codes
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let s = if c & 0x80 != 0 { -1.0 } else { 1.0 };
                let scale = scales[(i / cols / E4M3_BLOCK) * col_blocks + (i % cols) / E4M3_BLOCK] as f64;
                (s * e4m3_reference_magnitude(c & 0x7F) * scale) as f32
            })
            .collect();
        let (got_codes, got_scales) = e4m3_block_quantize(&w, rows, cols);
        prop_assert_eq!(first_diff(&got_scales, &scales), None, "scales");
        prop_assert_eq!(first_diff(&got_codes, &codes), None, "codes");
        let back = e4m3_block_dequant(&got_codes, &got_scales, rows, cols);
        let (gb, wb): (Vec<u32>, Vec<u32>) = back.iter().zip(&w).map(|(a, b)| (a.to_bits(), b.to_bits())).unzip();
        prop_assert_eq!(first_diff(&gb, &wb), None, "dequantized bits");
    }
}
