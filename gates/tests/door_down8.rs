//! SEL_DOWN8's engagement gate on real host runs, with the registry's own census declaration:
//! witnessed (PASS) where the backend runs the fused sweep, VOID where the flag is set but the
//! backend runs the unfused ops instead — a test double that takes every `ExpertDownCombine` the
//! program issues apart into `ExpertDown` + `FoldSlots` + `CombineOwned` (the mechanism disabled).
//! That run keeps every bit (the fusion is bit-identical by construction), so only the census can
//! tell it did not engage, and it does.

use memra_gating::gate;
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::intercept::{Hooks, Intercepted};
use memra_runtime::backend::{BufId, Op, Slice};
use memra_runtime::model::{gen::generate, ModelConfig};
use memra_runtime::record::Seam;
use memra_runtime::{program, Battery, Canary, DoorSet, RunConfig, Transport};
use std::collections::HashMap;

/// The mechanism disabled: each fused op becomes the three launches it fuses, the folded slot
/// outputs in a scratch buffer per rank (allocated on first use).
#[derive(Default)]
struct Unfused {
    scratch: HashMap<usize, (BufId, usize)>,
    split: u64,
}

impl Hooks<HostBackend> for Unfused {
    fn launch(&mut self, inner: &mut HostBackend, rank: usize, op: Op) -> memra_runtime::Result<()> {
        use memra_runtime::backend::Backend;
        let Op::ExpertDownCombine { group, route, owner, act, act_pitch, parts, parts_pitch, w, out, reverse: false } =
            op
        else {
            return inner.launch(rank, op);
        };
        let (k, width) = (route.len, out.len);
        let n_parts = (parts.len - (k - 1) * parts_pitch) / width;
        let y = match self.scratch.get(&rank) {
            Some(&(buf, len)) if len >= k * width => Slice::new(buf, 0, k * width),
            _ => {
                let buf = inner.alloc(rank, k * width)?;
                self.scratch.insert(rank, (buf, k * width));
                Slice::new(buf, 0, k * width)
            }
        };
        let down = Op::ExpertDown {
            group,
            route,
            first_slot: 0,
            slots: k,
            act,
            act_pitch,
            out: parts,
            out_pitch: parts_pitch,
        };
        inner.launch(rank, down)?;
        let fold = Op::FoldSlots {
            route,
            first_slot: 0,
            slots: k,
            parts,
            parts_pitch,
            n_parts,
            owner: Some(owner),
            scales: Some(group),
            out: y,
        };
        inner.launch(rank, fold)?;
        self.split += 1;
        inner.launch(rank, Op::CombineOwned { route, owner, y, w, out })
    }
}

#[test]
fn sel_down8_is_witnessed_by_fused_sweeps_and_void_when_the_backend_unfuses_them() {
    let d = crate::registry_decl("sel_down8");
    let m = generate(&ModelConfig::preset("edge", None).unwrap(), 4).unwrap();
    let mut battery = Battery::default_for(m.config.vocab, 3);
    battery.prompts.truncate(2);
    battery.gen_tokens = 3;
    let cfg = |tp: usize, down8: bool| {
        let mut c = RunConfig::new(tp, Transport::NativeP2p, battery.clone()).unwrap();
        c.doors = DoorSet { nvfp4_ep2: true, sel_down8: down8, ..DoorSet::default() };
        c
    };
    for tp in [1, 2] {
        let off = program::run(&m, &cfg(tp, false), &mut HostBackend::new(tp).unwrap()).unwrap();
        let on = program::run(&m, &cfg(tp, true), &mut HostBackend::new(tp).unwrap()).unwrap();
        let mut b = Intercepted::new(HostBackend::new(tp).unwrap(), Unfused::default());
        let unfused = program::run(&m, &cfg(tp, true), &mut b).unwrap();
        assert!(b.hooks.split > 0, "TP{tp}: the double saw no fused op");
        assert_eq!(on.first_digest_difference(&unfused), None, "TP{tp}: the unfused ops give the fused bits");
        assert_eq!(off.first_digest_difference(&on), None, "TP{tp}");
        let baseline = || vec![(&d, Ok(off.census.counts().clone()))];
        let witnessed = gate::engagement(on.census.counts(), &baseline());
        assert!(witnessed.passed(), "TP{tp}: {}", witnessed.detail());
        let void = gate::engagement(unfused.census.counts(), &baseline());
        assert!(!void.passed(), "TP{tp}: the unfused run must not be witnessed: {}", void.detail());
        assert!(
            void.detail().contains("sel_down8") && void.detail().contains("expert_down_combine"),
            "{}",
            void.detail()
        );
        // The program still counted its requests: engagement is the backend's word, not the program's.
        assert_eq!(unfused.engaged.get("sel_down8.fused_sweeps"), on.engaged.get("sel_down8.fused_sweeps"));
    }
}

/// The canary canary_down8_slot_order on real host runs. On `edge`'s shapes generated plainly
/// with top_k = 4 (an owner sums three slots or more somewhere; `edge`'s own weights are built
/// for top_k 2) the reversed owner chain changes the bits, first at a moe_join
/// (the experts seam digests only the partials, which it leaves as they were — selftest's
/// expected place), at TP1 and TP2; it counts its engagement and its registry census is witnessed.
/// On `edge` itself (top_k = 2: an owner sums at most two terms, and they commute) it changes no
/// bit: the premise of its NOT-APPLICABLE rule (`suite/shape_rules.rs`).
#[test]
fn canary_down8_slot_order_shows_at_a_moe_join_where_an_owner_sums_three_slots() {
    let d = crate::registry_decl("canary_down8_slot_order");
    let mut wide = ModelConfig::preset("edge", None).unwrap();
    (wide.preset, wide.top_k) = ("edge-shaped".to_string(), 4);
    let models = [
        ("edge-shaped top_k 4", generate(&wide, 4).unwrap()),
        ("edge", generate(&ModelConfig::preset("edge", None).unwrap(), 4).unwrap()),
    ];
    for (name, m) in &models {
        let mut battery = Battery::default_for(m.config.vocab, 3);
        battery.prompts.truncate(2);
        battery.gen_tokens = 3;
        let cfg = |tp: usize, planted: bool| {
            let mut c = RunConfig::new(tp, Transport::HostBounce, battery.clone()).unwrap();
            c.doors = DoorSet { nvfp4_ep2: true, sel_down8: true, ..DoorSet::default() };
            c.doors.canary = planted.then_some(Canary::Down8SlotOrder);
            c
        };
        for tp in [1, 2] {
            let off = program::run(m, &cfg(tp, false), &mut HostBackend::new(tp).unwrap()).unwrap();
            let on = program::run(m, &cfg(tp, true), &mut HostBackend::new(tp).unwrap()).unwrap();
            let sums = on.engaged.get("canary_down8_slot_order.reversed_sums").copied().unwrap_or(0);
            assert_eq!(sums, on.engaged.get("sel_down8.fused_sweeps").copied().unwrap_or(0), "{name} TP{tp}");
            assert!(sums > 0, "{name} TP{tp}: the canary did not engage");
            let witnessed = gate::engagement(on.census.counts(), &[(&d, Ok(off.census.counts().clone()))]);
            assert!(witnessed.passed(), "{name} TP{tp}: {}", witnessed.detail());
            let first = off.first_digest_difference(&on);
            if m.config.top_k < 3 {
                assert_eq!(first, None, "{name} TP{tp}: two slots commute");
            } else {
                let (_, _, _, seam) =
                    first.unwrap_or_else(|| panic!("{name} TP{tp}: the reversed chain changed no bit"));
                assert_eq!(seam, Seam::MoeJoin, "{name} TP{tp}: {first:?}");
            }
        }
    }
}
