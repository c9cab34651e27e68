//! The backend contract: what the canonical program asks of a machine.
//!
//! A backend owns `ranks()` ranks. Each rank has private memory (an arena on the host, a CUDA
//! context's allocations on a device) and executes its work in issue order, like a stream.
//! [`Backend::launch`] and [`Backend::copy`] may return before the work is done; ordering across
//! ranks exists only through `copy` (the destination's later work sees the bytes; the source's
//! earlier work produced them). [`Backend::read`] and [`Backend::collect`] wait.
//!
//! Every [`Op`] is one kernel; its arithmetic is the host twin's in `memra_kernels::twins`.

pub mod census;
pub mod coverage;
pub mod cuda;
pub mod defect;
pub mod dist;
pub mod host;
mod host_rows;

use crate::config::Transport;
use crate::model::matrix::MatrixShard;
use crate::Result;

/// A rank-local f32 buffer (u32 payloads such as router ids travel as bit patterns).
pub type BufId = u32;
/// A rank-local weight shard.
pub type WeightId = u32;
/// A rank-local table of experts read by the grouped expert ops ([`Backend::register_experts`]).
pub type GroupId = u32;

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

/// One part of a batched seam digest ([`Backend::digest_batch`]): `blocks` blocks of `src.len`
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

/// `len` elements of buffer `buf` from element `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub buf: BufId,
    pub offset: usize,
    pub len: usize,
}

impl Slice {
    pub fn new(buf: BufId, offset: usize, len: usize) -> Slice {
        Slice { buf, offset, len }
    }
    /// The sub-slice `[start, start + len)` of this slice.
    pub fn sub(self, start: usize, len: usize) -> Slice {
        debug_assert!(start + len <= self.len, "sub-slice {start}+{len} outside slice of {}", self.len);
        Slice { buf: self.buf, offset: self.offset + start, len }
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
    /// `max_len` positions); nothing is written when `pos[0] >= max_len`.
    AttentionAt {
        q: Slice,
        k: Slice,
        v: Slice,
        gate: Slice,
        pos: Slice,
        max_len: usize,
        q_heads: usize,
        kv_heads: usize,
        out: Slice,
    },
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
    /// does not hold (or whose id is no expert) writes nothing.
    ExpertGateUp {
        group: GroupId,
        route: Slice,
        first_slot: usize,
        slots: usize,
        x: Slice,
        limit: Option<f32>,
        act: Slice,
        act_pitch: usize,
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
    /// The TP-sharded moe_join in one kernel: every one of the `w.len + 1` slots folded from its
    /// `n_parts` partials (`[part][width]` at `s·pitch` of `parts`), then
    /// `out = [Σ_{s<k} w[s]·y_s | y_k]` (`out` is `2·width`).
    FoldCombine { parts: Slice, pitch: usize, n_parts: usize, w: Slice, out: Slice },
    /// Expert-parallel gather: `out[s] = src[o·rank_pitch + s·width ..]` for each routed slot,
    /// `o = rule.owner_of(route[s])` (below `ranks`); `width = out.len / route.len`. Bytes only.
    SelectSlots { route: Slice, rule: OwnerRule, ranks: usize, src: Slice, rank_pitch: usize, out: Slice },
    /// NVFP4_EP2's per-owner sum: `out = +0`, then per owned routed slot in order
    /// `out = out + (+0 + w[s]·y[s])` (`y` is `[k][out.len]`, `w` has k values).
    CombineOwned { route: Slice, owner: SlotOwner, y: Slice, w: Slice, out: Slice },
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
            | Op::FoldSlots { out, .. } => Some(out),
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

/// What `collect` returns: digests in ticket order, and per-rank timing marks (ns since the
/// first mark after the previous collect).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collected {
    pub digests: Vec<u64>,
    pub marks_ns: Vec<Vec<u64>>,
}

/// Result of the byte-integrity probe for one ordered rank pair and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    pub src: usize,
    pub dst: usize,
    pub bytes: usize,
    pub bad_words: usize,
    /// Peer access is not available for this pair: native-P2P runs must be SKIPPED.
    pub no_peer_access: Option<String>,
}

/// Where a backend stands after a program's weights are placed: the buffers each rank holds.
/// [`Backend::rewind`] returns to it, so several runs share one upload (docs/DESIGN.md §8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Buffers allocated on each rank (ids `0..n` stay, later ones are freed).
    pub buffers: Vec<usize>,
}

/// A machine that runs the canonical program.
pub trait Backend {
    /// One line: backend, devices, placement of ranks.
    fn describe(&self) -> String;
    fn ranks(&self) -> usize;
    /// Place a weight shard on a rank.
    fn upload_weight(&mut self, rank: usize, shard: &MatrixShard) -> Result<WeightId>;
    /// [`Backend::upload_weight`] of a shard the caller does not need again (the host backend
    /// keeps it without a copy).
    fn upload_weight_owned(&mut self, rank: usize, shard: MatrixShard) -> Result<WeightId> {
        self.upload_weight(rank, &shard)
    }
    /// The state [`Backend::rewind`] returns to; `None` where the backend cannot rewind (then
    /// every run needs a backend of its own).
    fn checkpoint(&self) -> Option<Checkpoint> {
        None
    }
    /// Start a new run on the weights already placed: free every buffer allocated after `to`
    /// (ids from `to.buffers[rank]` on), forget every graph segment, and reset what a run counts
    /// or queues — engagement counters, timing marks, digest tickets — so the next run sees the
    /// backend exactly as right after the upload. Weights and expert groups stay. The default
    /// refuses.
    fn rewind(&mut self, to: &Checkpoint) -> Result<()> {
        let _ = to;
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "rewind",
            rule: format!(
                "{}: this backend cannot start a new run on weights it already holds (open a fresh one)",
                self.describe()
            ),
        })
    }
    /// A zero-initialised buffer of `len` elements on a rank.
    fn alloc(&mut self, rank: usize, len: usize) -> Result<BufId>;
    /// Host → rank; `data.len() == dst.len`.
    fn write(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()>;
    /// Rank → host, after the rank's prior work.
    fn read(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>>;
    fn launch(&mut self, rank: usize, op: Op) -> Result<()>;
    /// Move `src.len` elements from a slice of `src_rank` to one of `dst_rank` over `transport`.
    fn copy(&mut self, transport: Transport, src_rank: usize, src: Slice, dst_rank: usize, dst: Slice) -> Result<()>;
    /// Queue a digest (`digest_f32` with global base index) of a slice; its value comes back in
    /// `collect().digests[ticket]`.
    fn digest(&mut self, rank: usize, src: Slice, base: u64) -> Result<usize>;
    /// Queue one batched digest per group of parts (one launch per call on a device): the value of
    /// group g — the wrapping sum of its parts' digests, each block with its global base, owned
    /// blocks only — comes back as the wrapping sum of `collect().digests[t]` over the tickets
    /// `t` of `result[g]`. The default digests every block with [`Backend::digest`] (one ticket
    /// each) and refuses an ownership condition, which needs the route on the device.
    fn digest_batch(&mut self, rank: usize, groups: &[Vec<DigestPart>]) -> Result<Vec<Vec<usize>>> {
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            let mut tickets = Vec::new();
            for p in g {
                if p.owned.is_some() {
                    return Err(crate::RuntimeError::Unsupported {
                        backend: self.describe(),
                        mechanism: "owner-read digests",
                        rule: format!(
                            "{}: this backend cannot digest expert-parallel slots whose owner is read from the route",
                            self.describe()
                        ),
                    });
                }
                for i in 0..p.blocks {
                    tickets.push(self.digest(rank, p.block(i), p.base + i as u64 * p.base_pitch)?);
                }
            }
            out.push(tickets);
        }
        Ok(out)
    }
    /// Queue a timing mark on every rank.
    fn mark(&mut self) -> Result<()>;
    /// Wait for every rank; return queued digests and marks and reset both queues.
    fn collect(&mut self) -> Result<Collected>;
    /// The byte-integrity probe of docs/DESIGN.md §3.5 over every ordered pair at `sizes_bytes`.
    fn probe(&mut self, transport: Transport, sizes_bytes: &[usize]) -> Result<Vec<ProbeResult>>;

    /// NUMERIC-CLASS door MEMRA_NCCL_ALLREDUCE: NCCL's all-reduce (sum) of one vector per rank,
    /// in whatever order NCCL's algorithm picks (not the canonical fold). `parts` holds exactly one
    /// `(rank, slice)` per rank, all of `out.len` elements; `out` on `out_rank` receives the sum,
    /// and every other rank's part is overwritten with it (an all-reduce writes every rank).
    /// Ordered like a copy: after each rank's earlier work, before `out_rank`'s later work. Only a
    /// backend with NCCL has it; the default refuses.
    fn all_reduce_sum(&mut self, parts: &[(usize, Slice)], out_rank: usize, out: Slice) -> Result<()> {
        let _ = (parts, out_rank, out);
        Err(crate::RuntimeError::Unsupported { backend: self.describe(), mechanism: "NCCL all-reduce", rule: format!(
            "{}: this backend has no NCCL all-reduce (MEMRA_NCCL_ALLREDUCE needs the CUDA backend with the nccl transport)",
            self.describe()
        ) })
    }

    /// CANARY SkipFence: like [`Backend::copy`], except that the copy does NOT wait for the source
    /// rank's earlier work (the producer of the bytes) — a planted race. A backend whose copies
    /// cannot be separated from their producer fence refuses: the default never falls back to the
    /// fenced copy, which would make the canary pass silently.
    fn copy_unfenced(
        &mut self,
        transport: Transport,
        src_rank: usize,
        src: Slice,
        dst_rank: usize,
        dst: Slice,
    ) -> Result<()> {
        let _ = (transport, src_rank, src, dst_rank, dst);
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "unfenced copies",
            rule: format!(
                "{}: this backend has no producer fence to skip (the skip_fence canary needs device streams)",
                self.describe()
            ),
        })
    }

    /// Direct joins (OPROJ_DIRECT, MOE_DIRECT): run `op` on `rank` with its inputs on `rank` and
    /// its one output ([`Op::store_target`]) a slice of `out_rank` — the kernel stores straight
    /// into `out_rank`'s memory; no slice of `rank` is written and no copy follows. Ordered after
    /// `out_rank`'s earlier work and before its later work (the join's two fences, carried out
    /// as `fence` says), and after `rank`'s earlier work (stream order). The default refuses: a
    /// backend without peer stores must never fall back to a copy, which would make the door
    /// vacuous.
    fn launch_peer_store(&mut self, rank: usize, op: Op, out_rank: usize, fence: JoinFence) -> Result<()> {
        let _ = (rank, op, out_rank, fence);
        Err(crate::RuntimeError::Unsupported { backend: self.describe(), mechanism: "peer stores", rule: format!(
            "{}: this backend has no peer stores (MEMRA_OPROJ_DIRECT / MEMRA_MOE_DIRECT need a kernel that writes into another rank's memory)",
            self.describe()
        ) })
    }

    /// BULK_P2P: move every block of `p` from `src_rank` to `dst_rank` in ONE copy over
    /// `transport`, ordered like [`Backend::copy`]. A backend that carries it out counts
    /// `bulk_p2p.packed_copies` in [`Backend::engagement`] for each packed copy of at least 2
    /// blocks. The default refuses (never one copy per block in disguise).
    fn copy_packed(&mut self, transport: Transport, src_rank: usize, dst_rank: usize, p: Packed) -> Result<()> {
        let _ = (transport, src_rank, dst_rank, p);
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "packed copies",
            rule: format!(
                "{}: this backend has no packed copies (MEMRA_STEP_TP_BULK_P2P needs the CUDA backend over native-p2p)",
                self.describe()
            ),
        })
    }

    /// Bytes moved per second (read + written) by a device-to-device copy of `bytes` on rank 0,
    /// median of timed repetitions; `None` where the backend has no device memory to measure.
    fn copy_bandwidth(&mut self, bytes: usize) -> Result<Option<f64>> {
        let _ = bytes;
        Ok(None)
    }

    /// GRAPH: open a shape-stable segment named `key`: the launches, copies, digests and marks
    /// issued until [`Backend::segment_end`] form one unit that a backend with graphs records on
    /// its first pass, captures on the second and replays on every later one — the caller issues
    /// the same calls every time (the backend checks that and fails on any difference). Host reads
    /// and writes are refused inside a segment. The default refuses: a backend without graphs
    /// never runs the door as the eager path.
    fn segment_begin(&mut self, key: u64) -> Result<()> {
        let _ = key;
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "graph capture",
            rule: format!(
                "{}: this backend cannot capture graphs (MEMRA_STEP_TP_GRAPH needs the CUDA backend)",
                self.describe()
            ),
        })
    }

    /// GRAPH: close the open segment (on a replay pass this launches the captured graph).
    fn segment_end(&mut self) -> Result<()> {
        Err(crate::RuntimeError::Contract(format!("{}: no graph segment is open", self.describe())))
    }

    /// GRAPH: abandon the open segment after an error (a capture in progress is discarded).
    fn segment_abort(&mut self) {}

    /// Place a table of experts on a rank for the grouped expert ops: `entries[e]` is expert e as
    /// this rank holds it (`None`: not held), `experts` routed entries then the shared one(s).
    /// Every entry's matrices must be weights of this rank with one format and matching shapes
    /// (gate/up rows = down columns). The default refuses: the grouped ops need it.
    fn register_experts(&mut self, rank: usize, experts: usize, entries: &[Option<GroupEntry>]) -> Result<GroupId> {
        let _ = (rank, experts, entries);
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "expert groups",
            rule: format!("{}: this backend has no expert groups", self.describe()),
        })
    }

    /// Engagement counters of mechanisms the backend itself carries out (e.g. RANK0_MERGE's
    /// merged launches), added to the record after the run.
    fn engagement(&self) -> Vec<(String, u64)> {
        Vec::new()
    }

    /// The census of everything issued since the backend was opened ([`census`]): counted where
    /// the driver or the host arena is called. A backend that keeps none reports an empty census,
    /// and then no door can be witnessed on it (its runs are VOID).
    fn census(&self) -> census::Census {
        census::Census::new()
    }

    /// The coverage counters of the ops run so far ([`coverage`]); `None` where the backend does
    /// not count them (the CUDA kernels do not).
    fn coverage(&mut self) -> Result<Option<coverage::Coverage>> {
        Ok(None)
    }

    /// Where the program is (the seam whose work follows), for the first-reach places of the
    /// coverage counters. Backends that do not count coverage ignore it.
    fn note_position(&mut self, at: coverage::SeamPoint) {
        let _ = at;
    }

    /// Plant a twin defect (a CANARY of [`defect`]) in every later op it affects. The default
    /// refuses: a backend whose kernels cannot carry the defect must never run the canary as the
    /// canonical arithmetic, which would make it pass silently.
    fn plant(&mut self, d: defect::TwinDefect) -> Result<()> {
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "twin defects",
            rule: format!(
                "{}: this backend cannot plant the twin defect {} (the canary runs on the host backend)",
                self.describe(),
                d.name()
            ),
        })
    }

    /// The compiler options that decided the kernels' arithmetic (NVRTC options on CUDA,
    /// starting with the architecture); empty where the host twins run.
    fn build_options(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Every engagement counter a backend may report through [`Backend::engagement`] (mechanisms the
/// backend carries out alone). The distributed backend sums exactly these across processes.
pub const BACKEND_COUNTERS: [&str; 4] =
    ["rank0_merge.merged_launches", "graph.replays", "bulk_p2p.packed_copies", "fence_memops.doorbells"];

/// `rank` is one of a backend's `n` ranks, or a typed error naming both.
pub(crate) fn check_rank(rank: usize, n: usize) -> Result<()> {
    if rank < n {
        Ok(())
    } else {
        Err(crate::RuntimeError::Contract(format!("rank {rank} does not exist: this backend has {n} ranks")))
    }
}

/// The probe's ladder of sizes (docs/DESIGN.md §3.5): from one 4-byte word up, odd word counts
/// (3, 9, 257, 4097 words) that no power-of-two fast path covers, then 16 KiB to 64 MiB. The
/// gates add the model's real copy payloads (`program::payloads::copy_payload_bytes`).
pub const PROBE_SIZES_BYTES: [usize; 9] = [4, 12, 36, 1028, 16388, 16 << 10, 64 << 10, 1 << 20, 64 << 20];

/// Word `i` of the probe pattern for (src, dst): hashed so a shifted, truncated or stale copy
/// cannot match by accident.
pub fn probe_word(src: usize, dst: usize, i: usize) -> u32 {
    memra_kernels::twins::digest::splitmix64(((src as u64) << 56) ^ ((dst as u64) << 48) ^ i as u64) as u32
}

/// The byte-integrity probe, written once over the trait: for every ordered pair and size, fill
/// the source with the hashed pattern, poison the destination, copy over `transport`, read the
/// destination back and count every wrong word.
pub fn run_probe<B: Backend + ?Sized>(
    b: &mut B,
    transport: Transport,
    sizes_bytes: &[usize],
) -> Result<Vec<ProbeResult>> {
    const POISON: u32 = 0xDEAD_BEEF;
    let mut out = Vec::new();
    let n = b.ranks();
    for &bytes in sizes_bytes {
        let words = bytes / 4;
        let bufs: Vec<BufId> = (0..n).map(|r| b.alloc(r, words)).collect::<Result<_>>()?;
        for src in 0..n {
            for dst in (0..n).filter(|d| *d != src) {
                let pattern: Vec<f32> = (0..words).map(|i| f32::from_bits(probe_word(src, dst, i))).collect();
                b.write(src, Slice::new(bufs[src], 0, words), &pattern)?;
                b.write(dst, Slice::new(bufs[dst], 0, words), &vec![f32::from_bits(POISON); words])?;
                b.copy(transport, src, Slice::new(bufs[src], 0, words), dst, Slice::new(bufs[dst], 0, words))?;
                let got = b.read(dst, Slice::new(bufs[dst], 0, words))?;
                let bad_words = got.iter().enumerate().filter(|(i, v)| v.to_bits() != probe_word(src, dst, *i)).count();
                out.push(ProbeResult { src, dst, bytes, bad_words, no_peer_access: None });
            }
        }
    }
    Ok(out)
}

/// Which backend a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    Host,
    Cuda,
}

impl BackendKind {
    pub const ALL: [BackendKind; 2] = [BackendKind::Host, BackendKind::Cuda];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        }
    }

    /// `host` or `cuda`.
    pub fn parse(s: &str) -> Option<BackendKind> {
        BackendKind::ALL.into_iter().find(|b| b.name() == s)
    }
}

/// Open a backend of `kind` with `ranks` ranks.
pub fn open(kind: BackendKind, ranks: usize) -> Result<Box<dyn Backend + Send>> {
    open_with(kind, ranks, &OpenOptions::default())
}

/// How a backend is opened (not door values of the program: these shape the machine).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Bytes held on every CUDA device first (fault injection: a crowded device).
    pub device_reserve_bytes: usize,
    /// RANK0_MERGE: rank 0 runs on its device's default stream.
    pub rank0_merge: bool,
}

/// Open a backend with options; the host backend has no device memory or streams and ignores
/// them (RANK0_MERGE is NOT-APPLICABLE there by the registry).
pub fn open_with(kind: BackendKind, ranks: usize, o: &OpenOptions) -> Result<Box<dyn Backend + Send>> {
    match kind {
        BackendKind::Host => Ok(Box::new(host::HostBackend::new(ranks)?)),
        BackendKind::Cuda => Ok(Box::new(cuda::CudaBackend::with_options(
            ranks,
            cuda::CudaOptions {
                reserve_bytes: o.device_reserve_bytes,
                rank0_on_default_stream: o.rank0_merge,
                ..Default::default()
            },
        )?)),
    }
}

/// This process's part of a TP `tp` run spread over processes with the `nccl` transport: a
/// [`dist::DistBackend`] over a CUDA backend of the local ranks and an NCCL communicator over all
/// ranks, made from the next id of `rendezvous` (published by process 0, awaited by the others).
/// Every call runs under a watchdog that hands a [`RuntimeError::Watchdog`](crate::RuntimeError),
/// naming the call, to the binary's [`dist::watchdog::OverrunHook`] once a call takes longer than
/// the rendezvous timeout (a peer that died would otherwise hang NCCL); without an installed hook
/// the run is refused before any work.
pub fn open_distributed(tp: usize, rendezvous: &mut dist::Rendezvous, o: &OpenOptions) -> Result<Box<dyn Backend>> {
    let end_process = dist::watchdog::overrun_hook().ok_or_else(|| {
        crate::RuntimeError::Contract(
            "a run over several processes needs the binary's overrun hook (backend::dist::install_overrun_hook): \
             a distributed call that never returns can only be ended by ending the process, which is the binary's \
             decision"
                .into(),
        )
    })?;
    let spec = rendezvous.spec();
    let layout = dist::ProcessLayout::new(tp, spec).map_err(|rule| crate::RuntimeError::Placement { tp, rule })?;
    // The id is taken first, so a process whose backend fails still stays in step with the
    // others' communicator numbering.
    let (k, id) = rendezvous.next_id(cuda::nccl_unique_id)?;
    let inner = cuda::CudaBackend::with_options(
        layout.ranks_per_process(),
        cuda::CudaOptions {
            reserve_bytes: o.device_reserve_bytes,
            // Only the process holding global rank 0 has the "model stream" of RANK0_MERGE.
            rank0_on_default_stream: o.rank0_merge && spec.process == 0,
            ..Default::default()
        },
    )?;
    let watchdog = dist::Watchdog::start(
        format!("process {}", spec.label()),
        rendezvous.timeout(),
        Box::new(move |overrun| end_process(overrun)),
    );
    let mover = {
        let r = layout.local_ranks();
        let _guard = watchdog.enter(format!(
            "creating NCCL communicator {k} over TP{tp} (ncclCommInitRank) for ranks {}..{}",
            r.start,
            r.end - 1
        ));
        cuda::NcclMover::connect(&inner, layout, &id, k)?
    };
    Ok(Box::new(dist::DistBackend::new(layout, inner, mover, Some(watchdog))?))
}

/// Median bandwidth (bytes read + written per second) of a same-rank copy of `bytes` on rank 0,
/// timed with the backend's own marks over `reps` repetitions after one warm-up copy.
pub fn measure_copy_bandwidth<B: Backend + ?Sized>(b: &mut B, bytes: usize, reps: usize) -> Result<f64> {
    let n = bytes / 4;
    let (src, dst) = (Slice::new(b.alloc(0, n)?, 0, n), Slice::new(b.alloc(0, n)?, 0, n));
    b.copy(Transport::NativeP2p, 0, src, 0, dst)?;
    b.collect()?;
    for _ in 0..reps {
        b.mark()?;
        b.copy(Transport::NativeP2p, 0, src, 0, dst)?;
        b.mark()?;
    }
    let marks = b.collect()?.marks_ns.swap_remove(0);
    let mut ns: Vec<u64> = marks.chunks_exact(2).map(|m| m[1].saturating_sub(m[0])).collect();
    ns.sort_unstable();
    let median = *ns
        .get(ns.len().saturating_sub(1) / 2)
        .ok_or_else(|| crate::RuntimeError::Contract("copy bandwidth: no timed repetition (reps = 0)".into()))?;
    Ok(2.0 * (n * 4) as f64 / (median.max(1) as f64 * 1e-9))
}

/// CUDA devices visible to this process (0 without a driver).
pub fn cuda_device_count() -> usize {
    cuda::probe_cuda().map(|s| s.devices.len()).unwrap_or(0)
}

/// Whether a CUDA driver and device are usable: `Ok(description)` or `Err(reason)`. Never panics
/// on a machine without CUDA.
pub fn cuda_available() -> std::result::Result<String, String> {
    cuda::cuda_backend_available().map(|s| s.describe()).map_err(|e| e.to_string())
}
