//! The doors the runtime knows, generated from the registry (`gates/doors.toml`) by
//! `runtime/build.rs`: [`Door`] (every door with its id, environment name and rules), [`DoorSet`]
//! (one run's explicit door values, a field per door) and [`CANARY_IDS`]. Beside them the
//! [`Canary`]s, the planted defects, each mapped once onto its registry id.
//!
//! Adding a door to the registry adds it here at the next build; the program reads its field
//! (`cfg.doors.<id>`), and the engagement gate holds the door to the census change the registry
//! declares.

use crate::evidence::defect::TwinDefect;
use crate::evidence::record::Seam;

include!(concat!(env!("OUT_DIR"), "/doors.rs"));

/// A planted defect (CANARY class): its gate must FAIL (or, for a silent fallback, the run must
/// be VOID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Canary {
    /// Flip the lowest mantissa bit of element `element` (a global index of the seam's logical
    /// tensor) of a seam's tensor at one layer and step.
    FlipBit { layer: usize, seam: Seam, step: usize, element: usize },
    /// Row-parallel K-block partials folded in reverse order (only at TP > 1).
    ReverseKBlocks,
    /// The o_join reads the previous step's partials (a stale buffer) at every step after the first.
    StaleBuffer,
    /// A join reads a peer's buffer without waiting for its producer (device only).
    SkipFence,
    /// The router breaks exact key ties towards the higher expert id (a twin defect; host only).
    TieBreak,
    /// GEMV sums and folds start from −0.0 instead of +0.0 (a twin defect; host only).
    SignedZero,
    /// The SwiGLU leaves its silu side unclamped (a twin defect; host only).
    Clamp,
    /// OPROJ_DIRECT falls back to copies while its call site still counts peer stores: the
    /// engagement gate must find no peer store in the census (the run is VOID).
    SilentFallback,
    /// The attn_norm broadcast corrupts the copy to the last rank (one bit of element 0, layer
    /// 0, step 0): the copy check must name that copy.
    BrokenBroadcast,
    /// Rows: a GEMM whose K order depends on the batch — the o_join folds its K-block partials
    /// in reverse whenever a pass holds more than one row (batch invariance must fail).
    BatchKSplit,
    /// Columns: a verify walk whose partition count depends on T — attention partitions of
    /// `ATTN_PARTITION >> T` positions in a pass of T > 1 columns (verify = decode must fail).
    VerifyPartitions,
    /// Rows: one row attends to its neighbour's session — at layer 0, the second prompt's first
    /// step reads the KV cache of the row before it.
    NeighbourSession,
    /// SEL_DOWN8's fused sweep sums each owner's slots in reverse slot order (the partials as
    /// before): the moe_join's owner sum must differ where an owner sums three slots or more.
    Down8SlotOrder,
}

impl DoorSet {
    /// Whether the doors put the routed experts in NVFP4 banks (NVFP4_EP2's interleaved owners,
    /// NVFP4_DEV_ROUTES's device routes program): the expert storage is part of those doors.
    pub fn nvfp4_banks(&self) -> bool {
        self.nvfp4_ep2 || self.nvfp4_dev_routes
    }
}

impl Canary {
    /// The twin defect this canary plants in the backend, if it is one.
    pub fn twin_defect(&self) -> Option<TwinDefect> {
        match self {
            Canary::TieBreak => Some(TwinDefect::RouterTiesToHigherId),
            Canary::SignedZero => Some(TwinDefect::SumsFromNegativeZero),
            Canary::Clamp => Some(TwinDefect::SiluUnclamped),
            _ => None,
        }
    }
}

impl Canary {
    /// The canary's registry id (one of [`CANARY_IDS`]).
    pub fn id(&self) -> &'static str {
        match self {
            Canary::FlipBit { .. } => "canary_flip_bit",
            Canary::ReverseKBlocks => "canary_reverse_kblocks",
            Canary::StaleBuffer => "canary_stale_buffer",
            Canary::SkipFence => "canary_skip_fence",
            Canary::TieBreak => "canary_tie_break",
            Canary::SignedZero => "canary_signed_zero",
            Canary::Clamp => "canary_clamp",
            Canary::SilentFallback => "canary_silent_fallback",
            Canary::BrokenBroadcast => "canary_broken_broadcast",
            Canary::BatchKSplit => "canary_batch_ksplit",
            Canary::VerifyPartitions => "canary_verify_partitions",
            Canary::NeighbourSession => "canary_neighbour_session",
            Canary::Down8SlotOrder => "canary_down8_slot_order",
        }
    }

    /// Every canary without a place (the flip-bit one at layer 0, attn_norm, step 0, element 0).
    pub fn all() -> [Canary; 13] {
        [
            Canary::FlipBit { layer: 0, seam: Seam::AttnNorm, step: 0, element: 0 },
            Canary::ReverseKBlocks,
            Canary::StaleBuffer,
            Canary::SkipFence,
            Canary::TieBreak,
            Canary::SignedZero,
            Canary::Clamp,
            Canary::SilentFallback,
            Canary::BrokenBroadcast,
            Canary::BatchKSplit,
            Canary::VerifyPartitions,
            Canary::NeighbourSession,
            Canary::Down8SlotOrder,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_canary_is_a_registry_canary_and_back() {
        let ids: Vec<&str> = Canary::all().iter().map(|c| c.id()).collect();
        assert_eq!(ids, CANARY_IDS, "the runtime's canaries and the registry's CANARY doors differ");
    }

    #[test]
    fn door_fields_and_ids_agree() {
        for door in Door::ALL {
            let mut d = DoorSet::default();
            d.set(door, true);
            assert!(d.get(door), "{}", door.id());
            assert_eq!(Door::ALL.iter().filter(|&&o| d.get(o)).count(), 1, "{} sets another field", door.id());
            assert!(door.env().starts_with("MEMRA_"), "{}", door.env());
        }
    }

    #[test]
    fn conflicts_hold_both_ways() {
        for a in Door::ALL {
            for &(b, _) in a.conflicts() {
                assert!(
                    b.conflicts().iter().any(|&(x, _)| x == a),
                    "{} conflicts with {} one way only",
                    a.id(),
                    b.id()
                );
            }
        }
    }
}
