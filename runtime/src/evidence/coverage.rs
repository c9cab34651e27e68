//! Coverage counters: how often a run reached each special path of the arithmetic of
//! docs/DESIGN.md §3.2 — exact router ties inside the top-k and across the k/k+1 boundary, sums
//! whose every term is −0.0 (where the +0.0 start of every canonical sum decides the sign), the
//! SwiGLU clamps on the silu side and on both ends of the up side for routed and shared experts,
//! and E4M3 codes of the largest magnitude (the saturation value ±448) and subnormal codes read
//! by the expert GEMVs.
//!
//! The CUDA kernels do not count: the host backend counts where it runs each op's twin, with the
//! twins' own intermediate values (`twins::experts::gate_up_rows`, `twins::gemv::weight_value`),
//! so the counts describe exactly the arithmetic the twins define. The gates take the coverage of
//! a model and battery from the host oracle's record and carry it in every receipt of that model
//! and battery; a model that claims a path its battery never reached fails the coverage gate.
//! Every count is TP-invariant by construction (each unit of work happens on exactly one rank),
//! so a host run at any TP size counts what the oracle counts.
//!
//! Each counter also keeps the first place it was reached (prompt, step, layer, seam, in program
//! order), which is where a defect on that path first shows (the selftest's expected locations).

use std::collections::BTreeMap;

use memra_kernels::twins::gemv::{weight_value, MatrixView};

use super::record::Seam;

/// Where the program was when a path was reached (ordered as the program runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeamPoint {
    pub prompt: usize,
    pub step: usize,
    pub layer: usize,
    pub seam: Seam,
}

/// How often a path was reached, and the first place it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathCount {
    pub count: u64,
    pub first: Option<SeamPoint>,
}

/// Coverage counters by path name ([`PATHS`]).
pub type Coverage = BTreeMap<String, PathCount>;

/// Router calls (denominator of the tie paths).
pub const ROUTER_CALLS: &str = "router.calls";
/// Router calls with two selected experts whose keys are exactly equal.
pub const TIE_IN_TOPK: &str = "router.tie_in_topk";
/// Router calls whose k-th selected key equals an unselected expert's key.
pub const TIE_AT_BOUNDARY: &str = "router.tie_at_boundary";
/// GEMV sums (whole rows or K-block partials) whose every product is −0.0.
pub const NEGATIVE_ZERO_SUMS: &str = "signed_zero.negative_zero_sums";
/// E4M3 codes read by expert GEMVs (denominator), codes of magnitude 448, subnormal codes.
pub const E4M3_CODES: &str = "e4m3.codes";
pub const E4M3_MAX_CODES: &str = "e4m3.max_codes";
pub const E4M3_SUBNORMAL_CODES: &str = "e4m3.subnormal_codes";

/// SwiGLU counters of one expert class: `swiglu.<what>.<routed|shared>`.
pub fn swiglu_path(what: &str, shared: bool) -> String {
    format!("swiglu.{what}.{}", if shared { "shared" } else { "routed" })
}

/// Every coverage counter, in the order receipts list them.
pub const PATHS: [&str; 15] = [
    ROUTER_CALLS,
    TIE_IN_TOPK,
    TIE_AT_BOUNDARY,
    NEGATIVE_ZERO_SUMS,
    "swiglu.elements.routed",
    "swiglu.clamp_silu.routed",
    "swiglu.clamp_up_high.routed",
    "swiglu.clamp_up_low.routed",
    "swiglu.elements.shared",
    "swiglu.clamp_silu.shared",
    "swiglu.clamp_up_high.shared",
    "swiglu.clamp_up_low.shared",
    E4M3_CODES,
    E4M3_MAX_CODES,
    E4M3_SUBNORMAL_CODES,
];

/// A coverage map with every counter of [`PATHS`] at 0.
pub fn empty() -> Coverage {
    PATHS.iter().map(|p| (p.to_string(), PathCount::default())).collect()
}

/// Count `n` reaches of `path` at `at`.
pub fn note(c: &mut Coverage, path: &str, at: Option<SeamPoint>, n: u64) {
    if n == 0 {
        return;
    }
    let e = c.entry(path.to_string()).or_default();
    e.count += n;
    e.first = match (e.first, at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
}

/// Add `other` into `into` (counts summed, the earlier first place kept).
pub fn merge(into: &mut Coverage, other: &Coverage) {
    for (path, pc) in other {
        let e = into.entry(path.clone()).or_default();
        e.count += pc.count;
        e.first = match (e.first, pc.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Exact ties of one router call (canonical keys `sigmoid_c(logit) + bias`, selection `ids` in
/// slot order): (two selected keys equal, the k-th selected key equal to an unselected key).
/// Keys compare with `==`, as the router does (−0.0 ties +0.0, NaN ties nothing).
pub fn router_ties(logits: &[f32], bias: &[f32], ids: &[u32]) -> (bool, bool) {
    let keys: Vec<f32> = logits.iter().zip(bias).map(|(&l, &b)| memra_kernels::canon::sigmoid_c(l) + b).collect();
    let sel: Vec<f32> = ids.iter().filter_map(|&i| keys.get(i as usize).copied()).collect();
    let in_topk = sel.iter().enumerate().any(|(i, a)| sel[i + 1..].iter().any(|b| a == b));
    let boundary = match sel.last() {
        Some(last) => keys.iter().enumerate().any(|(e, key)| !ids.contains(&(e as u32)) && key == last),
        None => false,
    };
    (in_topk, boundary)
}

/// Whether every product `weight_value(r, c) · x[c]` over `cols` is −0.0.
fn all_products_negative_zero(m: &MatrixView, r: usize, cols: std::ops::Range<usize>, x: &[f32]) -> bool {
    !cols.is_empty() && cols.into_iter().all(|c| (weight_value(m, r, c) * x[c]).to_bits() == 0x8000_0000)
}

/// The outputs of a GEMV whose sum consists of −0.0 products only: indices into `out`, which
/// holds whole rows (`partials == false`) or K-block partials `[k][rows]`. Only outputs that are
/// +0.0 are examined (a sum of −0.0 products is +0.0 from the canonical +0.0 start), so the cost
/// is paid only where a sum came out zero.
pub fn negative_zero_sums(m: &MatrixView, x: &[f32], out: &[f32], partials: bool) -> Vec<usize> {
    let rows = m.out_features;
    let kw = m.kblock_width.max(1);
    out.iter()
        .enumerate()
        .filter(|(_, v)| v.to_bits() == 0)
        .filter(|&(i, _)| {
            if partials {
                let (k, r) = (i / rows.max(1), i % rows.max(1));
                all_products_negative_zero(m, r, k * kw..(k + 1) * kw, x)
            } else {
                all_products_negative_zero(m, i, 0..m.in_features, x)
            }
        })
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_kernels::twins::gemv::WeightRef;

    #[test]
    fn ties_are_found_inside_the_top_k_and_at_the_boundary() {
        let bias = [0.0f32; 4];
        // Experts 0 and 2 have the same logit: a tie inside the top-2 when both are selected …
        let (a, b) = router_ties(&[3.0, -1.0, 3.0, 0.0], &bias, &[0, 2]);
        assert!(a && !b);
        // … and at the boundary when only one of them fits.
        let (a, b) = router_ties(&[5.0, 3.0, 3.0, 0.0], &bias, &[0, 1]);
        assert!(!a && b);
        assert_eq!(router_ties(&[5.0, 3.0, 2.0, 0.0], &bias, &[0, 1]), (false, false));
    }

    #[test]
    fn only_sums_of_negative_zero_products_count() {
        // Row 0: weights −0.0 against positive x → every product −0.0. Row 1: +0.0 weights →
        // +0.0 products (not the path). Row 2: nonzero.
        let w = [-0.0f32, -0.0, 0.0, 0.0, 1.0, 1.0];
        let m = MatrixView { w: WeightRef::F32(&w), out_features: 3, in_features: 2, kblock_width: 1 };
        let x = [1.0f32, 2.0];
        let out = [0.0f32, 0.0, 3.0];
        assert_eq!(negative_zero_sums(&m, &x, &out, false), vec![0]);
        // As partials [k][rows]: K-block 0 and 1 of row 0.
        let parts = [0.0f32, 0.0, 1.0, 0.0, 0.0, 2.0];
        assert_eq!(negative_zero_sums(&m, &x, &parts, true), vec![0, 3]);
    }

    #[test]
    fn first_place_is_the_earliest() {
        let mut c = empty();
        let at = |step, layer| Some(SeamPoint { prompt: 0, step, layer, seam: Seam::Router });
        note(&mut c, TIE_IN_TOPK, at(2, 0), 1);
        note(&mut c, TIE_IN_TOPK, at(1, 1), 2);
        assert_eq!(c[TIE_IN_TOPK], PathCount { count: 3, first: at(1, 1) });
        let mut d = empty();
        note(&mut d, TIE_IN_TOPK, at(0, 1), 1);
        merge(&mut c, &d);
        assert_eq!(c[TIE_IN_TOPK], PathCount { count: 4, first: at(0, 1) });
    }
}
