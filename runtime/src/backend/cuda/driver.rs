//! The one door to the CUDA driver and NVRTC below cudarc's safe layer. cudarc itself is built in
//! three layers — `sys` (the raw FFI), `result` (the same calls returning `Result`), safe types
//! (`CudaContext`, `CudaStream`, `CudaEvent`, `CudaGraph`, launch builders) — and the backend uses
//! the safe layer directly wherever it suffices. Every call it makes into the two lower layers
//! goes through a function of this file, and the types of those layers it names are re-exported
//! from here, so this file is the complete list of raw driver and NVRTC entry points the backend
//! depends on, and the tidy test refuses a `sys::` or `result::` path anywhere else
//! (`tests/tidy/code.rs`).
//!
//! Each wrapper forwards its arguments unchanged to the cudarc function of the same name (the
//! `sys` ones keep the driver's own names, so a call reads as the CUDA documentation names it).
//! A wrapper of an `unsafe` call is `unsafe` with the driver's contract stated under `# Safety`,
//! and each call site's `// SAFETY:` line says how it keeps that contract; a wrapper of a safe
//! call is safe. The call sites are the safe layer above this file (`safe/`): tidy allows an
//! `unsafe` block nowhere else in the backend but kernel-argument packing (`launch/mod.rs`), so
//! the rest of the backend reaches the driver through typed handles and checked regions.
#![allow(non_snake_case)]

use cudarc::driver::{result, sys};
use std::ffi::{c_char, c_int, c_uint, c_void};

pub(super) use cudarc::driver::result::DriverError;
pub(super) use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUevent_flags, CUevent_record_flags, CUfunction,
    CUgraphInstantiate_flags, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig,
    CUmemorytype, CUresult, CUstream, CUstreamCaptureMode, CUstreamWaitValue_flags, CUstreamWriteValue_flags,
    CUDA_MEMCPY2D, CUDA_MEMCPY3D_PEER, CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE,
};
pub(super) use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t};

// ---------------------------------------------------------------------------------------------
// Initialisation and devices

/// `cuInit(0)`.
pub(super) fn init() -> Result<(), DriverError> {
    result::init()
}

/// Whether the driver library can be loaded (only `Library::new` on its candidate names).
///
/// # Safety
/// None beyond loading a library by name: it touches no driver state (cudarc marks it `unsafe`
/// because loading runs the library's initialisers).
pub(super) unsafe fn is_culib_present() -> bool {
    // SAFETY: forwarded unchanged; the caller accepts loading the driver library (# Safety).
    unsafe { sys::is_culib_present() }
}

/// `cuDriverGetVersion`.
///
/// # Safety
/// `driver_version` points to a live `c_int` the call may write.
pub(super) unsafe fn cuDriverGetVersion(driver_version: *mut c_int) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees the out-pointer (# Safety).
    unsafe { sys::cuDriverGetVersion(driver_version) }
}

/// Device queries (`cuDevice*`), as cudarc's `result::device`.
pub(super) mod device {
    use super::{result, CUdevice, CUdevice_attribute, DriverError};
    use std::ffi::c_int;

    /// `cuDeviceGetCount`.
    pub(in crate::backend::cuda) fn get_count() -> Result<c_int, DriverError> {
        result::device::get_count()
    }

    /// `cuDeviceGet`.
    pub(in crate::backend::cuda) fn get(ordinal: c_int) -> Result<CUdevice, DriverError> {
        result::device::get(ordinal)
    }

    /// `cuDeviceGetName`.
    pub(in crate::backend::cuda) fn get_name(dev: CUdevice) -> Result<String, DriverError> {
        result::device::get_name(dev)
    }

    /// `cuDeviceGetAttribute`.
    ///
    /// # Safety
    /// `dev` is a valid device handle (from `cuDeviceGet` or a context) and the driver is
    /// initialised.
    pub(in crate::backend::cuda) unsafe fn get_attribute(
        dev: CUdevice,
        attrib: CUdevice_attribute,
    ) -> Result<i32, DriverError> {
        // SAFETY: forwarded unchanged; the caller guarantees a valid device handle (# Safety).
        unsafe { result::device::get_attribute(dev, attrib) }
    }

    /// `cuDeviceTotalMem`.
    ///
    /// # Safety
    /// `dev` is a valid device handle and the driver is initialised.
    pub(in crate::backend::cuda) unsafe fn total_mem(dev: CUdevice) -> Result<usize, DriverError> {
        // SAFETY: forwarded unchanged; the caller guarantees a valid device handle (# Safety).
        unsafe { result::device::total_mem(dev) }
    }
}

/// `cuDeviceCanAccessPeer`.
///
/// # Safety
/// `can_access_peer` points to a live `c_int`; both devices are valid handles.
pub(super) unsafe fn cuDeviceCanAccessPeer(can_access_peer: *mut c_int, dev: CUdevice, peer_dev: CUdevice) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees the pointer and handles (# Safety).
    unsafe { sys::cuDeviceCanAccessPeer(can_access_peer, dev, peer_dev) }
}

/// `cuCtxEnablePeerAccess`.
///
/// # Safety
/// A context is current on this thread and `peer_context` is a live context of another device.
pub(super) unsafe fn cuCtxEnablePeerAccess(peer_context: CUcontext, flags: c_uint) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees both contexts (# Safety).
    unsafe { sys::cuCtxEnablePeerAccess(peer_context, flags) }
}

// ---------------------------------------------------------------------------------------------
// Memory

/// `cuMemAlloc`: `num_bytes` bytes of device memory in the current context.
///
/// # Safety
/// A context is current on this thread; the result is freed once, with [`free_sync`].
pub(super) unsafe fn malloc_sync(num_bytes: usize) -> Result<CUdeviceptr, DriverError> {
    // SAFETY: forwarded unchanged; the caller guarantees the current context (# Safety).
    unsafe { result::malloc_sync(num_bytes) }
}

/// `cuMemFree`.
///
/// # Safety
/// `dptr` came from [`malloc_sync`], is freed exactly once, and no queued work still uses it.
pub(super) unsafe fn free_sync(dptr: CUdeviceptr) -> Result<(), DriverError> {
    // SAFETY: forwarded unchanged; the caller guarantees a live, unused allocation (# Safety).
    unsafe { result::free_sync(dptr) }
}

/// `cuMemHostAlloc`: pinned host memory.
///
/// # Safety
/// A context is current on this thread; the result is freed once, with [`free_host`].
pub(super) unsafe fn malloc_host(num_bytes: usize, flags: c_uint) -> Result<*mut c_void, DriverError> {
    // SAFETY: forwarded unchanged; the caller guarantees the current context (# Safety).
    unsafe { result::malloc_host(num_bytes, flags) }
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `host_ptr` came from [`malloc_host`], is freed exactly once, and no queued copy still uses it.
pub(super) unsafe fn free_host(host_ptr: *mut c_void) -> Result<(), DriverError> {
    // SAFETY: forwarded unchanged; the caller guarantees a live, unused allocation (# Safety).
    unsafe { result::free_host(host_ptr) }
}

/// `cuMemHostGetDevicePointer`.
///
/// # Safety
/// `pdptr` points to a live `CUdeviceptr`; `p` is pinned host memory mapped for devices
/// (`CU_MEMHOSTALLOC_DEVICEMAP`); a context is current.
pub(super) unsafe fn cuMemHostGetDevicePointer_v2(pdptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees the pointers and context (# Safety).
    unsafe { sys::cuMemHostGetDevicePointer_v2(pdptr, p, flags) }
}

/// `cuMemsetD8Async`.
///
/// # Safety
/// `dptr` addresses at least `num_bytes` bytes of a live allocation in the stream's context, which
/// is current, and outlives the queued work.
pub(super) unsafe fn memset_d8_async(
    dptr: CUdeviceptr,
    value: u8,
    num_bytes: usize,
    stream: CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded unchanged; the caller guarantees the extent and lifetime (# Safety).
    unsafe { result::memset_d8_async(dptr, value, num_bytes, stream) }
}

// ---------------------------------------------------------------------------------------------
// Copies

/// `cuMemcpyHtoDAsync` of `src` (all of it) to `dst`.
///
/// # Safety
/// `dst` holds at least `size_of_val(src)` bytes in the stream's context, which is current; `src`
/// stays alive and unchanged until the copy has completed (the caller synchronizes).
pub(super) unsafe fn memcpy_htod_async<T>(dst: CUdeviceptr, src: &[T], stream: CUstream) -> Result<(), DriverError> {
    // SAFETY: forwarded unchanged; the caller guarantees extent and lifetime (# Safety).
    unsafe { result::memcpy_htod_async(dst, src, stream) }
}

/// `cuMemcpyDtoHAsync` of `size_of_val(dst)` bytes from `src` into `dst`.
///
/// # Safety
/// `src` holds at least `size_of_val(dst)` bytes in the stream's context, which is current; `dst`
/// stays alive and unread until the copy has completed (the caller synchronizes), and every bit
/// pattern is a valid `T`.
pub(super) unsafe fn memcpy_dtoh_async<T>(
    dst: &mut [T],
    src: CUdeviceptr,
    stream: CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded unchanged; the caller guarantees extent and lifetime (# Safety).
    unsafe { result::memcpy_dtoh_async(dst, src, stream) }
}

/// `cuMemcpyDtoDAsync`.
///
/// # Safety
/// Both pointers address at least `num_bytes` bytes of live allocations reachable from the
/// stream's context, which is current, and outlive the queued copy.
pub(super) unsafe fn memcpy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    num_bytes: usize,
    stream: CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded unchanged; the caller guarantees extents and lifetimes (# Safety).
    unsafe { result::memcpy_dtod_async(dst, src, num_bytes, stream) }
}

/// `cuMemcpyPeerAsync` (note cudarc's argument order: destination context first).
///
/// # Safety
/// `dst` lives in `dst_ctx` and `src` in `src_ctx`, each with at least `num_bytes` bytes, both
/// outliving the queued copy; `stream` belongs to a current context.
pub(super) unsafe fn memcpy_peer_async(
    dst_ctx: CUcontext,
    dst: CUdeviceptr,
    src_ctx: CUcontext,
    src: CUdeviceptr,
    num_bytes: usize,
    stream: CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded unchanged; the caller guarantees contexts, extents, lifetimes (# Safety).
    unsafe { result::memcpy_peer_async(dst_ctx, dst, src_ctx, src, num_bytes, stream) }
}

/// `cuMemcpyAsync` (unified addressing: either side may be any device's memory).
///
/// # Safety
/// Both pointers address at least `byte_count` bytes of live allocations, outliving the queued
/// copy; `stream` belongs to a current context.
pub(super) unsafe fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees extents and lifetimes (# Safety).
    unsafe { sys::cuMemcpyAsync(dst, src, byte_count, stream) }
}

/// `cuMemcpy2DAsync`.
///
/// # Safety
/// `copy` describes source and destination extents inside live allocations that outlive the
/// queued copy; `stream` belongs to a current context.
pub(super) unsafe fn cuMemcpy2DAsync_v2(copy: *const CUDA_MEMCPY2D, stream: CUstream) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees the described extents (# Safety).
    unsafe { sys::cuMemcpy2DAsync_v2(copy, stream) }
}

/// `cuMemcpy3DPeerAsync`.
///
/// # Safety
/// As [`cuMemcpy2DAsync_v2`], with both contexts of `copy` live.
pub(super) unsafe fn cuMemcpy3DPeerAsync(copy: *const CUDA_MEMCPY3D_PEER, stream: CUstream) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees the described extents (# Safety).
    unsafe { sys::cuMemcpy3DPeerAsync(copy, stream) }
}

/// `cuMemcpyDtoHAsync` into raw (pinned) host memory.
///
/// # Safety
/// `dst_host` holds at least `byte_count` bytes and `src_device` as many, both outliving the
/// queued copy; `stream` belongs to a current context.
pub(super) unsafe fn cuMemcpyDtoHAsync_v2(
    dst_host: *mut c_void,
    src_device: CUdeviceptr,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees extents and lifetimes (# Safety).
    unsafe { sys::cuMemcpyDtoHAsync_v2(dst_host, src_device, byte_count, stream) }
}

/// `cuMemcpyHtoDAsync` from raw (pinned) host memory.
///
/// # Safety
/// As [`cuMemcpyDtoHAsync_v2`], in the other direction.
pub(super) unsafe fn cuMemcpyHtoDAsync_v2(
    dst_device: CUdeviceptr,
    src_host: *const c_void,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees extents and lifetimes (# Safety).
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst_device, src_host, byte_count, stream) }
}

// ---------------------------------------------------------------------------------------------
// Streams and events

/// `cuStreamWriteValue32`.
///
/// # Safety
/// `addr` is a device-visible address of a live 4-byte word that outlives the queued write;
/// `stream` belongs to a current context.
pub(super) unsafe fn cuStreamWriteValue32_v2(
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees the word (# Safety).
    unsafe { sys::cuStreamWriteValue32_v2(stream, addr, value, flags) }
}

/// `cuStreamWaitValue32`.
///
/// # Safety
/// As [`cuStreamWriteValue32_v2`]; a wait that no write ever satisfies blocks the stream forever.
pub(super) unsafe fn cuStreamWaitValue32_v2(
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees the word (# Safety).
    unsafe { sys::cuStreamWaitValue32_v2(stream, addr, value, flags) }
}

/// `cuEventRecordWithFlags`.
///
/// # Safety
/// `event` and `stream` are live handles of the same (current) context.
pub(super) unsafe fn cuEventRecordWithFlags(event: CUevent, stream: CUstream, flags: c_uint) -> CUresult {
    // SAFETY: forwarded unchanged; the caller guarantees the handles (# Safety).
    unsafe { sys::cuEventRecordWithFlags(event, stream, flags) }
}

/// `cuEventElapsedTime` (cudarc's `result::event::elapsed`).
///
/// # Safety
/// `start` and `end` are live events of the current context.
pub(super) unsafe fn event_elapsed(start: CUevent, end: CUevent) -> Result<f32, DriverError> {
    // SAFETY: forwarded unchanged; the caller guarantees the handles (# Safety).
    unsafe { result::event::elapsed(start, end) }
}

// ---------------------------------------------------------------------------------------------
// Kernel launch

/// `cuLaunchKernelEx`.
///
/// # Safety
/// `config` points to a live launch configuration whose `attrs` point to `numAttrs` live
/// attributes and whose stream belongs to the current context; `f` is a function of a module
/// loaded in that context; `kernel_params` holds one pointer per parameter of `f`, in order, each
/// to a live value of exactly that parameter's type (the driver copies them before returning).
pub(super) unsafe fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    kernel_params: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded unchanged (no `extra` block); the caller guarantees the rest (# Safety).
    unsafe { sys::cuLaunchKernelEx(config, f, kernel_params, std::ptr::null_mut()) }
}

// ---------------------------------------------------------------------------------------------
// NVRTC

/// NVRTC calls, as cudarc's `nvrtc::result` and `nvrtc::sys`.
pub(super) mod nvrtc {
    use super::c_char;
    use cudarc::nvrtc::{result, sys};
    use std::ffi::{c_int, CStr};

    pub(in crate::backend::cuda) use cudarc::nvrtc::result::NvrtcError;
    pub(in crate::backend::cuda) use cudarc::nvrtc::sys::{nvrtcProgram, nvrtcResult};

    /// Whether the NVRTC library can be loaded (only `Library::new` on its candidate names).
    ///
    /// # Safety
    /// None beyond loading a library by name (cudarc marks it `unsafe` because loading runs the
    /// library's initialisers).
    pub(in crate::backend::cuda) unsafe fn is_culib_present() -> bool {
        // SAFETY: forwarded unchanged; the caller accepts loading the library (# Safety).
        unsafe { sys::is_culib_present() }
    }

    /// `nvrtcVersion`.
    ///
    /// # Safety
    /// Both out-pointers point to live `c_int`s.
    pub(in crate::backend::cuda) unsafe fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> nvrtcResult {
        // SAFETY: forwarded unchanged; the caller guarantees the out-pointers (# Safety).
        unsafe { sys::nvrtcVersion(major, minor) }
    }

    /// `nvrtcCreateProgram`.
    pub(in crate::backend::cuda) fn create_program(
        src: &CStr,
        name: Option<&CStr>,
    ) -> Result<nvrtcProgram, NvrtcError> {
        result::create_program(src, name)
    }

    /// `nvrtcCompileProgram` with `options`.
    ///
    /// # Safety
    /// `prog` came from [`create_program`] and is not yet destroyed; its source outlives it.
    pub(in crate::backend::cuda) unsafe fn compile_program<O: Clone + Into<Vec<u8>>>(
        prog: nvrtcProgram,
        options: &[O],
    ) -> Result<(), NvrtcError> {
        // SAFETY: forwarded unchanged; the caller guarantees a live program (# Safety).
        unsafe { result::compile_program(prog, options) }
    }

    /// The compile log of `prog`.
    ///
    /// # Safety
    /// As [`compile_program`].
    pub(in crate::backend::cuda) unsafe fn get_program_log(prog: nvrtcProgram) -> Result<Vec<c_char>, NvrtcError> {
        // SAFETY: forwarded unchanged; the caller guarantees a live program (# Safety).
        unsafe { result::get_program_log(prog) }
    }

    /// The PTX of `prog`.
    ///
    /// # Safety
    /// As [`compile_program`], and the program compiled.
    pub(in crate::backend::cuda) unsafe fn get_ptx(prog: nvrtcProgram) -> Result<Vec<c_char>, NvrtcError> {
        // SAFETY: forwarded unchanged; the caller guarantees a live, compiled program (# Safety).
        unsafe { result::get_ptx(prog) }
    }

    /// `nvrtcGetCUBINSize`.
    ///
    /// # Safety
    /// As [`get_ptx`]; `size` points to a live `usize`.
    pub(in crate::backend::cuda) unsafe fn nvrtcGetCUBINSize(prog: nvrtcProgram, size: *mut usize) -> nvrtcResult {
        // SAFETY: forwarded unchanged; the caller guarantees program and pointer (# Safety).
        unsafe { sys::nvrtcGetCUBINSize(prog, size) }
    }

    /// `nvrtcGetCUBIN`.
    ///
    /// # Safety
    /// As [`get_ptx`]; `cubin` holds the size [`nvrtcGetCUBINSize`] reported.
    pub(in crate::backend::cuda) unsafe fn nvrtcGetCUBIN(prog: nvrtcProgram, cubin: *mut c_char) -> nvrtcResult {
        // SAFETY: forwarded unchanged; the caller guarantees program and buffer (# Safety).
        unsafe { sys::nvrtcGetCUBIN(prog, cubin) }
    }

    /// `nvrtcDestroyProgram`.
    ///
    /// # Safety
    /// `prog` came from [`create_program`] and is destroyed exactly once.
    pub(in crate::backend::cuda) unsafe fn destroy_program(prog: nvrtcProgram) -> Result<(), NvrtcError> {
        // SAFETY: forwarded unchanged; the caller guarantees a single destruction (# Safety).
        unsafe { result::destroy_program(prog) }
    }
}
