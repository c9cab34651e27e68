//! Is there a usable CUDA here? Answered without ever panicking.
//!
//! cudarc loads libcuda and libnvrtc lazily and panics when a library or a symbol is missing, so
//! the probe first asks cudarc whether each library can be opened (`is_culib_present`), and only
//! then calls into the driver — inside `catch_unwind` as a last resort against a driver too old to
//! export a symbol the bindings need. Every failure becomes a typed [`CudaUnavailable`] reason
//! that `--backend auto` prints and receipts record. The answer is computed once per process.

use super::driver;
use super::safe::{self, Device};
use crate::error::RuntimeError;
use std::sync::OnceLock;

/// One CUDA device as the probe saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor), e.g. (9, 0) for an H100 / H200.
    pub compute_capability: (i32, i32),
    pub total_mem_bytes: usize,
    pub multiprocessors: i32,
}

impl DeviceInfo {
    /// The NVRTC real architecture of the device, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// What the probe found: the driver and every visible device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaSystem {
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
    pub devices: Vec<DeviceInfo>,
}

impl CudaSystem {
    /// One line for logs and receipts.
    pub fn describe(&self) -> String {
        let names: Vec<String> =
            self.devices.iter().map(|d| format!("{} {} ({})", d.ordinal, d.name, d.arch())).collect();
        format!(
            "CUDA driver {}.{}, {} device(s): {}",
            self.driver_version / 1000,
            (self.driver_version % 1000) / 10,
            self.devices.len(),
            names.join(", ")
        )
    }
}

/// Why the CUDA backend cannot run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaUnavailable {
    #[error("no CUDA driver library found (libcuda.so / libcuda.so.1 could not be loaded)")]
    NoDriverLibrary,
    #[error(
        "no NVRTC library found (libnvrtc.so / libnvrtc.so.13 could not be loaded; add its folder to LD_LIBRARY_PATH)"
    )]
    NoNvrtcLibrary,
    #[error("the CUDA driver failed to initialise: {0}")]
    InitFailed(String),
    #[error("no CUDA device (the driver reports 0 devices)")]
    NoDevice,
    #[error("querying CUDA device {ordinal} failed: {detail}")]
    DeviceQuery { ordinal: usize, detail: String },
    #[error("the CUDA bindings panicked while probing (driver too old for CUDA 13 bindings?): {0}")]
    Panicked(String),
}

impl From<CudaUnavailable> for RuntimeError {
    fn from(e: CudaUnavailable) -> Self {
        RuntimeError::Unavailable(e.to_string())
    }
}

/// Whether the driver library can be loaded (never panics).
pub fn driver_library_present() -> bool {
    safe::driver_library_present()
}

/// Whether the NVRTC library can be loaded (never panics).
pub fn nvrtc_library_present() -> bool {
    safe::nvrtc_library_present()
}

/// Probe the driver and the devices once per process; later calls return the same answer.
pub fn probe_cuda() -> Result<CudaSystem, CudaUnavailable> {
    static PROBE: OnceLock<Result<CudaSystem, CudaUnavailable>> = OnceLock::new();
    PROBE.get_or_init(probe_uncached).clone()
}

fn probe_uncached() -> Result<CudaSystem, CudaUnavailable> {
    if !driver_library_present() {
        return Err(CudaUnavailable::NoDriverLibrary);
    }
    match std::panic::catch_unwind(query_driver) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(CudaUnavailable::Panicked(msg))
        }
    }
}

fn query_driver() -> Result<CudaSystem, CudaUnavailable> {
    safe::init().map_err(|e| {
        if e.0 == driver::CUresult::CUDA_ERROR_NO_DEVICE {
            CudaUnavailable::NoDevice
        } else {
            CudaUnavailable::InitFailed(e.to_string())
        }
    })?;
    let driver_version = safe::driver_version().map_err(|e| CudaUnavailable::InitFailed(e.to_string()))?;
    let count = safe::device_count().map_err(|e| CudaUnavailable::InitFailed(e.to_string()))?;
    if count <= 0 {
        return Err(CudaUnavailable::NoDevice);
    }
    let mut devices = Vec::new();
    for ordinal in 0..count as usize {
        let q = |detail: String| CudaUnavailable::DeviceQuery { ordinal, detail };
        let dev = Device::get(ordinal as i32).map_err(|e| q(e.to_string()))?;
        let name = dev.name().map_err(|e| q(e.to_string()))?;
        let attr = |a: driver::CUdevice_attribute| dev.attribute(a).map_err(|e| q(e.to_string()));
        use driver::CUdevice_attribute::*;
        let major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let multiprocessors = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let total_mem_bytes = dev.total_mem().map_err(|e| q(e.to_string()))?;
        devices.push(DeviceInfo {
            ordinal,
            name,
            compute_capability: (major, minor),
            total_mem_bytes,
            multiprocessors,
        });
    }
    Ok(CudaSystem { driver_version, devices })
}

/// The CUDA backend needs both the driver with a device and NVRTC; this is the check
/// `--backend auto` makes (a reason when either is missing).
pub fn cuda_backend_available() -> Result<CudaSystem, CudaUnavailable> {
    let system = probe_cuda()?;
    if !nvrtc_library_present() {
        return Err(CudaUnavailable::NoNvrtcLibrary);
    }
    Ok(system)
}
