#!/usr/bin/env bash
# Where a kernel waits for memory, read from its SASS without a GPU (eighteenth session): which
# loads a warp issues together before it stalls on the first, and where stores cut a batch. A
# kernel whose loads come in two or three runs pays a memory round trip per run.
#   bash scripts/sass/loads.sh [CHECKOUT] KERNEL...
# e.g. `bash scripts/sass/loads.sh . rmsnorm_f32 rope_append_f32` prints, per kernel, the run-length
# sequence of its memory instructions in program order ("16 LDG 1 ACQBULK 7 LDG 7 STS ..."):
# ACQBULK is griddepcontrol.wait (loads before it are weights first), BAR a block barrier, SHFL a
# warp shuffle. Fetches (once, into ~/.cache/memra-sass, from PyPI) NVRTC 13.0 — the device
# machine's — cuobjdump and nvdisasm; compiles as the runtime does (nvrtc_cubin.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=.
if [ $# -gt 0 ] && [ -d "$1" ]; then root=$1; shift; fi
[ $# -gt 0 ] || { echo "usage: loads.sh [CHECKOUT] KERNEL..." >&2; exit 2; }
cache=${MEMRA_SASS_CACHE:-$HOME/.cache/memra-sass}
if [ ! -x "$cache/nvidia/cu13/bin/nvdisasm" ]; then
  mkdir -p "$cache/wheels"
  python3 -m pip download -q --no-deps -d "$cache/wheels" "nvidia-cuda-nvrtc==13.0.*" \
    "nvidia-cuda-cuobjdump==13.2.*" "nvidia-cuda-nvdisasm==13.2.*"
  for w in "$cache"/wheels/*.whl; do python3 -m zipfile -e "$w" "$cache"; done
  chmod +x "$cache"/nvidia/cu13/bin/*
fi
export NVRTC_LIB="$cache/nvidia/cu13/lib/libnvrtc.so.13" PATH="$cache/nvidia/cu13/bin:$PATH"
export LD_LIBRARY_PATH="$cache/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cubin=$(mktemp --suffix .cubin)
trap 'rm -f "$cubin"' EXIT
python3 "$here/nvrtc_cubin.py" "$root" "$cubin"
for k in "$@"; do
  printf '%s:' "$k"
  cuobjdump -sass -fun "$k" "$cubin" |
    grep -oE '\b(LDG|STG|LDS|STS|ACQBULK|UBLKPF|BAR|SHFL|ATOMG|REDG|EXIT)[A-Z0-9.]*' |
    sed -E 's/\..*//' | uniq -c | awk '{printf " %s %s", $1, $2} END {print ""}'
done
