//! Device and pinned host allocations owned by the CUDA backend.
//!
//! Plain `cuMemAlloc` allocations (not stream-ordered pools), so peer access enabled on a context
//! covers every buffer, and each allocation is freed exactly once in `Drop`. The backend drains
//! every stream before it drops anything, so no kernel or copy can still be using a buffer when it
//! is freed. Weights keep their storage format on the device (BF16 bits, f32, E4M3 codes + f32
//! scales, NVFP4 nibbles + ue4m3 scales, W8 int8 + f32 scales), optionally rearranged lane-major (see `layout`).

use super::driver;
use super::layout::{choose_vec, to_block_per_lane, to_lane_major, E4M3_BPL};
use super::safe::{self, DeviceMem, DevicePtr, HostSpan, PinnedHost};
use crate::error::RuntimeError;
use crate::model::matrix::{MatrixShard, ShardData};
use crate::Result;
use cudarc::driver::{CudaContext, CudaStream, DeviceRepr};
use std::sync::Arc;

pub(crate) fn driver_err(location: impl Into<String>, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Device { location: location.into(), detail: e.to_string() }
}

/// One device allocation of `bytes` bytes on the device of `ctx` (freed by its [`DeviceMem`]).
pub(crate) struct DeviceBuffer {
    mem: DeviceMem,
}

impl DeviceBuffer {
    /// Allocate `bytes` (at least 1) zeroed bytes; the zeroing is queued on `stream`, so work
    /// queued later on that stream sees zeros.
    pub(crate) fn zeroed(
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        bytes: usize,
        what: &str,
    ) -> Result<DeviceBuffer> {
        let bytes = bytes.max(1);
        ctx.bind_to_thread().map_err(|e| driver_err(what, e))?;
        // The context is current on this thread; the size is non-zero.
        let mem = DeviceMem::alloc(ctx, bytes).map_err(|e| {
            let location = format!("{what}: allocating {bytes} bytes on device {}", ctx.ordinal());
            if e.0 == driver::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                RuntimeError::OutOfDeviceMemory { location, device: ctx.ordinal(), bytes, detail: e.to_string() }
            } else {
                driver_err(location, e)
            }
        })?;
        let buf = DeviceBuffer { mem };
        // The stream belongs to the allocation's context.
        safe::memset_d8(stream, buf.region(), 0, bytes).map_err(|e| driver_err(format!("{what}: zeroing"), e))?;
        Ok(buf)
    }

    /// A buffer holding `data`, copied synchronously (upload time only).
    pub(crate) fn from_host<T: DeviceRepr>(
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        data: &[T],
        what: &str,
    ) -> Result<DeviceBuffer> {
        let buf = DeviceBuffer::zeroed(ctx, stream, std::mem::size_of_val(data), what)?;
        let upload = |e| driver_err(format!("{what}: upload"), e);
        // `data` is lent to the copy until the stream is synchronized.
        safe::with_host_memory(
            &[stream],
            |h| if data.is_empty() { Ok(()) } else { h.upload(stream, buf.region(), data).map_err(upload) },
            |_, e| upload(e.into()),
        )?;
        Ok(buf)
    }

    /// The device address (a kernel argument).
    pub(crate) fn ptr(&self) -> driver::CUdeviceptr {
        self.mem.region().addr()
    }

    /// The whole allocation (for copies and memsets).
    pub(crate) fn region(&self) -> DevicePtr {
        self.mem.region()
    }
}

/// A page-locked, portable host buffer (staging of the host-bounce transport), freed by its
/// [`PinnedHost`].
pub(crate) struct PinnedBuffer {
    host: PinnedHost,
}

impl PinnedBuffer {
    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<PinnedBuffer> {
        let bytes = bytes.max(4);
        ctx.bind_to_thread().map_err(|e| driver_err("pinned staging", e))?;
        // CU_MEMHOSTALLOC_PORTABLE: pinned for every context, so ranks on several devices can
        // copy through the same staging buffer.
        const PORTABLE: u32 = 0x01;
        // The context is current; a non-zero size.
        let host = PinnedHost::alloc(ctx, bytes, PORTABLE)
            .map_err(|e| driver_err(format!("pinned staging: allocating {bytes} bytes"), e))?;
        Ok(PinnedBuffer { host })
    }

    /// The whole buffer, for staged copies.
    pub(crate) fn span(&self) -> HostSpan {
        self.host.span()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.host.bytes()
    }
}

/// Storage class of a device weight (selects the kernel family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightKind {
    Bf16,
    F32,
    E4m3,
    Nvfp4,
    W8,
}

impl WeightKind {
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            WeightKind::Bf16 => "bf16",
            WeightKind::F32 => "f32",
            WeightKind::E4m3 => "e4m3",
            WeightKind::Nvfp4 => "nvfp4",
            WeightKind::W8 => "w8",
        }
    }
}

/// A weight shard on a device.
pub(crate) struct DeviceWeight {
    pub kind: WeightKind,
    pub data: DeviceBuffer,
    /// E4M3 f32 scales, NVFP4 ue4m3 scales or W8 f32 scales.
    pub scales: Option<DeviceBuffer>,
    pub rows: usize,
    pub cols: usize,
    pub kblock_width: usize,
    pub row0: usize,
    /// Elements per lane-major vector, 0 = row-major.
    pub vec: usize,
}

/// Check a shard's storage against its shape (the rules of `twins::gemv` `check_view`), as
/// errors instead of panics.
fn check_shard(s: &MatrixShard) -> Result<()> {
    let (rows, cols, kw) = (s.out_features, s.in_features, s.kblock_width);
    let shard = format!("weight shard [{rows}, {cols}] (K-block {kw})");
    let bad = |rule: String| Err(RuntimeError::Contract(format!("{shard}: {rule}")));
    if cols > 0 && (kw == 0 || cols % kw != 0) {
        let rule = format!("{shard}: in_features {cols} is not a whole number of K-blocks of width {kw}");
        return Err(RuntimeError::ModelShape { rule });
    }
    let too_big = |value: usize| RuntimeError::Capacity {
        what: "weight shard elements".into(),
        value,
        limit: i32::MAX as usize,
        rule: format!("{shard}: more than 2^31 elements do not fit the kernels' 32-bit indices"),
    };
    let n = rows.checked_mul(cols).ok_or_else(|| RuntimeError::Capacity {
        what: "weight shard elements".into(),
        value: usize::MAX,
        limit: i32::MAX as usize,
        rule: format!("weight shard {rows}×{cols} overflows"),
    })?;
    if i32::try_from(n).is_err() || i32::try_from(rows.max(cols)).is_err() {
        return Err(too_big(n.max(rows.max(cols))));
    }
    match &s.data {
        ShardData::Bf16(b) if b.len() != n => bad(format!("BF16 storage has {} values", b.len())),
        ShardData::F32(v) if v.len() != n => bad(format!("F32 storage has {} values", v.len())),
        ShardData::E4m3 { codes, scales, row0 } => {
            if codes.len() != n {
                return bad(format!("E4M3 storage has {} codes", codes.len()));
            }
            if kw % 128 != 0 || cols % 128 != 0 {
                return bad("E4M3 K-blocks must be whole 128-column scale blocks".into());
            }
            let scale_rows = if rows == 0 { 0 } else { (row0 + rows - 1) / 128 - row0 / 128 + 1 };
            if scales.len() < scale_rows * (cols / 128) {
                return bad(format!(
                    "E4M3 rows {row0}.. need {} scales, storage has {}",
                    scale_rows * (cols / 128),
                    scales.len()
                ));
            }
            Ok(())
        }
        ShardData::Nvfp4 { packed, scales, .. } => {
            if kw % 16 != 0 || packed.len() != n / 2 || scales.len() != n / 16 {
                return bad(format!(
                    "NVFP4 needs K-blocks of whole 16-value groups, {} packed bytes and {} scales; has {} and {}",
                    n / 2,
                    n / 16,
                    packed.len(),
                    scales.len()
                ));
            }
            Ok(())
        }
        ShardData::W8 { q, scales } => {
            if kw % 32 != 0 || cols % 32 != 0 || q.len() != n || scales.len() != n / 32 {
                return bad(format!(
                    "W8 needs K-blocks of whole 32-value groups, {n} values and {} scales; has {} and {}",
                    n / 32,
                    q.len(),
                    scales.len()
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Upload a shard to the device of `ctx` in its storage format; `allow_lane_major` selects the
/// fast layout where the shape allows it.
pub(crate) fn upload_weight(
    ctx: &Arc<CudaContext>,
    stream: &CudaStream,
    shard: &MatrixShard,
    allow_lane_major: bool,
    what: &str,
) -> Result<DeviceWeight> {
    check_shard(shard)?;
    let (rows, cols, kw) = (shard.out_features, shard.in_features, shard.kblock_width);
    let vec = choose_vec(shard, allow_lane_major);
    let (kind, data, scales, row0) = match &shard.data {
        ShardData::Bf16(b) => {
            (WeightKind::Bf16, DeviceBuffer::from_host(ctx, stream, &to_lane_major(b, cols, kw, vec), what)?, None, 0)
        }
        ShardData::F32(v) => {
            (WeightKind::F32, DeviceBuffer::from_host(ctx, stream, &to_lane_major(v, cols, kw, vec), what)?, None, 0)
        }
        ShardData::E4m3 { codes, scales, row0 } => (
            WeightKind::E4m3,
            if vec == E4M3_BPL {
                DeviceBuffer::from_host(ctx, stream, &to_block_per_lane(codes, cols), what)?
            } else {
                DeviceBuffer::from_host(ctx, stream, &to_lane_major(codes, cols, kw, vec), what)?
            },
            Some(DeviceBuffer::from_host(ctx, stream, scales, what)?),
            *row0,
        ),
        ShardData::Nvfp4 { packed, scales, .. } => (
            WeightKind::Nvfp4,
            DeviceBuffer::from_host(ctx, stream, packed, what)?,
            Some(DeviceBuffer::from_host(ctx, stream, scales, what)?),
            0,
        ),
        ShardData::W8 { q, scales } => (
            WeightKind::W8,
            DeviceBuffer::from_host(ctx, stream, q, what)?,
            Some(DeviceBuffer::from_host(ctx, stream, scales, what)?),
            0,
        ),
    };
    Ok(DeviceWeight { kind, data, scales, rows, cols, kblock_width: kw, row0, vec })
}
