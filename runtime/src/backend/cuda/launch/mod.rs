//! Op → kernel launch on the rank's stream.
//!
//! Every shape rule the host twin asserts is checked here first and returned as a
//! `RuntimeError::Config` naming the op and the numbers, so a kernel never sees an argument it was
//! not written for (the twins panic on the same violations; a device must not read out of
//! bounds instead). Kernel arguments are passed exactly as the `extern "C"` signatures in
//! `kernels/cuda/*.cu` declare them: device pointers as u64, sizes as i32, scalars as f32/u64.
//!
//! One file per family of launches, all through the [`launch!`] macro defined here with the
//! shape helpers they share: `gemv.rs` (row and partial GEMVs, the batched row GEMV), `ops.rs`
//! (every other plain op: folds, elementwise, norms, attention, router, combines, argmax),
//! `at.rs` (the GRAPH door's position-independent launches), `experts.rs` (the expert groups'
//! device tables) with `expert_ops.rs` (the grouped expert launches, rope + append), and
//! `digest.rs` (the seam digests, single and batched).

use crate::backend::Slice;
use crate::error::RuntimeError;
use crate::Result;
use cudarc::driver::{DeviceRepr, LaunchConfig};

/// Threads per block of the GEMV kernels (8 warps; `GEMV_THREADS` in gemv.cu).
const GEMV_THREADS: u32 = 256;
/// Row-fold slots in a GEMV block's shared memory (`GEMV_MAX_TASKS`).
const GEMV_MAX_TASKS: usize = 64;
const TREE_THREADS: u32 = 256;
const ELEMENTWISE_THREADS: u32 = 256;
const ATTN_THREADS: u32 = 128;
const ROUTER_THREADS: u32 = 256;
const ARGMAX_THREADS: u32 = 256;
/// Blocks of the multi-block argmax.
const ARGMAX_MAX_BLOCKS: usize = 128;
/// Bytes of the argmax's scratch per rank: the counter (word 0) and the 64-bit best code (words
/// 2..3, 8-byte aligned), zeroed once and left zero by every launch (moe.cu `argmax_f32`).
pub(crate) const ARGMAX_SCRATCH_BYTES: usize = 16;
const DIGEST_THREADS: u32 = 256;
/// Dynamic shared memory a block gets without opting in (bytes), for every kernel that stages a
/// row or scores (norms, attention, the router): 48 KiB less 1 KiB. Every sm_90 kernel already
/// holds 1 KiB of static shared memory (`cuobjdump -res-usage` shows SHARED:1024 for the
/// attention kernels, which declare none). A 48 KiB request failed to launch (a 12288-wide norm
/// row, CUDA_ERROR_INVALID_VALUE on the H200); 47 KiB of attention scratch launched there
/// (docs/gpu/2026-12-07-attn/).
const SMEM_LIMIT: usize = (48 << 10) - 1024;
const HEAD_DIM: usize = 128;

fn cfg(grid: usize, block: u32, smem: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid.max(1) as u32, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: smem as u32 }
}

/// Grid of a grid-stride elementwise kernel over n elements.
fn elementwise_grid(n: usize) -> usize {
    n.div_ceil(ELEMENTWISE_THREADS as usize).clamp(1, 4096)
}

/// `op` was handed an argument its kernel was not written for: the caller broke its contract.
fn shape_err(op: &str, rule: String) -> RuntimeError {
    RuntimeError::Contract(format!("{op}: {rule}"))
}

/// `what` of `op` is `value`, past the `limit` its kernel can take.
fn capacity_err(op: &str, what: &str, value: usize, limit: usize, rule: String) -> RuntimeError {
    RuntimeError::Capacity { what: format!("{op} {what}"), value, limit, rule: format!("{op}: {rule}") }
}

fn i32_of(op: &str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        capacity_err(op, what, v, i32::MAX as usize, format!("{what} {v} does not fit a 32-bit kernel argument"))
    })
}

/// The shape rules of decode attention over `len` positions (`[q, k, v, gate, out]`, the twin's
/// asserts).
fn attention_shape(what: &str, s: [Slice; 5], len: usize, q_heads: usize, kv_heads: usize) -> Result<()> {
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
    Ok(())
}

/// The dynamic shared memory of an attention launch over `held` positions (bytes): the scores of
/// each of `columns` columns (attention.cu), or a capacity error naming the most positions that fit.
fn attention_smem(what: &str, held: usize, columns: usize) -> Result<usize> {
    let most = SMEM_LIMIT / 4 / columns;
    if held <= most {
        return Ok(columns * held * 4);
    }
    Err(capacity_err(
        what,
        "positions",
        held,
        most,
        format!(
            "{held} positions exceed shared memory: {columns} score row(s) fit {most} positions in {SMEM_LIMIT} bytes"
        ),
    ))
}

/// A kernel parameter: a pointer to `v` (a value type the kernels take by value, never a
/// `CudaSlice`, whose device address would be a field of the struct).
pub(super) fn kernel_param<T: DeviceRepr>(v: &T) -> *mut std::ffi::c_void {
    (v as *const T).cast_mut().cast()
}

/// Launch `$name` on `$rank`'s stream with the listed arguments (each a local of the exact
/// kernel parameter type).
macro_rules! launch {
    ($b:expr, $rank:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let b: &CudaBackend = $b;
        let rank: usize = $rank;
        let name: &'static str = $name;
        let r = &b.ranks[rank];
        let func = b.devices[r.dev].kernels.get(name)?;
        let mut args = [$( crate::backend::cuda::launch::kernel_param(&$arg) ),+];
        // SAFETY: the argument list matches the kernel's `extern "C"` signature in
        // kernels/cuda (types and order), each a pointer to a live local of this block; every
        // device pointer was produced by `slice_ptr` or a weight of this rank, so it lies on this
        // rank's device and its extent was checked against the sizes passed alongside it; the
        // buffers outlive the launch (freed only after a drain).
        let launched =
            unsafe { crate::backend::cuda::safe::launch_kernel(&r.stream, func, $cfg, &mut args, r.programmatic) }
                .map_err(|e| b.fault(rank, name, e));
        r.kernels_issued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        launched
    }};
}

// Kernel-argument packing: the parameter blocks passed by value, and the launch macro above
// (with `safe/`, the only `unsafe` of the CUDA backend outside the driver layer).

/// Declare `$t` a parameter block a kernel takes by value, `$size` bytes (asserted).
macro_rules! param_block {
    ($t:ty, $size:expr) => {
        // SAFETY: a `param_block!` type is `repr(C)`, made only of integer fields and arrays of
        // them with no padding (its size, asserted below, is the sum of its fields and a multiple
        // of its alignment), holds no host pointer, and matches field for field the struct of the
        // same name in kernels/cuda that the kernels take by value.
        unsafe impl DeviceRepr for $t {}
        const _: () = assert!(std::mem::size_of::<$t>() == $size);
    };
}

// `struct GemvBatch` of kernels/cuda/gemv.cu: u64/i32 arrays and an i32, 64 + 16 + 20 + 4 bytes.
param_block!(gemv::GemvBatch, 104);
// `struct LanePitch` of kernels/cuda/canon.cuh: 12 i32.
param_block!(lane_grid::LanePitch, 48);
// `struct DigestBatch` of kernels/cuda/digest.cu: u64/u32 arrays and a u32.
param_block!(digest::DigestBatch, 2440);

mod at;
mod digest;
mod doors29;
mod down8;
mod expert_ops;
pub(crate) mod experts;
mod gemv;
pub(crate) mod lane_grid;
pub(crate) mod lanes;
mod ops;
mod passes;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_smem_holds_each_columns_scores_and_names_the_most_that_fit() {
        assert_eq!(attention_smem("t", 40, 1).unwrap(), 40 * 4);
        assert_eq!(attention_smem("t", 40, 2).unwrap(), 80 * 4);
        for columns in [1, 2] {
            let err = attention_smem("t", SMEM_LIMIT, columns).unwrap_err().to_string();
            let most: usize = err.split(" fit ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
            assert!(attention_smem("t", most, columns).is_ok(), "{err}");
            assert!(attention_smem("t", most + 1, columns).is_err(), "{err}");
            assert!(columns * most * 4 <= SMEM_LIMIT && columns * (most + 1) * 4 > SMEM_LIMIT, "{err}");
        }
    }
}
