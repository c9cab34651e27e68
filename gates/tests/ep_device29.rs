//! The engagement gate of MEMRA_STEP_EP_DEVICE_ARITHMETIC (issue 29) on real host runs of `tiny`,
//! with the registry's own census declarations: the door is witnessed where the owners' SwiGLU and
//! the root's combine run as device launches, and VOID where the flag is set but a backend
//! carries either one out as the host program it replaces (the same bits, so only the census can
//! tell). STEP_EP without the door declares that host program through the plan (its reads and
//! writes must grow), so the engagement gate's round-trip rule does not fail STEP_EP for it.

use memra_gating::gate;
use memra_gating::matrix::Configuration;
use memra_gating::plan::job_of;
use memra_gating::registry::{BackendKind, Registry};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::intercept::{Hooks, Intercepted};
use memra_runtime::backend::{Backend, Op, Slice};
use memra_runtime::evidence::census::Census;
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, DoorSet, RunConfig, Transport};
use std::sync::OnceLock;

fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap())
}

fn census<B: Backend>(tp: usize, doors: DoorSet, b: &mut B) -> Census {
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, Battery::default_for(tiny().config.vocab, 2)).unwrap();
    cfg.doors = doors;
    program::run(tiny(), &cfg, b).unwrap().census
}

fn step_ep() -> DoorSet {
    DoorSet { step_ep: true, ..DoorSet::default() }
}

fn device() -> DoorSet {
    DoorSet { ep_device_arithmetic: true, ..step_ep() }
}

/// A backend that receives the door's device launches and carries them out as the host program
/// without the door (a silent fallback): the root's combine as read + host twin + write
/// (`combine`), or each owner's fused routed gate/up/SwiGLU as the SwiGLU-operand launch, reads,
/// the host twin's SwiGLU and writes (`swiglu`).
struct Fallback {
    combine: bool,
    swiglu: bool,
    rows: usize,
}

impl Hooks<HostBackend> for Fallback {
    fn launch(&mut self, inner: &mut HostBackend, rank: usize, op: Op) -> memra_runtime::Result<()> {
        match op {
            Op::CombineShared { y, w, out } if self.combine => {
                let (yv, wv) = (inner.read(rank, y)?, inner.read(rank, w)?);
                let mut o = vec![0.0f32; out.len];
                memra_kernels::twins::moe::combine_shared(&yv, &wv, &mut o);
                inner.write(rank, out, &o)
            }
            Op::ExpertGateUp { group, route, first_slot: 0, slots, x, limit, fold_up, act, act_pitch }
                if self.swiglu =>
            {
                let k = route.len;
                let up = Slice::new(inner.alloc(rank, k * act_pitch)?, 0, k * act_pitch);
                let gate = Slice::new(act.buf, act.offset, k * act_pitch);
                inner.launch(
                    rank,
                    Op::ExpertGateUpRows { group, route, first_slot: 0, slots: k, x, gate, up, pitch: act_pitch },
                )?;
                let shared = Slice::new(act.buf, act.offset + k * act_pitch, act_pitch);
                let op = Op::ExpertGateUp {
                    group,
                    route,
                    first_slot: k,
                    slots: slots - k,
                    x,
                    limit,
                    fold_up,
                    act: shared,
                    act_pitch,
                };
                inner.launch(rank, op)?;
                // Every routed slot (a slot this rank does not hold gets values nothing reads).
                for s in 0..k {
                    let at = |b: Slice| Slice::new(b.buf, b.offset + s * act_pitch, self.rows);
                    let (g, u) = (inner.read(rank, at(gate))?, inner.read(rank, at(up))?);
                    let a: Vec<f32> =
                        g.iter().zip(&u).map(|(&g, &u)| memra_kernels::canon::swiglu_c(g, u, limit)).collect();
                    inner.write(rank, at(gate), &a)?;
                }
                Ok(())
            }
            op => inner.launch(rank, op),
        }
    }
}

fn fallback(tp: usize, combine: bool, swiglu: bool) -> Intercepted<HostBackend, Fallback> {
    let hooks = Fallback { combine, swiglu, rows: tiny().config.expert_width };
    Intercepted::new(HostBackend::new(tp).unwrap(), hooks)
}

#[test]
fn ep_device_arithmetic_is_witnessed_by_device_launches_and_void_when_a_backend_falls_back_to_the_host() {
    let d = crate::registry_decl("ep_device_arithmetic");
    for tp in [2, 4] {
        let off = census(tp, step_ep(), &mut HostBackend::new(tp).unwrap());
        let on = census(tp, device(), &mut HostBackend::new(tp).unwrap());
        let o = gate::engagement(on.counts(), &[(&d, Ok(off.counts().clone()))]);
        assert!(o.passed(), "TP{tp}: {}", o.detail());
        for (what, combine, swiglu, names) in [
            ("the combine", true, false, "launch.combine_shared"),
            ("the SwiGLU", false, true, "launch.expert_gate_up_rows"),
            ("both", true, true, "launch.combine_shared"),
        ] {
            let mut b = fallback(tp, combine, swiglu);
            let fell_back = census(tp, device(), &mut b);
            let o = gate::engagement(fell_back.counts(), &[(&d, Ok(off.counts().clone()))]);
            assert!(!o.passed(), "TP{tp}, {what} on the host: {}", o.detail());
            assert!(o.detail().contains("ep_device_arithmetic") && o.detail().contains(names), "{}", o.detail());
        }
    }
}

/// The fallback is faithful (the digests are the door's): only the census can tell, which is why
/// the VOID above is the evidence.
#[test]
fn the_fallback_backend_keeps_every_bit() {
    let cfg = |doors| {
        let mut c = RunConfig::new(2, Transport::NativeP2p, Battery::default_for(tiny().config.vocab, 2)).unwrap();
        c.doors = doors;
        c
    };
    let real = program::run(tiny(), &cfg(device()), &mut HostBackend::new(2).unwrap()).unwrap();
    let fell = program::run(tiny(), &cfg(device()), &mut fallback(2, true, true)).unwrap();
    assert_eq!(real.first_digest_difference(&fell), None);
    assert_ne!(real.census, fell.census);
}

/// STEP_EP alone now bounces its expert-parallel arithmetic through the host: the plan adds that
/// host program (EP_DEVICE_ARITHMETIC's `read.* + write.*` fewer, reversed) to STEP_EP's census
/// declaration while the door is off, so STEP_EP is witnessed (its select launches and the
/// declared reads and writes); with the door on, the declaration is the registry's alone.
#[test]
fn step_ep_declares_the_host_program_it_runs_without_the_device_door() {
    let reg = Registry::builtin().unwrap();
    let config = |doors: &[&str]| {
        let mut c = Configuration::baseline(2, Transport::NativeP2p, BackendKind::Host);
        c.doors = doors.iter().map(|d| d.to_string()).collect();
        c
    };
    let decl = |doors: &[&str]| {
        let job = job_of(&reg, &config(doors), None, None, None).unwrap();
        job.census.into_iter().find(|d| d.door == "step_ep").unwrap()
    };
    let alone = decl(&["step_ep"]);
    let with_door = decl(&["step_ep", "ep_device_arithmetic"]);
    let host = |d: &memra_gating::job::CensusDecl| d.changes.iter().any(|c| c.counter.contains("read.*"));
    assert!(host(&alone) && !host(&with_door), "{alone:?} / {with_door:?}");
    let default = census(2, DoorSet::default(), &mut HostBackend::new(2).unwrap());
    for (decl, doors) in [(&alone, step_ep()), (&with_door, device())] {
        let on = census(2, doors, &mut HostBackend::new(2).unwrap());
        let o = gate::engagement(on.counts(), &[(decl, Ok(default.counts().clone()))]);
        assert!(o.passed(), "{doors:?}: {}", o.detail());
    }
    // Negative control: without the plan's addition the round-trip rule fails STEP_EP alone.
    let bare = crate::registry_decl("step_ep");
    let on = census(2, step_ep(), &mut HostBackend::new(2).unwrap());
    let o = gate::engagement(on.counts(), &[(&bare, Ok(default.counts().clone()))]);
    assert!(!o.passed() && o.detail().contains("host round trip"), "{}", o.detail());
}
