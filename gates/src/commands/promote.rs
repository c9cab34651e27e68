//! `memra-gates promote`: which doors earned default-on over the nightly history
//! (docs/DESIGN.md §7), and the defaults block to commit.

use super::Status;
use crate::args::PromoteArgs;
use crate::error::GateError;
use crate::promote::{load_history, promote_with, Coverage, Policy};

pub fn promote(args: &PromoteArgs) -> Result<Status, GateError> {
    let what = "the defaults file";
    crate::paths::check_out(&args.out, crate::paths::OutKind::File(what))?;
    // An external subject's doors are its manifest's (`run --subject` judged them by those).
    let registry = match &args.subject {
        Some(m) => crate::subject::protocol::manifest::Manifest::load(m)?.registry,
        None => crate::plan::load_registry(&args.registry)?,
    };
    let coverage = Coverage::parse(&args.coverage)?;
    let mut policy = Policy::new(args.nights, coverage)?;
    if let Some(k) = args.gain_nights {
        policy = policy.with_gain_nights(k)?;
    }
    let history = load_history(&args.history)?;
    for w in &history.warnings {
        eprintln!("memra-gates: warning: {w}");
    }
    let report = promote_with(&registry, &history.nights, policy);
    print!("{}", report.to_table());
    memra_receipts::store::write_atomic(&args.out, report.defaults_toml(&registry).as_bytes()).map_err(|e| {
        let reason = match e {
            memra_receipts::ReceiptError::Io { action, source, .. } => format!("cannot {action}: {source}"),
            other => other.to_string(),
        };
        GateError::OutDir { dir: args.out.clone(), rule: format!("{what} was not written: {reason}") }
    })?;
    crate::say!("defaults block written to {}", args.out.display());
    Ok(Status::Passed)
}
