//! Issue 29's MEMRA_STEP_EP_DEVICE_ARITHMETIC on the host backend.
//!
//! STEP_EP's default arithmetic is a host program: each owner rank's routed gate/up launch stores
//! the SwiGLU's operands, the program reads them, applies the host twin's SwiGLU and writes the
//! activations back, and the root's weighted combine is read, computed and written back the same
//! way. The door keeps both on the device (the fused gate/up/SwiGLU launch, one combine_shared
//! launch). On `edge` — whose battery reaches both SwiGLU clamps on routed experts and sums of
//! −0.0 products — both paths keep every bit and the coverage of the TP1 oracle at TP2/4/8, the
//! census shows the bounce without the door and the device launches with it, and the program's
//! own SwiGLU counts exactly the clamps the backend's twin counts. Negative control: a bounce
//! whose written-back activations carry one flipped bit is seen at the first experts seam.

use crate::edge_fixture::{battery, edge};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::intercept::{Hooks, Intercepted};
use memra_runtime::backend::{Backend, Slice};
use memra_runtime::evidence::coverage;
use memra_runtime::evidence::record::{Record, Seam};
use memra_runtime::{program, DoorSet, RunConfig, RuntimeError, Transport};
use std::sync::OnceLock;

fn config(tp: usize, doors: DoorSet) -> RunConfig {
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery()).unwrap();
    cfg.doors = doors;
    cfg
}

fn host_run(tp: usize, doors: DoorSet) -> Record {
    program::run(edge(), &config(tp, doors), &mut HostBackend::new(tp).unwrap())
        .unwrap_or_else(|e| panic!("TP{tp} {doors:?}: {e}"))
}

fn oracle() -> &'static Record {
    static ORACLE: OnceLock<Record> = OnceLock::new();
    ORACLE.get_or_init(|| {
        let cfg = RunConfig::new(1, Transport::HostBounce, battery()).unwrap();
        program::run(edge(), &cfg, &mut HostBackend::new(1).unwrap()).unwrap()
    })
}

/// A census counter, or the sum over a `prefix.` family.
fn census(r: &Record, key: &str) -> u64 {
    match key.strip_suffix('*') {
        Some(prefix) => r.census.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| *v).sum(),
        None => r.census.get(key).copied().unwrap_or(0),
    }
}

fn step_ep() -> DoorSet {
    DoorSet { step_ep: true, ..DoorSet::default() }
}

fn device() -> DoorSet {
    DoorSet { ep_device_arithmetic: true, ..step_ep() }
}

#[test]
fn edge_reaches_both_swiglu_clamps_and_negative_zero_sums_on_the_ep_path() {
    let o = oracle().coverage.as_ref().unwrap();
    let paths = [
        "swiglu.clamp_silu.routed",
        "swiglu.clamp_up_high.routed",
        "swiglu.clamp_up_low.routed",
        coverage::NEGATIVE_ZERO_SUMS,
    ];
    for p in paths {
        assert!(o[p].count > 0, "the oracle reaches {p}");
    }
    for tp in [2, 4, 8] {
        for doors in [step_ep(), device()] {
            let r = host_run(tp, doors);
            let cov = r.coverage.as_ref().unwrap();
            for p in paths {
                assert_eq!(cov[p], o[p], "TP{tp} {doors:?}: {p} (count and first place) as the oracle's");
            }
        }
    }
}

#[test]
fn device_and_host_arithmetic_keep_every_bit_and_the_coverage_at_every_tp() {
    let o = oracle();
    let layers = edge().config.layers as u64;
    for tp in [2, 4, 8] {
        let host = host_run(tp, step_ep());
        let dev = host_run(tp, device());
        for (what, r) in [("host arithmetic", &host), ("device arithmetic", &dev)] {
            assert_eq!(o.first_digest_difference(r), None, "TP{tp} {what}: a bit changed");
            assert_eq!(r.tokens, o.tokens, "TP{tp} {what}");
            assert_eq!(r.coverage, o.coverage, "TP{tp} {what}: coverage differs from TP1");
            assert_eq!(r.copy_faults, vec![], "TP{tp} {what}");
        }
        // Without the door: the SwiGLU operand launches, and the bounce's reads and writes.
        assert!(census(&host, "launch.expert_gate_up_rows.*") > 0, "TP{tp}");
        assert_eq!(census(&host, "launch.combine_shared"), 0, "TP{tp}: the combine ran on the host");
        // With it: none of them, one combine per layer and step, and fewer host reads and writes.
        assert_eq!(census(&dev, "launch.expert_gate_up_rows.*"), 0, "TP{tp}");
        let steps: u64 = (0..battery().prompts.len()).map(|p| battery().steps_of(p) as u64).sum();
        assert_eq!(census(&dev, "launch.combine_shared"), layers * steps, "TP{tp}");
        for family in ["read.*", "write.*"] {
            assert!(census(&dev, family) < census(&host, family), "TP{tp}: {family}");
        }
        assert!(dev.engaged.get("ep_device_arithmetic.device_ops").is_some_and(|n| *n > 0), "TP{tp}");
        assert_eq!(host.engaged.get("ep_device_arithmetic.device_ops"), None, "TP{tp}");
    }
}

/// The door moves STEP_EP's arithmetic; without STEP_EP it is refused by its `requires` rule, and
/// at TP1 (outside its TP sizes) by the TP rule.
#[test]
fn the_door_without_step_ep_is_refused() {
    let lone = DoorSet { ep_device_arithmetic: true, ..DoorSet::default() };
    let err = config(2, lone).check_doors().unwrap_err();
    assert!(
        matches!(&err, RuntimeError::DoorRefused { door: "MEMRA_STEP_EP_DEVICE_ARITHMETIC", .. })
            && err.to_string().contains("MEMRA_STEP_EP"),
        "{err}"
    );
    assert!(config(2, device()).check_doors().is_ok());
}

/// Flips the lowest bit of the first value of every host write of `width` values (a routed
/// expert's activations) into a peer rank's memory — the program writes nothing else there (the
/// embedding row goes to the root): a bounce that writes back wrong bits.
struct FlipWrites {
    width: usize,
    flipped: u64,
}

impl Hooks<HostBackend> for FlipWrites {
    fn write(&mut self, inner: &mut HostBackend, rank: usize, dst: Slice, data: &[f32]) -> memra_runtime::Result<()> {
        if rank == 0 || data.len() != self.width || data.is_empty() {
            return inner.write(rank, dst, data);
        }
        let mut d = data.to_vec();
        d[0] = f32::from_bits(d[0].to_bits() ^ 1);
        self.flipped += 1;
        inner.write(rank, dst, &d)
    }
}

/// Negative control: the bounced activations are on the digested path — one flipped bit in what
/// the host SwiGLU writes back on rank 1 changes an experts seam first (where rank 1's down
/// partials are digested), and the same hook changes nothing with the door (no such write exists).
#[test]
fn a_host_swiglu_that_writes_back_a_flipped_bit_is_seen_at_an_experts_seam() {
    let width = edge().config.expert_width;
    for (doors, broken) in [(step_ep(), true), (device(), false)] {
        let mut b = Intercepted::new(HostBackend::new(2).unwrap(), FlipWrites { width, flipped: 0 });
        let r = program::run(edge(), &config(2, doors), &mut b).unwrap();
        assert_eq!(b.hooks.flipped > 0, broken, "{doors:?}");
        match oracle().first_digest_difference(&r) {
            Some(d) => {
                assert!(broken, "{doors:?}: {d:?}");
                assert_eq!(d.3, Seam::Experts, "{d:?}");
            }
            None => assert!(!broken, "{doors:?}: the flipped activations went unseen"),
        }
    }
}
