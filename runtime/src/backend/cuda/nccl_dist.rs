//! NCCL between processes: the byte mover of a run whose ranks live in several processes
//! (`backend::dist`), possibly on several hosts.
//!
//! One communicator spans all TP global ranks; this process creates its members for its local
//! ranks (one device each) with `ncclCommInitRank` inside one group, from the unique id process 0
//! made with [`nccl_unique_id`] and published through the rendezvous directory. A copy to or from
//! a rank of another process is one `ncclSend` or `ncclRecv` on the local rank's stream (stream
//! order gives it the ordering of every other copy, as in `nccl.rs`); the other process issues
//! the matching half at the same point of the same program. `read` of a remote rank is an
//! `ncclBroadcast` from the owner's buffer, and `collect` an exact `ncclUint64` sum, both with
//! every local rank taking part and the host waiting for the result. Bytes move as `ncclUint32`
//! words: NaN payloads and signed zeros included.
//!
//! NCCL itself never times out a peer that died: the caller (`dist::DistBackend`) runs every call
//! under a watchdog, which hands an overrun to the binary's hook; the binary ends the process with
//! [`exit_now`].

use super::driver;
use super::driver::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t};
use super::memory::DeviceBuffer;
use super::nccl::{describe_error, library, Lib, UniqueId, UNIQUE_ID_BYTES};
use super::CudaBackend;
use crate::backend::dist::{Mover, ProcessLayout};
use crate::backend::Slice;
use crate::error::RuntimeError;
use crate::Result;
use std::ffi::{c_char, c_int, c_void};

/// A fresh NCCL unique id (process 0 of a distributed run makes one per communicator).
pub fn nccl_unique_id() -> Result<Vec<u8>> {
    let lib = library().map_err(RuntimeError::Unavailable)?;
    let mut id = UniqueId { internal: [0 as c_char; UNIQUE_ID_BYTES] };
    // SAFETY: `id` is a live ncclUniqueId the call fills.
    let r = unsafe { (lib.get_unique_id)(&mut id) };
    if r != 0 {
        return Err(RuntimeError::Device {
            location: "creating an NCCL unique id (ncclGetUniqueId)".into(),
            detail: describe_error(lib, r),
        });
    }
    Ok(id.internal.iter().map(|c| *c as u8).collect())
}

/// End the process at once with `code`, without atexit handlers or destructors: after a peer
/// died, CUDA's and NCCL's teardown could wait forever on a kernel that spins for that peer. The
/// library never calls it; it is the binary's tool for its overrun hook
/// (`backend::dist::install_overrun_hook`), here because it needs `unsafe`.
pub fn exit_now(code: i32) -> ! {
    #[cfg(unix)]
    {
        extern "C" {
            fn _exit(status: c_int) -> !;
        }
        // SAFETY: _exit ends the process; nothing this process holds outlives it (device memory
        // and communicators are released by the driver with the process).
        unsafe { _exit(code) }
    }
    #[cfg(not(unix))]
    std::process::exit(code)
}

/// This process's members of one communicator over all TP ranks.
pub struct NcclMover {
    lib: &'static Lib,
    layout: ProcessLayout,
    /// Index of the communicator (which rendezvous id it was made from).
    index: usize,
    /// One per local rank.
    comms: Vec<ncclComm_t>,
    /// Device scratch per local rank (broadcast targets, digest sums) and its size in bytes.
    scratch: Vec<Option<(DeviceBuffer, usize)>>,
}

impl NcclMover {
    /// Create this process's members of communicator `index` from `id` (the bytes of an
    /// ncclUniqueId). Blocks until every process has joined.
    pub fn connect(b: &CudaBackend, layout: ProcessLayout, id: &[u8], index: usize) -> Result<NcclMover> {
        let lib = library().map_err(RuntimeError::Unavailable)?;
        if b.ranks.len() != layout.ranks_per_process() {
            return Err(RuntimeError::Contract(format!(
                "{}: the CUDA backend has {} ranks",
                layout.describe(),
                b.ranks.len()
            )));
        }
        if b.co_resident() {
            return Err(RuntimeError::Unsupported {
                backend: "cuda".into(),
                mechanism: "nccl transport",
                rule: format!(
                    "{}: nccl needs one device per rank, but this process's {} ranks share {} device(s) (set CUDA_VISIBLE_DEVICES to give it {} devices)",
                    layout.describe(),
                    b.ranks.len(),
                    b.devices.len(),
                    b.ranks.len()
                ),
            });
        }
        if id.len() != UNIQUE_ID_BYTES {
            return Err(RuntimeError::Contract(format!(
                "communicator {index}: the NCCL unique id has {} bytes, NCCL's has {UNIQUE_ID_BYTES}",
                id.len()
            )));
        }
        let mut uid = UniqueId { internal: [0 as c_char; UNIQUE_ID_BYTES] };
        for (d, s) in uid.internal.iter_mut().zip(id) {
            *d = *s as c_char;
        }
        let n = b.ranks.len();
        let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); n];
        let mut failed: Option<(usize, c_int, &str)> = None;
        let mut bind_failed = None;
        // SAFETY: opens this thread's group (several local ranks must join in one group).
        let r = unsafe { (lib.group_start)() };
        if r != 0 {
            failed = Some((0, r, "ncclGroupStart"));
        } else {
            for (l, comm) in comms.iter_mut().enumerate() {
                // NCCL takes the device of the calling thread's current context. A failure here
                // still closes the group below before it is reported.
                if let Err(e) = b.ctx_of(l).bind_to_thread() {
                    bind_failed.get_or_insert((l, e));
                    break;
                }
                // SAFETY: `comm` is a live handle slot; `uid` is a 128-byte ncclUniqueId passed by
                // value as nccl.h declares; the global rank is below TP.
                let r = unsafe { (lib.comm_init_rank)(comm, layout.tp as c_int, uid, layout.global(l) as c_int) };
                if r != 0 && failed.is_none() {
                    failed = Some((l, r, "ncclCommInitRank"));
                }
            }
            // SAFETY: closes the group opened above (also after a failure inside it).
            let r = unsafe { (lib.group_end)() };
            if r != 0 && failed.is_none() {
                failed = Some((0, r, "ncclGroupEnd"));
            }
        }
        if let Some((l, e)) = bind_failed {
            return Err(b.fault(
                l,
                &format!("binding the context of rank {} for ncclCommInitRank", layout.global(l)),
                e,
            ));
        }
        if let Some((l, code, call)) = failed {
            return Err(RuntimeError::Device {
                location: format!(
                    "{}: creating NCCL communicator {index} over TP{} ({call}) for rank {} (device {})",
                    layout.describe(),
                    layout.tp,
                    layout.global(l),
                    b.ordinal_of(l)
                ),
                detail: describe_error(lib, code),
            });
        }
        Ok(NcclMover { lib, layout, index, comms, scratch: (0..n).map(|_| None).collect() })
    }

    /// Device scratch of at least `bytes` on local rank `l`.
    fn scratch(&mut self, b: &CudaBackend, l: usize, bytes: usize) -> Result<u64> {
        let fits = matches!(&self.scratch[l], Some((_, have)) if *have >= bytes);
        if !fits {
            // The previous scratch (if any) is idle: every use ends with a stream synchronize.
            let buf = DeviceBuffer::zeroed(b.ctx_of(l), &b.ranks[l].stream, bytes, "NCCL scratch")?;
            self.scratch[l] = Some((buf, bytes));
        }
        Ok(self.scratch[l].as_ref().map(|(s, _)| s.ptr()).unwrap_or(0))
    }

    /// Issue NCCL calls in one group; the first failure drains the streams and names the call,
    /// the global rank and the device.
    fn group(&self, b: &CudaBackend, call: &str, issue: impl FnOnce(&mut dyn FnMut(usize, c_int))) -> Result<()> {
        let mut failed: Option<(usize, c_int)> = None;
        // SAFETY: opens this thread's group.
        let r = unsafe { (self.lib.group_start)() };
        if r != 0 {
            failed = Some((0, r));
        } else {
            issue(&mut |l, code| {
                if code != 0 && failed.is_none() {
                    failed = Some((l, code));
                }
            });
            // SAFETY: closes the group opened above.
            let r = unsafe { (self.lib.group_end)() };
            if r != 0 && failed.is_none() {
                failed = Some((0, r));
            }
        }
        match failed {
            None => Ok(()),
            Some((l, code)) => {
                b.drain();
                Err(RuntimeError::Device {
                    location: format!(
                        "{} on rank {} (device {}) of NCCL communicator {}",
                        call,
                        self.layout.global(l),
                        b.ordinal_of(l),
                        self.index
                    ),
                    detail: describe_error(self.lib, code),
                })
            }
        }
    }

    /// Wait for every local stream; a failure names the call.
    fn sync(&self, b: &CudaBackend, call: &str) -> Result<()> {
        for (l, r) in b.ranks.iter().enumerate() {
            r.stream.synchronize().map_err(|e| b.fault(l, call, e))?;
        }
        Ok(())
    }

    fn stream(b: &CudaBackend, l: usize) -> cudaStream_t {
        b.ranks[l].stream.cu_stream() as cudaStream_t
    }
}

impl Drop for NcclMover {
    fn drop(&mut self) {
        for c in &self.comms {
            // SAFETY: each handle came from ncclCommInitRank and is destroyed once; the owner
            // (DistBackend) drops the mover under its watchdog. Errors cannot be reported here.
            let _ = unsafe { (self.lib.comm_destroy)(*c) };
        }
    }
}

impl Mover<CudaBackend> for NcclMover {
    fn describe(&self) -> String {
        let v = &self.lib.version;
        format!("NCCL {}.{}.{} communicator {} over TP{}", v.0, v.1, v.2, self.index, self.layout.tp)
    }

    fn send(&mut self, b: &mut CudaBackend, from: usize, src: Slice, to: usize) -> Result<()> {
        let p = b.slice_ptr(from, src, "nccl send")?;
        if src.len == 0 {
            return Ok(());
        }
        let (lib, comm, stream) = (self.lib, self.comms[from], Self::stream(b, from));
        self.group(b, &format!("ncclSend to rank {to}"), |fail| {
            // SAFETY: `p` addresses src.len checked words of a live buffer on local rank `from`'s
            // device, the device of `comm` and `stream`; the peer issues the matching receive.
            let r = unsafe {
                (lib.send)(p as usize as *const c_void, src.len, ncclDataType_t::ncclUint32, to as c_int, comm, stream)
            };
            fail(from, r);
        })
    }

    fn recv(&mut self, b: &mut CudaBackend, to: usize, dst: Slice, from: usize) -> Result<()> {
        let p = b.slice_ptr(to, dst, "nccl recv")?;
        if dst.len == 0 {
            return Ok(());
        }
        let (lib, comm, stream) = (self.lib, self.comms[to], Self::stream(b, to));
        self.group(b, &format!("ncclRecv from rank {from}"), |fail| {
            // SAFETY: `p` addresses dst.len checked words of a live buffer on local rank `to`'s
            // device, the device of `comm` and `stream`; the peer issues the matching send.
            let r = unsafe {
                (lib.recv)(p as usize as *mut c_void, dst.len, ncclDataType_t::ncclUint32, from as c_int, comm, stream)
            };
            fail(to, r);
        })
    }

    fn broadcast(
        &mut self,
        b: &mut CudaBackend,
        root: usize,
        src: Option<(usize, Slice)>,
        len: usize,
    ) -> Result<Vec<f32>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let root_ptr = match src {
            Some((l, s)) => Some((l, b.slice_ptr(l, s, "nccl broadcast source")?)),
            None => None,
        };
        let n = b.ranks.len();
        let mut bufs = Vec::with_capacity(n);
        for l in 0..n {
            bufs.push(match root_ptr {
                Some((rl, p)) if rl == l => p,
                _ => self.scratch(b, l, len * 4)?,
            });
        }
        let streams: Vec<cudaStream_t> = (0..n).map(|l| Self::stream(b, l)).collect();
        let (lib, comms) = (self.lib, self.comms.clone());
        self.group(b, &format!("ncclBroadcast of {len} words from rank {root}"), |fail| {
            for l in 0..n {
                // SAFETY: `bufs[l]` holds at least `len` words on local rank l's device (the
                // owner's checked slice, in place, or scratch); every local rank of every process
                // joins this broadcast at the same point of the program.
                let r = unsafe {
                    (lib.broadcast)(
                        bufs[l] as usize as *const c_void,
                        bufs[l] as usize as *mut c_void,
                        len,
                        ncclDataType_t::ncclUint32,
                        root as c_int,
                        comms[l],
                        streams[l],
                    )
                };
                fail(l, r);
            }
        })?;
        let mut out = vec![0f32; len];
        let r = &b.ranks[0];
        r.stream.context().bind_to_thread().map_err(|e| b.fault(0, "nccl broadcast result", e))?;
        // SAFETY: `bufs[0]` holds `len` f32 on local rank 0's device, written by the broadcast
        // queued on the same stream; `out` holds `len` f32 and the stream is synchronized below.
        unsafe { driver::memcpy_dtoh_async(&mut out, bufs[0], r.stream.cu_stream()) }
            .map_err(|e| b.fault(0, "nccl broadcast result", e))?;
        self.sync(b, &format!("ncclBroadcast of {len} words from rank {root}"))?;
        Ok(out)
    }

    fn sum_u64(&mut self, b: &mut CudaBackend, words: &[u64]) -> Result<Vec<u64>> {
        if words.is_empty() {
            return Ok(Vec::new());
        }
        let n = b.ranks.len();
        let len = words.len();
        let zeros = vec![0u64; len];
        let mut bufs = Vec::with_capacity(n);
        for l in 0..n {
            let p = self.scratch(b, l, len * 8)?;
            let r = &b.ranks[l];
            r.stream.context().bind_to_thread().map_err(|e| b.fault(l, "nccl digest sum upload", e))?;
            // Local rank 0 carries this process's words, the other local ranks zeros.
            let data: &[u64] = if l == 0 { words } else { &zeros };
            // SAFETY: the scratch holds at least len·8 bytes on this rank's device; `data` lives
            // until the streams are synchronized at the end of this function.
            unsafe { driver::memcpy_htod_async(p, data, r.stream.cu_stream()) }
                .map_err(|e| b.fault(l, "nccl digest sum upload", e))?;
            bufs.push(p);
        }
        let streams: Vec<cudaStream_t> = (0..n).map(|l| Self::stream(b, l)).collect();
        let (lib, comms) = (self.lib, self.comms.clone());
        let call = format!("ncclAllReduce (exact u64 sum) of {len} digest words");
        self.group(b, &call, |fail| {
            for l in 0..n {
                // SAFETY: `bufs[l]` holds `len` u64 on local rank l's device, summed in place;
                // every local rank of every process joins at the same point of the program.
                let r = unsafe {
                    (lib.all_reduce)(
                        bufs[l] as usize as *const c_void,
                        bufs[l] as usize as *mut c_void,
                        len,
                        ncclDataType_t::ncclUint64,
                        ncclRedOp_t::ncclSum,
                        comms[l],
                        streams[l],
                    )
                };
                fail(l, r);
            }
        })?;
        let mut out = vec![0u64; len];
        let r = &b.ranks[0];
        r.stream.context().bind_to_thread().map_err(|e| b.fault(0, "nccl digest sum result", e))?;
        // SAFETY: `bufs[0]` holds `len` u64 written by the all-reduce queued on this stream;
        // `out` holds `len` u64 and the streams are synchronized below.
        unsafe { driver::memcpy_dtoh_async(&mut out, bufs[0], r.stream.cu_stream()) }
            .map_err(|e| b.fault(0, "nccl digest sum result", e))?;
        self.sync(b, &call)?;
        drop(zeros);
        Ok(out)
    }
}
