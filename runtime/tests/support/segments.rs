//! Test doubles around a real backend for the GRAPH door's program path.
//!
//! [`SegmentChecker`] forwards every call to the wrapped backend and runs everything eagerly, but
//! holds graph segments to the contract a capturing backend relies on: every pass of a segment
//! must issue the identical call sequence (launches, copies, digests, marks). It counts passes
//! and mismatches. With `freeze_position_after = Some(n)`, it also drops every `SetU32` after the
//! n-th, planting the defect a graph with a stale position would have. With
//! `drop_length_copies`, it drops every copy within a rank of at most one word per lane (the
//! per-layer KV length mirror copies; the program's other copies within a rank move whole rows), planting the defect of a LEN_MIRROR_LAZY that skipped them in a run whose
//! verify/prefill passes read the mirrors. With `swap_mirrored_slots`, every SEL_MIRROR mirror
//! of at least two words stores the selection's first two words swapped (a mirror that reorders
//! the slots). With `fences_as_events`, every peer store's fence is noted in `fences_seen` and
//! the wrapped backend is handed event fences (the host's stand-in for the CUDA-only doorbells,
//! so the program's choice of fence can be checked on the host).

#![allow(dead_code)] // the host tests and the CUDA tests each use a part

use memra_runtime::backend::{
    capability, AllReduce, Backend, BufId, Collected, DigestPart, Graphs, GroupEntry, GroupId, JoinFence, Op, Packed,
    PackedCopies, PeerStores, ProbeResult, Slice, Transfer, UnfencedCopies, WeightId, Witness,
};
use memra_runtime::evidence::census::Census;
use memra_runtime::evidence::coverage::{Coverage, SeamPoint};
use memra_runtime::evidence::defect::TwinDefect;
use memra_runtime::model::matrix::MatrixShard;
use memra_runtime::{Result, Transport};
use std::collections::HashMap;

pub struct SegmentChecker<B: Backend> {
    pub inner: B,
    recorded: HashMap<u64, Vec<String>>,
    open: Option<(u64, Vec<String>)>,
    /// Completed passes over all segments, and those whose calls differed from the first pass.
    pub passes: u64,
    pub mismatches: Vec<String>,
    pub freeze_position_after: Option<usize>,
    /// Pass segment calls on to the wrapped backend (a capturing backend) instead of only
    /// checking them.
    pub forward_segments: bool,
    /// Drop every copy within a rank of at most 8 words (module docs).
    pub drop_length_copies: bool,
    /// Swap the first two words of every SEL_MIRROR mirror (module docs).
    pub swap_mirrored_slots: bool,
    /// Note each peer store's fence and hand the wrapped backend events (module docs).
    pub fences_as_events: bool,
    pub fences_seen: Vec<JoinFence>,
    positions_set: usize,
}

impl<B: Backend> SegmentChecker<B> {
    pub fn new(inner: B) -> SegmentChecker<B> {
        SegmentChecker {
            inner,
            recorded: HashMap::new(),
            open: None,
            passes: 0,
            mismatches: Vec::new(),
            freeze_position_after: None,
            forward_segments: false,
            drop_length_copies: false,
            swap_mirrored_slots: false,
            fences_as_events: false,
            fences_seen: Vec::new(),
            positions_set: 0,
        }
    }

    fn note(&mut self, sig: String) {
        if let Some((_, calls)) = &mut self.open {
            calls.push(sig);
        }
    }
}

impl<B: Backend> Backend for SegmentChecker<B> {
    fn describe(&self) -> String {
        format!("segment-checked {}", self.inner.describe())
    }
    fn ranks(&self) -> usize {
        self.inner.ranks()
    }
    fn upload_weight(&mut self, rank: usize, shard: &MatrixShard) -> Result<WeightId> {
        self.inner.upload_weight(rank, shard)
    }
    fn alloc(&mut self, rank: usize, len: usize) -> Result<BufId> {
        self.inner.alloc(rank, len)
    }
    fn write(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()> {
        assert!(self.open.is_none() || self.forward_segments, "host write inside a graph segment");
        self.inner.write(rank, dst, data)
    }
    fn read(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>> {
        assert!(self.open.is_none(), "host read inside a graph segment");
        self.inner.read(rank, src)
    }
    fn launch(&mut self, rank: usize, op: Op) -> Result<()> {
        if let Op::SetU32 { .. } = op {
            self.positions_set += 1;
            if self.freeze_position_after.is_some_and(|n| self.positions_set > n * self.inner.ranks()) {
                return Ok(());
            }
        }
        self.note(format!("launch r{rank} {op:?}"));
        self.inner.launch(rank, op)
    }
    fn copy(&mut self, c: Transfer) -> Result<()> {
        if self.drop_length_copies && c.from.0 == c.to.0 && c.from.1.len <= 8 {
            return Ok(());
        }
        self.note(format!("copy {c:?}"));
        self.inner.copy(c)
    }
    fn digest(&mut self, rank: usize, src: Slice, base: u64) -> Result<usize> {
        let t = self.inner.digest(rank, src, base)?;
        self.note(format!("digest r{rank} {src:?} {base}"));
        Ok(t)
    }
    fn digest_batch(&mut self, rank: usize, groups: &[Vec<DigestPart>]) -> Result<Vec<Vec<usize>>> {
        let t = self.inner.digest_batch(rank, groups)?;
        self.note(format!("digest batch r{rank} {groups:?}"));
        Ok(t)
    }
    fn register_experts(&mut self, rank: usize, experts: usize, entries: &[Option<GroupEntry>]) -> Result<GroupId> {
        self.inner.register_experts(rank, experts, entries)
    }
    fn mark(&mut self) -> Result<()> {
        self.note("mark".into());
        self.inner.mark()
    }
    fn collect(&mut self) -> Result<Collected> {
        assert!(self.open.is_none(), "collect inside a graph segment");
        self.inner.collect()
    }
    fn probe(&mut self, t: Transport, sizes: &[usize]) -> Result<Vec<ProbeResult>> {
        self.inner.probe(t, sizes)
    }
    fn unfenced_copies(&mut self) -> Option<&mut dyn UnfencedCopies> {
        self.inner.unfenced_copies().is_some().then_some(self as &mut dyn UnfencedCopies)
    }
    fn peer_stores(&mut self) -> Option<&mut dyn PeerStores> {
        self.inner.peer_stores().is_some().then_some(self as &mut dyn PeerStores)
    }
    fn packed_copies(&mut self) -> Option<&mut dyn PackedCopies> {
        self.inner.packed_copies().is_some().then_some(self as &mut dyn PackedCopies)
    }
    fn all_reduce(&mut self) -> Option<&mut dyn AllReduce> {
        self.inner.all_reduce().is_some().then_some(self as &mut dyn AllReduce)
    }
    /// Always: segments are checked here, and forwarded only when asked to.
    fn graphs(&mut self) -> Option<&mut dyn Graphs> {
        Some(self)
    }
}

impl<B: Backend> Witness for SegmentChecker<B> {
    fn census(&self) -> Census {
        self.inner.census()
    }
    fn plant(&mut self, d: TwinDefect) -> Result<()> {
        self.inner.plant(d)
    }
    fn coverage(&mut self) -> Result<Option<Coverage>> {
        self.inner.coverage()
    }
    fn note_position(&mut self, at: SeamPoint) {
        self.inner.note_position(at)
    }
    fn engagement(&self) -> Vec<(String, u64)> {
        self.inner.engagement()
    }
    fn build_options(&self) -> Vec<String> {
        self.inner.build_options()
    }
}

impl<B: Backend> UnfencedCopies for SegmentChecker<B> {
    fn copy_unfenced(&mut self, c: Transfer) -> Result<()> {
        self.note(format!("unfenced {c:?}"));
        capability::unfenced_copies(&mut self.inner)?.copy_unfenced(c)
    }
}

impl<B: Backend> PeerStores for SegmentChecker<B> {
    fn launch_peer_store(&mut self, rank: usize, op: Op, out_rank: usize, fence: JoinFence) -> Result<()> {
        self.note(format!("peer store r{rank} {op:?} r{out_rank} {fence:?}"));
        let fence = if self.fences_as_events {
            self.fences_seen.push(fence);
            JoinFence::Events
        } else {
            fence
        };
        let stores = capability::peer_stores(&mut self.inner)?;
        match op {
            Op::MirrorSel { src, out } if self.swap_mirrored_slots && src.len >= 2 => {
                let word = |s: Slice, i: usize| s.sub(i, 1);
                stores.launch_peer_store(
                    rank,
                    Op::MirrorSel { src: word(src, 0), out: word(out, 1) },
                    out_rank,
                    fence,
                )?;
                stores.launch_peer_store(
                    rank,
                    Op::MirrorSel { src: word(src, 1), out: word(out, 0) },
                    out_rank,
                    fence,
                )?;
                let rest = src.len - 2;
                stores.launch_peer_store(
                    rank,
                    Op::MirrorSel { src: src.sub(2, rest), out: out.sub(2, rest) },
                    out_rank,
                    fence,
                )
            }
            op => stores.launch_peer_store(rank, op, out_rank, fence),
        }
    }
}

impl<B: Backend> PackedCopies for SegmentChecker<B> {
    fn copy_packed(&mut self, t: Transport, sr: usize, dr: usize, p: Packed) -> Result<()> {
        self.note(format!("packed {t:?} r{sr} r{dr} {p:?}"));
        capability::packed_copies(&mut self.inner)?.copy_packed(t, sr, dr, p)
    }
}

impl<B: Backend> AllReduce for SegmentChecker<B> {
    fn all_reduce_sum(&mut self, parts: &[(usize, Slice)], out_rank: usize, out: Slice) -> Result<()> {
        self.note(format!("all-reduce {parts:?} r{out_rank} {out:?}"));
        capability::all_reduce(&mut self.inner)?.all_reduce_sum(parts, out_rank, out)
    }
}

impl<B: Backend> Graphs for SegmentChecker<B> {
    fn segment_begin(&mut self, key: u64) -> Result<()> {
        assert!(self.open.is_none(), "segment {key} opened inside another");
        self.open = Some((key, Vec::new()));
        if self.forward_segments {
            capability::graphs(&mut self.inner)?.segment_begin(key)?;
        }
        Ok(())
    }
    fn segment_end(&mut self) -> Result<()> {
        let (key, calls) = self.open.take().expect("segment end without begin");
        match self.recorded.get(&key) {
            None => {
                self.recorded.insert(key, calls);
            }
            Some(first) if *first != calls => {
                let at = first.iter().zip(&calls).position(|(a, b)| a != b).unwrap_or(first.len().min(calls.len()));
                self.mismatches.push(format!(
                    "segment {key} call #{at}: first pass {:?}, this pass {:?}",
                    first.get(at),
                    calls.get(at)
                ));
            }
            Some(_) => {}
        }
        self.passes += 1;
        if self.forward_segments {
            capability::graphs(&mut self.inner)?.segment_end()?;
        }
        Ok(())
    }
    fn segment_abort(&mut self) {
        self.open = None;
        if self.forward_segments {
            if let Some(g) = self.inner.graphs() {
                g.segment_abort();
            }
        }
    }
}
