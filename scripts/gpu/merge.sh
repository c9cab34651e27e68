#!/usr/bin/env bash
# What one launch for the experts' gate/up and down could save over two (thirteenth session,
# 2026-12-06; scripts/gpu/experts_merge_bench.cu, loads-only schedules, no carried build needed):
#   bash scripts/gpu/merge.sh [S]    nvcc build and one run, about 40 s
# A merged kernel's down tiles wait on counters: the run has its own 60 s limit, so a hang costs
# a minute, not the call.
set -uo pipefail
source scripts/gpu/libs.sh
call_start merge "${1:-90}"
nvcc_build merge_build experts_merge scripts/gpu/experts_merge_bench.cu
step merge_run 30 timeout 60 /tmp/experts_merge
cat /tmp/merge_run.log
cp /tmp/merge_run.log "$OUT/" 2>/dev/null
