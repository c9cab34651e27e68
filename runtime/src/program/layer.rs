//! The attention half of a decoder layer (attn_norm … ffn_norm; the MoE half is `moe.rs`). Every
//! arithmetic step is one kernel on one rank; every cross-rank step is a copy — except under the
//! direct-join doors (OPROJ_DIRECT, MOE_DIRECT), where a peer's last kernel of a join stores its
//! output straight into the root's buffer (a peer store) and nothing is copied.

use super::copies::broadcast;
use super::{Ctx, SeamPart};
use crate::backend::{JoinFence, Op, RowOrder, RowPitch, Slice};
use crate::config::Canary;
use crate::evidence::record::Seam;
use crate::Result;
use memra_kernels::twins::attention::ATTN_PARTITION;

/// Run `op` with its output going to `dst`, a slice of the root: rank 0 launches it there
/// directly; a peer stores into the root's memory (a direct join's peer store, counted under
/// `counter` because it really crossed ranks).
pub(super) fn store_to_root(
    ctx: &mut Ctx,
    rank: usize,
    op: Op,
    dst: Slice,
    fence: JoinFence,
    counter: &str,
) -> Result<()> {
    if rank == 0 {
        ctx.launch(0, op.with_store_target(dst))
    } else {
        ctx.peer_store(rank, op, dst, fence)?;
        ctx.count(counter);
        Ok(())
    }
}

/// After layer `l`'s append: every rank's 4-byte copy of its device-held position into the
/// layer's KV length mirror (the engine's per-layer length copy). In single-token decode and rows
/// nothing reads the mirror — every rope and attention launch reads `pos` — so LEN_MIRROR_LAZY
/// skips the copies there; a verify/prefill run (columns) reads every mirror before each pass
/// (`passes.rs`), so there the door yields and the copies stay.
fn len_mirrors(ctx: &mut Ctx, l: usize) -> Result<()> {
    let lazy = ctx.cfg.doors.len_mirror_lazy && ctx.cfg.pass.columns == 1;
    for r in 0..ctx.placement.tp {
        let rb = &ctx.buffers.ranks[r];
        let (pos, mirror) = (rb.pos, rb.len_mirror[l]);
        if lazy {
            ctx.count("len_mirror_lazy.skipped_copies");
        } else {
            ctx.copy(Seam::Rope, r, pos, r, mirror)?;
        }
    }
    Ok(())
}

/// The attention half of layer `l` at the device-held position; with GRAPH on a step that reads
/// the route on the host, one graph segment per layer's attention half (recorded, captured, then
/// replayed by the backend).
pub(super) fn attention_half(ctx: &mut Ctx, l: usize) -> Result<()> {
    if !ctx.graph_segment(l) {
        return attention_half_calls(ctx, l);
    }
    ctx.in_segment(l as u64, |ctx| attention_half_calls(ctx, l))
}

fn attention_half_calls(ctx: &mut Ctx, l: usize) -> Result<()> {
    let c = &ctx.model.config;
    let (hidden, hd, eps) = (c.hidden, c.head_dim, c.eps);
    let (qh, kvh) = (c.q_heads, c.kv_heads);
    let tp = ctx.placement.tp;
    let root = ctx.buffers.root.clone();
    let lay = ctx.weights.param_layout.clone();
    let order = if ctx.cfg.doors.qkv_fused { RowOrder::Tree } else { RowOrder::Canonical };

    // attn_norm: root normalizes the residual stream, then replicates it.
    ctx.begin(l, Seam::AttnNorm)?;
    let normed0 = ctx.buffers.ranks[0].normed;
    ctx.launch(0, Op::RmsNorm { x: root.x, w: lay.attn_norm(ctx.weights.params[0], l), eps, out: normed0 })?;
    ctx.seam(l, Seam::AttnNorm, &Ctx::root_part(normed0))?;
    broadcast(ctx, Seam::AttnNorm, normed0, |rb| rb.normed)?;

    // qkv: column-parallel, each rank its chunks of whole heads.
    ctx.begin(l, Seam::Qkv)?;
    let mut parts: Vec<SeamPart> = Vec::new();
    for r in 0..tp {
        let (rb, h) = (ctx.buffers.ranks[r].clone(), ctx.weights.layers[l][r].clone());
        let items = vec![(h.wq, rb.q), (h.wk, rb.k), (h.wv, rb.v), (h.wg, rb.g)];
        if order == RowOrder::Canonical && !ctx.cfg.doors.w8 {
            // One launch for the four projections (same input, same canonical rows).
            ctx.launch(r, Op::GemvRowsBatch { items, x: rb.normed })?;
        } else {
            for (w, out) in items {
                ctx.launch(r, Op::GemvRows { w, x: rb.normed, out, order })?;
            }
        }
        let (lq, lkv) = (rb.q.len, rb.k.len);
        parts.push(SeamPart { rank: r, slice: rb.q, offset: (r * lq) as u64 });
        parts.push(SeamPart { rank: r, slice: rb.k, offset: (qh * hd + r * lkv) as u64 });
        parts.push(SeamPart { rank: r, slice: rb.v, offset: (qh * hd + kvh * hd + r * lkv) as u64 });
        parts.push(SeamPart { rank: r, slice: rb.g, offset: (qh * hd + 2 * kvh * hd + r * rb.g.len) as u64 });
    }
    if ctx.cfg.doors.w8 {
        ctx.count("w8.int8_gemvs");
    }
    if ctx.cfg.doors.qkv_fused {
        ctx.count("qkv_fused.fused_launches");
    }
    ctx.seam(l, Seam::Qkv, &parts)?;

    // rope: per-head q/k norm + RoPE into q_r / k_r, and K/V appended to this rank's cache, in
    // one launch at the device-held position (`rb.pos`), so a captured step replays unchanged
    // at every position.
    ctx.begin(l, Seam::Rope)?;
    let max_len = ctx.model.config.max_positions;
    let mut parts: Vec<SeamPart> = Vec::new();
    for r in 0..tp {
        let rb = ctx.buffers.ranks[r].clone();
        let prm = ctx.weights.params[r];
        let lkv = rb.k.len;
        let (k_cache, v_cache) = (Slice::new(rb.kc[l], 0, max_len * lkv), Slice::new(rb.vc[l], 0, max_len * lkv));
        ctx.launch(
            r,
            Op::RopeAppend {
                q: rb.q,
                k: rb.k,
                v: rb.v,
                q_norm: lay.q_norm(prm, l),
                k_norm: lay.k_norm(prm, l),
                eps,
                table: lay.rope_table(prm),
                pos: rb.pos,
                q_out: rb.q_r,
                k_out: rb.k_r,
                k_cache,
                v_cache,
            },
        )?;
        parts.push(SeamPart { rank: r, slice: rb.q_r, offset: (r * rb.q_r.len) as u64 });
        parts.push(SeamPart { rank: r, slice: rb.k_r, offset: (qh * hd + r * lkv) as u64 });
    }
    ctx.seam(l, Seam::Rope, &parts)?;
    len_mirrors(ctx, l)?;

    // attn: decode attention over pos + 1 cached positions, gated per head.
    ctx.begin(l, Seam::Attn)?;
    let mut parts: Vec<SeamPart> = Vec::new();
    for r in 0..tp {
        let rb = ctx.buffers.ranks[r].clone();
        let lkv = rb.k.len;
        let (q_heads, kv_heads) = (ctx.placement.q_heads_per_rank, ctx.placement.kv_heads_per_rank);
        let (k, v) = (Slice::new(rb.kc[l], 0, max_len * lkv), Slice::new(rb.vc[l], 0, max_len * lkv));
        let partition = verify_partition(ctx);
        let op = Op::AttentionAt {
            q: rb.q_r,
            k,
            v,
            gate: rb.g,
            pos: rb.pos,
            max_len,
            q_heads,
            kv_heads,
            partition,
            out: rb.attn,
        };
        if let Some(victim) = neighbour_victim(ctx, l) {
            // NeighbourSession canary: the victim row's cached position 0 is overwritten with
            // its neighbour's (lane 0's) before it attends — one position of another session.
            for cache in [k, v] {
                let (src, dst) = (cache.sub(0, lkv), ctx.at_lane(r, cache.sub(0, lkv), victim));
                ctx.backend.copy(crate::backend::Transfer::new(ctx.cfg.transport, (r, src), (r, dst)))?;
            }
            ctx.count("canary_neighbour_session.crossed_reads");
        }
        match attention_rows(ctx, r, &op) {
            Some((rows, counter)) => {
                ctx.backend.launch(r, rows)?;
                ctx.count(counter);
            }
            None => ctx.launch_each(r, op)?,
        }
        if partition != ATTN_PARTITION {
            ctx.count("canary_verify_partitions.split_walks");
        }
        parts.push(SeamPart { rank: r, slice: rb.attn, offset: (r * rb.attn.len) as u64 });
    }
    ctx.seam(l, Seam::Attn, &parts)?;

    // o_proj: each rank's canonical K-block partials of the row-parallel output projection.
    ctx.begin(l, Seam::OProj)?;
    // SkipFence canary: a peer's partials are copied to the root without waiting for their
    // producer — the race a missing fence opens (o_join reads them).
    let skip_fence = ctx.cfg.doors.canary == Some(Canary::SkipFence) && tp > 1;
    // OPROJ_DIRECT: every rank's partials land in root.opart_all at their canonical offset (peers
    // by peer stores), so the o_join moves nothing. Not when a canary needs the rank-local
    // producer buffer: skip_fence copies it unfenced, and a stale step must leave the previous
    // step's partials in the root's buffer.
    // SilentFallback canary: the mechanism falls back to the copy path while the call site still
    // counts peer stores below — the census, not the counter, must expose it.
    let fallback = ctx.cfg.doors.canary == Some(Canary::SilentFallback) && ctx.cfg.doors.oproj_direct;
    let direct = ctx.cfg.doors.oproj_direct && !skip_fence && !ctx.stale() && !fallback;
    // The root writes its own partials in place in `opart_all` (nothing to copy) — except where
    // the rank-local buffer matters: NCCL_ALLREDUCE folds it locally, and the stale-buffer canary
    // must leave the previous step's partials in the root's buffer.
    let root_in_place = !ctx.cfg.doors.nccl_allreduce && ctx.cfg.doors.canary != Some(Canary::StaleBuffer);
    let mut parts: Vec<SeamPart> = Vec::new();
    for r in 0..tp {
        let rb = ctx.buffers.ranks[r].clone();
        let wo = ctx.weights.layers[l][r].wo;
        let at = root.opart_all.sub(r * rb.opart.len, rb.opart.len);
        let base = (r * rb.opart.len) as u64;
        if skip_fence && r != 0 {
            // Issued before its producer: with no fence, nothing stops the copy from running
            // first, and on a fast device that is what it does — so the defect shows every time.
            ctx.copy_unfenced(Seam::OProj, r, rb.opart, 0, at)?;
            ctx.count("canary_skip_fence.skipped_fences");
        }
        let op = Op::GemvPartials { w: wo, x: rb.attn, out: rb.opart };
        if r == 0 && root_in_place && !direct {
            ctx.launch(0, op.with_store_target(at))?;
            parts.push(SeamPart { rank: 0, slice: at, offset: base });
        } else if direct {
            // The seam's digest reads the root-resident slice: same global indices, same bits.
            store_to_root(ctx, r, op, at, JoinFence::Events, "oproj_direct.peer_stores")?;
            parts.push(SeamPart { rank: 0, slice: at, offset: base });
        } else {
            ctx.launch(r, op)?;
            parts.push(SeamPart { rank: r, slice: rb.opart, offset: base });
            if fallback && r != 0 {
                ctx.count("oproj_direct.peer_stores");
            }
        }
        if ctx.cfg.doors.w8 {
            ctx.count("w8.int8_gemvs");
        }
    }
    ctx.seam(l, Seam::OProj, &parts)?;

    // o_join: partials moved to the root (already there under OPROJ_DIRECT), reduced in
    // canonical order (or deferred into the ffn_norm kernel by OPROJ_TAIL).
    ctx.begin(l, Seam::OJoin)?;
    let g = ctx.placement.o_kblocks;
    if ctx.cfg.doors.nccl_allreduce {
        // NCCL_ALLREDUCE (NUMERIC, o_join only; the moe_join stays canonical): each rank folds
        // its own K-blocks from +0.0 into a local vector (its `xin`, free until ffn_norm), then
        // NCCL sums the TP vectors in its own order into the root's ojoin.
        // Its transport (nccl) and its exclusion of OPROJ_TAIL are registry rules, checked
        // before the run (`RunConfig::check_doors`).
        let mut sums = Vec::with_capacity(tp);
        for r in 0..tp {
            let rb = &ctx.buffers.ranks[r];
            let (opart, local) = (rb.opart, rb.xin);
            ctx.launch(r, Op::Fold { parts: opart, n_parts: g / tp, reverse: false, out: local })?;
            sums.push((r, local));
        }
        ctx.all_reduce(&sums, 0, root.ojoin)?;
        ctx.count("nccl_allreduce.allreduces");
    } else if ctx.stale() {
        ctx.count("canary_stale_buffer.stale_reads");
    } else if !direct {
        for r in usize::from(root_in_place)..tp {
            let src = ctx.buffers.ranks[r].opart;
            let dst = root.opart_all.sub(r * src.len, src.len);
            if skip_fence && r != 0 {
                continue; // already copied, unfenced, in the o_proj seam
            }
            ctx.copy(Seam::OProj, r, src, 0, dst)?;
        }
    }
    // BatchKSplit canary: the fold order depends on how many rows share the pass.
    let batch_split =
        ctx.cfg.doors.canary == Some(Canary::BatchKSplit) && ctx.cfg.pass.batch > 1 && ctx.active.len() > 1;
    let reverse = (ctx.cfg.doors.canary == Some(Canary::ReverseKBlocks) && tp > 1) || batch_split;
    let ffn_w = lay.ffn_norm(ctx.weights.params[0], l);
    if ctx.cfg.doors.oproj_tail {
        // The add happens inside the ffn_norm kernel: same operands, same order.
        ctx.launch(
            0,
            Op::FoldAddRmsNorm {
                parts: root.opart_all,
                n_parts: g,
                x: root.x,
                w: ffn_w,
                eps,
                a: root.ojoin,
                h: root.h,
                out: ctx.buffers.ranks[0].xin,
            },
        )?;
        ctx.count("oproj_tail.fused_joins");
    } else if !ctx.cfg.doors.nccl_allreduce && !reverse && tcol_join(ctx) {
        // TCOL_OPROJ: every column's fold in one T-column join (the same fold per column).
        let (parts, out) = (root.opart_all, root.ojoin);
        let (parts_pitch, out_pitch) = (ctx.buffers.lane_stride(0, parts), ctx.buffers.lane_stride(0, out));
        let lanes = ctx.active.len();
        ctx.backend.launch(0, Op::FoldLanes { lanes, parts, parts_pitch, n_parts: g, out, out_pitch })?;
        ctx.count("tcol_oproj.column_joins");
    } else if !ctx.cfg.doors.nccl_allreduce {
        ctx.launch(0, Op::Fold { parts: root.opart_all, n_parts: g, reverse, out: root.ojoin })?;
        if reverse {
            // Counted only where the reversed fold really ran (the OPROJ_TAIL kernel has none).
            ctx.count(if batch_split {
                "canary_batch_ksplit.reversed_folds"
            } else {
                "canary_reverse_kblocks.reversed_folds"
            });
        }
    }
    ctx.seam(l, Seam::OJoin, &Ctx::root_part(root.ojoin))?;

    // ffn_norm: residual add + RMSNorm.
    ctx.begin(l, Seam::FfnNorm)?;
    let xin0 = ctx.buffers.ranks[0].xin;
    if !ctx.cfg.doors.oproj_tail {
        ctx.launch(0, Op::AddRmsNorm { x: root.x, a: root.ojoin, w: ffn_w, eps, h: root.h, out: xin0 })?;
    }
    let parts =
        [SeamPart { rank: 0, slice: root.h, offset: 0 }, SeamPart { rank: 0, slice: xin0, offset: hidden as u64 }];
    ctx.seam(l, Seam::FfnNorm, &parts)
}

/// The attention partition length of this pass: the program's constant, or under the
/// VerifyPartitions canary `ATTN_PARTITION >> T` (at least 1) in a pass of T > 1 columns — short
/// enough that the battery's short sessions already span several partitions.
fn verify_partition(ctx: &Ctx) -> usize {
    let t = ctx.active.len();
    if ctx.cfg.doors.canary == Some(Canary::VerifyPartitions) && ctx.cfg.pass.columns > 1 && t > 1 {
        (ATTN_PARTITION >> t).max(1)
    } else {
        ATTN_PARTITION
    }
}

/// The NeighbourSession canary's victim row at layer `l`: the lane holding the second prompt's
/// first step, at layer 0 (one position of one session; its row 0 is then the neighbour's).
fn neighbour_victim(ctx: &Ctx, l: usize) -> Option<usize> {
    if ctx.cfg.doors.canary != Some(Canary::NeighbourSession) || l != 0 || ctx.cfg.pass.batch < 2 {
        return None;
    }
    ctx.active.iter().copied().find(|&i| i > 0 && ctx.pass[i].live && ctx.pass[i].prompt == 1 && ctx.pass[i].step == 0)
}

/// Whether the active lanes are the pass's lanes 0..n, n > 1, in order (the multi-lane ops read
/// lane i at i × the buffer's lane stride).
fn whole_pass(ctx: &Ctx) -> bool {
    ctx.active.len() > 1 && ctx.active.iter().enumerate().all(|(i, &l)| i == l)
}

/// TCOL_OPROJ: whether this pass's o_join is one T-column join (a pass of several columns).
fn tcol_join(ctx: &Ctx) -> bool {
    ctx.cfg.doors.tcol_oproj && ctx.cfg.pass.columns > 1 && whole_pass(ctx)
}

/// DECODE_V2 (any pass of several lanes) or SPEC_FA2 (a pass of exactly two columns): lane 0's
/// `AttentionAt` on rank `r` as one launch for every lane, with the counter it engages.
fn attention_rows(ctx: &Ctx, r: usize, op: &Op) -> Option<(Op, &'static str)> {
    let d = &ctx.cfg.doors;
    let spec = d.spec_fa2 && ctx.cfg.pass.columns == 2 && ctx.active.len() == 2;
    if !(d.decode_v2 || spec) || !whole_pass(ctx) {
        return None;
    }
    let Op::AttentionAt { q, k, v, gate, pos, max_len, q_heads, kv_heads, partition, out } = *op else {
        return None;
    };
    let stride = |s| ctx.buffers.lane_stride(r, s);
    let pitch = RowPitch { q: stride(q), kv: stride(k), gate: stride(gate), pos: stride(pos), out: stride(out) };
    let rows = ctx.active.len();
    let op = Op::AttentionRows {
        rows,
        q,
        k,
        v,
        gate,
        pos,
        out,
        pitch,
        max_len,
        q_heads,
        kv_heads,
        partition,
        walk_once: spec,
    };
    Some((op, if spec { "spec_fa2.shared_walks" } else { "decode_v2.row_attention" }))
}
