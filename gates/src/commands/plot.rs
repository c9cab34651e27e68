//! `memra-gates plot`: latency plots from receipts (docs/DESIGN.md §6). A history compares one
//! model's nights: sets of different models are refused, like `promote` refuses them. `--doors`:
//! the door chart over nights (docs/DESIGN.md §7).

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

/// The label of each history set: the shortest tail of its path (directory name, then parent/name,
/// …) that tells the sets apart, so `nights/n1/all nights/n2/all` read `n1/all` and `n2/all`.
/// Paths that are equal keep equal labels (the plot refuses a set given twice).
fn labels(paths: &[std::path::PathBuf]) -> Vec<String> {
    let parts: Vec<Vec<String>> = paths
        .iter()
        .map(|p| p.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).filter(|c| c != ".").collect())
        .collect();
    let longest = parts.iter().map(Vec::len).max().unwrap_or(0);
    let tail = |k: usize| -> Vec<String> { parts.iter().map(|p| p[p.len().saturating_sub(k)..].join("/")).collect() };
    for k in 1..=longest {
        let l = tail(k);
        let distinct: std::collections::BTreeSet<&String> = l.iter().collect();
        let paths_distinct: std::collections::BTreeSet<&Vec<String>> = parts.iter().collect();
        if distinct.len() == paths_distinct.len() {
            return l;
        }
    }
    tail(longest)
}

/// `plot --doors`: each directory is one night; its door summaries are computed from its
/// receipts (the same function as `door-effects.json`), and the nights are drawn oldest first
/// (earliest receipt start, ties by label).
fn door_nights(args: &PlotArgs) -> Result<Vec<(String, Vec<memra_receipts::effect::DoorNight>)>, GateError> {
    let mut nights = Vec::new();
    for (label, p) in labels(&args.receipts).into_iter().zip(&args.receipts) {
        let receipts = load_receipts(p)?;
        let start = receipts.iter().map(|r| r.measurements.started_at_unix_ms).min().unwrap_or(u64::MAX);
        let sums = memra_receipts::effect::door_nights(&memra_receipts::effect::door_effects(&receipts));
        nights.push((start, label, sums));
    }
    nights.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    Ok(nights.into_iter().map(|(_, l, s)| (l, s)).collect())
}

pub fn plot(args: &PlotArgs) -> Result<Status, GateError> {
    crate::paths::check_out(&args.out, crate::paths::OutKind::Dir("the plot directory"))?;
    let files = if args.doors {
        memra_tools::plot::plot_doors(&door_nights(args)?, &args.out)
    } else if args.history {
        let sets = labels(&args.receipts)
            .into_iter()
            .zip(&args.receipts)
            .map(|(label, p)| Ok((label, load_receipts(p)?)))
            .collect::<Result<Vec<_>, GateError>>()?;
        let all: std::collections::BTreeSet<String> = sets.iter().flat_map(|(_, r)| models(r)).collect();
        if all.len() > 1 {
            return Err(GateError::usage(format!(
                "plot --history: the nights hold receipts of {} models ({}); a history line per seam compares one model's nights — plot each model's history separately",
                all.len(),
                all.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
        memra_tools::plot::plot_history(&sets, &args.out, args.per_config)
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

#[cfg(test)]
mod tests {
    use super::labels;
    use std::path::PathBuf;

    #[test]
    fn history_labels_are_the_shortest_distinct_tails() {
        let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(labels(&p(&["nights/a", "nights/b"])), ["a", "b"]);
        assert_eq!(labels(&p(&["/n/2026-01-01/all", "/n/2026-01-02/all"])), ["2026-01-01/all", "2026-01-02/all"]);
        assert_eq!(labels(&p(&["x/n1/all/edge", "y/n1/all/edge"])), ["x/n1/all/edge", "y/n1/all/edge"]);
        assert_eq!(labels(&p(&["./a/", "a"])), ["a", "a"], "one directory given twice stays one label");
    }
}
