//! The gating crate's integration tests, one binary (ARCHITECTURE.md: one test layout): the door registry and matrix
//! enumeration, the promotion policy over synthetic histories, and the gates as pure functions.

mod gates;
mod promote;
mod registry;
