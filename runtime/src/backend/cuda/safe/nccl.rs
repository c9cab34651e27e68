//! NCCL in the safe driver layer: typed wrappers over the entry points `nccl_sys.rs` resolved —
//! owned communicators destroyed once in `Drop`, and every send, receive, broadcast and
//! all-reduce checked against the device regions it is given (`safe/mod.rs`).

use super::{fits, CallError, DevicePtr};
use crate::backend::cuda::driver::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t};
use crate::backend::cuda::nccl_sys::{Lib, UniqueId};
use cudarc::driver::CudaStream;
use std::ffi::{c_int, c_void, CStr};

/// The NCCL library of this process (its entry points resolved with nccl.h's signatures by
/// `nccl_sys::load`, the only maker of a [`Lib`]).
#[derive(Clone, Copy)]
pub(crate) struct Nccl {
    lib: &'static Lib,
}

/// Why an NCCL call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NcclFail {
    /// NCCL's result code.
    Code(c_int),
    /// Refused by this layer before NCCL was called.
    Refused(CallError),
}

/// The element type of an NCCL transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    U32,
    F32,
    U64,
}

impl Elem {
    fn nccl(self) -> ncclDataType_t {
        match self {
            Elem::U32 => ncclDataType_t::ncclUint32,
            Elem::F32 => ncclDataType_t::ncclFloat32,
            Elem::U64 => ncclDataType_t::ncclUint64,
        }
    }

    fn bytes(self) -> usize {
        match self {
            Elem::U32 | Elem::F32 => 4,
            Elem::U64 => 8,
        }
    }
}

/// `count` elements of `elem` fit in `region` of `call`.
fn holds(call: &'static str, region: &'static str, p: DevicePtr, count: usize, elem: Elem) -> Result<(), NcclFail> {
    fits(call, region, count.saturating_mul(elem.bytes()), p.bytes()).map_err(NcclFail::Refused)
}

fn code(r: c_int) -> Result<(), NcclFail> {
    if r == 0 {
        Ok(())
    } else {
        Err(NcclFail::Code(r))
    }
}

fn stream_of(s: &CudaStream) -> cudaStream_t {
    s.cu_stream() as cudaStream_t
}

/// One NCCL communicator member, destroyed exactly once in `Drop` (`ncclCommDestroy`, result
/// ignored: nothing to undo), unless leaked with [`Comm::leak`].
pub(crate) struct Comm {
    nccl: Nccl,
    raw: ncclComm_t,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not run
// concurrently; its owners (the backend, the distributed mover) are only ever used by one thread
// at a time (`&mut self`).
unsafe impl Send for Comm {}

impl Comm {
    /// Give the member up without destroying it (what the backend does after a failed
    /// creation, whose members may not be complete).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: `raw` came from a successful ncclCommInitAll/ncclCommInitRank and is destroyed
        // once; its owner drained every stream (or runs under its watchdog) before dropping it.
        let _ = unsafe { (self.nccl.lib.comm_destroy)(self.raw) };
    }
}

impl Nccl {
    pub(crate) fn new(lib: &'static Lib) -> Nccl {
        Nccl { lib }
    }

    /// The name dlopen succeeded with.
    pub(crate) fn name(self) -> &'static str {
        &self.lib.name
    }

    /// `ncclGetVersion` as (major, minor, patch).
    pub(crate) fn version(self) -> (i32, i32, i32) {
        self.lib.version
    }

    /// `ncclGetErrorString(code)`.
    pub(crate) fn error_string(self, code: c_int) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        unsafe { CStr::from_ptr((self.lib.get_error_string)(code)) }.to_string_lossy().into_owned()
    }

    /// `ncclGetLastError(NULL)` when the library has it and the message is not empty.
    pub(crate) fn last_error(self) -> Option<String> {
        self.lib
            .get_last_error
            // SAFETY: ncclGetLastError ignores its communicator argument and returns null or a
            // NUL-terminated message owned by NCCL, copied at once.
            .map(|f| unsafe { f(std::ptr::null_mut()) })
            .filter(|p| !p.is_null())
            // SAFETY: non-null and NUL-terminated (above).
            .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .filter(|s| !s.is_empty())
    }

    /// `ncclGroupStart`: opens this thread's group.
    pub(crate) fn group_start(self) -> Result<(), NcclFail> {
        // SAFETY: only opens this thread's group.
        code(unsafe { (self.lib.group_start)() })
    }

    /// `ncclGroupEnd`: closes this thread's group (also after a failed call inside it).
    pub(crate) fn group_end(self) -> Result<(), NcclFail> {
        // SAFETY: closes this thread's group; NCCL reports a group that was not opened.
        code(unsafe { (self.lib.group_end)() })
    }

    /// `ncclCommInitAll` over `devs` (one member per device ordinal, in order); the raw code on
    /// failure, when no member is handed out.
    pub(crate) fn comm_init_all(self, devs: &[c_int]) -> Result<Vec<Comm>, c_int> {
        let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` has room for devs.len() handles and `devs` lists that many ordinals.
        let r = unsafe { (self.lib.comm_init_all)(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr()) };
        if r != 0 {
            return Err(r);
        }
        Ok(comms.into_iter().map(|raw| Comm { nccl: self, raw }).collect())
    }

    /// `ncclGetUniqueId`.
    pub(crate) fn unique_id(self, mut id: UniqueId) -> Result<UniqueId, c_int> {
        // SAFETY: `id` is a live ncclUniqueId the call fills.
        let r = unsafe { (self.lib.get_unique_id)(&mut id) };
        if r != 0 {
            return Err(r);
        }
        Ok(id)
    }

    /// `ncclCommInitRank(nranks, id, rank)` for the device of the calling thread's current
    /// context; the raw code on failure.
    pub(crate) fn comm_init_rank(self, nranks: c_int, id: UniqueId, rank: c_int) -> Result<Comm, c_int> {
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` is a live handle slot; `id` is a 128-byte ncclUniqueId passed by value as
        // nccl.h declares; NCCL checks the ranks.
        let r = unsafe { (self.lib.comm_init_rank)(&mut raw, nranks, id, rank) };
        if r != 0 {
            return Err(r);
        }
        Ok(Comm { nccl: self, raw })
    }

    /// `ncclSend` of `count` elements of `buf` to `peer` on `stream`.
    pub(crate) fn send(
        self,
        comm: &Comm,
        buf: DevicePtr,
        count: usize,
        elem: Elem,
        peer: c_int,
        stream: &CudaStream,
    ) -> Result<(), NcclFail> {
        holds("ncclSend", "send buffer", buf, count, elem)?;
        // SAFETY: `count` elements checked inside the live region `buf`; `comm` is a live member.
        code(unsafe {
            (self.lib.send)(buf.addr() as usize as *const c_void, count, elem.nccl(), peer, comm.raw, stream_of(stream))
        })
    }

    /// `ncclRecv` of `count` elements into `buf` from `peer` on `stream`.
    pub(crate) fn recv(
        self,
        comm: &Comm,
        buf: DevicePtr,
        count: usize,
        elem: Elem,
        peer: c_int,
        stream: &CudaStream,
    ) -> Result<(), NcclFail> {
        holds("ncclRecv", "receive buffer", buf, count, elem)?;
        // SAFETY: as `send`.
        code(unsafe {
            (self.lib.recv)(buf.addr() as usize as *mut c_void, count, elem.nccl(), peer, comm.raw, stream_of(stream))
        })
    }

    /// `ncclBroadcast` of `count` elements from `root`'s `send` into every member's `recv`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn broadcast(
        self,
        comm: &Comm,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        elem: Elem,
        root: c_int,
        stream: &CudaStream,
    ) -> Result<(), NcclFail> {
        holds("ncclBroadcast", "send buffer", send, count, elem)?;
        holds("ncclBroadcast", "receive buffer", recv, count, elem)?;
        // SAFETY: `count` elements checked inside both live regions; `comm` is a live member.
        code(unsafe {
            (self.lib.broadcast)(
                send.addr() as usize as *const c_void,
                recv.addr() as usize as *mut c_void,
                count,
                elem.nccl(),
                root,
                comm.raw,
                stream_of(stream),
            )
        })
    }

    /// `ncclAllReduce` (sum) of `count` elements of `send` into `recv`.
    pub(crate) fn all_reduce_sum(
        self,
        comm: &Comm,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        elem: Elem,
        stream: &CudaStream,
    ) -> Result<(), NcclFail> {
        holds("ncclAllReduce", "send buffer", send, count, elem)?;
        holds("ncclAllReduce", "receive buffer", recv, count, elem)?;
        // SAFETY: as `broadcast`.
        code(unsafe {
            (self.lib.all_reduce)(
                send.addr() as usize as *const c_void,
                recv.addr() as usize as *mut c_void,
                count,
                elem.nccl(),
                ncclRedOp_t::ncclSum,
                comm.raw,
                stream_of(stream),
            )
        })
    }
}
