//! The files tidy reads: every text file of the repository, minus hidden folders and what the
//! root `.gitignore` ignores (build output, receipts a run left behind).

use std::path::{Path, PathBuf};

/// A file of the repository: path relative to the root with `/` separators, extension, text.
pub struct File {
    pub rel: String,
    pub ext: String,
    pub text: String,
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The root `.gitignore`'s patterns (what builds and runs leave in the tree: target/,
/// memra-receipts/, …): the files tidy must not read.
pub fn ignored_patterns(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join(".gitignore"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
        .map(|l| l.trim_end_matches('/').to_string())
        .collect()
}

/// `*` matches any run of characters except `/`.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            let Some(rest) = text.strip_prefix(head) else { return false };
            (0..=rest.len())
                .take_while(|&k| k == 0 || !rest[..k].contains('/'))
                .any(|k| rest.is_char_boundary(k) && glob(tail, &rest[k..]))
        }
    }
}

pub fn is_ignored(rel: &str, patterns: &[String]) -> bool {
    patterns.iter().any(|p| match p.strip_prefix('/') {
        Some(anchored) => glob(anchored, rel),
        None => glob(p, rel.rsplit('/').next().unwrap_or(rel)),
    })
}

/// Every text file of the repository with one of `exts`, sorted, skipping hidden folders and what
/// `.gitignore` ignores.
pub fn tree(exts: &[&str]) -> Vec<File> {
    let root = root();
    let patterns = ignored_patterns(&root);
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(&root).expect("under the root").to_string_lossy().replace('\\', "/");
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || is_ignored(&rel, &patterns) {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if let Some(ext) = path.extension().and_then(|e| e.to_str()).filter(|e| exts.contains(e)) {
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                out.push(File { rel, ext: ext.to_string(), text });
            }
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    out
}

pub fn all_file_names() -> Vec<String> {
    tree(&["md", "rs", "toml", "cu", "cuh", "sh", "py", "json"])
        .into_iter()
        .map(|f| f.rel.rsplit('/').next().unwrap_or(&f.rel).to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitignore_globs() {
        assert!(glob("target-*", "target-x"));
        assert!(glob("scripts/gpu/*.whl", "scripts/gpu/a.whl"));
        assert!(!glob("scripts/gpu/*.whl", "scripts/gpu/x/a.whl"));
        assert!(is_ignored("memra-receipts", &["/memra-receipts".to_string()]));
        assert!(!is_ignored("docs/gpu", &["/memra-receipts".to_string()]));
    }
}
