//! What a backend lets the gates see of what it did: the one interface to a backend's evidence.
//! Every backend is a witness (`Backend: Witness`); the program reads the census, engagement
//! and coverage from here after a run and plants canaries through here, and nothing else of the
//! runtime writes them (the census is counted inside the backends, where the driver or the
//! host arena is called).

use super::census::Census;
use super::coverage::{Coverage, SeamPoint};
use super::defect::TwinDefect;
use crate::Result;

/// Every engagement counter a backend may report through [`Witness::engagement`] (mechanisms the
/// backend carries out alone). The distributed backend sums exactly these across processes.
pub const BACKEND_COUNTERS: [&str; 5] = [
    "rank0_merge.merged_launches",
    "graph.replays",
    "bulk_p2p.packed_copies",
    "fence_memops.doorbells",
    "fence_rank1.kernel_doorbells",
];

/// A backend's evidence.
pub trait Witness {
    /// The census of everything issued since the backend was opened or rewound ([`super::census`]):
    /// counted where the driver or the host arena is called. A backend that keeps none reports an
    /// empty census, and then no door can be witnessed on it (its runs are VOID).
    fn census(&self) -> Census;

    /// Plant a twin defect (a CANARY of [`super::defect`]) in every later op it affects, or refuse:
    /// a backend whose kernels cannot carry the defect must never run the canary as the canonical
    /// arithmetic, which would make it pass silently.
    fn plant(&mut self, d: TwinDefect) -> Result<()>;

    /// Engagement counters of mechanisms the backend itself carries out (e.g. RANK0_MERGE's
    /// merged launches; names from [`BACKEND_COUNTERS`]), added to the record after the run.
    fn engagement(&self) -> Vec<(String, u64)> {
        Vec::new()
    }

    /// The coverage counters of the ops run so far ([`super::coverage`]); `None` where the
    /// backend does not count them (the CUDA kernels do not).
    fn coverage(&mut self) -> Result<Option<Coverage>> {
        Ok(None)
    }

    /// Where the program is (the seam whose work follows), for the first-reach places of the
    /// coverage counters. Backends that do not count coverage ignore it.
    fn note_position(&mut self, at: SeamPoint) {
        let _ = at;
    }

    /// The compiler options that decided the kernels' arithmetic (NVRTC options on CUDA,
    /// starting with the architecture); empty where the host twins run.
    fn build_options(&self) -> Vec<String> {
        Vec::new()
    }
}
