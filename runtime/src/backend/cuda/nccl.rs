//! NCCL on the CUDA backend (docs/DESIGN.md §3.5): the `nccl` transport, whose NCCL only moves bytes,
//! and the one place NCCL does arithmetic, the NUMERIC-CLASS door MEMRA_NCCL_ALLREDUCE.
//!
//! A cross-rank copy over `nccl` is one group of ncclSend (on the source rank's stream) and
//! ncclRecv (on the destination rank's stream). Stream order gives the copy the ordering of every
//! other transport without an event: the send runs after the source's earlier work (the
//! producer), the receive after the destination's earlier work (the readers of the bytes it
//! overwrites), the destination's later work sees the bytes, and the source's later writes queue
//! behind a send that NCCL completes only once it no longer reads the buffer. Every copy
//! launches both halves of its pair in one group, so no NCCL kernel ever waits for a peer that
//! has not been issued yet. Send/receive use `ncclUint32`: bytes move as words, NaN payloads
//! and signed zeros included.
//!
//! Loading: `nccl_sys.rs` opens NCCL itself (dlopen, not cudarc's panicking loader) once per
//! process; every failure becomes a typed `Unavailable` reason here. Every NCCL call goes through
//! the safe wrappers of `safe/nccl.rs` (typed communicators, checked device regions).
//!
//! Communicators: one per rank, created together by `ncclCommInitAll` (one process, one device per
//! rank, NCCL rank = backend rank) on a backend's first NCCL operation and destroyed when the
//! backend drops, after its streams drained. Co-resident ranks cannot form a communicator (NCCL
//! needs one device per rank): such requests are `Config` errors, and the gates mark those runs
//! NOT-APPLICABLE before they start.
//!
//! NVLink multicast (NVLS) must be decided before NCCL is used: NCCL is handed out only when
//! `NCCL_NVLS_ENABLE` is set (otherwise every NCCL request is `Unavailable` with the reason). On
//! shared machines a program that uses NVLink multicast can put every GPU of the host out of
//! service for a long time, and this tool never needs it. The runtime never writes the
//! environment — a library changing it while other threads may read it races with C's
//! `getenv`, which NCCL uses — so the decision is made at process start: `memra-gates` sets
//! `NCCL_NVLS_ENABLE=0` (unless the user set it) first thing in `main`
//! (`memra_gating::env::keep_nccl_multicast_off`), and the GPU scripts (`scripts/gpu/libs.sh`,
//! `check.sh`, `multi-gpu.sh`, `multiprocess.sh`) export it for the test executables.

use super::nccl_sys::{load, Lib};
use super::safe::nccl::{Comm, Elem, Nccl, NcclFail};
use super::safe::DevicePtr;
use super::CudaBackend;
use crate::backend::Slice;
use crate::error::RuntimeError;
use crate::Result;
use std::ffi::c_int;
use std::sync::OnceLock;

/// NCCL's variable that switches NVLink multicast.
const NVLS_VAR: &str = "NCCL_NVLS_ENABLE";

/// Whether this process decided NVLink multicast before using NCCL (see the module docs): NCCL
/// reads `NCCL_NVLS_ENABLE` when it creates a communicator, and an unset variable lets it turn
/// NVLS on where the hardware has it. Only reads the environment, never writes it.
fn nvls_decided() -> std::result::Result<(), String> {
    match std::env::var_os(NVLS_VAR) {
        Some(_) => Ok(()),
        None => Err(format!(
            "{NVLS_VAR} is not set: NCCL would be free to use NVLink multicast, which can take every GPU of a \
             shared host out of service; set {NVLS_VAR}=0 before the process starts (memra-gates does it first \
             thing in main, scripts/gpu/libs.sh exports it for the test executables)"
        )),
    }
}

/// The NCCL library of this process, loaded once; the reason when it cannot be, or when the
/// process has not decided NVLink multicast (`nvls_decided`, checked at every use: a library
/// that loaded is still refused until the variable is set).
pub(super) fn library() -> std::result::Result<Nccl, String> {
    static LIB: OnceLock<std::result::Result<Lib, String>> = OnceLock::new();
    let lib = LIB.get_or_init(load).as_ref().map_err(|e| e.clone())?;
    nvls_decided()?;
    Ok(Nccl::new(lib))
}

/// Whether NCCL can be loaded here (never panics; loads it on first use).
pub fn nccl_library_present() -> bool {
    library().is_ok()
}

/// `NCCL <version> (<library name>)`, or why NCCL cannot be loaded. Never panics.
pub fn nccl_version() -> std::result::Result<String, String> {
    library().map(|l| {
        let v = l.version();
        format!("NCCL {}.{}.{} ({})", v.0, v.1, v.2, l.name())
    })
}

/// One communicator per rank (index = rank), from one `ncclCommInitAll`.
pub(crate) struct Comms {
    lib: Nccl,
    comms: Vec<Comm>,
}

impl Comms {
    /// Communicators over `ordinals` (rank r on device `ordinals[r]`, all distinct).
    fn init_all(ordinals: &[usize]) -> Result<Comms> {
        let lib = library().map_err(RuntimeError::Unavailable)?;
        // The backend's distinct placement: one device per rank, NCCL rank = backend rank.
        let devs: Vec<c_int> = ordinals.iter().map(|o| *o as c_int).collect();
        // Each member is destroyed once when `Comms` drops (rank order), after the backend drained
        // every stream, so no NCCL operation is still queued on it.
        let comms = lib.comm_init_all(&devs).map_err(|r| RuntimeError::Device {
            location: format!("creating NCCL communicators over devices {ordinals:?} (ncclCommInitAll)"),
            detail: describe_error(lib, r),
        })?;
        Ok(Comms { lib, comms })
    }
}

/// NCCL's name for `code` and its last error message.
pub(super) fn describe_error(lib: Nccl, code: c_int) -> String {
    let what = lib.error_string(code);
    let last = lib.last_error().map(|s| format!("; last NCCL error: {s}")).unwrap_or_default();
    format!("NCCL error {code} ({what}){last}")
}

/// [`describe_error`] of a failed call, or the safe layer's reason for refusing it.
pub(super) fn describe_failure(lib: Nccl, fail: &NcclFail) -> String {
    match fail {
        NcclFail::Code(code) => describe_error(lib, *code),
        NcclFail::Refused(e) => e.to_string(),
    }
}

/// The first unsuccessful NCCL call made for `rank`.
type Failure = Option<(usize, NcclFail)>;

fn first_failure(f: &mut Failure, rank: usize, r: std::result::Result<(), NcclFail>) {
    if let Err(e) = r {
        if f.is_none() {
            *f = Some((rank, e));
        }
    }
}

impl CudaBackend {
    /// The refusal of an NCCL operation between ranks that share a device.
    pub(crate) fn nccl_co_resident(&self) -> RuntimeError {
        RuntimeError::Unsupported {
            backend: "cuda".into(),
            mechanism: "nccl transport",
            rule: format!("nccl needs one device per rank: TP{} on {} device(s)", self.ranks.len(), self.devices.len()),
        }
    }

    /// Create the communicators on first use.
    fn ensure_nccl(&mut self) -> Result<Nccl> {
        if self.co_resident() {
            return Err(self.nccl_co_resident());
        }
        if self.nccl.is_none() {
            self.nccl = Some(Comms::init_all(&self.placement())?);
        }
        match &self.nccl {
            Some(c) => Ok(c.lib),
            None => Err(RuntimeError::Contract("NCCL communicators were not created".into())),
        }
    }

    /// Issue NCCL calls between ncclGroupStart and ncclGroupEnd. The group is closed even when a
    /// call inside it failed; the first failure drains the streams and is reported.
    fn nccl_group(&self, lib: Nccl, what: &str, issue: impl FnOnce(&[Comm], &mut Failure)) -> Result<()> {
        let comms = match &self.nccl {
            Some(c) => &c.comms,
            None => return Err(RuntimeError::Contract(format!("{what}: NCCL communicators were not created"))),
        };
        let mut failed: Failure = None;
        first_failure(&mut failed, 0, lib.group_start());
        if failed.is_none() {
            issue(comms, &mut failed);
            // Closed also after a failed call inside the group, which NCCL requires so the
            // group's state is released.
            first_failure(&mut failed, 0, lib.group_end());
        }
        match failed {
            None => Ok(()),
            Some((rank, fail)) => {
                self.drain();
                Err(RuntimeError::Device {
                    location: format!("{what} on rank {rank} (device {})", self.ordinal_of(rank)),
                    detail: describe_failure(lib, &fail),
                })
            }
        }
    }

    /// A cross-rank copy of `words` 32-bit words over NCCL (one grouped send + receive).
    pub(crate) fn nccl_copy(
        &mut self,
        src_rank: usize,
        sp: DevicePtr,
        dst_rank: usize,
        dp: DevicePtr,
        words: usize,
    ) -> Result<()> {
        let lib = self.ensure_nccl()?;
        let what = format!("nccl copy rank {src_rank} → rank {dst_rank}");
        let (ss, ds) = (&self.ranks[src_rank].stream, &self.ranks[dst_rank].stream);
        // `sp` and `dp` lie on the source and destination ranks' devices, the devices of their
        // communicators and streams; both halves are issued in one group, so neither waits for a
        // peer that was not issued.
        self.nccl_group(lib, &what, |comms, failed| {
            let r = lib.send(&comms[src_rank], sp, words, Elem::U32, dst_rank as c_int, ss);
            first_failure(failed, src_rank, r);
            let r = lib.recv(&comms[dst_rank], dp, words, Elem::U32, src_rank as c_int, ds);
            first_failure(failed, dst_rank, r);
        })
    }

    /// MEMRA_NCCL_ALLREDUCE: NCCL's all-reduce (sum, in NCCL's order) of one f32 vector per rank;
    /// `out` on `out_rank` receives the sum, every other rank's part is overwritten with it.
    pub(crate) fn nccl_all_reduce_sum(&mut self, parts: &[(usize, Slice)], out_rank: usize, out: Slice) -> Result<()> {
        let n = self.ranks.len();
        let what = "nccl all-reduce";
        if parts.len() != n {
            return Err(RuntimeError::Contract(format!(
                "{what}: {} parts for {n} ranks (an all-reduce takes one vector from every rank)",
                parts.len()
            )));
        }
        let mut seen = vec![false; n];
        let mut ptrs = Vec::with_capacity(n);
        for &(rank, s) in parts {
            let p = self.slice_region(rank, s, what)?;
            if std::mem::replace(&mut seen[rank], true) {
                return Err(RuntimeError::Contract(format!("{what}: rank {rank} gives two parts")));
            }
            if s.len != out.len {
                return Err(RuntimeError::Contract(format!(
                    "{what}: rank {rank}'s part has {} elements, the output {}",
                    s.len, out.len
                )));
            }
            if rank == out_rank
                && s.buf == out.buf
                && s.offset != out.offset
                && s.offset < out.offset + out.len
                && out.offset < s.offset + s.len
            {
                return Err(RuntimeError::Contract(format!(
                    "{what}: rank {rank}'s part {}+{} and the output {}+{} overlap without being the same slice",
                    s.offset, s.len, out.offset, out.len
                )));
            }
            ptrs.push((rank, p));
        }
        let outp = self.slice_region(out_rank, out, what)?;
        if out.len == 0 {
            return Ok(());
        }
        let lib = self.ensure_nccl()?;
        let len = out.len;
        let ranks = &self.ranks;
        self.nccl_group(lib, what, |comms, failed| {
            for &(rank, p) in &ptrs {
                let recv = if rank == out_rank { outp } else { p };
                // `p` and `recv` lie on `rank`'s device (the device of its communicator and
                // stream), either the same slice (in place) or disjoint; every rank's call is
                // issued in this one group.
                let r = lib.all_reduce_sum(&comms[rank], p, recv, len, Elem::F32, &ranks[rank].stream);
                first_failure(failed, rank, r);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loading_never_panics() {
        match nccl_version() {
            Ok(v) => println!("{v}"),
            Err(e) => {
                // Either no library (the message names the first name tried) or a process that
                // did not decide NVLink multicast (the message names the variable).
                assert!(e.contains("libnccl.so.2") || e.contains(NVLS_VAR), "{e}");
                println!("no NCCL: {e}");
            }
        }
        assert_eq!(nccl_library_present(), nccl_version().is_ok());
    }
}
