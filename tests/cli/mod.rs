//! One module per area of the command line.

mod bad_input;
mod determinism;
mod diff;
mod model_file;
mod multi_process;
mod readme_commands;
mod registry;
mod resume;
mod run_default;
mod selftest;
mod single_matrix;
mod subject;
