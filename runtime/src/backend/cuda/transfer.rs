//! Moving bytes between ranks (docs/DESIGN.md §3.5). A transport never does arithmetic.
//!
//! Every cross-rank copy is ordered like the host backend's send/receive pair, with events only:
//! it runs after all work queued so far on BOTH ranks (the source produced the bytes; the
//! destination finished reading what they overwrite) and before any work queued later on either
//! (the destination's consumers see them; the source's later writes cannot race the read).
//! - same rank: one device-to-device copy on its stream;
//! - `native-p2p`: the destination's stream position is recorded and awaited by the source
//!   stream, the copy runs on the source stream (`cuMemcpyDtoDAsync` when both ranks share a
//!   device, `cuMemcpyPeerAsync` with peer access enabled between two devices), and the
//!   destination stream awaits it;
//! - `host-bounce`: device → pinned host staging on the source stream, then staging → device on
//!   the destination stream after an event. Staging buffers form a ring per destination device;
//!   a slot is reused only after the event recorded behind its last upload (awaited on the GPU,
//!   so the host never blocks inside a step);
//! - `nccl`: one grouped ncclSend on the source stream + ncclRecv on the destination stream
//!   (`nccl.rs`; stream order gives the same ordering without events). Not between co-resident
//!   ranks: NCCL needs one device per rank.
//!
//! The SkipFence canary's [`CudaBackend::copy_unfenced_slices`] is the one copy that breaks this
//! contract on purpose: it does not wait for the source's earlier work (the producer).

use super::driver;
use super::graph::Pass;
use super::memory::{driver_err, PinnedBuffer};
use super::safe::{self, Device, DevicePtr, HostSpan};
use super::CudaBackend;
use crate::backend::{Packed, ProbeResult, Slice};
use crate::config::Transport;
use crate::error::RuntimeError;
use crate::Result;
use cudarc::driver::CudaEvent;
use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// Slots in each destination device's staging ring.
const RING_SLOTS: usize = 64;

struct StagingSlot {
    buf: Option<PinnedBuffer>,
    /// Recorded on the destination stream after the last upload from this slot.
    free: Option<CudaEvent>,
}

/// Pinned staging rings, one per device of the backend (indexed like `CudaBackend::devices`).
pub(crate) struct Staging {
    rings: Vec<(Vec<StagingSlot>, usize)>,
}

impl Staging {
    pub(crate) fn new(n_devices: usize) -> Staging {
        let ring = || (0..RING_SLOTS).map(|_| StagingSlot { buf: None, free: None }).collect::<Vec<_>>();
        Staging { rings: (0..n_devices).map(|_| (ring(), 0)).collect() }
    }
}

/// Ordered device pairs whose peer access is enabled in this process (context state).
fn peer_enabled() -> &'static Mutex<HashSet<(usize, usize)>> {
    static SET: OnceLock<Mutex<HashSet<(usize, usize)>>> = OnceLock::new();
    SET.get_or_init(|| Mutex::new(HashSet::new()))
}

impl CudaBackend {
    pub(crate) fn copy_slices(
        &mut self,
        transport: Transport,
        src_rank: usize,
        src: Slice,
        dst_rank: usize,
        dst: Slice,
    ) -> Result<()> {
        let sp = self.slice_region(src_rank, src, "copy source")?;
        let dp = self.slice_region(dst_rank, dst, "copy destination")?;
        if src.len != dst.len {
            return Err(RuntimeError::Contract(format!("copy of {} elements into a slice of {}", src.len, dst.len)));
        }
        if src.len == 0 {
            return Ok(());
        }
        let bytes = src.len * 4;
        if src_rank == dst_rank {
            if src.buf == dst.buf && src.offset < dst.offset + dst.len && dst.offset < src.offset + src.len {
                return Err(RuntimeError::Contract(format!(
                    "copy within buffer {} on rank {src_rank}: ranges {}+{} and {}+{} overlap",
                    src.buf, src.offset, src.len, dst.offset, dst.len
                )));
            }
            return self.dtod(src_rank, dp, sp, bytes, "copy on one rank");
        }
        let same_device = self.ranks[src_rank].dev == self.ranks[dst_rank].dev;
        match transport {
            Transport::Nccl if same_device => Err(self.nccl_co_resident()),
            Transport::Nccl => self.nccl_copy(src_rank, sp, dst_rank, dp, src.len),
            Transport::NativeP2p => {
                let what = "native-p2p copy";
                self.order_after(src_rank, dst_rank, what)?;
                if same_device {
                    self.dtod(src_rank, dp, sp, bytes, what)?;
                } else {
                    self.ensure_peer_access(src_rank, dst_rank)?;
                    let s = &self.ranks[src_rank];
                    let (sctx, dctx) = (self.ctx_of(src_rank), self.ctx_of(dst_rank));
                    sctx.bind_to_thread().map_err(|e| self.fault(src_rank, what, e))?;
                    if self.graphs.pass() == Pass::Capture {
                        // cuMemcpyPeerAsync cannot be captured; with unified addressing and peer
                        // access enabled, the plain copy between the two devices' pointers is the
                        // same peer copy and becomes a memcpy node.
                        safe::copy_unified(&s.stream, dp, sp, bytes).map_err(|e| self.fault(src_rank, what, e))?;
                    } else {
                        // The copy is ordered after both ranks' earlier work (order_after above)
                        // and before their later work.
                        safe::copy_peer(&s.stream, dctx, dp, sctx, sp, bytes)
                            .map_err(|e| self.fault(src_rank, what, e))?;
                    }
                }
                self.order_after(dst_rank, src_rank, what)?;
                // The source's later writes must not overtake the copy: they already queue behind
                // it on the source stream.
                Ok(())
            }
            Transport::HostBounce => self.host_bounce(src_rank, sp, dst_rank, dp, bytes),
        }
    }

    /// BULK_P2P: every block of `p` in ONE strided copy, ordered like a native-p2p copy (after
    /// both ranks' earlier work, before their later work). One device: `cuMemcpy2DAsync` (rows =
    /// blocks, pitches = the slot strides); two devices: `cuMemcpy3DPeerAsync` with depth 1 and
    /// peer access enabled. The elements between blocks are never written: a 2D copy moves
    /// `WidthInBytes` per row and skips the rest of each pitch. Counted when ≥ 2 blocks moved.
    pub(crate) fn copy_packed_blocks(
        &mut self,
        transport: Transport,
        src_rank: usize,
        dst_rank: usize,
        p: Packed,
    ) -> Result<()> {
        let what = "packed copy (bulk_p2p)";
        if transport != Transport::NativeP2p {
            return Err(RuntimeError::DoorRefused {
                door: "MEMRA_STEP_TP_BULK_P2P",
                rule: format!(
                    "{what} over {}: MEMRA_STEP_TP_BULK_P2P packs blocks into one device-to-device copy, which needs the native-p2p transport",
                    transport.name()
                ),
            });
        }
        p.check()?;
        let (ss, ds) = (p.src_span(), p.dst_span());
        let sp = self.slice_region(src_rank, ss, "packed copy source")?;
        let dp = self.slice_region(dst_rank, ds, "packed copy destination")?;
        if src_rank == dst_rank && ss.buf == ds.buf && ss.offset < ds.offset + ds.len && ds.offset < ss.offset + ss.len
        {
            return Err(RuntimeError::Contract(format!(
                "{what} within buffer {} on rank {src_rank}: spans {}+{} and {}+{} overlap",
                ss.buf, ss.offset, ss.len, ds.offset, ds.len
            )));
        }
        if p.src.len == 0 {
            return Ok(());
        }
        let (width, spitch, dpitch) = (p.src.len * 4, p.src_pitch * 4, p.dst_pitch * 4);
        if spitch.max(dpitch) > i32::MAX as usize {
            return Err(RuntimeError::Capacity {
                what: format!("{what} pitch (bytes)"),
                value: spitch.max(dpitch),
                limit: i32::MAX as usize,
                rule: format!(
                    "{what}: pitch of {} bytes exceeds the 2D copy's limit of {} bytes",
                    spitch.max(dpitch),
                    i32::MAX
                ),
            });
        }
        // A single block has no pitch to honour: make it the block's width so the driver never
        // sees a pitch below the width.
        let (spitch, dpitch) = if p.blocks == 1 { (width, width) } else { (spitch, dpitch) };
        self.order_after(src_rank, dst_rank, what)?;
        let same_device = self.ranks[src_rank].dev == self.ranks[dst_rank].dev;
        if !same_device {
            self.ensure_peer_access(src_rank, dst_rank)?;
        }
        let s = &self.ranks[src_rank];
        s.stream.context().bind_to_thread().map_err(|e| self.fault(src_rank, what, e))?;
        // Both spans were checked inside their buffers and do not overlap; ordering is placed
        // around the copy. Two devices: the contexts of both ranks, with peer access enabled.
        let r = if same_device {
            safe::copy_2d(&s.stream, dp, dpitch, sp, spitch, width, p.blocks)
        } else {
            let (sctx, dctx) = (self.ctx_of(src_rank), self.ctx_of(dst_rank));
            safe::copy_3d_peer(&s.stream, dctx, dp, dpitch, sctx, sp, spitch, width, p.blocks)
        };
        r.map_err(|e| self.fault(src_rank, what, e))?;
        self.order_after(dst_rank, src_rank, what)?;
        if p.blocks >= 2 {
            self.packed_copies += 1;
        }
        Ok(())
    }

    /// CANARY SkipFence: move `src` to `dst` on the DESTINATION rank's stream without waiting for
    /// the source rank's earlier work, so the copy can read the producer's buffer while the
    /// producer is still writing it (a real race, nothing is delayed on purpose). The rest of the
    /// contract stays: the copy follows the destination's earlier work and precedes its later work
    /// (stream order), and the source's later work waits for the copy (an event), so the planted
    /// defect is exactly the missing producer fence. Whatever `transport` the run uses, the read
    /// is the same raw device copy (`cuMemcpyDtoDAsync` on one device, `cuMemcpyPeerAsync`
    /// between two, which works with or without peer access): NCCL and the host-bounce staging
    /// have no separable producer fence to leave out.
    pub(crate) fn copy_unfenced_slices(
        &mut self,
        transport: Transport,
        src_rank: usize,
        src: Slice,
        dst_rank: usize,
        dst: Slice,
    ) -> Result<()> {
        let _ = transport;
        let what = "unfenced copy (canary skip_fence)";
        let sp = self.slice_region(src_rank, src, "unfenced copy source")?;
        let dp = self.slice_region(dst_rank, dst, "unfenced copy destination")?;
        if src.len != dst.len {
            return Err(RuntimeError::Contract(format!(
                "unfenced copy of {} elements into a slice of {}",
                src.len, dst.len
            )));
        }
        if src_rank == dst_rank {
            return Err(RuntimeError::Contract(format!(
                "unfenced copy within rank {src_rank}: one stream orders its own work, there is no producer fence to skip"
            )));
        }
        if src.len == 0 {
            return Ok(());
        }
        let bytes = src.len * 4;
        if self.ranks[src_rank].dev == self.ranks[dst_rank].dev {
            self.dtod(dst_rank, dp, sp, bytes, what)?;
        } else {
            let d = &self.ranks[dst_rank];
            let (sctx, dctx) = (self.ctx_of(src_rank), self.ctx_of(dst_rank));
            dctx.bind_to_thread().map_err(|e| self.fault(dst_rank, what, e))?;
            // The copy is deliberately not ordered after the source's earlier work: the bytes it
            // reads may be stale or half-written, which is the canary's defect, never a
            // memory-safety issue (both buffers stay allocated until every stream is drained).
            safe::copy_peer(&d.stream, dctx, dp, sctx, sp, bytes).map_err(|e| self.fault(dst_rank, what, e))?;
        }
        self.order_after(src_rank, dst_rank, what)
    }

    /// Device-to-device copy on `rank`'s stream (both pointers on its device).
    fn dtod(&self, rank: usize, dp: DevicePtr, sp: DevicePtr, bytes: usize, what: &str) -> Result<()> {
        let r = &self.ranks[rank];
        r.stream.context().bind_to_thread().map_err(|e| self.fault(rank, what, e))?;
        // The ranges do not overlap (checked for one buffer; distinct buffers never overlap).
        safe::copy_dtod(&r.stream, dp, sp, bytes).map_err(|e| self.fault(rank, what, e))
    }

    fn host_bounce(
        &mut self,
        src_rank: usize,
        sp: DevicePtr,
        dst_rank: usize,
        dp: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        let what = "host-bounce copy";
        match self.graphs.pass() {
            Pass::Capture => return self.host_bounce_captured(src_rank, sp, dst_rank, dp, bytes),
            Pass::Record => self.graphs.note_bounce(bytes),
            Pass::Eager | Pass::Replay => {}
        }
        let dd = self.ranks[dst_rank].dev;
        let slot_idx = {
            let (_, next) = &mut self.staging.rings[dd];
            let i = *next;
            *next = (i + 1) % RING_SLOTS;
            i
        };
        // Grow the slot if needed: wait (on the host, rare) for its last upload, then reallocate.
        let too_small = self.staging.rings[dd].0[slot_idx].buf.as_ref().is_none_or(|b| b.bytes() < bytes);
        if too_small {
            if let Some(ev) = &self.staging.rings[dd].0[slot_idx].free {
                ev.synchronize().map_err(|e| self.fault(dst_rank, what, e))?;
            }
            let ctx = self.ctx_of(dst_rank).clone();
            let grown = PinnedBuffer::new(&ctx, bytes.next_power_of_two().max(64 << 10))?;
            self.staging.rings[dd].0[slot_idx].buf = Some(grown);
        }
        if self.staging.rings[dd].0[slot_idx].free.is_none() {
            let ev = self.ctx_of(dst_rank).new_event(None).map_err(|e| driver_err("staging event", e))?;
            self.staging.rings[dd].0[slot_idx].free = Some(ev);
        }
        let slot = &self.staging.rings[dd].0[slot_idx];
        let (buf, free) = match (&slot.buf, &slot.free) {
            (Some(b), Some(f)) => (b, f),
            _ => return Err(RuntimeError::Contract("host-bounce staging slot was not initialised".into())),
        };
        // Source: wait until the slot's previous upload finished, then download into it.
        self.ranks[src_rank].stream.wait(free).map_err(|e| self.fault(src_rank, what, e))?;
        self.bounce_through(src_rank, sp, dst_rank, dp, bytes, buf.span(), what)?;
        free.record(&self.ranks[dst_rank].stream).map_err(|e| self.fault(dst_rank, what, e))?;
        // The source's later writes queue behind the download on its own stream.
        Ok(())
    }

    /// Device → `buf` (pinned, at least `bytes`, free for this copy) on the source stream, then
    /// `buf` → device on the destination stream after an event: the two halves of every
    /// host-bounce copy.
    #[allow(clippy::too_many_arguments)]
    fn bounce_through(
        &self,
        src_rank: usize,
        sp: DevicePtr,
        dst_rank: usize,
        dp: DevicePtr,
        bytes: usize,
        buf: HostSpan,
        what: &str,
    ) -> Result<()> {
        let (s, d) = (&self.ranks[src_rank], &self.ranks[dst_rank]);
        s.stream.context().bind_to_thread().map_err(|e| self.fault(src_rank, what, e))?;
        // The caller guarantees no queued copy still uses `buf`.
        safe::copy_dtoh_staged(&s.stream, buf, sp, bytes).map_err(|e| self.fault(src_rank, what, e))?;
        // Destination: after its own earlier work (stream order) and the download, upload.
        s.sync_event.record(&s.stream).map_err(|e| self.fault(src_rank, what, e))?;
        d.stream.wait(&s.sync_event).map_err(|e| self.fault(dst_rank, what, e))?;
        d.stream.context().bind_to_thread().map_err(|e| self.fault(dst_rank, what, e))?;
        // The staging bytes were written by the download this stream now waits for.
        safe::copy_htod_staged(&d.stream, dp, buf, bytes).map_err(|e| self.fault(dst_rank, what, e))
    }

    /// A host-bounce copy inside a graph capture: through the pinned buffer the capture owns for
    /// it (graph launches are serialised on one stream, so no ring and no free event is needed).
    fn host_bounce_captured(
        &mut self,
        src_rank: usize,
        sp: DevicePtr,
        dst_rank: usize,
        dp: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        let what = "host-bounce copy (graph capture)";
        let Some(buf) = self.graphs.capture_staging(bytes).map(|b| b.span()) else {
            return Err(RuntimeError::Contract(format!(
                "{what}: no staging buffer of {bytes} bytes was prepared for this copy"
            )));
        };
        // The buffer belongs to this capture alone; graph launches are serialised.
        self.bounce_through(src_rank, sp, dst_rank, dp, bytes, buf, what)
    }

    /// Enable peer access from the source device's context to the destination device's memory
    /// (and back), once per process; a pair without peer access is `Unavailable` with the reason.
    pub(crate) fn ensure_peer_access(&self, a_rank: usize, b_rank: usize) -> Result<()> {
        let (a, b) = (self.ordinal_of(a_rank), self.ordinal_of(b_rank));
        for (from, to, from_rank, to_rank) in [(a, b, a_rank, b_rank), (b, a, b_rank, a_rank)] {
            let mut set = peer_enabled().lock().unwrap_or_else(|p| p.into_inner());
            if set.contains(&(from, to)) {
                continue;
            }
            let (fctx, tctx) = (self.ctx_of(from_rank), self.ctx_of(to_rank));
            let can = Device::of(fctx)
                .can_access_peer(Device::of(tctx))
                .map_err(|e| driver_err(format!("peer access query {from} → {to}"), e))?;
            if !can {
                return Err(RuntimeError::Unavailable(format!("no peer access from device {from} to device {to}")));
            }
            fctx.bind_to_thread().map_err(|e| driver_err("peer access", e))?;
            // The accessing context is current.
            let r = safe::enable_peer_access(tctx, 0);
            if r != driver::CUresult::CUDA_SUCCESS && r != driver::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                return Err(driver_err(format!("enabling peer access {from} → {to}"), driver::DriverError(r)));
            }
            set.insert((from, to));
        }
        Ok(())
    }

    /// Whether `transport` can move bytes from `src` to `dst` (None), or why not.
    fn pair_unavailable(&self, transport: Transport, src: usize, dst: usize) -> Option<String> {
        let same_device = self.ranks[src].dev == self.ranks[dst].dev;
        if transport != Transport::NativeP2p || same_device {
            return None;
        }
        self.ensure_peer_access(src, dst).err().map(|e| e.to_string())
    }

    /// docs/DESIGN.md §3.5's byte-integrity probe: hashed pattern over a poisoned destination for every
    /// ordered pair and size; pairs without peer access are reported, not copied.
    pub(crate) fn probe_pairs(&mut self, transport: Transport, sizes_bytes: &[usize]) -> Result<Vec<ProbeResult>> {
        crate::backend::probe::probe_ladder(
            self,
            sizes_bytes,
            |b, src, dst| b.pair_unavailable(transport, src, dst),
            |b, (src, s), (dst, d)| b.copy_slices(transport, src, s, dst, d),
        )
    }
}
