//! Doors, matrices, oracles, gates, verdicts, promotion and the command line.
//!
//! The gates consume records (`memra_runtime::record`), never runtime internals, so another
//! subject (an external engine's tape, docs/DESIGN.md §10) is gated the same way.
//!
//! # Layers (imports point down only; the tidy test checks there is no cycle)
//!
//! - [`args`]: the clap types; imports nothing of the crate.
//! - [`text`], [`registry`], [`env`](mod@env), [`matrix`]: the door registry and what derives from it.
//! - [`job`], [`gate`], [`receipt`], [`record_evidence`], [`dist`], [`subject`]: resolved
//!   configurations, the gates as pure functions over records, the receipt builder, a record's
//!   canonical evidence, the subjects that produce records (the built-in runtime in process, or an
//!   external engine over the subject protocol).
//! - [`interrupt`]: what an interrupted run kept, and the `--resume` command (imports nothing).
//! - [`paths`]: input files and output paths checked before any work (imports nothing of the crate).
//! - [`suite`]: running jobs through the gates; [`outdir`]: the output directory.
//! - [`plan`]: flags → a checked plan; [`promote`]: the promotion policy.
//! - [`commands`]: one module per command and the one dispatch; nothing imports it back.
//!
//! The binary calls [`run`]`(`[`args::parse`]`(…)?)` and maps the [`Status`] (or the error) to its
//! exit status.
#![forbid(unsafe_code)]

/// `println!` that never panics: a closed stdout (`memra-gates diff a b | head -1`) ends the
/// output quietly instead of aborting with a broken-pipe panic.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub mod args;
pub mod commands;
pub mod dist;
pub mod env;
pub mod error;
pub mod gate;
pub mod interrupt;
pub mod job;
pub mod matrix;
pub mod outdir;
pub mod paths;
pub mod plan;
pub mod promote;
pub mod receipt;
pub mod record_evidence;
pub mod registry;
pub mod subject;
pub mod suite;
pub mod text;

pub use commands::Status;
pub use error::GateError;

/// Run the command line `cli` built with provenance `prov`.
pub fn run(cli: args::Cli, prov: args::Provenance) -> Result<Status, GateError> {
    commands::dispatch(cli.into_command(), prov)
}
