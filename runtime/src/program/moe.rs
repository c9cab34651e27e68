//! The MoE half of a decoder layer (router … residual) on the grouped expert kernels.
//!
//! The route stays on the device: the root's router output is copied (bytes) to every rank, and
//! each rank runs ONE gate/up/SwiGLU launch and ONE down-partials launch for all k + 1 slots,
//! the kernels reading the expert ids from that copy. Where a slot's expert lives is then data:
//! - TP-sharded experts: every rank holds a shard of every expert, so the joins do not depend on
//!   the route (partials move to the root as before, which folds them slot by slot);
//! - whole experts on owner ranks (STEP_EP, NVFP4_EP2, shapes TP does not divide): every rank
//!   folds the slots it owns (the owner rule applied to the route, on the device), the folded
//!   slots move to the root and a select kernel picks each slot from its owner — bytes only.
//!   Each rank digests the experts seam for exactly the slots it owns.
//!
//! MOE_DIRECT on whole experts stores each slot from its owner and counts each such store, so
//! that door alone reads the route on the host (`Ctx::host_routes`) and issues per-slot launches.
//!
//! Under STEP_EP the owners' routed SwiGLU and the root's weighted combine are a host program
//! unless EP_DEVICE_ARITHMETIC keeps them on the device (`Ctx::ep_host_arithmetic`): the owners'
//! gate/up launch stores the SwiGLU's operands (`Op::ExpertGateUpRows`) and `ep_host.rs` applies
//! the SwiGLU and the combine between host reads and writes — the same twin arithmetic either way.

use super::copies::broadcast;
use super::ep_host;
use super::layer::store_to_root;
use super::placement::ExpertMode;
use super::Ctx;
use crate::backend::{DigestPart, JoinFence, Op, OwnedSlots, OwnerRule, Packed, RowOrder, SlotOwner};
use crate::config::Canary;
use crate::evidence::record::Seam;
use crate::Result;

pub(super) fn moe_half(ctx: &mut Ctx, l: usize) -> Result<()> {
    let c = ctx.model.config.clone();
    let k = c.top_k;
    let root = ctx.buffers.root.clone();
    let lay = ctx.weights.param_layout.clone();
    let doors = ctx.cfg.doors;
    let xin0 = ctx.buffers.ranks[0].xin;

    // ROUTES_PRESTAGE: the expert input is broadcast before the router runs.
    if doors.routes_prestage {
        broadcast(ctx, Seam::FfnNorm, xin0, |rb| rb.xin)?;
        ctx.count("routes_prestage.early_broadcasts");
    }
    // router: root GEMV + sigmoid top-k.
    ctx.begin(l, Seam::Router)?;
    let router_w = ctx.weights.layers[l][0].router.expect("the root holds the router");
    ctx.launch(0, Op::GemvRows { w: router_w, x: xin0, out: root.router_logits, order: RowOrder::Canonical })?;
    ctx.launch(
        0,
        Op::Router {
            logits: root.router_logits,
            bias: lay.router_bias(ctx.weights.params[0], l),
            k,
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
    // The selection to every rank (bytes), then the expert input unless prestaged.
    distribute_selection(ctx)?;
    if !doors.routes_prestage {
        broadcast(ctx, Seam::FfnNorm, xin0, |rb| rb.xin)?;
    }
    if ctx.host_routes() {
        // The launches depend on each lane's route: lane by lane.
        ctx.each_lane(|ctx| {
            let ids = read_ids(ctx, l)?;
            experts(ctx, l, Some(&ids))?;
            moe_join(ctx, l, Some(&ids))
        })?;
    } else {
        experts(ctx, l, None)?;
        moe_join(ctx, l, None)?;
    }
    residual(ctx, l)
}

/// The fences of MOE_DIRECT's peer stores: events, FENCE_MEMOPS's doorbells, or (FENCE_RANK1)
/// a doorbell and then a kernel doorbell in the root's memory.
fn join_fence(doors: crate::DoorSet) -> JoinFence {
    match (doors.fence_memops, doors.fence_rank1) {
        (true, true) => JoinFence::KernelDoorbell,
        (true, false) => JoinFence::Doorbells,
        // FENCE_RANK1 alone is refused before the run (it requires FENCE_MEMOPS).
        (false, _) => JoinFence::Events,
    }
}

/// The routed selection each peer rank needs, from the root: the k route ids (bits) — and on an
/// NVFP4_EP2 owner also the k route weights, which its owner sum reads. By default one copy per
/// tensor (the weights copy is `moe_join`'s); SEL_MIRROR moves a peer's whole need in ONE mirror
/// launch, and rank 0, whose route buffer is the root's, reads the selection directly.
fn distribute_selection(ctx: &mut Ctx) -> Result<()> {
    let k = ctx.model.config.top_k;
    let root_route = ctx.buffers.root.route;
    for r in 1..ctx.placement.tp {
        let dst = ctx.buffers.ranks[r].route;
        if ctx.cfg.doors.sel_mirror {
            let n = if ctx.placement.experts == ExpertMode::Interleaved2 { 2 * k } else { k };
            ctx.mirror(Seam::Router, root_route.sub(0, n), r, dst.sub(0, n))?;
        } else {
            ctx.copy(Seam::Router, 0, root_route.sub(0, k), r, dst.sub(0, k))?;
        }
    }
    Ok(())
}

/// The route ids read on the host (MOE_DIRECT on expert-parallel owners only), checked.
fn read_ids(ctx: &mut Ctx, l: usize) -> Result<Vec<usize>> {
    let route = ctx.read_lane(0, ctx.buffers.root.route)?;
    check_ids(ctx, l, &route)
}

/// The route ids as rank `r` holds them (its copy of the root's selection: k words), checked.
fn read_ids_on(ctx: &mut Ctx, l: usize, r: usize) -> Result<Vec<usize>> {
    let k = ctx.model.config.top_k;
    let route = ctx.read_lane(r, ctx.buffers.ranks[r].route.sub(0, k))?;
    check_ids(ctx, l, &route)
}

/// The first k words of `route` as expert ids, each checked to be an expert.
fn check_ids(ctx: &Ctx, l: usize, route: &[f32]) -> Result<Vec<usize>> {
    let (k, experts) = (ctx.model.config.top_k, ctx.model.config.experts);
    let ids: Vec<usize> = route[..k].iter().map(|v| v.to_bits() as usize).collect();
    if let Some(bad) = ids.iter().find(|e| **e >= experts) {
        return Err(crate::RuntimeError::Device {
            location: format!("layer {l} router"),
            detail: format!("selected expert id {bad} is outside 0..{experts}"),
        });
    }
    Ok(ids)
}

/// Which rank owns a whole routed expert, as a rule the kernels apply to the route.
fn rank_rule(ctx: &Ctx) -> OwnerRule {
    let (e, tp) = (ctx.model.config.experts as u32, ctx.placement.tp as u32);
    match ctx.placement.experts {
        // NVFP4_EP2: owner e % 2 on rank (e % 2) % TP, i.e. e % TP for TP 1 and 2.
        ExpertMode::Interleaved2 => OwnerRule { experts: e, div: 1, modulo: tp },
        _ => OwnerRule { experts: e, div: e / tp, modulo: tp },
    }
}

/// Whether rank `r` holds (a shard of) `expert` (`None`: the shared expert) on layer `l`.
pub(super) fn held(ctx: &Ctx, l: usize, r: usize, expert: Option<usize>) -> bool {
    let h = &ctx.weights.layers[l][r];
    match expert {
        Some(e) => h.experts[e].is_some(),
        None => h.shared.is_some(),
    }
}

/// experts: gate/up/SwiGLU and down partials of every slot on every rank holding it.
fn experts(ctx: &mut Ctx, l: usize, host_ids: Option<&[usize]>) -> Result<()> {
    let c = ctx.model.config.clone();
    let (hidden, k, limit) = (c.hidden, c.top_k, c.swiglu_limit_at(l));
    let fold_up = dev_routes(ctx, l);
    let tp = ctx.placement.tp;
    let slots = k + 1;
    let stride = ctx.buffers.gmax * hidden;
    let pitch = ctx.buffers.act_pitch;
    let root = ctx.buffers.root.clone();
    let doors = ctx.cfg.doors;
    let fence = join_fence(doors);
    let routed_sharded = ctx.placement.experts == ExpertMode::TensorParallel;
    let shared_sharded = ctx.placement.shared_sharded;
    let (routed_direct, shared_direct) = (doors.moe_direct && routed_sharded, doors.moe_direct && shared_sharded);
    let (g_r, g_s) = (ctx.placement.down_kblocks, ctx.placement.shared_kblocks);
    let rule = rank_rule(ctx);
    let ep_host = ctx.ep_host_arithmetic();
    let ep_device = ctx.placement.experts == ExpertMode::ExpertParallel && doors.step_ep && !ep_host;
    let down8 = sel_down8(ctx);
    ctx.begin(l, Seam::Experts)?;
    let mut parts: Vec<(usize, DigestPart)> = Vec::new();
    for r in 0..tp {
        let Some(group) = ctx.weights.layers[l][r].group else { continue };
        let rb = ctx.buffers.ranks[r].clone();
        let route = rb.route.sub(0, k);
        let down = |first_slot: usize, n: usize, out| Op::ExpertDown {
            group,
            route,
            first_slot,
            slots: n,
            act: rb.ea.sub(first_slot * pitch, (n - 1) * pitch + pitch),
            act_pitch: pitch,
            out,
            out_pitch: stride,
        };
        let holds_shared = held(ctx, l, r, None);
        // gate, up, SwiGLU (STEP_EP without EP_DEVICE_ARITHMETIC: the routed slots' SwiGLU
        // operands, and the SwiGLU on the host).
        let fused = |first_slot: usize, n: usize| Op::ExpertGateUp {
            group,
            route,
            first_slot,
            slots: n,
            x: rb.xin,
            limit,
            fold_up,
            act: rb.ea.sub(first_slot * pitch, (n - 1) * pitch + pitch),
            act_pitch: pitch,
        };
        let operands = |first_slot: usize, n: usize| Op::ExpertGateUpRows {
            group,
            route,
            first_slot,
            slots: n,
            x: rb.xin,
            gate: rb.ea.sub(first_slot * pitch, (n - 1) * pitch + pitch),
            up: rb.eu.sub(first_slot * pitch, (n - 1) * pitch + pitch),
            pitch,
        };
        match host_ids {
            Some(ids) => {
                for (s, e) in ids.iter().map(|e| Some(*e)).chain([None]).enumerate() {
                    if held(ctx, l, r, e) {
                        let op = if ep_host && s < k { operands(s, 1) } else { fused(s, 1) };
                        ctx.launch(r, op)?;
                    }
                }
                if ep_host {
                    ep_host::swiglu(ctx, l, r, ids)?;
                }
            }
            None if ep_host => {
                ctx.launch(r, operands(0, k))?;
                if holds_shared {
                    ctx.launch(r, fused(k, 1))?;
                }
                ctx.each_lane(|ctx| {
                    let ids = read_ids_on(ctx, l, r)?;
                    ep_host::swiglu(ctx, l, r, &ids)
                })?;
            }
            None => ctx.launch(r, fused(0, slots))?,
        }
        if ep_device {
            ctx.count("ep_device_arithmetic.device_ops");
        }
        // down partials: locally, or (MOE_DIRECT, TP-sharded slots) straight into the root's
        // canonical place, one peer store per slot.
        let routed_len = if routed_sharded { g_r / tp * hidden } else { g_r * hidden };
        let shared_len = if shared_sharded { g_s / tp * hidden } else { g_s * hidden };
        let local_all = host_ids.is_none() && !routed_direct && !shared_direct;
        if local_all && !down8 {
            ctx.launch(r, down(0, slots, rb.epart))?;
        } else {
            match host_ids {
                Some(ids) => {
                    for (s, e) in ids.iter().enumerate() {
                        if held(ctx, l, r, Some(*e)) {
                            ctx.launch(r, down(s, 1, rb.epart.sub(s * stride, stride)))?;
                        }
                    }
                }
                None if down8 => down_combine(ctx, r, group)?,
                None if routed_direct => {
                    for s in 0..k {
                        let at = root.epart_all.sub(s * stride + r * routed_len, routed_len);
                        store_to_root(ctx, r, down(s, 1, at), at, fence, "moe_direct.peer_stores")?;
                    }
                }
                None => ctx.launch(r, down(0, k, rb.epart.sub(0, k * stride)))?,
            }
            if holds_shared {
                if shared_direct {
                    let at = root.epart_all.sub(k * stride + r * shared_len, shared_len);
                    store_to_root(ctx, r, down(k, 1, at), at, fence, "moe_direct.peer_stores")?;
                } else {
                    ctx.launch(r, down(k, 1, rb.epart.sub(k * stride, stride)))?;
                }
            }
        }
        // This rank's parts of the experts seam (global index: slot stride, then the rank's
        // first K-block; a whole expert from 0).
        if routed_sharded {
            let (src_rank, src) = if routed_direct {
                (0, root.epart_all.sub(r * routed_len, routed_len))
            } else {
                (r, rb.epart.sub(0, routed_len))
            };
            let base = (r * routed_len) as u64;
            parts.push((
                src_rank,
                DigestPart { src, blocks: k, pitch: stride, base, base_pitch: stride as u64, owned: None },
            ));
        } else if let Some(ids) = host_ids {
            for (s, e) in ids.iter().enumerate() {
                if held(ctx, l, r, Some(*e)) {
                    parts.push((r, DigestPart::plain(rb.epart.sub(s * stride, routed_len), (s * stride) as u64)));
                }
            }
        } else {
            let owned = OwnedSlots { route, first_slot: 0, owner: SlotOwner { rule, want: r as u32 } };
            let src = rb.epart.sub(0, routed_len);
            parts.push((
                r,
                DigestPart { src, blocks: k, pitch: stride, base: 0, base_pitch: stride as u64, owned: Some(owned) },
            ));
        }
        if holds_shared {
            let first = if shared_sharded { r * shared_len } else { 0 };
            let base = (k * stride + first) as u64;
            let part = if shared_direct {
                (0, DigestPart::plain(root.epart_all.sub(k * stride + first, shared_len), base))
            } else {
                (r, DigestPart::plain(rb.epart.sub(k * stride, shared_len), base))
            };
            parts.push(part);
        }
    }
    if ctx.placement.experts == ExpertMode::ExpertParallel && doors.step_ep {
        ctx.count("step_ep.owner_slots");
    }
    if ctx.placement.experts == ExpertMode::Interleaved2 {
        ctx.count("nvfp4_ep2.owner_sweeps");
    }
    ctx.seam_parts(l, Seam::Experts, &parts)
}

/// moe_join: partials to the root (TP) or folded slots from their owners (EP), canonical folds,
/// weighted combine in slot order.
fn moe_join(ctx: &mut Ctx, l: usize, host_ids: Option<&[usize]>) -> Result<()> {
    let c = ctx.model.config.clone();
    let (hidden, k) = (c.hidden, c.top_k);
    let tp = ctx.placement.tp;
    let slots = k + 1;
    let stride = ctx.buffers.gmax * hidden;
    let root = ctx.buffers.root.clone();
    let doors = ctx.cfg.doors;
    let direct = doors.moe_direct;
    let fence = join_fence(doors);
    let routed_sharded = ctx.placement.experts == ExpertMode::TensorParallel;
    let shared_sharded = ctx.placement.shared_sharded;
    let (g_r, g_s) = (ctx.placement.down_kblocks, ctx.placement.shared_kblocks);
    let nvfp4 = ctx.cfg.nvfp4_experts();
    // NVFP4_DEV_ROUTES: the routed slots' down scale waits for the combine.
    let folded = dev_routes(ctx, l);
    let down_scaled = nvfp4 && !folded;
    let root_route = root.route.sub(0, k);
    ctx.begin(l, Seam::MoeJoin)?;
    let sharded: Vec<bool> = (0..slots).map(|s| if s < k { routed_sharded } else { shared_sharded }).collect();
    // TP-sharded partials reach the root (already there under MOE_DIRECT).
    if doors.bulk_p2p && !direct {
        bulk_move_partials(ctx, &sharded)?;
    } else if !direct {
        for (s, _) in sharded.iter().enumerate().filter(|(_, sh)| **sh) {
            let gl = if s < k { g_r } else { g_s } / tp;
            // Rank 0's partials are the root's buffer already (`buffers.rs`).
            for r in 1..tp {
                let src = ctx.buffers.ranks[r].epart.sub(s * stride, gl * hidden);
                let dst = root.epart_all.sub(s * stride + r * gl * hidden, gl * hidden);
                ctx.copy(Seam::Experts, r, src, 0, dst)?;
            }
        }
    }
    // Folds of the sharded slots at the root where one kernel does not take every slot (below):
    // the routed slots, then the shared expert on its own.
    let fold_root = |first_slot: usize, n: usize, g: usize| Op::FoldSlots {
        route: root_route,
        first_slot,
        slots: n,
        parts: root.epart_all.sub(first_slot * stride, (n - 1) * stride + g * hidden),
        parts_pitch: stride,
        n_parts: g,
        owner: None,
        scales: None,
        out: root.y.sub(first_slot * hidden, n * hidden),
    };
    if join_takes_residual(ctx) {
        // Every slot folded and combined, and the residual, in one kernel: the moe_join seam is
        // complete and the residual seam's values are written (`residual` launches nothing).
        let parts = root.epart_all.sub(0, k * stride + g_r * hidden);
        let w = root.route.sub(k, k);
        let (h, sum, x) = (root.h, root.moe_sum, root.x);
        ctx.launch(0, Op::FoldCombineResidual { parts, pitch: stride, n_parts: g_r, w, h, out: root.moe, sum, x })?;
        return ctx.seam(l, Seam::MoeJoin, &Ctx::root_part(root.moe));
    }
    if routed_sharded {
        ctx.launch(0, fold_root(0, k, g_r))?;
    }
    if shared_sharded {
        ctx.launch(0, fold_root(k, 1, g_s))?;
    }
    if !shared_sharded {
        // The whole shared expert on rank 0 folds straight into the root's slot.
        let rb0 = ctx.buffers.ranks[0].clone();
        let op = Op::FoldSlots {
            route: root_route,
            first_slot: k,
            slots: 1,
            parts: rb0.epart.sub(k * stride, g_s * hidden),
            parts_pitch: stride,
            n_parts: g_s,
            owner: None,
            scales: None,
            out: root.y.sub(k * hidden, hidden),
        };
        ctx.launch(0, op)?;
    }
    // Whole routed experts: each owner folds its slots (the NVFP4 down scale once, after the fold).
    if !routed_sharded {
        match host_ids {
            Some(ids) => {
                // MOE_DIRECT: the owner's fold stores each slot straight into the root's y slot.
                for (s, e) in ids.iter().enumerate() {
                    let o = ctx.placement.expert_owner(*e, c.experts);
                    let ob = ctx.buffers.ranks[o].clone();
                    let scales = if down_scaled { ctx.weights.layers[l][o].group } else { None };
                    let op = Op::FoldSlots {
                        route: ob.route.sub(0, k),
                        first_slot: s,
                        slots: 1,
                        parts: ob.epart.sub(s * stride, g_r * hidden),
                        parts_pitch: stride,
                        n_parts: g_r,
                        owner: None,
                        scales,
                        out: ob.ey.sub(s * hidden, hidden),
                    };
                    let y_s = root.y.sub(s * hidden, hidden);
                    store_to_root(ctx, o, op, y_s, fence, "moe_direct.peer_stores")?;
                }
            }
            // SEL_DOWN8: the owners' sums were made with the down sweep (`down_combine`).
            None if sel_down8(ctx) => {}
            None => {
                let rule = rank_rule(ctx);
                for r in 0..tp {
                    let Some(group) = ctx.weights.layers[l][r].group else { continue };
                    let rb = ctx.buffers.ranks[r].clone();
                    let op = Op::FoldSlots {
                        route: rb.route.sub(0, k),
                        first_slot: 0,
                        slots: k,
                        parts: rb.epart.sub(0, (k - 1) * stride + g_r * hidden),
                        parts_pitch: stride,
                        n_parts: g_r,
                        owner: Some(SlotOwner { rule, want: r as u32 }),
                        scales: down_scaled.then_some(group),
                        out: rb.ey.sub(0, k * hidden),
                    };
                    ctx.launch(r, op)?;
                }
                // NVFP4_EP2 keeps routed slot outputs on their owners (they sum them there);
                // otherwise each rank's folded slots go to the root, which selects every slot
                // from its owner.
                if ctx.placement.experts != ExpertMode::Interleaved2 {
                    let region = slots * hidden;
                    for r in 1..tp {
                        let src = ctx.buffers.ranks[r].ey.sub(0, k * hidden);
                        ctx.copy(Seam::MoeJoin, r, src, 0, root.ey_all.sub(r * region, k * hidden))?;
                    }
                    let op = Op::SelectSlots {
                        route: root_route,
                        rule,
                        ranks: tp,
                        src: root.ey_all.sub(0, (tp - 1) * region + k * hidden),
                        rank_pitch: region,
                        out: root.y.sub(0, k * hidden),
                    };
                    ctx.launch(0, op)?;
                }
            }
        }
    }
    let routed = root.moe.sub(0, hidden);
    let shared = root.moe.sub(hidden, hidden);
    if ctx.placement.experts == ExpertMode::Interleaved2 {
        // NVFP4_EP2: each of the 2 owners (rank o % TP) sums its own slots in slot order from
        // +0.0; the root adds owner 0's sum and owner 1's sum.
        let parity = OwnerRule { experts: c.experts as u32, div: 1, modulo: 2 };
        for owner in 0..2 {
            let r = owner % tp;
            let rb = ctx.buffers.ranks[r].clone();
            let acc = rb.esum.sub(owner * hidden, hidden);
            if !sel_down8(ctx) {
                let w = owner_weights(ctx, r, Seam::MoeJoin)?;
                let op = Op::CombineOwned {
                    route: rb.route.sub(0, k),
                    owner: SlotOwner { rule: parity, want: owner as u32 },
                    y: rb.ey.sub(0, k * hidden),
                    w,
                    out: acc,
                };
                ctx.launch(r, op)?;
            }
            ctx.copy(Seam::MoeJoin, r, acc, 0, root.rank_sums.sub(owner * hidden, hidden))?;
        }
        ctx.launch(
            0,
            Op::Add { a: root.rank_sums.sub(0, hidden), b: root.rank_sums.sub(hidden, hidden), out: routed },
        )?;
        ctx.copy(Seam::MoeJoin, 0, root.y.sub(k * hidden, hidden), 0, shared)?;
    } else if ctx.ep_host_arithmetic() {
        // STEP_EP without EP_DEVICE_ARITHMETIC: the weighted combine on the host twin.
        ctx.each_lane(|ctx| ep_host::combine(ctx, root.y, root.route.sub(k, k), root.moe))?;
    } else if folded {
        let macros = ctx.weights.down_macros(l, c.experts).expect("NVFP4 banks upload the down-scale table");
        let op = Op::CombineScaled { route: root_route, y: root.y, w: root.route.sub(k, k), macros, out: root.moe };
        ctx.launch(0, op)?;
        ctx.count("nvfp4_dev_routes.folded_layers");
    } else {
        ctx.launch(0, Op::CombineShared { y: root.y, w: root.route.sub(k, k), out: root.moe })?;
        if ctx.placement.experts == ExpertMode::ExpertParallel && doors.step_ep {
            ctx.count("ep_device_arithmetic.device_ops");
        }
    }
    ctx.seam(l, Seam::MoeJoin, &Ctx::root_part(root.moe))
}

/// Whether layer `l` runs NVFP4_DEV_ROUTES's device routes program: the door, NVFP4 banks
/// and no SwiGLU clamp on the layer (a clamped layer keeps the canonical program, as the
/// engine's door refuses clamped layers). The registry keeps the door off NVFP4_EP2's owner sums
/// and STEP_EP's expert-parallel program.
fn dev_routes(ctx: &Ctx, l: usize) -> bool {
    ctx.cfg.doors.nvfp4_dev_routes && ctx.cfg.nvfp4_experts() && ctx.model.config.swiglu_limit_at(l).is_none()
}

/// NVFP4_EP2's route weights on owner rank `r`: SEL_MIRROR brought them with the ids
/// (`distribute_selection`; rank 0's route is the root's), otherwise one copy from the root,
/// made in `seam` (the moe_join's owner sum, or SEL_DOWN8's fused sweep in the experts seam).
fn owner_weights(ctx: &mut Ctx, r: usize, seam: Seam) -> Result<crate::backend::Slice> {
    let k = ctx.model.config.top_k;
    let rb = ctx.buffers.ranks[r].clone();
    if ctx.cfg.doors.sel_mirror {
        return Ok(rb.route.sub(k, k));
    }
    let weights = ctx.buffers.root.route.sub(k, k);
    ctx.copy(seam, 0, weights, r, rb.rw.sub(0, k))?;
    Ok(rb.rw.sub(0, k))
}

/// Whether SEL_DOWN8's fused sweep replaces the owners' down launch, folds and sums: the door on
/// NVFP4_EP2's interleaved owners (the registry's `requires`; the narrow-row bound is checked at
/// `check_run`, before the run).
fn sel_down8(ctx: &Ctx) -> bool {
    ctx.cfg.doors.sel_down8 && ctx.placement.experts == ExpertMode::Interleaved2
}

/// SEL_DOWN8 on rank `r`: for each NVFP4_EP2 owner it hosts, ONE launch computes the owned routed
/// slots' down partials (into the experts seam's buffer, as `ExpertDown` would) and the owner's
/// slot-ordered sum from +0.0 (into its `esum` half, as `CombineOwned` would).
fn down_combine(ctx: &mut Ctx, r: usize, group: crate::backend::GroupId) -> Result<()> {
    let c = ctx.model.config.clone();
    let (hidden, k, tp) = (c.hidden, c.top_k, ctx.placement.tp);
    let stride = ctx.buffers.gmax * hidden;
    let pitch = ctx.buffers.act_pitch;
    let g_r = ctx.placement.down_kblocks;
    let parity = OwnerRule { experts: c.experts as u32, div: 1, modulo: 2 };
    // The canary's planted defect: the owner sum walks its slots backwards.
    let reverse = ctx.cfg.doors.canary == Some(Canary::Down8SlotOrder);
    for owner in (0..2).filter(|o| o % tp == r) {
        let w = owner_weights(ctx, r, Seam::Experts)?;
        let rb = ctx.buffers.ranks[r].clone();
        let op = Op::ExpertDownCombine {
            group,
            route: rb.route.sub(0, k),
            owner: SlotOwner { rule: parity, want: owner as u32 },
            act: rb.ea.sub(0, (k - 1) * pitch + pitch),
            act_pitch: pitch,
            parts: rb.epart.sub(0, (k - 1) * stride + g_r * hidden),
            parts_pitch: stride,
            w,
            out: rb.esum.sub(owner * hidden, hidden),
            reverse,
        };
        ctx.launch(r, op)?;
        ctx.count("sel_down8.fused_sweeps");
        if reverse {
            ctx.count("canary_down8_slot_order.reversed_sums");
        }
    }
    Ok(())
}

/// Whether the moe_join folds every slot at the root in one kernel (every slot TP-sharded with
/// one K-block count) — the kernel that also computes the residual (`FoldCombineResidual`).
fn join_takes_residual(ctx: &Ctx) -> bool {
    ctx.placement.experts == ExpertMode::TensorParallel
        && ctx.placement.shared_sharded
        && ctx.placement.down_kblocks == ctx.placement.shared_kblocks
}

/// residual: h + (routed + shared), in exactly that operand order — its own launch unless the
/// moe_join's kernel computed it (then the seam times no launch and observes the same values).
fn residual(ctx: &mut Ctx, l: usize) -> Result<()> {
    let hidden = ctx.model.config.hidden;
    let root = ctx.buffers.root.clone();
    let (routed, shared) = (root.moe.sub(0, hidden), root.moe.sub(hidden, hidden));
    ctx.begin(l, Seam::Residual)?;
    if !join_takes_residual(ctx) {
        ctx.launch(0, Op::ResidualAdd { h: root.h, a: routed, b: shared, sum: root.moe_sum, out: root.x })?;
    }
    ctx.seam(l, Seam::Residual, &Ctx::root_part(root.x))
}

/// BULK_P2P: each rank's partials of every TP-sharded slot move to the root in one packed copy
/// per run of consecutive sharded slots of equal G (slot s's shard sits at `s·slot_stride` on
/// its rank and at `s·slot_stride + r·G/TP·hidden` at the root: equal pitches, one 2D copy). A
/// run of one slot is a plain copy (nothing to pack; the backend would not count it anyway).
fn bulk_move_partials(ctx: &mut Ctx, sharded: &[bool]) -> Result<()> {
    let hidden = ctx.model.config.hidden;
    let k = ctx.model.config.top_k;
    let (tp, stride) = (ctx.placement.tp, ctx.buffers.gmax * hidden);
    let root_parts = ctx.buffers.root.epart_all;
    let g_of = |s: usize| if s < k { ctx.placement.down_kblocks } else { ctx.placement.shared_kblocks };
    let mut runs: Vec<(usize, usize, usize)> = Vec::new(); // (first slot, slots, G)
    for (s, sh) in sharded.iter().enumerate() {
        if !*sh {
            continue;
        }
        match runs.last_mut() {
            Some((first, n, g)) if *first + *n == s && *g == g_of(s) => *n += 1,
            _ => runs.push((s, 1, g_of(s))),
        }
    }
    for (first, n, g) in runs {
        let len = g / tp * hidden;
        // Rank 0's partials are the root's buffer already (`buffers.rs`).
        for r in 1..tp {
            let src = ctx.buffers.ranks[r].epart.sub(first * stride, len);
            let dst = root_parts.sub(first * stride + r * len, len);
            if n == 1 {
                ctx.copy(Seam::Experts, r, src, 0, dst)?;
            } else {
                let p = Packed { src, src_pitch: stride, dst, dst_pitch: stride, blocks: n };
                ctx.copy_packed(Seam::Experts, r, 0, p)?;
            }
        }
    }
    Ok(())
}
