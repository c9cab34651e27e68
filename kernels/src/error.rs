//! The one error type of the kernels crate: shapes and values that break a kernel contract.

/// A kernel contract was broken; the message names the thing, the value and the rule.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum KernelError {
    #[error("{what}: {value} violates the rule: {rule}")]
    Contract { what: String, value: String, rule: String },
}

impl KernelError {
    pub fn contract(what: impl Into<String>, value: impl ToString, rule: impl Into<String>) -> Self {
        KernelError::Contract { what: what.into(), value: value.to_string(), rule: rule.into() }
    }
}
