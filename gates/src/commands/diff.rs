//! `memra-gates diff OLD NEW`: what a reviewer needs about a change (docs/DESIGN.md §5), with an
//! exit status a CI job can gate on: 1 only for a regression beyond noise (METRICS.md).

use super::{load_receipts, Status};
use crate::args::DiffArgs;
use crate::error::GateError;
use memra_receipts::Receipt;
use std::collections::BTreeSet;

/// The models (`preset digest`) of a receipt set.
fn models(receipts: &[Receipt]) -> BTreeSet<String> {
    receipts.iter().map(|r| format!("{} {}", r.evidence.config.model.preset, r.evidence.config.model.digest)).collect()
}

pub fn diff(args: &DiffArgs) -> Result<Status, GateError> {
    let format: memra_receipts::DiffFormat = args.format.parse().map_err(GateError::usage)?;
    let (old, new) = (load_receipts(&args.old)?, load_receipts(&args.new)?);
    if old.is_empty() && new.is_empty() {
        return Err(GateError::NothingToTest(format!(
            "{} and {} hold no receipt: nothing was compared",
            args.old.display(),
            args.new.display()
        )));
    }
    // Runs pair by identity, and the model is part of it: two sets with no model in common pair
    // nothing, and reading that as "every run missing" would cry wolf.
    let (mo, mn) = (models(&old), models(&new));
    if !old.is_empty() && !new.is_empty() && mo.is_disjoint(&mn) {
        return Err(GateError::usage(format!(
            "{} holds receipts of model(s) {} and {} of model(s) {}: no run can pair across different models; diff receipts of the same model",
            args.old.display(),
            mo.into_iter().collect::<Vec<_>>().join(", "),
            args.new.display(),
            mn.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    let report = memra_receipts::diff(&old, &new, args.threshold)?;
    crate::say!("{}", report.render(format)?);
    Ok(if report.regressed() { Status::Failed } else { Status::Passed })
}
