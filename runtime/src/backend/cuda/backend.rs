//! The [`Backend`] trait on CUDA ranks: every call checked first, then issued on the rank's
//! stream (or recorded for a graph segment), with the census counted where the driver is called.

use super::graph::{self, Call};
use super::memory::{self, DeviceBuffer};
use super::{driver, safe, CudaBackend, GemvLayout, DIGEST_CHUNK};
use crate::backend::census::CensusCounter;
use crate::backend::op::lane_grid::{lanes_name, plan_grid};
use crate::backend::{
    AllReduce, Backend, BufId, Collected, Graphs, JoinFence, Op, Packed, PackedCopies, PeerStores, ProbeResult, Slice,
    Transfer, UnfencedCopies, WeightId, Witness,
};
use crate::config::Transport;
use crate::error::RuntimeError;
use crate::evidence::census::Census;
use crate::evidence::defect::TwinDefect;
use crate::model::matrix::MatrixShard;
use crate::Result;
use std::sync::atomic::Ordering;

impl Backend for CudaBackend {
    fn checkpoint(&self) -> Option<crate::backend::Checkpoint> {
        Some(crate::backend::Checkpoint { buffers: self.ranks.iter().map(|r| r.bufs.len()).collect() })
    }

    /// Drains every stream, drops the captured graphs (they reference buffers about to be freed),
    /// frees the buffers from the checkpoint on, zeroes every digest slot and resets the marks,
    /// tickets, engagement counters and the census. Weights, expert groups, NCCL communicators, staging and
    /// doorbells stay (doorbell tickets only ever grow).
    fn rewind(&mut self, to: &crate::backend::Checkpoint) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Rewind);
        self.no_open_segment("rewind")?;
        if to.buffers.len() != self.ranks.len() {
            return Err(RuntimeError::Contract(format!(
                "rewind to a checkpoint of {} ranks on a backend of {}",
                to.buffers.len(),
                self.ranks.len()
            )));
        }
        if let Some((r, (&keep, held))) =
            to.buffers.iter().zip(self.ranks.iter().map(|r| r.bufs.len())).enumerate().find(|(_, (k, h))| **k > *h)
        {
            return Err(RuntimeError::Contract(format!(
                "rewind of rank {r} to {keep} buffers, but it holds {held}: the checkpoint is not this backend's"
            )));
        }
        self.sync_all("rewind")?;
        self.graphs = graph::Graphs::default();
        for i in 0..self.ranks.len() {
            let r = &self.ranks[i];
            r.stream.context().bind_to_thread().map_err(|e| self.fault(i, "rewind", e))?;
            for chunk in &r.digest_chunks {
                // Zeroing the DIGEST_CHUNK·8 bytes of a digest chunk of this rank, queued on its
                // stream, which is synchronized below before anything reads it.
                safe::memset_d8(&r.stream, chunk.region(), 0, DIGEST_CHUNK * 8)
                    .map_err(|e| self.fault(i, "rewind", e))?;
            }
            r.stream.synchronize().map_err(|e| self.fault(i, "rewind", e))?;
            let r = &mut self.ranks[i];
            r.bufs.truncate(to.buffers[i]);
            (r.marks_used, r.digests_used, r.digests_reserved) = (0, 0, 0);
        }
        self.tickets.clear();
        (self.launches, self.merged_launches, self.packed_copies, self.doorbells_rung) = (0, 0, 0, 0);
        self.kernel_doorbells_rung = 0;
        // The census counts what a run issues (uploads are not counted): the next run's starts
        // from nothing, as on a fresh backend.
        self.census = CensusCounter::new(self.ranks.len());
        Ok(())
    }

    fn copy_bandwidth(&mut self, bytes: usize) -> Result<Option<f64>> {
        crate::backend::measure_copy_bandwidth(self, bytes, 20).map(Some)
    }

    fn describe(&self) -> String {
        let d = &self.devices[0].info;
        let placement = if self.co_resident() {
            format!("co-resident on device {} (one stream per rank)", d.ordinal)
        } else {
            format!("on devices {:?}", self.placement())
        };
        let launches = if self.programmatic_launches() { "programmatic launches" } else { "plain launches" };
        format!(
            "cuda: {} rank(s) {placement}; {} {} {:.0} GiB; {launches}; {}",
            self.ranks.len(),
            d.name,
            d.arch(),
            d.total_mem_bytes as f64 / (1u64 << 30) as f64,
            self.devices[0].compiled.describe()
        )
    }

    fn ranks(&self) -> usize {
        self.ranks.len()
    }

    fn programmatic_launches(&self) -> bool {
        self.ranks.iter().all(|r| r.programmatic)
    }

    fn upload_weight(&mut self, rank: usize, shard: &MatrixShard) -> Result<WeightId> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Upload);
        self.check_rank(rank)?;
        let ctx = self.ctx_of(rank).clone();
        let what = format!("weight {} on rank {rank}", self.ranks[rank].weights.len());
        let allow = self.opts.gemv_layout == GemvLayout::Fast;
        let w = memory::upload_weight(&ctx, &self.ranks[rank].stream, shard, allow, &what)?;
        let r = &mut self.ranks[rank];
        r.weights.push(w);
        Ok((r.weights.len() - 1) as WeightId)
    }

    fn alloc(&mut self, rank: usize, len: usize) -> Result<BufId> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Alloc);
        self.check_rank(rank)?;
        if i32::try_from(len).is_err() {
            return Err(RuntimeError::Capacity {
                what: "buffer elements".into(),
                value: len,
                limit: i32::MAX as usize,
                rule: format!("alloc of {len} elements exceeds the kernels' 32-bit sizes"),
            });
        }
        let ctx = self.ctx_of(rank).clone();
        let b = DeviceBuffer::zeroed(&ctx, &self.ranks[rank].stream, len * 4, &format!("buffer on rank {rank}"))?;
        let r = &mut self.ranks[rank];
        r.bufs.push((b, len));
        Ok((r.bufs.len() - 1) as BufId)
    }

    fn write(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Write);
        self.no_open_segment("write")?;
        let ptr = self.slice_region(rank, dst, "write")?;
        if data.len() != dst.len {
            return Err(RuntimeError::Contract(format!("write: {} values into a slice of {}", data.len(), dst.len)));
        }
        self.census.host_write(dst.len);
        if data.is_empty() {
            return Ok(());
        }
        let r = &self.ranks[rank];
        r.stream.context().bind_to_thread().map_err(|e| self.fault(rank, "write", e))?;
        // `data` is lent to the copy until the stream is synchronized.
        safe::with_host_memory(
            &[&r.stream],
            |h| h.upload(&r.stream, ptr, data).map_err(|e| self.fault(rank, "write", e)),
            |_, e| self.fault(rank, "write", e),
        )
    }

    fn read(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Read);
        self.no_open_segment("read")?;
        let ptr = self.slice_region(rank, src, "read")?;
        self.census.host_read(src.len);
        let mut out = vec![0.0f32; src.len];
        if out.is_empty() {
            return Ok(out);
        }
        let r = &self.ranks[rank];
        r.stream.context().bind_to_thread().map_err(|e| self.fault(rank, "read", e))?;
        // `out` is lent to the copy until the stream is synchronized.
        let out_ref = &mut out[..];
        safe::with_host_memory(
            &[&r.stream],
            |h| {
                let out_ref = out_ref;
                h.download(&r.stream, out_ref, ptr).map_err(|e| self.fault(rank, "read", e))
            },
            |_, e| self.fault(rank, "read", e),
        )?;
        Ok(out)
    }

    fn launch(&mut self, rank: usize, op: Op) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Launch);
        self.check_rank(rank)?;
        if !self.graph_gate(|| Call::Launch { rank, op: op.clone() })? {
            return Ok(());
        }
        let kernel = self.kernel(rank, &op);
        self.count_launch(rank, kernel);
        let before = self.kernels_issued(rank);
        self.launch_op(rank, &op)?;
        self.note_last_op(rank, before, std::slice::from_ref(&op));
        Ok(())
    }

    /// One launch for the lanes where the rules allow it — a `gemv_*_lanes_*` launch reading each
    /// weight once (`launch/lanes.rs`), or a lane-grid launch of a row-wise or grouped expert op
    /// (`launch/lane_grid.rs`) — lane by lane otherwise.
    fn launch_lanes(&mut self, rank: usize, ops: Vec<Op>) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::LaunchLanes);
        self.check_rank(rank)?;
        let (kernel, fused) = if let Some(f) = self.fused_lanes(rank, &ops) {
            (f.kernel.clone(), OneLaunch::Gemv(f))
        } else if let Ok(plan) = plan_grid(&ops) {
            (lanes_name(&self.kernel(rank, &ops[0])), OneLaunch::Grid(plan))
        } else {
            return ops.into_iter().try_for_each(|op| self.launch(rank, op));
        };
        if !self.graph_gate(|| Call::LaunchLanes { rank, ops: ops.clone() })? {
            return Ok(());
        }
        self.count_launch(rank, kernel);
        let before = self.kernels_issued(rank);
        match fused {
            OneLaunch::Gemv(f) => self.launch_fused_lanes(rank, &f)?,
            OneLaunch::Grid(plan) => self.launch_lane_grid(rank, &ops, &plan)?,
        }
        self.note_last_op(rank, before, &ops);
        Ok(())
    }

    fn copy(&mut self, c: Transfer) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Copy);
        let Transfer { transport, from: (src_rank, src), to: (dst_rank, dst) } = c;
        if !self.graph_gate(|| Call::Copy { transport, src_rank, src, dst_rank, dst, fenced: true })? {
            return Ok(());
        }
        self.census.copy(transport.name(), src_rank, dst_rank, src.len);
        self.copy_slices(transport, src_rank, src, dst_rank, dst)
    }

    fn digest(&mut self, rank: usize, src: Slice, base: u64) -> Result<usize> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Digest);
        let ptr = self.slice_ptr(rank, src, "digest")?;
        let (slot, slot_ptr) = self.digest_slot(rank)?;
        let ticket = self.tickets.len();
        self.tickets.push((rank, slot));
        self.graphs.note_digest(rank);
        if self.graph_gate(|| Call::Digest { rank, src, base })? {
            self.launches += 1;
            self.launch_digest(rank, ptr, src.len, base, slot_ptr)?;
        }
        Ok(ticket)
    }

    fn digest_batch(&mut self, rank: usize, groups: &[Vec<crate::backend::DigestPart>]) -> Result<Vec<Vec<usize>>> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Digest);
        self.check_rank(rank)?;
        let mut resolved = Vec::new();
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            let (slot, slot_ptr) = self.digest_slot(rank)?;
            let ticket = self.tickets.len();
            self.tickets.push((rank, slot));
            self.graphs.note_digest(rank);
            for p in g {
                resolved.push(self.resolve_part(rank, p, slot_ptr)?);
            }
            out.push(vec![ticket]);
        }
        if self.graph_gate(|| Call::DigestBatch { rank, groups: groups.to_vec() })? {
            for chunk in resolved.chunks(CudaBackend::digest_batch_max()) {
                self.launches += 1;
                self.launch_digest_batch(rank, chunk)?;
            }
        }
        Ok(out)
    }

    fn register_experts(
        &mut self,
        rank: usize,
        experts: usize,
        entries: &[Option<crate::backend::GroupEntry>],
    ) -> Result<crate::backend::GroupId> {
        self.no_open_segment("register_experts")?;
        self.register_group(rank, experts, entries)
    }

    fn mark(&mut self) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Mark);
        self.graphs.note_marks();
        let issue = self.graph_gate(|| Call::Mark)?;
        if matches!(self.graphs.pass(), graph::Pass::Capture | graph::Pass::Replay) {
            // Capture: an event record node per rank; replay: the graph records them.
            for i in 0..self.ranks.len() {
                if issue {
                    self.record_mark_in_capture(i, self.ranks[i].marks_used)?;
                }
                self.ranks[i].marks_used += 1;
            }
            return Ok(());
        }
        for i in 0..self.ranks.len() {
            if self.ranks[i].marks_used == self.ranks[i].mark_events.len() {
                let ev = self
                    .ctx_of(i)
                    .new_event(Some(driver::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(|e| self.fault(i, "timing mark", e))?;
                self.ranks[i].mark_events.push(ev);
            }
            let r = &self.ranks[i];
            r.mark_events[r.marks_used].record(&r.stream).map_err(|e| self.fault(i, "timing mark", e))?;
            self.ranks[i].marks_used += 1;
        }
        Ok(())
    }

    fn collect(&mut self) -> Result<Collected> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Collect);
        self.no_open_segment("collect")?;
        self.sync_all("collect")?;
        // Digests: download each rank's used slots once, then zero them for the next step.
        let mut per_rank: Vec<Vec<u64>> = Vec::with_capacity(self.ranks.len());
        for i in 0..self.ranks.len() {
            let r = &self.ranks[i];
            // Segment regions (below `digests_reserved`) were written by this step's replays.
            let used = r.digests_used.max(r.digests_reserved);
            let mut vals = vec![0u64; used];
            // Chunk c's slots are vals[c·DIGEST_CHUNK..][..n] (n ≤ DIGEST_CHUNK; chunks past the
            // used slots are not touched), lent to the downloads until the stream is synchronized.
            let parts = vals.chunks_mut(DIGEST_CHUNK);
            safe::with_host_memory(
                &[&r.stream],
                |h| {
                    for (chunk, part) in r.digest_chunks.iter().zip(parts) {
                        let n = part.len();
                        r.stream.context().bind_to_thread().map_err(|e| self.fault(i, "collect digests", e))?;
                        h.download(&r.stream, part, chunk.region()).map_err(|e| self.fault(i, "collect digests", e))?;
                        // Zeroing the same n·8 bytes of the chunk, queued after the download.
                        safe::memset_d8(&r.stream, chunk.region(), 0, n * 8)
                            .map_err(|e| self.fault(i, "collect digests", e))?;
                    }
                    Ok(())
                },
                |_, e| self.fault(i, "collect digests", e),
            )?;
            per_rank.push(vals);
        }
        let digests: Vec<u64> = self.tickets.iter().map(|&(rank, slot)| per_rank[rank][slot]).collect();
        // Marks: elapsed ns of each mark since the rank's first mark of this step. Every stream
        // was synchronized above, so each event is complete: one bind per rank, then only
        // cuEventElapsedTime per mark (not cudarc's bind + two event syncs + elapsed per mark).
        let mut marks_ns = Vec::with_capacity(self.ranks.len());
        for (i, r) in self.ranks.iter().enumerate() {
            let mut v = Vec::with_capacity(r.marks_used);
            if r.marks_used > 0 {
                r.stream.context().bind_to_thread().map_err(|e| self.fault(i, "collect marks", e))?;
            }
            for m in &r.mark_events[..r.marks_used] {
                let ms =
                    safe::elapsed_ms_completed(&r.mark_events[0], m).map_err(|e| self.fault(i, "collect marks", e))?;
                v.push((ms as f64 * 1e6).round().max(0.0) as u64);
            }
            marks_ns.push(v);
        }
        for r in &mut self.ranks {
            r.digests_used = 0;
            r.marks_used = 0;
        }
        self.tickets.clear();
        self.launches = 0;
        Ok(Collected { digests, marks_ns })
    }

    fn probe(&mut self, transport: Transport, sizes_bytes: &[usize]) -> Result<Vec<ProbeResult>> {
        self.no_open_segment("probe")?;
        self.probe_pairs(transport, sizes_bytes)
    }

    fn peer_stores(&mut self) -> Option<&mut dyn PeerStores> {
        Some(self)
    }

    fn packed_copies(&mut self) -> Option<&mut dyn PackedCopies> {
        Some(self)
    }

    fn graphs(&mut self) -> Option<&mut dyn Graphs> {
        Some(self)
    }

    fn all_reduce(&mut self) -> Option<&mut dyn AllReduce> {
        Some(self)
    }

    fn unfenced_copies(&mut self) -> Option<&mut dyn UnfencedCopies> {
        Some(self)
    }
}

/// How the lanes of one op become one launch.
enum OneLaunch {
    Gemv(super::launch::lanes::FusedLanes),
    Grid(crate::backend::op::lane_grid::GridPlan),
}

impl CudaBackend {
    /// Grouped gate/up launches issued so far with their shared slot ahead of the wait (the
    /// evidence that a programmatic run used it; the GPU tests read it).
    pub fn ahead_launches(&self) -> u64 {
        self.ahead_launches.load(Ordering::Relaxed)
    }

    /// Count one launch issued with `ahead` = 1.
    pub(crate) fn note_ahead(&self) {
        self.ahead_launches.fetch_add(1, Ordering::Relaxed);
    }

    /// Kernels issued on `rank`'s stream so far.
    fn kernels_issued(&self, rank: usize) -> u64 {
        self.ranks[rank].kernels_issued.load(Ordering::Relaxed)
    }

    /// After `ops` were launched on `rank` (issued, not replayed): when they issued a kernel, the
    /// last kernel on the stream is theirs, and these are the buffers it may touch.
    fn note_last_op(&mut self, rank: usize, before: u64, ops: &[Op]) {
        let now = self.kernels_issued(rank);
        if now != before {
            let r = &mut self.ranks[rank];
            r.last_op_bufs.clear();
            r.last_op_bufs.extend(ops.iter().flat_map(|op| op.slices()).map(|s| s.buf));
            r.last_op_at = Some(now);
        }
    }

    /// Kernels issued on every stream outside the launch macro (NCCL's calls, a graph launch):
    /// the last kernel of each stream is no longer known.
    pub(crate) fn note_foreign_kernels(&self) {
        for r in &self.ranks {
            r.kernels_issued.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the kernel ahead on `rank`'s programmatic stream is known and touches none of
    /// `bufs`: then their last writers and readers are at least two launches back and completed
    /// before a kernel launched now can be scheduled (the kernel ahead has passed its own wait).
    /// SETTLED_FIRST kernels (canon.cuh) may then run some blocks before their wait. Conservative:
    /// an unknown last kernel (a digest, a peer store, NCCL, a graph launch) is never settled.
    pub(crate) fn settled(&self, rank: usize, bufs: &[BufId]) -> bool {
        let r = &self.ranks[rank];
        r.programmatic
            && r.last_op_at == Some(self.kernels_issued(rank))
            && !r.last_op_bufs.iter().any(|b| bufs.contains(b))
    }

    /// One kernel launch really issued on `rank`: the fault counter, RANK0_MERGE's evidence and
    /// the census.
    fn count_launch(&mut self, rank: usize, kernel: String) {
        self.launches += 1;
        if rank == 0 && self.opts.rank0_on_default_stream {
            self.merged_launches += 1;
        }
        self.census.launch(rank, kernel);
    }
}

impl Witness for CudaBackend {
    fn census(&self) -> Census {
        let mut c = self.census.clone();
        c.mechanism("graph_replay", self.graphs.replays);
        c.mechanism("doorbell", self.doorbells_rung);
        c.mechanism("kernel_doorbell", self.kernel_doorbells_rung);
        c.mechanism("merged_launch", self.merged_launches);
        c.counts()
    }

    /// Counted here, where the mechanisms are carried out, never by the program on faith: a
    /// packed copy of fewer than 2 blocks and a doorbell that fell back to events count nothing.
    fn engagement(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        if self.opts.rank0_on_default_stream {
            out.push(("rank0_merge.merged_launches".to_string(), self.merged_launches));
        }
        if self.graphs.captures > 0 {
            out.push(("graph.replays".to_string(), self.graphs.replays));
        }
        if self.packed_copies > 0 {
            out.push(("bulk_p2p.packed_copies".to_string(), self.packed_copies));
        }
        if self.doorbells_rung > 0 {
            out.push(("fence_memops.doorbells".to_string(), self.doorbells_rung));
        }
        if self.kernel_doorbells_rung > 0 {
            out.push(("fence_rank1.kernel_doorbells".to_string(), self.kernel_doorbells_rung));
        }
        out
    }

    fn build_options(&self) -> Vec<String> {
        let c = self.compiled();
        std::iter::once(format!("arch={}", c.arch))
            .chain(std::iter::once(format!("nvrtc={}.{}", c.nvrtc_version.0, c.nvrtc_version.1)))
            .chain(c.options.iter().cloned())
            .collect()
    }

    fn plant(&mut self, d: TwinDefect) -> Result<()> {
        Err(d.refused(self.describe()))
    }
}

impl PeerStores for CudaBackend {
    fn launch_peer_store(&mut self, rank: usize, op: Op, out_rank: usize, fence: JoinFence) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::PeerStore);
        if fence != JoinFence::Events && self.graphs.open() {
            return Err(RuntimeError::DoorRefused {
                door: if fence == JoinFence::Doorbells { "MEMRA_FENCE_MEMOPS" } else { "MEMRA_FENCE_RANK1" },
                rule: "FENCE_MEMOPS doorbells inside a graph segment: every join rings a new ticket, and a captured \
                       graph would replay the ticket it was captured with"
                    .into(),
            });
        }
        if !self.graph_gate(|| Call::PeerStore { rank, op: op.clone(), out_rank, fence })? {
            return Ok(());
        }
        let kernel = self.kernel(rank, &op);
        self.census.peer_store(rank, kernel);
        self.peer_store(rank, &op, out_rank, fence)
    }
}

impl PackedCopies for CudaBackend {
    fn copy_packed(&mut self, transport: Transport, src_rank: usize, dst_rank: usize, p: Packed) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::CopyPacked);
        if !self.graph_gate(|| Call::Packed { transport, src_rank, dst_rank, packed: p })? {
            return Ok(());
        }
        self.census.packed_copy(transport.name(), p.blocks, p.src.len);
        self.copy_packed_blocks(transport, src_rank, dst_rank, p)
    }
}

impl Graphs for CudaBackend {
    fn segment_begin(&mut self, key: u64) -> Result<()> {
        self.segment_begin_impl(key)
    }

    fn segment_end(&mut self) -> Result<()> {
        self.segment_end_impl()
    }

    fn segment_abort(&mut self) {
        self.segment_abort_impl();
    }
}

impl AllReduce for CudaBackend {
    fn all_reduce_sum(&mut self, parts: &[(usize, Slice)], out_rank: usize, out: Slice) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::AllReduce);
        if !self.graph_gate(|| Call::AllReduce { parts: parts.to_vec(), out_rank, out })? {
            return Ok(());
        }
        self.census.all_reduce(out.len);
        self.note_foreign_kernels(); // NCCL's kernels, on every rank's stream
        self.nccl_all_reduce_sum(parts, out_rank, out)
    }
}

impl UnfencedCopies for CudaBackend {
    fn copy_unfenced(&mut self, c: Transfer) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::CopyUnfenced);
        let Transfer { transport, from: (src_rank, src), to: (dst_rank, dst) } = c;
        if !self.graph_gate(|| Call::Copy { transport, src_rank, src, dst_rank, dst, fenced: false })? {
            return Ok(());
        }
        self.census.unfenced_copy(transport.name(), src.len);
        self.copy_unfenced_slices(transport, src_rank, src, dst_rank, dst)
    }
}
