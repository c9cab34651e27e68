//! The build evidence covers the canonical program: the digest stamped into the binary (every
//! receipt's `kernel_source_digest`) is the digest of the kernels, the twins and canonical math,
//! and the runtime's program sources — recomputed here from a copy of those files, where one
//! changed byte of a twin or of the program changes it.

use std::path::Path;

/// Every file the digest covers, copied from this checkout into `to`.
fn copy_tree(to: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = memra_kernels::sources::source_files()
        .map(|f| format!("kernels/cuda/{f}"))
        .chain(memra_kernels::sources::twin_files().map(|f| format!("kernels/{f}")))
        .chain(memra_runtime::provenance::PROGRAM_SOURCES.iter().map(|(p, _)| p.to_string()));
    for f in files {
        let dst = to.join(&f);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(root.join(&f), &dst).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
}

/// Flip one byte of `file` in the tree at `root` (a letter of its first doc comment).
fn change_a_byte(root: &Path, file: &str) {
    let p = root.join(file);
    let text = std::fs::read_to_string(&p).unwrap();
    let at = text.find(" the ").unwrap_or_else(|| panic!("{file}: no \" the \" to change"));
    std::fs::write(&p, format!("{}T{}", &text[..at + 1], &text[at + 2..])).unwrap();
}

#[test]
fn the_stamped_digest_covers_kernels_twins_and_program() {
    let stamp = env!("MG_BUILD_KERNEL_DIGEST");
    assert_eq!(stamp, memra_runtime::provenance::build_digest(), "the binary's stamp is the runtime's build digest");
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(tmp.path());
    assert_eq!(memra_runtime::provenance::tree_digest(tmp.path()).unwrap(), stamp, "a faithful copy digests alike");
    for file in [
        "kernels/src/twins/moe.rs",
        "kernels/src/canon.rs",
        "runtime/src/program/layer.rs",
        "runtime/src/model/edge.rs",
        "kernels/cuda/moe.cu",
    ] {
        let t = tempfile::tempdir().unwrap();
        copy_tree(t.path());
        change_a_byte(t.path(), file);
        let changed = memra_runtime::provenance::tree_digest(t.path()).unwrap();
        assert_ne!(changed, stamp, "one changed byte of {file} left the build digest unchanged");
    }
}
