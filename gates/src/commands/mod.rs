//! The commands, one module each, and the one place that dispatches to them. Nothing imports
//! this module back: the library's entry point ([`crate::run`]) calls [`dispatch`], and each
//! command returns a [`Status`] (or an error) for the binary to turn into an exit status.

mod bench;
mod bench_compare;
mod bench_doors;
mod bench_floor;
mod bench_gating;
mod bench_targets;
mod bench_torch;
mod diff;
mod doors;
mod effects;
mod gen_model;
mod matrix;
mod matrix_estimate;
mod ncu_profile;
mod plot;
mod probe;
mod promote;
mod run;
mod run_workers;
mod selftest;
mod subject;

pub use bench_compare::REGRESSION_EXIT;

use crate::args::{Command, Provenance};
use crate::error::GateError;
use memra_receipts::schema::{Receipt, Verdict};

/// What a command concluded; the binary maps it to an exit status (0, 1 and 3; an error is 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Every gate passed (or the command had nothing to judge).
    Passed,
    /// A gate failed: FAIL, VOID or ERROR receipts, a missed canary, a regression.
    Failed,
    /// `bench --compare`: a seam, layer or the step is SLOWER than the base beyond noise
    /// (exit status [`REGRESSION_EXIT`]).
    Regressed,
}

impl Status {
    /// The binary's exit status for it.
    pub fn exit_code(self) -> u8 {
        match self {
            Status::Passed => 0,
            Status::Failed => 1,
            Status::Regressed => REGRESSION_EXIT,
        }
    }
}

/// Run one command.
pub fn dispatch(command: Command, prov: Provenance) -> Result<Status, GateError> {
    match command {
        Command::Run(a) => run::run(&a, prov),
        Command::GenModel(a) => gen_model::gen_model(&a),
        Command::Doors(a) => doors::doors(&a),
        Command::Matrix(a) => matrix::matrix(&a),
        Command::Selftest(a) => selftest::selftest(&a, prov),
        Command::Diff(a) => diff::diff(&a),
        Command::Bench(a) => bench::bench(&a, prov),
        Command::Plot(a) => plot::plot(&a),
        Command::Effects(a) => effects::effects(&a),
        Command::Promote(a) => promote::promote(&a),
        Command::Probe(a) => probe::probe(&a),
        Command::Subject(a) => subject::subject(&a),
        Command::Version => {
            crate::say!("memra-gates {}", prov.long_version());
            Ok(Status::Passed)
        }
    }
}

/// The status of a set of receipts: failed when any is FAIL, VOID or ERROR; an error when
/// nothing passed (an empty or all-skipped selection tested nothing).
pub fn receipts_status(receipts: &[Receipt]) -> Result<Status, GateError> {
    let bad = receipts.iter().any(|r| matches!(r.evidence.verdict, Verdict::Fail | Verdict::Void | Verdict::Error));
    if bad {
        return Ok(Status::Failed);
    }
    if !receipts.iter().any(|r| r.evidence.verdict == Verdict::Pass) {
        return Err(GateError::NothingToTest(
            "nothing was tested: no configuration ran to a verdict (all skipped or not applicable)".into(),
        ));
    }
    Ok(Status::Passed)
}

/// Receipts of a file or a directory.
pub fn load_receipts(p: &std::path::Path) -> Result<Vec<Receipt>, GateError> {
    if p.is_dir() {
        Ok(memra_receipts::store::load_dir(p)?)
    } else {
        Ok(vec![memra_receipts::json::read_receipt(p)?])
    }
}
