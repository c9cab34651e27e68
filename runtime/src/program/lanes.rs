//! Rows and columns (docs/DESIGN.md §3.6): one pass issues the single-token program once for
//! every lane — a row (one session's next token) or a column (one of T consecutive tokens of one
//! session). The layer code is written for lane 0; every launch, copy, store and read goes
//! through the wrappers here, which move it to each active lane's buffers
//! ([`Buffers::shift`](super::buffers::Buffers::shift)) and hand the lanes of a launch to the
//! backend together ([`Backend::launch_lanes`](crate::backend::Backend::launch_lanes)), where a
//! device may read each weight once for all of them. So every lane computes exactly the
//! single-token program's operands in its order — what the batch-invariance and verify = decode
//! gates check — and a data-dependent path (a route read on the host, a capture) narrows the
//! active lanes to one with [`Ctx::each_lane`].

use super::Ctx;
use crate::backend::{capability, DigestPart, JoinFence, Op, Packed, Slice, Transfer};
use crate::error::RuntimeError;
use crate::evidence::coverage::SeamPoint;
use crate::Result;

/// One lane of a pass: the session (prompt) and step it computes. A padding lane (`live` false)
/// keeps a finished row's place so the rows after it keep theirs; it computes and is discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lane {
    pub prompt: usize,
    pub step: usize,
    pub live: bool,
}

impl Ctx<'_> {
    /// Lane `lane`'s copy of `op`, every slice on `rank`.
    fn lane_op(&self, rank: usize, op: &Op, lane: usize) -> Op {
        let mut op = op.clone();
        op.map_slices(|s| *s = self.buffers.shift(rank, *s, lane));
        op
    }

    /// Lane `lane`'s copy of a slice of `rank`.
    pub fn at_lane(&self, rank: usize, s: Slice, lane: usize) -> Slice {
        self.buffers.shift(rank, s, lane)
    }

    /// Launch `op` (written for lane 0) on `rank` for every active lane: one launch for a
    /// single lane, the lanes together otherwise.
    pub fn launch(&mut self, rank: usize, op: Op) -> Result<()> {
        if self.active == [0] {
            return self.backend.launch(rank, op);
        }
        let ops: Vec<Op> = self.active.iter().map(|&l| self.lane_op(rank, &op, l)).collect();
        match <[Op; 1]>::try_from(ops) {
            Ok([one]) => self.backend.launch(rank, one),
            Err(ops) => self.backend.launch_lanes(rank, ops),
        }
    }

    /// Launch `op` (written for lane 0) on `rank` once per active lane, each its own launch —
    /// the per-lane path of an op whose multi-lane launch is a door (DECODE_V2's attention).
    pub fn launch_each(&mut self, rank: usize, op: Op) -> Result<()> {
        for l in self.active.clone() {
            let op = self.lane_op(rank, &op, l);
            self.backend.launch(rank, op)?;
        }
        Ok(())
    }

    /// A direct join's peer store of `op` (its inputs on `rank`) into `dst` of the root, for
    /// every active lane.
    pub fn peer_store(&mut self, rank: usize, op: Op, dst: Slice, fence: JoinFence) -> Result<()> {
        for l in self.active.clone() {
            let op = self.lane_op(rank, &op, l).with_store_target(self.at_lane(0, dst, l));
            capability::peer_stores(self.backend)?.launch_peer_store(rank, op, 0, fence)?;
        }
        Ok(())
    }

    /// NCCL_ALLREDUCE of every rank's `sums` into `out` of `root`, for every active lane.
    pub fn all_reduce(&mut self, sums: &[(usize, Slice)], root: usize, out: Slice) -> Result<()> {
        for l in self.active.clone() {
            let lane_sums: Vec<(usize, Slice)> = sums.iter().map(|&(r, s)| (r, self.at_lane(r, s, l))).collect();
            let out = self.at_lane(root, out, l);
            capability::all_reduce(self.backend)?.all_reduce_sum(&lane_sums, root, out)?;
        }
        Ok(())
    }

    /// Read `src` of `rank` for the one active lane (host reads happen lane by lane).
    pub fn read_lane(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>> {
        let [lane] = self.active[..] else {
            return Err(RuntimeError::Contract(format!(
                "a host read of {src:?} on rank {rank} with {} active lanes: read inside Ctx::each_lane",
                self.active.len()
            )));
        };
        let s = self.at_lane(rank, src, lane);
        self.backend.read(rank, s)
    }

    /// Write `data` into `dst` of `rank` for the one active lane (host writes, like host reads,
    /// happen lane by lane).
    pub fn write_lane(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()> {
        let [lane] = self.active[..] else {
            return Err(RuntimeError::Contract(format!(
                "a host write of {dst:?} on rank {rank} with {} active lanes: write inside Ctx::each_lane",
                self.active.len()
            )));
        };
        let d = self.at_lane(rank, dst, lane);
        self.backend.write(rank, d, data)
    }

    /// Where the one active lane is: layer `layer`, seam `seam` (the program's own coverage).
    pub fn lane_point(&self, layer: usize, seam: crate::evidence::record::Seam) -> SeamPoint {
        let lane = self.pass[self.active[0]];
        SeamPoint { prompt: lane.prompt, step: lane.step, layer, seam }
    }

    /// Issue `calls` once per active lane, that lane alone active (paths whose launches depend
    /// on data read on the host, per lane).
    pub fn each_lane(&mut self, mut calls: impl FnMut(&mut Self) -> Result<()>) -> Result<()> {
        let all = std::mem::take(&mut self.active);
        let mut out = Ok(());
        for &l in &all {
            self.active = vec![l];
            out = calls(self);
            if out.is_err() {
                break;
            }
        }
        self.active = all;
        out
    }

    /// Issue `calls` for the active lanes that `keep` selects (nothing when none is).
    pub fn lanes_where(
        &mut self,
        keep: impl Fn(&Lane) -> bool,
        calls: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let all = self.active.clone();
        let chosen: Vec<usize> = all.iter().copied().filter(|&l| keep(&self.pass[l])).collect();
        if chosen.is_empty() {
            return Ok(());
        }
        self.active = chosen;
        let out = calls(self);
        self.active = all;
        out
    }

    /// Whether any active live lane satisfies `f`.
    pub fn any_lane(&self, f: impl Fn(&Lane) -> bool) -> bool {
        self.active.iter().any(|&l| self.pass[l].live && f(&self.pass[l]))
    }

    /// Copies of a transfer for every active lane.
    pub(super) fn lane_transfers(&self, t: Transfer) -> Vec<(usize, Transfer)> {
        let (sr, ss) = t.from;
        let (dr, ds) = t.to;
        self.active
            .iter()
            .map(|&l| (l, Transfer::new(t.transport, (sr, self.at_lane(sr, ss, l)), (dr, self.at_lane(dr, ds, l)))))
            .collect()
    }

    /// A packed copy moved to lane `l`.
    pub(super) fn lane_packed(&self, src_rank: usize, dst_rank: usize, p: Packed, l: usize) -> Packed {
        Packed { src: self.at_lane(src_rank, p.src, l), dst: self.at_lane(dst_rank, p.dst, l), ..p }
    }

    /// A digest part of `rank` moved to lane `l` (its route too, for owned slots).
    pub(super) fn lane_part(&self, rank: usize, mut p: DigestPart, l: usize) -> DigestPart {
        p.src = self.at_lane(rank, p.src, l);
        if let Some(o) = p.owned.as_mut() {
            o.route = self.at_lane(rank, o.route, l);
        }
        p
    }
}
