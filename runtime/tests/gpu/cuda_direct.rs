//! The CUDA mechanisms of the direct joins and their companions, on a device:
//! - OPROJ_DIRECT / MOE_DIRECT peer stores: runs bit-identical to the CUDA TP1 record, co-resident
//!   and (with ≥ 2 GPUs) on distinct devices, with the same peer-store counts as the host;
//! - BULK_P2P: one packed copy moves exactly the blocks (poisoned destination, hashed pattern,
//!   the gaps between blocks untouched) and is counted by the backend only with ≥ 2 blocks; a
//!   bulk run is bit-identical with the packed copies the shapes imply;
//! - FENCE_MEMOPS: a run with doorbells is bit-identical and rings two per peer store (a fallback
//!   to events is reported as a failure, with the driver's reason).
//!
//! Without a CUDA device every test reads `ignored (no CUDA device: …)`; with
//! `MEMRA_REQUIRE_GPU=1` that is a failure. The distinct-device cases are registered per device
//! count (`…::on_4_devices`) and read `ignored (needs 4 devices, 2 present)` on a smaller machine
//! (`harness.rs` says when that is a failure).

use crate::cases::CO_RESIDENT;
use crate::harness::{cuda_backend, GpuTest, NotRun, Ran, Skip};
use memra_kernels::twins::digest::splitmix64;
use memra_runtime::config::Tp;
use memra_runtime::backend::cuda::{CudaBackend, CudaOptions, PlacementPolicy};
use memra_runtime::backend::host::HostBackend;
use memra_runtime::backend::{Backend, Packed, PackedCopies, Slice, Witness};
use memra_runtime::model::{gen::generate, Model, ModelConfig};
use memra_runtime::program::placement::Placement;
use memra_runtime::evidence::record::{Record, Seam};
use memra_runtime::{program, Battery, DoorSet, RunConfig, RuntimeError, Transport};
use std::sync::OnceLock;

/// Every test of this file; the distinct-device cases once per device count.
pub fn tests() -> Vec<GpuTest> {
    let mut t = vec![
        GpuTest::new("peer_store_runs_equal_tp1_co_resident", peer_store_runs_equal_tp1_co_resident),
        GpuTest::new(
            "packed_copy_moves_exactly_the_blocks_and_leaves_the_gaps",
            packed_copy_moves_exactly_the_blocks_and_leaves_the_gaps,
        ),
        GpuTest::new(
            "packed_copy_moves_exactly_the_blocks_and_leaves_the_gaps::on_2_devices",
            packed_copy_on_distinct_devices,
        )
        .needs_devices(2),
        GpuTest::new("bulk_p2p_runs_equal_tp1_and_count_the_packed_copies_of_the_shapes", || bulk_p2p_runs(None)),
        GpuTest::new("fence_memops_runs_equal_tp1_and_ring_two_doorbells_per_peer_store", || fence_memops_runs(None)),
    ];
    for (name, body) in [
        ("peer_store_runs_equal_tp1_on_distinct_devices", peer_store_runs_on_distinct_devices as fn(usize) -> Ran),
        ("bulk_p2p_runs_equal_tp1_and_count_the_packed_copies_of_the_shapes", |tp| bulk_p2p_runs(Some(tp))),
        ("fence_memops_runs_equal_tp1_and_ring_two_doorbells_per_peer_store", |tp| fence_memops_runs(Some(tp))),
    ] {
        t.extend(GpuTest::per_device_count(name, &[2, 4, 8], body));
    }
    t
}

const DISTINCT: CudaOptions = CudaOptions { placement: PlacementPolicy::Auto, ..CO_RESIDENT };

fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap())
}

fn battery() -> Battery {
    Battery { prompts: vec![vec![3, 1, 4, 1], vec![5, 9]], gen_tokens: 3 }
}

fn steps() -> u64 {
    let b = battery();
    (0..b.prompts.len()).map(|p| b.steps_of(p) as u64).sum()
}

fn config(tp: usize, doors: DoorSet) -> RunConfig {
    let mut cfg = RunConfig::new(tp, Transport::NativeP2p, battery()).unwrap();
    cfg.doors = doors;
    cfg
}

/// The CUDA TP1 record of the battery (every door at default), or why it cannot be made.
fn cuda_tp1() -> Result<&'static Record, Skip> {
    static TP1: OnceLock<Record> = OnceLock::new();
    if let Some(r) = TP1.get() {
        return Ok(r);
    }
    let mut b = cuda_backend(1, CO_RESIDENT)?;
    let r = program::run(tiny(), &config(1, DoorSet::default()), &mut b).expect("CUDA TP1 run");
    Ok(TP1.get_or_init(|| r))
}

fn first_diff(a: &Record, b: &Record) -> Option<String> {
    for (p, (ra, rb)) in a.digests.iter().zip(&b.digests).enumerate() {
        for (s, (da, db)) in ra.iter().zip(rb).enumerate() {
            if let Some(i) = da.iter().zip(db).position(|(x, y)| x != y) {
                let (l, seam): (usize, Seam) = Record::seam_at(a.n_layers, i);
                return Some(format!("prompt {p} step {s} layer {l} {}", seam.name()));
            }
        }
    }
    (a.tokens != b.tokens).then(|| "token tapes differ".to_string())
}

fn counter(r: &Record, name: &str) -> u64 {
    r.engaged.get(name).copied().unwrap_or(0)
}

/// Run `doors` at `tp` on CUDA with `opts` and on the host; check CUDA = CUDA TP1 bit for bit and
/// that the peer-store counters equal the host's (which the host tests pin to the shapes).
/// Returns the CUDA record and backend, or None after noting a run the machine cannot make.
fn check_direct_run(
    tp: usize,
    doors: DoorSet,
    opts: CudaOptions,
    what: &str,
    not_run: &mut NotRun,
) -> Result<Option<(Record, CudaBackend)>, Skip> {
    let base = cuda_tp1()?;
    let mut b = cuda_backend(tp, opts)?;
    let r = match program::run(tiny(), &config(tp, doors), &mut b) {
        Ok(r) => r,
        Err(RuntimeError::Unavailable(reason)) => {
            // A device pair without peer access: native-p2p runs are SKIPPED, never passed.
            not_run.note(what, reason);
            return Ok(None);
        }
        Err(e) => panic!("{what}: CUDA run failed: {e}"),
    };
    if let Some(d) = first_diff(base, &r) {
        panic!("{what} ({}): differs from CUDA TP1 at {d}", b.describe());
    }
    // The host has the peer stores but not the CUDA-only doors (NOT-APPLICABLE there).
    let host_doors = DoorSet { fence_memops: false, bulk_p2p: false, ..doors };
    let host = program::run(tiny(), &config(tp, host_doors), &mut HostBackend::new(tp).unwrap()).unwrap();
    for c in ["oproj_direct.peer_stores", "moe_direct.peer_stores", "oproj_tail.fused_joins"] {
        assert_eq!(counter(&r, c), counter(&host, c), "{what}: `{c}` on CUDA vs host");
    }
    for (on, c) in [(doors.oproj_direct, "oproj_direct.peer_stores"), (doors.moe_direct, "moe_direct.peer_stores")] {
        assert!(!on || counter(&r, c) > 0, "{what}: door on but `{c}` is 0");
    }
    not_run.ran();
    Ok(Some((r, b)))
}

fn direct_sets() -> Vec<(&'static str, DoorSet)> {
    vec![
        ("oproj_direct+oproj_tail", DoorSet { oproj_direct: true, oproj_tail: true, ..DoorSet::default() }),
        ("moe_direct", DoorSet { moe_direct: true, ..DoorSet::default() }),
        (
            "oproj_direct+oproj_tail+moe_direct",
            DoorSet { oproj_direct: true, oproj_tail: true, moe_direct: true, ..DoorSet::default() },
        ),
        ("step_ep+moe_direct", DoorSet { step_ep: true, moe_direct: true, ..DoorSet::default() }),
    ]
}

// ---------------------------------------------------------------- peer stores

fn peer_store_runs_equal_tp1_co_resident() -> Ran {
    let mut not_run = NotRun::new();
    for tp in [2, 4, 8] {
        for (name, doors) in direct_sets() {
            let what = format!("TP{tp} co-resident {name}");
            if check_direct_run(tp, doors, CO_RESIDENT, &what, &mut not_run)?.is_some() {
                println!("ok {what}");
            }
        }
    }
    not_run.finish()
}

/// TP`tp` with one rank per device (registered per device count).
fn peer_store_runs_on_distinct_devices(tp: usize) -> Ran {
    let mut not_run = NotRun::new();
    for (name, doors) in direct_sets() {
        let what = format!("TP{tp} distinct devices {name}");
        if let Some((_, b)) = check_direct_run(tp, doors, DISTINCT, &what, &mut not_run)? {
            assert!(!b.co_resident(), "{what}: expected one device per rank, got {}", b.describe());
            println!("ok {what}");
        }
    }
    not_run.finish()
}

// ---------------------------------------------------------------- bulk packed copies

/// One packed copy of `blocks` blocks from rank 1 to rank 0 (and rank 0 to itself), with
/// distinct pitches and offsets on both sides: every block lands, every gap keeps its poison.
fn check_packed(b: &mut CudaBackend, src_rank: usize, dst_rank: usize, len: usize, blocks: usize, what: &str) {
    const POISON: u32 = 0xDEAD_BEEF;
    let (src_pitch, dst_pitch, src_off, dst_off) = (len + 37, len + 129, 11, 5);
    let src_n = src_off + src_pitch * blocks + 7;
    let dst_n = dst_off + dst_pitch * blocks + 13;
    let src_buf = b.alloc(src_rank, src_n).unwrap();
    let dst_buf = b.alloc(dst_rank, dst_n).unwrap();
    let word = |i: usize| splitmix64(((src_rank as u64) << 40) ^ ((len as u64) << 8) ^ i as u64) as u32;
    let pattern: Vec<f32> = (0..src_n).map(|i| f32::from_bits(word(i))).collect();
    b.write(src_rank, Slice::new(src_buf, 0, src_n), &pattern).unwrap();
    b.write(dst_rank, Slice::new(dst_buf, 0, dst_n), &vec![f32::from_bits(POISON); dst_n]).unwrap();
    let before = counter_of(b);
    let p = Packed {
        src: Slice::new(src_buf, src_off, len),
        src_pitch,
        dst: Slice::new(dst_buf, dst_off, len),
        dst_pitch,
        blocks,
    };
    b.copy_packed(Transport::NativeP2p, src_rank, dst_rank, p).unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = b.read(dst_rank, Slice::new(dst_buf, 0, dst_n)).unwrap();
    let mut bad = Vec::new();
    for (i, v) in got.iter().enumerate() {
        let rel = i.checked_sub(dst_off);
        let want = match rel {
            Some(r) if r / dst_pitch < blocks && r % dst_pitch < len => {
                word(src_off + r / dst_pitch * src_pitch + r % dst_pitch)
            }
            _ => POISON,
        };
        if v.to_bits() != want {
            bad.push(i);
        }
    }
    assert!(bad.is_empty(), "{what}: {} wrong words, first at {}", bad.len(), bad[0]);
    let counted = counter_of(b) - before;
    assert_eq!(counted, u64::from(blocks >= 2), "{what}: bulk_p2p.packed_copies counted {counted}");
}

fn counter_of(b: &CudaBackend) -> u64 {
    b.engagement().into_iter().find(|(n, _)| n == "bulk_p2p.packed_copies").map(|(_, v)| v).unwrap_or(0)
}

fn packed_copy_moves_exactly_the_blocks_and_leaves_the_gaps() -> Ran {
    let mut b = cuda_backend(2, CO_RESIDENT)?;
    for (len, blocks) in [(1, 2), (1000, 3), (16 << 10, 5), (1 << 18, 2), (777, 1)] {
        check_packed(&mut b, 1, 0, len, blocks, &format!("co-resident 1→0 len {len} × {blocks}"));
        check_packed(&mut b, 0, 0, len, blocks, &format!("same rank 0→0 len {len} × {blocks}"));
    }
    // Not over other transports: the door is a device-to-device copy.
    let s = Slice::new(b.alloc(1, 8).unwrap(), 0, 4);
    let d = Slice::new(b.alloc(0, 8).unwrap(), 0, 4);
    let p = Packed { src: s, src_pitch: 4, dst: d, dst_pitch: 4, blocks: 2 };
    assert!(b.copy_packed(Transport::HostBounce, 1, 0, p).is_err());
    // A span past its buffer is refused before anything is queued.
    let p = Packed { blocks: 3, ..p };
    assert!(b.copy_packed(Transport::NativeP2p, 1, 0, p).unwrap_err().to_string().contains("exceeds"));
    Ok(())
}

/// The packed copies between two devices, both directions (registered as needing 2 devices).
fn packed_copy_on_distinct_devices() -> Ran {
    let mut b = cuda_backend(2, DISTINCT)?;
    for (len, blocks) in [(1, 2), (1000, 3), (16 << 10, 5), (1 << 18, 2)] {
        check_packed(&mut b, 1, 0, len, blocks, &format!("distinct devices 1→0 len {len} × {blocks}"));
        check_packed(&mut b, 0, 1, len, blocks, &format!("distinct devices 0→1 len {len} × {blocks}"));
    }
    Ok(())
}

/// Packed copies one bulk run must make: per step, layer and peer rank, one per run of ≥ 2
/// consecutive TP-sharded slots of equal G (the shapes of the tiny preset give one run of every
/// slot). The root's own partials are written in place (its expert partials buffer is the root's
/// `epart_all`), so rank 0 has nothing to copy.
fn expected_packed(tp: usize, doors: &DoorSet) -> u64 {
    let m = tiny();
    let p = Placement::new(m, Tp::new(tp).unwrap(), doors, false).unwrap();
    let k = m.config.top_k;
    let runs =
        if p.shared_sharded && p.down_kblocks == p.shared_kblocks { u64::from(k + 1 >= 2) } else { u64::from(k >= 2) };
    steps() * m.layers.len() as u64 * (tp as u64 - 1) * runs
}

/// BULK_P2P runs equal CUDA TP1 and make exactly the packed copies the shapes imply: co-resident
/// at TP2/4/8 (`distinct: None`), or at TP`tp` with one rank per device (`Some(tp)`).
fn bulk_p2p_runs(distinct: Option<usize>) -> Ran {
    let doors = DoorSet { bulk_p2p: true, ..DoorSet::default() };
    let (where_, opts, sizes) = placements(distinct);
    for tp in sizes {
        let what = format!("TP{tp} {where_} bulk_p2p");
        let base = cuda_tp1()?;
        let mut b = cuda_backend(tp, opts)?;
        let r = program::run(tiny(), &config(tp, doors), &mut b).unwrap_or_else(|e| panic!("{what}: {e}"));
        if let Some(d) = first_diff(base, &r) {
            panic!("{what}: differs from CUDA TP1 at {d}");
        }
        let want = expected_packed(tp, &doors);
        assert!(want > 0, "{what}: the shapes give nothing to pack; the test would prove nothing");
        assert_eq!(counter(&r, "bulk_p2p.packed_copies"), want, "{what}: packed copies");
        println!("ok {what}: {want} packed copies");
    }
    Ok(())
}

/// Co-resident ranks at every TP size, or one rank per device at TP`tp`.
fn placements(distinct: Option<usize>) -> (&'static str, CudaOptions, Vec<usize>) {
    match distinct {
        None => ("co-resident", CO_RESIDENT, vec![2, 4, 8]),
        Some(tp) => ("distinct devices", DISTINCT, vec![tp]),
    }
}

// ---------------------------------------------------------------- doorbells

/// FENCE_MEMOPS runs equal CUDA TP1 and ring two doorbells per peer store (placements as in
/// [`bulk_p2p_runs`]).
fn fence_memops_runs(distinct: Option<usize>) -> Ran {
    let doors = DoorSet { moe_direct: true, fence_memops: true, ..DoorSet::default() };
    let ep = DoorSet { step_ep: true, ..doors };
    let (where_, opts, sizes) = placements(distinct);
    let mut not_run = NotRun::new();
    for tp in sizes {
        for (name, set) in [("moe_direct+fence_memops", doors), ("step_ep+moe_direct+fence_memops", ep)] {
            let what = format!("TP{tp} {where_} {name}");
            let Some((r, b)) = check_direct_run(tp, set, opts, &what, &mut not_run)? else { continue };
            if let Some(why) = b.doorbell_fallback() {
                panic!("{what}: doorbells fell back to events: {why}");
            }
            let stores = counter(&r, "moe_direct.peer_stores");
            let bells = counter(&r, "fence_memops.doorbells");
            assert!(bells > 0, "{what}: no doorbell rung (the run would be VOID)");
            assert_eq!(bells, 2 * stores, "{what}: doorbells vs peer stores ({stores})");
            println!("ok {what}: {bells} doorbells");
        }
    }
    not_run.finish()
}
