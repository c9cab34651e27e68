//! The CUDA backend (docs/DESIGN.md §3 on NVIDIA GPUs, through cudarc): every [`Op`] is one launch of
//! the `.cu` kernel whose host twin the host backend runs, on the rank's own stream.
//!
//! Placement: one context per device (the primary context, shared by every backend of the
//! process, with the compiled module loaded once); ranks live on distinct devices when there are
//! at least TP devices, else co-resident on device 0 — one stream and private allocations per
//! rank, so TP8 runs on a one-GPU machine. Ordering across ranks exists only through
//! [`Backend::copy`](super::Backend::copy), which orders the copy after both ranks' earlier work and before both ranks'
//! later work with events or, over `nccl`, with stream order (no host synchronisation inside a
//! step). Two deliberate departures, each behind its own switch: the NUMERIC door
//! MEMRA_NCCL_ALLREDUCE ([`AllReduce`](super::AllReduce), NCCL's own reduction order) and the
//! SkipFence canary ([`UnfencedCopies`](super::UnfencedCopies), a copy that does not wait for its producer).
//! Direct joins ([`PeerStores`](super::PeerStores), `direct.rs`) order a kernel's stores into
//! another rank's memory with the same two fences a copy has (events, or FENCE_MEMOPS doorbells).
//!
//! This module is the one room where driver calls live (ARCHITECTURE.md, architecture invariants),
//! and inside it `unsafe` lives only in the driver layer — `driver.rs` and `nccl_sys.rs` (raw),
//! `safe/` (typed handles and checked regions above them) — and in kernel-argument packing
//! (`launch/mod.rs`); every other file calls safe functions (tidy keeps a per-file ceiling,
//! `tests/tidy/unsafety.rs`). Every `unsafe` block names its invariant in a `// SAFETY:` line, and
//! every driver error becomes [`RuntimeError::Device`] naming the op, the rank and the device. On
//! any error, and on drop, every stream is drained before a buffer can be freed.
//!
//! This file holds the backend's state and the helpers every part shares (slice pointers, faults,
//! fences, digest slots); `backend.rs` implements the [`Backend`](super::Backend) trait on it, and the files
//! beside it the parts: `driver.rs` the raw driver and NVRTC calls, `safe/` the safe layer,
//! `compile.rs`, `launch/`, `transfer.rs`, `direct.rs`, `graph.rs`, `memory.rs`, `layout.rs`,
//! `nccl.rs`, `nccl_sys.rs` (NCCL's loader), `nccl_dist.rs`, `probe.rs`.

mod backend;
mod compile;
mod direct;
mod driver;
mod graph;
mod launch;
mod layout;
mod memory;
mod nccl;
mod nccl_dist;
mod nccl_sys;
mod probe;
mod safe;
mod transfer;

pub use compile::{compile, compiled_for, nvrtc_options, CompiledKernels};
pub use nccl::{nccl_library_present, nccl_version};
pub use nccl_dist::{exit_now, nccl_unique_id, NcclMover};
pub use probe::{
    cuda_backend_available, driver_library_present, nvrtc_library_present, probe_cuda, CudaSystem, CudaUnavailable,
    DeviceInfo,
};

use super::{Op, Slice};
use crate::backend::census::CensusCounter;
use crate::error::RuntimeError;
use crate::Result;
use compile::Kernels;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use memory::{driver_err, DeviceBuffer, DeviceWeight};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Where ranks are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlacementPolicy {
    /// Distinct devices when there are at least TP of them, else co-resident on device 0.
    #[default]
    Auto,
    /// Every rank on device 0 (its own stream and allocations), whatever the device count.
    CoResident,
}

/// Which GEMV storage layout the backend uploads weights in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemvLayout {
    /// Lane-major where the shape allows it (fast vector loads), row-major elsewhere.
    #[default]
    Fast,
    /// Row-major everywhere: the simple reference kernels (for localising a kernel bug).
    RowMajor,
}

/// Options of a [`CudaBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CudaOptions {
    pub placement: PlacementPolicy,
    pub gemv_layout: GemvLayout,
    /// Bytes held on every device for the backend's lifetime before anything else is allocated:
    /// fault injection standing in for a crowded device (plants an out-of-memory).
    pub reserve_bytes: usize,
    /// RANK0_MERGE: rank 0 issues its work on its device's default stream (the "model stream")
    /// instead of a stream of its own. Ordering across ranks stays event-based, so the bytes
    /// cannot change; only scheduling does.
    pub rank0_on_default_stream: bool,
    /// How each kernel follows the one before it on a stream.
    pub launch_order: LaunchOrder,
}

/// How a kernel launch is ordered after the work before it on its stream. Neither can change a
/// bit: every kernel's first statement (`kernel_entry()` in kernels/cuda/canon.cuh) waits for the
/// kernel before it to complete before it touches memory; only when its blocks are scheduled moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LaunchOrder {
    /// Programmatic stream serialization (sm_90 and later, on a stream of the rank's own): the
    /// next kernel's launch and block dispatch overlap the tail of the one before. Plain
    /// launches on older devices and on the default stream (RANK0_MERGE's rank 0).
    #[default]
    Programmatic,
    /// Plain launches: a kernel is scheduled only after the work before it completed.
    Serialized,
}

/// A device with its context and loaded kernels, shared by every backend of the process.
pub(crate) struct DeviceShared {
    pub info: DeviceInfo,
    pub ctx: Arc<CudaContext>,
    pub kernels: Kernels,
    pub compiled: Arc<CompiledKernels>,
}

/// One context per device per process: created, compiled for and loaded once.
fn shared_device(info: &DeviceInfo) -> Result<Arc<DeviceShared>> {
    type Map = Mutex<HashMap<usize, Arc<DeviceShared>>>;
    static DEVICES: OnceLock<Map> = OnceLock::new();
    let map = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(&info.ordinal) {
        return Ok(d.clone());
    }
    let ctx = CudaContext::new(info.ordinal)
        .map_err(|e| driver_err(format!("creating the context of device {}", info.ordinal), e))?;
    let compiled = compiled_for(&info.arch())?;
    let kernels = Kernels::load(&ctx, &compiled)?;
    let d = Arc::new(DeviceShared { info: info.clone(), ctx, kernels, compiled });
    map.insert(info.ordinal, d.clone());
    Ok(d)
}

/// Digest slots per device chunk (u64 each).
const DIGEST_CHUNK: usize = 4096;

/// One rank: a stream on its device and private allocations.
pub(crate) struct Rank {
    /// Index into `CudaBackend::devices`.
    pub dev: usize,
    pub stream: Arc<CudaStream>,
    /// Recorded on this rank's stream whenever another stream must wait for its work so far.
    pub sync_event: CudaEvent,
    /// f32 buffers: allocation and element count.
    pub bufs: Vec<(DeviceBuffer, usize)>,
    pub weights: Vec<DeviceWeight>,
    /// Timing events (a pool reused across collects) and how many are recorded since collect.
    pub mark_events: Vec<CudaEvent>,
    pub marks_used: usize,
    /// Digest slots: chunks of `DIGEST_CHUNK` u64, zeroed. Slots below `digests_reserved` are the
    /// regions of recorded graph segments; this step's other digests run from there to
    /// `digests_used`.
    pub digest_chunks: Vec<DeviceBuffer>,
    pub digests_used: usize,
    pub digests_reserved: usize,
    /// Expert groups (`register_experts`).
    pub groups: Vec<launch::experts::DeviceGroup>,
    /// Scratch of the multi-block reductions (argmax: a zeroed counter and the block bests).
    pub scratch: DeviceBuffer,
    /// Kernels are launched with programmatic stream serialization ([`LaunchOrder`]).
    pub programmatic: bool,
    /// Kernels issued on this stream so far (every launch and NCCL call); the count after the last
    /// op launched through [`Backend::launch`] / `launch_lanes`, and the buffers that op touched
    /// (one allocation reused launch after launch): [`CudaBackend::settled`] reads all three.
    pub kernels_issued: std::sync::atomic::AtomicU64,
    pub last_op_at: Option<u64>,
    pub last_op_bufs: Vec<crate::backend::BufId>,
}

/// Ranks on CUDA devices.
pub struct CudaBackend {
    /// Planted reservations (`CudaOptions::reserve_bytes`), freed with the backend.
    _reserved: Vec<DeviceBuffer>,
    /// Kernels rank 0 issued on the default stream (RANK0_MERGE's engagement evidence).
    merged_launches: u64,
    /// Grouped gate/up launches issued with their shared slot ahead of the wait
    /// ([`CudaBackend::settled`]); never part of a record (the plain launch order has none).
    ahead_launches: std::sync::atomic::AtomicU64,
    /// Packed copies of at least 2 blocks really issued (BULK_P2P's engagement evidence).
    packed_copies: u64,
    /// Doorbells rung with stream memops, fallbacks to events excluded (FENCE_MEMOPS's).
    doorbells_rung: u64,
    /// The doorbell flags of FENCE_MEMOPS, created on first use.
    bells: direct::BellState,
    /// Kernel doorbells rung (FENCE_RANK1's), fallbacks to events excluded.
    kernel_doorbells_rung: u64,
    /// FENCE_RANK1's flag words in each waiter's device memory, created on first use.
    kernel_bells: direct::KernelBells,
    // Field order is drop order: captured graphs (they may hold NCCL work, and NCCL waits for
    // graphs that reference a communicator before it lets the communicator go), then NCCL
    // communicators, then ranks (buffers, events, streams), then staging and devices.
    /// GRAPH: recorded segments and their captured graphs.
    graphs: graph::Graphs,
    /// NCCL communicators, one per rank, created on the first NCCL operation.
    nccl: Option<nccl::Comms>,
    ranks: Vec<Rank>,
    staging: transfer::Staging,
    devices: Vec<Arc<DeviceShared>>,
    opts: CudaOptions,
    /// Ticket → (rank, slot).
    tickets: Vec<(usize, usize)>,
    /// Launches since the last collect (for fault locations).
    launches: usize,
    /// What was issued (`backend::census`), counted as the host backend counts it, where each
    /// call reaches the driver (a replayed segment's calls are not issued, so not counted).
    census: CensusCounter,
    /// The lanes of the lane-grid launch being issued (`launch/lane_grid.rs`); one lane, every
    /// pitch 0, outside one.
    lane_grid: std::cell::Cell<launch::lane_grid::LanePitch>,
}

impl CudaBackend {
    /// `n_ranks` ranks (TP 1, 2, 4 or 8) with default options. Fails with `Unavailable` and a
    /// typed reason when there is no driver, no device or no NVRTC.
    pub fn new(n_ranks: usize) -> Result<CudaBackend> {
        CudaBackend::with_options(n_ranks, CudaOptions::default())
    }

    pub fn with_options(n_ranks: usize, opts: CudaOptions) -> Result<CudaBackend> {
        crate::config::check_tp(n_ranks)?;
        let system = cuda_backend_available()?;
        let distinct = opts.placement == PlacementPolicy::Auto && system.devices.len() >= n_ranks;
        let ordinals: Vec<usize> = if distinct { (0..n_ranks).collect() } else { vec![0] };
        let devices: Vec<Arc<DeviceShared>> =
            ordinals.iter().map(|o| shared_device(&system.devices[*o])).collect::<Result<_>>()?;
        let mut ranks = Vec::with_capacity(n_ranks);
        for r in 0..n_ranks {
            let dev = if distinct { r } else { 0 };
            let ctx = &devices[dev].ctx;
            let loc = |what: &str| format!("creating rank {r}'s {what} on device {}", devices[dev].info.ordinal);
            let on_default_stream = r == 0 && opts.rank0_on_default_stream;
            let programmatic = opts.launch_order == LaunchOrder::Programmatic
                && devices[dev].info.compute_capability.0 >= 9
                && !on_default_stream;
            let stream = if on_default_stream {
                ctx.default_stream()
            } else {
                ctx.new_stream().map_err(|e| driver_err(loc("stream"), e))?
            };
            let sync_event = ctx.new_event(None).map_err(|e| driver_err(loc("event"), e))?;
            let scratch = DeviceBuffer::zeroed(ctx, &stream, launch::ARGMAX_SCRATCH_BYTES, "reduction scratch")?;
            ranks.push(Rank {
                dev,
                stream,
                sync_event,
                bufs: Vec::new(),
                weights: Vec::new(),
                mark_events: Vec::new(),
                marks_used: 0,
                digest_chunks: Vec::new(),
                digests_used: 0,
                digests_reserved: 0,
                groups: Vec::new(),
                scratch,
                programmatic,
                kernels_issued: std::sync::atomic::AtomicU64::new(0),
                last_op_at: None,
                last_op_bufs: Vec::new(),
            });
        }
        let staging = transfer::Staging::new(devices.len());
        let mut reserved = Vec::new();
        if opts.reserve_bytes > 0 {
            for (i, d) in devices.iter().enumerate() {
                let r = ranks.iter().find(|r| r.dev == i).expect("every device hosts a rank");
                reserved.push(DeviceBuffer::zeroed(
                    &d.ctx,
                    &r.stream,
                    opts.reserve_bytes,
                    "reserved (planted) device memory",
                )?);
            }
        }
        Ok(CudaBackend {
            nccl: None,
            graphs: graph::Graphs::default(),
            ranks,
            staging,
            devices,
            opts,
            tickets: Vec::new(),
            launches: 0,
            census: CensusCounter::new(n_ranks),
            lane_grid: std::cell::Cell::new(launch::lane_grid::LanePitch::ONE),
            merged_launches: 0,
            ahead_launches: std::sync::atomic::AtomicU64::new(0),
            packed_copies: 0,
            doorbells_rung: 0,
            bells: direct::BellState::Untried,
            kernel_doorbells_rung: 0,
            kernel_bells: direct::KernelBells::default(),
            _reserved: reserved,
        })
    }

    /// The census name of `op`'s kernel on `rank` (`Op::kernel`, as the host names it).
    fn kernel(&self, rank: usize, op: &Op) -> String {
        let r = &self.ranks[rank];
        op.kernel(
            |w| r.weights.get(w as usize).map_or("unknown", |w| w.kind.suffix()),
            |g| r.groups.get(g as usize).map_or("unknown", |g| g.format),
        )
    }

    /// Device ordinal of every rank.
    pub fn placement(&self) -> Vec<usize> {
        self.ranks.iter().map(|r| self.devices[r.dev].info.ordinal).collect()
    }

    /// Whether several ranks share one device.
    pub fn co_resident(&self) -> bool {
        self.devices.len() < self.ranks.len()
    }

    /// The NVRTC compilation the kernels came from (options and source digest, for receipts).
    pub fn compiled(&self) -> Arc<CompiledKernels> {
        self.devices[0].compiled.clone()
    }

    pub fn options(&self) -> CudaOptions {
        self.opts
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        crate::backend::check_rank(rank, self.ranks.len())
    }

    /// Device address of a slice after checking it lies inside its buffer (a kernel argument).
    pub(crate) fn slice_ptr(&self, rank: usize, s: Slice, what: &str) -> Result<driver::CUdeviceptr> {
        self.slice_region(rank, s, what).map(safe::DevicePtr::addr)
    }

    /// The device region of a slice after checking it lies inside its buffer (for copies).
    pub(crate) fn slice_region(&self, rank: usize, s: Slice, what: &str) -> Result<safe::DevicePtr> {
        self.check_rank(rank)?;
        match self.ranks[rank].bufs.get(s.buf as usize) {
            Some((b, len)) if s.offset + s.len <= *len => b.region().sub(s.offset * 4, s.len * 4).ok_or_else(|| {
                RuntimeError::Contract(format!(
                    "{what}: slice {}+{} of buffer {} on rank {rank} leaves its allocation",
                    s.offset, s.len, s.buf
                ))
            }),
            Some((_, len)) => Err(RuntimeError::Contract(format!(
                "{what}: slice {}+{} of buffer {} on rank {rank} exceeds its {len} elements",
                s.offset, s.len, s.buf
            ))),
            None => Err(RuntimeError::Contract(format!("{what}: buffer {} does not exist on rank {rank}", s.buf))),
        }
    }

    pub(crate) fn ctx_of(&self, rank: usize) -> &Arc<CudaContext> {
        &self.devices[self.ranks[rank].dev].ctx
    }

    pub(crate) fn ordinal_of(&self, rank: usize) -> usize {
        self.devices[self.ranks[rank].dev].info.ordinal
    }

    /// A driver error at `location` on `rank`: drain every stream, then report it.
    pub(crate) fn fault(&self, rank: usize, location: &str, e: impl std::fmt::Display) -> RuntimeError {
        self.drain();
        RuntimeError::Device {
            location: format!(
                "{location} on rank {rank} (device {}), launch #{} of this step",
                self.ordinal_of(rank),
                self.launches
            ),
            detail: e.to_string(),
        }
    }

    /// Wait for every stream, ignoring errors (they are reported by the caller or the context).
    fn drain(&self) {
        for r in &self.ranks {
            let _ = r.stream.synchronize();
        }
        self.graphs.drain();
    }

    /// Synchronize every stream, then check every context's recorded error state.
    fn sync_all(&self, what: &str) -> Result<()> {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Sync);
        for (i, r) in self.ranks.iter().enumerate() {
            r.stream.synchronize().map_err(|e| self.fault(i, what, e))?;
        }
        for d in &self.devices {
            d.ctx.check_err().map_err(|e| {
                self.drain();
                driver_err(format!("{what}: context error state of device {}", d.info.ordinal), e)
            })?;
        }
        Ok(())
    }

    /// Make `waiter`'s later work wait for everything queued on `producer` so far.
    pub(crate) fn order_after(&self, waiter: usize, producer: usize, what: &str) -> Result<()> {
        if waiter == producer {
            return Ok(());
        }
        let p = &self.ranks[producer];
        p.sync_event.record(&p.stream).map_err(|e| self.fault(producer, what, e))?;
        self.ranks[waiter].stream.wait(&p.sync_event).map_err(|e| self.fault(waiter, what, e))
    }

    /// Enough zeroed digest chunks on `rank` for `slots` slots.
    pub(crate) fn ensure_digest_slots(&mut self, rank: usize, slots: usize) -> Result<()> {
        while self.ranks[rank].digest_chunks.len() * DIGEST_CHUNK < slots {
            let ctx = self.ctx_of(rank).clone();
            let r = &self.ranks[rank];
            let b = DeviceBuffer::zeroed(&ctx, &r.stream, DIGEST_CHUNK * 8, "digest slots")?;
            self.ranks[rank].digest_chunks.push(b);
        }
        Ok(())
    }

    /// The next zeroed digest slot on `rank` and its address: the open graph segment's region in a
    /// capture or replay pass, else the step's next running slot (a new chunk when needed).
    fn digest_slot(&mut self, rank: usize) -> Result<(usize, driver::CUdeviceptr)> {
        let slot = match self.graphs.segment_digest_slot(rank) {
            Some(s) => s,
            None => {
                let r = &mut self.ranks[rank];
                r.digests_used = r.digests_used.max(r.digests_reserved) + 1;
                r.digests_used - 1
            }
        };
        self.ensure_digest_slots(rank, slot + 1)?;
        Ok((slot, self.ranks[rank].digest_chunks[slot / DIGEST_CHUNK].ptr() + ((slot % DIGEST_CHUNK) * 8) as u64))
    }

    /// Refuse a host transfer inside an open graph segment (it would synchronise a capture).
    fn no_open_segment(&self, what: &str) -> Result<()> {
        if self.graphs.open() {
            return Err(RuntimeError::Contract(format!(
                "{what} inside a graph segment: a captured segment holds device work only"
            )));
        }
        Ok(())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Nothing may be freed while a kernel or copy could still touch it.
        self.drain();
        for d in &self.devices {
            let _ = d.ctx.check_err();
        }
    }
}

// A `CudaBackend` may move to another thread between calls (a pool hands a prepared backend to
// whichever worker runs the next configuration), never be called from two at once. It is `Send`
// because every handle it holds is (the safe driver layer states why for its raw ones: pinned
// memory, graphs, NCCL communicators); every driver call binds the rank's context on the calling
// thread first (cudarc binds internally, the backend calls `bind_to_thread`).
const _: fn() = || {
    fn send<T: Send>() {}
    send::<CudaBackend>();
};
