#!/usr/bin/env bash
# Issue 12 on one GPU call (≤ 8 minutes on one H200): the new kernels against their twins, the
# existing CUDA suites, the step-preset device-host gate, the bench (gating on/off, PyTorch
# whole-layer graph, eager and --graph) and an ncu kernel-time breakdown of one bench step.
#
# Build elsewhere (no toolchain is needed here), carrying target/release/memra-gates and the test
# executables of target/release/deps:
#   cargo build --release && cargo test --release --no-run -p memra-runtime
# Usage (repository root, on the GPU machine): scripts/gpu/issue12.sh [DIR]   (DIR: the test
# executables, default target/release/deps). Logs go to $OUT (the device tool's output folder).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
dir="${1:-target/release/deps}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
# shellcheck source=scripts/gpu/libs.sh
source scripts/gpu/libs.sh
export MEMRA_REQUIRE_GPU=1 RUST_BACKTRACE=1
rc=0

newest() {
    for f in $(ls -t "$dir/$1"-* 2>/dev/null); do
        case "$f" in *.d) continue ;; esac
        [ -x "$f" ] && { echo "$f"; return; }
    done
}

run_tests() { # name timeout extra-env...
    local name="$1" secs="$2"
    shift 2
    local bin
    bin=$(newest "$name")
    if [ -z "$bin" ]; then
        echo "!! no $name test executable in $dir"
        rc=1
        return
    fi
    echo "== $name ($bin)"
    env "$@" timeout "$secs" "$bin" --test-threads=1 --nocapture > "$out/$name.log" 2>&1 || rc=1
    grep -E '^(ok |grouped experts|step model|host oracle|step preset|skipped)|^test .*(FAILED|ok)$|^test result' "$out/$name.log"
    if grep -q FAILED "$out/$name.log"; then
        sed -n '/^failures:$/,/^test result:/p' "$out/$name.log" | grep -vE '^\s+[0-9]+: |^\s+at ' | head -80
    fi
}

nvidia-smi -L 2>/dev/null
start=$(date +%s)
run_tests cuda_step 200 MEMRA_GPU_STEP=1 MEMRA_GPU_BENCH=1
run_tests cuda_kernels 120
run_tests cuda_graph 60
run_tests cuda_direct 60
echo "tests: $(( $(date +%s) - start ))s"

gates=target/release/memra-gates
echo "== bench (eager)"
timeout 120 "$gates" bench --backend cuda --preset step --layers 2 --out "$out/bench" 2>&1 | tee "$out/bench.log" | tail -40 || rc=1
echo "== bench (--graph)"
timeout 90 "$gates" bench --backend cuda --preset step --layers 2 --graph --no-torch --out "$out/bench-graph" 2>&1 \
    | tee "$out/bench-graph.log" | tail -30 || rc=1

ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ]; then
    echo "== ncu: kernel time per name over one bench (3 runs x 2 steps x 2 layers; base clocks)"
    timeout 120 "$ncu_bin" --metrics gpu__time_duration.sum --csv \
        "$gates" bench --backend cuda --preset step --layers 2 --steps 1 --warmup 1 --no-torch > "$out/ncu.csv" 2>&1 || true
    # Columns found from the CSV header ("Kernel Name", "Metric Name", "Metric Value"); per
    # kernel name: total ns, launches, ns per launch.
    awk -F'","' '/^"ID"/ { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); c[h] = i }; next }
        c["Kernel Name"] && $c["Metric Name"] == "gpu__time_duration.sum" {
            v = $c["Metric Value"]; gsub(/[",]/, "", v); k = $c["Kernel Name"]; t[k] += v; n[k]++ }
        END { for (k in t) printf "%12.0f ns %6d launches %9.0f ns/launch  %s\n", t[k], n[k], t[k] / n[k], k }' \
        "$out/ncu.csv" | sort -rn | head -40 | tee "$out/ncu-summary.txt"
else
    echo "!! ncu not found"
fi
echo "total: $(( $(date +%s) - start ))s; logs in $out"
exit "$rc"
