//! Issue 29's doors on the host backend.
//!
//! SEL_MIRROR: on `edge` — whose battery reaches exact router ties inside the top-k and at its
//! boundary — every TP size keeps every bit and the coverage of TP1 (the tie steps included), each
//! peer's per-layer ids copy becomes exactly one mirror launch, every mirror is checked like the
//! copy it replaces, and under NVFP4_EP2 the owner's weights ride in the same mirror (its weights
//! copy and rank 0's local one vanish). Negative control: a mirror that swaps the selection's two
//! slots is named by the copy check at the router seam, and the run diverges. Under the graph
//! door the pair is refused by the registry's conflict rule before any work, never a crash.
//!
//! FENCE_RANK1 (CUDA-only; the device side is `gpu/cuda_direct.rs`): the program asks for the
//! kernel doorbell at every MOE_DIRECT peer store exactly when both fence doors are on (seen by a
//! recording backend that hands the host events), the host refuses the kernel doorbell rather than
//! run events under its name, and the door without FENCE_MEMOPS is refused by its `requires` rule.

use crate::edge_fixture::{battery, edge};
use crate::segments::SegmentChecker;
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{capability, Backend, JoinFence, Op, Slice};
use memra_runtime::evidence::coverage;
use memra_runtime::evidence::record::{CopyFault, Record, Seam};
use memra_runtime::{program, DoorSet, RunConfig, RuntimeError, Transport};
use std::sync::OnceLock;

fn config(tp: usize, doors: DoorSet) -> RunConfig {
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery()).unwrap();
    cfg.doors = doors;
    cfg
}

fn run<B: Backend>(tp: usize, doors: DoorSet, b: &mut B) -> Result<Record, RuntimeError> {
    program::run(edge(), &config(tp, doors), b)
}

fn host_run(tp: usize, doors: DoorSet) -> Record {
    run(tp, doors, &mut HostBackend::new(tp).unwrap()).unwrap_or_else(|e| panic!("TP{tp} {doors:?}: {e}"))
}

fn oracle() -> &'static Record {
    static ORACLE: OnceLock<Record> = OnceLock::new();
    ORACLE.get_or_init(|| {
        let cfg = RunConfig::new(1, Transport::HostBounce, battery()).unwrap();
        program::run(edge(), &cfg, &mut HostBackend::new(1).unwrap()).unwrap()
    })
}

fn census(r: &Record, key: &str) -> u64 {
    r.census.get(key).copied().unwrap_or(0)
}

fn steps() -> u64 {
    let b = battery();
    (0..b.prompts.len()).map(|p| b.steps_of(p) as u64).sum()
}

fn mirror() -> DoorSet {
    DoorSet { sel_mirror: true, ..DoorSet::default() }
}

#[test]
fn sel_mirror_keeps_every_bit_through_router_ties_with_one_mirror_per_peer_and_layer() {
    let o = oracle();
    let cov = o.coverage.as_ref().unwrap();
    assert!(cov[coverage::TIE_IN_TOPK].count > 0 && cov[coverage::TIE_AT_BOUNDARY].count > 0, "edge reaches ties");
    let ids_bytes = format!("copy.native-p2p.{}", 4 * edge().config.top_k);
    let layers = edge().config.layers as u64;
    for tp in [2, 4, 8] {
        let off = host_run(tp, DoorSet::default());
        let on = host_run(tp, mirror());
        assert_eq!(o.first_digest_difference(&on), None, "TP{tp}: SEL_MIRROR changed a bit");
        assert_eq!(on.tokens, o.tokens, "TP{tp}");
        assert_eq!(on.coverage, o.coverage, "TP{tp}: the same paths (ties included) as TP1");
        assert_eq!(on.copy_faults, vec![], "TP{tp}");
        // One mirror per peer, layer and step, each replacing the ids copy and checked like it.
        let mirrors = census(&on, "peer_store.mirror_sel");
        assert_eq!(mirrors, (tp as u64 - 1) * layers * steps(), "TP{tp}: mirror launches");
        assert_eq!(census(&off, &ids_bytes) - census(&on, &ids_bytes), mirrors, "TP{tp}: ids copies replaced");
        assert_eq!(on.copies_verified, off.copies_verified, "TP{tp}: every mirror is checked like its copy");
        assert_eq!(on.engaged.get("sel_mirror.mirror_launches"), Some(&mirrors), "TP{tp}");
    }
    // Whole experts on owners (the owner rule reads the mirrored ids) and direct stores from them.
    let ep = DoorSet { step_ep: true, moe_direct: true, ..mirror() };
    let r = host_run(4, ep);
    assert_eq!(o.first_digest_difference(&r), None, "TP4 step_ep+moe_direct+sel_mirror");
    assert!(census(&r, "peer_store.mirror_sel") > 0 && census(&r, "peer_store.fold_slots") > 0);
}

/// NVFP4_EP2's owner sum reads the route weights: with the door the owner on rank 1 gets ids and
/// weights in one mirror (2k words), and rank 0 reads the root's selection itself, so both the
/// weights copy to rank 1 and rank 0's local one vanish; the bits equal the door-off EP2 run's.
#[test]
fn sel_mirror_under_nvfp4_ep2_mirrors_ids_and_weights_at_once() {
    let k = edge().config.top_k;
    let ep2 = DoorSet { nvfp4_ep2: true, ..DoorSet::default() };
    let off = host_run(2, ep2);
    let on = host_run(2, DoorSet { sel_mirror: true, ..ep2 });
    assert_eq!(off.first_digest_difference(&on), None);
    assert_eq!(on.tokens, off.tokens);
    let per_step = edge().config.layers as u64 * steps();
    assert_eq!(census(&on, "peer_store.mirror_sel"), per_step, "one mirror per layer and step");
    let (ids, local) = (format!("copy.native-p2p.{}", 4 * k), format!("copy.local.{}", 4 * k));
    // Off: ids and weights to rank 1 (two copies of k words), weights to rank 0 (local).
    assert_eq!(census(&off, &ids) - census(&on, &ids), 2 * per_step, "rank 1's two copies");
    assert_eq!(census(&off, &local) - census(&on, &local), per_step, "rank 0's local weights copy");
    assert_eq!(on.copy_faults, vec![]);
}

/// Negative control: a mirror that swaps the selection's two slots (both ids are real experts,
/// so nothing downstream refuses them) is named by the copy check at the first router seam, and
/// the run diverges from the oracle.
#[test]
fn a_mirror_that_reorders_the_selection_is_named_at_the_router() {
    for swap in [false, true] {
        let mut b = SegmentChecker::new(HostBackend::new(2).unwrap());
        b.swap_mirrored_slots = swap;
        let r = run(2, mirror(), &mut b).unwrap();
        if !swap {
            assert_eq!(
                (r.copy_faults.len(), oracle().first_digest_difference(&r)),
                (0, None),
                "the checker alone changes nothing"
            );
            continue;
        }
        let want = CopyFault { prompt: 0, step: 0, layer: 0, seam: Seam::Router, src_rank: 0, dst_rank: 1 };
        assert_eq!(r.copy_faults.first(), Some(&want), "{:?}", r.copy_faults);
        let d = oracle().first_digest_difference(&r).expect("a reordered selection changes the peer's expert work");
        assert_eq!((d.0, d.1, d.2), (0, 0, 0), "diverges at the first layer of the first step: {d:?}");
    }
}

/// The registry's conflict refuses SEL_MIRROR under the graph door before any work (a typed
/// error naming both doors and the engine's rule), on any backend; alone it runs.
#[test]
fn sel_mirror_under_the_graph_door_is_refused_by_the_registry_rule() {
    let both = DoorSet { graph: true, ..mirror() };
    for cfg in [config(2, both), config(4, both)] {
        let err = cfg.check_doors().unwrap_err();
        let RuntimeError::DoorRefused { rule, .. } = &err else { panic!("{err:?}") };
        assert!(rule.contains("MEMRA_SEL_MIRROR") && rule.contains("MEMRA_STEP_TP_GRAPH"), "{rule}");
        assert!(rule.contains("refused under the graph door"), "{rule}");
        let mut b = SegmentChecker::new(HostBackend::new(cfg.tp.get()).unwrap());
        let got = program::run(edge(), &cfg, &mut b).unwrap_err();
        assert_eq!(got.to_string(), err.to_string());
        assert_eq!(b.passes, 0, "refused before any segment ran");
    }
    assert!(config(2, mirror()).check_doors().is_ok());
}

/// The program's side of FENCE_RANK1, seen on the host: every MOE_DIRECT peer store asks for the
/// kernel doorbell when both fence doors are on and for FENCE_MEMOPS's doorbells when only that
/// one is; the values are the oracle's either way.
#[test]
fn fence_rank1_asks_for_the_kernel_doorbell_at_every_moe_direct_store() {
    let memops = DoorSet { moe_direct: true, fence_memops: true, ..DoorSet::default() };
    for tp in [2, 4] {
        for (rank1, want) in [(false, JoinFence::Doorbells), (true, JoinFence::KernelDoorbell)] {
            let mut b = SegmentChecker::new(HostBackend::new(tp).unwrap());
            b.fences_as_events = true;
            let r = run(tp, DoorSet { fence_rank1: rank1, ..memops }, &mut b).unwrap();
            assert_eq!(oracle().first_digest_difference(&r), None, "TP{tp} rank1={rank1}");
            let stores = r.engaged.get("moe_direct.peer_stores").copied().unwrap_or(0);
            assert!(stores > 0, "TP{tp}: no MOE_DIRECT store");
            assert_eq!(b.fences_seen.len() as u64, stores, "TP{tp}: one fence pair per store");
            assert!(b.fences_seen.iter().all(|f| *f == want), "TP{tp} rank1={rank1}: {:?}", b.fences_seen);
        }
    }
}

/// The host has no kernel doorbell: a peer store asking for one is refused (the door is
/// NOT-APPLICABLE there, never run as events under its name), and the door without FENCE_MEMOPS
/// is refused by its `requires` rule.
#[test]
fn fence_rank1_is_refused_on_the_host_and_without_fence_memops() {
    let mut h = HostBackend::new(2).unwrap();
    let (a, b) = (h.alloc(1, 4).unwrap(), h.alloc(0, 4).unwrap());
    let op = Op::Add { a: Slice::new(a, 0, 4), b: Slice::new(a, 0, 4), out: Slice::new(b, 0, 4) };
    let err = capability::peer_stores(&mut h).unwrap().launch_peer_store(1, op, 0, JoinFence::KernelDoorbell);
    let err = err.unwrap_err();
    assert!(matches!(&err, RuntimeError::Unsupported { mechanism: "FENCE_RANK1 kernel doorbells", .. }), "{err:?}");
    let lone = DoorSet { moe_direct: true, fence_rank1: true, ..DoorSet::default() };
    let err = program::run(edge(), &config(2, lone), &mut HostBackend::new(2).unwrap()).unwrap_err();
    assert!(
        matches!(&err, RuntimeError::DoorRefused { door: "MEMRA_FENCE_RANK1", .. })
            && err.to_string().contains("without MEMRA_FENCE_MEMOPS"),
        "{err}"
    );
}
