//! Receipts on disk: where they live, how they are written so that a killed run never leaves a
//! truncated receipt under a final name, and how a directory is read back (for `diff`, `plot`,
//! `promote`, and `--resume`, which must know which runs already have a whole receipt).
//!
//! # Layout of a receipt directory
//!
//! ```text
//! <dir>/run-<run_id>.json    one receipt per run (run_id: 16 lowercase hex digits)
//! <dir>/summary.json         the matrix summary
//! <dir>/.<name>.<pid>.<n>.tmp   a write in progress (or one a crash interrupted): always ignored
//! ```
//! Other files (JUnit XML, CSV, plots) may live beside them and are ignored.
//!
//! # Atomic write
//!
//! [`write_atomic`]: create a new temporary file in the same directory (same file system, so the
//! rename cannot degrade into a copy), write everything, `fsync` it, rename it over the final name,
//! then `fsync` the directory so the rename itself survives a power loss. A reader sees either the
//! old complete file or the new complete file, never a prefix. On any error the temporary file is
//! removed.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ReceiptError;
use crate::json;
use crate::schema::{Receipt, Summary, Verdict};
use crate::validate::is_lower_hex;

/// File name prefix of a run receipt.
pub const RECEIPT_PREFIX: &str = "run-";
/// File name suffix of a run receipt.
pub const RECEIPT_SUFFIX: &str = ".json";
/// File name of the matrix summary.
pub const SUMMARY_FILE: &str = "summary.json";
/// File name suffix of a temporary file (which also starts with `.`).
pub const TEMP_SUFFIX: &str = ".tmp";

/// `<dir>/run-<run_id>.json`.
pub fn receipt_path(dir: &Path, run_id: &str) -> PathBuf {
    dir.join(format!("{RECEIPT_PREFIX}{run_id}{RECEIPT_SUFFIX}"))
}

/// `<dir>/summary.json`.
pub fn summary_path(dir: &Path) -> PathBuf {
    dir.join(SUMMARY_FILE)
}

/// The run id a receipt file name promises (`run-0123456789abcdef.json` → `0123456789abcdef`),
/// or `None` when the name is not a receipt's.
pub fn run_id_from_file_name(name: &str) -> Option<&str> {
    let id = name.strip_prefix(RECEIPT_PREFIX)?.strip_suffix(RECEIPT_SUFFIX)?;
    (id.len() == 16 && is_lower_hex(id)).then_some(id)
}

/// Whether `name` is a temporary file of [`write_atomic`] (finished or abandoned).
pub fn is_temp_file_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(TEMP_SUFFIX)
}

/// Writes `bytes` to `path` atomically (see the module doc). Creates no directories.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReceiptError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        ReceiptError::io(path, "name a file", std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))
    })?;
    let temp = dir.join(format!(
        ".{}.{}.{}{TEMP_SUFFIX}",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| ReceiptError::io(&temp, "create temporary file", e))?;
        f.write_all(bytes).map_err(|e| ReceiptError::io(&temp, "write temporary file", e))?;
        f.sync_all().map_err(|e| ReceiptError::io(&temp, "fsync temporary file", e))?;
        drop(f);
        fs::rename(&temp, path).map_err(|e| ReceiptError::io(path, "rename temporary file into place", e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
        return result;
    }
    sync_dir(dir)
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), ReceiptError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| ReceiptError::io(dir, "fsync directory", e))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), ReceiptError> {
    // Directories cannot be opened for fsync here; the rename is still atomic.
    Ok(())
}

/// Validates `receipt`, writes it canonically to `<dir>/run-<run_id>.json` atomically (replacing
/// any earlier receipt of that run) and returns the path.
pub fn write_receipt(dir: &Path, receipt: &Receipt) -> Result<PathBuf, ReceiptError> {
    let path = receipt_path(dir, &receipt.run_id);
    let text = json::receipt_to_json_at(receipt, &path)?;
    write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// Validates `summary`, writes it canonically to `<dir>/summary.json` atomically; returns the path.
pub fn write_summary(dir: &Path, summary: &Summary) -> Result<PathBuf, ReceiptError> {
    let path = summary_path(dir);
    let text = json::summary_to_json_at(summary, &path)?;
    write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// What a receipt directory holds.
#[derive(Debug, Default)]
pub struct DirScan {
    /// Receipts that read strictly, with their paths, sorted by path (so by run_id).
    pub receipts: Vec<(PathBuf, Receipt)>,
    /// Files named `run-*.json` that did not read (bad JSON, unknown version, wrong shape, broken
    /// rule, or a name that disagrees with the content), sorted by path. Never silently skipped:
    /// callers report them.
    pub broken: Vec<ReceiptError>,
    /// Temporary files left by interrupted writes; ignored, listed so a caller can mention them.
    pub temp_files: Vec<PathBuf>,
}

impl DirScan {
    /// Run ids that have a complete receipt, with the verdict it records (for `--resume`: a run in
    /// this map need not run again; whether an ERROR deserves a retry is the caller's policy).
    pub fn complete(&self) -> BTreeMap<String, Verdict> {
        self.receipts.iter().map(|(_, r)| (r.run_id.clone(), r.evidence.verdict)).collect()
    }

    /// The receipts, or the first broken file's error when any file did not read.
    pub fn into_receipts(self) -> Result<Vec<Receipt>, ReceiptError> {
        match self.broken.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(self.receipts.into_iter().map(|(_, r)| r).collect()),
        }
    }
}

/// Reads every receipt of `dir` (see [`DirScan`]); fails only when the directory cannot be listed.
pub fn scan_dir(dir: &Path) -> Result<DirScan, ReceiptError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| ReceiptError::io(dir, "list directory", e))? {
        let entry = entry.map_err(|e| ReceiptError::io(dir, "list directory", e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    let mut scan = DirScan::default();
    for name in names {
        let path = dir.join(&name);
        if is_temp_file_name(&name) {
            scan.temp_files.push(path);
            continue;
        }
        if !name.starts_with(RECEIPT_PREFIX) || !name.ends_with(RECEIPT_SUFFIX) || !path.is_file() {
            continue;
        }
        match json::read_receipt(&path) {
            Ok(r) => match run_id_from_file_name(&name) {
                Some(id) if id == r.run_id => scan.receipts.push((path, r)),
                other => scan.broken.push(ReceiptError::Misnamed {
                    path,
                    named: other.unwrap_or("(not 16 hex digits)").to_string(),
                    found: r.run_id,
                }),
            },
            Err(e) => scan.broken.push(e),
        }
    }
    Ok(scan)
}

/// Every receipt of `dir`, sorted by run_id; the first unreadable receipt is an error.
pub fn load_dir(dir: &Path) -> Result<Vec<Receipt>, ReceiptError> {
    scan_dir(dir)?.into_receipts()
}
