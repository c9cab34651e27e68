#!/usr/bin/env bash
# The multi-GPU evidence of issue 6 in one call on a machine with 2 or more GPUs.
#
# Usage (from the repository root, on the GPU machine, with the executables built elsewhere):
#   scripts/gpu/multi-gpu.sh DIR [STEPS]
# DIR holds `memra-gates` and the CUDA test executable `gpu-*` from `cargo test --release
# --no-run -p memra-runtime --test gpu`. STEPS is a
# space-separated subset of: tests probe multiprocess single pairwise all bench (default: all of
# them but `all`). `all` runs shard $ALL_SHARD (default 0/64) of `--matrix all`.
#
# Everything lands in $OUT (or a temporary folder) packed as at most a few archives, because the
# device tool returns at most 8 files; the short table of results is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
dir="${1:?usage: scripts/gpu/multi-gpu.sh DIR [STEPS]}"
steps="${2:-tests probe multiprocess single pairwise bench}"
bin="$dir/memra-gates"
[ -x "$bin" ] || { echo "no memra-gates executable in $dir"; exit 2; }
# shellcheck source=libs.sh
source scripts/gpu/libs.sh
export NCCL_NVLS_ENABLE=0 MEMRA_REQUIRE_GPU=1 RUST_BACKTRACE=1
# This script is for machines with 2 or more GPUs: a CUDA test that needs 2 devices fails rather
# than reading ignored when fewer are visible (export a larger N to hold the 4- and 8-device
# cases to the same rule).
export MEMRA_REQUIRE_DEVICES="${MEMRA_REQUIRE_DEVICES:-2}"
out="${OUT:-$(mktemp -d)}"
work="$(mktemp -d)"
mkdir -p "$out" "$work"
table="$work/table.txt"
: >"$table"
row() { printf '%-34s %s\n' "$1" "$2" | tee -a "$table"; }
transports="host-bounce,native-p2p,nccl"
common=(--backend cuda --transport "$transports" --tp 1,2,4,8 --prompts 1 --gen-tokens 4 --quiet)

nvidia-smi -L | tee "$work/machine.txt"
for step in $steps; do
    start=$(date +%s)
    case "$step" in
    tests)
        t=$(ls -t "$dir"/gpu-* 2>/dev/null | grep -v '\.d$' | head -1)
        [ -x "$t" ] || { row "tests" "no gpu-* test executable in $dir"; continue; }
        # The tests' own output to test-gpu.log; the harness's result lines to test-gpu-results.txt.
        timeout 600 "$t" --test-threads=1 --logfile "$work/test-gpu-results.txt" >"$work/test-gpu.log" 2>&1
        rc=$?
        results="$work/test-gpu-results.txt"
        row "tests gpu" "rc=$rc $(grep -E '^test result' "$results" | tail -1)"
        # One row per module: how many of its tests passed, failed and were ignored.
        for m in cuda_kernels cuda_direct cuda_graph harness_checks; do
            count() { grep -cE "^test $m::.* \.\.\. $1" "$results"; }
            row "  $m" "$(count ok) ok, $(count FAILED) failed, $(count ignored) ignored"
        done
        grep -E '^test .*(FAILED|ignored)' "$results" | head -20
        ;;
    probe)
        timeout 240 "$bin" probe --backend cuda --ranks 2 --transport "$transports" --json "$work/probe-2-devices.json" \
            >"$work/probe.log" 2>&1
        rc=$?
        # "byte-integrity probe: N ordered pair × size checks, B bad", one line per transport.
        checked=$(grep -c 'byte-integrity probe:' "$work/probe.log")
        bad=$(grep -E 'byte-integrity probe:' "$work/probe.log" | grep -cvE ', 0 bad$')
        row "probe 2 devices" "rc=$rc; $checked transport(s) probed, $bad with bad words"
        ;;
    multiprocess)
        OUT="$work/multiprocess" timeout 420 bash scripts/gpu/multiprocess.sh "$bin" -- --matrix single \
            --door MEMRA_NCCL_ALLREDUCE=0 --door MEMRA_STEP_TP_GRAPH=0 --prompts 1 --gen-tokens 4 >"$work/multiprocess.log" 2>&1
        row "multiprocess 2x1 vs 1x2" "rc=$? $(tail -1 "$work/multiprocess.log")"
        ;;
    single | pairwise)
        timeout "${MATRIX_TIMEOUT:-420}" "$bin" run --matrix "$step" "${common[@]}" --out "$work/$step" >"$work/$step.log" 2>&1
        row "matrix $step" "rc=$? $(grep -m1 -oE '[0-9]+ run\(s\): .*' "$work/$step/summary.md" 2>/dev/null)"
        ;;
    all)
        timeout 420 "$bin" run --matrix all --shard "${ALL_SHARD:-0/64}" "${common[@]}" --out "$work/all" \
            >"$work/all.log" 2>&1
        row "matrix all shard ${ALL_SHARD:-0/64}" "rc=$? $(grep -m1 -oE '[0-9]+ run\(s\): .*' "$work/all/summary.md" 2>/dev/null)"
        ;;
    bench)
        for mode in eager graph; do
            flag=()
            [ "$mode" = graph ] && flag=(--graph)
            timeout 240 "$bin" bench --backend cuda --preset step --layers 2 --no-torch "${flag[@]}" \
                --out "$work/bench-$mode" >"$work/bench-$mode.log" 2>&1
            row "bench step 2 layers $mode" "rc=$? $(grep -E '^L?[0-9]+ ' "$work/bench-$mode.log" | head -2 | tr -s ' ' | tr '\n' ';')"
        done
        ;;
    *) echo "unknown step $step"; exit 2 ;;
    esac
    echo "   ($step: $(( $(date +%s) - start )) s)" | tee -a "$table"
    # Packed after every step, so a call stopped by its time limit still returns what finished.
    tar czf "$out/multi-gpu.tgz" -C "$work" .
done
echo "== summary"
cat "$table"
