//! MEMRA_STEP_NVFP4_DEV_ROUTES (issue 29) on real host runs of `tiny` (layer 0 clamps its
//! SwiGLU, layer 1 does not): the door changes numbers only where its device routes program runs —
//! the unclamped layer's experts and moe_join — and nowhere on the clamped layer; its runs agree
//! bit for bit across TP sizes (its class baseline); its engagement is witnessed by the
//! `combine_scaled` launches, and a backend that carries that combine out on the host (a silent
//! fallback with the same bits) is VOID.

use memra_gating::gate;
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::intercept::{Hooks, Intercepted};
use memra_runtime::backend::{Backend, Op};
use memra_runtime::config::ExpertFormat;
use memra_runtime::evidence::census::Census;
use memra_runtime::evidence::record::{Record, Seam};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::{program, Battery, DoorSet, RunConfig, Transport};
use std::sync::OnceLock;

fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap())
}

fn routes() -> DoorSet {
    DoorSet { nvfp4_dev_routes: true, ..DoorSet::default() }
}

fn run<B: Backend>(tp: usize, transport: Transport, doors: DoorSet, format: ExpertFormat, b: &mut B) -> Record {
    let mut cfg = RunConfig::new(tp, transport, Battery::default_for(tiny().config.vocab, 2)).unwrap();
    cfg.doors = doors;
    cfg.expert_format = format;
    program::run(tiny(), &cfg, b).unwrap()
}

fn host(tp: usize, doors: DoorSet, format: ExpertFormat) -> Record {
    run(tp, Transport::NativeP2p, doors, format, &mut HostBackend::new(tp).unwrap())
}

fn census(tp: usize, doors: DoorSet) -> Census {
    let format = if doors.nvfp4_banks() { ExpertFormat::Nvfp4 } else { ExpertFormat::E4m3 };
    host(tp, doors, format).census
}

/// The premise of the other tests: `tiny` clamps layer 0 and not layer 1.
#[test]
fn tiny_has_a_clamped_and_an_unclamped_layer() {
    let c = &tiny().config;
    assert!(c.swiglu_limit_at(0).is_some() && c.swiglu_limit_at(1).is_none(), "{c:?}");
}

/// Against the canonical NVFP4 program (the door's numeric oracle): every seam of the clamped
/// layer 0 is identical at every step, the first difference is in layer 1 (the experts seam:
/// the folded up scale), and the routed output differs there. A door that folded the clamped
/// layer too, or did nothing, fails here.
#[test]
fn the_door_changes_only_the_unclamped_layer() {
    let canonical = host(1, DoorSet::default(), ExpertFormat::Nvfp4);
    let folded = host(1, routes(), ExpertFormat::Nvfp4);
    let (_, _, layer, seam) = canonical.first_digest_difference(&folded).expect("the door changes no number");
    assert_eq!((layer, seam), (1, Seam::Experts), "first difference at layer {layer}, {seam:?}");
    // Per step, layer 0's combine stays canonical and layer 1's is the scaled one.
    let (on, off) = (folded.census.counts(), canonical.census.counts());
    let per_layer = off.get("launch.combine_shared").copied().unwrap_or(0) / 2;
    assert!(per_layer > 0, "{off:?}");
    assert_eq!(on.get("launch.combine_scaled"), Some(&per_layer), "{on:?}");
    assert_eq!(on.get("launch.combine_shared"), Some(&per_layer), "{on:?}");
    assert_eq!(off.get("launch.combine_scaled"), None);
}

/// The class baseline reproduced: TP2, TP4 and TP8 (expert-parallel owners, the root's table)
/// over both peer transports equal TP1 with the door, bit for bit.
#[test]
fn the_door_is_the_same_at_every_tp_size() {
    let base = host(1, routes(), ExpertFormat::Nvfp4);
    for tp in [2, 4, 8] {
        for transport in [Transport::NativeP2p, Transport::HostBounce] {
            let r = run(tp, transport, routes(), ExpertFormat::Nvfp4, &mut HostBackend::new(tp).unwrap());
            assert_eq!(base.first_digest_difference(&r), None, "TP{tp} {transport:?}");
            assert_eq!(base.tokens, r.tokens, "TP{tp} {transport:?}");
        }
    }
}

/// A backend that receives the door's scaled combine and carries it out on the host: read the
/// operands, the host twin, write the result (the same bits, no device launch).
struct HostCombine;

impl Hooks<HostBackend> for HostCombine {
    fn launch(&mut self, inner: &mut HostBackend, rank: usize, op: Op) -> memra_runtime::Result<()> {
        match op {
            Op::CombineScaled { route, y, w, macros, out } => {
                let (ids, yv) = (inner.read(rank, route)?, inner.read(rank, y)?);
                let (wv, mv) = (inner.read(rank, w)?, inner.read(rank, macros)?);
                let mut o = vec![0.0f32; out.len];
                memra_kernels::twins::moe::combine_scaled(&ids, &mv, &yv, &wv, &mut o);
                inner.write(rank, out, &o)
            }
            op => inner.launch(rank, op),
        }
    }
}

#[test]
fn the_door_is_witnessed_by_its_launches_and_void_when_the_combine_falls_back_to_the_host() {
    let d = crate::registry_decl("nvfp4_dev_routes");
    for tp in [1, 2] {
        let off = census(tp, DoorSet::default());
        let on = census(tp, routes());
        let o = gate::engagement(on.counts(), &[(&d, Ok(off.counts().clone()))]);
        assert!(o.passed(), "TP{tp}: {}", o.detail());
        let mut b = Intercepted::new(HostBackend::new(tp).unwrap(), HostCombine);
        let fell = run(tp, Transport::NativeP2p, routes(), ExpertFormat::Nvfp4, &mut b);
        let real = host(tp, routes(), ExpertFormat::Nvfp4);
        assert_eq!(real.first_digest_difference(&fell), None, "TP{tp}: the fallback keeps every bit");
        let o = gate::engagement(fell.census.counts(), &[(&d, Ok(off.counts().clone()))]);
        assert!(!o.passed(), "TP{tp}, the combine on the host: {}", o.detail());
        assert!(o.detail().contains("launch.combine_scaled"), "{}", o.detail());
    }
}
