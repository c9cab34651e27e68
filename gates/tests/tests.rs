//! Integration tests of the gates crate: one test binary (STYLE.md), one module per area.

mod promote;
mod registry;
