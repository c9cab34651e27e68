//! `memra-gates effects DIR`: what each door does to the latency of one receipt set (one night,
//! one machine) against its parent configurations, and what exactness costs (docs/DESIGN.md §7,
//! METRICS.md, "Door effects"). Writes `DIR/door-effects.json` (the versioned file of
//! `memra_receipts::effect`) and prints the Markdown section the nightly report includes. A
//! matrix run writes the same file for its own receipts; this command is for a set merged from
//! shards, where a configuration and its parent may have run in different processes.

use super::{load_receipts, Status};
use crate::args::EffectsArgs;
use crate::error::GateError;
use memra_receipts::effect::{door_effects, render, write_effects};

pub fn effects(args: &EffectsArgs) -> Result<Status, GateError> {
    let receipts = load_receipts(&args.dir)?;
    if receipts.is_empty() {
        return Err(GateError::NothingToTest(format!(
            "{} holds no receipt: there is no door effect to state",
            args.dir.display()
        )));
    }
    let effects = door_effects(&receipts);
    if !args.no_write {
        let path = write_effects(&args.dir, &effects)?;
        eprintln!("memra-gates: {} door effect(s) written to {}", effects.effects.len(), path.display());
    }
    print!("{}", render::to_markdown(&effects));
    Ok(Status::Passed)
}
