//! NVRTC in the safe driver layer: the compiler's version and one owned program, destroyed once
//! in `Drop`.

use crate::backend::cuda::driver::nvrtc::{self as raw, nvrtcProgram, NvrtcError};
use std::ffi::{c_char, c_int, CStr};
use std::marker::PhantomData;

/// `nvrtcVersion`: (major, minor).
pub(crate) fn version() -> Result<(c_int, c_int), NvrtcError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both out-pointers are live locals.
    unsafe { raw::nvrtcVersion(&mut major, &mut minor) }.result()?;
    Ok((major, minor))
}

/// An NVRTC program over a source that outlives it (`'s`), destroyed exactly once in `Drop`.
pub(crate) struct Program<'s> {
    prog: nvrtcProgram,
    _source: PhantomData<&'s CStr>,
}

/// The CUBIN size NVRTC reported for one program (the only way to size [`Program::cubin`]).
pub(crate) struct CubinSize {
    prog: nvrtcProgram,
    bytes: usize,
}

impl<'s> Program<'s> {
    /// `nvrtcCreateProgram(src, name)`.
    pub(crate) fn create(src: &'s CStr, name: Option<&'s CStr>) -> Result<Program<'s>, NvrtcError> {
        raw::create_program(src, name).map(|prog| Program { prog, _source: PhantomData })
    }

    /// `nvrtcCompileProgram` with `options`.
    pub(crate) fn compile<O: Clone + Into<Vec<u8>>>(&self, options: &[O]) -> Result<(), NvrtcError> {
        // SAFETY: `prog` is live until Drop; its source outlives it (`'s`).
        unsafe { raw::compile_program(self.prog, options) }
    }

    /// The compile log.
    pub(crate) fn log(&self) -> Result<Vec<c_char>, NvrtcError> {
        // SAFETY: as `compile`.
        unsafe { raw::get_program_log(self.prog) }
    }

    /// The PTX (NVRTC reports an error for a program that did not compile).
    pub(crate) fn ptx(&self) -> Result<Vec<c_char>, NvrtcError> {
        // SAFETY: as `compile`.
        unsafe { raw::get_ptx(self.prog) }
    }

    /// `nvrtcGetCUBINSize`.
    pub(crate) fn cubin_size(&self) -> Result<CubinSize, NvrtcError> {
        let mut bytes = 0usize;
        // SAFETY: as `compile`; `bytes` is a live local.
        unsafe { raw::nvrtcGetCUBINSize(self.prog, &mut bytes) }.result()?;
        Ok(CubinSize { prog: self.prog, bytes })
    }

    /// `nvrtcGetCUBIN` into a buffer of the size `size` reported for this program; a size of
    /// another program is refused before the call.
    pub(crate) fn cubin(&self, size: CubinSize) -> Result<Vec<u8>, NvrtcError> {
        if size.prog != self.prog {
            return Err(NvrtcError(raw::nvrtcResult::NVRTC_ERROR_INVALID_INPUT));
        }
        let mut cubin = vec![0u8; size.bytes];
        // SAFETY: as `compile`; `cubin` holds exactly the size NVRTC reported for this program.
        unsafe { raw::nvrtcGetCUBIN(self.prog, cubin.as_mut_ptr() as *mut c_char) }.result()?;
        Ok(cubin)
    }
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` came from nvrtcCreateProgram and is destroyed exactly once, here; an
        // error leaves nothing to undo.
        let _ = unsafe { raw::destroy_program(self.prog) };
    }
}
