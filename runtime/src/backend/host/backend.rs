//! The [`Backend`] trait on host ranks: uploads and buffers checked on the driver side before
//! anything is queued, copies over the transports as send/receive halves (bytes only), peer
//! stores, digests, timing marks, the census, coverage and rewind.

use super::execute::{digest_group, execute};
use super::{read_slice, write_slice, Arena, HostBackend, Observe};
use crate::backend::census::CensusCounter;
use crate::backend::op::lanes::fused_kernel;
use crate::backend::{
    Backend, BufId, Collected, DigestPart, GroupEntry, GroupId, JoinFence, Op, PeerStores, ProbeResult, Slice,
    Transfer, WeightId, Witness,
};
use crate::config::Transport;
use crate::error::RuntimeError;
use crate::evidence::census::Census;
use crate::evidence::coverage::{self, Coverage, SeamPoint};
use crate::evidence::defect::TwinDefect;
use crate::model::matrix::MatrixShard;
use crate::Result;
use memra_kernels::twins::digest;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};

impl Backend for HostBackend {
    fn describe(&self) -> String {
        match self.rank_mode() {
            super::HostRanks::Threads => format!("host: {} CPU rank thread(s) with private arenas", self.ranks.len()),
            super::HostRanks::Inline => {
                format!("host: {} CPU rank(s) with private arenas, run inline on the issuing thread", self.ranks.len())
            }
        }
    }

    fn ranks(&self) -> usize {
        self.ranks.len()
    }

    fn upload_weight(&mut self, rank: usize, shard: &MatrixShard) -> Result<WeightId> {
        self.upload_weight_owned(rank, shard.clone())
    }

    fn upload_weight_owned(&mut self, rank: usize, shard: MatrixShard) -> Result<WeightId> {
        self.check_rank(rank)?;
        let format = shard.format_name();
        self.submit(rank, Box::new(move |a: &mut Arena| a.weights.push(shard)))?;
        let w = &mut self.ranks[rank];
        w.weight_formats.push(format);
        Ok((w.weight_formats.len() - 1) as WeightId)
    }

    fn checkpoint(&self) -> Option<crate::backend::Checkpoint> {
        Some(crate::backend::Checkpoint { buffers: self.ranks.iter().map(|r| r.buf_lens.len()).collect() })
    }

    /// Every rank drops its buffers from the checkpoint on, its timing marks and its coverage
    /// counters; the digest tickets restart at 0, and the census, the program position and any
    /// planted defect are forgotten (all of them belong to the run, none to the upload). Queued
    /// behind the rank's earlier work, so nothing in flight reads a dropped buffer; the barrier
    /// makes the rewind complete before the next run issues anything.
    fn rewind(&mut self, to: &crate::backend::Checkpoint) -> Result<()> {
        if to.buffers.len() != self.ranks.len() {
            return Err(RuntimeError::Contract(format!(
                "rewind to a checkpoint of {} ranks on a backend of {}",
                to.buffers.len(),
                self.ranks.len()
            )));
        }
        for (r, &keep) in to.buffers.iter().enumerate() {
            let held = self.ranks[r].buf_lens.len();
            if keep > held {
                return Err(RuntimeError::Contract(format!(
                    "rewind of rank {r} to {keep} buffers, but it holds {held}: the checkpoint is not this backend's"
                )));
            }
            let freed: usize = self.ranks[r].buf_lens[keep..].iter().map(|l| l * 4).sum();
            self.allocated_bytes = self.allocated_bytes.saturating_sub(freed);
            self.ranks[r].buf_lens.truncate(keep);
            self.submit(
                r,
                Box::new(move |a: &mut Arena| {
                    a.bufs.truncate(keep);
                    a.marks_ns.clear();
                    a.coverage = coverage::empty();
                }),
            )?;
        }
        self.barrier()?;
        self.digests
            .lock()
            .map_err(|_| RuntimeError::Device {
                location: "host digest sink".into(),
                detail: "poisoned by a panicking rank".into(),
            })?
            .clear();
        self.n_tickets = 0;
        self.census = CensusCounter::new(self.ranks.len());
        self.position = None;
        self.defect = None;
        Ok(())
    }

    fn alloc(&mut self, rank: usize, len: usize) -> Result<BufId> {
        self.check_rank(rank)?;
        let bytes = len.saturating_mul(4);
        if self.allocated_bytes.saturating_add(bytes) > self.memory_limit_bytes {
            return Err(RuntimeError::Device {
                location: format!("allocating {bytes} bytes on host rank {rank}"),
                detail: format!(
                    "out of memory: {} bytes already allocated, {} available to this process",
                    self.allocated_bytes, self.memory_limit_bytes
                ),
            });
        }
        self.allocated_bytes += bytes;
        self.submit(rank, Box::new(move |a: &mut Arena| a.bufs.push(vec![0.0; len])))?;
        let w = &mut self.ranks[rank];
        w.buf_lens.push(len);
        Ok((w.buf_lens.len() - 1) as BufId)
    }

    fn write(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()> {
        self.check_slice(rank, dst, "write")?;
        if data.len() != dst.len {
            return Err(RuntimeError::Contract(format!("write: {} values into a slice of {}", data.len(), dst.len)));
        }
        self.census.host_write(dst.len);
        let data = data.to_vec();
        self.submit(rank, Box::new(move |a: &mut Arena| write_slice(a, dst, &data)))
    }

    fn read(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>> {
        self.check_slice(rank, src, "read")?;
        self.census.host_read(src.len);
        let (tx, rx) = sync_channel(1);
        self.submit(
            rank,
            Box::new(move |a: &mut Arena| {
                let _ = tx.send(read_slice(a, src).to_vec());
            }),
        )?;
        rx.recv().map_err(|_| RuntimeError::Device {
            location: format!("host rank {rank} read"),
            detail: "the rank thread died before the read (a kernel twin panicked)".into(),
        })
    }

    fn launch(&mut self, rank: usize, op: Op) -> Result<()> {
        self.check_op(rank, &op)?;
        let kernel = self.kernel(rank, &op);
        self.census.launch(rank, kernel);
        let obs = Observe { at: self.position, defect: self.defect_for(&op) };
        self.submit(rank, Box::new(move |a: &mut Arena| execute(a, op, obs)))
    }

    /// Lanes one device launch would serve (`op::lanes::fused_kernel`, the rule the CUDA backend
    /// fuses by) are counted in the census as that one
    /// launch; the twins run lane by lane, which is the definition of its bits.
    fn launch_lanes(&mut self, rank: usize, ops: Vec<Op>) -> Result<()> {
        self.check_rank(rank)?;
        let formats = &self.ranks[rank].weight_formats;
        let Some(kernel) = fused_kernel(&ops, |id| formats.get(id as usize).copied(), |op| self.kernel(rank, op))
        else {
            return ops.into_iter().try_for_each(|op| self.launch(rank, op));
        };
        for op in &ops {
            self.check_op(rank, op)?;
        }
        self.census.launch(rank, kernel);
        for op in ops {
            let obs = Observe { at: self.position, defect: self.defect_for(&op) };
            self.submit(rank, Box::new(move |a: &mut Arena| execute(a, op, obs)))?;
        }
        Ok(())
    }

    fn copy(&mut self, c: Transfer) -> Result<()> {
        let Transfer { transport, from: (src_rank, src), to: (dst_rank, dst) } = c;
        self.check_slice(src_rank, src, "copy source")?;
        self.check_slice(dst_rank, dst, "copy destination")?;
        if src.len != dst.len {
            return Err(RuntimeError::Contract(format!("copy of {} elements into a slice of {}", src.len, dst.len)));
        }
        if transport == Transport::Nccl && src_rank != dst_rank {
            return Err(no_nccl());
        }
        self.census.copy(transport.name(), src_rank, dst_rank, src.len);
        if src_rank == dst_rank {
            return self.submit(
                src_rank,
                Box::new(move |a: &mut Arena| {
                    let v = read_slice(a, src).to_vec();
                    write_slice(a, dst, &v);
                }),
            );
        }
        if src.len * 4 <= self.corrupt_up_to_bytes && src.len > 0 {
            let (inner_tx, inner_rx) = channel::<Vec<f32>>();
            self.submit(
                src_rank,
                Box::new(move |a: &mut Arena| {
                    let mut v = read_slice(a, src).to_vec();
                    v[0] = f32::from_bits(v[0].to_bits() ^ 1);
                    let _ = inner_tx.send(v);
                }),
            )?;
            return self.submit(
                dst_rank,
                Box::new(move |a: &mut Arena| {
                    if let Ok(v) = inner_rx.recv() {
                        write_slice(a, dst, &v);
                    }
                }),
            );
        }
        let (tx, rx): (Sender<Vec<f32>>, Receiver<Vec<f32>>) = channel();
        match transport {
            Transport::HostBounce => {
                // rank → staging arena → destination: the staging buffer is taken from (and
                // returned to) a pool, like a reused pinned host region.
                let pool = self.staging_pool.clone();
                self.submit(
                    src_rank,
                    Box::new(move |a: &mut Arena| {
                        let mut stage = pool.lock().map(|mut p| p.pop().unwrap_or_default()).unwrap_or_default();
                        stage.clear();
                        stage.extend_from_slice(read_slice(a, src));
                        let _ = tx.send(stage);
                    }),
                )?;
                let pool = self.staging_pool.clone();
                self.submit(
                    dst_rank,
                    Box::new(move |a: &mut Arena| {
                        if let Ok(stage) = rx.recv() {
                            write_slice(a, dst, &stage);
                            if let Ok(mut p) = pool.lock() {
                                p.push(stage);
                            }
                        }
                    }),
                )
            }
            Transport::Nccl => Err(no_nccl()),
            Transport::NativeP2p => {
                self.submit(
                    src_rank,
                    Box::new(move |a: &mut Arena| {
                        let _ = tx.send(read_slice(a, src).to_vec());
                    }),
                )?;
                self.submit(
                    dst_rank,
                    Box::new(move |a: &mut Arena| {
                        if let Ok(v) = rx.recv() {
                            write_slice(a, dst, &v);
                        }
                    }),
                )
            }
        }
    }

    fn digest(&mut self, rank: usize, src: Slice, base: u64) -> Result<usize> {
        self.check_slice(rank, src, "digest")?;
        let ticket = self.n_tickets;
        self.n_tickets += 1;
        let sink = self.digests.clone();
        self.submit(
            rank,
            Box::new(move |a: &mut Arena| {
                let d = digest::digest_f32(read_slice(a, src), base);
                if let Ok(mut v) = sink.lock() {
                    if v.len() <= ticket {
                        v.resize(ticket + 1, 0);
                    }
                    v[ticket] = d;
                }
            }),
        )?;
        Ok(ticket)
    }

    fn digest_batch(&mut self, rank: usize, groups: &[Vec<DigestPart>]) -> Result<Vec<Vec<usize>>> {
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            for p in g {
                self.check_slice(rank, p.span(), "digest_batch")?;
                if let Some(o) = p.owned {
                    self.check_slice(rank, o.route, "digest_batch route")?;
                    if o.first_slot + p.blocks > o.route.len {
                        return Err(RuntimeError::Contract(format!(
                            "digest_batch: slots {}..{} of a route of {}",
                            o.first_slot,
                            o.first_slot + p.blocks,
                            o.route.len
                        )));
                    }
                }
            }
            let ticket = self.n_tickets;
            self.n_tickets += 1;
            let sink = self.digests.clone();
            let parts = g.clone();
            self.submit(
                rank,
                Box::new(move |a: &mut Arena| {
                    let d = digest_group(a, &parts);
                    if let Ok(mut v) = sink.lock() {
                        if v.len() <= ticket {
                            v.resize(ticket + 1, 0);
                        }
                        v[ticket] = d;
                    }
                }),
            )?;
            out.push(vec![ticket]);
        }
        Ok(out)
    }

    fn register_experts(&mut self, rank: usize, experts: usize, entries: &[Option<GroupEntry>]) -> Result<GroupId> {
        self.check_rank(rank)?;
        let n_weights = self.ranks[rank].n_weights();
        for (e, en) in entries.iter().enumerate() {
            if let Some(en) = en {
                if let Some(w) = [en.gate, en.up, en.down].into_iter().find(|w| *w as usize >= n_weights) {
                    return Err(RuntimeError::Contract(format!(
                        "expert group entry {e}: weight {w} does not exist on rank {rank}"
                    )));
                }
            }
        }
        let w = &self.ranks[rank];
        let format = entries.iter().flatten().map(|e| w.weight_formats[e.gate as usize]).next().unwrap_or("empty");
        let entries = entries.to_vec();
        self.submit(rank, Box::new(move |a: &mut Arena| a.groups.push((experts, entries))))?;
        let w = &mut self.ranks[rank];
        w.group_formats.push(format);
        Ok((w.group_formats.len() - 1) as GroupId)
    }

    fn mark(&mut self) -> Result<()> {
        for r in 0..self.ranks.len() {
            self.submit(
                r,
                Box::new(|a: &mut Arena| {
                    let t = a.epoch.elapsed().as_nanos() as u64;
                    a.marks_ns.push(t);
                }),
            )?;
        }
        Ok(())
    }

    fn collect(&mut self) -> Result<Collected> {
        let marks_ns = self.barrier()?;
        let mut digests = std::mem::take(&mut *self.digests.lock().map_err(|_| RuntimeError::Device {
            location: "host digest sink".into(),
            detail: "poisoned by a panicking rank".into(),
        })?);
        digests.resize(self.n_tickets, 0);
        self.n_tickets = 0;
        Ok(Collected { digests, marks_ns })
    }

    fn probe(&mut self, transport: Transport, sizes_bytes: &[usize]) -> Result<Vec<ProbeResult>> {
        crate::backend::run_probe(self, transport, sizes_bytes)
    }

    fn peer_stores(&mut self) -> Option<&mut dyn PeerStores> {
        Some(self)
    }
}

impl PeerStores for HostBackend {
    /// The op runs on `rank`'s thread into a scratch vector (the host's stand-in for a kernel's
    /// registers: pushed for this op and popped right after, never a slice of `rank`), which is
    /// handed to `out_rank`'s thread and written there in issue order — after `out_rank`'s
    /// earlier work, before its later work, like the device's two event fences. No copy of a
    /// `rank` buffer is involved.
    fn launch_peer_store(&mut self, rank: usize, op: Op, out_rank: usize, fence: JoinFence) -> Result<()> {
        let target = crate::backend::peer_store_target(&op, rank, out_rank)?;
        if fence == JoinFence::Doorbells {
            return Err(RuntimeError::Unsupported {
                backend: "host".into(),
                mechanism: "FENCE_MEMOPS doorbells",
                rule: "host backend: MEMRA_FENCE_MEMOPS is NOT-APPLICABLE here (stream memory-op doorbells exist only on CUDA streams); refusing rather than running the event path under the door's name".into(),
            });
        }
        if fence == JoinFence::KernelDoorbell {
            return Err(RuntimeError::Unsupported {
                backend: "host".into(),
                mechanism: "FENCE_RANK1 kernel doorbells",
                rule: "host backend: MEMRA_FENCE_RANK1 is NOT-APPLICABLE here (a kernel store into the root's device memory awaited by a stream memop exists only on CUDA); refusing rather than running the event path under the door's name".into(),
            });
        }
        self.check_op_at(rank, &op, out_rank)?;
        let kernel = self.kernel(rank, &op);
        self.census.peer_store(rank, kernel);
        let obs = Observe { at: self.position, defect: self.defect_for(&op) };
        let (tx, rx) = channel::<Vec<f32>>();
        self.submit(
            rank,
            Box::new(move |a: &mut Arena| {
                let scratch = a.bufs.len();
                a.bufs.push(vec![0.0; target.len]);
                execute(a, op.with_store_target(Slice::new(scratch as BufId, 0, target.len)), obs);
                let _ = tx.send(a.bufs.pop().unwrap_or_default());
            }),
        )?;
        self.submit(
            out_rank,
            Box::new(move |a: &mut Arena| {
                if let Ok(v) = rx.recv() {
                    write_slice(a, target, &v);
                }
            }),
        )
    }
}

impl Witness for HostBackend {
    fn census(&self) -> Census {
        self.census.counts()
    }

    /// Every rank's coverage counters, summed (after the rank has run everything queued).
    fn coverage(&mut self) -> Result<Option<Coverage>> {
        let mut replies = Vec::new();
        for r in 0..self.ranks.len() {
            let (tx, rx) = sync_channel::<Coverage>(1);
            self.submit(
                r,
                Box::new(move |a: &mut Arena| {
                    let _ = tx.send(a.coverage.clone());
                }),
            )?;
            replies.push(rx);
        }
        let mut total = coverage::empty();
        for (r, rx) in replies.into_iter().enumerate() {
            let c = rx.recv().map_err(|_| RuntimeError::Device {
                location: format!("host rank {r}"),
                detail: "the rank thread died before reporting its coverage (a kernel twin panicked)".into(),
            })?;
            coverage::merge(&mut total, &c);
        }
        Ok(Some(total))
    }

    fn note_position(&mut self, at: SeamPoint) {
        self.position = Some(at);
    }

    fn plant(&mut self, d: TwinDefect) -> Result<()> {
        self.defect = Some(d);
        Ok(())
    }
}

/// The host backend's refusal of the nccl transport between ranks.
fn no_nccl() -> RuntimeError {
    RuntimeError::Unsupported {
        backend: "host".into(),
        mechanism: "nccl transport",
        rule: "the host backend has no NCCL: the nccl transport needs CUDA devices, one per rank".into(),
    }
}
