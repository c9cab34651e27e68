//! The gating crate's integration tests, one binary (ARCHITECTURE.md: one test layout): the door registry and matrix
//! enumeration, the promotion policy over synthetic histories, the gates as pure functions, and the
//! subject protocol's manifest and tape.

mod bench_floor;
mod doors29;
mod gates;
mod promote;
mod promote_gain;
mod registry;
mod round_trip;
mod rows_columns;
mod subject_manifest;
mod subject_tape;
