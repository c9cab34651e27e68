//! The one error type of the gates crate: everything that keeps the harness from running (exit
//! status 2). Gate failures are not errors: they are verdicts in receipts.
//!
//! The variants are the differences a caller (a script, CI, a person) can act on: a request to
//! fix ([`GateError::Usage`], [`GateError::NothingToTest`]), an output directory to free or clean
//! ([`GateError::OutDir`], [`GateError::Locked`]), evidence that was lost on the way to disk
//! ([`GateError::ReceiptsNotWritten`]), a device that is required and absent
//! ([`GateError::NoDevice`]), and the errors of the crates below.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// A flag's value, or a combination of flags and settings, that the command refuses; the
    /// message names the flag, the value and the rule.
    #[error("{0}")]
    Usage(String),
    /// A request that would test nothing (an empty or all-skipped selection).
    #[error("{0}")]
    NothingToTest(String),
    /// A device was required (`--backend cuda`, `MEMRA_REQUIRE_GPU=1`) and is not usable.
    #[error("{0}")]
    NoDevice(String),
    /// The output directory cannot take this run (not writable, or it holds another plan's
    /// receipts); refused before any configuration runs.
    #[error("--out {}: {rule}", .dir.display())]
    OutDir { dir: PathBuf, rule: String },
    /// Another run writes into the output directory.
    #[error("--out {}: {holder} is writing there (lock {}); wait for it or use another --out", .dir.display(), .lock.display())]
    Locked { dir: PathBuf, lock: PathBuf, holder: String },
    /// Receipts or matrix outputs that could not be written: the run's evidence is incomplete.
    #[error("{} file(s) could not be written, the evidence in {} is incomplete:\n  {}", .failed.len(), .dir.display(), .failed.iter().map(|(p, e)| format!("{}: {e}", p.display())).collect::<Vec<_>>().join("\n  "))]
    ReceiptsNotWritten { dir: PathBuf, failed: Vec<(PathBuf, String)> },
    /// `bench --compare BASE`: the base is not the same configuration on the same machine (the
    /// first field that differs, with both values).
    #[error(
        "--compare {}: not comparable: {field} is {base} in the base and {new} in the new one; \
         bench --compare judges the same configuration (preset, model, layers, TP, rows or columns, backend, graph, doors) \
         on the same device",
        .base_path.display()
    )]
    Incomparable { base_path: PathBuf, field: &'static str, base: String, new: String },
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    #[error(transparent)]
    Promote(#[from] crate::promote::PromoteError),
    #[error(transparent)]
    Runtime(#[from] memra_runtime::RuntimeError),
    #[error(transparent)]
    Receipt(#[from] memra_receipts::ReceiptError),
}

impl From<crate::paths::OutRefused> for GateError {
    fn from(r: crate::paths::OutRefused) -> GateError {
        GateError::OutDir { dir: r.path, rule: r.rule }
    }
}

impl GateError {
    /// [`GateError::Usage`] from a message.
    pub fn usage(msg: impl Into<String>) -> GateError {
        GateError::Usage(msg.into())
    }
}
