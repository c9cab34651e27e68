//! Exact host twins of the CUDA kernels in `cuda/*.cu`, one module per kernel family.
//!
//! A twin performs the same IEEE operations in the same order as its kernel; its doc comment is
//! the kernel's arithmetic contract. The host backend runs these directly.

pub mod attention;
pub mod digest;
pub mod down8;
pub mod experts;
pub mod gemv;
pub mod moe;
pub mod norm;
pub mod w8;
