//! `memra-gates subject`: the built-in runtime as a protocol subject (docs/subject-protocol.md).
//! It reads the one run the `MEMRA_SUBJECT_*` environment describes (strictly, like every
//! `MEMRA_*` variable), decodes the battery file's prompts on the model file, and writes the tape.
//! `run --subject scripts/subjects/builtin.toml` starts it for every run; because it is the same
//! canonical program, such a plan must give byte-identical evidence to the plan run in process —
//! the protocol's own exactness test (`tests/cli/subject.rs`, `.ci/run`).
//!
//! A run the runtime cannot complete is reported in the tape (`error`, the runtime's message), so
//! its receipt reads as the in-process one would; a bad environment or file is exit status 2.

use super::Status;
use crate::args::SubjectArgs;
use crate::error::GateError;
use crate::registry::{
    Registry, SettingValue, SUBJECT_BACKEND, SUBJECT_BATTERY, SUBJECT_MODEL, SUBJECT_PROTOCOL, SUBJECT_TAPE,
    SUBJECT_TP, SUBJECT_TRANSPORT,
};
use crate::subject::protocol::battery::BatteryFile;
use crate::subject::protocol::{tape, PROTOCOL_VERSIONS};
use crate::subject::{Builtin, RunSpec, BUILTIN_NAME, BUILTIN_VERSION};
use memra_receipts::schema::ModelEvidence;
use memra_runtime::record::Record;
use memra_runtime::ExpertFormat;
use std::collections::BTreeMap;
use std::path::PathBuf;

pub fn subject(_: &SubjectArgs) -> Result<Status, GateError> {
    let registry = Registry::builtin()?;
    let req = crate::env::parse_env(crate::env::process_vars(), &registry)?;
    let missing = |name: &str| {
        GateError::usage(format!(
            "memra-gates subject runs one configuration under the subject protocol, and {name} is not set: it is started by `memra-gates run --subject scripts/subjects/builtin.toml` (docs/subject-protocol.md)"
        ))
    };
    let get = |name: &str| req.settings.get(name).ok_or_else(|| missing(name));
    let path = |name: &str| match get(name)? {
        SettingValue::Path(p) => Ok(p.clone()),
        _ => Err(missing(name)),
    };
    let protocol = match get(SUBJECT_PROTOCOL)? {
        SettingValue::Count(v) if PROTOCOL_VERSIONS.contains(v) => *v,
        other => {
            return Err(GateError::usage(format!(
                "{SUBJECT_PROTOCOL}={other:?}: this build speaks subject protocol versions {PROTOCOL_VERSIONS:?}"
            )))
        }
    };
    let (SettingValue::Backend(backend), SettingValue::Tp(tp), SettingValue::Transport(transport)) =
        (get(SUBJECT_BACKEND)?, get(SUBJECT_TP)?, get(SUBJECT_TRANSPORT)?)
    else {
        return Err(GateError::usage(
            "MEMRA_SUBJECT_BACKEND, _TP and _TRANSPORT hold a backend, a TP size and a transport",
        ));
    };
    let (model_path, battery_path, tape_path): (PathBuf, PathBuf, PathBuf) =
        (path(SUBJECT_MODEL)?, path(SUBJECT_BATTERY)?, path(SUBJECT_TAPE)?);
    let doors = req.to_door_set(&registry)?;
    let enabled = req.enabled(&registry);
    let text = std::fs::read_to_string(&battery_path)
        .map_err(|e| GateError::usage(format!("{SUBJECT_BATTERY}={}: {e}", battery_path.display())))?;
    let request = BatteryFile::parse(&text, &battery_path.display().to_string()).map_err(GateError::Usage)?;
    if request.pass.lanes() > 1 && protocol < crate::subject::protocol::shapes::SHAPES_SINCE {
        return Err(GateError::usage(format!(
            "{SUBJECT_PROTOCOL}={protocol} with a {} battery file: protocol {protocol} runs single-token passes only",
            request.pass.label()
        )));
    }
    let pass = request.pass;
    let runtime = Builtin {
        model: memra_runtime::model::format::load(&model_path)?,
        model_evidence: ModelEvidence { preset: "file".into(), digest: String::new() },
        battery: request.battery,
        device_reserve_bytes: 0,
        dist: None,
        // One run per process: the pool prepares the weights once and runs on them.
        pool: memra_runtime::program::pool::Pool::new(memra_runtime::program::pool::Budget::for_this_machine()),
        // The subject protocol's process runs one configuration with the cores to itself.
        host_ranks: crate::subject::HostRankPolicy::Auto { workers: 1 },
    };
    let forced = request.forced.map(|tokens| Record { tokens, ..Record::default() });
    let spec = RunSpec {
        backend: *backend,
        tp: *tp,
        transport: *transport,
        doors,
        door_vars: BTreeMap::new(),
        // NVFP4 banks come with their door (`RunConfig::nvfp4_experts`); the protocol has no other way.
        format: ExpertFormat::E4m3,
        forced: forced.as_ref(),
        capture: request.capture,
        // Protocol 2's battery file names the pass shape (version 1: single-token); the runtime
        // records each lane's (pass, lane), which the tape carries as `p{p}.lanes`.
        pass,
        // The tape carries the seam timings (optional in the protocol, written when recorded).
        timing: memra_runtime::Timing::Seams,
    };
    let bytes = match runtime.run_canonical(spec) {
        Ok(record) => {
            // Claimed: the doors that were on and whose counter the record shows (> 0).
            let claims: Vec<String> = registry
                .doors()
                .iter()
                .filter(|d| enabled.contains(&d.id) && record.engaged.get(&d.engagement).is_some_and(|n| *n > 0))
                .map(|d| d.env.clone())
                .collect();
            tape::write(&record, BUILTIN_NAME, BUILTIN_VERSION, &claims)
                .map_err(|e| GateError::usage(format!("the tape cannot be written: {e}")))?
        }
        Err(e) => tape::write_error(BUILTIN_NAME, BUILTIN_VERSION, &e.to_string()),
    };
    std::fs::write(&tape_path, bytes)
        .map_err(|e| GateError::usage(format!("{SUBJECT_TAPE}={}: cannot write the tape: {e}", tape_path.display())))?;
    Ok(Status::Passed)
}
