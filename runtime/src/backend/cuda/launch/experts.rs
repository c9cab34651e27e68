//! Launches of the grouped expert ops (`kernels/cuda/experts.cu`), the fused rope + KV append,
//! and the batched seam digest.
//!
//! An expert group is a per-rank device table of `ExpertEntry` (one per expert, null where the
//! rank holds none), registered once per layer; the kernels read the route ids from device memory
//! and take their matrices from the table, so nothing about the routing passes through the host.
//! Every extent a kernel may touch is checked here against the group's largest entry before the
//! launch (a kernel must never write outside a slice whatever the route says).
//!
//! This file builds the tables (`register_group`) and holds the extents every launch checks;
//! the launches themselves are in `expert_ops.rs`.

use super::gemv::bpl_rows_per_block;
use super::{i32_of, shape_err, GEMV_MAX_TASKS, GEMV_THREADS};
use crate::backend::cuda::layout::{BPL_MAX_NB, E4M3_BPL};
use crate::backend::cuda::memory::{DeviceBuffer, WeightKind};
use crate::backend::cuda::CudaBackend;
use crate::backend::{GroupEntry, GroupId, Slice};
use crate::error::RuntimeError;
use crate::Result;
use cudarc::driver::LaunchConfig;

/// gemv.cu's format codes.
const FMT_E4M3: i32 = 2;
const FMT_NVFP4: i32 = 3;
/// u32 words of one `ExpertEntry` (112 bytes).
const ENTRY_WORDS: usize = 28;

/// The largest extents a slot of one class (routed entries, shared entries) writes.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Extents {
    /// gate/up rows (= act values of the slot).
    pub(super) rows: usize,
    /// down rows × K-blocks held (= partials of the slot).
    pub(super) down_parts: usize,
}

/// An expert group on a device: the entry table and the largest extents of its entries.
pub(crate) struct DeviceGroup {
    pub(super) table: DeviceBuffer,
    pub(super) n_entries: usize,
    pub(super) experts: usize,
    /// in_features of gate/up (= x length, equal for every entry).
    pub(super) cols: usize,
    pub(super) max_rows: usize,
    pub(super) max_down_rows: usize,
    /// in_features of the widest routed down projection (SEL_DOWN8's narrow-row bound).
    pub(super) max_down_cols: usize,
    /// Rows per block of the gate/up and the down launches (`group_rows_per_block`).
    pub(super) rpb_gate_up: usize,
    pub(super) rpb_down: usize,
    /// Extents of a routed slot (entries below `experts`) and of a shared slot.
    pub(super) routed: Extents,
    pub(super) shared: Extents,
    /// Storage of the entries (census kernel names: `expert_gate_up.<format>`).
    pub format: &'static str,
    /// The kernels of the gate/up and the down launches: the block-per-lane-only forms
    /// (`expert_*_bpl_f32`, fewer registers, more blocks per SM) when every entry's matrices of
    /// that kind are E4M3 block per lane, else the general ones. Same operations, same bits.
    pub(super) gate_up_kernel: &'static str,
    pub(super) down_kernel: &'static str,
}

impl DeviceGroup {
    /// Values a slot range needs in a strided buffer (slot j at j·pitch): the furthest end over
    /// the range, each slot by its class (`k` routed slots, then shared ones); an error when a
    /// pitch would let two slots overlap.
    pub(super) fn need(
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
    pub(super) fn slot_launch(
        &self,
        what: &str,
        (rows, rpb): (usize, usize),
        slots: usize,
        route_len: usize,
        first_slot: usize,
    ) -> Result<Option<(LaunchConfig, [i32; 4], i32)>> {
        if slots == 0 || rows == 0 {
            return Ok(None);
        }
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

/// Rows per block of one projection kind of a group: the task kernels' count for `nk` K-blocks,
/// the block-per-lane count where every entry is stored block per lane, and the smaller of the two
/// where the layouts mix (each entry takes its own path inside the launch, and both must fit).
/// `nb` is the largest scale-block count of a row, `matrices` 2 for gate/up and 1 for down.
fn group_rows_per_block(op: &str, nk: usize, nb: usize, matrices: usize, (bpl, other): (bool, bool)) -> Result<usize> {
    if bpl && nb > BPL_MAX_NB {
        return Err(shape_err(op, format!("{nb} scale blocks per row: the block-per-lane kernels take {BPL_MAX_NB}")));
    }
    let fit = bpl_rows_per_block(nb, matrices, None);
    Ok(match (bpl, other) {
        (true, false) => whole_rounds(fit, nb * matrices),
        (true, true) => fit.min(rows_per_block(op, nk)?),
        _ => rows_per_block(op, nk)?,
    })
}

/// The gate/up and down kernels of a group from its layouts per projection kind — (some entry is
/// E4M3 block per lane, some entry is not): the block-per-lane-only forms where every entry is (they
/// trap on any other entry), the general kernels otherwise (and for a group of no entries).
fn group_kernels(gate_up: (bool, bool), down: (bool, bool)) -> (&'static str, &'static str) {
    let only_bpl = |layouts: (bool, bool)| layouts == (true, false);
    (
        if only_bpl(gate_up) { "expert_gate_up_bpl_f32" } else { "expert_gate_up_f32" },
        if only_bpl(down) { "expert_down_bpl_f32" } else { "expert_down_f32" },
    )
}

/// Rows per block of the block-per-lane kernels, rounded down to whole rounds of a block's
/// `GEMV_THREADS` threads where the last of more than one round of `pairs_per_row` scaled block dots
/// would be half filled or less. A block ends when its last round does, so a part-filled last round
/// is time in which most threads load nothing: at `step`, down rows hold 10 pairs and 64 rows took
/// 2.5 rounds; 51 rows take 2 (510 of 512 threads), over 729 blocks instead of 576. One H200,
/// interleaved against 64 rows over two calls (docs/gpu/2026-12-06-h200/): the layer 110.0–111.5 →
/// 107.0–108.6 µs gated, 5 of 5 rounds. A nearly full last round (gate/up rows of 10 blocks: 51
/// rows, 1020 of 1024) is kept, and gate/up at `step` (16 rows × 32 blocks × 2) is 4 whole rounds.
/// A launch choice only: every count from 1 to 64 is in the kernels' domain. Grouped kernels only:
/// the dense E4M3 GEMV's blocks (`bpl_rows_per_block` with its rows) are sized for two blocks per
/// SM and were not measured with this rule.
fn whole_rounds(rows: usize, pairs_per_row: usize) -> usize {
    let (threads, ppr) = (GEMV_THREADS as usize, pairs_per_row.max(1));
    let pairs = rows * ppr;
    if pairs <= threads || pairs.is_multiple_of(threads) || pairs % threads > threads / 2 {
        return rows;
    }
    (pairs / threads * threads / ppr).max(1)
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
            |e: usize, rule: String| RuntimeError::Contract(format!("expert group entry {e} on rank {rank}: {rule}"));
        let mut words = vec![0u32; entries.len().max(1) * ENTRY_WORDS];
        let (mut max_rows, mut cols, mut max_nk) = (0usize, None::<usize>, 0usize);
        let (mut max_down_rows, mut max_down_nk, mut max_down_nb) = (0usize, 0usize, 0usize);
        let mut max_down_cols = 0usize;
        // (some entry is stored block per lane, some entry is not), per projection kind.
        let (mut gu_layouts, mut down_layouts) = ((false, false), (false, false));
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
            let e4m3 = fmt == FMT_E4M3;
            let (gu_bpl, d_bpl) = (e4m3 && g.vec == E4M3_BPL && u.vec == E4M3_BPL, e4m3 && d.vec == E4M3_BPL);
            gu_layouts = (gu_layouts.0 || gu_bpl, gu_layouts.1 || !gu_bpl);
            down_layouts = (down_layouts.0 || d_bpl, down_layouts.1 || !d_bpl);
            max_down_nb = max_down_nb.max(d.cols / 128);
            max_rows = max_rows.max(g.rows);
            max_nk = max_nk.max(nk);
            max_down_rows = max_down_rows.max(d.rows);
            if e < experts {
                max_down_cols = max_down_cols.max(d.cols);
            }
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
        let rpb_gate_up =
            group_rows_per_block("expert_gate_up", max_nk.max(1), cols.unwrap_or(0) / 128, 2, gu_layouts)?;
        let rpb_down = group_rows_per_block("expert_down", max_down_nk.max(1), max_down_nb, 1, down_layouts)?;
        let ctx = self.ctx_of(rank).clone();
        let table = DeviceBuffer::from_host(&ctx, &self.ranks[rank].stream, &words, "expert group table")?;
        let ws = &self.ranks[rank].weights;
        let format =
            entries.iter().flatten().find_map(|en| ws.get(en.gate as usize)).map_or("empty", |w| w.kind.suffix());
        let r = &mut self.ranks[rank];
        let (gate_up_kernel, down_kernel) = group_kernels(gu_layouts, down_layouts);
        r.groups.push(DeviceGroup {
            format,
            gate_up_kernel,
            down_kernel,
            table,
            n_entries: entries.len(),
            experts,
            max_rows,
            cols: cols.unwrap_or(0),
            max_down_rows,
            max_down_cols,
            rpb_gate_up,
            rpb_down,
            routed,
            shared,
        });
        Ok((r.groups.len() - 1) as GroupId)
    }

    pub(super) fn group(&self, rank: usize, g: GroupId, op: &str) -> Result<&DeviceGroup> {
        self.ranks[rank]
            .groups
            .get(g as usize)
            .ok_or_else(|| shape_err(op, format!("group {g} does not exist on rank {rank}")))
    }

    /// Slots of `pitch` each, every one `extent` long, lie inside `s` without overlapping.
    pub(super) fn check_strided(
        op: &str,
        what: &str,
        s: Slice,
        slots: usize,
        pitch: usize,
        extent: usize,
    ) -> Result<()> {
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
}

#[cfg(test)]
mod tests {
    use super::{group_kernels, whole_rounds, GEMV_THREADS};
    use memra_kernels::sources::KERNEL_NAMES;

    /// A block-per-lane-only kernel traps on any other entry, so it runs only where every entry of
    /// the projection kind allows it; each kind is decided alone; every name is a loaded kernel.
    #[test]
    fn a_group_takes_the_block_per_lane_kernels_only_where_every_entry_allows_them() {
        let (all, mixed, none, empty) = ((true, false), (true, true), (false, true), (false, false));
        assert_eq!(group_kernels(all, all), ("expert_gate_up_bpl_f32", "expert_down_bpl_f32"));
        assert_eq!(group_kernels(all, mixed), ("expert_gate_up_bpl_f32", "expert_down_f32"));
        assert_eq!(group_kernels(mixed, all), ("expert_gate_up_f32", "expert_down_bpl_f32"));
        for other in [mixed, none, empty] {
            assert_eq!(group_kernels(other, other), ("expert_gate_up_f32", "expert_down_f32"));
        }
        for layouts in [all, mixed, none, empty] {
            let (g, d) = group_kernels(layouts, layouts);
            assert!(KERNEL_NAMES.contains(&g) && KERNEL_NAMES.contains(&d), "{g} {d}");
        }
    }

    /// A last round half filled or less is dropped where there are more than one; never fewer
    /// than one row; the shapes of `step` (down: 64 rows of 10 pairs; gate/up: 16 rows of 64) and a
    /// nearly full last round (51 gate/up rows of 20) as cases.
    #[test]
    fn grouped_blocks_drop_a_thin_last_round() {
        let t = GEMV_THREADS as usize;
        assert_eq!(whole_rounds(64, 10), 51);
        assert_eq!(whole_rounds(16, 64), 16);
        assert_eq!(whole_rounds(51, 20), 51, "1020 of 1024: kept");
        assert_eq!(whole_rounds(3, 10), 3, "one part-filled round is left as it is");
        for rows in 1..=64 {
            for ppr in 1..=64 {
                let (r, pairs) = (whole_rounds(rows, ppr), rows * ppr);
                assert!((1..=rows).contains(&r), "{rows} rows of {ppr}: {r}");
                let thin = pairs > t && !pairs.is_multiple_of(t) && pairs % t <= t / 2;
                if thin {
                    let whole = pairs / t * t;
                    assert!(r * ppr <= whole && ((r + 1) * ppr > whole || r == 1), "{rows}×{ppr} → {r}");
                } else {
                    assert_eq!(r, rows, "{rows}×{ppr}");
                }
            }
        }
    }
}
