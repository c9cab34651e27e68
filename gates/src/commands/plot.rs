//! `memra-gates plot`: latency plots from receipts (docs/DESIGN.md §6). A history compares one
//! model's nights: sets of different models are refused, like `promote` refuses them.

use super::{load_receipts, Status};
use crate::args::PlotArgs;
use crate::error::GateError;
use memra_receipts::Receipt;

/// The models (`preset digest`) of a set of run receipts.
fn models(receipts: &[Receipt]) -> std::collections::BTreeSet<String> {
    receipts
        .iter()
        .filter(|r| r.kind == memra_receipts::ReceiptKind::Run)
        .map(|r| format!("{} {}", r.evidence.config.model.preset, r.evidence.config.model.digest))
        .collect()
}

pub fn plot(args: &PlotArgs) -> Result<Status, GateError> {
    let files = if args.history {
        let sets = args
            .receipts
            .iter()
            .map(|p| {
                Ok((p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), load_receipts(p)?))
            })
            .collect::<Result<Vec<_>, GateError>>()?;
        let all: std::collections::BTreeSet<String> = sets.iter().flat_map(|(_, r)| models(r)).collect();
        if all.len() > 1 {
            return Err(GateError::usage(format!(
                "plot --history: the nights hold receipts of {} models ({}); a history line per seam compares one model's nights — plot each model's history separately",
                all.len(),
                all.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
        memra_tools::plot::plot_history(&sets, &args.out)
    } else {
        let mut all = Vec::new();
        for p in &args.receipts {
            all.extend(load_receipts(p)?);
        }
        memra_tools::plot::plot_receipts(&all, &args.out)
    }
    .map_err(|e| GateError::usage(e.to_string()))?;
    for f in files {
        crate::say!("{}", f.display());
    }
    Ok(Status::Passed)
}
