//! The gating crate's integration tests, one binary (ARCHITECTURE.md: one test layout): the door registry and matrix
//! enumeration, the promotion policy over synthetic histories, and the subject protocol's tape.

mod promote;
mod registry;
mod subject_tape;
