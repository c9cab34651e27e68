//! The raw NCCL layer: NCCL opened with dlopen and its entry points resolved with nccl.h's
//! signatures, once per process. This file and `safe/nccl.rs` (the typed wrappers every other
//! file calls) are NCCL's side of the driver layer, as `driver.rs` and `safe/` are the driver's.
//!
//! Why its own loader: cudarc 0.19's (`nccl::sys::culib`) panics when the library or a symbol is
//! missing and never tries `libnccl.so.2` — the only name NCCL's packages install (the pip wheel
//! `nvidia-nccl-cu13` in `site-packages/nvidia/nccl/lib`, apt's `libnccl2`; `libnccl.so` comes
//! only with the -dev package). [`load`] tries `libnccl.so.2`, then cudarc's candidate names,
//! resolves the entry points the backend calls, and turns every failure into a reason. cudarc's
//! `nccl::sys` still provides the ABI types (communicator handle, data types, reduction ops).

use super::driver::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t};
use std::ffi::{c_char, c_int, c_void, CString};

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
    pub(super) name: String,
    /// `ncclGetVersion`, decoded as (major, minor, patch).
    pub(super) version: (i32, i32, i32),
    pub(super) get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    /// Absent before NCCL 2.13.
    pub(super) get_last_error: Option<unsafe extern "C" fn(ncclComm_t) -> *const c_char>,
    pub(super) comm_init_all: unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> c_int,
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

/// `code` from ncclGetVersion as (major, minor, patch): `major*10000 + minor*100 + patch` since
/// NCCL 2.9, `major*1000 + minor*100 + patch` before.
pub(super) fn decode_version(code: i32) -> (i32, i32, i32) {
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

pub(super) fn load() -> std::result::Result<Lib, String> {
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
}
