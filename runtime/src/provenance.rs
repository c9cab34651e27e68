//! The program half of the build evidence (docs/DESIGN.md §5): the runtime sources that decide
//! the arithmetic beside the kernels and their twins — the canonical program's order of
//! operations (`program/`), how the host backend maps each op onto its twin, how weights are
//! sharded and mirrored (`model/matrix.rs`) and how the generated presets' weights are made
//! (`model/gen.rs`, `model/edge.rs`: a generated model's identity is its configuration and seed,
//! so the generator is part of what a receipt must name). The binary's stamp
//! (`MG_BUILD_KERNEL_DIGEST`, every receipt's `kernel_source_digest`) is
//! `memra_kernels::sources::build_digest` of these texts, so a changed twin or program changes
//! the evidence of every receipt.
//!
//! The root package's `build.rs` compiles this very file (`#[path]`), so the stamp and
//! [`build_digest`] are computed from one list.

/// (workspace-relative path, text) of every runtime source that decides the arithmetic.
pub const PROGRAM_SOURCES: [(&str, &str); 22] = [
    ("runtime/src/program/mod.rs", include_str!("program/mod.rs")),
    ("runtime/src/program/layer.rs", include_str!("program/layer.rs")),
    ("runtime/src/program/moe.rs", include_str!("program/moe.rs")),
    ("runtime/src/program/copies.rs", include_str!("program/copies.rs")),
    ("runtime/src/program/ep_host.rs", include_str!("program/ep_host.rs")),
    ("runtime/src/program/lanes.rs", include_str!("program/lanes.rs")),
    ("runtime/src/program/passes.rs", include_str!("program/passes.rs")),
    ("runtime/src/program/buffers.rs", include_str!("program/buffers.rs")),
    ("runtime/src/program/placement.rs", include_str!("program/placement.rs")),
    ("runtime/src/program/weights.rs", include_str!("program/weights.rs")),
    ("runtime/src/program/payloads.rs", include_str!("program/payloads.rs")),
    ("runtime/src/program/prepared.rs", include_str!("program/prepared.rs")),
    ("runtime/src/program/pool.rs", include_str!("program/pool.rs")),
    ("runtime/src/backend/host/mod.rs", include_str!("backend/host/mod.rs")),
    ("runtime/src/backend/host/execute.rs", include_str!("backend/host/execute.rs")),
    ("runtime/src/backend/host/backend.rs", include_str!("backend/host/backend.rs")),
    ("runtime/src/backend/host/rows.rs", include_str!("backend/host/rows.rs")),
    ("runtime/src/backend/host/simd/mod.rs", include_str!("backend/host/simd/mod.rs")),
    ("runtime/src/backend/host/simd/avx512.rs", include_str!("backend/host/simd/avx512.rs")),
    ("runtime/src/model/matrix.rs", include_str!("model/matrix.rs")),
    ("runtime/src/model/gen.rs", include_str!("model/gen.rs")),
    ("runtime/src/model/edge.rs", include_str!("model/edge.rs")),
];

/// The build digest of this build: kernels, twins and [`PROGRAM_SOURCES`].
pub fn build_digest() -> String {
    memra_kernels::sources::build_digest(&PROGRAM_SOURCES)
}

/// The build digest of the source tree at `root` (a workspace checkout): the same files read from
/// disk — the kernels (`kernels/cuda/`), the twins (`kernels/src/`) and [`PROGRAM_SOURCES`]'s
/// paths — so a copy of the tree with one changed byte can be compared with this build.
pub fn tree_digest(root: &std::path::Path) -> std::io::Result<String> {
    use memra_kernels::sources::{build_digest_of, concat_sources, source_files, twin_files};
    let read = |rel: String| std::fs::read_to_string(root.join(&rel));
    let cuda: Vec<(&str, String)> =
        source_files().map(|f| Ok((f, read(format!("kernels/cuda/{f}"))?))).collect::<std::io::Result<_>>()?;
    let twins: Vec<(&str, String)> =
        twin_files().map(|f| Ok((f, read(format!("kernels/{f}"))?))).collect::<std::io::Result<_>>()?;
    let program: Vec<(&str, String)> =
        PROGRAM_SOURCES.iter().map(|(p, _)| Ok((*p, read(p.to_string())?))).collect::<std::io::Result<_>>()?;
    let text = concat_sources(cuda.iter().map(|(n, t)| (*n, t.as_str())));
    let twins: Vec<(&str, &str)> = twins.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let program: Vec<(&str, &str)> = program.iter().map(|(n, t)| (*n, t.as_str())).collect();
    Ok(build_digest_of(&text, &twins, &program))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new file of the program or of the host backend must join the digest: every `.rs` file
    /// under `program/` and `backend/host/` (subfolders included) is listed, except a folder
    /// module's `tests.rs` (compiled only for tests, so it decides no arithmetic of a build).
    #[test]
    fn every_program_file_is_covered() {
        fn walk(dir: &std::path::Path, rel: &str, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                let name = e.file_name().into_string().unwrap();
                let path = format!("{rel}/{name}");
                if e.file_type().unwrap().is_dir() {
                    walk(&e.path(), &path, out);
                } else if name != "tests.rs" {
                    out.push(path);
                }
            }
        }
        let mut files = Vec::new();
        for folder in ["program", "backend/host"] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(folder);
            walk(&dir, &format!("runtime/src/{folder}"), &mut files);
        }
        assert!(files.iter().any(|f| f.ends_with("host/simd/avx512.rs")), "the walk reaches subfolders: {files:?}");
        for path in files {
            assert!(PROGRAM_SOURCES.iter().any(|(p, _)| *p == path), "{path} is not in PROGRAM_SOURCES");
        }
    }

    #[test]
    fn the_tree_digest_of_this_checkout_is_this_build_digest() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        assert_eq!(tree_digest(root).unwrap(), build_digest());
    }
}
