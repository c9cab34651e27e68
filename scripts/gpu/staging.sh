#!/usr/bin/env bash
# 2026-12-04 (second session), one call (a variant that did not land; docs/gpu/2026-12-04-staging/):
# the block-per-lane E4M3 kernels with x staged by batched
# loads and each thread's first pair of codes read before the staging, the BF16 lane-major task
# loop unrolled by 2 (issue 27). Every GPU module those kernels touch against the twins, the
# default run on CUDA, the microbenchmark (its "shipped" kernel is the new one), bench b1/b8 and
# ncu's per-kernel time of one b1 bench.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call staging
gpu_tools
steps_start "${FINAL_DEADLINE:-500}"
gpu_modules cuda_kernels:: cuda_step:: cuda_lane_grid:: cuda_lanes::
step run_default 90 $G run --backend cuda --quiet --out /tmp/run-default
tail -1 /tmp/run_default.log
build_fma_bench
step fma_bench 30 /tmp/e4m3_fma
cat /tmp/fma_bench.log
bench_b1_b8
ncu_b1 ncu-b1 60
tar czf $OUT/staging.tgz -C /tmp $(cd /tmp && ls *.log 2>/dev/null) bench1 bench8 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
