//! Op → kernel launch on the rank's stream.
//!
//! Every shape rule the host twin asserts is checked here first and returned as a
//! `RuntimeError::Config` naming the op and the numbers, so a kernel never sees an argument it was
//! not written for (the twins panic on the same violations; a device must not read out of
//! bounds instead). Kernel arguments are passed exactly as the `extern "C"` signatures in
//! `kernels/cuda/*.cu` declare them: device pointers as u64, sizes as i32, scalars as f32/u64.

use super::memory::WeightKind;
use super::CudaBackend;
use crate::backend::{Op, RowOrder, Slice};
use crate::error::RuntimeError;
use crate::Result;
use cudarc::driver::{result as dresult, sys as dsys, LaunchConfig, PushKernelArg};

/// Threads per block of the GEMV kernels (8 warps; `GEMV_THREADS` in gemv.cu).
const GEMV_THREADS: u32 = 256;
/// Row-fold slots in a GEMV block's shared memory (`GEMV_MAX_TASKS`).
const GEMV_MAX_TASKS: usize = 64;
const TREE_THREADS: u32 = 256;
const ELEMENTWISE_THREADS: u32 = 256;
const ATTN_THREADS: u32 = 128;
const ROUTER_THREADS: u32 = 256;
const ARGMAX_THREADS: u32 = 256;
/// Blocks of the multi-block argmax: its scratch (per rank) holds a counter and 2 words per block.
pub(crate) const ARGMAX_MAX_BLOCKS: usize = 128;
const DIGEST_THREADS: u32 = 256;
/// Dynamic shared memory available without opting in (bytes).
const SMEM_LIMIT: usize = 48 << 10;
const HEAD_DIM: usize = 128;

fn cfg(grid: usize, block: u32, smem: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid.max(1) as u32, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: smem as u32 }
}

/// Blocks a GEMV grid should have at least: two per SM of an H200 (132 SMs).
const GEMV_MIN_BLOCKS: usize = 264;

/// Rows per block of a GEMV with `nk` K-blocks: about 32 (row, K-block) tasks for 8 warps,
/// within the fold slots — fewer when the matrix has too few rows to give every SM two blocks
/// (the router's 288 rows, k/v's 1024). A launch choice, never part of the arithmetic.
pub(crate) fn gemv_rows_per_block(rows: usize, nk: usize) -> usize {
    let base = (32 / nk).clamp(1, GEMV_MAX_TASKS / nk);
    base.min((rows / GEMV_MIN_BLOCKS).max(1))
}

/// `gemv_rows_batch_*`'s parameter block (`struct GemvBatch` in gemv.cu: 104 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct GemvBatch {
    w: [u64; 4],
    out: [u64; 4],
    rows: [i32; 4],
    block_start: [i32; 5],
    count: i32,
}

// SAFETY: `GemvBatch` is `repr(C)` of u64/i32 arrays and an i32, with the field order and types of
// `struct GemvBatch` in kernels/cuda/gemv.cu (no padding: 64 + 16 + 20 + 4 = 104 bytes, a multiple
// of its 8-byte alignment); the kernel takes it by value.
unsafe impl cudarc::driver::DeviceRepr for GemvBatch {}

/// Dynamic shared memory of the norm kernels: one staged row of `n` f32 (one block per row).
/// The kernels' static shared memory (the warp sums) comes out of the same 48 KiB a block gets
/// without an opt-in attribute, so 1 KiB of it is kept for them (a 12288-wide row, exactly
/// 48 KiB, failed to launch with CUDA_ERROR_INVALID_VALUE on the H200).
fn norm_smem(n: usize) -> Result<usize> {
    const MAX: usize = (48 << 10) - 1024;
    if n * 4 > MAX {
        return Err(RuntimeError::Config(format!(
            "rmsnorm: a row of {n} values needs {} bytes of shared memory, more than the {MAX} a block gets",
            n * 4
        )));
    }
    Ok(n * 4)
}

/// Grid of a grid-stride elementwise kernel over n elements.
fn elementwise_grid(n: usize) -> usize {
    n.div_ceil(ELEMENTWISE_THREADS as usize).clamp(1, 4096)
}

fn shape_err(op: &str, rule: String) -> RuntimeError {
    RuntimeError::Config(format!("{op}: {rule}"))
}

fn i32_of(op: &str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| shape_err(op, format!("{what} {v} does not fit a 32-bit kernel argument")))
}

/// The shape rules of decode attention over `len` positions (`[q, k, v, gate, out]`, the twin's
/// asserts); returns the dynamic shared memory the scores need.
fn attention_shape(what: &str, s: [Slice; 5], len: usize, q_heads: usize, kv_heads: usize) -> Result<usize> {
    let [q, k, v, gate, out] = s;
    let need = len.checked_mul(kv_heads).and_then(|n| n.checked_mul(HEAD_DIM));
    let ok = len >= 1
        && kv_heads >= 1
        && q_heads.is_multiple_of(kv_heads)
        && q.len == q_heads * HEAD_DIM
        && out.len == q_heads * HEAD_DIM
        && gate.len == q_heads
        && need.is_some_and(|n| k.len >= n && v.len >= n);
    if !ok {
        return Err(shape_err(
            what,
            format!(
                "len {len}, q_heads {q_heads}, kv_heads {kv_heads}: q {} out {} gate {} k {} v {} break the shape rules",
                q.len, out.len, gate.len, k.len, v.len
            ),
        ));
    }
    if len * 4 > SMEM_LIMIT {
        return Err(shape_err(
            what,
            format!("{len} positions exceed the {} scores held in shared memory", SMEM_LIMIT / 4),
        ));
    }
    Ok(len * 4)
}

/// Launch `$name` on `$rank`'s stream with the listed arguments (each a local of the exact
/// kernel parameter type).
macro_rules! launch {
    ($b:expr, $rank:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let b: &CudaBackend = $b;
        let rank: usize = $rank;
        let name: &'static str = $name;
        let dev = &b.devices[b.ranks[rank].dev];
        let func = dev.kernels.get(name)?;
        let stream = &b.ranks[rank].stream;
        let mut builder = stream.launch_builder(func);
        $( builder.arg(&$arg); )+
        // SAFETY: the argument list matches the kernel's `extern "C"` signature in
        // kernels/cuda (types and order); every pointer was produced by `slice_ptr` or a weight of
        // this rank, so it lies on this rank's device and its extent was checked against the
        // sizes passed alongside it; the buffers outlive the launch (freed only after a drain).
        unsafe { builder.launch($cfg) }.map(|_| ()).map_err(|e| b.fault(rank, name, e))
    }};
}

// The GRAPH door's position-independent launches (they use `launch!`, so they follow it).
#[path = "launch_at.rs"]
mod launch_at;
// Grouped experts, rope + append, batched digests (they use `launch!` too).
#[path = "experts.rs"]
pub(crate) mod experts;

impl CudaBackend {
    fn weight_shape(&self, rank: usize, w: u32, op: &str) -> Result<(WeightKind, usize, usize, usize, usize)> {
        let ws = &self.ranks[rank].weights;
        let wt =
            ws.get(w as usize).ok_or_else(|| shape_err(op, format!("weight {w} does not exist on rank {rank}")))?;
        Ok((wt.kind, wt.rows, wt.cols, wt.kblock_width, wt.vec))
    }

    /// Zero `len` f32 at `ptr` on the rank's stream.
    fn zero(&self, rank: usize, ptr: dsys::CUdeviceptr, len: usize, what: &str) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let r = &self.ranks[rank];
        r.stream.context().bind_to_thread().map_err(|e| self.fault(rank, what, e))?;
        // SAFETY: `ptr` addresses `len` checked f32 of a live buffer on this rank's device.
        unsafe { dresult::memset_d8_async(ptr, 0, len * 4, r.stream.cu_stream()) }
            .map_err(|e| self.fault(rank, what, e))
    }

    /// `out` is a slice of `out_rank` (`rank` itself, or the root of a peer store).
    fn gemv(&self, rank: usize, w: u32, x: Slice, out: Slice, out_rank: usize, mode: GemvMode) -> Result<()> {
        let op = mode.name();
        let (kind, rows, cols, kw, vec) = self.weight_shape(rank, w, op)?;
        let xp = self.slice_ptr(rank, x, op)?;
        let op_ptr = self.slice_ptr(out_rank, out, op)?;
        if x.len != cols {
            return Err(shape_err(op, format!("x has {} elements but the weight has in_features {cols}", x.len)));
        }
        let nk = if cols == 0 { 0 } else { cols / kw };
        let want_out = if mode == GemvMode::Partials { nk * rows } else { rows };
        if out.len != want_out {
            return Err(shape_err(
                op,
                format!("out has {} values, expected {want_out} ({rows} rows, {nk} K-blocks)", out.len),
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        if cols == 0 {
            // Rows of an empty view are +0.0 (the canonical fold of no partials).
            return self.zero(rank, op_ptr, out.len, op);
        }
        let wt = &self.ranks[rank].weights[w as usize];
        let wp = wt.data.ptr();
        let sp = wt.scales.as_ref().map(|s| s.ptr()).unwrap_or(0);
        let (rows_i, cols_i, kw_i, vec_i) = (rows as i32, cols as i32, kw as i32, vec as i32);
        // W8 has one order (the host runs w8_rows for either RowOrder).
        let mode = if kind == WeightKind::W8 && mode == GemvMode::Tree { GemvMode::Rows } else { mode };
        if mode == GemvMode::Tree {
            let name = match kind {
                WeightKind::Bf16 => "gemv_rows_tree_bf16",
                WeightKind::F32 => "gemv_rows_tree_f32",
                _ => {
                    return Err(shape_err(
                        op,
                        format!(
                            "the tree order (QKV_FUSED) is defined for BF16 and F32 weights, not {}",
                            kind.suffix()
                        ),
                    ))
                }
            };
            return launch!(self, rank, name, cfg(rows, TREE_THREADS, 0), wp, xp, op_ptr, rows_i, cols_i, kw_i, vec_i);
        }
        if nk > GEMV_MAX_TASKS {
            return Err(shape_err(op, format!("{nk} K-blocks exceed the kernel's {GEMV_MAX_TASKS}")));
        }
        let rpb = gemv_rows_per_block(rows, nk);
        let grid = rows.div_ceil(rpb);
        let rpb_i = rpb as i32;
        let c = cfg(grid, GEMV_THREADS, 0);
        let partials = mode == GemvMode::Partials;
        match kind {
            WeightKind::Bf16 => {
                let name = if partials { "gemv_partials_bf16" } else { "gemv_rows_bf16" };
                launch!(self, rank, name, c, wp, xp, op_ptr, rows_i, cols_i, kw_i, rpb_i, vec_i)
            }
            WeightKind::F32 => {
                let name = if partials { "gemv_partials_f32" } else { "gemv_rows_f32" };
                launch!(self, rank, name, c, wp, xp, op_ptr, rows_i, cols_i, kw_i, rpb_i, vec_i)
            }
            WeightKind::E4m3 => {
                let name = if partials { "gemv_partials_e4m3" } else { "gemv_rows_e4m3" };
                let row0 = i32_of(op, "row0", wt.row0)?;
                launch!(self, rank, name, c, wp, sp, row0, xp, op_ptr, rows_i, cols_i, kw_i, rpb_i, vec_i)
            }
            WeightKind::Nvfp4 => {
                let name = if partials { "gemv_partials_nvfp4" } else { "gemv_rows_nvfp4" };
                launch!(self, rank, name, c, wp, sp, xp, op_ptr, rows_i, cols_i, kw_i, rpb_i)
            }
            WeightKind::W8 => {
                let name = if partials { "gemv_partials_w8" } else { "gemv_rows_w8" };
                launch!(self, rank, name, c, wp, sp, xp, op_ptr, rows_i, cols_i, kw_i, rpb_i)
            }
        }
    }

    /// Several canonical row GEMVs over one `x`: one launch when every weight is BF16 (or every
    /// one F32) with the same columns, K-block width and layout; else one launch each (the same
    /// arithmetic either way).
    fn gemv_batch(&self, rank: usize, items: &[(u32, Slice)], x: Slice) -> Result<()> {
        let op = "gemv_rows_batch";
        let shapes = items.iter().map(|(w, _)| self.weight_shape(rank, *w, op)).collect::<Result<Vec<_>>>()?;
        let first = shapes.first().copied();
        let uniform = first.is_some_and(|(kind, _, cols, kw, vec)| {
            matches!(kind, WeightKind::Bf16 | WeightKind::F32)
                && cols > 0
                && shapes.iter().all(|s| (s.0, s.2, s.3, s.4) == (kind, cols, kw, vec) && s.1 > 0)
        });
        if !uniform || items.len() > 4 {
            for (w, out) in items {
                self.gemv(rank, *w, x, *out, rank, GemvMode::Rows)?;
            }
            return Ok(());
        }
        let (kind, _, cols, kw, vec) = first.expect("checked non-empty");
        let xp = self.slice_ptr(rank, x, op)?;
        if x.len != cols {
            return Err(shape_err(op, format!("x has {} elements but the weights have in_features {cols}", x.len)));
        }
        let nk = cols / kw;
        if nk > GEMV_MAX_TASKS {
            return Err(shape_err(op, format!("{nk} K-blocks exceed the kernel's {GEMV_MAX_TASKS}")));
        }
        let total_rows: usize = shapes.iter().map(|s| s.1).sum();
        let rpb = gemv_rows_per_block(total_rows, nk);
        let mut b = GemvBatch { w: [0; 4], out: [0; 4], rows: [0; 4], block_start: [0; 5], count: items.len() as i32 };
        let mut blocks = 0usize;
        for (i, ((w, out), s)) in items.iter().zip(&shapes).enumerate() {
            if out.len != s.1 {
                return Err(shape_err(op, format!("item {i}: out has {} values, the weight {} rows", out.len, s.1)));
            }
            b.w[i] = self.ranks[rank].weights[*w as usize].data.ptr();
            b.out[i] = self.slice_ptr(rank, *out, op)?;
            b.rows[i] = i32_of(op, "rows", s.1)?;
            b.block_start[i] = i32_of(op, "blocks", blocks)?;
            blocks += s.1.div_ceil(rpb);
        }
        for i in items.len()..5 {
            b.block_start[i] = i32_of(op, "blocks", blocks)?;
        }
        let name = if kind == WeightKind::Bf16 { "gemv_rows_batch_bf16" } else { "gemv_rows_batch_f32" };
        let (cols_i, kw_i, rpb_i, vec_i) = (cols as i32, kw as i32, rpb as i32, vec as i32);
        launch!(self, rank, name, cfg(blocks, GEMV_THREADS, 0), b, xp, cols_i, kw_i, rpb_i, vec_i)
    }

    /// Check `rows` rows of `width` (the weight length) in `x`, as the norm twins do.
    fn norm_rows(op: &str, n: usize, width: usize) -> Result<usize> {
        if width == 0 {
            return if n == 0 { Ok(0) } else { Err(shape_err(op, format!("empty weight but {n} input elements"))) };
        }
        if !n.is_multiple_of(width) {
            return Err(shape_err(op, format!("{n} input elements are not whole rows of width {width}")));
        }
        Ok(n / width)
    }

    pub(crate) fn launch_op(&self, rank: usize, op: &Op) -> Result<()> {
        self.launch_op_to(rank, op, rank)
    }

    /// Launch `op` on `rank`'s stream with its store target ([`Op::store_target`]) resolved on
    /// `out_rank` — the one place a kernel is handed another rank's pointer (a peer store; the
    /// caller enabled peer access and placed the fences). Every other slice is `rank`'s. An op
    /// without a store target cannot be redirected.
    pub(crate) fn launch_op_to(&self, rank: usize, op: &Op, out_rank: usize) -> Result<()> {
        if out_rank != rank && op.store_target().is_none() {
            return Err(shape_err(
                crate::backend::host::op_name(op),
                format!("has no single output to store into rank {out_rank} from rank {rank}"),
            ));
        }
        let to = out_rank;
        match *op {
            Op::GemvRows { w, x, out, order } => {
                let mode = if order == RowOrder::Tree { GemvMode::Tree } else { GemvMode::Rows };
                self.gemv(rank, w, x, out, to, mode)
            }
            Op::GemvPartials { w, x, out } => self.gemv(rank, w, x, out, to, GemvMode::Partials),
            Op::GemvRowsBatch { ref items, x } => self.gemv_batch(rank, items, x),
            Op::Fold { parts, n_parts, reverse, out } => {
                let (pp, outp) = (self.slice_ptr(rank, parts, "fold")?, self.slice_ptr(to, out, "fold")?);
                if Some(parts.len) != n_parts.checked_mul(out.len) {
                    return Err(shape_err(
                        "fold",
                        format!("{} values is not {n_parts} parts × {}", parts.len, out.len),
                    ));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let (np, width, rev) = (i32_of("fold", "n_parts", n_parts)?, out.len as i32, reverse as i32);
                launch!(
                    self,
                    rank,
                    "fold_f32",
                    cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0),
                    pp,
                    np,
                    width,
                    rev,
                    outp
                )
            }
            Op::Add { a, b, out } => {
                let (ap, bp, outp) =
                    (self.slice_ptr(rank, a, "add")?, self.slice_ptr(rank, b, "add")?, self.slice_ptr(to, out, "add")?);
                if a.len != out.len || b.len != out.len {
                    return Err(shape_err("add", format!("lengths {} + {} → {}", a.len, b.len, out.len)));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let n = out.len as i32;
                launch!(self, rank, "add_f32", cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0), ap, bp, outp, n)
            }
            Op::Scale { x, s, out } => {
                let (xp, outp) = (self.slice_ptr(rank, x, "scale")?, self.slice_ptr(to, out, "scale")?);
                if x.len != out.len {
                    return Err(shape_err("scale", format!("lengths {} → {}", x.len, out.len)));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let n = out.len as i32;
                launch!(self, rank, "scale_f32", cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0), xp, s, outp, n)
            }
            Op::RmsNorm { x, w, eps, out } => {
                let (xp, wp, outp) = (
                    self.slice_ptr(rank, x, "rmsnorm")?,
                    self.slice_ptr(rank, w, "rmsnorm")?,
                    self.slice_ptr(rank, out, "rmsnorm")?,
                );
                let rows = Self::norm_rows("rmsnorm", x.len, w.len)?;
                if out.len != x.len {
                    return Err(shape_err("rmsnorm", format!("out has {} elements, x has {}", out.len, x.len)));
                }
                if rows == 0 {
                    return Ok(());
                }
                let (n, rows_i) = (w.len as i32, rows as i32);
                launch!(self, rank, "rmsnorm_f32", cfg(rows, 256, norm_smem(w.len)?), xp, wp, eps, outp, n, rows_i)
            }
            Op::AddRmsNorm { x, a, w, eps, h, out } => {
                let what = "add_rmsnorm";
                let (xp, ap, wp, hp, outp) = (
                    self.slice_ptr(rank, x, what)?,
                    self.slice_ptr(rank, a, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, h, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let rows = Self::norm_rows(what, x.len, w.len)?;
                if a.len != x.len || h.len != x.len || out.len != x.len {
                    return Err(shape_err(what, format!("x {} a {} h {} out {} differ", x.len, a.len, h.len, out.len)));
                }
                if rows == 0 {
                    return Ok(());
                }
                let (n, rows_i) = (w.len as i32, rows as i32);
                launch!(
                    self,
                    rank,
                    "add_rmsnorm_f32",
                    cfg(rows, 256, norm_smem(w.len)?),
                    xp,
                    ap,
                    wp,
                    eps,
                    hp,
                    outp,
                    n,
                    rows_i
                )
            }
            Op::FoldAddRmsNorm { parts, n_parts, x, w, eps, a, h, out } => {
                let what = "fold_add_rmsnorm";
                let (pp, xp, wp, ap, hp, outp) = (
                    self.slice_ptr(rank, parts, what)?,
                    self.slice_ptr(rank, x, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, a, what)?,
                    self.slice_ptr(rank, h, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let rows = Self::norm_rows(what, x.len, w.len)?;
                if a.len != x.len || h.len != x.len || out.len != x.len || Some(parts.len) != n_parts.checked_mul(x.len)
                {
                    return Err(shape_err(
                        what,
                        format!(
                            "parts {} ({n_parts} parts) x {} a {} h {} out {}",
                            parts.len, x.len, a.len, h.len, out.len
                        ),
                    ));
                }
                if rows == 0 {
                    return Ok(());
                }
                let (np, n, rows_i) = (i32_of(what, "n_parts", n_parts)?, w.len as i32, rows as i32);
                launch!(
                    self,
                    rank,
                    "fold_add_rmsnorm_f32",
                    cfg(rows, 256, norm_smem(w.len)?),
                    pp,
                    np,
                    xp,
                    wp,
                    eps,
                    ap,
                    hp,
                    outp,
                    n,
                    rows_i
                )
            }
            Op::QkNormRope { x, w, eps, cos_sin } => {
                let what = "qk_norm_rope";
                let (xp, wp, cp) = (
                    self.slice_ptr(rank, x, what)?,
                    self.slice_ptr(rank, w, what)?,
                    self.slice_ptr(rank, cos_sin, what)?,
                );
                if x.len % HEAD_DIM != 0 || w.len != HEAD_DIM || cos_sin.len != HEAD_DIM {
                    return Err(shape_err(
                        what,
                        format!("x {} (whole heads of 128), w {}, cos_sin {} (128 each)", x.len, w.len, cos_sin.len),
                    ));
                }
                let heads = x.len / HEAD_DIM;
                if heads == 0 {
                    return Ok(());
                }
                let heads_i = heads as i32;
                launch!(self, rank, "qk_norm_rope_f32", cfg(heads.div_ceil(4), 128, 0), xp, wp, eps, cp, heads_i)
            }
            Op::Attention { q, k, v, gate, len, q_heads, kv_heads, out } => {
                let what = "attention";
                let (qp, kp, vp, gp, outp) = (
                    self.slice_ptr(rank, q, what)?,
                    self.slice_ptr(rank, k, what)?,
                    self.slice_ptr(rank, v, what)?,
                    self.slice_ptr(rank, gate, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let smem = attention_shape(what, [q, k, v, gate, out], len, q_heads, kv_heads)?;
                let (len_i, qh, kvh) = (len as i32, q_heads as i32, kv_heads as i32);
                launch!(
                    self,
                    rank,
                    "decode_attention_f32",
                    cfg(q_heads, ATTN_THREADS, smem),
                    qp,
                    kp,
                    vp,
                    gp,
                    len_i,
                    qh,
                    kvh,
                    outp
                )
            }
            Op::Router { logits, bias, k, normalize, scaling, out, device_variant } => {
                let what = "router";
                let (lp, bp, outp) = (
                    self.slice_ptr(rank, logits, what)?,
                    self.slice_ptr(rank, bias, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                let n = logits.len;
                if bias.len != n || k > n || out.len != 2 * k || k > 32 || 12 * n > SMEM_LIMIT {
                    return Err(shape_err(
                        what,
                        format!(
                            "{n} experts, bias {}, top-{k}, out {} (needs 2k, k ≤ 32, ≤ 4096 experts)",
                            bias.len, out.len
                        ),
                    ));
                }
                if k == 0 {
                    return Ok(());
                }
                let name = if device_variant { "router_topk_dev_f32" } else { "router_topk_f32" };
                let (n_i, k_i, norm) = (n as i32, k as i32, normalize as i32);
                launch!(self, rank, name, cfg(1, ROUTER_THREADS, 12 * n), lp, bp, n_i, k_i, norm, scaling, outp)
            }
            Op::Swiglu { gate, up, limit, out } => {
                let what = "swiglu";
                let (gp, up_p, outp) = (
                    self.slice_ptr(rank, gate, what)?,
                    self.slice_ptr(rank, up, what)?,
                    self.slice_ptr(rank, out, what)?,
                );
                if up.len != gate.len || out.len != gate.len {
                    return Err(shape_err(what, format!("gate {} up {} out {}", gate.len, up.len, out.len)));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let (has, lim, n) = (limit.is_some() as i32, limit.unwrap_or(0.0), out.len as i32);
                launch!(
                    self,
                    rank,
                    "swiglu_f32",
                    cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0),
                    gp,
                    up_p,
                    has,
                    lim,
                    outp,
                    n
                )
            }
            Op::Combine { y, w, out } => {
                let what = "combine";
                let (yp, wp, outp) =
                    (self.slice_ptr(rank, y, what)?, self.slice_ptr(rank, w, what)?, self.slice_ptr(rank, out, what)?);
                if Some(y.len) != w.len.checked_mul(out.len) {
                    return Err(shape_err(
                        what,
                        format!("y has {} elements, expected slots {} × width {}", y.len, w.len, out.len),
                    ));
                }
                if out.len == 0 {
                    return Ok(());
                }
                let (slots, width) = (i32_of(what, "slots", w.len)?, out.len as i32);
                launch!(
                    self,
                    rank,
                    "combine_f32",
                    cfg(elementwise_grid(out.len), ELEMENTWISE_THREADS, 0),
                    yp,
                    wp,
                    slots,
                    width,
                    outp
                )
            }
            Op::CombineShared { y, w, out } => {
                let what = "combine_shared";
                let (yp, wp, outp) =
                    (self.slice_ptr(rank, y, what)?, self.slice_ptr(rank, w, what)?, self.slice_ptr(rank, out, what)?);
                let width = out.len / 2;
                if out.len % 2 != 0 || Some(y.len) != (w.len + 1).checked_mul(width) {
                    return Err(shape_err(
                        what,
                        format!("y {} for {} routed slots + shared, out {} (2 × width)", y.len, w.len, out.len),
                    ));
                }
                if width == 0 {
                    return Ok(());
                }
                let (k, width_i) = (i32_of(what, "slots", w.len)?, i32_of(what, "width", width)?);
                let c = cfg(elementwise_grid(width), ELEMENTWISE_THREADS, 0);
                launch!(self, rank, "combine_shared_f32", c, yp, wp, k, width_i, outp)
            }
            Op::ResidualAdd { h, a, b, sum, out } => {
                let what = "residual_add";
                let p = |s: Slice| self.slice_ptr(rank, s, what);
                let (hp, ap, bp, sp, outp) = (p(h)?, p(a)?, p(b)?, p(sum)?, p(out)?);
                let n = h.len;
                if a.len != n || b.len != n || sum.len != n || out.len != n {
                    return Err(shape_err(
                        what,
                        format!("h {n} a {} b {} sum {} out {}", a.len, b.len, sum.len, out.len),
                    ));
                }
                if n == 0 {
                    return Ok(());
                }
                let n_i = i32_of(what, "length", n)?;
                let c = cfg(elementwise_grid(n), ELEMENTWISE_THREADS, 0);
                launch!(self, rank, "residual_add_f32", c, hp, ap, bp, sp, outp, n_i)
            }
            Op::Argmax { x, out } => {
                let (xp, outp) = (self.slice_ptr(rank, x, "argmax")?, self.slice_ptr(rank, out, "argmax")?);
                if out.len != 1 {
                    return Err(shape_err("argmax", format!("out has {} elements, expected 1", out.len)));
                }
                let n = i32_of("argmax", "length", x.len)?;
                let grid = x.len.div_ceil(ARGMAX_THREADS as usize * 8).clamp(1, ARGMAX_MAX_BLOCKS);
                let scratch = self.ranks[rank].scratch.ptr();
                launch!(self, rank, "argmax_f32", cfg(grid, ARGMAX_THREADS, 0), xp, n, outp, scratch)
            }
            Op::FlipLowBit { x } => {
                let xp = self.slice_ptr(rank, x, "flip_low_bit")?;
                if x.len == 0 {
                    return Err(shape_err("flip_low_bit", "empty slice".into()));
                }
                launch!(self, rank, "flip_low_bit_f32", cfg(1, 32, 0), xp)
            }
            Op::SetU32 { .. } | Op::QkNormRopeAt { .. } | Op::AttentionAt { .. } | Op::AppendAt { .. } => {
                self.launch_at_op(rank, op)
            }
            Op::RopeAppend { .. }
            | Op::ExpertGateUp { .. }
            | Op::ExpertDown { .. }
            | Op::FoldSlots { .. }
            | Op::FoldCombine { .. }
            | Op::SelectSlots { .. }
            | Op::CombineOwned { .. } => self.launch_expert_op(rank, op, to),
        }
    }

    /// `*slot += digest_f32(x[0..n], base)`.
    pub(crate) fn launch_digest(
        &self,
        rank: usize,
        xp: dsys::CUdeviceptr,
        n: usize,
        base: u64,
        slot: dsys::CUdeviceptr,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let n_i = i32_of("digest", "length", n)?;
        let grid = n.div_ceil(DIGEST_THREADS as usize * 4).clamp(1, 256);
        launch!(self, rank, "digest_f32", cfg(grid, DIGEST_THREADS, 0), xp, n_i, base, slot)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GemvMode {
    Rows,
    Partials,
    Tree,
}

impl GemvMode {
    fn name(self) -> &'static str {
        match self {
            GemvMode::Rows => "gemv_rows",
            GemvMode::Partials => "gemv_partials",
            GemvMode::Tree => "gemv_rows_tree",
        }
    }
}
