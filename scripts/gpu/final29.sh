#!/usr/bin/env bash
# The fixes after issue29-rest.sh: a grouped expert whose gate is row-major (a NaN code) and whose
# up is block-per-lane (expert_task reads block-per-lane storage as a warp task), and SEL_DOWN8's
# twin test with owners that hold what they own; then every module the changed kernels touch.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call final29
steps_start "${FINAL_DEADLINE:-400}"
for m in cuda_step cuda_down8 cuda_ep_device29 cuda_doors29 cuda_kernels::moe; do
  step "gpu_${m//:/_}" 60 $T --test-threads=1 $m
  grep -E "^test result" /tmp/gpu_${m//:/_}.log; grep -E "panicked" -A6 /tmp/gpu_${m//:/_}.log | head -14
done
tar czf $OUT/final29.tgz -C /tmp $(cd /tmp && ls *.log) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
