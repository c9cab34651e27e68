#!/usr/bin/env bash
# Weights before the wait (branch early, tenth session, 2026-12-05): with programmatic launches a
# kernel may load bytes no kernel writes (weights) before its kernel_entry() wait, so their round
# trip overlaps the kernel ahead. The BF16 GEMVs load each warp's first vector of weights, the
# norms their one-pass row of weights, before the wait. One call of about 6 minutes (timeout_s 600):
#   bash scripts/gpu/early.sh [S]   b1 of main and early interleaved (three rounds), early's whole
#                                   GPU binary with the step-preset gate, b8 of both, selftest of
#                                   early, ncu of both at b1 with caches flushed and warm
# Carry target-g/ (stripped, built on the dev machine): mg-main / gpu-main = main (the commit that
# scripts/gpu/remeasure.sh measured), mg-early / gpu-early = branch early. early lands if its b1
# layer beats main's in every round and its whole GPU binary passes.
set -uo pipefail
source scripts/gpu/libs.sh
call_start early "${1:-565}"
B=target-g
b1_rounds 3 main early
whole_gpu early 200
for v in main early; do bench_step b8-$v $B/mg-$v 8; done
selftest_cuda early 40
for cache in all none; do
  for v in main early; do ncu_b1 ncu-b1-$v-$cache 30 $B/mg-$v $cache; done
done
tar czf $OUT/early.tgz -C /tmp $(cd /tmp && ls gpu_*.log selftest.log b1-*.log b8-*.log ncu-*.log 2>/dev/null)
echo "done in $(( $(date +%s)-STEPS_START ))s"
