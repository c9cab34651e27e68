//! The census: what a backend really did, counted where it calls the driver or its host arena
//! (docs/DESIGN.md §4.2, engagement). The program's call-site counters (`Ctx::count`) say what
//! the program *asked* for; the census says what the backend *carried out* — launches per
//! kernel, copies per transport and byte size, where each cross-rank copy sits in its source's
//! stream, peer stores, packed copies, all-reduces, graph replays, doorbells, merged launches.
//! A door declares in `gates/doors.toml` the census change it must cause against the same
//! configuration with the door off, and the engagement gate compares the two censuses: a door
//! whose mechanism silently fell back leaves the census unchanged, whatever its call site counted.
//!
//! Every backend keeps its census with one `CensusCounter` (`backend/census.rs`) and names
//! kernels with the one function `Op::kernel` (`backend/op/facts.rs`), so the host, CUDA and
//! distributed backends count exactly alike. Only they write it: [`Census`] is read-only.
//!
//! # Counter names (`<family>.<detail>`)
//! | family | detail | counted |
//! |---|---|---|
//! | `launch` | kernel (`Op::kernel`: op name, variant, weight format) | each kernel issued on a rank |
//! | `launch` | `<op>_lanes.<format>` (CUDA `launch_lanes`, `backend/cuda/launch/lanes.rs`) | each launch of several lanes of one GEMV, each weight read once |
//! | `peer_store` | kernel | each direct-join kernel storing into another rank's memory |
//! | `copy` | `<transport>.<bytes>` (`local` for a same-rank copy) | each copy issued |
//! | `copy_after` | the kernel last issued on the source rank (`none` before any) | each cross-rank copy |
//! | `unfenced_copy` | `<transport>.<bytes>` | each copy issued without its producer fence |
//! | `packed_copy` | `<transport>.<blocks>x<bytes>` | each strided copy of several blocks (BULK_P2P) |
//! | `all_reduce` | `<bytes>` | each NCCL all-reduce |
//! | `read` / `write` | `<bytes>` | each host read from / write into a rank's memory (`Backend::read`/`write`) |
//! | `graph_replay` | — | each captured graph launched instead of its calls |
//! | `doorbell` | — | each fence rung with stream memory operations (not an event fallback) |
//! | `kernel_doorbell` | — | each fence rung by a kernel's store into the waiter's device memory and awaited with a same-device stream memop (FENCE_RANK1; not an event fallback) |
//! | `merged_launch` | — | each kernel rank 0 issued on the default stream (RANK0_MERGE) |
//! | `defect` | the planted defect | each op run with a planted twin defect (host canaries) |
//!
//! Bytes are the payload of one copy (4 × elements). Reads and writes are counted because a door's
//! mechanism replaced by a host read + write must not look like the copies or stores it claims;
//! digests and timing marks are gating machinery and not counted. On CUDA, calls of a replayed graph segment are not issued
//! one by one, so they are not counted: the replay is.

use std::collections::BTreeMap;
use std::ops::Deref;

/// Census counters: `<family>.<detail>` → count (module docs), as plain data (a census change,
/// an expected census in a test).
pub type Counts = BTreeMap<String, u64>;

/// A census: read-only counts that only a backend makes (`backend/census.rs`, the one
/// `CensusCounter`, whose constructor and mutators are visible only inside `runtime/src/backend/`)
/// or that an external subject's tape reports as its own word ([`Census::reported`]). Program code
/// reads it and may pass on a backend's census whole (`record.census = backend.census()`), but it
/// cannot add, remove or change a counter: there is no mutable access, and the tidy rule
/// `census_is_written_only_by_backends` refuses every other construction or assignment outside the
/// backends (docs/DESIGN.md §4.2).
///
/// ```compile_fail
/// // A fallback adding the counter its door is witnessed by does not compile.
/// let mut c = memra_runtime::evidence::census::Census::default();
/// c.insert("peer_store.gemv_partials.bf16".to_string(), 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Census(Counts);

impl Census {
    /// The counts a backend kept (`backend::census::CensusCounter::counts`, and nowhere else:
    /// tidy).
    pub(crate) fn counted(counts: Counts) -> Census {
        Census(counts)
    }

    /// An external subject's census as its tape states it: the subject's own word, which the
    /// receipt labels with its `census_witness` (tidy: only `gates/src/subject/protocol/` calls it).
    pub fn reported(counts: Counts) -> Census {
        Census(counts)
    }

    /// The counts (a copy for a receipt or a wire format: `census.counts().clone()`).
    pub fn counts(&self) -> &Counts {
        &self.0
    }
}

impl Deref for Census {
    type Target = Counts;

    fn deref(&self) -> &Counts {
        &self.0
    }
}

impl PartialEq<Counts> for Census {
    fn eq(&self, other: &Counts) -> bool {
        &self.0 == other
    }
}

/// The census families a door may name (the first segment of a counter).
pub const FAMILIES: [&str; 14] = [
    "launch",
    "peer_store",
    "copy",
    "copy_after",
    "unfenced_copy",
    "packed_copy",
    "all_reduce",
    "read",
    "write",
    "graph_replay",
    "doorbell",
    "kernel_doorbell",
    "merged_launch",
    "defect",
];

/// The counters of mechanisms only a backend's inner machinery decides (a distributed run sums
/// them across processes; every other family is counted from the program's calls).
pub const MECHANISMS: [&str; 4] = ["graph_replay", "doorbell", "kernel_doorbell", "merged_launch"];
