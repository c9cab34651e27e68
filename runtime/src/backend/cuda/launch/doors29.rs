//! Launches of issue 29's doors (`kernels/cuda/doors29.cu`): SEL_MIRROR's selection mirror (a
//! peer store of words, bit for bit) and FENCE_RANK1's kernel doorbell (one word stored into the
//! root's device memory; the fence around it is `backend/cuda/direct.rs`).

use super::{cfg, elementwise_grid, i32_of, shape_err, ELEMENTWISE_THREADS};
use crate::backend::cuda::driver::CUdeviceptr;
use crate::backend::cuda::CudaBackend;
use crate::backend::Slice;
use crate::Result;

impl CudaBackend {
    /// `Op::MirrorSel`: `src` (on `rank`) to `out` (on `to`, a peer store when they differ).
    pub(super) fn launch_mirror_sel(&self, rank: usize, src: Slice, out: Slice, to: usize) -> Result<()> {
        let what = "mirror_sel";
        if src.len != out.len {
            return Err(shape_err(
                what,
                format!("a mirror copies bit for bit: source {} words, destination {}", src.len, out.len),
            ));
        }
        let (sp, op) = (self.slice_ptr(rank, src, what)?, self.slice_ptr(to, out, what)?);
        if src.len == 0 {
            return Ok(());
        }
        let n = i32_of(what, "words", src.len)?;
        launch!(self, rank, "mirror_sel_u32", cfg(elementwise_grid(src.len), ELEMENTWISE_THREADS, 0), sp, op, n)
    }

    /// FENCE_RANK1: on `rank`'s stream, store `ticket` into the flag word at `flag` (device
    /// memory of another rank's device, reachable from `rank`: the caller enabled peer access).
    pub(crate) fn launch_ring_flag(&self, rank: usize, flag: CUdeviceptr, ticket: u32) -> Result<()> {
        launch!(self, rank, "ring_flag_u32", cfg(1, 32, 0), flag, ticket)
    }
}
