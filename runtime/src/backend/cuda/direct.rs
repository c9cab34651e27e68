//! Direct joins on CUDA (OPROJ_DIRECT, MOE_DIRECT): a peer rank's kernel stores its output
//! straight into the root's memory, and the join's two fences — events by default, stream
//! memory-op doorbells under FENCE_MEMOPS.
//!
//! A peer store is one launch on the producing rank's stream whose output pointer belongs to the
//! destination rank (same device: a plain pointer; distinct devices: a peer pointer, usable by the
//! kernel once peer access is enabled — UVA makes it an ordinary address). Its fences:
//! 1. before the kernel, the producer waits for the destination's work so far, so it cannot
//!    overwrite partials the destination's previous fold is still reading;
//! 2. after the kernel, the destination waits for the producer, so its fold sees the stores.
//!
//! Doorbells (FENCE_MEMOPS) replace each event pair with a ticket: the signalling stream writes
//! `ticket` into a flag word (`cuStreamWriteValue32_v2`, default flags = with a memory barrier, so
//! the stores issued before it are visible first), the waiting stream waits until the flag is
//! ≥ `ticket` (`cuStreamWaitValue32_v2`, GEQ, plus FLUSH of remote writes where the device can).
//! Tickets grow by one per fence of an ordered rank pair. The flags are pinned, device-mapped,
//! portable host words: every device can reach them with memops (the engine found memops on a
//! peer device's memory rejected). A write is always issued before its wait, and every stream
//! queue executes in issue order, so no wait can block the write it waits for.
//!
//! Kernel doorbells (FENCE_RANK1, with FENCE_MEMOPS) replace the second fence only: after the
//! store the producer's stream launches `ring_flag_u32`, which stores the ticket into a flag word
//! in the DESTINATION's device memory (a raw `cuMemAlloc`, zeroed on the destination's stream
//! before the first fence that could ring it is queued; the engine found pool memory
//! memop-ineligible), and the destination's stream waits on that word with a same-device
//! `cuStreamWaitValue32_v2` (GEQ, FLUSH where the device can) instead of an event or a
//! host-memory doorbell. One word per (signaller, waiter) pair, tickets growing by one per fence
//! of the pair; the kernel is issued before the wait, so no wait can block the store it waits
//! for. The first fence stays a host-memory doorbell (memops on a peer's memory were rejected in
//! the engine: the store must come from a kernel).
//!
//! A device that rejects memops (allocation, mapping or the call itself refused) gets events for
//! that fence and every later one; such fences are NOT counted, so a fallback run reports 0
//! doorbells and its gate is VOID, never PASS. Why not gate on
//! `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1`: it describes the deprecated v1 memop API; the
//! v2 calls used here report their own refusal, which is what decides.

use super::driver;
use super::memory::DeviceBuffer;
use super::safe::{self, Device, DevicePtr, DeviceWord, PinnedHost};
use super::CudaBackend;
use crate::backend::{JoinFence, Op};
use crate::Result;

/// The doorbell flags of one backend: one u32 word per ordered (signaller, waiter) rank pair.
pub(crate) struct Doorbells {
    /// Pinned host words `[signaller][waiter]`, zeroed at allocation, freed (in the context of
    /// device 0, where they were allocated) when the owning backend drops, after it drained every
    /// stream, so no memop still targets them.
    host: PinnedHost,
    /// The words as seen from each backend device (index like `CudaBackend::devices`).
    dev_ptr: Vec<DevicePtr>,
    /// Last ticket rung per ordered pair.
    tickets: Vec<u32>,
    n_ranks: usize,
}

impl Doorbells {
    fn new(b: &CudaBackend) -> std::result::Result<Doorbells, String> {
        let n = b.ranks.len();
        let bytes = n * n * 4;
        let ctx = b.devices[0].ctx.clone();
        ctx.bind_to_thread().map_err(|e| format!("binding device {}: {e}", b.devices[0].info.ordinal))?;
        let flags = driver::CU_MEMHOSTALLOC_DEVICEMAP | driver::CU_MEMHOSTALLOC_PORTABLE;
        // The context is current; a non-zero size; flags are the documented constants.
        let mut host = PinnedHost::alloc(&ctx, bytes, flags)
            .map_err(|e| format!("cuMemHostAlloc(DEVICEMAP|PORTABLE, {bytes} bytes) refused: {e}"))?;
        // A fresh allocation that no device work uses yet.
        host.fill_zero();
        let mut bells = Doorbells { host, dev_ptr: Vec::new(), tickets: vec![0; n * n], n_ranks: n };
        for d in &b.devices {
            d.ctx.bind_to_thread().map_err(|e| format!("binding device {}: {e}", d.info.ordinal))?;
            // A DEVICEMAP|PORTABLE allocation is mapped in every context.
            let p = bells
                .host
                .device_view()
                .map_err(|e| format!("mapping the doorbell flags on device {}: {e}", d.info.ordinal))?;
            bells.dev_ptr.push(p);
        }
        Ok(bells)
    }

    /// The flag word of (signaller, waiter) as seen from backend device `dev`.
    fn word(&self, dev: usize, signaller: usize, waiter: usize) -> Option<DeviceWord> {
        self.dev_ptr[dev].word(signaller * self.n_ranks + waiter)
    }
}

/// FENCE_RANK1's flag words: per waiter rank, one u32 per signaller in the waiter's device
/// memory (allocated on first use), and the last ticket rung per ordered pair. Freed with the
/// backend after it drained every stream.
#[derive(Default)]
pub(crate) struct KernelBells {
    words: Vec<Option<DeviceBuffer>>,
    tickets: Vec<u32>,
}

/// Whether doorbells can be rung on this backend, decided on first use.
#[derive(Default)]
pub(crate) enum BellState {
    #[default]
    Untried,
    Ready(Doorbells),
    /// Refused by the driver or device: fences use events and are not counted.
    Rejected(String),
}

impl CudaBackend {
    /// A peer store (see the module docs): `op` on `rank`, its store target on `out_rank`.
    pub(crate) fn peer_store(&mut self, rank: usize, op: &Op, out_rank: usize, fence: JoinFence) -> Result<()> {
        let target = crate::backend::peer_store_target(op, rank, out_rank)?;
        self.check_rank(rank)?;
        self.check_rank(out_rank)?;
        // Checked before any fence is queued, so a refused store leaves no half-placed ordering.
        self.slice_ptr(out_rank, target, "peer store target")?;
        if self.ranks[rank].dev != self.ranks[out_rank].dev {
            // The kernel on `rank`'s device dereferences `out_rank`'s memory.
            self.ensure_peer_access(rank, out_rank)?;
        }
        let what = "peer store";
        if fence == JoinFence::KernelDoorbell {
            // Before the first fence, so the zeroed words precede every ring in stream order.
            self.kernel_bell_words(out_rank)?;
        }
        // The first fence: a kernel doorbell is a host-memory doorbell there.
        let first = if fence == JoinFence::KernelDoorbell { JoinFence::Doorbells } else { fence };
        self.fence(out_rank, rank, first, what)?;
        self.launches += 1;
        if rank == 0 && self.opts.rank0_on_default_stream {
            self.merged_launches += 1;
        }
        self.launch_op_to(rank, op, out_rank)?;
        if fence == JoinFence::KernelDoorbell {
            if self.ring_kernel_bell(rank, out_rank)? {
                return Ok(());
            }
            return self.order_after(out_rank, rank, what);
        }
        self.fence(rank, out_rank, fence, what)
    }

    /// `waiter`'s FENCE_RANK1 flag words, allocated and zeroed (on its stream) on first use.
    fn kernel_bell_words(&mut self, waiter: usize) -> Result<DevicePtr> {
        let n = self.ranks.len();
        if self.kernel_bells.words.len() < n {
            self.kernel_bells.words.resize_with(n, || None);
            self.kernel_bells.tickets = vec![0; n * n];
        }
        if self.kernel_bells.words[waiter].is_none() {
            let ctx = self.ctx_of(waiter).clone();
            let b = DeviceBuffer::zeroed(&ctx, &self.ranks[waiter].stream, n * 4, "FENCE_RANK1 flag words")?;
            self.kernel_bells.words[waiter] = Some(b);
        }
        Ok(self.kernel_bells.words[waiter].as_ref().expect("allocated just above").region())
    }

    /// Ring one kernel doorbell signaller → waiter (module docs); `Ok(false)` when memops are
    /// unavailable (the caller falls back to an event, uncounted).
    fn ring_kernel_bell(&mut self, signaller: usize, waiter: usize) -> Result<bool> {
        if matches!(self.bells, BellState::Rejected(_)) {
            return Ok(false);
        }
        let n = self.ranks.len();
        let words = self.kernel_bell_words(waiter)?;
        let (Some(flag), Some(word)) = (words.sub(signaller * 4, 4), words.word(signaller)) else {
            return Err(crate::error::RuntimeError::Contract(format!(
                "kernel doorbell {signaller} → {waiter}: no flag word for this rank among {n} ranks"
            )));
        };
        let pair = signaller * n + waiter;
        let ticket = self.kernel_bells.tickets[pair].wrapping_add(1);
        // The store into the waiter's memory: a peer pointer where the devices differ (the peer
        // store above enabled access between exactly these ranks).
        self.launch_ring_flag(signaller, flag.addr(), ticket)?;
        let mut wait = driver::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        if self.can_flush_remote_writes(waiter) {
            wait |= driver::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_FLUSH as u32;
        }
        let w = &self.ranks[waiter];
        w.stream.context().bind_to_thread().map_err(|e| self.fault(waiter, "kernel doorbell wait", e))?;
        // `word` lies in the waiter's own device memory, owned by `self.kernel_bells` (freed only
        // after every stream is drained); the ring kernel that satisfies it was issued above.
        let r = safe::stream_wait_value32(&w.stream, word, ticket, wait);
        if let Some(rejected) = self.memop_result(r, waiter, "cuStreamWaitValue32_v2 (kernel doorbell)")? {
            // The ticket the kernel stores is harmless: nothing waits for it.
            self.bells = BellState::Rejected(rejected);
            return Ok(false);
        }
        self.kernel_bells.tickets[pair] = ticket;
        self.kernel_doorbells_rung += 1;
        Ok(true)
    }

    /// Make `waiter`'s later work wait for `signaller`'s work so far, by events or a doorbell.
    fn fence(&mut self, signaller: usize, waiter: usize, fence: JoinFence, what: &str) -> Result<()> {
        if fence == JoinFence::Doorbells && self.ring(signaller, waiter)? {
            return Ok(());
        }
        self.order_after(waiter, signaller, what)
    }

    /// Ring one doorbell signaller → waiter; `Ok(false)` when memops are unavailable (the caller
    /// falls back to events, uncounted).
    fn ring(&mut self, signaller: usize, waiter: usize) -> Result<bool> {
        if matches!(self.bells, BellState::Untried) {
            self.bells = match Doorbells::new(self) {
                Ok(b) => BellState::Ready(b),
                Err(reason) => BellState::Rejected(reason),
            };
        }
        let BellState::Ready(bells) = &mut self.bells else { return Ok(false) };
        let pair = signaller * bells.n_ranks + waiter;
        let ticket = bells.tickets[pair].wrapping_add(1);
        let (sd, wd) = (self.ranks[signaller].dev, self.ranks[waiter].dev);
        let (Some(s_word), Some(w_word)) = (bells.word(sd, signaller, waiter), bells.word(wd, signaller, waiter))
        else {
            return Err(crate::error::RuntimeError::Contract(format!(
                "doorbell {signaller} → {waiter}: no flag word for this rank pair among {} ranks",
                bells.n_ranks
            )));
        };
        let (s, w) = (&self.ranks[signaller], &self.ranks[waiter]);
        s.stream.context().bind_to_thread().map_err(|e| self.fault(signaller, "doorbell write", e))?;
        let write = driver::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // `s_word` is the word in the signaller's context, owned by `self.bells` (freed only after
        // every stream is drained).
        let r = safe::stream_write_value32(&s.stream, s_word, ticket, write);
        if let Some(rejected) = self.memop_result(r, signaller, "cuStreamWriteValue32_v2")? {
            self.bells = BellState::Rejected(rejected);
            return Ok(false);
        }
        let mut wait = driver::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        if self.can_flush_remote_writes(waiter) {
            wait |= driver::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_FLUSH as u32;
        }
        w.stream.context().bind_to_thread().map_err(|e| self.fault(waiter, "doorbell wait", e))?;
        // As above, in the waiter's context; the matching write was issued just before, so the
        // wait can always be satisfied (see the module docs on issue order).
        let r = safe::stream_wait_value32(&w.stream, w_word, ticket, wait);
        if let Some(rejected) = self.memop_result(r, waiter, "cuStreamWaitValue32_v2")? {
            // The ticket already written is harmless: nothing waits for it.
            self.bells = BellState::Rejected(rejected);
            return Ok(false);
        }
        if let BellState::Ready(bells) = &mut self.bells {
            bells.tickets[pair] = ticket;
        }
        self.doorbells_rung += 1;
        Ok(true)
    }

    /// `Ok(None)` on success, `Ok(Some(reason))` when the device rejects memops, else a fault.
    fn memop_result(&self, r: driver::CUresult, rank: usize, call: &str) -> Result<Option<String>> {
        use driver::CUresult::*;
        match r {
            CUDA_SUCCESS => Ok(None),
            CUDA_ERROR_NOT_SUPPORTED | CUDA_ERROR_INVALID_VALUE => Ok(Some(format!(
                "{call} refused on device {}: {:?} (stream memory operations unavailable; events used, doorbells not counted)",
                self.ordinal_of(rank),
                r
            ))),
            _ => Err(self.fault(rank, call, driver::DriverError(r))),
        }
    }

    fn can_flush_remote_writes(&self, rank: usize) -> bool {
        let attr = driver::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES;
        Device::of(self.ctx_of(rank)).attribute(attr).is_ok_and(|v| v == 1)
    }

    /// Why FENCE_MEMOPS fell back to events, if it did (for diagnostics and test messages).
    pub fn doorbell_fallback(&self) -> Option<String> {
        match &self.bells {
            BellState::Rejected(reason) => Some(reason.clone()),
            _ => None,
        }
    }
}
