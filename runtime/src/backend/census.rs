//! The one census counter every backend keeps where it calls its driver or arena
//! ([`crate::evidence::census`]: the counter names and why they are counted). Its constructor and
//! mutators are visible only inside `runtime/src/backend/`, so the program cannot make a census or
//! add a counter to one (a fallback adding the counter its door is witnessed by does not compile);
//! it gets a backend's census only through `Witness::census`, read-only.

use crate::evidence::census::{Census, Counts};

/// One backend's census, and the last kernel each rank issued (for `copy_after`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(in crate::backend) struct CensusCounter {
    counts: Counts,
    last_launch: Vec<Option<String>>,
}

impl CensusCounter {
    pub(in crate::backend) fn new(ranks: usize) -> CensusCounter {
        CensusCounter { counts: Counts::new(), last_launch: vec![None; ranks] }
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
    pub(in crate::backend) fn launch(&mut self, rank: usize, kernel: String) {
        self.bump(format!("launch.{kernel}"), 1);
        *self.rank_slot(rank) = Some(kernel);
    }

    /// A direct-join kernel on `rank` that stored into another rank's memory.
    pub(in crate::backend) fn peer_store(&mut self, rank: usize, kernel: String) {
        self.bump(format!("peer_store.{kernel}"), 1);
        *self.rank_slot(rank) = Some(kernel);
    }

    /// A copy of `elements` f32 from `src_rank` to `dst_rank` over `transport`.
    pub(in crate::backend) fn copy(&mut self, transport: &str, src_rank: usize, dst_rank: usize, elements: usize) {
        if src_rank == dst_rank {
            self.bump(format!("copy.local.{}", elements * 4), 1);
            return;
        }
        self.bump(format!("copy.{transport}.{}", elements * 4), 1);
        let after = self.rank_slot(src_rank).clone().unwrap_or_else(|| "none".to_string());
        self.bump(format!("copy_after.{after}"), 1);
    }

    /// A copy issued without waiting for its producer (the skip-fence canary).
    pub(in crate::backend) fn unfenced_copy(&mut self, transport: &str, elements: usize) {
        self.bump(format!("unfenced_copy.{transport}.{}", elements * 4), 1);
    }

    /// One strided copy of `blocks` blocks of `elements` f32 each.
    pub(in crate::backend) fn packed_copy(&mut self, transport: &str, blocks: usize, elements: usize) {
        self.bump(format!("packed_copy.{transport}.{blocks}x{}", elements * 4), 1);
    }

    /// A host write of `elements` f32 into a rank's memory (`Backend::write`).
    pub(in crate::backend) fn host_write(&mut self, elements: usize) {
        self.bump(format!("write.{}", elements * 4), 1);
    }

    /// A host read of `elements` f32 from a rank's memory (`Backend::read`).
    pub(in crate::backend) fn host_read(&mut self, elements: usize) {
        self.bump(format!("read.{}", elements * 4), 1);
    }

    /// One NCCL all-reduce of `elements` f32 per rank.
    pub(in crate::backend) fn all_reduce(&mut self, elements: usize) {
        self.bump(format!("all_reduce.{}", elements * 4), 1);
    }

    /// A mechanism counter of [`MECHANISMS`] (or `defect.<name>`), `n` times.
    pub(in crate::backend) fn mechanism(&mut self, name: &str, n: u64) {
        if n > 0 {
            self.bump(name.to_string(), n);
        }
    }

    /// The counts so far, as the read-only census the program and the gates see.
    pub(in crate::backend) fn counts(&self) -> Census {
        Census::counted(self.counts.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::census::FAMILIES;

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
        let want: Counts = [
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
