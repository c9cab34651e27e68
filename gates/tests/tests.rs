//! The gating crate's integration tests, one binary (ARCHITECTURE.md: one test layout): the door registry and matrix
//! enumeration, and the promotion policy over synthetic histories.

mod promote;
mod registry;
