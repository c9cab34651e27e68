//! Doors, matrices, oracles, gates, verdicts, promotion and the command line.
pub mod cli;
pub mod env;
pub mod error;
pub mod matrix;
pub mod registry;

pub use error::GateError;
