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
//! Loading. This module opens NCCL itself (dlopen) instead of through cudarc 0.19's loader
//! (`nccl::sys::culib`), which panics when the library or a symbol is missing and never tries
//! `libnccl.so.2` — the only name NCCL's packages install (the pip wheel `nvidia-nccl-cu13` in
//! `site-packages/nvidia/nccl/lib`, apt's `libnccl2`; `libnccl.so` comes only with the -dev
//! package). It tries `libnccl.so.2`, then cudarc's candidate names, resolves the entry points it
//! calls, and turns every failure into a typed `Unavailable` reason, once per process. cudarc's
//! `nccl::sys` still provides the ABI types (communicator handle, data types, reduction ops).
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

use super::driver::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t};
use super::CudaBackend;
use crate::backend::Slice;
use crate::error::RuntimeError;
use crate::Result;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// The oldest NCCL with point-to-point send/receive.
const MIN_VERSION: (i32, i32) = (2, 7);

/// nccl.h's `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct UniqueId {
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// `NCCL_UNIQUE_ID_BYTES`.
pub(super) const UNIQUE_ID_BYTES: usize = 128;

/// The NCCL entry points this backend calls, with nccl.h's signatures. Results are read as raw
/// `int`, so an unknown code from a newer library stays a number instead of an invalid enum.
pub(super) struct Lib {
    /// The name dlopen succeeded with.
    name: String,
    /// `ncclGetVersion`, decoded as (major, minor, patch).
    pub(super) version: (i32, i32, i32),
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    /// Absent before NCCL 2.13.
    get_last_error: Option<unsafe extern "C" fn(ncclComm_t) -> *const c_char>,
    comm_init_all: unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> c_int,
    /// `ncclGetUniqueId(ncclUniqueId*)`.
    pub(super) get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    /// `ncclCommInitRank(comm*, nranks, ncclUniqueId (by value), rank)`.
    pub(super) comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, UniqueId, c_int) -> c_int,
    pub(super) broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> c_int,
    pub(super) comm_destroy: unsafe extern "C" fn(ncclComm_t) -> c_int,
    pub(super) group_start: unsafe extern "C" fn() -> c_int,
    pub(super) group_end: unsafe extern "C" fn() -> c_int,
    pub(super) send:
        unsafe extern "C" fn(*const c_void, usize, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> c_int,
    pub(super) recv: unsafe extern "C" fn(*mut c_void, usize, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> c_int,
    pub(super) all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        cudaStream_t,
    ) -> c_int,
}

/// dlopen/dlsym from the C library (glibc exports them from libc.so.6 since 2.34 and from libdl,
/// which Rust's std links on linux-gnu, before).
#[cfg(target_os = "linux")]
mod dl {
    use std::ffi::{c_char, c_int, c_void, CStr};

    extern "C" {
        fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
        fn dlerror() -> *mut c_char;
    }

    /// Resolve every symbol when the library is opened, so a broken install fails here.
    const RTLD_NOW: c_int = 2;

    fn last_error() -> String {
        // SAFETY: dlerror returns null or a NUL-terminated message owned by the C library, valid
        // until the next dl* call on this thread; it is copied at once.
        let msg = unsafe { dlerror() };
        if msg.is_null() {
            "no detail".into()
        } else {
            // SAFETY: non-null, NUL-terminated (above).
            unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
        }
    }

    /// Open a shared library by name (searched on the loader path). The handle is never closed:
    /// NCCL keeps threads and device state for the life of the process.
    pub(super) fn open(name: &CStr) -> Result<*mut c_void, String> {
        // SAFETY: `name` is NUL-terminated; dlopen runs the library's initialisers, which for
        // NCCL only register its state.
        let h = unsafe { dlopen(name.as_ptr(), RTLD_NOW) };
        if h.is_null() {
            Err(last_error())
        } else {
            Ok(h)
        }
    }

    pub(super) fn sym(handle: *mut c_void, name: &CStr) -> Result<*mut c_void, String> {
        // SAFETY: `handle` came from a successful dlopen and is never closed; `name` is
        // NUL-terminated.
        let p = unsafe { dlsym(handle, name.as_ptr()) };
        if p.is_null() {
            Err(last_error())
        } else {
            Ok(p)
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod dl {
    use std::ffi::{c_void, CStr};

    pub(super) fn open(_name: &CStr) -> Result<*mut c_void, String> {
        Err("NCCL is loaded only on Linux".into())
    }

    pub(super) fn sym(_handle: *mut c_void, _name: &CStr) -> Result<*mut c_void, String> {
        Err("NCCL is loaded only on Linux".into())
    }
}

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

/// `code` from ncclGetVersion as (major, minor, patch): `major*10000 + minor*100 + patch` since
/// NCCL 2.9, `major*1000 + minor*100 + patch` before.
fn decode_version(code: i32) -> (i32, i32, i32) {
    if code >= 10000 {
        (code / 10000, (code % 10000) / 100, code % 100)
    } else {
        (code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// Resolve `name` in `handle` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the `extern "C"` function pointer type of the symbol as nccl.h declares it.
unsafe fn symbol<F: Copy>(handle: *mut c_void, lib: &str, name: &str) -> std::result::Result<F, String> {
    if std::mem::size_of::<F>() != std::mem::size_of::<*mut c_void>() {
        return Err(format!("{name}: not a function pointer type"));
    }
    let cname = CString::new(name).map_err(|_| format!("{name}: interior NUL"))?;
    let p = dl::sym(handle, &cname).map_err(|e| format!("{lib} has no symbol {name} ({e})"))?;
    // SAFETY: `p` is the non-null address of `name`, and the caller guarantees `F` is its
    // function pointer type (same size, checked above).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

fn load() -> std::result::Result<Lib, String> {
    let mut names = vec!["libnccl.so.2".to_string()];
    for n in cudarc::get_lib_name_candidates("nccl") {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let mut first_err = None;
    let mut opened = None;
    for name in &names {
        let Ok(cname) = CString::new(name.as_str()) else { continue };
        match dl::open(&cname) {
            Ok(h) => {
                opened = Some((h, name.clone()));
                break;
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let Some((h, name)) = opened else {
        return Err(format!(
            "no NCCL library found: tried {} and {} other names ({}); put the folder of libnccl.so.2 on \
             LD_LIBRARY_PATH (the pip wheel nvidia-nccl-cu13 keeps it in site-packages/nvidia/nccl/lib)",
            names[0],
            names.len() - 1,
            first_err.unwrap_or_default()
        ));
    };
    // SAFETY (every `symbol` call below): each type is the nccl.h signature of that symbol, with
    // enums passed as their 32-bit integer ABI.
    let get_version: unsafe extern "C" fn(*mut c_int) -> c_int = unsafe { symbol(h, &name, "ncclGetVersion")? };
    let mut code: c_int = 0;
    // SAFETY: `code` is a live local the function writes once.
    let r = unsafe { get_version(&mut code) };
    if r != 0 {
        return Err(format!("{name}: ncclGetVersion failed with NCCL error {r}"));
    }
    let version = decode_version(code);
    if (version.0, version.1) < MIN_VERSION {
        return Err(format!(
            "{name} is NCCL {}.{}.{}; the nccl transport needs NCCL {}.{} or newer (point-to-point send/receive)",
            version.0, version.1, version.2, MIN_VERSION.0, MIN_VERSION.1
        ));
    }
    // SAFETY: as above.
    unsafe {
        Ok(Lib {
            version,
            get_error_string: symbol(h, &name, "ncclGetErrorString")?,
            get_last_error: symbol(h, &name, "ncclGetLastError").ok(),
            comm_init_all: symbol(h, &name, "ncclCommInitAll")?,
            get_unique_id: symbol(h, &name, "ncclGetUniqueId")?,
            comm_init_rank: symbol(h, &name, "ncclCommInitRank")?,
            broadcast: symbol(h, &name, "ncclBroadcast")?,
            comm_destroy: symbol(h, &name, "ncclCommDestroy")?,
            group_start: symbol(h, &name, "ncclGroupStart")?,
            group_end: symbol(h, &name, "ncclGroupEnd")?,
            send: symbol(h, &name, "ncclSend")?,
            recv: symbol(h, &name, "ncclRecv")?,
            all_reduce: symbol(h, &name, "ncclAllReduce")?,
            name,
        })
    }
}

/// The NCCL library of this process, loaded once; the reason when it cannot be, or when the
/// process has not decided NVLink multicast (`nvls_decided`, checked at every use: a library
/// that loaded is still refused until the variable is set).
pub(super) fn library() -> std::result::Result<&'static Lib, String> {
    static LIB: OnceLock<std::result::Result<Lib, String>> = OnceLock::new();
    let lib = LIB.get_or_init(load).as_ref().map_err(|e| e.clone())?;
    nvls_decided()?;
    Ok(lib)
}

/// Whether NCCL can be loaded here (never panics; loads it on first use).
pub fn nccl_library_present() -> bool {
    library().is_ok()
}

/// `NCCL <version> (<library name>)`, or why NCCL cannot be loaded. Never panics.
pub fn nccl_version() -> std::result::Result<String, String> {
    library().map(|l| format!("NCCL {}.{}.{} ({})", l.version.0, l.version.1, l.version.2, l.name))
}

/// One communicator per rank (index = rank), from one `ncclCommInitAll`.
pub(crate) struct Comms {
    lib: &'static Lib,
    comms: Vec<ncclComm_t>,
}

impl Comms {
    /// Communicators over `ordinals` (rank r on device `ordinals[r]`, all distinct).
    fn init_all(ordinals: &[usize]) -> Result<Comms> {
        let lib = library().map_err(RuntimeError::Unavailable)?;
        let devs: Vec<c_int> = ordinals.iter().map(|o| *o as c_int).collect();
        let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` has room for devs.len() handles and `devs` lists that many distinct
        // device ordinals of this process (the backend's distinct placement).
        let r = unsafe { (lib.comm_init_all)(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr()) };
        if r != 0 {
            return Err(RuntimeError::Device {
                location: format!("creating NCCL communicators over devices {ordinals:?} (ncclCommInitAll)"),
                detail: describe_error(lib, r),
            });
        }
        Ok(Comms { lib, comms })
    }
}

impl Drop for Comms {
    fn drop(&mut self) {
        for c in &self.comms {
            // SAFETY: each handle came from ncclCommInitAll and is destroyed once; the backend
            // drained every stream, so no NCCL operation is still queued on it. Errors cannot be
            // reported from a drop and leave nothing to undo.
            let _ = unsafe { (self.lib.comm_destroy)(*c) };
        }
    }
}

/// NCCL's name for `code` and its last error message.
pub(super) fn describe_error(lib: &Lib, code: c_int) -> String {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let what = unsafe { CStr::from_ptr((lib.get_error_string)(code)) }.to_string_lossy().into_owned();
    let last = lib
        .get_last_error
        // SAFETY: ncclGetLastError ignores its communicator argument and returns null or a
        // NUL-terminated message owned by NCCL, copied at once.
        .map(|f| unsafe { f(std::ptr::null_mut()) })
        .filter(|p| !p.is_null())
        // SAFETY: non-null and NUL-terminated (above).
        .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .map(|s| format!("; last NCCL error: {s}"))
        .unwrap_or_default();
    format!("NCCL error {code} ({what}){last}")
}

/// The first non-success result of an NCCL call made for `rank`.
type Failure = Option<(usize, c_int)>;

fn first_failure(f: &mut Failure, rank: usize, code: c_int) {
    if code != 0 && f.is_none() {
        *f = Some((rank, code));
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
    fn ensure_nccl(&mut self) -> Result<&'static Lib> {
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
    fn nccl_group(&self, lib: &Lib, what: &str, issue: impl FnOnce(&[ncclComm_t], &mut Failure)) -> Result<()> {
        let comms = match &self.nccl {
            Some(c) => &c.comms,
            None => return Err(RuntimeError::Contract(format!("{what}: NCCL communicators were not created"))),
        };
        let mut failed: Failure = None;
        // SAFETY: ncclGroupStart only opens this thread's group.
        first_failure(&mut failed, 0, unsafe { (lib.group_start)() });
        if failed.is_none() {
            issue(comms, &mut failed);
            // SAFETY: closes the group opened above (also after a failed call inside it, which
            // NCCL requires so the group's state is released).
            first_failure(&mut failed, 0, unsafe { (lib.group_end)() });
        }
        match failed {
            None => Ok(()),
            Some((rank, code)) => {
                self.drain();
                Err(RuntimeError::Device {
                    location: format!("{what} on rank {rank} (device {})", self.ordinal_of(rank)),
                    detail: describe_error(lib, code),
                })
            }
        }
    }

    /// A cross-rank copy of `words` 32-bit words over NCCL (one grouped send + receive).
    pub(crate) fn nccl_copy(&mut self, src_rank: usize, sp: u64, dst_rank: usize, dp: u64, words: usize) -> Result<()> {
        let lib = self.ensure_nccl()?;
        let what = format!("nccl copy rank {src_rank} → rank {dst_rank}");
        let (ss, ds) = (self.ranks[src_rank].stream.cu_stream(), self.ranks[dst_rank].stream.cu_stream());
        self.nccl_group(lib, &what, |comms, failed| {
            // SAFETY: `sp` and `dp` address `words` checked 32-bit words of live buffers on the
            // source and destination ranks' devices, which are the devices of their communicators
            // and streams; both halves are issued in one group, so neither waits for a peer that
            // was not issued.
            unsafe {
                let r = (lib.send)(
                    sp as usize as *const c_void,
                    words,
                    ncclDataType_t::ncclUint32,
                    dst_rank as c_int,
                    comms[src_rank],
                    ss as cudaStream_t,
                );
                first_failure(failed, src_rank, r);
                let r = (lib.recv)(
                    dp as usize as *mut c_void,
                    words,
                    ncclDataType_t::ncclUint32,
                    src_rank as c_int,
                    comms[dst_rank],
                    ds as cudaStream_t,
                );
                first_failure(failed, dst_rank, r);
            }
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
            let p = self.slice_ptr(rank, s, what)?;
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
        let outp = self.slice_ptr(out_rank, out, what)?;
        if out.len == 0 {
            return Ok(());
        }
        let lib = self.ensure_nccl()?;
        let streams: Vec<_> = self.ranks.iter().map(|r| r.stream.cu_stream()).collect();
        let len = out.len;
        self.nccl_group(lib, what, |comms, failed| {
            for &(rank, p) in &ptrs {
                let recv = if rank == out_rank { outp } else { p };
                // SAFETY: `p` and `recv` address `len` checked f32 of live buffers on `rank`'s
                // device (the device of its communicator and stream), either the same slice
                // (in place) or disjoint; every rank's call is issued in this one group.
                let r = unsafe {
                    (lib.all_reduce)(
                        p as usize as *const c_void,
                        recv as usize as *mut c_void,
                        len,
                        ncclDataType_t::ncclFloat32,
                        ncclRedOp_t::ncclSum,
                        comms[rank],
                        streams[rank] as cudaStream_t,
                    )
                };
                first_failure(failed, rank, r);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_in_both_encodings() {
        assert_eq!(decode_version(22703), (2, 27, 3));
        assert_eq!(decode_version(21903), (2, 19, 3));
        assert_eq!(decode_version(2708), (2, 7, 8));
        assert_eq!(decode_version(2406), (2, 4, 6));
    }

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
