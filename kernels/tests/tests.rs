//! The kernels crate's integration tests, one binary (ARCHITECTURE.md: one test layout): canonical math, the numeric
//! formats, the GEMV reductions and the host twins, with the seeded generator in `util.rs`.

mod util;

mod canon;
mod formats;
mod gemv;
mod twins;
