//! Skipping for the CUDA test binaries: without a device a test prints `skipped: …` and passes;
//! with `MEMRA_REQUIRE_GPU=1` the same situation is a failure.

#![allow(dead_code)] // each test binary uses a part

use memra_runtime::backend::cuda::{CudaBackend, CudaOptions};
use memra_runtime::RuntimeError;

pub fn require_gpu() -> bool {
    std::env::var("MEMRA_REQUIRE_GPU").as_deref() == Ok("1")
}

/// A CUDA backend, or None after printing the skip reason (a failure under MEMRA_REQUIRE_GPU=1).
pub fn cuda_backend(tp: usize, opts: CudaOptions) -> Option<CudaBackend> {
    match CudaBackend::with_options(tp, opts) {
        Ok(b) => Some(b),
        Err(RuntimeError::Unavailable(reason)) => {
            assert!(!require_gpu(), "MEMRA_REQUIRE_GPU=1 but the CUDA backend is unavailable: {reason}");
            println!("skipped: no CUDA device ({reason})");
            None
        }
        Err(e) => panic!("creating the CUDA backend failed: {e}"),
    }
}
