//! The one error type of the gates crate: everything that keeps the harness from running
//! (exit status 2). Gate failures are not errors: they are verdicts in receipts.

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// Bad input at the edge (flags, environment, files); the message names thing, value, rule.
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    #[error(transparent)]
    Runtime(#[from] memra_runtime::RuntimeError),
    #[error(transparent)]
    Receipt(#[from] memra_receipts::ReceiptError),
}
