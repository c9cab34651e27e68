//! Stamps provenance into the `memra-gates` binary: the git revision, the digest of the kernel
//! sources (`kernels/cuda/*`, FNV-1a 64 over their bytes concatenated in file-name order — the
//! same definition as `memra_kernels::sources::source_digest`), and the rustc version.

use std::path::Path;
use std::process::Command;

fn fnv1a64(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

fn main() {
    println!("cargo:rerun-if-changed=kernels/cuda");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let mut files: Vec<_> = std::fs::read_dir(Path::new("kernels/cuda"))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("cu" | "cuh")));
    files.sort();
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        h = fnv1a64(&std::fs::read(f).expect("kernel source readable"), h);
    }
    println!("cargo:rustc-env=MEMRA_KERNEL_DIGEST={h:016x}");
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
    println!("cargo:rustc-env=MEMRA_GIT_REV={git}{}", if dirty { "-dirty" } else { "" });
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MEMRA_RUSTC_VERSION={version}");
}
