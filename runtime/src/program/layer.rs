//! One decoder layer: the attention half (attn_norm … ffn_norm) and the MoE half (router …
//! residual). Every arithmetic step is one kernel on one rank; every cross-rank step is a copy —
//! except under the direct-join doors (OPROJ_DIRECT, MOE_DIRECT), where a peer's last kernel of a
//! join stores its output straight into the root's buffer (a peer store) and nothing is copied.

use super::placement::ExpertMode;
use super::{Ctx, Part};
use crate::backend::{JoinFence, Op, Packed, RowOrder, Slice};
use crate::config::{Canary, Transport};
use crate::record::Seam;
use crate::Result;

/// Run `op` with its output going to `dst`, a slice of the root: rank 0 launches it there
/// directly; a peer stores into the root's memory (a direct join's peer store, counted under
/// `counter` because it really crossed ranks).
fn store_to_root(ctx: &mut Ctx, rank: usize, op: Op, dst: Slice, fence: JoinFence, counter: &str) -> Result<()> {
    let op = op.with_store_target(dst);
    if rank == 0 {
        ctx.b.launch(0, op)
    } else {
        ctx.b.launch_peer_store(rank, op, 0, fence)?;
        ctx.count(counter);
        Ok(())
    }
}

/// Root → every other rank (the replicated rows of attn_norm and ffn_norm).
fn broadcast(ctx: &mut Ctx, src: Slice, dst: impl Fn(&super::buffers::RankBuffers) -> Slice) -> Result<()> {
    for r in 1..ctx.p.tp {
        let d = dst(&ctx.buf.ranks[r]);
        ctx.b.copy(ctx.cfg.transport, 0, src, r, d)?;
    }
    Ok(())
}

/// The attention half of layer `l` at position `pos`; with GRAPH, one graph segment per layer
/// (recorded, captured, then replayed by the backend).
pub(super) fn attention_half(ctx: &mut Ctx, l: usize, pos: usize) -> Result<()> {
    if !ctx.graph_segment(l) {
        return attention_half_calls(ctx, l, pos);
    }
    ctx.b.segment_begin(l as u64)?;
    match attention_half_calls(ctx, l, pos) {
        Ok(()) => ctx.b.segment_end(),
        Err(e) => {
            ctx.b.segment_abort();
            Err(e)
        }
    }
}

fn attention_half_calls(ctx: &mut Ctx, l: usize, pos: usize) -> Result<()> {
    let c = &ctx.model.config;
    let (hidden, hd, eps) = (c.hidden, c.head_dim, c.eps);
    let (qh, kvh) = (c.q_heads, c.kv_heads);
    let tp = ctx.p.tp;
    let root = ctx.buf.root.clone();
    let lay = ctx.w.param_layout.clone();
    let order = if ctx.cfg.doors.qkv_fused { RowOrder::Tree } else { RowOrder::Canonical };

    // attn_norm: root normalizes the residual stream, then replicates it.
    ctx.begin()?;
    let normed0 = ctx.buf.ranks[0].normed;
    ctx.b.launch(0, Op::RmsNorm { x: root.x, w: lay.attn_norm(ctx.w.params[0], l), eps, out: normed0 })?;
    ctx.seam(l, Seam::AttnNorm, &Ctx::root_part(normed0))?;
    broadcast(ctx, normed0, |rb| rb.normed)?;

    // qkv: column-parallel, each rank its chunks of whole heads.
    ctx.begin()?;
    let mut parts: Vec<Part> = Vec::new();
    for r in 0..tp {
        let (rb, h) = (ctx.buf.ranks[r].clone(), ctx.w.layers[l][r].clone());
        for (w, out) in [(h.wq, rb.q), (h.wk, rb.k), (h.wv, rb.v), (h.wg, rb.g)] {
            ctx.b.launch(r, Op::GemvRows { w, x: rb.normed, out, order })?;
        }
        let (lq, lkv) = (rb.q.len, rb.k.len);
        parts.push((r, rb.q, (r * lq) as u64));
        parts.push((r, rb.k, (qh * hd + r * lkv) as u64));
        parts.push((r, rb.v, (qh * hd + kvh * hd + r * lkv) as u64));
        parts.push((r, rb.g, (qh * hd + 2 * kvh * hd + r * rb.g.len) as u64));
    }
    if ctx.cfg.doors.w8 {
        ctx.count("w8.int8_gemvs");
    }
    if ctx.cfg.doors.qkv_fused {
        ctx.count("qkv_fused.fused_launches");
    }
    ctx.seam(l, Seam::Qkv, &parts)?;

    // rope: per-head q/k norm + RoPE, then K/V appended to this rank's cache at `pos`. With
    // GRAPH the launches read the position from device memory (`rb.pos`), so a captured layer
    // replays unchanged at every position.
    ctx.begin()?;
    let graph = ctx.cfg.doors.graph;
    let max_len = ctx.model.config.max_positions;
    let mut parts: Vec<Part> = Vec::new();
    for r in 0..tp {
        let rb = ctx.buf.ranks[r].clone();
        let prm = ctx.w.params[r];
        let lkv = rb.k.len;
        let (qn, kn) = (lay.q_norm(prm, l), lay.k_norm(prm, l));
        if graph {
            let (table, pos) = (lay.rope_table(prm), rb.pos);
            ctx.b.launch(r, Op::QkNormRopeAt { x: rb.q, w: qn, eps, table, pos })?;
            ctx.b.launch(r, Op::QkNormRopeAt { x: rb.k, w: kn, eps, table, pos })?;
            ctx.b.launch(r, Op::AppendAt { src: rb.k, cache: Slice::new(rb.kc[l], 0, max_len * lkv), pos })?;
            ctx.b.launch(r, Op::AppendAt { src: rb.v, cache: Slice::new(rb.vc[l], 0, max_len * lkv), pos })?;
        } else {
            let cs = lay.rope(prm, pos);
            ctx.b.launch(r, Op::QkNormRope { x: rb.q, w: qn, eps, cos_sin: cs })?;
            ctx.b.launch(r, Op::QkNormRope { x: rb.k, w: kn, eps, cos_sin: cs })?;
            ctx.b.copy(ctx.cfg.transport, r, rb.k, r, Slice::new(rb.kc[l], pos * lkv, lkv))?;
            ctx.b.copy(ctx.cfg.transport, r, rb.v, r, Slice::new(rb.vc[l], pos * lkv, lkv))?;
        }
        parts.push((r, rb.q, (r * rb.q.len) as u64));
        parts.push((r, rb.k, (qh * hd + r * lkv) as u64));
    }
    ctx.seam(l, Seam::Rope, &parts)?;

    // attn: decode attention over the cache, gated per head.
    ctx.begin()?;
    let mut parts: Vec<Part> = Vec::new();
    for r in 0..tp {
        let rb = ctx.buf.ranks[r].clone();
        let lkv = rb.k.len;
        let (q_heads, kv_heads) = (ctx.p.q_heads_per_rank, ctx.p.kv_heads_per_rank);
        let op = if graph {
            let (k, v) = (Slice::new(rb.kc[l], 0, max_len * lkv), Slice::new(rb.vc[l], 0, max_len * lkv));
            Op::AttentionAt { q: rb.q, k, v, gate: rb.g, pos: rb.pos, max_len, q_heads, kv_heads, out: rb.attn }
        } else {
            let len = pos + 1;
            let (k, v) = (Slice::new(rb.kc[l], 0, len * lkv), Slice::new(rb.vc[l], 0, len * lkv));
            Op::Attention { q: rb.q, k, v, gate: rb.g, len, q_heads, kv_heads, out: rb.attn }
        };
        ctx.b.launch(r, op)?;
        parts.push((r, rb.attn, (r * rb.attn.len) as u64));
    }
    ctx.seam(l, Seam::Attn, &parts)?;

    // o_proj: each rank's canonical K-block partials of the row-parallel output projection.
    ctx.begin()?;
    // SkipFence canary: a peer's partials are copied to the root without waiting for their
    // producer — the race a missing fence opens (o_join reads them).
    let skip_fence = ctx.cfg.doors.canary == Some(Canary::SkipFence) && tp > 1;
    // OPROJ_DIRECT: every rank's partials land in root.opart_all at their canonical offset (peers
    // by peer stores), so the o_join moves nothing. Not when a canary needs the rank-local
    // producer buffer: skip_fence copies it unfenced, and a stale step must leave the previous
    // step's partials in the root's buffer.
    let direct = ctx.cfg.doors.oproj_direct && !skip_fence && !ctx.stale();
    let mut parts: Vec<Part> = Vec::new();
    for r in 0..tp {
        let rb = ctx.buf.ranks[r].clone();
        let wo = ctx.w.layers[l][r].wo;
        let at = root.opart_all.sub(r * rb.opart.len, rb.opart.len);
        let base = (r * rb.opart.len) as u64;
        if skip_fence && r != 0 {
            // Issued before its producer: with no fence, nothing stops the copy from running
            // first, and on a fast device that is what it does — so the defect shows every time.
            ctx.b.copy_unfenced(ctx.cfg.transport, r, rb.opart, 0, at)?;
            ctx.count("canary_skip_fence.skipped_fences");
        }
        let op = Op::GemvPartials { w: wo, x: rb.attn, out: rb.opart };
        if direct {
            // The seam's digest reads the root-resident slice: same global indices, same bits.
            store_to_root(ctx, r, op, at, JoinFence::Events, "oproj_direct.peer_stores")?;
            parts.push((0, at, base));
        } else {
            ctx.b.launch(r, op)?;
            parts.push((r, rb.opart, base));
        }
        if ctx.cfg.doors.w8 {
            ctx.count("w8.int8_gemvs");
        }
    }
    ctx.seam(l, Seam::OProj, &parts)?;

    // o_join: partials moved to the root (already there under OPROJ_DIRECT), reduced in
    // canonical order (or deferred into the ffn_norm kernel by OPROJ_TAIL).
    ctx.begin()?;
    let g = ctx.p.o_kblocks;
    if ctx.cfg.doors.nccl_allreduce {
        // NCCL_ALLREDUCE (NUMERIC, o_join only; the moe_join stays canonical): each rank folds
        // its own K-blocks from +0.0 into a local vector (its `xin`, free until ffn_norm), then
        // NCCL sums the TP vectors in its own order into the root's ojoin.
        if ctx.cfg.transport != Transport::Nccl || ctx.cfg.doors.oproj_tail {
            return Err(crate::RuntimeError::Config(format!(
                "MEMRA_NCCL_ALLREDUCE runs on an NCCL communicator and replaces the o_join fold: it needs the \
                 nccl transport (not {}) and cannot be combined with MEMRA_OPROJ_TAIL",
                ctx.cfg.transport.name()
            )));
        }
        let mut sums = Vec::with_capacity(tp);
        for r in 0..tp {
            let rb = &ctx.buf.ranks[r];
            let (opart, local) = (rb.opart, rb.xin);
            ctx.b.launch(r, Op::Fold { parts: opart, n_parts: g / tp, reverse: false, out: local })?;
            sums.push((r, local));
        }
        ctx.b.all_reduce_sum(&sums, 0, root.ojoin)?;
        ctx.count("nccl_allreduce.allreduces");
    } else if ctx.stale() {
        ctx.count("canary_stale_buffer.stale_reads");
    } else if !direct {
        for r in 0..tp {
            let src = ctx.buf.ranks[r].opart;
            let dst = root.opart_all.sub(r * src.len, src.len);
            if skip_fence && r != 0 {
                continue; // already copied, unfenced, in the o_proj seam
            }
            ctx.b.copy(ctx.cfg.transport, r, src, 0, dst)?;
        }
    }
    let reverse = ctx.cfg.doors.canary == Some(Canary::ReverseKBlocks) && tp > 1;
    let ffn_w = lay.ffn_norm(ctx.w.params[0], l);
    if ctx.cfg.doors.oproj_tail {
        // The add happens inside the ffn_norm kernel: same operands, same order.
        ctx.b.launch(
            0,
            Op::FoldAddRmsNorm {
                parts: root.opart_all,
                n_parts: g,
                x: root.x,
                w: ffn_w,
                eps,
                a: root.ojoin,
                h: root.h,
                out: ctx.buf.ranks[0].xin,
            },
        )?;
        ctx.count("oproj_tail.fused_joins");
    } else if !ctx.cfg.doors.nccl_allreduce {
        ctx.b.launch(0, Op::Fold { parts: root.opart_all, n_parts: g, reverse, out: root.ojoin })?;
        if reverse {
            // Counted only where the reversed fold really ran (the OPROJ_TAIL kernel has none).
            ctx.count("canary_reverse_kblocks.reversed_folds");
        }
    }
    ctx.seam(l, Seam::OJoin, &Ctx::root_part(root.ojoin))?;

    // ffn_norm: residual add + RMSNorm.
    ctx.begin()?;
    let xin0 = ctx.buf.ranks[0].xin;
    if !ctx.cfg.doors.oproj_tail {
        ctx.b.launch(0, Op::AddRmsNorm { x: root.x, a: root.ojoin, w: ffn_w, eps, h: root.h, out: xin0 })?;
    }
    ctx.seam(l, Seam::FfnNorm, &[(0, root.h, 0), (0, xin0, hidden as u64)])
}

pub(super) fn moe_half(ctx: &mut Ctx, l: usize) -> Result<()> {
    let c = ctx.model.config.clone();
    let hidden = c.hidden;
    let tp = ctx.p.tp;
    let root = ctx.buf.root.clone();
    let lay = ctx.w.param_layout.clone();
    let doors = ctx.cfg.doors;
    let xin0 = ctx.buf.ranks[0].xin;
    // MOE_DIRECT: expert outputs reach the root by peer stores, fenced by events or, under
    // FENCE_MEMOPS, by doorbells.
    let direct = doors.moe_direct;
    let fence = if doors.fence_memops { JoinFence::Doorbells } else { JoinFence::Events };

    // ROUTES_PRESTAGE: the expert input is broadcast before the router runs.
    if doors.routes_prestage {
        broadcast(ctx, xin0, |rb| rb.xin)?;
        ctx.count("routes_prestage.early_broadcasts");
    }
    // router: root GEMV + sigmoid top-k.
    ctx.begin()?;
    let router_w = ctx.w.layers[l][0].router.expect("the root holds the router");
    ctx.b.launch(0, Op::GemvRows { w: router_w, x: xin0, out: root.router_logits, order: RowOrder::Canonical })?;
    ctx.b.launch(
        0,
        Op::Router {
            logits: root.router_logits,
            bias: lay.router_bias(ctx.w.params[0], l),
            k: c.top_k,
            normalize: c.route_norm,
            scaling: c.route_scale,
            out: root.route,
            device_variant: doors.dev_router,
        },
    )?;
    if doors.dev_router {
        ctx.count("dev_router.device_selections");
    }
    ctx.seam(l, Seam::Router, &Ctx::root_part(root.route))?;
    let route = ctx.b.read(0, root.route)?;
    let ids: Vec<usize> = route[..c.top_k].iter().map(|v| v.to_bits() as usize).collect();
    if let Some(bad) = ids.iter().find(|e| **e >= c.experts) {
        return Err(crate::RuntimeError::Device {
            location: format!("layer {l} router"),
            detail: format!("selected expert id {bad} is outside 0..{}", c.experts),
        });
    }
    if !doors.routes_prestage {
        broadcast(ctx, xin0, |rb| rb.xin)?;
    }

    // experts: each selected expert (TP shards or whole on its owner) and the shared expert.
    ctx.begin()?;
    let gmax = ctx.buf.gmax;
    let slot_stride = gmax * hidden;
    let mut parts: Vec<Part> = Vec::new();
    let slots: Vec<Option<usize>> = ids.iter().map(|e| Some(*e)).chain([None]).collect();
    for (s, expert) in slots.iter().enumerate() {
        for r in 0..tp {
            let h = &ctx.w.layers[l][r];
            let held = match expert {
                Some(e) => h.experts[*e],
                None => h.shared,
            };
            let Some(eh) = held else { continue };
            let rb = ctx.buf.ranks[r].clone();
            let limit = c.swiglu_limit;
            let (gate, up, act) = (rb.eg.sub(0, eh.width), rb.eu.sub(0, eh.width), rb.ea.sub(0, eh.width));
            ctx.b.launch(r, Op::GemvRows { w: eh.gate, x: rb.xin, out: gate, order: RowOrder::Canonical })?;
            ctx.b.launch(r, Op::GemvRows { w: eh.up, x: rb.xin, out: up, order: RowOrder::Canonical })?;
            if let Some([sg, su, _]) = eh.nvfp4_scales {
                ctx.b.launch(r, Op::Scale { x: gate, s: sg, out: gate })?;
                ctx.b.launch(r, Op::Scale { x: up, s: su, out: up })?;
            }
            ctx.b.launch(r, Op::Swiglu { gate, up, limit, out: act })?;
            let out = rb.epart.sub(s * slot_stride, eh.kblocks * hidden);
            let op = Op::GemvPartials { w: eh.down, x: act, out };
            // Global index: slot stride, then this rank's first K-block (0 for a whole expert).
            let sharded = slot_sharded(ctx, expert);
            let first_kb = if sharded { r * eh.kblocks } else { 0 };
            let base = s * slot_stride + first_kb * hidden;
            if direct && sharded {
                // MOE_DIRECT: the shard's partials land at their canonical place in the root's
                // epart_all, where the moe_join folds them.
                let at = root.epart_all.sub(base, eh.kblocks * hidden);
                store_to_root(ctx, r, op, at, fence, "moe_direct.peer_stores")?;
                parts.push((0, at, base as u64));
            } else {
                ctx.b.launch(r, op)?;
                parts.push((r, out, base as u64));
            }
        }
    }
    if ctx.p.experts == ExpertMode::ExpertParallel && doors.step_ep {
        ctx.count("step_ep.owner_slots");
    }
    if ctx.p.experts == ExpertMode::Interleaved2 {
        ctx.count("nvfp4_ep2.owner_sweeps");
    }
    ctx.seam(l, Seam::Experts, &parts)?;

    // moe_join: partials to the root (TP) or per-slot outputs from owners (EP), canonical folds,
    // weighted combine in slot order.
    ctx.begin()?;
    let k = c.top_k;
    let routed = root.moe.sub(0, hidden);
    let shared = root.moe.sub(hidden, hidden);
    if doors.bulk_p2p && !direct {
        bulk_move_partials(ctx, &slots)?;
    }
    for (s, expert) in slots.iter().enumerate() {
        let sharded = slot_sharded(ctx, expert);
        let g = if expert.is_some() { ctx.p.down_kblocks } else { ctx.p.shared_kblocks };
        let y_s = root.y.sub(s * hidden, hidden);
        if sharded {
            // Already at the root under MOE_DIRECT (peer stores) or BULK_P2P (packed copies).
            if !direct && !doors.bulk_p2p {
                for r in 0..tp {
                    let gl = g / tp;
                    let src = ctx.buf.ranks[r].epart.sub(s * slot_stride, gl * hidden);
                    let dst = root.epart_all.sub(s * slot_stride + r * gl * hidden, gl * hidden);
                    ctx.b.copy(ctx.cfg.transport, r, src, 0, dst)?;
                }
            }
            let parts = root.epart_all.sub(s * slot_stride, g * hidden);
            ctx.b.launch(0, Op::Fold { parts, n_parts: g, reverse: false, out: y_s })?;
        } else {
            // Whole expert on its owner: the owner folds, the root overwrites the slot.
            let owner = match expert {
                Some(e) => ctx.p.expert_owner(*e, c.experts),
                None => 0,
            };
            let ob = ctx.buf.ranks[owner].clone();
            let parts = ob.epart.sub(s * slot_stride, g * hidden);
            let oy = ob.ey.sub(s * hidden, hidden);
            let held = match expert {
                Some(e) => ctx.w.layers[l][owner].experts[*e],
                None => ctx.w.layers[l][owner].shared,
            };
            // The per-matrix NVFP4 scale, applied once after the full row reduce.
            let scale = held.and_then(|h| h.nvfp4_scales).map(|[_, _, sd]| sd);
            // NVFP4_EP2 keeps routed slot outputs on their owners (they sum them there).
            let to_root = ctx.p.experts != ExpertMode::Interleaved2 || expert.is_none();
            let fold = Op::Fold { parts, n_parts: g, reverse: false, out: oy };
            if direct && to_root {
                // MOE_DIRECT: the owner's last kernel (the fold, or the scale after it) stores
                // the slot output straight into the root's y slot.
                let last = match scale {
                    Some(sd) => {
                        ctx.b.launch(owner, fold)?;
                        Op::Scale { x: oy, s: sd, out: oy }
                    }
                    None => fold,
                };
                store_to_root(ctx, owner, last, y_s, fence, "moe_direct.peer_stores")?;
                continue;
            }
            ctx.b.launch(owner, fold)?;
            if let Some(sd) = scale {
                ctx.b.launch(owner, Op::Scale { x: oy, s: sd, out: oy })?;
            }
            if to_root {
                ctx.b.copy(ctx.cfg.transport, owner, oy, 0, y_s)?;
            }
        }
    }
    let weights = root.route.sub(k, k);
    if ctx.p.experts == ExpertMode::Interleaved2 {
        // NVFP4_EP2: each of the 2 owners (rank o % TP) sums its own slots in slot order from
        // +0.0; the root adds owner 0's sum and owner 1's sum.
        for owner in 0..2 {
            let r = owner % tp;
            let rb = ctx.buf.ranks[r].clone();
            let mine: Vec<usize> = (0..k).filter(|s| ids[*s] % 2 == owner).collect();
            let acc = rb.esum.sub(owner * hidden, hidden);
            let tmp = rb.esum.sub(2 * hidden, hidden);
            ctx.b.write(r, acc, &vec![0.0; hidden])?;
            ctx.b.copy(ctx.cfg.transport, 0, weights, r, rb.rw.sub(0, k))?;
            for s in mine {
                let ys = rb.ey.sub(s * hidden, hidden);
                ctx.b.launch(r, Op::Combine { y: ys, w: rb.rw.sub(s, 1), out: tmp })?;
                ctx.b.launch(r, Op::Add { a: acc, b: tmp, out: acc })?;
            }
            ctx.b.copy(ctx.cfg.transport, r, acc, 0, root.rank_sums.sub(owner * hidden, hidden))?;
        }
        ctx.b.launch(
            0,
            Op::Add { a: root.rank_sums.sub(0, hidden), b: root.rank_sums.sub(hidden, hidden), out: routed },
        )?;
    } else {
        ctx.b.launch(0, Op::Combine { y: root.y.sub(0, k * hidden), w: weights, out: routed })?;
    }
    ctx.b.copy(ctx.cfg.transport, 0, root.y.sub(k * hidden, hidden), 0, shared)?;
    ctx.seam(l, Seam::MoeJoin, &Ctx::root_part(root.moe))?;

    // residual: h + (routed + shared), in exactly that operand order.
    ctx.begin()?;
    ctx.b.launch(0, Op::Add { a: routed, b: shared, out: root.moe_sum })?;
    ctx.b.launch(0, Op::Add { a: root.h, b: root.moe_sum, out: root.x })?;
    ctx.seam(l, Seam::Residual, &Ctx::root_part(root.x))
}

/// BULK_P2P: each rank's partials of every TP-sharded slot move to the root in one packed copy
/// per run of consecutive sharded slots of equal G (slot s's shard sits at `s·slot_stride` on
/// its rank and at `s·slot_stride + r·G/TP·hidden` at the root: equal pitches, one 2D copy). A
/// run of one slot is a plain copy (nothing to pack; the backend would not count it anyway).
fn bulk_move_partials(ctx: &mut Ctx, slots: &[Option<usize>]) -> Result<()> {
    let hidden = ctx.model.config.hidden;
    let (tp, stride) = (ctx.p.tp, ctx.buf.gmax * hidden);
    let root_parts = ctx.buf.root.epart_all;
    let g_of = |e: &Option<usize>| if e.is_some() { ctx.p.down_kblocks } else { ctx.p.shared_kblocks };
    let mut runs: Vec<(usize, usize, usize)> = Vec::new(); // (first slot, slots, G)
    for (s, e) in slots.iter().enumerate() {
        if !slot_sharded(ctx, e) {
            continue;
        }
        match runs.last_mut() {
            Some((first, n, g)) if *first + *n == s && *g == g_of(e) => *n += 1,
            _ => runs.push((s, 1, g_of(e))),
        }
    }
    for (first, n, g) in runs {
        let len = g / tp * hidden;
        for r in 0..tp {
            let src = ctx.buf.ranks[r].epart.sub(first * stride, len);
            let dst = root_parts.sub(first * stride + r * len, len);
            if n == 1 {
                ctx.b.copy(ctx.cfg.transport, r, src, 0, dst)?;
            } else {
                let p = Packed { src, src_pitch: stride, dst, dst_pitch: stride, blocks: n };
                ctx.b.copy_packed(ctx.cfg.transport, r, 0, p)?;
            }
        }
    }
    Ok(())
}

/// Whether a slot's expert (`None` = shared) is TP-sharded over the ranks.
fn slot_sharded(ctx: &Ctx, expert: &Option<usize>) -> bool {
    match expert {
        Some(_) => ctx.p.experts == ExpertMode::TensorParallel,
        None => ctx.p.shared_sharded,
    }
}
