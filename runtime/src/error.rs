//! The one error type of the runtime crate. Messages name the thing, the value and the rule.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A model file or in-memory model breaks a rule (tensor name, dtype, shape, value).
    #[error("model tensor `{tensor}`: {detail}")]
    Model { tensor: String, detail: String },
    /// The whole file could not be parsed as safetensors.
    #[error("model file {path}: {detail}")]
    ModelFile { path: PathBuf, detail: String },
    /// A request that cannot be run (TP size, shape off the canonical grid, preset name...).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A kernel contract (shape, format) was broken.
    #[error(transparent)]
    Kernel(#[from] memra_kernels::KernelError),
    /// The backend is unavailable (no driver, no device); the reason is typed text for receipts.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// A device fault during a run: where it happened and what the driver said.
    #[error("device fault at {location}: {detail}")]
    Device { location: String, detail: String },
    /// Processes of one distributed run could not agree through their rendezvous directory
    /// (a file that never appeared, or one published for another plan).
    #[error("rendezvous {path}: {detail}")]
    Rendezvous { path: PathBuf, detail: String },
    /// A distributed call (NCCL between processes) ran past its time limit: a peer process died,
    /// stopped or runs another plan. The call itself never returns, so this reaches the binary's
    /// [`OverrunHook`](crate::backend::dist::watchdog::OverrunHook), which decides how the
    /// process ends.
    #[error(
        "{process}: `{call}` has not returned after {:.0} s (timeout {:.0} s): a peer process died, stopped or runs \
         another plan",
        .ran.as_secs_f64(),
        .limit.as_secs_f64()
    )]
    Watchdog { process: String, call: String, ran: std::time::Duration, limit: std::time::Duration },
    /// An I/O failure on a named path.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

impl RuntimeError {
    pub fn model(tensor: impl Into<String>, detail: impl Into<String>) -> Self {
        RuntimeError::Model { tensor: tensor.into(), detail: detail.into() }
    }
}
