//! The gating crate's integration tests, one binary (ARCHITECTURE.md: one test layout): the door registry and matrix
//! enumeration, the promotion policy over synthetic histories, the gates as pure functions, and the
//! subject protocol's manifest and tape.

mod bench_floor;
mod dev_routes;
mod door_down8;
mod doors29;
mod ep_device29;
mod gates;
mod promote;
mod promote_gain;
mod registry;
mod round_trip;
mod rows_columns;
mod subject_manifest;
mod subject_tape;
mod untimed_runs;

/// A door's census declaration as the registry writes it, judged against the run with every door
/// at its default (the engagement tests on real runs: `doors29`, `round_trip`, `rows_columns`).
fn registry_decl(id: &str) -> memra_gating::job::CensusDecl {
    let reg = memra_gating::registry::Registry::builtin().unwrap();
    let door = reg.door(id).unwrap();
    memra_gating::job::CensusDecl {
        door: door.id.clone(),
        changes: door.census.clone(),
        off: Default::default(),
        off_vars: Default::default(),
        identity: None,
    }
}
