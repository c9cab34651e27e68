//! `memra-gates doors`: the registry as a table or as JSON.

use super::Status;
use crate::args::DoorsArgs;
use crate::error::GateError;
use crate::registry::view;

pub fn doors(args: &DoorsArgs) -> Result<Status, GateError> {
    let registry = crate::plan::load_registry(&args.registry)?;
    if args.json {
        crate::say!("{}", view::to_json(&registry));
    } else {
        crate::say!("{}", view::to_table(&registry));
    }
    Ok(Status::Passed)
}
