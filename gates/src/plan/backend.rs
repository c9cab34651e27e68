//! `--backend auto|host|cuda`, resolved once per command: `auto` takes CUDA when a driver and a
//! device are usable and says which it took; with `MEMRA_REQUIRE_GPU=1` (a GPU CI machine) it
//! never falls back to the host — a missing device is an error, not a quiet host run.

use crate::error::GateError;
use memra_runtime::backend::BackendKind;

/// Resolve a `--backend` value; `require_gpu` is `MEMRA_REQUIRE_GPU`.
pub fn resolve_backend(name: &str, require_gpu: bool) -> Result<BackendKind, GateError> {
    match name {
        "host" => Ok(BackendKind::Host),
        "cuda" => match memra_runtime::backend::cuda_available() {
            Ok(desc) => {
                eprintln!("memra-gates: backend cuda ({desc})");
                Ok(BackendKind::Cuda)
            }
            Err(reason) => Err(GateError::NoDevice(format!("--backend cuda: {reason}"))),
        },
        "auto" => match memra_runtime::backend::cuda_available() {
            Ok(desc) => {
                eprintln!("memra-gates: backend auto → cuda ({desc})");
                Ok(BackendKind::Cuda)
            }
            Err(reason) if require_gpu => Err(GateError::NoDevice(format!(
                "--backend auto: MEMRA_REQUIRE_GPU=1 forbids falling back to the host backend, and no CUDA device is usable: {reason}"
            ))),
            Err(reason) => {
                eprintln!("memra-gates: backend auto → host ({reason})");
                Ok(BackendKind::Host)
            }
        },
        other => Err(GateError::usage(format!("--backend `{other}` is unknown: use auto, host or cuda"))),
    }
}
