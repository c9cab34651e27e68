//! The bottom of the runtime: what a run leaves behind as evidence, and nothing that produces it.
//!
//! - `record.rs`: the [`Record`](record::Record) a subject produces and the gates consume (seams,
//!   digests, tapes, timings, copy checks).
//! - `census.rs`: what a backend carried out, counted where it calls its driver or arena.
//! - `coverage.rs`: how often the special paths of the arithmetic were reached.
//! - `defect.rs`: the twin defects the host backend plants for the canaries.
//! - `witness.rs`: the [`Witness`](witness::Witness) interface every backend gives the gates.
//!
//! Nothing here imports `backend`, `program`, `model` or `config` (tests/tidy.rs checks the
//! runtime's import graph): the layers above describe their work in these terms, never the
//! reverse, so a record can be built from an external engine's tape as well as from a backend.

pub mod census;
pub mod coverage;
pub mod defect;
pub mod record;
pub mod witness;
