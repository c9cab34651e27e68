//! Direct joins (OPROJ_DIRECT, MOE_DIRECT, with OPROJ_TAIL) on the host backend: bit-identical
//! to the TP1 oracle at TP2/4/8, their counters equal to the peer stores the shapes imply, the
//! stores really issued (a recording backend sees every one, and no peer→root copy into the
//! buffers they fill), and a negative control: one peer store planted at the wrong offset is
//! caught by the identity comparison at the seam where it lands.
//!
//! Also: the host refuses what it must not imitate (FENCE_MEMOPS doorbells, BULK_P2P packed
//! copies) instead of running the default path under a door's name.

use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::intercept::{Hooks, Intercepted};
use memra_runtime::backend::{capability, Backend, BufId, JoinFence, Op, PeerStores, Slice, Transfer};
use memra_runtime::config::Tp;
use memra_runtime::evidence::record::{CaptureKey, Record, Seam};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::program::placement::{ExpertMode, Placement};
use memra_runtime::{program, Battery, DoorSet, RunConfig, Transport};
use std::collections::BTreeSet;
use std::sync::OnceLock;

fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap())
}

fn battery() -> Battery {
    Battery { prompts: vec![vec![3, 141, 59], vec![26, 535]], gen_tokens: 3 }
}

fn oracle() -> &'static Record {
    static ORACLE: OnceLock<Record> = OnceLock::new();
    ORACLE.get_or_init(|| {
        let cfg = RunConfig::new(1, Transport::HostBounce, battery()).unwrap();
        program::run(tiny(), &cfg, &mut HostBackend::new(1).unwrap()).unwrap()
    })
}

/// Decode steps of the battery (every step runs every layer once).
fn steps(b: &Battery) -> u64 {
    (0..b.prompts.len()).map(|p| b.steps_of(p) as u64).sum()
}

/// What a host backend is asked for: every cross-rank copy and peer store; and it can misplace
/// one peer store (the negative control's planted defect, reachable only from this test).
#[derive(Default)]
struct Recording {
    /// (src rank, dst rank, dst slice) of every copy.
    copies: Vec<(usize, usize, Slice)>,
    /// (rank, out rank, target slice) of every peer store, as the program asked for it.
    stores: Vec<(usize, usize, Slice)>,
    /// Shift the target of peer store number `.0` by `.1` elements (wrapping inside its buffer).
    misplace: Option<(usize, isize)>,
}

impl Recording {
    fn backend(tp: usize) -> Intercepted<HostBackend, Recording> {
        Intercepted::new(HostBackend::new(tp).unwrap(), Recording::default())
    }

    fn peer_to_root_copies(&self) -> impl Iterator<Item = &(usize, usize, Slice)> {
        self.copies.iter().filter(|(s, d, _)| *s != 0 && *d == 0)
    }
}

impl Hooks<HostBackend> for Recording {
    fn copy(&mut self, inner: &mut HostBackend, c: Transfer) -> memra_runtime::Result<()> {
        self.copies.push((c.from.0, c.to.0, c.to.1));
        inner.copy(c)
    }
    fn launch_peer_store(
        &mut self,
        inner: &mut HostBackend,
        rank: usize,
        op: Op,
        out_rank: usize,
        fence: JoinFence,
    ) -> memra_runtime::Result<()> {
        let target = op.store_target().expect("the program only peer-stores ops with a store target");
        let n = self.stores.len();
        self.stores.push((rank, out_rank, target));
        let op = match self.misplace {
            Some((at, by)) if at == n => {
                let moved = target.offset.checked_add_signed(by).expect("misplaced offset stays >= 0");
                op.with_store_target(Slice::new(target.buf, moved, target.len))
            }
            _ => op,
        };
        capability::peer_stores(inner)?.launch_peer_store(rank, op, out_rank, fence)
    }
}

fn run_recorded(tp: usize, doors: DoorSet, capture: Vec<CaptureKey>) -> (Record, Recording) {
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery()).unwrap();
    cfg.doors = doors;
    cfg.capture = capture;
    let mut b = Recording::backend(tp);
    let r = program::run(tiny(), &cfg, &mut b).unwrap_or_else(|e| panic!("TP{tp} {doors:?}: {e}"));
    (r, b.hooks)
}

fn assert_identical(got: &Record, what: &str) {
    let o = oracle();
    assert_eq!(got.digests.len(), o.digests.len(), "{what}: prompt count");
    assert_eq!(o.first_digest_difference(got), None, "{what}: differs from the TP1 oracle");
    assert_eq!(got.tokens, o.tokens, "{what}: token tapes differ");
}

fn counter(r: &Record, name: &str) -> u64 {
    r.engaged.get(name).copied().unwrap_or(0)
}

/// Peer stores each door must make per decode step on a TP-sharded placement, from the shapes:
/// OPROJ_DIRECT one per peer per layer; MOE_DIRECT one per peer per layer per sharded slot.
fn expected_tp_sharded(tp: usize, doors: &DoorSet) -> (u64, u64) {
    let m = tiny();
    let p = Placement::new(m, Tp::new(tp).unwrap(), doors, false).unwrap();
    assert_eq!(p.experts, ExpertMode::TensorParallel, "tiny at TP{tp} shards its routed experts");
    let layers = m.layers.len() as u64;
    let peers = (tp - 1) as u64;
    let sharded_slots = m.config.top_k as u64 + u64::from(p.shared_sharded);
    let per_step = (layers * peers, layers * peers * sharded_slots);
    let n = steps(&battery());
    (per_step.0 * n, per_step.1 * n)
}

#[test]
fn direct_joins_equal_tp1_and_count_exactly_the_peer_stores_of_the_shapes() {
    let sets = [
        ("oproj_direct", DoorSet { oproj_direct: true, ..DoorSet::default() }),
        ("oproj_direct+oproj_tail", DoorSet { oproj_direct: true, oproj_tail: true, ..DoorSet::default() }),
        ("moe_direct", DoorSet { moe_direct: true, ..DoorSet::default() }),
        (
            "oproj_direct+oproj_tail+moe_direct",
            DoorSet { oproj_direct: true, oproj_tail: true, moe_direct: true, ..DoorSet::default() },
        ),
    ];
    for tp in [2, 4, 8] {
        for (name, doors) in sets {
            let what = format!("TP{tp} {name}");
            let (r, b) = run_recorded(tp, doors, Vec::new());
            assert_identical(&r, &what);
            let (want_o, want_moe) = expected_tp_sharded(tp, &doors);
            let want_o = if doors.oproj_direct { want_o } else { 0 };
            let want_moe = if doors.moe_direct { want_moe } else { 0 };
            assert_eq!(counter(&r, "oproj_direct.peer_stores"), want_o, "{what}: oproj_direct.peer_stores");
            assert_eq!(counter(&r, "moe_direct.peer_stores"), want_moe, "{what}: moe_direct.peer_stores");
            if doors.oproj_tail {
                assert_eq!(counter(&r, "oproj_tail.fused_joins"), steps(&battery()) * tiny().layers.len() as u64);
            }
            // Every counted store was issued to the backend, from a peer, into the root.
            assert_eq!(b.stores.len() as u64, want_o + want_moe, "{what}: peer stores the backend saw");
            assert!(b.stores.iter().all(|(r, o, _)| *r != 0 && *o == 0), "{what}: a store not peer → root");
            // No peer → root copy into a buffer the peer stores fill.
            let filled: BTreeSet<BufId> = b.stores.iter().map(|s| s.2.buf).collect();
            let bad: Vec<_> = b.peer_to_root_copies().filter(|c| filled.contains(&c.2.buf)).collect();
            assert!(bad.is_empty(), "{what}: peer → root copies into directly stored buffers: {bad:?}");
            if doors.oproj_direct && doors.moe_direct {
                let n = b.peer_to_root_copies().count();
                assert_eq!(n, 0, "{what}: both joins direct, yet {n} peer → root copies were issued");
            }
        }
    }
}

/// Expert-parallel placement (STEP_EP): whole-expert owners store their folded slot outputs into
/// the root's y slots. The expected count comes from the run's own routing (captured router
/// output → owners via the placement): one store per routed slot whose owner is not the root,
/// plus one per peer for the TP-sharded shared expert.
#[test]
fn moe_direct_on_expert_parallel_owners_stores_each_off_root_slot() {
    let m = tiny();
    let b = battery();
    let mut keys = Vec::new();
    for (p, _) in b.prompts.iter().enumerate() {
        for step in 0..b.steps_of(p) {
            for layer in 0..m.layers.len() {
                keys.push(CaptureKey { prompt: p, step, layer, seam: Seam::Router });
            }
        }
    }
    for tp in [2, 4, 8] {
        let doors = DoorSet { step_ep: true, moe_direct: true, oproj_direct: true, ..DoorSet::default() };
        let what = format!("TP{tp} step_ep+moe_direct+oproj_direct");
        let (r, rec) = run_recorded(tp, doors, keys.clone());
        assert_identical(&r, &what);
        let p = Placement::new(m, Tp::new(tp).unwrap(), &doors, false).unwrap();
        assert_eq!(p.experts, ExpertMode::ExpertParallel);
        let mut want = 0u64;
        for cap in r.captures.values() {
            let ids = &cap.bits[..m.config.top_k];
            want += ids.iter().filter(|e| p.expert_owner(**e as usize, m.config.experts) != 0).count() as u64;
            if p.shared_sharded {
                want += (tp - 1) as u64;
            }
        }
        assert_eq!(r.captures.len(), keys.len(), "{what}: every router output captured");
        assert!(want > 0, "{what}: the battery never routed to an off-root owner; the test would prove nothing");
        assert_eq!(counter(&r, "moe_direct.peer_stores"), want, "{what}: moe_direct.peer_stores");
        let n = rec.peer_to_root_copies().count();
        assert_eq!(n, 0, "{what}: {n} peer → root copies although every join is direct");
    }
}

/// Negative control: the first peer store lands one block too low (on the root's own o_proj
/// partials instead of its own place). The identity comparison must see it at the first step's
/// layer-0 o_proj seam — proving the checks above could fail.
#[test]
fn a_misplaced_peer_store_is_caught_at_the_seam_it_lands_in() {
    let tp = 2;
    let doors = DoorSet { oproj_direct: true, ..DoorSet::default() };
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery()).unwrap();
    cfg.doors = doors;
    let mut b = Recording::backend(tp);
    let block = (tiny().config.hidden * Placement::new(tiny(), Tp::new(tp).unwrap(), &doors, false).unwrap().o_kblocks
        / tp) as isize;
    b.hooks.misplace = Some((0, -block));
    let r = program::run(tiny(), &cfg, &mut b).unwrap();
    assert_eq!(
        b.hooks.stores[0].2.offset, block as usize,
        "store 0 is rank 1's o_proj partials at its canonical offset"
    );
    assert_eq!(
        oracle().first_digest_difference(&r),
        Some((0, 0, 0, Seam::OProj)),
        "the misplaced store must be caught at o_proj"
    );
    // The same run unplanted is identical: the difference is the misplacement, nothing else.
    let mut clean = Recording::backend(tp);
    let r = program::run(tiny(), &cfg, &mut clean).unwrap();
    assert_identical(&r, "TP2 oproj_direct, unplanted control");
}

#[test]
fn host_refuses_doorbells_and_packed_copies_instead_of_imitating_them() {
    let mut cfg = RunConfig::new(2, Transport::NativeP2p, battery()).unwrap();
    cfg.doors = DoorSet { moe_direct: true, fence_memops: true, ..DoorSet::default() };
    let e = program::run(tiny(), &cfg, &mut HostBackend::new(2).unwrap()).unwrap_err().to_string();
    assert!(e.contains("NOT-APPLICABLE") && e.contains("MEMRA_FENCE_MEMOPS"), "{e}");
    cfg.doors = DoorSet { bulk_p2p: true, ..DoorSet::default() };
    let e = program::run(tiny(), &cfg, &mut HostBackend::new(2).unwrap()).unwrap_err().to_string();
    assert!(e.contains("no packed copies"), "{e}");
}

#[test]
fn direct_doors_refuse_transports_without_peer_stores_and_inert_combinations() {
    let run = |transport, doors| {
        let mut cfg = RunConfig::new(2, transport, battery()).unwrap();
        cfg.doors = doors;
        program::run(tiny(), &cfg, &mut HostBackend::new(2).unwrap()).unwrap_err().to_string()
    };
    let e = run(Transport::HostBounce, DoorSet { oproj_direct: true, ..DoorSet::default() });
    assert!(e.contains("MEMRA_OPROJ_DIRECT") && e.contains("host-bounce"), "{e}");
    let e = run(Transport::HostBounce, DoorSet { moe_direct: true, ..DoorSet::default() });
    assert!(e.contains("MEMRA_MOE_DIRECT") && e.contains("native-p2p"), "{e}");
    let e = run(Transport::NativeP2p, DoorSet { fence_memops: true, ..DoorSet::default() });
    assert!(e.contains("without MEMRA_MOE_DIRECT"), "{e}");
    let e = run(Transport::NativeP2p, DoorSet { bulk_p2p: true, moe_direct: true, ..DoorSet::default() });
    assert!(e.contains("no copies left to pack"), "{e}");
}

/// A peer store is refused where it has no meaning, never turned into a launch or a copy.
#[test]
fn peer_store_contract_is_checked() {
    let mut b = HostBackend::new(2).unwrap();
    let x = Slice::new(b.alloc(1, 4).unwrap(), 0, 4);
    let out0 = Slice::new(b.alloc(0, 4).unwrap(), 0, 4);
    // Same rank: a plain launch, not a peer store.
    let same = b.launch_peer_store(1, Op::Scale { x, s: 2.0, out: x }, 1, JoinFence::Events);
    assert!(same.unwrap_err().to_string().contains("crosses ranks"));
    // In-place op: no single output to redirect.
    let inplace = b.launch_peer_store(1, Op::FlipLowBit { x }, 0, JoinFence::Events);
    assert!(inplace.unwrap_err().to_string().contains("exactly one output"));
    // Target outside the destination's buffer.
    let far = Slice::new(out0.buf, 2, 4);
    let oob = b.launch_peer_store(1, Op::Scale { x, s: 2.0, out: far }, 0, JoinFence::Events);
    assert!(oob.unwrap_err().to_string().contains("exceeds"));
    // A real one: rank 1's data scaled into rank 0, rank 1's buffer untouched.
    b.write(1, x, &[1.0, -2.0, 0.5, -0.0]).unwrap();
    b.launch_peer_store(1, Op::Scale { x, s: 2.0, out: out0 }, 0, JoinFence::Events).unwrap();
    let got: Vec<u32> = b.read(0, out0).unwrap().iter().map(|v| v.to_bits()).collect();
    let want: Vec<u32> = [2.0f32, -4.0, 1.0, -0.0].iter().map(|v| v.to_bits()).collect();
    assert_eq!(got, want);
    let src: Vec<u32> = b.read(1, x).unwrap().iter().map(|v| v.to_bits()).collect();
    let orig: Vec<u32> = [1.0f32, -2.0, 0.5, -0.0].iter().map(|v| v.to_bits()).collect();
    assert_eq!(src, orig, "the producing rank's buffers are not written by a peer store");
}
