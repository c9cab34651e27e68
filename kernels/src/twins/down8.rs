//! SEL_DOWN8: the NVFP4 down sweep of an owner's routed slots fused with its route-weight
//! combine (`expert_down_combine_f32` in `cuda/down8.cu`).
//!
//! Why a twin of its own: the door claims BIT-IDENTICAL, so its arithmetic must be the
//! composition of the three unfused twins it replaces — the down K-block partials
//! (`gemv::gemv_partials`), the slot fold with the NVFP4 down scale once after it
//! (`experts::fold_slot`) and NVFP4_EP2's owner sum (`experts::combine_owned`). This module calls
//! exactly those functions per slot, so the identity holds by construction; what it adds is only
//! that no folded slot output is stored between them, and its tests hold it to the unfused chain
//! bit for bit (signed zeros included).

// `acc = acc + t` is written out: each line is one IEEE operation with its operand order.
#![allow(clippy::assign_op_pattern)]

use crate::twins::experts::{fold_slot, SlotOwner};
use crate::twins::gemv::{gemv_partials, MatrixView};

/// The widest down row one warp sweeps for a slot: 32 chunks of 32 values (the engine's
/// condition `(local_in >> 5) <= 32`). Wider experts keep the unfused path.
pub const DOWN8_MAX_COLS: usize = 32 * 32;

/// The down projection of one routed slot as its rank holds it: the matrix and its NVFP4
/// per-matrix scale (applied once after the fold).
#[derive(Debug, Clone, Copy)]
pub struct DownSlot<'a> {
    pub view: MatrixView<'a>,
    pub scale: Option<f32>,
}

/// The combine half (what the kernel does after its partials): `out = +0`, then for every
/// routed slot s in slot order that `owner` owns and `downs[s]` holds:
/// `y = fold_slot(parts[s·parts_pitch ..], G, scale)`, and per element
/// `t = +0 + w[s]·y[i]; out[i] = out[i] + t` — `combine_owned`'s chain over `fold_slot`'s values.
/// `held[s]`: the slot's K-block count G and down scale, `None` where the rank has no entry.
pub fn combine_folded_owned(
    ids: &[f32],
    owner: SlotOwner,
    held: &[Option<(usize, Option<f32>)>],
    parts: &[f32],
    parts_pitch: usize,
    w: &[f32],
    out: &mut [f32],
) {
    combine_in_order(ids, owner, held, (parts, parts_pitch), w, out, 0..ids.len());
}

/// A PLANTED DEFECT (canary `canary_down8_slot_order`): [`combine_folded_owned`] with the owner's
/// slots summed in REVERSE slot order (s = k−1 down to 0) — the same terms, the same +0.0 start,
/// another association of the chain. Two terms commute in IEEE arithmetic, so it differs from
/// the canonical chain only where an owner sums three slots or more.
pub fn combine_folded_owned_reversed(
    ids: &[f32],
    owner: SlotOwner,
    held: &[Option<(usize, Option<f32>)>],
    parts: &[f32],
    parts_pitch: usize,
    w: &[f32],
    out: &mut [f32],
) {
    combine_in_order(ids, owner, held, (parts, parts_pitch), w, out, (0..ids.len()).rev());
}

/// The owner's chain over the slots in `order` (skipping slots not owned or not held).
fn combine_in_order(
    ids: &[f32],
    owner: SlotOwner,
    held: &[Option<(usize, Option<f32>)>],
    (parts, parts_pitch): (&[f32], usize),
    w: &[f32],
    out: &mut [f32],
    order: impl Iterator<Item = usize>,
) {
    let width = out.len();
    out.fill(0.0);
    let mut y = vec![0.0f32; width];
    for s in order {
        let Some((n_parts, scale)) = held[s] else { continue };
        if !owner.owns(ids, s) {
            continue;
        }
        fold_slot(&parts[s * parts_pitch..], n_parts, scale, &mut y);
        for (o, &v) in out.iter_mut().zip(&y) {
            let t = 0.0f32 + w[s] * v;
            *o = *o + t;
        }
    }
}

/// The whole fused op: for every owned, held routed slot s the down K-block partials of
/// `act[s·act_pitch ..]` are written to `parts[s·parts_pitch ..]` (`[K-block][rows]`, the
/// experts seam's evidence, exactly `expert_down`'s), then [`combine_folded_owned`] sums the
/// slots into `out` (`out.len()` = the down rows). Slots that are not owned or not held write
/// nothing.
#[allow(clippy::too_many_arguments)]
pub fn down_combine_owned(
    ids: &[f32],
    owner: SlotOwner,
    downs: &[Option<DownSlot>],
    act: &[f32],
    act_pitch: usize,
    parts: &mut [f32],
    parts_pitch: usize,
    w: &[f32],
    out: &mut [f32],
) {
    let mut held = vec![None; ids.len()];
    for s in 0..ids.len() {
        let Some(d) = downs[s] else { continue };
        if !owner.owns(ids, s) {
            continue;
        }
        let v = d.view;
        let n_parts = if v.in_features == 0 { 0 } else { v.in_features / v.kblock_width };
        let x = &act[s * act_pitch..s * act_pitch + v.in_features];
        gemv_partials(&v, x, &mut parts[s * parts_pitch..s * parts_pitch + n_parts * v.out_features]);
        held[s] = Some((n_parts, d.scale));
    }
    combine_folded_owned(ids, owner, &held, parts, parts_pitch, w, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::nvfp4::Nvfp4Matrix;
    use crate::twins::experts::{combine_owned, OwnerRule};
    use crate::twins::gemv::WeightRef;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The fused twin equals expert_down + fold_slot(scale) + combine_owned bit for bit, for
    /// both owners of an interleaved route, with -0.0 activations and weights (so slots whose
    /// products are all -0.0 exist: their +0.0 starts decide the sign), and a non-expert id
    /// (skipped by both).
    #[test]
    fn fused_down_combine_is_the_unfused_chain_bit_for_bit() {
        let (rows, cols, kw, k) = (24usize, 64usize, 16usize, 4usize);
        let mats: Vec<Nvfp4Matrix> = (0..3)
            .map(|e| {
                let mut v = values(rows * cols, 11 + e);
                if e == 2 {
                    v.iter_mut().for_each(|x| *x = -0.0); // an all -0.0 expert
                }
                Nvfp4Matrix::quantize(&v, rows, cols).unwrap()
            })
            .collect();
        fn view(m: &Nvfp4Matrix, kw: usize) -> MatrixView<'_> {
            let w = WeightRef::Nvfp4 { packed: &m.packed, scales: &m.scales };
            MatrixView { w, out_features: m.out_features, in_features: m.in_features, kblock_width: kw }
        }
        // Route: experts 0, 2, 1, and a non-expert id.
        let ids = [0u32, 2, 1, 9].map(f32::from_bits);
        let expert_of = [Some(0usize), Some(2), Some(1), None];
        let (act_pitch, parts_pitch) = (cols + 3, (cols / kw) * rows + 5);
        let mut act = values(k * act_pitch, 5);
        act[act_pitch..2 * act_pitch].iter_mut().for_each(|x| *x = -0.0);
        let w = [0.75f32, -0.0, 1.5, 2.0];
        let rule = OwnerRule { experts: 3, div: 1, modulo: 2 };
        for want in 0..2u32 {
            let owner = SlotOwner { rule, want };
            let downs: Vec<Option<DownSlot>> = expert_of
                .iter()
                .map(|e| e.map(|e| DownSlot { view: view(&mats[e], kw), scale: Some(mats[e].global_scale) }))
                .collect();
            let mut parts = vec![f32::NAN; k * parts_pitch];
            let mut fused = vec![f32::NAN; rows];
            down_combine_owned(&ids, owner, &downs, &act, act_pitch, &mut parts, parts_pitch, &w, &mut fused);
            // Unfused: partials, folded slot outputs, then the owner sum.
            let mut want_parts = vec![f32::NAN; k * parts_pitch];
            let mut y = vec![f32::NAN; k * rows];
            for s in 0..k {
                let (Some(d), true) = (downs[s], owner.owns(&ids, s)) else { continue };
                let p = &mut want_parts[s * parts_pitch..s * parts_pitch + (cols / kw) * rows];
                gemv_partials(&d.view, &act[s * act_pitch..s * act_pitch + cols], p);
                fold_slot(&want_parts[s * parts_pitch..], cols / kw, d.scale, &mut y[s * rows..(s + 1) * rows]);
            }
            let mut unfused = vec![f32::NAN; rows];
            combine_owned(&ids, owner, &y, &w, &mut unfused);
            assert_eq!(bits(&fused), bits(&unfused), "owner {want}: the combine");
            assert_eq!(bits(&parts), bits(&want_parts), "owner {want}: the partials written (NaN = untouched)");
            assert!(fused.iter().all(|v| v.is_finite()));
        }
        // Owner 0 holds slots 0 (expert 0) and 1 (expert 2, all -0.0 weights, -0.0 input, weight
        // -0.0): slot 1's products are signed zeros that only the +0.0 starts turn into +0.0.
        let owner = SlotOwner { rule, want: 0 };
        let only_zero = [Some(DownSlot { view: view(&mats[2], kw), scale: Some(1.0) }), None, None, None];
        let ids0 = [2u32, 9, 9, 9].map(f32::from_bits);
        let mut parts = vec![0.0f32; k * parts_pitch];
        let mut out = vec![f32::NAN; rows];
        down_combine_owned(&ids0, owner, &only_zero, &act, act_pitch, &mut parts, parts_pitch, &[-1.0; 4], &mut out);
        assert!(out.iter().all(|v| v.to_bits() == 0), "a -0.0 slot sums to +0.0 from the +0.0 start: {out:?}");
    }

    /// A combine that starts its chain from the first product, or walks the slots backwards, is
    /// not this twin: the test above would see it (negative control of the comparison).
    #[test]
    fn a_reversed_or_unanchored_chain_differs_from_the_twin() {
        let ids = [0u32, 2, 4].map(f32::from_bits);
        let owner = SlotOwner { rule: OwnerRule { experts: 8, div: 1, modulo: 2 }, want: 0 };
        let held = [Some((1usize, None)); 3];
        // One partial per slot, width 1: y = [1.0, 1e8, -1e8]; w = 1.
        let parts = [1.0f32, 1e8, -1e8];
        let w = [1.0f32; 3];
        let mut out = [f32::NAN];
        combine_folded_owned(&ids, owner, &held, &parts, 1, &w, &mut out);
        let reversed = ((0.0f32 + -1e8) + 1e8) + 1.0;
        assert_eq!(out[0].to_bits(), (((0.0f32 + 1.0) + 1e8) + -1e8).to_bits());
        assert_ne!(out[0].to_bits(), reversed.to_bits(), "slot order is visible");
        let (neg, mut o) = ([-0.0f32], [f32::NAN]);
        combine_folded_owned(&ids[..1], owner, &held[..1], &neg, 1, &w, &mut o);
        assert_eq!(o[0].to_bits(), 0.0f32.to_bits(), "+0.0 start");
        assert_ne!(o[0].to_bits(), (-0.0f32 * 1.0).to_bits(), "a chain from the first product keeps -0.0");
    }

    /// The planted defect (canary_down8_slot_order) is the reversed chain: with three owned slots
    /// it has the bits of the reversed sum and not the canonical one's; with two it commutes.
    #[test]
    fn the_reversed_twin_sums_the_slots_backwards() {
        let ids = [0u32, 2, 4].map(f32::from_bits);
        let owner = SlotOwner { rule: OwnerRule { experts: 8, div: 1, modulo: 2 }, want: 0 };
        let held = [Some((1usize, None)); 3];
        let (parts, w) = ([1.0f32, 1e8, -1e8], [1.0f32; 3]);
        let (mut canon, mut rev) = ([f32::NAN], [f32::NAN]);
        combine_folded_owned(&ids, owner, &held, &parts, 1, &w, &mut canon);
        combine_folded_owned_reversed(&ids, owner, &held, &parts, 1, &w, &mut rev);
        assert_eq!(rev[0].to_bits(), (((0.0f32 + -1e8) + 1e8) + 1.0).to_bits());
        assert_ne!(rev[0].to_bits(), canon[0].to_bits(), "three slots: the order shows");
        combine_folded_owned(&ids[..2], owner, &held[..2], &parts, 1, &w, &mut canon);
        combine_folded_owned_reversed(&ids[..2], owner, &held[..2], &parts, 1, &w, &mut rev);
        assert_eq!(rev[0].to_bits(), canon[0].to_bits(), "two slots commute");
    }
}
