//! The `memra-gates` binary: provenance stamped by build.rs, the exit status decided here,
//! everything else in `memra-gating` (ripgrep's `main` → `run(flags::parse())`).
#![forbid(unsafe_code)]

use memra_gating::args::{self, Provenance};
use memra_gating::dist;
use std::process::ExitCode;

const PROVENANCE: Provenance = Provenance {
    git_rev: env!("MG_BUILD_GIT_REV"),
    kernel_digest: env!("MG_BUILD_KERNEL_DIGEST"),
    rustc: env!("MG_BUILD_RUSTC_VERSION"),
};

/// 0 every gate passed, 1 a gate failed, 2 the harness could not run (the error chain is printed
/// once), 3 `bench --compare` found a seam, layer or step SLOWER than its base beyond noise.
fn main() -> ExitCode {
    // First, while the process has one thread: the only write to its environment (NCCL reads it).
    memra_gating::env::keep_nccl_multicast_off();
    // A distributed call that never returns cannot be unblocked from inside the library: its
    // watchdog hands the overrun to this hook, and how the process ends is decided here.
    dist::install_overrun_hook(end_after_overrun);
    let cli = match args::parse(PROVENANCE) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match memra_gating::run(cli, PROVENANCE) {
        Ok(status) => ExitCode::from(status.exit_code()),
        Err(e) => {
            eprintln!("memra-gates: error: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                eprintln!("  caused by: {s}");
                src = s.source();
            }
            ExitCode::from(2)
        }
    }
}

/// A distributed call overran `--dist-timeout-s` (a peer process died, stopped or runs another
/// plan): say so and end with status 2 at once, without atexit handlers or destructors, which
/// could wait forever on the kernel that spins for the missing peer. The peers' own watchdogs end
/// them in turn, so no process waits forever (docs/multi-host.md, Failure).
fn end_after_overrun(overrun: dist::RuntimeError) -> ! {
    eprintln!(
        "memra-gates: error: {overrun}; ending this process so that none waits forever (--dist-timeout-s / \
         MEMRA_DIST_TIMEOUT_S sets the limit)"
    );
    dist::exit_now(2)
}
