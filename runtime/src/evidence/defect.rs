//! Planted twin defects: the canaries that prove the edge battery and the gates catch defects
//! on the special paths of docs/DESIGN.md §3.2 (selftest, docs/DESIGN.md §4.2). Each is the
//! arithmetic a plausible implementation gets wrong — a router that breaks exact ties towards
//! the higher expert id, sums that start from −0.0 (IEEE's additive identity) instead of the
//! canonical +0.0, a SwiGLU that caps the up side but not the silu side — and each differs from
//! the canonical arithmetic ONLY on its special path, so a battery that never reaches the path
//! cannot tell the defect from the real thing.
//!
//! The host backend plants them in the twins it runs (`Witness::plant`, `witness.rs`); the CUDA
//! backend refuses (its kernels are held to the twins bit for bit by `runtime/tests/gpu`, and the
//! device-host gate compares a CUDA run with the host oracle over the same battery, so a kernel
//! with such a defect fails there wherever the battery reaches the path).

/// A defect planted in the host twins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TwinDefect {
    /// The router breaks exact key ties towards the higher expert id.
    RouterTiesToHigherId,
    /// GEMV sums and K-block folds start from −0.0: a sum whose every term is −0.0 comes out
    /// −0.0 instead of +0.0 (the only place where the start value shows).
    SumsFromNegativeZero,
    /// The SwiGLU clamps the up side to ±limit but leaves the silu side unclamped.
    SiluUnclamped,
}

impl TwinDefect {
    /// The census name (`defect.<name>`) of an op run with this defect.
    pub fn name(self) -> &'static str {
        match self {
            TwinDefect::RouterTiesToHigherId => "router_ties_to_higher_id",
            TwinDefect::SumsFromNegativeZero => "sums_from_negative_zero",
            TwinDefect::SiluUnclamped => "silu_unclamped",
        }
    }

    /// The refusal of a backend (`describe()`) whose kernels cannot carry this defect.
    pub fn refused(self, backend: String) -> crate::RuntimeError {
        let rule = format!(
            "{backend}: this backend cannot plant the twin defect {} (the canary runs on the host backend)",
            self.name()
        );
        crate::RuntimeError::Unsupported { backend, mechanism: "twin defects", rule }
    }
}

/// What a sum that started from −0.0 gives where the canonical one gave +0.0: `out[i] = −0.0`
/// for the listed indices (sums whose every term was −0.0; `coverage::negative_zero_sums`).
pub fn negate_zero_sums(out: &mut [f32], at: &[usize]) {
    for &i in at {
        out[i] = f32::from_bits(0x8000_0000);
    }
}

/// The fold of `n_parts` vectors `[part][width]` started from −0.0: the canonical fold, except
/// that an element whose every part is −0.0 stays −0.0.
pub fn fold_from_negative_zero(parts: &[f32], n_parts: usize, out: &mut [f32]) {
    let width = out.len();
    for (i, o) in out.iter_mut().enumerate() {
        let all_neg_zero = n_parts > 0 && (0..n_parts).all(|p| parts[p * width + i].to_bits() == 0x8000_0000);
        if all_neg_zero {
            *o = f32::from_bits(0x8000_0000);
        }
    }
}

/// SwiGLU without the silu-side cap: `silu(g) · clamp(u, −limit, limit)`, and the clamps it
/// applied — never the silu side, so coverage sees the skipped clamp.
pub fn swiglu_silu_unclamped(g: f32, u: f32, limit: Option<f32>) -> (f32, memra_kernels::canon::SwigluClamps) {
    let s = memra_kernels::canon::silu_c(g);
    let mut c = memra_kernels::canon::SwigluClamps::default();
    let u = match limit {
        Some(limit) if u > limit => {
            c.up_high = true;
            limit
        }
        Some(limit) if u < -limit => {
            c.up_low = true;
            -limit
        }
        _ => u,
    };
    (s * u, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_defect_differs_only_on_its_path() {
        // Off the path: identical to the canonical arithmetic.
        let canon = memra_kernels::canon::swiglu_c(2.0, 3.0, Some(7.0));
        assert_eq!(swiglu_silu_unclamped(2.0, 3.0, Some(7.0)).0.to_bits(), canon.to_bits());
        // On it: the silu side is not capped.
        assert!(swiglu_silu_unclamped(20.0, 1.0, Some(7.0)).0 > memra_kernels::canon::swiglu_c(20.0, 1.0, Some(7.0)));
        // … and it reports the clamps it applied, not the silu one it skipped.
        let (_, c) = swiglu_silu_unclamped(20.0, 9.0, Some(7.0));
        assert_eq!((c.silu, c.up_high, c.up_low), (false, true, false));
        let mut out = [0.0f32, 1.0];
        fold_from_negative_zero(&[-0.0, 1.0, -0.0, 0.0], 2, &mut out);
        assert_eq!(out.map(f32::to_bits), [0x8000_0000, 1.0f32.to_bits()]);
        let mut out = [0.0f32];
        fold_from_negative_zero(&[-0.0, 0.0], 2, &mut out);
        assert_eq!(out[0].to_bits(), 0, "a +0.0 term makes the sum +0.0 from either start");
    }
}
