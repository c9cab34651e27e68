#!/usr/bin/env bash
# The gates on one GPU call (≤ 9 minutes on one H200): every module of the GPU test binary
# (issue 11's cuda_gates among them; the step-preset device-host gate with MEMRA_GPU_STEP=1),
# `selftest --backend cuda` (every canary at every TP size and transport, on `edge`), the default
# `run --backend cuda` (tiny into one folder, edge into its edge/ subfolder), and the PyTorch
# subject's night (issue 14: TP1/TP2 host-bounce, expect 2 PASS + 2 NOT-APPLICABLE).
#
# Build elsewhere and carry the stripped binaries in target-gpu/ (see scripts/gpu/issue12.sh).
# Usage (repository root, on the GPU machine): scripts/gpu/gates.sh [DIR]. Everything is packed
# into $OUT/gates.tgz, with the summary lines in $OUT/gates-summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
dir="${1:-target/release/deps}"
out=$(mktemp -d)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
# shellcheck source=scripts/gpu/libs.sh
source scripts/gpu/libs.sh
export MEMRA_REQUIRE_GPU=1 RUST_BACKTRACE=1
rc=0
BUDGET="${BUDGET:-540}"
# shellcheck source=scripts/gpu/sections.sh
source scripts/gpu/sections.sh
gates="$dir/memra-gates"
[ -x "$gates" ] || gates=target/release/memra-gates

gated() { # name seconds args... : one memra-gates command, its log and the last lines of it
    local name="$1" secs t0
    secs=$(limit "$2")
    shift 2
    if [ "$secs" -eq 0 ]; then
        echo "!! $name skipped: the time budget is spent" | tee -a "$out/summary.txt"
        rc=1
        return
    fi
    t0=$(date +%s)
    echo "== $name (≤ ${secs}s): memra-gates $*"
    timeout "$secs" "$gates" "$@" > "$out/$name.log" 2>&1
    local code=$?
    [ "$code" -eq 0 ] || rc=1
    echo "$name: exit $code in $(( $(date +%s) - t0 ))s: $(grep -E 'PASS|FAIL|ERROR|VOID' "$out/$name.log" | grep -E '·|→' | tr '\n' ' ')" | tee -a "$out/summary.txt"
    tail -4 "$out/$name.log"
}

nvidia-smi -L 2>/dev/null
run_tests harness_checks 20
run_tests cuda_kernels 90
run_tests cuda_gates 90
run_tests cuda_direct 50
run_tests cuda_graph 50
run_tests cuda_step 90 MEMRA_GPU_STEP=1
grep -h '^test result' "$out"/*.log | sed 's/^/tests: /' >> "$out/summary.txt"
gated selftest-cuda 90 selftest --backend cuda --out "$out/selftest-cuda"
gated run-cuda 80 run --backend cuda --quiet --out "$out/run-cuda"
if python3 -c 'import torch' 2>/dev/null; then
    gated torch-night 90 run --subject scripts/subjects/torch.toml --backend cuda --matrix single --tp 1,2 \
        --transport host-bounce --quiet --out "$out/torch-night"
else
    echo "!! torch-night skipped: no PyTorch here" | tee -a "$out/summary.txt"
fi
echo "total: $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/gates.tgz" -C "$out" . && cp "$out/summary.txt" "$OUT/gates-summary.txt"
fi
cat "$out/summary.txt"
exit "$rc"
