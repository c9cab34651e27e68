//! Integration tests of memra-receipts, one binary (tests/tests.rs with util.rs and one module per area).

mod util;

mod canonical;
mod diff;
mod effect;
mod export;
mod json_schema;
mod store;
