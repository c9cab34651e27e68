//! Canonical decode program (in progress)
