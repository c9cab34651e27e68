#!/usr/bin/env bash
# Source me on the GPU machine: puts libcuda and libnvrtc.so.13 on LD_LIBRARY_PATH (the CUDA
# toolkit's copy, or a pip wheel's) and keeps NCCL's NVLink multicast off.
export NCCL_NVLS_ENABLE=0
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    [ -e "$d/libcuda.so.1" ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so\.13 '; then
    f=$(find /usr/local /opt -name 'libnvrtc.so.13' 2>/dev/null | head -1)
    [ -n "$f" ] && LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH"
fi
export LD_LIBRARY_PATH
# NCCL: the image's pip wheel ships libnccl.so.2 outside the loader's default path.
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
    f=$(find /usr/local /opt /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
    [ -n "$f" ] && LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH"
fi
export LD_LIBRARY_PATH
