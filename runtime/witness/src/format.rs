//! What the outside witness writes, version 1 (`memra-witness/1`), and the census counters
//! memra-gates makes of it. The one definition of the format: the injection library
//! (`crate::inject`) writes it, memra-gates (`gates/src/subject/protocol/witness.rs`) reads it.
//!
//! # The file
//! One JSON object per process that initialised CUDA while the witness was loaded, written when
//! that process exits, at `$MEMRAGATES_WITNESS_DIR/witness-<pid>.json`:
//!
//! ```json
//! {
//!   "format": "memra-witness/1",
//!   "pid": 4242,
//!   "launches": { "ampere_sgemm_32x128_tn": 96, "_Z15rmsnorm_kernelPfPKfi": 48 },
//!   "unnamed_launches": 0,
//!   "calls": { "cuMemcpyHtoDAsync_v2": 130, "cuMemcpyDtoHAsync_v2": 24 },
//!   "errors": []
//! }
//! ```
//!
//! - `launches`: kernel name (as CUPTI gives it: the symbol, mangled for C++ kernels) → launches
//!   issued through the driver API (every runtime-API launch reaches it too).
//! - `unnamed_launches`: launches CUPTI gave no name for.
//! - `calls`: driver API function → calls, for the functions that issue work other than a kernel
//!   launch ([`is_work_call`]): copies, memsets, stream memory operations, graph launches. Calls
//!   that only ask (`cuEventQuery`, `cuPointerGetAttribute`, …) are not counted: their number
//!   depends on timing, and a witness must count the same for the same run.
//! - `errors`: why the witness could not count (CUPTI not found, a subscriber already taken); a
//!   record with errors is no witness, and memra-gates says so (an ERROR receipt).
//!
//! A kernel launched inside a replayed CUDA graph is not seen one by one: the graph launch is
//! (`cuGraphLaunch`).
//!
//! # The counters (`outside.<kind>.<name>`)
//! [`counters`] sums the records of one run (every process of it) into census counters that no
//! subject may report itself: `outside.launch.<kernel>`, `outside.call.<function>`,
//! `outside.unnamed_launch`, and `outside.processes` (the records read, present even when 0).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The `format` of a version 1 record.
pub const FORMAT: &str = "memra-witness/1";
/// Where the injection library writes its record: a directory (set by memra-gates per run).
/// Not a `MEMRA_*` name: a subject may refuse `MEMRA_*` variables it does not know (the
/// built-in runtime as a subject does), and these are not the subject's.
pub const DIR_VAR: &str = "MEMRAGATES_WITNESS_DIR";
/// The path of the CUPTI library the injection library loads (set by memra-gates; without it
/// the library is looked up by name, as the dynamic loader finds it).
pub const CUPTI_VAR: &str = "MEMRAGATES_WITNESS_CUPTI";
/// The CUDA driver's variable naming an injection library, loaded at `cuInit`.
pub const INJECTION_VAR: &str = "CUDA_INJECTION64_PATH";
/// The prefix of every counter made from the witness: reserved, a subject may not report it.
pub const PREFIX: &str = "outside.";
/// The counter of records read for a run (present whenever the witness was armed).
pub const PROCESSES: &str = "outside.processes";
/// The `census_witness` of a run the witness counted.
pub const WITNESS_NAME: &str = "outside:cupti";

/// Why a witness record cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum WitnessError {
    #[error("outside witness record {path}: cannot read it: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("outside witness record {path}: not a {FORMAT} record: {why}")]
    Malformed { path: PathBuf, why: String },
    #[error("outside witness record {path}: `format` is {found:?}, this build reads {FORMAT:?}")]
    Format { path: PathBuf, found: String },
    #[error("outside witness directory {path}: cannot list it: {source}")]
    List { path: PathBuf, source: std::io::Error },
}

/// One process's record (the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WitnessRecord {
    pub format: String,
    pub pid: u32,
    pub launches: BTreeMap<String, u64>,
    pub unnamed_launches: u64,
    pub calls: BTreeMap<String, u64>,
    pub errors: Vec<String>,
}

impl WitnessRecord {
    /// An empty record of process `pid`.
    pub fn new(pid: u32) -> WitnessRecord {
        WitnessRecord { format: FORMAT.to_string(), pid, ..WitnessRecord::default() }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a witness record always serialises")
    }

    /// Read a record strictly: unknown fields, a wrong `format` or a malformed value are errors.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<WitnessRecord, WitnessError> {
        let r: WitnessRecord = serde_json::from_slice(bytes)
            .map_err(|e| WitnessError::Malformed { path: path.to_path_buf(), why: e.to_string() })?;
        if r.format != FORMAT {
            return Err(WitnessError::Format { path: path.to_path_buf(), found: r.format });
        }
        Ok(r)
    }
}

/// The file name of process `pid`'s record.
pub fn file_name(pid: u32) -> String {
    format!("witness-{pid}.json")
}

/// Every record in `dir` (files named by [`file_name`]), in pid order.
pub fn read_dir(dir: &Path) -> Result<Vec<WitnessRecord>, WitnessError> {
    let list = std::fs::read_dir(dir).map_err(|e| WitnessError::List { path: dir.to_path_buf(), source: e })?;
    let mut out = Vec::new();
    for entry in list {
        let path = entry.map_err(|e| WitnessError::List { path: dir.to_path_buf(), source: e })?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !(name.starts_with("witness-") && name.ends_with(".json")) {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|e| WitnessError::Read { path: path.clone(), source: e })?;
        out.push(WitnessRecord::parse(&bytes, &path)?);
    }
    out.sort_by_key(|r| r.pid);
    Ok(out)
}

/// Whether driver API function `name` issues work other than a kernel launch (counted in
/// `calls`): copies, memsets, stream memory operations, graph launches.
pub fn is_work_call(name: &str) -> bool {
    ["cuMemcpy", "cuMemset", "cuStreamWaitValue", "cuStreamWriteValue", "cuStreamBatchMemOp", "cuGraphLaunch"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// Whether driver API function `name` launches a kernel (its symbol goes into `launches`).
pub fn is_launch(name: &str) -> bool {
    name.starts_with("cuLaunch") && !name.starts_with("cuLaunchHostFunc")
}

/// The census counters of one run's records (the module docs): summed over processes.
pub fn counters(records: &[WitnessRecord]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    out.insert(PROCESSES.to_string(), records.len() as u64);
    for r in records {
        for (k, n) in &r.launches {
            *out.entry(format!("{PREFIX}launch.{k}")).or_insert(0) += n;
        }
        for (k, n) in &r.calls {
            *out.entry(format!("{PREFIX}call.{k}")).or_insert(0) += n;
        }
        if r.unnamed_launches > 0 {
            *out.entry(format!("{PREFIX}unnamed_launch")).or_insert(0) += r.unnamed_launches;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names() -> impl Strategy<Value = BTreeMap<String, u64>> {
        proptest::collection::btree_map("[A-Za-z_][A-Za-z0-9_<>:, ]{0,40}", 1u64..1_000_000, 0..6)
    }

    proptest! {
        /// The codec: whatever the library writes, the reader reads back unchanged.
        #[test]
        fn a_record_reads_back_as_written(pid in any::<u32>(), launches in names(), calls in names(),
                                          unnamed in 0u64..5, errors in proptest::collection::vec(".{0,30}", 0..3)) {
            let r = WitnessRecord { pid, launches, calls, unnamed_launches: unnamed, errors, ..WitnessRecord::new(pid) };
            prop_assert_eq!(WitnessRecord::parse(r.to_json().as_bytes(), Path::new("w")).unwrap(), r);
        }
    }

    #[test]
    fn another_format_or_an_unknown_field_is_refused_by_name() {
        let mut v: serde_json::Value = serde_json::from_str(&WitnessRecord::new(7).to_json()).unwrap();
        v["format"] = "memra-witness/2".into();
        let e = WitnessRecord::parse(v.to_string().as_bytes(), Path::new("w.json")).unwrap_err().to_string();
        assert!(e.contains("\"memra-witness/2\"") && e.contains("w.json"), "{e}");
        v["format"] = FORMAT.into();
        v["kernels"] = 3.into();
        let e = WitnessRecord::parse(v.to_string().as_bytes(), Path::new("w.json")).unwrap_err().to_string();
        assert!(e.contains("unknown field `kernels`"), "{e}");
    }

    #[test]
    fn counters_sum_the_processes_of_a_run() {
        let mut a = WitnessRecord::new(1);
        a.launches.insert("k".into(), 2);
        a.calls.insert("cuMemcpyHtoD_v2".into(), 1);
        let mut b = WitnessRecord::new(2);
        b.launches.insert("k".into(), 3);
        b.unnamed_launches = 1;
        let c = counters(&[a, b]);
        assert_eq!(c.get("outside.launch.k"), Some(&5));
        assert_eq!(c.get("outside.call.cuMemcpyHtoD_v2"), Some(&1));
        assert_eq!(c.get("outside.unnamed_launch"), Some(&1));
        assert_eq!(c.get(PROCESSES), Some(&2));
        assert_eq!(counters(&[]), BTreeMap::from([(PROCESSES.to_string(), 0)]), "armed, nothing seen");
    }

    #[test]
    fn read_dir_takes_only_records_and_refuses_a_bad_one() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(file_name(9)), WitnessRecord::new(9).to_json()).unwrap();
        std::fs::write(d.path().join(file_name(3)), WitnessRecord::new(3).to_json()).unwrap();
        std::fs::write(d.path().join("notes.txt"), "x").unwrap();
        assert_eq!(read_dir(d.path()).unwrap().iter().map(|r| r.pid).collect::<Vec<_>>(), [3, 9]);
        std::fs::write(d.path().join(file_name(4)), "{").unwrap();
        assert!(read_dir(d.path()).unwrap_err().to_string().contains("witness-4.json"));
    }

    #[test]
    fn launches_and_work_calls_are_told_apart() {
        assert!(is_launch("cuLaunchKernel") && is_launch("cuLaunchKernelEx_ptsz") && !is_launch("cuLaunchHostFunc"));
        assert!(is_work_call("cuMemcpyDtoHAsync_v2") && is_work_call("cuGraphLaunch"));
        assert!(!is_work_call("cuEventQuery") && !is_work_call("cuLaunchKernel"));
    }
}
