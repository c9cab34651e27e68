//! Paths the user hands the tool, checked before anything is read or computed: an input file must
//! be a regular file (a FIFO would block the read forever, a device never end) of bounded size,
//! and an output path must be able to take what will be written there — checked up front, in one
//! vocabulary (`--out PATH: the receipt directory cannot go there: it is a regular file`), so a
//! long run or a generated model is never lost to a path that was wrong from the start.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use memra_runtime::model::format::file_kind;

/// The most bytes a text input (registry, door-set file, manifest, battery) may have.
pub const MAX_TEXT_BYTES: u64 = 16 << 20;

/// The text of an input file: refused unless it is a regular file of at most
/// [`MAX_TEXT_BYTES`], and never read past that.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {}, not a regular file", file_kind(&meta)),
        ));
    }
    if meta.len() > MAX_TEXT_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {} bytes, more than the {MAX_TEXT_BYTES} bytes a text input may have", meta.len()),
        ));
    }
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_TEXT_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

/// What is written at an output path, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutKind {
    /// A directory the command creates if needed (receipts, plots).
    Dir(&'static str),
    /// One file the command writes (a defaults block, a model file).
    File(&'static str),
}

/// An output path refused, with the rule (`GateError::OutDir` from it: `--out PATH: RULE`).
#[derive(Debug)]
pub struct OutRefused {
    pub path: PathBuf,
    pub rule: String,
}

fn refuse(path: &Path, what: &str, reason: String) -> OutRefused {
    OutRefused { path: path.to_path_buf(), rule: format!("{what} cannot go there: {reason}") }
}

/// The nearest existing ancestor of `path` (itself included), or `None` when none exists.
fn nearest_existing(path: &Path) -> Option<(PathBuf, std::fs::Metadata)> {
    let mut p = Some(path);
    while let Some(q) = p {
        let q = if q.as_os_str().is_empty() { Path::new(".") } else { q };
        if let Ok(m) = std::fs::metadata(q) {
            return Some((q.to_path_buf(), m));
        }
        p = q.parent();
    }
    None
}

/// Check that `path` can take what `kind` says will be written there, before any work: a
/// directory must be a directory or creatable (no file in the way); a file must not be a
/// directory or a special file, and its directory must exist and take a new file.
pub fn check_out(path: &Path, kind: OutKind) -> Result<(), OutRefused> {
    match kind {
        OutKind::Dir(what) => match nearest_existing(path) {
            Some((found, meta)) if found == path && !meta.is_dir() => {
                Err(refuse(path, what, format!("it is {}, not a directory", file_kind(&meta))))
            }
            Some((found, meta)) if !meta.is_dir() => Err(refuse(
                path,
                what,
                format!("{} is {}, so no directory can be created under it", found.display(), file_kind(&meta)),
            )),
            _ => Ok(()),
        },
        OutKind::File(what) => {
            if let Ok(meta) = std::fs::metadata(path) {
                if !meta.is_file() {
                    return Err(refuse(path, what, format!("it is {}, not a file", file_kind(&meta))));
                }
            }
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if path.file_name().is_none() {
                return Err(refuse(path, what, "the path names no file".to_string()));
            }
            match std::fs::metadata(dir) {
                Err(e) => Err(refuse(path, what, format!("its directory {} cannot be used: {e}", dir.display()))),
                Ok(m) if !m.is_dir() => {
                    Err(refuse(path, what, format!("{} is {}, not a directory", dir.display(), file_kind(&m))))
                }
                Ok(_) => {
                    // Proven by writing: permissions alone do not tell (root, read-only mounts, /proc).
                    let probe = dir.join(format!(".memra-gates-probe-{}", std::process::id()));
                    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
                        Ok(_) => {
                            let _ = std::fs::remove_file(&probe);
                            Ok(())
                        }
                        Err(e) => Err(refuse(path, what, format!("cannot create a file in {}: {e}", dir.display()))),
                    }
                }
            }
        }
    }
}
