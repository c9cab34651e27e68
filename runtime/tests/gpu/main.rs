//! The CUDA tests, one binary under a custom harness (`harness = false`, libtest-mimic): on a
//! machine that cannot run a test it reads `ignored (<reason>)` in the plain `cargo test` output
//! and is counted as ignored, never as passed; `MEMRA_REQUIRE_GPU=1` makes such a test fail (the
//! rules are in `harness.rs`). The arguments are libtest's (`--exact`, filters, `--list`,
//! `--ignored`, `--test-threads`, `--nocapture` — a no-op: this harness never captures output).
//!
//! Each module below holds tests that need CUDA and exports `pub fn tests() -> Vec<GpuTest>`;
//! a test is a function returning [`harness::Ran`], registered in that list (an unlisted one is
//! dead code, which clippy refuses). Adding a file of GPU tests is adding its name to
//! `gpu_modules!` below.

#[path = "../support/edge_fixture.rs"]
mod edge_fixture;
mod harness;
#[path = "../support/same_record.rs"]
mod same_record;
#[path = "../support/segments.rs"]
mod segments;

use std::process::ExitCode;

/// Declares each module of GPU tests and collects their tests, named `module::test`.
macro_rules! gpu_modules {
    ($($module:ident),* $(,)?) => {
        $(mod $module;)*

        fn all_tests() -> Vec<harness::GpuTest> {
            let mut all = Vec::new();
            $(all.extend($module::tests().into_iter().map(|t| t.in_module(stringify!($module))));)*
            all
        }
    };
}

mod cases;

gpu_modules![
    cuda_kernels,
    cuda_direct,
    cuda_graph,
    cuda_step,
    cuda_gates,
    cuda_lanes,
    cuda_lane_grid,
    cuda_passes,
    cuda_doors29,
    cuda_ep_device29,
    cuda_down8,
    cuda_threads,
    cuda_launch,
    harness_checks
];

fn main() -> ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let policy = match harness::Policy::from_env() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let trials = all_tests().into_iter().map(|t| t.into_trial(policy)).collect();
    libtest_mimic::run(&args, trials).exit_code()
}
