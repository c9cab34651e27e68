//! The `edge` model reaches every path it claims (docs/DESIGN.md §3.2), at every TP size and host
//! transport, with the same coverage counts as TP1 (each unit of work runs on exactly one rank)
//! and bit-identical digests; each planted twin defect changes the run exactly where coverage
//! says its path is first reached; every cross-rank copy is verified and a broken broadcast is
//! named at the copy; the census sees what the backend did.

use crate::edge_fixture::{battery, edge};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::evidence::coverage::{self, SeamPoint};
use memra_runtime::evidence::record::{CopyFault, Record, Seam};
use memra_runtime::model::edge::CLAIMS;
use memra_runtime::{program, Canary, RunConfig, Transport};
use std::sync::OnceLock;

fn run_with(tp: usize, t: Transport, edit: impl FnOnce(&mut RunConfig)) -> Record {
    let mut cfg = RunConfig::new(tp, t, battery()).unwrap();
    edit(&mut cfg);
    let mut b = HostBackend::new(tp).unwrap();
    program::run(edge(), &cfg, &mut b).unwrap_or_else(|e| panic!("TP{tp} {}: {e}", t.name()))
}

fn oracle() -> &'static Record {
    static ORACLE: OnceLock<Record> = OnceLock::new();
    ORACLE.get_or_init(|| run_with(1, Transport::HostBounce, |_| {}))
}

#[test]
fn every_claimed_path_is_reached_and_the_output_is_not_trivial() {
    let o = oracle();
    let cov = o.coverage.as_ref().expect("the host backend counts coverage");
    for path in CLAIMS {
        assert!(cov[path].count > 0, "the edge battery never reached {path}: {cov:#?}");
    }
    eprintln!("edge coverage (3 prompts × 4 tokens):");
    for (p, c) in cov {
        eprintln!("  {p:<30} {:>8}  first {:?}", c.count, c.first);
    }
    let tokens: Vec<u32> = o.tokens.iter().flatten().copied().collect();
    assert!(tokens.iter().any(|t| *t != tokens[0]), "every edge token is {}", tokens[0]);
}

#[test]
fn every_tp_size_and_transport_gives_the_same_bits_coverage_and_no_copy_fault() {
    let o = oracle();
    for tp in [2, 4, 8] {
        for t in [Transport::HostBounce, Transport::NativeP2p] {
            let r = run_with(tp, t, |_| {});
            assert_eq!(o.first_digest_difference(&r), None, "TP{tp} {} differs from TP1", t.name());
            assert_eq!(r.coverage, o.coverage, "TP{tp} {}: coverage differs from TP1", t.name());
            assert_eq!(r.copy_faults, vec![], "TP{tp} {}", t.name());
            assert!(r.copies_verified > 0, "TP{tp} {}: no copy was verified", t.name());
            let copies: u64 = r.census.iter().filter(|(k, _)| k.starts_with("copy.")).map(|(_, v)| v).sum();
            assert!(
                copies >= r.copies_verified,
                "TP{tp}: {copies} copies in the census, {} verified",
                r.copies_verified
            );
        }
    }
    assert_eq!(o.copies_verified, 0, "TP1 has no cross-rank copy");
}

/// Each twin defect differs from the canonical run first where coverage says its path is first
/// reached; off the path the defect is invisible (tiny reaches none of them).
#[test]
fn twin_defects_show_where_their_path_is_first_reached() {
    let cov = oracle().coverage.clone().unwrap();
    let first = |paths: &[&str]| -> SeamPoint {
        paths.iter().filter_map(|p| cov[*p].first).min().unwrap_or_else(|| panic!("{paths:?} never reached"))
    };
    let cases = [
        (Canary::TieBreak, first(&[coverage::TIE_IN_TOPK, coverage::TIE_AT_BOUNDARY])),
        (Canary::SignedZero, first(&[coverage::NEGATIVE_ZERO_SUMS])),
        (Canary::Clamp, first(&["swiglu.clamp_silu.routed", "swiglu.clamp_silu.shared"])),
    ];
    for (canary, at) in cases {
        for tp in [1, 2] {
            let r = run_with(tp, Transport::HostBounce, |c| c.doors.canary = Some(canary));
            let d =
                oracle().first_digest_difference(&r).unwrap_or_else(|| panic!("{canary:?} at TP{tp} changed nothing"));
            assert_eq!(d, (at.prompt, at.step, at.layer, at.seam), "{canary:?} at TP{tp}");
            let name = canary.twin_defect().unwrap().name();
            assert!(r.census.get(&format!("defect.{name}")).copied().unwrap_or(0) > 0, "{canary:?}: census");
        }
    }
}

/// Coverage counts the clamps the arithmetic applied, not the operands past the limit: a twin
/// that skips the silu-side clamp reports no silu clamp (so a model claiming that path fails its
/// coverage gate), while the up-side clamps it still applies are counted as before.
#[test]
fn coverage_counts_clamps_applied_not_operands_past_the_limit() {
    let clean = oracle().coverage.clone().unwrap();
    let r = run_with(1, Transport::HostBounce, |c| c.doors.canary = Some(Canary::Clamp));
    let skipped = r.coverage.expect("the host backend counts coverage");
    for side in ["routed", "shared"] {
        let silu = format!("swiglu.clamp_silu.{side}");
        assert!(clean[silu.as_str()].count > 0, "edge reaches {silu}");
        assert_eq!(skipped[silu.as_str()].count, 0, "{silu}: the skipped clamp was counted");
        for up in ["clamp_up_high", "clamp_up_low"] {
            let k = format!("swiglu.{up}.{side}");
            assert_eq!(skipped[k.as_str()].count, clean[k.as_str()].count, "{k}");
        }
    }
}

#[test]
fn a_broken_broadcast_is_named_at_the_copy() {
    for tp in [2, 4] {
        let r = run_with(tp, Transport::NativeP2p, |c| c.doors.canary = Some(Canary::BrokenBroadcast));
        let want = CopyFault { prompt: 0, step: 0, layer: 0, seam: Seam::AttnNorm, src_rank: 0, dst_rank: tp - 1 };
        assert_eq!(r.copy_faults.first(), Some(&want), "TP{tp}: {:?}", r.copy_faults);
        // The consuming seam (qkv) differs too; the copy comes first in program order.
        assert_eq!(oracle().first_digest_difference(&r).map(|d| d.3), Some(Seam::Qkv));
    }
}

/// The census witnesses what was carried out: peer stores under OPROJ_DIRECT, none when the
/// mechanism silently falls back (while the call-site counter still counts).
#[test]
fn the_census_sees_peer_stores_and_their_silent_fallback() {
    let direct = run_with(2, Transport::NativeP2p, |c| c.doors.oproj_direct = true);
    let fallback = run_with(2, Transport::NativeP2p, |c| {
        c.doors.oproj_direct = true;
        c.doors.canary = Some(Canary::SilentFallback);
    });
    let plain = run_with(2, Transport::NativeP2p, |_| {});
    let stores =
        |r: &Record| r.census.iter().filter(|(k, _)| k.starts_with("peer_store.")).map(|(_, v)| v).sum::<u64>();
    assert!(stores(&direct) > 0);
    assert_eq!(stores(&fallback), 0);
    assert_eq!(fallback.census, plain.census, "a silent fallback issues exactly the plain run's calls");
    assert!(fallback.engaged.get("oproj_direct.peer_stores").copied().unwrap_or(0) > 0, "the call site still counts");
    assert_eq!(plain.first_digest_difference(&fallback), None);
}

/// A transport that breaks only small payloads: the probe's ladder from one word up finds it
/// (its 16 KiB-and-up rungs alone would not), and the copy checks name the first broken copy of
/// a run.
#[test]
fn the_probe_and_the_copy_checks_find_a_transport_that_breaks_small_payloads() {
    use memra_runtime::backend::{Backend, PROBE_SIZES_BYTES};
    let mut b = HostBackend::new(2).unwrap();
    b.corrupt_copies_up_to(64);
    let sizes = &PROBE_SIZES_BYTES[..PROBE_SIZES_BYTES.len() - 1];
    let probe = b.probe(Transport::HostBounce, sizes).unwrap();
    let bad: Vec<usize> = probe.iter().filter(|p| p.bad_words > 0).map(|p| p.bytes).collect();
    assert!(bad.contains(&4) && bad.iter().all(|&n| n <= 64), "{bad:?}");
    assert!(probe.iter().filter(|p| p.bytes >= 16 << 10).all(|p| p.bad_words == 0));
    let mut cfg = RunConfig::new(2, Transport::HostBounce, battery()).unwrap();
    cfg.doors = Default::default();
    let r = program::run(edge(), &cfg, &mut b).unwrap();
    // The route ids (8 bytes) are the first small copy of a step.
    let f = r.copy_faults.first().expect("a broken copy");
    assert_eq!((f.prompt, f.step, f.layer, f.seam, f.src_rank, f.dst_rank), (0, 0, 0, Seam::Router, 0, 1));
}

fn census_sum(r: &Record, prefix: &str) -> u64 {
    r.census.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum()
}

/// The last expert is layer 1's dominant slot, owned by the last rank at every expert-parallel
/// TP size: STEP_EP's slot select and MOE_DIRECT's owner stores have another rank than the root
/// to serve, so both doors are witnessed by the census on `edge` (with the dominant slot on rank 0
/// they were not: VOID at TP2).
#[test]
fn expert_parallel_owners_beyond_the_root_are_reached() {
    for tp in [2, 4, 8] {
        let ep = run_with(tp, Transport::NativeP2p, |c| c.doors.step_ep = true);
        let direct = run_with(tp, Transport::NativeP2p, |c| {
            c.doors.step_ep = true;
            c.doors.moe_direct = true;
        });
        assert!(census_sum(&ep, "launch.select_slots") > 0, "TP{tp}: STEP_EP selects slots on the device");
        assert!(
            census_sum(&direct, "peer_store.fold_slots") > 0,
            "TP{tp}: an owner other than the root stores its slot"
        );
        assert_eq!(oracle().first_digest_difference(&direct), None, "TP{tp}: the same bits as the oracle");
    }
}

/// The premise of the gates' shape rule for MOE_DIRECT under NVFP4_EP2 (`gates/src/suite/
/// shape_rules.rs`): on `edge` at TP2 (a shared expert whole on rank 0) the door changes no call
/// and no bit, so a run with it could only be VOID.
#[test]
fn moe_direct_under_nvfp4_ep2_changes_nothing_on_edge() {
    let ep2 = run_with(2, Transport::NativeP2p, |c| c.doors.nvfp4_ep2 = true);
    let direct = run_with(2, Transport::NativeP2p, |c| {
        c.doors.nvfp4_ep2 = true;
        c.doors.moe_direct = true;
    });
    assert_eq!(direct.census, ep2.census, "the same calls with MOE_DIRECT as without");
    assert_eq!(census_sum(&direct, "peer_store."), 0);
    assert_eq!(ep2.first_digest_difference(&direct), None);
}
