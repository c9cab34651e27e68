//! Placement rules that depend on the model's shapes (docs/DESIGN.md §3.4), applied when a job
//! meets its subject: a door whose mechanism the model's shapes already decided has nothing to
//! change, and its run would be VOID for a reason that is not a defect. Such a job is
//! NOT-APPLICABLE with the rule, as the registry's rules make others.
//!
//! - STEP_EP at a TP size that does not divide the routed experts' down-projection K-blocks: the
//!   routed experts are expert-parallel already (the `edge` model at TP4 and TP8).
//! - BULK_P2P where no two consecutive slots are TP-sharded: each rank has at most one block per
//!   join to move, so there is nothing to pack. (NVFP4 banks always run whole on their owners:
//!   that is a registry conflict of BULK_P2P with both NVFP4 doors, not a rule here.)
//! - MOE_DIRECT with NVFP4_EP2 at TP2 where the shared expert's down projection is whole on rank 0
//!   (its K-blocks not divisible by the TP size; the `edge` model): MOE_DIRECT stores TP-sharded
//!   down partials and expert-parallel owners' slots at the root
//!   (`runtime/src/program/moe.rs`), and the interleaved NVFP4 banks are neither — each owner
//!   folds its own slots, which reach the root through the join — so the program issues the same
//!   calls with the door as without (`runtime/tests/edge.rs` checks that premise).
//! - SEL_DOWN8 where the routed experts are wider than one warp's down row (`DOWN8_MAX_COLS`,
//!   1024: the engine's `(local_in >> 5) <= 32`; the `step` preset's 1280): the runtime refuses
//!   the fused sweep there before any work (`program::check_run`), as the engine keeps its unfused path.
//! - The canary MEMRA_CANARY_DOWN8_SLOT_ORDER on a model of top_k ≤ 2 (`tiny`, `edge`): an owner
//!   sums at most two slots, two terms commute, so the reversed chain has the canonical bits.
//! - NVFP4_DEV_ROUTES on a model whose every layer clamps its SwiGLU (`small`, `step`): the
//!   device routes program exists only on unclamped layers (the engine: "Clamped layers refuse
//!   (they stay on the EP program)"), so the door would change nothing.

use crate::job::Job;
use memra_kernels::twins::gemv::{canonical_kblocks, WeightFormat};
use memra_runtime::model::ModelConfig;

/// Why `job` has no meaning on a model of `c`, or `None`.
/// Rows need sessions: a battery of one prompt puts one session in a pass whatever B is, so a
/// rows configuration would compare single-token decode with itself (docs/DESIGN.md §3.6). Such a
/// run is NOT-APPLICABLE with the reason, never a vacuous PASS (nor a FAIL of the lanes check).
pub(super) fn lanes_not_applicable(job: &Job, battery: &memra_runtime::Battery) -> Option<String> {
    (job.pass.batch > 1 && battery.prompts.len() < 2).then(|| {
        format!(
            "{}: rows are sessions decoded together, and the battery has {} prompt (one session); use --prompts 2 or more",
            job.pass.label(),
            battery.prompts.len()
        )
    })
}

pub(super) fn not_applicable(job: &Job, c: &ModelConfig) -> Option<String> {
    let down8_max = memra_kernels::twins::down8::DOWN8_MAX_COLS;
    if job.doors.sel_down8 && c.expert_width > down8_max {
        return Some(format!(
            "the model's routed experts are {} wide, and MEMRA_SEL_DOWN8 sweeps a slot's whole down row in one warp: at \
             most {down8_max} values (the engine's narrow-shard condition (local_in >> 5) <= 32), so the fused sweep \
             does not exist for this model",
            c.expert_width
        ));
    }
    if job.engagement.contains_key("canary_down8_slot_order") && c.top_k < 3 {
        return Some(format!(
            "the model routes top_k = {} slot(s), so an NVFP4_EP2 owner sums at most {} in its chain, and IEEE addition \
             of two terms from +0.0 commutes: MEMRA_CANARY_DOWN8_SLOT_ORDER's reversed slot order has the canonical \
             bits on this model (it shows only where an owner sums three slots or more)",
            c.top_k, c.top_k
        ));
    }
    if job.doors.nvfp4_dev_routes && (0..c.layers).all(|l| c.swiglu_limit_at(l).is_some()) {
        return Some(format!(
            "every one of the model's {} layers clamps its SwiGLU, and MEMRA_STEP_NVFP4_DEV_ROUTES's folded up scale \
             exists only on an unclamped layer (the engine: \"Clamped layers refuse (they stay on the EP program)\"), so \
             the door has no layer to change",
            c.layers
        ));
    }
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
    if job.doors.moe_direct && job.doors.nvfp4_ep2 && job.tp == 2 {
        let g_s = canonical_kblocks(WeightFormat::E4m3, c.shared_width).ok()?;
        if g_s % job.tp != 0 {
            return Some(format!(
                "under MEMRA_STEP_NVFP4_EP2 the routed experts are whole NVFP4 banks interleaved over 2 owners, which fold \
                 their own slots, and the model's shared expert is whole on rank 0 at TP{} (its down projection has {g_s} \
                 canonical K-block(s)), so MEMRA_MOE_DIRECT has no TP-sharded partial or expert-parallel slot to store",
                job.tp
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_runtime::DoorSet;

    /// MOE_DIRECT with NVFP4_EP2 has nothing to store on `edge` at TP2 (its shared expert is one
    /// K-block), and the rule names why; on `tiny` (a shared expert of 8 K-blocks, sharded at TP2)
    /// and without either door the job runs.
    #[test]
    fn moe_direct_under_nvfp4_ep2_needs_a_sharded_shared_expert() {
        let edge = ModelConfig::preset("edge", None).unwrap();
        let tiny = ModelConfig::preset("tiny", None).unwrap();
        let both = DoorSet { moe_direct: true, nvfp4_ep2: true, ..DoorSet::default() };
        let why = not_applicable(&crate::suite::test_job(2, both), &edge).expect("edge at TP2: nothing to store");
        assert!(why.contains("MEMRA_MOE_DIRECT") && why.contains("1 canonical K-block"), "{why}");
        assert_eq!(
            not_applicable(&crate::suite::test_job(2, both), &tiny),
            None,
            "tiny's shared expert is sharded at TP2"
        );
        for doors in
            [DoorSet { moe_direct: true, ..DoorSet::default() }, DoorSet { nvfp4_ep2: true, ..DoorSet::default() }]
        {
            assert_eq!(not_applicable(&crate::suite::test_job(2, doors), &edge), None, "{doors:?}");
        }
    }

    /// SEL_DOWN8 is NOT-APPLICABLE exactly where the experts are wider than one warp's row:
    /// `step` (1280) yes, `tiny` (1024, the bound itself) and `edge` (256) no; without the door no.
    #[test]
    fn sel_down8_needs_experts_one_warp_wide() {
        let d8 = DoorSet { sel_down8: true, nvfp4_ep2: true, ..DoorSet::default() };
        let step = ModelConfig::preset("step", Some(1)).unwrap();
        let why = not_applicable(&crate::suite::test_job(2, d8), &step).expect("step is 1280 wide");
        assert!(why.contains("MEMRA_SEL_DOWN8") && why.contains("1280") && why.contains("1024"), "{why}");
        let ep2 = DoorSet { nvfp4_ep2: true, ..DoorSet::default() };
        assert_eq!(not_applicable(&crate::suite::test_job(2, ep2), &step), None);
        for name in ["tiny", "edge"] {
            let c = ModelConfig::preset(name, None).unwrap();
            assert_eq!(not_applicable(&crate::suite::test_job(1, d8), &c), None, "{name}");
        }
    }

    /// NVFP4_DEV_ROUTES is NOT-APPLICABLE exactly where every layer clamps (`small`); the same
    /// shapes without a clamp, and the default models (an unclamped layer 1), run; without the
    /// door no rule applies.
    #[test]
    fn nvfp4_dev_routes_needs_an_unclamped_layer() {
        let routes = DoorSet { nvfp4_dev_routes: true, ..DoorSet::default() };
        let small = ModelConfig::preset("small", None).unwrap();
        let why = not_applicable(&crate::suite::test_job(2, routes), &small).expect("small clamps every layer");
        assert!(why.contains("MEMRA_STEP_NVFP4_DEV_ROUTES") && why.contains("4 layers"), "{why}");
        assert_eq!(not_applicable(&crate::suite::test_job(2, DoorSet::default()), &small), None);
        let open = ModelConfig { swiglu_limit: None, ..small };
        assert_eq!(not_applicable(&crate::suite::test_job(2, routes), &open), None, "no clamp anywhere");
        for name in ["tiny", "edge"] {
            let c = ModelConfig::preset(name, None).unwrap();
            assert_eq!(not_applicable(&crate::suite::test_job(1, routes), &c), None, "{name}");
        }
    }

    /// Every configuration of the CUDA `--matrix all` plan with BULK_P2P that these rules let run
    /// on a default model has blocks to pack: the runtime's own placement shards its routed
    /// experts, so k ≥ 2 consecutive slots share one G. A door set that places them whole (NVFP4
    /// banks, STEP_EP) must be a registry conflict or a rule here — on 2026-12-04 a shard of the
    /// night found BULK_P2P with NVFP4_DEV_ROUTES VOID in every such run.
    #[test]
    fn bulk_p2p_has_blocks_to_pack_wherever_the_plan_runs_it() {
        use crate::matrix::{enumerate, MatrixKind};
        use crate::registry::{BackendKind, Registry};
        use memra_runtime::program::placement::{ExpertMode, Placement};
        use memra_runtime::Transport;
        let reg = Registry::builtin().unwrap();
        let plan =
            enumerate(&reg, &MatrixKind::All, &[1, 2, 4, 8], &[Transport::NativeP2p], &[BackendKind::Cuda]).unwrap();
        let bulk: Vec<_> = plan.legal.iter().filter(|c| c.doors.contains("bulk_p2p")).collect();
        assert!(bulk.len() > 100, "the plan runs BULK_P2P in {} configurations", bulk.len());
        for name in ["tiny", "edge"] {
            let c = ModelConfig::preset(name, None).unwrap();
            let model = memra_runtime::model::gen::generate(&c, 1).unwrap();
            let (mut ran, mut skipped) = (0, 0);
            for cfg in &bulk {
                let doors = cfg.door_set(&reg, None).unwrap();
                if not_applicable(&crate::suite::test_job(cfg.tp, doors), &c).is_some() {
                    skipped += 1;
                    continue;
                }
                let tp = memra_runtime::config::check_tp(cfg.tp).unwrap();
                let p = Placement::new(&model, tp, &doors, doors.nvfp4_banks()).unwrap();
                assert_eq!(p.experts, ExpertMode::TensorParallel, "{name} {}: nothing to pack", cfg.label());
                assert!(c.top_k >= 2, "{name}: one routed slot packs nothing");
                ran += 1;
            }
            assert!(ran > 0, "{name}: every BULK_P2P configuration was NOT-APPLICABLE ({skipped})");
        }
    }

    /// The slot-order canary is NOT-APPLICABLE exactly where an owner sums at most two slots
    /// (`edge`, `tiny`: top_k 2); with top_k 4 (`small`, or `edge` widened) it runs, and so does
    /// SEL_DOWN8 without it on `edge`.
    #[test]
    fn down8_slot_order_canary_needs_three_slots_per_owner() {
        let d8 = DoorSet { sel_down8: true, nvfp4_ep2: true, ..DoorSet::default() };
        let mut job = crate::suite::test_job(2, d8);
        job.engagement.insert("canary_down8_slot_order".into(), "canary_down8_slot_order.reversed_sums".into());
        let edge = ModelConfig::preset("edge", None).unwrap();
        let why = not_applicable(&job, &edge).expect("edge routes 2 slots");
        assert!(why.contains("MEMRA_CANARY_DOWN8_SLOT_ORDER") && why.contains("top_k = 2"), "{why}");
        assert!(not_applicable(&job, &ModelConfig::preset("tiny", None).unwrap()).is_some());
        assert_eq!(not_applicable(&job, &ModelConfig { top_k: 4, ..edge.clone() }), None);
        assert_eq!(not_applicable(&job, &ModelConfig::preset("small", None).unwrap()), None);
        assert_eq!(not_applicable(&crate::suite::test_job(2, d8), &edge), None, "SEL_DOWN8 alone runs on edge");
    }
}
