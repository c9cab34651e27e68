//! Stamps the witness's sources into the build (`MEMRA_WITNESS_SOURCES`, an FNV-1a digest of
//! `src/`), so memra-gates can tell an injection library built from other sources than itself
//! (`locate::built_from_these_sources`): a stale library would read other variables or write
//! another record, and every door would look unwitnessed.

use std::path::Path;

fn main() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: Vec<_> = std::fs::read_dir(&src).expect("src/").filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        for b in name.bytes().chain(std::fs::read(f).expect("a source file")) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=MEMRA_WITNESS_SOURCES={h:016x}");
    println!("cargo:rerun-if-changed=src");
}
