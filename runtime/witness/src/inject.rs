//! The injection library: loaded by the CUDA driver into a subject's process when memra-gates
//! names it in `CUDA_INJECTION64_PATH`, it subscribes to CUPTI's driver-API callbacks and counts
//! every kernel launch by name and every call that issues other work (`format::is_work_call`),
//! then writes the process's record when the process exits (`format`).
//!
//! Why the driver API: every runtime-API call (PyTorch, cuBLAS) reaches the driver, and a
//! subject using the driver directly (the built-in runtime through cudarc) is seen the same way.
//! Why callbacks rather than activity records: the count is exact and needs no flush of device
//! buffers at exit.
//!
//! It is outside the subject's *code*, not its address space: it catches a subject that writes
//! a counter its mechanism never earned, not one that forges this library's record.
//!
//! Nothing here may disturb the subject: every failure is written into the record (`errors`)
//! instead of stopping the process, and a panic never crosses into the driver.

use crate::format::{self, WitnessRecord};
use cudarc::cupti::sys;
use std::ffi::{c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The record being counted (taken, and so closed, when it is written at exit).
static RECORD: Mutex<Option<WitnessRecord>> = Mutex::new(None);
/// Where the record goes ([`format::DIR_VAR`]).
static DIR: OnceLock<PathBuf> = OnceLock::new();

extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
}

fn record() -> MutexGuard<'static, Option<WitnessRecord>> {
    RECORD.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The entry point the CUDA driver calls once, from `cuInit`, in a process whose
/// `CUDA_INJECTION64_PATH` names this library. Returns 1 (success) always: a witness that cannot
/// count says so in its record rather than failing the subject's `cuInit`.
#[no_mangle]
pub extern "C" fn InitializeInjection() -> c_int {
    // The sources this library was built from, kept in its data for memra-gates to check.
    std::hint::black_box(crate::locate::BUILD_MARKER);
    // Not armed by memra-gates (no directory to write to): stay out of the way.
    let Some(dir) = std::env::var_os(format::DIR_VAR) else { return 1 };
    if DIR.set(PathBuf::from(dir)).is_err() {
        return 1;
    }
    *record() = Some(WitnessRecord::new(std::process::id()));
    // SAFETY: `write_at_exit` is a plain `extern "C" fn()` that catches its own panics; atexit
    // only stores the pointer.
    if unsafe { atexit(write_at_exit) } != 0 {
        return 1;
    }
    let subscribed = std::panic::catch_unwind(subscribe).unwrap_or_else(|_| Err("panicked while subscribing".into()));
    if let Err(e) = subscribed {
        if let Some(r) = record().as_mut() {
            r.errors.push(e);
        }
    }
    1
}

/// Load CUPTI and subscribe [`on_api`] to the driver-API domain.
fn subscribe() -> Result<(), String> {
    if let Some(path) = std::env::var_os(format::CUPTI_VAR) {
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        // SAFETY: loading CUPTI runs only its own initialisers. Loaded globally and kept for the
        // life of the process, so cudarc's lookup by soname below finds this very library.
        let lib = unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) }
            .map_err(|e| format!("cannot load CUPTI from {} ({}): {e}", path.to_string_lossy(), format::CUPTI_VAR))?;
        std::mem::forget(lib);
    }
    // SAFETY: probes the library names only; no CUPTI call is made.
    if !unsafe { sys::is_culib_present() } {
        return Err(format!(
            "no CUPTI library found by name (set {} to its path, or put it on the loader's path)",
            format::CUPTI_VAR
        ));
    }
    let mut handle: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
    // SAFETY: `handle` is a valid out-pointer; `on_api` has CUPTI's callback signature and never
    // unwinds; no user data is passed.
    let r = unsafe { sys::cuptiSubscribe(&mut handle, Some(on_api), std::ptr::null_mut()) };
    if r != sys::CUptiResult::CUPTI_SUCCESS {
        return Err(format!("cuptiSubscribe failed: {r:?} (another CUPTI client, such as a profiler, may hold it)"));
    }
    // SAFETY: `handle` was just returned by a successful cuptiSubscribe.
    let r = unsafe { sys::cuptiEnableDomain(1, handle, sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API) };
    if r != sys::CUptiResult::CUPTI_SUCCESS {
        return Err(format!("cuptiEnableDomain(driver API) failed: {r:?}"));
    }
    Ok(())
}

/// CUPTI's callback, at the entry of every driver-API call: a launch counts under its kernel's
/// name, a work call under its function's name; everything else is ignored.
///
/// # Safety
/// Called by CUPTI only: `data` is null or points to the `CUpti_CallbackData` of the call for the
/// driver-API domain, valid for the duration of the callback.
unsafe extern "C" fn on_api(
    _user: *mut c_void,
    domain: sys::CUpti_CallbackDomain,
    _cbid: sys::CUpti_CallbackId,
    data: *const c_void,
) {
    if domain != sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API || data.is_null() {
        return;
    }
    // SAFETY: for the driver-API domain CUPTI passes a `CUpti_CallbackData` valid for this call.
    let d = unsafe { &*(data as *const sys::CUpti_CallbackData) };
    if d.callbackSite != sys::CUpti_ApiCallbackSite::CUPTI_API_ENTER || d.functionName.is_null() {
        return;
    }
    // SAFETY: `functionName` is a NUL-terminated static string owned by CUPTI.
    let Ok(function) = unsafe { CStr::from_ptr(d.functionName) }.to_str() else { return };
    if format::is_launch(function) {
        let name = (!d.symbolName.is_null())
            // SAFETY: for launch callbacks `symbolName` is NUL-terminated and valid for this call.
            .then(|| unsafe { CStr::from_ptr(d.symbolName) }.to_string_lossy().into_owned());
        if let Some(r) = record().as_mut() {
            match name {
                Some(n) => *r.launches.entry(n).or_insert(0) += 1,
                None => r.unnamed_launches += 1,
            }
        }
    } else if format::is_work_call(function) {
        if let Some(r) = record().as_mut() {
            match r.calls.get_mut(function) {
                Some(n) => *n += 1,
                None => {
                    r.calls.insert(function.to_string(), 1);
                }
            }
        }
    }
}

/// At exit: close the record and write it (to a temporary name, then renamed, so a reader never
/// sees half of it).
extern "C" fn write_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(mut r) = record().take() else { return };
        let Some(dir) = DIR.get() else { return };
        r.pid = std::process::id();
        let path = dir.join(format::file_name(r.pid));
        let tmp = path.with_extension("json.partial");
        if std::fs::write(&tmp, r.to_json()).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process this test starts: the child plays the driver's part.
    const CHILD: &str = "MEMRAGATES_WITNESS_TEST_CHILD";

    /// No GPU needed: a process that initialises the witness with a CUPTI that cannot be loaded
    /// still writes its record when it exits, and the record says why it could not count.
    #[test]
    fn a_witness_that_cannot_load_cupti_writes_why_at_exit() {
        if std::env::var_os(CHILD).is_some() {
            assert_eq!(InitializeInjection(), 1, "the subject's cuInit must never fail because of the witness");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-libcupti.so");
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "inject::tests::a_witness_that_cannot_load_cupti_writes_why_at_exit", "--test-threads=1"])
            .env(CHILD, "1")
            .env(format::DIR_VAR, dir.path())
            .env(format::CUPTI_VAR, &missing)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let records = format::read_dir(dir.path()).unwrap();
        assert_eq!(records.len(), 1, "one record, written at the child's exit");
        let r = &records[0];
        assert_ne!(r.pid, std::process::id());
        assert!(r.launches.is_empty() && r.calls.is_empty());
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert!(
            r.errors[0].contains("cannot load CUPTI from") && r.errors[0].contains("no-such-libcupti.so"),
            "{:?}",
            r.errors
        );
    }
}
