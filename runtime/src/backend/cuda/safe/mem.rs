//! Memory of the safe driver layer: owned device and pinned host allocations, and every copy,
//! memset, stream memory operation and event record the backend queues, each checked against
//! the regions it is given (see `safe/mod.rs` for what the types prove).

use super::{fits, CallError, DevicePtr, DeviceWord, HostSpan};
use crate::backend::cuda::driver::{self, CUdeviceptr, CUresult, DriverError, CUDA_MEMCPY2D, CUDA_MEMCPY3D_PEER};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DeviceRepr};
use std::ffi::{c_uint, c_void};
use std::marker::PhantomData;
use std::sync::Arc;

/// One `cuMemAlloc` allocation, freed once with `cuMemFree` in `Drop` (in its own context).
pub(crate) struct DeviceMem {
    ptr: CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceMem {
    /// `cuMemAlloc(bytes)` in the context current on this thread, which the caller bound: `ctx`
    /// (the context `Drop` frees it in).
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceMem, DriverError> {
        // SAFETY: the result is owned by the returned value and freed once, in Drop; without a
        // current context the driver reports an error.
        let ptr = unsafe { driver::malloc_sync(bytes) }?;
        Ok(DeviceMem { ptr, bytes, ctx: ctx.clone() })
    }

    /// The whole allocation.
    pub(crate) fn region(&self) -> DevicePtr {
        DevicePtr { addr: self.ptr, bytes: self.bytes }
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: `ptr` came from cuMemAlloc in this context and is freed exactly once; the
        // backend drains every stream before it drops a buffer (safe/mod.rs, lifetimes).
        self.ctx.record_err(unsafe { driver::free_sync(self.ptr) });
    }
}

/// One `cuMemHostAlloc` allocation (page-locked host memory), freed once with `cuMemFreeHost` in
/// `Drop`.
pub(crate) struct PinnedHost {
    ptr: *mut c_void,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: page-locked host memory belongs to the process, not to a thread; `Drop` binds its own
// context before freeing it, and the pointer is reached only through `&self`/`&mut self`.
unsafe impl Send for PinnedHost {}

impl PinnedHost {
    /// `cuMemHostAlloc(bytes, flags)` in the context current on this thread, which the caller
    /// bound: `ctx` (the context `Drop` frees it in).
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: usize, flags: c_uint) -> Result<PinnedHost, DriverError> {
        // SAFETY: the result is owned by the returned value and freed once, in Drop.
        let ptr = unsafe { driver::malloc_host(bytes, flags) }?;
        Ok(PinnedHost { ptr, bytes, ctx: ctx.clone() })
    }

    /// The whole allocation, for staged copies.
    pub(crate) fn span(&self) -> HostSpan {
        HostSpan { ptr: self.ptr, bytes: self.bytes }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Zero every byte from the host (before any device work uses the memory).
    pub(crate) fn fill_zero(&mut self) {
        // SAFETY: `ptr` is a live allocation of `bytes` bytes owned by `self`, borrowed mutably.
        unsafe { std::ptr::write_bytes(self.ptr as *mut u8, 0, self.bytes) };
    }

    /// `cuMemHostGetDevicePointer(self, 0)`: the device address of the allocation in the context
    /// current on this thread (the memory must have been allocated with DEVICEMAP).
    pub(crate) fn device_view(&self) -> Result<DevicePtr, DriverError> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: `ptr` is a live pinned allocation; `p` is a live local; flags must be 0. A
        // mapping the driver cannot make is its error, not a memory access.
        unsafe { driver::cuMemHostGetDevicePointer_v2(&mut p, self.ptr, 0) }.result()?;
        Ok(DevicePtr { addr: p, bytes: self.bytes })
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed exactly once; every copy or memop
        // through it completed first (the backend drains its streams, a ring slot waits for its
        // free event).
        self.ctx.record_err(unsafe { driver::free_host(self.ptr) });
    }
}

// ---------------------------------------------------------------------------------------------
// Device-side copies and memsets

/// `cuMemsetD8Async(dst, value, bytes)` on `stream`.
pub(crate) fn memset_d8(stream: &CudaStream, dst: DevicePtr, value: u8, bytes: usize) -> Result<(), CallError> {
    fits("memset", "destination", bytes, dst.bytes)?;
    // SAFETY: `bytes` checked inside `dst`, a live region (safe/mod.rs, lifetimes).
    unsafe { driver::memset_d8_async(dst.addr, value, bytes, stream.cu_stream()) }.map_err(CallError::from)
}

/// `cuMemcpyDtoDAsync(dst, src, bytes)` on `stream`.
pub(crate) fn copy_dtod(stream: &CudaStream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<(), CallError> {
    fits("device copy", "destination", bytes, dst.bytes)?;
    fits("device copy", "source", bytes, src.bytes)?;
    // SAFETY: `bytes` checked inside both live regions.
    unsafe { driver::memcpy_dtod_async(dst.addr, src.addr, bytes, stream.cu_stream()) }.map_err(CallError::from)
}

/// `cuMemcpyPeerAsync(dst in dst_ctx, src in src_ctx, bytes)` on `stream`.
pub(crate) fn copy_peer(
    stream: &CudaStream,
    dst_ctx: &CudaContext,
    dst: DevicePtr,
    src_ctx: &CudaContext,
    src: DevicePtr,
    bytes: usize,
) -> Result<(), CallError> {
    fits("peer copy", "destination", bytes, dst.bytes)?;
    fits("peer copy", "source", bytes, src.bytes)?;
    // SAFETY: `bytes` checked inside both live regions; both contexts are live (borrowed).
    unsafe {
        driver::memcpy_peer_async(dst_ctx.cu_ctx(), dst.addr, src_ctx.cu_ctx(), src.addr, bytes, stream.cu_stream())
    }
    .map_err(CallError::from)
}

/// `cuMemcpyAsync(dst, src, bytes)` on `stream` (unified addressing: either side on any device).
pub(crate) fn copy_unified(stream: &CudaStream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<(), CallError> {
    fits("unified copy", "destination", bytes, dst.bytes)?;
    fits("unified copy", "source", bytes, src.bytes)?;
    // SAFETY: `bytes` checked inside both live regions.
    unsafe { driver::cuMemcpyAsync(dst.addr, src.addr, bytes, stream.cu_stream()) }.result().map_err(CallError::from)
}

/// Bytes a pitched copy of `height` rows of `width` bytes touches: `(height-1)·pitch + width`.
fn pitched_extent(width: usize, pitch: usize, height: usize) -> Option<usize> {
    match height {
        0 => Some(0),
        h => (h - 1).checked_mul(pitch)?.checked_add(width),
    }
}

/// Both sides of a pitched copy fit their regions (a pitch below the width is refused too).
fn check_pitched(
    call: &'static str,
    dst: DevicePtr,
    dpitch: usize,
    src: DevicePtr,
    spitch: usize,
    width: usize,
    height: usize,
) -> Result<(), CallError> {
    for (region, r, pitch) in [("destination", dst, dpitch), ("source", src, spitch)] {
        let need = if height > 1 && pitch < width { None } else { pitched_extent(width, pitch, height) };
        fits(call, region, need.unwrap_or(usize::MAX), r.bytes)?;
    }
    Ok(())
}

/// `cuMemcpy2DAsync`: `height` rows of `width` bytes from `src` (rows `spitch` apart) to `dst`
/// (rows `dpitch` apart), both device memory of one device, on `stream`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_2d(
    stream: &CudaStream,
    dst: DevicePtr,
    dpitch: usize,
    src: DevicePtr,
    spitch: usize,
    width: usize,
    height: usize,
) -> Result<(), CallError> {
    check_pitched("2D copy", dst, dpitch, src, spitch, width, height)?;
    let dev = driver::CUmemorytype::CU_MEMORYTYPE_DEVICE;
    let c = CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: dev,
        srcHost: std::ptr::null(),
        srcDevice: src.addr,
        srcArray: std::ptr::null_mut(),
        srcPitch: spitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dev,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst.addr,
        dstArray: std::ptr::null_mut(),
        dstPitch: dpitch,
        WidthInBytes: width,
        Height: height,
    };
    // SAFETY: the rows checked inside both live regions; the descriptor is a live local read
    // during the call.
    unsafe { driver::cuMemcpy2DAsync_v2(&c, stream.cu_stream()) }.result().map_err(CallError::from)
}

/// `cuMemcpy3DPeerAsync` with depth 1: the pitched copy of [`copy_2d`] between two devices'
/// contexts, on `stream`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_3d_peer(
    stream: &CudaStream,
    dst_ctx: &CudaContext,
    dst: DevicePtr,
    dpitch: usize,
    src_ctx: &CudaContext,
    src: DevicePtr,
    spitch: usize,
    width: usize,
    height: usize,
) -> Result<(), CallError> {
    check_pitched("3D peer copy", dst, dpitch, src, spitch, width, height)?;
    let dev = driver::CUmemorytype::CU_MEMORYTYPE_DEVICE;
    let c = CUDA_MEMCPY3D_PEER {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: dev,
        srcHost: std::ptr::null(),
        srcDevice: src.addr,
        srcArray: std::ptr::null_mut(),
        srcContext: src_ctx.cu_ctx(),
        srcPitch: spitch,
        srcHeight: height,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: dev,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst.addr,
        dstArray: std::ptr::null_mut(),
        dstContext: dst_ctx.cu_ctx(),
        dstPitch: dpitch,
        dstHeight: height,
        WidthInBytes: width,
        Height: height,
        Depth: 1,
    };
    // SAFETY: the rows checked inside both live regions of the two live contexts named in the
    // descriptor, a live local read during the call.
    unsafe { driver::cuMemcpy3DPeerAsync(&c, stream.cu_stream()) }.result().map_err(CallError::from)
}

// ---------------------------------------------------------------------------------------------
// Pinned staging copies

/// `cuMemcpyDtoHAsync(dst, src, bytes)` into pinned staging, on `stream`.
pub(crate) fn copy_dtoh_staged(
    stream: &CudaStream,
    dst: HostSpan,
    src: DevicePtr,
    bytes: usize,
) -> Result<(), CallError> {
    fits("staged download", "pinned staging", bytes, dst.bytes)?;
    fits("staged download", "source", bytes, src.bytes)?;
    // SAFETY: `bytes` checked inside the live pinned span and the live device region.
    unsafe { driver::cuMemcpyDtoHAsync_v2(dst.ptr, src.addr, bytes, stream.cu_stream()) }
        .result()
        .map_err(CallError::from)
}

/// `cuMemcpyHtoDAsync(dst, src, bytes)` from pinned staging, on `stream`.
pub(crate) fn copy_htod_staged(
    stream: &CudaStream,
    dst: DevicePtr,
    src: HostSpan,
    bytes: usize,
) -> Result<(), CallError> {
    fits("staged upload", "destination", bytes, dst.bytes)?;
    fits("staged upload", "pinned staging", bytes, src.bytes)?;
    // SAFETY: `bytes` checked inside the live device region and the live pinned span.
    unsafe { driver::cuMemcpyHtoDAsync_v2(dst.addr, src.ptr, bytes, stream.cu_stream()) }
        .result()
        .map_err(CallError::from)
}

// ---------------------------------------------------------------------------------------------
// Pageable host memory lent to queued copies

mod sealed {
    pub trait Sealed {}
}

/// Element types whose every bit pattern is a valid value (a download may write any bytes).
pub(crate) trait Plain: sealed::Sealed + DeviceRepr {}
macro_rules! plain {
    ($($t:ty),*) => { $(impl sealed::Sealed for $t {} impl Plain for $t {})* };
}
plain!(u8, u32, u64, f32);

/// Copies between pageable host memory borrowed for `'h` and the device, queued on the streams
/// of the enclosing [`with_host_memory`] (invariant in `'h`, so no borrow can be shortened).
pub(crate) struct HostCopies<'s, 'h> {
    streams: &'s [&'s CudaStream],
    _borrow: PhantomData<fn(&'h ()) -> &'h ()>,
}

impl<'h> HostCopies<'_, 'h> {
    fn lent(&self, call: &'static str, stream: &CudaStream) -> Result<(), CallError> {
        // The same stream object (not an equal handle: every context's default stream is null).
        if self.streams.iter().any(|s| std::ptr::eq(*s, stream)) {
            Ok(())
        } else {
            Err(CallError::NotLent { call })
        }
    }

    /// `cuMemcpyHtoDAsync` of all of `src` to `dst` on `stream`.
    pub(crate) fn upload<T: DeviceRepr>(
        &self,
        stream: &CudaStream,
        dst: DevicePtr,
        src: &'h [T],
    ) -> Result<(), CallError> {
        self.lent("upload", stream)?;
        fits("upload", "destination", std::mem::size_of_val(src), dst.bytes)?;
        // SAFETY: the destination extent is checked; `src` stays borrowed until the enclosing
        // scope has synchronized `stream` (it is one of its streams, checked above).
        unsafe { driver::memcpy_htod_async(dst.addr, src, stream.cu_stream()) }.map_err(CallError::from)
    }

    /// `cuMemcpyDtoHAsync` of `size_of_val(dst)` bytes from `src` into `dst` on `stream`.
    pub(crate) fn download<T: Plain>(
        &self,
        stream: &CudaStream,
        dst: &'h mut [T],
        src: DevicePtr,
    ) -> Result<(), CallError> {
        self.lent("download", stream)?;
        fits("download", "source", std::mem::size_of_val(dst), src.bytes)?;
        // SAFETY: the source extent is checked; `dst` stays borrowed (and unread) until the
        // enclosing scope has synchronized `stream`; every bit pattern is a valid `T` (Plain).
        unsafe { driver::memcpy_dtoh_async(dst, src.addr, stream.cu_stream()) }.map_err(CallError::from)
    }
}

/// Synchronizes the scope's streams if the body unwinds (a panic must not release lent memory
/// under a running copy).
struct DrainOnUnwind<'s>(&'s [&'s CudaStream]);

impl Drop for DrainOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for s in self.0 {
                let _ = s.synchronize();
            }
        }
    }
}

/// Run `body`, whose copies borrow host memory for `'h`, then synchronize `streams` in order
/// (`sync_err` maps a failure of stream `i`), so no copy outlives its host memory. When the body
/// fails, or a synchronize does, the remaining streams are still synchronized (errors ignored)
/// before the error is returned.
pub(crate) fn with_host_memory<'h, R, E>(
    streams: &[&CudaStream],
    body: impl for<'s> FnOnce(&HostCopies<'s, 'h>) -> Result<R, E>,
    sync_err: impl Fn(usize, DriverError) -> E,
) -> Result<R, E> {
    let guard = DrainOnUnwind(streams);
    let copies = HostCopies { streams, _borrow: PhantomData };
    let out = body(&copies);
    let out = match out {
        Ok(r) => {
            let mut failed = None;
            for (i, s) in streams.iter().enumerate() {
                if failed.is_some() {
                    let _ = s.synchronize();
                } else if let Err(e) = s.synchronize() {
                    failed = Some(sync_err(i, e));
                }
            }
            failed.map_or(Ok(r), Err)
        }
        Err(e) => {
            for s in streams {
                let _ = s.synchronize();
            }
            Err(e)
        }
    };
    drop(guard);
    out
}

// ---------------------------------------------------------------------------------------------
// Stream memory operations and events

/// `cuStreamWriteValue32(stream, word, value, flags)`: the raw result (a device may refuse
/// memops, which the caller tells apart from faults).
pub(crate) fn stream_write_value32(stream: &CudaStream, word: DeviceWord, value: u32, flags: c_uint) -> CUresult {
    // SAFETY: `word` is 4 checked bytes of a live device-visible region (safe/mod.rs).
    unsafe { driver::cuStreamWriteValue32_v2(stream.cu_stream(), word.addr, value, flags) }
}

/// `cuStreamWaitValue32(stream, word, value, flags)`: the raw result, as
/// [`stream_write_value32`]. A wait no write satisfies blocks the stream, not memory safety.
pub(crate) fn stream_wait_value32(stream: &CudaStream, word: DeviceWord, value: u32, flags: c_uint) -> CUresult {
    // SAFETY: as `stream_write_value32`.
    unsafe { driver::cuStreamWaitValue32_v2(stream.cu_stream(), word.addr, value, flags) }
}

/// `cuEventRecordWithFlags(event, stream, flags)`.
pub(crate) fn record_event_with_flags(
    event: &CudaEvent,
    stream: &CudaStream,
    flags: c_uint,
) -> Result<(), DriverError> {
    // SAFETY: the event and the stream are live handles (borrowed for the call).
    unsafe { driver::cuEventRecordWithFlags(event.cu_event(), stream.cu_stream(), flags) }.result()
}

/// The milliseconds between two completed events, `cuEventElapsedTime(start, end)` alone.
/// cudarc's `CudaEvent::elapsed_ms` binds the context and synchronizes both events first (four
/// driver calls, each taking the driver's locks); after the caller has synchronized the streams
/// the events were recorded on, and bound their context, those three calls change nothing, and
/// a step's collect makes one such call per mark per rank. An event that is not complete is the
/// driver's `CUDA_ERROR_NOT_READY`, returned as the error.
pub(crate) fn elapsed_ms_completed(start: &CudaEvent, end: &CudaEvent) -> Result<f32, DriverError> {
    // SAFETY: both events are live handles (borrowed for the call); a context mismatch or an
    // incomplete event is the driver's error, not a memory access.
    unsafe { driver::event_elapsed(start.cu_event(), end.cu_event()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pitched_copies_are_checked_on_their_last_byte() {
        let r = |bytes| DevicePtr { addr: 0x10000, bytes };
        // 3 rows of 16 bytes, 64 apart: 2·64 + 16 = 144 bytes.
        assert!(check_pitched("2D copy", r(144), 64, r(144), 64, 16, 3).is_ok());
        let e = check_pitched("2D copy", r(143), 64, r(144), 64, 16, 3).unwrap_err();
        assert_eq!(e, CallError::Extent { call: "2D copy", region: "destination", need: 144, have: 143 });
        assert!(check_pitched("2D copy", r(144), 64, r(143), 64, 16, 3).is_err(), "the source too");
        assert!(check_pitched("2D copy", r(1 << 20), 8, r(1 << 20), 64, 16, 3).is_err(), "a pitch below the width");
        assert!(check_pitched("2D copy", r(16), 16, r(16), 16, 16, 1).is_ok(), "one row needs its width only");
    }
}
