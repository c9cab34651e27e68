//! What one op does on a rank's arena: the host twin it runs (`memra_kernels::twins`), with the
//! coverage counters the twins' values feed, the planted twin defects of the canaries, and the
//! E4M3 code statistics of the weights it reads.

use super::rows;
use super::{read_slice, write_slice, Arena, Observe};
use crate::backend::{DigestPart, GroupEntry, GroupId, Op, RowOrder, Slice, WeightId};
use crate::evidence::coverage::{self, SeamPoint};
use crate::evidence::defect::{self, TwinDefect};
use memra_kernels::twins::{attention, digest, down8, experts, gemv, moe, norm};

/// The group entry a slot runs on this rank, if it holds one.
fn slot_group_entry(a: &Arena, group: GroupId, ids: &[f32], s: usize) -> Option<GroupEntry> {
    let (experts, entries) = &a.groups[group as usize];
    experts::slot_entry(ids, s, *experts).and_then(|e| entries.get(e).copied().flatten())
}

/// The most weights (rows × columns) of the matrix `which` over the slots this rank holds.
fn slot_weights(
    a: &Arena,
    group: GroupId,
    ids: &[f32],
    first_slot: usize,
    slots: usize,
    which: impl Fn(&GroupEntry) -> WeightId,
) -> usize {
    (first_slot..first_slot + slots)
        .filter_map(|s| slot_group_entry(a, group, ids, s))
        .map(|e| {
            let w = &a.weights[which(&e) as usize];
            w.out_features * w.in_features
        })
        .max()
        .unwrap_or(0)
}

/// Count the E4M3 codes of weights an expert GEMV reads (statistics computed once per weight).
fn note_codes(a: &mut Arena, weights: &[WeightId], at: Option<SeamPoint>) {
    for &w in weights {
        let i = w as usize;
        if a.code_stats.len() <= i {
            a.code_stats.resize(i + 1, None);
        }
        let (n, max, sub) = *a.code_stats[i].get_or_insert_with(|| a.weights[i].e4m3_code_stats());
        coverage::note(&mut a.coverage, coverage::E4M3_CODES, at, n);
        coverage::note(&mut a.coverage, coverage::E4M3_MAX_CODES, at, max);
        coverage::note(&mut a.coverage, coverage::E4M3_SUBNORMAL_CODES, at, sub);
    }
}

/// A canonical GEMV's sums of −0.0 products only (`partials`: K-block partials): counted, and
/// turned into −0.0 when the sums-from-−0.0 defect is planted.
fn observe_gemv(a: &mut Arena, w: WeightId, x: &[f32], out: &mut [f32], partials: bool, obs: Observe) {
    let at = coverage::negative_zero_sums(&a.weights[w as usize].view(), x, out, partials);
    coverage::note(&mut a.coverage, coverage::NEGATIVE_ZERO_SUMS, obs.at, at.len() as u64);
    if obs.defect == Some(TwinDefect::SumsFromNegativeZero) {
        defect::negate_zero_sums(out, &at);
    }
}

/// The grouped expert ops: the per-slot twins of `kernels/cuda/experts.cu`.
fn execute_experts(a: &mut Arena, op: Op, obs: Observe) {
    match op {
        Op::ExpertGateUp { group, route, first_slot, slots, x, limit, fold_up, act, act_pitch } => {
            let ids = read_slice(a, route).to_vec();
            let xv = read_slice(a, x).to_vec();
            // The slots' GEMVs on all cores where they are large (`rows.rs`); what the SwiGLU
            // reaches is counted and applied in slot order on this rank's thread.
            let arena = &*a;
            let work = slot_weights(arena, group, &ids, first_slot, slots, |e| e.gate);
            let rows = rows::per_slot(slots, 2 * work, |j| {
                let e = slot_group_entry(arena, group, &ids, first_slot + j)?;
                let (gw, uw) = (&arena.weights[e.gate as usize], &arena.weights[e.up as usize]);
                // NVFP4_DEV_ROUTES: the up scale waits for the SwiGLU's product.
                let (sg, su) = (e.nvfp4_scales.map(|s| s[0]), e.nvfp4_scales.map(|s| s[1]));
                let (up_scale, folded) = if fold_up { (None, su) } else { (su, None) };
                Some((e, folded, rows::gate_up_rows(gw, uw, &xv, (sg, up_scale))))
            });
            for (j, slot) in rows.into_iter().enumerate() {
                let s = first_slot + j;
                let Some((e, folded, (g, u))) = slot else { continue };
                let shared = s >= ids.len();
                let swiglu = match obs.defect {
                    Some(TwinDefect::SiluUnclamped) => defect::swiglu_silu_unclamped,
                    _ => memra_kernels::canon::swiglu_traced,
                };
                // The clamps the SwiGLU applied (not the operands past the limit: a twin that
                // skips a clamp must show it in the coverage).
                let (mut silu, mut high, mut low) = (0u64, 0u64, 0u64);
                let o: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(&gv, &uv)| {
                        // Only an unclamped layer folds (the program's rule): no clamp to trace.
                        let (v, c) = match folded {
                            Some(su) => (memra_kernels::canon::swiglu_folded(gv, uv, su), Default::default()),
                            None => swiglu(gv, uv, limit),
                        };
                        (silu, high, low) = (silu + c.silu as u64, high + c.up_high as u64, low + c.up_low as u64);
                        v
                    })
                    .collect();
                let cov = &mut a.coverage;
                coverage::note(cov, &coverage::swiglu_path("elements", shared), obs.at, g.len() as u64);
                coverage::note(cov, &coverage::swiglu_path("clamp_silu", shared), obs.at, silu);
                coverage::note(cov, &coverage::swiglu_path("clamp_up_high", shared), obs.at, high);
                coverage::note(cov, &coverage::swiglu_path("clamp_up_low", shared), obs.at, low);
                note_codes(a, &[e.gate, e.up], obs.at);
                write_slice(a, Slice::new(act.buf, act.offset + j * act_pitch, o.len()), &o);
            }
        }
        Op::ExpertGateUpRows { group, route, first_slot, slots, x, gate, up, pitch } => {
            // The SwiGLU's operands only: the program applies (and counts) the SwiGLU itself.
            let ids = read_slice(a, route).to_vec();
            let xv = read_slice(a, x).to_vec();
            let arena = &*a;
            let work = slot_weights(arena, group, &ids, first_slot, slots, |e| e.gate);
            let rows = rows::per_slot(slots, 2 * work, |j| {
                let e = slot_group_entry(arena, group, &ids, first_slot + j)?;
                let (gw, uw) = (&arena.weights[e.gate as usize], &arena.weights[e.up as usize]);
                let scales = (e.nvfp4_scales.map(|s| s[0]), e.nvfp4_scales.map(|s| s[1]));
                Some((e, rows::gate_up_rows(gw, uw, &xv, scales)))
            });
            for (j, slot) in rows.into_iter().enumerate() {
                let Some((e, (g, u))) = slot else { continue };
                note_codes(a, &[e.gate, e.up], obs.at);
                write_slice(a, Slice::new(gate.buf, gate.offset + j * pitch, g.len()), &g);
                write_slice(a, Slice::new(up.buf, up.offset + j * pitch, u.len()), &u);
            }
        }
        Op::ExpertDown { group, route, first_slot, slots, act, act_pitch, out, out_pitch } => {
            let ids = read_slice(a, route).to_vec();
            let arena = &*a;
            let work = slot_weights(arena, group, &ids, first_slot, slots, |e| e.down);
            let outs = rows::per_slot(slots, work, |j| {
                let e = slot_group_entry(arena, group, &ids, first_slot + j)?;
                let d = &arena.weights[e.down as usize];
                let xv = read_slice(arena, Slice::new(act.buf, act.offset + j * act_pitch, d.in_features));
                let n = if d.in_features == 0 { 0 } else { d.in_features / d.kblock_width * d.out_features };
                let mut o = vec![0.0f32; n];
                rows::gemv_partials(d, xv, &mut o);
                Some((e, o))
            });
            for (j, slot) in outs.into_iter().enumerate() {
                let Some((e, o)) = slot else { continue };
                note_codes(a, &[e.down], obs.at);
                write_slice(a, Slice::new(out.buf, out.offset + j * out_pitch, o.len()), &o);
            }
        }
        Op::FoldSlots { route, first_slot, slots, parts, parts_pitch, n_parts, owner, scales, out } => {
            let ids = read_slice(a, route).to_vec();
            let width = out.len / slots.max(1);
            for j in 0..slots {
                let s = first_slot + j;
                if s < ids.len() && owner.is_some_and(|o| !o.owns(&ids, s)) {
                    continue;
                }
                let scale = scales
                    .and_then(|g| slot_group_entry(a, g, &ids, s))
                    .and_then(|e| e.nvfp4_scales)
                    .map(|[_, _, sd]| sd);
                let pv = read_slice(a, Slice::new(parts.buf, parts.offset + j * parts_pitch, n_parts * width)).to_vec();
                let mut o = vec![0.0f32; width];
                experts::fold_slot(&pv, n_parts, scale, &mut o);
                write_slice(a, Slice::new(out.buf, out.offset + j * width, width), &o);
            }
        }
        Op::FoldCombineResidual { parts, pitch, n_parts, w, h, out, sum, x } => {
            let (mut o, mut sv, mut xv) = (vec![0.0f32; out.len], vec![0.0f32; sum.len], vec![0.0f32; x.len]);
            let (p, wv, hv) = (read_slice(a, parts), read_slice(a, w), read_slice(a, h));
            experts::fold_combine_residual(p, pitch, n_parts, wv, hv, &mut o, (&mut sv, &mut xv));
            write_slice(a, out, &o);
            write_slice(a, sum, &sv);
            write_slice(a, x, &xv);
        }
        Op::SelectSlots { route, rule, ranks, src, rank_pitch, out } => {
            let ids = read_slice(a, route).to_vec();
            let mut o = read_slice(a, out).to_vec();
            experts::select_slots(&ids, rule, ranks, read_slice(a, src), rank_pitch, &mut o);
            write_slice(a, out, &o);
        }
        Op::CombineOwned { route, owner, y, w, out } => {
            let ids = read_slice(a, route).to_vec();
            let mut o = vec![0.0f32; out.len];
            experts::combine_owned(&ids, owner, read_slice(a, y), read_slice(a, w), &mut o);
            write_slice(a, out, &o);
        }
        Op::ExpertDownCombine { group, route, owner, act, act_pitch, parts, parts_pitch, w, out, reverse } => {
            // ExpertDown's partials of the owned slots (all cores where large), then the fold and
            // the owner's slot-ordered chain of `twins::down8` on this rank's thread.
            let ids = read_slice(a, route).to_vec();
            let k = ids.len();
            let arena = &*a;
            let work = slot_weights(arena, group, &ids, 0, k, |e| e.down);
            let outs = rows::per_slot(k, work, |s| {
                if !owner.owns(&ids, s) {
                    return None;
                }
                let e = slot_group_entry(arena, group, &ids, s)?;
                let d = &arena.weights[e.down as usize];
                let xv = read_slice(arena, Slice::new(act.buf, act.offset + s * act_pitch, d.in_features));
                let n_parts = if d.in_features == 0 { 0 } else { d.in_features / d.kblock_width };
                let mut o = vec![0.0f32; n_parts * d.out_features];
                rows::gemv_partials(d, xv, &mut o);
                Some((e, n_parts, o))
            });
            let mut held = vec![None; k];
            for (s, slot) in outs.into_iter().enumerate() {
                let Some((e, n_parts, o)) = slot else { continue };
                note_codes(a, &[e.down], obs.at);
                write_slice(a, Slice::new(parts.buf, parts.offset + s * parts_pitch, o.len()), &o);
                held[s] = Some((n_parts, e.nvfp4_scales.map(|[_, _, sd]| sd)));
            }
            let mut o = vec![0.0f32; out.len];
            // `reverse`: the canary's planted reversed chain (canary_down8_slot_order).
            let combine = if reverse { down8::combine_folded_owned_reversed } else { down8::combine_folded_owned };
            combine(&ids, owner, &held, read_slice(a, parts), parts_pitch, read_slice(a, w), &mut o);
            write_slice(a, out, &o);
        }
        other => unreachable!("execute_experts: {} is not a grouped expert op", other.name()),
    }
}

/// The value of one batched digest group on this rank's arena (`digest_batch_f32`'s twin).
pub(super) fn digest_group(a: &Arena, parts: &[DigestPart]) -> u64 {
    let mut total = 0u64;
    for p in parts {
        let ids = p.owned.map(|o| read_slice(a, o.route).to_vec());
        for i in 0..p.blocks {
            if let (Some(o), Some(ids)) = (p.owned, &ids) {
                if !o.owner.owns(ids, o.first_slot + i) {
                    continue;
                }
            }
            let d = digest::digest_f32(read_slice(a, p.block(i)), p.base + i as u64 * p.base_pitch);
            total = total.wrapping_add(d);
        }
    }
    total
}

/// Run one op's host twin on an arena. Inputs are copied out first, so an op may read and write
/// the same buffer (distinct or identical ranges) exactly like an in-place kernel would.
pub(super) fn execute(a: &mut Arena, op: Op, obs: Observe) {
    match op {
        Op::GemvRows { w, x, out, order } => {
            let xv = read_slice(a, x).to_vec();
            let mut o = vec![0.0f32; out.len];
            let shard = &a.weights[w as usize];
            rows::gemv_rows(shard, &xv, order == RowOrder::Tree, &mut o);
            // Only the canonical order's sums are observed (W8 and the tree are NUMERIC doors).
            if shard.w8_view().is_none() && order == RowOrder::Canonical {
                observe_gemv(a, w, &xv, &mut o, false, obs);
            }
            write_slice(a, out, &o);
        }
        Op::GemvRowsBatch { items, x } => {
            for (w, out) in items {
                execute(a, Op::GemvRows { w, x, out, order: RowOrder::Canonical }, obs);
            }
        }
        Op::GemvPartials { w, x, out } => {
            let xv = read_slice(a, x).to_vec();
            let mut o = vec![0.0f32; out.len];
            let shard = &a.weights[w as usize];
            rows::gemv_partials(shard, &xv, &mut o);
            if shard.w8_view().is_none() {
                observe_gemv(a, w, &xv, &mut o, true, obs);
            }
            write_slice(a, out, &o);
        }
        Op::Fold { parts, n_parts, reverse, out } => {
            let mut o = vec![0.0f32; out.len];
            gemv::fold_partials(read_slice(a, parts), n_parts, out.len, reverse, &mut o);
            if obs.defect == Some(TwinDefect::SumsFromNegativeZero) {
                defect::fold_from_negative_zero(read_slice(a, parts), n_parts, &mut o);
            }
            write_slice(a, out, &o);
        }
        Op::Add { a: x, b, out } => {
            let o: Vec<f32> = read_slice(a, x).iter().zip(read_slice(a, b)).map(|(p, q)| p + q).collect();
            write_slice(a, out, &o);
        }
        Op::Scale { x, s, out } => {
            let o: Vec<f32> = read_slice(a, x).iter().map(|v| v * s).collect();
            write_slice(a, out, &o);
        }
        Op::RmsNorm { x, w, eps, out } => {
            let mut o = vec![0.0f32; out.len];
            norm::rmsnorm_rows(read_slice(a, x), read_slice(a, w), eps, &mut o);
            write_slice(a, out, &o);
        }
        Op::AddRmsNorm { x, a: upd, w, eps, h, out } => {
            let (mut hv, mut o) = (vec![0.0f32; h.len], vec![0.0f32; out.len]);
            norm::add_rmsnorm(read_slice(a, x), read_slice(a, upd), read_slice(a, w), eps, &mut hv, &mut o);
            write_slice(a, h, &hv);
            write_slice(a, out, &o);
        }
        Op::FoldAddRmsNorm { parts, n_parts, x, w, eps, a: a_out, h, out } => {
            let mut av = vec![0.0f32; a_out.len];
            gemv::fold_partials(read_slice(a, parts), n_parts, a_out.len, false, &mut av);
            let (mut hv, mut o) = (vec![0.0f32; h.len], vec![0.0f32; out.len]);
            norm::add_rmsnorm(read_slice(a, x), &av, read_slice(a, w), eps, &mut hv, &mut o);
            write_slice(a, a_out, &av);
            write_slice(a, h, &hv);
            write_slice(a, out, &o);
        }
        Op::QkNormRope { x, w, eps, cos_sin } => {
            let mut xv = read_slice(a, x).to_vec();
            attention::qk_norm_rope(&mut xv, read_slice(a, w), eps, read_slice(a, cos_sin));
            write_slice(a, x, &xv);
        }
        Op::Attention { q, k, v, gate, len, q_heads, kv_heads, out } => {
            let mut o = vec![0.0f32; out.len];
            attention::decode_attention(
                read_slice(a, q),
                read_slice(a, k),
                read_slice(a, v),
                read_slice(a, gate),
                len,
                q_heads,
                kv_heads,
                &mut o,
            );
            write_slice(a, out, &o);
        }
        Op::Router { logits, bias, k, normalize, scaling, out, device_variant } => {
            let (lv, bv) = (read_slice(a, logits), read_slice(a, bias));
            let (ids, weights) = if device_variant {
                moe::router_topk_device_variant(lv, bv, k, normalize, scaling)
            } else if obs.defect == Some(TwinDefect::RouterTiesToHigherId) {
                moe::router_topk_ties_high(lv, bv, k, normalize, scaling)
            } else {
                moe::router_topk(lv, bv, k, normalize, scaling)
            };
            let (in_topk, boundary) = coverage::router_ties(lv, bv, &ids);
            coverage::note(&mut a.coverage, coverage::ROUTER_CALLS, obs.at, 1);
            coverage::note(&mut a.coverage, coverage::TIE_IN_TOPK, obs.at, u64::from(in_topk));
            coverage::note(&mut a.coverage, coverage::TIE_AT_BOUNDARY, obs.at, u64::from(boundary));
            let o: Vec<f32> = ids.iter().map(|i| f32::from_bits(*i)).chain(weights).collect();
            write_slice(a, out, &o);
        }
        Op::Swiglu { gate, up, limit, out } => {
            let mut o = vec![0.0f32; out.len];
            moe::swiglu(read_slice(a, gate), read_slice(a, up), limit, &mut o);
            write_slice(a, out, &o);
        }
        Op::Combine { y, w, out } => {
            let mut o = vec![0.0f32; out.len];
            moe::combine_slots(read_slice(a, y), read_slice(a, w), out.len, &mut o);
            write_slice(a, out, &o);
        }
        Op::CombineShared { y, w, out } => {
            let mut o = vec![0.0f32; out.len];
            moe::combine_shared(read_slice(a, y), read_slice(a, w), &mut o);
            write_slice(a, out, &o);
        }
        Op::CombineScaled { route, y, w, macros, out } => {
            let mut o = vec![0.0f32; out.len];
            let (ids, m) = (read_slice(a, route), read_slice(a, macros));
            moe::combine_scaled(ids, m, read_slice(a, y), read_slice(a, w), &mut o);
            write_slice(a, out, &o);
        }
        Op::ResidualAdd { h, a: x, b, sum, out } => {
            let (mut sv, mut o) = (vec![0.0f32; sum.len], vec![0.0f32; out.len]);
            moe::residual_add(read_slice(a, h), read_slice(a, x), read_slice(a, b), &mut sv, &mut o);
            write_slice(a, sum, &sv);
            write_slice(a, out, &o);
        }
        Op::Argmax { x, out } => {
            let idx = moe::argmax(read_slice(a, x));
            write_slice(a, out, &[f32::from_bits(idx)]);
        }
        Op::FlipLowBit { x } => {
            let v = read_slice(a, x.sub(0, 1))[0];
            write_slice(a, x.sub(0, 1), &[f32::from_bits(v.to_bits() ^ 1)]);
        }
        Op::SetU32 { out, value } => write_slice(a, out.sub(0, 1), &[f32::from_bits(value)]),
        // Bits, not values: a route id is a u32 bit pattern (a denormal or NaN as an f32).
        Op::MirrorSel { src, out } => {
            let bits = read_slice(a, src).to_vec();
            write_slice(a, out, &bits);
        }
        Op::QkNormRopeAt { x, w, eps, table, pos } => {
            let p = read_slice(a, pos.sub(0, 1))[0].to_bits();
            let mut xv = read_slice(a, x).to_vec();
            if attention::qk_norm_rope_at(&mut xv, read_slice(a, w), eps, read_slice(a, table), p) {
                write_slice(a, x, &xv);
            }
        }
        Op::AttentionAt { q, k, v, gate, pos, max_len, q_heads, kv_heads, partition, out } => {
            let p = read_slice(a, pos.sub(0, 1))[0].to_bits();
            let mut o = vec![0.0f32; out.len];
            let (qv, kv, vv, gv) = (read_slice(a, q), read_slice(a, k), read_slice(a, v), read_slice(a, gate));
            if attention::decode_attention_at(qv, kv, vv, gv, p, max_len, q_heads, kv_heads, partition, &mut o) {
                write_slice(a, out, &o);
            }
        }
        Op::IncU32 { out, by } => {
            let p = read_slice(a, out.sub(0, 1))[0].to_bits();
            write_slice(a, out.sub(0, 1), &[f32::from_bits(p.wrapping_add(by))]);
        }
        // Defined lane by lane: each lane is exactly its AttentionAt (walk_once changes how a
        // device reads the keys, never a value).
        Op::AttentionRows {
            rows, q, k, v, gate, pos, out, pitch: pt, max_len, q_heads, kv_heads, partition, ..
        } => {
            for i in 0..rows {
                let b = |s: Slice, pitch: usize| crate::backend::op::block(s, pitch, i);
                let lane = Op::AttentionAt {
                    q: b(q, pt.q),
                    k: b(k, pt.kv),
                    v: b(v, pt.kv),
                    gate: b(gate, pt.gate),
                    pos: b(pos, pt.pos),
                    max_len,
                    q_heads,
                    kv_heads,
                    partition,
                    out: b(out, pt.out),
                };
                execute(a, lane, obs);
            }
        }
        Op::FoldLanes { lanes, parts, parts_pitch, n_parts, out, out_pitch } => {
            for i in 0..lanes {
                let (parts, out) =
                    (crate::backend::op::block(parts, parts_pitch, i), crate::backend::op::block(out, out_pitch, i));
                execute(a, Op::Fold { parts, n_parts, reverse: false, out }, obs);
            }
        }
        Op::AppendAt { src, cache, pos } => {
            let p = read_slice(a, pos.sub(0, 1))[0].to_bits();
            let sv = read_slice(a, src).to_vec();
            let mut cv = read_slice(a, cache).to_vec();
            if attention::append_at(&sv, &mut cv, p) {
                write_slice(a, cache, &cv);
            }
        }
        Op::RopeAppend { q, k, v, q_norm, k_norm, eps, table, pos, q_out, k_out, k_cache, v_cache } => {
            let p = read_slice(a, pos.sub(0, 1))[0].to_bits();
            let (mut qo, mut ko) = (read_slice(a, q_out).to_vec(), read_slice(a, k_out).to_vec());
            let (mut kc, mut vc) = (read_slice(a, k_cache).to_vec(), read_slice(a, v_cache).to_vec());
            let (qv, kv, vv) = (read_slice(a, q), read_slice(a, k), read_slice(a, v));
            let norms = (read_slice(a, q_norm), read_slice(a, k_norm));
            let t = read_slice(a, table);
            if attention::rope_append(qv, kv, vv, norms, eps, t, p, &mut qo, &mut ko, (&mut kc, &mut vc)) {
                write_slice(a, q_out, &qo);
                write_slice(a, k_out, &ko);
                write_slice(a, k_cache, &kc);
                write_slice(a, v_cache, &vc);
            }
        }
        op @ (Op::ExpertGateUp { .. }
        | Op::ExpertGateUpRows { .. }
        | Op::ExpertDown { .. }
        | Op::FoldSlots { .. }
        | Op::FoldCombineResidual { .. }
        | Op::SelectSlots { .. }
        | Op::CombineOwned { .. }
        | Op::ExpertDownCombine { .. }) => execute_experts(a, op, obs),
    }
}
