//! The tools crate's integration tests, one binary (STYLE.md): the plots.

mod plot;
