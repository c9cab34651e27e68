//! The safe half of the driver layer: typed handles over `driver.rs` (the raw CUDA driver and
//! NVRTC calls) and `nccl_sys.rs` (the raw NCCL entry points), in cudarc's own sys → result →
//! safe pattern. Every other file of the CUDA backend calls these functions and holds no `unsafe`
//! block; only kernel-argument packing (`launch/mod.rs`) keeps its own.
//!
//! What the types prove, and what they rest on:
//! - extents: a [`DevicePtr`] names `bytes` bytes of device memory and is made only here, from an
//!   allocation ([`DeviceMem`], a mapped [`PinnedHost`]) or by narrowing another one; every copy,
//!   memset and NCCL call checks the bytes it touches against the regions it is given and refuses
//!   ([`CallError::Extent`]) instead of touching memory beyond them. A [`HostSpan`] does the same
//!   for pinned host memory, a [`DeviceWord`] for one 4-byte flag word;
//! - host memory the caller lends to a queued copy: borrowed for the whole of
//!   [`with_host_memory`], which synchronizes the streams before the borrow ends (also when the
//!   body fails or panics), so a pageable slice can never be freed under an in-flight copy;
//! - owned resources: [`DeviceMem`], [`PinnedHost`], [`nvrtc::Program`] and [`nccl::Comm`] free
//!   what they own exactly once, in `Drop`, with the same calls the backend made before;
//! - lifetimes of device work (not proved by the types): a `DevicePtr` or `HostSpan` does not
//!   borrow its allocation, so memory must outlive the work queued on it. The backend keeps that
//!   rule as it always did — it drains every stream before it frees anything (`CudaBackend::drop`,
//!   `fault`, `rewind`), and a staging-ring slot is reused or grown only after its free event —
//!   and computes every pointer afresh from a live buffer for each call.
//!
//! Each function issues exactly the driver calls its caller issued before, in the same order,
//! with the same flags; a refused extent issues nothing.

pub(crate) mod mem;
pub(crate) mod nccl;
pub(crate) mod nvrtc;

pub(crate) use mem::{
    copy_2d, copy_3d_peer, copy_dtod, copy_dtoh_staged, copy_htod_staged, copy_peer, copy_unified,
    elapsed_ms_completed, memset_d8, record_event_with_flags, stream_wait_value32, stream_write_value32,
    with_host_memory, DeviceMem, PinnedHost,
};

use super::driver::{self, CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUresult, DriverError};
use cudarc::driver::{CudaContext, CudaFunction, CudaGraph, CudaStream, LaunchConfig};
use std::ffi::{c_int, c_uint, c_void};
use std::fmt;

/// A refused or failed call of the safe layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The driver's own error (displayed exactly as the driver layer displays it).
    Driver(DriverError),
    /// A call would touch more bytes than a region it was given holds; nothing was issued.
    Extent { call: &'static str, region: &'static str, need: usize, have: usize },
    /// A host-memory copy on a stream that the enclosing [`with_host_memory`] does not synchronize.
    NotLent { call: &'static str },
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Driver(e) => write!(f, "{e}"),
            CallError::Extent { call, region, need, have } => write!(
                f,
                "{call}: the {region} holds {have} bytes but the call touches {need}: the driver layer refuses \
                 an access beyond the memory a handle names"
            ),
            CallError::NotLent { call } => write!(
                f,
                "{call}: the stream is not one of those the enclosing host-memory scope synchronizes, so the host \
                 memory could be released under the copy"
            ),
        }
    }
}

impl std::error::Error for CallError {}

impl From<DriverError> for CallError {
    fn from(e: DriverError) -> Self {
        CallError::Driver(e)
    }
}

/// `need` bytes fit in `have`, else an extent refusal of `call` on `region`.
pub(crate) fn fits(call: &'static str, region: &'static str, need: usize, have: usize) -> Result<(), CallError> {
    if need <= have {
        Ok(())
    } else {
        Err(CallError::Extent { call, region, need, have })
    }
}

/// `bytes` bytes of device memory (unified address) made by this layer from a live allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DevicePtr {
    addr: CUdeviceptr,
    bytes: usize,
}

impl DevicePtr {
    /// The device address (a kernel argument).
    pub(crate) fn addr(self) -> CUdeviceptr {
        self.addr
    }

    /// How many bytes the region holds.
    pub(crate) fn bytes(self) -> usize {
        self.bytes
    }

    /// The `len` bytes at `offset` of this region; `None` when they leave it.
    pub(crate) fn sub(self, offset: usize, len: usize) -> Option<DevicePtr> {
        let end = offset.checked_add(len)?;
        (end <= self.bytes).then_some(DevicePtr { addr: self.addr + offset as u64, bytes: len })
    }

    /// The 4-byte word `index` of this region; `None` beyond it.
    pub(crate) fn word(self, index: usize) -> Option<DeviceWord> {
        self.sub(index.checked_mul(4)?, 4).map(|p| DeviceWord { addr: p.addr })
    }
}

/// One 4-byte word of device-visible memory (a stream memory-op flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceWord {
    addr: CUdeviceptr,
}

/// `bytes` bytes of pinned host memory owned by a [`PinnedHost`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostSpan {
    ptr: *mut c_void,
    bytes: usize,
}

/// A captured, instantiated CUDA graph, owned by the backend's segment table.
pub(crate) struct Graph(CudaGraph);

// SAFETY: CUDA lets a graph be used from any thread as long as no two calls on it run at once
// (the driver's graph thread-safety rules); its owner, the backend, is only ever used by one
// thread at a time (`&mut self`), and the graph's stream context is bound by cudarc on launch.
unsafe impl Send for Graph {}

impl Graph {
    pub(crate) fn new(g: CudaGraph) -> Graph {
        Graph(g)
    }

    /// `cuGraphLaunch` on the stream it was captured from.
    pub(crate) fn launch(&self) -> Result<(), DriverError> {
        self.0.launch()
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel launch

/// `cuLaunchKernelEx` of `func` on `stream` with `cfg`; with `programmatic`, the attribute
/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` (the kernel may be scheduled before the
/// one ahead of it on the stream completes: `kernel_entry()` in kernels/cuda/canon.cuh makes every
/// kernel wait for it before touching memory). The same call cudarc's launch builder makes
/// (`cuLaunchKernel`) when `programmatic` is false, after binding the stream's context.
///
/// # Safety
/// `args` holds one pointer per parameter of `func`, in order, each to a live value of exactly
/// that parameter's type; every device pointer among those values names memory of this stream's
/// device that outlives the launch.
pub(crate) unsafe fn launch_kernel(
    stream: &CudaStream,
    func: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut [*mut c_void],
    programmatic: bool,
) -> Result<(), DriverError> {
    {
        let _clock = crate::host_clock::start(crate::host_clock::Entry::Bind);
        stream.context().bind_to_thread()?;
    }
    let mut attr = driver::CUlaunchAttribute {
        id: driver::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: driver::CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
    };
    let config = driver::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: c_uint::from(programmatic),
    };
    // SAFETY: `config` and `attr` are live locals for the whole call and the attribute count is 0
    // or 1; the stream's context is bound above and `func` was loaded in it (`Kernels::load` of the
    // stream's device); the parameter pointers are the caller's (# Safety).
    let _clock = crate::host_clock::start(crate::host_clock::Entry::DriverLaunch);
    unsafe { driver::cuLaunchKernelEx(&config, func.cu_function(), args.as_mut_ptr()) }.result()
}

// ---------------------------------------------------------------------------------------------
// Initialisation, libraries, devices

/// `cuInit(0)`.
pub(crate) fn init() -> Result<(), DriverError> {
    driver::init()
}

/// Whether the driver library can be loaded (only `Library::new` on its candidate names).
pub(crate) fn driver_library_present() -> bool {
    // SAFETY: loading a library by name touches no driver state; the library's initialisers are
    // the driver's own (driver.rs, # Safety of is_culib_present).
    unsafe { driver::is_culib_present() }
}

/// Whether the NVRTC library can be loaded (only `Library::new` on its candidate names).
pub(crate) fn nvrtc_library_present() -> bool {
    // SAFETY: as `driver_library_present`, for libnvrtc.
    unsafe { driver::nvrtc::is_culib_present() }
}

/// `cuDriverGetVersion`.
pub(crate) fn driver_version() -> Result<c_int, DriverError> {
    let mut v: c_int = 0;
    // SAFETY: the out-pointer is a live local the call writes once.
    unsafe { driver::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

/// `cuDeviceGetCount`.
pub(crate) fn device_count() -> Result<c_int, DriverError> {
    driver::device::get_count()
}

/// A device handle, made only from `cuDeviceGet` or a live context (so every query gets a valid
/// handle of an initialised driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Device(CUdevice);

impl Device {
    /// `cuDeviceGet(ordinal)`.
    pub(crate) fn get(ordinal: c_int) -> Result<Device, DriverError> {
        driver::device::get(ordinal).map(Device)
    }

    /// The device of a live context.
    pub(crate) fn of(ctx: &CudaContext) -> Device {
        Device(ctx.cu_device())
    }

    /// `cuDeviceGetName`.
    pub(crate) fn name(self) -> Result<String, DriverError> {
        driver::device::get_name(self.0)
    }

    /// `cuDeviceGetAttribute`.
    pub(crate) fn attribute(self, attr: CUdevice_attribute) -> Result<i32, DriverError> {
        // SAFETY: the handle came from cuDeviceGet or a live context (see the type).
        unsafe { driver::device::get_attribute(self.0, attr) }
    }

    /// `cuDeviceTotalMem`.
    pub(crate) fn total_mem(self) -> Result<usize, DriverError> {
        // SAFETY: as `attribute`.
        unsafe { driver::device::total_mem(self.0) }
    }

    /// `cuDeviceCanAccessPeer`: whether this device can access `peer`'s memory.
    pub(crate) fn can_access_peer(self, peer: Device) -> Result<bool, DriverError> {
        let mut can: c_int = 0;
        // SAFETY: both handles are valid (see the type); `can` is a live local.
        unsafe { driver::cuDeviceCanAccessPeer(&mut can, self.0, peer.0) }.result()?;
        Ok(can != 0)
    }
}

/// `cuCtxEnablePeerAccess(peer, flags)` from the context current on this thread; the raw result,
/// so the caller can accept `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`.
pub(crate) fn enable_peer_access(peer: &CudaContext, flags: c_uint) -> CUresult {
    let peer_ctx: CUcontext = peer.cu_ctx();
    // SAFETY: `peer` is a live context (borrowed for the call); without a current context the
    // driver reports an error, it does not touch memory.
    unsafe { driver::cuCtxEnablePeerAccess(peer_ctx, flags) }
}

/// End the process at once with `code`, without atexit handlers or destructors (`_exit`).
pub(crate) fn exit_now(code: i32) -> ! {
    #[cfg(unix)]
    {
        extern "C" {
            fn _exit(status: c_int) -> !;
        }
        // SAFETY: _exit ends the process; nothing this process holds outlives it (device memory
        // and communicators are released by the driver with the process).
        unsafe { _exit(code) }
    }
    #[cfg(not(unix))]
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_narrow_only_inside_themselves() {
        let p = DevicePtr { addr: 0x1000, bytes: 64 };
        assert_eq!(p.sub(16, 48), Some(DevicePtr { addr: 0x1010, bytes: 48 }));
        assert_eq!(p.sub(16, 49), None, "one byte past the end is refused");
        assert_eq!(p.sub(usize::MAX, 2), None, "an overflowing end is refused");
        assert_eq!(p.word(15), Some(DeviceWord { addr: 0x1000 + 60 }));
        assert_eq!(p.word(16), None);
        assert!(fits("copy", "destination", 64, 64).is_ok());
        let e = fits("copy", "destination", 65, 64).unwrap_err();
        assert!(e.to_string().contains("destination holds 64 bytes but the call touches 65"), "{e}");
    }

    #[test]
    fn refusals_name_the_call_and_the_rule() {
        // (A driver error displays as the driver layer does; printing one loads the driver
        // library, so it is not shown here.)
        let e = CallError::NotLent { call: "download" };
        assert!(e.to_string().starts_with("download: the stream is not one of those"), "{e}");
        let e = CallError::Extent { call: "ncclSend", region: "send buffer", need: 8, have: 4 };
        assert!(e.to_string().contains("send buffer holds 4 bytes but the call touches 8"), "{e}");
    }
}
