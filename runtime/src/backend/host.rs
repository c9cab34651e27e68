//! The host backend: every rank is a thread with a private arena, and runs the kernel twins.
//!
//! A rank thread executes the commands queued to it in order, like a CUDA stream. Nothing is
//! shared between arenas: a [`Backend::copy`] queues a *send* on the source rank (after its
//! earlier work) and a *receive* on the destination rank (before its later work), so the only
//! cross-rank ordering is the one the program asks for. `host-bounce` moves the bytes through a
//! staging arena (a pool of host buffers standing in for pinned staging memory); `native-p2p`
//! hands them from arena to arena. Both only move bytes.
//!
//! No deadlock is possible: every receive waits for a send that was queued earlier in the single
//! issue order of the driver thread, and a send never waits.

use super::census::{kernel_of, shard_format, Census, CensusCounter};
use super::coverage::{self, Coverage, SeamPoint};
use super::defect::{self, TwinDefect};
use super::host_rows;
use super::{
    Backend, BufId, Collected, DigestPart, GroupEntry, GroupId, JoinFence, Op, ProbeResult, RowOrder, Slice, WeightId,
};
use crate::config::Transport;
use crate::error::RuntimeError;
use crate::model::matrix::MatrixShard;
use crate::Result;
use memra_kernels::twins::{attention, digest, experts, gemv, moe, norm};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// One rank's private memory.
struct Arena {
    bufs: Vec<Vec<f32>>,
    weights: Vec<MatrixShard>,
    /// Expert groups: (routed experts, entries).
    groups: Vec<(usize, Vec<Option<GroupEntry>>)>,
    marks_ns: Vec<u64>,
    epoch: Instant,
    /// Coverage counters of the ops this rank ran (`coverage`), and the E4M3 code statistics of
    /// each weight, computed on first use.
    coverage: Coverage,
    code_stats: Vec<Option<(u64, u64, u64)>>,
}

/// What an op's execution observes besides its operands: where the program was when it was
/// issued (coverage's first places) and the planted twin defect, if any.
#[derive(Debug, Clone, Copy)]
struct Observe {
    at: Option<SeamPoint>,
    defect: Option<TwinDefect>,
}

type Command = Box<dyn FnOnce(&mut Arena) + Send>;

struct RankWorker {
    queue: Option<Sender<Command>>,
    thread: Option<JoinHandle<()>>,
    /// Driver-side copy of buffer lengths, so slices are checked before anything is queued.
    buf_lens: Vec<usize>,
    /// Driver-side storage names of the rank's weights and expert groups (census kernel names).
    weight_formats: Vec<&'static str>,
    group_formats: Vec<&'static str>,
}

impl RankWorker {
    fn n_weights(&self) -> usize {
        self.weight_formats.len()
    }
}

/// CPU ranks as threads with private arenas.
pub struct HostBackend {
    ranks: Vec<RankWorker>,
    /// Bytes allocated in all arenas, and the most this process may take (the memory available
    /// at construction): an allocation beyond it is an out-of-memory error, never an abort.
    allocated_bytes: usize,
    memory_limit_bytes: usize,
    staging_pool: Arc<Mutex<Vec<Vec<f32>>>>,
    digests: Arc<Mutex<Vec<u64>>>,
    n_tickets: usize,
    /// What was issued (the census), where the program is, and the planted defect.
    census: CensusCounter,
    position: Option<SeamPoint>,
    defect: Option<TwinDefect>,
    /// Fault injection ([`HostBackend::corrupt_copies_up_to`]): cross-rank copies of at most this
    /// many bytes arrive with the lowest bit of their first element flipped.
    corrupt_up_to_bytes: usize,
}

impl HostBackend {
    pub fn new(n_ranks: usize) -> Result<HostBackend> {
        crate::config::check_tp(n_ranks)?;
        let mut ranks = Vec::with_capacity(n_ranks);
        for r in 0..n_ranks {
            let (tx, rx) = channel::<Command>();
            let thread = std::thread::Builder::new()
                .name(format!("memra-rank{r}"))
                .spawn(move || {
                    let mut arena = Arena {
                        bufs: Vec::new(),
                        weights: Vec::new(),
                        groups: Vec::new(),
                        marks_ns: Vec::new(),
                        epoch: Instant::now(),
                        coverage: coverage::empty(),
                        code_stats: Vec::new(),
                    };
                    for cmd in rx {
                        cmd(&mut arena);
                    }
                })
                .map_err(|e| RuntimeError::Unavailable(format!("cannot start host rank thread {r}: {e}")))?;
            ranks.push(RankWorker {
                queue: Some(tx),
                thread: Some(thread),
                buf_lens: Vec::new(),
                weight_formats: Vec::new(),
                group_formats: Vec::new(),
            });
        }
        Ok(HostBackend {
            ranks,
            allocated_bytes: 0,
            memory_limit_bytes: available_memory_bytes(),
            staging_pool: Arc::new(Mutex::new(Vec::new())),
            digests: Arc::new(Mutex::new(Vec::new())),
            n_tickets: 0,
            census: CensusCounter::new(n_ranks),
            position: None,
            defect: None,
            corrupt_up_to_bytes: 0,
        })
    }

    fn submit(&self, rank: usize, cmd: Command) -> Result<()> {
        let queue = self.ranks[rank].queue.as_ref().expect("rank queue lives until drop");
        queue.send(cmd).map_err(|_| RuntimeError::Device {
            location: format!("host rank {rank}"),
            detail: "the rank thread died (a kernel twin panicked); see stderr".into(),
        })
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        super::check_rank(rank, self.ranks.len())
    }

    fn check_slice(&self, rank: usize, s: Slice, what: &str) -> Result<()> {
        self.check_rank(rank)?;
        let lens = &self.ranks[rank].buf_lens;
        match lens.get(s.buf as usize) {
            Some(&len) if s.offset + s.len <= len => Ok(()),
            Some(&len) => Err(RuntimeError::Contract(format!(
                "{what}: slice {}+{} of buffer {} on rank {rank} exceeds its {len} elements",
                s.offset, s.len, s.buf
            ))),
            None => Err(RuntimeError::Contract(format!("{what}: buffer {} does not exist on rank {rank}", s.buf))),
        }
    }

    fn check_op(&self, rank: usize, op: &Op) -> Result<()> {
        self.check_op_at(rank, op, rank)
    }

    /// Like `check_op`, with the op's store target (listed last by `op_slices`) checked on
    /// `target_rank` (a peer store's destination).
    fn check_op_at(&self, rank: usize, op: &Op, target_rank: usize) -> Result<()> {
        let name = op_name(op);
        let slices = op_slices(op);
        let n = slices.len();
        for (i, s) in slices.into_iter().enumerate() {
            let at = if i + 1 == n && op.store_target().is_some() { target_rank } else { rank };
            self.check_slice(at, s, name)?;
        }
        match op {
            Op::GemvRows { w, .. } | Op::GemvPartials { w, .. } if *w as usize >= self.ranks[rank].n_weights() => {
                Err(RuntimeError::Contract(format!("{name}: weight {w} does not exist on rank {rank}")))
            }
            Op::GemvRowsBatch { items, .. } if items.iter().any(|i| i.0 as usize >= self.ranks[rank].n_weights()) => {
                Err(RuntimeError::Contract(format!("{name}: a weight of {items:?} does not exist on rank {rank}")))
            }
            Op::ExpertGateUp { group, .. }
            | Op::ExpertDown { group, .. }
            | Op::FoldSlots { scales: Some(group), .. }
                if *group as usize >= self.ranks[rank].group_formats.len() =>
            {
                Err(RuntimeError::Contract(format!("{name}: expert group {group} does not exist on rank {rank}")))
            }
            Op::SetU32 { out: pos, .. }
            | Op::QkNormRopeAt { pos, .. }
            | Op::AttentionAt { pos, .. }
            | Op::AppendAt { pos, .. }
            | Op::RopeAppend { pos, .. }
                if pos.len == 0 =>
            {
                Err(RuntimeError::Contract(format!("{name}: the position slice is empty; it must hold one u32")))
            }
            _ => Ok(()),
        }
    }

    /// Fault injection: from now on every cross-rank copy of at most `bytes` bytes arrives with the
    /// lowest bit of its first element flipped — a transport that breaks small payloads (route
    /// ids, one rank's share of a row) while every large copy is intact. 0 turns it off.
    pub fn corrupt_copies_up_to(&mut self, bytes: usize) {
        self.corrupt_up_to_bytes = bytes;
    }

    /// The census name of `op`'s kernel on `rank` (checked ops only).
    fn kernel(&self, rank: usize, op: &Op) -> String {
        let w = &self.ranks[rank];
        kernel_of(
            op,
            |id| w.weight_formats.get(id as usize).copied().unwrap_or("unknown"),
            |g| w.group_formats.get(g as usize).copied().unwrap_or("unknown"),
        )
    }

    /// The planted defect as it applies to `op` (counted in the census when it does).
    fn defect_for(&mut self, op: &Op) -> Option<TwinDefect> {
        let d = self.defect?;
        let applies = match d {
            TwinDefect::RouterTiesToHigherId => matches!(op, Op::Router { device_variant: false, .. }),
            TwinDefect::SumsFromNegativeZero => {
                matches!(op, Op::GemvRows { .. } | Op::GemvRowsBatch { .. } | Op::GemvPartials { .. } | Op::Fold { .. })
            }
            TwinDefect::SiluUnclamped => matches!(op, Op::ExpertGateUp { .. }),
        };
        if applies {
            self.census.mechanism(&format!("defect.{}", d.name()), 1);
        }
        applies.then_some(d)
    }

    /// Wait until every rank has executed everything queued so far.
    fn barrier(&self) -> Result<Vec<Vec<u64>>> {
        let mut replies = Vec::new();
        for r in 0..self.ranks.len() {
            let (tx, rx) = sync_channel::<Vec<u64>>(1);
            self.submit(
                r,
                Box::new(move |a: &mut Arena| {
                    let _ = tx.send(std::mem::take(&mut a.marks_ns));
                }),
            )?;
            replies.push(rx);
        }
        replies
            .into_iter()
            .enumerate()
            .map(|(r, rx)| {
                rx.recv().map_err(|_| RuntimeError::Device {
                    location: format!("host rank {r}"),
                    detail: "the rank thread died before reaching the barrier (a kernel twin panicked)".into(),
                })
            })
            .collect()
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        for w in &mut self.ranks {
            w.queue.take();
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// `MemAvailable` of /proc/meminfo (all of the address space where it cannot be read).
pub(crate) fn available_memory_bytes() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
        })
        .map(|kib| kib.saturating_mul(1024))
        .unwrap_or(usize::MAX)
}

fn read_slice(a: &Arena, s: Slice) -> &[f32] {
    &a.bufs[s.buf as usize][s.offset..s.offset + s.len]
}

fn write_slice(a: &mut Arena, s: Slice, data: &[f32]) {
    a.bufs[s.buf as usize][s.offset..s.offset + s.len].copy_from_slice(data);
}

/// Every slice an op touches (for bounds checks before queueing); an op's store target
/// ([`Op::store_target`]) comes last.
fn op_slices(op: &Op) -> Vec<Slice> {
    match *op {
        Op::GemvRows { x, out, .. } | Op::GemvPartials { x, out, .. } => vec![x, out],
        Op::GemvRowsBatch { ref items, x } => std::iter::once(x).chain(items.iter().map(|i| i.1)).collect(),
        Op::Fold { parts, out, .. } => vec![parts, out],
        Op::Add { a, b, out } => vec![a, b, out],
        Op::Scale { x, out, .. } => vec![x, out],
        Op::RmsNorm { x, w, out, .. } => vec![x, w, out],
        Op::AddRmsNorm { x, a, w, h, out, .. } => vec![x, a, w, h, out],
        Op::FoldAddRmsNorm { parts, x, w, a, h, out, .. } => vec![parts, x, w, a, h, out],
        Op::QkNormRope { x, w, cos_sin, .. } => vec![x, w, cos_sin],
        Op::Attention { q, k, v, gate, out, .. } => vec![q, k, v, gate, out],
        Op::Router { logits, bias, out, .. } => vec![logits, bias, out],
        Op::Swiglu { gate, up, out, .. } => vec![gate, up, out],
        Op::Combine { y, w, out } => vec![y, w, out],
        Op::CombineShared { y, w, out } => vec![y, w, out],
        Op::ResidualAdd { h, a, b, sum, out } => vec![h, a, b, sum, out],
        Op::Argmax { x, out } => vec![x, out],
        Op::FlipLowBit { x } => vec![x],
        Op::SetU32 { out, .. } => vec![out],
        Op::QkNormRopeAt { x, w, table, pos, .. } => vec![x, w, table, pos],
        Op::AttentionAt { q, k, v, gate, pos, out, .. } => vec![q, k, v, gate, pos, out],
        Op::AppendAt { src, cache, pos } => vec![src, cache, pos],
        Op::RopeAppend { q, k, v, q_norm, k_norm, table, pos, q_out, k_out, k_cache, v_cache, .. } => {
            vec![q, k, v, q_norm, k_norm, table, pos, q_out, k_out, k_cache, v_cache]
        }
        Op::ExpertGateUp { route, x, act, .. } => vec![route, x, act],
        Op::ExpertDown { route, act, out, .. } => vec![route, act, out],
        Op::FoldSlots { route, parts, out, .. } => vec![route, parts, out],
        Op::FoldCombine { parts, w, out, .. } => vec![parts, w, out],
        Op::SelectSlots { route, src, out, .. } => vec![route, src, out],
        Op::CombineOwned { route, y, w, out, .. } => vec![route, y, w, out],
    }
}

pub(crate) fn op_name(op: &Op) -> &'static str {
    match op {
        Op::GemvRows { .. } => "gemv_rows",
        Op::GemvRowsBatch { .. } => "gemv_rows_batch",
        Op::GemvPartials { .. } => "gemv_partials",
        Op::Fold { .. } => "fold",
        Op::Add { .. } => "add",
        Op::Scale { .. } => "scale",
        Op::RmsNorm { .. } => "rmsnorm",
        Op::AddRmsNorm { .. } => "add_rmsnorm",
        Op::FoldAddRmsNorm { .. } => "fold_add_rmsnorm",
        Op::QkNormRope { .. } => "qk_norm_rope",
        Op::Attention { .. } => "attention",
        Op::Router { .. } => "router",
        Op::Swiglu { .. } => "swiglu",
        Op::Combine { .. } => "combine",
        Op::CombineShared { .. } => "combine_shared",
        Op::ResidualAdd { .. } => "residual_add",
        Op::Argmax { .. } => "argmax",
        Op::FlipLowBit { .. } => "flip_low_bit",
        Op::SetU32 { .. } => "set_u32",
        Op::QkNormRopeAt { .. } => "qk_norm_rope_at",
        Op::AttentionAt { .. } => "attention_at",
        Op::AppendAt { .. } => "append_at",
        Op::RopeAppend { .. } => "rope_append",
        Op::ExpertGateUp { .. } => "expert_gate_up",
        Op::ExpertDown { .. } => "expert_down",
        Op::FoldSlots { .. } => "fold_slots",
        Op::FoldCombine { .. } => "fold_combine",
        Op::SelectSlots { .. } => "select_slots",
        Op::CombineOwned { .. } => "combine_owned",
    }
}

/// The group entry a slot runs on this rank, if it holds one.
fn slot_group_entry(a: &Arena, group: GroupId, ids: &[f32], s: usize) -> Option<GroupEntry> {
    let (experts, entries) = &a.groups[group as usize];
    experts::slot_entry(ids, s, *experts).and_then(|e| entries.get(e).copied().flatten())
}

/// The most weights (rows × columns) of the matrix `which` over the slots this rank holds.
fn slot_weights(
    a: &Arena,
    group: GroupId,
    ids: &[f32],
    first_slot: usize,
    slots: usize,
    which: impl Fn(&GroupEntry) -> WeightId,
) -> usize {
    (first_slot..first_slot + slots)
        .filter_map(|s| slot_group_entry(a, group, ids, s))
        .map(|e| {
            let w = &a.weights[which(&e) as usize];
            w.out_features * w.in_features
        })
        .max()
        .unwrap_or(0)
}

/// Count the E4M3 codes of weights an expert GEMV reads (statistics computed once per weight).
fn note_codes(a: &mut Arena, weights: &[WeightId], at: Option<SeamPoint>) {
    for &w in weights {
        let i = w as usize;
        if a.code_stats.len() <= i {
            a.code_stats.resize(i + 1, None);
        }
        let (n, max, sub) = *a.code_stats[i].get_or_insert_with(|| coverage::e4m3_code_stats(&a.weights[i]));
        coverage::note(&mut a.coverage, coverage::E4M3_CODES, at, n);
        coverage::note(&mut a.coverage, coverage::E4M3_MAX_CODES, at, max);
        coverage::note(&mut a.coverage, coverage::E4M3_SUBNORMAL_CODES, at, sub);
    }
}

/// A canonical GEMV's sums of −0.0 products only (`partials`: K-block partials): counted, and
/// turned into −0.0 when the sums-from-−0.0 defect is planted.
fn observe_gemv(a: &mut Arena, w: WeightId, x: &[f32], out: &mut [f32], partials: bool, obs: Observe) {
    let at = coverage::negative_zero_sums(&a.weights[w as usize].view(), x, out, partials);
    coverage::note(&mut a.coverage, coverage::NEGATIVE_ZERO_SUMS, obs.at, at.len() as u64);
    if obs.defect == Some(TwinDefect::SumsFromNegativeZero) {
        defect::negate_zero_sums(out, &at);
    }
}

/// The grouped expert ops: the per-slot twins of `kernels/cuda/experts.cu`.
fn execute_experts(a: &mut Arena, op: Op, obs: Observe) {
    match op {
        Op::ExpertGateUp { group, route, first_slot, slots, x, limit, act, act_pitch } => {
            let ids = read_slice(a, route).to_vec();
            let xv = read_slice(a, x).to_vec();
            // The slots' GEMVs on all cores where they are large (`host_rows`); what the SwiGLU
            // reaches is counted and applied in slot order on this rank's thread.
            let arena = &*a;
            let work = slot_weights(arena, group, &ids, first_slot, slots, |e| e.gate);
            let rows = host_rows::per_slot(slots, 2 * work, |j| {
                let e = slot_group_entry(arena, group, &ids, first_slot + j)?;
                let (gw, uw) = (&arena.weights[e.gate as usize], &arena.weights[e.up as usize]);
                let scales = e.nvfp4_scales.map(|[sg, su, _]| (sg, su));
                Some((e, host_rows::gate_up_rows(gw, uw, &xv, scales)))
            });
            for (j, slot) in rows.into_iter().enumerate() {
                let s = first_slot + j;
                let Some((e, (g, u))) = slot else { continue };
                let shared = s >= ids.len();
                let (silu, high, low) = coverage::swiglu_clamps(&g, &u, limit);
                let cov = &mut a.coverage;
                coverage::note(cov, &coverage::swiglu_path("elements", shared), obs.at, g.len() as u64);
                coverage::note(cov, &coverage::swiglu_path("clamp_silu", shared), obs.at, silu);
                coverage::note(cov, &coverage::swiglu_path("clamp_up_high", shared), obs.at, high);
                coverage::note(cov, &coverage::swiglu_path("clamp_up_low", shared), obs.at, low);
                note_codes(a, &[e.gate, e.up], obs.at);
                let swiglu = match obs.defect {
                    Some(TwinDefect::SiluUnclamped) => defect::swiglu_silu_unclamped,
                    _ => memra_kernels::canon::swiglu_c,
                };
                let o: Vec<f32> = g.iter().zip(&u).map(|(&gv, &uv)| swiglu(gv, uv, limit)).collect();
                write_slice(a, Slice::new(act.buf, act.offset + j * act_pitch, o.len()), &o);
            }
        }
        Op::ExpertDown { group, route, first_slot, slots, act, act_pitch, out, out_pitch } => {
            let ids = read_slice(a, route).to_vec();
            let arena = &*a;
            let work = slot_weights(arena, group, &ids, first_slot, slots, |e| e.down);
            let outs = host_rows::per_slot(slots, work, |j| {
                let e = slot_group_entry(arena, group, &ids, first_slot + j)?;
                let d = &arena.weights[e.down as usize];
                let xv = read_slice(arena, Slice::new(act.buf, act.offset + j * act_pitch, d.in_features));
                let n = if d.in_features == 0 { 0 } else { d.in_features / d.kblock_width * d.out_features };
                let mut o = vec![0.0f32; n];
                host_rows::gemv_partials(d, xv, &mut o);
                Some((e, o))
            });
            for (j, slot) in outs.into_iter().enumerate() {
                let Some((e, o)) = slot else { continue };
                note_codes(a, &[e.down], obs.at);
                write_slice(a, Slice::new(out.buf, out.offset + j * out_pitch, o.len()), &o);
            }
        }
        Op::FoldSlots { route, first_slot, slots, parts, parts_pitch, n_parts, owner, scales, out } => {
            let ids = read_slice(a, route).to_vec();
            let width = out.len / slots.max(1);
            for j in 0..slots {
                let s = first_slot + j;
                if s < ids.len() && owner.is_some_and(|o| !o.owns(&ids, s)) {
                    continue;
                }
                let scale = scales
                    .and_then(|g| slot_group_entry(a, g, &ids, s))
                    .and_then(|e| e.nvfp4_scales)
                    .map(|[_, _, sd]| sd);
                let pv = read_slice(a, Slice::new(parts.buf, parts.offset + j * parts_pitch, n_parts * width)).to_vec();
                let mut o = vec![0.0f32; width];
                experts::fold_slot(&pv, n_parts, scale, &mut o);
                write_slice(a, Slice::new(out.buf, out.offset + j * width, width), &o);
            }
        }
        Op::FoldCombine { parts, pitch, n_parts, w, out } => {
            let mut o = vec![0.0f32; out.len];
            experts::fold_combine(read_slice(a, parts), pitch, n_parts, read_slice(a, w), &mut o);
            write_slice(a, out, &o);
        }
        Op::SelectSlots { route, rule, ranks, src, rank_pitch, out } => {
            let ids = read_slice(a, route).to_vec();
            let mut o = read_slice(a, out).to_vec();
            experts::select_slots(&ids, rule, ranks, read_slice(a, src), rank_pitch, &mut o);
            write_slice(a, out, &o);
        }
        Op::CombineOwned { route, owner, y, w, out } => {
            let ids = read_slice(a, route).to_vec();
            let mut o = vec![0.0f32; out.len];
            experts::combine_owned(&ids, owner, read_slice(a, y), read_slice(a, w), &mut o);
            write_slice(a, out, &o);
        }
        other => unreachable!("execute_experts: {} is not a grouped expert op", op_name(&other)),
    }
}

/// The value of one batched digest group on this rank's arena (`digest_batch_f32`'s twin).
fn digest_group(a: &Arena, parts: &[DigestPart]) -> u64 {
    let mut total = 0u64;
    for p in parts {
        let ids = p.owned.map(|o| read_slice(a, o.route).to_vec());
        for i in 0..p.blocks {
            if let (Some(o), Some(ids)) = (p.owned, &ids) {
                if !o.owner.owns(ids, o.first_slot + i) {
                    continue;
                }
            }
            let d = digest::digest_f32(read_slice(a, p.block(i)), p.base + i as u64 * p.base_pitch);
            total = total.wrapping_add(d);
        }
    }
    total
}

/// Run one op's host twin on an arena. Inputs are copied out first, so an op may read and write
/// the same buffer (distinct or identical ranges) exactly like an in-place kernel would.
fn execute(a: &mut Arena, op: Op, obs: Observe) {
    match op {
        Op::GemvRows { w, x, out, order } => {
            let xv = read_slice(a, x).to_vec();
            let mut o = vec![0.0f32; out.len];
            let shard = &a.weights[w as usize];
            host_rows::gemv_rows(shard, &xv, order == RowOrder::Tree, &mut o);
            // Only the canonical order's sums are observed (W8 and the tree are NUMERIC doors).
            if shard.w8_view().is_none() && order == RowOrder::Canonical {
                observe_gemv(a, w, &xv, &mut o, false, obs);
            }
            write_slice(a, out, &o);
        }
        Op::GemvRowsBatch { items, x } => {
            for (w, out) in items {
                execute(a, Op::GemvRows { w, x, out, order: RowOrder::Canonical }, obs);
            }
        }
        Op::GemvPartials { w, x, out } => {
            let xv = read_slice(a, x).to_vec();
            let mut o = vec![0.0f32; out.len];
            let shard = &a.weights[w as usize];
            host_rows::gemv_partials(shard, &xv, &mut o);
            if shard.w8_view().is_none() {
                observe_gemv(a, w, &xv, &mut o, true, obs);
            }
            write_slice(a, out, &o);
        }
        Op::Fold { parts, n_parts, reverse, out } => {
            let mut o = vec![0.0f32; out.len];
            gemv::fold_partials(read_slice(a, parts), n_parts, out.len, reverse, &mut o);
            if obs.defect == Some(TwinDefect::SumsFromNegativeZero) {
                defect::fold_from_negative_zero(read_slice(a, parts), n_parts, &mut o);
            }
            write_slice(a, out, &o);
        }
        Op::Add { a: x, b, out } => {
            let o: Vec<f32> = read_slice(a, x).iter().zip(read_slice(a, b)).map(|(p, q)| p + q).collect();
            write_slice(a, out, &o);
        }
        Op::Scale { x, s, out } => {
            let o: Vec<f32> = read_slice(a, x).iter().map(|v| v * s).collect();
            write_slice(a, out, &o);
        }
        Op::RmsNorm { x, w, eps, out } => {
            let mut o = vec![0.0f32; out.len];
            norm::rmsnorm_rows(read_slice(a, x), read_slice(a, w), eps, &mut o);
            write_slice(a, out, &o);
        }
        Op::AddRmsNorm { x, a: upd, w, eps, h, out } => {
            let (mut hv, mut o) = (vec![0.0f32; h.len], vec![0.0f32; out.len]);
            norm::add_rmsnorm(read_slice(a, x), read_slice(a, upd), read_slice(a, w), eps, &mut hv, &mut o);
            write_slice(a, h, &hv);
            write_slice(a, out, &o);
        }
        Op::FoldAddRmsNorm { parts, n_parts, x, w, eps, a: a_out, h, out } => {
            let mut av = vec![0.0f32; a_out.len];
            gemv::fold_partials(read_slice(a, parts), n_parts, a_out.len, false, &mut av);
            let (mut hv, mut o) = (vec![0.0f32; h.len], vec![0.0f32; out.len]);
            norm::add_rmsnorm(read_slice(a, x), &av, read_slice(a, w), eps, &mut hv, &mut o);
            write_slice(a, a_out, &av);
            write_slice(a, h, &hv);
            write_slice(a, out, &o);
        }
        Op::QkNormRope { x, w, eps, cos_sin } => {
            let mut xv = read_slice(a, x).to_vec();
            attention::qk_norm_rope(&mut xv, read_slice(a, w), eps, read_slice(a, cos_sin));
            write_slice(a, x, &xv);
        }
        Op::Attention { q, k, v, gate, len, q_heads, kv_heads, out } => {
            let mut o = vec![0.0f32; out.len];
            attention::decode_attention(
                read_slice(a, q),
                read_slice(a, k),
                read_slice(a, v),
                read_slice(a, gate),
                len,
                q_heads,
                kv_heads,
                &mut o,
            );
            write_slice(a, out, &o);
        }
        Op::Router { logits, bias, k, normalize, scaling, out, device_variant } => {
            let (lv, bv) = (read_slice(a, logits), read_slice(a, bias));
            let (ids, weights) = if device_variant {
                moe::router_topk_device_variant(lv, bv, k, normalize, scaling)
            } else if obs.defect == Some(TwinDefect::RouterTiesToHigherId) {
                moe::router_topk_ties_high(lv, bv, k, normalize, scaling)
            } else {
                moe::router_topk(lv, bv, k, normalize, scaling)
            };
            let (in_topk, boundary) = coverage::router_ties(lv, bv, &ids);
            coverage::note(&mut a.coverage, coverage::ROUTER_CALLS, obs.at, 1);
            coverage::note(&mut a.coverage, coverage::TIE_IN_TOPK, obs.at, u64::from(in_topk));
            coverage::note(&mut a.coverage, coverage::TIE_AT_BOUNDARY, obs.at, u64::from(boundary));
            let o: Vec<f32> = ids.iter().map(|i| f32::from_bits(*i)).chain(weights).collect();
            write_slice(a, out, &o);
        }
        Op::Swiglu { gate, up, limit, out } => {
            let mut o = vec![0.0f32; out.len];
            moe::swiglu(read_slice(a, gate), read_slice(a, up), limit, &mut o);
            write_slice(a, out, &o);
        }
        Op::Combine { y, w, out } => {
            let mut o = vec![0.0f32; out.len];
            moe::combine_slots(read_slice(a, y), read_slice(a, w), out.len, &mut o);
            write_slice(a, out, &o);
        }
        Op::CombineShared { y, w, out } => {
            let mut o = vec![0.0f32; out.len];
            moe::combine_shared(read_slice(a, y), read_slice(a, w), &mut o);
            write_slice(a, out, &o);
        }
        Op::ResidualAdd { h, a: x, b, sum, out } => {
            let (mut sv, mut o) = (vec![0.0f32; sum.len], vec![0.0f32; out.len]);
            moe::residual_add(read_slice(a, h), read_slice(a, x), read_slice(a, b), &mut sv, &mut o);
            write_slice(a, sum, &sv);
            write_slice(a, out, &o);
        }
        Op::Argmax { x, out } => {
            let idx = moe::argmax(read_slice(a, x));
            write_slice(a, out, &[f32::from_bits(idx)]);
        }
        Op::FlipLowBit { x } => {
            let v = read_slice(a, x.sub(0, 1))[0];
            write_slice(a, x.sub(0, 1), &[f32::from_bits(v.to_bits() ^ 1)]);
        }
        Op::SetU32 { out, value } => write_slice(a, out.sub(0, 1), &[f32::from_bits(value)]),
        Op::QkNormRopeAt { x, w, eps, table, pos } => {
            let p = read_slice(a, pos.sub(0, 1))[0].to_bits();
            let mut xv = read_slice(a, x).to_vec();
            if attention::qk_norm_rope_at(&mut xv, read_slice(a, w), eps, read_slice(a, table), p) {
                write_slice(a, x, &xv);
            }
        }
        Op::AttentionAt { q, k, v, gate, pos, max_len, q_heads, kv_heads, out } => {
            let p = read_slice(a, pos.sub(0, 1))[0].to_bits();
            let mut o = vec![0.0f32; out.len];
            let (qv, kv, vv, gv) = (read_slice(a, q), read_slice(a, k), read_slice(a, v), read_slice(a, gate));
            if attention::decode_attention_at(qv, kv, vv, gv, p, max_len, q_heads, kv_heads, &mut o) {
                write_slice(a, out, &o);
            }
        }
        Op::AppendAt { src, cache, pos } => {
            let p = read_slice(a, pos.sub(0, 1))[0].to_bits();
            let sv = read_slice(a, src).to_vec();
            let mut cv = read_slice(a, cache).to_vec();
            if attention::append_at(&sv, &mut cv, p) {
                write_slice(a, cache, &cv);
            }
        }
        Op::RopeAppend { q, k, v, q_norm, k_norm, eps, table, pos, q_out, k_out, k_cache, v_cache } => {
            let p = read_slice(a, pos.sub(0, 1))[0].to_bits();
            let (mut qo, mut ko) = (read_slice(a, q_out).to_vec(), read_slice(a, k_out).to_vec());
            let (mut kc, mut vc) = (read_slice(a, k_cache).to_vec(), read_slice(a, v_cache).to_vec());
            let (qv, kv, vv) = (read_slice(a, q), read_slice(a, k), read_slice(a, v));
            let norms = (read_slice(a, q_norm), read_slice(a, k_norm));
            let t = read_slice(a, table);
            if attention::rope_append(qv, kv, vv, norms, eps, t, p, &mut qo, &mut ko, (&mut kc, &mut vc)) {
                write_slice(a, q_out, &qo);
                write_slice(a, k_out, &ko);
                write_slice(a, k_cache, &kc);
                write_slice(a, v_cache, &vc);
            }
        }
        op @ (Op::ExpertGateUp { .. }
        | Op::ExpertDown { .. }
        | Op::FoldSlots { .. }
        | Op::FoldCombine { .. }
        | Op::SelectSlots { .. }
        | Op::CombineOwned { .. }) => execute_experts(a, op, obs),
    }
}

impl Backend for HostBackend {
    fn describe(&self) -> String {
        format!("host: {} CPU rank thread(s) with private arenas", self.ranks.len())
    }

    fn ranks(&self) -> usize {
        self.ranks.len()
    }

    fn upload_weight(&mut self, rank: usize, shard: &MatrixShard) -> Result<WeightId> {
        self.upload_weight_owned(rank, shard.clone())
    }

    fn upload_weight_owned(&mut self, rank: usize, shard: MatrixShard) -> Result<WeightId> {
        self.check_rank(rank)?;
        let format = shard_format(&shard);
        self.submit(rank, Box::new(move |a: &mut Arena| a.weights.push(shard)))?;
        let w = &mut self.ranks[rank];
        w.weight_formats.push(format);
        Ok((w.weight_formats.len() - 1) as WeightId)
    }

    fn checkpoint(&self) -> Option<super::Checkpoint> {
        Some(super::Checkpoint { buffers: self.ranks.iter().map(|r| r.buf_lens.len()).collect() })
    }

    /// Every rank drops its buffers from the checkpoint on, its timing marks and its coverage
    /// counters; the digest tickets restart at 0, and the census, the program position and any
    /// planted defect are forgotten (all of them belong to the run, none to the upload). Queued
    /// behind the rank's earlier work, so nothing in flight reads a dropped buffer; the barrier
    /// makes the rewind complete before the next run issues anything.
    fn rewind(&mut self, to: &super::Checkpoint) -> Result<()> {
        if to.buffers.len() != self.ranks.len() {
            return Err(RuntimeError::Contract(format!(
                "rewind to a checkpoint of {} ranks on a backend of {}",
                to.buffers.len(),
                self.ranks.len()
            )));
        }
        for (r, &keep) in to.buffers.iter().enumerate() {
            let held = self.ranks[r].buf_lens.len();
            if keep > held {
                return Err(RuntimeError::Contract(format!(
                    "rewind of rank {r} to {keep} buffers, but it holds {held}: the checkpoint is not this backend's"
                )));
            }
            let freed: usize = self.ranks[r].buf_lens[keep..].iter().map(|l| l * 4).sum();
            self.allocated_bytes = self.allocated_bytes.saturating_sub(freed);
            self.ranks[r].buf_lens.truncate(keep);
            self.submit(
                r,
                Box::new(move |a: &mut Arena| {
                    a.bufs.truncate(keep);
                    a.marks_ns.clear();
                    a.coverage = coverage::empty();
                }),
            )?;
        }
        self.barrier()?;
        self.digests
            .lock()
            .map_err(|_| RuntimeError::Device {
                location: "host digest sink".into(),
                detail: "poisoned by a panicking rank".into(),
            })?
            .clear();
        self.n_tickets = 0;
        self.census = CensusCounter::new(self.ranks.len());
        self.position = None;
        self.defect = None;
        Ok(())
    }

    fn alloc(&mut self, rank: usize, len: usize) -> Result<BufId> {
        self.check_rank(rank)?;
        let bytes = len.saturating_mul(4);
        if self.allocated_bytes.saturating_add(bytes) > self.memory_limit_bytes {
            return Err(RuntimeError::Device {
                location: format!("allocating {bytes} bytes on host rank {rank}"),
                detail: format!(
                    "out of memory: {} bytes already allocated, {} available to this process",
                    self.allocated_bytes, self.memory_limit_bytes
                ),
            });
        }
        self.allocated_bytes += bytes;
        self.submit(rank, Box::new(move |a: &mut Arena| a.bufs.push(vec![0.0; len])))?;
        let w = &mut self.ranks[rank];
        w.buf_lens.push(len);
        Ok((w.buf_lens.len() - 1) as BufId)
    }

    fn write(&mut self, rank: usize, dst: Slice, data: &[f32]) -> Result<()> {
        self.check_slice(rank, dst, "write")?;
        if data.len() != dst.len {
            return Err(RuntimeError::Contract(format!("write: {} values into a slice of {}", data.len(), dst.len)));
        }
        let data = data.to_vec();
        self.submit(rank, Box::new(move |a: &mut Arena| write_slice(a, dst, &data)))
    }

    fn read(&mut self, rank: usize, src: Slice) -> Result<Vec<f32>> {
        self.check_slice(rank, src, "read")?;
        let (tx, rx) = sync_channel(1);
        self.submit(
            rank,
            Box::new(move |a: &mut Arena| {
                let _ = tx.send(read_slice(a, src).to_vec());
            }),
        )?;
        rx.recv().map_err(|_| RuntimeError::Device {
            location: format!("host rank {rank} read"),
            detail: "the rank thread died before the read (a kernel twin panicked)".into(),
        })
    }

    fn launch(&mut self, rank: usize, op: Op) -> Result<()> {
        self.check_op(rank, &op)?;
        let kernel = self.kernel(rank, &op);
        self.census.launch(rank, kernel);
        let obs = Observe { at: self.position, defect: self.defect_for(&op) };
        self.submit(rank, Box::new(move |a: &mut Arena| execute(a, op, obs)))
    }

    fn copy(&mut self, transport: Transport, src_rank: usize, src: Slice, dst_rank: usize, dst: Slice) -> Result<()> {
        self.check_slice(src_rank, src, "copy source")?;
        self.check_slice(dst_rank, dst, "copy destination")?;
        if src.len != dst.len {
            return Err(RuntimeError::Contract(format!("copy of {} elements into a slice of {}", src.len, dst.len)));
        }
        if transport == Transport::Nccl && src_rank != dst_rank {
            return Err(no_nccl());
        }
        self.census.copy(transport, src_rank, dst_rank, src.len);
        if src_rank == dst_rank {
            return self.submit(
                src_rank,
                Box::new(move |a: &mut Arena| {
                    let v = read_slice(a, src).to_vec();
                    write_slice(a, dst, &v);
                }),
            );
        }
        if src.len * 4 <= self.corrupt_up_to_bytes && src.len > 0 {
            let (inner_tx, inner_rx) = channel::<Vec<f32>>();
            self.submit(
                src_rank,
                Box::new(move |a: &mut Arena| {
                    let mut v = read_slice(a, src).to_vec();
                    v[0] = f32::from_bits(v[0].to_bits() ^ 1);
                    let _ = inner_tx.send(v);
                }),
            )?;
            return self.submit(
                dst_rank,
                Box::new(move |a: &mut Arena| {
                    if let Ok(v) = inner_rx.recv() {
                        write_slice(a, dst, &v);
                    }
                }),
            );
        }
        let (tx, rx): (Sender<Vec<f32>>, Receiver<Vec<f32>>) = channel();
        match transport {
            Transport::HostBounce => {
                // rank → staging arena → destination: the staging buffer is taken from (and
                // returned to) a pool, like a reused pinned host region.
                let pool = self.staging_pool.clone();
                self.submit(
                    src_rank,
                    Box::new(move |a: &mut Arena| {
                        let mut stage = pool.lock().map(|mut p| p.pop().unwrap_or_default()).unwrap_or_default();
                        stage.clear();
                        stage.extend_from_slice(read_slice(a, src));
                        let _ = tx.send(stage);
                    }),
                )?;
                let pool = self.staging_pool.clone();
                self.submit(
                    dst_rank,
                    Box::new(move |a: &mut Arena| {
                        if let Ok(stage) = rx.recv() {
                            write_slice(a, dst, &stage);
                            if let Ok(mut p) = pool.lock() {
                                p.push(stage);
                            }
                        }
                    }),
                )
            }
            Transport::Nccl => Err(no_nccl()),
            Transport::NativeP2p => {
                self.submit(
                    src_rank,
                    Box::new(move |a: &mut Arena| {
                        let _ = tx.send(read_slice(a, src).to_vec());
                    }),
                )?;
                self.submit(
                    dst_rank,
                    Box::new(move |a: &mut Arena| {
                        if let Ok(v) = rx.recv() {
                            write_slice(a, dst, &v);
                        }
                    }),
                )
            }
        }
    }

    /// The op runs on `rank`'s thread into a scratch vector (the host's stand-in for a kernel's
    /// registers: pushed for this op and popped right after, never a slice of `rank`), which is
    /// handed to `out_rank`'s thread and written there in issue order — after `out_rank`'s
    /// earlier work, before its later work, like the device's two event fences. No copy of a
    /// `rank` buffer is involved.
    fn launch_peer_store(&mut self, rank: usize, op: Op, out_rank: usize, fence: JoinFence) -> Result<()> {
        let target = super::peer_store_target(&op, rank, out_rank)?;
        if fence == JoinFence::Doorbells {
            return Err(RuntimeError::Unsupported {
                backend: "host".into(),
                mechanism: "FENCE_MEMOPS doorbells",
                rule: "host backend: MEMRA_FENCE_MEMOPS is NOT-APPLICABLE here (stream memory-op doorbells exist only on CUDA streams); refusing rather than running the event path under the door's name".into(),
            });
        }
        self.check_op_at(rank, &op, out_rank)?;
        let kernel = self.kernel(rank, &op);
        self.census.peer_store(rank, kernel);
        let obs = Observe { at: self.position, defect: self.defect_for(&op) };
        let (tx, rx) = channel::<Vec<f32>>();
        self.submit(
            rank,
            Box::new(move |a: &mut Arena| {
                let scratch = a.bufs.len();
                a.bufs.push(vec![0.0; target.len]);
                execute(a, op.with_store_target(Slice::new(scratch as BufId, 0, target.len)), obs);
                let _ = tx.send(a.bufs.pop().unwrap_or_default());
            }),
        )?;
        self.submit(
            out_rank,
            Box::new(move |a: &mut Arena| {
                if let Ok(v) = rx.recv() {
                    write_slice(a, target, &v);
                }
            }),
        )
    }

    fn digest(&mut self, rank: usize, src: Slice, base: u64) -> Result<usize> {
        self.check_slice(rank, src, "digest")?;
        let ticket = self.n_tickets;
        self.n_tickets += 1;
        let sink = self.digests.clone();
        self.submit(
            rank,
            Box::new(move |a: &mut Arena| {
                let d = digest::digest_f32(read_slice(a, src), base);
                if let Ok(mut v) = sink.lock() {
                    if v.len() <= ticket {
                        v.resize(ticket + 1, 0);
                    }
                    v[ticket] = d;
                }
            }),
        )?;
        Ok(ticket)
    }

    fn digest_batch(&mut self, rank: usize, groups: &[Vec<DigestPart>]) -> Result<Vec<Vec<usize>>> {
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            for p in g {
                self.check_slice(rank, p.span(), "digest_batch")?;
                if let Some(o) = p.owned {
                    self.check_slice(rank, o.route, "digest_batch route")?;
                    if o.first_slot + p.blocks > o.route.len {
                        return Err(RuntimeError::Contract(format!(
                            "digest_batch: slots {}..{} of a route of {}",
                            o.first_slot,
                            o.first_slot + p.blocks,
                            o.route.len
                        )));
                    }
                }
            }
            let ticket = self.n_tickets;
            self.n_tickets += 1;
            let sink = self.digests.clone();
            let parts = g.clone();
            self.submit(
                rank,
                Box::new(move |a: &mut Arena| {
                    let d = digest_group(a, &parts);
                    if let Ok(mut v) = sink.lock() {
                        if v.len() <= ticket {
                            v.resize(ticket + 1, 0);
                        }
                        v[ticket] = d;
                    }
                }),
            )?;
            out.push(vec![ticket]);
        }
        Ok(out)
    }

    fn register_experts(&mut self, rank: usize, experts: usize, entries: &[Option<GroupEntry>]) -> Result<GroupId> {
        self.check_rank(rank)?;
        let n_weights = self.ranks[rank].n_weights();
        for (e, en) in entries.iter().enumerate() {
            if let Some(en) = en {
                if let Some(w) = [en.gate, en.up, en.down].into_iter().find(|w| *w as usize >= n_weights) {
                    return Err(RuntimeError::Contract(format!(
                        "expert group entry {e}: weight {w} does not exist on rank {rank}"
                    )));
                }
            }
        }
        let w = &self.ranks[rank];
        let format = entries.iter().flatten().map(|e| w.weight_formats[e.gate as usize]).next().unwrap_or("empty");
        let entries = entries.to_vec();
        self.submit(rank, Box::new(move |a: &mut Arena| a.groups.push((experts, entries))))?;
        let w = &mut self.ranks[rank];
        w.group_formats.push(format);
        Ok((w.group_formats.len() - 1) as GroupId)
    }

    fn mark(&mut self) -> Result<()> {
        for r in 0..self.ranks.len() {
            self.submit(
                r,
                Box::new(|a: &mut Arena| {
                    let t = a.epoch.elapsed().as_nanos() as u64;
                    a.marks_ns.push(t);
                }),
            )?;
        }
        Ok(())
    }

    fn collect(&mut self) -> Result<Collected> {
        let marks_ns = self.barrier()?;
        let mut digests = std::mem::take(&mut *self.digests.lock().map_err(|_| RuntimeError::Device {
            location: "host digest sink".into(),
            detail: "poisoned by a panicking rank".into(),
        })?);
        digests.resize(self.n_tickets, 0);
        self.n_tickets = 0;
        Ok(Collected { digests, marks_ns })
    }

    fn probe(&mut self, transport: Transport, sizes_bytes: &[usize]) -> Result<Vec<ProbeResult>> {
        super::run_probe(self, transport, sizes_bytes)
    }

    fn census(&self) -> Census {
        self.census.counts()
    }

    /// Every rank's coverage counters, summed (after the rank has run everything queued).
    fn coverage(&mut self) -> Result<Option<Coverage>> {
        let mut replies = Vec::new();
        for r in 0..self.ranks.len() {
            let (tx, rx) = sync_channel::<Coverage>(1);
            self.submit(
                r,
                Box::new(move |a: &mut Arena| {
                    let _ = tx.send(a.coverage.clone());
                }),
            )?;
            replies.push(rx);
        }
        let mut total = coverage::empty();
        for (r, rx) in replies.into_iter().enumerate() {
            let c = rx.recv().map_err(|_| RuntimeError::Device {
                location: format!("host rank {r}"),
                detail: "the rank thread died before reporting its coverage (a kernel twin panicked)".into(),
            })?;
            coverage::merge(&mut total, &c);
        }
        Ok(Some(total))
    }

    fn note_position(&mut self, at: SeamPoint) {
        self.position = Some(at);
    }

    fn plant(&mut self, d: TwinDefect) -> Result<()> {
        self.defect = Some(d);
        Ok(())
    }
}

/// The host backend's refusal of the nccl transport between ranks.
fn no_nccl() -> RuntimeError {
    RuntimeError::Unsupported {
        backend: "host".into(),
        mechanism: "nccl transport",
        rule: "the host backend has no NCCL: the nccl transport needs CUDA devices, one per rank".into(),
    }
}
