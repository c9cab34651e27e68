//! The gates of issue 11 as pure functions, each with its negative control: engagement decided by
//! the census against the door-off census (a silent fallback that still counts at its call site
//! is VOID), the first difference in program order (a broken copy before the seam that consumes
//! it), the rank of a divergence from per-rank digest shares, the determinism of the evidence
//! bytes, and the coverage of a model's claims.

use std::collections::BTreeMap;

use memra_gating::gate::{self, Outcome};
use memra_gating::job::CensusDecl;
use memra_gating::record_evidence;
use memra_gating::registry::census::{CensusChange, Change};
use memra_kernels::twins::digest::digest_u32;
use memra_runtime::evidence::census::Census;
use memra_runtime::evidence::coverage::{self, PathCount, SeamPoint};
use memra_runtime::record::{Capture, CaptureKey, CopyFault, Record, Seam};
use memra_runtime::DoorSet;

fn census(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn decl(door: &str, changes: &[(&str, Change)]) -> CensusDecl {
    CensusDecl {
        door: door.to_string(),
        changes: changes.iter().map(|(c, ch)| CensusChange { counter: c.to_string(), change: *ch }).collect(),
        off: DoorSet::default(),
        off_vars: BTreeMap::new(),
        identity: None,
    }
}

/// One layer, one prompt of `steps` steps, every digest `d`, `tp` ranks sharing it (rank 0 holds
/// it all).
fn record(steps: usize, tp: usize, d: u64) -> Record {
    let mut r = Record { n_layers: 1, ..Record::default() };
    let per = r.seams_per_step();
    r.digests = vec![vec![vec![d; per]; steps]];
    r.rank_digests =
        vec![vec![(0..per).map(|_| (0..tp).map(|k| if k == 0 { d } else { 0 }).collect()).collect(); steps]];
    r.tokens = vec![vec![1, 2]];
    r.top2 = vec![vec![(2.0, 1.0), (3.0, 1.0)]];
    r
}

#[test]
fn engagement_is_decided_by_the_census_not_by_call_site_counters() {
    let d =
        decl("oproj_direct", &[("peer_store.gemv_partials.*", Change::Appears), ("copy.native-p2p.*", Change::Fewer)]);
    let off = census(&[("copy.native-p2p.4096", 10)]);
    let on = census(&[("copy.native-p2p.4096", 8), ("peer_store.gemv_partials.bf16", 2)]);
    assert!(gate::engagement(&on, &[(&d, Ok(off.clone()))]).passed());
    // The silent fallback: the same census as with the door off (whatever its call site counted).
    let o = gate::engagement(&off, &[(&d, Ok(off.clone()))]);
    assert!(!o.passed());
    assert!(o.detail().contains("oproj_direct") && o.detail().contains("appears (0 → 0)"), "{}", o.detail());
    // A baseline that could not run is not a pass either.
    assert!(!gate::engagement(&on, &[(&d, Err("boom".into()))]).passed());
    // One failed change of several is enough.
    let partial = census(&[("copy.native-p2p.4096", 10), ("peer_store.gemv_partials.bf16", 2)]);
    assert!(!gate::engagement(&partial, &[(&d, Ok(off))]).passed());
    assert!(gate::engagement(&on, &[]).passed(), "no door: nothing to witness");
}

/// An outside witness (a CUDA subject's CUPTI counts, `outside.*`): the door must change what it
/// saw. The forged counter: the subject's own counter appears, the witness's counts do not move.
#[test]
fn a_door_the_outside_witness_did_not_see_is_not_engaged() {
    let d = decl("forged", &[("forged.calls", Change::Appears)]);
    let work = [("outside.processes", 1), ("outside.launch.sgemm", 96), ("outside.call.cuMemcpyHtoDAsync_v2", 40)];
    let off = census(&work);
    let mut forged_run: Vec<(&str, u64)> = work.to_vec();
    forged_run.push(("forged.calls", 7));
    let o = gate::engagement(&census(&forged_run), &[(&d, Ok(off.clone()))]);
    assert!(!o.passed(), "{}", o.detail());
    assert!(o
        .detail()
        .contains("the outside witness counted the same work with the door on as off (96 kernel launches"));
    // The honest door: bf16 kernels replace the f32 ones, and the witness says which.
    let honest = census(&[
        ("outside.processes", 1),
        ("outside.launch.sgemm", 10),
        ("outside.launch.gemv_bf16", 86),
        ("outside.call.cuMemcpyHtoDAsync_v2", 40),
        ("forged.calls", 7),
    ]);
    let o = gate::engagement(&honest, &[(&d, Ok(off.clone()))]);
    assert!(o.passed(), "{}", o.detail());
    assert!(o.detail().contains("outside witness: launch.gemv_bf16 0 → 86, launch.sgemm 96 → 10"), "{}", o.detail());
    // Armed but no CUDA work seen, and a door-off run the witness did not count: not engaged.
    let nothing = census(&[("outside.processes", 0), ("forged.calls", 7)]);
    assert!(gate::engagement(&nothing, &[(&d, Ok(off))]).detail().contains("saw no CUDA work"));
    let unwitnessed_off = census(&[]);
    assert!(!gate::engagement(&honest, &[(&d, Ok(unwitnessed_off))]).passed());
    // Without a witness (a host subject) the rule does not apply: the self-reported census decides.
    assert!(gate::engagement(&census(&[("forged.calls", 7)]), &[(&d, Ok(census(&[])))]).passed());
}

#[test]
fn a_host_round_trip_is_not_engagement_unless_declared() {
    let d = decl("len_mirror_lazy", &[("copy.local.*", Change::Fewer)]);
    let off = census(&[("copy.local.4", 10), ("read.4", 2), ("write.1024", 3)]);
    // The copies are gone, but as many host reads and writes appeared: a round trip.
    let trip = census(&[("read.4", 12), ("write.1024", 3), ("write.4", 10)]);
    let o = gate::engagement(&trip, &[(&d, Ok(off.clone()))]);
    assert!(!o.passed(), "{}", o.detail());
    assert!(o.detail().contains("a host round trip: read.* 2 → 12 and write.* 3 → 13"), "{}", o.detail());
    // Controls: the copies really skipped; more reads alone (a route read on the host); a door
    // that declares its writes.
    assert!(gate::engagement(&census(&[("read.4", 2), ("write.1024", 3)]), &[(&d, Ok(off.clone()))]).passed());
    let reads = census(&[("read.4", 12), ("write.1024", 3)]);
    assert!(gate::engagement(&reads, &[(&d, Ok(off.clone()))]).passed());
    let declared = decl("x", &[("copy.local.*", Change::Fewer), ("write.*", Change::More)]);
    assert!(gate::engagement(&trip, &[(&declared, Ok(off))]).passed());
}

#[test]
fn a_broken_copy_is_the_first_difference_before_its_consumer() {
    let oracle = record(2, 2, 7);
    let mut run = record(2, 2, 7);
    // The consumer (qkv) differs at step 0, and the attn_norm copy to rank 1 arrived wrong.
    let qkv = Record::seam_index(1, 0, Seam::Qkv);
    run.digests[0][0][qkv] = 8;
    run.copy_faults.push(CopyFault { prompt: 0, step: 0, layer: 0, seam: Seam::AttnNorm, src_rank: 0, dst_rank: 1 });
    let d = gate::first_difference(&oracle, &run).unwrap().unwrap();
    assert_eq!((d.seam, d.copy_from, d.rank), (Seam::AttnNorm, Some(0), Some(1)));
    assert!(d.describe().contains("copy r0→r1"), "{}", d.describe());
    // A copy after the first differing seam does not come first.
    let mut later = record(2, 2, 7);
    later.digests[0][0][qkv] = 8;
    later.copy_faults.push(CopyFault { prompt: 0, step: 0, layer: 0, seam: Seam::OProj, src_rank: 1, dst_rank: 0 });
    let d = gate::first_difference(&oracle, &later).unwrap().unwrap();
    assert_eq!((d.seam, d.copy_from), (Seam::Qkv, None));
    // The copies gate: a fault fails; copies verified without a fault pass; none verified fails
    // (unchecked copies are no evidence).
    let mut checked = oracle.clone();
    checked.copies_verified = 12;
    assert!(!gate::copies(&later).passed() && gate::copies(&checked).passed());
    assert!(!gate::copies(&oracle).passed(), "no copy verified: nothing witnessed");
    assert_eq!(gate::first_difference(&oracle, &oracle.clone()).unwrap(), None);
}

#[test]
fn the_rank_comes_from_the_digest_shares() {
    // A seam of 4 elements: rank 0 holds [0, 2), rank 1 holds [2, 4).
    let reference = Capture { bits: vec![1, 2, 3, 4], owners: vec![(0, 0, 4)] };
    let owners = [(0, 0, 2), (1, 2, 2)];
    let key = CaptureKey { prompt: 0, step: 0, layer: 0, seam: Seam::Attn };
    let mut run = record(1, 2, 0);
    let idx = Record::seam_index(1, 0, Seam::Attn);
    run.rank_digests[0][0][idx] = vec![digest_u32(&[1, 2], 0), digest_u32(&[3, 5], 2)];
    assert_eq!(gate::ranks_differing(&run, key, &reference, &owners), vec![1]);
    run.rank_digests[0][0][idx] = vec![digest_u32(&[1, 2], 0), digest_u32(&[3, 4], 2)];
    assert_eq!(gate::ranks_differing(&run, key, &reference, &owners), Vec::<usize>::new());
    // Not reproduced: the location still names layer, seam, step and rank, and says so.
    let d = gate::FirstDivergence { rank: Some(1), ..gate::FirstDivergence::at_seam(0, 3, 0, Seam::Attn) };
    assert!(d.describe().contains("r1") && d.describe().contains("race is likely"), "{}", d.describe());
}

#[test]
fn determinism_compares_the_evidence_bytes() {
    let a = record(2, 1, 7);
    let same = gate::determinism(&record_evidence::sections(&a), &record_evidence::sections(&a.clone()));
    assert!(same.passed(), "{}", same.detail());
    // Equal digests and tokens, but a census that moved between the runs (a volatile value).
    let mut b = a.clone();
    // (A test's stand-in for a subject's word; runtime code cannot make one: tidy.)
    b.census = Census::reported([("launch.rmsnorm".to_string(), 3)].into());
    let o = gate::determinism(&record_evidence::sections(&a), &record_evidence::sections(&b));
    assert!(matches!(&o, Outcome::Fail(d) if d.contains("census")), "{o:?}");
    let mut c = a.clone();
    c.top2[0][1].1 = 1.5;
    assert!(!gate::determinism(&record_evidence::sections(&a), &record_evidence::sections(&c)).passed());
}

#[test]
fn coverage_fails_a_claim_that_was_not_reached() {
    let at = Some(SeamPoint { prompt: 0, step: 0, layer: 0, seam: Seam::Router });
    let mut reached = coverage::empty();
    coverage::note(&mut reached, coverage::TIE_IN_TOPK, at, 3);
    let claims = [coverage::TIE_IN_TOPK];
    assert!(gate::coverage(&claims, Some(&reached), Some(&reached)).passed());
    let o = gate::coverage(&[coverage::TIE_AT_BOUNDARY], Some(&reached), None);
    assert!(!o.passed() && o.detail().contains(coverage::TIE_AT_BOUNDARY), "{}", o.detail());
    // The run's own count matters where it has one.
    let mut own = reached.clone();
    own.insert(coverage::TIE_IN_TOPK.into(), PathCount::default());
    assert!(!gate::coverage(&claims, Some(&reached), Some(&own)).passed());
    assert!(!gate::coverage(&claims, None, None).passed(), "no coverage counted: no claim can pass");
    assert!(gate::coverage(&[], None, None).passed(), "a model that claims nothing");
}

/// Two layers, one prompt of two steps, every seam captured as `[1.0; 4]` (router: ids `[0, 1]`
/// then weights `[0.5, 0.5]`).
fn captured_two_layers() -> Record {
    let mut r = Record { n_layers: 2, ..Record::default() };
    for step in 0..2 {
        for (layer, seams) in [(0, &Seam::LAYER[..]), (1, &Seam::LAYER[..]), (2, &Seam::HEAD[..])] {
            for &seam in seams {
                let bits = if seam == Seam::Router {
                    vec![0u32, 1, 0.5f32.to_bits(), 0.5f32.to_bits()]
                } else {
                    vec![1.0f32.to_bits(); 4]
                };
                r.captures
                    .insert(CaptureKey { prompt: 0, step, layer, seam }, Capture { bits, owners: vec![(0, 0, 4)] });
            }
        }
    }
    r
}

fn set(r: &mut Record, step: usize, layer: usize, seam: Seam, bits: Vec<u32>) {
    r.captures.get_mut(&CaptureKey { prompt: 0, step, layer, seam }).expect("captured").bits = bits;
}

fn worst(errors: &[gate::SeamError]) -> f64 {
    errors.iter().map(|e| e.max_rel).fold(0.0, f64::max)
}

/// A routing flip makes the rest of its step compare different experts: the flipped layer's
/// expert, join and residual seams, the later layers and the head of that step are left out —
/// and nothing else: an error before the flip, or at another step, still counts (negative
/// controls).
#[test]
fn a_routing_flip_leaves_out_the_rest_of_its_step_and_nothing_else() {
    let oracle = captured_two_layers();
    let off = vec![2.0f32.to_bits(); 4]; // relative error 1.0
    let flip = vec![0u32, 2, 0.5f32.to_bits(), 0.5f32.to_bits()];

    let mut run = oracle.clone();
    set(&mut run, 1, 0, Seam::Router, flip.clone());
    for (layer, seam) in
        [(0, Seam::Experts), (0, Seam::MoeJoin), (0, Seam::Residual), (1, Seam::Qkv), (2, Seam::Logits)]
    {
        set(&mut run, 1, layer, seam, off.clone());
    }
    let (errors, flips) = gate::error_budget(&oracle, &run);
    assert_eq!(flips, 1);
    assert_eq!(worst(&errors), 0.0, "everything after the flip in step 1 is left out: {errors:?}");
    assert!(errors.iter().any(|e| e.layer == 0 && e.seam == Seam::Residual), "step 0 still compares the residual");

    // Before the flip in its own step: counted.
    let mut before = run.clone();
    set(&mut before, 1, 0, Seam::OJoin, off.clone());
    assert_eq!(worst(&gate::error_budget(&oracle, &before).0), 1.0, "a seam before the flip counts");
    // The same seams at a step without a flip: counted.
    let mut other_step = run.clone();
    set(&mut other_step, 0, 2, Seam::Logits, off.clone());
    assert_eq!(worst(&gate::error_budget(&oracle, &other_step).0), 1.0, "another step's logits count");
    // A flip in the last layer leaves the earlier layer of its step compared.
    let mut late = oracle.clone();
    set(&mut late, 1, 1, Seam::Router, flip);
    set(&mut late, 1, 1, Seam::Residual, off.clone());
    set(&mut late, 1, 0, Seam::Residual, off);
    let (errors, flips) = gate::error_budget(&oracle, &late);
    assert_eq!(flips, 1);
    let at = |layer, seam| errors.iter().find(|e| e.layer == layer && e.seam == seam).map(|e| e.max_rel);
    assert_eq!((at(1, Seam::Residual), at(0, Seam::Residual)), (Some(0.0), Some(1.0)));
    assert!(gate::uncompared_seams(&oracle, &errors).is_empty(), "step 0 compares every seam");

    // Flips at layer 0 of every step leave the rest of the model compared nowhere: named, so the
    // gate's detail can say what it did not compare.
    let mut everywhere = oracle.clone();
    for step in 0..2 {
        set(&mut everywhere, step, 0, Seam::Router, vec![0u32, 2, 0.5f32.to_bits(), 0.5f32.to_bits()]);
    }
    let (errors, flips) = gate::error_budget(&oracle, &everywhere);
    assert_eq!(flips, 2);
    let never = gate::uncompared_seams(&oracle, &errors);
    assert!(never.contains(&(0, Seam::Experts)) && never.contains(&(2, Seam::Logits)), "{never:?}");
    assert!(!never.contains(&(0, Seam::OJoin)), "seams before the router were compared");
}

/// A NaN or ±inf at a seam fails the budget, named (the fold with `f64::max` once dropped NaN and
/// read the seam as 0.0 error): the negative control plants a NaN in the logits of step 1.
#[test]
fn a_non_finite_value_fails_the_error_budget_with_its_place() {
    let oracle = captured_two_layers();
    let (clean, _) = gate::error_budget(&oracle, &oracle.clone());
    assert!(clean.iter().all(|e| e.non_finite.is_none()) && gate::worst_rel(&clean) == 0.0);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut run = oracle.clone();
        set(&mut run, 1, 2, Seam::Logits, vec![1.0f32.to_bits(), 1.0f32.to_bits(), bad.to_bits(), 1.0f32.to_bits()]);
        let (errors, _) = gate::error_budget(&oracle, &run);
        assert!(gate::worst_rel(&errors).is_nan(), "{bad}: {errors:?}");
        let e = errors.iter().find(|e| e.non_finite.is_some()).expect("a non-finite seam");
        let text = e.describe_non_finite().unwrap();
        assert!(text.starts_with("L2.logits p0 s1 [2]: the run has"), "{text}");
        assert_eq!(errors.iter().filter(|e| e.non_finite.is_some()).count(), 1);
    }
    // The same non-finite bits on both sides are equal, not an error.
    let mut both = oracle.clone();
    set(&mut both, 0, 0, Seam::Qkv, vec![f32::INFINITY.to_bits(); 4]);
    let (errors, _) = gate::error_budget(&both, &both.clone());
    assert!(errors.iter().all(|e| e.non_finite.is_none()), "{errors:?}");
}

/// Non-triviality holds per prompt: a subject that writes step 0's values again at every step of
/// each prompt fails, naming the prompt, even when the battery as a whole varies.
#[test]
fn non_triviality_fails_a_prompt_that_repeats_its_first_step() {
    let mut r = Record { n_layers: 1, ..Record::default() };
    let per = r.seams_per_step();
    let row = |p: u64, s: u64| (0..per as u64).map(|i| 1 + i + 100 * s + 10_000 * p).collect::<Vec<u64>>();
    r.digests = (0..2).map(|p| (0..3).map(|s| row(p, s)).collect()).collect();
    r.tokens = vec![vec![1, 2], vec![3, 4]];
    r.top2 = vec![vec![(2.0, 1.0), (3.0, 1.0)], vec![(4.0, 1.0), (5.0, 1.0)]];
    let o = gate::non_triviality(&r);
    assert!(o.passed(), "{}", o.detail());
    // Prompt 1 repeats step 0 at every step (the battery still varies across prompts).
    let mut repeat = r.clone();
    repeat.digests[1] = vec![row(1, 0); 3];
    let o = gate::non_triviality(&repeat);
    assert!(
        !o.passed() && o.detail().starts_with("prompt 1: the last layer's residual is identical"),
        "{}",
        o.detail()
    );
    // Only the top-two logits repeating within a prompt: caught too.
    let mut logits = r.clone();
    logits.top2[0] = vec![(2.0, 1.0), (2.0, 1.0)];
    let o = gate::non_triviality(&logits);
    assert!(!o.passed() && o.detail().starts_with("prompt 0: the top-two logits"), "{}", o.detail());
}
