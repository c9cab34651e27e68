//! NVRTC: the kernel sources compiled once per process and architecture, with recorded options.
//!
//! The options are part of the exactness contract (docs/DESIGN.md §3.4): a fixed real
//! architecture (the device's own `sm_XX`, so the driver loads machine code and never JIT-compiles
//! PTX), no FMA contraction, IEEE division and square root, subnormals kept. They are recorded in
//! [`CompiledKernels`] for receipts. After a module is loaded into a context, every name of
//! `memra_kernels::sources::KERNEL_NAMES` is looked up; a missing one is an error naming it.

use super::safe::nvrtc::{self, Program};
use crate::error::RuntimeError;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use memra_kernels::sources::{cuda_source, source_digest, KERNEL_NAMES};
use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// The NVRTC options of the canonical program for one architecture (e.g. `sm_90`).
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--ftz=false".into(),
        "--std=c++17".into(),
    ]
}

/// The result of one NVRTC compilation: machine code for `arch`, its PTX, and provenance.
#[derive(Debug, Clone)]
pub struct CompiledKernels {
    pub arch: String,
    pub options: Vec<String>,
    /// `memra_kernels::sources::source_digest()` of the compiled text.
    pub source_digest: String,
    /// NVRTC (major, minor).
    pub nvrtc_version: (i32, i32),
    /// The compiler log (warnings), usually empty.
    pub log: String,
    pub ptx: String,
    pub cubin: Vec<u8>,
}

impl CompiledKernels {
    /// One line for receipts: `nvrtc 13.0 sm_90 --fmad=false … src=<digest>`.
    pub fn describe(&self) -> String {
        format!(
            "nvrtc {}.{} {} src={}",
            self.nvrtc_version.0,
            self.nvrtc_version.1,
            self.options.join(" "),
            self.source_digest
        )
    }
}

fn nvrtc_err(what: &str, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Unavailable(format!("NVRTC {what}: {e}"))
}

/// Compile the kernel sources for `arch` with [`nvrtc_options`] (no device needed; NVRTC must be
/// loadable, else `Unavailable` with the reason). Compile errors carry NVRTC's log.
pub fn compile(arch: &str) -> Result<CompiledKernels, RuntimeError> {
    if !super::probe::nvrtc_library_present() {
        return Err(super::probe::CudaUnavailable::NoNvrtcLibrary.into());
    }
    let src = CString::new(cuda_source()).map_err(|e| nvrtc_err("source", e))?;
    let name = CString::new("memra_kernels.cu").map_err(|e| nvrtc_err("program name", e))?;
    let options = nvrtc_options(arch);
    let caught = std::panic::catch_unwind(|| compile_program(&src, &name, &options));
    let (log, ptx, cubin, nvrtc_version) = match caught {
        Ok(r) => r?,
        Err(_) => return Err(nvrtc_err("bindings", "panicked while compiling (NVRTC library incompatible?)")),
    };
    Ok(CompiledKernels {
        arch: arch.to_string(),
        options,
        source_digest: source_digest(),
        nvrtc_version,
        log,
        ptx,
        cubin,
    })
}

type CompileOutput = (String, String, Vec<u8>, (i32, i32));

fn compile_program(src: &CStr, name: &CStr, options: &[String]) -> Result<CompileOutput, RuntimeError> {
    let version = nvrtc::version().map_err(|e| nvrtc_err("version", e))?;
    let prog = Program::create(src, Some(name)).map_err(|e| nvrtc_err("create program", e))?;
    let out = (|| {
        let compiled = prog.compile(options);
        let log = prog.log().map(|l| c_chars_to_string(&l)).unwrap_or_default();
        if let Err(e) = compiled {
            return Err(RuntimeError::KernelCompile { error: e.to_string(), options: options.join(" "), log });
        }
        let ptx = prog.ptx().map(|p| c_chars_to_string(&p)).map_err(|e| nvrtc_err("PTX", e))?;
        let size = prog.cubin_size().map_err(|e| nvrtc_err("CUBIN size", e))?;
        let cubin = prog.cubin(size).map_err(|e| nvrtc_err("CUBIN", e))?;
        if cubin.is_empty() {
            return Err(nvrtc_err("CUBIN", "empty (the architecture must be a real sm_XX)"));
        }
        Ok((log, ptx, cubin, version))
    })();
    // The program is destroyed once, after every query.
    drop(prog);
    out
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// [`compile`], once per architecture per process (a failure is cached too: it cannot change).
pub fn compiled_for(arch: &str) -> Result<Arc<CompiledKernels>, RuntimeError> {
    type Cache = Mutex<HashMap<String, Result<Arc<CompiledKernels>, String>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    let entry = map.entry(arch.to_string()).or_insert_with(|| compile(arch).map(Arc::new).map_err(|e| e.to_string()));
    entry.clone().map_err(RuntimeError::Unavailable)
}

/// The kernels of one module loaded into one context, by name.
pub(crate) struct Kernels {
    functions: HashMap<&'static str, CudaFunction>,
    _module: Arc<CudaModule>,
}

impl Kernels {
    /// Load `compiled` into `ctx` and look up every name of `KERNEL_NAMES`.
    pub(crate) fn load(ctx: &Arc<CudaContext>, compiled: &CompiledKernels) -> Result<Kernels, RuntimeError> {
        let module = ctx.load_module(Ptx::from_binary(compiled.cubin.clone())).map_err(|e| RuntimeError::Device {
            location: format!("loading the {} kernel module on device {}", compiled.arch, ctx.ordinal()),
            detail: e.to_string(),
        })?;
        let mut functions = HashMap::new();
        for name in KERNEL_NAMES {
            let f = module.load_function(name).map_err(|e| RuntimeError::Device {
                location: format!("kernel `{name}` on device {}", ctx.ordinal()),
                detail: format!("not found in the loaded module: {e}"),
            })?;
            functions.insert(*name, f);
        }
        Ok(Kernels { functions, _module: module })
    }

    /// A kernel by name (every name of `KERNEL_NAMES` was checked at load).
    pub(crate) fn get(&self, name: &'static str) -> Result<&CudaFunction, RuntimeError> {
        self.functions
            .get(name)
            .ok_or_else(|| RuntimeError::Contract(format!("kernel `{name}` is not in KERNEL_NAMES")))
    }
}
