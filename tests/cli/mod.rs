//! One module per area of the command line.

mod bad_input;
mod bad_inputs;
mod bench_anchor;
mod bench_compare;
mod bench_targets;
mod determinism;
mod diff;
mod docs_engine;
mod door_effects;
mod host_clock;
mod model_file;
mod multi_process;
mod output_dir;
mod progress_and_review;
mod readme_commands;
mod registry;
mod resume;
mod run_default;
mod selftest;
mod single_matrix;
mod subject;
mod subject_hygiene;
mod subject_lies;
mod subject_rows;
mod torch_anchor;
mod workers;
