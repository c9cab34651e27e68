//! The door registry's file format: its one definition, its reader, and its one writer (the
//! defaults block that `memra-gates promote` updates in place). The rules a parsed file must
//! satisfy are in the registry's `validate` module.
//!
//! # Format, `schema_version = 2`
//!
//! A TOML file with `schema_version = 2` at the top, one `[[door]]` table per door and one
//! `[[setting]]` table per tool setting that shares the `MEMRA_` prefix. Unknown fields and any
//! other schema version are rejected.
//!
//! ```toml
//! schema_version = 2
//!
//! [[door]]
//! id = "oproj_tail"                 # lower snake case; the runtime DoorSet field of the same name
//! env = "MEMRA_OPROJ_TAIL"          # the environment variable (MEMRA_ + upper snake case)
//! class = "BIT-IDENTICAL"           # BIT-IDENTICAL | VALUE-IDENTICAL | SCHEDULING-ONLY | NUMERIC-CLASS | CANARY
//! default = false                   # the value when nothing sets it (promotion flips it)
//! changes = "the o_join fold is deferred into the ffn_norm kernel (same operands, same order)"
//! gate = "identity"                 # identity | argmax_tape+class_identity+error_budget | argmax_tape+error_budget
//! engagement = "oproj_tail.fused_joins"   # the program's call-site counter `<id>.<what>` (detail only)
//! census = [ { counter = "launch.fold_add_rmsnorm", change = "appears" },
//!            { counter = "launch.add_rmsnorm", change = "fewer" } ]
//! seams = ["o_join", "ffn_norm"]    # seams the mechanism touches (docs/DESIGN.md §3.2 names)
//! tp = { allowed = [2, 4, 8], why = "inherits oproj_direct's TP sizes" }
//! transports = { allowed = ["native-p2p"], why = "the deferred partials are peer stores" }
//! # optional, default every shape: the pass shapes (docs/DESIGN.md §3.6) where the mechanism has
//! # work — single (one token of one session), b2 b4 b8 (rows), t2 t4 t8 (columns)
//! # passes = { allowed = ["t2", "t4", "t8"], why = "one T-column join needs several columns" }
//! backends = ["host", "cuda"]       # where the mechanism exists
//! not_applicable = {}               # { backend = "reason" } for every backend not in `backends`
//! requires = [ { id = "oproj_direct", why = "the o_join add is deferred only when peers store partials directly" } ]
//! conflicts = []                    # [ { id = "...", why = "..." } ], declared once, holds both ways
//! # NUMERIC-CLASS only:
//! # error_budget = { max_rel_error = 1e-3, near_tie_margin = 1e-2, per_seam = { qkv = 5e-2 }, why = "..." }
//! # gate_why = "..."                # required when a NUMERIC-CLASS door cannot have class identity
//! # A door whose purpose is not speed (docs/DESIGN.md §7): the saving promotion asks to repeat
//! # instead of a faster step; `counter` is a census counter or pattern, as in `census`.
//! # benefit = { saves = "launches", counter = "launch.*", why = "..." }   # saves: launches | device-bytes
//!
//! [[setting]]
//! env = "MEMRA_REQUIRE_GPU"
//! format = "bool01"                 # bool01 | layer:seam:step | process (P/N) | path | seconds | count | backend | tp | transport
//! default = "0"
//! meaning = "1 turns GPU-test skips into failures"
//! ```
//!
//! # Rules a registry must satisfy (each violation is an error naming the door, value and rule)
//! - ids are unique lower snake case; `env` names are unique across doors and settings, and are
//!   `MEMRA_` + upper snake case.
//! - `tp` values lie in {1, 2, 4, 8}; `transports` are `host-bounce`, `native-p2p`, `nccl`;
//!   `backends` are `host`, `cuda`. Lists are non-empty and free of repeats. Leaving out any TP
//!   size or transport needs a non-empty `why`.
//! - `passes` values lie in {single, b2, b4, b8, t2, t4, t8}; leaving one out needs a `why`.
//! - every backend is in exactly one of `backends` and `not_applicable` (with a reason).
//! - `requires` and `conflicts` name known doors other than the door itself, each with a `why`;
//!   `requires` has no cycle; a door's TP sizes, transports, pass shapes and backends lie inside those of
//!   every door it requires; no door requires (directly or through others) a door it conflicts
//!   with. So every door has at least one legal configuration of its own.
//! - the class decides the gate: identity classes and CANARY take `identity`; NUMERIC-CLASS takes
//!   `argmax_tape+class_identity+error_budget`, or `argmax_tape+error_budget` with a `gate_why`.
//!   A gate with class identity needs TP1 and host-bounce allowed (its class baseline is the
//!   door's own TP1 host-bounce run, docs/DESIGN.md §4.2).
//! - `error_budget` is present exactly on NUMERIC-CLASS doors; its numbers are finite and > 0.
//!   `max_rel_error` bounds `max_i |got_i − oracle_i| / max_i |oracle_i|` over one seam tensor
//!   (`per_seam` overrides it for named seams); `near_tie_margin` is in logit units: a step
//!   whose oracle top-1 minus top-2 logit is at or below it is a near-tie.
//! - CANARY doors are default-off; `engagement` starts with `<id>.` and is unique.
//! - a setting's `default` parses under its `format`.
//! - `benefit`, when present, names a well-formed census counter and says why.
//!
//! # The census expression (`census`, [`super::census`])
//! `census` lists what the door must change in the backend's census (what it really issued,
//! `memra_runtime::evidence::census`) against the same configuration with the door off (and the
//! doors of the set that require it); the engagement gate runs that configuration and checks
//! every entry, and the run is VOID when one does not hold. Each entry is
//! `{ counter = C, change = X }`:
//! - `C` is a census counter, `<family>.<detail>` (`launch.fold_reverse`, `copy.native-p2p.4096`,
//!   `doorbell`), or a prefix ending in the segment `*` that sums every counter under it
//!   (`peer_store.*`, `copy.native-p2p.*`); the families are `launch`, `peer_store`, `copy`,
//!   `copy_after`, `unfenced_copy`, `packed_copy`, `all_reduce`, `graph_replay`, `doorbell`,
//!   `merged_launch` and `defect`; or a sum of such terms, `C1 + C2`, when one mechanism issues
//!   different kernels in different door combinations (`launch.select_slots +
//!   peer_store.fold_slots`: expert-parallel owners select on the root, or store each slot
//!   straight into it under MOE_DIRECT);
//! - `X` is `more` (on > off), `fewer` (on < off), `appears` (off = 0 < on) or `vanishes`
//!   (off > 0 = on).
//!
//! Rules: at least one entry per door; each entry once; the counter well formed (segments not
//! empty, a known family, `*` only as the whole last segment; in a sum, each term once).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::{DoorClass, DoorGate, Registry, RegistryError, SettingFormat};

/// The registry format version this build reads and writes (2: every door declares its census
/// change).
pub const SCHEMA_VERSION: i64 = 2;

/// The built-in registry (`gates/doors.toml`), embedded at build time.
pub const BUILTIN_REGISTRY: &str = include_str!("../../doors.toml");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) schema_version: i64,
    #[serde(default)]
    pub(super) door: Vec<RawDoor>,
    #[serde(default)]
    pub(super) setting: Vec<RawSetting>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDoor {
    pub(super) id: String,
    pub(super) env: String,
    pub(super) class: DoorClass,
    pub(super) default: bool,
    pub(super) changes: String,
    pub(super) gate: DoorGate,
    #[serde(default)]
    pub(super) gate_why: Option<String>,
    pub(super) engagement: String,
    pub(super) census: Vec<RawCensus>,
    pub(super) seams: Vec<String>,
    pub(super) tp: RawAllowed<usize>,
    pub(super) transports: RawAllowed<String>,
    pub(super) backends: Vec<String>,
    #[serde(default)]
    pub(super) not_applicable: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) requires: Vec<RawLink>,
    #[serde(default)]
    pub(super) conflicts: Vec<RawLink>,
    #[serde(default)]
    pub(super) error_budget: Option<RawBudget>,
    #[serde(default)]
    pub(super) benefit: Option<RawBenefit>,
    #[serde(default)]
    pub(super) passes: Option<RawAllowed<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBenefit {
    pub(super) saves: super::census::Saves,
    pub(super) counter: String,
    pub(super) why: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAllowed<T> {
    pub(super) allowed: Vec<T>,
    #[serde(default)]
    pub(super) why: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCensus {
    pub(super) counter: String,
    pub(super) change: super::census::Change,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLink {
    pub(super) id: String,
    pub(super) why: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudget {
    pub(super) max_rel_error: f64,
    pub(super) near_tie_margin: f64,
    #[serde(default)]
    pub(super) per_seam: BTreeMap<String, f64>,
    pub(super) why: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSetting {
    pub(super) env: String,
    pub(super) format: SettingFormat,
    pub(super) default: String,
    pub(super) meaning: String,
}

impl Registry {
    /// The built-in registry, `gates/doors.toml`.
    pub fn builtin() -> Result<Registry, RegistryError> {
        Registry::from_toml_str(BUILTIN_REGISTRY, "built-in gates/doors.toml")
    }

    /// A registry from a user file (same format).
    pub fn from_path(path: &Path) -> Result<Registry, RegistryError> {
        let text = crate::paths::read_text(path)
            .map_err(|source| RegistryError::Io { path: path.display().to_string(), source })?;
        Registry::from_toml_str(&text, &path.display().to_string())
    }

    /// Parse and validate registry text; `origin` names it in error messages.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Registry, RegistryError> {
        Registry::parse(text, origin, false)
    }

    /// The registry of an external subject (`crate::subject::protocol::manifest`): the same
    /// format and rules, except that it may declare no door at all.
    pub fn for_subject(text: &str, origin: &str) -> Result<Registry, RegistryError> {
        Registry::parse(text, origin, true)
    }

    fn parse(text: &str, origin: &str, allow_no_door: bool) -> Result<Registry, RegistryError> {
        let parse_err = |message: String| RegistryError::Parse {
            origin: origin.to_string(),
            what: format!("door registry (schema_version {SCHEMA_VERSION})"),
            message,
        };
        // The version decides how to read the rest, so check it before any other field.
        let loose: toml::Table = toml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        match loose.get("schema_version") {
            Some(toml::Value::Integer(SCHEMA_VERSION)) => {}
            Some(other) => {
                return Err(RegistryError::SchemaVersion {
                    origin: origin.to_string(),
                    found: crate::text::version_text(&other.to_string(), other.is_str()),
                    supported: SCHEMA_VERSION,
                })
            }
            None => {
                return Err(RegistryError::SchemaVersion {
                    origin: origin.to_string(),
                    found: "(missing)".to_string(),
                    supported: SCHEMA_VERSION,
                })
            }
        }
        let raw: RawFile = toml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        debug_assert_eq!(raw.schema_version, SCHEMA_VERSION);
        super::validate::validate(raw, origin, allow_no_door)
    }
}

// ---- the one writer: door defaults --------------------------------------------------------------

/// One line of a defaults block: a door's environment name, its new default and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultEntry {
    pub env: String,
    pub on: bool,
    pub why: String,
}

/// A `[defaults]` TOML snippet keyed by environment variable, one line per door with the reason
/// as a comment, after `header` (comment lines). The registry keeps each default inside its
/// `[[door]]` entry (and rejects unknown tables), so this snippet is for reading; the form to
/// commit is [`set_defaults_on`]'s rewritten file.
pub fn defaults_block(header: &[String], entries: &[DefaultEntry]) -> String {
    let mut s = String::new();
    for h in header {
        s.push_str("# ");
        s.push_str(h);
        s.push('\n');
    }
    s.push_str("[defaults]\n");
    for e in entries {
        s.push_str(&format!("{} = {}  # {}\n", e.env, e.on, e.why.replace('\n', " ")));
    }
    s
}

/// `text` (a registry file) with `default = false` replaced by `default = true` in the
/// `[[door]]` entry of every door in `ids`; every other byte is kept. The result is parsed back
/// and must give exactly those doors default-on.
pub fn set_defaults_on(
    text: &str,
    origin: &str,
    ids: &std::collections::BTreeSet<&str>,
) -> Result<String, RegistryError> {
    let fail = |rule: String| RegistryError::Rewrite { origin: origin.to_string(), rule };
    let mut out = String::with_capacity(text.len());
    let mut block: Vec<&str> = Vec::new();
    let mut changed = std::collections::BTreeSet::new();
    let mut flush = |block: &mut Vec<&str>, out: &mut String| -> Result<(), RegistryError> {
        let id = block.iter().find_map(|l| toml_string_value(l, "id"));
        let flip = id.is_some_and(|id| ids.contains(id));
        let mut done = false;
        for line in block.drain(..) {
            if flip && !done && toml_key(line) == Some("default") {
                let indent = &line[..line.len() - line.trim_start().len()];
                let rest = line.trim_start()["default".len()..].trim_start();
                let rest = rest.strip_prefix('=').map(str::trim_start).unwrap_or("");
                let Some(tail) = rest.strip_prefix("false") else {
                    return Err(fail(format!(
                        "door {:?}: its default line {line:?} is not `default = false`",
                        id.unwrap_or_default()
                    )));
                };
                out.push_str(indent);
                out.push_str("default = true");
                out.push_str(tail);
                changed.insert(id.unwrap_or_default().to_string());
                done = true;
            } else {
                out.push_str(line);
            }
        }
        Ok(())
    };
    for line in text.split_inclusive('\n') {
        if is_table_header(line) {
            flush(&mut block, &mut out)?;
        }
        block.push(line);
    }
    flush(&mut block, &mut out)?;
    let missing: Vec<&str> = ids.iter().copied().filter(|id| !changed.contains(*id)).collect();
    if !missing.is_empty() {
        return Err(fail(format!("no [[door]] entry with `default = false` for door(s) {}", missing.join(", "))));
    }
    let updated = Registry::from_toml_str(&out, origin)
        .map_err(|e| fail(format!("the updated registry does not read back: {e}")))?;
    for id in ids {
        if !updated.door(id).is_some_and(|d| d.default) {
            return Err(fail(format!("door {id:?} is not default-on after the update")));
        }
    }
    Ok(out)
}

/// Whether a line opens a TOML table (`[[door]]`, `[x]`), not an array element.
fn is_table_header(line: &str) -> bool {
    let t = line.split('#').next().unwrap_or("").trim();
    t.starts_with('[') && t.ends_with(']') && !t.contains(',') && !t.contains('"') && !t.contains('=')
}

/// The key of a `key = value` TOML line, if it is one.
fn toml_key(line: &str) -> Option<&str> {
    let (k, _) = line.split_once('=')?;
    let k = k.trim();
    (!k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')).then_some(k)
}

/// The value of a `key = "value"` line.
fn toml_string_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    if toml_key(line)? != key {
        return None;
    }
    let v = line.split_once('=')?.1.trim();
    let v = v.strip_prefix('"')?;
    v.split_once('"').map(|(v, _)| v)
}
