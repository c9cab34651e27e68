//! Where the witness's two libraries are on this machine: the injection library (built beside
//! the memra-gates binary) and a CUPTI library of the CUDA toolkit.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The injection library's file name (`cargo build` puts it in `target/<profile>/`).
pub const LIBRARY: &str = "libmemra_witness.so";

/// The bytes every build of this crate carries (the injection library keeps them in its read-only
/// data): the digest of the sources it was built from (`build.rs`).
pub const BUILD_MARKER: &str = concat!("memra-witness-sources:", env!("MEMRA_WITNESS_SOURCES"), ";");

/// Whether the library at `path` was built from the same sources as this crate (it holds
/// [`BUILD_MARKER`]); `Err` when it cannot be read.
pub fn built_from_these_sources(path: &Path) -> std::io::Result<bool> {
    let bytes = std::fs::read(path)?;
    let marker = BUILD_MARKER.as_bytes();
    Ok(bytes.windows(marker.len()).any(|w| w == marker))
}

/// The injection library beside the executable `exe`: in its directory (the binary in
/// `target/<profile>/`), or one above (a test binary in `target/<profile>/deps/`).
pub fn library_beside(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    let mut candidates = vec![dir.join(LIBRARY)];
    candidates.extend(dir.parent().map(|p| p.join(LIBRARY)));
    candidates.into_iter().find(|p| p.is_file())
}

/// The CUDA installations to look in: `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`, then every
/// `/usr/local/cuda-*`, newest name first.
fn cuda_roots(var: &dyn Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"].iter().filter_map(|v| var(v)).map(PathBuf::from).collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    let mut versioned: Vec<PathBuf> = std::fs::read_dir("/usr/local")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("cuda-")))
                .collect()
        })
        .unwrap_or_default();
    versioned.sort();
    roots.extend(versioned.into_iter().rev());
    roots
}

/// A CUPTI library of this machine's CUDA toolkit (`extras/CUPTI/lib64`, `targets/*/lib` or
/// `lib64` under a root of `cuda_roots`), versioned names first; `None` when there is none.
pub fn cupti(var: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    for root in cuda_roots(var) {
        for sub in ["extras/CUPTI/lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib", "lib64"] {
            if let Some(found) = cupti_in(&root.join(sub)) {
                return Some(found);
            }
        }
    }
    None
}

/// The CUPTI library in `dir`: the longest `libcupti.so.*` name (the most specific version), or
/// `libcupti.so`.
fn cupti_in(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libcupti.so")))
        .filter(|p| p.is_file())
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    found.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cupti_is_found_under_a_named_root_and_nowhere_else() {
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join("extras/CUPTI/lib64");
        std::fs::create_dir_all(&lib).unwrap();
        for n in ["libcupti.so", "libcupti.so.13", "libcupti.so.2026.1.0", "libnvperf_host.so"] {
            std::fs::write(lib.join(n), b"").unwrap();
        }
        let home = root.path().as_os_str().to_owned();
        let var = move |v: &str| (v == "CUDA_HOME").then(|| home.clone());
        assert_eq!(cupti(&var), Some(lib.join("libcupti.so.2026.1.0")));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(cupti_in(empty.path()), None);
    }

    #[test]
    fn a_library_of_other_sources_is_told_apart() {
        let t = tempfile::tempdir().unwrap();
        let same = t.path().join("same.so");
        std::fs::write(&same, [b"\x7fELF..".as_slice(), BUILD_MARKER.as_bytes(), b"..."].concat()).unwrap();
        assert!(built_from_these_sources(&same).unwrap());
        let other = t.path().join("other.so");
        std::fs::write(&other, b"\x7fELF..memra-witness-sources:0123456789abcdef;...").unwrap();
        assert!(!built_from_these_sources(&other).unwrap());
        assert!(built_from_these_sources(&t.path().join("gone.so")).is_err());
    }

    #[test]
    fn the_library_is_found_beside_a_binary_or_one_above_a_test_binary() {
        let t = tempfile::tempdir().unwrap();
        let deps = t.path().join("deps");
        std::fs::create_dir_all(&deps).unwrap();
        assert_eq!(library_beside(&deps.join("tests-1")), None);
        std::fs::write(t.path().join(LIBRARY), b"").unwrap();
        assert_eq!(library_beside(&deps.join("tests-1")), Some(t.path().join(LIBRARY)));
        assert_eq!(library_beside(&t.path().join("memra-gates")), Some(t.path().join(LIBRARY)));
    }
}
