//! The tool's own `MEMRA_*` settings (`[[setting]]` entries of the registry): how each one's
//! value is written and parsed. They share the door prefix, so strict parsing of the environment
//! must know them too (docs/DESIGN.md §4.1).

use memra_runtime::record::Seam;
use serde::Deserialize;

use super::RegistryError;

/// How a setting's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SettingFormat {
    /// Unset, "" or "0" → off, "1" → on (the door rule).
    #[serde(rename = "bool01")]
    Bool01,
    /// `LAYER:SEAM:STEP`, e.g. `0:o_join:3`.
    #[serde(rename = "layer:seam:step")]
    LayerSeamStep,
    /// `P/N`: process P of N of one distributed run (empty: a single process).
    #[serde(rename = "process")]
    Process,
    /// A filesystem path (empty: none).
    #[serde(rename = "path")]
    Path,
    /// A whole number of seconds, at least 1.
    #[serde(rename = "seconds")]
    Seconds,
    /// A whole number of things (e.g. devices), 0 or more (empty: the default).
    #[serde(rename = "count")]
    Count,
    /// A backend name: `host` or `cuda` (empty: none).
    #[serde(rename = "backend")]
    Backend,
    /// A TP size of the canonical grid: 1, 2, 4 or 8 (empty: none).
    #[serde(rename = "tp")]
    Tp,
    /// A transport name: `host-bounce`, `native-p2p` or `nccl` (empty: none).
    #[serde(rename = "transport")]
    Transport,
}

/// Where the flip-bit canary plants its defect: a layer, seam and step, and the flat element
/// index of the seam's tensor (0 unless given; selftest seeds one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlipAt {
    pub layer: usize,
    pub seam: Seam,
    pub step: usize,
    pub element: Option<usize>,
}

/// A parsed setting value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingValue {
    Bool(bool),
    FlipAt(FlipAt),
    Process(memra_runtime::backend::dist::ProcessSpec),
    Path(std::path::PathBuf),
    Seconds(u64),
    Count(u64),
    Backend(memra_runtime::backend::BackendKind),
    Tp(usize),
    Transport(memra_runtime::Transport),
}

const BOOL01_RULE: &str = "use 1 (on), 0 or empty (off)";

impl SettingFormat {
    pub fn name(self) -> &'static str {
        match self {
            SettingFormat::Bool01 => "bool01",
            SettingFormat::LayerSeamStep => "layer:seam:step",
            SettingFormat::Process => "process",
            SettingFormat::Path => "path",
            SettingFormat::Seconds => "seconds",
            SettingFormat::Count => "count",
            SettingFormat::Backend => "backend",
            SettingFormat::Tp => "tp",
            SettingFormat::Transport => "transport",
        }
    }

    /// Parse `value` of the setting `name`. `Ok(None)` means "empty: use the default".
    pub fn parse(self, name: &str, value: &str) -> Result<Option<SettingValue>, RegistryError> {
        let bad = |rule: String| RegistryError::SettingValue { name: name.to_string(), value: value.to_string(), rule };
        match self {
            SettingFormat::Bool01 => match value {
                "" | "0" => Ok(Some(SettingValue::Bool(false))),
                "1" => Ok(Some(SettingValue::Bool(true))),
                _ => Err(bad(BOOL01_RULE.to_string())),
            },
            SettingFormat::LayerSeamStep => {
                if value.is_empty() {
                    return Ok(None);
                }
                let parts: Vec<&str> = value.split(':').collect();
                let (layer, seam, step, element) = match parts[..] {
                    [layer, seam, step] => (layer, seam, step, None),
                    [layer, seam, step, element] => (layer, seam, step, Some(element)),
                    _ => {
                        return Err(bad("use LAYER:SEAM:STEP[:ELEMENT], e.g. 0:o_join:3 or 0:o_join:3:17".to_string()))
                    }
                };
                let number = |what: &str, s: &str| {
                    s.parse::<usize>()
                        .map_err(|_| bad(format!("{what} {s:?} is not a non-negative integer (LAYER:SEAM:STEP)")))
                };
                let layer = number("LAYER", layer)?;
                let step = number("STEP", step)?;
                let seam = Seam::parse(seam).ok_or_else(|| {
                    let names: Vec<&str> = Seam::LAYER.iter().chain(Seam::HEAD.iter()).map(|s| s.name()).collect();
                    bad(format!("SEAM {seam:?} is unknown; the seams are {}", names.join(", ")))
                })?;
                let element = element.map(|e| number("ELEMENT", e)).transpose()?;
                Ok(Some(SettingValue::FlipAt(FlipAt { layer, seam, step, element })))
            }
            _ if value.is_empty() => Ok(None),
            SettingFormat::Process => memra_runtime::backend::dist::ProcessSpec::parse(value)
                .map(|p| Some(SettingValue::Process(p)))
                .map_err(&bad),
            SettingFormat::Path => Ok(Some(SettingValue::Path(value.into()))),
            SettingFormat::Seconds => match value.parse::<u64>() {
                Ok(n) if n >= 1 && value.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(SettingValue::Seconds(n))),
                _ => Err(bad("use a whole number of seconds, at least 1".to_string())),
            },
            SettingFormat::Count => match value.parse::<u64>() {
                Ok(n) if value.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(SettingValue::Count(n))),
                _ => Err(bad("use a whole number (0 or more)".to_string())),
            },
            SettingFormat::Backend => match value {
                "host" => Ok(Some(SettingValue::Backend(memra_runtime::backend::BackendKind::Host))),
                "cuda" => Ok(Some(SettingValue::Backend(memra_runtime::backend::BackendKind::Cuda))),
                _ => Err(bad("use host or cuda".to_string())),
            },
            SettingFormat::Tp => match value.parse::<usize>() {
                Ok(n) if memra_kernels::grid::is_tp_size(n) && value.bytes().all(|b| b.is_ascii_digit()) => {
                    Ok(Some(SettingValue::Tp(n)))
                }
                _ => Err(bad("use a TP size of the canonical grid: 1, 2, 4 or 8".to_string())),
            },
            SettingFormat::Transport => memra_runtime::Transport::parse(value)
                .map(|t| Some(SettingValue::Transport(t)))
                .map_err(|_| bad("use host-bounce, native-p2p or nccl".to_string())),
        }
    }
}

/// One of the tool's own `MEMRA_*` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    pub env: String,
    pub format: SettingFormat,
    /// The value when unset, in `format`.
    pub default: String,
    pub meaning: String,
    /// `default`, parsed.
    pub default_value: Option<SettingValue>,
}

/// Env name of the setting that turns GPU skips into failures.
pub const REQUIRE_GPU: &str = "MEMRA_REQUIRE_GPU";
/// Env name of the setting that times the host side of runs (runtime/src/host_clock.rs).
pub const HOST_CLOCK: &str = "MEMRA_HOST_CLOCK";
/// Env names of the settings of a run over several processes (`--process`, `--nccl-id-dir`,
/// `--dist-timeout-s`).
pub const PROCESS: &str = "MEMRA_PROCESS";
pub const NCCL_ID_DIR: &str = "MEMRA_NCCL_ID_DIR";
pub const DIST_TIMEOUT_S: &str = "MEMRA_DIST_TIMEOUT_S";
/// Env name of the setting that places the flip-bit canary.
pub const CANARY_FLIP_AT: &str = "MEMRA_CANARY_FLIP_AT";
/// Env names of the subject protocol (docs/subject-protocol.md): what `memra-gates` tells a
/// subject process about the run it must perform.
pub const SUBJECT_PROTOCOL: &str = "MEMRA_SUBJECT_PROTOCOL";
pub const SUBJECT_BACKEND: &str = "MEMRA_SUBJECT_BACKEND";
pub const SUBJECT_TP: &str = "MEMRA_SUBJECT_TP";
pub const SUBJECT_TRANSPORT: &str = "MEMRA_SUBJECT_TRANSPORT";
pub const SUBJECT_MODEL: &str = "MEMRA_SUBJECT_MODEL";
pub const SUBJECT_BATTERY: &str = "MEMRA_SUBJECT_BATTERY";
pub const SUBJECT_TAPE: &str = "MEMRA_SUBJECT_TAPE";
