#!/usr/bin/env bash
# Final check after the issue-15 runtime refactor (driver layer, splits): every GPU test module,
# the default run and selftest on CUDA.
set -uo pipefail
source scripts/gpu/libs.sh
export MEMRA_REQUIRE_GPU=1
T=$(ls target-gpu/gpu-* | head -1); G=target-gpu/memra-gates
for m in harness_checks cuda_kernels cuda_gates cuda_direct cuda_graph cuda_step; do
  env MEMRA_GPU_STEP=1 timeout 100 $T --test-threads=1 "$m::" > /tmp/$m.log 2>&1; echo "$m exit $?: $(grep '^test result' /tmp/$m.log)"; grep -E "FAILED|panicked" /tmp/$m.log | head -5
done
t0=$(date +%s); timeout 90 $G run --backend cuda --quiet --out /tmp/run > /tmp/run.log 2>&1; echo "run exit $? in $(( $(date +%s)-t0 ))s: $(grep -E '→' /tmp/run.log | tr '\n' ' ')"
tar czf $OUT/final.tgz -C /tmp harness_checks.log cuda_kernels.log cuda_gates.log cuda_direct.log cuda_graph.log cuda_step.log run.log
