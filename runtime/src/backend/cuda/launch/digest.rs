//! The seam digest launches (`kernels/cuda/digest.cu`): one slice into its slot, or a batch of
//! up to `DIGEST_BATCH_MAX` parts (plain, strided, or the owned slots of expert-parallel owners
//! read from the route on the device) in one launch.

use super::{capacity_err, cfg, i32_of, shape_err, DIGEST_THREADS};
use crate::backend::cuda::driver;
use crate::backend::cuda::CudaBackend;
use crate::backend::DigestPart;
use crate::Result;

/// Parts per `digest_batch_f32` launch and values per grid block (digest.cu).
const DIGEST_BATCH_MAX: usize = 32;
const DIGEST_BATCH_CHUNK: usize = 2048;

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

// Passed to the kernel by value: its `DeviceRepr` impl is with the other kernel-argument packing
// in `launch/mod.rs`.

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
    u32::try_from(v).map_err(|_| {
        capacity_err("digest_batch", what, v, u32::MAX as usize, format!("{what} {v} does not fit 32 bits"))
    })
}

impl CudaBackend {
    /// `*slot += digest_f32(x[0..n], base)`.
    pub(crate) fn launch_digest(
        &self,
        rank: usize,
        xp: driver::CUdeviceptr,
        n: usize,
        base: u64,
        slot: driver::CUdeviceptr,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let n_i = i32_of("digest", "length", n)?;
        let grid = n.div_ceil(DIGEST_THREADS as usize * 4).clamp(1, 256);
        launch!(self, rank, "digest_f32", cfg(grid, DIGEST_THREADS, 0), xp, n_i, base, slot)
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
    pub(crate) fn resolve_part(&self, rank: usize, p: &DigestPart, slot: driver::CUdeviceptr) -> Result<ResolvedPart> {
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
