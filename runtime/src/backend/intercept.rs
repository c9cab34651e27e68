//! A backend around another whose calls a test watches or changes: the integration tests'
//! recorders and counters, and the planted defects that replace a mechanism (a copy done as a host
//! read + write, a misplaced peer store). [`Intercepted`] forwards every call of [`Backend`],
//! [`Witness`] and the capabilities to its inner backend — the same calls, in the same order —
//! except the ones its [`Hooks`] override; a hook gets the inner backend and decides what reaches
//! it. Written once here so that every wrapper forwards the whole interface (a hand-written one
//! that forgot a call silently took the trait's default instead). The capabilities a hook cannot
//! see — graphs, all-reduce, unfenced copies — are not offered: a wrapped run takes the plain
//! path there, as it did under every hand-written wrapper.

use super::capability::{self, PackedCopies, PeerStores};
use super::{
    Backend, BufId, Checkpoint, Collected, DigestPart, GroupEntry, GroupId, JoinFence, Op, Packed, ProbeResult, Slice,
    Transfer, WeightId,
};
use crate::config::Transport;
use crate::evidence::census::Census;
use crate::evidence::defect::TwinDefect;
use crate::evidence::witness::Witness;
use crate::model::matrix::MatrixShard;
use crate::Result;

/// The calls a wrapper may watch or change; each default forwards to the inner backend.
pub trait Hooks<B: Backend> {
    fn alloc(&mut self, inner: &mut B, rank: usize, len: usize) -> Result<BufId> {
        inner.alloc(rank, len)
    }
    fn read(&mut self, inner: &mut B, rank: usize, src: Slice) -> Result<Vec<f32>> {
        inner.read(rank, src)
    }
    fn write(&mut self, inner: &mut B, rank: usize, dst: Slice, data: &[f32]) -> Result<()> {
        inner.write(rank, dst, data)
    }
    fn launch(&mut self, inner: &mut B, rank: usize, op: Op) -> Result<()> {
        inner.launch(rank, op)
    }
    fn copy(&mut self, inner: &mut B, c: Transfer) -> Result<()> {
        inner.copy(c)
    }
    fn digest_batch(&mut self, inner: &mut B, rank: usize, groups: &[Vec<DigestPart>]) -> Result<Vec<Vec<usize>>> {
        inner.digest_batch(rank, groups)
    }
    fn collect(&mut self, inner: &mut B) -> Result<Collected> {
        inner.collect()
    }
    /// A peer store (only called where the inner backend has them).
    fn launch_peer_store(
        &mut self,
        inner: &mut B,
        rank: usize,
        op: Op,
        out_rank: usize,
        fence: JoinFence,
    ) -> Result<()> {
        capability::peer_stores(inner)?.launch_peer_store(rank, op, out_rank, fence)
    }
    /// A packed copy (only called where the inner backend has them).
    fn copy_packed(
        &mut self,
        inner: &mut B,
        transport: Transport,
        src_rank: usize,
        dst_rank: usize,
        p: Packed,
    ) -> Result<()> {
        capability::packed_copies(inner)?.copy_packed(transport, src_rank, dst_rank, p)
    }
}

/// `inner` with its calls passed through `hooks` (module docs).
pub struct Intercepted<B, H> {
    pub inner: B,
    pub hooks: H,
}

impl<B: Backend, H: Hooks<B>> Intercepted<B, H> {
    pub fn new(inner: B, hooks: H) -> Intercepted<B, H> {
        Intercepted { inner, hooks }
    }
}

impl<B: Backend, H: Hooks<B>> Backend for Intercepted<B, H> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn ranks(&self) -> usize {
        self.inner.ranks()
    }
    fn upload_weight(&mut self, rank: usize, shard: &MatrixShard) -> Result<WeightId> {
        self.inner.upload_weight(rank, shard)
    }
    fn upload_weight_owned(&mut self, rank: usize, shard: MatrixShard) -> Result<WeightId> {
        self.inner.upload_weight_owned(rank, shard)
    }
    fn register_experts(&mut self, rank: usize, experts: usize, entries: &[Option<GroupEntry>]) -> Result<GroupId> {
        self.inner.register_experts(rank, experts, entries)
    }
    fn alloc(&mut self, rank: usize, len: usize) -> Result<BufId> {
        self.hooks.alloc(&mut self.inner, rank, len)
    }
    fn write(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()> {
        self.hooks.write(&mut self.inner, rank, dst, data)
    }
    fn read(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>> {
        self.hooks.read(&mut self.inner, rank, src)
    }
    fn launch(&mut self, rank: usize, op: Op) -> Result<()> {
        self.hooks.launch(&mut self.inner, rank, op)
    }
    fn copy(&mut self, c: Transfer) -> Result<()> {
        self.hooks.copy(&mut self.inner, c)
    }
    fn digest(&mut self, rank: usize, src: Slice, base: u64) -> Result<usize> {
        self.inner.digest(rank, src, base)
    }
    fn digest_batch(&mut self, rank: usize, groups: &[Vec<DigestPart>]) -> Result<Vec<Vec<usize>>> {
        self.hooks.digest_batch(&mut self.inner, rank, groups)
    }
    fn mark(&mut self) -> Result<()> {
        self.inner.mark()
    }
    fn collect(&mut self) -> Result<Collected> {
        self.hooks.collect(&mut self.inner)
    }
    fn probe(&mut self, transport: Transport, sizes_bytes: &[usize]) -> Result<Vec<ProbeResult>> {
        self.inner.probe(transport, sizes_bytes)
    }
    fn copy_bandwidth(&mut self, bytes: usize) -> Result<Option<f64>> {
        self.inner.copy_bandwidth(bytes)
    }
    fn checkpoint(&self) -> Option<Checkpoint> {
        self.inner.checkpoint()
    }
    fn first_run_begins(&mut self) {
        self.inner.first_run_begins()
    }
    fn rewind(&mut self, to: &Checkpoint) -> Result<()> {
        self.inner.rewind(to)
    }
    fn peer_stores(&mut self) -> Option<&mut dyn PeerStores> {
        self.inner.peer_stores().is_some().then_some(self as &mut dyn PeerStores)
    }
    fn packed_copies(&mut self) -> Option<&mut dyn PackedCopies> {
        self.inner.packed_copies().is_some().then_some(self as &mut dyn PackedCopies)
    }
}

impl<B: Backend, H: Hooks<B>> Witness for Intercepted<B, H> {
    fn census(&self) -> Census {
        self.inner.census()
    }
    fn plant(&mut self, d: TwinDefect) -> Result<()> {
        self.inner.plant(d)
    }
    fn engagement(&self) -> Vec<(String, u64)> {
        self.inner.engagement()
    }
}

impl<B: Backend, H: Hooks<B>> PeerStores for Intercepted<B, H> {
    fn launch_peer_store(&mut self, rank: usize, op: Op, out_rank: usize, fence: JoinFence) -> Result<()> {
        self.hooks.launch_peer_store(&mut self.inner, rank, op, out_rank, fence)
    }
}

impl<B: Backend, H: Hooks<B>> PackedCopies for Intercepted<B, H> {
    fn copy_packed(&mut self, transport: Transport, src_rank: usize, dst_rank: usize, p: Packed) -> Result<()> {
        self.hooks.copy_packed(&mut self.inner, transport, src_rank, dst_rank, p)
    }
}
