//! The activation buffers of the decode step, allocated once per run on their ranks. Every
//! buffer is fully overwritten before its consumers read it within a step; only the KV caches
//! carry state from one step to the next.

use super::placement::Placement;
use crate::backend::{Backend, BufId, Slice};
use crate::model::ModelConfig;
use crate::Result;

/// One rank's buffers.
#[derive(Debug, Clone)]
pub struct RankBuffers {
    /// Replicated attention input (attn_norm output).
    pub normed: Slice,
    pub q: Slice,
    pub k: Slice,
    pub v: Slice,
    pub g: Slice,
    /// q and k after the per-head norm and RoPE (the rope seam; `q`/`k` keep the qkv seam).
    pub q_r: Slice,
    pub k_r: Slice,
    pub attn: Slice,
    /// This rank's o_proj K-block partials `[G_local][hidden]`.
    pub opart: Slice,
    /// Replicated expert input (ffn_norm output).
    pub xin: Slice,
    /// The route as this rank reads it (k ids as bits, then k weights); rank 0's is the root's.
    pub route: Slice,
    /// SwiGLU activations of every slot, slot s at `s * act_pitch` (the widest expert).
    pub ea: Slice,
    /// Expert down partials, slot s at `s * gmax * hidden`. Rank 0's IS the root's `epart_all`:
    /// its K-blocks of a TP-sharded slot sit at their canonical place there already (offset
    /// `s * stride + 0`), so the root never copies its own partials.
    pub epart: Slice,
    /// Folded per-slot expert outputs `[slots][hidden]` (EP owners, NVFP4 ranks); rank 0's is
    /// region 0 of the root's `ey_all`.
    pub ey: Slice,
    /// Route weights copied to this rank (NVFP4_EP2 per-rank sums).
    pub rw: Slice,
    /// NVFP4_EP2: the two owners' slot-ordered partial routed sums and a scratch row `[3][hidden]`.
    pub esum: Slice,
    /// `kc[layer]`, `vc[layer]`: `[max_positions][kv_heads_local][128]`.
    pub kc: Vec<BufId>,
    /// GRAPH: the decode position as one u32, set once per token, read by the captured launches.
    pub pos: Slice,
    pub vc: Vec<BufId>,
}

/// Root-only buffers (rank 0).
#[derive(Debug, Clone)]
pub struct RootBuffers {
    /// Residual stream (layer input; the residual seam writes the next layer's input here).
    pub x: Slice,
    pub opart_all: Slice,
    pub ojoin: Slice,
    pub h: Slice,
    pub router_logits: Slice,
    /// k ids (bits) then k weights.
    pub route: Slice,
    pub epart_all: Slice,
    /// Every rank's folded slot outputs `[tp][slots][hidden]` (expert-parallel gather).
    pub ey_all: Slice,
    /// `[slots][hidden]`.
    pub y: Slice,
    /// `[routed | shared]`.
    pub moe: Slice,
    pub moe_sum: Slice,
    /// NVFP4_EP2: both ranks' partial routed sums `[2][hidden]`.
    pub rank_sums: Slice,
    pub fnorm: Slice,
    pub logits: Slice,
    pub amax: Slice,
}

#[derive(Debug, Clone)]
pub struct Buffers {
    pub ranks: Vec<RankBuffers>,
    pub root: RootBuffers,
    /// Largest G of any expert down projection (slot stride of expert partials).
    pub gmax: usize,
    /// Routed slots + the shared expert.
    pub slots: usize,
    /// Values between two slots of `ea` (the widest expert's intermediate width).
    pub act_pitch: usize,
}

fn whole(b: &mut dyn Backend, rank: usize, len: usize) -> Result<Slice> {
    Ok(Slice::new(b.alloc(rank, len)?, 0, len))
}

pub fn allocate(b: &mut dyn Backend, c: &ModelConfig, p: &Placement, n_layers: usize) -> Result<Buffers> {
    let hd = c.head_dim;
    let gmax = p.down_kblocks.max(p.shared_kblocks);
    let slots = c.top_k + 1;
    let width_max = c.expert_width.max(c.shared_width);
    let mut ranks = Vec::new();
    let ey_all = whole(b, 0, p.tp * slots * c.hidden)?;
    let epart_all = whole(b, 0, slots * gmax * c.hidden)?;
    for r in 0..p.tp {
        let lq = p.q_heads_per_rank * hd;
        let lkv = p.kv_heads_per_rank * hd;
        let g_local = p.o_kblocks / p.tp;
        let mut kc = Vec::new();
        let mut vc = Vec::new();
        for _ in 0..n_layers {
            kc.push(b.alloc(r, c.max_positions * lkv)?);
            vc.push(b.alloc(r, c.max_positions * lkv)?);
        }
        ranks.push(RankBuffers {
            normed: whole(b, r, c.hidden)?,
            q: whole(b, r, lq)?,
            k: whole(b, r, lkv)?,
            v: whole(b, r, lkv)?,
            g: whole(b, r, p.q_heads_per_rank)?,
            q_r: whole(b, r, lq)?,
            k_r: whole(b, r, lkv)?,
            attn: whole(b, r, lq)?,
            opart: whole(b, r, g_local * c.hidden)?,
            xin: whole(b, r, c.hidden)?,
            route: whole(b, r, 2 * c.top_k)?,
            ea: whole(b, r, slots * width_max)?,
            epart: if r == 0 { epart_all } else { whole(b, r, slots * gmax * c.hidden)? },
            ey: if r == 0 { ey_all.sub(0, slots * c.hidden) } else { whole(b, r, slots * c.hidden)? },
            rw: whole(b, r, 2 * c.top_k)?,
            esum: whole(b, r, 3 * c.hidden)?,
            pos: whole(b, r, 1)?,
            kc,
            vc,
        });
    }
    let root = RootBuffers {
        x: whole(b, 0, c.hidden)?,
        opart_all: whole(b, 0, p.o_kblocks * c.hidden)?,
        ojoin: whole(b, 0, c.hidden)?,
        h: whole(b, 0, c.hidden)?,
        router_logits: whole(b, 0, c.experts)?,
        route: ranks[0].route,
        epart_all,
        ey_all,
        y: whole(b, 0, slots * c.hidden)?,
        moe: whole(b, 0, 2 * c.hidden)?,
        moe_sum: whole(b, 0, c.hidden)?,
        rank_sums: whole(b, 0, 2 * c.hidden)?,
        fnorm: whole(b, 0, c.hidden)?,
        logits: whole(b, 0, c.vocab)?,
        amax: whole(b, 0, 1)?,
    };
    Ok(Buffers { ranks, root, gmax, slots, act_pitch: width_max })
}
