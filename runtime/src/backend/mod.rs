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
//! This file is the contract itself: the [`Backend`] trait (the data plane: buffers, launches,
//! copies, digests, marks, rewind), the ids, [`Slice`]s and [`Transfer`]s it speaks in, what
//! `collect` returns. A backend's evidence is its [`Witness`] half (`crate::evidence::witness`);
//! door mechanisms are optional capabilities (`capability.rs`: peer stores, packed copies,
//! graphs, all-reduce, unfenced copies) handed out as `Option<&mut dyn …>`, so a backend without
//! one has nothing to fall back to. Beside it: `op/` the work a backend is handed ([`Op`] and
//! everything known about one — name, slices, census kernel —, digest parts, a join's fences,
//! packed copies), `probe.rs` the byte-integrity probe and the copy bandwidth,
//! written once over the trait, `open.rs` opening a backend by kind (and over processes),
//! `census.rs` the one census counter (its mutators visible only in here).

pub mod capability;
mod census;
pub mod cuda;
pub mod dist;
pub mod host;
pub mod intercept;
mod op;
mod open;
mod probe;

pub use crate::evidence::witness::{Witness, BACKEND_COUNTERS};
pub use capability::{AllReduce, Capability, Graphs, PackedCopies, PeerStores, UnfencedCopies};
pub use host::HostRanks;
pub use op::{peer_store_target, DigestPart, GroupEntry, JoinFence, Op, OwnedSlots, Packed, RowOrder, RowPitch};
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

/// One copy: `from.1.len` elements from a slice of rank `from.0` to a slice of rank `to.0`, over
/// `transport` (a same-rank copy is local whatever the transport).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    pub transport: Transport,
    pub from: (usize, Slice),
    pub to: (usize, Slice),
}

impl Transfer {
    pub fn new(transport: Transport, from: (usize, Slice), to: (usize, Slice)) -> Transfer {
        Transfer { transport, from, to }
    }
}

/// A machine that runs the canonical program: the data plane every backend carries out, its
/// evidence ([`Witness`]), and door mechanisms as optional capabilities ([`capability`]).
pub trait Backend: Witness {
    /// One line: backend, devices, placement of ranks.
    fn describe(&self) -> String;
    fn ranks(&self) -> usize;
    /// Every rank launches its kernels with programmatic dependent launch (CUDA on sm_90 and
    /// later, `cuda::LaunchOrder`); false for a backend without kernels.
    fn programmatic_launches(&self) -> bool {
        false
    }
    /// Place a weight shard on a rank.
    fn upload_weight(&mut self, rank: usize, shard: &MatrixShard) -> Result<WeightId>;
    /// [`Backend::upload_weight`] of a shard the caller does not need again (the host backend
    /// keeps it without a copy).
    fn upload_weight_owned(&mut self, rank: usize, shard: MatrixShard) -> Result<WeightId> {
        self.upload_weight(rank, &shard)
    }
    /// Place a table of experts on a rank for the grouped expert ops: `entries[e]` is expert e as
    /// this rank holds it (`None`: not held), `experts` routed entries then the shared one(s).
    /// Every entry's matrices must be weights of this rank with one format and matching shapes
    /// (gate/up rows = down columns).
    fn register_experts(&mut self, rank: usize, experts: usize, entries: &[Option<GroupEntry>]) -> Result<GroupId>;
    /// A zero-initialised buffer of `len` elements on a rank.
    fn alloc(&mut self, rank: usize, len: usize) -> Result<BufId>;
    /// Host → rank; `data.len() == dst.len`.
    fn write(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()>;
    /// Rank → host, after the rank's prior work.
    fn read(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>>;
    fn launch(&mut self, rank: usize, op: Op) -> Result<()>;
    /// The same op for every lane of a pass (rows or columns, docs/DESIGN.md §3.6): `ops[i]` is
    /// lane i's. Defined as launching each in order; a backend may fuse lanes that read the same
    /// weight into one multi-row launch (each weight read once), which must give the same bits.
    fn launch_lanes(&mut self, rank: usize, ops: Vec<Op>) -> Result<()> {
        ops.into_iter().try_for_each(|op| self.launch(rank, op))
    }
    /// Move the bytes of `c` (ordered after the source's earlier work, before the destination's
    /// later work).
    fn copy(&mut self, c: Transfer) -> Result<()>;
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
    /// Bytes moved per second (read + written) by a device-to-device copy of `bytes` on rank 0,
    /// median of timed repetitions; `None` where the backend has no device memory to measure.
    fn copy_bandwidth(&mut self, bytes: usize) -> Result<Option<f64>> {
        let _ = bytes;
        Ok(None)
    }

    /// The state [`Backend::rewind`] returns to; `None` where the backend cannot rewind (then
    /// every run needs a backend of its own).
    fn checkpoint(&self) -> Option<Checkpoint> {
        None
    }
    /// The first run on a backend that cannot rewind begins here (its prepared weights serve
    /// that one run): forget what the upload counted, so its census holds the run's calls only,
    /// as a rewound backend's does. The default has nothing to forget.
    fn first_run_begins(&mut self) {}
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

    /// Peer stores (direct joins), where the backend has them.
    fn peer_stores(&mut self) -> Option<&mut dyn PeerStores> {
        None
    }
    /// Packed copies (BULK_P2P), where the backend has them.
    fn packed_copies(&mut self) -> Option<&mut dyn PackedCopies> {
        None
    }
    /// Graph segments (GRAPH), where the backend has them.
    fn graphs(&mut self) -> Option<&mut dyn Graphs> {
        None
    }
    /// NCCL's all-reduce (NCCL_ALLREDUCE), where the backend has it.
    fn all_reduce(&mut self) -> Option<&mut dyn AllReduce> {
        None
    }
    /// Copies without their producer fence (the skip_fence canary), where the backend has them.
    fn unfenced_copies(&mut self) -> Option<&mut dyn UnfencedCopies> {
        None
    }
}

/// `rank` is one of a backend's `n` ranks, or a typed error naming both.
pub(crate) fn check_rank(rank: usize, n: usize) -> Result<()> {
    if rank < n {
        Ok(())
    } else {
        Err(crate::RuntimeError::Contract(format!("rank {rank} does not exist: this backend has {n} ranks")))
    }
}
