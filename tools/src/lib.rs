//! What a person looks at: terminal tables and latency plots made from receipts.
//!
//! Depends only on `memra-receipts`: everything shown is read from receipts, so a table or a plot
//! of last night's files looks exactly like one made right after the run.

#![forbid(unsafe_code)]

pub mod plot;
pub mod table;
