//! The distributed wrapper on CPU: N "processes" are threads, each holding its block of host
//! ranks behind a [`DistBackend`] with the in-memory mover; their records must equal a
//! single-process run bit for bit, and a mover that changes one word must make them differ.

use super::memory::{MemoryHub, MemoryMover, Tamper};
use super::*;
use crate::backend::host::HostBackend;
use crate::evidence::census::Census;
use crate::evidence::defect::TwinDefect;
use crate::evidence::record::{CaptureKey, Record, Seam};
use crate::model::{gen::generate, Model, ModelConfig};
use crate::{program, Battery, RunConfig};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| generate(&ModelConfig::preset("tiny", None).unwrap(), 7).unwrap())
}

fn config(tp: usize) -> RunConfig {
    let battery = Battery { prompts: vec![vec![3, 141, 59], vec![26, 535]], gen_tokens: 3 };
    let mut cfg = RunConfig::new(tp, Transport::HostBounce, battery).unwrap();
    // A full capture reads every part of a seam from its owner (broadcasts from every rank).
    cfg.capture = vec![
        CaptureKey { prompt: 0, step: 1, layer: 0, seam: Seam::OProj },
        CaptureKey { prompt: 1, step: 2, layer: 1, seam: Seam::Experts },
    ];
    cfg
}

fn single(tp: usize) -> Record {
    let mut b = HostBackend::new(tp).unwrap();
    program::run(tiny(), &config(tp), &mut b).unwrap()
}

/// Run TP `tp` over `n` thread-processes; `tamper` (if any) goes to process 0's mover.
fn spread(tp: usize, n: usize, mut tamper: Option<Tamper>) -> Vec<Result<Record>> {
    let hub = MemoryHub::new();
    let handles: Vec<_> = (0..n)
        .map(|p| {
            let hub: Arc<MemoryHub> = hub.clone();
            let tamper = if p == 0 { tamper.take() } else { None };
            std::thread::spawn(move || {
                let layout = ProcessLayout::new(tp, ProcessSpec { process: p, processes: n }).unwrap();
                let inner = HostBackend::new(layout.ranks_per_process())?;
                let mut mover = MemoryMover::new(hub, layout, Duration::from_secs(60));
                if let Some(t) = tamper {
                    mover = mover.tampering(t);
                }
                let mut b = DistBackend::new(layout, inner, mover, None)?;
                program::run(tiny(), &config(tp), &mut b)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("a process thread panicked")).collect()
}

fn assert_same(tp: usize, n: usize, want: &Record, got: &Record, p: usize) {
    let what = format!("TP{tp} over {n} processes, process {p}");
    assert_eq!(got.digests, want.digests, "{what}: seam digests");
    assert_eq!(got.tokens, want.tokens, "{what}: token tape");
    let bits = |r: &Record| r.top2.iter().flatten().map(|(a, b)| (a.to_bits(), b.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(got), bits(want), "{what}: top-2 logits");
    assert_eq!(got.engaged, want.engaged, "{what}: engagement");
    // The census counted at the program's calls in every process is the single process's.
    assert_eq!(got.census, want.census, "{what}: census");
    assert_eq!(
        (got.copies_verified, &got.copy_faults),
        (want.copies_verified, &want.copy_faults),
        "{what}: copy checks"
    );
    assert_eq!(got.rank_digests, want.rank_digests, "{what}: per-rank digest shares");
    assert_eq!(got.captures, want.captures, "{what}: captures");
    assert_eq!(
        got.timings_ns.iter().map(|t| t.len()).collect::<Vec<_>>(),
        want.timings_ns.iter().map(|t| t.len()).collect::<Vec<_>>(),
        "{what}: timing samples"
    );
}

#[test]
fn every_process_records_exactly_the_single_process_run() {
    for (tp, n) in [(2, 2), (4, 2), (8, 4), (4, 1)] {
        let want = single(tp);
        assert!(!want.captures.is_empty() && want.tokens.iter().all(|t| t.len() == 3));
        for (p, got) in spread(tp, n, None).into_iter().enumerate() {
            let got = got.unwrap_or_else(|e| panic!("TP{tp} over {n}, process {p}: {e}"));
            assert_same(tp, n, &want, &got, p);
            assert!(got.backend.contains(&format!("process {p}/{n}")), "{}", got.backend);
        }
    }
}

#[test]
fn a_mover_that_corrupts_one_word_makes_the_records_differ() {
    let want = single(2);
    // Flip the lowest bit of word 5 of the 10th cross-process copy process 0 sends.
    let tamper: Tamper = Box::new(|n, words| {
        if n == 9 {
            words[5] ^= 1;
        }
    });
    let got = spread(2, 2, Some(tamper));
    for (p, r) in got.into_iter().enumerate() {
        let r = r.unwrap();
        assert_ne!(r.digests, want.digests, "process {p}: the corrupted word must show in the digests");
        // And the copy check names the copy that carried it (its destination differs from its
        // source), in every process.
        let f = r.copy_faults.first().unwrap_or_else(|| panic!("process {p}: no copy fault"));
        assert_eq!((f.src_rank, f.dst_rank), (0, 1), "process {p}: {f:?}");
        // Both processes see the same (wrong) record: the digests come from one collective.
        let first = want.digests.iter().flatten().zip(r.digests.iter().flatten()).position(|(a, b)| a != b);
        assert!(first.is_some(), "process {p}");
    }
}

#[test]
fn ids_of_remote_work_match_the_owners() {
    let layout = ProcessLayout::new(4, ProcessSpec { process: 1, processes: 2 }).unwrap();
    let mover = MemoryMover::new(MemoryHub::new(), layout, Duration::from_millis(10));
    let mut b = DistBackend::new(layout, HostBackend::new(2).unwrap(), mover, None).unwrap();
    // Rank 0 is remote, rank 2 local: both count buffers from 0 in program order.
    assert_eq!(b.alloc(0, 8).unwrap(), 0);
    assert_eq!(b.alloc(2, 8).unwrap(), 0);
    assert_eq!(b.alloc(0, 8).unwrap(), 1);
    assert_eq!(b.alloc(2, 4).unwrap(), 1);
    assert_eq!(b.alloc(3, 4).unwrap(), 0);
    assert!(b.alloc(4, 4).unwrap_err().to_string().contains("rank 4 does not exist: this run has TP4"));
    // Remote-to-remote copies are nobody's business here; a receive with no sender times out
    // naming the process, the call and the ranks.
    b.copy(Transfer::new(Transport::Nccl, (0, Slice::new(0, 0, 8)), (1, Slice::new(0, 0, 8)))).unwrap();
    let e = b
        .copy(Transfer::new(Transport::Nccl, (0, Slice::new(0, 0, 4)), (2, Slice::new(1, 0, 4))))
        .unwrap_err()
        .to_string();
    assert!(e.contains("process 1/2, recv on rank 0 → rank 2"), "{e}");
    let e = b.all_reduce_sum(&[], 0, Slice::new(0, 0, 1)).unwrap_err();
    assert!(
        matches!(&e, RuntimeError::Unsupported { mechanism: "MEMRA_NCCL_ALLREDUCE (NCCL's own all-reduce)", .. }),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("not available across processes"), "{e}");
    assert_eq!(b.ranks(), 4);
}

#[test]
fn an_inner_backend_of_the_wrong_size_is_refused() {
    let layout = ProcessLayout::new(4, ProcessSpec { process: 0, processes: 2 }).unwrap();
    let mover = MemoryMover::new(MemoryHub::new(), layout, Duration::from_millis(10));
    let e = DistBackend::new(layout, HostBackend::new(4).unwrap(), mover, None).err().unwrap().to_string();
    assert!(e.contains("the inner backend has 4 ranks, the layout gives this process 2"), "{e}");
}

/// A host backend that reports a backend-counted mechanism the way the CUDA backend reports
/// RANK0_MERGE: only the process holding global rank 0 has it, and counts its rank 0 launches.
struct Rank0Counting {
    inner: HostBackend,
    counts: bool,
    launches: u64,
}

impl Backend for Rank0Counting {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn ranks(&self) -> usize {
        self.inner.ranks()
    }
    fn upload_weight(&mut self, rank: usize, shard: &crate::model::matrix::MatrixShard) -> Result<WeightId> {
        self.inner.upload_weight(rank, shard)
    }
    fn alloc(&mut self, rank: usize, len: usize) -> Result<BufId> {
        self.inner.alloc(rank, len)
    }
    fn write(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()> {
        self.inner.write(rank, dst, data)
    }
    fn read(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>> {
        self.inner.read(rank, src)
    }
    fn launch(&mut self, rank: usize, op: crate::backend::Op) -> Result<()> {
        self.launches += u64::from(self.counts && rank == 0);
        self.inner.launch(rank, op)
    }
    fn copy(&mut self, c: Transfer) -> Result<()> {
        self.inner.copy(c)
    }
    fn digest(&mut self, rank: usize, src: Slice, base: u64) -> Result<usize> {
        self.inner.digest(rank, src, base)
    }
    fn digest_batch(&mut self, rank: usize, groups: &[Vec<crate::backend::DigestPart>]) -> Result<Vec<Vec<usize>>> {
        self.inner.digest_batch(rank, groups)
    }
    fn register_experts(
        &mut self,
        rank: usize,
        experts: usize,
        entries: &[Option<crate::backend::GroupEntry>],
    ) -> Result<crate::backend::GroupId> {
        self.inner.register_experts(rank, experts, entries)
    }
    fn mark(&mut self) -> Result<()> {
        self.inner.mark()
    }
    fn collect(&mut self) -> Result<Collected> {
        self.inner.collect()
    }
    fn probe(&mut self, t: Transport, sizes: &[usize]) -> Result<Vec<crate::backend::ProbeResult>> {
        self.inner.probe(t, sizes)
    }
}

impl Witness for Rank0Counting {
    fn census(&self) -> Census {
        self.inner.census()
    }
    fn plant(&mut self, d: TwinDefect) -> Result<()> {
        self.inner.plant(d)
    }
    fn engagement(&self) -> Vec<(String, u64)> {
        if self.counts {
            vec![("rank0_merge.merged_launches".to_string(), self.launches)]
        } else {
            Vec::new()
        }
    }
}

#[test]
fn backend_counted_engagement_is_the_whole_launchs_in_every_process() {
    let (tp, n) = (4, 2);
    let mut one = Rank0Counting { inner: HostBackend::new(tp).unwrap(), counts: true, launches: 0 };
    let want = program::run(tiny(), &config(tp), &mut one).unwrap();
    let want_n = want.engaged.get("rank0_merge.merged_launches").copied();
    assert!(want_n.is_some_and(|n| n > 0), "{:?}", want.engaged);
    let hub = MemoryHub::new();
    let handles: Vec<_> = (0..n)
        .map(|p| {
            let hub: Arc<MemoryHub> = hub.clone();
            std::thread::spawn(move || {
                let layout = ProcessLayout::new(tp, ProcessSpec { process: p, processes: n }).unwrap();
                let inner = HostBackend::new(layout.ranks_per_process())?;
                let inner = Rank0Counting { inner, counts: p == 0, launches: 0 };
                let mover = MemoryMover::new(hub, layout, Duration::from_secs(60));
                let mut b = DistBackend::new(layout, inner, mover, None)?;
                program::run(tiny(), &config(tp), &mut b)
            })
        })
        .collect();
    for (p, h) in handles.into_iter().enumerate() {
        let got = h.join().expect("a process thread panicked").unwrap();
        // Process 1 launched nothing on global rank 0, yet its record must not read VOID.
        assert_eq!(got.engaged.get("rank0_merge.merged_launches").copied(), want_n, "process {p}");
        assert_eq!(got.digests, want.digests, "process {p}");
    }
}

#[test]
fn a_run_over_processes_is_refused_without_the_binarys_overrun_hook() {
    // No test of this crate installs the hook. Without it nothing could end a process whose NCCL
    // call hangs, so the run must be refused before any work (the rendezvous directory is never
    // read: it does not exist).
    assert!(watchdog::overrun_hook().is_none());
    let spec = ProcessSpec::parse("0/2").unwrap();
    let mut rendezvous = Rendezvous::new("/nonexistent/memra-rendezvous", spec, "plan", Duration::from_secs(1));
    let e = crate::backend::open_distributed(2, &mut rendezvous, &Default::default()).err().expect("refused");
    assert!(matches!(&e, RuntimeError::Contract(m) if m.contains("overrun hook")), "{e:?}");
}
