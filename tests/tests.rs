//! Integration tests of the `memra-gates` binary: one test binary (STYLE.md), the modules under
//! `tests/cli/`, shared helpers in `tests/util.rs`. They drive the real release binary on the host
//! backend and assert on exit statuses, messages and the files it writes.

#![forbid(unsafe_code)]

mod cli;
mod util;
