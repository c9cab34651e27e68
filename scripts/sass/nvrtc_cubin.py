"""Compile a checkout's kernels as the runtime does, without a GPU: NVRTC (pip's libnvrtc, the
device's 13.0), the runtime's options (runtime/src/backend/cuda/compile.rs), one translation unit
in kernels/src/sources.rs order. Writes the cubin for cuobjdump.

    python3 nvrtc_cubin.py CHECKOUT OUT.cubin [ARCH] [EXTRA_OPTION...]
"""
import ctypes
import os
import re
import sys

root, out = sys.argv[1], sys.argv[2]
arch = sys.argv[3] if len(sys.argv) > 3 else "sm_90"
extra = sys.argv[4:]
sources = open(os.path.join(root, "kernels/src/sources.rs")).read()
files = re.findall(r'\("([a-z0-9_]+\.cuh?)", include_str!\("\.\./cuda/([a-z0-9_]+\.cuh?)"\)\)', sources)
if not files:
    sys.exit("no kernel sources listed in kernels/src/sources.rs")
text = ""
for name, f in files:
    t = open(os.path.join(root, "kernels/cuda", f)).read()
    text += f'#line 1 "{name}"\n' + t + ("" if t.endswith("\n") else "\n")
lib = ctypes.CDLL(os.environ["NVRTC_LIB"])
major, minor = ctypes.c_int(), ctypes.c_int()
lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
prog = ctypes.c_void_p()
if lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"kernels.cu", 0, None, None) != 0:
    sys.exit("nvrtcCreateProgram failed")
opts = [f"--gpu-architecture={arch}", "--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false",
        "--std=c++17"] + extra
arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t()
lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value)
lib.nvrtcGetProgramLog(prog, log)
if log.value.strip():
    print(log.value.decode(), file=sys.stderr)
if rc != 0:
    sys.exit(f"NVRTC {major.value}.{minor.value}: compilation failed ({rc})")
lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
buf = ctypes.create_string_buffer(n.value)
lib.nvrtcGetCUBIN(prog, buf)
open(out, "wb").write(buf.raw)
print(f"NVRTC {major.value}.{minor.value} {arch}: {out} ({n.value} bytes)", file=sys.stderr)
