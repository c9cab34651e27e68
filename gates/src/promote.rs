//! Promotion policy (in progress).
