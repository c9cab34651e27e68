//! The output directory of a run, taken before any configuration runs: created, locked (one
//! writer per directory), proven writable, and holding no receipt of another plan — so a summary
//! always describes every receipt beside it, and a directory that cannot take the evidence is
//! refused in milliseconds instead of after the whole matrix. Every matrix output written through
//! it is checked; a file that cannot be written makes the run exit 2 naming it.
//!
//! The lock is an advisory `flock` on `<dir>/.memra-gates.lock` (released by the kernel when the
//! holder exits, however it exits); the file names the holder so a second run can say who it is.

use crate::error::GateError;
use memra_receipts::schema::{Receipt, Summary, SummaryExclusion};
use memra_receipts::{export, store};
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

/// The lock file's name inside an output directory.
pub const LOCK_FILE: &str = ".memra-gates.lock";

/// How a run may use a directory that already holds receipts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Receipts of this plan are re-run and overwritten; another plan's are refused.
    Fresh,
    /// Receipts of this plan are kept (`--resume`); another plan's are refused.
    Resume,
    /// Another plan's receipts (and matrix outputs) are removed first (`--replace`).
    Replace,
}

/// A locked, writable output directory.
#[derive(Debug)]
pub struct OutDir {
    dir: PathBuf,
    /// Held for the life of the run: the lock is released when this file is closed.
    _lock: File,
}

/// The matrix outputs written beside the receipts.
pub const MATRIX_OUTPUTS: [&str; 5] =
    ["summary.json", "junit.xml", "latency.csv", "summary.md", memra_receipts::effect::EFFECTS_FILE];

impl OutDir {
    /// Take `dir` for a plan whose receipts are `run_ids`.
    pub fn take(dir: &Path, run_ids: &BTreeSet<String>, reuse: Reuse) -> Result<OutDir, GateError> {
        let refuse = |rule: String| GateError::OutDir { dir: dir.to_path_buf(), rule };
        crate::paths::check_out(dir, crate::paths::OutKind::Dir("the receipt directory"))?;
        std::fs::create_dir_all(dir).map_err(|e| refuse(format!("cannot create the directory: {e}")))?;
        let lock_path = dir.join(LOCK_FILE);
        let mut lock =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&lock_path).map_err(|e| {
                refuse(format!("cannot write there ({}: {e}); receipts could not be kept", lock_path.display()))
            })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = lock.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(GateError::Locked {
                    dir: dir.to_path_buf(),
                    lock: lock_path,
                    holder: if holder.is_empty() { "another memra-gates run".to_string() } else { holder.to_string() },
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(refuse(format!("cannot lock {}: {e}", lock_path.display())))
            }
        }
        let holder =
            format!("memra-gates (pid {}, started at unix ms {})", std::process::id(), crate::receipt::now_ms());
        lock.set_len(0)
            .and_then(|_| lock.rewind())
            .and_then(|_| lock.write_all(holder.as_bytes()))
            .and_then(|_| lock.sync_all())
            .map_err(|e| {
                refuse(format!("cannot write there ({}: {e}); receipts could not be kept", lock_path.display()))
            })?;
        let out = OutDir { dir: dir.to_path_buf(), _lock: lock };
        out.check_foreign(run_ids, reuse)?;
        Ok(out)
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Receipts of another plan: refused, or removed under [`Reuse::Replace`].
    fn check_foreign(&self, run_ids: &BTreeSet<String>, reuse: Reuse) -> Result<(), GateError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| GateError::OutDir {
            dir: self.dir.clone(),
            rule: format!("cannot list the directory: {e}"),
        })?;
        let mut foreign: Vec<PathBuf> = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_receipt = name.starts_with(store::RECEIPT_PREFIX) && name.ends_with(store::RECEIPT_SUFFIX);
            let ours = store::run_id_from_file_name(&name).is_some_and(|id| run_ids.contains(id));
            if is_receipt && !ours {
                foreign.push(entry.path());
            }
        }
        foreign.sort();
        if foreign.is_empty() {
            return Ok(());
        }
        if reuse == Reuse::Replace {
            for f in foreign.iter().cloned().chain(MATRIX_OUTPUTS.iter().map(|n| self.dir.join(n))) {
                match std::fs::remove_file(&f) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(GateError::OutDir {
                            dir: self.dir.clone(),
                            rule: format!("--replace cannot remove {}: {e}", f.display()),
                        })
                    }
                }
            }
            eprintln!(
                "memra-gates: --replace removed {} receipt(s) of another plan from {}",
                foreign.len(),
                self.dir.display()
            );
            return Ok(());
        }
        Err(GateError::OutDir {
            dir: self.dir.clone(),
            rule: format!(
                "holds {} receipt(s) of another plan (first: {}), so its summary could not describe every receipt beside it; use a fresh --out, or --replace to remove them",
                foreign.len(),
                foreign[0].file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
            ),
        })
    }

    /// Write the matrix outputs beside the receipts: summary.json, junit.xml, latency.csv,
    /// summary.md (with `excluded`, the plan's configurations the rules excluded, when it lists
    /// them), door-effects.json (each door against its parent set, METRICS.md, "Door effects"). Every file is attempted; the ones that fail are returned with their errors.
    pub fn write_outputs(
        &self,
        name: &str,
        receipts: &[Receipt],
        excluded: &[SummaryExclusion],
    ) -> (Summary, Vec<(PathBuf, String)>) {
        let mut summary = Summary::from_receipts(name, receipts);
        summary.excluded = excluded.to_vec();
        let mut failed = Vec::new();
        let mut note = |path: PathBuf, r: Result<(), memra_receipts::ReceiptError>| {
            if let Err(e) = r {
                failed.push((path, e.to_string()));
            }
        };
        note(store::summary_path(&self.dir), store::write_summary(&self.dir, &summary).map(|_| ()));
        let junit = self.dir.join("junit.xml");
        note(junit.clone(), store::write_atomic(&junit, export::junit_xml(name, receipts).as_bytes()));
        let csv = self.dir.join("latency.csv");
        note(csv.clone(), export::latency_csv(receipts).and_then(|t| store::write_atomic(&csv, t.as_bytes())));
        let md = self.dir.join("summary.md");
        note(md.clone(), store::write_atomic(&md, export::summary_markdown(&summary).as_bytes()));
        let effects = memra_receipts::effect::door_effects(receipts);
        note(
            memra_receipts::effect::effects_path(&self.dir),
            memra_receipts::effect::write_effects(&self.dir, &effects).map(|_| ()),
        );
        (summary, failed)
    }
}
