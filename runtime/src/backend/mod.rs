//! The backend contract: what the canonical program asks of a machine.
//!
//! A backend owns `ranks()` ranks. Each rank has private memory (an arena on the host, a CUDA
//! context's allocations on a device) and executes its work in issue order, like a stream.
//! [`Backend::launch`] and [`Backend::copy`] may return before the work is done; ordering across
//! ranks exists only through `copy` (the destination's later work sees the bytes; the source's
//! earlier work produced them). [`Backend::read`] and [`Backend::collect`] wait.
//!
//! Every [`Op`] is one kernel; its arithmetic is the host twin's in `memra_kernels::twins`.
//!
//! This file is the contract itself: the [`Backend`] trait, the ids and [`Slice`]s it speaks in,
//! what `collect` returns. Beside it: `op.rs` the work a backend is handed ([`Op`], digest parts,
//! a join's fences, packed copies), `probe.rs` the byte-integrity probe and the copy bandwidth,
//! written once over the trait, `open.rs` opening a backend by kind (and over processes).

pub mod census;
pub mod coverage;
pub mod cuda;
pub mod defect;
pub mod dist;
pub mod host;
mod op;
mod open;
mod probe;

pub use host::HostRanks;
pub use op::{peer_store_target, DigestPart, GroupEntry, JoinFence, Op, OwnedSlots, Packed, RowOrder};
pub use op::{OwnerRule, SlotOwner};
pub use open::{cuda_available, cuda_device_count, open, open_distributed, open_with, BackendKind, OpenOptions};
pub use probe::{measure_copy_bandwidth, probe_word, run_probe, PROBE_SIZES_BYTES};

use crate::config::Transport;
use crate::model::matrix::MatrixShard;
use crate::Result;

/// A rank-local f32 buffer (u32 payloads such as router ids travel as bit patterns).
pub type BufId = u32;
/// A rank-local weight shard.
pub type WeightId = u32;
/// A rank-local table of experts read by the grouped expert ops ([`Backend::register_experts`]).
pub type GroupId = u32;

/// `len` elements of buffer `buf` from element `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub buf: BufId,
    pub offset: usize,
    pub len: usize,
}

impl Slice {
    pub fn new(buf: BufId, offset: usize, len: usize) -> Slice {
        Slice { buf, offset, len }
    }
    /// The sub-slice `[start, start + len)` of this slice.
    pub fn sub(self, start: usize, len: usize) -> Slice {
        debug_assert!(start + len <= self.len, "sub-slice {start}+{len} outside slice of {}", self.len);
        Slice { buf: self.buf, offset: self.offset + start, len }
    }
}

/// What `collect` returns: digests in ticket order, and per-rank timing marks (ns since the
/// first mark after the previous collect).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collected {
    pub digests: Vec<u64>,
    pub marks_ns: Vec<Vec<u64>>,
}

/// Result of the byte-integrity probe for one ordered rank pair and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    pub src: usize,
    pub dst: usize,
    pub bytes: usize,
    pub bad_words: usize,
    /// Peer access is not available for this pair: native-P2P runs must be SKIPPED.
    pub no_peer_access: Option<String>,
}

/// Where a backend stands after a program's weights are placed: the buffers each rank holds.
/// [`Backend::rewind`] returns to it, so several runs share one upload (docs/DESIGN.md §8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Buffers allocated on each rank (ids `0..n` stay, later ones are freed).
    pub buffers: Vec<usize>,
}

/// A machine that runs the canonical program.
pub trait Backend {
    /// One line: backend, devices, placement of ranks.
    fn describe(&self) -> String;
    fn ranks(&self) -> usize;
    /// Place a weight shard on a rank.
    fn upload_weight(&mut self, rank: usize, shard: &MatrixShard) -> Result<WeightId>;
    /// [`Backend::upload_weight`] of a shard the caller does not need again (the host backend
    /// keeps it without a copy).
    fn upload_weight_owned(&mut self, rank: usize, shard: MatrixShard) -> Result<WeightId> {
        self.upload_weight(rank, &shard)
    }
    /// The state [`Backend::rewind`] returns to; `None` where the backend cannot rewind (then
    /// every run needs a backend of its own).
    fn checkpoint(&self) -> Option<Checkpoint> {
        None
    }
    /// Start a new run on the weights already placed: free every buffer allocated after `to`
    /// (ids from `to.buffers[rank]` on), forget every graph segment, and reset what a run counts
    /// or queues — engagement counters, timing marks, digest tickets — so the next run sees the
    /// backend exactly as right after the upload. Weights and expert groups stay. The default
    /// refuses.
    fn rewind(&mut self, to: &Checkpoint) -> Result<()> {
        let _ = to;
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "rewind",
            rule: format!(
                "{}: this backend cannot start a new run on weights it already holds (open a fresh one)",
                self.describe()
            ),
        })
    }
    /// A zero-initialised buffer of `len` elements on a rank.
    fn alloc(&mut self, rank: usize, len: usize) -> Result<BufId>;
    /// Host → rank; `data.len() == dst.len`.
    fn write(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()>;
    /// Rank → host, after the rank's prior work.
    fn read(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>>;
    fn launch(&mut self, rank: usize, op: Op) -> Result<()>;
    /// Move `src.len` elements from a slice of `src_rank` to one of `dst_rank` over `transport`.
    fn copy(&mut self, transport: Transport, src_rank: usize, src: Slice, dst_rank: usize, dst: Slice) -> Result<()>;
    /// Queue a digest (`digest_f32` with global base index) of a slice; its value comes back in
    /// `collect().digests[ticket]`.
    fn digest(&mut self, rank: usize, src: Slice, base: u64) -> Result<usize>;
    /// Queue one batched digest per group of parts (one launch per call on a device): the value of
    /// group g — the wrapping sum of its parts' digests, each block with its global base, owned
    /// blocks only — comes back as the wrapping sum of `collect().digests[t]` over the tickets
    /// `t` of `result[g]`. The default digests every block with [`Backend::digest`] (one ticket
    /// each) and refuses an ownership condition, which needs the route on the device.
    fn digest_batch(&mut self, rank: usize, groups: &[Vec<DigestPart>]) -> Result<Vec<Vec<usize>>> {
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            let mut tickets = Vec::new();
            for p in g {
                if p.owned.is_some() {
                    return Err(crate::RuntimeError::Unsupported {
                        backend: self.describe(),
                        mechanism: "owner-read digests",
                        rule: format!(
                            "{}: this backend cannot digest expert-parallel slots whose owner is read from the route",
                            self.describe()
                        ),
                    });
                }
                for i in 0..p.blocks {
                    tickets.push(self.digest(rank, p.block(i), p.base + i as u64 * p.base_pitch)?);
                }
            }
            out.push(tickets);
        }
        Ok(out)
    }
    /// Queue a timing mark on every rank.
    fn mark(&mut self) -> Result<()>;
    /// Wait for every rank; return queued digests and marks and reset both queues.
    fn collect(&mut self) -> Result<Collected>;
    /// The byte-integrity probe of docs/DESIGN.md §3.5 over every ordered pair at `sizes_bytes`.
    fn probe(&mut self, transport: Transport, sizes_bytes: &[usize]) -> Result<Vec<ProbeResult>>;

    /// NUMERIC-CLASS door MEMRA_NCCL_ALLREDUCE: NCCL's all-reduce (sum) of one vector per rank,
    /// in whatever order NCCL's algorithm picks (not the canonical fold). `parts` holds exactly one
    /// `(rank, slice)` per rank, all of `out.len` elements; `out` on `out_rank` receives the sum,
    /// and every other rank's part is overwritten with it (an all-reduce writes every rank).
    /// Ordered like a copy: after each rank's earlier work, before `out_rank`'s later work. Only a
    /// backend with NCCL has it; the default refuses.
    fn all_reduce_sum(&mut self, parts: &[(usize, Slice)], out_rank: usize, out: Slice) -> Result<()> {
        let _ = (parts, out_rank, out);
        Err(crate::RuntimeError::Unsupported { backend: self.describe(), mechanism: "NCCL all-reduce", rule: format!(
            "{}: this backend has no NCCL all-reduce (MEMRA_NCCL_ALLREDUCE needs the CUDA backend with the nccl transport)",
            self.describe()
        ) })
    }

    /// CANARY SkipFence: like [`Backend::copy`], except that the copy does NOT wait for the source
    /// rank's earlier work (the producer of the bytes) — a planted race. A backend whose copies
    /// cannot be separated from their producer fence refuses: the default never falls back to the
    /// fenced copy, which would make the canary pass silently.
    fn copy_unfenced(
        &mut self,
        transport: Transport,
        src_rank: usize,
        src: Slice,
        dst_rank: usize,
        dst: Slice,
    ) -> Result<()> {
        let _ = (transport, src_rank, src, dst_rank, dst);
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "unfenced copies",
            rule: format!(
                "{}: this backend has no producer fence to skip (the skip_fence canary needs device streams)",
                self.describe()
            ),
        })
    }

    /// Direct joins (OPROJ_DIRECT, MOE_DIRECT): run `op` on `rank` with its inputs on `rank` and
    /// its one output ([`Op::store_target`]) a slice of `out_rank` — the kernel stores straight
    /// into `out_rank`'s memory; no slice of `rank` is written and no copy follows. Ordered after
    /// `out_rank`'s earlier work and before its later work (the join's two fences, carried out
    /// as `fence` says), and after `rank`'s earlier work (stream order). The default refuses: a
    /// backend without peer stores must never fall back to a copy, which would make the door
    /// vacuous.
    fn launch_peer_store(&mut self, rank: usize, op: Op, out_rank: usize, fence: JoinFence) -> Result<()> {
        let _ = (rank, op, out_rank, fence);
        Err(crate::RuntimeError::Unsupported { backend: self.describe(), mechanism: "peer stores", rule: format!(
            "{}: this backend has no peer stores (MEMRA_OPROJ_DIRECT / MEMRA_MOE_DIRECT need a kernel that writes into another rank's memory)",
            self.describe()
        ) })
    }

    /// BULK_P2P: move every block of `p` from `src_rank` to `dst_rank` in ONE copy over
    /// `transport`, ordered like [`Backend::copy`]. A backend that carries it out counts
    /// `bulk_p2p.packed_copies` in [`Backend::engagement`] for each packed copy of at least 2
    /// blocks. The default refuses (never one copy per block in disguise).
    fn copy_packed(&mut self, transport: Transport, src_rank: usize, dst_rank: usize, p: Packed) -> Result<()> {
        let _ = (transport, src_rank, dst_rank, p);
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "packed copies",
            rule: format!(
                "{}: this backend has no packed copies (MEMRA_STEP_TP_BULK_P2P needs the CUDA backend over native-p2p)",
                self.describe()
            ),
        })
    }

    /// Bytes moved per second (read + written) by a device-to-device copy of `bytes` on rank 0,
    /// median of timed repetitions; `None` where the backend has no device memory to measure.
    fn copy_bandwidth(&mut self, bytes: usize) -> Result<Option<f64>> {
        let _ = bytes;
        Ok(None)
    }

    /// GRAPH: open a shape-stable segment named `key`: the launches, copies, digests and marks
    /// issued until [`Backend::segment_end`] form one unit that a backend with graphs records on
    /// its first pass, captures on the second and replays on every later one — the caller issues
    /// the same calls every time (the backend checks that and fails on any difference). Host reads
    /// and writes are refused inside a segment. The default refuses: a backend without graphs
    /// never runs the door as the eager path.
    fn segment_begin(&mut self, key: u64) -> Result<()> {
        let _ = key;
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "graph capture",
            rule: format!(
                "{}: this backend cannot capture graphs (MEMRA_STEP_TP_GRAPH needs the CUDA backend)",
                self.describe()
            ),
        })
    }

    /// GRAPH: close the open segment (on a replay pass this launches the captured graph).
    fn segment_end(&mut self) -> Result<()> {
        Err(crate::RuntimeError::Contract(format!("{}: no graph segment is open", self.describe())))
    }

    /// GRAPH: abandon the open segment after an error (a capture in progress is discarded).
    fn segment_abort(&mut self) {}

    /// Place a table of experts on a rank for the grouped expert ops: `entries[e]` is expert e as
    /// this rank holds it (`None`: not held), `experts` routed entries then the shared one(s).
    /// Every entry's matrices must be weights of this rank with one format and matching shapes
    /// (gate/up rows = down columns). The default refuses: the grouped ops need it.
    fn register_experts(&mut self, rank: usize, experts: usize, entries: &[Option<GroupEntry>]) -> Result<GroupId> {
        let _ = (rank, experts, entries);
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "expert groups",
            rule: format!("{}: this backend has no expert groups", self.describe()),
        })
    }

    /// Engagement counters of mechanisms the backend itself carries out (e.g. RANK0_MERGE's
    /// merged launches), added to the record after the run.
    fn engagement(&self) -> Vec<(String, u64)> {
        Vec::new()
    }

    /// The census of everything issued since the backend was opened ([`census`]): counted where
    /// the driver or the host arena is called. A backend that keeps none reports an empty census,
    /// and then no door can be witnessed on it (its runs are VOID).
    fn census(&self) -> census::Census {
        census::Census::new()
    }

    /// The coverage counters of the ops run so far ([`coverage`]); `None` where the backend does
    /// not count them (the CUDA kernels do not).
    fn coverage(&mut self) -> Result<Option<coverage::Coverage>> {
        Ok(None)
    }

    /// Where the program is (the seam whose work follows), for the first-reach places of the
    /// coverage counters. Backends that do not count coverage ignore it.
    fn note_position(&mut self, at: coverage::SeamPoint) {
        let _ = at;
    }

    /// Plant a twin defect (a CANARY of [`defect`]) in every later op it affects. The default
    /// refuses: a backend whose kernels cannot carry the defect must never run the canary as the
    /// canonical arithmetic, which would make it pass silently.
    fn plant(&mut self, d: defect::TwinDefect) -> Result<()> {
        Err(crate::RuntimeError::Unsupported {
            backend: self.describe(),
            mechanism: "twin defects",
            rule: format!(
                "{}: this backend cannot plant the twin defect {} (the canary runs on the host backend)",
                self.describe(),
                d.name()
            ),
        })
    }

    /// The compiler options that decided the kernels' arithmetic (NVRTC options on CUDA,
    /// starting with the architecture); empty where the host twins run.
    fn build_options(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Every engagement counter a backend may report through [`Backend::engagement`] (mechanisms the
/// backend carries out alone). The distributed backend sums exactly these across processes.
pub const BACKEND_COUNTERS: [&str; 4] =
    ["rank0_merge.merged_launches", "graph.replays", "bulk_p2p.packed_copies", "fence_memops.doorbells"];

/// `rank` is one of a backend's `n` ranks, or a typed error naming both.
pub(crate) fn check_rank(rank: usize, n: usize) -> Result<()> {
    if rank < n {
        Ok(())
    } else {
        Err(crate::RuntimeError::Contract(format!("rank {rank} does not exist: this backend has {n} ranks")))
    }
}
