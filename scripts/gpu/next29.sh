#!/usr/bin/env bash
# What issue 29 still needs from one H200 (2026-12-04 ran out of device time): the SEL_DOWN8
# slot-order canary's kernel against its twin, selftest on CUDA (every canary, the slot-order one
# on edge's shapes with top_k 4), and the `--matrix single` night on tiny with NVFP4_DEV_ROUTES.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call next29
steps_start "${FINAL_DEADLINE:-560}"
step gpu_down8 120 $T --test-threads=1 cuda_down8
grep -E "^test |^test result" /tmp/gpu_down8.log | tail -4; grep -E "panicked" -A6 /tmp/gpu_down8.log | head -20
step selftest 200 $G selftest --backend cuda --out /tmp/selftest
grep -E "down8|selftest:" /tmp/selftest.log | head -12
step single_tiny 200 $G run --matrix single --backend cuda --preset tiny --quiet --out /tmp/single-tiny
tail -2 /tmp/single_tiny.log; grep -h -E "VOID|FAIL|ERROR" /tmp/single_tiny.log | head -10
tar czf $OUT/next29.tgz -C /tmp $(cd /tmp && ls *.log) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
