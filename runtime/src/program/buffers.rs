//! The activation buffers of the decode step, allocated once per run on their ranks. Every
//! buffer is fully overwritten before its consumers read it within a step; only the KV caches
//! carry state from one step to the next.
//!
//! Rows and columns (docs/DESIGN.md §3.6): a pass of `lanes` rows or columns holds one copy of
//! every activation buffer per lane, lane `i`'s at `i × stride` of the same allocation (the
//! stride is the buffer's one-lane size), so a slice of lane 0 names the same tensor of every
//! lane ([`Buffers::shift`]) and a multi-row GEMM reads `[lanes][len]` at a fixed pitch. KV caches
//! are per session: rows have one cache per lane (a session keeps its lane), columns share one.

use super::placement::Placement;
use std::collections::HashMap;

use crate::backend::{Backend, BufId, Slice};
use crate::config::PassShape;
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
    /// STEP_EP without EP_DEVICE_ARITHMETIC: the up rows of every routed slot at `s * act_pitch`
    /// (their gate rows go to `ea`, which the program's host SwiGLU then overwrites).
    pub eu: Slice,
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
    /// `len_mirror[layer]`: the layer's KV length mirror, one u32 — the position its cache last
    /// appended at, copied from `pos` after the layer's append (LEN_MIRROR_LAZY skips the copies
    /// where no later pass reads them; a verify/prefill pass reads them all, `passes.rs`).
    pub len_mirror: Vec<Slice>,
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
    /// Lanes of a pass (rows or columns; 1 for single-token decode).
    pub lanes: usize,
    /// Per (rank, buffer): the distance between two lanes' copies. Buffers not listed (weights,
    /// parameters, the shared KV caches of columns) are the same for every lane.
    strides: HashMap<(usize, BufId), usize>,
}

impl Buffers {
    /// Lane `lane`'s copy of `s` (a slice of lane 0 on `rank`).
    pub fn shift(&self, rank: usize, s: Slice, lane: usize) -> Slice {
        match self.strides.get(&(rank, s.buf)) {
            Some(stride) if lane > 0 => Slice::new(s.buf, s.offset + lane * stride, s.len),
            _ => s,
        }
    }

    /// The distance between two lanes' copies of `s` on `rank` (0: shared by every lane).
    pub fn lane_stride(&self, rank: usize, s: Slice) -> usize {
        self.strides.get(&(rank, s.buf)).copied().unwrap_or(0)
    }
}

/// Allocation of one run's buffers: `lanes` copies of each, the strides recorded.
struct Alloc<'a> {
    b: &'a mut dyn Backend,
    lanes: usize,
    strides: HashMap<(usize, BufId), usize>,
}

impl Alloc<'_> {
    /// A buffer of `len` values per lane, as lane 0's slice.
    fn whole(&mut self, rank: usize, len: usize) -> Result<Slice> {
        let buf = self.b.alloc(rank, len * self.lanes)?;
        if self.lanes > 1 {
            self.strides.insert((rank, buf), len);
        }
        Ok(Slice::new(buf, 0, len))
    }

    /// A KV cache of `len` values: one per lane for rows (`per_lane`), one shared for columns.
    fn cache(&mut self, rank: usize, len: usize, per_lane: bool) -> Result<BufId> {
        if per_lane {
            Ok(self.whole(rank, len)?.buf)
        } else {
            self.b.alloc(rank, len)
        }
    }
}

pub fn allocate(
    b: &mut dyn Backend,
    c: &ModelConfig,
    p: &Placement,
    n_layers: usize,
    shape: PassShape,
) -> Result<Buffers> {
    let lanes = shape.lanes();
    let mut a = Alloc { b, lanes, strides: HashMap::new() };
    let rows = shape.batch > 1;
    let hd = c.head_dim;
    let gmax = p.down_kblocks.max(p.shared_kblocks);
    let slots = c.top_k + 1;
    let width_max = c.expert_width.max(c.shared_width);
    let mut ranks = Vec::new();
    let ey_all = a.whole(0, p.tp * slots * c.hidden)?;
    let epart_all = a.whole(0, slots * gmax * c.hidden)?;
    for r in 0..p.tp {
        let lq = p.q_heads_per_rank * hd;
        let lkv = p.kv_heads_per_rank * hd;
        let g_local = p.o_kblocks / p.tp;
        let mut kc = Vec::new();
        let mut vc = Vec::new();
        let mut len_mirror = Vec::new();
        for _ in 0..n_layers {
            kc.push(a.cache(r, c.max_positions * lkv, rows)?);
            vc.push(a.cache(r, c.max_positions * lkv, rows)?);
            len_mirror.push(a.whole(r, 1)?);
        }
        ranks.push(RankBuffers {
            normed: a.whole(r, c.hidden)?,
            q: a.whole(r, lq)?,
            k: a.whole(r, lkv)?,
            v: a.whole(r, lkv)?,
            g: a.whole(r, p.q_heads_per_rank)?,
            q_r: a.whole(r, lq)?,
            k_r: a.whole(r, lkv)?,
            attn: a.whole(r, lq)?,
            opart: a.whole(r, g_local * c.hidden)?,
            xin: a.whole(r, c.hidden)?,
            route: a.whole(r, 2 * c.top_k)?,
            ea: a.whole(r, slots * width_max)?,
            eu: a.whole(r, c.top_k * width_max)?,
            epart: if r == 0 { epart_all } else { a.whole(r, slots * gmax * c.hidden)? },
            ey: if r == 0 { ey_all.sub(0, slots * c.hidden) } else { a.whole(r, slots * c.hidden)? },
            rw: a.whole(r, 2 * c.top_k)?,
            esum: a.whole(r, 3 * c.hidden)?,
            pos: a.whole(r, 1)?,
            kc,
            vc,
            len_mirror,
        });
    }
    let root = RootBuffers {
        x: a.whole(0, c.hidden)?,
        opart_all: a.whole(0, p.o_kblocks * c.hidden)?,
        ojoin: a.whole(0, c.hidden)?,
        h: a.whole(0, c.hidden)?,
        router_logits: a.whole(0, c.experts)?,
        route: ranks[0].route,
        epart_all,
        ey_all,
        y: a.whole(0, slots * c.hidden)?,
        moe: a.whole(0, 2 * c.hidden)?,
        moe_sum: a.whole(0, c.hidden)?,
        rank_sums: a.whole(0, 2 * c.hidden)?,
        fnorm: a.whole(0, c.hidden)?,
        logits: a.whole(0, c.vocab)?,
        amax: a.whole(0, 1)?,
    };
    Ok(Buffers { ranks, root, gmax, slots, act_pitch: width_max, lanes, strides: a.strides })
}
