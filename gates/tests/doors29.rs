//! The engagement gates of issue 29's doors, with the registry's own census declarations: each
//! door is witnessed (PASS) where its mechanism runs and VOID where the flag is set but the
//! mechanism is disabled.

use memra_gating::gate;
use std::collections::BTreeMap;

/// SEL_MIRROR on real host runs: witnessed at TP2 and TP4, where each peer's ids copy becomes a
/// mirror launch; VOID at TP1 — the flag set, but the only rank is the root, so no mirror runs
/// and the census is the door-off one (why the registry leaves TP1 out).
#[test]
fn sel_mirror_is_witnessed_with_peers_and_void_without() {
    use memra_runtime::backend::host::HostBackend;
    use memra_runtime::model::{gen::generate, ModelConfig};
    use memra_runtime::{program, Battery, RunConfig, Transport};
    let d = crate::registry_decl("sel_mirror");
    let m = generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap();
    let census = |tp: usize, on: bool| {
        let mut cfg = RunConfig::new(tp, Transport::NativeP2p, Battery::default_for(m.config.vocab, 2)).unwrap();
        cfg.doors.sel_mirror = on;
        program::run(&m, &cfg, &mut HostBackend::new(tp).unwrap()).unwrap().census
    };
    for tp in [1, 2, 4] {
        let (on, off) = (census(tp, true), census(tp, false));
        let o = gate::engagement(on.counts(), &[(&d, Ok(off.counts().clone()))]);
        assert_eq!(o.passed(), tp > 1, "TP{tp}: {}", o.detail());
        if tp == 1 {
            assert_eq!(on, off, "TP1: the flag alone changes no call");
            assert!(o.detail().contains("sel_mirror"), "{}", o.detail());
        }
    }
}

/// FENCE_RANK1 is CUDA-only (its device runs are `runtime/tests/gpu/cuda_direct.rs`); the census
/// its backend counts per MOE_DIRECT store is one host-memory doorbell and one kernel doorbell,
/// against FENCE_MEMOPS's two doorbells. Witnessed only then: a backend that rang FENCE_MEMOPS's
/// doorbell for the second fence too (the flag set, the mechanism disabled), or fell back to
/// events (nothing counted), is VOID.
#[test]
fn fence_rank1_is_witnessed_only_by_kernel_doorbells() {
    let d = crate::registry_decl("fence_rank1");
    let stores = 24u64;
    let census = |doorbells: u64, kernel: u64| {
        let mut c: BTreeMap<String, u64> = BTreeMap::new();
        c.insert("peer_store.expert_down.f32".into(), stores);
        for (k, v) in [("doorbell", doorbells), ("kernel_doorbell", kernel)] {
            if v > 0 {
                c.insert(k.into(), v);
            }
        }
        c
    };
    let off = census(2 * stores, 0);
    let engaged = gate::engagement(&census(stores, stores), &[(&d, Ok(off.clone()))]);
    assert!(engaged.passed(), "{}", engaged.detail());
    for (what, on) in [("FENCE_MEMOPS's doorbells", census(2 * stores, 0)), ("events", census(0, 0))] {
        let o = gate::engagement(&on, &[(&d, Ok(off.clone()))]);
        assert!(!o.passed(), "{what}: {}", o.detail());
        assert!(o.detail().contains("fence_rank1") && o.detail().contains("kernel_doorbell"), "{}", o.detail());
    }
}
