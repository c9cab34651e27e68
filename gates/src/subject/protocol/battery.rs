//! The battery file of the subject protocol (JSON, format `memra-battery` version 1, or 2 for a
//! subject of protocol 2; the format and its decoding rules are documented in [`super`]): what one
//! start of a subject decodes — the prompts, the tokens generated per prompt, the teacher-forced
//! tokens of a NUMERIC run, the seams to capture in full, and (version 2) the pass shape: rows or
//! columns per pass (docs/DESIGN.md §3.6). Written by `memra-gates` for every start; read strictly by the
//! built-in runtime's protocol subject (`memra-gates subject`).

use memra_runtime::record::{CaptureKey, Seam};
use memra_runtime::{Battery, PassShape};
use serde::{Deserialize, Serialize};

/// Value of the `format` field.
pub const FORMAT_NAME: &str = "memra-battery";
/// The versions this build writes and reads: 1 (single-token passes), 2 (with `pass`).
pub const FORMAT_VERSION: u64 = 1;
pub const FORMAT_VERSION_PASS: u64 = 2;

/// Version 2's pass shape: sessions per pass (rows) and consecutive tokens of one session per
/// pass (columns); at most one of them above 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PassRequest {
    pub batch: usize,
    pub columns: usize,
}

/// One requested capture, as the file spells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureRequest {
    pub prompt: usize,
    pub step: usize,
    pub layer: usize,
    pub seam: String,
}

/// The file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatteryFile {
    pub format: String,
    pub version: u64,
    pub prompts: Vec<Vec<u32>>,
    pub gen_tokens: usize,
    /// `forced_tokens[p][j]` is fed at step `n_p + j` instead of the run's own token; `null`
    /// when the run is not teacher-forced.
    pub forced_tokens: Option<Vec<Vec<u32>>>,
    pub capture: Vec<CaptureRequest>,
    /// Version 2 only (and required there): the pass shape of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass: Option<PassRequest>,
}

/// What a battery file asks for, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct BatteryRequest {
    pub battery: Battery,
    pub forced: Option<Vec<Vec<u32>>>,
    pub capture: Vec<CaptureKey>,
    /// Single-token for a version 1 file.
    pub pass: PassShape,
}

impl BatteryFile {
    /// The file for a run of `battery`, teacher-forced by `forced`, capturing `capture`; with
    /// `pass` (a subject of protocol 2) a version 2 file naming the pass shape, else version 1.
    pub fn new(
        battery: &Battery,
        forced: Option<&[Vec<u32>]>,
        capture: &[CaptureKey],
        pass: Option<PassShape>,
    ) -> BatteryFile {
        BatteryFile {
            format: FORMAT_NAME.to_string(),
            version: if pass.is_some() { FORMAT_VERSION_PASS } else { FORMAT_VERSION },
            pass: pass.map(|p| PassRequest { batch: p.batch, columns: p.columns }),
            prompts: battery.prompts.clone(),
            gen_tokens: battery.gen_tokens,
            forced_tokens: forced.map(<[Vec<u32>]>::to_vec),
            capture: capture
                .iter()
                .map(|k| CaptureRequest { prompt: k.prompt, step: k.step, layer: k.layer, seam: k.seam.name().into() })
                .collect(),
        }
    }

    /// The JSON text (one line).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a battery file serializes")
    }

    /// Read a battery file strictly: the version first, then unknown or missing fields, empty
    /// prompts, no generated token, forced tapes of the wrong shape, captures of unknown seams or
    /// outside the battery. `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<BatteryRequest, String> {
        let err = |rule: String| format!("battery file {origin}: {rule}");
        let loose: serde_json::Value = serde_json::from_str(text).map_err(|e| err(format!("not JSON: {e}")))?;
        match (loose.get("format").and_then(|f| f.as_str()), loose.get("version").and_then(|v| v.as_u64())) {
            (Some(FORMAT_NAME), Some(FORMAT_VERSION | FORMAT_VERSION_PASS)) => {}
            (f, v) => {
                return Err(err(format!(
                    "format {f:?} version {v:?}: this build reads format {FORMAT_NAME:?} versions {FORMAT_VERSION} and {FORMAT_VERSION_PASS}"
                )))
            }
        }
        let file: BatteryFile = serde_json::from_value(loose).map_err(|e| err(e.to_string()))?;
        let pass = match (file.version, file.pass) {
            (FORMAT_VERSION, None) => PassShape::SINGLE,
            (FORMAT_VERSION_PASS, Some(p)) => PassShape::new(p.batch, p.columns)
                .map_err(|e| err(format!("pass {{batch: {}, columns: {}}}: {e}", p.batch, p.columns)))?,
            (v, p) => {
                return Err(err(format!(
                    "version {v} with pass {p:?}: version {FORMAT_VERSION_PASS} names the pass shape (`pass`), version {FORMAT_VERSION} has none"
                )))
            }
        };
        if file.prompts.is_empty() || file.prompts.iter().any(Vec::is_empty) {
            return Err(err("every battery has at least one prompt, and every prompt at least one token".into()));
        }
        if file.gen_tokens == 0 {
            return Err(err("gen_tokens is 0: nothing would be generated".into()));
        }
        let battery = Battery { prompts: file.prompts, gen_tokens: file.gen_tokens };
        if let Some(f) = &file.forced_tokens {
            if f.len() != battery.prompts.len() || f.iter().any(|t| t.len() != battery.gen_tokens) {
                return Err(err(format!(
                    "forced_tokens must hold {} tokens for each of the {} prompts",
                    battery.gen_tokens,
                    battery.prompts.len()
                )));
            }
        }
        let mut capture = Vec::with_capacity(file.capture.len());
        for c in &file.capture {
            let seam = Seam::parse(&c.seam).ok_or_else(|| err(format!("capture of unknown seam {:?}", c.seam)))?;
            if c.prompt >= battery.prompts.len() || c.step >= battery.steps_of(c.prompt) {
                return Err(err(format!("capture of prompt {} step {} lies outside the battery", c.prompt, c.step)));
            }
            capture.push(CaptureKey { prompt: c.prompt, step: c.step, layer: c.layer, seam });
        }
        Ok(BatteryRequest { battery, forced: file.forced_tokens, capture, pass })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_battery_file_reads_back_and_strays_are_refused() {
        let battery = Battery { prompts: vec![vec![1, 2, 3], vec![4]], gen_tokens: 2 };
        let key = CaptureKey { prompt: 1, step: 1, layer: 0, seam: Seam::OJoin };
        let forced = vec![vec![7, 8], vec![9, 10]];
        let text = BatteryFile::new(&battery, Some(&forced), &[key], None).to_json();
        let back = BatteryFile::parse(&text, "t").unwrap();
        let want = BatteryRequest {
            battery: battery.clone(),
            forced: Some(forced.clone()),
            capture: vec![key],
            pass: PassShape::SINGLE,
        };
        assert_eq!(back, want);
        let b4 = PassShape::new(4, 1).unwrap();
        let v2 = BatteryFile::new(&battery, Some(&forced), &[key], Some(b4)).to_json();
        assert!(v2.contains("\"version\":2") && v2.contains("\"pass\":{\"batch\":4,\"columns\":1}"), "{v2}");
        assert_eq!(BatteryFile::parse(&v2, "t").unwrap(), BatteryRequest { pass: b4, ..want });
        for (bad, why) in [
            (text.replace("\"version\":1", "\"version\":3"), "version"),
            (text.replace("\"version\":1", "\"version\":2"), "version 2 names the pass shape"),
            (v2.replace("\"version\":2", "\"version\":1"), "version 1 has none"),
            (v2.replace("\"columns\":1}", "\"columns\":2}"), "not both"),
            (v2.replace("\"batch\":4", "\"batch\":3"), "1, 2, 4 or 8"),
            (text.replace("\"gen_tokens\":2", "\"gen_tokens\":2,\"extra\":1"), "unknown field"),
            (text.replace("[[7,8],[9,10]]", "[[7,8]]"), "forced_tokens"),
            (text.replace("\"o_join\"", "\"o_jion\""), "unknown seam"),
            (text.replace("\"step\":1", "\"step\":2"), "outside"),
            (text.replace("[4]", "[]"), "at least one token"),
        ] {
            let e = BatteryFile::parse(&bad, "t").unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
    }
}
