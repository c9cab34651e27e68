#!/usr/bin/env bash
# Issue 12 on one GPU call (≤ 8 minutes on one H200): the new kernels against their twins, the
# existing CUDA suites, the step-preset device-host gate, the bench (gating on/off, PyTorch
# whole-layer graph, eager and --graph) and an ncu kernel-time breakdown of one bench step.
#
# Build elsewhere (no toolchain is needed here) and carry the binaries, stripped (debug info makes
# them ~25-60 MB each):
#   cargo build --release && cargo test --release --no-run -p memra-runtime --test gpu
#   rm -rf target-gpu && mkdir target-gpu && cp target/release/memra-gates target-gpu/
#   cp "$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)" target-gpu/
#   strip target-gpu/*
# Usage (repository root, on the GPU machine): scripts/gpu/issue12.sh [DIR]   (DIR: the test
# executables and memra-gates, default target/release/deps with target/release/memra-gates).
# Logs go to $OUT (the device tool's output folder).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
dir="${1:-target/release/deps}"
# Work in a scratch folder; at the end everything is packed into $OUT/issue12.tgz (the device tool
# returns at most 8 files).
out=$(mktemp -d)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
# shellcheck source=scripts/gpu/libs.sh
source scripts/gpu/libs.sh
export MEMRA_REQUIRE_GPU=1 RUST_BACKTRACE=1
rc=0

# shellcheck source=scripts/gpu/sections.sh
source scripts/gpu/sections.sh

bench() { # log-name seconds args...
    local name="$1" secs
    secs=$(limit "$2")
    shift 2
    if [ "$secs" -eq 0 ]; then
        echo "!! bench $name skipped: the time budget is spent"
        rc=1
        return
    fi
    echo "== bench $name (≤ ${secs}s): $*"
    timeout "$secs" "$gates" bench --backend cuda --preset step --layers 2 "$@" > "$out/$name.log" 2>&1 || rc=1
    tail -32 "$out/$name.log"
}

gates="$dir/memra-gates"
[ -x "$gates" ] || gates=target/release/memra-gates
nvidia-smi -L 2>/dev/null

run_tests cuda_step 140 MEMRA_GPU_STEP=1 MEMRA_GPU_BENCH=1
bench bench-graph 150 --graph --out "$out/bench-graph"
bench bench-eager 90 --no-torch --out "$out/bench-eager"

ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
secs=$(limit 90)
if [ -n "$ncu_bin" ] && [ "$secs" -gt 0 ]; then
    echo "== ncu (≤ ${secs}s): kernel time per name over one bench (3 runs x 2 steps x 2 layers; base clocks)"
    timeout "$secs" "$ncu_bin" --metrics gpu__time_duration.sum --csv \
        "$gates" bench --backend cuda --preset step --layers 2 --steps 1 --warmup 1 --no-torch > "$out/ncu.csv" 2>&1 || true
    # Columns found from the CSV header ("Kernel Name", "Metric Name", "Metric Value"); per
    # kernel name: total ns, launches, ns per launch.
    awk -F'","' '/^"ID"/ { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); c[h] = i }; next }
        c["Kernel Name"] && $c["Metric Name"] == "gpu__time_duration.sum" {
            v = $c["Metric Value"]; gsub(/[",]/, "", v); k = $c["Kernel Name"]; t[k] += v; n[k]++ }
        END { for (k in t) printf "%12.0f ns %6d launches %9.0f ns/launch  %s\n", t[k], n[k], t[k] / n[k], k }' \
        "$out/ncu.csv" | sort -rn | head -40 | tee "$out/ncu-summary.txt"
else
    echo "!! ncu skipped (${ncu_bin:-not found}; ${secs}s left)"
fi

run_tests cuda_kernels 60
run_tests cuda_gates 60
run_tests cuda_graph 60
run_tests cuda_direct 60
run_tests harness_checks 30
secs=$(limit 60)
if [ "$secs" -gt 0 ]; then
    echo "== run --backend cuda on tiny (≤ ${secs}s)"
    timeout "$secs" "$gates" run --backend cuda --quiet --out "$out/tiny-cuda" > "$out/tiny-cuda.log" 2>&1 || rc=1
    tail -3 "$out/tiny-cuda.log"
fi
echo "total: $(( $(date +%s) - start ))s"
if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/issue12.tgz" -C "$out" . && echo "logs: \$OUT/issue12.tgz"
    cp "$out/ncu-summary.txt" "$OUT/" 2>/dev/null
else
    echo "logs in $out"
fi
exit "$rc"
