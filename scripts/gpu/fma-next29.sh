#!/usr/bin/env bash
# 2026-12-04 (second session), one call: what an FMA lane order would buy the E4M3 expert GEMV
# (e4m3_fma_bench.cu, issue 27), the kernels whose loads moved (norms, fold_combine) against their
# twins, then issue 29's remaining GPU checks (next29.sh: the SEL_DOWN8 slot-order canary's kernel,
# selftest on CUDA, the `--matrix single` night on tiny) and, with time left, a `--matrix all`
# shard's rate (issue 24's estimate).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_tools
gpu_call fma-next29
steps_start "${FINAL_DEADLINE:-570}"
build_fma_bench
step fma_bench 60 /tmp/e4m3_fma
cat /tmp/fma_bench.log
gpu_modules norms moe_join_and_residual cuda_lane_grid cuda_down8
step selftest 120 $G selftest --backend cuda --out /tmp/selftest
grep -E "down8|selftest:" /tmp/selftest.log | head -12
step single_tiny 200 $G run --matrix single --backend cuda --preset tiny --quiet --out /tmp/single-tiny
tail -2 /tmp/single_tiny.log; grep -h -E "VOID|FAIL|ERROR" /tmp/single_tiny.log | head -10
step matrix_shard 100 bash scripts/gpu/matrixtime.sh 1 512 7 $G
cat /tmp/matrix_shard.log
cp -r /tmp/single-tiny/summary.* $OUT/ 2>/dev/null
tar czf $OUT/fma-next29.tgz -C /tmp $(cd /tmp && ls *.log) selftest/summary.md matrixtime 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
