//! Integration tests of memra-receipts, one binary (STYLE: tests/tests.rs + util.rs).

mod util;

mod canonical;
mod diff;
mod export;
mod json_schema;
mod store;
