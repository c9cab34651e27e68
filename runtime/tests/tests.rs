//! The runtime's host-side integration tests, one binary (ARCHITECTURE.md: one test layout): one
//! module per area, the GRAPH test double in `support/segments.rs` (shared with the CUDA tests in `gpu/`, a second
//! binary under its own harness because its tests must be able to report "ignored" at run time).

#[path = "support/edge_fixture.rs"]
mod edge_fixture;
#[path = "support/same_record.rs"]
mod same_record;
#[path = "support/segments.rs"]
mod segments;

mod direct_joins;
mod door_down8;
mod doors29;
mod edge;
mod ep_device29;
mod graph_program;
mod host_ranks;
mod join_folds;
mod launches;
mod model;
mod prepared;
mod reference;
mod rows_columns;
mod tp_invariance;
mod tp_properties;
mod unclamped;
