#!/usr/bin/env bash
# Two processes, one GPU each, must write the receipts one process with both GPUs writes.
#
# Usage (from the repository root, on a machine with at least 2 GPUs):
#   scripts/gpu/multiprocess.sh [BIN] [-- EXTRA RUN FLAGS]
# BIN is the memra-gates executable (default target/release/memra-gates). Extra flags go to
# every `run`, e.g. `-- --matrix single --door MEMRA_NCCL_ALLREDUCE=0` (the default below).
#
# What it does (docs/multi-host.md):
# 1. single process: CUDA_VISIBLE_DEVICES=0,1, TP2 over nccl          → $out/single
# 2. two processes:  CUDA_VISIBLE_DEVICES=0 --process 0/2 (writes)     → $out/multi
#                    CUDA_VISIBLE_DEVICES=1 --process 1/2 (summary only)
#    sharing a fresh rendezvous directory ($out/ids);
# 3. checks both processes exited with the same status, that every receipt of one set has its
#    run id in the other, and that the `evidence` of each pair is identical (digests, tapes,
#    gates, verdicts); `measurements` (timings, device, placement) may differ and are shown by
#    `memra-gates diff`;
# 4. exits non-zero on any difference.
# Logs and receipts go to $OUT when set (the device tool's output folder), else a temp folder.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

bin="target/release/memra-gates"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then bin="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
extra=("$@")
# The doors that are NOT-APPLICABLE across processes (gates/src/dist.rs) are left out, so every
# configuration compared runs in both launches.
[ ${#extra[@]} -eq 0 ] && extra=(--matrix single --door MEMRA_NCCL_ALLREDUCE=0 --door MEMRA_STEP_TP_GRAPH=0 --prompts 2)
[ -x "$bin" ] || { echo "no memra-gates executable at $bin (cargo build --release)"; exit 2; }

# shellcheck source=libs.sh
source scripts/gpu/libs.sh
export NCCL_NVLS_ENABLE=0
export MEMRA_REQUIRE_GPU=1

out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
rm -rf "$out/single" "$out/multi" "$out/ids"
common=(run --backend cuda --transport nccl --tp 2 --quiet "${extra[@]}")
limit=1800   # seconds: a hard stop on top of the processes' own watchdogs

echo "== single process, CUDA_VISIBLE_DEVICES=0,1"
CUDA_VISIBLE_DEVICES=0,1 timeout "$limit" "$bin" "${common[@]}" --out "$out/single" \
    >"$out/single.log" 2>&1
single_rc=$?
tail -3 "$out/single.log"

echo "== two processes, CUDA_VISIBLE_DEVICES=0 and =1"
CUDA_VISIBLE_DEVICES=1 timeout "$limit" "$bin" "${common[@]}" --process 1/2 --dist-timeout-s 300 --nccl-id-dir "$out/ids" \
    --out "$out/multi-p1-unused" >"$out/p1.log" 2>&1 &
p1=$!
CUDA_VISIBLE_DEVICES=0 timeout "$limit" "$bin" "${common[@]}" --process 0/2 --dist-timeout-s 300 --nccl-id-dir "$out/ids" \
    --out "$out/multi" >"$out/p0.log" 2>&1
p0_rc=$?
wait "$p1"
p1_rc=$?
tail -3 "$out/p0.log"
tail -2 "$out/p1.log"
echo "exit status: single $single_rc, process 0 $p0_rc, process 1 $p1_rc"

fail=0
[ "$p0_rc" = "$p1_rc" ] || { echo "FAIL: the two processes exited with different status"; fail=1; }
[ "$p0_rc" = "$single_rc" ] || { echo "FAIL: the 2-process run exited $p0_rc, the single process $single_rc"; fail=1; }
[ -e "$out/multi-p1-unused" ] && { echo "FAIL: process 1 wrote receipts"; fail=1; }

echo "== memra-gates diff (informative: latency moves are expected)"
"$bin" diff "$out/single" "$out/multi" --format text | head -40

echo "== evidence, receipt by receipt"
python3 - "$out/single" "$out/multi" <<'PY' || fail=1
import json, os, sys
a, b = sys.argv[1], sys.argv[2]
runs = lambda d: sorted(f for f in os.listdir(d) if f.startswith("run-") and f.endswith(".json"))
ra, rb = runs(a), runs(b)
bad = 0
if ra != rb:
    print("FAIL: run ids differ: only single", sorted(set(ra) - set(rb)), "only multi", sorted(set(rb) - set(ra)))
    bad = 1
if not ra:
    print("FAIL: no receipt to compare"); bad = 1
for f in sorted(set(ra) & set(rb)):
    ea = json.load(open(os.path.join(a, f)))
    eb = json.load(open(os.path.join(b, f)))
    label = "tp%s %s %s" % (ea["evidence"]["config"]["tp"], ea["evidence"]["config"]["transport"],
                            "+".join(k for k, v in ea["evidence"]["config"]["doors"].items() if v) or "baseline")
    procs = eb["measurements"]["extra"].get("processes")
    if ea["evidence"] != eb["evidence"]:
        diff = [k for k in ea["evidence"] if ea["evidence"][k] != eb["evidence"].get(k)]
        print("FAIL %-40s evidence differs in %s (single %s, multi %s)" % (label, diff, ea["evidence"]["verdict"], eb["evidence"]["verdict"]))
        bad = 1
    elif procs != 2:
        print("FAIL %-40s the 2-process receipt records processes=%s" % (label, procs)); bad = 1
    else:
        print("same %-40s %s (2 processes, %s rank(s) each)" % (label, eb["evidence"]["verdict"], eb["measurements"]["extra"].get("ranks_per_process")))
sys.exit(bad)
PY
if [ "$fail" = 0 ]; then echo "OK: 2 processes wrote the single-process receipts"; else echo "DIFFERENCES FOUND (logs in $out)"; fi
exit "$fail"
