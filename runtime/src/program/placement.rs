//! Where every canonical chunk and K-block lives for a TP size (docs/DESIGN.md §3.4).
//!
//! Column-parallel matrices are cut into 8 canonical row chunks and rank r owns chunks
//! r·8/TP … (r+1)·8/TP − 1 — so whole heads for Q/K/V/gate. Row-parallel matrices are cut into
//! G canonical K-blocks and rank r owns K-blocks r·G/TP …; TP must divide G, or the matrix cannot
//! be sharded: routed experts then run expert-parallel (whole experts on owner ranks).

use crate::config::{DoorSet, Tp};
use crate::error::RuntimeError;
use crate::model::{Model, ModelConfig};
use std::ops::Range;

/// Number of canonical chunks of every column-parallel projection.
pub const CHUNKS: usize = 8;

/// How the routed experts are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertMode {
    /// Every rank owns a row chunk of gate/up and the matching K-blocks of down.
    TensorParallel,
    /// Expert e lives whole on rank e / (experts / TP) (contiguous ranges).
    ExpertParallel,
    /// NVFP4_EP2: expert e belongs to owner e % 2, which lives on rank (e % 2) % TP.
    Interleaved2,
}

/// The placement of one model at one TP size.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub tp: usize,
    pub q_heads_per_rank: usize,
    pub kv_heads_per_rank: usize,
    /// G of the o_proj (`[hidden][q_heads*128]`).
    pub o_kblocks: usize,
    /// G of an expert's down projection.
    pub down_kblocks: usize,
    /// G of the shared expert's down projection.
    pub shared_kblocks: usize,
    pub experts: ExpertMode,
    /// Whether the shared expert is TP-sharded (else it runs whole on rank 0).
    pub shared_sharded: bool,
}

impl Placement {
    /// `nvfp4`: the routed experts are NVFP4 banks (whole experts, expert-parallel).
    pub fn new(model: &Model, tp: Tp, doors: &DoorSet, nvfp4: bool) -> Result<Placement, RuntimeError> {
        let tp = tp.get();
        let c: &ModelConfig = &model.config;
        let o_kblocks = model.layers[0].wo.kblocks()?;
        // NVFP4 banks cut the routed down projection into 16-value groups, not 128-column
        // scale blocks, so their K-block count can differ from the E4M3 bank's (width 256: 8,
        // not 2); the shared expert stays E4M3.
        let down_kblocks = if nvfp4 {
            memra_kernels::twins::gemv::canonical_kblocks(
                memra_kernels::twins::gemv::WeightFormat::Nvfp4,
                model.layers[0].experts[0].down.in_features(),
            )?
        } else {
            model.layers[0].experts[0].down.kblocks()?
        };
        let shared_kblocks = model.layers[0].shared.down.kblocks()?;
        if !c.kv_heads.is_multiple_of(tp) || !c.q_heads.is_multiple_of(tp) {
            return Err(RuntimeError::Placement { tp, rule: format!(
                "attention heads (q {}, kv {}) cannot be split over TP {tp}: each rank must own whole heads of the 8 canonical chunks",
                c.q_heads, c.kv_heads
            ) });
        }
        if !o_kblocks.is_multiple_of(tp) {
            return Err(RuntimeError::Placement {
                tp,
                rule: format!(
                    "layers.*.attn.o in_features {} has {o_kblocks} canonical K-blocks, which TP {tp} does not divide",
                    c.q_heads * c.head_dim
                ),
            });
        }
        let experts = if doors.nvfp4_ep2 {
            if tp > 2 {
                return Err(RuntimeError::DoorRefused {
                    door: "MEMRA_STEP_NVFP4_EP2",
                    rule: format!(
                        "MEMRA_STEP_NVFP4_EP2 interleaves whole experts over 2 owners (TP1 or TP2), not TP {tp}"
                    ),
                });
            }
            ExpertMode::Interleaved2
        } else if nvfp4 || doors.step_ep || !down_kblocks.is_multiple_of(tp) {
            if !c.experts.is_multiple_of(tp) {
                return Err(RuntimeError::Placement {
                    tp,
                    rule: format!(
                        "{} routed experts cannot be owned whole in contiguous ranges by TP {tp} ranks",
                        c.experts
                    ),
                });
            }
            ExpertMode::ExpertParallel
        } else {
            ExpertMode::TensorParallel
        };
        Ok(Placement {
            tp,
            q_heads_per_rank: c.q_heads / tp,
            kv_heads_per_rank: c.kv_heads / tp,
            o_kblocks,
            down_kblocks,
            shared_kblocks,
            experts,
            shared_sharded: shared_kblocks.is_multiple_of(tp),
        })
    }

    /// Rows of a column-parallel matrix with `out` rows owned by `rank`.
    pub fn rows_of(&self, out: usize, rank: usize) -> Range<usize> {
        let chunk = out / CHUNKS;
        let per = CHUNKS / self.tp;
        rank * per * chunk..(rank + 1) * per * chunk
    }

    /// K-blocks of a row-parallel matrix with `g` K-blocks owned by `rank`.
    pub fn kblocks_of(&self, g: usize, rank: usize) -> Range<usize> {
        let per = g / self.tp;
        rank * per..(rank + 1) * per
    }

    /// Owner rank of routed expert `e` when experts are not tensor-parallel.
    pub fn expert_owner(&self, e: usize, n_experts: usize) -> usize {
        match self.experts {
            ExpertMode::Interleaved2 => (e % 2) % self.tp,
            _ => e / (n_experts / self.tp),
        }
    }
}
