//! The outside witness of a CUDA subject (docs/subject-protocol.md, "Who counts the census"):
//! memra-gates loads `memra-witness`'s CUPTI injection library into every CUDA start of an
//! external subject (`CUDA_INJECTION64_PATH`), reads what it counted when the start ends, and adds
//! it to the run's census as `outside.*` counters (`memra_witness::format`). The engagement gate
//! then holds each enabled door to a change in those counters against the same configuration with
//! the door off (`crate::gate::engagement`): a door whose only evidence is a counter the subject
//! wrote about itself is VOID.

use crate::error::GateError;
use memra_runtime::evidence::census::Census;
use memra_runtime::record::Record;
use memra_witness::format::{self, WitnessRecord};
use memra_witness::locate;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `run --witness`: whether to arm the witness for CUDA starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WitnessMode {
    /// Arm it when the library and CUPTI are found; otherwise the census stays self-reported.
    Auto,
    /// Refuse the plan when they are not found.
    Require,
    /// Never arm it.
    Off,
}

impl WitnessMode {
    pub fn parse(s: &str) -> Result<WitnessMode, GateError> {
        match s {
            "auto" => Ok(WitnessMode::Auto),
            "require" => Ok(WitnessMode::Require),
            "off" => Ok(WitnessMode::Off),
            _ => Err(GateError::usage(format!("--witness {s:?}: expected auto, require or off"))),
        }
    }
}

/// The two libraries a CUDA start is armed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutsideWitness {
    /// `libmemra_witness.so`, the injection library.
    pub library: PathBuf,
    /// The CUPTI library it loads (`None`: looked up by name in the subject's process).
    pub cupti: Option<PathBuf>,
}

impl OutsideWitness {
    /// The witness for `mode` on this machine: the library beside `exe`, CUPTI from the CUDA
    /// toolkit (`var` reads the environment). `Ok(None)` when off, or when auto finds no library
    /// or no CUPTI; `require` without them is an error that says what is missing.
    pub fn find(
        mode: WitnessMode,
        exe: &Path,
        var: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Option<OutsideWitness>, GateError> {
        if mode == WitnessMode::Off {
            return Ok(None);
        }
        let library = locate::library_beside(exe);
        // A library built from other sources reads other variables or writes another record: every
        // door would look unwitnessed. Refused, whatever the mode asked.
        if let Some(lib) = &library {
            let same = locate::built_from_these_sources(lib)
                .map_err(|e| GateError::usage(format!("--witness: cannot read {}: {e}", lib.display())))?;
            if !same {
                return Err(GateError::usage(format!(
                    "--witness {}: the injection library {} was built from other sources than this memra-gates \
                     (rebuild both with `cargo build --release`, or run with --witness off)",
                    if mode == WitnessMode::Require { "require" } else { "auto" },
                    lib.display()
                )));
            }
        }
        let cupti = locate::cupti(var);
        match (library, cupti) {
            (Some(library), Some(cupti)) => Ok(Some(OutsideWitness { library, cupti: Some(cupti) })),
            (library, cupti) if mode == WitnessMode::Require => {
                let mut missing = Vec::new();
                if library.is_none() {
                    missing.push(format!(
                        "the injection library {} beside {} (built by `cargo build -p memra-witness`)",
                        locate::LIBRARY,
                        exe.display()
                    ));
                }
                if cupti.is_none() {
                    missing
                        .push("a CUPTI library (libcupti.so*) under $CUDA_HOME, $CUDA_PATH or /usr/local/cuda*".into());
                }
                Err(GateError::usage(format!("--witness require: not found: {}", missing.join("; "))))
            }
            _ => Ok(None),
        }
    }

    /// Arm one start: the driver loads the library, which writes its records into `dir`.
    pub fn arm(&self, cmd: &mut Command, dir: &Path) {
        cmd.env(format::INJECTION_VAR, &self.library).env(format::DIR_VAR, dir);
        if let Some(c) = &self.cupti {
            cmd.env(format::CUPTI_VAR, c);
        }
    }
}

/// Add what the witness counted in `dir` (every process of one start) to `record`'s census.
/// A record with errors means the witness did not count: that is the error returned (the run
/// cannot be judged on a witness that was not there).
pub fn apply(record: &mut Record, dir: &Path) -> Result<(), String> {
    let records = format::read_dir(dir).map_err(|e| e.to_string())?;
    if let Some(r) = records.iter().find(|r| !r.errors.is_empty()) {
        return Err(failed(r));
    }
    let mut counts = record.census.counts().clone();
    counts.extend(format::counters(&records));
    // The subject's word and the witness's counters side by side (the witness's are `outside.*`,
    // a prefix no tape may use: `backend_evidence`).
    record.census = Census::reported(counts);
    Ok(())
}

fn failed(r: &WitnessRecord) -> String {
    format!(
        "the outside witness could not count in process {}: {} (run with --witness off to gate with the census \
         self-reported)",
        r.pid,
        r.errors.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn record_with(census: &[(&str, u64)]) -> Record {
        Record {
            census: Census::reported(census.iter().map(|(k, v)| (k.to_string(), *v)).collect()),
            ..Record::default()
        }
    }

    #[test]
    fn the_counts_of_every_process_join_the_subjects_census() {
        let d = tempfile::tempdir().unwrap();
        for (pid, n) in [(11, 2u64), (12, 5)] {
            let mut w = WitnessRecord::new(pid);
            w.launches.insert("gemv".into(), n);
            std::fs::write(d.path().join(format::file_name(pid)), w.to_json()).unwrap();
        }
        let mut r = record_with(&[("torch.matmuls", 9)]);
        apply(&mut r, d.path()).unwrap();
        let want: BTreeMap<String, u64> = [
            ("torch.matmuls".to_string(), 9),
            ("outside.launch.gemv".to_string(), 7),
            ("outside.processes".to_string(), 2),
        ]
        .into();
        assert_eq!(r.census.counts(), &want);
    }

    #[test]
    fn a_witness_that_could_not_count_is_an_error_naming_why() {
        let d = tempfile::tempdir().unwrap();
        let mut w = WitnessRecord::new(5);
        w.errors.push("no CUPTI library found by name".into());
        std::fs::write(d.path().join(format::file_name(5)), w.to_json()).unwrap();
        let e = apply(&mut record_with(&[]), d.path()).unwrap_err();
        assert!(e.contains("process 5: no CUPTI library found by name") && e.contains("--witness off"), "{e}");
    }

    #[test]
    fn require_names_what_is_missing_and_auto_falls_back() {
        let t = tempfile::tempdir().unwrap();
        let exe = t.path().join("memra-gates");
        let none = |_: &str| None;
        let e = OutsideWitness::find(WitnessMode::Require, &exe, &none).unwrap_err().to_string();
        assert!(e.contains("libmemra_witness.so"), "{e}");
        assert_eq!(OutsideWitness::find(WitnessMode::Off, &exe, &none).unwrap(), None);
        // A library of other sources is refused by name; this build's is taken.
        std::fs::write(t.path().join(locate::LIBRARY), b"an old build").unwrap();
        let e = OutsideWitness::find(WitnessMode::Auto, &exe, &none).unwrap_err().to_string();
        assert!(e.contains("built from other sources") && e.contains("--witness off"), "{e}");
        std::fs::write(t.path().join(locate::LIBRARY), locate::BUILD_MARKER).unwrap();
        let cuda = t.path().join("cuda");
        std::fs::create_dir_all(cuda.join("lib64")).unwrap();
        std::fs::write(cuda.join("lib64/libcupti.so.13"), b"").unwrap();
        let home = cuda.clone().into_os_string();
        let var = move |v: &str| (v == "CUDA_HOME").then(|| home.clone());
        let w = OutsideWitness::find(WitnessMode::Auto, &exe, &var).unwrap().expect("both found");
        assert_eq!(w.cupti, Some(cuda.join("lib64/libcupti.so.13")));
        assert!(WitnessMode::parse("sometimes").unwrap_err().to_string().contains("auto, require or off"));
    }
}
