#!/usr/bin/env bash
# Run the CUDA backend's tests on a GPU machine and print a short table.
#
# Usage (from the repository root, on the machine with the GPU):
#   scripts/gpu/check.sh [DIR]
# DIR holds the test executables `cuda_kernels-<hash>`, `cuda_direct-<hash>` and `cuda_graph-<hash>`
# built elsewhere with
#   cargo test --release --no-run -p memra-runtime --test cuda_kernels --test cuda_direct --test cuda_graph
# (default: target/release/deps). No Rust toolchain is needed here.
#
# What it does:
# 1. finds libcuda and libnvrtc.so.13 (CUDA toolkit or the pip wheel nvidia-cuda-nvrtc) and puts
#    their folders on LD_LIBRARY_PATH;
# 2. runs every test of runtime/tests/cuda_kernels.rs with MEMRA_REQUIRE_GPU=1, so a skipped GPU
#    test is a failure (kernel-vs-twin bit equality, device-host gate, TP invariance, canary), then
#    every test of runtime/tests/cuda_direct.rs (peer stores, packed copies, doorbells) and of
#    runtime/tests/cuda_graph.rs (GRAPH capture and replay) when its executable is there (a missing
#    one is reported and fails the check);
# 3. runs the NVRTC check and the GEMV bandwidth report with their output shown;
# 4. prints one line per test and exits non-zero when any test failed.
# Logs (and the compiled CUBIN/PTX) go to $OUT when set (the device tool's output folder), else
# to a temporary folder.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

dir="${1:-target/release/deps}"
bin=""
for f in $(ls -t "$dir"/cuda_kernels-* 2>/dev/null); do
    case "$f" in *.d) continue ;; esac
    if [ -x "$f" ]; then bin="$f"; break; fi
done
if [ -z "$bin" ]; then
    echo "no cuda_kernels test executable in $dir"
    echo "build it with: cargo test --release --no-run -p memra-runtime --test cuda_kernels"
    exit 2
fi

out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"

# --- libraries: the driver (libcuda.so.1) and NVRTC 13 (libnvrtc.so.13 + libnvrtc-builtins).
add_lib_dir() { case ":${LD_LIBRARY_PATH:-}:" in *":$1:"*) ;; *) LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac; }
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    [ -e "$d/libcuda.so.1" ] && add_lib_dir "$d"
done
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so\.13 '; then
    nvrtc=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
             /usr/local/cuda-13*/targets/x86_64-linux/lib; do
        if [ -e "$d/libnvrtc.so.13" ]; then nvrtc="$d"; break; fi
    done
    if [ -z "$nvrtc" ] && command -v python3 >/dev/null; then
        for sp in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [p for p in sys.path if p.endswith("site-packages")]))' 2>/dev/null); do
            f=$(find "$sp/nvidia" -name 'libnvrtc.so.13' 2>/dev/null | head -1)
            if [ -n "$f" ]; then nvrtc=$(dirname "$f"); break; fi
        done
    fi
    [ -n "$nvrtc" ] && add_lib_dir "$nvrtc"
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
    f=$(find /usr/local /opt /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
    [ -n "$f" ] && add_lib_dir "$(dirname "$f")"
fi
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"

echo "== machine"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not available)"
echo "test binary: $bin"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

export MEMRA_REQUIRE_GPU=1
export RUST_BACKTRACE=1

echo "== NVRTC (production options)"
MEMRA_DUMP_KERNELS="$out" "$bin" --exact nvrtc_compiles_all_kernels --nocapture 2>&1 | grep -E '^nvrtc|skipped|panicked|FAILED' | tee "$out/nvrtc.log"
if command -v cuobjdump >/dev/null && ls "$out"/memra_kernels.*.cubin >/dev/null 2>&1; then
    cubin=$(ls "$out"/memra_kernels.*.cubin | head -1)
    cuobjdump -sass "$cubin" > "$out/sass.txt" 2>&1
    echo "SASS: $(grep -c 'Function :' "$out/sass.txt") kernels in $(basename "$cubin") (listing in $out/sass.txt)"
fi

echo "== all CUDA tests (MEMRA_REQUIRE_GPU=1)"
start=$(date +%s)
"$bin" --test-threads=2 > "$out/cuda_kernels.log" 2>&1
rc=$?
for name in cuda_direct cuda_graph; do
    exe=""
    for f in $(ls -t "$dir"/$name-* 2>/dev/null); do
        case "$f" in *.d) continue ;; esac
        if [ -x "$f" ]; then exe="$f"; break; fi
    done
    if [ -n "$exe" ]; then
        echo "$name test binary: $exe"
        "$exe" --test-threads=1 >> "$out/cuda_kernels.log" 2>&1 || rc=1
    else
        echo "no $name test executable in $dir (cargo test --release --no-run -p memra-runtime --test $name)"
        rc=1
    fi
done
secs=$(( $(date +%s) - start ))

echo "== GEMV bandwidth (informational)"
MEMRA_GPU_BENCH=1 "$bin" --exact gemv_bandwidth_report --nocapture 2>&1 | grep -E '^(bench|skipped)|panicked' | tee "$out/bench.log"

echo
echo "== summary (${secs}s; full log: $out/cuda_kernels.log)"
printf '%-48s %s\n' "test" "result"
printf '%-48s %s\n' "----" "------"
grep -E '^test .* \.\.\. (ok|FAILED|ignored)' "$out/cuda_kernels.log" | sed -E 's/^test (.*) \.\.\. (.*)$/\1 \2/' | sort | while read -r name res; do
    printf '%-48s %s\n' "$name" "$res"
done
grep -E '^test result:' "$out/cuda_kernels.log"
if [ "$rc" -ne 0 ]; then
    echo
    echo "== failures"
    sed -n '/^failures:$/,/^test result:/p' "$out/cuda_kernels.log" | grep -vE '^\s+[0-9]+: |^\s+at ' | head -200
fi
exit "$rc"
