//! The subject manifest (TOML, `protocol = 1`; documented with an example in [`super`]): who the
//! subject is, how it is started, what it supports, what it claims against the canonical
//! program, and its doors. Reading is strict — the version first, then unknown fields, then every
//! rule — and a bad manifest is refused before any work with the field, the value and the rule.
//!
//! The subject's doors become a registry of their own (the plan's registry under `--subject`):
//! the built-in doors it lists, taken from `gates/doors.toml` with the links between them, and its
//! own `[[door]]` entries, validated by the registry's rules; the tool's `[[setting]]`s are added
//! so the environment is parsed as strictly as ever.

use super::shapes::SubjectShapes;
use super::{PROTOCOL_VERSION, PROTOCOL_VERSIONS};
use crate::error::GateError;
use crate::matrix::Configuration;
use crate::registry::{ErrorBudget, Registry, BUILTIN_REGISTRY, TP_SIZES};
use memra_runtime::backend::BackendKind;
use memra_runtime::record::Seam;
use memra_runtime::Transport;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Placeholders a `command` may hold.
pub const PLACEHOLDERS: [&str; 2] = ["{manifest_dir}", "{memra_gates}"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    protocol: i64,
    name: String,
    version: String,
    command: Vec<String>,
    time_limit_s: u64,
    backends: Vec<String>,
    tp: Vec<usize>,
    transports: Vec<String>,
    seams: Vec<String>,
    doors: Vec<String>,
    class: String,
    #[serde(default)]
    error_budget: Option<RawBudget>,
    #[serde(default)]
    gate: Option<String>,
    #[serde(default)]
    gate_why: Option<String>,
    #[serde(default)]
    door: Vec<toml::Table>,
    /// Protocol 2: sessions per pass (rows) the subject runs; absent: `[1]`.
    #[serde(default)]
    batch: Option<Vec<i64>>,
    /// Protocol 2: consecutive tokens of one session per pass (columns); absent: `[1]`.
    #[serde(default)]
    columns: Option<Vec<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    max_rel_error: f64,
    near_tie_margin: f64,
    #[serde(default)]
    per_seam: BTreeMap<String, f64>,
    why: String,
}

/// What a subject claims about its numbers against the canonical program.
#[derive(Debug, Clone, PartialEq)]
pub enum SubjectClass {
    /// BIT-IDENTICAL: every seam digest equals the oracle's (identity; on CUDA also device-host).
    Exact,
    /// NUMERIC-CLASS: argmax tape, error budget, and (with `class_identity`) its own TP1 run of
    /// the same doors as class baseline.
    Numeric { budget: ErrorBudget, class_identity: bool },
}

/// A checked manifest.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// The file it was read from (absolute).
    pub path: PathBuf,
    pub name: String,
    pub version: String,
    /// argv, placeholders not yet expanded.
    pub command: Vec<String>,
    pub time_limit: Duration,
    pub backends: Vec<BackendKind>,
    pub tp: Vec<usize>,
    pub transports: Vec<Transport>,
    /// The door variables it reads, as listed.
    pub doors: Vec<String>,
    pub class: SubjectClass,
    /// Its doors (and the tool's settings): the plan's registry.
    pub registry: Registry,
    /// Whether every door is a built-in one (then the built-in runtime's door values exist).
    pub builtin_doors: bool,
    /// The protocol version it speaks and the pass shapes it runs ([`SubjectShapes`]).
    pub shapes: SubjectShapes,
}

fn bad(path: &Path, field: &str, value: impl std::fmt::Debug, rule: impl std::fmt::Display) -> GateError {
    GateError::usage(format!("subject manifest {}: {field} = {value:?}: {rule}", path.display()))
}

impl Manifest {
    /// Read and check a manifest file.
    pub fn load(path: &Path) -> Result<Manifest, GateError> {
        let text = crate::paths::read_text(path)
            .map_err(|e| GateError::usage(format!("--subject {}: cannot read the manifest: {e}", path.display())))?;
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        Manifest::parse(&text, &abs)
    }

    /// Check manifest text; `path` names it (and is where `{manifest_dir}` points).
    pub fn parse(text: &str, path: &Path) -> Result<Manifest, GateError> {
        let loose: toml::Table = toml::from_str(text)
            .map_err(|e| GateError::usage(format!("subject manifest {}: not TOML: {e}", path.display())))?;
        match loose.get("protocol") {
            Some(toml::Value::Integer(v)) if *v > 0 && PROTOCOL_VERSIONS.contains(&(*v as u64)) => {}
            other => {
                return Err(bad(
                    path,
                    "protocol",
                    other.map_or("(missing)".to_string(), |v| v.to_string()),
                    format!(
                        "this build speaks subject protocol versions {PROTOCOL_VERSIONS:?} (version {PROTOCOL_VERSION} adds rows and columns)"
                    ),
                ))
            }
        }
        let raw: RawManifest =
            toml::from_str(text).map_err(|e| GateError::usage(format!("subject manifest {}: {e}", path.display())))?;
        check_words(path, &raw)?;
        let shapes = SubjectShapes::parse(raw.protocol as u64, raw.batch.as_deref(), raw.columns.as_deref())
            .map_err(|(field, value, rule)| bad(path, field, value, rule))?;
        let backends = raw
            .backends
            .iter()
            .map(|b| match b.as_str() {
                "host" => Ok(BackendKind::Host),
                "cuda" => Ok(BackendKind::Cuda),
                _ => Err(bad(path, "backends", b, "a backend is host or cuda")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let transports = raw
            .transports
            .iter()
            .map(|t| Transport::parse(t).map_err(|e| bad(path, "transports", t, e)))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(t) = raw.tp.iter().find(|t| !TP_SIZES.contains(t)) {
            return Err(bad(path, "tp", t, "TP must be 1, 2, 4 or 8"));
        }
        for (field, n, unique) in [
            ("backends", backends.len(), backends.iter().collect::<BTreeSet<_>>().len()),
            ("tp", raw.tp.len(), raw.tp.iter().collect::<BTreeSet<_>>().len()),
            ("transports", transports.len(), transports.iter().collect::<BTreeSet<_>>().len()),
        ] {
            if n == 0 || unique != n {
                return Err(bad(path, field, n, "a list of at least one value, each once"));
            }
        }
        check_seams(path, &raw.seams)?;
        let class = subject_class(path, &raw)?;
        let (registry, builtin_doors) = subject_registry(path, &raw)?;
        Ok(Manifest {
            path: path.to_path_buf(),
            name: raw.name,
            version: raw.version,
            command: raw.command,
            time_limit: Duration::from_secs(raw.time_limit_s),
            backends,
            tp: raw.tp,
            transports,
            doors: raw.doors,
            class,
            registry,
            builtin_doors,
            shapes,
        })
    }

    /// The argv of one start, its placeholders expanded (`gates_exe` is `{memra_gates}`).
    pub fn argv(&self, gates_exe: &Path) -> Vec<String> {
        let dir = self.dir().display().to_string();
        let exe = gates_exe.display().to_string();
        self.command.iter().map(|a| a.replace("{manifest_dir}", &dir).replace("{memra_gates}", &exe)).collect()
    }

    /// Refuse a command whose program cannot start — a path that does not exist or is not an
    /// executable file, or a bare name found on no `PATH` directory — before any model is built
    /// (a usage error, exit status 2), rather than as an ERROR at every run of the plan.
    /// `path` is the `PATH` a bare name is looked up on (`crate::env::path_var`).
    pub fn check_program(&self, gates_exe: &Path, path: &std::ffi::OsStr) -> Result<(), GateError> {
        let argv = self.argv(gates_exe);
        let program = Path::new(&argv[0]);
        let refuse = |why: String| bad(&self.path, "command", &self.command[0], why);
        if argv[0].contains('/') {
            return match executable(program) {
                Ok(()) => Ok(()),
                Err(why) => Err(refuse(format!("the program {} cannot start: {why}", program.display()))),
            };
        }
        if std::env::split_paths(path).any(|dir| executable(&dir.join(program)).is_ok()) {
            return Ok(());
        }
        Err(refuse(format!(
            "the program `{}` cannot start: it is on no directory of PATH as an executable file",
            argv[0]
        )))
    }

    /// The directory `{manifest_dir}` names.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Why a configuration is outside what the subject supports, or `None` when it is inside.
    pub fn not_applicable(&self, c: &Configuration) -> Option<String> {
        let who = format!("subject {} {}", self.name, self.version);
        let list = |v: Vec<String>| v.join(", ");
        if !self.backends.contains(&c.backend) {
            let names = self.backends.iter().map(|b| b.name().to_string()).collect();
            return Some(format!(
                "{who} runs on {} only: the {} backend is outside its manifest",
                list(names),
                c.backend.name()
            ));
        }
        if !self.tp.contains(&c.tp) {
            let sizes = self.tp.iter().map(|t| format!("TP{t}")).collect();
            return Some(format!("{who} supports {} only: TP{} is outside its manifest", list(sizes), c.tp));
        }
        if !self.transports.contains(&c.transport) {
            let names = self.transports.iter().map(|t| t.name().to_string()).collect();
            return Some(format!(
                "{who} supports the transports {} only: {} is outside its manifest",
                list(names),
                c.transport.name()
            ));
        }
        self.shapes.not_applicable(&who, c.pass())
    }
}

/// Whether `path` is a file this process may execute (`Err`: why not, in words).
fn executable(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{e}"))?;
    if !meta.is_file() {
        return Err("it is not a file".into());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o111 == 0 {
            return Err("it is not executable (no x permission)".into());
        }
    }
    Ok(())
}

/// Name, version, command and time limit: present and well formed.
fn check_words(path: &Path, raw: &RawManifest) -> Result<(), GateError> {
    let word = |c: char| c.is_ascii_alphanumeric() || "._+-".contains(c);
    if raw.name.is_empty() || !raw.name.chars().all(word) {
        return Err(bad(path, "name", &raw.name, "a subject name is [A-Za-z0-9._+-]+ (receipts and tables show it)"));
    }
    if raw.version.is_empty() || !raw.version.chars().all(word) {
        return Err(bad(
            path,
            "version",
            &raw.version,
            "a version is [A-Za-z0-9._+-]+, e.g. 0.1.0 or 2026.05.1+abc123",
        ));
    }
    if raw.command.is_empty() || raw.command[0].is_empty() {
        return Err(bad(path, "command", &raw.command, "the argv of the subject: a program and its arguments"));
    }
    for arg in &raw.command {
        let mut rest = arg.as_str();
        while let Some(open) = rest.find('{') {
            let close = rest[open..].find('}').map(|c| open + c + 1).unwrap_or(rest.len());
            if !PLACEHOLDERS.contains(&&rest[open..close]) {
                return Err(bad(
                    path,
                    "command",
                    arg,
                    format!("{} is not a placeholder (they are {})", &rest[open..close], PLACEHOLDERS.join(", ")),
                ));
            }
            rest = &rest[close..];
        }
    }
    if raw.time_limit_s == 0 {
        return Err(bad(path, "time_limit_s", 0, "a start of the subject needs at least 1 second"));
    }
    Ok(())
}

/// Version 1 gates every seam: the list must name each seam of docs/DESIGN.md §3.2 once.
fn check_seams(path: &Path, seams: &[String]) -> Result<(), GateError> {
    let all: Vec<&str> = Seam::LAYER.iter().chain(Seam::HEAD.iter()).map(|s| s.name()).collect();
    let mut seen = BTreeSet::new();
    for s in seams {
        if !all.contains(&s.as_str()) {
            return Err(bad(path, "seams", s, "not a seam of docs/DESIGN.md §3.2"));
        }
        if !seen.insert(s.as_str()) {
            return Err(bad(path, "seams", s, "a seam is listed once"));
        }
    }
    if let Some(missing) = all.iter().find(|s| !seen.contains(*s)) {
        return Err(bad(
            path,
            "seams",
            seams,
            format!("the subject protocol gates every seam of docs/DESIGN.md §3.2, and `{missing}` is not listed: a subject writes the digest of every seam"),
        ));
    }
    Ok(())
}

/// `class`, `error_budget`, `gate`, `gate_why`: the subject's own claim.
fn subject_class(path: &Path, raw: &RawManifest) -> Result<SubjectClass, GateError> {
    match (raw.class.as_str(), &raw.error_budget) {
        ("BIT-IDENTICAL", None) => {
            if raw.gate.is_some() || raw.gate_why.is_some() {
                return Err(bad(
                    path,
                    "gate",
                    &raw.gate,
                    "a BIT-IDENTICAL subject's gate is identity; leave gate and gate_why out",
                ));
            }
            Ok(SubjectClass::Exact)
        }
        ("BIT-IDENTICAL", Some(_)) => Err(bad(
            path,
            "error_budget",
            "…",
            "a BIT-IDENTICAL subject has no error budget (it claims the oracle's bits)",
        )),
        ("NUMERIC-CLASS", None) => {
            Err(bad(path, "error_budget", "(missing)", "a NUMERIC-CLASS subject declares its error budget"))
        }
        ("NUMERIC-CLASS", Some(b)) => {
            let finite = |v: f64| v.is_finite() && v > 0.0;
            if !finite(b.max_rel_error) || !finite(b.near_tie_margin) || !b.per_seam.values().all(|v| finite(*v)) {
                return Err(bad(
                    path,
                    "error_budget",
                    (b.max_rel_error, b.near_tie_margin),
                    "every bound is finite and > 0",
                ));
            }
            if b.why.trim().is_empty() {
                return Err(bad(
                    path,
                    "error_budget.why",
                    &b.why,
                    "say why the subject's numbers differ from the canonical program's",
                ));
            }
            let mut per_seam = BTreeMap::new();
            for (s, v) in &b.per_seam {
                let seam = Seam::parse(s)
                    .ok_or_else(|| bad(path, "error_budget.per_seam", s, "not a seam of docs/DESIGN.md §3.2"))?;
                per_seam.insert(seam, *v);
            }
            let class_identity = match (raw.gate.as_deref(), raw.gate_why.as_deref()) {
                (None | Some("argmax_tape+class_identity+error_budget"), None) => true,
                (Some("argmax_tape+error_budget"), Some(why)) if !why.trim().is_empty() => false,
                (gate, why) => {
                    return Err(bad(
                        path,
                        "gate",
                        (gate, why),
                        "a NUMERIC-CLASS subject's gate is argmax_tape+class_identity+error_budget (the default), or argmax_tape+error_budget with a gate_why",
                    ))
                }
            };
            let budget = ErrorBudget {
                max_rel_error: b.max_rel_error,
                near_tie_margin: b.near_tie_margin,
                per_seam,
                why: b.why.clone(),
            };
            Ok(SubjectClass::Numeric { budget, class_identity })
        }
        (other, _) => Err(bad(path, "class", other, "a subject is BIT-IDENTICAL or NUMERIC-CLASS")),
    }
}

/// The subject's registry: the built-in doors it lists (with the links among them; a requirement
/// outside the list is refused), its own `[[door]]` entries, and the tool's settings.
fn subject_registry(path: &Path, raw: &RawManifest) -> Result<(Registry, bool), GateError> {
    let builtin: toml::Table = toml::from_str(BUILTIN_REGISTRY).expect("the built-in registry is TOML");
    let builtin_doors: Vec<toml::Table> = table_array(&builtin, "door");
    let env_of = |t: &toml::Table| t.get("env").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let id_of = |t: &toml::Table| t.get("id").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let own_envs: Vec<String> = raw.door.iter().map(env_of).collect();
    let mut listed = BTreeSet::new();
    for env in &raw.doors {
        if !listed.insert(env.as_str()) {
            return Err(bad(path, "doors", env, "a door is listed once"));
        }
        let builtin_hit = builtin_doors.iter().any(|d| env_of(d) == *env);
        match (builtin_hit, own_envs.contains(env)) {
            (true, true) => {
                return Err(bad(
                    path,
                    "doors",
                    env,
                    "is a door of the built-in registry; a [[door]] entry cannot redefine it",
                ))
            }
            (false, false) => {
                return Err(bad(
                    path,
                    "doors",
                    env,
                    "is neither a door of gates/doors.toml nor a [[door]] entry of this manifest",
                ))
            }
            _ => {}
        }
    }
    if let Some(stray) = own_envs.iter().find(|e| !listed.contains(e.as_str())) {
        return Err(bad(path, "door", stray, "a [[door]] entry the subject does not list in `doors`"));
    }
    let taken: Vec<toml::Table> = builtin_doors.into_iter().filter(|d| listed.contains(env_of(d).as_str())).collect();
    let taken_ids: BTreeSet<String> = taken.iter().map(id_of).collect();
    let mut doors = Vec::new();
    for mut d in taken.clone() {
        for link in table_array(&d, "requires") {
            let id = link.get("id").and_then(|v| v.as_str()).unwrap_or_default();
            if !taken_ids.contains(id) {
                return Err(bad(
                    path,
                    "doors",
                    env_of(&d),
                    format!("requires the built-in door {id}: list its variable in `doors` too"),
                ));
            }
        }
        let conflicts: Vec<toml::Value> = table_array(&d, "conflicts")
            .into_iter()
            .filter(|l| l.get("id").and_then(|v| v.as_str()).is_some_and(|id| taken_ids.contains(id)))
            .map(toml::Value::Table)
            .collect();
        d.insert("conflicts".into(), toml::Value::Array(conflicts));
        doors.push(toml::Value::Table(d));
    }
    // A subject's own door is witnessed by its engagement counter in the subject's census: it
    // appears against the same configuration with the door off (unless the entry says more).
    doors.extend(raw.door.iter().cloned().map(|mut d| {
        if !d.contains_key("census") {
            let counter = d.get("engagement").cloned().unwrap_or(toml::Value::String(String::new()));
            let mut change = toml::Table::new();
            change.insert("counter".into(), counter);
            change.insert("change".into(), toml::Value::String("appears".into()));
            d.insert("census".into(), toml::Value::Array(vec![toml::Value::Table(change)]));
        }
        toml::Value::Table(d)
    }));
    let mut file = toml::Table::new();
    file.insert("schema_version".into(), toml::Value::Integer(crate::registry::SCHEMA_VERSION));
    file.insert("door".into(), toml::Value::Array(doors));
    file.insert("setting".into(), builtin.get("setting").cloned().unwrap_or(toml::Value::Array(vec![])));
    let text =
        toml::to_string(&file).map_err(|e| GateError::usage(format!("subject manifest {}: {e}", path.display())))?;
    let registry = Registry::for_subject(&text, &format!("subject manifest {}", path.display()))?;
    Ok((registry, raw.door.is_empty()))
}

fn table_array(t: &toml::Table, key: &str) -> Vec<toml::Table> {
    t.get(key)
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_table().cloned()).collect())
        .unwrap_or_default()
}
