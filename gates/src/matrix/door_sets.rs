//! Door-set files (`--matrix FILE`): a matrix written down by hand, defined and versioned here.
//!
//! A TOML (`.toml`) or JSON (`.json`) file with a schema version and a list of door sets; each
//! door is named by its id (any case) or its `MEMRA_*` variable; `[]` is the baseline. Sets are
//! taken literally (requirements are not added). Unknown doors, repeated doors and repeated sets
//! are errors. A configuration of a set that the registry's rules exclude (`requires`,
//! `conflicts`, `tp`, `transports`) is an error naming the rule, unless the file says
//! `expect_exclusions = true`; then the exclusions are printed by the run and listed in
//! summary.md / summary.json.
//! ```toml
//! schema_version = 1
//! sets = [[], ["oproj_direct", "oproj_tail"], ["MEMRA_STEP_TP_W8"]]
//! expect_exclusions = true   # optional: oproj_direct does not run at TP1, and that is expected
//! ```
//! ```json
//! {"schema_version": 1, "sets": [[], ["oproj_direct", "oproj_tail"], ["MEMRA_STEP_TP_W8"]]}
//! ```

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

use crate::registry::{Registry, RegistryError};

/// The schema version of door-set files.
pub const DOOR_SET_FILE_VERSION: i64 = 1;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DoorSetFile {
    #[allow(dead_code)] // checked before strict parsing
    schema_version: i64,
    sets: Vec<Vec<String>>,
    #[serde(default)]
    expect_exclusions: bool,
}

/// The door sets of a file, and whether it expects the rules to exclude some configurations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorSets {
    pub sets: Vec<BTreeSet<String>>,
    pub expect_exclusions: bool,
}

/// How a door-set file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetFileFormat {
    Toml,
    Json,
}

/// Read a door-set file (format by extension: `.toml` or `.json`).
pub fn read_door_sets(path: &Path, registry: &Registry) -> Result<DoorSets, RegistryError> {
    let origin = path.display().to_string();
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => SetFileFormat::Toml,
        Some("json") => SetFileFormat::Json,
        _ => {
            return Err(RegistryError::Matrix {
                thing: "door-set file".to_string(),
                value: origin,
                rule: "the file name must end in .toml or .json".to_string(),
            })
        }
    };
    let text = crate::paths::read_text(path).map_err(|source| RegistryError::Io { path: origin.clone(), source })?;
    parse_door_sets(&text, format, &origin, registry)
}

/// Parse door-set file text; `origin` names it in error messages.
pub fn parse_door_sets(
    text: &str,
    format: SetFileFormat,
    origin: &str,
    registry: &Registry,
) -> Result<DoorSets, RegistryError> {
    let parse_err = |message: String| RegistryError::Parse {
        origin: origin.to_string(),
        what: format!("door-set file (schema_version {DOOR_SET_FILE_VERSION})"),
        message,
    };
    let version = match format {
        SetFileFormat::Toml => {
            let t: toml::Table = toml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
            t.get("schema_version").map(|v| (v.as_integer(), crate::text::version_text(&v.to_string(), v.is_str())))
        }
        SetFileFormat::Json => {
            let v: serde_json::Value = serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?;
            v.get("schema_version").map(|v| (v.as_i64(), crate::text::version_text(&v.to_string(), v.is_string())))
        }
    };
    match version {
        Some((Some(DOOR_SET_FILE_VERSION), _)) => {}
        other => {
            return Err(RegistryError::SchemaVersion {
                origin: origin.to_string(),
                found: other.map_or("(missing)".to_string(), |(_, s)| s),
                supported: DOOR_SET_FILE_VERSION,
            })
        }
    }
    let file: DoorSetFile = match format {
        SetFileFormat::Toml => toml::from_str(text).map_err(|e| parse_err(e.to_string()))?,
        SetFileFormat::Json => serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?,
    };
    let mut sets: Vec<BTreeSet<String>> = Vec::new();
    let mut errors = Vec::new();
    for (k, names) in file.sets.iter().enumerate() {
        let mut set = BTreeSet::new();
        let errors_before = errors.len();
        for name in names {
            let door = registry.by_env(name).or_else(|| registry.door(&name.to_ascii_lowercase()));
            match door {
                Some(d) if !set.insert(d.id.clone()) => errors.push(RegistryError::Matrix {
                    thing: format!("{origin} set #{k}"),
                    value: format!("{names:?}"),
                    rule: format!("door {} is named twice", d.id),
                }),
                Some(_) => {}
                None => errors.push(RegistryError::UnknownName {
                    name: format!("{origin} set #{k} door {name:?}"),
                    kind: "door".to_string(),
                    rule: format!("doors are the ids and MEMRA_* variables of {}", registry.origin()),
                    suggestion: crate::text::nearest(&name.to_ascii_lowercase(), registry.ids())
                        .or_else(|| crate::text::nearest(name, registry.env_names()))
                        .map(str::to_string),
                }),
            }
        }
        // A set with an unknown door is not the set it looks like without it: no repeat to report.
        let whole = errors.len() == errors_before;
        if let Some(first) = sets.iter().position(|s| *s == set).filter(|_| whole) {
            errors.push(RegistryError::Matrix {
                thing: format!("{origin} set #{k}"),
                value: format!("{names:?}"),
                rule: format!("repeats set #{first}"),
            });
        }
        sets.push(set);
    }
    RegistryError::collect(errors)?;
    Ok(DoorSets { sets, expect_exclusions: file.expect_exclusions })
}
