//! The shape of a decode step as the backend sees it (issue 12): the routed experts are one
//! gate/up/SwiGLU launch and one down launch per rank for all slots, the seams of a layer are one
//! digest launch per rank, and nothing inside a step reads device memory on the host (the route
//! stays on the device) — except where MOE_DIRECT stores expert-parallel slots from their owners,
//! which must read it, and where STEP_EP runs its expert-parallel arithmetic on the host (its
//! default without MEMRA_STEP_EP_DEVICE_ARITHMETIC) — the negative controls: the counter below
//! does see reads there.

use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::intercept::{Hooks, Intercepted};
use memra_runtime::backend::{capability, Backend, Collected, DigestPart, JoinFence, Op, Slice, Transfer};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, DoorSet, RunConfig, Transport};
use std::collections::BTreeMap;

/// What the program issues to a host backend, counted between `collect`s.
#[derive(Default)]
struct Counting {
    /// Launches by op name, copies, digest batches, over the whole run.
    launches: BTreeMap<&'static str, u64>,
    copies: u64,
    digest_batches: u64,
    /// Host reads issued while a step was in flight (after its first launch, before its collect).
    reads_in_step: u64,
    in_step: bool,
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::ExpertGateUp { .. } => "expert_gate_up",
        Op::ExpertGateUpRows { .. } => "expert_gate_up_rows",
        Op::ExpertDown { .. } => "expert_down",
        Op::GemvRows { .. } => "gemv_rows",
        Op::GemvRowsBatch { .. } => "gemv_rows_batch",
        Op::SetU32 { .. } => "set_u32",
        _ => "other",
    }
}

impl Hooks<HostBackend> for Counting {
    fn read(&mut self, inner: &mut HostBackend, rank: usize, src: Slice) -> memra_runtime::Result<Vec<f32>> {
        self.reads_in_step += u64::from(self.in_step);
        inner.read(rank, src)
    }
    fn launch(&mut self, inner: &mut HostBackend, rank: usize, op: Op) -> memra_runtime::Result<()> {
        self.in_step = true;
        *self.launches.entry(op_name(&op)).or_insert(0) += 1;
        inner.launch(rank, op)
    }
    fn copy(&mut self, inner: &mut HostBackend, c: Transfer) -> memra_runtime::Result<()> {
        self.copies += 1;
        inner.copy(c)
    }
    fn digest_batch(
        &mut self,
        inner: &mut HostBackend,
        rank: usize,
        groups: &[Vec<DigestPart>],
    ) -> memra_runtime::Result<Vec<Vec<usize>>> {
        self.digest_batches += 1;
        inner.digest_batch(rank, groups)
    }
    fn collect(&mut self, inner: &mut HostBackend) -> memra_runtime::Result<Collected> {
        self.in_step = false;
        inner.collect()
    }
    fn launch_peer_store(
        &mut self,
        inner: &mut HostBackend,
        rank: usize,
        op: Op,
        out_rank: usize,
        fence: JoinFence,
    ) -> memra_runtime::Result<()> {
        self.in_step = true;
        capability::peer_stores(inner)?.launch_peer_store(rank, op, out_rank, fence)
    }
}

fn tiny() -> Model {
    generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap()
}

fn run(model: &Model, tp: usize, doors: DoorSet) -> (Counting, u64) {
    let battery = Battery { prompts: vec![vec![3, 141], vec![26]], gen_tokens: 3 };
    let steps: u64 = (0..battery.prompts.len()).map(|p| battery.steps_of(p) as u64).sum();
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery).unwrap();
    cfg.doors = doors;
    let mut b = Intercepted::new(HostBackend::new(tp).unwrap(), Counting::default());
    program::run(model, &cfg, &mut b).unwrap_or_else(|e| panic!("TP{tp} {doors:?}: {e}"));
    (b.hooks, steps)
}

#[test]
fn experts_are_one_launch_per_projection_kind_and_the_route_stays_on_the_device() {
    let model = tiny();
    let layers = model.layers.len() as u64;
    let device_ep = DoorSet { step_ep: true, ep_device_arithmetic: true, ..DoorSet::default() };
    for (tp, doors) in [(1, DoorSet::default()), (2, DoorSet::default()), (4, device_ep), (8, device_ep)] {
        let (b, steps) = run(&model, tp, doors);
        let what = format!("TP{tp} {doors:?}");
        let per_rank_layer = steps * layers * tp as u64;
        assert_eq!(b.launches["expert_gate_up"], per_rank_layer, "{what}: gate/up launches");
        assert_eq!(b.launches["expert_down"], per_rank_layer, "{what}: down launches");
        assert_eq!(b.launches["gemv_rows_batch"], per_rank_layer, "{what}: one qkv launch per rank and layer");
        // The router GEMV and the lm_head are the only single-matrix row GEMVs left.
        assert_eq!(b.launches["gemv_rows"], steps * (layers + 1), "{what}: router + lm_head");
        // One digest batch per rank and layer, plus the root's for the head.
        assert_eq!(b.digest_batches, steps * (layers * tp as u64 + 1), "{what}: digest launches");
        assert_eq!(b.reads_in_step, 0, "{what}: a host read inside a step (the route must stay on the device)");
        if tp == 1 {
            // Each layer's 4-byte length-mirror copy, and nothing else: the root's partials are
            // written in place.
            assert_eq!(b.copies, steps * layers, "TP1 copies only the length mirrors");
        }
    }
    // LEN_MIRROR_LAZY: single-token decode reads no mirror, so TP1 copies nothing at all.
    let (b, _) = run(&model, 1, DoorSet { len_mirror_lazy: true, ..DoorSet::default() });
    assert_eq!(b.copies, 0, "TP1 with LEN_MIRROR_LAZY copies nothing");
    // Negative controls: MOE_DIRECT on expert-parallel owners reads the route on the host, and the
    // counter sees it (one read per layer and step).
    let (b, steps) = run(&model, 2, DoorSet { moe_direct: true, ..device_ep });
    assert_eq!(b.reads_in_step, steps * layers, "MOE_DIRECT on expert-parallel owners reads the route once per layer");
    // STEP_EP's host arithmetic (without the door) reads inside every layer of every step, and
    // each owner's routed slots get the SwiGLU-operand launch instead of the fused one.
    let (b, steps) = run(&model, 4, DoorSet { step_ep: true, ..DoorSet::default() });
    assert!(
        b.reads_in_step >= steps * layers * 6,
        "TP4 STEP_EP: per layer the ids on 4 ranks and the combine's 2 reads"
    );
    assert_eq!(b.launches["expert_gate_up_rows"], steps * layers * 4, "TP4 STEP_EP: one per rank and layer");
}
