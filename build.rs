//! Stamps provenance into the `memra-gates` binary: the git revision, the digest of the canonical
//! program (`memra_kernels::sources::build_digest`, the one definition: FNV-1a 64 of exactly the
//! text NVRTC compiles, the host twins' sources and the runtime's program sources listed in
//! `runtime/src/provenance.rs`, which this script compiles itself), and the rustc version.
//!
//! The stamped names must not start with `MEMRA_`: cargo also exports every `rustc-env` variable
//! into the environment of the program it starts (`cargo run`, `cargo test`), where the strict
//! `MEMRA_*` parser (every such name is a door or a setting) would refuse them.

#![forbid(unsafe_code)]

use std::process::Command;

/// The runtime's program sources (the same file the runtime compiles, so one list decides both
/// the stamp and `memra_runtime::provenance::build_digest`).
#[allow(dead_code)]
#[path = "runtime/src/provenance.rs"]
mod provenance;

fn main() {
    println!("cargo:rerun-if-changed=kernels/cuda");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    for f in memra_kernels::sources::source_files() {
        println!("cargo:rerun-if-changed=kernels/cuda/{f}");
    }
    for f in memra_kernels::sources::twin_files() {
        println!("cargo:rerun-if-changed=kernels/{f}");
    }
    for (f, _) in provenance::PROGRAM_SOURCES {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-changed=runtime/src/provenance.rs");
    println!("cargo:rustc-env=MG_BUILD_KERNEL_DIGEST={}", provenance::build_digest());
    let git = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    println!("cargo:rustc-env=MG_BUILD_GIT_REV={git}{}", if dirty { "-dirty" } else { "" });
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MG_BUILD_RUSTC_VERSION={version}");
}
