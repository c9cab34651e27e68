//! Doors, matrices, oracles, gates, verdicts, promotion and the command line.
//!
//! The gates consume records (`memra_runtime::record`), never runtime internals, so another
//! subject (an external engine's tape, DESIGN.md §10) can be gated the same way.
/// `println!` that never panics: a closed stdout (`memra-gates diff a b | head -1`) ends the
/// output quietly instead of aborting with a broken-pipe panic.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub mod bench;
pub mod bench_gating;
pub mod cli;
pub mod commands;
pub mod dist;
pub mod env;
pub mod error;
pub mod gate;
pub mod matrix;
pub mod plan;
pub mod probe_cmd;
pub mod promote;
pub mod registry;
pub mod registry_view;
pub mod selftest;
pub mod suite;

pub use error::GateError;
