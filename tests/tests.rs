//! Integration tests of the `memra-gates` binary, one test binary: the modules under `tests/cli/`
//! drive the real release binary on the host backend and assert on exit statuses, messages and
//! the files it writes (shared helpers in `tests/util.rs`); `tests/tidy.rs` checks the
//! repository's invariants on its source text; `test_layout` checks that every test file of the
//! workspace belongs to a test binary; `build_evidence` that the binary's build digest covers the
//! kernels, the twins and the program.

#![forbid(unsafe_code)]

mod build_evidence;
mod cli;
mod test_layout;
mod tidy;
mod util;
