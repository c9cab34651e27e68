//! The gating crate's integration tests, one binary (STYLE.md): the door registry and matrix
//! enumeration, and the promotion policy over synthetic histories.

mod promote;
mod registry;
