//! An outside witness of a CUDA subject (docs/DESIGN.md §10, docs/subject-protocol.md): a CUPTI
//! injection library that counts the kernels (by name) and the copies an external subject's
//! process issues, so the engagement of the subject's doors is judged on what the driver was
//! asked to do, not only on the census the subject reports about itself.
//!
//! - [`format`](mod@format): the record the library writes per process and the census counters memra-gates
//!   makes of it (the one definition of that file format);
//! - [`locate`]: where the library and CUPTI are on this machine;
//! - `inject` (the `cdylib`'s entry point `InitializeInjection`): the counting itself.

pub mod format;
#[cfg(unix)]
mod inject;
pub mod locate;
