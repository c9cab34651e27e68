//! The CUDA C sources of the kernels, embedded at compile time, and the closed list of kernel
//! names the runtime launches (checked after every NVRTC load).

/// All kernel sources concatenated in a fixed order (one translation unit for NVRTC).
pub fn cuda_source() -> String {
    String::new()
}

/// Every `extern "C"` kernel the CUDA backend launches.
pub const KERNEL_NAMES: &[&str] = &[];
