//! The work the canonical program hands a backend: one kernel launch ([`Op`], with the row order
//! a NUMERIC door may change), the parts of a batched digest, the entries of an expert group, the
//! fences of a direct join and a packed copy's blocks — each with the rules every backend checks
//! the same way.

mod facts;
pub mod lane_grid;
pub mod lanes;

use super::{GroupId, Slice, WeightId};
use crate::Result;

pub use memra_kernels::twins::experts::{OwnerRule, SlotOwner};

/// One expert as a rank holds it, for an expert group: its gate/up rows and down K-blocks (a TP
/// shard) or the whole expert, and the NVFP4 per-matrix scales (gate, up, down) applied once
/// after each row reduce.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupEntry {
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
    pub nvfp4_scales: Option<[f32; 3]>,
}

/// One part of a batched seam digest ([`Backend::digest_batch`](crate::backend::Backend::digest_batch)): `blocks` blocks of `src.len`
/// elements, block i at `src.offset + i·pitch` of `src.buf` with global base `base + i·base_pitch`.
/// With `owned`, block i counts only when this rank owns the routed slot `first_slot + i`
/// (expert-parallel slots, whose owner is data).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DigestPart {
    pub src: Slice,
    pub blocks: usize,
    pub pitch: usize,
    pub base: u64,
    pub base_pitch: u64,
    pub owned: Option<OwnedSlots>,
}

/// The ownership condition of a [`DigestPart`]: block i of the part counts iff
/// `owner.owns(route, first_slot + i)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OwnedSlots {
    /// The k route ids (bits) on the digesting rank.
    pub route: Slice,
    pub first_slot: usize,
    pub owner: SlotOwner,
}

impl DigestPart {
    /// One contiguous slice with global base `base`.
    pub fn plain(src: Slice, base: u64) -> DigestPart {
        DigestPart { src, blocks: 1, pitch: src.len, base, base_pitch: 0, owned: None }
    }

    /// Block `i` of the part.
    pub fn block(&self, i: usize) -> Slice {
        Slice::new(self.src.buf, self.src.offset + i * self.pitch, self.src.len)
    }

    /// The source span from block 0's first element to the last block's last element.
    pub fn span(&self) -> Slice {
        Slice::new(self.src.buf, self.src.offset, self.blocks.saturating_sub(1) * self.pitch + self.src.len)
    }
}

/// How a row-parallel reduction or GEMV is ordered — canonical, or the arithmetic of a
/// NUMERIC-CLASS door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// The canonical K-block program (`gemv_rows`).
    Canonical,
    /// QKV_FUSED: one pairwise tree over the whole row (`gemv_rows_tree`).
    Tree,
}

/// Distances between two lanes of an [`Op::AttentionRows`], per tensor (elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RowPitch {
    pub q: usize,
    pub kv: usize,
    pub gate: usize,
    pub pos: usize,
    pub out: usize,
}

/// `n` blocks of `s.len` elements, block i at `s.offset + i · pitch`: the span they cover.
pub fn span(s: Slice, pitch: usize, n: usize) -> Slice {
    Slice::new(s.buf, s.offset, if n == 0 { 0 } else { (n - 1) * pitch + s.len })
}

/// Block `i` of `s` at `pitch`.
pub fn block(s: Slice, pitch: usize, i: usize) -> Slice {
    Slice::new(s.buf, s.offset + i * pitch, s.len)
}

/// One kernel launch on one rank. All slices are on that rank.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `out[r]` = whole row r of the weight applied to `x`.
    GemvRows { w: WeightId, x: Slice, out: Slice, order: RowOrder },
    /// K-block partials of every row of the weight: `out[k * rows + r]`.
    GemvPartials { w: WeightId, x: Slice, out: Slice },
    /// Canonical `GemvRows` of up to 4 weights over the same `x` (one launch where the weights
    /// share a format and layout): item i writes whole rows of weight i into its slice.
    GemvRowsBatch { items: Vec<(WeightId, Slice)>, x: Slice },
    /// `out[i]` = canonical fold over `n_parts` vectors of `parts` (`[part][width]`).
    Fold { parts: Slice, n_parts: usize, reverse: bool, out: Slice },
    /// `out[i] = a[i] + b[i]`.
    Add { a: Slice, b: Slice, out: Slice },
    /// `out = x * s` elementwise (the NVFP4 per-matrix scale, applied once).
    Scale { x: Slice, s: f32, out: Slice },
    /// Row-wise RMSNorm of `x` (`rows` rows of `w.len` values).
    RmsNorm { x: Slice, w: Slice, eps: f32, out: Slice },
    /// `h = x + a; out = rmsnorm(h)`.
    AddRmsNorm { x: Slice, a: Slice, w: Slice, eps: f32, h: Slice, out: Slice },
    /// OPROJ_TAIL: `a = fold(parts)`, then `h = x + a; out = rmsnorm(h)` in one kernel (`a` is
    /// also written out so the o_join seam stays observable).
    FoldAddRmsNorm { parts: Slice, n_parts: usize, x: Slice, w: Slice, eps: f32, a: Slice, h: Slice, out: Slice },
    /// Per-head RMSNorm + NeoX RoPE in place (`x` is `[heads][128]`).
    QkNormRope { x: Slice, w: Slice, eps: f32, cos_sin: Slice },
    /// Partitioned decode attention over `len` cached positions, gated per head.
    Attention { q: Slice, k: Slice, v: Slice, gate: Slice, len: usize, q_heads: usize, kv_heads: usize, out: Slice },
    /// Sigmoid top-k router: `out` = k ids (bits) then k weights.
    Router { logits: Slice, bias: Slice, k: usize, normalize: bool, scaling: f32, out: Slice, device_variant: bool },
    /// SwiGLU with the Step clamp.
    Swiglu { gate: Slice, up: Slice, limit: Option<f32>, out: Slice },
    /// `out = Σ_s w[s] · y[s]` in slot order from +0.0 (`y` is `[slots][out.len]`).
    Combine { y: Slice, w: Slice, out: Slice },
    /// The moe_join in one kernel: `out = [Σ_s w[s]·y[s] | y[k]]` (`y` is `[k + 1][width]`, k =
    /// `w.len`, `out` is `2·width`: the routed sum in slot order from +0.0, then the shared slot).
    CombineShared { y: Slice, w: Slice, out: Slice },
    /// The residual in one kernel: `sum = a + b`, then `out = h + sum`.
    ResidualAdd { h: Slice, a: Slice, b: Slice, sum: Slice, out: Slice },
    /// `out[0]` = argmax bits of `x`.
    Argmax { x: Slice, out: Slice },
    /// CANARY: flip the lowest bit of `x[0]`.
    FlipLowBit { x: Slice },
    /// GRAPH (position-independent launches): `pos[0] = value` (u32 bits), set once per token
    /// outside any captured segment.
    SetU32 { out: Slice, value: u32 },
    /// GRAPH: `QkNormRope` with row `pos[0]` of `table` (`[positions][128]`); nothing is written
    /// when the position is outside the table.
    QkNormRopeAt { x: Slice, w: Slice, eps: f32, table: Slice, pos: Slice },
    /// GRAPH: `Attention` over `pos[0] + 1` positions of caches holding `max_len` (`k`, `v` cover
    /// `max_len` positions); nothing is written when `pos[0] >= max_len`. `partition`: positions
    /// per partition — the program's constant `ATTN_PARTITION`, another value only under the
    /// verify-partitions canary.
    AttentionAt {
        q: Slice,
        k: Slice,
        v: Slice,
        gate: Slice,
        pos: Slice,
        max_len: usize,
        q_heads: usize,
        kv_heads: usize,
        partition: usize,
        out: Slice,
    },
    /// DCW: `pos[0] += by` (u32 bits) — a lane's device-held position advanced by the device
    /// counter (one token for a row, the accepted columns for a column) instead of set from the
    /// host.
    IncU32 { out: Slice, by: u32 },
    /// DECODE_V2 (rows or columns) and SPEC_FA2 (`walk_once`, two columns): [`Op::AttentionAt`]
    /// for `rows` lanes in one launch. Lane i reads `q`, `gate`, `pos`, `out` at `i ·` their
    /// pitch from the first lane's slices and `k`, `v` at `i · pitch.kv` (0: the lanes share one
    /// session's caches, as columns do). `walk_once`: the lanes' scores come from one walk over
    /// the cached keys. Each lane's values are exactly its `AttentionAt`'s.
    AttentionRows {
        rows: usize,
        q: Slice,
        k: Slice,
        v: Slice,
        gate: Slice,
        pos: Slice,
        out: Slice,
        pitch: RowPitch,
        max_len: usize,
        q_heads: usize,
        kv_heads: usize,
        partition: usize,
        walk_once: bool,
    },
    /// TCOL_OPROJ: [`Op::Fold`] (forward) of `lanes` lanes in one launch — lane i's parts at
    /// `i · parts_pitch` of `parts`, its output at `i · out_pitch` of `out`.
    FoldLanes { lanes: usize, parts: Slice, parts_pitch: usize, n_parts: usize, out: Slice, out_pitch: usize },
    /// GRAPH: the KV append at the device-held position: `cache[pos[0] * src.len ..] = src`;
    /// nothing is written when the row does not fit.
    AppendAt { src: Slice, cache: Slice, pos: Slice },
    /// The rope seam in one kernel at the device-held position `pos[0]`: `q_out` = q/k-norm + RoPE
    /// of `q`, `k_out` likewise of `k` (row `pos[0]` of `table`), `k_out` and `v` stored at row
    /// `pos[0]` of `k_cache` / `v_cache` (rows of `k.len`). Nothing is written when the position
    /// is outside the table or the caches.
    RopeAppend {
        q: Slice,
        k: Slice,
        v: Slice,
        q_norm: Slice,
        k_norm: Slice,
        eps: f32,
        table: Slice,
        pos: Slice,
        q_out: Slice,
        k_out: Slice,
        k_cache: Slice,
        v_cache: Slice,
    },
    /// Grouped experts, gate + up + SwiGLU of `slots` slots from `first_slot`: slot s < route.len
    /// runs routed expert `route[s]` (id bits), slot s ≥ route.len the shared entry; slot j of the
    /// op writes its expert's rows at `act.offset + j·act_pitch`. A slot whose expert this rank
    /// does not hold (or whose id is no expert) writes nothing. `fold_up` (NVFP4_DEV_ROUTES, an
    /// unclamped layer: `limit` is `None`): an expert with NVFP4 per-matrix scales applies its up
    /// scale after the SwiGLU's product, `(silu(g·sg)·u)·su`, instead of to `u` before it.
    ExpertGateUp {
        group: GroupId,
        route: Slice,
        first_slot: usize,
        slots: usize,
        x: Slice,
        limit: Option<f32>,
        fold_up: bool,
        act: Slice,
        act_pitch: usize,
    },
    /// STEP_EP without EP_DEVICE_ARITHMETIC: [`Op::ExpertGateUp`] without the SwiGLU — slot j of
    /// the op writes its expert's gate rows at `gate.offset + j·pitch` and its up rows at
    /// `up.offset + j·pitch` (the SwiGLU's operands: whole-row folds, NVFP4 per-matrix scales
    /// applied once after each), for the program to apply the SwiGLU on the host. A slot whose
    /// expert this rank does not hold (or whose id is no expert) writes nothing.
    ExpertGateUpRows {
        group: GroupId,
        route: Slice,
        first_slot: usize,
        slots: usize,
        x: Slice,
        gate: Slice,
        up: Slice,
        pitch: usize,
    },
    /// Grouped experts, down-projection K-block partials of the held K-blocks: slot j of the op
    /// reads `act` at `j·act_pitch` and writes `[kblocks][rows]` at `out.offset + j·out_pitch`.
    ExpertDown {
        group: GroupId,
        route: Slice,
        first_slot: usize,
        slots: usize,
        act: Slice,
        act_pitch: usize,
        out: Slice,
        out_pitch: usize,
    },
    /// Canonical fold of each slot's `n_parts` partials (`[part][width]` at `j·parts_pitch` of
    /// `parts`) into `out` (`[slots][width]`), from +0.0 in part order; with `owner`, a routed slot
    /// is folded only by its owner; with `scales`, the slot's NVFP4 down scale (from that group)
    /// is applied once after the fold.
    FoldSlots {
        route: Slice,
        first_slot: usize,
        slots: usize,
        parts: Slice,
        parts_pitch: usize,
        n_parts: usize,
        owner: Option<SlotOwner>,
        scales: Option<GroupId>,
        out: Slice,
    },
    /// The TP-sharded moe_join and the residual in one kernel: every one of the `w.len + 1` slots
    /// folded from its `n_parts` partials (`[part][width]` at `s·pitch` of `parts`), then
    /// `out = [Σ_{s<k} w[s]·y_s | y_k]` (`out` is `2·width`), then `ResidualAdd`'s
    /// `sum = routed + shared` and `x = h + sum` (each `width`).
    FoldCombineResidual {
        parts: Slice,
        pitch: usize,
        n_parts: usize,
        w: Slice,
        h: Slice,
        out: Slice,
        sum: Slice,
        x: Slice,
    },
    /// Expert-parallel gather: `out[s] = src[o·rank_pitch + s·width ..]` for each routed slot,
    /// `o = rule.owner_of(route[s])` (below `ranks`); `width = out.len / route.len`. Bytes only.
    SelectSlots { route: Slice, rule: OwnerRule, ranks: usize, src: Slice, rank_pitch: usize, out: Slice },
    /// NVFP4_EP2's per-owner sum: `out = +0`, then per owned routed slot in order
    /// `out = out + (+0 + w[s]·y[s])` (`y` is `[k][out.len]`, `w` has k values).
    CombineOwned { route: Slice, owner: SlotOwner, y: Slice, w: Slice, out: Slice },
    /// SEL_DOWN8: an owner's NVFP4 down sweep and route-weight combine in one launch. For every
    /// routed slot s < route.len that `owner` owns and this rank holds, the down K-block partials
    /// of `act[s·act_pitch ..]` are written to `parts[s·parts_pitch ..]` (`[kblocks][rows]`, what
    /// `ExpertDown` writes); then `out = +0` and per such slot in order `y = fold(partials)·sd`,
    /// `out = out + (+0 + w[s]·y)` — `FoldSlots { owner, scales }` + `CombineOwned` without
    /// storing y (`twins::down8`). `out.len` is the down rows. `reverse` (only the canary
    /// `canary_down8_slot_order`, a planted defect) sums the owned slots from k−1 down to 0.
    ExpertDownCombine {
        group: GroupId,
        route: Slice,
        owner: SlotOwner,
        act: Slice,
        act_pitch: usize,
        parts: Slice,
        parts_pitch: usize,
        w: Slice,
        out: Slice,
        reverse: bool,
    },
    /// NVFP4_DEV_ROUTES: the moe_join's combine with each routed slot's down scale folded into its
    /// weight: `out[..width] = +0`, then per routed slot s in order `out = out + (w[s]·m)·y[s]`
    /// with `m = macros[route[s]]` (1.0 for an id outside the table), `out[width..] = y[k]` (the
    /// shared slot, copied). `y` is `[k + 1][width]` (routed slots unscaled), `out` `2·width`.
    CombineScaled { route: Slice, y: Slice, w: Slice, macros: Slice, out: Slice },
    /// SEL_MIRROR: `out = src`, bit for bit (u32 payloads such as route ids travel as bit
    /// patterns) — the routed selection's mirror, launched by the root as a peer store into a
    /// peer rank's route buffer (`src.len == out.len`).
    MirrorSel { src: Slice, out: Slice },
}

impl Op {
    /// The slice a peer store may place on another rank: the one output of an op that writes
    /// exactly one slice and does not read it. In-place ops and ops with several outputs have none
    /// (their outputs cannot be split between two ranks' memories).
    pub fn store_target(&self) -> Option<Slice> {
        match *self {
            Op::GemvRows { out, .. }
            | Op::GemvPartials { out, .. }
            | Op::Fold { out, .. }
            | Op::Add { out, .. }
            | Op::Scale { out, .. }
            | Op::FoldSlots { out, .. }
            | Op::MirrorSel { out, .. } => Some(out),
            // One slot writes one contiguous region; several slots write a strided set, which a
            // peer store (a whole slice) cannot express.
            Op::ExpertDown { out, slots: 1, .. } => Some(out),
            _ => None,
        }
    }

    /// The same op with its store target replaced by `to` (unchanged for an op without one).
    pub fn with_store_target(mut self, to: Slice) -> Op {
        match &mut self {
            Op::GemvRows { out, .. }
            | Op::GemvPartials { out, .. }
            | Op::Fold { out, .. }
            | Op::Add { out, .. }
            | Op::Scale { out, .. }
            | Op::FoldSlots { out, .. }
            | Op::MirrorSel { out, .. }
            | Op::ExpertDown { out, slots: 1, .. } => *out = to,
            _ => {}
        }
        self
    }
}

/// How the two fences of a direct join's peer store are carried out. The first orders the store
/// after the destination rank's earlier work (it must not overwrite partials that rank is still
/// reading); the second orders the destination's later work after the store (its fold sees it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinFence {
    /// Recorded events awaited across streams (or, on the host, the rank threads' message order).
    Events,
    /// FENCE_MEMOPS: stream memory-op doorbells — the signalling stream writes a ticket, the
    /// waiting stream waits until the flag reaches it. Only CUDA streams have them; a device that
    /// rejects them gets events instead, and such a fence is not counted as a doorbell.
    Doorbells,
    /// FENCE_RANK1 (with FENCE_MEMOPS): the first fence a [`JoinFence::Doorbells`] doorbell; the
    /// second a doorbell in the DESTINATION's device memory — the producer's stream launches a
    /// one-thread kernel that stores the ticket into a flag word of the destination rank's
    /// device, and the destination's stream waits on it with a same-device stream memop. Only
    /// CUDA has it; a device that rejects memops gets events, uncounted.
    KernelDoorbell,
}

/// BULK_P2P: `blocks` blocks of `src.len` elements, block i at `src.offset + i·src_pitch` of
/// `src.buf`, moved to `dst.offset + i·dst_pitch` of `dst.buf` in one copy. The elements between
/// blocks are not touched on either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packed {
    /// Block 0 of the source (its `len` is every block's length).
    pub src: Slice,
    pub src_pitch: usize,
    /// Block 0 of the destination (`len` equal to `src.len`).
    pub dst: Slice,
    pub dst_pitch: usize,
    pub blocks: usize,
}

impl Packed {
    /// Block `i` of the source.
    pub fn src_block(&self, i: usize) -> Slice {
        Slice::new(self.src.buf, self.src.offset + i * self.src_pitch, self.src.len)
    }

    /// Block `i` of the destination.
    pub fn dst_block(&self, i: usize) -> Slice {
        Slice::new(self.dst.buf, self.dst.offset + i * self.dst_pitch, self.dst.len)
    }

    /// The source span from block 0's first element to the last block's last element.
    pub fn src_span(&self) -> Slice {
        Slice::new(self.src.buf, self.src.offset, self.blocks.saturating_sub(1) * self.src_pitch + self.src.len)
    }

    /// The destination span, like [`Packed::src_span`].
    pub fn dst_span(&self) -> Slice {
        Slice::new(self.dst.buf, self.dst.offset, self.blocks.saturating_sub(1) * self.dst_pitch + self.dst.len)
    }

    /// Shape rules every backend checks: equal block lengths, at least one block, and pitches
    /// that keep blocks apart (a pitch below the block length would make blocks overlap).
    pub fn check(&self) -> Result<()> {
        let rule = |detail: String| Err(crate::RuntimeError::Contract(format!("packed copy: {detail}")));
        if self.src.len != self.dst.len {
            return rule(format!("source blocks of {} elements, destination blocks of {}", self.src.len, self.dst.len));
        }
        if self.blocks == 0 {
            return rule("0 blocks: a packed copy moves at least one block".into());
        }
        if self.blocks > 1 && (self.src_pitch < self.src.len || self.dst_pitch < self.dst.len) {
            return rule(format!(
                "pitches {} (source) and {} (destination) are below the block length {}: blocks would overlap",
                self.src_pitch, self.dst_pitch, self.src.len
            ));
        }
        Ok(())
    }
}

/// Checks every backend's peer store shares: two distinct ranks and an op with one store target.
/// Returns the target (a slice of `out_rank`).
pub fn peer_store_target(op: &Op, rank: usize, out_rank: usize) -> Result<Slice> {
    if rank == out_rank {
        return Err(crate::RuntimeError::Contract(format!(
            "peer store on rank {rank} into its own memory: a peer store crosses ranks (a rank's own output is a plain launch)"
        )));
    }
    op.store_target().ok_or_else(|| {
        crate::RuntimeError::Contract(format!(
            "peer store of {op:?}: only an op with exactly one output that it does not read (gemv, fold, add, scale) can store into another rank"
        ))
    })
}
