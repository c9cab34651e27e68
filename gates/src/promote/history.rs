//! A nightly history: one night per receipt directory, ordered by date, each counted once. A
//! night is identified by its content — the set of (run id, evidence) of its run receipts and its
//! start time — so the same night copied under three names is one night, not three (a warning
//! says which directories were the same night). A night holds one model's evidence, and a history
//! one model's nights: promotion over mixed models would compare unrelated runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memra_receipts::fnv1a64;
use memra_receipts::{Receipt, ReceiptKind};

use super::PromoteError;

/// One night: the receipts of one directory.
#[derive(Debug, Clone)]
pub struct Night {
    /// How messages name the night: the UTC date of its earliest receipt (`2026-11-27`), followed
    /// by the directory name in parentheses when that differs from the date.
    pub label: String,
    pub dir: PathBuf,
    /// The earliest `measurements.started_at_unix_ms` of its receipts: the night's date.
    pub started_at_unix_ms: u64,
    pub receipts: Vec<Receipt>,
}

impl Night {
    /// A night from receipts already in memory (`dir` only names it and breaks date ties).
    /// `None` when `receipts` is empty.
    pub fn new(dir: impl Into<PathBuf>, receipts: Vec<Receipt>) -> Option<Night> {
        let dir = dir.into();
        let started_at_unix_ms = receipts.iter().map(|r| r.measurements.started_at_unix_ms).min()?;
        let date = utc_date(started_at_unix_ms);
        let name = dir_name(&dir);
        let label = if name == date || name.is_empty() { date } else { format!("{date} ({name})") };
        Some(Night { label, dir, started_at_unix_ms, receipts })
    }

    /// The night's identity by content: its start time and the set of (run id, canonical
    /// evidence) of its receipts. Copies of one night under other names have the same identity.
    pub fn content_id(&self) -> String {
        let mut lines: Vec<String> = self
            .receipts
            .iter()
            .map(|r| {
                let evidence = memra_receipts::json::to_canonical_json(&r.evidence).unwrap_or_default();
                format!("{} {:016x}", r.run_id, fnv1a64(evidence.as_bytes()))
            })
            .collect();
        lines.sort();
        lines.insert(0, self.started_at_unix_ms.to_string());
        format!("{:016x}", fnv1a64(lines.join("\n").as_bytes()))
    }

    /// The models (`preset digest`) of the night's run receipts.
    pub fn models(&self) -> Vec<String> {
        let mut m: Vec<String> = self
            .receipts
            .iter()
            .filter(|r| r.kind == ReceiptKind::Run)
            .map(|r| format!("{} {}", r.evidence.config.model.preset, r.evidence.config.model.digest))
            .collect();
        m.sort();
        m.dedup();
        m
    }
}

fn dir_name(dir: &Path) -> String {
    dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| dir.display().to_string())
}

/// A loaded history: its nights, each once, and what the loader had to say about them.
#[derive(Debug, Clone)]
pub struct History {
    /// Ordered by date, ties by directory name.
    pub nights: Vec<Night>,
    /// Directories that were copies of a night already loaded (each counted once).
    pub warnings: Vec<String>,
}

/// Load one night per directory, ordered by date (earliest receipt start), ties by directory
/// name. A night given twice — as the same directory, or as a copy with the same content — counts
/// once, with a warning. An unreadable receipt, a directory without receipts, a night of several
/// models, a history of several models, or no directory at all is an error naming it.
pub fn load_history(dirs: &[PathBuf]) -> Result<History, PromoteError> {
    if dirs.is_empty() {
        return Err(PromoteError::NoHistory);
    }
    let mut seen_paths: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    let mut seen_content: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut nights: Vec<Night> = Vec::new();
    let mut warnings = Vec::new();
    for dir in dirs {
        let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
        if let Some(first) = seen_paths.insert(canonical.clone(), dir.clone()) {
            return Err(PromoteError::DuplicateNight { dir: canonical, first, second: dir.clone() });
        }
        let receipts = memra_receipts::store::load_dir(dir)
            .map_err(|source| PromoteError::Receipt { dir: dir.clone(), source })?;
        let night = Night::new(dir.clone(), receipts).ok_or_else(|| PromoteError::EmptyNight { dir: dir.clone() })?;
        let models = night.models();
        if models.len() > 1 {
            return Err(PromoteError::MixedModels { dir: dir.clone(), models });
        }
        if let (Some(m), Some(first)) = (models.first(), nights.iter().find(|n| !n.models().is_empty())) {
            let fm = first.models().remove(0);
            if *m != fm {
                return Err(PromoteError::ModelChanged {
                    first: fm,
                    first_dir: first.dir.clone(),
                    second: m.clone(),
                    second_dir: dir.clone(),
                });
            }
        }
        let id = night.content_id();
        if let Some(first) = seen_content.get(&id) {
            warnings.push(format!(
                "night {} holds the same receipts as night {} (content {id}): counted once",
                dir.display(),
                first.display()
            ));
            continue;
        }
        seen_content.insert(id, dir.clone());
        nights.push(night);
    }
    nights.sort_by(night_order);
    Ok(History { nights, warnings })
}

/// By date, ties by directory name.
pub(super) fn night_order(a: &Night, b: &Night) -> std::cmp::Ordering {
    a.started_at_unix_ms.cmp(&b.started_at_unix_ms).then_with(|| dir_name(&a.dir).cmp(&dir_name(&b.dir)))
}

/// `YYYY-MM-DD` (UTC) of a Unix time in milliseconds.
pub fn utc_date(unix_ms: u64) -> String {
    let (year, month, day, _, _) = memra_receipts::time::utc_civil(unix_ms);
    format!("{year:04}-{month:02}-{day:02}")
}
