//! The tools crate's integration tests, one binary (ARCHITECTURE.md: one test layout): the plots.

mod plot;
mod plot_doors;
