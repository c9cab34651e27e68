#!/usr/bin/env bash
# Run the CUDA backend's tests on a GPU machine and print a short table.
#
# Usage (from the repository root, on the machine with the GPU):
#   scripts/gpu/check.sh [DIR]
# DIR holds the CUDA test executable `gpu-<hash>` (runtime/tests/gpu: cuda_kernels, cuda_direct,
# cuda_graph and the harness's own checks) built elsewhere with
#   cargo test --release --no-run -p memra-runtime --test gpu
# (default: target/release/deps). No Rust toolchain is needed here.
#
# What it does:
# 1. finds libcuda and libnvrtc.so.13 (CUDA toolkit or the pip wheel nvidia-cuda-nvrtc) and puts
#    their folders on LD_LIBRARY_PATH;
# 2. runs the NVRTC check with its output shown;
# 3. runs every test with MEMRA_REQUIRE_GPU=1, so a test that cannot run here is a FAILURE, not an
#    ignored line (kernel-vs-twin bit equality, device-host gate, TP invariance, canaries, GRAPH),
#    the cuda_direct tests (peer stores, packed copies, doorbells) one at a time. A test that needs
#    more devices than the machine has reads `ignored (needs N devices, M present)`; export
#    MEMRA_REQUIRE_DEVICES=N before calling this script when the machine must have N GPUs, and
#    those become failures too;
# 4. runs the GEMV bandwidth report (MEMRA_GPU_BENCH=1; informational);
# 5. prints one line per test and exits non-zero when any test failed.
# Logs (and the compiled CUBIN/PTX) go to $OUT when set (the device tool's output folder), else
# to a temporary folder.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

dir="${1:-target/release/deps}"
bin=""
for f in $(ls -t "$dir"/gpu-* 2>/dev/null); do
    case "$f" in *.d) continue ;; esac
    if [ -x "$f" ]; then bin="$f"; break; fi
done
if [ -z "$bin" ]; then
    echo "no gpu test executable (gpu-<hash>) in $dir"
    echo "build it with: cargo test --release --no-run -p memra-runtime --test gpu"
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
echo "MEMRA_REQUIRE_DEVICES=${MEMRA_REQUIRE_DEVICES:-unset}: a test needing more devices than the machine has fails if it needs at most this many, else reads ignored"

echo "== NVRTC (production options)"
MEMRA_DUMP_KERNELS="$out" "$bin" --exact cuda_kernels::nvrtc_compiles_all_kernels 2>&1 | grep -E '^nvrtc|ignored|panicked|FAILED' | tee "$out/nvrtc.log"
if command -v cuobjdump >/dev/null && ls "$out"/memra_kernels.*.cubin >/dev/null 2>&1; then
    cubin=$(ls "$out"/memra_kernels.*.cubin | head -1)
    cuobjdump -sass "$cubin" > "$out/sass.txt" 2>&1
    echo "SASS: $(grep -c 'Function :' "$out/sass.txt") kernels in $(basename "$cubin") (listing in $out/sass.txt)"
fi

# The harness never captures output (libtest-mimic): the tests' own lines go to $log as they are
# printed, and --logfile sends the harness's result lines (`test NAME ... ok|FAILED|ignored
# (reason)`, the failures and the counts) to their own files, which the summary reads.
log="$out/gpu-tests.log"
results="$out/gpu-results.txt"
echo "== all CUDA tests (MEMRA_REQUIRE_GPU=1)"
start=$(date +%s)
"$bin" --test-threads=2 --skip cuda_direct:: --logfile "$out/results-1.txt" > "$log" 2>&1
rc=$?
"$bin" --test-threads=1 cuda_direct:: --logfile "$out/results-2.txt" >> "$log" 2>&1 || rc=1
cat "$out/results-1.txt" "$out/results-2.txt" > "$results" 2>/dev/null
secs=$(( $(date +%s) - start ))

echo "== GEMV bandwidth (informational)"
MEMRA_GPU_BENCH=1 "$bin" --exact cuda_kernels::gemv_bandwidth_report 2>&1 | grep -E '^bench|ignored|panicked|FAILED' | tee "$out/bench.log"

echo
echo "== summary (${secs}s; results: $results; the tests' output: $log)"
printf '%-96s %s\n' "test" "result"
printf '%-96s %s\n' "----" "------"
grep -E '^test .* \.\.\. (ok|FAILED|ignored)' "$results" | sed -E 's/^test ([^ ]+) +\.\.\. (.*)$/\1 \2/' | sort | while read -r name res; do
    printf '%-96s %s\n' "$name" "$res"
done
grep -E '^test result:' "$results"
if [ "$rc" -ne 0 ]; then
    echo
    echo "== failures"
    sed -n '/^failures:$/,/^test result:/p' "$results" | grep -vE '^\s+[0-9]+: |^\s+at ' | head -200
fi
exit "$rc"
