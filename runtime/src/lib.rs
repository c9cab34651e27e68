//! The thin tensor-parallel correctness runtime: the *subject* memra-gates runs by default.
//!
//! It turns a model (safetensors) and a run configuration (TP size, transport, explicit door
//! values) into a [`Record`]: a digest at every layer × seam × step, the token tape, the doors
//! that engaged and per-seam timings. The canonical decode program (`program/`) is written once
//! against the [`backend::Backend`] trait; the host backend runs the kernel twins on CPU ranks,
//! the CUDA backend launches the `.cu` kernels. All `unsafe` and every driver call of the
//! workspace live in this crate (`backend/cuda`).

pub mod backend;
pub mod config;
pub mod door;
pub mod error;
pub mod evidence;
pub mod host_clock;
pub mod model;
pub mod program;
pub mod provenance;
pub mod reference;

pub use config::{Battery, ExpertFormat, PassShape, RunConfig, Timing, Transport};
pub use door::{Canary, Door, DoorSet};
pub use error::RuntimeError;
/// The record's module at the crate root, where other crates name it.
pub use evidence::record;
pub use evidence::record::{Record, Seam};

pub type Result<T> = std::result::Result<T, RuntimeError>;
