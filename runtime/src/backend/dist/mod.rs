//! One run over several processes (docs/DESIGN.md §3.5: `nccl` is the path for ranks on several
//! hosts): a [`Backend`] that holds only this process's ranks and moves bytes to the others
//! through a [`Mover`].
//!
//! Every process runs the same canonical program, op for op. [`DistBackend`] keeps that program
//! identical everywhere: work on a rank held elsewhere is skipped but still gets the buffer and
//! weight ids its owner hands out; a copy between a local and a remote rank is one half of a
//! send/receive pair (the other process issues the other half at the same point of the same
//! program); `read` and `collect` end with a collective so that every process gets every value:
//! the owner's bytes are broadcast, and each digest ticket (held by exactly one process, the
//! others contributing 0) comes back through an exact integer sum. The byte mover is a trait so
//! the same wrapper runs over NCCL on devices (`cuda::NcclMover`) and over in-memory queues
//! between threads on the host backend (`memory::MemoryMover`, for tests).
//!
//! A dead or stuck peer would leave NCCL waiting forever: every call into the backend runs under
//! a [`Watchdog`] that, once one call has taken longer than the timeout, hands the overrun (naming
//! the process, the ranks and the call) to the binary's [`watchdog::OverrunHook`], which ends the
//! process.

pub mod layout;
pub mod memory;
pub mod rendezvous;
pub mod watchdog;

pub use layout::{split_rule, ProcessLayout, ProcessSpec};
pub use rendezvous::Rendezvous;
pub use watchdog::Watchdog;

use super::{
    AllReduce, Backend, BufId, Collected, DigestPart, GroupEntry, GroupId, Op, ProbeResult, Slice, Transfer,
    UnfencedCopies, WeightId, Witness,
};
use crate::backend::census::CensusCounter;
use crate::config::Transport;
use crate::error::RuntimeError;
use crate::evidence::census::{Census, MECHANISMS};
use crate::evidence::defect::TwinDefect;
use crate::model::matrix::MatrixShard;
use crate::Result;

/// Moves bytes between this process's ranks (local rank indices of the inner backend `B`) and
/// ranks of other processes (global ranks). Every method is one half of a pair or a collective:
/// the other processes call the matching method at the same point of the same program.
pub trait Mover<B: ?Sized> {
    /// One line for receipts (library, communicator).
    fn describe(&self) -> String;
    /// Send `src` of local rank `from` to global rank `to` (another process's), after `from`'s
    /// earlier work and before its later work may overwrite `src`.
    fn send(&mut self, b: &mut B, from: usize, src: Slice, to: usize) -> Result<()>;
    /// Receive into `dst` of local rank `to` from global rank `from`, after `to`'s earlier work
    /// and before its later work.
    fn recv(&mut self, b: &mut B, to: usize, dst: Slice, from: usize) -> Result<()>;
    /// Every process: the `len` values of global rank `root`'s slice. The process holding `root`
    /// passes `Some((local rank, slice))`, the others `None`.
    fn broadcast(&mut self, b: &mut B, root: usize, src: Option<(usize, Slice)>, len: usize) -> Result<Vec<f32>>;
    /// Every process: the element-wise wrapping sum of `words` over all processes.
    fn sum_u64(&mut self, b: &mut B, words: &[u64]) -> Result<Vec<u64>>;
}

/// This process's ranks of a run spread over processes.
pub struct DistBackend<B: Backend, M: Mover<B>> {
    layout: ProcessLayout,
    inner: B,
    /// `None` only while dropping.
    mover: Option<M>,
    watchdog: Option<Watchdog>,
    /// Per global rank: the next buffer and weight id its owner hands out.
    next_buf: Vec<BufId>,
    next_weight: Vec<WeightId>,
    next_group: Vec<GroupId>,
    /// Per ticket (global numbering): the inner backend's ticket when this process holds it.
    tickets: Vec<Option<usize>>,
    /// Marks queued since the last collect.
    marks: usize,
    /// The backend-counted engagement of the whole launch (every process's inner counters,
    /// summed at each collect): a mechanism such as RANK0_MERGE runs in one process only, yet
    /// every process gates the run.
    engaged: Vec<(String, u64)>,
    /// The census of the program's calls, counted here for every global rank (every process sees
    /// every call, so each counts the single-process census), the storage names of every rank's
    /// weights and groups for the kernel names, and the inner backends' mechanism counters
    /// (`census::MECHANISMS`) summed over the processes at each collect.
    census: CensusCounter,
    weight_formats: Vec<Vec<&'static str>>,
    group_formats: Vec<Vec<&'static str>>,
    mechanisms: Vec<(String, u64)>,
}

impl<B: Backend, M: Mover<B>> DistBackend<B, M> {
    /// Wrap `inner` (exactly the layout's local ranks) and `mover`.
    pub fn new(layout: ProcessLayout, inner: B, mover: M, watchdog: Option<Watchdog>) -> Result<Self> {
        if inner.ranks() != layout.ranks_per_process() {
            return Err(RuntimeError::Contract(format!(
                "{}: the inner backend has {} ranks, the layout gives this process {}",
                layout.describe(),
                inner.ranks(),
                layout.ranks_per_process()
            )));
        }
        let tp = layout.tp;
        Ok(DistBackend {
            next_buf: vec![0; layout.tp],
            next_weight: vec![0; layout.tp],
            next_group: vec![0; layout.tp],
            layout,
            inner,
            mover: Some(mover),
            watchdog,
            tickets: Vec::new(),
            marks: 0,
            engaged: Vec::new(),
            census: CensusCounter::new(tp),
            weight_formats: vec![Vec::new(); tp],
            group_formats: vec![Vec::new(); tp],
            mechanisms: Vec::new(),
        })
    }

    pub fn layout(&self) -> ProcessLayout {
        self.layout
    }

    /// The census name of `op`'s kernel on `rank`.
    fn kernel_name(&self, rank: usize, op: &Op) -> String {
        let (wf, gf) = (&self.weight_formats[rank], &self.group_formats[rank]);
        op.kernel(
            |w| wf.get(w as usize).copied().unwrap_or("unknown"),
            |g| gf.get(g as usize).copied().unwrap_or("unknown"),
        )
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank < self.layout.tp {
            Ok(())
        } else {
            Err(RuntimeError::Contract(format!("rank {rank} does not exist: this run has TP{}", self.layout.tp)))
        }
    }

    /// Run `f` under the watchdog as `call` on the global ranks `ranks`.
    fn watched<T>(&mut self, call: &str, ranks: &str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let guard = self.watchdog.as_ref().map(|w| w.enter(format!("{call} on {ranks}")));
        let r = f(self);
        drop(guard);
        r.map_err(|e| self.name_error(call, ranks, e))
    }

    /// Errors of a multi-process run name the process too.
    fn name_error(&self, call: &str, ranks: &str, e: RuntimeError) -> RuntimeError {
        if self.layout.spec.processes == 1 {
            return e;
        }
        e.within(&format!("process {}, {call} on {ranks}", self.layout.spec.label()))
    }

    fn mover(&mut self) -> (&mut M, &mut B) {
        (self.mover.as_mut().expect("the mover lives until drop"), &mut self.inner)
    }

    fn refuse(&self, what: &'static str) -> RuntimeError {
        RuntimeError::Unsupported {
            backend: self.layout.describe(),
            mechanism: what,
            rule: format!(
                "{what} is not available across processes ({}): it runs only when one process holds every rank",
                self.layout.describe()
            ),
        }
    }
}

impl<B: Backend, M: Mover<B>> Drop for DistBackend<B, M> {
    fn drop(&mut self) {
        // Destroying a communicator may wait for peers: under the watchdog like any other call.
        let guard =
            self.watchdog.as_ref().map(|w| w.enter("draining the streams and releasing the communicator".to_string()));
        // Wait for every local rank's queued work (NCCL halves included) before the
        // communicator goes; the values are of no use any more.
        let _ = self.inner.collect();
        self.mover = None;
        drop(guard);
    }
}

impl<B: Backend, M: Mover<B>> Backend for DistBackend<B, M> {
    fn describe(&self) -> String {
        let m = self.mover.as_ref().map(|m| m.describe()).unwrap_or_default();
        format!("{} over {m}; {}", self.layout.describe(), self.inner.describe())
    }

    fn ranks(&self) -> usize {
        self.layout.tp
    }

    fn upload_weight(&mut self, rank: usize, shard: &MatrixShard) -> Result<WeightId> {
        self.check_rank(rank)?;
        let id = self.next_weight[rank];
        if let Some(l) = self.layout.local(rank) {
            let got = self.watched("upload_weight", &format!("rank {rank}"), |s| s.inner.upload_weight(l, shard))?;
            if got != id {
                return Err(RuntimeError::Contract(format!(
                    "rank {rank}: the inner backend gave weight id {got}, the program expects {id}"
                )));
            }
        }
        self.next_weight[rank] += 1;
        self.weight_formats[rank].push(shard.format_name());
        Ok(id)
    }

    fn alloc(&mut self, rank: usize, len: usize) -> Result<BufId> {
        self.check_rank(rank)?;
        let id = self.next_buf[rank];
        if let Some(l) = self.layout.local(rank) {
            let got = self.watched("alloc", &format!("rank {rank}"), |s| s.inner.alloc(l, len))?;
            if got != id {
                return Err(RuntimeError::Contract(format!(
                    "rank {rank}: the inner backend gave buffer id {got}, the program expects {id}"
                )));
            }
        }
        self.next_buf[rank] += 1;
        Ok(id)
    }

    fn write(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()> {
        self.check_rank(rank)?;
        self.census.host_write(dst.len);
        // Host data is the same in every process: the owner writes it.
        match self.layout.local(rank) {
            Some(l) => self.watched("write", &format!("rank {rank}"), |s| s.inner.write(l, dst, data)),
            None => Ok(()),
        }
    }

    fn first_run_begins(&mut self) {
        self.census = CensusCounter::new(self.layout.tp);
    }

    fn read(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>> {
        self.check_rank(rank)?;
        self.census.host_read(src.len);
        let local = self.layout.local(rank);
        if self.layout.spec.processes == 1 {
            let l = local.expect("one process holds every rank");
            return self.inner.read(l, src);
        }
        self.watched("read (broadcast from the owner)", &format!("rank {rank}"), |s| {
            let (m, b) = s.mover();
            m.broadcast(b, rank, local.map(|l| (l, src)), src.len)
        })
    }

    fn launch(&mut self, rank: usize, op: Op) -> Result<()> {
        self.check_rank(rank)?;
        let kernel = self.kernel_name(rank, &op);
        self.census.launch(rank, kernel);
        match self.layout.local(rank) {
            Some(l) => self.watched("launch", &format!("rank {rank}"), |s| s.inner.launch(l, op)),
            None => Ok(()),
        }
    }

    /// Counted like every backend's (`op::lanes::fused_kernel`); the local rank's inner backend
    /// runs the lanes, a remote rank's lanes are skipped like its launches.
    fn launch_lanes(&mut self, rank: usize, ops: Vec<Op>) -> Result<()> {
        self.check_rank(rank)?;
        let wf = &self.weight_formats[rank];
        let kernel_of = |op: &Op| self.kernel_name(rank, op);
        let Some(kernel) = crate::backend::op::lanes::fused_kernel(&ops, |w| wf.get(w as usize).copied(), kernel_of)
        else {
            return ops.into_iter().try_for_each(|op| self.launch(rank, op));
        };
        self.census.launch(rank, kernel);
        match self.layout.local(rank) {
            Some(l) => self.watched("launch", &format!("rank {rank}"), |s| s.inner.launch_lanes(l, ops)),
            None => Ok(()),
        }
    }

    fn copy(&mut self, c: Transfer) -> Result<()> {
        let Transfer { transport, from: (src_rank, src), to: (dst_rank, dst) } = c;
        self.check_rank(src_rank)?;
        self.check_rank(dst_rank)?;
        if src.len != dst.len {
            return Err(RuntimeError::Contract(format!("copy of {} elements into a slice of {}", src.len, dst.len)));
        }
        let ranks = format!("rank {src_rank} → rank {dst_rank}");
        self.census.copy(transport.name(), src_rank, dst_rank, src.len);
        match (self.layout.local(src_rank), self.layout.local(dst_rank)) {
            (Some(s), Some(d)) => {
                self.watched("copy", &ranks, |b| b.inner.copy(Transfer::new(transport, (s, src), (d, dst))))
            }
            (Some(s), None) => self.watched("send", &ranks, |b| {
                let (m, inner) = b.mover();
                m.send(inner, s, src, dst_rank)
            }),
            (None, Some(d)) => self.watched("recv", &ranks, |b| {
                let (m, inner) = b.mover();
                m.recv(inner, d, dst, src_rank)
            }),
            (None, None) => Ok(()),
        }
    }

    fn digest(&mut self, rank: usize, src: Slice, base: u64) -> Result<usize> {
        self.check_rank(rank)?;
        let inner = match self.layout.local(rank) {
            Some(l) => Some(self.watched("digest", &format!("rank {rank}"), |s| s.inner.digest(l, src, base))?),
            None => None,
        };
        self.tickets.push(inner);
        Ok(self.tickets.len() - 1)
    }

    /// One global ticket per group, held by the process that holds the rank (the inner backend must
    /// give one ticket per group, as the host and CUDA backends do).
    fn digest_batch(&mut self, rank: usize, groups: &[Vec<DigestPart>]) -> Result<Vec<Vec<usize>>> {
        self.check_rank(rank)?;
        let inner: Vec<Option<usize>> = match self.layout.local(rank) {
            Some(l) => {
                let got = self.watched("digest_batch", &format!("rank {rank}"), |s| s.inner.digest_batch(l, groups))?;
                got.into_iter()
                    .map(|t| match t.as_slice() {
                        [one] => Ok(Some(*one)),
                        other => Err(RuntimeError::Contract(format!(
                            "rank {rank}: the inner backend gave {} tickets for one digest group; across processes a group has exactly one",
                            other.len()
                        ))),
                    })
                    .collect::<Result<_>>()?
            }
            None => vec![None; groups.len()],
        };
        let mut out = Vec::with_capacity(inner.len());
        for t in inner {
            self.tickets.push(t);
            out.push(vec![self.tickets.len() - 1]);
        }
        Ok(out)
    }

    fn register_experts(&mut self, rank: usize, experts: usize, entries: &[Option<GroupEntry>]) -> Result<GroupId> {
        self.check_rank(rank)?;
        let id = self.next_group[rank];
        if let Some(l) = self.layout.local(rank) {
            let got = self.watched("register_experts", &format!("rank {rank}"), |s| {
                s.inner.register_experts(l, experts, entries)
            })?;
            if got != id {
                return Err(RuntimeError::Contract(format!(
                    "rank {rank}: the inner backend gave expert group id {got}, the program expects {id}"
                )));
            }
        }
        self.next_group[rank] += 1;
        let wf = &self.weight_formats[rank];
        let format = entries.iter().flatten().find_map(|e| wf.get(e.gate as usize).copied()).unwrap_or("empty");
        self.group_formats[rank].push(format);
        Ok(id)
    }

    fn mark(&mut self) -> Result<()> {
        self.marks += 1;
        self.watched("mark", "every local rank", |s| s.inner.mark())
    }

    fn collect(&mut self) -> Result<Collected> {
        let (tp, n_marks, n_tickets) = (self.layout.tp, self.marks, self.tickets.len());
        let call = format!("collect ({n_tickets} digests, {n_marks} marks per rank)");
        let out = self.watched(&call, "every rank", |s| {
            let got = s.inner.collect()?;
            // One word per ticket, then `n_marks` per global rank; each word is written by
            // exactly one process and is 0 in the others, so the sum is exact.
            let counters = crate::backend::BACKEND_COUNTERS;
            let n_mech = MECHANISMS.len();
            let mut words = vec![0u64; n_tickets + tp * n_marks + counters.len() + n_mech];
            let inner_counts = s.inner.engagement();
            for (i, name) in counters.iter().enumerate() {
                words[n_tickets + tp * n_marks + i] =
                    inner_counts.iter().filter(|(n, _)| n == name).map(|(_, v)| *v).sum();
            }
            let inner_census = s.inner.census();
            for (i, name) in MECHANISMS.iter().enumerate() {
                words[n_tickets + tp * n_marks + counters.len() + i] = inner_census.get(*name).copied().unwrap_or(0);
            }
            if let Some((n, _)) = inner_counts.iter().find(|(n, _)| !counters.contains(&n.as_str())) {
                return Err(RuntimeError::Contract(format!(
                    "engagement counter `{n}` of the inner backend is not in BACKEND_COUNTERS, so it cannot be summed \
                     across processes"
                )));
            }
            for (t, inner) in s.tickets.iter().enumerate() {
                if let Some(it) = inner {
                    words[t] = *got.digests.get(*it).ok_or_else(|| {
                        RuntimeError::Contract(format!("ticket {t}: the inner backend returned no digest {it}"))
                    })?;
                }
            }
            for (l, marks) in got.marks_ns.iter().enumerate() {
                let g = s.layout.global(l);
                for (i, m) in marks.iter().take(n_marks).enumerate() {
                    words[n_tickets + g * n_marks + i] = *m;
                }
            }
            let words = if s.layout.spec.processes == 1 {
                words
            } else {
                let (m, b) = s.mover();
                m.sum_u64(b, &words)?
            };
            let sent = n_tickets + tp * n_marks + counters.len() + n_mech;
            if words.len() != sent {
                return Err(RuntimeError::Contract(format!(
                    "the mover returned {} words for {sent} sent",
                    words.len()
                )));
            }
            let base = n_tickets + tp * n_marks;
            s.engaged = counters
                .iter()
                .zip(&words[base..base + counters.len()])
                .filter(|(_, v)| **v > 0)
                .map(|(n, v)| (n.to_string(), *v))
                .collect();
            s.mechanisms = MECHANISMS
                .iter()
                .zip(&words[base + counters.len()..])
                .filter(|(_, v)| **v > 0)
                .map(|(n, v)| (n.to_string(), *v))
                .collect();
            let marks_ns =
                (0..tp).map(|g| words[n_tickets + g * n_marks..n_tickets + (g + 1) * n_marks].to_vec()).collect();
            Ok(Collected { digests: words[..n_tickets].to_vec(), marks_ns })
        })?;
        self.tickets.clear();
        self.marks = 0;
        Ok(out)
    }

    fn probe(&mut self, transport: Transport, sizes_bytes: &[usize]) -> Result<Vec<ProbeResult>> {
        super::run_probe(self, transport, sizes_bytes)
    }

    fn all_reduce(&mut self) -> Option<&mut dyn AllReduce> {
        if self.inner.all_reduce().is_some() {
            Some(self)
        } else {
            None
        }
    }

    fn unfenced_copies(&mut self) -> Option<&mut dyn UnfencedCopies> {
        if self.inner.unfenced_copies().is_some() {
            Some(self)
        } else {
            None
        }
    }
}

impl<B: Backend, M: Mover<B>> Witness for DistBackend<B, M> {
    fn engagement(&self) -> Vec<(String, u64)> {
        self.engaged.clone()
    }

    /// The program's calls as counted here, plus the inner backends' mechanism counters summed
    /// over every process at the last collect.
    fn census(&self) -> Census {
        let mut c = self.census.clone();
        for (name, n) in &self.mechanisms {
            c.mechanism(name, *n);
        }
        c.counts()
    }

    fn build_options(&self) -> Vec<String> {
        self.inner.build_options()
    }

    fn plant(&mut self, d: TwinDefect) -> Result<()> {
        Err(d.refused(self.describe()))
    }
}

impl<B: Backend, M: Mover<B>> AllReduce for DistBackend<B, M> {
    fn all_reduce_sum(&mut self, parts: &[(usize, Slice)], out_rank: usize, out: Slice) -> Result<()> {
        if self.layout.spec.processes > 1 {
            return Err(self.refuse("MEMRA_NCCL_ALLREDUCE (NCCL's own all-reduce)"));
        }
        self.census.all_reduce(out.len);
        super::capability::all_reduce(&mut self.inner)?.all_reduce_sum(parts, out_rank, out)
    }
}

impl<B: Backend, M: Mover<B>> UnfencedCopies for DistBackend<B, M> {
    fn copy_unfenced(&mut self, c: Transfer) -> Result<()> {
        if self.layout.spec.processes > 1 {
            return Err(self.refuse("the skip_fence canary's unfenced copy"));
        }
        self.census.unfenced_copy(c.transport.name(), c.from.1.len);
        super::capability::unfenced_copies(&mut self.inner)?.copy_unfenced(c)
    }
}

#[cfg(test)]
mod tests;
