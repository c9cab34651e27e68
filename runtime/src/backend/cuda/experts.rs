//! Launches of the grouped expert ops (`kernels/cuda/experts.cu`), the fused rope + KV append,
//! and the batched seam digest.
//!
//! An expert group is a per-rank device table of `ExpertEntry` (one per expert, null where the
//! rank holds none), registered once per layer; the kernels read the route ids from device memory
//! and take their matrices from the table, so nothing about the routing passes through the host.
//! Every extent a kernel may touch is checked here against the group's largest entry before the
//! launch (a kernel must never write outside a slice whatever the route says).

use super::{cfg, elementwise_grid, i32_of, shape_err, ELEMENTWISE_THREADS, GEMV_MAX_TASKS, GEMV_THREADS, HEAD_DIM};
use crate::backend::cuda::memory::{DeviceBuffer, WeightKind};
use crate::backend::cuda::CudaBackend;
use crate::backend::{DigestPart, GroupEntry, GroupId, Op, Slice};
use crate::error::RuntimeError;
use crate::Result;
use cudarc::driver::{sys as dsys, DeviceRepr, LaunchConfig, PushKernelArg};

/// gemv.cu's format codes.
const FMT_E4M3: i32 = 2;
const FMT_NVFP4: i32 = 3;
/// u32 words of one `ExpertEntry` (112 bytes).
const ENTRY_WORDS: usize = 28;
/// Parts per `digest_batch_f32` launch and values per grid block (digest.cu).
const DIGEST_BATCH_MAX: usize = 32;
const DIGEST_BATCH_CHUNK: usize = 2048;
const DIGEST_THREADS: u32 = 256;

/// The largest extents a slot of one class (routed entries, shared entries) writes.
#[derive(Debug, Clone, Copy, Default)]
struct Extents {
    /// gate/up rows (= act values of the slot).
    rows: usize,
    /// down rows × K-blocks held (= partials of the slot).
    down_parts: usize,
}

/// An expert group on a device: the entry table and the largest extents of its entries.
pub(crate) struct DeviceGroup {
    table: DeviceBuffer,
    n_entries: usize,
    experts: usize,
    /// in_features of gate/up (= x length, equal for every entry).
    cols: usize,
    max_rows: usize,
    max_nk: usize,
    max_down_rows: usize,
    max_down_nk: usize,
    /// Extents of a routed slot (entries below `experts`) and of a shared slot.
    routed: Extents,
    shared: Extents,
    /// Storage of the entries (census kernel names: `expert_gate_up.<format>`).
    pub format: &'static str,
}

impl DeviceGroup {
    /// Values a slot range needs in a strided buffer (slot j at j·pitch): the furthest end over
    /// the range, each slot by its class (`k` routed slots, then shared ones); an error when a
    /// pitch would let two slots overlap.
    fn need(
        &self,
        op: &str,
        what: &str,
        k: usize,
        (first, slots, pitch): (usize, usize, usize),
        ext: fn(&Extents) -> usize,
    ) -> Result<usize> {
        let mut need = 0;
        for j in 0..slots {
            let e = if first + j < k { ext(&self.routed) } else { ext(&self.shared) };
            if j + 1 < slots && pitch < e {
                return Err(shape_err(
                    op,
                    format!("{what} pitch {pitch} is below a slot's {e} values: slots would overlap"),
                ));
            }
            need = need.max(j * pitch + e);
        }
        Ok(need)
    }
}

impl DeviceGroup {
    /// The launch of a grouped expert op over `slots` slots whose largest matrix has `rows` rows
    /// of `nk` K-blocks: the grid (row blocks × slots), the table arguments (entries, experts,
    /// route length, first slot) and the rows per block; `None` when there is nothing to do.
    fn slot_launch(
        &self,
        what: &str,
        (rows, nk): (usize, usize),
        slots: usize,
        route_len: usize,
        first_slot: usize,
    ) -> Result<Option<(LaunchConfig, [i32; 4], i32)>> {
        if slots == 0 || rows == 0 {
            return Ok(None);
        }
        let rpb = rows_per_block(what, nk)?;
        let c = LaunchConfig {
            grid_dim: (rows.div_ceil(rpb) as u32, i32_of(what, "slots", slots)? as u32, 1),
            block_dim: (GEMV_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [
            i32_of(what, "entries", self.n_entries)?,
            i32_of(what, "experts", self.experts)?,
            i32_of(what, "route", route_len)?,
            i32_of(what, "first_slot", first_slot)?,
        ];
        Ok(Some((c, args, rpb as i32)))
    }
}

/// `digest_batch_f32`'s parameter block (layout of `struct DigestBatch` in digest.cu: 2440 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DigestBatch {
    ptr: [u64; DIGEST_BATCH_MAX],
    base: [u64; DIGEST_BATCH_MAX],
    base_pitch: [u64; DIGEST_BATCH_MAX],
    slot: [u64; DIGEST_BATCH_MAX],
    ids: [u64; DIGEST_BATCH_MAX],
    n: [u32; DIGEST_BATCH_MAX],
    blocks: [u32; DIGEST_BATCH_MAX],
    pitch: [u32; DIGEST_BATCH_MAX],
    first_slot: [u32; DIGEST_BATCH_MAX],
    o_experts: [u32; DIGEST_BATCH_MAX],
    o_div: [u32; DIGEST_BATCH_MAX],
    o_mod: [u32; DIGEST_BATCH_MAX],
    o_want: [u32; DIGEST_BATCH_MAX],
    chunk_start: [u32; DIGEST_BATCH_MAX + 1],
    count: u32,
}

// SAFETY: `DigestBatch` is `repr(C)`, made only of u64/u32 arrays and a u32 (no padding that a
// kernel could read as uninitialised, no pointers the host owns), and matches the field order and
// types of `struct DigestBatch` in kernels/cuda/digest.cu, which the kernel takes by value.
unsafe impl DeviceRepr for DigestBatch {}

impl DigestBatch {
    fn empty() -> DigestBatch {
        DigestBatch {
            ptr: [0; DIGEST_BATCH_MAX],
            base: [0; DIGEST_BATCH_MAX],
            base_pitch: [0; DIGEST_BATCH_MAX],
            slot: [0; DIGEST_BATCH_MAX],
            ids: [0; DIGEST_BATCH_MAX],
            n: [0; DIGEST_BATCH_MAX],
            blocks: [0; DIGEST_BATCH_MAX],
            pitch: [0; DIGEST_BATCH_MAX],
            first_slot: [0; DIGEST_BATCH_MAX],
            o_experts: [0; DIGEST_BATCH_MAX],
            o_div: [0; DIGEST_BATCH_MAX],
            o_mod: [0; DIGEST_BATCH_MAX],
            o_want: [0; DIGEST_BATCH_MAX],
            chunk_start: [0; DIGEST_BATCH_MAX + 1],
            count: 0,
        }
    }
}

/// One part of a digest batch with its resolved addresses.
pub(crate) struct ResolvedPart {
    pub part: DigestPart,
    pub ptr: u64,
    pub ids: u64,
    pub slot: u64,
}

fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| shape_err("digest_batch", format!("{what} {v} does not fit 32 bits")))
}

/// Rows per block of a grouped GEMV with `nk` K-blocks (as `gemv`: ~32 tasks, within the fold slots).
fn rows_per_block(op: &str, nk: usize) -> Result<usize> {
    if nk == 0 || nk > GEMV_MAX_TASKS {
        return Err(shape_err(op, format!("{nk} K-blocks: the grouped kernels take 1 to {GEMV_MAX_TASKS}")));
    }
    Ok((32 / nk).clamp(1, GEMV_MAX_TASKS / nk))
}

impl CudaBackend {
    /// Build and upload the entry table of an expert group on `rank`.
    pub(crate) fn register_group(
        &mut self,
        rank: usize,
        experts: usize,
        entries: &[Option<GroupEntry>],
    ) -> Result<GroupId> {
        self.check_rank(rank)?;
        let bad =
            |e: usize, rule: String| RuntimeError::Config(format!("expert group entry {e} on rank {rank}: {rule}"));
        let mut words = vec![0u32; entries.len().max(1) * ENTRY_WORDS];
        let (mut max_rows, mut cols, mut max_nk) = (0usize, None::<usize>, 0usize);
        let (mut max_down_rows, mut max_down_nk) = (0usize, 0usize);
        let (mut routed, mut shared) = (Extents::default(), Extents::default());
        for (e, en) in entries.iter().enumerate() {
            let Some(en) = en else { continue };
            let ws = &self.ranks[rank].weights;
            let get = |w: u32| ws.get(w as usize).ok_or_else(|| bad(e, format!("weight {w} does not exist")));
            let (g, u, d) = (get(en.gate)?, get(en.up)?, get(en.down)?);
            let fmt = match g.kind {
                WeightKind::E4m3 => FMT_E4M3,
                WeightKind::Nvfp4 => FMT_NVFP4,
                k => return Err(bad(e, format!("the grouped kernels take E4M3 or NVFP4 experts, not {}", k.suffix()))),
            };
            if u.kind != g.kind || d.kind != g.kind {
                return Err(bad(e, "gate, up and down must share one format".into()));
            }
            if u.rows != g.rows || u.cols != g.cols || u.kblock_width != g.kblock_width || u.row0 != g.row0 {
                return Err(bad(e, format!("gate {}x{} and up {}x{} differ in shape", g.rows, g.cols, u.rows, u.cols)));
            }
            if d.cols != g.rows || d.row0 != 0 || g.cols == 0 || d.cols == 0 {
                return Err(bad(e, format!("down has {} columns but gate/up {} rows", d.cols, g.rows)));
            }
            if *cols.get_or_insert(g.cols) != g.cols {
                return Err(bad(e, format!("in_features {} differ from the group's {}", g.cols, cols.unwrap_or(0))));
            }
            let (nk, dnk) = (g.cols / g.kblock_width, d.cols / d.kblock_width);
            max_rows = max_rows.max(g.rows);
            max_nk = max_nk.max(nk);
            max_down_rows = max_down_rows.max(d.rows);
            max_down_nk = max_down_nk.max(dnk);
            let class = if e < experts { &mut routed } else { &mut shared };
            class.rows = class.rows.max(g.rows);
            class.down_parts = class.down_parts.max(dnk * d.rows);
            let sp = |w: &crate::backend::cuda::memory::DeviceWeight| w.scales.as_ref().map(|s| s.ptr()).unwrap_or(0);
            let [sg, su, sd] = en.nvfp4_scales.unwrap_or([1.0, 1.0, 1.0]);
            let i32w = |v: usize| i32_of("register_experts", "extent", v).map(|x| x as u32);
            let fields: [u64; 6] = [g.data.ptr(), sp(g), u.data.ptr(), sp(u), d.data.ptr(), sp(d)];
            let w = &mut words[e * ENTRY_WORDS..(e + 1) * ENTRY_WORDS];
            for (i, f) in fields.iter().enumerate() {
                w[2 * i] = *f as u32;
                w[2 * i + 1] = (*f >> 32) as u32;
            }
            let ints = [
                fmt as u32,
                i32w(g.vec)?,
                i32w(u.vec)?,
                i32w(d.vec)?,
                i32w(g.rows)?,
                i32w(g.cols)?,
                i32w(g.kblock_width)?,
                i32w(g.row0)?,
                i32w(d.rows)?,
                i32w(d.cols)?,
                i32w(d.kblock_width)?,
                en.nvfp4_scales.is_some() as u32,
                sg.to_bits(),
                su.to_bits(),
                sd.to_bits(),
                0,
            ];
            w[12..].copy_from_slice(&ints);
        }
        rows_per_block("expert_gate_up", max_nk.max(1))?;
        rows_per_block("expert_down", max_down_nk.max(1))?;
        let ctx = self.ctx_of(rank).clone();
        let table = DeviceBuffer::from_host(&ctx, &self.ranks[rank].stream, &words, "expert group table")?;
        let ws = &self.ranks[rank].weights;
        let format =
            entries.iter().flatten().find_map(|en| ws.get(en.gate as usize)).map_or("empty", |w| w.kind.suffix());
        let r = &mut self.ranks[rank];
        r.groups.push(DeviceGroup {
            format,
            table,
            n_entries: entries.len(),
            experts,
            max_rows,
            cols: cols.unwrap_or(0),
            max_nk,
            max_down_rows,
            max_down_nk,
            routed,
            shared,
        });
        Ok((r.groups.len() - 1) as GroupId)
    }

    fn group(&self, rank: usize, g: GroupId, op: &str) -> Result<&DeviceGroup> {
        self.ranks[rank]
            .groups
            .get(g as usize)
            .ok_or_else(|| shape_err(op, format!("group {g} does not exist on rank {rank}")))
    }

    /// Slots of `pitch` each, every one `extent` long, lie inside `s` without overlapping.
    fn check_strided(op: &str, what: &str, s: Slice, slots: usize, pitch: usize, extent: usize) -> Result<()> {
        let need = slots.saturating_sub(1) * pitch + extent;
        if slots > 1 && pitch < extent {
            return Err(shape_err(
                op,
                format!("{what} pitch {pitch} is below a slot's {extent} values: slots would overlap"),
            ));
        }
        if s.len < need {
            return Err(shape_err(
                op,
                format!("{what} holds {} values, {slots} slots of pitch {pitch} need {need}", s.len),
            ));
        }
        Ok(())
    }

    /// The grouped expert ops, RopeAppend (`out_rank`: a peer store's destination, else `rank`).
    pub(super) fn launch_expert_op(&self, rank: usize, op: &Op, out_rank: usize) -> Result<()> {
        match *op {
            Op::ExpertGateUp { group, route, first_slot, slots, x, limit, act, act_pitch } => {
                let what = "expert_gate_up";
                let g = self.group(rank, group, what)?;
                let (tp, rp, xp, ap) = (
                    g.table.ptr(),
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, x, what)?,
                    self.slice_ptr(rank, act, what)?,
                );
                if x.len != g.cols {
                    return Err(shape_err(what, format!("x has {} values, the experts {} columns", x.len, g.cols)));
                }
                let need = g.need(what, "act", route.len, (first_slot, slots, act_pitch), |e| e.rows)?;
                if act.len < need {
                    return Err(shape_err(what, format!("act holds {} values, the slots need {need}", act.len)));
                }
                let Some((c, [ne, ex, k, fs], rpb_i)) =
                    g.slot_launch(what, (g.max_rows, g.max_nk), slots, route.len, first_slot)?
                else {
                    return Ok(());
                };
                let (has, lim, pitch) =
                    (limit.is_some() as i32, limit.unwrap_or(0.0), i32_of(what, "act pitch", act_pitch)?);
                launch!(self, rank, "expert_gate_up_f32", c, tp, ne, ex, rp, k, fs, xp, has, lim, ap, pitch, rpb_i)
            }
            Op::ExpertDown { group, route, first_slot, slots, act, act_pitch, out, out_pitch } => {
                let what = "expert_down";
                let g = self.group(rank, group, what)?;
                let (tp, rp, ap, op_ptr) = (
                    g.table.ptr(),
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, act, what)?,
                    self.slice_ptr(out_rank, out, what)?,
                );
                let need_a = g.need(what, "act", route.len, (first_slot, slots, act_pitch), |e| e.rows)?;
                let need_o = g.need(what, "out", route.len, (first_slot, slots, out_pitch), |e| e.down_parts)?;
                if act.len < need_a || out.len < need_o {
                    return Err(shape_err(
                        what,
                        format!("act holds {} values (need {need_a}), out {} (need {need_o})", act.len, out.len),
                    ));
                }
                let Some((c, [ne, ex, k, fs], rpb_i)) =
                    g.slot_launch(what, (g.max_down_rows, g.max_down_nk), slots, route.len, first_slot)?
                else {
                    return Ok(());
                };
                let (ap_i, op_i) = (i32_of(what, "act pitch", act_pitch)?, i32_of(what, "out pitch", out_pitch)?);
                launch!(self, rank, "expert_down_f32", c, tp, ne, ex, rp, k, fs, ap, ap_i, op_ptr, op_i, rpb_i)
            }
            Op::FoldSlots { route, first_slot, slots, parts, parts_pitch, n_parts, owner, scales, out } => {
                let what = "fold_slots";
                let (rp, pp, op_ptr) = (
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, parts, what)?,
                    self.slice_ptr(out_rank, out, what)?,
                );
                if slots == 0 || out.len % slots != 0 {
                    return Err(shape_err(what, format!("out of {} values is not {slots} slots", out.len)));
                }
                let width = out.len / slots;
                Self::check_strided(what, "parts", parts, slots, parts_pitch, n_parts * width)?;
                if width == 0 {
                    return Ok(());
                }
                let (tp, ne, ex) = match scales {
                    Some(g) => {
                        let g = self.group(rank, g, what)?;
                        (g.table.ptr(), g.n_entries, g.experts)
                    }
                    None => (0u64, 0, 0),
                };
                let o = owner.unwrap_or(crate::backend::SlotOwner {
                    rule: crate::backend::OwnerRule { experts: 0, div: 0, modulo: 0 },
                    want: 0,
                });
                let c = LaunchConfig {
                    grid_dim: (width.div_ceil(ELEMENTWISE_THREADS as usize).min(64) as u32, slots as u32, 1),
                    block_dim: (ELEMENTWISE_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (k, fs, ppitch, np, w) = (
                    i32_of(what, "route", route.len)?,
                    i32_of(what, "first_slot", first_slot)?,
                    i32_of(what, "parts pitch", parts_pitch)?,
                    i32_of(what, "n_parts", n_parts)?,
                    i32_of(what, "width", width)?,
                );
                let (cond, ne_i, ex_i) = (owner.is_some() as i32, ne as i32, ex as i32);
                let (oe, od, om, ow) = (o.rule.experts, o.rule.div, o.rule.modulo, o.want);
                launch!(
                    self,
                    rank,
                    "fold_slots_f32",
                    c,
                    rp,
                    k,
                    fs,
                    pp,
                    ppitch,
                    np,
                    w,
                    op_ptr,
                    cond,
                    oe,
                    od,
                    om,
                    ow,
                    tp,
                    ne_i,
                    ex_i
                )
            }
            Op::FoldCombine { parts, pitch, n_parts, w, out } => {
                let what = "fold_combine";
                let (pp, wp, op_ptr) = (
                    self.slice_ptr(rank, parts, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                if out.len % 2 != 0 {
                    return Err(shape_err(what, format!("out of {} values is not [routed | shared]", out.len)));
                }
                let width = out.len / 2;
                Self::check_strided(what, "parts", parts, w.len + 1, pitch, n_parts * width)?;
                if width == 0 {
                    return Ok(());
                }
                let (pitch_i, np, k, w_i) = (
                    i32_of(what, "pitch", pitch)?,
                    i32_of(what, "n_parts", n_parts)?,
                    i32_of(what, "slots", w.len)?,
                    i32_of(what, "width", width)?,
                );
                let c = cfg(elementwise_grid(width), ELEMENTWISE_THREADS, 0);
                launch!(self, rank, "fold_combine_f32", c, pp, pitch_i, np, wp, k, w_i, op_ptr)
            }
            Op::SelectSlots { route, rule, ranks, src, rank_pitch, out } => {
                let what = "select_slots";
                let (rp, sp, op_ptr) = (
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, src, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let k = route.len;
                if k == 0 || out.len % k != 0 {
                    return Err(shape_err(what, format!("out of {} values is not {k} slots", out.len)));
                }
                let width = out.len / k;
                Self::check_strided(what, "src", src, ranks, rank_pitch, k * width)?;
                if width == 0 || ranks == 0 {
                    return Ok(());
                }
                let c = LaunchConfig {
                    grid_dim: (width.div_ceil(ELEMENTWISE_THREADS as usize).min(64) as u32, k as u32, 1),
                    block_dim: (ELEMENTWISE_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (k_i, ranks_i, pitch, w) = (
                    i32_of(what, "route", k)?,
                    i32_of(what, "ranks", ranks)?,
                    i32_of(what, "rank pitch", rank_pitch)?,
                    i32_of(what, "width", width)?,
                );
                let (oe, od, om) = (rule.experts, rule.div, rule.modulo);
                launch!(self, rank, "select_slots_f32", c, rp, k_i, oe, od, om, ranks_i, sp, pitch, w, op_ptr)
            }
            Op::CombineOwned { route, owner, y, w, out } => {
                let what = "combine_owned";
                let (rp, yp, wp, op_ptr) = (
                    self.slice_ptr(rank, route, what)?,
                    self.slice_ptr(rank, y, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let k = route.len;
                if Some(y.len) != k.checked_mul(out.len) || w.len < k {
                    return Err(shape_err(what, format!("y {} w {} for {k} slots of {}", y.len, w.len, out.len)));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let (k_i, width) = (i32_of(what, "route", k)?, i32_of(what, "width", out.len)?);
                let (oe, od, om, ow) = (owner.rule.experts, owner.rule.div, owner.rule.modulo, owner.want);
                let c = cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0);
                launch!(self, rank, "combine_owned_f32", c, rp, k_i, oe, od, om, ow, yp, wp, width, op_ptr)
            }
            Op::RopeAppend { q, k, v, q_norm, k_norm, eps, table, pos, q_out, k_out, k_cache, v_cache } => {
                let what = "rope_append";
                let p = |s: Slice| self.slice_ptr(rank, s, what);
                let (qp, kp, vp, qnp, knp, tp) = (p(q)?, p(k)?, p(v)?, p(q_norm)?, p(k_norm)?, p(table)?);
                let (qop, kop, kcp, vcp) = (p(q_out)?, p(k_out)?, p(k_cache)?, p(v_cache)?);
                if pos.len == 0 {
                    return Err(shape_err(what, "the position slice is empty; it must hold one u32".into()));
                }
                let pp = p(pos.sub(0, 1))?;
                let ok = q.len % HEAD_DIM == 0
                    && k.len % HEAD_DIM == 0
                    && k.len > 0
                    && v.len == k.len
                    && q_out.len == q.len
                    && k_out.len == k.len
                    && q_norm.len == HEAD_DIM
                    && k_norm.len == HEAD_DIM
                    && table.len % HEAD_DIM == 0;
                if !ok {
                    return Err(shape_err(
                        what,
                        format!(
                            "q {} k {} v {} q_out {} k_out {} norms {}/{} table {}: whole heads of 128 required",
                            q.len, k.len, v.len, q_out.len, k_out.len, q_norm.len, k_norm.len, table.len
                        ),
                    ));
                }
                let cache_positions = k_cache.len.min(v_cache.len) / k.len;
                let (qh, kvh) = (q.len / HEAD_DIM, k.len / HEAD_DIM);
                let warps = qh + 2 * kvh;
                let (positions, cpos, qh_i, kvh_i) = (
                    i32_of(what, "table rows", table.len / HEAD_DIM)?,
                    i32_of(what, "cache positions", cache_positions)?,
                    qh as i32,
                    kvh as i32,
                );
                launch!(
                    self,
                    rank,
                    "rope_append_f32",
                    cfg(warps.div_ceil(4), 128, 0),
                    qp,
                    kp,
                    vp,
                    qnp,
                    knp,
                    eps,
                    tp,
                    pp,
                    positions,
                    cpos,
                    qh_i,
                    kvh_i,
                    qop,
                    kop,
                    kcp,
                    vcp
                )
            }
            _ => Err(shape_err("launch_expert_op", "not a grouped expert op".into())),
        }
    }

    /// One batch of at most DIGEST_BATCH_MAX resolved parts in one launch.
    pub(crate) fn launch_digest_batch(&self, rank: usize, parts: &[ResolvedPart]) -> Result<()> {
        let mut b = DigestBatch::empty();
        let mut chunks = 0u32;
        for (i, r) in parts.iter().enumerate() {
            let p = &r.part;
            b.ptr[i] = r.ptr;
            b.base[i] = p.base;
            b.base_pitch[i] = p.base_pitch;
            b.slot[i] = r.slot;
            b.ids[i] = r.ids;
            b.n[i] = u32_of("part length", p.src.len)?;
            b.blocks[i] = u32_of("blocks", p.blocks)?;
            b.pitch[i] = u32_of("pitch", p.pitch)?;
            if let Some(o) = p.owned {
                b.first_slot[i] = u32_of("first slot", o.first_slot)?;
                (b.o_experts[i], b.o_div[i], b.o_mod[i], b.o_want[i]) =
                    (o.owner.rule.experts, o.owner.rule.div, o.owner.rule.modulo, o.owner.want);
            }
            b.chunk_start[i] = chunks;
            let per_block = p.src.len.div_ceil(DIGEST_BATCH_CHUNK);
            chunks = chunks
                .checked_add(u32_of("chunks", per_block * p.blocks)?)
                .ok_or_else(|| shape_err("digest_batch", "more than 2^32 chunks".into()))?;
        }
        b.count = parts.len() as u32;
        b.chunk_start[parts.len()] = chunks;
        if chunks == 0 {
            return Ok(());
        }
        launch!(self, rank, "digest_batch_f32", cfg(chunks as usize, DIGEST_THREADS, 0), b)
    }

    /// Resolve a part's addresses on `rank` (bounds checked) and its digest slot address.
    pub(crate) fn resolve_part(&self, rank: usize, p: &DigestPart, slot: dsys::CUdeviceptr) -> Result<ResolvedPart> {
        let ptr = self.slice_ptr(rank, p.span(), "digest_batch")?;
        let ids = match p.owned {
            Some(o) => {
                if o.first_slot + p.blocks > o.route.len {
                    return Err(shape_err(
                        "digest_batch",
                        format!("slots {}..{} of a route of {}", o.first_slot, o.first_slot + p.blocks, o.route.len),
                    ));
                }
                self.slice_ptr(rank, o.route, "digest_batch route")?
            }
            None => 0,
        };
        Ok(ResolvedPart { part: *p, ptr, ids, slot })
    }

    pub(crate) fn digest_batch_max() -> usize {
        DIGEST_BATCH_MAX
    }
}
