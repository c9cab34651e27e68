//! Issue 29's doors on a device (`kernels/cuda/doors29.cu`, `backend/cuda/direct.rs`):
//! - SEL_MIRROR: `mirror_sel_u32` stored into a peer rank moves every word bit for bit (NaN
//!   payloads, signed zeros, denormals, small ids); on `edge` (router ties) runs equal the host
//!   oracle at co-resident TP2/4/8 and on distinct devices, with the device census equal to the
//!   host's (one mirror per peer, layer and step, the ids copies gone);
//! - FENCE_RANK1: with MOE_DIRECT and FENCE_MEMOPS, runs equal the host oracle and ring exactly
//!   one host-memory doorbell and one kernel doorbell per peer store (a fallback to events is a
//!   failure, with the driver's reason);
//! - the race: the skip-fence canary is still caught with FENCE_RANK1 on — a copy fault, a
//!   divergence from the oracle, or two runs that differ (what `selftest` counts as caught).
//!
//! Without a CUDA device every test reads `ignored (no CUDA device: …)`.

use crate::cases::CO_RESIDENT;
use crate::harness::{cuda_backend, GpuTest, NotRun, Ran, Skip};
use memra_runtime::backend::cuda::{CudaOptions, PlacementPolicy};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{capability, Backend, JoinFence, Op, Slice, Witness};
use memra_runtime::evidence::record::Record;
use memra_runtime::{program, Canary, DoorSet, RunConfig, RuntimeError, Transport};
use std::sync::OnceLock;
use crate::edge_fixture::{battery, edge};

pub fn tests() -> Vec<GpuTest> {
    let mut t = vec![
        GpuTest::new("mirror_sel_moves_every_word_into_a_peer", mirror_sel_moves_every_word_into_a_peer),
        GpuTest::new("sel_mirror_runs_equal_the_host_oracle_co_resident", || sel_mirror_runs(None)),
        GpuTest::new("fence_rank1_runs_equal_the_host_and_ring_one_kernel_doorbell_per_store", || fence_rank1_runs(None)),
        GpuTest::new("skip_fence_canary_is_caught_with_fence_rank1_on", skip_fence_caught_with_fence_rank1),
    ];
    for (name, body) in [
        ("sel_mirror_runs_equal_the_host_oracle", (|tp| sel_mirror_runs(Some(tp))) as fn(usize) -> Ran),
        ("fence_rank1_runs_equal_the_host_and_ring_one_kernel_doorbell_per_store", |tp| fence_rank1_runs(Some(tp))),
    ] {
        t.extend(GpuTest::per_device_count(name, &[2, 4, 8], body));
    }
    t
}

const DISTINCT: CudaOptions = CudaOptions { placement: PlacementPolicy::Auto, ..CO_RESIDENT };

fn config(tp: usize, doors: DoorSet) -> RunConfig {
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery()).unwrap();
    cfg.doors = doors;
    cfg
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

fn placements(distinct: Option<usize>) -> (&'static str, CudaOptions, Vec<usize>) {
    match distinct {
        None => ("co-resident", CO_RESIDENT, vec![2, 4, 8]),
        Some(tp) => ("distinct devices", DISTINCT, vec![tp]),
    }
}

/// A CUDA run of `doors` at `tp`; `None` after noting a run the machine cannot make.
fn cuda_run(tp: usize, doors: DoorSet, opts: CudaOptions, what: &str, not_run: &mut NotRun) -> Result<Option<(Record, memra_runtime::backend::cuda::CudaBackend)>, Skip> {
    let mut b = cuda_backend(tp, opts)?;
    match program::run(edge(), &config(tp, doors), &mut b) {
        Ok(r) => Ok(Some((r, b))),
        Err(RuntimeError::Unavailable(reason)) => {
            not_run.note(what, reason);
            Ok(None)
        }
        Err(e) => panic!("{what}: CUDA run failed: {e}"),
    }
}

/// The mirror kernel as a peer store from rank 0 into rank 1: every word lands bit for bit (the
/// selection is bits, never floats), the words beside the target keep their poison.
fn mirror_sel_moves_every_word_into_a_peer() -> Ran {
    let mut b = cuda_backend(2, CO_RESIDENT)?;
    let words: Vec<u32> = vec![0, 1, 7, 0x8000_0000, 0x7FC0_1234, 0xFF80_0001, 0x0000_0003, 0x3F80_0000, 0x7F80_0000, 41];
    let n = words.len();
    let src = Slice::new(b.alloc(0, n).unwrap(), 0, n);
    let dst_buf = b.alloc(1, n + 4).unwrap();
    b.write(0, src, &words.iter().map(|w| f32::from_bits(*w)).collect::<Vec<_>>()).unwrap();
    b.write(1, Slice::new(dst_buf, 0, n + 4), &vec![f32::from_bits(0xDEAD_BEEF); n + 4]).unwrap();
    let out = Slice::new(dst_buf, 2, n);
    capability::peer_stores(&mut b)
        .unwrap()
        .launch_peer_store(0, Op::MirrorSel { src, out }, 1, JoinFence::Events)
        .unwrap();
    let got: Vec<u32> = b.read(1, Slice::new(dst_buf, 0, n + 4)).unwrap().iter().map(|v| v.to_bits()).collect();
    assert_eq!(&got[2..2 + n], &words[..], "mirrored words");
    assert!(got[..2].iter().chain(&got[2 + n..]).all(|w| *w == 0xDEAD_BEEF), "beside the target: {got:x?}");
    assert_eq!(b.census().get("peer_store.mirror_sel"), Some(&1));
    Ok(())
}

/// SEL_MIRROR on `edge`: device = host oracle, device census = host census.
fn sel_mirror_runs(distinct: Option<usize>) -> Ran {
    let (where_, opts, sizes) = placements(distinct);
    let mut not_run = NotRun::new();
    for tp in sizes {
        for (name, doors) in [
            ("sel_mirror", DoorSet { sel_mirror: true, ..DoorSet::default() }),
            ("sel_mirror+step_ep+moe_direct", DoorSet { sel_mirror: true, step_ep: true, moe_direct: true, ..DoorSet::default() }),
        ] {
            let what = format!("TP{tp} {where_} {name}");
            let Some((r, _)) = cuda_run(tp, doors, opts, &what, &mut not_run)? else { continue };
            assert_eq!(oracle().first_digest_difference(&r), None, "{what}: device ≠ host oracle");
            assert_eq!(r.tokens, oracle().tokens, "{what}");
            assert_eq!(r.copy_faults, vec![], "{what}");
            let host = program::run(edge(), &config(tp, doors), &mut HostBackend::new(tp).unwrap()).unwrap();
            assert_eq!(r.census, host.census, "{what}: census");
            assert!(census(&r, "peer_store.mirror_sel") > 0, "{what}: no mirror");
            println!("ok {what}: {} mirrors", census(&r, "peer_store.mirror_sel"));
            not_run.ran();
        }
    }
    not_run.finish()
}

/// FENCE_RANK1 with MOE_DIRECT and FENCE_MEMOPS (and with STEP_EP's owner stores): device = host
/// oracle; per peer store one host-memory doorbell (the first fence) and one kernel doorbell.
fn fence_rank1_runs(distinct: Option<usize>) -> Ran {
    let doors = DoorSet { moe_direct: true, fence_memops: true, fence_rank1: true, ..DoorSet::default() };
    let (where_, opts, sizes) = placements(distinct);
    let mut not_run = NotRun::new();
    for tp in sizes {
        for (name, set) in [("moe_direct+fence_memops+fence_rank1", doors), ("+step_ep", DoorSet { step_ep: true, ..doors })] {
            let what = format!("TP{tp} {where_} {name}");
            let Some((r, b)) = cuda_run(tp, set, opts, &what, &mut not_run)? else { continue };
            if let Some(why) = b.doorbell_fallback() {
                panic!("{what}: doorbells fell back to events: {why}");
            }
            assert_eq!(oracle().first_digest_difference(&r), None, "{what}: device ≠ host oracle");
            assert_eq!(r.tokens, oracle().tokens, "{what}");
            // Every peer store of these door sets is MOE_DIRECT's.
            let stores: u64 = r.census.iter().filter(|(k, _)| k.starts_with("peer_store.")).map(|(_, v)| v).sum();
            assert!(stores > 0, "{what}: no MOE_DIRECT store");
            assert_eq!(census(&r, "kernel_doorbell"), stores, "{what}: kernel doorbells vs peer stores");
            assert_eq!(census(&r, "doorbell"), stores, "{what}: host-memory doorbells vs peer stores");
            assert_eq!(r.engaged.get("fence_rank1.kernel_doorbells"), Some(&stores), "{what}");
            println!("ok {what}: {stores} stores, {stores} kernel doorbells");
            not_run.ran();
        }
    }
    not_run.finish()
}

/// The race with the door on: the skip-fence canary (a peer's o_proj partials copied to the root
/// before their producer ran) with MOE_DIRECT + FENCE_MEMOPS + FENCE_RANK1 — the canary engages,
/// the kernel doorbells ring, and the race is caught: a copy fault, a divergence from the host
/// oracle, or two runs that differ.
fn skip_fence_caught_with_fence_rank1() -> Ran {
    let doors = DoorSet {
        moe_direct: true,
        fence_memops: true,
        fence_rank1: true,
        canary: Some(Canary::SkipFence),
        ..DoorSet::default()
    };
    let mut not_run = NotRun::new();
    for tp in [2, 4] {
        let what = format!("TP{tp} co-resident skip_fence+fence_rank1");
        let mut runs = Vec::new();
        for _ in 0..2 {
            let Some((r, _)) = cuda_run(tp, doors, CO_RESIDENT, &what, &mut not_run)? else { break };
            let unfenced: u64 = r.census.iter().filter(|(k, _)| k.starts_with("unfenced_copy.")).map(|(_, v)| v).sum();
            assert!(unfenced > 0, "{what}: the canary did not engage");
            assert!(census(&r, "kernel_doorbell") > 0, "{what}: the door did not engage");
            runs.push(r);
        }
        let [a, b] = &runs[..] else { continue };
        let caught = |r: &Record| !r.copy_faults.is_empty() || oracle().first_digest_difference(r).is_some();
        let differ = a.first_digest_difference(b).is_some() || a.tokens != b.tokens;
        assert!(caught(a) || caught(b) || differ, "{what}: the skipped fence was not caught (no copy fault, no divergence, both runs equal)");
        println!("ok {what}: copy faults {} / {}, differ {differ}", a.copy_faults.len(), b.copy_faults.len());
        not_run.ran();
    }
    not_run.finish()
}
