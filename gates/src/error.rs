//! The one error type of the gates crate.

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// Bad input at the edge (flags, environment, files); the message names thing, value, rule.
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Runtime(#[from] memra_runtime::RuntimeError),
}
