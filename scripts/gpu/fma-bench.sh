#!/usr/bin/env bash
# 2026-12-04 (second session), one call: the FMA lane-order microbenchmark (e4m3_fma_bench.cu),
# bench of the step layer at b1 and b8 with the norms' and fold_combine's loads batched (issue 27),
# ncu's per-kernel time of one b1 bench, and a `--matrix all` shard with BULK_P2P ×
# NVFP4_DEV_ROUTES made a registry conflict (issue 24's estimate).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call fma-bench
gpu_tools
steps_start "${FINAL_DEADLINE:-560}"
build_fma_bench
step fma_bench 60 /tmp/e4m3_fma
cat /tmp/fma_bench.log
bench_b1_b8 "^[01] |L0: .*per token|experts|overhead"
ncu_b1 ncu-b1 90
step matrix_shard 100 bash scripts/gpu/matrixtime.sh 1 512 7 $G
cat /tmp/matrix_shard.log
tar czf $OUT/fma-bench.tgz -C /tmp $(cd /tmp && ls *.log 2>/dev/null) bench1 bench8 matrixtime 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
