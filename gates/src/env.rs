//! The edge where doors enter: environment variables and `--door` flags become an explicit
//! [`DoorRequest`], strictly, before any work starts (docs/DESIGN.md §4.1, §9). The engine this tool
//! gates once read doors as "exactly `1` or silently off", so a typo or a `yes` ran the default
//! path and passed; here every `MEMRA_*` name must be declared in the registry and every value
//! must be one the registry's rules accept, or the request fails with the value and the rule.

use std::collections::{BTreeMap, BTreeSet};

use memra_runtime::config::DoorSet;

use crate::registry::{FlipAt, Registry, RegistryError, SettingValue, CANARY_FLIP_AT, HOST_CLOCK, REQUIRE_GPU};
use crate::text::{best, edit_distance};

/// The prefix every door variable and tool setting shares.
pub const PREFIX: &str = "MEMRA_";

/// Doors and settings as the user asked for them: only what was given explicitly.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DoorRequest {
    /// Explicit value per door id; a door that is absent takes its registry default.
    pub doors: BTreeMap<String, bool>,
    /// Settings given with a non-empty value, by environment name.
    pub settings: BTreeMap<String, SettingValue>,
}

impl DoorRequest {
    /// The doors that are on: the explicit values, and the registry default for the rest.
    pub fn enabled(&self, registry: &Registry) -> BTreeSet<String> {
        registry
            .doors()
            .iter()
            .filter(|d| self.doors.get(&d.id).copied().unwrap_or(d.default))
            .map(|d| d.id.clone())
            .collect()
    }

    /// Lay `later` over this request: its explicit values win (flags override the environment).
    pub fn overlay(&mut self, later: DoorRequest) {
        self.doors.extend(later.doors);
        self.settings.extend(later.settings);
    }

    /// `MEMRA_REQUIRE_GPU`: whether GPU skips must become failures.
    pub fn require_gpu(&self, registry: &Registry) -> bool {
        self.flag(registry, REQUIRE_GPU)
    }

    /// `MEMRA_HOST_CLOCK`: whether runs time their host side (`memra_runtime::host_clock`).
    pub fn host_clock(&self, registry: &Registry) -> bool {
        self.flag(registry, HOST_CLOCK)
    }

    /// A `bool01` setting's value, or the registry default.
    fn flag(&self, registry: &Registry, env: &str) -> bool {
        let given = self.settings.get(env).cloned();
        let default = registry.setting(env).and_then(|s| s.default_value.clone());
        matches!(given.or(default), Some(SettingValue::Bool(true)))
    }

    /// `MEMRA_CANARY_FLIP_AT`, or the registry default.
    pub fn canary_flip_at(&self, registry: &Registry) -> Option<FlipAt> {
        match self.settings.get(CANARY_FLIP_AT) {
            Some(SettingValue::FlipAt(at)) => Some(*at),
            _ => registry.default_flip_at(),
        }
    }

    /// The runtime's explicit door values for this request.
    pub fn to_door_set(&self, registry: &Registry) -> Result<DoorSet, RegistryError> {
        let enabled = self.enabled(registry);
        registry.to_door_set(&enabled, self.canary_flip_at(registry))
    }
}

/// The value of a door variable or flag: unset (not passed here), `""` or `"0"` → off,
/// `"1"` → on; anything else (`"yes"`, `"2"`, `" 1"`) is an error that quotes it.
pub fn parse_door_value(name: &str, value: &str) -> Result<bool, RegistryError> {
    match value {
        "" | "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(RegistryError::DoorValue { name: name.to_string(), value: value.to_string() }),
    }
}

/// The process environment's `MEMRA_*` variables: the one place the crate reads the environment
/// (architecture invariant, checked by the tidy test). Names are matched case-insensitively so a
/// misspelt `memra_x` is reported; values that are not UTF-8 are passed on lossily and refused by
/// the value rules.
pub fn process_vars() -> Vec<(String, String)> {
    std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .filter(|(k, _)| k.to_ascii_uppercase().starts_with(PREFIX))
        .collect()
}

/// The names of this process's `MEMRA_*` variables (any case): what a subject process must not
/// inherit (docs/subject-protocol.md: it sees only the variables of its run).
pub fn memra_names() -> Vec<String> {
    process_vars().into_iter().map(|(k, _)| k).collect()
}

/// This process's `PATH` (empty when unset): where a subject manifest's bare program name is
/// looked up before the plan runs (`Manifest::check_program`).
pub fn path_var() -> std::ffi::OsString {
    std::env::var_os("PATH").unwrap_or_default()
}

/// The CUDA variables the tool reads (`None` for any other name): the toolkit's location
/// (`CUDA_HOME`, `CUDA_PATH`), where the outside witness looks for CUPTI
/// (`subject::protocol::witness`), and the MPS control pipe's folder (`CUDA_MPS_PIPE_DIRECTORY`,
/// `run --worker-processes`).
pub fn cuda_var(name: &str) -> Option<std::ffi::OsString> {
    matches!(name, "CUDA_HOME" | "CUDA_PATH" | "CUDA_MPS_PIPE_DIRECTORY").then(|| std::env::var_os(name)).flatten()
}

/// Read the `MEMRA_*` variables out of an environment (pass `std::env::vars()` or a test list).
/// Other variables are ignored. Every problem is reported, one per line.
pub fn parse_env<I>(vars: I, registry: &Registry) -> Result<DoorRequest, RegistryError>
where
    I: IntoIterator<Item = (String, String)>,
{
    let mut given: BTreeMap<String, String> = BTreeMap::new();
    let mut errors = Vec::new();
    for (name, value) in vars {
        if !name.to_ascii_uppercase().starts_with(PREFIX) {
            continue;
        }
        match given.get(&name) {
            Some(prev) if *prev != value => errors.push(RegistryError::Flag {
                flag: name.clone(),
                value: value.clone(),
                rule: format!("the variable is given twice with different values ({prev:?} first)"),
            }),
            _ => {
                given.insert(name, value);
            }
        }
    }
    let mut request = DoorRequest::default();
    for (name, value) in &given {
        if let Some(door) = registry.by_env(name) {
            match parse_door_value(name, value) {
                Ok(on) => {
                    request.doors.insert(door.id.clone(), on);
                }
                Err(e) => errors.push(e),
            }
        } else if let Some(setting) = registry.setting(name) {
            match setting.format.parse(name, value) {
                Ok(Some(v)) => {
                    request.settings.insert(name.clone(), v);
                }
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        } else {
            let case = name.starts_with(PREFIX);
            let odd = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_'));
            errors.push(RegistryError::UnknownName {
                // Quoted: a trailing space or an empty suffix (`MEMRA_`) must be visible.
                name: format!("{name:?}"),
                kind: "MEMRA_* variable".to_string(),
                rule: if let Some(c) = odd {
                    format!("the name contains {c:?}; door and setting names are MEMRA_ and upper-case letters, digits and _")
                } else if name.len() == PREFIX.len() {
                    "the name is the bare prefix MEMRA_; doors and settings are MEMRA_<NAME>".to_string()
                } else if case {
                    format!("every MEMRA_* variable must be a door or a setting of {}", registry.origin())
                } else {
                    "environment names are case-sensitive: doors and settings are spelled MEMRA_ in upper case"
                        .to_string()
                },
                suggestion: if name.len() > PREFIX.len() {
                    suggest_env(&name.to_ascii_uppercase(), registry)
                } else {
                    None
                },
            });
        }
    }
    RegistryError::collect(errors)?;
    Ok(request)
}

/// NCCL's variable that switches NVLink multicast (NVLS).
pub const NCCL_NVLS_ENABLE: &str = "NCCL_NVLS_ENABLE";

/// Keep NCCL's NVLink multicast off for this process unless the user decided otherwise: sets
/// `NCCL_NVLS_ENABLE=0` when it is unset. On shared machines a program that uses NVLink multicast
/// can put every GPU of the host out of service for a long time, and this tool never needs it.
///
/// The binary calls this first thing in `main`, while the process has one thread: a write to the
/// environment races with any other thread reading it (C's `getenv`, which NCCL uses, takes no
/// lock), so this is the only write, and the runtime only checks that the variable is set before
/// it loads NCCL (`memra_runtime::backend::cuda`, module `nccl`).
pub fn keep_nccl_multicast_off() {
    if std::env::var_os(NCCL_NVLS_ENABLE).is_none() {
        std::env::set_var(NCCL_NVLS_ENABLE, "0");
    }
}

/// Parse the values of repeated `--door NAME[=0|1]` flags. NAME is a door's environment name
/// (`MEMRA_OPROJ_DIRECT`) or its id (`oproj_direct`, any case); a bare NAME means `NAME=1`.
pub fn parse_door_flags(flags: &[String], registry: &Registry) -> Result<DoorRequest, RegistryError> {
    const RULE: &str = "use NAME, NAME=1 or NAME=0, where NAME is a door id or its MEMRA_* variable";
    let mut request = DoorRequest::default();
    let mut errors = Vec::new();
    for flag in flags {
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (flag.as_str(), None),
        };
        if name.trim().is_empty() {
            errors.push(RegistryError::Flag {
                flag: "--door".to_string(),
                value: flag.clone(),
                rule: format!("the door name is empty; {RULE}"),
            });
            continue;
        }
        let door = registry.by_env(name).or_else(|| registry.door(&name.to_ascii_lowercase()));
        let Some(door) = door else {
            if registry.setting(name).is_some() {
                errors.push(RegistryError::Flag {
                    flag: "--door".to_string(),
                    value: flag.clone(),
                    rule: format!("{name} is a setting, not a door: set it in the environment"),
                });
            } else {
                errors.push(RegistryError::UnknownName {
                    name: format!("--door {name:?}"),
                    kind: "door".to_string(),
                    rule: format!("doors are the ids and MEMRA_* variables of {}", registry.origin()),
                    suggestion: suggest_door(name, registry),
                });
            }
            continue;
        };
        let on = match value {
            None | Some("1") => true,
            Some("0") => false,
            Some(_) => {
                errors.push(RegistryError::Flag {
                    flag: "--door".to_string(),
                    value: flag.clone(),
                    rule: RULE.to_string(),
                });
                continue;
            }
        };
        match request.doors.insert(door.id.clone(), on) {
            Some(prev) if prev != on => errors.push(RegistryError::Flag {
                flag: "--door".to_string(),
                value: flag.clone(),
                rule: format!("{} is set both on and off by --door flags", door.id),
            }),
            _ => {}
        }
    }
    RegistryError::collect(errors)?;
    Ok(request)
}

/// Refuse a request whose enabled doors (explicit, or on by default) miss a requirement or
/// conflict; the error quotes each broken rule.
pub fn check_explicit(request: &DoorRequest, registry: &Registry) -> Result<(), RegistryError> {
    let enabled = request.enabled(registry);
    let mut errors = Vec::new();
    let on = |id: &str| match request.doors.get(id) {
        Some(true) => format!("{}=1", env_of(registry, id)),
        _ => format!("{} (on by default)", env_of(registry, id)),
    };
    for id in &enabled {
        let Some(door) = registry.door(id) else { continue };
        for link in &door.requires {
            if !enabled.contains(&link.id) {
                let given_off = match request.doors.get(&link.id) {
                    Some(false) => format!("; {}=0 was given", env_of(registry, &link.id)),
                    _ => String::new(),
                };
                errors.push(RegistryError::Request(format!(
                    "{} requires {}=1 (rule: {}){given_off}",
                    on(id),
                    env_of(registry, &link.id),
                    link.why
                )));
            }
        }
        for link in &door.conflicts {
            if id < &link.id && enabled.contains(&link.id) {
                errors.push(RegistryError::Request(format!(
                    "{} conflicts with {} (rule: {}); set one of them to 0",
                    on(id),
                    on(&link.id),
                    link.why
                )));
            }
        }
    }
    RegistryError::collect(errors)
}

fn env_of<'r>(registry: &'r Registry, id: &'r str) -> &'r str {
    registry.door(id).map(|d| d.env.as_str()).unwrap_or(id)
}

/// The declared name nearest to an unknown `MEMRA_*` name. Besides the declared names, each
/// door's id spelled as `MEMRA_<ID>` counts as a spelling of its variable, because the engine's
/// names are irregular (`MEMRA_BULK_P2P` means `MEMRA_STEP_TP_BULK_P2P`).
pub fn suggest_env(name: &str, registry: &Registry) -> Option<String> {
    let mut spellings: Vec<(String, &str)> = registry.env_names().into_iter().map(|e| (e.to_string(), e)).collect();
    for d in registry.doors() {
        spellings.push((format!("{PREFIX}{}", d.id.to_ascii_uppercase()), d.env.as_str()));
    }
    best(name, spellings.iter().map(|(s, target)| (s.as_str(), *target))).map(str::to_string)
}

/// The door nearest to an unknown `--door` NAME, as "id (ENV)".
fn suggest_door(name: &str, registry: &Registry) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    let upper = name.to_ascii_uppercase();
    let by_id = best(&lower, registry.doors().iter().map(|d| (d.id.as_str(), d.id.as_str())));
    let by_env = best(&upper, registry.doors().iter().map(|d| (d.env.as_str(), d.id.as_str())));
    let pick = match (by_id, by_env) {
        (Some(a), Some(b)) => {
            let da = edit_distance(&lower, a);
            let db = registry.door(b).map(|d| edit_distance(&upper, &d.env)).unwrap_or(usize::MAX);
            Some(if db < da { b } else { a })
        }
        (a, b) => a.or(b),
    }?;
    registry.door(pick).map(|d| format!("{} ({})", d.id, d.env))
}
