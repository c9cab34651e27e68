//! Door-set files (`--matrix FILE`): a matrix written down by hand, defined and versioned here.
//!
//! A TOML (`.toml`) or JSON (`.json`) file with a schema version and a list of door sets; each
//! door is named by its id (any case) or its `MEMRA_*` variable; `[]` is the baseline. Sets are
//! taken literally (requirements are not added), so an illegal set is reported as excluded with
//! its rule. Unknown doors, repeated doors and repeated sets are errors.
//! ```toml
//! schema_version = 1
//! sets = [[], ["oproj_direct", "oproj_tail"], ["MEMRA_STEP_TP_W8"]]
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
}

/// How a door-set file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetFileFormat {
    Toml,
    Json,
}

/// Read a door-set file (format by extension: `.toml` or `.json`).
pub fn read_door_sets(path: &Path, registry: &Registry) -> Result<Vec<BTreeSet<String>>, RegistryError> {
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
    let text = std::fs::read_to_string(path).map_err(|source| RegistryError::Io { path: origin.clone(), source })?;
    parse_door_sets(&text, format, &origin, registry)
}

/// Parse door-set file text; `origin` names it in error messages.
pub fn parse_door_sets(
    text: &str,
    format: SetFileFormat,
    origin: &str,
    registry: &Registry,
) -> Result<Vec<BTreeSet<String>>, RegistryError> {
    let parse_err = |message: String| RegistryError::Parse {
        origin: origin.to_string(),
        what: format!("door-set file (schema_version {DOOR_SET_FILE_VERSION})"),
        message,
    };
    let version = match format {
        SetFileFormat::Toml => {
            let t: toml::Table = toml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
            t.get("schema_version").map(|v| (v.as_integer(), v.to_string()))
        }
        SetFileFormat::Json => {
            let v: serde_json::Value = serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?;
            v.get("schema_version").map(|v| (v.as_i64(), v.to_string()))
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
        if let Some(first) = sets.iter().position(|s| *s == set) {
            errors.push(RegistryError::Matrix {
                thing: format!("{origin} set #{k}"),
                value: format!("{names:?}"),
                rule: format!("repeats set #{first}"),
            });
        }
        sets.push(set);
    }
    RegistryError::collect(errors)?;
    Ok(sets)
}
