//! The numeric heart of memra-gates: the exact definitions every backend must reproduce.
//!
//! Everything that decides a bit of the canonical program lives here, once: the weight formats
//! (E4M3, BF16, E2M1/NVFP4), the canonical transcendental functions, and — beside each CUDA
//! kernel in `cuda/*.cu` — its exact host twin. The host backend runs the twins directly; the CUDA
//! backend launches the `.cu` kernels and a test compares both bit for bit. This crate has no
//! `unsafe`, no I/O and no dependency on the rest of the workspace.

#![forbid(unsafe_code)]

pub mod canon;
pub mod error;
pub mod formats;
pub mod grid;
pub mod sources;
pub mod twins;

pub use error::KernelError;
