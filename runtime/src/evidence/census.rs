//! The census: what a backend really did, counted where it calls the driver or its host arena
//! (docs/DESIGN.md §4.2, engagement). The program's call-site counters (`Ctx::count`) say what
//! the program *asked* for; the census says what the backend *carried out* — launches per
//! kernel, copies per transport and byte size, where each cross-rank copy sits in its source's
//! stream, peer stores, packed copies, all-reduces, graph replays, doorbells, merged launches.
//! A door declares in `gates/doors.toml` the census change it must cause against the same
//! configuration with the door off, and the engagement gate compares the two censuses: a door
//! whose mechanism silently fell back leaves the census unchanged, whatever its call site counted.
//!
//! Every backend keeps its census with one [`CensusCounter`] and names kernels with the one
//! function `Op::kernel` (`backend/op/facts.rs`), so the host, CUDA and distributed backends count exactly alike.
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

/// Census counters: `<family>.<detail>` → count (module docs).
pub type Census = BTreeMap<String, u64>;

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

/// One backend's census, and the last kernel each rank issued (for `copy_after`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CensusCounter {
    counts: Census,
    last_launch: Vec<Option<String>>,
}

impl CensusCounter {
    pub fn new(ranks: usize) -> CensusCounter {
        CensusCounter { counts: Census::new(), last_launch: vec![None; ranks] }
    }

    fn bump(&mut self, key: String, n: u64) {
        *self.counts.entry(key).or_insert(0) += n;
    }

    fn rank_slot(&mut self, rank: usize) -> &mut Option<String> {
        if self.last_launch.len() <= rank {
            self.last_launch.resize(rank + 1, None);
        }
        &mut self.last_launch[rank]
    }

    /// A kernel issued on `rank`.
    pub fn launch(&mut self, rank: usize, kernel: String) {
        self.bump(format!("launch.{kernel}"), 1);
        *self.rank_slot(rank) = Some(kernel);
    }

    /// A direct-join kernel on `rank` that stored into another rank's memory.
    pub fn peer_store(&mut self, rank: usize, kernel: String) {
        self.bump(format!("peer_store.{kernel}"), 1);
        *self.rank_slot(rank) = Some(kernel);
    }

    /// A copy of `elements` f32 from `src_rank` to `dst_rank` over `transport`.
    pub fn copy(&mut self, transport: &str, src_rank: usize, dst_rank: usize, elements: usize) {
        if src_rank == dst_rank {
            self.bump(format!("copy.local.{}", elements * 4), 1);
            return;
        }
        self.bump(format!("copy.{transport}.{}", elements * 4), 1);
        let after = self.rank_slot(src_rank).clone().unwrap_or_else(|| "none".to_string());
        self.bump(format!("copy_after.{after}"), 1);
    }

    /// A copy issued without waiting for its producer (the skip-fence canary).
    pub fn unfenced_copy(&mut self, transport: &str, elements: usize) {
        self.bump(format!("unfenced_copy.{transport}.{}", elements * 4), 1);
    }

    /// One strided copy of `blocks` blocks of `elements` f32 each.
    pub fn packed_copy(&mut self, transport: &str, blocks: usize, elements: usize) {
        self.bump(format!("packed_copy.{transport}.{blocks}x{}", elements * 4), 1);
    }

    /// A host write of `elements` f32 into a rank's memory (`Backend::write`).
    pub fn host_write(&mut self, elements: usize) {
        self.bump(format!("write.{}", elements * 4), 1);
    }

    /// A host read of `elements` f32 from a rank's memory (`Backend::read`).
    pub fn host_read(&mut self, elements: usize) {
        self.bump(format!("read.{}", elements * 4), 1);
    }

    /// One NCCL all-reduce of `elements` f32 per rank.
    pub fn all_reduce(&mut self, elements: usize) {
        self.bump(format!("all_reduce.{}", elements * 4), 1);
    }

    /// A mechanism counter of [`MECHANISMS`] (or `defect.<name>`), `n` times.
    pub fn mechanism(&mut self, name: &str, n: u64) {
        if n > 0 {
            self.bump(name.to_string(), n);
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> Census {
        self.counts.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_reads_and_writes_are_counted_so_a_read_write_fallback_shows() {
        // A cross-rank copy, and the same bytes moved by a host read and a write instead: the two
        // censuses differ in every family involved, so a door declaring `copy.*` cannot be
        // satisfied by the fallback.
        let mut copy = CensusCounter::new(2);
        copy.copy("native-p2p", 0, 1, 4);
        let mut fallback = CensusCounter::new(2);
        fallback.host_read(4);
        fallback.host_write(4);
        assert_eq!(fallback.counts().get("read.16"), Some(&1));
        assert_eq!(fallback.counts().get("write.16"), Some(&1));
        assert!(fallback.counts().keys().all(|k| !k.starts_with("copy")));
        assert_ne!(copy.counts(), fallback.counts());
        assert!(FAMILIES.contains(&"read") && FAMILIES.contains(&"write"));
    }

    #[test]
    fn copies_are_counted_by_transport_size_and_place_in_the_source_stream() {
        let mut c = CensusCounter::new(2);
        c.copy("native-p2p", 0, 1, 3);
        c.launch(0, "rmsnorm".into());
        c.copy("native-p2p", 0, 1, 3);
        c.copy("host-bounce", 1, 1, 5);
        let want: Census = [
            ("copy.native-p2p.12", 2),
            ("copy_after.none", 1),
            ("copy_after.rmsnorm", 1),
            ("copy.local.20", 1),
            ("launch.rmsnorm", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(c.counts(), want);
    }
}
