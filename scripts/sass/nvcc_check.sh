#!/usr/bin/env bash
# Build a microbenchmark of scripts/gpu/ here, without a GPU, with the device machine's nvcc 13.0
# and its flags (scripts/gpu/libs.sh `nvcc_build`), so a host-side compile error costs no device
# call (twenty-seventh session: the device machine was short, and an nvcc error there is a lost
# call). Fetches once, into ~/.cache/memra-nvcc, from PyPI: nvcc, cicc, the CRT and runtime
# headers, libcudart and CCCL (about 150 MB). Prints the kernels' registers, stack and shared
# memory (cuobjdump, from loads.sh's cache, when present).
#   bash scripts/sass/nvcc_check.sh scripts/gpu/experts_fuse_bench.cu [OUT_BINARY]
set -euo pipefail
src=${1:?usage: nvcc_check.sh SOURCE.cu [OUT_BINARY]}
out=${2:-$(mktemp)}
cache=${MEMRA_NVCC_CACHE:-$HOME/.cache/memra-nvcc}
cu=$cache/nvidia/cu13
if [ ! -x "$cu/nvvm/bin/cicc" ]; then
  mkdir -p "$cache/wheels"
  python3 -m pip download -q --no-deps -d "$cache/wheels" "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-crt==13.0.*" \
    "nvidia-nvvm==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*"
  for w in "$cache"/wheels/*.whl; do python3 -m zipfile -e "$w" "$cache"; done
  chmod +x "$cu"/bin/* "$cu"/nvvm/bin/*
fi
PATH="$cu/bin:$PATH" nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
  -I kernels/cuda -I scripts/gpu -I "$cu/include/cccl" -L "$cu/lib" -o "$out" "$src"
echo "built $out"
dump=${MEMRA_SASS_CACHE:-$HOME/.cache/memra-sass}/nvidia/cu13/bin/cuobjdump
if [ -x "$dump" ]; then
  "$dump" -res-usage "$out" 2>&1 | grep -A1 "^ *Function" | grep -o "Function [A-Za-z_0-9]*\|REG:[0-9]*\|STACK:[0-9]*\|SHARED:[0-9]*" |
    paste - - - - | sed 's/Function //'
fi
