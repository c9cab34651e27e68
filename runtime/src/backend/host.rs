//! Host backend (in progress)
