//! Doors, matrices, oracles, gates, verdicts, promotion and the command line.
pub mod cli;
