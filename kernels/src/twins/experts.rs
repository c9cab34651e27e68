//! Grouped routed experts: the host twins of `cuda/experts.cu`, where one launch runs a
//! projection kind for every slot of a step, reading the route ids from device memory.
//!
//! Why a module of its own: once the routes stay on the device, which expert a slot runs — and,
//! for whole experts, which rank owns it — is data. Every kernel of the family therefore maps a
//! slot to its expert (`slot_entry`) and decides ownership (`SlotOwner`) from the route itself,
//! and the host does exactly the same, so an out-of-range id is skipped identically on both
//! sides. The arithmetic per slot is unchanged (docs/DESIGN.md §3.4): gate and up rows are whole-row
//! folds of their canonical K-block partials, the NVFP4 per-matrix scale is applied once after
//! the fold, SwiGLU follows, and the down projection produces canonical K-block partials.

// `acc = acc + x` is written out: each line is one IEEE operation with its operand order.
#![allow(clippy::assign_op_pattern)]

use crate::canon::swiglu_c;
use crate::twins::gemv::{gemv_rows, MatrixView};

/// The expert a slot runs: slot `s < k` (k = `ids.len()`) runs the routed expert `ids[s]` (the
/// router's id as u32 bits in an f32), slot `s >= k` the shared expert, entry `experts + s − k`
/// of a group. Returns `None` for a routed id outside `0..experts` (no entry: every kernel of
/// the family skips the slot and writes nothing for it).
pub fn slot_entry(ids: &[f32], s: usize, experts: usize) -> Option<usize> {
    match ids.get(s) {
        Some(bits) => {
            let id = bits.to_bits() as usize;
            (id < experts).then_some(id)
        }
        None => Some(experts + (s - ids.len())),
    }
}

/// Which rank (or owner) a routed expert id belongs to: `owner(e) = (e / div) % modulo` for
/// `e < experts`; an id outside the experts has no owner. Contiguous expert-parallel ranges are
/// `div = experts / TP, modulo = TP`; NVFP4_EP2's interleaving is `div = 1, modulo = TP` for the
/// rank (`(e % 2) % TP` for TP 1 and 2) and `div = 1, modulo = 2` for the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerRule {
    pub experts: u32,
    pub div: u32,
    pub modulo: u32,
}

impl OwnerRule {
    /// The owner of routed expert `id`, or `None` when `id` is not an expert (or the rule is
    /// degenerate: a zero divisor or modulus owns nothing).
    pub fn owner_of(&self, id: u32) -> Option<u32> {
        (id < self.experts && self.div > 0 && self.modulo > 0).then(|| (id / self.div) % self.modulo)
    }
}

/// A rule and the owner it selects: slot `s` counts iff `rule.owner_of(ids[s]) == Some(want)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotOwner {
    pub rule: OwnerRule,
    pub want: u32,
}

impl SlotOwner {
    /// Whether routed slot `s` (its id bits in `ids[s]`) belongs to this owner.
    pub fn owns(&self, ids: &[f32], s: usize) -> bool {
        self.rule.owner_of(ids[s].to_bits()) == Some(self.want)
    }
}

/// One expert's fused gate/up/SwiGLU row program (`expert_gate_up_*` kernels):
/// `g = gemv_rows(gate, x)`, `u = gemv_rows(up, x)` (whole-row folds of the canonical K-block
/// partials); with NVFP4 per-matrix scales `(sg, su)`: `g = g * sg`, `u = u * su` (once, after the
/// fold); then `act[r] = swiglu_c(g[r], u[r], limit)`.
///
/// `gate` and `up` have the same rows (checked), `act.len()` is that row count.
pub fn gate_up_act(
    gate: &MatrixView,
    up: &MatrixView,
    x: &[f32],
    scales: Option<(f32, f32)>,
    limit: Option<f32>,
    act: &mut [f32],
) {
    let (g, u) = gate_up_rows(gate, up, x, scales);
    assert_eq!(act.len(), g.len(), "gate_up_act: act has {} values, the expert {} rows", act.len(), g.len());
    for ((a, &gv), &uv) in act.iter_mut().zip(&g).zip(&u) {
        *a = swiglu_c(gv, uv, limit);
    }
}

/// The first half of [`gate_up_act`]: the gate and up rows `(g, u)` of one expert, NVFP4
/// per-matrix scales applied once after each fold — the SwiGLU's operands, so a caller can apply
/// the SwiGLU itself and count the clamps it applied (`canon::swiglu_traced`).
pub fn gate_up_rows(gate: &MatrixView, up: &MatrixView, x: &[f32], scales: Option<(f32, f32)>) -> (Vec<f32>, Vec<f32>) {
    let rows = gate.out_features;
    assert_eq!(up.out_features, rows, "gate_up_act: gate has {rows} rows, up {}", up.out_features);
    let (mut g, mut u) = (vec![0.0f32; rows], vec![0.0f32; rows]);
    gemv_rows(gate, x, &mut g);
    gemv_rows(up, x, &mut u);
    if let Some((sg, su)) = scales {
        for v in g.iter_mut() {
            *v = *v * sg;
        }
        for v in u.iter_mut() {
            *v = *v * su;
        }
    }
    (g, u)
}

/// Canonical fold of one slot's `n_parts` partial vectors (`[part][width]`) from +0.0 in part
/// order, then the NVFP4 per-matrix down scale when given (`y = y * sd`, once, after the fold).
pub fn fold_slot(parts: &[f32], n_parts: usize, scale: Option<f32>, out: &mut [f32]) {
    let width = out.len();
    assert!(
        parts.len() >= n_parts * width,
        "fold_slot: {} values hold fewer than {n_parts} parts × {width}",
        parts.len()
    );
    for (i, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for p in 0..n_parts {
            acc = acc + parts[p * width + i];
        }
        *o = match scale {
            Some(s) => acc * s,
            None => acc,
        };
    }
}

/// The TP-sharded moe_join (`fold_combine_residual_f32`'s first half): for every slot s of `k + 1`
/// (k = `w.len()`, the last the shared expert) `y_s` = [`fold_slot`] of its `n_parts` partials at
/// `parts[s·pitch ..]`; then `out = [Σ_{s<k} w[s]·y_s | y_k]` (`combine_shared`'s order). The
/// same operations as a `fold_slots` of every slot followed by `combine_shared`, without storing
/// the slot outputs.
pub fn fold_combine(parts: &[f32], pitch: usize, n_parts: usize, w: &[f32], out: &mut [f32]) {
    let k = w.len();
    assert!(out.len().is_multiple_of(2), "fold_combine: out has {} values, not [routed | shared]", out.len());
    let width = out.len() / 2;
    let mut y = vec![0.0f32; (k + 1) * width];
    for (s, ys) in y.chunks_exact_mut(width.max(1)).enumerate().take(k + 1) {
        fold_slot(&parts[s * pitch..], n_parts, None, ys);
    }
    crate::twins::moe::combine_shared(&y, w, out);
}

/// The moe_join and the residual in one kernel (`fold_combine_residual_f32`): [`fold_combine`]
/// into `out = [routed | shared]`, then [`residual_add`](crate::twins::moe::residual_add) of `h`
/// and out's two halves into `sum` and `x` — the operations of the two kernels it replaces, in
/// their order. `residual` is `(sum, x)`.
pub fn fold_combine_residual(
    parts: &[f32],
    pitch: usize,
    n_parts: usize,
    w: &[f32],
    h: &[f32],
    out: &mut [f32],
    (sum, x): (&mut [f32], &mut [f32]),
) {
    fold_combine(parts, pitch, n_parts, w, out);
    let (routed, shared) = out.split_at(out.len() / 2);
    crate::twins::moe::residual_add(h, routed, shared, sum, x);
}

/// The expert-parallel gather at the root (`select_slots_f32`): for each routed slot s
/// (`ids.len()` of them), the owner rank `o = rule.owner_of(ids[s])` and
/// `out[s] = src[o·rank_pitch + s·width ..][..width]` — bytes only, no arithmetic. A slot whose
/// id has no owner, or an owner at or beyond `ranks`, is left as it was.
pub fn select_slots(ids: &[f32], rule: OwnerRule, ranks: usize, src: &[f32], rank_pitch: usize, out: &mut [f32]) {
    let k = ids.len();
    if k == 0 {
        return;
    }
    let width = out.len() / k;
    for (s, o) in out.chunks_exact_mut(width).enumerate() {
        let Some(owner) = rule.owner_of(ids[s].to_bits()) else { continue };
        if owner as usize >= ranks {
            continue;
        }
        let at = owner as usize * rank_pitch + s * width;
        o.copy_from_slice(&src[at..at + width]);
    }
}

/// NVFP4_EP2's per-owner routed sum (`combine_owned_f32`): `acc = +0.0`, then for every routed
/// slot s in slot order that `owner` owns: `t = +0.0 + w[s] · y[s][i]; acc = acc + t` — exactly a
/// one-slot combine followed by an add, slot by slot.
pub fn combine_owned(ids: &[f32], owner: SlotOwner, y: &[f32], w: &[f32], out: &mut [f32]) {
    let width = out.len();
    out.fill(0.0);
    for s in 0..ids.len() {
        if !owner.owns(ids, s) {
            continue;
        }
        for (i, o) in out.iter_mut().enumerate() {
            let t = 0.0f32 + w[s] * y[s * width + i];
            *o = *o + t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(v: u32) -> f32 {
        f32::from_bits(v)
    }

    #[test]
    fn slots_map_to_routed_then_shared_entries_and_skip_bad_ids() {
        let ids = [bits(5), bits(300), bits(0)];
        assert_eq!(slot_entry(&ids, 0, 288), Some(5));
        assert_eq!(slot_entry(&ids, 1, 288), None, "an id outside the experts has no entry");
        assert_eq!(slot_entry(&ids, 2, 288), Some(0));
        assert_eq!(slot_entry(&ids, 3, 288), Some(288), "the first slot after the route is the shared expert");
    }

    #[test]
    fn owner_rules_match_the_placements() {
        let ep4 = OwnerRule { experts: 288, div: 72, modulo: 4 };
        assert_eq!(ep4.owner_of(0), Some(0));
        assert_eq!(ep4.owner_of(71), Some(0));
        assert_eq!(ep4.owner_of(72), Some(1));
        assert_eq!(ep4.owner_of(287), Some(3));
        assert_eq!(ep4.owner_of(288), None, "no owner for a non-expert (the modulus would alias it)");
        let ep2_rank = OwnerRule { experts: 8, div: 1, modulo: 2 };
        assert_eq!((0..8).map(|e| ep2_rank.owner_of(e).unwrap()).collect::<Vec<_>>(), [0, 1, 0, 1, 0, 1, 0, 1]);
        assert_eq!(OwnerRule { experts: 8, div: 0, modulo: 2 }.owner_of(1), None);
    }

    #[test]
    fn combine_owned_is_a_one_slot_combine_then_an_add() {
        // Slot 1 is not owned; -0.0 products fold to +0.0 (the +0.0 start of each one-slot combine).
        let ids = [bits(2), bits(3), bits(4)];
        let owner = SlotOwner { rule: OwnerRule { experts: 8, div: 1, modulo: 2 }, want: 0 };
        let y = [1.5, -0.0, 7.0, 100.0, 2.0, 0.0];
        let w = [2.0, 3.0, -1.0];
        let mut out = [f32::NAN; 2];
        combine_owned(&ids, owner, &y, &w, &mut out);
        assert_eq!(out[0], 2.0 * 1.5 + -2.0);
        assert_eq!(out[1].to_bits(), 0.0f32.to_bits(), "(+0 + 2·−0) + (+0 + −1·0) is +0");
    }

    #[test]
    fn fold_combine_is_fold_slots_then_combine_shared() {
        let (k, width, n_parts, pitch) = (3usize, 5usize, 2usize, 13usize);
        let parts: Vec<f32> = (0..(k + 1) * pitch).map(|i| ((i * 7919) % 97) as f32 * 0.37 - 17.0).collect();
        let w = [0.5f32, -1.25, 3.0];
        let mut fused = vec![f32::NAN; 2 * width];
        fold_combine(&parts, pitch, n_parts, &w, &mut fused);
        let mut y = vec![0.0f32; (k + 1) * width];
        for s in 0..=k {
            fold_slot(&parts[s * pitch..], n_parts, None, &mut y[s * width..(s + 1) * width]);
        }
        let mut want = vec![0.0f32; 2 * width];
        crate::twins::moe::combine_shared(&y, &w, &mut want);
        assert_eq!(
            fused.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn select_moves_each_slot_from_its_owner_and_leaves_unowned_slots() {
        let rule = OwnerRule { experts: 8, div: 4, modulo: 2 };
        let ids = [bits(5), bits(1), bits(9)];
        // src [2 ranks][3 slots][2]
        let src: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut out = [-1.0f32; 6];
        select_slots(&ids, rule, 2, &src, 6, &mut out);
        assert_eq!(out, [6.0, 7.0, 2.0, 3.0, -1.0, -1.0]);
    }
}
