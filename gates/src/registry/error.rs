//! The registry's error type, shared by the registry format, the environment / flag edge
//! (`crate::env`) and the matrix enumerator (`crate::matrix`): all three report problems with a
//! door request in the same words (the thing, the value, the rule), and a caller can tell an
//! unknown name from a broken rule by the variant.

/// Errors of the registry, the environment / flag edge and the matrix enumerator. Each message
/// names the thing, the value and the rule.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{origin} is not a valid {what}: {message}")]
    Parse { origin: String, what: String, message: String },
    #[error("{origin} has schema_version {found}; this build reads schema_version {supported} only")]
    SchemaVersion { origin: String, found: String, supported: i64 },
    /// A registry entry breaks a rule of the format.
    #[error("{origin}: {thing} = {value}: {rule}")]
    Invalid { origin: String, thing: String, value: String, rule: String },
    /// A door variable or flag with a value other than 0, 1 or empty.
    #[error("{name}={value:?} is not a door value: use 1 (on), 0 or empty (off)")]
    DoorValue { name: String, value: String },
    /// A setting with a value its format does not accept.
    #[error("{name}={value:?} is not a valid value: {rule}")]
    SettingValue { name: String, value: String, rule: String },
    /// A `MEMRA_*` variable, door flag or door name that the registry does not declare.
    #[error("{name} is not a known {kind} ({rule}); {}", suggestion_text(.suggestion))]
    UnknownName { name: String, kind: String, rule: String, suggestion: Option<String> },
    /// A malformed command-line value (door flag, shard spec).
    #[error("{flag} {value:?} is malformed: {rule}")]
    Flag { flag: String, value: String, rule: String },
    /// An explicit door request that breaks a requires / conflicts rule.
    #[error("{0}")]
    Request(String),
    /// A matrix request that cannot be enumerated.
    #[error("matrix {thing} {value}: {rule}")]
    Matrix { thing: String, value: String, rule: String },
    /// A door set the runtime has no field for.
    #[error("door {id:?} cannot run on the built-in runtime: {rule}")]
    NoRuntimeField { id: String, rule: String },
    /// A registry text that new defaults cannot be written into (`promote`).
    #[error("{origin}: {rule}")]
    Rewrite { origin: String, rule: String },
    /// Several independent problems, reported together (one per line).
    #[error("{}", join_lines(.0))]
    Several(Vec<RegistryError>),
}

fn suggestion_text(s: &Option<String>) -> String {
    match s {
        Some(s) => format!("did you mean {s}?"),
        None => "no similar name".to_string(),
    }
}

fn join_lines(errors: &[RegistryError]) -> String {
    errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n")
}

impl RegistryError {
    /// One error as itself, several as [`RegistryError::Several`], none as `Ok`.
    pub fn collect(mut errors: Vec<RegistryError>) -> Result<(), RegistryError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(RegistryError::Several(errors)),
        }
    }
}
