//! The `memra-gates` binary: provenance stamped by build.rs, everything else in `memra-gating`.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    // First, while the process has one thread: the only write to its environment (NCCL reads it).
    memra_gating::env::keep_nccl_multicast_off();
    memra_gating::cli::main(memra_gating::cli::Provenance {
        git_rev: env!("MG_BUILD_GIT_REV"),
        kernel_digest: env!("MG_BUILD_KERNEL_DIGEST"),
        rustc: env!("MG_BUILD_RUSTC_VERSION"),
    })
}
