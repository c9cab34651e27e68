//! Placement rules that depend on the model's shapes (docs/DESIGN.md §3.4), applied when a job
//! meets its subject: a door whose mechanism the model's shapes already decided has nothing to
//! change, and its run would be VOID for a reason that is not a defect. Such a job is
//! NOT-APPLICABLE with the rule, as the registry's rules make others.
//!
//! - STEP_EP at a TP size that does not divide the routed experts' down-projection K-blocks: the
//!   routed experts are expert-parallel already (the `edge` model at TP4 and TP8).
//! - BULK_P2P where no two consecutive slots are TP-sharded: each rank has at most one block per
//!   join to move, so there is nothing to pack.

use crate::job::Job;
use memra_kernels::twins::gemv::{canonical_kblocks, WeightFormat};
use memra_runtime::model::ModelConfig;

/// Why `job` has no meaning on a model of `c`, or `None`.
pub(super) fn not_applicable(job: &Job, c: &ModelConfig) -> Option<String> {
    let g_r = canonical_kblocks(WeightFormat::E4m3, c.expert_width).ok()?;
    let routed_sharded = g_r % job.tp == 0;
    if job.doors.step_ep && !routed_sharded {
        return Some(format!(
            "the model's routed experts are expert-parallel at TP{} already (their down projection has {g_r} canonical \
             K-block(s), which TP{} does not divide), so MEMRA_STEP_EP has nothing to change",
            job.tp, job.tp
        ));
    }
    if job.doors.bulk_p2p && !routed_sharded {
        return Some(format!(
            "the model's routed experts are expert-parallel at TP{} ({g_r} canonical K-block(s) of the down projection), so no \
             two consecutive slots are TP-sharded and MEMRA_STEP_TP_BULK_P2P has nothing to pack",
            job.tp
        ));
    }
    None
}
