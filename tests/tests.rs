//! Integration tests of the `memra-gates` binary: one test binary (STYLE.md), the modules under
//! `tests/cli/`, shared helpers in `tests/util.rs`. They drive the real release binary on the host
//! backend and assert on exit statuses, messages and the files it writes; `test_layout` checks
//! that every test file of the workspace belongs to a test binary.

mod cli;
mod test_layout;
mod util;
