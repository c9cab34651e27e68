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

use super::memory::DeviceBuffer;
use super::nccl::{describe_error, describe_failure, library};
use super::nccl_sys::{UniqueId, UNIQUE_ID_BYTES};
use super::safe::nccl::{Comm, Elem, Nccl, NcclFail};
use super::safe::{self, DevicePtr};
use super::CudaBackend;
use crate::backend::dist::{Mover, ProcessLayout};
use crate::backend::Slice;
use crate::error::RuntimeError;
use crate::Result;
use cudarc::driver::CudaStream;
use std::ffi::{c_char, c_int};

/// A fresh NCCL unique id (process 0 of a distributed run makes one per communicator).
pub fn nccl_unique_id() -> Result<Vec<u8>> {
    let lib = library().map_err(RuntimeError::Unavailable)?;
    let id =
        lib.unique_id(UniqueId { internal: [0 as c_char; UNIQUE_ID_BYTES] }).map_err(|r| RuntimeError::Device {
            location: "creating an NCCL unique id (ncclGetUniqueId)".into(),
            detail: describe_error(lib, r),
        })?;
    Ok(id.internal.iter().map(|c| *c as u8).collect())
}

/// End the process at once with `code`, without atexit handlers or destructors: after a peer
/// died, CUDA's and NCCL's teardown could wait forever on a kernel that spins for that peer. The
/// library never calls it; it is the binary's tool for its overrun hook
/// (`backend::dist::install_overrun_hook`); `_exit` itself is called by the safe driver layer.
pub fn exit_now(code: i32) -> ! {
    safe::exit_now(code)
}

/// This process's members of one communicator over all TP ranks.
pub struct NcclMover {
    lib: Nccl,
    layout: ProcessLayout,
    /// Index of the communicator (which rendezvous id it was made from).
    index: usize,
    /// One per local rank, each destroyed once when the mover drops (before its scratch is
    /// freed); the owner (DistBackend) drops the mover under its watchdog.
    comms: Vec<Comm>,
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
        let mut comms: Vec<Comm> = Vec::with_capacity(n);
        let mut failed: Option<(usize, c_int, &str)> = None;
        let mut bind_failed = None;
        // One group: several local ranks must join together.
        if let Err(NcclFail::Code(r)) = lib.group_start() {
            failed = Some((0, r, "ncclGroupStart"));
        } else {
            for l in 0..n {
                // NCCL takes the device of the calling thread's current context. A failure here
                // still closes the group below before it is reported.
                if let Err(e) = b.ctx_of(l).bind_to_thread() {
                    bind_failed.get_or_insert((l, e));
                    break;
                }
                // The global rank is below TP.
                match lib.comm_init_rank(layout.tp as c_int, uid, layout.global(l) as c_int) {
                    Ok(c) => comms.push(c),
                    Err(r) if failed.is_none() => failed = Some((l, r, "ncclCommInitRank")),
                    Err(_) => {}
                }
            }
            // Closed also after a failure inside it.
            if let Err(NcclFail::Code(r)) = lib.group_end() {
                if failed.is_none() {
                    failed = Some((0, r, "ncclGroupEnd"));
                }
            }
        }
        if bind_failed.is_some() || failed.is_some() {
            // A failed creation gives its members up without destroying them (as before: their
            // group may not have completed).
            std::mem::take(&mut comms).into_iter().for_each(Comm::leak);
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
    fn scratch(&mut self, b: &CudaBackend, l: usize, bytes: usize) -> Result<DevicePtr> {
        let fits = matches!(&self.scratch[l], Some((_, have)) if *have >= bytes);
        if !fits {
            // The previous scratch (if any) is idle: every use ends with a stream synchronize.
            let buf = DeviceBuffer::zeroed(b.ctx_of(l), &b.ranks[l].stream, bytes, "NCCL scratch")?;
            self.scratch[l] = Some((buf, bytes));
        }
        self.scratch[l]
            .as_ref()
            .map(|(s, _)| s.region())
            .ok_or_else(|| RuntimeError::Contract(format!("NCCL scratch of local rank {l} was not allocated")))
    }

    /// Issue NCCL calls in one group; the first failure drains the streams and names the call,
    /// the global rank and the device.
    fn group(
        &self,
        b: &CudaBackend,
        call: &str,
        issue: impl FnOnce(&mut dyn FnMut(usize, std::result::Result<(), NcclFail>)),
    ) -> Result<()> {
        let mut failed: Option<(usize, NcclFail)> = None;
        if let Err(e) = self.lib.group_start() {
            failed = Some((0, e));
        } else {
            issue(&mut |l, r| {
                if let Err(e) = r {
                    failed.get_or_insert((l, e));
                }
            });
            if let Err(e) = self.lib.group_end() {
                failed.get_or_insert((0, e));
            }
        }
        match failed {
            None => Ok(()),
            Some((l, fail)) => {
                b.drain();
                Err(RuntimeError::Device {
                    location: format!(
                        "{} on rank {} (device {}) of NCCL communicator {}",
                        call,
                        self.layout.global(l),
                        b.ordinal_of(l),
                        self.index
                    ),
                    detail: describe_failure(self.lib, &fail),
                })
            }
        }
    }

    fn stream(b: &CudaBackend, l: usize) -> &CudaStream {
        &b.ranks[l].stream
    }
}

impl Mover<CudaBackend> for NcclMover {
    fn describe(&self) -> String {
        let v = self.lib.version();
        format!("NCCL {}.{}.{} communicator {} over TP{}", v.0, v.1, v.2, self.index, self.layout.tp)
    }

    fn send(&mut self, b: &mut CudaBackend, from: usize, src: Slice, to: usize) -> Result<()> {
        let p = b.slice_region(from, src, "nccl send")?;
        if src.len == 0 {
            return Ok(());
        }
        let (lib, comm, stream) = (self.lib, &self.comms[from], Self::stream(b, from));
        self.group(b, &format!("ncclSend to rank {to}"), |fail| {
            // `p` lies on local rank `from`'s device, the device of `comm` and `stream`; the peer
            // issues the matching receive.
            fail(from, lib.send(comm, p, src.len, Elem::U32, to as c_int, stream));
        })
    }

    fn recv(&mut self, b: &mut CudaBackend, to: usize, dst: Slice, from: usize) -> Result<()> {
        let p = b.slice_region(to, dst, "nccl recv")?;
        if dst.len == 0 {
            return Ok(());
        }
        let (lib, comm, stream) = (self.lib, &self.comms[to], Self::stream(b, to));
        self.group(b, &format!("ncclRecv from rank {from}"), |fail| {
            // `p` lies on local rank `to`'s device, the device of `comm` and `stream`; the peer
            // issues the matching send.
            fail(to, lib.recv(comm, p, dst.len, Elem::U32, from as c_int, stream));
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
            Some((l, s)) => Some((l, b.slice_region(l, s, "nccl broadcast source")?)),
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
        let b: &CudaBackend = b;
        let (lib, comms) = (self.lib, &self.comms);
        self.group(b, &format!("ncclBroadcast of {len} words from rank {root}"), |fail| {
            for l in 0..n {
                // `bufs[l]` lies on local rank l's device (the owner's slice, in place, or
                // scratch); every local rank of every process joins this broadcast at the same
                // point of the program.
                fail(l, lib.broadcast(&comms[l], bufs[l], bufs[l], len, Elem::U32, root as c_int, Self::stream(b, l)));
            }
        })?;
        let mut out = vec![0f32; len];
        let r = &b.ranks[0];
        let call = &format!("ncclBroadcast of {len} words from rank {root}");
        // The download (written by the broadcast queued on the same stream) lands in `out`,
        // lent until every local stream is synchronized.
        let streams: Vec<&CudaStream> = b.ranks.iter().map(|r| &*r.stream).collect();
        let out_ref = &mut out[..];
        safe::with_host_memory(
            &streams,
            move |h| {
                r.stream.context().bind_to_thread().map_err(|e| b.fault(0, "nccl broadcast result", e))?;
                let out_ref = out_ref;
                h.download(&r.stream, out_ref, bufs[0]).map_err(|e| b.fault(0, "nccl broadcast result", e))
            },
            |l, e| b.fault(l, call, e),
        )?;
        Ok(out)
    }

    fn sum_u64(&mut self, b: &mut CudaBackend, words: &[u64]) -> Result<Vec<u64>> {
        if words.is_empty() {
            return Ok(Vec::new());
        }
        let b: &CudaBackend = b;
        let n = b.ranks.len();
        let len = words.len();
        let zeros = vec![0u64; len];
        let mut out = vec![0u64; len];
        let call = &format!("ncclAllReduce (exact u64 sum) of {len} digest words");
        // `words`, `zeros` and `out` are lent to the copies until every local stream is
        // synchronized at the end.
        let streams: Vec<&CudaStream> = b.ranks.iter().map(|r| &*r.stream).collect();
        let (zeros_ref, out_ref) = (&zeros[..], &mut out[..]);
        let this = &mut *self;
        safe::with_host_memory(
            &streams,
            move |h| {
                let mut bufs = Vec::with_capacity(n);
                for l in 0..n {
                    let p = this.scratch(b, l, len * 8)?;
                    let r = &b.ranks[l];
                    r.stream.context().bind_to_thread().map_err(|e| b.fault(l, "nccl digest sum upload", e))?;
                    // Local rank 0 carries this process's words, the other local ranks zeros.
                    let data: &[u64] = if l == 0 { words } else { zeros_ref };
                    h.upload(&r.stream, p, data).map_err(|e| b.fault(l, "nccl digest sum upload", e))?;
                    bufs.push(p);
                }
                let (lib, comms) = (this.lib, &this.comms);
                this.group(b, call, |fail| {
                    for l in 0..n {
                        // `bufs[l]` lies on local rank l's device, summed in place; every local
                        // rank of every process joins at the same point of the program.
                        fail(l, lib.all_reduce_sum(&comms[l], bufs[l], bufs[l], len, Elem::U64, Self::stream(b, l)));
                    }
                })?;
                let r = &b.ranks[0];
                r.stream.context().bind_to_thread().map_err(|e| b.fault(0, "nccl digest sum result", e))?;
                let out_ref = out_ref;
                h.download(&r.stream, out_ref, bufs[0]).map_err(|e| b.fault(0, "nccl digest sum result", e))
            },
            |l, e| b.fault(l, call, e),
        )?;
        drop(zeros);
        Ok(out)
    }
}
