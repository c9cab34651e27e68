//! Integration tests of the `memra-gates` binary, one test binary (STYLE.md).
mod cli;
mod util;
