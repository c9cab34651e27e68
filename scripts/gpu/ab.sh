#!/usr/bin/env bash
# One build against another in one call (a launch or kernel change in review):
#   bash scripts/gpu/ab.sh S BASE NEW [R]   b1 of BASE and NEW interleaved (R rounds, default 3);
#                                           NEW's GPU binary, its cuda_step:: module (expert kernels
#                                           against their twins, the step-preset device-host gate)
#                                           and then the whole binary while time is left; selftest
#                                           of NEW; b8 of both; ncu of both at b1
# Carry target-g/ with mg-BASE, mg-NEW and gpu-NEW (`bash scripts/gpu/carry.sh NAME [CHECKOUT]`).
# Every step runs while its time is left (S seconds for the call).
set -uo pipefail
source scripts/gpu/libs.sh
base=${2:?usage: ab.sh S BASE NEW [R]}; new=${3:?usage: ab.sh S BASE NEW [R]}
call_start "ab-$new" "${1:?usage: ab.sh S BASE NEW [R]}"
B=target-g
b1_rounds "${4:-3}" "$base" "$new"
step "gpu_${new}_step" 60 env MEMRA_GPU_STEP=1 "$B/gpu-$new" --test-threads=1 cuda_step::
grep -E "^test result|step preset device-host|panicked" "/tmp/gpu_${new}_step.log" | head -6
selftest_cuda "$new" 40
for v in "$base" "$new"; do bench_step "b8-$v" "$B/mg-$v" 8; done
for v in "$base" "$new"; do ncu_b1 "ncu-b1-$v" 30 "$B/mg-$v" all; done
whole_gpu "$new" 180
tar czf "$OUT/ab-$new.tgz" -C /tmp $(cd /tmp && ls gpu_*.log selftest.log b1-*.log b8-*.log ncu-*.log 2>/dev/null) \
  $(cd /tmp && ls -d b1-* b8-* 2>/dev/null | grep -v log)
echo "done in $(( $(date +%s)-STEPS_START ))s"
