//! The engine written from the documents (`scripts/subjects/docs_engine.py`) computes the
//! canonical scalar functions bit for bit: its `exp_c`, `sigmoid_c` and `silu_c` — written from
//! docs/DESIGN.md §3.4, "Every operation", steps 4 and 5 — equal `kernels/src/canon.rs` on a sweep
//! over the whole f32 line. A constant no battery exposes (exp_c's reduction and polynomial
//! constants change results that no seam of `tiny` or `edge` reaches) is held here; the negative
//! control plants the polynomial coefficient P4 one ulp off in the Python engine and must differ. Needs python3 with
//! numpy (`.ci/run` installs it before the tests).

use crate::util::*;
use memra_kernels::canon::{exp_c, sigmoid_c, silu_c};

/// Every 4099th f32 bit pattern (both signs, every exponent: ~1.05 million values), the specials,
/// and a dense stretch of [−110, 100] where exp_c computes.
fn inputs() -> Vec<u32> {
    let mut v: Vec<u32> = (0..=u32::MAX / 4099).map(|i| i * 4099).collect();
    v.extend([0x0000_0000, 0x8000_0000, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0x42B1_7217, 0x42B1_7218, 0xC2D0_0000]);
    v.extend((0..200_000u32).map(|i| (-110.0f32 + 210.0 * i as f32 / 200_000.0).to_bits()));
    v
}

/// Runs the docs engine's scalar functions over `bits` in a python3 child; `planted`: with P4
/// (0x3E2AAAAA) one ulp larger. Returns [exp, sigmoid, silu] bit patterns.
fn python_scalars(dir: &std::path::Path, bits: &[u32], planted: bool) -> [Vec<u32>; 3] {
    let (input, output) = (dir.join("in.bin"), dir.join("out.bin"));
    std::fs::write(&input, bits.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let plant = if planted { "d.EXP_P[4] = d.fbits(0x3E2AAAAB)" } else { "pass" };
    let code = format!(
        "import sys; sys.path.insert(0, {dir:?}); import numpy as np; import docs_engine as d; {plant}\n\
         x = np.fromfile({input:?}, dtype='<u4').view(np.float32)\n\
         np.concatenate([d.exp_c(x), d.sigmoid_c(x), d.silu_c(x)]).astype('<f4').tofile({output:?})\n",
        dir = s(&repo("scripts/subjects")),
        input = s(&input),
        output = s(&output),
    );
    let out = std::process::Command::new("python3").args(["-c", &code]).output().expect("python3 runs");
    assert!(out.status.success(), "docs_engine.py (python3 with numpy): {}", String::from_utf8_lossy(&out.stderr));
    let raw = std::fs::read(&output).unwrap();
    let all: Vec<u32> = raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(all.len(), 3 * bits.len(), "the python side returned {} values", all.len());
    let n = bits.len();
    [all[..n].to_vec(), all[n..2 * n].to_vec(), all[2 * n..].to_vec()]
}

/// A canonical scalar function.
type Scalar = fn(f32) -> f32;

/// Inputs where `got` differs from `f` in bits (NaN equals NaN: a NaN payload is not canonical).
fn mismatches(bits: &[u32], got: &[u32], f: Scalar) -> Vec<(u32, u32, u32)> {
    bits.iter()
        .zip(got)
        .filter_map(|(&x, &g)| {
            let want = f(f32::from_bits(x));
            let same = want.to_bits() == g || (want.is_nan() && f32::from_bits(g).is_nan());
            (!same).then_some((x, want.to_bits(), g))
        })
        .collect()
}

#[test]
fn the_docs_engine_scalar_functions_are_the_canonical_ones() {
    let tmp = tempdir();
    let bits = inputs();
    let got = python_scalars(tmp.path(), &bits, false);
    let fns: [(&str, Scalar); 3] = [("exp_c", exp_c), ("sigmoid_c", sigmoid_c), ("silu_c", silu_c)];
    for ((name, f), g) in fns.iter().zip(&got) {
        let bad = mismatches(&bits, g, *f);
        assert!(
            bad.is_empty(),
            "docs_engine.py {name} differs from kernels/src/canon.rs on {} of {} inputs, first (x, canon, docs): {:08x?}",
            bad.len(),
            bits.len(),
            &bad[..bad.len().min(4)]
        );
    }
    // Negative control: the sweep sees a one-ulp change of a polynomial coefficient (a one-ulp
    // change of LN2_LO moves about 7 results in 2 million: this sweep would not promise to).
    let planted = python_scalars(tmp.path(), &bits, true);
    let bad = mismatches(&bits, &planted[0], exp_c);
    assert!(!bad.is_empty(), "P4 one ulp off changed no exp_c result of {} inputs", bits.len());
}
