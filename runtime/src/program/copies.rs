//! Every cross-rank copy of the program, verified: the copy is issued, and its source (on the
//! source rank) and its destination (on the destination rank) join the layer's batched digest
//! as the two sides of a *copy check*. When the step's digests come back, a destination whose
//! digest differs from its source's is a [`CopyFault`] in the record, named by the copy (the
//! seam whose tensor it moved, the ranks, the step) — so a broken broadcast or a racy copy is
//! located at the copy, not at the seam that later consumes the wrong bytes.
//!
//! Both sides are digested at the end of the copy's layer, with the same global base, so they
//! agree exactly when the destination holds the source's bytes; the program never overwrites a
//! copy's source or destination later in the same layer (every seam tensor and every joined
//! buffer lives until the layer ends), so the check reads what the copy moved.

use super::Ctx;
use crate::backend::{capability, DigestPart, JoinFence, Packed, Slice, Transfer};
use crate::evidence::record::{CopyFault, Seam};
use crate::Result;

/// One checked copy of the current step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CopyCheck {
    /// The lane of the pass whose tensor moved (rows and columns).
    lane: usize,
    layer: usize,
    seam: Seam,
    src_rank: usize,
    dst_rank: usize,
}

impl Ctx<'_> {
    /// Copy `src` of `src_rank` to `dst` of `dst_rank` over the run's transport, and check the
    /// destination when the ranks differ. `seam`: the seam whose tensor moves.
    /// With several lanes, a tensor whose lanes sit back to back on both sides (a whole lane
    /// block each) moves in one copy; each lane's destination is still checked on its own.
    pub fn copy(&mut self, seam: Seam, src_rank: usize, src: Slice, dst_rank: usize, dst: Slice) -> Result<()> {
        let lanes = self.lane_transfers(Transfer::new(self.cfg.transport, (src_rank, src), (dst_rank, dst)));
        let n = lanes.len();
        let back_to_back = |rank: usize, s: Slice| self.buffers.lane_stride(rank, s) == s.len;
        let in_order = self.active.iter().enumerate().all(|(i, &l)| i == l);
        if n > 1 && in_order && back_to_back(src_rank, src) && back_to_back(dst_rank, dst) {
            let whole = |s: Slice| Slice::new(s.buf, s.offset, n * s.len);
            self.backend.copy(Transfer::new(self.cfg.transport, (src_rank, whole(src)), (dst_rank, whole(dst))))?;
        } else {
            for (_, t) in &lanes {
                self.backend.copy(*t)?;
            }
        }
        for (l, t) in lanes {
            let (from, to) = (DigestPart::plain(t.from.1, 0), DigestPart::plain(t.to.1, 0));
            self.check_copy(l, seam, (src_rank, from), (dst_rank, to));
        }
        Ok(())
    }

    /// The skip-fence canary's copy (no producer fence), checked like any other.
    pub fn copy_unfenced(
        &mut self,
        seam: Seam,
        src_rank: usize,
        src: Slice,
        dst_rank: usize,
        dst: Slice,
    ) -> Result<()> {
        for (l, t) in self.lane_transfers(Transfer::new(self.cfg.transport, (src_rank, src), (dst_rank, dst))) {
            capability::unfenced_copies(self.backend)?.copy_unfenced(t)?;
            self.check_copy(
                l,
                seam,
                (src_rank, DigestPart::plain(t.from.1, 0)),
                (dst_rank, DigestPart::plain(t.to.1, 0)),
            );
        }
        Ok(())
    }

    /// SEL_MIRROR: `src` of the root to `dst` of `dst_rank` as ONE mirror launch per lane — a
    /// byte-copy kernel the root runs with its output in `dst_rank`'s memory (a peer store, with a
    /// direct join's two event fences) — checked like a copy.
    pub fn mirror(&mut self, seam: Seam, src: Slice, dst_rank: usize, dst: Slice) -> Result<()> {
        for l in self.active.clone() {
            let (from, to) = (self.at_lane(0, src, l), self.at_lane(dst_rank, dst, l));
            let op = crate::backend::Op::MirrorSel { src: from, out: to };
            capability::peer_stores(self.backend)?.launch_peer_store(0, op, dst_rank, JoinFence::Events)?;
            self.count("sel_mirror.mirror_launches");
            self.check_copy(l, seam, (0, DigestPart::plain(from, 0)), (dst_rank, DigestPart::plain(to, 0)));
        }
        Ok(())
    }

    /// One packed copy of `p.blocks` blocks, every block checked (block i with base i·len on
    /// both sides).
    pub fn copy_packed(&mut self, seam: Seam, src_rank: usize, dst_rank: usize, p: Packed) -> Result<()> {
        for l in self.active.clone() {
            let p = self.lane_packed(src_rank, dst_rank, p, l);
            self.copy_packed_lane(l, seam, src_rank, dst_rank, p)?;
        }
        Ok(())
    }

    fn copy_packed_lane(&mut self, lane: usize, seam: Seam, src_rank: usize, dst_rank: usize, p: Packed) -> Result<()> {
        capability::packed_copies(self.backend)?.copy_packed(self.cfg.transport, src_rank, dst_rank, p)?;
        let len = p.src.len;
        let side = |s: Slice, pitch: usize| DigestPart {
            src: s,
            blocks: p.blocks,
            pitch,
            base: 0,
            base_pitch: len as u64,
            owned: None,
        };
        self.check_copy(lane, seam, (src_rank, side(p.src, p.src_pitch)), (dst_rank, side(p.dst, p.dst_pitch)));
        Ok(())
    }

    /// Both sides of a copy (already on lane `lane`'s buffers) join the layer's digest.
    fn check_copy(&mut self, lane: usize, seam: Seam, src: (usize, DigestPart), dst: (usize, DigestPart)) {
        if !self.cfg.digests || src.0 == dst.0 {
            return;
        }
        let i = self.checks.len();
        self.checks.push(CopyCheck { lane, layer: self.layer, seam, src_rank: src.0, dst_rank: dst.0 });
        let n = self.record.seams_per_step();
        self.batch.push((lane, n + 2 * i, src.0, src.1));
        self.batch.push((lane, n + 2 * i + 1, dst.0, dst.1));
    }
}

/// One lane's seam row of a pass (wrapping sums over ranks) and each rank's share per seam.
pub(crate) type LaneDigests = (Vec<u64>, Vec<Vec<u64>>);

/// Settle one pass's digest tickets: per lane, the seam row (wrapping sum over ranks) and each
/// rank's share per seam; and the copy checks (faults of live lanes go into the record).
pub(crate) fn settle(ctx: &mut Ctx, digests: &[u64]) -> Vec<LaneDigests> {
    let n = ctx.record.seams_per_step();
    let tp = ctx.placement.tp;
    let mut lanes = vec![(vec![0u64; n], vec![vec![0u64; tp]; n]); ctx.pass.len()];
    let mut sides = vec![(0u64, 0u64); ctx.checks.len()];
    for (lane, idx, rank, tickets) in ctx.pending.drain(..) {
        let v = tickets.iter().fold(0u64, |acc, t| acc.wrapping_add(digests[*t]));
        if idx < n {
            let (row, ranks) = &mut lanes[lane];
            row[idx] = row[idx].wrapping_add(v);
            ranks[idx][rank] = ranks[idx][rank].wrapping_add(v);
        } else {
            let side = &mut sides[(idx - n) / 2];
            if (idx - n).is_multiple_of(2) {
                side.0 = side.0.wrapping_add(v);
            } else {
                side.1 = side.1.wrapping_add(v);
            }
        }
    }
    for (c, (src, dst)) in ctx.checks.drain(..).zip(sides) {
        let lane = ctx.pass[c.lane];
        if !lane.live {
            continue;
        }
        ctx.record.copies_verified += 1;
        if src != dst {
            ctx.record.copy_faults.push(CopyFault {
                prompt: lane.prompt,
                step: lane.step,
                layer: c.layer,
                seam: c.seam,
                src_rank: c.src_rank,
                dst_rank: c.dst_rank,
            });
        }
    }
    lanes
}

/// Root → every other rank (the replicated rows of attn_norm and ffn_norm), each copy checked.
/// The broken-broadcast canary corrupts the copy to the last rank at layer 0, step 0.
pub(super) fn broadcast(
    ctx: &mut Ctx,
    seam: Seam,
    src: Slice,
    dst: impl Fn(&super::buffers::RankBuffers) -> Slice,
) -> Result<()> {
    let tp = ctx.placement.tp;
    for r in 1..tp {
        let d = dst(&ctx.buffers.ranks[r]);
        ctx.copy(seam, 0, src, r, d)?;
        let broken = ctx.cfg.doors.canary == Some(crate::config::Canary::BrokenBroadcast)
            && r == tp - 1
            && ctx.layer == 0
            && seam == Seam::AttnNorm;
        if broken {
            ctx.lanes_where(
                |lane| lane.live && lane.step == 0,
                |ctx| {
                    ctx.launch(r, crate::backend::Op::FlipLowBit { x: d.sub(0, 1) })?;
                    ctx.count("canary_broken_broadcast.corrupted_copies");
                    Ok(())
                },
            )?;
        }
    }
    Ok(())
}
