//! The one error type of the runtime crate. Messages name the thing, the value and the rule.
//!
//! A caller that could act on the difference gets a variant of its own, with the values it would
//! act on as fields: a TP size off the grid ([`UnsupportedTp`](RuntimeError::UnsupportedTp)), a
//! model whose shapes cannot be placed at a TP size ([`Placement`](RuntimeError::Placement)), a
//! door refused with a combination ([`DoorRefused`](RuntimeError::DoorRefused)), a mechanism a
//! backend does not have ([`Unsupported`](RuntimeError::Unsupported)), a size past a kernel's or a
//! copy's limit ([`Capacity`](RuntimeError::Capacity)), device memory exhausted
//! ([`OutOfDeviceMemory`](RuntimeError::OutOfDeviceMemory)), a model shape rule
//! ([`ModelShape`](RuntimeError::ModelShape)), a preset, a battery, a transport name, the kernel
//! sources NVRTC refused. What is left, [`Contract`](RuntimeError::Contract), is a caller breaking
//! a function's contract (a slice out of its buffer, ids that disagree): a defect to fix, which no
//! caller could act on. Every variant that was once an "invalid configuration" still says so, in
//! the same words.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A model file or in-memory model breaks a rule (tensor name, dtype, shape, value).
    #[error("model tensor `{tensor}`: {detail}")]
    Model { tensor: String, detail: String },
    /// The whole file could not be parsed as safetensors.
    #[error("model file {path}: {detail}")]
    ModelFile { path: PathBuf, detail: String },
    /// A TP size the canonical grid does not allow (it must divide the 8 canonical blocks).
    #[error(
        "invalid configuration: TP size {tp} is not allowed: TP must be 1, 2, 4 or 8 (it must divide the canonical \
         grid of 8 blocks)"
    )]
    UnsupportedTp { tp: usize },
    /// The model's shapes cannot be placed at TP size `tp` (whole heads, K-blocks or experts per
    /// rank), or the ranks cannot be split over the processes.
    #[error("invalid configuration: {rule}")]
    Placement { tp: usize, rule: String },
    /// A door (its `MEMRA_*` name) refused in this combination of doors, transport or TP size.
    #[error("invalid configuration: {rule}")]
    DoorRefused { door: &'static str, rule: String },
    /// A mechanism (a door's, a canary's, a transport's) that backend `backend` does not have.
    #[error("invalid configuration: {rule}")]
    Unsupported { backend: String, mechanism: &'static str, rule: String },
    /// `what` is `value`, past the `limit` of a kernel argument, shared memory or a copy.
    #[error("invalid configuration: {rule}")]
    Capacity { what: String, value: usize, limit: usize, rule: String },
    /// An allocation of `bytes` on device `device` found the device's memory exhausted.
    #[error("device fault at {location}: {detail}")]
    OutOfDeviceMemory { location: String, device: usize, bytes: usize, detail: String },
    /// A model configuration (or a shard of its matrices) breaks a shape rule of the canonical grid.
    #[error("invalid configuration: {rule}")]
    ModelShape { rule: String },
    /// A model preset that does not exist, or that cannot be made as asked.
    #[error("invalid configuration: {rule}")]
    Preset { name: String, rule: String },
    /// A battery (or a teacher-forced tape) that does not fit the model or the run; `prompt` is
    /// the first prompt that breaks the rule, when one does.
    #[error("invalid configuration: {rule}")]
    Battery { prompt: Option<usize>, rule: String },
    /// A transport name that is not one of the transports.
    #[error("invalid configuration: transport `{name}` is unknown; the transports are host-bounce, native-p2p, nccl")]
    UnknownTransport { name: String },
    /// NVRTC refused the kernel sources with these options; the log says why.
    #[error("invalid configuration: NVRTC could not compile the kernels ({error}) with {options}:\n{log}")]
    KernelCompile { error: String, options: String, log: String },
    /// A caller broke a function's contract (a slice outside its buffer, ids or lengths that
    /// disagree, calls out of order): a defect of the calling code, not a request to refuse.
    #[error("broken contract: {0}")]
    Contract(String),
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

    /// The same error, its place prefixed with `who` (`process 1/2, recv on rank 1 → rank 0`):
    /// the location of a device fault, the rule of a refusal, the text of a broken contract.
    /// Variants whose text is fixed are returned unchanged.
    pub fn within(self, who: &str) -> RuntimeError {
        use RuntimeError as E;
        let at = |text: String| format!("{who}: {text}");
        match self {
            E::Device { location, detail } => E::Device { location: at(location), detail },
            E::OutOfDeviceMemory { location, device, bytes, detail } => {
                E::OutOfDeviceMemory { location: at(location), device, bytes, detail }
            }
            E::Placement { tp, rule } => E::Placement { tp, rule: at(rule) },
            E::DoorRefused { door, rule } => E::DoorRefused { door, rule: at(rule) },
            E::Unsupported { backend, mechanism, rule } => E::Unsupported { backend, mechanism, rule: at(rule) },
            E::Capacity { what, value, limit, rule } => E::Capacity { what, value, limit, rule: at(rule) },
            E::ModelShape { rule } => E::ModelShape { rule: at(rule) },
            E::Preset { name, rule } => E::Preset { name, rule: at(rule) },
            E::Battery { prompt, rule } => E::Battery { prompt, rule: at(rule) },
            E::Contract(text) => E::Contract(at(text)),
            other => other,
        }
    }
}
