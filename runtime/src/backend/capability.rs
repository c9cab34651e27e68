//! Door mechanisms as optional capabilities. The data plane ([`Backend`]) is what every backend
//! carries out; a door's mechanism — a peer store, a packed copy, a captured graph, an NCCL
//! all-reduce, a copy without its producer fence — is a trait of its own that a backend
//! implements or does not. A backend hands out a capability with `Backend::peer_stores()` and
//! friends (`None` by default), and the program asks through the accessors here
//! (`peer_stores(b)`, …), which turn a `None` into the one refusal of that capability. There is no fallback by
//! construction: a backend without the trait has no method a door could silently degrade into.

use super::{Backend, JoinFence, Op, Packed, Slice, Transfer};
use crate::config::Transport;
use crate::{Result, RuntimeError};

/// Direct joins (OPROJ_DIRECT, MOE_DIRECT): a peer's kernel stores its one output straight into
/// another rank's memory.
pub trait PeerStores {
    /// Run `op` on `rank` with its inputs on `rank` and its one output ([`Op::store_target`]) a
    /// slice of `out_rank` — the kernel stores straight into `out_rank`'s memory; no slice of
    /// `rank` is written and no copy follows. Ordered after `out_rank`'s earlier work and before
    /// its later work (the join's two fences, carried out as `fence` says), and after `rank`'s
    /// earlier work (stream order).
    fn launch_peer_store(&mut self, rank: usize, op: Op, out_rank: usize, fence: JoinFence) -> Result<()>;
}

/// BULK_P2P: several blocks moved in one strided copy.
pub trait PackedCopies {
    /// Move every block of `p` from `src_rank` to `dst_rank` in ONE copy over `transport`,
    /// ordered like [`Backend::copy`]. The backend counts `bulk_p2p.packed_copies` in its
    /// engagement for each packed copy of at least 2 blocks.
    fn copy_packed(&mut self, transport: Transport, src_rank: usize, dst_rank: usize, p: Packed) -> Result<()>;
}

/// GRAPH: shape-stable segments recorded, captured and replayed.
pub trait Graphs {
    /// Open a segment named `key`: the launches, copies, digests and marks issued until
    /// [`Graphs::segment_end`] form one unit that is recorded on its first pass, captured on the
    /// second and replayed on every later one — the caller issues the same calls every time (the
    /// backend checks that and fails on any difference). Host reads and writes are refused inside
    /// a segment.
    fn segment_begin(&mut self, key: u64) -> Result<()>;
    /// Close the open segment (on a replay pass this launches the captured graph).
    fn segment_end(&mut self) -> Result<()>;
    /// Abandon the open segment after an error (a capture in progress is discarded).
    fn segment_abort(&mut self);
}

/// NUMERIC-CLASS door MEMRA_NCCL_ALLREDUCE: NCCL's all-reduce (sum), in NCCL's order.
pub trait AllReduce {
    /// The sum of one vector per rank: `parts` holds exactly one `(rank, slice)` per rank, all of
    /// `out.len` elements; `out` on `out_rank` receives the sum, and every other rank's part is
    /// overwritten with it. Ordered like a copy: after each rank's earlier work, before
    /// `out_rank`'s later work.
    fn all_reduce_sum(&mut self, parts: &[(usize, Slice)], out_rank: usize, out: Slice) -> Result<()>;
}

/// CANARY SkipFence: a copy that does NOT wait for the source rank's earlier work — a planted
/// race. Only a backend whose copies can be separated from their producer fence has it.
pub trait UnfencedCopies {
    fn copy_unfenced(&mut self, c: Transfer) -> Result<()>;
}

/// The optional capabilities, named for their refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    PeerStores,
    PackedCopies,
    Graphs,
    AllReduce,
    UnfencedCopies,
}

impl Capability {
    /// The mechanism's name in a refusal.
    pub fn mechanism(self) -> &'static str {
        match self {
            Capability::PeerStores => "peer stores",
            Capability::PackedCopies => "packed copies",
            Capability::Graphs => "graph capture",
            Capability::AllReduce => "NCCL all-reduce",
            Capability::UnfencedCopies => "unfenced copies",
        }
    }

    /// The refusal of a backend (`describe()`) that lacks this capability, naming the door that
    /// needs it.
    pub fn refused(self, backend: String) -> RuntimeError {
        let why = match self {
            Capability::PeerStores => "has no peer stores (MEMRA_OPROJ_DIRECT / MEMRA_MOE_DIRECT need a kernel that writes into another rank's memory)",
            Capability::PackedCopies => "has no packed copies (MEMRA_STEP_TP_BULK_P2P needs the CUDA backend over native-p2p)",
            Capability::Graphs => "cannot capture graphs (MEMRA_STEP_TP_GRAPH needs the CUDA backend)",
            Capability::AllReduce => "has no NCCL all-reduce (MEMRA_NCCL_ALLREDUCE needs the CUDA backend with the nccl transport)",
            Capability::UnfencedCopies => "has no producer fence to skip (the skip_fence canary needs device streams)",
        };
        let rule = format!("{backend}: this backend {why}");
        RuntimeError::Unsupported { backend, mechanism: self.mechanism(), rule }
    }
}

/// `pub fn $name(b) -> Result<&mut dyn $trait>`: `b`'s capability, or its one refusal naming `b`.
/// (Asked twice: a `None` branch cannot describe `b` while the first borrow is alive.)
macro_rules! accessor {
    ($(#[$doc:meta])* $name:ident, $trait:ident) => {
        $(#[$doc])*
        pub fn $name<B: Backend + ?Sized>(b: &mut B) -> Result<&mut dyn $trait> {
            if b.$name().is_none() {
                return Err(Capability::$trait.refused(b.describe()));
            }
            Ok(b.$name().expect("checked just above"))
        }
    };
}

accessor!(
    /// `b`'s peer stores, or the refusal naming `b`.
    peer_stores,
    PeerStores
);
accessor!(
    /// `b`'s packed copies, or the refusal naming `b`.
    packed_copies,
    PackedCopies
);
accessor!(
    /// `b`'s graph segments, or the refusal naming `b`.
    graphs,
    Graphs
);
accessor!(
    /// `b`'s NCCL all-reduce, or the refusal naming `b`.
    all_reduce,
    AllReduce
);
accessor!(
    /// `b`'s unfenced copies, or the refusal naming `b`.
    unfenced_copies,
    UnfencedCopies
);
